/* comm.c — the backend-independent half of comm.h: argument checks, the
 * bytes an operation reads and writes, the blocking calls as post + wait,
 * and which ranks a split groups together.
 * How bytes move is the backend's business (comm_socket.c); nothing here
 * touches a socket. */
#include "runtime/comm/comm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_backend.h"

size_t comm_dtype_bytes(enum comm_dtype dtype)
{
    switch (dtype) {
    case COMM_FLOAT32:
        return 4;
    case COMM_FLOAT64:
    case COMM_INT64:
        return 8;
    case COMM_BFLOAT16:
        return 2;
    }
    return 0;
}

/* A reduction's data type: every one but bf16 (moved, never summed). */
static int reducible(const struct comm *c, const char *what, enum comm_dtype dtype,
                     struct plait_error *err)
{
    if (dtype != COMM_BFLOAT16) return 0;
    return error_set(err, "comm '%s': %s of bf16 values: bf16 is gathered, never summed", c->name,
                     what);
}

const char *comm_op_kind_name(enum comm_op_kind kind)
{
    switch (kind) {
    case COMM_OP_ALLREDUCE:
        return "all-reduce";
    case COMM_OP_REDUCE_SCATTER:
        return "reduce-scatter";
    case COMM_OP_ALLGATHER:
        return "all-gather";
    case COMM_OP_BROADCAST:
        return "broadcast";
    case COMM_OP_BARRIER:
        return "barrier";
    case COMM_OP_ALLTOALL:
        return "all-to-all";
    case COMM_OP_SEND:
        return "send";
    case COMM_OP_RECV:
        return "receive";
    }
    return "?";
}

static bool name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > COMM_MAX_NAME_BYTES) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        if (!ok) return false;
    }
    return true;
}

int comm_world_init(struct comm **out, struct store *store, int rank, int world_size,
                    const struct comm_options *opts, struct plait_error *err)
{
    *out = NULL;
    if (!opts) return error_set(err, "comm: no options");
    const char *name = opts->name ? opts->name : COMM_DEFAULT_NAME;
    if (!name_ok(name))
        return error_set(err,
                         "comm: the name \"%.80s\" is not 1..%d letters, digits, '.', '_' or '-'",
                         name, COMM_MAX_NAME_BYTES);
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return error_set(err, "comm '%s': rank %d is not in 0..%d", name, rank, world_size - 1);
    if (!(opts->timeout_s > 0))
        return error_set(err, "comm '%s': timeout_s must be positive", name);
    if (!store) return error_set(err, "comm '%s': no store", name);
    if (!opts->secret || !*opts->secret)
        return error_set(err, "comm '%s': no secret (PLAIT_STORE_SECRET)", name);
    const struct comm_staging *sg = opts->staging;
    if (sg && (!sg->is_device || !sg->to_host || !sg->to_device))
        return error_set(err, "comm '%s': staging without is_device, to_host or to_device", name);
    switch (opts->backend) {
    case COMM_BACKEND_SOCKET:
        if (comm_socket_world_init(out, store, rank, world_size, opts, name, err)) return -1;
        if (sg) (*out)->staging = *sg;
        return 0;
    case COMM_BACKEND_NCCL:
#ifdef PLAIT_HAVE_NCCL
        return comm_nccl_world_init(out, store, rank, world_size, opts, name, err);
#else
        return error_set(err,
                         "comm '%s': the nccl backend is not in this build (nccl.h, libnccl "
                         "and the CUDA runtime were not found when it was built: see the "
                         "Makefile's NCCL_HOME and CUDA_HOME)",
                         name);
#endif
    }
    return error_set(err, "comm '%s': unknown backend %d", name, (int)opts->backend);
}

int comm_rank(const struct comm *c)
{
    return c->rank;
}

int comm_size(const struct comm *c)
{
    return c->size;
}

const char *comm_name(const struct comm *c)
{
    return c->name;
}

void comm_destroy(struct comm *c)
{
    if (!c) return;
    struct comm_staged *staged = c->staged;
    c->ops->destroy(c);
    comm_staging_free_pending(staged);
}

void comm_stats(const struct comm *c, struct comm_stats *out)
{
    c->ops->stats(c, out);
}

/* ---- posting ----------------------------------------------------------- */

