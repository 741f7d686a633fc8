/* table.h — the tokenizer's hash tables (open addressing, linear probing): byte strings to
 * ids, and pairs of ids to a merge. Keys are not copied: the caller keeps them alive.
 * Internal to tokenizer/. */
#ifndef PLAIT_TOKENIZER_TABLE_H
#define PLAIT_TOKENIZER_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct bytes_slot {
    const unsigned char *key; /* NULL: empty */
    uint32_t bytes;
    int32_t value;
};

struct bytes_map {
    struct bytes_slot *slot;
    size_t cap, n; /* cap: a power of two, or 0 */
};

/* Sets key's value (replacing one there); -1 when memory runs out. */
int bytes_map_put(struct bytes_map *m, const unsigned char *key, size_t bytes, int32_t value);
/* key's value, or -1 when absent. */
int32_t bytes_map_get(const struct bytes_map *m, const unsigned char *key, size_t bytes);
void bytes_map_clear(struct bytes_map *m); /* empty, keeping its memory */
void bytes_map_free(struct bytes_map *m);

/* (left id, right id) -> (rank, merged id) */
struct pair_map {
    uint64_t *key; /* (left << 32 | right) + 1; 0: empty */
    uint64_t *value;
    size_t cap, n;
};

int pair_map_put(struct pair_map *m, int32_t left, int32_t right, uint32_t rank, int32_t id);
/* 0 and *rank, *id when the pair merges; -1 when it does not. */
static inline int pair_map_get(const struct pair_map *m, int32_t left, int32_t right,
                               uint32_t *rank, int32_t *id)
{
    if (!m->cap) return -1;
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    uint64_t h = k * 0x9e3779b97f4a7c15ull;
    for (size_t i = (size_t)(h >> 20) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->key[i] == k) {
            *rank = (uint32_t)(m->value[i] >> 32);
            *id = (int32_t)(uint32_t)m->value[i];
            return 0;
        }
        if (!m->key[i]) return -1;
    }
}
void pair_map_free(struct pair_map *m);

#endif
