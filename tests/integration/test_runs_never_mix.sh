#!/usr/bin/env bash
# Runs never mix and never lose work: a run directory or checkpoint directory
# belongs to the plan that started it (a different plan is refused, naming the
# fields; fields that may change are reported), one run at a time holds it,
# a crash at any rename or fsync of a run resumes to the same metrics, a full
# disk leaves no temporaries, and --fresh starts over on purpose.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" >"$WORK/ref.log" 2>&1 ||
    { echo "not ok reference_run_trains"; cat "$WORK/ref.log"; exit 1; }

digest() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 sha1sum); }

test_another_plan_in_the_same_run_directory_is_refused() {
    # both plan files are called plan.json: both default to runs/plan
    mkdir -p "$WORK/a" "$WORK/b" "$WORK/cwd"
    cp "$WORK/plan.json" "$WORK/a/plan.json"
    sed 's/"lr": 2e-3/"lr": 1e-3/' "$WORK/plan.json" >"$WORK/b/plan.json"
    (cd "$WORK/cwd" && "$PLAIT" train ../a/plan.json >/dev/null 2>&1) || return 1
    local before
    before=$(digest "$WORK/cwd/runs/plan")
    local refused="runs/plan holds a run of a different plan \(fields that may not change: optimizer.lr 0.002 -> 0.001\); to start this plan from scratch there, run plait train with --fresh"
    expect_error "$WORK/mix1.log" 1 "$refused" \
        sh -c "cd '$WORK/cwd' && '$PLAIT' train ../b/plan.json" || return 1
    [ "$before" = "$(digest "$WORK/cwd/runs/plan")" ] || { echo "the first run's files changed"; return 1; }
    # with its checkpoints gone, the run directory still belongs to the first plan
    mv "$WORK/cwd/runs/plan/checkpoints" "$WORK/cwd/moved"
    expect_error "$WORK/mix2.log" 1 "$refused" \
        sh -c "cd '$WORK/cwd' && '$PLAIT' train ../b/plan.json" || return 1
    [ "$(grep -c '"step"' "$WORK/cwd/runs/plan/metrics.jsonl")" = 12 ] || { echo "metrics.jsonl was cut"; return 1; }
}

# A run directory whose plan.json was lost still holds a run: no plan may take
# it over unseen (it had cut another run's metrics from 64 lines to 12); the
# error says where a copy of the plan is.
test_a_run_directory_without_its_plan_is_refused() {
    cp -a "$WORK/ref" "$WORK/planless"
    rm "$WORK/planless/plan.json"
    local before
    before=$(digest "$WORK/planless")
    expect_error "$WORK/planless.log" 1 \
        "$WORK/planless holds a run's history \(metrics or checkpoints\) but no plan.json, so nothing says which plan made it; put its plan back \(every checkpoint keeps a copy" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/planless" --set optimizer.lr=1e-3 || return 1
    [ "$before" = "$(digest "$WORK/planless")" ] || { echo "the run's files changed"; return 1; }
    # put back from a checkpoint's copy, the same plan resumes
    cp "$WORK/planless/checkpoints/step_00000012_0000/plan.json" "$WORK/planless/plan.json"
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/planless" >"$WORK/planless2.log" 2>&1 ||
        { cat "$WORK/planless2.log"; return 1; }
}

test_a_shared_checkpoint_dir_with_another_seed_is_refused() {
    local shared=$WORK/shared-ckpt
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/s1" --set checkpoint.dir="$shared" >/dev/null 2>&1 || return 1
    expect_error "$WORK/seed.log" 1 "was written by a different plan: model.seed 7 -> 8" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/s2" --set checkpoint.dir="$shared" --set model.seed=8 || return 1
    ! grep -q "already finished" "$WORK/seed.log" || { echo "trained nothing and said finished"; return 1; }
}

