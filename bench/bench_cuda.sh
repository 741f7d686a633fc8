#!/usr/bin/env bash
# make bench-cuda — GPT-2 124M (vocab 50304), seq 1024, bf16, on this machine's
# GPU 0 at micro-batch 16 and 32: plait-train's tokens/s and step time (medians
# of the timed steps, the first dropped) and MFU (metrics.jsonl's "mfu": 6·N +
# 12·L·C·T FLOPs per token, common/place/gpu.c, over the GPU's dense bf16 datasheet
# peak), beside what `plait check` models for the same plan on this machine
# (step time, MFU) and their ratio; the classifier's logits whole beside its chunks, and the
# products' inputs in fp32 (PLAIT_DEBUG_ACTIVATIONS_F32) beside bf16. Beside each, in the
# same run, PyTorch's
# (bench/torch_gpt2.py: the same model, batch and AdamW, with torch.compile,
# bf16 autocast, SDPA and the fused AdamW) and plait's ratio to it (the goal:
# above 1 at both batch sizes); and llm.c's where LLMC_BIN names a built
# train_gpt2cu. Issue 11 quotes PyTorch at 440k tok/s at 16×1024 and 482k at
# 32×1024 on an H100 80GB SXM, the anchor the cost model is calibrated to
# (common/place/layout.c). Then where a step goes. Not a test: it asserts nothing.
# Then fp8 (GPUs of sm_89 and later): build/bin/fp8-bench times GPT-2 124M's
# block products at 16×1024 in fp8 (tensor, then block scaling) against bf16
# and prints the ratio (the goal: 1.3 or more), and a whole fp8 run at
# 16×1024 prints its tokens/s beside bf16's.
#   BENCH_STEPS   timed steps per run (default 10)
#   BENCH_BATCHES the micro-batches to run (default "16 32")
#   BENCH_TORCH   0 leaves PyTorch out (a quick look at plait alone)
#   LLMC_BIN      llm.c's train_gpt2cu, to run on the same tokens (optional)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
STEPS=${BENCH_STEPS:-10}
work=$(mktemp -d /tmp/plait-bench-cuda.XXXXXX)
trap 'rm -rf "$work"' EXIT

# a GPU? The selftest at its small shapes says (77: none, and why)
rc=0
selftest=$(PLAIT_SELFTEST_SHAPES=small "$BUILD/bin/plait-train" --selftest 2>&1) || rc=$?
if [ "$rc" -eq 77 ]; then
    grep "skipped" <<<"$selftest"
    echo "bench-cuda: no GPU here; nothing measured"
    exit 77
fi

source bench/gpt2_124m.sh # defines: L NH C V VP MAXT, gpt2_tokens, gpt2_plan
T=$MAXT
gpt2_tokens "$work/tokens.bin" $((1 << 22))

report() { # METRICS B LABEL: the median tokens/s of the timed steps, and MFU (metrics' "mfu")
    "$PY" - "$1" "$2" "$T" "$3" <<'EOF'
import json, statistics, sys
path, B, T, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
steps = [r for r in map(json.loads, open(path)) if "tokens_per_s" in r][1:]
tps = statistics.median(r["tokens_per_s"] for r in steps)
mfus = [r["mfu"] for r in steps if "mfu" in r]
mfu = f"MFU {100 * statistics.median(mfus):.1f}% of the bf16 peak" if mfus else "MFU unknown"
print(f"plait-train {label} {B}x{T}: {tps:,.0f} tokens/s, {mfu} ({len(steps)} steps)")
EOF
}

for B in ${BENCH_BATCHES:-16 32}; do
    gpt2_plan "$work/plan_$B.json" "$work/tokens.bin" "$T" "$B" $((STEPS + 1)) \
        '"precision": "bf16", "parallel": {"device": "cuda"}'
    # the cost model's view of this plan on this machine's GPU 0
    "$BUILD/bin/plait" check "$work/plan_$B.json" --gpus-per-node 1 --json >"$work/check_$B.json" \
        2>"$work/check_$B.err" || { cat "$work/check_$B.err"; echo '{}' >"$work/check_$B.json"; }
    "$BUILD/bin/plait" train "$work/plan_$B.json" --out "$work/run_$B" >"$work/run_$B.log" 2>&1 ||
        { tail -n 20 "$work/run_$B.log"; exit 1; }
    "$PY" - "$work/run_$B/metrics.jsonl" "$work/check_$B.json" "$B" "$T" <<'EOF'
