/* gpt2_shard.h — the part of a GPT-2 one rank holds in a tp × pp layout, and
 * where each of its tensors lives in the rank's flat parameter buffer.
 *
 * Pipeline stage s holds a contiguous range of layers; the first stage also
 * the embeddings (wte, wpe), the last the final LayerNorm and, tied, wte again
 * (its gradients are summed between the two each step). With an interleaved
 * schedule a stage holds `chunks` ranges of the same length n, chunk c being
 * virtual stage c·pp + s: the first range shifted by c·pp·n layers; the
 * embeddings stay with stage 0 (chunk 0 embeds), the final LayerNorm and the
 * head with stage pp-1 (its last chunk computes them). Tensor parallelism
 * (Megatron) splits within a stage:
 *   wte      (Vp/tp, C)     rows: a vocabulary shard
 *   qkvw     (3·C/tp, C)    rows: this rank's heads of q, k and v, stacked [q; k; v]
 *   qkvb     (3·C/tp)
 *   attprojw (C, C/tp)      columns (row-parallel product; its bias is whole and
 *   attprojb (C)            added once, after the all-reduce)
 *   fcw      (4·C/tp, C)    rows
 *   fcb      (4·C/tp)
 *   fcprojw  (C, 4·C/tp)    columns (row-parallel)
 *   fcprojb  (C)
 *   wpe, ln1*, ln2*, lnf*   whole, on every tp rank
 *
 * In memory the buffer is layer-major, so a stage's, a layer's or a bucket's
 * parameters are contiguous: [wte][wpe] then per layer [ln1w ln1b qkvw qkvb
 * attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb] (the held layers in
 * ascending order: chunk 0's, then chunk 1's, ...), then [lnfw lnfb]
 * (absent tensors take no room). llm.c's tensor-major order (gpt2_layout.h)
 * is used only at file boundaries: gpt2_shard_copy converts. */
#ifndef PLAIT_GPT2_SHARD_H
#define PLAIT_GPT2_SHARD_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "common/gpt2/gpt2_layout.h"

struct gpt2_part {
    int tp, tp_rank;
    int pp, pp_rank;
    int layer_begin, layer_end; /* the stage's layers [begin, end): with chunks > 1 its first
                                   chunk's */
    int chunks;                 /* model chunks of the stage (interleaved schedules); 0 or 1:
                                   one. Chunk c holds layers [begin, end) + c·pp·(end - begin) */
    bool v_shape;               /* DualPipeV's V: two chunks, chunk 1 holding the layers of
                                   virtual stage 2·pp-1-pp_rank; the first stage also holds the
                                   head (last is pp_rank 0) */
    int ep, ep_rank;            /* expert parallelism (0 or 1: none): of each MoE layer's E
                                   routed experts the E/ep from ep_rank·E/ep, then every
                                   shared one (gpt2_experts.c) */
};

struct gpt2_shard {
    struct gpt2_config cfg;
    struct gpt2_part part;
    bool first, last;              /* first stage (embeddings), last stage (lnf, head) */
    size_t elems[GPT2_TENSORS];    /* local elements of one instance (per layer for the
                                      per-layer tensors), 0 when not held */
    size_t offset[GPT2_TENSORS];   /* global tensors: their offset; per-layer tensors: offset
                                      within a layer block */
    size_t layers_at, layer_elems; /* where the first layer block starts, a block's size
                                      (a layer's without an MoE block) */
    size_t moe_layer_elems;        /* a block's with an MoE block (mixture of experts): the
                                      attention's tensors, then the router's and experts'
                                      (their offsets within it), no dense MLP */
    size_t layers_end;             /* where the layer blocks end */
    size_t total;                  /* elements of the buffer */
};

/* The whole model on one rank (tp = pp = 1). */
struct gpt2_part gpt2_part_whole(const struct gpt2_config *cfg);

/* The default split of layers over pp stages: as even as it gets, the
 * earlier stages taking one more when they do not divide (stage_layers
 * may later set it explicitly). */
void gpt2_stage_layers(int layers, int pp, int stage, int *begin, int *end);

/* The part of an interleaved schedule's stage: `chunks` chunks of
 * layers / (pp · chunks) layers each (which must divide). */
void gpt2_stage_chunks(int layers, int pp, int chunks, int stage, struct gpt2_part *part);

/* The part of a DualPipeV stage: chunk 0 layers [s·n, (s+1)·n), chunk 1
 * [(2·pp-1-s)·n, (2·pp-s)·n), n = layers / (2·pp) (which must divide). */
void gpt2_stage_vshape(int layers, int pp, int stage, struct gpt2_part *part);

/* Layers from one chunk's first to the next one's: pp·n, or in a V the
 * distance to virtual stage 2·pp-1-s. */
int gpt2_part_chunk_stride(const struct gpt2_part *part);

/* The shard of part: -1 with err when tp does not divide the heads, the
 * padded vocabulary and 4·C, the layer range is empty or out of range, or a
 * size cannot be addressed. */
int gpt2_shard_init(struct gpt2_shard *s, const struct gpt2_config *cfg,
                    const struct gpt2_part *part, struct plait_error *err);

/* Where the shard's layer block i (0 <= i < gpt2_shard_layers) starts, and its
 * elements: blocks differ in a model with MoE blocks (gpt2_layout.h), else i·layer_elems
 * after layers_at. */
size_t gpt2_shard_block_at(const struct gpt2_shard *s, int i);
size_t gpt2_shard_block_elems(const struct gpt2_shard *s, int i);
/* The block of held layer l, and the largest block (0 without layers). */
int gpt2_shard_block(const struct gpt2_shard *s, int l);
size_t gpt2_shard_block_max(const struct gpt2_shard *s);

