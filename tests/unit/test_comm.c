/* test_comm.c — the socket collectives' results (runtime/comm) with real
 * processes: each case forks 2..8 ranks (comm_world.h) and checks them
 * against a serial reference in double: all-reduce, reduce-scatter,
 * all-gather, all-to-all (even and uneven), broadcast, barrier, send/recv,
 * and bad arguments. Shared memory, TCP, and both mixed (pretend nodes) are
 * exercised. Splits, determinism, bytes and overlap are
 * test_comm_properties.c's; failure test_comm_failure.c's. */
#include <float.h>
#include <math.h>

#include "comm_world.h"

/* ---- all-reduce ---------------------------------------------------------- */

struct allreduce_case {
    const size_t *counts;
    int n_counts;
    bool in_place;
};

/* Checks an all-reduce result against sum (or max) in double over all ranks. */
static void check_allreduce(const float *got, size_t count, int n, enum comm_reduce_op op,
                            uint32_t salt, const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < count && bad < 3; i++) {
        double ref = op == COMM_SUM ? 0 : -INFINITY, mag = 0;
        for (int r = 0; r < n; r++) {
            double x = input(r, i, salt);
            ref = op == COMM_SUM ? ref + x : (x > ref ? x : ref);
            mag += fabs(x);
        }
        double tol = op == COMM_SUM ? 2.0 * n * FLT_EPSILON * mag + 1e-30 : 0;
        if (!(fabs(got[i] - ref) <= tol)) {
            CHECK(0, "%s: n=%d count=%zu [%zu] = %.9g, reference %.9g", what, n, count, i, got[i],
                  ref);
            bad++;
        }
    }
}

static void allreduce_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    const struct allreduce_case *ac = arg;
    struct plait_error err;
    int slot = 0;
    for (int k = 0; k < ac->n_counts; k++) {
        size_t count = ac->counts[k];
        float *in = malloc(sizeof(float) * (count + 1)), *out = malloc(sizeof(float) * (count + 1));
        for (int opi = 0; opi < 2; opi++) {
            enum comm_reduce_op op = opi ? COMM_MAX : COMM_SUM;
            uint32_t salt = (uint32_t)(k * 2 + opi);
            for (size_t i = 0; i < count; i++) in[i] = input(rank, i, salt);
            float *dst = ac->in_place ? in : out;
            int rc = comm_allreduce(c, in, dst, count, COMM_FLOAT32, op, &err);
            CHECK(rc == 0, "rank %d count %zu: %s", rank, count, err.text);
            if (rc) break;
            if (!ac->in_place)
                for (size_t i = 0; i < count; i++)
                    if (in[i] != input(rank, i, salt)) {
                        CHECK(0, "rank %d: all-reduce wrote into its send buffer", rank);
                        break;
                    }
            check_allreduce(dst, count, n, op, salt, op == COMM_SUM ? "sum" : "max");
            sh->hash[rank][slot++ % 16] = fnv1a(dst, count * sizeof(float));
        }
        free(in);
        free(out);
    }
}

static void test_allreduce_sum_and_max_match_double_reference(void)
{
    static const size_t counts[] = {0, 1, 7, 1000, 1001, 4099, 1 << 20};
    static const size_t counts8[] = {0, 1, 7, 1000, 4099, 1 << 20};
    static const int ns[] = {2, 3, 4, 8};
    for (size_t i = 0; i < 4; i++) {
        int n = ns[i];
        struct allreduce_case ac = {n == 8 ? counts8 : counts, n == 8 ? 6 : 7, false};
        struct world_opts o = {.n = n, .absent_rank = -1, .name = "ar"};
        run_world(&o, allreduce_rank, &ac);
        for (int s = 0; s < 2 * ac.n_counts && s < 16; s++)
            CHECK(all_hashes_equal(n, s), "n=%d: ranks disagree in result %d", n, s);
    }
}

/* Every size through each algorithm, out of place and in place, over TCP
 * and over two pretend nodes (shared memory inside each, TCP between). */
