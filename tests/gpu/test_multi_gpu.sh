#!/usr/bin/env bash
# test_multi_gpu.sh — several ranks on GPUs through plait train (make test-gpu,
# after the nccl backend's own tests): 2 GPU ranks at tp 2, dp 2 (with the
# gradient buckets overlapping backward, ZeRO 1, and ZeRO 3 in fp32 and bf16:
# its units gathered over NCCL, bf16's layers in bf16) and pp 2 against 1 GPU
# rank of the same global batch, every step's loss and gradient norm within the
# bounds the CPU layouts keep (tests/integration/test_parallel.sh: fp32 1e-5,
# bf16 1e-4); a 2-GPU run equal to itself to the bit; parallel.backend
# "socket" on 2 GPUs (every collective staged through host memory) against nccl's
# run within 1e-5. Context parallelism (cp 2: the ring's
# block attention, kernels/cuda/attention_block.cu) and expert parallelism (ep 2 over
# dp 2, the MoE GPT-2 of tests/integration/moe_lib.sh: moe.cu's routing, the rows'
# all-to-all over NCCL) against the same layout on CPU ranks: every step's loss and gradient norm within
# 1e-4, the GPU-against-CPU bound of tests/gpu/test_cuda.sh (and ep's experts' loads equal).
# The gpu1x2_ checks need ONE GPU: two ranks share it (PLAIT_RANKS_PER_GPU=2, each its own
# process and CUDA context) over parallel.backend "socket": tp 2, dp 2 with ZeRO 1 and 3,
# pp 2 (1F1B) against one GPU rank of the same global batch within 1e-5, cp 2 and the MoE
# GPT-2 at ep 2 against CPU ranks within 1e-4. A check without the GPUs it needs prints
# "ok NAME # SKIP why" (counted as skipped); with none run the script exits 77, or 0 with
# --skip-ok. Usage: test_multi_gpu.sh [--skip-ok] [CHECK...] (only the checks named). Run
# from the repository root; PLAIT_BUILD (default ./build) holds the binaries.
source "$(dirname "$0")/../integration/lib.sh" # defines: PLAIT, PY, WORK, check, tiny_plan
source "$(dirname "$0")/../integration/moe_lib.sh" # defines: MOE (the MoE GPT-2), loads_equal
source "$(dirname "$0")/../../scripts/selftest_why.sh" # defines: selftest_why
# every rank's scratch as common/gpt2/gpt2_scratch.c counts it for its shard (tp, sequence
# parallelism, cp, ep): more asked of a slot than reserved is the op's error, naming it
export PLAIT_DEBUG_SCRATCH_STRICT=1

CHECKS=(gpu2_tp2_matches_one_gpu gpu2_dp2_buckets_matches_one_gpu gpu2_dp2_zero1_matches_one_gpu
    gpu2_dp2_zero3_matches_one_gpu gpu2_pp2_matches_one_gpu gpu2_bf16_tp2_tracks_bf16_one_gpu gpu2_run_equals_gpu2_run
    gpu2_socket_backend_tracks_nccl gpu2_cp2_tracks_the_cpu
    gpu2_ep2_moe_tracks_the_cpu)
SHARED_CHECKS=(gpu1x2_tp2_matches_one_gpu gpu1x2_dp2_zero1_matches_one_gpu
    gpu1x2_dp2_zero3_matches_one_gpu gpu1x2_pp2_matches_one_gpu gpu1x2_cp2_tracks_the_cpu
    gpu1x2_ep2_moe_tracks_the_cpu gpu1x4_dualpipev_ep2_lanes_track_the_cpu)
