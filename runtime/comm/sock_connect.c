/* sock_connect.c — listeners, published endpoints, and the authenticated mesh
 * of links a socket-backend communicator starts with (sock_connect.h has the
 * handshake; sock_handshake.c its bytes). An incoming connection is a
 * stranger until it proves the job's secret: it claims no rank, holds one
 * of a bounded number of slots (the oldest is evicted first), and has a
 * deadline of its own. Every socket here is non-blocking and every wait has
 * the mesh's deadline; the progress engine is not running yet. */
#include "runtime/comm/sock_connect.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/sock_handshake.h"

#define RETRY_MS 20
/* One connection's handshake, either side, from connect or accept: a real
 * peer needs milliseconds; a stranger that stalls is dropped (or, ours,
 * retried) long before any mesh deadline. */
#define HANDSHAKE_MS 3000
#define MAX_STRANGERS 64 /* incoming connections that have not proved the secret */
/* A stranger keeps its slot this long before a newcomer may take it (then
 * the oldest goes first): however fast a flood connects, a real peer's
 * connection lives long enough to prove the secret. */
#define STRANGER_GRACE_MS 500

int64_t sock_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t sock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int random_bytes(void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom((uint8_t *)buf + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

/* ---- endpoints ----------------------------------------------------------- */

int sock_endpoint_format(const struct sock_endpoint *e, char *out, size_t out_bytes)
{
    int n = snprintf(out, out_bytes, "plait-comm-1 %d %ld %s %d %s %s %s", e->global_rank, e->pid,
                     e->host, e->port, e->unix_name, e->node_id, e->hostname);
    return n < 0 || (size_t)n >= out_bytes ? -1 : 0;
}

int sock_endpoint_parse(const char *text, struct sock_endpoint *e)
{
    memset(e, 0, sizeof *e);
    int n = sscanf(text, "plait-comm-1 %d %ld %63s %d %39s %127s %63s", &e->global_rank, &e->pid,
                   e->host, &e->port, e->unix_name, e->node_id, e->hostname);
    return n == 7 && e->port > 0 && e->port < 65536 ? 0 : -1;
}

/* ---- listeners ----------------------------------------------------------- */

/* The local address a packet to host would leave from (no packet is sent). */
static int route_address(const char *host, struct sockaddr_storage *out, socklen_t *out_len,
                         struct plait_error *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *list = NULL;
    int rc = getaddrinfo(host, "9", &hints, &list);
    if (rc != 0)
        return error_set(err, "resolving %s: %s", host,
                         rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    int result = -1, fd = -1;
    for (struct addrinfo *ai = list; ai && result; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        *out_len = sizeof *out;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)out, out_len) == 0)
            result = 0;
        close(fd);
    }
    if (result) error_errno(err, "finding the local address that reaches %s", host);
    freeaddrinfo(list);
    return result;
}

static bool is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    return a->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* An address of this host that other hosts can reach (up, not loopback, not
 * IPv6 link-local), of the given family; false if there is none. */
static bool outward_address(int family, struct sockaddr_storage *out)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = list; i && !found; i = i->ifa_next) {
        const struct sockaddr *a = i->ifa_addr;
        if (!a || a->sa_family != family || !(i->ifa_flags & IFF_UP) || is_loopback(a)) continue;
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)a)->sin6_addr))
            continue;
        memcpy(out, a,
               family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
        found = true;
    }
    freeifaddrs(list);
    return found;
}

/* A fresh abstract Unix socket for the peers on this node. Abstract names
 * have no permissions and anyone on the node can read them from
 * /proc/net/unix: the mesh asks each caller who it is (SO_PEERCRED). */
