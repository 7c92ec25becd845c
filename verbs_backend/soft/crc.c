/* crc.c - CRC32c through ISA-L (crc32_iscsi is the fastest CRC32c in Debian, SSE4.2/PCLMUL). */
#include "crc.h"

#include <endian.h>
#include <isa-l/crc.h>
#include <string.h>

/* crc32_iscsi takes and returns the raw (uninverted) register, so the running state is the
 * register itself and final() inverts it once. */
uint32_t dg_crc32c_update(uint32_t state, const void *buf, size_t len)
{
	if (len == 0)
		return state;
	return crc32_iscsi((unsigned char *)(uintptr_t)buf, (int)len, state);
}

uint32_t dg_crc32c(const void *buf, size_t len)
{
	return dg_crc32c_final(dg_crc32c_update(DG_CRC32C_INIT, buf, len));
}

uint32_t dg_crc32c_iov(const struct iovec *iov, int iovcnt)
{
	uint32_t s = DG_CRC32C_INIT;
	for (int i = 0; i < iovcnt; i++)
		s = dg_crc32c_update(s, iov[i].iov_base, iov[i].iov_len);
	return dg_crc32c_final(s);
}

int dg_crc_check(const uint8_t *buf, size_t len)
{
	uint32_t be;
	if (len < 4)
		return 0;
	memcpy(&be, buf + len - 4, 4);
	return dg_crc32c(buf, len - 4) == be32toh(be);
}
