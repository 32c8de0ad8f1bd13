"""``normlab compare --testbed dit``: config, the shapes dataset, pairing, a tiny end-to-end run
with its analysis and report, resume, and that the GPT testbed's outputs keep their labels."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from normlab import run_format
from normlab.analysis import analyze, load_compare_folder
from normlab.analysis.runs import MARGIN_KEYS
from normlab.cli import app
from normlab.data import (
    SHAPE_CLASSES,
    load_shapes,
    make_shapes,
    patchify,
    prepare_shapes,
    unpatchify,
)
from normlab.experiment.config import ConfigError, validate_config
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.execution.run_loop import outcome_line
from normlab.experiment.testbeds import build_model, make_testbed
from normlab.experiment.testbeds.dit import dit_config
from normlab.models import DEFAULT_CFG_SCALE, DEFAULT_LABEL_DROPOUT, shared_parameter_digests
from normlab.models.flow_batches import FlowBatches, validation_triples
from normlab.report import build_report
from normlab.run_format.summary import crashed_summary
from normlab.study.loader import build_config_dict

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
TINY_DIT: dict[str, Any] = {
    "testbed": "dit",
    "device": "cpu",
    "threads": 1,
    "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
    "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
    "train": {"batch_size": 4, "warmup": 1, "eval_interval": 2, "layer_grad_interval": 2},
}


def tiny(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(TINY_DIT))
    for dotted, value in changes.items():
        *sections, key = dotted.split("__")
        node = data
        for s in sections:
            node = node.setdefault(s, {})
        node[key] = value
    return data


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.output


def text_files(folder: Path) -> dict[str, str]:
    """Every text file under ``folder``, HTML with its embedded images cut out."""
    out = {}
    for p in folder.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".csv", ".html"):
            text = p.read_text(encoding="utf-8")
            out[str(p.relative_to(folder))] = re.sub(r"base64,[^\"]*", "IMAGE", text)
    return out


# ---- configuration ------------------------------------------------------------------------


def test_dit_defaults() -> None:
    cfg = validate_config({"testbed": "dit"})
    assert cfg.norms == ["adaln_zero", "adarms"] and cfg.placements == ["pre"]
    assert cfg.arm_names() == ["adaln_zero-pre", "adarms-pre"]
    assert cfg.train.batch_size == 32 and cfg.train.weight_decay == 0.0 and cfg.train.lr == 3e-3
    assert cfg.train.target_val_loss == 0.3 and cfg.resolved_steps() == 2400
    assert cfg.margin() == cfg.margin_val_loss == MARGIN_KEYS["dit"][1]
    assert cfg.shapes.seq_len == 16 and cfg.shapes.in_channels == 16
    # tokens per step are images × patches per image
    by_tokens = validate_config({"testbed": "dit", "train": {"tokens": 100_000}})
    assert by_tokens.resolved_steps() == math.ceil(100_000 / (32 * 16))
    # the GPT's defaults are untouched
    gpt = validate_config({})
    assert gpt.testbed == "gpt" and gpt.norms == ["layernorm", "rmsnorm"]
    assert gpt.train.batch_size == 16 and gpt.train.target_val_loss == 2.0
    assert "dit" not in gpt.dump() and "margin_val_loss" not in gpt.dump()
    assert "model" not in cfg.dump() and "eval_windows" not in cfg.dump()["train"]


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"testbed": "dit", "placements": ["pre", "post"]}, "placements: the dit testbed is"),
        ({"testbed": "dit", "norms": ["rmsnorm"]}, "norms: 'rmsnorm' takes no condition"),
        ({"testbed": "dit", "norms": ["adarms", "layernorm"]}, "norms: 'layernorm'"),
        ({"testbed": "dit", "data": {"path": "corpus/"}}, "data.path: an option of the gpt"),
        ({"testbed": "dit", "model": {"d_model": 32}}, "model.d_model: an option of the gpt"),
        ({"testbed": "dit", "margin_bpb": 0.1}, "margin_bpb: an option of the gpt"),
        ({"testbed": "dit", "train": {"eval_windows": 8}}, "train.eval_windows: an option"),
        ({"dit": {"d_model": 32}}, "dit.d_model: an option of the dit testbed"),
        ({"shapes": {"seed": 3}}, "shapes.seed: an option of the dit testbed"),
        ({"margin_val_loss": 0.01}, "margin_val_loss: an option of the dit testbed"),
        ({"testbed": "dit", "dit": {"n_heads": 5}}, "dit: n_heads: d_model=64"),
        ({"testbed": "dit", "shapes": {"patch_size": 3}}, "shapes: patch_size 3 does not"),
        ({"testbed": "dit", "margin_val_loss": 0}, "margin_val_loss"),
        ({"testbed": "dit", "dit": {"label_dropout": 1.0}}, "dit.label_dropout: Input should be"),
        ({"testbed": "dit", "dit": {"label_dropout": -0.1}}, "dit.label_dropout: Input should"),
        ({"testbed": "dit", "dit": {"label_dropout": "0.1"}}, "dit.label_dropout: Input should"),
        ({"testbed": "dit", "dit": {"cfg_scale": -1.0}}, "dit.cfg_scale: Input should be"),
        ({"testbed": "dit", "dit": {"cfg_scale": float("nan")}}, "dit.cfg_scale: Input should"),
        (
            {"testbed": "dit", "dit": {"class_conditional": False, "label_dropout": 0.2}},
            "dit: label_dropout: 0.2 needs class_conditional: true",
        ),
        (
            {"testbed": "dit", "dit": {"class_conditional": False, "cfg_scale": 3.0}},
            "dit: cfg_scale: 3.0 needs class_conditional: true",
        ),
        ({"testbed": "vit"}, "testbed: expected one of gpt, dit, lm"),
    ],
)
def test_config_errors_name_the_option(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    assert named in str(err.value)


def test_guidance_settings_and_what_a_run_records(tmp_path: Path) -> None:
    dit = validate_config({"testbed": "dit"}).dit
    assert dit.label_dropout == DEFAULT_LABEL_DROPOUT == 0.1 and dit.cfg_scale == DEFAULT_CFG_SCALE
    assert dit.guidance() == {"label_dropout": 0.1, "cfg_scale": DEFAULT_CFG_SCALE}
    runs = _planned(tmp_path, seeds=1)
    assert {k: runs[0]["dit"][k] for k in ("time_distribution", "label_dropout", "cfg_scale")} == {
        "time_distribution": "logit_normal",
        "label_dropout": 0.1,
        "cfg_scale": DEFAULT_CFG_SCALE,
    }
    # run.json names every setting as the YAML config does: its dit and shapes sections
    cfg = validate_config(tiny(seeds=1))
    assert runs[0]["dit"] == cfg.dump()["dit"] and runs[0]["shapes"] == cfg.dump()["shapes"]
    assert "model" not in runs[0] and "flow" not in runs[0]
    # without class labels: defaults and the neutral values are accepted, and recorded as neutral
    for given in ({}, {"label_dropout": 0.0, "cfg_scale": 1.0}, {"label_dropout": 0.1}):
        cfg = validate_config({"testbed": "dit", "dit": {"class_conditional": False, **given}})
        assert cfg.dit.guidance() == {"label_dropout": 0.0, "cfg_scale": 1.0}
    assert validate_config({"testbed": "dit", "dit": {"cfg_scale": 0}}).dit.cfg_scale == 0.0


def test_unknown_dit_key_lists_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key 'dit\.d_modle'; valid keys of dit: d_model"
    ):
        validate_config({"testbed": "dit", "dit": {"d_modle": 8}})


def test_cli_testbed_flag_and_refused_data(tmp_path: Path) -> None:
    cfg = validate_config(build_config_dict(None, {"testbed": "dit", "train.lr": 0.01}))
    assert cfg.testbed == "dit" and cfg.train.lr == 0.01 and cfg.norms[0] == "adaln_zero"
    out = tmp_path / "out"
    code, output = invoke("--testbed", "dit", "--data", str(tmp_path), "--out", str(out))
    assert code == 2 and "data.path" in output and "--data" in output
    assert not out.exists()
    code, output = invoke("--testbed", "dit", "--placements", "post", "--out", str(out))
    assert code == 2 and "placements" in output and not out.exists()


# ---- the dataset --------------------------------------------------------------------------


def test_shapes_are_deterministic_disjoint_and_well_formed() -> None:
    x_tr, y_tr, x_va, y_va = make_shapes(300, 60, 16, seed=5)
    again = make_shapes(300, 60, 16, seed=5)
    for a, b in zip((x_tr, y_tr, x_va, y_va), again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = make_shapes(300, 60, 16, seed=6)
    assert not np.array_equal(x_tr, other[0])
    assert x_tr.shape == (300, 16, 16) and x_va.shape == (60, 16, 16)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert x_tr.min() >= -1.0 and x_tr.max() <= 1.0 and (x_tr == -1.0).any()
    assert set(np.unique(y_tr)) == set(range(len(SHAPE_CLASSES)))
    train_keys = {img.tobytes() for img in x_tr}
    assert len(train_keys) == 300  # no duplicates within a set
    assert not any(img.tobytes() in train_keys for img in x_va)  # and none across the split
    # the first images are the same whatever the split sizes: one stream, cut in two
    small = make_shapes(100, 10, 16, seed=5)
    np.testing.assert_array_equal(small[0], x_tr[:100])
    np.testing.assert_array_equal(small[2], x_tr[100:110])


def test_shapes_have_their_geometry() -> None:
    x, y, _, _ = make_shapes(400, 1, 16, seed=0)
    lit = x > -0.5
    width = lit.any(axis=1).sum(axis=1)  # columns with a bright pixel
    height = lit.any(axis=2).sum(axis=1)
    hbar, vbar = y == SHAPE_CLASSES.index("hbar"), y == SHAPE_CLASSES.index("vbar")
    disc, square = y == SHAPE_CLASSES.index("disc"), y == SHAPE_CLASSES.index("square")
    assert (width[hbar] > height[hbar]).all() and (height[vbar] > width[vbar]).all()
    # a square fills its bounding box; a disc leaves its corners dark (π/4 of it)
    fill = lit.sum(axis=(1, 2)) / np.maximum(width * height, 1)
    assert fill[square].mean() > 0.85 and fill[disc].mean() < 0.85


def test_patchify_is_row_major_and_invertible() -> None:
    images = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4)
    tokens = patchify(images, 2)
    assert tokens.shape == (2, 4, 4)
    np.testing.assert_array_equal(tokens[0, 0], [0, 1, 4, 5])  # top-left patch, row by row
    np.testing.assert_array_equal(tokens[0, 1], [2, 3, 6, 7])  # its right neighbour
    np.testing.assert_array_equal(unpatchify(tokens, 4), images)
    with pytest.raises(ValueError, match="patch"):
        patchify(images, 3)


def test_load_and_prepare_shapes(tmp_path: Path) -> None:
    data = load_shapes(8, 4, 20, 5, 1)
    assert data.train.shape == (20, 4, 16) and data.val.shape == (5, 4, 16)
    assert data.info["n_train_tokens"] == 80 and data.info["fingerprint"].startswith("sha256:")
    info = prepare_shapes(tmp_path / "data", 8, 4, 20, 5, 1)
    assert info == json.loads((tmp_path / "data" / "data.json").read_text())
    assert prepare_shapes(tmp_path / "data", 8, 4, 20, 5, 1) == info  # reused
    with pytest.raises(ValueError, match=r"shapes\.seed: .*seed=1.*seed=2"):
        prepare_shapes(tmp_path / "data", 8, 4, 20, 5, 2)


# ---- pairing ------------------------------------------------------------------------------


def _planned(tmp_path: Path, seeds: int = 2, **changes: Any) -> list[dict[str, Any]]:
    cfg = validate_config(tiny(seeds=seeds, **changes))
    s = cfg.shapes
    info = prepare_shapes(tmp_path / "data", s.image_size, s.patch_size, s.n_train, s.n_val, s.seed)
    return plan_runs(cfg, "cpu", 1, info)


def test_plan_pairs_the_init_of_every_shared_parameter(tmp_path: Path) -> None:
    runs = _planned(tmp_path)
    assert [r["run_id"] for r in runs] == [
        "adaln_zero-pre__s0",
        "adarms-pre__s0",
        "adaln_zero-pre__s1",
        "adarms-pre__s1",
    ]
    assert runs[0]["init_digest"] == runs[1]["init_digest"] != runs[2]["init_digest"]
    assert runs[2]["init_digest"] == runs[3]["init_digest"]
    assert runs[0]["testbed"] == "dit" and dit_config(runs[0]).seq_len == 4
    assert runs[0]["norm"] != runs[1]["norm"]  # only the norms differ
    assert runs[0]["n_params"] == runs[1]["n_params"]  # (3 + 3 + 2)·D·(D + 1) each
    a, b = build_model(runs[0], 0), build_model(runs[1], 0)
    shared = shared_parameter_digests(a)
    assert shared == shared_parameter_digests(b) and "blocks.0.attn.qkv.weight" in shared
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert torch.equal(pa["blocks.0.mlp.fc.weight"], pb["blocks.0.mlp.fc.weight"])
    assert pa["blocks.0.mlp.fc.weight"].abs().sum() > 0
    norms_a = {n: p.shape for n, p in pa.items() if n not in shared}
    norms_b = {n: p.shape for n, p in pb.items() if n not in shared}
    assert norms_a and norms_a == norms_b  # the same modulation shapes; only the norm differs
    assert type(a.norm_final) is not type(b.norm_final)


def test_every_arm_of_a_seed_sees_the_same_images_noises_and_times(tmp_path: Path) -> None:
    runs = _planned(tmp_path)
    first, second = (make_testbed(r, tmp_path / "runs" / r["run_id"]) for r in runs[:2])
    other_seed = make_testbed(runs[2], tmp_path / "runs" / runs[2]["run_id"])
    for _ in range(20):  # more than an epoch of 64 images in batches of 4
        batch, same, other = first.batches.next(), second.batches.next(), other_seed.batches.next()
        for u, v in zip(batch, same, strict=True):
            assert torch.equal(u, v)
        assert not torch.equal(batch[2], other[2]) and not torch.equal(batch[3], other[3])
    # validation: identical triples for every arm and every seed
    for u, v in zip(first.triples, other_seed.triples, strict=True):
        assert torch.equal(u, v)
    x1, label, _, t = first.triples
    assert x1.shape == (16, 4, 16) and label.shape == (16,) and ((t > 0) & (t < 1)).all()


def _dropped(testbed: Any, steps: int) -> torch.Tensor:
    """Which labels of the testbed's next ``steps`` training batches are the null class."""
    null = testbed.null_class
    return torch.cat([testbed.batches.next()[1] == null for _ in range(steps)])


