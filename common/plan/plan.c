/* plan.c — plan.json: the schema table, the strict loader (JSON text, then
 * --set overrides, then types, ranges and defaults, then model.init and the
 * checks between fields, which are plan_rules.c's) and the writer back to JSON. jansson parses; a small
 * scanner over the same text remembers the line and the literal of each value,
 * which jansson does not keep, so messages can say `plan.json:7: optimizer.lr`.
 * What the fields mean at run time (schedules, sharding) lives in runtime/. */
#include "common/plan/plan.h"
#include "common/plan/plan_check.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "common/formats/rundir.h"         // RUNDIR_CHECKPOINTS (checkpoint.dir's default)

/* ---- the schema ------------------------------------------------------------------------- */

enum kind { K_SECTION, K_INT, K_U64, K_REAL, K_BOOL, K_STRING, K_PATH, K_ENUM, K_INTS };

#define REQ 0x1u           /* must be present and not null */
#define REQ_NO_INIT 0x2u   /* required unless model.init is given */
#define KEEP_RELATIVE 0x4u /* a path that is not resolved (checkpoint.dir) */
#define AUTO_OK 0x8u       /* K_INT that may also be "auto" (stored as PLAN_AUTO) */
#define MAY_CHANGE 0x10u   /* may differ when a run resumes (plan_diff) */
/* K_SECTION that may be absent: offset is a bool, whether given; an absent one gets its
 * defaults and is not written back */
#define OPTIONAL 0x20u

struct field {
    const char *name;
    enum kind kind;
    unsigned flags;
    size_t offset;              /* into struct plan (not for K_SECTION) */
    long long imin, imax, idef; /* K_INT, K_U64, K_BOOL (idef), K_ENUM (idef) */
    double rmin, rmax, rdef;    /* K_REAL; rmax = INFINITY when unbounded */
    bool rmin_open, rmax_open;  /* K_REAL: (rmin, ...) rather than [rmin, ...] */
    const char *const *names;   /* K_ENUM (index = enum value); K_STRING: the allowed set */
    const char *sdef;           /* K_STRING, K_PATH; NULL = no default */
    const struct field *fields; /* K_SECTION, ended by a NULL name */
};

#define AT(member) offsetof(struct plan, member)
#define INT_FIELD(n, m, lo, hi, def, fl)                                                           \
    {                                                                                              \
        .name = n, .kind = K_INT, .flags = fl, .offset = AT(m), .imin = lo, .imax = hi,            \
        .idef = def                                                                                \
    }
#define INTS_FIELD(n, m, lo, hi, fl)                                                               \
    {                                                                                              \
        .name = n, .kind = K_INTS, .flags = fl, .offset = AT(m), .imin = lo, .imax = hi            \
    }
#define U64_FIELD(n, m, def, fl)                                                                   \
    {                                                                                              \
        .name = n, .kind = K_U64, .flags = fl, .offset = AT(m), .imin = 0, .imax = LLONG_MAX,      \
        .idef = def                                                                                \
    }
#define REAL_FIELD(n, m, lo, lo_open, hi, hi_open, def, fl)                                        \
    {                                                                                              \
        .name = n, .kind = K_REAL, .flags = fl, .offset = AT(m), .rmin = lo, .rmin_open = lo_open, \
        .rmax = hi, .rmax_open = hi_open, .rdef = def                                              \
    }
#define BOOL_FIELD(n, m, def, fl)                                                                  \
    {                                                                                              \
        .name = n, .kind = K_BOOL, .flags = fl, .offset = AT(m), .idef = def                       \
    }
#define STRING_FIELD(n, m, set, def, fl)                                                           \
    {                                                                                              \
        .name = n, .kind = K_STRING, .flags = fl, .offset = AT(m), .names = set, .sdef = def       \
    }
#define PATH_FIELD(n, m, def, fl)                                                                  \
    {                                                                                              \
        .name = n, .kind = K_PATH, .flags = fl, .offset = AT(m), .sdef = def                       \
    }
#define ENUM_FIELD(n, m, set, def, fl)                                                             \
    {                                                                                              \
        .name = n, .kind = K_ENUM, .flags = fl, .offset = AT(m), .names = set, .idef = def         \
    }
#define SECTION(n, sub, fl)                                                                        \
    {                                                                                              \
        .name = n, .kind = K_SECTION, .flags = fl, .fields = sub                                   \
    }
#define OPT_SECTION(n, sub, given)                                                                 \
    {                                                                                              \
        .name = n, .kind = K_SECTION, .flags = OPTIONAL, .offset = AT(given), .fields = sub        \
    }
#define END                                                                                        \
    {                                                                                              \
        .name = NULL                                                                               \
    }

static const char *const arch_names[] = {"gpt2", "llama", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "fp8", NULL};
static const char *const fp8_scaling_names[] = {"tensor", "block", NULL};
static const char *const recompute_names[] = {"none", "selective", "full", NULL};
static const char *const schedule_names[] = {"constant", "cosine", "linear", "wsd", NULL};
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const pipeline_names[] = {"1f1b",  "gpipe",     "interleaved",
                                             "zb-h1", "dualpipev", NULL};
static const char *const backend_names[] = {"auto", "socket", "nccl", NULL};
static const char *const offload_names[] = {"none", "host", "nvme", NULL};

/* Enums are stored through an int (see put_int); they must be int-sized. */
_Static_assert(sizeof(enum plan_precision) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_fp8_scaling) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_recompute) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_schedule) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_device) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_pipeline) == sizeof(int), "enum size");
_Static_assert(sizeof(enum plan_backend) == sizeof(int), "enum size");

/* model.moe (struct plan_moe says what each means) */
static const struct field moe_fields[] = {
    INT_FIELD("experts", model.moe.experts, 2, PLAN_MOE_EXPERTS_MAX, 0, REQ),
    INT_FIELD("top_k", model.moe.top_k, 1, INT_MAX, 0, REQ),
    INT_FIELD("every", model.moe.every, 1, INT_MAX, 1, 0),
    INT_FIELD("shared_experts", model.moe.shared_experts, 0, INT_MAX, 0, 0),
    REAL_FIELD("capacity_factor", model.moe.capacity_factor, 0, false, 1e6, false, 0.0, 0),
    REAL_FIELD("aux_loss", model.moe.aux_loss, 0, false, 1e6, false, 0.01, 0),
    REAL_FIELD("router_z_loss", model.moe.router_z_loss, 0, false, 1e6, false, 0.0, 0),
    INT_FIELD("ffn_hidden", model.moe.ffn_hidden, 1, INT_MAX, 0, REQ),
    END,
};

static const struct field model_fields[] = {
    STRING_FIELD("arch", model.arch, arch_names, "gpt2", 0),
    INT_FIELD("layers", model.layers, 1, INT_MAX, 0, REQ_NO_INIT),
    INT_FIELD("heads", model.heads, 1, INT_MAX, 0, REQ_NO_INIT),
    INT_FIELD("hidden", model.hidden, 1, INT_MAX, 0, REQ_NO_INIT),
    INT_FIELD("vocab", model.vocab, 1, PLAN_VOCAB_MAX, 0, REQ_NO_INIT),
    /* The defaults of these three are computed in plan_check_rules (from vocab, seq_len or init). */
    INT_FIELD("padded_vocab", model.padded_vocab, 1, INT_MAX, 0, 0),
    INT_FIELD("seq_len", model.seq_len, 1, INT_MAX, 0, REQ_NO_INIT),
    INT_FIELD("max_seq_len", model.max_seq_len, 1, INT_MAX, 0, 0),
    U64_FIELD("seed", model.seed, 1337, 0),
    PATH_FIELD("init", model.init, NULL, 0),
    /* llama's; their defaults are set in check_arch_rules */
    INT_FIELD("kv_heads", model.kv_heads, 1, INT_MAX, 0, 0),
    INT_FIELD("ffn_hidden", model.ffn_hidden, 1, INT_MAX, 0, 0),
    REAL_FIELD("rope_theta", model.rope_theta, 0, true, 1e12, false, 10000.0, 0),
    REAL_FIELD("norm_eps", model.norm_eps, 0, true, 1, false, 1e-5, 0),
    BOOL_FIELD("tie_embeddings", model.tie_embeddings, false, 0),
    OPT_SECTION("moe", moe_fields, model.moe.given),
    END,
};

