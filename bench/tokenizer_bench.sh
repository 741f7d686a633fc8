#!/usr/bin/env bash
# make bench-tokenizer (and make bench) — plait's BPE tokenizer beside js-tiktoken (npm; the
# reference tests/integration/test_tokenizer.sh checks it against) on the same text: tokens
# per second on one core for GPT-2 and o200k_base, their ratio, and plait data prepare on
# every core. plait's time is data prepare's less that of preparing a one-line text (the
# tokenizer's loading). Not a test: it asserts nothing.
#   BENCH_TOKENIZER_MB   megabytes of text (default 8: the demo corpus repeated)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${PLAIT_BUILD:-build}
source scripts/npm_package.sh # defines: npm_package_dir
REF=$ROOT/build/tokenizer-reference
work=$(mktemp -d /tmp/plait-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

why=$(npm_package_dir tests/tokenizer "$REF" "tokenizer reference") || {
    echo "tokenizer bench skipped: $why"
    exit 0
}
mb=${BENCH_TOKENIZER_MB:-8}
while [ "$(stat -c %s "$work/text.txt" 2>/dev/null || echo 0)" -lt $((mb << 20)) ]; do
    cat examples/data/tinyshakespeare.txt tests/tokenizer/corpus.txt >>"$work/text.txt"
done
head -n 1 tests/tokenizer/corpus.txt >"$work/line.txt"

seconds() { # plait data prepare's wall time, in seconds, for TEXT TOKENIZER THREADS
    local t0 t1
    t0=$(date +%s.%N)
    "$BUILD/bin/plait" data prepare "$1" "$work/out/train.bin" --tokenizer "$2" --threads "$3" \
        >"$work/prep.log" 2>&1 || { cat "$work/prep.log"; exit 1; }
    t1=$(date +%s.%N)
    awk "BEGIN{print $t1 - $t0}"
}

echo "== tokens per second, $mb MB of text (Shakespeare and tests/tokenizer/corpus.txt)"
printf '%-12s %14s %14s %8s %18s\n' encoding "plait 1 core" "js-tiktoken" ratio "plait $(nproc) cores"
for enc in gpt2 o200k_base; do
    [ -f "$REF/$enc.tiktoken" ] || (cd "$REF" && node reference.mjs export $enc $enc.tiktoken)
    load=$(seconds "$work/line.txt" "$REF/$enc.tiktoken" 1)
    one=$(seconds "$work/text.txt" "$REF/$enc.tiktoken" 1)
    tokens=$(sed -n 's/.*: \([0-9]*\) tokens (vocab.*/\1/p' "$work/prep.log")
    all=$(seconds "$work/text.txt" "$REF/$enc.tiktoken" "$(nproc)")
    js=$(cd "$REF" && node reference.mjs bench $enc "$work/text.txt" 10)
    awk -v enc=$enc -v load="$load" -v one="$one" -v all="$all" -v n="$tokens" -v js="$js" 'BEGIN {
        split(js, a, /[:,}]/); jt = a[2] / a[4]
        p1 = n / (one - load); pa = n / (all - load)
        printf "%-12s %14.0f %14.0f %7.2fx %18.0f\n", enc, p1, jt, p1 / jt, pa }'
done
echo "(ratio: plait's tokens/s on one core over js-tiktoken's, which runs on one; goal >= 1)"
