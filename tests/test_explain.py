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


# --- huge and tiny finite inputs: exact x̂, valid JSON ---------------------------------------------


def _strict_json(text: str) -> dict:
    """Parse JSON, refusing the non-standard constants Infinity, -Infinity and NaN."""

    def refuse(name: str) -> None:
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_explain_huge_values_give_unit_xhats() -> None:
    e = explain_vector([1e200, -1e200])
    assert e.layer_norm_hat == [1.0, -1.0] and e.rms_norm_hat == [1.0, -1.0]
    assert e.mean == 0.0 and e.rms == pytest.approx(1e200, rel=1e-15)
    assert e.variance == math.inf and e.mean_square == math.inf  # 1e400: beyond float64
    assert e.layer_norm_hat_mean_square == 1.0
    for t in e.transforms:
        assert t.layer_norm_unchanged or t.layer_norm_flipped, t.name


def test_explain_json_is_valid_for_huge_values() -> None:
    result = invoke("1e200", "-1e200", "--json")
    assert result.exit_code == 0, result.output
    e = _strict_json(result.output)
    assert e["variance"] is None and e["mean_square"] is None  # beyond float64: null
    assert e["layer_norm_hat"] == [1.0, -1.0] and e["rms"] == pytest.approx(1e200)
    table = invoke("1e200", "-1e200")
    assert table.exit_code == 0 and "1.000000" in table.output and "-1.000000" in table.output


def test_explain_keeps_eps_inside_the_root_at_any_scale() -> None:
    # σ² = m = 1e308 and ε = 1e308: x̂ = 1e154/√(2e308) = ±1/√2, though σ² + ε overflows float64
    e = explain_vector([1e154, -1e154], eps=1e308)
    half = 1 / math.sqrt(2)
    assert e.layer_norm_hat == pytest.approx([half, -half], rel=1e-15)
    assert e.rms_norm_hat == pytest.approx([half, -half], rel=1e-15)
    # tiny values: ε dominates, x̂ = x/√(x² + ε) ≠ 0 even though x² underflows float64
    e = explain_vector([1e-200, -1e-200], eps=1e-300)
    assert e.layer_norm_hat == pytest.approx([1e-50, -1e-50], rel=1e-15)
    # a constant vector: x − μ = 0, so LayerNorm x̂ = 0 (ε > 0 keeps the root positive)
    assert explain_vector([1e300, 1e300]).layer_norm_hat == [0.0, 0.0]


def test_explain_transforms_past_float64_range_stay_exact() -> None:
    e = explain_vector([1e308, -1e308, 5e307], scale=10.0)  # 10·x overflows float64
    scaled, flipped, _ = e.transforms
    assert scaled.layer_norm_unchanged and scaled.rms_norm_unchanged
    assert flipped.layer_norm_flipped and flipped.rms_norm_flipped
    assert scaled.layer_norm_hat == pytest.approx(e.layer_norm_hat, rel=1e-15)
    assert all(math.isfinite(v) for v in e.layer_norm_hat + e.rms_norm_hat)


# ----------------------------------------------------------------------------------------------
# Drop-in for torch: casting, constructors, compile/export, autocast, strides, empty batches
# ----------------------------------------------------------------------------------------------
# --- explain: errors name the argument ------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"),
    [
        ({"values": ["a", 1.0]}, TypeError, "values"),
        ({"values": [[1.0, 2.0]]}, TypeError, "values"),
        ({"values": [1.0, 2.0], "scale": float("nan")}, ValueError, "scale"),
        ({"values": [1.0, 2.0], "shift": float("inf")}, ValueError, "shift"),
        ({"values": [1.0, 2.0], "scale": "3"}, TypeError, "scale"),
    ],
)
def test_explain_vector_errors_name_the_argument(kwargs: dict, exc: type, fragment: str) -> None:
    with pytest.raises(exc, match=fragment) as info:
        explain_vector(**kwargs)
    assert "expected" in str(info.value)


def test_explain_vector_accepts_any_iterable() -> None:
    assert explain_vector(iter([1.0, 2.0])).x == explain_vector((1.0, 2.0)).x == [1.0, 2.0]
