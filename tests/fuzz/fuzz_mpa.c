/*
 * fuzz_mpa.c - MPA (RFC 5044, RFC 6581) framing of RC (verbs_backend/soft/mpa.c): the
 * Request/Reply frame checks, and marker removal as the FPDU receive path applies it.
 *
 * Input: a selector byte, then:
 *   0, 1  an MPA Request (0) or Reply (1) frame: header check, then the whole-frame parse; an
 *         accepted frame must come out of mpa_rr_build byte for byte;
 *   2     a big-endian 16-bit stream position, then marked FPDU bytes for mpa_strip_markers;
 *         what it accepts must be exactly as long as mpa_raw_len() says the wire form is;
 *   3     a position (rounded down to a multiple of 4), a CRC flag, then a ULPDU: mpa_fpdu_build then mpa_strip_markers must
 *         give back the length field, the ULPDU, zero pad and a CRC over them.
 * The RC receive state machine itself is fuzz_rc.c.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "crc.h"
#include "fuzz.h"
#include "mpa.h"

static void rr(const uint8_t *d, size_t n, bool req)
{
	if (n < MPA_RR_HLEN)
		return;
	uint8_t *buf = malloc(n);
	memcpy(buf, d, n);
	const char *why = NULL;
	int len = mpa_rr_check_hdr(buf, req, &why);
	if (len < 0) {
		FUZZ_CHECK(len == -EPROTO && why);
		free(buf);
		return;
	}
	FUZZ_CHECK(len >= MPA_RR_HLEN && len <= (int)MPA_RR_MAX);
	if ((size_t)len > n) {
		free(buf);
		return;
	}
	struct mpa_rr out;
	/* the parse must refuse a length other than the header's */
	if ((size_t)len < n)
		FUZZ_CHECK(mpa_rr_parse(buf, n, req, &out, &why) == -EPROTO);
	if (mpa_rr_parse(buf, (size_t)len, req, &out, &why)) {
		free(buf);
		return;
	}
	FUZZ_CHECK(out.req == req && (out.rev == 1 || out.rev == 2));
	FUZZ_CHECK(out.pd_len <= MPA_MAX_PDATA + MPA_V2_LEN);
	FUZZ_CHECK(out.pdata + out.pd_len == buf + len);
	/* frames the builder can make: no reserved flag bits, E only with the v2 word */
	if (!(out.flags & MPA_FLAG_RSVD) && (!(out.flags & MPA_FLAG_E) || out.enhanced) &&
	    out.pd_len <= MPA_MAX_PDATA) {
		struct mpa_v2_word w = {htobe16(out.ird), htobe16(out.ord)};
		uint8_t again[MPA_RR_MAX];
		size_t m = mpa_rr_build(again, req, out.flags, out.rev, out.enhanced ? &w : NULL, out.pdata,
					out.pd_len);
		FUZZ_CHECK(m == (size_t)len && memcmp(again, buf, m) == 0);
	}
	free(buf);
}

static void strip(struct fz *f)
{
	uint64_t pos = fz_u16(f);
	size_t n;
	const uint8_t *raw = fz_bytes(f, f->n, &n);
	uint8_t *in = malloc(n ? n : 1), *dst = malloc(n ? n : 1);
	memcpy(in, raw, n);
	int r = mpa_strip_markers(dst, in, (uint32_t)n, pos);
	if (r >= 0) {
		FUZZ_CHECK((size_t)r <= n);
		/* on the aligned positions FPDUs start at, the wire form is as long as rx_parse
		 * computes it (mpa_raw_len); an FPDU never ends in a marker (the CRC is last) */
		bool ends_in_marker = n >= MPA_MARKER_LEN && (pos + n - MPA_MARKER_LEN) % MPA_MARKER_SPACING == 0;
		if (pos % 4 == 0 && n % 4 == 0 && r > 0 && !ends_in_marker)
			FUZZ_CHECK(mpa_raw_len(pos, (uint32_t)r) == n);
		FUZZ_CHECK(n - (size_t)r == MPA_MARKER_LEN * mpa_markers_in(pos, n));
	} else {
		FUZZ_CHECK(r == -EPROTO);
	}
	free(in);
	free(dst);
}

static void roundtrip(struct fz *f)
{
	/* FPDUs are multiples of 4 and so are markers: every FPDU starts 4-aligned in the stream,
	 * which is what keeps a marker from ever splitting the CRC */
	uint64_t pos = fz_u16(f) & ~3u;
	bool crc = fz_u8(f) & 1;
	size_t n;
	const uint8_t *ulpdu = fz_bytes(f, f->n, &n);
	if (n > MPA_MAX_ULPDU)
		n = MPA_MAX_ULPDU;
	uint32_t flen = mpa_fpdu_len((uint32_t)n);
	uint32_t raw = mpa_raw_len(pos, flen);
	uint8_t *wire = malloc(raw), *flat = malloc(raw), *plain = malloc(flen);
	FUZZ_CHECK(mpa_fpdu_build(wire, ulpdu, (uint16_t)n, crc, (int64_t)pos) == raw);
	FUZZ_CHECK(mpa_strip_markers(flat, wire, raw, pos) == (int)flen);
	FUZZ_CHECK(mpa_fpdu_build(plain, ulpdu, (uint16_t)n, crc, -1) == flen);
	/* the CRC covers the marked wire form, so only the rest compares with the plain build */
	FUZZ_CHECK(memcmp(flat, plain, flen - MPA_CRC_LEN) == 0);
	FUZZ_CHECK(flat[0] == (uint8_t)(n >> 8) && flat[1] == (uint8_t)n);
	FUZZ_CHECK(memcmp(flat + MPA_HDR_LEN, ulpdu, n) == 0);
	FUZZ_CHECK(mpa_crc_get(wire + raw - MPA_CRC_LEN) == (crc ? dg_crc32c(wire, raw - MPA_CRC_LEN) : 0));
	FUZZ_CHECK(flen % 4 == 0);
	free(wire);
	free(flat);
	free(plain);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = {data, size};
	switch (fz_u8(&f) & 3) {
	case 0:
		rr(f.p, f.n, true);
		break;
	case 1:
		rr(f.p, f.n, false);
		break;
	case 2:
		strip(&f);
		break;
	default:
		roundtrip(&f);
		break;
	}
	return 0;
}
