"""One run on several processes (normlab.distributed) on this CPU with gloo.

The 2-process runs are launched with torchrun (``--standalone``: its rendezvous binds a free port)
as a subprocess, one intra-op thread per rank, the reference norm backend in every process; the
single-process reference is the same training function in this process.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import normlab
from normlab.distributed import (
    DistContext,
    Layout,
    clip_grad_norm,
    full_state_dict,
    gather_rank_stats,
    global_mean,
    init_from_env,
    launch,
    loss_weight,
    mixed_precision_policy,
    shard_bounds,
    shard_rows,
    unwrap,
    wrap,
)
from normlab.distributed import launcher as launch_module
from normlab.distributed.check import RESULT_FILE, STATE_FILE, train
from normlab.kernels import get_default_backend, set_default_backend

CHECK = "normlab.distributed.check"
SRC = str(Path(normlab.__file__).resolve().parents[1])
RANK_ENV = {
    "OMP_NUM_THREADS": "1",
    "NORMLAB_BACKEND": "torch",
    "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
}
TIMEOUT_S = 150.0
SINGLE = DistContext(0, 1, 0, torch.device("cpu"), None)


def _reference(batch_size: int) -> dict:
    """The single-process run, reference backend, one thread (the conftest sets it)."""
    before = get_default_backend()
    set_default_backend("torch")
    try:
        return train(SINGLE, batch_size=batch_size, keep_state=True)
    finally:
        set_default_backend(before)


def _launch(out: Path, *args: str, fsdp: bool = False) -> launch_module.LaunchResult:
    return launch(
        CHECK,
        ["--out", str(out), "--device", "cpu", *args],
        Layout(2, fsdp=fsdp),
        log_dir=out / "logs",
        env=RANK_ENV,
        timeout_s=TIMEOUT_S,
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# --- the same global batch for any N ---------------------------------------------------------


@pytest.mark.parametrize(("rows", "world"), [(8, 2), (7, 2), (7, 3), (5, 5), (9, 4)])
def test_shards_tile_the_global_batch(rows: int, world: int) -> None:
    bounds = [shard_bounds(rows, r, world) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    # Σ_r (n_r / B) · w_r / N … the weights average to one: (1/N) Σ_r N n_r / B = 1
    assert math.isclose(sum(loss_weight(rows, r, world) for r in range(world)), world)
    batch = torch.arange(rows * 3).reshape(rows, 3)
    assert torch.equal(torch.cat([shard_rows(batch, r, world) for r in range(world)]), batch)


def test_weighted_local_losses_give_the_global_gradient() -> None:
    """(1/N) Σ_r ∇(w_r · L_r) = ∇ L_global for unequal shards (what DDP's averaging sees)."""
    torch.manual_seed(0)
    x, y = torch.randn(7, 4), torch.randn(7)
    w = torch.randn(4, requires_grad=True)
    (((x @ w - y) ** 2).mean()).backward()
    expected, w.grad = w.grad.clone(), None
    world = 3
    total = torch.zeros(4)
    for r in range(world):
        start, stop = shard_bounds(7, r, world)
        local = ((x[start:stop] @ w - y[start:stop]) ** 2).mean()
        (local * loss_weight(7, r, world)).backward()
        total += w.grad / world
        w.grad = None
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=1e-7)


def test_batch_smaller_than_world_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^batch_size: 2 rows .* --nproc-per-node"):
        shard_bounds(2, 0, 3)


# --- metrics and wrapping in one process ------------------------------------------------------


def test_single_process_context_and_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_from_env(device="cpu")
    assert (ctx.rank, ctx.world_size, ctx.distributed, ctx.is_main) == (0, 1, False, True)
    assert global_mean(ctx, 2.5, 4, 4) == 2.5
    stats = gather_rank_stats(ctx, {"tokens_per_s": 10.0, "peak_memory_bytes": 3.0})
    assert stats["per_rank"] == [{"peak_memory_bytes": 3.0, "tokens_per_s": 10.0}]
    assert stats["total"] == stats["max"] == stats["per_rank"][0]


def test_torchrun_env_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match=r"^RANK: expected 0 <= RANK < WORLD_SIZE"):
        init_from_env(device="cpu")


def test_mixed_precision_policy_follows_precision() -> None:
    assert mixed_precision_policy("fp32") is None
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        policy = mixed_precision_policy(name)
        assert (policy.param_dtype, policy.reduce_dtype) == (dtype, torch.float32)
    with pytest.raises(ValueError, match=r"^precision: expected one of fp32, bf16, fp16"):
        mixed_precision_policy("fp8")


