#!/usr/bin/env bash
# The plait command line behaves like the tools people know: help on -h,
# --help, `plait help CMD` and `plait CMD --help` (exit 0, stdout); --version
# on every command; an unknown option named as such; a missing value, a
# missing operand and an option that needs another one refused with exit 2.
source "$(dirname "$0")/lib.sh"

commands=(train check launch "data prepare" "data decode" "k8s render" "k8s admin" "k8s lint")

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
    "$PLAIT" data --help | grep -q "data prepare TEXT\.\.\. OUT.bin" || return 1
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
    expect_error "$WORK/u7.log" 2 "^plait: error: data prepare: missing TEXT\.\.\. OUT.bin" \
        "$PLAIT" data prepare a.txt || return 1
    # launch takes one PLAN (srun plait launch PLAN, without the plugin), never two
    expect_error "$WORK/u8.log" 2 "^plait: error: launch: unexpected argument 'y'" \
        "$PLAIT" launch x y || return 1
    expect_error "$WORK/u8b.log" 2 "^plait: error: launch: --out goes with PLAN" \
        "$PLAIT" launch --out d || return 1
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

# a start that fails (here: no data) leaves no run directory behind, neither
# for one rank nor for a gang, and says how to make the data; a directory that
# was there before stays, and so does one that holds a run's history
test_failed_first_start_leaves_nothing() {
    tiny_plan "$WORK/plan.json"
    mkdir -p "$WORK/fs" && cd "$WORK/fs" || return 1
    expect_error "$WORK/fs1.log" 1 "data.train: no file matches $WORK/none_\*.bin: plait data prepare TEXT OUT.bin makes token shards" \
        "$PLAIT" train "$WORK/plan.json" --set "data.train=$WORK/none_*.bin" || return 1
    expect_error "$WORK/fs2.log" 1 "no file matches" "$PLAIT" train "$WORK/plan.json" \
        --set "data.train=$WORK/none_*.bin" --set parallel.dp=2 --out deep/er/run || return 1
    [ -z "$(ls -A "$WORK/fs")" ] || { echo "left behind:"; find "$WORK/fs"; return 1; }
    mkdir -p kept
    expect_error "$WORK/fs3.log" 1 "no file matches" "$PLAIT" train "$WORK/plan.json" \
        --set "data.train=$WORK/none_*.bin" --out kept/run || return 1
    [ "$(ls -A "$WORK/fs")" = kept ] && [ -z "$(ls -A kept)" ] || { find "$WORK/fs"; return 1; }
    # a run with history keeps everything when a later start fails
    cp "$WORK/train.bin" "$WORK/gone.bin"
    "$PLAIT" train "$WORK/plan.json" --out hist --set steps=2 --set optimizer.warmup_steps=0 \
        --set checkpoint.every=1 --set "data.train=$WORK/gone.bin" >/dev/null 2>&1 || return 1
    rm "$WORK/gone.bin"
    expect_error "$WORK/fs4.log" 1 "no file matches" "$PLAIT" train "$WORK/plan.json" --out hist \
        --set steps=4 --set optimizer.warmup_steps=0 --set checkpoint.every=1 \
        --set "data.train=$WORK/gone.bin" || return 1
    [ -s hist/metrics.jsonl ] && [ -f hist/plan.json ] && ls hist/checkpoints | grep -q step_ ||
        { find hist; return 1; }
    cd "$ROOT" || return 1
}

