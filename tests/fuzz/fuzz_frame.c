/*
 * fuzz_frame.c - the datagram-iWARP segment decoder (verbs_backend/soft/frame.c dg_seg_parse):
 * UD segments and the segment inside an RD datagram, every opcode, the datagram extension.
 *
 * Input: one byte choosing the QP's maximum message size, then the segment (DDP header onward,
 * as rx_segment gets it after the CRC and any RD header are gone).
 * Beyond "no crash, no out-of-bounds read": an accepted segment must satisfy every rule
 * frame.h promises, and encoding its fields again with dg_put_* must give back the very
 * header bytes (nothing accepted that the encoder could not have produced); a rejected one
 * must carry an RFC 5040/5041 error triple.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "frame.h"
#include "fuzz.h"

static const uint32_t max_msgs[] = {1u << 20, DG_READ_REQ_LEN, 65535, UINT32_MAX, 0, 16u << 20, 4096, 256};

static bool op_tagged(unsigned op)
{
	return op == RDMAP_WRITE || op == RDMAP_WRITE_RECORD || op == RDMAP_READ_RESP;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint32_t max_msg = max_msgs[data[0] % (sizeof max_msgs / sizeof max_msgs[0])];
	/* a copy of exactly the segment's length, so ASan sees any read past its end */
	size_t len = size - 1;
	uint8_t *buf = malloc(len ? len : 1);
	memcpy(buf, data + 1, len);

	struct dg_seg g;
	struct dg_reject why = {0};
	int r = dg_seg_parse(buf, len, max_msg, &g, &why);
	FUZZ_CHECK(g.hdr == buf);
	if (r) {
		FUZZ_CHECK(r == -EPROTO);
		FUZZ_CHECK(why.reason != NULL);
		FUZZ_CHECK(why.layer == TERM_LAYER_RDMAP || why.layer == TERM_LAYER_DDP);
		FUZZ_CHECK(len < 1 || g.tagged == ((buf[0] & 0x80) != 0));
		free(buf);
		return 0;
	}
	FUZZ_CHECK(g.opcode <= RDMAP_OPCODE_MAX);
	FUZZ_CHECK(strcmp(dg_opcode_name(g.opcode), "UNKNOWN") != 0);
	FUZZ_CHECK(g.tagged == op_tagged(g.opcode));
	FUZZ_CHECK(g.hlen == (g.tagged ? DG_TAGGED_HLEN : DG_UNTAGGED_HLEN));
	FUZZ_CHECK(g.hlen + (size_t)g.plen == len);
	FUZZ_CHECK(g.payload == buf + g.hlen);
	FUZZ_CHECK(g.ml <= max_msg);
	FUZZ_CHECK((uint64_t)g.mo + g.plen <= g.ml);
	FUZZ_CHECK(g.last == ((uint64_t)g.mo + g.plen == g.ml));
	if (!(g.mo == 0 && g.plen == g.ml)) {
		/* the reassembly bitmap's index mo / segsz stays below ceil(ml / segsz) */
		FUZZ_CHECK(g.segsz >= DG_MIN_SEGSZ && g.mo % g.segsz == 0 && g.plen > 0);
		FUZZ_CHECK(g.mo / g.segsz < (g.ml + g.segsz - 1) / g.segsz);
		FUZZ_CHECK(g.last ? g.plen <= g.segsz : g.plen == g.segsz);
	}
	if (g.tagged) {
		FUZZ_CHECK(g.to >= g.mo);
		FUZZ_CHECK(!g.ml || g.to - g.mo + (g.ml - 1) >= g.to - g.mo);
		struct dg_tagged_hdr h;
		dg_put_tagged(&h, g.opcode, g.last, g.stag, g.to, g.msn, g.mo, g.ml, g.segsz);
		FUZZ_CHECK(memcmp(&h, buf, sizeof h) == 0);
	} else {
		uint32_t qn = g.opcode == RDMAP_READ_REQ ? DDP_QN_READ_REQ
			      : g.opcode == RDMAP_TERMINATE ? DDP_QN_TERMINATE : DDP_QN_SEND;
		FUZZ_CHECK(g.qn == qn);
		struct dg_untagged_hdr h;
		dg_put_untagged(&h, g.opcode, g.last, g.qn, g.msn, g.mo, g.ml, g.segsz, g.inv_stag);
		FUZZ_CHECK(memcmp(&h, buf, sizeof h) == 0);
	}
	if (g.opcode == RDMAP_READ_REQ) {
		FUZZ_CHECK(g.plen == DG_READ_REQ_LEN && g.mo == 0 && g.ml == DG_READ_REQ_LEN);
		/* the Read Request body re-encodes to itself as well */
		struct rdmap_read_req q, in;
		memcpy(&in, g.payload, sizeof in);
		dg_put_read_req(&q, be32toh(in.sink_stag), be64toh(in.sink_to), be32toh(in.read_size),
				be32toh(in.src_stag), be64toh(in.src_to));
		FUZZ_CHECK(memcmp(&q, g.payload, sizeof q) == 0);
	}
	if (g.opcode == RDMAP_TERMINATE)
		FUZZ_CHECK(g.plen >= DG_TERM_LEN);
	free(buf);
	return 0;
}
