/* comm.h — collectives behind one interface: the communicators a rank trains
 * through (world, then tp, pp and dp groups split from it), blocking and
 * asynchronous collectives, point-to-point sends for the pipeline, and byte
 * counts. Two backends behind one ops table (comm_backend.h): `socket`
 * (comm_socket.c: TCP between nodes, shared memory within one) for host
 * buffers (device buffers staged through host memory: struct comm_staging),
 * and `nccl` (comm_nccl.c, built where NCCL is) for device buffers.
 * What this comment says of sockets, links and progress threads is the
 * socket backend's; where nccl differs is said at the end.
 *
 * Rendezvous: ranks meet through the job's store (common/store/store.h). Each rank
 * publishes how to reach it under "comm/<name>/addr/<rank>" (and counts
 * itself in "comm/<name>/members") and connects to the others; every
 * connection proves the job's secret (HMAC-SHA256 over fresh nonces, both
 * ways), so a process without it cannot connect or inject bytes, and the
 * listeners close once every link is up. Names must be unique for the store's
 * life (put a restart generation in them): a name used again is refused.
 *
 * Ordering: as in MPI, every rank of a communicator posts its collectives in
 * the same order. Point-to-point messages between two ranks match in the order
 * they were sent, by tag; a send completes once its bytes are handed to the
 * peer (which buffers them if no receive is posted yet), so sends never
 * deadlock against each other.
 *
 * Determinism: the reduction order is fixed by the algorithm, the layout and
 * the message size, never by arrival timing: same inputs, same layout, same
 * options => the same bits, on every rank of the communicator, over shared
 * memory or TCP alike. Every rank must pass the same algorithm options.
 *
 * Failure: nothing waits forever. An operation fails when none of its bytes
 * have moved for timeout_s; a peer that dies (connection closed or reset, a
 * shared-memory peer's process gone) fails every pending and later operation
 * of the communicator at once, with an error naming the peer (its rank here,
 * its global rank, host and pid). The layer then calls store_abort with that
 * text, so ranks blocked elsewhere (other communicators, other processes)
 * fail at once too: each process watches the store's abort key, and an abort
 * fails every communicator it has. (Set-up that fails, a rank that never
 * joins for one, aborts the job too.) After a failure a communicator only
 * reports it; destroy it.
 *
 * Threads: a communicator's calls may come from any one thread at a time
 * (different communicators: any threads). Each communicator has a progress
 * thread that moves its bytes, so posted operations proceed while the caller
 * computes, and a caller waiting for one sleeps (it never spins).
 *
 * nccl: ranks meet through the same store (the unique id at
 * "comm/<name>/nccl/id"); each rank uses the GPU current when it calls
 * comm_world_init (cudaSetDevice first), one rank per GPU. Operations run on
 * the communicator's CUDA stream in posting order, point to point included,
 * and complete through a cudaEvent. With opts->stream (the compute stream,
 * kernels/ops.h's ops->stream) each operation first waits for the work
 * enqueued on it before the operation was posted (a cudaEvent recorded there,
 * cudaStreamWaitEvent on the communicator's stream), so device data may
 * still be in the making when it is posted; whoever consumes a result waits
 * for the request first (comm_wait, comm_test), which has then seen the
 * operation's event complete. Host buffers are staged through device memory
 * (cudaPointerGetAttributes tells them apart): one code path for scalars,
 * flags and text alike. NCCL buffers nothing: a send runs only together with
 * its receive, so two ranks that each send to the other before receiving wait
 * until the deadline unless they group the pair (comm_group_start); tags are
 * not matched (messages pair in posting order).
 * The deadline counts from posting (NCCL reports no progress); at it, or on
 * the job's abort, the communicator is aborted (ncclCommAbort) and the error
 * names a member of this node whose process has ended, or else lists the
 * members, as NCCL cannot say which one is missing. Byte counts are
 * the algorithm's nominal payload (nccl_meta.h): NCCL reports none. */
#ifndef PLAIT_COMM_H
#define PLAIT_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/place/rank_order.h" // defines: struct rank_coords, rank_of

