/* harness.h — what the fuzz targets share: a private directory for the files
 * a reader must open (made once per process, removed at exit), writing one
 * there, and FUZZ_CHECK, which turns a broken invariant into a crash that
 * libFuzzer saves, and the check every error message must pass. Not a test framework: the targets
 * are tests/fuzz/fuzz_*.c. */
#ifndef PLAIT_FUZZ_HARNESS_H
#define PLAIT_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* The directory (plait-fuzz.XXXXXX in $TMPDIR, else /dev/shm, else /tmp),
 * made on the first call; aborts if it cannot be made. */
const char *fuzz_dir(void);

/* fuzz_dir()/name, in a static buffer that the next call overwrites. */
const char *fuzz_path(const char *name);

/* Writes bytes to fuzz_dir()/name (replacing it) and returns its path (as
 * fuzz_path); aborts on an I/O error. */
const char *fuzz_write(const char *name, const void *bytes, size_t n);

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
