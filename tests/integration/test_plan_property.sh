#!/usr/bin/env bash
# Three deciders, one verdict (issue 18: plans accepted at submit died at
# start). A few hundred random plans (tests/integration/plan_gen.py: valid and
# broken, every field, every layout up to 8 ranks, every pipeline schedule, ZeRO
# 0-3, fp32/bf16/fp8, device auto/cpu/cuda) go through
#   plait check PLAN --gpus-per-node N        (the CLI, on this machine)
#   submit_check [POLICY] PLAN                (spank_plait's submit-time check,
#                                              tests/spank/submit_check.c)
#   plait train PLAN --out DIR --ranks N      (plait-train's start, one step)
# and must agree: all accept, or all refuse naming the same field with the same
# reason. Where they may differ (the plugin has no nodes yet, or has the
# cluster's policy), plan_gen.py writes what each must say and why.
# Every refused plan is trained (a refusal stops in milliseconds); of the
# accepted, one in PLAIT_PROPERTY_TRAIN_EVERY (default 1: all of them).
# PLAIT_PROPERTY_SEED (default 18) and PLAIT_PROPERTY_COUNT (default 300) choose the plans.
# asan: skip (plait-train under ASan is slower tenfold than this test's budget allows;
# the plan loader's sanitized runs are test_plan's, test_bad_input's and make fuzz's)
source "$(dirname "$0")/lib.sh"
shopt -s extglob # (verdict's patterns)

SEED=${PLAIT_PROPERTY_SEED:-18}
COUNT=${PLAIT_PROPERTY_COUNT:-300}
TRAIN_EVERY=${PLAIT_PROPERTY_TRAIN_EVERY:-1}
SUBMIT=$BUILD/tests/spank/submit_check
if [ ! -x "$SUBMIT" ]; then
    echo "ok plan_property # SKIP no $SUBMIT (built where Slurm's headers are: libslurm-dev)"
    exit 0
fi
echo "# seed $SEED, $COUNT plans (PLAIT_PROPERTY_SEED, PLAIT_PROPERTY_COUNT change them)"

# verdict DECIDER LOG RC PLAN: "accept", or "refuse: <field: reason>" from the first
# error line, without what differs by decider alone: its program's prefix and where
# the plan came from (the file and line, or the variable plait-train reads it from)
verdict() {
    local rc=$3 plan=$4 line
    if [ "$rc" = 0 ]; then
        echo accept
        return
    fi
    line=$(grep -m1 -E '(^|: )error: ' "$2") || line="(no error line; exit code $rc) $(tail -n 1 "$2")"
    line=${line#*error: }
    line=${line#spank_plait: }
    line=${line#"$plan": }
    line=${line#"$plan":*([0-9]): }
    line=${line#PLAIT_PLAN_JSON: }
    line=${line#check: }
    line=${line#train: }
    line=${line% (see the candidates above)} # plait check's pointer to what it printed
    echo "refuse: $line"
}

# agree NAME EXPECT: the three verdicts of case NAME (in $WORK/v/NAME.*) are the same,
# but where EXPECT (plan_gen.py's) says why one may differ
agree() {
    local name=$1 expect=$2 check plugin train want_plugin rule machine="" policy=""
    check=$(cat "$WORK/v/$name.check")
    plugin=$(cat "$WORK/v/$name.plugin")
    train=$(cat "$WORK/v/$name.train" 2>/dev/null || echo "$check") # (not trained: as check)
    echo "plait check: $check"
    echo "plugin:      $plugin"
    echo "plait train: $train"
    local IFS=';'
    for rule in $expect; do
        case $rule in
        machine:*) machine+="${machine:+|}${rule#machine:}" ;;
        policy:*) policy=${rule#policy:} ;;
        esac
    done
    if [ -n "$machine" ] && [[ $check =~ ^refuse:\ ($machine) ]]; then
        # this machine cannot run it: plait train refuses too; the plugin has no nodes yet
        [[ $train =~ ^refuse:\ ($machine) ]] || { echo "plait train should refuse: $machine"; return 1; }
        want_plugin=accept
    else
        [ "$train" = "$check" ] || { echo "plait check and plait train differ"; return 1; }
        want_plugin=$check
    fi
    if [ -n "$policy" ] && [ "$want_plugin" = accept ]; then
        [[ $plugin =~ ^refuse:\ ($policy) ]] || { echo "the plugin's policy should refuse: $policy"; return 1; }
        return 0
    fi
    [ "$plugin" = "$want_plugin" ] || { echo "the plugin should say: $want_plugin"; return 1; }
}

tiny_data
gpu=()
nvidia-smi -L >/dev/null 2>&1 && gpu=(--gpu)
"$PY" "$ROOT/tests/integration/plan_gen.py" --seed "$SEED" --count "$COUNT" --dir "$WORK/plans" \
    --train "$WORK/train.bin" --val "$WORK/val.bin" "${gpu[@]}"
mkdir -p "$WORK/v"
accepted=0
while IFS=$'\t' read -r name plan ranks policy expect; do
    rc=0
    "$PLAIT" check "$plan" --gpus-per-node "$ranks" >"$WORK/check.log" 2>&1 || rc=$?
    verdict check "$WORK/check.log" "$rc" "$plan" >"$WORK/v/$name.check"
    args=()
    [ "$policy" = - ] || read -r -a args <<<"$policy"
    rc=0
    "$SUBMIT" "${args[@]}" "$plan" >"$WORK/plugin.log" 2>&1 || rc=$?
    verdict plugin "$WORK/plugin.log" "$rc" "$plan" >"$WORK/v/$name.plugin"
    run_train=1
    if grep -q '^accept' "$WORK/v/$name.check"; then
        accepted=$((accepted + 1))
        [ $((accepted % TRAIN_EVERY)) = 0 ] || run_train=0
    fi
    if [ "$run_train" = 1 ]; then
        rc=0
        "$PLAIT" train "$plan" --out "$WORK/runs/$name" --ranks "$ranks" --quiet \
            >"$WORK/train.log" 2>&1 || rc=$?
        verdict train "$WORK/train.log" "$rc" "$plan" >"$WORK/v/$name.train"
        rm -rf "$WORK/runs/$name"
    fi
    [ "$expect" = - ] && expect=""
    check "$name" agree "$name" "$expect"
done <"$WORK/plans/cases.tsv"
echo "# $accepted of $COUNT plans accepted by plait check"
finish
