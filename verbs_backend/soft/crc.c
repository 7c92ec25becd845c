/* crc.c - CRC32c through ISA-L (crc32_iscsi is the fastest CRC32c in Debian, SSE4.2/PCLMUL). */
#include "crc.h"

#include <endian.h>
#include <isa-l/crc.h>
#include <stdatomic.h>
#include <string.h>

/*
 * ISA-L's AVX-512 CRC (crc32_iscsi_by16_10, chosen on CPUs with VPCLMULQDQ) returns without
 * vzeroupper, leaving the upper halves of the vector registers dirty. Every legacy-SSE
 * instruction after it (the compiler's own struct copies, here and in the program) then pays
 * the SSE/AVX transition, and context switches save the whole AVX-512 state: on the send path
 * one such stall cost ~0.4 us per datagram. So the upper state is cleared after each call.
 * vzeroupper needs AVX: the check is made once (0 unknown, 1 yes, 2 no).
 */
static _Atomic int have_avx;

__attribute__((target("avx"))) static void upper_clear(void)
{
	__builtin_ia32_vzeroupper();
}

static inline void after_isal(void)
{
	int a = atomic_load_explicit(&have_avx, memory_order_relaxed);
	if (__builtin_expect(!a, 0)) {
		__builtin_cpu_init();
		a = __builtin_cpu_supports("avx") ? 1 : 2;
		atomic_store_explicit(&have_avx, a, memory_order_relaxed);
	}
	if (a == 1)
		upper_clear();
}

/* crc32_iscsi takes and returns the raw (uninverted) register, so the running state is the
 * register itself and final() inverts it once. */
uint32_t dg_crc32c_update(uint32_t state, const void *buf, size_t len)
{
	if (len == 0)
		return state;
	uint32_t r = crc32_iscsi((unsigned char *)(uintptr_t)buf, (int)len, state);
	after_isal();
	return r;
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