static void test_allreduce_every_algorithm_and_transport(void)
{
    static const size_t counts[] = {1, 2, 3, 5, 7, 33, 1000, 65537};
    struct {
        enum comm_algorithm alg;
        enum comm_transport tr;
        int nodes, n;
        bool in_place;
    } cases[] = {
        {COMM_ALGORITHM_BANDWIDTH, COMM_TRANSPORT_AUTO, 0, 5, false},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_AUTO, 0, 5, true},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_AUTO, 0, 4, false},
        {COMM_ALGORITHM_BANDWIDTH, COMM_TRANSPORT_TCP, 0, 3, true},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_TCP, 0, 3, false},
        {COMM_ALGORITHM_AUTO, COMM_TRANSPORT_AUTO, 2, 4, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct allreduce_case ac = {counts, 8, cases[i].in_place};
        struct world_opts o = {.n = cases[i].n,
                               .absent_rank = -1,
                               .algorithm = cases[i].alg,
                               .transport = cases[i].tr,
                               .nodes = cases[i].nodes,
                               .name = "alg"};
        run_world(&o, allreduce_rank, &ac);
        for (int s = 0; s < 16; s++)
            CHECK(all_hashes_equal(cases[i].n, s), "case %zu: ranks disagree in result %d", i, s);
    }
}

static void typed_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    enum { COUNT = 3001 };
    double *d = malloc(sizeof(double) * COUNT);
    int64_t *v = malloc(sizeof(int64_t) * COUNT);
    for (int alg = 0; alg < 2; alg++) {
        size_t count = alg ? COUNT : 5; /* small: recursive doubling; large: ring */
        for (size_t i = 0; i < count; i++) {
            d[i] = (double)input(rank, i, 7) * 1e10;
            v[i] = (int64_t)(rank + 1) * 1000000007LL * (int64_t)(i + 1) * (i % 2 ? -1 : 1);
        }
        CHECK(comm_allreduce(c, d, d, count, COMM_FLOAT64, COMM_SUM, &err) == 0, "%s", err.text);
        CHECK(comm_allreduce(c, v, v, count, COMM_INT64, COMM_SUM, &err) == 0, "%s", err.text);
        for (size_t i = 0; i < count; i++) {
            double ref = 0;
            int64_t iref = 0;
            for (int r = 0; r < n; r++) {
                ref += (double)input(r, i, 7) * 1e10;
                iref += (int64_t)(r + 1) * 1000000007LL * (int64_t)(i + 1) * (i % 2 ? -1 : 1);
            }
            if (fabs(d[i] - ref) > 1e-12 * 1e10 * n || v[i] != iref) {
                CHECK(0, "rank %d [%zu]: f64 %.17g (ref %.17g), i64 %lld (ref %lld)", rank, i, d[i],
                      ref, (long long)v[i], (long long)iref);
                break;
            }
        }
        for (size_t i = 0; i < count; i++) v[i] = (int64_t)i * (rank == 1 ? 3 : -1);
        CHECK(comm_allreduce(c, v, v, count, COMM_INT64, COMM_MAX, &err) == 0, "%s", err.text);
        for (size_t i = 0; i < count; i++)
            if (v[i] != (int64_t)i * 3) {
                CHECK(0, "int64 max [%zu] = %lld", i, (long long)v[i]);
                break;
            }
    }
    free(d);
    free(v);
}

static void test_allreduce_float64_and_int64(void)
{
    struct world_opts o = {.n = 3, .absent_rank = -1, .name = "typed"};
    run_world(&o, typed_rank, NULL);
}

/* ---- reduce-scatter, all-gather, broadcast, barrier ---------------------- */