static int listen_unix(struct sock_listeners *ls, struct plait_error *err)
{
    uint8_t rnd[12];
    if (random_bytes(rnd, sizeof rnd)) return error_errno(err, "getrandom");
    char name[40] = "plait-comm-";
    for (size_t i = 0; i < sizeof rnd; i++) sprintf(name + 11 + 2 * i, "%02x", rnd[i]);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path + 1, name, strlen(name)); /* abstract: a leading NUL */
    socklen_t un_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    ls->unix_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ls->unix_fd < 0 || bind(ls->unix_fd, (struct sockaddr *)&un, un_len) != 0 ||
        listen(ls->unix_fd, 128) != 0)
        return error_errno(err, "listening on a Unix socket");
    snprintf(ls->self.unix_name, sizeof ls->self.unix_name, "%s", name);
    return 0;
}

/* Listens on TCP at the one address it publishes: the local address that
 * reaches the store, unless that is a loopback address (a host name that
 * resolves to 127.0.1.1 on its own node): then one other hosts can reach, if
 * there is one. Never the wildcard: peers are given this address, and
 * nobody else needs to reach the listener at any other. */
int sock_listen(struct sock_listeners *ls, const char *route_host, bool want_unix,
                struct plait_error *err)
{
    memset(ls, 0, sizeof *ls);
    ls->tcp_fd = ls->unix_fd = -1;
    struct sockaddr_storage addr;
    socklen_t len;
    char port[16];
    if (route_address(route_host, &addr, &len, err)) return -1;
    if (is_loopback((struct sockaddr *)&addr)) outward_address(addr.ss_family, &addr);
    if (addr.ss_family == AF_INET) {
        ((struct sockaddr_in *)&addr)->sin_port = 0;
        len = sizeof(struct sockaddr_in);
    } else {
        ((struct sockaddr_in6 *)&addr)->sin6_port = 0;
        len = sizeof(struct sockaddr_in6);
    }
    ls->tcp_fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ls->tcp_fd < 0 || bind(ls->tcp_fd, (struct sockaddr *)&addr, len) != 0 ||
        listen(ls->tcp_fd, 128) != 0) {
        error_errno(err, "listening on TCP");
        goto fail;
    }
    len = sizeof addr;
    if (getsockname(ls->tcp_fd, (struct sockaddr *)&addr, &len) != 0 ||
        getnameinfo((struct sockaddr *)&addr, len, ls->self.host, sizeof ls->self.host, port,
                    sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        error_errno(err, "reading the TCP listener's address");
        goto fail;
    }
    ls->self.port = atoi(port);
    snprintf(ls->self.unix_name, sizeof ls->self.unix_name, "-");
    if (want_unix && listen_unix(ls, err)) goto fail;
    return 0;
fail:
    sock_listeners_close(ls);
    return -1;
}

void sock_listeners_close(struct sock_listeners *ls)
{
    if (ls->tcp_fd >= 0) close(ls->tcp_fd);
    if (ls->unix_fd >= 0) close(ls->unix_fd);
    ls->tcp_fd = ls->unix_fd = -1;
}

/* ---- one handshake --------------------------------------------------------- */

enum pend_state {
    C_CONNECTING,
    C_HELLO_OUT,
    C_CHALLENGE_IN,
    C_PROOF_OUT,
    C_ACK_IN,
    A_HELLO_IN,
    A_CHALLENGE_OUT,
    A_PROOF_IN,
    A_ACK_OUT,
    P_DONE,
};

struct pend {
    int fd;
    bool outgoing, shm;
    /* outgoing: the target. Incoming: the rank its hello names (-1 before),
     * a claim that gives it nothing until it is proven: strangers may name
     * the same rank, and only a proven one becomes that rank's link. */
    int peer;
    bool proven; /* incoming: it proved the secret */
    enum pend_state state;
    struct sock_transcript t;
    uint8_t buf[SOCK_CHALLENGE_BYTES];
    size_t need, have;
    int memfd; /* shared memory: the connector's, or the one received */
    void *map;
    int64_t deadline_ms; /* of this handshake (accepted earlier: sooner) */
    int64_t retry_at_ms; /* outgoing, after a failed attempt */
};

static uint32_t pend_kind(const struct pend *p)
{
    return p->shm ? SOCK_KIND_SHM : SOCK_KIND_TCP;
}

