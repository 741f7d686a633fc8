/* comm_nccl.c — the nccl backend of comm.h, for GPU ranks: communicators from
 * a unique id passed through the job's store (split with ncclCommSplit), made
 * non-blocking and polled against the deadline and the job's abort; every
 * operation on the communicator's own CUDA stream, completed by a cudaEvent;
 * ncclCommAbort when a deadline passes. Compiled only where nccl.h and
 * libnccl are (Makefile), loaded at run time (nccl_api.h); what needs no CUDA is nccl_meta.c's, the store
 * connections and abort watcher are sock_job.c's. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/comm_backend.h"
#include "runtime/comm/nccl_api.h"
#include "runtime/comm/nccl_meta.h"
#include "runtime/comm/sock_connect.h" /* sock_now_ms */
#include "runtime/comm/sock_job.h"

/* Every NCCL and CUDA runtime call below goes through the table loaded when the first
 * communicator is made (nccl_api.h): plait-train links neither library. */
static const struct nccl_api *N;
#define cudaEventCreateWithFlags(...) N->cudaEventCreateWithFlags(__VA_ARGS__)
#define cudaEventDestroy(...) N->cudaEventDestroy(__VA_ARGS__)
#define cudaEventQuery(...) N->cudaEventQuery(__VA_ARGS__)
#define cudaEventRecord(...) N->cudaEventRecord(__VA_ARGS__)
#define cudaFreeAsync(...) N->cudaFreeAsync(__VA_ARGS__)
#define cudaFreeHost(...) N->cudaFreeHost(__VA_ARGS__)
#define cudaGetDevice(...) N->cudaGetDevice(__VA_ARGS__)
#define cudaGetDeviceCount(...) N->cudaGetDeviceCount(__VA_ARGS__)
#define cudaGetErrorName(...) N->cudaGetErrorName(__VA_ARGS__)
#define cudaGetErrorString(...) N->cudaGetErrorString(__VA_ARGS__)
#define cudaMallocAsync(...) N->cudaMallocAsync(__VA_ARGS__)
#define cudaMallocHost(...) N->cudaMallocHost(__VA_ARGS__)
#define cudaMemcpyAsync(...) N->cudaMemcpyAsync(__VA_ARGS__)
#define cudaMemsetAsync(...) N->cudaMemsetAsync(__VA_ARGS__)
#define cudaPointerGetAttributes(...) N->cudaPointerGetAttributes(__VA_ARGS__)
#define cudaSetDevice(...) N->cudaSetDevice(__VA_ARGS__)
#define cudaStreamCreateWithFlags(...) N->cudaStreamCreateWithFlags(__VA_ARGS__)
#define cudaStreamDestroy(...) N->cudaStreamDestroy(__VA_ARGS__)
#define cudaStreamWaitEvent(...) N->cudaStreamWaitEvent(__VA_ARGS__)
#define ncclAllGather(...) N->ncclAllGather(__VA_ARGS__)
#define ncclAllReduce(...) N->ncclAllReduce(__VA_ARGS__)
#define ncclBroadcast(...) N->ncclBroadcast(__VA_ARGS__)
#define ncclCommAbort(...) N->ncclCommAbort(__VA_ARGS__)
#define ncclCommDestroy(...) N->ncclCommDestroy(__VA_ARGS__)
#define ncclCommFinalize(...) N->ncclCommFinalize(__VA_ARGS__)
#define ncclCommGetAsyncError(...) N->ncclCommGetAsyncError(__VA_ARGS__)
#define ncclCommInitRankConfig(...) N->ncclCommInitRankConfig(__VA_ARGS__)
#define ncclCommSplit(...) N->ncclCommSplit(__VA_ARGS__)
#define ncclGetErrorString(...) N->ncclGetErrorString(__VA_ARGS__)
#define ncclGetLastError(...) N->ncclGetLastError(__VA_ARGS__)
#define ncclGetUniqueId(...) N->ncclGetUniqueId(__VA_ARGS__)
#define ncclGroupEnd(...) N->ncclGroupEnd(__VA_ARGS__)
#define ncclGroupStart(...) N->ncclGroupStart(__VA_ARGS__)
#define ncclRecv(...) N->ncclRecv(__VA_ARGS__)
#define ncclReduce(...) N->ncclReduce(__VA_ARGS__)
#define ncclReduceScatter(...) N->ncclReduceScatter(__VA_ARGS__)
#define ncclSend(...) N->ncclSend(__VA_ARGS__)

#define POLL_MIN_US 20                        /* a waiter's first sleep between polls */
#define POLL_MAX_US 1000                      /* and its longest */
#define WHO_BYTES 112                         /* "rank r (global g, host h, pid p, GPU d)" */
#define WHO_LISTED 8                          /* members a timeout message lists */
#define PINNED_FIRST_BYTES ((size_t)64 << 10) /* host staging made with the communicator */

struct nccl_request;

