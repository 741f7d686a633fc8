#!/usr/bin/env bash
# plait k8s render / admin / lint and plait check --k8s-nodes, without an API
# server: every case directory tests/k8s/<case>/ holding `args` is run as
#   plait k8s $(cat args)
# and must print exactly expected.yaml (the store secret referenced, or read
# from tests/k8s/store-secret.txt; the ConfigMap's resolved plan is compared on
# its own, so that a new plan field does not change every golden), pass plait
# k8s lint, and pass the real
# Kubernetes 1.36 and CRD schemas (tests/k8s/validate, vendored from
# ../shared/tools/k8s-validate: npm install into build/k8s-validate once, then
# reused). When npm cannot reach its registry the schema checks say "skip",
# never "ok". Refusals name the field; the lint catches what the schemas pass.
# update the goldens with: PLAIT_UPDATE_GOLDEN=1 bash tests/integration/test_k8s.sh
# asan: skip (the sanitized plait runs a render, an admin, a lint and a node check below)
source "$(dirname "$0")/lib.sh"

update=${PLAIT_UPDATE_GOLDEN:-0}
VALIDATE=$ROOT/build/k8s-validate
PLAN=tests/k8s/plans/tp8_pp2_bf16.json
RENDER=(k8s render "$PLAN" --image registry.example.com/ml/plait:0.9 --nodes 2 --gpus-per-node 8
    --gpu-product NVIDIA-H100-80GB-HBM3 --name gpt-1b)

