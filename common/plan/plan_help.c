/* plan_help.c — the schema as text for `plait help plan`: a line a field, its path, type and
 * range or names, default, whether it is required and whether it may change on resume, and
 * what it means where those do not say it. The schema is plan_schema.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/plan/plan_schema.h"

/* ---- the schema, as text ----------------------------------------------------------------- */

/* one field's line: path, type, what it may be, its default */
/* What a field means, where its type and default do not say it (plait help plan). */
static const struct {
    const char *path, *text;
} field_help[] = {
    {"model.moe.experts", "a mixture of experts' routed experts (model.moe absent: dense)"},
    {"model.moe.top_k", "the experts a token goes to (its router's k largest probabilities)"},
    {"model.moe.every", "an MoE block replaces the MLP in layers i with i % every = every - 1"},
    {"model.moe.shared_experts", "dense experts every token also passes through (gate 1)"},
    {"model.moe.capacity_factor",
     "0: no dropping; else an expert takes at most ceil(factor·k·N/E) of a micro-batch's N "
     "tokens, in token order"},
    {"model.moe.aux_loss", "the load-balancing loss's coefficient"},
    {"model.moe.router_z_loss", "the router z-loss's coefficient"},
    {"model.moe.ffn_hidden", "each expert's MLP width"},
    {"parallel.ep",
     "expert parallelism: each MoE layer's experts spread over ep ranks (E/ep a rank); an ep "
     "group is ep consecutive data-parallel ranks, cp folded in (a dp rank's cp ranks "
     "consecutive: ep_rank = (dp_rank·cp + cp_rank) % ep); divides model.moe.experts and "
     "parallel.dp × parallel.cp"},
};

static const char *help_of(const char *path)
{
    for (size_t i = 0; i < sizeof field_help / sizeof *field_help; i++)
        if (!strcmp(field_help[i].path, path)) return field_help[i].text;
    return NULL;
}

/* in: the optional section the field is in (its required fields are required there), or
 * NULL */
static void print_field(FILE *out, const struct field *f, const char *path, const char *in)
{
    char what[256] = "", def[96] = "";
    switch (f->kind) {
    case K_INT:
    case K_U64:
        snprintf(what, sizeof what, "int %lld..%lld%s", f->imin, f->imax,
                 f->flags & AUTO_OK ? " or \"auto\"" : "");
        if (!(f->flags & (REQ | REQ_NO_INIT)))
            snprintf(def, sizeof def, "%s", "(from other fields)");
        if (!(f->flags & (REQ | REQ_NO_INIT)) && f->idef >= f->imin)
            snprintf(def, sizeof def, "%lld", f->idef);
        if ((f->flags & AUTO_OK) && f->idef == PLAN_AUTO) snprintf(def, sizeof def, "\"auto\"");
        break;
    case K_REAL:
        if (isinf(f->rmax))
            snprintf(what, sizeof what, "real %s %g", f->rmin_open ? ">" : ">=", f->rmin);
        else
            snprintf(what, sizeof what, "real in %s%g, %g%s", f->rmin_open ? "(" : "[", f->rmin,
                     f->rmax, f->rmax_open ? ")" : "]");
        snprintf(def, sizeof def, "%g", f->rdef);
        break;
    case K_BOOL:
        snprintf(what, sizeof what, "true or false");
        snprintf(def, sizeof def, "%s", f->idef ? "true" : "false");
        break;
    case K_ENUM:
    case K_STRING:
        if (f->names) {
            char names[256];
            plan_one_of(names, sizeof names, f->names); /* "must be one of ..." */
            snprintf(what, sizeof what, "%s", strncmp(names, "must be ", 8) ? names : names + 8);
        } else {
            snprintf(what, sizeof what, "string");
        }
        if (f->kind == K_ENUM && f->idef >= 0)
            snprintf(def, sizeof def, "\"%s\"", f->names[f->idef]);
        if (f->kind == K_STRING && f->sdef) {
            char *q = plan_quote(f->sdef); /* as JSON: "\n" stays two characters */
            snprintf(def, sizeof def, "%s", q ? q : "?");
            free(q);
        }
        break;
    case K_PATH:
        snprintf(what, sizeof what, "path");
        if (f->sdef) snprintf(def, sizeof def, "\"%s\"", f->sdef);
        break;
    case K_INTS:
        snprintf(what, sizeof what, "list of ints");
        break;
    case K_SECTION:
        return;
    }
    const char *help = help_of(path);
    fprintf(out, "  %-32s %s%s%s%s%s%s%s%s%s\n", path, what, *def ? "; default " : "", def,
            f->flags & (REQ | REQ_NO_INIT) ? "; required" : "",
            in && (f->flags & REQ) ? " in " : "", in && (f->flags & REQ) ? in : "",
            f->flags & MAY_CHANGE ? "; may change on resume" : "", help ? "; " : "",
            help ? help : "");
}

static void print_fields(FILE *out, const struct field *fields, const char *prefix, const char *in)
{
    for (const struct field *f = fields; f->name; f++) {
        char path[128];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", f->name);
        if (f->kind == K_SECTION)
            print_fields(out, f->fields, path, f->flags & OPTIONAL ? path : in);
        else
            print_field(out, f, path, in);
    }
}

void plan_fields_print(FILE *out)
{
    print_fields(out, plan_root_fields, "", NULL);
}
