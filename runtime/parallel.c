/* parallel.c — joining the job (the store, then the world communicator and
 * its splits) and the glue from runtime/comm to what the model, the
 * optimizer and the pipeline executor call: group tables, the pipeline link,
 * the tied-embedding sum, barriers, agreement and text from rank 0. How the
 * bytes move is comm's; what is computed with them is the callers'. */
#include "runtime/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/store/store.h"
#include "kernels/ops.h"

/* ---- group tables over a communicator ------------------------------------------------ */

static int g_allreduce(void *ctx, float *buf, size_t n, bool max, struct plait_error *err)
{
    return comm_allreduce(ctx, buf, buf, n, COMM_FLOAT32, max ? COMM_MAX : COMM_SUM, err);
}

static int g_allreduce_f64(void *ctx, double *buf, size_t n, struct plait_error *err)
{
    return comm_allreduce(ctx, buf, buf, n, COMM_FLOAT64, COMM_SUM, err);
}

static int g_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                            struct plait_error *err)
{
    return comm_reduce_scatter(ctx, send, recv, count, COMM_FLOAT32, COMM_SUM, err);
}

static int g_allgather(void *ctx, const float *send, float *recv, size_t count,
                       struct plait_error *err)
{
    return comm_allgather(ctx, send, recv, count, COMM_FLOAT32, err);
}

static int g_allgather16(void *ctx, const uint16_t *send, uint16_t *recv, size_t count,
                         struct plait_error *err)
{
    return comm_allgather(ctx, send, recv, count, COMM_BFLOAT16, err);
}

static int g_iallreduce(void *ctx, float *buf, size_t n, void **req, struct plait_error *err)
{
    struct comm_request *r = NULL;
    int rc = comm_iallreduce(ctx, buf, buf, n, COMM_FLOAT32, COMM_SUM, &r, err);
    *req = r;
    return rc;
}

static int g_ireduce_scatter_v(void *ctx, const float *send, float *recv, const size_t *counts,
                               void **req, struct plait_error *err)
{
    struct comm_request *r = NULL;
    int rc = comm_ireduce_scatter_v(ctx, send, recv, counts, COMM_FLOAT32, COMM_SUM, &r, err);
    *req = r;
    return rc;
}

static int g_iallgather16_v(void *ctx, const uint16_t *send, uint16_t *recv, const size_t *counts,
                            void **req, struct plait_error *err)
{
    struct comm_request *r = NULL;
    int rc = comm_iallgather_v(ctx, send, recv, counts, COMM_BFLOAT16, &r, err);
    *req = r;
    return rc;
}

static int g_iallgather_v(void *ctx, const float *send, float *recv, const size_t *counts,
                          void **req, struct plait_error *err)
{
    struct comm_request *r = NULL;
    int rc = comm_iallgather_v(ctx, send, recv, counts, COMM_FLOAT32, &r, err);
    *req = r;
    return rc;
}

static int g_ishift(void *ctx, const float *send, float *recv, size_t n, uint32_t tag,
                    void **send_req, void **recv_req, struct plait_error *err)
{
    struct comm *c = ctx;
    int size = comm_size(c), me = comm_rank(c), rc;
    struct comm_request *s = NULL, *r = NULL;
    size_t bytes = n * sizeof(float);
    /* grouped: on nccl every rank sending first would wait for the others' receives */
    if (comm_group_start(c, err)) return -1;
    rc = comm_isend(c, send, bytes, (me + 1) % size, tag, &s, err) ||
         comm_irecv(c, recv, bytes, (me + size - 1) % size, tag, &r, err);
    struct plait_error ended;
    if (comm_group_end(c, rc ? &ended : err) && !rc) rc = -1;
    *send_req = s;
    *recv_req = r;
    return rc ? -1 : 0;
}

static int g_alltoall_v(void *ctx, const void *send, const size_t *send_counts, void *recv,
                        const size_t *recv_counts, bool i64, struct plait_error *err)
{
    return comm_alltoall_v(ctx, send, send_counts, recv, recv_counts,
                           i64 ? COMM_INT64 : COMM_FLOAT32, err);
}

