/* plait.c — the plait CLI's entry: routes a subcommand to its file
 * (cmd_*.c), and prints the overview (plait --help) and a command's help
 * (plait help CMD). Nothing else lives here. */
#include <stdio.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"
#include "launcher/cli.h"
#include "common/plan/plan.h"
#include "launcher/commands.h"

static const struct {
    const struct cli_command *cli;
    int (*run)(int argc, char **argv);
} commands[] = {
    {&cmd_train_cli, cmd_train},
    {&cmd_check_cli, cmd_check},
    {&cmd_launch_cli, cmd_launch},
    {&cmd_data_prepare_cli, cmd_data_prepare},
    {&cmd_data_decode_cli, cmd_data_decode},
    {&cmd_status_cli, cmd_status},
    {&cmd_plot_cli, cmd_plot},
    {&cmd_ckpt_ls_cli, cmd_ckpt_ls},
    {&cmd_ckpt_verify_cli, cmd_ckpt_verify},
    {&cmd_ckpt_export_cli, cmd_ckpt_export},
    {&cmd_ckpt_import_cli, cmd_ckpt_import},
    {&cmd_sample_cli, cmd_sample},
    {&cmd_k8s_render_cli, cmd_k8s_render},
    {&cmd_k8s_admin_cli, cmd_k8s_admin},
    {&cmd_k8s_lint_cli, cmd_k8s_lint},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out,
            "usage: plait COMMAND [ARGS]\n\n"
            "Checks a training plan (plan.json), places its tensor x pipeline x data parallel\n"
            "ranks on the machines' topology, and trains it.\n\ncommands:\n");
    for (size_t k = 0; k < N_COMMANDS; k++) {
        char left[128];
        const struct cli_command *c = commands[k].cli;
        snprintf(left, sizeof left, "%s%s%s", c->name, *c->operands ? " " : "", c->operands);
        cli_help_row(left, c->summary, out);
    }
    cli_help_row("help [COMMAND]", "print this overview, or a command's help", out);
    cli_help_row("help plan", "every field of a plan: its path, type, default", out);
    fprintf(out, "\noptions:\n");
    cli_help_row("-h, --help", "print this overview and exit", out);
    cli_help_row("--version", "print plait's version and exit", out);
    fprintf(out, "\nRun 'plait help COMMAND' or 'plait COMMAND --help' for a command's options.\n");
}

/* The command whose name's words start argv ("data prepare"); *words gets
 * how many; *prefix is set when argv holds only the start of a name. */
static int find_command(int argc, char **argv, int *words, bool *prefix)
{
    *prefix = false;
    for (size_t k = 0; k < N_COMMANDS; k++) {
        const char *name = commands[k].cli->name;
        int w = 0;
        while (w < argc) {
            size_t len = strlen(argv[w]);
            if (strncmp(name, argv[w], len) || (name[len] != ' ' && name[len] != '\0')) break;
            w++;
            name += len;
            if (!*name) {
                *words = w;
                return (int)k;
            }
            name++;
        }
        if (w > 0) *prefix = true;
    }
    return -1;
}

/* "plait data": the commands under it */
static int command_group(const char *group, FILE *out)
{
    fprintf(out, "usage: plait %s COMMAND [ARGS]\n\ncommands:\n", group);
    for (size_t k = 0; k < N_COMMANDS; k++) {
        const struct cli_command *c = commands[k].cli;
        size_t len = strlen(group);
        if (strncmp(c->name, group, len) || c->name[len] != ' ') continue;
        char left[128];
        snprintf(left, sizeof left, "%s%s%s", c->name, *c->operands ? " " : "", c->operands);
        cli_help_row(left, c->summary, out);
    }
    return 0;
}

static bool is_help(const char *s)
{
    return !strcmp(s, "-h") || !strcmp(s, "--help");
}

int main(int argc, char **argv)
{
    log_set_prefix("plait");
    if (argc < 2) {
        usage(stderr);
        return PLAIT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("plait %s\n", PLAIT_VERSION);
        return PLAIT_EXIT_OK;
    }
    bool help = !strcmp(cmd, "help") || is_help(cmd);
    if (help && argc == 2) {
        usage(stdout);
        return PLAIT_EXIT_OK;
    }
    if (help && argc == 3 && !strcmp(argv[2], "plan")) {
        printf("plan.json's fields (plait train --set PATH=VALUE changes one):\n");
        plan_fields_print(stdout);
        return PLAIT_EXIT_OK;
    }
    int skip = help ? 2 : 1, words = 0;
    bool prefix;
    int k = find_command(argc - skip, argv + skip, &words, &prefix);
    if (k >= 0 && help) {
        cli_help(commands[k].cli, stdout);
        return PLAIT_EXIT_OK;
    }
    if (k >= 0) return commands[k].run(argc - skip - words, argv + skip + words);
    if (prefix) { /* "plait data", "plait data --help", "plait help data" */
        bool asked = help || (argc > 2 && is_help(argv[2]));
        if (!asked && argc > skip + 1)
            log_error("unknown command '%s %s'", argv[skip], argv[skip + 1]);
        else if (!asked)
            log_error("%s: expected a command after it", argv[skip]);
        command_group(argv[skip], asked ? stdout : stderr);
        return asked ? PLAIT_EXIT_OK : PLAIT_EXIT_USAGE;
    }
    log_error("unknown command '%s'", argv[skip]);
    usage(stderr);
    return PLAIT_EXIT_USAGE;
}
