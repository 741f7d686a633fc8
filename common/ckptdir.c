/* ckptdir.c — checkpoint directories: names, listing in (step, micro) order,
 * manifests and verification, the commit protocol (temp name, fsync, rename,
 * moving an older copy of the same name aside) and its recovery, pruning.
 * What a checkpoint's files hold is the runtime's (runtime/ckpt.c). */
#include "common/ckptdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/rundir.h"

#define TMP_PREFIX ".tmp-"
#define OLD_PREFIX ".old-"
#define LEGACY_OLD_PREFIX ".tmp-old-" /* what plait before this module called .old- */
#define PRUNED_PREFIX ".tmp-pruned-"  /* a checkpoint being removed by ckptdir_prune */

/* ---- names ------------------------------------------------------------------------------ */

void ckptdir_name(char *out, size_t bytes, int64_t step, int64_t micro)
{
    snprintf(out, bytes, "step_%08lld_%04lld", (long long)step, (long long)micro);
}

/* Reads at least min_digits decimal digits (at most 18) at *s. */
static bool digits(const char **s, int min_digits, int64_t *out)
{
    int n = 0;
    int64_t v = 0;
    for (; **s >= '0' && **s <= '9'; (*s)++, n++) {
        if (n == 18) return false;
        v = v * 10 + (**s - '0');
    }
    *out = v;
    return n >= min_digits;
}

/* step_<S>_<M> as ckptdir_name writes it (and only that: no sign, no suffix). */
bool ckptdir_parse_name(const char *name, struct ckpt_entry *e)
{
    const char *s = name;
    if (strncmp(s, "step_", 5) != 0) return false;
    s += 5;
    if (!digits(&s, 8, &e->step) || *s++ != '_' || !digits(&s, 4, &e->micro) || *s) return false;
    char canonical[sizeof e->name];
    ckptdir_name(canonical, sizeof canonical, e->step, e->micro);
    if (strcmp(canonical, name) != 0) return false; /* "step_000000001_0000": not ours */
    snprintf(e->name, sizeof e->name, "%s", name);
    return true;
}

static int newest_first(const void *a, const void *b)
{
    const struct ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? 1 : -1;
    if (x->micro != y->micro) return x->micro < y->micro ? 1 : -1;
    return 0;
}

/* ---- the process's memory of what verified ---------------------------------------------- */

static bool in(char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

static void remember(char ***names, int *n, const char *name)
{
    if (in(*names, *n, name)) return;
    char **bigger = realloc(*names, (size_t)(*n + 1) * sizeof **names);
    if (!bigger) return; /* forgetting only costs a second verification */
    *names = bigger;
    if (((*names)[*n] = strdup(name))) (*n)++;
}

static void forget(char **names, int *n, const char *name)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(names[i], name)) {
            free(names[i]);
            names[i] = names[--*n];
            return;
        }
}

/* ---- listing ------------------------------------------------------------------------------ */

int ckptdir_list(const struct ckptdir *d, struct ckpt_entry **out, int *n, struct plait_error *err)
{
    *out = NULL;
    *n = 0;
    DIR *dir = opendir(d->path);
    if (!dir) return error_errno(err, "listing %s", d->path);
    int cap = 0;
    struct ckpt_entry *list = NULL, e;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!ckptdir_parse_name(de->d_name, &e)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            struct ckpt_entry *bigger = realloc(list, (size_t)cap * sizeof *list);
            if (!bigger) {
                free(list);
                closedir(dir);
                return error_set(err, "out of memory listing %s", d->path);
            }
            list = bigger;
        }
        list[(*n)++] = e;
    }
    closedir(dir);
    if (*n) qsort(list, (size_t)*n, sizeof *list, newest_first);
    *out = list;
    return 0;
}

/* ---- verifying ---------------------------------------------------------------------------- */

