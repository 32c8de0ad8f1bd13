"""``compare --log-to``: a compare folder's runs exported offline to TensorBoard, MLflow and W&B,
each read back with that tracker's own reader; exporting again adds nothing; an unknown tracker
or a missing library is refused in one line; a failing export is recorded, never fatal.

The runs are the checked-in compare folder (tests/compare/fixtures/compare_run, 6 runs of the
GPT), so nothing trains here."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from normlab.run_format import EVAL_RECORD, TRACKERS_DIR, TRACKERS_RECORD_FILE, TRAIN_RECORD
from normlab.run_format.folder import read_records, read_summary, run_folders
from normlab.trackers import exporting, write_mlflow, write_tensorboard
from normlab.trackers.exporting import (
    TRACKER_KINDS,
    Exporter,
    check_installed,
    curve_points,
    parse_kinds,
)

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"


def _export(out: Path, kinds: tuple[str, ...] = TRACKER_KINDS) -> tuple[dict, list[str]]:
    said: list[str] = []
    exporter = Exporter(out, kinds, said.append)
    try:
        done = exporter.export([p.name for p in run_folders(out)])
    finally:
        exporter.close()
    return done, said


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fixture's folder, copied, with every run exported to the three trackers."""
    out = tmp_path_factory.mktemp("log_to") / "my-compare"
    shutil.copytree(FIXTURE, out)
    done, said = _export(out)
    assert all(len(done[kind]) == 6 for kind in TRACKER_KINDS), (done, said)
    yield out


def _runs(out: Path) -> dict[str, Path]:
    return {p.name: p for p in run_folders(out)}


def test_curves_hold_every_number_of_the_records() -> None:
    records = [
        {"type": "train", "step": 2, "loss": 1.5, "clipped": True, "note": "x"},
        {"type": "eval", "step": 2, "val_loss": 2.0},
        {"type": "train", "step": 1, "loss": None, "grad_norm": 3.0},
        {"type": "health", "step": 1, "layers": {"b0.ln": {"xhat_ms": 0.99}}},
        {"type": "anomaly", "step": 1, "kind": "loss_spike", "value": 9.0, "z": 7.5},
        {"type": "train", "loss": 4.0},  # no step: not a point of a curve
    ]
    assert curve_points(records) == [
        (
            1,
            {
                "train/grad_norm": 3.0,
                "health/layers/b0.ln/xhat_ms": 0.99,
                "anomaly/loss_spike/value": 9.0,
                "anomaly/loss_spike/z": 7.5,
            },
        ),
        (2, {"train/loss": 1.5, "train/clipped": 1.0, "eval/val_loss": 2.0}),
    ]


def test_tensorboard_holds_each_run_under_its_name(exported: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import (
        TENSORS,
        EventAccumulator,
    )
    from tensorboard.plugins.hparams import plugin_data_pb2

    root = exported / TRACKERS_DIR / "tensorboard"
    assert sorted(p.name for p in root.iterdir()) == sorted(_runs(exported))
    for name, folder in _runs(exported).items():
        acc = EventAccumulator(str(root / name), size_guidance={TENSORS: 0})
        acc.Reload()
        train = read_records(folder, TRAIN_RECORD)
        losses = acc.Scalars("train/loss")
        assert [e.step for e in losses] == [r["step"] for r in train]
        assert [e.value for e in losses] == pytest.approx([r["loss"] for r in train], rel=1e-6)
        evals = read_records(folder, EVAL_RECORD)
        assert [e.step for e in acc.Scalars("eval/val_bpb")] == [r["step"] for r in evals]
        summary = read_summary(folder)
        assert summary is not None
        (final,) = acc.Scalars("summary/final_val_bpb")
        assert final.value == pytest.approx(summary["final_val_bpb"], rel=1e-6)
        assert final.step == train[-1]["step"]
        start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
        assert hparams["arm"].string_value == summary["arm"]
        assert hparams["norm"].string_value == summary["norm"]
        assert hparams["seed"].number_value == summary["seed"]
        assert hparams["status"].string_value == "finished"


def test_mlflow_holds_each_run_in_the_folders_experiment(exported: Path) -> None:
    with write_mlflow.store_environment():
        client = write_mlflow.file_store_client(exported / TRACKERS_DIR / "mlflow")
        experiment = client.get_experiment_by_name("my-compare")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.run_name for r in runs) == sorted(_runs(exported))
        for run in runs:
            folder = _runs(exported)[run.info.run_name]
            summary = read_summary(folder)
            assert summary is not None
            params, tags = run.data.params, run.data.tags
            assert (params["arm"], params["norm"], params["placement"], params["seed"]) == (
                summary["arm"],
                summary["norm"],
                summary["placement"],
                str(summary["seed"]),
            )
            assert tags["status"] == "finished" and tags["normlab.run_id"] == folder.name
            history = client.get_metric_history(run.info.run_id, "train/grad_norm")
            train = read_records(folder, TRAIN_RECORD)
            points = sorted((m.step, m.value) for m in history)
            assert [step for step, _ in points] == [r["step"] for r in train]
            assert [v for _, v in points] == pytest.approx([r["grad_norm"] for r in train])
            got = run.data.metrics["summary/tokens_per_s"]
            assert got == pytest.approx(summary["tokens_per_s"])
            assert run.data.metrics["summary/peak_memory_bytes"] == summary["peak_memory_bytes"]


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of a W&B offline run file (``run-<id>.wandb``): a 7-byte header, then
    LevelDB-style log blocks of 32 KiB whose chunks (7-byte header: CRC, length, type
    full / first / middle / last) hold W&B's own protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            pos += block - pos % block if pos % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(pending)


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_curves_config_and_summary(exported: Path) -> None:
    offline = exported / TRACKERS_DIR / "wandb" / "wandb"
    files = sorted(offline.glob("offline-run-*/run-*.wandb"))
    assert len(files) == 6
    seen = set()
    for path in files:
        records = list(_wandb_records(path))
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        seen.add(run.display_name)
        assert run.project == "my-compare"
        folder = _runs(exported)[run.display_name]
        summary = read_summary(folder)
        assert summary is not None
        config = {_item_key(i): json.loads(i.value_json) for i in run.config.update}
        assert (config["arm"], config["seed"], config["status"]) == (
            summary["arm"],
            summary["seed"],
            "finished",
        )
        assert set(run.tags) == {summary["norm"], summary["placement"]}
        losses = {}
        for r in records:
            if r.WhichOneof("record_type") == "history":
                items = {_item_key(i): json.loads(i.value_json) for i in r.history.item}
                if "train/loss" in items:
                    losses[items["_step"]] = items["train/loss"]
        train = read_records(folder, TRAIN_RECORD)
        assert losses == pytest.approx({r["step"]: r["loss"] for r in train})
        final: dict[str, Any] = {}
        for r in records:
            if r.WhichOneof("record_type") == "summary":
                final.update({_item_key(i): json.loads(i.value_json) for i in r.summary.update})
        assert final["summary/final_val_bpb"] == pytest.approx(summary["final_val_bpb"])
        assert final["status"] == "finished"
    assert seen == set(_runs(exported))


