/* table.c — the tokenizer's hash tables (table.h): FNV-1a over byte strings, a
 * multiplicative hash over id pairs; both grow at 1/2 full. */
#include "tokenizer/table.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static struct bytes_slot *bytes_find(const struct bytes_map *m, const unsigned char *key,
                                     size_t bytes)
{
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)hash_bytes(key, bytes) & mask;; i = (i + 1) & mask) {
        struct bytes_slot *s = &m->slot[i];
        if (!s->key || (s->bytes == bytes && memcmp(s->key, key, bytes) == 0)) return s;
    }
}

static int bytes_grow(struct bytes_map *m)
{
    struct bytes_map bigger = {.cap = m->cap ? 2 * m->cap : 64};
    if (!(bigger.slot = calloc(bigger.cap, sizeof *bigger.slot))) return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i].key) *bytes_find(&bigger, m->slot[i].key, m->slot[i].bytes) = m->slot[i];
    bigger.n = m->n;
    free(m->slot);
    *m = bigger;
    return 0;
}

int bytes_map_put(struct bytes_map *m, const unsigned char *key, size_t bytes, int32_t value)
{
    if (bytes > UINT32_MAX) return -1;
    if (2 * (m->n + 1) > m->cap && bytes_grow(m)) return -1;
    struct bytes_slot *s = bytes_find(m, key, bytes);
    if (!s->key) m->n++;
    *s = (struct bytes_slot){.key = key, .bytes = (uint32_t)bytes, .value = value};
    return 0;
}

int32_t bytes_map_get(const struct bytes_map *m, const unsigned char *key, size_t bytes)
{
    if (!m->cap) return -1;
    const struct bytes_slot *s = bytes_find(m, key, bytes);
    return s->key ? s->value : -1;
}

void bytes_map_clear(struct bytes_map *m)
{
    if (m->cap) memset(m->slot, 0, m->cap * sizeof *m->slot);
    m->n = 0;
}

void bytes_map_free(struct bytes_map *m)
{
    free(m->slot);
    memset(m, 0, sizeof *m);
}

static size_t pair_slot(const struct pair_map *m, uint64_t k)
{
    uint64_t h = k * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 20) & (m->cap - 1);
    while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}

static int pair_grow(struct pair_map *m)
{
    struct pair_map bigger = {.cap = m->cap ? 2 * m->cap : 1024, .n = m->n};
    bigger.key = calloc(bigger.cap, sizeof *bigger.key);
    bigger.value = malloc(bigger.cap * sizeof *bigger.value);
    if (!bigger.key || !bigger.value) {
        pair_map_free(&bigger);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i]) {
            size_t j = pair_slot(&bigger, m->key[i]);
            bigger.key[j] = m->key[i];
            bigger.value[j] = m->value[i];
        }
    pair_map_free(m);
    *m = bigger;
    return 0;
}

int pair_map_put(struct pair_map *m, int32_t left, int32_t right, uint32_t rank, int32_t id)
{
    if (2 * (m->n + 1) > m->cap && pair_grow(m)) return -1;
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = pair_slot(m, k);
    if (!m->key[i]) m->n++;
    m->key[i] = k;
    m->value[i] = (uint64_t)rank << 32 | (uint32_t)id;
    return 0;
}

void pair_map_free(struct pair_map *m)
{
    free(m->key);
    free(m->value);
    memset(m, 0, sizeof *m);
}