struct nccl_comm {
    struct comm base;
    struct sock_job *job; /* store connections and the abort watcher, shared with splits */
    ncclComm_t nc;        /* NULL once aborted */
    cudaStream_t stream;  /* every operation, in posting order */
    cudaStream_t compute; /* NULL, or the stream an operation's data comes from */
    cudaEvent_t produced; /* recorded on compute before each launch */
    struct pinned *pool;  /* free page-locked buffers for staging host memory */
    struct pinned *lent;  /* the ones requests hold */
    float *barrier_dev;   /* (1) a barrier's all-reduce */
    int device;
    double timeout_s;
    char (*who)[WHO_BYTES];                      /* [size]: each member, for messages */
    long *pid;                                   /* [size]: its process id */
    bool *local;                                 /* [size]: whether it shares our node */
    uint64_t seq;                                /* operations posted */
    struct nccl_request *pending, *pending_tail; /* in posting order */
    int group_depth;                             /* comm_group_start minus _end */
    pthread_mutex_t mu;                          /* the watcher's abort flag and text */
    bool abort_pending;
    char abort_text[700];
    bool failed, fail_peer_lost; /* fail_peer_lost: plait_error's peer_lost */
    char fail_text[1000];
    uint64_t bytes_sent, bytes_received;
    double wait_s;
};

/* Page-locked host memory, so copies of staged host buffers are truly
 * asynchronous (from pageable memory the driver may wait for the stream,
 * behind an operation that never ends). Kept until the communicator closes:
 * cudaFreeHost waits for the whole device. */
struct pinned {
    struct pinned *next;
    size_t bytes;
    void *host;
};

/* A host buffer of an operation: copied into pin, to dev (device memory
 * for the operation's life on the stream), and back. */
struct staged {
    void *user; /* the caller's buffer */
    void *dev;  /* NULL: user is device memory */
    struct pinned *pin;
    size_t bytes;
};

struct nccl_request {
    struct comm_request base;
    struct nccl_comm *c;
    struct nccl_request *prev, *next;
    cudaEvent_t done; /* recorded after the operation on c->stream */
    struct comm_desc d;
    uint64_t seq;
    int64_t deadline_ms;
    struct staged in, out; /* .dev NULL: the caller's buffer is device memory */
    bool launched;         /* false: posted in a group that has not ended */
};

static const struct comm_backend_ops nccl_ops;

/* ---- checked calls ------------------------------------------------------ */

