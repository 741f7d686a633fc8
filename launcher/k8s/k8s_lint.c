/* k8s_lint.c — the project's own checks of a manifest stream (k8s_lint.h): the
 * stream is read back with libyaml's parser, so the lint sees exactly the text
 * that is printed. The schemas (tests/k8s/validate) check types and fields;
 * this checks names, lengths, label syntax, quota keys, GPU requests and the
 * gang's size, which they cannot. */
#include "launcher/k8s/k8s_lint.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MAX_DOCS 64
#define MAX_DEPTH 64
#define MAX_VISITS 1000000 /* nodes one walk visits: aliases can multiply a small file */

struct lint {
    yaml_document_t docs[MAX_DOCS];
    int n;
    const char *source;
    FILE *report;
    int problems;
    long visits; /* of the current walk */
};

/* ---- names and labels --------------------------------------------------------------- */

static bool lower_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool alnum(char c)
{
    return lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

const char *k8s_dns_label_problem(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0) return "is empty";
    if (n > max) return max == 63 ? "is longer than 63 characters" : "is too long";
    for (size_t i = 0; i < n; i++)
        if (!lower_alnum(s[i]) && s[i] != '-')
            return "may hold only lower-case letters, digits and '-' (DNS-1123)";
    if (!lower_alnum(s[0]) || !lower_alnum(s[n - 1]))
        return "must start and end with a lower-case letter or digit (DNS-1123)";
    return NULL;
}

/* A DNS-1123 subdomain: dot-separated labels, at most 253 characters. */
static const char *dns_subdomain_problem(const char *s)
{
    size_t n = strlen(s);
    if (n == 0) return "is empty";
    if (n > 253) return "is longer than 253 characters";
    char part[254];
    for (const char *p = s; p;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        memcpy(part, p, len);
        part[len] = '\0';
        if (k8s_dns_label_problem(part, 63))
            return "must be dot-separated DNS-1123 labels (lower-case letters, digits, '-')";
        p = dot ? dot + 1 : NULL;
    }
    return NULL;
}

/* A label value, or the name part of a qualified key: at most 63 of
 * [A-Za-z0-9-_.], starting and ending alphanumeric (a value may be empty). */
static const char *label_name_problem(const char *s, bool may_be_empty)
{
    size_t n = strlen(s);
    if (n == 0) return may_be_empty ? NULL : "is empty";
    if (n > 63) return "is longer than 63 characters";
    for (size_t i = 0; i < n; i++)
        if (!alnum(s[i]) && !strchr("-_.", s[i]))
            return "may hold only letters, digits, '-', '_' and '.'";
    if (!alnum(s[0]) || !alnum(s[n - 1])) return "must start and end with a letter or digit";
    return NULL;
}

/* A label or annotation key: [prefix/]name, the prefix a DNS-1123 subdomain. */
static const char *qualified_key_problem(const char *s)
{
    const char *slash = strchr(s, '/');
    if (!slash) return label_name_problem(s, false);
    char prefix[300];
    size_t len = (size_t)(slash - s);
    if (len >= sizeof prefix) return "has a prefix longer than 253 characters";
    memcpy(prefix, s, len);
    prefix[len] = '\0';
    if (dns_subdomain_problem(prefix)) return "has a prefix that is not a DNS-1123 subdomain";
    return label_name_problem(slash + 1, false);
}

/* ---- reading the documents ------------------------------------------------------------ */

static yaml_node_t *node(yaml_document_t *d, int id)
{
    return id ? yaml_document_get_node(d, id) : NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* m[key], or NULL */
static yaml_node_t *get(yaml_document_t *d, yaml_node_t *m, const char *key)
{
    if (!m || m->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(d, p->key));
        if (k && !strcmp(k, key)) return node(d, p->value);
    }
    return NULL;
}

/* m.a.b.c for "a.b.c" (keys without dots) */
static yaml_node_t *path(yaml_document_t *d, yaml_node_t *m, const char *dotted)
{
    char key[128];
    while (m && *dotted) {
        size_t len = strcspn(dotted, ".");
        if (len >= sizeof key) return NULL;
        memcpy(key, dotted, len);
        key[len] = '\0';
        m = get(d, m, key);
        dotted += len + (dotted[len] == '.');
    }
    return m;
}

static long long integer(yaml_node_t *n, long long fallback)
{
    const char *s = scalar(n);
    char *end;
    if (!s || !*s) return fallback;
    long long v = strtoll(s, &end, 10);
    return *end ? fallback : v;
}

