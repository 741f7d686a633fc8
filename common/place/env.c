/* env.c — reading the env contract into struct env_rank, with every value
 * checked: the runtime's side of the launcher's promise. Writing it is
 * common/place/place.c's (place_rank_env) and the launchers'. */
#include "common/place/env.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/plan/plan.h"       // PLAN_MAX_RANKS
#include "common/place/rank_order.h" // defines: rank_of

/* An integer variable in [lo, hi]; def when absent and optional. */
static int read_int(const char *name, int lo, int hi, bool required, int def, int *out,
                    struct plait_error *err)
{
    const char *v = getenv(name);
    if (!v) {
        if (required) return error_set(err, "%s is not set (the launcher sets it)", name);
        *out = def;
        return 0;
    }
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < lo || n > hi)
        return error_set(err, "%s=%.40s: must be an integer in [%d, %d]", name, v, lo, hi);
    *out = (int)n;
    return 0;
}

int env_ranks_per_gpu(int *k, struct plait_error *err)
{
    if (read_int(PLAIT_ENV_RANKS_PER_GPU, 1, ENV_MAX_RANKS_PER_GPU, false, 1, k, err))
        return error_prefix(err, "the ranks that share each GPU: ");
    return 0;
}

int env_rank_read(struct env_rank *e, struct plait_error *err)
{
    memset(e, 0, sizeof *e);
    e->device = -1;
    bool multi = getenv(PLAIT_ENV_RANK) != NULL;
    const int max = PLAN_MAX_RANKS;
    if (read_int(PLAIT_ENV_RANK, 0, max - 1, false, 0, &e->rank, err) ||
        read_int(PLAIT_ENV_WORLD_SIZE, 1, max, multi, 1, &e->world, err) ||
        read_int(PLAIT_ENV_TP, 1, max, multi, 1, &e->tp, err) ||
        read_int(PLAIT_ENV_PP, 1, max, multi, 1, &e->pp, err) ||
        read_int(PLAIT_ENV_DP, 1, max, multi, 1, &e->dp, err) ||
        read_int(PLAIT_ENV_CP, 1, max, false, 1, &e->cp, err) ||
        read_int(PLAIT_ENV_TP_RANK, 0, max - 1, multi, 0, &e->tp_rank, err) ||
        read_int(PLAIT_ENV_PP_RANK, 0, max - 1, multi, 0, &e->pp_rank, err) ||
        read_int(PLAIT_ENV_DP_RANK, 0, max - 1, multi, 0, &e->dp_rank, err) ||
        read_int(PLAIT_ENV_CP_RANK, 0, max - 1, false, 0, &e->cp_rank, err) ||
        read_int(PLAIT_ENV_LOCAL_RANK, 0, max - 1, false, e->rank, &e->local_rank, err) ||
        read_int(PLAIT_ENV_LOCAL_WORLD_SIZE, 1, max, false, e->world, &e->local_world, err) ||
        read_int(PLAIT_ENV_NODE_RANK, 0, max - 1, false, 0, &e->node_rank, err) ||
        read_int(PLAIT_ENV_NODES, 1, max, false, 1, &e->nodes, err) ||
        read_int(PLAIT_ENV_RESTART_COUNT, 0, INT_MAX, false, 0, &e->restart_count, err) ||
        read_int(PLAIT_ENV_GPU_SHARED_BY, 1, ENV_MAX_RANKS_PER_GPU, false, 1, &e->ranks_per_gpu,
                 err))
        return -1;
    int64_t layout = (int64_t)e->tp * e->cp * e->pp * e->dp;
    if (layout != e->world)
        return error_set(err, "%s=%d, but %s × %s × %s × %s = %d × %d × %d × %d = %lld",
                         PLAIT_ENV_WORLD_SIZE, e->world, PLAIT_ENV_TP, PLAIT_ENV_CP, PLAIT_ENV_PP,
                         PLAIT_ENV_DP, e->tp, e->cp, e->pp, e->dp, (long long)layout);
    if (e->rank >= e->world || e->tp_rank >= e->tp || e->pp_rank >= e->pp || e->dp_rank >= e->dp ||
        e->cp_rank >= e->cp || e->local_rank >= e->local_world || e->node_rank >= e->nodes)
        return error_set(err,
                         "%s=%d (tp %d, cp %d, pp %d, dp %d; local %d of %d, node %d of %d) is "
                         "outside the layout",
                         PLAIT_ENV_RANK, e->rank, e->tp_rank, e->cp_rank, e->pp_rank, e->dp_rank,
                         e->local_rank, e->local_world, e->node_rank, e->nodes);
    int64_t want = rank_of(e->tp, e->dp * e->cp,
                           (struct rank_coords){e->tp_rank, e->pp_rank,
                                                rank_dp_fold(e->dp_rank, e->cp, e->cp_rank)});
    if (want != e->rank)
        return error_set(err,
                         "%s=%d, but coordinates tp %d, cp %d, dp %d, pp %d are rank %lld in "
                         "Megatron order (tp fastest, then cp, then dp, then pp)",
                         PLAIT_ENV_RANK, e->rank, e->tp_rank, e->cp_rank, e->dp_rank, e->pp_rank,
                         (long long)want);
    const char *device = getenv(PLAIT_ENV_DEVICE);
    if (device && strcmp(device, "cpu") != 0 &&
        read_int(PLAIT_ENV_DEVICE, 0, 1 << 16, true, -1, &e->device, err))
        return error_prefix(err, "(or \"cpu\") ");
    const char *addr = getenv(PLAIT_ENV_STORE_ADDR), *secret = getenv(PLAIT_ENV_STORE_SECRET);
    if (e->world > 1 && (!addr || !*addr || !secret || !*secret))
        return error_set(err, "%d ranks need the rendezvous store: %s and %s are not set", e->world,
                         PLAIT_ENV_STORE_ADDR, PLAIT_ENV_STORE_SECRET);
    if (addr &&
        snprintf(e->store_addr, sizeof e->store_addr, "%s", addr) >= (int)sizeof e->store_addr)
        return error_set(err, "%s is too long", PLAIT_ENV_STORE_ADDR);
    if (secret && snprintf(e->store_secret, sizeof e->store_secret, "%s", secret) >=
                      (int)sizeof e->store_secret)
        return error_set(err, "%s is too long", PLAIT_ENV_STORE_SECRET);
    return 0;
}
