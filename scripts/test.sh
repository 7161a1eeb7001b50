#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest (e.g. -k likelihood).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export VARBNN_DATA="${VARBNN_DATA:-../shared/data}"
exec .venv/bin/python -m pytest "$@"