static const char *str_at(yaml_document_t *d, yaml_node_t *m, const char *dotted)
{
    return scalar(path(d, m, dotted));
}

static void problem(struct lint *l, int doc, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void problem(struct lint *l, int doc, const char *where, const char *fmt, ...)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *kind = str_at(d, root, "kind"), *name = str_at(d, root, "metadata.name");
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[2048], shown[2048]; /* the file's text may hold control characters */
    snprintf(line, sizeof line, "%s: document %d (%s/%s): %s: %s", l->source, doc + 1,
             kind ? kind : "?", name ? name : "?", where, msg);
    fprintf(l->report, "plait: lint: %s\n", error_escape(shown, sizeof shown, line));
    l->problems++;
}

/* ---- the checks ------------------------------------------------------------------------ */

static void check_label_map(struct lint *l, int doc, yaml_node_t *m, const char *where,
                            bool values_too)
{
    yaml_document_t *d = &l->docs[doc];
    if (!m || m->type != YAML_MAPPING_NODE) return;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(d, p->key)), *v = scalar(node(d, p->value)), *why;
        if (!k) continue;
        if ((why = qualified_key_problem(k))) problem(l, doc, where, "key \"%s\" %s", k, why);
        if (values_too && v && (why = label_name_problem(v, true)))
            problem(l, doc, where, "%s: value \"%s\" %s", k, v, why);
    }
}

/* Calls visit for every key of every mapping of the document, depth first, with
 * the mapping that holds it and its path ("spec.template.metadata.labels");
 * visit returns whether to descend into the value. */
typedef bool (*visit_fn)(struct lint *l, int doc, yaml_node_t *map, const char *key,
                         yaml_node_t *value, const char *where);
static bool visit_labels(struct lint *l, int doc, yaml_node_t *map, const char *k, yaml_node_t *v,
                         const char *where);

static void walk(struct lint *l, int doc, yaml_node_t *n, const char *at, int depth, visit_fn visit)
{
    yaml_document_t *d = &l->docs[doc];
    char where[256];
    if (!n) return;
    if (l->visits < 0) return; /* this walk gave up */
    if (depth > MAX_DEPTH || ++l->visits > MAX_VISITS) {
        /* no manifest nests so deep or is so large; aliases may loop or multiply */
        if (visit == visit_labels)
            problem(l, doc, at, "nested deeper than %d levels or more than %d nodes (aliases?)",
                    MAX_DEPTH, MAX_VISITS);
        l->visits = -1;
        return;
    }
    if (n->type == YAML_SEQUENCE_NODE)
        for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top;
             i++) {
            snprintf(where, sizeof where, "%s[%d]", at, (int)(i - n->data.sequence.items.start));
            walk(l, doc, node(d, *i), where, depth + 1, visit);
        }
    if (n->type != YAML_MAPPING_NODE) return;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(d, p->key));
        yaml_node_t *v = node(d, p->value);
        if (!k) continue;
        snprintf(where, sizeof where, "%s%s%s", at, *at ? "." : "", k);
        if (visit(l, doc, n, k, v, where)) walk(l, doc, v, where, depth + 1, visit);
    }
}

/* Every metadata's labels and annotations, every selector and nodeSelector. */
static bool visit_labels(struct lint *l, int doc, yaml_node_t *map, const char *k, yaml_node_t *v,
                         const char *where)
{
    yaml_document_t *d = &l->docs[doc];
    (void)map;
    if (!strcmp(k, "labels") || !strcmp(k, "matchLabels") || !strcmp(k, "nodeSelector") ||
        (!strcmp(k, "selector") && v && !get(d, v, "matchLabels") &&
         !get(d, v, "matchExpressions")))
        check_label_map(l, doc, v, where, true);
    else if (!strcmp(k, "annotations"))
        check_label_map(l, doc, v, where, false);
    else
        return true;
    return false;
}

/* An extended resource: "nvidia.com/gpu", not "cpu" or "hugepages-2Mi" or
 * "kubernetes.io/..." */
static bool extended_resource(const char *name)
{
    const char *slash = strchr(name, '/');
    if (!slash) return false;
    size_t len = (size_t)(slash - name);
    return !(len >= 13 && !strncmp(slash - 13, "kubernetes.io", 13));
}

/* requests = limits for every extended resource (GPUs, RDMA devices) of every
 * container (a mapping with an image and resources). */
