#!/usr/bin/env bash
# checkpoint.async: checkpoints written by a thread from a host copy of each
# rank's part, committed at a later step boundary. The same files and the
# same metrics as synchronous checkpoints, to the bit; a writer slower than
# the steps is waited for, never skipped; a process killed while a checkpoint
# is being written leaves no visible checkpoint that is incomplete, and
# resumes to the bit. strace delays every fsync to make the writer slow.
source "$(dirname "$0")/lib.sh"
# LeakSanitizer cannot run under ptrace (strace): the sanitized runs leave it out there
NO_LEAKS="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0 --set checkpoint.every=2)
LAYOUT=(--set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1)

# same_checkpoints A B: the checkpoints both runs kept hold the same files
same_checkpoints() {
    local n=0 c f
    for c in "$1"/checkpoints/step_*; do
        for f in "$c"/*.bin "$c"/state.json; do
            cmp "$f" "$2/checkpoints/$(basename "$c")/$(basename "$f")" || return 1
            n=$((n + 1))
        done
    done
    [ "$n" -gt 0 ] || { echo "no checkpoint files compared"; return 1; }
}

# async_like_sync NAME [options]: a run with checkpoint.async against the
# same run without
async_like_sync() {
    local name=$1
    shift
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name-sync" "${COMMON[@]}" "$@" \
        >"$WORK/$name-sync.log" 2>&1 || { cat "$WORK/$name-sync.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" \
        --set checkpoint.async=true >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; return 1; }
    grep -q "checkpoint step 10 written in .* in the background" "$WORK/$name.log" ||
        { cat "$WORK/$name.log"; return 1; }
    metrics_equal "$WORK/$name-sync/metrics.jsonl" "$WORK/$name/metrics.jsonl" &&
        same_checkpoints "$WORK/$name" "$WORK/$name-sync" &&
        "$PLAIT" ckpt verify "$WORK/$name" >/dev/null
}

test_one_rank_writes_what_a_synchronous_save_writes() { async_like_sync one; }
test_four_ranks_write_what_a_synchronous_save_writes() { async_like_sync four "${LAYOUT[@]}"; }
# ZeRO 3: each rank's copy is its slice of the parameters (model-tp0-pp0-dpD.bin)
test_zero3_writes_what_a_synchronous_save_writes() {
    async_like_sync z3 --set parallel.dp=2 --set parallel.zero=3
}

# Every fsync 150 ms late and a checkpoint every step: each checkpoint is
# still being written when the next is due; each is waited for and
# committed, none skipped.
test_a_slow_writer_is_waited_for_never_skipped() {
    local run=$WORK/slow
    env "$NO_LEAKS" strace -f -o /dev/null -e trace=fsync -e inject=fsync:delay_exit=150000 \
        "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" --set checkpoint.every=1 \
        --set checkpoint.async=true >"$run.log" 2>&1 || { cat "$run.log"; return 1; }
    grep -q "waiting for checkpoint step" "$run.log" || { cat "$run.log"; return 1; }
    for s in $(seq 1 11); do
        grep -q "checkpoint step $s written in .* in the background" "$run.log" ||
            { echo "checkpoint step $s was not written"; cat "$run.log"; return 1; }
    done
    metrics_equal "$WORK/one-sync/metrics.jsonl" "$run/metrics.jsonl"
}

# kill_tree PID: SIGKILL to PID and every process below it, children first stopped
kill_tree() {
    local c
    kill -STOP "$1" 2>/dev/null
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -9 "$1" 2>/dev/null
}

# kill -9 while a checkpoint's files are being written: the checkpoints
# that are visible all verify, and the run resumes to the bit.
test_killed_mid_write_resumes_to_the_bit() {
    local run=$WORK/killed
    env "$NO_LEAKS" strace -f -o /dev/null -e trace=fsync -e inject=fsync:delay_exit=300000 \
        "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" "${LAYOUT[@]}" \
        --set checkpoint.async=true >"$run.log" 2>&1 &
    local pid=$! seen=0
    for _ in $(seq 600); do
        if ls -a "$run/checkpoints" 2>/dev/null | grep -q '^\.tmp-step_00000004'; then
            seen=1
            break
        fi
        sleep 0.02
    done
    [ "$seen" = 1 ] || { kill -9 "$pid"; echo "no checkpoint being written"; cat "$run.log"; return 1; }
    kill_tree "$pid"
    wait "$pid" 2>/dev/null
    sleep 0.2
    if ls "$run/checkpoints" | grep -q .; then
        "$PLAIT" ckpt verify "$run" || return 1
    fi
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${COMMON[@]}" "${LAYOUT[@]}" \
        --set checkpoint.async=true >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/four-sync/metrics.jsonl" "$run/metrics.jsonl"
}

check one_rank_writes_what_a_synchronous_save_writes test_one_rank_writes_what_a_synchronous_save_writes
check four_ranks_write_what_a_synchronous_save_writes test_four_ranks_write_what_a_synchronous_save_writes
check zero3_writes_what_a_synchronous_save_writes test_zero3_writes_what_a_synchronous_save_writes
check a_slow_writer_is_waited_for_never_skipped test_a_slow_writer_is_waited_for_never_skipped
check killed_mid_write_resumes_to_the_bit test_killed_mid_write_resumes_to_the_bit
finish