struct store;

enum comm_backend_kind {
    COMM_BACKEND_SOCKET = 0, /* CPU ranks (GPU ranks with staging): TCP, shared memory */
    COMM_BACKEND_NCCL = 1,   /* GPUs (where the build found NCCL; init says if not) */
};

/* COMM_BFLOAT16 (2-byte bf16 values) is moved, never summed: gathers,
 * broadcasts and point-to-point only; a reduction of it is refused. */
enum comm_dtype { COMM_FLOAT32 = 0, COMM_FLOAT64 = 1, COMM_INT64 = 2, COMM_BFLOAT16 = 3 };
enum comm_reduce_op { COMM_SUM = 0, COMM_MAX = 1 };

enum comm_transport {
    COMM_TRANSPORT_AUTO = 0, /* shared memory between ranks of one node, TCP otherwise */
    COMM_TRANSPORT_TCP = 1,  /* TCP for every pair */
};

/* Which algorithm a collective uses. AUTO picks by message size (the same
 * choice on every rank): all-reduce uses recursive doubling up to
 * small_message_bytes and a pipelined ring above; broadcast a binomial tree,
 * then a pipelined chain. The others force one for every size. */
enum comm_algorithm {
    COMM_ALGORITHM_AUTO = 0,
    COMM_ALGORITHM_BANDWIDTH = 1, /* ring all-reduce, chain broadcast */
    COMM_ALGORITHM_LATENCY = 2,   /* recursive doubling, binomial tree */
};

#define COMM_DEFAULT_NAME "world"
#define COMM_DEFAULT_SMALL_MESSAGE_BYTES ((size_t)8 << 10) /* measured: bench/comm_bench.c */
#define COMM_MAX_NAME_BYTES 64                             /* letters, digits, '.', '_', '-' */
#define COMM_DEFAULT_SPIN_US 200                           /* measured: bench/comm_bench.c */
#define COMM_SPLIT_NONE (-1) /* a color that joins no group (out gets NULL) */

struct comm_options {
    enum comm_backend_kind backend;
    double timeout_s;   /* > 0: joining, and any operation with no byte moving for this long */
    const char *secret; /* the job's secret (PLAIT_STORE_SECRET) */
    const char *name;   /* the world communicator's name; NULL: COMM_DEFAULT_NAME */
    enum comm_transport transport;
    enum comm_algorithm algorithm;
    size_t small_message_bytes; /* AUTO's threshold; 0: COMM_DEFAULT_SMALL_MESSAGE_BYTES */
    /* While a caller is blocked waiting, how long a progress thread that has
     * nothing to do keeps looking (yielding the CPU) before it sleeps in poll:
     * a reply that comes within it costs no wake-up. While callers compute it
     * never spins. 0: COMM_DEFAULT_SPIN_US; negative: sleep at once. */
    int spin_us;
    /* What makes two ranks "one node" (shared memory between them). NULL: the
     * kernel's boot id and network namespace, which is right; tests set it to
     * pretend several nodes on one machine. */
    const char *node_id;
    /* nccl: the compute stream (a cudaStream_t) every operation waits for,
     * inherited by splits; NULL: the data is ready when posted. socket:
     * ignored (CPU ranks). */
    void *stream;
    /* socket on GPU ranks: device buffers moved through host memory (struct
     * comm_staging below), copied in, inherited by splits; NULL: every buffer
     * is host memory. nccl: ignored (it takes device memory as it is). */
    const struct comm_staging *staging;
};

/* How the socket backend moves an operation's device buffers, like gloo with
 * CUDA tensors: at post, each device input (the bytes the operation reads) is
 * copied into host memory of the request's own; the operation runs on host
 * memory; at completion (comm_wait, or comm_test saying done) each device
 * output (the bytes it writes) is copied back before the request is reported
 * done; a request that fails copies nothing back. is_device is asked of
 * each buffer the operation moves bytes through; those it says no to are
 * used as they are. Every callback is called from the thread that posts,
 * waits or tests, never from the progress thread. The host memory is the
 * request's own (malloc'd), freed when it completes, fails, or its
 * communicator is destroyed.
 *
 * Order: to_host is "done when it returns" and runs when the operation is
 * posted, so the caller's copy must first wait for whatever produces the
 * device data (plait's CUDA download waits for the compute stream); the data
 * may then change at once, as the operation reads its host copy. to_device
 * is done when it returns too: the result is in device memory when comm_wait
 * returns, and work the caller enqueues after it sees it. */