static bool visit_resources(struct lint *l, int doc, yaml_node_t *map, const char *k,
                            yaml_node_t *res, const char *where)
{
    yaml_document_t *d = &l->docs[doc];
    if (strcmp(k, "resources") || !get(d, map, "image")) return true;
    yaml_node_t *req = get(d, res, "requests"), *lim = get(d, res, "limits");
    for (int pass = 0; pass < 2; pass++) {
        yaml_node_t *m = pass ? lim : req;
        if (!m || m->type != YAML_MAPPING_NODE) continue;
        for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
             p++) {
            const char *name = scalar(node(d, p->key)), *v = scalar(node(d, p->value));
            if (!name || !extended_resource(name)) continue;
            const char *other = scalar(get(d, pass ? req : lim, name));
            if (!other && pass == 0)
                problem(l, doc, where, "%s is requested but has no limit", name);
            else if (other && pass == 0 && v && strcmp(v, other))
                problem(l, doc, where, "%s: requests %s but limits %s (they must be equal)", name,
                        v, other);
            else if (v && (integer(node(d, p->value), -1) < 0))
                problem(l, doc, where, "%s: \"%s\" is not a whole count", name, v);
        }
    }
    return false;
}

static void check_names(struct lint *l, int doc, const char *kind)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *name = str_at(d, root, "metadata.name"),
               *ns = str_at(d, root, "metadata.namespace");
    const char *why;
    /* these names become DNS labels or label values: a Service's name, a Job's
     * job-name label, a JobSet's child Jobs */
    bool label = !strcmp(kind, "Service") || !strcmp(kind, "Job") || !strcmp(kind, "JobSet") ||
                 !strcmp(kind, "Namespace") || !strcmp(kind, "LocalQueue") ||
                 !strcmp(kind, "ClusterQueue") || !strcmp(kind, "PodGroup");
    if (!name)
        problem(l, doc, "metadata.name", "missing");
    else if ((why = label ? k8s_dns_label_problem(name, 63) : dns_subdomain_problem(name)))
        problem(l, doc, "metadata.name", "\"%s\" %s", name, why);
    else if (!strcmp(kind, "Service") && !(name[0] >= 'a' && name[0] <= 'z'))
        problem(l, doc, "metadata.name", "\"%s\": a Service's name must start with a letter", name);
    if (ns && (why = k8s_dns_label_problem(ns, 63)))
        problem(l, doc, "metadata.namespace", "\"%s\" %s", ns, why);
}

/* The pods of a workload, and its pod templates (up to 8). */
struct workload {
    long long pods;
    yaml_node_t *templates[8];
    int n_templates;
};

/* A Volcano Job: its tasks' pods (host names NAME-TASK-I), all of which
 * minAvailable must count for a gang. */
static bool vcjob_of(struct lint *l, int doc, struct workload *w, bool report)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *name = str_at(d, root, "metadata.name");
    yaml_node_t *tasks = path(d, root, "spec.tasks");
    if (!tasks || tasks->type != YAML_SEQUENCE_NODE) return false;
    char host[512];
    for (yaml_node_item_t *i = tasks->data.sequence.items.start; i < tasks->data.sequence.items.top;
         i++) {
        yaml_node_t *t = node(d, *i);
        const char *tname = str_at(d, t, "name");
        long long replicas = integer(get(d, t, "replicas"), 1);
        w->pods += replicas;
        if (w->n_templates < 8) w->templates[w->n_templates++] = get(d, t, "template");
        snprintf(host, sizeof host, "%s-%s-%lld", name, tname ? tname : "", replicas - 1);
        if (report && strlen(host) > 63)
            problem(l, doc, "spec.tasks",
                    "the last pod's host name \"%s\" is longer than 63 characters", host);
    }
    long long min = integer(path(d, root, "spec.minAvailable"), w->pods);
    if (report && min != w->pods)
        problem(l, doc, "spec.minAvailable",
                "%lld, but the tasks run %lld pods: a gang starts all its pods at once", min,
                w->pods);
    return true;
}

