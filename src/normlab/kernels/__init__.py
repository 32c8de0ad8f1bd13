"""Backends that compute the norms of :mod:`normlab.functional`.

A backend is an object exposing the functions of :mod:`normlab.kernels.reference` with the same
signatures. ``"torch"`` (the reference composite) is always available; other backends register
themselves with :func:`register_backend`. ``"auto"`` picks per device and dtype through
:func:`auto_backend`; the environment variable ``NORMLAB_BACKEND`` sets the default at import.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from normlab.kernels import reference

_BACKENDS: dict[str, Any] = {"torch": reference}
_DEVICES: dict[str, tuple[str, ...]] = {"torch": ("cpu", "cuda", "mps", "xpu")}
_default_backend: str = os.environ.get("NORMLAB_BACKEND", "auto")


def register_backend(
    name: str, impl: ModuleType | Any, devices: tuple[str, ...] = ("cpu", "cuda")
) -> None:
    """Make ``impl`` (an object with the reference backend's functions) available as ``name``.

    ``devices`` lists the device types (``torch.device.type``) the backend runs on here.
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name: expected a non-empty backend name other than 'auto', got {name!r}")
    _BACKENDS[name] = impl
    _DEVICES[name] = tuple(devices)


def backends_for(device: torch.device | str) -> list[str]:
    """Registered backends (not ``"auto"``) that run on ``device``'s type."""
    kind = torch.device(device).type
    return sorted(name for name, kinds in _DEVICES.items() if kind in kinds)


def available_backends() -> list[str]:
    """Names of the registered backends, plus ``"auto"``."""
    return ["auto", *sorted(_BACKENDS)]


def set_default_backend(name: str) -> None:
    """Set the backend used when a call passes ``backend=None``."""
    _check_name(name)
    global _default_backend
    _default_backend = name


def get_default_backend() -> str:
    return _default_backend


def auto_backend(x: torch.Tensor) -> str:
    """The backend ``"auto"`` resolves to for a tensor: the fastest one measured for its device.

    ===========  ==============================  ==========================================
    device       dtypes                          backend
    ===========  ==============================  ==========================================
    cpu          float32, bfloat16, float16,     ``"cpp"`` (fused C++ kernels, built on first
                 float64                         use); ``"torch"`` if they cannot be built
    cuda         float32, bfloat16, float16      ``"triton"`` when registered, else
                                                 ``"compiled"`` (Inductor)
    cuda         float64                         ``"torch"``
    other        any                             ``"torch"``
    ===========  ==============================  ==========================================

    While ``torch.compile`` traces the caller, every backend hands the call to the reference
    formula so that it fuses into the caller's graph. ``backend=`` per call and the
    ``NORMLAB_BACKEND`` environment variable override this choice.
    """
    kind = x.device.type
    if kind == "cpu":
        return "cpp" if "cpp" in _BACKENDS and _BACKENDS["cpp"].available() else "torch"
    if kind == "cuda" and x.dtype != torch.float64:
        for name in ("triton", "compiled"):
            if kind in _DEVICES.get(name, ()):
                return name
    return "torch"


def resolve_backend(name: str | None, x: torch.Tensor) -> Any:
    """Return the backend object for ``name`` (``None`` means the default) and tensor ``x``."""
    name = _default_backend if name is None else name
    _check_name(name)
    if name == "auto":
        name = auto_backend(x)
    return _BACKENDS[name]


def _check_name(name: object) -> None:
    if name != "auto" and name not in _BACKENDS:
        raise ValueError(
            f"backend: unknown backend {name!r}; expected one of {', '.join(available_backends())}"
        )


from normlab.kernels import compiled as _compiled  # noqa: E402  (needs register_backend above)
from normlab.kernels import cpu as _cpu  # noqa: E402

register_backend("compiled", _compiled, devices=("cpu", "cuda"))
register_backend("cpp", _cpu, devices=("cpu",))

# Optional backends register themselves when their dependencies and a device for them exist.
try:
    from normlab.kernels.triton import register as _register_triton
except ImportError:  # pragma: no cover - the package ships with normlab
    _register_triton = None
if _register_triton is not None:
    _register_triton()