test_fields_that_may_change_resume_and_are_reported() {
    cp -a "$WORK/ref" "$WORK/more"
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/more" --set steps=16 --set checkpoint.every=8 \
        --set recompute=full >"$WORK/more.log" 2>&1 || { cat "$WORK/more.log"; return 1; }
    grep -q "resuming from $WORK/more/checkpoints/step_00000012_0000" "$WORK/more.log" || { cat "$WORK/more.log"; return 1; }
    grep -q "the plan changed since that checkpoint: steps 12 -> 16, recompute \"none\" -> \"full\", checkpoint.every 4 -> 8" \
        "$WORK/more.log" || { cat "$WORK/more.log"; return 1; }
    [ "$(grep -c '"step"' "$WORK/more/metrics.jsonl")" = 16 ] || return 1
    head -n "$(wc -l <"$WORK/ref/metrics.jsonl")" "$WORK/more/metrics.jsonl" >"$WORK/more-head.jsonl"
    metrics_equal "$WORK/ref/metrics.jsonl" "$WORK/more-head.jsonl"
}

test_fresh_starts_over() {
    cp -a "$WORK/ref" "$WORK/fresh"
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/fresh" --fresh --set optimizer.lr=1e-3 \
        >"$WORK/fresh.log" 2>&1 || { cat "$WORK/fresh.log"; return 1; }
    grep -q -- "--fresh: removed 3 checkpoints and the metrics of the previous run" "$WORK/fresh.log" || { cat "$WORK/fresh.log"; return 1; }
    ! grep -q "resuming" "$WORK/fresh.log" || return 1
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/fresh-ref" --set optimizer.lr=1e-3 >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/fresh-ref/metrics.jsonl" "$WORK/fresh/metrics.jsonl"
}

test_a_second_run_on_a_busy_directory_is_refused_naming_the_first() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/busy" --set steps=100000 --set checkpoint.every=0 \
        --set data.val_every=0 >"$WORK/busy.log" 2>&1 &
    local first=$! rc=0 holder
    for _ in $(seq 300); do
        [ -s "$WORK/busy/metrics.jsonl" ] && break
        sleep 0.05
    done
    holder=$(pgrep -P "$first") # the lock's holder: rank 0, the child plait train supervises
    # (timeout: were it not refused, it would train for minutes)
    expect_error "$WORK/busy2.log" 1 \
        "run directory $WORK/busy is in use by another run \(pid $holder on host $(hostname) since " \
        timeout 60 "$PLAIT" train "$WORK/plan.json" --out "$WORK/busy" --set steps=100000 --set checkpoint.every=0 \
        --set data.val_every=0 || rc=1
    # a checkpoint directory shared by two run directories is locked too
    expect_error "$WORK/busy3.log" 1 "checkpoint directory $WORK/busy/checkpoints is in use by another run \(pid $holder" \
        timeout 60 "$PLAIT" train "$WORK/plan.json" --out "$WORK/busy-other" --set checkpoint.dir="$WORK/busy/checkpoints" \
        --set steps=100000 --set checkpoint.every=0 --set data.val_every=0 || rc=1
    kill -TERM "$first"
    local first_rc=0
    wait "$first" || first_rc=$?
    [ "$first_rc" = 75 ] || { echo "first run exited $first_rc"; cat "$WORK/busy.log"; rc=1; }
    # the first run's metrics are whole: one record per step, in order
    "$PY" - "$WORK/busy/metrics.jsonl" <<'PYEOF' || rc=1
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step"' in l]
assert steps == list(range(1, len(steps) + 1)), steps[:20]
PYEOF
    return $rc
}

