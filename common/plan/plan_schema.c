/* plan_schema.c — plan.json's schema: every field of every section, its type, range or
 * names, default and flags (the table plan.c's loader, plan_write.c's writer and
 * plan_help.c's text walk), and the names of the plan's enums as plan.json spells them.
 * Reading a plan is plan.c's; the rules between fields are plan_rules.c's. */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/formats/rundir.h"  // RUNDIR_CHECKPOINTS (checkpoint.dir's default)
#include "common/plan/plan_check.h" // WSD_DECAY_FRACTION (optimizer.decay_fraction's default)
#include "common/plan/plan_schema.h"

/* ---- the schema ------------------------------------------------------------------------- */

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
    /* The defaults of these three are computed in plan_check_rules (from vocab, seq_len or
     * init). */
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

const struct field plan_root_fields[] = {
    SECTION("model", model_fields, REQ),
    SECTION("data", data_fields, REQ),
    SECTION("batch", batch_fields, 0),
    SECTION("optimizer", optimizer_fields, 0),
    INT_FIELD("steps", steps, 1, INT_MAX, 0, REQ | MAY_CHANGE),
    ENUM_FIELD("precision", precision, precision_names, PLAN_PRECISION_FP32, 0),
    /* null unless precision is fp8, where plan_check_rules makes it "tensor" */
    ENUM_FIELD("fp8_scaling", fp8_scaling, fp8_scaling_names, PLAN_FP8_NONE, 0),
    ENUM_FIELD("recompute", recompute, recompute_names, PLAN_RECOMPUTE_NONE, MAY_CHANGE),
    REAL_FIELD("logits_chunk_mb", logits_chunk_mb, 0, false, 1e6, false, 512.0, MAY_CHANGE),
    SECTION("checkpoint", checkpoint_fields, 0),
    SECTION("parallel", parallel_fields, 0),
    SECTION("sample", sample_fields, 0),
    SECTION("train", train_fields, 0),
    END,
};

/* ---- enum names -------------------------------------------------------------------------- */

static const char *enum_name(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : "unknown";
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