static int elems_bytes(const struct comm *c, const char *what, size_t count, enum comm_dtype dtype,
                       size_t factor, size_t *bytes, struct plait_error *err)
{
    size_t e = comm_dtype_bytes(dtype);
    if (!e) return error_set(err, "comm '%s': %s: unknown data type %d", c->name, what, (int)dtype);
    if (count > SIZE_MAX / e / factor)
        return error_set(err, "comm '%s': %s: %zu elements overflow", c->name, what, count);
    *bytes = count * e;
    return 0;
}

/* The elements of an uneven operation's blocks, all of them, in bytes. */
static size_t blocks_bytes(const size_t *counts, enum comm_dtype dtype, int size)
{
    size_t elems = 0;
    for (int r = 0; r < size; r++) elems += counts[r];
    return elems * comm_dtype_bytes(dtype);
}

void comm_desc_bytes(const struct comm_desc *d, int rank, int size, size_t *read_bytes,
                     size_t *written_bytes)
{
    size_t in = 0, out = 0;
    switch (d->kind) {
    case COMM_OP_ALLREDUCE:
        in = out = d->bytes;
        break;
    case COMM_OP_REDUCE_SCATTER:
        in = d->counts ? blocks_bytes(d->counts, d->dtype, size) : d->bytes * (size_t)size;
        out = d->bytes;
        break;
    case COMM_OP_ALLGATHER:
        in = d->bytes;
        out = d->counts ? blocks_bytes(d->counts, d->dtype, size) : d->bytes * (size_t)size;
        break;
    case COMM_OP_ALLTOALL:
        in = d->bytes;
        out = blocks_bytes(d->recv_counts, d->dtype, size);
        break;
    case COMM_OP_BROADCAST:
        *(rank == d->root ? &in : &out) = d->bytes;
        break;
    case COMM_OP_SEND:
        in = d->bytes;
        break;
    case COMM_OP_RECV:
        out = d->bytes;
        break;
    case COMM_OP_BARRIER:
        break;
    }
    *read_bytes = in;
    *written_bytes = out;
}

static int post(struct comm *c, const struct comm_desc *d, struct comm_request **req,
                struct plait_error *err)
{
    *req = NULL;
    if (c->staging.is_device) return comm_staging_post(c, d, req, err);
    return c->ops->post(c, d, req, err);
}

int comm_iallreduce(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                    struct plait_error *err)
{
    struct comm_desc d = {.kind = COMM_OP_ALLREDUCE,
                          .send = send,
                          .recv = recv,
                          .count = count,
                          .dtype = dtype,
                          .op = op};
    *req = NULL;
    if (reducible(c, "all-reduce", dtype, err) ||
        elems_bytes(c, "all-reduce", count, dtype, 1, &d.bytes, err))
        return -1;
    if (op != COMM_SUM && op != COMM_MAX)
        return error_set(err, "comm '%s': all-reduce: unknown reduction %d", c->name, (int)op);
    if (count && (!send || !recv))
        return error_set(err, "comm '%s': all-reduce: a NULL buffer", c->name);
    return post(c, &d, req, err);
}

/* The elements of counts[0..size), checked against overflow. */
static int counts_total(const struct comm *c, const char *what, const size_t *counts,
                        enum comm_dtype dtype, size_t *total, struct plait_error *err)
{
    size_t unused;
    *total = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > SIZE_MAX - *total)
            return error_set(err, "comm '%s': %s: the counts overflow", c->name, what);
        *total += counts[r];
    }
    return elems_bytes(c, what, *total, dtype, 1, &unused, err);
}

/* Both reduce-scatters: counts NULL, every block count elements. */
static int reduce_scatter_post(struct comm *c, const void *send, void *recv, size_t count,
                               const size_t *counts, enum comm_dtype dtype, enum comm_reduce_op op,
                               struct comm_request **req, struct plait_error *err)
{
    struct comm_desc d = {.kind = COMM_OP_REDUCE_SCATTER,
                          .send = send,
                          .recv = recv,
                          .count = counts ? counts[c->rank] : count,
                          .dtype = dtype,
                          .op = op,
                          .counts = counts};
    *req = NULL;
    size_t total = count * (size_t)c->size, unused;
    if (reducible(c, "reduce-scatter", dtype, err) ||
        elems_bytes(c, "reduce-scatter", count, dtype, (size_t)c->size, &unused, err))
        return -1;
    if (counts && counts_total(c, "reduce-scatter", counts, dtype, &total, err)) return -1;
    d.bytes = d.count * comm_dtype_bytes(dtype);
    if (op != COMM_SUM && op != COMM_MAX)
        return error_set(err, "comm '%s': reduce-scatter: unknown reduction %d", c->name, (int)op);
    if ((total && !send) || (d.count && !recv))
        return error_set(err, "comm '%s': reduce-scatter: a NULL buffer", c->name);
    const char *s = send, *r = recv;
    size_t e = comm_dtype_bytes(dtype);
    if (d.count && r + d.bytes > s && r < s + total * e)
        return error_set(err, "comm '%s': reduce-scatter: send and recv overlap", c->name);
    return post(c, &d, req, err);
}

