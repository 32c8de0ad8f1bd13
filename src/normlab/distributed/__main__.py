"""``python -m normlab.distributed --nproc-per-node N [--fsdp] -m MODULE ARGS…``: launch one run
on N processes with torchrun (see :mod:`normlab.distributed.launcher`)."""

import sys

from normlab.distributed.launcher import main

sys.exit(main())
