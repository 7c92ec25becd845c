/* test_frame.c - encoders, dg_seg_parse acceptance and every rejection path, docs/wire.md example. */
#include <criterion/criterion.h>

#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc.h"
#include "frame.h"
#include "wire.h"

#define MAXMSG (16u << 20)

static uint8_t buf[2048];

/* ------------------------------------------------------------------ helpers */

static size_t mk_tagged(uint8_t op, bool last, uint32_t stag, uint64_t to, uint32_t msn, uint32_t mo,
			uint32_t ml, uint16_t segsz, uint32_t plen)
{
	memset(buf, 0, sizeof buf);
	dg_put_tagged((struct dg_tagged_hdr *)buf, op, last, stag, to, msn, mo, ml, segsz);
	for (uint32_t i = 0; i < plen; i++)
		buf[DG_TAGGED_HLEN + i] = (uint8_t)(i * 7 + 1);
	return DG_TAGGED_HLEN + plen;
}

static size_t mk_untagged(uint8_t op, bool last, uint32_t qn, uint32_t msn, uint32_t mo, uint32_t ml,
			  uint16_t segsz, uint32_t inv, uint32_t plen)
{
	memset(buf, 0, sizeof buf);
	dg_put_untagged((struct dg_untagged_hdr *)buf, op, last, qn, msn, mo, ml, segsz, inv);
	for (uint32_t i = 0; i < plen; i++)
		buf[DG_UNTAGGED_HLEN + i] = (uint8_t)(i * 5 + 3);
	return DG_UNTAGGED_HLEN + plen;
}

static void set16(size_t off, uint16_t v)
{
	v = htobe16(v);
	memcpy(buf + off, &v, 2);
}

static uint16_t get16(size_t off)
{
	uint16_t v;
	memcpy(&v, buf + off, 2);
	return be16toh(v);
}

/* Parses buf[0..len) and asserts the rejection triple. */
static void expect_reject(size_t len, uint32_t max_msg, uint8_t layer, uint8_t etype, uint8_t ecode,
			  const char *what)
{
	struct dg_seg seg;
	struct dg_reject why = {0xee, 0xee, 0xee, NULL};
	int rc = dg_seg_parse(buf, len, max_msg, &seg, &why);
	cr_assert_eq(rc, -EPROTO, "%s: accepted", what);
	cr_assert_eq(why.layer, layer, "%s: layer %u", what, why.layer);
	cr_assert_eq(why.etype, etype, "%s: etype %u", what, why.etype);
	cr_assert_eq(why.ecode, ecode, "%s: ecode 0x%02x", what, why.ecode);
	cr_assert_not_null(why.reason, "%s: no reason", what);
	cr_assert_gt(strlen(why.reason), 0);
	cr_assert_eq(seg.hdr, buf);
}

static void expect_ok(size_t len, uint32_t max_msg, struct dg_seg *seg, const char *what)
{
	struct dg_reject why = {0, 0, 0, NULL};
	int rc = dg_seg_parse(buf, len, max_msg, seg, &why);
	cr_assert_eq(rc, 0, "%s: rejected: %s (%u/%u/0x%02x)", what, why.reason ? why.reason : "?",
		     why.layer, why.etype, why.ecode);
}

#define T_BAD_VER TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_VERSION
#define U_BAD_VER TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_VERSION
#define R_BAD_VER TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION
#define R_BAD_OP TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_UNEXPECTED_OPCODE
#define U_BAD_QN TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_QN
#define U_TOO_LONG TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_MSG_TOO_LONG
#define U_BAD_MO TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MO
#define T_BOUNDS TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS
#define T_WRAP TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_TO_WRAP

/* ------------------------------------------------------------------ encoders and round trips */

Test(frame, put_tagged_bytes)
{
	struct dg_tagged_hdr h;
	memset(&h, 0xaa, sizeof h);
	dg_put_tagged(&h, RDMAP_WRITE, false, 0xdeadbeef, 0x0102030405060708ull, 9, 512, 4096, 512);
	const uint8_t want[30] = {0x81, 0x40, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8,
				  0, 0, 0, 9, 0, 0, 2, 0, 0, 0, 0x10, 0, 0x02, 0x00, 0, 0};
	cr_assert_arr_eq(&h, want, 30);
}

