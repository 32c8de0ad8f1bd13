"""A plain PyTorch training loop (a tiny nanoGPT-like byte-level transformer) that normlab can
referee: run it under ``normlab compare --script``, which trains it once per norm and seed and
judges the validation loss it logs.

  normlab compare \\
    --script "python examples/own_loop/plain_loop.py --norm {norm} --seed {seed} --out {run_dir}" \\
    --norms layernorm,rmsnorm --seeds 3 --metric val_loss --margin 0.02 --parallel 2 \\
    --out normlab-out/own-loop

On its own (``python examples/own_loop/plain_loop.py --norm rmsnorm``) it logs to
``normlab-runs/rmsnorm-pre__s0``. The data is a few modules of Python's standard library, read as
bytes; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import normlab.track

NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}
FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py")


class Block(nn.Module):
    def __init__(self, d: int, heads: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.n1, self.n2 = norm(d), norm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.n1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class TinyGPT(nn.Module):
    def __init__(self, norm: type[nn.Module], d: int = 32, layers: int = 2, context: int = 32):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, 2, norm) for _ in range(layers))
        self.norm = norm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def corpus() -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join((root / name).read_bytes() for name in FILES)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch(data: torch.Tensor, gen: torch.Generator, size: int, context: int):
    starts = torch.randint(0, len(data) - context - 1, (size,), generator=gen)
    x = torch.stack([data[s : s + context] for s in starts])
    y = torch.stack([data[s + 1 : s + context + 1] for s in starts])
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--norm", default="layernorm", choices=sorted(NORMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with normlab.track.init(norm=args.norm, seed=args.seed, run_dir=args.out) as run:
        data = corpus()
        split = int(0.9 * len(data))
        train, val = data[:split], data[split:]
        torch.manual_seed(run.seed)  # the same initial values in every arm but the norms'
        model = TinyGPT(NORMS[run.norm])
        gen = torch.Generator().manual_seed(run.seed)  # the same batches in every arm
        val_gen = torch.Generator().manual_seed(12345)
        val_batches = [batch(val, val_gen, 16, 32) for _ in range(4)]
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        first = batch(train, gen, 16, 32)
        run.fingerprint(model, first)
        x, y = first
        for step in range(1, args.steps + 1):
            if step > 1:
                x, y = batch(train, gen, 16, 32)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            run.log(step, loss=loss, grad_norm=grad_norm, tokens=x.numel())
        with torch.no_grad():
            losses = [
                F.cross_entropy(model(vx).flatten(0, 1), vy.flatten()) for vx, vy in val_batches
            ]
        run.log_eval(args.steps, val_loss=torch.stack(losses).mean())


if __name__ == "__main__":
    main()