static int g_ialltoall_v(void *ctx, const void *send, const size_t *send_counts, void *recv,
                         const size_t *recv_counts, bool i64, void **req, struct plait_error *err)
{
    struct comm_request *r = NULL;
    int rc = comm_ialltoall_v(ctx, send, send_counts, recv, recv_counts,
                              i64 ? COMM_INT64 : COMM_FLOAT32, &r, err);
    *req = r;
    return rc;
}

static int g_wait(void *req, struct plait_error *err)
{
    return comm_wait(req, err);
}

static int g_test(void *req, bool *done, struct plait_error *err)
{
    return comm_test(req, done, err);
}

/* The table for c (size 1 when c is NULL: never called). */
static struct group group_of(struct comm *c)
{
    if (!c) return (struct group){.size = 1};
    return (struct group){.size = comm_size(c),
                          .rank = comm_rank(c),
                          .allreduce = g_allreduce,
                          .allreduce_f64 = g_allreduce_f64,
                          .reduce_scatter = g_reduce_scatter,
                          .allgather = g_allgather,
                          .allgather16 = g_allgather16,
                          .iallreduce = g_iallreduce,
                          .ireduce_scatter_v = g_ireduce_scatter_v,
                          .iallgather_v = g_iallgather_v,
                          .iallgather16_v = g_iallgather16_v,
                          .ishift = g_ishift,
                          .alltoall_v = g_alltoall_v,
                          .ialltoall_v = g_ialltoall_v,
                          .wait = g_wait,
                          .test = g_test,
                          .ctx = c};
}

/* A communicator of one rank has nothing to say: dropped. */
static struct comm *useful(struct comm *c)
{
    if (c && comm_size(c) == 1) {
        comm_destroy(c);
        return NULL;
    }
    return c;
}

/* ---- joining ---------------------------------------------------------------------------- */

static int make_links(struct parallel *p, struct plait_error *err);

/* Hybrid sharding's two splits of the world: the shard groups (one per
 * replica, tp rank and stage) and the replica groups (one per shard rank). */
static int make_hsdp(struct parallel *p, const char *gen, struct plait_error *err)
{
    const struct env_rank *w = &p->where;
    int S = p->dp_shard, shard_rank = rank_shard_of(w->dp_rank, S),
        replica = rank_replica_of(w->dp_rank, S);
    char name[COMM_MAX_NAME_BYTES + 1];
    snprintf(name, sizeof name, "%s.shard", gen);
    if (comm_split(p->world, w->tp_rank + w->tp * (w->pp_rank + w->pp * replica), shard_rank, name,
                   &p->shard, err))
        return -1;
    snprintf(name, sizeof name, "%s.replicas", gen);
    return comm_split(p->world, w->tp_rank + w->tp * (w->pp_rank + w->pp * shard_rank), replica,
                      name, &p->replicas, err);
}

/* Expert parallelism's two splits of the world: the ep groups (ep consecutive dp ranks of
 * one tp rank and stage: the all-to-all's) and the expert peers (the dp ranks of its shard
 * group with the same ep rank, which hold the same experts: their gradients' sum, and ZeRO's
 * slices of them; with hybrid sharding the replicas sum them after, as the dense part). */
static int make_ep(struct parallel *p, const char *gen, struct plait_error *err)
{
    const struct env_rank *w = &p->where;
    int ep = p->ep, ep_rank = rank_shard_of(w->dp_rank, ep),
        block = rank_replica_of(w->dp_rank, ep);
    int here = w->tp_rank + w->tp * w->pp_rank; /* (dp_rank is folded: cp is in it) */
    int peers = ep_rank + ep * rank_replica_of(w->dp_rank, p->dp_shard);
    char name[COMM_MAX_NAME_BYTES + 1];
    snprintf(name, sizeof name, "%s.ep", gen);
    if (comm_split(p->world, here + w->tp * w->pp * block, ep_rank, name, &p->ep_comm, err))
        return -1;
    snprintf(name, sizeof name, "%s.experts", gen);
    return comm_split(p->world, here + w->tp * w->pp * peers, block, name, &p->expert_peers, err);
}

