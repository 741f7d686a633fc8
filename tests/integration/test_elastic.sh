#!/usr/bin/env bash
# Elastic resume: a run whose parallel.dp is "auto" fills the ranks it is
# given (plait train --ranks N) and, resumed with fewer (a node lost), goes on
# with the largest dp that keeps its global batch (grad_accum grows), the
# checkpoint resharded: its losses stay within fp32 rounding of the run that
# never lost a rank (bound 1e-6 relative; measured 1.1e-8).
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0 --set parallel.pp=2 --set parallel.dp=auto
    --set batch.grad_accum=1)

# lose_two NAME [--set ...]: 8 ranks at pp 2 × dp 4, then the run as a lost
# node leaves it, resumed on 6 ranks: dp 2, the checkpoint resharded
lose_two() {
    local full=$WORK/$1 lost=$WORK/$1_lost
    shift
    "$PLAIT" train "$WORK/plan.json" --out "$full" "${COMMON[@]}" "$@" --ranks 8 \
        >"$full.log" 2>&1 || { cat "$full.log"; return 1; }
    grep -q "tp 1 × pp 2 × dp 4 = 8 ranks" "$full.log" || { cat "$full.log"; return 1; }
    # the run as a lost node leaves it: its checkpoint of step 4, nothing newer
    cp -a "$full" "$lost"
    rm -rf "$lost"/checkpoints/step_0000000[89]_* "$lost"/checkpoints/step_0000001*
    "$PLAIT" train "$WORK/plan.json" --out "$lost" "${COMMON[@]}" "$@" --ranks 6 \
        >"$lost.log" 2>&1 || { cat "$lost.log"; return 1; }
    grep -q "parallel.dp auto: 2 data-parallel replicas of tp 1 × pp 2 in 4 ranks (the run had 4); batch.grad_accum 2 (it had 1) keeps its global batch of 4 micro-batches" \
        "$lost.log" && grep -q "resuming from .*step_00000004_0000" "$lost.log" &&
        grep -q "tp 1 × pp 2 × dp 2 = 4 ranks" "$lost.log" || { cat "$lost.log"; return 1; }
    "$PY" - "$lost/metrics.jsonl" "$full/metrics.jsonl" <<'PYEOF'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p) if '"step"' in l]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 12, (len(a), len(b))
assert [x["tokens"] for x in a] == [y["tokens"] for y in b], "a different global batch"
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
print(f"worst relative difference {worst:.3g} (bound 1e-6)")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF
}

test_eight_ranks_lose_two_and_go_on_at_dp_2() { lose_two z0; }

# The same at ZeRO 3: the parameters in slices of 4 on each stage, resharded
# into slices of 2 (measured: within 9e-9 of the run that never lost a rank).
test_eight_ranks_at_zero3_lose_two_and_go_on_at_dp_2() { lose_two z3 --set parallel.zero=3; }

# What a Slurm requeue onto fewer nodes does: the launcher hands plait-train
# the plan with dp still "auto" and a smaller layout; the runtime takes the
# launcher's dp and the grad_accum that keeps the newest checkpoint's global
# batch, records the layout in the run's plan.json, and the losses go on as
# if nothing happened. Here the smaller layout is one plait-train alone.
test_the_runtime_keeps_the_global_batch_when_dp_auto_shrinks() {
    "$PY" - "$WORK/plan.json" "$WORK/auto.json" <<'PYEOF2' || return 1
import json, sys
p = json.load(open(sys.argv[1]))
p["data"].update(val=None, val_every=0)
p["parallel"] = {"dp": "auto"}
p["batch"]["grad_accum"] = 1
json.dump(p, open(sys.argv[2], "w"))
PYEOF2
    "$PLAIT" train "$WORK/auto.json" --out "$WORK/two" --ranks 2 >"$WORK/two.log" 2>&1 ||
        { cat "$WORK/two.log"; return 1; }
    cp -a "$WORK/two" "$WORK/one"
    rm -rf "$WORK"/one/checkpoints/step_0000000[89]_* "$WORK"/one/checkpoints/step_0000001*
    (cd "$WORK" && PLAIT_RUN_DIR=$WORK/one PLAIT_PLAN=$WORK/auto.json \
        "$BUILD/bin/plait-train" >"$WORK/one.log" 2>&1) || { cat "$WORK/one.log"; return 1; }
    grep -q "parallel.dp auto: 1 data-parallel replica (the run had 2); batch.grad_accum 2 (the plan says 1) keeps its global batch of 2 micro-batches" \
        "$WORK/one.log" && grep -q "resuming from .*step_00000004_0000" "$WORK/one.log" ||
        { cat "$WORK/one.log"; return 1; }
    "$PY" - "$WORK/one" "$WORK/two" <<'PYEOF2'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p + "/metrics.jsonl") if '"step"' in l]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 12, (len(a), len(b))