/* report: say what is wrong with it (once per document) */
static bool workload_of(struct lint *l, int doc, struct workload *w, bool report)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *kind = str_at(d, root, "kind"), *name = str_at(d, root, "metadata.name");
    memset(w, 0, sizeof *w);
    if (!kind || !name) return false;
    char where[128], host[512];
    const char *api = str_at(d, root, "apiVersion");
    if (!strcmp(kind, "Job") && api && !strncmp(api, "batch.volcano.sh/", 17))
        return vcjob_of(l, doc, w, report);
    if (!strcmp(kind, "Job")) {
        yaml_node_t *spec = get(d, root, "spec");
        long long c = integer(get(d, spec, "completions"), 1);
        long long par = integer(get(d, spec, "parallelism"), 1);
        w->pods = c;
        w->templates[w->n_templates++] = get(d, spec, "template");
        const char *mode = str_at(d, spec, "completionMode");
        if (mode && !strcmp(mode, "Indexed")) {
            snprintf(host, sizeof host, "%s-%lld", name, c - 1);
            if (report && strlen(host) > 63)
                problem(l, doc, "metadata.name",
                        "the last pod's host name \"%s\" is longer than 63 characters", host);
        }
        yaml_node_t *tpl = w->templates[0];
        bool gang = get(d, path(d, tpl, "metadata.annotations"), "scheduling.k8s.io/group-name") ||
                    get(d, path(d, tpl, "metadata.labels"), "scheduling.x-k8s.io/pod-group") ||
                    get(d, path(d, root, "metadata.labels"), "kueue.x-k8s.io/queue-name");
        if (report && gang && c != par)
            problem(l, doc, "spec.parallelism",
                    "%lld, but completions is %lld: a gang runs all its pods at once", par, c);
        return true;
    }
    if (!strcmp(kind, "JobSet")) {
        yaml_node_t *rjs = path(d, root, "spec.replicatedJobs");
        if (!rjs || rjs->type != YAML_SEQUENCE_NODE) return false;
        for (yaml_node_item_t *i = rjs->data.sequence.items.start; i < rjs->data.sequence.items.top;
             i++) {
            yaml_node_t *rj = node(d, *i);
            const char *rname = str_at(d, rj, "name");
            long long replicas = integer(get(d, rj, "replicas"), 1);
            yaml_node_t *js = path(d, rj, "template.spec");
            long long c = integer(get(d, js, "completions"), 1);
            long long par = integer(get(d, js, "parallelism"), 1);
            w->pods += replicas * c;
            if (w->n_templates < 8) w->templates[w->n_templates++] = get(d, js, "template");
            snprintf(where, sizeof where, "spec.replicatedJobs[%d]",
                     (int)(i - rjs->data.sequence.items.start));
            snprintf(host, sizeof host, "%s-%s-%lld-%lld", name, rname ? rname : "", replicas - 1,
                     c - 1);
            if (report && strlen(host) > 63)
                problem(l, doc, where,
                        "the last pod's host name \"%s\" is longer than 63 characters", host);
            if (report && c != par)
                problem(l, doc, where,
                        "parallelism %lld, but completions %lld: a gang runs all its pods at once",
                        par, c);
        }
        return true;
    }
    return false;
}

/* Whether a pod template joins the pod group `group`. */
static bool joins(yaml_document_t *d, yaml_node_t *tpl, const char *group)
{
    const char *a =
        scalar(get(d, path(d, tpl, "metadata.annotations"), "scheduling.k8s.io/group-name"));
    const char *b =
        scalar(get(d, path(d, tpl, "metadata.labels"), "scheduling.x-k8s.io/pod-group"));
    return (a && !strcmp(a, group)) || (b && !strcmp(b, group));
}

static long long template_gpus(yaml_document_t *d, yaml_node_t *tpl)
{
    long long gpus = 0;
    yaml_node_t *cs = path(d, tpl, "spec.containers");
    if (!cs || cs->type != YAML_SEQUENCE_NODE) return 0;
    for (yaml_node_item_t *i = cs->data.sequence.items.start; i < cs->data.sequence.items.top; i++)
        gpus += integer(get(d, path(d, node(d, *i), "resources.limits"), "nvidia.com/gpu"), 0);
    return gpus;
}

/* minMember = the pods that join the group, and minResources' GPUs = theirs. */
static void check_pod_group(struct lint *l, int doc)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *group = str_at(d, root, "metadata.name");
    long long min = integer(path(d, root, "spec.minMember"), -1);
    if (!group) return;
    for (int w = 0; w < l->n; w++) {
        struct workload wl;
        if (!workload_of(l, w, &wl, false)) continue;
        yaml_document_t *wd = &l->docs[w];
        for (int t = 0; t < wl.n_templates; t++) {
            if (!joins(wd, wl.templates[t], group)) continue;
            if (min != wl.pods)
                problem(l, doc, "spec.minMember",
                        "%lld, but the workload in document %d runs %lld pods in this group: a "
                        "gang of fewer members starts without all its pods",
                        min, w + 1, wl.pods);
            yaml_node_t *mr = get(d, path(d, root, "spec.minResources"), "nvidia.com/gpu");
            long long want = wl.pods * template_gpus(wd, wl.templates[t]);
            if (mr && integer(mr, -1) != want)
                problem(l, doc, "spec.minResources.nvidia.com/gpu",
                        "%s, but its %lld pods ask for %lld GPUs", scalar(mr), wl.pods, want);
            return;
        }
    }
}

