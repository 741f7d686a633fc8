/* runend.c — RUN_DIR/end.json, how a run's last process ended (runend.h).
 * Not here: deciding the exit code (plait-train's main) or reading it for
 * people (plait status). */
#include "common/runend.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fsutil.h"

int runend_write(const char *run_dir, int exit_code, int sig, const char *message,
                 struct plait_error *err)
{
    char path[4096], when[32], host[256] = "";
    if (fs_join(path, sizeof path, run_dir, "end.json", err)) return -1;
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    gethostname(host, sizeof host - 1);
    const char *end = exit_code == PLAIT_EXIT_OK          ? "finished"
                      : exit_code == PLAIT_EXIT_PREEMPTED ? "preempted"
                                                          : "failed";
    const char *sig_name = sig > 0 ? sigabbrev_np(sig) : NULL;
    char sig_text[16] = "";
    if (sig_name) snprintf(sig_text, sizeof sig_text, "SIG%s", sig_name);
    json_t *j = json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:i}", "exit_code", exit_code, "end", end,
                          "signal", sig_text, "message", message ? message : "", "time", when,
                          "host", host, "pid", (int)getpid());
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text) return error_set(err, "out of memory");
    int rc = fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

void runend_clear(const char *run_dir)
{
    char path[4096];
    struct plait_error err;
    if (fs_join(path, sizeof path, run_dir, "end.json", &err) == 0) unlink(path);
}
