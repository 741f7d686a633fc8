#!/usr/bin/env bash
# make bench, part 5 — what offloading the AdamW moments to disk costs a step:
# GPT-2 124M, micro-batch 4, seq 64, fp32, one rank on this machine, trained
# twice in the same environment, the moments in memory and then in files under
# BENCH_OFFLOAD_DIR (parallel.offload "nvme", 64 MiB windows: 1 GB of moments
# read and written each step), with the disk's sequential write and read rate
# measured there by dd in the same script (1 GiB, written through to the disk;
# read back after the page cache dropped the file where it could be dropped).
# Step time: the median of the timed steps (the first warms up); the ratio is
# offloaded / in memory. Not a test: it asserts nothing.
#   BENCH_STEPS        timed steps per run (default 10)
#   BENCH_OFFLOAD_DIR  where the files go (default a temporary directory in /var/tmp)
source "$(dirname "$0")/bench_env.sh" # defines: BUILD PY STEPS work
disk=${BENCH_OFFLOAD_DIR:-$(mktemp -d /var/tmp/plait-offload-disk.XXXXXX)}
trap 'rm -rf "$work" "$disk"/rank-* "$disk/dd.bin"; [ -n "${BENCH_OFFLOAD_DIR:-}" ] || rmdir "$disk"' EXIT

source bench/gpt2_124m.sh # defines: L NH C V VP MAXT, gpt2_tokens, gpt2_plan
T=64 B=4
gpt2_tokens "$work/tokens.bin"
gpt2_plan "$work/plan.json" "$work/tokens.bin" "$T" "$B" $((STEPS + 1)) '"parallel": {"device": "cpu"}'

echo "== the disk under $disk ($(df -h --output=fstype,size "$disk" | tail -1 | xargs))"
dd if=/dev/zero of="$disk/dd.bin" bs=1M count=1024 conv=fdatasync 2>&1 | tail -1 | sed 's/^/  write: /'
dd if="$disk/dd.bin" of=/dev/null bs=1M iflag=nocache 2>/dev/null || true # drop it from the cache
dd if="$disk/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1 | sed 's/^/  read:  /'

run() { # NAME [--set ...]
    local name=$1
    shift
    "$BUILD/bin/plait" train "$work/plan.json" --out "$work/$name" "$@" >"$work/$name.log" 2>&1 ||
        { tail -n 20 "$work/$name.log"; exit 1; }
}
echo "== GPT-2 124M, micro-batch $B, seq $T, fp32, one rank, $STEPS timed steps each"
run memory
run nvme --set parallel.offload=nvme --set parallel.offload_dir="$disk"
"$PY" - "$work" <<'PYEOF'
import json, statistics, sys
work = sys.argv[1]
def median_ms(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r][1:]
    return statistics.median(r["ms"] for r in rows), len(rows)
mem, n = median_ms("memory")
off, _ = median_ms("nvme")
print(f"  step time   in memory {mem:8.1f} ms   moments on disk {off:8.1f} ms   ratio {off / mem:5.2f}"
      f"   (medians of {n} steps)")
PYEOF
