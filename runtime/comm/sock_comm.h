/* sock_comm.h — inside the socket backend of comm.h: a communicator, its
 * peers and requests as comm_socket.c (the backend's ops, making a
 * communicator) and sock_progress.c (its progress thread) both see them.
 * Not an interface for anyone else: the runtime sees only comm.h. */
#ifndef PLAIT_RUNTIME_COMM_SOCK_COMM_H
#define PLAIT_RUNTIME_COMM_SOCK_COMM_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "runtime/comm/comm_backend.h"
#include "runtime/comm/sock_algo.h"
#include "runtime/comm/sock_connect.h"
#include "runtime/comm/sock_job.h"
#include "runtime/comm/sock_link.h"

#define FRAME_BYTES 40      /* a fragment's header (sock_progress.c) */
#define STUCK_GRACE_MS 5000 /* a waiter gives up on a silent progress thread */

enum req_state { REQ_PENDING, REQ_DONE, REQ_FAILED };

struct sock_request {
    struct comm_request base;
    struct sock_comm *c;
    struct comm_desc d;
    enum req_state state; /* under c->mu; the waiter frees it once not PENDING */
    /* c->reqs' list (under c->mu): from post until comm_wait or comm_test
     * reaps it, whatever the progress thread's queues still hold of it */
    struct sock_request *reqs_prev, *reqs_next;
    /* the progress thread's */
    struct sock_request *next;
    uint64_t seq;
    size_t done_bytes;   /* point to point: bytes sent, or received */
    int64_t progress_ms; /* when a byte of it last moved (or it became active) */
    struct program prog; /* collectives, once started */
    bool started;
    size_t counts[]; /* d.counts' copy, when it has them */
};

/* A message that came before its receive was posted. */
struct unexpected {
    struct unexpected *next;
    uint32_t tag; /* step or tag */
    uint64_t seq;
    size_t total, got;
    uint8_t *data;
    int claim_xfer;                 /* a collective receive takes it when complete */
    struct sock_request *claim_req; /* a point-to-point receive does */
};

struct frame {
    uint8_t kind;
    uint32_t tag;
    uint64_t seq, total, offset;
    uint32_t bytes;
};

struct peer {
    int rank;
    struct sock_link link;
    struct sock_endpoint ep;
    bool gone;     /* closed and drained */
    bool rx_moved; /* the last round read something */
    char gone_why[160];
    /* sending: one fragment at a time */
    bool tx_active, tx_is_p2p, tx_p2p_turn;
    uint8_t tx_head[FRAME_BYTES];
    struct iovec tx_iov[3];
    int tx_iov_at;
    size_t tx_left, tx_frag;
    int tx_send; /* collective: the send index */
    struct sock_request *sendq, *sendq_tail;
    uint64_t p2p_tx_seq;
    int coll_send_next, coll_recv_next; /* program indices, current collective */
    /* receiving */
    uint8_t rx_hdr[FRAME_BYTES];
    size_t rx_hdr_got;
    bool rx_in_payload;
    struct frame rx_f;
    size_t rx_left, rx_pad_left;
    /* where the current fragment goes: one of these three */
    int rx_xfer;
    struct sock_request *rx_req;
    struct unexpected *rx_ux;
    /* messages in progress across fragments */
    int coll_in_xfer;
    struct unexpected *coll_in_ux;
    struct sock_request *p2p_in_req;
    struct unexpected *p2p_in_ux;
    struct sock_request *recvq, *recvq_tail; /* posted receives */
    struct unexpected *ux_coll, *ux_p2p;     /* in arrival order */
    uint64_t p2p_rx_seq;
};

struct sock_config {
    double timeout_s;
    int64_t spin_us;
    enum comm_transport transport;
    enum comm_algorithm algorithm;
    size_t small_bytes;
};

struct sock_comm {
    struct comm base;
    struct sock_job *job;
    struct sock_config cfg;
    int global_rank;
    int64_t timeout_ms;
    struct peer *peers; /* [size]; peers[rank] unused */
    int wake_fd;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t done_cond; /* CLOCK_MONOTONIC */
    /* under mu */
    struct sock_request *submit, *submit_tail;
    /* every request the caller holds: posted, not yet waited for or tested
     * done (pending, done or failed alike); sock_destroy frees them */
    struct sock_request *reqs;
    bool stop, failed, abort_pending, fail_peer_lost;
    char fail_text[sizeof(((struct plait_error *)0)->text)];
    char abort_text[700];
    double wait_s;
    uint64_t operations;
    /* read by anyone */
    _Atomic uint64_t bytes_sent, bytes_received, payload_sent;
    _Atomic int64_t beat_ms;
    _Atomic bool sleeping; /* the progress thread is (about to be) in poll */
    _Atomic int waiters;   /* callers blocked in sock_wait */
    /* the progress thread's */
    struct sock_request *collq, *collq_tail; /* head: the running collective once started */
    uint64_t next_seq;                       /* assigned to collectives as they arrive */
    uint64_t refused;                        /* handshakes refused at set-up */
    struct pollfd *pfds;                     /* [size + 1] */
    int *pfd_peer;                           /* [size + 1]: the peer of each, -1 wake_fd */
};

/* sock_progress.c: the communicator's progress thread (arg: the sock_comm) */
void *sock_progress_main(void *arg);
/* wakes the progress thread from its poll */
void sock_progress_wake(struct sock_comm *c);
/* appends q to a request list */
void sock_request_list_push(struct sock_request **head, struct sock_request **tail,
                            struct sock_request *q);
/* frees a list of buffered messages */
void sock_unexpected_free_list(struct unexpected *u);

#endif
