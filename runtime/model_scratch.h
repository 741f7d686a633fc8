/* model_scratch.h — a model's scratch on its backend (model_scratch.c), for model.c
 * alone; model.h is the model's interface. */
#ifndef PLAIT_RUNTIME_MODEL_SCRATCH_H
#define PLAIT_RUNTIME_MODEL_SCRATCH_H

#include "common/error.h"
#include "runtime/model.h"

/* Reserves the backend's scratch slots at the sizes common/gpt2/gpt2_scratch.c counts
 * for this model (ops.h reserve_scratch; nothing on a backend without it), their sum in
 * m->scratch_bytes. After the model's buffers and m->attention_bf16 are made. */
int model_reserve_scratch(struct model *m, struct plait_error *err);

#endif
