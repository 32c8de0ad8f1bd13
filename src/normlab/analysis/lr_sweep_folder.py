"""A learning-rate sweep on disk (``compare --lr-sweep``) → each arm's curve and best rate.

Each rate's tuning runs are an ordinary compare folder
(:func:`normlab.run_format.folder.sweep_path`). The loss of a tuning run is the testbed's
quality metric (the GPT's validation bits per byte), lower being better; a run that diverged,
or finished without a finite value, counts as diverged at its rate
(:func:`normlab.analysis.lr_sweep.select_learning_rates`). A tuning run that crashed or has not
finished leaves the choice undone: ``ValueError`` naming the run.

A plain compare (no ladder) that was swept has its tuning folders beside its own files;
:func:`compare_sweep` reads them again into the record its summary.json holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from normlab.analysis.lr_sweep import (
    PLAIN_SWEEP_SETTING,
    LrCurve,
    lr_sweep_record,
    select_learning_rates,
)
from normlab.analysis.runs import load_compare_folder
from normlab.run_format import DIVERGED, FINISHED, LR_SWEEP_DIR, testbed_format
from normlab.run_format import folder as run_folder

__all__ = ["compare_sweep", "read_sweep", "sweep_losses"]


def sweep_losses(
    folders: Mapping[float, Path],
) -> tuple[str, dict[str, dict[float, list[float | None]]]]:
    """The quality metric's name and {arm: {rate: [value per tuning seed]}} (None: diverged)
    of the compare folders ``folders`` ({rate: folder})."""
    losses: dict[str, dict[float, list[float | None]]] = {}
    metric = ""
    for rate, path in folders.items():
        folder = load_compare_folder(path)
        fmt = testbed_format(folder.testbed)
        metric = fmt.quality
        if not fmt.metric(metric).lower_is_better:
            raise ValueError(
                f"--lr-sweep: the {folder.testbed} testbed's {metric} is higher-is-better; "
                "expected a loss to minimise"
            )
        for arm in folder.arms:
            values: list[float | None] = []
            for run in folder.runs_of(arm):
                if run.status not in (FINISHED, DIVERGED):
                    raise ValueError(
                        f"--lr-sweep: the tuning run {run.path} is {run.status}; expected every "
                        "tuning run finished or diverged (run the same command again to redo it)"
                    )
                values.append(run.value(metric) if run.status == FINISHED else None)
            losses.setdefault(arm, {})[float(rate)] = values
    return metric, losses


def read_sweep(folders: Mapping[float, Path]) -> tuple[str, dict[str, LrCurve]]:
    """The quality metric and each arm's curve and best rate from the tuning folders
    ``folders`` ({rate: folder})."""
    metric, losses = sweep_losses(folders)
    return metric, select_learning_rates(losses)


def compare_sweep(out: Path, ran: Mapping[str, float] | None = None) -> dict[str, Any] | None:
    """The sweep record (:func:`normlab.analysis.lr_sweep.lr_sweep_record`, its one setting
    :data:`~normlab.analysis.lr_sweep.PLAIN_SWEEP_SETTING`) of the plain compare folder ``out``
    from its tuning folders ``out/lr-sweep/lr=<rate>/``
    (:func:`normlab.run_format.folder.tuning_folders`); the tuning seeds are those the tuning
    folders list. None without tuning folders. ``ValueError`` naming ``lr-sweep/`` when a
    tuning folder cannot be read (:func:`read_sweep`), or when an arm's best rate is not the
    rate ``ran`` (experiment.json's ``learning_rates``: {arm: the rate its comparison ran at})
    says, as when a later command swept other rates in the same folder."""
    folders = run_folder.tuning_folders(out)
    if not folders:
        return None
    try:
        curves = read_sweep(folders)[1]
        seeds = sorted(
            {s for p in folders.values() for s in run_folder.read_experiment(p)["seeds"]}
        )
    except ValueError as err:
        raise ValueError(f"{LR_SWEEP_DIR}/: {err}") from None
    record = lr_sweep_record({PLAIN_SWEEP_SETTING: curves}, seeds)
    chosen = record["chosen"][PLAIN_SWEEP_SETTING]
    differ = [
        f"{arm} {chosen[arm]:g} (ran at {float(rate):g})"
        for arm, rate in (ran or {}).items()
        if arm in chosen and float(rate) != chosen[arm]
    ]
    if differ:
        raise ValueError(
            f"{LR_SWEEP_DIR}/: the tuning folders {', '.join(f.name for f in folders.values())} "
            f"choose other rates than the comparison ran: {'; '.join(differ)}; expected only "
            "the rates of the sweep that chose them (move the others out of the folder)"
        )
    return record
