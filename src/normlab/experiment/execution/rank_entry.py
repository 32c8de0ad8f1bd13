"""``python -m normlab.experiment.execution.rank_entry RUN_DIR``: one run started as a command, as
one plain process or as each rank under torchrun
(:func:`normlab.experiment.execution.worker.rank_main`).

A module of its own, so that ``-m`` does not run :mod:`normlab.experiment.execution.worker` a
second time after the package imported it.
"""

import sys

from normlab.experiment.execution.worker import rank_main

if __name__ == "__main__":
    sys.exit(rank_main())
