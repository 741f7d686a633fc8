/* commands.h — the subcommands of the plait CLI; plait.c routes to them.
 * Each takes the arguments after its name and returns the exit code; each
 * describes its command line as a table (cli.h). */
#ifndef PLAIT_LAUNCHER_COMMANDS_H
#define PLAIT_LAUNCHER_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "launcher/cli.h"

extern const struct cli_command cmd_train_cli, cmd_check_cli, cmd_launch_cli, cmd_data_prepare_cli,
    cmd_data_decode_cli, cmd_status_cli, cmd_plot_cli, cmd_ckpt_ls_cli, cmd_ckpt_verify_cli, cmd_ckpt_export_cli,
    cmd_ckpt_import_cli, cmd_sample_cli, cmd_k8s_render_cli, cmd_k8s_admin_cli, cmd_k8s_lint_cli;

int cmd_train(int argc, char **argv);  /* plait train PLAN [--out DIR] [--set k=v ...] */
int cmd_check(int argc, char **argv);  /* plait check PLAN [--nodes N] [--topology X.xml ...] */
int cmd_launch(int argc, char **argv); /* plait launch: in a Slurm task or a pod */
int cmd_data_prepare(int argc, char **argv); /* plait data prepare TEXT... OUT.bin [...] */
int cmd_data_decode(int argc, char **argv);  /* plait data decode SHARD.bin [--tokenizer F] */
int cmd_status(int argc, char **argv);       /* plait status RUN_DIR... [--json] */
int cmd_plot(int argc, char **argv);         /* plait plot RUN_DIR... [-o FILE] */
int cmd_ckpt_ls(int argc, char **argv);      /* plait ckpt ls DIR [--json] */
int cmd_ckpt_verify(int argc, char **argv);  /* plait ckpt verify DIR */
int cmd_ckpt_export(int argc, char **argv);  /* plait ckpt export DIR --llmc OUT.bin */
int cmd_ckpt_import(int argc, char **argv);  /* plait ckpt import IN.bin PLAN --out DIR */
int cmd_sample(int argc, char **argv);       /* plait sample DIR [--prompt T] [--tokens N] */
int cmd_k8s_render(int argc, char **argv);   /* plait k8s render PLAN --image I --nodes N ... */
int cmd_k8s_admin(int argc, char **argv);    /* plait k8s admin --namespace NS --gpus N ... */
int cmd_k8s_lint(int argc, char **argv);     /* plait k8s lint FILE... */

/* The newest checkpoint of DIR (a run directory, its checkpoint directory or one
 * checkpoint) that verifies, for `command` (the damaged ones before it are warned of): its
 * directory, step and layout ("tp 2 × pp 1 × dp 2, ZeRO 1"). -1 with err when none does. */
int ckpt_pick_newest(const char *command, const char *dir, char *cdir, size_t cdir_bytes,
                     int64_t *step, char *layout, size_t layout_bytes, struct plait_error *err);

/* Binds this process to $PLAIT_CPUS (if set) and sets OMP_NUM_THREADS to the
 * CPUs it got unless already set; -1 (said) when PLAIT_CPUS is malformed. */
int launcher_bind_cpus(void);

/* Execs plait-train (beside this executable, else from PATH) with the current
 * environment; returns only if that fails, after saying so. */
void launcher_exec_runtime(void);

#endif
