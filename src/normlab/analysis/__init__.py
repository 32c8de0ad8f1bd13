"""Statistics across seeds for ``normlab compare``: paired differences, intervals, equivalence
tests, verdicts and the recommendation.

Modules, one job each: :mod:`~normlab.analysis.runs` loads a compare folder,
:mod:`~normlab.analysis.stats` holds the t-interval / TOST / log-ratio / sign-test formulas,
:mod:`~normlab.analysis.power` estimates the seeds still needed,
:mod:`~normlab.analysis.comparison` tests one paired sample,
:mod:`~normlab.analysis.stability` counts divergences and spikes,
:mod:`~normlab.analysis.sequential` and :mod:`~normlab.analysis.rounds` look after each round
of seeds, :mod:`~normlab.analysis.smallest` reads the smallest difference that matters per
metric, :mod:`~normlab.analysis.wording` decides every word these numbers lead to (verdicts,
decisions, the recommendation, badges), :mod:`~normlab.analysis.verdicts` and
:mod:`~normlab.analysis.recommendation` write their sentences, and
:mod:`~normlab.analysis.summary` assembles the top-level ``summary.json``.
"""

from normlab.analysis.comparison import EXACT_TEST, PairedComparison, compare_paired
from normlab.analysis.power import seeds_needed, settle_probability
from normlab.analysis.recommendation import Recommendation, recommend
from normlab.analysis.runs import (
    DONE_STATUSES,
    CompareFolder,
    CompareFolderError,
    RunResult,
    load_compare_folder,
)
from normlab.analysis.stability import arm_stability, stability_verdict
from normlab.analysis.stats import (
    describe,
    log_ratio_interval,
    paired_t_interval,
    sign_test,
    t_interval,
    tost,
    tost_paired,
)
from normlab.analysis.summary import analyze, compare_metric, run_outcome
from normlab.analysis.verdicts import ArmVerdict, arm_verdict

__all__ = [
    "DONE_STATUSES",
    "EXACT_TEST",
    "ArmVerdict",
    "CompareFolder",
    "CompareFolderError",
    "PairedComparison",
    "Recommendation",
    "RunResult",
    "analyze",
    "arm_stability",
    "arm_verdict",
    "compare_metric",
    "compare_paired",
    "describe",
    "load_compare_folder",
    "log_ratio_interval",
    "paired_t_interval",
    "recommend",
    "run_outcome",
    "seeds_needed",
    "settle_probability",
    "sign_test",
    "stability_verdict",
    "t_interval",
    "tost",
    "tost_paired",
]
