/* sock_algo.c — the collective algorithms of the socket backend, each a
 * builder of one rank's program (sock_algo.h): pipelined rings for all-reduce,
 * reduce-scatter and all-gather; recursive doubling for small all-reduces;
 * binomial tree and pipelined chain broadcasts; a dissemination barrier.
 * No I/O here: comm_socket.c runs the programs. */
#include "runtime/comm/sock_algo.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/comm/sock_reduce.h"

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static int alloc_program(struct program *p, int max_sends, int max_recvs, size_t scratch_bytes)
{
    p->sends = calloc((size_t)max_sends + 1, sizeof *p->sends);
    p->recvs = calloc((size_t)max_recvs + 1, sizeof *p->recvs);
    p->scratch = scratch_bytes ? malloc(scratch_bytes) : NULL;
    if (!p->sends || !p->recvs || (scratch_bytes && !p->scratch)) return -1;
    return 0;
}

static int add_send(struct program *p, int peer, uint32_t step, const void *src, size_t bytes,
                    int gate)
{
    p->sends[p->n_sends] =
        (struct xfer_send){.peer = peer, .step = step, .src = src, .bytes = bytes, .gate = gate};
    return p->n_sends++;
}

static int add_recv(struct program *p, int peer, uint32_t step, void *dst, size_t bytes,
                    enum xfer_action action, const void *local)
{
    p->recvs[p->n_recvs] = (struct xfer_recv){.peer = peer,
                                              .step = step,
                                              .dst = dst,
                                              .bytes = bytes,
                                              .action = action,
                                              .local = local,
                                              .after_send = -1};
    return p->n_recvs++;
}

/* Ring chunk c of count elements in n parts: the first count % n get one more. */
static size_t chunk_off(size_t count, int n, int c)
{
    size_t q = count / (size_t)n, r = count % (size_t)n, uc = (size_t)c;
    return uc * q + (uc < r ? uc : r);
}

static size_t chunk_len(size_t count, int n, int c)
{
    return count / (size_t)n + ((size_t)c < count % (size_t)n);
}

/* Ring all-reduce: reduce-scatter (step s sends chunk r-s, receives chunk
 * r-s-1 and reduces it: wire (the partial sum of the ranks before) + own),
 * then all-gather (step t sends chunk r+1-t, copies chunk r-t). Each send
 * after the first forwards the chunk the step before received, as it arrives.
 * Every rank sends 2(n-1) chunks: 2(n-1)/n of the buffer. */
static int allreduce_ring(struct program *p, const struct comm_desc *d, int r, int n)
{
    if (alloc_program(p, 2 * n, 2 * n, 0)) return -1;
    p->algorithm = "ring";
    const uint8_t *in = d->send;
    uint8_t *out = d->recv;
    size_t e = p->elem_bytes;
    int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int s = 0; s < n - 1; s++) {
        int cs = mod(r - s, n), cr = mod(r - s - 1, n);
        const uint8_t *src = (s == 0 ? in : out) + chunk_off(d->count, n, cs) * e;
        add_send(p, next, (uint32_t)s, src, chunk_len(d->count, n, cs) * e, s - 1);
        size_t off = chunk_off(d->count, n, cr) * e;
        add_recv(p, prev, (uint32_t)s, out + off, chunk_len(d->count, n, cr) * e, XFER_REDUCE,
                 in + off);
    }
    for (int t = 0; t < n - 1; t++) {
        int cs = mod(r + 1 - t, n), cr = mod(r - t, n), step = n - 1 + t;
        add_send(p, next, (uint32_t)step, out + chunk_off(d->count, n, cs) * e,
                 chunk_len(d->count, n, cs) * e, step - 1);
        add_recv(p, prev, (uint32_t)step, out + chunk_off(d->count, n, cr) * e,
                 chunk_len(d->count, n, cr) * e, XFER_COPY, NULL);
    }
    return 0;
}

/* Recursive doubling: log2(p) exchanges of the whole buffer with rank ^ 2^k,
 * each combined in a fixed order (the lower half's value first), so every
 * rank computes the same expression tree. With n = p + rem, ranks 2i and 2i+1
 * (i < rem) first fold into 2i, which hands the result back at the end. */
