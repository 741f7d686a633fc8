/* cli.h — the plait CLI's commands and options as data: one table per
 * command, from which come its parsing (unknown options, missing values,
 * --help, --version), its help text, and through that text the man page and
 * the bash completion (scripts/gen_docs.sh), so none of them can drift. */
#ifndef PLAIT_LAUNCHER_CLI_H
#define PLAIT_LAUNCHER_CLI_H

#include <stdbool.h>
#include <stdio.h>

struct cli_option {
    const char *name; /* "--out" */
    const char *arg;  /* "DIR", NULL for a flag; the bash completion completes a DIR
                         with directories, a FILE.xml, VAL.bin or PLAN with files */
    const char *help; /* may hold '\n' for more lines */
    bool repeats;     /* may be given more than once ("..." in the synopsis) */
    bool required;    /* must be given: no brackets in the synopsis, and cli_parse
                         refuses a command line without it ("missing --image IMG") */
};

struct cli_command {
    const char *name;     /* "train", "data prepare" */
    const char *operands; /* "PLAN", "TEXT OUT.bin", "" */
    int min_operands, max_operands;
    const char *summary;              /* one line, for `plait --help` */
    const char *description;          /* paragraphs after the synopsis, or NULL */
    const struct cli_option *options; /* ends with {0} */
    const char *epilog;               /* exit codes and the like, or NULL */
};

/* One parsed argument: an option (opt = its index in the table, value its
 * argument or NULL) or an operand (opt = -1). */
struct cli_arg {
    int opt;
    const char *value;
};

struct cli_args {
    struct cli_arg *v; /* in command-line order */
    int n;
    int n_operands;
};

#define CLI_CONTINUE (-1)

/* Parses argv (the arguments after the command's name) against the table.
 * Returns CLI_CONTINUE with *a filled (free with cli_args_free), or the exit
 * code to return at once: 0 after printing --help or --version, 2 after saying
 * what is wrong ("train: unknown option --bogus") and the synopsis. */
int cli_parse(const struct cli_command *c, int argc, char **argv, struct cli_args *a);
void cli_args_free(struct cli_args *a);

/* "train: --val-fraction needs --val" and the synopsis, on stderr; returns 2. */
int cli_usage_error(const struct cli_command *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The command's whole help text. */
void cli_help(const struct cli_command *c, FILE *out);

/* One row of a help table: "  LEFT    help", more lines aligned under it. */
void cli_help_row(const char *left, const char *help, FILE *out);

#endif
