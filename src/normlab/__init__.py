"""normlab: normalization layers done right.

Exact LayerNorm, RMSNorm (LLaMA ``w`` and Gemma ``1 + w`` gains), AdaRMS and adaLN-Zero, with
statistics per token over the last dimension in float32 and ε inside the square root.
"""

from normlab import functional
from normlab.kernels import (
    BackendUnavailableError,
    available_backends,
    register_backend,
    set_default_backend,
)
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm
from normlab.modulation import dit_to_pi05, pi05_to_dit, reorder_chunks, reorder_linear
from normlab.patching import NormReplacement, replace_norms
from normlab.registry import available_norms, is_conditional, make_norm, register_norm


def _read_version() -> str:
    """normlab's version: the installed distribution's metadata (``importlib.metadata``), so
    that pyproject.toml is the only place it is written. Without metadata (a source tree on
    ``sys.path``, not installed), the version in that tree's pyproject.toml; failing both,
    ``"0+unknown"``."""
    from importlib import metadata

    try:
        return metadata.version("normlab")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "0+unknown"
    version = project.get("version")
    return version if project.get("name") == "normlab" and isinstance(version, str) else "0+unknown"


__version__ = _read_version()

__all__ = [
    "AdaLayerNormZero",
    "AdaRMSNorm",
    "BackendUnavailableError",
    "LayerNorm",
    "NormReplacement",
    "RMSNorm",
    "__version__",
    "available_backends",
    "available_norms",
    "dit_to_pi05",
    "functional",
    "is_conditional",
    "make_norm",
    "pi05_to_dit",
    "register_backend",
    "register_norm",
    "reorder_chunks",
    "reorder_linear",
    "replace_norms",
    "set_default_backend",
]
