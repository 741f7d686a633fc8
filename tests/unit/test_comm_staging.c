/* test_comm_staging.c — the socket backend on device buffers (comm.h's
 * struct comm_staging), with ranks as threads of this process, each with a
 * mock device: malloc'd regions it calls device memory, whose copies are
 * memcpy and count their bytes. Every operation, blocking, posted and waited
 * for, or posted and tested, in place and not, uneven counts with zeros:
 * device buffers give the bits host buffers give, the staging copied exactly
 * the bytes each operation reads and writes, at post and at completion, host
 * buffers are never staged, a failed request copies nothing back, and ASan
 * sees nothing leak. The collectives' results themselves are test_comm.c's. */
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "common/store/store.h"
#include "runtime/comm/comm.h"

#define SECRET "comm-staging-test-secret-0123456789"
#define N 4            /* ranks of the main world: uneven counts need zeros and more */
#define DEV_REGIONS 64 /* device buffers a rank holds at once */
#define E 4            /* float32's bytes */

/* ---- the mock device ------------------------------------------------------ */

struct mock_dev {
    struct {
        uint8_t *p;
        size_t bytes, mapped;
    } region[DEV_REGIONS];
    int n;
    bool closed; /* its regions are PROT_NONE but while copied */
    size_t to_host_bytes, to_device_bytes;
    int to_host_calls, to_device_calls;
    int strays; /* copies whose device side is not in one region, or whose host side is */
};

static int region_of(const struct mock_dev *m, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < m->n; i++) {
        uintptr_t lo = (uintptr_t)m->region[i].p, hi = lo + m->region[i].bytes;
        if (a >= lo && a < hi) return a + bytes <= hi ? i : -2;
    }
    return -1;
}

static bool mock_is_device(void *ctx, const void *p)
{
    return region_of(ctx, p, 0) >= 0;
}

/* While an operation runs its device memory is out of reach (PROT_NONE): a
 * backend that touched it instead of its host copy would crash the test.
 * The copies open the region they copy for the copy alone. */
static void dev_protect(struct mock_dev *m, int region, bool on)
{
    for (int i = region < 0 ? 0 : region; i < (region < 0 ? m->n : region + 1); i++)
        mprotect(m->region[i].p, m->region[i].mapped, on ? PROT_NONE : PROT_READ | PROT_WRITE);
}

static void mock_copy(struct mock_dev *m, void *dst, const void *src, size_t bytes, bool to_host)
{
    const void *dev = to_host ? src : dst, *host = to_host ? dst : src;
    int region = region_of(m, dev, bytes);
    if (region < 0 || region_of(m, host, 1) != -1) {
        m->strays++;
        return;
    }
    bool closed = m->closed;
    if (closed) dev_protect(m, region, false);
    memcpy(dst, src, bytes);
    if (closed) dev_protect(m, region, true);
    *(to_host ? &m->to_host_bytes : &m->to_device_bytes) += bytes;
    (*(to_host ? &m->to_host_calls : &m->to_device_calls))++;
}

static void mock_to_host(void *ctx, void *host, const void *dev, size_t bytes)
{
    mock_copy(ctx, host, dev, bytes, true);
}

static void mock_to_device(void *ctx, void *dev, const void *host, size_t bytes)
{
    mock_copy(ctx, dev, host, bytes, false);
}

/* bytes of "device memory" (at least 1, so every buffer has an address), 0xAB each */
static void *dev_alloc(struct mock_dev *m, size_t bytes)
{
    if (m->n == DEV_REGIONS) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), mapped = (bytes + page) / page * page;
    uint8_t *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    memset(p, 0xAB, mapped);
    m->region[m->n].p = p;
    m->region[m->n].bytes = bytes ? bytes : 1;
    m->region[m->n].mapped = mapped;
    m->n++;
    return p;
}

static void dev_free_all(struct mock_dev *m)
{
    for (int i = 0; i < m->n; i++) munmap(m->region[i].p, m->region[i].mapped);
    m->n = 0;
}

static void *host_alloc(size_t bytes)
{
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (p) memset(p, 0xAB, bytes ? bytes : 1);
    return p;
}

static void counters_reset(struct mock_dev *m)
{
    m->to_host_bytes = m->to_device_bytes = 0;
    m->to_host_calls = m->to_device_calls = m->strays = 0;
}

/* ---- ranks as threads ------------------------------------------------------ */

