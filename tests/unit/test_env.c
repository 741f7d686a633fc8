/* test_env.c — reading the env contract: one rank by default, a rank of a
 * tp × pp × dp layout (and of one with context parallelism) read back as
 * place_rank_env writes it, and each kind of inconsistency refused naming the
 * variable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/place/env.h"

static const char *const vars[] = {PLAIT_ENV_RANK,
                                   PLAIT_ENV_WORLD_SIZE,
                                   PLAIT_ENV_TP,
                                   PLAIT_ENV_PP,
                                   PLAIT_ENV_DP,
                                   PLAIT_ENV_TP_RANK,
                                   PLAIT_ENV_PP_RANK,
                                   PLAIT_ENV_DP_RANK,
                                   PLAIT_ENV_CP,
                                   PLAIT_ENV_CP_RANK,
                                   PLAIT_ENV_DEVICE,
                                   PLAIT_ENV_LOCAL_RANK,
                                   PLAIT_ENV_LOCAL_WORLD_SIZE,
                                   PLAIT_ENV_NODE_RANK,
                                   PLAIT_ENV_NODES,
                                   PLAIT_ENV_STORE_ADDR,
                                   PLAIT_ENV_STORE_SECRET,
                                   PLAIT_ENV_RESTART_COUNT,
                                   PLAIT_ENV_GPU_SHARED_BY,
                                   PLAIT_ENV_RANKS_PER_GPU};

static void clear(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* Sets each name to its value. */
static void set_each(const char *const (*vars_values)[2], size_t n)
{
    for (size_t i = 0; i < n; i++) setenv(vars_values[i][0], vars_values[i][1], 1);
}

/* rank 5 of tp 2 × pp 2 × dp 2: tp 1, dp 0, pp 1 */
static void set_rank5(void)
{
    static const char *const rank5[][2] = {{PLAIT_ENV_RANK, "5"},
                                           {PLAIT_ENV_WORLD_SIZE, "8"},
                                           {PLAIT_ENV_TP, "2"},
                                           {PLAIT_ENV_PP, "2"},
                                           {PLAIT_ENV_DP, "2"},
                                           {PLAIT_ENV_TP_RANK, "1"},
                                           {PLAIT_ENV_DP_RANK, "0"},
                                           {PLAIT_ENV_PP_RANK, "1"},
                                           {PLAIT_ENV_DEVICE, "3"},
                                           {PLAIT_ENV_STORE_ADDR, "node1:29500"},
                                           {PLAIT_ENV_STORE_SECRET, "abc"}};
    clear();
    set_each(rank5, sizeof rank5 / sizeof *rank5);
}

static void test_no_contract_is_one_rank(void)
{
    clear();
    struct env_rank e;
    struct plait_error err;
    CHECK(env_rank_read(&e, &err) == 0, "%s", err.text);
    CHECK(e.world == 1 && e.tp == 1 && e.pp == 1 && e.dp == 1 && e.rank == 0 && e.device == -1,
          "world %d", e.world);
}

static void test_a_rank_of_a_3d_layout_reads_back(void)
{
    set_rank5();
    struct env_rank e;
    struct plait_error err;
    CHECK(env_rank_read(&e, &err) == 0, "%s", err.text);
    CHECK(e.rank == 5 && e.world == 8 && e.tp_rank == 1 && e.dp_rank == 0 && e.pp_rank == 1,
          "rank %d", e.rank);
    CHECK(e.device == 3 && !strcmp(e.store_addr, "node1:29500") && !strcmp(e.store_secret, "abc"),
          "device %d store %s", e.device, e.store_addr);
    CHECK(e.cp == 1 && e.cp_rank == 0, "without PLAIT_CP: cp %d rank %d", e.cp, e.cp_rank);
}

/* rank 6 of tp 2 × cp 2 × pp 1 × dp 2 (PLAIT_DP the replicas, cp not in it): tp 0, cp 1,
 * dp 1, as rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)) */
static void set_cp_rank6(void)
{
    static const char *const rank6[][2] = {{PLAIT_ENV_RANK, "6"},    {PLAIT_ENV_PP, "1"},
                                           {PLAIT_ENV_CP, "2"},      {PLAIT_ENV_TP_RANK, "0"},
                                           {PLAIT_ENV_CP_RANK, "1"}, {PLAIT_ENV_DP_RANK, "1"},
                                           {PLAIT_ENV_PP_RANK, "0"}};
    set_rank5();
    set_each(rank6, sizeof rank6 / sizeof *rank6);
}

