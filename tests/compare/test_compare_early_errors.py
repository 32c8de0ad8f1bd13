"""``normlab compare`` refuses bad --out, --device and --data before any work, leaves no stray
folder behind, and exits non-zero when no run produced a result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.errors import EXIT_FAILED, EXIT_REFUSED


def invoke(*args: str) -> tuple[int, str, BaseException | None]:
    """Exit code, output with line breaks folded, and any exception other than the exit."""
    result = CliRunner().invoke(app, ["compare", *args])
    error = None if isinstance(result.exception, SystemExit) else result.exception
    return result.exit_code, " ".join(result.output.split()), error


def test_out_that_is_a_file(config: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "a_file"
    out.write_text("keep me")
    code, output, error = invoke("--config", str(config), "--data", str(corpus), "--out", str(out))
    assert error is None and code == EXIT_REFUSED, output
    assert f"out: '{out}' exists and is not a folder; expected a folder for --out" in output
    assert out.read_text() == "keep me"
    code, output, error = invoke(
        "--config", str(config), "--data", str(corpus), "--out", str(out / "sub")
    )
    assert error is None and code == EXIT_REFUSED, output
    assert "is not a folder; expected --out to name a folder" in output


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_that_cannot_be_created(config: Path, corpus: Path) -> None:
    code, output, error = invoke(
        "--config", str(config), "--data", str(corpus), "--out", "/proc/normlab-nope"
    )
    assert error is None and code == EXIT_REFUSED, output
    assert "out: cannot create the folder '/proc/normlab-nope'" in output
    assert "expected --out to name a folder" in output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bad_device_leaves_no_folder(config: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    args = ("--config", str(config), "--data", str(corpus), "--out", str(out))
    code, output, error = invoke(*args, "--device", "cuda")
    assert error is None and code == EXIT_REFUSED, output
    assert "device: 'cuda' was asked for but no CUDA device is available" in output
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", ["missing.txt", "empty.txt"])
def test_bad_data_leaves_no_folder(config: Path, tmp_path: Path, name: str) -> None:
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "new" / "out"
    code, output, error = invoke(
        "--config", str(config), "--data", str(tmp_path / name), "--out", str(out)
    )
    assert error is None and code == EXIT_REFUSED, output
    assert "error: data:" in output
    assert not (tmp_path / "new").exists()


def test_a_failure_keeps_a_folder_that_existed(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, output, _ = invoke("--config", str(config), "--data", "nope.txt", "--out", str(out))
    assert code == EXIT_REFUSED, output
    assert (out / "notes.txt").read_text() == "mine"


def test_data_too_small_for_the_context(config: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("x = 1\n" * 34)  # 204 bytes: 10 validation bytes at val_fraction 0.05
    out = tmp_path / "out"
    code, output, error = invoke("--config", str(config), "--data", str(small), "--out", str(out))
    assert error is None and code == EXIT_REFUSED, output
    assert "is too small for model.context = 16" in output
    assert "expected at least 18 training and 17 validation bytes" in output
    assert "Give --data more text" in output
    assert not out.exists()


def _all_crashed(*args: Any, **kwargs: Any) -> dict[str, dict[str, Any]]:
    return {
        f"{arm}__s0": {"run_id": f"{arm}__s0", "status": "crashed", "error": "RuntimeError: x"}
        for arm in ("layernorm-pre", "rmsnorm-pre")
    }


def test_no_run_with_a_result_is_a_failure(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("normlab.experiment.execution.runner.train_grid", _all_crashed)
    code, output, error = invoke("--config", str(config), "--out", str(tmp_path / "out"))
    assert error is None and code == EXIT_FAILED == 3, output
    assert "2 crashed" in output and "no run finished or diverged" in output


def test_one_run_with_a_result_is_a_success(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def one_diverged(*args: Any, **kwargs: Any) -> dict[str, dict[str, Any]]:
        return {**_all_crashed(), "x__s0": {"status": "diverged"}}

    monkeypatch.setattr("normlab.experiment.execution.runner.train_grid", one_diverged)
    code, output, _ = invoke("--config", str(config), "--out", str(tmp_path / "out"))
    assert code == 0, output
