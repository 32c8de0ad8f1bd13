"""An ``hf:`` model's classes load torchao (when installed) without its import-time warnings:
the CUDA extensions a CPU-only torch cannot load and the Enum pytree registrations newer torch
deprecates are not normlab's user's business (normlab._quiet)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

PROGRAM = """
from normlab.models.external.hf import build_hf_model, hf_config
settings = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                intermediate_size=32, num_hidden_layers=1)
build_hf_model(hf_config("llama", settings, 64), 0)
from normlab.experiment.measure.posttrain import import_torchao
import_torchao()
print("built")
"""


def test_building_an_hf_model_prints_no_torchao_import_warnings() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    noise = [
        line
        for line in done.stderr.splitlines()
        if "Failed to load" in line or "_pytree" in line or "torchao" in line
    ]
    assert noise == [], "\n".join(noise)
