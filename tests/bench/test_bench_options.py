"""``normlab bench``: options checked before any measurement; outputs written as one set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import normlab.bench.output as output
import normlab.cli.bench_cmd as bench_cmd
from normlab.bench.peers import check_peer_names, known_peers
from normlab.bench.runner import Config, Result, Row, check_device_available, parse_device
from normlab.cli import app

TINY = ["--quick", "--ops", "rms", "--dtypes", "fp32", "--modes", "fwd", "--allocator", "ignore"]
TINY += ["--rows", "64"]


def _flat(text: str) -> str:
    """CLI output with rich's box characters and line wrapping removed."""
    for ch in "│╭╮╰╯─":
        text = text.replace(ch, " ")
    return " ".join(text.split())


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """Replace the benchmark itself: records each call instead of measuring."""
    calls: list[Config] = []

    def fake_run(config: Config, progress: object = None) -> Result:
        calls.append(config)
        raise AssertionError("the benchmark ran despite a bad option")

    monkeypatch.setattr(bench_cmd, "run", fake_run)
    return calls


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", *TINY, *args])
    return result.exit_code, _flat(result.output)


# ----------------------------------------------------------------------------------------------
# --out
# ----------------------------------------------------------------------------------------------
def test_out_that_is_a_file_is_rejected_before_measuring(tmp_path: Path, no_run: list) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    code, text = _invoke("--out", str(afile))  # well formed, but it cannot be used: refused
    assert code == 1 and "--out" in text and "not a folder" in text
    assert "Traceback" not in text
    code, text = _invoke("--out", str(afile / "sub"))  # a path below a file cannot be made
    assert code == 1 and "--out" in text and "cannot write" in text
    assert not no_run
    assert afile.read_text() == "keep me"


def test_out_impossible_path_is_rejected(no_run: list) -> None:
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc")
    code, text = _invoke("--out", "/proc/nope/bench")
    assert code == 1 and "--out" in text and "Traceback" not in text
    assert not no_run


# ----------------------------------------------------------------------------------------------
# --peers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("peer", ["foo", "normlab:nope", "torch,foo"])
def test_unknown_peer_is_rejected_with_the_valid_names(
    peer: str, tmp_path: Path, no_run: list
) -> None:
    code, text = _invoke("--peers", peer, "--out", str(tmp_path / "o"))
    assert code == 2 and "--peers" in text
    assert "normlab:auto" in text and "liger" in text  # the valid names are listed
    assert not no_run
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_peer_names_known_everywhere() -> None:
    names = known_peers()
    assert {"torch", "eager", "torch.compile", "normlab:auto", "normlab:torch"} <= set(names)
    assert "normlab:triton" in names  # valid even where triton is not registered
    assert check_peer_names(["torch", "liger"]) == ["torch", "liger"]
    with pytest.raises(ValueError, match="peers: unknown peer 'foo'"):
        check_peer_names(["foo"])
    with pytest.raises(ValueError, match="peers"):
        Config(peers=["normlab:nope"])


# ----------------------------------------------------------------------------------------------
# numeric options and --device
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--llc-multiple", "nan"], "--llc-multiple"),
        (["--llc-multiple", "0"], "--llc-multiple"),
        (["--llc-multiple", "-1"], "--llc-multiple"),
        (["--llc-multiple", "inf"], "--llc-multiple"),
        (["--device", "tpu"], "--device"),
        (["--reps", "0"], "--reps"),
        (["--rows", "0"], "--rows"),
        (["--threads", "-2"], "--threads"),
        (["--dims", "0"], "--dims"),
        (["--dims", "64,x"], "--dims"),
        (["--ops", "rms,batchnorm"], "--ops"),
        (["--allocator", "sometimes"], "--allocator"),
    ],
)
def test_bad_option_is_named_before_measuring(
    args: list[str], option: str, tmp_path: Path, no_run: list
) -> None:
    code, text = _invoke(*args, "--out", str(tmp_path / "o"))
    assert code == 2, text
    assert f"Invalid value for {option}" in text
    assert "Traceback" not in text
    assert not no_run


def test_a_device_that_is_not_there_is_refused_before_measuring(
    tmp_path: Path, no_run: list
) -> None:
    """A well-formed --device this machine has not: refused (exit 1), not a usage error."""
    code, text = _invoke("--device", "cuda:99", "--out", str(tmp_path / "o"))
    assert code == 1, text
    assert "--device: 'cuda:99' requested but" in text and "Traceback" not in text
    assert not no_run


def test_config_checks_every_field() -> None:
    for bad in (float("nan"), 0.0, -1.0, math.inf, 1e9):
        with pytest.raises(ValueError, match="llc_multiple"):
            Config(llc_multiple=bad)
    for field in ("reps", "rows", "min_reps", "sample_rows"):
        with pytest.raises(ValueError, match=field):
            Config(**{field: 0})
    with pytest.raises(ValueError, match="warmup"):
        Config(warmup=-1)
    with pytest.raises(ValueError, match="dims"):
        Config(dims=[64, 0])
    with pytest.raises(ValueError, match="ops"):
        Config(ops=["batch"])
    with pytest.raises(ValueError, match="budget_s"):
        Config(budget_s=float("nan"))
    with pytest.raises(ValueError, match="device: expected cpu, cuda or cuda:N"):
        Config(device="tpu")
    assert parse_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device_available("cuda")


