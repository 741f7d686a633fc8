#!/usr/bin/env bash
# Resharding: a checkpoint written by one layout resumed by another. Each case
# trains layout A for 10 steps with a checkpoint at step 6 (the reference),
# then resumes that step-6 checkpoint in layout B (the same global batch: dp ×
# grad_accum kept) and compares steps 7-10 with A's. Steps 1-6 are A's own, so
# they agree to the bit; 7-10 agree within the rounding of another summation
# order (measured here: at most 3.4e-8 relative, on the loss and the gradient
# norm; the bound is 1e-6).
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set steps=10 --set model.layers=4 --set data.val=null --set data.val_every=0 --set checkpoint.every=6)

# layout SPEC: "TPxPPxDP[zZ]/ACCUM" as --set options
layout() {
    local spec=$1 dims=${1%%/*} accum=${1##*/} zero=0
    case "$dims" in *z*) zero=${dims##*z}; dims=${dims%%z*} ;; esac
    IFS=x read -r tp pp dp <<<"$dims"
    echo --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.dp="$dp" \
        --set parallel.zero="$zero" --set batch.grad_accum="$accum"
}

# close A B: steps 1-6 identical, 7-10 within 1e-6 relative, the same tokens
close() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p) if '"step"' in l]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 10, (len(a), len(b))
for x, y in zip(a[:6], b[:6]):
    assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a[6:], b[6:]) for k in ("loss", "grad_norm"))
assert all(x["tokens"] == y["tokens"] for x, y in zip(a, b)), "a different global batch"
print(f"steps 7-10: worst relative difference {worst:.3g} (bound 1e-6)")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF
}

# reshard NAME A B: A's reference run, its step-6 checkpoint resumed in B
reshard() {
    local name=$1 a=$2 b=$3 ref=$WORK/$1-ref run=$WORK/$1
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$ref" "${COMMON[@]}" $(layout "$a") >"$ref.log" 2>&1 ||
        { tail -n 20 "$ref.log"; return 1; }
    cp -a "$ref" "$run"
    rm -rf "$run"/checkpoints/step_00000010_0000
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" $(layout "$b") >"$run.log" 2>&1 ||
        { tail -n 20 "$run.log"; return 1; }
    grep -q "resuming from .*step_00000006_0000" "$run.log" || { cat "$run.log"; return 1; }
    close "$run/metrics.jsonl" "$ref/metrics.jsonl"
}

test_3d_zero1_to_one_rank() { reshard a 2x2x2z1/2 1x1x1/4; }
test_one_rank_to_3d_zero1() { reshard b 1x1x1/4 2x2x2z1/2; }
test_four_stages_to_tp_and_dp_zero2() { reshard c 1x4x1/4 2x1x2z2/2; }
test_dp4_zero2_to_dp2_zero1() { reshard d 1x1x4z2/1 1x1x2z1/2; }
test_interleaved_to_zb_h1() {
    reshard e "1x2x1/4 --set parallel.schedule=interleaved --set parallel.virtual_stages=2" \
        "1x2x2/2 --set parallel.schedule=zb-h1"
}

# Hybrid sharding: a checkpoint of dp 4 in two shard groups of 2 (replica 0's
# ranks wrote the slices, the manifest records dp_shard 2) resumed as plain dp 2
# ZeRO 1, and the reverse into 2 × 2 at ZeRO 2 (each rank reading its shard
# rank's slice).
test_hsdp_2x2_to_dp2_zero1() { reshard h "1x1x4z1/1 --set parallel.dp_shard=2" 1x1x2z1/2; }
test_dp2_zero1_to_hsdp_2x2_zero2() { reshard i 1x1x2z1/2 "1x1x4z2/1 --set parallel.dp_replicate=2"; }

