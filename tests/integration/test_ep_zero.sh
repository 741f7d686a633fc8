#!/usr/bin/env bash
# test_ep_zero.sh — expert parallelism (parallel.ep) with ZeRO 1, 2 and 3, hybrid sharding
# and the moments offloaded, on the CPU backend: ZeRO slices each ep rank's part over its
# expert peers (the ranks holding the same experts), the ep group's ranks then holding the
# same dense slice, summed over them too (plan_zero_slices). Layouts against one rank
# within 1e-5 over test_moe's 12 steps, predicted == allocated: ep 2 at dp 4 with ZeRO 1,
# 2 and 3 (3 kept gathered too), with tp 2 (ZeRO 1), pp 2 (ZeRO 2 with 1F1B, zb-h1 and
# DualPipeV's lanes, ZeRO 3), cp 2 (dp 2 × cp 2, ZeRO 2 and 3), bf16 (ZeRO 3, within bf16's bound) and a
# Llama's experts (ZeRO 2); ep 2 at dp 2 and ep 4 at dp 4, whose expert peers are one
# rank each (nothing sliced: ZeRO 0's sums), with tp 2 and pp 2 too;
# HSDP 4 × 2 at ep 2 (ZeRO 2 and 3) and 2 × 2 (ZeRO 2); evaluation at ZeRO 3; plait check
# saying what ZeRO slices; nvme offload at dp 4 × ep 2 ZeRO 1 (each rank's files its
# slice) and "host" (a no-op, said so); the same bits twice; a stopped dp 4 × ep 2 ZeRO 2
# run resumed to the bit; a dp 4 × ep 2 ZeRO 3 checkpoint resumed at ep 1 ZeRO 0, at
# dp 4 × ep 4 ZeRO 1 and dp 4 × ep 2 ZeRO 1, a dp 2 ZeRO 1 one at dp 4 × ep 2 ZeRO 2. By
# hand: the dense slice not summed over the ep group, or the parts sliced over the whole
# shard group, fails the layouts; a checkpoint's slices read from the wrong ep rank's files
# fail the reshard.
# Run from the repository root; PLAIT_BUILD (default ./build) holds bin/plait.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, ROOT, WORK, check, finish
tiny_plan "$WORK/plan.json"
source "$(dirname "$0")/moe_lib.sh"      # defines: MOE, COMMON, LLAMA, layouts, reshard
source "$(dirname "$0")/parallel_lib.sh" # defines: ref, layout, stop_resume, uninterrupted

# ep 2 and 4 with ZeRO against one rank (E 4, k 2, a shared expert), predicted ==
# allocated: at dp 4 × ep 2 each part sliced over 2 expert peers (ZeRO 1, 2 with many
# buckets and one, 3 released after each pass and kept gathered; with tp 2, with pp 2 at
# ZeRO 2 and 3, 1F1B and zb-h1, DualPipeV's two lanes at ZeRO 2; at cp 2 × dp 2, whose
# dp·cp ranks fold); at dp 2 × ep 2 and dp 4 × ep 4 the expert peers are one rank each
# (nothing sliced: ZeRO 0's sums), with tp 2 and pp 2 too; the same bits twice
test_ep_with_zero_matches_one_rank() {
    ref one_a4 4 || return 1
    layouts one_a4 1e-5 <<'LAYOUTS' || return 1
dp4_ep2_z1 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1 --set batch.grad_accum=1
dp4_ep2_z2 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=1
dp4_ep2_z2_one_bucket --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set parallel.bucket_mb=1000 --set batch.grad_accum=1
dp4_ep2_z3 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=1
dp4_ep2_z3_kept --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set parallel.reshard_after_forward=false --set batch.grad_accum=1
tp2_dp4_ep2_z1 --set parallel.tp=2 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1 --set batch.grad_accum=1
pp2_dp4_ep2_z2 --set parallel.pp=2 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=1
pp2_dp4_ep2_z3 --set parallel.pp=2 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=1
cp2_dp2_ep2_z2 --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=2
cp2_dp2_ep2_z3 --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=2
dp2_ep2_z1 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1 --set batch.grad_accum=2
dp2_ep2_z2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=2
dp2_ep2_z3 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=2
dp4_ep4_z2 --set parallel.dp=4 --set parallel.ep=4 --set parallel.zero=2 --set batch.grad_accum=1
tp2_dp2_ep2_z1 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1 --set batch.grad_accum=2
pp2_dp2_ep2_z2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=2
pp2_zb_dp2_ep2_z2 --set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=2
LAYOUTS
    # zb-h1 (a split backward: the gradients handed over at its quiescent points) at dp 4
    # against one rank's 8 micro-batches
    ref one_a8 8 && layout pp2_zb_dp4_ep2_z2 one_a8 1e-5 --set parallel.pp=2 \
        --set parallel.schedule=zb-h1 --set parallel.dp=4 --set parallel.ep=2 \
        --set parallel.zero=2 --set batch.grad_accum=2 || return 1
    # DualPipeV's pairs as two lanes (one's all-to-all beside the other's compute) at ZeRO 2,
    # against one rank's 16 micro-batches
    ref one_a16 16 && layout pp2_v_dp4_ep2_z2 one_a16 1e-5 --set parallel.pp=2 \
        --set parallel.schedule=dualpipev --set parallel.dp=4 --set parallel.ep=2 \
        --set parallel.zero=2 --set batch.grad_accum=4 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp4_ep2_z2_again" "${COMMON[@]}" \
        --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=1 \
        >"$WORK/dp4_ep2_z2_again.log" 2>&1 || { tail "$WORK/dp4_ep2_z2_again.log"; return 1; }
    metrics_equal "$WORK/dp4_ep2_z2/metrics.jsonl" "$WORK/dp4_ep2_z2_again/metrics.jsonl"
}
check ep_with_zero_matches_one_rank test_ep_with_zero_matches_one_rank

