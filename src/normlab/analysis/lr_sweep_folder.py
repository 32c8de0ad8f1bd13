"""A learning-rate sweep on disk (``compare --lr-sweep``) → each arm's curve and best rate.

Each rate's tuning runs are an ordinary compare folder
(:func:`normlab.run_format.folder.sweep_path`). The loss of a tuning run is the testbed's
quality metric (the GPT's validation bits per byte), lower being better; a run that diverged,
or finished without a finite value, counts as diverged at its rate
(:func:`normlab.analysis.lr_sweep.select_learning_rates`). A tuning run that crashed or has not
finished leaves the choice undone: ``ValueError`` naming the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from normlab.analysis.lr_sweep import LrCurve, select_learning_rates
from normlab.analysis.runs import load_compare_folder
from normlab.run_format import DIVERGED, FINISHED, testbed_format

__all__ = ["read_sweep", "sweep_losses"]


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
