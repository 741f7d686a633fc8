#!/usr/bin/env bash
# gpu_check.sh — make gpu-check: what one GPU machine can tell about plait, in
# one command and one report. In order: the build libraries (a missing one named
# by its Debian/Ubuntu package, exit 2), the build, plait-train --selftest (each
# CUDA op against the CPU's at GPT-2 124M's shapes and small odd ones), the GPU
# checks of tests/gpu/test_cuda.sh (the PyTorch referees, GPT-2's and the
# Llama's, a run repeated to the bit, SIGTERM mid-step resumed to the bit, a GPU
# checkpoint resumed on the CPU, fp8, a grouped-query Llama and an MoE GPT-2 against
# the CPU and to the bit), one compute-sanitizer memcheck of a tiny GPT-2 and a tiny Llama
# run, the multi-GPU checks
# (tests/gpu/run.sh: tp 2, dp 2 with buckets, ZeRO 1, pp 2 over NCCL against one
# GPU, cp 2 and an MoE GPT-2 at ep 2 against the CPU; with 2 GPUs or more, else each
# skipped saying so), then the bench
# (bench/bench_cuda.sh). It reuses those scripts and only runs them: each stage
# under `timeout` with its own limit, all of them within GPU_CHECK_BUDGET_S; a
# stage that fails or hangs does not stop the next (the build's does).
#
# Writes one markdown report, $OUT/gpu-check.md when OUT is set (else
# build/gpu-check.md), rewritten after every stage, and the full log beside it
# (gpu-check.log); prints the report's path. Exit status: 0 every check passed,
# 1 one failed (or ran out of time), 2 a build library is missing, 77 no GPU
# here (every GPU check skipped, each saying why).
#   GPU_CHECK_QUICK=1    the bench at 16x1024 only, 5 timed steps, no PyTorch
#   GPU_CHECK_BUDGET_S   the whole run's limit in seconds (default 540: 9 minutes)
#   GPU_CHECK_BUILD=0    no build: the binaries in PLAIT_BUILD as they are
#   GPU_CHECK_STAGES     the GPU stages to run, of "selftest checks memcheck multi_gpu
#                        bench" (default all; the others recorded as skipped), so a
#                        session can spread them over two device calls
#   BENCH_STEPS, BENCH_BATCHES, BENCH_TORCH, LLMC_BIN   passed to the bench (over
#                        GPU_CHECK_QUICK's choices)
#   PLAIT_BUILD          the build directory (default build), PLAIT_PYTHON the
#                        Python with torch (default: scripts/python.sh finds one)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
source scripts/python.sh    # defines: plait_python
source scripts/build_libs.sh # defines: build_libs_cairo (build_libs_check runs in its stage)
source scripts/selftest_why.sh # defines: selftest_why

MAKE_BUILD=${PLAIT_BUILD:-build} # as given to make (its dependency files name it so)
BUILD=$MAKE_BUILD
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
export PLAIT_BUILD=$BUILD
BUDGET=${GPU_CHECK_BUDGET_S:-540}
QUICK=${GPU_CHECK_QUICK:-0}
if [ -n "${OUT:-}" ]; then DEST=$OUT; else DEST=$BUILD; fi
mkdir -p "$DEST" || exit 1
REPORT=$DEST/gpu-check.md
RAW=$DEST/gpu-check.log
PY=$(plait_python)
export PLAIT_PYTHON=$PY
START=$(date +%s.%N)

work=$(mktemp -d /tmp/plait-gpu-check.XXXXXX)
mkdir -p "$work/logs"
: >"$work/stages.tsv"
: >"$RAW"
stage_pid="" stage_name="" stage_t0="" stage_limit=""
trap 'rm -rf "$work"' EXIT

elapsed() { awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%d", b - a }'; }
say() { echo "gpu-check: $*" | tee -a "$RAW"; }

# meta KEY VALUE: a line of the report's header
meta() { printf '%s\t%s\n' "$1" "$2" >>"$work/meta.tsv"; }

# record NAME STATUS SECONDS LIMIT RC NOTE [EXPECTED-CHECKS]: a stage's line in the report
record() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "${7:-}" >>"$work/stages.tsv"
    say "$1: $2 (${3}s)${6:+: $6}"
}

