#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. CI runs exactly this via .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -n 2 -q "$@"
