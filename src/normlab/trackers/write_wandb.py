"""Write one run to a W&B offline run folder (``compare --log-to wandb``).

``wandb.init(mode="offline", dir=ROOT)`` writes ``ROOT/wandb/offline-run-<time>-<id>/``, which
``wandb sync`` uploads later if the user wants (nothing is sent while exporting). The project is
the compare folder's name, the run is named ``<arm>__s<seed>`` in the group of its arm, with
its identity (arm, norm, placement, precision, seed, testbed) and status as its config and the
factors as tags; its curves are logged at their steps and its summary as ``summary/<field>``
in the run's summary. The run's id is a digest of ``ROOT`` and its name, so exporting it again
replaces the folder an earlier attempt left (and a sync updates the same run).

Quiet and short-lived: no console capture, no system metrics, no machine, git or code records,
no requirements file; the W&B service process that ``wandb`` starts is ended by :func:`close`.
The library is ``wandb`` (extra ``trackers``).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

from normlab.trackers.exporting import RunExport

__all__ = ["OFFLINE_SETTINGS", "close", "run_id_of", "write_run"]

OFFLINE_SETTINGS: dict[str, Any] = {
    "mode": "offline",
    "silent": True,
    "console": "off",
    "disable_git": True,
    "save_code": False,
    "disable_job_creation": True,
    "x_disable_stats": True,
    "x_disable_meta": True,
    "x_disable_machine_info": True,
    "x_save_requirements": False,
}
"""The ``wandb.Settings`` of an export (those this version of wandb knows are used)."""
SUMMARY_PREFIX = "summary/"
_TAG_CHARS = 64
"""W&B's longest tag."""
_PROJECT_BAD = re.compile(r"[/\\#?%:]")


def _settings() -> Any:
    import wandb

    known = getattr(wandb.Settings, "model_fields", None)
    values = {k: v for k, v in OFFLINE_SETTINGS.items() if known is None or k in known}
    return wandb.Settings(**values)


def run_id_of(root: Path, name: str) -> str:
    """The W&B id of the run ``name`` exported to ``root``: 16 hex digits of SHA-256 of the
    absolute folder and the name."""
    text = f"{Path(root).absolute()}\0{name}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def write_run(run: RunExport, root: Path) -> str:
    """Write ``run`` as an offline run under ``root`` and return its folder."""
    import wandb

    root = Path(root).absolute()
    offline = root / "wandb"
    offline.mkdir(parents=True, exist_ok=True)
    run_id = run_id_of(root, run.name)
    for earlier in offline.glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(earlier, ignore_errors=True)
    settings = _settings()
    wandb.setup(settings=settings)
    tags = [
        str(run.identity[k])[:_TAG_CHARS]
        for k in ("norm", "placement", "precision")
        if k in run.identity
    ]
    handle = wandb.init(
        dir=str(root),
        project=_PROJECT_BAD.sub("-", run.experiment)[:128] or "normlab",
        name=run.name,
        id=run_id,
        group=str(run.identity.get("arm", run.name))[:128],
        config={**run.identity, "status": run.status},
        tags=tags,
        settings=settings,
        reinit="create_new",
    )
    try:
        for step, values in run.curves:
            handle.log(values, step=step)
        handle.summary.update({SUMMARY_PREFIX + k: v for k, v in run.summary.items()})
        handle.summary["status"] = run.status
    finally:
        handle.finish(exit_code=0)
    folders = sorted(offline.glob(f"offline-run-*-{run_id}"))
    return str(folders[-1]) if folders else str(offline)


def close() -> None:
    """End the W&B service process this export started (``wandb.teardown``)."""
    import wandb

    wandb.teardown()
