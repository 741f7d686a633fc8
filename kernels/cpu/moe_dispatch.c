/* moe_dispatch.c — which packed row each routing choice of a
 * mixture-of-experts block takes (kernels/ops.h: moe_dispatch), the same on
 * every backend's host side: integers only, in token order, so the experts'
 * rows and the tokens an expert at capacity drops are the same bits
 * everywhere. */
#include "kernels/cpu/ops_cpu.h"

int cpu_moe_dispatch(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                     int32_t *routed, const int32_t *choice, const int32_t *before, int ranges,
                     int N, int E, int k, int capacity)
{
    (void)ctx;
    /* E: a plan's experts, a few KiB of stack at most */
    int32_t at = 0, seen[E > 0 ? E : 1], len = ranges > 1 && N >= ranges ? N / ranges : N;
    for (int e = 0; e < E; e++) routed[e] = counts[e] = 0;
    /* which choices each expert keeps: those it takes while fewer than `capacity` of the
     * micro-batch's choices came to it before, counted from where each range starts; pos
     * first each kept choice's place among its expert's rows */
    for (int t = 0; t < N; t++) {
        for (int e = 0; t % len == 0 && e < E; e++)
            seen[e] = before ? before[(size_t)(t / len) * E + e] : 0;
        for (int j = 0; j < k; j++) {
            int32_t e = choice[(size_t)t * k + j];
            bool kept = capacity <= 0 || seen[e] < capacity;
            seen[e]++;
            routed[e]++;
            pos[(size_t)t * k + j] = kept ? counts[e]++ : -1; /* -1: the expert is full */
        }
    }
    for (int e = 0; e < E; e++) { /* each expert's first row, then every kept choice's */
        seen[e] = at;
        at += counts[e];
    }
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int32_t *p = &pos[(size_t)t * k + j];
            if (*p < 0) continue;
            *p += seen[choice[(size_t)t * k + j]];
            rows[*p] = t;
        }
    return at;
}
