/* test_data.c — readers sharing the data (data parallelism): r readers taking
 * turns see, together, exactly the windows one reader sees, in the same
 * order, in order and shuffled, across shard and epoch boundaries; and after
 * every micro-batch they all stand where the single reader stands. A token
 * outside the vocabulary, in the file at open or written into it while
 * training reads it, stops the reader naming the file and the position (the
 * classifier is never handed it as a target). Shards of uint32 tokens read as those of
 * uint16 ones. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "runtime/data.h"

static char dir[] = "/tmp/plait-test-data.XXXXXX";

/* A shard of n tokens (token_bytes 2: uint16, 4: uint32), token i = (7i + salt) % modulo. */
static void write_shard_of(const char *name, int n, int salt, int token_bytes, uint32_t modulo)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t bytes = LLMC_HEADER_BYTES + (size_t)n * (size_t)token_bytes;
    char *buf = calloc(1, bytes);
    int32_t header[LLMC_HEADER_INTS];
    llmc_tokens_header_fill(header, n, token_bytes);
    memcpy(buf, header, sizeof header);
    for (int i = 0; i < n; i++) {
        uint32_t t = ((uint32_t)i * 7 + (uint32_t)salt) % modulo;
        uint16_t t16 = (uint16_t)t;
        memcpy(buf + LLMC_HEADER_BYTES + (size_t)i * (size_t)token_bytes,
               token_bytes == 2 ? (const void *)&t16 : (const void *)&t, (size_t)token_bytes);
    }
    struct plait_error err;
    fs_write_atomic(path, buf, bytes, &err);
    free(buf);
}

static void write_shard(const char *name, int n, int salt)
{
    write_shard_of(name, n, salt, 2, 97);
}

static void check_sharing(bool shuffle, int ranks)
{
    enum { B = 2, T = 5, STEPS = 40 };
    char pattern[256];
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", dir);
    struct data_loader one, many[4];
    struct plait_error err;
    if (data_open(&one, pattern, B, T, 97, shuffle, 3, &err)) {
        CHECK(0, "%s", err.text);
        return;
    }
    for (int r = 0; r < ranks; r++) data_open(&many[r], pattern, B, T, 97, shuffle, 3, &err);
    int32_t in1[B * T], tg1[B * T], in2[B * T], tg2[B * T];
    for (int step = 0; step < STEPS; step++) {
        for (int r = 0; r < ranks; r++) {
            CHECK(data_next(&one, in1, tg1, &err) == 0, "%s", err.text);
            CHECK(data_next_of(&many[r], r, ranks, in2, tg2, &err) == 0, "%s", err.text);
            CHECK(!memcmp(in1, in2, sizeof in1) && !memcmp(tg1, tg2, sizeof tg1),
                  "shuffle %d ranks %d step %d reader %d: another window", shuffle, ranks, step, r);
        }
        for (int r = 0; r < ranks; r++)
            CHECK(!memcmp(&many[r].pos, &one.pos, sizeof one.pos),
                  "shuffle %d ranks %d step %d: reader %d stands elsewhere", shuffle, ranks, step,
                  r);
    }
    data_close(&one);
    for (int r = 0; r < ranks; r++) data_close(&many[r]);
}

static void test_readers_sharing_the_data_see_what_one_reader_sees(void)
{
    for (int ranks = 1; ranks <= 4; ranks++) {
        check_sharing(false, ranks);
        check_sharing(true, ranks);
    }
}

/* a token at or past model.vocab: refused at open, and when the file is
 * changed after open, by the read of the window that holds it */
static void test_a_token_outside_the_vocabulary_is_refused_naming_file_and_position(void)
{
    enum { B = 2, T = 5 };
    char pattern[256], path[300];
    snprintf(pattern, sizeof pattern, "%s/bad_*.bin", dir);
    snprintf(path, sizeof path, "%s/bad_0.bin", dir);
    write_shard("bad_0.bin", 101, 1); /* tokens (7i + 1) % 97, all below 97 */
    struct data_loader d;
    struct plait_error err;
    int32_t in[B * T], tg[B * T];
    CHECK(data_open(&d, pattern, B, T, 97, false, 3, &err) == 0, "%s", err.text);
    CHECK(data_next(&d, in, tg, &err) == 0, "%s", err.text);
    /* the next window is tokens 10..20: token 13 becomes 500 */
    uint16_t bad = 500;
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, &bad, 2, LLMC_HEADER_BYTES + 2 * 13) == 2, "cannot write %s", path);
    if (fd >= 0) close(fd);
    char want[512];
    snprintf(want, sizeof want,
             "%s: token 500 at position 13 (byte %d) is not below the vocabulary size 97 "
             "(model.vocab); the file changed since training opened it",
             path, LLMC_HEADER_BYTES + 26);
    CHECK(data_next(&d, in, tg, &err) != 0 && strcmp(err.text, want) == 0, "got \"%s\"", err.text);
    data_close(&d);
    /* and opened again, the check at open finds it */
    snprintf(want, sizeof want,
             "%s: token 500 at position 13 (byte %d) is not below the vocabulary size 97 "
             "(model.vocab)",
             path, LLMC_HEADER_BYTES + 26);
    CHECK(data_open(&d, pattern, B, T, 97, false, 3, &err) != 0 && strstr(err.text, want),
          "got \"%s\"", err.text);
}

