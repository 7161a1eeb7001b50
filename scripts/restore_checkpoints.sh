#!/usr/bin/env bash
# Put the epoch checkpoints that a device call of scripts/gpu_reproduce.sh (CHECKPOINTS=1) brought back, files named
# ckpt__<protocol folder>__<file>, where an experiment's runner resumes them: OUT/.checkpoints/<protocol folder>/<file>.
#
#   bash scripts/restore_checkpoints.sh /work/.device/N benchmarks/results/lenet5-front
#
# A checkpoint already there is kept when it is at the same or a later epoch than the one brought back (nothing is
# overwritten with an older state); each copy is verified (read_checkpoint: the sha256 the file carries) before it
# replaces anything.
set -euo pipefail
from="$(realpath -m "${1:?FILES_AT: the folder the device tool put the files in}")"
out="$(realpath -m "${2:?OUT: the --out folder of the experiment}")"  # (both before the cd below)
cd "$(dirname "$0")/.."
restore='
import shutil, sys
from pathlib import Path
from varbnn.train import read_checkpoint

source, target = Path(sys.argv[1]), Path(sys.argv[2])
epoch = int(read_checkpoint(source).get("epoch", 0))
there = int(read_checkpoint(target).get("epoch", 0)) if target.exists() else -1
if there >= epoch:
    print(f"kept {target}: at epoch {there}, the copy at {epoch}")
else:
    partial = target.with_suffix(".partial")
    shutil.copyfile(source, partial)
    read_checkpoint(partial)
    partial.replace(target)
    print(f"restored {target} (epoch {epoch})")
'
found=0
for file in "$from"/ckpt__*__*; do
    [ -e "$file" ] || continue
    found=1
    rest="${file##*/ckpt__}"
    folder="${rest%%__*}"
    name="${rest#*__}"
    if [[ "$folder$name" == */* || "$folder$name" == *..* ]]; then
        echo "refusing an odd name: $file" >&2
        exit 2
    fi
    mkdir -p "$out/.checkpoints/$folder"
    PYTHONPATH=src .venv/bin/python -c "$restore" "$file" "$out/.checkpoints/$folder/$name"
done
if [ "$found" = 0 ]; then
    echo "no ckpt__*__* files in $from" >&2
    exit 1
fi
