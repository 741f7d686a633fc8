# lib.sh — shared by the integration tests (sourced). Run from the repo root.
# Gives: $PLAIT (the CLI), $WORK (a temp dir removed at exit), tiny data and
# plans, `check NAME CMD...` which prints "ok NAME" / "not ok NAME".
set -u
ROOT=$PWD
BUILD=${PLAIT_BUILD:-$ROOT/build}
PLAIT=$BUILD/bin/plait
source "$ROOT/scripts/python.sh" # defines: plait_python
source "$ROOT/scripts/npm_package.sh" # defines: npm_package_dir
PY=$(plait_python)
export PLAIT_PYTHON=$PY
WORK=$(mktemp -d /tmp/plait-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
failures=0

# check NAME COMMAND...: runs the command, reports ok/not ok with its output on failure.
check() {
    local name=$1; shift
    local out
    if out=$("$@" 2>&1); then
        echo "ok $name"
    else
        echo "not ok $name"
        printf '%s\n' "$out" | tail -n 40 | sed 's/^/    # /'
        failures=$((failures + 1))
    fi
}

# referee_case REFEREE NAME [case options...]: a PyTorch referee
# (tests/golden/*_ref.py) writes a case into $WORK/case_NAME.
referee_case() {
    local ref=$1 name=$2
    shift 2
    "$PY" "$ref" case "$WORK/case_$name" "$@" >"$WORK/case_$name.log" 2>&1 || {
        cat "$WORK/case_$name.log"
        return 1
    }
}

# The byte-level Shakespeare shards, once per test file.
tiny_data() {
    [ -f "$WORK/train.bin" ] && return 0
    "$PLAIT" data prepare "$ROOT/examples/data/tinyshakespeare.txt" "$WORK/train.bin" \
        --val "$WORK/val.bin" >/dev/null
}

# tiny_plan FILE: a 2-layer char model that trains in well under a second per step. Its
# console prints every step's line (train.log_every 1): tests wait for and count them.
tiny_plan() {
    tiny_data
    cat >"$1" <<JSON
{"model": {"layers": 2, "heads": 2, "hidden": 32, "vocab": 256, "seq_len": 32, "seed": 7},
 "data": {"train": "$WORK/train.bin", "val": "$WORK/val.bin", "shuffle": true,
          "val_every": 4, "val_batches": 2},
 "batch": {"micro_batch": 4, "grad_accum": 3},
 "optimizer": {"lr": 2e-3, "warmup_steps": 2, "grad_clip": 1.0},
 "steps": 12,
 "checkpoint": {"every": 4, "keep": 5},
 "train": {"log_every": 1}}
JSON
}

# metrics_equal A B: the two metrics.jsonl files agree to the bit on every
# field except the measured ones (and "resumed", where a run resumed): wall-clock times, and in "parallel" the
# shares of time, the straggler and the bytes sent (a step resumed in its
# middle counts only what the resumed process sent); its rank count must agree.
metrics_equal() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
TIMING = {"ms", "tokens_per_s", "peak_pct", "mfu", "resumed"}
PAR_TIMING = {"compute_pct", "comm_pct", "bubble_pct", "straggler", "bytes", "wait_ms"}
def strip(r):
    r = {k: v for k, v in r.items() if k not in TIMING}
    if "parallel" in r:
        r["parallel"] = {k: v for k, v in r["parallel"].items() if k not in PAR_TIMING}
    return r
def load(p):
    return [strip(json.loads(l)) for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b:
    print("metrics differ:")
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            print(" line", i + 1, "\n   ", x, "\n   ", y)
    sys.exit(1)
print(len(a), "records identical")
PYEOF
}

# manifest_lists_as_is FILE: run in a checkpoint's directory, rewrites its
# manifest.json to list FILE's bytes and CRC-32C as they are now (a forger who
# changed both, so that only the checks beyond sizes and checksums remain)
# offload_early LOG: "N M K" from the run's closing line "offload: N of M gradient floats
# came down during backward[ and its reduction (K of them after the backward, ...)]"
# (runtime/host_step.h, parallel.offload's step on the CPU; K 0 where the line has none)
offload_early() {
    sed -n -e 's/.*offload: \([0-9]*\) of \([0-9]*\) gradient floats came down during backward and its reduction (\([0-9]*\) of them after.*/\1 \2 \3/p' \
        -e 's/.*offload: \([0-9]*\) of \([0-9]*\) gradient floats came down during backward$/\1 \2 0/p' \
        "$1" | tail -n 1
}

# offload_overlapped LOG: most of the run's gradient came down during backward (all but the
# embeddings, which no layer's grads_final hook covers), and not all of it
offload_overlapped() {
    local n m
    read -r n m _ <<<"$(offload_early "$1")"
    [ -n "${m:-}" ] && [ "$m" -gt 0 ] && [ $((2 * n)) -gt "$m" ] && [ "$n" -lt "$m" ] ||
        { echo "$1: ${n:-?} of ${m:-?} gradient floats came down during backward"; return 1; }
}

manifest_lists_as_is() {
    "$PY" - "$1" <<'PYEOF'
import json, os, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
name = sys.argv[1]
m = json.load(open("manifest.json"))
m["files"][name] = {"bytes": os.path.getsize(name), "crc32c": crc32c(open(name, "rb").read())}
json.dump(m, open("manifest.json", "w"), indent=2)
PYEOF
}

# expect_error LOG EXIT PATTERN COMMAND...: the command fails with exit code
# EXIT ("any": any non-zero) and its output matches the extended regex PATTERN.
expect_error() {
    local log=$1 want=$2 pattern=$3 rc=0
    shift 3
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$want" = any ]; then
        [ "$rc" -ne 0 ] || { echo "accepted: $*"; cat "$log"; return 1; }
    else
        [ "$rc" -eq "$want" ] || { echo "exit code $rc, want $want"; cat "$log"; return 1; }
    fi
    grep -qE -- "$pattern" "$log" || { echo "missing: $pattern"; cat "$log"; return 1; }
}

# full_disk_then_room SIZE [train options...]: plait train of $WORK/plan.json on a tmpfs of
# SIZE in a private mount namespace (nothing outside the test sees it): it must fail naming
# ENOSPC, leave no temporary and keep only checkpoints that verify; with room again the same
# command must resume. Its metrics end in $WORK/full-metrics.jsonl.
full_disk_then_room() {
    [ "$(id -u)" = 0 ] || { echo "needs root (mount)"; return 1; }
    local size=$1 full=$WORK/full
    shift
    mkdir -p "$full"
    unshare -m bash -s "$full" "$PLAIT" "$WORK/plan.json" "$size" "$@" >"$WORK/full.log" 2>&1 <<'SH'
set -u
full=$1 plait=$2 plan=$3 size=$4
shift 4
mount -t tmpfs -o size="$size" tmpfs "$full" || exit 3
rc=0
"$plait" train "$plan" --out "$full/run" "$@" >"$full/first.log" 2>&1 || rc=$?
cat "$full/first.log"
[ "$rc" = 1 ] || { echo "first run exited $rc"; exit 1; }
grep -q "No space left on device" "$full/first.log" || { echo "no ENOSPC message"; exit 1; }
if ls -a "$full/run/checkpoints" | grep -q '^\.tmp-'; then echo "temporary left"; ls -a "$full/run/checkpoints"; exit 1; fi
if ls "$full/run/checkpoints" | grep -q .; then "$plait" ckpt verify "$full/run" || exit 1; fi
mount -o remount,size=64m "$full" || exit 3
"$plait" train "$plan" --out "$full/run" "$@" >"$full/second.log" 2>&1 || { cat "$full/second.log"; exit 1; }
grep -q "resuming from" "$full/second.log" || { cat "$full/second.log"; exit 1; }
cp "$full/run/metrics.jsonl" "$full/../full-metrics.jsonl"
SH
    local rc=$?
    [ "$rc" = 0 ] || { cat "$WORK/full.log"; return 1; }
}

finish() {
    [ "$failures" -eq 0 ]
}
