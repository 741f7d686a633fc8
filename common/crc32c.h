/* crc32c.h — CRC-32C (Castagnoli), the checksum of checkpoint files. */
#ifndef PLAIT_CRC32C_H
#define PLAIT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC: crc32c_update(0, buf, n) for a whole buffer, or chain the
 * results over consecutive pieces. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t bytes);

#endif
