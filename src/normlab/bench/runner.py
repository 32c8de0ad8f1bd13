"""Run the benchmark grid: ops × D × dtypes × modes × peers, one result row each."""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from normlab._resources import available_memory
from normlab.bench.bytes_model import MODES, OPS, min_bytes
from normlab.bench.peers import (
    Problem,
    Unavailable,
    check_peer_names,
    default_peers,
    make_problem,
    max_error,
    peer_function,
    run_peer_once,
)
from normlab.bench.timing import CopyReference, measure_round_robin
from normlab.kernels.cpu.cache_size import last_level_cache_bytes

DIMS = (768, 2048, 4096, 8192)
LLC_MULTIPLE = 4.0
MAX_LLC_MULTIPLE = 1000.0  # past this one tensor of a problem is tens of GB
MEMORY_FRACTION = 0.25
"""The share of the memory available at the start that a default-sized problem may take."""
LIVE_TENSORS = 16
"""[rows, D] tensors a problem may hold at once (inputs, modulation, gradients, outputs and the
float32 temporaries of the eager peers): the divisor of the memory cap of :func:`rows_for`."""
DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True)
class Config:
    """What to run. ``rows=None`` sizes each problem to ``llc_multiple`` × the last-level cache."""

    ops: Sequence[str] = OPS
    dims: Sequence[int] = DIMS
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16)
    modes: Sequence[str] = MODES
    peers: Sequence[str] | None = None  # None: every peer available on the device
    device: str = "cpu"
    reps: int = 10
    warmup: int = 1
    rows: int | None = None
    llc_multiple: float = LLC_MULTIPLE
    budget_s: float = 20.0  # per peer and row: stop repeating past this (and min_reps)
    min_reps: int = 3
    sample_rows: int = 256  # rows compared with the float64 reference

    def __post_init__(self) -> None:
        check_config(self)