/* llm.c's uint32 shards (vocabularies above 65536) read as the uint16 ones, both in one glob */
static void test_uint32_shards_read_their_tokens_beside_uint16_ones(void)
{
    enum { B = 2, T = 5, V = 200019 };
    char pattern[256];
    snprintf(pattern, sizeof pattern, "%s/wide_*.bin", dir);
    write_shard_of("wide_0.bin", 23, 3, 4, V - 1000);
    write_shard_of("wide_1.bin", 31, 5, 2, 65536);
    struct data_loader d;
    struct plait_error err;
    int32_t in[B * T], tg[B * T];
    CHECK(data_open(&d, pattern, B, T, V, false, 3, &err) == 0, "%s", err.text);
    CHECK(d.shards[0].token_bytes == 4 && d.shards[1].token_bytes == 2, "token sizes %d %d",
          d.shards[0].token_bytes, d.shards[1].token_bytes);
    /* wide_0 holds two windows (23 tokens), then wide_1 two (31 tokens) */
    for (int w = 0; w < 4; w++) {
        CHECK(data_next(&d, in, tg, &err) == 0, "%s", err.text);
        uint32_t salt = w < 2 ? 3 : 5, modulo = w < 2 ? V - 1000 : 65536;
        int64_t at = (w % 2) * B * T;
        for (int i = 0; i < B * T; i++) {
            uint32_t want_in = ((uint32_t)(at + i) * 7 + salt) % modulo,
                     want_tg = ((uint32_t)(at + i + 1) * 7 + salt) % modulo;
            CHECK((uint32_t)in[i] == want_in && (uint32_t)tg[i] == want_tg,
                  "window %d token %d: %d -> %d, want %u -> %u", w, i, in[i], tg[i], want_in,
                  want_tg);
        }
    }
    data_close(&d);
    /* a uint32 token at or past model.vocab is named with its byte (4 a token) */
    char want[512], path[300];
    snprintf(path, sizeof path, "%s/wide_0.bin", dir);
    uint32_t bad = V + 5;
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, &bad, 4, LLMC_HEADER_BYTES + 4 * 13) == 4, "cannot write %s", path);
    if (fd >= 0) close(fd);
    snprintf(want, sizeof want,
             "%s: token %u at position 13 (byte %d) is not below the vocabulary size %d "
             "(model.vocab)",
             path, bad, LLMC_HEADER_BYTES + 52, V);
    CHECK(data_open(&d, pattern, B, T, V, false, 3, &err) != 0 && strstr(err.text, want),
          "got \"%s\"", err.text);
}

/* the header names the token size: a uint32 header on uint16 tokens is the wrong length */
static void test_a_shard_whose_size_is_not_its_token_size_is_refused(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/mixed_0.bin", dir);
    write_shard_of("mixed_0.bin", 20, 1, 2, 97);
    int32_t header[LLMC_HEADER_INTS];
    llmc_tokens_header_fill(header, 20, 4);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, header, sizeof header, 0) == (ssize_t)sizeof header, "write");
    if (fd >= 0) close(fd);
    int64_t n;
    int width;
    struct plait_error err;
    char want[512];
    snprintf(want, sizeof want, "%s: header says 20 tokens (%d bytes) but the file has %d bytes",
             path, LLMC_HEADER_BYTES + 80, LLMC_HEADER_BYTES + 40);
    CHECK(llmc_read_tokens_header(path, &n, &width, &err) != 0 && strcmp(err.text, want) == 0,
          "got \"%s\"", err.text);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    write_shard("shard_0.bin", 101, 1);
    write_shard("shard_1.bin", 57, 5);
    write_shard("shard_2.bin", 200, 9);
    RUN(test_readers_sharing_the_data_see_what_one_reader_sees);
    RUN(test_a_token_outside_the_vocabulary_is_refused_naming_file_and_position);
    RUN(test_uint32_shards_read_their_tokens_beside_uint16_ones);
    RUN(test_a_shard_whose_size_is_not_its_token_size_is_refused);
    fs_remove_tree(dir, NULL);
    return check_exit_code();
}
