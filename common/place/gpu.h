/* gpu.h — what plait knows about a GPU model: its name as NVML gives it,
 * memory, dense tensor-core peaks and memory bandwidth (a table of NVIDIA
 * datacenter GPUs, looked up by PCI device id or by name); NVML asked at run
 * time when the driver has it (dlopen, no link-time dependency); and the
 * model FLOPs per token and the MFU that plait check, the runtime and the
 * bench all report. Finding the GPUs of a node is topo.h's. */
#ifndef PLAIT_GPU_H
#define PLAIT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/gpt2/gpt2_layout.h"
#include "common/plan/plan.h"

struct gpu_spec {
    uint16_t pci_device;   /* NVIDIA (10de) PCI device id; 0: known by name only */
    const char *name;      /* as nvmlDeviceGetName says it: "NVIDIA H100 80GB HBM3" */
    const char *match;     /* the words a model name must hold to be this GPU */
    uint64_t memory_bytes; /* the datasheet's capacity; 0 where models differ */
    /* datasheet tensor-core peaks, TFLOP/s, dense (not "with sparsity");
     * fp8 0: no fp8 tensor cores; tf32: the fp32 products' rate */
    double bf16_tflops, fp8_tflops, tf32_tflops;
    double memory_gbps; /* device memory bandwidth, GB/s */
};

/* The GPU of PCI id vendor:device, or NULL when plait does not know it. */
const struct gpu_spec *gpu_spec_by_pci(unsigned vendor, unsigned device);

/* The GPU a model name names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
 * pci.ids' "GH100 [H100 SXM5 80GB]"), by whole words; NULL when none. */
const struct gpu_spec *gpu_spec_by_name(const char *model);

/* The dense peak for products in this precision (TFLOP/s): fp8 on a GPU
 * without fp8 tensor cores runs at the bf16 rate. 0 when spec is NULL. */
double gpu_peak_tflops(const struct gpu_spec *spec, enum plan_precision precision);

/* Model FLOPs per token of a forward and backward pass: 6·N + 12·L·C·T
 * (PaLM, Chowdhery et al. 2022, App. B), N the model's parameters without the
 * position table (a lookup) and without the vocabulary's padding rows. */
double gpu_flops_per_token(const struct gpt2_config *cfg, int seq_len);

/* Model FLOPs utilisation: flops_per_token × tokens_per_s over `devices`
 * GPUs' peak (TFLOP/s each), a fraction; 0 when the peak is unknown. */
double gpu_mfu(double flops_per_token, double tokens_per_s, double peak_tflops, int devices);

/* NVML, when the driver's library is there. */
struct gpu_nvml;

/* NULL when libnvidia-ml.so.1 is absent or does not start (no driver): the
 * callers then fall back to hwloc and the table. */
struct gpu_nvml *gpu_nvml_open(void);

/* The same from another library with NVML's symbols (tests: a stand-in). */
struct gpu_nvml *gpu_nvml_open_library(const char *library);

/* The name and memory of the GPU at PCI busid ("0000:1b:00.0"). -1 when
 * NVML does not know that device. */
int gpu_nvml_describe(struct gpu_nvml *nvml, const char *busid, char *name, size_t name_bytes,
                      uint64_t *memory_bytes);
void gpu_nvml_close(struct gpu_nvml *nvml);

#endif
