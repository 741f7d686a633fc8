#!/usr/bin/env bash
# test_torch_referee.sh — plait-train against the PyTorch referee
# (tests/golden/gpt2_ref.py): the referee checks itself, then for fp32, bf16 and
# fp32 with full recomputation, plait trains a small random case and its step-1
# logits and gradients and every step's loss, lr and grad_norm are compared with
# PyTorch's. Not a speed test (gpt2_ref.py bench is).
# Run from the repository root; PLAIT_BUILD (default ./build) holds bin/plait.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, ROOT, WORK, check, finish

REF=$ROOT/tests/golden/gpt2_ref.py
TIMEOUT_S=${PLAIT_REFEREE_TIMEOUT_S:-600}

# train_and_compare CASEDIR RUNDIR [plait options...]: plait trains the case's
# plan, dumping step 1 to RUNDIR/dump; the referee compares (its table is the
# output check shows on failure).
train_and_compare() {
    local casedir=$1 rundir=$2
    shift 2
    if [ ! -f "$casedir/plan.json" ]; then
        echo "no case in $casedir (creating it failed)"
        return 1
    fi
    if [ ! -x "$PLAIT" ]; then
        echo "no plait binary at $PLAIT (build first, or set PLAIT_BUILD)"
        return 1
    fi
    if ! PLAIT_DUMP_STEP1="$rundir/dump" timeout "$TIMEOUT_S" \
        "$PLAIT" train "$casedir/plan.json" --out "$rundir" "$@" >"$rundir.log" 2>&1; then
        tail -n 30 "$rundir.log"
        echo "plait train $casedir/plan.json --out $rundir $* failed"
        return 1
    fi
    "$PY" "$REF" compare "$casedir" "$rundir"
}

# case_and_compare PRECISION: a fresh case in that precision, trained and compared.
case_and_compare() {
    "$PY" "$REF" case "$WORK/case_$1" --precision "$1" >"$WORK/case_$1.log" 2>&1 || {
        cat "$WORK/case_$1.log"
        return 1
    }
    train_and_compare "$WORK/case_$1" "$WORK/run_$1"
}

# The referee itself (needs no plait): gradcheck, naive attention, and compare
# passing valid runs and failing wrong ones.
check torch_referee_selftest "$PY" "$REF" selftest
check torch_referee_fp32 case_and_compare fp32
check torch_referee_bf16 case_and_compare bf16
# Recomputing activations in backward must not move a number beyond fp32 noise.
check torch_referee_recompute_full \
    train_and_compare "$WORK/case_fp32" "$WORK/run_recompute_full" --set recompute=full
finish
