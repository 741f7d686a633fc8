/* nccl_meta.c — the CUDA-free half of the nccl backend (nccl_meta.h): nominal
 * byte counts, the unique id as text, store keys. Compiled in every build;
 * comm_nccl.c, which needs nccl.h, only where NCCL is. */
#include "runtime/comm/nccl_meta.h"

#include <stdio.h>

void nccl_nominal_bytes(const struct comm_desc *d, int rank, int size, uint64_t *sent,
                        uint64_t *received)
{
    uint64_t n = (uint64_t)size, bytes = d->bytes;
    *sent = *received = 0;
    if (size < 2) return;
    switch (d->kind) {
    case COMM_OP_ALLREDUCE:
        *sent = *received = 2 * (n - 1) * bytes / n;
        return;
    case COMM_OP_REDUCE_SCATTER:
        if (d->counts) { /* as the ring: every block but its own out, but the one before in */
            uint64_t total = 0, e = comm_dtype_bytes(d->dtype);
            for (int b = 0; b < size; b++) total += d->counts[b] * e;
            *sent = total - d->counts[rank] * e;
            *received = total - d->counts[(rank + size - 1) % size] * e;
            return;
        }
        *sent = *received = (n - 1) * bytes; /* bytes: one rank's block */
        return;
    case COMM_OP_ALLGATHER:
        if (d->counts) { /* as the ring: every block but the next one's out, but its own in */
            uint64_t total = 0, e = comm_dtype_bytes(d->dtype);
            for (int b = 0; b < size; b++) total += d->counts[b] * e;
            *sent = total - d->counts[(rank + 1) % size] * e;
            *received = total - d->counts[rank] * e;
            return;
        }
        *sent = *received = (n - 1) * bytes; /* bytes: one rank's block */
        return;
    case COMM_OP_BROADCAST:
        *sent = rank == (d->root + size - 1) % size ? 0 : bytes;
        *received = rank == d->root ? 0 : bytes;
        return;
    case COMM_OP_BARRIER:
        *sent = *received = 2 * (n - 1) * 4 / n;
        return;
    case COMM_OP_ALLTOALL: { /* every block but its own, each way */
        uint64_t e = comm_dtype_bytes(d->dtype);
        for (int b = 0; b < size; b++) {
            if (b == rank) continue;
            *sent += d->counts[b] * e;
            *received += d->recv_counts[b] * e;
        }
        return;
    }
    case COMM_OP_SEND:
        *sent = bytes;
        return;
    case COMM_OP_RECV:
        *received = bytes;
        return;
    }
}

void nccl_hex_encode(const void *bin, size_t bytes, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bin;
    for (size_t i = 0; i < bytes; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * bytes] = '\0';
}

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

int nccl_hex_decode(const char *text, void *bin, size_t bytes)
{
    unsigned char *b = bin;
    for (size_t i = 0; i < bytes; i++) {
        int hi = text[2 * i] ? hex_value(text[2 * i]) : -1;
        int lo = hi >= 0 && text[2 * i + 1] ? hex_value(text[2 * i + 1]) : -1;
        if (hi < 0 || lo < 0) return -1;
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    return text[2 * bytes] ? -1 : 0;
}

void nccl_store_key(char *out, size_t out_bytes, const char *name, const char *what)
{
    snprintf(out, out_bytes, "comm/%s/nccl/%s", name, what);
}
