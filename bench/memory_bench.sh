#!/usr/bin/env bash
# make bench-memory — per-rank memory and pipeline bubble of real plait train
# runs against what plait check predicts: each rank's peak resident set after
# its first step (run.json "memory") over the predicted bytes for its stage
# (the model's, plus the collectives' shared-memory rings: "comm_rings"),
# and the measured bubble (metrics.jsonl "parallel") against the simulated one.
# The model is small in compute and large in activations (32 channels, 32
# heads, 96 × 128 tokens a micro-batch), so a rank holds hundreds of MB and a
# run takes seconds on 2 CPUs, one OpenMP thread a rank. On CPU ranks the
# resident set is the device memory plus the process's own (libraries, buffers
# of the collectives, the data); the second ratio leaves out what the process
# held before its model was built. Last, the classifier in chunks against whole logits:
# memory and step time. Not a test: it asserts nothing; the goals
# (within 10%, within 5 points) are printed beside the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/plait-memory-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$BUILD/bin/plait" data prepare examples/data/tinyshakespeare.txt "$work/train.bin" >/dev/null
cat >"$work/plan.json" <<EOF
{"model": {"layers": 4, "heads": 32, "hidden": 32, "vocab": 256, "seq_len": 128, "seed": 7},
 "data": {"train": "$work/train.bin"},
 "batch": {"micro_batch": 96, "grad_accum": 2},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "steps": 1, "checkpoint": {"every": 0, "keep": 1}}
EOF

# run NAME --set ...: one plait train run into $work/NAME
run() {
    local name=$1
    shift
    "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$name" "$@" >"$work/$name.log" 2>&1 ||
        { tail -n 20 "$work/$name.log"; exit 1; }
}

echo "== plait train: 1×1×2 ZeRO 0, 1×1×2 ZeRO 1 (1 step); 2×2×2 ZeRO 1, 1×2×1 (1F1B, ZB-H1 and DualPipeV, 4 micro-batches a step, 3 and 4 steps)"
run dp2_z0 --set parallel.dp=2
run dp2_z1 --set parallel.dp=2 --set parallel.zero=1
run tp2pp2dp2_z1 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
    --set parallel.zero=1 --set batch.grad_accum=4 --set steps=3
run pp2 --set parallel.pp=2 --set batch.grad_accum=4 --set steps=4
run pp2_zbh1 --set parallel.pp=2 --set batch.grad_accum=4 --set steps=4 --set parallel.schedule=zb-h1
run pp2_dualpipev --set parallel.pp=2 --set batch.grad_accum=4 --set steps=4 \
    --set parallel.schedule=dualpipev

# ZeRO 3 against ZeRO 0 at dp 4 on a model whose parameters dominate (64 layers of
# 384 channels, a vocabulary of 256, 32 tokens a micro-batch: 114M parameters, their
# AdamW state 16 bytes each at ZeRO 0, a few MB of activations)
cat >"$work/deep.json" <<EOF
{"model": {"layers": 64, "heads": 6, "hidden": 384, "vocab": 256, "seq_len": 32, "seed": 7},
 "data": {"train": "$work/train.bin"},
 "batch": {"micro_batch": 1, "grad_accum": 1},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "steps": 2, "checkpoint": {"every": 0, "keep": 1}, "parallel": {"dp": 4}}
EOF
echo "== plait train: 64 layers × 384 channels at 1×1×4, ZeRO 0 and ZeRO 3 (2 steps)"
for z in 0 3; do
    "$BUILD/bin/plait" train "$work/deep.json" --out "$work/deep_z$z" --set parallel.zero=$z \
        >"$work/deep_z$z.log" 2>&1 || { tail -n 20 "$work/deep_z$z.log"; exit 1; }
done

# The classifier in chunks (logits_chunk_mb) against whole logits on a GPT-2 vocabulary
# (50304 padded) with a small body: 2 layers of 128 channels, 8 × 256 tokens a
# micro-batch, whose whole logits are 412 MB; chunks of 64 MiB are 333 rows.
cat >"$work/vocab.json" <<EOF
{"model": {"layers": 2, "heads": 4, "hidden": 128, "vocab": 50257, "padded_vocab": 50304,
           "seq_len": 256, "seed": 7},
 "data": {"train": "$work/train.bin"},
 "batch": {"micro_batch": 8, "grad_accum": 1},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "steps": 11, "checkpoint": {"every": 0, "keep": 1}}
