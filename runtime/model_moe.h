/* model_moe.h — a mixture-of-experts block in place of a layer's MLP
 * (model.moe; runtime/model_forward.c and model_backward.c call it from a layer's passes):
 * the router, the top-k routing and its capacity, each expert's MLP on the
 * rows it took, the gates' combination, the shared experts, and the balance
 * and z losses, all through kernels/ops.h. A rank holds E/ep of the routed experts
 * (parallel.ep; all at ep 1), their rows exchanged over the ep group (model_moe_ep.c),
 * and every shared one; with context parallelism the routing counts every cp rank's
 * choices (model_moe_cp.c); with tp each expert is split as the dense MLP is (fc by
 * columns, fcproj by rows), the router whole on every tp rank. Its products run in
 * the precision's copy of the weights: bf16 in bf16, fp32 in fp32 and in fp8 (the
 * fp8 copy holds the attention's and the dense MLPs' matrices only). */
#ifndef PLAIT_RUNTIME_MODEL_MOE_H
#define PLAIT_RUNTIME_MODEL_MOE_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/model.h"

/* Whether the model can run its MoE blocks as built (the backend's routing ops, the ep
 * group): 0, or -1 naming what is missing. A dense model passes. */
int moe_check(const struct model *m, struct plait_error *err);

/* The host memory the statistics need (model_init; freed by moe_free). */
int moe_init(struct model *m, struct plait_error *err);
void moe_free(struct model *m);

/* The MoE activations of the slot's local layer i (an MoE layer). */
struct moe_acts *moe_acts_of(const struct model *m, const struct model_slot *sl, int i);

/* Layer l's MoE block on ln (N,C), the normed residual: *out (N,C), in m->proj, the
 * experts' outputs combined by their gates plus the shared experts' (with tp, this
 * rank's term of that sum, to be summed over the group as a row-parallel product's). */
int moe_forward(struct model *m, struct moe_acts *a, int l, const float *ln, int N, float **out,
                struct plait_error *err);

/* Its backward from dout (N,C), the block's output gradient: dln (N,C) the gradient of
 * ln (overwritten; with tp, this rank's term of it), the router's and experts' weight gradients
 * written or, with acc, added; the balance and z losses' gradients scaled by grad_scale·N, as the
 * training loss is. */
int moe_backward(struct model *m, struct moe_acts *a, int l, const float *dout, const float *ln,
                 float *dln, int N, float grad_scale, bool acc, struct plait_error *err);

/* After a training forward of the slot: its MoE layers' losses into m->moe_loss and
 * their routing into m->moe_stats (MOE_STATS' layout). */
void moe_count(struct model *m, const struct model_slot *sl, int N);

/* The MoE losses of the training forwards since the last call (added into the step's
 * loss: the training loss is the cross-entropy plus them), and zero after. */
double model_moe_take_loss(struct model *m);
void model_moe_stats_clear(struct model *m);

/* Expert parallelism (model_moe_ep.c; ep > 1): counts (host, moe_acts' 3E layout) gets
 * the rows each ep rank sends each local expert, in acts a's counts too; this rank's
 * packed rows own (by expert) go to the experts' ranks and the rows of the local experts
 * come, grouped by local expert then source rank (moe_ep_rows of local expert e);
 * moe_ep_return sends grouped back to where each row came from, into own. */
int moe_ep_counts(struct model *m, struct moe_acts *a, int32_t *counts, struct plait_error *err);
int moe_ep_rows(const struct model *m, const int32_t *counts, int e);
int moe_ep_dispatch(struct model *m, const int32_t *counts, const float *own, int N, float *grouped,
                    struct plait_error *err);
int moe_ep_return(struct model *m, const int32_t *counts, float *grouped, int N, float *own,
                  struct plait_error *err);

/* Context parallelism (model_moe_cp.c; cp > 1): the host memory of the counts (moe_init,
 * moe_free); from acts a's choices of the rank's N tokens, every cp rank's counted: each
 * expert's choices in the micro-batch before each of the rank's 2B chunks into
 * m->moe_cp_before (the dispatch's runs), and into m->moe_cp_routed (host) its choices in
 * the whole micro-batch. Collective over the cp group. */
int moe_cp_init(struct model *m, struct plait_error *err);
void moe_cp_free(struct model *m);
int moe_cp_counts(struct model *m, const struct moe_acts *a, int N, struct plait_error *err);

/* DualPipeV's two lanes (model.h moe_lane, runtime/lanes.h): the first lane's set is the
 * model's own, the second's host counts are allocated here (each lane's device buffers by
 * model_init, counted by gpt2_memory's moe_lanes); nothing without moe_lane[1].ep_group.
 * moe_ep_lane_enter(m, lane) installs a lane's set in the model's fields (lanes_open's
 * enter). An exchange in a running pair switches lanes (lanes_switch) while it moves. */
int moe_ep_lanes_init(struct model *m, struct plait_error *err);
void moe_ep_lanes_free(struct model *m);
void moe_ep_lane_enter(void *model, int lane);

/* model_weights.c's and model_forward.c's, for this file: tensor t of layer l (its
 * weights, or with grads its gradient; the bf16 copy of its weights or NULL), and the
 * MLP's activation (GELU of N·F elements, or a Llama's SwiGLU of N rows of 2F) and its
 * backward. */
float *model_tensor(const struct model *m, bool grads, enum gpt2_tensor t, int l);
const uint16_t *model_tensor16(const struct model *m, enum gpt2_tensor t, int l);
void model_mlp_act(const struct model *m, float *out, const float *in, int N, int F);
void model_mlp_act_backward(const struct model *m, float *din, const float *in, const float *dout,
                            int N, int F);
/* n floats of buf summed over the tp group, in place (nothing without one). */
int model_tp_allreduce(struct model *m, float *buf, size_t n, struct plait_error *err);
/* Points the fields of every buffer two lanes hold a copy each of (gpt2_buffer lanes 2:
 * the model's, or every slot's in each layer) at the lane's copy. */
void model_lane_enter(struct model *m, int lane);

#endif
