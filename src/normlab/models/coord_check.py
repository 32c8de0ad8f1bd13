"""The coordinate check, μP's standard test (Yang et al., Tensor Programs V, §D; microsoft/mup's
``get_coord_data``): train the GPT testbed a few Adam steps at several widths, from the same
seeds on the same batches, and record how large each layer's activations are at every step.

The size of an activation x [B, T, D] is mean |xᵢ| over all its entries (a coordinate's typical
size, whatever the width D). Recorded at the forward pass of each step t = 1 … S, before that
step's update (t = 1 is the initialisation), for ``embed`` (the input of the first block:
token embedding, with positions when they are learned), ``block{i}`` (each block's output) and
``logits``; averaged over the seeds.

For each layer and step the *slope* is the least-squares slope of log size against log width:
size ∝ width^slope. Under μP every coordinate stays Θ(1) as the width grows, so the slopes are
near 0; under sp with Adam an update moves every coordinate of a hidden layer by Θ(lr) per
entry of a matrix with fan-in ∝ width, so the sizes grow with the width once training starts.

*Flat* (:attr:`CoordCheck.flat`): from the second step on (the first updates have been made),
every layer's |slope| ≤ :data:`FLAT_SLOPE`, except that the logits may shrink (only their
growth counts). The initialisation (step 1) is shown but not judged. μP's logits shrink as
width^(−1/2) at initialisation by design (the output multiplier d₀ / d on a head of constant
deviation, the same as a zero-initialised readout in the limit), and at a small rate that
part still dominates for a step or two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from normlab.data.batches import TrainBatches
from normlab.data.cache import read_corpus
from normlab.models import build_gpt
from normlab.models.config import GPTConfig
from normlab.models.mup import param_groups

FLAT_SLOPE = 0.25
"""The largest |slope| of log size vs log width that counts as flat (after step 1); docs/mup.md
gives the slopes it was set from."""
EMBED = "embed"
LOGITS = "logits"
CORPUS_BYTES = 1 << 20
"""Bytes of the standard library's source the default batches are cut from."""


