/* comm_memory.h — the host memory a socket-backend link holds, in one place for
 * the backend that allocates it (runtime/comm/sock_link.h) and the cost model
 * that predicts it (common/place/cost.c). Only the size lives here; what the rings
 * carry is the backend's business. */
#ifndef PLAIT_COMM_MEMORY_H
#define PLAIT_COMM_MEMORY_H

#include <stddef.h>

/* One shared-memory ring, per direction of a link between two ranks of a
 * node. Alike from 256K to 4M for bandwidth alone (bench/comm_bench.c), but a
 * sum overlapping computation on the same cores (runtime/buckets.h) needs the
 * larger ring: with 256K every refill waited for a descheduled peer, and the
 * overlapped step ran 1.66× slower than the serial one
 * (bench/overlap_bench.sh). Pages are touched only as far as the traffic
 * reaches. */
#define COMM_SHM_RING_BYTES ((size_t)4 << 20)

#endif
