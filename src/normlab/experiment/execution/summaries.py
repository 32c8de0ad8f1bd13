"""The summary of a run that left none of its own: its fields in order, identity from its
config, metrics null, the error kept (``status`` :data:`normlab.run_format.CRASHED`)."""

from __future__ import annotations

from typing import Any

from normlab.run_format import CRASHED, testbed_format

__all__ = ["SUMMARY_FIELDS", "crashed_summary", "summary_fields"]

SUMMARY_FIELDS: tuple[str, ...] = testbed_format("gpt").summary_fields
"""The fields of a GPT run's summary; a DiT run's has its own validation fields instead of
``final_val_loss``, ``final_val_bpb``, ``best_val_bpb`` (see :func:`summary_fields`)."""


def summary_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The fields of the summary of the run ``spec``, in order (its testbed's
    :attr:`normlab.run_format.TestbedFormat.summary_fields`). Raises ``ValueError`` when
    ``spec`` names an unknown testbed."""
    return testbed_format(spec.get("testbed")).summary_fields


def crashed_summary(spec: dict[str, Any], error: str, trace: str) -> dict[str, Any]:
    """The summary of a run that raised: identity from ``spec``, metrics null, the error kept."""
    try:
        fields = summary_fields(spec)
    except ValueError:  # a run.json naming an unknown testbed still gets a crashed summary
        fields = SUMMARY_FIELDS
    summary: dict[str, Any] = dict.fromkeys(fields)
    for key in (
        "run_id", "arm", "seed", "norm", "placement", "precision", "n_params", "n_norm_params",
    ):  # fmt: skip
        summary[key] = spec.get(key)
    summary.update(
        status=CRASHED,
        device=spec.get("device"),
        threads=spec.get("threads"),
        data_fingerprint=spec.get("data", {}).get("fingerprint"),
        target_val_loss=spec.get("train", {}).get("target_val_loss"),
        error=error,
        traceback=trace,
    )
    return summary
