"""Fused Triton kernels for every norm of :mod:`normlab.functional`, forward and backward.

The backend registers itself as ``"triton"`` when the ``triton`` package imports and a device
can run it: CUDA (or ROCm) GPUs, and the CPU when ``TRITON_INTERPRET=1`` is set before Triton
is first imported (Triton's interpreter: slow, for tests). Without ``triton`` nothing is
registered and importing normlab still works.

Modules: ``config`` (launch heuristics), ``helpers``/``forward``/``backward``/``reduce``
(device code), ``launch`` (host code: allocate, pick the launch shape, launch), ``backend``
(the provider behind :mod:`normlab.kernels.frontend`, and the backend functions), ``ops``
(``torch.library`` custom ops, what ``torch.compile`` and ``torch.export`` trace).
"""

from __future__ import annotations

import os

import torch

_TRUTHY = ("1", "true", "yes", "on", "y")


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to run kernels on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUTHY


def supported_devices() -> tuple[str, ...]:
    """Device types the kernels can run on in this process (may be empty)."""
    devices = []
    if torch.cuda.is_available():
        devices.append("cuda")
    if interpreter_requested():
        devices.append("cpu")
    return tuple(devices)


def triton_importable() -> bool:
    """Whether the ``triton`` package imports here."""
    try:
        import triton  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def unavailable_reason() -> str | None:
    """Why the kernels cannot run in this process (the triton package does not import, or no
    device can run them); None when they can."""
    try:
        import triton  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        return f"the triton package does not import here ({message}); pip install triton"
    if not supported_devices():
        return (
            "no CUDA GPU is visible here (torch.cuda.is_available() is False) and "
            "TRITON_INTERPRET=1 was not set before triton was imported (Triton's CPU "
            "interpreter: slow, for tests)"
        )
    return None


def register() -> bool:
    """Register the ``"triton"`` backend for :func:`supported_devices`; False if it cannot run."""
    devices = supported_devices()
    if not devices or not triton_importable():
        return False
    from normlab.kernels import register_backend
    from normlab.kernels.triton import backend

    register_backend("triton", backend, devices=devices)
    return True
