/*
 * test_gso.c - UDP GSO sends and GRO receives of the soft provider: dg_gso_split on exact,
 * short-tailed and malformed coalesced buffers (no read past the buffer: it ends at a guard
 * page); the trains a UD QP sends are whole datagram-iWARP datagrams back to back (seen by a
 * plain UDP_GRO socket), and single datagrams with DGSHIM_UDP_GSO=off; a GRO train of plain
 * datagrams reaches a pass_plain QP's receives one datagram each with its own boundary, and
 * dgv_peek sees its first; receive-edge loss drops single datagrams of a coalesced train.
 * Sockets are on loopback, ephemeral ports.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc.h"
#include "dgverbs.h"
#include "frame.h"
#include "wire.h"
#include "wait_wc.h"

#ifndef SOL_UDP
#define SOL_UDP IPPROTO_UDP
#endif

/* ------------------------------------------------------------------ dg_gso_split */

Test(gso_split, n_segments_and_short_tail)
{
	static uint8_t buf[5 * 1472 + 37];
	struct dg_gso_piece pc[8];
	int n = dg_gso_split(buf, sizeof buf, 1472, false, pc, 8);
	cr_assert_eq(n, 6);
	for (int i = 0; i < 5; i++) {
		cr_assert_eq(pc[i].buf, buf + (size_t)i * 1472);
		cr_assert_eq(pc[i].len, 1472);
	}
	cr_assert_eq(pc[5].buf, buf + 5 * 1472);
	cr_assert_eq(pc[5].len, 37);
}

Test(gso_split, exact_multiple_has_no_empty_tail)
{
	static uint8_t buf[4 * 300];
	struct dg_gso_piece pc[4];
	cr_assert_eq(dg_gso_split(buf, sizeof buf, 300, false, pc, 4), 4);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(pc[i].len, 300);
	/* gso == len: one datagram */
	cr_assert_eq(dg_gso_split(buf, 300, 300, false, pc, 4), 1);
	cr_assert_eq(pc[0].len, 300);
}

Test(gso_split, malformed_sizes_rejected_and_output_untouched)
{
	static uint8_t buf[3000];
	struct dg_gso_piece pc[2], sentinel = {(uint8_t *)0x1, 0xdeadbeef};
	pc[0] = pc[1] = sentinel;
	cr_assert_eq(dg_gso_split(buf, sizeof buf, 0, false, pc, 2), -EINVAL, "segment size 0");
	cr_assert_eq(dg_gso_split(buf, 1000, 1001, false, pc, 2), -EINVAL, "segment larger than the buffer");
	cr_assert_eq(dg_gso_split(buf, 0, 100, false, pc, 2), -EINVAL, "empty buffer");
	cr_assert_eq(dg_gso_split(buf, 2000, 1000, true, pc, 2), -EINVAL, "truncated tail");
	cr_assert_eq(dg_gso_split(buf, 2001, 1000, false, pc, 2), -EINVAL, "more pieces than room");
	cr_assert_eq(dg_gso_split(buf, 3000, 1000, false, pc, 2), -EINVAL, "more pieces than room");
	cr_assert_eq(dg_gso_split(buf, 3000, (size_t)UINT32_MAX + 1, false, pc, 2), -EINVAL);
	cr_assert_eq(memcmp(&pc[0], &sentinel, sizeof sentinel), 0);
	cr_assert_eq(memcmp(&pc[1], &sentinel, sizeof sentinel), 0);
	cr_assert_eq(dg_gso_split(buf, 2000, 1000, false, pc, 2), 2);
}

/* Real datagrams (header, payload, CRC) in a train that ends at a PROT_NONE page: every piece
 * parses and checks, and a read past the train's end would crash the test. */
