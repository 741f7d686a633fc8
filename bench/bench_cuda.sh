#!/usr/bin/env bash
# make bench-cuda — GPT-2 124M (vocab 50304), seq 1024, bf16, on this machine's
# GPU 0 at micro-batch 16 and 32: plait-train's tokens/s (median of the timed
# steps, the first dropped) and MFU, (6·N + 12·L·C·T) FLOPs per token against
# the GPU's dense bf16 peak (PLAIT_BENCH_PEAK_TFLOPS, default 989: an H100 SXM).
# Not a test: it asserts nothing. PyTorch's figure (torch.compile, bf16 autocast,
# SDPA, fused AdamW) is not measured here yet; issue 11 quotes 440k tok/s at
# 16×1024 and 482k at 32×1024 on an H100 80GB SXM.
# Then fp8 (GPUs of sm_89 and later): build/bin/fp8-bench times GPT-2 124M's
# block products at 16×1024 in fp8 (tensor, then block scaling) against bf16
# and prints the ratio (the goal: 1.3 or more), and a whole fp8 run at
# 16×1024 prints its tokens/s beside bf16's.
#   BENCH_STEPS   timed steps per run (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
PY=/usr/bin/python3
STEPS=${BENCH_STEPS:-10}
PEAK=${PLAIT_BENCH_PEAK_TFLOPS:-989}
work=$(mktemp -d /tmp/plait-bench-cuda.XXXXXX)
trap 'rm -rf "$work"' EXIT

if [ "$("$BUILD/bin/plait-train" --selftest >/dev/null 2>&1; echo $?)" -eq 77 ]; then
    "$BUILD/bin/plait-train" --selftest
    echo "bench-cuda: no GPU here; nothing measured"
    exit 77
fi

L=12 NH=12 C=768 V=50257 VP=50304 T=1024
"$PY" - "$work/tokens.bin" "$V" <<'EOF'
import sys, numpy as np
n, v = 1 << 22, int(sys.argv[2])
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
t = np.random.default_rng(0).integers(0, v, n, dtype=np.uint16)
open(sys.argv[1], "wb").write(h.tobytes() + t.tobytes())
EOF

report() { # METRICS B LABEL: the median tokens/s of the timed steps, and MFU
    "$PY" - "$1" "$2" "$T" "$L" "$C" "$VP" "$PEAK" "$3" <<'EOF'
import json, statistics, sys
path, B, T, L, C, Vp, peak, label = sys.argv[1], *map(int, sys.argv[2:7]), float(sys.argv[7]), sys.argv[8]
steps = [r for r in map(json.loads, open(path)) if "tokens_per_s" in r][1:]
tps = statistics.median(r["tokens_per_s"] for r in steps)
n_params = Vp * C + T * C + L * 12 * C * C + L * 13 * C + 2 * C  # GPT-2, tied head
flops = 6 * n_params + 12 * L * C * T
print(f"plait-train {label} {B}x{T}: {tps:,.0f} tokens/s, MFU {100 * tps * flops / (peak * 1e12):.1f}% "
      f"of {peak:.0f} TFLOP/s (bf16 peak; {len(steps)} steps)")
EOF
}

for B in 16 32; do
    cat >"$work/plan_$B.json" <<EOF
{"model": {"layers": $L, "heads": $NH, "hidden": $C, "vocab": $V, "padded_vocab": $VP,
           "seq_len": $T, "max_seq_len": $T},
 "data": {"train": "$work/tokens.bin"},
 "batch": {"micro_batch": $B},
 "precision": "bf16",
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "parallel": {"device": "cuda"},
 "steps": $((STEPS + 1)), "checkpoint": {"every": 0, "keep": 1}}
EOF
    "$BUILD/bin/plait" train "$work/plan_$B.json" --out "$work/run_$B" >"$work/run_$B.log" 2>&1 ||
        { tail -n 20 "$work/run_$B.log"; exit 1; }
    report "$work/run_$B/metrics.jsonl" "$B" bf16
done

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