static int cuda_check(cudaError_t e, const char *call, const char *file, int line,
                      struct plait_error *err)
{
    if (e == cudaSuccess) return 0;
    return error_set(err, "%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

static int nccl_check(ncclResult_t r, ncclComm_t nc, const char *call, const char *file, int line,
                      struct plait_error *err)
{
    if (r == ncclSuccess || r == ncclInProgress) return 0;
    const char *last = ncclGetLastError(nc);
    return error_set(err, "%s:%d: %s: %s%s%s", file, line, call, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__, err)
/* ncclInProgress is no error: the caller polls (wait_ready) */
#define NCCL_CHECK(nc, call) nccl_check((call), (nc), #call, __FILE__, __LINE__, err)

static void sleep_us(int64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- failure ------------------------------------------------------------ */

/* Whether the watcher has seen the job's abort (its text into out). */
static bool abort_seen(struct nccl_comm *c, char *out, size_t out_bytes)
{
    pthread_mutex_lock(&c->mu);
    bool seen = c->abort_pending;
    if (seen) snprintf(out, out_bytes, "%s", c->abort_text);
    pthread_mutex_unlock(&c->mu);
    return seen;
}

/* Fails the communicator: every pending and later operation reports the
 * text, NCCL's kernels are stopped (ncclCommAbort), and with report the job
 * is aborted through the store so every other rank fails at once too.
 * peer_lost: the cause is another process (gone, silent, the job aborted). */
static void fail_comm(struct nccl_comm *c, bool report, bool peer_lost, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_comm(struct nccl_comm *c, bool report, bool peer_lost, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = true;
    c->fail_peer_lost = peer_lost;
    char text[sizeof c->fail_text - 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(c->fail_text, sizeof c->fail_text, "comm '%s' rank %d of %d: %s", c->base.name,
             c->base.rank, c->base.size, text);
    if (c->nc) {
        ncclCommAbort(c->nc); /* frees it; what it says no longer matters */
        c->nc = NULL;
    }
    if (report) sock_job_abort(c->job, c->fail_text);
}

/* Who is to blame, for a message: the members on this node whose process
 * has ended (true), or else every member (NCCL cannot say which one is
 * missing or stuck; one on another node may have died). */
static bool describe_members(const struct nccl_comm *c, char *out, size_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < c->base.size && used < n; r++) {
        if (r == c->base.rank || !c->local[r] || c->pid[r] <= 0) continue;
        if (kill((pid_t)c->pid[r], 0) == 0 || errno != ESRCH) continue;
        int k = snprintf(out + used, n - used, "%s%s is gone (its process ended)", used ? "; " : "",
                         c->who[r]);
        if (k > 0) used += (size_t)k;
    }
    if (used) return true;
    used = (size_t)snprintf(out, n,
                            "a member is missing or stuck (NCCL cannot say which); "
                            "members: ");
    for (int r = 0; r < c->base.size && r < WHO_LISTED && used < n; r++) {
        int k = snprintf(out + used, n - used, "%s%s", r ? "; " : "", c->who[r]);
        if (k > 0) used += (size_t)k;
    }
    if (c->base.size > WHO_LISTED && used < n) snprintf(out + used, n - used, "; ...");
    return false;
}

/* Polls a communicator NCCL is still making (init, split) or finishing
 * (finalize) until it is ready, by deadline_ms, or until the job is aborted;
 * on failure, aborts it. what: for the message. */
static int wait_ready(struct nccl_comm *c, ncclComm_t nc, const char *what, int64_t deadline_ms,
                      struct plait_error *err)
{
    int64_t sleep = POLL_MIN_US;
    char reason[sizeof c->abort_text];
    for (;;) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(nc, &state);
        if (r != ncclSuccess) state = r;
        if (state == ncclSuccess) return 0;
        if (state != ncclInProgress) {
            const char *last = ncclGetLastError(nc);
            error_set(err, "NCCL %s failed: %s%s%s", what, ncclGetErrorString(state),
                      last && *last ? ": " : "", last ? last : "");
            break;
        }
        if (abort_seen(c, reason, sizeof reason)) {
            error_peer_lost(err, "NCCL %s stopped: the job was aborted: %s", what, reason);
            break;
        }
        if (sock_now_ms() >= deadline_ms) {
            char members[WHO_LISTED * WHO_BYTES];
            describe_members(c, members, sizeof members);
            error_peer_lost(err, "NCCL %s did not finish within %.1f s: %s", what, c->timeout_s,
                            members);
            break;
        }
        sleep_us(sleep);
        if (sleep < POLL_MAX_US) sleep *= 2;
    }
    ncclCommAbort(nc);
    return -1;
}

/* ---- requests ----------------------------------------------------------- */

static int pin_take(struct nccl_comm *c, size_t bytes, struct pinned **out, struct plait_error *err)
{
    struct pinned **at = &c->pool;
    while (*at && (*at)->bytes < bytes) at = &(*at)->next;
    struct pinned *p = *at;
    if (p) {
        *at = p->next;
    } else {
        p = calloc(1, sizeof *p);
        if (!p) return error_errno(err, "allocating");
        p->bytes = bytes < 4096 ? 4096 : bytes;
        if (CUDA_CHECK(cudaMallocHost(&p->host, p->bytes))) {
            free(p);
            return -1;
        }
    }
    p->next = c->lent;
    c->lent = p;
    *out = p;
    return 0;
}

static void pin_return(struct nccl_comm *c, struct pinned *p)
{
    struct pinned **at = &c->lent;
    while (*at && *at != p) at = &(*at)->next;
    if (*at) *at = p->next;
    p->next = c->pool;
    c->pool = p;
}

static void staged_free(struct nccl_comm *c, struct staged *s)
{
    if (s->dev) cudaFreeAsync(s->dev, c->stream); /* after what the stream holds */
    if (s->pin) pin_return(c, s->pin);
    s->dev = NULL;
    s->pin = NULL;
}

static void request_free(struct nccl_request *q)
{
    struct nccl_comm *c = q->c;
    if (q->prev)
        q->prev->next = q->next;
    else
        c->pending = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        c->pending_tail = q->prev;
    if (q->done) cudaEventDestroy(q->done); /* released once complete, if it is not */
    staged_free(c, &q->in);
    staged_free(c, &q->out);
    free(q);
}

/* Device memory for a host buffer of the operation (none for device memory),
 * its contents copied in on c->stream when copy_in. The runtime's device
 * buffers never take this path; host values (comm_split's colors, a flag
 * agreed on) do. */
static int stage(struct nccl_comm *c, struct staged *s, const void *buf, size_t bytes, bool copy_in,
                 struct plait_error *err)
{
    *s = (struct staged){.user = (void *)buf, .bytes = bytes};
    if (!buf || !bytes) return 0;
    struct cudaPointerAttributes a;
    if (CUDA_CHECK(cudaPointerGetAttributes(&a, buf))) return -1;
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return 0;
    if (pin_take(c, bytes, &s->pin, err) || CUDA_CHECK(cudaMallocAsync(&s->dev, bytes, c->stream)))
        return -1;
    if (copy_in) {
        memcpy(s->pin->host, buf, bytes);
        if (CUDA_CHECK(
                cudaMemcpyAsync(s->dev, s->pin->host, bytes, cudaMemcpyHostToDevice, c->stream)))
            return -1;
    }
    return 0;
}

static void *dev_ptr(const struct staged *s)
{
    return s->dev ? s->dev : s->user;
}

static ncclDataType_t nccl_dtype(enum comm_dtype dtype)
{
    switch (dtype) {
    case COMM_FLOAT32:
        break;
    case COMM_FLOAT64:
        return ncclFloat64;
    case COMM_INT64:
        return ncclInt64;
    case COMM_BFLOAT16:
        return ncclBfloat16;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(enum comm_reduce_op op)
{
    return op == COMM_MAX ? ncclMax : ncclSum;
}

int comm_nccl_types(enum comm_dtype dtype, enum comm_reduce_op op, int *nccl_dtype_out,
                    int *nccl_op_out)
{
    *nccl_dtype_out = (int)nccl_dtype(dtype);
    *nccl_op_out = (int)nccl_op(op);
    return 0;
}

/* The uneven collectives, one NCCL call per non-empty block b, rooted at
 * rank b and grouped (the caller's group: they run together): the
 * reduce-scatter a reduce of block b to its owner, the all-gather a
 * broadcast of block b from its owner. */
static ncclResult_t per_block(struct nccl_comm *c, const struct comm_desc *d, const void *in,
                              void *out)
{
    ncclDataType_t t = nccl_dtype(d->dtype);
    size_t e = comm_dtype_bytes(d->dtype), off = 0;
    bool gather = d->kind == COMM_OP_ALLGATHER;
    ncclResult_t r = ncclSuccess;
    for (int b = 0; b < c->base.size && (r == ncclSuccess || r == ncclInProgress); b++) {
        if (d->counts[b] && gather)
            r = ncclBroadcast(in, (char *)out + off * e, d->counts[b], t, b, c->nc, c->stream);
        else if (d->counts[b])
            r = ncclReduce((const char *)in + off * e, out, d->counts[b], t, nccl_op(d->op), b,
                           c->nc, c->stream);
        off += d->counts[b];
    }
    return r;
}

/* The uneven all-to-all: each peer's block sent and its block received,
 * grouped, the rank's own block copied on the stream. */
static ncclResult_t alltoall_v(struct nccl_comm *c, const struct comm_desc *d, const void *in,
                               void *out)
{
    ncclDataType_t t = nccl_dtype(d->dtype);
    size_t e = comm_dtype_bytes(d->dtype), so = 0, ro = 0;
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < c->base.size && (r == ncclSuccess || r == ncclInProgress); k++) {
        const char *src = (const char *)in + so;
        char *dst = (char *)out + ro;
        if (k == c->base.rank && d->counts[k])
            r = cudaMemcpyAsync(dst, src, d->counts[k] * e, cudaMemcpyDeviceToDevice, c->stream) ==
                        cudaSuccess
                    ? ncclSuccess
                    : ncclUnhandledCudaError;
        if (k != c->base.rank && d->counts[k] && (r == ncclSuccess || r == ncclInProgress))
            r = ncclSend(src, d->counts[k], t, k, c->nc, c->stream);
        if (k != c->base.rank && d->recv_counts[k] && (r == ncclSuccess || r == ncclInProgress))
            r = ncclRecv(dst, d->recv_counts[k], t, k, c->nc, c->stream);
        so += d->counts[k] * e;
        ro += d->recv_counts[k] * e;
    }
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess && r != ncclInProgress ? r : end;
}

/* Enqueues d on c->stream (in and out: where its data is on the device). */
static ncclResult_t launch(struct nccl_comm *c, const struct comm_desc *d, const void *in,
                           void *out)
{
    ncclDataType_t t = nccl_dtype(d->dtype);
    ncclResult_t r;
    switch (d->kind) {
    case COMM_OP_ALLREDUCE:
        return ncclAllReduce(in, out, d->count, t, nccl_op(d->op), c->nc, c->stream);
    case COMM_OP_REDUCE_SCATTER:
        if (!d->counts)
            return ncclReduceScatter(in, out, d->count, t, nccl_op(d->op), c->nc, c->stream);
        return per_block(c, d, in, out);
    case COMM_OP_ALLGATHER:
        if (d->counts) return per_block(c, d, in, out);
        return ncclAllGather(in, out, d->count, t, c->nc, c->stream);
    case COMM_OP_BROADCAST:
        return ncclBroadcast(in, out, d->count, t, d->root, c->nc, c->stream);
    case COMM_OP_ALLTOALL:
        return alltoall_v(c, d, in, out);
    case COMM_OP_BARRIER:
        return ncclAllReduce(c->barrier_dev, c->barrier_dev, 1, ncclFloat32, ncclSum, c->nc,
                             c->stream);
    case COMM_OP_SEND:
    case COMM_OP_RECV:
        r = ncclGroupStart();
        if (r != ncclSuccess) return r;
        if (d->kind == COMM_OP_SEND)
            r = ncclSend(in, d->bytes, ncclUint8, d->peer, c->nc, c->stream);
        else
            r = ncclRecv(out, d->bytes, ncclUint8, d->peer, c->nc, c->stream);
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess && r != ncclInProgress ? r : end;
    }
    return ncclInvalidArgument;
}

static void op_name(const struct nccl_request *q, char *out, size_t n)
{
    const struct comm_desc *d = &q->d;
    if (d->kind == COMM_OP_SEND || d->kind == COMM_OP_RECV)
        snprintf(out, n, "%s #%" PRIu64 " of %zu bytes %s rank %d (tag %" PRIu32 ")",
                 comm_op_kind_name(d->kind), q->seq, d->bytes,
                 d->kind == COMM_OP_SEND ? "to" : "from", d->peer, d->tag);
    else
        snprintf(out, n, "%s #%" PRIu64 " of %zu bytes", comm_op_kind_name(d->kind), q->seq,
                 d->bytes);
}

/* The communicator's failure as an error. */
static int failure(const struct nccl_comm *c, struct plait_error *err)
{
    return c->fail_peer_lost ? error_peer_lost(err, "%s", c->fail_text)
                             : error_set(err, "%s", c->fail_text);
}

/* Fails for a communicator that has failed, or whose job was aborted. */
static int check_alive(struct nccl_comm *c, struct plait_error *err)
{
    char reason[sizeof c->abort_text];
    if (!c->failed && abort_seen(c, reason, sizeof reason))
        fail_comm(c, false, true, "the job was aborted: %s", reason);
    if (c->failed) return failure(c, err);
    return 0;
}

/* After q is enqueued: results of staged buffers back to pinned memory,
 * staging freed, the completion event, the byte counts. */
static int finish_launch(struct nccl_request *q, struct plait_error *err)
{
    struct nccl_comm *c = q->c;
    if (q->out.dev && CUDA_CHECK(cudaMemcpyAsync(q->out.pin->host, q->out.dev, q->out.bytes,
                                                 cudaMemcpyDeviceToHost, c->stream)))
        return -1;
    if (q->in.dev && CUDA_CHECK(cudaFreeAsync(q->in.dev, c->stream))) return -1;
    q->in.dev = NULL;
    if (q->out.dev && CUDA_CHECK(cudaFreeAsync(q->out.dev, c->stream))) return -1;
    q->out.dev = NULL;
    if (CUDA_CHECK(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming)) ||
        CUDA_CHECK(cudaEventRecord(q->done, c->stream)))
        return -1;
    q->launched = true;
    uint64_t sent, received;
    nccl_nominal_bytes(&q->d, c->base.rank, c->base.size, &sent, &received);
    c->bytes_sent += sent;
    c->bytes_received += received;
    return 0;
}

/* Enqueues qs[0..n) as one NCCL group (a group of one for a lone operation)
 * and waits until NCCL has taken it. On failure the communicator has failed. */
static int launch_group(struct nccl_comm *c, struct nccl_request **qs, int n,
                        struct plait_error *err)
{
    char what[200];
    op_name(qs[0], what, sizeof what);
    if (n > 1) snprintf(what + strlen(what), sizeof what - strlen(what), " and %d more", n - 1);
    if (CUDA_CHECK(cudaSetDevice(c->device))) goto fail;
    /* the compute stream's work so far (what made the data) before NCCL's */
    if (c->compute && (CUDA_CHECK(cudaEventRecord(c->produced, c->compute)) ||
                       CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->produced, 0))))
        goto fail;
    if (NCCL_CHECK(c->nc, ncclGroupStart())) goto fail;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++)
        r = launch(c, &qs[i]->d, dev_ptr(&qs[i]->in), dev_ptr(&qs[i]->out));
    ncclResult_t end = ncclGroupEnd();
    if (nccl_check(r, c->nc, "enqueueing", __FILE__, __LINE__, err) ||
        nccl_check(end, c->nc, "ncclGroupEnd", __FILE__, __LINE__, err))
        goto fail;
    /* non-blocking: the next NCCL call on c waits until this one is enqueued */
    if (wait_ready(c, c->nc, what, qs[0]->deadline_ms, err)) {
        c->nc = NULL; /* wait_ready aborted it */
        fail_comm(c, true, err->peer_lost, "%s", err->text);
        return failure(c, err);
    }
    for (int i = 0; i < n; i++)
        if (finish_launch(qs[i], err)) goto fail;
    return 0;
fail:
    /* a CUDA or NCCL call refused: what is enqueued may be half an operation */
    fail_comm(c, true, err->peer_lost, "posting %s: %s", what, err->text);
    return failure(c, err);
}

static int nccl_post(struct comm *base, const struct comm_desc *d, struct comm_request **out,
                     struct plait_error *err)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    *out = NULL;
    if (check_alive(c, err)) return -1;
    if (c->group_depth > 0 && d->kind != COMM_OP_SEND && d->kind != COMM_OP_RECV)
        return error_set(err,
                         "comm '%s': %s inside comm_group_start/end: only sends and receives "
                         "are grouped",
                         c->base.name, comm_op_kind_name(d->kind));
    struct nccl_request *q = calloc(1, sizeof *q);
    if (!q) return error_errno(err, "comm '%s': allocating a request", c->base.name);
    q->base.ops = &nccl_ops;
    q->c = c;
    q->d = *d;
    q->seq = ++c->seq;
    q->deadline_ms = sock_now_ms() + (int64_t)(c->timeout_s * 1000);
    q->prev = c->pending_tail;
    if (c->pending_tail)
        c->pending_tail->next = q;
    else
        c->pending = q;
    c->pending_tail = q;
    size_t in_bytes, out_bytes;
    comm_desc_bytes(d, c->base.rank, c->base.size, &in_bytes, &out_bytes);
    /* NCCL takes a broadcast's two pointers on every rank: both staged whole */
    if (d->kind == COMM_OP_BROADCAST) in_bytes = out_bytes = d->bytes;
    if (CUDA_CHECK(cudaSetDevice(c->device)) || stage(c, &q->in, d->send, in_bytes, true, err) ||
        stage(c, &q->out, d->recv, out_bytes, false, err)) {
        fail_comm(c, true, err->peer_lost, "posting: %s", err->text);
        failure(c, err);
        request_free(q);
        return -1;
    }
    if (c->group_depth == 0 && launch_group(c, &q, 1, err)) {
        request_free(q);
        return -1;
    }
    q->d.counts = q->d.recv_counts = NULL; /* the caller's: used while launching (never grouped) */
    *out = &q->base;
    return 0;
}

