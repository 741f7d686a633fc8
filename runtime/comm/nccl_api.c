/* nccl_api.c — loads libnccl and libcudart for the nccl backend (nccl_api.h). */
#include "runtime/comm/nccl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define STR(x) #x
#define XSTR(x) STR(x)
#define NCCL_LIB "libnccl.so." XSTR(NCCL_MAJOR)
/* CUDART_VERSION is major·1000 + minor·10: 13000 is CUDA 13.0 */
#define CUDART_MAJOR (CUDART_VERSION / 1000)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct nccl_api table;
static bool loaded;
static char why[512];

/* every name of the list from h, or false with why naming the first missing */
static bool resolve(void *h, const char *lib, const char *const *names, void **slots, int n)
{
    for (int i = 0; i < n; i++) {
        slots[i] = dlsym(h, names[i]);
        if (!slots[i]) {
            snprintf(why, sizeof why, "%s has no %s (a version older than the %s plait was "
                                      "built with?)",
                     lib, names[i], lib);
            return false;
        }
    }
    return true;
}

#define NAME(f) #f,
#define SLOT(f) (void **)&table.f,

static void load(void)
{
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_MAJOR);
    void *nccl = dlopen(NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
    void *cuda = nccl ? dlopen(cudart, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!nccl || !cuda) {
        snprintf(why, sizeof why,
                 "the nccl backend needs %s and %s (NCCL and the CUDA runtime) where a GPU "
                 "rank runs: %s",
                 NCCL_LIB, cudart, dlerror());
        return;
    }
    static const char *const nccl_names[] = {NCCL_API_FUNCTIONS(NAME)};
    static const char *const cuda_names[] = {CUDA_API_FUNCTIONS(NAME)};
    void **nccl_slots[] = {NCCL_API_FUNCTIONS(SLOT)}, **cuda_slots[] = {CUDA_API_FUNCTIONS(SLOT)};
    enum { N_NCCL = sizeof nccl_names / sizeof *nccl_names };
    enum { N_CUDA = sizeof cuda_names / sizeof *cuda_names };
    void *got_nccl[N_NCCL], *got_cuda[N_CUDA];
    if (!resolve(nccl, NCCL_LIB, nccl_names, got_nccl, N_NCCL) ||
        !resolve(cuda, cudart, cuda_names, got_cuda, N_CUDA))
        return; /* both stay loaded: another part of the process may use them */
    for (int i = 0; i < N_NCCL; i++) *nccl_slots[i] = got_nccl[i];
    for (int i = 0; i < N_CUDA; i++) *cuda_slots[i] = got_cuda[i];
    loaded = true;
}

const struct nccl_api *nccl_api(struct plait_error *err)
{
    pthread_once(&once, load);
    if (!loaded) {
        error_set(err, "%s", why);
        return NULL;
    }
    return &table;
}