static int allreduce_rd(struct program *p, const struct comm_desc *d, int r, int n)
{
    int pow2 = 1, levels = 0;
    while (pow2 * 2 <= n) pow2 *= 2, levels++;
    int rem = n - pow2;
    size_t bytes = d->bytes;
    if (alloc_program(p, levels + 2, levels + 2, bytes * (size_t)(levels + 1))) return -1;
    p->algorithm = "recursive doubling";
    uint8_t *buf = d->recv;
    int virt, gate = -1;
    if (r < 2 * rem) {
        if (r % 2) { /* hand the value to r-1, take the result back */
            add_send(p, r - 1, 0, buf, bytes, -1);
            add_recv(p, r - 1, (uint32_t)levels + 1, buf, bytes, XFER_COPY, NULL);
            return 0;
        }
        gate = add_recv(p, r + 1, 0, p->scratch, bytes, XFER_STAGE, NULL);
        p->recvs[gate].into = buf;
        p->recvs[gate].wire_first = false; /* r's value first */
        virt = r / 2;
    } else {
        virt = r - rem;
    }
    for (int k = 0; k < levels; k++) {
        int pv = virt ^ (1 << k), partner = pv < rem ? 2 * pv : pv + rem;
        int s = add_send(p, partner, (uint32_t)k + 1, buf, bytes, gate);
        gate = add_recv(p, partner, (uint32_t)k + 1, p->scratch + bytes * (size_t)(k + 1), bytes,
                        XFER_STAGE, NULL);
        p->recvs[gate].into = buf;
        p->recvs[gate].after_send = s;
        p->recvs[gate].wire_first = pv < virt;
    }
    if (r < 2 * rem) add_send(p, r + 1, (uint32_t)levels + 1, buf, bytes, gate);
    return 0;
}

/* Block b of a reduce-scatter or an all-gather: its first element and its count (the same
 * count for every rank, or d->counts[b]). */
static size_t block_of(const struct comm_desc *d, int b, size_t *len)
{
    if (!d->counts) {
        *len = d->count;
        return (size_t)b * d->count;
    }
    size_t off = 0;
    for (int i = 0; i < b; i++) off += d->counts[i];
    *len = d->counts[b];
    return off;
}

/* Ring reduce-scatter, shifted so rank r ends with block r: step s sends
 * block r-s-1 (its own at step 0, then the partial it received), receives
 * block r-s-2 and reduces it with its own into scratch (the last one into
 * recv). The send buffer is only read. Blocks may differ in size (per-rank
 * counts, some 0: a 0-byte message still keeps the steps in order). */
static int reduce_scatter_ring(struct program *p, const struct comm_desc *d, int r, int n)
{
    size_t e = p->elem_bytes, len, scratch = 0;
    for (int s = 0; s < n - 2; s++) { /* the partials that pass through this rank */
        block_of(d, mod(r - s - 2, n), &len);
        scratch += len * e;
    }
    if (alloc_program(p, n, n, scratch)) return -1;
    p->algorithm = "ring";
    const uint8_t *in = d->send;
    uint8_t *at = p->scratch;
    int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int s = 0; s < n - 1; s++) {
        int cs = mod(r - s - 1, n), cr = mod(r - s - 2, n);
        size_t off = block_of(d, cs, &len);
        const uint8_t *src = s == 0 ? in + off * e : p->recvs[s - 1].dst;
        add_send(p, next, (uint32_t)s, src, len * e, s - 1);
        off = block_of(d, cr, &len);
        uint8_t *dst = s == n - 2 ? (uint8_t *)d->recv : at;
        if (s < n - 2) at += len * e;
        add_recv(p, prev, (uint32_t)s, dst, len * e, XFER_REDUCE, in + off * e);
    }
    return 0;
}

/* Ring all-gather: step t forwards block r-t, receives block r-t-1 (blocks
 * of d->counts when given, some possibly empty: a 0-byte message still keeps
 * the steps in order). */
