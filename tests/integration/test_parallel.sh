#!/usr/bin/env bash
# 3D parallelism through plait train: tp × pp × dp ranks as processes on this
# machine (the store, the socket collectives, the pipeline), against the
# one-rank run of the same global batch; resume to the bit; failures that end
# every rank quickly, naming who failed.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
# no evaluation in these runs: the metrics compared are the training steps
COMMON=(--set data.val=null --set data.val_every=0)
source "$(dirname "$0")/parallel_lib.sh" # defines: close, ref, memory, layout, stop_resume, …

# fp32, 12 AdamW steps with clipping and warm-up: within 1e-5 of one rank
# (measured here: at most 2e-7).
test_tensor_parallel_matches_one_rank() {
    ref one 3 && ref one_h4 3 --set model.heads=4 || return 1
    memory "$WORK/one" || return 1
    layout tp2 one 1e-5 --set parallel.tp=2 || return 1
    layout tp4 one_h4 1e-5 --set parallel.tp=4 --set model.heads=4
}

test_pipeline_parallel_matches_one_rank() {
    ref one_l4 4 --set model.layers=4 || return 1
    local l4=(--set model.layers=4 --set batch.grad_accum=4)
    layout pp2_1f1b one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 || return 1
    layout pp2_gpipe one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.schedule=gpipe || return 1
    layout pp4 one_l4 1e-5 "${l4[@]}" --set parallel.pp=4 || return 1
    # an explicit uneven split
    layout pp2_split31 one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 --set 'parallel.stage_layers=[3, 1]' ||
        return 1
    "$PY" - "$WORK/pp2_split31/run.json" <<'PYEOF' || return 1
import json, sys
ranks = json.load(open(sys.argv[1]))["memory"]["ranks"]
p = {r["pp"]: r["allocated"]["params"] for r in ranks}
# stage 0: wte 256·32 + wpe 32·32 + 3 layers of 12,704; stage 1: 1 layer + lnf 64 + wte
assert p[0] * 20960 == p[1] * 47328, p
PYEOF
    # zero-bubble: backward split into input- and weight-gradient passes
    layout pp2_zbh1 one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1 ||
        return 1
    layout pp4_zbh1_selective one_l4 1e-5 "${l4[@]}" --set parallel.pp=4 \
        --set parallel.schedule=zb-h1 --set recompute=selective || return 1
    # the measured bubble is reported beside the simulated one, which is
    # lower than 1F1B's at the same depth and micro-batches
    "$PY" - "$WORK/pp4/metrics.jsonl" "$WORK/pp4_zbh1_selective/metrics.jsonl" <<'PYEOF'
import json, sys
def sim(p):
    rows = [json.loads(l)["parallel"] for l in open(p) if '"step"' in l]
    assert all("bubble_pct" in r for r in rows), rows[0]
    return rows[0]["bubble_simulated_pct"]
a, b = sim(sys.argv[1]), sim(sys.argv[2])
assert abs(a - 100 * 3 / (4 + 3)) < 1e-9, a   # (p-1)/(m+p-1)
assert b < a, (a, b)
print(f"simulated bubble: 1f1b {a:.1f}%, zb-h1 {b:.1f}%")
PYEOF
}

# Interleaved 1F1B (v model chunks a stage; chunk c of the last stage feeds
# chunk c+1 of the first): one rank's numbers at 1×2×1 v=2 and 1×4×1 v=2, and
# with dp 2 in buckets (a chunk's gradients start their sum only once every
# chunk above it is final), and tp 2 sequence parallel × pp 2 × dp 2 at ZeRO 1;
# the simulated bubble below 1F1B's, the measured
# one beside it; the same layout twice, the same bits; stopped and resumed
# from its checkpoint in parts, to the bit; a one-rank checkpoint resumed by
# it; its evaluation, one rank's; ZeRO 2 at pp 2 × dp 2, handing each group of pp
# micro-batches over (where a stage's gradients are quiescent), in one bucket and in
# buckets of 10 KB, and the same layout twice: the same bits.
test_interleaved_pipeline_matches_one_rank() {
    ref one_l4 4 --set model.layers=4 && ref one_l8 4 --set model.layers=8 &&
        ref one_l4x8 8 --set model.layers=4 || return 1
    local il=(--set parallel.schedule=interleaved --set parallel.virtual_stages=2)
    local l4=(--set model.layers=4 --set batch.grad_accum=4)
    layout pp2_interleaved one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 "${il[@]}" || return 1
    layout pp4_interleaved one_l8 1e-5 --set model.layers=8 --set batch.grad_accum=4 \
        --set parallel.pp=4 "${il[@]}" || return 1
    layout pp2dp2_interleaved_buckets one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.bucket_mb=0.01 "${il[@]}" || return 1
    layout tp2pp2dp2_sp_interleaved one_l4x8 1e-5 "${l4[@]}" --set parallel.tp=2 \
        --set parallel.sequence_parallel=true --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 "${il[@]}" || return 1
    "$PY" - "$WORK/pp4_interleaved/metrics.jsonl" <<'PYEOF' || return 1
import json, sys
rows = [json.loads(l)["parallel"] for l in open(sys.argv[1]) if '"step"' in l]
assert all("bubble_pct" in r for r in rows), rows[0]
a = rows[0]["bubble_simulated_pct"]
assert 0 < a < 100 * 3 / (4 + 3), a   # below 1F1B's (p-1)/(m+p-1) at pp 4, m 4
print(f"simulated bubble: interleaved v=2 {a:.1f}%, measured {rows[-1]['bubble_pct']:.1f}%")
PYEOF
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/again_il" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 "${il[@]}" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/pp2_interleaved/metrics.jsonl" "$WORK/again_il/metrics.jsonl" || return 1
    # stopped after micro-batch 10 (a pipeline stops at the step's end: step 3),
    # resumed from its parts
    stops_and_resumes stop_il pp2_interleaved "${l4[@]}" --set parallel.pp=2 "${il[@]}" || return 1
    # its parts hold chunks of layers: 1F1B's stages take theirs, resharded
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/stop_il" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 --set steps=13 >"$WORK/il_as_1f1b.log" 2>&1 &&
        grep -q "resharded from tp 1 × pp 2 × dp 1 (ZeRO 0) to tp 1 × pp 2 × dp 1" \
            "$WORK/il_as_1f1b.log" || { cat "$WORK/il_as_1f1b.log"; return 1; }
    # a one-rank checkpoint (the whole model) resumed by the interleaved layout
    cp -r "$WORK/one_l4" "$WORK/grow_il" && rm -r "$WORK/grow_il/checkpoints/step_00000012_0000" &&
        rm "$WORK/grow_il/metrics.jsonl" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/grow_il" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 "${il[@]}" >"$WORK/grow_il.log" 2>&1 || { cat "$WORK/grow_il.log"; return 1; }
    grep -q "resuming from .*step_00000008_0000" "$WORK/grow_il.log" ||
        { cat "$WORK/grow_il.log"; return 1; }
    # evaluation through the chunks: one rank's validation losses
    evaluates_as_one_rank val_il "${l4[@]}" --set parallel.pp=2 "${il[@]}" || return 1
    local z2=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2)
    layout pp2dp2_z2_interleaved one_l4x8 1e-5 "${l4[@]}" "${z2[@]}" "${il[@]}" || return 1
    layout pp2dp2_z2_interleaved_buckets one_l4x8 1e-5 "${l4[@]}" "${z2[@]}" "${il[@]}" \
        --set parallel.bucket_mb=0.01 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/again_il_z2" "${COMMON[@]}" "${l4[@]}" \
        "${z2[@]}" "${il[@]}" --set parallel.bucket_mb=0.01 >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/pp2dp2_z2_interleaved_buckets/metrics.jsonl" \
        "$WORK/again_il_z2/metrics.jsonl"
}