# The validator in the cache dir, set up once (again when the vendored copy changes).
# Prints why it is not usable, and fails, when it is not.
setup_validator() {
    local src=$ROOT/tests/k8s/validate stamp
    stamp=$(cd "$src" && cat k8s-validate.mjs package.json package-lock.json setup.sh crds/* | sha256sum)
    if [ -f "$VALIDATE/.ready" ] && [ "$(cat "$VALIDATE/.ready")" = "$stamp" ]; then return 0; fi
    rm -rf "$VALIDATE" && mkdir -p "$VALIDATE" && cp -r "$src/." "$VALIDATE/" && chmod -R u+w "$VALIDATE"
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "node/npm are not installed (scripts/deps.sh test installs them)"; return 1
    fi
    # without a registry, fail within seconds rather than npm's minutes of retries
    if ! (cd "$VALIDATE" && npm_config_fetch_retries=1 npm_config_fetch_retry_mintimeout=2000 \
        npm_config_fetch_retry_maxtimeout=5000 timeout 180 ./setup.sh) >"$WORK/setup.log" 2>&1; then
        echo "npm install could not set up the validator in $VALIDATE (no registry?) $(tail -n 3 "$WORK/setup.log" | tr '\n' ' ')"
        return 1
    fi
    echo "$stamp" >"$VALIDATE/.ready"
}

# mask_plan FILE: the manifests with the body of the ConfigMap's plan.json
# (every field of the plan, defaults filled in) left out
mask_plan() {
    awk '/^  plan.json: \|$/ { print; print "    (the resolved plan)"; skip = 1; next }
         skip && /^    / { next } { skip = 0; print }' "$1"
}

mkdir -p "$WORK/out"
run_case() { # case directory
    local case=$1 args out
    args=$(cat "$case/args")
    out=$WORK/out/${case#tests/k8s/}.yaml
    # shellcheck disable=SC2086
    "$PLAIT" k8s $args >"$out" 2>"$WORK/err.txt" || { echo "exit code $?"; cat "$WORK/err.txt"; return 1; }
    if [ "$update" = 1 ]; then cp "$out" "$case/expected.yaml"; fi
    diff -u <(mask_plan "$case/expected.yaml") <(mask_plan "$out") || return 1
    "$PLAIT" k8s lint "$out" || return 1
    case $args in render*)
        grep -q "terminationGracePeriodSeconds [0-9]* s = one micro-batch" "$WORK/err.txt" || { cat "$WORK/err.txt"; return 1; } ;;
    esac
}

cases=()
for a in tests/k8s/*/args; do cases+=("$(dirname "$a")"); done
for case in "${cases[@]}"; do
    check "golden_${case#tests/k8s/}" run_case "$case"
done

# What the pods get is what plait launch reads (launcher/k8s/k8s_env.h), in every
# golden workload: the env names, the plan mount, the secret, and the gang's
# invariants (one rank per GPU, requests = limits, 75 ignored, 1 and 2 fatal).
test_pods_get_the_launch_contract() {
    "$PY" - "$ROOT/launcher/k8s/k8s_env.h" "$WORK"/out/*.yaml <<'PYEOF'
import re, sys, yaml
header = open(sys.argv[1]).read()
names = dict(re.findall(r'#define (K8S_\w+) "([^"]+)"', header))
# every pod's contract; the restart attempt only where JobSet counts them (a pod label)
want = {v for k, v in names.items() if k.startswith("K8S_ENV_")
        and k not in ("K8S_ENV_COMPLETION_INDEX", "K8S_ENV_RESTART_ATTEMPT")}
want |= {"PLAIT_PLAN", "PLAIT_RUN_DIR", "PLAIT_STORE_SECRET"}
seen = 0
for case in sys.argv[2:]:
    docs = [d for d in yaml.safe_load_all(open(case)) if d]
    by_kind = {d["kind"]: d for d in docs}
    for d in docs:
        vcjob = d["apiVersion"].startswith("batch.volcano.sh/")
        if d["kind"] == "JobSet":
            job = d["spec"]["replicatedJobs"][0]["template"]["spec"]
            assert d["spec"]["replicatedJobs"][0]["replicas"] == 1
            assert d["spec"]["failurePolicy"]["maxRestarts"] >= 0
        elif vcjob:
            task = d["spec"]["tasks"][0]
            job = {"completions": task["replicas"], "template": task["template"]}
            assert d["spec"]["minAvailable"] == task["replicas"] and len(d["spec"]["tasks"]) == 1
        elif d["kind"] == "Job":
            job = d["spec"]
        else:
            continue
        seen += 1
        pods = job["completions"]
        if not vcjob:
            assert job["parallelism"] == pods and job["completionMode"] == "Indexed", case
            rules = job["podFailurePolicy"]["rules"]
            assert rules[0] == {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]}}, rules
            assert rules[1]["action"] == "FailJob" and rules[1]["onExitCodes"]["values"] == [1, 2], rules
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] > 30
        c = pod["containers"][0]
        assert c["command"] == ["plait", "launch"], c["command"]
        env = {e["name"]: e for e in c["env"]}
        assert want <= set(env), (case, want - set(env))
        if d["kind"] == "JobSet":
            attempt = env[names["K8S_ENV_RESTART_ATTEMPT"]]["valueFrom"]["fieldRef"]["fieldPath"]
            assert attempt == "metadata.labels['jobset.sigs.k8s.io/restart-attempt']", attempt
        assert env[names["K8S_ENV_PODS"]]["value"] == str(pods)
        if vcjob:  # the index from the pod label Volcano's controller sets
            assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['volcano.sh/task-index']"
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        # never BestEffort: CPUs and memory requested, memory limited; GPUs requests = limits
        assert req["nvidia.com/gpu"] == gpus and req["cpu"] > 0 and req["memory"] == lim["memory"], c["resources"]
        assert env[names["K8S_ENV_RANKS_PER_POD"]]["value"] == str(gpus)
        assert env["PLAIT_PLAN"]["value"] == names["K8S_PLAN_PATH"]
        assert "{index}" in env[names["K8S_ENV_POD_DNS"]]["value"]
        ref = env["PLAIT_STORE_SECRET"]["valueFrom"]["secretKeyRef"]
        if "Secret" in by_kind:  # rendered only with --secret-file; else the cluster's
            assert by_kind["Secret"]["metadata"]["name"] == ref["name"] and ref["key"] in by_kind["Secret"]["stringData"]
        else:
            assert ref == {"name": d["metadata"]["name"] + "-store", "key": "secret"}, ref
        plan_dir = names["K8S_PLAN_PATH"].rsplit("/", 1)[0]
        mount = [m for m in c["volumeMounts"] if m["mountPath"] == plan_dir][0]
        vol = [v for v in pod["volumes"] if v["name"] == mount["name"]][0]
        cm = by_kind["ConfigMap"]
        assert vol["configMap"]["name"] == cm["metadata"]["name"] and "plan.json" in cm["data"]
        shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert shm and any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])
        for pg in (d for d in docs if d["kind"] == "PodGroup"):
            assert pg["spec"]["minMember"] == pods
print(seen, "workloads keep the contract")
PYEOF
}
check pods_get_the_launch_contract test_pods_get_the_launch_contract

# the ConfigMap holds the plan the pods train: the source plan, "auto" decided,
# and today's parser reads it back to the same layout
test_configmap_holds_the_resolved_plan() {
    "$PY" - "$WORK/out/jobset.yaml" "$PLAN" "$WORK/resolved.json" <<'PYEOF' || return 1
import json, sys, yaml
cm = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"][0]
plan, src = json.loads(cm["data"]["plan.json"]), json.load(open(sys.argv[2]))
assert {k: plan["parallel"][k] for k in ("tp", "pp", "dp")} == {"tp": 8, "pp": 2, "dp": 1}, plan["parallel"]
for k, v in src["model"].items():
    assert plan["model"][k] == v, (k, plan["model"][k], v)
assert plan["batch"] == {**plan["batch"], **src["batch"]} and plan["precision"] == "bf16"
open(sys.argv[3], "w").write(cm["data"]["plan.json"])
PYEOF
    "$PLAIT" check "$WORK/resolved.json" --k8s-nodes tests/k8s/nodes/cluster.json --json >"$WORK/r.json" &&
        grep -q '"tp": 8' "$WORK/r.json"
}
check configmap_holds_the_resolved_plan test_configmap_holds_the_resolved_plan

# k8s/examples/ are what plait writes today, and pass the lint (the schemas below)
test_k8s_examples_are_current() {
    mkdir -p "$WORK/examples" && k8s/examples/regenerate.sh "$PLAIT" "$WORK/examples" &&
        "$PLAIT" k8s lint k8s/examples/*.yaml || return 1
    local f
    for f in k8s/examples/*.yaml; do
        diff -u <(mask_plan "$f") <(mask_plan "$WORK/examples/${f##*/}") || return 1
    done
    [ "$(ls "$WORK/examples" | wc -l)" -eq "$(ls k8s/examples/*.yaml | wc -l)" ]
}
check k8s_examples_are_current test_k8s_examples_are_current

# k8s/ADMIN.md's LimitRange (what makes a Kueue workload inadmissible when it
# does not fit) is valid, and the pods render writes fit it: within max, and
# memory limit / request within maxLimitRequestRatio
limit_range_of_admin_guide() {
    awk '/^```yaml$/ { on = 1; buf = ""; next } on && /^```$/ { if (buf ~ /kind: LimitRange/) printf "%s", buf; on = 0; next }
         on { buf = buf $0 "\n" }' k8s/ADMIN.md >"$WORK/limitrange.yaml"
    grep -q "kind: LimitRange" "$WORK/limitrange.yaml"
}
test_admin_guide_limit_range_admits_the_rendered_pods() {
    limit_range_of_admin_guide || return 1
    "$PY" - "$WORK/limitrange.yaml" "$WORK/out/jobset.yaml" "$WORK/out/pod_options.yaml" <<'PYEOF'
import sys, yaml
def qty(v):
    v = str(v)
    return float(v[:-2]) * 2**30 if v.endswith("Gi") else float(v)
lim = yaml.safe_load(open(sys.argv[1]))["spec"]["limits"][0]
for case in sys.argv[2:]:
    js = [d for d in yaml.safe_load_all(open(case)) if d and d["kind"] == "JobSet"][0]
    r = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    for name, cap in lim["max"].items():
        assert qty(r["limits"].get(name, r["requests"][name])) <= qty(cap), (case, name)
    for name, ratio in lim["maxLimitRequestRatio"].items():
        assert qty(r["limits"][name]) / qty(r["requests"][name]) <= qty(ratio), (case, name)
PYEOF
}
check admin_guide_limit_range_admits_the_rendered_pods test_admin_guide_limit_range_admits_the_rendered_pods

# ---- the real schemas ------------------------------------------------------------------
if why=$(setup_validator); then
    test_goldens_pass_the_schemas() {
        local files=() c
        files=("$WORK"/out/*.yaml "$WORK"/examples/*.yaml)
        (cd "$VALIDATE" && node k8s-validate.mjs "${files[@]}") | sed -e "s|$ROOT/||g" -e "s|$WORK/||g"
        return "${PIPESTATUS[0]}"
    }
    check goldens_and_k8s_examples_pass_the_kubernetes_and_crd_schemas test_goldens_pass_the_schemas
    # the lint's fixture is valid to the schemas: what it refuses, only the lint sees
    test_lint_fixture_passes_the_schemas() {
        (cd "$VALIDATE" && node k8s-validate.mjs "$ROOT/tests/k8s/lint/bad.yaml")
    }
    check lint_fixture_passes_the_schemas test_lint_fixture_passes_the_schemas
    test_admin_guide_limit_range_passes_the_schemas() {
        limit_range_of_admin_guide && (cd "$VALIDATE" && node k8s-validate.mjs "$WORK/limitrange.yaml")
    }
    check admin_guide_limit_range_passes_the_schemas test_admin_guide_limit_range_passes_the_schemas
    test_schemas_refuse_an_unknown_field() { # the validator is not a rubber stamp
        sed 's/^  completionMode: Indexed/  completionMode: Indexed\n  bogusField: 1/' \
            "$WORK/out/volcano.yaml" >"$WORK/bogus.yaml"
        ! (cd "$VALIDATE" && node k8s-validate.mjs "$WORK/bogus.yaml") >"$WORK/v.txt" || { cat "$WORK/v.txt"; return 1; }
        grep -q bogusField "$WORK/v.txt" || { cat "$WORK/v.txt"; return 1; }
    }
    check schemas_refuse_an_unknown_field test_schemas_refuse_an_unknown_field
else
    echo "skip goldens_and_k8s_examples_pass_the_kubernetes_and_crd_schemas: $why"
    echo "skip lint_fixture_passes_the_schemas: $why"
    echo "skip admin_guide_limit_range_passes_the_schemas: $why"
    echo "skip schemas_refuse_an_unknown_field: $why"
fi

# ---- the lint ---------------------------------------------------------------------------
test_lint_finds_what_the_schemas_cannot_see() {
    expect_error "$WORK/l.txt" 1 . "$PLAIT" k8s lint tests/k8s/lint/bad.yaml || return 1
    local want
    for want in 'spec.hard: "nvidia.com/gpu": a quota on an extended resource must be written requests' \
        'spec.hard: "limits.nvidia.com/gpu"' \
        'PodGroup/train\): spec.minMember: 1, but the workload in document 3 runs 2 pods' \
        'spec.minResources.nvidia.com/gpu: 8, but its 2 pods ask for 16 GPUs' \
        'metadata.name: "Train_1" may hold only lower-case letters' \
        'metadata.labels: team: value "a b"' \
        'nvidia.com/gpu: requests 4 but limits 8' \
        'spec.parallelism: 1, but completions is 2' \
        'subdomain: "train": no headless Service'; do
        grep -qE -- "$want" "$WORK/l.txt" || { echo "missing: $want"; cat "$WORK/l.txt"; return 1; }
    done
    [ "$(grep -c '^plait: lint: ' "$WORK/l.txt")" -eq 9 ] || { cat "$WORK/l.txt"; return 1; }
}
check lint_finds_what_the_schemas_cannot_see test_lint_finds_what_the_schemas_cannot_see

# aliases that loop back on themselves, or multiply a small file a billion times
test_lint_survives_hostile_aliases() {
    printf 'kind: Pod\napiVersion: v1\nmetadata: {name: a}\na: &x [*x]\n' >"$WORK/loop.yaml"
    "$PY" - >"$WORK/bomb.yaml" <<'PYEOF'
print("kind: Pod\napiVersion: v1\nmetadata: {name: a}\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]")
for i in range(1, 10):
    print(f"l{i}: &l{i} [" + ", ".join([f"*l{i-1}"] * 10) + "]")
PYEOF
    local f
    for f in loop bomb; do
        expect_error "$WORK/$f.txt" 1 "nested deeper than 64 levels or more than 1000000 nodes" \
            timeout 20 "$PLAIT" k8s lint "$WORK/$f.yaml" || return 1
    done
}
check lint_survives_hostile_aliases test_lint_survives_hostile_aliases

# ---- refusals, each naming what is wrong ------------------------------------------------
# (micro-batches of 48: 50 GB a rank, more than an A100's 40 GiB, 42.95 GB)
test_refuses_a_plan_that_does_not_fit_the_gpus() {
    expect_error "$WORK/e.txt" 1 "a rank of pipeline stage 0 needs [0-9.]+ GB, the GPU has 42.95 GB.*batch.micro_batch" \
        "$PLAIT" "${RENDER[@]}" --gpu-product NVIDIA-A100-SXM4-40GB --set batch.micro_batch=48 || return 1
    ! grep -q "^apiVersion" "$WORK/e.txt"
}
check refuses_a_plan_that_does_not_fit_the_gpus test_refuses_a_plan_that_does_not_fit_the_gpus

test_refuses_tp_wider_than_a_node() {
    expect_error "$WORK/e.txt" 1 "parallel.tp = 16 exceeds the 8 ranks of the largest node" \
        "$PLAIT" "${RENDER[@]}" --set parallel.tp=16 --set parallel.pp=1
}
check refuses_tp_wider_than_gpus_per_node test_refuses_tp_wider_than_a_node

test_refuses_tp_over_pcie_unless_allowed() {
    local pcie=(--topology tests/topo/pcie4_nvbridge/topology.xml --gpus-per-node 4 --set parallel.tp=4 --set parallel.pp=1)
    expect_error "$WORK/e.txt" 1 "parallel.tp = 4 does not fit in one NVLink domain.*parallel.allow_tp_over_pcie" \
        "$PLAIT" "${RENDER[@]}" "${pcie[@]}" || return 1
    "$PLAIT" "${RENDER[@]}" "${pcie[@]}" --set parallel.allow_tp_over_pcie=true >"$WORK/ok.yaml" 2>"$WORK/e.txt" ||
        { cat "$WORK/e.txt"; return 1; }
    grep -q '"allow_tp_over_pcie": true' "$WORK/ok.yaml"
}
check refuses_tp_over_pcie_unless_allowed test_refuses_tp_over_pcie_unless_allowed

test_refuses_bad_names() {
    expect_error "$WORK/e.txt" 2 '--name "Gpt_1b" may hold only lower-case letters, digits and' \
        "$PLAIT" "${RENDER[@]}" --name Gpt_1b || return 1
    expect_error "$WORK/e.txt" 2 '--namespace "ML" may hold only lower-case' \
        "$PLAIT" "${RENDER[@]}" --namespace ML || return 1
    # a legal name whose pods' host names (NAME-workers-0-1) would pass 63 characters
    local long=gpt-1b-with-a-name-long-enough-to-break-host-names-x
    expect_error "$WORK/e.txt" 1 "host name \"$long-workers-0-1\" is longer than 63" \
        "$PLAIT" "${RENDER[@]}" --name $long || return 1
    grep -q "the lint found 1 problem in the manifests above; nothing printed" "$WORK/e.txt" &&
        ! grep -q "^apiVersion" "$WORK/e.txt"
}
check refuses_bad_names test_refuses_bad_names

test_refuses_ranks_that_do_not_fill_the_pods() {
    expect_error "$WORK/e.txt" 1 "tp 8 × pp 2 × dp 1 is 16 ranks, but 4 pods × 8 GPUs are 32.*parallel.dp" \
        "$PLAIT" "${RENDER[@]}" --nodes 4 --set parallel.dp=1
}
check refuses_ranks_that_do_not_fill_the_pods test_refuses_ranks_that_do_not_fill_the_pods

# The store secret is the cluster's: the manifests name an existing Secret
# (NAME-store, or --secret) and hold no secret, so two renders are the same
# text and nothing secret reaches a GitOps repository.
test_store_secret_is_referenced_not_rendered() {
    "$PLAIT" "${RENDER[@]}" >"$WORK/s1.yaml" 2>"$WORK/s.txt" && "$PLAIT" "${RENDER[@]}" >"$WORK/s2.yaml" 2>>"$WORK/s.txt" ||
        { cat "$WORK/s.txt"; return 1; }
    cmp -s "$WORK/s1.yaml" "$WORK/s2.yaml" && ! grep -qE '^kind: Secret|stringData' "$WORK/s1.yaml" &&
        grep -q "create secret generic gpt-1b-store --from-literal=secret=" "$WORK/s.txt" || { cat "$WORK/s.txt"; return 1; }
    "$PLAIT" "${RENDER[@]}" --secret team-store >"$WORK/s3.yaml" 2>/dev/null &&
        grep -A3 'secretKeyRef:' "$WORK/s3.yaml" | grep -q 'name: team-store'
}
check store_secret_is_referenced_not_rendered test_store_secret_is_referenced_not_rendered

# --secret-file renders the Secret, the same for the same file; a secret that
# could not be a job's (the pods' own check, store_secret_problem) is refused
test_secret_file_renders_a_stable_secret() {
    "$PLAIT" "${RENDER[@]}" --secret-file tests/k8s/store-secret.txt >"$WORK/f1.yaml" 2>/dev/null &&
        "$PLAIT" "${RENDER[@]}" --secret-file tests/k8s/store-secret.txt >"$WORK/f2.yaml" 2>/dev/null || return 1
    cmp -s "$WORK/f1.yaml" "$WORK/f2.yaml" && grep -qF "secret: \"$(cat tests/k8s/store-secret.txt)\"" "$WORK/f1.yaml" || return 1
    printf '0000000000000000000000000000000000000000000000000000000000000000\n' >"$WORK/zeros"
    expect_error "$WORK/e.txt" 1 "--secret-file $WORK/zeros: not a job's store secret: it has fewer than 8 distinct characters" \
        "$PLAIT" "${RENDER[@]}" --secret-file "$WORK/zeros" || return 1
    ! grep -q "^apiVersion" "$WORK/e.txt" &&
        expect_error "$WORK/e.txt" 2 "give one of them" "$PLAIT" "${RENDER[@]}" --secret a --secret-file "$WORK/zeros"
}
check secret_file_renders_a_stable_secret_and_refuses_a_weak_one test_secret_file_renders_a_stable_secret

# Pods are never BestEffort: CPUs are the ranks' cores as placed, memory is a
# CUDA process per rank + checkpoint.async's host copy + the sampler's model +
# /dev/shm (a memory-backed volume counts against the pod's memory); memory is
# limited to it, CPUs only with --guaranteed (requests = limits: Guaranteed).
test_pods_request_cpu_and_memory_from_the_memory_model() {
    "$PY" - "$PLAIT" "${RENDER[@]}" <<'PYEOF'
import subprocess, sys, yaml
def render(*extra):
    r = subprocess.run(list(sys.argv[1:]) + list(extra), capture_output=True, text=True, check=True)
    js = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "JobSet"][0]
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return pod["spec"]["containers"][0]["resources"], pod["metadata"]["annotations"]["plait.dev/resources"], r.stderr
def gi(q):
    assert q.endswith("Gi"), q
    return int(q[:-2])
base, why, err = render()
assert base["requests"]["cpu"] == 32 and "cpu" not in base["limits"], base  # 8 ranks × 4 cores, Burstable
assert gi(base["requests"]["memory"]) == gi(base["limits"]["memory"]) == 8 * 2 + 5, (base, why)
assert "each pod requests " + why in err, err
ckpt, why, _ = render("--set", "checkpoint.async=true", "--set", "sample.tokens=16", "--shm", "9")
assert gi(ckpt["requests"]["memory"]) > gi(base["requests"]["memory"]) + 4 + 8, (ckpt, why)
assert "checkpoint.async copy" in why and "sampler's model" in why and "9 GiB /dev/shm" in why, why
g, _, _ = render("--guaranteed", "--cpus", "48", "--memory", "100")
assert g["requests"] == g["limits"] and g["requests"]["cpu"] == 48 and g["requests"]["memory"] == "94Gi", g
PYEOF
}
check pods_request_cpu_and_memory_from_the_memory_model test_pods_request_cpu_and_memory_from_the_memory_model

# Volcano's Queue is cluster-wide: plait k8s admin names it NS-QUEUE and the
# jobs rendered for that namespace (PodGroup, vcjob) ask for the same queue,
# so two teams' queues never overwrite each other.
test_volcano_queue_is_named_per_namespace() {
    local ns q
    for ns in ml vision; do
        q=$("$PLAIT" k8s admin --namespace $ns --gpus 8 --gang volcano | awk '/^kind: Queue/ { on = 1 } on && /^  name:/ { print $2; exit }')
        [ "$q" = "$ns-training" ] || { echo "admin queue $q"; return 1; }
        "$PLAIT" "${RENDER[@]}" --namespace $ns --gang volcano 2>/dev/null | grep -qx "  queue: $ns-training" || return 1
        "$PLAIT" "${RENDER[@]}" --namespace $ns --gang volcano --workload vcjob 2>/dev/null | grep -qx "  queue: $ns-training" || return 1
    done
}
check volcano_queue_is_named_per_namespace test_volcano_queue_is_named_per_namespace

# A Volcano Job carries the gang: all pods or none (minAvailable), a lost or
# evicted pod restarts the whole gang up to --max-restarts, exit 1 or 2 aborts
# it; the svc plugin's names are the pods' DNS names; no PodGroup or Service of
# ours beside it.
test_vcjob_restarts_the_whole_gang() {
    "$PY" - "$WORK/out/volcano_vcjob.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert [d["kind"] for d in docs] == ["ConfigMap", "Job"], [d["kind"] for d in docs]
spec = docs[1]["spec"]
assert docs[1]["apiVersion"] == "batch.volcano.sh/v1alpha1" and spec["minAvailable"] == 2 and spec["maxRetry"] == 3
assert spec["plugins"] == {"svc": ["--publish-not-ready-addresses"]}, spec["plugins"]
pol = {(p.get("event"), p.get("exitCode")): p["action"] for p in spec["policies"]}
assert pol == {(None, 1): "AbortJob", (None, 2): "AbortJob", ("PodEvicted", None): "RestartJob",
               ("PodFailed", None): "RestartJob"}, pol
tpl = spec["tasks"][0]["template"]
env = {e["name"]: e for e in tpl["spec"]["containers"][0]["env"]}
assert env["PLAIT_K8S_POD_DNS"]["value"] == "gpt-1b-workers-{index}.gpt-1b"
assert "scheduling.k8s.io/group-name" not in tpl["metadata"]["annotations"]  # Volcano makes the group
PYEOF
    expect_error "$WORK/e.txt" 2 "--workload vcjob is Volcano's: it needs --gang volcano" \
        "$PLAIT" "${RENDER[@]}" --workload vcjob
}
check vcjob_restarts_the_whole_gang test_vcjob_restarts_the_whole_gang

# What an admin asks of a pod: who it runs as, the registry's secret, the nodes
# it may use, and the volumes the plan's paths point into.
test_pod_options_reach_the_pod_spec() {
    "$PY" - "$WORK/out/pod_options.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
js = [d for d in docs if d["kind"] == "JobSet"][0]
pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
assert pod["imagePullSecrets"] == [{"name": "regcred"}]
assert pod["nodeSelector"]["example.com/pool"] == "training"
assert {"key": "example.com/reserved", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
assert {"key": "example.com/spot", "operator": "Exists"} in pod["tolerations"]
c = pod["containers"][0]
assert c["resources"]["requests"] == c["resources"]["limits"], c["resources"]  # --guaranteed
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
assert vols[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
assert mounts["/data"]["readOnly"] is True
assert vols[mounts["/ckpt"]["name"]]["hostPath"] == {"path": "/mnt/ckpt", "type": "Directory"}
PYEOF
    expect_error "$WORK/e.txt" 2 "--mount-pvc data must be CLAIM:/PATH" "$PLAIT" "${RENDER[@]}" --mount-pvc data || return 1
    expect_error "$WORK/e.txt" 2 "--mount-host /mnt:/plait may not be at" "$PLAIT" "${RENDER[@]}" --mount-host /mnt:/plait || return 1
    expect_error "$WORK/e.txt" 2 "--toleration a:NoWay has an EFFECT" "$PLAIT" "${RENDER[@]}" --toleration a:NoWay
}
check pod_options_reach_the_pod_spec test_pod_options_reach_the_pod_spec

# A plan path of the submitting host that no volume of the pods holds is
# named (data resolved against the plan's directory is this host's path);
# mounted where the plan points, the warning goes.
test_warns_about_paths_of_the_submitting_host() {
    local off=(--set parallel.offload=nvme --set parallel.offload_dir=/nvme/plait)
    "$PLAIT" "${RENDER[@]}" --set data.val=/home/me/val.bin "${off[@]}" >/dev/null 2>"$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
    grep -q 'warning: k8s render: .*: data.train "/data/train.bin" is a path of this host, and the pods mount nothing there' "$WORK/w.txt" &&
        grep -q 'data.val "/home/me/val.bin" is a path of this host' "$WORK/w.txt" &&
        grep -q 'parallel.offload_dir "/nvme/plait" is a path of this host' "$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
    "$PLAIT" "${RENDER[@]}" --mount-pvc datasets:/data --set data.val=/plait/val.bin --pvc runs \
        --mount-host /nvme:/nvme "${off[@]}" >/dev/null 2>"$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
    ! grep -q "is a path of this host\|emptyDir" "$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
}
check warns_about_paths_of_the_submitting_host test_warns_about_paths_of_the_submitting_host

# Paper cuts: required options shown as required; one GPU is not "GPUs"; the
# H100's memory in the same unit, GB (10^9 bytes), in check and render.
test_synopsis_shows_required_options_without_brackets() {
    "$PLAIT" k8s render --help >"$WORK/h.txt" || return 1
    grep -q '^usage: plait k8s render PLAN --image IMG --nodes N --gpus-per-node G$' "$WORK/h.txt" &&
        grep -q '^ *\[--name NAME\]' "$WORK/h.txt" && ! grep -q '\[--image IMG' "$WORK/h.txt" || { head -n 3 "$WORK/h.txt"; return 1; }
    expect_error "$WORK/e.txt" 2 "missing --image IMG" "$PLAIT" k8s render "$PLAN" --nodes 1 --gpus-per-node 8
}
check synopsis_shows_required_options_without_brackets test_synopsis_shows_required_options_without_brackets

test_one_gpu_is_said_in_the_singular() {
    "$PLAIT" k8s render examples/plans/shakespeare.json --image x --nodes 2 --gpus-per-node 1 --set parallel.dp=auto \
        >/dev/null 2>"$WORK/g.txt" || { cat "$WORK/g.txt"; return 1; }
    grep -q "on 2 pods × 1 GPU;" "$WORK/g.txt" && ! grep -q "1 GPUs" "$WORK/g.txt"
}
check one_gpu_is_said_in_the_singular test_one_gpu_is_said_in_the_singular

test_gpu_memory_is_one_unit_in_check_and_render() {
    "$PLAIT" "${RENDER[@]}" >/dev/null 2>"$WORK/r.txt" && grep -q "of 85.90 GB device memory (GB: 10^9 bytes)" "$WORK/r.txt" ||
        { cat "$WORK/r.txt"; return 1; }
    # the same unit in plait check, in its GPU line too (this H100's hwloc says 81559 MiB)
    "$PLAIT" check "$PLAN" --topology tests/topo/h100_sxm8/topology.xml --nodes 2 >"$WORK/c.txt" 2>&1
    grep -q "device memory 85.52 GB" "$WORK/c.txt" && grep -q "HBM3 (10de:2330, named by hwloc), 85.52 GB (hwloc)" "$WORK/c.txt" &&
        ! grep -q "GiB" "$WORK/c.txt" || { cat "$WORK/c.txt"; return 1; }
}
check gpu_memory_is_one_unit_in_check_and_render test_gpu_memory_is_one_unit_in_check_and_render

# terminationGracePeriodSeconds: a micro-batch + a checkpoint write (twice with
# checkpoint.async: one in the background is finished first) + 30 s; or the
# write a run measured
test_grace_period_follows_the_checkpoint() {
    local one two measured
    one=$("$PLAIT" "${RENDER[@]}" 2>/dev/null | grep -m1 'terminationGracePeriodSeconds:' | awk '{print $2}')
    two=$("$PLAIT" "${RENDER[@]}" --set checkpoint.async=true 2>"$WORK/g.txt" |
        grep -m1 'terminationGracePeriodSeconds:' | awk '{print $2}')
    grep -q "+ 2 × checkpoint write" "$WORK/g.txt" || { cat "$WORK/g.txt"; return 1; }
    measured=$("$PLAIT" "${RENDER[@]}" --ckpt-write-s 100 2>"$WORK/g.txt" |
        grep -m1 'terminationGracePeriodSeconds:' | awk '{print $2}')
    grep -q "checkpoint write 100.0 s (as measured) + 30 s margin" "$WORK/g.txt" || { cat "$WORK/g.txt"; return 1; }
    [ "$two" -gt "$one" ] && [ "$one" -gt 30 ] && [ "$measured" -ge 130 ] && [ "$measured" -le 132 ] ||
        { echo "grace: $one, async $two, measured 100 s: $measured"; return 1; }
}
check grace_period_follows_the_checkpoint test_grace_period_follows_the_checkpoint

# ---- plait check --k8s-nodes ------------------------------------------------------------
# (micro-batches of 48: 50 GB a rank, more than an A100's 40 GiB, 42.95 GB)
test_k8s_nodes_name_where_the_plan_fits() {
    local mb=(--set batch.micro_batch=48)
    "$PLAIT" check "$PLAN" "${mb[@]}" --k8s-nodes tests/k8s/nodes/cluster.json >"$WORK/n.txt" 2>&1 || { cat "$WORK/n.txt"; return 1; }
    grep -q "5 GPU nodes of 2 kinds (2 unschedulable or not ready, 2 without GPUs)" "$WORK/n.txt" &&
        grep -q "fits: tp 8 × pp 2 × dp 1 on 2 nodes, .*: h100-a1 h100-a2$" "$WORK/n.txt" &&
        grep -q "does not fit: a rank of pipeline stage 0 needs .* the GPU has 42.95 GB" "$WORK/n.txt" ||
        { cat "$WORK/n.txt"; return 1; }
    "$PLAIT" check "$PLAN" "${mb[@]}" --k8s-nodes tests/k8s/nodes/cluster.json --json >"$WORK/n.json" || return 1
    "$PY" -c '
import json, sys
o = json.load(open(sys.argv[1]))
k = {x["product"]: x for x in o["kinds"]}
h, a = k["NVIDIA-H100-80GB-HBM3"], k["NVIDIA-A100-SXM4-40GB"]
assert h["fits"] and h["on"] == ["h100-a1", "h100-a2"] and h["layout"] == {"tp": 8, "pp": 2, "dp": 1}, h
# the least memory of the kind: a100-c2 has no nvidia.com/gpu.memory label, its product says 40GB (GiB)
assert not a["fits"] and a["memory_bytes"] == 40 * 2**30 and a["on"] == [], a' "$WORK/n.json"
}
check k8s_nodes_name_where_the_plan_fits test_k8s_nodes_name_where_the_plan_fits

test_k8s_nodes_refuse_too_few_nodes() {
    expect_error "$WORK/e.txt" 1 "needs 4 nodes of 8 GPUs, there are 3" \
        "$PLAIT" check "$PLAN" --k8s-nodes tests/k8s/nodes/cluster.json --nodes 4 || return 1
    grep -q "fits on none of the 2 GPU node kinds" "$WORK/e.txt"
}
check k8s_nodes_refuse_too_few_nodes test_k8s_nodes_refuse_too_few_nodes

# ---- the same code under AddressSanitizer and UBSan -------------------------------------
ASAN_PLAIT=$ROOT/build-asan/bin/plait
if [ -x "$ASAN_PLAIT" ]; then
    test_sanitized_render_admin_lint_nodes() {
        env PLAIT_SANITIZED=1 "$ASAN_PLAIT" k8s $(cat tests/k8s/volcano/args) >"$WORK/a.yaml" 2>"$WORK/a.txt" &&
            diff -q "$WORK/out/volcano.yaml" "$WORK/a.yaml" &&
            env PLAIT_SANITIZED=1 "$ASAN_PLAIT" k8s $(cat tests/k8s/admin_kueue/args) >"$WORK/b.yaml" 2>>"$WORK/a.txt" &&
            diff -q "$WORK/out/admin_kueue.yaml" "$WORK/b.yaml" &&
            { env PLAIT_SANITIZED=1 "$ASAN_PLAIT" k8s lint tests/k8s/lint/bad.yaml 2>>"$WORK/a.txt"; [ $? -eq 1 ]; } &&
            env PLAIT_SANITIZED=1 "$ASAN_PLAIT" check "$PLAN" --k8s-nodes tests/k8s/nodes/cluster.json >/dev/null 2>>"$WORK/a.txt" &&
            ! grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error" "$WORK/a.txt" || { cat "$WORK/a.txt"; return 1; }
    }
    check sanitized_render_admin_lint_nodes test_sanitized_render_admin_lint_nodes
else
    echo "skip sanitized_render_admin_lint_nodes: no build-asan/bin/plait (make all BUILD=build-asan SAN=1)"
fi
finish
