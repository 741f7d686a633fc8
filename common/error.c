/* error.c — filling struct plait_error. Printing and exit codes belong to the
 * programs (launcher/, runtime/main.c), not here. */
#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (2..4), or 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *s)
{
    size_t len;
    unsigned min;
    unsigned cp;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        len = 2, min = 0x80, cp = s[0] & 0x1Fu;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        len = 3, min = 0x800, cp = s[0] & 0x0Fu;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        len = 4, min = 0x10000, cp = s[0] & 0x07u;
    else
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

char *error_escape(char *dst, size_t n, const char *src)
{
    if (n == 0) return dst;
    size_t o = 0;
    const unsigned char *s = (const unsigned char *)src;
    while (*s) {
        char esc[8] = "";
        size_t take = 1;
        if (*s == '\n')
            strcpy(esc, "\\n");
        else if (*s == '\t')
            strcpy(esc, "\\t");
        else if (*s == '\r')
            strcpy(esc, "\\r");
        else if (*s < 0x20 || *s == 0x7F)
            snprintf(esc, sizeof esc, "\\x%02x", *s);
        else if (*s >= 0x80) {
            take = utf8_sequence(s);
            if (take == 0) {
                take = 1;
                snprintf(esc, sizeof esc, "\\x%02x", *s);
            } else if (take == 2 && s[0] == 0xC2 && s[1] < 0xA0) { /* C1 control */
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)s[1]);
            }
        }
        const char *piece = *esc ? esc : (const char *)s;
        size_t len = *esc ? strlen(esc) : take;
        if (o + len >= n) break; /* whole characters only */
        memcpy(dst + o, piece, len);
        o += len;
        s += take;
    }
    dst[o] = '\0';
    return dst;
}

static int error_vset(struct plait_error *err, bool peer_lost, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static int error_vset(struct plait_error *err, bool peer_lost, const char *fmt, va_list ap)
{
    if (!err) return -1;
    char raw[sizeof err->text];
    vsnprintf(raw, sizeof raw, fmt, ap);
    error_escape(err->text, sizeof err->text, raw);
    err->peer_lost = peer_lost;
    return -1;
}

int error_set(struct plait_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, false, fmt, ap);
    va_end(ap);
    return -1;
}

int error_peer_lost(struct plait_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, true, fmt, ap);
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
    char escaped[sizeof err->text], joined[2 * sizeof err->text];
    snprintf(joined, sizeof joined, "%s%s", error_escape(escaped, sizeof escaped, prefix),
             err->text);
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
    char raw[sizeof err->text];
    snprintf(raw, sizeof raw, "%.900s: %.100s", what, strerror(saved));
    error_escape(err->text, sizeof err->text, raw);
    err->peer_lost = false;
    return -1;
}