# ZeRO 3: the parameters in dp slices too (model-tpT-ppP-dpD.bin, as the
# moments), resumed as dp 2 ZeRO 1, the reverse into tp 2 × dp 2 at ZeRO 3,
# across stages (pp 2 × dp 2 into pp 1 × dp 4: each rank's slices read out of
# other slices), and hybrid sharding's replica-0 slices by one rank.
test_dp4_zero3_to_dp2_zero1() { reshard j 1x1x4z3/1 1x1x2z1/2; }
test_dp2_zero1_to_tp2_dp2_zero3() { reshard k 1x1x2z1/2 2x1x2z3/2; }
test_pp2_dp2_zero3_to_dp4_zero3() { reshard l 1x2x2z3/2 1x1x4z3/1; }
test_hsdp_2x2_zero3_to_one_rank() { reshard m "1x1x4z3/1 --set parallel.dp_shard=2" 1x1x1/4; }
# Context parallelism: ZeRO's slices are over the dp·cp ranks (each cp rank a slice), any
# other layout reads them; the global batch is dp's alone
test_cp2_dp2_zero1_to_one_rank() { reshard n "1x1x2z1/2 --set parallel.cp=2" 1x1x1/4; }
test_one_rank_to_tp2_cp2_zero3() { reshard o 1x1x1/4 "2x1x1z3/4 --set parallel.cp=2"; }
test_cp4_zero2_to_cp2_pp2_zero3() {
    reshard p "1x1x1z2/4 --set parallel.cp=4" "1x2x1z3/4 --set parallel.cp=2"
}

# A checkpoint taken in the middle of a step holds each rank's gradients of
# the unfinished step: only its own layout may take them, and another is
# refused, saying which step and what to do.
test_a_mid_step_checkpoint_refuses_another_layout() {
    local run=$WORK/mid
    # shellcheck disable=SC2046
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=5 "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" \
        $(layout 1x1x2/2) >"$run.log" 2>&1
    [ $? -eq 75 ] || { cat "$run.log"; return 1; }
    ls "$run/checkpoints" | grep -q '_0001$' || { ls "$run/checkpoints"; return 1; }
    # shellcheck disable=SC2046
    expect_error "$WORK/mid2.log" 1 "stopped mid-step \(micro-batch 1 of step 3\) in tp 1 × pp 1 × dp 2.*resume in that layout" \
        "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" $(layout 2x1x1/4)
}

# plait ckpt export gathers a checkpoint in parts into one llm.c file, which
# model.init loads: its logits are the sharded model's. The data is one window
# (B·T + 1 tokens), so that the first step of a resumed run and of a new one
# see the same tokens. Against the same model resharded to one rank: to the
# bit; against the sharded model itself: within its rounding (1e-5 of the
# largest logit; measured 2.6e-7 at 2×2×2).
# export_gives_the_sharded_models_logits NAME LAYOUT
export_gives_the_sharded_models_logits() {
    local name=$1 lay=$2
    head -c 129 "$ROOT/examples/data/tinyshakespeare.txt" >"$WORK/one.txt"
    [ -f "$WORK/one.bin" ] || "$PLAIT" data prepare "$WORK/one.txt" "$WORK/one.bin" >/dev/null ||
        return 1
    local data=(--set data.train="$WORK/one.bin" --set data.shuffle=false) s=$WORK/sharded_$name
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$s" "${COMMON[@]}" "${data[@]}" --set steps=6 \
        $(layout "$lay") >"$s.log" 2>&1 || { tail "$s.log"; return 1; }
    "$PLAIT" ckpt export "$s" --llmc "$WORK/export_$name.bin" || return 1
    cp -a "$s" "$s-one"
    # shellcheck disable=SC2046
    PLAIT_DUMP_STEP1=$s/dump "$PLAIT" train "$WORK/plan.json" --out "$s" "${COMMON[@]}" \
        "${data[@]}" --set steps=7 $(layout "$lay") >"$s.log" 2>&1 || { tail "$s.log"; return 1; }
    # shellcheck disable=SC2046
    PLAIT_DUMP_STEP1=$s-one/dump "$PLAIT" train "$WORK/plan.json" --out "$s-one" "${COMMON[@]}" \
        "${data[@]}" --set steps=7 $(layout 1x1x1/4) >"$s-one.log" 2>&1 ||
        { tail "$s-one.log"; return 1; }
    PLAIT_DUMP_STEP1=$WORK/init_$name/dump "$PLAIT" train "$WORK/plan.json" --out "$WORK/init_$name" \
        "${COMMON[@]}" "${data[@]}" --set steps=1 --set optimizer.warmup_steps=0 --set batch.grad_accum=4 \
        --set model.init="$WORK/export_$name.bin" >"$WORK/init_$name.log" 2>&1 || { tail "$WORK/init_$name.log"; return 1; }
    "$PY" - "$WORK/init_$name/dump/logits.f32" "$s-one/dump/logits.f32" "$s/dump/logits.f32" <<'PYEOF'
import sys, numpy as np
init, one, sharded = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:])
assert init.size == one.size == sharded.size > 0, (init.size, one.size, sharded.size)
assert np.array_equal(init, one), "the exported model's logits are not the resharded model's"
worst = float(np.max(np.abs(init - sharded)) / np.max(np.abs(sharded)))
print(f"exported vs the sharded run: {worst:.3g} of the largest logit")
sys.exit(0 if worst <= 1e-5 else 1)
PYEOF
}

