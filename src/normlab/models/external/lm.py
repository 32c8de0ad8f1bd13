"""One interface over both sources: ``logits = model(tokens)``, [B, T] int64 → [B, T, V] float,
with what the experiment asks of a testbed model (norm parameters, counts, groups, blocks)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from normlab.models.external.record import NormSwapRecord
from normlab.models.external.spec import MODEL_OPTION
from normlab.models.init import check_paired, shared_parameter_digests

NET = "net"
"""The wrapped model's attribute: parameter names start with ``net.``."""


class SourceLM(nn.Module):
    """A user's causal LM with one arm's norms.

    ``net``: the model as its source built it (a transformers ``*ForCausalLM`` is called as
    ``net(input_ids=tokens, use_cache=False)``, a factory's model as ``net(tokens)``);
    ``record``: what the arm did to its norms; ``vocab_size``: V; ``max_length``: the longest
    sequence it takes (the config's ``max_position_embeddings``), None when unknown;
    ``mup``: μP's plan (:class:`~normlab.models.external.mup.SourceMup`) when the source built
    the model under ``mup``, None under ``sp``.
    """

    def __init__(
        self,
        net: nn.Module,
        record: NormSwapRecord,
        vocab_size: int,
        *,
        is_hf: bool,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.net = net
        self.record = record
        self.vocab_size = vocab_size
        self.is_hf = is_hf
        self.max_length = max_length
        self._norm_paths = frozenset(f"{NET}.{p}" for p in record.swapped_paths)
        self.mup: Any = None

    def lr_multipliers(self) -> dict[str, float]:
        """{name: multiplier of the Adam learning rate} of every parameter: μP's fan-in ratio
        r for a hidden matrix (``mup``), 1 for the rest and for every parameter under ``sp``."""
        ratios = self.mup.ratios if self.mup is not None else {}
        return {
            name: ratios.get(name.removeprefix(f"{NET}."), 1.0)
            for name, _ in self.named_parameters()
        }

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for token ids ``tokens`` [B, T] (integer dtype)."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens: expected token ids of shape [B, T], got {got}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens: expected int64 token ids, got {tokens.dtype}")
        out = self.net(input_ids=tokens, use_cache=False) if self.is_hf else self.net(tokens)
        return output_logits(out, tuple(tokens.shape), self.vocab_size, self.record.source)

    def norm_parameter_names(self) -> list[str]:
        """Names of the parameters of the arm's norms, their sub-modules' included (the ones
        the arms do not share)."""
        return [name for name, _ in self.named_parameters() if self._in_arm_norm(name)]

    def _in_arm_norm(self, name: str) -> bool:
        parts = name.split(".")[:-1]
        return any(".".join(parts[:i]) in self._norm_paths for i in range(1, len(parts) + 1))

    def shared_parameter_names(self) -> list[str]:
        """Names of every other parameter: those every arm has, starting equal for a seed."""
        norms = set(self.norm_parameter_names())
        return [name for name, _ in self.named_parameters() if name not in norms]

    def embedding_parameter_names(self) -> list[str]:
        """Names of the embeddings' parameters, which a non-embedding count leaves out: the
        model's input and output embeddings where it names them (a transformers model's
        ``get_input_embeddings`` and ``get_output_embeddings``; a factory's model where it has
        those methods), and every other ``nn.Embedding`` it holds (learned positions: GPT-2's
        ``wpe``). Tied weights are named once. A factory's untied output projection that it
        does not name is an ``nn.Linear`` like any other, and counts."""
        modules = [m for m in self.net.modules() if isinstance(m, nn.Embedding)]
        for getter in ("get_input_embeddings", "get_output_embeddings"):
            method = getattr(self.net, getter, None)
            try:
                module = method() if callable(method) else None
            except NotImplementedError:  # a transformers class that does not name it
                module = None
            if isinstance(module, nn.Module):
                modules.append(module)
        ids = {id(p) for m in modules for p in m.parameters()}
        return [name for name, p in self.named_parameters() if id(p) in ids]

    def count_parameters(self) -> tuple[int, int]:
        """(all parameters, parameters of the arm's norms); tied weights are counted once."""
        norms = set(self.norm_parameter_names())
        total = sum(p.numel() for p in self.parameters())
        in_norms = sum(p.numel() for n, p in self.named_parameters() if n in norms)
        return total, in_norms

    @property
    def blocks(self) -> nn.ModuleList | None:
        """The model's stack of blocks: the ``nn.ModuleList`` holding the most parameters
        (``model.layers`` of a Llama, ``transformer.h`` of a GPT-2), None without one."""
        path = self._blocks_path()
        return None if path is None else self.get_submodule(path)  # type: ignore[return-value]

    def _blocks_path(self) -> str | None:
        best, best_count = None, 0
        for name, module in self.named_modules():
            if isinstance(module, nn.ModuleList):
                count = sum(p.numel() for p in module.parameters())
                if count > best_count:
                    best, best_count = name, count
        return best

    def parameter_groups(self) -> dict[str, list[str]]:
        """Parameter names grouped for per-layer gradient norms, as the GPT's groups:
        ``block{i}.norms`` (the arm's norms in block i), ``block{i}.<child>`` (the rest of block
        i by its child module: ``self_attn``, ``mlp``, a held norm, …), ``norms`` (the arm's
        norms outside the blocks), ``head`` (an untied output projection of a transformers
        model) and ``embed`` (everything else)."""
        norms = set(self.norm_parameter_names())
        blocks = self._blocks_path()
        prefix = f"{blocks}." if blocks is not None else None
        head = set()
        if self.is_hf:  # the output projection, unless tied to the input embedding
            out, inp = self.net.get_output_embeddings(), self.net.get_input_embeddings()
            if isinstance(out, nn.Module):
                tied = {id(p) for p in inp.parameters()} if isinstance(inp, nn.Module) else set()
                head = {id(p) for p in out.parameters()} - tied
        groups: dict[str, list[str]] = {}
        for name, p in self.named_parameters():
            if prefix is not None and name.startswith(prefix):
                index, _, rest = name[len(prefix) :].partition(".")
                child = rest.partition(".")[0] if "." in rest else "params"
                key = f"block{index}.{'norms' if name in norms else child}"
            elif name in norms:
                key = "norms"
            elif id(p) in head:
                key = "head"
            else:
                key = "embed"
            groups.setdefault(key, []).append(name)
        return groups


