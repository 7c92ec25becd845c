/*
 * test_mpa.c - the pure MPA/DDP functions of verbs_backend/soft/mpa.h against RFC 5044 (MPA),
 * RFC 6581 (MPA revision 2), RFC 5041 (DDP) and RFC 5040 (RDMAP):
 *
 *   - MPA Request/Reply frames: build, header check and parse, revision 1 and 2, the RFC 6581
 *     IRD/ORD word, the private data limits, and every rejection (each with its reason);
 *   - FPDU arithmetic: pad, FPDU length, MULPDU from the MSS;
 *   - markers: counting, wire length, insertion at the start, in the middle and at the end of an
 *     FPDU, removal, and corrupted markers;
 *   - the CRC field and the DDP tagged/untagged headers, byte by byte;
 *   - the worked examples of docs/wire.md section 12, whose bytes were derived by hand from the
 *     RFCs (the CRC32c values with an independent bitwise implementation, see crc32c_bitwise()).
 */
#include <criterion/criterion.h>

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc.h"
#include "mpa.h"
#include "wire.h"

/* ------------------------------------------------------------------ helpers */

/* CRC32c written from its definition (RFC 3720 section 12.1: polynomial 0x1EDC6F41, reflected
 * 0x82F63B78, initial value and final XOR 0xFFFFFFFF), one bit at a time, so that the expected
 * values below do not depend on ISA-L. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int b = 0; b < 8; b++)
			c = (c >> 1) ^ (c & 1u ? 0x82f63b78u : 0u);
	}
	return c ^ 0xffffffffu;
}

static size_t unhex(const char *s, uint8_t *out, size_t max)
{
	size_t n = 0;
	for (; s[0] && s[1]; s += 2) {
		unsigned v;
		cr_assert_eq(sscanf(s, "%2x", &v), 1, "bad hex near \"%.8s\"", s);
		cr_assert_lt(n, max);
		out[n++] = (uint8_t)v;
	}
	return n;
}

/* A 20-byte frame header with arbitrary fields (for the rejection tests). */
static void raw_hdr(uint8_t *buf, const char *key, uint8_t flags, uint8_t rev, uint16_t pd_len)
{
	memcpy(buf, key, 16);
	buf[16] = flags;
	buf[17] = rev;
	buf[18] = (uint8_t)(pd_len >> 8);
	buf[19] = (uint8_t)pd_len;
}

static uint16_t get_be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* Expects mpa_rr_check_hdr to reject buf with a reason. */
static void expect_hdr_reject(const uint8_t *buf, bool req, const char *what)
{
	const char *why = NULL;
	cr_assert_eq(mpa_rr_check_hdr(buf, req, &why), -EPROTO, "%s: not rejected", what);
	cr_assert_not_null(why, "%s: rejected without a reason", what);
	cr_assert_gt(strlen(why), 0u, "%s: empty reason", what);
}

/* ------------------------------------------------------------------ docs/wire.md section 12 */

/* Identical to the hex lines of docs/wire.md section 12 (checked by rc_wire_md_text_matches). */
/* 12.10 example 1: the MPA Request our initiator sends by default (revision 2, CRC, no markers,
 * IRD 64 + peer-to-peer, ORD 16 + Write and Read RTR, no private data of the application). */
static const char MD_REQUEST[] = "4d504120494420526571204672616d6550020004" "8040c010";
/* 12.10 example 2: the RTR the initiator then sends (zero-length RDMA Write, STag 1, TO 0). */
static const char MD_RTR_WRITE[] = "000ec140000000010000000000000000ebd34c5f";
/* 12.10 example 3: a Send of "hello", QN 0, MSN 1, MO 0, with CRC, no markers. */
static const char MD_SEND_HELLO[] = "001741430000000000000000000000010000000068656c6c6f000000b990b10c";

/* ------------------------------------------------------------------ CRC */

Test(mpa_crc, check_values)
{
	/* RFC 3720 appendix B.4 and the usual CRC catalogue check value */
	cr_assert_eq(crc32c_bitwise((const uint8_t *)"123456789", 9), 0xe3069283u);
	cr_assert_eq(dg_crc32c("123456789", 9), 0xe3069283u);
	uint8_t z[32] = {0};
	cr_assert_eq(crc32c_bitwise(z, 32), 0x8a9136aau);
	cr_assert_eq(dg_crc32c(z, 32), 0x8a9136aau);
}

Test(mpa_crc, put_get_byte_order)
{
	/* RFC 5044 4.4 takes the CRC of iSCSI: RFC 3720 B.4 shows 32 zero bytes as "aa 36 91 8a",
	 * the value 0x8A9136AA least significant byte first (as Linux siw puts it on the wire). */
	uint8_t p[4];
	mpa_crc_put(p, 0x8a9136aau);
	const uint8_t want[4] = {0xaa, 0x36, 0x91, 0x8a};
	cr_assert_arr_eq(p, want, 4);
	cr_assert_eq(mpa_crc_get(p), 0x8a9136aau);
	mpa_crc_put(p, 0x01020304u);
	const uint8_t want2[4] = {0x04, 0x03, 0x02, 0x01};
	cr_assert_arr_eq(p, want2, 4);
	cr_assert_eq(mpa_crc_get(p), 0x01020304u);
	mpa_crc_put(p, 0xffffffffu);
	cr_assert_eq(mpa_crc_get(p), 0xffffffffu);
}