struct comm_staging {
    void *ctx;
    bool (*is_device)(void *ctx, const void *p); /* p points into device memory */
    void (*to_host)(void *ctx, void *host, const void *dev, size_t bytes);
    void (*to_device)(void *ctx, void *dev, const void *host, size_t bytes);
};

struct comm;
struct comm_request; /* an operation: comm_wait or comm_test it once, or comm_destroy frees it */

/* What one rank's communicator has done since it was made. */
struct comm_stats {
    uint64_t bytes_sent;          /* everything written to its links: payload, frame
                                     headers (40 bytes per fragment of <= 256 KiB) and
                                     padding to 8 bytes; not the connection handshake */
    uint64_t bytes_received;      /* the same, read */
    uint64_t payload_bytes_sent;  /* the data alone */
    uint64_t operations;          /* collectives and point-to-point operations posted */
    double wait_s;                /* time callers spent blocked in waits */
    uint64_t connections_refused; /* at set-up: connections that did not prove the secret */
};

/* Joins the world communicator: rank 0..world_size-1 of the job whose store
 * `store` is (only its address is used: the layer opens its own connections,
 * proving opts->secret). Every rank calls it; it returns once this rank is
 * connected to every other, or fails by opts->timeout_s naming the ranks that
 * did not come. */
int comm_world_init(struct comm **out, struct store *store, int rank, int world_size,
                    const struct comm_options *opts, struct plait_error *err);

/* Collective over parent: the ranks that pass the same color form one new
 * communicator, ordered by key, then by parent rank; its name is
 * "<name>.<color>". COMM_SPLIT_NONE joins none (*out = NULL). */
int comm_split(struct comm *parent, int color, int key, const char *name, struct comm **out,
               struct plait_error *err);

/* The tensor-, pipeline- and data-parallel groups of a tp x pp x dp world,
 * this rank at coordinates `me` (common/place/rank_order.h: its rank must be
 * rank_of(me)), named "tp", "pp" and "dp" after prefix ("<prefix>.tp.<color>"...).
 * Collective over world. */
int comm_split_3d(struct comm *world, int tp, int pp, int dp, struct rank_coords me,
                  const char *prefix, struct comm **tp_out, struct comm **pp_out,
                  struct comm **dp_out, struct plait_error *err);

int comm_rank(const struct comm *c);
int comm_size(const struct comm *c);
const char *comm_name(const struct comm *c);

/* Closes the communicator. Every request of it the caller has not reaped
 * (comm_wait, or comm_test saying done) is freed with it: pending, done or
 * failed alike; one in flight no longer touches its buffers once this
 * returns. Such a request must not be used after; one reaped before stays
 * the caller's result. NULL is fine. */
void comm_destroy(struct comm *c);

void comm_stats(const struct comm *c, struct comm_stats *out);

/* ---- blocking collectives ------------------------------------------- */
/* Buffers hold `count` elements of dtype unless said otherwise. Where send
 * and recv may be the same buffer, it says "in place". */

/* recv = op over all ranks' send (in place: send == recv). */
int comm_allreduce(struct comm *c, const void *send, void *recv, size_t count,
                   enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err);

/* send: size*count elements; recv (count): block `rank` of the reduction. */
int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err);

/* Uneven: send holds counts[0] + ... + counts[size-1] elements; rank r gets
 * the reduction of its block (counts[r] elements, at the sum of the counts
 * before it) into recv. Any count may be 0 (that rank's recv is untouched;
 * NULL is fine there). Every rank passes the same counts. */
