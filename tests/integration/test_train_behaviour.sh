#!/usr/bin/env bash
# What a training run promises besides resume: recompute never changes the
# losses, bf16 stays close to fp32, the loss falls, shuffled data is seeded,
# bad data and bad plans fail with messages that say where, and the CLI's
# contract (exit codes, --set, run.json, metrics fields).
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"

# fields of every step record, as text, for exact comparison
losses() { "$PY" -c 'import json,sys; [print(r["step"], repr(r["loss"]), repr(r["grad_norm"])) for r in map(json.loads, open(sys.argv[1])) if "step" in r]' "$1"; }

test_recompute_gives_the_same_losses_to_the_bit() {
    for r in none selective full; do
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/rc_$r" --set recompute=$r --set steps=4 \
            --set data.val=null --set data.val_every=0 >/dev/null 2>&1 || { echo "recompute=$r failed"; return 1; }
        losses "$WORK/rc_$r/metrics.jsonl" >"$WORK/rc_$r.txt"
    done
    diff "$WORK/rc_none.txt" "$WORK/rc_selective.txt" && diff "$WORK/rc_none.txt" "$WORK/rc_full.txt" || return 1
    # ... while keeping less: activation memory none > selective > full
    "$PY" - "$WORK" <<'PYEOF'
import json, sys
b = [json.load(open(f"{sys.argv[1]}/rc_{r}/run.json"))["activation_bytes"] for r in ("none", "selective", "full")]
print("activation bytes none/selective/full:", b)
assert b[0] > b[1] > b[2] > 0, b
PYEOF
}

test_bf16_tracks_fp32() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/bf16" --set precision=bf16 --set steps=4 \
        --set data.val=null --set data.val_every=0 >/dev/null 2>&1 || return 1
    "$PY" - "$WORK/rc_none/metrics.jsonl" "$WORK/bf16/metrics.jsonl" <<'PYEOF'
import json, sys
a = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "step" in r]
b = [r["loss"] for r in map(json.loads, open(sys.argv[2])) if "step" in r]
# bf16 rounds matrix-product inputs to 8 significant bits (u = 2^-9); over a
# few steps of a tiny model the loss moves by a small multiple of u
rel = [abs(x - y) / x for x, y in zip(a, b)]
print("fp32", a, "\nbf16", b, "\nrel", rel)
assert a != b, "bf16 gave fp32's exact losses: is it really rounding?"
assert max(rel) < 1e-2, rel
PYEOF
}

test_loss_falls_below_unigram_entropy() {
    # 200 steps of 512 tokens on Shakespeare: the unigram entropy is 3.31 nats
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/learn" --set steps=200 --set model.hidden=64 \
        --set model.heads=4 --set model.seq_len=64 --set batch.micro_batch=8 \
        --set batch.grad_accum=1 --set optimizer.lr=3e-3 --set optimizer.warmup_steps=10 \
        --set data.val_every=0 --set data.val_batches=20 >"$WORK/learn.log" 2>&1 ||
        { cat "$WORK/learn.log"; return 1; }
    "$PY" - "$WORK/learn/metrics.jsonl" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
val = [r["val_loss"] for r in recs if "val_loss" in r]
first = next(r["loss"] for r in recs if "step" in r)
print("first loss", first, "final val loss", val[-1])
assert abs(first - 5.545) < 0.1, "an untrained byte model starts near ln(256) = 5.545"
assert val[-1] < 3.0, val
PYEOF
}

test_shuffle_is_seeded() {
    local a=$WORK/sh_a b=$WORK/sh_b c=$WORK/sh_c
    "$PLAIT" train "$WORK/plan.json" --out "$a" --set steps=3 --set data.val=null --set data.val_every=0 >/dev/null 2>&1 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$b" --set steps=3 --set data.val=null --set data.val_every=0 >/dev/null 2>&1 || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$c" --set steps=3 --set data.val=null --set data.val_every=0 --set model.seed=8 >/dev/null 2>&1 || return 1
    metrics_equal "$a/metrics.jsonl" "$b/metrics.jsonl" >/dev/null || { echo "same seed, different losses"; return 1; }
    if metrics_equal "$a/metrics.jsonl" "$c/metrics.jsonl" >/dev/null; then echo "different seed, same losses"; return 1; fi
}

