/* plan_rules.c — the rules between a plan's fields, after plan.c decoded them
 * one by one: model.init (an llm.c file or a Hugging Face directory) fixing
 * the model, the defaults derived from other fields, the fields each
 * model.arch has, and what a layout, a schedule, ZeRO and the batch need of
 * each other. Each refusal names the field and the fields the rule reads
 * (plan_check.h). */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/hf_model.h"     // hf_config_read (model.init, a Hugging Face directory)
#include "common/formats/llmc.h"         // llmc_read_model_header
#include "common/gpt2/gpt2_layout.h"     // gpt2_layout (the size check)
#include "common/plan/plan_check.h"

/* ---- model.init, derived defaults and the rules between fields -------------------------- */

/* The value at section.key (section NULL: top level), NULL when absent or null. */
json_t *plan_given(json_t *root, const char *section, const char *key)
{
    json_t *obj = section ? json_object_get(root, section) : root;
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

/* One integer of the model the init file fixes: given in the plan, it must
 * agree; else it is set. */
struct init_field {
    const char *key;
    int *field;
    int value;
};

static int apply_init_fields(struct plan_ctx *c, json_t *root, const struct init_field *f, size_t n,
                             const char *name)
{
    for (size_t k = 0; k < n; k++) {
        char path[64];
        snprintf(path, sizeof path, "model.%s", f[k].key);
        if (plan_given(root, "model", f[k].key) && *f[k].field != f[k].value)
            return plan_fail_rule(c, path, "model.init", "%d contradicts model.init (%s has %d)",
                             *f[k].field, name, f[k].value);
        *f[k].field = f[k].value;
    }
    return 0;
}

/* seq_len: the init's max T unless given, and never above it. */
static int apply_init_seq_len(struct plan_ctx *c, json_t *root, struct plan *p, const char *name)
{
    if (!plan_given(root, "model", "seq_len"))
        p->model.seq_len = p->model.max_seq_len;
    else if (p->model.seq_len > p->model.max_seq_len)
        return plan_fail_rule(c, "model.seq_len", "model.init",
                         "%d exceeds the max sequence length of model.init (%s has %d)",
                         p->model.seq_len, name, p->model.max_seq_len);
    return 0;
}

/* model.init a Hugging Face directory: its config.json fixes the model. */
static int apply_hf_init(struct plan_ctx *c, json_t *root, struct plan *p, const char *name)
{
    struct plait_error hf_err = {.text = ""};
    struct hf_config h;
    struct plan_model *m = &p->model;
    if (hf_config_read(m->init, &h, &hf_err)) return plan_fail(c, "model.init", "%s", hf_err.text);
    const char *arch = h.llama ? "llama" : "gpt2";
    if (plan_given(root, "model", "arch") && strcmp(m->arch, arch) != 0)
        return plan_fail_rule(c, "model.arch", "model.init",
                         "\"%s\" contradicts model.init (%s is a %s, %s)", m->arch, name, arch,
                         h.arch);
    char *copy = strdup(arch);
    if (!copy) return plan_fail(c, "model.init", "out of memory");
    free(m->arch);
    m->arch = copy;
    const struct init_field f[] = {
        {"layers", &m->layers, h.layers},     {"heads", &m->heads, h.heads},
        {"hidden", &m->hidden, h.hidden},     {"vocab", &m->vocab, h.vocab},
        {"max_seq_len", &m->max_seq_len, h.max_seq_len},
        {"kv_heads", &m->kv_heads, h.kv_heads}, {"ffn_hidden", &m->ffn_hidden, h.ffn_hidden}};
    if (apply_init_fields(c, root, f, h.llama ? 7 : 5, name)) return -1;
    if (h.llama) {
        m->rope_theta = plan_given(root, "model", "rope_theta") ? m->rope_theta : h.rope_theta;
        m->norm_eps = plan_given(root, "model", "norm_eps") ? m->norm_eps : h.norm_eps;
        if (plan_given(root, "model", "tie_embeddings") && m->tie_embeddings != h.tied)
            return plan_fail_rule(c, "model.tie_embeddings", "model.init",
                             "contradicts model.init (%s has tie_word_embeddings %s)", name,
                             h.tied ? "true" : "false");
        m->tie_embeddings = h.tied;
    }
    if (!plan_given(root, "model", "padded_vocab")) m->padded_vocab = (m->vocab + 127) / 128 * 128;
    return apply_init_seq_len(c, root, p, name);
}

static int apply_init(struct plan_ctx *c, json_t *root, struct plan *p)
{
    struct plait_error llmc_err = {.text = ""};
    struct llmc_model_header h;
    const char *init = p->model.init;
    const char *name = strrchr(init, '/') ? strrchr(init, '/') + 1 : init;
    if (hf_is_model_dir(init)) return apply_hf_init(c, root, p, name);
    if (llmc_read_model_header(init, &h, &llmc_err))
        return plan_fail(c, "model.init", "%s", llmc_err.text);
    if (h.version == LLMC_MODEL_VERSION_EXPERTS_FP32)
        return plan_fail(c, "model.init",
                         "%s is the model.bin of a plait checkpoint of a model with experts: "
                         "model.init takes no experts yet",
                         name);
    if (h.version == LLMC_MODEL_VERSION_LLAMA_FP32)
        return plan_fail(c, "model.init",
                    "%s is the model.bin of a plait checkpoint of a Llama: plait ckpt export "
                    "--hf makes the Hugging Face directory model.init takes",
                    name);
    if (plan_model_is_llama(&p->model))
        return plan_fail_rule(c, "model.init", "model.arch",
                         "%s is an llm.c GPT-2 file; a llama starts from a Hugging Face "
                         "directory (config.json and safetensors) or from random weights",
                         name);
    const struct init_field f[] = {
        {"layers", &p->model.layers, h.layers},
        {"heads", &p->model.heads, h.heads},
        {"hidden", &p->model.hidden, h.hidden},
        {"vocab", &p->model.vocab, h.vocab},
        {"padded_vocab", &p->model.padded_vocab, h.padded_vocab},
        {"max_seq_len", &p->model.max_seq_len, h.max_seq_len},
    };
    if (apply_init_fields(c, root, f, sizeof f / sizeof *f, name)) return -1;
    return apply_init_seq_len(c, root, p, name);
}

/* The fixed degrees and their product stay within PLAN_MAX_RANKS (counted in 64 bits). */
static int check_ranks(struct plan_ctx *c, const struct plan *p)
{
    const struct {
        const char *path;
        int degree;
    } d[] = {{"parallel.tp", p->parallel.tp},
             {"parallel.cp", p->parallel.cp},
             {"parallel.pp", p->parallel.pp},
             {"parallel.dp", p->parallel.dp}};
    int64_t ranks = 1;
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++) {
        if (d[k].degree == PLAN_AUTO) continue;
        ranks *= d[k].degree; /* < 2^24 · 2^31: no overflow in 64 bits */
        if (ranks > PLAN_MAX_RANKS)
            return plan_fail_rule(c, d[k].path, "parallel.tp parallel.cp parallel.pp parallel.dp",
                             "%d makes tp × cp × pp × dp = %lld ranks, more than plait runs (%d)",
                             d[k].degree, (long long)ranks, PLAN_MAX_RANKS);
    }
    return 0;
}

