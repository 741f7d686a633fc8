#!/usr/bin/env bash
# test_moe.sh — mixture of experts (model.moe) on the CPU backend: at expert
# parallelism 1, plait-train against the PyTorch fp64 referee
# tests/golden/moe_ref.py (step-1 logits and gradients, every step's loss, lr
# and grad_norm) for a GPT-2 with E 4, k 2 and a shared expert, E 8, k 1 with a
# capacity that drops tokens and a z-loss, and a Llama with an MoE block every
# 2 layers, with full and selective recompute; the referee failing a run whose
# gradients are 0.1% off (by hand: one whose gates are not renormalised fails the
# three referee cases). Then layouts against one rank over 12 steps, predicted ==
# allocated: dp 2 at ZeRO 1, 2 and 3; pp 2 with 1F1B, interleaved, zb-h1 and
# DualPipeV; tp 2 alone, with pp 2 × dp 2 at ZeRO 1 and 3, sequence parallel, and a
# Llama's; bf16 at dp 2 (ZeRO 1 and 3) and pp 2; fp8 at dp 2 ZeRO 3 and pp 2; the
# same bits twice. And plait
# check's active parameters, plait status's experts, plait sample of an MoE
# checkpoint, evaluation at pp 2 × dp 2, a pp 2 checkpoint resumed on one rank, a
# run stopped mid-step resumed to the bit. Then expert parallelism (parallel.ep 2
# and 4) against one rank with every layout it runs with, dropping at capacity with
# ep 1's loads, a mid-step stop resumed to the bit (and refused at another ep), and
# checkpoints resharded across ep.
# Run from the repository root; PLAIT_BUILD (default ./build) holds bin/plait.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, ROOT, WORK, check, finish

REF=$ROOT/tests/golden/moe_ref.py

# train CASE RUN [plait options...]: plait trains the case's plan, dumping its step 1
train() {
    local casedir=$WORK/case_$1 rundir=$WORK/run_$2
    shift 2
    env OMP_NUM_THREADS=1 PLAIT_DUMP_STEP1="$rundir/dump" \
        "$PLAIT" train "$casedir/plan.json" --out "$rundir" "$@" >"$rundir.log" 2>&1 ||
        { tail -n 20 "$rundir.log"; return 1; }
}

# trains_as_the_referee CASE RUN [plait options...]
trains_as_the_referee() {
    train "$@" && "$PY" "$REF" compare "$WORK/case_$1" "$WORK/run_$2"
}

check moe_referee_selftest "$PY" "$REF" selftest

test_gpt2_e4_k2_with_a_shared_expert_matches_the_referee() {
    referee_case "$REF" e4k2 --experts 4 --top-k 2 --shared 1 &&
        trains_as_the_referee e4k2 e4k2 && trains_as_the_referee e4k2 e4k2_full --set recompute=full
}
check gpt2_e4_k2_with_a_shared_expert_matches_the_referee \
    test_gpt2_e4_k2_with_a_shared_expert_matches_the_referee

# ceil(1.0·1·32/8) = 4 tokens an expert of a micro-batch's 32: some dropped
test_gpt2_e8_k1_dropping_at_capacity_matches_the_referee() {
    referee_case "$REF" e8k1 --experts 8 --top-k 1 --capacity 1.0 --z 0.001 &&
        trains_as_the_referee e8k1 e8k1 || return 1
    "$PY" - "$WORK/run_e8k1/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
dropped = sum(r["moe"]["dropped"] for r in rows)
assert dropped > 0, "no token was dropped: the case does not test the capacity"
assert all(abs(sum(r["moe"]["load"]) - 1) < 1e-12 and len(r["moe"]["load"]) == 8 for r in rows)
print(f"{dropped} choices dropped over {len(rows)} steps")
PYEOF
    # plait status reads them back: the last step's experts
    "$PLAIT" status "$WORK/run_e8k1" | grep -E "^  experts +8, each taking [0-9.]+%\.\.[0-9.]+% of the choices, [1-9][0-9]* dropped; balance loss"
}
check gpt2_e8_k1_dropping_at_capacity_matches_the_referee \
    test_gpt2_e8_k1_dropping_at_capacity_matches_the_referee