static int nccl_group_start(struct comm *base, struct plait_error *err)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    if (check_alive(c, err)) return -1;
    c->group_depth++;
    return 0;
}

/* The outermost end launches what was posted since the outermost start. */
static int nccl_group_end(struct comm *base, struct plait_error *err)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    if (c->group_depth == 0)
        return error_set(err, "comm '%s': comm_group_end without comm_group_start", c->base.name);
    if (--c->group_depth > 0) return 0;
    if (check_alive(c, err)) return -1;
    int n = 0;
    for (struct nccl_request *q = c->pending; q; q = q->next) n += !q->launched;
    if (n == 0) return 0;
    struct nccl_request **qs = malloc(sizeof *qs * (size_t)n);
    if (!qs) return error_errno(err, "comm '%s': allocating", c->base.name);
    n = 0;
    for (struct nccl_request *q = c->pending; q; q = q->next)
        if (!q->launched) qs[n++] = q;
    int rc = launch_group(c, qs, n, err);
    free(qs);
    return rc;
}

/* Whether q has completed (copying staged results back), failed (-1), or
 * neither; fails it at its deadline or the job's abort. Never blocks. */
static int poll_request(struct nccl_request *q, bool *done, struct plait_error *err)
{
    struct nccl_comm *c = q->c;
    *done = false;
    if (check_alive(c, err)) return -1;
    char what[160];
    op_name(q, what, sizeof what);
    if (!q->launched) {
        fail_comm(c, true, false, "%s was waited for inside its group (call comm_group_end first)",
                  what);
        return failure(c, err);
    }
    cudaError_t e = cudaEventQuery(q->done);
    if (e == cudaSuccess) {
        if (q->out.pin) memcpy(q->out.user, q->out.pin->host, q->out.bytes);
        *done = true;
        return 0;
    }
    if (e != cudaErrorNotReady) {
        fail_comm(c, true, false, "%s: cudaEventQuery: %s", what, cudaGetErrorString(e));
        return failure(c, err);
    }
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(c->nc, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
        const char *last = ncclGetLastError(c->nc);
        char dead[WHO_LISTED * WHO_BYTES];
        bool named = describe_members(c, dead, sizeof dead);
        fail_comm(c, true, state == ncclRemoteError || named, "%s: NCCL reports %s%s%s%s%s", what,
                  ncclGetErrorString(state), last && *last ? ": " : "", last ? last : "",
                  named ? "; " : "", named ? dead : "");
        return failure(c, err);
    }
    if (sock_now_ms() >= q->deadline_ms) {
        char members[WHO_LISTED * WHO_BYTES];
        describe_members(c, members, sizeof members);
        fail_comm(c, true, true, "%s did not finish within %.1f s of being posted: %s", what,
                  c->timeout_s, members);
        return failure(c, err);
    }
    return 0;
}

