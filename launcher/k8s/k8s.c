/* k8s.c — what plait k8s render and admin share: the gang kinds' names, and
 * the last step of both, a manifest stream linted and then printed (or not
 * printed, saying what the lint found). The command lines are
 * launcher/cmd_k8s.c's. */
#include "launcher/k8s/k8s.h"

#include "common/place/env.h"
#include "common/log.h"
#include "launcher/k8s/k8s_lint.h"

static const char *const gang_names[] = {"jobset", "kueue", "volcano", "coscheduling", "quota"};

const char *k8s_gang_name(enum k8s_gang g)
{
    return g >= 0 && g < (int)(sizeof gang_names / sizeof *gang_names) ? gang_names[g] : "?";
}

int k8s_print_linted(struct ky_stream *s, const char *what, FILE *out)
{
    struct plait_error err;
    if (ky_stream_close(s, &err)) {
        log_error("%s: %s", what, err.text);
        return PLAIT_EXIT_ERROR;
    }
    int problems = k8s_lint_text(s->text, s->len, "the manifests", stderr, &err);
    if (problems < 0) log_error("%s: %s", what, err.text);
    if (problems > 0)
        log_error("%s: the lint found %d problem%s in the manifests above; nothing printed", what,
                  problems, problems == 1 ? "" : "s");
    if (problems) return PLAIT_EXIT_ERROR;
    fputs(s->text, out);
    return fflush(out) ? PLAIT_EXIT_ERROR : PLAIT_EXIT_OK;
}
