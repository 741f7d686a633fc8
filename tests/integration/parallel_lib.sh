# parallel_lib.sh — what the tests of parallel layouts share: a layout's run against
# one rank's (losses, gradient norms, memory), stops and resumes to the bit,
# evaluation. Sourced after lib.sh, with $WORK/plan.json (tiny_plan) and COMMON set.

# close A B TOL: every step's loss and gradient norm agree within TOL (relative)
close() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p) if '"step"' in l]
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert len(a) == len(b) == 12, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
assert all(x["tokens"] == y["tokens"] for x, y in zip(a, b)), "a different global batch"
print(f"worst relative difference {worst:.3g} (tolerance {tol})")
sys.exit(0 if worst <= tol else 1)
PYEOF
}

# ref NAME GRAD_ACCUM [--set ...]: the one-rank run of a global batch
ref() {
    local name=$1 accum=$2
    shift 2
    [ -f "$WORK/$name/metrics.jsonl" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" \
            --set batch.grad_accum="$accum" "$@" >"$WORK/$name.log" 2>&1
}

# memory RUN: run.json holds the memory of every rank of the run's layout
# (each coordinate once), and what plait check predicts for each rank's stage
# is what its model allocated, to the byte, kind by kind; the ranks of a stage
# hold the same, and the process's peak resident set holds it all; with more
# than one rank, the shared-memory rings of the collectives are predicted too.
memory() {
    "$PY" - "$1/run.json" <<'PYEOF'
import json, sys
run = json.load(open(sys.argv[1]))
par = run["plan"]["parallel"]
tp, pp, dp, cp = par["tp"], par["pp"], par["dp"], par.get("cp", 1)
mem = run["memory"]
ranks = mem["ranks"]
assert mem["after_step"] >= 1, mem["after_step"]
assert [r["rank"] for r in ranks] == list(range(tp * cp * pp * dp)), [r["rank"] for r in ranks]
assert sorted((r["tp"], r["pp"], r["dp"], r.get("cp", 0)) for r in ranks) == sorted(
    (t, p, d, c) for t in range(tp) for p in range(pp) for d in range(dp) for c in range(cp)
), "coordinates"
kinds = ("params", "grads", "optimizer", "activations")
for r in ranks:
    # beside the model's memory, a multi-rank CPU run predicts its collectives' rings
    want = {k: v for k, v in r["predicted"].items() if k != "comm_rings"}
    got = r["allocated"]
    assert want == got, f"rank {r['rank']}: plait check predicts {want}, the model allocated {got}"
    assert (r["predicted"].get("comm_rings", 0) > 0) == (len(ranks) > 1), r["predicted"]
    assert got["total"] == sum(got[k] for k in kinds) and all(got[k] > 0 for k in kinds), r
    assert r["rss_peak_bytes"] >= r["rss_before_model_bytes"] > 0, r
    assert r["rss_peak_bytes"] >= got["total"], r
for s in range(pp):
    assert len({json.dumps(r["allocated"]) for r in ranks if r["pp"] == s}) == 1, f"stage {s}"
print(f"{len(ranks)} rank(s): predicted == allocated")
PYEOF
}

# layout NAME REF TOL --set ...: a parallel run against its reference, and its memory
layout() {
    local name=$1 reference=$2 tol=$3
    shift 3
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 ||
        { tail -n 20 "$WORK/$name.log"; return 1; }
    close "$WORK/$name/metrics.jsonl" "$WORK/$reference/metrics.jsonl" "$tol" && memory "$WORK/$name"
}

# stops_and_resumes NAME REF --set ...: a run signalled after micro-batch 10 stops at step
# 3 (a pipeline, at the step's end) with a checkpoint; the same command resumes it from
# there, and its metrics are REF's to the bit
stops_and_resumes() {
    local name=$1 reference=$2 rc=0
    shift 2
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=10 "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" \
        "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$WORK/$name.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" \
        >"$WORK/${name}2.log" 2>&1 || return 1
    grep -q "resuming from .*step_00000003_0000" "$WORK/${name}2.log" ||
        { cat "$WORK/${name}2.log"; return 1; }
    metrics_equal "$WORK/$reference/metrics.jsonl" "$WORK/$name/metrics.jsonl"
}

# evaluates_as_one_rank NAME --set ...: 4 steps evaluating at step 4; the layout's
# validation losses are one rank's within 1e-5
evaluates_as_one_rank() {
    local name=$1
    shift
    local val=(--set data.val="$WORK/val.bin" --set data.val_every=4 --set steps=4)
    [ -f "$WORK/val_one/metrics.jsonl" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/val_one" "${COMMON[@]}" "${val[@]}" \
            --set model.layers=4 --set batch.grad_accum=4 >/dev/null 2>&1 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" "${val[@]}" \
        >"$WORK/$name.log" 2>&1 || { tail "$WORK/$name.log"; return 1; }
    "$PY" - "$WORK/val_one/metrics.jsonl" "$WORK/$name/metrics.jsonl" <<'PYEOF'
import json, sys
a, b = ([json.loads(l)["val_loss"] for l in open(p) if '"val_loss"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) >= 1, (a, b)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst <= 1e-5, (a, b)
print(f"{len(a)} evaluations, worst relative difference {worst:.3g}")
PYEOF
}

# stop_resume NAME REF N MICRO [--set ...]: a run stopped by SIGTERM after
# each rank's N-th micro-batch (RANK:N: rank RANK's alone) exits 75 with a
# mid-step checkpoint and the log line of where it stopped (MICRO:
# "micro-batch K of step S"), and resumed, has the metrics of REF (the
# uninterrupted run) to the bit.
stop_resume() {
    local name=$1 reference=$2 n=$3 where=$4 rc=0
    shift 4
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=$n "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" \
        "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "$name: exit $rc"; tail "$WORK/$name.log"; return 1; }
    grep -q "stopping after $where" "$WORK/$name.log" || { cat "$WORK/$name.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" \
        >"$WORK/${name}2.log" 2>&1 || { tail "$WORK/${name}2.log"; return 1; }
    grep -q "resuming from .*mid-step" "$WORK/${name}2.log" || { cat "$WORK/${name}2.log"; return 1; }
    metrics_equal "$WORK/$reference/metrics.jsonl" "$WORK/$name/metrics.jsonl"
}

# uninterrupted NAME [--set ...]: the run stop_resume compares with (once)
uninterrupted() {
    local name=$1
    shift
    [ -f "$WORK/$name/metrics.jsonl" ] ||
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" \
            >"$WORK/$name.log" 2>&1 || { tail "$WORK/$name.log"; return 1; }
}
