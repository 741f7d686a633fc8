/* k8s_yaml.c — the manifest builder and stream writer of k8s_yaml.h, on libyaml's
 * document API and emitter. What goes into a manifest is k8s_render.c's and
 * k8s_admin.c's; what is wrong with one is k8s_lint.c's. */
#include "launcher/k8s/k8s_yaml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static yaml_char_t *tag(const char *t)
{
    return (yaml_char_t *)t;
}

int ky_init(struct ky_doc *d)
{
    memset(d, 0, sizeof *d);
    /* explicit start: every document of the stream opens with "---" */
    if (!yaml_document_initialize(&d->doc, NULL, NULL, NULL, 0, 1)) return -1;
    if (!yaml_document_add_mapping(&d->doc, tag(YAML_DEFAULT_MAPPING_TAG),
                                   YAML_BLOCK_MAPPING_STYLE)) {
        yaml_document_delete(&d->doc);
        return -1;
    }
    return 0;
}

int ky_root(struct ky_doc *d)
{
    (void)d;
    return 1; /* the first node ky_init made */
}

static int checked(struct ky_doc *d, int id)
{
    if (!id) d->failed = true;
    return id;
}

int ky_map(struct ky_doc *d)
{
    if (d->failed) return 0;
    return checked(d, yaml_document_add_mapping(&d->doc, tag(YAML_DEFAULT_MAPPING_TAG),
                                                YAML_BLOCK_MAPPING_STYLE));
}

int ky_flow_map(struct ky_doc *d)
{
    if (d->failed) return 0;
    return checked(d, yaml_document_add_mapping(&d->doc, tag(YAML_DEFAULT_MAPPING_TAG),
                                                YAML_FLOW_MAPPING_STYLE));
}

int ky_seq(struct ky_doc *d)
{
    if (d->failed) return 0;
    return checked(d, yaml_document_add_sequence(&d->doc, tag(YAML_DEFAULT_SEQUENCE_TAG),
                                                 YAML_BLOCK_SEQUENCE_STYLE));
}

int ky_flow_seq(struct ky_doc *d)
{
    if (d->failed) return 0;
    return checked(d, yaml_document_add_sequence(&d->doc, tag(YAML_DEFAULT_SEQUENCE_TAG),
                                                 YAML_FLOW_SEQUENCE_STYLE));
}

static int scalar(struct ky_doc *d, const char *s, yaml_scalar_style_t style)
{
    if (d->failed) return 0;
    return checked(d, yaml_document_add_scalar(&d->doc, tag(YAML_DEFAULT_SCALAR_TAG),
                                               (yaml_char_t *)s, (int)strlen(s), style));
}

/* Whether a plain scalar s would be read back (YAML 1.1, as js-yaml and
 * Kubernetes' own reader resolve it) as something other than a string: a
 * number (also "1e3", "0x1f", "1:20"), a boolean, null. Errs on the side of
 * quoting: any string of digits and number punctuation is quoted. */
static bool would_not_be_string(const char *s)
{
    static const char *const words[] = {"y",   "yes", "n",    "no",   "true",  "false", "on",
                                        "off", "~",   "null", ".inf", "-.inf", "+.inf", ".nan"};
    if (!*s) return true;
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (!strcasecmp(s, words[k])) return true;
    bool digit = false;
    for (const char *c = s; *c; c++) {
        if (*c >= '0' && *c <= '9')
            digit = true;
        else if (!strchr("+-._:eExXoObBabcdefABCDEF", *c))
            return false;
    }
    return digit;
}

int ky_str(struct ky_doc *d, const char *s)
{
    return scalar(d, s,
                  would_not_be_string(s) ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE);
}

int ky_int(struct ky_doc *d, long long v)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    return scalar(d, text, YAML_PLAIN_SCALAR_STYLE);
}

int ky_bool(struct ky_doc *d, bool v)
{
    return scalar(d, v ? "true" : "false", YAML_PLAIN_SCALAR_STYLE);
}

int ky_literal(struct ky_doc *d, const char *s)
{
    return scalar(d, s, YAML_LITERAL_SCALAR_STYLE);
}

