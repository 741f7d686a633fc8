/* ops_error.h — the sticky error every backend of kernels/ops.h keeps: the
 * first failure since the last take_error (later ones are dropped, as CUDA's
 * sticky errors are), safe from several threads. One per backend context
 * (struct ops_ctx). */
#ifndef PLAIT_KERNELS_OPS_ERROR_H
#define PLAIT_KERNELS_OPS_ERROR_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ops_error {
    pthread_mutex_t lock;
    char text[512];
    int pending;
};

/* A context's error: ops_error_init before use (0, or -1 when its lock
 * cannot be made), ops_error_destroy after. */
int ops_error_init(struct ops_error *e);
void ops_error_destroy(struct ops_error *e);

/* Keeps the message unless one is pending already. */
void ops_error_set(struct ops_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ops_error_vset(struct ops_error *e, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* 0 when none is pending; else -1, the message into buf, and none pending. */
int ops_error_take(struct ops_error *e, char *buf, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