struct rank_ctx {
    int rank, n, port;
    enum comm_transport transport;
    struct mock_dev dev;
    struct comm_staging staging;
    struct comm *c;
    struct store *st;
    int failures;
    pthread_barrier_t *barrier;
    void (*body)(struct rank_ctx *x);
};

/* CHECK for a rank's thread: its own count, summed by the main thread */
#define RCHECK(x, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("  %s:%d: rank %d: check failed: %s: ", __FILE__, __LINE__, (x)->rank, #cond);  \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            (x)->failures++;                                                                       \
        }                                                                                          \
    } while (0)

static void *rank_main(void *arg)
{
    struct rank_ctx *x = arg;
    struct plait_error err;
    x->staging = (struct comm_staging){.ctx = &x->dev,
                                       .is_device = mock_is_device,
                                       .to_host = mock_to_host,
                                       .to_device = mock_to_device};
    struct comm_options opts = {.backend = COMM_BACKEND_SOCKET,
                                .timeout_s = 20,
                                .secret = SECRET,
                                .transport = x->transport,
                                .staging = &x->staging};
    if (store_connect(&x->st, "127.0.0.1", x->port, SECRET, x->rank, 10, &err) ||
        comm_world_init(&x->c, x->st, x->rank, x->n, &opts, &err)) {
        RCHECK(x, 0, "%s", err.text);
    } else {
        x->body(x);
    }
    comm_destroy(x->c);
    store_close(x->st);
    dev_free_all(&x->dev);
    return NULL;
}

