#!/usr/bin/env bash
# make bench-ckpt — checkpoint speed for GPT-2 124M at 1×1×1 and 2×1×2 (ZeRO
# 1): the write rate against the disk's sequential write rate measured in the
# same run (dd with fsync, the same bytes, the same directory; goal ≥ 80%), the
# step's pause with checkpoint.async against a synchronous write (goal ≤ 10%),
# and the resume's read time against the write time (goal ≤ 2×). Each layout
# writes a checkpoint at once (one step), resumes it, and writes one in the
# background (two steps); the medians of 3 rounds are used.
# Not a test: it asserts nothing. CKPT_BENCH_DIR picks the file system
# (default: a directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
base=${CKPT_BENCH_DIR:-/tmp}
work=$(mktemp -d "$base/plait-ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=PASSIVE

"$BUILD/bin/plait" data prepare examples/data/tinyshakespeare.txt "$work/train.bin" >/dev/null
cat >"$work/plan.json" <<EOF
{"model": {"layers": 12, "heads": 12, "hidden": 768, "vocab": 50257, "padded_vocab": 50304,
           "seq_len": 32, "max_seq_len": 1024, "seed": 7},
 "data": {"train": "$work/train.bin"},
 "batch": {"micro_batch": 1, "grad_accum": 2},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 "steps": 2, "checkpoint": {"every": 1, "keep": 1}}
EOF

# one NAME --set ...: a synchronous run of one step (its checkpoint, written at once, is the
# write time), its resume (one step more: the read time), and a run of 2 steps with
# checkpoint.async (step 1's pause); prints write_s stall_s read_s bytes
one() {
    local name=$1
    shift
    local run=$work/$name
    "$BUILD/bin/plait" train "$work/plan.json" --out "$run" --set steps=1 "$@" >"$run.log" 2>&1 ||
        { tail -n 20 "$run.log" >&2; exit 1; }
    local size write
    size=$(du -sb "$run"/checkpoints/step_* | awk '{print $1}')
    write=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"]["last_write_s"])' "$run/run.json")
    "$BUILD/bin/plait" train "$work/plan.json" --out "$run" --set steps=2 "$@" >"$run.log2" 2>&1 ||
        { tail -n 20 "$run.log2" >&2; exit 1; }
    "$BUILD/bin/plait" train "$work/plan.json" --out "$run-async" --set checkpoint.async=true "$@" \
        >"$run.log3" 2>&1 || { tail -n 20 "$run.log3" >&2; exit 1; }
    "$PY" - "$run" "$size" "$write" <<'PYEOF'
import re, sys
run, size, write = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
read = float(re.search(r"resuming from .*, read in ([0-9.]+) s", open(run + ".log2").read()).group(1))
stall = float(re.search(r"checkpoint step 1 written in [0-9.]+ s in the background \(the step paused ([0-9.]+) s",
                        open(run + ".log3").read()).group(1))
print(write, stall, read, size)
PYEOF
    rm -rf "$run" "$run-async"
}

# dd_rate BYTES: the disk's sequential write rate (bytes/s), fsync included
dd_rate() {
    local mb=$(($1 / 1048576 + 1)) t0 t1
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync status=none
    t1=$(date +%s.%N)
    rm -f "$work/dd.bin"
    "$PY" -c "print($mb * 1048576 / ($t1 - $t0))"
}

report() { # LABEL --set ...
    local label=$1
    shift
    local rows=() r
    for _ in 1 2 3; do
        r=$(one "run" "$@")
        rows+=("$r $(dd_rate "${r##* }")")
    done
    printf '%s\n' "${rows[@]}" | "$PY" -c '
import statistics, sys
label = sys.argv[1]
rows = [list(map(float, l.split())) for l in sys.stdin]
write, stall, read, size, dd = (statistics.median(c) for c in zip(*rows))
rate = size / write
pad = " " * 10
print(f"{label:10s} checkpoint {size / 1e9:.2f} GB: written at {rate / 1e6:.0f} MB/s, dd {dd / 1e6:.0f} MB/s: {rate / dd:.2f} of the disk (goal >= 0.80)")
print(f"{pad} async pause {stall * 1e3:.0f} ms / sync write {write * 1e3:.0f} ms = {stall / write:.3f} (goal <= 0.10)")
print(f"{pad} resume read {read:.2f} s / write {write:.2f} s = {read / write:.2f} (goal <= 2)")
' "$label"
}

echo "== GPT-2 124M checkpoints in $base (medians of 3 runs)"
report "1x1x1"
report "2x1x2 Z1" --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1
