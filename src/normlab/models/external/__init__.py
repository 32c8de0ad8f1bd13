"""Model sources for ``normlab compare`` on a user's own causal LM.

A source is a transformers model built from a config (``hf:llama``, ``hf:path/to/folder``) or a
factory (``package.module:factory``, called as ``factory(make_norm, **settings)``). For an arm
(a norm kind) and a seed, :meth:`ModelSource.build` returns the model, wrapped as a
:class:`SourceLM` (``logits = model(tokens)``), and a :class:`NormSwapRecord` of which norm
modules hold the arm's norm and which were held as they are, and why. Paired start: for a seed,
every parameter the arms share starts from the same values (:func:`check_same_start`).

Importing this package does not import transformers; building an ``hf:`` source does.
"""

from normlab.models.external.arm import ArmNorm, check_slot_norm, slot_norm_kinds
from normlab.models.external.footprint import Footprint, check_source_fits
from normlab.models.external.hf import causal_lm_types
from normlab.models.external.lm import (
    SourceLM,
    check_same_start,
    output_logits,
    shared_digests,
    shared_parameter_names,
)
from normlab.models.external.record import HeldNorm, NormSwapRecord, SwappedNorm
from normlab.models.external.source import (
    DRY_BATCH,
    ModelSource,
    audit_target,
    load_model_source,
)
from normlab.models.external.spec import (
    MODEL_OPTION,
    SETTINGS_OPTION,
    SettingsError,
    SourceSpec,
    UnknownModelError,
    parse_settings,
    parse_source,
    parse_value,
)

__all__ = [
    "DRY_BATCH",
    "MODEL_OPTION",
    "SETTINGS_OPTION",
    "ArmNorm",
    "Footprint",
    "HeldNorm",
    "ModelSource",
    "NormSwapRecord",
    "SettingsError",
    "SourceLM",
    "SourceSpec",
    "SwappedNorm",
    "UnknownModelError",
    "audit_target",
    "causal_lm_types",
    "check_same_start",
    "check_slot_norm",
    "check_source_fits",
    "load_model_source",
    "output_logits",
    "parse_settings",
    "parse_source",
    "parse_value",
    "shared_digests",
    "shared_parameter_names",
    "slot_norm_kinds",
]
