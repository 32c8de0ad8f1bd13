"""Write one run to TensorBoard's event files (``compare --log-to tensorboard``).

The run's folder is ``ROOT/<arm>__s<seed>`` (``tensorboard --logdir OUT/trackers/tensorboard``
shows every run): its curves as scalars at their steps, its summary as scalars
``summary/<field>`` at the last step, and its identity (arm, norm, placement, precision, seed,
testbed, status) as the hyperparameters of TensorBoard's HParams tab, with the summary's numbers
as its metrics. Written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard``
package, extra ``trackers``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from normlab.trackers.exporting import RunExport

__all__ = ["close", "write_run"]

SUMMARY_PREFIX = "summary/"
"""The summary's scalars are named ``summary/<field>``."""


def write_run(run: RunExport, root: Path) -> str:
    """Write ``run`` to ``root/<run.name>`` (what an earlier attempt left there is removed
    first) and return that folder."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    logdir = Path(root) / run.name
    shutil.rmtree(logdir, ignore_errors=True)
    with SummaryWriter(log_dir=str(logdir)) as writer:
        for step, values in run.curves:
            for name, value in values.items():
                writer.add_scalar(name, value, global_step=step)
        metrics = {SUMMARY_PREFIX + k: v for k, v in run.summary.items()}
        for name, value in metrics.items():
            writer.add_scalar(name, value, global_step=run.last_step)
        params: dict[str, str | int] = {**run.identity, "status": run.status}
        file_writer = writer._get_file_writer()
        for proto in hparams(params, metrics):
            file_writer.add_summary(proto, run.last_step)
    return str(logdir)


def close() -> None:
    """Nothing stays open between runs."""