assert [x["tokens"] for x in a] == [y["tokens"] for y in b], "a different global batch"
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
plan = json.load(open(sys.argv[1] + "/plan.json"))
assert plan["parallel"]["dp"] == 1 and plan["batch"]["grad_accum"] == 2, plan["parallel"]
print(f"worst relative difference {worst:.3g} (bound 1e-6)")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF2
}

# A fixed dp that does not fit the ranks given is refused, saying what "auto" would do.
test_a_fixed_dp_that_does_not_fit_is_refused() {
    expect_error "$WORK/fixed.log" 1 "tp 1 × pp 2 × dp 4 = 8 ranks do not fit the 6 this machine is given" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/fixed" "${COMMON[@]}" --set parallel.dp=4 --ranks 6
}

# "auto" tp and pp with --ranks: the cost model chooses, as plait check and the
# other launchers do (layout_choose), says so, and the run's plan records it;
# sequence parallelism takes a tp above 1 (the tiny model's 2 heads: tp 2).
test_auto_tp_and_pp_are_the_cost_models_choice() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/auto" --set data.val=null --set data.val_every=0 \
        --set parallel.tp=auto --set parallel.pp=auto --set parallel.dp=auto \
        --set parallel.sequence_parallel=true --set steps=3 --ranks 2 >"$WORK/auto.log" 2>&1 ||
        { cat "$WORK/auto.log"; return 1; }
    grep -q "parallel: tp 2 × pp 1 × dp 1 on this machine's 2 ranks (the cost model's choice" \
        "$WORK/auto.log" || { cat "$WORK/auto.log"; return 1; }
    "$PY" -c 'import json, sys; p = json.load(open(sys.argv[1]))["parallel"]
assert (p["tp"], p["pp"], p["dp"]) == (2, 1, 1), p' "$WORK/auto/plan.json"
}

# batch.global_batch with dp "auto": 1, 3 and 4 ranks train 16 sequences a step (4
# micro-batches: dp 1 × grad_accum 4, dp 2 × 2 (3 ranks: the most replicas that keep it),
# dp 4 × 1), each run's plan.json says the grad_accum it ran, and the losses agree within
# fp32 rounding (bound 1e-6 relative)
test_a_plans_global_batch_is_kept_on_any_number_of_ranks() {
    local n want=([1]="1 4" [3]="2 2" [4]="4 1")
    for n in 1 3 4; do
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/global$n" --set data.val=null \
            --set data.val_every=0 --set parallel.dp=auto --set batch.grad_accum=null \
            --set batch.global_batch=16 --set steps=6 --ranks "$n" >"$WORK/global$n.log" 2>&1 ||
            { cat "$WORK/global$n.log"; return 1; }
        "$PY" -c 'import json, sys; p = json.load(open(sys.argv[1]))
got = (p["parallel"]["dp"], p["batch"]["grad_accum"], p["batch"]["global_batch"])
want = tuple(int(x) for x in sys.argv[2].split()) + (16,)
assert got == want, f"{sys.argv[1]}: dp, grad_accum, global_batch {got}, want {want}"' \
            "$WORK/global$n/plan.json" "${want[$n]}" || return 1
    done
    "$PY" - "$WORK"/global{1,3,4} <<'PYEOF2'
import json, sys
runs = [[json.loads(l) for l in open(d + "/metrics.jsonl") if '"step"' in l] for d in sys.argv[1:]]
assert all(len(r) == 6 for r in runs), [len(r) for r in runs]
assert all([x["tokens"] for x in r] == [x["tokens"] for x in runs[0]] for r in runs), "tokens differ"
worst = max(abs(x[k] - y[k]) / abs(y[k]) for r in runs[1:] for x, y in zip(r, runs[0])
            for k in ("loss", "grad_norm"))
print(f"worst relative difference {worst:.3g} (bound 1e-6)")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF2
}