static void rs_ag_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {1, 7, 1000, 65539};
    for (int k = 0; k < 4; k++) {
        size_t count = counts[k], total = count * (size_t)n;
        float *in = malloc(sizeof(float) * total), *out = malloc(sizeof(float) * total);
        for (size_t i = 0; i < total; i++) in[i] = input(rank, i, 100 + (uint32_t)k);
        CHECK(comm_reduce_scatter(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
              err.text);
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; i++) {
            size_t at = (size_t)rank * count + i;
            double ref = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                ref += input(r, at, 100 + (uint32_t)k);
                mag += fabs(input(r, at, 100 + (uint32_t)k));
            }
            if (!(fabs(out[i] - ref) <= 2.0 * n * FLT_EPSILON * mag)) {
                CHECK(0, "reduce-scatter n=%d count=%zu rank %d [%zu] = %.9g, ref %.9g", n, count,
                      rank, i, out[i], ref);
                bad++;
            }
        }
        /* all-gather, out of place and in place */
        for (size_t i = 0; i < count; i++) in[i] = input(rank, i, 200 + (uint32_t)k);
        CHECK(comm_allgather(c, in, out, count, COMM_FLOAT32, &err) == 0, "%s", err.text);
        memcpy(in + (size_t)rank * count, in, sizeof(float) * count);
        float *inplace = in;
        if (rank != 0) memset(inplace, 0, sizeof(float) * (size_t)rank * count);
        CHECK(comm_allgather(c, inplace + (size_t)rank * count, inplace, count, COMM_FLOAT32,
                             &err) == 0,
              "%s", err.text);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                if (out[(size_t)r * count + i] != input(r, i, 200 + (uint32_t)k) ||
                    inplace[(size_t)r * count + i] != input(r, i, 200 + (uint32_t)k)) {
                    CHECK(0, "all-gather n=%d count=%zu: block %d [%zu] wrong", n, count, r, i);
                    r = n;
                    break;
                }
        free(in);
        free(out);
    }
}

static void test_reduce_scatter_and_allgather_match_reference(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "rsag"};
        run_world(&o, rs_ag_rank, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, rs_ag_rank, NULL);
}

/* Per-rank counts of pattern k for n ranks: uneven, zeros between, a
 * zero for rank 0 alone, one rank owning it all, nothing at all. */
static size_t rsv_count(int k, int r, int n)
{
    switch (k) {
    case 0:
        return 1000 + 37 * (size_t)r;
    case 1:
        return r % 2 ? 0 : 5000 + (size_t)r;
    case 2:
        return r == 0 ? 0 : 3;
    case 3:
        return r == n - 1 ? 70001 : 0;
    default:
        return 0;
    }
}

/* Pattern k's counts for n ranks, their total, and where rank's block
 * starts in it. */
static void uneven_counts(int k, int rank, int n, size_t *counts, size_t *total, size_t *before)
{
    *total = *before = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = rsv_count(k, r, n);
        if (r == rank) *before = *total;
        *total += counts[r];
    }
}

/* The payload this rank sent since s0 is what its ring sends. */
static void check_ring_payload(struct comm *c, const struct comm_stats *s0, uint64_t want,
                               const char *what, int n, int rank)
{
    struct comm_stats s1;
    comm_stats(c, &s1);
    CHECK(s1.payload_bytes_sent - s0->payload_bytes_sent == want,
          "%s n=%d rank %d: sent %llu payload bytes, the ring sends %llu", what, n, rank,
          (unsigned long long)(s1.payload_bytes_sent - s0->payload_bytes_sent),
          (unsigned long long)want);
}

/* Every pattern posted at once (asynchronous, waited in order), each rank's
 * block against a double reference, the floats after it untouched, and the
 * payload the ring's: every block but its own. */
