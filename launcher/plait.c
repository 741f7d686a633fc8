/* plait.c — the plait CLI's entry: routes a subcommand to its file
 * (cmd_*.c) and prints the overview. Nothing else lives here. */
#include <stdio.h>
#include <string.h>

#include "common/env.h"
#include "common/log.h"
#include "launcher/commands.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: plait COMMAND [ARGS]\n"
            "  train PLAN [--out DIR] [--set path=value ...]   train on this machine\n"
            "  check PLAN [--nodes N] [--gpus-per-node G] [--topology FILE.xml ...] [--json]\n"
            "                                                   validate, place, estimate\n"
            "  launch                                           in a Slurm task or pod: exec the\n"
            "                                                   runtime with the env contract\n"
            "  data prepare TEXT OUT.bin [--val VAL.bin] [--val-fraction F]\n"
            "                                                   text -> byte tokens\n"
            "  status RUN_DIR [RUN_DIR ...] [--json]             a run at a glance\n"
            "  plot RUN_DIR [RUN_DIR ...] [-o FILE.png|.svg|.pdf] loss, lr, throughput\n"
            "  --version\n"
            "Run `plait COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv)
{
    log_set_prefix("plait");
    if (argc < 2) {
        usage(stderr);
        return PLAIT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "check")) return cmd_check(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return cmd_launch(argc - 2, argv + 2);
    if (!strcmp(cmd, "status")) return cmd_status(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("plait %s\n", PLAIT_VERSION);
        return PLAIT_EXIT_OK;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return PLAIT_EXIT_OK;
    }
    log_error("unknown command '%s'", cmd);
    usage(stderr);
    return PLAIT_EXIT_USAGE;
}