/* The model's parameters (with gradients and moments) must be addressable;
 * the error names the field that makes them overflow. */
static int check_model_size(struct plan_ctx *c, json_t *root, const struct plan *p)
{
    const struct plan_model *m = &p->model;
    /* the plan's model (its architecture's tensors), grown one field at a time */
    struct gpt2_config cfg = gpt2_config_of_plan(m);
    cfg.max_seq_len = cfg.padded_vocab = cfg.layers = cfg.vocab = 1;
    if (cfg.llama) cfg.ffn_hidden = 1;
    struct gpt2_layout layout;
    const char *culprit = "model.hidden";
    int value = m->hidden;
    if (!gpt2_layout(&cfg, &layout) && cfg.llama)
        cfg.ffn_hidden = m->ffn_hidden, culprit = "model.ffn_hidden", value = m->ffn_hidden;
    if (!gpt2_layout(&cfg, &layout)) {
        cfg.layers = m->layers, culprit = "model.layers", value = m->layers;
        if (!gpt2_layout(&cfg, &layout)) {
            cfg.padded_vocab = m->padded_vocab, value = m->padded_vocab;
            culprit = plan_given(root, "model", "padded_vocab") ? "model.padded_vocab" : "model.vocab";
            if (!gpt2_layout(&cfg, &layout)) {
                cfg.max_seq_len = m->max_seq_len, value = m->max_seq_len;
                culprit = "model.max_seq_len";
                if (!gpt2_layout(&cfg, &layout)) return 0;
            }
        }
    }
    return plan_fail_rule(c, culprit,
                     "model.layers model.hidden model.vocab model.padded_vocab model.max_seq_len",
                     "%d makes the model too large to address (layers %d, hidden %d, padded vocab "
                     "%d, max seq len %d: more than 2^60 parameters)",
                     value, m->layers, m->hidden, m->padded_vocab, m->max_seq_len);
}

