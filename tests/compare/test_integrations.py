"""normlab.integrations: the Hugging Face and Lightning callbacks, each with the real library's
Trainer for a few steps, write run folders that compare accepts (finished, the metric, paired
fingerprints), and record a crash."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import transformers
from rich.console import Console
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import normlab
import normlab.track as track
from normlab.experiment.config import ScriptConfig
from normlab.experiment.execution.script_grid import check_script_pairing, plan_script_runs
from normlab.experiment.execution.script_run import script_outcome
from normlab.integrations import hf
from normlab.integrations import lightning as nl_lightning
from normlab.run_format import CRASHED, EVAL_RECORD, FINISHED, TRAIN_RECORD
from normlab.run_format.folder import create_run, read_fingerprint, read_records, read_summary
from normlab.run_format.script import ENV

VOCAB, SEQ, BATCH = 32, 8, 4
# Lightning's own use of torch's pytree (lightning 2.6 on torch 2.13): not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.` is deprecated")


@pytest.fixture(autouse=True)
def _no_compare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV.values(), "RANK"):
        monkeypatch.delenv(name, raising=False)


def token_rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
    return [{"input_ids": r, "labels": r} for r in rows]


def planned_runs(tmp_path: Path) -> list[dict[str, Any]]:
    """Two arms of seed 0, their folders made as compare --script makes them."""
    cfg = ScriptConfig(
        command="python t.py {norm}",
        metric="val_loss",
        equivalence_margin=0.02,
        norms=["layernorm", "rmsnorm"],
        seeds=1,
    )
    specs = plan_script_runs(cfg, threads=1)
    for spec in specs:
        create_run(tmp_path, spec)
    return specs


def as_compare_starts(monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any], out: Path) -> Path:
    folder = out / "runs" / spec["run_id"]
    for factor in ("norm", "placement", "precision", "seed"):
        monkeypatch.setenv(ENV[factor], str(spec[factor]))
    monkeypatch.setenv(ENV["run_dir"], str(folder))
    return folder


def accepted(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What compare makes of the run after the script exited 0."""
    outcome = script_outcome(spec, folder, 0, False)
    assert outcome["status"] == FINISHED, outcome.get("error")
    return outcome


# -- Hugging Face --------------------------------------------------------------------------------


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return transformers.LlamaForCausalLM(config)


def hf_trainer(
    model: nn.Module, folder: Path, seed: int, callbacks: list[Any], steps: int = 4
) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(folder / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        learning_rate=1e-2,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=steps,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=token_rows(32, seed=1),
        eval_dataset=token_rows(8, seed=2),
        callbacks=callbacks,
    )


def first_training_inputs(model: nn.Module) -> list[dict[str, Any]]:
    """The keyword arguments of the model's first forward in training mode, once it ran."""
    seen: list[dict[str, Any]] = []

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if module.training and not seen:
            seen.append(dict(kwargs))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_hf_callback_writes_a_run_compare_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = planned_runs(tmp_path)
    for spec in specs:
        folder = as_compare_starts(monkeypatch, spec, tmp_path)
        with track.init() as run:
            torch.manual_seed(run.seed)
            model = tiny_llama()
            normlab.replace_norms(model, to=run.norm)
            initial = track.shared_digests(model)
            inputs = first_training_inputs(model)
            trainer = hf_trainer(model, folder, run.seed, [hf.NormlabCallback(run)])
            trainer.train()
        outcome = accepted(spec, folder)
        logged = trainer.state.log_history
        train = read_records(folder, TRAIN_RECORD)
        assert [r["step"] for r in train] == [2, 4]
        assert [r["loss"] for r in train] == [h["loss"] for h in logged if "loss" in h]
        assert all(r["grad_norm"] > 0 for r in train)
        assert [r["tokens_seen"] for r in train] == [2 * BATCH * SEQ, 4 * BATCH * SEQ]
        (evaluation,) = read_records(folder, EVAL_RECORD)
        eval_loss = next(h["eval_loss"] for h in logged if "eval_loss" in h)
        assert evaluation["step"] == 4 and evaluation["val_loss"] == eval_loss
        assert outcome["final_val_loss"] == eval_loss and outcome["steps"] == 4
        fingerprint = read_fingerprint(folder)
        assert fingerprint is not None and fingerprint["parameters"] == initial
        assert not any("norm" in name for name in initial)  # the arm's norms are left out
        assert fingerprint["batch"] == track.batch_digest(inputs[0])
    # both arms started alike: compare judges the seed
    assert check_script_pairing(specs, tmp_path, Console(file=None, record=True)) == {}
    # an evaluation after train() is logged and rewrites the summary
    trainer.evaluate()
    assert len(read_records(folder, EVAL_RECORD)) == 2
    assert read_summary(folder)["status"] == FINISHED  # type: ignore[index]