static void test_a_rank_of_a_cp_layout_reads_back(void)
{
    set_cp_rank6();
    struct env_rank e;
    struct plait_error err;
    CHECK(env_rank_read(&e, &err) == 0, "%s", err.text);
    CHECK(e.rank == 6 && e.world == 8 && e.cp == 2 && e.cp_rank == 1 && e.dp == 2 &&
              e.dp_rank == 1 && e.tp_rank == 0,
          "rank %d cp %d/%d dp %d/%d", e.rank, e.cp_rank, e.cp, e.dp_rank, e.dp);
    setenv(PLAIT_ENV_CP_RANK, "0", 1);
    CHECK(env_rank_read(&e, &err) != 0 &&
              strstr(err.text, "coordinates tp 0, cp 0, dp 1, pp 0 are rank 4 in Megatron order"),
          "cp rank 0 as rank 6: %s", err.text);
    setenv(PLAIT_ENV_CP_RANK, "2", 1);
    CHECK(env_rank_read(&e, &err) != 0 && strstr(err.text, "outside the layout"), "%s", err.text);
    clear();
}

static void refused(const char *name, const char *value, const char *want)
{
    set_rank5();
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    struct env_rank e;
    struct plait_error err = {.text = ""};
    CHECK(env_rank_read(&e, &err) != 0, "%s=%s accepted", name, value ? value : "(unset)");
    CHECK(strstr(err.text, want) != NULL, "%s=%s: %s", name, value ? value : "(unset)", err.text);
}

static void test_inconsistencies_are_refused_naming_the_variable(void)
{
    refused(PLAIT_ENV_WORLD_SIZE, "6",
            "PLAIT_WORLD_SIZE=6, but PLAIT_TP × PLAIT_CP × PLAIT_PP × PLAIT_DP");
    refused(PLAIT_ENV_TP_RANK, "0",
            "coordinates tp 0, cp 0, dp 0, pp 1 are rank 4 in Megatron order");
    refused(PLAIT_ENV_TP, "x", "PLAIT_TP=x: must be an integer");
    refused(PLAIT_ENV_RANK, "-1", "PLAIT_RANK=-1: must be an integer in [0,");
    refused(PLAIT_ENV_PP, NULL, "PLAIT_PP is not set");
    refused(PLAIT_ENV_STORE_SECRET, NULL, "8 ranks need the rendezvous store");
    refused(PLAIT_ENV_DEVICE, "gpu0", "PLAIT_DEVICE=gpu0");
    refused(PLAIT_ENV_DP_RANK, "2", "outside the layout");
    clear();
}

/* The ranks sharing a GPU: the contract's PLAIT_GPU_SHARED_BY (absent: 1), never the user's
 * PLAIT_RANKS_PER_GPU, which the launchers alone read (env_ranks_per_gpu): 1 unset, a bad
 * value refused naming the variable and the value. */
static void test_gpu_sharing_reads_the_contract_and_the_users_variable(void)
{
    set_rank5();
    struct env_rank e;
    struct plait_error err = {.text = ""};
    setenv(PLAIT_ENV_RANKS_PER_GPU, "4", 1);
    CHECK(env_rank_read(&e, &err) == 0 && e.ranks_per_gpu == 1 && e.device == 3,
          "without the contract's: %d (%s)", e.ranks_per_gpu, err.text);
    setenv(PLAIT_ENV_GPU_SHARED_BY, "2", 1);
    CHECK(env_rank_read(&e, &err) == 0 && e.ranks_per_gpu == 2 && e.device == 3,
          "shared by %d, device %d (%s)", e.ranks_per_gpu, e.device, err.text);
    int k = 0;
    CHECK(env_ranks_per_gpu(&k, &err) == 0 && k == 4, "PLAIT_RANKS_PER_GPU=4 read %d", k);
    refused(PLAIT_ENV_GPU_SHARED_BY, "0", "PLAIT_GPU_SHARED_BY=0: must be an integer in [1, 64]");
    unsetenv(PLAIT_ENV_RANKS_PER_GPU);
    CHECK(env_ranks_per_gpu(&k, &err) == 0 && k == 1, "unset read %d", k);
    static const char *const bad[] = {"two", "0", "65", "-1", "2x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[64];
        snprintf(want, sizeof want, "PLAIT_RANKS_PER_GPU=%s: must be an integer in [1, 64]",
                 bad[i]);
        setenv(PLAIT_ENV_RANKS_PER_GPU, bad[i], 1);
        CHECK(env_ranks_per_gpu(&k, &err) != 0 && strstr(err.text, want), "%s: %s", bad[i],
              err.text);
    }
    clear();
}

int main(void)
{
    RUN(test_no_contract_is_one_rank);
    RUN(test_a_rank_of_a_3d_layout_reads_back);
    RUN(test_a_rank_of_a_cp_layout_reads_back);
    RUN(test_inconsistencies_are_refused_naming_the_variable);
    RUN(test_gpu_sharing_reads_the_contract_and_the_users_variable);
    return check_exit_code();
}