Test(frame, put_untagged_bytes)
{
	struct dg_untagged_hdr h;
	memset(&h, 0xaa, sizeof h);
	dg_put_untagged(&h, RDMAP_SEND_SE_INV, true, 0, 0x01020304, 0, 17, 0x1234, 0xcafef00d);
	const uint8_t want[26] = {0x41, 0x46, 0xca, 0xfe, 0xf0, 0x0d, 0, 0, 0, 0, 1, 2, 3,
				  4, 0, 0, 0, 0, 0, 0, 0, 17, 0x12, 0x34, 0, 0};
	cr_assert_arr_eq(&h, want, 26);
}

Test(frame, put_read_req_bytes)
{
	struct rdmap_read_req r;
	dg_put_read_req(&r, 0x11223344, 0x1000, 0x2000, 0x55667788, 0xffffffff00000001ull);
	const uint8_t want[28] = {0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0,
				  0x20, 0, 0x55, 0x66, 0x77, 0x88, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1};
	cr_assert_arr_eq(&r, want, 28);
}

Test(frame, roundtrip_tagged_opcodes)
{
	const uint8_t ops[] = {RDMAP_WRITE, RDMAP_READ_RESP, RDMAP_WRITE_RECORD};
	for (size_t i = 0; i < sizeof ops; i++) {
		/* middle segment of a multi-segment message */
		size_t n = mk_tagged(ops[i], false, 0xa1b2c3d4, 0x7f0000001000ull + 512, 42, 512, 1300,
				     512, 512);
		struct dg_seg s;
		expect_ok(n, MAXMSG, &s, dg_opcode_name(ops[i]));
		cr_assert_eq(s.opcode, ops[i]);
		cr_assert(s.tagged);
		cr_assert_not(s.last);
		cr_assert_eq(s.stag, 0xa1b2c3d4u);
		cr_assert_eq(s.to, 0x7f0000001000ull + 512);
		cr_assert_eq(s.msn, 42u);
		cr_assert_eq(s.mo, 512u);
		cr_assert_eq(s.ml, 1300u);
		cr_assert_eq(s.segsz, 512);
		cr_assert_eq(s.inv_stag, 0u);
		cr_assert_eq(s.qn, 0u);
		cr_assert_eq(s.hdr, buf);
		cr_assert_eq(s.hlen, DG_TAGGED_HLEN);
		cr_assert_eq(s.payload, buf + DG_TAGGED_HLEN);
		cr_assert_eq(s.plen, 512u);

		/* last segment, shorter than segsz */
		n = mk_tagged(ops[i], true, 1, 0x7f0000001000ull + 1024, 42, 1024, 1300, 512, 276);
		expect_ok(n, MAXMSG, &s, dg_opcode_name(ops[i]));
		cr_assert(s.last);
		cr_assert_eq(s.plen, 276u);

		/* single segment, segsz irrelevant */
		n = mk_tagged(ops[i], true, 1, 0, 43, 0, 5, 0, 5);
		expect_ok(n, MAXMSG, &s, dg_opcode_name(ops[i]));
		cr_assert_eq(s.plen, 5u);
	}
}

Test(frame, roundtrip_untagged_opcodes)
{
	const struct {
		uint8_t op;
		uint32_t qn;
		uint32_t inv;
	} c[] = {
		{RDMAP_SEND, DDP_QN_SEND, 0},
		{RDMAP_SEND_INV, DDP_QN_SEND, 0x12345678},
		{RDMAP_SEND_SE, DDP_QN_SEND, 0},
		{RDMAP_SEND_SE_INV, DDP_QN_SEND, 0x9abcdef0},
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		size_t n = mk_untagged(c[i].op, false, c[i].qn, 7, 1446, 3000, 1446, c[i].inv, 1446);
		struct dg_seg s;
		expect_ok(n, MAXMSG, &s, dg_opcode_name(c[i].op));
		cr_assert_eq(s.opcode, c[i].op);
		cr_assert_not(s.tagged);
		cr_assert_not(s.last);
		cr_assert_eq(s.qn, c[i].qn);
		cr_assert_eq(s.inv_stag, c[i].inv);
		cr_assert_eq(s.msn, 7u);
		cr_assert_eq(s.mo, 1446u);
		cr_assert_eq(s.ml, 3000u);
		cr_assert_eq(s.segsz, 1446);
		cr_assert_eq(s.stag, 0u);
		cr_assert_eq(s.to, 0u);
		cr_assert_eq(s.hlen, DG_UNTAGGED_HLEN);
		cr_assert_eq(s.payload, buf + DG_UNTAGGED_HLEN);
		cr_assert_eq(s.plen, 1446u);
	}
	/* zero-length Send: one empty last segment */
	size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 0, 0, 0, 0);
	struct dg_seg s;
	expect_ok(n, MAXMSG, &s, "empty send");
	cr_assert(s.last);
	cr_assert_eq(s.plen, 0u);
}

