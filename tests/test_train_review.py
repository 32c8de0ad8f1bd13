"""Training-loop measurements: the warm-up shape, the evaluation device, the worker's own peak
memory and the device synchronisation behind step times."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from normlab._io import write_json_atomic
from normlab.data import prepare_tokens
from normlab.experiment import plan_runs, run_experiment, validate_config
from normlab.experiment import testbeds as testbeds_module
from normlab.experiment import train as train_module
from normlab.models import GPTConfig, build_gpt

MiB = 2**20
linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="the kernel's ru_maxrss and /proc semantics are Linux's"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    return root


def tiny_config(corpus: Path, **top: Any) -> dict[str, Any]:
    return {
        "seeds": 1,
        "threads": 1,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
        "train": {"steps": 4, "batch_size": 2, "warmup": 1, "eval_interval": 2, "eval_windows": 4},
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus)},
        **top,
    }


def test_warm_up_runs_the_training_shape_and_leaves_no_gradient() -> None:
    """Kernels specialise on the number of rows (the Triton norms' rows per program), so the
    warm-up must run [batch_size, context], or step 1 pays for compiling the training shape."""
    model = build_gpt(GPTConfig(d_model=16, n_layers=1, n_heads=2, context=8), seed=0)
    shapes: list[tuple[int, ...]] = []
    model.blocks[0].norm_attn.register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    model.train()
    train_module.warm_up(model, torch.device("cpu"), batch_size=3)
    assert shapes == [(3, 8, 16)]
    assert all(p.grad is None for p in model.parameters())
    assert model.training


def test_evaluation_runs_on_the_run_device_with_its_index(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cuda:1`` must not become ``cuda`` (the current device) for the validation windows."""
    cfg = validate_config(tiny_config(corpus))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    spec = plan_runs(cfg, "cpu:0", 1, info)[0]
    run_dir = tmp_path / "runs" / spec["run_id"]
    write_json_atomic(run_dir / "run.json", spec)
    seen: list[object] = []
    real = testbeds_module.validation_loss

    def recording(model: Any, windows: torch.Tensor, batch_size: int, device: str) -> float:
        seen.append(device)
        return real(model, windows, batch_size, device)

    monkeypatch.setattr(testbeds_module, "validation_loss", recording)
    summary = train_module.train_run(spec, run_dir)
    assert summary["status"] == "finished"
    assert seen and set(seen) == {"cpu:0"}


@linux_only
def test_cpu_peak_memory_is_the_workers_own_not_the_grid_processs(
    corpus: Path, tmp_path: Path
) -> None:
    """ru_maxrss survives fork and exec: a worker spawned by a grid process that once held
    1 GiB more reported that peak as its own, the same for every arm."""
    ballast = bytearray(1024 * MiB)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    del ballast
    parent_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = validate_config(tiny_config(corpus))
    summaries = run_experiment(cfg, tmp_path / "out", show_progress=False)
    for summary in summaries.values():
        assert summary["status"] == "finished"
        assert summary["peak_memory_kind"] == "max_rss"
        assert 0 < summary["peak_memory_bytes"] < parent_peak - 512 * MiB


@linux_only
def test_peak_rss_bytes_is_at_least_the_current_rss() -> None:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize()
    assert train_module.peak_rss_bytes() >= rss * 0.9


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_step_times_wait_for_asynchronous_devices(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step times cover the step's kernels only if the loop waits for them on every
    asynchronous device, not only on CUDA."""
    calls: list[str] = []
    module = getattr(torch, kind)
    monkeypatch.setattr(module, "synchronize", lambda *_a, **_k: calls.append(kind))
    train_module._sync(torch.device(kind))
    assert calls == [kind]
    train_module._sync(torch.device("cpu"))
    assert calls == [kind]
