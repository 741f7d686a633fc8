#!/usr/bin/env bash
# make bench-cuda — GPT-2 124M (vocab 50304), seq 1024, bf16, on this machine's
# GPU 0 at micro-batch 16 and 32: plait-train's tokens/s and step time (medians
# of the timed steps, the first dropped) and MFU (metrics.jsonl's "mfu": 6·N +
# 12·L·C·T FLOPs per token, common/gpu.c, over the GPU's dense bf16 datasheet
# peak), beside what `plait check` models for the same plan on this machine
# (step time, MFU) and their ratio. Not a test: it asserts nothing. PyTorch's
# figure (torch.compile, bf16 autocast, SDPA, fused AdamW) is not measured here
# yet; issue 11 quotes 440k tok/s at 16×1024 and 482k at 32×1024 on an H100
# 80GB SXM, the anchor the cost model is calibrated to (common/layout.c).
#   BENCH_STEPS   timed steps per run (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
PY=/usr/bin/python3
STEPS=${BENCH_STEPS:-10}
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
    print(f"  PyTorch anchor {anchor:,.0f} tokens/s (H100 80GB SXM): plait/PyTorch {tps / anchor:.2f}")
EOF
done