/* ------------------------------------------------------------------ MPA Request / Reply */

Test(mpa_rr, build_request_rev2_exact)
{
	uint8_t out[MPA_RR_MAX], want[64];
	struct mpa_v2_word v2 = {htobe16(64 | MPA_V2_IRD_P2P),
				 htobe16(16 | MPA_V2_ORD_WRITE_RTR | MPA_V2_ORD_READ_RTR)};
	size_t n = mpa_rr_build(out, true, MPA_FLAG_C, 2, &v2, NULL, 0);
	size_t wn = unhex(MD_REQUEST, want, sizeof want);
	cr_assert_eq(wn, 24u);
	cr_assert_eq(n, wn);
	cr_assert_arr_eq(out, want, n);
	/* field by field (RFC 5044 7.1, RFC 6581 5) */
	cr_assert_arr_eq(out, "MPA ID Req Frame", 16);
	cr_assert_eq(out[16], 0x50); /* C | E */
	cr_assert_eq(out[17], 2);
	cr_assert_eq(get_be16(out + 18), 4); /* only the IRD/ORD word */
	cr_assert_eq(get_be16(out + 20), 0x8040);
	cr_assert_eq(get_be16(out + 22), 0xc010);
}

Test(mpa_rr, build_reply_rev1_with_pdata)
{
	uint8_t out[MPA_RR_MAX];
	size_t n = mpa_rr_build(out, false, MPA_FLAG_M | MPA_FLAG_C, 1, NULL, "abc", 3);
	cr_assert_eq(n, 23u);
	cr_assert_arr_eq(out, "MPA ID Rep Frame", 16);
	cr_assert_eq(out[16], 0xc0);
	cr_assert_eq(out[17], 1);
	cr_assert_eq(out[18], 0);
	cr_assert_eq(out[19], 3);
	cr_assert_arr_eq(out + 20, "abc", 3);
}

Test(mpa_rr, build_clears_e_and_reserved_unless_v2)
{
	uint8_t out[MPA_RR_MAX];
	/* E and the 4 reserved bits come from v2 only (RFC 5044 7.1: Res zero when sent) */
	mpa_rr_build(out, false, 0xff, 2, NULL, NULL, 0);
	cr_assert_eq(out[16], MPA_FLAG_M | MPA_FLAG_C | MPA_FLAG_R);
	cr_assert_eq(get_be16(out + 18), 0);
	struct mpa_v2_word v2 = {htobe16(1), htobe16(2)};
	mpa_rr_build(out, false, MPA_FLAG_R, 2, &v2, NULL, 0);
	cr_assert_eq(out[16], MPA_FLAG_R | MPA_FLAG_E);
	cr_assert_eq(get_be16(out + 18), 4);
	cr_assert_eq(get_be16(out + 20), 1);
	cr_assert_eq(get_be16(out + 22), 2);
}

Test(mpa_rr, private_data_limits)
{
	static uint8_t pd[MPA_MAX_PDATA], out[MPA_RR_MAX];
	for (unsigned i = 0; i < sizeof pd; i++)
		pd[i] = (uint8_t)(i * 13 + 1);
	const char *why;
	struct mpa_rr rr;
	const uint16_t lens[] = {0, 1, 511, 512};
	for (int rev = 1; rev <= 2; rev++)
		for (unsigned k = 0; k < sizeof lens / sizeof lens[0]; k++) {
			for (int withv2 = 0; withv2 <= (rev == 2); withv2++) {
				struct mpa_v2_word v2 = {htobe16(0x8005), htobe16(0x4007)};
				for (int req = 0; req <= 1; req++) {
					size_t n = mpa_rr_build(out, req, MPA_FLAG_C, (uint8_t)rev, withv2 ? &v2 : NULL,
								pd, lens[k]);
					size_t total = MPA_RR_HLEN + lens[k] + (withv2 ? MPA_V2_LEN : 0);
					cr_assert_eq(n, total);
					why = NULL;
					cr_assert_eq(mpa_rr_check_hdr(out, req, &why), (int)total, "rev %d len %u v2 %d",
						     rev, lens[k], withv2);
					cr_assert_eq(mpa_rr_parse(out, n, req, &rr, &why), 0);
					cr_assert_eq(rr.req, (bool)req);
					cr_assert_eq(rr.rev, rev);
					cr_assert_eq(rr.enhanced, (bool)withv2);
					cr_assert_eq(rr.pd_len, lens[k]);
					cr_assert_eq(rr.pdata, out + MPA_RR_HLEN + (withv2 ? MPA_V2_LEN : 0));
					if (lens[k])
						cr_assert_arr_eq(rr.pdata, pd, lens[k]);
					if (withv2) {
						cr_assert_eq(rr.ird, 0x8005); /* raw words, control bits kept */
						cr_assert_eq(rr.ord, 0x4007);
					} else {
						cr_assert_eq(rr.ird, 0);
						cr_assert_eq(rr.ord, 0);
					}
				}
			}
		}
}