Test(frame, roundtrip_read_request)
{
	size_t n = mk_untagged(RDMAP_READ_REQ, true, DDP_QN_READ_REQ, 3, 0, DG_READ_REQ_LEN, 0, 0,
			       DG_READ_REQ_LEN);
	dg_put_read_req((struct rdmap_read_req *)(buf + DG_UNTAGGED_HLEN), 0x1111, 0x2222, 4096,
			0x3333, 0x4444);
	struct dg_seg s;
	expect_ok(n, MAXMSG, &s, "read request");
	cr_assert_eq(s.opcode, RDMAP_READ_REQ);
	cr_assert_eq(s.qn, (uint32_t)DDP_QN_READ_REQ);
	cr_assert_eq(s.plen, (uint32_t)DG_READ_REQ_LEN);
	struct rdmap_read_req r;
	memcpy(&r, s.payload, sizeof r);
	cr_assert_eq(be32toh(r.sink_stag), 0x1111u);
	cr_assert_eq(be64toh(r.sink_to), 0x2222u);
	cr_assert_eq(be32toh(r.read_size), 4096u);
	cr_assert_eq(be32toh(r.src_stag), 0x3333u);
	cr_assert_eq(be64toh(r.src_to), 0x4444u);
}

Test(frame, roundtrip_terminate)
{
	/* term_ctrl + len/pad + the offending untagged header (D set) */
	uint32_t plen = DG_TERM_LEN + DG_UNTAGGED_HLEN;
	size_t n = mk_untagged(RDMAP_TERMINATE, true, DDP_QN_TERMINATE, 1, 0, plen, 0, 0, plen);
	uint32_t tc = htobe32(term_ctrl_make(TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF,
					     DDP_ECODE_UT_NO_BUFFER, TERM_HDRCT_D));
	memcpy(buf + DG_UNTAGGED_HLEN, &tc, 4);
	struct dg_seg s;
	expect_ok(n, MAXMSG, &s, "terminate");
	cr_assert_eq(s.opcode, RDMAP_TERMINATE);
	cr_assert_eq(s.qn, (uint32_t)DDP_QN_TERMINATE);
	cr_assert_eq(s.plen, plen);
	cr_assert_eq(s.payload[0], 0x12);
	cr_assert_eq(s.payload[1], 0x02);
	cr_assert_eq(s.payload[2], 0x40);

	/* exactly the 8-byte header is enough */
	n = mk_untagged(RDMAP_TERMINATE, true, DDP_QN_TERMINATE, 1, 0, DG_TERM_LEN, 0, 0, DG_TERM_LEN);
	expect_ok(n, MAXMSG, &s, "bare terminate");
}

Test(frame, term_ctrl_layout)
{
	cr_assert_eq(term_ctrl_make(1, 2, 0x05, TERM_HDRCT_M | TERM_HDRCT_D), 0x1205c000u);
	cr_assert_eq(term_ctrl_make(0, 1, 0x04, TERM_HDRCT_R), 0x01042000u);
}

Test(frame, max_msg_boundary)
{
	size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 100, 0, 0, 100);
	struct dg_seg s;
	expect_ok(n, 100, &s, "ml == max_msg");
	n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 100, 0, 100);
	expect_ok(n, 100, &s, "tagged ml == max_msg");
}