static int verify_file(const char *cdir, const struct ckpt_manifest_file *f,
                       struct plait_error *err)
{
    const char *name = f->name;
    int64_t want_bytes = f->bytes, want_crc = f->crc32c;
    if (strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
        return error_set(err, "manifest names a file outside the checkpoint (%s)", name);
    char path[4096];
    if (fs_join(path, sizeof path, cdir, name, err)) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return error_errno(err, "%s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, "%s is not a regular file", path);
    }
    static char buf[1 << 20];
    uint32_t crc = 0;
    uint64_t bytes = 0;
    ssize_t k;
    while ((k = read(fd, buf, sizeof buf)) > 0 || (k < 0 && errno == EINTR)) {
        if (k < 0) continue;
        crc = crc32c_update(crc, buf, (size_t)k);
        bytes += (uint64_t)k;
    }
    int bad = k < 0;
    close(fd);
    if (bad) return error_errno(err, "reading %s", path);
    if (bytes != (uint64_t)want_bytes)
        return error_set(err, "%s is %llu bytes, the manifest says %lld (truncated?)", name,
                         (unsigned long long)bytes, (long long)want_bytes);
    if (crc != (uint32_t)want_crc)
        return error_set(err, "%s: checksum %08x, the manifest says %08x", name, crc,
                         (uint32_t)want_crc);
    return 0;
}

/* Verifies the checkpoint directory at cdir (any name). */
static int verify_at(const char *cdir, struct plait_error *err)
{
    struct ckpt_manifest m;
    if (ckpt_manifest_read(cdir, &m, err)) return -1;
    /* the state, and the model: whole (model.bin, optim.bin) or in parts */
    bool whole = ckpt_manifest_find(&m, "model.bin") != NULL, parts = false;
    for (int i = 0; i < m.n_files; i++) parts |= !strncmp(m.files[i].name, "model-", 6);
    int rc = 0;
    if (!ckpt_manifest_find(&m, CKPT_STATE))
        rc = error_set(err, CKPT_MANIFEST " does not list " CKPT_STATE);
    else if (!whole && !parts)
        rc = error_set(err, CKPT_MANIFEST " lists no model (model.bin or model-*.bin)");
    else if (whole && !ckpt_manifest_find(&m, "optim.bin"))
        rc = error_set(err, CKPT_MANIFEST " does not list optim.bin");
    for (int i = 0; i < m.n_files && rc == 0; i++) rc = verify_file(cdir, &m.files[i], err);
    ckpt_manifest_free(&m);
    return rc;
}

int ckptdir_verify(struct ckptdir *d, const char *name, struct plait_error *err)
{
    if (in(d->good, d->n_good, name)) return 0;
    if (in(d->bad, d->n_bad, name))
        return error_set(err, "%s/%s did not verify when it was read before", d->path, name);
    char cdir[4096];
    if (fs_join(cdir, sizeof cdir, d->path, name, err)) return -1;
    if (verify_at(cdir, err)) {
        remember(&d->bad, &d->n_bad, name);
        return -1;
    }
    forget(d->bad, &d->n_bad, name);
    remember(&d->good, &d->n_good, name);
    return 0;
}

/* ---- recovery ----------------------------------------------------------------------------- */

/* A commit of `name` was interrupted after the old copy went to old_path:
 * finish it if the new copy is complete, else put the old one back. */
static void recover(struct ckptdir *d, const char *name, const char *old_path)
{
    char final[4096], tmp[4096], tmp_name[96];
    struct plait_error err;
    struct stat st;
    snprintf(tmp_name, sizeof tmp_name, TMP_PREFIX "%s", name);
    if (fs_join(final, sizeof final, d->path, name, &err) ||
        fs_join(tmp, sizeof tmp, d->path, tmp_name, &err))
        return;
    if (stat(final, &st) == 0) { /* the commit got as far as the second rename */
        fs_remove_tree(old_path, NULL);
        return;
    }
    if (stat(tmp, &st) == 0 && verify_at(tmp, &err) == 0 && rename(tmp, final) == 0) {
        log_info("checkpoint %s: finished a commit that was interrupted", final);
        fs_remove_tree(old_path, NULL);
    } else if (rename(old_path, final) == 0) {
        log_info("checkpoint %s: undid a commit that was interrupted", final);
    } else {
        log_warn("checkpoint %s: cannot recover from %s: %s", final, old_path, strerror(errno));
    }
}

int ckptdir_open(struct ckptdir *d, const char *dir, struct plait_error *err)
{
    memset(d, 0, sizeof *d);
    if (fs_mkdir_p(dir, err)) return -1;
    if (!(d->path = strdup(dir))) return error_set(err, "out of memory");
    DIR *dh = opendir(dir);
    if (!dh) {
        ckptdir_close(d);
        return error_errno(err, "listing %s", dir);
    }
    /* first the interrupted commits, then whatever temporaries are left */
    char path[4096];
    struct dirent *de;
    while ((de = readdir(dh))) {
        const char *name = NULL;
        if (!strncmp(de->d_name, OLD_PREFIX, strlen(OLD_PREFIX)))
            name = de->d_name + strlen(OLD_PREFIX);
        else if (!strncmp(de->d_name, LEGACY_OLD_PREFIX, strlen(LEGACY_OLD_PREFIX)))
            name = de->d_name + strlen(LEGACY_OLD_PREFIX);
        struct ckpt_entry e;
        if (name && ckptdir_parse_name(name, &e) &&
            !fs_join(path, sizeof path, dir, de->d_name, err))
            recover(d, name, path);
    }
    rewinddir(dh);
    while ((de = readdir(dh))) {
        if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0 &&
            strncmp(de->d_name, OLD_PREFIX, strlen(OLD_PREFIX)) != 0)
            continue;
        struct plait_error why;
        if (fs_join(path, sizeof path, dir, de->d_name, &why) || fs_remove_tree(path, &why))
            log_warn("cannot remove an abandoned temporary checkpoint: %s", why.text);
        else
            log_info("removed %s, a checkpoint whose writing did not finish", path);
    }
    closedir(dh);
    return fs_fsync_dir(dir, err) ? (ckptdir_close(d), -1) : 0;
}

