"""Issue 17, items 3–7: bad configs, paths, sizes and damaged folders give exit status 1 or 2
and one line that names the file, option or key; never a traceback."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from faultlib import TINY, invoke, make_corpus, run_cli, write_config

from in_process import use_in_process_workers
from normlab._io import read_jsonl
from normlab.data.cache import read_corpus
from normlab.experiment.config import ConfigError, load_config_file


def error_lines(output: str) -> list[str]:
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, output
    return lines


# -- configs (items 3, 4, 7) -------------------------------------------------------------------

BOMB = "data:\n  _a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  _a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)


def test_an_alias_bomb_under_a_real_key_is_refused_in_under_5_s(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + "norms: *a8\n", encoding="utf-8")
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="aliases expand it to more than"):
        load_config_file(path)
    code, output = invoke("compare", "--config", str(path), "--out", str(tmp_path / "o"))
    assert time.perf_counter() - started < 5
    assert code == 2
    assert str(path) in error_lines(output)[0]


def test_a_long_bad_value_is_quoted_short(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", {"norms": [["x"] * 50_000]})
    code, output = invoke("compare", "--config", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "norms" in output and len(output) < 2_000, output


def test_a_non_utf8_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"norms: [layern\xf6rm, rmsnorm]\n")
    code, output = invoke("compare", "--config", str(path), "--out", str(tmp_path / "o"))
    assert code == 2
    assert "not UTF-8" in error_lines(output)[0] and str(path) in output


def test_a_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("norms: [layernorm, rmsnorm]\nseeds: 2\nnorms: [layernorm]\n")
    code, output = invoke("compare", "--config", str(path), "--out", str(tmp_path / "o"))
    assert code == 2
    assert "'norms' is given twice" in error_lines(output)[0]


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"seeds": 1_000_000_000}, "seeds"),
        ({"data": {"max_bytes": 10**14}}, "data.max_bytes"),
        ({"model": {"d_model": 1_000_000, "n_heads": 1}}, "model.d_model"),
        ({"model": {"n_layers": 100_000_000}}, "model.n_layers"),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_allocated(
    tmp_path: Path, config: dict, key: str
) -> None:
    path = write_config(tmp_path / "big.yaml", config)
    out = tmp_path / "o"
    code, output = invoke("compare", "--config", str(path), "--out", str(out))
    assert code == 1, output
    line = error_lines(output)[0]
    assert "needs about" in line and "available" in line, line
    assert key.split(".")[-1] in line or "runs" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (("bench", "--dims", "99999999999", "--quick"), 1),  # beyond the machine: refused
        (("bench", "--rows", "1000000000000", "--quick"), 1),
        (("bench", "--rows", "1e12", "--quick"), 2),  # not an integer: usage
        (("audit", "norm", "rmsnorm", "--dim", "2000000000"), 1),
    ],
)
def test_absurd_bench_and_audit_sizes_are_refused(
    tmp_path: Path, args: tuple[str, ...], status: int
) -> None:
    extra = ("--out", str(tmp_path / "b")) if args[0] == "bench" else ()
    code, output = invoke(*args, *extra)
    assert code == status, output
    assert "Traceback" not in output


def test_bench_out_refuses_a_folder_that_is_not_a_bench_folder(tmp_path: Path) -> None:
    (tmp_path / "src.py").write_text("print('mine')\n")
    code, output = invoke("bench", "--quick", "--out", str(tmp_path))
    assert code == 1 and "not a bench folder" in output, output  # refused, as compare's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.py"]


# -- devices and paths (items 4, 5, 6) ---------------------------------------------------------


def test_a_bad_device_string_names_the_option(tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiny.yaml", TINY)
    code, output = invoke(
        "compare", "--config", str(config), "--device", "cuda:abc", "--out", str(tmp_path / "o")
    )
    assert code == 2  # a malformed value: usage, as bench's --device tpu
    assert "device: 'cuda:abc' is not a device name" in error_lines(output)[0]


def test_data_on_a_symlink_loop_names_the_option(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    config = write_config(tmp_path / "tiny.yaml", TINY)
    code, output = invoke(
        "compare", "--config", str(config), "--data", str(tmp_path / "a"), "--out", "o"
    )
    assert code == 1
    assert "data: cannot resolve" in error_lines(output)[0]


@pytest.mark.parametrize("option", ["--out", "--data"])
def test_a_non_utf8_path_is_refused_before_training(tmp_path: Path, option: str) -> None:
    config = write_config(tmp_path / "tiny.yaml", TINY)
    odd = os.fsencode(tmp_path) + b"/caf\xe9"
    if option == "--data":
        os.mkdir(odd)
        make_corpus(Path(os.fsdecode(odd)))
        args = ("--data", odd, "--out", str(tmp_path / "o"))
    else:
        args = ("--data", str(make_corpus(tmp_path)), "--out", odd)
    result = run_cli("compare", "--config", str(config), *args)
    assert result.returncode == 1, result.stdout
    assert f"{option[2:]}: the path" in error_lines(result.stdout)[0]
    assert not (tmp_path / "o").exists() and not os.path.exists(odd + b"/runs")


def test_a_non_utf8_file_name_in_the_data_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in (b"caf\xe9.py", b"plain.py"):
        with open(os.path.join(os.fsencode(folder), name), "w") as f:
            f.write("x = 1\n" * 200)
    train, val, desc = read_corpus(folder, 100_000, 0.5)
    assert desc["n_train_files"] + desc["n_val_files"] == 2 and train and val


# -- damaged compare folders (items 4, 5, 7) ---------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny compare folder (no report), built once for this module (its runs
    trained in this process: the folder is what these tests damage, not the workers)."""
    root = tmp_path_factory.mktemp("finished")
    config = write_config(root / "tiny.yaml", TINY)
    corpus = make_corpus(root)
    out = root / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_in_process_workers(monkeypatch)
        code, output = invoke(
            "compare", "--config", str(config), "--data", str(corpus), "--out", str(out),
            "--no-report",
        )  # fmt: skip
    assert code == 0, output
    return out


