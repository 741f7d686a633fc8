/* test_comm_nccl.c — what of the nccl collective backend can be checked
 * without a GPU: the nominal byte counts against the ring formulas, the unique
 * id's text form and store keys, the dtype and reduction mapping (where NCCL
 * is built), and that joining a world with no CUDA device fails at once, with
 * the reason, on every rank (through the store's abort) instead of waiting.
 * The collectives themselves run on GPUs: tests/gpu/test_nccl.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "check.h"
#include "common/store/store.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/comm_backend.h"
#include "runtime/comm/nccl_meta.h"
#include "seconds.h" // defines: now_s

#ifdef PLAIT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/comm/nccl_api.h"
#endif

#define SECRET "nccl-test-secret-0123456789abcdef"

/* Ring all-reduce: 2(N-1)/N of the buffer each way; reduce-scatter and
 * all-gather: N-1 blocks; a ring broadcast: the buffer from every rank but the
 * one before the root; point to point: the bytes, one way. The same numbers
 * test_comm checks the socket backend's payload against. */
static void test_nominal_bytes_follow_the_ring_formulas(void)
{
    static const int ns[] = {1, 2, 3, 4, 8};
    for (int t = 0; t < 5; t++) {
        int n = ns[t];
        uint64_t block = 4u << 20, sent, received;
        struct comm_desc ar = {.kind = COMM_OP_ALLREDUCE, .count = block / 4, .bytes = block};
        nccl_nominal_bytes(&ar, 0, n, &sent, &received);
        CHECK(sent == 2 * (uint64_t)(n - 1) * block / (uint64_t)n && received == sent,
              "n=%d all-reduce: %llu", n, (unsigned long long)sent);
        struct comm_desc rs = {.kind = COMM_OP_REDUCE_SCATTER, .bytes = block};
        nccl_nominal_bytes(&rs, n - 1, n, &sent, &received);
        CHECK(sent == (uint64_t)(n - 1) * block && received == sent, "n=%d reduce-scatter: %llu", n,
              (unsigned long long)sent);
        struct comm_desc ag = {.kind = COMM_OP_ALLGATHER, .bytes = block};
        nccl_nominal_bytes(&ag, 0, n, &sent, &received);
        CHECK(sent == (uint64_t)(n - 1) * block && received == sent, "n=%d all-gather: %llu", n,
              (unsigned long long)sent);
        for (int root = 0; root < n; root++) {
            uint64_t total_sent = 0, total_received = 0;
            for (int r = 0; r < n; r++) {
                struct comm_desc b = {.kind = COMM_OP_BROADCAST, .bytes = block, .root = root};
                nccl_nominal_bytes(&b, r, n, &sent, &received);
                CHECK(r != root || received == 0, "n=%d root %d receives", n, root);
                total_sent += sent;
                total_received += received;
            }
            CHECK(total_sent == (uint64_t)(n - 1) * block && total_received == total_sent,
                  "n=%d broadcast from %d: %llu sent", n, root, (unsigned long long)total_sent);
        }
        struct comm_desc s = {.kind = COMM_OP_SEND, .bytes = 1000, .peer = 1};
        nccl_nominal_bytes(&s, 0, n, &sent, &received);
        CHECK(n == 1 || (sent == 1000 && received == 0), "n=%d send", n);
        s.kind = COMM_OP_RECV;
        nccl_nominal_bytes(&s, 0, n, &sent, &received);
        CHECK(n == 1 || (sent == 0 && received == 1000), "n=%d receive", n);
        struct comm_desc bar = {.kind = COMM_OP_BARRIER};
        nccl_nominal_bytes(&bar, 0, n, &sent, &received);
        CHECK(sent == 2 * (uint64_t)(n - 1) * 4 / (uint64_t)n, "n=%d barrier: %llu", n,
              (unsigned long long)sent);
    }
    /* uneven, as the socket rings: the reduce-scatter sends every block but
     * its own and receives all but the previous rank's; the all-gather sends
     * all but the next rank's and receives all but its own */
    static const size_t counts[] = {3, 0, 5, 2};
    static const struct {
        enum comm_op_kind kind;
        int rank;
        uint64_t sent, received; /* floats */
    } uneven[] = {{COMM_OP_REDUCE_SCATTER, 1, 10, 7},
                  {COMM_OP_REDUCE_SCATTER, 0, 7, 8},
                  {COMM_OP_ALLGATHER, 1, 5, 10},
                  {COMM_OP_ALLGATHER, 3, 7, 8}};
    for (size_t k = 0; k < sizeof uneven / sizeof *uneven; k++) {
        uint64_t sent, received;
        struct comm_desc d = {.kind = uneven[k].kind, .counts = counts, .dtype = COMM_FLOAT32};
        nccl_nominal_bytes(&d, uneven[k].rank, 4, &sent, &received);
        CHECK(sent == uneven[k].sent * 4 && received == uneven[k].received * 4,
              "uneven %s, rank %d: %llu out, %llu in", comm_op_kind_name(uneven[k].kind),
              uneven[k].rank, (unsigned long long)sent, (unsigned long long)received);
    }
    /* all-to-all: every block but its own, each way */
    static const size_t out[] = {3, 0, 5, 2}, in[] = {1, 4, 5, 6};
    struct comm_desc a2a = {
        .kind = COMM_OP_ALLTOALL, .counts = out, .recv_counts = in, .dtype = COMM_FLOAT32};
    uint64_t sent, received;
    nccl_nominal_bytes(&a2a, 2, 4, &sent, &received);
    CHECK(sent == 5 * 4 && received == 11 * 4, "all-to-all, rank 2: %llu out, %llu in",
          (unsigned long long)sent, (unsigned long long)received);
}

