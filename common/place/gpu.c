/* gpu.c — the table of GPU models behind gpu.h (datasheet figures), the
 * lookups by PCI id and by name, model FLOPs and MFU, and the few NVML calls
 * plait makes, through dlopen so that nothing links against the driver.
 * Which GPUs a node has, and in which order, is topo.c's. */
#include "common/place/gpu.h"

#include <ctype.h>
#include <stdbool.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NVIDIA_VENDOR 0x10de
#define GIB (1ull << 30)

/* NVIDIA datasheets, the dense figures (each datasheet also gives the
 * "with sparsity" figure, twice these; those are not used). Capacities as the
 * datasheet states them (HBM and GDDR come in binary sizes: "80GB" is 80 GiB;
 * NVML's total is a little less, which is why NVML's and hwloc's figures come
 * first). Names are nvmlDeviceGetName's; PCI ids those of pci.ids and the
 * driver's supported-GPU list. Entries that share words are ordered most
 * specific first ("H100 NVL" before "H100"), since a name finds the first
 * entry whose words it holds.
 *   H100 SXM5 / H200 SXM: H100 and H200 Tensor Core GPU datasheets: BF16 989.4,
 *     FP8 1,978.9, TF32 494.7 TFLOPS; HBM3 3.35 TB/s (H100), HBM3e 4.8 TB/s (H200)
 *   H100 PCIe: BF16 756.5, FP8 1,513, TF32 378; HBM2e 2.0 TB/s
 *   H100 NVL and H200 NVL (per GPU): BF16 835.5, FP8 1,670.5, TF32 417.5;
 *     94 GB at 3.9 TB/s, 141 GB at 4.8 TB/s
 *   H20: BF16 148, FP8 296, TF32 74; 96 GB HBM3 at 4.0 TB/s
 *   A100 (SXM4 and PCIe): BF16 312, TF32 156, no FP8; 40 GB HBM2 at 1,555 GB/s,
 *     80 GB HBM2e at 2,039 GB/s (SXM4) or 1,935 GB/s (PCIe)
 *   L40S: BF16 362.05, FP8 733, TF32 183; 48 GB GDDR6 at 864 GB/s
 *   L4: BF16 121, FP8 242.5, TF32 60; 24 GB GDDR6 at 300 GB/s
 *   A10: BF16 125, TF32 62.5, no FP8; 24 GB GDDR6 at 600 GB/s
 *   B200 (HGX B200, per GPU): BF16 2,250, FP8 4,500, TF32 1,100; 180 GB HBM3e at 8 TB/s
 * Known by name only (memory differs between boards that share the name):
 *   V100 (FP16 tensor cores 125, no BF16: its FP16 rate), RTX A6000 (BF16 154.8),
 *   A40 (BF16 149.7), T4 (FP16 65), GH200 (as H100 SXM). */
