/* hf_model.c — a Hugging Face directory's config.json and weights read into
 * llm.c's order by transformers' names (hf_model.h). The file format is
 * safetensors.c's. */
#include "common/formats/hf_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/formats/safetensors.h"
#include "common/fsutil.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/json_read.h"

bool hf_is_model_dir(const char *path)
{
    char cfg[4096];
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
           snprintf(cfg, sizeof cfg, "%s/config.json", path) < (int)sizeof cfg &&
           stat(cfg, &st) == 0 && S_ISREG(st.st_mode);
}

/* An optional integer member, def when absent or null. */
static int64_t opt_int(struct json_read *r, json_t *o, const char *key, int64_t def)
{
    return json_read_has(o, key) ? json_read_int(r, o, NULL, key) : def;
}

static double opt_number(struct json_read *r, json_t *o, const char *key, double def)
{
    return json_read_has(o, key) ? json_read_number(r, o, NULL, key) : def;
}

/* What a Llama-shaped config must not have (plait's Llama is exactly
 * LlamaForCausalLM's plain form). */
static int llama_unsupported(struct json_read *r, json_t *o, int hidden, int heads)
{
    if (json_read_has(o, "rope_scaling"))
        return json_read_fail(r, NULL, "rope_scaling", "is set: scaled rotary positions "
                                                       "(Llama 3.1's) are not built");
    if (json_is_true(json_object_get(o, "attention_bias")) ||
        json_is_true(json_object_get(o, "mlp_bias")))
        return json_read_fail(r, NULL, "attention_bias", "biases on the projections are not "
                                                         "built");
    if (json_read_has(o, "head_dim") && json_read_int(r, o, NULL, "head_dim") * heads != hidden)
        return json_read_fail(r, NULL, "head_dim", "must be hidden_size / num_attention_heads");
    json_t *act = json_object_get(o, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return json_read_fail(r, NULL, "hidden_act", "must be \"silu\" (SwiGLU)");
    if (json_read_has(o, "sliding_window") &&
        json_read_int(r, o, NULL, "sliding_window") < opt_int(r, o, "max_position_embeddings", 0))
        return json_read_fail(r, NULL, "sliding_window", "is shorter than the context: sliding "
                                                         "window attention is not built");
    return 0;
}

static void read_llama(struct json_read *r, json_t *o, struct hf_config *c)
{
    c->llama = true;
    c->hidden = (int)json_read_int(r, o, NULL, "hidden_size");
    c->ffn_hidden = (int)json_read_int(r, o, NULL, "intermediate_size");
    c->heads = (int)json_read_int(r, o, NULL, "num_attention_heads");
    c->kv_heads = (int)opt_int(r, o, "num_key_value_heads", c->heads);
    c->layers = (int)json_read_int(r, o, NULL, "num_hidden_layers");
    c->vocab = (int)json_read_int(r, o, NULL, "vocab_size");
    c->max_seq_len = (int)json_read_int(r, o, NULL, "max_position_embeddings");
    c->norm_eps = opt_number(r, o, "rms_norm_eps", 1e-6);
    c->rope_theta = opt_number(r, o, "rope_theta", 10000.0);
    c->tied = json_is_true(json_object_get(o, "tie_word_embeddings"));
    if (!r->failed) llama_unsupported(r, o, c->hidden, c->heads);
}

static void read_gpt2(struct json_read *r, json_t *o, struct hf_config *c)
{
    c->hidden = (int)json_read_int(r, o, NULL, "n_embd");
    c->heads = c->kv_heads = (int)json_read_int(r, o, NULL, "n_head");
    c->layers = (int)json_read_int(r, o, NULL, "n_layer");
    c->vocab = (int)json_read_int(r, o, NULL, "vocab_size");
    c->max_seq_len = (int)opt_int(r, o, "n_positions", opt_int(r, o, "n_ctx", 1024));
    c->ffn_hidden = (int)opt_int(r, o, "n_inner", 4LL * c->hidden);
    c->norm_eps = opt_number(r, o, "layer_norm_epsilon", 1e-5);
    c->tied = true;
    if (c->ffn_hidden != 4 * c->hidden)
        json_read_fail(r, NULL, "n_inner", "must be 4·n_embd (GPT-2's MLP)");
}

int hf_config_read(const char *dir, struct hf_config *out, struct plait_error *err)
{
    memset(out, 0, sizeof *out);
    char path[4096];
    if (fs_join(path, sizeof path, dir, "config.json", err)) return -1;
    struct json_read r = {.file = path, .err = err};
    json_t *o = json_read_file(&r, path);
    if (!o) return -1;
    json_t *archs = json_object_get(o, "architectures");
    json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    snprintf(out->arch, sizeof out->arch, "%s",
             json_is_string(a0) ? json_string_value(a0) : "(no architectures[0])");
    if (strcmp(out->arch, "LlamaForCausalLM") == 0 || strcmp(out->arch, "MistralForCausalLM") == 0)
        read_llama(&r, o, out);
    else if (strcmp(out->arch, "GPT2LMHeadModel") == 0)
        read_gpt2(&r, o, out);
    else
        json_read_fail(&r, NULL, "architectures", "%s: plait trains GPT2LMHeadModel and the "
                                                  "Llama family (LlamaForCausalLM, "
                                                  "MistralForCausalLM)",
                       out->arch);
    json_decref(o);
    if (!r.failed && (out->layers < 1 || out->heads < 1 || out->hidden < 1 || out->vocab < 1 ||
                      out->kv_heads < 1 || out->max_seq_len < 1 || out->ffn_hidden < 1))
        r.failed = error_set(err, "%s: a dimension is not positive", path);
    return r.failed ? -1 : 0;
}

/* ---- the weights ------------------------------------------------------------------------ */

/* A model's safetensors files (those the index names, or model.safetensors),
 * opened once each. */
struct hf_files {
    const char *dir;
    json_t *weight_map; /* NULL: one file */
    struct st_file *open;
    char **names;
    int n;
};

static struct st_file *file_named(struct hf_files *h, const char *file, struct plait_error *err)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->names[i], file) == 0) return &h->open[i];
    char path[4096];
    if (strchr(file, '/') || fs_join(path, sizeof path, h->dir, file, err))
        return error_set(err, "%s: weight file %s is not in the directory", h->dir, file), NULL;
    struct st_file *more = realloc(h->open, (size_t)(h->n + 1) * sizeof *more);
    char **names = more ? realloc(h->names, (size_t)(h->n + 1) * sizeof *names) : NULL;
    if (more) h->open = more;
    if (names) h->names = names;
    if (!more || !names || !(h->names[h->n] = strdup(file)))
        return error_set(err, "out of memory"), NULL;
    if (st_open(&h->open[h->n], path, err)) {
        free(h->names[h->n]);
        return NULL;
    }
    return &h->open[h->n++];
}

