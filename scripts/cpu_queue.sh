#!/usr/bin/env bash
# The long CPU reproductions that are still open, resumed in a fixed order, in the background of a working session:
#
#   nohup bash scripts/cpu_queue.sh > /tmp/cpu_queue.log 2>&1 &
#   pkill -f scripts/cpu_queue.sh; pkill -f "varbnn.cli reproduce"   # stop it (its workers follow their parent;
#                                                                       every finished run stays in its _runs.jsonl)
#   QUICK=1 bash scripts/cpu_queue.sh                                   # a dry run: the --quick forms, into /tmp
#   p=$(pgrep -f "varbnn.cli reproduce"); q="$p $(for i in $p; do pgrep -P $i; done)"
#   kill -STOP $q; ...; kill -CONT $q                                    # pause for a timing or the test suite: the
#                                                                       workers are spawned children whose command
#                                                                       line does not name the reproduce command
#
# Each entry is resumable: a finished (variant, seed) run is one line of its runs file and is skipped, a run cut off
# resumes from its last epoch checkpoint. The code that runs is a snapshot of HEAD taken at the start (a clone under
# /tmp on PYTHONPATH; the worker processes import it too), so edits made while the queue runs do not reach it; the
# records name that commit. The outputs go into this checkout's benchmarks/results/. Render a page from its saved runs
# with the same command plus --no-train, then commit the runs file and the page together.
#
# One seed of the LeNet-5 error-FLOPs front (issue 30) at a time, in this process with 2 threads (about 26 s an epoch
#   with --compile: 200 epochs in about 90 minutes), its five front points then in the two worker processes (about an
#   hour): one seed fits in a session, where two seeds side by side (one thread each, about 4 CPU-thread hours a
#   seed) did not. Seed 0 trained in a lane of its own before, eager; seeds 1 and 2 this way (2026-11-28): the
#   front's three seeds are complete, so the default entry has nothing left to train (SEED picks the seed, default
#   2). The 200-epoch training runs as fit(compile=True) (on the CPU the compiled step draws the eager step's random
#   numbers; it resumes an eager checkpoint), the pruning stays eager.
# The UCI learned-noise table (issues 26 and 30) is complete (1,155 runs, the last at 6f8ddc7) and out of the queue.
# At code 0340ef4 the two ran side by side in single-process lanes. The radius-prior search that could have
# added a prior to the front is complete and out of the queue (a rerun with nothing to train would rewrite its page).
# A reproduce process still running from an earlier queue (e.g. one whose script was stopped) is waited for first, so
# that no two processes write one results folder. The uncertainty benchmarks at 20 epochs are complete and left out
# (a rerun with nothing to train would rewrite their pages from this checkout's figure data).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
snapshot="$(mktemp -d)/varbnn"
git clone -q "$root" "$snapshot"
export PYTHONPATH="$snapshot/src" VARBNN_DATA="${VARBNN_DATA:-$root/../shared/data}"
quick=()
prefix=""
seed=(--shard "${SEED:-2}/3")
if [ "${QUICK:-0}" = 1 ]; then  # the plumbing only: every entry's --quick form, written under /tmp/cpu_queue_quick/
    quick=(--quick)
    prefix="/tmp/cpu_queue_quick/"
    seed=()  # the quick form has one seed
fi
reproduce() {  # reproduce NAME OUT WORKERS [ARGS...]: from this checkout (relative --out), with the snapshot's code
    echo "[cpu_queue] $(date -u +%FT%TZ) $1 -> $prefix$2 ${*:4} (code $(git -C "$snapshot" rev-parse --short HEAD))"
    "$root/.venv/bin/python" -m varbnn.cli reproduce "$1" "${quick[@]}" --workers "$3" --out "$prefix$2" \
        --no-progress "${@:4}"
}
while [ -z "$prefix" ] && pgrep -f "varbnn.cli reproduce" > /dev/null; do  # an earlier queue's process: let it finish first
    echo "[cpu_queue] $(date -u +%FT%TZ) waiting for a running reproduce process"; sleep 120
done
reproduce lenet5-front benchmarks/results/lenet5-front 2 "${seed[@]}" --threads 2 --compile
echo "[cpu_queue] $(date -u +%FT%TZ) done"