int parallel_ep_lane(struct parallel *p, struct plait_error *err)
{
    const struct env_rank *w = &p->where;
    int ep_rank = rank_shard_of(w->dp_rank, p->ep), block = rank_replica_of(w->dp_rank, p->ep);
    char name[COMM_MAX_NAME_BYTES + 1];
    snprintf(name, sizeof name, "r%d.ep_lane", w->restart_count);
    if (p->ep < 2 || !p->world) return 0;
    if (comm_split(p->world, w->tp_rank + w->tp * (w->pp_rank + w->pp * block), ep_rank, name,
                   &p->ep_lane_comm, err))
        return error_prefix(err, "rank %d: ", w->rank);
    p->g_ep_lane = group_of(p->ep_lane_comm);
    return 0;
}

/* Socket on GPU ranks: the comm layer stages device buffers through the device's op table
 * (download waits for the compute stream, as comm_staging's to_host must). */
static bool stage_is_device(void *ctx, const void *ptr)
{
    const struct parallel_device *d = ctx;
    return d->ops->is_device_memory(d->ctx, ptr);
}

static void stage_to_host(void *ctx, void *host, const void *dev, size_t bytes)
{
    const struct parallel_device *d = ctx;
    d->ops->download(d->ctx, host, dev, bytes);
}

static void stage_to_device(void *ctx, void *dev, const void *host, size_t bytes)
{
    const struct parallel_device *d = ctx;
    d->ops->upload(d->ctx, dev, host, bytes);
}

int parallel_init(struct parallel *p, const struct env_rank *where, int dp_shard, int ep,
                  double timeout_s, const struct parallel_device *dev, struct plait_error *err)
{
    memset(p, 0, sizeof *p);
    p->where = *where;
    p->dp_shard = dp_shard >= 1 && where->dp % dp_shard == 0 ? dp_shard : where->dp;
    p->ep = ep >= 1 && p->dp_shard % ep == 0 ? ep : 1; /* (plan_rules: ep divides it) */
    if (dev) p->dev = *dev;
    p->timeout_s = timeout_s;
    p->g_tp = p->g_shard = p->g_replicas = p->g_mp = p->g_world = p->g_cp = p->g_ep = p->g_experts =
        p->g_ep_lane = (struct group){.size = 1};
    if (where->world == 1) return 0;
    const struct env_rank *w = where;
    char host[256], gen[32], name[COMM_MAX_NAME_BYTES + 1];
    int port;
    snprintf(gen, sizeof gen, "r%d", w->restart_count);
    if (store_addr_parse(w->store_addr, host, sizeof host, &port, err) ||
        store_connect(&p->store, host, port, w->store_secret, w->rank, timeout_s, err))
        return error_prefix(err, "rank %d: the job's store: ", w->rank);
    snprintf(name, sizeof name, "%s.world", gen);
    bool nccl = p->dev.backend == COMM_BACKEND_NCCL;
    const char *pair = getenv(PLAIT_ENV_DEBUG_NCCL_LINK);
    p->pair_links = nccl || (pair && !strcmp(pair, "1"));
    struct comm_options opts = {
        .backend = p->dev.backend,
        .timeout_s = timeout_s,
        .secret = w->store_secret,
        .name = name,
        .stream = nccl && p->dev.ops->stream ? p->dev.ops->stream(p->dev.ctx) : NULL};
    struct comm_staging staging = {&p->dev, stage_is_device, stage_to_host, stage_to_device};
    if (!nccl && p->dev.ops && p->dev.ops->is_device_memory) /* socket on GPU ranks */
        opts.staging = &staging;
    if (comm_world_init(&p->world, p->store, w->rank, w->world, &opts, err) ||
        comm_split_3d(p->world, w->tp, w->pp, w->dp,
                      (struct rank_coords){w->tp_rank, w->pp_rank, w->dp_rank}, gen, &p->tp, &p->pp,
                      &p->dp, err))
        goto fail;
    snprintf(name, sizeof name, "%s.mp", gen);
    if (comm_split(p->world, w->dp_rank, w->rank, name, &p->mp, err)) goto fail;
    if (p->dp_shard < w->dp && make_hsdp(p, gen, err)) goto fail;
    if (p->ep > 1 && make_ep(p, gen, err)) goto fail;
    snprintf(name, sizeof name, "%s.cp", gen);
    if (w->cp > 1 &&
        comm_split(p->world, w->rank - w->tp * w->cp_rank, w->cp_rank, name, &p->cp, err))
        goto fail;
    if (w->pp > 1) {
        bool end = w->pp_rank == 0 || w->pp_rank == w->pp - 1;
        snprintf(name, sizeof name, "%s.ends", gen);
        if (comm_split(p->world, end ? w->tp_rank + w->tp * w->dp_rank : COMM_SPLIT_NONE,
                       w->pp_rank, name, &p->ends, err))
            goto fail;
    }
    p->tp = useful(p->tp);
    p->pp = useful(p->pp);
    if (p->pp && p->pair_links && make_links(p, err)) goto fail;
    p->dp = useful(p->dp);
    p->mp = useful(p->mp);
    p->g_tp = group_of(p->tp);
    p->shard = useful(p->shard);
    p->replicas = useful(p->replicas);
    p->g_shard = group_of(p->dp_shard < w->dp ? p->shard : p->dp);
    p->g_replicas = group_of(p->replicas);
    p->g_mp = group_of(p->mp);
    p->g_world = group_of(p->world);
    p->g_cp = group_of(p->cp);
    p->ep_comm = useful(p->ep_comm);
    p->expert_peers = useful(p->expert_peers);
    p->g_ep = group_of(p->ep_comm);
    p->g_experts = group_of(p->expert_peers);
    return 0;
fail:
    parallel_abort(p, err->text);
    parallel_free(p);
    return error_prefix(err, "rank %d: ", w->rank);
}

