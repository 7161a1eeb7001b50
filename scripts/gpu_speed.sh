#!/usr/bin/env bash
# Issue 29's GPU rows in one device call: training-step time with fit(compile=True)'s rows (MLP, LeNet-5 at batch
# 100, ResNet-18 at batch 128), vectorised prediction time and vMF sampling, on the device's CUDA torch. Each part has
# its own time limit, so one slow part (compilation) cannot lose the others; everything is packed into
# $OUT/gpu_speed.tgz (the device tool returns at most 8 files) beside $OUT/log.txt.
#
#   device tool:  run(command="bash scripts/gpu_speed.sh", timeout_s=570)
#   peers there:  pip download --no-deps bayesian-torch==0.5.0 torchbnn==1.2 into an ignored .whl/ here, carry
#                 ".whl", and set PEERS=1 (they are installed into /tmp/site before the runs)
#   dry run here: DEVICE=cpu STEPS=3 REPEATS=1 bash scripts/gpu_speed.sh   (the plumbing only, not a measurement)
#   some parts:   PARTS="resnet18-compiled host" bash scripts/gpu_speed.sh   (each part's limit: its *_SECONDS variable;
#                 "profile" and "rdp-resnet18" (RDP row compiled on ResNet-18, minutes of compiling) are not in the default
#                 list: PARTS="profile rdp-resnet18" adds them; nor are the CUDA-graph parts, fit(compile=
#                 "reduce-overhead"): lenet5-graphs, rdp-lenet5-graphs, resnet18-graphs; nor fit-loop, nor compile-time (the first
#                 step's compilation, cold and warm cache, for COMPILE_TIME_ONLY's families), nor ktied-gemms (KTied's thin
#                 matrix products three ways)); DEADLINE=SECONDS caps the
#                 whole script (a part gets at most what is left; the archive is repacked after every part)
#
# Then unpack the archive into benchmarks/results/ (step-time/, its studies/, predict-time/, vmf/), record the device on each page
# (resnet18-graphs-N/step_time_resnet18_cuda_reduce_overhead.* become step-time/step_time_resnet18_cuda_reduce_overhead
# .*, _2.* and _3.*: the summary merges a group's tables), and rebuild the side-by-side table:
# PYTHONPATH=src:benchmarks python benchmarks/step_time_summary.py
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_speed_out}"
device="${DEVICE:-cuda}"
steps="${STEPS:-50}"
repeats="${REPEATS:-2}"
work="$(mktemp -d)"
mkdir -p "$out" "$work/step-time/studies" "$work/predict-time" "$work/vmf"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
if [ "${PEERS:-0}" = 1 ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
log="$out/log.txt"
: >"$log"
began=$SECONDS
pack() { tar czf "$out/gpu_speed.tgz" -C "$work" . ; }  # after every part: a call stopped at its limit keeps what ran
part() {  # part SECONDS SCRIPT ARGS...: one benchmark under its own limit; its output (compile warnings dropped) to the log
    local seconds=$1
    shift
    if [ -n "${DEADLINE:-}" ]; then  # DEADLINE: seconds for the whole script; a part gets at most what is left of it
        local left=$(( DEADLINE - (SECONDS - began) - 10 ))
        if [ "$left" -lt 30 ]; then echo "== skipped (deadline): $*" | tee -a "$log"; return; fi
        [ "$left" -lt "$seconds" ] && seconds=$left
    fi
    echo "== $* (limit ${seconds} s)" | tee -a "$log"
    # a compile cache of its own: a part stopped at its limit while inductor writes a kernel leaves a truncated
    # file in the cache, which fails the next run that compiles the same graph ("file too short")
    TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" timeout "$seconds" "$python" "$@" 2>&1 | grep -v '^[WIV][0-9]\{4\} ' | tail -40 | tee -a "$log"
    echo "== exit ${PIPESTATUS[0]} after $(( SECONDS - began )) s" | tee -a "$log"
    pack
}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; \
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } | tee -a "$log"
common=(--device "$device" --mc-samples "" --steps "$steps" --warmup "${WARMUP:-20}" --repeats "$repeats")
# --only splits at commas (row names hold commas): the compiled ResNet-18 rows are "compile" minus the skipped families.
# RDP's compiled steps compile for a minute or more each, and LeNet-5's and ResNet-18's compiled rows for 10-30 s each:
# each in a part of its own (its own table file), so that a part stopped at its limit loses only its rows
rdp=(--skip "RadialDirectional(row), fit" --skip "RadialDirectional(double), fit")
compiled_only=(--compile --only "fit(compile=True),compiled" "${rdp[@]}")
resnet=(--model resnet18 --batch 128 --device "$device" --mc-samples "" --steps "$(( steps < 20 ? steps : 20 ))"
        --warmup "${WARMUP:-5}" --repeats 1)
