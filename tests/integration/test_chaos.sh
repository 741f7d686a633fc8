#!/usr/bin/env bash
# Chaos: a 4-rank run (pp 2 × dp 2) whose ranks are killed with SIGKILL again
# and again — during a step, while a checkpoint is being written, while it is
# committed — is restarted by plait train's supervision each time and ends
# with the metrics of a run never killed, to the bit; at every kill no
# checkpoint is visible but incomplete. And plait train killed itself with
# SIGKILL takes its ranks with it, and the same command resumes.
# The moments are random from a fixed seed (printed: CHAOS_SEED=N reruns one).
# The checkpoint windows are widened with strace, which delays every fsync and
# rename by 30 ms, so that "during the write" and "during the commit" are moments
# the test can see (a .tmp-step_* directory, then its manifest.json) and hit.
# asan: skip (strace's ptrace and LeakSanitizer do not mix; the supervision is launcher code the plain build runs)
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
SEED=${CHAOS_SEED:-$(date +%s)}
echo "# CHAOS_SEED=$SEED"
LAYOUT=(--set parallel.pp=2 --set parallel.dp=2 --set steps=40 --set checkpoint.every=2
    --set checkpoint.keep=2 --set parallel.timeout_s=10)
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" "${LAYOUT[@]}" >"$WORK/ref.log" 2>&1 ||
    { cat "$WORK/ref.log"; exit 1; }

# The driver: starts the run, kills, checks, waits. Prints what it did.
chaos() { # RUN_DIR LOG KILLS SEED COMMAND...
    "$PY" - "$@" <<'PYEOF'
import json, os, random, signal, subprocess, sys, time

run, log, kills, seed, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
rng = random.Random(seed)
ckpts = os.path.join(run, "checkpoints")

def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []

def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""

def env_int(pid, name):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        return int(env.get(name.encode(), b"-1"))
    except (OSError, ValueError):
        return -1

def check_visible():
    """Every visible step_* directory is complete: a manifest whose files all
    exist with their sizes. A directory that goes while it is read was being
    pruned (renamed out of sight first): not an incomplete one."""
    try:
        names = [n for n in os.listdir(ckpts) if n.startswith("step_")]
    except FileNotFoundError:
        return []
    bad = []
    for n in names:
        d = os.path.join(ckpts, n)
        try:
            with open(os.path.join(d, "manifest.json")) as f:
                files = json.load(f)["files"]
            for name, rec in files.items():
                size = os.stat(os.path.join(d, name)).st_size
                if size != rec["bytes"]:
                    bad.append(f"{n}/{name}: {size} bytes, the manifest says {rec['bytes']}")
        except (OSError, ValueError, KeyError) as e:
            if os.path.isdir(d):
                bad.append(f"{n}: {e}")
    return bad

def tmp_dirs():
    """The checkpoints being written: name -> inode."""
    found = {}
    try:
        for n in os.listdir(ckpts):
            if n.startswith(".tmp-step_"):
                try:
                    found[n] = os.stat(os.path.join(ckpts, n)).st_ino
                except OSError:
                    pass
    except FileNotFoundError:
        pass
    return found

def progress_lines():
    """Steps rank 0 reported on the console (each gang's, in its turn)."""
    try:
        with open(log) as f:
            return sum(1 for l in f if l.startswith("step "))
    except OSError:
        return 0

out = open(log, "w")
t0 = time.time()
tracer = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
# strace's child is plait train; plait train's children are the ranks
def launcher():
    kids = children(tracer.pid)
    return kids[0] if kids else None

def gang(expect_count, deadline):
    """The 4 ranks of the gang started with PLAIT_RESTART_COUNT expect_count."""
    while time.time() < deadline and tracer.poll() is None:
        l = launcher()
        ranks = children(l) if l else []
        if len(ranks) == 4 and all(comm(p) == "plait-train" for p in ranks):
            counts = {env_int(p, "PLAIT_RESTART_COUNT") for p in ranks}
            if counts == {expect_count}:
                return {env_int(p, "PLAIT_RANK"): p for p in ranks}
        time.sleep(0.005)
    return None

phases = ["step", "write", "commit"]
done = []
for k in range(kills):
    ranks = gang(k, time.time() + 60)
    if not ranks:
        print(f"kill {k + 1}: no gang with PLAIT_RESTART_COUNT={k} (the run ended or hung)")
        sys.exit(1)
    phase = phases[k % 3]
    victim_rank = rng.randrange(4)
    deadline = time.time() + 60
    if phase == "step":  # a random moment once this gang has trained a step
        base = progress_lines()
        while progress_lines() <= base and time.time() < deadline and tracer.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.3))
    else:  # a checkpoint being written (no manifest yet), or committed (manifest there)
        stale = set(tmp_dirs().values())  # a killed gang's, until this one removes them
        hit = False
        while not hit and time.time() < deadline and tracer.poll() is None:
            for t, ino in tmp_dirs().items():
                if ino in stale:
                    continue
                has_manifest = os.path.exists(os.path.join(ckpts, t, "manifest.json"))
                if has_manifest == (phase == "commit"):
                    hit = True
            if not hit:
                time.sleep(0.002)
        if not hit:
            print(f"kill {k + 1}: no checkpoint {phase} seen")
            sys.exit(1)
    victim = ranks[victim_rank]
    os.kill(victim, signal.SIGKILL)
    bad = check_visible()
    print(f"kill {k + 1} at {time.time() - t0:.1f} s: rank {victim_rank} (pid {victim}) during "
          f"{phase}")
    if bad:
        print("  visible but incomplete:", bad)
        sys.exit(1)
    done.append(phase)
