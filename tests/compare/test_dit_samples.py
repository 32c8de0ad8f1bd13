"""The DiT's end-of-run samples: the sliced Wasserstein-2 distance, the paired noises and labels,
``final_sample_sw2`` and ``samples.npy`` of a tiny compare run, its "Samples" figure, and that the
GPT testbed has none of them."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from normlab import run_format
from normlab.cli import app
from normlab.data import SHAPE_CLASSES, make_shapes, unpatchify
from normlab.data.shapes import balanced_selection
from normlab.experiment.testbeds import QUALITY_FIELDS, make_testbed
from normlab.experiment.testbeds import dit as dit_testbed
from normlab.experiment.testbeds.dit import SAMPLE_GRID, SAMPLE_STEPS, SW2_PROJECTIONS
from normlab.models import DEFAULT_CFG_SCALE, euler_sample, random_projections, sliced_wasserstein2
from normlab.models.flow_batches import flow_seed, sample_inputs
from normlab.report import build_report
from normlab.report.runs_csv import RUN_COLUMNS

TINY_DIT: dict[str, Any] = {
    "device": "cpu",
    "threads": 1,
    "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
    "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
    "train": {"batch_size": 4, "warmup": 1, "eval_interval": 2, "layer_grad_interval": 2},
}
TINY_GPT: dict[str, Any] = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 4, "warmup": 1},
    "data": {"max_bytes": 300_000},
}


def compare(root: Path, config: dict[str, Any], *flags: str) -> Path:
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    out = root / "out"
    args = ["compare", *flags, "--config", str(path), "--seeds", "2", "--steps", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the sliced Wasserstein-2 distance --------------------------------------------------------


def test_sw2_of_one_dimensional_sets_is_their_sorted_rms_difference() -> None:
    # in one dimension every unit direction is ±1: SW2 = W2 = √(mean (a_(i) − b_(i))²)
    x = torch.tensor([[0.0], [1.0], [2.0]])
    y = torch.tensor([[5.0], [3.0], [4.0]])  # the same set shifted by 3, in another order
    assert sliced_wasserstein2(x, y, gen(), 16) == pytest.approx(3.0, abs=1e-12)
    a, b = torch.tensor([[0.0], [0.0]]), torch.tensor([[1.0], [3.0]])
    assert sliced_wasserstein2(a, b, gen(), 7) == pytest.approx(math.sqrt(5.0), abs=1e-12)


def test_sw2_of_shifted_sets_follows_the_projected_shift() -> None:
    # y = permuted x + s: every projection shifts by θ·s, so SW2 = √(mean_p (θ_p · s)²)
    x = torch.randn(40, 5, generator=gen(1))
    s = torch.tensor([0.5, -1.0, 2.0, 0.0, 0.25], dtype=torch.float64)
    y = x[torch.randperm(40, generator=gen(2))] + s.float()
    theta = random_projections(32, 5, gen(3))
    expected = math.sqrt(float((theta @ s).square().mean()))
    assert sliced_wasserstein2(x, y, gen(3), 32) == pytest.approx(expected, rel=1e-6)
    assert sliced_wasserstein2(x, y, projections=theta) == pytest.approx(expected, rel=1e-6)
    # axis-aligned projections: the mean squared shift over the chosen axes
    axes = torch.eye(5, dtype=torch.float64)[:3]
    assert sliced_wasserstein2(x, y, projections=axes) == pytest.approx(
        math.sqrt((0.25 + 1.0 + 4.0) / 3), rel=1e-6
    )
    assert torch.allclose(theta.norm(dim=1), torch.ones(32, dtype=torch.float64))


def test_sw2_is_zero_for_identical_sets_symmetric_and_deterministic() -> None:
    x = torch.randn(64, 3, 4, generator=gen(4))
    y = torch.randn(64, 3, 4, generator=gen(5)) * 0.5 + 0.2
    assert sliced_wasserstein2(x, x[torch.randperm(64, generator=gen(6))], gen(7)) == 0.0
    d = sliced_wasserstein2(x, y, gen(8))
    assert d > 0.1
    assert sliced_wasserstein2(y, x, gen(8)) == d
    assert sliced_wasserstein2(x, y, gen(8)) == d
    assert sliced_wasserstein2(x, y, gen(9)) != d  # the projections are random


def test_sw2_rejects_sets_it_cannot_pair() -> None:
    with pytest.raises(ValueError, match="same number of points"):
        sliced_wasserstein2(torch.zeros(3, 2), torch.zeros(4, 2), gen())
    with pytest.raises(ValueError, match="projections"):
        sliced_wasserstein2(torch.zeros(3, 2), torch.zeros(3, 2), projections=torch.ones(4, 3))
    with pytest.raises(TypeError, match="generator"):
        sliced_wasserstein2(torch.zeros(3, 2), torch.zeros(3, 2))


# ---- the paired noises and labels -------------------------------------------------------------


def test_sample_inputs_follow_the_data_seed_alone() -> None:
    x0, labels = sample_inputs(12, 4, 16, 4, data_seed=3)
    again, labels_again = sample_inputs(12, 4, 16, 4, data_seed=3)
    assert torch.equal(x0, again) and torch.equal(labels, labels_again)
    assert x0.shape == (12, 4, 16) and x0.dtype == torch.float32
    assert labels.tolist() == [0, 1, 2, 3] * 3  # balanced: 3 of each class
    other, _ = sample_inputs(12, 4, 16, 4, data_seed=4)
    assert not torch.equal(x0, other)
    assert sample_inputs(12, 4, 16, 0, data_seed=3)[1] is None


def test_balanced_selection_matches_the_sample_labels() -> None:
    labels = np.array([2, 0, 1, 0, 3, 1, 2, 3, 0])
    idx = balanced_selection(labels, 6, 4)
    assert idx.tolist() == [1, 2, 0, 4, 3, 5]
    assert labels[idx].tolist() == [0, 1, 2, 3, 0, 1]
    assert balanced_selection(labels, 9, 4)[8] == 8  # the third image of class 0
    with pytest.raises(ValueError, match="class 1 has 2 images"):
        balanced_selection(labels, 10, 4)
    assert balanced_selection(labels, 10, 4, wrap=True)[9] == 2  # class 1 starts over
    assert balanced_selection(labels, 3, 0).tolist() == [0, 1, 2]


# ---- a tiny DiT compare run -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dit_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compare(tmp_path_factory.mktemp("dit"), TINY_DIT, "--testbed", "dit")


def test_finished_dit_runs_record_sw2_and_keep_samples(dit_out: Path) -> None:
    values = {}
    for run in sorted((dit_out / "runs").iterdir()):
        spec = json.loads((run / "run.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        assert list(summary) == list(run_format.testbed_format(spec.get("testbed")).summary_fields)
        assert list(summary).index("final_sample_sw2") == list(summary).index("best_val_loss") + 1
        sw2 = summary["final_sample_sw2"]
        assert isinstance(sw2, float) and 0.0 < sw2 < 10.0
        values[run.name] = sw2
        samples = np.load(run / "samples.npy", allow_pickle=False)
        assert samples.shape == (SAMPLE_GRID, 8, 8) and samples.dtype == np.float32
        assert np.isfinite(samples).all()
        reference = np.load(run / "reference.npy", allow_pickle=False)
        assert reference.shape == samples.shape and reference.dtype == np.float32
    assert len(values) == 4
    header = next(csv.reader(io.StringIO((dit_out / "runs.csv").read_text())))
    assert header[header.index("best_val_loss") + 1] == "final_sample_sw2"


def test_finish_is_sw2_of_euler_samples_against_validation_pixels(
    dit_out: Path, tmp_path: Path
) -> None:
    run = dit_out / "runs" / "adarms-pre__s1"
    spec = json.loads((run / "run.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    # the initial model: its samples differ from the trained one's
    testbed = make_testbed(spec, tmp_path)
    got = testbed.finish(torch.device("cpu"))["final_sample_sw2"]
    assert got != summary["final_sample_sw2"]
    assert testbed.finish(torch.device("cpu"))["final_sample_sw2"] == got  # deterministic
    # computed again by hand: Euler from the data seed's noises, pixels, the data seed's directions
    d = spec["shapes"]
    _, _, val, _ = make_shapes(d["n_train"], d["n_val"], d["image_size"], d["seed"])
    x0, labels = sample_inputs(d["n_val"], 4, 16, len(SHAPE_CLASSES), d["seed"])
    assert _hand_sw2(testbed, spec, x0, labels, val) == pytest.approx(got, rel=1e-9)
    assert summary["sample_cfg_scale"] == spec["dit"]["cfg_scale"] == DEFAULT_CFG_SCALE
    kept = np.load(tmp_path / "samples.npy")
    assert np.allclose(kept, _hand_images(testbed, spec, x0, labels)[:SAMPLE_GRID], atol=1e-6)


def _hand_images(testbed: Any, spec: dict[str, Any], x0: torch.Tensor, labels: Any) -> np.ndarray:
    """Euler with guidance at the run's cfg_scale, computed without the testbed's helpers."""
    testbed.model.eval()
    with torch.no_grad():
        tokens = euler_sample(
            testbed.model, x0, SAMPLE_STEPS, labels, spec["dit"]["cfg_scale"], len(SHAPE_CLASSES)
        )
    return unpatchify(tokens.numpy(), spec["shapes"]["image_size"])


def _hand_sw2(
    testbed: Any, spec: dict[str, Any], x0: torch.Tensor, labels: Any, val: np.ndarray
) -> float:
    images = _hand_images(testbed, spec, x0, labels)
    directions = torch.Generator().manual_seed(flow_seed(spec["shapes"]["seed"], "sample-sw2"))
    return sliced_wasserstein2(
        torch.from_numpy(images), torch.from_numpy(val), directions, SW2_PROJECTIONS
    )


def test_finish_samples_with_the_configured_guidance_scale(dit_out: Path, tmp_path: Path) -> None:
    """With open gates (an initial DiT outputs 0, whatever the labels) guidance changes the
    samples: finish follows dit.cfg_scale, w = 1 being the unguided sampler."""
    spec = json.loads((dit_out / "runs" / "adaln_zero-pre__s0" / "run.json").read_text())
    d = spec["shapes"]
    _, _, val, _ = make_shapes(d["n_train"], d["n_val"], d["image_size"], d["seed"])
    x0, labels = sample_inputs(d["n_val"], 4, 16, len(SHAPE_CLASSES), d["seed"])
    got = {}
    for w in (1.0, 3.0):
        run = {**spec, "dit": {**spec["dit"], "cfg_scale": w}}
        testbed = make_testbed(run, tmp_path / str(w))
        with torch.no_grad():
            gen = torch.Generator().manual_seed(0)
            for param in testbed.model.parameters():
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
        result = testbed.finish(torch.device("cpu"))
        assert result["sample_cfg_scale"] == w
        assert result["final_sample_sw2"] == pytest.approx(
            _hand_sw2(testbed, run, x0, labels, val), rel=1e-9
        )
        got[w] = result["final_sample_sw2"]
    assert got[1.0] != got[3.0]


def test_every_arm_and_seed_samples_from_the_same_noise(
    dit_out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, tuple[torch.Tensor, torch.Tensor | None, int]] = {}
    guidance: set[tuple[float, int | None]] = set()
    run_id = ""

    def record(model, x0, label, steps, batch_size, device, cfg_scale, null_label):
        seen[run_id] = (x0.clone(), None if label is None else label.clone(), steps)
        guidance.add((cfg_scale, null_label))
        return x0.clone()

    monkeypatch.setattr(dit_testbed, "generate_samples", record)
    tmp = dit_out.parent / "finish"
    for run in sorted((dit_out / "runs").iterdir()):
        spec = json.loads((run / "run.json").read_text())
        run_id = run.name
        (tmp / run_id).mkdir(parents=True, exist_ok=True)
        make_testbed(spec, tmp / run_id).finish(torch.device("cpu"))
    assert len(seen) == 4
    (x0, label, steps), *others = seen.values()
    assert steps == SAMPLE_STEPS and label is not None
    assert guidance == {(DEFAULT_CFG_SCALE, len(SHAPE_CLASSES))}  # every arm and seed alike
    assert label.tolist() == [i % 4 for i in range(16)]
    assert x0.shape == (16, 4, 16)  # one sample per validation image
    for other_x0, other_label, _ in others:
        assert torch.equal(other_x0, x0) and torch.equal(other_label, label)


def test_analysis_compares_sw2_but_the_loss_decides(dit_out: Path) -> None:
    analysis = json.loads((dit_out / "summary.json").read_text())
    assert analysis["quality_metric"] == "final_val_loss"
    meta = analysis["metrics"]["final_sample_sw2"]
    assert meta == {
        "label": "sample SW2 to validation images",
        "unit": "pixel units",
        "lower_is_better": True,
        "scale": "difference",
    }
    c = analysis["comparisons"]["adarms-pre"]["final_sample_sw2"]
    assert c["n_pairs"] == 2 and c["seeds"] == [0, 1] and c["margin"] is None
    assert analysis["arms"]["adarms-pre"]["final_sample_sw2"]["n"] == 2
    verdict = analysis["verdicts"]["adarms-pre"]
    assert verdict["quality"] == analysis["comparisons"]["adarms-pre"]["final_val_loss"]["verdict"]
    assert "SW2" not in verdict["justification"]
    spec = run_format.testbed_format("dit").metric("final_sample_sw2")
    assert spec.margin_factor is None and spec.statuses == ("finished",)
    assert "final_sample_sw2" not in {m.name for m in run_format.testbed_format("gpt").metrics}


def test_report_shows_the_samples_figure_and_the_sw2_rows(dit_out: Path) -> None:
    md = (dit_out / "report.md").read_text()
    html = (dit_out / "report.html").read_text()
    assert "![Samples](plots/samples.png)" in md
    assert "Seed 0: the first 16 images" in md and "Bottom row: validation images" in md
    assert f"32 steps, classifier-free guidance w = {DEFAULT_CFG_SCALE:g})" in md
    assert "sample SW2 to validation images (pixel units)" in md
    assert "| sample SW2 |" in md  # the runs table's column
    assert 'id="plot-samples"' in html and "<strong>Samples.</strong>" in html
    png = (dit_out / "plots" / "samples.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    method = run_format.testbed_format("dit").method_note
    assert f"{SAMPLE_STEPS} Euler steps" in method and f"{SW2_PROJECTIONS} random" in method
    assert f"sampler, {SAMPLE_STEPS} steps" in md


def test_samples_figure_falls_back_to_a_seed_every_arm_finished(
    dit_out: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "out"
    shutil.copytree(dit_out, copy)
    (copy / "runs" / "adarms-pre__s0" / "samples.npy").unlink()
    build_report(copy)
    md = (copy / "report.md").read_text()
    assert "Seed 1: the first 16 images" in md and "No samples for" not in md
    for run in ("adaln_zero-pre__s1", "adarms-pre__s1"):
        (copy / "runs" / run / "samples.npy").unlink()
    build_report(copy)
    md = (copy / "report.md").read_text()
    assert "Seed 0:" in md and "No samples for adarms-pre at this seed." in md
    (copy / "runs" / "adaln_zero-pre__s0" / "reference.npy").unlink()
    build_report(copy)  # the reference row is read from the run folder, never made again
    md = (copy / "report.md").read_text()
    assert "Seed 0:" in md and "Bottom row: validation images" not in md
    (copy / "runs" / "adaln_zero-pre__s0" / "samples.npy").unlink()
    build_report(copy)
    assert "plots/samples.png" not in (copy / "report.md").read_text()
    assert not (copy / "plots" / "samples.png").exists()


# ---- the GPT testbed has none of it -----------------------------------------------------------


def test_gpt_runs_have_no_samples_and_no_sw2(tmp_path: Path) -> None:
    assert QUALITY_FIELDS["gpt"] == ("final_val_loss", "final_val_bpb", "best_val_bpb")
    out = compare(tmp_path, TINY_GPT)
    for run in (out / "runs").iterdir():
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "finished" and "final_sample_sw2" not in summary
        assert not (run / "samples.npy").exists()
    header = next(csv.reader(io.StringIO((out / "runs.csv").read_text())))
    assert header == list(RUN_COLUMNS)
    analysis = json.loads((out / "summary.json").read_text())
    assert "final_sample_sw2" not in analysis["metrics"]
    md = (out / "report.md").read_text()
    assert "Samples" not in md and "SW2" not in md
    assert not (out / "plots" / "samples.png").exists()