int comm_ireduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                         enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                         struct plait_error *err)
{
    return reduce_scatter_post(c, send, recv, count, NULL, dtype, op, req, err);
}

int comm_ireduce_scatter_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                           enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                           struct plait_error *err)
{
    *req = NULL;
    if (!counts) return error_set(err, "comm '%s': reduce-scatter: no counts", c->name);
    return reduce_scatter_post(c, send, recv, 0, counts, dtype, op, req, err);
}

int comm_ialltoall_v(struct comm *c, const void *send, const size_t *send_counts, void *recv,
                     const size_t *recv_counts, enum comm_dtype dtype, struct comm_request **req,
                     struct plait_error *err)
{
    *req = NULL;
    if (!send_counts || !recv_counts)
        return error_set(err, "comm '%s': all-to-all: no counts", c->name);
    size_t out, in;
    if (counts_total(c, "all-to-all", send_counts, dtype, &out, err) ||
        counts_total(c, "all-to-all", recv_counts, dtype, &in, err))
        return -1;
    if (send_counts[c->rank] != recv_counts[c->rank])
        return error_set(err,
                         "comm '%s': all-to-all: rank %d sends itself %zu elements but expects "
                         "%zu",
                         c->name, c->rank, send_counts[c->rank], recv_counts[c->rank]);
    if ((out && !send) || (in && !recv))
        return error_set(err, "comm '%s': all-to-all: a NULL buffer", c->name);
    size_t e = comm_dtype_bytes(dtype);
    const char *s = send, *r = recv;
    if (out && in && r + in * e > s && r < s + out * e)
        return error_set(err, "comm '%s': all-to-all: send and recv overlap", c->name);
    struct comm_desc d = {.kind = COMM_OP_ALLTOALL,
                          .send = send,
                          .recv = recv,
                          .count = out,
                          .dtype = dtype,
                          .bytes = out * e,
                          .counts = send_counts,
                          .recv_counts = recv_counts};
    return post(c, &d, req, err);
}

int comm_alltoall_v(struct comm *c, const void *send, const size_t *send_counts, void *recv,
                    const size_t *recv_counts, enum comm_dtype dtype, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_ialltoall_v(c, send, send_counts, recv, recv_counts, dtype, &req, err)) return -1;
    return comm_wait(req, err);
}

/* Both all-gathers: counts NULL, every block count elements. */
static int allgather_post(struct comm *c, const void *send, void *recv, size_t count,
                          const size_t *counts, enum comm_dtype dtype, struct comm_request **req,
                          struct plait_error *err)
{
    struct comm_desc d = {.kind = COMM_OP_ALLGATHER,
                          .send = send,
                          .recv = recv,
                          .count = counts ? counts[c->rank] : count,
                          .dtype = dtype,
                          .counts = counts};
    *req = NULL;
    size_t e = comm_dtype_bytes(dtype), total = count * (size_t)c->size, before = 0, unused;
    if (elems_bytes(c, "all-gather", count, dtype, (size_t)c->size, &unused, err)) return -1;
    if (counts) { /* the whole, and where this rank's block starts in it */
        if (counts_total(c, "all-gather", counts, dtype, &total, err)) return -1;
        for (int r = 0; r < c->rank; r++) before += counts[r];
    } else {
        before = count * (size_t)c->rank;
    }
    d.bytes = d.count * e;
    if ((d.count && !send) || (total && !recv))
        return error_set(err, "comm '%s': all-gather: a NULL buffer", c->name);
    const char *s = send, *r = recv, *mine = r + before * e;
    if (d.count && s != mine && s + d.bytes > r && s < r + total * e)
        return error_set(err,
                         "comm '%s': all-gather: send overlaps recv but is not its block %d "
                         "(in place)",
                         c->name, c->rank);
    return post(c, &d, req, err);
}

int comm_iallgather(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, struct comm_request **req, struct plait_error *err)
{
    return allgather_post(c, send, recv, count, NULL, dtype, req, err);
}