static const struct field data_fields[] = {
    PATH_FIELD("train", data.train, NULL, REQ),
    PATH_FIELD("val", data.val, NULL, 0),
    BOOL_FIELD("shuffle", data.shuffle, false, 0),
    INT_FIELD("val_every", data.val_every, 0, INT_MAX, 0, MAY_CHANGE),
    INT_FIELD("val_batches", data.val_batches, 1, INT_MAX, 20, MAY_CHANGE),
    PATH_FIELD("tokenizer", data.tokenizer, NULL, MAY_CHANGE),
    END,
};

static const struct field batch_fields[] = {
    INT_FIELD("micro_batch", batch.micro_batch, 1, INT_MAX, 4, 0),
    INT_FIELD("grad_accum", batch.grad_accum, 1, INT_MAX, 1, 0),
    INT_FIELD("global_batch", batch.global_batch, 0, INT_MAX, 0, 0),
    END,
};

static const struct field optimizer_fields[] = {
    REAL_FIELD("lr", optimizer.lr, 0, true, INFINITY, false, 3e-4, 0),
    REAL_FIELD("beta1", optimizer.beta1, 0, false, 1, true, 0.9, 0),
    REAL_FIELD("beta2", optimizer.beta2, 0, false, 1, true, 0.95, 0),
    REAL_FIELD("eps", optimizer.eps, 0, true, INFINITY, false, 1e-8, 0),
    REAL_FIELD("weight_decay", optimizer.weight_decay, 0, false, INFINITY, false, 0.1, 0),
    REAL_FIELD("grad_clip", optimizer.grad_clip, 0, false, INFINITY, false, 1.0, 0),
    INT_FIELD("warmup_steps", optimizer.warmup_steps, 0, INT_MAX, 0, 0),
    ENUM_FIELD("schedule", optimizer.schedule, schedule_names, PLAN_SCHEDULE_COSINE, 0),
    INT_FIELD("decay_steps", optimizer.decay_steps, 0, INT_MAX, 0, MAY_CHANGE),
    REAL_FIELD("decay_fraction", optimizer.decay_fraction, 0, true, 1, false, WSD_DECAY_FRACTION,
               MAY_CHANGE),
    REAL_FIELD("min_lr_ratio", optimizer.min_lr_ratio, 0, false, 1, false, 0.1, 0),
    END,
};

static const struct field checkpoint_fields[] = {
    PATH_FIELD("dir", checkpoint.dir, RUNDIR_CHECKPOINTS, KEEP_RELATIVE),
    INT_FIELD("every", checkpoint.every, 0, INT_MAX, 0, MAY_CHANGE),
    REAL_FIELD("every_minutes", checkpoint.every_minutes, 0, false, 1e6, false, 30.0, MAY_CHANGE),
    INT_FIELD("keep", checkpoint.keep, 1, INT_MAX, 3, MAY_CHANGE),
    INT_FIELD("max_restarts", checkpoint.max_restarts, 0, INT_MAX, 3, MAY_CHANGE),
    BOOL_FIELD("async", checkpoint.async, false, MAY_CHANGE),
    END,
};

static const struct field parallel_fields[] = {
    /* the layout may change on resume: the checkpoint says whether it can be read */
    INT_FIELD("tp", parallel.tp, 1, INT_MAX, 1, AUTO_OK | MAY_CHANGE),
    INT_FIELD("pp", parallel.pp, 1, INT_MAX, 1, AUTO_OK | MAY_CHANGE),
    INT_FIELD("dp", parallel.dp, 1, INT_MAX, 1, AUTO_OK | MAY_CHANGE),
    INT_FIELD("cp", parallel.cp, 1, INT_MAX, 1, MAY_CHANGE),
    INT_FIELD("dp_shard", parallel.dp_shard, 1, INT_MAX, PLAN_AUTO, AUTO_OK | MAY_CHANGE),
    INT_FIELD("dp_replicate", parallel.dp_replicate, 1, INT_MAX, PLAN_AUTO, AUTO_OK | MAY_CHANGE),
    INT_FIELD("ep", parallel.ep, 1, INT_MAX, 1, MAY_CHANGE),
    BOOL_FIELD("allow_tp_over_pcie", parallel.allow_tp_over_pcie, false, MAY_CHANGE),
    INT_FIELD("zero", parallel.zero, 0, 3, 0, MAY_CHANGE),
    BOOL_FIELD("reshard_after_forward", parallel.reshard_after_forward, true, MAY_CHANGE),
    ENUM_FIELD("device", parallel.device, device_names, PLAN_DEVICE_AUTO, MAY_CHANGE),
    ENUM_FIELD("schedule", parallel.schedule, pipeline_names, PLAN_PIPE_1F1B, MAY_CHANGE),
    INT_FIELD("virtual_stages", parallel.virtual_stages, 1, 64, 1, MAY_CHANGE),
    INTS_FIELD("stage_layers", parallel.stage_layers, 1, INT_MAX, MAY_CHANGE),
    BOOL_FIELD("sequence_parallel", parallel.sequence_parallel, false, MAY_CHANGE),
    REAL_FIELD("bucket_mb", parallel.bucket_mb, 0, true, 1e6, false, 25.0, MAY_CHANGE),
    REAL_FIELD("timeout_s", parallel.timeout_s, 0, true, 1e6, false, 300.0, MAY_CHANGE),
    ENUM_FIELD("backend", parallel.backend, backend_names, PLAN_BACKEND_AUTO, MAY_CHANGE),
    ENUM_FIELD("offload", parallel.offload, offload_names, PLAN_OFFLOAD_NONE, MAY_CHANGE),
    PATH_FIELD("offload_dir", parallel.offload_dir, NULL, MAY_CHANGE),
    REAL_FIELD("offload_window_mb", parallel.offload_window_mb, 0, true, 1e6, false, 64.0,
               MAY_CHANGE),
    END,
};

static const struct field sample_fields[] = {
    INT_FIELD("tokens", sample.tokens, 0, INT_MAX, 0, MAY_CHANGE),
    REAL_FIELD("temperature", sample.temperature, 0, true, INFINITY, false, 1.0, MAY_CHANGE),
    INT_FIELD("top_k", sample.top_k, 0, INT_MAX, 0, MAY_CHANGE),
    STRING_FIELD("prompt", sample.prompt, NULL, "\n", MAY_CHANGE),
    U64_FIELD("seed", sample.seed, 42, MAY_CHANGE),
    END,
};

/* The top level, in the order plan_to_json writes it. */
static const struct field train_fields[] = {
    PATH_FIELD("tensorboard", train.tensorboard, NULL, KEEP_RELATIVE | MAY_CHANGE),
    INT_FIELD("log_every", train.log_every, 1, INT_MAX, PLAN_AUTO, AUTO_OK | MAY_CHANGE),
    END,
};

static const struct field root_fields[] = {
    SECTION("model", model_fields, REQ),
    SECTION("data", data_fields, REQ),
    SECTION("batch", batch_fields, 0),
    SECTION("optimizer", optimizer_fields, 0),
    INT_FIELD("steps", steps, 1, INT_MAX, 0, REQ | MAY_CHANGE),
    ENUM_FIELD("precision", precision, precision_names, PLAN_PRECISION_FP32, 0),
    /* null unless precision is fp8, where plan_check_rules makes it "tensor" */
    ENUM_FIELD("fp8_scaling", fp8_scaling, fp8_scaling_names, PLAN_FP8_NONE, 0),
    ENUM_FIELD("recompute", recompute, recompute_names, PLAN_RECOMPUTE_NONE, MAY_CHANGE),
    SECTION("checkpoint", checkpoint_fields, 0),
    SECTION("parallel", parallel_fields, 0),
    SECTION("sample", sample_fields, 0),
    SECTION("train", train_fields, 0),
    END,
};