/* The learning-rate schedule's fields against each other (lr_schedule.h). */
static int check_lr_schedule(struct plan_ctx *c, json_t *root, const struct plan *p)
{
    char got[PLAN_GOT_MAX];
    const struct plan_optimizer *o = &p->optimizer;
    const char *name = plan_schedule_name(o->schedule);
    if (o->schedule == PLAN_SCHEDULE_CONSTANT && o->decay_steps)
        return plan_fail_rule(c, "optimizer.decay_steps", "optimizer.schedule",
                         "applies to a schedule that decays (cosine, linear, wsd), not "
                         "\"constant\"; remove it");
    if (o->schedule != PLAN_SCHEDULE_WSD && o->decay_fraction != WSD_DECAY_FRACTION)
        return plan_fail_rule(c, "optimizer.decay_fraction", "optimizer.schedule",
                         "applies to the wsd schedule only (got schedule \"%s\"); remove it",
                         name);
    const char *warmup = "optimizer.warmup_steps";
    json_t *wv = plan_given(root, "optimizer", "warmup_steps");
    if (o->schedule != PLAN_SCHEDULE_CONSTANT && o->decay_steps &&
        o->warmup_steps >= o->decay_steps)
        return plan_fail_rule(c, warmup, "optimizer.decay_steps",
                         "must be < optimizer.decay_steps (%d) (got %s)", o->decay_steps,
                         plan_got_text(c, warmup, wv, got));
    if (o->schedule != PLAN_SCHEDULE_CONSTANT && !o->decay_steps && o->warmup_steps >= p->steps)
        return plan_fail_rule(c, warmup, "steps optimizer.schedule",
                         "must be < steps (%d) with the %s schedule (got %s)", p->steps, name,
                         plan_got_text(c, warmup, wv, got));
    if (o->warmup_steps > p->steps)
        return plan_fail_rule(c, warmup, "steps", "must be <= steps (%d) (got %s)", p->steps,
                         plan_got_text(c, warmup, wv, got));
    return 0;
}

/* batch.global_batch: grad_accum follows from it where dp is a number (with dp "auto", the
 * layout's dp decides it: elastic_batch.h). Both given (plan.json as written holds both)
 * must agree. */
static int check_global_batch(struct plan_ctx *c, json_t *root, struct plan *p)
{
    struct plan_batch *b = &p->batch;
    int dp = p->parallel.dp == PLAN_AUTO ? 1 : p->parallel.dp;
    if (!b->global_batch) return 0;
    int64_t per = (int64_t)b->micro_batch * dp;
    bool accum = plan_given(root, "batch", "grad_accum") != NULL;
    char dp_text[16] = "a dp";
    if (p->parallel.dp != PLAN_AUTO) snprintf(dp_text, sizeof dp_text, "%d", dp);
    if (accum && (p->parallel.dp == PLAN_AUTO ? b->global_batch % (per * b->grad_accum) != 0
                                               : b->global_batch != per * b->grad_accum))
        return plan_fail_rule(c, "batch.global_batch", "batch.grad_accum batch.micro_batch parallel.dp",
                         "disagrees with batch.micro_batch × batch.grad_accum × parallel.dp "
                         "(%d × %d × %s) (got %d); give global_batch alone, grad_accum follows",
                         b->micro_batch, b->grad_accum, dp_text, b->global_batch);
    if (b->global_batch % per != 0)
        return plan_fail_rule(c, "batch.global_batch", "batch.micro_batch parallel.dp",
                         "must be a multiple of batch.micro_batch × parallel.dp (%d × %d = "
                         "%lld) (got %d)",
                         b->micro_batch, dp, (long long)per, b->global_batch);
    if (!accum) b->grad_accum = (int)(b->global_batch / per);
    return 0;
}

static int check_arch_rules(struct plan_ctx *c, json_t *root, struct plan *p);