static void rsv_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 5 };
    struct plait_error err;
    size_t counts[K][8], total[K], before[K];
    float *in[K], *out[K];
    struct comm_request *req[K];
    struct comm_stats s0;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        uneven_counts(k, rank, n, counts[k], &total[k], &before[k]);
        want_sent += (total[k] - counts[k][rank]) * sizeof(float);
        in[k] = malloc(sizeof(float) * (total[k] + 1));
        out[k] = malloc(sizeof(float) * (counts[k][rank] + 1));
        for (size_t i = 0; i < total[k]; i++) in[k][i] = input(rank, i, 500 + (uint32_t)k);
        for (size_t i = 0; i <= counts[k][rank]; i++) out[k][i] = -3.0f;
        CHECK(comm_ireduce_scatter_v(c, in[k], out[k], counts[k], COMM_FLOAT32, COMM_SUM, &req[k],
                                     &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        size_t mine = counts[k][rank];
        int bad = 0;
        for (size_t i = 0; i < mine && bad < 3; i++) {
            double ref = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                ref += input(r, before[k] + i, 500 + (uint32_t)k);
                mag += fabs(input(r, before[k] + i, 500 + (uint32_t)k));
            }
            if (!(fabs(out[k][i] - ref) <= 2.0 * n * FLT_EPSILON * mag)) {
                CHECK(0, "reduce-scatter-v n=%d pattern %d rank %d [%zu] = %.9g, ref %.9g", n, k,
                      rank, i, out[k][i], ref);
                bad++;
            }
        }
        CHECK(out[k][mine] == -3.0f, "reduce-scatter-v n=%d pattern %d rank %d: wrote past %zu", n,
              k, rank, mine);
        free(in[k]);
        free(out[k]);
    }
    check_ring_payload(c, &s0, want_sent, "reduce-scatter-v", n, rank);
}

/* An uneven collective's ranks at 2 to 5 ranks over shared memory, and at 3
 * over TCP. */
static void run_uneven_worlds(rank_fn fn, const char *name)
{
    static const int ns[] = {2, 3, 4, 5};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = name};
        run_world(&o, fn, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, fn, NULL);
}

static void test_uneven_reduce_scatter_matches_reference(void)
{
    run_uneven_worlds(rsv_rank, "rsv");
}

/* The uneven all-gather of rsv_count's patterns, every one posted at once
 * (asynchronous, waited in order), out of place and in place: every rank's
 * block exact, the float after the whole untouched, and the payload the
 * ring's: every block but the next rank's. */
static void agv_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 5 };
    struct plait_error err;
    size_t counts[K][8], total[K], before[K];
    float *in[K], *out[K], *inplace[K];
    struct comm_request *req[2 * K];
    struct comm_stats s0;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        uneven_counts(k, rank, n, counts[k], &total[k], &before[k]);
        want_sent += 2 * (total[k] - counts[k][(rank + 1) % n]) * sizeof(float);
        in[k] = malloc(sizeof(float) * (counts[k][rank] + 1));
        out[k] = malloc(sizeof(float) * (total[k] + 1));
        inplace[k] = malloc(sizeof(float) * (total[k] + 1));
        for (size_t i = 0; i <= total[k]; i++) out[k][i] = inplace[k][i] = -3.0f;
        for (size_t i = 0; i < counts[k][rank]; i++)
            in[k][i] = inplace[k][before[k] + i] = input(rank, i, 700 + (uint32_t)k);
        CHECK(comm_iallgather_v(c, in[k], out[k], counts[k], COMM_FLOAT32, &req[2 * k], &err) == 0,
              "%s", err.text);
        CHECK(comm_iallgather_v(c, inplace[k] + before[k], inplace[k], counts[k], COMM_FLOAT32,
                                &req[2 * k + 1], &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[2 * k], &err) == 0 && comm_wait(req[2 * k + 1], &err) == 0, "%s",
              err.text);
        size_t at = 0;
        int bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < counts[k][r]; i++, at++) {
                float want = input(r, i, 700 + (uint32_t)k);
                if (bad < 3 && (out[k][at] != want || inplace[k][at] != want)) {
                    CHECK(0,
                          "all-gather-v n=%d pattern %d rank %d: block %d [%zu] = %.9g, %.9g "
                          "in place, sent %.9g",
                          n, k, rank, r, i, out[k][at], inplace[k][at], want);
                    bad++;
                }
            }
        CHECK(out[k][at] == -3.0f && inplace[k][at] == -3.0f,
              "all-gather-v n=%d pattern %d rank %d: wrote past %zu", n, k, rank, at);
        free(in[k]);
        free(out[k]);
        free(inplace[k]);
    }
    check_ring_payload(c, &s0, want_sent, "all-gather-v", n, rank);
}