/* *t = the tensor of that name in the file the index says, NULL when the
 * model has none; -1 with err when its file cannot be read. */
static int find(struct hf_files *h, const char *name, struct st_file **in,
                const struct st_tensor **t, struct plait_error *err)
{
    *t = NULL;
    json_t *f = h->weight_map ? json_object_get(h->weight_map, name) : NULL;
    if (h->weight_map && !json_is_string(f)) return 0;
    *in = file_named(h, f ? json_string_value(f) : "model.safetensors", err);
    if (!*in) return -1;
    *t = st_find(*in, name);
    return 0;
}

static int open_files(struct hf_files *h, const char *dir, struct plait_error *err)
{
    memset(h, 0, sizeof *h);
    h->dir = dir;
    char path[4096];
    struct stat st;
    if (fs_join(path, sizeof path, dir, "model.safetensors.index.json", err)) return -1;
    if (stat(path, &st) != 0) return 0; /* one model.safetensors */
    struct json_read r = {.file = path, .err = err};
    json_t *idx = json_read_file(&r, path);
    json_t *map = idx ? json_read_object(&r, idx, NULL, "weight_map") : NULL;
    if (map) h->weight_map = json_incref(map);
    json_decref(idx);
    return r.failed ? -1 : 0;
}

static void close_files(struct hf_files *h)
{
    for (int i = 0; i < h->n; i++) {
        st_close(&h->open[i]);
        free(h->names[i]);
    }
    free(h->open);
    free(h->names);
    json_decref(h->weight_map);
}