Test(mpa_rr, private_data_too_long)
{
	uint8_t h[MPA_RR_HLEN];
	/* 512 is the RFC 5044 7.1 limit; revision 2 with E adds the 4-byte IRD/ORD word */
	raw_hdr(h, MPA_KEY_REQ, 0, 1, 513);
	expect_hdr_reject(h, true, "rev 1, 513");
	raw_hdr(h, MPA_KEY_REQ, MPA_FLAG_E, 1, 516); /* E means nothing in revision 1 */
	expect_hdr_reject(h, true, "rev 1 with E, 516");
	raw_hdr(h, MPA_KEY_REP, 0, 2, 513); /* revision 2 without E: no word, 512 */
	expect_hdr_reject(h, false, "rev 2 without E, 513");
	raw_hdr(h, MPA_KEY_REP, MPA_FLAG_E, 2, 517);
	expect_hdr_reject(h, false, "rev 2 with E, 517");
	raw_hdr(h, MPA_KEY_REP, MPA_FLAG_E | MPA_FLAG_C, 2, 0xffff);
	expect_hdr_reject(h, false, "65535");
	/* the largest accepted ones */
	const char *why;
	raw_hdr(h, MPA_KEY_REQ, 0, 1, 512);
	cr_assert_eq(mpa_rr_check_hdr(h, true, &why), MPA_RR_HLEN + 512);
	raw_hdr(h, MPA_KEY_REQ, MPA_FLAG_E, 2, 516);
	cr_assert_eq(mpa_rr_check_hdr(h, true, &why), MPA_RR_HLEN + 516);
}

Test(mpa_rr, bad_keys)
{
	uint8_t h[MPA_RR_HLEN];
	raw_hdr(h, MPA_KEY_REP, MPA_FLAG_C, 2, 0);
	expect_hdr_reject(h, true, "Reply key where a Request is expected");
	raw_hdr(h, MPA_KEY_REQ, MPA_FLAG_C, 2, 0);
	expect_hdr_reject(h, false, "Request key where a Reply is expected");
	raw_hdr(h, "MPA ID Req frame", 0, 1, 0); /* case matters */
	expect_hdr_reject(h, true, "lower-case f");
	raw_hdr(h, "GET / HTTP/1.1\r\n", 0, 1, 0); /* a plain TCP peer */
	expect_hdr_reject(h, true, "HTTP");
	expect_hdr_reject(h, false, "HTTP (reply)");
	for (int i = 0; i < 16; i++) { /* every byte of the key is checked */
		raw_hdr(h, MPA_KEY_REQ, 0, 1, 0);
		h[i] ^= 0x01;
		expect_hdr_reject(h, true, "key byte flipped");
	}
}

Test(mpa_rr, bad_revision)
{
	uint8_t h[MPA_RR_HLEN];
	const uint8_t revs[] = {0, 3, 4, 0x80, 0xff};
	for (unsigned i = 0; i < sizeof revs; i++) {
		raw_hdr(h, MPA_KEY_REQ, MPA_FLAG_C, revs[i], 0);
		expect_hdr_reject(h, true, "revision");
		raw_hdr(h, MPA_KEY_REP, MPA_FLAG_C, revs[i], 0);
		expect_hdr_reject(h, false, "revision (reply)");
	}
}

Test(mpa_rr, reserved_flag_bits_ignored)
{
	/* RFC 5044 7.1: Res is ignored when received */
	uint8_t f[MPA_RR_HLEN];
	raw_hdr(f, MPA_KEY_REQ, MPA_FLAG_C | MPA_FLAG_RSVD, 1, 0);
	const char *why;
	struct mpa_rr rr;
	cr_assert_eq(mpa_rr_check_hdr(f, true, &why), MPA_RR_HLEN);
	cr_assert_eq(mpa_rr_parse(f, MPA_RR_HLEN, true, &rr, &why), 0);
	cr_assert_eq(rr.flags, MPA_FLAG_C | MPA_FLAG_RSVD);
	cr_assert_not(rr.enhanced);
}

