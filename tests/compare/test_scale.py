"""``normlab compare`` past one process: torchrun runs (DDP, FSDP2), the Ray executor, ``--plan``.

Every check compares against the same tiny grid trained by the local executor on one process
per run (the module's ``reference`` fixture): over its 6 steps a run's per-step loss must
match to float32 rounding whatever the number of processes that trained it (longer runs drift
apart, docs/scaling.md), and must not depend on who scheduled it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from normlab.cli import app

TINY = {
    "threads": 1,
    "seeds": 2,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"batch_size": 4, "steps": 6, "eval_interval": 3, "eval_windows": 4, "warmup": 1},
    "data": {"max_bytes": 300_000},
}
RUNS = ["layernorm-pre__s0", "layernorm-pre__s1", "rmsnorm-pre__s0", "rmsnorm-pre__s1"]
REL_TOL = 1e-5
WIDE = {"COLUMNS": "200"}


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args], env=WIDE)
    return result.exit_code, result.output


def losses(out: Path, run: str) -> list[float]:
    lines = (out / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["type"] == "train"]


def summary(out: Path, run: str) -> dict:
    return json.loads((out / "runs" / run / "summary.json").read_text())


def health(out: Path, run: str) -> list[dict]:
    lines = (out / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "health"]


def assert_same_health(a: Path, b: Path, run: str) -> None:
    """Norm health at every evaluation, of every layer, as on one process."""
    ha, hb = health(a, run), health(b, run)
    assert [r["step"] for r in ha] == [r["step"] for r in hb] and ha, (ha, hb)
    for ra, rb in zip(ha, hb, strict=True):
        assert ra["layers"].keys() == rb["layers"].keys(), run
        for layer, stats in ra["layers"].items():
            for key, value in stats.items():
                got = rb["layers"][layer][key]
                if isinstance(value, float):
                    assert got == pytest.approx(value, rel=1e-4, abs=1e-6), (run, layer, key)
                else:
                    assert got == value, (run, layer, key)


def assert_same_losses(a: Path, b: Path, run: str) -> None:
    la, lb = losses(a, run), losses(b, run)
    assert len(la) == len(lb) == TINY["train"]["steps"], (la, lb)
    for step, (x, y) in enumerate(zip(la, lb, strict=True), 1):
        assert abs(x - y) <= REL_TOL * abs(x), f"{run} step {step}: {x} vs {y}"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scale") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture(scope="module")
def reference(config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny grid on one process per run, local executor, with its report."""
    out = tmp_path_factory.mktemp("scale") / "local"
    code, output = invoke("--config", str(config), "--out", str(out))
    assert code == 0, output
    assert all(summary(out, r)["world_size"] == 1 for r in RUNS)
    return out


