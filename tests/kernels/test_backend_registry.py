"""The backend registry: registering, replacing and checking backends, and availability."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab import kernels
from normlab.kernels import (
    BACKEND_FUNCTIONS,
    BackendUnavailableError,
    backend_available,
    backend_unavailable_reason,
    backends_for,
    reference,
)

# ----------------------------------------------------------------------------------------------
# Found in review of the public API
# ----------------------------------------------------------------------------------------------
D, C = 16, 8


def _reference_like(**extra: object) -> SimpleNamespace:
    """A valid backend object: the reference functions, plus ``extra`` attributes."""
    return SimpleNamespace(**{f: getattr(reference, f) for f in BACKEND_FUNCTIONS}, **extra)


@pytest.fixture
def registry_restored() -> Iterator[None]:
    """Put the backend registry back as it was after the test."""
    backends, devices = dict(kernels._BACKENDS), dict(kernels._DEVICES)
    yield
    kernels._BACKENDS.clear()
    kernels._BACKENDS.update(backends)
    kernels._DEVICES.clear()
    kernels._DEVICES.update(devices)


# ----------------------------------------------------------------------------------------------
# 1. a backend asked for by name that cannot run raises; "auto" skips it
# ----------------------------------------------------------------------------------------------
def test_an_unavailable_backend_asked_for_by_name_raises_with_the_reason(
    registry_restored: None,
) -> None:
    fake = _reference_like(available=lambda: False, unavailable_reason=lambda: "no fake chip")
    normlab.register_backend("fake_unavailable", fake, devices=("meta",))
    x = torch.randn(2, D)
    assert not backend_available("fake_unavailable")
    assert backend_unavailable_reason("fake_unavailable") == "no fake chip"
    assert backend_unavailable_reason("auto") is None and backend_available("torch")
    assert "fake_unavailable" in backends_for("meta")
    assert "fake_unavailable" not in backends_for("meta", available_only=True)
    with pytest.raises(BackendUnavailableError) as info:
        NF.rms_norm(x, backend="fake_unavailable")
    msg = str(info.value)
    assert msg.startswith("backend: 'fake_unavailable'") and "no fake chip" in msg
    assert isinstance(info.value, normlab.BackendUnavailableError)
    assert "backend='auto'" in msg and "backend='torch'" in msg
    kernels.set_default_backend("fake_unavailable")
    try:
        with pytest.raises(BackendUnavailableError, match="NORMLAB_BACKEND or set_default_backend"):
            NF.layer_norm(x)
    finally:
        kernels.set_default_backend("auto")


def test_an_available_backend_with_an_availability_check_runs(registry_restored: None) -> None:
    normlab.register_backend("fake_ok", _reference_like(available=lambda: True), devices=("cpu",))
    x = torch.randn(2, D)
    torch.testing.assert_close(NF.rms_norm(x, backend="fake_ok"), NF.rms_norm(x, backend="torch"))


def test_cpp_availability_is_consistent() -> None:
    from normlab.kernels import cpu

    reason = backend_unavailable_reason("cpp")
    assert (reason is None) == cpu.available() == backend_available("cpp")
    assert (reason is None) == ("cpp" in backends_for("cpu", available_only=True))


# ----------------------------------------------------------------------------------------------
# 4. register_backend validates the object and refuses to replace a name by accident
# ----------------------------------------------------------------------------------------------
def test_register_backend_refuses_an_object_without_the_backend_functions(
    registry_restored: None,
) -> None:
    x = torch.randn(2, D)
    before = NF.rms_norm(x, backend="torch")
    with pytest.raises(TypeError, match=r"^impl: .*lacks .*rms_norm.*expected"):
        normlab.register_backend("torch", object())
    partial = SimpleNamespace(rms_norm=reference.rms_norm)
    with pytest.raises(TypeError, match=r"impl: .*layer_norm") as info:
        normlab.register_backend("partial", partial)
    assert "function(s) layer_norm, add_rms_norm, add_layer_norm," in str(info.value)
    with pytest.raises(TypeError, match=r"^impl: its 'available' attribute"):
        normlab.register_backend("bad_available", _reference_like(available=True))
    torch.testing.assert_close(NF.rms_norm(x, backend="torch"), before)  # still the reference


def test_register_backend_replaces_a_name_only_with_overwrite(registry_restored: None) -> None:
    impl = _reference_like()
    with pytest.raises(
        ValueError, match=r"^name: backend 'torch' is already registered.*overwrite"
    ):
        normlab.register_backend("torch", impl)
    assert kernels._BACKENDS["torch"] is reference
    normlab.register_backend("mine", impl, devices=("cpu",))
    normlab.register_backend("mine", impl, devices=("cpu", "cuda"))  # the same object: fine
    assert "mine" in backends_for("cuda")
    with pytest.raises(ValueError, match=r"^name: backend 'mine'"):
        normlab.register_backend("mine", _reference_like())
    other = _reference_like()
    normlab.register_backend("mine", other, overwrite=True)
    assert kernels._BACKENDS["mine"] is other


@pytest.mark.parametrize(
    ("kwargs", "exc", "start"),
    [
        ({"devices": "cpu"}, TypeError, "devices:"),
        ({"devices": ()}, TypeError, "devices:"),
        ({"devices": ("cpu", "")}, ValueError, "devices:"),
        ({"overwrite": "yes"}, TypeError, "overwrite:"),
    ],
)
def test_register_backend_checks_its_other_arguments(
    registry_restored: None, kwargs: dict, exc: type[Exception], start: str
) -> None:
    with pytest.raises(exc, match=f"^{start}.*expected"):
        normlab.register_backend("checked", _reference_like(), **kwargs)
    assert "checked" not in kernels._BACKENDS


# ----------------------------------------------------------------------------------------------
# 5. a known backend that cannot run here, or cannot take the tensor's device, raises
#    BackendUnavailableError naming it and why; an unknown name stays a ValueError
# ----------------------------------------------------------------------------------------------
_NO_GPU_SCRIPT = """
import sys
{block}
import torch
import normlab.functional as NF
from normlab.kernels import BackendUnavailableError, backend_unavailable_reason
x = torch.randn(2, 8)
assert backend_unavailable_reason("triton") is not None
for call in (lambda: NF.rms_norm(x), lambda: NF.rms_norm(x, backend="triton")):
    try:
        call()
    except BackendUnavailableError as err:
        print("unavailable:", err)
    except ValueError as err:
        print("value error:", err)
    else:
        print("ran")