int ckptdir_open_locked(struct ckptdir *d, struct runlock *lock, const char *dir,
                        const char *run_dir, struct plait_error *err)
{
    struct stat run_st, ckpt_st;
    lock->fd = -1;
    if (stat(run_dir, &run_st) != 0 || stat(dir, &ckpt_st) != 0)
        return error_errno(err, "checkpoint.dir: %s", dir);
    bool same = run_st.st_dev == ckpt_st.st_dev && run_st.st_ino == ckpt_st.st_ino;
    if (!same && runlock_acquire(lock, dir, "checkpoint directory", err)) return -1;
    if (ckptdir_open(d, dir, err)) {
        runlock_release(lock);
        return -1;
    }
    return 0;
}

void ckptdir_close(struct ckptdir *d)
{
    for (int i = 0; i < d->n_good; i++) free(d->good[i]);
    for (int i = 0; i < d->n_bad; i++) free(d->bad[i]);
    free(d->good);
    free(d->bad);
    free(d->path);
    memset(d, 0, sizeof *d);
}

/* ---- writing ------------------------------------------------------------------------------ */

int ckptdir_begin(struct ckptdir *d, const char *name, char *tmp, size_t tmp_bytes,
                  struct plait_error *err)
{
    char tmp_name[96];
    snprintf(tmp_name, sizeof tmp_name, TMP_PREFIX "%s", name);
    if (fs_join(tmp, tmp_bytes, d->path, tmp_name, err) || fs_remove_tree(tmp, err)) return -1;
    if (mkdir(tmp, 0777) != 0) return error_errno(err, "creating %s", tmp);
    return 0;
}

int ckpt_file_open(struct ckpt_file *f, const char *tmp, const char *name, struct plait_error *err)
{
    f->fd = -1;
    f->name = name;
    f->bytes = 0;
    f->crc = 0;
    if (fs_join(f->path, sizeof f->path, tmp, name, err)) return -1;
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (f->fd < 0) return error_errno(err, "creating %s", f->path);
    return 0;
}

int ckpt_file_put(struct ckpt_file *f, const void *buf, size_t bytes, struct plait_error *err)
{
    f->crc = crc32c_update(f->crc, buf, bytes);
    f->bytes += bytes;
    const char *p = buf;
    while (bytes) {
        ssize_t k = write(f->fd, p, bytes);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return error_errno(err, "writing %s", f->path);
        p += k;
        bytes -= (size_t)k;
    }
    return 0;
}

int ckpt_file_close(struct ckpt_file *f, struct ckpt_manifest *m, struct plait_error *err)
{
    int rc = 0;
    if (fsync(f->fd) != 0) rc = error_errno(err, "fsync of %s", f->path);
    if (close(f->fd) != 0 && rc == 0) rc = error_errno(err, "closing %s", f->path);
    f->fd = -1;
    if (rc == 0 && m) rc = ckpt_manifest_add(m, f->name, (int64_t)f->bytes, f->crc, err);
    return rc;
}

int ckpt_file_write(struct ckpt_file *f, const char *tmp, const char *name, const void *data,
                    size_t bytes, struct ckpt_manifest *m, struct plait_error *err)
{
    int rc = ckpt_file_open(f, tmp, name, err) || ckpt_file_put(f, data, bytes, err) ||
                     ckpt_file_close(f, m, err)
                 ? -1
                 : 0;
    ckpt_file_discard(f);
    return rc;
}

