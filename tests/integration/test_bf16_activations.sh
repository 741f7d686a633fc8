#!/usr/bin/env bash
# test_bf16_activations.sh — bf16 precision keeps its products' inputs in bf16 (the norms'
# outputs and the MLP's activation: gpt2_act16, kernels/ops.h's bf16 activations), rounded
# once where they are stored instead of where each product reads them. Every product
# rounded them to bf16 anyway, so a run is the same to the bit as the same run with them in
# fp32 (PLAIT_DEBUG_ACTIVATIONS_F32=1), in every layout that moves them (sequence
# parallelism gathers them in bf16, recompute writes them again, zero-bubble's weight pass
# reads them later, a pipeline holds several micro-batches' of them), for GPT-2 and a
# Llama; the memory plait check predicts is what the model allocates, 2 bytes an element
# less; the classifier in chunks writes its dlogits in bf16 for the LM head's backward. fp8
# and MoE models keep them in fp32.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0 --set precision=bf16)
source "$(dirname "$0")/parallel_lib.sh" # defines: memory

# activations RUN: the first rank's allocated activation bytes
activations() {
    "$PY" -c 'import json, sys
print(json.load(open(sys.argv[1]))["memory"]["ranks"][0]["allocated"]["activations"])' "$1/run.json"
}

# smaller NAME: the run's activations in bf16 take fewer bytes than in fp32
smaller() {
    local a16 a32
    a16=$(activations "$WORK/$1") && a32=$(activations "$WORK/$1_f32") || return 1
    [ "$a16" -lt "$a32" ] || { echo "$1: activations $a16 in bf16, $a32 in fp32"; return 1; }
}

# same_bits NAME --set ...: the run in bf16 activations and again in fp32 ones give the same
# metrics and the same final weights to the bit; plait check's prediction is what the
# first allocated
same_bits() {
    local name=$1
    shift
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" \
        >"$WORK/$name.log" 2>&1 || { tail -n 20 "$WORK/$name.log"; return 1; }
    PLAIT_DEBUG_ACTIVATIONS_F32=1 "$PLAIT" train "$WORK/plan.json" --out "$WORK/${name}_f32" \
        "${COMMON[@]}" "$@" >"$WORK/${name}_f32.log" 2>&1 ||
        { tail -n 20 "$WORK/${name}_f32.log"; return 1; }
    metrics_equal "$WORK/$name/metrics.jsonl" "$WORK/${name}_f32/metrics.jsonl" || return 1
    "$PLAIT" ckpt verify "$WORK/$name/checkpoints" >/dev/null || return 1
    local last=$(ls -d "$WORK/$name"/checkpoints/step_* | tail -n 1)
    local last32=$(ls -d "$WORK/${name}_f32"/checkpoints/step_* | tail -n 1)
    for f in "$last"/*.bin; do
        cmp -s "$f" "$last32/$(basename "$f")" || { echo "$(basename "$f") differs"; return 1; }
    done
    memory "$WORK/$name"
}

# One rank: the same bits; the activations 2 bytes smaller for each element of ln1, ln2
# (N·C each, N = 4·32 = 128 rows, C = 32) and the GELU output (N·4C) of both layers and lnf
# (N·C): 2·(2·(2·4096 + 16384) + 4096) = 106,496 bytes.
test_one_rank_same_bits_in_half_the_bytes() {
    same_bits one || return 1
    local a16 a32
    a16=$(activations "$WORK/one") && a32=$(activations "$WORK/one_f32") || return 1
    [ $((a32 - a16)) = 106496 ] || { echo "activations $a32 in fp32, $a16 in bf16"; return 1; }
}

# The classifier in chunks (logits_chunk_mb 0.01: 10 rows of the 256-wide logits at a time)
# writes each chunk's dlogits in bf16, which the LM head's backward reads as they are (every
# product rounded them to bf16 before): the same bits; the activations hold that chunk's
# 10·256 bf16 dlogits beside the rest, 5,120 bytes, so 106,496 − 5,120 = 101,376 less
# than in fp32. tp 2 writes them in the vocabulary-parallel loss's last part.
test_chunked_head_same_bits() {
    same_bits chunks --set logits_chunk_mb=0.01 || return 1
    local a16 a32
    a16=$(activations "$WORK/chunks") && a32=$(activations "$WORK/chunks_f32") || return 1
    [ $((a32 - a16)) = 101376 ] || { echo "activations $a32 in fp32, $a16 in bf16"; return 1; }
    same_bits tp2_chunks --set parallel.tp=2 --set logits_chunk_mb=0.01 && smaller tp2_chunks ||
        return 1
    same_bits tp2_sp_chunks --set parallel.tp=2 --set parallel.sequence_parallel=true \
        --set logits_chunk_mb=0.01 && smaller tp2_sp_chunks || return 1
    same_bits pp2_chunks --set parallel.pp=2 --set batch.grad_accum=4 --set logits_chunk_mb=0.01 &&
        smaller pp2_chunks
}

# A Llama: RMSNorm's output and SwiGLU's in bf16, a grouped-query attention, untied head
test_llama_same_bits() {
    same_bits llama --set model.arch=llama --set model.kv_heads=1 --set model.ffn_hidden=64 &&
        smaller llama
}

# Sequence parallelism gathers the norms' outputs in bf16, half the bytes; with pipeline
# stages each holds several micro-batches' inputs; recompute writes them again
test_layouts_same_bits() {
    same_bits tp2_sp --set parallel.tp=2 --set parallel.sequence_parallel=true &&
        smaller tp2_sp || return 1
    same_bits pp2_1f1b --set parallel.pp=2 --set batch.grad_accum=4 && smaller pp2_1f1b || return 1
    same_bits full_recompute --set recompute=full && smaller full_recompute || return 1
    same_bits selective_recompute --set recompute=selective && smaller selective_recompute
}

# zb-h1's weight pass reads the products' inputs after the input pass; ZeRO 2 at dp 2 and
# context parallelism carry them unchanged
test_split_backward_zero_and_cp_same_bits() {
    same_bits zbh1 --set parallel.pp=2 --set batch.grad_accum=4 --set parallel.schedule=zb-h1 &&
        smaller zbh1 || return 1
    same_bits dp2_z2 --set parallel.dp=2 --set parallel.zero=2 --set parallel.bucket_mb=0.01 &&
        smaller dp2_z2 || return 1
    same_bits cp2 --set parallel.cp=2 && smaller cp2
}

# fp8 quantises fp32 inputs and an MoE block routes them: both keep fp32 activations, the
# debug switch changes nothing
test_fp8_and_moe_keep_fp32_activations() {
    same_bits fp8 --set precision=fp8 || return 1
    [ "$(activations "$WORK/fp8")" = "$(activations "$WORK/fp8_f32")" ] || return 1
    same_bits moe --set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.ffn_hidden=32 ||
        return 1
    [ "$(activations "$WORK/moe")" = "$(activations "$WORK/moe_f32")" ]
}

check one_rank_same_bits_in_half_the_bytes test_one_rank_same_bits_in_half_the_bytes
check chunked_head_same_bits test_chunked_head_same_bits
check llama_same_bits test_llama_same_bits
check layouts_same_bits test_layouts_same_bits
check split_backward_zero_and_cp_same_bits test_split_backward_zero_and_cp_same_bits
check fp8_and_moe_keep_fp32_activations test_fp8_and_moe_keep_fp32_activations
finish
