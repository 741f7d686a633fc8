/* bind.c — binding a rank's process to the CPUs its env contract names
 * (PLAIT_CPUS), with one OpenMP thread per CPU it got unless the user set
 * OMP_NUM_THREADS. Shared by plait launch and plait train's ranks. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"
#include "launcher/commands.h"

/* "0-13,112-125" → a CPU set; -1 when malformed. */
static int parse_cpus(const char *list, cpu_set_t *set)
{
    CPU_ZERO(set);
    for (const char *s = list; *s;) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0) return -1;
        if (*end == '-') {
            const char *h = end + 1;
            hi = strtol(h, &end, 10);
            if (end == h || hi < lo) return -1;
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return 0;
}

int launcher_bind_cpus(void)
{
    const char *cpus = getenv(PLAIT_ENV_CPUS);
    if (!cpus || !*cpus) return 0;
    cpu_set_t set, got;
    if (parse_cpus(cpus, &set)) {
        log_error("%s=%s is not a CPU list", PLAIT_ENV_CPUS, cpus);
        return -1;
    }
    if (sched_setaffinity(0, sizeof set, &set) == 0 &&
        sched_getaffinity(0, sizeof got, &got) == 0) {
        /* one thread per CPU of its own that this machine has */
        char n[16];
        snprintf(n, sizeof n, "%d", CPU_COUNT(&got));
        setenv("OMP_NUM_THREADS", n, 0);
    } else {
        log_warn("cannot bind to CPUs %s (%s); running unbound", cpus, strerror(errno));
    }
    return 0;
}