/* One Hugging Face tensor that fills rows of an instance: its name, rows ×
 * cols as plait holds them; transposed: stored (cols, rows) (GPT-2's
 * Conv1D); cols 0: a vector of rows. */
struct hf_part {
    char name[160];
    long long rows, cols;
    bool transposed;
};

#define PART(n, r, c, tr) (struct hf_part){n, r, c, tr}

/* The parts of instance (t, layer l) for a Llama, in row order; 0 parts: none. */
static int llama_parts(const struct gpt2_config *c, enum gpt2_tensor t, int l, struct hf_part *p)
{
    long long C = c->hidden, hs = C / c->heads, KV = (long long)gpt2_kv_heads(c) * hs;
    long long F = gpt2_ffn(c);
    const char *att[] = {"q_proj", "k_proj", "v_proj"}, *mlp[] = {"gate_proj", "up_proj"};
    long long att_rows[] = {C, KV, KV};
    int n = 0;
#define LAYER(fmt, ...) snprintf(p[n].name, sizeof p[n].name, "model.layers.%d." fmt, l, __VA_ARGS__)
    switch (t) {
    case GPT2_WTE:
        p[n++] = PART("model.embed_tokens.weight", c->vocab, C, false);
        break;
    case GPT2_LMHEAD:
        p[n++] = PART("lm_head.weight", c->vocab, C, false);
        break;
    case GPT2_LNFW:
        p[n++] = PART("model.norm.weight", C, 0, false);
        break;
    case GPT2_LN1W:
    case GPT2_LN2W:
        LAYER("%s", t == GPT2_LN1W ? "input_layernorm.weight" : "post_attention_layernorm.weight");
        p[n].rows = C, p[n++].cols = 0;
        break;
    case GPT2_QKVW:
        for (int k = 0; k < 3; k++) {
            LAYER("self_attn.%s.weight", att[k]);
            p[n].rows = att_rows[k], p[n++].cols = C;
        }
        break;
    case GPT2_ATTPROJW:
        LAYER("%s", "self_attn.o_proj.weight");
        p[n].rows = C, p[n++].cols = C;
        break;
    case GPT2_FCW:
        for (int k = 0; k < 2; k++) {
            LAYER("mlp.%s.weight", mlp[k]);
            p[n].rows = F, p[n++].cols = C;
        }
        break;
    case GPT2_FCPROJW:
        LAYER("%s", "mlp.down_proj.weight");
        p[n].rows = C, p[n++].cols = F;
        break;
    default:
        break;
    }
#undef LAYER
    for (int i = 0; i < n; i++) p[i].transposed = false;
    return n;
}

/* The same for GPT2LMHeadModel (names without "transformer."; its Conv1D
 * weights are stored (in, out): transposed). */