Test(mpa_rr, enhanced_without_word)
{
	/* RFC 6581 5: with E the private data starts with the 4-byte IRD/ORD word */
	uint8_t f[MPA_RR_HLEN + 4] = {0};
	for (uint16_t pd = 0; pd < MPA_V2_LEN; pd++) {
		raw_hdr(f, MPA_KEY_REP, MPA_FLAG_E, 2, pd);
		const char *why = NULL;
		cr_assert_eq(mpa_rr_check_hdr(f, false, &why), (int)(MPA_RR_HLEN + pd));
		struct mpa_rr rr;
		cr_assert_eq(mpa_rr_parse(f, MPA_RR_HLEN + pd, false, &rr, &why), -EPROTO, "pd_len %u", pd);
		cr_assert_not_null(why);
	}
	/* exactly the word: enhanced, no application private data */
	raw_hdr(f, MPA_KEY_REP, MPA_FLAG_E, 2, 4);
	f[20] = 0x80;
	f[21] = 0x10;
	f[22] = 0x80;
	f[23] = 0x08;
	struct mpa_rr rr;
	const char *why;
	cr_assert_eq(mpa_rr_parse(f, sizeof f, false, &rr, &why), 0);
	cr_assert(rr.enhanced);
	cr_assert_eq(rr.pd_len, 0);
	cr_assert_eq(rr.ird & MPA_V2_MASK, 16);
	cr_assert(rr.ird & MPA_V2_IRD_P2P);
	cr_assert_eq(rr.ord & MPA_V2_MASK, 8);
	cr_assert(rr.ord & MPA_V2_ORD_WRITE_RTR);
	/* the same bytes under revision 1 are plain private data */
	f[17] = 1;
	cr_assert_eq(mpa_rr_parse(f, sizeof f, false, &rr, &why), 0);
	cr_assert_not(rr.enhanced);
	cr_assert_eq(rr.pd_len, 4);
	cr_assert_eq(rr.flags & MPA_FLAG_E, MPA_FLAG_E);
}

Test(mpa_rr, parse_length_mismatch_and_header_errors)
{
	uint8_t out[MPA_RR_MAX];
	size_t n = mpa_rr_build(out, true, MPA_FLAG_C, 1, NULL, "xyz", 3);
	struct mpa_rr rr;
	const char *why = NULL;
	cr_assert_eq(mpa_rr_parse(out, n - 1, true, &rr, &why), -EPROTO);
	cr_assert_not_null(why);
	why = NULL;
	cr_assert_eq(mpa_rr_parse(out, n + 1, true, &rr, &why), -EPROTO);
	cr_assert_not_null(why);
	why = NULL;
	cr_assert_eq(mpa_rr_parse(out, n, false, &rr, &why), -EPROTO, "Request parsed as a Reply");
	cr_assert_not_null(why);
	out[17] = 9;
	why = NULL;
	cr_assert_eq(mpa_rr_parse(out, n, true, &rr, &why), -EPROTO);
	cr_assert_not_null(why);
}

Test(mpa_rr, reject_reply)
{
	/* what dgv_reject sends: a Reply with R and the rejecter's private data */
	uint8_t out[MPA_RR_MAX];
	size_t n = mpa_rr_build(out, false, MPA_FLAG_R, 2, NULL, "no", 2);
	struct mpa_rr rr;
	const char *why;
	cr_assert_eq(mpa_rr_parse(out, n, false, &rr, &why), 0);
	cr_assert(rr.flags & MPA_FLAG_R);
	cr_assert_eq(rr.pd_len, 2);
	cr_assert_arr_eq(rr.pdata, "no", 2);
}

/* ------------------------------------------------------------------ FPDU arithmetic */

Test(mpa_len, pad_and_fpdu_len)
{
	/* RFC 5044 4.1: PAD makes ULPDU_Length + ULPDU + PAD a multiple of 4 */
	cr_assert_eq(mpa_pad(0), 2u);
	cr_assert_eq(mpa_pad(1), 1u);
	cr_assert_eq(mpa_pad(2), 0u);
	cr_assert_eq(mpa_pad(3), 3u);
	cr_assert_eq(mpa_pad(14), 0u); /* bare tagged header */
	cr_assert_eq(mpa_pad(18), 0u); /* bare untagged header */
	cr_assert_eq(mpa_pad(23), 3u); /* the "hello" Send */
	cr_assert_eq(mpa_pad(65534), 0u);
	cr_assert_eq(mpa_pad(65535), 3u);
	cr_assert_eq(mpa_fpdu_len(14), 20u);
	cr_assert_eq(mpa_fpdu_len(23), 32u);
	cr_assert_eq(mpa_fpdu_len(46), 52u); /* Read Request: 18 + 28 */
	cr_assert_eq(mpa_fpdu_len(65535), 65544u);
	for (uint32_t u = 0; u <= 70000; u++) {
		uint32_t p = mpa_pad(u);
		cr_assert_lt(p, 4u);
		cr_assert_eq((MPA_HDR_LEN + u + p) % 4, 0u);
		cr_assert_eq(mpa_fpdu_len(u), MPA_HDR_LEN + u + p + MPA_CRC_LEN);
	}
}

