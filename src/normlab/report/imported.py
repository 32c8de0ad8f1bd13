"""The report's words on a folder of imported runs (``normlab report --import``): where the runs
came from, how their arms and seeds were read, and which pairing checks could be made and which
could not, from ``experiment.json``'s :class:`normlab.run_format.imported.ImportRecord`."""

from __future__ import annotations

from typing import Any

from normlab._plural import counted, noun
from normlab.run_format.imported import import_record
from normlab.run_format.testbeds import parse_script_testbed

__all__ = ["KIND_NAMES", "import_paragraphs", "pairing_lines"]

KIND_NAMES = {
    "tensorboard": "TensorBoard",
    "mlflow": "MLflow",
    "wandb": "W&B",
    "csv": "CSV",
    "jsonl": "JSON Lines",
}
"""How the report names each kind of source."""
MAX_LISTED = 12
"""Seeds or runs listed in one sentence before the rest are counted."""


def _listed(items: list[str], sep: str = ", ") -> str:
    shown = sep.join(items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def _step(step: Any) -> str:
    return "no step" if step is None else f"step {step}"


def _unpaired(seeds: dict[str, dict[str, Any]], arms: list[str], record: Any) -> list[str]:
    """Each seed missing an arm, with the missing arms: "no run of rms", or "rms_s2 left out"
    when the arm's run was left out for what it logged (a damaged source, a run cut short)."""
    left = {
        (s.get("arm"), str(s.get("seed"))): s.get("run")
        for s in record.get("skipped") or []
        if isinstance(s, dict) and "arm" in s
    }
    unpaired = []
    for seed, present in seeds.items():
        missing = [a for a in arms if a not in present]
        if missing:
            words = [
                f"{left[arm, seed]} left out" if (arm, seed) in left else f"no run of {arm}"
                for arm in missing
            ]
            unpaired.append(f"seed {seed} ({', '.join(words)})")
    return unpaired


def _steps_line(seeds: dict[str, dict[str, Any]], compared: bool) -> str:
    """The sentence on the last step each arm of a seed logged: the seeds whose arms end at
    different steps named, the runs that end earlier said, and what is compared."""
    differing = []
    same: set[Any] = set()
    for seed, present in seeds.items():
        steps = set(present.values())
        if len(steps) > 1:
            words = ", ".join(f"{arm} to {_step(step)}" for arm, step in present.items())
            longest = max(s for s in steps if s is not None)  # two steps: one is a number
            short = [a for a, s in present.items() if s is None or s < longest]
            verb = "ends" if len(short) == 1 else "end"
            differing.append(f"seed {seed}: {words} ({', '.join(short)} {verb} earlier)")
        else:
            same |= steps
    if not differing:
        at = ", ".join(_step(s) for s in sorted(same, key=lambda s: (s is None, s or 0)))
        return f"Steps logged per seed: the arms of every seed end at the same step ({at})."
    if compared:
        rule = (
            "a run that ends earlier is compared on its last value, from an earlier step of "
            "training than the others' (as --compare-unequal-steps asks)"
        )
    else:
        rule = (
            "a run that ended whole at an earlier step than another of its seed is left out "
            "(listed below); those that remain failed, diverged or did not end, and count as such"
        )
    return f"Steps logged per seed differ between arms: {_listed(differing)}; {rule}."


def pairing_lines(experiment: dict[str, Any]) -> list[str]:
    """One sentence per pairing check of an imported folder: what was not checked (initial
    parameters and first batch), the arms present per seed (a seed missing an arm is named as
    unpaired, with the run left out when there was one), the last steps logged per seed (seeds
    whose arms differ are named, with the runs that end earlier), and whether the tracker
    recorded run statuses; [] for a folder that was not imported."""
    record = import_record(experiment)
    if record is None:
        return []
    kind = KIND_NAMES.get(str(record.get("kind")), str(record.get("kind")))
    arms = [a for a in experiment.get("arms") or [] if isinstance(a, str)]
    seeds: dict[str, dict[str, Any]] = record.get("seeds") or {}
    lines = [
        "Initial parameters and first batch: not recorded by the tracker, not checked; that the "
        "arms of a seed started alike and saw the same batches is assumed."
    ]
    unpaired = _unpaired(seeds, arms, record)
    full = [seed for seed, present in seeds.items() if all(a in present for a in arms)]
    arms_line = (
        f"Arms present per seed: all {counted(len(arms), 'arm')} in {noun(len(full), 'seed')} "
        f"{_listed(full) or 'none'}"
    )
    if unpaired:
        arms_line += (
            f"; unpaired: {_listed(unpaired)}, left out of every paired comparison with a "
            "missing arm"
        )
    lines.append(arms_line + ".")
    lines.append(_steps_line(seeds, bool(record.get("compare_unequal_steps", True))))
    if record.get("status_recorded"):
        lines.append(
            f"Run status: recorded by {kind}; a run it records as failed is counted as "
            "crashed, one it records as not ended as unfinished."
        )
    else:
        lines.append(f"Run status: not recorded by {kind}; every run is taken as ended.")
    return lines


def import_paragraphs(experiment: dict[str, Any]) -> list[str]:
    """The method section's paragraphs for an imported folder (in place of the testbed's own
    note): the source and the rules, the pairing checks (:func:`pairing_lines`) and the tracker
    runs left out; [] for a folder that was not imported."""
    record = import_record(experiment)
    if record is None:
        return []
    kind = KIND_NAMES.get(str(record.get("kind")), str(record.get("kind")))
    metric, field = str(record.get("metric")), str(record.get("field"))
    parsed = parse_script_testbed(experiment.get("testbed"))
    direction = "lower" if parsed is None or parsed[1] else "higher"
    runs = record.get("runs") or {}
    skipped = record.get("skipped") or []
    stored = f" (stored as {field})" if field != metric else ""
    source = (
        f"The runs were trained elsewhere and imported from {kind} ({record.get('path')}) by "
        f"normlab report --import: {counted(len(runs), 'run')}, each run's arm read by --arm-from "
        f"'{record.get('arm_from')}' and its seed by --seed-from '{record.get('seed_from')}'. "
        f"Quality is the last value of {metric}{stored} each run logged ({direction} is "
        f"better); a run whose {metric} or loss was not finite at some step counts as diverged "
        "from that step, and a run that never logged it as crashed. The training loss is the "
        "tracker's metric named loss (when logged) and is compared without a margin. A run "
        "whose source file is damaged or cut short is left out, never judged on what was read "
        "before the damage"
        + (
            "."
            if record.get("compare_unequal_steps", True)
            else "; so is a run that ended whole at an earlier step than another of its seed."
        )
    )
    paragraphs = [source, "Pairing checks. " + " ".join(pairing_lines(experiment))]
    if skipped:
        left = [f"{s.get('run')} ({s.get('reason')})" for s in skipped if isinstance(s, dict)]
        paragraphs.append(f"Tracker runs left out ({len(left)}): {_listed(left, '; ')}.")
    return paragraphs
