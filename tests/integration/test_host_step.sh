#!/usr/bin/env bash
# test_host_step.sh — a GPU rank's offloaded optimizer step (runtime/host_step.h:
# parallel.offload "host" or "nvme" on a GPU rank, the slice's master weights, gradient and
# moments in host memory, AdamW on the CPU window by window, a copy thread moving the
# gradient down ahead and the weights up behind), run here on CPU ranks through
# PLAIT_DEBUG_HOST_STEP=1, its copies the CPU backend's download and upload. With windows
# of ~700 floats (dozens a step) it must give the bits of the run without offload: one
# rank in fp32 and bf16 (the bf16 copy rebuilt from the uploaded weights), dp 2 at ZeRO 1,
# 2 and 3, the moments in files ("nvme"); the model holds no optimizer state beside its
# weights and gradients, and the host memory it holds is what gpt2_memory counts; a run
# stopped mid-step resumes to the bit (its master weights read again from the loaded
# ones); checkpoints cross between it and a run without offload, also written in the
# background (checkpoint.async). Where nothing sums the gradient after backward (dp 1) it
# comes down during the step's last backward, layer by layer as the grads_final hook says
# it is final (ops download_after), the rest at the step: with grad_accum 1 and 3 and over
# 2 pipeline stages (1F1B and interleaved), the same bits, and the run's closing line counts
# the floats that came down during backward. At dp 2 in per-layer buckets (ZeRO 0, 1 and 2,
# grad_accum 3: ZeRO 2's earlier hand-overs are not the step's) the slice's layers come
# down as their buckets' sums arrive: the bits and checkpoints of the run without offload
# and of the run with the overlap off (PLAIT_DEBUG_NO_OFFLOAD_OVERLAP=1, none of it early),
# and a share that came down before the step; one bucket for the whole gradient (the
# default bucket_mb here) sums after backward, and all of it comes down at the step.
# tests/gpu/test_cuda.sh runs the one-rank cases on a GPU.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0)
WINDOWS=(--set parallel.offload_window_mb=0.0027) # ~700 floats: the slice in dozens
BUCKETS=(--set parallel.bucket_mb=0.01)           # ~2,600 floats: a bucket per layer

# run NAME [--set ...]: a training run into $WORK/NAME
run() {
    local name=$1
    shift
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 ||
        { tail -n 20 "$WORK/$name.log"; return 1; }
}

# offloaded NAME [--set ...]: the same through the GPU's offloaded step
offloaded() {
    local name=$1
    shift
    PLAIT_DEBUG_HOST_STEP=1 run "$name" "${WINDOWS[@]}" "$@" || return 1
    grep -q 'parallel.offload "[a-z]*": the optimizer steps on the CPU' "$WORK/$name.log" ||
        { cat "$WORK/$name.log"; return 1; }
}

# memory NAME MODE: rank 0 of run NAME holds no moments beside its weights (ZeRO's staging
# slice only), and as much host memory as gpt2_memory counts for MODE (host: the master,
# gradient and both moments, 16 bytes a slice element; nvme: 8 bytes a slice element and
# two windows of each moment)
memory() {
    "$PY" - "$WORK/$1/run.json" "$WORK/${1%_*}/run.json" "$2" <<'PYEOF'
import json, sys
off, ref = (json.load(open(p))["memory"]["ranks"][0] for p in sys.argv[1:3])
a, b = off["allocated"], ref["allocated"]
for k in ("params", "grads", "activations"):
    assert a[k] == b[k], (k, a, b)
S = (b["optimizer"] - a["optimizer"]) // 8  # the moments left the model: 8 bytes an element
assert S > 0 and b["optimizer"] - a["optimizer"] == 8 * S, (a, b)
if sys.argv[3] == "host":  # the slice's 4 arrays
    assert a["host"] == 16 * S, (a, b)
else:                      # master and gradient, and 2 windows of ~700 floats of each moment
    w = (a["host"] - 8 * S) // 16
    assert 0 < w < S and a["host"] == 8 * S + 16 * w, (a, b, w)
print(f"{sys.argv[1]}: slice {S} floats, host {a['host']} bytes, model optimizer {a['optimizer']}")
PYEOF
}

