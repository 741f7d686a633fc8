/* model_moe_cp.c — context parallelism's part of an MoE block (model_moe.h): a micro-batch's
 * tokens are spread over the cp group (two chunks of each sequence a rank: ring_attention.h),
 * but its routing is the micro-batch's, as on one rank: the balance loss's f_e counts every
 * cp rank's choices, and an expert's capacity fills in the micro-batch's token order
 * (sequence, then position), so each of a rank's chunks starts from the choices of every
 * chunk before it. The dispatch itself is the op's (kernels/ops.h moe_dispatch). */
#include "runtime/model_moe.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/ring_attention.h" // defines: ring_chunk

int moe_cp_init(struct model *m, struct plait_error *err)
{
    size_t E = (size_t)m->cfg.experts, B = (size_t)m->B, N = B * (size_t)m->T;
    if (m->cp <= 1) return 0;
    m->moe_cp_host = calloc(N * (size_t)m->cfg.top_k + 2 * B * E, sizeof *m->moe_cp_host);
    m->moe_cp_routed = calloc(E, sizeof *m->moe_cp_routed);
    m->moe_cp_chunks = calloc(B * 2 * (size_t)m->cp * E, sizeof *m->moe_cp_chunks);
    if (!m->moe_cp_host || !m->moe_cp_routed || !m->moe_cp_chunks)
        return error_set(err, "out of memory for the experts' choices over %d cp ranks", m->cp);
    return 0;
}

void moe_cp_free(struct model *m)
{
    free(m->moe_cp_host);
    free(m->moe_cp_routed);
    free(m->moe_cp_chunks);
    m->moe_cp_host = m->moe_cp_routed = NULL;
    m->moe_cp_chunks = NULL;
}

int moe_cp_counts(struct model *m, const struct moe_acts *a, int N, struct plait_error *err)
{
    const struct group *g = m->cp_group;
    int E = m->cfg.experts, k = m->cfg.top_k, cp = m->cp, r = m->cp_rank, T = m->T;
    int B = N / T, chunks = 2 * cp;
    size_t n = (size_t)B * chunks * E;
    int32_t *choice = m->moe_cp_host, *before = choice + (size_t)N * k, *routed = m->moe_cp_routed;
    double *all = m->moe_cp_chunks; /* (B, 2cp, E) in the micro-batch's order */
    m->ops->download(m->ctx, choice, a->choice, (size_t)N * k * sizeof *choice);
    memset(all, 0, n * sizeof *all);
    for (int t = 0; t < N; t++) {
        double *c = all + ((size_t)(t / T) * chunks + ring_chunk(cp, r, t % T / (T / 2))) * E;
        for (int j = 0; j < k; j++) c[choice[(size_t)t * k + j]] += 1;
    }
    /* each rank's chunks, zeros where the others' are: their sum is every chunk's, exact
     * (integers in double) */
    if (g->allreduce_f64(g->ctx, all, n, err))
        return error_prefix(err, "the experts' choices over %d cp ranks: ", cp);
    memset(routed, 0, (size_t)E * sizeof *routed);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < chunks; c++) {
            int half = c == ring_chunk(cp, r, 0) ? 0 : c == ring_chunk(cp, r, 1) ? 1 : -1;
            for (int e = 0; e < E; e++) {
                if (half >= 0) before[(size_t)(2 * b + half) * E + e] = routed[e];
                routed[e] += (int32_t)all[((size_t)b * chunks + c) * E + e];
            }
        }
    m->ops->upload(m->ctx, m->moe_cp_before, before, (size_t)2 * B * E * sizeof *before);
    return 0;
}
