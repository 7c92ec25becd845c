/* crc.c - CRC32c: the SSE4.2 crc32 instruction for short buffers, ISA-L (crc32_iscsi, the fastest
 * CRC32c in Debian for long ones) above. */
#include "crc.h"

#include <endian.h>
#include <isa-l/crc.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/*
 * Short buffers (a datagram's header, a small message) by the crc32 instruction, 8 bytes a
 * step. ISA-L folds 256 bytes and more with carry-less multiplies, but below that it takes a
 * slow path: crc32_iscsi plus the vzeroupper after it took 15.9 ns for 36 bytes, 24.9 for 100
 * and 38.3 for 200, the instruction 3.5, 9.0 and 17.6 (this machine's EPYC; at 256 ISA-L's
 * 18.3 beats its 22.5). A 64-byte datagram's header and payload and its check on receipt
 * went from ~60 ns to ~20 per round trip. Same register in and out as crc32_iscsi (raw,
 * uninverted).
 */
#define SHORT_CRC 256 /* ISA-L's own cut: from here its folding is faster */

#if defined(__x86_64__)
/* SSE4.2's crc32 instruction computes CRC32c itself: 0 unknown, 1 yes, 2 no. */
static _Atomic int have_sse42;

__attribute__((target("sse4.2"))) static uint32_t crc_short(uint32_t r, const unsigned char *p, size_t len)
{
	uint64_t q = r;
	for (; len >= 8; p += 8, len -= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		q = __builtin_ia32_crc32di(q, w);
	}
	r = (uint32_t)q;
	if (len >= 4) {
		uint32_t w;
		memcpy(&w, p, 4);
		r = __builtin_ia32_crc32si(r, w);
		p += 4, len -= 4;
	}
	for (; len; p++, len--)
		r = __builtin_ia32_crc32qi(r, *p);
	return r;
}

static inline bool short_ok(size_t len)
{
	if (len >= SHORT_CRC)
		return false;
	int a = atomic_load_explicit(&have_sse42, memory_order_relaxed);
	if (__builtin_expect(!a, 0)) {
		__builtin_cpu_init();
		a = __builtin_cpu_supports("sse4.2") ? 1 : 2;
		atomic_store_explicit(&have_sse42, a, memory_order_relaxed);
	}
	return a == 1;
}
#else
static inline bool short_ok(size_t len) { (void)len; return false; }
static uint32_t crc_short(uint32_t r, const unsigned char *p, size_t len) { (void)p, (void)len; return r; }
#endif

/* crc32_iscsi takes and returns the raw (uninverted) register, so the running state is the
 * register itself and final() inverts it once. */
uint32_t dg_crc32c_update(uint32_t state, const void *buf, size_t len)
{
	if (len == 0)
		return state;
	if (short_ok(len))
		return crc_short(state, buf, len);
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