Test(gso_split, framed_train_at_a_guard_page)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t map = 32 * (size_t)pg;
	uint8_t *m = mmap(NULL, map + (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(m, MAP_FAILED);
	cr_assert_eq(mprotect(m + map, (size_t)pg, PROT_NONE), 0);
	const uint32_t dgram = 1472, segsz = dgram - DG_TAGGED_HLEN - DG_CRC_LEN, nfull = 7;
	uint32_t tail = 555, ml = nfull * segsz + tail;
	size_t len = (size_t)nfull * dgram + DG_TAGGED_HLEN + tail + DG_CRC_LEN;
	uint8_t *buf = m + map - len;
	for (uint32_t i = 0; i <= nfull; i++) {
		uint8_t *d = buf + (size_t)i * dgram;
		uint32_t plen = i < nfull ? segsz : tail;
		dg_put_tagged((struct dg_tagged_hdr *)d, RDMAP_WRITE_RECORD, i == nfull, 0x1234, 0x10000 + i * segsz,
			      9, i * segsz, ml, (uint16_t)segsz);
		memset(d + DG_TAGGED_HLEN, (int)i + 1, plen);
		be32 crc = htobe32(dg_crc32c(d, DG_TAGGED_HLEN + plen));
		memcpy(d + DG_TAGGED_HLEN + plen, &crc, sizeof crc);
	}
	struct dg_gso_piece pc[DG_GSO_MAX_SEGS];
	int n = dg_gso_split(buf, len, dgram, false, pc, DG_GSO_MAX_SEGS);
	cr_assert_eq(n, (int)nfull + 1);
	for (int i = 0; i < n; i++) {
		cr_assert(dg_crc_check(pc[i].buf, pc[i].len), "piece %d fails its CRC", i);
		struct dg_seg g;
		struct dg_reject why;
		cr_assert_eq(dg_seg_parse(pc[i].buf, pc[i].len - DG_CRC_LEN, 1u << 24, &g, &why), 0);
		cr_assert_eq(g.mo, (uint32_t)i * segsz);
		cr_assert_eq(g.last, i == n - 1);
		cr_assert_eq(g.payload[0], i + 1);
	}
	cr_assert_eq(pc[n - 1].buf + pc[n - 1].len, m + map, "the last piece ends at the guard page");
	/* a segment size that does not divide the train: the last piece is whatever is left,
	 * still inside the buffer */
	n = dg_gso_split(buf, len, 1000, false, pc, DG_GSO_MAX_SEGS);
	cr_assert_gt(n, 0);
	cr_assert_eq(pc[n - 1].buf + pc[n - 1].len, m + map);
	munmap(m, map + (size_t)pg);
}

Test(gso_split, segments_per_send)
{
	cr_assert_eq(dg_gso_max_segs(1472), 44);
	cr_assert_eq(dg_gso_max_segs(1452), 45);
	cr_assert_eq(dg_gso_max_segs(300), DG_GSO_MAX_SEGS);
	cr_assert_eq(dg_gso_max_segs(40000), 1);
	cr_assert_eq(dg_gso_max_segs(0), 0);
	cr_assert_leq((uint64_t)dg_gso_max_segs(1472) * 1472, DG_GSO_MAX_BYTES);
}

/* ------------------------------------------------------------------ on sockets */

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static const struct dgv_fault none;

static void open_ctx(void)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
}

static void close_ctx(void)
{
	cr_expect_eq(dgv_dealloc_pd(pd), 0);
	dgv_close(ctx);
}

struct side {
	struct dgv_cq *cq;
	struct dgv_qp *qp;
	uint8_t *buf;
	struct dgv_mr *mr;
	union dgv_sockaddr addr;
	socklen_t alen;
};

#define BUFSZ (4u << 20)

static void side_open(struct side *s, int pass_plain, const struct dgv_fault *frx)
{
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(dgv_create_cq(ctx, 4096, &s->cq), 0);
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = s->cq, .recv_cq = s->cq,
				     .max_send_wr = 256, .max_recv_wr = 256, .pass_plain = pass_plain,
				     .bind_addr = (struct sockaddr *)&lo, .bind_len = sizeof lo,
				     .fault_tx = &none, .fault_rx = frx ? frx : &none,
				     .seg_size = pass_plain ? 1472 : 0, .reasm_timeout_us = 20000};
	cr_assert_eq(dgv_create_qp(pd, &a, &s->qp), 0);
	s->buf = aligned_alloc(4096, BUFSZ);
	memset(s->buf, 0, BUFSZ);
	cr_assert_eq(dgv_reg_mr(pd, s->buf, BUFSZ,
				DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &s->mr), 0);
	cr_assert_eq(dgv_qp_local_addr(s->qp, &s->addr, &s->alen), 0);
}

static void side_close(struct side *s)
{
	dgv_destroy_qp(s->qp);
	dgv_destroy_cq(s->cq);
	dgv_dereg_mr(s->mr);
	free(s->buf);
}

