/* ckpt.c — writing, verifying, pruning and loading checkpoint directories.
 * The file formats: model.bin (llm.c GPT-2, fp32), optim.bin (our header,
 * then AdamW m, v and, mid-step, the gradients), state.json, plan.json, and
 * manifest.json (sizes and CRC-32C of the others, written last). */
#include "runtime/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/fsutil.h"
#include "common/llmc.h"
#include "common/log.h"

#define OPTIM_MAGIC 20261122
#define OPTIM_VERSION 1
#define CHUNK_FLOATS (4u << 20) /* 16 MiB through host memory at a time */

/* ---- writing: a file with its running size and checksum -------------------- */

struct writer {
    int fd;
    const char *path;
    uint64_t bytes;
    uint32_t crc;
};

static int writer_open(struct writer *w, const char *path, struct plait_error *err)
{
    w->path = path;
    w->bytes = 0;
    w->crc = 0;
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) return error_errno(err, "creating %s", path);
    return 0;
}

static int writer_put(struct writer *w, const void *buf, size_t n, struct plait_error *err)
{
    w->crc = crc32c_update(w->crc, buf, n);
    w->bytes += n;
    const char *p = buf;
    while (n) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return error_errno(err, "writing %s", w->path);
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Streams n floats of backend memory through a host buffer. */
static int writer_put_device(struct writer *w, const struct ops *ops, const float *src, size_t n,
                             float *host, struct plait_error *err)
{
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CHUNK_FLOATS ? n - done : CHUNK_FLOATS;
        ops->download(host, src + done, k * sizeof(float));
        if (writer_put(w, host, k * sizeof(float), err)) return -1;
        done += k;
    }
    return 0;
}

static int writer_close(struct writer *w, json_t *manifest_files, const char *name,
                        struct plait_error *err)
{
    int rc = 0;
    if (fsync(w->fd) != 0) rc = error_errno(err, "fsync of %s", w->path);
    if (close(w->fd) != 0 && rc == 0) rc = error_errno(err, "closing %s", w->path);
    w->fd = -1;
    if (rc == 0)
        json_object_set_new(
            manifest_files, name,
            json_pack("{s:I,s:I}", "bytes", (json_int_t)w->bytes, "crc32c", (json_int_t)w->crc));
    return rc;
}

static int write_whole(const char *dir, const char *name, const void *data, size_t n, json_t *files,
                       struct plait_error *err)
{
    char path[4096];
    struct writer w;
    if (fs_join(path, sizeof path, dir, name, err) || writer_open(&w, path, err)) return -1;
    if (writer_put(&w, data, n, err)) {
        close(w.fd);
        return -1;
    }
    return writer_close(&w, files, name, err);
}

static json_t *state_to_json(const struct train_state *st)
{
    json_t *rng = json_array();
    for (int i = 0; i < 4; i++) {
        char hex[24];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st->sample_rng[i]);
        json_array_append_new(rng, json_string(hex));
    }
    return json_pack("{s:i,s:i,s:f,s:I,s:b,s:{s:I,s:I,s:I},s:o}", "step", st->step, "micro",
                     st->micro, "loss_sum", st->loss_sum, "tokens", (json_int_t)st->tokens,
                     "eval_pending", st->eval_pending, "data", "epoch", (json_int_t)st->data.epoch,
                     "shard", (json_int_t)st->data.shard, "index", (json_int_t)st->data.index,
                     "sample_rng", rng);
}

