"""Backends that compute the norms of :mod:`normlab.functional`.

A backend is an object exposing the functions of :mod:`normlab.kernels.reference` with the same
signatures (:data:`BACKEND_FUNCTIONS`). ``"torch"`` (the reference composite) is always
available; other backends register themselves with :func:`register_backend`. ``"auto"`` picks
per device and dtype through :func:`auto_backend`; the environment variable ``NORMLAB_BACKEND``
sets the default at import.

A backend may also define ``available() -> bool`` (and ``unavailable_reason() -> str | None``)
when it can be registered but not run here, as ``"cpp"`` when no C++ compiler builds its
kernels, and ``unavailable_on(device_type) -> str | None`` when it cannot run tensors of one of
its device types here, as ``"compiled"`` on the CPU without a working C++ compiler. A backend
normlab ships that could not be registered here (``"triton"`` without a GPU, or without the
triton package) stays known with the reason. ``"auto"`` skips what cannot run silently; a call
that asks for a known backend by name (``backend=``, :func:`set_default_backend` or
``NORMLAB_BACKEND``) that cannot run here, or cannot take the tensor's device, raises
:class:`BackendUnavailableError` naming the backend and why; a name that is not known at all is
a ``ValueError`` listing the known ones. :func:`backend_unavailable_reason` tells in advance
(the benchmark uses it).

Modules: :mod:`~normlab.kernels.reference` (the math, stated once: the ``"torch"`` backend and
the row formulas of the fused norm), :mod:`~normlab.kernels.frontend` (the one host path of the
fast backends: fallback to the reference, row layout, autograd), and the providers behind it:
:mod:`~normlab.kernels.cpu` (``"cpp"``, C++ through ctypes), :mod:`~normlab.kernels.compiled`
(``"compiled"``, Inductor) and :mod:`~normlab.kernels.triton` (``"triton"``). Under torch.func
transforms and forward-mode AD every fast backend computes the reference formula.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from normlab.kernels import reference

BACKEND_FUNCTIONS: tuple[str, ...] = (
    "layer_norm",
    "rms_norm",
    "add_rms_norm",
    "add_layer_norm",
    "ada_rms_norm",
    "ada_layer_norm",
    "gated_residual",
    "gated_add_ada_rms_norm",
)
"""The functions every backend provides (those of :mod:`normlab.kernels.reference`)."""

_BACKENDS: dict[str, Any] = {"torch": reference}
_DEVICES: dict[str, tuple[str, ...]] = {"torch": ("cpu", "cuda", "mps", "xpu")}
_default_backend: str = os.environ.get("NORMLAB_BACKEND", "auto")
_UNREGISTERED: dict[str, str] = {}
"""Backends normlab ships that could not be registered in this process, with the reason (the
``"triton"`` backend without a GPU or without the triton package)."""
REFERENCE = "torch"
"""The reference backend: the formula in torch ops, which runs on every device torch has."""


class BackendUnavailableError(RuntimeError):
    """A backend asked for by name cannot run in this process (say, the C++ kernels of
    ``"cpp"`` could not be built, or ``"triton"`` has no GPU), or cannot take the tensor's device
    (a CUDA tensor for ``"cpp"``); ``"auto"`` would have picked another one silently."""


def register_backend(
    name: str,
    impl: ModuleType | Any,
    devices: Sequence[str] = ("cpu", "cuda"),
    *,
    overwrite: bool = False,
) -> None:
    """Make ``impl`` (an object with the reference backend's functions) available as ``name``.

    ``impl`` must provide every function of :data:`BACKEND_FUNCTIONS` as a callable (and, if it
    has them, ``available``, ``unavailable_reason`` and ``unavailable_on`` as callables).
    ``devices`` lists the device types (``torch.device.type``) the backend runs on here: asked
    for by name with a tensor on another device, it raises :class:`BackendUnavailableError`. A
    name that is already registered is replaced only with ``overwrite=True`` (registering the
    same object again just updates its devices).
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name: expected a non-empty backend name other than 'auto', got {name!r}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected a bool, got {type(overwrite).__name__} {overwrite!r}")
    missing = [f for f in BACKEND_FUNCTIONS if not callable(getattr(impl, f, None))]
    if missing:
        raise TypeError(
            f"impl: {type(impl).__name__} object lacks the backend function(s) "
            f"{', '.join(missing)}; expected an object (e.g. a module) with a callable for "
            "each name of normlab.kernels.BACKEND_FUNCTIONS, taking the arguments of the "
            "function of the same name in normlab.kernels.reference"
        )
    for optional in ("available", "unavailable_reason", "unavailable_on"):
        if hasattr(impl, optional) and not callable(getattr(impl, optional)):
            raise TypeError(
                f"impl: its {optional!r} attribute is a {type(getattr(impl, optional)).__name__}; "
                "expected a function taking no arguments"
            )
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise TypeError(
            f"devices: expected a non-empty tuple of device types such as ('cpu', 'cuda'), "
            f"got {devices!r}"
        )
    if not all(isinstance(d, str) and d for d in devices):
        raise ValueError(f"devices: expected device type names such as 'cpu', got {devices!r}")
    if name in _BACKENDS and _BACKENDS[name] is not impl and not overwrite:
        raise ValueError(
            f"name: backend {name!r} is already registered; expected a new name or "
            "overwrite=True to replace it"
        )
    _BACKENDS[name] = impl
    _DEVICES[name] = tuple(devices)
    _UNREGISTERED.pop(name, None)


def backends_for(device: torch.device | str, *, available_only: bool = False) -> list[str]:
    """Registered backends (not ``"auto"``) for ``device``'s type.

    With ``available_only=True``, only those that can run tensors of that device type in this
    process (see :func:`backend_available`; for ``"cpp"`` this builds the C++ kernels on the
    first call).
    """
    kind = torch.device(device).type
    if not isinstance(available_only, bool):
        raise TypeError(
            f"available_only: expected a bool, got {type(available_only).__name__} "
            f"{available_only!r}"
        )
    names = sorted(name for name, kinds in _DEVICES.items() if kind in kinds)
    return [n for n in names if backend_available(n, kind)] if available_only else names


def available_backends() -> list[str]:
    """Names of the registered backends, plus ``"auto"``."""
    return ["auto", *sorted(_BACKENDS)]


def known_backends() -> list[str]:
    """:func:`available_backends` and the backends normlab ships that could not be registered
    here (asking for one by name raises :class:`BackendUnavailableError` with the reason)."""
    return ["auto", *sorted({*_BACKENDS, *_UNREGISTERED})]


def set_default_backend(name: str) -> None:
    """Set the backend used when a call passes ``backend=None``."""
    _check_name(name)
    global _default_backend
    _default_backend = name


def get_default_backend() -> str:
    return _default_backend


def backend_unavailable_reason(name: str, device: torch.device | str | None = None) -> str | None:
    """``None`` when the backend ``name`` can run in this process, else why not and how to get it.

    ``"auto"`` and backends without an ``available()`` function are always available; a backend
    normlab ships that could not be registered here (:func:`known_backends`) never is. With
    ``device``, also whether it takes tensors on that device here: one of the device types it was
    registered for, and its own ``unavailable_on(device_type)`` check (``"compiled"``: a working
    C++ compiler for the CPU, triton for CUDA); the reference ``"torch"`` takes every device.
    For ``"cpp"`` the first call builds the C++ kernels (a one-time compilation, cached on disk).
    Use it to tell whether ``backend=name`` would run, e.g. before timing it.
    """
    _check_name(name)
    if name == "auto" or name == REFERENCE:
        return None
    if name in _UNREGISTERED:
        return _UNREGISTERED[name]
    impl = _BACKENDS[name]
    available = getattr(impl, "available", None)
    if available is not None and not available():
        explain = getattr(impl, "unavailable_reason", None)
        reason = explain() if explain is not None else None
        return reason or f"backend {name!r} reports itself unavailable in this process"
    if device is None:
        return None
    kind = torch.device(device).type
    if kind not in _DEVICES[name]:
        return f"it takes tensors on {' or '.join(_DEVICES[name])} here, and this one is on {kind}"
    on_device = getattr(impl, "unavailable_on", None)
    return on_device(kind) if on_device is not None else None


def backend_available(name: str, device: torch.device | str | None = None) -> bool:
    """Whether ``backend=name`` can run here (on ``device``, if given; see
    :func:`backend_unavailable_reason`)."""
    return backend_unavailable_reason(name, device) is None


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
    formula so that it fuses into the caller's graph (``"triton"``: to its custom operator).
    ``backend=`` per call and the ``NORMLAB_BACKEND`` environment variable override this
    choice; unlike ``"auto"``, a backend named there that cannot run raises
    :class:`BackendUnavailableError`.
    """
    kind = x.device.type
    if kind == "cpu":
        return "cpp" if "cpp" in _BACKENDS and backend_available("cpp") else "torch"
    if kind == "cuda" and x.dtype != torch.float64:
        for name in ("triton", "compiled"):
            if name in _BACKENDS and backend_available(name, x.device):
                return name
    return "torch"


def resolve_backend(name: str | None, x: torch.Tensor) -> Any:
    """Return the backend object for ``name`` (``None`` means the default) and tensor ``x``.

    A backend named explicitly (here or as the default) that cannot run in this process, or
    cannot take ``x``'s device (:func:`backend_unavailable_reason`), raises
    :class:`BackendUnavailableError`; ``"auto"`` picks an available one instead. While
    ``torch.compile`` traces the caller the check is skipped: every backend then hands the call
    to the reference formula anyway.
    """
    from_default = name is None
    name = _default_backend if name is None else name
    _check_name(name, from_default)
    if name == "auto":
        return _BACKENDS[auto_backend(x)]
    if name != REFERENCE and not torch.compiler.is_compiling():
        reason = backend_unavailable_reason(name, x.device)
        if reason is not None:
            origin = (
                f"the default backend {name!r} (NORMLAB_BACKEND or set_default_backend)"
                if from_default
                else f"{name!r}"
            )
            raise BackendUnavailableError(
                f"backend: {origin} was asked for but cannot run here: {reason}. Or use "
                "backend='auto' (picks an available backend silently) or backend='torch' "
                "(the reference formula)."
            )
    return _BACKENDS[name]


def _check_name(name: object, from_default: bool = False) -> None:
    """ValueError listing :func:`known_backends` unless ``name`` is one of them."""
    if isinstance(name, str) and (name == "auto" or name in _BACKENDS or name in _UNREGISTERED):
        return
    where = " (the default, from NORMLAB_BACKEND or set_default_backend)" if from_default else ""
    raise ValueError(
        f"backend: unknown backend {name!r}{where}; expected one of {', '.join(known_backends())}"
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
if _register_triton is not None and not _register_triton():
    from normlab.kernels.triton import unavailable_reason as _triton_reason

    _UNREGISTERED["triton"] = _triton_reason() or "the triton backend could not be registered"
