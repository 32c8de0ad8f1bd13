"""The records of a run's ``metrics.jsonl``: one JSON object per line, its kind in ``"type"``.

==================  ============================================================================
``train``           ``step`` (1-based), ``loss``, ``grad_norm``, ``clipped``, ``lr``,
                    ``step_time_s``, ``tokens_seen``
``eval``            ``step``, ``val_loss``, ``val_bpb`` (GPT only), ``tokens_seen``, ``elapsed_s``
``layer_grad_norms`` ``step``, ``norms``: {parameter group: L2 norm}
``anomaly``         ``step``, ``kind`` (one of :data:`ANOMALY_KINDS`), ``value``, ``z``
==================  ============================================================================
"""

from __future__ import annotations

__all__ = [
    "ANOMALY_KINDS",
    "ANOMALY_RECORD",
    "EVAL_RECORD",
    "GRAD_ANOMALIES",
    "GRAD_SPIKE",
    "LAYER_GRAD_RECORD",
    "LOSS_ANOMALIES",
    "LOSS_SPIKE",
    "NONFINITE_GRAD",
    "NONFINITE_LOSS",
    "TRAIN_RECORD",
]

TRAIN_RECORD = "train"
"""One training step."""
EVAL_RECORD = "eval"
"""One validation (step 0, every ``eval_interval`` steps, the last step)."""
LAYER_GRAD_RECORD = "layer_grad_norms"
"""Gradient norms per parameter group, every ``layer_grad_interval`` steps."""
ANOMALY_RECORD = "anomaly"
"""A spike or a non-finite value."""

LOSS_SPIKE = "loss_spike"
GRAD_SPIKE = "grad_spike"
NONFINITE_LOSS = "nonfinite_loss"
NONFINITE_GRAD = "nonfinite_grad"
ANOMALY_KINDS: tuple[str, ...] = (LOSS_SPIKE, GRAD_SPIKE, NONFINITE_LOSS, NONFINITE_GRAD)
"""The ``kind`` of an ``anomaly`` record."""
LOSS_ANOMALIES: tuple[str, ...] = (LOSS_SPIKE, NONFINITE_LOSS)
"""Anomalies of the loss."""
GRAD_ANOMALIES: tuple[str, ...] = (GRAD_SPIKE, NONFINITE_GRAD)
"""Anomalies of the gradient norm."""