static int write_checkpoint_files(const char *tmp, const struct model *m,
                                  const struct train_state *st, const char *plan_json,
                                  json_t *files, struct plait_error *err)
{
    const struct ops *ops = m->ops;
    size_t P = m->layout.total;
    float *host = malloc(CHUNK_FLOATS * sizeof(float));
    if (!host) return error_set(err, "out of memory");
    char path[4096];
    struct writer w = {.fd = -1};
    int rc = -1;

    /* model.bin: an llm.c GPT-2 checkpoint, fp32 */
    int32_t header[LLMC_HEADER_INTS];
    struct llmc_model_header mh = {.version = LLMC_MODEL_VERSION_FP32,
                                   .max_seq_len = m->cfg.max_seq_len,
                                   .vocab = m->cfg.vocab,
                                   .layers = m->cfg.layers,
                                   .heads = m->cfg.heads,
                                   .hidden = m->cfg.hidden,
                                   .padded_vocab = m->cfg.padded_vocab};
    llmc_model_header_fill(header, &mh);
    if (fs_join(path, sizeof path, tmp, "model.bin", err) || writer_open(&w, path, err) ||
        writer_put(&w, header, sizeof header, err) ||
        writer_put_device(&w, ops, m->params, P, host, err) ||
        writer_close(&w, files, "model.bin", err))
        goto out;

    /* optim.bin: {magic, version, params (low, high 32 bits), has_grads}, m, v[, grads] */
    memset(header, 0, sizeof header);
    header[0] = OPTIM_MAGIC;
    header[1] = OPTIM_VERSION;
    header[2] = (int32_t)(uint32_t)(P & 0xffffffffu);
    header[3] = (int32_t)(uint32_t)(P >> 32);
    header[4] = st->micro > 0;
    if (fs_join(path, sizeof path, tmp, "optim.bin", err) || writer_open(&w, path, err) ||
        writer_put(&w, header, sizeof header, err) ||
        writer_put_device(&w, ops, m->adam_m, P, host, err) ||
        writer_put_device(&w, ops, m->adam_v, P, host, err) ||
        (st->micro > 0 && writer_put_device(&w, ops, m->grads, P, host, err)) ||
        writer_close(&w, files, "optim.bin", err))
        goto out;

    json_t *state = state_to_json(st);
    char *text = json_dumps(state, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(state);
    if (!text) {
        error_set(err, "out of memory");
        goto out;
    }
    rc = write_whole(tmp, "state.json", text, strlen(text), files, err);
    free(text);
    if (rc == 0 && plan_json)
        rc = write_whole(tmp, "plan.json", plan_json, strlen(plan_json), files, err);
out:
    if (w.fd >= 0) close(w.fd);
    free(host);
    return rc;
}

/* ---- listing ------------------------------------------------------------------ */

static int is_checkpoint_name(const char *name)
{
    unsigned s, mi;
    char tail;
    return sscanf(name, "step_%8u_%4u%c", &s, &mi, &tail) == 2 && strlen(name) == 18;
}

static int compare_desc(const void *a, const void *b)
{
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* The complete checkpoints of dir, newest first (malloc'ed names). */
static char **list_checkpoints(const char *dir, int *n, struct plait_error *err)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return calloc(1, sizeof(char *));
        error_errno(err, "listing %s", dir);
        return NULL;
    }
    int cap = 16;
    char **names = malloc((size_t)cap * sizeof *names);
    struct dirent *e;
    while (names && (e = readdir(d))) {
        if (!is_checkpoint_name(e->d_name)) continue;
        if (*n == cap) {
            cap *= 2;
            char **bigger = realloc(names, (size_t)cap * sizeof *names);
            if (!bigger) {
                for (int i = 0; i < *n; i++) free(names[i]);
                free(names);
                names = NULL;
                break;
            }
            names = bigger;
        }
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (!names) {
        error_set(err, "out of memory");
        return NULL;
    }
    qsort(names, (size_t)*n, sizeof *names, compare_desc);
    return names;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Removes complete checkpoints beyond the newest `keep`, and temporary
 * directories that crashed writers left behind. */
static void prune(const char *dir, int keep)
{
    struct plait_error err;
    int n;
    char **names = list_checkpoints(dir, &n, &err);
    if (!names) {
        log_warn("not pruning checkpoints: %s", err.text);
        return;
    }
    char path[4096];
    for (int i = keep; i < n; i++) {
        if (fs_join(path, sizeof path, dir, names[i], &err) || fs_remove_tree(path, &err))
            log_warn("%s", err.text);
    }
    free_names(names, n);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, ".tmp-", 5) != 0) continue;
        if (fs_join(path, sizeof path, dir, e->d_name, &err) || fs_remove_tree(path, &err))
            log_warn("%s", err.text);
    }
    if (d) closedir(d);
}