# ----------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------
def _result(status: str = "skipped") -> Result:
    row = Row("rms", 64, 8, "float32", "fwd", "torch", status=status, note="why")
    if status == "ok":
        row.median_ms, row.frac_copy = 0.1, 0.5
    return Result(config=Config(dims=[64], dtypes=[torch.float32]), rows=[row])


def test_no_measured_row_gives_no_chart_and_never_replaces_earlier_results(
    tmp_path: Path,
) -> None:
    assert output.plot_png(_result("skipped")) is None
    written = output.write_outputs(_result("skipped"), tmp_path)
    assert set(written.paths) == {"csv", "json"}
    assert written.notes and "no chart" in written.notes[0]
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][0]["status"] == "skipped"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json"]

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "bench.png").write_bytes(b"old chart")
    written = output.write_outputs(_result("skipped"), earlier)
    assert written.paths == {} and "left as they were" in written.notes[0]
    assert [(p.name, p.read_bytes()) for p in earlier.iterdir()] == [("bench.png", b"old chart")]


def test_a_chart_that_fails_to_draw_keeps_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(result: Result) -> bytes:
        raise RuntimeError("no display")

    (tmp_path / "bench.png").write_bytes(b"old chart")
    monkeypatch.setattr(output, "plot_png", broken)
    written = output.write_outputs(_result("ok"), tmp_path)
    assert set(written.paths) == {"csv", "json"}
    assert "drawing failed (RuntimeError: no display)" in written.notes[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json"]


def test_a_failure_while_staging_leaves_the_folder_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {"bench.csv": b"old csv", "bench.json": b"{}", "bench.png": b"old png"}
    for name, data in before.items():
        (tmp_path / name).write_bytes(data)
    real = output.write_bytes_atomic

    def failing(path: Path, data: bytes) -> Path:
        if ".bench.png." in Path(path).name:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(output, "write_bytes_atomic", failing)
    with pytest.raises(OSError):
        output.write_outputs(_result("ok"), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_cli_run_that_measures_nothing_fails_and_keeps_earlier_results(tmp_path: Path) -> None:
    """Only skipped peers: exit 3 (failed). In a fresh folder the CSV and JSON still record why
    each row was skipped (no chart); in a folder with earlier results nothing is replaced or
    removed."""
    if torch.cuda.is_available():
        pytest.skip("liger may run on CUDA")
    fresh = tmp_path / "fresh"
    result = CliRunner().invoke(app, ["bench", *TINY, "--peers", "liger", "--out", str(fresh)])
    assert result.exit_code == 3, result.output
    text = _flat(result.output)
    assert "no chart" in text and "no row was measured" in text
    assert sorted(p.name for p in fresh.iterdir()) == ["bench.csv", "bench.json"]
    assert "skipped" in (fresh / "bench.csv").read_text()

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    files = {"bench.csv": b"op,dim\nrms,768\n", "bench.json": b"{}", "bench.png": b"chart"}
    for name, data in files.items():
        (earlier / name).write_bytes(data)
    result = CliRunner().invoke(app, ["bench", *TINY, "--peers", "liger", "--out", str(earlier)])
    assert result.exit_code == 3, result.output
    assert "were left as they were" in _flat(result.output)
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == files


def test_too_few_repetitions_are_flagged(tmp_path: Path) -> None:
    args = ["bench", *TINY, "--reps", "2", "--out", str(tmp_path / "o")]
    text = _flat(CliRunner().invoke(app, args).output)
    assert "--reps 2: with fewer than 3 repetitions" in text
    text = _flat(CliRunner().invoke(app, ["bench", *TINY, "--out", str(tmp_path / "p")]).output)
    assert "fewer than 3 repetitions" not in text


def test_an_unavailable_backend_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A normlab backend that cannot run here (the C++ kernels without a compiler) is a skipped
    row, never a timing of another backend under its name."""
    from normlab.bench import peers

    def reason(name: str) -> str | None:
        return "no C++ compiler found" if name == "cpp" else None

    monkeypatch.setattr(peers, "backend_unavailable_reason", reason)
    with pytest.raises(peers.Unavailable, match="normlab:cpp: no C\\+\\+ compiler found"):
        peers.peer_function("normlab:cpp", "rms", torch.device("cpu"))
    assert callable(peers.peer_function("normlab:torch", "rms", torch.device("cpu")))


def test_warnings_go_to_stderr_one_line_each(
    tmp_path: Path, no_run: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warning before measuring (here: too few repetitions, on a narrow terminal) is one line on
    standard error, so a script reading the results on standard output never sees it."""
    monkeypatch.setenv("COLUMNS", "40")
    result = CliRunner().invoke(app, ["bench", *TINY, "--reps", "1", "--out", str(tmp_path / "o")])
    assert isinstance(result.exception, AssertionError)  # no_run: stopped where it would measure
    warnings = [line for line in result.stderr.splitlines() if "--reps 1" in line]
    assert len(warnings) == 1 and "use 3 or more" in warnings[0], result.stderr
    assert "warning" not in result.stdout
