"""Do two versions of normlab train the same numbers? Run four scenarios through the public
commands into a folder, then compare two such folders value by value, timings aside.

  python benchmarks/bit_identity.py run OUT_BEFORE          # with the old version's normlab
  python benchmarks/bit_identity.py run OUT_AFTER           # with the new version's normlab
  python benchmarks/bit_identity.py diff OUT_BEFORE OUT_AFTER

The scenarios (each in its own sub-folder of OUT):

- ``default``: ``normlab compare`` as a new user runs it (LayerNorm vs RMSNorm, 3 seeds, 600
  steps), without the report;
- ``ladder``: a two-rung width ladder with a learning-rate sweep on one tuning seed;
- ``script``: ``compare --script`` over the plain-loop example (2 norms × 2 seeds, 30 steps);
- ``import``: ``normlab report --import jsonl:…`` of a table this script writes.

``run`` calls the ``normlab`` found beside this Python (``--normlab`` names another), so the
same file drives any version that has these commands. ``diff`` reads every ``metrics.jsonl``
and ``summary.json`` under each scenario, drops the fields that measure time or the machine
(:data:`TIMING_KEYS`), and counts the values that differ; it exits 1 when any does.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLAIN_LOOP = ROOT / "examples" / "own_loop" / "plain_loop.py"
TIMING_KEYS = frozenset(
    {
        "wall_s",
        "elapsed_s",
        "step_time_s",
        "tokens_per_s",
        "total_tokens_per_s",
        "rank_tokens_per_s",
        "time_to_target_s",
        "posttrain_s",
        "peak_memory_bytes",
        "total_peak_memory_bytes",
        "rank_peak_memory_bytes",
        "peak_memory_kind",
        "samples_s",
        "started_at",
        "finished_at",
        "python_version",
        "torch_version",
        "hostname",
        "pid",
        "cwd",
    }
)
"""Fields that measure time, memory or the machine: left out of the comparison."""
FILES = ("metrics.jsonl", "summary.json")


def _normlab(args: argparse.Namespace) -> list[str]:
    if args.normlab:
        return [args.normlab]
    return [str(Path(sys.executable).parent / "normlab")]


def _write_import_table(path: Path) -> None:
    """A long table of 2 arms × 3 seeds × 5 steps, its values a fixed function of the run."""
    lines = []
    for arm_i, arm in enumerate(("ln", "rms")):
        for seed in range(3):
            for step in range(1, 6):
                loss = 3.0 / step + 0.01 * seed + 0.002 * arm_i
                lines.append(
                    {"run": f"{arm}_s{seed}", "step": step, "metric": "loss", "value": loss}
                )
                lines.append(
                    {
                        "run": f"{arm}_s{seed}",
                        "step": step,
                        "metric": "val_loss",
                        "value": loss + 0.05,
                    }
                )
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def scenarios(out: Path, normlab: list[str]) -> dict[str, list[str]]:
    """The command of each scenario."""
    script = (
        f"{sys.executable} {PLAIN_LOOP} --norm {{norm}} --seed {{seed}} --out {{run_dir}} "
        "--steps 30"
    )
    return {
        "default": [*normlab, "compare", "--no-report", "--out", str(out / "default")],
        "ladder": [
            *normlab, "compare", "--ladder", "d_model=16,32", "--seeds", "2", "--steps", "60",
            "--lr-sweep", "0.003,0.01", "--tuning-seeds", "1", "--out", str(out / "ladder"),
        ],
        "script": [
            *normlab, "compare", "--script", script, "--norms", "layernorm,rmsnorm",
            "--seeds", "2", "--metric", "val_loss", "--margin", "0.02", "--out",
            str(out / "script"),
        ],
        "import": [
            *normlab, "report", "--import", f"jsonl:{out / 'import.jsonl'}",
            "--arm-from", r"^(.+)_s\d+$", "--seed-from", r"_s(\d+)$", "--metric", "val_loss",
            "--margin", "0.02", "--out", str(out / "import"),
        ],
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    _write_import_table(out / "import.jsonl")
    for name, command in scenarios(out, _normlab(args)).items():
        if args.only and name not in args.only:
            continue
        if (out / name).exists():
            shutil.rmtree(out / name)
        print(f"== {name}: {' '.join(command)}", flush=True)
        done = subprocess.run(command, cwd=ROOT, check=False)
        if done.returncode != 0:
            print(f"{name}: exit status {done.returncode}", file=sys.stderr)
            return done.returncode
    return 0


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _read(path: Path) -> Any:
    if path.name.endswith(".jsonl"):
        return [_strip(json.loads(line)) for line in path.read_text().splitlines() if line]
    return _strip(json.loads(path.read_text()))


def _leaves(value: Any, at: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for k, v in value.items():
            found.update(_leaves(v, f"{at}.{k}"))
        return found
    if isinstance(value, list):
        found = {}
        for i, v in enumerate(value):
            found.update(_leaves(v, f"{at}[{i}]"))
        return found
    return {at: value}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def run_files(folder: Path) -> dict[str, Path]:
    """Every run file of :data:`FILES` under ``folder``, by its path relative to it."""
    return {
        str(p.relative_to(folder)): p
        for name in FILES
        for p in sorted(folder.rglob(name))
        if "runs" in p.relative_to(folder).parts
    }


def diff(args: argparse.Namespace) -> int:
    a_root, b_root = Path(args.a), Path(args.b)
    total = differ = 0
    for name in scenarios(a_root, ["normlab"]):
        a_files, b_files = run_files(a_root / name), run_files(b_root / name)
        if set(a_files) != set(b_files):
            only = sorted(set(a_files) ^ set(b_files))
            print(f"{name}: the run files differ: {only[:5]}")
            differ += 1
        n_values = n_differ = 0
        for rel in sorted(set(a_files) & set(b_files)):
            a, b = _leaves(_read(a_files[rel])), _leaves(_read(b_files[rel]))
            for key in sorted(set(a) | set(b)):
                n_values += 1
                if key not in a or key not in b or not _same(a[key], b[key]):
                    n_differ += 1
                    if n_differ <= 10:
                        print(f"{name}: {rel}{key}: {a.get(key)!r} != {b.get(key)!r}")
        print(f"{name}: {len(a_files)} files, {n_values} values, {n_differ} differ")
        total += n_values
        differ += n_differ
    print(f"all: {total} values, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="run the scenarios into OUT")
    r.add_argument("out")
    r.add_argument("--normlab", help="the normlab executable (default: beside this Python)")
    r.add_argument("--only", nargs="*", help="run only these scenarios")
    d = sub.add_parser("diff", help="compare two folders of `run`")
    d.add_argument("a")
    d.add_argument("b")
    args = parser.parse_args()
    return run(args) if args.verb == "run" else diff(args)


if __name__ == "__main__":
    raise SystemExit(main())