import json, statistics, sys
path, check_path, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
anchor = {16: 440e3, 32: 482e3}.get(B)  # issue 11: PyTorch on an H100 80GB SXM
steps = [r for r in map(json.loads, open(path)) if "tokens_per_s" in r][1:]
tps = statistics.median(r["tokens_per_s"] for r in steps)
ms = statistics.median(r["ms"] for r in steps)
mfus = [r["mfu"] for r in steps if "mfu" in r]
check = json.load(open(check_path))
gpus = [g for n in check.get("nodes", []) for g in n.get("gpu_models", [])]
gpu = gpus[0]["model"] if gpus and gpus[0]["model"] else "an unknown GPU"
model_ms = 1e3 * check.get("step_time_s", {}).get("total", 0)
model_mfu = check.get("modelled_mfu")
mfu = f"MFU {100 * statistics.median(mfus):.1f}%" if mfus else "MFU unknown (GPU peak unknown)"
print(f"plait-train bf16 {B}x{T} on {gpu}: {tps:,.0f} tokens/s, {mfu} ({len(steps)} steps)")
if model_ms > 0:
    print(f"  step: measured {ms:.1f} ms, modelled {model_ms:.1f} ms (modelled/measured "
          f"{model_ms / ms:.2f})" + (f", modelled MFU {100 * model_mfu:.1f}%" if model_mfu else ""))
else:
    print(f"  step: measured {ms:.1f} ms; plait check could not model it (see above)")
if anchor:
    print(f"  PyTorch anchor {anchor:,.0f} tokens/s (H100 80GB SXM): plait/anchor {tps / anchor:.2f}")
open(path + ".tps", "w").write(str(tps))
EOF
    # the device's memory after step 1 (everything: the CUDA context, cuBLAS's workspaces and
    # the backend's scratch too) beside what plait check predicts: the model's buffers, the
    # backend's scratch (reserved at the model's making), cuBLASLt's workspace and the CUDA
    # context's allowance (issue 19: within 10%); a scratch slot that grew past its
    # reservation is named in the run's log
    "$PY" - "$work/run_$B/run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["memory"]["ranks"][0]
used, p = r.get("device_used_bytes"), r["predicted"]
pred = p["total"]
if used:
    print(f"  device memory after step 1: {used / 1e9:.2f} GB in use, plait check predicts "
          f"{pred / 1e9:.2f} GB (in use / predicted {used / pred:.2f}; of it scratch "
          f"{p.get('scratch', 0) / 1e9:.2f} GB, reserved {r['allocated'].get('scratch', 0) / 1e9:.2f}, "
          f"CUDA context and cuBLASLt workspace {p.get('cuda_context', 0) / 1e9:.2f})"
          + ("" if abs(used / pred - 1) <= 0.10 else ": more than 10% apart"))
EOF
    grep -h "grew past its reservation" "$work/run_$B.log" | head -n 3 | sed 's/^/  /' || true
    if [ "${BENCH_TORCH:-1}" = 0 ]; then
        echo "PyTorch     bf16 ${B}x$T: left out (BENCH_TORCH=0)"
    elif "$PY" bench/torch_gpt2.py --micro-batch "$B" --seq-len "$T" --layers "$L" --heads "$NH" \
        --hidden "$C" --vocab "$V" --padded-vocab "$VP" --steps "$STEPS" >"$work/torch_$B.json" \
        2>"$work/torch_$B.log"; then
        "$PY" - "$work/torch_$B.json" "$work/run_$B/metrics.jsonl.tps" "$B" "$T" <<'EOF'
import json, sys
torch = json.load(open(sys.argv[1]))["tokens_per_s"]
plait = float(open(sys.argv[2]).read())
print(f"PyTorch     bf16 {sys.argv[3]}x{sys.argv[4]}: {torch:,.0f} tokens/s "
      f"(torch.compile, autocast, SDPA, fused AdamW); plait / PyTorch = {plait / torch:.2f}")
EOF
    else
        echo "PyTorch     bf16 ${B}x$T: did not run: $(tail -n 1 "$work/torch_$B.log")"
    fi
    if [ -n "${LLMC_BIN:-}" ]; then # llm.c, GPT-2 124M from scratch (-e d12) on the same tokens
        if "$LLMC_BIN" -e d12 -i "$work/tokens.bin" -j "$work/tokens.bin" -b "$B" -t "$T" \
            -x $((STEPS + 1)) -v 100000 -s 100000 -o "$work/llmc_$B" >"$work/llmc_$B.log" 2>&1; then
            grep -o '[0-9]* tok/s' "$work/llmc_$B.log" | tail -n "$STEPS" | sort -n |
                awk -v B="$B" -v T="$T" '{v[NR] = $1} END {
                    printf "llm.c       bf16 %sx%s: %s tokens/s (median)\n", B, T, v[int((NR + 1) / 2)] }'
        else
            echo "llm.c: did not run: $(tail -n 1 "$work/llmc_$B.log")"
        fi
    fi
done

# where a step goes: plait's own time per phase (PLAIT_PROFILE=1 waits for the
# device around each phase, so the run is a little slower than the ones above),
# and, where Nsight Systems is installed, the time per CUDA kernel
# parallel.offload "host" (runtime/host_step.h): the optimizer's step on the CPU, its state in
# host memory; its step beside the run's without offload
echo
if "$BUILD/bin/plait" train "$work/plan_16.json" --out "$work/offload_host" \
    --set parallel.offload=host >"$work/offload_host.log" 2>&1; then
    report "$work/offload_host/metrics.jsonl" 16 'bf16 parallel.offload "host"'
    "$PY" - "$work/offload_host" "$work/run_16" <<'EOF'