test_data_in_order_reads_consecutive_windows() {
    # a shard of 0,1,2,...: with shuffle off, micro-batch k starts at token k·B·T
    "$PY" - "$WORK/count.bin" <<'PYEOF'
import struct, sys
n = 1000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[i % 200 for i in range(n)]))
PYEOF
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/count" --set data.train="$WORK/count.bin" \
        --set data.shuffle=false --set data.val=null --set data.val_every=0 --set steps=3 \
        --set batch.grad_accum=1 >"$WORK/count.log" 2>&1 || { cat "$WORK/count.log"; return 1; }
    # state of the final checkpoint: 3 micro-batches of 4x32 tokens read
    grep -q '"index": 384' "$WORK/count/checkpoints/step_00000003_0000/state.json" ||
        { cat "$WORK/count/checkpoints/step_00000003_0000/state.json"; return 1; }
}

test_bad_data_is_refused_with_the_file_named() {
    printf 'not a shard at all, but long enough to hold a header? no.' >"$WORK/junk.bin"
    head -c 2000 /dev/zero >>"$WORK/junk.bin"
    expect_error "$WORK/e1.log" 1 "data.train: .*junk.bin: not an llm.c token shard \(magic" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/e1" --set data.train="$WORK/junk.bin" || return 1
    expect_error "$WORK/e2.log" 1 "data.train: no file matches .*nothing_\*.bin" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/e2" --set "data.train=$WORK/nothing_*.bin" || return 1
    # a token outside the vocabulary: the shard of 0..199 against vocab 100
    expect_error "$WORK/e3.log" 1 "count.bin: token 100 at position 100 \(byte 1224\) is not below the vocabulary size 100 \(model.vocab\)" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/e3" --set data.train="$WORK/count.bin" \
        --set data.shuffle=false --set model.vocab=100 --set data.val=null --set data.val_every=0 || return 1
    # a truncated shard
    head -c 1500 "$WORK/count.bin" >"$WORK/short.bin"
    expect_error "$WORK/e4.log" 1 "short.bin: header says 1000 tokens \(3024 bytes\) but the file has 1500 bytes" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/e4" --set data.train="$WORK/short.bin" || return 1
}

test_cli_contract() {
    expect_error "$WORK/c1.log" 1 "^plait: error: --set optimizer.lr=-1: optimizer.lr: must be > 0 \(got -1\)" \
        "$PLAIT" train "$WORK/plan.json" --set optimizer.lr=-1 || return 1
    expect_error "$WORK/c2.log" 2 "usage: plait train" "$PLAIT" train || return 1
    expect_error "$WORK/c3.log" 2 "unknown command 'trian'" "$PLAIT" trian x || return 1
    expect_error "$WORK/c4.log" 1 "parallel.device: \"cuda\" is not available" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/c4" --set parallel.device=cuda || return 1
    expect_error "$WORK/c5.log" 1 'parallel.dp_replicate: 2 with parallel.zero 0: ZeRO 0 shards nothing' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/c5" --set parallel.dp=2 \
        --set parallel.dp_replicate=2 || return 1
    # run.json records the resolved plan, the version and the machine; metrics have the fields
    "$PY" - "$WORK/rc_none" <<'PYEOF'
import json, sys
run = json.load(open(sys.argv[1] + "/run.json"))
assert run["plan"]["recompute"] == "none" and run["plan"]["steps"] == 4, run["plan"]
assert run["version"] and run["machine"]["threads"] >= 1 and run["machine"]["cpu"], run
# plait check's modelled speed on this machine beside the measured one
th = run["throughput"]
assert th["modelled_tokens_per_s"] > 0 and th["measured_tokens_per_s"] > 0, th
step = json.loads(open(sys.argv[1] + "/metrics.jsonl").readline())
for k in ("step", "loss", "lr", "grad_norm", "tokens", "ms", "tokens_per_s"):
    assert k in step, k
assert step["step"] == 1 and step["tokens"] == 4 * 32 * 3, step
# a CPU rank has no datasheet peak: no MFU in the metrics or on the progress line
log = open(sys.argv[1] + "/train.log").read()
assert "mfu" not in step and "% of peak" in log and "MFU" not in log, (step, log[-500:])
PYEOF
}

