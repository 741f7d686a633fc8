/* cmd_data_decode.c — `plait data decode SHARD.bin [--tokenizer FILE]`: a token shard's
 * tokens as text again, through the tokenizer beside it (or the one named), so a prepared
 * shard can be read and checked (decode(encode(text)) = text). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/llmc.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/place/env.h"
#include "launcher/commands.h"
#include "sample/tokenizer.h"

enum { OPT_TOKENIZER };
const struct cli_command cmd_data_decode_cli = {
    .name = "data decode",
    .operands = "SHARD.bin",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "write a token shard's text",
    .description = "Writes the text of SHARD.bin's tokens to stdout, byte for byte, through the\n"
                   "tokenizer plait data prepare left beside it (or --tokenizer's); without\n"
                   "one, each token is a byte.",
    .options = (const struct cli_option[]){[OPT_TOKENIZER] = {"--tokenizer", "FILE",
                                                              "a tokenizer.json, NAME.tiktoken or "
                                                              "llm.c tokenizer file"},
                                           {0}},
};

/* The shard's tokens, one at a time, as the tokenizer's bytes (or bytes) to stdout. */
static int write_text(const char *path, const struct tokenizer *tok, struct plait_error *err)
{
    int64_t n;
    int width;
    if (llmc_read_tokens_header(path, &n, &width, err)) return -1;
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    int rc = fseek(f, LLMC_HEADER_BYTES, SEEK_SET) ? error_errno(err, "%s", path) : 0;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        uint32_t t = 0;
        size_t bytes = 1;
        if (fread(&t, (size_t)width, 1, f) != 1) { /* (little-endian, as llm.c writes) */
            rc = error_set(err, "%s: ends before token %lld", path, (long long)i);
            break;
        }
        unsigned char byte = (unsigned char)t;
        const char *piece = tok ? tokenizer_piece(tok, (int)t, &bytes) : (const char *)&byte;
        if (!piece || (!tok && t > 255))
            rc = error_set(err, "%s: token %u at position %lld is not %s", path, t, (long long)i,
                           tok ? "the tokenizer's" : "a byte (name the shard's --tokenizer)");
        else if (fwrite(piece, 1, bytes, stdout) != bytes)
            rc = error_errno(err, "writing the text");
    }
    fclose(f);
    return rc;
}

int cmd_data_decode(int argc, char **argv)
{
    const struct cli_command *cli = &cmd_data_decode_cli;
    struct cli_args a;
    int rc = cli_parse(cli, argc, argv, &a);
    if (rc != CLI_CONTINUE) return rc;
    const char *shard = NULL, *named = NULL;
    for (int k = 0; k < a.n; k++) {
        if (a.v[k].opt < 0) shard = a.v[k].value;
        if (a.v[k].opt == OPT_TOKENIZER) named = a.v[k].value;
    }
    struct plait_error err;
    struct tokenizer tok;
    char *dir = fs_dirname(shard), *found = named || !dir ? NULL : tokenizer_beside(dir);
    const char *path = named ? named : found;
    bool has_tok = path && tokenizer_load(&tok, path, &err) == 0;
    rc = PLAIT_EXIT_ERROR;
    if (path && !has_tok) log_error("%s", err.text);
    else if (write_text(shard, has_tok ? &tok : NULL, &err) || fflush(stdout) != 0)
        log_error("%s", err.text);
    else rc = PLAIT_EXIT_OK;
    if (has_tok) tokenizer_free(&tok);
    free(dir);
    free(found);
    cli_args_free(&a);
    return rc;
}
