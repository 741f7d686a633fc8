/* env.h — the env contract: every variable that passes from a launcher (plait
 * train, the SPANK plugin, plait launch in a pod) to the runtime plait-train.
 * It is the only interface between the two halves; the README documents it. */
#ifndef PLAIT_ENV_H
#define PLAIT_ENV_H

/* Path of the resolved plan (plan_to_json output) the runtime must train. */
#define PLAIT_ENV_PLAN "PLAIT_PLAN"
/* The run directory: metrics, run.json, checkpoints (unless absolute). */
#define PLAIT_ENV_RUN_DIR "PLAIT_RUN_DIR"
/* This rank and the number of ranks (1 until 3D parallelism lands). */
#define PLAIT_ENV_RANK "PLAIT_RANK"
#define PLAIT_ENV_WORLD_SIZE "PLAIT_WORLD_SIZE"
/* How many times the job has been restarted (Slurm requeue, pod restart). */
#define PLAIT_ENV_RESTART_COUNT "PLAIT_RESTART_COUNT"
/* Optional: GFLOP/s the device can do, instead of measuring it at start-up
 * (the denominator of the "% of peak" in the progress line). */
#define PLAIT_ENV_PEAK_GFLOPS "PLAIT_PEAK_GFLOPS"
/* Set to 1: print where the step time went (per phase) at the end of a run. */
#define PLAIT_ENV_PROFILE "PLAIT_PROFILE"
/* Developer: write the logits of step 1's first micro-batch and all gradients
 * of step 1 (before clipping) as raw float32 into this directory. */
#define PLAIT_ENV_DUMP_STEP1 "PLAIT_DUMP_STEP1"

/* Developer fault injection: after this many micro-batches (counted from the
 * start of this process), plait-train sends itself SIGTERM, so that tests can
 * stop it at an exact point through the real signal path. */
#define PLAIT_ENV_DEBUG_SIGNAL_AFTER_MICRO "PLAIT_DEBUG_SIGNAL_AFTER_MICRO"

/* Exit codes of plait-train (and plait train, which passes them on). */
enum plait_exit {
    PLAIT_EXIT_OK = 0,
    PLAIT_EXIT_ERROR = 1,     /* bad input or a failure; the message says which */
    PLAIT_EXIT_USAGE = 2,     /* bad command line */
    PLAIT_EXIT_PREEMPTED = 75 /* stopped by SIGTERM/SIGUSR1 after writing a
                                 checkpoint: resumable (EX_TEMPFAIL) */
};

#endif
