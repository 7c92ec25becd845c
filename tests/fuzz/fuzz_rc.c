/*
 * fuzz_rc.c - the receive side of a soft RC queue pair (verbs_backend/soft/rc_rx.c, and
 * rc_cm.c for the set-up): the MPA Reply of the connection set-up (revision 1 and 2, the
 * IRD/ORD word, peer-to-peer RTR, reject), then the FPDU stream: length, markers, pad, CRC,
 * DDP/RDMAP headers, placement into posted receives and a registered region, Read Requests
 * answered, Terminates.
 *
 * The QP is a real initiator (dgv_connect on an adopted descriptor) over one end of an
 * AF_UNIX stream socketpair; the harness is the peer on the other end: it reads the MPA
 * Request and whatever the QP sends later, and writes the input.
 *
 * Input: a configuration byte (bit 0: ask for CRC, bit 1: ask for markers, bit 2: MPA
 * revision 1, bit 3: records are framed by the harness), a big-endian 16-bit length and the
 * MPA Reply, then records: [flags][len16][bytes]. A framed record's bytes are a ULPDU: the
 * harness adds length, pad, CRC and markers as negotiated (flags bit 0: move a tagged header's
 * STag/TO, or a Read Request's source, into our region; bit 1: spoil the CRC; bit 2: send the
 * bytes as they are, unframed). Without bit 3 every record goes out as it is.
 * LLVMFuzzerCustomMutator keeps record lengths consistent while it mutates one record, so the
 * CRC and the framing stay right and mutations land in the DDP/RDMAP headers and payloads.
 * Oracles: receive completions within what was posted, no byte outside the region (ASan),
 * a connection that failed reports an error state, no crash or hang.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc.h"
#include "dgverbs.h"
#include "fuzz.h"
#include "mpa.h"

#define REGION (64u << 10)
#define NRECV 16
#define RECV_SZ 2048u

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static bool trace; /* FUZZ_TRACE=1: what each completion and the final state were (debugging) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct dgv_context_attr ca = {.provider = DGV_PROV_SOFT, .progress = DGV_PROGRESS_APP};
	FUZZ_CHECK(dgv_open(&ca, &ctx) == 0);
	FUZZ_CHECK(dgv_alloc_pd(ctx, &pd) == 0);
	trace = getenv("FUZZ_TRACE") != NULL;
	return 0;
}

struct run {
	int peer; /* our end of the socketpair */
	struct dgv_cq *cq;
	struct dgv_qp *qp;
	struct dgv_mr *mr;
	uint8_t *region;
	uint64_t pos;   /* FPDU stream position of the next byte we write */
	bool established;
};

static void drain_peer(struct run *r)
{
	static uint8_t junk[65536];
	while (recv(r->peer, junk, sizeof junk, MSG_DONTWAIT) > 0)
		;
}

static void poll_cq(struct run *r)
{
	struct dgv_wc wc[16];
	int n;
	for (int round = 0; round < 4; round++) {
		while ((n = dgv_poll_cq(r->cq, 16, wc)) > 0)
			for (int i = 0; i < n; i++) {
				struct dgv_wc *w = &wc[i];
				if (trace)
					fprintf(stderr, "fuzz_rc: wc op %d status %d len %u\n", w->opcode, w->status,
						w->byte_len);
				if (w->opcode == DGV_WC_RECV && w->status == DGV_WC_SUCCESS)
					FUZZ_CHECK(w->byte_len <= RECV_SZ);
				if (w->opcode == DGV_WC_RECV_WRITE_RECORD && w->status == DGV_WC_SUCCESS) {
					FUZZ_CHECK(w->record.valid_bytes <= w->record.length);
					if (w->record.stag == r->mr->rkey && w->record.length)
						FUZZ_CHECK(w->record.base >= (uint64_t)(uintptr_t)r->region &&
							   w->record.base + w->record.length <=
								   (uint64_t)(uintptr_t)r->region + REGION);
				}
			}
		drain_peer(r);
	}
	struct dgv_cm_event ev;
	while (dgv_cm_get_event(dgv_cm_default_channel(ctx), &ev) == 0)
		if (ev.type == DGV_CM_ESTABLISHED && ev.qp == r->qp)
			r->established = true;
}

