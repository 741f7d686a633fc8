/* test_sock_connect.c — the socket backend's mesh set-up (runtime/comm/
 * sock_connect.c) under attack, in one process: each rank is a thread in
 * sock_mesh_connect with real listeners, and fake peers (threads here, or a
 * child of another user) flood them with connections that claim a rank
 * without proving the job's secret, send nothing, or send garbage, while the
 * real rank starts seconds late. Also: the TCP listener answers only at the
 * address it publishes. The collectives over the links are test_comm.c's. */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "runtime/comm/sock_connect.h"
#include "runtime/comm/sock_handshake.h"

#define SECRET "sock-connect-test-secret-0123456789"
#define MAX_RANKS 3
#define MAX_FAKES 128
#define MESH_TIMEOUT_S 30 /* generous: a mesh that forms at all forms in well under a second */

static double now_s(void)
{
    return (double)sock_now_us() / 1e6;
}

static void sleep_ms(int ms)
{
    poll(NULL, 0, ms);
}

/* ---- ranks as threads ---------------------------------------------------- */

struct rank {
    struct sock_mesh m;
    struct sock_listeners ls;
    struct sock_link links[MAX_RANKS];
    uint64_t refused;
    struct plait_error err;
    int rc;
    bool started;
    pthread_t thread;
};

struct world {
    int n;
    bool shm; /* the ranks meet on Unix sockets (one node), else TCP */
    struct sock_endpoint eps[MAX_RANKS];
    bool use_shm[MAX_RANKS][MAX_RANKS];
    struct rank r[MAX_RANKS];
};

/* Every rank listens and "publishes" (into w->eps); none connects yet. */
static bool world_listen(struct world *w, int n, bool shm, const char *name)
{
    memset(w, 0, sizeof *w);
    w->n = n;
    w->shm = shm;
    int64_t deadline = sock_now_ms() + MESH_TIMEOUT_S * 1000;
    for (int i = 0; i < n; i++) {
        struct rank *r = &w->r[i];
        if (sock_listen(&r->ls, "127.0.0.1", shm, &r->err)) {
            CHECK(0, "rank %d listens: %s", i, r->err.text);
            for (int j = 0; j < i; j++) sock_listeners_close(&w->r[j].ls);
            return false;
        }
        w->eps[i] = r->ls.self;
        w->eps[i].global_rank = i;
        w->eps[i].pid = (long)getpid();
        snprintf(w->eps[i].node_id, sizeof w->eps[i].node_id, "this-node");
        snprintf(w->eps[i].hostname, sizeof w->eps[i].hostname, "rank%d", i);
        for (int j = 0; j < n; j++) w->use_shm[i][j] = shm && i != j;
        r->m = (struct sock_mesh){.comm_name = name,
                                  .secret = SECRET,
                                  .rank = i,
                                  .size = n,
                                  .peers = w->eps,
                                  .use_shm = w->use_shm[i],
                                  .deadline_ms = deadline};
    }
    return true;
}

static void *rank_main(void *arg)
{
    struct rank *r = arg;
    r->rc = sock_mesh_connect(&r->m, &r->ls, r->links, &r->refused, &r->err);
    return NULL;
}

static void rank_start(struct world *w, int i)
{
    w->r[i].started = pthread_create(&w->r[i].thread, NULL, rank_main, &w->r[i]) == 0;
    CHECK(w->r[i].started, "starting rank %d", i);
}

/* Joins every started rank: true when each one's mesh formed. Closes the
 * links and the listeners. */
static bool world_join(struct world *w)
{
    bool ok = true;
    for (int i = 0; i < w->n; i++) {
        struct rank *r = &w->r[i];
        if (r->started) pthread_join(r->thread, NULL);
        CHECK(r->started && r->rc == 0, "rank %d: %s", i, r->rc ? r->err.text : "not started");
        ok = ok && r->started && r->rc == 0;
        for (int j = 0; j < w->n; j++)
            if (r->started && r->rc == 0 && j != i) sock_link_close(&r->links[j]);
        sock_listeners_close(&r->ls);
    }
    return ok;
}

/* ---- fake peers ---------------------------------------------------------- */

/* Connects (non-blocking, a second at most) to where e listens: its Unix
 * socket, or its published TCP address. -1 if that failed. */