/* Polls s until one completion arrives or timeout_ms passes; returns 1 or 0. */
static int wait_wc(struct side *s, struct dgv_wc *wc, int timeout_ms) { return cq_wait_one(s->cq, wc, timeout_ms); }

/* A plain loopback UDP socket; with gro, UDP_GRO on (the test is skipped where the kernel
 * has no UDP GRO). */
static int plain_socket(bool gro, union dgv_sockaddr *addr, socklen_t *alen)
{
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&lo, sizeof lo), 0);
	int one = 1, sz = 4 << 20;
	/* room for a whole message sent as single datagrams (the default holds about 90) */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	if (gro && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one))
		cr_skip_test("no UDP GRO in this kernel (%s)", strerror(errno));
	*alen = sizeof *addr;
	cr_assert_eq(getsockname(fd, &addr->sa, alen), 0);
	return fd;
}

/* One receive with its UDP_GRO segment size (0: one datagram). Waits up to 3 s. */
static ssize_t recv_train(int fd, uint8_t *buf, size_t len, int *gso)
{
	struct pollfd p = {fd, POLLIN, 0};
	cr_assert_eq(poll(&p, 1, 3000), 1, "nothing arrived");
	struct iovec v = {buf, len};
	union {
		char b[64];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	ssize_t r = recvmsg(fd, &mh, 0);
	cr_assert_gt(r, 0);
	*gso = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO)
			memcpy(gso, CMSG_DATA(c), sizeof *gso);
	return r;
}