# bf16 at dp 4 × ep 2 ZeRO 3 (a layer gathered mixed over the expert peers: its matrices
# from the slice's bf16 copy, the experts' biases and the norms in fp32) within bf16's bound
# of the bf16 one rank (test_moe's); a Llama's SwiGLU experts at ZeRO 2
test_bf16_and_llama_with_ep_and_zero_match_one_rank() {
    ref one_bf16 4 --set precision=bf16 && layout bf16_dp4_ep2_z3 one_bf16 1e-4 \
        --set precision=bf16 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 \
        --set batch.grad_accum=1 || return 1
    ref one_llama4 4 "${LLAMA[@]}" && layout llama_dp4_ep2_z2 one_llama4 1e-5 "${LLAMA[@]}" \
        --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=1
}
check bf16_and_llama_with_ep_and_zero_match_one_rank test_bf16_and_llama_with_ep_and_zero_match_one_rank

# Evaluation (forwards only, each layer gathered over the expert peers) at dp 4 × ep 2
# ZeRO 3 as one rank
check evaluation_at_ep2_zero3_matches_one_rank evaluates_as_one_rank eval_dp4_ep2_z3 \
    --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=1

# says FILE LINE: FILE has LINE (an extended regex) as a whole line
says() {
    grep -qE "^$2\$" "$1" || { cat "$1"; return 1; }
}

# plait check says what ZeRO slices with ep: over 2 expert peers at dp 4 × ep 2 (and each
# stage's memory); nothing at dp 4 × ep 4, as the run of it says too
test_plait_check_says_how_zero_slices_with_ep() {
    local ep
    for ep in 2 4; do
        "$PLAIT" check "$WORK/plan.json" "${COMMON[@]}" --set parallel.dp=4 --set parallel.ep=$ep \
            --set parallel.zero=2 >"$WORK/check_ep$ep.txt" 2>&1 || { cat "$WORK/check_ep$ep.txt"; return 1; }
    done
    says "$WORK/check_ep2.txt" "  ZeRO 2 with parallel.ep: each rank's part sliced over its 2 expert peers in the shard group, the dense slices summed over the ep group too" &&
        says "$WORK/check_ep2.txt" "  the most loaded rank by ZeRO stage at dp 4: 0 [0-9.]+ MB, 1 [0-9.]+ MB, 2 [0-9.]+ MB, 3 [0-9.]+ MB" &&
        says "$WORK/check_ep4.txt" "  ZeRO 2 with parallel.ep: a shard group's expert peers are one rank each, so nothing is sliced; the gradients are summed as at ZeRO 0" &&
        grep -q "parallel.zero 2 with parallel.ep 4: a shard group's expert peers are one rank each" \
            "$WORK/dp4_ep4_z2/train.log"
}
check plait_check_says_how_zero_slices_with_ep test_plait_check_says_how_zero_slices_with_ep

# Hybrid sharding at ep 2: 4 × 2 (8 ranks), the slices over a shard group's 2 expert peers,
# the dense part summed over the ep group, then every slice over the replicas (ZeRO 2 and
# 3); 2 × 2, where a shard group's expert peers are one rank: ZeRO 0's sums in the shard
# group (the experts' over no one, the rest over the shard group), then the replicas'
test_hsdp_with_ep_matches_one_rank() {
    local hsdp=(--set parallel.dp=8 --set parallel.dp_shard=4 --set parallel.ep=2
        --set batch.grad_accum=1)
    ref one_a8 8 || return 1
    layout hsdp4x2_ep2_z2 one_a8 1e-5 "${hsdp[@]}" --set parallel.zero=2 || return 1
    layout hsdp4x2_ep2_z3 one_a8 1e-5 "${hsdp[@]}" --set parallel.zero=3 || return 1
    ref one_a4 4 || return 1
    layout hsdp2x2_ep2_z2 one_a4 1e-5 --set parallel.dp=4 --set parallel.dp_shard=2 \
        --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=1
}
check hsdp_with_ep_matches_one_rank test_hsdp_with_ep_matches_one_rank

