/* cmd_plot.c — `plait plot RUN_DIR [RUN_DIR ...] [-o FILE.png|.svg|.pdf] [--smooth W]
 * [--log]`: four panels drawn with cairo from the runs' metrics.jsonl — loss against
 * steps (validation dashed with dots, the training loss smoothed on request), loss against
 * tokens, the learning rate, and throughput — with several runs overlaid, one colour each,
 * and where a run resumed marked. Built where cairo is (libcairo2-dev); elsewhere the
 * command says what to install. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"
#include "common/formats/metrics.h"
#include "launcher/commands.h"

#ifdef PLAIT_HAVE_CAIRO
#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <fontconfig/fontconfig.h>
#endif

enum { OPT_O, OPT_OUT, OPT_SMOOTH, OPT_LOG };
const struct cli_command cmd_plot_cli = {
    .name = "plot",
    .operands = "RUN_DIR...",
    .min_operands = 1,
    .max_operands = 1 << 20,
    .summary = "plot loss, learning rate and throughput",
    .description = "Training and validation loss against steps and tokens, the learning rate\n"
                   "and throughput, from each run's metrics.jsonl; several runs are overlaid.",
    .options =
        (const struct cli_option[]){
            [OPT_O] = {"-o", "FILE",
                       "the picture, its kind by extension: .png, .svg or .pdf\n"
                       "(default loss.png)"},
            [OPT_OUT] = {"--out", "FILE", "the same as -o"},
            [OPT_SMOOTH] = {"--smooth", "W",
                            "the training loss as the mean of its last W steps (the\n"
                            "steps' own loss kept faint behind it)"},
            [OPT_LOG] = {"--log", NULL, "the loss on a logarithmic scale"},
            {0}},
};

/* What the command line asks of the loss panels. */
struct plot_options {
    int smooth; /* the training loss's mean over this many steps; ≤ 1: as it is */
    bool log_y; /* the loss's scale logarithmic */
};

#ifdef PLAIT_HAVE_CAIRO

enum { WIDTH = 1200, HEIGHT = 800 };

struct run {
    const char *dir;
    struct metrics_series s;
};


/* one panel: what x and y are for each run */
enum axis { X_STEP, X_TOKENS };
enum value { V_LOSS, V_LR, V_TOKENS_PER_S };

struct panel {
    const char *title, *x_label;
    enum axis x;
    enum value y;
    bool with_val; /* the validation loss too, dashed */
};

static const double VAL_DASH[] = {6, 4};    /* the validation loss's line */
static const double RESUME_DASH[] = {2, 3}; /* where a run resumed */
enum { RAW_ALPHA_PERCENT = 25 };            /* the loss behind its smoothed line */

static const double colours[][3] = {{0.12, 0.47, 0.71}, {0.84, 0.15, 0.16}, {0.17, 0.63, 0.17},
                                    {1.00, 0.50, 0.05}, {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29},
                                    {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}};
enum { N_COLOURS = sizeof colours / sizeof *colours };

static double x_of(const struct step_metrics *st, enum axis x)
{
    return x == X_STEP ? st->step : (double)st->tokens_total;
}

static double y_of(const struct step_metrics *st, enum value y)
{
    return y == V_LOSS ? st->loss : y == V_LR ? st->lr : st->tokens_per_s;
}

/* a round step between ticks giving about n ticks over span */
static double tick_step(double span, int n)
{
    double raw = span / n, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return mag * (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10);
}

enum { MAX_TICKS = 64 };

/* The ticks at multiples of step within [lo, hi]: the first multiple's index
 * and how many (at most MAX_TICKS). The ticks are then (first + i)·step: a
 * loop over an integer count, which ends whatever the data (`x += step` stops
 * moving x once step is below x's last bit). */
static int ticks(double lo, double hi, double step, double *first)
{
    if (!(step > 0) || !isfinite(lo) || !isfinite(hi) || !isfinite(step)) return 0;
    double a = ceil(lo / step), b = floor((hi + step * 1e-9) / step);
    *first = a;
    if (!(b >= a)) return 0;
    return b - a >= MAX_TICKS ? MAX_TICKS : (int)(b - a) + 1;
}

