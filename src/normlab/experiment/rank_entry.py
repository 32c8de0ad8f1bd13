"""``python -m normlab.experiment.rank_entry RUN_DIR``: one run started as a command, as one
plain process or as each rank under torchrun (:func:`normlab.experiment.worker.rank_main`).

A module of its own, so that ``-m`` does not run :mod:`normlab.experiment.worker` a second time
after the package imported it.
"""

import sys

from normlab.experiment.worker import rank_main

if __name__ == "__main__":
    sys.exit(rank_main())