int comm_reduce_scatter_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                          enum comm_dtype dtype, enum comm_reduce_op op, struct plait_error *err);

/* send: count elements; recv: size*count, block r from rank r (in place:
 * send == recv + rank*count). */
int comm_allgather(struct comm *c, const void *send, void *recv, size_t count,
                   enum comm_dtype dtype, struct plait_error *err);

/* Uneven: send holds counts[rank] elements; recv gets counts[0] + ... +
 * counts[size-1], block r (at the sum of the counts before it) from rank r.
 * Any count may be 0; every rank passes the same counts (in place: send ==
 * recv + that sum for this rank). */
int comm_allgather_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                     enum comm_dtype dtype, struct plait_error *err);

/* Uneven all-to-all (MPI_Alltoallv with the blocks packed in rank order):
 * send holds send_counts[r] elements for each rank r, one block after the
 * other; recv gets recv_counts[r] elements from each rank r, the same way.
 * recv_counts[r] here must be send_counts[me] on rank r (a mismatch fails
 * the collective, the receiver naming it); any count may be 0. send and recv
 * must not overlap. The counts may be reused once it returns. */
int comm_alltoall_v(struct comm *c, const void *send, const size_t *send_counts, void *recv,
                    const size_t *recv_counts, enum comm_dtype dtype, struct plait_error *err);

/* buf on root goes to buf on every rank. */
int comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dtype, int root,
                   struct plait_error *err);

int comm_barrier(struct comm *c, struct plait_error *err);

/* Point to point: bytes of anything, between two different ranks. */
int comm_send(struct comm *c, const void *buf, size_t bytes, int peer, uint32_t tag,
              struct plait_error *err);
int comm_recv(struct comm *c, void *buf, size_t bytes, int peer, uint32_t tag,
              struct plait_error *err);

/* ---- asynchronous ------------------------------------------------------ */
/* The same operations, returning at once with *req. The buffers belong to
 * the operation until it completes. Collectives of a communicator run in the
 * order posted; point-to-point operations proceed independently of them. */

int comm_iallreduce(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                    struct plait_error *err);
int comm_ireduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                         enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                         struct plait_error *err);
int comm_ireduce_scatter_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                           enum comm_dtype dtype, enum comm_reduce_op op, struct comm_request **req,
                           struct plait_error *err);
int comm_iallgather(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, struct comm_request **req, struct plait_error *err);
int comm_iallgather_v(struct comm *c, const void *send, void *recv, const size_t *counts,
                      enum comm_dtype dtype, struct comm_request **req, struct plait_error *err);
int comm_ialltoall_v(struct comm *c, const void *send, const size_t *send_counts, void *recv,
                     const size_t *recv_counts, enum comm_dtype dtype, struct comm_request **req,
                     struct plait_error *err);
int comm_ibroadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dtype, int root,
                    struct comm_request **req, struct plait_error *err);
int comm_isend(struct comm *c, const void *buf, size_t bytes, int peer, uint32_t tag,
               struct comm_request **req, struct plait_error *err);
int comm_irecv(struct comm *c, void *buf, size_t bytes, int peer, uint32_t tag,
               struct comm_request **req, struct plait_error *err);

/* Point-to-point operations posted between comm_group_start and
 * comm_group_end start together (NCCL's group calls): two ranks exchanging
 * (each sends to the other and receives from it) group the pair, which nccl
 * needs and socket does not. Groups nest; the outermost end starts them. Only
 * sends and receives may be posted inside; wait for them after the end. */
int comm_group_start(struct comm *c, struct plait_error *err);
int comm_group_end(struct comm *c, struct plait_error *err);

/* Sleeps until req completes (0) or fails (-1, err says why); either way req
 * is freed. NULL is fine (0). */
int comm_wait(struct comm_request *req, struct plait_error *err);

/* *done = whether req has finished; if it has, req is freed and the result is
 * comm_wait's. Never blocks. */
int comm_test(struct comm_request *req, bool *done, struct plait_error *err);

size_t comm_dtype_bytes(enum comm_dtype dtype);

#endif