test_data_parallel_and_zero_match_one_rank() {
    ref one6 6 && ref one8 8 && ref one12 12 || return 1
    layout dp2_z0 one6 1e-5 --set parallel.dp=2 || return 1
    # the sum in a bucket per layer (10 KB; a layer is 50 KB), started during
    # the last backward, with and without a pipeline (its tied wte goes last)
    layout dp2_z0_buckets one6 1e-5 --set parallel.dp=2 --set parallel.bucket_mb=0.01 || return 1
    # one bucket larger than the gradient: summed after backward
    layout dp2_z0_one_bucket one6 1e-5 --set parallel.dp=2 --set parallel.bucket_mb=1e6 || return 1
    layout pp2dp2_z0_buckets one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 \
        --set batch.grad_accum=4 --set parallel.bucket_mb=0.01 || return 1
    # with a split backward the buckets start during the last weight-gradient pass
    layout pp2dp2_zbh1_buckets one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 \
        --set batch.grad_accum=4 --set parallel.bucket_mb=0.01 --set parallel.schedule=zb-h1 ||
        return 1
    # all of it at once: tp 2 sequence parallel × pp 2 zero-bubble × dp 2 in buckets
    layout sp_zbh1_buckets one8 1e-5 --set parallel.tp=2 --set parallel.sequence_parallel=true \
        --set parallel.pp=2 --set parallel.dp=2 --set batch.grad_accum=4 \
        --set parallel.bucket_mb=0.01 --set parallel.schedule=zb-h1 || return 1
    # ZeRO 2 with a split backward: handed over once a micro-batch's weight-gradient
    # pass is done (ZB-H1's lists run it before the next input-gradient pass), the tied
    # wte summed in the slices at the step's end; in one bucket and in buckets of 10 KB
    local z2zb=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2
        --set parallel.schedule=zb-h1 --set batch.grad_accum=4)
    layout pp2dp2_z2_zbh1 one8 1e-5 "${z2zb[@]}" || return 1
    layout pp2dp2_z2_zbh1_buckets one8 1e-5 "${z2zb[@]}" --set parallel.bucket_mb=0.01 || return 1
    layout dp2_z1 one6 1e-5 --set parallel.dp=2 --set parallel.zero=1 || return 1
    layout dp2_z2 one6 1e-5 --set parallel.dp=2 --set parallel.zero=2 || return 1
    # ZeRO 2 in a pipeline: the tied wte's sum between its ends after each
    # micro-batch comes after the last stage has sent that micro-batch's gradient
    layout pp2dp2_z2 one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2 \
        --set batch.grad_accum=4 || return 1
    layout dp4_z1 one12 1e-5 --set parallel.dp=4 --set parallel.zero=1
}

# ZeRO 1 and 2 in buckets of 10 KB (a layer is 50 KB): each reduce-scattered
# unevenly into the dp ranks' slices as soon as backward has made it final
# (ZeRO 1 in the step's last backward, ZeRO 2 in every micro-batch's, added
# into the slice), with and without a pipeline; with sequence parallelism the
# LayerNorms' gradients summed over tp in the slice. The same layout twice:
# the same bits.
test_zero_in_buckets_matches_one_rank() {
    ref one6 6 && ref one8 8 && ref one12 12 || return 1
    local b=(--set parallel.bucket_mb=0.01)
    layout dp2_z1_buckets one6 1e-5 --set parallel.dp=2 --set parallel.zero=1 "${b[@]}" || return 1
    layout dp2_z2_buckets one6 1e-5 --set parallel.dp=2 --set parallel.zero=2 "${b[@]}" || return 1
    layout dp4_z1_buckets one12 1e-5 --set parallel.dp=4 --set parallel.zero=1 "${b[@]}" || return 1
    layout dp4_z2_buckets one12 1e-5 --set parallel.dp=4 --set parallel.zero=2 "${b[@]}" || return 1
    layout pp2dp2_z1_buckets one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=4 "${b[@]}" || return 1
    layout pp2dp2_z2_buckets one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=2 --set batch.grad_accum=4 "${b[@]}" || return 1
    layout tp2pp2dp2_z1_buckets one8 1e-5 --set parallel.tp=2 --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.zero=1 --set batch.grad_accum=4 "${b[@]}" || return 1
    layout tp2dp2z2_sp_buckets one6 1e-5 --set parallel.tp=2 --set parallel.dp=2 \
        --set parallel.zero=2 --set parallel.sequence_parallel=true "${b[@]}" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp4_z2_again" "${COMMON[@]}" \
        --set parallel.dp=4 --set parallel.zero=2 "${b[@]}" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/dp4_z2_buckets/metrics.jsonl" "$WORK/dp4_z2_again/metrics.jsonl"
}

# Hybrid sharding (HSDP): dp 4 as two replicas of a shard group of 2. ZeRO 1 and
# 2 slice over the shard group (the gradients reduce-scattered in it, the
# slice then summed over the replicas once a step, the norm over the shard
# group alone), given either way round, in one bucket and in buckets of 10 KB,
# and shard groups of 1 (a plain all-reduce over the replicas); what plait
# check predicts is what each rank allocated (a slice of a half, not a
# quarter). Stopped mid-step at ZeRO 2 (each rank's slice, not yet summed over
# the replicas, saved) and resumed to the bit.
test_hybrid_sharding_matches_one_rank() {
    ref one12 12 || return 1
    local d4=(--set parallel.dp=4)
    layout hsdp_z1 one12 1e-5 "${d4[@]}" --set parallel.zero=1 --set parallel.dp_shard=2 \
        --set parallel.dp_replicate=2 || return 1
    layout hsdp_z2 one12 1e-5 "${d4[@]}" --set parallel.zero=2 --set parallel.dp_shard=2 || return 1
    layout hsdp_z1_buckets one12 1e-5 "${d4[@]}" --set parallel.zero=1 \
        --set parallel.dp_replicate=2 --set parallel.bucket_mb=0.01 || return 1
    layout hsdp_z2_buckets one12 1e-5 "${d4[@]}" --set parallel.zero=2 \
        --set parallel.dp_replicate=2 --set parallel.bucket_mb=0.01 || return 1
    layout hsdp_1x4 one12 1e-5 "${d4[@]}" --set parallel.zero=1 --set parallel.dp_shard=1 || return 1
    "$PLAIT" ckpt ls "$WORK/hsdp_z1" >"$WORK/hsdp_ls.txt" 2>&1 &&
        grep -q "step_00000012_0000 .* tp 1 × pp 1 × dp 4 (2 replicas of 2) ZeRO 1 .* yes$" \
            "$WORK/hsdp_ls.txt" || { cat "$WORK/hsdp_ls.txt"; return 1; }
    [ -f "$WORK/dp4_z1/run.json" ] || layout dp4_z1 one12 1e-5 "${d4[@]}" --set parallel.zero=1 ||
        return 1
    "$PY" - "$WORK/hsdp_z1/run.json" "$WORK/dp4_z1/run.json" <<'PYEOF' || return 1
import json, sys
h, q = (json.load(open(p))["memory"]["ranks"][0]["allocated"]["optimizer"] for p in sys.argv[1:3])
assert 1.9 * q < h < 2.1 * q, (h, q)
print(f"a rank's moments: {h} bytes in a shard group of 2, {q} in one of 4")
PYEOF
    local z2=("${d4[@]}" --set parallel.zero=2 --set parallel.dp_shard=2 --set batch.grad_accum=4)
    uninterrupted full_hsdp_z2 "${z2[@]}" || return 1
    stop_resume stop_hsdp_z2 full_hsdp_z2 22 "micro-batch 2 of step 6" "${z2[@]}" || return 1
    [ "$(ls "$WORK/stop_hsdp_z2/checkpoints/step_00000005_0002" | grep -c '^optim-tp0-pp0-dp[01]\.bin$')" = 2 ] &&
        [ "$(ls "$WORK/stop_hsdp_z2/checkpoints/step_00000005_0002" | grep -c '^grads-tp0-pp0-dp[0-3]\.bin$')" = 4 ] ||
        { ls "$WORK/stop_hsdp_z2/checkpoints/step_00000005_0002"; return 1; }
}