/* The model's own dimensions against each other (after model.init filled them). */
static int check_model_rules(struct plan_ctx *c, json_t *root, struct plan *p)
{
    char got[PLAN_GOT_MAX];
    struct plan_model *m = &p->model;
    if (m->init) {
        if (apply_init(c, root, p)) return -1;
    } else {
        if (!plan_given(root, "model", "padded_vocab")) m->padded_vocab = (m->vocab + 127) / 128 * 128;
        if (!plan_given(root, "model", "max_seq_len")) m->max_seq_len = m->seq_len;
    }
    if (m->hidden % m->heads != 0)
        return plan_fail_rule(c, "model.heads", "model.hidden",
                         "must divide model.hidden (%d %% %d = %d)", m->hidden, m->heads,
                         m->hidden % m->heads);
    if (m->padded_vocab < m->vocab)
        return plan_fail_rule(
            c, "model.padded_vocab", "model.vocab", "must be >= model.vocab (%d) (got %s)",
            m->vocab, plan_got_text(c, "model.padded_vocab", plan_given(root, "model", "padded_vocab"), got));
    if (m->max_seq_len < m->seq_len)
        return plan_fail_rule(
            c, "model.max_seq_len", "model.seq_len", "must be >= model.seq_len (%d) (got %s)",
            m->seq_len, plan_got_text(c, "model.max_seq_len", plan_given(root, "model", "max_seq_len"), got));
    return check_arch_rules(c, root, p);
}

bool plan_model_is_llama(const struct plan_model *m)
{
    return m->arch && strcmp(m->arch, "llama") == 0;
}

/* A GPT-2's value of a llama field is fixed: absent or equal to it. */
static int gpt2_fixed(struct plan_ctx *c, json_t *root, const char *key, double value, double fixed,
                      const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "model.%s", key);
    if (!plan_given(root, "model", key) || value == fixed) return 0;
    return plan_fail_rule(c, path, "model.arch",
                     "applies to model.arch \"llama\": a gpt2 has %s (%g); remove it or set "
                     "model.arch to \"llama\" (got %g)",
                     what, fixed, value);
}

/* The fields one architecture has and the other does not, their defaults
 * and their rules (kernels/ops.h's Llama ops: hs even for rotary positions,
 * kv_heads dividing heads). */
static int check_arch_rules(struct plan_ctx *c, json_t *root, struct plan *p)
{
    struct plan_model *m = &p->model;
    if (!plan_model_is_llama(m)) {
        if (gpt2_fixed(c, root, "kv_heads", m->kv_heads, m->heads, "as many key/value heads as "
                                                                  "heads") ||
            gpt2_fixed(c, root, "ffn_hidden", m->ffn_hidden, 4.0 * m->hidden,
                       "an MLP 4·hidden wide") ||
            gpt2_fixed(c, root, "rope_theta", m->rope_theta, 10000.0,
                       "learned positions, no rotary base") ||
            gpt2_fixed(c, root, "norm_eps", m->norm_eps, 1e-5, "LayerNorms with epsilon"))
            return -1;
        if (plan_given(root, "model", "tie_embeddings") && !m->tie_embeddings)
            return plan_fail_rule(c, "model.tie_embeddings", "model.arch",
                             "applies to model.arch \"llama\": a gpt2's LM head is wte (llm.c's "
                             "files hold one); remove it or set model.arch to \"llama\" (got "
                             "false)");
        /* (a hidden above INT_MAX/4 makes a model check_model_size refuses) */
        m->ffn_hidden = m->hidden <= INT_MAX / 4 ? 4 * m->hidden : INT_MAX;
        m->kv_heads = m->heads, m->tie_embeddings = true;
        m->rope_theta = 10000.0, m->norm_eps = 1e-5;
        return 0;
    }
    if (!m->ffn_hidden)
        return plan_fail(c, "model.ffn_hidden", "is required for model.arch \"llama\" (the SwiGLU "
                                           "MLP's width, e.g. 8/3·hidden rounded)");
    if (!m->kv_heads) m->kv_heads = m->heads;
    if (m->heads % m->kv_heads != 0)
        return plan_fail_rule(c, "model.kv_heads", "model.heads",
                         "must divide model.heads (%d %% %d = %d)", m->heads, m->kv_heads,
                         m->heads % m->kv_heads);
    if ((m->hidden / m->heads) % 2 != 0)
        return plan_fail_rule(c, "model.heads", "model.hidden model.arch",
                         "gives a head size of %d: rotary positions need an even one",
                         m->hidden / m->heads);
    return 0;
}

