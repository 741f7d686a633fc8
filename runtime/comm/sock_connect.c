/* sock_connect.c — listeners, published endpoints, and the authenticated mesh
 * of links a socket-backend communicator starts with (sock_connect.h has the
 * handshake). Every socket here is non-blocking and every wait has the
 * mesh's deadline; the progress engine is not running yet. */
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

#include "common/sha256.h"
#include "runtime/comm/comm.h"

#define HELLO_BYTES 56
#define CHALLENGE_BYTES 64
#define PROOF_BYTES 32
#define ACK_BYTES 8
#define NONCE_BYTES 32
#define HANDSHAKE_VERSION 1u
#define KIND_TCP 0u
#define KIND_SHM 1u
#define RETRY_MS 20
#define MAX_STRANGERS 64 /* incoming connections not yet authenticated */

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

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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

/* Listens on every address of the family that reaches the store, and
 * publishes the one that reaches it, unless that is a loopback address (a
 * host name that resolves to 127.0.1.1 on its own node): then one other
 * hosts can reach, if there is one. */
int sock_listen(struct sock_listeners *ls, const char *route_host, bool want_unix,
                struct plait_error *err)
{
    memset(ls, 0, sizeof *ls);
    ls->tcp_fd = ls->unix_fd = -1;
    struct sockaddr_storage route, any = {0};
    socklen_t len;
    if (route_address(route_host, &route, &len, err)) return -1;
    if (is_loopback((struct sockaddr *)&route)) outward_address(route.ss_family, &route);
    any.ss_family = route.ss_family; /* the wildcard address, port 0 */
    len = route.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    ls->tcp_fd = socket(route.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ls->tcp_fd < 0 || bind(ls->tcp_fd, (struct sockaddr *)&any, len) != 0 ||
        listen(ls->tcp_fd, 128) != 0) {
        error_errno(err, "listening on TCP");
        goto fail;
    }
    socklen_t bound_len = sizeof any;
    char port[16];
    if (getsockname(ls->tcp_fd, (struct sockaddr *)&any, &bound_len) != 0 ||
        getnameinfo((struct sockaddr *)&any, bound_len, NULL, 0, port, sizeof port,
                    NI_NUMERICSERV) != 0 ||
        getnameinfo((struct sockaddr *)&route, len, ls->self.host, sizeof ls->self.host, NULL, 0,
                    NI_NUMERICHOST) != 0) {
        error_errno(err, "reading the TCP listener's address");
        goto fail;
    }
    ls->self.port = atoi(port);
    snprintf(ls->self.unix_name, sizeof ls->self.unix_name, "-");
    if (want_unix) {
        uint8_t rnd[12];
        if (random_bytes(rnd, sizeof rnd)) {
            error_errno(err, "getrandom");
            goto fail;
        }
        char name[40] = "plait-comm-";
        for (size_t i = 0; i < sizeof rnd; i++) sprintf(name + 11 + 2 * i, "%02x", rnd[i]);
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        memcpy(un.sun_path + 1, name, strlen(name)); /* abstract: a leading NUL */
        socklen_t un_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
        ls->unix_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (ls->unix_fd < 0 || bind(ls->unix_fd, (struct sockaddr *)&un, un_len) != 0 ||
            listen(ls->unix_fd, 128) != 0) {
            error_errno(err, "listening on a Unix socket");
            goto fail;
        }
        snprintf(ls->self.unix_name, sizeof ls->self.unix_name, "%s", name);
    }
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
    int peer; /* outgoing: the target; incoming: from its hello (-1 before) */
    enum pend_state state;
    uint8_t buf[CHALLENGE_BYTES];
    size_t need, have;
    uint8_t nonce_c[NONCE_BYTES], nonce_a[NONCE_BYTES];
    int memfd; /* shared memory: the connector's, or the one received */
    void *map;
    int64_t retry_at_ms; /* outgoing, after a failed attempt */
};

