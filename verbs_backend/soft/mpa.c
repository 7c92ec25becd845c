/*
 * mpa.c - MPA Request/Reply frames, FPDU lengths, markers and CRC placement (RFC 5044,
 * RFC 6581), and the RC DDP headers (RFC 5041). Pure functions: see mpa.h.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "crc.h"
#include "mpa.h"

size_t mpa_rr_build(uint8_t *out, bool req, uint8_t flags, uint8_t rev, const struct mpa_v2_word *v2,
		    const void *pdata, uint16_t len)
{
	struct mpa_rr_hdr h;
	memcpy(h.key, req ? MPA_KEY_REQ : MPA_KEY_REP, 16);
	h.flags = (uint8_t)((flags & ~(MPA_FLAG_E | MPA_FLAG_RSVD)) | (v2 ? MPA_FLAG_E : 0));
	h.rev = rev;
	h.pd_len = htobe16((uint16_t)(len + (v2 ? MPA_V2_LEN : 0)));
	memcpy(out, &h, sizeof h);
	size_t n = sizeof h;
	if (v2) {
		memcpy(out + n, v2, MPA_V2_LEN);
		n += MPA_V2_LEN;
	}
	if (len)
		memcpy(out + n, pdata, len);
	return n + len;
}

int mpa_rr_check_hdr(const uint8_t *buf, bool req, const char **why)
{
	const struct mpa_rr_hdr *h = (const struct mpa_rr_hdr *)buf;
	if (memcmp(h->key, req ? MPA_KEY_REQ : MPA_KEY_REP, 16)) {
		*why = req ? "bad key (not \"MPA ID Req Frame\")" : "bad key (not \"MPA ID Rep Frame\")";
		return -EPROTO;
	}
	if (h->rev < 1 || h->rev > 2) {
		*why = "unsupported MPA revision (not 1 or 2)";
		return -EPROTO;
	}
	uint32_t pd = be16toh(h->pd_len);
	uint32_t max = MPA_MAX_PDATA + (h->rev == 2 && (h->flags & MPA_FLAG_E) ? MPA_V2_LEN : 0);
	if (pd > max) {
		*why = "private data longer than 512 bytes";
		return -EPROTO;
	}
	return (int)(MPA_RR_HLEN + pd);
}

int mpa_rr_parse(const uint8_t *buf, size_t len, bool req, struct mpa_rr *out, const char **why)
{
	int n = mpa_rr_check_hdr(buf, req, why);
	if (n < 0)
		return n;
	if ((size_t)n != len) {
		*why = "frame length does not match its private data length";
		return -EPROTO;
	}
	const struct mpa_rr_hdr *h = (const struct mpa_rr_hdr *)buf;
	memset(out, 0, sizeof *out);
	out->req = req;
	out->flags = h->flags;
	out->rev = h->rev;
	uint32_t pd = be16toh(h->pd_len);
	const uint8_t *p = buf + MPA_RR_HLEN;
	if (h->rev == 2 && (h->flags & MPA_FLAG_E)) {
		if (pd < MPA_V2_LEN) {
			*why = "enhanced (rev 2) frame without its IRD/ORD word";
			return -EPROTO;
		}
		struct mpa_v2_word w;
		memcpy(&w, p, sizeof w);
		out->enhanced = true;
		out->ird = be16toh(w.ird);
		out->ord = be16toh(w.ord);
		p += MPA_V2_LEN;
		pd -= MPA_V2_LEN;
	}
	out->pd_len = (uint16_t)pd;
	out->pdata = p;
	return 0;
}

uint32_t mpa_mulpdu(uint32_t emss, bool markers)
{
	if (markers)
		emss -= MPA_MARKER_LEN * ((emss + MPA_MARKER_SPACING - 1) / MPA_MARKER_SPACING);
	if (emss < 64)
		emss = 64;
	uint32_t l = ((emss - MPA_CRC_LEN) & ~3u) - MPA_HDR_LEN;
	return l > 65534 ? 65534 : l;
}

uint64_t mpa_markers_in(uint64_t pos, uint64_t len)
{
	if (!len)
		return 0;
	uint64_t first = (pos + MPA_MARKER_SPACING - 1) / MPA_MARKER_SPACING; /* ceil */
	uint64_t last = (pos + len - 1) / MPA_MARKER_SPACING;                 /* floor */
	return last >= first ? last - first + 1 : 0;
}

