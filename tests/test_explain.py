"""``normlab explain``: the worked examples of DESIGN §1, through the CLI and the Python API."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from normlab.cli import app
from normlab.explain import explain_vector

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["explain", *args])


def test_explain_1_2_shows_both_xhats_side_by_side() -> None:
    result = invoke("1", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    eps = 1e-5
    ln = 0.5 / math.sqrt(0.25 + eps)  # μ = 1.5, σ² = 0.25
    rms = 1 / math.sqrt(2.5 + eps)  # m = 2.5
    for value in (f"{-ln:.6f}", f"{ln:.6f}", f"{rms:.6f}", f"{2 * rms:.6f}"):
        assert value in out
    # the worked example of DESIGN §1: LayerNorm x̂ ≈ [−1, 1], RMSNorm x̂ ≈ [0.632, 1.265]
    assert (round(ln, 3), round(rms, 3), round(2 * rms, 3)) == (1.0, 0.632, 1.265)
    for label in ("μ", "σ²", "m", "RMS", "LayerNorm x̂", "RMSNorm x̂", "mean(x̂)", "mean(x̂²)"):
        assert label in out
    assert "unchanged" in out and "sign flipped" in out and "changed" in out


def test_explain_json_worked_example() -> None:
    result = invoke("1", "2", "3", "4", "--json")
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    assert e["x"] == [1.0, 2.0, 3.0, 4.0] and e["eps"] == 1e-5
    assert e["mean"] == pytest.approx(2.5)
    assert e["mean_square"] == pytest.approx(7.5)
    assert e["variance"] == pytest.approx(1.25)
    assert e["rms"] == pytest.approx(math.sqrt(7.5))
    ln = [(v - 2.5) / math.sqrt(1.25 + 1e-5) for v in (1, 2, 3, 4)]
    rms = [v / math.sqrt(7.5 + 1e-5) for v in (1, 2, 3, 4)]
    assert e["layer_norm_hat"] == pytest.approx(ln, rel=1e-12)
    assert e["rms_norm_hat"] == pytest.approx(rms, rel=1e-12)
    assert e["layer_norm_hat_mean"] == pytest.approx(0, abs=1e-12)
    assert e["layer_norm_hat_mean_square"] == pytest.approx(1.25 / (1.25 + 1e-5))
    assert e["rms_norm_hat_mean"] == pytest.approx(sum(rms) / 4)
    assert e["rms_norm_hat_mean_square"] == pytest.approx(7.5 / (7.5 + 1e-5))


def test_explain_json_invariances() -> None:
    e = json.loads(invoke("1", "2", "3", "4", "--json").output)
    by_name = {t["name"]: t for t in e["transforms"]}
    scale, flip, shift = by_name["x → 3·x"], by_name["x → -3·x"], by_name["x → x + 1"]
    assert scale["layer_norm_unchanged"] and scale["rms_norm_unchanged"]
    assert flip["layer_norm_flipped"] and flip["rms_norm_flipped"]
    assert not flip["layer_norm_unchanged"] and not flip["rms_norm_unchanged"]
    assert shift["layer_norm_unchanged"]
    assert not shift["rms_norm_unchanged"] and not shift["rms_norm_flipped"]
    assert shift["rms_norm_hat"] == pytest.approx(
        [v / math.sqrt(13.5 + 1e-5) for v in (2, 3, 4, 5)]
    )


def test_explain_eps_scale_and_shift_options() -> None:
    e = json.loads(
        invoke("1", "2", "--eps", "0.5", "--scale", "2", "--shift", "-3", "--json").output
    )
    assert e["eps"] == 0.5
    assert e["layer_norm_hat"] == pytest.approx([-0.5 / math.sqrt(0.75), 0.5 / math.sqrt(0.75)])
    assert e["rms_norm_hat"] == pytest.approx([1 / math.sqrt(3.0), 2 / math.sqrt(3.0)])
    names = [t["name"] for t in e["transforms"]]
    assert names == ["x → 2·x", "x → -2·x", "x → x + -3"]
    # with a large ε the rescaling no longer leaves x̂ unchanged: ε is inside the root
    assert not e["transforms"][0]["rms_norm_unchanged"]


def test_explain_accepts_negative_values() -> None:
    result = invoke("-1", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["x"] == [-1.0, 2.0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [((), "Missing argument"), (("1", "nan"), "finite"), (("1", "2", "--eps", "0"), "eps")],
)
def test_explain_bad_input(args: tuple[str, ...], fragment: str) -> None:
    result = invoke(*args)
    assert result.exit_code != 0
    assert fragment in result.output


def test_explain_vector_api_worked_examples() -> None:
    e = explain_vector([1.0, 2.0])
    assert e.layer_norm_hat == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert e.rms_norm_hat == pytest.approx([0.632, 1.265], abs=1e-3)
    e4 = explain_vector([1, 2, 3, 4])
    assert (e4.mean, e4.mean_square) == (pytest.approx(2.5), pytest.approx(7.5))
    with pytest.raises(ValueError, match="values"):
        explain_vector([])
