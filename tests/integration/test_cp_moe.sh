#!/usr/bin/env bash
# test_cp_moe.sh — context parallelism (parallel.cp) with mixture of experts (model.moe):
# each sequence over cp ranks, an MoE block's routing still the micro-batch's (the balance
# loss's f_e over every cp rank's choices, the capacity of the micro-batch's N filled in its
# token order, each of a rank's chunks starting from the choices before it). Against one
# rank within 1e-5 over 12 steps, predicted == allocated, with the per-expert loads and
# dropped choices of one rank's metrics and its balance and z losses within 1e-5: E 4, k 2
# with a shared expert, capacity 1.25 (dropping) and a z-loss at cp 2 and 4; cp 2 with dp 2,
# tp 2 (and sequence parallel), pp 2 (1F1B, zb-h1, interleaved) and full recompute; bf16;
# evaluation; cp 2 with expert
# parallelism (ep 2: the cp pair; cp 2 × dp 2 at ep 4); a Llama with grouped-query
# attention; the same bits twice; a stopped cp 2 run resumed to the bit; a cp 2 × ep 2
# checkpoint resumed on one rank (cp 1, ep 1). By hand: each chunk dispatched from 0
# instead of the choices before it, the capacity of the rank's tokens, f_e of the rank's
# choices or the balance coefficient not over cp, each fails every layout (0.2% to 3% off).
# Run from the repository root; PLAIT_BUILD (default ./build) holds bin/plait.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, WORK, check, finish

tiny_plan "$WORK/plan.json"
source "$(dirname "$0")/moe_lib.sh"      # defines: MOE, COMMON, LLAMA, loads_equal, reshard
source "$(dirname "$0")/parallel_lib.sh" # defines: ref, layout, stop_resume, uninterrupted

# as_one_rank NAME --set ...: a layout against one rank's 4 micro-batches a step, and its
# MoE metrics those of one rank
as_one_rank() {
    local name=$1
    shift
    ref one_a4 4 && layout "$name" one_a4 1e-5 "$@" &&
        loads_equal "$WORK/one_a4/metrics.jsonl" "$WORK/$name/metrics.jsonl" 1e-5
}

test_cp2_and_cp4_match_one_rank() {
    as_one_rank cp2 --set parallel.cp=2 --set batch.grad_accum=4 || return 1
    as_one_rank cp4 --set parallel.cp=4 --set batch.grad_accum=4 || return 1
    # the same bits twice
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/cp2_again" "${COMMON[@]}" --set parallel.cp=2 \
        --set batch.grad_accum=4 >"$WORK/cp2_again.log" 2>&1 || { tail "$WORK/cp2_again.log"; return 1; }
    metrics_equal "$WORK/cp2/metrics.jsonl" "$WORK/cp2_again/metrics.jsonl"
}
check cp2_and_cp4_match_one_rank test_cp2_and_cp4_match_one_rank

# the counts summed over each tp rank's cp group (with sequence parallelism, over the block's
# gathered rows); the cp ranks of a stage in one pipeline; full recompute counting again
test_cp2_with_dp2_tp2_pp2_and_recompute_matches_one_rank() {
    as_one_rank cp2dp2 --set parallel.cp=2 --set parallel.dp=2 --set batch.grad_accum=2 || return 1
    as_one_rank tp2cp2 --set parallel.tp=2 --set parallel.cp=2 --set batch.grad_accum=4 || return 1
    as_one_rank tp2cp2_sp --set parallel.tp=2 --set parallel.cp=2 \
        --set parallel.sequence_parallel=true --set batch.grad_accum=4 || return 1
    as_one_rank cp2pp2 --set parallel.cp=2 --set parallel.pp=2 --set batch.grad_accum=4 || return 1
    as_one_rank cp2_full --set parallel.cp=2 --set recompute=full --set batch.grad_accum=4
}
check cp2_with_dp2_tp2_pp2_and_recompute_matches_one_rank \
    test_cp2_with_dp2_tp2_pp2_and_recompute_matches_one_rank