static int allgather_ring(struct program *p, const struct comm_desc *d, int r, int n)
{
    if (alloc_program(p, n, n, 0)) return -1;
    p->algorithm = "ring";
    uint8_t *out = d->recv;
    size_t e = p->elem_bytes, len;
    int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int t = 0; t < n - 1; t++) {
        size_t off = block_of(d, mod(r - t, n), &len);
        add_send(p, next, (uint32_t)t, out + off * e, len * e, t - 1);
        off = block_of(d, mod(r - t - 1, n), &len);
        add_recv(p, prev, (uint32_t)t, out + off * e, len * e, XFER_COPY, NULL);
    }
    return 0;
}

/* All-to-all, pairwise: at distance t = 1 .. n-1 send the block of rank r+t
 * and receive the block of rank r-t, every pair's message in flight at once
 * (each peer's sends and receives run in order, the peers concurrently), so
 * no rank is every rank's first destination. Its own block is copied. */
static int alltoall_pairwise(struct program *p, const struct comm_desc *d, int r, int n)
{
    if (alloc_program(p, n, n, 0)) return -1;
    p->algorithm = "pairwise";
    size_t e = p->elem_bytes, *soff = calloc((size_t)n + 1, sizeof *soff),
           *roff = calloc((size_t)n + 1, sizeof *roff);
    if (!soff || !roff) {
        free(soff);
        free(roff);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        soff[k + 1] = soff[k] + d->counts[k] * e;
        roff[k + 1] = roff[k] + d->recv_counts[k] * e;
    }
    const uint8_t *in = d->send;
    uint8_t *out = d->recv;
    if (d->counts[r]) memcpy(out + roff[r], in + soff[r], d->counts[r] * e);
    for (int t = 1; t < n; t++) {
        int to = mod(r + t, n), from = mod(r - t, n);
        add_send(p, to, 0, in ? in + soff[to] : NULL, d->counts[to] * e, -1);
        add_recv(p, from, 0, out ? out + roff[from] : NULL, d->recv_counts[from] * e, XFER_COPY,
                 NULL);
    }
    free(soff);
    free(roff);
    return 0;
}

/* Broadcast along a tree in virtual ranks v = rank - root: a binomial tree
 * (parent: v without its lowest set bit; children v + 2^k below it, farthest
 * first) or a chain (v-1 -> v -> v+1). Every send forwards the one receive as
 * it arrives, so the chain streams. */
static int broadcast_tree(struct program *p, const struct comm_desc *d, int r, int n, bool chain)
{
    if (alloc_program(p, n, 1, 0)) return -1;
    p->algorithm = chain ? "chain" : "binomial tree";
    int v = mod(r - d->root, n), gate = -1;
    uint8_t *buf = d->recv;
    if (chain) {
        if (v > 0) gate = add_recv(p, mod(r - 1, n), 0, buf, d->bytes, XFER_COPY, NULL);
        if (v + 1 < n) add_send(p, mod(r + 1, n), 0, buf, d->bytes, gate);
        return 0;
    }
    int low = 1; /* v's lowest set bit; for the root, past the top */
    while (low < n && !(v & low)) low <<= 1;
    if (v > 0) gate = add_recv(p, mod(v - low + d->root, n), 0, buf, d->bytes, XFER_COPY, NULL);
    for (int k = low >> 1; k >= 1; k >>= 1)
        if (v + k < n) add_send(p, mod(v + k + d->root, n), 0, buf, d->bytes, gate);
    return 0;
}

/* Dissemination barrier: round k sends an empty message to r + 2^k once
 * every earlier round's message has come (from r - 1, r - 2, ... r - 2^(k-1));
 * ceil(log2 n) rounds, no root. The receives come from different peers, so
 * they are STAGE receives of nothing: those count only in order, which makes
 * the gate on round k-1 mean "rounds 0..k-1". */
static int barrier_dissemination(struct program *p, int r, int n)
{
    int rounds = 0;
    while ((1 << rounds) < n) rounds++;
    if (alloc_program(p, rounds, rounds, 0)) return -1;
    p->algorithm = "dissemination";
    int gate = -1;
    for (int k = 0; k < rounds; k++) {
        add_send(p, mod(r + (1 << k), n), (uint32_t)k, NULL, 0, gate);
        gate = add_recv(p, mod(r - (1 << k), n), (uint32_t)k, NULL, 0, XFER_STAGE, NULL);
    }
    return 0;
}