def _positive_int(value: object, name: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _choices(values: Sequence[object], name: str, allowed: Sequence[object]) -> None:
    if isinstance(values, str) or not values:
        raise ValueError(f"{name}: expected a non-empty list, got {values!r}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(
            f"{name}: unknown {', '.join(map(str, bad))}; expected some of "
            f"{', '.join(map(str, allowed))}"
        )


def parse_device(device: object) -> torch.device:
    """``device`` as a torch.device of a type the benchmark runs on (``cpu``, ``cuda[:N]``).

    Raises ``ValueError`` naming ``device`` for an unparsable or unsupported device. Whether
    CUDA is present is checked by :func:`check_device_available`.
    """
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device: expected cpu, cuda or cuda:N, got {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device: expected cpu, cuda or cuda:N, got {device!r}") from None
    if parsed.type not in DEVICE_TYPES:
        raise ValueError(f"device: expected cpu, cuda or cuda:N, got {device!r}")
    return parsed


def check_device_available(device: object) -> torch.device:
    """:func:`parse_device`, and CUDA (the GPU index) present when a CUDA device is asked."""
    parsed = parse_device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(
                f"device: {device!r} requested but only {count} CUDA device(s) exist "
                f"(expected cuda:0 … cuda:{count - 1})"
            )
    return parsed


def check_config(config: Config) -> None:
    """Every field in range, before any work; ``ValueError`` names the field at fault."""
    _choices(config.ops, "ops", OPS)
    _choices(config.modes, "modes", MODES)
    _choices(config.dtypes, "dtypes", (torch.float32, torch.bfloat16, torch.float16))
    if isinstance(config.dims, str) or not config.dims:
        raise ValueError(f"dims: expected a non-empty list of integers >= 1, got {config.dims!r}")
    for dim in config.dims:
        _positive_int(dim, "dims")
    if config.peers is not None:
        check_peer_names(config.peers)
    parse_device(config.device)
    _positive_int(config.reps, "reps")
    _positive_int(config.warmup, "warmup", minimum=0)
    _positive_int(config.min_reps, "min_reps")
    _positive_int(config.sample_rows, "sample_rows")
    if config.rows is not None:
        _positive_int(config.rows, "rows")
    multiple = config.llc_multiple
    if (
        isinstance(multiple, bool)
        or not isinstance(multiple, (int, float))
        or not 0 < multiple <= MAX_LLC_MULTIPLE  # also rejects NaN
    ):
        raise ValueError(
            f"llc_multiple: expected a number > 0 and <= {MAX_LLC_MULTIPLE:g}, got {multiple!r}"
        )
    budget = config.budget_s
    if (
        isinstance(budget, bool)
        or not isinstance(budget, (int, float))
        or not 0 < budget < math.inf
    ):
        raise ValueError(f"budget_s: expected a finite number of seconds > 0, got {budget!r}")


@dataclass
class Row:
    """One measured (or skipped) combination; the columns of the CSV and JSON outputs."""

    op: str
    dim: int
    rows: int
    dtype: str
    mode: str
    peer: str
    status: str = "ok"
    median_ms: float | None = None
    min_ms: float | None = None
    model_bytes: int | None = None
    gbps: float | None = None
    copy_gbps: float | None = None
    frac_copy: float | None = None
    frac_copy_best: float | None = None
    speedup_vs_torch: float | None = None
    max_err: float | None = None
    reps: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


COLUMNS = tuple(Row.__dataclass_fields__)


@dataclass
class Result:
    config: Config
    rows: list[Row] = field(default_factory=list)
    llc_bytes: int = 0
    copy_gbps: float | None = None
    seconds: float = 0.0


def cache_bytes(device: torch.device) -> int:
    """The device's last-level cache: CPU L3 (or what the OS reports), GPU L2."""
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or (
            50 * 1024 * 1024
        )
    return last_level_cache_bytes()


def rows_for(
    dim: int, dtype: torch.dtype, llc: int, multiple: float, memory: int | None = None
) -> int:
    """Rows so that one [rows, dim] tensor holds at least ``multiple`` × the cache, in bytes,
    unless :data:`LIVE_TENSORS` such tensors would take more than :data:`MEMORY_FRACTION` of
    ``memory`` (the bytes available; None: no cap). A host whose last-level cache is large next
    to its memory (a VM slice of a server socket reports the whole socket's L3) then gets
    problems that fit, rather than being killed for memory."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, math.ceil(multiple * llc / (dim * itemsize)))
    if memory is not None:
        rows = min(rows, max(1, int(MEMORY_FRACTION * memory) // (LIVE_TENSORS * dim * itemsize)))
    return rows


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run(config: Config, progress: Callable[[Row], None] | None = None) -> Result:
    """Measure every combination of ``config``; rows of unavailable peers are kept as skipped.

    Raises ``ValueError`` naming ``device`` when the device is not present here.
    """
    device = check_device_available(config.device)
    started = time.perf_counter()
    result = Result(config=config, llc_bytes=cache_bytes(device))
    peers = list(config.peers) if config.peers is not None else default_peers(device)
    copy_samples: list[float] = []
    memory = available_memory() if device.type == "cpu" else None
    for dtype in config.dtypes:
        for dim in config.dims:
            rows = config.rows or rows_for(
                dim, dtype, result.llc_bytes, config.llc_multiple, memory
            )
            copy = CopyReference(rows * dim, dtype, device)
            for op in config.ops:
                problem = make_problem(op, dtype, device, rows, dim)
                itemsize = problem.tensors["x"].element_size()
                for mode in config.modes:
                    nbytes = min_bytes(op, mode, rows, dim, itemsize)
                    group = [Row(op, dim, rows, _dtype_name(dtype), mode, p) for p in peers]
                    _measure_group(group, problem, mode, nbytes, copy, device, config)
                    for row in group:
                        if row.copy_gbps is not None:
                            copy_samples.append(row.copy_gbps)
                        result.rows.append(row)
                        if progress is not None:
                            progress(row)
                del problem
                gc.collect()
            del copy
            gc.collect()
    _fill_speedups(result.rows)
    if copy_samples:
        copy_samples.sort()
        result.copy_gbps = copy_samples[len(copy_samples) // 2]
    result.seconds = time.perf_counter() - started
    return result


def _measure_group(
    rows: list[Row],
    problem: Problem,
    mode: str,
    nbytes: int,
    copy: CopyReference,
    device: torch.device,
    config: Config,
) -> None:
    """Measure every peer of one (op, D, dtype, mode) round-robin; fill their rows."""
    if "torch._dynamo" in sys.modules:
        # Compiled peers specialise on shape and mode; past dynamo's recompile limit a function
        # silently runs eagerly. A fresh cache per group keeps every compiled peer compiled.
        torch._dynamo.reset()
    runners = {}
    for row in rows:
        try:
            fn = peer_function(row.peer, problem.op, device)
            runner = run_peer_once(fn, problem, mode)  # compiles, builds, warms caches
        except Unavailable as err:
            row.status, row.note = "skipped", str(err)
            continue
        except Exception as err:  # a peer that fails must not stop the benchmark
            row.status, row.note = "error", f"{type(err).__name__}: {err}"[:300]
            continue
        try:
            row.max_err = max_error(runner, config.sample_rows)
        except Exception as err:
            row.note = f"error check failed: {type(err).__name__}: {err}"[:300]
        runner.release()
        runners[row.peer] = runner
    if not runners:
        return
    timings = measure_round_robin(
        {name: r.step for name, r in runners.items()},
        nbytes,
        copy,
        device,
        reps=config.reps,
        warmup=max(0, config.warmup - 1),
        budget_s=config.budget_s,
        min_reps=config.min_reps,
        after=lambda name: runners[name].release(),
    )
    for row in rows:
        timing = timings.get(row.peer)
        if timing is None:
            continue
        row.median_ms = timing.median_s * 1e3
        row.min_ms = timing.min_s * 1e3
        row.model_bytes = nbytes
        row.gbps = nbytes / timing.median_s / 1e9
        row.copy_gbps = timing.copy_gbps
        row.frac_copy = timing.fraction
        row.frac_copy_best = timing.fraction_best
        row.reps = timing.reps
    for runner in runners.values():
        runner.release()


def _fill_speedups(rows: list[Row]) -> None:
    """speedup_vs_torch = torch's median time / the row's median time, same op/D/dtype/mode."""
    torch_ms = {
        (r.op, r.dim, r.dtype, r.mode): r.median_ms
        for r in rows
        if r.peer == "torch" and r.median_ms is not None
    }
    for r in rows:
        base = torch_ms.get((r.op, r.dim, r.dtype, r.mode))
        if base is not None and r.median_ms:
            r.speedup_vs_torch = base / r.median_ms
