"""Find the norms of a whole model and where they sit (pre / post / sandwich).

One forward pass with hooks records, in call order, every norm call and every call of a
sublayer (a child of a block that holds parameters and is not a norm), with the identity of the
tensors each reads and writes. A block is a module with at least one norm child and one
sublayer child. In a block:

- **pre**: h + F(N(h)) — a norm feeds each sublayer and nothing normalises the block's output;
- **post**: N(h + F(h)) — the block's output is a norm's output;
- **sandwich** (Peri-LN): h + N₂(F(N₁(h))) — some norm reads a sublayer's output directly.

A norm outside every block that runs after the last block is the **final** norm.

A conditional norm (its forward takes a ``cond`` argument, as AdaRMSNorm and adaLN-Zero:
``(x, cond) -> (y, gate)``) is traced through its first input x and its first output y like any
other; each site also says how it was conditioned (``per sequence`` for cond [B, C] against
x [B, T, D], ``per token`` for cond [B, T, C]) and whether it returned a gate g (meant for a
gated residual h + g ⊙ F(y); whether the model uses it is not traced).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm

_KNOWN_NORMS: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.RMSNorm,
    nn.GroupNorm,
    LayerNorm,
    RMSNorm,
    AdaRMSNorm,
    AdaLayerNormZero,
)


def is_norm_module(module: nn.Module) -> bool:
    """A known norm class, or a module whose class name says it normalises (``*Norm``, DyT)."""
    if isinstance(module, _KNOWN_NORMS):
        return True
    name = type(module).__name__.lower()
    return (
        name.endswith("norm")
        or "rmsnorm" in name
        or "layernorm" in name
        or name
        in (
            "dynamictanh",
            "dyt",
        )
    )


@dataclass
class NormSite:
    """One norm module of a model."""

    name: str
    cls: str
    block: str | None
    role: str  # "pre", "post", "sandwich-in", "sandwich-out", "final", "other", "unused"
    n_params: int
    # "none"; for a conditional norm "per sequence", "per token", "per row" (x [N, D]), or
    # "conditional" when it was not called
    conditioning: str = "none"
    returns_gate: bool = False  # a conditional norm that returned (y, g), g for h + g ⊙ F(y)


@dataclass
class ModelAudit:
    """The norms of a model and the placement of each block."""

    norms: list[NormSite]
    blocks: dict[str, str]
    placement: str
    n_norm_params: int
    n_params: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Call:
    name: str
    is_norm: bool
    inputs: set[int]
    outputs: set[int]
    conditioning: str = "none"
    returns_gate: bool = False


def _ptrs(obj: Any) -> set[int]:
    if isinstance(obj, torch.Tensor):
        return {obj.data_ptr()} if obj.numel() else set()
    if isinstance(obj, (tuple, list)):
        return set().union(*(_ptrs(o) for o in obj)) if obj else set()
    if isinstance(obj, dict):
        return _ptrs(list(obj.values()))
    return set()


def _first_tensor_ptr(obj: Any) -> set[int]:
    if isinstance(obj, torch.Tensor):
        return _ptrs(obj)
    if isinstance(obj, (tuple, list)) and obj:
        return _first_tensor_ptr(obj[0])
    return set()


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)) and obj:
        return _first_tensor(obj[0])
    return None


def takes_condition(module: nn.Module) -> bool:
    """Whether ``module`` is a conditional norm: its ``forward`` has a parameter named ``cond``.

    AdaRMSNorm and adaLN-Zero are called ``norm(x, cond) -> (y, gate)``; ``audit_model`` traces
    such a norm through x and y and reports its conditioning, and ``normlab.replace_norms``
    refuses to swap one for an unconditional layer. A forward whose signature cannot be read
    counts as unconditional.
    """
    try:
        return "cond" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _conditioning(module: nn.Module, args: tuple, kwargs: dict) -> str:
    """How a conditional norm's call was conditioned: cond [B, C] (or [B, 1, C]) against
    x [B, T, D] is per sequence, cond [B, T, C] per token; for x [N, D], per row."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return "conditional"
    cond = bound.get("cond")
    x = _first_tensor(args) if args else _first_tensor(list(kwargs.values()))
    if not isinstance(cond, torch.Tensor) or x is None:
        return "conditional"
    if x.dim() <= 2:
        return "per row"
    lead = cond.shape[:-1]
    if len(lead) < x.dim() - 1 or all(n == 1 for n in lead[1:]):
        return "per sequence"
    return "per token"


