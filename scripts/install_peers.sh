#!/usr/bin/env bash
# Optional: install the peer libraries compared in benchmarks/step_time.py into .venv WITHOUT their
# dependencies, so that the pinned CPU torch is kept (their unpinned torch requirement would pull a new
# torch with several GB of CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet --no-deps "bayesian-torch==0.5.0" "torchbnn==1.2"
