/* k8s_yaml.h — building Kubernetes manifests as libyaml documents and writing
 * them with libyaml's emitter (never by pasting strings): a small builder over
 * yaml_document_t that quotes a string whenever YAML would read it as another
 * type ("64", "true", "null"), and a stream writer into memory, so that the
 * text can be linted (k8s_lint.h) before anything reaches stdout. */
#ifndef PLAIT_LAUNCHER_K8S_YAML_H
#define PLAIT_LAUNCHER_K8S_YAML_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "common/error.h"

/* One manifest under construction. Node ids are libyaml's (> 0); a failed
 * allocation sets failed, and every later call is a no-op returning 0. */
struct ky_doc {
    yaml_document_t doc;
    bool failed;
};

int ky_init(struct ky_doc *d); /* 0, or -1 out of memory; the root is a mapping: ky_root */
int ky_root(struct ky_doc *d);

int ky_map(struct ky_doc *d);                    /* a new block mapping */
int ky_flow_map(struct ky_doc *d);               /* {a: b} */
int ky_seq(struct ky_doc *d);                    /* a new block sequence */
int ky_flow_seq(struct ky_doc *d);               /* [a, b] */
int ky_str(struct ky_doc *d, const char *s);     /* quoted when YAML would read another type */
int ky_int(struct ky_doc *d, long long v);       /* a plain integer */
int ky_bool(struct ky_doc *d, bool v);           /* true / false */
int ky_literal(struct ky_doc *d, const char *s); /* a | block: a file's text */

/* map[key] = value (a node id); returns value. */
int ky_set(struct ky_doc *d, int map, const char *key, int value);
/* Shorthands: map[key] = a new string, integer, mapping, sequence. */
int ky_set_str(struct ky_doc *d, int map, const char *key, const char *value);
int ky_set_int(struct ky_doc *d, int map, const char *key, long long value);
int ky_set_bool(struct ky_doc *d, int map, const char *key, bool value);
int ky_set_map(struct ky_doc *d, int map, const char *key);
int ky_set_seq(struct ky_doc *d, int map, const char *key);
/* seq += value; returns value. */
int ky_push(struct ky_doc *d, int seq, int value);
/* apiVersion, kind, metadata {name, namespace (if given)}; returns metadata. */
int ky_object(struct ky_doc *d, const char *api_version, const char *kind, const char *name,
              const char *ns);

void ky_free(struct ky_doc *d);

/* A YAML stream being written into memory, document after document. */
struct ky_stream {
    yaml_emitter_t emitter;
    char *text; /* NUL-terminated */
    size_t len, cap;
    bool open, failed;
};

int ky_stream_open(struct ky_stream *s, struct plait_error *err);
/* Emits the document ("---" before it) and frees it, whether or not it worked. */
int ky_stream_add(struct ky_stream *s, struct ky_doc *d, struct plait_error *err);
/* Ends the stream; s->text holds it (free with ky_stream_free). */
int ky_stream_close(struct ky_stream *s, struct plait_error *err);
void ky_stream_free(struct ky_stream *s);

#endif
