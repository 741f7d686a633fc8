/* ops_error.c — a backend's sticky error (ops_error.h). */
#include <stdarg.h>
#include <stdio.h>

#include "kernels/ops_error.h"

int ops_error_init(struct ops_error *e)
{
    e->text[0] = '\0';
    e->pending = 0;
    return pthread_mutex_init(&e->lock, NULL) == 0 ? 0 : -1;
}

void ops_error_destroy(struct ops_error *e)
{
    (void)pthread_mutex_destroy(&e->lock);
}

void ops_error_vset(struct ops_error *e, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&e->lock);
    if (!e->pending) {
        vsnprintf(e->text, sizeof e->text, fmt, ap);
        e->pending = 1;
    }
    pthread_mutex_unlock(&e->lock);
}

void ops_error_set(struct ops_error *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ops_error_vset(e, fmt, ap);
    va_end(ap);
}

int ops_error_take(struct ops_error *e, char *buf, size_t bytes)
{
    pthread_mutex_lock(&e->lock);
    int pending = e->pending;
    if (pending && buf && bytes) snprintf(buf, bytes, "%s", e->text);
    e->pending = 0;
    pthread_mutex_unlock(&e->lock);
    return pending ? -1 : 0;
}