/* Sends n plain datagrams of size seg and one of tail bytes as one UDP_SEGMENT train. */
static void send_plain_train(int fd, const union dgv_sockaddr *to, socklen_t tolen, const uint8_t *data,
			     uint16_t seg, uint32_t n, uint32_t tail)
{
	struct iovec v = {(void *)data, (size_t)seg * n + tail};
	union {
		char b[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct msghdr mh = {.msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &v, .msg_iovlen = 1,
			    .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_UDP;
	c->cmsg_type = UDP_SEGMENT;
	c->cmsg_len = CMSG_LEN(sizeof seg);
	memcpy(CMSG_DATA(c), &seg, sizeof seg);
	ssize_t r = sendmsg(fd, &mh, 0);
	if (r < 0 && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT))
		cr_skip_test("no UDP GSO in this kernel (%s)", strerror(errno));
	cr_assert_eq(r, (ssize_t)v.iov_len);
}

/* A UD QP's Write-Record of many datagrams leaves as GSO trains: a plain UDP_GRO socket gets
 * buffers of 1472-byte datagrams, each with its own header and CRC, offsets back to back. */
/* A UD QP (GSO off with !gso_on) sending to a plain UDP_GRO socket fd through ah. */
static void to_plain_open(bool gso_on, struct side *a, int *fd, struct dgv_ah **ah)
{
	if (!gso_on)
		setenv("DGSHIM_UDP_GSO", "off", 1);
	open_ctx();
	side_open(a, 0, NULL);
	unsetenv("DGSHIM_UDP_GSO");
	union dgv_sockaddr pa;
	socklen_t pl;
	*fd = plain_socket(true, &pa, &pl);
	cr_assert_eq(dgv_create_ah(pd, &pa.sa, pl, ah), 0);
}

static void to_plain_close(struct side *a, int fd, struct dgv_ah *ah)
{
	close(fd);
	dgv_destroy_ah(ah);
	side_close(a);
	close_ctx();
}

/* One receive on fd cut into its datagrams (pc, up to 128): their number, >= 1. */
static int recv_pieces(int fd, uint8_t *rb, size_t len, struct dg_gso_piece *pc)
{
	int gso;
	ssize_t r = recv_train(fd, rb, len, &gso);
	if (!gso) {
		pc[0] = (struct dg_gso_piece){rb, (uint32_t)r};
		return 1;
	}
	int n = dg_gso_split(rb, (size_t)r, (size_t)gso, false, pc, 128);
	cr_assert_gt(n, 0);
	return n;
}

static uint32_t wrec_to_plain(bool gso_on, uint32_t *trains)
{
	struct side a;
	int fd;
	struct dgv_ah *ah;
	to_plain_open(gso_on, &a, &fd, &ah);
	const uint32_t segsz = 1472 - DG_TAGGED_HLEN - DG_CRC_LEN, len = 60 * segsz + 77;
	for (uint32_t i = 0; i < len; i++)
		a.buf[i] = (uint8_t)(i * 13 + 1);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)a.buf, len, a.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				 .send_flags = DGV_SEND_SIGNALED, .ah = ah, .remote_addr = 0x100000, .rkey = 0x77};
	cr_assert_eq(dgv_post_send(a.qp, &wr, NULL), 0);
	struct dgv_wc wc;
	cr_assert(wait_wc(&a, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	static uint8_t rb[65536];
	uint32_t got = 0, bytes = 0;
	*trains = 0;
	while (bytes < len) {
		int gso;
		ssize_t r = recv_train(fd, rb, sizeof rb, &gso);
		struct dg_gso_piece pc[128];
		int n = gso ? dg_gso_split(rb, (size_t)r, (size_t)gso, false, pc, 128) : 1;
		if (!gso)
			pc[0] = (struct dg_gso_piece){rb, (uint32_t)r};
		cr_assert_gt(n, 0);
		if (n > 1) {
			(*trains)++;
			cr_assert_eq(gso, 1472, "trains are cut at the datagram size");
		}
		for (int k = 0; k < n; k++) {
			cr_assert(dg_crc_check(pc[k].buf, pc[k].len), "datagram %u fails its CRC", got);
			struct dg_seg g;
			struct dg_reject why;
			cr_assert_eq(dg_seg_parse(pc[k].buf, pc[k].len - DG_CRC_LEN, 1u << 24, &g, &why), 0,
				     "datagram %u: %s", got, why.reason);
			cr_assert_eq(g.opcode, RDMAP_WRITE_RECORD);
			cr_assert_eq(g.mo, got * segsz, "datagrams in order, back to back: %u at %u, gso %d n %d r %zd", got, g.mo, gso, n, r);
			cr_assert_eq(g.to, 0x100000 + g.mo);
			cr_assert_eq(memcmp(g.payload, a.buf + g.mo, g.plen), 0);
			got++;
			bytes += g.plen;
		}
	}
	cr_assert_eq(bytes, len);
	to_plain_close(&a, fd, ah);
	return got;
}

Test(gso_wire, write_record_leaves_as_trains_of_whole_datagrams)
{
	uint32_t trains;
	cr_assert_eq(wrec_to_plain(true, &trains), 61);
	cr_assert_geq(trains, 2, "60 full datagrams went in %u trains", trains);
}

Test(gso_wire, udp_gso_off_sends_single_datagrams)
{
	uint32_t trains;
	cr_assert_eq(wrec_to_plain(false, &trains), 61);
	cr_assert_eq(trains, 0, "DGSHIM_UDP_GSO=off still sent %u trains", trains);
}

/* A plain peer's GRO train (here a UDP_SEGMENT send: loopback hands it to a UDP_GRO socket
 * whole) reaches a pass_plain QP as one receive per datagram, each with its exact length and
 * bytes; dgv_peek sees only the first datagram. */
Test(gso_wire, plain_train_keeps_datagram_boundaries)
{
	const uint16_t seg = 300;
	const uint32_t n = 10, tail = 123, total = seg * n + tail;
	static uint8_t data[10 * 300 + 123];
	for (uint32_t i = 0; i < total; i++)
		data[i] = (uint8_t)(i / seg * 17 + i % 7 + 0x61); /* text-like: not framed */
	/* the kernel here really coalesces: a plain GRO socket sees the train as one buffer */
	union dgv_sockaddr pa, sa;
	socklen_t pl, sl;
	int probe = plain_socket(true, &pa, &pl);
	int tx = plain_socket(false, &sa, &sl);
	send_plain_train(tx, &pa, pl, data, seg, n, tail);
	static uint8_t rb[65536];
	int gso;
	ssize_t r = recv_train(probe, rb, sizeof rb, &gso);
	if (r != (ssize_t)total || gso != seg)
		cr_skip_test("the kernel does not coalesce loopback trains (got %zd bytes, gso %d)", r, gso);
	close(probe);

	/* only this thread's calls read the QP's socket: the train stays in the kernel until the
	 * receives are posted (a UD datagram with no receive is dropped, and with the progress
	 * thread the peek raced its read: the ThreadSanitizer build, slower, lost that race on
	 * every run) */
	setenv("DGSHIM_PROGRESS", "app", 1);
	open_ctx();
	struct side b;
	side_open(&b, 1, NULL);
	send_plain_train(tx, &b.addr, b.alen, data, seg, n, tail);
	struct dgv_peek pk;
	int pr = -EAGAIN;
	for (int i = 0; i < 300 && pr == -EAGAIN; i++) {
		pr = dgv_peek(b.qp, rb, sizeof rb, &pk);
		if (pr == -EAGAIN)
			usleep(10000);
	}
	cr_assert_eq(pr, 0, "dgv_peek: %d", pr);
	cr_assert_eq(pk.framed, 0);
	cr_assert_eq(pk.msg_len, seg, "peek sees the first datagram, not the train");
	cr_assert_eq(memcmp(rb, data, seg), 0);
	for (uint32_t i = 0; i <= n; i++) {
		struct dgv_sge sge = {(uint64_t)(uintptr_t)(b.buf + i * 2048), 2048, b.mr->lkey};
		struct dgv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1};
		cr_assert_eq(dgv_post_recv(b.qp, &wr, NULL), 0);
	}
	for (uint32_t i = 0; i <= n; i++) {
		struct dgv_wc wc;
		cr_assert(wait_wc(&b, &wc, 3000), "receive %u missing", i);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.opcode, DGV_WC_RECV_PLAIN);
		cr_assert_eq(wc.wr_id, i, "in order");
		cr_assert_eq(wc.byte_len, i < n ? seg : tail, "datagram %u: %u bytes", i, wc.byte_len);
		cr_assert_eq(memcmp(b.buf + i * 2048, data + i * seg, wc.byte_len), 0);
		cr_assert_eq(wc.src.sin.sin_port, sa.sin.sin_port);
	}
	struct dgv_qp_stats st;
	dgv_qp_stats(b.qp, &st);
	cr_assert_eq(st.rx_plain, n + 1);
	cr_assert_eq(st.rx_datagrams, n + 1);
	close(tx);
	side_close(&b);
	close_ctx();
}

