#!/usr/bin/env bash
# Create .venv (if missing) and install varbnn with its test extras, CPU-only torch first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch==2.13.0 before anything else: an unpinned torch would pull several GB of CUDA wheels.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test,docs]"