/* Validation data and the precision's own fields. */
static int check_data_and_precision(struct plan_ctx *c, json_t *root, struct plan *p)
{
    char got[PLAN_GOT_MAX];
    if (p->data.val_every > 0 && !p->data.val)
        return plan_fail_rule(c, "data.val_every", "data.val", "must be 0 without data.val (got %s)",
                         plan_got_text(c, "data.val_every", plan_given(root, "data", "val_every"), got));
    if (p->precision != PLAN_PRECISION_FP8 && plan_given(root, NULL, "fp8_scaling"))
        return plan_fail_rule(c, "fp8_scaling", "precision",
                         "needs precision \"fp8\" (got precision \"%s\"); remove it or set "
                         "precision to \"fp8\"",
                         plan_precision_name(p->precision));
    if (p->precision == PLAN_PRECISION_FP8 && p->fp8_scaling == PLAN_FP8_NONE)
        p->fp8_scaling = PLAN_FP8_TENSOR;
    return 0;
}

/* Tensor parallelism splits the heads, the key/value heads, the (padded) vocabulary and
 * the MLP's width; pipeline parallelism needs a layer per stage. */
static int check_split_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_model *m = &p->model;
    int tp = p->parallel.tp, pp = p->parallel.pp;
    if (tp != PLAN_AUTO && m->heads % tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.heads", "must divide model.heads (%d %% %d = %d)",
                         m->heads, tp, m->heads % tp);
    if (tp != PLAN_AUTO && m->padded_vocab % tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.padded_vocab model.vocab",
                         "must divide model.padded_vocab (%d %% %d = %d)", m->padded_vocab, tp,
                         m->padded_vocab % tp);
    if (pp != PLAN_AUTO && pp > m->layers)
        return plan_fail_rule(c, "parallel.pp", "model.layers", "must be <= model.layers (%d) (got %d)",
                         m->layers, pp);
    if (tp != PLAN_AUTO && (4 * (long long)m->hidden) % tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.hidden",
                         "must divide 4·model.hidden (%lld %% %d = %lld)", 4 * (long long)m->hidden,
                         tp, 4 * (long long)m->hidden % tp);
    if (tp != PLAN_AUTO && m->kv_heads % tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.kv_heads",
                         "must divide model.kv_heads (%d %% %d = %d): each rank holds whole "
                         "key/value heads (replicating them over tp is not built)",
                         m->kv_heads, tp, m->kv_heads % tp);
    if (tp != PLAN_AUTO && m->ffn_hidden % tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.ffn_hidden",
                         "must divide model.ffn_hidden (%d %% %d = %d)", m->ffn_hidden, tp,
                         m->ffn_hidden % tp);
    return 0;
}

/* The pipeline schedule's: virtual stages, the stages' layers, the interleaved schedule's
 * micro-batches and chunks. */
static int check_pipeline_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_model *m = &p->model;
    const struct plan_parallel *par = &p->parallel;
    int pp = par->pp;
    bool interleaved = par->schedule == PLAN_PIPE_INTERLEAVED;
    if (interleaved && par->virtual_stages < 2)
        return plan_fail_rule(c, "parallel.virtual_stages", "parallel.schedule",
                         "must be >= 2 with the interleaved schedule (got %d)",
                         par->virtual_stages);
    if (!interleaved && par->virtual_stages != 1)
        return plan_fail_rule(c, "parallel.virtual_stages", "parallel.schedule",
                         "must be 1 unless parallel.schedule is \"interleaved\" (got %d)",
                         par->virtual_stages);
    const struct plan_ints *split = &par->stage_layers;
    if (split->n && pp == PLAN_AUTO)
        return plan_fail_rule(c, "parallel.stage_layers", "parallel.pp",
                         "needs parallel.pp set (it is \"auto\")");
    if (split->n && split->n != pp)
        return plan_fail_rule(c, "parallel.stage_layers", "parallel.pp",
                         "must list the layers of each of the parallel.pp %d stages (got %d)", pp,
                         split->n);
    bool dualpipev = par->schedule == PLAN_PIPE_DUALPIPEV;
    if (split->n && (interleaved || dualpipev))
        return plan_fail_rule(c, "parallel.stage_layers", "parallel.schedule",
                         "cannot be set with the %s schedule (its chunks split the layers "
                         "evenly)",
                         plan_pipeline_name(par->schedule));
    long long split_sum = 0;
    for (int k = 0; k < split->n; k++) split_sum += split->v[k];
    if (split->n && split_sum != m->layers)
        return plan_fail_rule(c, "parallel.stage_layers", "model.layers",
                         "must add up to model.layers (%d) (got %lld)", m->layers, split_sum);
    if (interleaved && pp != PLAN_AUTO && p->batch.grad_accum % pp != 0)
        return plan_fail_rule(c, "batch.grad_accum", "parallel.pp parallel.schedule",
                         "must be a multiple of parallel.pp (%d) with the interleaved schedule "
                         "(got %d)",
                         pp, p->batch.grad_accum);
    if (interleaved && pp != PLAN_AUTO && m->layers % (pp * par->virtual_stages) != 0)
        return plan_fail_rule(c, "parallel.virtual_stages", "parallel.pp model.layers parallel.schedule",
                         "pp × virtual_stages (%d × %d) must divide model.layers (%d)", pp,
                         par->virtual_stages, m->layers);
    /* DualPipeV: two chunks a stage in a V, its main step needs 2·pp micro-batches */
    if (dualpipev && pp != PLAN_AUTO && pp > 1 && m->layers % (2 * pp) != 0)
        return plan_fail_rule(c, "model.layers", "parallel.pp parallel.schedule",
                         "must be a multiple of 2 × parallel.pp (%d) with the dualpipev schedule "
                         "(its two chunks a stage split the layers evenly; got %d)",
                         2 * pp, m->layers);
    if (dualpipev && pp != PLAN_AUTO && pp > 1 && p->batch.grad_accum < 2 * pp)
        return plan_fail_rule(c, "batch.grad_accum", "parallel.pp parallel.schedule",
                         "must be at least 2 × parallel.pp (%d) with the dualpipev schedule "
                         "(got %d)",
                         2 * pp, p->batch.grad_accum);
    return 0;
}

