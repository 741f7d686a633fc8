/* k8s_nodes.c — plait check --k8s-nodes FILE: the plan on a cluster's nodes as
 * `kubectl get nodes -o json` lists them, grouped into kinds by GPU count and
 * NVIDIA GPU feature discovery's product and memory labels; on each kind the
 * layout is chosen as plait check chooses it and the nodes it runs on named.
 * Unschedulable and not Ready nodes are skipped and counted. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"
#include "launcher/k8s/k8s.h"
#include "launcher/plan_fit.h"

struct node {
    char name[254]; /* a node's name is a DNS-1123 subdomain */
    int gpus;
    char product[128];     /* "" when the label is missing */
    uint64_t memory_bytes; /* nvidia.com/gpu.memory (MiB), else from the product name */
};

struct kind {
    const char *product;
    int gpus;
    uint64_t memory_bytes;
    const char **names;
    int n;
};

static int quantity(json_t *v)
{
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (!json_is_string(v)) return 0;
    char *end;
    long n = strtol(json_string_value(v), &end, 10);
    return *end || n < 0 || n > 1 << 20 ? 0 : (int)n;
}

static bool ready(json_t *item)
{
    json_t *conds = json_object_get(json_object_get(item, "status"), "conditions"), *c;
    size_t i;
    if (!json_is_array(conds)) return true; /* a list without status: take it as ready */
    json_array_foreach(conds, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *status = json_string_value(json_object_get(c, "status"));
        if (type && !strcmp(type, "Ready")) return status && !strcmp(status, "True");
    }
    return true;
}

/* The GPU nodes that can take pods; counts of the others. */
static int read_nodes(json_t *root, const char *path, struct node **out, int *n, int *skipped,
                      int *without_gpus, struct plait_error *err)
{
    json_t *items = json_object_get(root, "items"), *item;
    size_t i;
    if (!json_is_array(items))
        return error_set(
            err, "%s: no \"items\" array: give the output of kubectl get nodes -o json", path);
    *out = calloc(json_array_size(items) + 1, sizeof **out);
    if (!*out) return error_set(err, "out of memory");
    *n = *skipped = *without_gpus = 0;
    json_array_foreach(items, i, item)
    {
        json_t *meta = json_object_get(item, "metadata");
        json_t *labels = json_object_get(meta, "labels");
        const char *name = json_string_value(json_object_get(meta, "name"));
        if (!name) return error_set(err, "%s: items[%zu]: no metadata.name", path, i);
        int gpus = quantity(json_object_get(
            json_object_get(json_object_get(item, "status"), "allocatable"), "nvidia.com/gpu"));
        if (gpus == 0) {
            (*without_gpus)++;
            continue;
        }
        if (json_is_true(json_object_get(json_object_get(item, "spec"), "unschedulable")) ||
            !ready(item)) {
            (*skipped)++;
            continue;
        }
        const char *product = json_string_value(json_object_get(labels, "nvidia.com/gpu.product"));
        int mib = quantity(json_object_get(labels, "nvidia.com/gpu.memory"));
        struct node *nd = &(*out)[(*n)++];
        /* what reaches the terminal, escaped (a node list is another program's text) */
        error_escape(nd->name, sizeof nd->name, name);
        nd->gpus = gpus;
        error_escape(nd->product, sizeof nd->product, product ? product : "");
        nd->memory_bytes = mib ? (uint64_t)mib << 20 : fit_product_memory(product);
    }
    return 0;
}

