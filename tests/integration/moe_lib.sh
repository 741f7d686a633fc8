# moe_lib.sh — what the tests of mixture-of-experts layouts share: the 4-layer MoE GPT-2
# they train (E 4, k 2, a shared expert, capacity 1.25 that drops, a z-loss), a table of
# its layouts against one rank, their per-expert loads against each other, and a checkpoint
# resumed in another layout.
# Sourced after lib.sh, with $WORK/plan.json (tiny_plan); then parallel_lib.sh.

MOE=(--set model.layers=4 --set model.moe.experts=4 --set model.moe.top_k=2
    --set model.moe.every=2 --set model.moe.shared_experts=1 --set model.moe.capacity_factor=1.25
    --set model.moe.router_z_loss=0.001 --set model.moe.ffn_hidden=48)
COMMON=(--set data.val=null --set data.val_every=0 "${MOE[@]}")
# the Llama of the same shape (grouped-query attention, SwiGLU experts)
LLAMA=(--set model.arch=llama --set model.heads=4 --set model.kv_heads=2 --set model.ffn_hidden=64)

# layouts REF TOL: each line of stdin (NAME, then its --set options) a layout against REF
layouts() {
    local reference=$1 tol=$2 name sets
    while read -r name sets; do
        # shellcheck disable=SC2086 # the --set options, split
        layout "$name" "$reference" "$tol" $sets || return 1
    done
}

# loads_equal A B [TOL]: every step's per-expert load and dropped choices are the same in
# both runs (some dropped); with TOL its balance and z losses too, within TOL (relative)
loads_equal() {
    "$PY" - "$1" "$2" "${3:-}" <<'PYEOF'
import json, sys
a, b = ([json.loads(l)["moe"] for l in open(p) if '"step"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 12, (len(a), len(b))
assert [x["load"] for x in a] == [y["load"] for y in b], "the experts' loads differ"
assert [x["dropped"] for x in a] == [y["dropped"] for y in b], "the dropped choices differ"
assert sum(x["dropped"] for x in a) > 0, "no choice was dropped: the case tests no capacity"
if sys.argv[3]:
    tol = float(sys.argv[3])
    worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b)
                for k in ("balance_loss", "z_loss"))
    assert worst <= tol, f"the balance and z losses differ by {worst:.3g} (tolerance {tol})"
    print(f"balance and z losses within {worst:.3g}; ", end="")
print(f"{len(a)} steps: the same loads, {sum(x['dropped'] for x in a)} choices dropped")
PYEOF
}

# reshard NAME N STOPPED_LAYOUT... -- RESUMED_LAYOUT...: a run stopped after each rank's
# N-th micro-batch (step 5's end) in one layout resumes from that checkpoint in the other;
# steps 6-12 within 1e-5 of one rank's (one_a4: ref one_a4 4)
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
