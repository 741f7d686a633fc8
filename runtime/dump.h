/* dump.h — the developer's dump of step 1 (PLAIT_DUMP_STEP1) in the formats
 * of the PyTorch referee (tests/golden/gpt2_ref.py), whatever the layout:
 * whole tensors, assembled from the ranks' shards, as raw little-endian
 * float32. Every rank calls both functions at the same point (they contain
 * collectives, whose bytes count in step 1's report); one rank writes each
 * file. */
#ifndef PLAIT_RUNTIME_DUMP_H
#define PLAIT_RUNTIME_DUMP_H

#include "common/error.h"
#include "runtime/group.h"
#include "runtime/model.h"

/* Where the last stage's next forward without targets leaves its logits (N,Vp/tp):
 * set as m->logits_out (NULL on other stages, or out of memory). */
float *dump_logits_buffer(struct model *m, int B, int T);

/* dir/logits.f32, (B·T, Vp): the logits slot 0's last forward left in
 * dump_logits_buffer's buffer (freed here), gathered over tp; written by the
 * last stage's tp rank 0 of dp replica 0. */
int dump_logits(struct model *m, const char *dir, int B, int T, struct plait_error *err);

/* dir/grads.f32: the step's gradients in llm.c order (gpt2_layout), summed
 * over dp, between the pipeline's ends for the tied wte, each parameter once;
 * written by world rank 0. Call it once the step's micro-batches are done
 * and the tied wte's gradient is summed, before the optimizer step. On one
 * rank, dir/params.f32 too: the weights step 1 started from, in the same
 * order (the mixture-of-experts referee starts from them: model.init takes
 * no experts). */
int dump_grads(struct model *m, const struct group *world, const char *dir,
               struct plait_error *err);

#endif