static void test_unique_id_round_trips_through_its_store_text(void)
{
    unsigned char id[128], back[128];
    char text[2 * sizeof id + 2];
    CHECK(getrandom(id, sizeof id, 0) == (ssize_t)sizeof id, "getrandom");
    nccl_hex_encode(id, sizeof id, text);
    CHECK(strlen(text) == 2 * sizeof id, "%zu digits", strlen(text));
    CHECK(nccl_hex_decode(text, back, sizeof back) == 0 && !memcmp(id, back, sizeof id),
          "round trip");
    text[7] = 'g';
    CHECK(nccl_hex_decode(text, back, sizeof back) != 0, "a non-hex digit");
    nccl_hex_encode(id, sizeof id, text);
    text[2 * sizeof id - 1] = '\0';
    CHECK(nccl_hex_decode(text, back, sizeof back) != 0, "one digit short");
    nccl_hex_encode(id, sizeof id, text);
    strcat(text, "0");
    CHECK(nccl_hex_decode(text, back, sizeof back) != 0, "one digit long");
#ifdef PLAIT_HAVE_NCCL
    CHECK(sizeof(((ncclUniqueId *)0)->internal) == sizeof id, "ncclUniqueId is %zu bytes",
          sizeof(((ncclUniqueId *)0)->internal));
#endif
}

static void test_store_keys_are_namespaced_by_communicator(void)
{
    char key[COMM_MAX_NAME_BYTES + 64];
    nccl_store_key(key, sizeof key, "run-3.dp.1", "id");
    CHECK(!strcmp(key, "comm/run-3.dp.1/nccl/id"), "%s", key);
    nccl_store_key(key, sizeof key, "world", "member/7");
    CHECK(!strcmp(key, "comm/world/nccl/member/7"), "%s", key);
}

static void test_dtypes_and_reductions_map_to_nccl(void)
{
#ifdef PLAIT_HAVE_NCCL
    static const struct {
        enum comm_dtype dtype;
        ncclDataType_t want;
    } types[] = {{COMM_FLOAT32, ncclFloat32}, {COMM_FLOAT64, ncclFloat64}, {COMM_INT64, ncclInt64}};
    for (size_t i = 0; i < 3; i++) {
        int t, op;
        comm_nccl_types(types[i].dtype, COMM_SUM, &t, &op);
        CHECK(t == (int)types[i].want && op == (int)ncclSum, "dtype %d: %d, op %d", (int)i, t, op);
        comm_nccl_types(types[i].dtype, COMM_MAX, &t, &op);
        CHECK(op == (int)ncclMax, "max: %d", op);
    }
#else
    SKIP("this build has no NCCL");
#endif
}

/* ---- joining without a GPU ------------------------------------------------ */

struct joiner {
    int rank, port;
    void *stream; /* comm_options.stream */
    int rc;
    double seconds;
    char text[1100];
};