const struct group *parallel_slices(const struct parallel *p, int zero)
{
    return p->ep > 1 && zero > 0 ? &p->g_experts : &p->g_shard;
}

struct env_rank parallel_fold(const struct env_rank *where)
{
    struct env_rank f = *where;
    f.dp = where->dp * where->cp;
    f.dp_rank = rank_dp_fold(where->dp_rank, where->cp, where->cp_rank);
    return f;
}

void parallel_free(struct parallel *p)
{
    /* the links first: destroying them frees their requests, then the copies */
    for (int i = 0; i < p->n_to; i++) comm_destroy(p->link_to[i]);
    for (int i = 0; i < p->n_from; i++) comm_destroy(p->link_from[i]);
    p->n_to = p->n_from = 0;
    for (int i = 0; i < p->n_out; i++) {
        if (p->out[i].on_host)
            free(p->out[i].buf);
        else if (p->out[i].buf)
            p->dev.ops->free(p->dev.ctx, p->out[i].buf);
    }
    free(p->out);
    p->out = NULL;
    p->n_out = 0;
    comm_destroy(p->ends);
    comm_destroy(p->ep_comm);
    comm_destroy(p->ep_lane_comm);
    comm_destroy(p->expert_peers);
    comm_destroy(p->cp);
    comm_destroy(p->shard);
    comm_destroy(p->replicas);
    comm_destroy(p->mp);
    comm_destroy(p->tp);
    comm_destroy(p->pp);
    comm_destroy(p->dp);
    comm_destroy(p->world);
    store_close(p->store);
    p->ep_comm = p->ep_lane_comm = p->expert_peers = NULL;
    p->ends = p->cp = p->shard = p->replicas = p->mp = p->tp = p->pp = p->dp = p->world = NULL;
    p->store = NULL;
}

void parallel_abort(struct parallel *p, const char *reason)
{
    struct plait_error ignored;
    if (p->store) store_abort(p->store, reason, &ignored);
}

/* ---- what the loop calls ---------------------------------------------------------------- */

/* A free outgoing slot of at least bytes of the kind asked for (a new one if
 * none), or NULL with err. */
static struct parallel_outgoing *outgoing(struct parallel *p, size_t bytes, bool on_host,
                                          struct plait_error *err)
{
    for (int i = 0; i < p->n_out; i++)
        if (!p->out[i].req && p->out[i].on_host == on_host && p->out[i].cap >= bytes)
            return &p->out[i];
    struct parallel_outgoing *grown = realloc(p->out, (size_t)(p->n_out + 1) * sizeof *grown);
    void *buf = on_host ? malloc(bytes) : p->dev.ops->alloc(p->dev.ctx, bytes);
    if (grown) p->out = grown;
    if (!grown || !buf) {
        if (on_host)
            free(buf);
        else if (buf)
            p->dev.ops->free(p->dev.ctx, buf);
        error_set(err, "out of %s memory for a pipeline message of %zu bytes",
                  on_host ? "host" : p->dev.ops->name, bytes);
        return NULL;
    }
    struct parallel_outgoing *o = &p->out[p->n_out++];
    *o = (struct parallel_outgoing){.buf = buf, .cap = bytes, .on_host = on_host};
    return o;
}