Test(frame, to_at_top_of_space)
{
	/* A message ending on the very last byte of the tagged offset space is fine. */
	size_t n = mk_tagged(RDMAP_WRITE, true, 1, UINT64_MAX - 9, 1, 0, 10, 0, 10);
	struct dg_seg s;
	expect_ok(n, MAXMSG, &s, "to at top");
	n = mk_tagged(RDMAP_WRITE, true, 1, 256, 1, 256, 300, 256, 44);
	expect_ok(n, MAXMSG, &s, "base exactly 0");
}

Test(frame, opcode_names)
{
	cr_assert_str_eq(dg_opcode_name(RDMAP_WRITE), "WRITE");
	cr_assert_str_eq(dg_opcode_name(RDMAP_READ_REQ), "READ_REQ");
	cr_assert_str_eq(dg_opcode_name(RDMAP_READ_RESP), "READ_RESP");
	cr_assert_str_eq(dg_opcode_name(RDMAP_SEND), "SEND");
	cr_assert_str_eq(dg_opcode_name(RDMAP_SEND_INV), "SEND_INV");
	cr_assert_str_eq(dg_opcode_name(RDMAP_SEND_SE), "SEND_SE");
	cr_assert_str_eq(dg_opcode_name(RDMAP_SEND_SE_INV), "SEND_SE_INV");
	cr_assert_str_eq(dg_opcode_name(RDMAP_TERMINATE), "TERMINATE");
	cr_assert_str_eq(dg_opcode_name(RDMAP_WRITE_RECORD), "WRITE_RECORD");
	for (unsigned op = 9; op < 20; op++)
		cr_assert_str_eq(dg_opcode_name(op), "UNKNOWN");
	cr_assert_str_eq(dg_opcode_name(UINT_MAX), "UNKNOWN");
}

/* ------------------------------------------------------------------ rejections */

Test(frame, reject_truncated)
{
	struct dg_seg s;
	struct dg_reject w;
	/* every length short of the header, for both models */
	for (size_t len = 0; len < DG_UNTAGGED_HLEN; len++) {
		mk_untagged(RDMAP_SEND, true, 0, 1, 0, 0, 0, 0, 0);
		expect_reject(len, MAXMSG, U_BAD_VER, "truncated untagged");
	}
	for (size_t len = 1; len < DG_TAGGED_HLEN; len++) {
		mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 0, 0, 0);
		expect_reject(len, MAXMSG, T_BAD_VER, "truncated tagged");
	}
	cr_assert_eq(dg_seg_parse(buf, 0, MAXMSG, &s, &w), -EPROTO);
	/* why may be NULL */
	cr_assert_eq(dg_seg_parse(buf, 3, MAXMSG, &s, NULL), -EPROTO);
}

Test(frame, reject_bad_ddp_version)
{
	for (unsigned dv = 0; dv < 4; dv++) {
		if (dv == 1)
			continue;
		size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 4, 0, 0, 4);
		set16(0, (uint16_t)((get16(0) & ~DDP_CTRL_DV_MASK) | dv << 8));
		expect_reject(n, MAXMSG, U_BAD_VER, "untagged DV");
		n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 4, 0, 4);
		set16(0, (uint16_t)((get16(0) & ~DDP_CTRL_DV_MASK) | dv << 8));
		expect_reject(n, MAXMSG, T_BAD_VER, "tagged DV");
	}
}

Test(frame, reject_bad_rdmap_version)
{
	for (unsigned rv = 0; rv < 4; rv++) {
		if (rv == 1)
			continue;
		size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 4, 0, 0, 4);
		set16(0, (uint16_t)((get16(0) & ~RDMAP_CTRL_RV_MASK) | rv << 6));
		expect_reject(n, MAXMSG, R_BAD_VER, "untagged RV");
		n = mk_tagged(RDMAP_WRITE_RECORD, true, 1, 0, 1, 0, 4, 0, 4);
		set16(0, (uint16_t)((get16(0) & ~RDMAP_CTRL_RV_MASK) | rv << 6));
		expect_reject(n, MAXMSG, R_BAD_VER, "tagged RV");
	}
}

