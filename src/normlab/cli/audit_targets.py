"""Turn a command-line target into something to audit.

A norm target is a registry kind (``rmsnorm``, ``layernorm``, …, and ``dyt``: the names
``normlab compare`` accepts, except ``none``, which is no module at all) or
``package.module:Name`` naming a module class (built as ``Name(dim)``), a module, a callable
taking ``x`` (or ``(x, (dim,))`` like ``torch.nn.functional.layer_norm``) or a factory
``make(dim)`` returning a module (or a callable taking ``x``). A model target is ``gpt``
(normlab's GPT testbed: any unconditional norm kind × placement), ``dit`` (normlab's small DiT
for flow matching: any conditional norm kind, pre-norm with gated residuals), both in the
default configuration of ``normlab compare``'s testbed, ``hf:<folder or model_type>`` (a
transformers causal LM built from its config with ``--model-set`` overrides, randomly
initialised, as ``normlab compare --model`` builds it: :func:`source_model`), or
``package.module:factory`` where ``factory()`` returns ``(model, example_inputs)``.

Errors are ``ValueError`` messages that start with the argument at fault: ``target:``,
``dim:``, ``norm:`` or ``placement:``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from normlab.audit.probe import check_probe_dim, module_weight
from normlab.models.norms import NO_NORM  # importing it registers "dyt", as compare sees it
from normlab.registry import available_norms, is_conditional, make_norm


def _import(target: str, expected: str) -> Any:
    """The object that ``package.module:Name`` names; ``expected`` lists what a target may be,
    for the error when ``target`` is not of that form."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target: {target!r} is neither {expected}")
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
    obj = _import(
        target,
        f"a registered norm ({', '.join(available_norms())}) nor of the form 'package.module:Name'",
    )
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        try:
            module = obj(dim)
        except TypeError as err:
            raise ValueError(f"target: cannot build {target}({dim}): {err}") from None
        return _as_callable(module, dim)
    if isinstance(obj, nn.Module):
        return _as_callable(obj, dim)
    if callable(obj):
        return _functional(obj, dim, target)
    raise ValueError(f"target: {target!r} is not a module class, a module or a callable")


def check_dim(dim: object) -> int:
    """The probes' vector size: an even integer >= :data:`~normlab.audit.probe.MIN_DIM`."""
    return check_probe_dim(dim)