# The next GPU session (after the H200 one of 2026-11-27, which measured lenet5-graphs and RDP's LeNet-5 graphs and
# ran out of time in resnet18-graphs after 220 s of compiling): PEERS=1 DEADLINE=540 PARTS="ktied-gemms resnet18-graphs
# fit-loop" (ktied-gemms: about 15 s, why a KTied ResNet-18 step took 12-13 ms more than MeanField's on the H100, eager
# and compiled alike; resnet18-graphs runs as three processes since 2026-11-29, each table in a folder of its own,
# resnet18-graphs-N/)
# (ResNet-18's five CUDA-graph compilations need about 400 s), or the LeNet-5 front's training (gpu_reproduce.sh)
# PARTS: which parts run, in this order (default all; the 2026-11-26 H200 session measured mlp, lenet5,
# lenet5-compiled, rdp-mlp, rdp-lenet5, resnet18, predict and vmf at 21b4286, in 15 minutes of device time)
parts="${PARTS:-resnet18-compiled resnet18 host mlp lenet5 lenet5-compiled rdp-mlp rdp-lenet5 predict vmf}"
for name in $parts; do
    case "$name" in
        mlp) part "${MLP_SECONDS:-150}" benchmarks/step_time.py --model mlp "${common[@]}" --compile "${rdp[@]}" \
                 --out "$work/step-time" ;;
        lenet5) part "${LENET_SECONDS:-60}" benchmarks/step_time.py --model lenet5 "${common[@]}" --out "$work/step-time" ;;
        lenet5-compiled) part "${LENET_COMPILED_SECONDS:-130}" benchmarks/step_time.py --model lenet5 "${common[@]}" \
                 "${compiled_only[@]}" --out "$work/step-time/lenet5-compiled" ;;
        rdp-mlp|rdp-lenet5) part "${RDP_SECONDS:-120}" benchmarks/step_time.py --model "${name#rdp-}" "${common[@]}" \
                 --compile --only "RadialDirectional,floor" --skip "deterministic, compiled" \
                 --out "$work/step-time/rdp-compiled" ;;
        resnet18) part "${RESNET_SECONDS:-90}" benchmarks/step_time.py "${resnet[@]}" \
                 --only "MeanField-reparam,MeanField-local,Radial-reparam (MC,KTied(rank=2)-reparam,RadialDirectional,torchbnn,bayesian-torch Rep,floor" \
                 --out "$work/step-time" ;;
        rdp-resnet18) part "${RDP_RESNET_SECONDS:-300}" benchmarks/step_time.py "${resnet[@]}" --compile \
                 --only compile --skip "deterministic, compiled" --skip MeanField --skip KTied --skip Delta \
                 --skip Radial- --skip "(double)" --out "$work/step-time/resnet18-rdp-compiled" ;;
        resnet18-compiled) part "${RESNET_COMPILED_SECONDS:-200}" benchmarks/step_time.py "${resnet[@]}" --compile \
                 --only compile --skip Delta --skip=-local --skip=-flipout --skip RadialDirectional \
                 --out "$work/step-time/resnet18-compiled" ;;
        lenet5-graphs)  # fit(compile="reduce-overhead"): CUDA graphs, beside the peers and the floors in the same process
            part "${LENET_GRAPHS_SECONDS:-170}" benchmarks/step_time.py --model lenet5 "${common[@]}" --compile \
                 --compile-mode reduce-overhead --only "compile,floor,torchbnn,bayesian-torch" --skip RadialDirectional \
                 --skip Delta --skip=-flipout --skip "KTied(rank=2)-local" --out "$work/step-time" ;;
        rdp-lenet5-graphs) part "${RDP_GRAPHS_SECONDS:-150}" benchmarks/step_time.py --model lenet5 "${common[@]}" \
                 --compile --compile-mode reduce-overhead --only RadialDirectional --skip "deterministic, compiled" \
                 --out "$work/step-time/lenet5-rdp-graphs" ;;
        resnet18-graphs)  # three processes (each with its own eager deterministic step and table, in its own folder), so
            # that one stopped at its limit while compiling loses only its rows: 1. the deterministic network recorded the
            # same way, MeanField reparam and the peers; 2. MeanField local and Radial; 3. KTied reparam
            graphs=(--compile --compile-mode reduce-overhead)
            part "${RESNET_GRAPHS_SECONDS:-200}" benchmarks/step_time.py "${resnet[@]}" "${graphs[@]}" \
                 --only "compile,torchbnn,bayesian-torch Rep" --skip Delta --skip RadialDirectional --skip KTied \
                 --skip=-local --skip=-flipout --skip Radial- --out "$work/step-time/resnet18-graphs-1"
            part "${RESNET_GRAPHS_SECONDS:-200}" benchmarks/step_time.py "${resnet[@]}" "${graphs[@]}" \
                 --only "fit(compile" --skip Delta --skip RadialDirectional --skip KTied --skip MeanField-reparam \
                 --skip MeanField-flipout --out "$work/step-time/resnet18-graphs-2"
            part "${RESNET_GRAPHS_SECONDS:-200}" benchmarks/step_time.py "${resnet[@]}" "${graphs[@]}" \
                 --only "fit(compile" --skip Delta --skip RadialDirectional --skip MeanField --skip Radial- \
                 --skip "KTied(rank=2)-local" --out "$work/step-time/resnet18-graphs-3" ;;
        fit-loop)  # fit's whole loop against its bare step, with and without the deferred NaN checks (CUDA graphs)
            part "${FIT_LOOP_SECONDS:-180}" benchmarks/fit_loop.py --device "$device" --compile --out "$work/step-time/studies" ;;
        compile-time)  # what fit(compile=True) costs before it pays on the GPU: cold / warm-cache first steps (CUDA graphs)
            part "${COMPILE_TIME_SECONDS:-240}" benchmarks/compile_time.py --model mlp --device "$device" \
                 --compile-mode reduce-overhead --only "${COMPILE_TIME_ONLY:-deterministic,MeanField-reparam,RadialDirectional(row)}" \
                 --out "$work/step-time" ;;
        ktied-gemms)  # KTied's thin matrix products per ResNet-18 step, as KTied computes them and two other ways
            part "${KTIED_GEMMS_SECONDS:-60}" benchmarks/ktied_gemms.py --device "$device" --out "$work/step-time/studies" ;;
        host) part "${HOST_SECONDS:-60}" benchmarks/step_time.py --model host "${common[@]}" --skip graves \
                 --skip RadialDirectional --out "$work/step-time" ;;
        predict) part "${PREDICT_SECONDS:-75}" benchmarks/predict_time.py --device "$device" --repeats "$repeats" \
                 --out "$work/predict-time" ;;
        vmf) part "${VMF_SECONDS:-60}" benchmarks/vmf.py --device "$device" --no-scipy-above 1000 --out "$work/vmf" ;;  # full n: a quick call is bound by its fixed cost
        profile)  # kernel launches, host syncs and the costliest operators per step, for the rows that miss issue 29's targets
            mkdir -p "$work/profiles"
            for spec in "lenet5|MeanField-reparam" "lenet5|KTied(rank=2)-reparam" "lenet5|RadialDirectional(row)" \
                        "resnet18|MeanField-reparam" "resnet18|KTied(rank=2)-reparam"; do
                part "${PROFILE_SECONDS:-40}" benchmarks/profile_step.py --model "${spec%%|*}" --device "$device" \
                    --candidate "${spec#*|}" --out "$work/profiles"
            done ;;
        *) echo "unknown part $name (lenet5-graphs rdp-lenet5-graphs resnet18-graphs fit-loop compile-time ktied-gemms mlp lenet5 lenet5-compiled rdp-mlp rdp-lenet5 rdp-resnet18 resnet18 resnet18-compiled host predict vmf profile)" | tee -a "$log" ;;
    esac
done
pack
echo "packed: $(tar tzf "$out/gpu_speed.tgz" | grep -c '\.json$') result files and $(tar tzf "$out/gpu_speed.tgz" | grep -c '\.txt$') profiles into $out/gpu_speed.tgz" | tee -a "$log"
