/* lanes.c — lanes.h's baton: one mutex and one condition variable over whose turn it is,
 * which lanes are done, and a generation that wakes the second lane's thread for a pair.
 * What the lanes run, and where they switch, is the callers'. */
#include "runtime/lanes.h"

#include <pthread.h>
#include <stdlib.h>

struct lanes {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    void (*enter)(void *ctx, int lane);
    void *enter_ctx;
    /* under mu */
    int turn;       /* the lane that may compute */
    bool done[2];   /* this pair's passes that have returned */
    bool running;   /* a pair is in lanes_run */
    long gen, quit; /* lanes_run's pairs so far; lanes_close's */
    lane_pass pass; /* lane 1's pass of the pair, its context, result and error */
    void *ctx;
    int rc;
    struct plait_error err;
    long switches;
};

/* With mu held: lane `me` waits for the baton (the other lane switched or is done), then
 * installs its set. */
static void take_baton(struct lanes *L, int me)
{
    while (L->turn != me && !L->done[1 - me]) pthread_cond_wait(&L->cv, &L->mu);
    L->turn = me;
    L->enter(L->enter_ctx, me);
}

/* With mu held: lane `me` has returned; the baton to the other. */
static void finish(struct lanes *L, int me)
{
    L->done[me] = true;
    L->turn = 1 - me;
    pthread_cond_broadcast(&L->cv);
}

static void *second_lane(void *arg)
{
    struct lanes *L = arg;
    long seen = 0;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (L->gen == seen && !L->quit) pthread_cond_wait(&L->cv, &L->mu);
        if (L->quit) break;
        seen = L->gen;
        take_baton(L, 1);
        pthread_mutex_unlock(&L->mu);
        int rc = L->pass(L->ctx, &L->err);
        pthread_mutex_lock(&L->mu);
        L->rc = rc;
        finish(L, 1);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

struct lanes *lanes_open(void (*enter)(void *ctx, int lane), void *enter_ctx,
                         struct plait_error *err)
{
    struct lanes *L = calloc(1, sizeof *L);
    if (!L) {
        error_set(err, "out of memory for the lanes");
        return NULL;
    }
    L->enter = enter;
    L->enter_ctx = enter_ctx;
    int rc = pthread_mutex_init(&L->mu, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&L->cv, NULL)) != 0) pthread_mutex_destroy(&L->mu);
    if (rc == 0 && (rc = pthread_create(&L->thread, NULL, second_lane, L)) != 0) {
        pthread_cond_destroy(&L->cv);
        pthread_mutex_destroy(&L->mu);
    }
    if (rc != 0) {
        free(L);
        error_set(err, "the second lane's thread: error %d", rc);
        return NULL;
    }
    return L;
}

void lanes_close(struct lanes *L)
{
    if (!L) return;
    pthread_mutex_lock(&L->mu);
    L->quit = 1;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    pthread_join(L->thread, NULL);
    pthread_cond_destroy(&L->cv);
    pthread_mutex_destroy(&L->mu);
    free(L);
}

int lanes_run(struct lanes *L, const lane_pass pass[2], void *const ctx[2], struct plait_error *err)
{
    pthread_mutex_lock(&L->mu);
    L->turn = 0;
    L->done[0] = L->done[1] = false;
    L->pass = pass[1];
    L->ctx = ctx[1];
    L->rc = 0;
    L->running = true;
    L->gen++;
    pthread_cond_broadcast(&L->cv);
    take_baton(L, 0);
    pthread_mutex_unlock(&L->mu);
    int rc = pass[0](ctx[0], err);
    pthread_mutex_lock(&L->mu);
    finish(L, 0);
    while (!L->done[1]) pthread_cond_wait(&L->cv, &L->mu);
    L->running = false;
    L->turn = 0;
    L->enter(L->enter_ctx, 0);
    if (rc == 0 && L->rc != 0) {
        *err = L->err;
        rc = -1;
    }
    pthread_mutex_unlock(&L->mu);
    return rc;
}

bool lanes_running(const struct lanes *L)
{
    /* read by a lane (which runs only inside lanes_run) or by the thread that calls
     * lanes_run: no other thread writes it meanwhile */
    return L && L->running;
}

int lanes_switch(struct lanes *L, const struct group *g, void *req, struct plait_error *err)
{
    pthread_mutex_lock(&L->mu);
    int me = L->turn;
    if (!L->done[1 - me]) {
        L->turn = 1 - me;
        L->switches++;
        pthread_cond_broadcast(&L->cv);
        take_baton(L, me);
    }
    pthread_mutex_unlock(&L->mu);
    return g->wait(req, err);
}

long lanes_switches(const struct lanes *L)
{
    return L ? L->switches : 0;
}
