"""Rectified flow / flow matching: the straight noise-to-data path, its loss and an Euler sampler.

With noise x0 ~ N(0, I), data x1 and a time t ∈ [0, 1] per sample:

    x_t = (1 − t) · x0 + t · x1          the straight path from noise (t = 0) to data (t = 1)
    v   = dx_t/dt = x1 − x0              the target velocity
    L   = mean((v̂(x_t, t[, label]) − v)²)

A model trained on L approximates E[x1 − x0 | x_t], and integrating dx/dt = v̂(x, t) from
t = 0 (noise) to t = 1 carries noise to samples (:func:`euler_sample`). Times are drawn by
:func:`sample_time`: uniform, or logit-normal (the default, loc 0 and scale 1 as in Stable
Diffusion 3), which spends more samples on the middle of the path where v is hardest to predict.

Classifier-free guidance (Ho & Salimans 2022, as in DiT): training replaces each label by the
null class ∅ with probability p (:func:`drop_labels`, DiT uses p = 0.1), so one network learns
both the conditional velocity v_c = v̂(x, t, y) and the unconditional one v_∅ = v̂(x, t, ∅).
Sampling then follows the guided velocity (:func:`guided_velocity`, ``cfg_scale`` of
:func:`euler_sample`)

    v_w = v_∅ + w · (v_c − v_∅)

w = 1 is the conditional model (no guidance), w = 0 the unconditional one, w > 1 pushes the
samples further toward their class at some cost in diversity.

The settings these functions take (the time distribution, the label dropout p, the guidance
scale w, the null class, batch sizes and step counts) come from a validated config
(:class:`normlab.models.DiTSettings`, :class:`normlab.models.DiTConfig`) and are not checked
again here; the tensors and callables passed in are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from normlab.models.config import TIME_DISTRIBUTIONS

__all__ = [
    "TIME_DISTRIBUTIONS",
    "drop_labels",
    "euler_sample",
    "flow_matching_loss",
    "guided_velocity",
    "interpolate",
    "label_dropout_mask",
    "random_projections",
    "sample_noise",
    "sample_time",
    "sliced_wasserstein2",
    "target_velocity",
]

VelocityModel = Callable[..., torch.Tensor]


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator: expected a torch.Generator, got {type(generator).__name__}; "
            "pass torch.Generator().manual_seed(k) for reproducible draws"
        )
    return generator


def _check_float_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name}: dtype {value.dtype} is not a floating dtype; expected floats")
    if value.dim() < 1 or value.shape[0] < 1:
        raise ValueError(f"{name}: expected shape [B, …] with B >= 1, got {tuple(value.shape)}")
    return value


def _check_pair(x0: object, x1: object) -> tuple[torch.Tensor, torch.Tensor]:
    x1 = _check_float_tensor("x1", x1)
    x0 = _check_float_tensor("x0", x0)
    if x0.shape != x1.shape:
        raise ValueError(
            f"x0: shape {tuple(x0.shape)} differs from x1's {tuple(x1.shape)}; expected the same"
        )
    if x0.device != x1.device:
        raise ValueError(f"x0: is on {x0.device} but x1 is on {x1.device}; expected the same")
    return x0, x1


def _check_time(t: object, x: torch.Tensor) -> torch.Tensor:
    t = _check_float_tensor("t", t)
    if t.shape != (x.shape[0],):
        raise ValueError(
            f"t: expected shape [B] = [{x.shape[0]}] (one time per sample), got {tuple(t.shape)}"
        )
    if t.device != x.device:
        raise ValueError(f"t: is on {t.device} but x1 is on {x.device}; expected the same device")
    return t


def _per_sample(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """t [B] viewed as [B, 1, …, 1] so it multiplies every element of sample b of x."""
    return t.reshape(-1, *([1] * (x.dim() - 1)))


def sample_time(
    batch_size: int,
    generator: torch.Generator,
    *,
    distribution: str = "logit_normal",
    loc: float = 0.0,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draw ``batch_size`` flow times on the generator's device, [batch_size], in (0, 1).

    ``uniform``: t ~ U[0, 1). ``logit_normal`` (default): t = σ(u) = 1 / (1 + e^(−u)) with
    u ~ N(``loc``, ``scale``²); loc = 0, scale = 1 puts the median at t = ½ and about 68 % of
    the draws in (0.27, 0.73). ``loc`` and ``scale`` are ignored for ``uniform``.
    ``distribution`` is one of :data:`TIME_DISTRIBUTIONS` (``dit.time_distribution``, validated
    by the config).
    """
    generator = _check_generator(generator)
    shape, device = (int(batch_size),), generator.device
    if distribution == "uniform":
        return torch.rand(shape, generator=generator, device=device, dtype=dtype)
    if distribution == "logit_normal":
        u = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        return torch.sigmoid(float(loc) + float(scale) * u)
    # not a repeated check: no silent fallback to one of the two for a name that is neither
    raise ValueError(
        f"distribution: got {distribution!r}; expected one of {', '.join(TIME_DISTRIBUTIONS)}"
    )