static void test_uneven_allgather_matches_every_block(void)
{
    run_uneven_worlds(agv_rank, "agv");
}

/* The same uneven all-gather of 2-byte bf16 values (ZeRO 3's weights in the
 * compute precision): every block exact, nothing written past them; a bf16
 * sum is refused, naming the data type. */
static void agv16_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err = {.text = ""};
    size_t counts[8], total, before;
    uneven_counts(3, rank, n, counts, &total, &before);
    uint16_t *in = malloc(sizeof(uint16_t) * (counts[rank] + 1));
    uint16_t *out = malloc(sizeof(uint16_t) * (total + 1));
    for (size_t i = 0; i <= total; i++) out[i] = 0xdead;
    for (size_t i = 0; i < counts[rank]; i++) in[i] = (uint16_t)(rank * 1000 + i);
    struct comm_request *req;
    CHECK(comm_iallgather_v(c, in, out, counts, COMM_BFLOAT16, &req, &err) == 0 &&
              comm_wait(req, &err) == 0,
          "%s", err.text);
    size_t at = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++, at++)
            if (out[at] != (uint16_t)(r * 1000 + i)) {
                CHECK(0, "bf16 all-gather-v n=%d rank %d: block %d [%zu] = %u", n, rank, r, i,
                      out[at]);
                r = n;
                break;
            }
    CHECK(out[total] == 0xdead, "bf16 all-gather-v n=%d rank %d: wrote past the blocks", n, rank);
    CHECK(comm_iallreduce(c, in, in, 1, COMM_BFLOAT16, COMM_SUM, &req, &err) == -1 &&
              strstr(err.text, "bf16 is gathered, never summed"),
          "a bf16 sum: %s", err.text);
    free(in);
    free(out);
}

static void test_uneven_bf16_allgather_matches_every_block(void)
{
    run_uneven_worlds(agv16_rank, "agv16");
}

/* Elements rank `from` sends rank `to` in all-to-all pattern k: uneven in
 * both directions, zeros between, everything to one rank (as a router may
 * send every token to one expert), nothing at all. */
static size_t a2a_count(int k, int from, int to, int n)
{
    switch (k) {
    case 0:
        return 100 + 31 * (size_t)from + 7 * (size_t)to;
    case 1:
        return (from + to) % 2 ? 0 : 4000 + (size_t)(from * n + to);
    case 2:
        return to == n - 1 ? 50001 : 0;
    default:
        return 0;
    }
}

/* Every pattern posted at once, each received block checked element by
 * element against what its sender wrote (the bits: nothing is added), the
 * float after the last untouched, and the payload every block but the own. */
static void a2a_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 4 };
    struct plait_error err;
    size_t sc[K][8], rc[K][8], out_n[K], in_n[K];
    float *in[K], *out[K];
    struct comm_request *req[K];
    struct comm_stats s0, s1;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        out_n[k] = in_n[k] = 0;
        for (int r = 0; r < n; r++) {
            sc[k][r] = a2a_count(k, rank, r, n);
            rc[k][r] = a2a_count(k, r, rank, n);
            out_n[k] += sc[k][r];
            in_n[k] += rc[k][r];
            want_sent += r == rank ? 0 : sc[k][r] * sizeof(float);
        }
        in[k] = malloc(sizeof(float) * (out_n[k] + 1));
        out[k] = malloc(sizeof(float) * (in_n[k] + 1));
        for (size_t i = 0; i < out_n[k]; i++) in[k][i] = input(rank, i, 700 + (uint32_t)k);
        for (size_t i = 0; i <= in_n[k]; i++) out[k][i] = -5.0f;
        CHECK(comm_ialltoall_v(c, in[k], sc[k], out[k], rc[k], COMM_FLOAT32, &req[k], &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        size_t at = 0;
        for (int r = 0; r < n; r++) {
            size_t from_at = 0; /* where rank r's block for this rank starts in r's send */
            for (int q = 0; q < rank; q++) from_at += a2a_count(k, r, q, n);
            for (size_t i = 0; i < rc[k][r]; i++)
                if (out[k][at + i] != input(r, from_at + i, 700 + (uint32_t)k)) {
                    CHECK(0, "all-to-all n=%d pattern %d: rank %d's block from %d [%zu] wrong", n,
                          k, rank, r, i);
                    break;
                }
            at += rc[k][r];
        }
        CHECK(out[k][in_n[k]] == -5.0f, "all-to-all n=%d pattern %d rank %d: wrote past %zu", n, k,
              rank, in_n[k]);
        free(in[k]);
        free(out[k]);
    }
    comm_stats(c, &s1);
    CHECK(s1.payload_bytes_sent - s0.payload_bytes_sent == want_sent,
          "all-to-all n=%d rank %d: sent %llu payload bytes, every block but its own is %llu", n,
          rank, (unsigned long long)(s1.payload_bytes_sent - s0.payload_bytes_sent),
          (unsigned long long)want_sent);
}

