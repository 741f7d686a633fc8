# bench_env.sh — sourced first by the GPT-2 124M benches: strict mode, the
# repository root as the working directory, the build (PLAIT_BUILD), a Python
# with PyTorch (PY), the timed steps (STEPS: BENCH_STEPS, default 10), idle
# OpenMP threads that sleep, and a work directory removed at exit ($work).
# Not a program of its own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/.."
BUILD=${PLAIT_BUILD:-build}
source scripts/python.sh # defines: plait_python
PY=$(plait_python)
STEPS=${BENCH_STEPS:-10}
export OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/plait-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
