"""Launch one run on several processes with torchrun and read its outcome.

:func:`launch` runs ``python -m torch.distributed.run`` as a subprocess (``--standalone`` on one
host, ``--rdzv-endpoint`` across hosts), with ``--max-restarts 0`` and every rank's output and
error file under ``log_dir``. How a failed rank fails the run: torchrun's elastic agent watches its
ranks; when one exits non-zero it stops the others on its host (SIGTERM, then SIGKILL), and on
other hosts their agents see the rendezvous close and do the same; torchrun then exits non-zero.
A rank whose entry point is wrapped in :func:`torch.distributed.elastic.multiprocessing.errors.
record` writes its exception to the error file torchrun names in ``TORCHELASTIC_ERROR_FILE``;
:func:`launch` reads the first failing rank's error from there (else the tail of its stderr)
and maps torchrun's exit status to ``finished`` (0) or ``crashed``. A collective whose peer
vanished without its agent noticing is bounded by the process group's timeout
(:func:`normlab.distributed.process_group.init_from_env`), and the whole launch by ``timeout_s``
(torchrun gets SIGTERM, which its agent passes on to the ranks, then what is left of its process
tree gets SIGKILL; status ``crashed``).

``python -m normlab.distributed --nproc-per-node N [--fsdp] -m MODULE ARGS…`` is the
same from a shell; it prints the outcome on one line and exits 0 (finished) or 1 (crashed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LaunchResult", "Layout", "launch", "main", "torchrun_command"]

FAULT_HANDLER_ENV = "PYTHONFAULTHANDLER"
FATAL_MARK = "Fatal Python error"
CRASH_MARKS = ("Traceback (most recent call last)", FATAL_MARK)
"""What a failed rank's stderr holds: a Python traceback, or the fault handler's report of a
fatal signal (``Fatal Python error: Segmentation fault`` and the stack of every thread)."""
MODE_ENV = "NORMLAB_PARALLEL"
"""The variable :func:`launch` sets in every rank: ``ddp`` or ``fsdp`` (read it with
:func:`parallel_mode`)."""

ERROR_TAIL_LINES = 20
AGENT_LOG = "torchrun.log"
"""torchrun's own output (its agent's log and the failure summary), in ``log_dir``."""
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class Layout:
    """How many processes and where: ``nproc_per_node`` ranks on each of ``nnodes`` hosts; this
    host is ``node_rank``; hosts meet at ``rdzv_endpoint`` (``host:port``; required when
    ``nnodes > 1``); ``fsdp`` shards the model (needs >= 2 processes) instead of replicating it
    (DDP). Errors name the command-line options."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    fsdp: bool = False

    def __post_init__(self) -> None:
        for name, value, low in (
            ("--nproc-per-node", self.nproc_per_node, 1),
            ("--nnodes", self.nnodes, 1),
            ("--node-rank", self.node_rank, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"--node-rank: expected < --nnodes = {self.nnodes}, got {self.node_rank}"
            )
        if self.nnodes > 1:
            host, _, port = (self.rdzv_endpoint or "").rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"--rdzv-endpoint: expected host:port with --nnodes {self.nnodes}, got "
                    f"{self.rdzv_endpoint!r}"
                )
        if self.fsdp and self.world_size < 2:
            raise ValueError(
                "--fsdp: FSDP shards the model over processes; expected --nproc-per-node "
                f"(times --nnodes) >= 2, got {self.world_size}"
            )

    @property
    def world_size(self) -> int:
        """N = nproc_per_node · nnodes."""
        return self.nproc_per_node * self.nnodes

    @property
    def mode(self) -> str:
        return "fsdp" if self.fsdp else "ddp"


@dataclass
class LaunchResult:
    """The outcome of one launch: ``status`` ``finished`` or ``crashed``; torchrun's
    ``returncode`` (None when ``timed_out``); the failing rank (global, when known) and the last
    lines of its error; ``log_dir`` holding torchrun's output (``torchrun.log``, also in
    ``agent_output``) and, below it, each rank's ``stdout.log`` / ``stderr.log`` /
    ``error.json``."""

    status: str
    returncode: int | None
    failed_rank: int | None = None
    error: str = ""
    timed_out: bool = False
    log_dir: Path | None = None
    agent_output: str = field(default="", repr=False)