test_export_gives_the_sharded_models_logits() { export_gives_the_sharded_models_logits z1 2x2x2z1/2; }
# ZeRO 3: the parameters gathered out of the dp slices of each stage
test_export_of_zero3_gives_its_logits() { export_gives_the_sharded_models_logits z3 1x2x2z3/2; }

# plait ckpt import, the reverse: an llm.c file as a new run's step-0
# checkpoint, from which plait train (here in 2 × 1 × 2, ZeRO 1) trains exactly
# as a run with model.init of that file does, to the bit; a file of another
# model is refused, naming the dimension.
test_import_trains_as_model_init() {
    local w=$WORK/imp
    "$PLAIT" train "$WORK/plan.json" --out "$w-src" "${COMMON[@]}" --set steps=3 >"$w-src.log" 2>&1 &&
        "$PLAIT" ckpt export "$w-src" --llmc "$w.bin" >/dev/null || { cat "$w-src.log"; return 1; }
    # shellcheck disable=SC2046
    "$PLAIT" ckpt import "$w.bin" "$WORK/plan.json" --out "$w" "${COMMON[@]}" \
        $(layout 2x1x2z1/2) || return 1
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$w" "${COMMON[@]}" $(layout 2x1x2z1/2) >"$w.log" 2>&1 ||
        { cat "$w.log"; return 1; }
    grep -q "resuming from .*step_00000000_0000" "$w.log" || { cat "$w.log"; return 1; }
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$w-init" "${COMMON[@]}" $(layout 2x1x2z1/2) \
        --set model.init="$w.bin" >"$w-init.log" 2>&1 || { cat "$w-init.log"; return 1; }
    metrics_equal "$w-init/metrics.jsonl" "$w/metrics.jsonl" || return 1
    expect_error "$WORK/imp-bad.log" 1 "imp.bin: layers is 4, the plan's model.layers 2" \
        "$PLAIT" ckpt import "$w.bin" "$WORK/plan.json" --out "$WORK/imp-bad" || return 1
    expect_error "$WORK/imp-again.log" 1 "holds 3 checkpoints already \(newest step_00000010_0000\): import into a new run directory" \
        "$PLAIT" ckpt import "$w.bin" "$WORK/plan.json" --out "$w" "${COMMON[@]}"
}

# A refused resume of an imported run never advises --fresh, which would remove the imported
# weights: it says to import them again elsewhere
test_advice_never_removes_imported_weights() {
    local w=$WORK/imp-advice
    [ -f "$WORK/imp.bin" ] || { echo "needs import_trains_as_model_init's imp.bin"; return 1; }
    "$PLAIT" ckpt import "$WORK/imp.bin" "$WORK/plan.json" --out "$w" "${COMMON[@]}" >/dev/null ||
        return 1
    expect_error "$w.log" 1 "holds a run of a different plan \(fields that may not change: optimizer.lr .*import them again into another directory" \
        "$PLAIT" train "$WORK/plan.json" --out "$w" "${COMMON[@]}" --set optimizer.lr=1e-2 || return 1
    ! grep -q -- "run plait train with --fresh" "$w.log" || { cat "$w.log"; return 1; }
    [ -d "$w/checkpoints/step_00000000_0000" ] || { ls -R "$w"; return 1; }
}