static const struct field *find_field(const struct field *fields, const char *name)
{
    for (const struct field *f = fields; f->name; f++)
        if (strcmp(f->name, name) == 0) return f;
    return NULL;
}

/* ---- where each value came from --------------------------------------------------------- */

struct entry {
    char *path; /* dot-joined JSON path; "" is the top level */
    int origin; /* -1: the plan text; i >= 0: override i */
    int line;   /* where the value starts (plan text only) */
    char *raw;  /* the literal as written, for scalars; NULL for objects and arrays */
    bool dead;  /* replaced by an override */
};

struct plan_ctx {
    const char *source;
    const char *const *overrides;
    const char *base_arg; /* base directory as given (NULL = current directory) */
    char *base_dir;       /* absolute, computed on first use */
    char *cwd;            /* absolute, computed on first use */
    struct entry *entries;
    int n_entries, cap_entries;
    struct plait_error *err;
};

#define SCAN_DEPTH 3 /* deeper values are never named in a message */

static int report(struct plan_ctx *c, int origin, int line, const char *path, const char *msg);

static int out_of_memory(struct plan_ctx *c)
{
    return error_set(c->err, "%s: out of memory", c->source);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* "a" + "b" -> "a.b"; "" + "b" -> "b". malloc'ed. */
static char *join(const char *path, const char *key)
{
    size_t a = strlen(path), b = strlen(key);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, path, a);
    size_t n = a;
    if (a) s[n++] = '.';
    memcpy(s + n, key, b + 1);
    return s;
}

static int add_entry(struct plan_ctx *c, const char *path, int origin, int line, const char *raw,
                     size_t raw_bytes)
{
    if (c->n_entries == c->cap_entries) {
        int cap = c->cap_entries ? 2 * c->cap_entries : 64;
        struct entry *e = realloc(c->entries, (size_t)cap * sizeof *e);
        if (!e) return out_of_memory(c);
        c->entries = e;
        c->cap_entries = cap;
    }
    struct entry *e = &c->entries[c->n_entries];
    *e = (struct entry){.origin = origin, .line = line};
    e->path = dup_n(path, strlen(path));
    e->raw = raw ? dup_n(raw, raw_bytes) : NULL;
    if (!e->path || (raw && !e->raw)) {
        free(e->path);
        free(e->raw);
        return out_of_memory(c);
    }
    c->n_entries++;
    return 0;
}

static int find_entry_index(const struct plan_ctx *c, const char *path)
{
    for (int i = 0; i < c->n_entries; i++)
        if (!c->entries[i].dead && strcmp(c->entries[i].path, path) == 0) return i;
    return -1;
}

static const struct entry *find_entry(const struct plan_ctx *c, const char *path)
{
    int i = find_entry_index(c, path);
    return i < 0 ? NULL : &c->entries[i];
}

/* The entry of path, else of the nearest enclosing value that has one. */
static const struct entry *locate(const struct plan_ctx *c, const char *path)
{
    size_t n = strlen(path);
    for (;;) {
        for (int i = 0; i < c->n_entries; i++) {
            const struct entry *e = &c->entries[i];
            if (!e->dead && strlen(e->path) == n && strncmp(e->path, path, n) == 0) return e;
        }
        if (n == 0) return NULL;
        while (n > 0 && path[n - 1] != '.') n--;
        if (n > 0) n--; /* drop the dot */
    }
}

/* An override replaced path: forget what was recorded there and below. */
static void kill_entries(struct plan_ctx *c, const char *path)
{
    size_t n = strlen(path);
    for (int i = 0; i < c->n_entries; i++) {
        struct entry *e = &c->entries[i];
        if (strncmp(e->path, path, n) == 0 && (e->path[n] == '\0' || e->path[n] == '.'))
            e->dead = true;
    }
}

/* ---- the scanner: lines and literals of an already-valid JSON text ---------------------- */

struct scanner {
    struct plan_ctx *c;
    const char *p;
    int line;
    int origin;
};

static void skip_ws(struct scanner *s)
{
    for (;; s->p++) {
        if (*s->p == '\n')
            s->line++;
        else if (*s->p != ' ' && *s->p != '\t' && *s->p != '\r')
            return;
    }
}

/* s->p at the opening quote; leaves it after the closing one. */
static void skip_string(struct scanner *s)
{
    for (s->p++; *s->p && *s->p != '"'; s->p++)
        if (*s->p == '\\' && s->p[1]) s->p++;
    if (*s->p == '"') s->p++;
}

static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        unsigned d = ch >= '0' && ch <= '9'   ? (unsigned)(ch - '0')
                     : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                     : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A' + 10)
                                              : 0;
        v = v * 16 + d;
    }
    return v;
}

static char *put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* The text between the quotes of a JSON string, unescaped (as jansson has the key). */
static char *unescape(const char *begin, const char *end)
{
    char *out = malloc((size_t)(end - begin) + 1), *o = out;
    if (!out) return NULL;
    for (const char *q = begin; q < end; q++) {
        if (*q != '\\') {
            *o++ = *q;
            continue;
        }
        q++;
        switch (*q) {
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u': {
            unsigned cp = hex4(q + 1);
            q += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && q[1] == '\\' && q[2] == 'u') {
                unsigned lo = hex4(q + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                }
            }
            o = put_utf8(o, cp);
            break;
        }
        default:
            *o++ = *q;
            break; /* \" \\ \/ */
        }
    }
    *o = '\0';
    return out;
}

/* Records path (NULL: inside an array or too deep, not recorded) and, for
 * objects, every member up to SCAN_DEPTH. */
static int scan_value(struct scanner *s, const char *path, int depth)
{
    skip_ws(s);
    const char *start = s->p;
    int line = s->line;
    if (*s->p == '{' || *s->p == '[') {
        char close = *s->p == '{' ? '}' : ']';
        if (path && add_entry(s->c, path, s->origin, line, NULL, 0)) return -1;
        for (s->p++, skip_ws(s); *s->p && *s->p != close;) {
            char *child = NULL;
            if (close == '}') {
                if (*s->p != '"') return 0; /* not JSON; jansson would have said */
                const char *key = s->p + 1;
                skip_string(s);
                if (path && depth < SCAN_DEPTH) {
                    char *name = unescape(key, s->p - 1);
                    child = name ? join(path, name) : NULL;
                    free(name);
                    if (!child) return out_of_memory(s->c);
                }
                skip_ws(s);
                if (*s->p == ':') s->p++;
            }
            const char *before = s->p;
            int rc = scan_value(s, child, depth + 1);
            free(child);
            if (rc) return -1;
            if (s->p == before) return 0; /* no progress: not JSON */
            skip_ws(s);
            if (*s->p == ',') {
                s->p++;
                skip_ws(s);
            }
        }
        if (*s->p) s->p++;
        return 0;
    }
    if (*s->p == '"')
        skip_string(s);
    else
        while (*s->p && !strchr(",}] \t\r\n", *s->p)) s->p++;
    return path ? add_entry(s->c, path, s->origin, line, start, (size_t)(s->p - start)) : 0;
}

static int scan(struct plan_ctx *c, const char *text, int origin, const char *path, int depth)
{
    struct scanner s = {.c = c, .p = text, .line = 1, .origin = origin};
    return scan_value(&s, path, depth);
}

/* ---- messages ---------------------------------------------------------------------------- */

/* "source:line: path: msg", or "--set override: path: msg" for values an override gave. */
static int report(struct plan_ctx *c, int origin, int line, const char *path, const char *msg)
{
    char at[512];
    if (origin >= 0)
        snprintf(at, sizeof at, "--set %s", c->overrides[origin] ? c->overrides[origin] : "(null)");
    else if (line > 0)
        snprintf(at, sizeof at, "%s:%d", c->source, line);
    else
        snprintf(at, sizeof at, "%s", c->source);
    if (*path) return error_set(c->err, "%s: %s: %s", at, path, msg);
    return error_set(c->err, "%s: %s", at, msg);
}

