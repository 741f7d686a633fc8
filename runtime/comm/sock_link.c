/* sock_link.c — the socket backend's byte streams (sock_link.h): TCP with a
 * receive staging buffer, and shared-memory rings with doorbells on a Unix
 * socket. No framing and no policy: the caller decides what to read and
 * when to sleep. */
#include "runtime/comm/sock_link.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define SHM_CTL_BYTES 4096 /* the two rings' control blocks, then their data */

struct shm_ring {
    _Atomic uint64_t head; /* bytes ever written (producer) */
    _Atomic uint32_t reader_waiting;
    uint8_t pad0[64 - 12];
    _Atomic uint64_t tail; /* bytes ever consumed (consumer) */
    _Atomic uint32_t writer_waiting;
    uint8_t pad1[64 - 12];
};

_Static_assert(sizeof(struct shm_ring) == 128, "one cache line per side");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared-memory rings need lock-free 64-bit atomics");
_Static_assert(SOCK_SHM_RING_BYTES % 8 == 0, "8-aligned frames never wrap mid-element");

size_t sock_link_shm_bytes(void)
{
    return SHM_CTL_BYTES + 2 * SOCK_SHM_RING_BYTES;
}

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -1;
    return 0;
}

int sock_link_init_tcp(struct sock_link *l, int fd)
{
    memset(l, 0, sizeof *l);
    l->kind = SOCK_LINK_TCP;
    l->fd = fd;
    int one = 1;
    if (set_nonblocking(fd) || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
        return -1;
    l->stage = malloc(SOCK_TCP_STAGE_BYTES);
    return l->stage ? 0 : -1;
}

int sock_link_init_shm(struct sock_link *l, int fd, void *map, size_t map_bytes, bool connector)
{
    memset(l, 0, sizeof *l);
    l->kind = SOCK_LINK_SHM;
    l->fd = fd;
    l->map = map;
    l->map_bytes = map_bytes;
    l->ring_bytes = SOCK_SHM_RING_BYTES;
    if (map_bytes != sock_link_shm_bytes()) {
        errno = EPROTO;
        return -1;
    }
    struct shm_ring *r0 = map, *r1 = (struct shm_ring *)((uint8_t *)map + sizeof *r0);
    uint8_t *d0 = (uint8_t *)map + SHM_CTL_BYTES, *d1 = d0 + SOCK_SHM_RING_BYTES;
    l->tx = connector ? r0 : r1;
    l->rx = connector ? r1 : r0;
    l->tx_data = connector ? d0 : d1;
    l->rx_data = connector ? d1 : d0;
    l->tx_head = atomic_load(&l->tx->head);
    l->rx_tail = atomic_load(&l->rx->tail);
    return set_nonblocking(fd);
}

void sock_link_close(struct sock_link *l)
{
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    if (l->map) munmap(l->map, l->map_bytes);
    l->map = NULL;
    free(l->stage);
    l->stage = NULL;
}

/* A connection error: the peer is gone (returns -1 with errno kept). */
static ssize_t broken(struct sock_link *l, int e)
{
    l->peer_closed = true;
    l->closed_errno = e;
    errno = e;
    return -1;
}

/* ---- shared memory ----------------------------------------------------- */

static void doorbell(struct sock_link *l)
{
    uint8_t one = 1;
    for (;;) {
        ssize_t k = send(l->fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        /* EAGAIN: doorbells are queued already, the peer will wake */
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            l->peer_closed = true;
            l->closed_errno = errno;
        }
        return;
    }
}

static ssize_t shm_write(struct sock_link *l, const struct iovec *iov, int iov_count)
{
    if (l->peer_closed) return broken(l, l->closed_errno ? l->closed_errno : EPIPE);
    uint64_t tail = atomic_load_explicit(&l->tx->tail, memory_order_acquire);
    size_t space = l->ring_bytes - (size_t)(l->tx_head - tail), written = 0;
    for (int i = 0; i < iov_count && space > 0; i++) {
        const uint8_t *src = iov[i].iov_base;
        size_t n = iov[i].iov_len < space ? iov[i].iov_len : space;
        while (n > 0) {
            size_t at = (size_t)(l->tx_head % l->ring_bytes), run = l->ring_bytes - at;
            if (run > n) run = n;
            memcpy(l->tx_data + at, src, run);
            l->tx_head += run, src += run, n -= run, space -= run, written += run;
        }
    }
    if (written == 0) {
        l->tx_blocked = true;
        return 0;
    }
    l->tx_blocked = false;
    /* publish, then look for a sleeper: both sequentially consistent, as are the
       sleeper's flag and its second look (sock_link_prepare_sleep), so one of
       the two sides always sees the other */
    atomic_store(&l->tx->head, l->tx_head);
    if (atomic_load(&l->tx->reader_waiting) && atomic_exchange(&l->tx->reader_waiting, 0))
        doorbell(l);
    l->bytes_written += written;
    return (ssize_t)written;
}

static size_t shm_contiguous(const struct sock_link *l, size_t *avail_out)
{
    uint64_t head = atomic_load_explicit(&l->rx->head, memory_order_acquire);
    size_t avail = (size_t)(head - l->rx_tail), at = (size_t)(l->rx_tail % l->ring_bytes);
    size_t run = l->ring_bytes - at;
    if (avail_out) *avail_out = avail;
    return avail < run ? avail : run;
}

/* Publishes rx_tail; wakes the writer if it sleeps on a full ring. */
static void shm_publish_tail(struct sock_link *l)
{
    atomic_store(&l->rx->tail, l->rx_tail); /* sequentially consistent: see shm_write */
    if (atomic_load(&l->rx->writer_waiting) && atomic_exchange(&l->rx->writer_waiting, 0))
        doorbell(l);
}

static void shm_consume(struct sock_link *l, size_t n)
{
    l->rx_tail += n;
    l->bytes_read += n;
    shm_publish_tail(l);
}

static ssize_t shm_read(struct sock_link *l, void *dst, size_t n)
{
    uint8_t *out = dst;
    size_t done = 0;
    while (done < n) {
        size_t run = shm_contiguous(l, NULL);
        if (run == 0) break;
        if (run > n - done) run = n - done;
        memcpy(out + done, l->rx_data + l->rx_tail % l->ring_bytes, run);
        done += run;
        l->rx_tail += run;
    }
    if (done) {
        l->bytes_read += done;
        shm_publish_tail(l);
    }
    return (ssize_t)done;
}

/* ---- TCP --------------------------------------------------------------- */

static ssize_t tcp_write(struct sock_link *l, const struct iovec *iov, int iov_count)
{
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iov_count};
    for (;;) {
        ssize_t k = sendmsg(l->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            l->tx_blocked = true;
            return 0;
        }
        if (k < 0) return broken(l, errno);
        l->tx_blocked = false;
        l->bytes_written += (size_t)k;
        return k;
    }
}

