/* device.h — where a rank computes: the op backend (the CPU or a CUDA device)
 * from parallel.device and the device the launcher gave the rank, the
 * collective backend that fits it, and the device's rates behind "% of peak"
 * and MFU. Not the model nor the collectives themselves (model.c, parallel.c). */
#ifndef PLAIT_RUNTIME_DEVICE_H
#define PLAIT_RUNTIME_DEVICE_H

#include "common/error.h"
#include "common/place/env.h"
#include "common/plan/plan.h"
#include "kernels/ops.h"
#include "runtime/comm/comm.h"
#include "runtime/model.h"

/* The op backend this rank trains with (choose_device: parallel.device and
 * PLAIT_DEVICE) and a context of it (*ctx), or NULL with err. note: why a GPU
 * was not used under "auto" (rank 0 says it once the run's data has opened),
 * or "". */
const struct ops *device_open(const struct plan *p, const struct env_rank *w, struct ops_ctx **ctx,
                              char *note, size_t note_bytes, struct plait_error *err);

/* The collectives' backend for tensors where ops keeps them: socket on the CPU;
 * on GPUs nccl ("auto" resolves to it), or socket as the plan says or where
 * ranks share a GPU (PLAIT_RANKS_PER_GPU > 1: "auto" resolves to it), which
 * stages device buffers through host memory (rank 0 says so once). nccl is
 * refused naming parallel.backend on the CPU, and naming PLAIT_RANKS_PER_GPU
 * too on a shared GPU. */
int device_comm_backend(const struct plan *p, const struct env_rank *w, const struct ops *ops,
                        enum comm_backend_kind *kind, struct plait_error *err);

/* The rate of the device's matrix product in this precision, measured now: the
 * denominator of "% of peak" on a GPU whose datasheet plait does not know
 * (report_measure_peak). */
double device_peak_gflops(struct model *m);

/* The dense datasheet peak (TFLOP/s) of the GPU this rank trains on, in the plan's precision,
 * from common/place/gpu.h's table: the GPU is this machine's CUDA device `device` (hwloc, PCI id or
 * NVML name, as plait check finds it). 0 for a CPU rank, or when plait does not know the GPU:
 * no MFU is reported then. */
double device_gpu_peak_tflops(const struct model *m, int device, enum plan_precision precision);

#endif
