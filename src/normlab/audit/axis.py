"""Which inputs each output depends on: the axis the statistic runs over.

A per-token norm's output y[i, k] depends on the whole row x[i, :] and on nothing else. One
element x[i0, k0] is moved far (30 row RMS) and the outputs that change are located:

- only y[i0, k0]: element-wise (DyT, an activation, the identity): not a normaliser;
- the rest of row i0 and no other row: per row, as the contract says;
- column k0 of other rows: the statistic runs over the rows — the batch axis of [N, D];
- every row: the statistic runs over the whole tensor (a flattened view).

The same probe on [B, T, D] input (the rows of the 2-D probe, reshaped) tells a statistic over
the sequence (dim 1, a middle dim) from one over the batch (dim 0). An output "changes" when it
moves by more than 4 units of rounding of its dtype (rows that do not depend on x[i0, k0] come
out bit for bit the same in any correct implementation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from normlab.audit.basics import CALL_ERRORS, NormFn, finite_call, rounding
from normlab.audit.findings import DEFECT, NOTE, OK, Finding

BUMP = 30.0  # the moved element goes to 30 × its row's RMS


@dataclass
class AxisResult:
    """``kind``: "row", "element", "constant", "rows", "tensor", "sequence", "batch" or
    "layout"; ``finding`` says it."""

    kind: str
    finding: Finding

    @property
    def per_row(self) -> bool:
        return self.kind == "row"


def _changed(y0: torch.Tensor, y1: torch.Tensor) -> torch.Tensor:
    a, b = y0.double(), y1.double()
    tol = 4 * rounding(y0.dtype) * (a.abs() + b.abs()) + 1e-30
    return (a - b).abs() > tol


def _bumped(x: torch.Tensor, index: tuple[int, ...]) -> torch.Tensor:
    out = x.clone()
    row = x[index[:-1]].double()
    out[index] += BUMP * float(row.pow(2).mean().sqrt().clamp_min(1.0))
    return out


def probe_rows(f: NormFn, x: torch.Tensor, y: torch.Tensor) -> AxisResult:
    """The dependence map on [N, D] input (N >= 4, D >= 4)."""
    i0, k0 = 1, 2
    ch = _changed(y, finite_call(f, _bumped(x, (i0, k0)), "axis"))
    others = torch.ones(x.shape[0], dtype=torch.bool)
    others[i0] = False
    cols = torch.ones(x.shape[1], dtype=torch.bool)
    cols[k0] = False
    same_row = bool(ch[i0, cols].any())
    other_col_k0 = bool(ch[others, k0].any())
    other_elsewhere = bool(ch[others][:, cols].any())
    probe = "axis"
    if other_elsewhere or (other_col_k0 and same_row):
        return AxisResult(
            "tensor",
            Finding(
                probe, DEFECT,
                "moving one input changes outputs of other rows: the statistic runs over the "
                "whole tensor (several rows and columns), not over each row's D values",
                diagnosis="statistic over the wrong axis",
            ),
        )  # fmt: skip
    if other_col_k0:
        return AxisResult(
            "rows",
            Finding(
                probe, DEFECT,
                "moving x[i, k] changes column k of the other rows and nothing else in row i: "
                "the statistic runs over the rows (the batch, dim 0 of [N, D]; BatchNorm's "
                "axis), one per channel, instead of over each row's D values",
                diagnosis="statistic over the wrong axis (batch / rows)",
            ),
        )  # fmt: skip
    if not same_row:
        kind = "element" if bool(ch[i0, k0]) else "constant"
        what = (
            "it acts element-wise: changing one input leaves the other outputs unchanged"
            if kind == "element"
            else "the output does not depend on the input"
        )
        return AxisResult(kind, Finding(probe, NOTE, what))
    return AxisResult(
        "row",
        Finding(probe, OK, "each row's outputs depend on that row's D inputs and no other's"),
    )


def probe_sequence(f: NormFn, x: torch.Tensor, y: torch.Tensor) -> AxisResult | None:
    """The dependence map on [2, N/2, D] input (None when ``f`` refuses 3-D input)."""
    n, d = x.shape
    x3 = x.reshape(2, n // 2, d)
    try:
        y3 = finite_call(f, x3, "axis (3-D)")
        moved = finite_call(f, _bumped(x3, (0, 1, 2)), "axis (3-D)")
    except CALL_ERRORS:
        return None
    ch = _changed(y3, moved)
    same_seq_other_tok = bool(torch.cat([ch[0, :1], ch[0, 2:]]).any())
    other_seq = bool(ch[1].any())
    probe = "axis"
    if same_seq_other_tok and other_seq:
        kind, where = "batch", "over the batch and the sequence (dims 0 and 1 of [B, T, D])"
    elif same_seq_other_tok:
        kind, where = "sequence", "over the sequence (dim 1 of [B, T, D], a middle dim)"
    elif other_seq:
        kind, where = "batch", "over the batch (dim 0 of [B, T, D])"
    else:
        err = float((y.double() - y3.reshape(n, d).double()).abs().max())
        if err > 4 * rounding(y.dtype) * float(y.double().abs().max()):
            return AxisResult(
                "layout",
                Finding(
                    probe, NOTE,
                    "the same rows give different outputs as [N, D] and as [B, T, D] "
                    f"(max difference {err:.3g}), though no output depends on another token",
                ),
            )  # fmt: skip
        return AxisResult(
            "row",
            Finding(
                probe, OK,
                "each token's outputs depend on that token's D inputs and no other's, on "
                "[N, D] and on [B, T, D] input",
            ),
        )  # fmt: skip
    return AxisResult(
        kind,
        Finding(
            probe, DEFECT,
            f"on [B, T, D] input, moving one token's input changes other tokens' outputs: the "
            f"statistic runs {where}, not over each token's D values",
            diagnosis="statistic over the wrong axis"
            + (" (sequence / middle dim)" if kind == "sequence" else " (batch)"),
        ),
    )  # fmt: skip
