"""``normlab compare`` on the user's own model, data and tokenizer (the ``lm`` testbed):
transformers Llama, Qwen3 and GPT-2 sources and a factory train end to end with a report, a BPE
run reports bits per byte computed from the token losses and byte counts, resume and the config
guard, and every bad input gives a one-line error naming its option with nothing written.

The transformers sources and the BPE run train in workers that are threads of this process
(:mod:`in_process`: a worker process would import torch and transformers for each run), with
their reports' figures drawn but not rendered (:mod:`report_figures`); the factory source
keeps real worker processes, which import its module by name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.cli import app
from normlab.data import load_tokens, window_bytes
from normlab.data.batches import validation_windows
from normlab.experiment.config import ConfigError, validate_config
from normlab.experiment.testbeds.lm import LMTestbed, lm_source
from normlab.run_format import testbed_format as format_of
from report_figures import skip_rendering

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LLAMA = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,num_key_value_heads=2,"
    "intermediate_size=64,max_position_embeddings=64"
)
QWEN3 = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,num_key_value_heads=1,"
    "intermediate_size=64,head_dim=16,max_position_embeddings=64"
)
GPT2 = "n_embd=32,n_layer=1,n_head=2,n_positions=64"
TINY = [
    "--steps", "3", "--batch-size", "2", "--warmup", "1", "--seeds", "1", "--threads", "1",
    "--device", "cpu",
]  # fmt: skip
TEXT = "".join(
    f"def f{i}(x):\n    # héllo wörld ✓ {'é' * (i % 4)}\n    return x * {i} + {i * i}\n"
    for i in range(400)
)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args], env={"COLUMNS": "1000"})
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "code.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("records") / "docs.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(60):
            body = "".join(TEXT.splitlines(keepends=True)[i * 20 : (i + 1) * 20])
            f.write(json.dumps({"id": i, "body": body}) + "\n")
    return path


def tiny_config(path: Path, **extra: Any) -> Path:
    """A YAML config of a tiny lm run: 16-token windows, 4 validation windows."""
    cfg = {"lm": {"context": 16}, "train": {"eval_interval": 3, "eval_windows": 4}, **extra}
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# ---- configuration ------------------------------------------------------------------------


def test_config_selects_the_lm_testbed_and_guards_its_options() -> None:
    lm = {"model": "hf:llama", "model_set": "hidden_size=32,rope_theta=1e4"}
    cfg = validate_config({"lm": lm})
    assert cfg.testbed == "lm" and cfg.placements == ["pre"]
    assert cfg.lm.model_set == {"hidden_size": 32, "rope_theta": 10000.0}
    assert cfg.train.target_val_loss is None and cfg.margin() == cfg.margin_bpb
    assert cfg.tokens_per_sample() == cfg.lm.context == 128
    dumped = cfg.dump()
    assert "model" not in dumped and "dit" not in dumped and "bpe_merges" in dumped["data"]
    gpt = validate_config({}).dump()
    assert "lm" not in gpt and set(gpt["data"]) == {"path", "max_bytes", "val_fraction"}
    for data, named in [
        ({"data": {"tokenizer": "tok.json"}}, "data.tokenizer: an option of the lm testbed"),
        ({"testbed": "gpt", "lm": {"model": "hf:llama"}}, "lm.model: an option of the lm"),
        ({"testbed": "dit", "data": {"bpe_merges": 10}}, "data.bpe_merges: an option of the lm"),
        ({"lm": {}, "placements": ["pre", "post"]}, "placements: the lm testbed keeps"),
        ({"lm": {}, "norms": ["adarms", "rmsnorm"]}, "norms: "),
        ({"lm": {"model_set": "hidden_size"}}, "--model-set: expected key=value pairs"),
        ({"lm": {}, "data": {"tokenizer": "t.json", "bpe_merges": 8}}, "tokenizer or bpe_merges"),
        ({"testbed": "vit"}, "testbed: expected one of gpt, dit, lm"),
        ({"testbed": "lm"}, "lm.model: the lm testbed trains your model; expected a source"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate_config(data)
        assert named in str(err.value)


# ---- end to end ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "settings", "original"),
    [
        ("llama", LLAMA, "LlamaRMSNorm"),
        ("qwen3", QWEN3, "Qwen3RMSNorm"),
        ("gpt2", GPT2, "LayerNorm"),
    ],
)
def test_hf_sources_train_end_to_end_with_a_report(
    tmp_path: Path,
    corpus: Path,
    model_type: str,
    settings: str,
    original: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    out = tmp_path / "out"
    code, output = invoke(
        "--config", str(tiny_config(tmp_path / "c.yaml")), "--model", f"hf:{model_type}",
        "--model-set", settings, "--data", str(corpus), "--norms", "rmsnorm,layernorm",
        "--out", str(out), *TINY,
    )  # fmt: skip
    assert code == 0, output
    experiment = read(out / "experiment.json")
    assert experiment["testbed"] == "lm" and experiment["arms"] == ["rmsnorm-pre", "layernorm-pre"]
    swaps = experiment["norm_swaps"]
    for arm, kind in (("rmsnorm-pre", "rmsnorm"), ("layernorm-pre", "layernorm")):
        run = read(out / "runs" / f"{arm}__s0" / "run.json")
        summary = read(out / "runs" / f"{arm}__s0" / "summary.json")
        assert summary["status"] == "finished", summary.get("error")
        assert run["lm"]["model"] == f"hf:{model_type}" and run["data"]["vocab_size"] == 256
        record = summary["norm_swap"]
        assert record == run["norm_swap"] == swaps[arm] and record["kind"] == kind
        assert record["swapped"]
        assert all(s["original"].endswith(original) for s in record["swapped"])
        assert all(s["kind"] == kind for s in record["swapped"])
        assert math.isfinite(summary["final_val_bpb"]) and math.isfinite(summary["final_val_loss"])
        # bytes: one token is one byte, so bpb is the loss in bits
        assert summary["final_val_bpb"] == pytest.approx(summary["final_val_loss"] / math.log(2))
    n_slots = {"llama": 3, "qwen3": 5, "gpt2": 3}[model_type]  # 2 per block (+2 qk), final
    assert len([p for s in swaps["rmsnorm-pre"]["swapped"] for p in s["paths"]]) == n_slots
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Arm rmsnorm-pre (hf:" in report and "norm modules swapped for rmsnorm" in report


def test_factory_source_lists_swapped_and_held_norms(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    code, output = invoke(
        "--config", str(tiny_config(tmp_path / "c.yaml")),
        "--model", "test_model_sources:tiny_lm_own_final_norm", "--data", str(corpus),
        "--norms", "rmsnorm,dyt", "--out", str(out), *TINY,
    )  # fmt: skip
    assert code == 0, output
    summary = read(out / "runs" / "dyt-pre__s0" / "summary.json")
    assert summary["status"] == "finished", summary.get("error")
    record = summary["norm_swap"]
    assert [s["paths"] for s in record["swapped"]] == [["blocks.0.norm"]]
    assert [h["paths"] for h in record["held"]] == [["final"]]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "1 held fixed, the same in every arm" in report and "final" in report


def test_bpe_run_reports_bits_per_byte_and_resumes(
    tmp_path: Path, records: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    out = tmp_path / "out"
    config = tiny_config(tmp_path / "c.yaml", data={"bpe_merges": 40, "text_field": "body"})
    args = [
        "--config", str(config), "--model", "hf:llama", "--model-set", LLAMA,
        "--data", str(records), "--out", str(out), *TINY,
    ]  # fmt: skip
    code, output = invoke(*args)
    assert code == 0, output
    bpe = sorted((out / "data").glob("bpe-*/tokenizer.json"))
    assert len(bpe) == 1
    data = load_tokens(out / "data")
    assert data.vocab_size == 256 + 40 and data.val_bytes is not None
    run_dir = out / "runs" / "layernorm-pre__s0"
    spec, summary = read(run_dir / "run.json"), read(run_dir / "summary.json")
    assert spec["data"]["tokenizer"] == str(bpe[0]) and spec["data"]["tokenizer_hash"]
    # bpb recomputed by hand from the step-0 model (the paired init, rebuilt from run.json):
    # Σ token nats / ln 2 / UTF-8 bytes those tokens cover, against the run's eval record
    evals = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if json.loads(line)["type"] == "eval"
    ]
    model = LMTestbed.build_model(spec, spec["seed"]).eval()
    windows = validation_windows(data.val, 16, 4)
    covered = window_bytes(data.val_bytes, data.val.shape[0], 16, 4)
    assert int(covered.sum()) > windows[:, 1:].numel()  # merges cover more than a byte
    with torch.no_grad():
        logits = model(windows[:, :-1])
    nats = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), windows[:, 1:].reshape(-1), reduction="sum"
    ).item()
    assert evals[0]["step"] == 0
    assert evals[0]["val_loss"] == pytest.approx(nats / windows[:, 1:].numel(), rel=1e-5)
    assert evals[0]["val_bpb"] == pytest.approx(nats / math.log(2) / int(covered.sum()), rel=1e-5)
    assert evals[0]["val_bpb"] < evals[0]["val_loss"] / math.log(2)  # > 1 byte per token
    assert summary["final_val_bpb"] == evals[-1]["val_bpb"]
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    # resume: the same command skips both runs and trains no BPE again
    import normlab.data.bpe as bpe_mod

    def no_training(*_: object, **__: object) -> None:
        raise AssertionError("the cached BPE was trained again")

    monkeypatch.setattr(bpe_mod, "train_bpe", no_training)
    code, output = invoke(*args)
    assert code == 0, output
    assert "2 of 2 runs already done" in output
    # the guard: other model settings on the same folder are refused, nothing changed
    before = (out / "experiment.json").read_bytes()
    code, output = invoke(*args[:5], LLAMA.replace("intermediate_size=64", "intermediate_size=96"),
                          *args[6:])  # fmt: skip
    assert code == 1 and "intermediate_size" in output and "already holds" in output
    assert (out / "experiment.json").read_bytes() == before


def test_a_tokenizer_file_is_recorded_and_guarded(tmp_path: Path, corpus: Path) -> None:
    """--tokenizer: the run configs record the tokenizer's path, content hash and vocabulary;
    a finished run trained with another tokenizer's content refuses the rerun, naming it."""
    from rich.console import Console

    from normlab.data import corpus_bpe, load_tokenizer
    from normlab.experiment.execution.grid import plan_runs
    from normlab.experiment.execution.run_loop import finished_runs

    def planned(tokenizer: Path, data: str = "data") -> list[dict[str, Any]]:
        cfg = validate_config(
            {
                "lm": {"model": "hf:llama", "model_set": LLAMA, "context": 16},
                "data": {"path": str(corpus), "tokenizer": str(tokenizer)},
                "seeds": 1,
            }
        )
        LMTestbed.check_inputs(cfg)
        data_dir = tmp_path / data
        info = LMTestbed.prepare_data(cfg, data_dir, Console(quiet=True))
        return plan_runs(cfg, "cpu", 1, info)

    common = {"max_bytes": 1 << 20, "val_fraction": 0.05}
    small = corpus_bpe(corpus, 20, tmp_path / "a", **common)
    runs = planned(small)
    tok = load_tokenizer(small)
    assert {r["data"]["tokenizer_hash"] for r in runs} == {tok.content_hash}
    assert {r["data"]["vocab_size"] for r in runs} == {tok.vocab_size} and tok.vocab_size > 256
    # a finished run on disk made with this tokenizer; the same path with other content refuses
    out = tmp_path / "out"
    for run in runs:
        run_dir = out / "runs" / run["run_id"]
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished"}), encoding="utf-8")
    other = corpus_bpe(corpus, 30, tmp_path / "b", **common)
    small.write_bytes(other.read_bytes())  # the same path, other merges
    with pytest.raises(ValueError, match=r"cache .* was built with tokenizer_hash='sha256:"):
        planned(small)  # the folder's token cache refuses first
    again = planned(small, "data2")
    assert {r["data"]["tokenizer_hash"] for r in again} == {load_tokenizer(other).content_hash}
    with pytest.raises(ValueError, match=r"already holds the finished run .* data\.fingerprint"):
        finished_runs(again, out)  # the cache's fingerprint covers the tokenizer's content


