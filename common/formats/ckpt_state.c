/* ckpt_state.c — state.json of a checkpoint: a new run's state, reading and
 * writing it. The model's files are ckpt_shards.h's and the runtime's. */
#include "common/formats/ckpt_state.h"

#include <limits.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/json_read.h"
#include "common/rng.h"
#include "common/formats/rundir.h"

void ckpt_state_fresh(struct train_state *st, const struct plan *plan)
{
    memset(st, 0, sizeof *st);
    struct rng r;
    rng_seed(&r, plan->sample.seed, 0);
    memcpy(st->sample_rng, r.s, sizeof st->sample_rng);
}

static json_t *state_json(const struct train_state *st)
{
    json_t *rng = json_array();
    for (int i = 0; i < 4; i++) {
        char hex[24];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st->sample_rng[i]);
        json_array_append_new(rng, json_string(hex));
    }
    return json_pack("{s:i,s:i,s:f,s:I,s:b,s:{s:I,s:I,s:I},s:o}", "step", st->step, "micro",
                     st->micro, "loss_sum", st->loss_sum, "tokens", (json_int_t)st->tokens,
                     "eval_pending", st->eval_pending, "data", "epoch", (json_int_t)st->data.epoch,
                     "shard", (json_int_t)st->data.shard, "index", (json_int_t)st->data.index,
                     "sample_rng", rng);
}

int ckpt_state_write(const char *tmp, const struct train_state *st, struct ckpt_file *f,
                     struct ckpt_manifest *m, struct plait_error *err)
{
    json_t *j = state_json(st), *moe = st->moe_stats_n ? json_array() : NULL;
    for (int i = 0; moe && i < st->moe_stats_n; i++)
        json_array_append_new(moe, json_real(st->moe_stats[i]));
    if (j && moe) json_object_set_new(j, "moe_stats", moe);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    if (!text) return error_set(err, "out of memory");
    int rc = ckpt_file_write(f, tmp, CKPT_STATE, text, strlen(text), m, err);
    free(text);
    return rc;
}

/* A member that must not be negative. */
static int64_t count_at(struct json_read *r, json_t *o, const char *at, const char *key)
{
    int64_t v = json_read_int(r, o, at, key);
    if (v < 0) json_read_fail(r, at, key, "negative (%lld)", (long long)v);
    return v;
}

/* The sampler's generator: four 64-bit words in hex. */
static void read_rng(struct json_read *r, json_t *j, uint64_t out[4])
{
    json_t *rng = json_read_array(r, j, NULL, "sample_rng");
    if (!r->failed && json_array_size(rng) != 4)
        json_read_fail(r, NULL, "sample_rng", "%zu words, not 4", json_array_size(rng));
    for (int i = 0; i < 4 && !r->failed; i++) {
        const char *hex = json_string_value(json_array_get(rng, (size_t)i));
        char *end = NULL;
        out[i] = hex ? strtoull(hex, &end, 16) : 0;
        char key[24];
        snprintf(key, sizeof key, "sample_rng[%d]", i);
        if (!hex || !*hex || *end) json_read_fail(r, NULL, key, "not a 64-bit word in hex");
    }
}

/* A mixture of experts' routing statistics (MOE_STATS: at most PLAN_MOE_EXPERTS_MAX
 * experts' numbers). */
static void read_moe_stats(struct json_read *r, json_t *j, struct train_state *st)
{
    json_t *a = json_read_array(r, j, NULL, "moe_stats");
    size_t n = r->failed ? 0 : json_array_size(a);
    if (n < MOE_STATS(2) || n > MOE_STATS(PLAN_MOE_EXPERTS_MAX)) {
        json_read_fail(r, NULL, "moe_stats", "%zu numbers, not those of 2 to %d experts", n,
                       PLAN_MOE_EXPERTS_MAX);
        return;
    }
    st->moe_stats_n = (int)n;
    for (size_t i = 0; i < n && !r->failed; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v)) json_read_fail(r, NULL, "moe_stats", "member %zu: not a number", i);
        st->moe_stats[i] = json_number_value(v);
    }
}

int ckpt_read_state(const char *cdir, struct train_state *st, struct plait_error *err)
{
    char path[4096];
    memset(st, 0, sizeof *st);
    if (fs_join(path, sizeof path, cdir, CKPT_STATE, err)) return -1;
    struct json_read r = {path, err, 0};
    json_t *j = json_read_file(&r, path);
    if (!j) return -1;
    int64_t step = count_at(&r, j, NULL, "step"), micro = count_at(&r, j, NULL, "micro");
    st->step = (int)step;
    st->micro = (int)micro;
    st->loss_sum = json_read_number(&r, j, NULL, "loss_sum");
    st->tokens = count_at(&r, j, NULL, "tokens");
    /* the widths the runtime keeps them in: an int's steps, tokens a double
     * (metrics.jsonl) counts exactly; and the checkpoint's own name */
    if (step > INT_MAX)
        json_read_fail(&r, NULL, "step", "%lld is more than an int", (long long)step);
    if (micro > INT_MAX)
        json_read_fail(&r, NULL, "micro", "%lld is more than an int", (long long)micro);
    if (st->tokens > ((int64_t)1 << 53))
        json_read_fail(&r, NULL, "tokens", "%lld is more than 2^53, which no run reaches",
                       (long long)st->tokens);
    const char *base = strrchr(cdir, '/') ? strrchr(cdir, '/') + 1 : cdir;
    struct ckpt_entry named;
    if (!r.failed && ckptdir_parse_name(base, &named) &&
        (named.step != step || named.micro != micro))
        json_read_fail(&r, NULL, "step",
                       "step %lld, micro %lld, but the checkpoint is named %s: a state.json "
                       "that is not its own",
                       (long long)step, (long long)micro, base);
    st->eval_pending = json_read_bool(&r, j, NULL, "eval_pending");
    json_t *data = json_read_object(&r, j, NULL, "data");
    st->data.epoch = count_at(&r, data, "data", "epoch");
    st->data.shard = count_at(&r, data, "data", "shard");
    st->data.index = count_at(&r, data, "data", "index");
    read_rng(&r, j, st->sample_rng);
    if (json_read_has(j, "moe_stats")) read_moe_stats(&r, j, st);
    json_decref(j);
    return r.failed;
}