# dp_bytes_below A B RATIO: every one of the 12 steps, run A's dp communicator sent
# less than RATIO times what run B's did
dp_bytes_below() {
    "$PY" - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" "$3" <<'PYEOF'
import json, sys
def dp_bytes(p):
    return [json.loads(l)["parallel"]["bytes"]["dp"] for l in open(p) if '"grad_norm"' in l]
a, b, ratio = dp_bytes(sys.argv[1]), dp_bytes(sys.argv[2]), float(sys.argv[3])
assert len(a) == len(b) == 12 and all(x < ratio * y for x, y in zip(a, b)), (a, b)
print(f"dp bytes a step: {a[-1]:.0f} against {b[-1]:.0f}")
PYEOF
}

# dp_traffic_as_checked RUN --set ...: every step's dp bytes (metrics.jsonl) within 1%
# of plait check's comm_bytes_per_step.dp for the same plan
dp_traffic_as_checked() {
    local name=$1
    shift
    "$PLAIT" check "$WORK/plan.json" --json "${COMMON[@]}" "$@" >"$WORK/$name.check.json" ||
        return 1
    "$PY" - "$WORK/$name.check.json" "$WORK/$name/metrics.jsonl" <<'PYEOF'
import json, sys
want = json.load(open(sys.argv[1]))["comm_bytes_per_step"]["dp"]
got = [json.loads(l)["parallel"]["bytes"]["dp"] for l in open(sys.argv[2]) if '"grad_norm"' in l]
assert got and all(abs(g - want) <= 0.01 * want for g in got), (want, got)
print(f"dp bytes a step {got[-1]:.0f}, plait check {want:.0f}")
PYEOF
}

# ZeRO 3: each dp rank keeps 1/dp of the parameters and gathers each unit (the
# embeddings, one layer, the final norm and head) into a window just before a
# pass uses it, the next one on its way, and reduce-scatters each unit's
# gradient as backward writes it. One rank's losses and gradient norms within
# 1e-5 (measured: at most 8e-8) at dp 2 and 4, tp 2 sequence parallel, pp 2
# with every schedule, hybrid sharding, full recompute, bf16 (1e-4 as the
# other bf16 layouts: the products round); what plait check predicts is what
# each rank allocated, windows included; the same bits twice; the checkpoint
# holds the parameters in dp slices; stopped mid-step, resumed to the bit.
test_zero3_matches_one_rank() {
    ref one6 6 && ref one8 8 && ref one12 12 && ref one_l4x8 8 --set model.layers=4 &&
        ref one6_bf16 6 --set precision=bf16 || return 1
    local z3=(--set parallel.zero=3) l4=(--set model.layers=4 --set batch.grad_accum=4)
    layout dp2_z3 one6 1e-5 --set parallel.dp=2 "${z3[@]}" || return 1
    layout dp4_z3 one12 1e-5 --set parallel.dp=4 "${z3[@]}" || return 1
    layout tp2dp2_z3_sp one6 1e-5 --set parallel.tp=2 --set parallel.dp=2 \
        --set parallel.sequence_parallel=true "${z3[@]}" || return 1
    layout pp2dp2_z3 one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 --set batch.grad_accum=4 \
        "${z3[@]}" || return 1
    layout pp2dp2_z3_interleaved one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "${z3[@]}" || return 1
    layout pp2dp2_z3_zbh1 one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.schedule=zb-h1 "${z3[@]}" || return 1
    layout pp2dp2_z3_dualpipev one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.schedule=dualpipev "${z3[@]}" || return 1
    layout hsdp_z3 one12 1e-5 --set parallel.dp=4 --set parallel.dp_shard=2 "${z3[@]}" || return 1
    layout dp2_z3_recompute one6 1e-5 --set parallel.dp=2 --set recompute=full "${z3[@]}" || return 1
    layout dp2_z3_bf16 one6_bf16 1e-4 --set parallel.dp=2 --set precision=bf16 "${z3[@]}" ||
        return 1
    # in bf16 the layers are gathered in bf16 (their norms and biases in fp32): the dp
    # communicator sends under 0.8 of the fp32 run's (measured 0.754 with this model's
    # layers 73% of it)
    dp_bytes_below dp2_z3_bf16 dp2_z3 0.8 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp2_z3_again" "${COMMON[@]}" --set parallel.dp=2 \
        "${z3[@]}" >"$WORK/dp2_z3_again.log" 2>&1 || return 1
    metrics_equal "$WORK/dp2_z3/metrics.jsonl" "$WORK/dp2_z3_again/metrics.jsonl" || return 1
    ls "$WORK/dp4_z3/checkpoints/step_00000012_0000" >"$WORK/dp4_z3_files.txt" &&
        [ "$(grep -c '^model-tp0-pp0-dp[0-3]\.bin$' "$WORK/dp4_z3_files.txt")" = 4 ] &&
        ! grep -q '^model-tp0-pp0\.bin$' "$WORK/dp4_z3_files.txt" ||
        { cat "$WORK/dp4_z3_files.txt"; return 1; }
    # a rank's optimizer state is its quarter's moments (8 bytes an element; ZeRO 1 adds a
    # 4-byte staging slice): ZeRO 3 stages each gradient window's part beside the window
    [ -f "$WORK/dp4_z1/run.json" ] || layout dp4_z1 one12 1e-5 --set parallel.dp=4 \
        --set parallel.zero=1 || return 1
    "$PY" - "$WORK/dp4_z3/run.json" "$WORK/dp4_z1/run.json" <<'PYEOF' || return 1
import json, sys
z3, z1 = (json.load(open(p))["memory"]["ranks"][0]["allocated"] for p in sys.argv[1:3])
assert 3 * z3["optimizer"] == 2 * z1["optimizer"], (z3, z1)
print(f"a rank's optimizer state {z3['optimizer']} bytes at ZeRO 3, {z1['optimizer']} at ZeRO 1")
PYEOF
    local stop=(--set parallel.dp=2 --set batch.grad_accum=4 "${z3[@]}")
    uninterrupted full_dp2_z3 "${stop[@]}" || return 1
    stop_resume stop_dp2_z3 full_dp2_z3 10 "micro-batch 2 of step 3" "${stop[@]}" || return 1
    zero3_kept_gathered
}

