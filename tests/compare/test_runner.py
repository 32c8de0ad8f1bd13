"""The runner: runs in worker processes, divergence as a result, crashes recorded, resume, lock."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import normlab.functional as NF
from normlab._io import read_jsonl, write_json_atomic
from normlab._resources import peak_rss_bytes
from normlab.data import prepare_tokens
from normlab.experiment.config import validate_config
from normlab.experiment.execution.executors import WORKER_ENV, worker_environment
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.execution.lock import FolderLockedError, OutputLock
from normlab.experiment.execution.run_loop import is_done
from normlab.experiment.execution.runner import train_grid
from normlab.experiment.execution.worker import execute_run
from normlab.experiment.measure.activations import SavedActivationBytes
from normlab.experiment.measure.posttrain import POSTTRAIN_FIELDS
from normlab.experiment.testbeds import gpt as gpt_testbed
from normlab.experiment.testbeds.gpt import warm_up_gpt
from normlab.experiment.training import train as train_module
from normlab.models import GPTConfig, build_gpt

FAULTY_NORMS = '''
"""Norms that fail on purpose, registered for the runner tests (imported by every worker)."""
import os
import subprocess

import torch
from torch import nn

import normlab


class ExplodingNorm(nn.Module):
    def __init__(self, dim, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        raise RuntimeError("exploding norm: injected failure")


class VanishingNorm(nn.Module):
    def __init__(self, dim, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        os._exit(3)


class NanAfterThree(nn.Module):
    """Identity for three training forwards, then NaN: the run diverges at step 4."""

    def __init__(self, dim, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        y = x * self.weight
        return y * float("nan") if self.calls > 3 else y


for kind, factory in [
    ("exploding", ExplodingNorm),
    ("vanishing", VanishingNorm),
    ("nan_after_three", NanAfterThree),
]:
    if kind not in normlab.available_norms():
        normlab.register_norm(kind, factory)
'''

MODULE = "normlab_test_faulty_norms"
POSTTRAIN_DELTAS = ("ptq_int8wo_delta", "ptq_w8a8_delta", "bf16_eval_delta")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small folder of text files, plus the faulty-norms module on sys.path (workers inherit
    the parent's sys.path)."""
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    helpers = tmp_path_factory.mktemp("helpers")
    (helpers / f"{MODULE}.py").write_text(FAULTY_NORMS)
    sys.path.insert(0, str(helpers))
    return root


def tiny_config(corpus: Path, **top: Any) -> dict[str, Any]:
    return {
        "seeds": 1,
        "threads": 1,
        "imports": [MODULE],
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
        "train": {
            "steps": 6,
            "batch_size": 2,
            "warmup": 2,
            "eval_interval": 3,
            "eval_windows": 4,
            "layer_grad_interval": 2,
            "throughput_warmup": 1,
        },
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus)},
        **top,
    }


