"""Turn a command-line target into something to audit.

A norm target is a registry kind (``rmsnorm``, ``layernorm``, …, and ``dyt``: the names
``normlab compare`` accepts, except ``none``, which is no module at all) or
``package.module:Name`` naming a class (built as ``Name(dim)``) or a callable taking ``x`` (or
``(x, (dim,))`` like ``torch.nn.functional.layer_norm``). A model target is ``gpt`` (normlab's
GPT testbed: any unconditional norm kind × placement), ``dit`` (normlab's small DiT for flow
matching: any conditional norm kind, pre-norm with gated residuals) or ``package.module:factory``
where ``factory()`` returns ``(model, example_inputs)``.

Errors are ``ValueError`` messages that start with the argument at fault: ``target:``,
``dim:``, ``norm:`` or ``placement:``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from normlab.audit.probe import MIN_DIM
from normlab.models.norms import NO_NORM  # importing it registers "dyt", as compare sees it
from normlab.registry import available_norms, is_conditional, make_norm


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(
            f"target: {target!r} is neither a registered norm ({', '.join(available_norms())}) "
            "nor of the form 'package.module:Name'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"target: cannot import module {module_name!r} ({err})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"target: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_norm(
    target: str, dim: int
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """The callable to probe and its gain parameter (or None) for ``target`` at size ``dim``."""
    check_dim(dim)
    if target == NO_NORM:
        raise ValueError(
            f"target: {NO_NORM!r} means no norm layer (the identity) in a model, so there is "
            f"nothing to audit; expected a norm: one of {', '.join(available_norms())} "
            "or 'package.module:Name'"
        )
    if target in available_norms():
        kw = {"cond_dim": dim} if is_conditional(target) else {}
        return _as_callable(make_norm(target, dim, **kw), dim)
    obj = _import(target)
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        try:
            module = obj(dim)
        except TypeError as err:
            raise ValueError(f"target: cannot build {target}({dim}): {err}") from None
        return _as_callable(module, dim)
    if isinstance(obj, nn.Module):
        return _as_callable(obj, dim)
    if callable(obj):
        return _functional(obj, dim), None
    raise ValueError(f"target: {target!r} is not a module class, a module or a callable")


def check_dim(dim: object) -> int:
    """The probes' vector size: an even integer >= :data:`~normlab.audit.probe.MIN_DIM`."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < MIN_DIM or dim % 2:
        raise ValueError(f"dim: expected an even integer >= {MIN_DIM} for the probes, got {dim!r}")
    return dim


def _as_callable(
    module: nn.Module, dim: int
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    weight = getattr(module, "weight", None)
    weight = weight if isinstance(weight, torch.Tensor) else None
    forward_args = module.forward.__code__.co_varnames[: module.forward.__code__.co_argcount]
    if "cond" in forward_args:  # a conditional norm: probe it with a zero condition

        def call(x: torch.Tensor) -> torch.Tensor:
            cond = torch.zeros(x.shape[0], dim, dtype=x.dtype)
            return module.to(x.dtype)(x, cond)[0]

        return call, weight
    return module, weight


def _functional(fn: Callable[..., Any], dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    probe = torch.randn(2, dim)
    try:
        fn(probe)
        return fn
    except TypeError:
        pass
    fn(probe, (dim,))  # e.g. torch.nn.functional.layer_norm(x, normalized_shape)
    return lambda x: fn(x, (dim,))


TESTBEDS = ("gpt", "dit")
DEFAULT_NORMS = {"gpt": "layernorm", "dit": "adaln_zero"}


def check_testbed_options(norm: object, placement: object, target: str = "gpt") -> None:
    """The norm kind and placement of a testbed (``gpt`` or ``dit``); errors start
    ``norm:``/``placement:``.

    ``gpt``: an unconditional norm kind (or ``none``) and pre, post or sandwich. ``dit``: a
    conditional norm kind (``adaln_zero``, ``adarms``, …) and pre, its only placement.
    """
    from normlab.models.config import PLACEMENTS

    if target == "dit":
        from normlab.models.dit import check_dit_norm

        check_dit_norm(norm)
        if placement != "pre":
            raise ValueError(
                f"placement: got {placement!r}; the dit testbed has pre placement only "
                "(h + g ⊙ F(N(h; c)), the DiT's gated residual)"
            )
        return
    from normlab.models.norms import check_model_norm

    check_model_norm(norm)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: got {placement!r}; expected one of {', '.join(PLACEMENTS)}")


def load_model(target: str, norm: str, placement: str) -> tuple[nn.Module, tuple[Any, ...]]:
    """A model and example inputs for a model audit (``norm`` and ``placement``: testbeds only).

    ``gpt``: a 2-layer GPT and token ids [2, 16]. ``dit``: a 2-layer DiT (4 channels, 16 tokens,
    10 classes) and (x_t [2, 16, 4], t [2], label [2]).
    """
    if target == "gpt":
        from normlab.models import GPT, GPTConfig

        check_testbed_options(norm, placement, target)
        cfg = GPTConfig(
            d_model=64, n_layers=2, n_heads=4, context=32, norm=norm, placement=placement
        )
        return GPT(cfg), (torch.randint(0, cfg.vocab_size, (2, 16)),)
    if target == "dit":
        from normlab.models import DiTConfig, build_dit

        check_testbed_options(norm, placement, target)
        dit_cfg = DiTConfig(
            in_channels=4, seq_len=16, d_model=64, n_layers=2, n_heads=4, n_classes=10, norm=norm
        )
        gen = torch.Generator().manual_seed(0)
        inputs = (
            torch.randn(2, dit_cfg.seq_len, dit_cfg.in_channels, generator=gen),
            torch.rand(2, generator=gen),
            torch.randint(0, dit_cfg.n_classes, (2,), generator=gen),
        )
        return build_dit(dit_cfg, seed=0), inputs
    factory = _import(target)
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise ValueError(
            f"target: {target}() must return (model, example_inputs), got {type(result).__name__}"
        )
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