/* Receive-edge loss on coalesced trains still drops single datagrams: the Write-Record's
 * missing bytes are exactly the dropped datagrams' payloads, each gap whole datagrams. */
Test(gso_wire, loss_drops_single_datagrams_of_a_train)
{
	struct dgv_fault f = {.loss_pct = 10, .seed = 7};
	open_ctx();
	struct side a, b;
	side_open(&a, 0, NULL);
	side_open(&b, 0, &f);
	struct dgv_ah *ah;
	cr_assert_eq(dgv_create_ah(pd, &b.addr.sa, b.alen, &ah), 0);
	const uint32_t segsz = 1472 - DG_TAGGED_HLEN - DG_CRC_LEN, nseg = 300, len = nseg * segsz;
	for (uint32_t i = 0; i < len; i++)
		a.buf[i] = (uint8_t)(i * 29 + 1) | 1; /* no zero byte: unwritten target bytes stay 0 */
	struct dgv_sge sge = {(uint64_t)(uintptr_t)a.buf, len, a.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				 .send_flags = DGV_SEND_SIGNALED, .ah = ah,
				 .remote_addr = (uint64_t)(uintptr_t)b.buf, .rkey = b.mr->rkey};
	cr_assert_eq(dgv_post_send(a.qp, &wr, NULL), 0);
	struct dgv_wc wc;
	cr_assert(wait_wc(&b, &wc, 3000));
	cr_assert_eq(wc.opcode, DGV_WC_RECV_WRITE_RECORD);
	struct dgv_qp_stats st;
	dgv_qp_stats(b.qp, &st);
	cr_assert_gt(st.fault_dropped, 5);
	cr_assert_lt(st.fault_dropped, nseg / 2, "%lu of %u dropped: trains, not datagrams",
		     (unsigned long)st.fault_dropped, nseg);
	cr_assert_eq(st.rx_datagrams, nseg - st.fault_dropped);
	cr_assert_eq(wc.status, DGV_WC_PARTIAL);
	cr_assert_eq(len - wc.record.valid_bytes, st.fault_dropped * segsz);
	uint64_t prev_end = 0;
	for (uint32_t r = 0; r < wc.record.nranges; r++) {
		const struct dgv_range *g = &wc.record.ranges[r];
		cr_assert_eq(g->offset % segsz, 0);
		cr_assert_eq(g->length % segsz, 0);
		cr_assert_eq(memcmp(b.buf + g->offset, a.buf + g->offset, g->length), 0);
		for (uint64_t i = prev_end; i < g->offset; i++)
			cr_assert_eq(b.buf[i], 0);
		prev_end = g->offset + g->length;
	}
	dgv_destroy_ah(ah);
	side_close(&a);
	side_close(&b);
	close_ctx();
}

