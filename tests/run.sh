#!/usr/bin/env bash
# Runs every test: the C unit tests (normal build and ASan/UBSan build) and the
# integration scripts. Each test program prints "ok NAME" / "not ok NAME" lines,
# and "ok NAME # SKIP why" for a test that cannot run here (a GPU test on a
# machine without one): counted as skipped, never as passed. A program that
# fails without saying which case counts as one failure.
# Usage: tests/run.sh [PATTERN]   (only tests whose label, e.g. "unit/test_plan" or
# "asan-integration/test_train_resume", contains PATTERN)
# Ends with "N passed, N failed" (after "N skipped ..." when some were).
set -u
cd "$(dirname "$0")/.."
pattern=${1:-}
passed=0
failed=0
skipped=0
failed_names=()
# the failures' logs, printed again at the end: where CI shows only the tail of
# the output, what failed and why stays in it
failed_logs=$(mktemp)
trap 'rm -f "$failed_logs"' EXIT

run_one() { # label, command...
    local label=$1; shift
    case "$label" in *"$pattern"*) ;; *) return 0 ;; esac
    local log t0 t1 rc p f s
    log=$(mktemp)
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    s=$(grep -ci '^ok .*# skip' "$log")
    p=$(($(grep -c '^ok ' "$log") - s))
    f=$(grep -c '^not ok ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "not ok $label (exit code $rc)" >>"$log"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    printf '%-48s %3d passed %3d failed %6.1fs%s\n' "$label" "$p" "$f" "$(awk "BEGIN{print $t1 - $t0}")" \
        "$([ "$s" -eq 0 ] || echo " $s skipped")"
    grep -i '^ok .*# skip' "$log" | sed 's/^ok /    skipped: /'
    if [ "$f" -ne 0 ]; then
        failed_names+=("$label")
        sed 's/^/    | /' "$log" | tail -n 60
        { echo "--- $label"; sed 's/^/    | /' "$log" | tail -n 60; } >>"$failed_logs"
    fi
    rm -f "$log"
}

export PLAIT_BUILD=${PLAIT_BUILD:-$PWD/build}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "unit/$(basename "$t")" "$t"
done
for t in build-asan/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "asan/$(basename "$t")" env PLAIT_SANITIZED=1 "$t"
done
for t in tests/integration/test_*.sh; do
    [ -f "$t" ] || continue
    run_one "integration/$(basename "$t" .sh)" bash "$t"
    # again with the sanitized binaries, unless the script opts out ("# asan: skip")
    if [ -x build-asan/bin/plait ] && ! grep -q '^# asan: skip' "$t"; then
        run_one "asan-integration/$(basename "$t" .sh)" env PLAIT_BUILD="$PWD/build-asan" bash "$t"
    fi
done

if [ ${#failed_names[@]} -ne 0 ]; then
    echo "=== the failures again"
    cat "$failed_logs"
    echo "failed: ${failed_names[*]}"
fi
[ "$skipped" -eq 0 ] || echo "$skipped skipped (cannot run on this machine; not counted as passed)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
