#!/usr/bin/env bash
# The plait command line behaves like the tools people know: help on -h,
# --help, `plait help CMD` and `plait CMD --help` (exit 0, stdout); --version
# on every command; an unknown option named as such; a missing value, a
# missing operand and an option that needs another one refused with exit 2.
source "$(dirname "$0")/lib.sh"

commands=(train check launch "data prepare")

test_help_everywhere() {
    local c
    for h in -h --help help; do
        "$PLAIT" $h >"$WORK/h.txt" || { echo "plait $h failed"; return 1; }
        grep -q "^usage: plait COMMAND" "$WORK/h.txt" || { echo "plait $h:"; cat "$WORK/h.txt"; return 1; }
    done
    for c in "${commands[@]}"; do
        # shellcheck disable=SC2086
        "$PLAIT" help $c >"$WORK/a.txt" && "$PLAIT" $c --help >"$WORK/b.txt" && "$PLAIT" $c -h >"$WORK/c.txt" ||
            { echo "help for $c failed"; return 1; }
        grep -q "^usage: plait $c" "$WORK/a.txt" || { echo "plait help $c:"; cat "$WORK/a.txt"; return 1; }
        cmp -s "$WORK/a.txt" "$WORK/b.txt" && cmp -s "$WORK/a.txt" "$WORK/c.txt" ||
            { echo "plait help $c differs from plait $c --help"; return 1; }
        grep -q -- "--version" "$WORK/a.txt" || { echo "$c: no --version in its help"; return 1; }
    done
    "$PLAIT" data --help | grep -q "data prepare TEXT OUT.bin" || return 1
}

test_version_everywhere() {
    local want c
    want=$("$PLAIT" --version)
    [[ $want == "plait "* ]] || { echo "plait --version: $want"; return 1; }
    for c in "${commands[@]}"; do
        # shellcheck disable=SC2086
        [ "$("$PLAIT" $c --version)" = "$want" ] || { echo "plait $c --version"; return 1; }
    done
    [ "$("$PLAIT" check some_plan.json --version)" = "$want" ] || return 1
}

test_unknown_and_malformed_options() {
    tiny_plan "$WORK/plan.json"
    expect_error "$WORK/u1.log" 2 "^plait: error: check: unknown option --bogus$" \
        "$PLAIT" check "$WORK/plan.json" --bogus || return 1
    expect_error "$WORK/u2.log" 2 "^plait: error: train: unknown option --outt$" \
        "$PLAIT" train "$WORK/plan.json" --outt=x || return 1
    expect_error "$WORK/u3.log" 2 "^plait: error: train: --out needs a value \(--out DIR\)$" \
        "$PLAIT" train "$WORK/plan.json" --out || return 1
    expect_error "$WORK/u4.log" 2 "^plait: error: train: --fresh takes no value" \
        "$PLAIT" train "$WORK/plan.json" --fresh=yes || return 1
    expect_error "$WORK/u5.log" 2 "^plait: error: check: unexpected argument 'other.json'" \
        "$PLAIT" check "$WORK/plan.json" other.json || return 1
    expect_error "$WORK/u6.log" 2 "^plait: error: data prepare: --val-fraction needs --val VAL.bin" \
        "$PLAIT" data prepare a.txt a.bin --val-fraction 0.2 || return 1
    expect_error "$WORK/u7.log" 2 "^plait: error: data prepare: missing TEXT OUT.bin" \
        "$PLAIT" data prepare a.txt || return 1
    expect_error "$WORK/u8.log" 2 "^plait: error: launch: unexpected argument 'x'" \
        "$PLAIT" launch x || return 1
    expect_error "$WORK/u9.log" 2 "^plait: error: unknown command 'data bogus'" \
        "$PLAIT" data bogus || return 1
    expect_error "$WORK/u10.log" 2 "^plait: error: unknown command '-x'" "$PLAIT" -x || return 1
    # the value of --set may itself start with a dash; --name=value works as well
    expect_error "$WORK/u11.log" 1 "^plait: error: --set optimizer.lr=-1: optimizer.lr: must be > 0" \
        "$PLAIT" check "$WORK/plan.json" --set=optimizer.lr=-1 || return 1
}

# plural only when the count is not 1: "1 thread", "profile over 1 step"
test_singular_counts() {
    tiny_plan "$WORK/plan.json"
    OMP_NUM_THREADS=1 PLAIT_PROFILE=1 "$PLAIT" train "$WORK/plan.json" --out "$WORK/one" \
        --set steps=2 --set optimizer.warmup_steps=0 --set batch.grad_accum=1 >"$WORK/one.log" 2>&1 ||
        { cat "$WORK/one.log"; return 1; }
    grep -q "2 steps of 1 micro-batch, 1 thread," "$WORK/one.log" &&
        grep -q "profile over 1 step (ms per step)" "$WORK/one.log" ||
        { cat "$WORK/one.log"; return 1; }
    if grep -E "(^|[^0-9])1 (threads|steps|micro-batches|ranks|checkpoints)" "$WORK/one.log"; then return 1; fi
}

check help_everywhere test_help_everywhere
check version_everywhere test_version_everywhere
check unknown_and_malformed_options test_unknown_and_malformed_options
check singular_counts test_singular_counts
finish
