/* sock_algo.h — collectives as programs for the socket backend's progress
 * engine: for one rank, the messages it sends and receives, in order per
 * peer, and what gates each. The engine (comm_socket.c) runs any program; the
 * algorithms (ring, recursive doubling, binomial tree, chain, dissemination)
 * are only builders of programs, in sock_algo.c.
 *
 * Streaming: a send with a gate forwards the bytes its gate receive has
 * delivered so far (same offsets), so a large ring all-reduce flows through
 * every rank in fragments instead of step by step. A receive either copies
 * into place, reduces as bytes arrive (dst = wire op local, in that order), or
 * stages into scratch and combines once its step is complete (recursive
 * doubling, where the buffer being combined into is still being sent). */
#ifndef PLAIT_SOCK_ALGO_H
#define PLAIT_SOCK_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_backend.h"

enum xfer_action {
    XFER_COPY,   /* wire -> dst */
    XFER_REDUCE, /* dst = wire op local, element by element as bytes arrive */
    XFER_STAGE,  /* wire -> dst (scratch); then `into` = combine (see sock_algo_combine) */
};

struct xfer_send {
    int peer;
    uint32_t step; /* checked against the receiver's expectation */
    const uint8_t *src;
    size_t bytes;
    int gate; /* index of the receive whose delivered bytes this forwards; -1: none */
    /* progress (the engine's) */
    size_t sent;
    bool done;
};

struct xfer_recv {
    int peer;
    uint32_t step;
    uint8_t *dst;
    size_t bytes;
    enum xfer_action action;
    const uint8_t *local; /* REDUCE */
    /* STAGE: combined once complete, after send `after_send` (-1: none) is done
     * and every earlier STAGE receive is combined: into = wire op into, or
     * into op wire when !wire_first. */
    int after_send;
    uint8_t *into;
    bool wire_first;
    /* progress */
    size_t got; /* bytes delivered to dst */
    bool done;  /* every byte arrived (a zero-byte message: its header did) */
    bool combined;
};

struct program {
    struct xfer_send *sends;
    int n_sends;
    struct xfer_recv *recvs;
    int n_recvs;
    uint8_t *scratch;
    enum comm_dtype dtype;
    enum comm_reduce_op op;
    size_t elem_bytes;
    int next_combine; /* the first receive not yet combined (STAGE) */
    const char *algorithm;
};

/* Builds rank `rank` of `size`'s program for d (its buffers are d's), picking
 * the algorithm by alg and small_bytes as comm.h says; copies what needs no
 * peer (send to recv for out-of-place all-reduce, this rank's block for
 * all-gather) at once. 0, or -1 out of memory. */
int sock_algo_build(struct program *p, const struct comm_desc *d, int rank, int size,
                    enum comm_algorithm alg, size_t small_bytes);

void sock_algo_free(struct program *p);

/* What a send may forward now: bytes up to *limit, and whether the message
 * may finish (its gate is complete). */
void sock_algo_send_limit(const struct program *p, const struct xfer_send *s, size_t *limit,
                          bool *can_finish);

/* Combines every STAGE receive whose turn has come; true if any was. */
bool sock_algo_combine(struct program *p);

/* Every send done and every receive done (and combined). */
bool sock_algo_complete(const struct program *p);

#endif
