#!/usr/bin/env bash
# make bench, part 8 — DualPipeV with experts over ep ranks: a GPT-2 of 4 layers, hidden
# 256, 4 heads, an MoE block in every layer (8 experts of width 512, top 2, a shared
# one), micro-batches of 2 sequences of 256 tokens, fp32, at pp 2 × dp 2 × ep 2 (4
# ranks, 8 micro-batches a rank a step: 2·pp and more), on this machine, in the same
# environment:
#   overlapped  each pair of the schedule's main steps (a forward of one chunk beside a
#               backward of the other) as two lanes: the experts' all-to-all of one
#               moving while the other computes (runtime/lanes.h)
#   serial      the same with PLAIT_DEBUG_NO_MOE_OVERLAP=1: the pair's passes one after
#               the other, each all-to-all waited for as it starts
# each without recompute and with full recompute (recompute "full": a backward reruns its
# layers' forwards, their all-to-alls with them, each lane in its own copy of the buffers).
# Each step's metrics.jsonl records "parallel.wait_ms.ep", the time a rank was blocked
# on the experts' all-to-alls: what the other lane's compute did not hide. hidden = 1 −
# overlapped / serial, from the medians of the timed steps (the first step warms up).
# Not a test: it asserts nothing.
#   BENCH_STEPS   timed steps per run (default 10)
source "$(dirname "$0")/bench_env.sh" # defines: BUILD PY STEPS work

T=256
source bench/gpt2_124m.sh # defines: gpt2_tokens (of V's vocabulary)
V=256 gpt2_tokens "$work/tokens.bin" $((1 << 17))
cat >"$work/plan.json" <<JSON
{"model": {"layers": 4, "heads": 4, "hidden": 256, "vocab": 256, "seq_len": $T, "seed": 5,
           "moe": {"experts": 8, "top_k": 2, "every": 1, "shared_experts": 1,
                   "ffn_hidden": 512, "capacity_factor": 1.25}},
 "data": {"train": "$work/tokens.bin", "shuffle": false},
 "batch": {"micro_batch": 2, "grad_accum": 8},
 "parallel": {"pp": 2, "dp": 2, "ep": 2, "schedule": "dualpipev"},
 "optimizer": {"lr": 1e-3},
 "steps": $((STEPS + 1)),
 "checkpoint": {"every": 0},
 "train": {"log_every": 1}}
JSON

run() { # NAME RECOMPUTE [ENV=VALUE]
    local name=$1 recompute=$2 env=()
    [ $# -gt 2 ] && env=("$3")
    env "${env[@]}" "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$name" \
        --set recompute="$recompute" >"$work/$name.log" 2>&1 ||
        { tail -n 20 "$work/$name.log"; exit 1; }
}
echo "== DualPipeV with experts: GPT-2 4×256, E 8 k 2 every layer, pp 2 × dp 2 × ep 2, 8 micro-batches of 2×$T a rank, fp32, $STEPS timed steps each"
for recompute in none full; do
    run "overlapped_$recompute" $recompute
    run "serial_$recompute" $recompute PLAIT_DEBUG_NO_MOE_OVERLAP=1
    echo "  recompute $recompute:"
    grep -h "lane switches" "$work/overlapped_$recompute.log" | sed 's/^plait-train: /  /'
    "$PY" - "$work" "$recompute" <<'PYEOF'
import json, statistics, sys
work, recompute = sys.argv[1:3]
def medians(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r][1:]
    par = [r["parallel"] for r in rows]
    return (statistics.median(r["ms"] for r in rows), statistics.median(p["wait_ms"]["ep"] for p in par),
            statistics.median(p["bytes"]["ep"] for p in par), len(rows))
ms, wait, sent, n = medians(f"overlapped_{recompute}")
ms_s, wait_s, sent_s, _ = medians(f"serial_{recompute}")
print(f"  step time     overlapped {ms:8.1f} ms   serial {ms_s:8.1f} ms   ratio {ms / ms_s:.3f}   (medians of {n} steps)")
print(f"  blocked on the experts' all-to-alls: {wait:7.1f} ms a step overlapped, {wait_s:7.1f} ms serial "
      f"({sent / 1e6:.2f} MB sent a rank a step, {sent_s / 1e6:.2f} serial)")
if wait_s > 0:
    print(f"  share of the all-to-alls' wait hidden by the two lanes: {100 * (1 - wait / wait_s):5.1f}%")
PYEOF
done