int ckpt_save(const char *dir, const struct model *m, const struct train_state *st, int keep,
              const char *plan_json, struct plait_error *err)
{
    char name[64], tmp_name[80], old_name[80], tmp[4096], final[4096] = "", old[4096];
    snprintf(name, sizeof name, "step_%08d_%04d", st->step, st->micro);
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s", name);
    snprintf(old_name, sizeof old_name, ".tmp-old-%s", name);
    json_t *files = json_object();
    int rc = -1;
    if (fs_join(final, sizeof final, dir, name, err) ||
        fs_join(tmp, sizeof tmp, dir, tmp_name, err) ||
        fs_join(old, sizeof old, dir, old_name, err) || fs_mkdir_p(dir, err))
        goto out;
    if (fs_remove_tree(tmp, err)) goto out;
    if (mkdir(tmp, 0777) != 0) {
        error_errno(err, "creating %s", tmp);
        goto out;
    }
    if (write_checkpoint_files(tmp, m, st, plan_json, files, err)) goto out;
    json_t *manifest = json_pack("{s:i,s:i,s:s,s:O}", "step", st->step, "micro", st->micro,
                                 "version", PLAIT_VERSION, "files", files);
    char *text = json_dumps(manifest, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(manifest);
    char path[4096];
    int wrc = !text ? error_set(err, "out of memory")
              : fs_join(path, sizeof path, tmp, "manifest.json", err)
                  ? -1
                  : fs_write_atomic(path, text, strlen(text), err);
    free(text);
    if (wrc || fs_fsync_dir(tmp, err)) goto out;
    /* a checkpoint of the same step already there (a re-save): move it aside first */
    struct stat sb;
    bool replacing = stat(final, &sb) == 0;
    if (replacing && rename(final, old) != 0) {
        error_errno(err, "moving aside %s", final);
        goto out;
    }
    if (rename(tmp, final) != 0) {
        error_errno(err, "renaming %s to %s", tmp, final);
        goto out;
    }
    if (fs_fsync_dir(dir, err)) goto out;
    if (replacing) fs_remove_tree(old, NULL);
    prune(dir, keep);
    rc = 0;
out:
    if (rc) error_prefix(err, "writing checkpoint %s: ", final);
    json_decref(files);
    return rc;
}

/* ---- verifying and loading ---------------------------------------------------- */

static int verify_file(const char *cdir, const char *name, json_t *entry, struct plait_error *err)
{
    json_int_t want_bytes, want_crc;
    if (json_unpack(entry, "{s:I,s:I}", "bytes", &want_bytes, "crc32c", &want_crc))
        return error_set(err, "manifest entry for %s is malformed", name);
    char path[4096];
    if (fs_join(path, sizeof path, cdir, name, err)) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return error_errno(err, "%s", path);
    static char buf[1 << 20];
    uint32_t crc = 0;
    uint64_t bytes = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        crc = crc32c_update(crc, buf, k);
        bytes += k;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return error_set(err, "%s: read error", path);
    if (bytes != (uint64_t)want_bytes)
        return error_set(err, "%s is %llu bytes, the manifest says %lld (truncated?)", name,
                         (unsigned long long)bytes, (long long)want_bytes);
    if (crc != (uint32_t)want_crc)
        return error_set(err, "%s: checksum %08x, the manifest says %08x", name, crc,
                         (uint32_t)want_crc);
    return 0;
}

static int verify_checkpoint(const char *cdir, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, cdir, "manifest.json", err)) return -1;
    json_error_t jerr;
    json_t *manifest = json_load_file(path, 0, &jerr);
    if (!manifest) return error_set(err, "manifest.json: %s", jerr.text);
    json_t *files = json_object_get(manifest, "files");
    int rc = 0;
    static const char *const required[] = {"model.bin", "optim.bin", "state.json"};
    for (size_t i = 0; i < sizeof required / sizeof *required && rc == 0; i++)
        if (!json_object_get(files, required[i]))
            rc = error_set(err, "manifest.json does not list %s", required[i]);
    const char *name;
    json_t *entry;
    json_object_foreach(files, name, entry)
    {
        if (rc == 0) rc = verify_file(cdir, name, entry, err);
    }
    json_decref(manifest);
    return rc;
}