test_data_prepare_writes_llmc_shards() {
    printf 'hello, world\n' >"$WORK/hello.txt"
    "$PLAIT" data prepare "$WORK/hello.txt" "$WORK/hello.bin" >"$WORK/hello.log" || return 1
    grep -q "13 tokens (vocab 256)" "$WORK/hello.log" || { cat "$WORK/hello.log"; return 1; }
    "$PY" - "$WORK/hello.bin" <<'PYEOF'
import struct, sys
b = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", b[:1024])
assert h[:3] == (20240520, 1, 13), h[:3]
toks = struct.unpack("<13H", b[1024:])
assert bytes(toks) == b"hello, world\n", toks
PYEOF
}

test_init_reads_llmc_fp32_and_bf16_checkpoints() {
    # the same bf16-representable weights as an llm.c v3 (fp32) and v5 (bf16) file
    # must give the same logits to the bit; a checkpoint written by plait loads too
    "$PY" - "$WORK" <<'PYEOF' || return 1
import sys, numpy as np
w = sys.argv[1]
L, NH, C, V, Vp, T = 2, 2, 32, 256, 256, 32
n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
p = (np.random.default_rng(3).standard_normal(n) * 0.05).astype(np.float32)
bits = (p.view(np.uint32) >> 16).astype(np.uint16)          # truncate: exact in bf16
p = (bits.astype(np.uint32) << 16).view(np.float32)
for version, body in ((3, p.tobytes()), (5, bits.tobytes())):
    h = np.zeros(256, np.int32); h[:8] = (20240326, version, T, V, L, NH, C, Vp)
    open(f"{w}/init_v{version}.bin", "wb").write(h.tobytes() + body)
PYEOF
    for v in 3 5; do
        PLAIT_DUMP_STEP1="$WORK/init_v$v/dump" "$PLAIT" train "$WORK/plan.json" --out "$WORK/init_v$v" \
            --set model.init="$WORK/init_v$v.bin" --set steps=1 --set optimizer.warmup_steps=0 \
            --set data.val=null --set data.val_every=0 >"$WORK/init_v$v.log" 2>&1 || { cat "$WORK/init_v$v.log"; return 1; }
    done
    cmp "$WORK/init_v3/dump/logits.f32" "$WORK/init_v5/dump/logits.f32" || return 1
    # plait's own checkpoint is an llm.c file: start a new run from it
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/init_ckpt" --set steps=1 --set optimizer.warmup_steps=0 \
        --set model.init="$WORK/init_v3/checkpoints/step_00000001_0000/model.bin" \
        --set data.val=null --set data.val_every=0 >"$WORK/init_ckpt.log" 2>&1 || { cat "$WORK/init_ckpt.log"; return 1; }
    # and a plan contradicting the checkpoint's header is refused
    expect_error "$WORK/init_bad.log" 1 "model.layers: 3 contradicts model.init \(init_v3.bin has 2\)" \
        "$PLAIT" train "$WORK/plan.json" --set model.init="$WORK/init_v3.bin" --set model.layers=3
}

# An untrained model's samples are random bytes: what reaches the console and train.log is
# still valid UTF-8 (a byte that cannot start or continue a character is written \xNN), and
# the sample is there, before training and after
test_samples_are_valid_utf8() {
    local run=$WORK/utf8
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set steps=1 --set optimizer.warmup_steps=0 \
        --set sample.tokens=400 --set data.val=null --set data.val_every=0 >"$run.out" 2>&1 ||
        { cat "$run.out"; return 1; }
    "$PY" - "$run.out" "$run/train.log" <<'PYEOF'
import sys
for path in sys.argv[1:]:
    text = open(path, "rb").read().decode("utf-8")  # strict: raises on any invalid byte
    escaped = text.count("\\x")
    assert escaped > 10, f"{path}: {escaped} escaped bytes; the random model's sample is missing?"
PYEOF
}

# The progress line says a pipeline's bubble only where there is a pipeline (pp 1: no rank
# waits for a neighbour)
test_progress_line_says_what_means_something() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/dp2" --ranks 2 --set parallel.dp=2 \
        --set steps=3 --set data.val=null --set data.val_every=0 >"$WORK/dp2.log" 2>&1 ||
        { cat "$WORK/dp2.log"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/pp2" --ranks 2 --set parallel.pp=2 \
        --set steps=3 --set data.val=null --set data.val_every=0 >"$WORK/pp2.log" 2>&1 ||
        { cat "$WORK/pp2.log"; return 1; }
    grep "^step" "$WORK/dp2.log" | grep -q "straggler" && ! grep "^step" "$WORK/dp2.log" | grep -q bubble &&
        grep "^step" "$WORK/pp2.log" | grep -q "bubble [0-9]*% ([0-9]*% simulated)" ||
        { grep "^step" "$WORK/dp2.log" "$WORK/pp2.log"; return 1; }
}

