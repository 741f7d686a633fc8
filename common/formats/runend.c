/* runend.c — RUN_DIR/end.json, how a run's last process ended: writing and
 * reading it (runend.h). Not here: deciding the exit code (plait-train's
 * main) or showing it to people (plait status). */
#include "common/formats/runend.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/json_read.h"
#include "common/formats/rundir.h"

void runend_of(struct run_end *e, int exit_code, int sig, const char *message)
{
    memset(e, 0, sizeof *e);
    e->exit_code = exit_code;
    snprintf(e->end, sizeof e->end, "%s",
             exit_code == PLAIT_EXIT_OK          ? "finished"
             : exit_code == PLAIT_EXIT_PREEMPTED ? "preempted"
                                                 : "failed");
    const char *sig_name = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (sig_name) snprintf(e->signal, sizeof e->signal, "SIG%s", sig_name);
    snprintf(e->message, sizeof e->message, "%s", message ? message : "");
    time_t now = time(NULL);
    struct tm tm;
    strftime(e->time, sizeof e->time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    gethostname(e->host, sizeof e->host - 1);
    e->pid = (int)getpid();
}

int runend_write(const char *run_dir, const struct run_end *e, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, run_dir, RUNDIR_END, err)) return -1;
    json_t *j = json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:i}", "exit_code", e->exit_code, "end", e->end,
                          "signal", e->signal, "message", e->message, "time", e->time, "host",
                          e->host, "pid", e->pid);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text) return error_set(err, "out of memory");
    int rc = fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* A string member into a buffer: too long for it is an error too. */
static void read_text(struct json_read *r, json_t *j, const char *key, char *out, size_t bytes)
{
    const char *s = json_read_string(r, j, NULL, key);
    if (snprintf(out, bytes, "%s", s) >= (int)bytes)
        json_read_fail(r, NULL, key, "longer than %zu bytes", bytes - 1);
}

int runend_read(const char *run_dir, struct run_end *e, struct plait_error *err)
{
    char path[4096];
    struct stat st;
    memset(e, 0, sizeof *e);
    if (fs_join(path, sizeof path, run_dir, RUNDIR_END, err)) return -1;
    if (stat(path, &st) != 0 && errno == ENOENT) return RUNEND_NONE;
    struct json_read r = {path, err, 0};
    json_t *j = json_read_file(&r, path);
    if (!j) return -1;
    e->exit_code = (int)json_read_int(&r, j, NULL, "exit_code");
    read_text(&r, j, "end", e->end, sizeof e->end);
    read_text(&r, j, "signal", e->signal, sizeof e->signal);
    read_text(&r, j, "message", e->message, sizeof e->message);
    read_text(&r, j, "time", e->time, sizeof e->time);
    read_text(&r, j, "host", e->host, sizeof e->host);
    e->pid = (int)json_read_int(&r, j, NULL, "pid");
    json_decref(j);
    return r.failed;
}

void runend_clear(const char *run_dir)
{
    char path[4096];
    struct plait_error err;
    if (fs_join(path, sizeof path, run_dir, RUNDIR_END, &err) == 0) unlink(path);
}