# ZeRO 3 with parallel.reshard_after_forward false: a unit gathered stays
# gathered until the step's end, so its backward and the step's later
# micro-batches find it there: one rank's losses and gradient norms within
# 1e-5 at dp 2 with 3 micro-batches a step (and with 4 layers), and pp 2 ×
# dp 2 with 1F1B, interleaved and ZB-H1 (a window for every unit, predicted ==
# allocated), bf16 within 1e-4; fewer bytes sent over dp each step than
# resharding (one gather a step, not two a micro-batch); evaluating between
# steps (what it gathers stays until the next step's end, whose weights it
# is) changes no training step's bits; stopped mid-step, resumed to the bit.
zero3_kept_gathered() {
    local keep=(--set parallel.zero=3
        --set parallel.reshard_after_forward=false)
    local l4=(--set model.layers=4 --set batch.grad_accum=4)
    layout dp2_z3_keep one6 1e-5 --set parallel.dp=2 --set batch.grad_accum=3 "${keep[@]}" ||
        return 1
    layout pp2dp2_z3_keep one8 1e-5 --set parallel.pp=2 --set parallel.dp=2 \
        --set batch.grad_accum=4 "${keep[@]}" || return 1
    layout pp2dp2_z3_interleaved_keep one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 \
        "${keep[@]}" || return 1
    # 4 layers: more windows than resharding's two layers
    layout dp2_z3_keep_l4 one_l4x8 1e-5 "${l4[@]}" --set parallel.dp=2 "${keep[@]}" || return 1
    # a split backward: the weight-gradient pass finds its layer gathered too
    layout pp2dp2_z3_zbh1_keep one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.schedule=zb-h1 "${keep[@]}" || return 1
    # bf16: each window's bf16 copy made once, kept with it
    layout dp2_z3_keep_bf16 one6_bf16 1e-4 --set parallel.dp=2 --set precision=bf16 "${keep[@]}" ||
        return 1
    dp_bytes_below dp2_z3_keep dp2_z3 1 || return 1
    # what plait check predicts the dp communicator sends a step is what it sent (beside
    # the gathers and scatters, a few bytes of small collectives: within 1%)
    dp_traffic_as_checked dp2_z3 --set parallel.dp=2 "${z3[@]}" &&
        dp_traffic_as_checked dp4_z3 --set parallel.dp=4 "${z3[@]}" &&
        dp_traffic_as_checked dp2_z3_keep --set parallel.dp=2 --set batch.grad_accum=3 \
            "${keep[@]}" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp2_z3_keep_eval" "${COMMON[@]}" \
        --set parallel.dp=2 --set batch.grad_accum=3 "${keep[@]}" --set data.val="$WORK/val.bin" \
        --set data.val_every=2 >"$WORK/dp2_z3_keep_eval.log" 2>&1 ||
        { tail "$WORK/dp2_z3_keep_eval.log"; return 1; }
    local kept=$WORK/dp2_z3_keep/metrics.jsonl evaluated=$WORK/dp2_z3_keep_eval/metrics.jsonl
    "$PY" - "$kept" "$evaluated" <<'PYEOF' || return 1
import json, sys
def steps(p):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p))
            if "grad_norm" in r]
def evals(p):
    return [r for r in map(json.loads, open(p)) if "val_loss" in r]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert len(a) == 12 and a == b, (a, b)
assert len(evals(sys.argv[2])) == 6, evals(sys.argv[2])
print("evaluating every 2 steps: the same training bits")
PYEOF
    # stopped mid-step with units gathered, resumed to the bit
    local stop=(--set parallel.dp=2 --set batch.grad_accum=4 "${keep[@]}")
    uninterrupted full_dp2_z3_keep "${stop[@]}" || return 1
    stop_resume stop_dp2_z3_keep full_dp2_z3_keep 10 "micro-batch 2 of step 3" "${stop[@]}"
}

# ZeRO 3 in fp8: each layer window quantises the matrices it gathers with the
# amax of the whole matrix (the rank's tp shard of it, as every layout's), and
# the head's unit makes the LM head's bf16 copy. fp8 magnifies a last-bit
# difference of the fp32 sums into a step of its grid, so the bound is fp8's
# (test_fp8.sh): within 1e-3 of one rank in fp8 at dp 2 (tensor scaling) and
# pp 2 × dp 2 (block scaling), measured 9e-5 and 3e-5; with the units kept
# gathered, dp 2's run again (measured: the same bits); at tp 2 × dp 2 within
# 1e-3 of ZeRO 1's run (measured 0: the same scales, the same fp8 copy).
test_zero3_fp8_tracks_fp8_one_rank() {
    ref one6_fp8 6 --set precision=fp8 &&
        ref one8_fp8_block 8 --set precision=fp8 --set fp8_scaling=block || return 1
    local z3=(--set parallel.zero=3)
    layout dp2_z3_fp8 one6_fp8 1e-3 --set parallel.dp=2 --set precision=fp8 "${z3[@]}" || return 1
    layout pp2dp2_z3_fp8_block one8_fp8_block 1e-3 --set parallel.pp=2 --set parallel.dp=2 \
        --set batch.grad_accum=4 --set precision=fp8 --set fp8_scaling=block "${z3[@]}" || return 1
    # the units kept gathered (a window and an fp8 block for each layer): the same run
    layout dp2_z3_fp8_kept dp2_z3_fp8 1e-6 --set parallel.dp=2 --set precision=fp8 "${z3[@]}" \
        --set parallel.reshard_after_forward=false || return 1
    local tp=(--set parallel.tp=2 --set parallel.dp=2 --set precision=fp8)
    layout tp2dp2_z1_fp8 one6_fp8 1e-2 "${tp[@]}" --set parallel.zero=1 || return 1
    layout tp2dp2_z3_fp8 tp2dp2_z1_fp8 1e-3 "${tp[@]}" "${z3[@]}"
}

test_2x2x2_with_zero1_matches_one_rank() {
    ref one8 8 || return 1
    layout tp2pp2dp2 one8 1e-5 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=4 || return 1
    # each rank wrote its part; rank 0 committed them together
    local c=$WORK/tp2pp2dp2/checkpoints/step_00000012_0000
    [ "$(ls "$c" | grep -c '^model-tp[01]-pp[01]\.bin$')" = 4 ] &&
        [ "$(ls "$c" | grep -c '^optim-tp[01]-pp[01]-dp[01]\.bin$')" = 8 ] ||
        { ls "$c"; return 1; }
    grep -q '"layout"' "$c/manifest.json" || return 1
    # plait check's prediction for each rank is what run.json says it allocated
    "$PLAIT" check "$WORK/plan.json" --gpus-per-node 8 --json --set parallel.tp=2 \
        --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1 --set batch.grad_accum=4 \
        >"$WORK/check.json" || return 1
    "$PY" - "$WORK/check.json" "$WORK/tp2pp2dp2/run.json" <<'PYEOF' || return 1
import json, sys
check, run = (json.load(open(p)) for p in sys.argv[1:3])
want = [r["memory_bytes"] for r in check["ranks"]]
got = [r["allocated"]["total"] for r in run["memory"]["ranks"]]
assert want == got, (want, got)
print("plait check:", want)
PYEOF
    # the same layout twice: the same bits
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/again" "${COMMON[@]}" --set parallel.tp=2 \
        --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1 --set batch.grad_accum=4 \
        >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/tp2pp2dp2/metrics.jsonl" "$WORK/again/metrics.jsonl"
}

