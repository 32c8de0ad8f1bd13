"""A Lightning module that normlab can referee: the plain loop's tiny byte-level transformer as a
``LightningModule``, its norms swapped for the arm's with ``normlab.replace_norms``, trained by
``lightning.Trainer`` on the plain loop's bytes, logged by normlab's Lightning ``Callback``.

  normlab compare \\
    --script "python examples/own_loop/lightning_module.py --norm {norm} --seed {seed} \\
              --out {run_dir}" \\
    --norms layernorm,rmsnorm --seeds 3 --metric val_loss --margin 0.02 --parallel 2 \\
    --out normlab-out/own-loop-lightning

On its own (``python examples/own_loop/lightning_module.py --norm rmsnorm``) it logs to
``normlab-runs/rmsnorm-pre__s0``. Lightning writes nothing of its own: no logger, no checkpoints
(``logger=False``, ``enable_checkpointing=False``), its root folder inside the run folder.
"""

from __future__ import annotations

import argparse

import lightning
import torch
from byte_windows import splits
from plain_loop import TinyGPT
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import normlab
import normlab.track
from normlab.integrations.lightning import NormlabCallback


class ByteLM(lightning.LightningModule):
    """Next-byte prediction with :class:`plain_loop.TinyGPT` (built with torch's LayerNorm; the
    arm's norm is put in every norm slot by ``normlab.replace_norms``)."""

    def __init__(self, norm: str, lr: float = 3e-3) -> None:
        super().__init__()
        self.model = TinyGPT(nn.LayerNorm)
        for line in normlab.replace_norms(self.model, to=norm):
            print(line.describe())  # in runs/<run>/script.log under compare
        self.lr = lr

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        window = batch["input_ids"]
        logits = self.model(window[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), on_epoch=True, batch_size=len(batch["input_ids"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--norm", default="rmsnorm", help="a registered norm name, or none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with normlab.track.init(norm=args.norm, seed=args.seed, run_dir=args.out) as run:
        train, val = splits()
        lightning.seed_everything(run.seed, verbose=False)  # the same initial values in every arm
        module = ByteLM(run.norm)
        order = torch.Generator().manual_seed(run.seed)  # the same batches in every arm
        trainer = lightning.Trainer(
            max_steps=args.steps,
            val_check_interval=args.steps,  # one validation, at the end of training
            num_sanity_val_steps=0,
            gradient_clip_val=1.0,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=run.run_dir / "lightning",
            callbacks=[NormlabCallback(run)],  # logs val_loss for --metric
        )
        trainer.fit(
            module,
            DataLoader(train, batch_size=16, shuffle=True, generator=order),
            DataLoader(val, batch_size=16),
        )


if __name__ == "__main__":
    main()