static int nccl_test(struct comm_request *base, bool *done, struct plait_error *err)
{
    struct nccl_request *q = (struct nccl_request *)base;
    int rc = poll_request(q, done, err);
    if (rc || *done) {
        *done = true;
        request_free(q);
    }
    return rc;
}

static int nccl_wait(struct comm_request *base, struct plait_error *err)
{
    struct nccl_request *q = (struct nccl_request *)base;
    struct nccl_comm *c = q->c;
    int64_t t0 = sock_now_ms(), sleep = POLL_MIN_US;
    bool done = false;
    int rc;
    while ((rc = poll_request(q, &done, err)) == 0 && !done) {
        sleep_us(sleep);
        if (sleep < POLL_MAX_US) sleep *= 2;
    }
    c->wait_s += (double)(sock_now_ms() - t0) / 1000.0;
    request_free(q);
    return rc;
}

static void nccl_stats(const struct comm *base, struct comm_stats *out)
{
    const struct nccl_comm *c = (const struct nccl_comm *)base;
    memset(out, 0, sizeof *out);
    out->bytes_sent = c->bytes_sent; /* nominal: NCCL's own wire bytes are unknown */
    out->bytes_received = c->bytes_received;
    out->payload_bytes_sent = c->bytes_sent;
    out->operations = c->seq;
    out->wait_s = c->wait_s;
}