static int group(const struct node *nodes, int n, struct kind *kinds, int *n_kinds)
{
    *n_kinds = 0;
    for (int i = 0; i < n; i++) {
        struct kind *k = NULL;
        for (int j = 0; j < *n_kinds && !k; j++)
            if (!strcmp(kinds[j].product, nodes[i].product) && kinds[j].gpus == nodes[i].gpus)
                k = &kinds[j];
        if (!k) {
            k = &kinds[(*n_kinds)++];
            *k = (struct kind){.product = nodes[i].product,
                               .gpus = nodes[i].gpus,
                               .memory_bytes = nodes[i].memory_bytes,
                               .names = calloc((size_t)n, sizeof(char *))};
            if (!k->names) return -1;
        }
        /* the least memory a node of the kind reports (the label, else the product's name) */
        uint64_t m = nodes[i].memory_bytes;
        if (m && (!k->memory_bytes || m < k->memory_bytes)) k->memory_bytes = m;
        k->names[k->n++] = nodes[i].name;
    }
    return 0;
}

/* The plan on `want` nodes of one kind (0: as many as the plan's fixed ranks
 * need, else all of them): 0 fits (layout in *e), -1 with why. */
static int try_kind(const struct plan *p, const struct kind *k, int want, int gpus_per_node,
                    const struct layout_inputs *base, struct layout_eval *e, int *used, char *why,
                    size_t why_bytes)
{
    struct plait_error err;
    struct topo topo;
    struct fit_nodes fit = {0};
    int rc = -1, g = gpus_per_node ? gpus_per_node : k->gpus;
    memset(e, 0, sizeof *e);
    *used = 0;
    if (g > k->gpus) {
        snprintf(why, why_bytes, "--gpus-per-node %d, but these nodes have %d", g, k->gpus);
        return -1;
    }
    int64_t world = plan_ranks(p);
    int n = want ? want : world ? (int)((world + g - 1) / g) : k->n;
    if (n > k->n) {
        snprintf(why, why_bytes, "needs %d nodes of %d GPUs, there %s %d", n, g,
                 k->n == 1 ? "is" : "are", k->n);
        return -1;
    }
    struct fit_node_spec spec = {.n_gpus = k->gpus,
                                 .product = k->product,
                                 .memory_bytes = k->memory_bytes,
                                 .nvlink = true,
                                 .cores_per_gpu = 4,
                                 .source = k->product};
    if (fit_topo_synthetic(&topo, &spec, &err) ||
        fit_nodes_make(p, n, g, 1, &topo, 1, k->names, &fit, &err)) {
        snprintf(why, why_bytes, "%s", err.text);
        goto out;
    }
    struct layout_inputs in = *base;
    in.device_memory_bytes = layout_device_memory(fit.v, fit.n, 0);
    if (base->device_memory_bytes) in.device_memory_bytes = base->device_memory_bytes;
    if (layout_choose(p, fit.v, fit.n, &in, NULL, NULL, e, &err)) {
        snprintf(why, why_bytes, "%s", err.text);
        goto out;
    }
    if (!e->fits) {
        snprintf(why, why_bytes, "%s", e->why);
        goto out;
    }
    *used = (int)((e->map.world + g - 1) / g); /* dp "auto" may leave nodes out */
    rc = 0;
out:
    fit_nodes_free(&fit);
    topo_free(&topo);
    return rc;
}

/* One kind's entry of the JSON report. */
static json_t *kind_json(const struct kind *k, bool ok, int used, const struct layout_eval *e,
                         const char *why)
{
    json_t *names = json_array();
    for (int j = 0; j < (ok ? used : 0); j++)
        json_array_append_new(names, json_string(k->names[j]));
    json_t *o = json_pack("{s:s,s:i,s:I,s:i,s:b}", "product", k->product, "gpus", k->gpus,
                          "memory_bytes", (json_int_t)k->memory_bytes, "nodes", k->n, "fits", ok);
    if (ok) {
        json_object_set_new(o, "layout",
                            json_pack("{s:i,s:i,s:i}", "tp", e->layout.tp, "pp", e->layout.pp,
                                      "dp", e->layout.dp));
        json_object_set_new(o, "memory_bytes_per_rank", json_integer((json_int_t)e->mem.total));
        json_object_set_new(o, "tokens_per_s", json_real(e->tokens_per_s));
    } else {
        json_object_set_new(o, "why", json_string(why));
    }
    json_object_set_new(o, "on", names);
    return o;
}