rc = tracer.wait(timeout=300)
out.close()
bad = check_visible()
if bad:
    print("at the end, visible but incomplete:", bad)
    sys.exit(1)
print(f"{len(done)} kills ({', '.join(sorted(set(done)))}); plait train exited {rc} "
      f"after {time.time() - t0:.1f} s")
sys.exit(0 if rc == 0 else 1)
PYEOF
}

test_ranks_killed_at_random_moments_are_restarted_to_the_same_metrics() {
    local run=$WORK/chaos kills=12
    chaos "$run" "$WORK/chaos.log" "$kills" "$SEED" \
        strace -f --seccomp-bpf -qq -o /dev/null -e trace=fsync,rename,renameat,renameat2 \
        -e inject=fsync:delay_enter=30000 -e inject=rename,renameat,renameat2:delay_enter=30000 \
        "$PLAIT" train "$WORK/plan.json" --out "$run" "${LAYOUT[@]}" \
        --set checkpoint.max_restarts=$((kills + 2)) ||
        { grep -v '^step\|^eval' "$WORK/chaos.log" | tail -n 30; return 1; }
    for k in $(seq "$kills"); do
        grep -q "restarting the gang from the newest complete checkpoint (restart $k of $((kills + 2))" \
            "$WORK/chaos.log" || { echo "restart $k is not in the log"; return 1; }
    done
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

# A rank whose failure is its own (bad data) is not restarted; a lost rank
# with no restart left ends the run with 76, saying how many were made.
test_exhausted_restarts_exit_76_and_bad_input_is_not_restarted() {
    local run=$WORK/once
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${LAYOUT[@]}" --set steps=100000 \
        --set checkpoint.max_restarts=1 >"$run.log" 2>&1 &
    local pid=$! rc=0
    for n in 0 1; do
        local victim=""
        for _ in $(seq 400); do
            victim=$(pgrep -P "$pid" | sed -n 2p)
            [ -n "$victim" ] && tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null |
                grep -qx "PLAIT_RESTART_COUNT=$n" && [ -s "$run/metrics.jsonl" ] && break
            victim=""
            sleep 0.05
        done
        [ -n "$victim" ] || { echo "no rank with PLAIT_RESTART_COUNT=$n"; kill "$pid"; cat "$run.log"; return 1; }
        sleep 0.2
        kill -9 "$victim"
    done
    wait "$pid" || rc=$?
    [ "$rc" -eq 76 ] || { echo "exit code $rc, want 76"; grep -v '^step' "$run.log"; return 1; }
    grep -q "the gang was restarted 1 time (checkpoint.max_restarts 1): exit 76" "$run.log" ||
        { grep -v '^step' "$run.log"; return 1; }
    head -c 4096 /dev/urandom >"$WORK/junk.bin"
    expect_error "$WORK/junk.log" 1 "not an llm.c token shard" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/junk" "${LAYOUT[@]}" \
        --set data.train="$WORK/junk.bin" || return 1
    ! grep -q "restarting the gang" "$WORK/junk.log" || { cat "$WORK/junk.log"; return 1; }
}

# One rank is supervised the same way: killed, it is restarted from its newest
# checkpoint (PLAIT_RESTART_COUNT 1) and the run ends as one never killed.
test_a_killed_single_rank_is_restarted_to_the_same_metrics() {
    local run=$WORK/single
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/single-ref" >"$WORK/single-ref.log" 2>&1 ||
        { cat "$WORK/single-ref.log"; return 1; }
    PLAIT_DEBUG_SLOW_RANK=0:20 "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log" 2>&1 &
    local pid=$! rank="" rc=0
    for _ in $(seq 400); do
        [ -d "$run/checkpoints/step_00000004_0000" ] && rank=$(pgrep -P "$pid") && break
        sleep 0.02
    done
    [ -n "$rank" ] || { echo "no rank"; kill "$pid"; return 1; }
    kill -9 "$rank"
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || { echo "exit code $rc"; cat "$run.log"; return 1; }
    grep -q "rank 0 (pid $rank) was killed by signal 9: restarting the gang from the newest complete checkpoint (restart 1 of 3" \
        "$run.log" || { grep -v '^step' "$run.log"; return 1; }
    grep -q "resuming from" "$run.log" || { grep -v '^step' "$run.log"; return 1; }
    metrics_equal "$WORK/single-ref/metrics.jsonl" "$run/metrics.jsonl"
}

# plait train killed with SIGKILL: its ranks die with it (the kernel kills
# them: PR_SET_PDEATHSIG), the run directory's lock goes with them, and the
# same command resumes and ends with the uninterrupted run's metrics.
test_a_killed_launcher_takes_its_ranks_and_the_run_resumes() {
    local run=$WORK/orphan
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${LAYOUT[@]}" >"$run.log1" 2>&1 &
    local pid=$! ranks=""
    for _ in $(seq 400); do
        [ -d "$run/checkpoints/step_00000004_0000" ] && ranks=$(pgrep -P "$pid") && break
        sleep 0.02
    done
    [ "$(echo "$ranks" | wc -w)" -eq 4 ] || { echo "no 4 ranks: $ranks"; kill "$pid"; return 1; }
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    for _ in $(seq 100); do
        local alive=0
        for r in $ranks; do kill -0 "$r" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.05
    done
    for r in $ranks; do
        ! kill -0 "$r" 2>/dev/null || { echo "rank pid $r outlived its launcher"; return 1; }
    done
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${LAYOUT[@]}" >"$run.log2" 2>&1 ||
        { cat "$run.log2"; return 1; }
    grep -q "resuming from" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

check ranks_killed_at_random_moments_are_restarted_to_the_same_metrics \
    test_ranks_killed_at_random_moments_are_restarted_to_the_same_metrics
check exhausted_restarts_exit_76_and_bad_input_is_not_restarted \
    test_exhausted_restarts_exit_76_and_bad_input_is_not_restarted
check a_killed_single_rank_is_restarted_to_the_same_metrics \
    test_a_killed_single_rank_is_restarted_to_the_same_metrics
check a_killed_launcher_takes_its_ranks_and_the_run_resumes \
    test_a_killed_launcher_takes_its_ranks_and_the_run_resumes
finish