@dataclass(frozen=True)
class CoordCheck:
    """Activation sizes of a width ladder: ``sizes[layer][t][w]`` is the mean |x| of ``layer``
    at step t + 1 of the model of width ``widths[w]``, averaged over ``seeds``."""

    parametrization: str
    base_d_model: int
    widths: list[int]
    steps: int
    lr: float
    seeds: list[int]
    layers: list[str]
    sizes: dict[str, list[list[float]]]
    threshold: float = FLAT_SLOPE
    slopes: dict[str, list[float]] = field(init=False)

    def __post_init__(self) -> None:
        slopes = {
            layer: [log_log_slope(self.widths, row) for row in self.sizes[layer]]
            for layer in self.layers
        }
        object.__setattr__(self, "slopes", slopes)

    def judged(self, layer: str, step: int) -> bool:
        """Whether the slope of ``layer`` at 0-based ``step`` counts: steps 2 … S, and for the
        logits only a growth (a positive slope)."""
        return step > 0 and (layer != LOGITS or self.slopes[layer][step] > 0)

    @property
    def worst(self) -> tuple[str, int, float]:
        """(layer, 1-based step, slope) of the judged slope farthest from 0 (a 0 slope of the
        last layer at the last step when none is judged)."""
        cases = [
            (layer, t + 1, s)
            for layer, row in self.slopes.items()
            for t, s in enumerate(row)
            if self.judged(layer, t)
        ]
        return max(cases, key=lambda c: abs(c[2]), default=(self.layers[-1], self.steps, 0.0))

    @property
    def flat(self) -> bool:
        """Whether every judged slope lies within ±``threshold``."""
        return abs(self.worst[2]) <= self.threshold

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the settings, the sizes, the slopes and the verdict."""
        layer, step, slope = self.worst
        return {
            "parametrization": self.parametrization,
            "base_d_model": self.base_d_model,
            "widths": self.widths,
            "steps": self.steps,
            "lr": self.lr,
            "seeds": self.seeds,
            "size": "mean |x| per layer output, at each step before its update",
            "sizes": self.sizes,
            "slopes": self.slopes,
            "threshold": self.threshold,
            "worst": {"layer": layer, "step": step, "slope": slope},
            "flat": self.flat,
        }


def log_log_slope(widths: Sequence[int], sizes: Sequence[float]) -> float:
    """Least-squares slope b of log(size) = a + b · log(width)."""
    x = np.log(np.asarray(widths, dtype=np.float64))
    y = np.log(np.asarray(sizes, dtype=np.float64))
    return float(np.polyfit(x, y, 1)[0])


def corpus_tokens(max_bytes: int = CORPUS_BYTES) -> np.ndarray:
    """The training side of the default corpus (this Python's standard library), as bytes."""
    train, _, _ = read_corpus(None, max_bytes=max_bytes)
    return np.frombuffer(train, dtype=np.uint8)


def activation_sizes(
    cfg: GPTConfig, tokens: np.ndarray, steps: int, lr: float, batch_size: int, seed: int
) -> dict[str, list[float]]:
    """{layer: [mean |x| at step 1, …, S]} of one model trained ``steps`` AdamW steps (rate
    ``lr`` with :func:`normlab.models.mup.param_groups`' multipliers, betas (0.9, 0.95), no
    weight decay, no clipping, no schedule) on batches of ``batch_size`` windows for ``seed``."""
    model = build_gpt(cfg, seed)
    model.train()
    optimizer = torch.optim.AdamW(param_groups(model, lr), lr=lr, betas=(0.9, 0.95))
    batches = TrainBatches(tokens, batch_size, cfg.context, seed)
    layers = [EMBED, *(f"block{i}" for i in range(cfg.n_layers)), LOGITS]
    sizes: dict[str, list[float]] = {layer: [] for layer in layers}

    def record(layer: str, x: torch.Tensor) -> None:
        sizes[layer].append(x.detach().abs().mean(dtype=torch.float64).item())

    hooks = [
        model.blocks[0].register_forward_pre_hook(lambda _m, args: record(EMBED, args[0])),
        *(
            block.register_forward_hook(lambda _m, _a, out, i=i: record(f"block{i}", out))
            for i, block in enumerate(model.blocks)
        ),
    ]
    try:
        for _ in range(steps):
            x, y = batches.next()
            logits, loss = model(x, y)
            record(LOGITS, logits)
            assert loss is not None
            if not math.isfinite(loss.item()):
                raise ValueError(f"lr: the loss diverged at width {cfg.d_model}; use a smaller lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
    return sizes


def coord_check(
    settings: GPTConfig,
    widths: Sequence[int],
    steps: int = 10,
    lr: float = 1e-2,
    batch_size: int = 8,
    seeds: Sequence[int] = (0, 1),
    tokens: np.ndarray | None = None,
) -> CoordCheck:
    """The coordinate check of ``settings`` (its parametrisation, base width and every other
    setting) at each width of ``widths`` (as ``d_model``); ``tokens`` default to
    :func:`corpus_tokens`."""
    widths = [int(w) for w in widths]
    if len(widths) < 2:
        raise ValueError(f"widths: expected at least 2 widths to fit a slope, got {widths}")
    if steps < 2:
        raise ValueError(f"steps: expected at least 2 (step 1 is the initialisation), got {steps}")
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    data = corpus_tokens() if tokens is None else tokens
    per_width = []
    for width in widths:
        cfg = settings.model_copy(update={"d_model": width})
        cfg = GPTConfig(**cfg.model_dump())  # validated: heads must divide the width
        runs = [activation_sizes(cfg, data, steps, lr, batch_size, s) for s in seeds]
        per_width.append({k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]})
    layers = list(per_width[0])
    sizes = {
        layer: [[float(pw[layer][t]) for pw in per_width] for t in range(steps)] for layer in layers
    }
    return CoordCheck(
        parametrization=settings.parametrization,
        base_d_model=settings.base_d_model,
        widths=widths,
        steps=steps,
        lr=lr,
        seeds=list(seeds),
        layers=layers,
        sizes=sizes,
    )
