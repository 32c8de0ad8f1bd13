"""What a trained model does after training: quantization, 16-bit evaluation, activation outliers.

Run once on a finished run's model, after its final evaluation (see
:meth:`normlab.experiment.testbeds.Testbed.posttrain`); every number is a summary field (see
docs/run-format.md), lower is better for all of them:

- ``ptq_int8wo_delta``, ``ptq_w8a8_delta``: post-training quantization with torchao on a deep copy
  of the model, every ``nn.Linear`` quantized (``quantize_`` with ``Int8WeightOnlyConfig()``:
  int8 weights, per output channel; ``Int8DynamicActivationInt8WeightConfig()``: W8A8, int8
  weights and int8 activations quantized per token at run time), each copy validated exactly as
  the normal validation; the field is the quantized copy's validation metric minus the
  unquantized model's (GPT: bits per byte, DiT: flow-matching MSE).
- ``ptq_fp8_delta``: the same difference for FP8 (E4M3) post-training quantization of every
  ``nn.Linear``: weights with one scale per output channel, activations quantized per token at
  run time. Where the device runs it (CUDA with ``torch._scaled_mm`` on FP8, compute capability
  ≥ 8.9) this is torchao's ``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``;
  elsewhere (the CPU, older GPUs) a simulation (:class:`SimulatedFp8Linear`): weight and input
  rounded through ``torch.float8_e4m3fn`` with those scales and multiplied in float32. Which one
  ran is ``ptq_fp8_method`` (``"torchao"`` or ``"simulated"``).
- ``bf16_eval_delta``: the same difference for a deep copy in bfloat16 (parameters and floating
  inputs in bf16, the loss computed in float32 from the bf16 outputs).
- ``act_kurtosis_max``, ``act_max_over_rms``, ``channel_rms_kurtosis_max``,
  ``outlier_channels``: on one fixed validation batch, the inputs of every ``nn.Linear`` inside
  the model's ``blocks`` (captured with forward pre-hooks, removed afterwards). Per layer, over
  all the input's values x (n of them), with μ = mean(x), σ² = mean((x − μ)²): kurtosis =
  mean((x − μ)⁴) / σ⁴ (3 for a Gaussian) and max|x| / RMS(x), RMS(x) = √mean(x²); per input
  channel c its RMS over the batch, r_c = √mean(x_c²), and the kurtosis of those C values (large
  when a few channels carry most of the energy, as quantizers fear); the fields are the maxima
  over layers, and the number of (layer, input channel) pairs whose max |x| over the batch is at
  least :data:`OUTLIER_THRESHOLD` (6, the threshold of LLM.int8()).

A part that fails (torchao missing, a scheme the device does not support) leaves its fields null
and records why in ``posttrain_errors`` ({field: "ErrorType: message"}); the run still finishes.
torchao is imported lazily, only here, so ``import normlab`` does not load it.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from normlab._quiet import import_quietly
from normlab.experiment.measure.activations import run_hooked_pass
from normlab.run_format import POSTTRAIN_FIELDS

__all__ = [
    "FP8_MAX",
    "OUTLIER_THRESHOLD",
    "POSTTRAIN_FIELDS",
    "PTQ_SCHEMES",
    "BFloat16Inputs",
    "LayerInputStats",
    "SimulatedFp8Linear",
    "activation_outliers",
    "bf16_delta",
    "fp8_copy",
    "fp8_delta",
    "fp8_quantize",
    "import_torchao",
    "input_stats",
    "posttrain_summary",
    "ptq_deltas",
    "quantized_copy",
]

OUTLIER_THRESHOLD = 6.0
"""A channel is an outlier when its max |x| over the batch reaches this (LLM.int8()'s 6)."""

PTQ_SCHEMES: dict[str, str] = {
    "ptq_int8wo_delta": "Int8WeightOnlyConfig",
    "ptq_w8a8_delta": "Int8DynamicActivationInt8WeightConfig",
}
"""Summary field → the ``torchao.quantization`` config class (built with no arguments)."""

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
"""The largest finite E4M3 value (448): a scale maps each row's max |v| onto it."""
FP8_TORCHAO = "torchao"
FP8_SIMULATED = "simulated"

_OUTLIER_FIELDS = (
    "act_kurtosis_max",
    "act_max_over_rms",
    "channel_rms_kurtosis_max",
    "outlier_channels",
)

Metric = Callable[[nn.Module], float]
"""A model → its validation metric, computed exactly as the run's validation."""


@dataclass(frozen=True)
class LayerInputStats:
    """Statistics of one layer's input x (see :func:`input_stats`)."""

    kurtosis: float
    max_over_rms: float
    channel_rms_kurtosis: float
    outlier_channels: int


def _kurtosis(v: torch.Tensor) -> float:
    """E[(v − μ)⁴] / σ⁴ over every value of ``v`` (population moments; NaN when σ = 0)."""
    centred = v - v.mean()
    var = centred.square().mean().item()
    return centred.pow(4).mean().item() / var**2 if var > 0 else math.nan


def input_stats(x: torch.Tensor, threshold: float = OUTLIER_THRESHOLD) -> LayerInputStats:
    """Kurtosis, max|x| / RMS, channel-RMS kurtosis and outlier channels of one input ``x``.

    ``x`` is [..., C]; a channel is an index of the last dimension. In float64, over all n values
    of x: μ = Σx / n, σ² = Σ(x − μ)² / n, kurtosis = (Σ(x − μ)⁴ / n) / σ⁴ (3 for a Gaussian, NaN
    when σ = 0); max|x| / RMS(x) with RMS(x) = √(Σx² / n) (NaN when x is all zeros). Per channel,
    its RMS over every other dimension r_c = √mean(x_c²); ``channel_rms_kurtosis`` is the same
    kurtosis over the C values r_c (NaN when they are all equal). A channel is an outlier when
    its max |x| is ≥ ``threshold``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x: expected a floating torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty tensor [..., C], got shape {tuple(x.shape)}")
    v = x.detach().to(torch.float64)
    absv = v.abs()
    rms = math.sqrt(v.square().mean().item())
    ratio = absv.max().item() / rms if rms > 0 else math.nan
    rows = v.reshape(-1, v.shape[-1])
    channel_rms = rows.square().mean(dim=0).sqrt()
    channel_max = absv.reshape(-1, v.shape[-1]).amax(dim=0)
    return LayerInputStats(
        kurtosis=_kurtosis(v),
        max_over_rms=ratio,
        channel_rms_kurtosis=_kurtosis(channel_rms),
        outlier_channels=int((channel_max >= threshold).sum().item()),
    )


def _finite_max(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else None


@torch.no_grad()
def activation_outliers(
    model: nn.Module,
    run_batch: Callable[[nn.Module], object],
    threshold: float = OUTLIER_THRESHOLD,
) -> dict[str, float | int | None]:
    """``act_kurtosis_max``, ``act_max_over_rms``, ``channel_rms_kurtosis_max`` and
    ``outlier_channels`` of ``model`` on the batch that ``run_batch(model)`` runs through it (a
    forward in eval mode, without gradients).

    The inputs of every ``nn.Linear`` under ``model.blocks`` are captured with forward pre-hooks
    and reduced by :func:`input_stats` as they pass; the hooks are removed and the training mode
    restored afterwards, even when the forward raises."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise ValueError(f"model: {type(model).__name__} has no `blocks` module to look inside")
    linears = [(n, m) for n, m in blocks.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"model: no nn.Linear inside {type(model).__name__}.blocks")
    stats: dict[str, LayerInputStats] = {}

    def hook_for(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if name in stats:
                raise RuntimeError(f"blocks.{name}: called twice in one batch")
            stats[name] = input_stats(args[0], threshold)

        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in linears]
    run_hooked_pass(model, run_batch, handles)
    missing = [n for n, _ in linears if n not in stats]
    if missing:
        raise RuntimeError(f"the batch did not reach blocks.{', blocks.'.join(missing)}")
    return {
        "act_kurtosis_max": _finite_max([s.kurtosis for s in stats.values()]),
        "act_max_over_rms": _finite_max([s.max_over_rms for s in stats.values()]),
        "channel_rms_kurtosis_max": _finite_max([s.channel_rms_kurtosis for s in stats.values()]),
        "outlier_channels": sum(s.outlier_channels for s in stats.values()),
    }


def import_torchao() -> ModuleType:
    """``torchao.quantization``, imported without torchao's import-time warnings about optional
    extensions (:func:`normlab._quiet.import_quietly`); an ImportError says torchao is needed
    and why."""
    try:
        quantization = import_quietly("torchao.quantization")
    except ImportError as err:
        raise ImportError(
            f"torchao is needed for post-training quantization (pip install torchao): {err}"
        ) from err
    return quantization


def quantized_copy(model: nn.Module, config: object) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` quantized by torchao's ``quantize_``
    with ``config``; ``model`` itself is left untouched."""
    quantization = import_torchao()
    clone = copy.deepcopy(model)
    quantization.quantize_(clone, config)
    return clone


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _checked(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise FloatingPointError(f"{what}: the validation metric is {value}")
    return value


def ptq_deltas(
    model: nn.Module,
    metric: Metric,
    reference: float,
    schemes: dict[str, Callable[[], object]] | None = None,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Validation metric of each quantized copy minus ``reference`` (the unquantized model's).

    ``schemes`` maps a summary field to a factory of its torchao config (default:
    :data:`PTQ_SCHEMES` from ``torchao.quantization``). Returns ({field: delta or None},
    {field: reason}) with a reason for every None: torchao missing, a scheme that raised, or a
    non-finite metric."""
    deltas: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    if schemes is None:
        try:
            quantization = import_torchao()
        except ImportError as err:
            return dict.fromkeys(PTQ_SCHEMES), dict.fromkeys(PTQ_SCHEMES, _reason(err))
        schemes = {f: getattr(quantization, cls) for f, cls in PTQ_SCHEMES.items()}
    for field, make_config in schemes.items():
        try:
            clone = quantized_copy(model, make_config())
            deltas[field] = _checked(metric(clone), field) - reference
        except Exception as err:
            deltas[field], errors[field] = None, _reason(err)
    return deltas, errors


class BFloat16Inputs(nn.Module):
    """``inner`` called with its floating tensor arguments cast to bfloat16; a floating tensor
    output comes back in float32 (so that a loss on it is computed in float32)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        cast = [
            a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        ]
        out = self.inner(*cast)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out.float()
        return out


def bf16_delta(model: nn.Module, metric: Metric, reference: float) -> float:
    """``metric`` of a bfloat16 deep copy of ``model`` minus ``reference`` (the float32
    model's). ``metric`` receives the bf16 copy and must feed it bf16 inputs and compute its loss
    in float32 (the GPT's cross-entropy takes logits ``.float()``; wrap a velocity model in
    :class:`BFloat16Inputs`)."""
    clone = copy.deepcopy(model).to(torch.bfloat16)
    return _checked(metric(clone), "bf16_eval_delta") - reference


def fp8_quantize(v: torch.Tensor) -> torch.Tensor:
    """``v`` rounded to E4M3 with one scale per row (over the last dimension) and back, in
    float32: s = max|v_row| / 448 (rows of zeros keep s = 1), v̂ = fp8(v / s)·s, where fp8
    rounds to the nearest ``torch.float8_e4m3fn`` value (|v / s| ≤ 448, so nothing saturates)."""
    v = v.float()
    amax = v.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (v / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale


class SimulatedFp8Linear(nn.Module):
    """An ``nn.Linear`` with FP8 (E4M3) weights, one scale per output channel, and FP8 inputs,
    one scale per token computed at run time (:func:`fp8_quantize` on each); the product and
    the bias in float32, the output in the input's dtype. A simulation of FP8 W8A8 inference:
    the rounding is FP8's, the arithmetic is not."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", fp8_quantize(linear.weight.detach()))
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(fp8_quantize(x), self.weight, self.bias)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=simulated"


def _simulated_fp8_copy(model: nn.Module) -> nn.Module:
    clone = copy.deepcopy(model)
    linears = [(n, m) for n, m in clone.named_modules() if isinstance(m, nn.Linear)]
    for name, linear in linears:
        parent_name, _, child = name.rpartition(".")
        parent = clone.get_submodule(parent_name) if parent_name else clone
        setattr(parent, child, SimulatedFp8Linear(linear))
    return clone


def _device_runs_fp8(model: nn.Module) -> bool:
    """Whether the model sits on a CUDA device with FP8 matrix multiplies (capability ≥ 8.9)."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(param.device) >= (8, 9)


def fp8_copy(model: nn.Module, simulate: bool | None = None) -> tuple[nn.Module, str]:
    """A deep copy of ``model`` with every ``nn.Linear`` in FP8 W8A8 (E4M3, per-channel weight
    and per-token activation scales), and how: ``"torchao"``
    (``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``) where the device runs
    FP8 matmuls, else ``"simulated"`` (:class:`SimulatedFp8Linear`). ``simulate`` forces the
    choice (None: by the device)."""
    if simulate is None:
        simulate = not _device_runs_fp8(model)
    if simulate:
        return _simulated_fp8_copy(model), FP8_SIMULATED
    quantization = import_torchao()
    config = quantization.Float8DynamicActivationFloat8WeightConfig(
        granularity=quantization.PerRow()
    )
    return quantized_copy(model, config), FP8_TORCHAO


def fp8_delta(model: nn.Module, metric: Metric, reference: float) -> tuple[float, str]:
    """(``metric`` of :func:`fp8_copy` minus ``reference``, the method). Where torchao's FP8
    raises on the device (quantizing or running), the simulation is used instead; a non-finite
    metric raises ``FloatingPointError`` either way."""
    if _device_runs_fp8(model):
        try:
            clone, method = fp8_copy(model, simulate=False)
            return _checked(metric(clone), "ptq_fp8_delta") - reference, method
        except FloatingPointError:
            raise
        except Exception:
            pass
    clone, method = fp8_copy(model, simulate=True)
    return _checked(metric(clone), "ptq_fp8_delta") - reference, method


def posttrain_summary(
    model: nn.Module,
    reference: float,
    metric: Metric,
    metric_bf16: Metric,
    run_batch: Callable[[nn.Module], object],
    schemes: dict[str, Callable[[], object]] | None = None,
) -> dict[str, Any]:
    """Every field of :data:`POSTTRAIN_FIELDS` for a trained ``model`` whose validation metric
    is ``reference``: ``metric`` validates a model (float32 or quantized copy), ``metric_bf16`` a
    bfloat16 copy (see :func:`bf16_delta`), ``run_batch`` runs the fixed batch of
    :func:`activation_outliers`; ``schemes`` goes to :func:`ptq_deltas`. A part that raises
    leaves its fields None and its reason in ``posttrain_errors`` (None when nothing failed);
    ``posttrain_s`` is the wall time of it all. ``model`` is not modified."""
    started = time.perf_counter()
    out: dict[str, Any] = dict.fromkeys(POSTTRAIN_FIELDS)
    deltas, errors = ptq_deltas(model, metric, reference, schemes)
    out.update(deltas)
    try:
        out["ptq_fp8_delta"], out["ptq_fp8_method"] = fp8_delta(model, metric, reference)
    except Exception as err:
        errors["ptq_fp8_delta"] = _reason(err)
    try:
        out["bf16_eval_delta"] = bf16_delta(model, metric_bf16, reference)
    except Exception as err:
        errors["bf16_eval_delta"] = _reason(err)
    try:
        out.update(activation_outliers(model, run_batch))
    except Exception as err:
        for field in _OUTLIER_FIELDS:
            errors[field] = _reason(err)
    out["posttrain_errors"] = errors or None
    out["posttrain_s"] = time.perf_counter() - started
    return out
