"""The shape classifier, its cache, and the sample metrics built on it (class accuracy, FD)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import scipy.linalg
import torch

from normlab.data.shapes import load_shapes, make_shapes, unpatchify
from normlab.models.classifier_cache import classifier_key, load_shape_classifier
from normlab.models.sample_metrics import (
    SAMPLE_QUALITY_FIELDS,
    classifier_features,
    frechet_distance,
    sample_class_accuracy,
    sample_quality,
)
from normlab.models.shape_classifier import (
    ClassifierSettings,
    ShapeClassifier,
    classifier_accuracy,
    train_shape_classifier,
)

THRESHOLD = 0.98
SMALL = ClassifierSettings(n_train=512, n_heldout=128, epochs=1, channels=(4, 8), features=16)
"""A classifier that trains in a fraction of a second, for the cache and determinism tests."""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("classifier-cache")


@pytest.fixture(scope="module")
def cached(cache_dir):
    """The default classifier, trained into a fresh cache folder."""
    return load_shape_classifier(cache_dir=cache_dir)


@pytest.fixture(scope="module")
def dit_val():
    """The DiT testbed's default validation images [512, 16, 16] and their labels."""
    data = load_shapes(16, 4, 4096, 512, 0)
    return unpatchify(data.val, 16), data.val_labels


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- the classifier


def test_heldout_accuracy_meets_threshold(cached):
    s = ClassifierSettings()
    assert cached.built
    assert cached.metadata["heldout_accuracy"] >= THRESHOLD
    assert cached.metadata["train_cpu_seconds"] < 30  # seconds on a CPU (about 3 s measured)
    # measured again here, on the held-out images of the classifier's own stream
    _, _, x_ho, y_ho = make_shapes(s.n_train, s.n_heldout, s.image_size, s.data_seed)
    acc = classifier_accuracy(cached.model, x_ho, y_ho)
    assert acc == pytest.approx(cached.metadata["heldout_accuracy"], abs=1e-12)


def test_accuracy_on_dit_validation_images_matches_heldout(cached, dit_val):
    images, labels = dit_val
    acc = sample_class_accuracy(cached.model, images, labels)
    assert acc >= THRESHOLD
    assert abs(acc - cached.metadata["heldout_accuracy"]) <= 0.02


def test_shuffled_labels_give_chance_accuracy(cached, dit_val):
    images, labels = dit_val
    shuffled = np.random.default_rng(0).permutation(labels)
    acc = sample_class_accuracy(cached.model, images, shuffled)
    # 512 images: the binomial sd at p = 1/4 is 0.019
    assert abs(acc - 0.25) < 0.08


def test_training_is_deterministic():
    torch.manual_seed(123)  # the global state must not matter
    a = train_shape_classifier(SMALL)
    threads = torch.get_num_threads()
    torch.manual_seed(456)
    torch.rand(10)
    b = train_shape_classifier(SMALL)
    assert torch.get_num_threads() == threads  # restored
    assert _same_weights(_state(a.model), _state(b.model))
    assert a.heldout_accuracy == b.heldout_accuracy
    other = train_shape_classifier(replace(SMALL, seed=1))
    assert not _same_weights(_state(a.model), _state(other.model))


def test_classifier_takes_other_image_sizes():
    model = ShapeClassifier(image_size=18, channels=(2, 2), features=3)
    assert model(torch.zeros(5, 18, 18)).shape == (5, 4)
    assert model.features(torch.zeros(5, 1, 18, 18)).shape == (5, 3)
    with pytest.raises(ValueError, match="x: expected shape"):
        model(torch.zeros(5, 16, 16))


def test_settings_are_checked():
    with pytest.raises(ValueError, match="n_train"):
        ClassifierSettings(n_train=0)
    with pytest.raises(ValueError, match="image_size"):
        ClassifierSettings(image_size=2)
    with pytest.raises(ValueError, match="lr"):
        ClassifierSettings(lr=float("nan"))


# ---------------------------------------------------------------- the cache


def test_cache_is_reused(tmp_path):
    first = load_shape_classifier(SMALL, tmp_path)
    assert first.built
    meta_path = first.weights_path.with_suffix(".json")
    stamps = (first.weights_path.stat().st_mtime_ns, meta_path.stat().st_mtime_ns)
    second = load_shape_classifier(SMALL, tmp_path)
    assert not second.built
    assert (first.weights_path.stat().st_mtime_ns, meta_path.stat().st_mtime_ns) == stamps
    assert _same_weights(_state(first.model), _state(second.model))
    assert second.metadata["key"] == classifier_key(SMALL)
    assert first.weights_path.name == f"shape-classifier-{classifier_key(SMALL)}.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [first.weights_path.name, meta_path.name]
    )  # no temporary files left