def test_wrap_without_group() -> None:
    model = nn.Linear(3, 2)
    assert wrap(model) is model  # DDP of one process is the model itself
    assert unwrap(model) is model
    state = full_state_dict(model)
    assert state.keys() == {"weight", "bias"} and torch.equal(state["weight"], model.weight)
    with pytest.raises(ValueError, match=r"^--fsdp: .* got 1 process"):
        wrap(model, "fsdp")
    with pytest.raises(ValueError, match=r"^mode: expected one of ddp, fsdp"):
        wrap(model, "zero3")


def test_clip_grad_norm_returns_the_norm_before_clipping() -> None:
    p = nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert clip_grad_norm([p], 1.0) == pytest.approx(5.0)
    torch.testing.assert_close(p.grad, torch.tensor([0.6, 0.8]), rtol=1e-5, atol=1e-6)


# --- bad input ---------------------------------------------------------------------------------


def test_zero_processes_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"^--nproc-per-node: expected an int >= 1, got 0$"):
        Layout(0)
    assert launch_module.main(["--nproc-per-node", "0", "-m", CHECK]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nproc-per-node" in err


def test_fsdp_with_one_process_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"^--fsdp: .*--nproc-per-node.* >= 2, got 1$"):
        Layout(1, fsdp=True)
    assert launch_module.main(["--nproc-per-node", "1", "--fsdp", "-m", CHECK]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fsdp" in err


def test_bad_layouts_name_their_option() -> None:
    with pytest.raises(ValueError, match=r"^--rdzv-endpoint: expected host:port"):
        Layout(2, nnodes=2)
    with pytest.raises(ValueError, match=r"^--node-rank: expected < --nnodes = 1"):
        Layout(2, node_rank=1)


# --- 2-process runs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fsdp", "batch_size"),
    [(False, 8), (True, 7)],  # DDP on equal shards; FSDP2 on unequal ones (4 + 3 rows)
    ids=["ddp", "fsdp-unequal"],
)
def test_two_processes_match_one(tmp_path: Path, fsdp: bool, batch_size: int) -> None:
    result = _launch(tmp_path, "--batch-size", str(batch_size), fsdp=fsdp)
    assert result.status == "finished", result.error or result.agent_output[-3000:]
    run = json.loads((tmp_path / RESULT_FILE).read_text())
    reference = _reference(batch_size)
    assert run["world_size"] == 2 and run["mode"] == ("fsdp" if fsdp else "ddp")
    assert len(run["loss"]) == len(reference["loss"]) == 5
    # 5 AdamW steps, clipped (the reference's norms exceed grad_clip = 0.5 at every step)
    assert min(reference["grad_norm"]) > 0.5
    for key in ("loss", "grad_norm"):
        for step, (got, want) in enumerate(zip(run[key], reference[key], strict=True), 1):
            assert got == pytest.approx(want, rel=1e-5), f"{key} at step {step}"
    # the loss moved, so equality is not the initial loss five times over
    assert reference["loss"][0] != reference["loss"][-1]
    # the last step's per-group gradient norms, reduced over the shards under FSDP
    assert run["layer_grad_norms"].keys() == reference["layer_grad_norms"].keys()
    for group, want in reference["layer_grad_norms"].items():
        assert run["layer_grad_norms"][group] == pytest.approx(want, rel=1e-4), group
    # the trained parameters, gathered from the shards under FSDP, are the single run's
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    assert state.keys() == reference["state_dict"].keys()
    for name, want in reference["state_dict"].items():
        torch.testing.assert_close(state[name], want, rtol=1e-5, atol=1e-6, msg=name)
    ranks = run["ranks"]
    assert len(ranks["per_rank"]) == 2
    assert ranks["total"]["tokens_per_s"] == pytest.approx(
        sum(r["tokens_per_s"] for r in ranks["per_rank"])
    )
    assert all(r["peak_memory_bytes"] > 0 for r in ranks["per_rank"])