def _as_callable(
    module: nn.Module, dim: int
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    weight = module_weight(module, dim)
    forward_args = module.forward.__code__.co_varnames[: module.forward.__code__.co_argcount]
    if "cond" in forward_args:  # a conditional norm: probe it with a zero condition

        def call(x: torch.Tensor) -> torch.Tensor:
            cond = torch.zeros(x.shape[0], dim, dtype=x.dtype)
            return module.to(x.dtype)(x, cond)[0]

        return call, weight
    return module, weight


_CALL_ERRORS = (TypeError, ValueError, RuntimeError, IndexError, AttributeError)


def _functional(
    fn: Callable[..., Any], dim: int, target: str
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """The callable to probe for a function target, and its gain (a factory's module's).

    Tried in order: ``fn(x)`` (a norm function), ``fn(x, (dim,))`` (as
    ``torch.nn.functional.layer_norm``), then ``fn(dim)`` (a factory returning a module, or a
    callable taking x). A call with x counts only if it returns a tensor (or a tuple starting
    with one).
    """
    probe = torch.randn(2, dim)
    failures = []
    for label, call, wrapped in (
        ("fn(x)", lambda: fn(probe), fn),
        ("fn(x, (dim,))", lambda: fn(probe, (dim,)), lambda x: fn(x, (dim,))),
    ):
        try:
            out = call()
        except _CALL_ERRORS as err:
            failures.append(f"as {label}: {type(err).__name__}: {err}")
            continue
        first = out[0] if isinstance(out, tuple) and out else out
        if isinstance(first, torch.Tensor):
            return wrapped, None
        failures.append(f"as {label}: returned {type(out).__name__}, not a tensor")
    try:
        built = fn(dim)
    except _CALL_ERRORS as err:
        failures.append(f"as a factory fn(dim): {type(err).__name__}: {err}")
    else:
        if isinstance(built, nn.Module):
            return _as_callable(built, dim)
        if callable(built):
            return built, None
        failures.append(f"as a factory fn(dim): returned {type(built).__name__}, not a module")
    raise ValueError(
        f"target: {target} is a callable, but it works neither as a norm fn(x) or "
        f"fn(x, (dim,)) nor as a factory fn(dim) returning a module (dim={dim}): "
        + "; ".join(failures)
    )


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
        from normlab.models.norms import check_dit_norm

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


def testbed_model(target: str, norm: str, placement: str) -> tuple[nn.Module, tuple[Any, ...]]:
    """The testbed ``target`` (``gpt`` or ``dit``) as ``normlab compare`` builds it by default.

    The model settings are the testbeds' config defaults, which are the experiment config's
    (:class:`~normlab.models.GPTConfig` for the GPT, :class:`~normlab.models.DiTSettings` on
    the default :class:`~normlab.experiment.testbeds.dit.ShapesSettings` data for the DiT), so the
    audit sees the model that ``compare`` trains: for the GPT with ``layernorm``, 4 layers and
    214,144 parameters. The example inputs are a batch of 2: token ids [2, context] for the GPT;
    (x_t [2, T, C], t [2], label [2]) for the (class-conditional) DiT.
    """
    from normlab.data.shapes import SHAPE_CLASSES
    from normlab.experiment.testbeds.dit import ShapesSettings
    from normlab.models import DiTSettings

    check_testbed_options(norm, placement, target)
    gen = torch.Generator().manual_seed(0)
    if target == "gpt":
        from normlab.models import GPT, GPTConfig

        cfg = GPTConfig(norm=norm, placement=placement)
        return GPT(cfg), (torch.randint(0, cfg.vocab_size, (2, cfg.context), generator=gen),)
    from normlab.models import build_dit

    shapes = ShapesSettings()
    dit_cfg = DiTSettings().dit_config(shapes.in_channels, shapes.seq_len, len(SHAPE_CLASSES), norm)
    inputs: tuple[Any, ...] = (
        torch.randn(2, dit_cfg.seq_len, dit_cfg.in_channels, generator=gen),
        torch.rand(2, generator=gen),
    )
    if dit_cfg.n_classes > 0:  # a class-conditional DiT (compare's default) takes labels
        inputs = (*inputs, torch.randint(0, dit_cfg.n_classes, (2,), generator=gen))
    return build_dit(dit_cfg, seed=0), inputs


HF_PREFIX = "hf:"
"""A model target built by a model source (:mod:`normlab.models.external`)."""


def is_source_target(target: str) -> bool:
    """Whether a model target is a transformers model source (``hf:…``)."""
    return target.startswith(HF_PREFIX)


def source_model(
    target: str, settings: str | None = None, norm: str | None = None
) -> tuple[nn.Module, tuple[Any, ...]]:
    """The model source ``target`` (``hf:<folder or model_type>``) with the ``--model-set``
    overrides ``settings``, built for seed 0 with the arm ``norm``'s norms in every norm slot
    (None: the model's own norms), on a byte vocabulary (256), with token ids [2, 16] as
    example inputs (:func:`normlab.models.external.audit_target`). Errors name ``--model``
    (here the target) or ``--model-set``."""
    from normlab.models.external import audit_target

    model, inputs = audit_target(target, settings, norm=norm)
    return model, tuple(inputs)


def load_model(
    target: str, norm: str, placement: str, settings: str | None = None
) -> tuple[nn.Module, tuple[Any, ...]]:
    """A model and example inputs for a model audit (``norm`` and ``placement``: testbeds only;
    ``settings``: the ``--model-set`` overrides of an ``hf:`` target).

    ``gpt`` and ``dit``: the testbed in ``normlab compare``'s default configuration
    (:func:`testbed_model`). ``hf:…``: a transformers model source (:func:`source_model`; its
    own norms). Otherwise ``target`` is ``package.module:factory`` and ``factory()`` returns
    ``(model, example_inputs)``.
    """
    if target in TESTBEDS:
        return testbed_model(target, norm, placement)
    if is_source_target(target):
        return source_model(target, settings)
    factory = _import(
        target,
        f"a testbed ({', '.join(TESTBEDS)}), '{HF_PREFIX}<folder or model_type>' nor of the form "
        "'package.module:factory'",
    )
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise ValueError(
            f"target: {target}() must return (model, example_inputs), got {type(result).__name__}"
        )
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