def test_cache_is_rebuilt_when_weights_are_damaged(tmp_path):
    first = load_shape_classifier(SMALL, tmp_path)
    reference = _state(first.model)
    data = bytearray(first.weights_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.weights_path.write_bytes(bytes(data))
    again = load_shape_classifier(SMALL, tmp_path)
    assert again.built
    assert _same_weights(reference, _state(again.model))
    assert not load_shape_classifier(SMALL, tmp_path).built  # the rebuilt entry is valid


def test_cache_is_rebuilt_when_metadata_is_damaged_or_missing(tmp_path):
    first = load_shape_classifier(SMALL, tmp_path)
    meta_path = first.weights_path.with_suffix(".json")
    meta_path.write_text(meta_path.read_text()[:20])
    assert load_shape_classifier(SMALL, tmp_path).built
    meta = json.loads(meta_path.read_text())
    meta["weights_sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    assert load_shape_classifier(SMALL, tmp_path).built
    meta_path.unlink()
    assert load_shape_classifier(SMALL, tmp_path).built
    first.weights_path.unlink()
    assert load_shape_classifier(SMALL, tmp_path).built


def test_key_follows_the_settings():
    assert classifier_key(SMALL) == classifier_key(replace(SMALL))
    assert classifier_key(SMALL) != classifier_key(replace(SMALL, epochs=2))
    assert classifier_key(SMALL) != classifier_key(replace(SMALL, data_seed=1))
    assert classifier_key(SMALL) != classifier_key(SMALL, version="sha256:0000000000000000")


# ---------------------------------------------------------------- the Fréchet distance


def test_frechet_distance_of_a_set_to_itself_is_zero(cached, dit_val):
    feats = classifier_features(cached.model, dit_val[0])
    scale = float(np.trace(np.cov(feats, rowvar=False)))
    assert frechet_distance(feats, feats) <= 1e-9 * scale
    assert frechet_distance(feats, feats[::-1]) <= 1e-9 * scale  # order does not matter


def test_frechet_distance_grows_with_noise_and_is_symmetric(cached, dit_val):
    images = dit_val[0]
    rng = np.random.default_rng(1)
    noise = rng.standard_normal(images.shape).astype(np.float32)
    ref = classifier_features(cached.model, images)
    # another set of real images, disjoint from the validation set: the floor of the metric
    _, _, other, _ = make_shapes(16, 512, 16, 7)
    fd_real = frechet_distance(ref, classifier_features(cached.model, other))
    fds = [
        frechet_distance(ref, classifier_features(cached.model, images + s * noise))
        for s in (0.1, 0.3, 0.6)
    ]
    assert 0 < fds[0] < fds[1] < fds[2]
    # pixel noise of sd 0.3 is far above the floor of two real sets of 512 (about 1)
    assert fd_real < fds[1] / 2
    noisy = classifier_features(cached.model, images + 0.3 * noise)
    assert frechet_distance(noisy, ref) == pytest.approx(frechet_distance(ref, noisy), rel=1e-6)


def test_frechet_distance_closed_forms():
    rng = np.random.default_rng(2)
    f = rng.standard_normal((300, 5)) @ rng.standard_normal((5, 5)) + 1.0
    mu = f.mean(axis=0)
    sigma = np.cov(f, rowvar=False)
    shift = np.array([0.5, -1.0, 2.0, 0.0, 0.25])
    # a shift moves only the mean: FD = ‖c‖²
    assert frechet_distance(f, f + shift) == pytest.approx(float(shift @ shift), rel=1e-9)
    # doubling: μ₂ = 2μ, Σ₂ = 4Σ, (ΣΣ₂)^{1/2} = 2Σ, so FD = ‖μ‖² + Tr(Σ)
    expected = float(mu @ mu + np.trace(sigma))
    assert frechet_distance(f, 2 * f) == pytest.approx(expected, rel=1e-9)
    # against the general formula with scipy's matrix square root
    g = rng.standard_normal((400, 5)) * [1.0, 2.0, 0.5, 1.0, 3.0]
    s2 = np.cov(g, rowvar=False)
    covmean = scipy.linalg.sqrtm(sigma @ s2).real
    ref = float(np.sum((mu - g.mean(0)) ** 2) + np.trace(sigma + s2 - 2 * covmean))
    assert frechet_distance(f, g) == pytest.approx(ref, rel=1e-7)


def test_frechet_distance_handles_singular_covariances():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((10, 32))  # fewer points than features: rank 9
    b = rng.standard_normal((10, 32)) + 0.1
    a[:, 0] = 0.0  # a dead feature: a zero row and column of Σ
    b[:, 0] = 0.0
    fd = frechet_distance(a, b)
    assert np.isfinite(fd) and fd > 0
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)
    const = np.zeros((10, 32))  # Σ = 0
    expected = float(np.sum(a.mean(0) ** 2) + np.trace(np.cov(a, rowvar=False)))
    assert frechet_distance(const, a) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="features_2"):
        frechet_distance(a, b[:, :5])


# ---------------------------------------------------------------- the testbed's entry point


def test_sample_quality_fields(cache_dir, cached, dit_val):
    images, labels = dit_val
    rng = np.random.default_rng(4)
    out = sample_quality(images, torch.from_numpy(labels), images, cache_dir=cache_dir)
    assert set(out) == set(SAMPLE_QUALITY_FIELDS) == {"final_sample_class_acc", "final_sample_fd"}
    assert out["final_sample_class_acc"] >= THRESHOLD
    assert out["final_sample_fd"] == pytest.approx(0.0, abs=1e-6)
    noisy = images + 0.5 * rng.standard_normal(images.shape).astype(np.float32)
    worse = sample_quality(noisy, labels, images, cache_dir=cache_dir)
    assert worse["final_sample_fd"] > out["final_sample_fd"] + 1.0
    assert worse["final_sample_class_acc"] < out["final_sample_class_acc"]
    assert (
        sample_quality(noisy, None, images, cache_dir=cache_dir)["final_sample_class_acc"] is None
    )


def test_sample_quality_checks_its_arguments(cache_dir, cached, dit_val):
    images, labels = dit_val
    with pytest.raises(ValueError, match="val_images"):
        sample_quality(images, labels, images[:, :8, :8], cache_dir=cache_dir)
    with pytest.raises(ValueError, match="labels"):
        sample_quality(images, labels[:-1], images, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="labels"):
        sample_quality(images, labels + 4, images, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="sample_images"):
        sample_quality(images[:, None], labels, images, cache_dir=cache_dir)
    with pytest.raises(TypeError, match="sample_images"):
        sample_quality(images.tolist(), labels, images, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="finite"):
        sample_quality(images * np.nan, labels, images, cache_dir=cache_dir)