static void *join_main(void *arg)
{
    struct joiner *j = arg;
    struct plait_error err;
    struct store *st = NULL;
    double t0 = now_s();
    j->rc = -1;
    if (store_connect(&st, "127.0.0.1", j->port, SECRET, j->rank, 5, &err)) {
        snprintf(j->text, sizeof j->text, "store: %s", err.text);
        return NULL;
    }
    struct comm_options o = {.backend = COMM_BACKEND_NCCL,
                             .timeout_s = 20,
                             .secret = SECRET,
                             .name = "gpuless",
                             .stream = j->stream};
    struct comm *c = NULL;
    j->rc = comm_world_init(&c, st, j->rank, 2, &o, &err);
    j->seconds = now_s() - t0;
    snprintf(j->text, sizeof j->text, "%s", j->rc ? err.text : "joined");
    comm_destroy(c);
    store_close(st);
    return NULL;
}

static bool gpu_present(void)
{
#ifdef PLAIT_HAVE_NCCL
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

/* Both ranks of a world of 2 fail at once (not at the 20 s deadline), each
 * saying why, and the job's abort key carries it to any other process. Rank
 * 1 passes a compute stream (as plait-train does): without a device it is
 * never touched (it is no stream at all here). */
static void test_joining_without_a_gpu_fails_at_once_saying_so(void)
{
    if (gpu_present()) {
        SKIP("a GPU is present (tests/gpu/run.sh tests the backend on it)");
    }
    struct plait_error err;
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err)) {
        CHECK(0, "store server: %s", err.text);
        return;
    }
    struct joiner j[2] = {{.rank = 0}, {.rank = 1}};
    j[1].stream = &j[1];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        j[r].port = store_server_port(srv);
        pthread_create(&th[r], NULL, join_main, &j[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
#ifdef PLAIT_HAVE_NCCL
    const char *want = "no CUDA device";
#else
    const char *want = "not in this build";
#endif
    for (int r = 0; r < 2; r++) {
        printf("  rank %d after %.3f s: %s\n", r, j[r].seconds, j[r].text);
        CHECK(j[r].rc != 0 && strstr(j[r].text, want) && strstr(j[r].text, "comm 'gpuless'"),
              "rank %d: %s", r, j[r].text);
        CHECK(j[r].seconds < 5, "rank %d took %.1f s", r, j[r].seconds);
    }
#ifdef PLAIT_HAVE_NCCL
    struct store *st;
    void *value = NULL;
    size_t bytes;
    CHECK(store_connect(&st, "127.0.0.1", store_server_port(srv), SECRET, 9, 5, &err) == 0, "%s",
          err.text);
    CHECK(store_get(st, STORE_ABORT_KEY, &value, &bytes, 1, &err) == 0 &&
              strstr(value, "no CUDA device"),
          "the job's abort: %s", value ? (char *)value : err.text);
    free(value);
    store_close(st);
#endif
    store_server_stop(srv);
}

/* plait-train links neither NCCL nor the CUDA runtime: the backend loads them on its first
 * communicator. Every function of its table resolves in the libraries this build found (no
 * GPU needed to load them), and the table is the same on every call. */
static void test_the_backend_loads_every_nccl_and_cuda_function_it_calls(void)
{
#ifdef PLAIT_HAVE_NCCL
    struct plait_error err = {.text = ""};
    const struct nccl_api *a = nccl_api(&err);
    CHECK(a != NULL, "%s", err.text);
    if (!a) return;
    const void *const *slot = (const void *const *)a;
    for (size_t i = 0; i < sizeof *a / sizeof(void *); i++)
        CHECK(slot[i] != NULL, "function %zu of the table is NULL", i);
    CHECK(a->ncclAllReduce == &ncclAllReduce && a->cudaSetDevice == &cudaSetDevice,
          "the table's functions are not the libraries' (this test links both)");
    CHECK(nccl_api(&err) == a, "a second call loaded again");
#else
    SKIP("no NCCL in this build");
#endif
}

int main(void)
{
    RUN(test_the_backend_loads_every_nccl_and_cuda_function_it_calls);
    RUN(test_nominal_bytes_follow_the_ring_formulas);
    RUN(test_unique_id_round_trips_through_its_store_text);
    RUN(test_store_keys_are_namespaced_by_communicator);
    RUN(test_dtypes_and_reductions_map_to_nccl);
    RUN(test_joining_without_a_gpu_fails_at_once_saying_so);
    return check_exit_code();
}