/* ---- making and closing ------------------------------------------------- */

/* The watcher (sock_job.c) calls this when the job is aborted. */
static void on_abort(void *ctx, const char *reason)
{
    struct nccl_comm *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (!c->abort_pending) {
        c->abort_pending = true;
        snprintf(c->abort_text, sizeof c->abort_text, "%s", reason);
    }
    pthread_mutex_unlock(&c->mu);
}

static void nccl_destroy(struct comm *base)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    if (c->job) sock_job_unwatch(c->job, c);
    cudaSetDevice(c->device);
    while (c->pending) request_free(c->pending);
    if (c->nc) {
        /* flush what is in flight, by the deadline; once the job is aborted
         * (or a flush fails) stop it instead (wait_ready aborts at failure) */
        struct plait_error err;
        char reason[sizeof c->abort_text];
        bool flushed = false;
        if (abort_seen(c, reason, sizeof reason)) {
            ncclCommAbort(c->nc);
        } else {
            ncclResult_t r = ncclCommFinalize(c->nc);
            if (r != ncclSuccess && r != ncclInProgress)
                ncclCommAbort(c->nc);
            else
                flushed = wait_ready(c, c->nc, "finalize",
                                     sock_now_ms() + (int64_t)(c->timeout_s * 1000), &err) == 0;
        }
        if (flushed)
            ncclCommDestroy(c->nc);
        else
            c->failed = true; /* a kernel may be stuck: see the pinned buffers below */
        c->nc = NULL;
    }
    if (c->barrier_dev) cudaFreeAsync(c->barrier_dev, c->stream); /* cudaFree would wait */
    if (c->produced) cudaEventDestroy(c->produced);
    if (c->stream) cudaStreamDestroy(c->stream); /* released once its work is done */
    while (c->lent) pin_return(c, c->lent);
    for (struct pinned *p = c->pool, *next; p; p = next) {
        next = p->next;
        /* cudaFreeHost waits for the device: after a failure, where a kernel
         * may be stuck, the process is about to end anyway, so leave it */
        if (!c->failed) cudaFreeHost(p->host);
        free(p);
    }
    sock_job_unref(c->job);
    pthread_mutex_destroy(&c->mu);
    free(c->who);
    free(c->pid);
    free(c->local);
    free(c);
}

/* A communicator without its NCCL half: the device, its stream, barrier
 * scratch, a staging buffer, members named "rank <r>" until known better, and
 * the abort watcher. */
