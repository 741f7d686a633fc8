#!/usr/bin/env bash
# plait launch in Kubernetes pods, without Kubernetes: each pod is a process
# tree in its own network, UTS (hostname), mount and PID namespace. A bridge in
# a namespace of its own joins the pods (one veth pair each; the host's network
# is not touched), and each pod resolves the headless Service's names through
# a private /etc/hosts bind-mounted in its own mount namespace, to which the
# test adds a pod's record only once that pod "has an address", as the cluster
# DNS does. The pods rendezvous at pod 0's store, train a 2-pod tp × dp layout
# to metrics identical to `plait train` of the same plan, refuse a pod without
# the job's secret, exit 76 naming a pod that never came, and, when a pod is
# killed mid-run, exit 76 and resume from the newest checkpoint when the gang is
# started again (as JobSet does). Needs root (unshare, ip netns); skipped without.
source "$(dirname "$0")/lib.sh"

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null ||
    ! command -v nsenter >/dev/null; then
    echo "ok test_k8s_pods # skip: needs root, ip, unshare and nsenter for the pods' namespaces"
    exit 0
fi

PORT=29500
NS=plait-$$ # namespaces: $NS-sw (the bridge), $NS-p<i> (the pods)
declare -A POD_PID=()
PIDS=$WORK/pod-pids # every pod started (the tests run in subshells), for the cleanup

