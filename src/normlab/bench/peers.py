"""The implementations a benchmark row compares, and the problem tensors they run on.

Peers, by name:

- ``torch``: PyTorch's own op (``F.rms_norm``, ``F.layer_norm``; for add_rms ``x + r`` then
  ``F.rms_norm``; for ada_rms ``F.rms_norm(x)·(1 + s) + t``). Speedups are quoted against it.
- ``eager``: the formula as written in :mod:`normlab.kernels.reference`, run eagerly.
- ``torch.compile``: the same formula through ``torch.compile`` (Inductor, default mode, static
  shapes), forward and autograd backward.
- ``normlab:auto`` and ``normlab:<backend>``: :mod:`normlab.functional` with that backend.
- ``normlab:cpp-portable``, ``normlab:cpp-general``: the ``cpp`` backend on another build
  variant of its kernels (:data:`normlab.kernels.cpu.VARIANTS`): the portable fast paths that
  CPUs without AVX-512 run, and the general kernels. Run only when named in ``--peers``.
- ``liger``, ``flash_attn``, ``apex``, ``transformer_engine``, ``quack``: other projects' fused
  kernels where they import (CUDA only); each is skipped with its reason when it does not.

A peer turns a :class:`Problem` into a step (a closure that runs forward, or forward and
backward) and can report the outputs of its last step for the error check.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import normlab.functional as NF
from normlab.kernels import available_backends, backend_unavailable_reason, backends_for, cpu

EPS = 1e-6

Outputs = tuple[torch.Tensor, ...]


class Unavailable(Exception):
    """The peer cannot run this problem here (not installed, wrong device, op not offered)."""


@dataclass
class Problem:
    """The tensors of one benchmark row: x [N, D] and what the op needs besides."""

    op: str
    dtype: torch.dtype
    device: torch.device
    rows: int
    dim: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return self.rows * self.dim

    def inputs(self, requires_grad: bool) -> dict[str, torch.Tensor]:
        """Fresh leaves (detached views) of the inputs, with or without gradients."""
        return {k: v.detach().requires_grad_(requires_grad) for k, v in self.tensors.items()}


def make_problem(
    op: str, dtype: torch.dtype, device: torch.device, rows: int, dim: int, seed: int = 0
) -> Problem:
    """Random inputs for ``op``: x ~ N(0, 1) rows, weight ≈ 1, per-token scale and shift."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32) * std + mean
        return t.to(device=device, dtype=dtype)

    p = Problem(op, dtype, device, rows, dim)
    p.tensors["x"] = randn(rows, dim)
    if op in ("rms", "layer", "add_rms"):
        p.tensors["weight"] = randn(dim, std=0.1, mean=1.0)
    if op == "layer":
        p.tensors["bias"] = randn(dim, std=0.1)
    if op == "add_rms":
        p.tensors["residual"] = randn(rows, dim)
    if op == "ada_rms":
        p.tensors["scale"] = randn(rows, dim, std=0.1)
        p.tensors["shift"] = randn(rows, dim, std=0.1)
    p.grads["y"] = randn(rows, dim)
    if op == "add_rms":
        p.grads["h"] = randn(rows, dim)
    return p


# ----------------------------------------------------------------------------------------------
# The op as each peer computes it: f(tensors) -> outputs
# ----------------------------------------------------------------------------------------------
def _torch_op(op: str, t: dict[str, torch.Tensor]) -> Outputs:
    x = t["x"]
    d = (x.shape[-1],)
    if op == "rms":
        return (F.rms_norm(x, d, t["weight"], EPS),)
    if op == "layer":
        return (F.layer_norm(x, d, t["weight"], t["bias"], EPS),)
    if op == "add_rms":
        h = x + t["residual"]
        return F.rms_norm(h, d, t["weight"], EPS), h
    return (F.rms_norm(x, d, None, EPS) * (1 + t["scale"]) + t["shift"],)


