"""A Hugging Face ``Trainer`` script that normlab can referee: a tiny Llama built from a config
(nothing downloaded), its norms swapped for the arm's with ``normlab.replace_norms``, trained
by ``transformers.Trainer`` on the plain loop's bytes, logged by normlab's ``TrainerCallback``.

  normlab compare \\
    --script "python examples/own_loop/hf_trainer.py --norm {norm} --seed {seed} --out {run_dir}" \\
    --norms layernorm,rmsnorm --seeds 3 --metric val_loss --margin 0.02 --parallel 2 \\
    --out normlab-out/own-loop-hf

On its own (``python examples/own_loop/hf_trainer.py --norm rmsnorm``) it logs to
``normlab-runs/rmsnorm-pre__s0``. The Trainer writes nothing of its own (no checkpoints, no
reports: ``save_strategy="no"``, ``report_to="none"``); its output folder is ``trainer/`` inside
the run folder.
"""

from __future__ import annotations

import argparse

import torch
from byte_windows import splits
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

import normlab
import normlab.track
from normlab.integrations.hf import NormlabCallback


def tiny_llama() -> LlamaForCausalLM:
    """2 blocks, d = 32, 2 heads, a byte vocabulary: the plain loop's size."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


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
        set_seed(run.seed)  # the same initial values in every arm but the norms'
        model = tiny_llama()
        for line in normlab.replace_norms(model, to=run.norm):
            print(line.describe())  # in runs/<run>/script.log under compare
        training = TrainingArguments(
            output_dir=str(run.run_dir / "trainer"),
            max_steps=args.steps,
            per_device_train_batch_size=16,
            per_device_eval_batch_size=16,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            logging_steps=10,
            eval_strategy="steps",
            eval_steps=args.steps,  # one evaluation, at the end of training
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=run.seed,  # the same batches in every arm
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=train,
            eval_dataset=val,
            callbacks=[NormlabCallback(run)],  # logs val_loss (eval_loss) for --metric
        )
        trainer.train()


if __name__ == "__main__":
    main()