"""


def _run_without_gpu(backend_env: str, block_triton: bool) -> list[str]:
    """The two lines the script prints: the call with the default (``NORMLAB_BACKEND``), then the
    call with ``backend="triton"``, in a process that sees no GPU and no Triton interpreter."""
    from triton_harness import run_python

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", NORMLAB_BACKEND=backend_env)
    block = "sys.modules['triton'] = None" if block_triton else ""
    proc = run_python(["-c", _NO_GPU_SCRIPT.format(block=block)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-2:]


def test_triton_without_a_gpu_is_unavailable_not_unknown() -> None:
    from_env, named = _run_without_gpu("triton", block_triton=False)
    assert from_env.startswith("unavailable: backend: the default backend 'triton'"), from_env
    assert "NORMLAB_BACKEND" in from_env and "no CUDA GPU" in from_env, from_env
    assert named.startswith("unavailable: backend: 'triton' was asked for"), named
    assert "no CUDA GPU" in named and "TRITON_INTERPRET=1" in named, named


def test_triton_not_installed_is_unavailable_and_a_bad_env_name_is_unknown() -> None:
    from_env, named = _run_without_gpu("tritn", block_triton=True)
    assert from_env.startswith("value error: backend: unknown backend 'tritn'"), from_env
    assert "NORMLAB_BACKEND" in from_env and "torch, triton" in from_env, from_env
    assert named.startswith("unavailable: backend: 'triton'"), named
    assert "the triton package does not import" in named, named


def test_a_tensor_on_a_device_the_backend_does_not_take_raises(registry_restored: None) -> None:
    x = torch.randn(2, D, device="meta")  # a device no fast backend is registered for
    for name in ("cpp", "compiled"):
        with pytest.raises(BackendUnavailableError, match=rf"^backend: '{name}' .* on meta"):
            NF.rms_norm(x, backend=name)
        assert backend_unavailable_reason(name, "meta") is not None
        assert name not in backends_for("meta", available_only=True)
    assert NF.rms_norm(x, backend="torch").shape == x.shape  # the reference takes any device
    assert NF.rms_norm(x, backend="auto").shape == x.shape
    hook = _reference_like(unavailable_on=lambda kind: f"no {kind} chip in reach")
    normlab.register_backend("fussy", hook, devices=("cpu",))
    with pytest.raises(BackendUnavailableError, match=r"'fussy' .*no cpu chip in reach"):
        NF.layer_norm(torch.randn(2, D), backend="fussy")
    with pytest.raises(ValueError, match=r"unknown backend 'fusy'; expected one of auto, "):
        NF.layer_norm(torch.randn(2, D), backend="fusy")


def test_compiled_without_a_working_compiler_is_unavailable_on_the_cpu() -> None:
    from torch._inductor import config

    missing = "/nonexistent/normlab-test/g++"
    # config.patch, not monkeypatch: setting a torch config attribute back by hand leaves the
    # entry unreadable for every later test of the process
    with config.patch({"cpp.cxx": (None, missing)}):
        _compiled_is_unavailable(missing)
    assert tuple(config.cpp.cxx) != (None, missing)


def _compiled_is_unavailable(missing: str) -> None:
    x = torch.randn(4, D)
    with pytest.raises(BackendUnavailableError, match=r"^backend: 'compiled' .*C\+\+ compiler"):
        NF.rms_norm(x, backend="compiled")
    reason = backend_unavailable_reason("compiled", "cpu")
    assert reason is not None and missing in reason and "C++ compiler" in reason
    assert backend_unavailable_reason("compiled") is None  # CUDA may still have it
    assert "compiled" not in backends_for("cpu", available_only=True)
    torch.testing.assert_close(NF.rms_norm(x), NF.rms_norm(x, backend="torch"))  # auto: fine
