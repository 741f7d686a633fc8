# moe_lib.sh — what the MoE layout tests share (test_moe.sh, test_ep_zero.sh): the plan
# of 12 steps of a 4-layer GPT-2 with an MoE block every 2 layers (E 4, k 2, a shared
# expert), its options in COMMON, parallel_lib.sh, a table of layouts against one rank,
# and a checkpoint resharded across layouts. Sourced after lib.sh.

tiny_plan "$WORK/plan.json"
MOE=(--set model.layers=4 --set model.moe.experts=4 --set model.moe.top_k=2
    --set model.moe.every=2 --set model.moe.shared_experts=1 --set model.moe.capacity_factor=1.25
    --set model.moe.router_z_loss=0.001 --set model.moe.ffn_hidden=48)
COMMON=(--set data.val=null --set data.val_every=0 "${MOE[@]}")
source "$(dirname "${BASH_SOURCE[0]}")/parallel_lib.sh" # defines: ref, layout, stop_resume, uninterrupted

# layouts REF TOL: each line of stdin (NAME, then its --set options) a layout against REF
layouts() {
    local reference=$1 tol=$2 name sets
    while read -r name sets; do
        # shellcheck disable=SC2086 # the --set options, split
        layout "$name" "$reference" "$tol" $sets || return 1
    done
}

# reshard NAME N STOPPED_LAYOUT... -- RESUMED_LAYOUT...: a run stopped after each rank's
# N-th micro-batch (step 5's end) in one layout resumes from that checkpoint in the other;
# steps 6-12 within 1e-5 of one rank's (one_a4: ref one_a4 4 first)
reshard() {
    local name=$1 n=$2 run=$WORK/$1 rc=0 first=() second=()
    shift 2
    while [ "$1" != -- ]; do first+=("$1"); shift; done
    shift
    second=("$@")
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=$n "$PLAIT" train "$WORK/plan.json" --out "$run" \
        "${COMMON[@]}" "${first[@]}" >"$run.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$run.log"; return 1; }
    "$PLAIT" ckpt verify "$run" >"$run.verify" 2>&1 || { cat "$run.verify"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" "${second[@]}" \
        >"$run.log2" 2>&1 || { tail "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000005_0000" "$run.log2" || { cat "$run.log2"; return 1; }
    close "$run/metrics.jsonl" "$WORK/one_a4/metrics.jsonl" 1e-5
}
