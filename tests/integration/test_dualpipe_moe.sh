#!/usr/bin/env bash
# test_dualpipe_moe.sh — DualPipeV with experts over ep ranks: each pair of its main
# steps (a forward of one chunk beside a backward of the other) run as two lanes, the
# experts' all-to-all of one moving while the other computes (runtime/lanes.h). At
# pp 2 × dp 2 × ep 2 and pp 4 × dp 2 × ep 2 (test_moe.sh's MoE: E 4, k 2, a shared
# expert, capacity), an MoE block in every layer (both lanes switching back and forth),
# tp 2 sequence parallel (each lane its own gathered rows) and cp 2 against one rank
# within 1e-5, predicted == allocated (the second lane's scratch counted); the lanes
# switched (the count rank 0 logs: none when the passes ran one after the other); overlapped and
# serial (PLAIT_DEBUG_NO_MOE_OVERLAP=1) the same bits, twice the same bits; the ep
# group's bytes and waits in metrics.jsonl; full and selective recompute with the lanes
# (each lane its copy of the buffers recompute reruns) as one rank and serial to the bit,
# full beside dense layers, tp 2 sequence parallel and cp 2 too; a run stopped and resumed
# to the bit.
# Dense DualPipeV: test_parallel.sh's test_dualpipev_matches_one_rank.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, WORK, check, finish

tiny_plan "$WORK/plan.json"
source "$(dirname "$0")/moe_lib.sh"      # defines: MOE, COMMON
source "$(dirname "$0")/parallel_lib.sh" # defines: ref, layout, stops_and_resumes
V=(--set parallel.schedule=dualpipev --set parallel.dp=2 --set parallel.ep=2)
VP2=("${V[@]}" --set parallel.pp=2 --set batch.grad_accum=4) # 8 micro-batches a step

# serial NAME RUN --set ...: the layout RUN ran overlapped, run again with
# PLAIT_DEBUG_NO_MOE_OVERLAP=1 as NAME: its pairs one pass after the other (as it says,
# switching nothing), and RUN's metrics to the bit
serial() {
    local name=$1 run=$2
    shift 2
    PLAIT_DEBUG_NO_MOE_OVERLAP=1 "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" \
        "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 || { tail "$WORK/$name.log"; return 1; }
    grep -q "run one after the other (PLAIT_DEBUG_NO_MOE_OVERLAP=1)" "$WORK/$name.log" &&
        ! switched "$name" >/dev/null || { cat "$WORK/$name.log"; return 1; }
    metrics_equal "$WORK/$run/metrics.jsonl" "$WORK/$name/metrics.jsonl"
}

# the overlapped pp 2 run the later checks compare with (once), against one rank's
overlapped_pp2() {
    ref one_a8 8 || return 1
    [ -f "$WORK/v_pp2/metrics.jsonl" ] || layout v_pp2 one_a8 1e-5 "${VP2[@]}"
}

# switched RUN: the run's two lanes switched at its all-to-alls (rank 0's count > 0)
switched() {
    local n
    n=$(sed -n "s/.*DualPipeV's pairs: \([0-9]*\) lane switches.*/\1/p" "$WORK/$1.log")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "$1: no lane switched (${n:-no count})"; return 1; }
    echo "$1: $n lane switches on rank 0"
}

# pp 2 (layers 0 and 3 on stage 0, 1 and 2 on stage 1: one MoE block a stage) and pp 4
# (8 layers, a layer a chunk), 2·pp micro-batches a rank
test_dualpipev_ep2_matches_one_rank_with_the_lanes_switching() {
    overlapped_pp2 && switched v_pp2 || return 1
    ref one_l8 16 --set model.layers=8 || return 1
    layout v_pp4 one_l8 1e-5 "${V[@]}" --set parallel.pp=4 --set model.layers=8 \
        --set batch.grad_accum=8 && switched v_pp4
}
check dualpipev_ep2_matches_one_rank_with_the_lanes_switching \
    test_dualpipev_ep2_matches_one_rank_with_the_lanes_switching

# an MoE block in every layer: both passes of a pair exchange, the baton going back and
# forth; with tp 2 sequence parallel each lane gathers its rows into its own buffer; at
# cp 2 (ep 2 over the cp pair) each lane counts its choices over the cp group and rings
# its attention, collectives posted in the same order on both ranks
test_both_lanes_exchanging_tp2_sequence_parallel_and_cp2_match_one_rank() {
    ref one_e1 8 --set model.moe.every=1 || return 1
    layout v_every1 one_e1 1e-5 "${V[@]}" --set parallel.pp=2 --set model.moe.every=1 \
        --set batch.grad_accum=4 && switched v_every1 || return 1
    ref one_a8 8 || return 1
    layout v_tp2_sp one_a8 1e-5 "${V[@]}" --set parallel.pp=2 --set parallel.tp=2 \
        --set parallel.sequence_parallel=true --set batch.grad_accum=4 && switched v_tp2_sp || return 1
    layout v_cp2 one_a8 1e-5 --set parallel.schedule=dualpipev --set parallel.pp=2 \
        --set parallel.cp=2 --set parallel.ep=2 --set batch.grad_accum=8 && switched v_cp2
}
check both_lanes_exchanging_tp2_sequence_parallel_and_cp2_match_one_rank \
    test_both_lanes_exchanging_tp2_sequence_parallel_and_cp2_match_one_rank