Test(frame, reject_reserved_bits)
{
	/* each DDP control reserved bit */
	for (unsigned bit = 10; bit < 14; bit++) {
		size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 4, 0, 0, 4);
		set16(0, (uint16_t)(get16(0) | 1u << bit));
		expect_reject(n, MAXMSG, U_BAD_VER, "untagged DDP rsvd");
		n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 4, 0, 4);
		set16(0, (uint16_t)(get16(0) | 1u << bit));
		expect_reject(n, MAXMSG, T_BAD_VER, "tagged DDP rsvd");
	}
	/* each RDMAP control reserved bit */
	for (unsigned bit = 4; bit < 6; bit++) {
		size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 4, 0, 0, 4);
		set16(0, (uint16_t)(get16(0) | 1u << bit));
		expect_reject(n, MAXMSG, R_BAD_VER, "untagged RDMAP rsvd");
		n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 4, 0, 4);
		set16(0, (uint16_t)(get16(0) | 1u << bit));
		expect_reject(n, MAXMSG, R_BAD_VER, "tagged RDMAP rsvd");
	}
	/* extension rsvd field, any bit */
	for (unsigned bit = 0; bit < 16; bit++) {
		size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 4, 0, 0, 4);
		set16(offsetof(struct dg_untagged_hdr, rsvd), (uint16_t)(1u << bit));
		expect_reject(n, MAXMSG, U_BAD_VER, "untagged ext rsvd");
		n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 4, 0, 4);
		set16(offsetof(struct dg_tagged_hdr, rsvd), (uint16_t)(1u << bit));
		expect_reject(n, MAXMSG, T_BAD_VER, "tagged ext rsvd");
	}
}

Test(frame, reject_unknown_opcode)
{
	for (uint8_t op = 0x9; op <= 0xf; op++) {
		size_t n = mk_untagged(op, true, 0, 1, 0, 4, 0, 0, 4);
		expect_reject(n, MAXMSG, R_BAD_OP, "untagged unknown opcode");
		n = mk_tagged(op, true, 1, 0, 1, 0, 4, 0, 4);
		expect_reject(n, MAXMSG, R_BAD_OP, "tagged unknown opcode");
	}
}

Test(frame, reject_opcode_t_mismatch)
{
	/* tagged opcodes in untagged segments */
	const uint8_t tagged_ops[] = {RDMAP_WRITE, RDMAP_READ_RESP, RDMAP_WRITE_RECORD};
	for (size_t i = 0; i < sizeof tagged_ops; i++) {
		size_t n = mk_untagged(tagged_ops[i], true, 0, 1, 0, 4, 0, 0, 4);
		expect_reject(n, MAXMSG, R_BAD_OP, dg_opcode_name(tagged_ops[i]));
	}
	/* untagged opcodes in tagged segments */
	const uint8_t untagged_ops[] = {RDMAP_READ_REQ, RDMAP_SEND, RDMAP_SEND_INV, RDMAP_SEND_SE,
					RDMAP_SEND_SE_INV, RDMAP_TERMINATE};
	for (size_t i = 0; i < sizeof untagged_ops; i++) {
		size_t n = mk_tagged(untagged_ops[i], true, 1, 0, 1, 0, 28, 0, 28);
		expect_reject(n, MAXMSG, R_BAD_OP, dg_opcode_name(untagged_ops[i]));
	}
}

Test(frame, reject_bad_qn)
{
	const struct {
		uint8_t op;
		uint32_t bad_qn;
		uint32_t plen;
	} c[] = {
		{RDMAP_SEND, 1, 4},          {RDMAP_SEND, 2, 4},          {RDMAP_SEND, 3, 4},
		{RDMAP_SEND_INV, 1, 4},      {RDMAP_SEND_SE, 2, 4},       {RDMAP_SEND_SE_INV, 0xffffffff, 4},
		{RDMAP_READ_REQ, 0, 28},     {RDMAP_READ_REQ, 2, 28},     {RDMAP_TERMINATE, 0, 8},
		{RDMAP_TERMINATE, 1, 8},     {RDMAP_TERMINATE, 3, 8},
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		size_t n = mk_untagged(c[i].op, true, c[i].bad_qn, 1, 0, c[i].plen, 0, 0, c[i].plen);
		expect_reject(n, MAXMSG, U_BAD_QN, dg_opcode_name(c[i].op));
	}
}

