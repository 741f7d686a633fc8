/* model_tp.h — a model's tensor-parallel collectives (model_tp.c), for the
 * model's passes (model_forward.c, model_backward.c); model.h is the model's
 * interface. */
#ifndef PLAIT_RUNTIME_MODEL_TP_H
#define PLAIT_RUNTIME_MODEL_TP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "runtime/model.h"

/* The rows of the residual stream this rank holds of N: N/tp sequence parallel. */
int model_rows_of(const struct model *m, int N);
/* Sums (or maxes) n floats of buf over the tp group: a no-op without one. */
int model_tp_reduce(struct model *m, float *buf, size_t n, bool max, struct plait_error *err);
/* Sequence parallelism: rows (R,C) gathered into *whole (N,C) (in `into`, or
 * m->whole), and partial (N,C) summed with this rank's R rows into rows. */
int model_sp_gather_into(struct model *m, const float *rows, int N, float *into,
                         const float **whole, struct plait_error *err);
int model_sp_gather(struct model *m, const float *rows, int N, const float **whole,
                    struct plait_error *err);
/* The same for an activation in its dtype (bf16: half the bytes), into m->whole. */
int model_sp_gather_act(struct model *m, struct act rows, int N, struct act *whole,
                        struct plait_error *err);
int model_sp_scatter(struct model *m, const float *partial, float *rows, int N,
                     struct plait_error *err);
/* partial (N,C), this rank's term of a sum over the group -> *rows, the sum's
 * rows this rank holds. */
int model_tp_sum_rows(struct model *m, float *partial, int N, float **rows,
                      struct plait_error *err);
/* *out = inp (N,in_cols) · wᵀ + bias for a row-parallel weight. */
int model_row_parallel_forward(struct model *m, float **out, struct act inp, enum gpt2_tensor w,
                               enum gpt2_tensor bias, int l, int N, int in_cols,
                               struct plait_error *err);

#endif
