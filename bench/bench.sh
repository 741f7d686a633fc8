#!/usr/bin/env bash
# make bench — GPT-2 124M training steps, plait-train against PyTorch, in one
# run and one environment (2 threads, passive OpenMP waiting, the machine's
# OPENBLAS_CORETYPE untouched). Prints step-time medians, their ratio, and
# plait's model FLOPs as a share of the BLAS's measured sgemm rate; then the
# cost model's step beside plait's measured one for the demo plan and this
# configuration (bench/cost_bench.sh, make bench-cost). Not a test: it asserts
# nothing; the goals are printed beside the numbers.
#   BENCH_STEPS   timed steps per run (default 12; the first step is dropped)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
STEPS=${BENCH_STEPS:-12}
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/plait-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

source bench/gpt2_124m.sh # defines: L NH C V VP MAXT, gpt2_tokens, gpt2_plan

# GPT-2 124M, micro-batch 4, seq 64, fp32 (the issue's configuration)
T=64 B=4
gpt2_tokens "$work/tokens.bin"
gpt2_plan "$work/plan.json" "$work/tokens.bin" "$T" "$B" $((STEPS + 1))

echo "== BLAS rates (bench/gemm_bench.c, GPT-2 124M shapes, 2 threads)"
rates=$("$BUILD/bin/gemm-bench" --json)
echo "$rates"

run_plait() { # precision [name]
    local name=${2:-$1}
    rm -rf "$work/run_$name"
    PLAIT_PROFILE=1 PLAIT_PEAK_GFLOPS=1 "$BUILD/bin/plait" train "$work/plan.json" \
        --out "$work/run_$name" --set precision="$1" >"$work/plait_$name.log" 2>&1 ||
        { cat "$work/plait_$name.log"; exit 1; }
    sed -n '/^profile/,/^  step/p' "$work/plait_$name.log" >"$work/profile_$name.txt"
}

echo "== plait-train fp32"
run_plait fp32
cat "$work/profile_fp32.txt"
echo "== PyTorch $($PY -c 'import torch; print(torch.__version__)') fp32"
"$PY" tests/golden/gpt2_ref.py bench --layers $L --heads $NH --hidden $C --vocab $V \
    --padded-vocab $VP --seq-len $T --max-seq-len $MAXT --batch $B --steps "$STEPS" \
    --warmup-steps 2 --threads 2 >"$work/torch.json"
cat "$work/torch.json"
echo "== plait-train bf16"
run_plait bf16
cat "$work/profile_bf16.txt"
echo "== plait-train bf16, the products' inputs in fp32 (PLAIT_DEBUG_ACTIVATIONS_F32)"
PLAIT_DEBUG_ACTIVATIONS_F32=1 run_plait bf16 bf16_acts_f32

"$PY" - "$work" "$rates" $L $C $V $T $B <<'EOF'
import json, statistics, sys
work, rates = sys.argv[1], json.loads(sys.argv[2])
L, C, V, T, B = map(int, sys.argv[3:])
def plait_ms(p):
    ms = [r["ms"] for r in map(json.loads, open(f"{work}/run_{p}/metrics.jsonl")) if "step" in r]
    return statistics.median(ms[1:]), len(ms) - 1          # the first step warms up
fp32, n = plait_ms("fp32")
bf16, _ = plait_ms("bf16")
bf16_f32, _ = plait_ms("bf16_acts_f32")
torch = json.load(open(f"{work}/torch.json"))["median_ms"]
N = V * C + L * (12 * C * C + 13 * C) + 2 * C              # parameters, without wpe
flops = (6 * N + 12 * L * C * T) * B * T                   # model FLOPs per step
share = flops / (fp32 / 1e3) / 1e9 / rates["sgemm_gflops"]
share16 = flops / (bf16 / 1e3) / 1e9 / rates["bf16_gflops"]
print()
print(f"GPT-2 124M, micro-batch {B}, seq {T}, 2 threads: {flops / 1e9:.1f} GFLOP per step; medians of {n} steps")
print(f"  plait-train fp32   {fp32:8.1f} ms")
print(f"  plait-train bf16   {bf16:8.1f} ms")
print(f"  PyTorch fp32       {torch:8.1f} ms")
print(f"  plait fp32 / PyTorch          {fp32 / torch:5.2f}   (goal <= 0.5)")
print(f"  plait bf16 / plait fp32       {bf16 / fp32:5.2f}   (goal < 1)")
print(f"  bf16 inputs in bf16 / in fp32 {bf16 / bf16_f32:5.2f}   (the products' inputs stored in bf16, not converted by each product)")
print(f"  fp32 model FLOPs / sgemm rate {100 * share:5.1f}%  ({rates['sgemm_gflops']:.0f} GFLOP/s measured; goal >= 60%)")
print(f"  bf16 model FLOPs / bf16 rate  {100 * share16:5.1f}%  ({rates['bf16_gflops']:.0f} GFLOP/s measured)")
EOF

echo
echo "== a Llama's step against PyTorch's (bench/llama_bench.sh)"
bench/llama_bench.sh

echo
echo "== the cost model against plait's step (bench/cost_bench.sh)"
bench/cost_bench.sh