static void mac(const struct sock_mesh *m, bool acceptor, int from, int to, uint32_t kind,
                const uint8_t *nonce_c, const uint8_t *nonce_a, uint8_t out[SHA256_DIGEST_BYTES])
{
    const char *label = acceptor ? "plait-comm-v1 acceptor" : "plait-comm-v1 connector";
    size_t name_len = strlen(m->comm_name), n = 0;
    uint8_t msg[64 + 4 + COMM_MAX_NAME_BYTES + 16 + 12 + 2 * NONCE_BYTES];
    memcpy(msg, label, strlen(label));
    n += strlen(label);
    put_u32(msg + n, (uint32_t)name_len);
    n += 4;
    memcpy(msg + n, m->comm_name, name_len);
    n += name_len;
    put_u32(msg + n, (uint32_t)from);
    put_u32(msg + n + 4, (uint32_t)to);
    put_u32(msg + n + 8, kind);
    n += 12;
    memcpy(msg + n, nonce_c, NONCE_BYTES);
    memcpy(msg + n + NONCE_BYTES, nonce_a, NONCE_BYTES);
    n += 2 * NONCE_BYTES;
    sha256_hmac(m->secret, strlen(m->secret), msg, n, out);
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

/* Advances one handshake as far as it goes without waiting. 1: done;
 * 0: waiting; -1: this connection failed (retry or drop); -2: fatal (err). */
static int advance(const struct sock_mesh *m, struct pend *p, const bool *connected,
                   struct plait_error *err)
{
    for (;;) {
        int io;
        switch (p->state) {
        case C_CONNECTING: {
            struct pollfd pf = {.fd = p->fd, .events = POLLOUT};
            if (poll(&pf, 1, 0) <= 0) return 0;
            int so_error = 0;
            socklen_t len = sizeof so_error;
            if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error)
                return -1;
            if (random_bytes(p->nonce_c, NONCE_BYTES)) return -1;
            expect(p, C_HELLO_OUT, HELLO_BYTES);
            memcpy(p->buf, "PLCM", 4);
            put_u32(p->buf + 4, HANDSHAKE_VERSION);
            put_u32(p->buf + 8, (uint32_t)m->rank);
            put_u32(p->buf + 12, (uint32_t)p->peer);
            put_u32(p->buf + 16, p->shm ? KIND_SHM : KIND_TCP);
            put_u32(p->buf + 20, 0);
            memcpy(p->buf + 24, p->nonce_c, NONCE_BYTES);
            break;
        }
        case C_HELLO_OUT:
            if ((io = pend_io(p, true)) <= 0) return io;
            expect(p, C_CHALLENGE_IN, CHALLENGE_BYTES);
            break;
        case C_CHALLENGE_IN: {
            if ((io = pend_io(p, false)) <= 0) return io;
            uint8_t want[SHA256_DIGEST_BYTES];
            uint32_t kind = p->shm ? KIND_SHM : KIND_TCP;
            memcpy(p->nonce_a, p->buf, NONCE_BYTES);
            mac(m, true, m->rank, p->peer, kind, p->nonce_c, p->nonce_a, want);
            if (!sha256_equal_ct(want, p->buf + NONCE_BYTES, SHA256_DIGEST_BYTES)) {
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
            expect(p, C_PROOF_OUT, PROOF_BYTES);
            mac(m, false, m->rank, p->peer, kind, p->nonce_c, p->nonce_a, p->buf);
            break;
        }
        case C_PROOF_OUT:
            if ((io = pend_io(p, true)) <= 0) return io;
            expect(p, C_ACK_IN, ACK_BYTES);
            break;
        case C_ACK_IN:
            if ((io = pend_io(p, false)) <= 0) return io;
            if (memcmp(p->buf, "PLOK", 4) != 0) return -1;
            p->state = P_DONE;
            return 1;
        case A_HELLO_IN: {
            if ((io = pend_io(p, false)) <= 0) return io;
            int from = (int)get_u32(p->buf + 8), to = (int)get_u32(p->buf + 12);
            uint32_t kind = get_u32(p->buf + 16);
            if (memcmp(p->buf, "PLCM", 4) != 0 || get_u32(p->buf + 4) != HANDSHAKE_VERSION ||
                to != m->rank || from <= m->rank || from >= m->size || connected[from] ||
                kind != (p->shm ? KIND_SHM : KIND_TCP) || m->use_shm[from] != p->shm)
                return -1;
            p->peer = from;
            memcpy(p->nonce_c, p->buf + 24, NONCE_BYTES);
            if (random_bytes(p->nonce_a, NONCE_BYTES)) return -1;
            expect(p, A_CHALLENGE_OUT, CHALLENGE_BYTES);
            memcpy(p->buf, p->nonce_a, NONCE_BYTES);
            mac(m, true, from, m->rank, kind, p->nonce_c, p->nonce_a, p->buf + NONCE_BYTES);
            break;
        }
        case A_CHALLENGE_OUT:
            if ((io = pend_io(p, true)) <= 0) return io;
            expect(p, A_PROOF_IN, PROOF_BYTES);
            break;
        case A_PROOF_IN: {
            if ((io = pend_io(p, false)) <= 0) return io;
            uint8_t want[SHA256_DIGEST_BYTES];
            mac(m, false, p->peer, m->rank, p->shm ? KIND_SHM : KIND_TCP, p->nonce_c, p->nonce_a,
                want);
            if (!sha256_equal_ct(want, p->buf, SHA256_DIGEST_BYTES)) return -1;
            if (p->shm && take_shm(p)) return -1;
            expect(p, A_ACK_OUT, ACK_BYTES);
            memcpy(p->buf, "PLOK", 4);
            put_u32(p->buf + 4, 0);
            break;
        }
        case A_ACK_OUT:
            if ((io = pend_io(p, true)) <= 0) return io;
            p->state = P_DONE;
            return 1;
        case P_DONE:
            return 1;
        }
    }
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

int sock_mesh_connect(const struct sock_mesh *m, struct sock_listeners *ls, struct sock_link *links,
                      uint64_t *refused, struct plait_error *err)
{
    int n = m->size, rc = -1, remaining = n - 1;
    int cap = n + MAX_STRANGERS;
    struct pend *ps = calloc((size_t)cap, sizeof *ps);
    bool *connected = calloc((size_t)n, sizeof *connected);
    struct pollfd *pfds = calloc((size_t)cap + 2, sizeof *pfds);
    if (!ps || !connected || !pfds) {
        error_errno(err, "allocating the connection table");
        goto out;
    }
    for (int i = 0; i < cap; i++) ps[i].fd = ps[i].memfd = -1, ps[i].peer = -1;
    /* slots 0..rank-1: our connections to lower ranks; the rest: strangers */
    for (int r = 0; r < m->rank; r++) {
        ps[r].outgoing = true;
        ps[r].peer = r;
        ps[r].shm = m->use_shm[r];
        if (start_connect(m, &ps[r], err)) goto out;
    }
    while (remaining > 0) {
        int64_t now = sock_now_ms();
        if (now >= m->deadline_ms) {
            char who[600];
            missing_ranks(m, connected, who, sizeof who);
            error_peer_lost(err,
                            "no connection with rank(s) %s in time (they published addresses, then "
                            "did not connect or answer)",
                            who);
            goto out;
        }
        /* progress every handshake; retry failed outgoing ones */
        for (int i = 0; i < cap; i++) {
            struct pend *p = &ps[i];
            if (p->outgoing && p->fd < 0 && !connected[p->peer] && now >= p->retry_at_ms) {
                if (start_connect(m, p, err)) goto out;
            }
            if (p->fd < 0 || p->state == P_DONE) continue;
            int a = advance(m, p, connected, err);
            if (a == -2) goto out;
            if (a == -1) {
                if (!p->outgoing) ++*refused;
                pend_close(p);
                p->state = p->outgoing ? C_CONNECTING : A_HELLO_IN;
                if (!p->outgoing) p->peer = -1;
                if (p->outgoing) p->retry_at_ms = now + RETRY_MS;
                continue;
            }
            if (a == 1) {
                if (finish(p, links, connected, err)) goto out;
                remaining--;
            }
        }
        if (remaining == 0) break;
        /* sleep until a socket is ready, a retry is due, or the deadline */
        int np = 0;
        int64_t wake = m->deadline_ms;
        pfds[np++] = (struct pollfd){.fd = ls->tcp_fd, .events = POLLIN};
        pfds[np++] = (struct pollfd){.fd = ls->unix_fd, .events = POLLIN};
        for (int i = 0; i < cap; i++) {
            struct pend *p = &ps[i];
            if (p->outgoing && p->fd < 0 && !connected[p->peer] && p->retry_at_ms < wake)
                wake = p->retry_at_ms;
            if (p->fd < 0 || p->state == P_DONE) continue;
            bool out = p->state == C_CONNECTING || p->state == C_HELLO_OUT ||
                       p->state == C_PROOF_OUT || p->state == A_CHALLENGE_OUT ||
                       p->state == A_ACK_OUT;
            pfds[np++] = (struct pollfd){.fd = p->fd, .events = out ? POLLOUT : POLLIN};
        }
        int64_t wait_ms = wake - sock_now_ms();
        int k = poll(pfds, (nfds_t)np, wait_ms < 0 ? 0 : wait_ms > 1000 ? 1000 : (int)wait_ms);
        if (k < 0 && errno != EINTR) {
            error_errno(err, "poll");
            goto out;
        }
        /* accept strangers into free slots (the oldest stranger makes room) */
        for (int li = 0; li < 2; li++) {
            if (pfds[li].fd < 0 || !(pfds[li].revents & POLLIN)) continue;
            for (;;) {
                int fd = accept4(pfds[li].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) break;
                int slot = -1;
                for (int i = m->rank; i < cap && slot < 0; i++)
                    if (ps[i].fd < 0 && ps[i].state != P_DONE) slot = i;
                if (slot < 0) {
                    for (int i = m->rank; i < cap; i++)
                        if (ps[i].state != P_DONE && ps[i].peer < 0) {
                            ++*refused;
                            pend_close(&ps[i]);
                            slot = i;
                            break;
                        }
                }
                if (slot < 0) { /* cannot happen: more slots than ranks */
                    close(fd);
                    continue;
                }
                struct pend *p = &ps[slot];
                *p = (struct pend){.fd = fd, .memfd = -1, .peer = -1, .shm = li == 1};
                expect(p, A_HELLO_IN, HELLO_BYTES);
            }
        }
    }
    rc = 0;
out:
    if (ps)
        for (int i = 0; i < cap; i++) pend_close(&ps[i]);
    if (rc)
        for (int r = 0; r < n && connected; r++)
            if (connected[r]) sock_link_close(&links[r]);
    free(ps);
    free(connected);
    free(pfds);
    return rc;
}