/* One recv into dst: bytes, 0 (nothing now, or EOF: peer_closed), -1. */
static ssize_t tcp_recv(struct sock_link *l, void *dst, size_t n)
{
    for (;;) {
        ssize_t k = recv(l->fd, dst, n, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0 && errno == ECONNRESET) {
            broken(l, errno);
            return 0; /* what was read before the reset has been taken already */
        }
        if (k < 0) return -1;
        if (k == 0) l->peer_closed = true;
        return k;
    }
}

/* Makes room in the staging buffer for at least want more bytes, keeping
 * stage_rd congruent to rx_pos mod 8 (so 8-aligned frames stay aligned). */
static void tcp_stage_room(struct sock_link *l, size_t want)
{
    size_t base = (size_t)(l->rx_pos % 8);
    if (l->stage_rd == l->stage_wr) {
        l->stage_rd = l->stage_wr = base;
    } else if (SOCK_TCP_STAGE_BYTES - l->stage_wr < want && l->stage_rd > base) {
        size_t n = l->stage_wr - l->stage_rd;
        memmove(l->stage + base, l->stage + l->stage_rd, n);
        l->stage_rd = base;
        l->stage_wr = base + n;
    }
}

static int tcp_peek(struct sock_link *l, size_t min_bytes, const uint8_t **p, size_t *avail)
{
    size_t have = l->stage_wr - l->stage_rd;
    if (have == 0 || have < min_bytes) {
        tcp_stage_room(l, min_bytes > have ? min_bytes - have : 1);
        if (l->stage_wr < SOCK_TCP_STAGE_BYTES) {
            ssize_t k = tcp_recv(l, l->stage + l->stage_wr, SOCK_TCP_STAGE_BYTES - l->stage_wr);
            if (k < 0) return -1;
            l->stage_wr += (size_t)k;
        }
    }
    *p = l->stage + l->stage_rd;
    *avail = l->stage_wr - l->stage_rd;
    return 0;
}

