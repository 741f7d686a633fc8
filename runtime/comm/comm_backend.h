/* comm_backend.h — what a backend (socket, nccl) implements behind
 * comm.h: one ops table, and the common head of its communicator and request
 * structs. comm.c checks every argument before calling a backend, so backends
 * see only valid operations. Not for use outside runtime/comm/. */
#ifndef PLAIT_COMM_BACKEND_H
#define PLAIT_COMM_BACKEND_H

#include "runtime/comm/comm.h"

enum comm_op_kind {
    COMM_OP_ALLREDUCE,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_ALLGATHER,
    COMM_OP_BROADCAST,
    COMM_OP_BARRIER,
    COMM_OP_ALLTOALL,
    COMM_OP_SEND,
    COMM_OP_RECV,
};

/* One operation, as posted. Collectives use count/dtype/op/root; point to
 * point uses bytes/peer/tag and send (isend) or recv (irecv). */
struct comm_desc {
    enum comm_op_kind kind;
    const void *send;
    void *recv;
    size_t count;
    enum comm_dtype dtype;
    enum comm_reduce_op op;
    int root;
    size_t bytes; /* send/recv: the message; collectives: count * element bytes */
    /* reduce-scatter or all-gather with per-rank counts ([size], some may be
     * 0; NULL: count each): block r, at the sum of the counts before it, goes
     * to (reduce-scatter) or comes from (all-gather) rank r; count and bytes
     * are then this rank's block. The backend copies it if it
     * needs it after post returns. */
    const size_t *counts;
    /* all-to-all: counts[r] elements go to rank r and recv_counts[r] come
     * from it, each side's blocks in rank order ([size] each; copied like
     * counts); count and bytes are then what this rank sends in all */
    const size_t *recv_counts;
    int peer;
    uint32_t tag;
};

struct comm_backend_ops {
    const char *name;
    /* Starts d; *req gets the handle. Fails only for a communicator that has
     * failed already (or out of memory). */
    int (*post)(struct comm *c, const struct comm_desc *d, struct comm_request **req,
                struct plait_error *err);
    int (*wait)(struct comm_request *req, struct plait_error *err);
    int (*test)(struct comm_request *req, bool *done, struct plait_error *err);
    /* A new communicator of parent's ranks members[0..n) (parent ranks, in new
     * rank order; this rank is members[my_index]), named name. Collective over
     * the parent: a rank that joins no group calls it too, with n 0 and
     * my_index -1, and gets *out NULL. */
    int (*split)(struct comm *parent, const int *members, int n, int my_index, const char *name,
                 struct comm **out, struct plait_error *err);
    void (*stats)(const struct comm *c, struct comm_stats *out);
    /* comm_group_start/end; NULL: grouping changes nothing (socket: its
     * sends never wait for their receives). */
    int (*group_start)(struct comm *c, struct plait_error *err);
    int (*group_end)(struct comm *c, struct plait_error *err);
    void (*destroy)(struct comm *c);
};

/* The head of every backend's communicator. */
struct comm {
    const struct comm_backend_ops *ops;
    int rank, size;
    char name[COMM_MAX_NAME_BYTES + 1];
    /* opts->staging's copy (socket only; is_device NULL: none), set by
     * comm.c for the world and every split of it: comm_staging.c */
    struct comm_staging staging;
    struct comm_staged *staged; /* its staged requests in flight, freed with it */
};

/* The head of every backend's request. */
struct comm_request {
    const struct comm_backend_ops *ops;
};

/* The socket backend's constructor (comm_socket.c). */
int comm_socket_world_init(struct comm **out, struct store *store, int rank, int world_size,
                           const struct comm_options *opts, const char *name,
                           struct plait_error *err);

#ifdef PLAIT_HAVE_NCCL
/* The nccl backend's constructor (comm_nccl.c, built where NCCL is). */
int comm_nccl_world_init(struct comm **out, struct store *store, int rank, int world_size,
                         const struct comm_options *opts, const char *name,
                         struct plait_error *err);
/* The ncclDataType_t and ncclRedOp_t it uses for dtype and op (for tests). */
int comm_nccl_types(enum comm_dtype dtype, enum comm_reduce_op op, int *nccl_dtype_out,
                    int *nccl_op_out);
#endif

const char *comm_op_kind_name(enum comm_op_kind kind);

/* The bytes d reads from d->send and writes to d->recv on rank `rank` of
 * `size` (comm.c): all-reduce its buffer both ways; reduce-scatter every
 * block in (count each, or counts[]) and its own out; all-gather its block
 * in and every block out; all-to-all the sums of counts[] in and
 * recv_counts[] out; broadcast the buffer in on the root, out elsewhere; a
 * send its bytes in, a receive out; a barrier nothing. */
void comm_desc_bytes(const struct comm_desc *d, int rank, int size, size_t *read_bytes,
                     size_t *written_bytes);

/* Posts d on c (c->staging set) with its device buffers staged through host
 * memory (comm_staging.c): the request it gives waits for the backend's and
 * copies the results back. Without device buffers, c->ops->post's own. */
int comm_staging_post(struct comm *c, const struct comm_desc *d, struct comm_request **req,
                      struct plait_error *err);

/* Frees the staged requests a communicator had in flight when it closed
 * (staged: its c->staged, taken before the backend's destroy, which frees
 * theirs and stops anything writing to their host buffers). */
void comm_staging_free_pending(struct comm_staged *staged);

#endif
