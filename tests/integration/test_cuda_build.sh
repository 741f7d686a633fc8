#!/usr/bin/env bash
# test_cuda_build.sh — the CUDA backend as far as a machine without a GPU can
# check it: its objects hold sm_80 and sm_90 code (the fatbinary's entries,
# what cuobjdump --list-elf lists), they form a library of their own linked to
# cuBLASLt and the CUDA runtime that plait-train loads only where a driver is,
# --selftest says it skipped (exit 77) and its harness passes with the
# CPU standing in for the GPU, parallel.device "cuda" is
# refused naming parallel.device and "auto" falls back to the CPU saying why,
# parallel.backend "nccl" on the CPU is refused naming parallel.backend.
# Then the GPU checks (tests/gpu/test_cuda.sh): run where a GPU is, else each
# printed as skipped. In a build without CUDA (make CUDA=0, the sanitized
# build) the object checks are skipped and the rest still hold.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, BUILD, WORK, check, expect_error, tiny_plan

TRAIN=$BUILD/bin/plait-train
CUDA_SO=$BUILD/lib/plait/libplait_cuda.so
OBJS=()
for cu in "$ROOT"/kernels/cuda/*.cu; do
    o=$BUILD/obj/kernels/cuda/$(basename "$cu" .cu).o
    [ -e "$o" ] && OBJS+=("$o")
done
[ ${#OBJS[@]} -gt 0 ] && HAVE_CUDA_OBJS=1 || HAVE_CUDA_OBJS=0
GPU=0
"$TRAIN" --selftest >/dev/null 2>&1 || [ $? -ne 77 ] && GPU=1

# every object's fatbinary (.nv_fatbin) holds an ELF for sm_80 and one for sm_90
test_cuda_objects_hold_sm80_and_sm90() {
    local o
    for o in "${OBJS[@]}"; do
        objcopy -O binary --only-section=.nv_fatbin "$o" "$WORK/fatbin" || return 1
        "$PY" - "$WORK/fatbin" "$o" <<'PYEOF' || return 1
import struct, sys
d = open(sys.argv[1], "rb").read()
magic, _, header, size = struct.unpack_from("<IHHQ", d, 0)
assert magic == 0xBA55ED50, f"{sys.argv[2]}: no fatbinary (magic {magic:#x})"
elf, p = set(), header
while p < header + size:  # entries: kind (1 PTX, 2 ELF), ..., sm at +28
    kind, _, entry_header, payload = struct.unpack_from("<HHII", d, p)
    if kind == 2:
        elf.add(struct.unpack_from("<I", d, p + 28)[0])
    p += entry_header + payload
missing = {80, 90} - elf
print(f"{sys.argv[2]}: ELF for sm_{', sm_'.join(map(str, sorted(elf)))}")
sys.exit(f"{sys.argv[2]}: no code for sm_{missing}" if missing else 0)
PYEOF
    done
}

# the self-test's harness (inputs, table, verdict, exit code) with the CPU
# standing in for the GPU: every line ok, exit 0
test_selftest_harness_passes_cpu_against_cpu() {
    PLAIT_SELFTEST_TWIN=cpu "$TRAIN" --selftest >"$WORK/twin.txt" 2>&1 || { cat "$WORK/twin.txt"; return 1; }
    grep -q "^plait-train --selftest: passed: 0 of [1-9][0-9]* checks failed" "$WORK/twin.txt" ||
        { cat "$WORK/twin.txt"; return 1; }
    ! grep -E "FAIL|DIFFERS" "$WORK/twin.txt"
}

# the backend is its own shared object, linked to cuBLASLt and the CUDA
# runtime; plait-train is not linked to cuBLASLt (~150 MB resident once loaded)
test_cuda_backend_is_a_library_plait_train_loads() {
    local needed
    needed=$(readelf -d "$CUDA_SO" | grep NEEDED)
    grep -q libcublasLt <<<"$needed" && grep -q libcudart <<<"$needed" || { echo "$needed"; return 1; }
    ! readelf -d "$TRAIN" | grep NEEDED | grep -q libcublasLt || return 1
    # nor to NCCL or the CUDA runtime: the nccl backend loads them for a GPU rank
    # (runtime/comm/nccl_api.h), so a CPU-only host starts it without either
    ! readelf -d "$TRAIN" | grep NEEDED | grep -Eq "libnccl|libcudart" ||
        { readelf -d "$TRAIN" | grep NEEDED; return 1; }
    # it exports its entry table and nothing else
    [ "$(nm -D --defined-only "$CUDA_SO" | awk '{print $3}')" = plait_cuda_entry ] ||
        { nm -D --defined-only "$CUDA_SO"; return 1; }
}

# without an NVIDIA driver nothing is loaded; named explicitly, the backend
# loads (nothing undefined, the entry's version matches) and finds no device
test_a_machine_without_driver_never_loads_cublaslt() {
    LD_DEBUG=libs "$TRAIN" --selftest >"$WORK/ld.log" 2>&1
    [ $? -eq 77 ] || { tail -n 5 "$WORK/ld.log"; return 1; }
    ! grep -q "libcublasLt" "$WORK/ld.log" || { grep libcublasLt "$WORK/ld.log"; return 1; }
    LD_DEBUG=libs PLAIT_CUDA_LIB=$CUDA_SO "$TRAIN" --selftest >"$WORK/ld2.log" 2>&1
    [ $? -eq 77 ] || { tail -n 5 "$WORK/ld2.log"; return 1; }
    grep -q "calling init: .*libcublasLt" "$WORK/ld2.log" &&
        grep -q "^plait-train --selftest: skipped: no CUDA device here" "$WORK/ld2.log" ||
        { grep -v "^ *[0-9]*:" "$WORK/ld2.log"; return 1; }
}

test_selftest_without_gpu_exits_77() {
    expect_error "$WORK/selftest.log" 77 "^plait-train --selftest: skipped: .*(no CUDA|CUDA backend)" \
        "$TRAIN" --selftest
}

test_device_cuda_without_gpu_is_refused_naming_parallel_device() {
    expect_error "$WORK/cuda.log" 1 'parallel.device: "cuda" is not available: .*use "cpu" or "auto"' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/run_cuda" --set parallel.device=cuda \
        --set steps=4
}

test_device_auto_without_gpu_trains_on_the_cpu_saying_why() {
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/run_auto" --set steps=4 >"$WORK/auto.log" 2>&1 ||
        { cat "$WORK/auto.log"; return 1; }
    [ -s "$WORK/run_auto/metrics.jsonl" ] || return 1
    if [ "$HAVE_CUDA_OBJS" -eq 1 ]; then
        grep -q 'parallel.device "auto": .*; training on the CPU' "$WORK/auto.log" ||
            { cat "$WORK/auto.log"; return 1; }
    fi
}

# nccl moves GPU memory: with ranks on the CPU it is refused naming parallel.backend, on one
# rank and on two (whose collectives would be nccl's)
test_backend_nccl_on_the_cpu_is_refused_naming_parallel_backend() {
    # device "cpu": the plan's own rule, before anything starts
    expect_error "$WORK/nccl0.log" 1 \
        'parallel.backend: "nccl" moves GPU memory, but parallel.device "cpu" trains on the CPU' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/run_nccl0" --set parallel.device=cpu \
        --set parallel.backend=nccl --set steps=4 || return 1
    # device "auto" on this GPU-less machine: the rank, or the placement of several
    expect_error "$WORK/nccl1.log" 1 \
        'parallel.backend: "nccl" moves GPU memory, but rank [0-9]+ trains on the CPU' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/run_nccl1" --set parallel.backend=nccl \
        --set steps=4 || return 1
    expect_error "$WORK/nccl2.log" any \
        'parallel.backend: "nccl" moves GPU memory, but the ranks on node [^ ]+ train on its CPU' \
        "$PLAIT" train "$WORK/plan.json" --out "$WORK/run_nccl2" --set parallel.backend=nccl \
        --set parallel.dp=2 --set steps=4
}

tiny_plan "$WORK/plan.json"
if [ "$HAVE_CUDA_OBJS" -eq 1 ]; then
    check cuda_objects_hold_sm80_and_sm90 test_cuda_objects_hold_sm80_and_sm90
    check cuda_backend_is_a_library_plait_train_loads test_cuda_backend_is_a_library_plait_train_loads
else
    echo "ok cuda_objects_hold_sm80_and_sm90 # SKIP this build has no CUDA backend"
    echo "ok cuda_backend_is_a_library_plait_train_loads # SKIP this build has no CUDA backend"
fi
if [ "$HAVE_CUDA_OBJS" -eq 1 ] && [ "$GPU" -eq 0 ]; then
    check a_machine_without_driver_never_loads_cublaslt test_a_machine_without_driver_never_loads_cublaslt
fi
if [ "$GPU" -eq 0 ]; then
    check selftest_without_gpu_exits_77 test_selftest_without_gpu_exits_77
    check device_cuda_without_gpu_is_refused_naming_parallel_device \
        test_device_cuda_without_gpu_is_refused_naming_parallel_device
    check device_auto_without_gpu_trains_on_the_cpu_saying_why \
        test_device_auto_without_gpu_trains_on_the_cpu_saying_why
fi
check selftest_harness_passes_cpu_against_cpu test_selftest_harness_passes_cpu_against_cpu
check backend_nccl_on_the_cpu_is_refused_naming_parallel_backend \
    test_backend_nccl_on_the_cpu_is_refused_naming_parallel_backend
# the GPU checks: run here when there is a GPU, else each reported as skipped
bash "$(dirname "$0")/../gpu/test_cuda.sh" --skip-ok || failures=$((failures + 1))
finish