def _copy(finished: Path, tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    root = finished.parent
    args = ("compare", "--config", str(root / "tiny.yaml"), "--data", str(root / "corpus.txt"))
    return out, (*args, "--out", str(out), "--no-report")


def test_a_truncated_run_json_names_the_file(finished: Path, tmp_path: Path) -> None:
    out, args = _copy(finished, tmp_path)
    run_json = sorted((out / "runs").iterdir())[0] / "run.json"
    run_json.write_text(run_json.read_text()[:40])
    code, output = invoke(*args)
    assert code == 1
    assert str(run_json) in error_lines(output)[0] and "not valid JSON" in output


def test_garbage_in_data_json_names_the_file(finished: Path, tmp_path: Path) -> None:
    out, args = _copy(finished, tmp_path)
    (out / "data" / "data.json").write_bytes(os.urandom(300))
    code, output = invoke(*args)
    assert code == 1
    assert "data.json" in error_lines(output)[0]


def test_a_summary_that_is_a_list_is_named_by_the_report(finished: Path, tmp_path: Path) -> None:
    out, _ = _copy(finished, tmp_path)
    summary = sorted((out / "runs").iterdir())[0] / "summary.json"
    summary.write_text("[]\n")
    code, output = invoke("report", str(out))
    assert code == 1  # a damaged folder: refused, as compare's
    assert "summary.json" in error_lines(output)[0]


def test_binary_garbage_in_experiment_json_is_named_by_the_report(
    finished: Path, tmp_path: Path
) -> None:
    out, _ = _copy(finished, tmp_path)
    (out / "experiment.json").write_bytes(b"\xff\xfe\x00garbage\x9c" * 20)
    code, output = invoke("report", str(out))
    assert code == 1
    assert "experiment.json" in error_lines(output)[0]


def test_a_garbled_metrics_line_is_named_not_skipped(finished: Path, tmp_path: Path) -> None:
    """A damaged metrics.jsonl is an error where it is read line by line; the report leaves that
    run's curves out and says so (run, file and line), and keeps every other run's."""
    out, _ = _copy(finished, tmp_path)
    runs = sorted((out / "runs").iterdir())
    metrics = runs[0] / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + "#garbage\n" + "".join(lines[1:]))
    (runs[1] / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(metrics)
    code, output = invoke("report", str(out))
    assert code == 0, output
    report = (out / "report.md").read_text(encoding="utf-8")
    note = next(line for line in report.splitlines() if "Curves left out" in line)
    assert runs[0].name in note and "line 2" in note and "damaged" in note
    assert runs[1].name in note and "holds no training records" in note


def test_report_md_escapes_text_from_the_runs(finished: Path, tmp_path: Path) -> None:
    """An error message of a crashed run lands in report.md as text: no HTML tag, no link."""
    import json

    out, _ = _copy(finished, tmp_path)
    summary_path = sorted((out / "runs").iterdir())[0] / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary.update(status="crashed", error="<script>alert(1)</script> [x](javascript:alert(1))")
    summary_path.write_text(json.dumps(summary))
    code, output = invoke("report", str(out))
    assert code == 0, output
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "<script>" not in report and "[x](javascript:" not in report
    assert "&lt;script>" in report and "[x\\](javascript:alert(1))" in report
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in html


def test_the_report_takes_the_lock(finished: Path, tmp_path: Path) -> None:
    from normlab.experiment.execution.lock import OutputLock

    out, _ = _copy(finished, tmp_path)
    with OutputLock(out):
        code, output = invoke("report", str(out))
    assert code == 1
    assert "being written by another normlab command" in error_lines(output)[0]
    assert not (out / "report.md").exists()


def test_a_single_binary_file_as_data_is_refused_like_a_folder_skips_it(tmp_path: Path) -> None:
    path = tmp_path / "blob.dat"
    path.write_bytes(b"text\0" + os.urandom(4000))
    with pytest.raises(ValueError, match="looks binary"):
        read_corpus(path, 100_000, 0.05)


def test_report_on_a_non_utf8_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    odd = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(odd)
    Path(os.fsdecode(odd), "experiment.json").write_text("{}\n")
    result = run_cli("report", odd)
    assert result.returncode == 1, result.stdout
    assert "OUT: the path" in error_lines(result.stdout)[0]
