/* group.h — the collectives the model and the optimizer need from a group
 * of ranks (tensor-, data- or pipeline-parallel), as a small table, so that
 * they do not depend on how bytes move: runtime/parallel.c fills it from
 * runtime/comm, and tests fill it with threads. Every operation gives the
 * same bits on every rank of the group; a size of 1 never calls them. */
#ifndef PLAIT_RUNTIME_GROUP_H
#define PLAIT_RUNTIME_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct group {
    int size, rank;
    /* buf (n floats) summed, or maxed, over the group, in place */
    int (*allreduce)(void *ctx, float *buf, size_t n, bool max, struct plait_error *err);
    /* buf (n doubles) summed over the group, in place */
    int (*allreduce_f64)(void *ctx, double *buf, size_t n, struct plait_error *err);
    /* send (size·count floats) summed over the group; this rank gets block
     * `rank` of the sum into recv (count) */
    int (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t count,
                          struct plait_error *err);
    /* every rank's send (count floats) into recv (size·count), block r from rank r */
    int (*allgather)(void *ctx, const float *send, float *recv, size_t count,
                     struct plait_error *err);
    /* the same of 2-byte bf16 values (count of them a rank) */
    int (*allgather16)(void *ctx, const uint16_t *send, uint16_t *recv, size_t count,
                       struct plait_error *err);
    /* allreduce's sum, started: it returns at once with *req, and buf belongs
     * to the operation until wait(req) returns (0, or -1 with err; req is
     * freed either way). Sums started together complete in the order started.
     * NULL where the group cannot overlap (callers then use allreduce). */
    int (*iallreduce)(void *ctx, float *buf, size_t n, void **req, struct plait_error *err);
    /* An uneven reduce-scatter, started like iallreduce: send holds the
     * blocks of every rank in rank order (counts[r] floats for rank r, some
     * possibly 0; the same counts on every rank), summed over the group; this
     * rank's block of the sum goes to recv (counts[rank]). counts may be
     * reused once it returns. NULL where the group cannot. */
    int (*ireduce_scatter_v)(void *ctx, const float *send, float *recv, const size_t *counts,
                             void **req, struct plait_error *err);
    /* An uneven all-gather, started like iallreduce: this rank's send
     * (counts[rank] floats) and every other rank's block go to recv in rank
     * order (counts[r] floats from rank r, some possibly 0; the same counts on
     * every rank; in place: send is this rank's block of recv). counts may be
     * reused once it returns. NULL where the group cannot. */
    int (*iallgather_v)(void *ctx, const float *send, float *recv, const size_t *counts, void **req,
                        struct plait_error *err);
    /* The same gather of 2-byte bf16 values (NULL where the group cannot:
     * callers then gather fp32) */
    int (*iallgather16_v)(void *ctx, const uint16_t *send, uint16_t *recv, const size_t *counts,
                          void **req, struct plait_error *err);
    /* A step around the group's ring, started: send (n floats) to the next rank
     * ((rank + 1) mod size) and recv (n floats) from the previous one, each with
     * its own request (wait for both); tag keeps apart the shifts in flight at
     * once. NULL where the group cannot. */
    int (*ishift)(void *ctx, const float *send, float *recv, size_t n, uint32_t tag,
                  void **send_req, void **recv_req, struct plait_error *err);
    /* An uneven all-to-all (MPI_Alltoallv): send holds send_counts[r] elements for each
     * rank r in rank order, recv gets recv_counts[r] from each rank r in rank order
     * (recv_counts[r] must be send_counts[rank] on rank r); elements are floats, or int64
     * with i64; send and recv do not overlap. NULL where the group cannot. */
    int (*alltoall_v)(void *ctx, const void *send, const size_t *send_counts, void *recv,
                      const size_t *recv_counts, bool i64, struct plait_error *err);
    /* The same, started like iallreduce: send, recv and both counts belong to the
     * operation until wait(req) returns. NULL where the group cannot (callers then use
     * alltoall_v). */
    int (*ialltoall_v)(void *ctx, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts, bool i64, void **req, struct plait_error *err);
    int (*wait)(void *req, struct plait_error *err);
    /* Whether a started operation is done, never blocking: *done true (a failure too) and
     * req freed with wait's result (0, or -1 with err), or false and req still the
     * operation's. NULL where the group cannot tell (callers learn it at wait). */
    int (*test)(void *req, bool *done, struct plait_error *err);
    void *ctx;
};

#endif