static const struct gpu_spec specs[] = {
    {0x2321, "NVIDIA H100 NVL", "H100 NVL", 94 * GIB, 835.5, 1670.5, 417.5, 3900},
    {0x2331, "NVIDIA H100 PCIe", "H100 PCIe", 80 * GIB, 756.5, 1513, 378, 2000},
    {0x2330, "NVIDIA H100 80GB HBM3", "H100", 80 * GIB, 989.4, 1978.9, 494.7, 3350},
    {0x233b, "NVIDIA H200 NVL", "H200 NVL", 141 * GIB, 835.5, 1670.5, 417.5, 4800},
    {0x2335, "NVIDIA H200", "H200", 141 * GIB, 989.4, 1978.9, 494.7, 4800},
    {0x2329, "NVIDIA H20", "H20", 96 * GIB, 148, 296, 74, 4000},
    {0x20b5, "NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 80 * GIB, 312, 0, 156, 1935},
    {0x20b1, "NVIDIA A100-PCIE-40GB", "A100 PCIe", 40 * GIB, 312, 0, 156, 1555},
    {0x20f1, "NVIDIA A100-PCIE-40GB", "A100 PCIe", 40 * GIB, 312, 0, 156, 1555},
    {0x20b2, "NVIDIA A100-SXM4-80GB", "A100 80GB", 80 * GIB, 312, 0, 156, 2039},
    {0x20b0, "NVIDIA A100-SXM4-40GB", "A100", 40 * GIB, 312, 0, 156, 1555},
    {0x26b9, "NVIDIA L40S", "L40S", 48 * GIB, 362.05, 733, 183, 864},
    {0x27b8, "NVIDIA L4", "L4", 24 * GIB, 121, 242.5, 60, 300},
    {0x2236, "NVIDIA A10", "A10", 24 * GIB, 125, 0, 62.5, 600},
    {0x2901, "NVIDIA B200", "B200", 180 * GIB, 2250, 4500, 1100, 8000},
    {0, "NVIDIA GH200", "GH200", 0, 989.4, 1978.9, 494.7, 4000},
    {0, "Tesla V100", "V100", 0, 125, 0, 15.7, 900},
    {0, "NVIDIA RTX A6000", "A6000", 0, 154.8, 0, 77.4, 768},
    {0, "NVIDIA A40", "A40", 0, 149.7, 0, 74.8, 696},
    {0, "Tesla T4", "T4", 0, 65, 0, 8.1, 320},
};
#define N_SPECS (sizeof specs / sizeof specs[0])

const struct gpu_spec *gpu_spec_by_pci(unsigned vendor, unsigned device)
{
    if (vendor != NVIDIA_VENDOR || device == 0) return NULL;
    for (size_t k = 0; k < N_SPECS; k++)
        if (specs[k].pci_device == device) return &specs[k];
    return NULL;
}

/* Whether `word` is one of the words of `text` (runs of letters and digits),
 * case aside. */
static bool has_word(const char *text, const char *word, size_t word_len)
{
    for (const char *p = text; *p;) {
        while (*p && !isalnum((unsigned char)*p)) p++;
        const char *start = p;
        while (*p && isalnum((unsigned char)*p)) p++;
        if ((size_t)(p - start) == word_len && strncasecmp(start, word, word_len) == 0) return true;
    }
    return false;
}

const struct gpu_spec *gpu_spec_by_name(const char *model)
{
    if (!model || !*model) return NULL;
    for (size_t k = 0; k < N_SPECS; k++) {
        bool all = true;
        for (const char *w = specs[k].match; *w && all;) {
            size_t n = strcspn(w, " ");
            all = has_word(model, w, n);
            w += n + (w[n] == ' ');
        }
        if (all) return &specs[k];
    }
    return NULL;
}

double gpu_peak_tflops(const struct gpu_spec *spec, enum plan_precision precision)
{
    if (!spec) return 0;
    switch (precision) {
    case PLAN_PRECISION_FP8:
        return spec->fp8_tflops > 0 ? spec->fp8_tflops : spec->bf16_tflops;
    case PLAN_PRECISION_BF16:
        return spec->bf16_tflops;
    default:
        return spec->tf32_tflops;
    }
}

double gpu_flops_per_token(const struct gpt2_config *cfg, int seq_len)
{
    struct gpt2_layout layout;
    gpt2_layout(cfg, &layout);
    /* the position table is a lookup, so is an untied embedding (its head is the
     * product), and padded vocabulary rows are not model */
    double lookup = (double)layout.elems[GPT2_WPE] + (cfg->untied ? (double)layout.elems[GPT2_WTE] : 0);
    double n = (double)layout.total - lookup - (double)(cfg->padded_vocab - cfg->vocab) * cfg->hidden;
    n -= gpt2_inactive_expert_params(cfg); /* a token passes k of E experts */
    return 6.0 * n + 12.0 * cfg->layers * cfg->hidden * (double)seq_len;
}

double gpu_mfu(double flops_per_token, double tokens_per_s, double peak_tflops, int devices)
{
    if (!(peak_tflops > 0) || devices < 1 || !(tokens_per_s > 0)) return 0;
    return flops_per_token * tokens_per_s / (peak_tflops * 1e12 * devices);
}

/* ---- NVML ------------------------------------------------------------------------------- */

/* The few declarations of nvml.h used here (its ABI: nvmlReturn_t is an int
 * enum, 0 success; nvmlMemory_t starts with total, free, used). */
typedef struct nvml_device *nvml_device_t;
struct nvml_memory {
    unsigned long long total, free, used;
};

struct gpu_nvml {
    void *lib;
    int (*shutdown)(void);
    int (*by_busid)(const char *busid, nvml_device_t *dev);
    int (*name)(nvml_device_t dev, char *name, unsigned length);
    int (*memory)(nvml_device_t dev, struct nvml_memory *memory);
};

struct gpu_nvml *gpu_nvml_open(void)
{
    return gpu_nvml_open_library("libnvidia-ml.so.1"); /* the driver's, by its soname */
}

struct gpu_nvml *gpu_nvml_open_library(const char *library)
{
    struct gpu_nvml *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) goto fail;
    int (*init)(void) = (int (*)(void))dlsym(n->lib, "nvmlInit_v2");
    n->shutdown = (int (*)(void))dlsym(n->lib, "nvmlShutdown");
    n->by_busid =
        (int (*)(const char *, nvml_device_t *))dlsym(n->lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n->name = (int (*)(nvml_device_t, char *, unsigned))dlsym(n->lib, "nvmlDeviceGetName");
    n->memory =
        (int (*)(nvml_device_t, struct nvml_memory *))dlsym(n->lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !n->shutdown || !n->by_busid || !n->name || !n->memory || init() != 0) goto fail;
    return n;
fail:
    if (n->lib) dlclose(n->lib);
    free(n);
    return NULL;
}

int gpu_nvml_describe(struct gpu_nvml *n, const char *busid, char *name, size_t name_bytes,
                      uint64_t *memory_bytes)
{
    nvml_device_t dev;
    char text[96]; /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
    struct nvml_memory mem;
    if (!n || n->by_busid(busid, &dev) != 0) return -1;
    if (n->name(dev, text, sizeof text) == 0) {
        text[sizeof text - 1] = '\0';
        snprintf(name, name_bytes, "%s", text);
    }
    if (n->memory(dev, &mem) == 0) *memory_bytes = mem.total;
    return 0;
}

void gpu_nvml_close(struct gpu_nvml *n)
{
    if (!n) return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}