def test_label_dropout_is_paired_across_arms_and_drawn_per_seed(tmp_path: Path) -> None:
    runs = _planned(tmp_path, seeds=2, dit__label_dropout=0.3)
    first, second, other_seed = (
        make_testbed(r, tmp_path / "runs" / r["run_id"]) for r in (runs[0], runs[1], runs[2])
    )
    assert first.null_class == len(SHAPE_CLASSES) and runs[0]["norm"] != runs[1]["norm"]
    mask, same, other = (_dropped(testbed, 50) for testbed in (first, second, other_seed))
    assert torch.equal(mask, same)  # the same labels dropped in both arms at every step
    assert not torch.equal(mask, other)  # and other ones for another seed
    assert mask.float().mean().item() == pytest.approx(0.3, abs=0.1)  # 200 labels
    # validation keeps the true labels: the loss measures the conditional model
    assert int(first.triples[1].max()) < first.null_class


def test_label_dropout_leaves_order_noise_and_times_alone_and_drops_a_fraction_p() -> None:
    images = np.zeros((100, 2, 3), dtype=np.float32)
    labels = np.arange(100) % 4
    plain = FlowBatches(images, labels, 32, seed=7)
    dropping = FlowBatches(images, labels, 32, seed=7, label_dropout=0.1, null_class=4)
    dropped = []
    for _ in range(400):
        a, b = plain.next(), dropping.next()
        for k in (0, 2, 3):
            assert torch.equal(a[k], b[k])
        kept = b[1] != 4
        assert torch.equal(a[1][kept], b[1][kept])
        dropped.append(~kept)
    fraction = torch.cat(dropped).float().mean().item()
    assert fraction == pytest.approx(0.1, abs=0.01)  # 12,800 labels: σ ≈ 0.0027
    none = FlowBatches(images, labels, 32, seed=7, label_dropout=0.0, null_class=4)
    assert all((none.next()[1] != 4).all() for _ in range(20))


