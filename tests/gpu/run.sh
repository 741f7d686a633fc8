#!/usr/bin/env bash
# The nccl collective backend on this machine's GPUs: builds plait (which finds
# NCCL under NCCL_HOME, CUDA_HOME=/usr/local/cuda, or /usr/include and
# /usr/lib/x86_64-linux-gnu) and runs tests/gpu/test_nccl.c, one rank per GPU
# (up to 8). One GPU runs the collectives on a world of one rank and the
# deadline test with a missing peer; two or more run everything. Then
# tests/gpu/test_multi_gpu.sh: plait train on 2 GPUs (tp 2, dp 2, pp 2, bf16)
# against 1 GPU, and 2 ranks sharing one GPU over "socket" (PLAIT_RANKS_PER_GPU=2;
# each check "ok NAME # SKIP why" without the GPUs it needs). Not
# part of make test. Usage: tests/gpu/run.sh   (or: make test-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j"$(nproc)" all >/dev/null
if [ ! -x build/tests/gpu/test_nccl ]; then
    echo "tests/gpu: this build has no NCCL (nccl.h, libnccl, cuda_runtime.h and libcudart" >&2
    echo "were not found: set NCCL_HOME or CUDA_HOME and run make again)" >&2
    exit 1
fi
rc=0
build/tests/gpu/test_nccl "$@" || rc=$?
bash tests/gpu/test_multi_gpu.sh --skip-ok || rc=1
exit "$rc"
