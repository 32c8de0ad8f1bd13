"""The grid of runs: plan it (:mod:`~normlab.experiment.execution.grid`), check and lock the
output folder (:mod:`~normlab.experiment.execution.runner`,
:mod:`~normlab.experiment.execution.lock`, :mod:`~normlab.experiment.execution.sizes`,
:mod:`~normlab.experiment.execution.environment`), train each run in its own process
(:mod:`~normlab.experiment.execution.executors`, :mod:`~normlab.experiment.execution.worker`,
:mod:`~normlab.experiment.execution.worker_process`,
:mod:`~normlab.experiment.execution.bootstrap`, :mod:`~normlab.experiment.execution.launching`,
:mod:`~normlab.experiment.execution.rank_entry`). What trains several grids (a ladder, a
sweep, rounds of seeds) is the study's (:mod:`normlab.study`)."""
