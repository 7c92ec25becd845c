/*
 * frame.c - encode and validate datagram-iWARP DDP/RDMAP segments (layouts in wire.h,
 * rationale in docs/wire.md).
 *
 * dg_seg_parse runs on every received datagram, so it never allocates or formats text: a
 * rejection is an RFC 5040/5041 error triple plus a pointer to a static reason.
 *
 * Error mapping for faults the RFCs do not name exactly:
 *  - a truncated DDP header, nonzero DDP control reserved bits and a nonzero extension rsvd
 *    field are "malformed DDP header": DDP / TAGGED_BUF or UNTAGGED_BUF (by the T bit) /
 *    INVALID_VERSION, the same triple as a wrong DV, because a peer speaking another DDP
 *    revision is the likeliest cause and the remedy is the same;
 *  - nonzero RDMAP control reserved bits, and a Read Request or Terminate payload too short
 *    for its RDMAP header, are "malformed RDMAP header": RDMAP / REMOTE_OP / INVALID_VERSION;
 *  - a Read Request message longer than 28 bytes overflows the fixed-size QN 1 buffer:
 *    DDP / UNTAGGED_BUF / MSG_TOO_LONG;
 *  - any inconsistency of mo, plen, ml, segsz and L: DDP / UNTAGGED_BUF / INVALID_MO when
 *    untagged, DDP / TAGGED_BUF / BASE_BOUNDS when tagged (the segment claims bytes outside
 *    the message it belongs to).
 * On rejection *seg still holds every field decoded before the failing check (hdr and hlen
 * at least, once the length covers the header), so the caller can build a Terminate naming
 * the offending MSN (paper 003 III.C).
 */
#include "frame.h"

#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

static inline uint16_t ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof v);
	return be16toh(v);
}

static inline uint32_t ld32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof v);
	return be32toh(v);
}

static inline uint64_t ld64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v);
	return be64toh(v);
}

static int reject(struct dg_reject *why, uint8_t layer, uint8_t etype, uint8_t ecode,
		  const char *reason)
{
	if (why) {
		why->layer = layer;
		why->etype = etype;
		why->ecode = ecode;
		why->reason = reason;
	}
	return -EPROTO;
}

/* Malformed DDP header: the code that means "cannot interpret this header" for the model. */
static int reject_ddp_malformed(struct dg_reject *why, bool tagged, const char *reason)
{
	if (tagged)
		return reject(why, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_VERSION,
			      reason);
	return reject(why, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_VERSION,
		      reason);
}

static int reject_rdmap_malformed(struct dg_reject *why, const char *reason)
{
	return reject(why, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
		      reason);
}

static int reject_bounds(struct dg_reject *why, bool tagged, const char *reason)
{
	if (tagged)
		return reject(why, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS, reason);
	return reject(why, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MO, reason);
}

static bool opcode_is_tagged(unsigned op)
{
	return op == RDMAP_WRITE || op == RDMAP_WRITE_RECORD || op == RDMAP_READ_RESP;
}

static uint32_t opcode_qn(unsigned op)
{
	switch (op) {
	case RDMAP_READ_REQ:
		return DDP_QN_READ_REQ;
	case RDMAP_TERMINATE:
		return DDP_QN_TERMINATE;
	default:
		return DDP_QN_SEND;
	}
}

int dg_seg_parse(const uint8_t *buf, size_t len, uint32_t max_msg, struct dg_seg *seg,
		 struct dg_reject *why)
{
	memset(seg, 0, sizeof *seg);
	seg->hdr = buf;

	/* The T bit is in the first byte, so even a 1-byte runt gets the right buffer model. */
	bool tagged = len >= 1 && (buf[0] & (DDP_CTRL_TAGGED >> 8));
	uint32_t hlen = tagged ? DG_TAGGED_HLEN : DG_UNTAGGED_HLEN;
	seg->tagged = tagged;
	if (len < hlen)
		return reject_ddp_malformed(why, tagged, "truncated header");
	/* ml is 32 bits and mo + plen <= ml, so a longer payload could never be valid; refusing
	 * it here keeps plen exact in 32 bits. */
	if (len - hlen > UINT32_MAX)
		return reject_bounds(why, tagged, "segment longer than any message");

	uint16_t ctrl = ld16(buf);
	unsigned op = ctrl & RDMAP_CTRL_OPCODE;
	uint32_t plen = (uint32_t)(len - hlen);
	uint16_t ext_rsvd;

