"""The records of a run's ``metrics.jsonl``: one JSON object per line, its kind in ``"type"``.

==================  ============================================================================
``train``           ``step`` (1-based), ``loss``, ``grad_norm``, ``clipped``, ``lr``,
                    ``step_time_s``, ``tokens_seen``
``eval``            ``step``, ``val_loss``, ``val_bpb`` (GPT only), ``tokens_seen``, ``elapsed_s``
``layer_grad_norms`` ``step``, ``norms``: {parameter group: L2 norm}
``anomaly``         ``step``, ``kind`` (one of :data:`ANOMALY_KINDS`), ``value``, ``z``
``health``          ``step``, ``layers``: {norm layer name: {``kind``, ``in_rms``, ``out_rms``,
                    ``xhat_ms``, ``xhat_mean``, ``xhat_var``, ``gain_mean``, ``gain_max_abs``,
                    ``formula_err``, ``calls``}} on a fixed validation batch, at every evaluation
``branch``          ``steps`` (the budget B), ``from_step``, ``status``, ``diverged_at``, the
                    ``eval`` values at step B (and ``full_`` ones with ``train.full_val``),
                    ``final_train_loss``, ``tokens_seen``, ``train_s``: a cooldown branched off
                    a wsd run (``train.branches``)
==================  ============================================================================
"""

from __future__ import annotations

__all__ = [
    "ANOMALY_KINDS",
    "ANOMALY_RECORD",
    "BRANCH_RECORD",
    "EVAL_RECORD",
    "GRAD_ANOMALIES",
    "GRAD_SPIKE",
    "HEALTH_RECORD",
    "HEALTH_STATS",
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
BRANCH_RECORD = "branch"
"""A shorter budget's cooldown, branched off the stable phase of a wsd run and trained to its
end as a run of that many steps would be (:mod:`normlab.experiment.training.branches`)."""
HEALTH_RECORD = "health"
"""Norm health: per norm layer, its input RMS, output RMS, statistics of x̂ recomputed from the
input (null where the layer's formula is unknown), of its gain and of the x̂ it returned, at
every evaluation
(:mod:`normlab.experiment.measure.health`)."""
HEALTH_STATS: tuple[str, ...] = (
    "in_rms",
    "out_rms",
    "xhat_ms",
    "xhat_mean",
    "xhat_var",
    "xhat_mean_rms",
    "gain_mean",
    "gain_max_abs",
    "formula_err",
    "out_xhat_ms",
)
"""The statistics of one layer in a ``health`` record, in order: √mean(x²) of its input and of
its output, mean(x̂²), mean(x̂), the per-token variance of x̂ averaged over tokens, the RMS over
tokens of each token's mean of x̂ (how far the inputs are from zero-mean, for RMSNorm), mean(g)
and max |g| of the gain, the relative RMS distance of its output from g ⊙ x̂ (+ β) computed with
its own formula, and mean(x̂²) of the x̂ the layer returned, read through its gain
(:mod:`normlab.experiment.measure.health` gives the formulas). ``xhat_mean_rms`` and ``out_xhat_ms``
are absent from records written before they were added: readers fall back as
:func:`normlab.analysis.health.health_value` says."""

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
