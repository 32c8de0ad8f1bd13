"""Argument checks shared by the functional API and the modules.

Every check raises ``TypeError`` or ``ValueError`` naming the argument, what it got and what it
expects. Checks look only at metadata (dtype, shape, device), never at values, so they cost
nothing on the hot path and trace cleanly under ``torch.compile``: numbers are compared with
plain comparisons (no ``math.isfinite``), and sizes with ``==``, so that a float or a size made
symbolic by ``dynamic=True`` (or by a recompilation) traces without a graph break.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class UsageValueError(ValueError):
    """A value the user gave (an option, an argument, a config key) that is not taken as
    written: malformed, out of range, a name that names nothing there is, or one that does not go
    with the others, found by a check below the command line. The command line exits with its
    usage status for it (``normlab.cli.errors.EXIT_USAGE``), as for typer's own usage errors;
    any other ``ValueError`` of a command refuses what well-formed options name."""


CASTING_MODES = ("llama", "gemma", "fp32")


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of the statistics for an input dtype: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_input(name: str, x: object) -> torch.Tensor:
    """``x`` must be a floating tensor with at least one dimension and a non-empty last one."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}: dtype {x.dtype} is not supported; expected one of "
            "float16, bfloat16, float32, float64"
        )
    if x.dim() == 0:
        raise ValueError(f"{name}: got a 0-d tensor; expected shape [..., D] with D >= 1")
    if x.shape[-1] == 0:
        raise ValueError(f"{name}: last dimension is 0 (shape {tuple(x.shape)}); expected D >= 1")
    return x


def check_eps(eps: object, name: str = "eps") -> float:
    """``eps`` must be a finite real number > 0: a Python or NumPy int or float (bool and
    tensors are rejected). ``0 < eps < inf`` is false for NaN, so one comparison covers all."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name}: expected a float > 0, got {type(eps).__name__} {eps!r}")
    if not 0 < eps < math.inf:
        raise ValueError(f"{name}: expected a finite float > 0, got {eps!r}")
    return float(eps)


def check_layer_norm_eps(eps: object, name: str = "eps") -> float:
    """ε of the LayerNorm family: a valid ``eps``. ``None`` is refused with the reason: it means
    "the dtype's machine epsilon" for the RMS family only, after ``torch.nn.RMSNorm``; torch's
    ``layer_norm`` takes a float ε and no ``None``, and so does normlab's."""
    if eps is None:
        raise TypeError(
            f"{name}: got NoneType None; expected a float > 0 (LayerNorm's default is 1e-5, "
            "torch.nn.functional.layer_norm's too). eps=None (the dtype's machine epsilon, "
            "torch.nn.RMSNorm's convention) is accepted by the RMSNorm family only"
        )
    return check_eps(eps, name)


def check_optional_eps(eps: object, name: str = "eps") -> float | None:
    """``None`` (the dtype's machine epsilon, chosen per call) or a valid ``eps``."""
    return None if eps is None else check_eps(eps, name)


def resolve_eps(eps: float | None, dtype: torch.dtype) -> float:
    """ε for an input of ``dtype``: ``eps``, or for ``None`` the machine epsilon of the dtype the
    statistics are computed in (float32 for 16-bit input), which is what ``torch.nn.RMSNorm``
    and ``torch.nn.functional.rms_norm`` use for ``eps=None``."""
    return torch.finfo(stats_dtype(dtype)).eps if eps is None else check_eps(eps)


def check_finite_number(value: object, name: str) -> float:
    """A finite real number (bool rejected); ``-inf < value < inf`` is false for NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {value!r}")
    if not -math.inf < value < math.inf:
        raise ValueError(f"{name}: expected a finite float, got {value!r}")
    return float(value)


def check_bool(value: object, name: str) -> bool:
    """A flag: ``True`` or ``False`` (a number in its place is a misplaced positional argument)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def check_casting(casting: object) -> str:
    if casting not in CASTING_MODES:
        raise ValueError(
            f"casting: unknown mode {casting!r}; expected one of {', '.join(CASTING_MODES)}"
        )
    return str(casting)