static void test_uneven_alltoall_delivers_every_block(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "a2a"};
        run_world(&o, a2a_rank, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, a2a_rank, NULL);
}

static void broadcast_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {1, 1000, 300001};
    float *buf = malloc(sizeof(float) * 300001);
    for (int k = 0; k < 3; k++)
        for (int root = 0; root < n; root++) {
            size_t count = counts[k];
            for (size_t i = 0; i < count; i++) buf[i] = rank == root ? input(root, i, 300) : -7.0f;
            CHECK(comm_broadcast(c, buf, count, COMM_FLOAT32, root, &err) == 0, "%s", err.text);
            for (size_t i = 0; i < count; i++)
                if (buf[i] != input(root, i, 300)) {
                    CHECK(0, "broadcast n=%d root %d count %zu: rank %d [%zu] wrong", n, root,
                          count, rank, i);
                    break;
                }
        }
    free(buf);
}

static void test_broadcast_from_every_root(void)
{
    static const int ns[] = {2, 3, 5, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "bcast"};
        run_world(&o, broadcast_rank, NULL);
    }
    struct world_opts chain = {
        .n = 4, .absent_rank = -1, .algorithm = COMM_ALGORITHM_BANDWIDTH, .name = "chain"};
    run_world(&chain, broadcast_rank, NULL);
    struct world_opts tree = {.n = 6,
                              .absent_rank = -1,
                              .algorithm = COMM_ALGORITHM_LATENCY,
                              .transport = COMM_TRANSPORT_TCP};
    run_world(&tree, broadcast_rank, NULL);
}

static void barrier_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    for (int round = 0; round < 3; round++) {
        sleep_s(0.01 * ((rank + round) % 4));
        sh->t[rank][round] = now_s(); /* arrival */
        CHECK(comm_barrier(c, &err) == 0, "%s", err.text);
        double left = now_s();
        for (int r = 0; r < n; r++)
            if (sh->t[r][round] == 0 || sh->t[r][round] > left) {
                CHECK(0, "round %d: rank %d left the barrier before rank %d arrived", round, rank,
                      r);
                break;
            }
        CHECK(comm_barrier(c, &err) == 0, "%s", err.text); /* nobody overwrites early */
    }
}

static void test_barrier_waits_for_the_last_rank(void)
{
    static const int ns[] = {2, 3, 8};
    for (int i = 0; i < 3; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "barrier"};
        run_world(&o, barrier_rank, NULL);
    }
    struct world_opts tcp = {.n = 5, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, barrier_rank, NULL);
}

/* ---- point to point ------------------------------------------------------ */

/* A ring of blocking sends first (each completes before its receive is
 * posted), then a pipeline: micro-batches forward stage by stage and their
 * gradients back, every send asynchronous, beside a collective on the same
 * communicator. */
