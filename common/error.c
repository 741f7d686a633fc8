/* error.c — filling struct plait_error. Printing and exit codes belong to the
 * programs (launcher/, runtime/main.c), not here. */
#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int error_set(struct plait_error *err, const char *fmt, ...)
{
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
    return -1;
}

int error_prefix(struct plait_error *err, const char *fmt, ...)
{
    if (!err) return -1;
    char prefix[sizeof err->text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[2 * sizeof err->text];
    snprintf(joined, sizeof joined, "%s%s", prefix, err->text);
    memcpy(err->text, joined, sizeof err->text - 1); /* keeps the head if too long */
    err->text[sizeof err->text - 1] = '\0';
    return -1;
}

int error_errno(struct plait_error *err, const char *fmt, ...)
{
    int saved = errno;
    if (!err) return -1;
    char what[sizeof err->text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(err->text, sizeof err->text, "%.900s: %.100s", what, strerror(saved));
    return -1;
}