Test(frame, reject_absurd_ml)
{
	size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 0, 0xffffffffu, 1024, 0, 1024);
	expect_reject(n, MAXMSG, U_TOO_LONG, "untagged huge ml");
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 101, 0, 0, 101);
	expect_reject(n, 100, U_TOO_LONG, "untagged ml = max + 1");
	n = mk_tagged(RDMAP_WRITE, false, 1, 0, 1, 0, 0xffffffffu, 1024, 1024);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged huge ml");
	n = mk_tagged(RDMAP_WRITE_RECORD, true, 1, 0, 1, 0, 101, 0, 101);
	expect_reject(n, 100, T_BOUNDS, "tagged ml = max + 1");
}

Test(frame, reject_mo_past_ml)
{
	/* single segment whose payload is longer than ml */
	size_t n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 10, 0, 0, 11);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged plen > ml");
	n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 10, 0, 11);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged plen > ml");
	/* segment starting beyond the message */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 1024, 512, 256, 0, 256);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged mo > ml");
	n = mk_tagged(RDMAP_WRITE, true, 1, 4096, 1, 1024, 512, 256, 256);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged mo > ml");
	/* mo + plen overflowing 32 bits must not pass */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 0xffffff00u, 0xffffffffu, 256, 0, 256);
	expect_reject(n, UINT32_MAX, U_BAD_MO, "untagged mo + plen wraps");
}

Test(frame, reject_small_segsz)
{
	for (uint16_t segsz = 0; segsz < DG_MIN_SEGSZ; segsz = (uint16_t)(segsz ? segsz * 2 : 1)) {
		size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 0, 1000, segsz, 0, segsz);
		expect_reject(n, MAXMSG, U_BAD_MO, "untagged small segsz");
		n = mk_tagged(RDMAP_WRITE, false, 1, 0, 1, 0, 1000, segsz, segsz);
		expect_reject(n, MAXMSG, T_BOUNDS, "tagged small segsz");
	}
	size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 0, 1000, 255, 0, 255);
	expect_reject(n, MAXMSG, U_BAD_MO, "segsz 255");
	struct dg_seg s;
	n = mk_untagged(RDMAP_SEND, false, 0, 1, 0, 1000, 256, 0, 256);
	expect_ok(n, MAXMSG, &s, "segsz 256");
}

Test(frame, reject_mo_not_multiple)
{
	size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 300, 2000, 512, 0, 512);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged mo % segsz");
	n = mk_tagged(RDMAP_WRITE, false, 1, 4096 + 300, 1, 300, 2000, 512, 512);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged mo % segsz");
	/* last segment off the grid too */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 1500, 2000, 512, 0, 500);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged last mo % segsz");
}

Test(frame, reject_plen_not_segsz)
{
	/* a middle segment shorter than segsz */
	size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 512, 2000, 512, 0, 300);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged short middle");
	n = mk_tagged(RDMAP_WRITE, false, 1, 4096 + 512, 1, 512, 2000, 512, 300);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged short middle");
	/* a last segment longer than segsz */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 512, 1300, 512, 0, 788);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged long last");
	/* an empty last segment of a multi-segment message */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 1024, 1024, 512, 0, 0);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged empty tail");
}

Test(frame, reject_l_inconsistent)
{
	/* single segment covering the message without L */
	size_t n = mk_untagged(RDMAP_SEND, false, 0, 1, 0, 10, 0, 0, 10);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged single without L");
	n = mk_tagged(RDMAP_WRITE_RECORD, false, 1, 0, 1, 0, 10, 0, 10);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged single without L");
	/* first of several with L */
	n = mk_untagged(RDMAP_SEND, true, 0, 1, 0, 1024, 512, 0, 512);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged first with L");
	n = mk_tagged(RDMAP_WRITE, true, 1, 0, 1, 0, 1024, 512, 512);
	expect_reject(n, MAXMSG, T_BOUNDS, "tagged first with L");
	/* final full-size segment without L */
	n = mk_untagged(RDMAP_SEND, false, 0, 1, 512, 1024, 512, 0, 512);
	expect_reject(n, MAXMSG, U_BAD_MO, "untagged end without L");
}

