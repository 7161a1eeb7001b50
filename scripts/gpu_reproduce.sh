#!/usr/bin/env bash
# A generic-runner experiment's runs as parallel processes on one GPU, in one device call (issue 26: the 20-epoch
# uncertainty benchmark, whose 30 LeNet-5 runs take about 6 hours on the project's 2-core CPU machine).
#
#   device tool:  run(command="NAME=uncertainty-fmnist LIMIT=520 bash scripts/gpu_reproduce.sh", carry=[".data"],
#                     timeout_s=590)
#   data there:   the datasets the experiment reads, copied into an ignored .data/ here (cp -r ../shared/data/mnist
#                 ../shared/data/fashion-mnist .data/) and carried; VARBNN_DATA points at it
#   dry run here: DEVICE=cpu NAME=uncertainty-fmnist QUICK=1 PYTHON=.venv/bin/python VARBNN_DATA=../shared/data \
#                     bash scripts/gpu_reproduce.sh
#
# GROUPS lists the processes: each entry "N|label,label,..." starts N processes, process k running the runs of those
# variants in shard k/N ("N|" with no labels: every variant, for experiments whose labels hold commas, which
# --variants would split; e.g. GROUPS_SPEC="5|" for lenet5-radius-prior's five runs, one per process) (`varbnn reproduce --shard`: every N-th of the experiment's (variant, seed) runs from the k-th;
# with 3 seeds and N = 3, process k runs seed k). Each process writes into a folder of its own under WORK, so that no
# two processes append to one runs file, and the post-hoc baselines (temperature scaling, Laplace) find their seed's
# plain checkpoint. After LIMIT seconds every process still running is stopped (a run cut off resumes from its last epoch
# checkpoint when the same command runs again on the same warm machine: WORK is kept). Then the finished runs' records
# are merged into one runs file with the first seed's figure data and the page is rendered there (--no-train): $OUT
# holds NAME_runs.jsonl, the page (NAME.md, NAME.json, its figures) and log.txt, and $OUT/logs.tgz the processes' logs.
#
# Issue 30's LeNet-5 front is complete: seeds 0-2 trained and pruned on the CPU (2026-11-28); the last seed's GPU
# command (ONLY_SHARDS='2', CHECKPOINTS=1, then scripts/restore_checkpoints.sh and the CPU queue to prune) is in this
# file's history (commit 3146bb7).
#
# The runs share the GPU with each other, so their train_seconds are not speed measurements. COMPILE=1 trains with
# fit(compile=True) (--compile): RDP's LeNet-5 step is 6.7x (row) / 8.6x (double) faster compiled on an H200
# (benchmarks/results/step-time/step_time_lenet5_rdp_compiled_cuda.md).
set -uo pipefail
cd "$(dirname "$0")/.."
name="${NAME:?NAME: the experiment, e.g. uncertainty-fmnist}"
out="${OUT:-/tmp/gpu_reproduce_out}"
work="${WORK:-/tmp/gpu_reproduce}"
python="${PYTHON:-python3}"
device="${DEVICE:-cuda}"
seconds="${LIMIT:-520}"
default_groups="3|plain,plain + temperature scaling,MC dropout (p = 0.1),deep ensemble (5),last-layer Laplace (KFAC)
3|MeanField,Radial
3|KTied,Delta (MAP)
3|RDP
3|plain + early stopping,plain + early stopping + temperature scaling,MeanField + early stopping + temperature scaling
3|KTied + early stopping + temperature scaling,IVON + early stopping + temperature scaling
3|mixture of 5 IVON posteriors"  # the last three: issue 63's recipe, IVON and a mixture of IVON posteriors
groups="${GROUPS_SPEC:-$default_groups}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${THREADS:-1}"  # 12 processes on the device's 16 cores: one thread each for their CPU work
export VARBNN_DATA="${VARBNN_DATA:-$PWD/.data}"
export VARBNN_COMMIT="${VARBNN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
compiled=()  # COMPILE=1: train with fit(compile=True) (--compile; several-fold faster RDP steps on a GPU); COMPILE=MODE:
            # that torch.compile mode (COMPILE=reduce-overhead: CUDA graphs, RDP's LeNet-5 step another 2x faster)
