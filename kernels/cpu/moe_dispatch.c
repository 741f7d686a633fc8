/* moe_dispatch.c — which packed row each routing choice of a
 * mixture-of-experts block takes (kernels/ops.h: moe_dispatch), the same on
 * every backend's host side: integers only, in token order, so the experts'
 * rows and the tokens an expert at capacity drops are the same bits
 * everywhere. */
#include "kernels/cpu/ops_cpu.h"

int cpu_moe_dispatch(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                     int32_t *routed, const int32_t *choice, int N, int E, int k, int capacity)
{
    (void)ctx;
    for (int e = 0; e < E; e++) routed[e] = 0;
    for (size_t i = 0; i < (size_t)N * k; i++) routed[choice[i]]++;
    int32_t at = 0, start[E > 0 ? E : 1]; /* E: a plan's experts, a few KiB of stack at most */
    for (int e = 0; e < E; e++) {
        counts[e] = capacity > 0 && routed[e] > capacity ? capacity : routed[e];
        start[e] = at;
        at += counts[e];
        counts[e] = 0; /* filled below, up to its kept count */
    }
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int32_t e = choice[(size_t)t * k + j], *p = &pos[(size_t)t * k + j];
            int32_t end = e + 1 < E ? start[e + 1] : at;
            if (start[e] + counts[e] < end) {
                *p = start[e] + counts[e]++;
                rows[*p] = t;
            } else {
                *p = -1; /* the expert is full: this choice is dropped */
            }
        }
    return at;
}