def _counts(out: Path) -> tuple[int, int, int]:
    """Event files, MLflow runs that are not deleted, W&B run folders."""
    root = out / TRACKERS_DIR
    with write_mlflow.store_environment():
        client = write_mlflow.file_store_client(root / "mlflow")
        experiment = client.get_experiment_by_name(out.name)
        live = len(client.search_runs([experiment.experiment_id]))
    events = len(list((root / "tensorboard").glob("*/events.out.tfevents.*")))
    return events, live, len(list((root / "wandb" / "wandb").glob("offline-run-*")))


def test_exporting_again_adds_nothing_even_without_the_record(exported: Path) -> None:
    assert _counts(exported) == (6, 6, 6)
    done, said = _export(exported)
    assert done == {kind: [] for kind in TRACKER_KINDS} and not said
    assert _counts(exported) == (6, 6, 6)
    # the record lost (or an export cut short): each run is written again, replacing itself
    (exported / TRACKERS_DIR / TRACKERS_RECORD_FILE).unlink()
    done, _ = _export(exported)
    assert all(len(done[kind]) == 6 for kind in TRACKER_KINDS)
    assert _counts(exported) == (6, 6, 6)


@pytest.mark.parametrize(
    ("value", "words"),
    [("tensorboard,comet", "unknown tracker 'comet'"), ("", "unknown tracker ''")],
)
def test_unknown_tracker_is_named(value: str, words: str) -> None:
    with pytest.raises(ValueError, match=r"^--log-to: ") as err:
        parse_kinds(value)
    assert words in str(err.value) and "tensorboard, mlflow, wandb" in str(err.value)
    assert parse_kinds("wandb, tensorboard,wandb") == ("wandb", "tensorboard")


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    check_installed(["tensorboard", "mlflow"])
    with pytest.raises(ValueError, match=r"^--log-to wandb: ") as err:
        check_installed(["tensorboard", "wandb"])
    assert 'pip install "normlab[trackers]"' in str(err.value)


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--log-to", "tensorboard,neptune"], 2, "--log-to: unknown tracker 'neptune'"),
        (["--log-to", "mlflow,wandb"], 1, "wandb package is not installed; install the"),
    ],
)
def test_compare_refuses_before_writing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, words: str
) -> None:
    from typer.testing import CliRunner

    from normlab.cli import app

    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "out"
    script = ["--script", "t {norm}", "--metric", "m", "--norms", "a,b"]
    for flags in (script, ["--steps", "2", "--warmup", "0"]):
        result = CliRunner().invoke(app, ["compare", *flags, *args, "--out", str(out)])
        assert result.exit_code == code, result.output
        assert words in result.output and not out.exists()


def test_a_failing_export_is_recorded_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "cmp"
    shutil.copytree(FIXTURE, out)
    real = write_tensorboard.write_run

    def broken(run: exporting.RunExport, root: Path) -> str:
        if run.name == "rmsnorm-pre__s1":
            raise OSError("disk quota exceeded")
        return real(run, root)

    monkeypatch.setattr(write_tensorboard, "write_run", broken)
    done, said = _export(out, ("tensorboard",))
    assert len(done["tensorboard"]) == 5 and "rmsnorm-pre__s1" not in done["tensorboard"]
    (line,) = [s for s in said if "failed" in s]
    assert "rmsnorm-pre__s1: export to tensorboard failed" in line and "disk quota" in line
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    assert "disk quota exceeded" in record["failed"]["tensorboard"]["rmsnorm-pre__s1"]
    monkeypatch.setattr(write_tensorboard, "write_run", real)
    done, _ = _export(out, ("tensorboard",))
    assert done == {"tensorboard": ["rmsnorm-pre__s1"]}
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    assert record["failed"]["tensorboard"] == {} and len(record["exported"]["tensorboard"]) == 6
