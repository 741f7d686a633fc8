/* store_server_table.c — the store server's keys: a hash table (FNV-1a seeded
 * per server) of entries, created for a write or for the waiters parked on a
 * missing key and forgotten when neither remains. Not what a request does
 * with an entry (store_server_requests.c). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/store/store_server_internal.h"

static uint64_t key_hash(const struct store_server *srv, const char *key, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull ^ srv->hash_seed; /* FNV-1a, seeded per server */
    for (size_t i = 0; i < bytes; i++) h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    return h;
}

static void table_grow(struct store_server *srv)
{
    size_t count = srv->bucket_count * 2;
    struct entry **buckets = srv_alloc_counted(srv, count * sizeof *buckets);
    if (!buckets) return; /* a longer chain is fine */
    for (size_t i = 0; i < srv->bucket_count; i++)
        for (struct entry *e = srv->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = buckets[e->hash & (count - 1)];
            buckets[e->hash & (count - 1)] = e;
        }
    srv_free_counted(srv, srv->buckets, srv->bucket_count * sizeof *buckets);
    srv->buckets = buckets;
    srv->bucket_count = count;
}

/* The entry for key; created (without a value) when create; NULL when absent
 * or when creating it would pass the memory limit. */
struct entry *srv_entry_lookup(struct store_server *srv, const char *key, size_t key_bytes,
                               bool create)
{
    uint64_t h = key_hash(srv, key, key_bytes);
    for (struct entry *e = srv->buckets[h & (srv->bucket_count - 1)]; e; e = e->next)
        if (e->hash == h && e->key_bytes == key_bytes && !memcmp(e->key, key, key_bytes)) return e;
    if (!create) return NULL;
    struct entry *e = srv_alloc_counted(srv, sizeof *e + key_bytes + 1);
    if (!e) return NULL;
    e->hash = h;
    e->key_bytes = key_bytes;
    memcpy(e->key, key, key_bytes);
    e->next = srv->buckets[h & (srv->bucket_count - 1)];
    srv->buckets[h & (srv->bucket_count - 1)] = e;
    if (++srv->entry_count > srv->bucket_count) table_grow(srv);
    return e;
}

/* Drops an entry nobody needs any more (no value, no waiters). */
void srv_entry_forget_if_unused(struct store_server *srv, struct entry *e)
{
    if (e->value || e->waiters) return;
    struct entry **p = &srv->buckets[e->hash & (srv->bucket_count - 1)];
    while (*p != e) p = &(*p)->next;
    *p = e->next;
    srv->entry_count--;
    srv_free_counted(srv, e, sizeof *e + e->key_bytes + 1);
}

struct blob *srv_abort_reason(struct store_server *srv)
{
    struct entry *e = srv_entry_lookup(srv, STORE_ABORT_KEY, strlen(STORE_ABORT_KEY), false);
    return e && e->value && e->value->bytes ? e->value : NULL; /* empty: cleared */
}