# Sequence parallelism (the residual stream, the LayerNorms and the
# row-parallel biases on B·T/tp rows a rank; the LayerNorms' gradients summed
# over tp before the step, or before each micro-batch's reduction with ZeRO 2):
# one rank's numbers, like plain tp (measured: at most 2e-7); the same layout
# twice, the same bits; stopped mid-step (each rank's LayerNorm gradients of
# its own rows so far in its part of the checkpoint) and resumed, to the bit.
# Without tp ("auto" is 1 on one machine) it is refused, saying why.
test_sequence_parallel_matches_one_rank() {
    local sp=(--set parallel.sequence_parallel=true)
    expect_error "$WORK/sp_auto.log" 1 \
        'parallel.sequence_parallel needs tensor parallelism, but the launcher chose tp 1 for parallel.tp "auto"' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/sp_auto" "${COMMON[@]}" --set parallel.tp=auto "${sp[@]}" ||
        return 1
    ref one 3 && ref one_h4 3 --set model.heads=4 && ref one6 6 && ref one8 8 || return 1
    layout tp2_sp one 1e-5 --set parallel.tp=2 "${sp[@]}" || return 1
    local rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=22 "$PLAIT" train "$WORK/plan.json" --out "$WORK/stop_sp" \
        "${COMMON[@]}" --set parallel.tp=2 "${sp[@]}" >"$WORK/stop_sp.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$WORK/stop_sp.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/stop_sp" "${COMMON[@]}" --set parallel.tp=2 \
        "${sp[@]}" >"$WORK/stop_sp2.log" 2>&1 || return 1
    grep -q "resuming from .*mid-step" "$WORK/stop_sp2.log" || { cat "$WORK/stop_sp2.log"; return 1; }
    metrics_equal "$WORK/tp2_sp/metrics.jsonl" "$WORK/stop_sp/metrics.jsonl" || return 1
    layout tp4_sp one_h4 1e-5 --set parallel.tp=4 --set model.heads=4 "${sp[@]}" || return 1
    layout tp2dp2z2_sp one6 1e-5 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=2 \
        "${sp[@]}" || return 1
    local lay=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1
        --set batch.grad_accum=4 "${sp[@]}")
    layout tp2pp2dp2_sp one8 1e-5 "${lay[@]}" || return 1
    # bf16 with full recompute: the products round what plain tp rounds (measured: 2e-5, as plain tp)
    ref one_bf16 3 --set precision=bf16 || return 1
    layout bf16_tp2pp2_sp one_bf16 1e-4 --set precision=bf16 --set recompute=full \
        --set parallel.tp=2 --set parallel.pp=2 "${sp[@]}" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/again_sp" "${COMMON[@]}" "${lay[@]}" \
        >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/tp2pp2dp2_sp/metrics.jsonl" "$WORK/again_sp/metrics.jsonl"
}

# bf16 at tp 2 × pp 2 against bf16 on one rank: the products round the same
# inputs, so the runs differ by fp32 summation order only (measured: ~1e-6)
test_bf16_2x2_tracks_bf16_one_rank() {
    ref one_bf16 3 --set precision=bf16 || return 1
    layout bf16_tp2pp2 one_bf16 1e-4 --set precision=bf16 --set parallel.tp=2 --set parallel.pp=2
}

