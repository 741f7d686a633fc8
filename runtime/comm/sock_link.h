/* sock_link.h — one connection between two ranks of a communicator, as a
 * non-blocking byte stream each way: a TCP socket, or a pair of shared-memory
 * rings (one per direction) beside a Unix socket that carries wake-ups and
 * tells when the peer's process is gone. Framing and what the bytes mean are
 * comm_socket.c's; setting links up is sock_connect.c's.
 *
 * Shared memory: each ring is single-producer single-consumer, head and tail
 * counting bytes ever written and consumed. A side that finds nothing to do
 * sets its "waiting" flag, looks once more, and sleeps in poll on the Unix
 * socket; the other side, after moving head or tail, rings the doorbell (one
 * byte) only if that flag was set. So a busy stream costs no system calls. */
#ifndef PLAIT_SOCK_LINK_H
#define PLAIT_SOCK_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "common/place/comm_memory.h"

enum sock_link_kind { SOCK_LINK_TCP, SOCK_LINK_SHM };

/* per direction: common/place/comm_memory.h says why this size */
#define SOCK_SHM_RING_BYTES COMM_SHM_RING_BYTES
#define SOCK_TCP_STAGE_BYTES ((size_t)256 << 10) /* receive staging for TCP */

struct shm_ring; /* sock_link.c */

struct sock_link {
    enum sock_link_kind kind;
    int fd; /* TCP: the socket; SHM: the Unix socket (doorbell, liveness); -1: none */
    /* SHM */
    void *map;
    size_t map_bytes;
    struct shm_ring *tx, *rx;
    uint8_t *tx_data, *rx_data;
    size_t ring_bytes;
    uint64_t tx_head, rx_tail; /* our copies of what only we write */
    /* TCP receive staging: [stage_rd, stage_wr) unread; stage_rd % 8 tracks rx_pos */
    uint8_t *stage;
    size_t stage_rd, stage_wr;
    uint64_t rx_pos;  /* bytes consumed from the stream */
    bool tx_blocked;  /* the last write hit a full socket or ring */
    bool peer_closed; /* EOF, reset, or the doorbell socket hung up */
    int closed_errno; /* why, when it was an error (0: an orderly close) */
    uint64_t bytes_written, bytes_read;
};

/* Wraps a connected TCP socket (made non-blocking here). */
int sock_link_init_tcp(struct sock_link *l, int fd);

/* Wraps a connected Unix socket and the mapping of the shared memory made by
 * sock_link_shm_create (the connector's side is ring 0 out, ring 1 in). */
int sock_link_init_shm(struct sock_link *l, int fd, void *map, size_t map_bytes, bool connector);

/* The size of the shared memory for one link, and how to check one received. */
size_t sock_link_shm_bytes(void);

void sock_link_close(struct sock_link *l);

/* Writes as much of iov as fits now; the byte count (0: nothing fits), or -1
 * with errno when the connection is broken. */
ssize_t sock_link_write(struct sock_link *l, const struct iovec *iov, int iov_count);

/* Up to n bytes into dst: the count (0: nothing there now; peer_closed says
 * whether more can come), or -1 with errno. */
ssize_t sock_link_read(struct sock_link *l, void *dst, size_t n);

/* The unread bytes, contiguous, at least min_bytes if that many can be had
 * now (fewer at a ring's wrap only if min_bytes does not divide the ring):
 * *p and *avail; 0, or -1 with errno. */
int sock_link_peek(struct sock_link *l, size_t min_bytes, const uint8_t **p, size_t *avail);
void sock_link_consume(struct sock_link *l, size_t n);

/* SHM: before sleeping, say so in the rings (and whether a write is blocked);
 * true if something is ready after all, so do not sleep. TCP: false. */
bool sock_link_prepare_sleep(struct sock_link *l, bool want_write);
/* SHM: after waking, clear the flags. */
void sock_link_after_sleep(struct sock_link *l);

/* Reads the doorbell bytes that woke us (SHM); sets peer_closed on hang-up. */
void sock_link_drain_doorbell(struct sock_link *l);

/* SHM: unread bytes are waiting in the ring (without a system call). */
bool sock_link_rx_ready(const struct sock_link *l);

#endif
