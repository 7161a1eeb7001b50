#!/usr/bin/env bash
# Build the documentation site offline into site/ (fails on any warning: broken link, unknown reference).
# `bash scripts/docs.sh serve` previews it at http://127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
if [ "${1:-build}" = "serve" ]; then
  exec .venv/bin/mkdocs serve
fi
exec .venv/bin/mkdocs build --strict --quiet
