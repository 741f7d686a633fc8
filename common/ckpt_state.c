/* ckpt_state.c — state.json of a checkpoint: a new run's state, reading and
 * writing it. The model's files are ckpt_shards.h's and the runtime's. */
#include "common/ckpt_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/rng.h"

void ckpt_state_fresh(struct train_state *st, const struct plan *plan)
{
    memset(st, 0, sizeof *st);
    struct rng r;
    rng_seed(&r, plan->sample.seed, 0);
    memcpy(st->sample_rng, r.s, sizeof st->sample_rng);
}

json_t *ckpt_state_json(const struct train_state *st)
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

int ckpt_read_state(const char *cdir, struct train_state *st, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, cdir, "state.json", err)) return -1;
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) return error_set(err, "state.json: %s", jerr.text);
    json_int_t tokens, epoch, shard, index;
    json_t *rng;
    int rc = 0;
    memset(st, 0, sizeof *st);
    if (json_unpack(j, "{s:i,s:i,s:F,s:I,s:b,s:{s:I,s:I,s:I},s:o}", "step", &st->step, "micro",
                    &st->micro, "loss_sum", &st->loss_sum, "tokens", &tokens, "eval_pending",
                    &st->eval_pending, "data", "epoch", &epoch, "shard", &shard, "index", &index,
                    "sample_rng", &rng) ||
        json_array_size(rng) != 4) {
        rc = error_set(err, "state.json: missing or malformed fields");
    } else if (st->step < 0 || st->micro < 0 || tokens < 0 || epoch < 0 || shard < 0 || index < 0) {
        rc = error_set(err, "state.json: a negative step, micro-batch, token count or position");
    } else {
        st->tokens = tokens;
        st->data = (struct data_position){epoch, shard, index};
        for (int i = 0; i < 4; i++) {
            const char *hex = json_string_value(json_array_get(rng, (size_t)i));
            st->sample_rng[i] = hex ? strtoull(hex, NULL, 16) : 0;
        }
    }
    json_decref(j);
    return rc;
}
