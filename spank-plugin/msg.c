/* msg.c — how spank_plait speaks: every message goes to Slurm's log (and the
 * user's terminal) with the "spank_plait: " prefix and with its control
 * characters escaped (error_escape), so a hostile plan path or JSON key
 * cannot forge a second log line or an escape sequence. No policy here. */
#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"
#include "spank-plugin/plait_spank.h"

char *msg_vformat(char *out, size_t n, const char *fmt, va_list ap)
{
    char raw[MSG_MAX];
    vsnprintf(raw, sizeof raw, fmt, ap);
    return error_escape(out, n, raw);
}

int msg_error(const char *fmt, ...)
{
    char text[2 * MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    msg_vformat(text, sizeof text, fmt, ap);
    va_end(ap);
    slurm_error("spank_plait: %s", text);
    return -1;
}