# the report, from what is recorded so far (again after every stage: a run cut
# short still leaves one)
report() {
    local py=$PY
    "$py" -c 'import sys' 2>/dev/null || py=python3
    if ! "$py" scripts/gpu_check_report.py "$work" "$REPORT" "$(elapsed)" "$BUDGET" "$QUICK" \
        2>>"$RAW"; then
        { echo "# plait gpu-check"; echo; echo "No Python could write the report; the stages:"
          echo; sed 's/^/    /' "$work/stages.tsv"; } >"$REPORT"
    fi
}

# run_stage NAME LIMIT COMMAND...: COMMAND under timeout (the lesser of LIMIT and
# what is left of the budget), its output in logs/NAME.log and the raw log;
# sets $rc (124: out of time) and $secs; 1 when there was no time left to start
run_stage() {
    local name=$1 limit=$2 left t0
    shift 2
    left=$((BUDGET - $(elapsed) - 5))
    if [ "$left" -lt 10 ]; then
        rc=-1 secs=0
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    stage_limit=$limit
    say "$name: started (limit ${limit}s)"
    echo "=== $name: $*" >>"$RAW"
    t0=$(date +%s.%N)
    stage_name=$name stage_t0=$t0
    timeout -k 15 "$limit" "$@" >"$work/logs/$name.log" 2>&1 </dev/null &
    stage_pid=$!
    wait "$stage_pid"
    rc=$?
    stage_pid="" stage_name=""
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    cat "$work/logs/$name.log" >>"$RAW"
    return 0
}

# a SIGTERM or Ctrl-C: the stage's whole process group stopped (timeout passes
# the signal on), the stage recorded as failed, the report written
# shellcheck disable=SC2317 # (called by the trap)
interrupted() {
    if [ -n "$stage_pid" ]; then
        kill -TERM "$stage_pid" 2>/dev/null && wait "$stage_pid"
        cat "$work/logs/$stage_name.log" >>"$RAW"
        record "$stage_name" fail "$(awk -v a="$stage_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
            "$stage_limit" 143 "gpu-check was stopped by a signal during this stage"
    else
        record interrupted fail "$(elapsed)" "$BUDGET" 143 "gpu-check was stopped by a signal"
    fi
    report
    echo "gpu-check: report: $REPORT"
    exit 1
}
trap interrupted TERM INT HUP

# tap_status NAME: the status of a stage that prints "ok NAME" lines, from its
# lines and $rc
tap_status() {
    local log=$work/logs/$1.log passed failed skipped
    failed=$(grep -c '^not ok ' "$log")
    skipped=$(grep -ci '^ok .*# skip' "$log")
    passed=$(($(grep -c '^ok ' "$log") - skipped))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo timeout
    elif [ "$failed" -gt 0 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; }; then echo fail
    elif [ "$passed" -eq 0 ] && [ "$skipped" -gt 0 ]; then echo skip
    elif [ "$passed" -eq 0 ]; then echo fail
    else echo ok
    fi
}

# tap_stage NAME LIMIT "CHECKS" COMMAND...: a stage of named checks, recorded
tap_stage() {
    local name=$1 limit=$2 checks=$3
    shift 3
    if ! run_stage "$name" "$limit" "$@"; then
        record "$name" notrun 0 0 - "the ${BUDGET}s budget (GPU_CHECK_BUDGET_S) was spent" "$checks"
        return
    fi
    local status note log=$work/logs/$name.log
    status=$(tap_status "$name")
    note="$(grep -c '^ok ' "$log") ok ($(grep -ci '^ok .*# skip' "$log") of them skipped), $(grep -c '^not ok ' "$log") not ok"
    [ "$status" = timeout ] && note+="; stopped at its ${stage_limit}s limit"
    record "$name" "$status" "$secs" "$stage_limit" "$rc" "$note" "$checks"
}

# ---- the machine ------------------------------------------------------------------------
subject=$(git log -1 --format=%s 2>/dev/null)
[ ${#subject} -gt 72 ] && subject="${subject:0:72}…"
meta commit "$(git log -1 --format=%h 2>/dev/null) $subject$(git diff --quiet HEAD 2>/dev/null || echo ' (and uncommitted changes)')"
meta started "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
meta host "$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
gpus=0 # as tests/gpu/test_multi_gpu.sh counts them
if command -v nvidia-smi >/dev/null; then
    gpus=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    query=name,driver_version,memory.total,compute_cap
    smi=$(timeout 30 nvidia-smi --query-gpu=$query --format=csv,noheader 2>/dev/null) ||
        smi=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)
    while IFS= read -r line; do [ -n "$line" ] && meta gpu "$line"; done <<<"$smi"
    meta "CUDA (driver)" "$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
else
    meta gpu "none: no nvidia-smi here"
fi
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
meta nvcc "$([ -x "$NVCC" ] && "$NVCC" --version | sed -n 's/.*release \([^,]*\), \(V[0-9.]*\).*/\1 (\2)/p' || echo "not found ($NVCC)")"
meta python "$PY $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "(no torch)")"
cs=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null)
meta compute-sanitizer "${cs:-not found}"
[ "$QUICK" = 1 ] && meta mode "GPU_CHECK_QUICK=1: the bench at 16x1024 only, no PyTorch, fewer steps"
say "report: $REPORT (log: $RAW); $gpus GPU(s); budget ${BUDGET}s"

