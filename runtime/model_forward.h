/* model_forward.h — what the forward pass (model_forward.c) shares with the
 * backward's recompute and the other passes' files (model_backward.c,
 * model_zero3_pass.c); model.h is the model's interface. */
#ifndef PLAIT_RUNTIME_MODEL_FORWARD_H
#define PLAIT_RUNTIME_MODEL_FORWARD_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/model.h"

/* The model's layer of the slot's local layer i; whether the slot's chunk embeds
 * or ends in the head; local layer i's input. */
int model_slot_layer(const struct model *m, const struct model_slot *sl, int i);
bool model_embeds(const struct model *m, const struct model_slot *sl);
bool model_heads(const struct model *m, const struct model_slot *sl);
const float *model_layer_input(const struct model_slot *sl, int i);

/* The attention of layer acts a; the MLP's activation into fch_gelu; the slot's
 * local layer i forward, and its first part alone (ln1, qkv and the attention's output
 * atty: what the products' weight gradients of an MoE layer read). */
int model_attention_fwd(struct model *m, struct layer_acts *a, int B, int T,
                        struct plait_error *err);
void model_act_forward(struct model *m, struct layer_acts *a, int N);
int model_layer_forward(struct model *m, struct model_slot *sl, int i, int B, int T,
                        struct plait_error *err);
int model_layer_attention_forward(struct model *m, struct model_slot *sl, int i, int B, int T,
                                  struct plait_error *err);

/* The backend's error since the last check, if any, with err saying what failed. */
int model_check_ops(struct model *m, const char *what, struct plait_error *err);

#endif