def _find_blocks(model: nn.Module, norm_names: set[str]) -> dict[str, list[str]]:
    """Blocks: modules with a norm child and a parameterised non-norm child (the sublayers)."""
    blocks: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        children = list(module.named_children())
        full = [(f"{name}.{c}" if name else c, m) for c, m in children]
        norms = [n for n, _ in full if n in norm_names]
        subs = [
            n
            for n, m in full
            if n not in norm_names and any(True for _ in m.parameters()) and not _is_container(m)
        ]
        if norms and subs:
            blocks[name] = subs
    # the innermost such modules are the blocks (a model holding blocks is not one itself)
    return {
        b: subs
        for b, subs in blocks.items()
        if not any(o != b and (not b or o.startswith(b + ".")) for o in blocks)
    }


def _is_container(m: nn.Module) -> bool:
    """ModuleList / ModuleDict hold modules but are never called themselves."""
    return isinstance(m, (nn.ModuleList, nn.ModuleDict))


def _classify_block(block: str, calls: list[_Call], subs: list[str]) -> tuple[str, dict[str, str]]:
    inside = [c for c in calls if c.name == block or c.name.startswith(block + ".") or not block]
    block_call = next((c for c in inside if c.name == block), None)
    events = [c for c in inside if c.is_norm or c.name in subs]
    sub_outputs: set[int] = set().union(*(c.outputs for c in events if not c.is_norm), set())
    sub_inputs: set[int] = set().union(*(c.inputs for c in events if not c.is_norm), set())
    roles: dict[str, str] = {}
    for c in events:
        if not c.is_norm:
            continue
        if c.inputs & sub_outputs:
            roles[c.name] = "sandwich-out"
        elif block_call is not None and c.outputs & block_call.outputs:
            roles[c.name] = "post"
        elif c.outputs & sub_inputs:
            roles[c.name] = "pre"
        else:
            roles[c.name] = "other"
    kinds = set(roles.values())
    if "sandwich-out" in kinds:
        for n, r in roles.items():
            if r == "pre":
                roles[n] = "sandwich-in"
        return "sandwich", roles
    if "post" in kinds:
        for n, r in roles.items():
            if r == "pre":
                roles[n] = "post"  # a post-norm's output feeds the next sublayer too
        return "post", roles
    if kinds == {"pre"}:
        return "pre", roles
    return "mixed" if kinds else "none", roles


def _norm_names(named: dict[str, nn.Module]) -> set[str]:
    """The norm sites: every norm module (:func:`is_norm_module`) not nested in another norm
    (a Linear inside AdaRMSNorm is not a site, nor is a norm inside one)."""
    norm_names = {n for n, m in named.items() if n and is_norm_module(m)}
    return {n for n in norm_names if not any(n.startswith(o + ".") for o in norm_names)}


