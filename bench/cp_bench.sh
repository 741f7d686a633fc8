#!/usr/bin/env bash
# make bench, part 7 — context parallelism on a long sequence: a GPT-2 of 4
# layers, hidden 256, 4 heads, one sequence of 2048 tokens a micro-batch, fp32,
# on this machine, in the same environment:
#   cp 1, 2, 4   parallel.cp: each sequence over cp ranks (two of its 2·cp chunks
#                a rank), attention as a ring of key/value blocks
#   cp 2 serial  the same with PLAIT_DEBUG_NO_RING_OVERLAP=1: each block (and
#                gradient) waited for before the one at hand is worked on
# Each step's metrics.jsonl records "parallel.wait_ms.cp", the time a rank was
# blocked in the ring: what the attention of the block at hand did not hide.
# hidden = 1 − overlapped / serial, from the medians of the timed steps (the
# first step warms up). Memory per rank at cp 1/2/4: the activations the model
# allocated (predicted = allocated, run.json) and the peak resident set, each
# as a ratio to cp 1's (the goal: activations ~1/cp). Not a test: it asserts
# nothing.
#   BENCH_STEPS   timed steps per run (default 10)
source "$(dirname "$0")/bench_env.sh" # defines: BUILD PY STEPS work

T=2048
source bench/gpt2_124m.sh # defines: gpt2_tokens (of V's vocabulary)
V=256 gpt2_tokens "$work/tokens.bin" $((1 << 17))
cat >"$work/plan.json" <<JSON
{"model": {"layers": 4, "heads": 4, "hidden": 256, "vocab": 256, "seq_len": $T, "seed": 5},
 "data": {"train": "$work/tokens.bin", "shuffle": false},
 "batch": {"micro_batch": 1, "grad_accum": 1},
 "optimizer": {"lr": 1e-3},
 "steps": $((STEPS + 1)),
 "checkpoint": {"every": 0},
 "train": {"log_every": 1}}
JSON

run() { # NAME CP [ENV=VALUE]
    local name=$1 cp=$2 env=()
    [ $# -gt 2 ] && env=("$3")
    env "${env[@]}" "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$name" \
        --set parallel.cp="$cp" >"$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log"; exit 1; }
}
echo "== context parallelism: GPT-2 4×256, one sequence of $T tokens a step, fp32, $STEPS timed steps each"
run cp1 1
run cp2 2
run cp4 4
run cp2_serial 2 PLAIT_DEBUG_NO_RING_OVERLAP=1
"$PY" - "$work" <<'PYEOF'
import json, statistics, sys
work = sys.argv[1]
def medians(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r][1:]
    wait = [r.get("parallel", {}).get("wait_ms", {}).get("cp", 0) for r in rows]
    return statistics.median(r["ms"] for r in rows), statistics.median(wait), len(rows)
def memory(name):
    ranks = json.load(open(f"{work}/{name}/run.json"))["memory"]["ranks"]
    return max(r["allocated"]["activations"] for r in ranks), max(r["rss_peak_bytes"] for r in ranks)
ms1, _, n = medians("cp1")
ms2, wait2, _ = medians("cp2")
ms4, wait4, _ = medians("cp4")
serial, wait_serial, _ = medians("cp2_serial")
print(f"  step time     cp 1 {ms1:8.1f} ms   cp 2 {ms2:8.1f} ms   cp 4 {ms4:8.1f} ms   (medians of {n} steps, all on this machine's cores)")
print(f"  blocked in the ring at cp 2: {wait2:7.1f} ms overlapped, {wait_serial:7.1f} ms serial ({serial:.1f} ms a step)")
if wait_serial > 0:
    print(f"  share of the ring's key/value traffic hidden by the overlap at cp 2: {100 * (1 - wait2 / wait_serial):5.1f}%")
a1, r1 = memory("cp1")
for cp in (2, 4):
    a, r = memory(f"cp{cp}")
    print(f"  a rank's memory at cp {cp}: activations {a / 1e6:7.1f} MB ({a / a1:.3f} of cp 1's {a1 / 1e6:.1f} MB; "
          f"goal ~{1 / cp:.2f}), peak resident {r / 1e6:7.1f} MB ({r / r1:.3f} of cp 1's)")
PYEOF