def test_the_null_label_is_trained_only_with_label_dropout(tmp_path: Path) -> None:
    """The null row of the label embedding gets a gradient when p > 0 and exactly none at p = 0."""
    grads = {}
    for p in (0.0, 0.5):
        spec = _planned(tmp_path / str(p), seeds=1, dit__label_dropout=p)[0]
        testbed = make_testbed(spec, tmp_path / str(p) / "run")
        with torch.no_grad():  # open the zero-initialised gates and head, so gradients flow
            gen = torch.Generator().manual_seed(0)
            for param in testbed.model.parameters():
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
        for _ in range(3):
            testbed.train_loss(torch.device("cpu")).backward()
        weight = testbed.model.label_embed.weight
        grads[p] = weight.grad.abs().sum(dim=1)
    null = len(SHAPE_CLASSES)
    assert grads[0.0][null] == 0 and (grads[0.0][:null] > 0).all()
    assert grads[0.5][null] > 0 and grads[0.5][:null].sum() > 0


def test_an_unconditional_dit_drops_no_labels_and_samples_unguided(tmp_path: Path) -> None:
    spec = _planned(tmp_path, seeds=1, dit__class_conditional=False)[0]
    assert spec["dit"]["label_dropout"] == 0.0 and spec["dit"]["cfg_scale"] == 1.0
    testbed = make_testbed(spec, tmp_path / "run")
    assert testbed.null_class is None and testbed.model.label_embed is None
    assert testbed.batches.null_class is None and testbed.batches.label_dropout == 0.0
    assert testbed.finish(torch.device("cpu"))["sample_cfg_scale"] == 1.0