static void pend_close(struct pend *p)
{
    if (p->fd >= 0) close(p->fd);
    if (p->memfd >= 0) close(p->memfd);
    if (p->map) munmap(p->map, sock_link_shm_bytes());
    p->fd = p->memfd = -1;
    p->map = NULL;
}

/* Starts (or restarts) a connection to peer. 0, or -1 (err) for a failure
 * that retrying cannot fix. */
static int start_connect(const struct sock_mesh *m, struct pend *p, struct plait_error *err)
{
    const struct sock_endpoint *e = &m->peers[p->peer];
    p->have = p->need = 0;
    if (p->shm) {
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        size_t n = strlen(e->unix_name);
        if (n + 2 > sizeof un.sun_path)
            return error_set(err, "rank %d's Unix socket name is too long", p->peer);
        memcpy(un.sun_path + 1, e->unix_name, n);
        p->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (p->fd < 0) return error_errno(err, "socket");
        if (connect(p->fd, (struct sockaddr *)&un,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0 &&
            errno != EINPROGRESS && errno != EAGAIN) {
            close(p->fd);
            p->fd = -1;
            p->retry_at_ms = sock_now_ms() + RETRY_MS;
            return 0;
        }
    } else {
        char port[16];
        snprintf(port, sizeof port, "%d", e->port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                        *ai = NULL;
        int rc = getaddrinfo(e->host, port, &hints, &ai);
        if (rc != 0)
            return error_set(err, "rank %d's address %s: %s", p->peer, e->host, gai_strerror(rc));
        p->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int ok = p->fd >= 0 &&
                 (connect(p->fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS);
        freeaddrinfo(ai);
        if (p->fd < 0) return error_errno(err, "socket");
        if (!ok) {
            close(p->fd);
            p->fd = -1;
            p->retry_at_ms = sock_now_ms() + RETRY_MS;
            return 0;
        }
    }
    p->state = C_CONNECTING;
    p->deadline_ms = sock_now_ms() + HANDSHAKE_MS;
    return 0;
}

/* Moves bytes of the current message: 1 when it is complete, 0 to wait,
 * -1 when the connection failed. Receives an SCM_RIGHTS fd into p->memfd. */
static int pend_io(struct pend *p, bool out)
{
    while (p->have < p->need) {
        ssize_t k;
        if (out) {
            struct iovec iov = {p->buf + p->have, p->need - p->have};
            union {
                struct cmsghdr h;
                char space[CMSG_SPACE(sizeof(int))];
            } ctl;
            struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
            if (p->state == C_PROOF_OUT && p->shm && p->have == 0) {
                memset(&ctl, 0, sizeof ctl);
                msg.msg_control = ctl.space;
                msg.msg_controllen = sizeof ctl.space;
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &p->memfd, sizeof(int));
            }
            k = sendmsg(p->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            struct iovec iov = {p->buf + p->have, p->need - p->have};
            union {
                struct cmsghdr h;
                char space[CMSG_SPACE(sizeof(int) * 4)];
            } ctl;
            struct msghdr msg = {.msg_iov = &iov,
                                 .msg_iovlen = 1,
                                 .msg_control = ctl.space,
                                 .msg_controllen = sizeof ctl.space};
            k = recvmsg(p->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
            for (struct cmsghdr *c = k >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c;
                 c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
                size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < nfd; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    if (p->state == A_PROOF_IN && p->shm && p->memfd < 0)
                        p->memfd = fd;
                    else
                        close(fd); /* nobody asked for it */
                }
            }
            if (k == 0) return -1;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0) return -1;
        p->have += (size_t)k;
    }
    return 1;
}

static void expect(struct pend *p, enum pend_state s, size_t bytes)
{
    p->state = s;
    p->need = bytes;
    p->have = 0;
}

/* The connector makes the link's shared memory (sealed at its size, so the
 * acceptor may trust the mapping not to shrink under it). */
static int make_shm(struct pend *p)
{
    size_t bytes = sock_link_shm_bytes();
    p->memfd = memfd_create("plait-comm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->memfd < 0 || ftruncate(p->memfd, (off_t)bytes) != 0 ||
        fcntl(p->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return -1;
    p->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
    if (p->map == MAP_FAILED) {
        p->map = NULL;
        return -1;
    }
    return 0;
}

/* The acceptor maps what it was given, if it is what was promised. */
static int take_shm(struct pend *p)
{
    struct stat st;
    size_t bytes = sock_link_shm_bytes();
    if (p->memfd < 0 || fstat(p->memfd, &st) != 0 || (size_t)st.st_size != bytes) return -1;
    int seals = fcntl(p->memfd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) return -1;
    p->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
    if (p->map == MAP_FAILED) {
        p->map = NULL;
        return -1;
    }
    return 0;
}

/* The connector's side, one message: 1 when it moved on, 0 to wait, -1 when
 * this connection failed (retry), -2 when the peer proved another secret. */
static int connector_step(const struct sock_mesh *m, struct pend *p, struct plait_error *err)
{
    int io;
    switch (p->state) {
    case C_CONNECTING: {
        struct pollfd pf = {.fd = p->fd, .events = POLLOUT};
        if (poll(&pf, 1, 0) <= 0) return 0;
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error) return -1;
        if (random_bytes(p->t.nonce_c, SOCK_NONCE_BYTES)) return -1;
        expect(p, C_HELLO_OUT, SOCK_HELLO_BYTES);
        sock_hello_write(&p->t, p->buf);
        return 1;
    }
    case C_HELLO_OUT:
        if ((io = pend_io(p, true)) <= 0) return io;
        expect(p, C_CHALLENGE_IN, SOCK_CHALLENGE_BYTES);
        return 1;
    case C_CHALLENGE_IN:
        if ((io = pend_io(p, false)) <= 0) return io;
        if (!sock_challenge_read(p->buf, p->have, &p->t)) {
            error_set(err,
                      "rank %d (%s, pid %ld) did not prove this job's secret: is "
                      "PLAIT_STORE_SECRET the same for every rank?",
                      p->peer, m->peers[p->peer].hostname, m->peers[p->peer].pid);
            return -2;
        }
        if (p->shm && make_shm(p)) {
            error_errno(err, "making shared memory for rank %d", p->peer);
            return -2;
        }
        expect(p, C_PROOF_OUT, SOCK_PROOF_BYTES);
        sock_proof_write(&p->t, p->buf);
        return 1;
    case C_PROOF_OUT:
        if ((io = pend_io(p, true)) <= 0) return io;
        expect(p, C_ACK_IN, SOCK_ACK_BYTES);
        return 1;
    case C_ACK_IN:
        if ((io = pend_io(p, false)) <= 0) return io;
        if (!sock_ack_valid(p->buf, p->have)) return -1;
        p->state = P_DONE;
        return 1;
    default:
        return -1;
    }
}

/* The acceptor's side, one message: 1 when it moved on, 0 to wait, -1 when
 * the stranger is to be dropped. Its hello only names a rank; it is that
 * rank once its proof holds, and only if that rank has no link yet. */
static int acceptor_step(const struct sock_mesh *m, struct pend *p, const bool *connected)
{
    int io;
    switch (p->state) {
    case A_HELLO_IN:
        if ((io = pend_io(p, false)) <= 0) return io;
        if (sock_hello_read(p->buf, p->have, m->rank, m->size, pend_kind(p), &p->t) ||
            connected[p->t.from] || m->use_shm[p->t.from] != p->shm)
            return -1;
        p->peer = p->t.from;
        if (random_bytes(p->t.nonce_a, SOCK_NONCE_BYTES)) return -1;
        expect(p, A_CHALLENGE_OUT, SOCK_CHALLENGE_BYTES);
        sock_challenge_write(&p->t, p->buf);
        return 1;
    case A_CHALLENGE_OUT:
        if ((io = pend_io(p, true)) <= 0) return io;
        expect(p, A_PROOF_IN, SOCK_PROOF_BYTES);
        return 1;
    case A_PROOF_IN:
        if ((io = pend_io(p, false)) <= 0) return io;
        if (!sock_proof_valid(&p->t, p->buf, p->have) || connected[p->peer]) return -1;
        if (p->shm && take_shm(p)) return -1;
        p->proven = true;
        expect(p, A_ACK_OUT, SOCK_ACK_BYTES);
        sock_ack_write(p->buf);
        return 1;
    case A_ACK_OUT:
        if ((io = pend_io(p, true)) <= 0) return io;
        p->state = P_DONE;
        return 1;
    default:
        return -1;
    }
}

/* Advances one handshake as far as it goes without waiting. 1: done;
 * 0: waiting; -1: this connection failed (retry or drop); -2: fatal (err). */
static int advance(const struct sock_mesh *m, struct pend *p, const bool *connected,
                   struct plait_error *err)
{
    while (p->state != P_DONE) {
        int step = p->outgoing ? connector_step(m, p, err) : acceptor_step(m, p, connected);
        if (step <= 0) return step;
    }
    return 1;
}

/* The handshake is done: the connection becomes links[peer]. */
static int finish(struct pend *p, struct sock_link *links, bool *connected, struct plait_error *err)
{
    struct sock_link *l = &links[p->peer];
    int rc = p->shm ? sock_link_init_shm(l, p->fd, p->map, sock_link_shm_bytes(), p->outgoing)
                    : sock_link_init_tcp(l, p->fd);
    if (rc) { /* the socket and mapping are still p's to free */
        error_errno(err, "setting up the link to rank %d", p->peer);
        free(l->stage);
        memset(l, 0, sizeof *l);
        l->fd = -1;
        return -1;
    }
    p->fd = -1;
    p->map = NULL;
    if (p->memfd >= 0) close(p->memfd);
    p->memfd = -1;
    connected[p->peer] = true;
    return 0;
}

static void missing_ranks(const struct sock_mesh *m, const bool *connected, char *out, size_t n)
{
    size_t used = 0;
    int listed = 0, more = 0;
    out[0] = '\0';
    for (int r = 0; r < m->size; r++) {
        if (r == m->rank || connected[r]) continue;
        if (listed == 16) {
            more++;
            continue;
        }
        int k = snprintf(out + used, n - used, "%s%d (%s)", listed ? ", " : "", r,
                         m->peers[r].hostname);
        if (k < 0 || (size_t)k >= n - used) break;
        used += (size_t)k;
        listed++;
    }
    if (more && used < n) snprintf(out + used, n - used, " and %d more", more);
}

/* ---- the mesh --------------------------------------------------------------- */

/* One mesh being made: the handshakes (slots 0..rank-1 ours, to the lower
 * ranks; the rest incoming, strangers until proven), the ranks with a link,
 * and the poll set. */
struct mesh_run {
    const struct sock_mesh *m;
    struct sock_listeners *ls;
    struct sock_link *links;
    struct pend *ps; /* [cap] */
    int cap;
    bool *connected;     /* [size] */
    struct pollfd *pfds; /* [cap + 2]: the listeners, then the handshakes */
    int remaining;
    uint64_t *refused;
};

/* A connection that failed: ours is tried again shortly (until the mesh's
 * deadline); a stranger's slot is freed, and it is counted. */
static void pend_fail(struct mesh_run *r, struct pend *p, int64_t now)
{
    pend_close(p);
    if (p->outgoing) {
        p->state = C_CONNECTING;
        p->retry_at_ms = now + RETRY_MS;
        return;
    }
    ++*r->refused;
    p->state = A_HELLO_IN;
    p->peer = -1;
    p->proven = false;
}

/* p proved that it is rank p->peer: any other stranger naming that rank is not. */
static void drop_rivals(struct mesh_run *r, const struct pend *p, int64_t now)
{
    for (int i = r->m->rank; i < r->cap; i++) {
        struct pend *q = &r->ps[i];
        if (q != p && !q->outgoing && q->fd >= 0 && q->state != P_DONE && q->peer == p->peer)
            pend_fail(r, q, now);
    }
}

/* Moves every handshake on as far as it goes without waiting, retries ours
 * when due, and fails those past their own deadline. 0, or -1 (err) when the
 * mesh cannot form. */
static int mesh_progress(struct mesh_run *r, int64_t now, struct plait_error *err)
{
    for (int i = 0; i < r->cap; i++) {
        struct pend *p = &r->ps[i];
        if (p->outgoing && p->fd < 0 && !r->connected[p->peer] && now >= p->retry_at_ms &&
            start_connect(r->m, p, err))
            return -1;
        if (p->fd < 0 || p->state == P_DONE) continue;
        bool was_proven = p->proven;
        int a = now >= p->deadline_ms ? -1 : advance(r->m, p, r->connected, err);
        if (a == -2) return -1;
        if (p->proven && !was_proven) drop_rivals(r, p, now);
        if (a == -1) pend_fail(r, p, now);
        if (a == 1) {
            if (finish(p, r->links, r->connected, err)) return -1;
            r->remaining--;
        }
    }
    return 0;
}

/* Sleeps until a socket is ready, a retry or a handshake's deadline is due,
 * or the mesh's deadline (a second at most). */
static int mesh_wait(struct mesh_run *r, struct plait_error *err)
{
    int np = 0;
    int64_t wake = r->m->deadline_ms;
    r->pfds[np++] = (struct pollfd){.fd = r->ls->tcp_fd, .events = POLLIN};
    r->pfds[np++] = (struct pollfd){.fd = r->ls->unix_fd, .events = POLLIN};
    for (int i = 0; i < r->cap; i++) {
        const struct pend *p = &r->ps[i];
        if (p->outgoing && p->fd < 0 && !r->connected[p->peer] && p->retry_at_ms < wake)
            wake = p->retry_at_ms;
        if (p->fd < 0 || p->state == P_DONE) continue;
        if (p->deadline_ms < wake) wake = p->deadline_ms;
        bool out = p->state == C_CONNECTING || p->state == C_HELLO_OUT || p->state == C_PROOF_OUT ||
                   p->state == A_CHALLENGE_OUT || p->state == A_ACK_OUT;
        r->pfds[np++] = (struct pollfd){.fd = p->fd, .events = out ? POLLOUT : POLLIN};
    }
    int64_t wait_ms = wake - sock_now_ms();
    int k = poll(r->pfds, (nfds_t)np, wait_ms < 0 ? 0 : wait_ms > 1000 ? 1000 : (int)wait_ms);
    if (k < 0 && errno != EINTR) return error_errno(err, "poll");
    return 0;
}

/* Whether the process at the other end of a Unix socket runs as this
 * process's user (the abstract name is no secret: /proc/net/unix lists it). */
static bool same_user(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred &&
           cred.uid == geteuid();
}

/* A slot for a new stranger: a free one, else the one of the oldest stranger
 * that has not proved the secret, if that had STRANGER_GRACE_MS (dropped,
 * counted): a flood then evicts its own, and a real peer keeps its slot long
 * enough to prove itself. -1: none (the newcomer is turned away). */
static int stranger_slot(struct mesh_run *r, int64_t now)
{
    int oldest = -1;
    for (int i = r->m->rank; i < r->cap; i++) {
        const struct pend *p = &r->ps[i];
        if (p->fd < 0 && p->state != P_DONE) return i;
        if (!p->outgoing && p->fd >= 0 && p->state != P_DONE && !p->proven &&
            (oldest < 0 || p->deadline_ms < r->ps[oldest].deadline_ms))
            oldest = i;
    }
    if (oldest < 0 || r->ps[oldest].deadline_ms - HANDSHAKE_MS + STRANGER_GRACE_MS > now) return -1;
    pend_fail(r, &r->ps[oldest], now);
    return oldest;
}

/* Accepts what the listeners hold, each connection a stranger with
 * HANDSHAKE_MS to prove the secret; on the Unix socket only this user's. */
static void mesh_accept(struct mesh_run *r, int64_t now)
{
    for (int li = 0; li < 2; li++) {
        if (r->pfds[li].fd < 0 || !(r->pfds[li].revents & POLLIN)) continue;
        for (int k = 0; k < MAX_STRANGERS; k++) { /* then the handshakes get a turn */
            int fd = accept4(r->pfds[li].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) break;
            int slot = li == 1 && !same_user(fd) ? -1 : stranger_slot(r, now);
            if (slot < 0) {
                ++*r->refused;
                close(fd);
                continue;
            }
            struct pend *p = &r->ps[slot];
            *p = (struct pend){.fd = fd,
                               .memfd = -1,
                               .peer = -1,
                               .shm = li == 1,
                               .deadline_ms = now + HANDSHAKE_MS,
                               .t = {.comm_name = r->m->comm_name, .secret = r->m->secret}};
            expect(p, A_HELLO_IN, SOCK_HELLO_BYTES);
        }
    }
}

static void mesh_timed_out(const struct mesh_run *r, uint64_t refused_before,
                           struct plait_error *err)
{
    char who[600], turned[160] = "";
    missing_ranks(r->m, r->connected, who, sizeof who);
    if (*r->refused > refused_before)
        snprintf(turned, sizeof turned,
                 "; %llu connection(s) that did not prove the job's secret were turned away",
                 (unsigned long long)(*r->refused - refused_before));
    error_peer_lost(err,
                    "no connection with rank(s) %s in time (they published addresses, then "
                    "did not connect or answer)%s",
                    who, turned);
}

int sock_mesh_connect(const struct sock_mesh *m, struct sock_listeners *ls, struct sock_link *links,
                      uint64_t *refused, struct plait_error *err)
{
    int rc = -1;
    uint64_t refused_before = *refused;
    struct mesh_run r = {
        .m = m, .ls = ls, .links = links, .cap = m->size + MAX_STRANGERS, .refused = refused};
    r.remaining = m->size - 1;
    r.ps = calloc((size_t)r.cap, sizeof *r.ps);
    r.connected = calloc((size_t)m->size, sizeof *r.connected);
    r.pfds = calloc((size_t)r.cap + 2, sizeof *r.pfds);
    if (!r.ps || !r.connected || !r.pfds) {
        error_errno(err, "allocating the connection table");
        goto out;
    }
    for (int i = 0; i < r.cap; i++) r.ps[i].fd = r.ps[i].memfd = r.ps[i].peer = -1;
    for (int to = 0; to < m->rank; to++) {
        struct pend *p = &r.ps[to];
        *p = (struct pend){
            .fd = -1, .memfd = -1, .outgoing = true, .peer = to, .shm = m->use_shm[to]};
        p->t = (struct sock_transcript){.comm_name = m->comm_name,
                                        .secret = m->secret,
                                        .from = m->rank,
                                        .to = to,
                                        .kind = pend_kind(p)};
        if (start_connect(m, p, err)) goto out;
    }
    while (r.remaining > 0) {
        int64_t now = sock_now_ms();
        if (now >= m->deadline_ms) {
            mesh_timed_out(&r, refused_before, err);
            goto out;
        }
        if (mesh_progress(&r, now, err)) goto out;
        if (r.remaining == 0) break;
        if (mesh_wait(&r, err)) goto out;
        mesh_accept(&r, sock_now_ms());
    }
    rc = 0;
out:
    if (r.ps)
        for (int i = 0; i < r.cap; i++) pend_close(&r.ps[i]);
    if (rc)
        for (int i = 0; i < m->size && r.connected; i++)
            if (r.connected[i]) sock_link_close(&links[i]);
    free(r.ps);
    free(r.connected);
    free(r.pfds);
    return rc;
}
