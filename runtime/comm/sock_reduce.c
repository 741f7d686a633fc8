/* sock_reduce.c — sum and max over float32, float64 and int64 for the socket
 * backend (sock_reduce.h). Plain loops the compiler vectorises (built with the
 * kernels' flags, see the Makefile); max propagates NaN; int64 sums wrap (two's
 * complement) instead of being undefined. */
#include "runtime/comm/sock_reduce.h"

#include <stdint.h>

#define SUM_LOOP(T)                                                                                \
    do {                                                                                           \
        T *o = out;                                                                                \
        const T *a = first, *b = second;                                                           \
        for (size_t i = 0; i < count; i++) o[i] = a[i] + b[i];                                     \
    } while (0)

/* NaN in either operand gives NaN (first's if both). */
#define MAX_LOOP(T)                                                                                \
    do {                                                                                           \
        T *o = out;                                                                                \
        const T *a = first, *b = second;                                                           \
        for (size_t i = 0; i < count; i++) {                                                       \
            T x = a[i], y = b[i];                                                                  \
            o[i] = (x > y || x != x) ? x : y;                                                      \
        }                                                                                          \
    } while (0)

/* One copy per instruction set, like the kernels (kernels/cpu/ops_cpu.c); not
 * under ThreadSanitizer, which is not running yet when the loader calls the
 * clones' resolver. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REDUCE_NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(REDUCE_NO_CLONES)
#define REDUCE_CLONES
#else
#define REDUCE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

REDUCE_CLONES void sock_reduce(enum comm_dtype dtype, enum comm_reduce_op op, void *out,
                               const void *first, const void *second, size_t count)
{
    switch (dtype) {
    case COMM_FLOAT32:
        if (op == COMM_SUM)
            SUM_LOOP(float);
        else
            MAX_LOOP(float);
        return;
    case COMM_FLOAT64:
        if (op == COMM_SUM)
            SUM_LOOP(double);
        else
            MAX_LOOP(double);
        return;
    case COMM_INT64:
        if (op == COMM_SUM) {
            uint64_t *o = out;
            const uint64_t *a = first, *b = second;
            for (size_t i = 0; i < count; i++) o[i] = a[i] + b[i];
        } else {
            int64_t *o = out;
            const int64_t *a = first, *b = second;
            for (size_t i = 0; i < count; i++) o[i] = a[i] > b[i] ? a[i] : b[i];
        }
        return;
    case COMM_BFLOAT16: /* moved, never summed: comm.c refuses its reductions */
        return;
    }
}