def test_flow_batches_refuse_bad_label_dropout() -> None:
    images, labels = np.zeros((8, 2, 3), dtype=np.float32), np.arange(8) % 4
    for kw, name in (
        ({"label_dropout": 1.0, "null_class": 4}, "label_dropout"),
        ({"label_dropout": -0.1, "null_class": 4}, "label_dropout"),
        ({"label_dropout": True, "null_class": 4}, "label_dropout"),
        ({"label_dropout": 0.1}, "null_class"),
        ({"label_dropout": 0.1, "null_class": -1}, "null_class"),
    ):
        with pytest.raises(ValueError, match=rf"^{name}:"):
            FlowBatches(images, labels, 4, seed=0, **kw)


def test_batches_visit_every_image_once_per_epoch() -> None:
    images = np.arange(12 * 2 * 3, dtype=np.float32).reshape(12, 2, 3)
    labels = np.arange(12)
    batches = FlowBatches(images, labels, 4, seed=0)
    seen = torch.cat([batches.next()[1] for _ in range(3)])
    assert sorted(seen.tolist()) == list(range(12))
    x1, label, x0, t = batches.next()
    assert torch.equal(x1, torch.from_numpy(images)[label])
    assert x0.shape == x1.shape and t.shape == (4,)
    again = validation_triples(images, labels, data_seed=3)
    for u, v in zip(again, validation_triples(images, labels, data_seed=3), strict=True):
        assert torch.equal(u, v)


