#!/usr/bin/env bash
# Checkpoint/restart: a run that is stopped (SIGTERM mid-step, SIGTERM at a
# random moment, or killed outright) and resumed ends with metrics identical to
# the bit to an uninterrupted run's; corrupt checkpoints are detected and the
# previous one is used.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

test_sigterm_mid_step_checkpoints_and_resumes_to_the_bit() {
    local run=$WORK/mid rc=0
    # micro-batch 8 is the 2nd of step 3 (grad_accum 3): a mid-step stop
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    grep -q "stopping after micro-batch 2 of step 3" "$run.log1" || { cat "$run.log1"; return 1; }
    [ -d "$run/checkpoints/step_00000002_0002" ] || { ls "$run/checkpoints"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000002_0002 (step 2, mid-step)" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

test_sigterm_at_any_moment_resumes_to_the_bit() {
    local run=$WORK/any rc=0
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=12 >"$run.log1" 2>&1 &
    local pid=$!
    # wait for the first step line, then stop it wherever it is
    for _ in $(seq 200); do grep -q '^step ' "$run.log1" 2>/dev/null && break; sleep 0.05; done
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    if [ "$rc" -eq 0 ]; then echo "(finished before the signal; nothing to resume)"; fi
    [ "$rc" -eq 75 ] || [ "$rc" -eq 0 ] || { echo "exit code $rc"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

test_kill_then_resume_redoes_lost_steps_to_the_bit() {
    local run=$WORK/kill rc=0
    # SIGKILL leaves no chance to checkpoint: stop at micro-batch 20 (step 7)
    # with a real signal path disabled, then resume from the step-4 checkpoint
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=20 "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc"; return 1; }
    # throw away the preemption checkpoint, as if the process had been killed
    rm -rf "$run"/checkpoints/step_00000006_0002
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000004_0000" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

test_corrupt_checkpoint_is_detected_and_the_previous_used() {
    local run=$WORK/corrupt rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=27 "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc"; return 1; }
    ls "$run/checkpoints"
    # step 9's checkpoint: flip one byte in the middle of the weights
    local m=$run/checkpoints/step_00000009_0000/model.bin
    local size; size=$(stat -c %s "$m")
    printf '\x55' | dd of="$m" bs=1 seek=$((size / 2)) conv=notrunc status=none
    # step 8's checkpoint: truncate the optimizer state
    truncate -s -4 "$run/checkpoints/step_00000008_0000/optim.bin"
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "step_00000009_0000 is unusable: model.bin: checksum" "$run.log2" || { cat "$run.log2"; return 1; }
    grep -q "step_00000008_0000 is unusable: optim.bin is .* bytes, the manifest says" "$run.log2" || { cat "$run.log2"; return 1; }
    grep -q "resuming from .*step_00000004_0000" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

# A whole checkpoint whose header the loader would refuse, with its manifest
# made to agree: step 12's model.bin says another vocabulary, step 8's
# optim.bin carries gradients though state.json says the step was finished.
# plait ckpt verify refuses both as the loader does, naming the file, and the
# run resumes from step 4 to the reference's metrics.
forge_header() { # FILE WORD VALUE [FLOATS_APPENDED]
    "$PY" - "$@" <<'PYEOF'
import struct, sys
name, word, value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = int(sys.argv[4]) if len(sys.argv) > 4 else 0
d = bytearray(open(name, "rb").read())
struct.pack_into("<i", d, 4 * word, value)
open(name, "wb").write(bytes(d) + bytes(4 * extra))
PYEOF
    manifest_lists_as_is "$1"
}
test_verify_refuses_the_whole_checkpoints_the_loader_refuses() {
    local run=$WORK/headers ckpts=$WORK/headers/checkpoints
    cp -a "$WORK/ref" "$run"
    (cd "$ckpts/step_00000012_0000" && forge_header model.bin 3 255) || return 1
    # the gradients: as many floats again as each moment (optim.bin's count, word 2)
    local count
    count=$("$PY" -c 'import struct,sys; print(struct.unpack_from("<i", open(sys.argv[1],"rb").read(), 8)[0])' \
        "$ckpts/step_00000008_0000/optim.bin")
    (cd "$ckpts/step_00000008_0000" && forge_header optim.bin 4 1 "$count") || return 1
    expect_error "$run.verify" 1 "step_00000012_0000: /.*/model.bin: its header does not say what the plan" \
        "$PLAIT" ckpt verify "$run" || return 1
    grep -q "step_00000008_0000: /.*/optim.bin: its header does not say .*micro-batch 0" "$run.verify" &&
        grep -q "^ok step_00000004_0000" "$run.verify" || { cat "$run.verify"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log" 2>&1 || { cat "$run.log"; return 1; }
    grep -q "step_00000012_0000 is unusable: .*model.bin: its header" "$run.log" &&
        grep -q "step_00000008_0000 is unusable: .*optim.bin: its header" "$run.log" &&
        grep -q "resuming from .*step_00000004_0000" "$run.log" || { cat "$run.log"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

test_all_checkpoints_corrupt_is_an_error_not_a_fresh_start() {
    local run=$WORK/allbad rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=14 "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc"; return 1; }
    for d in "$run"/checkpoints/step_*; do echo garbage >"$d/state.json"; done
    rc=0
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || { echo "exit code $rc, want 1"; cat "$run.log2"; return 1; }
    grep -q "none of its 2 checkpoints is usable" "$run.log2" || { cat "$run.log2"; return 1; }
}

test_keep_prunes_old_checkpoints() {
    local run=$WORK/keep
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set checkpoint.every=2 --set checkpoint.keep=2 >/dev/null 2>&1 || return 1
    local got; got=$(ls "$run/checkpoints" | tr '\n' ' ')
    [ "$got" = "step_00000010_0000 step_00000012_0000 " ] || { echo "left: $got"; return 1; }
}

test_finished_run_is_not_retrained() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" >"$WORK/again.log" 2>&1 || return 1
    grep -q "already finished its 12 steps" "$WORK/again.log" || { cat "$WORK/again.log"; return 1; }
}

# A rerun of a finished run that does not train changes nothing on disk, even with a
# changed (resumable) layout: its plan.json, metrics, end.json, train.log and checkpoints stay
# as they were; a later legal change (dp 2 -> 1 with grad_accum 3 -> 6, the same global batch)
# then resumes against the plan that trained it
test_a_rerun_that_does_not_train_changes_nothing() {
    local run=$WORK/kept
    "$PLAIT" train "$WORK/plan.json" --out "$run" --ranks 2 --set parallel.dp=2 --set steps=4 \
        >"$run.log1" 2>&1 || { cat "$run.log1"; return 1; }
    local before after
    before=$(cd "$run" && find . -type f ! -name .lock -exec sha256sum {} + | sort)
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set parallel.dp=1 --set steps=4 \
        >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "already finished its 4 steps" "$run.log2" || { cat "$run.log2"; return 1; }
    after=$(cd "$run" && find . -type f ! -name .lock -exec sha256sum {} + | sort)
    [ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after"); return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set parallel.dp=1 --set batch.grad_accum=6 \
        --set steps=6 >"$run.log3" 2>&1 || { cat "$run.log3"; return 1; }
    grep -q "resuming from .*step_00000004_0000" "$run.log3" || { cat "$run.log3"; return 1; }
}

# Raising steps with optimizer.decay_steps set continues the same schedule: 8 steps then 8
# more equal 16 straight, to the bit (lr included); without it, the resume names the step
# whose rate jumps, both rates, and the decay_steps that would have kept it.
test_raising_steps_keeps_the_schedule_with_decay_steps_and_names_the_jump_without() {
    local keep=(--set optimizer.decay_steps=12)
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/long" --set steps=16 "${keep[@]}" \
        >"$WORK/long.log" 2>&1 || { cat "$WORK/long.log"; return 1; }
    local run=$WORK/raised
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=8 "${keep[@]}" >"$run.log1" 2>&1 &&
        "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=16 "${keep[@]}" >"$run.log2" 2>&1 ||
        { cat "$run.log1" "$run.log2"; return 1; }
    if grep -q "schedule changes shape" "$run.log2"; then cat "$run.log2"; return 1; fi
    metrics_equal "$WORK/long/metrics.jsonl" "$run/metrics.jsonl" || return 1
    run=$WORK/jumped
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=8 >"$run.log1" 2>&1 &&
        "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=16 >"$run.log2" 2>&1 ||
        { cat "$run.log1" "$run.log2"; return 1; }
    grep -Eq "the learning-rate schedule changes shape: step 9 trains with lr [0-9.e-]+, where the checkpoint's plan gave it [0-9.e-]+; optimizer.decay_steps 8 keeps" "$run.log2" ||
        { cat "$run.log2"; return 1; }
}

check sigterm_mid_step_checkpoints_and_resumes_to_the_bit test_sigterm_mid_step_checkpoints_and_resumes_to_the_bit
check sigterm_at_any_moment_resumes_to_the_bit test_sigterm_at_any_moment_resumes_to_the_bit
check kill_then_resume_redoes_lost_steps_to_the_bit test_kill_then_resume_redoes_lost_steps_to_the_bit
check corrupt_checkpoint_is_detected_and_the_previous_used test_corrupt_checkpoint_is_detected_and_the_previous_used
check verify_refuses_the_whole_checkpoints_the_loader_refuses test_verify_refuses_the_whole_checkpoints_the_loader_refuses
check all_checkpoints_corrupt_is_an_error_not_a_fresh_start test_all_checkpoints_corrupt_is_an_error_not_a_fresh_start
check keep_prunes_old_checkpoints test_keep_prunes_old_checkpoints
check finished_run_is_not_retrained test_finished_run_is_not_retrained
check raising_steps_keeps_the_schedule_with_decay_steps_and_names_the_jump_without test_raising_steps_keeps_the_schedule_with_decay_steps_and_names_the_jump_without
check a_rerun_that_does_not_train_changes_nothing test_a_rerun_that_does_not_train_changes_nothing
finish
