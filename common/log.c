/* log.c — prefixed messages on stderr, one line each (control characters
 * escaped: a message is never two lines or an escape sequence). */
#include "common/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"

static char prefix[64] = "plait";
static int quiet;
static _Atomic unsigned warnings; /* log_warn may be called from a checkpoint's writer thread */

unsigned log_warnings(void)
{
    return warnings;
}

void log_set_quiet(int q)
{
    quiet = q;
}

void log_set_prefix(const char *p)
{
    snprintf(prefix, sizeof prefix, "%s", p);
}

static void emit(const char *level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void emit(const char *level, const char *fmt, va_list ap)
{
    char line[2048], escaped[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "%s: %s%s\n", prefix, level, error_escape(escaped, sizeof escaped, line));
}

void log_info(const char *fmt, ...)
{
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    emit("", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...)
{
    warnings++;
    va_list ap;
    va_start(ap, fmt);
    emit("warning: ", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("error: ", fmt, ap);
    va_end(ap);
}

void log_format_duration(char *buf, size_t bytes, double s)
{
    if (s < 0 || !isfinite(s))
        snprintf(buf, bytes, "?");
    else if (s < 60)
        snprintf(buf, bytes, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, bytes, "%dm%02ds", (int)s / 60, (int)s % 60);
    else if (s < 1e6 * 3600) /* (int) of anything larger is undefined */
        snprintf(buf, bytes, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    else
        snprintf(buf, bytes, "over a million hours");
}