	seg->opcode = (uint8_t)op;
	seg->last = (ctrl & DDP_CTRL_LAST) != 0;
	seg->hlen = hlen;
	seg->payload = buf + hlen;
	seg->plen = plen;
	if (tagged) {
		seg->stag = ld32(buf + offsetof(struct dg_tagged_hdr, stag));
		seg->to = ld64(buf + offsetof(struct dg_tagged_hdr, to));
		seg->msn = ld32(buf + offsetof(struct dg_tagged_hdr, msn));
		seg->mo = ld32(buf + offsetof(struct dg_tagged_hdr, mo));
		seg->ml = ld32(buf + offsetof(struct dg_tagged_hdr, ml));
		seg->segsz = ld16(buf + offsetof(struct dg_tagged_hdr, segsz));
		ext_rsvd = ld16(buf + offsetof(struct dg_tagged_hdr, rsvd));
	} else {
		seg->inv_stag = ld32(buf + offsetof(struct dg_untagged_hdr, inv_stag));
		seg->qn = ld32(buf + offsetof(struct dg_untagged_hdr, qn));
		seg->msn = ld32(buf + offsetof(struct dg_untagged_hdr, msn));
		seg->mo = ld32(buf + offsetof(struct dg_untagged_hdr, mo));
		seg->ml = ld32(buf + offsetof(struct dg_untagged_hdr, ml));
		seg->segsz = ld16(buf + offsetof(struct dg_untagged_hdr, segsz));
		ext_rsvd = ld16(buf + offsetof(struct dg_untagged_hdr, rsvd));
	}

	/* RD_MAGIC (0xd2) carries DV=2 and a reserved bit, so RD datagrams stop here. */
	if ((ctrl & DDP_CTRL_DV_MASK) != DDP_CTRL_DV_1)
		return reject_ddp_malformed(why, tagged, "DDP version is not 1");
	if ((ctrl & RDMAP_CTRL_RV_MASK) != RDMAP_CTRL_RV_1)
		return reject_rdmap_malformed(why, "RDMAP version is not 1");
	if (ctrl & DDP_CTRL_RSVD)
		return reject_ddp_malformed(why, tagged, "DDP control reserved bits set");
	if (ctrl & RDMAP_CTRL_RSVD)
		return reject_rdmap_malformed(why, "RDMAP control reserved bits set");
	if (ext_rsvd)
		return reject_ddp_malformed(why, tagged, "extension reserved field not zero");

	if (op > RDMAP_OPCODE_MAX)
		return reject(why, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP,
			      RDMAP_ECODE_UNEXPECTED_OPCODE, "unknown opcode");
	if (opcode_is_tagged(op) != tagged)
		return reject(why, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP,
			      RDMAP_ECODE_UNEXPECTED_OPCODE,
			      tagged ? "untagged opcode in a tagged segment"
				     : "tagged opcode in an untagged segment");
	if (!tagged && seg->qn != opcode_qn(op))
		return reject(why, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_QN,
			      "queue number does not match the opcode");

	uint32_t mo = seg->mo, ml = seg->ml, segsz = seg->segsz;
	if (ml > max_msg) {
		if (tagged)
			return reject(why, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF,
				      DDP_ECODE_T_BASE_BOUNDS, "message longer than the maximum");
		return reject(why, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_MSG_TOO_LONG,
			      "message longer than the maximum");
	}
	uint64_t end = (uint64_t)mo + plen;
	if (end > ml)
		return reject_bounds(why, tagged, "segment ends past the message length");
	if (!(mo == 0 && plen == ml)) {
		/* Multi-segment: the target indexes its validity bitmap by mo / segsz and sizes it
		 * by ml / segsz, so every one of these keeps that index in range and unique. */
		if (segsz < DG_MIN_SEGSZ)
			return reject_bounds(why, tagged, "segment size below the minimum");
		if (mo % segsz)
			return reject_bounds(why, tagged, "offset not a multiple of the segment size");
		if (plen == 0)
			return reject_bounds(why, tagged, "empty segment in a multi-segment message");
		if (seg->last ? plen > segsz : plen != segsz)
			return reject_bounds(why, tagged, "segment length differs from the segment size");
	}
	if (seg->last != (end == ml))
		return reject_bounds(why, tagged,
				     seg->last ? "last flag set before the message end"
					       : "last flag missing at the message end");
	if (tagged) {
		/* RFC 5041 7.2 TO wrap: neither the message base (to - mo) nor its end may leave
		 * the 64-bit tagged offset space. */
		uint64_t base = seg->to - mo;
		if (seg->to < mo || (ml && base + (ml - 1) < base))
			return reject(why, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_TO_WRAP,
				      "tagged offset wraps");
	}
	if (op == RDMAP_READ_REQ) {
		/* ml == 28 with the checks above already forces a single segment. */
		if (ml > DG_READ_REQ_LEN)
			return reject(why, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF,
				      DDP_ECODE_UT_MSG_TOO_LONG, "read request longer than 28 bytes");
		if (plen != DG_READ_REQ_LEN)
			return reject_rdmap_malformed(why, "read request shorter than 28 bytes");
	}
	if (op == RDMAP_TERMINATE && plen < DG_TERM_LEN)
		return reject_rdmap_malformed(why, "terminate shorter than 8 bytes");
	return 0;
}

