/* sock_reduce.h — the element-wise reductions the socket backend applies to
 * bytes as they arrive. Operand order is part of determinism: out[i] =
 * first[i] op second[i], always in that order (max(+0, -0) and which NaN wins
 * depend on it). */
#ifndef PLAIT_SOCK_REDUCE_H
#define PLAIT_SOCK_REDUCE_H

#include <stddef.h>

#include "runtime/comm/comm.h"

/* out may be the same array as first or second; nothing else may overlap. */
void sock_reduce(enum comm_dtype dtype, enum comm_reduce_op op, void *out, const void *first,
                 const void *second, size_t count);

#endif
