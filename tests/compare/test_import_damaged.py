"""``normlab report --import`` of a source whose file of one run was cut while it was written (a
crash mid-write, the common case for a tracker file) or damaged: the file, the run and how far
it was read are named, in the terminal and the report, and that run is left out of the verdict
(its seed unpaired), never judged on the values read before the damage. Damage that cannot be
pinned on one run refuses the import in one line naming ``--import``.

Every store is written by the tracker's own library (TensorBoard's ``SummaryWriter``, MLflow's
file store, W&B offline runs) or as the table a logger writes; then one file is cut to half its
bytes (or one byte of it flipped).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normlab.analysis.runs import load_compare_folder
from normlab.analysis.summary import analyze
from normlab.cli import app
from normlab.run_format.folder import read_experiment
from normlab.run_format.imported import import_record
from normlab.trackers.importing import ImportPlan, import_runs
from normlab.trackers.tracked import TrackerImportError

ARMS = ("ln", "rms")
STEPS = range(1, 6)
RULES = (r"^(ln|rms)_s\d+$", r"_s(\d+)$")
CUT = ("rms", 2)
"""The run whose file is cut."""


def _val(arm: str, seed: int, step: int) -> float:
    return 3.0 / step + 0.1 * seed + (0.01 if arm == "rms" else 0.0)


def _name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def _halve(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _check_left_out(plan: ImportPlan, out: Path, file: Path, words: str) -> str:
    """The cut run is listed as left out for its damaged source (the file, what is wrong, how
    far it was read), has no run folder, and its seed is unpaired in the verdict. Returns the
    reason."""
    assert CUT not in plan.runs
    (left,) = [s for s in plan.skipped if s["run"] == _name(*CUT)]
    assert (left.get("arm"), left.get("seed")) == CUT
    reason = left["reason"]
    assert reason.startswith(f"its source is damaged: '{file}' {words}"), reason
    assert "never judged on what was read before the damage" in reason
    assert not (out / "runs" / "rms__s2").exists()
    record = import_record(read_experiment(out))
    assert record is not None and record["seeds"]["2"] == {"ln": 5}
    analysis = analyze(load_compare_folder(out))
    assert analysis["comparisons"]["rms"]["final_val_loss"]["n_pairs"] == 2  # seeds 0 and 1
    return reason


def _write_tensorboard(logs: Path, seeds: int = 3) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for arm in ARMS:
        for seed in range(seeds):
            with SummaryWriter(log_dir=str(logs / _name(arm, seed))) as writer:
                for step in STEPS:
                    writer.add_scalar("val_loss", _val(arm, seed, step), step)


def _event_file(logs: Path) -> Path:
    (file,) = (logs / _name(*CUT)).glob("events.out.tfevents.*")
    return file


def test_a_tensorboard_event_file_cut_in_half_is_named_and_left_out(tmp_path: Path) -> None:
    """The brief's case: 3 seeds × 2 arms, 5 steps; rms seed 2's event file cut to half its
    bytes. TensorBoard's reader stops quietly at the cut; the import names the file, the run
    and the last step read, in the terminal and the report, and judges seeds 0 and 1 only."""
    logs = tmp_path / "tb"
    _write_tensorboard(logs)
    file = _event_file(logs)
    _halve(file)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "report", "--import", f"tensorboard:{logs}", "--arm-from", RULES[0],
            "--seed-from", RULES[1], "--metric", "val_loss", "--margin", "0.05",
            "--out", str(out),
        ],
        env={"COLUMNS": "1000"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("left out rms_s2"))
    assert line.startswith(f"left out rms_s2 (arm rms, seed 2): its source is damaged: '{file}'")
    assert "ends mid-record after byte" in line and "(cut while it was written)" in line
    assert "read up to step 1;" in line  # the records before the cut: step 1 only
    assert "unpaired: seed 2 (rms_s2 left out)" in result.stdout
    assert "rms to step 1" not in result.stdout  # no longer judged on its step-1 value
    report = (out / "report.md").read_text(encoding="utf-8")
    assert f"rms_s2 (its source is damaged: '{file}' ends mid-record" in report
    assert "unpaired: seed 2 (rms_s2 left out)" in report
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["comparisons"]["rms"]["final_val_loss"]["n_pairs"] == 2


def test_a_tensorboard_record_that_fails_its_checksum_is_named(tmp_path: Path) -> None:
    logs = tmp_path / "tb"
    _write_tensorboard(logs)
    file = _event_file(logs)
    data = bytearray(file.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF
    file.write_bytes(bytes(data))
    out = tmp_path / "out"
    plan = import_runs(f"tensorboard:{logs}", *RULES, "val_loss", out, margin=0.05)
    reason = _check_left_out(plan, out, file, "holds a record that fails its checksum after byte")
    assert "(damaged); read up to step" in reason


def test_an_event_file_that_is_not_one_is_named_with_nothing_read(tmp_path: Path) -> None:
    logs = tmp_path / "tb"
    _write_tensorboard(logs)
    file = _event_file(logs)
    file.write_bytes(b"not an event file at all, nothing TensorBoard can read")
    out = tmp_path / "out"
    plan = import_runs(f"tensorboard:{logs}", *RULES, "val_loss", out, margin=0.05)
    reason = _check_left_out(plan, out, file, "holds a record that fails its checksum")
    assert "read no step;" in reason


def _write_mlflow(store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Six runs named ``<arm>_s<seed>`` with val_loss and loss at steps 1–5; the folder of the
    run to cut."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("norms")
    folders = {}
    for arm in ARMS:
        for seed in range(3):
            run = client.create_run(experiment, run_name=_name(arm, seed))
            client.log_param(run.info.run_id, "norm", arm)
            for step in STEPS:
                client.log_metric(run.info.run_id, "val_loss", _val(arm, seed, step), step=step)
                client.log_metric(run.info.run_id, "loss", _val(arm, seed, step) + 1, step=step)
            client.set_terminated(run.info.run_id)
            folders[arm, seed] = store / experiment / run.info.run_id
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    return folders[CUT]


@pytest.mark.parametrize("keep", ["half", "two fields"])
def test_an_mlflow_metric_file_cut_mid_line_is_named_and_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: str
) -> None:
    """MLflow's client refuses the whole store for a cut line of one field, and silently reads
    one of two (``timestamp value``) as a value at step 0: the import names the file and the
    step of its last whole line, and reads the other runs one by one."""
    store = tmp_path / "mlruns"
    file = _write_mlflow(store, monkeypatch) / "metrics" / "val_loss"
    lines = file.read_bytes().splitlines(keepends=True)
    if keep == "half":
        _halve(file)
        whole = file.read_bytes().count(b"\n")
    else:  # the fourth line cut after its value's first digits: "<timestamp> 0."
        whole = 3
        file.write_bytes(b"".join(lines[:whole]) + lines[whole].split()[0] + b" 1.")
    out = tmp_path / "out"
    plan = import_runs(f"mlflow:{store}", *RULES, "val_loss", out, margin=0.05)
    reason = _check_left_out(plan, out, file, "ends mid-line: its last line has no line end")
    assert f"read up to step {whole};" in reason
    assert plan.runs["ln", 2].series["loss"][-1] == (5, pytest.approx(_val("ln", 2, 5) + 1))


def test_a_wandb_log_cut_in_half_is_named_and_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B's reader reads a cut log up to the cut and says so on its standard error (the run
    then has no exit record, like a run still going): the import names the file as cut."""
    import wandb

    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # wandb.init sets it; undone after
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # wandb.init replaces it
    settings = wandb.Settings(
        silent=True, console="off", x_disable_stats=True, disable_git=True, save_code=False
    )
    try:
        for arm in ARMS:
            for seed in range(3):
                run = wandb.init(
                    mode="offline", dir=tmp_path, project="norms", name=_name(arm, seed),
                    settings=settings,
                )  # fmt: skip
                for step in STEPS:
                    run.log({"val_loss": _val(arm, seed, step)}, step=step)
                run.finish()
    finally:
        wandb.teardown()
    logs = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    file = next(f for f in logs if _name(*CUT).encode() in f.read_bytes())
    _halve(file)
    out = tmp_path / "out"
    plan = import_runs(f"wandb:{tmp_path / 'wandb'}", *RULES, "val_loss", out, margin=0.05)
    reason = _check_left_out(plan, out, file, "is cut short or damaged (wandb: ")
    assert "incomplete" in reason and "read up to step" in reason