EOF
echo "== plait train: a GPT-2 vocabulary, logits whole and in chunks of 64 MiB (11 steps each)"
for mb in 0 64; do
    OMP_NUM_THREADS=2 "$BUILD/bin/plait" train "$work/vocab.json" --out "$work/logits_$mb" \
        --set logits_chunk_mb=$mb >"$work/logits_$mb.log" 2>&1 ||
        { tail -n 20 "$work/logits_$mb.log"; exit 1; }
done

"$PY" - "$work" <<'EOF'
import json, statistics, sys
work = sys.argv[1]
MB = 1e6
print()
print("per-rank memory: peak resident set after the first step / plait check's prediction (goal: within 10%)")
print(f"  {'layout':<14} {'rank':>4} {'tp,pp,dp':>8} {'predicted':>10} {'allocated':>10} {'peak RSS':>9}"
      f" {'RSS/pred':>8} {'(RSS-base)/pred':>15}")
worst = 0.0
for name in ("dp2_z0", "dp2_z1", "tp2pp2dp2_z1", "pp2", "pp2_zbh1", "pp2_dualpipev", "deep_z0",
             "deep_z3"):
    for r in json.load(open(f"{work}/{name}/run.json"))["memory"]["ranks"]:
        pred, alloc = r["predicted"]["total"] + r["predicted"].get("comm_rings", 0), r["allocated"]["total"]
        rss, base = r["rss_peak_bytes"], r["rss_before_model_bytes"]
        worst = max(worst, abs(rss / pred - 1))
        print(f"  {name:<14} {r['rank']:>4} {r['tp']:>2},{r['pp']},{r['dp']:<3} {pred / MB:>8.1f}MB"
              f" {alloc / MB:>8.1f}MB {rss / MB:>7.1f}MB {rss / pred:>8.3f} {(rss - base) / pred:>15.3f}")
print(f"  worst |RSS/predicted - 1|: {100 * worst:.1f}%  (goal <= 10%)")
print()
print("pipeline bubble: measured (median of the steps after the first) against simulated (goal: within 5 points)")
for name in ("tp2pp2dp2_z1", "pp2", "pp2_zbh1", "pp2_dualpipev"):
    steps = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"step"' in l][1:]
    got = statistics.median(s["parallel"]["bubble_pct"] for s in steps)
    sim = steps[0]["parallel"]["bubble_simulated_pct"]
    print(f"  {name:<14} measured {got:5.1f}%  simulated {sim:5.1f}%  difference {got - sim:+5.1f} points")
print()
print("ZeRO 3 at dp 4 against ZeRO 0 (64 layers × 384 channels): the largest rank's (goal: ZeRO 3 <= 0.35× ZeRO 0)")
def worst(name, f):
    return max(f(r) for r in json.load(open(f"{work}/{name}/run.json"))["memory"]["ranks"])
for what, f in (("peak resident set", lambda r: r["rss_peak_bytes"]),
                ("peak RSS less what the process held before its model",
                 lambda r: r["rss_peak_bytes"] - r["rss_before_model_bytes"]),
                ("predicted", lambda r: r["predicted"]["total"])):
    z0, z3 = worst("deep_z0", f), worst("deep_z3", f)
    print(f"  {what:<52} ZeRO 0 {z0 / MB:7.1f}MB  ZeRO 3 {z3 / MB:7.1f}MB  ratio {z3 / z0:5.3f}")
print()
print("the classifier in chunks of 64 MiB against whole logits (GPT-2 vocabulary, 8 × 256 tokens)")
def rank0(name):
    return json.load(open(f"{work}/{name}/run.json"))["memory"]["ranks"][0]
def step_ms(name):
    steps = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"step"' in l][1:]
    return statistics.median(s["ms"] for s in steps), len(steps)
w, c = rank0("logits_0"), rank0("logits_64")
for what, f in (("predicted activations", lambda r: r["predicted"]["activations"]),
                ("peak resident set", lambda r: r["rss_peak_bytes"])):
    print(f"  {what:<22} whole {f(w) / MB:7.1f}MB  in chunks {f(c) / MB:7.1f}MB  ratio {f(c) / f(w):5.3f}")
(tw, n), (tc, _) = step_ms("logits_0"), step_ms("logits_64")
print(f"  step time, median of {n}: in chunks / whole {tc / tw:5.3f}")
EOF