int sock_algo_build(struct program *p, const struct comm_desc *d, int rank, int size,
                    enum comm_algorithm alg, size_t small_bytes)
{
    memset(p, 0, sizeof *p);
    p->dtype = d->dtype;
    p->op = d->op;
    p->elem_bytes = comm_dtype_bytes(d->dtype);
    p->algorithm = "local";
    bool latency =
        alg == COMM_ALGORITHM_LATENCY || (alg == COMM_ALGORITHM_AUTO && d->bytes <= small_bytes);
    int rc = 0;
    switch (d->kind) {
    case COMM_OP_ALLREDUCE:
        if (d->count == 0) break;
        if (size > 1 && !latency) {
            rc = allreduce_ring(p, d, rank, size); /* writes every byte of recv */
            break;
        }
        if (d->send != d->recv) memcpy(d->recv, d->send, d->bytes);
        if (size > 1) rc = allreduce_rd(p, d, rank, size);
        break;
    case COMM_OP_REDUCE_SCATTER: {
        size_t total = 0, len;
        for (int b = 0; b < size; b++) total += (block_of(d, b, &len), len);
        if (total == 0) break;
        if (size == 1)
            memcpy(d->recv, d->send, d->bytes);
        else
            rc = reduce_scatter_ring(p, d, rank, size);
        break;
    }
    case COMM_OP_ALLGATHER: {
        size_t total = 0, len, off = block_of(d, rank, &len);
        for (int b = 0; b < size; b++) total += (block_of(d, b, &len), len);
        if (total == 0) break;
        uint8_t *mine = (uint8_t *)d->recv + off * p->elem_bytes;
        if (d->bytes && mine != d->send) memcpy(mine, d->send, d->bytes);
        if (size > 1) rc = allgather_ring(p, d, rank, size);
        break;
    }
    case COMM_OP_BROADCAST:
        if (d->count == 0 || size == 1) break;
        rc = broadcast_tree(p, d, rank, size, !latency);
        break;
    case COMM_OP_BARRIER:
        if (size > 1) rc = barrier_dissemination(p, rank, size);
        break;
    case COMM_OP_ALLTOALL:
        rc = alltoall_pairwise(p, d, rank, size);
        break;
    case COMM_OP_SEND:
    case COMM_OP_RECV:
        break;
    }
    if (rc) sock_algo_free(p);
    return rc;
}

void sock_algo_free(struct program *p)
{
    free(p->sends);
    free(p->recvs);
    free(p->scratch);
    p->sends = NULL;
    p->recvs = NULL;
    p->scratch = NULL;
    p->n_sends = p->n_recvs = 0;
}

static bool recv_complete(const struct xfer_recv *x)
{
    return x->done && (x->action != XFER_STAGE || x->combined);
}

void sock_algo_send_limit(const struct program *p, const struct xfer_send *s, size_t *limit,
                          bool *can_finish)
{
    if (s->gate < 0) {
        *limit = s->bytes;
        *can_finish = true;
        return;
    }
    const struct xfer_recv *g = &p->recvs[s->gate];
    *can_finish = recv_complete(g);
    if (*can_finish)
        *limit = s->bytes;
    else
        *limit = g->action == XFER_STAGE ? 0 : (g->got < s->bytes ? g->got : s->bytes);
}

bool sock_algo_combine(struct program *p)
{
    bool any = false;
    while (p->next_combine < p->n_recvs) {
        struct xfer_recv *x = &p->recvs[p->next_combine];
        if (x->action == XFER_STAGE) {
            if (!x->done || (x->after_send >= 0 && !p->sends[x->after_send].done)) break;
            size_t count = x->bytes / p->elem_bytes; /* 0: the barrier's ordered receives */
            if (count && x->wire_first)
                sock_reduce(p->dtype, p->op, x->into, x->dst, x->into, count);
            else if (count)
                sock_reduce(p->dtype, p->op, x->into, x->into, x->dst, count);
            x->combined = true;
            any = true;
        }
        p->next_combine++;
    }
    return any;
}

bool sock_algo_complete(const struct program *p)
{
    for (int i = 0; i < p->n_sends; i++)
        if (!p->sends[i].done) return false;
    for (int i = 0; i < p->n_recvs; i++)
        if (!recv_complete(&p->recvs[i])) return false;
    return true;
}