static int knock(const struct sock_endpoint *e, bool unix_socket)
{
    struct sockaddr_storage sa = {0};
    socklen_t len;
    if (unix_socket) {
        struct sockaddr_un *un = (struct sockaddr_un *)&sa;
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path + 1, e->unix_name, strlen(e->unix_name));
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(e->unix_name));
    } else {
        char port[16];
        snprintf(port, sizeof port, "%d", e->port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                        *ai = NULL;
        if (getaddrinfo(e->host, port, &hints, &ai) != 0) return -1;
        memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
        len = ai->ai_addrlen;
        freeaddrinfo(ai);
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&sa, len) != 0) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int so_error = 0;
        socklen_t so_len = sizeof so_error;
        if (errno != EINPROGRESS || poll(&pf, 1, 1000) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &so_len) != 0 || so_error) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

enum fake_kind {
    FAKE_HELLO_THEN_STALL, /* a well-formed hello naming a rank; then silence */
    FAKE_SILENT,           /* connects and says nothing */
    FAKE_GARBAGE,          /* 56 random bytes */
    FAKE_WRONG_PROOF,      /* a hello, then a proof without the secret */
};

/* A flood: `count` connections of one kind to one listener, each knocking
 * again `again_s` after the target closed it (never, if negative), until
 * stopped. One thread polls them all. */
struct flood {
    const struct sock_endpoint *target;
    bool unix_socket;
    enum fake_kind kind;
    int claim; /* the rank the hellos name */
    int to;    /* the target's rank */
    int count;
    double again_s;
    /* the thread's */
    int fd[MAX_FAKES];
    double closed_at[MAX_FAKES];
    bool answered[MAX_FAKES];
    int knocks, closed, challenges;
    atomic_bool stop;
    pthread_t thread;
};

/* Opens fake i and says what its kind says first. */
static void fake_open(struct flood *f, int i)
{
    f->answered[i] = false;
    f->fd[i] = knock(f->target, f->unix_socket);
    if (f->fd[i] < 0) return;
    f->knocks++;
    uint8_t hello[SOCK_HELLO_BYTES];
    struct sock_transcript t = {
        .from = f->claim, .to = f->to, .kind = f->unix_socket ? SOCK_KIND_SHM : SOCK_KIND_TCP};
    if (getrandom(t.nonce_c, sizeof t.nonce_c, 0) != (ssize_t)sizeof t.nonce_c) return;
    sock_hello_write(&t, hello);
    if (f->kind == FAKE_GARBAGE && getrandom(hello, sizeof hello, 0) != (ssize_t)sizeof hello)
        return;
    if (f->kind != FAKE_SILENT &&
        send(f->fd[i], hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) {
        close(f->fd[i]);
        f->fd[i] = -1;
        f->closed_at[i] = now_s();
    }
}

/* Fake i has something to read: a challenge (a wrong proof answers it), or
 * the target's hang-up. */
static void fake_read(struct flood *f, int i)
{
    uint8_t buf[SOCK_CHALLENGE_BYTES];
    ssize_t k = read(f->fd[i], buf, sizeof buf);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (k > 0) {
        if (!f->answered[i]) f->challenges++;
        if (f->kind == FAKE_WRONG_PROOF && !f->answered[i]) {
            uint8_t proof[SOCK_PROOF_BYTES] = {0};
            ssize_t sent = send(f->fd[i], proof, sizeof proof, MSG_NOSIGNAL);
            (void)sent; /* a hang-up shows in the next read */
        }
        f->answered[i] = true;
        return;
    }
    close(f->fd[i]);
    f->fd[i] = -1;
    f->closed++;
    f->closed_at[i] = now_s();
}

static void *flood_main(void *arg)
{
    struct flood *f = arg;
    for (int i = 0; i < f->count; i++) fake_open(f, i);
    while (!atomic_load(&f->stop)) {
        struct pollfd pf[MAX_FAKES];
        for (int i = 0; i < f->count; i++) {
            if (f->fd[i] < 0 && f->again_s >= 0 && now_s() - f->closed_at[i] >= f->again_s)
                fake_open(f, i);
            pf[i] = (struct pollfd){.fd = f->fd[i], .events = POLLIN};
        }
        if (poll(pf, (nfds_t)f->count, 10) <= 0) continue;
        for (int i = 0; i < f->count; i++)
            if (f->fd[i] >= 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR))) fake_read(f, i);
    }
    return NULL;
}

static void flood_start(struct flood *f)
{
    for (int i = 0; i < MAX_FAKES; i++) f->fd[i] = -1;
    atomic_store(&f->stop, false);
    if (pthread_create(&f->thread, NULL, flood_main, f) != 0) {
        CHECK(0, "starting a flood");
        f->count = -1;
    }
}

static void flood_stop(struct flood *f)
{
    if (f->count < 0) return;
    atomic_store(&f->stop, true);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->count; i++)
        if (f->fd[i] >= 0) close(f->fd[i]);
}

/* ---- cases ---------------------------------------------------------------- */

