#!/usr/bin/env bash
# precision "fp8", emulated on the CPU: the quantiser is bitwise the PyTorch
# referee's (tests/golden/fp8_ref.py), an fp8 run trains with the loss of a
# bf16 run within DeepSeek-V3's 0.25%, with tensor and with block scaling, a whole
# model's step-1 logits and gradients match the referee's fp8 GPT-2, an
# fp8 run stopped mid-step resumes to the bit, and plait check says fp8.
source "$(dirname "$0")/lib.sh"

test_quantizer_matches_the_pytorch_referee_bitwise() {
    mkdir -p "$WORK/fp8ref"
    "$PY" "$ROOT/tests/golden/fp8_ref.py" check "$BUILD/tests/test_fp8" "$WORK/fp8ref"
}

# A whole model's step-1 logits and gradients in fp8 against the referee's
# GPT-2 (tests/golden/gpt2_ref.py) with the same fp8 products (fp8_ref.py
# gpt2): which products are quantised, in which format and tiles, the LM head
# in bf16. One layer, hidden 192, 5 × 32 rows: whole and partial tiles.
test_fp8_model_matches_the_pytorch_referee() {
    "$PY" "$ROOT/tests/golden/gpt2_ref.py" case "$WORK/case" --layers 1 --hidden 192 --heads 2 \
        --batch 5 >"$WORK/case.log" 2>&1 || { cat "$WORK/case.log"; return 1; }
    local sc
    for sc in tensor block; do
        PLAIT_DUMP_STEP1="$WORK/case_$sc/dump" "$PLAIT" train "$WORK/case/plan.json" \
            --out "$WORK/case_$sc" --set precision=fp8 --set fp8_scaling=$sc \
            >"$WORK/case_$sc.log" 2>&1 || { cat "$WORK/case_$sc.log"; return 1; }
        "$PY" "$ROOT/tests/golden/fp8_ref.py" gpt2 "$WORK/case" "$WORK/case_$sc" $sc || return 1
    done
}

# A model wider than a 128 tile, with sizes that are not multiples of it
# (hidden 192: a 1x128 tile and a 1x64 one a row; 3C 576, 4C 768; 4 × 48 =
# 192 rows: a 128x1 tile and a 64x1 one a column), so that block scaling
# has whole and partial tiles and blocks.
fp8_plan() {
    tiny_data
    cat >"$1" <<JSON
{"model": {"layers": 2, "heads": 2, "hidden": 192, "vocab": 256, "seq_len": 48, "seed": 7},
 "data": {"train": "$WORK/train.bin", "shuffle": true},
 "batch": {"micro_batch": 4, "grad_accum": 2},
 "optimizer": {"lr": 2e-3, "warmup_steps": 3, "grad_clip": 1.0},
 "steps": 40,
 "checkpoint": {"every": 10, "keep": 5}}
JSON
}

train() { # NAME ARGS...: a run of the fp8 plan into $WORK/NAME
    local name=$1; shift
    "$PLAIT" train "$WORK/fp8.json" --out "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 ||
        { cat "$WORK/$name.log"; return 1; }
}

# The mean training loss over the 40 steps and over the last 10, fp8 against
# bf16 (DeepSeek-V3 reports fp8 within 0.25% of bf16). Measured (2 threads,
# the LM head in bf16):
#   tensor: 0.038% over 40 steps, 0.040% over the last 10
#   block:  0.034% over 40 steps, 0.087% over the last 10
#   (fp32 against bf16: 0.020%, 0.032%)
# Step by step the curves cross: the largest single-step gap is 2.7% (tensor,
# at a loss spike, step 7, that each precision takes differently) and 0.18%
# (block); fp32 differs from bf16 by 0.15% at most.
test_fp8_trains_within_a_quarter_percent_of_bf16() {
    fp8_plan "$WORK/fp8.json"
    train bf16 --set precision=bf16 || return 1
    train fp8_tensor --set precision=fp8 || return 1
    train fp8_block --set precision=fp8 --set fp8_scaling=block || return 1
    train fp32 --set precision=fp32 || return 1
    grep -q "fp8, micro-batch" "$WORK/fp8_block.log" || { head -3 "$WORK/fp8_block.log"; return 1; }
    "$PY" - "$WORK" <<'PYEOF'
import json, sys
def losses(run):
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    return [r["loss"] for r in recs if "step" in r]
mean = lambda v: sum(v) / len(v)
bf16, fp32 = losses("bf16"), losses("fp32")
for run in ("fp8_tensor", "fp8_block"):
    fp8 = losses(run)
    assert len(fp8) == len(bf16) == 40, (len(fp8), len(bf16))
    all_steps = abs(mean(fp8) - mean(bf16)) / mean(bf16)
    last = abs(mean(fp8[-10:]) - mean(bf16[-10:])) / mean(bf16[-10:])
    print(f"{run}: mean loss {all_steps:.4%} from bf16's over 40 steps, {last:.4%} over the last 10")
    assert all_steps < 0.0025 and last < 0.0025, (all_steps, last)
    # the products really were quantised: neither fp32's nor bf16's losses
    assert fp8 != fp32 and fp8 != bf16, "fp8 trained as another precision"
PYEOF
}