# ---- the build ---------------------------------------------------------------------------
run_stage libraries 60 bash -c "source scripts/build_libs.sh && build_libs_check"
if [ "$rc" -ne 0 ]; then
    record libraries fail "$secs" 60 "$rc" "$(grep -m1 'apt-get install' "$work/logs/libraries.log" | sed 's/^ *//')"
    report
    cat "$work/logs/libraries.log"
    echo "gpu-check: report: $REPORT"
    exit 2
fi
make_args=(-j"$(nproc)" all BUILD="$MAKE_BUILD")
libs_note="every library the build links found"
if ! build_libs_cairo; then
    make_args+=(CAIRO=0)
    libs_note+="; no cairo (pkg-config): built with CAIRO=0, without plait plot (libcairo2-dev)"
fi
record libraries ok "$secs" 60 0 "$libs_note"

if [ "${GPU_CHECK_BUILD:-1}" = 0 ]; then
    record build skip 0 0 - "GPU_CHECK_BUILD=0: the binaries in $BUILD as they are"
elif ! run_stage build 420 make "${make_args[@]}"; then
    record build notrun 0 0 - "the ${BUDGET}s budget was spent"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record build timeout "$secs" "$stage_limit" "$rc" "stopped at its ${stage_limit}s limit"
    report
    echo "gpu-check: the build ran out of time; report: $REPORT"
    exit 1
elif [ "$rc" -ne 0 ]; then
    record build fail "$secs" "$stage_limit" "$rc" \
        "$(grep -m1 -E ': error:|fatal error|\*\*\*' "$work/logs/build.log" | cut -c1-160)"
    report
    echo "gpu-check: the build failed; report: $REPORT"
    exit 1
else
    note="make ${make_args[*]}"
    [ -e "$BUILD/lib/plait/libplait_cuda.so" ] ||
        note+="; no CUDA backend (nvcc, cublasLt.h, libcudart, libcublasLt not found under CUDA_HOME=${CUDA_HOME:-/usr/local/cuda})"
    record build ok "$secs" "$stage_limit" 0 "$note"
fi
report

# ---- the GPU -----------------------------------------------------------------------------
STAGES=" ${GPU_CHECK_STAGES:-selftest checks memcheck multi_gpu bench} "
STAGES=${STAGES//,/ }
for s in $STAGES; do
    case $s in selftest | checks | memcheck | multi_gpu | bench) ;;
    *) echo "gpu-check: GPU_CHECK_STAGES: no stage $s (the stages: selftest checks memcheck multi_gpu bench)" >&2
       exit 2 ;;
    esac
done
# stage NAME [EXPECTED-CHECKS]: whether GPU_CHECK_STAGES runs it, else it is recorded skipped
stage() {
    [[ "$STAGES" == *" $1 "* ]] && return 0
    record "$1" skip 0 0 - "not in GPU_CHECK_STAGES" "${2:-}"
    return 1
}
no_gpu=
if ! stage selftest cuda_selftest; then
    :
elif run_stage selftest 300 "$BUILD/bin/plait-train" --selftest; then
    why=$(selftest_why "$work/logs/selftest.log")
    summary=$(grep -m1 -E '^plait-train --selftest: (passed|FAILED)' "$work/logs/selftest.log")
    if [ "$rc" -eq 77 ] && [ "$gpus" -gt 0 ]; then
        record selftest fail "$secs" "$stage_limit" "$rc" "nvidia-smi lists $gpus GPU(s), but the selftest found none usable: $why" cuda_selftest
    elif [ "$rc" -eq 77 ]; then
        no_gpu=$why
        record selftest skip "$secs" "$stage_limit" "$rc" "$why" cuda_selftest
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        record selftest timeout "$secs" "$stage_limit" "$rc" "stopped at its ${stage_limit}s limit" cuda_selftest
    else
        record selftest "$([ "$rc" -eq 0 ] && echo ok || echo fail)" "$secs" "$stage_limit" "$rc" \
            "${summary#plait-train --selftest: }" cuda_selftest
    fi
