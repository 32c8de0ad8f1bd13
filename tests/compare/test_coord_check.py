"""μP's coordinate check (normlab.models.coord_check, ``normlab coord-check``): on tiny widths
the activation sizes stay flat under mup and grow under sp, and the check fails when a part of
μP's scaling is taken out."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import normlab.models.coord_check as cc
import normlab.models.gpt as gpt_module
import normlab.models.init as init_module
import normlab.models.mup as mup_module
from normlab.cli import app
from normlab.models import GPTConfig
from normlab.models.coord_check import FLAT_SLOPE, coord_check, log_log_slope

WIDTHS = (16, 32, 64)
TINY = {"n_layers": 2, "n_heads": 2, "context": 16}


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return cc.corpus_tokens(200_000)


def check(tokens: np.ndarray, parametrization: str = "mup"):
    torch.set_num_threads(1)
    settings = GPTConfig(**TINY, parametrization=parametrization, base_d_model=WIDTHS[0])
    return coord_check(settings, WIDTHS, steps=5, lr=1e-2, batch_size=4, tokens=tokens)


def test_log_log_slope_recovers_a_power_law() -> None:
    assert log_log_slope([16, 32, 64, 128], [3 * w**0.7 for w in (16, 32, 64, 128)]) == (
        pytest.approx(0.7)
    )


def synthetic(block: float, logits: float) -> cc.CoordCheck:
    """Sizes ∝ width^slope at steps 2 and 3 (step 1: anything)."""
    widths = [16, 32, 64]

    def rows(slope: float) -> list[list[float]]:
        return [[float(w) ** 3 for w in widths]] + [[w**slope for w in widths]] * 2

    return cc.CoordCheck(
        "mup",
        16,
        widths,
        3,
        0.01,
        [0],
        ["block0", "logits"],
        {"block0": rows(block), "logits": rows(logits)},
    )


def test_flat_judges_steps_after_the_first_and_lets_the_logits_shrink() -> None:
    assert synthetic(0.2, -0.5).flat  # step 1 grows as width³; logits shrink: allowed
    assert not synthetic(0.2, 0.3).flat  # logits grow
    shrinking = synthetic(-0.3, 0.0)  # a block shrinks: not flat
    assert not shrinking.flat and shrinking.worst[:2] == ("block0", 2)
    assert shrinking.worst[2] == pytest.approx(-0.3)


def test_mup_is_flat_and_sp_grows(tokens: np.ndarray) -> None:
    mup = check(tokens, "mup")
    assert mup.flat, mup.slopes
    assert mup.layers == ["embed", "block0", "block1", "logits"]
    assert mup.slopes["logits"][0] == pytest.approx(-0.5, abs=0.1)  # init: d₀/d · √d
    sp = check(tokens, "sp")
    assert not sp.flat
    layer, _, slope = sp.worst
    assert layer.startswith("block") and slope > 3 * FLAT_SLOPE  # grows with the width
    data = mup.to_dict()
    assert json.loads(json.dumps(data))["flat"] is True
    assert len(data["sizes"]["block0"]) == 5 and len(data["sizes"]["block0"][0]) == 3


@pytest.mark.parametrize("part", ["lr", "output", "init"])
def test_the_check_fails_without_each_part_of_mup(
    tokens: np.ndarray, part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if part == "lr":  # Adam rate not scaled by base / width
        scaled = mup_module.lr_multipliers
        monkeypatch.setattr(mup_module, "lr_multipliers", lambda m: dict.fromkeys(scaled(m), 1.0))
    elif part == "output":  # no multiplier on the logits
        monkeypatch.setattr(gpt_module, "output_multiplier", lambda cfg: 1.0)
    else:  # hidden deviations not scaled by sqrt(base / width)
        monkeypatch.setattr(init_module, "init_std_multipliers", lambda m: {})
    result = check(tokens, "mup")
    assert not result.flat
    assert result.worst[2] > FLAT_SLOPE  # a layer grows


runner = CliRunner()


def test_cli_writes_the_table_figure_and_json(
    tokens: np.ndarray, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cc, "corpus_tokens", lambda: tokens)
    out = tmp_path / "cc"
    args = ["coord-check", "--ladder", "d_model=16,32,64", "--n-layers", "2", "--n-heads", "2"]
    args += ["--steps", "4", "--batch-size", "4", "--seeds", "1", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "mup: flat" in result.output
    data = json.loads((out / "coord_check.json").read_text())
    assert data["widths"] == [16, 32, 64] and data["base_d_model"] == 16
    assert (out / "coord_check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(gpt_module, "output_multiplier", lambda cfg: 1.0)
    broken = runner.invoke(app, args)
    assert broken.exit_code == 3 and "mup: not flat" in broken.output  # failed
    sp = runner.invoke(app, [*args, "--parametrization", "sp"])
    assert sp.exit_code == 0 and "sp: not flat" in sp.output


@pytest.mark.parametrize(
    ("ladder", "extra", "message"),
    [
        ("d_model=64", [], "--ladder: expected at least two widths"),
        ("n_layers=2,4", [], "--ladder: the coordinate check scales the width only"),
        ("width=32,64", [], "expected the key d_model, got 'width'"),
        ("d_model=32,4.5", [], "--ladder: d_model values must be integers, got '4.5'"),
        ("d_model=32,32", [], "--ladder: each width once"),
        ("32,64", [], "--ladder: expected d_model=v1,v2"),
        ("d_model=32,30", [], "--ladder: d_model=30: n_heads: d_model=30 is not divisible"),
        ("d_model=32,64", ["--base-d-model", "30"], "--base-d-model: 30 is not divisible"),
        ("d_model=32,64", ["--lr", "0"], "--lr: expected a positive finite rate"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    ladder: str, extra: list[str], message: str, tmp_path
) -> None:
    out = tmp_path / "cc"
    result = runner.invoke(app, ["coord-check", "--ladder", ladder, *extra, "--out", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    start = "normlab coord-check: error: "
    assert len(lines) == 1 and lines[0].startswith(start) and message in lines[0], lines
    assert not out.exists()