# An import whose plan names the checkpoint.dir a running run writes into is
# refused by that directory's lock before it cleans anything: it had removed the
# run's in-flight checkpoint (its .tmp-*), and the run exited 1.
test_import_never_touches_a_running_runs_checkpoints() {
    local w=$WORK/imp-live shared=$WORK/shared-ckpt
    [ -f "$WORK/imp.bin" ] || { echo "needs import_trains_as_model_init's imp.bin"; return 1; }
    PLAIT_DEBUG_SLOW_RANK=0:100 "$PLAIT" train "$WORK/plan.json" --out "$w-run" "${COMMON[@]}" \
        --set checkpoint.dir="$shared" --set checkpoint.every=1 >"$w-run.log" 2>&1 &
    local pid=$! i
    for i in $(seq 200); do grep -q "^step  *2/" "$w-run.log" 2>/dev/null && break; sleep 0.05; done
    expect_error "$w.log" 1 "checkpoint directory $shared is in use by another run" \
        "$PLAIT" ckpt import "$WORK/imp.bin" "$WORK/plan.json" --out "$w" "${COMMON[@]}" \
        --set checkpoint.dir="$shared" || { kill "$pid"; return 1; }
    wait "$pid" || { echo "the running run failed:"; cat "$w-run.log"; return 1; }
}

# Every part says the layers it holds: a manifest whose stages are swapped
# (same sizes, so every count still agrees) is refused by verify and at start,
# naming the part, instead of loading the layers swapped.
test_swapped_stages_are_refused() {
    local run=$WORK/swapped
    # shellcheck disable=SC2046
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" $(layout 1x2x1/2) --set steps=6 \
        >"$run.log" 2>&1 || { tail -n 20 "$run.log"; return 1; }
    "$PY" - "$run/checkpoints/step_00000006_0000/manifest.json" <<'PYEOF' || return 1
import json, sys
m = json.load(open(sys.argv[1]))
assert m["layout"]["stages"] == [[0, 2], [2, 4]], m["layout"]["stages"]
m["layout"]["stages"] = [[2, 4], [0, 2]]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PYEOF
    expect_error "$run.verify" 1 "model-tp0-pp0.bin: its header does not say what the manifest does" \
        "$PLAIT" ckpt verify "$run" || return 1
}

check 3d_zero1_to_one_rank test_3d_zero1_to_one_rank
check one_rank_to_3d_zero1 test_one_rank_to_3d_zero1
check four_stages_to_tp_and_dp_zero2 test_four_stages_to_tp_and_dp_zero2
check dp4_zero2_to_dp2_zero1 test_dp4_zero2_to_dp2_zero1
check interleaved_to_zb_h1 test_interleaved_to_zb_h1
check hsdp_2x2_to_dp2_zero1 test_hsdp_2x2_to_dp2_zero1
check dp2_zero1_to_hsdp_2x2_zero2 test_dp2_zero1_to_hsdp_2x2_zero2
check dp4_zero3_to_dp2_zero1 test_dp4_zero3_to_dp2_zero1
check dp2_zero1_to_tp2_dp2_zero3 test_dp2_zero1_to_tp2_dp2_zero3
check pp2_dp2_zero3_to_dp4_zero3 test_pp2_dp2_zero3_to_dp4_zero3
check hsdp_2x2_zero3_to_one_rank test_hsdp_2x2_zero3_to_one_rank
check cp2_dp2_zero1_to_one_rank test_cp2_dp2_zero1_to_one_rank
check one_rank_to_tp2_cp2_zero3 test_one_rank_to_tp2_cp2_zero3
check cp4_zero2_to_cp2_pp2_zero3 test_cp4_zero2_to_cp2_pp2_zero3
check a_mid_step_checkpoint_refuses_another_layout test_a_mid_step_checkpoint_refuses_another_layout
check export_gives_the_sharded_models_logits test_export_gives_the_sharded_models_logits
check export_of_zero3_gives_its_logits test_export_of_zero3_gives_its_logits
check import_trains_as_model_init test_import_trains_as_model_init
check advice_never_removes_imported_weights test_advice_never_removes_imported_weights
check import_never_touches_a_running_runs_checkpoints test_import_never_touches_a_running_runs_checkpoints
check swapped_stages_are_refused test_swapped_stages_are_refused
finish