test_llama_every_2_matches_the_referee() {
    referee_case "$REF" llama --arch llama --layers 4 --every 2 --shared 1 --z 0.001 &&
        trains_as_the_referee llama llama && trains_as_the_referee llama llama_sel \
        --set recompute=selective
}
check llama_every_2_matches_the_referee test_llama_every_2_matches_the_referee

# The referee fails a run that is wrong: the same case's gradients 0.1% off
test_the_referee_refuses_a_wrong_run() {
    local w=$WORK/run_wrong
    rm -rf "$w" && cp -r "$WORK/run_e4k2" "$w" &&
        "$PY" -c 'import numpy as np, sys; g = np.fromfile(sys.argv[1], "<f4"); (g * 1.001).astype("<f4").tofile(sys.argv[1])' "$w/dump/grads.f32" &&
        ! "$PY" "$REF" compare "$WORK/case_e4k2" "$w" >"$w.log"
}
check the_referee_refuses_a_wrong_run test_the_referee_refuses_a_wrong_run

# ---- layouts against one rank (parallel_lib.sh), 12 steps of a 4-layer MoE GPT-2
tiny_plan "$WORK/plan.json"
source "$(dirname "$0")/moe_lib.sh"      # defines: MOE, COMMON, LLAMA, layouts, loads_equal, reshard
source "$(dirname "$0")/parallel_lib.sh" # defines: ref, layout, stop_resume, uninterrupted

test_dp2_zero1_2_3_and_pp2_schedules_match_one_rank() {
    ref one_a4 4 || return 1
    layout dp2_z1 one_a4 1e-5 --set parallel.dp=2 --set parallel.zero=1 \
        --set batch.grad_accum=2 || return 1
    layout dp2_z2 one_a4 1e-5 --set parallel.dp=2 --set parallel.zero=2 \
        --set batch.grad_accum=2 || return 1
    layout dp2_z3 one_a4 1e-5 --set parallel.dp=2 --set parallel.zero=3 \
        --set batch.grad_accum=2 || return 1
    layout pp2 one_a4 1e-5 --set parallel.pp=2 --set batch.grad_accum=4 || return 1
    # interleaved, a layer a chunk: stage 0 holds layers 0 and 2 (no MoE block, no expert)
    layout pp2_interleaved one_a4 1e-5 --set parallel.pp=2 --set parallel.schedule=interleaved \
        --set parallel.virtual_stages=2 --set batch.grad_accum=4 || return 1
    # a split backward (an MoE block's weight gradients come with its input gradient):
    # zb-h1 with dp 2 ZeRO 2, DualPipeV's V
    layout pp2_zb_dp2_z2 one_a4 1e-5 --set parallel.pp=2 --set parallel.schedule=zb-h1 \
        --set parallel.dp=2 --set parallel.zero=2 --set batch.grad_accum=2 || return 1
    layout pp2_dualpipev one_a4 1e-5 --set parallel.pp=2 --set parallel.schedule=dualpipev \
        --set batch.grad_accum=4 || return 1
    # the same bits twice
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/pp2_again" "${COMMON[@]}" --set parallel.pp=2 \
        --set batch.grad_accum=4 >"$WORK/pp2_again.log" 2>&1 || { tail "$WORK/pp2_again.log"; return 1; }
    metrics_equal "$WORK/pp2/metrics.jsonl" "$WORK/pp2_again/metrics.jsonl"
}
check dp2_zero1_2_3_and_pp2_schedules_match_one_rank test_dp2_zero1_2_3_and_pp2_schedules_match_one_rank

