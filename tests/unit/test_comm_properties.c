/* test_comm_properties.c — what holds of the socket collectives beyond each
 * operation's result, with real processes (comm_world.h): 3D splits reducing
 * concurrently, bitwise determinism across ranks, runs and transports, bytes
 * on the wire against the ring formulas, and asynchronous work overlapping
 * compute. The results themselves are test_comm.c's. */
#include <math.h>

#include "comm_world.h"

/* ---- splits ---------------------------------------------------------------- */

/* 2x2x2: tp fastest, then dp, then pp. Each group all-reduces the global ranks
 * of its members, all three at once. */
static void split_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    struct comm *tp, *pp, *dp;
    if (comm_split_3d(c, 2, 2, 2, rank_coords_of(comm_rank(c), 2, 2), NULL, &tp, &pp, &dp, &err)) {
        CHECK(0, "rank %d: %s", rank, err.text);
        return;
    }
    int tpr = rank % 2, dpr = rank / 2 % 2, ppr = rank / 4;
    CHECK(comm_rank(tp) == tpr && comm_rank(dp) == dpr && comm_rank(pp) == ppr,
          "rank %d: tp %d dp %d pp %d", rank, comm_rank(tp), comm_rank(dp), comm_rank(pp));
    CHECK(comm_size(tp) == 2 && comm_size(dp) == 2 && comm_size(pp) == 2, "sizes");
    enum { COUNT = 50000 };
    int64_t *x[3];
    struct comm_request *req[3];
    struct comm *g[3] = {tp, dp, pp};
    for (int k = 0; k < 3; k++) {
        x[k] = malloc(sizeof(int64_t) * COUNT);
        for (size_t i = 0; i < COUNT; i++) x[k][i] = (int64_t)rank << (8 * k);
        CHECK(comm_iallreduce(g[k], x[k], x[k], COUNT, COMM_INT64, COMM_SUM, &req[k], &err) == 0,
              "%s", err.text);
    }
    int64_t want[3] = {(int64_t)(rank - tpr) * 2 + 1, (int64_t)(rank - 2 * dpr) * 2 + 2,
                       (int64_t)(rank - 4 * ppr) * 2 + 4};
    for (int k = 0; k < 3; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        CHECK(x[k][0] == want[k] << (8 * k) && x[k][COUNT - 1] == x[k][0],
              "rank %d group %d: %lld, want %lld", rank, k, (long long)x[k][0],
              (long long)(want[k] << (8 * k)));
        free(x[k]);
    }
    CHECK(!strcmp(comm_name(tp), "world.tp.0") || !strncmp(comm_name(tp), "world.tp.", 9),
          "name %s", comm_name(tp));
    /* a split that leaves some ranks out */
    struct comm *even = NULL;
    CHECK(comm_split(c, rank % 2 ? COMM_SPLIT_NONE : 0, -rank, "even", &even, &err) == 0, "%s",
          err.text);
    CHECK((rank % 2) == (even == NULL), "rank %d: even %p", rank, (void *)even);
    if (even) {
        CHECK(comm_size(even) == 4 && comm_rank(even) == 3 - rank / 2, "key orders the group");
        float v = 1;
        CHECK(comm_allreduce(even, &v, &v, 1, COMM_FLOAT32, COMM_SUM, &err) == 0 && v == 4,
              "even group sum %g", v);
    }
    comm_destroy(even);
    /* a name used before is refused at once, not after a timeout */
    struct comm *again = NULL;
    double t0 = now_s();
    int rc = comm_split(c, rank % 2 ? COMM_SPLIT_NONE : 0, 0, "even", &again, &err);
    if (rank % 2 == 0)
        CHECK(rc != 0 && strstr(err.text, "in use") && now_s() - t0 < 2, "reused name: %s",
              rc ? err.text : "accepted");
    comm_destroy(again);
    comm_destroy(tp);
    comm_destroy(dp);
    comm_destroy(pp);
}

static void test_split_into_tp_pp_dp_groups_reducing_concurrently(void)
{
    struct world_opts o = {.n = 8, .absent_rank = -1};
    run_world(&o, split_rank, NULL);
}

