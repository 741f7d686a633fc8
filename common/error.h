/* error.h — how library code in plait reports an error: it returns NULL/-1 and
 * fills a struct plait_error with one line that says what was wrong and where
 * (file, JSON path, rank, peer). Programs decide what to do with it. */
#ifndef PLAIT_ERROR_H
#define PLAIT_ERROR_H

#include <stdbool.h>
#include <stddef.h>

struct plait_error {
    char text[1024];
    /* The failure is another process's, not this one's: a peer of a
     * collective or the job's store closed or reset its connection, stayed
     * silent past the deadline, or the job was aborted. A launcher restarts
     * the gang for it (PLAIT_EXIT_RESTART). Set by error_peer_lost, cleared by
     * error_set and error_errno, kept by error_prefix. */
    bool peer_lost;
};

/* Sets err->text from a printf format (err may be NULL). Always returns -1, so
 * that `return error_set(err, ...);` reads naturally. The text is escaped
 * (error_escape): it is always one printable line. */
int error_set(struct plait_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* error_set for a lost peer: the text names it; sets err->peer_lost. */
int error_peer_lost(struct plait_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes err->text with a printf-formatted context ("loading checkpoint x: "). */
int error_prefix(struct plait_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sets err->text to "<what>: <strerror(errno)>" using the current errno. */
int error_errno(struct plait_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Copies src into dst (n bytes, always NUL-terminated) with every character
 * that could move a terminal's cursor or start an escape sequence written out
 * visibly: C0 controls and DEL as \n, \t, \r or \xNN, C1 controls as \u0080..\u009f,
 * and bytes that are not valid UTF-8 as \xNN. Text that reaches a terminal or
 * a daemon's log (error texts, log lines) goes through it, so a hostile key
 * in a plan cannot forge a second log line. Returns dst. */
char *error_escape(char *dst, size_t n, const char *src);

#endif
