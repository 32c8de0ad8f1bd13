"""The names of the files and folders in the output folder of ``normlab compare``.

The layout (docs/run-format.md)::

    OUT/.lock  experiment.json  data/{data.json, tokens.u8}
        runs/<arm>__s<seed>/{run.json, metrics.jsonl, summary.json, samples.npy, reference.npy}
        summary.json  runs.csv  report.md  report.html  plots/<name>.png
        command.json  sequential.json (--until-decided)
        trackers/{exported.json, tensorboard/, mlflow/, wandb/} (--log-to)
        lr-sweep/lr=<rate>/ (--lr-sweep: a compare folder per rate, on the tuning seeds)

The training side writes everything up to the runs' files; the report side writes the rest
from those files alone. Both take the names from here.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "ANALYSIS_FILE",
    "COMMAND_FILE",
    "DATA_DIR",
    "DATA_INFO_FILE",
    "EXPERIMENT_FILE",
    "LADDER_FILE",
    "LOCK_FILE",
    "LR_SWEEP_DIR",
    "METRICS_FILE",
    "PLOTS_DIR",
    "REFERENCE_FILE",
    "REPORT_HTML_FILE",
    "REPORT_MD_FILE",
    "RUNS_CSV_FILE",
    "RUNS_DIR",
    "RUN_FILE",
    "RUN_ID_PATTERN",
    "SAMPLES_FILE",
    "SEQUENTIAL_FILE",
    "SUMMARY_FILE",
    "TOKENS_FILE",
    "TRACKERS_DIR",
    "TRACKERS_RECORD_FILE",
    "parse_run_id",
    "plot_path",
    "run_dir",
    "run_id",
]

LOCK_FILE = ".lock"
"""Held by the command that writes the folder (one writer at a time)."""
EXPERIMENT_FILE = "experiment.json"
LADDER_FILE = "ladder.json"
"""A ladder folder's plan (``compare --ladder``): the key, the rungs (each a compare folder
``<key>=<value>/`` beside it) and the target; the folder has no ``experiment.json``."""
"""The resolved experiment, written once every check has passed, before any run starts."""
LR_SWEEP_DIR = "lr-sweep"
"""``compare --lr-sweep``: the tuning runs, one compare folder per learning rate on the tuning
seeds: ``OUT/lr-sweep/lr=<rate>/`` beside a compare's own files, and in a ladder folder
``OUT/lr-sweep/<setting>/lr=<rate>/`` per rung swept
(:func:`normlab.run_format.folder.sweep_path`)."""
DATA_DIR = "data"
"""The data cache's folder."""
DATA_INFO_FILE = "data.json"
"""In :data:`DATA_DIR`: what the data is and how it was read (both testbeds)."""
TOKENS_FILE = "tokens.u8"
"""In :data:`DATA_DIR`: the GPT's token cache, train bytes then validation bytes (uint8)."""
RUNS_DIR = "runs"
SEQUENTIAL_FILE = "sequential.json"
"""``compare --until-decided``: the sequential plan, each look (seeds, boundaries, decision per
arm) and why the rounds stopped; ``normlab report`` shows it again."""
COMMAND_FILE = "command.json"
"""The flags of the last ``normlab compare`` that wrote the folder, so the report can print the
exact command that would settle an open question."""
"""One folder per run, named by :func:`run_id`."""

RUN_FILE = "run.json"
"""In a run folder: the run's resolved config, written before it trains."""
METRICS_FILE = "metrics.jsonl"
"""In a run folder: one JSON record per line, appended while it trains."""
SUMMARY_FILE = "summary.json"
"""In a run folder: the run's summary (see :mod:`normlab.run_format.fields`); at the top of the
folder, :data:`ANALYSIS_FILE` has the same name."""
SAMPLES_FILE = "samples.npy"
"""In a finished DiT run's folder: the first generated images, float32 [n, H, W]."""
REFERENCE_FILE = "reference.npy"
"""Next to :data:`SAMPLES_FILE`: validation images with the samples' labels."""

ANALYSIS_FILE = "summary.json"
"""At the top of the folder: the analysis of every run (written by the report)."""
RUNS_CSV_FILE = "runs.csv"
REPORT_MD_FILE = "report.md"
REPORT_HTML_FILE = "report.html"
PLOTS_DIR = "plots"

TRACKERS_DIR = "trackers"
"""``compare --log-to``: each tracker's offline store, one folder per kind
(``trackers/tensorboard``, ``trackers/mlflow``, ``trackers/wandb``)."""
TRACKERS_RECORD_FILE = "exported.json"
"""In :data:`TRACKERS_DIR`: which runs were exported to which tracker, and the exports that
failed (retried by the next command on the folder)."""

RUN_ID_PATTERN = re.compile(r"^(?P<arm>.+)__s(?P<seed>-?\d+)$")
"""A run folder's name: ``<arm>__s<seed>``."""


def run_id(arm: str, seed: int) -> str:
    """The id, and folder name, of the run of ``arm`` with ``seed``: ``<arm>__s<seed>``
    (e.g. ``rmsnorm-pre__s0``)."""
    return f"{arm}__s{seed}"


def parse_run_id(name: str) -> tuple[str, int] | None:
    """(arm, seed) of a run folder's name ``<arm>__s<seed>``, or None for another name."""
    match = RUN_ID_PATTERN.match(name)
    return (match["arm"], int(match["seed"])) if match else None


def run_dir(out: Path | str, run: str) -> Path:
    """The folder of the run ``run`` (a run id) in the output folder ``out``."""
    return Path(out) / RUNS_DIR / run


def plot_path(name: str) -> str:
    """A plot's path relative to the output folder: ``plots/<name>.png``."""
    return f"{PLOTS_DIR}/{name}.png"