static void tick_label(char *buf, size_t n, double v, double step)
{
    double a = fabs(v);
    if (a >= 1e9)
        snprintf(buf, n, "%gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(buf, n, "%gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, n, "%gk", v / 1e3);
    else if (step < 1e-2 && v != 0)
        snprintf(buf, n, "%.1e", v);
    else
        snprintf(buf, n, "%g", v);
}

/* A panel's frame on the page and the data's ranges it shows. */
struct frame {
    double left, right, top, bottom;
    double x0, x1, y0, y1; /* y0, y1: log10 of the values on a log scale */
    bool log_y;
};

/* A value as the frame's y axis measures it; NAN where it cannot be shown. */
static double frame_value(const struct frame *f, double y)
{
    if (!f->log_y) return y;
    return y > 0 ? log10(y) : NAN;
}

static double frame_x(const struct frame *f, double x)
{
    return f->left + (x - f->x0) / (f->x1 - f->x0) * (f->right - f->left);
}

static double frame_y(const struct frame *f, double y)
{
    return f->bottom - (frame_value(f, y) - f->y0) / (f->y1 - f->y0) * (f->bottom - f->top);
}

/* The range of the runs' values in the panel (empty: x1 < x0). */
static void data_range(const struct panel *p, const struct run *runs, int n_runs, struct frame *f)
{
    f->x0 = INFINITY, f->x1 = -INFINITY, f->y0 = INFINITY, f->y1 = -INFINITY;
    for (int r = 0; r < n_runs; r++) {
        const struct metrics_series *s = &runs[r].s;
        for (int i = 0; i < s->n_steps; i++) {
            double x = x_of(&s->steps[i], p->x), y = frame_value(f, y_of(&s->steps[i], p->y));
            if (!isfinite(y)) continue;
            f->x0 = fmin(f->x0, x), f->x1 = fmax(f->x1, x), f->y0 = fmin(f->y0, y),
            f->y1 = fmax(f->y1, y);
        }
        for (int i = 0; p->with_val && i < s->n_evals; i++) {
            double y = frame_value(f, s->evals[i].val_loss);
            if (isfinite(y)) f->y0 = fmin(f->y0, y), f->y1 = fmax(f->y1, y);
        }
    }
}

/* the frame, the title and the x axis' label */
static void draw_frame(cairo_t *cr, const struct panel *p, const struct frame *f, double py)
{
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 15);
    cairo_move_to(cr, f->left, py + 25);
    cairo_show_text(cr, p->title);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, p->x_label, &ext);
    cairo_move_to(cr, (f->left + f->right) / 2 - ext.width / 2, f->bottom + 38);
    cairo_show_text(cr, p->x_label);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, f->left, f->top, f->right - f->left, f->bottom - f->top);
    cairo_stroke(cr);
}

/* the grid lines and their labels */
static void draw_grid(cairo_t *cr, const struct frame *f)
{
    char label[32];
    cairo_text_extents_t ext;
    double xs = tick_step(f->x1 - f->x0, 6), ys = tick_step(f->y1 - f->y0, 5);
    double first;
    for (int i = 0, n = ticks(f->x0, f->x1, xs, &first); i < n; i++) {
        double x = (first + i) * xs;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, frame_x(f, x), f->top), cairo_line_to(cr, frame_x(f, x), f->bottom),
            cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        tick_label(label, sizeof label, x, xs);
        cairo_text_extents(cr, label, &ext);
        cairo_move_to(cr, frame_x(f, x) - ext.width / 2, f->bottom + 16),
            cairo_show_text(cr, label);
    }
    for (int i = 0, n = ticks(f->y0, f->y1, ys, &first); i < n; i++) {
        double y = (first + i) * ys;
        double at = f->bottom - (y - f->y0) / (f->y1 - f->y0) * (f->bottom - f->top);
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, f->left, at), cairo_line_to(cr, f->right, at), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        if (f->log_y) /* the value at the tick, in three digits */
            snprintf(label, sizeof label, "%.3g", pow(10, y));
        else
            tick_label(label, sizeof label, y, ys);
        cairo_text_extents(cr, label, &ext);
        cairo_move_to(cr, f->left - ext.width - 6, at + ext.height / 2), cairo_show_text(cr, label);
    }
}

/* The value drawn for step i: its own, or the mean of the finite ones among its last
 * `window` steps (window > 1); NAN where there is none. */
