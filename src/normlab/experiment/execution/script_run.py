"""One run of a user's script (``normlab compare --script``): build its argument list, start it,
watch it, and turn how it ended into the run's summary.

The command is split into arguments first (:func:`shlex.split`, POSIX rules) and the
placeholders are filled in each argument afterwards, and the script is
started without a shell: a factor value such as ``a;rm -rf x`` or ``$(x)`` stays one literal
argument (:func:`normlab.run_format.script.script_argv`). The script writes its records and
summary itself (:mod:`normlab.track`); its standard
output and error go to the run's ``script.log``. How it ended:

- it wrote a ``finished`` or ``diverged`` summary and exited 0: that summary (identity fields
  from the run's config), unless it never logged the metric being judged (crashed, named);
- it exited with another status: ``crashed``, with its own error when it recorded one, and the
  tail of its output;
- it ran past ``timeout_s``: its process group is killed and the run is ``crashed`` as timed out;
- it exited 0 without a summary (``finish`` never called), or with a damaged one:
  ``crashed``, named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.experiment.training.train import RunAborted
from normlab.run_format import CRASHED, DONE_STATUSES, testbed_format
from normlab.run_format.folder import (
    MetricsTail,
    read_log_tail,
    read_summary,
    script_log_path,
)
from normlab.run_format.script import ENV, script_argv
from normlab.run_format.summary import IDENTITY, crashed_summary

__all__ = ["placeholder_values", "run_script", "script_outcome"]

TAIL_CHARS = 2000
"""How much of the end of a failed script's output its crashed summary keeps."""


def placeholder_values(spec: dict[str, Any], run_dir: Path) -> dict[str, str]:
    """{placeholder: value} of the run ``spec`` whose folder is ``run_dir`` (absolute)."""
    return {
        "norm": str(spec["norm"]),
        "placement": str(spec["placement"]),
        "precision": str(spec["precision"]),
        "seed": str(spec["seed"]),
        "run_dir": str(Path(run_dir).absolute()),
    }


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script's process group (it leads its own session), SIGKILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_script(
    spec: dict[str, Any],
    run_dir: Path,
    on_step: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    wait_for_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the script of ``spec["script"]`` for this run and return the run's summary (see the
    module docstring); the caller writes it. ``on_step`` gets the last ``train`` step the script
    logged; ``should_stop()`` true kills the script and raises :class:`RunAborted`."""
    run_dir = Path(run_dir)
    script = spec["script"]
    if wait_for_start is not None:
        wait_for_start()
    values = placeholder_values(spec, run_dir)
    argv = script_argv(script["command"], values)
    env = {**os.environ, **{ENV[k]: v for k, v in values.items()}}
    timeout = script.get("timeout_s")
    steps = max(1, int(spec.get("train", {}).get("steps") or 1))
    tail = MetricsTail(run_dir)
    with open(script_log_path(run_dir), "ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=script.get("cwd") or None,
                env=env,
                start_new_session=True,
            )
        except OSError as err:
            return crashed_summary(
                spec, f"cannot start the script {argv[0]!r}: {err.strerror or err}", ""
            )
        started = time.monotonic()
        timed_out = False
        try:
            while proc.poll() is None:
                if on_step is not None:
                    on_step(min(tail.poll(), steps))
                if should_stop is not None and should_stop():
                    _kill_group(proc)
                    raise RunAborted("the grid's process is gone")
                if timeout is not None and time.monotonic() - started > float(timeout):
                    timed_out = True
                    _kill_group(proc)
                    break
                time.sleep(0.1)
        except BaseException:
            _kill_group(proc)
            raise
    return script_outcome(spec, run_dir, proc.returncode, timed_out)


def script_outcome(
    spec: dict[str, Any], run_dir: Path, returncode: int | None, timed_out: bool
) -> dict[str, Any]:
    """The summary of a script run that ended with ``returncode`` (see the module docstring)."""
    output = read_log_tail(run_dir, TAIL_CHARS)
    try:
        own, damaged = read_summary(run_dir), None
    except ValueError as err:  # the script wrote it (or something in its folder did)
        own, damaged = None, f"the script left a damaged summary: {err}"
    last = output.strip().splitlines()[-1:] if output.strip() else []
    said = f": {last[0]}" if last else ""
    if timed_out:
        return crashed_summary(
            spec,
            f"timed out: the script ran past --run-timeout {spec['script']['timeout_s']} s and "
            "was killed",
            output,
        )
    if returncode != 0:
        how = (
            f"killed by signal {-returncode}"
            if returncode is not None and returncode < 0
            else f"exit status {returncode}"
        )
        if own is not None and own.get("status") == CRASHED and own.get("error"):
            return crashed_summary(spec, f"{own['error']} (the script ended with {how})", output)
        return crashed_summary(spec, f"the script ended with {how}{said}", output)
    if damaged is not None:
        return crashed_summary(spec, damaged, output)
    if own is None:
        return crashed_summary(
            spec,
            "the script exited (status 0) without calling finish(): it left no summary.json",
            output,
        )
    if own.get("status") not in DONE_STATUSES:
        error = own.get("error") or f"the script recorded status {own.get('status')!r}"
        return crashed_summary(spec, str(error), str(own.get("traceback") or output))
    quality = testbed_format(spec.get("testbed")).quality
    if own.get("status") != "diverged" and own.get(quality) is None:
        metric = quality.removeprefix("final_")
        return crashed_summary(
            spec,
            f"the script finished without logging {metric!r} with log_eval (--metric "
            f"{metric}); nothing to judge",
            output,
        )
    return {**own, **{k: spec.get(k) for k in IDENTITY}}