def _normlab_op(op: str, backend: str, t: dict[str, torch.Tensor]) -> Outputs:
    x = t["x"]
    if op == "rms":
        return (NF.rms_norm(x, t["weight"], EPS, backend=backend),)
    if op == "layer":
        return (NF.layer_norm(x, t["weight"], t["bias"], EPS, backend=backend),)
    if op == "add_rms":
        return NF.add_rms_norm(x, t["residual"], t["weight"], EPS, backend=backend)
    return (NF.ada_rms_norm(x, t["scale"], t["shift"], EPS, backend=backend),)


@dataclass(frozen=True)
class ScopedOp:
    """f(tensors) -> outputs whose steps run inside ``scope()``, forward and backward alike."""

    fn: Callable[..., Outputs]
    scope: Callable[[], contextlib.AbstractContextManager[Any]]

    def __call__(self, t: dict[str, torch.Tensor]) -> Outputs:
        return self.fn(t)


def _cpp_variant_op(op: str, variant: str) -> ScopedOp:
    """The op on the ``cpp`` backend, built as ``variant``: the kernels of both directions run
    inside :func:`normlab.kernels.cpu.use_variant` (the backward calls them too)."""
    return ScopedOp(
        functools.partial(_normlab_op, op, "cpp"), functools.partial(cpu.use_variant, variant)
    )


def reference_float64(op: str, t: dict[str, torch.Tensor]) -> Outputs:
    """The op in float64 (inputs upcast), the accuracy yardstick."""
    return _normlab_op(op, "torch", {k: v.double() for k, v in t.items()})


def _external_op(name: str, op: str, device: torch.device) -> Callable[..., Outputs]:
    """Another project's kernel for ``op``, or :class:`Unavailable` with the reason."""
    if device.type != "cuda":
        raise Unavailable(f"{name}: CUDA only")
    try:
        if name == "liger":
            return _liger(op)
        if name == "flash_attn":
            return _flash_attn(op)
        if name == "apex":
            return _apex(op)
        if name == "transformer_engine":
            return _transformer_engine(op)
        if name == "quack":
            return _quack(op)
    except ImportError as err:
        raise Unavailable(f"{name}: not importable ({err})") from err
    raise Unavailable(f"{name}: unknown peer")


def _module_op(make: Callable[[int], torch.nn.Module], op: str) -> Callable[..., Outputs]:
    """Wrap a norm module as f(tensors), loading the benchmark's weight (and bias)."""
    cache: dict[tuple[int, torch.dtype, torch.device], torch.nn.Module] = {}

    def run(t: dict[str, torch.Tensor]) -> Outputs:
        x = t["x"]
        key = (x.shape[-1], x.dtype, x.device)
        if key not in cache:
            cache[key] = make(x.shape[-1]).to(device=x.device, dtype=x.dtype)
        m = cache[key]
        with torch.no_grad():
            m.weight.copy_(t["weight"])
            if "bias" in t and getattr(m, "bias", None) is not None:
                m.bias.copy_(t["bias"])
        if op == "add_rms":
            h = x + t["residual"]
            return m(h), h
        return (m(x),)

    if op not in ("rms", "layer", "add_rms"):
        raise Unavailable("no modulated norm in this project")
    return run


def _liger(op: str) -> Callable[..., Outputs]:
    liger = importlib.import_module("liger_kernel.transformers")
    if op == "layer":
        return _module_op(lambda d: liger.LigerLayerNorm(d, eps=EPS), op)
    return _module_op(lambda d: liger.LigerRMSNorm(d, eps=EPS), op)


def _flash_attn(op: str) -> Callable[..., Outputs]:
    ln = importlib.import_module("flash_attn.ops.triton.layer_norm")
    if op == "rms":
        return lambda t: (ln.rms_norm_fn(t["x"], t["weight"], None, eps=EPS),)
    if op == "layer":
        return lambda t: (ln.layer_norm_fn(t["x"], t["weight"], t["bias"], eps=EPS),)
    if op == "add_rms":
        return lambda t: tuple(
            ln.rms_norm_fn(t["x"], t["weight"], None, residual=t["residual"], eps=EPS, prenorm=True)
        )
    raise Unavailable("flash_attn: no modulated norm")


