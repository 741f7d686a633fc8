#!/usr/bin/env bash
# sbatch --train-plan against a real Slurm: a private cluster (munged,
# slurmctld and two slurmd, node1 and node2, with 4 fake GPUs each) started
# here with the plugin from the build tree and the H100 fixture as the nodes'
# topology. Everything it writes stays under $WORK (configuration, state, logs,
# munge key and socket, fake devices; free ports), clients reach it through
# SLURM_CONF, and it is stopped by PID at the end (also on failure). Needs
# root (it runs the daemons); refuses to run beside a slurmctld it did not
# start. The plugin is not built with sanitizers, so this runs once.
# asan: skip
source "$(dirname "$0")/lib.sh"

PLUGIN=$BUILD/lib/spank_plait.so
SLURM_DIR=$ROOT/tests/integration/slurm
export STATE=$WORK/slurm
export SLURM_CONF=$STATE/conf/slurm.conf
trap '"$SLURM_DIR/slurm-down.sh" >/dev/null 2>&1; rm -rf "$WORK"' EXIT

if [ "$(id -u)" != 0 ] || ! command -v slurmctld >/dev/null || [ ! -f "$PLUGIN" ]; then
    echo "not ok slurm_cluster_starts (needs root, Slurm (scripts/deps.sh test) and $PLUGIN)"
    exit 1
fi
# munged wants the directories above its socket searchable
chmod 711 "$WORK"

tiny_data
cat >"$WORK/quota.json" <<EOF
{"users": {"root": 8}}
EOF
ARGS="max_gpus_per_job=8 max_nodes=2 allowed_precisions=fp32,bf16 min_checkpoint_every=50"
ARGS="$ARGS quota_file=$WORK/quota.json topology_xml=$ROOT/tests/topo/h100_sxm8/topology.xml"
up_rc=0
SPANK_PLUGIN=$PLUGIN SPANK_ARGS=$ARGS "$SLURM_DIR/slurm-up.sh" >"$WORK/up.log" 2>&1 || up_rc=$?
if [ "$up_rc" = 3 ]; then # a slurmctld of someone else's: a real cluster, another test run
    echo "not ok slurm_cluster_starts ($(grep -m1 -o 'a slurmctld this test did not start.*' "$WORK/up.log"))"
    exit 1
elif [ "$up_rc" != 0 ]; then
    echo "not ok slurm_cluster_starts"
    sed 's/^/    # /' "$WORK/up.log" | tail -n 30
    exit 1
fi
echo "ok slurm_cluster_starts"

# PLAIT_SLURM_ONLY=PATTERN: only the cases whose name contains PATTERN run
# (the cluster still starts), for working on one of them
if [ -n "${PLAIT_SLURM_ONLY:-}" ]; then
    eval "all_$(declare -f check)"
    check() { case $1 in *"$PLAIT_SLURM_ONLY"*) all_check "$@" ;; esac; }
fi

# plan FILE TP PP DP [extra JSON members]: a plan for the tiny byte model
plan() {
    cat >"$1" <<EOF
{"model": {"layers": 2, "heads": 4, "hidden": 32, "vocab": 256, "seq_len": 32, "seed": 7},
 "data": {"train": "$WORK/train.bin", "shuffle": true},
 "batch": {"micro_batch": 4, "grad_accum": 2},
 "optimizer": {"lr": 2e-3, "warmup_steps": 2},
 "steps": 40, "checkpoint": {"every": 10, "keep": 3},
 "parallel": {"tp": $2, "pp": $3, "dp": $4${5:+, $5}}}
EOF
}

# wait_state JOB STATE...: until the job is in one of the states (60 s)
wait_state() {
    local job=$1 s
    shift
    for _ in $(seq 600); do
        s=$(squeue -h -j "$job" -o %T 2>/dev/null)
        [ -z "$s" ] && s=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        for want in "$@"; do [ "$s" = "$want" ] && return 0; done
        sleep 0.1
    done
    echo "job $job is $s, not $*"
    return 1
}

