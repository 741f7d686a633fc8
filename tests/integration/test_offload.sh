#!/usr/bin/env bash
# test_offload.sh — parallel.offload on CPU ranks: "nvme" keeps the AdamW
# moments in files under parallel.offload_dir, stepping the slice window by
# window (windows far smaller than the slice here, so the I/O thread reads
# ahead and writes behind many times a step), and must give the bits the
# in-memory run gives, on one rank and at dp 2 ZeRO 1 and 2; "host" changes
# nothing on a CPU rank and says so; a run stopped mid-step resumes to the bit
# with its moments read back into the files; a checkpoint written from the
# files resumes without offload and the reverse (the same format); under a
# data-segment limit (ulimit -d, inherited by every rank) that the in-memory
# state passes, the offloaded run trains; the files go when the run ends, and
# their space is taken at its start (a disk too small fails then, naming the
# file and the rank); bad settings are refused naming the field, an unusable
# directory naming the path and the rank.
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
COMMON=(--set data.val=null --set data.val_every=0)

# run NAME [--set ...]: a training run into $WORK/NAME
run() {
    local name=$1
    shift
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/$name" "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1 ||
        { tail -n 20 "$WORK/$name.log"; return 1; }
}

# nvme DIR: the settings of an offload to DIR with windows of ~700 floats
nvme() { echo --set parallel.offload=nvme --set parallel.offload_dir="$WORK/$1" --set parallel.offload_window_mb=0.0027; }

test_nvme_gives_the_in_memory_bits() {
    # shellcheck disable=SC2046
    run none && run nvme1 $(nvme d1) && metrics_equal "$WORK/none/metrics.jsonl" "$WORK/nvme1/metrics.jsonl" ||
        return 1
    # scratch: the files (and rank-N/) go when the run ends
    [ -d "$WORK/d1" ] && ! [ -e "$WORK/d1/rank-0" ] || { ls -lR "$WORK/d1"; return 1; }
    local z
    for z in 1 2; do
        # shellcheck disable=SC2046
        run dp2_z$z --set parallel.dp=2 --set parallel.zero=$z &&
            run dp2_z${z}_nvme --set parallel.dp=2 --set parallel.zero=$z $(nvme d2_$z) &&
            metrics_equal "$WORK/dp2_z$z/metrics.jsonl" "$WORK/dp2_z${z}_nvme/metrics.jsonl" || return 1
        [ -d "$WORK/d2_$z" ] && [ -z "$(ls -A "$WORK/d2_$z")" ] || { ls -lR "$WORK/d2_$z"; return 1; }
    done
    # what plait check predicts is what the model allocated (the windows, not the moments)
    "$PY" - "$WORK/nvme1/run.json" "$WORK/none/run.json" <<'PYEOF'
import json, sys
off, mem = (json.load(open(p))["memory"]["ranks"][0] for p in sys.argv[1:3])
want = {k: v for k, v in off["predicted"].items() if k != "comm_rings"}
assert want == off["allocated"], (want, off["allocated"])
assert off["allocated"]["optimizer"] < mem["allocated"]["optimizer"] / 10, (off, mem)
PYEOF
}

# Windows of whole pages (1 MiB: here the whole slice, 138,752 bytes, 33 pages and a
# tail) move past the page cache where the file system takes O_DIRECT (the log says
# which), the tail through it: the in-memory bits either way (strace, once: each step's
# read and write of 135,168 bytes on the O_DIRECT descriptor, the 3,584-byte tail on the
# other)
test_page_windows_move_past_the_page_cache() {
    # shellcheck disable=SC2046
    run direct --set parallel.offload=nvme --set parallel.offload_dir="$WORK/d7" \
        --set parallel.offload_window_mb=1 &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/direct/metrics.jsonl" || return 1
    mkdir -p "$WORK/probe"
    if "$PY" -c 'import os, sys; os.close(os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_DIRECT))' \
        "$WORK/probe/f" 2>/dev/null; then
        grep -q 'parallel.offload "nvme": the moments.* windows move past the page cache (O_DIRECT)' \
            "$WORK/direct.log" || { cat "$WORK/direct.log"; return 1; }
    else
        grep -q 'the file system refuses O_DIRECT' "$WORK/direct.log" || { cat "$WORK/direct.log"; return 1; }
    fi
}

test_host_on_a_cpu_rank_changes_nothing_and_says_so() {
    run host --set parallel.offload=host && metrics_equal "$WORK/none/metrics.jsonl" "$WORK/host/metrics.jsonl" &&
        grep -q 'parallel.offload "host": on CPU ranks the optimizer state is in host memory already; nothing moves' \
            "$WORK/host.log" || { cat "$WORK/host.log"; return 1; }
}

test_stopped_mid_step_resumes_to_the_bit() {
    local rc=0
    # shellcheck disable=SC2046
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$WORK/stop" \
        "${COMMON[@]}" $(nvme d3) >"$WORK/stop.log" 2>&1 || rc=$?
    [ "$rc" = 75 ] || { echo "exit $rc"; tail "$WORK/stop.log"; return 1; }
    # shellcheck disable=SC2046
    run stop $(nvme d3) && grep -q "resuming from .*step_00000002_0002" "$WORK/stop.log" &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/stop/metrics.jsonl" || { cat "$WORK/stop.log"; return 1; }
}