class Boom(transformers.TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 3:
            raise RuntimeError("boom at step 3")


def test_hf_crash_inside_with_callback_is_recorded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_llama()
    with (
        pytest.raises(RuntimeError, match="boom at step 3"),
        hf.NormlabCallback(norm="rmsnorm", seed=0, run_dir=tmp_path / "r") as callback,
    ):
        hf_trainer(model, tmp_path / "r", 0, [callback, Boom()]).train()
    summary = read_summary(tmp_path / "r")
    assert summary is not None and summary["status"] == CRASHED
    assert summary["error"] == "RuntimeError: boom at step 3"
    assert [r["step"] for r in read_records(tmp_path / "r", TRAIN_RECORD)] == [2]


# -- Lightning -----------------------------------------------------------------------------------


class TinyLM(lightning.LightningModule):
    def __init__(self, norm: str, fail_at: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, VOCAB)
        normlab.replace_norms(self, to=norm)
        self.fail_at = fail_at

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        logits = self.head(self.norm(self.embed(ids[:, :-1])))
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError(f"boom at batch {batch_idx}")
        return self.loss(batch)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), batch_size=BATCH)
        self.log("other_metric", 1.0, batch_size=BATCH)  # not val*: not logged by default

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def lightning_fit(module: TinyLM, folder: Path, seed: int, callback: Any) -> lightning.Trainer:
    trainer = lightning.Trainer(
        max_steps=2,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=folder,
        callbacks=[callback],
    )
    order = torch.Generator().manual_seed(seed)
    trainer.fit(
        module,
        DataLoader(token_rows(16, seed=1), batch_size=BATCH, shuffle=True, generator=order),
        DataLoader(token_rows(8, seed=2), batch_size=BATCH),
    )
    return trainer


def test_lightning_callback_writes_a_run_compare_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = planned_runs(tmp_path)
    for spec in specs:
        folder = as_compare_starts(monkeypatch, spec, tmp_path)
        callback = nl_lightning.NormlabCallback()  # the run from compare's environment
        assert callback.run.norm == spec["norm"]
        torch.manual_seed(callback.run.seed)
        module = TinyLM(callback.run.norm)
        initial = track.shared_digests(module)
        trainer = lightning_fit(module, folder, callback.run.seed, callback)
        outcome = accepted(spec, folder)
        train = read_records(folder, TRAIN_RECORD)
        assert [r["step"] for r in train] == [1, 2]  # one record per optimizer step
        assert [r["tokens"] for r in train] == [2 * BATCH * SEQ] * 2  # two batches a step
        assert all(r["loss"] > 0 and r["grad_norm"] > 0 for r in train)
        (evaluation,) = read_records(folder, EVAL_RECORD)
        assert set(evaluation) == {"type", "step", "val_loss", "tokens_seen", "elapsed_s"}
        assert evaluation["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
        assert outcome["final_val_loss"] == evaluation["val_loss"]
        fingerprint = read_fingerprint(folder)
        assert fingerprint is not None and fingerprint["parameters"] == initial
        assert sorted(initial) == ["embed.weight", "head.bias", "head.weight"]
    assert check_script_pairing(specs, tmp_path, Console(file=None, record=True)) == {}
    assert not any(p.name == "lightning_logs" for p in tmp_path.rglob("*"))


def test_lightning_exception_is_recorded_as_a_crash(tmp_path: Path) -> None:
    callback = nl_lightning.NormlabCallback(norm="layernorm", run_dir=tmp_path / "r")
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        lightning_fit(TinyLM("layernorm", fail_at=2), tmp_path / "r", 0, callback)
    summary = read_summary(tmp_path / "r")
    assert summary is not None and summary["status"] == CRASHED
    assert summary["error"] == "RuntimeError: boom at batch 2"
    assert [r["step"] for r in read_records(tmp_path / "r", TRAIN_RECORD)] == [1]


# -- both ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "library", "blocked", "extra"),
    [
        ("normlab.integrations.hf", "transformers", "transformers", "hf"),
        ("normlab.integrations.lightning", "lightning", "lightning.pytorch", "lightning"),
    ],
)
def test_a_missing_library_names_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, module: str, library: str, blocked: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)  # as if not installed
    monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError) as err:
        importlib.import_module(module)
    assert str(err.value) == f"{module} needs {library}: pip install 'normlab[{extra}]'"


def test_a_zero_dimensional_tensor_in_a_batch_has_a_digest() -> None:
    # the Trainer hands the model num_items_in_batch as a 0-dimensional tensor
    scalar, vector = track.batch_digest(torch.tensor(3.0)), track.batch_digest(torch.tensor([3.0]))
    assert scalar != vector and scalar == track.batch_digest(torch.tensor(3.0))
    assert scalar != track.batch_digest(torch.tensor(4.0))


def test_a_given_run_excludes_norm_seed_and_folder(tmp_path: Path) -> None:
    run = track.init(norm="layernorm", run_dir=tmp_path / "r")
    for cls in (hf.NormlabCallback, nl_lightning.NormlabCallback):
        assert cls(run).run is run
        with pytest.raises(ValueError, match=r"^seed: the run is given"):
            cls(run, seed=0)
        with pytest.raises(TypeError, match=r"^run: expected a normlab.track.Run"):
            cls("layernorm")  # type: ignore[arg-type]
