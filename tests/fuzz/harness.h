/* harness.h — what the fuzz targets share: the files a reader opens (memfds at
 * fixed descriptors, named by their /proc/self/fd path, so a crash leaves
 * nothing behind), a private directory for names, FUZZ_CHECK and the check
 * every error message must pass. The targets are tests/fuzz/fuzz_*.c. */
#ifndef PLAIT_FUZZ_HARNESS_H
#define PLAIT_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* Descriptors FUZZ_FD .. FUZZ_FD + FUZZ_FDS - 1 are the harness's. */
#define FUZZ_FD 900
#define FUZZ_FDS 16

/* "/proc/self/fd/<fd>", in a static buffer that the next call overwrites. */
const char *fuzz_fd_path(int fd);

/* Makes descriptor fd a memfd holding bytes (replacing what it was) and
 * returns its path (as fuzz_fd_path). Aborts on an error. */
const char *fuzz_file(int fd, const void *bytes, size_t n);

/* Makes descriptor fd the read end of a pipe whose write end stays open, so
 * that opening and reading its path blocks as a FIFO nobody writes to does. */
const char *fuzz_fifo(int fd);

/* Closes descriptor fd if the harness made it (a glob then no longer finds it). */
void fuzz_close(int fd);

/* A private directory (plait-fuzz.XXXXXX in $TMPDIR, else /dev/shm, else /tmp)
 * for names that must be names, made on the first call and removed at exit;
 * put only symbolic links to fuzz_file paths there (a crash leaves it). */
const char *fuzz_dir(void);

/* Aborts unless text is an error message as error.h promises: not empty, one
 * line a terminal shows as it is (no C0, DEL or C1 controls; valid UTF-8 with
 * no overlong forms or surrogates). */
void fuzz_check_message(const char *text);

/* Aborts with file:line and a message when an invariant does not hold. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