def output_logits(
    out: Any, token_shape: tuple[int, ...], vocab_size: int, source: str
) -> torch.Tensor:
    """The logits in a model's output (a tensor, or an object with ``.logits``), checked to be
    a floating tensor [B, T, V]; ValueError naming :data:`MODEL_OPTION` otherwise."""
    logits = getattr(out, "logits", out)
    expected = [*token_shape, vocab_size]
    if not isinstance(logits, torch.Tensor):
        raise ValueError(
            f"{MODEL_OPTION}: {source} returned {type(out).__name__}; expected logits "
            f"{expected} (a tensor or an object with .logits)"
        )
    if list(logits.shape) != expected or not logits.is_floating_point():
        raise ValueError(
            f"{MODEL_OPTION}: {source} returned {logits.dtype} logits of shape "
            f"{list(logits.shape)} for tokens {list(token_shape)}; expected float logits of "
            f"shape {expected} (V = the tokenizer's vocabulary size)"
        )
    return logits


def shared_parameter_names(model: SourceLM) -> list[str]:
    """The parameters every arm of a source has: all but the arm's norms."""
    return model.shared_parameter_names()


def check_same_start(models: dict[str, SourceLM]) -> str:
    """Check that the arms' models (by arm name) have the same shared parameters with equal
    values (:func:`normlab.models.check_paired`); returns their combined digest, raises
    ValueError naming the arm and the parameter otherwise."""
    return check_paired(models)  # type: ignore[arg-type]


def shared_digests(model: SourceLM) -> dict[str, str]:
    """{name: sha256 digest} of the shared parameters (what the worker's check compares)."""
    return shared_parameter_digests(model)  # type: ignore[arg-type]
