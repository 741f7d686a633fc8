#!/usr/bin/env bash
# make bench-comm — all-reduce and all-to-all bus bandwidth of plait's socket
# backend (build/bin/comm-bench) beside Open MPI's MPI_Allreduce and
# MPI_Alltoallv (every rank size/N to each), same sizes, same
# method (warm-up, trials of ~50 ms, the slowest rank's time, the median
# trial), in one run. Rounds alternate plait and Open MPI; each size's busbw
# is the median over rounds (with one round, over its trials), and the ratio
# is plait / Open MPI. Both oversubscribe the CPUs alike (8 ranks on 2 CPUs
# here); Open MPI runs with its defaults, unbound. Not a test:
# it asserts nothing; the goal (>= 0.8 for >= 1 MiB) is printed beside it.
#   BENCH_COMM_RANKS      rank counts (default "4 8")
#   BENCH_COMM_MAX_BYTES  largest size (default 256M; from 1K, x4)
#   BENCH_COMM_ROUNDS     rounds per implementation (default 1: about 45 s on 2 CPUs)
#   BENCH_COMM_OPS        operations (default "allreduce alltoall"; all-to-all up to 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PLAIT_BUILD:-build}
RANKS=${BENCH_COMM_RANKS:-4 8}
MAX=${BENCH_COMM_MAX_BYTES:-256M}
ROUNDS=${BENCH_COMM_ROUNDS:-1}
OPS=${BENCH_COMM_OPS:-allreduce alltoall}
work=$(mktemp -d /tmp/plait-comm-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

to_bytes() { numfmt --from=iec "$1"; }
max_bytes=$(to_bytes "$MAX")

# Open MPI's twin of comm-bench: the same loop around MPI_Allreduce
have_mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    cat >"$work/mpi_bench.c" <<'CEOF'
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* one operation of the run: an all-reduce of count floats, or (a2a) an
 * all-to-all of count/n floats to each rank (MPI_Alltoallv's even case) */
struct op {
    int a2a, n, rank, count, *counts, *displs;
    float *s, *r;
};
static void once(const struct op *o)
{
    if (o->a2a)
        MPI_Alltoallv(o->s, o->counts, o->displs, MPI_FLOAT, o->r, o->counts, o->displs, MPI_FLOAT,
                      MPI_COMM_WORLD);
    else
        MPI_Allreduce(o->s, o->r, o->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}
static double slowest(double t)
{
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}
/* the same loop as comm-bench: warm-up, trials of ~50 ms, the slowest rank, the median */
static void bench(const struct op *o)
{
    int n = o->n, count = o->count, block = count / n;
    size_t b = (size_t)count * 4;
    for (int i = 0; i < count; i++) o->s[i] = (float)((o->rank + 1) * (i % 7 + 1));
    double t0 = MPI_Wtime();
    once(o);
    double warm = MPI_Wtime() - t0;
    float want = o->a2a ? (float)(n * ((o->rank * block + block - 1) % 7 + 1))
                        : (float)(n * (n + 1) / 2 * ((count - 1) % 7 + 1));
    if (count && o->r[count - 1] != want) MPI_Abort(MPI_COMM_WORLD, 1);
    int large = b >= ((size_t)16 << 20);
    if (!large) {
        once(o);
        warm = fmin(warm, MPI_Wtime() - t0 - warm);
    }
    warm = slowest(warm);
    int iters = warm > 0 ? (int)(0.05 / warm) : 1000;
    iters = iters < 1 || large ? 1 : iters > 1000 ? 1000 : iters;
    int trials = large ? 3 : 5;
    double t[5];
    for (int k = 0; k < trials; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) once(o);
        t[k] = slowest((MPI_Wtime() - t0) / iters);
    }
    qsort(t, (size_t)trials, sizeof t[0], cmp);
    double med = t[trials / 2], algbw = (double)b / med / 1e9;
    if (o->rank == 0)
        printf("%12zu %12d  float %6s %12.2f %10.3f %10.3f\n", b, count, o->a2a ? "none" : "sum",
               med * 1e6, algbw, algbw * (o->a2a ? 1.0 : 2.0) * (n - 1) / n);
    fflush(stdout);
}
int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    struct op o = {.a2a = argc > 2 && argv[2][0] == 'a' && argv[2][3] == 't'}; /* "alltoall" */
    MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &o.n);
    size_t max = (size_t)atof(argv[1]);
    o.s = malloc(max), o.r = malloc(max);
    o.counts = malloc(sizeof(int) * (size_t)o.n), o.displs = malloc(sizeof(int) * (size_t)o.n);
    for (size_t b = 1024; b <= max; b *= 4) {
        int block = (int)(b / 4) / o.n;
        o.count = o.a2a ? block * o.n : (int)(b / 4);
        for (int i = 0; i < o.n; i++) o.counts[i] = block, o.displs[i] = i * block;
        bench(&o);
    }
    free(o.s);
    free(o.r);
    free(o.counts);
    free(o.displs);
    MPI_Finalize();
    return 0;
}
CEOF
    mpicc -O2 -o "$work/mpi-bench" "$work/mpi_bench.c" -lm && have_mpi=1