def _apex(op: str) -> Callable[..., Outputs]:
    norm = importlib.import_module("apex.normalization")
    if op == "layer":
        return _module_op(lambda d: norm.FusedLayerNorm(d, eps=EPS), op)
    return _module_op(lambda d: norm.FusedRMSNorm(d, eps=EPS), op)


def _transformer_engine(op: str) -> Callable[..., Outputs]:
    te = importlib.import_module("transformer_engine.pytorch")
    if op == "layer":
        return _module_op(lambda d: te.LayerNorm(d, eps=EPS), op)
    return _module_op(lambda d: te.RMSNorm(d, eps=EPS), op)


def _quack(op: str) -> Callable[..., Outputs]:
    quack = importlib.import_module("quack")
    if op == "rms":
        return lambda t: (quack.rmsnorm(t["x"], t["weight"], eps=EPS),)
    raise Unavailable("quack: only rms is wired")


# ----------------------------------------------------------------------------------------------
# Peers
# ----------------------------------------------------------------------------------------------
EXTERNAL = ("liger", "flash_attn", "apex", "transformer_engine", "quack")
BUILTIN = ("torch", "eager", "torch.compile")
# normlab backends that register only where their dependencies and device exist: still valid
# peer names elsewhere (their rows are kept as skipped, with the reason)
OPTIONAL_BACKENDS = ("triton",)
CPP_VARIANT_PEERS: dict[str, str] = {f"normlab:cpp-{v}": v for v in cpu.VARIANTS if v != "native"}
"""Peers that run the ``cpp`` backend on another build variant (by peer name); never a default,
so their libraries are built only when a run names them."""


def known_peers() -> list[str]:
    """Every valid peer name, whether or not it can run here."""
    backends = dict.fromkeys([*available_backends(), *OPTIONAL_BACKENDS])
    return [*BUILTIN, *(f"normlab:{b}" for b in backends), *CPP_VARIANT_PEERS, *EXTERNAL]


def check_peer_names(names: object) -> list[str]:
    """``names`` must be a non-empty list of :func:`known_peers`; ``ValueError`` names ``peers``."""
    known = known_peers()
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise ValueError(f"peers: expected a non-empty list of peer names, got {names!r}")
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(
            f"peers: unknown peer {', '.join(map(repr, bad))}; expected some of {', '.join(known)}"
        )
    return list(names)


def default_peers(device: torch.device) -> list[str]:
    """Every peer that could run on ``device``: built-ins, normlab backends, external projects."""
    names = ["torch", "eager", "torch.compile", "normlab:auto"]
    names += [f"normlab:{b}" for b in backends_for(device) if b != "torch"]
    if device.type == "cuda":
        names += list(EXTERNAL)
    return names


@functools.cache
def _compiled_formula(op: str) -> Callable[..., Outputs]:
    return torch.compile(functools.partial(_normlab_op, op, "torch"), dynamic=False)


def peer_function(name: str, op: str, device: torch.device) -> Callable[..., Outputs]:
    """f(tensors) -> outputs for peer ``name``; :class:`Unavailable` when it cannot run."""
    if name == "torch":
        return functools.partial(_torch_op, op)
    if name == "eager":
        return functools.partial(_normlab_op, op, "torch")
    if name == "torch.compile":
        return _compiled_formula(op)
    if name in CPP_VARIANT_PEERS:
        if device.type != "cpu":
            raise Unavailable(f"{name}: CPU only")
        variant = CPP_VARIANT_PEERS[name]
        with cpu.use_variant(variant):
            reason = backend_unavailable_reason("cpp")
        if reason is not None:
            raise Unavailable(f"{name}: {reason}")
        return _cpp_variant_op(op, variant)
    if name.startswith("normlab:"):
        backend = name.removeprefix("normlab:")
        if backend != "auto" and backend not in backends_for(device):
            raise Unavailable(f"{name}: backend not registered for {device.type}")
        reason = backend_unavailable_reason(backend)
        if reason is not None:  # timing it would time another backend under its name
            raise Unavailable(f"{name}: {reason}")
        return functools.partial(_normlab_op, op, backend)
    if name in EXTERNAL:
        return _external_op(name, op, device)
    raise Unavailable(f"unknown peer {name!r}")