SKIP_OK=0
[ "${1:-}" = --skip-ok ] && SKIP_OK=1 && shift
ONLY=("$@")
wanted() { # NAME: asked for (every check when none was named)
    [ ${#ONLY[@]} -eq 0 ] && return 0
    local c
    for c in "${ONLY[@]}"; do [ "$c" = "$1" ] && return 0; done
    return 1
}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
gpus=${gpus:-0}
# GPUs that nvidia-smi lists but the CUDA backend cannot use (a library that did not load, a
# driver too old): a failure of every check that would run, not a skip (as test_cuda.sh)
unusable=
if [ "$gpus" -gt 0 ]; then
    rc=0
    PLAIT_SELFTEST_SHAPES=small "$BUILD/bin/plait-train" --selftest >"$WORK/selftest.txt" 2>&1 || rc=$?
    [ "$rc" -eq 77 ] && unusable=$(selftest_why "$WORK/selftest.txt")
fi
ran=0
# gate NEED NAME FN: the check when this machine has NEED GPUs, else its SKIP line
gate() {
    local need=$1 name=$2
    shift 2
    wanted "$name" || return 0
    if [ "$gpus" -lt "$need" ]; then
        echo "ok $name # SKIP $gpus GPU(s) here (nvidia-smi -L); this needs $need"
        return 0
    fi
    ran=$((ran + 1))
    if [ -n "$unusable" ]; then
        echo "not ok $name"
        echo "    # nvidia-smi lists $gpus GPU(s), but plait-train --selftest found none usable: $unusable"
        failures=$((failures + 1))
        return 0
    fi
    check "$name" "$@"
}
tiny_plan "$WORK/plan.json"
GPU=(--set parallel.device=cuda --set data.val=null --set data.val_every=0)

# close A B TOL: every step's loss and gradient norm within TOL (relative)
close() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p) if '"step"' in l]
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
assert all(x["tokens"] == y["tokens"] for x, y in zip(a, b)), "a different global batch"
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
print(f"{len(a)} steps, worst relative difference {worst:.3g} (tolerance {tol})")
sys.exit(0 if worst <= tol else 1)
PYEOF
}

# run NAME [--set ...]: plait train on GPUs; its log must say every rank trains on CUDA
run() {
    local name=$1
    shift
    [ -f "$WORK/$name/metrics.jsonl" ] && return 0
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${GPU[@]}" "$@" >"$WORK/$name.log" 2>&1 ||
        { tail -n 30 "$WORK/$name.log"; return 1; }
    grep -q "training on CUDA device" "$WORK/$name.log" || { echo "not on GPUs:"; cat "$WORK/$name.log"; return 1; }
}

# against NAME REF TOL [--set ...]
against() {
    local name=$1 reference=$2 tol=$3
    shift 3
    run "$name" "$@" && close "$WORK/$name/metrics.jsonl" "$WORK/$reference/metrics.jsonl" "$tol"
}

tp2() { run one3 --set batch.grad_accum=3 && against tp2 one3 1e-5 --set parallel.tp=2; }
dp2_buckets() {
    run one4 --set batch.grad_accum=4 &&
        against dp2 one4 1e-5 --set parallel.dp=2 --set batch.grad_accum=2 --set parallel.bucket_mb=0.01
}
# dp2_zero HOW NAME Z: dp 2 at ZeRO Z against one GPU rank of 4 micro-batches (HOW: against,
# or shared for two ranks on one GPU)
dp2_zero() {
    run one4 --set batch.grad_accum=4 &&
        "$1" "$2" one4 1e-5 --set parallel.dp=2 --set batch.grad_accum=2 --set parallel.zero="$3"
}
dp2_zero1() { dp2_zero against dp2_zero1 1; }
dp2_zero3() {
    dp2_zero against dp2_zero3 3 &&
        run one4_bf16 --set batch.grad_accum=4 --set precision=bf16 &&
        against dp2_zero3_bf16 one4_bf16 1e-4 --set parallel.dp=2 --set batch.grad_accum=2 \
            --set parallel.zero=3 --set precision=bf16
}
pp2() {
    run one_l4 --set model.layers=4 --set batch.grad_accum=4 &&
        against pp2 one_l4 1e-5 --set model.layers=4 --set batch.grad_accum=4 --set parallel.pp=2
}
bf16_tp2() {
    run one3_bf16 --set batch.grad_accum=3 --set precision=bf16 &&
        against tp2_bf16 one3_bf16 1e-4 --set parallel.tp=2 --set precision=bf16
}
again() {
    run tp2 --set parallel.tp=2 && run tp2_again --set parallel.tp=2 &&
        metrics_equal "$WORK/tp2/metrics.jsonl" "$WORK/tp2_again/metrics.jsonl"
}
# socket on 2 GPUs: the same steps as nccl's, every collective staged through host memory
socket_tracks_nccl() {
    run tp2 --set parallel.tp=2 &&
        against tp2_socket tp2 1e-5 --set parallel.tp=2 --set parallel.backend=socket &&
        grep -q 'stages every collective through host memory\|staged through host memory' "$WORK/tp2_socket.log" ||
        { cat "$WORK/tp2_socket.log"; return 1; }
}

# against_cpu NAME [--set ...]: the layout on GPUs and on CPU ranks, within 1e-4
against_cpu() {
    local name=$1
    shift
    run "$name" "$@" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/${name}_cpu" --set parallel.device=cpu \
        --set data.val=null --set data.val_every=0 "$@" >"$WORK/${name}_cpu.log" 2>&1 ||
        { tail -n 30 "$WORK/${name}_cpu.log"; return 1; }
    close "$WORK/$name/metrics.jsonl" "$WORK/${name}_cpu/metrics.jsonl" 1e-4
}
cp2() { against_cpu cp2 --set parallel.cp=2; }
ep2() {
    against_cpu ep2 "${MOE[@]}" --set parallel.dp=2 --set parallel.ep=2 &&
        loads_equal "$WORK/ep2/metrics.jsonl" "$WORK/ep2_cpu/metrics.jsonl" 1e-4
}