fi
[ "$have_mpi" = 1 ] || echo "comm-bench: no Open MPI (apt-get install openmpi-bin libopenmpi-dev): plait alone"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

for op in $OPS; do
op_max=$max_bytes
if [ "$op" = alltoall ] && [ "$op_max" -gt $((64 << 20)) ]; then op_max=$((64 << 20)); fi
echo
echo "== $op float32, 1K..$(numfmt --to=iec "$op_max"), ranks: $RANKS, rounds: $ROUNDS, $(nproc) CPUs"
for round in $(seq "$ROUNDS"); do
    for n in $RANKS; do
        "$BUILD/bin/comm-bench" --ranks "$n" --max-bytes "$op_max" --op "$op" >"$work/plait_${n}_$round.txt"
        if [ "$have_mpi" = 1 ]; then
            mpirun -np "$n" --oversubscribe --bind-to none "$work/mpi-bench" "$op_max" "$op" \
                >"$work/mpi_${n}_$round.txt" 2>"$work/mpi_${n}_$round.err" ||
                { cat "$work/mpi_${n}_$round.err"; exit 1; }
        fi
    done
done
sed -n '1p' "$work/plait_$(echo "$RANKS" | cut -d' ' -f1)_1.txt"
[ "$have_mpi" = 1 ] && echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'): \
mpirun --oversubscribe --bind-to none, $([ "$op" = alltoall ] && echo MPI_Alltoallv || echo MPI_Allreduce) out of place"

python3 - "$work" "$ROUNDS" "$op" $RANKS <<'PYEOF'
import statistics, sys, os
work, rounds, op, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def read(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        rows[int(f[0])] = (float(f[4]), float(f[6]))   # time us, busbw
    return rows
for n in ranks:
    p = [read(f"{work}/plait_{n}_{r}.txt") for r in range(1, rounds + 1)]
    m = [read(f"{work}/mpi_{n}_{r}.txt") for r in range(1, rounds + 1)]
    print(f"\n{n} ranks (median of {rounds} round{'s' if rounds > 1 else ''}; "
          f"busbw = algbw * {'' if op == 'alltoall' else '2'}(n-1)/n; GB/s)")
    print(f"{'size':>10} {'plait us':>10} {'plait busbw':>12} {'ompi us':>10} {'ompi busbw':>11} {'ratio':>7}")
    ratios = []
    for size in sorted(p[0]):
        pt = statistics.median(r[size][0] for r in p if size in r)
        pb = statistics.median(r[size][1] for r in p if size in r)
        have = [r[size] for r in m if size in r]
        if have:
            mt = statistics.median(h[0] for h in have)
            mb = statistics.median(h[1] for h in have)
            ratio = pb / mb if mb > 0 else float("nan")
            if size >= 1 << 20:
                ratios.append(ratio)
            print(f"{size:>10} {pt:>10.1f} {pb:>12.3f} {mt:>10.1f} {mb:>11.3f} {ratio:>7.2f}")
        else:
            print(f"{size:>10} {pt:>10.1f} {pb:>12.3f} {'-':>10} {'-':>11} {'-':>7}")
    if ratios:
        print(f"  >= 1 MiB: plait / Open MPI busbw min {min(ratios):.2f}, median "
              f"{statistics.median(ratios):.2f}   (goal >= 0.8)")
PYEOF
done
