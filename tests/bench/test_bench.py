"""``normlab bench``: bytes model, problem sizing, allocator check, a tiny end-to-end run."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from normlab.bench import allocator
from normlab.bench.bytes_model import copy_bytes, min_bytes, traffic
from normlab.bench.runner import COLUMNS, LIVE_TENSORS, MEMORY_FRACTION, rows_for
from normlab.cli import app
from normlab.kernels.cpu.cache_size import DEFAULT_LLC_BYTES, last_level_cache_bytes, parse_size


@pytest.mark.parametrize(
    ("op", "fwd", "fwd_bwd"),
    [("rms", 2, 5), ("layer", 2, 5), ("add_rms", 4, 8), ("ada_rms", 4, 10)],
)
def test_bytes_model_units(op: str, fwd: int, fwd_bwd: int) -> None:
    assert traffic(op, "fwd").units == fwd
    assert traffic(op, "fwd+bwd").units == fwd_bwd


def test_min_bytes_counts_tensors_and_parameter_vectors() -> None:
    # rms forward: read x, write y (2 · N·D·b) plus the weight read once (D·b)
    assert min_bytes("rms", "fwd", rows=10, dim=8, itemsize=2) == 2 * 80 * 2 + 8 * 2
    # fwd+bwd: 5 units; weight read twice, weight gradient written once
    assert min_bytes("rms", "fwd+bwd", 10, 8, 4) == 5 * 80 * 4 + 3 * 8 * 4
    # layer: weight and bias read, both gradients written
    assert min_bytes("layer", "fwd+bwd", 10, 8, 4, param_itemsize=4) == 5 * 80 * 4 + 5 * 8 * 4
    assert min_bytes("ada_rms", "fwd", 4, 4, 4) == 4 * 16 * 4
    assert copy_bytes(100, 4) == 800
    with pytest.raises(ValueError, match="op"):
        traffic("batch", "fwd")
    with pytest.raises(ValueError, match="mode"):
        traffic("rms", "bwd")


def test_problem_size_exceeds_the_cache_multiple() -> None:
    llc = 32 * 1024 * 1024
    for dim in (768, 2048, 4096, 8192):
        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
            rows = rows_for(dim, dtype, llc, 4.0)
            assert rows * dim * size >= 4 * llc
            assert (rows - 1) * dim * size < 4 * llc


def test_problem_size_is_capped_by_the_memory_available() -> None:
    """A VM that reports its host socket's 480 MiB L3 on 24 GiB: a 4 × L3 problem of 16 live
    tensors would need 30 GiB, so the rows are cut to fit a quarter of the memory."""
    llc, memory = 480 * 2**20, 20 * 2**30
    for dim in (768, 4096):
        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
            rows = rows_for(dim, dtype, llc, 4.0, memory)
            assert LIVE_TENSORS * rows * dim * size <= MEMORY_FRACTION * memory
            assert LIVE_TENSORS * (rows + 1) * dim * size > MEMORY_FRACTION * memory
            assert rows_for(dim, dtype, 32 * 2**20, 4.0, memory) == rows_for(
                dim, dtype, 32 * 2**20, 4.0
            )  # a small cache is not capped
    assert rows_for(4096, torch.float32, llc, 4.0, memory=0) == 1


def test_cache_size_parsing() -> None:
    assert parse_size("32768K") == 32 * 1024 * 1024
    assert parse_size("32 MiB (1 instance)") == 32 * 1024 * 1024
    assert parse_size("1.5M") == int(1.5 * 1024 * 1024)
    assert parse_size("n/a") is None
    assert last_level_cache_bytes() > 0
    assert DEFAULT_LLC_BYTES == 32 * 1024 * 1024


def test_allocator_warning_names_the_exact_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "uses_glibc_malloc", lambda: True)
    for key in allocator.MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    text = allocator.warning_text()
    assert text is not None
    assert "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000" in text
    for key, value in allocator.MALLOC_ENV.items():
        monkeypatch.setenv(key, value)
    assert allocator.warning_text() is None
    monkeypatch.setattr(allocator, "uses_glibc_malloc", lambda: False)
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    assert allocator.warning_text() is None
    assert not allocator.can_reexec()  # pytest is not the normlab console script


def test_tiny_bench_run_writes_csv_json_png(tmp_path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--ops",
            "rms,add_rms,ada_rms",
            "--dims",
            "64",
            "--rows",
            "48",
            "--dtypes",
            "fp32",
            "--modes",
            "fwd,fwd+bwd",
            "--peers",
            "torch,eager,normlab:auto,normlab:cpp,liger",
            "--reps",
            "2",
            "--allocator",
            "ignore",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) == 3 * 2 * 5
    data = json.loads((out / "bench.json").read_text())
    assert data["columns"] == list(COLUMNS)
    assert data["meta"]["llc_bytes"] > 0 and data["meta"]["command"].startswith("normlab")
    assert len(data["rows"]) == len(rows)
    for r in data["rows"]:
        if r["peer"] == "liger":  # external peers are CUDA-only: kept as skipped rows
            assert r["status"] == "skipped" and r["note"]
            continue
        assert r["status"] == "ok", r
        assert r["rows"] == 48 and r["dim"] == 64 and r["dtype"] == "float32"
        assert r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"]
        assert r["gbps"] > 0 and r["copy_gbps"] > 0 and r["frac_copy"] > 0
        assert r["frac_copy_best"] > 0
        assert 0 <= r["max_err"] < 1e-4
        assert r["reps"] >= 1
        if r["peer"] == "torch":
            assert r["speedup_vs_torch"] == pytest.approx(1.0)
        else:
            assert r["speedup_vs_torch"] > 0


def test_bench_rejects_unknown_options(tmp_path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "--ops", "batchnorm", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "batchnorm" in bad.output
    bad = runner.invoke(app, ["bench", "--dims", "0", "--out", str(tmp_path)])
    assert bad.exit_code != 0


def test_both_launchers_restart_as_the_same_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``python -m normlab bench`` restarts as ``python -m normlab bench`` (it used to keep the
    distorting allocator and only warn); the console script restarts as itself; other hosts and
    an already restarted process are left alone."""
    import types

    monkeypatch.delenv("NORMLAB_BENCH_REEXECUTED", raising=False)
    module_main = types.ModuleType("__main__")
    module_main.__spec__ = types.SimpleNamespace(name="normlab.__main__")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", module_main)
    monkeypatch.setattr(sys, "argv", ["/somewhere/normlab/__main__.py", "bench", "--quick"])
    assert allocator.restart_argv() == [sys.executable, "-m", "normlab", "bench", "--quick"]

    script = tmp_path / "normlab"
    script.write_text("#!/usr/bin/env python\n")
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    monkeypatch.setattr(sys, "argv", [str(script), "bench"])
    assert allocator.restart_argv() == [sys.executable, str(script), "bench"]

    monkeypatch.setattr(sys, "argv", [str(tmp_path / "pytest"), "bench"])
    assert allocator.restart_argv() is None and not allocator.can_reexec()
    monkeypatch.setattr(sys, "argv", [str(script), "bench"])
    monkeypatch.setenv("NORMLAB_BENCH_REEXECUTED", "1")
    assert allocator.restart_argv() is None