Test(mpa_len, mulpdu_values)
{
	/* RFC 5044 section 8 (MULPDU): EMSS - (6 + EMSS mod 4), minus 4 * ceil(EMSS / 512) with
	 * markers */
	cr_assert_eq(mpa_mulpdu(1460, false), 1454u);
	cr_assert_eq(mpa_mulpdu(1460, true), 1442u);
	cr_assert_eq(mpa_mulpdu(1448, false), 1442u); /* 1500 MTU with TCP timestamps */
	cr_assert_eq(mpa_mulpdu(1448, true), 1430u);
	cr_assert_eq(mpa_mulpdu(1449, false), 1442u);
	cr_assert_eq(mpa_mulpdu(1451, false), 1442u);
	cr_assert_eq(mpa_mulpdu(1452, false), 1446u);
	cr_assert_eq(mpa_mulpdu(65483, false), 65474u); /* loopback, MTU 65536 */
	cr_assert_eq(mpa_mulpdu(65483, true), 64962u);
	cr_assert_eq(mpa_mulpdu(65535, false), 65526u); /* 65535 - 6 - (65535 mod 4 = 3) */
	/* the 16-bit ULPDU_Length caps it at 65534 (65535 would need pad) */
	cr_assert_eq(mpa_mulpdu(65540, false), 65534u);
	cr_assert_eq(mpa_mulpdu(100000, false), 65534u);
	cr_assert_eq(mpa_mulpdu(1u << 20, true), 65534u);
	/* a nonsense MSS still gives a usable, aligned size */
	cr_assert_eq(mpa_mulpdu(0, false), 58u);
	cr_assert_eq(mpa_mulpdu(10, true), 58u);
}

Test(mpa_len, mulpdu_properties)
{
	for (uint32_t emss = 128; emss <= 70000; emss++)
		for (int mk = 0; mk <= (emss % 13 == 0 || emss > 65400); mk++) {
			uint32_t m = mpa_mulpdu(emss, mk);
			cr_assert_eq((m + 2) % 4, 0u, "emss %u: ULPDU + 2 not a multiple of 4", emss);
			cr_assert_leq(m, 65534u);
			cr_assert_eq(mpa_pad(m), 0u);
			uint32_t f = mpa_fpdu_len(m);
			if (mk) {
				/* wherever it starts in the marked stream (FPDUs start 4-aligned) */
				for (uint64_t pos = 0; pos < 512; pos += 4)
					cr_assert_leq(mpa_raw_len(pos, f), emss, "emss %u pos %lu", emss,
						      (unsigned long)pos);
			} else {
				cr_assert_leq(f, emss);
				if (emss < 65540)
					cr_assert_gt(f + 4, emss, "emss %u: MULPDU %u is not the largest", emss, m);
			}
		}
}

/* ------------------------------------------------------------------ markers */

Test(mpa_marker, markers_in)
{
	cr_assert_eq(mpa_markers_in(0, 0), 0u);
	cr_assert_eq(mpa_markers_in(512, 0), 0u);
	cr_assert_eq(mpa_markers_in(0, 1), 1u);
	cr_assert_eq(mpa_markers_in(1, 511), 0u); /* [1, 512) */
	cr_assert_eq(mpa_markers_in(1, 512), 1u); /* [1, 513) */
	cr_assert_eq(mpa_markers_in(511, 2), 1u);
	cr_assert_eq(mpa_markers_in(512, 1), 1u);
	cr_assert_eq(mpa_markers_in(100, 412), 0u);
	cr_assert_eq(mpa_markers_in(100, 413), 1u);
	cr_assert_eq(mpa_markers_in(0, 1025), 3u); /* 0, 512, 1024 */
	cr_assert_eq(mpa_markers_in(0, 1024), 2u);
	cr_assert_eq(mpa_markers_in((1ull << 40) + 4, 512), 1u);
	for (uint64_t pos = 0; pos < 1100; pos += 5)
		for (uint64_t len = 0; len < 1600; len += 11) {
			uint64_t c = 0;
			for (uint64_t x = pos; x < pos + len; x++)
				c += x % 512 == 0;
			cr_assert_eq(mpa_markers_in(pos, len), c, "pos %lu len %lu", (unsigned long)pos,
				     (unsigned long)len);
		}
}

Test(mpa_marker, raw_len)
{
	cr_assert_eq(mpa_raw_len(0, 32), 36u);   /* marker in front */
	cr_assert_eq(mpa_raw_len(4, 32), 32u);
	cr_assert_eq(mpa_raw_len(480, 32), 32u); /* ends exactly at 512: that marker is the next FPDU's */
	cr_assert_eq(mpa_raw_len(484, 32), 36u); /* marker between pad and CRC */
	cr_assert_eq(mpa_raw_len(412, 304), 308u);
	cr_assert_eq(mpa_raw_len(1536, 1000), 1008u);
	cr_assert_eq(mpa_raw_len(0, 1536), 1552u); /* 0, 512, 1024 and 1536: 12 octets are left */
	cr_assert_eq(mpa_raw_len(0, 65544), 65544u + 4u * 130u); /* markers up to 66048 */
	/* the fixed point: flen + 4 * (markers inside the wire length) */
	for (uint64_t pos = 0; pos < 1024; pos += 4)
		for (uint32_t f = 8; f < 3000; f += 4) {
			uint32_t r = mpa_raw_len(pos, f);
			cr_assert_eq(r, f + MPA_MARKER_LEN * mpa_markers_in(pos, r));
		}
}

/* Builds the FPDU of ulpdu (len bytes) at stream position pos, checks the markers where the RFC
 * puts them, strips them and compares with the unmarked FPDU. */