/* Runs body on n ranks over a store of their own (a failure aborts its job). */
static void run_world(int n, enum comm_transport transport, void (*body)(struct rank_ctx *x))
{
    struct plait_error err;
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err)) {
        CHECK(0, "store server: %s", err.text);
        return;
    }
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    struct rank_ctx x[N];
    pthread_t th[N];
    for (int r = 0; r < n; r++) {
        x[r] = (struct rank_ctx){.rank = r,
                                 .n = n,
                                 .port = store_server_port(srv),
                                 .transport = transport,
                                 .barrier = &barrier,
                                 .body = body};
        pthread_create(&th[r], NULL, rank_main, &x[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECK(x[r].failures == 0, "rank %d: %d failures", r, x[r].failures);
    }
    pthread_barrier_destroy(&barrier);
    store_server_stop(srv);
}

/* ---- the operations ---------------------------------------------------------- */

enum op {
    OP_ALLREDUCE,
    OP_REDUCE_SCATTER,
    OP_REDUCE_SCATTER_V,
    OP_ALLGATHER,
    OP_ALLGATHER_V,
    OP_ALLTOALL_V,
    OP_BROADCAST,
    OP_SENDRECV,
    OP_BARRIER
};
enum form { BLOCKING, WAITED, TESTED }; /* comm_x; comm_ix + comm_wait; comm_ix + comm_test */
enum where { HOST, DEVICE, SEND_DEVICE, RECV_DEVICE };

static const char *op_names[] = {"all-reduce", "reduce-scatter", "reduce-scatter-v",
                                 "all-gather", "all-gather-v",   "all-to-all-v",
                                 "broadcast",  "send/recv",      "barrier"};
static const char *form_names[] = {"blocking", "waited", "tested"};

struct op_case {
    enum op op;
    size_t count;  /* elements (a block's, the buffer's); the _v forms' own counts below */
    bool in_place; /* all-reduce: send == recv; all-gather(_v): send is recv's own block */
};

/* uneven counts with zeros: every rank passes the same */
static const size_t rsv_counts[N] = {0, 700, 3, 0};
static const size_t agv_counts[N] = {5, 0, 1200, 9};
#define ROOT 1

/* elements rank `from` sends rank `to` in the all-to-all (zeros among them) */
static size_t a2a_count(int from, int to)
{
    return (from * 3 + to * 5) % 7 == 0 ? 0 : (size_t)(100 * (from + 1) + to);
}

static size_t sum(const size_t *counts, int n)
{
    size_t s = 0;
    for (int r = 0; r < n; r++) s += counts[r];
    return s;
}

/* One operation's buffers on one rank and what its staging must copy. */
struct layout {
    size_t send_bytes, recv_bytes; /* the buffers made (send_bytes 0 in place: inside recv) */
    size_t send_at;                /* in place: where send is in recv */
    size_t read, written;          /* what device buffers stage: in at post, out at completion */
    size_t a2a_send[N], a2a_recv[N];
};

static struct layout layout_of(const struct op_case *k, int r, int n)
{
    struct layout l = {0};
    size_t b = k->count * E;
    switch (k->op) {
    case OP_ALLREDUCE:
        l.send_bytes = l.recv_bytes = l.read = l.written = b;
        break;
    case OP_REDUCE_SCATTER:
        l.send_bytes = l.read = b * (size_t)n;
        l.recv_bytes = l.written = b;
        break;
    case OP_REDUCE_SCATTER_V:
        l.send_bytes = l.read = sum(rsv_counts, n) * E;
        l.recv_bytes = l.written = rsv_counts[r] * E;
        break;
    case OP_ALLGATHER:
        l.send_bytes = l.read = b;
        l.recv_bytes = l.written = b * (size_t)n;
        l.send_at = b * (size_t)r;
        break;
    case OP_ALLGATHER_V:
        l.send_bytes = l.read = agv_counts[r] * E;
        l.recv_bytes = l.written = sum(agv_counts, n) * E;
        l.send_at = sum(agv_counts, r) * E;
        break;
    case OP_ALLTOALL_V:
        for (int p = 0; p < n; p++) {
            l.a2a_send[p] = a2a_count(r, p);
            l.a2a_recv[p] = a2a_count(p, r);
        }
        l.send_bytes = l.read = sum(l.a2a_send, n) * E;
        l.recv_bytes = l.written = sum(l.a2a_recv, n) * E;
        break;
    case OP_BROADCAST:
        l.recv_bytes = b;
        *(r == ROOT ? &l.read : &l.written) = b;
        break;
    case OP_SENDRECV:
        l.send_bytes = l.recv_bytes = l.read = l.written = b;
        break;
    case OP_BARRIER:
        break;
    }
    if (k->in_place) l.send_bytes = 0;
    return l;
}

/* Rank r's input byte i of an operation: the same in every run of it. */
static uint8_t input(int r, size_t i, unsigned salt)
{
    uint32_t x = (uint32_t)(r * 7919 + i * 104729 + salt * 31);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    return (uint8_t)(x >> 24) & 0x3f; /* floats of modest exponent: no infinities */
}

static void fill_input(uint8_t *p, size_t bytes, int r, unsigned salt)
{
    for (size_t i = 0; i < bytes; i++) p[i] = input(r, i, salt);
}

/* Posts (or runs) k on c with send and recv; finishes it by form. */
static int issue(struct comm *c, const struct op_case *k, enum form form, const struct layout *l,
                 void *send, void *recv, struct plait_error *err)
{
    int r = comm_rank(c), n = comm_size(c);
    struct comm_request *req = NULL, *req2 = NULL;
    bool blocking = form == BLOCKING;
    int rc = 0;
    switch (k->op) {
    case OP_ALLREDUCE:
        rc = blocking ? comm_allreduce(c, send, recv, k->count, COMM_FLOAT32, COMM_SUM, err)
                      : comm_iallreduce(c, send, recv, k->count, COMM_FLOAT32, COMM_SUM, &req, err);
        break;
    case OP_REDUCE_SCATTER:
        rc = blocking
                 ? comm_reduce_scatter(c, send, recv, k->count, COMM_FLOAT32, COMM_MAX, err)
                 : comm_ireduce_scatter(c, send, recv, k->count, COMM_FLOAT32, COMM_MAX, &req, err);
        break;
    case OP_REDUCE_SCATTER_V:
        rc = blocking
                 ? comm_reduce_scatter_v(c, send, recv, rsv_counts, COMM_FLOAT32, COMM_SUM, err)
                 : comm_ireduce_scatter_v(c, send, recv, rsv_counts, COMM_FLOAT32, COMM_SUM, &req,
                                          err);
        break;
    case OP_ALLGATHER:
        rc = blocking ? comm_allgather(c, send, recv, k->count, COMM_FLOAT32, err)
                      : comm_iallgather(c, send, recv, k->count, COMM_FLOAT32, &req, err);
        break;
    case OP_ALLGATHER_V:
        rc = blocking ? comm_allgather_v(c, send, recv, agv_counts, COMM_FLOAT32, err)
                      : comm_iallgather_v(c, send, recv, agv_counts, COMM_FLOAT32, &req, err);
        break;
    case OP_ALLTOALL_V:
        rc = blocking ? comm_alltoall_v(c, send, l->a2a_send, recv, l->a2a_recv, COMM_FLOAT32, err)
                      : comm_ialltoall_v(c, send, l->a2a_send, recv, l->a2a_recv, COMM_FLOAT32,
                                         &req, err);
        break;
    case OP_BROADCAST:
        rc = blocking ? comm_broadcast(c, recv, k->count, COMM_FLOAT32, ROOT, err)
                      : comm_ibroadcast(c, recv, k->count, COMM_FLOAT32, ROOT, &req, err);
        break;
    case OP_SENDRECV: /* around the ring: to the next rank, from the one before */
        if (blocking && r % 2 == 0)
            rc = comm_send(c, send, l->read, (r + 1) % n, 7, err) ||
                 comm_recv(c, recv, l->written, (r + n - 1) % n, 7, err);
        else if (blocking)
            rc = comm_recv(c, recv, l->written, (r + n - 1) % n, 7, err) ||
                 comm_send(c, send, l->read, (r + 1) % n, 7, err);
        else
            rc = comm_irecv(c, recv, l->written, (r + n - 1) % n, 7, &req2, err) ||
                 comm_isend(c, send, l->read, (r + 1) % n, 7, &req, err);
        break;
    case OP_BARRIER:
        rc = comm_barrier(c, err);
        break;
    }
    if (rc) return -1;
    struct comm_request *reqs[2] = {req, req2};
    for (int i = 0; i < 2; i++) {
        if (!reqs[i]) continue;
        if (form == WAITED) {
            rc |= comm_wait(reqs[i], err);
            continue;
        }
        bool done = false;
        while (!done && comm_test(reqs[i], &done, err) == 0)
            if (!done) poll(NULL, 0, 1);
        rc |= !done;
    }
    return rc ? -1 : 0;
}

/* One run of k: its buffers where `where` says, the inputs filled, the
 * result's bytes (recv, then send) into out. */
static int run_once(struct rank_ctx *x, struct comm *c, const struct op_case *k, enum form form,
                    enum where where, uint8_t **out, size_t *out_bytes)
{
    struct plait_error err;
    int r = comm_rank(c), n = comm_size(c);
    struct layout l = layout_of(k, r, n);
    bool send_dev = where == DEVICE || where == SEND_DEVICE;
    bool recv_dev = where == DEVICE || where == RECV_DEVICE;
    uint8_t *recv_buf = recv_dev ? dev_alloc(&x->dev, l.recv_bytes) : host_alloc(l.recv_bytes);
    bool own_send = !k->in_place && k->op != OP_BROADCAST; /* else send is in recv */
    uint8_t *send = !own_send  ? recv_buf + l.send_at
                    : send_dev ? dev_alloc(&x->dev, l.send_bytes)
                               : host_alloc(l.send_bytes);
    /* a rank that gets no block of the uneven reduce-scatter may pass NULL */
    uint8_t *recv = k->op == OP_REDUCE_SCATTER_V && !rsv_counts[r] ? NULL : recv_buf;
    fill_input(send, l.read, r, (unsigned)k->op * 10 + (unsigned)k->in_place);
    counters_reset(&x->dev);
    dev_protect(&x->dev, -1, x->dev.closed = true);
    int rc = issue(c, k, form, &l, send, recv, &err);
    dev_protect(&x->dev, -1, x->dev.closed = false);
    RCHECK(x, rc == 0, "%s %s: %s", op_names[k->op], form_names[form], err.text);
    *out_bytes = l.recv_bytes + (own_send ? l.send_bytes : 0);
    *out = malloc(*out_bytes + 1);
    memcpy(*out, recv_buf, l.recv_bytes);
    if (own_send) memcpy(*out + l.recv_bytes, send, l.send_bytes);
    if (!recv_dev) free(recv_buf);
    if (!send_dev && own_send) free(send);
    return rc;
}

/* k on host buffers, then on device ones (and mixed): the same bits, the
 * staging's bytes exactly what k reads and writes, none for host buffers. */
static void check_case(struct rank_ctx *x, struct comm *c, const struct op_case *k, enum form form)
{
    int r = comm_rank(c), n = comm_size(c);
    struct layout l = layout_of(k, r, n);
    uint8_t *want, *got;
    size_t want_bytes, got_bytes;
    const char *name = op_names[k->op], *how = form_names[form];
    const char *place = k->in_place ? " in place" : "";
    run_once(x, c, k, form, HOST, &want, &want_bytes);
    RCHECK(x, x->dev.to_host_calls == 0 && x->dev.to_device_calls == 0,
           "%s%s %s on host buffers: %d copies in, %d out (host buffers are never staged)", name,
           place, how, x->dev.to_host_calls, x->dev.to_device_calls);
    enum where wheres[] = {DEVICE, SEND_DEVICE, RECV_DEVICE};
    int kinds = k->in_place || k->op == OP_BROADCAST || k->op == OP_BARRIER ? 1 : 3;
    for (int w = 0; w < kinds; w++) {
        run_once(x, c, k, form, wheres[w], &got, &got_bytes);
        const char *wn = w == 0 ? "device" : w == 1 ? "device send" : "device recv";
        RCHECK(x, got_bytes == want_bytes && !memcmp(got, want, want_bytes),
               "%s%s %s on %s buffers: not the bits of host buffers", name, place, how, wn);
        size_t in = wheres[w] == RECV_DEVICE ? 0 : l.read;
        size_t out = wheres[w] == SEND_DEVICE ? 0 : l.written;
        RCHECK(x, x->dev.to_host_bytes == in && x->dev.to_device_bytes == out,
               "%s%s %s on %s buffers: staged %zu bytes in and %zu out, want %zu and %zu", name,
               place, how, wn, x->dev.to_host_bytes, x->dev.to_device_bytes, in, out);
        RCHECK(x, x->dev.to_host_calls <= 1 && x->dev.to_device_calls <= 1 && !x->dev.strays,
               "%s%s %s on %s buffers: %d copies in, %d out, %d outside device memory", name, place,
               how, wn, x->dev.to_host_calls, x->dev.to_device_calls, x->dev.strays);
        free(got);
        dev_free_all(&x->dev);
    }
    free(want);
}

static const struct op_case cases[] = {
    {OP_ALLREDUCE, 5, false},        /* recursive doubling */
    {OP_ALLREDUCE, 3000, false},     /* the ring */
    {OP_ALLREDUCE, 3000, true},      /* in place */
    {OP_ALLREDUCE, 0, false},        /* nothing to move: nothing staged */
    {OP_REDUCE_SCATTER, 300, false}, /* size x count in, count out */
    {OP_REDUCE_SCATTER_V, 0, false}, /* rsv_counts: two ranks get nothing (recv NULL) */
    {OP_ALLGATHER, 300, false},      /* count in, size x count out */
    {OP_ALLGATHER, 300, true},       /* send is recv's own block */
    {OP_ALLGATHER_V, 0, false},      /* agv_counts: rank 1 sends nothing */
    {OP_ALLGATHER_V, 0, true},       /* the same in place */
    {OP_ALLTOALL_V, 0, false},       /* a2a_count: zeros among the blocks */
    {OP_BROADCAST, 5, false},        /* the tree: in on the root, out elsewhere */
    {OP_BROADCAST, 3000, false},     /* the chain */
    {OP_SENDRECV, 1000, false},      /* a ring of sends and receives */
    {OP_BARRIER, 0, false},          /* no buffers */
};

static void every_case_body(struct rank_ctx *x)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int form = BLOCKING; form <= TESTED; form++) check_case(x, x->c, &cases[i], form);
}