/* Whether the shard holds an instance of tensor t in layer l (gpt2_tensor_in_layer:
 * the dense MLP's and the experts' are in some layers only). */
bool gpt2_shard_has(const struct gpt2_shard *s, enum gpt2_tensor t, int l);

/* Offset of tensor t of layer l in the buffer (l ignored for the global
 * tensors); the tensor must be held (gpt2_shard_holds). */
size_t gpt2_shard_offset(const struct gpt2_shard *s, enum gpt2_tensor t, int l);
bool gpt2_shard_holds(const struct gpt2_shard *s, enum gpt2_tensor t);

/* The layers the shard holds (all its chunks'), and the model's index of its
 * i-th (0 <= i < gpt2_shard_layers, ascending: layer block i of the buffer). */
int gpt2_shard_layers(const struct gpt2_shard *s);
int gpt2_shard_layer(const struct gpt2_shard *s, int i);

/* Whether tensor t has one instance per layer (false: wte, wpe, lnfw, lnfb). */
bool gpt2_tensor_per_layer(enum gpt2_tensor t);

/* Whether a tensor is whole on every rank of a tp group (counted once when
 * summing over the group: gradient norms, parameter counts). */
bool gpt2_tensor_tp_replicated(enum gpt2_tensor t);

/* Whether this shard's copy of tensor t counts when a quantity is summed over
 * the tp × pp ranks of one model copy, so that each parameter counts once: a
 * tensor whole on every tp rank only on tp rank 0, the tied wte (held by the
 * first and the last stage) only on the first stage. */
bool gpt2_shard_counts(const struct gpt2_shard *s, enum gpt2_tensor t);

/* Where instance (t, layer l) starts in llm.c order over the shard's
 * instances (the order of gpt2_shard_each, and of the checkpoint's part
 * files): the elements of every instance visited before it. */
size_t gpt2_shard_instance_at(const struct gpt2_shard *s, enum gpt2_tensor t, int l);

/* How tensor parallelism cuts one instance of tensor t (elems: the size of
 * the instance being indexed). gpt2_tp_to_whole: element i of rank
 * tp_rank's instance is element (returned) of the whole instance, and the
 * *run elements from there on follow contiguously in both. gpt2_tp_owner,
 * the inverse: the rank holding element g of the whole instance (0 for a
 * tensor whole on every rank), its index there (*local), and the run. */
size_t gpt2_tp_to_whole(const struct gpt2_config *cfg, enum gpt2_tensor t, int tp, int tp_rank,
                        size_t i, size_t elems, size_t *run);
int gpt2_tp_owner(const struct gpt2_config *cfg, enum gpt2_tensor t, int tp, size_t g, size_t elems,
                  size_t *local, size_t *run);

/* Expert parallelism's cut (gpt2_experts.c). An expert tensor's instance at ep 1 (on a
 * tp rank: its tp part) is X = E + S blocks, one an expert; a rank at ep holds E/ep routed
 * blocks, ep_rank's, then the S shared ones:
 *   expfcw   (E/ep + S, FCm/tp, C)   expfcb   (E/ep + S, Fm/tp)
 *   expprojw (E/ep + S, C, Fm/tp)    expprojb (E/ep + S, C)
 * gpt2_part_experts: the routed experts a part holds (E/ep), ep_rank·E/ep the first. */
int gpt2_part_experts(const struct gpt2_part *p, const struct gpt2_config *cfg);
/* Whether ep cuts tensor t (the experts', not the router). */
bool gpt2_tensor_ep_cut(enum gpt2_tensor t);
/* Element i of an ep rank's instance (elems of it) as an index in the instance at ep 1
 * (its elements in *all), with *run elements from there on contiguous in both. */
size_t gpt2_ep_to_all(const struct gpt2_config *cfg, enum gpt2_tensor t, int ep, int ep_rank,
                      size_t i, size_t elems, size_t *all, size_t *run);
/* The inverse: the ep rank holding element a of the ep-1 instance (all elements; a
 * shared expert's: ep rank 0's copy), its index there (*local), and the run. */
int gpt2_ep_owner(const struct gpt2_config *cfg, enum gpt2_tensor t, int ep, size_t a, size_t all,
                  size_t *local, size_t *run);
/* Whether element at of the shard's buffer is a routed expert's at ep > 1 (its gradient
 * summed over the ranks holding the same experts, not over all of dp), and in *run the
 * elements from at on (to the buffer's end) with the same answer. */
bool gpt2_shard_routed_at(const struct gpt2_shard *s, size_t at, size_t *run);
/* Element i of the shard's instance of t (elems of it) in the whole instance, through ep's
 * cut and then tp's (gpt2_tp_to_whole). */
size_t gpt2_shard_to_whole(const struct gpt2_shard *s, enum gpt2_tensor t, size_t i, size_t elems,
                           size_t *run);

/* Copies between a full llm.c-order buffer (gpt2_layout) and the shard:
 * to_shard true extracts this rank's part, false writes it back into full
 * (the rest of full untouched). */
void gpt2_shard_copy(const struct gpt2_shard *s, float *full, float *shard, bool to_shard);

/* Visits every tensor instance the shard holds, in llm.c order (tensor, then
 * layer): offset and elements in the buffer. Stops when fn returns non-zero
 * and returns that. */
int gpt2_shard_each(const struct gpt2_shard *s,
                    int (*fn)(void *ctx, enum gpt2_tensor t, int layer, size_t offset,
                              size_t elems),
                    void *ctx);

#endif
