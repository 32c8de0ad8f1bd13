"""Knobs that split a paired seed's noise into its sources (``train.init_seed``,
``train.data_seed``) and evaluation variants that may cut it (``train.full_val``,
``train.average_last``): what each seed drives, the whole split's windows, the averaged
weights, and that none of them changes the training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import normlab
from loop_runs import (
    dit_config,
    gpt_config,
    lm_config,
    plan,
    train,
    train_one,
    untimed,
    write_corpus,
)
from normlab import run_format as RF
from normlab.data import OffsetWindows, load_tokens, split_offsets
from normlab.experiment.measure.averaging import WeightAverage
from normlab.experiment.testbeds import make_testbed
from normlab.experiment.training.train import RunLoop


class NanAfterTwo(nn.Module):
    """Identity for two training forwards, then NaN: a run with it diverges at step 3."""

    def __init__(self, dim: int, **kw: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        y = x * self.weight
        return y * float("nan") if self.calls > 2 else y


if "nan_after_two" not in normlab.available_norms():
    normlab.register_norm("nan_after_two", NanAfterTwo)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


# ---- which stream each seed drives ------------------------------------------------------------


def first_batches(specs: list[dict[str, Any]], out: Path) -> list[Any]:
    """The first training batch of each run (its testbed made anew)."""
    batches = []
    for spec in specs:
        task = make_testbed(spec, out / "runs" / spec["run_id"])
        batches.append(task.batches.next())
    return batches


def same(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("testbed", ["gpt", "dit", "lm"])
def test_init_seed_holds_the_weights_and_data_seed_the_batches(
    testbed: str, corpus: Path, tmp_path: Path
) -> None:
    """Seeds 0 and 1 of one arm: by default both streams differ; ``init_seed: 0`` gives both
    the same initial weights (one init digest) and their own batches; ``data_seed: 0`` the
    same batches and their own weights. Every arm of a seed still starts alike."""
    make = {
        "gpt": lambda t: gpt_config(corpus, {"steps": 4, **t}, seeds=2),
        "dit": lambda t: dit_config({"steps": 4, **t}, seeds=2),
        "lm": lambda t: lm_config(corpus, {"steps": 4, **t}, seeds=2),
    }[testbed]
    found = {}
    for name, train_options in (
        ("default", {}),
        ("init", {"init_seed": 0}),
        ("data", {"data_seed": 0}),
    ):
        specs = plan(make(train_options), tmp_path / name)
        arm = specs[0]["arm"]
        seeds = [s for s in specs if s["arm"] == arm]
        assert [s["seed"] for s in seeds] == [0, 1]
        assert {s["init_digest"] for s in specs if s["seed"] == 0} == {seeds[0]["init_digest"]}
        digests_equal = seeds[0]["init_digest"] == seeds[1]["init_digest"]
        found[name] = (digests_equal, same(*first_batches(seeds, tmp_path / name)))
    assert found == {"default": (False, False), "init": (True, False), "data": (False, True)}


def test_the_seeds_default_to_the_runs_seed(corpus: Path, tmp_path: Path) -> None:
    """Seed 1 with ``init_seed: 1`` and ``data_seed: 1`` trains what seed 1 trains by default,
    and the loop seeds torch's global generator with the data seed."""
    plain = plan(gpt_config(corpus, {"steps": 6}, seeds=[1]), tmp_path / "a")[0]
    given = plan(gpt_config(corpus, {"steps": 6, "init_seed": 1, "data_seed": 1}, seeds=[1]),
                 tmp_path / "b")[0]  # fmt: skip
    assert given["train"]["init_seed"] == 1 and "init_seed" not in plain["train"]
    assert plain["init_digest"] == given["init_digest"]
    _, plain_records = train(plain, tmp_path / "a")
    _, given_records = train(given, tmp_path / "b")
    assert untimed(plain_records) == untimed(given_records)
    moved = plan(gpt_config(corpus, {"steps": 6, "data_seed": 7}, seeds=[1]), tmp_path / "c")[0]
    RunLoop(moved, tmp_path / "c" / "runs" / moved["run_id"])
    assert torch.initial_seed() == 7


# ---- the whole validation split -------------------------------------------------------------


def test_the_whole_split_is_every_non_overlapping_window() -> None:
    tokens = np.arange(23, dtype=np.uint8)
    offsets = split_offsets(23, 4)
    assert offsets.tolist() == [0, 5, 10, 15]  # the last 3 tokens are no whole window
    windows = OffsetWindows(tokens, offsets, 5)
    assert windows.shape == (4, 5) and len(windows) == 4
    assert torch.equal(windows[1:3], torch.arange(5, 15).reshape(2, 5))
    targets = OffsetWindows(tokens, offsets, 4, shift=1)  # aligned with the predicted tokens
    assert torch.equal(targets[0:4], windows[0:4][:, 1:])
    assert windows[0:9].shape == (4, 5)
    with pytest.raises(ValueError, match=r"tokens: 4 validation tokens; expected at least"):
        split_offsets(4, 4)
    with pytest.raises(ValueError, match="context: expected an int >= 1"):
        split_offsets(10, 0)
    with pytest.raises(ValueError, match="offsets: a window of 5 at offset 20"):
        OffsetWindows(tokens, np.array([20]), 5)
    with pytest.raises(TypeError, match="rows: expected a slice with step 1"):
        windows[::2]