static void test_every_operation_on_device_buffers_matches_host_buffers(void)
{
    run_world(N, COMM_TRANSPORT_AUTO, every_case_body);
}

static void test_every_operation_on_device_buffers_over_tcp(void)
{
    run_world(N, COMM_TRANSPORT_TCP, every_case_body);
}

/* Inputs are copied when the operation is posted: the device buffers may
 * change at once (the caller's copy waited for whatever produced them). */
static void posted_inputs_body(struct rank_ctx *x)
{
    struct plait_error err;
    int r = x->rank, n = x->n;
    size_t count = 3000, bytes = count * E;
    float *host_send = host_alloc(bytes), *host_recv = host_alloc(bytes);
    float *dev_send = dev_alloc(&x->dev, bytes), *dev_recv = dev_alloc(&x->dev, bytes);
    float *dev_msg = dev_alloc(&x->dev, 64), *dev_in = dev_alloc(&x->dev, 64);
    fill_input((uint8_t *)host_send, bytes, r, 99);
    memcpy(dev_send, host_send, bytes);
    fill_input((uint8_t *)dev_msg, 64, r, 98);
    uint8_t want_msg[64];
    fill_input(want_msg, 64, (r + n - 1) % n, 98);
    struct comm_request *a, *s, *v;
    RCHECK(x, comm_allreduce(x->c, host_send, host_recv, count, COMM_FLOAT32, COMM_SUM, &err) == 0,
           "%s", err.text);
    RCHECK(x, comm_irecv(x->c, dev_in, 64, (r + n - 1) % n, 3, &v, &err) == 0, "%s", err.text);
    RCHECK(x,
           comm_iallreduce(x->c, dev_send, dev_recv, count, COMM_FLOAT32, COMM_SUM, &a, &err) == 0,
           "%s", err.text);
    RCHECK(x, comm_isend(x->c, dev_msg, 64, (r + 1) % n, 3, &s, &err) == 0, "%s", err.text);
    memset(dev_send, 0x7f, bytes); /* after post: the operation has its copy */
    memset(dev_msg, 0x7f, 64);
    RCHECK(x, comm_wait(s, &err) == 0 && comm_wait(a, &err) == 0 && comm_wait(v, &err) == 0, "%s",
           err.text);
    RCHECK(x, !memcmp(dev_recv, host_recv, bytes), "the all-reduce saw its input after post");
    RCHECK(x, !memcmp(dev_in, want_msg, 64), "the message sent is not the one posted");
    free(host_send);
    free(host_recv);
}

