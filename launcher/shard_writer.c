/* shard_writer.c — streaming llm.c token shards (shard_writer.h): a zero header first, the
 * tokens as they come, then the real header, fsync, rename and the directory's fsync. */
#include "launcher/shard_writer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/llmc.h"
#include "common/fsutil.h"

int shard_writer_open(struct shard_writer *w, const char *path, int vocab, struct plait_error *err)
{
    memset(w, 0, sizeof *w);
    w->token_bytes = vocab <= 65536 ? 2 : 4;
    char *dir = fs_dirname(path); /* made if missing, as the plan's data directory */
    int made = dir ? fs_mkdir_p(dir, err) : error_set(err, "out of memory");
    free(dir);
    if (made) return -1;
    if (!(w->path = strdup(path)) || asprintf(&w->tmp, "%s.tmp", path) < 0) {
        w->tmp = NULL;
        free(w->path);
        return error_set(err, "out of memory");
    }
    int32_t header[LLMC_HEADER_INTS] = {0};
    if (!(w->f = fopen(w->tmp, "w+b")) || fwrite(header, sizeof header, 1, w->f) != 1) {
        error_errno(err, "creating %s", w->tmp);
        shard_writer_abandon(w);
        return -1;
    }
    return 0;
}

int shard_writer_put(struct shard_writer *w, const int32_t *ids, size_t n, struct plait_error *err)
{
    uint16_t buf[4096];
    if (w->token_bytes == 4 && fwrite(ids, 4, n, w->f) != n)
        return error_errno(err, "writing %s", w->tmp);
    for (size_t at = 0; w->token_bytes == 2 && at < n; at += 4096) {
        size_t k = n - at < 4096 ? n - at : 4096;
        for (size_t i = 0; i < k; i++) buf[i] = (uint16_t)ids[at + i];
        if (fwrite(buf, 2, k, w->f) != k) return error_errno(err, "writing %s", w->tmp);
    }
    w->tokens += (int64_t)n;
    return 0;
}

int shard_writer_split(struct shard_writer *w, int64_t from, struct shard_writer *to,
                       struct plait_error *err)
{
    enum { CHUNK = 1 << 16 };
    int32_t *ids = malloc(CHUNK * sizeof *ids);
    unsigned char *raw = malloc(CHUNK * 4);
    int rc = ids && raw ? 0 : error_set(err, "out of memory");
    int64_t total = w->tokens;
    for (int64_t at = from; rc == 0 && at < total; at += CHUNK) {
        size_t n = total - at < CHUNK ? (size_t)(total - at) : CHUNK;
        if (fseeko(w->f, LLMC_HEADER_BYTES + at * w->token_bytes, SEEK_SET) != 0 ||
            fread(raw, (size_t)w->token_bytes, n, w->f) != n) {
            rc = error_errno(err, "reading back %s", w->tmp);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            uint16_t t16;
            uint32_t t32;
            if (w->token_bytes == 2) memcpy(&t16, raw + 2 * i, 2), ids[i] = t16;
            else memcpy(&t32, raw + 4 * i, 4), ids[i] = (int32_t)t32;
        }
        rc = shard_writer_put(to, ids, n, err);
    }
    free(ids);
    free(raw);
    if (rc == 0 && (fflush(w->f) != 0 ||
                    ftruncate(fileno(w->f), LLMC_HEADER_BYTES + from * w->token_bytes) != 0))
        rc = error_errno(err, "truncating %s", w->tmp);
    if (rc == 0) {
        w->tokens = from;
        fseeko(w->f, 0, SEEK_END);
    }
    return rc;
}

int shard_writer_close(struct shard_writer *w, struct plait_error *err)
{
    int32_t header[LLMC_HEADER_INTS];
    int rc = 0;
    if (w->tokens > INT32_MAX)
        rc = error_set(err, "%s: %lld tokens do not fit one shard (max %d)", w->path,
                       (long long)w->tokens, INT32_MAX);
    llmc_tokens_header_fill(header, w->tokens, w->token_bytes);
    if (rc == 0 && (fseeko(w->f, 0, SEEK_SET) != 0 || fwrite(header, sizeof header, 1, w->f) != 1 ||
                    fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        rc = error_errno(err, "writing %s", w->tmp);
    if (rc == 0 && fclose(w->f) != 0) rc = error_errno(err, "closing %s", w->tmp);
    if (rc == 0) w->f = NULL;
    if (rc == 0 && rename(w->tmp, w->path) != 0)
        rc = error_errno(err, "renaming %s to %s", w->tmp, w->path);
    char *dir = rc == 0 ? fs_dirname(w->path) : NULL;
    if (rc == 0) rc = dir ? fs_fsync_dir(dir, err) : error_set(err, "out of memory");
    free(dir);
    shard_writer_abandon(w);
    return rc;
}

void shard_writer_abandon(struct shard_writer *w)
{
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
    }
    free(w->path);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}
