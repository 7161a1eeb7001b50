#!/usr/bin/env bash
# Set up (idempotent) and run the offline demo; results go to varbnn-results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/varbnn demo "$@"