static void test_device_inputs_are_copied_when_posted(void)
{
    run_world(N, COMM_TRANSPORT_AUTO, posted_inputs_body);
}

/* A split's communicators stage as their parent does; one closed with a
 * staged request in flight frees it. */
static void split_body(struct rank_ctx *x)
{
    struct plait_error err;
    struct comm *half = NULL;
    RCHECK(x, comm_split(x->c, x->rank % 2, x->rank, "half", &half, &err) == 0, "%s", err.text);
    if (!half) return;
    struct op_case k = {OP_ALLREDUCE, 3000, false};
    check_case(x, half, &k, WAITED);
    struct op_case g = {OP_ALLGATHER, 300, true};
    check_case(x, half, &g, TESTED);
    /* closed with a staged receive in flight: freed with it (ASan); the
     * peer closes after, so the receive is still pending, not failed */
    int me = comm_rank(half);
    if (me == 1) pthread_barrier_wait(x->barrier);
    if (me == 0) {
        struct comm_request *never;
        void *buf = dev_alloc(&x->dev, 256);
        RCHECK(x, comm_irecv(half, buf, 256, 1, 9, &never, &err) == 0, "%s", err.text);
    }
    comm_destroy(half);
    if (me == 0) pthread_barrier_wait(x->barrier);
}

