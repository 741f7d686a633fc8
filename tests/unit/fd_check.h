/* fd_check.h — the unit tests' finite-difference checks of the CPU ops:
 * seeded random tensors, a backward against central differences of its
 * forward (in double: the same kernel source compiled for double), and a
 * float op against its double twin. Each check contracts the op's output
 * with a fixed random tensor R, so the scalar L = Σ out·R has gradient
 * "backward with dout = R". */
#ifndef PLAIT_TESTS_FD_CHECK_H
#define PLAIT_TESTS_FD_CHECK_H

#include <math.h>
#include <stdlib.h>

#include "check.h"

static unsigned long long rng_state = 42;

static inline double urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

static inline double *rnd(size_t n, double scale)
{
    double *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = scale * urand();
    return p;
}

static inline double *zeros(size_t n)
{
    return calloc(n, sizeof(double));
}

static inline float *to_f32(const double *x, size_t n)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}

static inline double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The forward of an op as a function of its inputs, contracted with R. */
typedef double (*scalar_fn)(void *ctx);

/* Compares grad (analytic) with central differences on every element of x
 * (or a strided subset for big tensors). An element's error is relative to
 * its size, floored at 1e-3 of the largest gradient so that elements near
 * zero are judged against the scale of the whole tensor. */
static inline void check_fd(const char *what, scalar_fn f, void *ctx, double *x, const double *grad,
                     size_t n, double tol)
{
    const double h = 1e-6;
    double worst = 0, floor = 0, worst_fd = 0;
    size_t worst_i = 0, step = n > 400 ? n / 200 : 1;
    for (size_t i = 0; i < n; i++) floor = fmax(floor, 1e-3 * fabs(grad[i]));
    for (size_t i = 0; i < n; i += step) {
        double saved = x[i];
        x[i] = saved + h;
        double up = f(ctx);
        x[i] = saved - h;
        double down = f(ctx);
        x[i] = saved;
        double fd = (up - down) / (2 * h);
        double err = fabs(fd - grad[i]) / fmax(floor + 1e-12, fabs(fd) + fabs(grad[i]));
        if (err > worst) {
            worst = err;
            worst_i = i;
            worst_fd = fd;
        }
    }
    CHECK(worst <= tol,
          "%s: relative error %.3g at element %zu (analytic %.9g, numeric %.9g; "
          "tolerance %.1g)",
          what, worst, worst_i, grad[worst_i], worst_fd, tol);
}

/* Float op output against the double op output, relative to the output's norm. */
static inline void check_close(const char *what, const float *f, const double *d, size_t n, double tol)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)f[i] - d[i]) * ((double)f[i] - d[i]);
        den += d[i] * d[i];
    }
    double rel = sqrt(num / fmax(den, 1e-300));
    CHECK(rel <= tol, "%s: float vs double relative error %.3g (tolerance %.1g)", what, rel, tol);
}

#define FD_TOL 1e-5 /* central differences with h = 1e-6 carry ~1e-9 absolute noise */
#define F32_TOL 2e-6

#endif
