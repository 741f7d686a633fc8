/* data_source.c — reading data prepare's inputs as chunks of documents (data_source.h):
 * globs, stdin, plain text cut at line starts, JSONL lines' fields. */
#include "launcher/data_source.h"

#include <glob.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

static int add_path(struct data_source *s, const char *p, struct plait_error *err)
{
    char **more = realloc(s->paths, (size_t)(s->n_paths + 1) * sizeof *more);
    if (!more) return error_set(err, "out of memory");
    s->paths = more;
    if (!(s->paths[s->n_paths] = strdup(p))) return error_set(err, "out of memory");
    s->n_paths++;
    return 0;
}

int data_source_open(struct data_source *s, char *const *names, int n, const char *field,
                     size_t chunk_bytes, struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    s->field = field;
    s->chunk_bytes = chunk_bytes;
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], "-") == 0 || !strpbrk(names[i], "*?[")) {
            if (add_path(s, names[i], err)) return -1;
            continue;
        }
        glob_t g;
        int rc = glob(names[i], GLOB_ERR, NULL, &g);
        if (rc != 0) {
            if (rc != GLOB_NOMATCH) globfree(&g);
            return error_set(err, "%s: %s", names[i],
                             rc == GLOB_NOMATCH ? "no file matches" : "cannot list");
        }
        for (size_t k = 0; k < g.gl_pathc && rc == 0; k++) rc = add_path(s, g.gl_pathv[k], err);
        globfree(&g);
        if (rc) return -1;
    }
    return 0;
}

void data_source_close(struct data_source *s)
{
    if (s->f && s->f != stdin) fclose(s->f);
    for (int i = 0; i < s->n_paths; i++) free(s->paths[i]);
    free(s->paths);
    free(s->carry);
    memset(s, 0, sizeof *s);
}

/* The next input opened into s->f: 1, 0 when there is none, -1 */
static int open_next(struct data_source *s, struct plait_error *err)
{
    if (s->next_path == s->n_paths) return 0;
    s->path = s->paths[s->next_path++];
    s->line = 0;
    s->in_document = false;
    if (strcmp(s->path, "-") == 0) {
        s->f = stdin;
        s->path = "stdin";
        return 1;
    }
    return (s->f = fs_fopen_regular(s->path, err)) ? 1 : -1;
}

static void close_current(struct data_source *s)
{
    if (s->f && s->f != stdin) fclose(s->f);
    s->f = NULL;
}

/* Where a chunk may end: before an ASCII letter that follows a newline that follows a
 * visible ASCII character ("x\nb"). No pre-tokenizer regex joins that newline with the
 * letter (GPT-2's, cl100k's, o200k's, Llama 3's: the letter starts a piece), and as it is
 * the only whitespace there, `\s+(?!\S)` takes it alone whether the text goes on or not;
 * so cutting there changes no token. 0: nowhere. */
static size_t last_cut(const char *t, size_t n)
{
    for (size_t i = n; i-- > 2;) {
        unsigned char c = (unsigned char)t[i] | 0x20, before = (unsigned char)t[i - 2];
        if (t[i - 1] == '\n' && c >= 'a' && c <= 'z' && before > ' ' && before < 0x7f) return i;
    }
    return 0;
}

/* Plain text: up to chunk_bytes more read after the carry, cut at the last cut point (the
 * rest carried to the next chunk); at the end of the file, all of it. */
static int next_text(struct data_source *s, struct data_chunk *out, struct plait_error *err)
{
    size_t cap = s->carry_bytes + s->chunk_bytes + 1, n = s->carry_bytes;
    char *buf = realloc(s->carry, cap);
    if (!buf) return error_set(err, "out of memory");
    s->carry = NULL;
    s->carry_bytes = 0;
    size_t got = fread(buf + n, 1, s->chunk_bytes, s->f);
    n += got;
    s->bytes_read += got;
    if (ferror(s->f)) {
        free(buf);
        return error_errno(err, "reading %s", s->path);
    }
    bool end = got < s->chunk_bytes;
    if (end && n == 0 && !s->in_document) { /* an empty file is no document */
        free(buf);
        close_current(s);
        return 0;
    }
    size_t cut = end ? n : last_cut(buf, n);
    if (!end && cut == 0) { /* no place to cut: the next chunk carries all of it */
        s->carry = buf;
        s->carry_bytes = n;
        return next_text(s, out, err);
    }
    if (cut < n && !(s->carry = malloc(n - cut))) {
        free(buf);
        return error_set(err, "out of memory");
    }
    if (cut < n) memcpy(s->carry, buf + cut, n - cut);
    s->carry_bytes = n - cut;
    *out = (struct data_chunk){.text = buf, .bytes = cut, .starts_document = !s->in_document};
    s->in_document = true;
    if (end) close_current(s);
    return 1;
}

/* JSONL: the next line's field; blank lines are skipped. 1, 0 at the end of the file, -1 */
static int next_json(struct data_source *s, struct data_chunk *out, struct plait_error *err)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, s->f)) >= 0) {
        s->line++;
        s->bytes_read += (uint64_t)n;
        if (strspn(line, " \t\r\n") == (size_t)n) continue;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)n, JSON_REJECT_DUPLICATES, &je);
        json_t *v = json_is_object(o) ? json_object_get(o, s->field) : NULL;
        int rc = 1;
        if (!o)
            rc = error_set(err, "%s:%zu: not JSON: %s", s->path, s->line, je.text);
        else if (!json_is_string(v))
            rc = error_set(err, "%s:%zu: %s: %s", s->path, s->line, s->field,
                           v ? "not a string" : "missing (--field names the text's member)");
        else if (!(out->text = malloc(json_string_length(v) + 1)))
            rc = error_set(err, "out of memory");
        else {
            out->bytes = json_string_length(v);
            memcpy(out->text, json_string_value(v), out->bytes + 1);
            out->starts_document = true;
        }
        json_decref(o);
        free(line);
        return rc;
    }
    free(line);
    if (ferror(s->f)) return error_errno(err, "reading %s", s->path);
    close_current(s);
    return 0;
}

int data_source_next(struct data_source *s, struct data_chunk *out, struct plait_error *err)
{
    for (;;) {
        if (!s->f) {
            int rc = open_next(s, err);
            if (rc <= 0) return rc;
        }
        int rc = s->field ? next_json(s, out, err) : next_text(s, out, err);
        if (rc != 0) return rc;
    }
}
