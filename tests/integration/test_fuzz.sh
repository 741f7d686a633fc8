#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz/README.md): `make fuzz`, every saved
# reproducer in tests/fuzz/crashes/ must pass, then each target fuzzes a copy of
# its seed corpus for FUZZ_SECONDS (default 20) under ASan, UBSan and LeakSanitizer.
# A crash, a broken invariant, a leak, a timeout or running out of memory fails
# it; the input that did it is kept in build-fuzz/artifacts/. Runs once (its
# binaries are sanitized already), not again with build-asan:
# asan: skip
source "$(dirname "$0")/lib.sh"

seconds=${FUZZ_SECONDS:-20}
artifacts=$ROOT/build-fuzz/artifacts
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

if ! out=$(make -C "$ROOT" -j2 fuzz 2>&1); then
    echo "not ok fuzz_targets_build"
    printf '%s\n' "$out" | tail -n 40 | sed 's/^/    # /'
    exit 1
fi
echo "ok fuzz_targets_build"
mkdir -p "$artifacts"

# report NAME LOG RC: ok when libFuzzer finished cleanly, with its execution count
report() {
    local name=$1 log=$2 rc=$3 execs
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ] && ! grep -qE '^(==[0-9]+== ?ERROR|SUMMARY): ' "$log" && [ -n "$execs" ]; then
        echo "ok $name ($execs executions)"
    else
        echo "not ok $name (exit code $rc)"
        # what went wrong, where in plait's code, and the input that did it
        grep -E 'ERROR|SUMMARY|invariant broken|runtime error|Test unit written' "$log" |
            head -n 8 | sed 's/^/    # /'
        grep -E '^ +#[0-9]+ .* in [^ ]+ [^ ]*/(common|runtime|kernels|tests)/' "$log" |
            head -n 8 | sed -E 's/^ +/    #   /'
        failures=$((failures + 1))
    fi
}

# the reproducers of bugs found before: each must now run clean
for repro in "$ROOT"/tests/fuzz/crashes/*; do
    [ -f "$repro" ] || continue
    base=$(basename "$repro")
    target=${base%%-*}
    rc=0
    "$ROOT/build-fuzz/$target" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "$repro" </dev/null >"$WORK/$base.log" 2>&1 || rc=$?
    report "fuzz_reproducer_${base}_passes" "$WORK/$base.log" "$rc"
done

# fuzz TARGET NAME [ARGS...]: one bounded run on a copy of the seeds
fuzz() {
    local target=$1 name=$2 rc=0
    shift 2
    cp -r "$ROOT/tests/fuzz/corpus/$target" "$WORK/corpus-$target"
    (cd "$WORK" && "$ROOT/build-fuzz/$target" -max_total_time="$seconds" -print_final_stats=1 \
        -rss_limit_mb=2048 -timeout=30 -artifact_prefix="$artifacts/$target-" "$@" \
        "$WORK/corpus-$target" </dev/null >"$WORK/$target.log" 2>&1) || rc=$?
    report "$name" "$WORK/$target.log" "$rc"
}

fuzz fuzz_plan "fuzz_plan_parser_survives_${seconds}s" -dict="$ROOT/tests/fuzz/plan.dict"
fuzz fuzz_data "fuzz_data_reader_survives_${seconds}s"
fuzz fuzz_llmc "fuzz_llmc_model_and_tokenizer_readers_survive_${seconds}s"
fuzz fuzz_sock_handshake "fuzz_sock_handshake_parser_survives_${seconds}s"
fuzz fuzz_rundir "fuzz_rundir_run_and_checkpoint_file_readers_survive_${seconds}s"
fuzz fuzz_ckpt_parts "fuzz_ckpt_parts_verify_and_loader_agree_on_part_files_${seconds}s"
fuzz fuzz_safetensors "fuzz_safetensors_reader_survives_${seconds}s"
finish
