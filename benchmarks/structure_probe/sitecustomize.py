"""Loaded at the start of every Python that benchmarks/structure.py starts (this folder is on
their ``PYTHONPATH``): installs that tool's probes when its trace folder is set, before the
process imports anything else. It imports only the standard library and that tool."""

import os

if os.environ.get("NORMLAB_STRUCTURE_TRACE"):
    import structure  # benchmarks/structure.py: the folder above this one is on PYTHONPATH

    structure.install_probes(os.environ["NORMLAB_STRUCTURE_TRACE"])