def check_out_dtype(out_dtype: object) -> torch.dtype | None:
    if out_dtype is None:
        return None
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"out_dtype: expected None or one of float16, bfloat16, float32, float64, "
            f"got {out_dtype!r}"
        )
    return out_dtype


def check_param(name: str, p: torch.Tensor | None, x: torch.Tensor) -> None:
    """A per-channel parameter (weight, bias): floating, 1-D of size D, on x's device."""
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(
            f"{name}: expected a torch.Tensor or None, got {type(p).__name__}" + _shape_hint(p, x)
        )
    if not p.is_floating_point():
        raise TypeError(
            f"{name}: dtype {p.dtype} is not a floating dtype; expected a floating tensor "
            f"(x is {x.dtype})"
        )
    if p.device != x.device:
        raise ValueError(
            f"{name}: is on {p.device} but x is on {x.device}; expected the same device"
        )
    d = x.shape[-1]
    if p.dim() != 1 or p.shape[0] != d:
        raise ValueError(
            f"{name}: shape {tuple(p.shape)} does not match x's last dimension; "
            f"expected ({d},) for x of shape {tuple(x.shape)}"
        )


def _shape_hint(value: object, x: torch.Tensor) -> str:
    """For a shape passed where a parameter belongs (torch's ``layer_norm(x, normalized_shape,
    weight, bias)`` order): say that normlab's functional API takes no normalized_shape."""
    is_shape = isinstance(value, (tuple, list, torch.Size)) or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    )
    if not is_shape:
        return ""
    return (
        f"; {value!r} looks like torch's normalized_shape argument, which normlab's functional "
        "norms do not take (their statistics are always over the last dimension): leave it "
        "out, as in normlab.functional.layer_norm(x, weight, bias, eps) or "
        f"rms_norm(x, weight, eps), with weight and bias of shape ({x.shape[-1]},) here"
    )


def check_same_shape(name: str, t: torch.Tensor, x: torch.Tensor, x_name: str = "x") -> None:
    """``t`` must be a floating tensor of exactly x's shape, on x's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}: dtype {t.dtype} is not supported; expected a floating dtype like {x_name}"
        )
    if t.device != x.device:
        raise ValueError(
            f"{name}: is on {t.device} but {x_name} is on {x.device}; expected the same device"
        )
    if t.shape != x.shape:
        raise ValueError(
            f"{name}: shape {tuple(t.shape)} differs from {x_name}'s {tuple(x.shape)}; "
            "expected the same shape"
        )


def check_last_dim(x: torch.Tensor, size: int, what: str = "normalized_shape") -> None:
    """A module's input: x's last dimension must be the module's size ``size``."""
    if x.shape[-1] != size:
        raise ValueError(
            f"x: last dimension is {x.shape[-1]} (shape {tuple(x.shape)}); expected {size}, "
            f"the module's {what}"
        )


def check_trailing_shape(x: torch.Tensor, shape: tuple[int, ...]) -> None:
    """A module's input: x's trailing dimensions must be the module's ``normalized_shape``."""
    if len(shape) == 1:
        check_last_dim(x, shape[0])
        return
    k = len(shape)
    if x.dim() < k or any(a != b for a, b in zip(x.shape[-k:], shape, strict=True)):
        raise ValueError(
            f"x: shape {tuple(x.shape)} does not end in the module's normalized_shape {shape}; "
            f"expected [..., {', '.join(map(str, shape))}]"
        )


def _sequence_lead(lead: Sequence[int], x_dim: int) -> tuple[int, ...]:
    """Leading dims of a modulation (or cond) as they line up with x's, see per_sequence_view."""
    lead = tuple(lead)
    if x_dim >= 3 and len(lead) == 1:
        return (*lead, *([1] * (x_dim - 2)))  # per sequence [B, D]: [B, 1, …, 1, D]
    if x_dim >= 3 and len(lead) == x_dim - 2:
        return (*lead, 1)  # one token axis fewer than x: insert it before D
    return lead


