/*
 * fuzz_qp.c - datagrams into the receive path of soft UD and RD queue pairs
 * (verbs_backend/soft/qp.c rx_datagram): CRC check, plain-datagram detection, the RD layer,
 * the frame decoder, and behind it placement: Send reassembly into posted receives, Write and
 * Write-Record into a registered region with its record, Read Requests answered, Read
 * Responses matched to our Reads, Terminates of a peer. soft_qp_test_rx (a test hook in qp.c)
 * hands the datagram over without a socket; what the QP sends back (acks, Terminates, Read
 * Responses) goes to two sink sockets on 127.0.0.1 that the harness drains.
 *
 * Input: a configuration byte (bit 0 RD, bit 1 pass_plain, bits 2-3 the maximum message
 * size), then operations:
 *   0 len16 flags bytes  a datagram from a peer; flags bit 0: append its CRC32c (else the
 *                        bytes are taken as they are), bit 1: from peer 1 (else 0), bit 2: RD
 *                        ack_epoch := the epoch our QP last sent that peer, bit 3: a tagged
 *                        segment's STag and TO, or a Read Request's source STag and TO, are
 *                        moved into our region (the fuzzer cannot know its STag), bit 4:
 *                        through dgv_qp_rx_take's check (bit 5: the caller's limit 1442 bytes)
 *   1 count size         post count receives of one of four sizes
 *   2                    poll the CQ (and make progress)
 *   3 kind stag32 to64 len32  post a Send (0), Write-Record (1), Read (2) or Write (3) to peer 0
 *   4                    poll the error queue
 * Oracles: completions stay within what was posted (receive lengths, record ranges inside the
 * message, Read bytes within the Read), no byte is placed outside the region (ASan: the region
 * has redzones on both sides), and the QP's own datagrams carry valid CRCs.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc.h"
#include "dgverbs.h"
#include "fuzz.h"
#include "wire.h"

void soft_qp_test_rx(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
		     socklen_t fromlen);
int soft_qp_test_rx_take(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
			 socklen_t fromlen, uint32_t max, struct dgv_rx_msg *out);

#define REGION (64u << 10)
#define RECV_AREA (32u << 10) /* the region's first half takes receives, the rest is remote */

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static int sink[2] = {-1, -1};
static union dgv_sockaddr sink_addr[2];
static socklen_t sink_len[2];
static uint32_t epoch_seen[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct dgv_context_attr ca = {.provider = DGV_PROV_SOFT, .progress = DGV_PROGRESS_APP};
	FUZZ_CHECK(dgv_open(&ca, &ctx) == 0);
	FUZZ_CHECK(dgv_alloc_pd(ctx, &pd) == 0);
	for (int i = 0; i < 2; i++) {
		struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		sink[i] = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		FUZZ_CHECK(sink[i] >= 0 && bind(sink[i], (struct sockaddr *)&lo, sizeof lo) == 0);
		sink_len[i] = sizeof sink_addr[i];
		FUZZ_CHECK(getsockname(sink[i], &sink_addr[i].sa, &sink_len[i]) == 0);
	}
	return 0;
}

/* Reads what the QP sent the peers: each datagram must carry a valid CRC; RD ones tell the
 * epoch to acknowledge. */
static void drain_sinks(bool rd)
{
	static uint8_t d[65536];
	for (int i = 0; i < 2; i++) {
		ssize_t n;
		while ((n = recv(sink[i], d, sizeof d, MSG_DONTWAIT)) >= 0) {
			FUZZ_CHECK(n >= DG_CRC_LEN && dg_crc_check(d, (size_t)n));
			if (rd && n >= DG_RD_HLEN + DG_CRC_LEN && d[0] == RD_MAGIC && !(d[1] & RD_FLAG_RST)) {
				uint32_t e;
				memcpy(&e, d + offsetof(struct dg_rd_hdr, epoch), 4);
				epoch_seen[i] = be32toh(e);
			}
		}
	}
}

struct run {
	struct dgv_cq *cq;
	struct dgv_qp *qp;
	struct dgv_mr *mr;
	struct dgv_ah *ah;
	uint8_t *region;
	uint32_t recv_len[256]; /* by wr_id: what each receive offered */
	uint32_t read_len[256];
	uint32_t next_recv, next_send;
	bool rd;
};