def _table_rows() -> list[dict[str, object]]:
    return [
        {"run": _name(arm, seed), "step": step, "val_loss": _val(arm, seed, step)}
        for arm in ARMS
        for seed in range(3)
        for step in STEPS
    ]


def _write_table(path: Path, rows: list[dict[str, object]], kind: str) -> None:
    if kind == "csv":
        columns = list(rows[0])
        lines = [",".join(columns), *(",".join(str(r[c]) for c in columns) for r in rows)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_table_with_one_file_per_run_cut_mid_line(tmp_path: Path, kind: str) -> None:
    """One file per run (a logger's metrics file): rms seed 2's cut mid-row. Its last row,
    which may hold a number cut short, is never read."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for arm in ARMS:
        for seed in range(3):
            mine = [{"step": s, "val_loss": _val(arm, seed, s)} for s in STEPS]
            _write_table(logs / f"{_name(arm, seed)}.{kind}", mine, kind)
    file = logs / f"{_name(*CUT)}.{kind}"
    text = file.read_text(encoding="utf-8").rstrip("\n")
    file.write_text(text[:-2], encoding="utf-8")  # the last value loses its last digits
    out = tmp_path / "out"
    plan = import_runs(f"{kind}:{logs}", *RULES, "val_loss", out, margin=0.05)
    last_line = 6 if kind == "csv" else 5
    reason = _check_left_out(
        plan, out, file, f"ends mid-line: its last line, line {last_line}, has no line end"
    )
    assert "read up to step 4;" in reason


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_table_with_a_run_column_cut_mid_row(tmp_path: Path, kind: str) -> None:
    """One file holding every run: a row cut after its run cell is that run's damage; a row cut
    inside its run cell cannot be pinned on a run, so the import is refused, naming --import,
    the file and how far it was read."""
    rows = _table_rows()
    rows = [r for r in rows if r["run"] != _name(*CUT)] + [
        r for r in rows if r["run"] == _name(*CUT)
    ]  # rms seed 2's rows last
    file = tmp_path / f"runs.{kind}"
    _write_table(file, rows, kind)
    text = file.read_text(encoding="utf-8").rstrip("\n")
    file.write_text(text[:-3], encoding="utf-8")
    out = tmp_path / "out"
    plan = import_runs(f"{kind}:{file}", *RULES, "val_loss", out, margin=0.05)
    reason = _check_left_out(plan, out, file, "ends mid-line: its last line, line")
    assert "read up to step 4;" in reason
    head, _, last = text.rpartition("\n")
    file.write_text(head + "\n" + last[:4], encoding="utf-8")  # cut inside the run's name
    with pytest.raises(TrackerImportError) as refused:
        import_runs(f"{kind}:{file}", *RULES, "val_loss", tmp_path / "out2", margin=0.05)
    message = str(refused.value)
    assert message.startswith(f"--import: '{file}' ends mid-line: its last line, line "), message
    assert "read up to step 5; the run of that line cannot be told" in message
    assert not (tmp_path / "out2").exists()


def test_a_complete_json_line_without_a_line_end_is_whole(tmp_path: Path) -> None:
    """A JSON object is whole or not valid: the last line of a JSON Lines file, complete but
    without a line end, is read (a CSV row cannot be told whole, so there it is cut)."""
    file = tmp_path / "runs.jsonl"
    _write_table(file, _table_rows(), "jsonl")
    file.write_text(file.read_text(encoding="utf-8").rstrip("\n"), encoding="utf-8")
    plan = import_runs(f"jsonl:{file}", *RULES, "val_loss", tmp_path / "out", margin=0.05)
    assert plan.skipped == [] and len(plan.runs) == 6