/* One kind's lines of the table. */
static void print_kind(const struct kind *k, bool ok, int used, const struct layout_eval *e,
                       const char *why)
{
    printf("  %s, %d GPU%s of %.0f GB: %d node%s\n",
           *k->product ? k->product
                       : "(no "
                         "nvidia.com/gpu.product label)",
           k->gpus, k->gpus == 1 ? "" : "s", k->memory_bytes / 1e9, k->n, k->n == 1 ? "" : "s");
    if (ok) {
        char layout[96];
        printf("    fits: %s on %d node%s, %.2f GB per rank, %.0f tokens/s modelled:",
               place_layout_text(layout, sizeof layout, e->layout.tp, e->map.cp, e->layout.pp,
                                 e->layout.dp),
               used, used == 1 ? "" : "s", e->mem.total / 1e9, e->tokens_per_s);
        for (int j = 0; j < used; j++) printf(" %s", k->names[j]);
        printf("\n");
    } else {
        printf("    does not fit: %s\n", why);
    }
}

/* The plan on each kind, into report (and the table unless as_json); how
 * many kinds it fits. */
static int check_kinds(const struct plan *p, const struct kind *kinds, int n_kinds, int nodes,
                       int gpus_per_node, const struct layout_inputs *in, bool as_json,
                       json_t *report)
{
    int fits = 0;
    for (int i = 0; i < n_kinds; i++) {
        const struct kind *k = &kinds[i];
        struct layout_eval e;
        char why[1024] = "";
        int used;
        bool ok = try_kind(p, k, nodes, gpus_per_node, in, &e, &used, why, sizeof why) == 0;
        fits += ok;
        json_array_append_new(report, kind_json(k, ok, used, &e, why));
        if (!as_json) print_kind(k, ok, used, &e, why);
        layout_eval_free(&e);
    }
    return fits;
}

int k8s_nodes_check(const struct plan *p, const char *path, int nodes, int gpus_per_node,
                    const struct layout_inputs *in, bool as_json)
{
    json_error_t jerr;
    struct plait_error err;
    struct node *list = NULL;
    struct kind *kinds = NULL;
    int n = 0, n_kinds = 0, skipped = 0, without = 0, fits = 0, rc = PLAIT_EXIT_ERROR;
    json_t *root = json_load_file(path, 0, &jerr), *report = json_array();
    if (!root) {
        log_error("check: %s:%d: %s", path, jerr.line, jerr.text);
        goto out;
    }
    if (read_nodes(root, path, &list, &n, &skipped, &without, &err)) {
        log_error("check: %s", err.text);
        goto out;
    }
    if (!(kinds = calloc((size_t)n + 1, sizeof *kinds)) || group(list, n, kinds, &n_kinds)) {
        log_error("check: out of memory");
        goto out;
    }
    if (!as_json)
        printf("plan: %s is valid\nnodes: %s: %d GPU node%s of %d kind%s (%d unschedulable or not "
               "ready, %d without GPUs)\n",
               p->source, path, n, n == 1 ? "" : "s", n_kinds, n_kinds == 1 ? "" : "s", skipped,
               without);
    fits = check_kinds(p, kinds, n_kinds, nodes, gpus_per_node, in, as_json, report);
    if (as_json) {
        json_t *o = json_pack("{s:s,s:i,s:i,s:i,s:o}", "nodes_file", path, "gpu_nodes", n,
                              "unschedulable", skipped, "without_gpus", without, "kinds", report);
        report = NULL;
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
        printf("%s\n", text);
        free(text);
        json_decref(o);
    }
    if (!fits)
        log_error("check: %s: the plan fits on none of the %d GPU node kinds", path, n_kinds);
    rc = fits ? PLAIT_EXIT_OK : PLAIT_EXIT_ERROR;
out:
    for (int i = 0; i < n_kinds; i++) free(kinds[i].names);
    free(kinds);
    free(list);
    json_decref(report);
    json_decref(root);
    return rc;
}
