/* fsutil.c — durable file-system helpers: mkdir -p, fsync of directories,
 * atomic whole-file writes, read-all, rm -rf. */
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_join(char *out, size_t out_bytes, const char *dir, const char *name, struct plait_error *err)
{
    int n = snprintf(out, out_bytes, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= out_bytes)
        return error_set(err, "path too long: %.200s/%.200s...", dir, name);
    return 0;
}

int fs_mkdir_p(const char *path, struct plait_error *err)
{
    return fs_mkdir_p_made(path, NULL, err);
}

int fs_mkdir_p_made(const char *path, char **made, struct plait_error *err)
{
    if (made) *made = NULL;
    if (!*path) return error_set(err, "an empty path is not a directory");
    char *p = strdup(path);
    if (!p) return error_set(err, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0777) == 0) {
            if (made && !*made) *made = strdup(p); /* NULL if out of memory: kept */
        } else if (errno != EEXIST) {
            error_errno(err, "creating directory %s", p);
            free(p);
            return -1;
        }
        *s = saved;
        if (!saved) break;
    }
    free(p);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return error_set(err, "%s: exists and is not a directory", path);
    return 0;
}

void fs_rmdir_up(const char *path, const char *made)
{
    if (!made) return;
    size_t top = strlen(made);
    char *p = strdup(path);
    if (!p) return;
    while (strlen(p) >= top && rmdir(p) == 0) {
        char *slash = strrchr(p, '/');
        if (strlen(p) == top || !slash || slash == p) break;
        *slash = '\0';
    }
    free(p);
}

int fs_fsync_dir(const char *path, struct plait_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return error_errno(err, "opening directory %s", path);
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return error_errno(err, "fsync of directory %s", path);
    return 0;
}

char *fs_dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* path's directory resolved (realpath) and its last name: a path that need
 * not exist yet, compared by where it would be; NULL when the directory does
 * not exist either */
static char *resolved(const char *path)
{
    char *dir = fs_dirname(path), *real = dir ? realpath(dir, NULL) : NULL, *out = NULL;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (real && asprintf(&out, "%s/%s", real, name) < 0) out = NULL;
    free(dir);
    free(real);
    return out;
}

bool fs_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *ra = resolved(a), *rb = resolved(b);
    bool same = ra && rb ? strcmp(ra, rb) == 0 : strcmp(a, b) == 0;
    free(ra);
    free(rb);
    return same;
}

/* fs_write_atomic, its temporary file opened with these flags and mode. */
static int write_atomic(const char *path, const void *data, size_t bytes, int flags, mode_t mode,
                        struct plait_error *err)
{
    char tmp[4096];
    int len = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (len < 0 || (size_t)len >= sizeof tmp) return error_set(err, "%s: path too long", path);
    if ((flags & O_EXCL) && unlink(tmp) != 0 && errno != ENOENT)
        return error_errno(err, "removing %s", tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | flags, mode);
    if (fd < 0) return error_errno(err, "creating %s", tmp);
    const char *p = data;
    size_t left = bytes;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            error_errno(err, "writing %s", tmp);
            goto fail;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        error_errno(err, "fsync of %s", tmp);
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        error_errno(err, "closing %s", tmp);
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        error_errno(err, "renaming %s to %s", tmp, path);
        goto fail;
    }
    char *dir = fs_dirname(path);
    int rc = dir ? fs_fsync_dir(dir, err) : error_set(err, "out of memory");
    free(dir);
    return rc;
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    return -1;
}

int fs_write_atomic(const char *path, const void *data, size_t bytes, struct plait_error *err)
{
    return write_atomic(path, data, bytes, O_TRUNC, 0666, err);
}

int fs_write_private(const char *path, const void *data, size_t bytes, struct plait_error *err)
{
    return write_atomic(path, data, bytes, O_EXCL, 0600, err);
}

int fs_open_regular(const char *path, struct plait_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return error_errno(err, "%s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        error_errno(err, "%s", path);
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, "%s is %s, not a regular file", path,
                         S_ISDIR(st.st_mode)    ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "a device");
    }
    /* regular files ignore O_NONBLOCK; clear it all the same */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

FILE *fs_fopen_regular(const char *path, struct plait_error *err)
{
    int fd = fs_open_regular(path, err);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        error_errno(err, "%s", path);
        close(fd);
    }
    return f;
}

char *fs_read_all(const char *path, size_t *bytes, struct plait_error *err)
{
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        char *bigger = realloc(buf, cap);
        if (!bigger) free(buf);
        buf = bigger;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf) {
        error_set(err, "%s: out of memory", path);
        return NULL;
    }
    if (failed) {
        free(buf);
        error_set(err, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    if (bytes) *bytes = n;
    return buf;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

int fs_remove_tree(const char *path, struct plait_error *err)
{
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return error_errno(err, "removing %s", path);
    return 0;
}