static void marked_round_trip(const uint8_t *ulpdu, uint16_t len, uint64_t pos)
{
	static uint8_t flat[70000], marked[72000], back[72000];
	size_t fn = mpa_fpdu_build(flat, ulpdu, len, true, -1);
	cr_assert_eq(fn, mpa_fpdu_len(len));
	size_t rn = mpa_fpdu_build(marked, ulpdu, len, true, (int64_t)pos);
	cr_assert_eq(rn, mpa_raw_len(pos, (uint32_t)fn), "pos %lu len %u", (unsigned long)pos, len);
	/* RFC 5044 4.4: the CRC covers everything before it, markers included */
	cr_assert_eq(mpa_crc_get(marked + rn - 4), crc32c_bitwise(marked, rn - 4));
	/* a marker at every stream position that is a multiple of 512, pointing back to the
	 * FPDU's first octet; the bytes between the markers are the unmarked FPDU in order */
	size_t fi = 0;
	for (size_t i = 0; i < rn - 4;) {
		if ((pos + i) % 512 == 0) {
			cr_assert_eq(get_be16(marked + i), 0, "marker reserved field");
			cr_assert_eq((size_t)get_be16(marked + i + 2), i, "FPDUPTR at raw offset %zu", i);
			i += 4;
			continue;
		}
		cr_assert_eq(marked[i], flat[fi], "raw offset %zu", i);
		i++;
		fi++;
	}
	cr_assert_eq(fi, fn - 4, "all of the FPDU but its CRC before the CRC");
	int n = mpa_strip_markers(back, marked, (uint32_t)rn, pos);
	cr_assert_eq(n, (int)fn);
	/* the CRC differs (it covers the markers); everything else is the unmarked FPDU */
	cr_assert_arr_eq(back, flat, fn - 4);
	cr_assert_eq(mpa_crc_get(back + fn - 4), mpa_crc_get(marked + rn - 4));
}

Test(mpa_marker, marker_at_start)
{
	uint8_t u[23];
	memcpy(u, "\x41\x43\0\0\0\0\0\0\0\0\0\0\0\x01\0\0\0\0hello", 23);
	uint8_t out[64];
	size_t n = mpa_fpdu_build(out, u, 23, true, 0);
	cr_assert_eq(n, 36u);
	const uint8_t mk[4] = {0, 0, 0, 0}; /* RFC 5044 4.3: the first marker's FPDUPTR is 0 */
	cr_assert_arr_eq(out, mk, 4);
	cr_assert_eq(get_be16(out + 4), 23);
	marked_round_trip(u, 23, 0);
	marked_round_trip(u, 23, 512 * 1000);
}

Test(mpa_marker, marker_in_middle)
{
	static uint8_t u[300];
	for (unsigned i = 0; i < sizeof u; i++)
		u[i] = (uint8_t)(i ^ 0x5a);
	uint8_t out[400];
	/* FPDU of 2 + 300 + 2 pad + 4 CRC = 308 starting 100 octets before a marker */
	size_t n = mpa_fpdu_build(out, u, 300, false, 412);
	cr_assert_eq(n, 312u);
	cr_assert_eq(get_be16(out), 300);
	cr_assert_eq(get_be16(out + 100), 0);
	cr_assert_eq(get_be16(out + 102), 100); /* FPDUPTR: 100 octets back to the length field */
	cr_assert_arr_eq(out + 2, u, 98);
	cr_assert_arr_eq(out + 104, u + 98, 202);
	cr_assert_eq(mpa_crc_get(out + n - 4), 0u, "CRC off: zero");
	marked_round_trip(u, 300, 412);
}

Test(mpa_marker, marker_before_crc)
{
	uint8_t u[23];
	memset(u, 0x77, sizeof u);
	uint8_t out[64];
	/* 484 + 28 = 512: the marker falls between the pad and the CRC and never splits it */
	size_t n = mpa_fpdu_build(out, u, 23, true, 484);
	cr_assert_eq(n, 36u);
	const uint8_t pad[3] = {0, 0, 0};
	cr_assert_arr_eq(out + 25, pad, 3);
	cr_assert_eq(get_be16(out + 28), 0);
	cr_assert_eq(get_be16(out + 30), 28);
	cr_assert_eq(mpa_crc_get(out + 32), crc32c_bitwise(out, 32));
	marked_round_trip(u, 23, 484);
	/* one octet group earlier the FPDU ends exactly at 512: no marker in it */
	n = mpa_fpdu_build(out, u, 23, true, 480);
	cr_assert_eq(n, 32u);
	marked_round_trip(u, 23, 480);
}

Test(mpa_marker, round_trips_everywhere)
{
	static uint8_t u[4000];
	for (unsigned i = 0; i < sizeof u; i++)
		u[i] = (uint8_t)(i * 31 + 7);
	const uint16_t lens[] = {14, 15, 16, 17, 18, 23, 46, 505, 506, 507, 508, 509, 510, 511, 512, 1022,
				 1454, 3999};
	for (unsigned k = 0; k < sizeof lens / sizeof lens[0]; k++)
		for (uint64_t pos = 0; pos < 1024; pos += 4)
			marked_round_trip(u, lens[k], pos);
	/* the largest marked ULPDU rc_tx.c sends (MULPDU of the loopback MSS 65483 with markers):
	 * 127 or 128 markers, every FPDUPTR still below 65536 */
	static uint8_t big[65535];
	memset(big, 0xa5, sizeof big);
	uint16_t m = (uint16_t)mpa_mulpdu(65483, true);
	marked_round_trip(big, m, 0);
	marked_round_trip(big, m, 508);
	marked_round_trip(big, m, 4);
}