test_the_offloaded_step_gives_the_bits_without_offload() {
    run none && offloaded none_host --set parallel.offload=host &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/none_host/metrics.jsonl" &&
        memory none_host host || return 1
    run bf16 --set precision=bf16 && offloaded bf16_host --set precision=bf16 --set parallel.offload=host &&
        metrics_equal "$WORK/bf16/metrics.jsonl" "$WORK/bf16_host/metrics.jsonl" || return 1
    local z
    for z in 1 2 3; do
        run dp2z$z --set parallel.dp=2 --set parallel.zero=$z &&
            offloaded dp2z${z}_host --set parallel.dp=2 --set parallel.zero=$z --set parallel.offload=host &&
            metrics_equal "$WORK/dp2z$z/metrics.jsonl" "$WORK/dp2z${z}_host/metrics.jsonl" &&
            memory dp2z${z}_host host || return 1
    done
}

test_the_gradient_comes_down_during_backward() {
    # grad_accum 3 (the plan's) and 1, the whole gradient sliced into windows or in one
    offload_overlapped "$WORK/none_host.log" || return 1
    run a1 --set batch.grad_accum=1 && offloaded a1_host --set batch.grad_accum=1 \
        --set parallel.offload=host &&
        metrics_equal "$WORK/a1/metrics.jsonl" "$WORK/a1_host/metrics.jsonl" &&
        offload_overlapped "$WORK/a1_host.log" || return 1
    PLAIT_DEBUG_HOST_STEP=1 run one_window --set parallel.offload=host &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/one_window/metrics.jsonl" &&
        offload_overlapped "$WORK/one_window.log" || return 1
    # two pipeline stages: rank 0 is the first, its embeddings at the step, its layer during
    # backward; interleaved, each stage's two chunks
    run pp2 --set parallel.pp=2 && offloaded pp2_host --set parallel.pp=2 \
        --set parallel.offload=host &&
        metrics_equal "$WORK/pp2/metrics.jsonl" "$WORK/pp2_host/metrics.jsonl" &&
        offload_overlapped "$WORK/pp2_host.log" || return 1
    local inter=(--set model.layers=4 --set batch.grad_accum=4 --set parallel.pp=2
        --set parallel.schedule=interleaved
        --set parallel.virtual_stages=2)
    run pp2i "${inter[@]}" && offloaded pp2i_host "${inter[@]}" --set parallel.offload=host &&
        metrics_equal "$WORK/pp2i/metrics.jsonl" "$WORK/pp2i_host/metrics.jsonl" &&
        offload_overlapped "$WORK/pp2i_host.log" || return 1
    # dp 2 in one bucket (bucket_mb beyond the gradient): summed after backward, all of it
    # comes down at the step
    offload_none "$WORK/dp2z1_host.log"
}

# offload_none LOG: the run's closing line says none of its gradient came down before the step
offload_none() {
    local n m
    read -r n m _ <<<"$(offload_early "$1")"
    [ "${n:-}" = 0 ] && [ "${m:-0}" -gt 0 ] ||
        { echo "$1: ${n:-?} of ${m:-?} gradient floats came down during backward"; return 1; }
}

# same_checkpoints A B: runs A and B wrote the same checkpoints, part file by part file
same_checkpoints() {
    local d f n=0
    for d in "$WORK/$1"/checkpoints/step_*; do
        for f in "$d"/*.bin "$d"/state.json; do
            cmp "$f" "$WORK/$2/checkpoints/${d##*/}/${f##*/}" || return 1
            n=$((n + 1))
        done
    done
    [ "$n" -gt 0 ] || { echo "$1: no checkpoints"; return 1; }
}