def test_two_nodes_meet_at_the_rendezvous_endpoint_and_match_one(tmp_path: Path) -> None:
    """``--nnodes 2 --node-rank r --rdzv-endpoint host:port``: two torchrun agents (here both
    on this host, one process each) meet through the c10d rendezvous and train as one run of
    2 processes: the single process's losses."""
    results: dict[int, launch_module.LaunchResult] = {}

    def node(rank: int, port: int, attempt: int) -> None:
        layout = Layout(1, nnodes=2, node_rank=rank, rdzv_endpoint=f"127.0.0.1:{port}")
        results[rank] = launch(
            CHECK, ["--out", str(tmp_path), "--device", "cpu", "--batch-size", "7"], layout,
            log_dir=tmp_path / f"logs{attempt}-{rank}", env=RANK_ENV, timeout_s=TIMEOUT_S,
        )  # fmt: skip

    for attempt in range(2):  # a second try on a new port, should another process take this one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        nodes = [threading.Thread(target=node, args=(r, port, attempt)) for r in (0, 1)]
        for t in nodes:
            t.start()
        for t in nodes:
            t.join()
        if all(results[rank].status == "finished" for rank in (0, 1)):
            break
    for rank in (0, 1):
        assert results[rank].status == "finished", results[rank].error
    run = json.loads((tmp_path / RESULT_FILE).read_text())
    assert run["world_size"] == 2
    reference = _reference(7)
    for step, (got, want) in enumerate(zip(run["loss"], reference["loss"], strict=True), 1):
        assert got == pytest.approx(want, rel=1e-5), f"loss at step {step}"


def test_a_failing_rank_crashes_the_run(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _launch(tmp_path, "--fail-rank", "1", "--fail-at-step", "2")
    assert time.monotonic() - started < TIMEOUT_S
    assert result.status == "crashed" and not result.timed_out
    assert result.returncode not in (0, None)
    assert result.failed_rank == 1
    assert result.error.splitlines()[-1] == (
        "InjectedFailure: rank 1 fails at step 2 (--fail-rank)"
    )
    assert not (tmp_path / RESULT_FILE).exists()
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2
    assert not [pid for pid in pids if _alive(pid)], "a rank outlived torchrun"


SEGFAULTING_RANK = """
import os, signal, time
from normlab.distributed import init_from_env


def crash_in_rank_one():
    os.kill(os.getpid(), signal.SIGSEGV)  # as a native library's bad read would


def deep(k):
    return crash_in_rank_one() if k == 0 else deep(k - 1)


ctx = init_from_env(device="cpu")
if ctx.rank == 1:
    deep(40)  # a stack deeper than the error's lines: the innermost frame must be kept
time.sleep(60)  # rank 0 waits to be stopped by torchrun
"""


def test_a_rank_killed_by_a_signal_is_named_with_its_stack(tmp_path: Path) -> None:
    """No traceback and no error file: the fault handler that launch turns on reports the
    signal and the Python stack, and the result names the rank."""
    (tmp_path / "segfaulting_rank.py").write_text(SEGFAULTING_RANK)
    env = {**RANK_ENV, "PYTHONPATH": os.pathsep.join((str(tmp_path), RANK_ENV["PYTHONPATH"]))}
    result = launch(
        "segfaulting_rank", [], Layout(2), log_dir=tmp_path / "logs", env=env, timeout_s=TIMEOUT_S
    )
    assert result.status == "crashed" and not result.timed_out
    assert result.failed_rank == 1
    lines = result.error.splitlines()
    assert lines[-1].startswith("Fatal Python error: Segmentation fault")  # what happened, last
    assert "in crash_in_rank_one" in result.error and "Extension modules" not in result.error
    assert len(lines) <= launch_module.ERROR_TAIL_LINES


EXIT_RANK = """
import atexit, sys
from normlab.distributed import exit_rank

atexit.register(lambda: print("interpreter shutdown ran", flush=True))
print("written before exit", end="")  # no newline: still in stdout's buffer
sys.stderr.write("and on stderr")
exit_rank(3)
"""


def test_exit_rank_flushes_and_skips_the_interpreter_shutdown() -> None:
    """The finished rank's way out: its output is kept, its status is the one asked for, and
    none of the interpreter's shutdown (where gloo's threads have aborted finished ranks) runs."""
    env = {**os.environ, "PYTHONPATH": RANK_ENV["PYTHONPATH"]}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_RANK], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert proc.stdout == "written before exit"
    assert proc.stderr == "and on stderr"


AGENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an agent that does not stop its ranks
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)  # as torchrun starts a rank
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


def test_stopping_a_launch_kills_ranks_in_their_own_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun starts each rank in a session of its own: a timed-out launch must reach them
    even when the agent ignores SIGTERM (what ``launch(timeout_s=…)`` does on expiry)."""
    monkeypatch.setattr(launch_module, "STOP_GRACE_S", 0.5)
    pid_file = tmp_path / "child.pid"
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(pid_file)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    launch_module._stop(agent)
    assert agent.returncode is not None
    for _ in range(100):  # the orphan is reaped by init shortly after SIGKILL
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child), "a rank outlived its stopped launch"