@pytest.mark.parametrize("testbed", ["gpt", "lm"])
def test_full_validation_is_the_mean_over_every_window(
    testbed: str, corpus: Path, tmp_path: Path
) -> None:
    """Against one forward of all the windows, summed in float64 (bytes: one byte a token)."""
    make = gpt_config if testbed == "gpt" else lm_config
    spec = plan(make(corpus, {"steps": 4, "full_val": True}), tmp_path)[0]
    task = make_testbed(spec, tmp_path / "runs" / spec["run_id"])
    got = task.full_evaluate(torch.device("cpu"))
    val = load_tokens(tmp_path / "data").val
    c = 16
    n = val.shape[0] // (c + 1)
    windows = torch.from_numpy(np.asarray(val[: n * (c + 1)], dtype=np.int64)).reshape(n, c + 1)
    task.model.eval()
    with torch.no_grad():
        out = task.model(windows[:, :-1])
    logits = (out[0] if isinstance(out, tuple) else out).double()
    nats = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1), reduction="sum"
    ).item()
    assert n > 4 and got["val_loss"] == pytest.approx(nats / (n * c), rel=1e-5)
    assert got["val_bpb"] == pytest.approx(got["val_loss"] / math.log(2), rel=1e-12)
    assert got["val_loss"] != task.evaluate(torch.device("cpu"))["val_loss"]


# ---- the averaged weights ------------------------------------------------------------------


def test_weight_average_is_the_mean_and_gives_the_weights_back() -> None:
    layer = nn.Linear(3, 2).to(torch.float32)
    average = WeightAverage(layer, first_step=2)
    seen = []
    for step in range(1, 5):
        with torch.no_grad():
            layer.weight.add_(0.1 * step)
        average.update(step)
        if step >= 2:
            seen.append(layer.weight.detach().double().clone())
    trained = layer.weight.detach().clone()
    with average.swapped_in() as model:
        assert model is layer
        assert torch.equal(layer.weight, (sum(seen) / 3).float())
    assert torch.equal(layer.weight, trained) and average.count == 3
    with (
        pytest.raises(RuntimeError, match="no averaged step yet"),
        WeightAverage(layer, 5).swapped_in(),
    ):
        pass
    with pytest.raises(ValueError, match="first_step: expected an int >= 1"):
        WeightAverage(layer, 0)


def test_averaging_changes_nothing_of_the_training(corpus: Path, tmp_path: Path) -> None:
    """Metrics and summary as without it; over one step the average is the final model; the
    options' fields come after every other field, in the declared order."""
    plain, plain_records = train_one(gpt_config(corpus, {"steps": 12}), tmp_path / "a")
    options = {"steps": 12, "average_last": 0.5, "full_val": True}
    avg, avg_records = train_one(gpt_config(corpus, options), tmp_path / "b")
    assert untimed(avg_records) == untimed(plain_records)
    fmt = RF.testbed_format("gpt")
    timing = {"wall_s", "tokens_per_s", "total_tokens_per_s", "rank_tokens_per_s", "posttrain_s"}
    timing |= {"peak_memory_bytes", "rank_peak_memory_bytes", "total_peak_memory_bytes"}
    assert list(avg)[: len(fmt.summary_fields)] == list(plain) == list(fmt.summary_fields)
    assert {k: v for k, v in avg.items() if k in plain and k not in timing} == {
        k: v for k, v in plain.items() if k not in timing
    }
    extra = list(avg)[len(fmt.summary_fields) :]
    assert extra == [f for f in fmt.optional_fields if f != RF.BRANCHES_FIELD]
    assert all(isinstance(avg[f], float) for f in extra)
    assert avg["avg_val_bpb"] != avg["final_val_bpb"]
    one, _ = train_one(gpt_config(corpus, {"steps": 12, "average_last": 0.05}), tmp_path / "c")
    assert (one["avg_val_loss"], one["avg_val_bpb"]) == (
        one["final_val_loss"],
        one["final_val_bpb"],
    )


def test_the_dit_averages_its_weights(tmp_path: Path) -> None:
    summary, _ = train_one(dit_config({"steps": 8, "average_last": 0.25}), tmp_path)
    assert list(summary)[-1] == "avg_val_loss" and summary["avg_val_loss"] > 0


def test_a_diverged_run_has_null_option_fields(corpus: Path, tmp_path: Path) -> None:
    options = {"steps": 8, "average_last": 0.5, "full_val": True, "schedule": "wsd"}
    norms = ["layernorm", "nan_after_two"]
    config = gpt_config(corpus, {**options, "branches": [5]}, norms=norms)
    spec = next(s for s in plan(config, tmp_path) if s["norm"] == "nan_after_two")
    summary, _ = train(spec, tmp_path)
    assert summary["status"] == RF.DIVERGED and summary["diverged_at"] == 3
    fields = [f for f in RF.testbed_format("gpt").optional_fields if f != RF.BRANCHES_FIELD]
    assert {f: summary[f] for f in fields} == dict.fromkeys(fields)
    assert summary[RF.BRANCHES_FIELD] == {}  # its branch would start after step 4
