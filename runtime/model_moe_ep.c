/* model_moe_ep.c — expert parallelism's exchange for an MoE block (model_moe.h): each
 * expert's packed rows sent to the ep rank holding it and the results sent back, over
 * the ep group's uneven all-to-all, the rows' counts exchanged first; in a DualPipeV pair
 * run in two lanes, each lane's exchanges on its own ep group with its own buffers, the
 * baton handed over while they move. The routing and the experts' products are
 * model_moe.c's; the lanes' baton runtime/lanes.c's. */
#include "runtime/model_moe.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/lanes.h"

/* The ep group's all-to-all: blocking, or in a running pair started, the baton handed to
 * the other lane while it moves (lanes_switch). */
static int alltoall(struct model *m, const void *send, const size_t *sc, void *recv,
                    const size_t *rc, bool i64, struct plait_error *err)
{
    const struct group *g = m->ep_group;
    void *req;
    if (!lanes_running(m->lanes) || !g->ialltoall_v)
        return g->alltoall_v(g->ctx, send, sc, recv, rc, i64, err);
    if (g->ialltoall_v(g->ctx, send, sc, recv, rc, i64, &req, err)) return -1;
    return lanes_switch(m->lanes, g, req, err);
}

int moe_ep_lanes_init(struct model *m, struct plait_error *err)
{
    struct moe_lane *one = &m->moe_lane[0], *two = &m->moe_lane[1];
    size_t E = (size_t)m->cfg.experts;
    /* (each lane's device buffers were set by model_init) */
    one->counts_host = m->moe_counts_host;
    one->ep_counts = m->moe_ep_counts;
    one->ep_sizes = m->moe_ep_sizes;
    one->ep_group = m->ep_group;
    if (!two->ep_group || !m->moe_ep) return 0; /* no MoE layer here: nothing switches */
    if (!(two->counts_host = calloc(3 * E, sizeof *two->counts_host)) ||
        !(two->ep_counts = calloc(2 * E, sizeof *two->ep_counts)) ||
        !(two->ep_sizes = calloc(2 * (size_t)m->shard.part.ep, sizeof *two->ep_sizes)))
        return error_set(err, "out of memory for the second lane's expert-parallel counts");
    return 0;
}

void moe_ep_lanes_free(struct model *m)
{
    struct moe_lane *two = &m->moe_lane[1];
    free(two->counts_host);
    free(two->ep_counts);
    free(two->ep_sizes);
    /* (its device buffers are the model's allocations) */
    two->counts_host = NULL;
    two->ep_counts = NULL;
    two->ep_sizes = NULL;
}

void moe_ep_lane_enter(void *model, int lane)
{
    struct model *m = model;
    const struct moe_lane *x = &m->moe_lane[lane];
    if (!m->moe_lane[1].counts_host) return; /* one set */
    /* the second lane's thread issues to the rank's device (a no-op once it does) */
    if (lane == 1 && m->ops->bind_thread) m->ops->bind_thread(m->ctx);
    model_lane_enter(m, lane);
    m->moe_counts_host = x->counts_host;
    m->moe_ep_counts = x->ep_counts;
    m->moe_ep_sizes = x->ep_sizes;
    m->ep_group = x->ep_group;
}

/* One exchange's counts (host, moe_acts' 3E layout): own[e] the rows this rank sends
 * expert e (the E in ep blocks of El, block j ep rank j's), from[j·El + e] the rows ep
 * rank j sends local expert e. */
struct ep_counts {
    int ep, El;
    size_t C;
    const int32_t *own, *from;
};

static struct ep_counts counts_here(const struct model *m, const int32_t *counts)
{
    int E = m->cfg.experts;
    return (struct ep_counts){.ep = m->shard.part.ep,
                              .El = gpt2_part_experts(&m->shard.part, &m->cfg),
                              .C = (size_t)m->cfg.hidden,
                              .own = counts,
                              .from = counts + 2 * E};
}

static size_t sum_of(const int32_t *v, int n)
{
    size_t s = 0;
    for (int i = 0; i < n; i++) s += (size_t)v[i];
    return s;
}

int moe_ep_rows(const struct model *m, const int32_t *counts, int e)
{
    struct ep_counts c = counts_here(m, counts);
    int rows = 0;
    for (int j = 0; j < c.ep; j++) rows += c.from[j * c.El + e];
    return rows;
}

/* The rows from every source rank, by source then local expert (by_src: as they come),
 * to and from the rows by local expert then source (grouped: each expert's contiguous). */
static void regroup(const struct model *m, const struct ep_counts *c, float *grouped, float *by_src,
                    bool to_grouped)
{
    size_t g = 0, row = c->C * sizeof(float);
    for (int e = 0; e < c->El; e++)
        for (int j = 0; j < c->ep; j++) {
            size_t at = sum_of(c->from, j * c->El + e), n = (size_t)c->from[j * c->El + e];
            if (!n) continue;
            float *src = by_src + at * c->C, *dst = grouped + g * c->C;
            if (to_grouped)
                m->ops->copy(m->ctx, dst, src, n * row);
            else
                m->ops->copy(m->ctx, src, dst, n * row);
            g += n;
        }
}

/* Out: this rank's rows (send, by expert) to their experts' ranks, into recv by
 * source; back: the reverse. */
static int exchange(struct model *m, const struct ep_counts *c, const float *send, float *recv,
                    bool out, struct plait_error *err)
{
    size_t *sc = m->moe_ep_sizes, *rc = sc + c->ep;
    for (int j = 0; j < c->ep; j++) {
        size_t to = sum_of(c->own + j * c->El, c->El), from = sum_of(c->from + j * c->El, c->El);
        sc[j] = (out ? to : from) * c->C;
        rc[j] = (out ? from : to) * c->C;
    }
    if (alltoall(m, send, sc, recv, rc, false, err))
        return error_prefix(err, "the experts' all-to-all over %d ep ranks: ", c->ep);
    return 0;
}

int moe_ep_counts(struct model *m, struct moe_acts *a, int32_t *counts, struct plait_error *err)
{
    int E = m->cfg.experts, ep = m->shard.part.ep, El = E / ep;
    int64_t *send = m->moe_ep_counts, *recv = send + E;
    size_t *sizes = m->moe_ep_sizes;
    for (int e = 0; e < E; e++) send[e] = counts[e];
    for (int j = 0; j < 2 * ep; j++) sizes[j] = (size_t)El;
    if (alltoall(m, send, sizes, recv, sizes + ep, true, err))
        return error_prefix(err, "the experts' row counts over %d ep ranks: ", ep);
    for (int i = 0; i < E; i++) counts[2 * E + i] = (int32_t)recv[i];
    m->ops->upload(m->ctx, a->counts + 2 * E, counts + 2 * E, (size_t)E * sizeof *counts);
    return 0;
}

int moe_ep_dispatch(struct model *m, const int32_t *counts, const float *own, int N, float *grouped,
                    struct plait_error *err)
{
    struct ep_counts c = counts_here(m, counts);
    float *by_src = m->moe_ep + (size_t)m->cfg.top_k * (size_t)N * c.C;
    if (exchange(m, &c, own, by_src, true, err)) return -1;
    regroup(m, &c, grouped, by_src, true);
    return 0;
}

int moe_ep_return(struct model *m, const int32_t *counts, float *grouped, int N, float *own,
                  struct plait_error *err)
{
    struct ep_counts c = counts_here(m, counts);
    float *by_src = m->moe_ep + (size_t)m->cfg.top_k * (size_t)N * c.C;
    regroup(m, &c, grouped, by_src, false);
    return exchange(m, &c, by_src, own, false, err);
}