# The moments in files (parallel.offload "nvme", windows of ~700 floats) at dp 4 × ep 2
# ZeRO 1: each rank's files hold its slice, in memory only the windows; the same bits as
# the moments in memory, and as "host" (on CPU ranks a no-op, said so)
test_offload_with_ep_matches_in_memory() {
    local z1=(--set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1 --set batch.grad_accum=1)
    ref one_a4 4 && uninterrupted dp4_ep2_z1_mem "${z1[@]}" || return 1
    layout ep2_nvme one_a4 1e-5 "${z1[@]}" --set parallel.offload=nvme \
        --set parallel.offload_dir="$WORK/moments" --set parallel.offload_window_mb=0.0027 || return 1
    metrics_equal "$WORK/dp4_ep2_z1_mem/metrics.jsonl" "$WORK/ep2_nvme/metrics.jsonl" || return 1
    "$PY" - "$WORK/dp4_ep2_z1_mem/run.json" "$WORK/ep2_nvme/run.json" <<'PYEOF'
import json, sys
mem, nvme = ([r["allocated"]["optimizer"] for r in json.load(open(p))["memory"]["ranks"]]
             for p in sys.argv[1:3])
assert all(n < m for n, m in zip(nvme, mem)), (nvme, mem)
print(f"optimizer memory a rank: {nvme[0]} bytes offloaded, {mem[0]} in memory")
PYEOF
    # "host" on CPU ranks: where the state is already, said so
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/ep2_host" "${COMMON[@]}" "${z1[@]}" \
        --set parallel.offload=host >"$WORK/ep2_host.log" 2>&1 || { tail "$WORK/ep2_host.log"; return 1; }
    grep -q 'parallel.offload "host": on CPU ranks the optimizer state is in host memory already; nothing moves' \
        "$WORK/ep2_host.log" || { cat "$WORK/ep2_host.log"; return 1; }
    metrics_equal "$WORK/dp4_ep2_z1_mem/metrics.jsonl" "$WORK/ep2_host/metrics.jsonl"
}
check offload_with_ep_matches_in_memory test_offload_with_ep_matches_in_memory

# Stopped by SIGTERM at each rank's 22nd micro-batch (the 2nd of step 6) at dp 4 × ep 2
# ZeRO 2: each rank's gradient slice in the checkpoint, resumed to the bit
test_a_stopped_zero2_ep2_run_resumes_to_the_bit() {
    local z2=(--set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set batch.grad_accum=4)
    uninterrupted full_ep2_z2 "${z2[@]}" || return 1
    stop_resume stop_ep2_z2 full_ep2_z2 22 "micro-batch 2 of step 6" "${z2[@]}"
}
check a_stopped_zero2_ep2_run_resumes_to_the_bit test_a_stopped_zero2_ep2_run_resumes_to_the_bit

# A ZeRO 3 checkpoint at dp 4 × ep 2 (each ep rank's parameters and moments sliced over its
# expert peers) resumes on one rank at ZeRO 0, at dp 4 × ep 4 ZeRO 1 and at dp 4 × ep 2
# ZeRO 1; a dp 2 ZeRO 1 one (ep 1) at dp 4 × ep 2 ZeRO 2
test_zero3_ep2_checkpoints_reshard() {
    local z3=(--set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set batch.grad_accum=1)
    ref one_a4 4 || return 1
    reshard z3ep2_to_one 5 "${z3[@]}" -- --set batch.grad_accum=4 || return 1
    grep -q '"ep": 2' "$WORK/z3ep2_to_one/checkpoints/step_00000005_0000/manifest.json" || return 1
    reshard z3ep2_to_ep4_z1 5 "${z3[@]}" -- --set parallel.dp=4 --set parallel.ep=4 \
        --set parallel.zero=1 --set batch.grad_accum=1 || return 1
    # into slices over the expert peers: ZeRO 3 to 1 at dp 4 × ep 2, and dp 2 (ep 1, ZeRO 1)
    # to dp 4 × ep 2 ZeRO 2
    reshard z3ep2_to_z1ep2 5 "${z3[@]}" -- --set parallel.dp=4 --set parallel.ep=2 \
        --set parallel.zero=1 --set batch.grad_accum=1 || return 1
    reshard dp2_z1_to_ep2_z2 10 --set parallel.dp=2 --set parallel.zero=1 \
        --set batch.grad_accum=2 -- --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 \
        --set batch.grad_accum=1
}
check zero3_ep2_checkpoints_reshard test_zero3_ep2_checkpoints_reshard

finish
