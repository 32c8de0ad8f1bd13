"""The known-result studies: their configs, the A/A control's same-function claim, DyT's
per-position α, and scripts/studies.py end to end in quick mode."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from normlab.experiment.config import load_config_file, validate_config
from normlab.layers import RMSNorm
from normlab.models import GPT, GPTConfig
from normlab.registry import make_norm

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("normlab_studies", ROOT / "scripts/studies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


studies = load_script()


# ---- the A/A control: LLaMA gain w vs Gemma gain 1 + w are the same function in float32 ----
def test_gemma_and_llama_gains_are_the_same_function_in_float32() -> None:
    llama, gemma = make_norm("rmsnorm", 32), make_norm("rmsnorm_gemma", 32)
    assert gemma.casting == "gemma" and llama.casting != "gemma"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 32, generator=gen) * 3
    assert torch.equal(llama(x), gemma(x))  # w0 = 1 and w0' = 0: bit for bit at init
    with torch.no_grad():  # after training: w' = w − 1 (exact for w in [0.5, 2], Sterbenz)
        llama.weight.copy_(1 + 0.4 * (torch.rand(32, generator=gen) - 0.5))
        gemma.weight.copy_(llama.weight - 1)
    assert torch.equal(gemma.weight + 1, llama.weight)
    xl, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
    yl, yg = llama(xl), gemma(xg)
    assert torch.equal(yl, yg)
    g = torch.randn(yl.shape, generator=gen)
    yl.backward(g)
    yg.backward(g)
    assert torch.equal(xl.grad, xg.grad)
    assert torch.equal(llama.weight.grad, gemma.weight.grad)  # AdamW then moves both alike


def test_casting_is_what_differs_in_16_bit_and_not_in_float32() -> None:
    """The same gain under the llama and gemma castings: equal in float32, not always in bf16."""
    gen = torch.Generator().manual_seed(1)
    w = 1 + 0.3 * torch.randn(64, generator=gen)
    llama, gemma = RMSNorm(64, casting="llama"), RMSNorm(64, casting="gemma")
    with torch.no_grad():
        llama.weight.copy_(w)
        gemma.weight.copy_(w)
    x = torch.randn(256, 64, generator=gen)
    assert torch.equal(llama(x), gemma(x))
    xb = x.bfloat16()
    assert not torch.equal(llama(xb), gemma(xb))


# ---- DyT: one α0 per position, the default unchanged ----------------------------------------
def _alphas(model: GPT) -> dict[str, float]:
    return {
        name.removesuffix(".alpha"): float(p.detach())
        for name, p in model.named_parameters()
        if name.endswith(".alpha")
    }


def test_dyt_alpha_per_position_defaults_to_the_single_alpha() -> None:
    base = {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 8, "norm": "dyt"}
    default = _alphas(GPT(GPTConfig(**base, dyt_alpha_init=0.25)))
    assert default and set(default.values()) == {0.25}
    cfg = GPTConfig(**base, dyt_alpha_attn=1.5, dyt_alpha_mlp=0.75, dyt_alpha_final=0.375)
    alphas = _alphas(GPT(cfg))
    assert alphas == {
        "blocks.0.norm_attn": 1.5,
        "blocks.0.norm_mlp": 0.75,
        "blocks.1.norm_attn": 1.5,
        "blocks.1.norm_mlp": 0.75,
        "norm_final": 0.375,
    }
    sandwich = _alphas(GPT(GPTConfig(**{**base, "placement": "sandwich"}, dyt_alpha_mlp=2.0)))
    assert sandwich["blocks.0.norm_mlp_out"] == 2.0 and sandwich["blocks.0.norm_attn_out"] == 0.5
    assert GPTConfig().dyt_alpha("attn") == GPTConfig().dyt_alpha_init
    with pytest.raises(ValueError, match="dyt_alpha_attn"):
        GPTConfig(dyt_alpha_attn=float("nan"))


# ---- the study configs ------------------------------------------------------------------------
@pytest.mark.parametrize("study", studies.STUDIES, ids=lambda s: s.name)
def test_each_study_config_is_valid_and_names_its_expectation(study: object) -> None:
    cfg = validate_config(load_config_file(study.config))  # type: ignore[attr-defined]
    arms = cfg.arm_names()
    assert set(study.expected) <= set(arms[1:])  # type: ignore[attr-defined]
    header = study.config.read_text(encoding="utf-8").split("\n\n")[0]  # type: ignore[attr-defined]
    assert "Literature:" in header and "Expected direction:" in header
    for verdict in study.expected.values():  # type: ignore[attr-defined]
        assert verdict.upper() in header


def test_every_yaml_in_the_folder_is_a_study() -> None:
    assert {p.stem for p in studies.STUDY_DIR.glob("*.yaml")} == set(studies.STUDY_NAMES)


def test_agreement() -> None:
    assert studies.agreement("worse", "worse") == "agree"
    assert studies.agreement("equivalent", "inconclusive") == "undecided"
    assert studies.agreement("equivalent", "better") == "disagree"
    assert studies.agreement("worse", "better") == "disagree"
    assert studies.agreement("worse", "unclear size") == "undecided"


def test_an_arm_that_failed_to_learn_is_worse_whatever_its_quality_word() -> None:
    base = {"quality": "inconclusive", "stability_text": "Stability: s.", "reason": "r"}
    failed = {**base, "reason": "layernorm-post failed to learn"}
    assert studies.measured_verdict(failed) == ("worse", "Stability: s.")
    assert studies.measured_verdict(base) == ("inconclusive", "Stability: s.")
    less_stable = {**base, "quality": "equivalent", "reason": "x is less stable"}
    assert studies.measured_verdict(less_stable)[0] == "equivalent"


def test_deep_merge_keeps_the_other_keys() -> None:
    merged = studies.deep_merge(
        {"train": {"lr": 1, "steps": 5}, "seeds": 3}, {"train": {"steps": 2}}
    )
    assert merged == {"train": {"lr": 1, "steps": 2}, "seeds": 3}


def test_quick_mode_runs_one_study_end_to_end(tmp_path: Path) -> None:
    doc = tmp_path / "studies.md"
    assert (
        studies.main(["--quick", "--only", "aa_gain", "--out", str(tmp_path), "--doc", str(doc)])
        == 0
    )
    text = doc.read_text(encoding="utf-8")
    assert "Quick mode" in text
    assert "| aa_gain | rmsnorm_gemma-pre vs rmsnorm-pre | equivalent |" in text
    assert "## Noise floor (from the A/A studies)" in text and "margin_bpb = 0.02" in text
    assert "\n### aa_gain\n" in text
    assert (tmp_path / "quick" / "aa_gain" / "runs").is_dir()
    # resumable: a second call reuses the finished runs, and --no-run only analyses
    assert (
        studies.main(
            ["--quick", "--only", "aa_gain", "--out", str(tmp_path), "--doc", str(doc), "--no-run"]
        )
        == 0
    )
    assert "aa_gain" in doc.read_text(encoding="utf-8")


def test_dyt_embed_scale_is_the_dyt_arms_own_parameter() -> None:
    from normlab.models import check_paired, init_gpt_paired_

    base = {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8, "dyt_embed_scale": 4.0}
    dyt = init_gpt_paired_(GPT(GPTConfig(**base, norm="dyt")), 0)
    ln = init_gpt_paired_(GPT(GPTConfig(**base, norm="layernorm")), 0)
    assert "norm_embed_scale.scale" in dyt.norm_parameter_names()
    assert not hasattr(ln, "norm_embed_scale")  # other arms ignore the setting
    check_paired({"dyt": dyt, "layernorm": ln})
    assert float(dyt.norm_embed_scale.scale.detach()) == 4.0
    idx = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        dyt.norm_embed_scale.scale.fill_(1.0)
        ref = dyt(idx)[0]
        dyt.norm_embed_scale.scale.fill_(4.0)
        assert not torch.equal(ref, dyt(idx)[0])
    with pytest.raises(ValueError, match="dyt_embed_scale"):
        GPTConfig(dyt_embed_scale=0.0)


def test_the_worst_arm_counts_the_baseline_and_the_metric_direction() -> None:
    diffs = {"a": 0.02, "b": 0.05}
    assert studies.rank_worst(diffs, "base", lower_is_better=True) == ["b", "a", "base"]
    assert studies.rank_worst({"a": -0.02, "b": -0.01}, "base", lower_is_better=True)[0] == "base"
    assert studies.rank_worst(diffs, "base", lower_is_better=False) == ["base", "a", "b"]
    assert studies.rank_worst({"a": -0.02, "b": 0.01}, "base", lower_is_better=False)[0] == "a"


def test_margin_reach_names_the_run_that_can_show_equivalence() -> None:
    assert studies.margin_reach(2) == "default"
    assert studies.margin_reach(studies.DEFAULT_SEEDS) == "default"
    assert studies.margin_reach(studies.DEFAULT_SEEDS + 1) == "until-decided"
    assert studies.margin_reach(studies.DEFAULT_MAX_SEEDS) == "until-decided"
    assert studies.margin_reach(studies.DEFAULT_MAX_SEEDS + 1) == "longer"
    assert studies.margin_reach(studies.AFFORDABLE_SEEDS + 1) == "unaffordable"
    assert studies.margin_reach(None) == "unaffordable"


def test_the_committed_document_reports_every_study_from_real_runs() -> None:
    text = (studies.ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    assert "Quick mode" not in text
    for name in studies.STUDY_NAMES:
        assert f"\n## {name}\n" in text, name
        assert f"| {name} |" in text, name
    assert "## Noise floor (from the A/A studies)" in text
    for name in studies.AA_STUDIES:  # a floor for each testbed, in its own unit
        assert f"\n### {name}\n" in text, name


def test_worst_check_needs_the_worst_arm_to_be_told_apart_from_the_runner_up() -> None:
    seeds = range(5)
    spread = [0.001, -0.001, 0.0005, -0.0005, 0.0]

    def arm(mean: float) -> dict[int, float]:
        return {k: mean + e for k, e in zip(seeds, spread, strict=True)}

    clear = {"a": arm(0.01), "b": arm(0.05)}
    agree = studies.worst_check(clear, "base", "b", lower_is_better=True, margin=0.002)
    assert (agree["measured"], agree["against"], agree["agreement"]) == ("b", "a", "agree")
    disagree = studies.worst_check(clear, "base", "a", lower_is_better=True, margin=0.002)
    assert (disagree["measured"], disagree["against"]) == ("b", "a")
    assert disagree["agreement"] == "disagree"
    tied = {"a": arm(0.0500), "b": {k: v + 0.0001 * (-1) ** k for k, v in arm(0.0502).items()}}
    undecided = studies.worst_check(tied, "base", "b", lower_is_better=True, margin=0.002)
    assert undecided["measured"] == "b" and undecided["agreement"] == "undecided"
    # every arm better than the baseline: the baseline is the worst
    better = {"a": arm(-0.03), "b": arm(-0.01)}
    base = studies.worst_check(better, "base", "b", lower_is_better=True, margin=0.002)
    assert base["measured"] == "base" and base["agreement"] == "disagree"
    # an arm with no result is left out; the expected arm missing leaves it undecided
    gone = studies.worst_check({**clear, "c": {}}, "base", "b", lower_is_better=True, margin=0.002)
    assert gone["measured"] == "b" and gone["agreement"] == "agree"
    missing = studies.worst_check({"a": arm(0.01), "b": {}}, "base", "b", True, 0.002)
    assert missing == {"expected": "b", "measured": None, "agreement": "undecided"}


def test_a_sequential_study_runs_until_decided_with_its_limits() -> None:
    cmd = studies.compare_command(Path("c.yaml"), Path("out"), (16, 1500))
    assert cmd[cmd.index("--max-seeds") + 1] == "16" and "--until-decided" in cmd
    assert cmd[cmd.index("--max-time") + 1] == "1500"
    assert "--until-decided" not in studies.compare_command(Path("c.yaml"), Path("out"))
    shown = studies.shown_command([*cmd[:1], "-m", "normlab", *cmd[3:]])
    assert shown.startswith("normlab compare --config c.yaml --out out --until-decided")


def test_a_floor_far_below_the_margin_is_called_rounding_only() -> None:
    floor = {
        "arm": "twin-pre",
        "seed_diffs": {0: 1e-8, 1: -2e-8, 2: 1.5e-8},
        "mean_diff": 0.17e-8,
        "ci": (-4e-8, 4e-8),
        "sd_diff": 1.8e-8,
        "half_width": 4e-8,
        "n_pairs": 3,
        "margin_key": "margin_val_loss",
        "margin": 0.002,
        "above_floor": True,
        "seeds_needed": 2,
        "reach": "default",
    }
    text = "\n".join(studies._floor_lines("aa_dit", floor))
    assert text.startswith("### aa_dit") and "margin_val_loss = 0.002 lies above" in text
    assert "does not amplify a rounding-level difference" in text
    amplified = {**floor, "sd_diff": 0.004, "half_width": 0.01}
    assert "does not amplify" not in "\n".join(studies._floor_lines("aa_gain", amplified))


def test_regenerating_keeps_the_hand_run_sections(tmp_path: Path) -> None:
    doc = tmp_path / "studies.md"
    kept = "<!-- kept: made by other commands -->\n## Ladder\n\ncoverage 94 %\n"
    doc.write_text("# old generated part\n\n" + kept, encoding="utf-8")
    assert studies.kept_sections(doc.read_text(encoding="utf-8")) == kept
    assert studies.kept_sections("# nothing kept\n") == ""
    studies.main(["--quick", "--only", "aa_gain", "--out", str(tmp_path), "--doc", str(doc)])
    text = doc.read_text(encoding="utf-8")
    assert "# old generated part" not in text and text.endswith(kept)
    assert text.index("Quick mode") < text.index("## Ladder")