def _trace_calls(
    model: nn.Module,
    named: dict[str, nn.Module],
    norm_names: set[str],
    blocks: dict[str, list[str]],
    conditional: set[str],
    inputs: tuple,
    kw_inputs: dict,
) -> list[_Call]:
    """One forward pass (no grad, eval mode, training mode restored) with hooks on every norm,
    block and sublayer: their calls in call order, with the tensors each read and wrote."""
    watched = norm_names | set(blocks) | {s for subs in blocks.values() for s in subs}
    calls: list[_Call] = []
    pending: dict[str, int] = {}
    # hold every seen tensor until the pass ends, so no address is reused by another tensor
    alive: list[Any] = []

    def pre_hook(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: tuple, kwargs: dict) -> None:
            pending[name] = len(calls)
            alive.append((args, kwargs))
            if name in norm_names:
                # x is the first tensor argument (or keyword argument, when none is positional)
                ins = _first_tensor_ptr(args) or _first_tensor_ptr(list(kwargs.values()))
            else:
                ins = _ptrs(args) | _ptrs(kwargs)
            cond = _conditioning(m, args, kwargs) if name in conditional else "none"
            calls.append(_Call(name, name in norm_names, ins, set(), cond))

        return hook

    def post_hook(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: tuple, _kwargs: dict, out: Any) -> None:
            alive.append(out)
            call = calls[pending.pop(name)]
            call.outputs = _first_tensor_ptr(out)
            if name in conditional:  # (y, gate): a gate for the block's h + g ⊙ F(y)
                call.returns_gate = (
                    isinstance(out, (tuple, list))
                    and len(out) > 1
                    and isinstance(out[1], torch.Tensor)
                )

        return hook

    handles = []
    for name in watched:
        m = named[name]
        handles.append(m.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(m.register_forward_hook(post_hook(name), with_kwargs=True))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs, **kw_inputs)
    finally:
        alive.clear()
        model.train(was_training)
        for h in handles:
            h.remove()
    return calls


def _place_blocks(
    blocks: dict[str, list[str]], calls: list[_Call]
) -> tuple[dict[str, str], dict[str, str]]:
    """(each block's placement, each norm's role in its block) (:func:`_classify_block`); the
    model itself, when it is the block, is named ``<model>``."""
    block_placement: dict[str, str] = {}
    roles: dict[str, str] = {}
    for block, subs in blocks.items():
        placement, block_roles = _classify_block(block, calls, subs)
        block_placement[block or "<model>"] = placement
        roles.update(block_roles)
    return block_placement, roles


def _norm_sites(
    named: dict[str, nn.Module],
    norm_names: set[str],
    blocks: dict[str, list[str]],
    conditional: set[str],
    calls: list[_Call],
    roles: dict[str, str],
) -> list[NormSite]:
    """Every norm site in module order, with its role: its block's, else ``unused`` (never
    called), ``final`` (outside every block and called after the last block) or ``other``."""
    block_calls = [i for i, c in enumerate(calls) if c.name in blocks]
    last_block = max(block_calls, default=-1)
    called = {c.name for c in calls}
    sites = []
    for name in sorted(norm_names, key=lambda n: list(named).index(n)):
        owner = next((b for b in blocks if b and name.startswith(b + ".")), None)
        role = roles.get(name)
        last_call = next((c for c in reversed(calls) if c.name == name), None)
        if last_call is not None:
            conditioning, returns_gate = last_call.conditioning, last_call.returns_gate
        else:
            conditioning = "conditional" if name in conditional else "none"
            returns_gate = False
        if name not in called:
            role = "unused"
        elif role is None:
            idx = max(i for i, c in enumerate(calls) if c.name == name)
            role = "final" if owner is None and idx > last_block >= 0 else "other"
        sites.append(
            NormSite(
                name=name,
                cls=type(named[name]).__name__,
                block=owner,
                role=role,
                n_params=sum(p.numel() for p in named[name].parameters()),
                conditioning=conditioning,
                returns_gate=returns_gate,
            )
        )
    return sites


def audit_model(model: nn.Module, *inputs: Any, **kw_inputs: Any) -> ModelAudit:
    """Run ``model(*inputs, **kw_inputs)`` once (no grad, eval mode) and locate its norms."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    named = dict(model.named_modules())
    norm_names = _norm_names(named)
    blocks = _find_blocks(model, norm_names)
    conditional = {n for n in norm_names if takes_condition(named[n])}
    calls = _trace_calls(model, named, norm_names, blocks, conditional, inputs, kw_inputs)
    block_placement, roles = _place_blocks(blocks, calls)
    sites = _norm_sites(named, norm_names, blocks, conditional, calls, roles)
    kinds = set(block_placement.values())
    placement = kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "no blocks found")
    notes = []
    if not norm_names:
        notes.append("no norm modules found (looked for known classes and *Norm class names)")
    return ModelAudit(
        norms=sites,
        blocks=block_placement,
        placement=placement,
        n_norm_params=sum(s.n_params for s in sites),
        n_params=sum(p.numel() for p in model.parameters()),
        notes=notes,
    )
