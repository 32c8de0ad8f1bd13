"""Tiny runs of the training loop in this process, for the tests of its options (schedule,
branches, seeds, evaluation variants): a config → the planned run configs → ``train_run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from normlab._io import write_json_atomic
from normlab.data import prepare_shapes, prepare_tokens
from normlab.experiment.config import validate_config
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.training.train import train_run

TIMING = frozenset({"step_time_s", "elapsed_s", "train_s"})
"""Record fields that measure time: left out when records are compared."""


def write_corpus(root: Path) -> Path:
    """A small folder of Python-like text files."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(8):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    return root


def gpt_config(corpus: Path, train: dict[str, Any], **top: Any) -> dict[str, Any]:
    """A tiny GPT experiment (one seed unless ``top`` says otherwise)."""
    return {
        "seeds": 1,
        "threads": 1,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
        "train": {"batch_size": 2, "warmup": 2, "eval_interval": 4, "eval_windows": 4, **train},
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus)},
        **top,
    }


def dit_config(train: dict[str, Any], **top: Any) -> dict[str, Any]:
    """A tiny DiT experiment on 8×8 shapes."""
    return {
        "testbed": "dit",
        "seeds": 1,
        "threads": 1,
        "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
        "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
        "train": {"batch_size": 4, "warmup": 2, "eval_interval": 4, **train},
        "anomaly": {"window": 3, "warmup": 3},
        **top,
    }


def lm_config(corpus: Path, train: dict[str, Any], **top: Any) -> dict[str, Any]:
    """A tiny lm experiment: the factory source of tests/compare/test_model_sources.py."""
    return {
        "testbed": "lm",
        "seeds": 1,
        "threads": 1,
        "lm": {
            "model": "test_model_sources:tiny_lm",
            "model_set": {"d_model": 16, "n_layers": 1},
            "context": 16,
        },
        "train": {"batch_size": 2, "warmup": 2, "eval_interval": 4, "eval_windows": 4, **train},
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus)},
        **top,
    }


def plan(config: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """The run configs of ``config`` with its data prepared under ``out/data``."""
    cfg = validate_config(config)
    if cfg.testbed == "dit":
        s = cfg.shapes
        info = prepare_shapes(out / "data", s.image_size, s.patch_size, s.n_train, s.n_val, s.seed)
    else:
        info = prepare_tokens(out / "data", cfg.data.path)
    return plan_runs(cfg, "cpu", 1, info)


def train(spec: dict[str, Any], out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train the run ``spec`` under ``out/runs/<id>``: its summary and its records."""
    run_dir = out / "runs" / spec["run_id"]
    write_json_atomic(run_dir / "run.json", spec)
    summary = train_run(spec, run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


def train_one(config: dict[str, Any], out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Plan ``config`` and train its first run."""
    return train(plan(config, out)[0], out)


def untimed(records: list[dict[str, Any]], drop_types: tuple[str, ...] = ()) -> list[dict]:
    """The records without their timing fields, and without the record types ``drop_types``."""
    return [
        {k: v for k, v in r.items() if k not in TIMING}
        for r in records
        if r["type"] not in drop_types
    ]