static int comm_alloc(struct nccl_comm **out, struct sock_job *job, const char *name, int rank,
                      int size, double timeout_s, int device, cudaStream_t compute,
                      struct plait_error *err)
{
    *out = NULL;
    struct nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return error_errno(err, "allocating");
    c->base.ops = &nccl_ops;
    c->base.rank = rank;
    c->base.size = size;
    snprintf(c->base.name, sizeof c->base.name, "%s", name);
    c->timeout_s = timeout_s;
    c->device = device;
    c->compute = compute;
    pthread_mutex_init(&c->mu, NULL);
    sock_job_ref(job);
    c->job = job;
    c->who = calloc((size_t)size, sizeof *c->who);
    c->pid = calloc((size_t)size, sizeof *c->pid);
    c->local = calloc((size_t)size, sizeof *c->local);
    if (!c->who || !c->pid || !c->local) {
        error_errno(err, "allocating");
        goto fail;
    }
    for (int r = 0; r < size; r++) snprintf(c->who[r], WHO_BYTES, "rank %d", r);
    if (CUDA_CHECK(cudaSetDevice(device)) ||
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) ||
        CUDA_CHECK(cudaMallocAsync((void **)&c->barrier_dev, sizeof *c->barrier_dev, c->stream)) ||
        CUDA_CHECK(cudaMemsetAsync(c->barrier_dev, 0, sizeof *c->barrier_dev, c->stream)) ||
        (compute && CUDA_CHECK(cudaEventCreateWithFlags(&c->produced, cudaEventDisableTiming))))
        goto fail;
    /* one staging buffer now, so small host values never allocate later */
    struct pinned *first;
    if (pin_take(c, PINNED_FIRST_BYTES, &first, err)) goto fail;
    pin_return(c, first);
    if (sock_job_watch(job, on_abort, c)) {
        error_errno(err, "watching for aborts");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    nccl_destroy(&c->base);
    return -1;
}