test_at_dp_2_the_slice_comes_down_as_its_buckets_arrive() {
    local z sets host=(--set parallel.offload=host) n m k
    for z in 0 1 2; do
        sets=(--set parallel.dp=2 --set parallel.zero=$z "${BUCKETS[@]}")
        run dp2z${z}b "${sets[@]}" && offloaded dp2z${z}b_host "${sets[@]}" "${host[@]}" &&
            PLAIT_DEBUG_NO_OFFLOAD_OVERLAP=1 offloaded dp2z${z}b_off "${sets[@]}" "${host[@]}" ||
            return 1
        metrics_equal "$WORK/dp2z${z}b/metrics.jsonl" "$WORK/dp2z${z}b_host/metrics.jsonl" &&
            metrics_equal "$WORK/dp2z${z}b/metrics.jsonl" "$WORK/dp2z${z}b_off/metrics.jsonl" &&
            same_checkpoints dp2z${z}b dp2z${z}b_host && same_checkpoints dp2z${z}b dp2z${z}b_off &&
            offload_none "$WORK/dp2z${z}b_off.log" || return 1
        # rank 0's slice: the embeddings (at the step) and, at ZeRO 1 and 2, layer 0's lower part
        read -r n m k <<<"$(offload_early "$WORK/dp2z${z}b_host.log")"
        echo "dp2z${z}b_host: ${n:-?} of ${m:-?} gradient floats came down before the step, ${k:-?} of them after the backward"
        [ -n "${m:-}" ] && [ "$m" -gt 0 ] && [ "$n" -gt 0 ] && [ "$n" -lt "$m" ] && [ "$k" -le "$n" ] ||
            return 1
    done
}

test_the_moments_in_files_give_the_same_bits() {
    offloaded none_nvme --set parallel.offload=nvme --set parallel.offload_dir="$WORK/d1" &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/none_nvme/metrics.jsonl" &&
        memory none_nvme nvme || return 1
    offloaded dp2z1_nvme --set parallel.dp=2 --set parallel.zero=1 --set parallel.offload=nvme \
        --set parallel.offload_dir="$WORK/d2" &&
        metrics_equal "$WORK/dp2z1/metrics.jsonl" "$WORK/dp2z1_nvme/metrics.jsonl"
}

test_stopped_mid_step_resumes_to_the_bit() {
    local rc=0
    PLAIT_DEBUG_HOST_STEP=1 PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" \
        --out "$WORK/stop" "${COMMON[@]}" "${WINDOWS[@]}" --set parallel.offload=host \
        >"$WORK/stop.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$WORK/stop.log"; return 1; }
    offloaded stop --set parallel.offload=host && grep -q "resuming from .*step_00000002_0002" "$WORK/stop.log" &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/stop/metrics.jsonl" || { cat "$WORK/stop.log"; return 1; }
}

test_checkpoints_cross_and_write_in_the_background() {
    # the run without offload's step-8 checkpoint resumed offloaded, and the reverse
    local from
    for from in none none_host; do
        cp -r "$WORK/$from" "$WORK/cross_$from" &&
            rm -r "$WORK/cross_$from/checkpoints/step_00000012_0000" || return 1
    done
    offloaded cross_none --set parallel.offload=host && run cross_none_host &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/cross_none/metrics.jsonl" &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/cross_none_host/metrics.jsonl" || return 1
    # checkpoint.async copies the moments from host memory: the same checkpoints
    offloaded async --set parallel.offload=host --set checkpoint.async=true &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/async/metrics.jsonl" || return 1
    cmp "$WORK/none/checkpoints/step_00000008_0000/optim.bin" \
        "$WORK/async/checkpoints/step_00000008_0000/optim.bin" &&
        cmp "$WORK/none/checkpoints/step_00000008_0000/model.bin" \
            "$WORK/async/checkpoints/step_00000008_0000/model.bin"
}

check the_offloaded_step_gives_the_bits_without_offload test_the_offloaded_step_gives_the_bits_without_offload
check the_gradient_comes_down_during_backward test_the_gradient_comes_down_during_backward
check at_dp_2_the_slice_comes_down_as_its_buckets_arrive test_at_dp_2_the_slice_comes_down_as_its_buckets_arrive
check the_moments_in_files_give_the_same_bits test_the_moments_in_files_give_the_same_bits
check stopped_mid_step_resumes_to_the_bit test_stopped_mid_step_resumes_to_the_bit
check checkpoints_cross_and_write_in_the_background test_checkpoints_cross_and_write_in_the_background
finish