/* Small messages posted together to one destination (a chain of 30 one-datagram Sends and
 * Write-Records of 1 000 bytes, then one of 300) leave as GSO trains across the work requests:
 * a plain UDP_GRO socket gets trains of whole datagrams, each a complete message with its own
 * MSN (Sends) or target offset (Write-Records), in the order posted; every work request
 * completes. With DGSHIM_UDP_GSO=off: the same datagrams, one per send. Returns the trains. */
static uint32_t small_to_plain(bool gso_on)
{
	struct side a;
	int fd;
	struct dgv_ah *ah;
	to_plain_open(gso_on, &a, &fd, &ah);
	enum { N = 31, LEN = 1000 };
	struct dgv_sge sge[N];
	struct dgv_send_wr wr[N];
	for (uint32_t i = 0; i < N * LEN; i++)
		a.buf[i] = (uint8_t)(i * 7 + 3);
	for (int i = 0; i < N; i++) {
		bool wrec = i % 3 == 2; /* every third a Write-Record: other header, other size */
		uint32_t len = i == N - 1 ? 300 : LEN;
		sge[i] = (struct dgv_sge){(uint64_t)(uintptr_t)(a.buf + (size_t)i * LEN), len, a.mr->lkey};
		wr[i] = (struct dgv_send_wr){.wr_id = 100 + (uint64_t)i, .sg_list = &sge[i], .num_sge = 1,
					     .opcode = wrec ? DGV_WR_WRITE_RECORD : DGV_WR_SEND,
					     .send_flags = DGV_SEND_SIGNALED, .ah = ah, .next = i + 1 < N ? &wr[i + 1] : NULL,
					     .remote_addr = 0x200000 + (uint64_t)i * LEN, .rkey = 0x55};
	}
	cr_assert_eq(dgv_post_send(a.qp, wr, NULL), 0);
	for (int i = 0; i < N; i++) {
		struct dgv_wc wc;
		cr_assert(wait_wc(&a, &wc, 3000), "completion %d missing", i);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.wr_id, 100 + (uint64_t)i, "completions in order");
	}
	static uint8_t rb[65536];
	uint32_t got = 0, trains = 0, sends = 0, msn0 = 0;
	while (got < N) {
		struct dg_gso_piece pc[128];
		int n = recv_pieces(fd, rb, sizeof rb, pc);
		trains += n > 1;
		for (int k = 0; k < n; k++, got++) {
			cr_assert(dg_crc_check(pc[k].buf, pc[k].len), "datagram %u fails its CRC", got);
			struct dg_seg g;
			struct dg_reject why;
			cr_assert_eq(dg_seg_parse(pc[k].buf, pc[k].len - DG_CRC_LEN, 1u << 24, &g, &why), 0,
				     "datagram %u: %s", got, why.reason);
			bool wrec = got % 3 == 2;
			uint32_t len = got == N - 1 ? 300 : LEN;
			cr_assert_eq(g.opcode, wrec ? RDMAP_WRITE_RECORD : RDMAP_SEND, "datagram %u out of order", got);
			cr_assert(g.last);
			cr_assert_eq(g.mo, 0);
			cr_assert_eq(g.plen, len);
			if (wrec)
				cr_assert_eq(g.to, 0x200000 + (uint64_t)got * LEN);
			else if (sends++ == 0)
				msn0 = g.msn;
			else
				cr_assert_eq(g.msn, msn0 + sends - 1, "Send %u carries MSN %u", got, g.msn);
			cr_assert_eq(memcmp(g.payload, a.buf + (size_t)got * LEN, len), 0);
		}
	}
	cr_assert_eq(got, N);
	to_plain_close(&a, fd, ah);
	return trains;
}

Test(gso_wire, small_messages_leave_as_trains_across_work_requests)
{
	cr_assert_geq(small_to_plain(true), 2, "30 small messages went one datagram per send");
}

Test(gso_wire, small_messages_one_per_send_without_gso)
{
	cr_assert_eq(small_to_plain(false), 0);
}