static void poll_cq(struct run *r)
{
	struct dgv_wc wc[32];
	int n;
	while ((n = dgv_poll_cq(r->cq, 32, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			struct dgv_wc *w = &wc[i];
			if (w->opcode == DGV_WC_RECV && w->status == DGV_WC_SUCCESS)
				FUZZ_CHECK(w->wr_id < 256 && w->byte_len <= r->recv_len[w->wr_id]);
			if (w->opcode == DGV_WC_RECV_PLAIN && w->status == DGV_WC_SUCCESS)
				FUZZ_CHECK(w->wr_id < 256 && w->byte_len <= r->recv_len[w->wr_id]);
			if (w->opcode == DGV_WC_READ && w->status == DGV_WC_SUCCESS)
				FUZZ_CHECK(w->wr_id >= 256 && w->byte_len <= r->read_len[w->wr_id & 255]);
			if (w->opcode == DGV_WC_RECV_WRITE_RECORD && w->status != DGV_WC_WR_FLUSH_ERR) {
				const struct dgv_record *rec = &w->record;
				FUZZ_CHECK(rec->valid_bytes <= rec->length);
				uint64_t prev_end = 0, sum = 0;
				for (uint32_t k = 0; k < rec->nranges; k++) {
					const struct dgv_range *g = &rec->ranges[k];
					FUZZ_CHECK(g->length > 0);
					FUZZ_CHECK((uint64_t)g->offset + g->length <= rec->length);
					FUZZ_CHECK(k == 0 || g->offset > prev_end); /* sorted, coalesced */
					prev_end = (uint64_t)g->offset + g->length;
					sum += g->length;
				}
				FUZZ_CHECK(sum == rec->valid_bytes);
				if (rec->stag == r->mr->rkey && rec->length)
					FUZZ_CHECK(rec->base >= (uint64_t)(uintptr_t)r->region &&
						   rec->base + rec->length <= (uint64_t)(uintptr_t)r->region + REGION);
			}
		}
	}
	drain_sinks(r->rd);
}

static void patch(struct run *r, uint8_t *d, size_t n)
{
	size_t o = r->rd ? DG_RD_HLEN : 0;
	uint64_t base = (uint64_t)(uintptr_t)r->region;
	if (n < o + DG_UNTAGGED_HLEN)
		return;
	if (d[o] & 0x80) {
		uint32_t stag = htobe32(r->mr->rkey);
		uint64_t to;
		memcpy(&to, d + o + 6, 8);
		to = htobe64(base + RECV_AREA + be64toh(to) % (REGION - RECV_AREA));
		memcpy(d + o + 2, &stag, 4);
		memcpy(d + o + 6, &to, 8);
	} else if ((d[o + 1] & 0xf) == RDMAP_READ_REQ && n >= o + DG_UNTAGGED_HLEN + DG_READ_REQ_LEN) {
		uint8_t *q = d + o + DG_UNTAGGED_HLEN;
		uint32_t stag = htobe32(r->mr->rkey);
		uint64_t to;
		memcpy(&to, q + 20, 8);
		to = htobe64(base + RECV_AREA + be64toh(to) % (REGION - RECV_AREA));
		memcpy(q + 16, &stag, 4);
		memcpy(q + 20, &to, 8);
	}
}

static void datagram(struct run *r, struct fz *f)
{
	size_t want = fz_u16(f) % 9000, n;
	uint8_t flags = fz_u8(f);
	const uint8_t *b = fz_bytes(f, want, &n);
	/* exactly the datagram's size: ASan catches a read past its end */
	uint8_t *d = malloc(n + DG_CRC_LEN);
	memcpy(d, b, n);
	int p = (flags >> 1) & 1;
	if ((flags & 4) && r->rd && n >= DG_RD_HLEN) {
		uint32_t e = htobe32(epoch_seen[p]);
		memcpy(d + offsetof(struct dg_rd_hdr, ack_epoch), &e, 4);
	}
	if (flags & 8)
		patch(r, d, n);
	if (flags & 1) {
		uint32_t c = htobe32(dg_crc32c(d, n));
		memcpy(d + n, &c, 4);
		n += 4;
	}
	if (flags & 16) {
		/* the caller's own read (dgv_qp_rx_take): a whole message comes back where it lies,
		 * inside the datagram and within the caller's limit; anything else is placed */
		struct dgv_rx_msg m;
		uint32_t max = flags & 32 ? 1442 : 65536;
		int t = soft_qp_test_rx_take(r->qp, d, n, &sink_addr[p], sink_len[p], max, &m);
		FUZZ_CHECK(t == 0 || t == 1);
		if (t == 1)
			FUZZ_CHECK(!r->rd && m.len <= max && (size_t)m.off + m.len <= n);
		if (t == 1 && m.framed)
			FUZZ_CHECK(m.off >= DG_UNTAGGED_HLEN && (size_t)m.off + m.len + DG_CRC_LEN == n);
	} else {
		soft_qp_test_rx(r->qp, d, n, &sink_addr[p], sink_len[p]);
	}
	free(d);
}

static void post_recvs(struct run *r, struct fz *f)
{
	static const uint32_t sizes[] = {8, 1442, 4096, 12288};
	unsigned count = fz_u8(f) % 8 + 1;
	uint32_t size = sizes[fz_u8(f) & 3];
	for (unsigned i = 0; i < count && r->next_recv < 64; i++) {
		uint32_t id = r->next_recv++;
		uint64_t at = (uint64_t)(uintptr_t)r->region + (uint64_t)id * 512 % (RECV_AREA - 12288);
		/* two SGEs when the size allows: placement across an SGE boundary */
		struct dgv_sge sge[2] = {{at, size / 2, r->mr->lkey}, {at + size / 2, size - size / 2, r->mr->lkey}};
		struct dgv_recv_wr wr = {.wr_id = id, .sg_list = sge, .num_sge = size > 8 ? 2 : 1}, *bad;
		if (size <= 8)
			sge[0].length = size;
		if (dgv_post_recv(r->qp, &wr, &bad))
			break;
		r->recv_len[id] = size;
	}
}

static void post_send(struct run *r, struct fz *f)
{
	static const enum dgv_wr_opcode ops[] = {DGV_WR_SEND, DGV_WR_WRITE_RECORD, DGV_WR_READ, DGV_WR_WRITE};
	enum dgv_wr_opcode op = ops[fz_u8(f) & 3];
	uint32_t rkey = fz_u32(f);
	uint64_t raddr = (uint64_t)fz_u32(f) << 32 | fz_u32(f);
	uint32_t len = fz_u32(f) % 6000;
	if (r->next_send >= 64)
		return;
	uint32_t id = r->next_send++;
	struct dgv_sge sge = {(uint64_t)(uintptr_t)r->region + RECV_AREA, len, r->mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 256 + id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .ah = r->ah, .remote_addr = raddr, .rkey = rkey},
			   *bad;
	r->read_len[id] = len;
	int e = dgv_post_send(r->qp, &wr, &bad);
	FUZZ_CHECK(e == 0 || e == -EAGAIN || e == -ENOMEM || e == -EMSGSIZE || e == -EINVAL);
	drain_sinks(r->rd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t max_msgs[] = {1u << 20, 4096, 65536, DG_READ_REQ_LEN};
	struct fz f = {data, size};
	uint8_t cfg = fz_u8(&f);
	struct run r = {.rd = cfg & 1};
	memset(epoch_seen, 0, sizeof epoch_seen);
	FUZZ_CHECK(dgv_create_cq(ctx, 256, &r.cq) == 0);
	r.region = calloc(1, REGION);
	FUZZ_CHECK(dgv_reg_mr(pd, r.region, REGION,
			      DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &r.mr) == 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct dgv_qp_init_attr a = {.qp_type = r.rd ? DGV_QPT_RD : DGV_QPT_UD, .send_cq = r.cq, .recv_cq = r.cq,
				     .bind_addr = (struct sockaddr *)&lo, .bind_len = sizeof lo,
				     .max_msg_size = max_msgs[(cfg >> 2) & 3], .pass_plain = (cfg >> 1) & 1,
				     .max_send_wr = 64, .max_recv_wr = 64};
	FUZZ_CHECK(dgv_create_qp(pd, &a, &r.qp) == 0);
	FUZZ_CHECK(dgv_create_ah(pd, &sink_addr[0].sa, sink_len[0], &r.ah) == 0);

	for (unsigned steps = 0; fz_more(&f) && steps < 64; steps++) {
		switch (fz_u8(&f) % 5) {
		case 0:
			datagram(&r, &f);
			break;
		case 1:
			post_recvs(&r, &f);
			break;
		case 2:
			poll_cq(&r);
			break;
		case 3:
			post_send(&r, &f);
			break;
		default: {
			struct dgv_async_err e[8];
			int n = dgv_poll_errq(r.qp, 8, e);
			FUZZ_CHECK(n >= 0 && n <= 8);
			for (int i = 0; i < n; i++)
				FUZZ_CHECK(dgv_err_str(e[i].layer, e[i].etype, e[i].ecode) != NULL);
			break;
		}
		}
	}
	poll_cq(&r);
	FUZZ_CHECK(dgv_destroy_qp(r.qp) == 0);
	poll_cq(&r); /* the flushed work requests */
	dgv_destroy_ah(r.ah);
	FUZZ_CHECK(dgv_dereg_mr(r.mr) == 0);
	FUZZ_CHECK(dgv_destroy_cq(r.cq) == 0);
	free(r.region);
	drain_sinks(false);
	return 0;
}
