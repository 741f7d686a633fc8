/* test_data.c — readers sharing the data (data parallelism): r readers taking
 * turns see, together, exactly the windows one reader sees, in the same
 * order, in order and shuffled, across shard and epoch boundaries; and after
 * every micro-batch they all stand where the single reader stands. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/fsutil.h"
#include "common/llmc.h"
#include "runtime/data.h"

static char dir[] = "/tmp/plait-test-data.XXXXXX";

static void write_shard(const char *name, int n, int salt)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t bytes = LLMC_HEADER_BYTES + (size_t)n * 2;
    char *buf = calloc(1, bytes);
    int32_t header[LLMC_HEADER_INTS];
    llmc_tokens_header_fill(header, n);
    memcpy(buf, header, sizeof header);
    uint16_t *tok = (uint16_t *)(buf + LLMC_HEADER_BYTES);
    for (int i = 0; i < n; i++) tok[i] = (uint16_t)((i * 7 + salt) % 97);
    struct plait_error err;
    fs_write_atomic(path, buf, bytes, &err);
    free(buf);
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

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    write_shard("shard_0.bin", 101, 1);
    write_shard("shard_1.bin", 57, 5);
    write_shard("shard_2.bin", 200, 9);
    RUN(test_readers_sharing_the_data_see_what_one_reader_sees);
    fs_remove_tree(dir, NULL);
    return check_exit_code();
}