/* ZeRO's options: keeping the units gathered (reshard_after_forward false)
 * means something at ZeRO 3 only. */
static int check_zero_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_parallel *par = &p->parallel;
    if (!par->reshard_after_forward && par->zero < 3)
        return plan_fail_rule(c, "parallel.reshard_after_forward", "parallel.zero",
                              "false is only read with parallel.zero 3 (it is %d): below ZeRO 3 "
                              "every rank holds all the parameters, which are never resharded",
                              par->zero);
    return 0;
}

/* Offload: nvme needs its directory, and the state it keeps on disk is not
 * copied to memory for a checkpoint written in the background. (On a CPU rank
 * "host" changes nothing: its state is in host memory already, which it says; a
 * GPU rank steps on the CPU, runtime/host_step.h.) */
static int check_offload_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_parallel *par = &p->parallel;
    if (par->offload == PLAN_OFFLOAD_NVME && !par->offload_dir)
        return plan_fail_rule(c, "parallel.offload_dir", "parallel.offload",
                              "must name a directory (on a fast disk) with parallel.offload "
                              "\"nvme\"");
    if (par->offload != PLAN_OFFLOAD_NVME && par->offload_dir)
        return plan_fail_rule(c, "parallel.offload_dir", "parallel.offload",
                              "is only read with parallel.offload \"nvme\" (it is \"%s\")",
                              plan_offload_name(par->offload));
    if (par->offload == PLAN_OFFLOAD_NVME && p->checkpoint.async)
        return plan_fail_rule(c, "checkpoint.async", "parallel.offload",
                              "cannot be true with parallel.offload \"nvme\": a background "
                              "checkpoint copies the optimizer state to memory first, which "
                              "offload keeps on disk");
    return 0;
}

/* Hybrid sharding: dp_shard × dp_replicate = dp, each given or derived from
 * the other (so dp must be fixed when either is given), and a shard group
 * smaller than dp only where ZeRO shards something. */
static int check_hsdp_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_parallel *par = &p->parallel;
    int dp = par->dp, sh = par->dp_shard, rep = par->dp_replicate;
    const char *path = sh != PLAN_AUTO ? "parallel.dp_shard" : "parallel.dp_replicate";
    if (sh == PLAN_AUTO && rep == PLAN_AUTO) return 0;
    if (dp == PLAN_AUTO)
        return plan_fail_rule(c, path, "parallel.dp",
                              "needs a fixed parallel.dp (\"auto\" picks dp from the ranks; "
                              "dp_shard × dp_replicate must equal it)");
    if (sh != PLAN_AUTO && rep != PLAN_AUTO && (int64_t)sh * rep != dp)
        return plan_fail_rule(c, path, "parallel.dp_replicate parallel.dp",
                              "parallel.dp_shard × parallel.dp_replicate (%d × %d) must equal "
                              "parallel.dp (%d)",
                              sh, rep, dp);
    int given = sh != PLAN_AUTO ? sh : rep;
    if (dp % given != 0)
        return plan_fail_rule(c, path, "parallel.dp", "%d does not divide parallel.dp (%d)", given,
                              dp);
    if (par->zero == 0 && plan_dp_shard(par, dp) != dp)
        return plan_fail_rule(c, path, "parallel.zero",
                              "%d with parallel.zero 0: ZeRO 0 shards nothing, so every dp rank "
                              "is a replica already; set parallel.zero 1, 2 or 3, or leave "
                              "parallel.dp_shard and parallel.dp_replicate out",
                              given);
    return 0;
}