/* The 16-bit DDP/RDMAP control field, network order (RFC 5041 4.2/4.3, RFC 5040 4.2). */
static be16 ctrl_make(bool tagged, uint8_t opcode, bool last)
{
	uint16_t ctrl = DDP_CTRL_DV_1 | RDMAP_CTRL_RV_1 | (opcode & RDMAP_CTRL_OPCODE);
	if (tagged)
		ctrl |= DDP_CTRL_TAGGED;
	if (last)
		ctrl |= DDP_CTRL_LAST;
	return htobe16(ctrl);
}

void dg_put_tagged(struct dg_tagged_hdr *h, uint8_t opcode, bool last, uint32_t stag, uint64_t to,
		   uint32_t msn, uint32_t mo, uint32_t ml, uint16_t segsz)
{
	h->ctrl = ctrl_make(true, opcode, last);
	h->stag = htobe32(stag);
	h->to = htobe64(to);
	h->msn = htobe32(msn);
	h->mo = htobe32(mo);
	h->ml = htobe32(ml);
	h->segsz = htobe16(segsz);
	h->rsvd = 0;
}

void dg_put_untagged(struct dg_untagged_hdr *h, uint8_t opcode, bool last, uint32_t qn,
		     uint32_t msn, uint32_t mo, uint32_t ml, uint16_t segsz, uint32_t inv_stag)
{
	h->ctrl = ctrl_make(false, opcode, last);
	h->inv_stag = htobe32(inv_stag);
	h->qn = htobe32(qn);
	h->msn = htobe32(msn);
	h->mo = htobe32(mo);
	h->ml = htobe32(ml);
	h->segsz = htobe16(segsz);
	h->rsvd = 0;
}

void dg_put_read_req(struct rdmap_read_req *r, uint32_t sink_stag, uint64_t sink_to,
		     uint32_t size, uint32_t src_stag, uint64_t src_to)
{
	r->sink_stag = htobe32(sink_stag);
	r->sink_to = htobe64(sink_to);
	r->read_size = htobe32(size);
	r->src_stag = htobe32(src_stag);
	r->src_to = htobe64(src_to);
}

int dg_gso_split(uint8_t *buf, size_t len, size_t gso, bool truncated, struct dg_gso_piece *out,
		 uint32_t max)
{
	/* gso > UINT32_MAX would not fit a piece; no UDP buffer is that large anyway. */
	if (!gso || !len || gso > len || truncated || gso > UINT32_MAX)
		return -EINVAL;
	size_t n = len / gso + (len % gso != 0);
	if (n > max)
		return -EINVAL;
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		size_t l = len - off < gso ? len - off : gso;
		out[i] = (struct dg_gso_piece){buf + off, (uint32_t)l};
		off += l;
	}
	return (int)n;
}

uint32_t dg_gso_max_segs(uint32_t dgram)
{
	if (!dgram)
		return 0;
	uint32_t n = DG_GSO_MAX_BYTES / dgram;
	return n > DG_GSO_MAX_SEGS ? DG_GSO_MAX_SEGS : n;
}

const char *dg_opcode_name(unsigned opcode)
{
	static const char *const names[] = {
		[RDMAP_WRITE] = "WRITE",
		[RDMAP_READ_REQ] = "READ_REQ",
		[RDMAP_READ_RESP] = "READ_RESP",
		[RDMAP_SEND] = "SEND",
		[RDMAP_SEND_INV] = "SEND_INV",
		[RDMAP_SEND_SE] = "SEND_SE",
		[RDMAP_SEND_SE_INV] = "SEND_SE_INV",
		[RDMAP_TERMINATE] = "TERMINATE",
		[RDMAP_WRITE_RECORD] = "WRITE_RECORD",
	};
	if (opcode >= sizeof names / sizeof names[0])
		return "UNKNOWN";
	return names[opcode];
}
