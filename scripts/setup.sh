#!/usr/bin/env bash
# Set up a virtual environment in .venv with normlab and its development tools.
# torch==2.13.0 is installed first so that pip takes the CPU build rather than pulling a
# multi-GB CUDA one; the package itself accepts a range of torch versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