static double shown_value(const struct panel *p, const struct metrics_series *s, int i, int window)
{
    if (window <= 1) return y_of(&s->steps[i], p->y);
    double sum = 0;
    int n = 0;
    for (int k = i; k >= 0 && k > i - window; k--) {
        double y = y_of(&s->steps[k], p->y);
        if (isfinite(y)) sum += y, n++;
    }
    return n ? sum / n : NAN;
}

/* one run's curve (window: shown_value's), broken where a value cannot be shown */
static void draw_curve(cairo_t *cr, const struct panel *p, const struct metrics_series *s,
                       const struct frame *f, int window)
{
    bool pen = false;
    for (int i = 0; i < s->n_steps; i++) {
        double y = shown_value(p, s, i, window);
        if (!isfinite(frame_value(f, y))) {
            pen = false;
            continue;
        }
        double x = x_of(&s->steps[i], p->x);
        if (pen)
            cairo_line_to(cr, frame_x(f, x), frame_y(f, y));
        else
            cairo_move_to(cr, frame_x(f, x), frame_y(f, y));
        pen = true;
    }
    cairo_stroke(cr);
}

/* the validation loss: dashed, a dot at each evaluation */
static void draw_val(cairo_t *cr, const struct panel *p, const struct metrics_series *s,
                     const struct frame *f)
{
    int n = 0;
    cairo_set_dash(cr, VAL_DASH, 2, 0);
    for (int i = 0; i < s->n_evals; i++) {
        double x = p->x == X_STEP ? s->evals[i].step : (double)s->evals[i].tokens_total;
        double y = s->evals[i].val_loss;
        if (!isfinite(frame_value(f, y))) continue;
        if (n++)
            cairo_line_to(cr, frame_x(f, x), frame_y(f, y));
        else
            cairo_move_to(cr, frame_x(f, x), frame_y(f, y));
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    for (int i = 0; i < s->n_evals; i++) {
        double x = p->x == X_STEP ? s->evals[i].step : (double)s->evals[i].tokens_total;
        if (!isfinite(frame_value(f, s->evals[i].val_loss))) continue;
        cairo_arc(cr, frame_x(f, x), frame_y(f, s->evals[i].val_loss), 3, 0, 2 * M_PI);
        cairo_fill(cr);
    }
}

/* a dotted vertical line before each step a resumed run began with */
static void draw_resumes(cairo_t *cr, const struct panel *p, const struct metrics_series *s,
                         const struct frame *f)
{
    cairo_save(cr);
    cairo_set_line_width(cr, 1);
    cairo_set_dash(cr, RESUME_DASH, 2, 0);
    for (int i = 0; i < s->n_steps; i++) {
        if (!s->steps[i].resumed) continue;
        double x = frame_x(f, i ? x_of(&s->steps[i - 1], p->x) : x_of(&s->steps[i], p->x));
        cairo_move_to(cr, x, f->top), cairo_line_to(cr, x, f->bottom), cairo_stroke(cr);
    }
    cairo_restore(cr);
}

/* one run in its colour c: its curve (the loss smoothed as asked, its own values faint
 * behind), its validation loss, where it resumed */
static void draw_run(cairo_t *cr, const struct panel *p, const struct metrics_series *s,
                     const struct frame *f, const struct plot_options *o, const double c[3])
{
    bool smoothed = p->y == V_LOSS && o->smooth > 1;
    if (smoothed) {
        cairo_set_source_rgba(cr, c[0], c[1], c[2], RAW_ALPHA_PERCENT / 100.0);
        draw_curve(cr, p, s, f, 1);
    }
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    draw_curve(cr, p, s, f, smoothed ? o->smooth : 1);
    if (p->with_val) draw_val(cr, p, s, f);
    draw_resumes(cr, p, s, f);
}

static void draw_panel(cairo_t *cr, const struct panel *p, const struct run *runs, int n_runs,
                       const struct plot_options *o, double px, double py, double pw, double ph)
{
    struct frame f = {.left = px + 70,
                      .right = px + pw - 20,
                      .top = py + 40,
                      .bottom = py + ph - 50,
                      .log_y = o->log_y && p->y == V_LOSS};
    data_range(p, runs, n_runs, &f);
    draw_frame(cr, p, &f, py);
    if (!(f.x1 >= f.x0 && f.y1 >= f.y0)) {
        cairo_move_to(cr, f.left + 10, f.top + 20);
        cairo_show_text(cr, "no steps yet");
        return;
    }
    if (f.x1 == f.x0) f.x1 = f.x0 + 1;
    if (f.y1 == f.y0) f.y0 -= fabs(f.y0) * 0.05 + 1e-12, f.y1 += fabs(f.y1) * 0.05 + 1e-12;
    double pad = (f.y1 - f.y0) * 0.05;
    f.y0 -= pad, f.y1 += pad;
    if (p->y != V_LOSS && !f.log_y && f.y0 < 0) f.y0 = 0;
    draw_grid(cr, &f);
    /* the curves, clipped to the frame */
    cairo_save(cr);
    cairo_rectangle(cr, f.left, f.top, f.right - f.left, f.bottom - f.top);
    cairo_clip(cr);
    cairo_set_line_width(cr, 1.6);
    for (int r = 0; r < n_runs; r++) draw_run(cr, p, &runs[r].s, &f, o, colours[r % N_COLOURS]);
    cairo_restore(cr);
}

/* a legend entry at (*x, y): its sample (drawn by the caller at *x, y), its text; *x moves on */
static void legend_text(cairo_t *cr, double *x, double y, const char *text)
{
    cairo_text_extents_t ext;
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, *x + 24, y);
    cairo_show_text(cr, text);
    cairo_text_extents(cr, text, &ext);
    *x += 24 + ext.x_advance + 30;
}

