/*
 * crc.h - CRC32c (Castagnoli) for datagram-iWARP (SSE4.2 crc32 below 256 bytes, ISA-L
 * crc32_iscsi above).
 * The value on the wire is the standard CRC32c: crc32c("123456789") == 0xE3069283,
 * stored big-endian after the bytes it covers (wire.h dg_crc_t).
 */
#ifndef DG_CRC_H
#define DG_CRC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define DG_CRC32C_INIT 0xffffffffu

/* Incremental: state = dg_crc32c_update(DG_CRC32C_INIT, ...) ...; crc = dg_crc32c_final(state). */
uint32_t dg_crc32c_update(uint32_t state, const void *buf, size_t len);
static inline uint32_t dg_crc32c_final(uint32_t state) { return state ^ 0xffffffffu; }
/* One shot. */
uint32_t dg_crc32c(const void *buf, size_t len);
/* Over the concatenation of an iovec. */
uint32_t dg_crc32c_iov(const struct iovec *iov, int iovcnt);
/* 1 when the last 4 bytes of buf[0..len) are the big-endian CRC32c of the bytes before them. */
int dg_crc_check(const uint8_t *buf, size_t len);

#endif