# Context parallelism: cp stays as the plan says and dp "auto" fills the rest (--ranks 5
# at cp 2: dp 2, one rank idle), each rank reaching the runtime (here a stand-in beside a
# copy of plait that writes down its env) with PLAIT_CP=2 and its coordinates in the rank
# order, tp fastest, then cp, then dp; a fixed dp that does not fit names cp.
test_cp_ranks_reach_the_runtime_with_their_coordinates() {
    local bin=$WORK/cpbin
    mkdir -p "$bin" "$WORK/cpenv" && cp "$PLAIT" "$bin/plait" || return 1
    printf '#!/bin/sh\nenv | grep "^PLAIT_[A-Z_]*=[0-9]*$" | sort >"%s/env.$PLAIT_RANK"\n' \
        "$WORK/cpenv" >"$bin/plait-train" && chmod +x "$bin/plait-train" || return 1
    "$bin/plait" train "$WORK/plan.json" --out "$WORK/cp" --set parallel.cp=2 \
        --set parallel.dp=auto --set parallel.device=cpu --ranks 5 >"$WORK/cp.log" 2>&1 ||
        { cat "$WORK/cp.log"; return 1; }
    "$PY" - "$WORK/cpenv" <<'PYEOF' || { cat "$WORK/cp.log"; return 1; }
import os, sys
envs = {int(f.split(".")[1]): dict(l.strip().split("=", 1) for l in open(os.path.join(sys.argv[1], f)))
        for f in os.listdir(sys.argv[1])}
assert sorted(envs) == [0, 1, 2, 3], sorted(envs)
for r, e in envs.items():
    want = {"PLAIT_WORLD_SIZE": "4", "PLAIT_TP": "1", "PLAIT_CP": "2", "PLAIT_PP": "1",
            "PLAIT_DP": "2", "PLAIT_CP_RANK": str(r % 2), "PLAIT_DP_RANK": str(r // 2)}
    assert all(e.get(k) == v for k, v in want.items()), (r, e)
PYEOF
    expect_error "$WORK/cpfixed.log" 1 "tp 1 × cp 2 × pp 1 × dp 4 = 8 ranks do not fit the 6" \
        "$bin/plait" train "$WORK/plan.json" --out "$WORK/cpfixed" --set parallel.cp=2 \
        --set parallel.dp=4 --set parallel.device=cpu --ranks 6
}

check eight_ranks_lose_two_and_go_on_at_dp_2 test_eight_ranks_lose_two_and_go_on_at_dp_2
check eight_ranks_at_zero3_lose_two_and_go_on_at_dp_2 test_eight_ranks_at_zero3_lose_two_and_go_on_at_dp_2
check auto_tp_and_pp_are_the_cost_models_choice test_auto_tp_and_pp_are_the_cost_models_choice
check a_fixed_dp_that_does_not_fit_is_refused test_a_fixed_dp_that_does_not_fit_is_refused
check cp_ranks_reach_the_runtime_with_their_coordinates \
    test_cp_ranks_reach_the_runtime_with_their_coordinates
check the_runtime_keeps_the_global_batch_when_dp_auto_shrinks \
    test_the_runtime_keeps_the_global_batch_when_dp_auto_shrinks
check a_plans_global_batch_is_kept_on_any_number_of_ranks \
    test_a_plans_global_batch_is_kept_on_any_number_of_ranks
finish
