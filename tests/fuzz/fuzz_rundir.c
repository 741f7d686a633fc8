/* fuzz_rundir.c — libFuzzer target for the readers of a run directory and a
 * checkpoint's files, what plait status, plait ckpt and a resume read from
 * disk: metrics.jsonl (metrics_read), end.json (runend_read), run.json
 * (runjson_read), state.json (ckpt_read_state), manifest.json
 * (ckpt_manifest_read, ckpt_layout_read). The input's first byte picks the
 * reader, the rest is the file. Checks that a refusal is one printable line
 * naming the file, and that what is accepted is freed cleanly. Part files
 * need a whole checkpoint around them: fuzz_ckpt_parts.c. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/ckpt_manifest.h"
#include "common/formats/ckpt_state.h"
#include "common/formats/metrics.h"
#include "common/formats/rundir.h"
#include "common/formats/runend.h"
#include "common/formats/runjson.h"
#include "tests/fuzz/harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { METRICS, END, RUN, STATE, MANIFEST, LAYOUT, READERS };

static const char *const names[READERS] = {RUNDIR_METRICS, RUNDIR_END,    RUNDIR_RUN,
                                           CKPT_STATE,     CKPT_MANIFEST, CKPT_MANIFEST};

/* name in the private directory, a link to a memfd holding the bytes */
static void place(const char *name, const uint8_t *bytes, size_t n)
{
    char link[4096];
    snprintf(link, sizeof link, "%s/%s", fuzz_dir(), name);
    const char *target = fuzz_file(FUZZ_FD, bytes, n);
    if (unlink(link) != 0 && errno != ENOENT) abort();
    if (symlink(target, link) != 0) abort();
}

/* a refusal: one printable line that names the file it read */
static void refused(const struct plait_error *err, const char *name)
{
    fuzz_check_message(err->text);
    FUZZ_CHECK(strstr(err->text, name) != NULL, "the error does not name %s: %s", name, err->text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = data[0] % READERS;
    const char *dir = fuzz_dir(), *name = names[which];
    place(name, data + 1, size - 1);
    struct plait_error err = {.text = ""};
    int rc;
    switch (which) {
    case METRICS: {
        struct metrics_series s;
        rc = metrics_read(dir, &s, &err);
        if (rc == 0) metrics_series_free(&s);
        break;
    }
    case END: {
        struct run_end e;
        rc = runend_read(dir, &e, &err);
        if (rc == RUNEND_NONE) rc = 0;
        break;
    }
    case RUN: {
        struct run_record r;
        rc = runjson_read(dir, &r, &err);
        if (rc == 0) runjson_free(&r);
        break;
    }
    case STATE: {
        struct train_state st;
        rc = ckpt_read_state(dir, &st, &err);
        if (rc == 0) FUZZ_CHECK(st.step >= 0 && st.micro >= 0 && st.tokens >= 0, "negative counts");
        break;
    }
    case MANIFEST: {
        struct ckpt_manifest m;
        rc = ckpt_manifest_read(dir, &m, &err);
        if (rc == 0) ckpt_manifest_free(&m);
        break;
    }
    default: {
        struct ckpt_layout l;
        rc = ckpt_layout_read(dir, &l, &err);
        if (rc == 0) ckpt_layout_free(&l);
        break;
    }
    }
    if (rc < 0) refused(&err, name);
    fuzz_close(FUZZ_FD);
    return 0;
}
