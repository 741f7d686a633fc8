#!/usr/bin/env bash
# Bad input gets a clear error naming what and where, never a crash, a hang or
# lost work: forged llm.c headers, sizes that overflow, a tokenizer of another
# model, data that is not a file, data that changes under a running job.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"

test_a_tokenizer_whose_end_of_text_is_outside_the_model_is_refused() {
    # an llm.c tokenizer (version 2) of 300 tokens whose end-of-text is 280
    "$PY" - "$WORK/tok.bin" <<'PYEOF'
import struct, sys
h = [20240328, 2, 300, 280] + [0] * 252
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", *h))
    for i in range(300):
        piece = bytes([i % 256])
        f.write(bytes([len(piece)]) + piece)
PYEOF
    expect_error "$WORK/tok.log" 1 "data.tokenizer: .*tok.bin: its end-of-text token 280 is not below model.vocab 256" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/tok" --set data.tokenizer="$WORK/tok.bin" \
        --set sample.tokens=4
}

test_a_fifo_or_directory_as_data_is_refused_without_hanging() {
    mkfifo "$WORK/fifo.bin"
    expect_error "$WORK/fifo.log" 1 "data.train: $WORK/fifo.bin is a FIFO, not a regular file" \
        timeout 20 "$PLAIT" train "$WORK/plan.json" --out "$WORK/fifo" --set data.train="$WORK/fifo.bin" || return 1
    mkdir "$WORK/dir.bin"
    expect_error "$WORK/dir.log" 1 "data.train: $WORK/dir.bin is a directory, not a regular file" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/dir" --set data.train="$WORK/dir.bin" || return 1
    expect_error "$WORK/init.log" 1 "model.init: $WORK/fifo.bin is a FIFO, not a regular file" \
        timeout 20 "$PLAIT" check "$WORK/plan.json" --set model.init="$WORK/fifo.bin"
}

test_a_token_beyond_the_vocabulary_is_refused_before_training() {
    "$PY" - "$WORK/train.bin" "$WORK/badtok.bin" <<'PYEOF'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
at = 1024 + 2 * 50000  # token 50000, far beyond the first steps
data[at:at + 2] = (300).to_bytes(2, "little")
open(sys.argv[2], "wb").write(data)
PYEOF
    expect_error "$WORK/badtok.log" 1 \
        "data.train: $WORK/badtok.bin: token 300 at position 50000 \(byte 101024\) is not below the vocabulary size 256" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/badtok" --set data.train="$WORK/badtok.bin" || return 1
    ! grep -q '^step' "$WORK/badtok.log" || { echo "it trained first"; return 1; }
}

# A shard cut short while the job runs (in order, so the cut is reached):
# the job stops at the first window past the cut with the file and offset
# named, after a checkpoint of the last complete micro-batch; with the file
# restored it resumes and ends with the metrics of an undisturbed run.
test_data_that_shrinks_mid_run_checkpoints_and_resumes() {
    head -c 60000 "$ROOT/examples/data/tinyshakespeare.txt" >"$WORK/small.txt"
    "$PLAIT" data prepare "$WORK/small.txt" "$WORK/small.bin" >/dev/null || return 1
    cp "$WORK/small.bin" "$WORK/small.orig"
    local set=(--set data.train="$WORK/small.bin" --set data.shuffle=false --set steps=400
        --set checkpoint.every=0 --set data.val_every=0 --set optimizer.warmup_steps=2)
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/shrink-ref" "${set[@]}" >/dev/null 2>&1 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/shrink" "${set[@]}" >"$WORK/shrink.log" 2>&1 &
    local pid=$! rc=0
    for _ in $(seq 400); do
        [ -s "$WORK/shrink/metrics.jsonl" ] && break
        sleep 0.02
    done
    truncate -s $((1024 + 2 * 40128)) "$WORK/small.bin" # 40128 of ~60000 tokens: mid-step
    wait "$pid" || rc=$?
    [ "$rc" = 1 ] || { echo "exit code $rc"; tail "$WORK/shrink.log"; return 1; }
    grep -q "data.train: $WORK/small.bin: ends at byte 81280, inside tokens .* (the file shrank since training started: it had 60000 tokens); the work so far is in a checkpoint (step [0-9]*, mid-step): fix the data and run again to resume from there" \
        "$WORK/shrink.log" || { tail -n 3 "$WORK/shrink.log"; return 1; }
    cp "$WORK/small.orig" "$WORK/small.bin"
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/shrink" "${set[@]}" >"$WORK/shrink2.log" 2>&1 ||
        { tail "$WORK/shrink2.log"; return 1; }
    grep -q "resuming from .*mid-step" "$WORK/shrink2.log" || { head "$WORK/shrink2.log"; return 1; }
    metrics_equal "$WORK/shrink-ref/metrics.jsonl" "$WORK/shrink/metrics.jsonl"
}

# An llm.c header whose parameter count wraps around 2^64 to match a
# header-only file (hidden 2^30, one layer, padded vocab + max T = 2^32 - 15).
test_a_forged_llmc_header_is_refused() {
    "$PY" - "$WORK/forged.bin" <<'PYEOF'
import struct, sys
h = [20240326, 3, 2**31 - 14, 50257, 1, 1, 2**30, 2**31 - 1] + [0] * 248
open(sys.argv[1], "wb").write(struct.pack("<256i", *h))
PYEOF
    expect_error "$WORK/forged.log" 1 \
        "model.init: .*forged.bin: its header describes a model too large to address .*not a GPT-2 checkpoint" \
        "$PLAIT" check "$WORK/plan.json" --set model.init="$WORK/forged.bin"
}

# B·NH·T·T = 2^16 · 2^16 · 2^32 wraps to 0 in 64 bits: once it gave 0-byte buffers.
test_activation_sizes_that_overflow_are_refused() {
    expect_error "$WORK/act.log" 1 \
        "model.seq_len: batch.micro_batch × model.seq_len \(65536 × 65536 = 4294967296 rows\) is more than the kernels index" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/act" --set model.heads=65536 --set model.hidden=65536 \
        --set model.seq_len=65536 --set batch.micro_batch=65536
}

test_an_empty_run_directory_is_refused() {
    expect_error "$WORK/out.log" 2 "train: --out: the run directory must not be empty" \
        "$PLAIT" train "$WORK/plan.json" --out ""
}

# A learning rate that blows the weights up: NaN through every kernel (the
# sanitized build checks that they stay defined) and a clear stop.
test_a_diverging_run_says_so() {
    expect_error "$WORK/nan.log" 1 "step 2: loss -?nan, gradient norm -?nan: training diverged" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/nan" --set optimizer.lr=1e30 \
        --set optimizer.grad_clip=0 --set steps=4
}

check a_tokenizer_whose_end_of_text_is_outside_the_model_is_refused test_a_tokenizer_whose_end_of_text_is_outside_the_model_is_refused
check a_fifo_or_directory_as_data_is_refused_without_hanging test_a_fifo_or_directory_as_data_is_refused_without_hanging
check a_token_beyond_the_vocabulary_is_refused_before_training test_a_token_beyond_the_vocabulary_is_refused_before_training
check data_that_shrinks_mid_run_checkpoints_and_resumes test_data_that_shrinks_mid_run_checkpoints_and_resumes
check a_forged_llmc_header_is_refused test_a_forged_llmc_header_is_refused
check activation_sizes_that_overflow_are_refused test_activation_sizes_that_overflow_are_refused
check an_empty_run_directory_is_refused test_an_empty_run_directory_is_refused
check a_diverging_run_says_so test_a_diverging_run_says_so
finish