# wire NAME TP PP DP ZERO A LAYERS [SP [ROWS [SHARD]]]: every step's bytes per communicator
# (a rank's, averaged over the ranks) against the formulas within 5%. Sizes in
# floats: P the parameters, BTC one micro-batch's activations, A micro-batches:
#   dp: all-reduce 2(N-1)/N·P; ZeRO 1 reduce-scatter + all-gather, the same;
#       ZeRO 2 a reduce-scatter per micro-batch, A·(N-1)/N·P + (N-1)/N·P (in
#       buckets the uneven reduce-scatters add up to the same, over the ranks);
#       ROWS 1 (ZeRO 0 always): buckets without a pipeline gather every
#       rank's embedding rows and tokens, (N-1)·(BTC + BT) a step (ZeRO 2: a
#       micro-batch)
#   dp, hybrid sharding (SHARD S < DP = S·R, no rows): ZeRO's in the shard group,
#       2(S-1)/S·P (ZeRO 2: (A+1)·(S-1)/S·P), and the slice summed over the
#       replicas, 2(R-1)/R·P/S
#   tp: 4 all-reduces a layer (2 forward, 2 backward), 1 for the embedding's
#       output and 1 for the head's input gradient, each 2(N-1)/N·BTC, per micro-batch
#   tp, sequence parallel (SP 1), each a ring's (N-1)/N·BTC per micro-batch:
#       forward a reduce-scatter for the embedding, an all-gather before and a
#       reduce-scatter after each of attention and MLP, an all-gather before
#       the head; backward the head's all-gather again and reduce-scatter, per
#       layer the residual gradient's 2 all-gathers, the LayerNorm outputs' 2
#       again and 2 reduce-scatters, the embedding's all-gather: 10·L + 5; and
#       the LayerNorms' gradients, (4·L + 2)·C, summed once a step (with ZeRO 2
#       a micro-batch); the loss's max and sums, 3·BT a micro-batch. These two
#       are small: recursive doubling, log2(N)·n
#   pp: a stage sends its output forward and its input gradient back per
#       micro-batch (2(p-1)/p·BTC averaged over the stages; BTC/tp with
#       sequence parallelism: its rows), and the ends sum
#       the tied wte (its tp shard, V/tp·C) once a step: 2/p·V/tp·C averaged
# dp's formula is for tp = pp = 1 (where tp shards, the replicated layer norms
# make it inexact); DP 0 leaves it unchecked.
wire() {
    "$PY" - "$WORK/$1/metrics.jsonl" "$WORK/plan.json" "${@:2}" <<'PYEOF'
import json, math, sys
path, plan = sys.argv[1], sys.argv[2]
tp, pp, dp, zero, accum, layers, sp, rows, shard = (list(map(int, sys.argv[3:])) + [0, 0, 0])[:9]
m = json.load(open(plan))["model"]
V, C, T, B = m["vocab"], m["hidden"], m["seq_len"], 4
L, F = layers, 4  # bytes a float
P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
BTC = B * T * C
want = {"tp": 0.0, "pp": 0.0, "dp": 0.0}
ring = (tp - 1) / tp  # of the whole, a rank's part of a reduce-scatter or an all-gather
small = math.log2(tp)  # of its buffer, a rank's part of a small all-reduce
if tp > 1 and not sp:
    want["tp"] = accum * (4 * L + 2) / pp * 2 * ring * BTC * F
if tp > 1 and sp:
    sums = accum if zero == 2 else 1
    want["tp"] = (accum * ((10 * L + 5) * ring * BTC + small * 3 * B * T)
                  + sums * small * (4 * L + 2) * C) / pp * F
if pp > 1:
    act = BTC // tp if sp else BTC
    want["pp"] = (accum * 2 * (pp - 1) / pp * act + 2 / pp * V // tp * C) * F
if dp == 0:
    del want["dp"]
elif dp > 1:
    assert tp == pp == 1
    S = shard or dp
    share = (S - 1) / S * P * F
    want["dp"] = share * (accum + 1) if zero == 2 else 2 * share
    want["dp"] += 2 * (dp // S - 1) / (dp // S) * P / S * F
    if zero == 0 or rows:  # in buckets, without a pipeline: the deferred embedding rows and tokens
        want["dp"] += (accum if zero == 2 else 1) * (dp - 1) * (BTC + B * T) * F
steps = [json.loads(l) for l in open(path) if '"step"' in l]
assert steps, "no steps"
for r in steps:
    got = r["parallel"]["bytes"]
    for k, w in want.items():
        ok = got[k] == 0 if w == 0 else abs(got[k] - w) <= 0.05 * w
        if not ok:
            sys.exit(f"step {r['step']}: {k} sent {got[k]:.0f} bytes, the formula says {w:.0f}")
print(len(steps), "steps:", {k: f"{r['parallel']['bytes'][k] / w:.4f}" if w else "0" for k, w in want.items()})
PYEOF
}

test_bytes_on_the_wire_match_the_formulas() {
    local short=(--set steps=3 --set optimizer.warmup_steps=1 --set checkpoint.every=0)
    run_wire() {
        local name=$1
        shift
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "${short[@]}" "$@" \
            >"$WORK/$name.log" 2>&1 || { tail "$WORK/$name.log"; return 1; }
    }
    # in a bucket per layer (the embedding rows deferred and gathered)
    run_wire w_dp2 --set parallel.dp=2 --set parallel.bucket_mb=0.01 && wire w_dp2 1 1 2 0 3 2 ||
        return 1
    run_wire w_dp4z1 --set parallel.dp=4 --set parallel.zero=1 && wire w_dp4z1 1 1 4 1 3 2 || return 1
    run_wire w_dp4z2 --set parallel.dp=4 --set parallel.zero=2 && wire w_dp4z2 1 1 4 2 3 2 || return 1
    # ZeRO 1 and 2 in a bucket per layer: uneven reduce-scatters, the embedding rows gathered
    local b=(--set parallel.bucket_mb=0.01)
    run_wire w_dp4z1_b --set parallel.dp=4 --set parallel.zero=1 "${b[@]}" &&
        wire w_dp4z1_b 1 1 4 1 3 2 0 1 || return 1
    run_wire w_dp3z2_b --set parallel.dp=3 --set parallel.zero=2 "${b[@]}" &&
        wire w_dp3z2_b 1 1 3 2 3 2 0 1 || return 1
    # hybrid sharding, dp 4 as 2 × 2: the shard groups' traffic and the replicas' sums
    run_wire w_hsdp_z1 --set parallel.dp=4 --set parallel.zero=1 --set parallel.dp_shard=2 &&
        wire w_hsdp_z1 1 1 4 1 3 2 0 0 2 || return 1
    run_wire w_hsdp_z2 --set parallel.dp=4 --set parallel.zero=2 --set parallel.dp_shard=2 &&
        wire w_hsdp_z2 1 1 4 2 3 2 0 0 2 || return 1
    run_wire w_tp4 --set parallel.tp=4 --set model.heads=4 && wire w_tp4 4 1 1 0 3 2 || return 1
    run_wire w_pp4 --set parallel.pp=4 --set model.layers=4 --set batch.grad_accum=4 &&
        wire w_pp4 1 4 1 0 4 4 || return 1
    run_wire w_tp2pp2dp2 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=4 && wire w_tp2pp2dp2 2 2 0 1 4 2 || return 1
    local sp=(--set parallel.sequence_parallel=true)
    run_wire w_tp4_sp --set parallel.tp=4 --set model.heads=4 "${sp[@]}" &&
        wire w_tp4_sp 4 1 1 0 3 2 1 || return 1
    run_wire w_tp2dp2z2_sp --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=2 "${sp[@]}" &&
        wire w_tp2dp2z2_sp 2 1 0 2 3 2 1 || return 1
    run_wire w_tp2pp2dp2_sp --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
        --set parallel.zero=1 --set batch.grad_accum=4 "${sp[@]}" && wire w_tp2pp2dp2_sp 2 2 0 1 4 2 1
}

# One rank made slow (its data reads take 250 ms longer): the straggler
# report names it at every step, well above the median, and the step's time
# is the slowest rank's.
test_the_straggler_report_names_a_slow_rank() {
    PLAIT_DEBUG_SLOW_RANK=2:250 "$PLAIT" train "$WORK/plan.json" --out "$WORK/slow" "${COMMON[@]}" \
        --set parallel.dp=4 --set steps=4 --set optimizer.warmup_steps=1 --set checkpoint.every=0 \
        >"$WORK/slow.log" 2>&1 || { tail "$WORK/slow.log"; return 1; }
    grep -q "| straggler rank 2 +" "$WORK/slow.log" || { cat "$WORK/slow.log"; return 1; }
    "$PY" - "$WORK/slow/metrics.jsonl" <<'PYEOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(steps) == 4, len(steps)
for r in steps:
    s = r["parallel"]["straggler"]
    # 3 micro-batches a step, 250 ms each on rank 2 (the median rank is noisy: 4
    # ranks share this machine's cores)
    assert s["rank"] == 2 and s["busy_ms"] >= s["median_busy_ms"] + 500, r
    assert r["ms"] >= 750, r
print("straggler rank 2 at every step")
PYEOF
}


# Stopped (SIGTERM at every rank, as Slurm and plait train deliver it), then
# resumed: the metrics of the run that never stopped, to the bit. Every layout
# stops between micro-batches: a pipeline at the first micro-batch its first
# stage would start after the signal, once the ones in flight have drained
# (each rank's 22nd micro-batch is the 2nd of step 6 on the first stage, whose
# next forward is the 4th: 3 of 4 done, checkpoint step_00000005_0003).
test_stopped_parallel_runs_resume_to_the_bit() {
    local pp=(--set parallel.pp=2 --set batch.grad_accum=4)
    local lay=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1
        --set batch.grad_accum=4 --set checkpoint.every=4)
    local dp=(--set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=2 --set batch.grad_accum=4)
    local z2=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2 --set batch.grad_accum=4)
    uninterrupted full_dp "${dp[@]}" && uninterrupted full_pp2 "${pp[@]}" &&
        uninterrupted full_pp2_zbh1 "${pp[@]}" --set parallel.schedule=zb-h1 &&
        uninterrupted full_pp2dp2_z2 "${z2[@]}" && uninterrupted tp2pp2dp2 "${lay[@]}" || return 1
    stop_resume stop_dp full_dp 22 "micro-batch 2 of step 6" "${dp[@]}" || return 1
    # ZeRO 0 in buckets (the stop comes before the step's last backward starts them)
    local zb=(--set parallel.dp=2 --set parallel.bucket_mb=0.01 --set batch.grad_accum=4)
    uninterrupted full_dp_buckets "${zb[@]}" || return 1
    stop_resume stop_dp_buckets full_dp_buckets 22 "micro-batch 2 of step 6" "${zb[@]}" || return 1
    # ZeRO 2 in buckets: each micro-batch reduce-scattered into the slice during its backward
    local z2b=(--set parallel.dp=2 --set parallel.zero=2 --set parallel.bucket_mb=0.01
        --set batch.grad_accum=4)
    uninterrupted full_z2_buckets "${z2b[@]}" || return 1
    stop_resume stop_z2_buckets full_z2_buckets 22 "micro-batch 2 of step 6" "${z2b[@]}" || return 1
    stop_resume stop_pp2 full_pp2 22 "micro-batch 3 of step 6 (of 4; the pipeline drained)" \
        "${pp[@]}" || return 1
    [ -d "$WORK/stop_pp2/checkpoints/step_00000005_0003" ] || { ls "$WORK/stop_pp2/checkpoints"; return 1; }
    stop_resume stop_pp2_zbh1 full_pp2_zbh1 22 "micro-batch 3 of step 6" "${pp[@]}" \
        --set parallel.schedule=zb-h1 || return 1
    stop_resume stop_pp2dp2_z2 full_pp2dp2_z2 22 "micro-batch 3 of step 6" "${z2[@]}" || return 1
    stop_resume stop_2x2x2 tp2pp2dp2 22 "micro-batch 3 of step 6" "${lay[@]}" || return 1
    # each of the 8 ranks wrote its accumulated gradients
    [ "$(ls "$WORK/stop_2x2x2/checkpoints/step_00000005_0003" | grep -c '^grads-tp[01]-pp[01]-dp[01]\.bin$')" = 8 ] ||
        { ls "$WORK/stop_2x2x2/checkpoints/step_00000005_0003"; return 1; }
    # interleaved (v 2, 8 micro-batches a step): it stops where the rest of the
    # step is a multiple of pp, here after 4 of 8 (the 42nd micro-batch is the
    # 2nd of step 6)
    local iv=(--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2
        --set model.layers=4 --set batch.grad_accum=8)
    uninterrupted full_iv "${iv[@]}" || return 1
    stop_resume stop_iv full_iv 42 "micro-batch 4 of step 6 (of 8; the pipeline drained)" \
        "${iv[@]}" || return 1
    # ZeRO 2 with both: a stop lands where the gradients were handed over (interleaved:
    # a multiple of pp; zb-h1: any micro-batch), the slices saved, the tied wte's sum
    # still to come at the step's end
    local ivz2=("${iv[@]}" --set parallel.dp=2 --set parallel.zero=2 --set parallel.bucket_mb=0.01)
    uninterrupted full_iv_z2 "${ivz2[@]}" || return 1
    stop_resume stop_iv_z2 full_iv_z2 42 "micro-batch 4 of step 6 (of 8; the pipeline drained)" \
        "${ivz2[@]}" || return 1
    local zbz2=("${z2[@]}" --set parallel.schedule=zb-h1)
    uninterrupted full_zbh1_z2 "${zbz2[@]}" || return 1
    stop_resume stop_zbh1_z2 full_zbh1_z2 22 "micro-batch 3 of step 6" "${zbz2[@]}" || return 1
}