def per_sequence_view(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """View a modulation tensor m [..., D] so that it lines up with x [B, …, D].

    For x with 3 or more dimensions, m of shape [B, D] is per sequence (per sample): it becomes
    [B, 1, …, 1, D], whatever the number of token axes, so it never broadcasts against an inner
    axis that happens to have size B. m with one dimension fewer than x gets a token axis before
    D ([B, T, D] → [B, T, 1, D] for x [B, T, S, D]). Anything else is left to broadcasting.
    """
    lead = _sequence_lead(m.shape[:-1], x.dim())
    for _ in range(len(lead) - (m.dim() - 1)):
        m = m.unsqueeze(-2)
    return m


def modulation_view(name: str, m: torch.Tensor, x: torch.Tensor, x_name: str = "x") -> torch.Tensor:
    """Return a per-sequence or per-token modulation tensor viewed so it broadcasts over x.

    Accepted shapes for x of shape [B, T, D]: [B, D] (per sequence, a token axis is inserted),
    [B, 1, D] (per sequence) and [B, T, D] (per token); for x of shape [N, D]: [N, D] or [D];
    for x with more token axes [B, …, D], [B, D] is still per sequence (see
    :func:`per_sequence_view`); in general anything that broadcasts to x's shape without
    enlarging it, with D last.
    """
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(m).__name__}")
    if m.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}: dtype {m.dtype} is not supported; expected one of "
            "float16, bfloat16, float32, float64"
        )
    if m.device != x.device:
        raise ValueError(
            f"{name}: is on {m.device} but {x_name} is on {x.device}; expected the same device"
        )
    view = per_sequence_view(m, x)
    if not _broadcasts_to(view.shape, x.shape):
        raise ValueError(
            f"{name}: shape {tuple(m.shape)} does not broadcast to {x_name}'s shape "
            f"{tuple(x.shape)}; expected [B, D] or [B, 1, D] (per sequence) or [B, T, D] "
            "(per token)"
        )
    return view


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target), strict=False):
        if not (s == 1 or s == t):  # not `s in (1, t)`: Dynamo mis-evaluates it for symbolic t
            return False
    return shape[-1] == target[-1] if len(shape) else False


def check_cond(cond: object, x: torch.Tensor, cond_dim: int) -> torch.Tensor:
    """A condition vector per sequence ([B, C]) or per token ([B, T, C]) that fits ``x``."""
    if not isinstance(cond, torch.Tensor):
        raise TypeError(f"cond: expected a torch.Tensor, got {type(cond).__name__}")
    if not cond.is_floating_point():
        raise TypeError(
            f"cond: dtype {cond.dtype} is not a floating dtype; expected a float tensor"
        )
    if cond.device != x.device:
        raise ValueError(
            f"cond: is on {cond.device} but x is on {x.device}; expected the same device"
        )
    if cond.dim() == 0 or cond.shape[-1] != cond_dim:
        raise ValueError(
            f"cond: shape {tuple(cond.shape)} has the wrong last dimension; "
            f"expected [..., {cond_dim}] (cond_dim)"
        )
    lead = _sequence_lead(cond.shape[:-1], x.dim())  # per sequence: [B, 1, …, 1]
    if not _broadcasts_to((*lead, x.shape[-1]), x.shape):
        raise ValueError(
            f"cond: shape {tuple(cond.shape)} does not fit x of shape {tuple(x.shape)}; expected "
            f"[B, {cond_dim}] (per sequence) or [B, T, {cond_dim}] (per token)"
        )
    return cond


def check_dim(value: object, name: str) -> int:
    """A positive integer size: a Python or NumPy integer (bool rejected), returned as int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a positive int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return int(value)