Test(mpa_marker, several_markers_point_back_to_the_fpdu)
{
	static uint8_t u[1400], out[1500];
	memset(u, 1, sizeof u);
	/* FPDU at stream position 1024 + 8: markers at raw offsets 504 and 1016 */
	size_t n = mpa_fpdu_build(out, u, 1400, true, 1032);
	cr_assert_eq(n, mpa_fpdu_len(1400) + 8);
	cr_assert_eq(get_be16(out + 504 + 2), 504);
	cr_assert_eq(get_be16(out + 1016 + 2), 1016);
	/* FPDU that starts with a marker: the FPDU's first octet is that marker (FPDUPTR 0), and
	 * later markers count from it (see docs/wire.md 12.5) */
	n = mpa_fpdu_build(out, u, 1400, true, 2048);
	cr_assert_eq(get_be16(out + 2), 0);
	cr_assert_eq(get_be16(out + 512 + 2), 512);
	cr_assert_eq(get_be16(out + 1024 + 2), 1024);
	cr_assert_eq(n, mpa_fpdu_len(1400) + 12);
}

Test(mpa_marker, corrupted_markers_rejected)
{
	static uint8_t u[600], out[700], back[700];
	memset(u, 0x3c, sizeof u);
	const uint64_t pos = 412; /* marker at raw offset 100 */
	size_t n = mpa_fpdu_build(out, u, 600, true, (int64_t)pos);
	cr_assert_eq(mpa_strip_markers(back, out, (uint32_t)n, pos), (int)mpa_fpdu_len(600));
	/* FPDUPTR off by 4 (and by one bit, and zero) */
	const uint16_t bad_ptr[] = {96, 104, 101, 0, 0xffff};
	for (unsigned i = 0; i < sizeof bad_ptr / sizeof bad_ptr[0]; i++) {
		uint8_t c[700];
		memcpy(c, out, n);
		c[102] = (uint8_t)(bad_ptr[i] >> 8);
		c[103] = (uint8_t)bad_ptr[i];
		cr_assert_eq(mpa_strip_markers(back, c, (uint32_t)n, pos), -EPROTO, "FPDUPTR %u", bad_ptr[i]);
	}
	/* reserved field not zero: rejected (docs/wire.md 12.5 says why we are stricter here) */
	for (int b = 0; b < 16; b++) {
		uint8_t c[700];
		memcpy(c, out, n);
		c[100 + b / 8] ^= (uint8_t)(0x80 >> (b % 8));
		cr_assert_eq(mpa_strip_markers(back, c, (uint32_t)n, pos), -EPROTO, "reserved bit %d", b);
	}
	/* a marker cut short by the end of the buffer */
	uint8_t t[8] = {0};
	cr_assert_eq(mpa_strip_markers(back, t, 2, 0), -EPROTO);
	/* the stream position is wrong: the marker is read where it is not */
	cr_assert_eq(mpa_strip_markers(back, out, (uint32_t)n, pos + 4), -EPROTO);
}

/* ------------------------------------------------------------------ FPDUs */

Test(mpa_fpdu, unmarked_layout_and_crc_off)
{
	uint8_t u[19], out[64];
	for (int i = 0; i < 19; i++)
		u[i] = (uint8_t)(0xf0 + i);
	size_t n = mpa_fpdu_build(out, u, 19, false, -1);
	cr_assert_eq(n, 2u + 19u + 3u + 4u);
	cr_assert_eq(get_be16(out), 19);
	cr_assert_arr_eq(out + 2, u, 19);
	const uint8_t zero[7] = {0};
	cr_assert_arr_eq(out + 21, zero, 7, "pad and (CRC off) CRC field are zero");
	n = mpa_fpdu_build(out, u, 19, true, -1);
	cr_assert_arr_eq(out + 21, zero, 3);
	cr_assert_eq(mpa_crc_get(out + 24), crc32c_bitwise(out, 24));
}

/* ------------------------------------------------------------------ DDP headers */

