#!/usr/bin/env bash
# Set up (idempotent) and run the test suite in two pytest-xdist workers (VARBNN_TEST_WORKERS=N for another number,
# 0 for one process). Extra arguments go to pytest (e.g. -k likelihood, --runslow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export VARBNN_DATA="${VARBNN_DATA:-../shared/data}"
exec .venv/bin/python -m pytest -n "${VARBNN_TEST_WORKERS:-2}" "$@"