static void p2p_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    enum { BIG = 300000, MICRO = 4 };
    float *a = malloc(sizeof(float) * BIG), *b = malloc(sizeof(float) * BIG);
    for (size_t i = 0; i < BIG; i++) a[i] = input(rank, i, 400);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    CHECK(comm_send(c, a, sizeof(float) * BIG, next, 5, &err) == 0, "%s", err.text);
    CHECK(comm_recv(c, b, sizeof(float) * BIG, prev, 5, &err) == 0, "%s", err.text);
    CHECK(!memcmp(b, (float[]){input(prev, 0, 400)}, sizeof(float)) &&
              b[BIG - 1] == input(prev, BIG - 1, 400),
          "ring: rank %d got the wrong data", rank);
    /* zero-byte messages and tags out of order */
    struct comm_request *r1, *r2;
    CHECK(comm_isend(c, NULL, 0, next, 9, &r1, &err) == 0, "%s", err.text);
    CHECK(comm_isend(c, a, 4, next, 8, &r2, &err) == 0, "%s", err.text);
    float one = 0;
    CHECK(comm_recv(c, &one, 4, prev, 8, &err) == 0 && one == input(prev, 0, 400), "tag 8");
    CHECK(comm_recv(c, NULL, 0, prev, 9, &err) == 0, "%s", err.text);
    CHECK(comm_wait(r1, &err) == 0 && comm_wait(r2, &err) == 0, "%s", err.text);

    /* the pipeline: stage s forwards micro-batch m (value s*100+m) and later sends back its
       gradient; an all-reduce runs on the same communicator meanwhile */
    size_t act = 70000;
    float *acts = malloc(sizeof(float) * act * MICRO), *grads = malloc(sizeof(float) * act * MICRO);
    struct comm_request *sends[2 * MICRO], *recvs[2 * MICRO], *coll;
    int ns = 0, nr = 0;
    float v = (float)rank, sum = 0;
    CHECK(comm_iallreduce(c, &v, &sum, 1, COMM_FLOAT32, COMM_SUM, &coll, &err) == 0, "%s",
          err.text);
    for (int m = 0; m < MICRO; m++) {
        float *x = acts + (size_t)m * act;
        if (rank > 0) {
            CHECK(comm_irecv(c, x, sizeof(float) * act, rank - 1, (uint32_t)m, &recvs[nr], &err) ==
                      0,
                  "%s", err.text);
            CHECK(comm_wait(recvs[nr], &err) == 0, "%s", err.text);
            CHECK(x[0] == (float)((rank - 1) * 100 + m) && x[act - 1] == x[0],
                  "stage %d micro %d: activation %g", rank, m, x[0]);
        }
        for (size_t i = 0; i < act; i++) x[i] = (float)(rank * 100 + m);
        if (rank < n - 1)
            CHECK(comm_isend(c, x, sizeof(float) * act, rank + 1, (uint32_t)m, &sends[ns++],
                             &err) == 0,
                  "%s", err.text);
    }
    for (int m = MICRO - 1; m >= 0; m--) {
        float *g = grads + (size_t)m * act;
        if (rank < n - 1) {
            CHECK(comm_recv(c, g, sizeof(float) * act, rank + 1, 1000u + (uint32_t)m, &err) == 0,
                  "%s", err.text);
            CHECK(g[0] == (float)(-(rank + 1) * 100 - m), "stage %d grad %d: %g", rank, m, g[0]);
        }
        for (size_t i = 0; i < act; i++) g[i] = (float)(-rank * 100 - m);
        if (rank > 0)
            CHECK(comm_isend(c, g, sizeof(float) * act, rank - 1, 1000u + (uint32_t)m, &sends[ns++],
                             &err) == 0,
                  "%s", err.text);
    }
    for (int i = 0; i < ns; i++) CHECK(comm_wait(sends[i], &err) == 0, "%s", err.text);
    CHECK(comm_wait(coll, &err) == 0, "%s", err.text);
    CHECK(sum == (float)(n * (n - 1) / 2), "all-reduce beside the pipeline: %g", sum);
    free(acts);
    free(grads);
    free(a);
    free(b);
}

static void test_send_recv_rings_and_pipelines(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "p2p"};
        run_world(&o, p2p_rank, NULL);
    }
    struct world_opts tcp = {.n = 4, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, p2p_rank, NULL);
    struct world_opts mixed = {.n = 4, .absent_rank = -1, .nodes = 2, .name = "mixed"};
    run_world(&mixed, p2p_rank, NULL);
}

