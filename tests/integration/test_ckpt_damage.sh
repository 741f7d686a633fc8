#!/usr/bin/env bash
# A damaged checkpoint of a job of several ranks (tp 2 × dp 2, ZeRO 1: every
# kind of part file) is never resumed from: a flipped byte, a truncated shard,
# a missing shard, a manifest from another run, a shard the run cannot read,
# a disk that fills up mid-write. Each is found by plait ckpt verify and at
# start, with a message naming the file; the run resumes from the checkpoint
# before it and ends with the metrics of the run never damaged, to the bit.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
LAYOUT=(--set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1 --set data.val=null
    --set data.val_every=0)
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" "${LAYOUT[@]}" >"$WORK/ref.log" 2>&1 ||
    { cat "$WORK/ref.log"; exit 1; }
# another run of another seed: its manifests are another run's
"$PLAIT" train "$WORK/plan.json" --out "$WORK/other" "${LAYOUT[@]}" --set model.seed=8 \
    >"$WORK/other.log" 2>&1 || { cat "$WORK/other.log"; exit 1; }

# damaged NAME PATTERN HOW...: a copy of the reference whose newest checkpoint
# is gone and whose step-8 one is damaged by the command HOW (run in that
# checkpoint's directory); plait ckpt verify names it (PATTERN), and training
# reports it, resumes from step 4 and ends with the reference's metrics.
damaged() {
    local name=$1 pattern=$2 run=$WORK/$1
    shift 2
    cp -a "$WORK/ref" "$run"
    rm -rf "$run/checkpoints/step_00000012_0000"
    (cd "$run/checkpoints/step_00000008_0000" && "$@") || return 1
    expect_error "$run.verify" 1 "step_00000008_0000: (/.*/)?$pattern" "$PLAIT" ckpt verify "$run" ||
        return 1
    grep -q "^ok step_00000004_0000" "$run.verify" || { cat "$run.verify"; return 1; }
    train_again "$run" "$pattern"
}

# train_again RUN PATTERN [as...]: the run (as a user, when given) reports the
# damage, resumes from step 4 and ends with the reference's metrics
train_again() {
    local run=$1 pattern=$2
    shift 2
    "$@" "$PLAIT" train "$WORK/plan.json" --out "$run" "${LAYOUT[@]}" >"$run.log" 2>&1 ||
        { cat "$run.log"; return 1; }
    grep -qE "checkpoint .*step_00000008_0000 is unusable: (/.*/)?$pattern" "$run.log" &&
        grep -q "resuming from .*step_00000004_0000" "$run.log" || { cat "$run.log"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

flip_byte() { printf '\x5a' | dd of="$1" bs=1 seek=2000 conv=notrunc status=none; }

test_a_flipped_byte() { damaged flipped "model-tp1-pp0.bin: checksum" flip_byte model-tp1-pp0.bin; }
test_a_truncated_shard() {
    damaged truncated "optim-tp0-pp0-dp1.bin is 5000 bytes, the manifest says 73344" truncate -s 5000 optim-tp0-pp0-dp1.bin
}
# truncated with the manifest made to agree (its bytes and crc32c recomputed):
# verify, like the loader, checks the part against its own header's count
truncate_agreeing() { truncate -s 5000 "$1" && manifest_lists_as_is "$1"; }
test_a_truncated_shard_its_manifest_agrees_with() {
    damaged truncated_agreeing "optim-tp0-pp0-dp1.bin: 5000 bytes, but its header promises 73344" \
        truncate_agreeing optim-tp0-pp0-dp1.bin
}
test_a_missing_shard() { damaged missing "model-tp0-pp0.bin: No such file" rm model-tp0-pp0.bin; }
test_a_manifest_from_another_run() {
    damaged foreign "[a-z0-9-]+\.bin: checksum" \
        cp "$WORK/other/checkpoints/step_00000008_0000/manifest.json" manifest.json
}

# Unreadable by the user who trains (root reads anything, so the run is
# another user's): the file named with the system's reason.
test_a_shard_the_run_cannot_read() {
    [ "$(id -u)" = 0 ] || { echo "needs root (to train as another user)"; return 1; }
    local run=$WORK/perm
    cp -a "$WORK/ref" "$run"
    rm -rf "$run/checkpoints/step_00000012_0000"
    chmod 000 "$run/checkpoints/step_00000008_0000/optim-tp1-pp0-dp0.bin"
    chown -R nobody "$run"
    chmod 755 "$WORK"
    chmod 644 "$WORK"/*.bin "$WORK/plan.json"
    # the binaries where that user can run them (the checkout may be in root's home)
    mkdir -p "$WORK/bin" && cp "$PLAIT" "$(dirname "$PLAIT")/plait-train" "$WORK/bin/" || return 1
    PLAIT=$WORK/bin/plait train_again "$run" "optim-tp1-pp0-dp0.bin: Permission denied" \
        setpriv --reuid=nobody --regid=nogroup --clear-groups
}

# A disk that fills up while four ranks write a checkpoint: the run fails
# naming ENOSPC, no temporary is left, the checkpoint before verifies; with
# room again it resumes to the reference's metrics. A private mount namespace
# with a small tmpfs: nothing outside the test sees it.
test_a_full_disk_mid_write() {
    full_disk_then_room 700k "${LAYOUT[@]}" &&
        metrics_equal "$WORK/ref/metrics.jsonl" "$WORK/full-metrics.jsonl"
}

check a_flipped_byte test_a_flipped_byte
check a_truncated_shard test_a_truncated_shard
check a_truncated_shard_its_manifest_agrees_with test_a_truncated_shard_its_manifest_agrees_with
check a_missing_shard test_a_missing_shard
check a_manifest_from_another_run test_a_manifest_from_another_run
check a_shard_the_run_cannot_read test_a_shard_the_run_cannot_read
check a_full_disk_mid_write test_a_full_disk_mid_write
finish
