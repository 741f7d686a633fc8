/* config.c — parsing spank_plait's plugstack.conf arguments into the
 * admin's policy. Only parsing: the checks themselves are policy.c's. */
#include "spank-plugin/config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/plan/plan.h"

static const char *const known =
    "max_gpus_per_job, max_nodes, allowed_precisions, min_checkpoint_every, quota_file, "
    "topology_xml, run_root, store_ports";

static int positive(const char *key, const char *value, int *out, struct plait_error *err)
{
    char *end;
    long n = strtol(value, &end, 10);
    if (!*value || *end || n < 1 || n > INT_MAX)
        return error_set(err, "plugstack.conf: %s must be a positive integer (got '%s')", key,
                         value);
    *out = (int)n;
    return 0;
}

static int precisions(const char *value, struct plait_config *c, struct plait_error *err)
{
    c->allowed_precisions = 0;
    char *copy = strdup(value), *save = NULL;
    if (!copy) return error_set(err, "out of memory");
    int rc = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
        enum plan_precision p;
        if (plan_precision_parse(tok, &p) == 0) {
            c->allowed_precisions |= 1u << p;
            continue;
        }
        char known_names[64] = "";
        for (int i = 0; i < PLAN_PRECISIONS; i++)
            snprintf(known_names + strlen(known_names), sizeof known_names - strlen(known_names),
                     "%s%s", i ? ", " : "", plan_precision_name((enum plan_precision)i));
        rc = error_set(err, "plugstack.conf: allowed_precisions: unknown precision '%s' (known: %s)",
                       tok, known_names);
    }
    free(copy);
    if (rc == 0 && !c->allowed_precisions)
        rc = error_set(err, "plugstack.conf: allowed_precisions is empty");
    return rc;
}

/* "LO-HI", 1 <= LO <= HI <= 65535 */
static int port_range(const char *value, struct plait_config *c, struct plait_error *err)
{
    char *end, *end2;
    long lo = strtol(value, &end, 10), hi = *end == '-' ? strtol(end + 1, &end2, 10) : -1;
    if (*end != '-' || end2 == end + 1 || *end2 || lo < 1 || hi < lo || hi > 65535)
        return error_set(err,
                         "plugstack.conf: store_ports must be a port range LO-HI within "
                         "1-65535 (got '%s')",
                         value);
    c->store_port_lo = (int)lo;
    c->store_port_hi = (int)hi;
    return 0;
}

static int string(const char *key, const char *value, char **out, struct plait_error *err)
{
    if (!*value) return error_set(err, "plugstack.conf: %s is empty", key);
    free(*out);
    if (!(*out = strdup(value))) return error_set(err, "out of memory");
    return 0;
}

int config_parse(int argc, char **argv, struct plait_config *c, struct plait_error *err)
{
    memset(c, 0, sizeof *c);
    c->allowed_precisions = (1u << PLAN_PRECISIONS) - 1;
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            config_free(c);
            return error_set(err, "plugstack.conf: argument '%s' is not key=value (known keys: %s)",
                             argv[i], known);
        }
        size_t klen = (size_t)(eq - argv[i]);
        const char *v = eq + 1;
        int rc;
#define IS(k) (klen == strlen(k) && !strncmp(argv[i], k, klen))
        if (IS("max_gpus_per_job"))
            rc = positive("max_gpus_per_job", v, &c->max_gpus_per_job, err);
        else if (IS("max_nodes"))
            rc = positive("max_nodes", v, &c->max_nodes, err);
        else if (IS("min_checkpoint_every"))
            rc = positive("min_checkpoint_every", v, &c->min_checkpoint_every, err);
        else if (IS("allowed_precisions"))
            rc = precisions(v, c, err);
        else if (IS("quota_file"))
            rc = string("quota_file", v, &c->quota_file, err);
        else if (IS("topology_xml"))
            rc = string("topology_xml", v, &c->topology_xml, err);
        else if (IS("run_root"))
            rc = string("run_root", v, &c->run_root, err);
        else if (IS("store_ports"))
            rc = port_range(v, c, err);
        else
            rc = error_set(err, "plugstack.conf: unknown argument '%.*s' (known keys: %s)",
                           (int)klen, argv[i], known);
#undef IS
        if (rc) {
            config_free(c);
            return -1;
        }
    }
    return 0;
}

void config_free(struct plait_config *c)
{
    free(c->quota_file);
    free(c->topology_xml);
    free(c->run_root);
    c->quota_file = c->topology_xml = c->run_root = NULL;
}