static void check_quota(struct lint *l, int doc)
{
    yaml_document_t *d = &l->docs[doc];
    yaml_node_t *hard = path(d, yaml_document_get_root_node(d), "spec.hard");
    if (!hard || hard->type != YAML_MAPPING_NODE) return;
    for (yaml_node_pair_t *p = hard->data.mapping.pairs.start; p < hard->data.mapping.pairs.top;
         p++) {
        const char *k = scalar(node(d, p->key));
        if (!k || !strncmp(k, "count/", 6)) continue;
        const char *res = !strncmp(k, "requests.", 9) ? k + 9 : NULL;
        if (extended_resource(k) && !res)
            problem(l, doc, "spec.hard",
                    "\"%s\": a quota on an extended resource must be written "
                    "requests.<resource> (e.g. requests.nvidia.com/gpu); limits.* and bare names "
                    "are refused for them",
                    k);
    }
}

/* An Indexed Job's pods find each other under spec.template.spec.subdomain:
 * a headless Service of that name must be in the stream. */
static void check_subdomain(struct lint *l, int doc)
{
    yaml_document_t *d = &l->docs[doc];
    const char *sub = str_at(d, yaml_document_get_root_node(d), "spec.template.spec.subdomain");
    if (!sub) return;
    for (int s = 0; s < l->n; s++) {
        yaml_document_t *sd = &l->docs[s];
        yaml_node_t *root = yaml_document_get_root_node(sd);
        const char *kind = str_at(sd, root, "kind"), *name = str_at(sd, root, "metadata.name");
        if (!kind || strcmp(kind, "Service") || !name || strcmp(name, sub)) continue;
        const char *ip = str_at(sd, root, "spec.clusterIP");
        if (!ip || strcmp(ip, "None"))
            problem(l, s, "spec.clusterIP",
                    "the Service behind a subdomain must be headless "
                    "(clusterIP: None)");
        return;
    }
    problem(l, doc, "spec.template.spec.subdomain",
            "\"%s\": no headless Service of that name in this stream", sub);
}

int k8s_lint_text(const char *text, size_t len, const char *source, FILE *report,
                  struct plait_error *err)
{
    struct lint l = {.source = source, .report = report};
    yaml_parser_t parser;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) return error_set(err, "%s: out of memory", source);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    for (;;) {
        if (l.n == MAX_DOCS) {
            error_set(err, "%s: more than %d documents", source, MAX_DOCS);
            goto out;
        }
        if (!yaml_parser_load(&parser, &l.docs[l.n])) {
            error_set(err, "%s:%zu: not YAML: %s", source, parser.problem_mark.line + 1,
                      parser.problem ? parser.problem : "?");
            goto out;
        }
        if (!yaml_document_get_root_node(&l.docs[l.n])) {
            yaml_document_delete(&l.docs[l.n]);
            break;
        }
        l.n++;
    }
    for (int i = 0; i < l.n; i++) {
        yaml_document_t *d = &l.docs[i];
        yaml_node_t *root = yaml_document_get_root_node(d);
        const char *kind = str_at(d, root, "kind");
        if (!kind || !str_at(d, root, "apiVersion")) {
            problem(&l, i, "kind", "a manifest needs apiVersion and kind");
            continue;
        }
        check_names(&l, i, kind);
        l.visits = 0;
        walk(&l, i, root, "", 0, visit_labels);
        l.visits = 0;
        walk(&l, i, root, "", 0, visit_resources);
        struct workload w;
        workload_of(&l, i, &w, true);
        if (!strcmp(kind, "PodGroup")) check_pod_group(&l, i);
        if (!strcmp(kind, "ResourceQuota")) check_quota(&l, i);
        if (!strcmp(kind, "Job")) check_subdomain(&l, i);
    }
    rc = l.problems;
out:
    for (int i = 0; i < l.n; i++) yaml_document_delete(&l.docs[i]);
    yaml_parser_delete(&parser);
    return rc;
}