Test(frame, reject_to_wrap)
{
	/* to - mo below zero */
	size_t n = mk_tagged(RDMAP_WRITE, false, 1, 100, 1, 512, 2048, 512, 512);
	expect_reject(n, MAXMSG, T_WRAP, "base below 0");
	/* message running past 2^64 */
	n = mk_tagged(RDMAP_WRITE, true, 1, UINT64_MAX - 8, 1, 0, 10, 0, 10);
	expect_reject(n, MAXMSG, T_WRAP, "end past 2^64");
	/* only a later, unseen part of the message wraps */
	n = mk_tagged(RDMAP_READ_RESP, false, 1, UINT64_MAX - 1000, 1, 0, 2048, 512, 512);
	expect_reject(n, MAXMSG, T_WRAP, "tail wraps");
}

Test(frame, reject_read_request_size)
{
	/* too short: a truncated RDMAP Read Request header */
	for (uint32_t plen = 0; plen < DG_READ_REQ_LEN; plen++) {
		size_t n = mk_untagged(RDMAP_READ_REQ, true, DDP_QN_READ_REQ, 1, 0, plen, 0, 0, plen);
		expect_reject(n, MAXMSG, R_BAD_VER, "short read request");
	}
	/* too long for the 28-byte QN 1 buffer, single or multi-segment */
	size_t n = mk_untagged(RDMAP_READ_REQ, true, DDP_QN_READ_REQ, 1, 0, 29, 0, 0, 29);
	expect_reject(n, MAXMSG, U_TOO_LONG, "long read request");
	n = mk_untagged(RDMAP_READ_REQ, false, DDP_QN_READ_REQ, 1, 0, 1000, 512, 0, 512);
	expect_reject(n, MAXMSG, U_TOO_LONG, "multi-segment read request");
}

Test(frame, reject_short_terminate)
{
	for (uint32_t plen = 0; plen < DG_TERM_LEN; plen++) {
		size_t n = mk_untagged(RDMAP_TERMINATE, true, DDP_QN_TERMINATE, 1, 0, plen, 0, 0, plen);
		expect_reject(n, MAXMSG, R_BAD_VER, "short terminate");
	}
}

Test(frame, reject_rd_magic)
{
	/* An RD data datagram handed to the DDP parser as is (a UD QP receiving RD traffic). */
	struct dg_rd_hdr rd;
	memset(&rd, 0, sizeof rd);
	rd.magic = RD_MAGIC;
	rd.flags = RD_FLAG_DATA;
	rd.wnd = htobe16(64);
	rd.epoch = htobe32(0x01020304);
	memset(buf, 0, sizeof buf);
	memcpy(buf, &rd, sizeof rd);
	dg_put_untagged((struct dg_untagged_hdr *)(buf + sizeof rd), RDMAP_SEND, true, 0, 1, 0, 4, 0, 0);
	size_t n = sizeof rd + DG_UNTAGGED_HLEN + 4;
	/* 0xd2 has the T bit, so the tagged invalid-version code */
	expect_reject(n, MAXMSG, T_BAD_VER, "RD data");
	/* a bare RD ack is shorter than a tagged header: same triple */
	expect_reject(sizeof rd, MAXMSG, T_BAD_VER, "RD ack");
	/* and a long datagram starting with the magic whatever follows */
	memset(buf, 0, sizeof buf);
	buf[0] = RD_MAGIC;
	expect_reject(200, MAXMSG, T_BAD_VER, "magic only");
}

Test(frame, reject_leaves_decoded_fields)
{
	/* Callers build a Terminate naming the MSN of the refused segment. */
	size_t n = mk_untagged(RDMAP_SEND, true, 2, 0x55, 0, 4, 0, 0, 4);
	struct dg_seg s;
	struct dg_reject w;
	cr_assert_eq(dg_seg_parse(buf, n, MAXMSG, &s, &w), -EPROTO);
	cr_assert_eq(s.msn, 0x55u);
	cr_assert_eq(s.opcode, RDMAP_SEND);
	cr_assert_eq(s.hlen, DG_UNTAGGED_HLEN);
}

/* ------------------------------------------------------------------ docs/wire.md worked example */

