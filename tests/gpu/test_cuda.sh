#!/usr/bin/env bash
# test_cuda.sh — the CUDA backend on this machine's GPU (make test-cuda): each
# op against its CPU twin (plait-train --selftest); the PyTorch referees on the
# GPU, GPT-2's and the Llama's (a grouped-query Llama: RMSNorm, rotary
# positions, SwiGLU; fp32 within 1e-4, bf16 within the CPU bf16 tests'
# bounds); a GPU run
# equals a GPU run to the bit; SIGTERM mid-step and resume to the bit on the
# GPU; a GPU checkpoint resumed on the CPU continues with matching losses;
# compute-sanitizer memcheck and racecheck on a short run (when installed);
# fp8 (GPUs of sm_89 and later): a GPU run tracks the CPU's emulation with
# tensor and block scaling, the tensor one on fp8 tensor cores throughout, and
# a GPU fp8 run stopped mid-step resumes to the bit (its fp8 weight copy
# rebuilt from the master weights). A small grouped-query Llama with random
# weights (no PyTorch needed) trained on the GPU tracks the CPU's losses within
# 1e-4 and equals itself to the bit; the sanitizers run it after GPT-2, then the
# MoE GPT-2 and the selftest's small shapes. The MoE
# GPT-2 of tests/integration/moe_lib.sh (E 4, k 2, a shared expert, capacity 1.25
# that drops, a z-loss) trained on the GPU, its routing on kernels/cuda/moe.cu, tracks the CPU's losses
# within 1e-4 with the same experts' loads and drops, and equals itself to the bit.
# parallel.offload "host" and "nvme" (the step on the CPU) give the bits without offload,
# with the memory plait check predicts, the gradient's layers brought down during backward
# (ops download_after on a copy stream), and resume mid-step to the bit.
# Without a usable GPU every check prints "ok NAME # SKIP why" (counted as
# skipped by tests/run.sh) and the script exits 77, or 0 with --skip-ok (how
# tests/integration/test_cuda_build.sh runs it inside make test).
# Usage: tests/gpu/test_cuda.sh [--skip-ok] [CHECK...]: only the checks named
# (all by default; scripts/gpu_check.sh runs them in groups, each group under
# its own time limit).
# Run from the repository root; PLAIT_BUILD (default ./build) holds the binaries.
source "$(dirname "$0")/../integration/lib.sh" # defines: PLAIT, PY, ROOT, WORK, check, tiny_plan, offload_overlapped
source "$(dirname "$0")/../integration/moe_lib.sh" # defines: COMMON (the MoE GPT-2), loads_equal
source "$(dirname "$0")/../../scripts/selftest_why.sh" # defines: selftest_why

TRAIN=$BUILD/bin/plait-train
REF=$ROOT/tests/golden/gpt2_ref.py
LLAMA_REF=$ROOT/tests/golden/llama_ref.py
CUDA_SET=(--set parallel.device=cuda)
# every run here a check of common/gpt2/gpt2_scratch.c: a scratch slot an op asks more of
# than the model reserved by it is the op's error, naming the slot and its bytes
export PLAIT_DEBUG_SCRATCH_STRICT=1
CHECKS=(cuda_selftest cuda_torch_referee_fp32 cuda_torch_referee_bf16
    cuda_llama_torch_referee_fp32 cuda_llama_torch_referee_bf16
    cuda_bf16_attention_tracks_fp32_attention cuda_run_equals_cuda_run
    cuda_sigterm_mid_step_resumes_to_the_bit cuda_checkpoint_resumes_on_the_cpu
    cuda_compute_sanitizer_memcheck cuda_compute_sanitizer_racecheck cuda_fp8_tracks_the_cpu
    cuda_fp8_resumes_to_the_bit cuda_llama_tracks_the_cpu cuda_llama_run_equals_cuda_run
    cuda_moe_tracks_the_cpu cuda_moe_run_equals_cuda_run cuda_offload_equals_cuda_run
    cuda_offload_resumes_to_the_bit)