static int gpt2_parts(const struct gpt2_config *c, enum gpt2_tensor t, int l, struct hf_part *p)
{
    static const char *const names[GPT2_TENSORS] = {
        [GPT2_WTE] = "wte.weight",          [GPT2_WPE] = "wpe.weight",
        [GPT2_LN1W] = "ln_1.weight",        [GPT2_LN1B] = "ln_1.bias",
        [GPT2_QKVW] = "attn.c_attn.weight", [GPT2_QKVB] = "attn.c_attn.bias",
        [GPT2_ATTPROJW] = "attn.c_proj.weight", [GPT2_ATTPROJB] = "attn.c_proj.bias",
        [GPT2_LN2W] = "ln_2.weight",        [GPT2_LN2B] = "ln_2.bias",
        [GPT2_FCW] = "mlp.c_fc.weight",     [GPT2_FCB] = "mlp.c_fc.bias",
        [GPT2_FCPROJW] = "mlp.c_proj.weight", [GPT2_FCPROJB] = "mlp.c_proj.bias",
        [GPT2_LNFW] = "ln_f.weight",        [GPT2_LNFB] = "ln_f.bias"};
    long long C = c->hidden;
    const long long shape[GPT2_TENSORS][2] = {
        [GPT2_WTE] = {c->vocab, C},     [GPT2_WPE] = {c->max_seq_len, C}, [GPT2_LN1W] = {C, 0},
        [GPT2_LN1B] = {C, 0},           [GPT2_QKVW] = {3 * C, C},         [GPT2_QKVB] = {3 * C, 0},
        [GPT2_ATTPROJW] = {C, C},       [GPT2_ATTPROJB] = {C, 0},         [GPT2_LN2W] = {C, 0},
        [GPT2_LN2B] = {C, 0},           [GPT2_FCW] = {4 * C, C},          [GPT2_FCB] = {4 * C, 0},
        [GPT2_FCPROJW] = {C, 4 * C},    [GPT2_FCPROJB] = {C, 0},          [GPT2_LNFW] = {C, 0},
        [GPT2_LNFB] = {C, 0}};
    if (!names[t]) return 0;
    if (gpt2_tensor_per_layer(t))
        snprintf(p->name, sizeof p->name, "h.%d.%s", l, names[t]);
    else
        snprintf(p->name, sizeof p->name, "%s", names[t]);
    p->rows = shape[t][0];
    p->cols = shape[t][1];
    p->transposed = t == GPT2_QKVW || t == GPT2_ATTPROJW || t == GPT2_FCW || t == GPT2_FCPROJW;
    return 1;
}

/* Reads part p into dst (rows × cols, row-major as plait holds it). */
static int read_part(struct hf_files *h, const struct hf_part *p, bool gpt2, float *dst,
                     struct plait_error *err)
{
    struct st_file *in = NULL;
    char alt[200];
    const struct st_tensor *t;
    if (find(h, p->name, &in, &t, err)) return -1;
    if (!t && gpt2 && snprintf(alt, sizeof alt, "transformer.%s", p->name) < (int)sizeof alt &&
        find(h, alt, &in, &t, err))
        return -1;
    if (!t) return error_set(err, "%s: no tensor %s", h->dir, p->name);
    long long want[2] = {p->transposed ? p->cols : p->rows, p->transposed ? p->rows : p->cols};
    bool ok = p->cols ? t->ndim == 2 && t->shape[0] == want[0] && t->shape[1] == want[1]
                      : t->ndim == 1 && t->shape[0] == p->rows;
    if (!ok)
        return error_set(err, "%s: tensor %s has shape [%lld%s%lld], the plan's model needs "
                              "[%lld%s%lld]",
                         in->path, t->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                         t->ndim > 1 ? (long long)t->shape[1] : 0LL, want[0],
                         p->cols ? ", " : "", p->cols ? want[1] : 0LL);
    if (!p->transposed) return st_read_f32(in, t, dst, err);
    size_t n = st_elems(t);
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return error_set(err, "out of memory for %s", t->name);
    int rc = st_read_f32(in, t, tmp, err);
    for (long long r = 0; rc == 0 && r < p->rows; r++)
        for (long long k = 0; k < p->cols; k++) dst[r * p->cols + k] = tmp[k * p->rows + r];
    free(tmp);
    return rc;
}

/* Calls fn for every part of cfg's model in llm.c order, with the element
 * of the llm.c buffer where it starts; stops at the first non-zero return. */