int comm_iallgather_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                      enum comm_dtype dtype, struct comm_request **req, struct plait_error *err)
{
    *req = NULL;
    if (!counts) return error_set(err, "comm '%s': all-gather: no counts", c->name);
    return allgather_post(c, send, recv, 0, counts, dtype, req, err);
}

int comm_ibroadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dtype, int root,
                    struct comm_request **req, struct plait_error *err)
{
    struct comm_desc d = {
        .kind = COMM_OP_BROADCAST, .recv = buf, .count = count, .dtype = dtype, .root = root};
    d.send = buf;
    *req = NULL;
    if (elems_bytes(c, "broadcast", count, dtype, 1, &d.bytes, err)) return -1;
    if (root < 0 || root >= c->size)
        return error_set(err, "comm '%s': broadcast: root %d is not in 0..%d", c->name, root,
                         c->size - 1);
    if (count && !buf) return error_set(err, "comm '%s': broadcast: a NULL buffer", c->name);
    return post(c, &d, req, err);
}

static int p2p_check(struct comm *c, const char *what, const void *buf, size_t bytes, int peer,
                     struct plait_error *err)
{
    if (peer < 0 || peer >= c->size)
        return error_set(err, "comm '%s': %s: peer %d is not in 0..%d", c->name, what, peer,
                         c->size - 1);
    if (peer == c->rank)
        return error_set(err, "comm '%s': %s: rank %d cannot message itself", c->name, what, peer);
    if (bytes && !buf) return error_set(err, "comm '%s': %s: a NULL buffer", c->name, what);
    return 0;
}

int comm_isend(struct comm *c, const void *buf, size_t bytes, int peer, uint32_t tag,
               struct comm_request **req, struct plait_error *err)
{
    *req = NULL;
    if (p2p_check(c, "send", buf, bytes, peer, err)) return -1;
    struct comm_desc d = {
        .kind = COMM_OP_SEND, .send = buf, .bytes = bytes, .peer = peer, .tag = tag};
    return post(c, &d, req, err);
}

int comm_irecv(struct comm *c, void *buf, size_t bytes, int peer, uint32_t tag,
               struct comm_request **req, struct plait_error *err)
{
    *req = NULL;
    if (p2p_check(c, "receive", buf, bytes, peer, err)) return -1;
    struct comm_desc d = {
        .kind = COMM_OP_RECV, .recv = buf, .bytes = bytes, .peer = peer, .tag = tag};
    return post(c, &d, req, err);
}

int comm_group_start(struct comm *c, struct plait_error *err)
{
    return c->ops->group_start ? c->ops->group_start(c, err) : 0;
}

int comm_group_end(struct comm *c, struct plait_error *err)
{
    return c->ops->group_end ? c->ops->group_end(c, err) : 0;
}

int comm_wait(struct comm_request *req, struct plait_error *err)
{
    return req ? req->ops->wait(req, err) : 0;
}

int comm_test(struct comm_request *req, bool *done, struct plait_error *err)
{
    if (!req) {
        *done = true;
        return 0;
    }
    return req->ops->test(req, done, err);
}

/* ---- blocking: post, then wait ------------------------------------------ */