Test(mpa_ddp, tagged_header_bytes)
{
	struct ddp_tagged_hdr h;
	rc_put_tagged(&h, RDMAP_WRITE, true, 0x12345678u, 0x0011223344556677ull);
	const uint8_t want[14] = {0xc1, 0x40, 0x12, 0x34, 0x56, 0x78, 0x00, 0x11,
				  0x22, 0x33, 0x44, 0x55, 0x66, 0x77};
	cr_assert_arr_eq(&h, want, 14);
	rc_put_tagged(&h, RDMAP_READ_RESP, false, 0xdeadbeefu, 0xfedcba9876543210ull);
	const uint8_t want2[14] = {0x81, 0x42, 0xde, 0xad, 0xbe, 0xef, 0xfe, 0xdc,
				   0xba, 0x98, 0x76, 0x54, 0x32, 0x10};
	cr_assert_arr_eq(&h, want2, 14);
	rc_put_tagged(&h, RDMAP_WRITE_RECORD, true, 1, 0);
	const uint8_t want3[14] = {0xc1, 0x48, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
	cr_assert_arr_eq(&h, want3, 14);
	/* the opcode is masked to 4 bits: nothing leaks into the reserved bits */
	rc_put_tagged(&h, 0xf7, false, 0, 0);
	cr_assert_eq(((uint8_t *)&h)[0], 0x81);
	cr_assert_eq(((uint8_t *)&h)[1], 0x47);
}

Test(mpa_ddp, untagged_header_bytes)
{
	struct ddp_untagged_hdr h;
	rc_put_untagged(&h, RDMAP_SEND_SE_INV, false, DDP_QN_SEND, 0x01020304u, 0x05060708u, 0xa1b2c3d4u);
	const uint8_t want[18] = {0x01, 0x46, 0xa1, 0xb2, 0xc3, 0xd4, 0, 0, 0, 0,
				  0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
	cr_assert_arr_eq(&h, want, 18);
	rc_put_untagged(&h, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, 1, 0, 0);
	const uint8_t want2[18] = {0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0};
	cr_assert_arr_eq(&h, want2, 18);
	rc_put_untagged(&h, RDMAP_TERMINATE, true, DDP_QN_TERMINATE, 0xffffffffu, 0, 0);
	const uint8_t want3[18] = {0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
	cr_assert_arr_eq(&h, want3, 18);
}

/* ------------------------------------------------------------------ worked examples */

Test(mpa_example, rtr_write_fpdu)
{
	uint8_t want[32], out[64];
	size_t wn = unhex(MD_RTR_WRITE, want, sizeof want);
	cr_assert_eq(wn, 20u);
	struct ddp_tagged_hdr h;
	rc_put_tagged(&h, RDMAP_WRITE, true, 1, 0);
	size_t n = mpa_fpdu_build(out, &h, sizeof h, true, -1);
	cr_assert_eq(n, wn);
	cr_assert_arr_eq(out, want, n);
	cr_assert_eq(crc32c_bitwise(out, 16), 0x5f4cd3ebu);
}

Test(mpa_example, send_hello_fpdu)
{
	uint8_t want[64], out[64];
	size_t wn = unhex(MD_SEND_HELLO, want, sizeof want);
	cr_assert_eq(wn, 32u);
	uint8_t u[DDP_UNTAGGED_HLEN + 5];
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_SEND, true, DDP_QN_SEND, 1, 0, 0);
	memcpy(u + DDP_UNTAGGED_HLEN, "hello", 5);
	size_t n = mpa_fpdu_build(out, u, sizeof u, true, -1);
	cr_assert_eq(n, wn);
	cr_assert_arr_eq(out, want, n);
	/* the CRC, independently: bitwise over the 28 octets before it, least significant first */
	cr_assert_eq(crc32c_bitwise(out, 28), 0x0cb190b9u);
	const uint8_t crc_bytes[4] = {0xb9, 0x90, 0xb1, 0x0c};
	cr_assert_arr_eq(out + 28, crc_bytes, 4);
	/* and back: the receiver's view */
	cr_assert_eq(get_be16(out), sizeof u);
	cr_assert_eq(mpa_fpdu_len(get_be16(out)), 32u);
	cr_assert_arr_eq(out + 2 + DDP_UNTAGGED_HLEN, "hello", 5);
}

/* docs/wire.md must still carry the hex strings above; found next to the build directory
 * (build/tests/unit/test_mpa -> docs/wire.md), skipped when the tree is laid out otherwise. */
Test(mpa_example, rc_wire_md_text_matches)
{
	char exe[4096];
	ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 64);
	if (k <= 0)
		cr_skip_test("no /proc/self/exe");
	exe[k] = 0;
	FILE *fp = NULL;
	for (int up = 3; up <= 4 && !fp; up++) {
		char path[4200];
		snprintf(path, sizeof path, "%s", exe);
		for (int i = 0; i < up; i++) {
			char *slash = strrchr(path, '/');
			if (slash)
				*slash = 0;
		}
		strcat(path, "/docs/wire.md");
		fp = fopen(path, "r");
	}
	if (!fp)
		cr_skip_test("docs/wire.md not found next to the build directory");
	static char text[1 << 20];
	size_t len = fread(text, 1, sizeof text - 1, fp);
	fclose(fp);
	text[len] = 0;
	cr_assert_not_null(strstr(text, "## 12. RC: standard iWARP over TCP"), "wire.md lost section 12");
	cr_assert_not_null(strstr(text, MD_REQUEST), "wire.md lost the MPA Request hex line");
	cr_assert_not_null(strstr(text, MD_RTR_WRITE), "wire.md lost the RTR hex line");
	cr_assert_not_null(strstr(text, MD_SEND_HELLO), "wire.md lost the Send hex line");
}
