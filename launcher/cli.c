/* cli.c — parsing a command's arguments against its option table and
 * printing its help (cli.h). What each option means lives with its command
 * (cmd_*.c); this file knows only the shape of a command line. */
#include "launcher/cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"

#define WIDTH 80

/* "[--out DIR]", "[--set path=value]...", "[--json]", "--image IMG" (required) */
static int option_synopsis(const struct cli_option *o, char *buf, size_t n)
{
    return snprintf(buf, n, "%s%s%s%s%s%s", o->required ? "" : "[", o->name, o->arg ? " " : "",
                    o->arg ? o->arg : "", o->required ? "" : "]", o->repeats ? "..." : "");
}

/* The first required option the command line lacks, or NULL. */
static const struct cli_option *missing_option(const struct cli_command *c,
                                               const struct cli_args *a)
{
    for (const struct cli_option *o = c->options; o && o->name; o++) {
        bool given = false;
        for (int k = 0; k < a->n && !given; k++) given = a->v[k].opt == (int)(o - c->options);
        if (o->required && !given) return o;
    }
    return NULL;
}

/* "usage: plait NAME OPERANDS [--opt ARG]...", wrapped at 80 columns with the
 * continuation lines indented past "usage: plait" */
static void synopsis(const struct cli_command *c, FILE *out)
{
    int col = fprintf(out, "usage: plait %s", c->name);
    int indent = col + 1;
    if (c->operands && *c->operands) col += fprintf(out, " %s", c->operands);
    for (const struct cli_option *o = c->options; o && o->name; o++) {
        char word[128];
        int len = option_synopsis(o, word, sizeof word);
        if (col + 1 + len > WIDTH) col = fprintf(out, "\n%*s", indent - 1, "") - 1;
        col += fprintf(out, " %s", word);
    }
    fputc('\n', out);
}

/* "  --out DIR         text", continuation lines aligned under the text */
void cli_help_row(const char *left, const char *help, FILE *out)
{
    const int at = 24;
    int col = fprintf(out, "  %s", left);
    if (col >= at - 1) {
        fputc('\n', out);
        col = 0;
    }
    for (const char *line = help; line;) {
        const char *nl = strchr(line, '\n');
        int len = nl ? (int)(nl - line) : (int)strlen(line);
        fprintf(out, "%*s%.*s\n", at - col, "", len, line);
        col = 0;
        line = nl ? nl + 1 : NULL;
    }
}

void cli_help(const struct cli_command *c, FILE *out)
{
    synopsis(c, out);
    fprintf(out, "\n%s\n", c->summary);
    if (c->description) fprintf(out, "\n%s\n", c->description);
    fprintf(out, "\noptions:\n");
    for (const struct cli_option *o = c->options; o && o->name; o++) {
        char left[128];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        cli_help_row(left, o->help, out);
    }
    cli_help_row("-h, --help", "print this help and exit", out);
    cli_help_row("--version", "print plait's version and exit", out);
    if (c->epilog) fprintf(out, "\n%s\n", c->epilog);
}

int cli_usage_error(const struct cli_command *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_error("%s: %s", c->name, msg);
    synopsis(c, stderr);
    fprintf(stderr, "Run 'plait %s --help' for more.\n", c->name);
    return PLAIT_EXIT_USAGE;
}

static const struct cli_option *find_option(const struct cli_command *c, const char *name,
                                            size_t len)
{
    for (const struct cli_option *o = c->options; o && o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len)) return o;
    return NULL;
}

int cli_parse(const struct cli_command *c, int argc, char **argv, struct cli_args *a)
{
    memset(a, 0, sizeof *a);
    a->v = calloc((size_t)argc + 1, sizeof *a->v);
    if (!a->v) {
        log_error("out of memory");
        return PLAIT_EXIT_ERROR;
    }
    bool operands_only = false;
    int rc = CLI_CONTINUE;
    for (int i = 0; i < argc && rc == CLI_CONTINUE; i++) {
        const char *s = argv[i];
        if (operands_only || s[0] != '-' || !s[1]) {
            if (a->n_operands == c->max_operands) {
                rc = cli_usage_error(c, "unexpected argument '%s'", s);
                break;
            }
            a->v[a->n++] = (struct cli_arg){.opt = -1, .value = s};
            a->n_operands++;
        } else if (!strcmp(s, "--")) {
            operands_only = true;
        } else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            cli_help(c, stdout);
            rc = PLAIT_EXIT_OK;
        } else if (!strcmp(s, "--version")) {
            printf("plait %s\n", PLAIT_VERSION);
            rc = PLAIT_EXIT_OK;
        } else {
            const char *eq = strchr(s, '=');
            size_t len = eq ? (size_t)(eq - s) : strlen(s);
            const struct cli_option *o = find_option(c, s, len);
            if (!o)
                rc = cli_usage_error(c, "unknown option %.*s", (int)len, s);
            else if (!o->arg && eq)
                rc = cli_usage_error(c, "%s takes no value (got %s)", o->name, s);
            else if (o->arg && !eq && i + 1 == argc)
                rc = cli_usage_error(c, "%s needs a value (%s %s)", o->name, o->name, o->arg);
            else
                a->v[a->n++] = (struct cli_arg){.opt = (int)(o - c->options),
                                                .value = !o->arg ? NULL
                                                         : eq    ? eq + 1
                                                                 : argv[++i]};
        }
    }
    if (rc == CLI_CONTINUE && a->n_operands < c->min_operands)
        rc = cli_usage_error(c, "missing %s", c->operands);
    const struct cli_option *missing = rc == CLI_CONTINUE ? missing_option(c, a) : NULL;
    if (missing)
        rc = cli_usage_error(c, "missing %s%s%s", missing->name, missing->arg ? " " : "",
                             missing->arg ? missing->arg : "");
    if (rc != CLI_CONTINUE) cli_args_free(a);
    return rc;
}

void cli_args_free(struct cli_args *a)
{
    free(a->v);
    memset(a, 0, sizeof *a);
}