case "${COMPILE:-0}" in 0) ;; 1) compiled=(--compile) ;; *) compiled=(--compile "$COMPILE") ;; esac
mkdir -p "$out" "$work"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; \
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; \
  echo "code $VARBNN_COMMIT, data $VARBNN_DATA, limit $seconds s"; } | tee "$out/log.txt"
pids=()
index=0
while IFS= read -r group; do
    [ -z "$group" ] && continue
    n="${group%%|*}"
    labels="${group#*|}"
    for (( k = 0; k < n; k++ )); do
        # ONLY_SHARDS="1 2": start only these shards of each group (e.g. the seeds a CPU run has not done)
        if [ -n "${ONLY_SHARDS:-}" ] && [[ " $ONLY_SHARDS " != *" $k "* ]]; then continue; fi
        folder="$work/g${index}-s${k}"
        mkdir -p "$folder"
        echo "[gpu_reproduce] $folder: shard $k/$n of: ${labels:-every variant}" | tee -a "$out/log.txt"
        only=()
        [ -n "$labels" ] && only=(--variants "$labels")
        "$python" -m varbnn.cli reproduce "$name" "${quick[@]}" "${compiled[@]}" --device "$device" "${only[@]}" \
            --shard "$k/$n" --out "$folder" --no-progress >>"$folder/log.txt" 2>&1 &
        pids+=("$!")
    done
    index=$(( index + 1 ))
done <<<"$groups"
start=$(date +%s)
while (( $(date +%s) - start < seconds )); do
    running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=$(( running + 1 )); done
    (( running == 0 )) && break
    sleep 5
done
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
wait
merged="$work/merged"
rm -rf "$merged" && mkdir -p "$merged"
cat "$work"/g*/"${name}"_runs.shard*.jsonl >"$merged/${name}_runs.jsonl" 2>/dev/null
for figures in "$work"/g*/.checkpoints/*/*.figures; do
    [ -e "$figures" ] || continue
    mkdir -p "$merged/.checkpoints/$(basename "$(dirname "$figures")")"
    cp "$figures" "$merged/.checkpoints/$(basename "$(dirname "$figures")")/"
done
echo "[gpu_reproduce] $(( $(date +%s) - start )) s; finished runs: $(wc -l <"$merged/${name}_runs.jsonl")" | tee -a "$out/log.txt"
"$python" -c "
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        print(' ', r['variant'], 'seed', r['seed'], r['device'])
" "$merged/${name}_runs.jsonl" | tee -a "$out/log.txt"
for folder in "$work"/g*/; do tail -2 "$folder/log.txt" | sed "s|^|$(basename "$folder"): |"; done | tee -a "$out/log.txt"
"$python" -m varbnn.cli reproduce "$name" "${quick[@]}" --device "$device" --no-train --out "$merged" --no-progress \
    2>&1 | tail -5 | tee -a "$out/log.txt"
if [ "${CHECKPOINTS:-0}" = 1 ]; then
    # the runs' epoch checkpoints instead of the page (the device tool returns at most 8 files, 16 MB each), one file
    # each, named ckpt__<protocol folder>__<file>: `bash scripts/restore_checkpoints.sh FILES_AT OUT` puts them under
    # OUT/.checkpoints/, where `varbnn reproduce NAME --out OUT` resumes them (on any device)
    cp "$merged/${name}_runs.jsonl" "$out/" 2>/dev/null
    for checkpoint in "$work"/g*/.checkpoints/*/*.pt; do
        [ -e "$checkpoint" ] || continue
        cp "$checkpoint" "$out/ckpt__$(basename "$(dirname "$checkpoint")")__$(basename "$checkpoint")"
    done
    ls -l "$out"/ckpt__* 2>/dev/null | tee -a "$out/log.txt"
else
    cp "$merged"/*.md "$merged"/*.json "$merged"/*.jsonl "$merged"/*.png "$out/" 2>/dev/null
fi
tar -czf "$out/logs.tgz" -C "$work" --exclude=merged --exclude=.checkpoints .