def sample_noise(x1: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x0 ~ N(0, I) with x1's shape, dtype and device, drawn from ``generator``."""
    x1 = _check_float_tensor("x1", x1)
    generator = _check_generator(generator)
    if generator.device.type != x1.device.type:
        raise ValueError(
            f"generator: is on {generator.device} but x1 is on {x1.device}; "
            "expected a generator on x1's device"
        )
    return torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)


def interpolate(x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1 − t) · x0 + t · x1, with t [B] broadcast over every other axis of sample b."""
    x0, x1 = _check_pair(x0, x1)
    tb = _per_sample(_check_time(t, x1), x1).to(x1.dtype)
    return (1 - tb) * x0 + tb * x1


def target_velocity(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """v = x1 − x0, the velocity dx_t/dt of the straight path."""
    x0, x1 = _check_pair(x0, x1)
    return x1 - x0


def flow_matching_loss(
    model: VelocityModel,
    x1: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    label: torch.Tensor | None = None,
) -> torch.Tensor:
    """L = mean over every element of (model(x_t, t[, label]) − (x1 − x0))², a 0-d tensor.

    x_t = (1 − t) · x0 + t · x1 (:func:`interpolate`); ``label`` is passed only when given. The
    squared error is taken in float32 or better (float64 for float64 inputs). Draw ``x0`` with
    :func:`sample_noise` and ``t`` with :func:`sample_time`.
    """
    if not callable(model):
        raise TypeError(
            f"model: expected a callable v̂(x_t, t[, label]), got {type(model).__name__}"
        )
    x_t = interpolate(x0, x1, t)
    v = x1 - x0
    pred = model(x_t, t) if label is None else model(x_t, t, label)
    if not isinstance(pred, torch.Tensor) or pred.shape != v.shape:
        got = tuple(pred.shape) if isinstance(pred, torch.Tensor) else type(pred).__name__
        raise ValueError(
            f"model: returned {got}; expected a velocity of x1's shape {tuple(v.shape)}"
        )
    dtype = torch.promote_types(torch.promote_types(pred.dtype, v.dtype), torch.float32)
    return (pred.to(dtype) - v.to(dtype)).square().mean()


def _check_label(label: object, batch_size: int | None = None) -> torch.Tensor:
    if not isinstance(label, torch.Tensor) or label.dtype != torch.long or label.dim() != 1:
        got = (
            f"a {label.dtype} tensor of shape {tuple(label.shape)}"
            if isinstance(label, torch.Tensor)
            else type(label).__name__
        )
        raise TypeError(f"label: expected an int64 tensor [B], got {got}")
    if batch_size is not None and label.shape[0] != batch_size:
        raise ValueError(
            f"label: expected shape [B] = [{batch_size}] (one label per sample), "
            f"got {tuple(label.shape)}"
        )
    return label


def label_dropout_mask(batch_size: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """Which labels of a batch of ``batch_size`` to drop: m_i = [u_i < p], bool [batch_size].

    u_i ~ U[0, 1) is drawn from ``generator`` on its device, always ``batch_size`` numbers
    whatever p is, so the stream advances the same way for every p (p = 0 drops nothing) and,
    for one generator state, the labels dropped at a smaller p are a subset of those dropped at
    a larger one. E[Σ_i m_i] = p · batch_size. ``p`` ∈ [0, 1) is ``dit.label_dropout``,
    validated by the config.
    """
    generator = _check_generator(generator)
    u = torch.rand((int(batch_size),), generator=generator, device=generator.device)
    return u < p


def drop_labels(
    label: torch.Tensor, p: float, generator: torch.Generator, null_class: int
) -> torch.Tensor:
    """Label dropout for classifier-free guidance: y′_i = ∅ if m_i else y_i, a new int64 [B].

    m = :func:`label_dropout_mask` (B, ``p``, ``generator``), drawn on the generator's device
    and moved to the label's; ∅ = ``null_class`` (a DiT's
    :attr:`~normlab.models.DiTConfig.null_class`). The input is left unchanged.
    """
    label = _check_label(label)
    mask = label_dropout_mask(label.shape[0], p, generator).to(label.device)
    return torch.where(mask, torch.full_like(label, null_class), label)


def _check_guidance_labels(cfg_scale: float, label: object) -> None:
    """Guidance (w ≠ 1) needs the class labels to guide toward."""
    if cfg_scale != 1 and label is None:
        raise ValueError(
            f"label: classifier-free guidance (cfg_scale={cfg_scale}) needs the class "
            "labels to guide toward; got None. Pass labels, or cfg_scale=1.0"
        )


def guided_velocity(
    model: VelocityModel,
    x: torch.Tensor,
    t: torch.Tensor,
    label: torch.Tensor,
    null_label: int,
    cfg_scale: float,
) -> torch.Tensor:
    """The classifier-free guided velocity v_w = v_∅ + w · (v_c − v_∅), shaped like ``x``.

    v_c = model(x, t, ``label``) and v_∅ = model(x, t, ∅) with ∅ = ``null_label`` for every
    sample, computed in one forward pass over the batch [x; x] with labels [label; ∅] (2B rows),
    w = ``cfg_scale``. w = 1 returns model(x, t, label) itself (one forward of B rows, no
    unconditional pass), so it is exactly the unguided velocity; w = 0 gives v_∅. ``cfg_scale``
    (``dit.cfg_scale`` ≥ 0) and ``null_label`` come from a validated config.
    """
    _check_guidance_labels(cfg_scale, label)
    w = float(cfg_scale)
    label = _check_label(label, x.shape[0])
    if w == 1:
        return model(x, t, label)
    null = torch.full_like(label, int(null_label))
    both = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([label, null]))
    if not isinstance(both, torch.Tensor) or both.shape != (2 * x.shape[0], *x.shape[1:]):
        got = tuple(both.shape) if isinstance(both, torch.Tensor) else type(both).__name__
        raise ValueError(
            f"model: returned {got} for the batch of conditional and null labels; expected "
            f"a velocity of shape {(2 * x.shape[0], *x.shape[1:])}"
        )
    v_cond, v_uncond = both.chunk(2)
    return v_uncond + w * (v_cond - v_uncond)


def euler_sample(
    model: VelocityModel,
    x0: torch.Tensor,
    steps: int,
    label: torch.Tensor | None = None,
    cfg_scale: float = 1.0,
    null_label: int | None = None,
) -> torch.Tensor:
    """Integrate dx/dt = v(x, t) from t = 0 (x = x0) to t = 1 with Euler steps.

    With Δt = 1 / ``steps`` and t_k = k · Δt: x_{k+1} = x_k + Δt · v(x_k, t_k) for
    k = 0 … steps − 1; returns x_steps. t_k is passed as a [B] tensor in x0's dtype. On a
    straight path with the exact velocity field every step stays on the path, so the endpoint
    is exact for any number of steps. Gradients follow torch's grad mode (wrap the call in
    ``torch.no_grad()`` to sample).

    v is model(x, t[, label]) when ``cfg_scale`` w is 1 (the default: no guidance, exactly the
    unguided sampler), else the classifier-free guided velocity
    v = v_∅ + w · (v_c − v_∅) of :func:`guided_velocity`, which needs ``label`` and the null
    class ``null_label`` (a DiT's :attr:`~normlab.models.DiTConfig.null_class`). ``steps``
    ≥ 1 and the guidance settings come from the caller's validated settings.
    """
    if not callable(model):
        raise TypeError(f"model: expected a callable v̂(x, t[, label]), got {type(model).__name__}")
    x = _check_float_tensor("x0", x0)
    _check_guidance_labels(cfg_scale, label)
    w = float(cfg_scale)
    dt = 1.0 / int(steps)
    for k in range(int(steps)):
        t = torch.full((x.shape[0],), k * dt, dtype=x.dtype, device=x.device)
        if w != 1:
            v = guided_velocity(model, x, t, label, null_label, w)  # type: ignore[arg-type]
        else:
            v = model(x, t) if label is None else model(x, t, label)
        if not isinstance(v, torch.Tensor) or v.shape != x.shape:
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"model: returned {got}; expected a velocity of x0's shape")
        x = x + dt * v
    return x


def random_projections(n_projections: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``n_projections`` random unit directions θ_p ∈ R^``dim``, [n_projections, dim] float64.

    θ_p = g_p / ‖g_p‖ with g_p ~ N(0, I) drawn from ``generator`` (uniform on the unit sphere).
    """
    generator = _check_generator(generator)
    g = torch.randn(
        (int(n_projections), int(dim)),
        generator=generator,
        device=generator.device,
        dtype=torch.float64,
    )
    return g / torch.linalg.vector_norm(g, dim=1, keepdim=True)


def sliced_wasserstein2(
    x: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator | None = None,
    n_projections: int = 256,
    projections: torch.Tensor | None = None,
) -> float:
    """The sliced Wasserstein-2 distance between two equal-size point sets, as a float.

    Each sample of ``x`` [n, …] and ``y`` [n, …] is flattened to a point in R^D. With unit
    directions θ_1 … θ_P (``projections`` [P, D], or P = ``n_projections`` drawn from
    ``generator`` by :func:`random_projections`), and for each θ_p the projections sorted,
    a_(1) ≤ … ≤ a_(n) of {x_i · θ_p} and b_(1) ≤ … ≤ b_(n) of {y_i · θ_p}:

        SW2(x, y) = √( (1 / P) Σ_p (1 / n) Σ_i (a_(i) − b_(i))² )

    Sorting pairs the i-th smallest with the i-th smallest, which is the optimal transport
    plan in one dimension, so the inner mean is W2² of the two projected sets. Computed in
    float64 on the CPU; deterministic for a given generator state. SW2 is 0 for identical
    sets (in any order), symmetric, and equals |s| for 1-D sets shifted by s.
    """
    x = _check_float_tensor("x", x)
    y = _check_float_tensor("y", y)
    a = x.detach().reshape(x.shape[0], -1).to("cpu", torch.float64)
    b = y.detach().reshape(y.shape[0], -1).to("cpu", torch.float64)
    if a.shape != b.shape:
        raise ValueError(
            f"y: {b.shape[0]} points of dimension {b.shape[1]}, x has {a.shape[0]} of dimension "
            f"{a.shape[1]}; expected the same number of points of the same dimension"
        )
    if projections is None:
        if generator is None:
            raise TypeError("generator: expected a torch.Generator when no projections are given")
        theta = random_projections(n_projections, a.shape[1], generator).cpu()
    else:
        theta = _check_float_tensor("projections", projections).to("cpu", torch.float64)
        if theta.dim() != 2 or theta.shape[1] != a.shape[1]:
            raise ValueError(
                f"projections: expected shape [P, {a.shape[1]}], got {tuple(theta.shape)}"
            )
    pa = torch.sort(a @ theta.T, dim=0).values  # [n, P]
    pb = torch.sort(b @ theta.T, dim=0).values
    return float((pa - pb).square().mean().sqrt())
