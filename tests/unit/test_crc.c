/* test_crc.c - CRC32c known answers (RFC 3720 B.4 vectors) and the helpers around them. */
#include <criterion/criterion.h>

#include <endian.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "crc.h"

Test(crc, check_value)
{
	cr_assert_eq(dg_crc32c("123456789", 9), 0xE3069283u);
}

Test(crc, empty)
{
	cr_assert_eq(dg_crc32c("", 0), 0x00000000u);
	cr_assert_eq(dg_crc32c(NULL, 0), 0x00000000u);
	struct iovec iov = {.iov_base = NULL, .iov_len = 0};
	cr_assert_eq(dg_crc32c_iov(&iov, 1), 0u);
	cr_assert_eq(dg_crc32c_iov(NULL, 0), 0u);
}

Test(crc, rfc3720_vectors)
{
	uint8_t b[32];
	memset(b, 0, sizeof b);
	cr_assert_eq(dg_crc32c(b, 32), 0x8A9136AAu);
	memset(b, 0xff, sizeof b);
	cr_assert_eq(dg_crc32c(b, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		b[i] = (uint8_t)i;
	cr_assert_eq(dg_crc32c(b, 32), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		b[i] = (uint8_t)(31 - i);
	cr_assert_eq(dg_crc32c(b, 32), 0x113FDB5Cu);
}

static void fill(uint8_t *b, size_t n)
{
	uint32_t x = 12345;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		b[i] = (uint8_t)(x >> 16);
	}
}

Test(crc, incremental_equals_one_shot)
{
	uint8_t b[3000];
	fill(b, sizeof b);
	uint32_t whole = dg_crc32c(b, sizeof b);
	for (size_t cut = 0; cut <= sizeof b; cut += 97) {
		uint32_t s = dg_crc32c_update(DG_CRC32C_INIT, b, cut);
		s = dg_crc32c_update(s, b + cut, sizeof b - cut);
		cr_assert_eq(dg_crc32c_final(s), whole, "cut at %zu", cut);
	}
}

Test(crc, iov_split_equals_one_shot)
{
	uint8_t b[1500];
	fill(b, sizeof b);
	uint32_t whole = dg_crc32c(b, sizeof b);

	/* header | payload | (empty) | tail, as the send path gathers a datagram */
	struct iovec iov[4] = {
		{.iov_base = b, .iov_len = 30},
		{.iov_base = b + 30, .iov_len = 1000},
		{.iov_base = b + 1030, .iov_len = 0},
		{.iov_base = b + 1030, .iov_len = 470},
	};
	cr_assert_eq(dg_crc32c_iov(iov, 4), whole);

	struct iovec bytes[1500];
	for (int i = 0; i < 1500; i++) {
		bytes[i].iov_base = b + i;
		bytes[i].iov_len = 1;
	}
	cr_assert_eq(dg_crc32c_iov(bytes, 1500), whole);
	cr_assert_eq(dg_crc32c_iov(iov, 1), dg_crc32c(b, 30));
}

/* Appends the big-endian trailer the way a sender does. */
static size_t seal(uint8_t *b, size_t n)
{
	uint32_t be = htobe32(dg_crc32c(b, n));
	memcpy(b + n, &be, 4);
	return n + 4;
}

Test(crc, check_good_and_bad)
{
	uint8_t b[64];
	fill(b, 60);
	size_t n = seal(b, 60);
	cr_assert_eq(dg_crc_check(b, n), 1);

	/* Any single flipped bit, in data or trailer, is caught. */
	for (size_t i = 0; i < n; i++)
		for (int bit = 0; bit < 8; bit++) {
			b[i] ^= (uint8_t)(1u << bit);
			cr_assert_eq(dg_crc_check(b, n), 0, "byte %zu bit %d", i, bit);
			b[i] ^= (uint8_t)(1u << bit);
		}
	cr_assert_eq(dg_crc_check(b, n), 1);

	/* Little-endian trailer is wrong on the wire. */
	uint32_t le = htole32(dg_crc32c(b, 60));
	memcpy(b + 60, &le, 4);
	cr_assert_eq(dg_crc_check(b, n), 0);
}

Test(crc, check_short)
{
	uint8_t b[4] = {0, 0, 0, 0};
	/* Four bytes is a valid empty message: CRC32c("") is 0. */
	cr_assert_eq(dg_crc_check(b, 4), 1);
	cr_assert_eq(dg_crc_check(b, 3), 0);
	cr_assert_eq(dg_crc_check(b, 0), 0);
}

Test(crc, check_known_bytes)
{
	/* "123456789" followed by e3 06 92 83. */
	const uint8_t b[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9', 0xe3, 0x06, 0x92, 0x83};
	cr_assert_eq(dg_crc_check(b, sizeof b), 1);
}

/* The bitwise definition (reflected 0x82F63B78), against which both ways the library takes
 * (the crc32 instruction for short buffers, ISA-L for long ones) are checked. */
static uint32_t crc_bitwise(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
	}
	return c ^ 0xffffffffu;
}

Test(crc, short_and_long_ways_match_the_definition)
{
	static uint8_t b[700];
	fill(b, sizeof b);
	/* every length across the short/long boundary, at every alignment of a word */
	for (size_t off = 0; off < 8; off++)
		for (size_t n = 0; n + off <= sizeof b; n++)
			cr_assert_eq(dg_crc32c(b + off, n), crc_bitwise(b + off, n), "len %zu at offset %zu", n, off);
	/* a short piece after a long one and the reverse carry the same running register */
	for (size_t cut = 1; cut < sizeof b; cut += 13) {
		uint32_t s = dg_crc32c_update(DG_CRC32C_INIT, b, cut);
		s = dg_crc32c_update(s, b + cut, sizeof b - cut);
		cr_assert_eq(dg_crc32c_final(s), crc_bitwise(b, sizeof b), "cut at %zu", cut);
	}
}