else
    record selftest notrun 0 0 - "the ${BUDGET}s budget was spent" cuda_selftest
fi
report

CHECKS=(cuda_torch_referee_fp32 cuda_torch_referee_bf16 cuda_llama_torch_referee_fp32
    cuda_llama_torch_referee_bf16 cuda_bf16_attention_tracks_fp32_attention
    cuda_run_equals_cuda_run
    cuda_sigterm_mid_step_resumes_to_the_bit cuda_checkpoint_resumes_on_the_cpu
    cuda_fp8_tracks_the_cpu cuda_fp8_resumes_to_the_bit cuda_llama_tracks_the_cpu
    cuda_llama_run_equals_cuda_run cuda_moe_tracks_the_cpu cuda_moe_run_equals_cuda_run
    cuda_offload_equals_cuda_run cuda_offload_resumes_to_the_bit)
stage checks "${CHECKS[*]}" &&
    tap_stage checks 300 "${CHECKS[*]}" bash tests/gpu/test_cuda.sh --skip-ok "${CHECKS[@]}"
report
stage memcheck cuda_compute_sanitizer_memcheck &&
    tap_stage memcheck 240 cuda_compute_sanitizer_memcheck \
        bash tests/gpu/test_cuda.sh --skip-ok cuda_compute_sanitizer_memcheck
report
# ranks sharing one GPU (PLAIT_RANKS_PER_GPU, parallel.backend "socket"): one GPU is enough
SHARED=(gpu1x2_tp2_matches_one_gpu gpu1x2_dp2_zero1_matches_one_gpu gpu1x2_dp2_zero3_matches_one_gpu
    gpu1x2_pp2_matches_one_gpu gpu1x2_cp2_tracks_the_cpu gpu1x2_ep2_moe_tracks_the_cpu
    gpu1x4_dualpipev_ep2_lanes_track_the_cpu)
if ! stage multi_gpu "${SHARED[*]}"; then
    :
elif [ "$gpus" -ge 2 ]; then # the nccl backend's own tests, then plait train on 2 GPUs (and shared)
    tap_stage multi_gpu 300 "" bash tests/gpu/run.sh
elif [ "$gpus" -ge 1 ]; then # the 2-GPU checks skipped, saying why; the shared ones run
    tap_stage multi_gpu 240 "${SHARED[*]}" bash tests/gpu/test_multi_gpu.sh --skip-ok
else # each check printed as skipped, saying why
    tap_stage multi_gpu 60 "" bash tests/gpu/test_multi_gpu.sh --skip-ok
fi
report

# ---- the bench ---------------------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
    export BENCH_BATCHES=${BENCH_BATCHES:-16} BENCH_TORCH=${BENCH_TORCH:-0} BENCH_STEPS=${BENCH_STEPS:-5}
fi
if ! stage bench; then
    :
elif ! run_stage bench 600 bash bench/bench_cuda.sh; then
    record bench notrun 0 0 - "the ${BUDGET}s budget was spent"
elif [ "$rc" -eq 77 ] && [ "$gpus" -gt 0 ]; then
    record bench fail "$secs" "$stage_limit" "$rc" "nvidia-smi lists $gpus GPU(s), but the bench found none usable"
elif [ "$rc" -eq 77 ]; then
    record bench skip "$secs" "$stage_limit" "$rc" "${no_gpu:-no GPU here}: nothing measured"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record bench timeout "$secs" "$stage_limit" "$rc" "stopped at its ${stage_limit}s limit (what it measured is below)"
else
    record bench "$([ "$rc" -eq 0 ] && echo ok || echo fail)" "$secs" "$stage_limit" "$rc" \
        "BENCH_BATCHES=${BENCH_BATCHES:-16 32} BENCH_STEPS=${BENCH_STEPS:-10} BENCH_TORCH=${BENCH_TORCH:-1}"
fi
report

# ---- the verdict -------------------------------------------------------------------------
status=0
if cut -f2 "$work/stages.tsv" | grep -qxE 'fail|timeout|notrun'; then
    status=1
elif [ -n "$no_gpu" ]; then
    status=77
fi
meta exit "$status"
report
echo
cat "$REPORT"
echo
say "report: $REPORT (full log: $RAW); exit $status"
exit "$status"