/* Context parallelism: a sequence is cut into 2·cp chunks and rank i of a cp group takes
 * chunks i and 2·cp−1−i (each rank an equal share of the causal mask's work), so 2·cp
 * divides seq_len. */
static int check_cp_rules(struct plan_ctx *c, const struct plan *p)
{
    int cp = p->parallel.cp, T = p->model.seq_len;
    if (cp == 1) return 0;
    if (T % (2 * cp) != 0)
        return plan_fail_rule(c, "parallel.cp", "model.seq_len",
                              "%d needs model.seq_len divisible by 2 × parallel.cp (%d): a "
                              "sequence is cut into 2·cp chunks and each cp rank i takes chunks "
                              "i and 2·cp−1−i (got %d, %d %% %d = %d)",
                              cp, 2 * cp, T, T, 2 * cp, T % (2 * cp));
    return 0;
}

/* model.moe: its fields against each other and the model, and what this
 * slice of mixture of experts does not build yet, refused naming the field: llm.c or
 * Hugging Face files. */
static int check_moe_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_moe *e = &p->model.moe;
    const struct plan_parallel *par = &p->parallel;
    if (!e->given) return 0;
    if (e->top_k > e->experts)
        return plan_fail_rule(c, "model.moe.top_k", "model.moe.experts",
                              "must be <= model.moe.experts (%d) (got %d)", e->experts, e->top_k);
    if (e->every > p->model.layers)
        return plan_fail_rule(c, "model.moe.every", "model.layers",
                              "must be <= model.layers (%d): an MoE block replaces the MLP of "
                              "layers i with i %% every = every - 1 (got %d)",
                              p->model.layers, e->every);
    if (par->tp != PLAN_AUTO && e->ffn_hidden % par->tp != 0)
        return plan_fail_rule(c, "parallel.tp", "model.moe.ffn_hidden",
                              "must divide model.moe.ffn_hidden (%d %% %d = %d): each expert is "
                              "split over tp as the MLP is",
                              e->ffn_hidden, par->tp, e->ffn_hidden % par->tp);
    if (p->model.init)
        return plan_fail_rule(c, "model.init", "model.moe",
                              "with model.moe: llm.c and Hugging Face files hold no experts; "
                              "remove it");
    return 0;
}

/* Expert parallelism: each MoE layer's experts spread over ep consecutive ranks of the
 * dp·cp the gradients are averaged over (cp folded into dp: rank_dp_fold), so ep divides
 * the experts and a fixed dp·cp; what it does not build yet is refused naming the field:
 * ZeRO (the experts' gradients are reduced over their own ranks), hybrid sharding, the
 * optimizer's moments in files and a run's samples. */
static int check_ep_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_parallel *par = &p->parallel;
    int ep = par->ep;
    if (ep == 1) return 0;
    if (!p->model.moe.given)
        return plan_fail_rule(c, "parallel.ep", "model.moe",
                              "%d needs model.moe: expert parallelism spreads the experts of "
                              "an MoE block",
                              ep);
    if (p->model.moe.experts % ep != 0)
        return plan_fail_rule(c, "parallel.ep", "model.moe.experts",
                              "must divide model.moe.experts (%d %% %d = %d): each ep rank holds "
                              "experts / ep of them",
                              p->model.moe.experts, ep, p->model.moe.experts % ep);
    if (par->dp == PLAN_AUTO)
        return plan_fail_rule(c, "parallel.ep", "parallel.dp",
                              "%d needs a fixed parallel.dp (\"auto\" picks dp from the ranks; "
                              "ep must divide dp × cp)",
                              ep);
    if (par->dp * par->cp % ep != 0)
        return plan_fail_rule(c, "parallel.ep", "parallel.dp parallel.cp",
                              "must divide parallel.dp × parallel.cp (%d × %d = %d; %d %% %d = "
                              "%d): an ep group is ep consecutive ranks of the dp·cp that "
                              "average the gradients",
                              par->dp, par->cp, par->dp * par->cp, par->dp * par->cp, ep,
                              par->dp * par->cp % ep);
    /* ZeRO slices each ep rank's part over its expert peers in a shard group
     * (plan_zero_slices): an ep group inside one shard group (dp_shard·cp consecutive
     * folded dp ranks) */
    int shard = plan_dp_shard(par, par->dp) * par->cp;
    if (shard != par->dp * par->cp && shard % ep != 0)
        return plan_fail_rule(
            c, par->dp_shard != PLAN_AUTO ? "parallel.dp_shard" : "parallel.dp_replicate",
            "parallel.ep parallel.cp",
            "with parallel.ep %d: ep must divide a shard group's dp_shard × "
            "cp ranks (%d %% %d = %d): an ep group's experts are sliced over "
            "the expert peers inside one shard group",
            ep, shard, ep, shard % ep);
    if (p->sample.tokens > 0)
        return plan_fail_rule(c, "sample.tokens", "parallel.ep",
                              "with parallel.ep %d: a run's samples need every expert on one "
                              "rank; use 0 and sample a checkpoint with plait sample",
                              ep);
    return 0;
}

