/* nccl_meta.h — what the nccl backend (comm_nccl.c) decides without CUDA, so
 * that it builds and is tested on any machine: the nominal bytes an operation
 * sends, the unique id's text form in the store, and the store keys of a
 * communicator. Not for use outside runtime/comm/. */
#ifndef PLAIT_NCCL_META_H
#define PLAIT_NCCL_META_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm_backend.h"

/* The payload bytes rank `rank` of `size` sends and receives for d by the
 * textbook algorithm NCCL's ring follows, since NCCL reports no byte counts:
 * all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather N-1 blocks
 * (uneven: every block but its own sent, every block but the previous rank's
 * received),
 * a ring broadcast the buffer from every rank but the one before the root
 * (received by every rank but the root), a barrier an all-reduce of one
 * float, a send its bytes one way. For the ring algorithms these are the
 * socket backend's payload counts. */
void nccl_nominal_bytes(const struct comm_desc *d, int rank, int size, uint64_t *sent,
                        uint64_t *received);

/* bytes of binary as 2*bytes lowercase hex digits and a NUL (out: 2*bytes+1). */
void nccl_hex_encode(const void *bin, size_t bytes, char *out);

/* The reverse: 0, or -1 unless text is exactly 2*bytes hex digits. */
int nccl_hex_decode(const char *text, void *bin, size_t bytes);

/* "comm/<name>/nccl/<what>" into out (COMM_MAX_NAME_BYTES + 64 is enough for
 * what <= 32 bytes). */
void nccl_store_key(char *out, size_t out_bytes, const char *name, const char *what);

#endif