job_state() { scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# sbatch_wait [sbatch options...]: sbatch from $WORK, then waits for the job
# to end, polling every 0.1 s (sbatch -W polls every 2 to 10 s); prints the
# job id; fails unless the job completed
sbatch_wait() {
    local job
    job=$(cd "$WORK" && sbatch --parsable "$@") || return 1
    echo "$job"
    wait_state "$job" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY >&2 || return 1
    [ "$(job_state "$job")" = COMPLETED ]
}

# bypass_sbatch [sbatch options...]: sbatch from $WORK through a private
# slurm.conf whose plugstack has no plait, as a user skipping the plugin would
bypass_sbatch() {
    if [ ! -f "$WORK/conf/slurm.conf" ]; then
        mkdir -p "$WORK/conf"
        sed "s#^PlugStackConfig=.*#PlugStackConfig=$WORK/conf/plugstack.conf#" "$SLURM_CONF" >"$WORK/conf/slurm.conf"
        : >"$WORK/conf/plugstack.conf"
    fi
    (cd "$WORK" && SLURM_CONF=$WORK/conf/slurm.conf sbatch "$@")
}

# with_plugstack LINE COMMAND...: runs the command while plugstack.conf is
# LINE (sbatch, srun and slurmstepd read it at each launch)
with_plugstack() {
    local conf=$STATE/conf/plugstack.conf saved rc=0
    saved=$(cat "$conf")
    printf '%s\n' "$1" >"$conf"
    shift
    "$@" || rc=$?
    printf '%s\n' "$saved" >"$conf"
    return $rc
}

# with_plugin_args "KEY=VALUE..." COMMAND...: runs the command while the
# plugin has these plugstack arguments besides the test's
with_plugin_args() {
    local line
    line="$(cat "$STATE/conf/plugstack.conf") $1"
    shift
    with_plugstack "$line" "$@"
}

# without_plugin COMMAND...: runs the command while plugstack.conf names no
# plugin at all, as on a cluster whose admin never installed plait
without_plugin() { with_plugstack "" "$@"; }

# dump.sh NAME: the PLAIT_* and SLURM_SPANK_* variables of the batch script
# (NAME.batch) and of a one-task step (NAME.step)
cat >"$WORK/dump.sh" <<'EOF'
#!/bin/bash
env | grep -E '^(PLAIT_|SLURM_SPANK_)' | sort >"$1.batch"
srun -n1 bash -c 'env | grep -E "^(PLAIT_|SLURM_SPANK_)" | sort' >"$1.step"
EOF
chmod +x "$WORK/dump.sh"

test_the_cluster_lives_in_the_tests_sandbox() {
    # every path the daemons write, under STATE; ports of its own
    scontrol show config >"$WORK/config.txt" || return 1
    local key value rc=0
    for key in SLURM_CONF StateSaveLocation SlurmdSpoolDir PlugStackConfig SlurmctldPidFile \
        SlurmdPidFile SlurmctldLogFile SlurmdLogFile TmpFS; do
        value=$(sed -n "s/^$key *= *//p" "$WORK/config.txt")
        case $value in "$STATE"/*) ;; *) echo "$key = $value, outside $STATE"; rc=1 ;; esac
    done
    grep -qx "AuthInfo *= *socket=$STATE/munge/munge.socket" "$WORK/config.txt" ||
        { grep AuthInfo "$WORK/config.txt"; rc=1; }
    ! grep -E '^Slurm(ctld|d)Port *= *(6817|6818)$' "$WORK/config.txt" || rc=1
    # the daemons are ours, reading STATE's configuration
    local f
    for f in "$STATE"/pid/munged.pid "$STATE"/pid/slurmctld.pid "$STATE"/pid/slurmd-node*.pid; do
        tr '\0' ' ' </proc/"$(cat "$f")"/cmdline | grep -qF "$STATE/" || { echo "$f: not ours"; rc=1; }
    done
    # a second cluster refuses to start beside this one; stopping that one stops nothing of ours
    expect_error "$WORK/second.log" 3 "refusing to start: a slurmctld this test did not start is running" \
        env STATE="$WORK/second" "$SLURM_DIR/slurm-up.sh" || rc=1
    [ ! -e "$WORK/second/conf/slurm.conf" ] || { echo "the second cluster wrote its config"; rc=1; }
    STATE=$WORK/second "$SLURM_DIR/slurm-down.sh"
    [ "$(sinfo -h -N -o '%N %T' | sort -u | grep -c ' idle$')" = 2 ] || { sinfo -N; rc=1; }
    return $rc
}

test_sbatch_knows_train_plan_and_refuses_bad_plans() {
    sbatch --help | grep -q -- '--train-plan=FILE' || { echo "--train-plan not in sbatch --help"; return 1; }
    plan "$WORK/bad.json" 1 1 1 '"zero": 7'
    expect_error "$WORK/t1a.log" any "spank_plait: .*bad.json:6: parallel.zero: must be in \[0, 3\] \(got 7\)" \
        sbatch --train-plan="$WORK/bad.json" --wrap true || return 1
    expect_error "$WORK/t1b.log" any "spank_plait: $WORK/missing.json: No such file or directory" \
        sbatch --train-plan="$WORK/missing.json" --wrap true || return 1
    # srun and salloc check the same way
    expect_error "$WORK/t1c.log" any "parallel.zero: must be in" \
        srun --train-plan="$WORK/bad.json" true || return 1
    expect_error "$WORK/t1f.log" any "parallel.zero: must be in" \
        salloc --train-plan="$WORK/bad.json" true || return 1
    # and the environment fallback, from an #SBATCH-less script
    expect_error "$WORK/t1d.log" any "parallel.zero: must be in" \
        env PLAIT_TRAIN_PLAN="$WORK/bad.json" sbatch --wrap true || return 1
    printf '#!/bin/bash\n#SBATCH --train-plan=%s\ntrue\n' "$WORK/bad.json" >"$WORK/directive.sh"
    expect_error "$WORK/t1e.log" any "parallel.zero: must be in" sbatch "$WORK/directive.sh" || return 1
    # an admin's typo in plugstack.conf is refused, naming the key
    mkdir -p "$WORK/typo"
    sed "s#^PlugStackConfig=.*#PlugStackConfig=$WORK/typo/plugstack.conf#" "$SLURM_CONF" >"$WORK/typo/slurm.conf"
    echo "required $PLUGIN max_gpu_per_job=8" >"$WORK/typo/plugstack.conf"
    expect_error "$WORK/t1g.log" any "spank_plait: plugstack.conf: unknown argument 'max_gpu_per_job' \(known keys: max_gpus_per_job," \
        env SLURM_CONF="$WORK/typo/slurm.conf" sbatch --wrap true
}

test_policy_limits_and_quota_are_enforced_at_submit() {
    plan "$WORK/big.json" 4 2 2
    expect_error "$WORK/t2a.log" any \
        "the plan needs 16 GPUs .*at most 8 per job \(max_gpus_per_job\)" \
        sbatch --train-plan="$WORK/big.json" --wrap true || return 1
    # fp8 is a precision the admin allows or not (this cluster: fp32,bf16)
    plan "$WORK/fp8.json" 1 1 1 '"device": "cpu"'
    sed -i '1s/^{/{"precision": "fp8", /' "$WORK/fp8.json"
    expect_error "$WORK/t2d.log" any \
        "precision: \"fp8\" is not allowed on this cluster \(allowed_precisions: fp32,bf16\)" \
        sbatch --train-plan="$WORK/fp8.json" --wrap true || return 1
    plan "$WORK/sparse.json" 1 1 1 '"device": "cpu"'
    sed -i 's/"every": 10/"every": 100/' "$WORK/sparse.json"
    expect_error "$WORK/t2b.log" any "checkpoint.every: 100 is more than this cluster's 50 steps" \
        sbatch --train-plan="$WORK/sparse.json" --wrap true || return 1
    # quota 8 GPUs for root: a held 8-GPU job counts, a second job does not fit
    plan "$WORK/eight.json" 4 2 1
    local first
    first=$(sbatch --parsable --hold -N2 --ntasks-per-node=4 --gpus-per-node=4 \
        --train-plan="$WORK/eight.json" --wrap true) || return 1
    plan "$WORK/four.json" 4 1 1
    local rc=0
    expect_error "$WORK/t2c.log" any "GPU quota: user root would have 12 GPUs in running and pending jobs with this one; the quota is 8" \
        sbatch -N1 --ntasks-per-node=4 --gpus-per-node=4 --train-plan="$WORK/four.json" --wrap true || rc=1
    scancel "$first"
    return $rc
}

test_policy_holds_on_the_compute_side_when_the_client_skips_the_plugin() {
    plan "$WORK/big.json" 4 2 2
    local job rc=0
    job=$(PLAIT_TRAIN_PLAN=$WORK/big.json bypass_sbatch --parsable -o "$WORK/bypass.out" \
        --wrap 'echo the job ran') || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    local state
    state=$(job_state "$job")
    [ "$state" = FAILED ] || { echo "state $state"; cat "$WORK/bypass.out"; rc=1; }
    grep -q "spank_plait: error: job $job: the plan needs 16 GPUs .*max_gpus_per_job" "$WORK/bypass.out" ||
        { echo "no policy message in the job's output:"; cat "$WORK/bypass.out"; rc=1; }
    ! grep -q "the job ran" "$WORK/bypass.out" || { echo "the job's script ran"; rc=1; }
    return $rc
}

test_rank_count_beyond_plait_is_refused_at_submit_and_start() {
    # tp × dp = 4 × 1073741825 wrapped to 4 in 32 bits and passed max_gpus_per_job=8
    plan "$WORK/huge.json" 4 1 1073741825
    local msg="parallel.dp: 1073741825 makes tp × cp × pp × dp = 4294967300 ranks, more than plait runs \(16777216\)"
    expect_error "$WORK/huge.log" any "spank_plait: .*huge.json:[0-9]+: $msg" \
        sbatch --train-plan="$WORK/huge.json" --wrap true || return 1
    # in the task too (a client without the plugin): refused, no SIGFPE
    local job
    job=$(PLAIT_TRAIN_PLAN=$WORK/huge.json bypass_sbatch --parsable -o "$WORK/huge.out" --wrap true) || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    [ "$(job_state "$job")" = FAILED ] || { job_state "$job"; return 1; }
    grep -qE "spank_plait: error: job $job: .*$msg" "$WORK/huge.out" || { cat "$WORK/huge.out"; return 1; }
}

test_user_plait_plan_cannot_replace_the_checked_plan() {
    plan "$WORK/cpu.json" 1 1 1 '"device": "cpu"'
    PLAIT_PLAN=/some/other/plan.json PLAIT_RUN_DIR=/tmp/elsewhere sbatch_wait \
        -o "$WORK/userplan.out" --train-plan="$WORK/cpu.json" dump.sh userplan >/dev/null ||
        { cat "$WORK/userplan.out"; return 1; }
    local f rc=0
    for f in "$WORK"/userplan.batch "$WORK"/userplan.step; do
        ! grep '^PLAIT_PLAN=' "$f" || { echo "$f: the user's PLAIT_PLAN reached the task"; rc=1; }
        grep -q '^PLAIT_PLAN_JSON={.*"steps":40' "$f" || { echo "$f: no checked plan"; rc=1; }
        # without run_root, the user's run directory holds (as before)
        grep -qx 'PLAIT_RUN_DIR=/tmp/elsewhere' "$f" || { grep PLAIT_RUN_DIR "$f"; rc=1; }
    done
    return $rc
}

# rundir_job NAME PLAIT_RUN_DIR ("-": unset): a job whose step reports its run directory
rundir_job() {
    local name=$1 value=$2
    if [ "$value" = - ]; then
        (unset PLAIT_RUN_DIR && sbatch_wait -o "$WORK/$name.out" --train-plan="$WORK/cpu.json" \
            dump.sh "$name")
    else
        PLAIT_RUN_DIR=$value sbatch_wait -o "$WORK/$name.out" --train-plan="$WORK/cpu.json" \
            dump.sh "$name"
    fi >"$WORK/$name.id" 2>&1
}

test_run_dir_stays_under_run_root() {
    plan "$WORK/cpu.json" 1 1 1 '"device": "cpu"'
    local root=$WORK/run_root
    submit_all() {
        rundir_job rd_default - &
        rundir_job rd_relative team/run1 &
        rundir_job rd_absolute "$root/abs" &
        rundir_job rd_outside /tmp/elsewhere &
        rundir_job rd_dotdot team/../../escape &
        wait
    }
    with_plugin_args "run_root=$root" submit_all
    local rc=0 job
    job=$(head -n1 "$WORK/rd_default.id")
    grep -qx "PLAIT_RUN_DIR=$root/slurm-$job" "$WORK/rd_default.step" || { cat "$WORK/rd_default.out"; rc=1; }
    grep -qx "PLAIT_RUN_DIR=$root/team/run1" "$WORK/rd_relative.step" || { cat "$WORK/rd_relative.out"; rc=1; }
    grep -qx "PLAIT_RUN_DIR=$root/abs" "$WORK/rd_absolute.step" || { cat "$WORK/rd_absolute.out"; rc=1; }
    local name value
    for name in rd_outside:/tmp/elsewhere rd_dotdot:team/../../escape; do
        value=${name#*:} name=${name%%:*}
        [ ! -e "$WORK/$name.batch" ] || { echo "$name: the job ran"; rc=1; }
        grep -qF "PLAIT_RUN_DIR=$value is not a directory under this cluster's run_root $root" \
            "$WORK/$name.out" || { echo "$name:"; cat "$WORK/$name.out"; rc=1; }
    done
    return $rc
}

# From inside a plait job (its plan: steps 40), sbatch with a plan of its own
# that breaks the policy, with a good one (steps 41), and with none; and a
# step of the job itself. Runs once, for the three checks that follow.
nested_jobs() {
    plan "$WORK/parent.json" 1 1 1 '"device": "cpu"'
    plan "$WORK/child.json" 1 1 1 '"device": "cpu"'
    sed -i 's/"steps": 40/"steps": 41/' "$WORK/child.json"
    plan "$WORK/child_bad.json" 4 2 2
    cat >"$WORK/parent.sh" <<EOF
#!/bin/bash
cd "$WORK"
sbatch --train-plan="$WORK/child_bad.json" --wrap true >nested_bad.log 2>&1
echo "bad rc=\$?"
sbatch --parsable -o nested_child.out --train-plan="$WORK/child.json" dump.sh nested_child >nested_child.id
echo "child rc=\$?"
sbatch --parsable -o nested_plain.out dump.sh nested_plain >nested_plain.id
echo "plain rc=\$?"
./dump.sh nested_parent
EOF
    sbatch_wait -o "$WORK/parent.out" --train-plan="$WORK/parent.json" parent.sh \
        >"$WORK/parent.id" || { cat "$WORK/parent.out"; return 1; }
    local child
    for child in nested_child nested_plain; do
        [ -s "$WORK/$child.id" ] || { cat "$WORK/parent.out"; return 1; }
        wait_state "$(cat "$WORK/$child.id")" COMPLETED FAILED || return 1
    done
}

test_nested_sbatch_refuses_its_own_bad_plan() {
    nested_jobs || return 1
    grep -q "bad rc=[1-9]" "$WORK/parent.out" || { cat "$WORK/parent.out" "$WORK/nested_bad.log"; return 1; }
    grep -q "spank_plait: $WORK/child_bad.json: the plan needs 16 GPUs" "$WORK/nested_bad.log" ||
        { cat "$WORK/nested_bad.log"; return 1; }
}

test_nested_sbatch_runs_its_own_plan() {
    grep -q "child rc=0" "$WORK/parent.out" || { cat "$WORK/parent.out" "$WORK/nested_child.out"; return 1; }
    local f rc=0 parent
    parent=$(cat "$WORK/parent.id")
    for f in "$WORK"/nested_child.batch "$WORK"/nested_child.step; do
        grep -q '^PLAIT_PLAN_JSON={.*"steps":41' "$f" || { echo "$f: not the child's plan"; rc=1; }
        grep -q '^SLURM_SPANK_PLAIT_PLAN_JSON={.*"steps":41' "$f" || { echo "$f: not the child's plan"; rc=1; }
        ! grep "PLAIT_RUN_DIR=.*/slurm-$parent$" "$f" || { echo "$f: the parent's run directory"; rc=1; }
    done
    # a step of the parent keeps the parent's plan
    grep -q '^PLAIT_PLAN_JSON={.*"steps":40' "$WORK/nested_parent.step" ||
        { cat "$WORK/nested_parent.step"; rc=1; }
    return $rc
}

test_nested_sbatch_without_train_plan_is_not_a_plait_job() {
    grep -q "plain rc=0" "$WORK/parent.out" || { cat "$WORK/parent.out" "$WORK/nested_plain.out"; return 1; }
    local f rc=0
    for f in "$WORK"/nested_plain.batch "$WORK"/nested_plain.step; do
        ! grep -E '^(PLAIT_PLAN_JSON|PLAIT_RUN_DIR|PLAIT_RANK|SLURM_SPANK_PLAIT|SLURM_SPANK__SLURM_SPANK_OPTION_plait)' "$f" ||
            { echo "$f: the parent's plait job leaked into it"; rc=1; }
    done
    return $rc
}

# The times slurmctld answered slurm_load_jobs (REQUEST_JOB_INFO; squeue -j
# and scontrol show job, which wait_state uses, ask REQUEST_JOB_INFO_SINGLE).
job_info_rpcs() {
    sdiag | sed -n 's/^[[:space:]]*REQUEST_JOB_INFO[[:space:]]*( 2003) count:\([0-9]*\).*/\1/p'
}

test_quota_is_counted_once_per_job_not_per_task() {
    plan "$WORK/tp4pp2.json" 4 2 1
    printf '#!/bin/bash\nsrun true\n' >"$WORK/quota8.sh"
    local before after
    before=$(job_info_rpcs)
    sbatch_wait -N2 --ntasks-per-node=4 --gpus-per-node=4 --train-plan="$WORK/tp4pp2.json" \
        -o "$WORK/quota8.out" quota8.sh >/dev/null || { cat "$WORK/quota8.out"; return 1; }
    after=$(job_info_rpcs)
    # sbatch at submit, the batch script, task 0 of the 8-task step (was 10: one per task)
    local calls=$((${after:-0} - ${before:-0}))
    [ "$calls" = 3 ] || { echo "slurm_load_jobs calls: $calls, want 3"; return 1; }
}

test_error_text_is_one_escaped_line() {
    plan "$WORK/evil.json" 1 1 1 '"device": "cpu", "bad\nkey\u001b[31m": 1'
    local evil_path=$WORK/big$'\e[31m'.json rc=0
    plan "$evil_path" 4 2 2
    # at submit: the parser's message, and a plan path with an escape sequence
    sbatch --train-plan="$WORK/evil.json" --wrap true >"$WORK/evil.log" 2>&1 && { echo accepted; return 1; }
    sbatch --train-plan="$evil_path" --wrap true >"$WORK/evilpath.log" 2>&1 && { echo accepted; return 1; }
    grep -q 'spank_plait: .*bad\\nkey\\x1b\[31m' "$WORK/evil.log" || { cat -A "$WORK/evil.log"; rc=1; }
    grep -q 'spank_plait: .*/big\\x1b\[31m\.json: the plan needs 16 GPUs' "$WORK/evilpath.log" ||
        { cat -A "$WORK/evilpath.log"; rc=1; }
    # in the task (a client without the plugin): the job's output and slurmd's log
    local job log
    job=$(PLAIT_TRAIN_PLAN=$WORK/evil.json bypass_sbatch --parsable -o "$WORK/evil.out" --wrap true) || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    grep -q "spank_plait: error: job $job: .*bad\\\\nkey\\\\x1b\[31m" "$WORK/evil.out" ||
        { cat -A "$WORK/evil.out"; rc=1; }
    for log in "$WORK/evil.log" "$WORK/evilpath.log" "$WORK/evil.out" "$STATE"/log/slurmd-node*.log; do
        ! grep -qP '\x1b' "$log" || { echo "$log: a raw ESC"; grep -P '\x1b' "$log" | cat -A; rc=1; }
    done
    return $rc
}

test_eight_tasks_get_their_place_and_env() {
    plan "$WORK/tp4pp2.json" 4 2 1
    cat >"$WORK/env.sh" <<'EOF'
#!/bin/bash
srun bash -c 'env | grep -E "^(PLAIT_|CUDA_|NCCL_)" | grep -v PLAIT_PLAN_JSON | sort > env.$SLURM_PROCID'
EOF
    sbatch_wait -N2 --ntasks-per-node=4 --gpus-per-node=4 --train-plan="$WORK/tp4pp2.json" \
        -o "$WORK/env.out" env.sh >/dev/null || { cat "$WORK/env.out"; return 1; }
    # the same map from plait check, computed without Slurm, must agree
    "$PLAIT" check "$WORK/tp4pp2.json" --nodes 2 --gpus-per-node 4 \
        --topology "$ROOT/tests/topo/h100_sxm8/topology.xml" --json >"$WORK/check.json" || return 1
    "$PY" - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
check = {r["rank"]: r for r in json.load(open(f"{w}/check.json"))["ranks"]}
required = ["PLAIT_RANK", "PLAIT_WORLD_SIZE", "PLAIT_LOCAL_RANK", "PLAIT_LOCAL_WORLD_SIZE",
            "PLAIT_NODE_RANK", "PLAIT_NODES", "PLAIT_TP", "PLAIT_PP", "PLAIT_DP", "PLAIT_TP_RANK",
            "PLAIT_PP_RANK", "PLAIT_DP_RANK", "PLAIT_DEVICE", "PLAIT_GPU_BUSID", "PLAIT_NIC",
            "PLAIT_CPUS", "PLAIT_NUMA", "PLAIT_RUN_DIR", "PLAIT_RESTART_COUNT",
            "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_IB_HCA", "PLAIT_STORE_ADDR",
            "PLAIT_STORE_SECRET"]
stores = set()
coords, groups = set(), {}
for r in range(8):
    env = dict(l.rstrip("\n").split("=", 1) for l in open(f"{w}/env.{r}"))
    missing = [k for k in required if k not in env]
    assert not missing, (r, missing)
    assert env["PLAIT_RANK"] == str(r) and env["PLAIT_WORLD_SIZE"] == "8", env
    c = (env["PLAIT_TP_RANK"], env["PLAIT_PP_RANK"], env["PLAIT_DP_RANK"])
    assert c not in coords, ("duplicate coordinates", r, c)
    coords.add(c)
    assert env["PLAIT_TP"] == "4" and env["PLAIT_PP"] == "2" and env["PLAIT_DP"] == "1"
    # Megatron order: tp fastest; 4 tasks per node, one tp group per node
    assert c == (str(r % 4), str(r // 4), "0"), (r, c)
    assert env["PLAIT_NODE_RANK"] == str(r // 4), (r, env["PLAIT_NODE_RANK"])
    groups.setdefault(r // 4, set()).add(env["PLAIT_NODE_RANK"])
    want = check[r]
    assert env["PLAIT_DEVICE"] == str(want["gpu_index"]) == str(r % 4), (r, env["PLAIT_DEVICE"])
    assert env["PLAIT_GPU_BUSID"] == want["gpu_busid"], (r, env["PLAIT_GPU_BUSID"])
    assert env["PLAIT_NIC"] == want["nic"] == f"mlx5_{r % 4}", (r, env["PLAIT_NIC"])
    assert env["NCCL_IB_HCA"] == "=" + want["nic"], env["NCCL_IB_HCA"]
    assert env["PLAIT_CPUS"] == want["cpus"], (r, env["PLAIT_CPUS"], want["cpus"])
    assert want["nvlink_domain"] == 0
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PLAIT_RUN_DIR"].startswith(w + "/runs/slurm-"), env["PLAIT_RUN_DIR"]
    # the store srun hosts for the step: where srun runs, the step's secret
    assert env["PLAIT_STORE_ADDR"].startswith("127.0.0.1:"), env["PLAIT_STORE_ADDR"]
    assert len(env["PLAIT_STORE_SECRET"]) == 64, "a 256-bit secret"
    assert "PLAIT_SPANK_STORE_PORT" not in env, "the plugin's own variable stays the plugin's"
    stores.add((env["PLAIT_STORE_ADDR"], env["PLAIT_STORE_SECRET"]))
assert all(len(v) == 1 for v in groups.values())
assert len(stores) == 1, "one store for the step"
print("8 tasks placed as plait check places them")
PYEOF
}

test_wrong_task_count_fails_the_step() {
    plan "$WORK/tp4pp2.json" 4 2 1
    local rc=0
    (cd "$WORK" && srun -N1 -n2 --gpus-per-node=2 --train-plan="$WORK/tp4pp2.json" true) \
        >"$WORK/count.log" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || { echo "accepted"; return 1; }
    grep -q "the step has 2 tasks, but the plan needs tp 4 × pp 2 × dp 1 = 8" "$WORK/count.log" ||
        { cat "$WORK/count.log"; return 1; }
    # dp "auto" with a global batch of 2 micro-batches keeps 2 replicas, not the step's 3
    sed 's/"grad_accum": 2/"global_batch": 8/' "$WORK/tp4pp2.json" |
        sed 's/"tp": 4, "pp": 2, "dp": 1/"tp": 1, "pp": 1, "dp": "auto"/' >"$WORK/global.json"
    rc=0
    (cd "$WORK" && srun -N1 -n3 --train-plan="$WORK/global.json" true) >"$WORK/global.log" 2>&1 ||
        rc=$?
    [ "$rc" -ne 0 ] || { echo "accepted"; return 1; }
    grep -q "the step has 3 tasks, but batch.global_batch 8 (micro_batch 4) keeps at most dp 2" \
        "$WORK/global.log" || { cat "$WORK/global.log"; return 1; }
}

train_job() { # NAME PLAN [sbatch options...]: a CPU training job; prints its id
    local name=$1 planfile=$2
    shift 2
    printf '#!/bin/bash\nsrun %s launch\n' "$PLAIT" >"$WORK/$name.sh"
    (cd "$WORK" && sbatch --parsable --train-plan="$planfile" -o "$WORK/$name.out" \
        --open-mode=append "$@" "$name.sh")
}

# same_as_plait_train NAME PLAN RUN_DIR: the run's metrics are those of the
# same plan trained by plait train on one machine (into $WORK/NAME_local), to the bit
same_as_plait_train() {
    OMP_NUM_THREADS=1 "$PLAIT" train "$2" --out "$WORK/${1}_local" >"$WORK/${1}_local.log" 2>&1 ||
        { tail "$WORK/${1}_local.log"; return 1; }
    metrics_equal "$WORK/${1}_local/metrics.jsonl" "$3/metrics.jsonl"
}

test_training_runs_through_slurm() {
    plan "$WORK/train.json" 1 1 1 '"device": "cpu"'
    # the plan travels with the job: the file is gone when the job starts
    cp "$WORK/train.json" "$WORK/gone.json"
    local job
    job=$(train_job train "$WORK/gone.json" -N1 -n1 --hold) || return 1
    rm "$WORK/gone.json"
    scontrol release "$job"
    wait_state "$job" COMPLETED FAILED || return 1
    local run=$WORK/runs/slurm-$job
    grep -q '^step 40/40' "$WORK/train.out" || { cat "$WORK/train.out"; return 1; }
    [ -d "$run/checkpoints/step_00000040_0000" ] || { ls -R "$run"; return 1; }
    [ "$(grep -c '"step"' "$run/metrics.jsonl")" = 40 ] || return 1
    # the run's metrics are those of the same plan trained without Slurm
    "$PLAIT" train "$WORK/train.json" --out "$WORK/local" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/local/metrics.jsonl" "$run/metrics.jsonl"
}

# tp 2 × pp 2 × dp 2 across the two nodes, 4 tasks each: srun hosts the
# step's store, each task gets its address and the step's secret, and the
# ranks train together; the metrics are those of the same plan trained by
# plait train on one machine, to the bit.
test_3d_training_runs_across_two_nodes() {
    plan "$WORK/p222.json" 2 2 2 '"device": "cpu", "zero": 1'
    printf '#!/bin/bash\nexport OMP_NUM_THREADS=1\nsrun %s launch\n' "$PLAIT" >"$WORK/p222.sh"
    local job run
    job=$(sbatch_wait -N2 --ntasks-per-node=4 --train-plan="$WORK/p222.json" -o "$WORK/p222.out" \
        p222.sh) || { cat "$WORK/p222.out"; return 1; }
    run=$WORK/runs/slurm-$job
    grep -q '^step 40/40 .* | straggler rank' "$WORK/p222.out" || { cat "$WORK/p222.out"; return 1; }
    # every rank wrote its part of the last checkpoint
    [ "$(ls "$run/checkpoints/step_00000040_0000" | grep -c '^optim-tp[01]-pp[01]-dp[01]\.bin$')" = 8 ] ||
        { ls "$run/checkpoints/step_00000040_0000"; return 1; }
    same_as_plait_train p222 "$WORK/p222.json" "$run"
}

# A step of several ranks started by an srun without the plugin has no store:
# the tasks fail at once, saying so, instead of waiting for a rendezvous.
test_a_multi_rank_step_without_the_store_fails_clearly() {
    plan "$WORK/nostore.json" 2 1 1 '"device": "cpu"'
    local job
    job=$(PLAIT_TRAIN_PLAN=$WORK/nostore.json bypass_sbatch --parsable -N1 -n2 -o "$WORK/nostore.out" \
        --wrap "SLURM_CONF=$WORK/conf/slurm.conf srun $PLAIT launch") || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    [ "$(job_state "$job")" = FAILED ] || { cat "$WORK/nostore.out"; return 1; }
    grep -q "this step runs 2 ranks, but srun hosted no rendezvous store for them" "$WORK/nostore.out" ||
        { cat "$WORK/nostore.out"; return 1; }
}

# The admin's store_ports: srun hosts the step's store on a port of that
# range (a firewall between nodes may allow only it); a range that is not
# one refuses the job at submission, naming the key.
test_store_ports_are_the_admins_range() {
    plan "$WORK/ports.json" 2 1 1 '"device": "cpu"'
    local lo=$((20000 + RANDOM % 20000)) port rc=0
    ports_job() {
        sbatch_wait -N1 -n2 --train-plan="$WORK/ports.json" -o "$WORK/ports.out" \
            --wrap 'srun bash -c "echo \$PLAIT_STORE_ADDR > addr.\$SLURM_PROCID"' >/dev/null
    }
    rm -f "$WORK"/addr.*
    with_plugin_args "store_ports=$lo-$((lo + 30))" ports_job || { cat "$WORK/ports.out"; return 1; }
    [ "$(cat "$WORK/addr.0")" = "$(cat "$WORK/addr.1")" ] || return 1
    port=$(sed 's/.*://' "$WORK/addr.0")
    [ "$port" -ge "$lo" ] && [ "$port" -le $((lo + 30)) ] || { echo "port $port not in $lo-$((lo + 30))"; return 1; }
    bad_job() { (cd "$WORK" && sbatch --train-plan="$WORK/ports.json" -n2 --wrap true) >"$WORK/badports.out" 2>&1; }
    if with_plugin_args "store_ports=9-1" bad_job; then echo "store_ports=9-1 was accepted"; rc=1; fi
    grep -q "store_ports must be a port range LO-HI within 1-65535 (got '9-1')" "$WORK/badports.out" ||
        { cat "$WORK/badports.out"; rc=1; }
    return $rc
}

# preempt_and_resume NAME PLAN [sbatch options...]: the plan as a job of
# the low partition, preempted by a job that wants both nodes once it has
# trained a little: it checkpoints, is requeued, resumes from that checkpoint
# and ends with the metrics of an uninterrupted run, to the bit.
preempt_and_resume() {
    local name=$1 planfile=$2 low high run
    shift 2
    low=$(train_job "$name" "$planfile" -p low --requeue "$@") || return 1
    run=$WORK/runs/slurm-$low
    for _ in $(seq 600); do # until it has trained a little
        [ -f "$run/metrics.jsonl" ] && [ "$(grep -c '"step"' "$run/metrics.jsonl")" -ge 20 ] && break
        sleep 0.1
    done
    high=$(sbatch --parsable -p high -N2 --exclusive -o "$WORK/high.out" --wrap 'sleep 1') || return 1
    wait_state "$high" COMPLETED || return 1
    # preempted: requeued and held until its BeginTime; release it
    wait_state "$low" PENDING || return 1
    grep -q "stopped by SIGTERM; a checkpoint was written" "$WORK/$name.out" || { cat "$WORK/$name.out"; return 1; }
    local stopped_at
    stopped_at=$(ls "$run/checkpoints" | tail -n 1)
    scontrol update jobid="$low" StartTime=now
    wait_state "$low" COMPLETED FAILED || { cat "$WORK/$name.out"; return 1; }
    scontrol show job "$low" | grep -q "Restarts=1" || { scontrol show job "$low"; return 1; }
    grep -q "resuming from $run/checkpoints/$stopped_at" "$WORK/$name.out" ||
        { echo "no resume from $stopped_at"; cat "$WORK/$name.out"; return 1; }
    grep -q '^step 1500/1500' "$WORK/$name.out" || { tail "$WORK/$name.out"; return 1; }
    OMP_NUM_THREADS=1 "$PLAIT" train "$planfile" --out "$WORK/${name}_local" >/dev/null 2>&1 || return 1
    metrics_equal "$WORK/${name}_local/metrics.jsonl" "$run/metrics.jsonl"
}

# find_process READY_DIR PATTERN VAR=VALUE...: once READY_DIR exists (60 s at
# most), the pid of a process whose command line matches PATTERN (pgrep -f) and
# whose environment holds every VAR=VALUE
find_process() {
    local ready=$1 pattern=$2 p env kv
    shift 2
    for _ in $(seq 600); do
        [ -d "$ready" ] && for p in $(pgrep -f "$pattern"); do
            env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
            for kv in "$@"; do grep -qx "$kv" <<<"$env" || continue 2; done
            echo "$p"
            return 0
        done
        sleep 0.1
    done
    return 1
}

# A task's rank killed (kill -9 of its plait-train) in a 4-rank step on two
# nodes: every task's plait launch restarts its rank together, inside the
# allocation and the same step (its store), with PLAIT_RESTART_COUNT 1, from
# the newest complete checkpoint; the job completes with the metrics of the
# same plan trained by plait train on one machine, to the bit.
test_a_killed_rank_restarts_inside_the_allocation() {
    plan "$WORK/restart.json" 1 2 2 '"device": "cpu"'
    sed -i 's/"steps": 40/"steps": 300/' "$WORK/restart.json"
    local job run victim="" rc=0
    job=$(train_job restart "$WORK/restart.json" -N2 --ntasks-per-node=2 \
        --export=ALL,OMP_NUM_THREADS=1) || return 1
    run=$WORK/runs/slurm-$job
    # once it has trained a little and checkpointed: rank 3's plait-train
    victim=$(find_process "$run/checkpoints/step_00000020_0000" "plait-train" PLAIT_RANK=3 \
        "SLURM_JOB_ID=$job")
    [ -n "$victim" ] || { echo "no rank 3 of job $job"; cat "$WORK/restart.out"; return 1; }
    kill -9 "$victim"
    local again # the restarted rank 3 carries PLAIT_RESTART_COUNT 1
    again=$(find_process "$run" "plait-train" PLAIT_RANK=3 PLAIT_RESTART_COUNT=1 \
        "SLURM_JOB_ID=$job")
    wait_state "$job" COMPLETED FAILED || rc=1
    [ "$(job_state "$job")" = COMPLETED ] || rc=1
    grep -q "launch: rank 3 (pid $victim) was killed by signal 9" "$WORK/restart.out" || rc=1
    grep -q "restarting every rank from the newest complete checkpoint (restart 1 of 3" \
        "$WORK/restart.out" || rc=1
    grep -q "^step 300/300" "$WORK/restart.out" || rc=1
    [ "$rc" = 0 ] || { grep -v '^step\|checkpoint step' "$WORK/restart.out" | tail -n 30; }
    [ -n "$again" ] || { echo "no rank 3 with PLAIT_RESTART_COUNT=1"; rc=1; }
    [ "$rc" = 0 ] || return 1
    same_as_plait_train restart "$WORK/restart.json" "$run"
}

# A task gone (kill -9 of its plait launch, as a node that is lost takes it):
# its rank dies with it, the other tasks wait parallel.timeout_s + 10 s for its
# report, then end the step with 76, saying so, for the batch script to requeue.
test_a_task_gone_ends_the_step_with_76() {
    plan "$WORK/gone.json" 1 2 2 '"device": "cpu", "timeout_s": 3'
    sed -i 's/"steps": 40/"steps": 100000/' "$WORK/gone.json"
    local job run victim=""
    job=$(train_job gone "$WORK/gone.json" -N2 --ntasks-per-node=2 \
        --export=ALL,OMP_NUM_THREADS=1) || return 1
    run=$WORK/runs/slurm-$job
    victim=$(find_process "$run/checkpoints/step_00000010_0000" "$PLAIT launch" PLAIT_RANK=3 \
        "SLURM_JOB_ID=$job")
    [ -n "$victim" ] || { echo "no task of rank 3"; scancel "$job"; cat "$WORK/gone.out"; return 1; }
    kill -9 "$victim"
    wait_state "$job" COMPLETED FAILED || { scancel "$job"; return 1; }
    # every other task says so and exits 76 (srun's own code is its highest: the killed task's 137)
    [ "$(grep -c "launch: rank [0-2]: 1 of 4 tasks did not report the end of their rank within 13 s: exit 76" \
        "$WORK/gone.out")" = 3 ] && grep -q "task 2: Exited with exit code 76" "$WORK/gone.out" &&
        grep -q "tasks 0-1: Exited with exit code 76" "$WORK/gone.out" ||
        { grep -v '^step' "$WORK/gone.out" | tail -n 30; return 1; }
}

# long enough (~15 s here) that the preemption lands mid-run
long_plan() {
    plan "$@"
    sed -i 's/"steps": 40/"steps": 1500/; s/"every": 10/"every": 50/' "$1"
}

test_preempted_job_checkpoints_requeues_and_resumes() {
    long_plan "$WORK/long.json" 1 1 1 '"device": "cpu"'
    preempt_and_resume low "$WORK/long.json" -N1 -n1
}

# The same for tp 2 × pp 2 × dp 2 on both nodes: every rank stops at the same
# step, the parts are committed together, and the requeued job's new srun
# hosts a new store the ranks meet at again.
test_preempted_3d_job_checkpoints_requeues_and_resumes() {
    long_plan "$WORK/long222.json" 2 2 2 '"device": "cpu", "zero": 1'
    preempt_and_resume low222 "$WORK/long222.json" -N2 --ntasks-per-node=4 --export=ALL,OMP_NUM_THREADS=1
}

# ---- srun plait launch PLAN, with no plait plugin in plugstack ----------------------------

# noplugin_job NAME PLAN [sbatch options...]: srun --ntasks-per-node=1 plait
# launch PLAN on both nodes, the run in $WORK/runs/NAME; prints the job's id.
# The nodes' names (node1, node2) are not host names here (NodeAddr is
# 127.0.0.1), so PLAIT_STORE_HOST says where node1 is, as on such a cluster.
noplugin_job() {
    local name=$1 planfile=$2
    shift 2
    (cd "$WORK" && sbatch --parsable -N2 -o "$WORK/$name.out" --open-mode=append \
        --export=ALL,OMP_NUM_THREADS=1,PLAIT_STORE_HOST=127.0.0.1 "$@" \
        --wrap "srun --ntasks-per-node=1 $PLAIT launch $planfile --out $WORK/runs/$name")
}

# tp 2 × dp 2 on two nodes, one task each: task 0 hosts the store, each node
# runs its two ranks placed on its own topology, and the metrics are plait
# train's of the same plan, to the bit.
test_srun_launch_plan_trains_across_nodes_without_the_plugin() {
    plan "$WORK/nop.json" 2 1 2 '"device": "cpu"'
    local job
    job=$(noplugin_job nop "$WORK/nop.json") || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    [ "$(job_state "$job")" = COMPLETED ] && grep -q '^step 40/40' "$WORK/nop.out" &&
        grep -q "launch: node 0 (node1) hosts the step's store at 127.0.0.1:" "$WORK/nop.out" &&
        grep -q "node 1 (node2): the gang of 2 nodes is complete" "$WORK/nop.out" ||
        { cat "$WORK/nop.out"; return 1; }
    ! grep -q spank_plait "$WORK/nop.out" || { echo "the plugin ran"; return 1; }
    # the published store is gone with the step
    ! ls "$WORK/runs/nop"/store-* 2>/dev/null || return 1
    same_as_plait_train nop "$WORK/nop.json" "$WORK/runs/nop"
}

# A rank killed (kill -9 of its plait-train): both nodes restart their ranks
# together inside the step, with PLAIT_RESTART_COUNT 1, from the newest
# complete checkpoint; the metrics are plait train's, to the bit. While it
# runs, the store's secret is in a file only its owner reads, never on a
# command line.
test_srun_launch_plan_restarts_a_killed_rank_without_the_plugin() {
    plan "$WORK/nokill.json" 2 1 2 '"device": "cpu"'
    sed -i 's/"steps": 40/"steps": 300/' "$WORK/nokill.json"
    local job run=$WORK/runs/nokill victim again rc=0 secret
    job=$(noplugin_job nokill "$WORK/nokill.json") || return 1
    victim=$(find_process "$run/checkpoints/step_00000020_0000" "plait-train" PLAIT_RANK=3 \
        "SLURM_JOB_ID=$job")
    [ -n "$victim" ] || { echo "no rank 3 of job $job"; scancel "$job"; cat "$WORK/nokill.out"; return 1; }
    [ "$(stat -c %a "$run"/store-"$job".*)" = 600 ] || { ls -l "$run"; rc=1; }
    secret=$(sed -n 2p "$run"/store-"$job".*)
    ps -eo args >"$WORK/nokill.ps"
    [ "${#secret}" = 64 ] && ! grep -qF "$secret" "$WORK/nokill.ps" || { echo "no secret, or on a command line"; rc=1; }
    kill -9 "$victim"
    again=$(find_process "$run" "plait-train" PLAIT_RANK=3 PLAIT_RESTART_COUNT=1 "SLURM_JOB_ID=$job")
    wait_state "$job" COMPLETED FAILED || rc=1
    [ "$(job_state "$job")" = COMPLETED ] || rc=1
    # (named by its launcher, or by the peers that lost it first)
    grep -Eq "rank 3 \(pid $victim\) was killed by signal 9|global rank 3, host node2, pid $victim\) is gone" \
        "$WORK/nokill.out" || rc=1
    grep -q "restarting every rank from the newest complete checkpoint (restart 1 of 3" \
        "$WORK/nokill.out" || rc=1
    grep -q "^step 300/300" "$WORK/nokill.out" || rc=1
    [ -n "$again" ] || { echo "no rank 3 with PLAIT_RESTART_COUNT=1"; rc=1; }
    [ "$rc" = 0 ] || { grep -v '^step\|checkpoint step' "$WORK/nokill.out" | tail -n 30; return 1; }
    same_as_plait_train nokill "$WORK/nokill.json" "$WORK/runs/nokill"
}

# SIGTERM to the step (scancel --signal=TERM, as a preemption sends it): every
# rank checkpoints, the step ends with 75; the same command again resumes
# from that checkpoint and ends with plait train's metrics, to the bit.
test_srun_launch_plan_checkpoints_on_sigterm_and_resumes_without_the_plugin() {
    plan "$WORK/noterm.json" 2 1 2 '"device": "cpu"'
    sed -i 's/"steps": 40/"steps": 300/' "$WORK/noterm.json"
    local job run=$WORK/runs/noterm stopped_at
    job=$(noplugin_job noterm "$WORK/noterm.json") || return 1
    for _ in $(seq 600); do
        [ -f "$run/metrics.jsonl" ] && [ "$(grep -c '"step"' "$run/metrics.jsonl")" -ge 20 ] && break
        sleep 0.1
    done
    scancel --signal=TERM "$job"
    wait_state "$job" COMPLETED FAILED || { scancel "$job"; return 1; }
    grep -q "stopped by SIGTERM; a checkpoint was written" "$WORK/noterm.out" &&
        grep -q "srun: error: .*Exited with exit code 75" "$WORK/noterm.out" ||
        { grep -v '^step' "$WORK/noterm.out" | tail -n 30; return 1; }
    stopped_at=$(ls "$run/checkpoints" | tail -n 1)
    job=$(noplugin_job noterm "$WORK/noterm.json") || return 1
    wait_state "$job" COMPLETED FAILED || return 1
    [ "$(job_state "$job")" = COMPLETED ] &&
        grep -q "resuming from $run/checkpoints/$stopped_at" "$WORK/noterm.out" &&
        grep -q '^step 300/300' "$WORK/noterm.out" ||
        { echo "no resume from $stopped_at"; grep -v '^step' "$WORK/noterm.out" | tail -n 30; return 1; }
    same_as_plait_train noterm "$WORK/noterm.json" "$WORK/runs/noterm"
}

# A plugin built with another Slurm release's spank.h (21.08 here) refuses to run, saying
# which release it was built for, which this is, and how to rebuild: Slurm itself does not
# check a SPANK plugin's version
test_a_plugin_built_for_another_slurm_release_refuses_to_run() {
    local d=$WORK/release f objs=()
    mkdir -p "$d"
    cc -D_GNU_SOURCE -I"$ROOT" -fPIC -c "$ROOT/spank-plugin/spank_plait.c" \
        -DPLAIT_SLURM_BUILT='((21 << 16) + (8 << 8))' -o "$d/spank_plait.o" || return 1
    # the rest of the plugin as this build made it (the sources git knows, not stale objects)
    while read -r f; do
        [ "$f" = spank-plugin/spank_plait.c ] || objs+=("$BUILD/pic/${f%.c}.o")
    done < <(cd "$ROOT" && git ls-files 'common/*.c' 'spank-plugin/*.c')
    cc -shared -fPIC -Wl,--version-script="$ROOT/spank-plugin/spank_plait.map" "$d/spank_plait.o" \
        "${objs[@]}" -ljansson -lhwloc -lm -o "$d/spank_plait.so" || return 1
    sed "s#^PlugStackConfig=.*#PlugStackConfig=$d/plugstack.conf#" "$SLURM_CONF" >"$d/slurm.conf"
    echo "required $d/spank_plait.so" >"$d/plugstack.conf"
    expect_error "$WORK/t_release.log" any \
        "spank_plait.so was built against Slurm 21.08, but this is Slurm [0-9]+\.[0-9]+: .*rebuild it against this Slurm" \
        env SLURM_CONF="$d/slurm.conf" sbatch --wrap true
}

check the_cluster_lives_in_the_tests_sandbox test_the_cluster_lives_in_the_tests_sandbox
check sbatch_knows_train_plan_and_refuses_bad_plans test_sbatch_knows_train_plan_and_refuses_bad_plans
check a_plugin_built_for_another_slurm_release_refuses_to_run \
    test_a_plugin_built_for_another_slurm_release_refuses_to_run
check policy_limits_and_quota_are_enforced_at_submit test_policy_limits_and_quota_are_enforced_at_submit
check policy_holds_on_the_compute_side_when_the_client_skips_the_plugin test_policy_holds_on_the_compute_side_when_the_client_skips_the_plugin
check rank_count_beyond_plait_is_refused_at_submit_and_start test_rank_count_beyond_plait_is_refused_at_submit_and_start
check user_plait_plan_cannot_replace_the_checked_plan test_user_plait_plan_cannot_replace_the_checked_plan
check run_dir_stays_under_run_root test_run_dir_stays_under_run_root
check nested_sbatch_refuses_its_own_bad_plan test_nested_sbatch_refuses_its_own_bad_plan
check nested_sbatch_runs_its_own_plan test_nested_sbatch_runs_its_own_plan
check nested_sbatch_without_train_plan_is_not_a_plait_job test_nested_sbatch_without_train_plan_is_not_a_plait_job
check quota_is_counted_once_per_job_not_per_task test_quota_is_counted_once_per_job_not_per_task
check error_text_is_one_escaped_line test_error_text_is_one_escaped_line
check eight_tasks_get_their_place_and_env test_eight_tasks_get_their_place_and_env
check wrong_task_count_fails_the_step test_wrong_task_count_fails_the_step
check training_runs_through_slurm test_training_runs_through_slurm
check 3d_training_runs_across_two_nodes test_3d_training_runs_across_two_nodes
check a_multi_rank_step_without_the_store_fails_clearly test_a_multi_rank_step_without_the_store_fails_clearly
check store_ports_are_the_admins_range test_store_ports_are_the_admins_range
check a_killed_rank_restarts_inside_the_allocation test_a_killed_rank_restarts_inside_the_allocation
check a_task_gone_ends_the_step_with_76 test_a_task_gone_ends_the_step_with_76
check preempted_job_checkpoints_requeues_and_resumes test_preempted_job_checkpoints_requeues_and_resumes
check preempted_3d_job_checkpoints_requeues_and_resumes test_preempted_3d_job_checkpoints_requeues_and_resumes
finish
check srun_launch_plan_trains_across_nodes_without_the_plugin \
    without_plugin test_srun_launch_plan_trains_across_nodes_without_the_plugin
check srun_launch_plan_restarts_a_killed_rank_without_the_plugin \
    without_plugin test_srun_launch_plan_restarts_a_killed_rank_without_the_plugin
check srun_launch_plan_checkpoints_on_sigterm_and_resumes_without_the_plugin \
    without_plugin test_srun_launch_plan_checkpoints_on_sigterm_and_resumes_without_the_plugin
