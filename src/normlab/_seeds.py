"""Generator seeds derived from names: the same (seed, name) gives the same stream anywhere.

:func:`parameter_seed` seeds the paired initialisation of the testbeds' shared parameters
(:mod:`normlab.models.init`) and each arm norm built for a model's norm slot
(:class:`normlab.patching.arm.ArmNorm`).
"""

from __future__ import annotations

import hashlib


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed derived from (``seed``, ``name``): the first 8 bytes,
    little-endian, of sha256(``f"{seed}:{name}"``), with the top bit cleared."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
