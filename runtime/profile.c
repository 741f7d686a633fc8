/* profile.c — printing the per-phase time table (profile.h). */
#include "runtime/profile.h"

static const char *const names[PROF_PHASES] = {
    "embedding fwd", "layernorm fwd", "matmul fwd",     "attention fwd", "gelu fwd",
    "residual fwd",  "lm head fwd",   "softmax + loss", "lm head bwd",   "matmul bwd",
    "attention bwd", "gelu bwd",      "layernorm bwd",  "embedding bwd", "recompute",
    "grad norm",     "adamw",         "data",
};

void profile_print(const struct profile *p, double step_s, FILE *out)
{
    if (p->steps <= 0) return;
    double total = 0;
    fprintf(out, "profile over %d step%s (ms per step):\n", p->steps, p->steps == 1 ? "" : "s");
    for (int i = 0; i < PROF_PHASES; i++) {
        double ms = 1e3 * p->seconds[i] / p->steps;
        total += ms;
        if (ms > 0)
            fprintf(out, "  %-16s %9.2f  %5.1f%%\n", names[i], ms, 100 * ms / (1e3 * step_s));
    }
    double other = 1e3 * step_s - total;
    fprintf(out, "  %-16s %9.2f  %5.1f%%\n", "other", other, 100 * other / (1e3 * step_s));
    fprintf(out, "  %-16s %9.2f\n", "step", 1e3 * step_s);
}