static int read_state(const char *cdir, struct train_state *st, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, cdir, "state.json", err)) return -1;
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) return error_set(err, "state.json: %s", jerr.text);
    json_int_t tokens, epoch, shard, index;
    json_t *rng;
    int rc = 0;
    memset(st, 0, sizeof *st);
    if (json_unpack(j, "{s:i,s:i,s:F,s:I,s:b,s:{s:I,s:I,s:I},s:o}", "step", &st->step, "micro",
                    &st->micro, "loss_sum", &st->loss_sum, "tokens", &tokens, "eval_pending",
                    &st->eval_pending, "data", "epoch", &epoch, "shard", &shard, "index", &index,
                    "sample_rng", &rng) ||
        json_array_size(rng) != 4) {
        rc = error_set(err, "state.json: missing or malformed fields");
    } else {
        st->tokens = tokens;
        st->data = (struct data_position){epoch, shard, index};
        for (int i = 0; i < 4; i++) {
            const char *hex = json_string_value(json_array_get(rng, (size_t)i));
            st->sample_rng[i] = hex ? strtoull(hex, NULL, 16) : 0;
        }
    }
    json_decref(j);
    return rc;
}

/* Reads n floats from f into backend memory through a host buffer. */
static int read_device(FILE *f, const struct ops *ops, float *dst, size_t n, float *host,
                       const char *path, struct plait_error *err)
{
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CHUNK_FLOATS ? n - done : CHUNK_FLOATS;
        if (fread(host, sizeof(float), k, f) != k) return error_set(err, "%s: short read", path);
        ops->upload(dst + done, host, k * sizeof(float));
        done += k;
    }
    return 0;
}

static int load_checkpoint(const char *cdir, struct model *m, struct train_state *st,
                           struct plait_error *err)
{
    size_t P = m->layout.total;
    char path[4096];
    if (read_state(cdir, st, err)) return -1;
    float *params = malloc(P * sizeof(float));
    float *host = malloc(CHUNK_FLOATS * sizeof(float));
    FILE *f = NULL;
    int rc = -1;
    if (!params || !host) {
        error_set(err, "out of memory");
        goto out;
    }
    if (fs_join(path, sizeof path, cdir, "model.bin", err) ||
        gpt2_read_llmc(path, &m->cfg, params, NULL, err))
        goto out;
    model_set_params(m, params);

    if (fs_join(path, sizeof path, cdir, "optim.bin", err)) goto out;
    f = fopen(path, "rb");
    int32_t h[LLMC_HEADER_INTS];
    if (!f) {
        error_errno(err, "%s", path);
        goto out;
    }
    if (fread(h, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS || h[0] != OPTIM_MAGIC ||
        h[1] != OPTIM_VERSION) {
        error_set(err, "%s: not a plait optimizer state (magic/version)", path);
        goto out;
    }
    size_t count = (size_t)(uint32_t)h[2] | (size_t)(uint32_t)h[3] << 32;
    if (count != P) {
        error_set(err, "%s: holds %zu parameters, the model has %zu", path, count, P);
        goto out;
    }
    if ((h[4] != 0) != (st->micro > 0)) {
        error_set(err, "%s: gradients %s but state.json says micro-batch %d", path,
                  h[4] ? "present" : "absent", st->micro);
        goto out;
    }
    if (read_device(f, m->ops, m->adam_m, P, host, path, err) ||
        read_device(f, m->ops, m->adam_v, P, host, path, err) ||
        (h[4] && read_device(f, m->ops, m->grads, P, host, path, err)))
        goto out;
    rc = 0;
out:
    if (f) fclose(f);
    free(params);
    free(host);
    return rc;
}

int ckpt_load_latest(const char *dir, struct model *m, struct train_state *st, char *name,
                     size_t name_bytes, struct plait_error *err)
{
    int n;
    char **names = list_checkpoints(dir, &n, err);
    if (!names) return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char cdir[4096];
        struct plait_error why;
        if (fs_join(cdir, sizeof cdir, dir, names[i], &why) || verify_checkpoint(cdir, &why) ||
            load_checkpoint(cdir, m, st, &why)) {
            log_warn("checkpoint %s is unusable: %s; trying an older one", cdir, why.text);
            continue;
        }
        snprintf(name, name_bytes, "%s", names[i]);
        rc = 1;
        break;
    }
    if (rc == 0 && n > 0) {
        error_set(err,
                  "%s: none of its %d checkpoints is usable (see the warnings above); "
                  "move them away to start from scratch",
                  dir, n);
        rc = -1;
    }
    free_names(names, n);
    return rc;
}
