#!/usr/bin/env bash
# plait check on real hwloc fixtures (tests/topo/<fixture>/topology.xml): every
# case directory below tests/topo holding a plan.json is run as
#   plait check CASE/plan.json $(cat CASE/args) --json
# (args defaults to "--topology <the fixture's topology.xml>") and must print
# exactly CASE/expected.json, or fail with exit code 1 and exactly the message
# in CASE/error. Every map also passes property checks that do not depend on
# the golden file: unique coordinates in Megatron order, tp groups inside one
# node and one NVLink domain, CPU sets that never overlap in part, a complete
# env contract.
source "$(dirname "$0")/lib.sh"

# update with: PLAIT_UPDATE_GOLDEN=1 bash tests/integration/test_check.sh (then review the diff)
update=${PLAIT_UPDATE_GOLDEN:-0}

properties() { # JSON on stdin
    "$PY" -c '
import json, sys
m = json.load(sys.stdin)
tp, pp, dp, world = m["tp"], m["pp"], m["dp"], m["world_size"]
cp = m.get("cp", 1)  # named only where the layout has context parallelism
ranks = m["ranks"]
assert world == tp * cp * pp * dp == len(ranks), (world, tp, cp, pp, dp, len(ranks))
seen = set()
for r in ranks:
    n = r["rank"]
    assert (r["tp"], r.get("cp", 0), r["dp"], r["pp"]) == (
        n % tp, (n // tp) % cp, (n // (tp * cp)) % dp, n // (tp * cp * dp)), r
    seen.add((r["tp"], r.get("cp", 0), r["pp"], r["dp"]))
    env = r["env"]
    if cp > 1:
        assert (env["PLAIT_CP"], env["PLAIT_CP_RANK"]) == (str(cp), str(r["cp"])), (n, env)
    else:
        assert "PLAIT_CP" not in env and "PLAIT_CP_RANK" not in env, (n, env)
    for k in ("PLAIT_RANK", "PLAIT_WORLD_SIZE", "PLAIT_LOCAL_RANK", "PLAIT_TP_RANK",
              "PLAIT_PP_RANK", "PLAIT_DP_RANK", "PLAIT_CPUS", "PLAIT_DEVICE"):
        assert k in env, (n, k)
    assert env["PLAIT_RANK"] == str(n) and env["PLAIT_CPUS"] == r["cpus"], (n, env)
    if r["gpu_busid"] is not None:
        assert env["PLAIT_DEVICE"] == str(r["gpu_index"]), (n, env)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
assert len(seen) == world
allow = m.get("allow_tp_over_pcie", False)
for g in range(0, world, tp):
    group = ranks[g:g + tp]
    assert len({r["node"] for r in group}) == 1, ("tp group spans nodes", group)
    if not allow:
        assert len({r["nvlink_domain"] for r in group}) == 1, ("tp group spans domains", group)
def cpus(s):
    out = set()
    for part in s.split(","):
        if "-" in part:
            a, b = map(int, part.split("-")); out |= set(range(a, b + 1))
        elif part:
            out.add(int(part))
    return out
# the CPU sets of a node are disjoint, or (more ranks than cores) one core each,
# round-robin: two sets are then the same or disjoint, never overlapping in part
by_node = {}
for r in ranks:
    c = frozenset(cpus(r["cpus"]))
    assert c, ("no cpus", r)
    for q in by_node.setdefault(r["node"], []):
        assert q == c or not (q & c), ("cpus overlap in part", r)
    by_node[r["node"]].append(c)
print("properties hold for", world, "ranks")
'
}

run_case() {
    local case=$1 fixture args rc=0
    fixture=$(dirname "$case")
    if [ -f "$case/args" ]; then args=$(cat "$case/args"); else args="--topology $fixture/topology.xml"; fi
    # shellcheck disable=SC2086
    "$PLAIT" check "$case/plan.json" $args --json >"$WORK/out.json" 2>"$WORK/err.txt" || rc=$?
    if [ -f "$case/error" ] || { [ "$update" = 1 ] && [ "$rc" -ne 0 ]; }; then
        local got; got=$(sed 's/^plait: error: //' "$WORK/err.txt")
        if [ "$update" = 1 ]; then printf '%s\n' "$got" >"$case/error"; rm -f "$case/expected.json"; return 0; fi
        [ "$rc" -eq 1 ] || { echo "exit code $rc, want 1"; cat "$WORK/err.txt"; return 1; }
        [ "$got" = "$(cat "$case/error")" ] || { printf 'error:\n  got:  %s\n  want: %s\n' "$got" "$(cat "$case/error")"; return 1; }
        return 0
    fi
    [ "$rc" -eq 0 ] || { echo "exit code $rc"; cat "$WORK/err.txt"; return 1; }
    properties <"$WORK/out.json" || return 1
    if [ "$update" = 1 ]; then cp "$WORK/out.json" "$case/expected.json"; return 0; fi
    "$PY" - "$case/expected.json" "$WORK/out.json" <<'PYEOF'
import json, sys
want, got = (json.load(open(p)) for p in sys.argv[1:3])
if want != got:
    def walk(a, b, path):
        if type(a) != type(b) or not isinstance(a, (dict, list)):
            if a != b:
                print(f"  {path}: want {a!r}, got {b!r}")
            return
        keys = sorted(set(a) | set(b)) if isinstance(a, dict) else range(max(len(a), len(b)))
        for k in keys:
            x = a[k] if (k in a if isinstance(a, dict) else k < len(a)) else None
            y = b[k] if (k in b if isinstance(b, dict) else k < len(b)) else None
            walk(x, y, f"{path}.{k}" if isinstance(a, dict) else f"{path}[{k}]")
    walk(want, got, "$")
    sys.exit(1)
PYEOF
}

for plan in $(find tests/topo -name plan.json | sort); do
    case=$(dirname "$plan")
    check "check_${case#tests/topo/}" run_case "$case"
done

# more ranks than cores: a warning, and one core each, round-robin
test_more_ranks_than_cores_warn() {
    local plan=tests/topo/cpu_only/four_cpu_ranks/plan.json
    "$PLAIT" check "$plan" --topology tests/topo/cpu_only/topology.xml --set parallel.tp=1 \
        --set parallel.dp=64 --json >"$WORK/o.json" 2>"$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
    grep -q "^plait: warning: node node0 has 32 cores for 64 ranks: each rank gets one core, round-robin" \
        "$WORK/w.txt" || { cat "$WORK/w.txt"; return 1; }
    properties <"$WORK/o.json" || return 1
    "$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); r=m["ranks"]; assert r[0]["cpus"] == r[32]["cpus"] and r[0]["cpus"] != r[1]["cpus"], (r[0], r[1], r[32])' "$WORK/o.json"
}
check more_ranks_than_cores_warn test_more_ranks_than_cores_warn

# check_text CASE OUT [OPTION...]: plait check's text for a case (with its args) into OUT
check_text() {
    local case=$1 out=$2
    shift 2
    # shellcheck disable=SC2046
    "$PLAIT" check "$case/plan.json" $(cat "$case/args") "$@" >"$out" 2>&1 || { cat "$out"; return 1; }
}

# the text output names each kind of GPU: by PCI id alone (the H100s of a node hwloc sees
# without NVIDIA's libraries), with memory and dense peaks; an id plait does not know says
# so; a GPU plan's modelled MFU against the GPU's peak; and a GPU rank's memory beside its
# model's buffers: the CUDA backend's scratch (issue 19's GPT-2 124M bf16 at 16×1024: 0.55
# GB with the logits in chunks of 512 MiB, 1.93 with them whole, the LM head's bf16 copy of
# dlogits the most of it), cuBLASLt's workspace with the CUDA context's allowance, two
# columns in the total and a line saying what they are
test_text_names_the_gpus_and_models_mfu() {
    check_text tests/topo/pci_ids_only/gpt2_124m_on_one_h100_known_by_pci_id "$WORK/t.txt" || return 1
    grep -qF "    2 × NVIDIA H100 80GB HBM3 (10de:2330, named by PCI id), 85.90 GB (PCI id), dense peaks bf16 989 / fp8 1979 TFLOP/s, memory 3350 GB/s" "$WORK/t.txt" &&
        grep -qF "    1 × unknown GPU 10de:2684 (no NVML, no hwloc GPU model, not in plait's table), memory unknown, peaks unknown" "$WORK/t.txt" &&
        grep -qE "^  modelled MFU: [0-9.]+% of 1 × NVIDIA H100 80GB HBM3's dense bf16 peak, 989 TFLOP/s each \(855.2 MFLOP per token" "$WORK/t.txt" &&
        grep -qE "^ +stage +layers +parameters +params +grads +optimizer +activations +scratch +cuda +total$" "$WORK/t.txt" &&
        grep -qE "^ +0 +0-11 +124475904 +0.75 +0.50 +1.00 +9.45 +0.31 +0.57 +12.57$" "$WORK/t.txt" &&
        grep -qF "  scratch: the CUDA backend's buffers at their largest in a step; cuda: cuBLASLt's workspace (32 MiB) and the CUDA context (512 MiB, an estimate)" "$WORK/t.txt" ||
        { cat "$WORK/t.txt"; return 1; }
    # CPU ranks: no GPU lines, no MFU, no scratch or CUDA context
    "$PLAIT" check tests/topo/cpu_only/four_cpu_ranks/plan.json --topology tests/topo/cpu_only/topology.xml >"$WORK/c.txt" 2>&1 || { cat "$WORK/c.txt"; return 1; }
    ! grep -q "MFU\|10de:\|TFLOP/s\|scratch\|cuda" "$WORK/c.txt" || { cat "$WORK/c.txt"; return 1; }
}
check text_names_the_gpus_and_models_mfu test_text_names_the_gpus_and_models_mfu

# with dp > 1 the memory table gives the most loaded rank under every ZeRO stage,
# and a plan whose own stage is higher than it needs hears of the cheapest that fits
# (the refusal of one that fits at no stage is tests/topo/h100_sxm8/zero_stage_that_fits_is_proposed)
test_text_proposes_the_cheapest_zero_stage() {
    local case=tests/topo/h100_sxm8/zero2_where_zero1_fits_says_so
    "$PLAIT" check "$case/plan.json" --topology tests/topo/h100_sxm8/topology.xml >"$WORK/z.txt" 2>&1 || { cat "$WORK/z.txt"; return 1; }
    grep -qE "^  the most loaded rank by ZeRO stage at dp 8: 0 104.55 GB, 1 74.21 GB, 2 74.21 GB" "$WORK/z.txt" &&
        grep -qF "  parallel.zero 1 would fit too (74.21 GB), with no more data-parallel traffic" "$WORK/z.txt" ||
        { cat "$WORK/z.txt"; return 1; }
    # at zero 1 itself: no proposal
    "$PLAIT" check "$case/plan.json" --topology tests/topo/h100_sxm8/topology.xml --set parallel.zero=1 >"$WORK/z1.txt" 2>&1 || { cat "$WORK/z1.txt"; return 1; }
    ! grep -q "would fit too" "$WORK/z1.txt" || { cat "$WORK/z1.txt"; return 1; }
}
check text_proposes_the_cheapest_zero_stage test_text_proposes_the_cheapest_zero_stage

# parallel.offload on GPU ranks: the memory table gains a host column (16 bytes a slice
# element: the moments, the slice's fp32 master weights and gradient; S = 6,994,771,968/8),
# the device holds no moments, the text says the step runs on the CPU and what it is
# modelled at (8S over PCIe at 25 GB/s, 28S at 50 GB/s); nvme names the disk's 8S beside
# the host's windows; on CPU ranks "host" keeps its wording and no column (the advice for
# the same plan without offload is tests/topo/h100_sxm8/offload_host_is_proposed_where_no_zero_stage_fits)
test_text_says_a_gpu_ranks_step_runs_on_the_cpu() {
    local case=tests/topo/h100_sxm8/offload_host_with_zero3_fits_where_no_zero_stage_does
    local topo=tests/topo/h100_sxm8/topology.xml
    "$PLAIT" check "$case/plan.json" --topology $topo >"$WORK/o.txt" 2>&1 || { cat "$WORK/o.txt"; return 1; }
    grep -qE "^ +stage +layers +parameters +params +grads +optimizer +activations +scratch +cuda +total +host$" "$WORK/o.txt" &&
        grep -qE "^ +0 +0-33 +6994771968 +8.55 +7.90 +0.00 +61.96 +0.60 +0.57 +79.58 +13.99$" "$WORK/o.txt" &&
        grep -qF '  parallel.offload "host": the AdamW step runs on the CPU; the moments, the slice'"'"'s fp32 master weights and its gradient are in host memory (the most loaded rank: 13.99 GB, the "host" column, beside the device'"'"'s total); the device holds none of the AdamW state' "$WORK/o.txt" &&
        grep -qF "  the step on the CPU is modelled at 0.769 s: the slice's gradient down and its weights up over PCIe at 25 GB/s, AdamW's pass at 50 GB/s of host memory" "$WORK/o.txt" ||
        { cat "$WORK/o.txt"; return 1; }
    "$PLAIT" check "$case/plan.json" --topology $topo --set parallel.offload=nvme \
        --set parallel.offload_dir=/scratch/plait --json >"$WORK/n.json" 2>&1 || { cat "$WORK/n.json"; return 1; }
    "$PLAIT" check "$case/plan.json" --topology $topo --set parallel.offload=nvme \
        --set parallel.offload_dir=/scratch/plait >"$WORK/n.txt" 2>&1 || { cat "$WORK/n.txt"; return 1; }
    grep -qF '  parallel.offload "nvme": the AdamW step runs on the CPU; the moments are on disk under /scratch/plait (the most loaded rank: 6.99 GB), two windows of up to 64 MiB of each, the slice'"'"'s fp32 master weights and its gradient in host memory (7.26 GB, the "host" column); the device holds none of the AdamW state' "$WORK/n.txt" ||
        { cat "$WORK/n.txt"; return 1; }
    "$PY" - "$WORK/n.json" "$case/expected.json" <<'PYEOF' || return 1
import json, sys
nvme, host = (json.load(open(p)) for p in sys.argv[1:3])
S = 6994771968 // 8
n, h = nvme["memory_bytes_per_rank"], host["memory_bytes_per_rank"]
assert h["host"] == 16 * S and "disk" not in h and h["optimizer"] == 0, h
assert n["disk"] == 8 * S and n["host"] == 16 * (64 << 20) // 4 + 8 * S, n
assert n["total"] == h["total"] and nvme["step_time_s"]["host_step"] == host["step_time_s"]["host_step"]
assert abs(host["step_time_s"]["host_step"] - (8 * S / 25e9 + 28 * S / 50e9)) < 1e-9, host["step_time_s"]
PYEOF
    "$PLAIT" check tests/topo/cpu_only/four_cpu_ranks/plan.json --topology tests/topo/cpu_only/topology.xml \
        --set parallel.offload=host >"$WORK/c.txt" 2>&1 || { cat "$WORK/c.txt"; return 1; }
    grep -qF '  parallel.offload "host": on CPU ranks the optimizer state is in host memory already; nothing moves' "$WORK/c.txt" &&
        ! grep -qE "total +host$|step on the CPU" "$WORK/c.txt" || { cat "$WORK/c.txt"; return 1; }
}
check text_says_a_gpu_ranks_step_runs_on_the_cpu test_text_says_a_gpu_ranks_step_runs_on_the_cpu

# a pipelined plan's schedule is set beside every other schedule's textbook bubble at its
# stages and micro-batches (DualPipeV's V among them)
test_text_sets_every_schedules_bubble_beside_the_plans() {
    local case=tests/topo/h100_sxm8/tp2_pp2_dp2_pipelines_stay_on_the_node
    "$PLAIT" check "$case/plan.json" --topology tests/topo/h100_sxm8/topology.xml >"$WORK/s.txt" 2>&1 || { cat "$WORK/s.txt"; return 1; }
    grep -qF "  beside it, the same work a stage: 1f1b 11.1%, gpipe 11.1%, interleaved ×2 5.9%, zb-h1 7.7%, dualpipev 2.0%" "$WORK/s.txt" ||
        { cat "$WORK/s.txt"; return 1; }
}
check text_sets_every_schedules_bubble_beside_the_plans test_text_sets_every_schedules_bubble_beside_the_plans

# hybrid sharding: the layout line names the replicas and the shard group, and the
# traffic table shows both groups under dp with the links they were placed on (a shard
# group of 8 inside each node's NVLink domain, the replicas across the network), their
# bytes adding up to dp's; a plan without it prints neither
test_text_shows_the_hybrid_sharding_groups() {
    local case=tests/topo/multinode/h100x2_hsdp_shard_groups_stay_on_the_node
    check_text "$case" "$WORK/h.txt" || return 1
    grep -qF "layout: tp 1 × pp 1 × dp 16 (2 replicas of a shard group of 8) = 16 ranks on 2 nodes" "$WORK/h.txt" &&
        grep -qE "^ +shard +[0-9]+ +NVLink +450.0 +[0-9.]+  2 NVLink$" "$WORK/h.txt" &&
        grep -qE "^ +replicas +[0-9]+ +network +50.0 +[0-9.]+  8 network$" "$WORK/h.txt" ||
        { cat "$WORK/h.txt"; return 1; }
    "$PY" - "$WORK/h.txt" <<'PYEOF' || return 1
import re, sys
rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^ +(dp|shard|replicas) +(\d+) ", open(sys.argv[1]).read(), re.M)}
assert rows["dp"] == rows["shard"] + rows["replicas"] and rows["replicas"] > 0, rows
PYEOF
    check_text "$case" "$WORK/p.txt" --set parallel.dp_shard=auto --set parallel.dp_replicate=auto ||
        return 1
    grep -qF "layout: tp 1 × pp 1 × dp 16 = 16 ranks" "$WORK/p.txt" &&
        ! grep -qE "shard group|^ +(shard|replicas) " "$WORK/p.txt" || { cat "$WORK/p.txt"; return 1; }
}
check text_shows_the_hybrid_sharding_groups test_text_shows_the_hybrid_sharding_groups

# context parallelism: the layout line names cp, the cp groups sit where they were placed
# (each a node's NVLink domain, dp across the network), the ring's traffic is a row of
# its own and a term of the step, and the rank map gains a cp column; the dp row's groups
# are the dp·cp ranks a gradient is summed over (at dp 1 the cp pair); a plan without it
# prints none of these
test_text_shows_the_cp_groups() {
    local case=tests/topo/multinode/h100x2_tp4_cp2_dp2_cp_groups_stay_on_the_node
    check_text "$case" "$WORK/cp.txt" || return 1
    grep -qF "layout: tp 4 × cp 2 × pp 1 × dp 2 = 16 ranks on 2 nodes" "$WORK/cp.txt" &&
        grep -qF "  cp groups: inside one NVLink domain (2 ranks a sequence, each taking 2 of its 4 chunks)" "$WORK/cp.txt" &&
        grep -qE "^ +cp +3221225472 +NVLink +450.0 +[0-9.]+  8 NVLink$" "$WORK/cp.txt" &&
        grep -qE "^ +dp +[0-9]+ +network +50.0 +[0-9.]+  4 network$" "$WORK/cp.txt" &&
        grep -qE "^  modelled step: .*, tp [0-9.]+, cp [0-9.]+, pp " "$WORK/cp.txt" &&
        grep -qE "^  at cp 1 a rank would hold [0-9.]+ GB" "$WORK/cp.txt" &&
        grep -qE "^ +rank +node +local +tp +cp +pp +dp " "$WORK/cp.txt" ||
        { cat "$WORK/cp.txt"; return 1; }
    # at dp 1 the gradients are still summed over the cp pair: its link, a finite step
    check_text "$case" "$WORK/cpdp1.txt" --set parallel.dp=1 || return 1
    grep -qE "^ +dp +[0-9]+ +NVLink +450.0 +[0-9.]+  4 NVLink$" "$WORK/cpdp1.txt" &&
        grep -qE "^  modelled step: [0-9.]+ s " "$WORK/cpdp1.txt" || { cat "$WORK/cpdp1.txt"; return 1; }
    check_text "$case" "$WORK/nocp.txt" --set parallel.cp=1 || return 1
    grep -qF "layout: tp 4 × pp 1 × dp 2 = 8 ranks" "$WORK/nocp.txt" &&
        ! grep -qE "cp groups|^ +cp |, cp [0-9]| cp +pp " "$WORK/nocp.txt" || { cat "$WORK/nocp.txt"; return 1; }
}
check text_shows_the_cp_groups test_text_shows_the_cp_groups

# expert parallelism: the layout text says where the ep groups and the expert peers sit and
# why (tp 2 × ep 2 = 4 consecutive ranks inside a node's NVLink domain, the peers 4 ranks
# apart across the network; tp 2 × ep 8 = 16 ranks, more than a node, 4 of a rank's 7 peers
# across the network and no expert peers), the all-to-all is a row and a term of the step
# (its seconds the share to the peers over the network), the routed experts' gradients a
# row of their own: the dp row's dense part is the same at any ep, and the experts' part is
# summed over dp/ep ranks; a plan without ep prints none of these
test_text_shows_the_ep_groups() {
    local two=tests/topo/multinode/h100x2_moe_tp2_dp8_ep2_groups_stay_in_nvlink
    local eight=tests/topo/multinode/h100x2_moe_tp2_dp8_ep8_groups_cross_the_network
    check_text "$two" "$WORK/ep2.txt" || return 1
    grep -qF "  ep groups: inside one NVLink domain (each 2 consecutive dp ranks of one tp rank, 2 ranks apart: tp 2 × ep 2 = 4 consecutive ranks, within a node's 8 slots), an all-to-all of the routed rows, 1 of each rank's 1 peer over NVLink" "$WORK/ep2.txt" &&
        grep -qF "  expert peers: across the network (the 4 dp ranks holding the same experts, 4 ranks apart): the routed experts' gradients are summed over them, the rest over dp" "$WORK/ep2.txt" &&
        grep -qE "^ +ep +6442454016 +NVLink +450.0 +[0-9.]+  8 NVLink$" "$WORK/ep2.txt" &&
        grep -qE "^ +experts +604422144 +network +50.0 +[0-9.]+  4 network$" "$WORK/ep2.txt" &&
        grep -qE "^  modelled step: .*, tp [0-9.]+, ep [0-9.]+, pp " "$WORK/ep2.txt" ||
        { cat "$WORK/ep2.txt"; return 1; }
    check_text "$eight" "$WORK/ep8.txt" || return 1
    grep -qF "  ep groups: across the network (each 8 consecutive dp ranks of one tp rank, 2 ranks apart: tp 2 × ep 8 = 16 consecutive ranks, more than a node's 8 slots), an all-to-all of the routed rows, 4 of each rank's 7 peers over the network" "$WORK/ep8.txt" &&
        grep -qF "  expert peers: none (ep is the whole dp)" "$WORK/ep8.txt" &&
        grep -qE "^ +ep +16911444480 +network +50.0 +[0-9.]+  2 network$" "$WORK/ep8.txt" &&
        ! grep -qE "^ +experts " "$WORK/ep8.txt" || { cat "$WORK/ep8.txt"; return 1; }
    "$PY" - "$two/expected.json" "$eight/expected.json" <<'PYEOF' || return 1
import json, sys
two, eight = (json.load(open(p)) for p in sys.argv[1:3])
b2, b8 = two["comm_bytes_per_step"], eight["comm_bytes_per_step"]
# the dense gradients over all 8 dp ranks whatever ep; ep 8 has no expert peers
assert b2["dp"] - b2["experts"] == b8["dp"] and b8["experts"] == 0, (b2, b8)
# ep 2 holds 8 of the 16 experts, ep 8 two: the 6 more are 3/4 of ep 2's routed ones, whose
# bf16 gradients are all-reduced over the 4 expert peers, 2·(4−1)/4 of them sent
routed = (two["memory_by_stage"][0]["parameters"] - eight["memory_by_stage"][0]["parameters"]) * 8 / 6
assert b2["experts"] == 2 * 3 / 4 * routed * 2, (b2["experts"], routed)
ep = eight["links"]["ep"]
assert ep["peers_over_slowest"] == 4 and abs(ep["seconds"] - ep["bytes_per_step"] * 4 / 7 / 50e9) < 1e-12, ep
PYEOF
    check_text "$two" "$WORK/noep.txt" --set parallel.ep=1 || return 1
    ! grep -qE "ep groups|expert peers|^ +(ep|experts) |, ep [0-9]" "$WORK/noep.txt" || { cat "$WORK/noep.txt"; return 1; }
}
check text_shows_the_ep_groups test_text_shows_the_ep_groups

# on this machine (no --topology) CPU ranks are modelled from the CPU kernels'
# rates measured at the plan's shapes: positive, and the memory-bound ops and
# the optimizer's pass in the step; an explicit --device-tflops measures
# nothing (the step is then the given rate's alone, the same on any machine)
test_this_machines_cpu_is_measured() {
    local plan=$WORK/tiny.json
    tiny_plan "$plan"
    "$PLAIT" check "$plan" --set parallel.device=cpu --json >"$WORK/m.json" 2>"$WORK/m.err" || { cat "$WORK/m.err"; return 1; }
    "$PLAIT" check "$plan" --set parallel.device=cpu --device-tflops 0.4 --json >"$WORK/g.json" || return 1
    "$PLAIT" check "$plan" --set parallel.device=cpu >"$WORK/m.txt" || return 1
    grep -q "^this machine's CPU kernels at the plan's shapes (measured in [0-9.]* s), a rank's [0-9.]* CPU" \
        "$WORK/m.txt" || { cat "$WORK/m.txt"; return 1; }
    grep -q "modelled step: .*memory-bound ops [0-9.]*, .*optimizer [0-9.]*)" "$WORK/m.txt" || { cat "$WORK/m.txt"; return 1; }
    "$PY" - "$WORK/m.json" "$WORK/g.json" <<'PYEOF'
import json, sys
m, g = (json.load(open(p)) for p in sys.argv[1:3])
rank, t = m["cpu_rates"]["rank"], m["step_time_s"]
assert m["cpu_rates"]["cpus_per_rank"] > 0 and all(v > 0 for v in rank.values()), m["cpu_rates"]
assert t["memory"] > 0 and t["optimizer"] > 0 and t["total"] >= t["compute"] + t["memory"], t
assert "cpu_rates" not in g and "memory" not in g["step_time_s"], g
PYEOF
}
check this_machines_cpu_is_measured test_this_machines_cpu_is_measured

test_fixtures_load_in_lstopo() {
    for x in tests/topo/*/topology.xml; do
        lstopo-no-graphics -i "$x" --of console >/dev/null || { echo "lstopo cannot read $x"; return 1; }
    done
}
check fixtures_load_in_lstopo test_fixtures_load_in_lstopo

# PLAIT_RANKS_PER_GPU=K on the live machine (faked: HWLOC_XMLFILE, one H100 PCIe): each GPU
# is K slots, so a tp 2 plan on socket places both ranks on GPU 0, whose contract says so;
# the fit is each rank's prediction × 2 against the GPU; nccl refused naming both; a bad K
# refused naming the variable and the value; K = 1 is what no variable is
ONE_GPU=tests/topo/h100_pcie1/topology.xml
share_plan() {
    cat >"$WORK/share.json" <<'JSON'
{"model": {"layers": 12, "heads": 12, "hidden": 768, "vocab": 50257, "padded_vocab": 50304,
           "seq_len": 1024},
 "data": {"train": "train.bin"}, "steps": 100, "precision": "bf16", "batch": {"micro_batch": 4},
 "parallel": {"tp": 2, "device": "cuda", "backend": "socket"}}
JSON
}
test_ranks_share_one_gpu() {
    share_plan
    HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=2 "$PLAIT" check "$WORK/share.json" --json \
        >"$WORK/share.out" 2>"$WORK/share.err" || { cat "$WORK/share.err"; return 1; }
    properties <"$WORK/share.out" || return 1
    "$PY" - "$WORK/share.out" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
r = m["ranks"]
assert m["world_size"] == 2 and m["nodes"][0]["slots"] == 2, (m["world_size"], m["nodes"][0])
assert [x["gpu_index"] for x in r] == [0, 0], [x["gpu_index"] for x in r]
assert len({x["nvlink_domain"] for x in r}) == 1, r
assert [x["env"]["PLAIT_DEVICE"] for x in r] == ["0", "0"], r
assert [x["env"].get("PLAIT_GPU_SHARED_BY") for x in r] == ["2", "2"], r
assert m["ranks_per_gpu"] == 2 and m["fits"] is True, (m.get("ranks_per_gpu"), m["fits"])
assert 2 * m["memory_bytes_per_rank"]["total"] <= m["device_memory_bytes"], m
print("2 ranks on GPU 0, fits:", 2 * m["memory_bytes_per_rank"]["total"], "of", m["device_memory_bytes"])
PYEOF
    HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=2 "$PLAIT" check "$WORK/share.json" >"$WORK/share.txt" 2>&1 ||
        { cat "$WORK/share.txt"; return 1; }
    grep -qE "^  device memory 85.52 GB, shared by 2 ranks \(PLAIT_RANKS_PER_GPU\): 42.76 GB a rank: fits" \
        "$WORK/share.txt" && grep -qE "^ +1 +0 +1 +1 +0 +0 +0000:18:00.0 +0 +0 " "$WORK/share.txt" ||
        { cat "$WORK/share.txt"; return 1; }
}
check plait_ranks_per_gpu_2_places_tp2_on_one_gpu test_ranks_share_one_gpu

# a rank's prediction fits the GPU, two of them do not: refused, saying the two share it
test_shared_gpu_fit_counts_every_rank() {
    share_plan
    local total gb
    HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=2 "$PLAIT" check "$WORK/share.json" --json \
        >"$WORK/fit.json" || return 1
    total=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory_bytes_per_rank"]["total"])' "$WORK/fit.json") || return 1
    gb=$("$PY" -c "print($total * 1.5 / 1e9)") # room for one rank and a half
    expect_error "$WORK/fit.log" 1 \
        "a rank of pipeline stage 0 needs [0-9.]+ GB, the 2 on one GPU \(PLAIT_RANKS_PER_GPU\) [0-9.]+ GB, the GPU has [0-9.]+ GB" \
        env HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=2 "$PLAIT" check "$WORK/share.json" --gpu-memory "$gb" || return 1
    grep -q "DOES NOT FIT" "$WORK/fit.log" || { cat "$WORK/fit.log"; return 1; }
}
check shared_gpu_fit_is_each_rank_times_the_ranks_on_it test_shared_gpu_fit_counts_every_rank

test_shared_gpu_refuses_nccl_and_bad_counts() {
    share_plan
    expect_error "$WORK/nccl.log" 1 \
        'PLAIT_RANKS_PER_GPU=2 puts 2 ranks on each GPU of node [^ ]+, but parallel.backend "nccl" takes one rank per GPU' \
        env HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=2 "$PLAIT" check "$WORK/share.json" \
        --set parallel.backend=nccl || return 1
    local k
    for k in two 0 65 ""; do
        expect_error "$WORK/bad.log" 1 "PLAIT_RANKS_PER_GPU=$k: must be an integer in \[1, 64\]" \
            env HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=$k "$PLAIT" check "$WORK/share.json" || return 1
    done
}
check shared_gpu_refuses_nccl_and_a_bad_count test_shared_gpu_refuses_nccl_and_bad_counts

# K = 1 is no sharing: the 2-rank plan needs 2 GPUs, and a plan's output is what it is
# without the variable
test_ranks_per_gpu_1_changes_nothing() {
    share_plan
    expect_error "$WORK/k1.log" 1 "the layout tp 2 × pp 1 × dp 1 needs 2 ranks; the allocation has 1" \
        env HWLOC_XMLFILE=$ONE_GPU PLAIT_RANKS_PER_GPU=1 "$PLAIT" check "$WORK/share.json" || return 1
    local plan=tests/topo/pci_ids_only/gpt2_124m_on_one_h100_known_by_pci_id/plan.json
    HWLOC_XMLFILE=tests/topo/pci_ids_only/topology.xml "$PLAIT" check "$plan" --json >"$WORK/k0.json" 2>&1 &&
        HWLOC_XMLFILE=tests/topo/pci_ids_only/topology.xml PLAIT_RANKS_PER_GPU=1 "$PLAIT" check "$plan" \
            --json >"$WORK/k1.json" 2>&1 || { cat "$WORK/k0.json" "$WORK/k1.json"; return 1; }
    diff "$WORK/k0.json" "$WORK/k1.json"
}
check plait_ranks_per_gpu_1_changes_nothing test_ranks_per_gpu_1_changes_nothing
finish