/* An error of a rule between fields: at path's place, unless an override set
 * one of the fields the rule also reads (also: space-separated paths) after
 * path's own value was given. Then it names that override (the last such)
 * and where path's value came from: "--set steps=5: optimizer.warmup_steps:
 * must be < steps (5) ...; optimizer.warmup_steps is at plan.json:9". */
static int vfail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt,
                      va_list ap) __attribute__((format(printf, 4, 0)));
int plan_fail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* An error about the value at path, located where that value (or its parent) came from. */
int plan_fail(struct plan_ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int plan_fail(struct plan_ctx *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail_rule(c, path, "", fmt, ap);
    va_end(ap);
    return rc;
}

int plan_fail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail_rule(c, path, also, fmt, ap);
    va_end(ap);
    return rc;
}

static int vfail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt,
                      va_list ap)
{
    char msg[640];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const struct entry *own = locate(c, path);
    int own_origin = own ? own->origin : -1, culprit = own_origin;
    for (const char *a = also; *a;) {
        size_t n = strcspn(a, " ");
        char other[64];
        snprintf(other, sizeof other, "%.*s", (int)n, a);
        const struct entry *e = locate(c, other);
        if (e && e->origin > culprit) culprit = e->origin;
        a += n + (a[n] == ' ');
    }
    if (culprit == own_origin) return report(c, own_origin, own ? own->line : 0, path, msg);
    char full[1280];
    bool given_here = own && strcmp(own->path, path) == 0;
    if (given_here && own_origin >= 0)
        snprintf(full, sizeof full, "%s; %s is set by --set %s", msg, path,
                 c->overrides[own_origin] ? c->overrides[own_origin] : "(null)");
    else if (given_here && own->line > 0)
        snprintf(full, sizeof full, "%s; %s is at %s:%d", msg, path, c->source, own->line);
    else
        snprintf(full, sizeof full, "%s; %s is %s", msg, path,
                 given_here ? "in the plan" : "its default");
    return report(c, culprit, 0, path, full);
}

/* The value as written ("-3e-4", "\"fp16\""), shortened; "object"/"array" for those. */
const char *plan_got_text(const struct plan_ctx *c, const char *path, const json_t *v,
                            char buf[PLAN_GOT_MAX])
{
    if (json_is_object(v)) return "object";
    if (json_is_array(v)) return "array";
    const struct entry *e = find_entry(c, path);
    char *dumped = NULL;
    const char *raw = e && e->raw ? e->raw : (dumped = json_dumps(v, JSON_ENCODE_ANY));
    if (!raw) return "?";
    size_t n = strlen(raw);
    if (n < PLAN_GOT_MAX) {
        memcpy(buf, raw, n + 1);
    } else {
        n = PLAN_GOT_MAX - 4;
        while (n > 0 && ((unsigned char)raw[n] & 0xC0) == 0x80) n--; /* whole UTF-8 characters */
        memcpy(buf, raw, n);
        memcpy(buf + n, "...", 4);
    }
    free(dumped);
    return buf;
}

/* Levenshtein distance, ignoring case; INT_MAX for long strings. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAX = 64 };
    size_t na = strlen(a), nb = strlen(b);
    if (na > MAX || nb > MAX) return INT_MAX;
    int prev[MAX + 1], cur[MAX + 1];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] +
                      (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[nb];
}

static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

/* What to tell about an unknown key in the object at `here` whose keys are `fields`:
 * a near miss, the same name in another section, or the allowed keys. */
static void unknown_key_hint(const struct field *fields, const char *here, const char *key,
                             char *buf, size_t n)
{
    const struct field *best = NULL;
    int best_d = INT_MAX;
    for (const struct field *f = fields; f->name; f++) {
        int d = edit_distance(key, f->name), limit = strlen(f->name) <= 3 ? 1 : 2;
        if (d <= limit && d < best_d) best = f, best_d = d;
    }
    buf[0] = '\0';
    if (best) {
        append(buf, n, "did you mean \"%s\"?", best->name);
        return;
    }
    int found = 0;
    for (const struct field *r = root_fields; r->name; r++) {
        if (*here && strcasecmp(r->name, key) == 0)
            append(buf, n, "%s\"%s\"", found++ ? " or " : "did you mean ", r->name);
        if (r->kind != K_SECTION || strcmp(r->name, here) == 0) continue;
        for (const struct field *f = r->fields; f->name; f++)
            if (strcasecmp(f->name, key) == 0)
                append(buf, n, "%s\"%s.%s\"", found++ ? " or " : "did you mean ", r->name, f->name);
    }
    if (found) {
        append(buf, n, "?");
        return;
    }
    append(buf, n, "allowed:");
    for (const struct field *f = fields; f->name; f++)
        append(buf, n, "%s \"%s\"", f == fields ? "" : ",", f->name);
}

static int top_level_error(struct plan_ctx *c, json_t *root)
{
    char got[PLAN_GOT_MAX];
    return plan_fail(c, "", "the top level must be an object (got %s)", plan_got_text(c, "", root, got));
}

/* ---- overrides --------------------------------------------------------------------------- */

/* Checks path against the schema; returns the number of keys in it, or -1. */
static int check_override_path(struct plan_ctx *c, int i, const char *path)
{
    const struct field *fields = root_fields;
    const char *parent = ""; /* the section the current key is in; "" = top level */
    size_t at = 0;           /* where the current key starts in path */
    for (int depth = 1;; depth++) {
        size_t n = strcspn(path + at, "."), end = at + n; /* path[0, end) ends with this key */
        char *key = dup_n(path + at, n), msg[640] = "";
        if (!key) return out_of_memory(c);
        const struct field *f = find_field(fields, key);
        if (n == 0) {
            snprintf(msg, sizeof msg, "empty key in the path");
            end = strlen(path);
        } else if (!f) {
            char hint[600];
            unknown_key_hint(fields, parent, key, hint, sizeof hint);
            snprintf(msg, sizeof msg, "unknown key (%s)", hint);
        } else if (path[end] == '.' && f->kind != K_SECTION) {
            snprintf(msg, sizeof msg, "unknown key (%.*s is not an object)", (int)end, path);
            end += 1 + strcspn(path + end + 1, ".");
        }
        free(key);
        if (msg[0]) {
            char *where = dup_n(path, end);
            if (!where) return out_of_memory(c);
            report(c, i, 0, where, msg);
            free(where);
            return -1;
        }
        if (path[end] == '\0') return depth;
        parent = f->name;
        fields = f->fields;
        at = end + 1;
    }
}

/* s as a JSON string, by jansson ("\n" as two characters); NULL: out of memory, or s is not
 * UTF-8 */
static char *quote(const char *s)
{
    json_t *j = json_string(s);
    char *text = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return text;
}

/* Applies overrides[i] ("dot.path=value") to root, creating objects on the way. */
static int apply_override(struct plan_ctx *c, json_t *root, int i)
{
    const char *ovr = c->overrides[i];
    const char *eq = ovr ? strchr(ovr, '=') : NULL;
    if (!eq) return report(c, i, 0, "", "expected dot.path=value");
    char *path = dup_n(ovr, (size_t)(eq - ovr)), *prefix = NULL;
    const char *text = eq + 1;
    json_t *value = NULL;
    if (!path) return out_of_memory(c);
    int depth = check_override_path(c, i, path);
    if (depth < 0) goto fail;
    if (!json_is_object(root)) {
        top_level_error(c, root);
        goto fail;
    }

    json_error_t jerr;
    value = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    bool is_json = value != NULL;
    if (!value && !(value = json_string(text))) {
        report(c, i, 0, path, "the value is not valid UTF-8");
        goto fail;
    }

    json_t *obj = root;
    prefix = dup_n(path, strlen(path));
    if (!prefix) goto oom;
    for (char *p = prefix, *dot; (dot = strchr(p, '.')); p = dot + 1) {
        *dot = '\0'; /* prefix is now the path of the object on the way */
        json_t *child = json_object_get(obj, p);
        if (!child || json_is_null(child)) {
            child = json_object();
            if (!child || json_object_set_new(obj, p, child)) goto oom;
            kill_entries(c, prefix);
            if (add_entry(c, prefix, i, 0, NULL, 0)) goto fail;
        } else if (!json_is_object(child)) {
            char got[PLAN_GOT_MAX];
            plan_fail(c, prefix, "must be an object (got %s)", plan_got_text(c, prefix, child, got));
            goto fail;
        }
        obj = child;
        *dot = '.';
    }
    const char *last = strrchr(path, '.') ? strrchr(path, '.') + 1 : path;
    kill_entries(c, path);
    if (json_object_set_new(obj, last, value)) {
        value = NULL;
        goto oom;
    }
    value = NULL;
    if (is_json) {
        if (scan(c, text, i, path, depth)) goto fail;
    } else {
        char *quoted = quote(text);
        if (!quoted) goto oom;
        int rc = add_entry(c, path, i, 0, quoted, strlen(quoted));
        free(quoted);
        if (rc) goto fail;
    }
    free(prefix);
    free(path);
    return 0;
oom:
    out_of_memory(c);
fail:
    json_decref(value);
    free(prefix);
    free(path);
    return -1;
}