/* ---- arguments ----------------------------------------------------------------- */

static void args_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)rank, (void)n, (void)arg;
    struct plait_error err;
    float x[4] = {1, 2, 3, 4};
    CHECK(comm_send(c, x, 4, 0, 0, &err) != 0 && strstr(err.text, "itself"), "%s", err.text);
    CHECK(!err.peer_lost, "a bad argument is this rank's own error, not a lost peer");
    CHECK(comm_send(c, x, 4, 3, 0, &err) != 0 && strstr(err.text, "peer 3"), "%s", err.text);
    CHECK(comm_broadcast(c, x, 1, COMM_FLOAT32, 1, &err) != 0 && strstr(err.text, "root"), "%s",
          err.text);
    CHECK(comm_allreduce(c, x, x, 4, COMM_FLOAT32, (enum comm_reduce_op)9, &err) != 0, "op");
    CHECK(comm_allreduce(c, x, x, 4, COMM_FLOAT32, COMM_SUM, &err) == 0 && x[3] == 4, "n=1");
    float y[4];
    CHECK(comm_allgather(c, x, y, 4, COMM_FLOAT32, &err) == 0 && !memcmp(x, y, sizeof x), "ag");
    CHECK(comm_reduce_scatter(c, x, y, 4, COMM_FLOAT32, COMM_SUM, &err) == 0 && y[2] == 3, "rs");
    size_t one[1] = {4}, other[1] = {3};
    CHECK(comm_alltoall_v(c, x, one, y, one, COMM_FLOAT32, &err) == 0 && !memcmp(x, y, sizeof x),
          "a2a");
    CHECK(comm_alltoall_v(c, x, one, y, other, COMM_FLOAT32, &err) != 0 &&
              strstr(err.text, "sends itself 4 elements but expects 3"),
          "%s", err.text);
    CHECK(comm_alltoall_v(c, x, one, x, one, COMM_FLOAT32, &err) != 0 &&
              strstr(err.text, "overlap"),
          "%s", err.text);
    CHECK(comm_barrier(c, &err) == 0, "%s", err.text);
    CHECK(comm_group_start(c, &err) == 0 && comm_group_end(c, &err) == 0, "%s", err.text);
    struct comm *sub;
    CHECK(comm_split(c, 0, 0, "bad/name", &sub, &err) != 0, "a name with a slash");
    /* without NCCL in the build, or without a GPU, nccl is refused saying
     * why (test_comm_nccl); with both, a world of one works (tests/gpu) */
    struct comm_options o = {.timeout_s = 30, .secret = SECRET, .backend = COMM_BACKEND_NCCL};
    if (comm_world_init(&sub, st, 0, 1, &o, &err) == 0)
        comm_destroy(sub);
    else
        CHECK(strstr(err.text, "nccl") || strstr(err.text, "CUDA"), "%s", err.text);
}

static void test_bad_arguments_are_errors_not_crashes(void)
{
    struct world_opts o = {.n = 1, .absent_rank = -1, .name = "args"};
    run_world(&o, args_rank, NULL);
}

static const struct comm_case cases[] = {
    COMM_CASE(test_bad_arguments_are_errors_not_crashes),
    COMM_CASE(test_allreduce_sum_and_max_match_double_reference),
    COMM_CASE(test_allreduce_every_algorithm_and_transport),
    COMM_CASE(test_allreduce_float64_and_int64),
    COMM_CASE(test_reduce_scatter_and_allgather_match_reference),
    COMM_CASE(test_uneven_reduce_scatter_matches_reference),
    COMM_CASE(test_uneven_allgather_matches_every_block),
    COMM_CASE(test_uneven_bf16_allgather_matches_every_block),
    COMM_CASE(test_uneven_alltoall_delivers_every_block),
    COMM_CASE(test_broadcast_from_every_root),
    COMM_CASE(test_barrier_waits_for_the_last_rank),
    COMM_CASE(test_send_recv_rings_and_pipelines),
};

int main(int argc, char **argv)
{
    return comm_world_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