# A run that re-saves a damaged checkpoint (step 12 truncated: it resumes at 8
# and writes 12 again), killed with SIGKILL at the K-th call of a syscall, then
# run again: for every K it finishes with the uninterrupted run's metrics.
# (No restarts by plait train: strace would kill each restarted rank at its
# K-th call too; the lost rank ends the run with 76.)
crash_at_every() { # SYSCALLS
    local calls=$1 k=1 base=$WORK/crash-base
    rm -rf "$base"
    cp -a "$WORK/ref" "$base"
    truncate -s 100 "$base/checkpoints/step_00000012_0000/model.bin"
    while :; do
        local run=$WORK/crash-$k rc=0
        rm -rf "$run"
        cp -a "$base" "$run"
        # (LeakSanitizer cannot run under ptrace; the resumed run below checks leaks)
        ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" \
            strace -f -o /dev/null -e trace="$calls" -e inject="$calls":signal=KILL:when="$k" \
            "$PLAIT" train "$WORK/plan.json" --out "$run" --set checkpoint.max_restarts=0 \
            >"$run.log" 2>&1 || rc=$?
        if [ "$rc" = 0 ]; then break; fi # fewer than k calls: every point was tried
        [ "$rc" = 76 ] && grep -q "was killed by signal 9" "$run.log" ||
            { echo "K=$k: exit code $rc, not killed"; cat "$run.log"; return 1; }
        "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.again.log" 2>&1 ||
            { echo "K=$k: the run did not resume after the crash"; cat "$run.again.log"; return 1; }
        metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl" >/dev/null ||
            { echo "K=$k: metrics differ"; metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"; return 1; }
        ls -a "$run/checkpoints" | grep -q '^\.\(tmp\|old\)-' && { echo "K=$k: temporaries left"; ls -a "$run/checkpoints"; return 1; }
        rm -rf "$run"
        k=$((k + 1))
    done
    [ "$k" -gt 5 ] || { echo "only $((k - 1)) $calls calls: the scenario did not re-save"; return 1; }
    echo "$((k - 1)) crash points of $calls resumed to the same metrics"
}

test_a_crash_at_any_rename_resumes_to_the_same_metrics() { crash_at_every rename; }
test_a_crash_at_any_fsync_resumes_to_the_same_metrics() { crash_at_every fsync; }

test_unusable_checkpoints_never_cost_the_metrics() {
    cp -a "$WORK/ref" "$WORK/broken"
    for c in "$WORK"/broken/checkpoints/step_*; do truncate -s 10 "$c/optim.bin"; done
    expect_error "$WORK/broken.log" 1 "none of its 3 checkpoints is usable" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/broken" || return 1
    cmp "$WORK/ref/metrics.jsonl" "$WORK/broken/metrics.jsonl"
}

# A disk that fills up during a checkpoint: the run fails naming ENOSPC and
# leaves no temporary; with room again it resumes. A private mount namespace
# with a small tmpfs: nothing outside the test sees it.
test_a_full_disk_leaves_no_temporaries_and_resumes() {
    full_disk_then_room 1200k && metrics_equal "$WORK/ref/metrics.jsonl" "$WORK/full-metrics.jsonl"
}

check another_plan_in_the_same_run_directory_is_refused test_another_plan_in_the_same_run_directory_is_refused
check a_run_directory_without_its_plan_is_refused test_a_run_directory_without_its_plan_is_refused
check a_shared_checkpoint_dir_with_another_seed_is_refused test_a_shared_checkpoint_dir_with_another_seed_is_refused
check fields_that_may_change_resume_and_are_reported test_fields_that_may_change_resume_and_are_reported
check fresh_starts_over test_fresh_starts_over
check a_second_run_on_a_busy_directory_is_refused_naming_the_first test_a_second_run_on_a_busy_directory_is_refused_naming_the_first
check a_crash_at_any_rename_resumes_to_the_same_metrics test_a_crash_at_any_rename_resumes_to_the_same_metrics
check a_crash_at_any_fsync_resumes_to_the_same_metrics test_a_crash_at_any_fsync_resumes_to_the_same_metrics
check unusable_checkpoints_never_cost_the_metrics test_unusable_checkpoints_never_cost_the_metrics
check a_full_disk_leaves_no_temporaries_and_resumes test_a_full_disk_leaves_no_temporaries_and_resumes
finish
