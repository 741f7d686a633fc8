#!/usr/bin/env bash
# make bench, part 6 — ZeRO 3 against ZeRO 1: GPT-2 124M, micro-batch 4, seq
# 64, fp32, dp 2 (1×1×2) on this machine, in the same environment:
#   zero1        parallel.zero 1 (the gradients reduce-scattered in buckets
#                during backward, the parameters all-gathered after the step)
#   zero3        parallel.zero 3: each unit (the embeddings, a layer, the head)
#                gathered just before a pass uses it, the next one's gather
#                started while the current one computes; each unit's gradient
#                reduce-scattered as backward writes it
#   zero3 no prefetch  the same with PLAIT_DEBUG_NO_PREFETCH=1: each gather
#                starts when the pass reaches its unit
#   zero3 kept   parallel.zero 3 with parallel.reshard_after_forward false:
#                each unit gathered once a step and kept until its end (a
#                window for every unit: more memory, fewer gathers)
# Each step's metrics.jsonl records "parallel.wait_ms.dp", the time a rank was
# blocked in the data-parallel communicator (ZeRO 3: waiting for a gather or a
# scatter): what computing did not hide. hidden = 1 − prefetch / no prefetch,
# from the medians of the timed steps (the first step warms up). Not a test:
# it asserts nothing; the goal (ZeRO 3's step within 1.15× ZeRO 1's) is
# printed beside the numbers.
#   BENCH_STEPS   timed steps per run (default 10)
source "$(dirname "$0")/bench_env.sh" # defines: BUILD PY STEPS work

source bench/gpt2_124m.sh # defines: L NH C V VP MAXT, gpt2_tokens, gpt2_plan, gpt2_dp2_plan
gpt2_dp2_plan             # defines: T B; writes $work/tokens.bin, $work/plan.json

run() { # NAME ZERO [ENV=VALUE] [plait train options...]
    local name=$1 zero=$2 env=()
    shift 2
    if [[ ${1:-} == [A-Z]*=* ]]; then env=("$1"); shift; fi
    env "${env[@]}" "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$name" \
        --set parallel.zero="$zero" "$@" >"$work/$name.log" 2>&1 ||
        { tail -n 20 "$work/$name.log"; exit 1; }
}
echo "== ZeRO 3 against ZeRO 1: GPT-2 124M, micro-batch $B, seq $T, fp32, 1×1×2, $STEPS timed steps each"
run zero1 1
run zero3 3
run zero3_no_prefetch 3 PLAIT_DEBUG_NO_PREFETCH=1
run zero3_kept 3 --set parallel.reshard_after_forward=false
"$PY" - "$work" <<'PYEOF'
import json, statistics, sys
work = sys.argv[1]
def medians(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r][1:]
    return (statistics.median(r["ms"] for r in rows),
            statistics.median(r["parallel"]["wait_ms"]["dp"] for r in rows), len(rows))
def memory(name):
    r = json.load(open(f"{work}/{name}/run.json"))["memory"]["ranks"][0]
    return r["allocated"]["params"] + r["allocated"]["grads"] + r["allocated"]["optimizer"]
z1, z1_wait, n = medians("zero1")
z3, z3_wait, _ = medians("zero3")
off, off_wait, _ = medians("zero3_no_prefetch")
print(f"  step time        ZeRO 1 {z1:8.1f} ms   ZeRO 3 {z3:8.1f} ms   ZeRO 3 without prefetch {off:8.1f} ms")
print(f"  ZeRO 3 / ZeRO 1  {z3 / z1:5.3f} with prefetch, {off / z1:5.3f} without   (goal <= 1.15; medians of {n} steps)")
print(f"  blocked in dp    ZeRO 1 {z1_wait:8.1f} ms   ZeRO 3 {z3_wait:8.1f} ms   without prefetch {off_wait:8.1f} ms")
if off_wait > 0:
    print(f"  share of ZeRO 3's gathers and scatters hidden by the prefetch  {100 * (1 - z3_wait / off_wait):5.1f}%")
print(f"  a rank's parameters, gradients and optimizer state: ZeRO 3 {memory('zero3') / 1e6:.0f} MB, "
      f"ZeRO 1 {memory('zero1') / 1e6:.0f} MB (ratio {memory('zero3') / memory('zero1'):.3f})")
kept, kept_wait, _ = medians("zero3_kept")
print(f"  ZeRO 3 kept gathered (reshard_after_forward false): step {kept:8.1f} ms "
      f"({kept / z1:5.3f}× ZeRO 1, {kept / z3:5.3f}× ZeRO 3), blocked in dp {kept_wait:8.1f} ms, "
      f"model state {memory('zero3_kept') / 1e6:.0f} MB ({memory('zero3_kept') / memory('zero1'):.3f}× ZeRO 1's)")
PYEOF