# the schedules that split a backward (an MoE block's weight gradients come with its input
# gradient) or run two chunks a stage, and bf16 (the router's and experts' products on
# their bf16 copies) within bf16's bound of the bf16 one rank (test_moe's)
test_cp2_with_every_schedule_and_bf16_matches_one_rank() {
    local pp=(--set parallel.cp=2 --set parallel.pp=2 --set batch.grad_accum=4)
    as_one_rank cp2pp2_zb "${pp[@]}" --set parallel.schedule=zb-h1 || return 1
    as_one_rank cp2pp2_il "${pp[@]}" --set parallel.schedule=interleaved \
        --set parallel.virtual_stages=2 || return 1
    ref one_bf16 4 --set precision=bf16 &&
        layout cp2_bf16 one_bf16 1e-4 --set precision=bf16 --set parallel.cp=2 \
            --set batch.grad_accum=4
}
check cp2_with_every_schedule_and_bf16_matches_one_rank \
    test_cp2_with_every_schedule_and_bf16_matches_one_rank

# Evaluation (forwards only, their routing the micro-batch's all the same) at cp 2
check evaluation_at_cp2_matches_one_rank evaluates_as_one_rank eval_cp2 --set parallel.cp=2 \
    --set batch.grad_accum=4

# an ep group is ep consecutive ranks of the dp·cp that average the gradients: at cp 2 × dp 1
# ep 2 is the cp pair; at cp 2 × dp 2 ep 4 spans both dp ranks' pairs
test_cp2_with_expert_parallelism_matches_one_rank() {
    as_one_rank cp2_ep2 --set parallel.cp=2 --set parallel.ep=2 --set batch.grad_accum=4 || return 1
    as_one_rank cp2dp2_ep4 --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=4 \
        --set batch.grad_accum=2
}
check cp2_with_expert_parallelism_matches_one_rank test_cp2_with_expert_parallelism_matches_one_rank

# A Llama's MoE (SwiGLU experts) with grouped-query attention, rotary positions by chunk
test_llama_gqa_moe_at_cp2_matches_one_rank() {
    ref one_llama4 4 "${LLAMA[@]}" || return 1
    layout llama_cp2 one_llama4 1e-5 "${LLAMA[@]}" --set parallel.cp=2 --set batch.grad_accum=4 &&
        loads_equal "$WORK/one_llama4/metrics.jsonl" "$WORK/llama_cp2/metrics.jsonl" 1e-5
}
check llama_gqa_moe_at_cp2_matches_one_rank test_llama_gqa_moe_at_cp2_matches_one_rank

# Stopped by SIGTERM at each rank's 22nd micro-batch (the 2nd of step 6, 4 a step): a
# mid-step checkpoint (the routing statistics carried), resumed to the uninterrupted bits
test_a_stopped_cp2_moe_run_resumes_to_the_bit() {
    local cp=(--set parallel.cp=2 --set batch.grad_accum=4)
    uninterrupted full_cp2 "${cp[@]}" || return 1
    stop_resume stop_cp2 full_cp2 22 "micro-batch 2 of step 6" "${cp[@]}"
}
check a_stopped_cp2_moe_run_resumes_to_the_bit test_a_stopped_cp2_moe_run_resumes_to_the_bit

# A cp 2 × ep 2 checkpoint (each ep rank of the cp pair writes its experts) resumed on one
# rank, cp 1 and ep 1: steps 6-12 within 1e-5 of the uninterrupted one rank's
test_a_cp2_ep2_checkpoint_resumes_on_one_rank() {
    ref one_a4 4 || return 1
    reshard cp2_ep2_to_one 20 --set parallel.cp=2 --set parallel.ep=2 --set batch.grad_accum=4 -- \
        --set batch.grad_accum=4 || return 1
    grep -q '"ep": 2' "$WORK/cp2_ep2_to_one/checkpoints/step_00000005_0000/manifest.json"
}
check a_cp2_ep2_checkpoint_resumes_on_one_rank test_a_cp2_ep2_checkpoint_resumes_on_one_rank

finish
