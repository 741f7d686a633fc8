/* fsutil.h — file-system steps that must not lose data: directories made
 * with parents, files and directories fsynced, whole files written
 * atomically (temp name, fsync, rename, fsync of the directory). */
#ifndef PLAIT_FSUTIL_H
#define PLAIT_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/error.h"

/* out = dir + "/" + name; -1 with err when it does not fit out_bytes. */
int fs_join(char *out, size_t out_bytes, const char *dir, const char *name,
            struct plait_error *err);

/* mkdir -p; existing directories are fine; "" is an error. */
int fs_mkdir_p(const char *path, struct plait_error *err);

/* The same; *made gets the outermost directory it created (malloc'ed), or
 * NULL when it created none, so that fs_rmdir_up can undo it. */
int fs_mkdir_p_made(const char *path, char **made, struct plait_error *err);

/* Undoes fs_mkdir_p_made: rmdir path, then its parents, up to and including
 * made; stops at the first that is not empty (nothing else is removed). */
void fs_rmdir_up(const char *path, const char *made);

/* fsync of a directory (so a rename or create inside it is durable). */
int fs_fsync_dir(const char *path, struct plait_error *err);

/* Whether paths a and b name the same file: the same inode where both exist,
 * else the same absolute path (the directory resolved, then the name), so an
 * output that would replace an input is found before anything is written. */
bool fs_same_file(const char *a, const char *b);

/* Writes bytes to path through path.tmp, fsync, rename, fsync(dir). */
int fs_write_atomic(const char *path, const void *data, size_t bytes, struct plait_error *err);
/* The same, readable and writable by its owner alone (0600 from its creation:
 * a secret is never in a file others could read, even for a moment). */
int fs_write_private(const char *path, const void *data, size_t bytes, struct plait_error *err);

/* Opens path for reading if it is a regular file (never blocking on a FIFO,
 * never reading a directory): an fd, or -1 with err saying what it is. */
int fs_open_regular(const char *path, struct plait_error *err);

/* The same as a stdio stream ("rb"). */
FILE *fs_fopen_regular(const char *path, struct plait_error *err);

/* Reads a whole regular file (fs_open_regular) into a malloc'ed, NUL-terminated buffer. */
char *fs_read_all(const char *path, size_t *bytes, struct plait_error *err);

/* rm -rf (for expired checkpoints and abandoned temp directories). */
int fs_remove_tree(const char *path, struct plait_error *err);

/* The directory part of a path, malloc'ed ("." when there is none). */
char *fs_dirname(const char *path);

#endif