def parallel_mode() -> str:
    """``ddp`` or ``fsdp``: the parallel mode :func:`launch` set for this rank (``ddp`` when
    none was set)."""
    mode = os.environ.get(MODE_ENV, "ddp")
    if mode not in ("ddp", "fsdp"):
        raise ValueError(f"{MODE_ENV}: expected ddp or fsdp, got {mode!r}")
    return mode


def torchrun_command(
    layout: Layout, module: str, args: list[str], log_dir: Path, monitor_interval_s: float = 0.2
) -> list[str]:
    """The torchrun command line of :func:`launch` (``sys.executable -m torch.distributed.run``)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(layout.nproc_per_node),
        "--nnodes",
        str(layout.nnodes),
        "--max-restarts",
        "0",
        "--monitor-interval",
        str(monitor_interval_s),
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
    ]
    if layout.nnodes == 1 and layout.rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            str(layout.rdzv_endpoint),
            "--node-rank",
            str(layout.node_rank),
        ]
    return [*cmd, "-m", module, *args]


def _tail(text: str, n: int = ERROR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _rank_error(text: str, n: int = ERROR_TAIL_LINES) -> str:
    """A failed rank's error from its stderr, at most ``n`` lines ending in what happened: a
    traceback's last lines (the exception last), or the fault handler's report turned so that
    it reads the same way, the stacks first (innermost frame first, as the handler prints
    them; its ``Extension modules:`` line dropped) and the ``Fatal Python error: …`` line last.
    The handler's report starts with that line, so a tail would keep only the outermost
    frames and the extension list."""
    lines = text.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(FATAL_MARK)), None)
    if start is None:
        return _tail(text, n)
    body = [
        line
        for line in lines[start + 1 :]
        if line.strip() and not line.startswith("Extension modules:")
    ]
    return "\n".join([*body[: n - 1], lines[start]])


def _error_text(error_file: Path) -> str:
    """The traceback (else the message) torchrun's ``record`` wrote to a rank's error file."""
    raw = error_file.read_text(errors="replace")
    try:
        message = json.loads(raw)["message"]
    except (ValueError, KeyError, TypeError):
        return raw
    if not isinstance(message, dict):
        return str(message)
    stack = message.get("extraInfo", {}).get("py_callstack")
    return stack if stack else str(message.get("message", raw))


def _rank_failures(log_dir: Path, earlier: set[Path]) -> list[tuple[int, int, str]]:
    """(write time in ns, local rank, error) of every rank that left an error file, or on stderr
    a traceback or the fault handler's report of a fatal signal, in a job folder of ``log_dir``
    not in ``earlier`` (torchrun makes one per launch), earliest first: the first is the root
    cause, the later ones are usually peers that lost it in a collective."""
    found = []
    jobs = [job for job in log_dir.iterdir() if job.is_dir() and job not in earlier]
    for attempt in (a for job in jobs for a in job.glob("attempt_*")):
        for rank_dir in attempt.iterdir():
            if not rank_dir.is_dir() or not rank_dir.name.isdigit():
                continue
            error_file = rank_dir / "error.json"
            stderr = rank_dir / "stderr.log"
            if error_file.is_file():
                found.append(
                    (error_file.stat().st_mtime_ns, int(rank_dir.name), _error_text(error_file))
                )
            elif stderr.is_file():
                text = stderr.read_text(errors="replace")
                if any(mark in text for mark in CRASH_MARKS):
                    found.append((stderr.stat().st_mtime_ns, int(rank_dir.name), text))
    return sorted(found)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux: read from /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop(proc: subprocess.Popen) -> None:
    """Stop a torchrun that ran out of time, and its ranks. Its agent starts every rank in a
    session of its own, so killing torchrun's session alone would orphan them: SIGTERM torchrun
    (its agent then stops its ranks), wait ``STOP_GRACE_S``, then SIGKILL whatever of torchrun's
    process tree (noted before the SIGTERM) is left."""
    tree = set(_descendants(proc.pid))
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        tree.update(_descendants(proc.pid))
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pid in sorted(tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def launch(
    module: str,
    args: list[str],
    layout: Layout,
    *,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> LaunchResult:
    """Run ``python -m module args`` on ``layout.nproc_per_node`` processes of this host under
    torchrun and wait for it: ``finished`` when torchrun exits 0, ``crashed`` otherwise (or after
    ``timeout_s`` seconds, when torchrun and its ranks are stopped), with the first failing rank
    and the last lines of its error.

    Each rank gets ``env`` on top of this process's environment, and ``NORMLAB_PARALLEL``
    (``ddp``/``fsdp``, from ``layout.fsdp``); ``PYTHONFAULTHANDLER=1`` unless either sets it, so
    that a rank killed by a signal (a segmentation fault, an abort) leaves its Python stack in its
    log and the result names it as the failing rank. ``log_dir`` (default: a new temporary
    folder; it may be reused, only this launch's job folder is read) keeps torchrun's output and
    per-rank logs. On one host the rendezvous is torchrun's ``--standalone`` (a free port of its
    own). The rank numbers read from the logs are local ranks; on one host they are the global
    ones (``failed_rank``: ``node_rank · nproc_per_node + local rank``).
    """
    if not isinstance(module, str) or not module:
        raise ValueError(f"module: expected a module name to run with -m, got {module!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a number > 0 or None, got {timeout_s!r}")
    log_dir = (
        Path(tempfile.mkdtemp(prefix="normlab-torchrun-")) if log_dir is None else Path(log_dir)
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    earlier = {job for job in log_dir.iterdir() if job.is_dir()}
    run_env = {FAULT_HANDLER_ENV: "1", **os.environ, **(env or {}), MODE_ENV: layout.mode}
    cmd = torchrun_command(layout, module, list(args), log_dir)
    agent_log = log_dir / AGENT_LOG
    with open(agent_log, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            cmd, env=run_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
    output = agent_log.read_text(errors="replace")
    returncode = None if timed_out else proc.returncode
    if returncode == 0:
        return LaunchResult("finished", 0, log_dir=log_dir, agent_output=output)
    failures = _rank_failures(log_dir, earlier)
    failed_rank, error = None, ""
    if failures:
        _, local, text = failures[0]
        failed_rank = layout.node_rank * layout.nproc_per_node + local
        error = _rank_error(text)
    elif timed_out:
        error = f"timed out after {timeout_s} s; torchrun and its ranks were stopped"
    else:
        error = _tail(output)
    if timed_out and failures:
        error = f"timed out after {timeout_s} s\n{error}"
    return LaunchResult("crashed", returncode, failed_rank, error, timed_out, log_dir, output)


def main(argv: list[str] | None = None) -> int:
    """``python -m normlab.distributed [options] -m MODULE ARGS…``: 0 finished, 1
    crashed, 2 bad options (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m normlab.distributed",
        usage="%(prog)s --nproc-per-node N [options] -m MODULE [ARGS ...]",
    )
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--rdzv-endpoint", default=None)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=None)
    parser.add_argument("--log-dir", type=Path, default=None)
    if "-m" not in argv or argv.index("-m") == len(argv) - 1:
        parser.error("-m: expected -m MODULE [ARGS ...] after the options")
    cut = argv.index("-m")
    ns = parser.parse_args(argv[:cut])
    module, args = argv[cut + 1], argv[cut + 2 :]
    try:
        layout = Layout(ns.nproc_per_node, ns.nnodes, ns.node_rank, ns.rdzv_endpoint, ns.fsdp)
        result = launch(module, args, layout, log_dir=ns.log_dir, timeout_s=ns.timeout_s)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result.status == "finished":
        print(f"finished: {layout.world_size} processes, logs in {result.log_dir}")
        return 0
    last = result.error.strip().splitlines()[-1] if result.error.strip() else ""
    print(f"crashed: rank {result.failed_rank}: {last} (logs in {result.log_dir})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
