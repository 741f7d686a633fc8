/* runtime_exec.c — how the launcher hands over to the runtime: exec
 * plait-train from beside the plait executable, else from PATH. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "launcher/commands.h"

void launcher_exec_runtime(void)
{
    fflush(NULL);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash && (size_t)(slash - self) + sizeof "/plait-train" <= sizeof self) {
            strcpy(slash, "/plait-train");
            if (access(self, X_OK) == 0) execl(self, "plait-train", (char *)NULL);
        }
    }
    execlp("plait-train", "plait-train", (char *)NULL);
    log_error("cannot run plait-train (looked beside plait and in PATH)");
}