void ckpt_file_discard(struct ckpt_file *f)
{
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

void ckptdir_abort(const char *tmp)
{
    struct plait_error err;
    if (fs_remove_tree(tmp, &err)) log_warn("%s", err.text);
}

int ckptdir_commit(struct ckptdir *d, const char *name, const char *tmp, struct ckpt_manifest *m,
                   const struct gpt2_config *describe, struct plait_error *err)
{
    struct ckpt_entry e;
    char final[4096], old[4096], old_name[96];
    snprintf(old_name, sizeof old_name, OLD_PREFIX "%s", name);
    if (!ckptdir_parse_name(name, &e)) return error_set(err, "%s is not a checkpoint name", name);
    int rc = -1;
    m->step = e.step, m->micro = e.micro;
    snprintf(m->version, sizeof m->version, "%s", PLAIT_VERSION);
    if (fs_join(final, sizeof final, d->path, name, err) ||
        fs_join(old, sizeof old, d->path, old_name, err) ||
        ckpt_manifest_write(tmp, m, describe, err) || fs_fsync_dir(tmp, err))
        goto out;
    /* a checkpoint of the same name already there (a re-save): aside first;
     * ckptdir_open finishes or undoes this if we crash in between */
    struct stat st;
    bool replacing = stat(final, &st) == 0;
    if (replacing && fs_remove_tree(old, err)) goto out;
    if (replacing && rename(final, old) != 0) {
        error_errno(err, "moving aside %s", final);
        goto out;
    }
    if (rename(tmp, final) != 0) {
        error_errno(err, "renaming %s to %s", tmp, final);
        if (replacing) rename(old, final);
        goto out;
    }
    if (fs_fsync_dir(d->path, err)) goto out;
    if (replacing) fs_remove_tree(old, NULL);
    forget(d->bad, &d->n_bad, name);
    remember(&d->good, &d->n_good, name);
    rc = 0;
out:
    if (rc) {
        struct stat st2;
        if (stat(tmp, &st2) == 0) ckptdir_abort(tmp);
    }
    return rc;
}

/* ---- pruning ------------------------------------------------------------------------------ */

void ckptdir_prune(struct ckptdir *d, int keep)
{
    struct plait_error err;
    struct ckpt_entry *list;
    int n, good = 0;
    if (ckptdir_list(d, &list, &n, &err)) {
        log_warn("not pruning checkpoints: %s", err.text);
        return;
    }
    char path[4096];
    for (int i = 0; i < n; i++) {
        if (good < keep) {
            bool known_bad = in(d->bad, d->n_bad, list[i].name);
            if (ckptdir_verify(d, list[i].name, &err) == 0)
                good++;
            else if (!known_bad)
                log_warn("checkpoint %s/%s does not verify (%s): it does not count toward "
                         "checkpoint.keep",
                         d->path, list[i].name, err.text);
            continue;
        }
        /* out of sight first (one rename), then removed: a crash in between
         * leaves a temporary that ckptdir_open removes, never a visible
         * checkpoint with files missing */
        char gone[4096], gone_name[96];
        snprintf(gone_name, sizeof gone_name, PRUNED_PREFIX "%s", list[i].name);
        if (fs_join(path, sizeof path, d->path, list[i].name, &err) ||
            fs_join(gone, sizeof gone, d->path, gone_name, &err))
            log_warn("%s", err.text);
        else if (rename(path, gone) != 0)
            log_warn("cannot prune checkpoint %s: %s", path, strerror(errno));
        else if (fs_remove_tree(gone, &err))
            log_warn("%s", err.text);
        forget(d->good, &d->n_good, list[i].name);
        forget(d->bad, &d->n_bad, list[i].name);
    }
    free(list);
}

int ckptdir_remove_all(struct ckptdir *d, struct plait_error *err)
{
    struct ckpt_entry *list;
    int n;
    if (ckptdir_list(d, &list, &n, err)) return -1;
    char path[4096];
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = fs_join(path, sizeof path, d->path, list[i].name, err) || fs_remove_tree(path, err)
                 ? -1
                 : 0;
    free(list);
    for (int i = 0; i < d->n_good; i++) free(d->good[i]);
    for (int i = 0; i < d->n_bad; i++) free(d->bad[i]);
    d->n_good = d->n_bad = 0;
    return rc ? -1 : n;
}