def test_summary_fields_and_progress_line_follow_the_testbed(tmp_path: Path) -> None:
    spec = _planned(tmp_path, seeds=1)[0]
    fields = run_format.testbed_format(spec.get("testbed")).summary_fields
    assert "best_val_loss" in fields and not any("bpb" in f for f in fields)
    crashed = crashed_summary(spec, "RuntimeError: boom", "trace")
    assert not any("bpb" in k for k in crashed) and crashed["status"] == "crashed"
    assert outcome_line({"status": "finished", "final_val_loss": 0.25}, "dit") == (
        "[green]finished[/] val loss 0.2500"
    )
    gpt = {"status": "finished", "final_val_loss": 1.0, "final_val_bpb": 1.4427}
    assert outcome_line(gpt, "gpt") == "[green]finished[/] val bpb 1.443"


# ---- a tiny experiment end to end, and its resume -------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(config, out folder, command output) of a tiny finished ``compare --testbed dit``."""
    root = tmp_path_factory.mktemp("dit")
    config = root / "tiny.yaml"
    data = tiny()
    del data["testbed"]  # given as a flag
    config.write_text(yaml.safe_dump(data))
    out = root / "out"
    code, output = invoke(
        "--testbed", "dit", "--config", str(config), "--seeds", "2", "--steps", "4",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    return config, out, output


def test_end_to_end_writes_dit_metrics_analysis_and_report(
    finished: tuple[Path, Path, str],
) -> None:
    _, out, output = finished
    assert "4 finished" in output and "val loss" in output and "bpb" not in output
    assert "64 train / 16 val images of 8×8 pixels" in output
    experiment = json.loads((out / "experiment.json").read_text())
    assert experiment["testbed"] == "dit" and experiment["margin_val_loss"] == 0.002
    assert "margin_bpb" not in experiment and experiment["fixed"]["testbed"] == "dit"
    run = out / "runs" / "adarms-pre__s1"
    spec = json.loads((run / "run.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary) == list(run_format.testbed_format(spec.get("testbed")).summary_fields)
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert summary["tokens"] == 4 * 4 * 4  # steps × images × patches per image
    assert summary["best_val_loss"] <= summary["final_val_loss"] < 2.5
    assert summary["posttrain_errors"] is None, summary["posttrain_errors"]
    for field in ("ptq_int8wo_delta", "ptq_w8a8_delta", "bf16_eval_delta"):
        assert math.isfinite(summary[field]) and abs(summary[field]) < 0.5, (field, summary[field])
    assert summary["act_kurtosis_max"] > 0 and summary["act_max_over_rms"] > 1
    assert isinstance(summary["outlier_channels"], int)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["type"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2, 4] and "val_bpb" not in evals[0]
    assert evals[-1]["val_loss"] == summary["final_val_loss"]
    assert any(r["type"] == "layer_grad_norms" and "head" in r["norms"] for r in records)
    assert sum(r["type"] == "train" for r in records) == 4

    analysis = json.loads((out / "summary.json").read_text())
    assert analysis["testbed"] == "dit" and analysis["quality_metric"] == "final_val_loss"
    assert analysis["margin_val_loss"] == 0.002 and "margin_bpb" not in analysis
    quality = analysis["comparisons"]["adarms-pre"]["final_val_loss"]
    assert quality["n_pairs"] == 2 and quality["margin"] == 0.002
    assert analysis["metrics"]["final_val_loss"]["unit"] == "MSE"
    assert analysis["metrics"]["ptq_w8a8_delta"]["unit"] == "MSE"
    assert analysis["comparisons"]["adarms-pre"]["ptq_w8a8_delta"]["n_pairs"] == 2
    assert "MSE" in analysis["verdicts"]["adarms-pre"]["quality_text"]
    assert (out / "plots" / "val_loss.png").exists() and not (
        out / "plots" / "val_bpb.png"
    ).exists()
    report = (out / "report.md").read_text()
    assert report.startswith("# adaLN-Zero vs AdaRMS")
    assert "Δ final val loss" in report and "±0.002 MSE" in report
    assert "final validation loss (MSE)" in report
    assert "int8 W8A8 PTQ degradation (MSE)" in report
    files = text_files(out)
    assert {"report.md", "report.html", "runs.csv", "summary.json"} <= set(files)
    for name, text in files.items():
        assert not re.search(r"bpb|bits per byte|nats per byte", text, re.I), name


def test_resume_skips_the_finished_runs(finished: tuple[Path, Path, str], tmp_path: Path) -> None:
    config, out, _ = finished
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    summaries = {p: p.read_bytes() for p in copy.glob("runs/*/summary.json")}
    stamps = {p: p.stat().st_mtime_ns for p in summaries}
    base = ("--testbed", "dit", "--config", str(config), "--seeds", "2", "--out", str(copy))
    code, output = invoke(*base, "--steps", "4")
    assert code == 0, output
    assert "4 of 4 runs already done" in output and "bpb" not in output
    assert {p: p.read_bytes() for p in summaries} == summaries
    assert {p: p.stat().st_mtime_ns for p in summaries} == stamps
    # other settings than the finished runs': refused, naming the field
    code, output = invoke(*base, "--steps", "4", "--lr", "0.02")
    assert code == 1 and "train.lr" in output
    # the GPT testbed in a dit folder: refused before anything is touched
    before = (copy / "experiment.json").read_bytes()
    code, output = invoke("--out", str(copy), "--steps", "4", "--warmup", "1")
    assert code == 1 and "source" in output
    assert (copy / "experiment.json").read_bytes() == before
    # a killed run (no summary) is redone, the others are kept
    (copy / "runs" / "adarms-pre__s1" / "summary.json").unlink()
    code, output = invoke(*base, "--steps", "4")
    assert code == 0 and "3 of 4 runs already done" in output and "1 finished" not in output
    assert (
        json.loads((copy / "runs" / "adarms-pre__s1" / "summary.json").read_text())["status"]
        == "finished"
    )


# ---- analysis of a hand-written dit folder, and the GPT's labels --------------------------------


def _dit_folder(root: Path, deltas: list[float], margin: float | None = 0.002) -> Path:
    arms = ["adaln_zero-pre", "adarms-pre"]
    seeds = list(range(len(deltas)))
    exp: dict[str, Any] = {"testbed": "dit", "arms": arms, "baseline_arm": arms[0], "seeds": seeds}
    if margin is not None:
        exp["margin_val_loss"] = margin
    root.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps(exp))
    for seed, delta in enumerate(deltas):
        for arm, loss in ((arms[0], 0.25 + 0.01 * seed), (arms[1], 0.25 + 0.01 * seed + delta)):
            run = root / "runs" / f"{arm}__s{seed}"
            run.mkdir(parents=True)
            summary = {
                "run_id": run.name, "arm": arm, "seed": seed, "norm": arm.split("-")[0],
                "placement": "pre", "status": "finished", "steps": 10,
                "final_val_loss": loss, "best_val_loss": loss, "final_train_loss": loss,
                "tokens_per_s": 1000.0 + seed, "peak_memory_bytes": 2**20,
                "n_loss_spikes": 0, "n_grad_spikes": 0,
            }  # fmt: skip
            (run / "summary.json").write_text(json.dumps(summary))
    return root


def test_dit_analysis_uses_the_loss_and_its_margin(tmp_path: Path) -> None:
    worse = analyze(load_compare_folder(_dit_folder(tmp_path / "worse", [0.010, 0.011, 0.009])))
    v = worse["verdicts"]["adarms-pre"]
    assert v["quality"] == "worse" and v["reason"] == "adarms-pre gives worse validation loss"
    assert "Final validation loss is higher (worse): difference +0.0100 MSE" in v["quality_text"]
    assert worse["recommendation"]["choice"] == "adaln_zero-pre"
    same = analyze(load_compare_folder(_dit_folder(tmp_path / "same", [1e-4, -1e-4, 2e-4])))
    q = same["verdicts"]["adarms-pre"]["quality_text"]
    assert same["verdicts"]["adarms-pre"]["quality"] == "equivalent"
    assert "equivalent within ±0.002 MSE" in q
    # a 0.001 difference is inside the default margin, outside a tighter one
    default = load_compare_folder(_dit_folder(tmp_path / "default", [1e-3, 1.1e-3, 0.9e-3], None))
    assert default.margin == MARGIN_KEYS["dit"][1] and default.testbed == "dit"
    assert analyze(default)["verdicts"]["adarms-pre"]["quality"] == "equivalent"
    tight = load_compare_folder(_dit_folder(tmp_path / "tight", [1e-3, 1.1e-3, 0.9e-3], 2e-4))
    assert analyze(tight)["verdicts"]["adarms-pre"]["quality"] == "worse"


def test_gpt_outputs_keep_their_bpb_labels(tmp_path: Path) -> None:
    assert run_format.testbed_format(None) is run_format.testbed_format("gpt")
    folder = tmp_path / "fixture"
    shutil.copytree(FIXTURE, folder)
    build_report(folder)
    analysis = json.loads((folder / "summary.json").read_text())
    assert analysis["testbed"] == "gpt" and analysis["quality_metric"] == "final_val_bpb"
    assert analysis["margin_bpb"] == 0.02 and "margin_val_loss" not in analysis
    assert list(analysis["metrics"])[:3] == ["final_val_bpb", "best_val_bpb", "final_train_loss"]
    text = analysis["verdicts"]["rmsnorm-pre"]["quality_text"]
    assert text.startswith("Final validation bpb") and " bpb (rmsnorm-pre − layernorm-pre" in text
    report = (folder / "report.md").read_text()
    assert "Δ final val bpb [95% CI]" in report and "equivalence margin ±0.02 bpb" in report
    assert "against the margin ±0.02 bits per byte;" in report
    assert "| final validation bpb (bits per byte) |" in report
    assert "final training loss (nats per byte)" in report and "MSE" not in report
    assert (folder / "plots" / "val_bpb.png").exists()
    assert not (folder / "plots" / "val_loss.png").exists()
    header = (folder / "runs.csv").read_text().splitlines()[0].split(",")
    # after the 13 head fields (identity with the precision, status, progress, counts, tokens
    # per parameter)
    assert header[12] == "tokens_per_param"
    assert header[13:16] == ["final_val_loss", "final_val_bpb", "best_val_bpb"]
