/* store_server_memory.c — the store server's memory: every byte it holds is
 * counted against STORE_SERVER_MAX_BYTES here, and the values travel as
 * reference-counted blobs shared by the table and the replies being sent.
 * Not what the bytes are for: the table, the connections and the requests
 * are their own files (store_server_internal.h). */
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "common/store/store_server_internal.h"

static bool reserve(struct store_server *srv, size_t bytes)
{
    if (bytes > STORE_SERVER_MAX_BYTES - srv->bytes_held) return false;
    srv->bytes_held += bytes;
    return true;
}

void *srv_alloc_counted(struct store_server *srv, size_t bytes)
{
    if (!reserve(srv, bytes)) return NULL;
    void *p = calloc(1, bytes);
    if (!p) srv->bytes_held -= bytes;
    return p;
}

void srv_free_counted(struct store_server *srv, void *p, size_t bytes)
{
    if (!p) return;
    srv->bytes_held -= bytes;
    free(p);
}

struct blob *srv_blob_new(struct store_server *srv, size_t cap_bytes)
{
    struct blob *b = srv_alloc_counted(srv, sizeof *b + cap_bytes);
    if (b) b->refs = 1, b->cap_bytes = cap_bytes;
    return b;
}

void srv_blob_release(struct store_server *srv, struct blob *b)
{
    if (b && --b->refs == 0) srv_free_counted(srv, b, sizeof *b + b->cap_bytes);
}

/* Grows an unshared blob to cap_bytes; NULL (b unchanged) over the limit. */
struct blob *srv_blob_grow(struct store_server *srv, struct blob *b, size_t cap_bytes)
{
    size_t more = cap_bytes - b->cap_bytes;
    if (!reserve(srv, more)) return NULL;
    struct blob *g = realloc(b, sizeof *b + cap_bytes);
    if (!g) {
        srv->bytes_held -= more;
        return NULL;
    }
    g->cap_bytes = cap_bytes;
    return g;
}

/* The next capacity on the way to want_bytes: double, at least FIRST_BUFFER_BYTES. */
size_t srv_next_cap(size_t cap_bytes, size_t want_bytes)
{
    size_t next = cap_bytes < FIRST_BUFFER_BYTES / 2 ? FIRST_BUFFER_BYTES : 2 * cap_bytes;
    return next < want_bytes ? next : want_bytes;
}