test_fp8_resumes_to_the_bit() {
    [ -f "$WORK/fp8_block/metrics.jsonl" ] || { echo "needs the block run"; return 1; }
    local run=$WORK/fp8_mid rc=0
    # micro-batch 25 is the 1st of step 13 (grad_accum 2): a stop just after it
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=25 "$PLAIT" train "$WORK/fp8.json" --out "$run" \
        --set precision=fp8 --set fp8_scaling=block >"$run.log1" 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/fp8.json" --out "$run" --set precision=fp8 --set fp8_scaling=block \
        >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from .*(step 12, mid-step)" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/fp8_block/metrics.jsonl" "$run/metrics.jsonl"
}

# Layouts: pipeline stages change only the order of fp32 sums (the tied
# embedding's gradient, the reductions), but an fp8 cast magnifies a last-bit
# difference into a step of the fp8 grid, so pp 2 tracks one rank within fp8's
# noise rather than fp32's; tensor parallelism cuts each weight and its
# products, and a scale is its rank's shard's (no amax all-reduce). Measured
# (block scaling, 40 steps): mean loss from one rank's: pp 2 0.042% (equal at step 1,
# 2e-9 at step 2, growing; fp32 at pp 2 stays within 7e-8 of one rank),
# tp 2 0.10%.
test_fp8_layouts_track_one_rank() {
    [ -f "$WORK/fp8_block/metrics.jsonl" ] || { echo "needs the block run"; return 1; }
    train fp8_pp2 --set precision=fp8 --set fp8_scaling=block --set parallel.pp=2 || return 1
    train fp8_tp2 --set precision=fp8 --set fp8_scaling=block --set parallel.tp=2 || return 1
    "$PY" - "$WORK" <<'PYEOF'
import json, sys
def losses(run):
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    return [r["loss"] for r in recs if "step" in r]
one, pp2, tp2 = losses("fp8_block"), losses("fp8_pp2"), losses("fp8_tp2")
assert len(one) == len(pp2) == len(tp2) == 40
pp = abs(sum(pp2) - sum(one)) / sum(one)
tp = abs(sum(tp2) - sum(one)) / sum(one)
print(f"mean loss from one rank's: pp 2 {pp:.4%}, tp 2 {tp:.4%}")
assert pp < 0.0025 and tp < 0.0025, (pp, tp)
PYEOF
}

test_fp8_scaling_is_part_of_the_run() {
    [ -d "$WORK/fp8_block/checkpoints" ] || { echo "needs the block run"; return 1; }
    # the run is block-scaled: resuming it with tensor scaling is another run
    expect_error "$WORK/other.log" any "fp8_scaling" \
        "$PLAIT" train "$WORK/fp8.json" --out "$WORK/fp8_block" --set precision=fp8 --set steps=41
}

test_check_prints_fp8_memory() {
    tiny_plan "$WORK/check.json"
    local out
    out=$("$PLAIT" check "$WORK/check.json" --set precision=fp8 --set fp8_scaling=block 2>&1) ||
        { printf '%s\n' "$out"; return 1; }
    grep -q "as the runtime allocates it (fp8 with scaling per block, ZeRO 0" <<<"$out" ||
        { printf '%s\n' "$out"; return 1; }
    grep -q "fp8 keeps an E4M3 copy of each layer's four weight matrices .* one per 128×128 block.* a bf16 copy of wte for the LM head" \
        <<<"$out" || { printf '%s\n' "$out"; return 1; }
    # fp8's parameters are fp32's and the copies: 2 layers of 12·32² weights
    # (qkvw 3C·C, attprojw C·C, fcw 4C·C, fcprojw C·4C), a byte each, and 4
    # scales of 4 bytes each, and the LM head's bf16 wte (256·32, 2 bytes
    # each); a bf16 run's are 1.5 times fp32's
    local p32 p8 p16
    p32=$("$PLAIT" check "$WORK/check.json" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes_per_rank"]["params"])') || return 1
    p8=$("$PLAIT" check "$WORK/check.json" --json --set precision=fp8 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes_per_rank"]["params"])') || return 1
    p16=$("$PLAIT" check "$WORK/check.json" --json --set precision=bf16 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes_per_rank"]["params"])') || return 1
    [ $((p8 - p32)) -eq $((2 * (12 * 32 * 32 + 4 * 4) + 2 * 256 * 32)) ] && [ $((p16 * 2)) -eq $((p32 * 3)) ] || { echo "params fp32 $p32 fp8 $p8 bf16 $p16"; return 1; }
}

check quantizer_matches_the_pytorch_referee_bitwise test_quantizer_matches_the_pytorch_referee_bitwise
check fp8_model_matches_the_pytorch_referee test_fp8_model_matches_the_pytorch_referee
check fp8_trains_within_a_quarter_percent_of_bf16 test_fp8_trains_within_a_quarter_percent_of_bf16
check fp8_resumes_to_the_bit test_fp8_resumes_to_the_bit
check fp8_layouts_track_one_rank test_fp8_layouts_track_one_rank
check fp8_scaling_is_part_of_the_run test_fp8_scaling_is_part_of_the_run
check check_prints_fp8_memory test_check_prints_fp8_memory
finish