/* The communicators of the pair links: for every stage a and each of its
 * neighbours b (a + 1 and a - 1 around the ring, as the interleaved schedule
 * wraps), one of a and b, a rank 0 and b rank 1, in the same order on every
 * rank of the pipeline (each split is collective over it). */
static int make_links(struct parallel *p, struct plait_error *err)
{
    int pp = comm_size(p->pp), me = comm_rank(p->pp);
    char name[COMM_MAX_NAME_BYTES + 1];
    for (int a = 0; a < pp; a++) {
        int peers[2] = {(a + 1) % pp, (a + pp - 1) % pp};
        for (int k = 0; k < 2; k++) {
            int b = peers[k];
            if (k == 1 && b == peers[0]) continue; /* pp 2: one neighbour */
            bool in = me == a || me == b;
            struct comm *c = NULL;
            snprintf(name, sizeof name, "%s.%dto%d", comm_name(p->pp), a, b);
            if (comm_split(p->pp, in ? 0 : COMM_SPLIT_NONE, me == a ? 0 : 1, name, &c, err))
                return -1;
            if (me == a) {
                p->link_to[p->n_to] = c;
                p->link_to_stage[p->n_to++] = b;
            } else if (me == b) {
                p->link_from[p->n_from] = c;
                p->link_from_stage[p->n_from++] = a;
            }
        }
    }
    return 0;
}

static struct comm *link_of(struct comm *const *cs, const int *stages, int n, int stage)
{
    for (int i = 0; i < n; i++)
        if (stages[i] == stage) return cs[i];
    return NULL;
}

/* Frees the copies of the sends that completed; with all, waits for every
 * one. 0, or -1 with the first failure. */
static int reap(struct parallel *p, bool all, struct plait_error *err)
{
    int rc = 0;
    for (int i = 0; i < p->n_out; i++) {
        struct parallel_outgoing *o = &p->out[i];
        if (!o->req) continue;
        struct plait_error later;
        bool done = true;
        if (all ? comm_wait(o->req, rc ? &later : err)
                : comm_test(o->req, &done, rc ? &later : err))
            rc = -1;
        if (done) o->req = NULL; /* freed by the wait or the test */
    }
    return rc;
}

static int link_send(void *ctx, int to_stage, uint32_t tag, const float *buf, size_t n,
                     bool on_host, struct plait_error *err)
{
    struct parallel *p = ctx;
    size_t bytes = n * sizeof *buf;
    if (!p->pair_links) return comm_send(p->pp, buf, bytes, to_stage, tag, err);
    struct comm *c = link_of(p->link_to, p->link_to_stage, p->n_to, to_stage);
    if (!c) return error_set(err, "pipeline: no link to stage %d", to_stage);
    if (reap(p, false, err)) return -1;
    struct parallel_outgoing *o = outgoing(p, bytes, on_host, err);
    if (!o) return -1;
    /* a copy: buf is the caller's again at once (device memory: copied on the
     * compute stream, which the send waits for) */
    if (on_host)
        memcpy(o->buf, buf, bytes);
    else
        p->dev.ops->copy(p->dev.ctx, o->buf, buf, bytes);
    return comm_isend(c, o->buf, bytes, 1, tag, &o->req, err);
}

static int link_recv(void *ctx, int from_stage, uint32_t tag, float *buf, size_t n,
                     struct plait_error *err)
{
    struct parallel *p = ctx;
    size_t bytes = n * sizeof *buf;
    if (!p->pair_links) return comm_recv(p->pp, buf, bytes, from_stage, tag, err);
    struct comm *c = link_of(p->link_from, p->link_from_stage, p->n_from, from_stage);
    if (!c) return error_set(err, "pipeline: no link from stage %d", from_stage);
    return reap(p, false, err) || comm_recv(c, buf, bytes, 0, tag, err) ? -1 : 0;
}

