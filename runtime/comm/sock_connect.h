/* sock_connect.h — how the socket backend's ranks find and trust each other:
 * listeners, the endpoint each rank publishes through the store, and the
 * mesh of authenticated links (sock_connect.c). What a link carries later is
 * comm_socket.c's business.
 *
 * Where a rank listens: on TCP at the one address it publishes (never the
 * wildcard), and for the ranks on its node on an abstract Unix socket,
 * whose name anyone on the node can read in /proc/net/unix: a connection
 * there from a process of another user is closed before a byte is read.
 *
 * Handshake, on a TCP or Unix socket; the connector (the higher rank) speaks
 * first (the bytes: sock_handshake.h):
 *   hello     C -> A  56 bytes  "PLCM" | u32 version 1 | i32 from | i32 to |
 *                               u32 kind (0 TCP, 1 shared memory) | u32 0 | nonce_c[32]
 *   challenge A -> C  64 bytes  nonce_a[32] | HMAC(secret, "plait-comm-v1 acceptor" | t)
 *   proof     C -> A  32 bytes  HMAC(secret, "plait-comm-v1 connector" | t)
 *                               (+ the shared memory's memfd, SCM_RIGHTS, kind 1)
 *   ack       A -> C   8 bytes  "PLOK" | u32 0
 * where t = u32 len | the communicator's name | from | to | kind | nonce_c |
 * nonce_a (integers little-endian). Both sides prove the secret over fresh
 * nonces (getrandom), bound to this communicator and pair, so nothing
 * recorded can be replayed; the secret never crosses the wire.
 *
 * The acceptor trusts nothing before the proof: a hello's `from` only says
 * which MAC to expect, several connections may name the same rank, and a
 * connection becomes rank `from`'s link only once its proof holds (every
 * other one naming that rank is then closed). Until then it is a stranger:
 * at most MAX_STRANGERS (64) are held, each for HANDSHAKE_MS (3 s) at most,
 * and one that arrives when all are held takes the slot of the oldest that
 * has had STRANGER_GRACE_MS (0.5 s), or is closed. Strangers closed are
 * counted (comm_stats' connections_refused). The connector retries a
 * connection that failed, was closed or took longer than HANDSHAKE_MS, every
 * RETRY_MS (20 ms) until the mesh's deadline; it stops only if the acceptor
 * proves a different secret. Listeners close once the mesh is up. */
#ifndef PLAIT_SOCK_CONNECT_H
#define PLAIT_SOCK_CONNECT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/comm/sock_link.h"

#define SOCK_NODE_ID_BYTES 128

/* What a rank publishes under "comm/<name>/addr/<rank>", as one text line. */
struct sock_endpoint {
    int global_rank;
    long pid;
    char host[64]; /* the TCP listener's numeric address */
    int port;
    char unix_name[40]; /* abstract Unix socket name, "-" for none */
    char node_id[SOCK_NODE_ID_BYTES];
    char hostname[64];
};

int sock_endpoint_format(const struct sock_endpoint *e, char *out, size_t out_bytes);
int sock_endpoint_parse(const char *text, struct sock_endpoint *e);

struct sock_listeners {
    int tcp_fd, unix_fd;
    struct sock_endpoint self;
};

/* Listens on TCP at the local address that routes to route_host (where the
 * store is), or at one other hosts reach if that is a loopback address, and
 * only there; and, if want_unix, on a fresh abstract Unix socket. self gets
 * the endpoint, less its identity fields (global rank, pid, node, hostname). */
int sock_listen(struct sock_listeners *ls, const char *route_host, bool want_unix,
                struct plait_error *err);
void sock_listeners_close(struct sock_listeners *ls);

struct sock_mesh {
    const char *comm_name;
    const char *secret;
    int rank, size;
    const struct sock_endpoint *peers; /* [size] */
    const bool *use_shm;               /* [size]: shared memory (Unix socket) or TCP */
    int64_t deadline_ms;               /* CLOCK_MONOTONIC */
};

/* Connects to every lower rank and accepts every higher one, authenticating
 * each (above); links[r] (r != rank) get the links. Connections that do not
 * prove the secret in time, or another user's on the Unix socket, are
 * closed and counted in *refused; the mesh goes on. Fails by the deadline
 * naming the ranks missing, or at once if a peer proves a different secret. */
int sock_mesh_connect(const struct sock_mesh *m, struct sock_listeners *ls, struct sock_link *links,
                      uint64_t *refused, struct plait_error *err);

int64_t sock_now_ms(void);
int64_t sock_now_us(void);

#endif