/* Writes all of b (the socketpair holds far more than one input). */
static void put(struct run *r, const uint8_t *b, size_t n)
{
	while (n) {
		ssize_t w = send(r->peer, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w <= 0) {
			poll_cq(r);
			if (w < 0 && errno != EAGAIN)
				return;
			continue;
		}
		b += w;
		n -= (size_t)w;
	}
}

static void patch(struct run *r, uint8_t *u, size_t n)
{
	uint64_t base = (uint64_t)(uintptr_t)r->region, to;
	uint32_t stag = htobe32(r->mr->rkey);
	if (n >= DDP_TAGGED_HLEN && (u[0] & 0x80)) {
		memcpy(&to, u + 6, 8);
		to = htobe64(base + be64toh(to) % REGION);
		memcpy(u + 2, &stag, 4);
		memcpy(u + 6, &to, 8);
	} else if (n >= DDP_UNTAGGED_HLEN + 28 && (u[1] & 0xf) == RDMAP_READ_REQ) {
		uint8_t *q = u + DDP_UNTAGGED_HLEN;
		memcpy(&to, q + 20, 8);
		to = htobe64(base + be64toh(to) % REGION);
		memcpy(q + 16, &stag, 4);
		memcpy(q + 20, &to, 8);
	}
}

static void record(struct run *r, uint8_t flags, const uint8_t *b, size_t n, bool framed)
{
	struct dgv_conn_info info = {0};
	if (!framed || (flags & 4) || dgv_conn_info(r->qp, &info)) {
		put(r, b, n);
		r->pos += n;
		return;
	}
	if (n > MPA_MAX_ULPDU)
		n = MPA_MAX_ULPDU;
	uint8_t *u = malloc(n ? n : 1);
	memcpy(u, b, n);
	if (flags & 1)
		patch(r, u, n);
	uint32_t flen = mpa_fpdu_len((uint32_t)n);
	uint32_t raw = info.markers_rx ? mpa_raw_len(r->pos, flen) : flen;
	/* after raw records the position may be off the 4-byte grid FPDUs live on, where a marker
	 * can split the CRC and the built length differs from mpa_raw_len: room for that too */
	uint8_t *w = malloc(flen + MPA_MARKER_LEN * (flen / MPA_MARKER_SPACING + 2));
	size_t len = mpa_fpdu_build(w, u, (uint16_t)n, info.crc, info.markers_rx ? (int64_t)r->pos : -1);
	FUZZ_CHECK(len == raw || r->pos % 4);
	if (flags & 2)
		w[len - 1] ^= 0x5a;
	put(r, w, len);
	r->pos += len;
	free(u);
	free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = {data, size};
	uint8_t cfg = fz_u8(&f);
	struct run r = {0};
	int sv[2];
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	r.peer = sv[1];
	FUZZ_CHECK(dgv_create_cq(ctx, 128, &r.cq) == 0);
	r.region = calloc(1, REGION);
	FUZZ_CHECK(dgv_reg_mr(pd, r.region, REGION,
			      DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &r.mr) == 0);
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_RC, .send_cq = r.cq, .recv_cq = r.cq,
				     .use_adopt_fd = 1, .adopt_fd = sv[0], .max_send_wr = 32,
				     .max_recv_wr = NRECV, .max_msg_size = REGION};
	struct dgv_conn_param cp = {.crc = cfg & 1, .markers = (cfg >> 1) & 1, .mpa_rev = cfg & 4 ? 1 : 2,
				    .ird = 4, .ord = 4};
	struct sockaddr_in dst = {.sin_family = AF_INET};
	FUZZ_CHECK(dgv_connect(pd, &a, (struct sockaddr *)&dst, sizeof dst, &cp, &r.qp) == 0);
	for (int i = 0; i < NRECV; i++) {
		struct dgv_sge sge = {(uint64_t)(uintptr_t)r.region + (uint64_t)i * RECV_SZ, RECV_SZ, r.mr->lkey};
		struct dgv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
		FUZZ_CHECK(dgv_post_recv(r.qp, &wr, &bad) == 0);
	}
	poll_cq(&r); /* the MPA Request goes out and is read away */

	size_t n;
	const uint8_t *reply = fz_bytes(&f, fz_u16(&f) % 1024, &n);
	put(&r, reply, n);
	poll_cq(&r);
	for (unsigned steps = 0; fz_more(&f) && steps < 64; steps++) {
		uint8_t flags = fz_u8(&f);
		const uint8_t *b = fz_bytes(&f, fz_u16(&f), &n);
		record(&r, flags, b, n, cfg & 8);
		poll_cq(&r);
		if (steps % 4 == 3) {
			/* a Send of ours now and then: the transmit path interleaves with what comes in */
			struct dgv_sge sge = {(uint64_t)(uintptr_t)r.region, 64, r.mr->lkey};
			struct dgv_send_wr wr = {.wr_id = 100, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND},
					   *bad;
			(void)dgv_post_send(r.qp, &wr, &bad);
		}
	}
	shutdown(r.peer, SHUT_WR); /* end of stream: the QP sees the peer close */
	poll_cq(&r);
	enum dgv_qp_state st = dgv_qp_state(r.qp);
	if (trace)
		fprintf(stderr, "fuzz_rc: established %d, final state %d\n", r.established, st);
	FUZZ_CHECK(st >= DGV_QPS_CONNECTING && st <= DGV_QPS_ERROR);
	FUZZ_CHECK(dgv_destroy_qp(r.qp) == 0);
	poll_cq(&r);
	close(sv[0]); /* adopted: the provider never closes it */
	close(r.peer);
	FUZZ_CHECK(dgv_dereg_mr(r.mr) == 0);
	FUZZ_CHECK(dgv_destroy_cq(r.cq) == 0);
	free(r.region);
	return 0;
}

