#!/usr/bin/env bash
# The long CPU reproductions that are still open, resumed in a fixed order, in the background of a working session:
#
#   nohup bash scripts/cpu_queue.sh > /tmp/cpu_queue.log 2>&1 &
#   pkill -f scripts/cpu_queue.sh; pkill -f "varbnn.cli reproduce"   # stop it (its workers follow their parent;
#                                                                       every finished run stays in its _runs.jsonl)
#   QUICK=1 bash scripts/cpu_queue.sh                                   # a dry run: the --quick forms, into /tmp
#
# Each entry is resumable: a finished (variant, seed) run is one line of its runs file and is skipped, a run cut off
# resumes from its last epoch checkpoint. The code that runs is a snapshot of HEAD taken at the start (a clone under
# /tmp on PYTHONPATH; the worker processes import it too), so edits made while the queue runs do not reach it; the
# records name that commit. The outputs go into this checkout's benchmarks/results/. Render a page from its saved runs
# with the same command plus --no-train, then commit the runs file and the page together.
#
# Order (issue 26 first, then issue 30): the rest of the 20-epoch uncertainty benchmark on Fashion-MNIST, then the
# LeNet-5 error-FLOPs front (about 4 hours per seed of the posterior). The MNIST 20-epoch benchmark is complete and
# left out (a rerun with nothing to train would rewrite its page). Fashion-MNIST: 18 of its 30 runs came from an H200
# (scripts/gpu_reproduce.sh at 91aedf0); the 12 others run here as two one-process invocations side by side, so that
# no core waits for a seed's slowest run: the three 5-member ensembles (~1.5 h each) into the main folder, and RDP,
# temperature scaling and Laplace, with the plain network they start from trained again here (so that their
# post-hoc steps reuse it, and so that the CPU's times have their own plain reference), into 20-epochs-cpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
snapshot="$(mktemp -d)/varbnn"
git clone -q "$root" "$snapshot"
export PYTHONPATH="$snapshot/src" VARBNN_DATA="${VARBNN_DATA:-$root/../shared/data}"
workers="${WORKERS:-2}"
quick=()
prefix=""
if [ "${QUICK:-0}" = 1 ]; then  # the plumbing only: every entry's --quick form, written under /tmp/cpu_queue_quick/
    quick=(--quick)
    prefix="/tmp/cpu_queue_quick/"
fi
reproduce() {  # reproduce NAME OUT WORKERS [ARGS...]: from this checkout (relative --out), with the snapshot's code
    echo "[cpu_queue] $(date -u +%FT%TZ) $1 -> $prefix$2 ${*:4} (code $(git -C "$snapshot" rev-parse --short HEAD))"
    "$root/.venv/bin/python" -m varbnn.cli reproduce "$1" "${quick[@]}" --workers "$3" --out "$prefix$2" \
        --no-progress "${@:4}"
}
fmnist=benchmarks/results/uncertainty-fmnist
reproduce uncertainty-fmnist "$fmnist/20-epochs" 1 --variants "deep ensemble (5)" &
reproduce uncertainty-fmnist "$fmnist/20-epochs-cpu" 1 \
    --variants "plain,RDP,plain + temperature scaling,last-layer Laplace (KFAC)" &
wait
reproduce lenet5-front benchmarks/results/lenet5-front "$workers"
echo "[cpu_queue] $(date -u +%FT%TZ) done"