# progress_steps LOG: the steps whose progress line LOG has, one a line
progress_steps() { sed -n 's|^step *\([0-9]*\)/.*|\1|p' "$1"; }

# train.log_every: N prints every Nth step's line; "auto" (the default) a line when a second
# has passed since the last, and always the first, the last and an evaluated step's;
# metrics.jsonl keeps every step whatever is printed.
test_progress_lines_follow_log_every() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/every5" --set train.log_every=5 \
        --set data.val_every=0 --set checkpoint.every=0 >"$WORK/every5.log" 2>&1 ||
        { cat "$WORK/every5.log"; return 1; }
    [ "$(progress_steps "$WORK/every5.log" | tr '\n' ' ')" = "1 5 10 12 " ] ||
        { cat "$WORK/every5.log"; return 1; }
    # each step at least 3 × 100 ms (the slow reads): a second holds back 2 or 3 lines
    PLAIT_DEBUG_SLOW_RANK=0:100 "$PLAIT" train "$WORK/plan.json" --out "$WORK/auto" \
        --set train.log_every=auto --set steps=9 --set data.val_every=4 \
        --set checkpoint.every=0 >"$WORK/auto.log" 2>&1 || { cat "$WORK/auto.log"; return 1; }
    progress_steps "$WORK/auto.log" >"$WORK/auto.steps"
    "$PY" - "$WORK/auto/metrics.jsonl" "$WORK/auto.steps" <<'PYEOF' || { cat "$WORK/auto.log"; return 1; }
import json, sys
ms = {r["step"]: r["ms"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
printed = [int(l) for l in open(sys.argv[2])]
assert sorted(ms) == list(range(1, 10)), ms  # every step in the metrics
for must in (1, 4, 8, 9):  # the first, the evaluated ones, the last
    assert must in printed, (must, printed)
assert 2 not in printed, printed  # 0.3 s after the first line
# a step a second or more (its steps' own times, less than the wall's) after the last line
since = 0
for step in range(1, 10):
    since += ms[step]
    assert since < 1000 or step in printed, (step, since, printed)
    if step in printed:
        since = 0
PYEOF
    # the start line says what "% of peak" is against
    grep -q "GFLOP/s peak (products measured at start" "$WORK/auto.log" || { cat "$WORK/auto.log"; return 1; }
}

# A run that fails on its data says that alone: not first why it trains on the CPU.
test_a_data_error_comes_first() {
    head -c 100 "$WORK/train.bin" >"$WORK/stub.bin"
    expect_error "$WORK/stub.log" 1 "data.train: .*stub.bin: too short" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/stub" --set data.train="$WORK/stub.bin" ||
        return 1
    ! grep -q "parallel.device" "$WORK/stub.log" || { cat "$WORK/stub.log"; return 1; }
}

check recompute_gives_the_same_losses_to_the_bit test_recompute_gives_the_same_losses_to_the_bit
check bf16_tracks_fp32 test_bf16_tracks_fp32
check loss_falls_below_unigram_entropy test_loss_falls_below_unigram_entropy
check shuffle_is_seeded test_shuffle_is_seeded
check data_in_order_reads_consecutive_windows test_data_in_order_reads_consecutive_windows
check bad_data_is_refused_with_the_file_named test_bad_data_is_refused_with_the_file_named
check cli_contract test_cli_contract
check data_prepare_writes_llmc_shards test_data_prepare_writes_llmc_shards
check init_reads_llmc_fp32_and_bf16_checkpoints test_init_reads_llmc_fp32_and_bf16_checkpoints
check samples_are_valid_utf8 test_samples_are_valid_utf8
check progress_line_says_what_means_something test_progress_line_says_what_means_something
check progress_lines_follow_log_every test_progress_lines_follow_log_every
check a_data_error_comes_first test_a_data_error_comes_first
finish