static int each_part(const struct gpt2_config *cfg,
                     int (*fn)(void *ctx, const struct hf_part *p, size_t at), void *ctx)
{
    struct gpt2_layout layout;
    gpt2_layout(cfg, &layout); /* addressable: the caller's buffer is of its size */
    for (int t = 0; t < GPT2_TENSORS; t++) {
        if (!layout.elems[t]) continue;
        int instances = gpt2_tensor_per_layer(t) ? cfg->layers : 1;
        size_t per = layout.elems[t] / (size_t)instances;
        for (int l = 0; l < instances; l++) {
            struct hf_part parts[3];
            int n = cfg->llama ? llama_parts(cfg, t, l, parts) : gpt2_parts(cfg, t, l, parts);
            size_t at = layout.offset[t] + (size_t)l * per;
            for (int k = 0; k < n; k++) {
                int rc = fn(ctx, &parts[k], at);
                if (rc) return rc;
                at += (size_t)(parts[k].rows * (parts[k].cols ? parts[k].cols : 1));
            }
        }
    }
    return 0;
}

struct reading {
    struct hf_files files;
    const struct gpt2_config *cfg;
    float *full;
    struct plait_error *err;
};

static int read_one(void *ctx, const struct hf_part *p, size_t at)
{
    struct reading *r = ctx;
    return read_part(&r->files, p, !r->cfg->llama, r->full + at, r->err);
}

/* A tied model's lm_head.weight, where the directory has one (transformers
 * may save the tied head beside the embedding), must be the embedding that
 * plait uses for both: a head of its own cannot be dropped silently. */
static int tied_head_check(struct reading *r, const float *wte)
{
    const struct gpt2_config *c = r->cfg;
    struct hf_part head = PART("lm_head.weight", c->vocab, c->hidden, false);
    struct st_file *in = NULL;
    const struct st_tensor *t;
    if (c->untied) return 0;
    if (find(&r->files, head.name, &in, &t, r->err)) return -1;
    if (!t) return 0;
    size_t n = (size_t)c->vocab * (size_t)c->hidden;
    float *got = malloc(n * sizeof *got);
    if (!got) return error_set(r->err, "out of memory for %s", head.name);
    int rc = read_part(&r->files, &head, false, got, r->err);
    if (rc == 0 && memcmp(got, wte, n * sizeof *got) != 0)
        rc = error_set(r->err, "%s: lm_head.weight is not the token embedding: the model's "
                               "head is tied to it (config.json), so a head of its own would "
                               "be lost",
                       in->path);
    free(got);
    return rc;
}

int hf_model_read(const char *dir, const struct gpt2_config *cfg, float *full,
                  struct plait_error *err)
{
    struct gpt2_layout layout;
    if (gpt2_moe(cfg))
        return error_set(err, "model.moe: Hugging Face files of experts are not "
                              "read yet");
    if (gpt2_layout(cfg, &layout)) return error_set(err, "the model is too large to address");
    memset(full, 0, layout.total * sizeof *full);
    struct reading r = {.cfg = cfg, .full = full, .err = err};
    if (open_files(&r.files, dir, err)) return -1;
    int rc = each_part(cfg, read_one, &r) || tied_head_check(&r, full + layout.offset[GPT2_WTE])
                 ? -1
                 : 0;
    close_files(&r.files);
    return rc;
}

/* ---- writing --------------------------------------------------------------------------- */

/* The files being written: parts gathered until the next would pass
 * shard_bytes, then written as one file. A first pass (dry) only counts the
 * files, so that each can be named "model-0000i-of-0000n". */
struct writing {
    const char *dir;
    const struct gpt2_config *cfg;
    const float *full;
    size_t shard_bytes, in_file;
    enum st_dtype dtype; /* ST_F32 or ST_BF16 */
    uint64_t total;      /* bytes of tensors written */
    bool dry;
    int file, files;
    struct st_out *pending;
    float **owned; /* transposed copies of pending's data, freed once written */
    char **names;
    int n, cap;
    json_t *weight_map;
    struct plait_error *err;
};