/* Identical to the hex line of docs/wire.md, section "Worked example 1". */
static const char WIRE_MD_WRITE_RECORD[] =
	"c1481234567800007f0000001000000000010000000000000005059e000068656c6c6f0fbfc6d1";
/* Identical to the hex lines of docs/wire.md, section "Worked example 2". */
static const char WIRE_MD_SEND_SEG0[] = "01430000000000000000000000070000000000000bb805a20000";
static const char WIRE_MD_SEND_SEG1[] = "0143000000000000000000000007000005a200000bb805a20000";
static const char WIRE_MD_SEND_SEG2[] = "414300000000000000000000000700000b4400000bb805a20000";

static size_t unhex(const char *s, uint8_t *out)
{
	size_t n = 0;
	for (; s[0] && s[1]; s += 2) {
		unsigned v;
		cr_assert_eq(sscanf(s, "%2x", &v), 1);
		out[n++] = (uint8_t)v;
	}
	return n;
}

Test(frame, wire_md_write_record_example)
{
	uint8_t want[64], d[64];
	size_t wn = unhex(WIRE_MD_WRITE_RECORD, want);
	cr_assert_eq(wn, 39u);

	memset(d, 0, sizeof d);
	dg_put_tagged((struct dg_tagged_hdr *)d, RDMAP_WRITE_RECORD, true, 0x12345678,
		      0x00007f0000001000ull, 1, 0, 5, 1438);
	memcpy(d + DG_TAGGED_HLEN, "hello", 5);
	uint32_t crc = dg_crc32c(d, DG_TAGGED_HLEN + 5);
	cr_assert_eq(crc, 0x0fbfc6d1u);
	uint32_t be = htobe32(crc);
	memcpy(d + DG_TAGGED_HLEN + 5, &be, 4);
	size_t n = DG_TAGGED_HLEN + 5 + DG_CRC_LEN;
	cr_assert_eq(n, wn);
	cr_assert_arr_eq(d, want, n);
	cr_assert_eq(dg_crc_check(d, n), 1);

	struct dg_seg s;
	memcpy(buf, d, n);
	expect_ok(n - DG_CRC_LEN, MAXMSG, &s, "wire.md example");
	cr_assert_eq(s.opcode, RDMAP_WRITE_RECORD);
	cr_assert(s.tagged && s.last);
	cr_assert_eq(s.stag, 0x12345678u);
	cr_assert_eq(s.to, 0x00007f0000001000ull);
	cr_assert_eq(s.msn, 1u);
	cr_assert_eq(s.ml, 5u);
	cr_assert_eq(s.plen, 5u);
	cr_assert_arr_eq(s.payload, "hello", 5);
}

Test(frame, wire_md_send_example)
{
	const char *hex[3] = {WIRE_MD_SEND_SEG0, WIRE_MD_SEND_SEG1, WIRE_MD_SEND_SEG2};
	const uint32_t mo[3] = {0, 1442, 2884}, plen[3] = {1442, 1442, 116};
	for (int i = 0; i < 3; i++) {
		uint8_t want[32];
		cr_assert_eq(unhex(hex[i], want), (size_t)DG_UNTAGGED_HLEN);
		size_t n = mk_untagged(RDMAP_SEND, i == 2, DDP_QN_SEND, 7, mo[i], 3000, 1442, 0, plen[i]);
		cr_assert_arr_eq(buf, want, DG_UNTAGGED_HLEN, "segment %d", i);
		struct dg_seg s;
		expect_ok(n, MAXMSG, &s, "wire.md send example");
		cr_assert_eq(s.mo, mo[i]);
	}
}

/* The doc itself must still carry the strings above; found next to the build directory
 * (build/tests/unit/test_frame -> docs/wire.md), skipped when the tree is laid out otherwise. */
Test(frame, wire_md_text_matches)
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
			if (!slash)
				break;
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
	cr_assert_not_null(strstr(text, WIRE_MD_WRITE_RECORD), "wire.md lost the Write-Record hex line");
	cr_assert_not_null(strstr(text, WIRE_MD_SEND_SEG0));
	cr_assert_not_null(strstr(text, WIRE_MD_SEND_SEG1));
	cr_assert_not_null(strstr(text, WIRE_MD_SEND_SEG2));
}