int comm_allreduce(struct comm *c, const void *send, void *recv, size_t count,
                   enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_iallreduce(c, send, recv, count, dtype, op, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_ireduce_scatter(c, send, recv, count, dtype, op, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_reduce_scatter_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                          enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_ireduce_scatter_v(c, send, recv, counts, dtype, op, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_allgather(struct comm *c, const void *send, void *recv, size_t count,
                   enum comm_dtype dtype, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_iallgather(c, send, recv, count, dtype, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_allgather_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                     enum comm_dtype dtype, struct plait_error *err)
{
    struct comm_request *req;
    if (comm_iallgather_v(c, send, recv, counts, dtype, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dtype, int root,
                   struct plait_error *err)
{
    struct comm_request *req;
    if (comm_ibroadcast(c, buf, count, dtype, root, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_barrier(struct comm *c, struct plait_error *err)
{
    struct comm_desc d = {.kind = COMM_OP_BARRIER};
    struct comm_request *req;
    if (post(c, &d, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_send(struct comm *c, const void *buf, size_t bytes, int peer, uint32_t tag,
              struct plait_error *err)
{
    struct comm_request *req;
    if (comm_isend(c, buf, bytes, peer, tag, &req, err)) return -1;
    return comm_wait(req, err);
}

int comm_recv(struct comm *c, void *buf, size_t bytes, int peer, uint32_t tag,
              struct plait_error *err)
{
    struct comm_request *req;
    if (comm_irecv(c, buf, bytes, peer, tag, &req, err)) return -1;
    return comm_wait(req, err);
}

/* ---- splitting --------------------------------------------------------- */

struct member {
    int64_t key;
    int parent_rank;
};

static int member_cmp(const void *a, const void *b)
{
    const struct member *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->parent_rank > y->parent_rank) - (x->parent_rank < y->parent_rank);
}

int comm_split(struct comm *parent, int color, int key, const char *name, struct comm **out,
               struct plait_error *err)
{
    *out = NULL;
    char full[COMM_MAX_NAME_BYTES + 16];
    int n = parent->size, rc = -1;
    int64_t mine[2] = {color, key}, *all = malloc(sizeof(int64_t) * 2 * (size_t)n);
    struct member *group = malloc(sizeof *group * (size_t)n);
    int *members = malloc(sizeof *members * (size_t)n);
    if (!all || !group || !members) {
        error_errno(err, "comm '%s': split: allocating", parent->name);
        goto out;
    }
    /* every rank checks the same things, so every rank fails alike before the exchange */
    snprintf(full, sizeof full, "%s.%d", name ? name : "", color);
    if (!name_ok(name) || strlen(full) > COMM_MAX_NAME_BYTES) {
        error_set(err,
                  "comm '%s': split: the name \"%.80s\" is not 1..%d letters, digits, '.', '_' "
                  "or '-' (with \".<color>\" added)",
                  parent->name, name ? name : "", COMM_MAX_NAME_BYTES);
        goto out;
    }
    if (color < 0 && color != COMM_SPLIT_NONE) {
        error_set(err, "comm '%s': split '%s': color %d is negative (COMM_SPLIT_NONE is %d)",
                  parent->name, name, color, COMM_SPLIT_NONE);
        goto out;
    }
    if (comm_allgather(parent, mine, all, 2, COMM_INT64, err)) {
        error_prefix(err, "split '%s': ", name);
        goto out;
    }
    /* a rank that joins no group still tells the backend (NCCL's split
     * needs every rank of the parent): no members */
    int m = 0, my_index = -1;
    for (int r = 0; r < n && color != COMM_SPLIT_NONE; r++)
        if (all[2 * r] == color) group[m++] = (struct member){all[2 * r + 1], r};
    qsort(group, (size_t)m, sizeof *group, member_cmp);
    for (int i = 0; i < m; i++) {
        members[i] = group[i].parent_rank;
        if (members[i] == parent->rank) my_index = i;
    }
    rc = parent->ops->split(parent, members, m, my_index, full, out, err);
    if (rc == 0 && *out) (*out)->staging = parent->staging;
out:
    free(all);
    free(group);
    free(members);
    return rc;
}

int comm_split_3d(struct comm *world, int tp, int pp, int dp, struct rank_coords me,
                  const char *prefix, struct comm **tp_out, struct comm **pp_out,
                  struct comm **dp_out, struct plait_error *err)
{
    *tp_out = *pp_out = *dp_out = NULL;
    if (tp < 1 || pp < 1 || dp < 1 || (int64_t)tp * pp * dp != world->size)
        return error_set(err, "comm '%s': tp %d x pp %d x dp %d is not its %d ranks", world->name,
                         tp, pp, dp, world->size);
    if (rank_of(tp, dp, me) != world->rank)
        return error_set(err,
                         "comm '%s': rank %d given coordinates tp %d, pp %d, dp %d, which are "
                         "rank %lld",
                         world->name, world->rank, me.tp_rank, me.pp_rank, me.dp_rank,
                         (long long)rank_of(tp, dp, me));
    int tp_rank = me.tp_rank, dp_rank = me.dp_rank, pp_rank = me.pp_rank;
    char name[COMM_MAX_NAME_BYTES + 1];
    const char *p = prefix ? prefix : world->name;
    snprintf(name, sizeof name, "%.50s.tp", p);
    if (comm_split(world, pp_rank * dp + dp_rank, tp_rank, name, tp_out, err)) goto fail;
    snprintf(name, sizeof name, "%.50s.dp", p);
    if (comm_split(world, pp_rank * tp + tp_rank, dp_rank, name, dp_out, err)) goto fail;
    snprintf(name, sizeof name, "%.50s.pp", p);
    if (comm_split(world, dp_rank * tp + tp_rank, pp_rank, name, pp_out, err)) goto fail;
    return 0;
fail:
    comm_destroy(*tp_out);
    comm_destroy(*dp_out);
    *tp_out = *dp_out = NULL;
    return -1;
}
