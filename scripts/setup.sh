#!/usr/bin/env bash
# Set up a virtual environment in .venv with normlab and its development tools.
# torch==2.13.0 is installed first, on its own, so that the project's dependencies are resolved
# against that exact build; the package itself accepts a range of torch versions. pip takes the
# build its configured index offers: set TORCH_INDEX_URL (for instance
# https://download.pytorch.org/whl/cpu) to choose PyTorch's CPU-only wheels, since the Linux
# wheels on PyPI carry CUDA libraries of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  .venv/bin/python -m pip install --quiet --index-url "$TORCH_INDEX_URL" "torch==2.13.0"
else
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[dev,hf,ray,trackers,lightning]"