SKIP_OK=0
[ "${1:-}" = --skip-ok ] && SKIP_OK=1 && shift
ONLY=("$@")
for c in "${ONLY[@]}"; do
    [[ " ${CHECKS[*]} " == *" $c "* ]] || { echo "test_cuda.sh: no check $c (the checks: ${CHECKS[*]})" >&2; exit 2; }
done

wanted() { # NAME: asked for (every check when none was named)
    [ ${#ONLY[@]} -eq 0 ] || [[ " ${ONLY[*]} " == *" $1 "* ]]
}

skip_all() { # why
    local c
    for c in "${CHECKS[@]}"; do wanted "$c" && echo "ok $c # SKIP $1"; done
}

# Is there a GPU? The self-test says (77: skipped, with the reason). Asked only
# whether (its check not named), it runs at the small shapes alone.
rc=0
shapes=small
wanted cuda_selftest && shapes=all
PLAIT_SELFTEST_SHAPES=$shapes "$TRAIN" --selftest >"$WORK/selftest.txt" 2>&1 || rc=$?
# A GPU that nvidia-smi lists but the backend cannot use (a library that did not
# load, a driver too old) is a failure, not a skip.
if [ "$rc" -eq 77 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "not ok ${ONLY[0]:-cuda_selftest}"
    echo "    # nvidia-smi lists a GPU, but plait-train --selftest found none usable:"
    sed 's/^/    # /' "$WORK/selftest.txt"
    exit 1
fi
if [ "$rc" -eq 77 ]; then
    skip_all "$(selftest_why "$WORK/selftest.txt")"
    [ "$SKIP_OK" = 1 ] && exit 0
    exit 77
fi

selftest() {
    cat "$WORK/selftest.txt"
    [ "$rc" -eq 0 ]
}

# referee REFEREE PRECISION: the referee's case trained on the GPU and compared
referee() {
    "$PY" -c "import torch" 2>/dev/null || {
        echo "python3-torch is not installed (scripts/deps.sh test installs it)"
        return 1
    }
    local ref=$1 name
    name=$(basename "$1" .py)_$2
    shift
    local case=$WORK/case_$name run=$WORK/ref_run_$name
    "$PY" "$ref" case "$case" --precision "$1" >"$case.log" 2>&1 || { cat "$case.log"; return 1; }
    # the referee emulates bf16 products, not the tensor-core attention's rounding
    # of the probabilities (cuda_bf16_attention_tracks_fp32_attention covers that)
    PLAIT_CUDA_ATTENTION=fp32 PLAIT_DUMP_STEP1="$run/dump" "$PLAIT" train "$case/plan.json" \
        --out "$run" "${CUDA_SET[@]}" >"$run.log" 2>&1 || { tail -n 30 "$run.log"; return 1; }
    grep -q "training on CUDA device" "$run.log" || { echo "not on the GPU:"; cat "$run.log"; return 1; }
    "$PY" "$ref" compare "$case" "$run"
}

tiny_plan "$WORK/plan.json"
# the tiny plan as a small grouped-query Llama: 4 heads over 2 key/value heads
# (8 wide), a SwiGLU 48 wide, RMSNorm, rotary positions, an untied head
LLAMA_SET=(--set model.arch=llama --set model.heads=4 --set model.kv_heads=2
    --set model.ffn_hidden=48)

# losses_within A B BOUND: two metrics.jsonl files have the same steps, each
# step's loss within BOUND (relative) of A's
losses_within() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
la = {r["step"]: r["loss"] for r in a if "loss" in r}
lb = {r["step"]: r["loss"] for r in b if "loss" in r}
assert la.keys() == lb.keys() and la, (sorted(la), sorted(lb))
worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in la)
print(f"{len(la)} steps, worst relative loss difference {worst:.2e}")
sys.exit(worst > float(sys.argv[3]))
PYEOF
}

# the reference GPU run of the tiny plan (once, for the checks that compare with it)
gpu_ref() {
    [ -f "$WORK/gpu_ref.log" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/gpu_ref" "${CUDA_SET[@]}" >"$WORK/gpu_ref.log" 2>&1
    grep -q "training on CUDA device" "$WORK/gpu_ref.log" || { cat "$WORK/gpu_ref.log"; return 1; }
}

run_equals_run() {
    gpu_ref || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/gpu_again" "${CUDA_SET[@]}" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/gpu_ref/metrics.jsonl" "$WORK/gpu_again/metrics.jsonl"
}

sigterm_resume() {
    local run=$WORK/gpu_mid rc=0
    gpu_ref || return 1
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" \
        >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000002_0002 (step 2, mid-step)" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/gpu_ref/metrics.jsonl" "$run/metrics.jsonl"
}

# parallel.offload on the GPU (runtime/host_step.h): the step on the CPU in windows of ~700
# floats, the moments in host memory ("host") or in files ("nvme"): the bits of the run
# without offload (the CPU's AdamW gives the GPU's bits: the selftest's adamw case), no
# optimizer state on the device, and the device and host memory plait check predicts; one
# rank sums nothing, so the layers' gradients come down during backward (all but the
# embeddings: more than half) and the bits say they were final when they did
offload_equals_run() {
    gpu_ref || return 1
    local mode sets
    for mode in host nvme; do
        sets=(--set parallel.offload=$mode --set parallel.offload_window_mb=0.0027)
        [ "$mode" = nvme ] && sets+=(--set parallel.offload_dir="$WORK/offload_dir")
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/gpu_$mode" "${CUDA_SET[@]}" "${sets[@]}" \
            >"$WORK/gpu_$mode.log" 2>&1 || { tail -n 30 "$WORK/gpu_$mode.log"; return 1; }
        grep -q "parallel.offload \"$mode\": the optimizer steps on the CPU" "$WORK/gpu_$mode.log" ||
            { cat "$WORK/gpu_$mode.log"; return 1; }
        metrics_equal "$WORK/gpu_ref/metrics.jsonl" "$WORK/gpu_$mode/metrics.jsonl" || return 1
        offload_overlapped "$WORK/gpu_$mode.log" || return 1
        "$PY" - "$WORK/gpu_$mode/run.json" <<'PYEOF' || return 1
import json, sys
r = json.load(open(sys.argv[1]))["memory"]["ranks"][0]
p, a = r["predicted"], r["allocated"]
keys = ("params", "grads", "optimizer", "activations", "host", "scratch")
assert all(p.get(k) == a.get(k) for k in keys), (p, a)
assert a["optimizer"] == 0 and a["host"] > 0, a
print(f"{sys.argv[1]}: device {a['total']} bytes, host {a['host']}, as predicted")
PYEOF
    done
}

# offloaded, stopped mid-step and resumed: the bits of the run without offload
offload_resume() {
    local run=$WORK/gpu_offload_mid rc=0 sets=(--set parallel.offload=host)
    gpu_ref || return 1
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" \
        "${sets[@]}" >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" "${sets[@]}" >"$run.log2" 2>&1 ||
        { cat "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000002_0002 (step 2, mid-step)" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/gpu_ref/metrics.jsonl" "$run/metrics.jsonl"
}

# stopped on the GPU at micro-batch 8 (mid step 3), resumed on the CPU: every
# loss within 1e-4 (relative) of the GPU run's
resume_on_cpu() {
    local run=$WORK/gpu_then_cpu rc=0
    gpu_ref || return 1
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" \
        >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set parallel.device=cpu >"$run.log2" 2>&1 ||
        { cat "$run.log2"; return 1; }
    losses_within "$WORK/gpu_ref/metrics.jsonl" "$run/metrics.jsonl" 1e-4
}

# the grouped-query Llama on the GPU (once, for the checks that compare with it)
llama_gpu_ref() {
    [ -f "$WORK/llama_gpu.log" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/llama_gpu" "${CUDA_SET[@]}" \
            "${LLAMA_SET[@]}" >"$WORK/llama_gpu.log" 2>&1
    grep -q "training on CUDA device" "$WORK/llama_gpu.log" || { cat "$WORK/llama_gpu.log"; return 1; }
}

# the same Llama on the CPU: every step's loss within 1e-4 (relative) of the GPU's
llama_tracks_cpu() {
    llama_gpu_ref || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/llama_cpu" --set parallel.device=cpu \
        "${LLAMA_SET[@]}" >"$WORK/llama_cpu.log" 2>&1 || { cat "$WORK/llama_cpu.log"; return 1; }
    losses_within "$WORK/llama_gpu/metrics.jsonl" "$WORK/llama_cpu/metrics.jsonl" 1e-4
}

# a second GPU run of it, to the bit (RMSNorm's weight gradient and the
# key/value heads' group sums are deterministic)
llama_run_equals_run() {
    llama_gpu_ref || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/llama_gpu_again" "${CUDA_SET[@]}" \
        "${LLAMA_SET[@]}" >"$WORK/llama_gpu_again.log" 2>&1 ||
        { cat "$WORK/llama_gpu_again.log"; return 1; }
    metrics_equal "$WORK/llama_gpu/metrics.jsonl" "$WORK/llama_gpu_again/metrics.jsonl"
}

# The MoE GPT-2 on the GPU (once, for the checks that compare with it)
moe_gpu_ref() {
    [ -f "$WORK/moe_gpu.log" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/moe_gpu" \
            "${CUDA_SET[@]}" "${COMMON[@]}" >"$WORK/moe_gpu.log" 2>&1
    grep -q "training on CUDA device" "$WORK/moe_gpu.log" || { cat "$WORK/moe_gpu.log"; return 1; }
}

# the same on the CPU: every step's loss within 1e-4 (relative) of the GPU's, the
# experts' loads and dropped choices equal (the dispatch's integers are the CPU's; a
# router logit within rounding of a tie could still flip one), the balance and z losses
# within 1e-4
moe_tracks_cpu() {
    moe_gpu_ref || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/moe_cpu" --set parallel.device=cpu \
        "${COMMON[@]}" >"$WORK/moe_cpu.log" 2>&1 || { cat "$WORK/moe_cpu.log"; return 1; }
    losses_within "$WORK/moe_gpu/metrics.jsonl" "$WORK/moe_cpu/metrics.jsonl" 1e-4 &&
        loads_equal "$WORK/moe_gpu/metrics.jsonl" "$WORK/moe_cpu/metrics.jsonl" 1e-4
}

# a second GPU run of it, to the bit (the dispatch, the combine and the losses' sums are
# deterministic)
moe_run_equals_run() {
    moe_gpu_ref || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/moe_gpu_again" \
        "${CUDA_SET[@]}" "${COMMON[@]}" >"$WORK/moe_gpu_again.log" 2>&1 ||
        { cat "$WORK/moe_gpu_again.log"; return 1; }
    metrics_equal "$WORK/moe_gpu/metrics.jsonl" "$WORK/moe_gpu_again/metrics.jsonl"
}

# bf16 with the attention on the tensor cores (the default) against bf16 with
# the fused fp32 attention: every step's loss within 4u = 2^-7 (relative), the
# referee's bound for a bf16 run against fp32 (tests/golden/gpt2_ref.py,
# BF16_VS_FP32_TOL): the kernel rounds q, k, v, the probabilities, dout and dS
# to bf16, as many rounding points again as the bf16 products have.
bf16_attention_tracks() {
    local sets=("${CUDA_SET[@]}" --set precision=bf16)
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/bf16_tc" "${sets[@]}" >"$WORK/bf16_tc.log" 2>&1 ||
        { cat "$WORK/bf16_tc.log"; return 1; }
    grep -q "attention on the bf16 tensor cores" "$WORK/bf16_tc.log" ||
        { echo "the tensor-core attention did not run:"; cat "$WORK/bf16_tc.log"; return 1; }
    PLAIT_CUDA_ATTENTION=fp32 "$PLAIT" train "$WORK/plan.json" --out "$WORK/bf16_fp32att" \
        "${sets[@]}" >"$WORK/bf16_fp32att.log" 2>&1 || { cat "$WORK/bf16_fp32att.log"; return 1; }
    if grep -q "attention on the bf16 tensor cores" "$WORK/bf16_fp32att.log"; then
        echo "PLAIT_CUDA_ATTENTION=fp32 still ran the tensor-core attention"
        return 1
    fi
    "$PY" - "$WORK/bf16_tc/metrics.jsonl" "$WORK/bf16_fp32att/metrics.jsonl" <<'PYEOF'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "step" in r and "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
print(f"{len(a)} steps, worst relative loss difference {worst:.2e} (bound {2 ** -7:.2e})")
sys.exit(worst > 2 ** -7)
PYEOF
}

# sanitizer TOOL: a 2-step run under compute-sanitizer, clean (one warmup step:
# the cosine schedule wants fewer warmup steps than steps), on the GPU: GPT-2's
# tiny plan, the grouped-query Llama (llama.cu's kernels), the MoE GPT-2 (moe.cu's),
# then the selftest at its small shapes, which alone reaches the kernels no one-GPU
# run does (the cp ring's block attention)
sanitizer() {
    local cs arch log sets
    cs=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    [ -x "$cs" ] || { echo "compute-sanitizer is not installed"; return 1; }
    for arch in gpt2 llama moe; do
        log=$WORK/san_$1_$arch.log sets=("${CUDA_SET[@]}")
        [ "$arch" = llama ] && sets+=("${LLAMA_SET[@]}")
        [ "$arch" = moe ] && sets+=("${COMMON[@]}")
        "$cs" --tool "$1" --target-processes all --error-exitcode 9 \
            "$PLAIT" train "$WORK/plan.json" --out "$WORK/san_$1_$arch" "${sets[@]}" --set steps=2 \
            --set optimizer.warmup_steps=1 --set checkpoint.every=0 >"$log" 2>&1 ||
            { tail -n 40 "$log"; return 1; }
        grep -q "training on CUDA device" "$log" || { cat "$log"; return 1; }
        echo "$arch: $(grep "ERROR SUMMARY" "$log" || true)"
    done
    log=$WORK/san_$1_selftest.log
    PLAIT_SELFTEST_SHAPES=small "$cs" --tool "$1" --error-exitcode 9 "$TRAIN" --selftest \
        >"$log" 2>&1 || { grep -E "FAIL|DIFFERS|=========" "$log" | head -n 40; tail -n 5 "$log"; return 1; }
    echo "selftest (small shapes): $(grep "ERROR SUMMARY" "$log" || true)"
}

# fp8 on the GPU against fp8 on the CPU (the same quantiser, bit for bit; the
# products' fp32 sums in another order, which an fp8 cast can magnify into a
# step of the fp8 grid, as between pipeline layouts in test_fp8.sh): the mean
# loss within 0.25%. The tiny plan's products (32, 96, 128 wide, 128 rows) all
# meet cuBLASLt's fp8 constraints: with tensor scaling none may fall back.
fp8_tracks_cpu() {
    local sc
    for sc in tensor block; do
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/fp8_gpu_$sc" "${CUDA_SET[@]}" \
            --set precision=fp8 --set fp8_scaling=$sc >"$WORK/fp8_gpu_$sc.log" 2>&1 ||
            { cat "$WORK/fp8_gpu_$sc.log"; return 1; }
        grep -q "training on CUDA device" "$WORK/fp8_gpu_$sc.log" || { cat "$WORK/fp8_gpu_$sc.log"; return 1; }
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/fp8_cpu_$sc" --set parallel.device=cpu \
            --set precision=fp8 --set fp8_scaling=$sc >"$WORK/fp8_cpu_$sc.log" 2>&1 ||
            { cat "$WORK/fp8_cpu_$sc.log"; return 1; }
        "$PY" - "$WORK/fp8_gpu_$sc/metrics.jsonl" "$WORK/fp8_cpu_$sc/metrics.jsonl" $sc <<'PYEOF' || return 1
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "step" in r and "loss" in r]
g, c = losses(sys.argv[1]), losses(sys.argv[2])
assert len(g) == len(c) > 0, (len(g), len(c))
gap = abs(sum(g) - sum(c)) / sum(c)
print(f"{sys.argv[3]}: mean loss GPU against CPU {gap:.4%} over {len(g)} steps")
sys.exit(gap >= 0.0025)
PYEOF
    done
    if grep "runs dequantised" "$WORK/fp8_gpu_tensor.log"; then return 1; fi
}

fp8_resume() {
    local run=$WORK/fp8_gpu_mid rc=0
    [ -f "$WORK/fp8_gpu_tensor/metrics.jsonl" ] || { echo "needs the fp8 GPU run"; return 1; }
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" \
        --set precision=fp8 >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${CUDA_SET[@]}" --set precision=fp8 \
        >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/fp8_gpu_tensor/metrics.jsonl" "$run/metrics.jsonl"
}

# a check not asked for is left out; one that cannot run for want of a tool is
# skipped, not failed
check_or_skip() { # NAME WHY-IF-MISSING PROBE FUNCTION...
    local name=$1 why=$2 probe=$3
    shift 3
    wanted "$name" || return 0
    if eval "$probe" >/dev/null 2>&1; then check "$name" "$@"; else echo "ok $name # SKIP $why"; fi
}

HAVE_TORCH='"$PY" -c "import torch"'
HAVE_CS='command -v compute-sanitizer || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ]'
check_or_skip cuda_selftest "" true selftest
check_or_skip cuda_torch_referee_fp32 "python3-torch not installed" "$HAVE_TORCH" referee "$REF" fp32
check_or_skip cuda_torch_referee_bf16 "python3-torch not installed" "$HAVE_TORCH" referee "$REF" bf16
check_or_skip cuda_llama_torch_referee_fp32 "python3-torch not installed" "$HAVE_TORCH" \
    referee "$LLAMA_REF" fp32
check_or_skip cuda_llama_torch_referee_bf16 "python3-torch not installed" "$HAVE_TORCH" \
    referee "$LLAMA_REF" bf16
check_or_skip cuda_bf16_attention_tracks_fp32_attention "" true bf16_attention_tracks
check_or_skip cuda_run_equals_cuda_run "" true run_equals_run
check_or_skip cuda_sigterm_mid_step_resumes_to_the_bit "" true sigterm_resume
check_or_skip cuda_checkpoint_resumes_on_the_cpu "" true resume_on_cpu
check_or_skip cuda_compute_sanitizer_memcheck "compute-sanitizer not installed" "$HAVE_CS" sanitizer memcheck
check_or_skip cuda_compute_sanitizer_racecheck "compute-sanitizer not installed" "$HAVE_CS" sanitizer racecheck
HAVE_FP8='! grep -q "no fp8 tensor cores" "$WORK/selftest.txt"'
check_or_skip cuda_fp8_tracks_the_cpu "this GPU has no fp8 tensor cores (sm_89+)" "$HAVE_FP8" fp8_tracks_cpu
check_or_skip cuda_fp8_resumes_to_the_bit "this GPU has no fp8 tensor cores (sm_89+)" "$HAVE_FP8" fp8_resume
check_or_skip cuda_llama_tracks_the_cpu "" true llama_tracks_cpu
check_or_skip cuda_llama_run_equals_cuda_run "" true llama_run_equals_run
check_or_skip cuda_moe_tracks_the_cpu "" true moe_tracks_cpu
check_or_skip cuda_moe_run_equals_cuda_run "" true moe_run_equals_run
check_or_skip cuda_offload_equals_cuda_run "" true offload_equals_run
check_or_skip cuda_offload_resumes_to_the_bit "" true offload_resume
finish
