/* store_server_heap.c — the store server's deadlines: a binary min-heap of the
 * connections waiting on one (a parked GET/WAIT, a handshake not yet in), so
 * the loop sleeps until the nearest. Not what happens when one passes
 * (store_server_loop.c's expire). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/store/store_server_internal.h"

static void heap_place(struct store_server *srv, size_t i, struct conn *c)
{
    srv->heap[i] = c;
    c->heap_index = i;
}

static void heap_sift_up(struct store_server *srv, size_t i)
{
    struct conn *c = srv->heap[i];
    while (i > 0 && srv->heap[(i - 1) / 2]->deadline_ms > c->deadline_ms) {
        heap_place(srv, i, srv->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_place(srv, i, c);
}

static void heap_sift_down(struct store_server *srv, size_t i)
{
    struct conn *c = srv->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= srv->heap_len) break;
        if (child + 1 < srv->heap_len &&
            srv->heap[child + 1]->deadline_ms < srv->heap[child]->deadline_ms)
            child++;
        if (srv->heap[child]->deadline_ms >= c->deadline_ms) break;
        heap_place(srv, i, srv->heap[child]);
        i = child;
    }
    heap_place(srv, i, c);
}

bool srv_heap_push(struct store_server *srv, struct conn *c, int64_t deadline_ms)
{
    if (srv->heap_len == srv->heap_cap) {
        size_t cap = srv->heap_cap ? 2 * srv->heap_cap : 64;
        struct conn **heap = srv_alloc_counted(srv, cap * sizeof *heap);
        if (!heap) return false;
        if (srv->heap_len) memcpy(heap, srv->heap, srv->heap_len * sizeof *heap);
        srv_free_counted(srv, srv->heap, srv->heap_cap * sizeof *heap);
        srv->heap = heap;
        srv->heap_cap = cap;
    }
    c->deadline_ms = deadline_ms;
    heap_place(srv, srv->heap_len++, c);
    heap_sift_up(srv, c->heap_index);
    return true;
}

void srv_heap_remove(struct store_server *srv, struct conn *c)
{
    size_t i = c->heap_index;
    if (i == NO_HEAP) return;
    c->heap_index = NO_HEAP;
    struct conn *last = srv->heap[--srv->heap_len];
    if (last == c) return;
    heap_place(srv, i, last);
    heap_sift_up(srv, i);
    heap_sift_down(srv, last->heap_index);
}