/* ---- determinism ----------------------------------------------------------- */

static void determinism_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {3, 999, 200003};
    float *x = malloc(sizeof(float) * 200003);
    for (int k = 0; k < 3; k++) {
        /* wide magnitudes, so the order of additions shows in the bits */
        for (size_t i = 0; i < counts[k]; i++)
            x[i] = input(rank, i, 500) * powf(10.0f, (float)((rank * 7 + (int)i) % 9) - 4);
        CHECK(comm_allreduce(c, x, x, counts[k], COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
              err.text);
        sh->hash[rank][k] = fnv1a(x, sizeof(float) * counts[k]);
    }
    free(x);
}

static void test_results_bitwise_identical_on_all_ranks_and_across_runs(void)
{
    uint64_t first[3];
    for (int run = 0; run < 2; run++) {
        struct world_opts o = {.n = 5, .absent_rank = -1, .name = "det"};
        run_world(&o, determinism_rank, NULL);
        for (int k = 0; k < 3; k++) {
            CHECK(all_hashes_equal(5, k), "run %d size %d: ranks disagree", run, k);
            if (run == 0)
                first[k] = sh->hash[0][k];
            else
                CHECK(sh->hash[0][k] == first[k], "size %d: the second run differs", k);
        }
    }
    /* TCP gives the same bits as shared memory */
    struct world_opts tcp = {
        .n = 5, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP, .name = "det"};
    run_world(&tcp, determinism_rank, NULL);
    for (int k = 0; k < 3; k++) CHECK(sh->hash[0][k] == first[k], "TCP differs at size %d", k);
}

/* ---- bytes on the wire ------------------------------------------------------- */

static void bytes_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)1 << 20;
    float *in = calloc(count * (size_t)n, sizeof(float)), *out = calloc(count * (size_t)n, 4);
    comm_stats(c, &sh->stats[rank][0]);
    CHECK(comm_allreduce(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    comm_stats(c, &sh->stats[rank][1]);
    CHECK(comm_reduce_scatter(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
          err.text);
    comm_stats(c, &sh->stats[rank][2]);
    CHECK(comm_allgather(c, in, out, count, COMM_FLOAT32, &err) == 0, "%s", err.text);
    comm_stats(c, &sh->stats[rank][3]);
    free(in);
    free(out);
}

/* Ring all-reduce sends 2(N-1)/N of the buffer from each rank; reduce-scatter
 * and all-gather (N-1)/N of the whole. The payload must match exactly (for
 * an all-reduce, the N-1 chunks a rank forwards, chunks differing by an
 * element when N does not divide the count); on the wire, frame headers (40
 * bytes per fragment of 32..256 KiB) and padding may add at most 1%. */
static void test_bytes_sent_match_ring_formulas(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int t = 0; t < 4; t++) {
        int n = ns[t];
        double bytes = 4.0 * (1 << 20);
        struct world_opts o = {.n = n, .absent_rank = -1, .name = "bytes"};
        run_world(&o, bytes_rank, NULL);
        for (int r = 0; r < n; r++) {
            struct comm_stats *s = sh->stats[r];
            double want[3] = {2.0 * (n - 1) / n * bytes, (n - 1) * bytes, (n - 1) * bytes};
            const char *what[3] = {"all-reduce", "reduce-scatter", "all-gather"};
            for (int k = 0; k < 3; k++) {
                double payload = (double)(s[k + 1].payload_bytes_sent - s[k].payload_bytes_sent);
                double wire = (double)(s[k + 1].bytes_sent - s[k].bytes_sent);
                double slack = k == 0 ? 8.0 * (n - 1) : 0; /* uneven chunks: 1 element each */
                CHECK(fabs(payload - want[k]) <= slack, "n=%d rank %d %s: payload %.0f, want %.0f",
                      n, r, what[k], payload, want[k]);
                CHECK(wire >= payload && wire <= payload * 1.01,
                      "n=%d rank %d %s: wire %.0f vs %.0f", n, r, what[k], wire, payload);
            }
            /* a faster peer's next operation may arrive before a snapshot: compare
               everything since the communicator was made */
            double sent = (double)s[3].bytes_sent, got = (double)s[3].bytes_received;
            CHECK(fabs(got - sent) <= 0.01 * sent, "n=%d rank %d: received %.0f, sent %.0f", n, r,
                  got, sent);
            CHECK(s[3].operations == 3, "operations %llu", (unsigned long long)s[3].operations);
            CHECK(s[3].wait_s > 0, "wait time counted");
        }
    }
}

/* ---- overlap --------------------------------------------------------------- */

static double busy_until(double end)
{
    volatile double x = 1;
    while (now_s() < end)
        for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
    return x;
}

/* An all-reduce posted before a busy loop proceeds during it: the progress
 * thread moves its bytes while the caller computes, so compute + wait takes
 * about as long as the longer of the two, not their sum. (With two ranks on
 * two cores the busy loops take the CPUs the progress threads need, so the
 * all-reduce takes longer than alone: the loop lasts five times as long, and
 * a machine busy with other work gets three tries.) */
static void overlap_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)4 << 20;
    float *x = calloc(count, sizeof(float));
    CHECK(comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    double t0 = now_s();
    for (int i = 0; i < 3; i++)
        CHECK(comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    double comm_s = (now_s() - t0) / 3;
    /* agree on one busy time: 3 times the slower rank's all-reduce */
    double busy = comm_s;
    CHECK(comm_allreduce(c, &busy, &busy, 1, COMM_FLOAT64, COMM_MAX, &err) == 0, "%s", err.text);
    busy *= 5;
    struct comm_request *req;
    t0 = now_s();
    CHECK(comm_iallreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &req, &err) == 0, "%s", err.text);
    busy_until(t0 + busy);
    bool done = false;
    CHECK(comm_test(req, &done, &err) == 0, "%s", err.text);
    if (!done) CHECK(comm_wait(req, &err) == 0, "%s", err.text);
    double total = now_s() - t0;
    sh->t[rank][0] = comm_s;
    sh->t[rank][1] = busy;
    sh->t[rank][2] = total;
    sh->flag[rank] = done;
    free(x);
}

