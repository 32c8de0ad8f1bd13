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
from normlab.models.external.record import HeldNorm, NormSwapRecord, SwappedNorm
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
    factory); ``factory``: the factory (None for transformers).
    """

    spec: SourceSpec
    settings: dict[str, Any]
    vocab_size: int
    attn_implementation: str = "eager"
    config: Any = None
    factory: Any = None
    _kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

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
        model is checked on a dry batch :data:`DRY_BATCH` (logits [B, T, V]).
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
        if arm is None:
            swapped: list[SwappedNorm] = []
            held = [
                HeldNorm(paths, class_name(m), "the model's own norms (no arm norm given)")
                for m, paths in _norms(net)
            ]
        else:
            swapped, held = swap_norms(net, arm)
        record = self._record(norm, swapped, held)
        return SourceLM(
            net, record, self.vocab_size, is_hf=True, max_length=self.max_length
        ), record

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
) -> ModelSource:
    """Parse and check a ``--model`` source and its ``--model-set`` settings, before any run.

    ``source``: ``hf:<folder or model_type>`` or ``package.module:factory``. ``settings``:
    ``"key=value,…"`` or a mapping (values parsed as int / float / bool / None / str).
    ``vocab_size``: the tokenizer's vocabulary size V. Transformers sources get their config
    built (and its keys checked); factories get imported and their signature checked. Errors are
    one-line ValueErrors naming the option (``--model``, ``--model-set``) or the argument.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size: expected an int >= 2, got {vocab_size!r}")
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, "
            f"got {attn_implementation!r}"
        )
    spec = parse_source(source)
    parsed = parse_settings(settings)
    if spec.kind == "hf":
        config = hf_config(spec.target, parsed, vocab_size)
        return ModelSource(spec, parsed, vocab_size, attn_implementation, config=config)
    factory = load_factory(spec.target)
    kwargs = factory_kwargs(factory, spec.target, parsed, vocab_size)
    return ModelSource(
        spec, parsed, vocab_size, attn_implementation, factory=factory, _kwargs=kwargs
    )


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
