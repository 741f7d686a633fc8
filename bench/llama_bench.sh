#!/usr/bin/env bash
# bench/llama_bench.sh — a Llama's training step, plait-train against PyTorch
# (tests/golden/llama_ref.py bench), same model, same batch, one environment
# (2 threads, passive OpenMP waiting): SmolLM-135M's shape (30 layers, hidden
# 576, 9 heads over 3 key/value heads, SwiGLU 1536, vocabulary 49152),
# micro-batch 4 × 64, fp32. Prints step-time medians and their ratio; run by
# make bench. Not a test: it asserts nothing.
#   BENCH_STEPS   timed steps per run (default 12; the first step is dropped)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
STEPS=${BENCH_STEPS:-12}
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/plait-llama-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
source bench/gpt2_124m.sh # defines: gpt2_tokens (random tokens of vocabulary V)
L=30 NH=9 KV=3 C=576 F=1536 V=49152 T=64 B=4
gpt2_tokens "$work/tokens.bin"
cat >"$work/plan.json" <<JSON
{"model": {"arch": "llama", "layers": $L, "heads": $NH, "kv_heads": $KV, "hidden": $C,
           "ffn_hidden": $F, "vocab": $V, "seq_len": $T},
 "data": {"train": "$work/tokens.bin"},
 "batch": {"micro_batch": $B},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "steps": $((STEPS + 1)), "checkpoint": {"every": 0, "keep": 1}}
JSON

echo "== plait-train, Llama fp32"
"$BUILD/bin/plait" train "$work/plan.json" --out "$work/run" >"$work/plait.log" 2>&1 ||
    { cat "$work/plait.log"; exit 1; }
echo "== PyTorch $($PY -c 'import torch; print(torch.__version__)') fp32"
"$PY" tests/golden/llama_ref.py bench --layers $L --heads $NH --kv-heads $KV --hidden $C \
    --ffn $F --vocab $V --padded-vocab $V --seq-len $T --batch $B --steps "$STEPS" \
    --warmup-steps 2 --threads 2 >"$work/torch.json"
cat "$work/torch.json"
"$PY" - "$work" "$STEPS" <<'PYEOF'
import json, statistics, sys
work = sys.argv[1]
ms = [r["ms"] for r in map(json.loads, open(f"{work}/run/metrics.jsonl")) if "step" in r]
plait = statistics.median(ms[1:])                           # the first step warms up
torch = json.load(open(f"{work}/torch.json"))["median_ms"]
print()
print(f"Llama (SmolLM-135M shape), micro-batch 4, seq 64, 2 threads; medians of {len(ms) - 1} steps")
print(f"  plait-train fp32   {plait:8.1f} ms")
print(f"  PyTorch fp32       {torch:8.1f} ms")
print(f"  plait / PyTorch    {plait / torch:5.2f}   (goal <= 0.5, as for GPT-2)")
PYEOF
