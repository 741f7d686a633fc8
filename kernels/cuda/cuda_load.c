/* cuda_load.c — the CUDA backend's entry points in builds that have it: the
 * backend itself is lib/plait/libplait_cuda.so, loaded here on first use, so
 * that a CPU rank never maps cuBLASLt (cuda_ops.h says why). A machine without
 * an NVIDIA driver answers "no device" without loading anything. The kernels
 * are the other files of kernels/cuda; the stand-in for builds without them is
 * cuda_none.c. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cuda_ops.h"

#define LIB_NAME "libplait_cuda.so"
#define ENV_LIB "PLAIT_CUDA_LIB" /* another path to it (tests, unusual installs) */

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const struct ops_cuda_entry *entry;
static char load_why[PATH_MAX + 512];

/* <dir of this executable>/../lib/plait/libplait_cuda.so: bin/ and lib/ side
 * by side, in the build tree as where plait is installed */
static int lib_path(char *out, size_t bytes)
{
    const char *env = getenv(ENV_LIB);
    if (env && *env) return snprintf(out, bytes, "%s", env) < (int)bytes ? 0 : -1;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = '\0';
    return snprintf(out, bytes, "%s/../lib/plait/" LIB_NAME, exe) < (int)bytes ? 0 : -1;
}

static void load(void)
{
    char path[PATH_MAX];
    if (lib_path(path, sizeof path)) {
        snprintf(load_why, sizeof load_why, "cannot tell where " LIB_NAME " is (set " ENV_LIB ")");
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_why, sizeof load_why, "the CUDA backend did not load: %s", dlerror());
        return;
    }
    const struct ops_cuda_entry *e = dlsym(h, OPS_CUDA_ENTRY_SYMBOL);
    if (!e || e->version != OPS_CUDA_ENTRY_VERSION || e->ops_bytes != sizeof(struct ops)) {
        snprintf(load_why, sizeof load_why,
                 "%s is not this plait's CUDA backend (%s); reinstall plait", path,
                 e ? "another version" : "no " OPS_CUDA_ENTRY_SYMBOL);
        dlclose(h);
        return;
    }
    entry = e; /* kept loaded until exit */
}

/* Whether a GPU could be here at all: the NVIDIA driver's device nodes (or
 * WSL's), unless the backend is named explicitly. */
static int driver_present(void)
{
    const char *env = getenv(ENV_LIB);
    return (env && *env) || access("/dev/nvidiactl", F_OK) == 0 ||
           access("/dev/nvidia0", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;
}

int ops_cuda_built(void)
{
    return 1;
}

int ops_cuda_device_count(char *why, size_t why_bytes)
{
    if (!driver_present()) {
        if (why && why_bytes)
            snprintf(why, why_bytes,
                     "no CUDA device here (no NVIDIA driver: /dev/nvidiactl is missing)");
        return 0;
    }
    pthread_once(&load_once, load);
    if (!entry) {
        if (why && why_bytes) snprintf(why, why_bytes, "no CUDA device usable: %s", load_why);
        return 0;
    }
    return entry->device_count(why, why_bytes);
}

const struct ops *ops_cuda(char *errbuf, size_t errbuf_bytes)
{
    if (ops_cuda_device_count(errbuf, errbuf_bytes) == 0) return NULL;
    return entry->table(errbuf, errbuf_bytes);
}

/* called only in a context of the table, so the backend is loaded */
void ops_cuda_attention_fused_forward(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                      int B, int T, int C, int NH)
{
    entry->attention_fused_forward(ctx, out, lse, qkv, B, T, C, NH);
}

void ops_cuda_attention_fused_backward(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                       const float *qkv, const float *out, const float *lse, int B,
                                       int T, int C, int NH)
{
    entry->attention_fused_backward(ctx, dqkv, dout, qkv, out, lse, B, T, C, NH);
}
