/* cmd_data.c — `plait data prepare TEXT... OUT.bin [--val VAL.bin] [--val-fraction F]
 * [--tokenizer FILE ...]`: without a tokenizer, one text file's bytes as tokens (vocab 256)
 * in llm.c's shard format, optionally holding back the end as validation data, and the
 * unigram entropy (the loss a model must beat); with one, the tokenizing pipeline of
 * data_tokenize.h. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/data_tokenize.h"

enum {
    OPT_VAL,
    OPT_VAL_FRACTION,
    OPT_TOKENIZER,
    OPT_TIKTOKEN,
    OPT_FIELD,
    OPT_THREADS,
    OPT_CHUNK_BYTES,
    OPT_COUNT
};
const struct cli_command cmd_data_prepare_cli = {
    .name = "data prepare",
    .operands = "TEXT... OUT.bin",
    .min_operands = 2,
    .max_operands = 1 << 20,
    .summary = "turn text into tokens (bytes, or a BPE tokenizer's)",
    .description =
        "Writes the bytes of TEXT as tokens (vocabulary 256) in llm.c's token-shard format\n"
        "and prints the token counts and the unigram entropy of the training part: the\n"
        "loss a model must beat to have learned more than letter frequencies.\n"
        "\n"
        "With --tokenizer, the texts (files, globs, - for stdin; each file one document, or\n"
        "with --field each JSONL line's member) are tokenized by a byte-level BPE tokenizer\n"
        "on all cores, streaming (files larger than memory are fine), with the end-of-text\n"
        "token between documents. Tokens are uint16 when the vocabulary fits 65536, else\n"
        "uint32 (llm.c's 32-bit shard format); the tokenizer's file is copied beside\n"
        "OUT.bin, where plait train finds it for samples and prompts.",
    .options =
        (const struct cli_option[]){
            [OPT_VAL] = {"--val", "VAL.bin",
                         "hold back the end of the text as validation data, here"},
            [OPT_VAL_FRACTION] =
                {"--val-fraction", "F",
                 "the share of the text --val holds back, in (0, 1) (default 0.1)"},
            [OPT_TOKENIZER] = {"--tokenizer", "FILE",
                               "a Hugging Face tokenizer.json (byte-level BPE) or a tiktoken\n"
                               "ranks file (NAME.tiktoken: gpt2, cl100k_base, o200k_base, ...)"},
            [OPT_TIKTOKEN] = {"--tiktoken", "NAME",
                              "the tiktoken encoding FILE holds, when its name does not say"},
            [OPT_FIELD] = {"--field", "NAME",
                           "the texts are JSONL: each line's member NAME is a document"},
            [OPT_THREADS] = {"--threads", "N", "threads that tokenize (default: all cores)"},
            [OPT_CHUNK_BYTES] = {"--chunk-bytes", "N",
                                 "text a thread tokenizes at a time (default 1048576)"},
            [OPT_COUNT] = {0}},
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

/* a whole number in [1, most], or -1 */
static long parse_count(const char *text, long most)
{
    char *end;
    long v = text ? strtol(text, &end, 10) : -1;
    return text && *end == 0 && v >= 1 && v <= most ? v : -1;
}

static int prepare_tokenized(const struct cli_command *cli, char **operand, int n,
                             const char *val, double fraction, const char *opt[OPT_COUNT])
{
    long threads = opt[OPT_THREADS] ? parse_count(opt[OPT_THREADS], 4096) : omp_get_max_threads();
    long chunk = opt[OPT_CHUNK_BYTES] ? parse_count(opt[OPT_CHUNK_BYTES], 1L << 30) : 1 << 20;
    if (threads < 0) return cli_usage_error(cli, "--threads must be in [1, 4096]");
    if (chunk < 0) return cli_usage_error(cli, "--chunk-bytes must be in [1, 2^30]");
    const char *out = operand[n - 1];
    for (int i = 0; i < n - 1; i++)
        if (fs_same_file(operand[i], out) || (val && fs_same_file(operand[i], val)))
            return cli_usage_error(cli, "%s is a text it would be made from: name another file",
                                   fs_same_file(operand[i], out) ? out : val);
    struct data_tokenize_opts o = {.inputs = operand,
                                   .n_inputs = n - 1,
                                   .out = out,
                                   .val = val,
                                   .val_fraction = fraction,
                                   .tokenizer = opt[OPT_TOKENIZER],
                                   .tiktoken_name = opt[OPT_TIKTOKEN],
                                   .field = opt[OPT_FIELD],
                                   .threads = (int)threads,
                                   .chunk_bytes = (size_t)chunk};
    struct plait_error err;
    if (data_tokenize(&o, &err)) {
        log_error("%s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    return PLAIT_EXIT_OK;
}

static int prepare_bytes(const struct cli_command *cli, const char *text_path, const char *out,
                         const char *val, double fraction)
{
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

int cmd_data_prepare(int argc, char **argv)
{
    const struct cli_command *cli = &cmd_data_prepare_cli;
    struct cli_args a;
    int rc = cli_parse(cli, argc, argv, &a);
    if (rc != CLI_CONTINUE) return rc;
    const char *opt[OPT_COUNT] = {0};
    char **operand = calloc((size_t)a.n + 1, sizeof *operand);
    int n = 0;
    double fraction = 0.1;
    for (int k = 0; operand && k < a.n; k++) {
        if (a.v[k].opt < 0) operand[n++] = (char *)a.v[k].value;
        else opt[a.v[k].opt] = a.v[k].value;
    }
    const char *val = opt[OPT_VAL], *fraction_text = opt[OPT_VAL_FRACTION];
    if (!operand) {
        rc = PLAIT_EXIT_ERROR;
        log_error("out of memory");
    } else if (fraction_text &&
               (fraction = strtod(fraction_text, (char **)&fraction_text), *fraction_text ||
                !(fraction > 0 && fraction < 1))) {
        rc = cli_usage_error(cli, "--val-fraction must be between 0 and 1 (got %s)",
                             opt[OPT_VAL_FRACTION]);
    } else if (opt[OPT_VAL_FRACTION] && !val) {
        rc = cli_usage_error(cli, "--val-fraction needs --val VAL.bin");
    } else if (!opt[OPT_TOKENIZER] && (n > 2 || opt[OPT_TIKTOKEN] || opt[OPT_FIELD] ||
                                       opt[OPT_THREADS] || opt[OPT_CHUNK_BYTES])) {
        rc = cli_usage_error(cli, "%s needs --tokenizer FILE",
                             n > 2 ? "more than one TEXT" : "this option");
    } else {
        rc = opt[OPT_TOKENIZER] ? prepare_tokenized(cli, operand, n, val, fraction, opt)
                                : prepare_bytes(cli, operand[0], operand[1], val, fraction);
    }
    free(operand);
    cli_args_free(&a);
    return rc;
}
