#!/usr/bin/env bash
# test_logits_chunks.sh — the classifier in chunks (logits_chunk_mb): the last stage
# computes its logits a few rows at a time, the loss and dlogits with them, and from
# those the LM head's input and weight gradients, so no micro-batch's logits are held
# whole. Against the same runs with whole logits (logits_chunk_mb 0): one rank and
# every layout that touches the head (tp's split vocabulary and its reductions per
# chunk, sequence parallelism, each pipeline schedule, ZeRO 2 and 3, bf16), evaluation,
# a stop mid-step resumed to the bit, and the memory plait check predicts and the model
# allocates. The tiny model's logits are 256 wide: 0.01 MiB is 10 rows a chunk of 128
# (20 of 256 columns each with tp 2), the last chunk shorter.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0)
source "$(dirname "$0")/parallel_lib.sh" # defines: close, ref, memory, layout, stop_resume, …
CHUNKS=(--set logits_chunk_mb=0.01)
WHOLE=(--set logits_chunk_mb=0)

# activations RUN: the first rank's predicted (= allocated, memory checks) activation bytes
activations() {
    "$PY" -c 'import json, sys
print(json.load(open(sys.argv[1]))["memory"]["ranks"][0]["allocated"]["activations"])' "$1/run.json"
}

# One rank: within 1e-6 of whole logits (the head's weight gradient is summed chunk by
# chunk: measured 1e-7), and the activations smaller by what gpt2_memory.h says: the
# logits (N 128, Vp 256) become one chunk of 10 rows, and the micro-batch keeps the
# head's gradients, (Vp + N)·C with C 32, instead.
test_one_rank_in_chunks_matches_whole_logits() {
    ref one 3 "${WHOLE[@]}" || return 1
    layout one_chunks one 1e-6 "${CHUNKS[@]}" || return 1
    local whole chunked
    whole=$(activations "$WORK/one") && chunked=$(activations "$WORK/one_chunks") || return 1
    local want=$(((128 * 256 - 10 * 256 - (256 + 128) * 32) * 4))
    [ $((whole - chunked)) = "$want" ] ||
        { echo "activations $whole whole, $chunked in chunks: saved $((whole - chunked)), want $want"; return 1; }
    # a chunk that would hold more than the whole keeps the logits whole
    layout one_big_chunks one 0 --set logits_chunk_mb=1 || return 1
    [ "$(activations "$WORK/one_big_chunks")" = "$whole" ] || return 1
    # the same bits twice
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/one_chunks_again" "${COMMON[@]}" \
        --set batch.grad_accum=3 "${CHUNKS[@]}" >"$WORK/one_chunks_again.log" 2>&1 &&
        metrics_equal "$WORK/one_chunks/metrics.jsonl" "$WORK/one_chunks_again/metrics.jsonl"
}

# Tensor parallelism splits the vocabulary: each chunk's row max, sums and target
# logits are reduced over the group; with sequence parallelism the head's input
# gradient is reduce-scattered from the forward's chunks.
test_tensor_parallel_in_chunks_matches_one_rank() {
    ref one 3 "${WHOLE[@]}" || return 1
    layout tp2_chunks one 1e-5 --set parallel.tp=2 "${CHUNKS[@]}" || return 1
    layout tp2_sp_chunks one 1e-5 --set parallel.tp=2 --set parallel.sequence_parallel=true \
        "${CHUNKS[@]}"
}

# Every schedule: the head's gradients ride with the micro-batch's slot from its forward
# to its backward, whatever runs between them (zb-h1 splits the backward; interleaved
# and DualPipeV hold several micro-batches; DualPipeV's loss is on the first stage).
test_pipeline_schedules_in_chunks_match_one_rank() {
    ref one_l4 4 --set model.layers=4 "${WHOLE[@]}" || return 1
    local l4=(--set model.layers=4 --set batch.grad_accum=4 --set parallel.pp=2 "${CHUNKS[@]}")
    layout pp2_chunks one_l4 1e-5 "${l4[@]}" || return 1
    layout pp2_zbh1_chunks one_l4 1e-5 "${l4[@]}" --set parallel.schedule=zb-h1 || return 1
    layout pp2_dualpipev_chunks one_l4 1e-5 "${l4[@]}" --set parallel.schedule=dualpipev || return 1
    ref one_l4x8 8 --set model.layers=4 "${WHOLE[@]}" || return 1
    layout pp2_interleaved_chunks one_l4x8 1e-5 --set model.layers=4 --set batch.grad_accum=8 \
        --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 \
        "${CHUNKS[@]}"
}

# ZeRO 2 hands each micro-batch's gradients over, ZeRO 3 writes the head's into a zeroed
# window and scatters it: the gradient made in the forward must land in both.
test_zero_in_chunks_matches_one_rank() {
    ref one6 6 "${WHOLE[@]}" || return 1
    layout dp2_z2_chunks one6 1e-5 --set parallel.dp=2 --set parallel.zero=2 \
        --set parallel.bucket_mb=0.01 "${CHUNKS[@]}" || return 1
    layout dp2_z3_chunks one6 1e-5 --set parallel.dp=2 --set parallel.zero=3 "${CHUNKS[@]}"
}

# bf16: the chunk's products take the head's bf16 copy as the whole logits' do; within
# the bound of bf16 layouts (test_parallel.sh; measured 1.7e-5).
test_bf16_in_chunks_tracks_bf16_whole() {
    ref one_bf16 3 --set precision=bf16 "${WHOLE[@]}" || return 1
    layout one_bf16_chunks one_bf16 1e-4 --set precision=bf16 "${CHUNKS[@]}"
}

# Evaluation's forward computes the loss alone, in chunks.
test_evaluation_in_chunks_matches_one_rank() {
    evaluates_as_one_rank val_chunks --set model.layers=4 --set batch.grad_accum=4 "${CHUNKS[@]}"
}

# A stop after micro-batch 2 of step 6 keeps the accumulated gradients, the head's
# included; resumed, the run is the uninterrupted one to the bit.
test_stopped_run_in_chunks_resumes_to_the_bit() {
    local dp=(--set parallel.dp=2 --set batch.grad_accum=4 "${CHUNKS[@]}")
    uninterrupted full_dp_chunks "${dp[@]}" &&
        stop_resume stop_dp_chunks full_dp_chunks 22 "micro-batch 2 of step 6" "${dp[@]}"
}

check one_rank_in_chunks_matches_whole_logits test_one_rank_in_chunks_matches_whole_logits
check tensor_parallel_in_chunks_matches_one_rank test_tensor_parallel_in_chunks_matches_one_rank
check pipeline_schedules_in_chunks_match_one_rank test_pipeline_schedules_in_chunks_match_one_rank
check zero_in_chunks_matches_one_rank test_zero_in_chunks_matches_one_rank
check bf16_in_chunks_tracks_bf16_whole test_bf16_in_chunks_tracks_bf16_whole
check evaluation_in_chunks_matches_one_rank test_evaluation_in_chunks_matches_one_rank
check stopped_run_in_chunks_resumes_to_the_bit test_stopped_run_in_chunks_resumes_to_the_bit
finish
