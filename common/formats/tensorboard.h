/* tensorboard.h — a run's scalars as TensorBoard event files, beside
 * metrics.jsonl (plan field train.tensorboard), for the viewers people
 * already use.
 *
 * The format, as TensorBoard reads it: a file named
 * events.out.tfevents.<seconds>.<host>, a sequence of records, each
 *   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
 *   length bytes of data, uint32 masked CRC-32C of the data
 * (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8), each record's data one
 * tensorflow.Event protocol buffer:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; SessionLog session_log = 7; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 *   SessionLog { enum SessionStatus status = 1; }   (START = 1)
 * The first record says file_version "brain.Event:2". A resumed run opens a
 * new file whose first scalar record follows a SessionLog START at the
 * resumed step: TensorBoard then drops what an earlier file holds from that
 * step on (what metrics.jsonl's cut does for its own readers). */
#ifndef PLAIT_FORMATS_TENSORBOARD_H
#define PLAIT_FORMATS_TENSORBOARD_H

#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

struct tensorboard {
    FILE *f; /* NULL: not writing */
    char path[4096];
};

/* Opens a new events file in dir (made if missing) for a run starting after
 * `resumed_step` steps (0: a fresh run; else the SessionLog START record). */
int tensorboard_open(struct tensorboard *tb, const char *dir, int64_t resumed_step,
                     struct plait_error *err);

/* One scalar of a step (tags like "train/loss"); flushed so that a viewer
 * sees it at once. */
int tensorboard_scalar(struct tensorboard *tb, const char *tag, int64_t step, double value,
                       struct plait_error *err);

void tensorboard_close(struct tensorboard *tb);

#endif