# ---- bad input ----------------------------------------------------------------------------


def _bad_inputs(tmp: Path, corpus: Path) -> list[tuple[list[str], int, str]]:
    no_config = tmp / "empty_model"
    no_config.mkdir()
    (tmp / "r.jsonl").write_text(json.dumps({"body": TEXT}) + "\n", encoding="utf-8")
    (tmp / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    np.arange(5000, dtype=np.uint16).tofile(tmp / "lone.bin")
    llama = ["--model", "hf:llama", "--model-set", LLAMA]
    return [
        (["--model", "hf:lama", "--data", str(corpus)], 2, "--model: unknown model_type 'lama'"),
        (["--model", f"hf:{no_config}", "--data", str(corpus)], 1, "has no config.json"),
        (
            ["--model", "test_model_sources:no_make_norm", "--data", str(corpus)],
            2,  # names no model factory: usage
            "--model: test_model_sources:no_make_norm takes vocab_size but no make_norm",
        ),
        (
            ["--model", "test_model_sources:wrong_vocab", "--data", str(corpus)],
            1,
            "--model: test_model_sources:wrong_vocab returned",
        ),
        ([*llama, "--tokenizer", str(tmp / "nope.json"), "--data", str(corpus)], 1, "tokenizer: "),
        ([*llama, "--data", str(tmp / "r.jsonl")], 1, "'text'"),
        ([*llama, "--data", str(tmp / "broken.parquet")], 1, "not a readable Parquet"),
        ([*llama, "--data", str(tmp / "lone.bin")], 1, "no sidecar"),
        ([*llama, "--model-set", "hidden_size"], 2, "--model-set: expected key=value pairs"),
        ([*llama, "--bpe-merges", "0"], 2, "data.bpe_merges"),
    ]


HUGE = (
    "hidden_size=65536,num_hidden_layers=96,num_attention_heads=64,num_key_value_heads=64,"
    "intermediate_size=262144,max_position_embeddings=64"
)
"""A Llama of 6.6e12 parameters: about 100 TiB to train, on no machine."""


def _with(**changes: object) -> str:
    """:data:`LLAMA` with some keys changed (or added)."""
    pairs = dict(p.split("=") for p in LLAMA.split(","))
    return ",".join(f"{k}={v}" for k, v in {**pairs, **changes}.items())


BAD_SETTINGS = [
    (_with(hidden_size="abc"), "--model-set: hidden_size='abc': expected an integer"),
    (_with(hidden_size=32.5), "--model-set: hidden_size=32.5: expected an integer"),
    (_with(num_hidden_layers="true"), "--model-set: num_hidden_layers=True: expected an integer"),
    (_with(rms_norm_eps="tiny"), "--model-set: rms_norm_eps='tiny': expected a number"),
    (_with(hidden_size=-32), "--model-set: hidden_size=-32: expected an integer >= 1"),
    (_with(hidden_size=-3), "--model-set: hidden_size=-3: expected an integer >= 1"),
    (_with(intermediate_size=0), "--model-set: intermediate_size=0: expected an integer >= 1"),
    (_with(hidden_size=33), "is not a multiple of the number of attention heads (2)"),
    (_with(hidden_size=30), "RoPE requires an even rotary dimension"),
    (_with(num_key_value_heads=3, num_attention_heads=4), "not a multiple of num_key_value"),
    (_with(hidden_sise=32), "--model-set: the llama config has no 'hidden_sise'"),
    (_with(hidden_act="nope"), "--model-set: the hf:llama model cannot be built from them"),
    ("n_embd=30,n_layer=1,n_head=4", "--model-set: n_embd=30 is not a multiple of n_head=4"),
    ("n_embd=0,n_layer=1,n_head=4", "--model-set: n_embd=0: expected an integer >= 1"),
]
"""(--model-set, the start of the error): values the config or the model cannot take."""


def test_bad_model_settings_are_usage_errors_and_write_nothing(
    tmp_path: Path, corpus: Path
) -> None:
    """Every --model-set value the model cannot take (wrong type, unknown key, a size below 1,
    heads that do not divide the width, an unknown activation) ends in one line naming the key,
    exit status 2, before --out is created."""
    config = str(tiny_config(tmp_path / "c.yaml"))
    for i, (settings, named) in enumerate(BAD_SETTINGS):
        out = tmp_path / f"out{i}"
        source = "hf:gpt2" if settings.startswith("n_embd") else "hf:llama"
        code, output = invoke(
            "--config", config, "--model", source, "--model-set", settings,
            "--data", str(corpus), "--out", str(out), *TINY,
        )  # fmt: skip
        assert code == 2, (settings, output)
        error = [line for line in output.splitlines() if "error" in line]
        assert len(error) == 1 and named in error[0], (settings, output)
        assert "Traceback" not in output and not out.exists(), (settings, output)


def test_a_model_too_large_for_the_memory_is_refused_before_anything_is_written(
    tmp_path: Path, corpus: Path
) -> None:
    """--model with sizes no machine holds: refused from the config's estimate (parameters,
    Adam's state, activations), exit status 1, --out not created, no model built."""
    config = str(tiny_config(tmp_path / "c.yaml"))
    out = tmp_path / "new" / "out"
    code, output = invoke(
        "--config", config, "--model", "hf:llama", "--model-set", HUGE, "--data", str(corpus),
        "--out", str(out), *TINY,
    )  # fmt: skip
    assert code == 1, output
    error = [line for line in output.splitlines() if "error" in line]
    assert len(error) == 1 and "--model hf:llama --model-set " in error[0], output
    assert "needs about" in error[0] and "TiB to train" in error[0], output
    assert not (tmp_path / "new").exists()


def test_bad_inputs_give_one_line_errors_and_write_nothing(tmp_path: Path, corpus: Path) -> None:
    config = str(tiny_config(tmp_path / "c.yaml"))
    for i, (args, exit_code, named) in enumerate(_bad_inputs(tmp_path, corpus)):
        out = tmp_path / f"out{i}"
        code, output = invoke("--config", config, *args, "--out", str(out), *TINY)
        assert code == exit_code, (args, output)
        assert named in output, (args, output)
        error = [line for line in output.splitlines() if "error" in line]
        assert len(error) == 1 and "Traceback" not in output, output
        assert not out.exists(), (args, sorted(out.rglob("*")))


def test_audit_model_of_an_hf_source() -> None:
    settings = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"
    result = CliRunner().invoke(
        app,
        ["audit", "model", "hf:llama", "--model-set", settings, "--json"],
        env={"COLUMNS": "1000"},
    )
    assert result.exit_code == 0, result.output
    audit = json.loads(result.output[result.output.index("{") :])
    names = [n["name"] for n in audit["norms"]]
    assert len(names) == 5 and all("layernorm" in n or n.endswith(".norm") for n in names)
    assert {n["cls"] for n in audit["norms"]} == {"LlamaRMSNorm"}
    swapped = CliRunner().invoke(
        app, ["audit", "model", "hf:llama", "--model-set", settings, "--norm", "dyt", "--json"]
    )
    assert swapped.exit_code == 0, swapped.output
    assert "LlamaRMSNorm" not in swapped.output
    bad = CliRunner().invoke(
        app,
        ["audit", "model", "hf:llama", "--model-set", "hidden_sise=32"],
        env={"COLUMNS": "1000"},
    )
    assert bad.exit_code == 2 and "--model-set" in bad.output and "hidden_sise" in bad.output


def test_hf_llama_example_is_valid() -> None:
    from normlab.experiment.config import load_config_file

    path = Path(__file__).resolve().parents[2] / "examples" / "hf_llama.yaml"
    cfg = validate_config(load_config_file(path))
    assert cfg.testbed == "lm" and cfg.precisions == ["fp32", "bf16"]
    arms = [f"{n}-pre-{p}" for p in ("fp32", "bf16") for n in ("rmsnorm", "layernorm")]
    assert cfg.arm_names() == arms
    assert cfg.lm.model_set["hidden_size"] == 128 and cfg.lm.model_set["num_hidden_layers"] == 2
    assert cfg.data.bpe_merges is not None and cfg.seed_list() == [0, 1, 2]
    LMTestbed.check_inputs(cfg)  # the LlamaConfig builds
    source = lm_source(cfg.lm.model_dump(mode="json"), 256 + cfg.data.bpe_merges)
    assert source.config.intermediate_size == 344 and source.config.num_attention_heads == 4


def test_lm_format_and_source_cache() -> None:
    lm = format_of("lm")
    assert lm.quality == "final_val_bpb" and "norm_swap" in lm.summary_fields
    assert lm.metric("final_train_loss").margin_factor is None  # nats per token: no margin
    first = lm_source({"model": "hf:llama", "model_set": {"hidden_size": 32}}, 300)
    assert lm_source({"model": "hf:llama", "model_set": {"hidden_size": 32}}, 300) is first
    assert first.config.vocab_size == 300
