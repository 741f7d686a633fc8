/* store_server_auth.c — the store server's handshake: a connection's proof of
 * the job's secret checked, and those turned away said on the console a few
 * a window, the rest counted, so strangers cannot flood it. Not the hello
 * with its nonce (store_server_conn.c) nor the MAC itself (store_wire.h). */
#include <stdbool.h>
#include <stdio.h>

#include "common/log.h"
#include "common/sha256.h"
#include "common/store/store_server_internal.h"

/* Connections turned away before they proved the secret (a wrong handshake,
 * none in time, no memory left for them): each said on the launcher's
 * console, up to TURNED_AWAY_SAID a window of TURNED_AWAY_WINDOW_MS, the rest
 * counted and summarised in one line when the next window opens, or when the
 * server stops, so a flood of strangers cannot flood the console. */
#define TURNED_AWAY_SAID 5
#define TURNED_AWAY_WINDOW_MS 10000

/* The summary of a window's unsaid refusals, and a new window */
void srv_turned_away_summary(struct turned_away *t)
{
    if (t->unsaid)
        log_warn("store: %llu more connection%s turned away without the job's secret in %d s "
                 "(the last from %s)",
                 (unsigned long long)t->unsaid, t->unsaid == 1 ? "" : "s",
                 TURNED_AWAY_WINDOW_MS / 1000, t->last_peer);
    t->said = 0;
    t->unsaid = 0;
}

/* Whether a connection turned away from peer is said now (else counted) */
bool srv_turned_away_say(struct store_server *srv, const char *peer)
{
    struct turned_away *t = &srv->turned_away;
    int64_t now = now_ms();
    if (now - t->window_ms >= TURNED_AWAY_WINDOW_MS) {
        srv_turned_away_summary(t);
        t->window_ms = now;
    }
    snprintf(t->last_peer, sizeof t->last_peer, "%s", peer);
    if (t->said < TURNED_AWAY_SAID) {
        t->said++;
        if (t->said == TURNED_AWAY_SAID)
            log_warn("store: %d connections turned away in %d s: the next in this %d s are "
                     "counted, not each said",
                     TURNED_AWAY_SAID, TURNED_AWAY_WINDOW_MS / 1000, TURNED_AWAY_WINDOW_MS / 1000);
        return true;
    }
    t->unsaid++;
    return false;
}

void srv_auth_check(struct store_server *srv, struct conn *c)
{
    uint8_t want[SHA256_DIGEST_BYTES];
    c->rank = (int32_t)store_wire_get_u32(c->head);
    store_wire_auth_mac(srv->secret, c->nonce, c->rank, want);
    srv_heap_remove(srv, c);
    if (!sha256_equal_ct(want, c->head + 4, sizeof want)) {
        srv->refused++;
        if (srv_turned_away_say(srv, c->peer))
            log_warn("store: refused a connection from %s (claiming rank %d): its handshake does "
                     "not prove the job's secret",
                     c->peer, (int)c->rank);
        c->closing = true;
        srv_reply(srv, c, STORE_STATUS_REFUSED, 0, "the handshake does not prove the job's secret",
                  NULL);
        return;
    }
    c->head_got = 0;
    c->phase = PHASE_HEAD;
    srv_reply(srv, c, STORE_STATUS_OK, 0, NULL, NULL);
}