# tp 2: each expert split as the MLP is (fc by columns, fcproj by rows), the router whole;
# with pp 2 and dp 2 (ZeRO 1) too, sequence parallel (with full recompute, with dp 2 ZeRO
# 2), and a Llama's SwiGLU experts (gate and up split alike)
test_tp2_matches_one_rank() {
    ref one_a4 4 || return 1
    layout tp2 one_a4 1e-5 --set parallel.tp=2 --set batch.grad_accum=4 || return 1
    layout tp2pp2dp2 one_a4 1e-5 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=2 || return 1
    # sequence parallel: the block's input gathered, its output reduce-scattered
    layout tp2_sp_full one_a4 1e-5 --set parallel.tp=2 --set parallel.sequence_parallel=true \
        --set recompute=full --set batch.grad_accum=4 || return 1
    layout tp2_sp_dp2_z2 one_a4 1e-5 --set parallel.tp=2 --set parallel.sequence_parallel=true \
        --set parallel.dp=2 --set parallel.zero=2 --set batch.grad_accum=2 || return 1
    # ZeRO 3 gathering layer units of two sizes (MoE blocks and dense ones), kept gathered too
    layout tp2pp2dp2_z3_kept one_a4 1e-5 --set parallel.tp=2 --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.zero=3 --set parallel.reshard_after_forward=false \
        --set batch.grad_accum=2 || return 1
    ref one_llama 3 "${LLAMA[@]}" || return 1
    layout llama_tp2 one_llama 1e-5 "${LLAMA[@]}" --set parallel.tp=2 --set batch.grad_accum=3
}
check tp2_matches_one_rank test_tp2_matches_one_rank

# bf16 (the router's and experts' products on their bf16 copies): dp 2 and pp 2 within
# bf16's bound of the existing layouts (test_parallel's) of the bf16 one rank
test_bf16_tracks_bf16_one_rank() {
    ref one_bf16 4 --set precision=bf16 || return 1
    layout bf16_dp2 one_bf16 1e-4 --set precision=bf16 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=2 || return 1
    layout bf16_pp2 one_bf16 1e-4 --set precision=bf16 --set parallel.pp=2 --set batch.grad_accum=4 ||
        return 1
    # ZeRO 3 in bf16: a layer gathered mixed, the experts' biases (and the norms) in fp32
    layout bf16_dp2_z3 one_bf16 1e-4 --set precision=bf16 --set parallel.dp=2 --set parallel.zero=3 \
        --set batch.grad_accum=2
}
check bf16_tracks_bf16_one_rank test_bf16_tracks_bf16_one_rank

# fp8: the attention's and the dense MLPs' products in fp8, the MoE blocks' out of it (fp32);
# ZeRO 3's layer windows quantise only what a layer has; within fp8's bound of the existing
# layouts (test_parallel's 1e-3) of the fp8 one rank, tensor scaling at dp 2 ZeRO 3 and
# block scaling at pp 2
test_fp8_tracks_fp8_one_rank() {
    ref one_fp8 4 --set precision=fp8 &&
        ref one_fp8_block 4 --set precision=fp8 --set fp8_scaling=block || return 1
    layout fp8_dp2_z3 one_fp8 1e-3 --set precision=fp8 --set parallel.dp=2 --set parallel.zero=3 \
        --set batch.grad_accum=2 || return 1
    layout fp8_block_pp2 one_fp8_block 1e-3 --set precision=fp8 --set fp8_scaling=block \
        --set parallel.pp=2 --set batch.grad_accum=4
}
check fp8_tracks_fp8_one_rank test_fp8_tracks_fp8_one_rank

# plait check counts the parameters a token passes through: of each MoE layer's 4
# experts (and the shared one), C=32 wide, 48 deep, each 48·32 + 48 + 32·48 + 32 = 3152
# weights, a token skips 2: 2 layers × 2 × 3152 = 12608 inactive
test_plait_check_counts_active_parameters() {
    "$PLAIT" check "$WORK/plan.json" "${COMMON[@]}" >"$WORK/check.txt" 2>&1 ||
        { cat "$WORK/check.txt"; return 1; }
    "$PY" - "$WORK/check.txt" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"model.moe: 4 experts \(top 2, 1 shared\) 48 wide in 2 of 4 layers; (\d+) "
              r"parameters, (\d+) of them active", text)
assert m, text
total, active = int(m.group(1)), int(m.group(2))
assert total - active == 12608, (total, active)
print(f"{active} of {total} parameters active")
PYEOF
}
check plait_check_counts_active_parameters test_plait_check_counts_active_parameters