/* The device this process uses (the caller's cudaSetDevice), or why none. */
static int find_device(int *device, struct plait_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return error_set(
            err,
            "no CUDA device: the nccl backend needs one GPU per rank (cudaGetDeviceCount: "
            "%s; on CPUs use backend \"socket\")",
            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    e = cudaGetDevice(device);
    if (e != cudaSuccess)
        return error_set(err, "cudaGetDevice: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

/* Every member's "who" from the store, by the deadline; names the ranks that
 * never came. */
static int gather_members(struct nccl_comm *c, int64_t deadline_ms, struct plait_error *err)
{
    char key[COMM_MAX_NAME_BYTES + 64], what[32];
    for (int r = 0; r < c->base.size; r++) {
        if (r == c->base.rank) continue;
        snprintf(what, sizeof what, "member/%d", r);
        nccl_store_key(key, sizeof key, c->base.name, what);
        char *value = NULL;
        double left_s = (double)(deadline_ms - sock_now_ms()) / 1000.0;
        if (sock_job_get(c->job, key, &value, left_s > 0.001 ? left_s : 0.001, err) == 0) {
            /* "<who>\t<node id>\t<pid>" */
            char *node = strchr(value, '\t'), *pid = node ? strchr(node + 1, '\t') : NULL;
            if (!pid) {
                free(value);
                return error_set(err, "%s is malformed", key);
            }
            *node++ = *pid++ = '\0';
            snprintf(c->who[r], WHO_BYTES, "%s", value);
            c->local[r] = !strcmp(node, sock_job_node_id(c->job));
            c->pid[r] = strtol(pid, NULL, 10);
            free(value);
            continue;
        }
        if (sock_now_ms() < deadline_ms && !strstr(err->text, "timed out"))
            return -1; /* the store is gone, or the job was aborted */
        char who[400];
        nccl_store_key(key, sizeof key, c->base.name, "member/");
        int missing =
            sock_job_missing_ranks(c->job, key, r, c->base.size, c->base.rank, who, sizeof who);
        return error_set(err,
                         "rank%s %s did not join within %.1f s (nothing at "
                         "comm/%s/nccl/member/<rank>; did it start, and with this name?)",
                         missing > 1 ? "s" : "", who, c->timeout_s, c->base.name);
    }
    return 0;
}

/* Rank 0 makes the unique id and publishes it; the others wait for it. */
static int exchange_id(struct nccl_comm *c, ncclUniqueId *id, int64_t deadline_ms,
                       struct plait_error *err)
{
    char key[COMM_MAX_NAME_BYTES + 64], text[2 * sizeof id->internal + 1];
    nccl_store_key(key, sizeof key, c->base.name, "id");
    if (c->base.rank == 0) {
        if (NCCL_CHECK(NULL, ncclGetUniqueId(id))) return -1;
        nccl_hex_encode(id->internal, sizeof id->internal, text);
        return sock_job_set(c->job, key, text, err);
    }
    char *value = NULL;
    double left_s = (double)(deadline_ms - sock_now_ms()) / 1000.0;
    if (sock_job_get(c->job, key, &value, left_s > 0.001 ? left_s : 0.001, err)) {
        if (sock_now_ms() < deadline_ms && !strstr(err->text, "timed out")) return -1;
        return error_set(err,
                         "rank 0 did not publish the NCCL unique id within %.1f s (nothing at %s; "
                         "did it start, and with this name?)",
                         c->timeout_s, key);
    }
    int bad = nccl_hex_decode(value, id->internal, sizeof id->internal);
    free(value);
    if (bad) return error_set(err, "%s is not a unique id of %zu bytes", key, sizeof id->internal);
    return 0;
}

static void config_init(ncclConfig_t *config, const char *name)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *config = init;
    config->blocking = 0; /* every wait is ours, with a deadline */
    config->commName = name;
}

int comm_nccl_world_init(struct comm **out, struct store *store, int rank, int world_size,
                         const struct comm_options *opts, const char *name, struct plait_error *err)
{
    *out = NULL;
    int64_t deadline = sock_now_ms() + (int64_t)(opts->timeout_s * 1000);
    struct sock_job *job = NULL;
    struct nccl_comm *c = NULL;
    int device;
    if (!(N = nccl_api(err)) ||
        sock_job_create(&job, store, rank, opts->secret, opts->node_id, opts->timeout_s, err))
        return error_prefix(err, "comm '%s' rank %d: ", name, rank);
    if (find_device(&device, err) || comm_alloc(&c, job, name, rank, world_size, opts->timeout_s,
                                                device, (cudaStream_t)opts->stream, err))
        goto fail;
    char key[COMM_MAX_NAME_BYTES + 64], what[32];
    /* a name used before would lead to its old id: say so instead */
    int64_t joined = 0;
    snprintf(key, sizeof key, "comm/%s/members", name);
    if (sock_job_add(job, key, 1, &joined, err)) goto fail;
    if (joined > world_size) {
        error_set(err,
                  "the name is in use in this job already (%lld joins for %d ranks): every "
                  "communicator needs a name of its own (put a generation in it)",
                  (long long)joined, world_size);
        goto fail;
    }
    snprintf(c->who[rank], WHO_BYTES, "rank %d (global %d, host %s, pid %ld, GPU %d)", rank,
             sock_job_global_rank(job), sock_job_hostname(job), (long)getpid(), device);
    c->pid[rank] = (long)getpid();
    c->local[rank] = true;
    snprintf(what, sizeof what, "member/%d", rank);
    nccl_store_key(key, sizeof key, name, what);
    char member[WHO_BYTES + SOCK_NODE_ID_BYTES + 32];
    snprintf(member, sizeof member, "%s\t%s\t%ld", c->who[rank], sock_job_node_id(job),
             c->pid[rank]);
    ncclUniqueId id;
    if (sock_job_set(job, key, member, err) || exchange_id(c, &id, deadline, err) ||
        gather_members(c, deadline, err))
        goto fail;
    ncclConfig_t config;
    config_init(&config, c->base.name); /* lives as long as the communicator */
    ncclComm_t nc = NULL;
    if (NCCL_CHECK(NULL, ncclCommInitRankConfig(&nc, world_size, id, rank, &config))) {
        if (nc) ncclCommAbort(nc);
        goto fail;
    }
    if (wait_ready(c, nc, "init", deadline, err)) goto fail;
    c->nc = nc;
    sock_job_unref(job);
    *out = &c->base;
    return 0;
fail:
    error_prefix(err, "comm '%s' rank %d of %d: ", name, rank, world_size);
    sock_job_abort(job, err->text);
    if (c) nccl_destroy(&c->base);
    sock_job_unref(job);
    return -1;
}

/* ncclCommSplit with color = the group's first parent rank (unique per
 * group), key = the new rank; members NULL: this rank joins none, but NCCL
 * still needs it to take part. */
static int nccl_split(struct comm *parent, const int *members, int n, int my_index,
                      const char *name, struct comm **out, struct plait_error *err)
{
    struct nccl_comm *p = (struct nccl_comm *)parent, *c = NULL;
    *out = NULL;
    if (check_alive(p, err)) return -1;
    int64_t deadline = sock_now_ms() + (int64_t)(p->timeout_s * 1000);
    /* failing here leaves the parent's other ranks in the split: fail it all */
    if (n > 0 &&
        comm_alloc(&c, p->job, name, my_index, n, p->timeout_s, p->device, p->compute, err))
        goto fail_parent;
    for (int i = 0; c && i < n; i++) {
        /* "rank <parent rank> (...)" becomes "rank <i> (...)" */
        const char *rest = strchr(p->who[members[i]], '(');
        snprintf(c->who[i], WHO_BYTES, "rank %d %s", i, rest ? rest : "");
        c->pid[i] = p->pid[members[i]];
        c->local[i] = p->local[members[i]];
    }
    ncclConfig_t config;
    config_init(&config, c ? c->base.name : p->base.name);
    ncclComm_t nc = NULL;
    if (CUDA_CHECK(cudaSetDevice(p->device)) ||
        NCCL_CHECK(p->nc, ncclCommSplit(p->nc, n > 0 ? members[0] : NCCL_SPLIT_NOCOLOR,
                                        n > 0 ? my_index : 0, &nc, &config)))
        goto fail_parent;
    char what[COMM_MAX_NAME_BYTES + 32];
    snprintf(what, sizeof what, "split into '%s'", name);
    if (wait_ready(p, p->nc, what, deadline, err)) {
        p->nc = NULL; /* wait_ready aborted it */
        if (nc) ncclCommAbort(nc);
        goto fail_parent;
    }
    if (nc && wait_ready(c ? c : p, nc, what, deadline, err)) goto fail_parent;
    if (!c) {
        if (nc) ncclCommDestroy(nc);
        return 0;
    }
    if (!nc) {
        error_set(err, "ncclCommSplit made no communicator");
        goto fail_parent;
    }
    c->nc = nc;
    *out = &c->base;
    return 0;
fail_parent:
    /* the parent may be mid-operation: it is unusable now */
    fail_comm(p, true, err->peer_lost, "%s", err->text);
    failure(p, err);
    if (c) nccl_destroy(&c->base);
    return -1;
}

static const struct comm_backend_ops nccl_ops = {
    .name = "nccl",
    .post = nccl_post,
    .wait = nccl_wait,
    .test = nccl_test,
    .split = nccl_split,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .stats = nccl_stats,
    .destroy = nccl_destroy,
};