static void file_name(const struct writing *w, int file, char *out, size_t bytes)
{
    snprintf(out, bytes, "model-%05d-of-%05d.safetensors", file + 1, w->files);
}

static void drop_pending(struct writing *w)
{
    for (int i = 0; i < w->n; i++) {
        free(w->owned[i]);
        free(w->names[i]);
    }
    w->n = 0;
}

static int flush_file(struct writing *w)
{
    int rc = 0;
    if (w->n && !w->dry) {
        char name[64], path[4096];
        file_name(w, w->file, name, sizeof name);
        rc = fs_join(path, sizeof path, w->dir, name, w->err) ||
                     st_write(path, w->pending, w->n, w->err)
                 ? -1
                 : 0;
    }
    drop_pending(w);
    if (w->in_file) w->file++;
    w->in_file = 0;
    return rc;
}

static bool grow(struct writing *w)
{
    if (w->n < w->cap) return true;
    int cap = w->cap ? 2 * w->cap : 64;
    struct st_out *p = realloc(w->pending, (size_t)cap * sizeof *p);
    if (p) w->pending = p;
    float **o = p ? realloc(w->owned, (size_t)cap * sizeof *o) : NULL;
    if (o) w->owned = o;
    char **nm = o ? realloc(w->names, (size_t)cap * sizeof *nm) : NULL;
    if (nm) w->names = nm;
    if (!nm) return false;
    w->cap = cap;
    return true;
}

/* One part into the current file (a new one when it would pass the size). */
static int write_one(void *ctx, const struct hf_part *p, size_t at)
{
    struct writing *w = ctx;
    size_t elems = (size_t)(p->rows * (p->cols ? p->cols : 1));
    size_t bytes = elems * (w->dtype == ST_BF16 ? 2 : 4); /* in the file */
    if (w->in_file && w->in_file + bytes > w->shard_bytes && flush_file(w)) return -1;
    w->in_file += bytes;
    w->total += w->dry ? 0 : bytes;
    char name[200];
    snprintf(name, sizeof name, "%s%s", w->cfg->llama ? "" : "transformer.", p->name);
    if (!w->dry) {
        char file[64];
        file_name(w, w->file, file, sizeof file);
        json_object_set_new(w->weight_map, name, json_string(file));
    }
    if (w->dry) return 0;
    if (!grow(w)) return error_set(w->err, "out of memory");
    float *copy = NULL;
    if (p->transposed) { /* GPT-2's Conv1D: stored (in, out) */
        if (!(copy = malloc(elems * sizeof *copy)))
            return error_set(w->err, "out of memory for %s", name);
        for (long long r = 0; r < p->rows; r++)
            for (long long k = 0; k < p->cols; k++)
                copy[k * p->rows + r] = w->full[at + (size_t)(r * p->cols + k)];
    }
    w->owned[w->n] = copy;
    w->names[w->n] = strdup(name);
    struct st_out *o = &w->pending[w->n++];
    *o = (struct st_out){.name = w->names[w->n - 1], .data = copy ? copy : w->full + at,
                         .dtype = w->dtype};
    o->ndim = p->cols ? 2 : 1;
    o->shape[0] = p->transposed ? p->cols : p->rows;
    o->shape[1] = p->transposed ? p->rows : p->cols;
    return w->names[w->n - 1] ? 0 : error_set(w->err, "out of memory");
}