def file_states(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_divergence_is_recorded_as_a_result(corpus: Path, tmp_path: Path) -> None:
    # a compare needs two arms; only the faulty one is run here
    cfg = validate_config(tiny_config(corpus, norms=["nan_after_three", "layernorm"]))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    spec = next(s for s in plan_runs(cfg, "cpu", 1, info) if s["norm"] == "nan_after_three")
    run_dir = tmp_path / "runs" / spec["run_id"]
    write_json_atomic(run_dir / "run.json", spec)
    summary = execute_run(run_dir)
    assert summary["status"] == "diverged" and summary["diverged_at"] == 4
    assert summary["steps"] == 4 and summary["final_val_bpb"] is None
    assert summary["best_val_bpb"] is not None  # the evaluation before divergence
    assert all(summary[f] is None for f in POSTTRAIN_FIELDS)  # only a finished run has them
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "diverged"
    records = read_jsonl(run_dir / "metrics.jsonl")
    anomalies = [r for r in records if r["type"] == "anomaly"]
    assert anomalies == [
        {"type": "anomaly", "step": 4, "kind": "nonfinite_loss", "value": None, "z": None}
    ]
    assert is_done(summary)


def test_grid_in_workers_then_resume_retrains_nothing_finished(
    corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cfg = validate_config(tiny_config(corpus))
    seen = []

    def after(folder: Path, done: dict[str, Any]) -> None:
        with pytest.raises(FolderLockedError):  # the caller's step runs while out is locked
            OutputLock(folder).acquire()
        seen.append((folder, dict(done)))

    summaries = train_grid(cfg, out, show_progress=False, after_training=after)
    assert seen == [(out, summaries)]
    assert [s["status"] for s in summaries.values()] == ["finished", "finished"]
    ln, rms = out / "runs" / "layernorm-pre__s0", out / "runs" / "rmsnorm-pre__s0"
    summary = json.loads((ln / "summary.json").read_text())
    assert summary["peak_memory_kind"] == "max_rss" and summary["peak_memory_bytes"] > 0
    assert summary["threads"] == 1 and summary["tokens"] == 6 * 2 * 16
    # The arms differ in what their norms save for backward, and in nothing else: 3 norm calls
    # (attention, MLP, final) on 2 · 16 rows of width 16, as the functional norms save them.
    rms_summary = json.loads((rms / "summary.json").read_text())
    rows = torch.randn(2 * 16, 16, requires_grad=True)
    weight, bias = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    with SavedActivationBytes([weight, bias]) as ln_norm:
        NF.layer_norm(rows, weight, bias)
    with SavedActivationBytes([weight]) as rms_norm:
        NF.rms_norm(rows, weight)
    assert summary["saved_activation_bytes"] - rms_summary["saved_activation_bytes"] == 3 * (
        ln_norm.bytes - rms_norm.bytes
    )
    assert summary["final_val_bpb"] == pytest.approx(summary["final_val_loss"] / 0.6931471805599453)
    for s in (summary, rms_summary):  # post-training effects, measured on the trained model
        assert s["posttrain_errors"] is None, s["posttrain_errors"]
        for field in POSTTRAIN_DELTAS:
            assert math.isfinite(s[field]) and abs(s[field]) < 0.5, (field, s[field])
        assert s["act_kurtosis_max"] > 0 and s["act_max_over_rms"] > 1
        assert isinstance(s["outlier_channels"], int) and s["outlier_channels"] >= 0
    records = read_jsonl(ln / "metrics.jsonl")
    kinds = [r["type"] for r in records]
    assert kinds.count("train") == 6 and kinds.count("eval") == 3  # steps 0, 3, 6
    assert kinds.count("layer_grad_norms") == 3
    train = next(r for r in records if r["type"] == "train")
    assert set(train) == {
        "type", "step", "loss", "grad_norm", "clipped", "lr", "step_time_s", "tokens_seen"
    }  # fmt: skip
    experiment = json.loads((out / "experiment.json").read_text())
    assert experiment["arms"] == ["layernorm-pre", "rmsnorm-pre"]
    assert experiment["baseline_arm"] == "layernorm-pre" and experiment["seeds"] == [0]
    assert experiment["varied"] == {"norm": ["layernorm", "rmsnorm"]}
    assert experiment["fixed"]["placement"] == "pre"
    assert experiment["fixed"]["train.lr"] == cfg.train.lr
    assert experiment["data"]["fingerprint"] == summary["data_fingerprint"]

    # Simulate a grid killed while training rmsnorm: no summary, a torn last metrics line.
    before = file_states(ln)
    (rms / "summary.json").unlink()
    with open(rms / "metrics.jsonl", "a") as f:
        f.write('{"type": "train", "st')
    again = train_grid(cfg, out, show_progress=False)
    assert file_states(ln) == before  # the finished run was not touched
    assert again["rmsnorm-pre__s0"]["status"] == "finished"
    redone = read_jsonl(rms / "metrics.jsonl")
    assert [r["type"] for r in redone].count("train") == 6  # redone from scratch, not appended
    assert '"st' not in (rms / "metrics.jsonl").read_text().splitlines()[-1][-5:]

    # A re-run with other settings must not mix with the finished runs.
    changed = validate_config(
        tiny_config(corpus, train={**tiny_config(corpus)["train"], "lr": 0.1})
    )
    with pytest.raises(ValueError, match=r"train\.lr"):
        train_grid(changed, out, show_progress=False)


def test_a_crash_is_recorded_and_the_grid_goes_on(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = validate_config(tiny_config(corpus, norms=["exploding", "vanishing", "rmsnorm"]))
    summaries = train_grid(cfg, out, show_progress=False)
    exploding = summaries["exploding-pre__s0"]
    assert exploding["status"] == "crashed"
    assert "injected failure" in exploding["error"]
    assert "Traceback" in exploding["traceback"] and "forward" in exploding["traceback"]
    vanishing = summaries["vanishing-pre__s0"]
    assert vanishing["status"] == "crashed" and "code 3" in vanishing["error"]
    assert summaries["rmsnorm-pre__s0"]["status"] == "finished"
    on_disk = json.loads((out / "runs" / "exploding-pre__s0" / "summary.json").read_text())
    assert on_disk["status"] == "crashed"
    assert not is_done(on_disk)  # a crashed run is redone by the next command


def test_the_lock_stops_a_second_command(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = validate_config(tiny_config(corpus))
    with OutputLock(out), pytest.raises(FolderLockedError, match="another normlab command"):
        train_grid(cfg, out, show_progress=False)
    assert not (out / "experiment.json").exists()
    with OutputLock(out), pytest.raises(FolderLockedError):  # released: can be taken again
        OutputLock(out).acquire()


def test_the_lock_is_held_across_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from normlab.experiment.execution.lock import OutputLock\n"
            "lock = OutputLock(sys.argv[1]).acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match="another normlab command") as err:
            OutputLock(out).acquire()
        assert str(out / ".lock") in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    with OutputLock(out) as lock:  # the lock went with its process; the file stays
        assert lock.held
    assert not lock.held and (out / ".lock").is_file()


def test_workers_get_the_allocator_settings() -> None:
    saved = {k: os.environ.get(k) for k in WORKER_ENV}
    with worker_environment(threads=3):
        for key, value in WORKER_ENV.items():
            assert os.environ[key] == value
        assert os.environ["OMP_NUM_THREADS"] == "3"
    assert {k: os.environ.get(k) for k in WORKER_ENV} == saved
    assert WORKER_ENV == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


def test_killing_the_command_loses_no_finished_run(corpus: Path, tmp_path: Path) -> None:
    """SIGKILL the command while its second run trains: the orphaned worker stops by itself,
    the lock is free, and a re-run keeps the first run and redoes the second."""
    import signal
    import subprocess
    import time

    config = tiny_config(corpus)
    config["train"] = {**config["train"], "steps": 1500, "eval_interval": 500}
    (tmp_path / "exp.yaml").write_text(json.dumps(config))  # JSON is YAML
    out = tmp_path / "out"
    command = [
        sys.executable, "-c", "from normlab.cli import main; main()",
        "compare", "--config", str(tmp_path / "exp.yaml"), "--out", str(out), "--no-report",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, second = out / "runs" / "layernorm-pre__s0", out / "runs" / "rmsnorm-pre__s0"
    try:
        deadline = time.monotonic() + 240
        while not (first / "summary.json").exists() or not (second / "metrics.jsonl").exists():
            assert proc.poll() is None, "the command ended before it could be killed"
            assert time.monotonic() < deadline, "the first run did not finish in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the orphaned worker notices within a step and stops without a summary
    size, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 3:
        now = (second / "metrics.jsonl").stat().st_size
        if now != size:
            size, stable_since = now, time.monotonic()
        time.sleep(0.2)
    assert not (second / "summary.json").exists()
    before = file_states(first)
    cfg = validate_config(config)
    summaries = train_grid(cfg, out, show_progress=False)
    assert file_states(first) == before
    assert summaries["rmsnorm-pre__s0"]["status"] == "finished"
    assert summaries["rmsnorm-pre__s0"]["steps"] == 1500


# ----------------------------------------------------------------------------------------------
# Training loop: warm-up shape, evaluation device, own peak memory, step-time synchronisation
# ----------------------------------------------------------------------------------------------
MiB = 2**20


linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="the kernel's ru_maxrss and /proc semantics are Linux's"
)


@pytest.fixture(scope="module")
def corpus_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    return root


def tiny_config_train(corpus_train: Path, **top: Any) -> dict[str, Any]:
    return {
        "seeds": 1,
        "threads": 1,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
        "train": {"steps": 4, "batch_size": 2, "warmup": 1, "eval_interval": 2, "eval_windows": 4},
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus_train)},
        **top,
    }


def test_warm_up_runs_the_training_shape_and_leaves_no_gradient() -> None:
    """Kernels specialise on the number of rows (the Triton norms' rows per program), so the
    warm-up must run [batch_size, context], or step 1 pays for compiling the training shape."""
    model = build_gpt(GPTConfig(d_model=16, n_layers=1, n_heads=2, context=8), seed=0)
    shapes: list[tuple[int, ...]] = []
    model.blocks[0].norm_attn.register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    model.train()
    warm_up_gpt(model, torch.device("cpu"), batch_size=3)
    assert shapes == [(3, 8, 16)]
    assert all(p.grad is None for p in model.parameters())
    assert model.training


def test_evaluation_runs_on_the_run_device_with_its_index(
    corpus_train: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cuda:1`` must not become ``cuda`` (the current device) for the validation windows."""
    cfg = validate_config(tiny_config_train(corpus_train))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    spec = plan_runs(cfg, "cpu:0", 1, info)[0]
    run_dir = tmp_path / "runs" / spec["run_id"]
    write_json_atomic(run_dir / "run.json", spec)
    seen: list[object] = []
    real = gpt_testbed.validation_loss

    def recording(model: Any, windows: torch.Tensor, batch_size: int, device: str) -> float:
        seen.append(device)
        return real(model, windows, batch_size, device)

    monkeypatch.setattr(gpt_testbed, "validation_loss", recording)
    summary = train_module.train_run(spec, run_dir)
    assert summary["status"] == "finished"
    assert seen and set(seen) == {"cpu:0"}


@linux_only
def test_cpu_peak_memory_is_the_workers_own_not_the_grid_processs(
    corpus_train: Path, tmp_path: Path
) -> None:
    """ru_maxrss survives fork and exec: a worker spawned by a grid process that once held
    1 GiB more reported that peak as its own, the same for every arm."""
    ballast = bytearray(1024 * MiB)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    del ballast
    parent_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = validate_config(tiny_config_train(corpus_train))
    summaries = train_grid(cfg, tmp_path / "out", show_progress=False)
    for summary in summaries.values():
        assert summary["status"] == "finished"
        assert summary["peak_memory_kind"] == "max_rss"
        assert 0 < summary["peak_memory_bytes"] < parent_peak - 512 * MiB


@linux_only
def test_peak_rss_bytes_is_at_least_the_current_rss() -> None:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize()
    assert peak_rss_bytes() >= rss * 0.9


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_step_times_wait_for_asynchronous_devices(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step times cover the step's kernels only if the loop waits for them on every
    asynchronous device, not only on CUDA."""
    calls: list[str] = []
    module = getattr(torch, kind)
    monkeypatch.setattr(module, "synchronize", lambda *_a, **_k: calls.append(kind))
    train_module._sync(torch.device(kind))
    assert calls == [kind]
    train_module._sync(torch.device("cpu"))
    assert calls == [kind]


def test_runs_trained_at_once_give_the_results_of_runs_trained_one_by_one(
    corpus: Path, tmp_path: Path
) -> None:
    """``parallel`` only schedules: each run is one worker with its own threads and seeds, so
    the training results are the same to the last bit whether runs train one by one or two at
    a time (the examples that set ``parallel: 2`` rely on it)."""
    fields = ("final_val_bpb", "best_val_bpb", "final_train_loss", "steps", "tokens")
    results = {}
    for parallel in (1, 2):
        cfg = validate_config(tiny_config(corpus, seeds=2, parallel=parallel))
        summaries = train_grid(cfg, tmp_path / f"p{parallel}", show_progress=False)
        assert len(summaries) == 4 and all(s["status"] == "finished" for s in summaries.values())
        results[parallel] = {run: [s[f] for f in fields] for run, s in summaries.items()}
    assert results[1] == results[2]