# the man page and the bash completion come from the help text: the built
# ones are what the binary's help gives now, every option of every command is
# in the man page, the completion completes commands and options; make install
# puts them (with the docs and examples) and make uninstall removes every file
test_man_page_and_completion_follow_the_help() {
    local share=$BUILD/share c o
    scripts/gen_docs.sh "$PLAIT" "$WORK/docs" || return 1
    cmp "$WORK/docs/man/man1/plait.1" "$share/man/man1/plait.1" &&
        cmp "$WORK/docs/bash-completion/completions/plait" "$share/bash-completion/completions/plait" ||
        { echo "the built man page or completion is not the binary's help"; return 1; }
    local page=$share/man/man1/plait.1
    for c in "${commands[@]}"; do
        grep -qF ".SS \"plait $c\"" "$page" || { echo "man: no section for $c"; return 1; }
        # shellcheck disable=SC2086
        for o in $("$PLAIT" help $c | awk '/^options:/ { on = 1; next } on && /^  --/ { print $1 }'); do
            grep -qF -- ".B ${o//-/\\-}" "$page" || { echo "man: no $o of $c"; return 1; }
        done
    done
    if command -v man >/dev/null; then # and it renders (man-db is not always there)
        MANWIDTH=100 man -l "$page" >"$WORK/man.txt" 2>"$WORK/man.err" && ! [ -s "$WORK/man.err" ] &&
            grep -q "^   plait check" "$WORK/man.txt" || { cat "$WORK/man.err"; return 1; }
    fi
    complete_words() { # the words of a command line, the last one being completed
        # shellcheck disable=SC1091
        source "$share/bash-completion/completions/plait"
        COMP_WORDS=("$@")
        COMP_CWORD=$(($# - 1))
        _plait
        echo "${COMPREPLY[*]}"
    }
    [ "$(complete_words plait tr)" = train ] || { complete_words plait tr; return 1; }
    [ "$(complete_words plait data p)" = prepare ] || return 1
    [ "$(complete_words plait check x.json --to)" = --topology ] || return 1
    [ "$(complete_words plait data prepare a b --val-f)" = --val-fraction ] || return 1
    # --set completes every plan field's path (plait help plan's)
    [ "$(complete_words plait train p.json --set optimizer.dec)" = \
        "optimizer.decay_steps= optimizer.decay_fraction=" ] ||
        { complete_words plait train p.json --set optimizer.dec; return 1; }
    [ "$("$PLAIT" help plan | grep -c '^  [a-z]')" -ge 50 ] || { "$PLAIT" help plan; return 1; }
    # an option whose help lists its values completes them: --gang's are the command's own
    [ "$(complete_words plait k8s render p.json --gang "")" = "jobset kueue volcano coscheduling" ] ||
        { complete_words plait k8s render p.json --gang ""; return 1; }
    [ "$(complete_words plait k8s render p.json --gang vo)" = volcano ] || return 1
    [ "$(complete_words plait k8s admin --gang "")" = "kueue volcano quota" ] ||
        { complete_words plait k8s admin --gang ""; return 1; }
    [ "$(complete_words plait k8s render p.json --workload vc)" = vcjob ] || return 1
    # one that takes any value still completes nothing
    [ -z "$(complete_words plait k8s render p.json --name "")" ] || return 1
}

test_install_and_uninstall() {
    local dest=$WORK/inst san=0
    [[ $BUILD == *asan* ]] && san=1
    make -s install BUILD="$BUILD" SAN=$san DESTDIR="$dest" PREFIX=/usr >"$WORK/inst.log" 2>&1 ||
        { cat "$WORK/inst.log"; return 1; }
    for f in bin/plait bin/plait-train share/man/man1/plait.1 share/bash-completion/completions/plait \
        share/doc/plait/README.md share/doc/plait/ADMIN.md share/doc/plait/ARCHITECTURE.md \
        share/plait/k8s/ADMIN.md share/plait/k8s/examples/job-jobset.yaml share/plait/examples/README.md \
        share/plait/examples/plans/shakespeare.json share/plait/examples/data/tinyshakespeare.txt; do
        [ -f "$dest/usr/$f" ] || { echo "not installed: $f"; return 1; }
    done
    "$dest/usr/bin/plait" --version >/dev/null || return 1
    make -s uninstall BUILD="$BUILD" SAN=$san DESTDIR="$dest" PREFIX=/usr >"$WORK/uninst.log" 2>&1 ||
        { cat "$WORK/uninst.log"; return 1; }
    [ -z "$(find "$dest" -type f)" ] || { echo "left after uninstall:"; find "$dest" -type f; return 1; }
    [ ! -e "$dest/usr/share/plait" ] && [ ! -e "$dest/usr/share/doc/plait" ] || { find "$dest"; return 1; }
}

# An output that is an input is refused before anything is read or written:
# the text, the shard made from it, and --val each their own file (through a
# second name of the same file too); the files stay as they were.
test_data_prepare_refuses_outputs_that_are_inputs() {
    printf 'to be or not to be, that is the question\n' >"$WORK/in.txt"
    ln "$WORK/in.txt" "$WORK/in_link.txt"
    local before
    before=$(sha256sum "$WORK/in.txt")
    expect_error "$WORK/d1.log" 2 "in.txt is the text it would be made from" \
        "$PLAIT" data prepare "$WORK/in.txt" "$WORK/in.txt" || return 1
    expect_error "$WORK/d2.log" 2 "in_link.txt is the text it would be made from" \
        "$PLAIT" data prepare "$WORK/in.txt" "$WORK/in_link.txt" || return 1
    expect_error "$WORK/d3.log" 2 "--val $WORK/./out.bin is the training shard" \
        "$PLAIT" data prepare "$WORK/in.txt" "$WORK/out.bin" --val "$WORK/./out.bin" || return 1
    expect_error "$WORK/d4.log" 2 "--val $WORK/in.txt is the text" \
        "$PLAIT" data prepare "$WORK/in.txt" "$WORK/out.bin" --val "$WORK/in.txt" || return 1
    [ "$(sha256sum "$WORK/in.txt")" = "$before" ] && [ ! -e "$WORK/out.bin" ] ||
        { echo "a file changed"; return 1; }
}

check help_everywhere test_help_everywhere
check version_everywhere test_version_everywhere
check unknown_and_malformed_options test_unknown_and_malformed_options
check singular_counts test_singular_counts
check failed_first_start_leaves_nothing test_failed_first_start_leaves_nothing
check man_page_and_completion_follow_the_help test_man_page_and_completion_follow_the_help
# The plugin builds against the Slurm SLURM_HOME names (its include/slurm/spank.h, put
# first on the include path); without one the build says so loudly and goes on, SLURM=1
# stops there, SLURM=0 is quiet (make -n: nothing is built)
test_the_plugin_builds_against_slurm_home_and_says_when_it_cannot() {
    local b=$WORK/slurm-build out
    out=$(cd "$ROOT" && make -n BUILD="$b" SLURM_HOME=/nonexistent all 2>&1) || { echo "$out" | tail -3; return 1; }
    grep -q "spank_plait.so) is NOT built: no /nonexistent/include/slurm/spank.h" <<<"$out" &&
        ! grep -q "spank_plait.so" <<<"$(grep -v "NOT built" <<<"$out")" || { echo "$out" | grep -i spank; return 1; }
    if out=$(cd "$ROOT" && make -n BUILD="$b" SLURM=1 SLURM_HOME=/nonexistent all 2>&1); then
        echo "SLURM=1 without spank.h did not stop"; return 1
    fi
    grep -q "SLURM=1 but there is no /nonexistent/include/slurm/spank.h" <<<"$out" || { echo "$out"; return 1; }
    out=$(cd "$ROOT" && make -n BUILD="$b" SLURM=0 SLURM_HOME=/nonexistent all 2>&1) || return 1
    ! grep -qi "spank" <<<"$out" || { echo "$out" | grep -i spank; return 1; }
    [ -f /usr/include/slurm/spank.h ] || { echo "no libslurm-dev here to build against"; return 1; }
    mkdir -p "$WORK/slurm/include" && ln -sfn /usr/include/slurm "$WORK/slurm/include/slurm"
    out=$(cd "$ROOT" && make -n BUILD="$b" SLURM_HOME="$WORK/slurm" all 2>&1) || return 1
    grep -q -- "-isystem $WORK/slurm/include .*-c spank-plugin/spank_plait.c" <<<"$out" &&
        grep -q -- "-o $b/lib/spank_plait.so" <<<"$out" || { echo "$out" | grep -i spank; return 1; }
}

check install_and_uninstall test_install_and_uninstall
check the_plugin_builds_against_slurm_home_and_says_when_it_cannot \
    test_the_plugin_builds_against_slurm_home_and_says_when_it_cannot
check data_prepare_refuses_outputs_that_are_inputs test_data_prepare_refuses_outputs_that_are_inputs
finish
