/* cmd_data.c — `plait data prepare TEXT OUT.bin [--val VAL.bin]
 * [--val-fraction F]`: turns a text file into byte-level tokens (vocab 256)
 * in llm.c's shard format, optionally holding back the end as validation
 * data, and reports the unigram entropy (the loss a model must beat). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/log.h"
#include "launcher/commands.h"

enum { OPT_VAL, OPT_VAL_FRACTION };
const struct cli_command cmd_data_prepare_cli = {
    .name = "data prepare",
    .operands = "TEXT OUT.bin",
    .min_operands = 2,
    .max_operands = 2,
    .summary = "turn a text file into byte tokens",
    .description =
        "Writes the bytes of TEXT as tokens (vocabulary 256) in llm.c's token-shard format\n"
        "and prints the token counts and the unigram entropy of the training part: the\n"
        "loss a model must beat to have learned more than letter frequencies.",
    .options =
        (const struct cli_option[]){
            [OPT_VAL] = {"--val", "VAL.bin",
                         "hold back the end of the text as validation data, here"},
            [OPT_VAL_FRACTION] =
                {"--val-fraction", "F",
                 "the share of the text --val holds back, in (0, 1) (default 0.1)"},
            {0}},
};

static int write_shard(const char *path, const unsigned char *text, size_t n,
                       struct plait_error *err)
{
    if (n > INT32_MAX)
        return error_set(err, "%s: %zu tokens do not fit one shard (max %d)", path, n, INT32_MAX);
    char *dir = fs_dirname(path); /* made if missing, as the plan's data directory */
    int made = dir ? fs_mkdir_p(dir, err) : error_set(err, "out of memory");
    free(dir);
    if (made) return -1;
    size_t bytes = LLMC_HEADER_BYTES + n * 2;
    char *buf = malloc(bytes);
    if (!buf) return error_set(err, "out of memory");
    int32_t header[LLMC_HEADER_INTS];
    llmc_tokens_header_fill(header, (int64_t)n, 2);
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

int cmd_data_prepare(int argc, char **argv)
{
    const struct cli_command *cli = &cmd_data_prepare_cli;
    struct cli_args a;
    int rc = cli_parse(cli, argc, argv, &a);
    if (rc != CLI_CONTINUE) return rc;
    const char *operand[2] = {NULL, NULL}, *val = NULL, *fraction_text = NULL;
    double fraction = 0.1;
    for (int k = 0, n = 0; k < a.n; k++) {
        if (a.v[k].opt < 0) operand[n++] = a.v[k].value;
        if (a.v[k].opt == OPT_VAL) val = a.v[k].value;
        if (a.v[k].opt == OPT_VAL_FRACTION) fraction_text = a.v[k].value;
    }
    cli_args_free(&a);
    const char *text_path = operand[0], *out = operand[1];
    if (fraction_text) {
        char *end;
        fraction = strtod(fraction_text, &end);
        if (*end || !(fraction > 0 && fraction < 1))
            return cli_usage_error(cli, "--val-fraction must be between 0 and 1 (got %s)",
                                   fraction_text);
        if (!val) return cli_usage_error(cli, "--val-fraction needs --val VAL.bin");
    }
    /* an output that is an input, or both outputs one file, would replace
     * what is still to be read or written */
    if (fs_same_file(text_path, out))
        return cli_usage_error(cli, "%s is the text it would be made from: name another file",
                               out);
    if (val && (fs_same_file(text_path, val) || fs_same_file(out, val)))
        return cli_usage_error(cli, "--val %s is %s: name another file", val,
                               fs_same_file(text_path, val) ? "the text" : "the training shard");
    struct plait_error err;
    size_t n;
    unsigned char *text = (unsigned char *)fs_read_all(text_path, &n, &err);
    if (!text) {
        log_error("%s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    size_t n_val = val ? (size_t)(fraction * (double)n) : 0, n_train = n - n_val;
    rc = PLAIT_EXIT_ERROR;
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