# The lanes change the order the passes compute in, never a bit: the serial run's metrics
# (which says so, and switches nothing) and the overlapped run's again are v_pp2's; the
# ep group's traffic is in metrics.jsonl every step
test_overlapped_and_serial_give_the_same_bits() {
    overlapped_pp2 && serial v_serial v_pp2 "${VP2[@]}" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/v_again" "${COMMON[@]}" "${VP2[@]}" \
        >"$WORK/v_again.log" 2>&1 || { tail "$WORK/v_again.log"; return 1; }
    metrics_equal "$WORK/v_pp2/metrics.jsonl" "$WORK/v_again/metrics.jsonl" || return 1
    "$PY" - "$WORK/v_pp2/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l)["parallel"] for l in open(sys.argv[1]) if '"step"' in l]
assert len(rows) == 12 and all(r["bytes"]["ep"] > 0 and r["wait_ms"]["ep"] >= 0 for r in rows), rows
print(f"ep: {sum(r['bytes']['ep'] for r in rows) / 12:.0f} bytes a rank a step")
PYEOF
}
check overlapped_and_serial_give_the_same_bits test_overlapped_and_serial_give_the_same_bits

# Recompute keeps what it reruns in one copy every micro-batch shares, and a backward reads
# it across its MoE blocks' exchanges, where the other lane's forward writes its own: each
# lane has its copy (predicted == allocated). Full recompute reruns the whole layer, the
# MoE block's exchanges and buffers with it; selective the attention, read after the
# block's backward, so a chunk of two layers (8 layers, an MoE block in each) has the
# forward's second attention run while the backward's block exchanges. Both match one rank
# with the lanes switching, and their serial runs to the bit.
test_full_and_selective_recompute_with_the_lanes_match_one_rank() {
    local L8=("${VP2[@]}" --set model.layers=8 --set model.moe.every=1) r
    ref one_l8_e1 8 --set model.layers=8 --set model.moe.every=1 || return 1
    for r in full selective; do
        layout "v_$r" one_l8_e1 1e-5 "${L8[@]}" --set recompute=$r && switched "v_$r" &&
            serial "v_${r}_serial" "v_$r" "${L8[@]}" --set recompute=$r || return 1
    done
}
check full_and_selective_recompute_with_the_lanes_match_one_rank \
    test_full_and_selective_recompute_with_the_lanes_match_one_rank

# Full recompute with the lanes beside a dense MLP's layer in each chunk (every other layer
# an MoE block: the dense MLP's buffers one copy both lanes share, as its layer exchanges
# nothing), with tp 2 sequence parallel (the lanes' gathered rows) and at cp 2 (each lane
# counting its choices and ringing its attention again in its backward), as one rank
test_full_recompute_with_the_lanes_beside_dense_layers_tp2_sp_and_cp2() {
    local L8=(--set model.layers=8 --set recompute=full)
    ref one_l8_a8 8 --set model.layers=8 || return 1
    layout v_full_mixed one_l8_a8 1e-5 "${VP2[@]}" "${L8[@]}" && switched v_full_mixed || return 1
    ref one_l8_e1 8 --set model.layers=8 --set model.moe.every=1 || return 1
    L8+=(--set model.moe.every=1)
    layout v_full_tp2_sp one_l8_e1 1e-5 "${VP2[@]}" "${L8[@]}" --set parallel.tp=2 \
        --set parallel.sequence_parallel=true && switched v_full_tp2_sp || return 1
    layout v_full_cp2 one_l8_e1 1e-5 "${L8[@]}" --set parallel.schedule=dualpipev \
        --set parallel.pp=2 --set parallel.cp=2 --set parallel.ep=2 --set batch.grad_accum=8 &&
        switched v_full_cp2
}
check full_recompute_with_the_lanes_beside_dense_layers_tp2_sp_and_cp2 \
    test_full_recompute_with_the_lanes_beside_dense_layers_tp2_sp_and_cp2

# Signalled after micro-batch 10, the run stops at step 3's end (DualPipeV stops only there)
# and resumes to the bit of the uninterrupted overlapped run
test_a_stopped_run_resumes_to_the_bit() {
    overlapped_pp2 || return 1
    stops_and_resumes v_stop v_pp2 "${VP2[@]}" && switched v_stop2
}
check a_stopped_run_resumes_to_the_bit test_a_stopped_run_resumes_to_the_bit

finish
