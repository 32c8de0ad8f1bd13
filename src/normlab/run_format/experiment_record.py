"""The content of ``experiment.json`` (docs/run-format.md), built once for every kind of grid.

A grid of normlab's own runs, a ``compare --script`` grid and the runs ``normlab report
--import`` reads from a tracker all describe their experiment in the same keys, in the same
order: what the analysis reads (the testbed, the arms and their baseline, the seeds, the
equivalence margin under its testbed's key, the target loss, what varies and what is held
fixed), then what the report shows (the config, the environment, the data) and the runs'
ids, then the keys of one kind only (``extra``: parameter counts, norm swaps, learning rates,
the import record). Each caller passes plain values; this module imports nothing above
:mod:`normlab.run_format`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from normlab.run_format.testbeds import DEFAULT_TESTBED, TESTBED_FORMATS, testbed_format

__all__ = ["check_experiment", "experiment_record", "factor_split"]


def factor_split(
    values: Mapping[str, Sequence[Any]],
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """(varied, fixed) of the factors' values ({factor: [values]}, in factor order): a factor
    with more than one value varies; when none does, the first factor (the norm) is reported
    as varied all the same (the arms differ in something). Every other factor is fixed at its
    one value."""
    varied = {f: list(v) for f, v in values.items() if len(v) > 1}
    if not varied:
        first = next(iter(values))
        varied = {first: list(values[first])}
    fixed = {f: v[0] for f, v in values.items() if f not in varied}
    return varied, fixed


def experiment_record(
    *,
    testbed: str,
    arms: Sequence[str],
    baseline_arm: str,
    seeds: Sequence[int],
    margin: float | None,
    factors: Mapping[str, Sequence[Any]],
    settings: Mapping[str, Any],
    config: dict[str, Any],
    environment: dict[str, Any],
    runs: Sequence[str],
    target_val_loss: float | None = None,
    data: dict[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``experiment.json`` of a grid: ``testbed``, ``arms``, ``baseline_arm``, ``seeds``, the
    equivalence ``margin`` under the testbed's key (:attr:`TestbedFormat.margin_key`:
    ``margin_bpb``, ``margin_val_loss``, or ``margin`` for a script's metric),
    ``target_val_loss``, ``varied`` and ``fixed`` (:func:`factor_split` of ``factors``, the
    fixed factors followed by ``settings``: every other setting held equal, as dotted keys),
    ``config``, ``environment``, ``data`` ({} when None), ``runs`` (the run ids in grid order),
    then the keys of ``extra`` in their order."""
    varied, fixed = factor_split(factors)
    fixed.update(settings)
    return {
        "testbed": testbed,
        "arms": list(arms),
        "baseline_arm": baseline_arm,
        "seeds": list(seeds),
        testbed_format(testbed).margin_key: margin,
        "target_val_loss": target_val_loss,
        "varied": varied,
        "fixed": fixed,
        "config": config,
        "environment": environment,
        "data": data if data is not None else {},
        "runs": list(runs),
        **(extra or {}),
    }


def check_experiment(record: Mapping[str, Any], where: object) -> None:
    """Raise ``ValueError`` naming ``where`` (the file) unless ``record`` has the shape of an
    ``experiment.json`` that the analysis can read: ``arms`` a non-empty list of arm names,
    ``baseline_arm`` (when present) one of them, ``seeds`` (when present) a list of ints,
    ``testbed`` (when present) a testbed of the run format, ``runs`` (when present) a list of
    run ids. Older folders without ``baseline_arm``, ``testbed`` or ``runs`` pass."""
    arms = record.get("arms")
    if not (isinstance(arms, list) and arms and all(isinstance(a, str) for a in arms)):
        raise ValueError(f"{where}: 'arms' must be a non-empty list of arm names, got {arms!r}")
    baseline = record.get("baseline_arm", arms[0])
    if baseline not in arms:
        raise ValueError(
            f"{where}: 'baseline_arm' must be one of the arms {arms}, got {baseline!r}"
        )
    seeds = record.get("seeds", [])
    if not (
        isinstance(seeds, list)
        and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ValueError(f"{where}: 'seeds' must be a list of ints, got {seeds!r}")
    testbed = record.get("testbed", DEFAULT_TESTBED)
    try:
        testbed_format(testbed)  # a script testbed's name carries its metric
    except ValueError:
        raise ValueError(
            f"{where}: 'testbed' must be one of {sorted(TESTBED_FORMATS)} or "
            f"script:<metric>:min|max, got {testbed!r}"
        ) from None
    runs = record.get("runs")
    if runs is not None and not (isinstance(runs, list) and all(isinstance(r, str) for r in runs)):
        raise ValueError(f"{where}: 'runs' must be a list of run ids, got {runs!r}")