/* ---- decoding ---------------------------------------------------------------------------- */

static void put_int(struct plan *p, size_t offset, int v)
{
    memcpy((char *)p + offset, &v, sizeof v);
}

static int get_int(const struct plan *p, size_t offset)
{
    int v;
    memcpy(&v, (const char *)p + offset, sizeof v);
    return v;
}

static const char *ctx_cwd(struct plan_ctx *c)
{
    if (!c->cwd && !(c->cwd = getcwd(NULL, 0)))
        error_errno(c->err, "%s: cannot resolve relative paths: getcwd", c->source);
    return c->cwd;
}

/* rel against base (absolute); an absolute rel is kept. "./" prefixes are dropped. */
static char *resolve(const char *base, const char *rel)
{
    if (rel[0] == '/') return dup_n(rel, strlen(rel));
    while (rel[0] == '.' && rel[1] == '/')
        for (rel += 2; *rel == '/';) rel++;
    if (rel[0] == '\0' || strcmp(rel, ".") == 0) return dup_n(base, strlen(base));
    size_t nb = strlen(base), nr = strlen(rel);
    while (nb > 1 && base[nb - 1] == '/') nb--;
    char *s = malloc(nb + nr + 2);
    if (!s) return NULL;
    memcpy(s, base, nb);
    size_t n = nb;
    if (base[nb - 1] != '/') s[n++] = '/';
    memcpy(s + n, rel, nr + 1);
    return s;
}

static const char *ctx_base_dir(struct plan_ctx *c)
{
    if (c->base_dir) return c->base_dir;
    if (c->base_arg && c->base_arg[0] == '/') {
        c->base_dir = dup_n(c->base_arg, strlen(c->base_arg));
    } else {
        const char *cwd = ctx_cwd(c);
        if (!cwd) return NULL;
        c->base_dir = resolve(cwd, c->base_arg ? c->base_arg : ".");
    }
    if (!c->base_dir) out_of_memory(c);
    return c->base_dir;
}

static bool required(const struct field *f, bool has_init)
{
    return (f->flags & REQ) || ((f->flags & REQ_NO_INIT) && !has_init);
}

static int decode_object(struct plan_ctx *c, json_t *obj, const struct field *fields, const char *path,
                         struct plan *p, bool has_init);

static int set_default(struct plan_ctx *c, const struct field *f, const char *path, struct plan *p,
                       bool has_init)
{
    char **str = (char **)((char *)p + f->offset);
    switch (f->kind) {
    case K_SECTION:
        if (f->flags & OPTIONAL) *(bool *)((char *)p + f->offset) = false;
        return decode_object(c, NULL, f->fields, path, p, has_init);
    case K_INT:
        *(int *)((char *)p + f->offset) = (int)f->idef;
        return 0;
    case K_U64:
        *(uint64_t *)((char *)p + f->offset) = (uint64_t)f->idef;
        return 0;
    case K_INTS:
        ((struct plan_ints *)((char *)p + f->offset))->n = 0;
        return 0;
    case K_REAL:
        *(double *)((char *)p + f->offset) = f->rdef;
        return 0;
    case K_BOOL:
        *(bool *)((char *)p + f->offset) = f->idef != 0;
        return 0;
    case K_ENUM:
        put_int(p, f->offset, (int)f->idef);
        return 0;
    case K_STRING:
    case K_PATH:
        if (f->sdef && !(*str = dup_n(f->sdef, strlen(f->sdef)))) return out_of_memory(c);
        return 0;
    }
    return 0;
}

/* "must be one of "a", "b"", or "must be "a"" for a set of one. */
static void one_of(char *buf, size_t n, const char *const *names)
{
    buf[0] = '\0';
    if (!names[1]) {
        append(buf, n, "must be \"%s\"", names[0]);
        return;
    }
    append(buf, n, "must be one of");
    for (int k = 0; names[k]; k++) append(buf, n, "%s \"%s\"", k ? "," : "", names[k]);
}

static int name_index(const char *const *names, const char *s)
{
    for (int k = 0; names[k]; k++)
        if (strcmp(names[k], s) == 0) return k;
    return -1;
}

static int decode_int(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                      long long *out)
{
    char got[PLAN_GOT_MAX];
    const char *g = plan_got_text(c, path, v, got);
    if (f->kind == K_U64) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return plan_fail(c, path, "must be a non-negative integer (got %s)", g);
    } else if (!json_is_integer(v) && (f->flags & AUTO_OK)) {
        return plan_fail(c, path, "must be an integer or \"auto\" (got %s)", g);
    } else if (!json_is_integer(v)) {
        return plan_fail(c, path, "must be an integer (got %s)", g);
    }
    long long i = json_integer_value(v);
    if (f->imax == INT_MAX && i < f->imin)
        return plan_fail(c, path, "must be >= %lld (got %s)", f->imin, g);
    if (f->imax == INT_MAX && i > f->imax)
        return plan_fail(c, path, "must be <= %lld (got %s)", f->imax, g);
    if (i < f->imin || i > f->imax)
        return plan_fail(c, path, "must be in [%lld, %lld] (got %s)", f->imin, f->imax, g);
    *out = i;
    return 0;
}

static int decode_real(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                       double *out)
{
    char got[PLAN_GOT_MAX];
    const char *g = plan_got_text(c, path, v, got);
    if (!json_is_number(v)) return plan_fail(c, path, "must be a number (got %s)", g);
    double x = json_number_value(v);
    bool low = f->rmin_open ? x > f->rmin : x >= f->rmin;
    bool high = isinf(f->rmax) || (f->rmax_open ? x < f->rmax : x <= f->rmax);
    if (low && high) {
        *out = x;
        return 0;
    }
    if (isinf(f->rmax))
        return plan_fail(c, path, "must be %s %g (got %s)", f->rmin_open ? ">" : ">=", f->rmin, g);
    return plan_fail(c, path, "must be in %c%g, %g%c (got %s)", f->rmin_open ? '(' : '[', f->rmin,
                f->rmax, f->rmax_open ? ')' : ']', g);
}

static int decode_string(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                         struct plan *p)
{
    char got[PLAN_GOT_MAX], rule[256] = "must be a string";
    const char *g = plan_got_text(c, path, v, got);
    if (f->names) one_of(rule, sizeof rule, f->names);
    if (!json_is_string(v)) return plan_fail(c, path, "%s (got %s)", rule, g);
    const char *s = json_string_value(v);
    if (f->names && name_index(f->names, s) < 0) return plan_fail(c, path, "%s (got %s)", rule, g);
    if (s[0] == '\0') return plan_fail(c, path, "must not be empty");
    if (f->kind == K_ENUM) {
        put_int(p, f->offset, name_index(f->names, s));
        return 0;
    }
    char **dst = (char **)((char *)p + f->offset);
    if (f->kind == K_PATH && !(f->flags & KEEP_RELATIVE) && s[0] != '/') {
        const struct entry *e = find_entry(c, path);
        const char *base = e && e->origin >= 0 ? ctx_cwd(c) : ctx_base_dir(c);
        if (!base) return -1;
        *dst = resolve(base, s);
    } else {
        *dst = dup_n(s, strlen(s));
    }
    return *dst ? 0 : out_of_memory(c);
}

