#!/usr/bin/env bash
# make bench, part 3 — how much of the data-parallel gradient reduction hides
# behind backward: GPT-2 124M, micro-batch 4, seq 64, fp32, dp 2 (1×1×2) on
# this machine, each case trained twice in the same environment:
#   overlapped  parallel.bucket_mb 25 (the default): each bucket's reduction
#               starts as soon as the last backward has passed below it
#   serial      parallel.bucket_mb 1e6: more than the whole gradient, so one
#               bucket reduced after backward (what a reduction after it costs)
# The cases: ZeRO 0 (a sum over dp) and ZeRO 1 (a reduce-scatter into the
# slices; after the step both runs all-gather the parameters, which nothing
# hides, so its share below counts that gather as not hidden).
# Each step's metrics.jsonl records "parallel.wait_ms.dp", the time a rank was
# blocked in the data-parallel communicator: what computing did not hide.
# hidden = 1 − overlapped / serial, from the medians of the timed steps (the
# first step warms up). Not a test: it asserts nothing.
#   BENCH_STEPS   timed steps per run (default 10)
source "$(dirname "$0")/bench_env.sh" # defines: BUILD PY STEPS work

source bench/gpt2_124m.sh # defines: L NH C V VP MAXT, gpt2_tokens, gpt2_plan, gpt2_dp2_plan
gpt2_dp2_plan             # defines: T B; writes $work/tokens.bin, $work/plan.json

run() { # NAME BUCKET_MB ZERO
    "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$1" --set parallel.bucket_mb="$2" \
        --set parallel.zero="$3" >"$work/$1.log" 2>&1 || { tail -n 20 "$work/$1.log"; exit 1; }
}
report() { # CASE WHAT [GATHER]
    "$PY" - "$work" "$1" "$2" "${3:-0}" <<'PYEOF'
import json, statistics, sys
work, case, what, gather = sys.argv[1:5]
def medians(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r][1:]
    return (statistics.median(r["parallel"]["wait_ms"]["dp"] for r in rows),
            statistics.median(r["ms"] for r in rows), len(rows))
ov, ov_ms, n = medians(f"{case}_overlapped")
se, se_ms, _ = medians(f"{case}_serial")
print(f"  blocked in dp per step           overlapped {ov:8.1f} ms   serial {se:8.1f} ms")
print(f"  step time                        overlapped {ov_ms:8.1f} ms   serial {se_ms:8.1f} ms   ratio {ov_ms / se_ms:5.2f}")
print(f"  share of the {what} hidden behind backward  {100 * (1 - ov / se):5.1f}%   (goal >= 80%; medians of {n} steps)")
if gather == "1":  # an estimate: the gather moves the bytes the reduce-scatter does
    print(f"  of the reduce-scatter alone, if the gather takes half the serial wait  {100 * (se - ov) / (se / 2):5.1f}%")
PYEOF
}
echo "== data-parallel overlap: GPT-2 124M, micro-batch $B, seq $T, fp32, 1×1×2, $STEPS timed steps each"
echo "-- ZeRO 0: the gradients summed over dp"
run z0_overlapped 25 0
run z0_serial 1e6 0
report z0 "dp sum"
echo "-- ZeRO 1: the gradients reduce-scattered into the slices (then the parameters all-gathered)"
run z1_overlapped 25 1
run z1_serial 1e6 1
report z1 "reduce-scatter (and gather)" 1