/* Ranks 0 and 1 wait in the mesh for rank 2, which starts seconds late (a
 * multi-node gang's start skew); meanwhile every listener of theirs is
 * flooded: hellos naming rank 2 (and rank 1) that never prove anything —
 * more than the strangers' slots — silent connections, garbage and wrong
 * proofs; a hello that is dropped comes again at once, while rank 2 joins. */
static void late_rank_through_a_flood(bool shm)
{
    struct world w;
    if (!world_listen(&w, 3, shm, shm ? "flood-shm" : "flood-tcp")) return;
    rank_start(&w, 0);
    rank_start(&w, 1);
    struct flood fl[12];
    int nf = 0;
    for (int to = 0; to < 2; to++) {
        const struct sock_endpoint *e = &w.eps[to];
        fl[nf++] = (struct flood){e, shm, FAKE_HELLO_THEN_STALL, 2, to, 80, .again_s = 0.05};
        fl[nf++] = (struct flood){e, shm, FAKE_SILENT, 2, to, 30, .again_s = -1};
        fl[nf++] = (struct flood){e, shm, FAKE_GARBAGE, 2, to, 20, .again_s = -1};
        fl[nf++] = (struct flood){e, shm, FAKE_WRONG_PROOF, 2, to, 10, .again_s = -1};
        if (shm) /* the TCP listener is open too */
            fl[nf++] = (struct flood){e, false, FAKE_SILENT, 2, to, 30, .again_s = -1};
        if (to == 0)
            fl[nf++] = (struct flood){e, shm, FAKE_HELLO_THEN_STALL, 1, 0, 10, .again_s = 0.05};
    }
    for (int i = 0; i < nf; i++) flood_start(&fl[i]);
    sleep_ms(2000); /* rank 2 is late */
    double t0 = now_s();
    rank_start(&w, 2);
    bool ok = world_join(&w);
    double joined_s = now_s() - t0;
    int knocks = 0;
    for (int i = 0; i < nf; i++) {
        flood_stop(&fl[i]);
        knocks += fl[i].knocks;
    }
    CHECK(ok, "the mesh formed within its deadline (%d s) through the flood", MESH_TIMEOUT_S);
    CHECK(w.r[0].refused > 0 && w.r[1].refused > 0, "strangers refused: %llu by rank 0, %llu by 1",
          (unsigned long long)w.r[0].refused, (unsigned long long)w.r[1].refused);
    printf("  %s: rank 2 joined %.2f s after it started, through %d fake connections "
           "(%llu and %llu turned away)\n",
           shm ? "shm" : "tcp", joined_s, knocks, (unsigned long long)w.r[0].refused,
           (unsigned long long)w.r[1].refused);
}

static void test_late_rank_joins_through_a_flood_of_fake_hellos(void)
{
    late_rank_through_a_flood(true);
    late_rank_through_a_flood(false);
}

/* A stranger sends a good hello naming rank 1, takes the challenge and
 * stalls: rank 0 closes it at its handshake deadline, long before the
 * mesh's, and rank 1, later, gets in. */
static void test_stranger_that_stalls_after_its_hello_is_closed_and_the_rank_gets_in(void)
{
    for (int shm = 1; shm >= 0; shm--) {
        struct world w;
        if (!world_listen(&w, 2, shm, "stall")) return;
        rank_start(&w, 0);
        struct flood f = {&w.eps[0], shm, FAKE_HELLO_THEN_STALL, 1, 0, 1, .again_s = -1};
        flood_start(&f);
        double t0 = now_s();
        while (f.closed == 0 && now_s() - t0 < MESH_TIMEOUT_S / 2) sleep_ms(10);
        CHECK(f.challenges == 1 && f.closed == 1,
              "%s: the stalled stranger got %d challenge(s), and was %sclosed after %.1f s",
              shm ? "shm" : "tcp", f.challenges, f.closed ? "" : "not ", now_s() - t0);
        rank_start(&w, 1);
        CHECK(world_join(&w), "rank 1 got in after the stranger");
        flood_stop(&f);
        CHECK(w.r[0].refused == 1, "rank 0 refused %llu", (unsigned long long)w.r[0].refused);
    }
}

/* More stalled strangers than rank 0 has slots, each knocking again soon
 * after it is dropped: only eviction (oldest first, after a grace) lets
 * rank 1 in before the mesh's deadline. */
