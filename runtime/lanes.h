/* lanes.h — two passes run as two lanes (threads) that take turns with a baton: only the
 * lane holding it computes, and it hands the baton over only where it has started an
 * exchange (lanes_switch: the experts' all-to-all of a DualPipeV pair, runtime/pipeline.c),
 * so one lane's exchange moves while the other computes. The switches come strictly in
 * turn at the same points of the passes on every rank, whatever the timing, so every
 * collective either lane posts on a shared communicator (tp, dp) is posted in the same
 * order on every rank, and each lane computes what it would alone: the bits of the passes
 * run one after the other. A lane's exchanges go over a communicator of its own (two in
 * flight never mix). What a pass keeps across a switch in memory both passes use is the
 * lane's own: `enter` installs the lane's set each time a lane takes the baton. */
#ifndef PLAIT_RUNTIME_LANES_H
#define PLAIT_RUNTIME_LANES_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/group.h"

struct lanes;

/* A pass: 0, or -1 with err. */
typedef int (*lane_pass)(void *ctx, struct plait_error *err);

/* Starts the second lane's thread (it sleeps until lanes_run); enter(enter_ctx, lane) runs
 * each time lane 0 or 1 takes the baton, before it computes. NULL with err on failure. */
struct lanes *lanes_open(void (*enter)(void *ctx, int lane), void *enter_ctx,
                         struct plait_error *err);
void lanes_close(struct lanes *L);

/* Runs pass[0](ctx[0]) in this thread as lane 0, which holds the baton first, and
 * pass[1](ctx[1]) as lane 1, and returns once both are done (lane 0's set entered again):
 * 0, or -1 with err, the first failing lane's (the other runs on without switching). */
int lanes_run(struct lanes *L, const lane_pass pass[2], void *const ctx[2],
              struct plait_error *err);

/* Whether L (NULL: none) is running a pair: a lane's exchange may then switch. */
bool lanes_running(const struct lanes *L);

/* From the lane holding the baton, with an exchange req started on g: the baton to the
 * other lane (unless it is done), back when it switches or ends, then g's wait for req
 * (its time the exchange's wait that the other lane's compute did not hide). */
int lanes_switch(struct lanes *L, const struct group *g, void *req, struct plait_error *err);

/* Switches so far (a lane handing the baton to the other). */
long lanes_switches(const struct lanes *L);

#endif