# Evaluation (a forward without the MoE losses' gradients, its loss the cross-entropy):
# pp 2 × dp 2 as one rank
check evaluation_at_pp2_dp2_matches_one_rank evaluates_as_one_rank eval_pp2dp2 --set parallel.pp=2 \
    --set parallel.dp=2 --set batch.grad_accum=2

# plait sample decodes an MoE model (each token through its router's experts: the decoder
# against the forward pass is tests/unit/test_decode.c's)
test_plait_sample_decodes_an_moe_checkpoint() {
    ref one_a4 4 || return 1
    "$PLAIT" sample "$WORK/one_a4" --tokens 16 >"$WORK/sample.txt" 2>&1 ||
        { cat "$WORK/sample.txt"; return 1; }
    grep -q "^plait: sample: .*step_00000012_0000" "$WORK/sample.txt" || { cat "$WORK/sample.txt"; return 1; }
}
check plait_sample_decodes_an_moe_checkpoint test_plait_sample_decodes_an_moe_checkpoint

# A checkpoint of a pp 2 run (stopped at step 5's end) resumed on one rank: the experts'
# tensors resharded from the stages' layer blocks; steps 6-12 within 1e-5 of one rank's
test_a_pp2_checkpoint_resumes_on_one_rank() {
    local run=$WORK/resharded rc=0
    ref one_a4 4 || return 1
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=20 "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" \
        --set parallel.pp=2 --set batch.grad_accum=4 >"$run.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$run.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" --set batch.grad_accum=4 \
        >"$run.log2" 2>&1 || { tail "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000005_0000" "$run.log2" || { cat "$run.log2"; return 1; }
    close "$run/metrics.jsonl" "$WORK/one_a4/metrics.jsonl" 1e-5
}
check a_pp2_checkpoint_resumes_on_one_rank test_a_pp2_checkpoint_resumes_on_one_rank

# Stopped by SIGTERM at each rank's 22nd micro-batch (the 2nd of step 6, 4 a step):
# a mid-step checkpoint, resumed to the uninterrupted run's bits; at dp 2 (parts) and
# on one rank (model.bin: plait's version 104 header, which describes the experts)
test_a_stopped_moe_run_resumes_to_the_bit() {
    local dp=(--set parallel.dp=2 --set parallel.zero=1 --set batch.grad_accum=4)
    uninterrupted full_dp2 "${dp[@]}" || return 1
    stop_resume stop_dp2 full_dp2 22 "micro-batch 2 of step 6" "${dp[@]}" || return 1
    uninterrupted full_one_a4 --set batch.grad_accum=4 || return 1
    stop_resume stop_one full_one_a4 22 "micro-batch 2 of step 6" --set batch.grad_accum=4
}
check a_stopped_moe_run_resumes_to_the_bit test_a_stopped_moe_run_resumes_to_the_bit

# ---- expert parallelism (parallel.ep): each MoE layer's experts spread over ep consecutive
# dp ranks, the rows sent to their experts and back by all-to-all, the routed experts'
# gradients summed over the ranks holding them; routing and capacity per rank's tokens,
# as at ep 1 with dp. By hand: a dispatch that swaps one element of one row fails them.

# ep 2 and 4 (E 4, k 2, a shared expert) against one rank within 1e-5, predicted ==
# allocated (the rows from every ep rank): dp 2 and 4 at ep 2 (an expert's gradient
# summed over 2 ranks) and ep 4, with tp 2 (and sequence parallel) and with pp 2 (1F1B,
# zb-h1, interleaved, DualPipeV), full recompute (the exchange again in backward), one
# bucket and many, a Llama's, bf16; the same bits twice
test_ep2_and_ep4_match_one_rank() {
    ref one_a4 4 || return 1
    layouts one_a4 1e-5 <<'LAYOUTS' || return 1
dp2_ep2 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
dp4_ep2 --set parallel.dp=4 --set parallel.ep=2 --set batch.grad_accum=1
dp4_ep4 --set parallel.dp=4 --set parallel.ep=4 --set batch.grad_accum=1
tp2_ep2 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
tp2_sp_ep2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
pp2_ep2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
ep2_full_recompute --set recompute=full --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
ep2_one_bucket --set parallel.dp=2 --set parallel.ep=2 --set parallel.bucket_mb=1000 --set batch.grad_accum=2
pp2_zb_ep2 --set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
pp2_il_ep2 --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2
LAYOUTS
    # DualPipeV (2·pp micro-batches a rank at least) against one rank's 8; a Llama's
    # SwiGLU experts; bf16 within bf16's bound (test_bf16_tracks_bf16_one_rank's)
    ref one_a8 8 && layout pp2_v_ep2 one_a8 1e-5 --set parallel.pp=2 \
        --set parallel.schedule=dualpipev --set parallel.dp=2 --set parallel.ep=2 \
        --set batch.grad_accum=4 || return 1
    ref one_llama4 4 "${LLAMA[@]}" && layout llama_ep2 one_llama4 1e-5 "${LLAMA[@]}" \
        --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2 || return 1
    ref one_bf16 4 --set precision=bf16 && layout bf16_ep2 one_bf16 1e-4 --set precision=bf16 \
        --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp2_ep2_again" "${COMMON[@]}" \
        --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2 \
        >"$WORK/dp2_ep2_again.log" 2>&1 || { tail "$WORK/dp2_ep2_again.log"; return 1; }
    metrics_equal "$WORK/dp2_ep2/metrics.jsonl" "$WORK/dp2_ep2_again/metrics.jsonl"
}
check ep2_and_ep4_match_one_rank test_ep2_and_ep4_match_one_rank

# Full recompute with a split backward (zb-h1): the input-gradient pass reruns the layer,
# its MoE block's all-to-alls with it, and the weight pass reruns only what the attention's
# products read (an MoE block's weight gradients came with its input gradient). Against one
# rank within 1e-5, and the ep group's bytes a step 1.5× those without recompute (a forward
# again beside a forward and a backward; 2× when the weight pass reran the block too)
test_a_split_backwards_weight_pass_exchanges_nothing() {
    local zb=(--set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.dp=2
        --set parallel.ep=2 --set batch.grad_accum=2)
    ref one_a4 4 || return 1
    layout zb_full one_a4 1e-5 "${zb[@]}" --set recompute=full || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/zb_none" "${COMMON[@]}" "${zb[@]}" \
        >"$WORK/zb_none.log" 2>&1 || { tail "$WORK/zb_none.log"; return 1; }
    "$PY" - "$WORK/zb_none/metrics.jsonl" "$WORK/zb_full/metrics.jsonl" <<'PYEOF'
import json, sys
none, full = ([json.loads(l)["parallel"]["bytes"]["ep"] for l in open(p) if '"step"' in l]
              for p in sys.argv[1:3])
ratios = [f / n for n, f in zip(none, full)]
assert len(ratios) == 12 and all(1.45 < r < 1.55 for r in ratios), ratios
print(f"ep bytes with full recompute: {min(ratios):.4f}..{max(ratios):.4f}x those without")
PYEOF
}
check a_split_backwards_weight_pass_exchanges_nothing \
    test_a_split_backwards_weight_pass_exchanges_nothing

# Evaluation (forwards only, their rows exchanged all the same) at dp 4 × ep 2 as one rank
check evaluation_at_ep2_matches_one_rank evaluates_as_one_rank eval_dp4_ep2 --set parallel.dp=4 \
    --set parallel.ep=2 --set batch.grad_accum=1

# E 8, k 1, capacity 1.0 (dropping per rank's tokens): ep 2 and 4 against one rank, and the
# per-expert load and dropped choices of metrics.jsonl those of ep 1 at the same dp
test_ep_with_dropping_matches_one_rank_and_keeps_the_loads() {
    local e8=(--set model.moe.experts=8 --set model.moe.top_k=1 --set model.moe.shared_experts=0
        --set model.moe.capacity_factor=1.0)
    ref one_e8 4 "${e8[@]}" || return 1
    layout e8_dp2 one_e8 1e-5 "${e8[@]}" --set parallel.dp=2 --set batch.grad_accum=2 || return 1
    layout e8_dp2_ep2 one_e8 1e-5 "${e8[@]}" --set parallel.dp=2 --set parallel.ep=2 \
        --set batch.grad_accum=2 || return 1
    layout e8_dp4 one_e8 1e-5 "${e8[@]}" --set parallel.dp=4 --set batch.grad_accum=1 || return 1
    layout e8_dp4_ep4 one_e8 1e-5 "${e8[@]}" --set parallel.dp=4 --set parallel.ep=4 \
        --set batch.grad_accum=1 || return 1
    loads_equal "$WORK/e8_dp2/metrics.jsonl" "$WORK/e8_dp2_ep2/metrics.jsonl" &&
        loads_equal "$WORK/e8_dp4/metrics.jsonl" "$WORK/e8_dp4_ep4/metrics.jsonl"
}
check ep_with_dropping_matches_one_rank_and_keeps_the_loads \
    test_ep_with_dropping_matches_one_rank_and_keeps_the_loads

# Stopped by SIGTERM at each rank's 22nd micro-batch (the 2nd of step 6) at dp 2 × ep 2:
# each ep rank's experts and every rank's gradients in the checkpoint, resumed to the bit
test_a_stopped_ep2_run_resumes_to_the_bit() {
    local ep=(--set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=4)
    uninterrupted full_ep2 "${ep[@]}" || return 1
    stop_resume stop_ep2 full_ep2 22 "micro-batch 2 of step 6" "${ep[@]}"
}
check a_stopped_ep2_run_resumes_to_the_bit test_a_stopped_ep2_run_resumes_to_the_bit

# A mid-step checkpoint's gradients are each rank's own experts': at another ep (the same
# tp, pp and dp) the run refuses it, naming its ep
test_a_mid_step_ep2_checkpoint_is_refused_at_ep1() {
    local run=$WORK/mid_ep2 rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=22 "$PLAIT" train "$WORK/plan.json" --out "$run" \
        "${COMMON[@]}" --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=4 \
        >"$run.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$run.log"; return 1; }
    ! "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" --set parallel.dp=2 \
        --set batch.grad_accum=4 >"$run.log2" 2>&1 || { tail "$run.log2"; return 1; }
    grep -q "stopped mid-step (micro-batch 2 of step 6) in tp 1 × pp 1 × dp 2 (ZeRO 0, 1 chunk(s), ep 2)" \
        "$run.log2" || { cat "$run.log2"; return 1; }
}
check a_mid_step_ep2_checkpoint_is_refused_at_ep1 test_a_mid_step_ep2_checkpoint_is_refused_at_ep1