static void test_rank_evicts_stalled_strangers_when_every_slot_is_taken(void)
{
    for (int shm = 1; shm >= 0; shm--) {
        struct world w;
        if (!world_listen(&w, 2, shm, "full")) return;
        rank_start(&w, 0);
        struct flood f = {&w.eps[0], shm, FAKE_HELLO_THEN_STALL, 1, 0, 100, .again_s = 0.1};
        flood_start(&f);
        sleep_ms(1000);
        rank_start(&w, 1);
        CHECK(world_join(&w), "%s: rank 1 got in while strangers held every slot",
              shm ? "shm" : "tcp");
        flood_stop(&f);
        CHECK(w.r[0].refused > 0, "rank 0 turned away %llu of %d knocks",
              (unsigned long long)w.r[0].refused, f.knocks);
    }
}

/* A process of another user is turned away from the Unix socket before it
 * is read, even if it knows the secret and names a real rank. */
static void test_unix_socket_refuses_another_user_before_reading(void)
{
    if (geteuid() != 0) SKIP("needs root to run a connection as another user");
    struct world w;
    if (!world_listen(&w, 2, true, "peercred")) return;
    int pipefd[2];
    if (pipe(pipefd) != 0) {
        CHECK(0, "pipe");
        return;
    }
    fflush(stdout);
    pid_t pid = fork(); /* before any thread: the child only connects and reads */
    if (pid == 0) {
        close(pipefd[1]);
        char go;
        if (setgid(65534) != 0 || setuid(65534) != 0 || read(pipefd[0], &go, 1) != 1) _exit(3);
        int fd = knock(&w.eps[0], true);
        if (fd < 0) _exit(4);
        int fl = fcntl(fd, F_GETFL);
        if (fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) _exit(5);
        struct sock_transcript t = {
            .comm_name = "peercred", .secret = SECRET, .from = 1, .to = 0, .kind = SOCK_KIND_SHM};
        uint8_t hello[SOCK_HELLO_BYTES], buf[SOCK_CHALLENGE_BYTES];
        sock_hello_write(&t, hello);
        if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello)
            _exit(0);                                 /* refused */
        _exit(read(fd, buf, sizeof buf) > 0 ? 1 : 0); /* 1: it was answered */
    }
    close(pipefd[0]);
    rank_start(&w, 0);
    if (write(pipefd[1], "g", 1) != 1) CHECK(0, "starting the other user's process");
    close(pipefd[1]);
    int status = -1;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the other user's connection was %s (status %d)",
          WIFEXITED(status) && WEXITSTATUS(status) == 1 ? "answered" : "not made", status);
    rank_start(&w, 1);
    CHECK(world_join(&w), "the mesh formed");
    CHECK(w.r[0].refused == 1, "rank 0 refused %llu", (unsigned long long)w.r[0].refused);
}

/* A local address of the family other than `published` (up), into out. */
static bool other_local_address(int family, const char *published, char *out, size_t n)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = list; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
        socklen_t len =
            family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
            continue; /* would need a scope */
        if (getnameinfo(i->ifa_addr, len, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0 &&
            strcmp(out, published) != 0)
            found = true;
    }
    freeifaddrs(list);
    return found;
}

/* The TCP listener answers at the address it publishes and nowhere else. */
static void listener_only_at_published(const char *store_host, int family, int *checked)
{
    struct sock_listeners ls;
    struct plait_error err;
    if (sock_listen(&ls, store_host, false, &err)) return; /* no route of that family here */
    struct sock_endpoint e = ls.self;
    int fd = knock(&e, false);
    CHECK(fd >= 0, "connecting to the published %s port %d", e.host, e.port);
    if (fd >= 0) close(fd);
    char other[INET6_ADDRSTRLEN];
    if (other_local_address(family, ls.self.host, other, sizeof other)) {
        snprintf(e.host, sizeof e.host, "%s", other);
        fd = knock(&e, false);
        CHECK(fd < 0, "the listener published at %s answers at %s too", ls.self.host, other);
        if (fd >= 0) close(fd);
        printf("  published %s: %s port %d refused\n", ls.self.host, other, e.port);
        ++*checked;
    }
    sock_listeners_close(&ls);
}

static void test_tcp_listener_answers_only_at_the_address_it_publishes(void)
{
    int checked = 0;
    listener_only_at_published("127.0.0.1", AF_INET, &checked);
    listener_only_at_published("::1", AF_INET6, &checked);
    if (!checked) SKIP("this machine has no second local address");
}

int main(void)
{
    RUN(test_late_rank_joins_through_a_flood_of_fake_hellos);
    RUN(test_stranger_that_stalls_after_its_hello_is_closed_and_the_rank_gets_in);
    RUN(test_rank_evicts_stalled_strangers_when_every_slot_is_taken);
    RUN(test_unix_socket_refuses_another_user_before_reading);
    RUN(test_tcp_listener_answers_only_at_the_address_it_publishes);
    return check_exit_code();
}
