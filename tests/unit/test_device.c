/* test_device.c — the collectives' backend a rank chooses (device_comm_backend), with no
 * GPU: an op table named as the CUDA one stands for a GPU rank. nccl on GPUs by default,
 * socket where the plan says so (staged through host memory) or where ranks share a GPU
 * (PLAIT_RANKS_PER_GPU, the contract's PLAIT_GPU_SHARED_BY), nccl on a shared GPU refused
 * naming both, and nccl on the CPU refused as ever. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/place/env.h"
#include "kernels/ops.h"
#include "runtime/device.h"

static const struct ops gpu_ops = {.name = "cuda"}; /* (only its name is read) */
static const struct ops host_ops = {.name = "cpu"};

static struct plan *plan_with_backend(const char *backend)
{
    char set[64];
    snprintf(set, sizeof set, "parallel.backend=%s", backend);
    const char *sets[] = {set};
    struct plait_error err;
    struct plan *p = plan_load_text("{\"model\": {\"layers\": 1, \"heads\": 2, \"hidden\": 16, "
                                    "\"vocab\": 256, \"seq_len\": 8}, \"data\": {\"train\": "
                                    "\"x\"}, \"steps\": 1}",
                                    "plan.json", "/", sets, 1, &err);
    if (!p) printf("  plan: %s\n", err.text);
    return p;
}

/* The kind chosen for a rank of 2 on CUDA device 0 shared by `shared` ranks, or -1 with
 * err (err->text "" otherwise). */
static int kind_of(const char *backend, const struct ops *ops, int shared,
                   struct plait_error *err)
{
    struct plan *p = plan_with_backend(backend);
    if (!p) return -2;
    struct env_rank w = {.rank = 1, .world = 2, .device = 0, .ranks_per_gpu = shared};
    enum comm_backend_kind kind;
    err->text[0] = '\0';
    int rc = device_comm_backend(p, &w, ops, &kind, err);
    plan_free(p);
    return rc ? -1 : (int)kind;
}

static void test_gpu_ranks_choose_nccl_unless_they_share_a_gpu(void)
{
    struct plait_error err;
    CHECK(kind_of("auto", &gpu_ops, 1, &err) == COMM_BACKEND_NCCL, "auto, a GPU each: %s",
          err.text);
    CHECK(kind_of("nccl", &gpu_ops, 1, &err) == COMM_BACKEND_NCCL, "nccl: %s", err.text);
    CHECK(kind_of("auto", &gpu_ops, 2, &err) == COMM_BACKEND_SOCKET, "auto, shared: %s",
          err.text);
    CHECK(kind_of("socket", &gpu_ops, 2, &err) == COMM_BACKEND_SOCKET, "socket, shared: %s",
          err.text);
    CHECK(kind_of("auto", &host_ops, 2, &err) == COMM_BACKEND_SOCKET, "CPU ranks: %s", err.text);
}

/* socket on GPU ranks was refused until it could stage device memory through the host */
static void test_socket_on_gpu_ranks_is_allowed(void)
{
    struct plait_error err;
    CHECK(kind_of("socket", &gpu_ops, 1, &err) == COMM_BACKEND_SOCKET, "socket on a GPU: %s",
          err.text);
}

static void test_nccl_is_refused_on_a_shared_gpu_and_on_the_cpu(void)
{
    struct plait_error err;
    CHECK(kind_of("nccl", &gpu_ops, 2, &err) == -1, "nccl on a shared GPU chosen");
    CHECK(strstr(err.text, "plan.json: parallel.backend: \"nccl\" takes one rank per GPU, but "
                           "PLAIT_RANKS_PER_GPU=2 puts rank 1 on CUDA device 0 with 1 other"),
          "%s", err.text);
    CHECK(kind_of("nccl", &host_ops, 1, &err) == -1 &&
              strstr(err.text, "\"nccl\" moves GPU memory, but rank 1 trains on the CPU"),
          "%s", err.text);
}

int main(void)
{
    RUN(test_gpu_ranks_choose_nccl_unless_they_share_a_gpu);
    RUN(test_socket_on_gpu_ranks_is_allowed);
    RUN(test_nccl_is_refused_on_a_shared_gpu_and_on_the_cpu);
    return check_exit_code();
}
