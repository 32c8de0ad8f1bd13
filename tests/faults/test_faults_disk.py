"""Issue 17, item 4: a full disk while training, and while writing the report, gives a clean
one-line message and leaves a folder that the same command resumes.

The disk is a small tmpfs mounted for the test (needs root, or CAP_SYS_ADMIN); elsewhere the
test is skipped with the reason."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultlib import (
    LONG,
    assert_runs_complete_without_duplicates,
    invoke,
    no_workers_left,
    run_cli,
    start_cli,
    training_started,
    wait_for,
    write_config,
)


def _mount(point: Path, size: str, remount: bool = False) -> subprocess.CompletedProcess[str]:
    options = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
        capture_output=True,
        text=True,
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    point = tmp_path / "disk"
    point.mkdir()
    try:
        mounted = _mount(point, "512k")
    except OSError as err:  # no mount(8)
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its file system is full; returns it."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    return filler


def test_a_full_disk_gives_a_clean_message_and_a_resumable_folder(
    small_disk: Path, tmp_path: Path, corpus: Path
) -> None:
    config = write_config(tmp_path / "long.yaml", LONG)
    out = small_disk / "out"
    args = ("compare", "--config", str(config), "--data", str(corpus), "--out", str(out))

    # the disk fills up while the first run trains
    proc = start_cli(*args, "--no-report")
    wait_for(lambda: training_started(out) or proc.poll() is not None, 180, "training")
    filler = _fill(small_disk)
    output, _ = proc.communicate(timeout=120)
    no_workers_left(out)
    assert proc.returncode == 4, output
    assert "Traceback" not in output, output
    assert "No space left on device" in output and "run the same command again" in output, output

    # space again: the same command resumes and finishes every run
    filler.unlink()
    result = run_cli(*args, "--no-report")
    assert result.returncode == 0, result.stdout
    assert_runs_complete_without_duplicates(out, LONG["train"]["steps"])

    # the report (plots, HTML) does not fit: a clean message, then it builds once there is room
    # (the report command in this process: no worker, nothing to see at the process boundary)
    _fill(small_disk)
    code, output = invoke("report", str(out))
    assert code == 1, output
    assert "Traceback" not in output, output
    assert "No space left on device" in output, output
    (small_disk / "filler").unlink()
    assert _mount(small_disk, "8m", remount=True).returncode == 0
    code, output = invoke("report", str(out))
    assert code == 0, output
    assert (out / "report.md").is_file()
    assert not [p for p in out.rglob("*.tmp")], "a temporary file was left behind"
    assert os.listdir(out)