/* a line sample 18 wide at (x, y - 5): dashed if dash, a dot at its middle if dot */
static void legend_line(cairo_t *cr, double x, double y, const double *dash, bool dot, double alpha)
{
    cairo_save(cr);
    cairo_set_source_rgba(cr, 0.3, 0.3, 0.3, alpha);
    cairo_set_line_width(cr, 1.6);
    if (dash) cairo_set_dash(cr, dash, 2, 0);
    cairo_move_to(cr, x, y - 5), cairo_line_to(cr, x + 18, y - 5), cairo_stroke(cr);
    if (dot) cairo_arc(cr, x + 9, y - 5, 3, 0, 2 * M_PI), cairo_fill(cr);
    cairo_restore(cr);
}

/* the legend: each run's colour and directory; then what each kind of line is */
static void draw_legend(cairo_t *cr, const struct run *runs, int n_runs,
                        const struct plot_options *o)
{
    cairo_set_font_size(cr, 12);
    double x = 80, y = HEIGHT - 14;
    bool resumed = false;
    for (int r = 0; r < n_runs; r++) {
        const double *c = colours[r % N_COLOURS];
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_rectangle(cr, x, y - 9, 18, 4);
        cairo_fill(cr);
        legend_text(cr, &x, y, runs[r].dir);
        for (int i = 0; i < runs[r].s.n_steps; i++) resumed |= runs[r].s.steps[i].resumed;
    }
    char smoothed[64];
    snprintf(smoothed, sizeof smoothed, "training loss, mean of %d steps", o->smooth);
    legend_line(cr, x, y, NULL, false, 1);
    legend_text(cr, &x, y, o->smooth > 1 ? smoothed : "training loss");
    if (o->smooth > 1) {
        legend_line(cr, x, y, NULL, false, RAW_ALPHA_PERCENT / 100.0);
        legend_text(cr, &x, y, "each step's");
    }
    legend_line(cr, x, y, VAL_DASH, true, 1);
    legend_text(cr, &x, y, "validation loss");
    if (resumed) {
        cairo_save(cr);
        cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
        cairo_set_line_width(cr, 1);
        cairo_set_dash(cr, RESUME_DASH, 2, 0);
        cairo_move_to(cr, x + 9, y - 12), cairo_line_to(cr, x + 9, y + 2), cairo_stroke(cr);
        cairo_restore(cr);
        legend_text(cr, &x, y, "resumed");
    }
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcasecmp(s + n - k, tail);
}

