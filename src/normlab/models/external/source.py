"""A model source, checked once, that builds each arm's model for a seed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from normlab.audit.model import is_norm_module
from normlab.models.external.arm import ArmNorm, forked_rng
from normlab.models.external.factory import MAKE_NORM, factory_kwargs, load_factory
from normlab.models.external.hf import ATTENTION_IMPLEMENTATIONS, build_hf_model, hf_config
from normlab.models.external.lm import SourceLM
from normlab.models.external.mup import (
    PARAMETRIZATION_OPTION,
    PARAMETRIZATIONS,
    MupError,
    SourceMup,
    apply_mup,
    hidden_ratios,
)
from normlab.models.external.record import HeldNorm, NormSwapRecord, SwappedNorm
from normlab.models.external.scaling import (
    WIDTH_KEY,
    ScalingError,
    config_int,
    scaled_keys,
    with_changes,
)
from normlab.models.external.spec import (
    MODEL_OPTION,
    SETTINGS_OPTION,
    SourceSpec,
    parse_settings,
    parse_source,
)
from normlab.models.external.swap import module_repr, swap_norms
from normlab.patching.candidates import class_name

DRY_BATCH = (2, 4)
"""The token batch [B, T] every built model is checked on."""


@dataclass
class ModelSource:
    """A checked ``--model`` source with its settings; :meth:`build` makes an arm's model.

    Made by :func:`load_model_source`. ``spec``: the parsed source; ``settings``: the parsed
    ``--model-set`` values; ``vocab_size``: V, the tokenizer's; ``attn_implementation``: for
    transformers models (``eager`` or ``sdpa``); ``config``: the transformers config (None for a
    factory); ``factory``: the factory (None for transformers); ``parametrization``: ``sp`` or
    ``mup`` (transformers sources only, :mod:`normlab.models.external.mup`) with the base width
    ``base_hidden_size`` (None: the model's own ``hidden_size``, where ``mup`` is ``sp``).
    """

    spec: SourceSpec
    settings: dict[str, Any]
    vocab_size: int
    attn_implementation: str = "eager"
    config: Any = None
    factory: Any = None
    _kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    parametrization: str = "sp"
    base_hidden_size: int | None = None

    @property
    def factory_kwargs(self) -> dict[str, Any]:
        """A factory's keyword arguments besides ``make_norm`` (its settings, and
        ``vocab_size`` when it takes it); empty for a transformers source."""
        return dict(self._kwargs)

    @property
    def max_length(self) -> int | None:
        """The longest sequence the model takes (transformers: ``max_position_embeddings``;
        None when the config has none, and for a factory)."""
        value = getattr(self.config, "max_position_embeddings", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def resized(self, key: str, value: int) -> Any:
        """The transformers config of this source set to ``key`` = ``value`` by the size rule
        (:func:`~normlab.models.external.scaling.scaled_keys`: a width brings its heads and MLP
        widths along), built and checked as the source's own was; :class:`ScalingError` for a
        size the rule cannot make, :class:`SettingsError` for one the config refuses."""
        if self.config is None:
            raise ScalingError(f"{self.spec} is a factory; only a transformers config is resized")
        changes = scaled_keys(self.config, key, value)
        return hf_config(
            self.spec.target, with_changes(self.config, self.settings, changes), self.vocab_size
        )

    def mup_plan(self, net: nn.Module | None = None) -> SourceMup | None:
        """μP's plan for this source (None under ``sp``): the width, the base width and each
        hidden matrix's fan-in ratio against the base model built on the meta device; ``net``
        is the model (built on the meta device when not given). :class:`MupError` naming
        ``--parametrization`` when the model cannot be scaled."""
        if self.parametrization == "sp":
            return None
        if self.config is None:
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup scales a transformers config's width; "
                f"{self.spec} is a factory (its sizes are its own). Expected sp, or --model hf:…"
            )
        width = config_int(self.config, WIDTH_KEY)
        if width is None:
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup needs an integer {WIDTH_KEY} in the "
                f"{self.spec} config; expected sp"
            )
        base = width if self.base_hidden_size is None else self.base_hidden_size
        if base == width:
            return SourceMup(width, base)
        try:
            base_config = self.resized(WIDTH_KEY, base)
        except ValueError as err:
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: the base model at {WIDTH_KEY}={base} cannot be made "
                f"from {self.spec}: {str(err).removeprefix(f'{SETTINGS_OPTION}: ')}"
            ) from None
        with torch.device("meta"):
            base_net = build_hf_model(base_config, 0, self.attn_implementation)
            if net is None:
                net = build_hf_model(self.config, 0, self.attn_implementation)
        return SourceMup(width, base, hidden_ratios(net, base_net))

    def count_parameters(self, norm: str) -> int:
        """The parameters of the arm ``norm``'s model (tied weights once), without allocating
        its weights where the source allows: a transformers model is built on the meta device
        with only its norm modules made real (so that their slots can be probed and swapped);
        a factory is called on the meta device (and built for real if it cannot be)."""
        from normlab.models.external.footprint import meta_parameter_count

        if self.config is None:
            counted = meta_parameter_count(self, norm)
            if counted is None:
                counted = self.build(norm, 0)[0].count_parameters()[0]
            return counted
        with torch.device("meta"):
            net = build_hf_model(self.config, 0, self.attn_implementation)
        for module, _ in _norms(net):
            module.to_empty(device="cpu")
            with torch.no_grad():
                for p in module.parameters():
                    p.fill_(1.0)
        swap_norms(net, ArmNorm(norm))
        return sum(p.numel() for p in net.parameters())

    def build(self, norm: str | None, seed: int) -> tuple[SourceLM, NormSwapRecord]:
        """The arm ``norm``'s model for ``seed``, and what the arm did to its norms.

        Transformers: the model is built from the config with every parameter drawn from
        torch's generator seeded with ``seed`` (:func:`~normlab.models.external.hf.build_hf_model`),
        the same in every arm, then each norm slot is swapped for the arm's norm
        (:func:`~normlab.models.external.swap.swap_norms`); ``norm=None`` keeps the model's own
        norms (for audits). Factory: ``factory(make_norm, **settings)`` runs with torch's
        generator seeded with ``seed`` and ``make_norm`` the arm's norm, which draws nothing from
        that stream; norms the factory builds without ``make_norm`` are held. Either way the
        shared parameters depend on the seed alone, the arm's norms on the kind alone, and the
        model is checked on a dry batch :data:`DRY_BATCH` (logits [B, T, V]). Under ``mup`` the
        transformers model is scaled after its draws and before its norms are swapped
        (:func:`~normlab.models.external.mup.apply_mup`); ``model.mup`` holds the plan.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        if self.spec.kind == "hf":
            model, record = self._build_hf(norm, seed)
        else:
            model, record = self._build_factory(norm, seed)
        dry_run(model)
        return model, record

    def _record(
        self, kind: str | None, swapped: list[SwappedNorm], held: list[HeldNorm]
    ) -> NormSwapRecord:
        settings = {**self.settings, "vocab_size": self.vocab_size}
        return NormSwapRecord(str(self.spec), kind, tuple(swapped), tuple(held), settings)

    def _build_hf(self, norm: str | None, seed: int) -> tuple[SourceLM, NormSwapRecord]:
        arm = None if norm is None else ArmNorm(norm)
        net = build_hf_model(self.config, seed, self.attn_implementation)
        mup = self.mup_plan(net)
        if mup is not None:
            apply_mup(net, mup)
        if arm is None:
            swapped: list[SwappedNorm] = []
            held = [
                HeldNorm(paths, class_name(m), "the model's own norms (no arm norm given)")
                for m, paths in _norms(net)
            ]
        else:
            swapped, held = swap_norms(net, arm)
        record = self._record(norm, swapped, held)
        model = SourceLM(net, record, self.vocab_size, is_hf=True, max_length=self.max_length)
        model.mup = mup
        return model, record

    def _build_factory(self, norm: str | None, seed: int) -> tuple[SourceLM, NormSwapRecord]:
        if norm is None:
            raise ValueError(
                f"norm: the factory source {self.spec} builds its norms through {MAKE_NORM}; "
                "expected a norm kind"
            )
        arm = ArmNorm(norm)
        with forked_rng():
            torch.manual_seed(seed)
            try:
                net = self.factory(**{MAKE_NORM: arm}, **self._kwargs)
            except Exception as err:  # whatever the user's factory raises
                message = " ".join(str(err).split())
                raise ValueError(
                    f"{MODEL_OPTION}: {self.spec}({MAKE_NORM}, **settings) raised "
                    f"{type(err).__name__}: {message} (check the {SETTINGS_OPTION} values)"
                ) from err
        if not isinstance(net, nn.Module):
            raise ValueError(
                f"{MODEL_OPTION}: {self.spec} returned {type(net).__name__}; expected a "
                "torch.nn.Module causal LM"
            )
        built = {id(b.module): b for b in arm.built}
        inside = {id(m) for b in arm.built for m in b.module.modules() if m is not b.module}
        swapped, held = [], []
        for module, paths in _norms(net, extra=built):
            if id(module) in inside and id(module) not in built:
                continue  # a part of an arm's norm (a kind built from other norms)
            if id(module) in built:
                b = built[id(module)]
                swapped.append(
                    SwappedNorm(
                        paths, class_name(module), arm.kind, b.dim, b.eps, module_repr(module)
                    )
                )
            elif not any(id(m) in built for m in module.modules()):
                held.append(
                    HeldNorm(
                        paths,
                        class_name(module),
                        f"built by the factory itself, not through {MAKE_NORM}: the same in "
                        "every arm",
                    )
                )
        record = self._record(norm, swapped, held)
        return SourceLM(net, record, self.vocab_size, is_hf=False), record

    def example_inputs(
        self, batch: int = 2, length: int = 16, seed: int = 0
    ) -> tuple[torch.Tensor]:
        """Token ids [``batch``, ``length``] drawn from a generator seeded with ``seed``
        (``length`` capped at :attr:`max_length`), as the model's forward takes them."""
        if self.max_length is not None:
            length = min(length, self.max_length)
        gen = torch.Generator().manual_seed(seed)
        return (torch.randint(0, self.vocab_size, (batch, length), generator=gen),)