test_checkpoints_cross_between_offload_and_memory() {
    # the in-memory run's step-8 checkpoint resumed with the moments on disk, and the reverse
    local from
    for from in none nvme1; do
        cp -r "$WORK/$from" "$WORK/cross_$from" &&
            rm -r "$WORK/cross_$from/checkpoints/step_00000012_0000" || return 1
    done
    # shellcheck disable=SC2046
    run cross_none $(nvme d4) && run cross_nvme1 &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/cross_none/metrics.jsonl" &&
        metrics_equal "$WORK/none/metrics.jsonl" "$WORK/cross_nvme1/metrics.jsonl"
}

# 12.7M parameters: 51 MB of fp32 weights, as much of gradients, 102 MB of moments; 250 MB of
# data segment holds them with the moments on disk (measured: 121 MB allocated, 243 MB peak
# resident), not without (207 MB allocated: the model's own buffers fail to allocate)
# 12.7M parameters: 51 MB of weights, 51 of gradients, 102 of moments. Under
# a 176 MiB data limit the in-memory state does not fit (measured: it needs
# about 210 MiB, the process's own memory included) and the offloaded one,
# the moments on disk behind two 4 MiB windows of each, does (about 150 MiB).
test_a_memory_limit_the_moments_do_not_fit_under() {
    cat >"$WORK/big.json" <<JSON
{"model": {"layers": 4, "heads": 8, "hidden": 512, "vocab": 256, "seq_len": 16, "seed": 7},
 "data": {"train": "$WORK/train.bin"},
 "batch": {"micro_batch": 1, "grad_accum": 1},
 "optimizer": {"lr": 1e-3, "warmup_steps": 0},
 "steps": 2, "checkpoint": {"every": 0, "keep": 1}}
JSON
    local rc=0
    (ulimit -d 180000 && OMP_NUM_THREADS=1 "$PLAIT" train "$WORK/big.json" --out "$WORK/big_mem" \
        >"$WORK/big_mem.log" 2>&1) || rc=$?
    [ "$rc" != 0 ] && grep -q "out of memory" "$WORK/big_mem.log" ||
        { echo "in memory under the limit: exit $rc"; tail "$WORK/big_mem.log"; return 1; }
    (ulimit -d 180000 && OMP_NUM_THREADS=1 "$PLAIT" train "$WORK/big.json" --out "$WORK/big_nvme" \
        --set parallel.offload=nvme --set parallel.offload_dir="$WORK/d5" \
        --set parallel.offload_window_mb=4 >"$WORK/big_nvme.log" 2>&1) ||
        { tail "$WORK/big_nvme.log"; return 1; }
    grep -q "finished at step 2/2" "$WORK/big_nvme.log" || { cat "$WORK/big_nvme.log"; return 1; }
}

# the files' space is taken when the run starts: on a disk too small for them (a 64 KiB tmpfs
# in a private mount namespace: nothing outside the test sees it) the run fails at once,
# naming the file, the rank and the bytes
test_a_disk_too_small_fails_at_the_start() {
    mkdir -p "$WORK/small"
    unshare -m bash -s "$WORK/small" "$PLAIT" "$WORK/plan.json" >"$WORK/small.log" 2>&1 <<'SH'
set -u
mount -t tmpfs -o size=64k tmpfs "$1" || exit 3
"$2" train "$3" --out "$1/../small_run" --set parallel.offload=nvme --set parallel.offload_dir="$1" \
    --set data.val=null --set data.val_every=0
SH
    local rc=$?
    [ "$rc" = 1 ] && grep -qE "parallel.offload: $WORK/small/rank-0/adam_[mv].bin \(rank 0\), [0-9]+ bytes: No space left on device" \
        "$WORK/small.log" && ! grep -q "step 1" "$WORK/small.log" || { echo "exit $rc"; cat "$WORK/small.log"; return 1; }
}

test_bad_settings_are_refused_naming_them() {
    expect_error "$WORK/e1.log" 1 'parallel.offload_dir: must name a directory \(on a fast disk\) with parallel.offload "nvme"' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/bad1" --set parallel.offload=nvme || return 1
    expect_error "$WORK/e2.log" 1 'checkpoint.async: cannot be true with parallel.offload "nvme"' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/bad2" $(nvme d6) --set checkpoint.async=true || return 1
    # a directory that cannot be made: under a regular file
    : >"$WORK/a_file"
    # shellcheck disable=SC2046
    expect_error "$WORK/e3.log" any "parallel.offload_dir: $WORK/a_file/rank-0 \(rank 0\): Not a directory" \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/bad3" --set parallel.offload=nvme \
        --set parallel.offload_dir="$WORK/a_file"
}

check nvme_gives_the_in_memory_bits test_nvme_gives_the_in_memory_bits
check page_windows_move_past_the_page_cache test_page_windows_move_past_the_page_cache
check host_on_a_cpu_rank_changes_nothing_and_says_so test_host_on_a_cpu_rank_changes_nothing_and_says_so
check stopped_mid_step_resumes_to_the_bit test_stopped_mid_step_resumes_to_the_bit
check checkpoints_cross_between_offload_and_memory test_checkpoints_cross_between_offload_and_memory
if nm -D "$BUILD/bin/plait-train" 2>/dev/null | grep -q __asan_init; then
    # AddressSanitizer reserves its shadow memory at start, which a data-segment limit refuses
    echo "ok a_memory_limit_the_moments_do_not_fit_under # skip: a sanitized build cannot run under ulimit -d"
else
    check a_memory_limit_the_moments_do_not_fit_under test_a_memory_limit_the_moments_do_not_fit_under
fi
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
    check a_disk_too_small_fails_at_the_start test_a_disk_too_small_fails_at_the_start
else
    echo "ok a_disk_too_small_fails_at_the_start # skip: needs root and unshare (a private tmpfs)"
fi
check bad_settings_are_refused_naming_them test_bad_settings_are_refused_naming_them
finish