class Runner:
    """One peer on one problem in one mode: ``step()`` is what gets timed."""

    def __init__(self, fn: Callable[..., Outputs], problem: Problem, mode: str) -> None:
        self.fn = fn
        self.scope = fn.scope if isinstance(fn, ScopedOp) else contextlib.nullcontext
        self.problem = problem
        self.backward = mode == "fwd+bwd"
        self.leaves = problem.inputs(requires_grad=self.backward)
        self.last: Outputs = ()

    def step(self) -> None:
        with self.scope():
            if not self.backward:
                with torch.no_grad():
                    self.last = self.fn(self.leaves)
                return
            for t in self.leaves.values():
                t.grad = None
            outs = self.fn(self.leaves)
            grads = [self.problem.grads["y"], self.problem.grads.get("h")][: len(outs)]
            torch.autograd.backward(list(outs), grads)
            self.last = outs

    def release(self) -> None:
        """Drop the last outputs and gradients (they hold N·D tensors between measurements)."""
        self.last = ()
        for t in self.leaves.values():
            t.grad = None

    def checked_output(self) -> torch.Tensor:
        """What the error check compares: y (forward) or dx (forward and backward)."""
        if self.backward:
            grad = self.leaves["x"].grad
            if grad is None:
                raise RuntimeError("the backward produced no gradient for x")
            return grad
        return self.last[0]


def max_error(runner: Runner, sample_rows: int = 256) -> float:
    """Max |output − float64 reference| over ``sample_rows`` rows spread through x."""
    p = runner.problem
    idx = torch.linspace(0, p.rows - 1, min(sample_rows, p.rows)).round().long().to(p.device)
    got = runner.checked_output().detach().index_select(0, idx).double()
    sub = {
        k: (v.index_select(0, idx) if v.dim() == 2 else v).detach().double()
        for k, v in p.tensors.items()
    }
    if not runner.backward:
        with torch.no_grad():
            want = reference_float64(p.op, sub)[0]
        return float((got - want).abs().max())
    leaves = {k: v.clone().requires_grad_(k == "x") for k, v in sub.items()}
    outs = reference_float64(p.op, leaves)
    grads = [p.grads["y"].index_select(0, idx).double()]
    if "h" in p.grads:
        grads.append(p.grads["h"].index_select(0, idx).double())
    (want,) = torch.autograd.grad(list(outs), [leaves["x"]], grads[: len(outs)])
    return float((got - want).abs().max())


def describe(name: str) -> str:
    """One line on what a peer is, for the output's legend."""
    if name in CPP_VARIANT_PEERS:
        return (
            f"normlab.functional with backend='cpp', kernels built as the "
            f"{CPP_VARIANT_PEERS[name]!r} variant (NORMLAB_CPU_VARIANT)"
        )
    if name.startswith("normlab:"):
        return f"normlab.functional with backend={name.removeprefix('normlab:')!r}"
    return {
        "torch": "PyTorch's own op (F.rms_norm / F.layer_norm, unfused composition otherwise)",
        "eager": "the reference formula, eager",
        "torch.compile": "torch.compile (Inductor) of the reference formula",
    }.get(name, f"{name} (external project)")


def run_peer_once(fn: Callable[..., Any], problem: Problem, mode: str) -> Runner:
    """Build a runner and run one step (compiles, builds kernels, warms caches)."""
    runner = Runner(fn, problem, mode)
    runner.step()
    return runner