/* A micro-batch's rows: the kernels index B·T rows (3 of them a token in the classifier's
 * statistics) in int (4·hidden is bounded by the model's size: check_model_size), and
 * sequence parallelism splits a rank's rows (B·T/cp with context parallelism) evenly over
 * tp. */
static int check_row_rules(struct plan_ctx *c, const struct plan *p)
{
    const struct plan_parallel *par = &p->parallel;
    int tp = par->tp, cp = par->cp;
    long long rows = (long long)p->batch.micro_batch * p->model.seq_len;
    if (rows > INT_MAX / 3)
        return plan_fail_rule(c, "model.seq_len", "batch.micro_batch",
                         "batch.micro_batch × model.seq_len (%d × %d = %lld rows) is more than "
                         "the kernels index (%d)",
                         p->batch.micro_batch, p->model.seq_len, rows, INT_MAX / 3);
    if (!par->sequence_parallel || tp == PLAN_AUTO) return 0;
    if (cp == 1 && rows % tp != 0)
        return plan_fail_rule(
            c, "parallel.sequence_parallel", "batch.micro_batch model.seq_len parallel.tp",
            "needs batch.micro_batch × model.seq_len (%d × %d = %lld rows) divisible by "
            "parallel.tp (%d)",
            p->batch.micro_batch, p->model.seq_len, rows, tp);
    if (cp > 1 && rows / cp % tp != 0) /* cp divides seq_len: check_cp_rules */
        return plan_fail_rule(c, "parallel.sequence_parallel",
                              "batch.micro_batch model.seq_len parallel.cp parallel.tp",
                              "needs a rank's rows, batch.micro_batch × model.seq_len / "
                              "parallel.cp (%d × %d / %d = %lld), divisible by parallel.tp (%d)",
                              p->batch.micro_batch, p->model.seq_len, cp, rows / cp, tp);
    return 0;
}

/* Every rule between fields, in the order a plan's refusal names the first broken. */
int plan_check_rules(struct plan_ctx *c, json_t *root, struct plan *p)
{
    if (check_model_rules(c, root, p) || check_data_and_precision(c, root, p) ||
        check_lr_schedule(c, root, p) || check_global_batch(c, root, p) ||
        check_split_rules(c, p) || check_pipeline_rules(c, p))
        return -1;
    /* the backend of a device that is known from the plan alone (an "auto" device is the
     * placement's: place_ranks refuses nccl for CPU ranks) */
    if (p->parallel.device == PLAN_DEVICE_CPU && p->parallel.backend == PLAN_BACKEND_NCCL)
        return plan_fail_rule(c, "parallel.backend", "parallel.device",
                         "\"nccl\" moves GPU memory, but parallel.device \"cpu\" trains on the "
                         "CPU: use \"socket\" or \"auto\"");
    if (p->parallel.sequence_parallel && p->parallel.tp == 1)
        return plan_fail_rule(c, "parallel.sequence_parallel", "parallel.tp", "needs parallel.tp > 1");
    if (check_zero_rules(c, p) || check_hsdp_rules(c, p) || check_cp_rules(c, p) ||
        check_row_rules(c, p) || check_offload_rules(c, p) || check_moe_rules(c, p) ||
        check_ep_rules(c, p))
        return -1;
    return check_ranks(c, p) || check_model_size(c, root, p) ? -1 : 0;
}