cleanup() {
    local pid i
    if [ -f "$PIDS" ]; then
        # only a pod still running: its unshare's command line names this test's files (a
        # number alone may have been given to another process since)
        while read -r pid; do
            { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF "$WORK/hosts." &&
                kill -KILL "$pid" 2>/dev/null
        done <"$PIDS"
        sleep 0.2
    fi
    for ((i = 0; i < 3; i++)); do ip netns del "$NS-p$i" 2>/dev/null; done
    ip netns del "$NS-sw" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------
# What each pod runs and with what environment: read out of the manifests `plait k8s render`
# writes (the rendered YAML itself: the JobSet's pod template, its Secret and ConfigMap) when
# this build has that command ($PLAIT_RENDER may name another plait that has it), else written
# here from launcher/k8s/k8s_env.h. Kubernetes' part is played here: JOB_COMPLETION_INDEX, the
# downward API's restart attempt ($ATTEMPT), the Secret's key, and the volumes, whose mount
# paths become files of the test (the ConfigMap's plan.json, the run directory).
# ------------------------------------------------------------------------------------------
RENDER=${PLAIT_RENDER:-$PLAIT}
if "$RENDER" k8s render --help >/dev/null 2>&1 && "$PY" -c 'import yaml' 2>/dev/null; then
    FROM=manifest
else
    FROM=k8s_env.h
    DNS_PATTERN="train-{index}.train-ranks"
    SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
fi

# render PODS RANKS_PER_POD: the manifests of the plan on PODS pods (dp fills them), cached;
# prints the file's path. The Secret is rendered from a secret file made here (without
# --secret-file the pods read one the cluster already has).
render() {
    local yaml=$WORK/manifest-$1x$2-${GANG_TIMEOUT:-20}.yaml
    [ -s "$WORK/store-secret" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/store-secret"
    [ -s "$yaml" ] || "$RENDER" k8s render "$WORK/plan.json" --image plait:test --name train \
        --nodes "$1" --gpus-per-node "$2" --port "$PORT" --gang-timeout "${GANG_TIMEOUT:-20}" \
        --secret-file "$WORK/store-secret" \
        --set parallel.dp=$(($1 * $2 / 2)) >"$yaml" 2>"$yaml.log" || { cat "$yaml.log" >&2; return 1; }
    echo "$yaml"
}

# pod_env_from_manifest INDEX PODS RANKS_PER_POD RUN_DIR [NAME=VALUE...]: the environment of
# pod INDEX (one NAME=VALUE a line): the container image's own, then the pod's, then the
# NAME=VALUE given (what a test changes; the last of a name wins).
pod_env_from_manifest() {
    local index=$1 pods=$2 per_pod=$3 run_dir=$4 yaml
    shift 4
    printf '%s\n' PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        OMP_NUM_THREADS=1
    if [ "$FROM" = manifest ]; then
        yaml=$(render "$pods" "$per_pod") &&
            "$PY" - "$yaml" "$index" "$run_dir" "$WORK/configmap" "${ATTEMPT:-0}" <<'PYEOF' || return 1
import base64, os, sys, yaml
manifest, index, run_dir, cm_dir, attempt = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
def named(kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
def secret_value(ref):
    s = named("Secret")[ref["name"]]
    if ref["key"] in s.get("stringData", {}):
        return s["stringData"][ref["key"]]
    return base64.b64decode(s["data"][ref["key"]]).decode()
work = [d for d in docs if d["kind"] in ("JobSet", "Job")]
assert len(work) == 1, [d["kind"] for d in docs]
w = work[0]
if w["kind"] == "JobSet":
    spec = w["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
else:
    spec = w["spec"]["template"]["spec"]
c = spec["containers"][0]
assert c["command"] == ["plait", "launch"], c["command"]
volumes = {v["name"]: v for v in spec.get("volumes", [])}
mounts = [(m["mountPath"].rstrip("/"), volumes[m["name"]]) for m in c.get("volumeMounts", [])]
def local_path(name, path):
    # the run directory's volume is the test's run directory; a ConfigMap's files are
    # written here
    if name == "PLAIT_RUN_DIR":
        return run_dir
    for mount, vol in mounts:
        if "configMap" in vol and path.startswith(mount + "/"):
            os.makedirs(cm_dir, exist_ok=True)
            # atomically: a pod started before may be reading it (as a mount never changes)
            for key, text in named("ConfigMap")[vol["configMap"]["name"]]["data"].items():
                dst = os.path.join(cm_dir, key)
                if os.path.exists(dst) and open(dst).read() == text:
                    continue
                tmp = "%s.tmp%d" % (dst, os.getpid())
                open(tmp, "w").write(text)
                os.replace(tmp, dst)
            return os.path.join(cm_dir, path[len(mount) + 1:])
    return path
print("JOB_COMPLETION_INDEX=" + index)
for e in c.get("env", []):
    if "value" in e:
        v = str(e["value"])
    elif "secretKeyRef" in e["valueFrom"]:
        v = secret_value(e["valueFrom"]["secretKeyRef"])
    else:
        field = e["valueFrom"]["fieldRef"]["fieldPath"]
        assert "restart-attempt" in field or "completion-index" in field, field
        v = attempt if "restart-attempt" in field else index
    print(e["name"] + "=" + local_path(e["name"], v))
PYEOF
    else
        cat <<ENV
JOB_COMPLETION_INDEX=$index
PLAIT_K8S_PODS=$pods
PLAIT_K8S_RANKS_PER_POD=$per_pod
PLAIT_K8S_POD_DNS=$DNS_PATTERN
PLAIT_K8S_STORE_PORT=$PORT
PLAIT_K8S_GANG_TIMEOUT_S=${GANG_TIMEOUT:-20}
PLAIT_PLAN=$WORK/plan.json
PLAIT_STORE_SECRET=$SECRET
PLAIT_RUN_DIR=$run_dir
ENV
        [ -z "${ATTEMPT:-}" ] || echo "PLAIT_K8S_RESTART_ATTEMPT=$ATTEMPT"
    fi
    local kv
    for kv in "$@"; do echo "$kv"; done
}

pod_dns() { echo "${DNS_PATTERN//\{index\}/$1}"; }
pod_host() {
    local dns
    dns=$(pod_dns "$1")
    echo "${dns%%.*}"
}
pod_ip() { echo "10.77.0.$(($1 + 1))"; }

# net N: N pod namespaces, each with eth0 on a bridge in the switch namespace.
net() {
    ip netns add "$NS-sw" && ip -n "$NS-sw" link add br0 type bridge &&
        ip -n "$NS-sw" link set br0 up || return 1
    local i
    for ((i = 0; i < $1; i++)); do
        ip netns add "$NS-p$i" &&
            ip -n "$NS-sw" link add "p$i" type veth peer name eth0 netns "$NS-p$i" &&
            ip -n "$NS-sw" link set "p$i" master br0 up &&
            ip -n "$NS-p$i" addr add "$(pod_ip "$i")/24" dev eth0 &&
            ip -n "$NS-p$i" link set eth0 up && ip -n "$NS-p$i" link set lo up || return 1
    done
}

# hosts I: pod I's /etc/hosts, knowing only itself (what the kubelet writes).
hosts() {
    printf '127.0.0.1\tlocalhost\n%s\t%s %s\n' "$(pod_ip "$1")" "$(pod_dns "$1")" \
        "$(pod_host "$1")" >"$WORK/hosts.$1"
}

# publish I: pod I has an address: its record appears in every pod's hosts file.
publish() {
    local f
    for f in "$WORK"/hosts.*; do
        grep -q " $(pod_dns "$1") " "$f" || printf '%s\t%s\n' "$(pod_ip "$1")" "$(pod_dns "$1")" >>"$f"
    done
}

# start_pod INDEX LOG PODS RANKS_PER_POD RUN_DIR [NAME=VALUE...]: plait launch as pod INDEX,
# in its namespaces (its host name, its hosts file); POD_PID[INDEX] is the pod (killing
# it kills everything in the pod's PID namespace, as losing a pod does).
start_pod() {
    local index=$1 log=$2
    shift 2
    local env
    mapfile -t env < <(pod_env_from_manifest "$index" "$@")
    # the test harness's own (the sanitizers' settings), not the manifest's
    env+=(${ASAN_OPTIONS:+"ASAN_OPTIONS=$ASAN_OPTIONS"} ${UBSAN_OPTIONS:+"UBSAN_OPTIONS=$UBSAN_OPTIONS"})
    env -i "${env[@]}" nsenter --net="/run/netns/$NS-p$index" \
        unshare --mount --uts --pid --kill-child --mount-proc \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        pod "$WORK/hosts.$index" "$(pod_host "$index")" "$PLAIT" launch >"$log" 2>&1 &
    POD_PID[$index]=$!
    echo $! >>"$PIDS"
}

# stop_pods: the pods a test left running (it failed half-way) are killed and reaped.
stop_pods() {
    local i
    for i in "${!POD_PID[@]}"; do kill -KILL "${POD_PID[$i]}" 2>/dev/null; done
    for i in "${!POD_PID[@]}"; do wait "${POD_PID[$i]}" 2>/dev/null; done
    POD_PID=()
}

# pods_test NAME: runs the test function NAME, then stops what it left.
pods_test() {
    local rc=0
    "$1" || rc=$?
    stop_pods
    return "$rc"
}

# launcher_of INDEX: the host's pid of pod INDEX's plait launch (process 1 of the pod: the
# child of its unshare). children_of PID: the children of PID.
children_of() { xargs <"/proc/$1/task/$1/children"; }
launcher_of() { children_of "${POD_PID[$1]}"; }

# wait_pod INDEX: its exit code.
wait_pod() {
    local rc=0
    wait "${POD_PID[$1]}" || rc=$?
    unset "POD_PID[$1]"
    return "$rc"
}

# want_exit INDEX CODE LOG [PATTERN]
want_exit() {
    local rc=0
    wait_pod "$1" || rc=$?
    [ "$rc" -eq "$2" ] || { echo "pod $1 exited $rc, want $2"; cat "$3"; return 1; }
    [ -z "${4:-}" ] || grep -qE -- "$4" "$3" || { echo "pod $1: missing: $4"; cat "$3"; return 1; }
}

net 3 || { echo "not ok test_k8s_pods_namespaces (cannot make network namespaces)"; exit 1; }
tiny_plan "$WORK/plan.json"
"$PY" - "$WORK/plan.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
p["parallel"] = {"tp": 2, "dp": 2}
p["data"]["val"] = None
p["data"]["val_every"] = 0
json.dump(p, open(sys.argv[1], "w"))
PYEOF
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
if [ "$FROM" = manifest ]; then
    DNS_PATTERN=$(pod_env_from_manifest 0 2 2 "$WORK/x" | sed -n 's/^PLAIT_K8S_POD_DNS=//p')
    [ -n "$DNS_PATTERN" ] || { echo "not ok test_k8s_pods_render (no PLAIT_K8S_POD_DNS)"; exit 1; }
fi
echo "# each pod's command and environment: from $FROM"

# Pod 1 starts first and cannot resolve pod 0 until pod 0 has an address; an intruder with
# another secret is refused; the two pods train tp 2 × dp 2 as plait train does.
test_two_pods_rendezvous_and_train_like_plait_train() {
    local run=$WORK/pods
    hosts 0 && hosts 1 && hosts 2 && publish 1 && publish 2
    start_pod 1 "$WORK/pod1.log" 2 2 "$run"
    sleep 1
    start_pod 0 "$WORK/pod0.log" 2 2 "$run"
    publish 0
    # a pod of another job (another Secret) that claims to be pod 1
    start_pod 2 "$WORK/intruder.log" 2 2 "$run" JOB_COMPLETION_INDEX=1 \
        PLAIT_STORE_SECRET=fedcba9876543210fedcba9876543210
    want_exit 2 1 "$WORK/intruder.log" \
        "pod 1 \($(pod_dns 1)\): pod 0's store at $(pod_dns 0):$PORT refused this pod: its PLAIT_STORE_SECRET is not the job's" ||
        return 1
    want_exit 0 0 "$WORK/pod0.log" && want_exit 1 0 "$WORK/pod1.log" || return 1
    grep -q "the gang of 2 pods is complete" "$WORK/pod1.log" || { cat "$WORK/pod1.log"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

# The examples' placeholder Secret (all zeros) is no job's secret: the pod
# refuses it before it hosts or joins anything, naming the variable.
test_a_placeholder_secret_is_refused() {
    hosts 0 && publish 0
    start_pod 0 "$WORK/zeros.log" 2 2 "$WORK/zeros" \
        PLAIT_STORE_SECRET=0000000000000000000000000000000000000000000000000000000000000000
    want_exit 0 1 "$WORK/zeros.log" \
        "pod 0 \($(pod_dns 0)\): PLAIT_STORE_SECRET is not a job's secret: it has fewer than 8 distinct characters"
}

# Three pods of 2 ranks, pod 1 never comes: pods 0 and 2 exit 76 at the deadline naming it; and with pod
# 0 (the store) missing, the others exit 76 naming pod 0.
test_missing_pod_makes_every_other_exit_76_naming_it() {
    local run=$WORK/missing
    hosts 0 && hosts 1 && hosts 2 && publish 0 && publish 2
    GANG_TIMEOUT=3 start_pod 0 "$WORK/miss0.log" 3 2 "$run"
    GANG_TIMEOUT=3 start_pod 2 "$WORK/miss2.log" 3 2 "$run"
    local t0=$SECONDS
    want_exit 0 76 "$WORK/miss0.log" "pod 1 \($(pod_dns 1)\) never arrived" &&
        want_exit 2 76 "$WORK/miss2.log" "pod 1 \($(pod_dns 1)\) never arrived" || return 1
    [ $((SECONDS - t0)) -ge 2 ] || { echo "exited before the deadline"; return 1; }
    # pod 0 held back: nothing resolves it, nothing answers
    hosts 1 && hosts 2 && publish 1 && publish 2
    GANG_TIMEOUT=3 start_pod 1 "$WORK/miss1.log" 3 2 "$run"
    GANG_TIMEOUT=3 start_pod 2 "$WORK/miss2b.log" 3 2 "$run"
    want_exit 1 76 "$WORK/miss1.log" "pod 0 \($(pod_dns 0)\), which hosts the store, never answered" &&
        want_exit 2 76 "$WORK/miss2b.log" "pod 0 \($(pod_dns 0)\), which hosts the store, never answered"
}

# Pod 1 is killed mid-run (after the step-4 checkpoint): pod 0 exits 76; the gang started
# again (restart attempt 1) resumes from the newest checkpoint and ends like plait train.
test_killed_pod_ends_the_gang_and_a_restart_resumes() {
    local run=$WORK/killed
    hosts 0 && hosts 1 && publish 0 && publish 1
    # rank 0 reads each micro-batch 60 ms slower, so the run is still going at the kill
    start_pod 0 "$WORK/kill0.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    start_pod 1 "$WORK/kill1.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    local i
    for i in $(seq 300); do
        compgen -G "$run/checkpoints/step_00000004*" >/dev/null && break
        sleep 0.05
    done
    compgen -G "$run/checkpoints/step_00000004*" >/dev/null || { echo "no step-4 checkpoint"; cat "$WORK/kill0.log"; return 1; }
    kill -KILL "${POD_PID[1]}"
    wait_pod 1
    want_exit 0 76 "$WORK/kill0.log" "exit 76 \(restart the gang\)" || return 1
    ! compgen -G "$run/checkpoints/step_00000012*" >/dev/null || { echo "the run had ended before the kill"; return 1; }
    ATTEMPT=1 start_pod 0 "$WORK/again0.log" 2 2 "$run"
    ATTEMPT=1 start_pod 1 "$WORK/again1.log" 2 2 "$run"
    want_exit 0 0 "$WORK/again0.log" && want_exit 1 0 "$WORK/again1.log" || return 1
    grep -q "resuming from .*step_0000000[48]" "$WORK/again0.log" || { cat "$WORK/again0.log"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

# Kubernetes preempts the gang (SIGTERM to every pod's launcher, process 1 of its PID
# namespace): each passes it on, its ranks write a checkpoint, every pod exits 75; the gang
# started again resumes to the bit.
test_sigterm_reaches_every_rank_and_a_restart_resumes() {
    local run=$WORK/preempted i
    hosts 0 && hosts 1 && publish 0 && publish 1
    start_pod 0 "$WORK/term0.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    start_pod 1 "$WORK/term1.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    for i in $(seq 300); do
        grep -q "^step *[3-9]" "$WORK/term0.log" 2>/dev/null && break
        sleep 0.05
    done
    for i in 0 1; do kill -TERM "$(launcher_of $i)"; done
    want_exit 0 75 "$WORK/term0.log" && want_exit 1 75 "$WORK/term1.log" || return 1
    compgen -G "$run/checkpoints/step_*" >/dev/null || { echo "no checkpoint"; return 1; }
    # the restart attempt as a pod spec may map it: straight into PLAIT_RESTART_COUNT
    start_pod 0 "$WORK/resume0.log" 2 2 "$run" PLAIT_RESTART_COUNT=1
    start_pod 1 "$WORK/resume1.log" 2 2 "$run" PLAIT_RESTART_COUNT=1
    want_exit 0 0 "$WORK/resume0.log" && want_exit 1 0 "$WORK/resume1.log" || return 1
    grep -q "resuming from" "$WORK/resume0.log" || { cat "$WORK/resume0.log"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

# A plan whose layout is not pods × ranks-per-pod is refused by every pod (exit 1, which the
# pod failure policy takes for "do not retry"), naming both; so is a broken pod environment.
test_layout_that_does_not_fit_the_pods_is_refused_by_every_pod() {
    local run=$WORK/refused
    hosts 0 && hosts 1 && publish 0 && publish 1
    start_pod 0 "$WORK/refused0.log" 2 2 "$run" PLAIT_K8S_RANKS_PER_POD=1
    start_pod 1 "$WORK/refused1.log" 2 2 "$run" PLAIT_K8S_RANKS_PER_POD=1
    want_exit 0 1 "$WORK/refused0.log" \
        "pod 0 \($(pod_dns 0)\): .*tp 2 .* on 2 pods × 1 ranks \(PLAIT_K8S_PODS, PLAIT_K8S_RANKS_PER_POD\)" &&
        want_exit 1 1 "$WORK/refused1.log" "pod 1 \($(pod_dns 1)\): .*tp 2" || return 1
    local env
    mapfile -t env < <(pod_env_from_manifest 1 2 2 "$run" PLAIT_K8S_POD_DNS=train-1.train)
    expect_error "$WORK/bad-env.log" 1 "PLAIT_K8S_POD_DNS=train-1.train must be the pods' DNS name with \{index\}" \
        env -i "${env[@]}" "$PLAIT" launch &&
        mapfile -t env < <(pod_env_from_manifest 2 2 2 "$run" JOB_COMPLETION_INDEX=2) &&
        expect_error "$WORK/bad-index.log" 1 "JOB_COMPLETION_INDEX=2 is not a number from 0 to 1" \
            env -i "${env[@]}" "$PLAIT" launch
}

# One rank of pod 1 dies (the OOM killer, say): pod 1 tells the gang through the store, stops
# its other rank and exits 76 naming it; pod 0 stops its ranks and exits 76 too.
test_a_dead_rank_ends_every_pod_with_76() {
    local run=$WORK/rank-died launcher rank i
    hosts 0 && hosts 1 && publish 0 && publish 1
    start_pod 0 "$WORK/died0.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    start_pod 1 "$WORK/died1.log" 2 2 "$run" PLAIT_DEBUG_SLOW_RANK=0:60
    for i in $(seq 300); do
        grep -q "^step *[2-9]" "$WORK/died0.log" 2>/dev/null && break
        sleep 0.05
    done
    # pod 1's launcher (process 1 of the pod), then its first rank (global rank 2)
    launcher=$(launcher_of 1)
    rank=$(children_of "$launcher" | awk '{print $1}')
    [ -n "$rank" ] || { echo "no rank in pod 1"; return 1; }
    kill -KILL "$rank"
    want_exit 1 76 "$WORK/died1.log" \
        "pod 1 \($(pod_dns 1)\): rank 2 failed; exit 76 \(restart the gang\)" &&
        want_exit 0 76 "$WORK/died0.log" "pod 0 \($(pod_dns 0)\): .*exit 76 \(restart the gang\)" || return 1
    grep -q "rank 2 (pid [0-9]*) was killed by signal 9" "$WORK/died1.log" || { cat "$WORK/died1.log"; return 1; }
}

check test_two_pods_rendezvous_and_train_like_plait_train pods_test test_two_pods_rendezvous_and_train_like_plait_train
check test_a_placeholder_secret_is_refused pods_test test_a_placeholder_secret_is_refused
check test_missing_pod_makes_every_other_exit_76_naming_it pods_test test_missing_pod_makes_every_other_exit_76_naming_it
check test_killed_pod_ends_the_gang_and_a_restart_resumes pods_test test_killed_pod_ends_the_gang_and_a_restart_resumes
check test_a_dead_rank_ends_every_pod_with_76 pods_test test_a_dead_rank_ends_every_pod_with_76
check test_sigterm_reaches_every_rank_and_a_restart_resumes pods_test test_sigterm_reaches_every_rank_and_a_restart_resumes
check test_layout_that_does_not_fit_the_pods_is_refused_by_every_pod pods_test test_layout_that_does_not_fit_the_pods_is_refused_by_every_pod
finish