/* Mutates one record of a framed input (config bit 3) and fixes its length, keeping the
 * records after it intact; anything else, and one mutation in four, is libFuzzer's own. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
	if (size < 3 || !(data[0] & 8) || seed % 4 == 0)
		return LLVMFuzzerMutate(data, size, max_size);
	size_t off = 3 + ((size_t)data[1] << 8 | data[2]); /* records start after the reply */
	if (off >= size)
		return LLVMFuzzerMutate(data, size, max_size);
	/* the records: pick one by seed */
	size_t starts[64], lens[64];
	unsigned k = 0;
	for (size_t o = off; o + 3 <= size && k < 64; k++) {
		size_t l = (size_t)data[o + 1] << 8 | data[o + 2];
		if (o + 3 + l > size)
			l = size - o - 3;
		starts[k] = o;
		lens[k] = l;
		o += 3 + l;
	}
	if (!k)
		return LLVMFuzzerMutate(data, size, max_size);
	unsigned pick = (seed >> 2) % k;
	size_t s = starts[pick] + 3, l = lens[pick], tail_at = s + l, tail = size - tail_at;
	if (max_size < size)
		return size;
	size_t room = max_size - size + l; /* the record may grow into the free space */
	if (room > MPA_MAX_ULPDU)
		room = MPA_MAX_ULPDU;
	if (l > room) /* a record longer than an ULPDU may be: leave it to libFuzzer */
		return LLVMFuzzerMutate(data, size, max_size);
	uint8_t *rec = malloc(room ? room : 1), *rest = malloc(tail ? tail : 1);
	memcpy(rec, data + s, l);
	memcpy(rest, data + tail_at, tail);
	size_t nl = LLVMFuzzerMutate(rec, l, room);
	/* A 10-million run (2026-11-26) wrote the tail past max_size here (ASan, 8192-byte
	 * buffer): the nested LLVMFuzzerMutate returned more than the room it was given. Clamp,
	 * whatever the cause, so the harness never writes outside libFuzzer's buffer. */
	if (nl > room)
		nl = room;
	memcpy(data + s, rec, nl);
	memcpy(data + s + nl, rest, tail);
	data[starts[pick] + 1] = (uint8_t)(nl >> 8);
	data[starts[pick] + 2] = (uint8_t)nl;
	free(rec);
	free(rest);
	return size - l + nl;
}