uint32_t mpa_raw_len(uint64_t pos, uint32_t flen)
{
	uint64_t r = flen;
	for (;;) {
		uint64_t want = flen + MPA_MARKER_LEN * mpa_markers_in(pos, r);
		if (want == r)
			return (uint32_t)r;
		r = want;
	}
}

/* Appends n bytes of src at *o of out, inserting markers at stream positions that are multiples
 * of 512 (pos: stream position of out[0], the FPDU's first octet). */
static void put_marked(uint8_t *out, size_t *o, const uint8_t *src, size_t n, uint64_t pos)
{
	while (n) {
		uint64_t cur = pos + *o;
		if (cur % MPA_MARKER_SPACING == 0) {
			struct mpa_marker m = {0, htobe16((uint16_t)*o)};
			memcpy(out + *o, &m, sizeof m);
			*o += sizeof m;
			cur += sizeof m;
		}
		size_t room = MPA_MARKER_SPACING - cur % MPA_MARKER_SPACING;
		size_t take = n < room ? n : room;
		memcpy(out + *o, src, take);
		*o += take;
		src += take;
		n -= take;
	}
}

size_t mpa_fpdu_build(uint8_t *out, const void *ulpdu, uint16_t len, bool crc, int64_t pos_markers)
{
	uint8_t lenf[2] = {(uint8_t)(len >> 8), (uint8_t)len};
	static const uint8_t zero[4];
	uint32_t pad = mpa_pad(len);
	size_t o = 0;
	if (pos_markers < 0) {
		memcpy(out, lenf, 2);
		memcpy(out + 2, ulpdu, len);
		memset(out + 2 + len, 0, pad);
		o = 2 + (size_t)len + pad;
	} else {
		uint64_t pos = (uint64_t)pos_markers;
		put_marked(out, &o, lenf, 2, pos);
		put_marked(out, &o, ulpdu, len, pos);
		put_marked(out, &o, zero, pad, pos);
		if ((pos + o) % MPA_MARKER_SPACING == 0) { /* a marker may precede the CRC, never split it */
			struct mpa_marker m = {0, htobe16((uint16_t)o)};
			memcpy(out + o, &m, sizeof m);
			o += sizeof m;
		}
	}
	mpa_crc_put(out + o, crc ? dg_crc32c(out, o) : 0);
	return o + MPA_CRC_LEN;
}

int mpa_strip_markers(uint8_t *dst, const uint8_t *raw, uint32_t rawlen, uint64_t pos)
{
	uint32_t i = 0, o = 0;
	while (i < rawlen) {
		uint64_t cur = pos + i;
		if (cur % MPA_MARKER_SPACING == 0) {
			struct mpa_marker m;
			if (rawlen - i < sizeof m)
				return -EPROTO;
			memcpy(&m, raw + i, sizeof m);
			if (m.rsvd || be16toh(m.fpduptr) != i)
				return -EPROTO;
			i += sizeof m;
			cur += sizeof m;
		}
		uint32_t room = MPA_MARKER_SPACING - (uint32_t)(cur % MPA_MARKER_SPACING);
		uint32_t take = rawlen - i < room ? rawlen - i : room;
		memcpy(dst + o, raw + i, take);
		o += take;
		i += take;
	}
	return (int)o;
}

static inline uint16_t rc_ctrl(bool tagged, bool last, uint8_t opcode)
{
	return (uint16_t)((tagged ? DDP_CTRL_TAGGED : 0) | (last ? DDP_CTRL_LAST : 0) | DDP_CTRL_DV_1 |
			  RDMAP_CTRL_RV_1 | (opcode & RDMAP_CTRL_OPCODE));
}

void rc_put_tagged(struct ddp_tagged_hdr *h, uint8_t opcode, bool last, uint32_t stag, uint64_t to)
{
	h->ctrl = htobe16(rc_ctrl(true, last, opcode));
	h->stag = htobe32(stag);
	h->to = htobe64(to);
}

void rc_put_untagged(struct ddp_untagged_hdr *h, uint8_t opcode, bool last, uint32_t qn, uint32_t msn,
		     uint32_t mo, uint32_t inv_stag)
{
	h->ctrl = htobe16(rc_ctrl(false, last, opcode));
	h->inv_stag = htobe32(inv_stag);
	h->qn = htobe32(qn);
	h->msn = htobe32(msn);
	h->mo = htobe32(mo);
}