/* config.json as transformers writes it for the model's class. */
static json_t *config_json(const struct gpt2_config *c, enum st_dtype dtype)
{
    const char *torch_dtype = dtype == ST_BF16 ? "bfloat16" : "float32";
    if (!c->llama)
        return json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:b,s:s}", "architectures",
                         "GPT2LMHeadModel", "model_type", "gpt2", "n_layer", c->layers, "n_head",
                         c->heads, "n_embd", c->hidden, "n_positions", c->max_seq_len,
                         "vocab_size", c->vocab, "activation_function", "gelu_new",
                         "layer_norm_epsilon", 1e-5, "tie_word_embeddings", 1, "torch_dtype",
                         torch_dtype);
    return json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:s,s:s,s:b,s:b}",
                     "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
                     c->hidden, "intermediate_size", (int)gpt2_ffn(c), "num_attention_heads",
                     c->heads, "num_key_value_heads", gpt2_kv_heads(c), "num_hidden_layers",
                     c->layers, "vocab_size", c->vocab, "max_position_embeddings",
                     c->max_seq_len, "rms_norm_eps", (double)c->norm_eps, "rope_theta",
                     c->rope_theta, "tie_word_embeddings", !c->untied, "hidden_act", "silu",
                     "torch_dtype", torch_dtype, "attention_bias", 0, "mlp_bias", 0);
}

static int write_json(const char *dir, const char *name, json_t *j, struct plait_error *err)
{
    char path[4096];
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    int rc = !text ? error_set(err, "out of memory")
             : fs_join(path, sizeof path, dir, name, err) ||
                     fs_write_atomic(path, text, strlen(text), err)
                 ? -1
                 : 0;
    free(text);
    return rc;
}

int hf_model_write(const char *dir, const struct gpt2_config *cfg, const float *full,
                   size_t shard_bytes, enum st_dtype dtype, struct plait_error *err)
{
    struct gpt2_layout layout;
    if (gpt2_moe(cfg))
        return error_set(err, "model.moe: Hugging Face files of experts are not "
                              "written yet");
    if (gpt2_layout(cfg, &layout)) return error_set(err, "the model is too large to address");
    struct writing w = {.dir = dir, .cfg = cfg, .full = full, .err = err, .dry = true,
                        .shard_bytes = shard_bytes ? shard_bytes : 1, .dtype = dtype};
    int rc = fs_mkdir_p(dir, err) || each_part(cfg, write_one, &w) || flush_file(&w) ? -1 : 0;
    w.files = w.file, w.file = 0, w.dry = false, w.in_file = 0;
    w.weight_map = json_object();
    rc = rc || each_part(cfg, write_one, &w) || flush_file(&w) ? -1 : 0;
    json_t *index = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)w.total,
                              "weight_map", w.weight_map);
    json_t *config = config_json(cfg, dtype);
    rc = rc || write_json(dir, "model.safetensors.index.json", index, err) ||
                 write_json(dir, "config.json", config, err)
             ? -1
             : 0;
    json_decref(index);
    json_decref(config);
    json_decref(w.weight_map);
    drop_pending(&w);
    free(w.pending);
    free(w.owned);
    free(w.names);
    return rc;
}

int hf_config_check(const char *dir, const struct gpt2_config *cfg, struct plait_error *err)
{
    struct hf_config h;
    if (hf_config_read(dir, &h, err)) return -1;
    const struct {
        const char *what;
        long long want, got;
    } d[] = {{"a Llama", cfg->llama, h.llama},
             {"layers", cfg->layers, h.layers},
             {"heads", cfg->heads, h.heads},
             {"key/value heads", gpt2_kv_heads(cfg), h.kv_heads},
             {"hidden", cfg->hidden, h.hidden},
             {"MLP width", gpt2_ffn(cfg), h.ffn_hidden},
             {"vocabulary", cfg->vocab, h.vocab},
             {"positions", cfg->llama ? h.max_seq_len : cfg->max_seq_len, h.max_seq_len},
             {"a tied head", !cfg->untied, h.tied}};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i].want != d[i].got)
            return error_set(err, "%s/config.json: %s %lld, the plan's model has %lld", dir,
                             d[i].what, d[i].got, d[i].want);
    return 0;
}