static int plot(const struct run *runs, int n_runs, const struct plot_options *o, const char *out)
{
    cairo_surface_t *surface = ends_with(out, ".svg") ? cairo_svg_surface_create(out, WIDTH, HEIGHT)
                               : ends_with(out, ".pdf")
                                   ? cairo_pdf_surface_create(out, WIDTH, HEIGHT)
                                   : cairo_image_surface_create(CAIRO_FORMAT_RGB24, WIDTH, HEIGHT);
    if (cairo_surface_status(surface) != CAIRO_STATUS_SUCCESS) {
        log_error("plot: %s: %s", out, cairo_status_to_string(cairo_surface_status(surface)));
        cairo_surface_destroy(surface);
        return PLAIT_EXIT_ERROR;
    }
    cairo_t *cr = cairo_create(surface);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    static const struct panel panels[4] = {
        {"loss", "step", X_STEP, V_LOSS, true},
        {"loss against tokens", "tokens", X_TOKENS, V_LOSS, true},
        {"learning rate", "step", X_STEP, V_LR, false},
        {"throughput (tokens/s)", "step", X_STEP, V_TOKENS_PER_S, false},
    };
    double pw = WIDTH / 2.0, ph = (HEIGHT - 30) / 2.0;
    for (int i = 0; i < 4; i++)
        draw_panel(cr, &panels[i], runs, n_runs, o, (i % 2) * pw, (i / 2) * ph, pw, ph);
    draw_legend(cr, runs, n_runs, o);
    cairo_destroy(cr);
    cairo_status_t st = CAIRO_STATUS_SUCCESS;
    if (cairo_surface_get_type(surface) == CAIRO_SURFACE_TYPE_IMAGE)
        st = cairo_surface_write_to_png(surface, out);
    cairo_surface_finish(surface);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(surface);
    cairo_surface_destroy(surface);
    if (st != CAIRO_STATUS_SUCCESS) {
        log_error("plot: writing %s: %s", out, cairo_status_to_string(st));
        return PLAIT_EXIT_ERROR;
    }
    printf("%s\n", out);
    return PLAIT_EXIT_OK;
}

#endif /* PLAIT_HAVE_CAIRO */

/* --smooth W: a whole number of steps ≥ 1; -1 (said) otherwise */
static int parse_window(const char *v, int *window)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < 1 || n > 1000000) {
        log_error("plot: --smooth %s: must be a number of steps from 1 to 1000000", v);
        return -1;
    }
    *window = (int)n;
    return 0;
}

int cmd_plot(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_plot_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    const char *out = "loss.png";
    int n_dirs = a.n_operands;
    struct plot_options o = {0};
    for (int k = 0; k < a.n; k++) {
        if (a.v[k].opt == OPT_O || a.v[k].opt == OPT_OUT) out = a.v[k].value;
        if (a.v[k].opt == OPT_LOG) o.log_y = true;
        if (a.v[k].opt == OPT_SMOOTH && parse_window(a.v[k].value, &o.smooth)) {
            cli_args_free(&a);
            return PLAIT_EXIT_USAGE;
        }
    }
#ifdef PLAIT_HAVE_CAIRO
    struct run *runs = calloc((size_t)n_dirs, sizeof *runs);
    int n = 0, rc = PLAIT_EXIT_ERROR;
    if (!runs) {
        cli_args_free(&a);
        return PLAIT_EXIT_ERROR;
    }
    for (int k = 0; k < a.n; k++) {
        if (a.v[k].opt != -1) continue;
        const char *dir = a.v[k].value;
        struct plait_error err;
        runs[n].dir = dir;
        if (metrics_read(dir, &runs[n].s, &err)) {
            log_error("plot: %s", err.text);
            goto out;
        }
        if (runs[n].s.n_steps == 0) log_warn("plot: %s has no steps in metrics.jsonl", dir);
        n++;
    }
    rc = plot(runs, n, &o, out);
    cairo_debug_reset_static_data(); /* the fonts' caches, so that a leak check sees ours alone */
    FcFini();
out:
    for (int i = 0; i < n; i++) metrics_series_free(&runs[i].s);
    free(runs);
    cli_args_free(&a);
    return rc;
#else
    (void)out;
    (void)n_dirs;
    (void)o;
    cli_args_free(&a);
    log_error("plot: this plait was built without cairo: install libcairo2-dev (apt-get install "
              "libcairo2-dev, or scripts/deps.sh build) and rebuild with make");
    return PLAIT_EXIT_ERROR;
#endif
}
