/* cmd_data.c — `plait data prepare TEXT OUT.bin [--val VAL.bin]
 * [--val-fraction F]`: turns a text file into byte-level tokens (vocab 256)
 * in llm.c's shard format, optionally holding back the end as validation
 * data, and reports the unigram entropy (the loss a model must beat). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fsutil.h"
#include "common/llmc.h"
#include "common/log.h"
#include "launcher/commands.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: plait data prepare TEXT OUT.bin [--val VAL.bin] [--val-fraction F]\n"
                 "  writes the bytes of TEXT as tokens (vocab 256) in llm.c's shard format;\n"
                 "  with --val, the last F of the text (default 0.1) goes to VAL.bin instead\n");
}

static int write_shard(const char *path, const unsigned char *text, size_t n,
                       struct plait_error *err)
{
    if (n > INT32_MAX)
        return error_set(err, "%s: %zu tokens do not fit one shard (max %d)", path, n, INT32_MAX);
    size_t bytes = LLMC_HEADER_BYTES + n * 2;
    char *buf = malloc(bytes);
    if (!buf) return error_set(err, "out of memory");
    int32_t header[LLMC_HEADER_INTS];
    llmc_tokens_header_fill(header, (int64_t)n);
    memcpy(buf, header, sizeof header);
    uint16_t *tok = (uint16_t *)(buf + LLMC_HEADER_BYTES);
    for (size_t i = 0; i < n; i++) tok[i] = text[i];
    int rc = fs_write_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

static double unigram_entropy_nats(const unsigned char *text, size_t n)
{
    size_t count[256] = {0};
    for (size_t i = 0; i < n; i++) count[text[i]]++;
    double h = 0;
    for (int c = 0; c < 256; c++)
        if (count[c]) h -= (double)count[c] / n * log((double)count[c] / n);
    return h;
}

static int prepare(int argc, char **argv)
{
    const char *text_path = NULL, *out = NULL, *val = NULL;
    double fraction = 0.1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return PLAIT_EXIT_OK;
        } else if (!strcmp(argv[i], "--val") && i + 1 < argc) {
            val = argv[++i];
        } else if (!strcmp(argv[i], "--val-fraction") && i + 1 < argc) {
            char *end;
            fraction = strtod(argv[++i], &end);
            if (*end || !(fraction > 0 && fraction < 1)) {
                log_error("data prepare: --val-fraction must be between 0 and 1 (got %s)", argv[i]);
                return PLAIT_EXIT_USAGE;
            }
        } else if (argv[i][0] == '-' || (text_path && out)) {
            log_error("data prepare: unexpected argument '%s'", argv[i]);
            usage(stderr);
            return PLAIT_EXIT_USAGE;
        } else if (!text_path) {
            text_path = argv[i];
        } else {
            out = argv[i];
        }
    }
    if (!text_path || !out) {
        usage(stderr);
        return PLAIT_EXIT_USAGE;
    }
    struct plait_error err;
    size_t n;
    unsigned char *text = (unsigned char *)fs_read_all(text_path, &n, &err);
    if (!text) {
        log_error("%s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    size_t n_val = val ? (size_t)(fraction * (double)n) : 0, n_train = n - n_val;
    int rc = PLAIT_EXIT_ERROR;
    if (n_train < 2 || (val && n_val < 2)) {
        log_error("%s: %zu bytes is too little text", text_path, n);
        goto out;
    }
    if (write_shard(out, text, n_train, &err) ||
        (val && write_shard(val, text + n_train, n_val, &err))) {
        log_error("%s", err.text);
        goto out;
    }
    printf("%s: %zu tokens (vocab 256), unigram entropy %.4f nats/token\n", out, n_train,
           unigram_entropy_nats(text, n_train));
    if (val) printf("%s: %zu tokens\n", val, n_val);
    rc = PLAIT_EXIT_OK;
out:
    free(text);
    return rc;
}

int cmd_data(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "prepare")) return prepare(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "--help")) {
        usage(stdout);
        return PLAIT_EXIT_OK;
    }
    log_error("data: expected 'prepare'");
    usage(stderr);
    return PLAIT_EXIT_USAGE;
}
