"""The norm of one arm, built for each slot of a user's model: defined in
:mod:`normlab.patching.arm` (``replace_norms(model, to=kind)`` builds the same norms), named
here for the model sources."""

from normlab.patching.arm import (
    NORM_SEED,
    ArmNorm,
    BuiltNorm,
    check_slot_norm,
    forked_rng,
    slot_norm_kinds,
)

__all__ = ["NORM_SEED", "ArmNorm", "BuiltNorm", "check_slot_norm", "forked_rng", "slot_norm_kinds"]