# SIGTERM to the last stage alone (after its 18th micro-batch, the 2nd of
# step 3): its wish travels up the pipeline with its next gradient, and the
# first stage stops the step before its next forward, the 5th of 8; every
# rank checkpoints mid-step and exits 75; resumed, the metrics of the run that
# never stopped.
test_a_signal_to_one_stage_stops_the_pipeline_mid_step() {
    local pp=(--set parallel.pp=2 --set batch.grad_accum=8 --set steps=6)
    uninterrupted full_pp2_a8 "${pp[@]}" || return 1
    stop_resume one_stage full_pp2_a8 1:18 "micro-batch 4 of step 3 (of 8; the pipeline drained)" \
        "${pp[@]}" || return 1
    [ -d "$WORK/one_stage/checkpoints/step_00000002_0004" ] || { ls "$WORK/one_stage/checkpoints"; return 1; }
}

test_layouts_resume_each_others_checkpoints() {
    # a one-rank checkpoint holds the whole model: another layout takes its part of it
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/grow" "${COMMON[@]}" --set steps=12 \
        --set checkpoint.every=4 >/dev/null 2>&1 || return 1
    rm -r "$WORK/grow/checkpoints/step_00000012_0000"
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/grow" "${COMMON[@]}" --set parallel.tp=2 \
        --set parallel.dp=2 >"$WORK/grow.log" 2>&1 || { cat "$WORK/grow.log"; return 1; }
    grep -q "the plan changed since that checkpoint: parallel.tp 1 -> 2, parallel.dp 1 -> 2" \
        "$WORK/grow.log" || { cat "$WORK/grow.log"; return 1; }
    # a checkpoint in parts is resharded to any other layout (tests/integration/test_reshard.sh
    # compares the losses)
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/tp2pp2dp2" "${COMMON[@]}" --set steps=13 \
        --set batch.grad_accum=4 >"$WORK/shrink.log" 2>&1 || { cat "$WORK/shrink.log"; return 1; }
    grep -q "resuming from .*step_00000012_0000" "$WORK/shrink.log" &&
        grep -q "parallel.tp 2 -> 1, parallel.pp 2 -> 1, parallel.dp 2 -> 1" "$WORK/shrink.log" ||
        { cat "$WORK/shrink.log"; return 1; }
}

# Bad input: every rank ends with its reason, and no advice about starting
# afresh (nothing is wrong with the run directory). A rank still receiving
# rank 0's choice of checkpoint when rank 0 fails on the data used to add that
# advice (it is a race: about one run in three showed it).
test_bad_data_ends_every_rank_with_its_reason() {
    head -c 4096 /dev/urandom >"$WORK/junk.bin"
    expect_error "$WORK/junk.log" 1 "data.train: $WORK/junk.bin: not an llm.c token shard" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/junk" "${COMMON[@]}" --set parallel.dp=4 \
        --set data.train="$WORK/junk.bin" || return 1
    ! grep -q -- "--fresh" "$WORK/junk.log" || { cat "$WORK/junk.log"; return 1; }
}

# kill -9 of one rank, with no restart allowed: every other rank and the
# launcher end within the deadline, naming the dead rank, with exit 76 (a
# peer was lost). (With restarts: tests/integration/test_chaos.sh.)
test_a_killed_rank_ends_the_gang_naming_it() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/kill" "${COMMON[@]}" --set parallel.tp=2 \
        --set parallel.dp=2 --set steps=100000 --set checkpoint.every=0 \
        --set checkpoint.max_restarts=0 --set parallel.timeout_s=10 >"$WORK/kill.log" 2>&1 &
    local gang=$! victim="" rc=0
    for _ in $(seq 200); do
        [ -s "$WORK/kill/metrics.jsonl" ] && victim=$(pgrep -P "$gang" | sed -n 3p) && [ -n "$victim" ] && break
        sleep 0.05
    done
    [ -n "$victim" ] || { echo "no ranks"; kill "$gang"; return 1; }
    local t0
    t0=$(date +%s)
    kill -9 "$victim"
    wait "$gang" || rc=$?
    local took=$(($(date +%s) - t0))
    [ "$took" -le 15 ] || { echo "the gang took ${took}s to end"; return 1; }
    [ "$rc" -eq 76 ] || { echo "the gang exited $rc, want 76"; return 1; }
    grep -q "plait: error: rank 2 (pid $victim) was killed by signal 9; stopping the other ranks" \
        "$WORK/kill.log" || { grep -v '^step' "$WORK/kill.log"; return 1; }
    # the others hear it from the launcher (through the store), or find it gone themselves
    [ "$(grep -cE "plait-train.*: error: a peer was lost .*(the launcher: rank 2 \(pid $victim\) was killed by signal 9|\(global rank 2, host $(hostname), pid $victim\) is gone)" \
        "$WORK/kill.log")" -eq 3 ] || { grep -v '^step' "$WORK/kill.log"; return 1; }
    ! pgrep -f "plait-train" -P "$gang" >/dev/null
}

# The pipeline link as it runs on GPUs (nccl buffers nothing: a communicator per
# direction between two stages, each send copied and posted without waiting,
# waited for at the step's end) over sockets (PLAIT_DEBUG_NCCL_LINK=1): every
# schedule, with its validation passes and a stop mid-step, gives the direct
# link's metrics to the bit.
test_the_nccl_link_matches_the_direct_link() {
    local l4=(--set model.layers=4 --set batch.grad_accum=4 --set parallel.pp=2) name
    local -A sched=([1f1b]="" [gpipe]="--set parallel.schedule=gpipe"
        [zbh1]="--set parallel.schedule=zb-h1"
        [il]="--set parallel.schedule=interleaved --set parallel.virtual_stages=2"
        [dp2]="--set parallel.dp=2")
    for name in 1f1b gpipe zbh1 il dp2; do
        # shellcheck disable=SC2086
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/direct_$name" "${l4[@]}" ${sched[$name]} \
            >"$WORK/direct_$name.log" 2>&1 || { tail -n 20 "$WORK/direct_$name.log"; return 1; }
        # shellcheck disable=SC2086
        PLAIT_DEBUG_NCCL_LINK=1 "$PLAIT" train "$WORK/plan.json" --out "$WORK/pair_$name" \
            "${l4[@]}" ${sched[$name]} >"$WORK/pair_$name.log" 2>&1 ||
            { tail -n 20 "$WORK/pair_$name.log"; return 1; }
        metrics_equal "$WORK/pair_$name/metrics.jsonl" "$WORK/direct_$name/metrics.jsonl" ||
            { echo "schedule $name"; return 1; }
    done
    grep -q '"val_loss"' "$WORK/pair_1f1b/metrics.jsonl" || { echo "no validation ran"; return 1; }
    # a signal to the last stage mid-step: the stop travels up in a control word,
    # the pipeline drains, and the resumed run is the uninterrupted one
    local pp=(--set parallel.pp=2 --set batch.grad_accum=8 --set steps=6)
    uninterrupted full_pp2_a8 "${pp[@]}" || return 1
    PLAIT_DEBUG_NCCL_LINK=1 stop_resume pair_one_stage full_pp2_a8 1:18 \
        "micro-batch 4 of step 3 (of 8; the pipeline drained)" "${pp[@]}"
}

