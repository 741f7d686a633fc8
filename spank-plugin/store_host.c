/* store_host.c — spank_plait in srun (local context): the rendezvous store of
 * a plait step with more than one task, hosted in a thread of srun for as long
 * as the step runs. srun is where every task's launch starts and what every
 * node already reaches (slurmd connects back to it), it lives exactly as long
 * as the step, and it needs no port agreed in advance: the store takes a free
 * one (of the admin's store_ports, where a firewall wants a range). The port
 * and a fresh per-step secret go into srun's environment, which Slurm gives
 * every task; task.c turns them into the env contract's PLAIT_STORE_ADDR
 * (srun's address as the task's node sees it) and PLAIT_STORE_SECRET. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/store/store.h"
#include "spank-plugin/plait_spank.h"

static struct store_server *server;

/* A port of the admin's range (store_ports), from a random place in it, or
 * any free one without a range. */
static int serve(const struct plait_config *c, const char *secret, struct plait_error *err)
{
    if (!c->store_port_lo) return store_server_start(&server, NULL, 0, secret, err);
    int n = c->store_port_hi - c->store_port_lo + 1;
    uint32_t start;
    if (getrandom(&start, sizeof start, 0) != (ssize_t)sizeof start) start = (uint32_t)getpid();
    for (int i = 0; i < n; i++) {
        int port = c->store_port_lo + (int)((start + (uint32_t)i) % (uint32_t)n);
        if (store_server_start(&server, NULL, port, secret, err) == 0) return 0;
    }
    return error_prefix(err, "no free port in store_ports=%d-%d (plugstack.conf); the last: ",
                        c->store_port_lo, c->store_port_hi);
}

int store_host_start(spank_t sp, const struct plait_config *c)
{
    uint32_t tasks = 0;
    if (spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS)
        return msg_error("cannot read the step's task count from Slurm");
    /* the batch script's srun of one task, or a one-rank job: nobody to meet */
    unsetenv(PLAIT_SPANK_STORE_PORT_VAR);
    unsetenv(PLAIT_ENV_STORE_SECRET);
    if (tasks < 2) return 0;
    struct plait_error err;
    char secret[STORE_SECRET_HEX_BYTES], port[16];
    if (store_secret_generate(secret, &err) || serve(c, secret, &err))
        return msg_error("hosting the step's rendezvous store: %s", err.text);
    snprintf(port, sizeof port, "%d", store_server_port(server));
    if (setenv(PLAIT_SPANK_STORE_PORT_VAR, port, 1) || setenv(PLAIT_ENV_STORE_SECRET, secret, 1)) {
        store_host_stop();
        return msg_error("cannot pass the step's store to its tasks: out of memory");
    }
    return 0;
}

void store_host_stop(void)
{
    store_server_stop(server);
    server = NULL;
}
