/* restart.c — the members of one Slurm step agree, through its store, on how
 * the step's start ended, and start again together while a rank was lost and
 * restarts are left. What one start runs is the caller's: one rank (plait
 * launch under the plugin, cmd_launch.c) or a node's ranks (srun without the
 * plugin, slurm_nodes.c). */
#include "launcher/restart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/place/env.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The store's keys under "launch/<attempt>/": "ended" counts the members whose
 * start ended, "ends" lists them ("<member> <class> <code>;"), "read" counts
 * those that read the list, "cleared" says member 0 cleared the abort for the
 * next start. Counters (store_add), which the server answers even when the
 * ranks aborted the store, read by polling. */
static int wait_count(struct store *st, const char *key, int64_t want, double deadline_s,
                      int64_t *got, struct plait_error *err)
{
    for (;;) {
        if (store_add(st, key, 0, got, err)) return -1;
        if (*got >= want) return 0;
        if (now_s() > deadline_s) return 1;
        usleep(50 * 1000);
    }
}

enum verdict { V_DONE, V_RESTART, V_FAILED, V_GONE };

/* Reports this member's end and learns every member's: V_RESTART when a rank
 * was lost and none failed by itself, V_FAILED when one did (*code: this
 * member's code, or 1 for another's failure), V_GONE when a member never
 * reported within the deadline (or the store is gone), else V_DONE. */
static enum verdict agree(const struct restart_member *m, int attempt, enum gang_end end,
                          int *code, double timeout_s, char *why, size_t why_bytes)
{
    struct plait_error err;
    char key[64], line[48];
    snprintf(line, sizeof line, "%d %d %d;", m->index, (int)end, *code);
    snprintf(key, sizeof key, "launch/%d/ends", attempt);
    int64_t ended = 0;
    if (store_append(m->st, key, line, strlen(line), NULL, &err)) goto gone;
    snprintf(key, sizeof key, "launch/%d/ended", attempt);
    if (store_add(m->st, key, 1, NULL, &err)) goto gone;
    int rc = wait_count(m->st, key, m->members, now_s() + timeout_s + 10, &ended, &err);
    if (rc < 0) goto gone;
    snprintf(key, sizeof key, "launch/%d/ends", attempt);
    void *text = NULL;
    size_t bytes;
    if (store_get(m->st, key, &text, &bytes, timeout_s, &err)) goto gone;
    snprintf(key, sizeof key, "launch/%d/read", attempt);
    if (store_add(m->st, key, 1, NULL, &err)) goto gone;
    bool lost = false, failed = false;
    int reported = 0;
    for (char *p = text; p && *p;) {
        int r, e, c, n = 0;
        if (sscanf(p, "%d %d %d;%n", &r, &e, &c, &n) != 3 || n == 0) break;
        reported++;
        lost |= e == GANG_END_LOST;
        if (e == GANG_END_ERROR || e == GANG_END_OUTSIDE) {
            if (!failed) snprintf(why, why_bytes, "%s %d ended with %d", m->noun, r, c);
            failed = true;
        }
        p += n;
    }
    free(text);
    if (rc == 1) {
        snprintf(why, why_bytes,
                 "%d of %d tasks did not report the end of their rank%s within %.0f s",
                 m->members - reported, m->members, strcmp(m->noun, "rank") ? "s" : "",
                 timeout_s + 10);
        return V_GONE;
    }
    if (failed) {
        if (end != GANG_END_ERROR && end != GANG_END_OUTSIDE) *code = PLAIT_EXIT_ERROR;
        return V_FAILED;
    }
    return lost ? V_RESTART : V_DONE;
gone:
    snprintf(why, why_bytes, "the step's store: %.900s", err.text);
    return V_GONE;
}

/* Member 0 clears the abort the lost start left in the store; the others wait
 * for it, so that no new rank sees it. 0, or -1 (said). */
static int clear_for_next(const struct restart_member *m, int attempt, double timeout_s)
{
    struct plait_error err;
    char key[64];
    snprintf(key, sizeof key, "launch/%d/cleared", attempt);
    int64_t got = 0;
    int rc = m->index == 0
                 ? (store_abort_clear(m->st, &err) || store_add(m->st, key, 1, NULL, &err))
                 : wait_count(m->st, key, 1, now_s() + timeout_s + 10, &got, &err);
    if (rc < 0 || (rc && m->index == 0)) {
        log_error("launch: %s %d: the step's store: %s", m->noun, m->index, err.text);
        return -1;
    }
    if (rc) {
        log_error("launch: %s %d: task 0 did not prepare the restart within %.0f s", m->noun,
                  m->index, timeout_s + 10);
        return -1;
    }
    return 0;
}

/* The store's host stays until every member has read the last verdict (a
 * member still reading it would take the store's end for a lost node). */
static void linger(const struct restart_member *m, int attempt, double timeout_s)
{
    struct plait_error err;
    char key[64];
    int64_t got = 0;
    snprintf(key, sizeof key, "launch/%d/read", attempt);
    if (wait_count(m->st, key, m->members, now_s() + timeout_s + 10, &got, &err) != 0)
        log_warn("launch: %s %d: %lld of %d tasks read how the step ended; closing its store",
                 m->noun, m->index, (long long)got, m->members);
}

int restart_supervise(const struct restart_member *m, const struct plan *plan,
                      restart_start_fn start, void *ctx, volatile sig_atomic_t *signals_seen)
{
    int max = plan->checkpoint.max_restarts;
    double timeout_s = plan->parallel.timeout_s;
    int code = PLAIT_EXIT_ERROR, k;
    enum verdict v = V_DONE;
    for (k = 0;; k++) {
        char how[160] = "", why[STORE_MAX_KEY_BYTES + 1024] = "";
        enum gang_end end = start(ctx, k, &code, how, sizeof how);
        v = m->st ? agree(m, k, end, &code, timeout_s, why, sizeof why)
            : end == GANG_END_LOST ? V_RESTART
                                   : V_DONE;
        if (end == GANG_END_LOST && code != PLAIT_EXIT_RESTART && *how) /* killed: it said nothing */
            log_error("launch: %s", how);
        if (v == V_GONE) {
            log_error("launch: %s %d: %s: exit %d (requeue the job to resume from the newest "
                      "complete checkpoint)",
                      m->noun, m->index, why, PLAIT_EXIT_RESTART);
            code = PLAIT_EXIT_RESTART;
            break;
        }
        if (v == V_FAILED && end != GANG_END_ERROR)
            log_error("launch: %s %d: not restarting: %s", m->noun, m->index, why);
        if (v != V_RESTART) break;
        if (*signals_seen || k >= max) {
            log_error("launch: %s %d: a rank of the step was lost%s; the step was restarted %d "
                      "time%s (checkpoint.max_restarts %d): exit %d",
                      m->noun, m->index, *signals_seen ? ", then a stop signal came" : "", k,
                      k == 1 ? "" : "s", max, PLAIT_EXIT_RESTART);
            code = PLAIT_EXIT_RESTART;
            break;
        }
        if (m->index == 0)
            log_warn("launch: a rank of the step was lost: restarting every rank from the newest "
                     "complete checkpoint (restart %d of %d, checkpoint.max_restarts)",
                     k + 1, max);
        if (m->st && clear_for_next(m, k, timeout_s)) {
            code = PLAIT_EXIT_RESTART;
            break;
        }
    }
    if (m->st && m->hosts_store && v != V_GONE) linger(m, k, timeout_s);
    return code;
}