static int decode_value(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                        struct plan *p, bool has_init)
{
    char got[PLAN_GOT_MAX];
    char *dst = (char *)p + f->offset;
    long long i = 0;
    double x = 0;
    switch (f->kind) {
    case K_SECTION:
        if (!json_is_object(v))
            return plan_fail(c, path, "must be an object (got %s)", plan_got_text(c, path, v, got));
        if (f->flags & OPTIONAL) *(bool *)dst = true;
        return decode_object(c, v, f->fields, path, p, has_init);
    case K_INT:
        if ((f->flags & AUTO_OK) && json_is_string(v) &&
            strcmp(json_string_value(v), "auto") == 0) {
            *(int *)dst = PLAN_AUTO;
            return 0;
        }
        if (decode_int(c, f, v, path, &i)) return -1;
        *(int *)dst = (int)i;
        return 0;
    case K_U64:
        if (decode_int(c, f, v, path, &i)) return -1;
        *(uint64_t *)dst = (uint64_t)i;
        return 0;
    case K_INTS: {
        struct plan_ints *list = (struct plan_ints *)dst;
        if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > PLAN_MAX_STAGES)
            return plan_fail(c, path, "must be a list of 1 to %d integers (got %s)", PLAN_MAX_STAGES,
                        plan_got_text(c, path, v, got));
        list->n = 0;
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e)
        {
            char epath[256];
            snprintf(epath, sizeof epath, "%s[%zu]", path, k);
            if (decode_int(c, f, e, epath, &i)) return -1;
            list->v[list->n++] = (int)i;
        }
        return 0;
    }
    case K_REAL:
        if (decode_real(c, f, v, path, &x)) return -1;
        *(double *)dst = x;
        return 0;
    case K_BOOL:
        if (!json_is_boolean(v))
            return plan_fail(c, path, "must be true or false (got %s)", plan_got_text(c, path, v, got));
        *(bool *)dst = json_is_true(v);
        return 0;
    case K_STRING:
    case K_PATH:
    case K_ENUM:
        return decode_string(c, f, v, path, p);
    }
    return 0;
}

static int check_unknown_keys(struct plan_ctx *c, json_t *obj, const struct field *fields,
                              const char *path)
{
    const char *key, *bad = NULL;
    json_t *value;
    int bad_at = INT_MAX;
    json_object_foreach(obj, key, value)
    {
        if (find_field(fields, key)) continue;
        char *kp = join(path, key);
        if (!kp) return out_of_memory(c);
        int at = find_entry_index(c, kp);
        free(kp);
        if (!bad || (at >= 0 && at < bad_at)) bad = key, bad_at = at < 0 ? INT_MAX : at;
    }
    if (!bad) return 0;
    char hint[600];
    unknown_key_hint(fields, path, bad, hint, sizeof hint);
    char *kp = join(path, bad);
    if (!kp) return out_of_memory(c);
    plan_fail(c, kp, "unknown key (%s)", hint);
    free(kp);
    return -1;
}

/* obj: the object at path, or NULL when absent (then every field gets its default). */
static int decode_object(struct plan_ctx *c, json_t *obj, const struct field *fields, const char *path,
                         struct plan *p, bool has_init)
{
    if (obj) {
        if (check_unknown_keys(c, obj, fields, path)) return -1;
        for (const struct field *f = fields; f->name; f++) {
            json_t *v = json_object_get(obj, f->name);
            if (required(f, has_init) && (!v || json_is_null(v)))
                return plan_fail(c, path, "missing required key \"%s\"", f->name);
        }
    }
    for (const struct field *f = fields; f->name; f++) {
        char fpath[64];
        snprintf(fpath, sizeof fpath, "%s%s%s", path, *path ? "." : "", f->name);
        json_t *v = obj ? json_object_get(obj, f->name) : NULL;
        int rc = v && !json_is_null(v) ? decode_value(c, f, v, fpath, p, has_init)
                                       : set_default(c, f, fpath, p, has_init);
        if (rc) return -1;
    }
    return 0;
}

/* ---- loading ----------------------------------------------------------------------------- */

