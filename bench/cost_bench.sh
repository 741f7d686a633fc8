#!/usr/bin/env bash
# make bench-cost (and make bench) — the cost model against plait's own step on
# this CPU: the demo plan (examples/plans/shakespeare.json on the bundled text)
# and GPT-2 124M at micro-batch 4 × seq 64 (fp32 and bf16), each trained here
# beside what the model predicts for it. The modelled step comes from the CPU
# kernels' rates measured at the plan's shapes (kernels/cpu/cpu_rate.h): by
# plait check just before each run, and by plait-train as it starts (its
# run.json, what plait status shows). Measured: the median of a run's timed
# steps (the first warms up). Each plan is run BENCH_REPEATS times, in turn
# with the others; the table gives the medians over the repeats and the range
# of the repeats' ratios: modelled step / measured step, which is the measured
# over the modelled tokens/s that plait status shows. Goal: the model within
# 25% of the measured step, 0.75-1.25. Not a test: it asserts nothing. On a
# shared machine run it when little else runs.
#   BENCH_STEPS     timed steps per run (default 12)
#   BENCH_REPEATS   runs of each plan (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
STEPS=${BENCH_STEPS:-12}
REPEATS=${BENCH_REPEATS:-3}
export OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/plait-cost-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$BUILD/bin/plait" data prepare examples/data/tinyshakespeare.txt "$work/shakespeare.bin" >/dev/null
source bench/gpt2_124m.sh # defines: gpt2_tokens, gpt2_plan
gpt2_tokens "$work/tokens.bin"
gpt2_plan "$work/gpt2.json" "$work/tokens.bin" 64 4 2

# case NAME PLAN --set ...: plait check --json, then plait train, in one environment
case_run() {
    local name=$1 plan=$2
    shift 2
    local sets=(--set "steps=$((STEPS + 1))" --set checkpoint.every=0 "$@")
    "$BUILD/bin/plait" check "$plan" "${sets[@]}" --json >"$work/$name.check.json"
    PLAIT_PEAK_GFLOPS=1 "$BUILD/bin/plait" train "$plan" --out "$work/$name" --quiet \
        "${sets[@]}" >"$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log"; exit 1; }
}

echo "== the demo plan and GPT-2 124M 4×64, $STEPS timed steps a run, $REPEATS runs each" \
    "(OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset})"
for r in $(seq "$REPEATS"); do
    case_run "demo.$r" examples/plans/shakespeare.json --set "data.train=$work/shakespeare.bin" \
        --set data.val=null --set data.val_every=0 --set optimizer.warmup_steps=1 \
        --set sample.tokens=0
    case_run "gpt2_fp32.$r" "$work/gpt2.json" --set precision=fp32
    case_run "gpt2_bf16.$r" "$work/gpt2.json" --set precision=bf16
done

"$PY" - "$work" "$REPEATS" <<'EOF'
import json, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
med = statistics.median
def one(name):  # a run: measured median step, plait-train's and plait check's modelled steps, ms
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r]
    tokens = rows[-1]["tokens"]
    run = json.load(open(f"{work}/{name}/run.json"))
    check = json.load(open(f"{work}/{name}.check.json"))
    return (med(r["ms"] for r in rows[1:]), 1e3 * tokens / run["throughput"]["modelled_tokens_per_s"],
            {k: 1e3 * v for k, v in check["step_time_s"].items()}, check["cpu_rates"]["rank"])
print(f"\ncost model on this CPU: measured step beside the modelled one (medians of {repeats} runs); "
      "ratio: modelled/measured step, as plait status's measured/modelled tokens/s; goal 0.75-1.25")
print(f"  {'plan':<22} {'measured':>9} {'plait-train':>12} {'ratio (range)':>15} {'plait check':>12} "
      f"{'ratio (range)':>15}   plait check's step, ms")
for name, label in (("demo", "demo (shakespeare)"), ("gpt2_fp32", "GPT-2 124M 4×64 fp32"),
                    ("gpt2_bf16", "GPT-2 124M 4×64 bf16")):
    runs = [one(f"{name}.{r}") for r in range(1, repeats + 1)]
    m, tr, ck = med(x[0] for x in runs), med(x[1] for x in runs), med(x[2]["total"] for x in runs)
    rt = [x[1] / x[0] for x in runs]
    rc = [x[2]["total"] / x[0] for x in runs]
    parts = ", ".join(f"{k} {med(x[2][k] for x in runs):.1f}" for k in ("compute", "memory", "parallel", "optimizer"))
    print(f"  {label:<22} {m:7.1f}ms {tr:10.1f}ms {tr / m:5.2f} ({min(rt):.2f}-{max(rt):.2f}) "
          f"{ck:10.1f}ms {ck / m:5.2f} ({min(rc):.2f}-{max(rc):.2f})   {parts}")
    r = {k: med(x[3][k] for x in runs) for k in runs[0][3]}
    print(f"  {'':<22} a rank's rates (plait check): products {r['matmul_gflops']:.0f} GFLOP/s, "
          f"attention {r['attention_gflops']:.0f} GFLOP/s, layer ops {r['activation_gbps']:.1f} GB/s, "
          f"parameter pass {r['memory_gbps']:.1f} GB/s, op start {r['parallel_op_us']:.0f} µs")
EOF
