/* console.h — what rank 0 prints and where: the console mode (progress lines,
 * one JSON object per step, or quiet) and the copy of the console kept in the
 * run directory (train.log, appended across resumes). */
#ifndef PLAIT_RUNTIME_CONSOLE_H
#define PLAIT_RUNTIME_CONSOLE_H

#include <stddef.h>

#include "common/error.h"

enum console_mode {
    CONSOLE_PROGRESS, /* progress lines (the default) */
    CONSOLE_JSON,     /* stdout: one JSON object per step and evaluation, as metrics.jsonl */
    CONSOLE_QUIET     /* only warnings, errors and the final summary */
};

/* Set by plait-train from $PLAIT_CONSOLE ("json", "quiet"; else progress). */
extern enum console_mode console_mode;

/* From then on what goes through stdout and stderr (the FILE streams) is
 * also appended to RUN_DIR/train.log, as it is written; a closed terminal or
 * pipe ends only the printing. -1 with err when the log cannot be kept (the
 * console is then as before). */
int console_start(const char *run_dir, struct plait_error *err);
/* text to stderr and train.log with write(2) alone: for a signal handler. */
void console_note(const char *text, size_t bytes);
/* Flushes and gives stdout and stderr back. */
void console_stop(void);

#endif
