#!/usr/bin/env bash
# test_torch_referee.sh — plait-train against the PyTorch referee
# (tests/golden/gpt2_ref.py): the referee checks itself, then for fp32, bf16,
# fp32 with full recomputation, and fp32 in two multi-rank layouts (tp 2 × pp 2
# × dp 2 at ZeRO 1 with grad_accum 2, 8 ranks; tp 2 × dp 2 at ZeRO 2, 4 ranks),
# plait trains a small random case and its step-1 logits and gradients (whole:
# the runtime assembles the ranks' shards) and every step's loss, lr and
# grad_norm are compared with PyTorch's. A layout's global batch,
# micro_batch × grad_accum × dp, is its case's micro-batch × grad-accum (the
# referee checks that too). Not a speed test (gpt2_ref.py bench is).
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

# new_case NAME [case options...]: the referee writes a case into $WORK/case_NAME.
new_case() { referee_case "$REF" "$@"; }

# case_and_compare PRECISION: a fresh case in that precision, trained and compared.
case_and_compare() {
    new_case "$1" --precision "$1" && train_and_compare "$WORK/case_$1" "$WORK/run_$1"
}

# layout_and_compare CASE RUN --set ...: the case trained by a gang of ranks as
# processes, one thread each (up to 8 ranks share this machine's cores).
layout_and_compare() {
    OMP_NUM_THREADS=1 train_and_compare "$WORK/case_$1" "$WORK/run_$2" "${@:3}"
}

# The referee itself (needs no plait): gradcheck, naive attention, and compare
# passing valid runs and failing wrong ones.
check torch_referee_selftest "$PY" "$REF" selftest
check torch_referee_fp32 case_and_compare fp32
check torch_referee_bf16 case_and_compare bf16
# Recomputing activations in backward must not move a number beyond fp32 noise.
check torch_referee_recompute_full \
    train_and_compare "$WORK/case_fp32" "$WORK/run_recompute_full" --set recompute=full
# The classifier in chunks (logits_chunk_mb): the case's 96 rows of 256 logits one row
# at a time, the LM head's gradients made in the forward; the dump's logits computed
# whole beside them.
in_chunks() {
    train_and_compare "$WORK/case_$1" "$WORK/run_$1_chunks" --set logits_chunk_mb=0.001 &&
        grep -q "logits_chunk_mb 0.001: the logits 1 row(s) at a time" "$WORK/run_$1_chunks.log"
}
check torch_referee_fp32_logits_in_chunks in_chunks fp32
check torch_referee_bf16_logits_in_chunks in_chunks bf16
# Multi-rank layouts, directly against PyTorch. A case of 4 micro-batches of 3
# a step: 2 on each of dp 2, through a 2-stage 1F1B pipeline of tp 2 ranks.
tp2_pp2_dp2_zero1() {
    new_case fp32_accum4 --grad-accum 4 &&
        layout_and_compare fp32_accum4 tp2_pp2_dp2_zero1 --set parallel.tp=2 --set parallel.pp=2 \
            --set parallel.dp=2 --set parallel.zero=1 --set batch.grad_accum=2
}
check torch_referee_tp2_pp2_dp2_zero1 tp2_pp2_dp2_zero1
# ZeRO 2 holds the step's gradients as dp slices: the case_fp32 batch (2
# micro-batches) as 1 on each of dp 2.
check torch_referee_tp2_dp2_zero2 \
    layout_and_compare fp32 tp2_dp2_zero2 --set parallel.tp=2 --set parallel.dp=2 \
    --set parallel.zero=2 --set batch.grad_accum=1
finish
