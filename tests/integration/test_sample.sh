#!/usr/bin/env bash
# plait sample: text from a checkpoint of any layout, on one process. A tp 2 × pp 2 run's
# checkpoint is gathered whole and sampled greedily (top-k 1) past the context's end (the
# key/value cache starts again on the last half): every token plait chose is PyTorch's
# argmax on the same context (tests/golden/gpt2_ref.py's forward pass on the exported
# weights), but where the two best logits are within 1e-4 (either may win in fp32). The
# options are checked by the plan's own rules and named as given; nothing is written.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
"$PLAIT" train "$WORK/plan.json" --out "$WORK/run" --ranks 4 --set parallel.tp=2 \
    --set parallel.pp=2 --set steps=8 --set data.val=null --set data.val_every=0 \
    >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; exit 1; }

# the bytes of plait's printed sample (\xNN escapes back to their byte)
sample_bytes() {
    "$PY" -c '
import re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8").rstrip("\n")
out = bytearray()
for part in re.split(r"(\\x[0-9a-f]{2})", text):
    out += bytes([int(part[2:], 16)]) if re.fullmatch(r"\\x[0-9a-f]{2}", part) else part.encode()
sys.stdout.buffer.write(bytes(out))' "$1"
}

test_greedy_sample_of_a_sharded_checkpoint_is_pytorchs_argmax() {
    "$PLAIT" sample "$WORK/run" --prompt "ROMEO:" --tokens 60 --top-k 1 >"$WORK/greedy.txt" \
        2>"$WORK/greedy.err" || { cat "$WORK/greedy.err"; return 1; }
    grep -q "step_00000008_0000 (step 8, tp 2 × pp 2 × dp 1)" "$WORK/greedy.err" ||
        { cat "$WORK/greedy.err"; return 1; }
    "$PLAIT" ckpt export "$WORK/run" --llmc "$WORK/m.bin" >/dev/null || return 1
    sample_bytes "$WORK/greedy.txt" >"$WORK/greedy.bytes" || return 1
    "$PY" - "$WORK/m.bin" "$WORK/greedy.bytes" <<'PYEOF'
import sys, torch
sys.path.insert(0, "tests/golden")
import gpt2_ref as g
cfg, arrays = g.read_model(sys.argv[1])
P = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
seq = list(open(sys.argv[2], "rb").read())
prompt = len(b"ROMEO:")
assert len(seq) == prompt + 60, f"{len(seq)} tokens, want {prompt + 60}"
T, start, ties, checked = cfg.maxT, 0, 0, 0
for n in range(prompt, len(seq)):  # the token at n, from the context before it
    if n - start > T:
        start = n - T // 2  # where plait's cache started again
    with torch.no_grad():
        logits = g.gpt2_logits(P, torch.tensor([seq[start:n]]), cfg.NH)[0, -1, :cfg.V]
    top2 = torch.topk(logits, 2)
    if float(top2.values[0] - top2.values[1]) < 1e-4:
        ties += 1
        continue
    assert seq[n] == int(top2.indices[0]), (
        f"token {n}: plait chose {seq[n]}, PyTorch's argmax is {int(top2.indices[0])} "
        f"(logits {float(logits[seq[n]]):.6f} vs {float(top2.values[0]):.6f})")
    checked += 1
print(f"{checked} tokens equal PyTorch's argmax, {ties} near-ties skipped")
sys.exit(0 if checked >= 50 else 1)
PYEOF
}

test_options_are_the_plans_and_named_as_given() {
    expect_error "$WORK/temp.log" 1 "sample: --temperature 0: sample.temperature: must be > 0" \
        "$PLAIT" sample "$WORK/run" --temperature 0 || return 1
    expect_error "$WORK/none.log" 1 "sample: $WORK/nothing: not a run directory" \
        "$PLAIT" sample "$WORK/nothing" || return 1
    # a prompt that reads as JSON stays text; a seed gives the same sample twice
    "$PLAIT" sample "$WORK/run" --prompt 12 --tokens 20 --seed 9 >"$WORK/a.txt" 2>/dev/null &&
        "$PLAIT" sample "$WORK/run" --prompt 12 --tokens 20 --seed 9 >"$WORK/b.txt" 2>/dev/null ||
        return 1
    cmp "$WORK/a.txt" "$WORK/b.txt" && [ "$(head -c 2 "$WORK/a.txt")" = 12 ] ||
        { cat "$WORK/a.txt" "$WORK/b.txt"; return 1; }
}

test_sampling_changes_nothing_on_disk() {
    local before after
    before=$(cd "$WORK/run" && find . -type f -exec sha256sum {} + | sort)
    "$PLAIT" sample "$WORK/run" --tokens 10 >/dev/null 2>&1 || return 1
    after=$(cd "$WORK/run" && find . -type f -exec sha256sum {} + | sort)
    [ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after"); return 1; }
}

check greedy_sample_of_a_sharded_checkpoint_is_pytorchs_argmax \
    test_greedy_sample_of_a_sharded_checkpoint_is_pytorchs_argmax
check options_are_the_plans_and_named_as_given test_options_are_the_plans_and_named_as_given
check sampling_changes_nothing_on_disk test_sampling_changes_nothing_on_disk
finish