int ky_set(struct ky_doc *d, int map, const char *key, int value)
{
    int k = ky_str(d, key);
    if (d->failed || !map || !value) return d->failed = true, 0;
    if (!yaml_document_append_mapping_pair(&d->doc, map, k, value)) d->failed = true;
    return value;
}

int ky_set_str(struct ky_doc *d, int map, const char *key, const char *value)
{
    return ky_set(d, map, key, ky_str(d, value));
}

int ky_set_int(struct ky_doc *d, int map, const char *key, long long value)
{
    return ky_set(d, map, key, ky_int(d, value));
}

int ky_set_bool(struct ky_doc *d, int map, const char *key, bool value)
{
    return ky_set(d, map, key, ky_bool(d, value));
}

int ky_set_map(struct ky_doc *d, int map, const char *key)
{
    return ky_set(d, map, key, ky_map(d));
}

int ky_set_seq(struct ky_doc *d, int map, const char *key)
{
    return ky_set(d, map, key, ky_seq(d));
}

int ky_push(struct ky_doc *d, int seq, int value)
{
    if (d->failed || !seq || !value) return d->failed = true, 0;
    if (!yaml_document_append_sequence_item(&d->doc, seq, value)) d->failed = true;
    return value;
}

int ky_object(struct ky_doc *d, const char *api_version, const char *kind, const char *name,
              const char *ns)
{
    int root = ky_root(d);
    ky_set_str(d, root, "apiVersion", api_version);
    ky_set_str(d, root, "kind", kind);
    int meta = ky_set_map(d, root, "metadata");
    ky_set_str(d, meta, "name", name);
    if (ns) ky_set_str(d, meta, "namespace", ns);
    return meta;
}

void ky_free(struct ky_doc *d)
{
    yaml_document_delete(&d->doc);
}

/* ---- the stream ------------------------------------------------------------------------ */

static int write_out(void *data, unsigned char *buffer, size_t size)
{
    struct ky_stream *s = data;
    if (s->len + size + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + size + 1) cap *= 2;
        char *grown = realloc(s->text, cap);
        if (!grown) return 0;
        s->text = grown;
        s->cap = cap;
    }
    memcpy(s->text + s->len, buffer, size);
    s->len += size;
    s->text[s->len] = '\0';
    return 1;
}

static int emitter_failed(struct ky_stream *s, struct plait_error *err, const char *doing)
{
    s->failed = true;
    return error_set(err, "YAML emitter: %s: %s", doing,
                     s->emitter.problem ? s->emitter.problem : "out of memory");
}

int ky_stream_open(struct ky_stream *s, struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    if (!yaml_emitter_initialize(&s->emitter)) return error_set(err, "YAML emitter: out of memory");
    s->open = true;
    yaml_emitter_set_output(&s->emitter, write_out, s);
    yaml_emitter_set_unicode(&s->emitter, 1);
    yaml_emitter_set_width(&s->emitter, 100);
    yaml_emitter_set_indent(&s->emitter, 2);
    if (!yaml_emitter_open(&s->emitter)) return emitter_failed(s, err, "opening the stream");
    return 0;
}

int ky_stream_add(struct ky_stream *s, struct ky_doc *d, struct plait_error *err)
{
    if (d->failed || s->failed) {
        ky_free(d);
        return error_set(err, "building a manifest: out of memory");
    }
    /* yaml_emitter_dump deletes the document, whether it succeeds or not */
    if (!yaml_emitter_dump(&s->emitter, &d->doc)) return emitter_failed(s, err, "writing");
    return 0;
}

int ky_stream_close(struct ky_stream *s, struct plait_error *err)
{
    if (!yaml_emitter_close(&s->emitter) || !yaml_emitter_flush(&s->emitter))
        return emitter_failed(s, err, "closing the stream");
    if (!s->text && !write_out(s, (unsigned char *)"", 0))
        return error_set(err, "YAML emitter: out of memory");
    return 0;
}

void ky_stream_free(struct ky_stream *s)
{
    if (s->open) yaml_emitter_delete(&s->emitter);
    free(s->text);
    memset(s, 0, sizeof *s);
}