def _norms(
    model: nn.Module, extra: dict[int, Any] | None = None
) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """Each norm module (or module in ``extra``) once, with every path that reaches it."""
    extra = extra or {}
    found: dict[int, tuple[nn.Module, list[str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name and (is_norm_module(module) or id(module) in extra):
            found.setdefault(id(module), (module, []))[1].append(name)
    return [(m, tuple(paths)) for m, paths in found.values()]


def dry_run(model: SourceLM) -> None:
    """One forward of a :data:`DRY_BATCH` of token ids without gradients, in eval mode
    (restored) and a forked random state: ValueError naming ``--model`` unless logits
    [B, T, V] come back (the model's own error, if it raises, is chained to it)."""
    was_training = model.training
    model.eval()
    tokens = torch.arange(DRY_BATCH[0] * DRY_BATCH[1]).reshape(DRY_BATCH) % model.vocab_size
    try:
        with forked_rng(), torch.no_grad():
            model(tokens)
    except ValueError as err:
        if str(err).startswith(f"{MODEL_OPTION}: "):  # the output check's own message
            raise
        raise _dry_run_error(model, err) from err
    except Exception as err:  # whatever the user's model raises
        raise _dry_run_error(model, err) from err
    finally:
        model.train(was_training)


def _dry_run_error(model: SourceLM, err: Exception) -> ValueError:
    message = " ".join(str(err).split())
    return ValueError(
        f"{MODEL_OPTION}: {model.record.source} failed on a dry batch of token ids "
        f"{list(DRY_BATCH)}: {type(err).__name__}: {message}; expected logits "
        f"[{DRY_BATCH[0]}, {DRY_BATCH[1]}, {model.vocab_size}] (check the {SETTINGS_OPTION} values)"
    )


def load_model_source(
    source: str,
    settings: str | dict[str, Any] | None = None,
    *,
    vocab_size: int,
    attn_implementation: str = "eager",
    parametrization: str = "sp",
    base_hidden_size: int | None = None,
) -> ModelSource:
    """Parse and check a ``--model`` source and its ``--model-set`` settings, before any run.

    ``source``: ``hf:<folder or model_type>`` or ``package.module:factory``. ``settings``:
    ``"key=value,…"`` or a mapping (values parsed as int / float / bool / None / str).
    ``vocab_size``: the tokenizer's vocabulary size V. Transformers sources get their config
    built (and its keys checked); factories get imported and their signature checked. Under
    ``parametrization="mup"`` the μP plan is made once on the meta device
    (:meth:`ModelSource.mup_plan`), so a model μP cannot scale is refused here. Errors are
    one-line ValueErrors naming the option (``--model``, ``--model-set``,
    ``--parametrization``) or the argument.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size: expected an int >= 2, got {vocab_size!r}")
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, "
            f"got {attn_implementation!r}"
        )
    if parametrization not in PARAMETRIZATIONS:
        raise ValueError(
            f"{PARAMETRIZATION_OPTION}: expected one of {', '.join(PARAMETRIZATIONS)}, got "
            f"{parametrization!r}"
        )
    spec = parse_source(source)
    parsed = parse_settings(settings)
    mup = {"parametrization": parametrization, "base_hidden_size": base_hidden_size}
    if spec.kind == "hf":
        config = hf_config(spec.target, parsed, vocab_size)
        loaded = ModelSource(spec, parsed, vocab_size, attn_implementation, config=config, **mup)
    else:
        factory = load_factory(spec.target)
        kwargs = factory_kwargs(factory, spec.target, parsed, vocab_size)
        loaded = ModelSource(
            spec, parsed, vocab_size, attn_implementation, factory=factory, _kwargs=kwargs, **mup
        )
    loaded.mup_plan()
    return loaded


def audit_target(
    source: str,
    settings: str | dict[str, Any] | None = None,
    *,
    norm: str | None = None,
    vocab_size: int = 256,
    length: int = 16,
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``(model, example_inputs)`` for ``normlab audit model``: the source's model for seed 0
    with the arm ``norm``'s norms (None: a transformers model's own norms) and token ids
    [2, ``length``] (see :meth:`ModelSource.example_inputs`). A model that could not be held
    in the available memory is refused first
    (:func:`~normlab.models.external.footprint.check_source_fits`)."""
    from normlab._resources import available_memory
    from normlab.models.external.footprint import check_source_fits

    loaded = load_model_source(source, settings, vocab_size=vocab_size)
    check_source_fits(
        loaded,
        batch_size=2,
        context=length,
        norm=norm or "rmsnorm",
        available=available_memory(),
        training=False,
    )
    model, _ = loaded.build(norm, 0)
    return model, loaded.example_inputs(2, length)
