"""normlab.replace_norms on Hugging Face models: same logits, and what it buys end to end.

Needs transformers (``pip install "normlab[hf]"``); nothing is downloaded, every model is built
from a small config with its norm weights perturbed.

    python benchmarks/replace_norms_hf.py logits          # 12 architectures, fp32 and bf16
    python benchmarks/replace_norms_hf.py speed           # a 2-layer Llama of width 2048

``logits`` prints, per architecture and dtype, how many norms were replaced and how far the
logits moved. ``speed`` times the forward and forward + backward of the model before and after
the swap in alternating repetitions and prints the median times and their ratio.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
import transformers as T

from normlab import replace_norms

SMALL = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
ARCHITECTURES: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**SMALL)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**SMALL, head_dim=16)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**SMALL, head_dim=16)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**SMALL)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**SMALL, head_dim=16)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**SMALL)),
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**SMALL)),
    "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(**SMALL)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**SMALL, pad_token_id=0)),
    "gpt2": lambda: T.GPT2LMHeadModel(
        T.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    ),
    "bert": lambda: T.BertForMaskedLM(
        T.BertConfig(
            vocab_size=128,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
        )
    ),
    "t5": lambda: T.T5ForConditionalGeneration(
        T.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    ),
}


def _logits(model: torch.nn.Module, ids: torch.Tensor, encoder_decoder: bool) -> torch.Tensor:
    extra = {"decoder_input_ids": ids} if encoder_decoder else {}
    with torch.no_grad():
        return model(input_ids=ids, **extra).logits


def logits() -> None:
    """Per architecture and dtype: norms replaced of norms found, logits equal, max |Δ|."""
    torch.manual_seed(0)
    for name, build in ARCHITECTURES.items():
        for dtype in (torch.float32, torch.bfloat16):
            model = build().to(dtype).eval()
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if "norm" in pname.lower() or "ln" in pname.lower():
                        p.add_(0.1 * torch.randn_like(p))
            ids = torch.randint(0, 128, (2, 16))
            before = _logits(model, ids, name == "t5")
            reports = replace_norms(model)
            after = _logits(model, ids, name == "t5")
            replaced = sum(r.replaced for r in reports)
            diff = (after.float() - before.float()).abs().max().item()
            print(
                f"{name:8s} {dtype!s:15s} replaced {replaced:2d} of {len(reports):2d}  "
                f"logits equal {torch.equal(after, before)!s:5s}  max |diff| {diff:.2e}",
                flush=True,
            )


def speed(reps: int = 7) -> None:
    """Median times of a Llama step before and after the swap, timed alternately."""
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=256,
        hidden_size=2048,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    ids = torch.randint(0, 256, (4, 512))

    def forward(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(input_ids=ids)

    def step(m: torch.nn.Module) -> None:
        m.zero_grad(set_to_none=True)
        m(input_ids=ids).logits.float().mean().backward()

    for dtype in (torch.bfloat16, torch.float32):
        base = T.LlamaForCausalLM(config).to(dtype)
        swapped = copy.deepcopy(base)
        replace_norms(swapped, strict=True)
        for mode, fn in (("fwd", forward), ("fwd+bwd", step)):
            fn(base), fn(swapped)  # warm-up
            times: dict[str, list[float]] = {"hf": [], "normlab": []}
            for i in range(reps):
                order = [("hf", base), ("normlab", swapped)]
                for key, m in order if i % 2 == 0 else order[::-1]:
                    t0 = time.perf_counter()
                    fn(m)
                    times[key].append(time.perf_counter() - t0)
            hf, ours = statistics.median(times["hf"]), statistics.median(times["normlab"])
            print(
                f"{dtype} {mode}: HF norms {hf * 1e3:.0f} ms, normlab {ours * 1e3:.0f} ms, "
                f"speedup {hf / ours:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "logits"
    if what not in ("logits", "speed"):
        raise SystemExit(f"usage: {sys.argv[0]} logits|speed (got {what!r})")
    logits() if what == "logits" else speed()