static void tcp_consume(struct sock_link *l, size_t n)
{
    l->stage_rd += n;
    l->rx_pos += n;
    l->bytes_read += n;
}

static ssize_t tcp_read(struct sock_link *l, void *dst, size_t n)
{
    uint8_t *out = dst;
    size_t done = 0, have = l->stage_wr - l->stage_rd;
    if (have) {
        done = have < n ? have : n;
        memcpy(out, l->stage + l->stage_rd, done);
        tcp_consume(l, done);
    }
    if (done == n || l->peer_closed) return (ssize_t)done;
    if (n - done >= 4096) { /* large: straight into place */
        ssize_t k = tcp_recv(l, out + done, n - done);
        if (k < 0) return done ? (ssize_t)done : -1;
        l->rx_pos += (size_t)k;
        l->bytes_read += (size_t)k;
        return (ssize_t)(done + (size_t)k);
    }
    const uint8_t *p;
    size_t avail;
    if (tcp_peek(l, n - done, &p, &avail)) return done ? (ssize_t)done : -1;
    size_t k = avail < n - done ? avail : n - done;
    memcpy(out + done, p, k);
    tcp_consume(l, k);
    return (ssize_t)(done + k);
}

/* ---- either ------------------------------------------------------------ */

ssize_t sock_link_write(struct sock_link *l, const struct iovec *iov, int iov_count)
{
    return l->kind == SOCK_LINK_TCP ? tcp_write(l, iov, iov_count) : shm_write(l, iov, iov_count);
}

ssize_t sock_link_read(struct sock_link *l, void *dst, size_t n)
{
    return l->kind == SOCK_LINK_TCP ? tcp_read(l, dst, n) : shm_read(l, dst, n);
}

int sock_link_peek(struct sock_link *l, size_t min_bytes, const uint8_t **p, size_t *avail)
{
    if (l->kind == SOCK_LINK_TCP) return tcp_peek(l, min_bytes, p, avail);
    *avail = shm_contiguous(l, NULL);
    *p = l->rx_data + l->rx_tail % l->ring_bytes;
    return 0;
}

void sock_link_consume(struct sock_link *l, size_t n)
{
    if (n == 0) return;
    if (l->kind == SOCK_LINK_TCP)
        tcp_consume(l, n);
    else
        shm_consume(l, n);
}

bool sock_link_rx_ready(const struct sock_link *l)
{
    if (l->kind == SOCK_LINK_TCP) return l->stage_wr > l->stage_rd;
    return shm_contiguous(l, NULL) > 0;
}

bool sock_link_prepare_sleep(struct sock_link *l, bool want_write)
{
    if (l->kind != SOCK_LINK_SHM || l->peer_closed) return false;
    bool ready = false;
    atomic_store(&l->rx->reader_waiting, 1);
    if (atomic_load(&l->rx->head) != l->rx_tail) ready = true;
    if (want_write) {
        atomic_store(&l->tx->writer_waiting, 1);
        uint64_t tail = atomic_load(&l->tx->tail);
        if (l->tx_head - tail < l->ring_bytes) ready = true;
    }
    return ready;
}

void sock_link_after_sleep(struct sock_link *l)
{
    if (l->kind != SOCK_LINK_SHM) return;
    atomic_store_explicit(&l->rx->reader_waiting, 0, memory_order_relaxed);
    atomic_store_explicit(&l->tx->writer_waiting, 0, memory_order_relaxed);
}

void sock_link_drain_doorbell(struct sock_link *l)
{
    uint8_t buf[256];
    for (;;) {
        ssize_t k = recv(l->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k > 0) continue;
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) {
            l->peer_closed = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            l->peer_closed = true;
            l->closed_errno = errno;
        }
        return;
    }
}