static bool overlapped(void)
{
    bool ok = true;
    for (int r = 0; r < 2; r++) ok &= sh->t[r][2] < sh->t[r][1] + 0.5 * sh->t[r][0];
    return ok;
}

static void test_async_allreduce_overlaps_a_busy_loop(void)
{
    struct world_opts o = {.n = 2, .absent_rank = -1, .name = "overlap"};
    for (int attempt = 0; attempt < 3; attempt++) {
        run_world(&o, overlap_rank, NULL);
        if (overlapped()) break;
        printf("  attempt %d: rank 0 %.1f ms, rank 1 %.1f ms for a %.1f ms loop; again\n",
               attempt + 1, sh->t[0][2] * 1e3, sh->t[1][2] * 1e3, sh->t[0][1] * 1e3);
    }
    for (int r = 0; r < 2; r++) {
        double comm_s = sh->t[r][0], busy = sh->t[r][1], total = sh->t[r][2];
        printf("  rank %d: all-reduce %.1f ms alone, busy loop %.1f ms, both %.1f ms (sum %.1f); "
               "done %s the loop\n",
               r, comm_s * 1e3, busy * 1e3, total * 1e3, (comm_s + busy) * 1e3,
               sh->flag[r] ? "within" : "just after");
        CHECK(total < busy + 0.5 * comm_s, "rank %d: %.1f ms is not about max(%.1f, %.1f)", r,
              total * 1e3, busy * 1e3, comm_s * 1e3);
    }
}

static const struct comm_case cases[] = {
    COMM_CASE(test_split_into_tp_pp_dp_groups_reducing_concurrently),
    COMM_CASE(test_results_bitwise_identical_on_all_ranks_and_across_runs),
    COMM_CASE(test_bytes_sent_match_ring_formulas),
    COMM_CASE(test_async_allreduce_overlaps_a_busy_loop),
};

int main(int argc, char **argv)
{
    return comm_world_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