static int link_flush(void *ctx, struct plait_error *err)
{
    return reap(ctx, true, err);
}

struct pipe_link parallel_pipe_link(struct parallel *p)
{
    return (struct pipe_link){.send = link_send, .recv = link_recv, .flush = link_flush, .ctx = p};
}

int parallel_sum_ends(struct parallel *p, float *grad, size_t n, struct plait_error *err)
{
    if (!p->ends) return 0;
    if (comm_allreduce(p->ends, grad, grad, n, COMM_FLOAT32, COMM_SUM, err))
        return error_prefix(err, "the tied embedding's gradient: ");
    return 0;
}

int parallel_barrier(struct parallel *p, struct plait_error *err)
{
    return p->world ? comm_barrier(p->world, err) : 0;
}

int parallel_share_text(struct parallel *p, const char *what, char *buf, size_t bytes,
                        struct plait_error *err)
{
    if (!p->world) return 0;
    size_t words = (bytes + 7) / 8;
    int64_t *w = calloc(words ? words : 1, sizeof *w);
    if (!w) return error_set(err, "out of memory");
    if (p->where.rank == 0) memcpy(w, buf, bytes);
    int rc = comm_broadcast(p->world, w, words, COMM_INT64, 0, err);
    if (rc == 0) {
        memcpy(buf, w, bytes);
        buf[bytes - 1] = '\0';
    }
    free(w);
    return rc ? error_prefix(err, "%s from rank 0: ", what) : 0;
}

int parallel_max_int(struct parallel *p, int *flag, struct plait_error *err)
{
    if (!p->world) return 0;
    int64_t v = *flag;
    if (comm_allreduce(p->world, &v, &v, 1, COMM_INT64, COMM_MAX, err)) return -1;
    *flag = (int)v;
    return 0;
}

int parallel_max_stage(struct parallel *p, int *flag, struct plait_error *err)
{
    int64_t v = *flag;
    if ((p->tp && comm_allreduce(p->tp, &v, &v, 1, COMM_INT64, COMM_MAX, err)) ||
        (p->dp && comm_allreduce(p->dp, &v, &v, 1, COMM_INT64, COMM_MAX, err)))
        return -1;
    *flag = (int)v;
    return 0;
}

void parallel_comm_totals(const struct parallel *p, double bytes[PAR_NCOMM],
                          double wait_s[PAR_NCOMM])
{
    struct comm *c[PAR_NCOMM] = {
        [PAR_TP] = p->tp,       [PAR_PP] = p->pp, [PAR_DP] = p->dp,     [PAR_ENDS] = p->ends,
        [PAR_WORLD] = p->world, [PAR_CP] = p->cp, [PAR_EP] = p->ep_comm};
    for (int i = 0; i < PAR_NCOMM; i++) {
        struct comm_stats st = {0};
        if (c[i]) comm_stats(c[i], &st);
        bytes[i] = (double)st.bytes_sent;
        wait_s[i] = st.wait_s;
    }
    /* DualPipeV's second lane exchanges the experts' rows on a communicator of its own */
    struct comm_stats lane = {0};
    if (p->ep_lane_comm) comm_stats(p->ep_lane_comm, &lane);
    bytes[PAR_EP] += (double)lane.bytes_sent;
    wait_s[PAR_EP] += lane.wait_s;
    /* hybrid sharding: the gradients' traffic is data-parallel traffic */
    struct comm *hsdp[] = {p->shard, p->replicas};
    for (int i = 0; i < 2; i++) {
        struct comm_stats st = {0};
        if (hsdp[i]) comm_stats(hsdp[i], &st);
        bytes[PAR_DP] += (double)st.bytes_sent;
        wait_s[PAR_DP] += st.wait_s;
    }
}

int parallel_gather(struct parallel *p, const double *mine, size_t n, double *all,
                    struct plait_error *err)
{
    if (!p->world) {
        memcpy(all, mine, n * sizeof *mine);
        return 0;
    }
    return comm_allgather(p->world, mine, all, n, COMM_FLOAT64, err);
}