def test_ddp_two_processes_reproduce_one(config: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    code, output = invoke(
        "--config", str(config), "--seeds", "1", "--nproc-per-node", "2", "--out", str(out),
        "--no-report",
    )  # fmt: skip
    assert code == 0, output
    for run in ("layernorm-pre__s0", "rmsnorm-pre__s0"):
        assert_same_losses(reference, out, run)
        assert_same_health(reference, out, run)
        s = summary(out, run)
        assert s["world_size"] == 2 and s["parallel_mode"] == "ddp"
        assert len(s["rank_peak_memory_bytes"]) == len(s["rank_tokens_per_s"]) == 2
        assert s["total_tokens_per_s"] == pytest.approx(sum(s["rank_tokens_per_s"]))
        assert s["tokens_per_s"] == s["total_tokens_per_s"]
        assert s["final_val_bpb"] == pytest.approx(summary(reference, run)["final_val_bpb"], 1e-5)
        assert (
            json.loads((out / "runs" / run / "run.json").read_text())["scale"]["nproc_per_node"]
            == 2
        )


def test_plan_fsdp_run_and_xargs_grid(config: Path, reference: Path, tmp_path: Path) -> None:
    """``--plan`` prepares the folder and prints one command per run; FSDP2 on 2 processes
    reproduces the single-process losses; the plan's commands run by ``xargs -P 2``, then
    ``normlab report``, give the local grid's report numbers."""
    fsdp = tmp_path / "fsdp"
    result = CliRunner().invoke(
        app,
        ["compare", "--config", str(config), "--nproc-per-node", "2", "--fsdp", "--plan",
         "--out", str(fsdp)],
        env=WIDE,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (fsdp / "experiment.json").is_file()
    assert not (fsdp / "runs" / RUNS[0] / "summary.json").exists()
    code, output = invoke("--out", str(fsdp), "--run", "rmsnorm-pre__s1")
    assert code == 0, output
    assert_same_losses(reference, fsdp, "rmsnorm-pre__s1")
    assert_same_health(reference, fsdp, "rmsnorm-pre__s1")
    assert summary(fsdp, "rmsnorm-pre__s1")["parallel_mode"] == "fsdp"
    code, output = invoke("--out", str(fsdp), "--run", "rmsnorm-pre__s1")
    assert code == 0 and "already done" in output

    out = tmp_path / "plan"
    plan = subprocess.run(
        [sys.executable, "-m", "normlab", "compare", "--config", str(config), "--plan",
         "--out", str(out)],
        capture_output=True, text=True, check=True, env=_env(),
    )  # fmt: skip
    commands = plan.stdout.strip().splitlines()
    assert len(commands) == len(RUNS)
    assert all(c.startswith("normlab compare --out ") and " --run " in c for c in commands)
    subprocess.run(
        ["xargs", "-P", "2", "-I", "{}", "sh", "-c", "{}"],
        input=plan.stdout, text=True, check=True, env=_env(), capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "normlab", "report", str(out)], check=True, env=_env(),
        capture_output=True,
    )  # fmt: skip
    for run in RUNS:
        assert_same_losses(reference, out, run)
    assert _report_numbers(out) == _report_numbers(reference)


def _env() -> dict[str, str]:
    """This interpreter's ``normlab`` first on PATH, this checkout's sources importable."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    # a shared CI machine's memory is not the run's: keep Ray's node-wide OOM killer out of it
    ray_env = {"RAY_memory_monitor_refresh_ms": "0"}
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath, **ray_env}


def _report_numbers(out: Path) -> dict:
    """The report's numbers: every run's quality metric, and the analysis's recommendation."""
    analysis = json.loads((out / "summary.json").read_text())
    runs = {r: summary(out, r)["final_val_bpb"] for r in RUNS}
    return {"runs": runs, "recommendation": analysis["recommendation"]["headline"]}


def _ray_task_of(out: Path) -> int | None:
    """The pid of a Ray worker (``ray::normlab_run``) whose run has started training."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if b"normlab.experiment.execution.rank_entry" not in argv:
            continue
        run_dir = Path(argv[-2].decode() if argv[-1] == b"" else argv[-1].decode())
        if run_dir.parent.parent != out or not (run_dir / "metrics.jsonl").exists():
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        try:
            title = (Path("/proc") / str(parent) / "cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::"):
            return parent
    return None


def test_ray_executor_same_numbers_and_resumable_after_a_killed_worker(
    config: Path, reference: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    out = (tmp_path / "ray").resolve()
    cmd = [sys.executable, "-m", "normlab", "compare", "--config", str(config), "--executor",
           "ray", "--out", str(out), "--no-report"]  # fmt: skip
    grid = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killed, deadline = None, time.monotonic() + 120
    while killed is None and grid.poll() is None and time.monotonic() < deadline:
        killed = _ray_task_of(out)
        if killed is not None:
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    output = grid.communicate(timeout=300)[0].decode()
    assert killed is not None, output
    statuses = {r: summary(out, r)["status"] for r in RUNS}
    assert sorted(statuses.values()) == ["crashed", "finished", "finished", "finished"], output
    crashed = next(r for r, s in statuses.items() if s == "crashed")
    assert "Ray task failed" in summary(out, crashed)["error"]
    kept = {r: (out / "runs" / r / "summary.json").stat().st_mtime_ns for r in RUNS if r != crashed}

    again = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 of 4 runs already done" in again.stdout
    for run, mtime in kept.items():
        assert (out / "runs" / run / "summary.json").stat().st_mtime_ns == mtime
    for run in RUNS:
        assert summary(out, run)["status"] == "finished"
        assert summary(out, run)["final_val_bpb"] == summary(reference, run)["final_val_bpb"]
        assert losses(out, run) == losses(reference, run)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--executor", "slurm"], "--executor"),
        (["--fsdp"], "--fsdp"),
        (["--nnodes", "2"], "--rdzv-endpoint"),
    ],
)
def test_bad_scale_options_name_the_option(args: list[str], named: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = invoke(*args, "--out", str(out))
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("normlab compare: error:")]
    assert len(errors) == 1 and named in errors[0], output
    assert not out.exists()


def test_ray_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, output = invoke("--executor", "ray", "--out", str(tmp_path / "out"))
    assert code == 1
    assert "--executor ray" in output and "normlab[ray]" in output
    assert not (tmp_path / "out").exists()


def test_unreachable_ray_address_is_named(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    code, output = invoke(
        "--executor", "ray", "--ray-address", "127.0.0.1:1", "--out", str(tmp_path / "out")
    )
    assert code == 1
    errors = [line for line in output.splitlines() if line.startswith("normlab compare: error:")]
    assert len(errors) == 1 and "--ray-address" in errors[0], output
    assert not (tmp_path / "out").exists()


def test_run_needs_a_planned_folder(tmp_path: Path) -> None:
    code, output = invoke("--out", str(tmp_path), "--run", "layernorm-pre__s0")
    assert code == 1 and "--plan" in output
    code, output = invoke("--out", str(tmp_path), "--run", "x", "--seeds", "2")
    assert code == 2 and "--run" in output and "--seeds" in output


def test_dit_uneven_shards_reproduce_one_process(tmp_path: Path) -> None:
    """The DiT draws noises, times and dropped labels for the whole batch, then each rank keeps
    its rows: 5 rows over 2 ranks (3 + 2, loss weights 6/5 and 4/5) give one process's losses."""
    config = tmp_path / "dit.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "testbed": "dit",
                "device": "cpu",
                "threads": 1,
                "seeds": 1,
                "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
                "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
                "train": {"batch_size": 5, "warmup": 1, "eval_interval": 2, "steps": 4},
            }
        )
    )
    run = "adarms-pre__s0"
    outs = {}
    for n in ("1", "2"):
        outs[n] = tmp_path / f"n{n}"
        code, output = invoke(
            "--config", str(config), "--nproc-per-node", n, "--plan", "--out", str(outs[n])
        )
        assert code == 0, output
        code, output = invoke("--out", str(outs[n]), "--run", run)
        assert code == 0, output
    la, lb = losses(outs["1"], run), losses(outs["2"], run)
    assert len(la) == len(lb) == 4
    for x, y in zip(la, lb, strict=True):
        assert abs(x - y) <= REL_TOL * abs(x)
    one, two = summary(outs["1"], run), summary(outs["2"], run)
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=REL_TOL)


def test_step_timer_on_the_cpu_is_the_host_clock() -> None:
    import torch

    from normlab.experiment.training.step_timer import StepTimer

    timer = StepTimer(torch.device("cpu"))
    timer.start()
    time.sleep(0.02)
    assert 0.02 <= timer.stop() < 1.0


def test_a_crashed_rank_fails_its_run_and_the_grid_goes_on(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 of every run raises (a module of ``imports`` that fails under ``RANK=1``): each
    run is recorded ``crashed`` with rank 1's error, and the grid trains the next run."""
    (tmp_path / "fail_rank_one.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    raise RuntimeError('injected failure of rank 1')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    data = {**yaml.safe_load(config.read_text()), "imports": ["fail_rank_one"], "seeds": 1}
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    code, output = invoke("--config", str(broken), "--nproc-per-node", "2", "--out", str(out))
    assert code == 3, output  # every run crashed
    for run in ("layernorm-pre__s0", "rmsnorm-pre__s0"):
        s = summary(out, run)
        assert s["status"] == "crashed"
        assert s["error"].startswith("rank 1 of 2 failed"), s["error"]
        assert "injected failure of rank 1" in s["error"] + s["traceback"]