check nccl_link_matches_the_direct_link test_the_nccl_link_matches_the_direct_link
check tensor_parallel_matches_one_rank test_tensor_parallel_matches_one_rank
check pipeline_parallel_matches_one_rank test_pipeline_parallel_matches_one_rank
check interleaved_pipeline_matches_one_rank test_interleaved_pipeline_matches_one_rank

# DualPipeV (two chunks a stage in a V: down the stages through chunk 0, a turn
# on the last stage into its own chunk 1, back up to the first stage, which
# takes the loss): one rank's numbers at pp 2 and pp 4, with dp 2 at ZeRO 2 in
# buckets and tp 2 sequence parallel; its simulated bubble below ZB-H1's; the
# same layout twice, the same bits; stopped (at the step's end) and resumed to
# the bit; its V-shaped parts resumed by 1F1B's stages and a 1F1B checkpoint by
# the V; its evaluation, one rank's.
test_dualpipev_matches_one_rank() {
    ref one_l4 4 --set model.layers=4 && ref one_l8x8 8 --set model.layers=8 &&
        ref one_l4x8 8 --set model.layers=4 || return 1
    local dv=(--set parallel.schedule=dualpipev)
    local l4=(--set model.layers=4 --set batch.grad_accum=4)
    layout pp2_dualpipev one_l4 1e-5 "${l4[@]}" --set parallel.pp=2 "${dv[@]}" || return 1
    layout pp4_dualpipev one_l8x8 1e-5 --set model.layers=8 --set batch.grad_accum=8 \
        --set parallel.pp=4 "${dv[@]}" || return 1
    layout pp2dp2_z2_dualpipev_buckets one_l4x8 1e-5 "${l4[@]}" --set parallel.pp=2 \
        --set parallel.dp=2 --set parallel.zero=2 --set parallel.bucket_mb=0.01 "${dv[@]}" || return 1
    layout tp2pp2_sp_dualpipev one_l4 1e-5 "${l4[@]}" --set parallel.tp=2 \
        --set parallel.sequence_parallel=true --set parallel.pp=2 "${dv[@]}" || return 1
    "$PY" - "$WORK/pp4_dualpipev/metrics.jsonl" <<'PYEOF' || return 1
import json, sys
rows = [json.loads(l)["parallel"] for l in open(sys.argv[1]) if '"step"' in l]
a = rows[0]["bubble_simulated_pct"]
assert 0 < a < 100 * 0.2, a   # below ZB-H1's 20% at pp 4, m 8 (unit times)
print(f"simulated bubble: dualpipev {a:.1f}%, measured {rows[-1]['bubble_pct']:.1f}%")
PYEOF
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/again_dv" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 "${dv[@]}" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/pp2_dualpipev/metrics.jsonl" "$WORK/again_dv/metrics.jsonl" || return 1
    # a signal after micro-batch 10 stops at the step's end (step 3); resumed from its parts
    stops_and_resumes stop_dv pp2_dualpipev "${l4[@]}" --set parallel.pp=2 "${dv[@]}" || return 1
    local rc=0
    # its parts hold the V's chunks: 1F1B's stages take theirs, resharded, and train on
    # as the one-rank run does
    cp -r "$WORK/stop_dv" "$WORK/dv_as_1f1b" && rm -r "$WORK/dv_as_1f1b/checkpoints/step_00000012_0000" \
        "$WORK/dv_as_1f1b/checkpoints/step_00000008_0000" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dv_as_1f1b" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 >"$WORK/dv_as_1f1b.log" 2>&1 &&
        grep -q "resharded from tp 1 × pp 2 × dp 1 (ZeRO 0) to tp 1 × pp 2 × dp 1" \
            "$WORK/dv_as_1f1b.log" || { cat "$WORK/dv_as_1f1b.log"; return 1; }
    close "$WORK/dv_as_1f1b/metrics.jsonl" "$WORK/one_l4/metrics.jsonl" 1e-5 || return 1
    # a 1F1B pp 2 run stopped after step 3's last micro-batch, resumed by the V
    rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=12 "$PLAIT" train "$WORK/plan.json" --out "$WORK/grow_dv" \
        "${COMMON[@]}" "${l4[@]}" --set parallel.pp=2 >/dev/null 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "1f1b stop: exit $rc"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/grow_dv" "${COMMON[@]}" "${l4[@]}" \
        --set parallel.pp=2 "${dv[@]}" >"$WORK/grow_dv.log" 2>&1 || { cat "$WORK/grow_dv.log"; return 1; }
    grep -q "resharded from tp 1 × pp 2 × dp 1 (ZeRO 0)" "$WORK/grow_dv.log" ||
        { cat "$WORK/grow_dv.log"; return 1; }
    close "$WORK/grow_dv/metrics.jsonl" "$WORK/one_l4/metrics.jsonl" 1e-5 || return 1
    # evaluation through the V: one rank's validation losses
    evaluates_as_one_rank val_dv "${l4[@]}" --set parallel.pp=2 "${dv[@]}"
}
check dualpipev_matches_one_rank test_dualpipev_matches_one_rank
check data_parallel_and_zero_match_one_rank test_data_parallel_and_zero_match_one_rank
check zero_in_buckets_matches_one_rank test_zero_in_buckets_matches_one_rank
check 2x2x2_with_zero1_matches_one_rank test_2x2x2_with_zero1_matches_one_rank
check hybrid_sharding_matches_one_rank test_hybrid_sharding_matches_one_rank
check zero3_matches_one_rank test_zero3_matches_one_rank
check zero3_fp8_tracks_fp8_one_rank test_zero3_fp8_tracks_fp8_one_rank
check sequence_parallel_matches_one_rank test_sequence_parallel_matches_one_rank
check bf16_2x2_tracks_bf16_one_rank test_bf16_2x2_tracks_bf16_one_rank
check bytes_on_the_wire_match_the_formulas test_bytes_on_the_wire_match_the_formulas
check the_straggler_report_names_a_slow_rank test_the_straggler_report_names_a_slow_rank
check stopped_parallel_runs_resume_to_the_bit test_stopped_parallel_runs_resume_to_the_bit
check a_signal_to_one_stage_stops_the_pipeline_mid_step test_a_signal_to_one_stage_stops_the_pipeline_mid_step
check layouts_resume_each_others_checkpoints test_layouts_resume_each_others_checkpoints
check bad_data_ends_every_rank_with_its_reason test_bad_data_ends_every_rank_with_its_reason
check a_killed_rank_ends_the_gang_naming_it test_a_killed_rank_ends_the_gang_naming_it
finish