# ---- two ranks sharing ONE GPU (PLAIT_RANKS_PER_GPU=2, parallel.backend "socket") ---------
SHARE=(--set parallel.backend=socket)
# shared NAME REF TOL [--set ...]: the layout with its 2 ranks on GPU 0, against REF (a run
# on one GPU rank); its log must place both ranks there and say the collectives are staged
shared() {
    local name=$1
    PLAIT_RANKS_PER_GPU=2 against "$@" "${SHARE[@]}" || return 1
    [ "$(grep -c 'training on CUDA device 0' "$WORK/$name.log")" -ge 1 ] &&
        grep -q 'through host memory' "$WORK/$name.log" || { cat "$WORK/$name.log"; return 1; }
}
# shared_cpu NAME [--set ...]: the layout on one shared GPU against CPU ranks, within 1e-4
shared_cpu() {
    local name=$1
    shift
    PLAIT_RANKS_PER_GPU=2 against_cpu "$name" "$@" "${SHARE[@]}"
}
shared_tp2() { run one3 --set batch.grad_accum=3 && shared s_tp2 one3 1e-5 --set parallel.tp=2; }
shared_zero1() { dp2_zero shared s_dp2_zero1 1; }
shared_zero3() { dp2_zero shared s_dp2_zero3 3; }
shared_pp2() {
    run one_l4 --set model.layers=4 --set batch.grad_accum=4 &&
        shared s_pp2 one_l4 1e-5 --set model.layers=4 --set batch.grad_accum=4 --set parallel.pp=2 \
            --set parallel.schedule=1f1b
}
shared_cp2() { shared_cpu s_cp2 --set parallel.cp=2; }
shared_ep2() {
    shared_cpu s_ep2 "${MOE[@]}" --set parallel.dp=2 --set parallel.ep=2 &&
        loads_equal "$WORK/s_ep2/metrics.jsonl" "$WORK/s_ep2_cpu/metrics.jsonl" 1e-4
}
# DualPipeV with experts at pp 2 × dp 2, ep 2: four ranks on one GPU, each pair's two lanes
# taking turns on the rank's stream (the second lane's thread bound to the device), against
# CPU ranks, with the lanes switching
shared_dualpipev() {
    local name=s4_dualpipev
    PLAIT_RANKS_PER_GPU=4 against_cpu $name "${MOE[@]}" "${SHARE[@]}" --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=dualpipev \
        --set batch.grad_accum=4 || return 1
    grep -q "DualPipeV with experts: each pair's forward and backward run as two lanes" \
        "$WORK/$name.log" || { cat "$WORK/$name.log"; return 1; }
    loads_equal "$WORK/$name/metrics.jsonl" "$WORK/${name}_cpu/metrics.jsonl" 1e-4
}

gate 2 gpu2_tp2_matches_one_gpu tp2
gate 2 gpu2_dp2_buckets_matches_one_gpu dp2_buckets
gate 2 gpu2_dp2_zero1_matches_one_gpu dp2_zero1
gate 2 gpu2_dp2_zero3_matches_one_gpu dp2_zero3
gate 2 gpu2_pp2_matches_one_gpu pp2
gate 2 gpu2_bf16_tp2_tracks_bf16_one_gpu bf16_tp2
gate 2 gpu2_run_equals_gpu2_run again
gate 2 gpu2_socket_backend_tracks_nccl socket_tracks_nccl
gate 2 gpu2_cp2_tracks_the_cpu cp2
gate 2 gpu2_ep2_moe_tracks_the_cpu ep2
gate 1 gpu1x2_tp2_matches_one_gpu shared_tp2
gate 1 gpu1x2_dp2_zero1_matches_one_gpu shared_zero1
gate 1 gpu1x2_dp2_zero3_matches_one_gpu shared_zero3
gate 1 gpu1x2_pp2_matches_one_gpu shared_pp2
gate 1 gpu1x2_cp2_tracks_the_cpu shared_cp2
gate 1 gpu1x2_ep2_moe_tracks_the_cpu shared_ep2
gate 1 gpu1x4_dualpipev_ep2_lanes_track_the_cpu shared_dualpipev
if [ "$ran" -eq 0 ]; then
    [ "$SKIP_OK" = 1 ] && exit 0
    exit 77
fi
finish