import sys
sys.path.insert(0, "bench")
from run_stats import ms
off, ref = ms(sys.argv[1]), ms(sys.argv[2])
print(f"  step {off:.1f} ms against {ref:.1f} ms without offload ({off / ref:.2f}x)")
EOF
else
    echo "parallel.offload \"host\" did not run: $(tail -n 1 "$work/offload_host.log")"
fi

# the classifier: the runs above compute the logits in chunks (logits_chunk_mb's default,
# the LM head's gradients made as they go); the same with each micro-batch's logits whole
echo
if "$BUILD/bin/plait" train "$work/plan_16.json" --out "$work/logits_whole" \
    --set logits_chunk_mb=0 >"$work/logits_whole.log" 2>&1; then
    report "$work/logits_whole/metrics.jsonl" 16 "bf16 logits whole (logits_chunk_mb 0)"
    "$PY" - "$work/logits_whole" "$work/run_16" <<'EOF'
import sys
sys.path.insert(0, "bench")
from run_stats import ms, pred, used
whole, chunks = sys.argv[1], sys.argv[2]
print(f"  step in chunks {ms(chunks):.1f} ms against {ms(whole):.1f} ms whole "
      f"({ms(chunks) / ms(whole):.2f}x); device memory in use {used(chunks) / 1e9:.2f} GB "
      f"(predicted {pred(chunks) / 1e9:.2f}) against {used(whole) / 1e9:.2f} GB "
      f"(predicted {pred(whole) / 1e9:.2f})")
EOF
else
    echo "logits whole did not run: $(tail -n 1 "$work/logits_whole.log")"
fi

# the products' inputs: the runs above keep them in bf16 (gpt2_act16); the same with them in
# fp32, each product converting its input as it reads it
echo
if PLAIT_DEBUG_ACTIVATIONS_F32=1 "$BUILD/bin/plait" train "$work/plan_16.json" \
    --out "$work/acts_f32" >"$work/acts_f32.log" 2>&1; then
    report "$work/acts_f32/metrics.jsonl" 16 "bf16, the products' inputs in fp32"
    "$PY" - "$work/acts_f32" "$work/run_16" <<'EOF'
import sys
sys.path.insert(0, "bench")
from run_stats import ms, used
f32, b16 = sys.argv[1], sys.argv[2]
print(f"  step with them in bf16 {ms(b16):.1f} ms against {ms(f32):.1f} ms in fp32 "
      f"({ms(b16) / ms(f32):.2f}x); device memory in use {used(b16) / 1e9:.2f} GB against "
      f"{used(f32) / 1e9:.2f} GB")
EOF
else
    echo "the products' inputs in fp32 did not run: $(tail -n 1 "$work/acts_f32.log")"
fi

echo
echo "where a 16x1024 step goes (PLAIT_PROFILE=1):"
PLAIT_PROFILE=1 "$BUILD/bin/plait" train "$work/plan_16.json" --out "$work/run_prof" --set steps=4 \
    >"$work/prof.log" 2>&1 && sed -n '/^profile over/,/^  step/p' "$work/prof.log" ||
    tail -n 5 "$work/prof.log"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null || true)
if [ -n "$NSYS" ]; then
    echo
    echo "time per CUDA kernel, 3 steps at 16x1024 (nsys, cuda_gpu_kern_sum):"
    sed 's/"steps": [0-9]*/"steps": 3/' "$work/plan_16.json" >"$work/plan_nsys.json"
    TRAIN_ABS=$(cd "$BUILD/bin" && pwd)/plait-train
    (cd "$work" && PLAIT_RUN_DIR=$work/run_nsys PLAIT_PLAN=$work/plan_nsys.json \
        "$NSYS" profile --trace=cuda -o "$work/nsys" "$TRAIN_ABS" \
        >"$work/nsys.log" 2>&1) &&
        "$NSYS" stats --report cuda_gpu_kern_sum --format table "$work/nsys.nsys-rep" 2>/dev/null |
        head -n 30 || tail -n 5 "$work/nsys.log"
else
    echo "(no nsys here: no time per kernel)"
fi

# fp8 (sm_89 and later): the products, then whole runs
echo
rc=0
for sc in tensor block; do
    "$BUILD/bin/fp8-bench" "$sc" || rc=$?
    [ "$rc" -eq 77 ] && exit 0 # no fp8 tensor cores: said so, nothing more to time
    [ "$rc" -eq 0 ] || exit "$rc"
done
for sc in tensor block; do
    "$BUILD/bin/plait" train "$work/plan_16.json" --out "$work/fp8_$sc" --set precision=fp8 \
        --set fp8_scaling=$sc >"$work/fp8_$sc.log" 2>&1 || { tail -n 20 "$work/fp8_$sc.log"; exit 1; }
    grep "fp8 .* product" "$work/fp8_$sc.log" || true # a fallback, if any
    report "$work/fp8_$sc/metrics.jsonl" 16 "fp8 $sc"
done