# Checkpoints across ep: each ep rank writes its experts (model and optim parts by dp
# rank, the manifest's layout saying ep); ep 2 (with tp 2 too) resumes at ep 1 on one
# rank, ep 1's (dp 2) at ep 4; plait sample reads an ep 2 checkpoint
test_ep_checkpoints_reshard() {
    ref one_a4 4 || return 1
    reshard ep2_to_one 10 --set parallel.dp=2 --set parallel.ep=2 --set batch.grad_accum=2 -- \
        --set batch.grad_accum=4 || return 1
    local at=$WORK/ep2_to_one/checkpoints/step_00000005_0000
    grep -q '"ep": 2' "$at/manifest.json" || return 1
    # plait sample gathers every ep rank's experts of it (one process, the whole model)
    "$PLAIT" sample "$at" --tokens 16 >"$WORK/ep2_sample.txt" 2>&1 &&
        grep -q "^plait: sample: .*step_00000005_0000 (step 5, tp 1 × pp 1 × dp 2 ep 2)" \
            "$WORK/ep2_sample.txt" || { cat "$WORK/ep2_sample.txt"; return 1; }
    reshard tp2_ep2_to_one 10 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 \
        --set batch.grad_accum=2 -- --set batch.grad_accum=4 || return 1
    # (a one-rank run's is a whole checkpoint, whose llm.c header holds no experts: dp 2's
    # parts at ep 1)
    reshard dp2_to_ep4 10 --set parallel.dp=2 --set batch.grad_accum=2 -- --set parallel.dp=4 \
        --set parallel.ep=4 --set batch.grad_accum=1
}
check ep_checkpoints_reshard test_ep_checkpoints_reshard

finish