static struct plan *load(const char *text, size_t text_bytes, const char *source,
                         const char *base_dir, const char *const *overrides, int n_overrides,
                         struct plait_error *err)
{
    struct plan_ctx c = {.source = source ? source : "(plan text)",
                    .overrides = overrides,
                    .base_arg = base_dir,
                    .err = err};
    json_t *root = NULL;
    struct plan *p = calloc(1, sizeof *p);
    if (!p || !(p->source = dup_n(c.source, strlen(c.source)))) {
        out_of_memory(&c);
        goto fail;
    }
    if (!text) {
        error_set(err, "%s: no plan text", c.source);
        goto fail;
    }
    const char *nul = memchr(text, '\0', text_bytes);
    if (nul) { /* jansson may stop there; the scanner certainly would */
        int line = 1, column = 1;
        for (const char *q = text; q < nul; q++) {
            column = *q == '\n' ? 1 : column + 1;
            line += *q == '\n';
        }
        error_set(err, "%s:%d:%d: invalid JSON: NUL byte", c.source, line, column);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb(text, text_bytes, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, "%s:%d:%d: invalid JSON: %s", c.source, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (scan(&c, text, -1, "", 0)) goto fail;
    if (n_overrides > 0 && !overrides) {
        error_set(err, "%s: %d overrides but no array", c.source, n_overrides);
        goto fail;
    }
    for (int i = 0; i < n_overrides; i++)
        if (apply_override(&c, root, i)) goto fail;
    if (!json_is_object(root)) {
        top_level_error(&c, root);
        goto fail;
    }
    bool has_init = plan_given(root, "model", "init") != NULL;
    if (decode_object(&c, root, root_fields, "", p, has_init)) goto fail;
    if (plan_check_rules(&c, root, p)) goto fail;
    goto out;
fail:
    plan_free(p);
    p = NULL;
out:
    json_decref(root);
    for (int i = 0; i < c.n_entries; i++) {
        free(c.entries[i].path);
        free(c.entries[i].raw);
    }
    free(c.entries);
    free(c.base_dir);
    free(c.cwd);
    return p;
}

struct plan *plan_load_text(const char *text, const char *source, const char *base_dir,
                            const char *const *overrides, int n_overrides, struct plait_error *err)
{
    return load(text, text ? strlen(text) : 0, source, base_dir, overrides, n_overrides, err);
}

struct plan *plan_load(const char *path, const char *const *overrides, int n_overrides,
                       struct plait_error *err)
{
    char *text = NULL, *dir = NULL;
    struct plan *p = NULL;
    FILE *f = NULL;
    if (!path) {
        error_set(err, "plan_load: no path");
        goto out;
    }
    f = fopen(path, "rb");
    if (!f) {
        error_errno(err, "%s", path);
        goto out;
    }
    size_t cap = 4096, n = 0;
    text = malloc(cap);
    for (;;) {
        if (!text) {
            error_set(err, "%s: out of memory", path);
            goto out;
        }
        n += fread(text + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = realloc(text, cap *= 2);
        if (!bigger) free(text);
        text = bigger;
    }
    if (ferror(f)) {
        error_errno(err, "%s", path);
        goto out;
    }
    text[n] = '\0';
    const char *slash = strrchr(path, '/');
    if (slash && !(dir = dup_n(path, slash == path ? 1 : (size_t)(slash - path)))) {
        error_set(err, "%s: out of memory", path);
        goto out;
    }
    p = load(text, n, path, dir, overrides, n_overrides, err);
out:
    if (f) fclose(f);
    free(text);
    free(dir);
    return p;
}

void plan_free(struct plan *plan)
{
    if (!plan) return;
    free(plan->source);
    free(plan->model.arch);
    free(plan->model.init);
    free(plan->data.train);
    free(plan->data.val);
    free(plan->data.tokenizer);
    free(plan->checkpoint.dir);
    free(plan->parallel.offload_dir);
    free(plan->train.tensorboard);
    free(plan->sample.prompt);
    free(plan);
}

/* ---- writing: the plan as jansson values, dumped by jansson ------------------------------ */

/* A scalar field's value (NULL: out of memory, or a path that is not UTF-8). */
static json_t *value_json(const struct field *f, const struct plan *p)
{
    const char *at = (const char *)p + f->offset;
    switch (f->kind) {
    case K_INT:
        if ((f->flags & AUTO_OK) && *(const int *)at == PLAN_AUTO) return json_string("auto");
        return json_integer(*(const int *)at);
    case K_U64:
        return json_integer((json_int_t) * (const uint64_t *)at); /* at most LLONG_MAX */
    case K_INTS: {
        const struct plan_ints *list = (const struct plan_ints *)at;
        json_t *a = list->n ? json_array() : json_null();
        for (int k = 0; a && k < list->n; k++)
            if (json_array_append_new(a, json_integer(list->v[k]))) {
                json_decref(a);
                return NULL;
            }
        return a;
    }
    case K_REAL:
        return json_real(*(const double *)at);
    case K_BOOL:
        return json_boolean(*(const bool *)at);
    case K_STRING:
    case K_PATH:
        return *(char *const *)at ? json_string(*(char *const *)at) : json_null();
    case K_ENUM: {
        int v = get_int(p, f->offset), n = 0;
        while (f->names[n]) n++;
        return v >= 0 && v < n ? json_string(f->names[v]) : json_null();
    }
    case K_SECTION:
        break;
    }
    return json_null();
}

/* Whether f is an optional section the plan does not have (not written back). */
static bool absent_section(const struct field *f, const struct plan *p)
{
    return f->kind == K_SECTION && (f->flags & OPTIONAL) &&
           !*(const bool *)((const char *)p + f->offset);
}

static json_t *object_json(const struct field *fields, const struct plan *p)
{
    json_t *o = json_object();
    for (const struct field *f = fields; o && f->name; f++)
        if (!absent_section(f, p) &&
            json_object_set_new(
                o, f->name, f->kind == K_SECTION ? object_json(f->fields, p) : value_json(f, p))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* The shortest text that reads back as x, with a '.' or an exponent so it reads as a real. */
static void shortest_real(char buf[40], double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, 40, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    char *e = strchr(buf, 'e'); /* 1e-08 -> 1e-8, 1e+20 -> 1e20 */
    if (e) {
        char *digits = e + 1, *from = e + 1;
        if (*from == '-')
            digits++, from++;
        else if (*from == '+')
            from++;
        while (*from == '0' && from[1]) from++;
        memmove(digits, from, strlen(from) + 1);
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
}

/* jansson prints every real of a document at one precision (17 digits: 0.0006 as
 * 0.00059999999999999995, 0.1 as 0.10000000000000001); plan.json is read by people, so each
 * real of jansson's text is rewritten as the shortest text that reads back as itself. The
 * text is JSON: a number is a token outside the strings, a real one with '.' or an exponent. */
static char *shorten_reals(char *json)
{
    size_t n = strlen(json), len = 0;
    char *out = json ? malloc(2 * n + 1) : NULL; /* a shortened real is never longer */
    for (size_t i = 0; out && i < n;) {
        if (json[i] == '"') { /* a string, to its closing quote */
            size_t j = i + 1;
            while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
            memcpy(out + len, json + i, j + 1 - i);
            len += j + 1 - i, i = j + 1;
        } else if (json[i] == '-' || (json[i] >= '0' && json[i] <= '9')) {
            size_t j = i + strspn(json + i, "-+0123456789.eE");
            char token[64], real[40];
            snprintf(token, sizeof token, "%.*s", (int)(j - i), json + i);
            bool is_real = strpbrk(token, ".eE") && j - i < sizeof token;
            if (is_real) shortest_real(real, strtod(token, NULL));
            const char *put = is_real ? real : json + i;
            size_t k = is_real ? strlen(real) : j - i;
            memcpy(out + len, put, k);
            len += k, i = j;
        } else {
            out[len++] = json[i++];
        }
    }
    if (out) out[len] = '\0';
    free(json);
    return out;
}

/* A scalar field's value as plan_to_json writes it. */
static char *value_text(const struct field *f, const struct plan *p)
{
    json_t *v = value_json(f, p);
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(v);
    return text ? shorten_reals(text) : NULL;
}

/* The plan's text with the given jansson flags (indented or compact). */
static char *plan_text(const struct plan *plan, size_t flags)
{
    if (!plan) return NULL;
    json_t *root = object_json(root_fields, plan);
    char *text = root ? json_dumps(root, flags | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
                      : NULL;
    json_decref(root);
    return text ? shorten_reals(text) : NULL;
}

/* Appends the differences under fields (at path) to out[*n..max). */
static void diff_fields(const struct field *fields, const char *path, const struct plan *a,
                        const struct plan *b, struct plan_change *out, int max, int *n)
{
    for (const struct field *f = fields; f->name; f++) {
        char fpath[sizeof out->path];
        snprintf(fpath, sizeof fpath, "%s%s%s", path, *path ? "." : "", f->name);
        if (f->kind == K_SECTION) {
            diff_fields(f->fields, fpath, a, b, out, max, n);
            continue;
        }
        char *ta = value_text(f, a), *tb = value_text(f, b);
        bool differ = !ta || !tb || strcmp(ta, tb) != 0;
        if (differ && *n < max) {
            struct plan_change *c = &out[*n];
            snprintf(c->path, sizeof c->path, "%s", fpath);
            snprintf(c->before, sizeof c->before, "%s", ta ? ta : "?");
            snprintf(c->after, sizeof c->after, "%s", tb ? tb : "?");
            c->may_change = (f->flags & MAY_CHANGE) != 0;
        }
        if (differ) (*n)++;
        free(ta);
        free(tb);
    }
}

int plan_diff(const struct plan *before, const struct plan *after, struct plan_change *out, int max)
{
    int n = 0;
    diff_fields(root_fields, "", before, after, out, max, &n);
    return n;
}

char *plan_to_json_line(const struct plan *plan)
{
    return plan_text(plan, JSON_COMPACT);
}

char *plan_to_json(const struct plan *plan)
{
    char *text = plan_text(plan, JSON_INDENT(2)), *line = NULL;
    if (text && (line = realloc(text, strlen(text) + 2))) strcat(line, "\n");
    if (!line) free(text);
    return line;
}

/* ---- the schema, as text ----------------------------------------------------------------- */

/* one field's line: path, type, what it may be, its default */
/* What a field means, where its type and default do not say it (plait help plan). */
static const struct {
    const char *path, *text;
} field_help[] = {
    {"model.moe.experts", "a mixture of experts' routed experts (model.moe absent: dense)"},
    {"model.moe.top_k", "the experts a token goes to (its router's k largest probabilities)"},
    {"model.moe.every", "an MoE block replaces the MLP in layers i with i % every = every - 1"},
    {"model.moe.shared_experts", "dense experts every token also passes through (gate 1)"},
    {"model.moe.capacity_factor",
     "0: no dropping; else an expert takes at most ceil(factor·k·N/E) of a micro-batch's N "
     "tokens, in token order"},
    {"model.moe.aux_loss", "the load-balancing loss's coefficient"},
    {"model.moe.router_z_loss", "the router z-loss's coefficient"},
    {"model.moe.ffn_hidden", "each expert's MLP width"},
    {"parallel.ep",
     "expert parallelism: each MoE layer's experts spread over ep ranks (E/ep a rank); an ep "
     "group is ep consecutive data-parallel ranks, cp folded in (a dp rank's cp ranks "
     "consecutive: ep_rank = (dp_rank·cp + cp_rank) % ep); divides model.moe.experts and "
     "parallel.dp × parallel.cp"},
};

static const char *help_of(const char *path)
{
    for (size_t i = 0; i < sizeof field_help / sizeof *field_help; i++)
        if (!strcmp(field_help[i].path, path)) return field_help[i].text;
    return NULL;
}

/* in: the optional section the field is in (its required fields are required there), or
 * NULL */
static void print_field(FILE *out, const struct field *f, const char *path, const char *in)
{
    char what[256] = "", def[96] = "";
    switch (f->kind) {
    case K_INT:
    case K_U64:
        snprintf(what, sizeof what, "int %lld..%lld%s", f->imin, f->imax,
                 f->flags & AUTO_OK ? " or \"auto\"" : "");
        if (!(f->flags & (REQ | REQ_NO_INIT)))
            snprintf(def, sizeof def, "%s", "(from other fields)");
        if (!(f->flags & (REQ | REQ_NO_INIT)) && f->idef >= f->imin)
            snprintf(def, sizeof def, "%lld", f->idef);
        if ((f->flags & AUTO_OK) && f->idef == PLAN_AUTO) snprintf(def, sizeof def, "\"auto\"");
        break;
    case K_REAL:
        if (isinf(f->rmax))
            snprintf(what, sizeof what, "real %s %g", f->rmin_open ? ">" : ">=", f->rmin);
        else
            snprintf(what, sizeof what, "real in %s%g, %g%s", f->rmin_open ? "(" : "[", f->rmin,
                     f->rmax, f->rmax_open ? ")" : "]");
        snprintf(def, sizeof def, "%g", f->rdef);
        break;
    case K_BOOL:
        snprintf(what, sizeof what, "true or false");
        snprintf(def, sizeof def, "%s", f->idef ? "true" : "false");
        break;
    case K_ENUM:
    case K_STRING:
        if (f->names) {
            char names[256];
            one_of(names, sizeof names, f->names); /* "must be one of ..." */
            snprintf(what, sizeof what, "%s", strncmp(names, "must be ", 8) ? names : names + 8);
        } else {
            snprintf(what, sizeof what, "string");
        }
        if (f->kind == K_ENUM && f->idef >= 0) snprintf(def, sizeof def, "\"%s\"", f->names[f->idef]);
        if (f->kind == K_STRING && f->sdef) {
            char *q = quote(f->sdef); /* as JSON: "\n" stays two characters */
            snprintf(def, sizeof def, "%s", q ? q : "?");
            free(q);
        }
        break;
    case K_PATH:
        snprintf(what, sizeof what, "path");
        if (f->sdef) snprintf(def, sizeof def, "\"%s\"", f->sdef);
        break;
    case K_INTS:
        snprintf(what, sizeof what, "list of ints");
        break;
    case K_SECTION:
        return;
    }
    const char *help = help_of(path);
    fprintf(out, "  %-32s %s%s%s%s%s%s%s%s%s\n", path, what, *def ? "; default " : "", def,
            f->flags & (REQ | REQ_NO_INIT) ? "; required" : "",
            in && (f->flags & REQ) ? " in " : "", in && (f->flags & REQ) ? in : "",
            f->flags & MAY_CHANGE ? "; may change on resume" : "", help ? "; " : "",
            help ? help : "");
}

static void print_fields(FILE *out, const struct field *fields, const char *prefix,
                         const char *in)
{
    for (const struct field *f = fields; f->name; f++) {
        char path[128];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", f->name);
        if (f->kind == K_SECTION)
            print_fields(out, f->fields, path, f->flags & OPTIONAL ? path : in);
        else
            print_field(out, f, path, in);
    }
}

void plan_fields_print(FILE *out)
{
    print_fields(out, root_fields, "", NULL);
}

/* ---- enum names -------------------------------------------------------------------------- */

static const char *enum_name(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : "unknown";
}

int plan_resumable(const struct plan *before, const struct plan *after, char *notes,
                   size_t notes_bytes, struct plait_error *err)
{
    enum { MAX = 64 };
    struct plan_change ch[MAX];
    int n = plan_diff(before, after, ch, MAX), refused = 0;
    /* micro-batches per data-parallel rank may change with dp, if the global
     * batch stays: the same windows make each step (data_next_of) */
    const struct plan_parallel *pb = &before->parallel, *pa = &after->parallel;
    bool known = pb->dp != PLAN_AUTO && pa->dp != PLAN_AUTO;
    int64_t global_before = (int64_t)before->batch.micro_batch * before->batch.grad_accum * pb->dp,
            global_after = (int64_t)after->batch.micro_batch * after->batch.grad_accum * pa->dp;
    for (int i = 0; i < n && i < MAX; i++)
        if (!strcmp(ch[i].path, "batch.grad_accum") && known && global_before == global_after)
            ch[i].may_change = true;
    char list[900] = "";
    size_t len = 0;
    if (notes_bytes) notes[0] = '\0';
    for (int pass = 0; pass < 2; pass++) { /* first what may not change, then what may */
        len = 0;
        list[0] = '\0';
        for (int i = 0; i < n && i < MAX; i++) {
            if (ch[i].may_change != (pass == 1)) continue;
            refused += pass == 0;
            int k = snprintf(list + len, sizeof list - len, "%s%s %s -> %s", len ? ", " : "",
                             ch[i].path, ch[i].before, ch[i].after);
            if (k < 0 || (size_t)k >= sizeof list - len) break;
            len += (size_t)k;
        }
        if (pass == 0 && refused) return error_set(err, "%s", list);
        if (pass == 1 && notes_bytes) snprintf(notes, notes_bytes, "%s", list);
    }
    /* dp alone may change the global batch: the steps that follow read more or
     * fewer sequences than the checkpoint's run did, and the user should know */
    if (known && global_before != global_after && notes_bytes) {
        int64_t per = (int64_t)after->batch.micro_batch * pa->dp;
        char keep[64] = "";
        if (global_before % per == 0)
            snprintf(keep, sizeof keep, "; batch.grad_accum %lld keeps it",
                     (long long)(global_before / per));
        size_t used = strlen(notes);
        snprintf(notes + used, notes_bytes - used,
                 "%sthe global batch (micro_batch × grad_accum × dp) %lld -> %lld sequences a "
                 "step%s",
                 used ? "; " : "", (long long)global_before, (long long)global_after, keep);
    }
    return 0;
}

int64_t plan_ranks(const struct plan *plan)
{
    const struct plan_parallel *par = &plan->parallel;
    if (par->tp == PLAN_AUTO || par->pp == PLAN_AUTO || par->dp == PLAN_AUTO) return 0;
    return (int64_t)par->tp * par->cp * par->pp * par->dp;
}

int plan_dp_shard(const struct plan_parallel *par, int dp)
{
    if (par->dp_shard != PLAN_AUTO) return par->dp_shard;
    if (par->dp_replicate != PLAN_AUTO) return dp / par->dp_replicate;
    return dp;
}

int plan_zero_slices(const struct plan_parallel *par, int shard)
{
    return par->ep > 1 && par->zero > 0 && shard % par->ep == 0 ? shard / par->ep : shard;
}

const char *plan_precision_name(enum plan_precision p)
{
    return enum_name(precision_names, PLAN_PRECISIONS, (int)p);
}

int plan_precision_parse(const char *name, enum plan_precision *out)
{
    for (int i = 0; i < PLAN_PRECISIONS; i++)
        if (!strcmp(name, precision_names[i])) {
            *out = (enum plan_precision)i;
            return 0;
        }
    return -1;
}

const char *plan_fp8_scaling_name(enum plan_fp8_scaling s)
{
    return s == PLAN_FP8_NONE ? "none" : enum_name(fp8_scaling_names, 2, (int)s);
}

const char *plan_recompute_name(enum plan_recompute r)
{
    return enum_name(recompute_names, 3, (int)r);
}

const char *plan_schedule_name(enum plan_schedule s)
{
    return enum_name(schedule_names, 4, (int)s);
}

const char *plan_pipeline_name(enum plan_pipeline s)
{
    return enum_name(pipeline_names, 5, s);
}

const char *plan_backend_name(enum plan_backend b)
{
    return enum_name(backend_names, 3, b);
}

const char *plan_offload_name(enum plan_offload o)
{
    return enum_name(offload_names, 3, (int)o);
}

const char *plan_device_name(enum plan_device d)
{
    return enum_name(device_names, 3, (int)d);
}