static void test_split_communicators_inherit_the_staging(void)
{
    run_world(N, COMM_TRANSPORT_AUTO, split_body);
}

/* Rank 1 leaves with rank 0's receives into device memory posted: they
 * fail, waited for and tested alike, copying nothing back (and their host
 * buffers are freed: ASan). */
static void failure_body(struct rank_ctx *x)
{
    struct plait_error err;
    if (x->rank == 1) {
        pthread_barrier_wait(x->barrier);
        comm_destroy(x->c);
        x->c = NULL;
        return;
    }
    uint8_t *a = dev_alloc(&x->dev, 4096), *b = dev_alloc(&x->dev, 4096);
    struct comm_request *waited = NULL, *tested = NULL;
    RCHECK(x, comm_irecv(x->c, a, 4096, 1, 1, &waited, &err) == 0, "%s", err.text);
    RCHECK(x, comm_irecv(x->c, b, 4096, 1, 2, &tested, &err) == 0, "%s", err.text);
    pthread_barrier_wait(x->barrier);
    RCHECK(x, comm_wait(waited, &err) != 0, "a receive from a rank that left succeeded");
    bool done = false;
    int rc = 0;
    for (int i = 0; i < 20000 && !done; i++) {
        rc = comm_test(tested, &done, &err);
        if (!done) poll(NULL, 0, 1);
    }
    RCHECK(x, done && rc != 0, "a tested receive from a rank that left: done %d, rc %d", done, rc);
    RCHECK(x, x->dev.to_device_calls == 0, "a failed receive copied %zu bytes back",
           x->dev.to_device_bytes);
}

static void test_failed_requests_copy_nothing_back_and_free_their_staging(void)
{
    run_world(2, COMM_TRANSPORT_AUTO, failure_body);
}

int main(void)
{
    RUN(test_every_operation_on_device_buffers_matches_host_buffers);
    RUN(test_every_operation_on_device_buffers_over_tcp);
    RUN(test_device_inputs_are_copied_when_posted);
    RUN(test_split_communicators_inherit_the_staging);
    RUN(test_failed_requests_copy_nothing_back_and_free_their_staging);
    printf("# %d passed, %d failed\n", tests_passed, tests_failed);
    return check_exit_code();
}
