#!/usr/bin/env bash
# Create .venv (if missing) and install varbnn with its test extras, CPU-only torch first, then the lab (lab/).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch==2.13.0 before anything else: an unpinned torch would pull several GB of CUDA wheels. PyTorch's CPU index is
# an extra index, so pip takes its 2.13.0+cpu (a later version than PyPI's 2.13.0, the CUDA build on Linux); where
# that index cannot be reached (an offline mirror, a local wheel), pip warns and installs from the other sources.
# TORCH_INDEX_URL chooses another build, e.g. https://download.pytorch.org/whl/cu126.
.venv/bin/python -m pip install --quiet --retries 2 "torch==2.13.0" \
  --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
.venv/bin/python -m pip install --quiet -e ".[test,docs]"
# The lab (lab/: the experiments, varbnn_lab and its varbnn-lab command), which the package does not ship; --no-deps:
# its one dependency, varbnn, is the editable install above.
.venv/bin/python -m pip install --quiet --no-deps -e lab/
