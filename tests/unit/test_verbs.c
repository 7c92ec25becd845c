/*
 * test_verbs.c - the soft provider through the public verbs interface, two QPs in one process
 * over loopback UDP: every opcode on UD and RD, segmentation, Write-Record records under loss,
 * placement checks, and the error queue.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dgverbs.h"
#include "frame.h"
#include "wire.h"
#include "wait_wc.h"

struct side {
	struct dgv_cq *cq;
	struct dgv_qp *qp;
	struct dgv_ah *ah_peer;
	uint8_t *buf;
	struct dgv_mr *mr;
};

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static struct side A, B;
#define BUFSZ (4u << 20)

/* One side: a CQ, a QP made from *a (CQs filled in; no faults and IPv4 loopback unless a says
 * otherwise) and a zeroed, fully accessible buffer of bufsz bytes. Returns dgv_create_qp's
 * result; on failure nothing else was made. */
static int side_open(struct side *s, struct dgv_qp_init_attr *a, size_t bufsz)
{
	static const struct dgv_fault none;
	static struct sockaddr_in lo = {.sin_family = AF_INET};
	lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(dgv_create_cq(ctx, 4096, &s->cq), 0);
	a->send_cq = a->recv_cq = s->cq;
	if (!a->bind_addr) {
		a->bind_addr = (struct sockaddr *)&lo;
		a->bind_len = sizeof lo;
	}
	if (!a->fault_tx)
		a->fault_tx = &none;
	if (!a->fault_rx)
		a->fault_rx = &none;
	int rc = dgv_create_qp(pd, a, &s->qp);
	if (rc) {
		dgv_destroy_cq(s->cq);
		return rc;
	}
	s->buf = aligned_alloc(4096, bufsz);
	memset(s->buf, 0, bufsz);
	cr_assert_eq(dgv_reg_mr(pd, s->buf, bufsz,
				DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &s->mr), 0);
	s->ah_peer = NULL;
	return 0;
}

static void side_init(struct side *s, enum dgv_qp_type t, const struct dgv_fault *frx, uint32_t seg)
{
	struct dgv_qp_init_attr a = {.qp_type = t, .max_send_wr = 1024, .max_recv_wr = 1024,
				     .seg_size = seg, .fault_rx = frx, .reasm_timeout_us = 20000};
	cr_assert_eq(side_open(s, &a, BUFSZ), 0);
}

static void open_ctx(void)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
}

static void link_sides(void)
{
	union dgv_sockaddr a;
	socklen_t l;
	cr_assert_eq(dgv_qp_local_addr(B.qp, &a, &l), 0);
	cr_assert_eq(dgv_create_ah(pd, &a.sa, l, &A.ah_peer), 0);
	cr_assert_eq(dgv_qp_local_addr(A.qp, &a, &l), 0);
	cr_assert_eq(dgv_create_ah(pd, &a.sa, l, &B.ah_peer), 0);
}

static void setup_pair(enum dgv_qp_type t, const struct dgv_fault *frx, uint32_t seg)
{
	open_ctx();
	side_init(&A, t, frx, seg);
	side_init(&B, t, frx, seg);
	link_sides();
}

static void side_fini(struct side *s)
{
	if (s->ah_peer)
		dgv_destroy_ah(s->ah_peer);
	dgv_destroy_qp(s->qp);
	dgv_destroy_cq(s->cq);
	dgv_dereg_mr(s->mr);
	free(s->buf);
}

static void teardown_pair(void)
{
	side_fini(&A);
	side_fini(&B);
	cr_expect_eq(dgv_dealloc_pd(pd), 0);
	dgv_close(ctx);
}

/* Polls s until one completion arrives or timeout_ms passes; returns 1 or 0. */
static int wait_wc(struct side *s, struct dgv_wc *wc, int timeout_ms) { return cq_wait_one(s->cq, wc, timeout_ms); }

static void post_recv(struct side *s, uint64_t off, uint32_t len, uint64_t id)
{
	struct dgv_sge sge = {(uint64_t)(uintptr_t)(s->buf + off), len, s->mr->lkey};
	struct dgv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
	cr_assert_eq(dgv_post_recv(s->qp, &wr, NULL), 0);
}

static void post_send(struct side *s, enum dgv_wr_opcode op, uint64_t off, uint32_t len,
		      uint64_t raddr, uint32_t rkey, uint64_t id)
{
	struct dgv_sge sge = {(uint64_t)(uintptr_t)(s->buf + off), len, s->mr->lkey};
	struct dgv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .ah = s->ah_peer,
				 .remote_addr = raddr, .rkey = rkey};
	cr_assert_eq(dgv_post_send(s->qp, &wr, NULL), 0);
}

static void fill(uint8_t *p, uint32_t len, uint32_t seed)
{
	for (uint32_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 131u + (i >> 8));
}

static void send_recv_case(enum dgv_qp_type t, uint32_t len)
{
	setup_pair(t, NULL, 0);
	post_recv(&B, 0, BUFSZ / 2, 7);
	fill(A.buf, len, len);
	post_send(&A, DGV_WR_SEND, 0, len, 0, 0, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000), "no receive completion for %u bytes", len);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, DGV_WC_RECV);
	cr_assert_eq(wc.wr_id, 7);
	cr_assert_eq(wc.byte_len, len);
	cr_assert_eq(wc.src.sa.sa_family, AF_INET);
	cr_assert_eq(memcmp(A.buf, B.buf, len), 0);
	cr_assert(wait_wc(&A, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, DGV_WC_SEND);
	cr_assert_eq(wc.wr_id, 1);
	teardown_pair();
}

Test(ud, send_small) { send_recv_case(DGV_QPT_UD, 64); }
Test(ud, send_zero) { send_recv_case(DGV_QPT_UD, 0); }
Test(ud, send_multi_segment) { send_recv_case(DGV_QPT_UD, 1u << 20); }
Test(rd, send_small) { send_recv_case(DGV_QPT_RD, 64); }
Test(rd, send_multi_segment) { send_recv_case(DGV_QPT_RD, 1u << 20); }

static void write_record_case(enum dgv_qp_type t, uint32_t len)
{
	setup_pair(t, NULL, 0);
	fill(A.buf, len, 3);
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, (uint64_t)(uintptr_t)(B.buf + 4096), B.mr->rkey, 9);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(wc.record.stag, B.mr->rkey);
	cr_assert_eq(wc.record.base, (uint64_t)(uintptr_t)(B.buf + 4096));
	cr_assert_eq(wc.record.length, len);
	cr_assert_eq(wc.record.valid_bytes, len);
	cr_assert_eq(wc.record.nranges, 1);
	cr_assert_eq(wc.record.ranges[0].offset, 0);
	cr_assert_eq(wc.record.ranges[0].length, len);
	cr_assert_eq(memcmp(A.buf, B.buf + 4096, len), 0);
	cr_assert(wait_wc(&A, &wc, 3000));
	cr_assert_eq(wc.opcode, DGV_WC_WRITE_RECORD);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	teardown_pair();
}

Test(ud, write_record_single) { write_record_case(DGV_QPT_UD, 1000); }
Test(ud, write_record_multi) { write_record_case(DGV_QPT_UD, 1u << 20); }
Test(rd, write_record_multi) { write_record_case(DGV_QPT_RD, 1u << 20); }

static void write_read_case(enum dgv_qp_type t, uint32_t len)
{
	setup_pair(t, NULL, 0);
	fill(A.buf, len, 11);
	post_send(&A, DGV_WR_WRITE, 0, len, (uint64_t)(uintptr_t)(B.buf + 100), B.mr->rkey, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&A, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, DGV_WC_WRITE);
	/* No target completion for a plain Write: poll until the bytes are there. */
	for (int i = 0; i < 3000 && memcmp(A.buf, B.buf + 100, len); i++) {
		dgv_poll_cq(B.cq, 1, &wc);
		dgv_cq_wait(B.cq, 1);
	}
	cr_assert_eq(memcmp(A.buf, B.buf + 100, len), 0);
	/* Read it back into another part of A. A UD Read of many datagrams ends PARTIAL when the
	 * loopback drops one of them on a loaded machine (unreliable, correct): asked again then,
	 * at most 5 times; RD must succeed the first time. */
	for (int k = 0; k < 5; k++) {
		post_send(&A, DGV_WR_READ, len + 8192, len, (uint64_t)(uintptr_t)(B.buf + 100), B.mr->rkey, 2);
		cr_assert(wait_wc(&A, &wc, 3000));
		if (t != DGV_QPT_UD || wc.status != DGV_WC_PARTIAL)
			break;
	}
	cr_assert_eq(wc.status, DGV_WC_SUCCESS, "read status %d", wc.status);
	cr_assert_eq(wc.opcode, DGV_WC_READ);
	cr_assert_eq(wc.byte_len, len);
	cr_assert_eq(memcmp(A.buf, A.buf + len + 8192, len), 0);
	teardown_pair();
}

Test(ud, write_and_read_small) { write_read_case(DGV_QPT_UD, 512); }
Test(ud, write_and_read_large) { write_read_case(DGV_QPT_UD, 1u << 20); }
Test(rd, write_and_read_small) { write_read_case(DGV_QPT_RD, 512); }
Test(rd, write_and_read_large) { write_read_case(DGV_QPT_RD, 3u << 19); }

/* Write-Record under 10 % receive loss: the record names exactly the bytes that arrived. */
Test(ud, write_record_partial_under_loss)
{
	struct dgv_fault f = {.loss_pct = 10, .seed = 42};
	setup_pair(DGV_QPT_UD, &f, 0);
	uint32_t len = 2u << 20;
	fill(A.buf, len, 77);
	for (uint32_t i = 0; i < len; i++)
		if (!A.buf[i])
			A.buf[i] = 1; /* no zero bytes: untouched target bytes stay 0 */
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, (uint64_t)(uintptr_t)B.buf, B.mr->rkey, 5);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(wc.status, DGV_WC_PARTIAL);
	cr_assert_lt(wc.record.valid_bytes, len);
	cr_assert_gt(wc.record.valid_bytes, len / 2);
	uint64_t sum = 0, prev_end = 0;
	for (uint32_t r = 0; r < wc.record.nranges; r++) {
		const struct dgv_range *g = &wc.record.ranges[r];
		cr_assert(r == 0 || g->offset > prev_end, "ranges sorted, disjoint and coalesced");
		/* bytes in a gap before this range were never written */
		for (uint64_t i = prev_end; i < g->offset; i++)
			cr_assert_eq(B.buf[i], 0, "byte %lu outside the record was written", (unsigned long)i);
		cr_assert_eq(memcmp(B.buf + g->offset, A.buf + g->offset, g->length), 0);
		sum += g->length;
		prev_end = g->offset + g->length;
	}
	for (uint64_t i = prev_end; i < len; i++)
		cr_assert_eq(B.buf[i], 0);
	cr_assert_eq(sum, wc.record.valid_bytes);
	teardown_pair();
}

/* The last segment lost: the message is still recorded (reassembly timeout), not lost whole. */
Test(ud, write_record_last_segment_lost)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	uint32_t seg = 1472 - 30 - 4;
	uint32_t len = seg * 10 + 100;
	fill(A.buf, len, 5);
	/* Register a target region that ends before the last segment: that segment is refused,
	 * which loses it just as the network would. */
	struct dgv_mr *mr2;
	cr_assert_eq(dgv_reg_mr(pd, B.buf + (1 << 20), seg * 10,
				DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &mr2), 0);
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, (uint64_t)(uintptr_t)(B.buf + (1 << 20)), mr2->rkey, 5);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_PARTIAL);
	cr_assert_eq(wc.record.valid_bytes, seg * 10);
	cr_assert_eq(wc.record.nranges, 1);
	cr_assert_eq(wc.record.ranges[0].length, seg * 10);
	cr_assert_eq(B.buf[(1 << 20) + seg * 10], 0, "nothing written past the region");
	struct dgv_async_err e;
	cr_assert_eq(dgv_poll_errq(B.qp, 1, &e), 1);
	cr_assert_eq(e.layer, DGV_LAYER_DDP);
	cr_assert_eq(e.etype, 1);
	cr_assert_eq(e.ecode, 0x01, "base or bounds");
	dgv_dereg_mr(mr2);
	teardown_pair();
}

static void expect_reject(uint32_t stag, uint64_t to, uint32_t len, uint8_t layer, uint8_t etype, uint8_t ecode)
{
	fill(A.buf, len, 9);
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, to, stag, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&A, &wc, 3000));
	struct dgv_async_err e;
	int n = 0;
	for (int i = 0; i < 300 && n == 0; i++) {
		n = dgv_poll_errq(B.qp, 1, &e);
		if (!n)
			dgv_cq_wait(B.cq, 5);
	}
	cr_assert_eq(n, 1, "target error queue has the rejection");
	cr_assert_eq(e.layer, layer);
	cr_assert_eq(e.etype, etype);
	cr_assert_eq(e.ecode, ecode, "ecode %#x", e.ecode);
	cr_assert_eq(e.remote, 0);
	/* and the source hears about it through a Terminate */
	n = 0;
	for (int i = 0; i < 300 && n == 0; i++) {
		n = dgv_poll_errq(A.qp, 1, &e);
		if (!n)
			dgv_cq_wait(A.cq, 5);
	}
	cr_assert_eq(n, 1, "source error queue has the Terminate");
	cr_assert_eq(e.remote, 1);
	cr_assert_eq(e.layer, layer);
	cr_assert_eq(e.ecode, ecode);
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 0, "no record for a refused write");
}

Test(ud, placement_checks)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	uint64_t base = (uint64_t)(uintptr_t)B.buf;
	expect_reject(B.mr->rkey ^ 0x01, base, 100, 1, 1, 0x00);          /* bad key */
	expect_reject(B.mr->rkey, base + BUFSZ - 50, 100, 1, 1, 0x01);    /* past the end */
	expect_reject(B.mr->rkey, base - 4096, 100, 1, 1, 0x01);          /* before the start */
	struct dgv_mr *ro;
	cr_assert_eq(dgv_reg_mr(pd, B.buf, 4096, DGV_ACCESS_REMOTE_READ, &ro), 0);
	expect_reject(ro->rkey, base, 100, 0, 1, 0x02);                    /* no remote write */
	dgv_dereg_mr(ro);
	struct dgv_pd *pd2;
	struct dgv_mr *other;
	cr_assert_eq(dgv_alloc_pd(ctx, &pd2), 0);
	cr_assert_eq(dgv_reg_mr(pd2, B.buf, 4096, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &other), 0);
	expect_reject(other->rkey, base, 100, 1, 1, 0x02);                 /* other PD */
	dgv_dereg_mr(other);
	dgv_dealloc_pd(pd2);
	for (uint32_t i = 0; i < BUFSZ; i++)
		cr_assert_eq(B.buf[i], 0, "a refused write touched byte %u", i);
	struct dgv_qp_stats st;
	dgv_qp_stats(B.qp, &st);
	cr_assert_eq(st.placement_rejects, 5);
	teardown_pair();
}

Test(ud, read_refused_completes_with_error)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	struct dgv_wc wc;
	/* the pair's 20 ms reassembly timeout gives a UD Read 80 ms: on a machine loaded enough
	 * the Terminate comes later and the Read ends PARTIAL (unreliable datagrams, correct):
	 * asked again then, at most 5 times */
	for (int k = 0; k < 5; k++) {
		post_send(&A, DGV_WR_READ, 0, 100, (uint64_t)(uintptr_t)B.buf, B.mr->rkey ^ 0x80, 1);
		cr_assert(wait_wc(&A, &wc, 3000));
		cr_assert_eq(wc.opcode, DGV_WC_READ);
		if (wc.status != DGV_WC_PARTIAL)
			break;
	}
	cr_assert_eq(wc.status, DGV_WC_REM_ACCESS_ERR, "status %d", wc.status);
	teardown_pair();
}

Test(verbs, stags_are_not_sequential)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	static uint8_t mem[64];
	struct dgv_mr *m[32];
	int same_key = 0;
	for (int i = 0; i < 32; i++) {
		cr_assert_eq(dgv_reg_mr(pd, mem, sizeof mem, DGV_ACCESS_LOCAL_WRITE, &m[i]), 0);
		if (i && (m[i]->rkey & 0xff) == (m[i - 1]->rkey & 0xff))
			same_key++;
		if (i)
			cr_assert_neq(m[i]->rkey, m[i - 1]->rkey + 1);
	}
	cr_assert_lt(same_key, 4, "keys repeat too often");
	cr_assert_eq(dgv_dealloc_pd(pd), -EBUSY);
	for (int i = 0; i < 32; i++)
		cr_assert_eq(dgv_dereg_mr(m[i]), 0);
	cr_assert_eq(dgv_dealloc_pd(pd), 0);
	dgv_close(ctx);
}

/* A registration after a deregistration takes the old region object again (a process that
 * registers per socket kept one object per registration, up to 16 384), with a new STag, and
 * region objects do not come from the program's heap (they pinned it: docs/shim.md). */
Test(verbs, reregistration_reuses_objects_off_the_heap)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	static uint8_t mem[64];
	struct dgv_mr *m, *keep[8];
	for (int i = 0; i < 8; i++) /* the first objects of the table, whatever they cost */
		cr_assert_eq(dgv_reg_mr(pd, mem, sizeof mem, DGV_ACCESS_LOCAL_WRITE, &keep[i]), 0);
	struct mallinfo2 a = mallinfo2();
	uint32_t last = 0;
	for (int i = 0; i < 5000; i++) {
		cr_assert_eq(dgv_reg_mr(pd, mem, sizeof mem, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &m), 0);
		cr_assert_neq(m->rkey, last, "a reused object must get a new STag");
		last = m->rkey;
		cr_assert_eq(dgv_dereg_mr(m), 0);
	}
	struct mallinfo2 b = mallinfo2();
	long grew = (long)(b.uordblks + b.hblkhd) - (long)(a.uordblks + a.hblkhd);
	cr_assert_lt(grew, 4096, "5000 registrations grew the heap by %ld bytes", grew);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(dgv_dereg_mr(keep[i]), 0);
	cr_assert_eq(dgv_dealloc_pd(pd), 0);
	dgv_close(ctx);
}

Test(verbs, bad_arguments)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	struct dgv_cq *cq;
	struct dgv_qp *qp;
	cr_assert_eq(dgv_create_cq(ctx, 0, &cq), -EINVAL);
	cr_assert_eq(dgv_create_cq(ctx, 16, &cq), 0);
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = cq, .recv_cq = cq, .seg_size = 100};
	cr_assert_eq(dgv_create_qp(pd, &a, &qp), -EINVAL, "segment too small");
	a.seg_size = 70000;
	cr_assert_eq(dgv_create_qp(pd, &a, &qp), -EINVAL, "segment too large");
	a.seg_size = 0;
	a.qp_type = DGV_QPT_RC;
	cr_assert_eq(dgv_create_qp(pd, &a, &qp), -EOPNOTSUPP);
	a.qp_type = DGV_QPT_UD;
	a.max_msg_size = 1000;
	cr_assert_eq(dgv_create_qp(pd, &a, &qp), 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct dgv_ah *ah;
	cr_assert_eq(dgv_create_ah(pd, (struct sockaddr *)&lo, sizeof lo, &ah), 0);
	static uint8_t mem[4096];
	struct dgv_mr *mr;
	cr_assert_eq(dgv_reg_mr(pd, mem, sizeof mem, DGV_ACCESS_LOCAL_WRITE, &mr), 0);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)mem, 2000, mr->lkey};
	struct dgv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND, .ah = ah};
	struct dgv_send_wr *bad;
	cr_assert_eq(dgv_post_send(qp, &wr, &bad), -EMSGSIZE);
	cr_assert_eq(bad, &wr);
	wr.opcode = (enum dgv_wr_opcode)42;
	sge.length = 10;
	cr_assert_eq(dgv_post_send(qp, &wr, &bad), -EINVAL);
	/* an SGE outside its region completes with a local protection error */
	wr.opcode = DGV_WR_SEND;
	sge.addr += 4090;
	cr_assert_eq(dgv_post_send(qp, &wr, &bad), 0);
	struct dgv_wc wc;
	cr_assert_eq(dgv_poll_cq(cq, 1, &wc), 1);
	cr_assert_eq(wc.status, DGV_WC_LOC_PROT_ERR);
	dgv_destroy_ah(ah);
	dgv_destroy_qp(qp);
	dgv_dereg_mr(mr);
	dgv_destroy_cq(cq);
	dgv_dealloc_pd(pd);
	dgv_close(ctx);
}

/* Many Sends in flight, multi-segment ones interleaved with small ones, under reordering
 * (and for RD loss and duplication): nothing is lost, every byte is right, and on RD the
 * completions follow the sender's order. */
static void many_sends(enum dgv_qp_type t, const struct dgv_fault *f)
{
	setup_pair(t, f, 0);
	enum { N = 200, SLOT = 16384 };
	for (int i = 0; i < N; i++)
		post_recv(&B, (uint64_t)i * SLOT, SLOT, (uint64_t)i);
	for (int i = 0; i < N; i++) {
		uint32_t len = (i % 3) ? 100 : 9000;
		fill(A.buf + (uint64_t)i * SLOT, len, (uint32_t)i);
		post_send(&A, DGV_WR_SEND, (uint64_t)i * SLOT, len, 0, 0, (uint64_t)i);
	}
	int got = 0;
	uint32_t last_msn = 0;
	struct dgv_wc wc;
	while (got < N && wait_wc(&B, &wc, 2000)) {
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		uint32_t i = wc.msn; /* the sender's message number = its index here */
		uint32_t len = (i % 3) ? 100 : 9000;
		cr_assert_eq(wc.byte_len, len);
		cr_assert_eq(memcmp(B.buf + wc.wr_id * SLOT, A.buf + (uint64_t)i * SLOT, len), 0,
			     "message %u intact", i);
		if (t == DGV_QPT_RD && got)
			cr_assert_gt(wc.msn, last_msn, "RD completes in the sender's order");
		last_msn = wc.msn;
		got++;
	}
	cr_assert_eq(got, N, "got %d of %d", got, N);
	teardown_pair();
}

/* Waits for n receive completions on B; returns how many came. */
static int recv_n(int n)
{
	struct dgv_wc wc;
	int got = 0;
	while (got < n && wait_wc(&B, &wc, 3000))
		got += wc.status == DGV_WC_SUCCESS;
	return got;
}

/* A CQ's ring starts small and grows while completions pile up (soft cq.c ring_grow): the
 * completions come out in order and none is lost, also when the ring had wrapped when it grew,
 * and the CQ works on after it emptied. With the growth's copy taking the entries from the
 * ring's start instead of its head, the order check fails. */
Test(verbs, cq_ring_grows_in_order)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	for (int i = 0; i < 400; i++)
		post_recv(&B, (uint64_t)i * 256, 256, (uint64_t)i);
	uint64_t next = 0, sent = 0;
	struct dgv_wc wc;
	/* rounds: send k, wait for them to arrive (their send completions are in A's CQ by
	 * then), poll back only some, so the ring wraps and then overflows its size */
	const int plan[][2] = {{10, 6}, {12, 0}, {30, 20}, {100, 0}, {40, 166}};
	for (unsigned r = 0; r < sizeof plan / sizeof plan[0]; r++) {
		for (int i = 0; i < plan[r][0]; i++, sent++)
			post_send(&A, DGV_WR_SEND, 0, 16, 0, 0, sent);
		cr_assert_eq(recv_n(plan[r][0]), plan[r][0], "round %u: datagrams arrived", r);
		for (int i = 0; i < plan[r][1]; i++) {
			cr_assert(wait_wc(&A, &wc, 3000), "round %u: send completion %d of %d", r, i, plan[r][1]);
			cr_assert_eq(wc.status, DGV_WC_SUCCESS);
			cr_assert_eq(wc.wr_id, next, "round %u: completion %" PRIu64 " came as %" PRIu64, r, next,
				     wc.wr_id);
			next++;
		}
	}
	cr_assert_eq(next, sent, "every send completed once (%" PRIu64 " of %" PRIu64 ")", next, sent);
	cr_assert_eq(dgv_poll_cq(A.cq, 1, &wc), 0, "no completion left over");
	teardown_pair();
}

Test(ud, many_sends_reordered)
{
	struct dgv_fault f = {.reorder_pct = 30, .reorder_depth = 3, .seed = 7};
	many_sends(DGV_QPT_UD, &f);
}

Test(rd, many_sends_lossy_in_order)
{
	struct dgv_fault f = {.loss_pct = 5, .reorder_pct = 5, .reorder_depth = 3, .dup_pct = 2, .seed = 9};
	many_sends(DGV_QPT_RD, &f);
}

/* A QP on an adopted, connect()ed socket (the shim hands over VLC's): sends to the connected
 * peer and to another address both arrive, and the QP does not close the program's fd. */
Test(ud, adopted_connected_socket)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(fd, (struct sockaddr *)&lo, sizeof lo), 0);
	union dgv_sockaddr b;
	socklen_t bl;
	cr_assert_eq(dgv_qp_local_addr(B.qp, &b, &bl), 0);
	cr_assert_eq(connect(fd, &b.sa, bl), 0);
	static const struct dgv_fault none;
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = A.cq, .recv_cq = A.cq,
				     .use_adopt_fd = 1, .adopt_fd = fd, .fault_tx = &none, .fault_rx = &none};
	struct dgv_qp *q;
	cr_assert_eq(dgv_create_qp(pd, &a, &q), 0);
	post_recv(&B, 0, 65536, 1);
	fill(A.buf, 5000, 1);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)A.buf, 5000, A.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_SIGNALED, .ah = A.ah_peer};
	cr_assert_eq(dgv_post_send(q, &wr, NULL), 0);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.byte_len, 5000);
	cr_assert_eq(memcmp(A.buf, B.buf, 5000), 0);
	union dgv_sockaddr me;
	socklen_t ml = sizeof me;
	getsockname(fd, &me.sa, &ml);
	cr_assert_eq(wc.src.sin.sin_port, me.sin.sin_port, "source is the adopted socket");
	cr_assert_eq(dgv_destroy_qp(q), 0);
	cr_assert_eq(fcntl(fd, F_GETFD), 0, "the program's fd stays open");
	close(fd);
	teardown_pair();
}

/* A UD QP of B's on a new socket bound to 127.0.0.1 (*fd) that it adopts and reads only when
 * asked (rx_hold), no faults: the shim's QP on a program's socket; *to_it: an AH to it. */
static struct dgv_qp *adopted_rx_hold_qp(int *fd, struct dgv_ah **to_it)
{
	*fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(*fd, (struct sockaddr *)&lo, sizeof lo), 0);
	static const struct dgv_fault none;
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = B.cq, .recv_cq = B.cq, .max_send_wr = 16,
				     .max_recv_wr = 16, .rx_hold = 1, .use_adopt_fd = 1, .adopt_fd = *fd,
				     .fault_tx = &none, .fault_rx = &none};
	struct dgv_qp *q;
	cr_assert_eq(dgv_create_qp(pd, &a, &q), 0);
	union dgv_sockaddr to;
	socklen_t tl = sizeof to.sin;
	cr_assert_eq(getsockname(*fd, &to.sa, &tl), 0);
	cr_assert_eq(dgv_create_ah(pd, &to.sa, tl, to_it), 0);
	return q;
}

/* dgv_qp_rx_feed: a datagram the caller read itself from an adopted rx_hold socket (a
 * program's blocking receive, the shim's rx_direct) is decoded and placed as if the QP had read
 * it; a QP on its own socket refuses (nobody else may read that one); arguments are checked;
 * what exceeds the QP's buffer is dropped and counted, as when the QP reads it. */
Test(ud, rx_feed_places_a_datagram_read_by_the_caller)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	struct dgv_caps caps;
	cr_assert_eq(dgv_query_caps(ctx, &caps), 0);
	cr_assert_eq(caps.flags & DGV_CAP_RX_FEED, DGV_CAP_RX_FEED);
	int fd;
	struct dgv_ah *ah;
	struct dgv_qp *q = adopted_rx_hold_qp(&fd, &ah);
	struct dgv_sge rs = {(uint64_t)(uintptr_t)B.buf, 65536, B.mr->lkey};
	struct dgv_recv_wr rw = {.wr_id = 77, .sg_list = &rs, .num_sge = 1};
	cr_assert_eq(dgv_post_recv(q, &rw, NULL), 0);
	fill(A.buf, 1000, 4);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)A.buf, 1000, A.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND, .ah = ah};
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	/* the caller's blocking read: the datagram, framed, is not the QP's until fed */
	static uint8_t d[65536];
	union dgv_sockaddr from;
	socklen_t fl = sizeof from;
	ssize_t n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	cr_assert_gt(n, 1000, "one framed datagram: header, payload, CRC");
	struct dgv_wc wc;
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 0, "nothing before the feed (the kernel's buffer is empty)");
	cr_assert_eq(dgv_qp_rx_feed(q, d, (size_t)n, &from.sa, fl), 0);
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 1);
	cr_assert_eq(wc.wr_id, 77);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, DGV_WC_RECV);
	cr_assert_eq(wc.byte_len, 1000);
	cr_assert_eq(memcmp(B.buf, A.buf, 1000), 0);
	union dgv_sockaddr aa;
	socklen_t al;
	cr_assert_eq(dgv_qp_local_addr(A.qp, &aa, &al), 0);
	cr_assert_eq(wc.src.sin.sin_port, aa.sin.sin_port, "the source the caller read");
	/* larger than any datagram the QP reads: dropped and counted, no completion */
	struct dgv_qp_stats st0, st1;
	cr_assert_eq(dgv_qp_stats(q, &st0), 0);
	cr_assert_eq(dgv_post_recv(q, &rw, NULL), 0);
	cr_assert_eq(dgv_qp_rx_feed(q, d, 1u << 20, &from.sa, fl), 0);
	cr_assert_eq(dgv_qp_stats(q, &st1), 0);
	cr_assert_eq(st1.malformed_drops, st0.malformed_drops + 1);
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 0);
	/* bad arguments; a QP that reads its own socket */
	cr_assert_eq(dgv_qp_rx_feed(NULL, d, 10, &from.sa, fl), -EINVAL);
	cr_assert_eq(dgv_qp_rx_feed(q, d, 10, NULL, fl), -EINVAL);
	cr_assert_eq(dgv_qp_rx_feed(q, d, 10, &from.sa, 0), -EINVAL);
	cr_assert_eq(dgv_qp_rx_feed(q, NULL, 10, &from.sa, fl), -EINVAL);
	cr_assert_eq(dgv_qp_rx_feed(B.qp, d, 10, &from.sa, fl), -EOPNOTSUPP);
	dgv_destroy_ah(ah);
	cr_assert_eq(dgv_destroy_qp(q), 0);
	close(fd);
	teardown_pair();
}

/* dgv_qp_rx_take: a datagram that is by itself the next whole message is handed back where it
 * lies (no receive consumed, no completion); one too long for the caller's max, one read while
 * a completion still waits in the CQ (order), and a damaged one go the feed's way (placed in
 * order, or dropped and counted, never handed back). */
Test(ud, rx_take_hands_back_a_whole_message_in_order)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	int fd;
	struct dgv_ah *ah;
	struct dgv_qp *q = adopted_rx_hold_qp(&fd, &ah);
	struct dgv_sge rs[2] = {{(uint64_t)(uintptr_t)B.buf, 4096, B.mr->lkey},
				{(uint64_t)(uintptr_t)B.buf + 4096, 4096, B.mr->lkey}};
	struct dgv_recv_wr rw = {.wr_id = 77, .sg_list = &rs[0], .num_sge = 1};
	cr_assert_eq(dgv_post_recv(q, &rw, NULL), 0);
	static uint8_t d[65536];
	union dgv_sockaddr from;
	socklen_t fl;
	struct dgv_rx_msg m;
	struct dgv_wc wc[2];
	struct dgv_qp_stats st0, st1;
	/* one message of 1000 bytes, read by the caller: taken where it lies */
	fill(A.buf, 3000, 4);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)A.buf, 1000, A.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND, .ah = ah};
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	fl = sizeof from;
	ssize_t n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	cr_assert_gt(n, 1000);
	cr_assert_eq(dgv_qp_stats(q, &st0), 0);
	cr_assert_eq(dgv_qp_rx_take(q, d, (size_t)n, &from.sa, fl, 65536, &m), 1);
	cr_assert(m.framed);
	cr_assert_eq(m.len, 1000);
	cr_assert_leq((size_t)m.off + m.len, (size_t)n);
	cr_assert_eq(memcmp(d + m.off, A.buf, 1000), 0, "the payload where it lies");
	cr_assert_eq(dgv_poll_cq(B.cq, 2, wc), 0, "no completion: nothing was placed");
	cr_assert_eq(dgv_qp_stats(q, &st1), 0);
	cr_assert_eq(st1.rx_msgs, st0.rx_msgs + 1, "counted received");
	cr_assert_eq(st1.rx_datagrams, st0.rx_datagrams + 1);
	/* longer than the caller's max: placed into the receive still posted (wr 77) */
	sge.addr += 1000;
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	fl = sizeof from;
	n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	cr_assert_eq(dgv_qp_rx_take(q, d, (size_t)n, &from.sa, fl, 999, &m), 0);
	/* its completion not yet polled: the next message must not overtake it */
	rw.wr_id = 78, rw.sg_list = &rs[1];
	cr_assert_eq(dgv_post_recv(q, &rw, NULL), 0);
	sge.addr += 1000;
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	fl = sizeof from;
	n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	cr_assert_eq(dgv_qp_rx_take(q, d, (size_t)n, &from.sa, fl, 65536, &m), 0, "order: fed behind the first");
	cr_assert_eq(dgv_poll_cq(B.cq, 2, wc), 2);
	cr_assert_eq(wc[0].wr_id, 77);
	cr_assert_eq(wc[1].wr_id, 78);
	cr_assert_eq(wc[0].byte_len, 1000);
	cr_assert_eq(wc[1].byte_len, 1000);
	cr_assert_eq(memcmp(B.buf, A.buf + 1000, 1000), 0);
	cr_assert_eq(memcmp(B.buf + 4096, A.buf + 2000, 1000), 0);
	/* damaged on the way: dropped and counted, never handed back */
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	fl = sizeof from;
	n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	d[n / 2] ^= 0x40;
	cr_assert_eq(dgv_qp_stats(q, &st0), 0);
	cr_assert_eq(dgv_qp_rx_take(q, d, (size_t)n, &from.sa, fl, 65536, &m), 0);
	cr_assert_eq(dgv_qp_stats(q, &st1), 0);
	cr_assert_eq(st1.crc_drops, st0.crc_drops + 1);
	cr_assert_eq(st1.rx_msgs, st0.rx_msgs);
	cr_assert_eq(dgv_poll_cq(B.cq, 2, wc), 0);
	cr_assert_eq(dgv_qp_rx_take(q, d, 10, &from.sa, fl, 65536, NULL), -EINVAL);
	cr_assert_eq(dgv_qp_rx_take(B.qp, d, 10, &from.sa, fl, 65536, &m), -EOPNOTSUPP);
	dgv_destroy_ah(ah);
	cr_assert_eq(dgv_destroy_qp(q), 0);
	close(fd);
	teardown_pair();
}

/* The provider's thread, as the shim runs it: every QP read only by the program's calls. */
static _Atomic pid_t progress_tid;
static void note_progress_tid(void) { atomic_store(&progress_tid, (pid_t)syscall(SYS_gettid)); }

/* Context switches of thread tid of this process so far (each sleep of the thread is one). */
static long thread_switches(pid_t tid)
{
	char path[64], line[128];
	snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	long n = 0, v;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1 ||
		    sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
			n += v;
	fclose(f);
	return n;
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* While no QP needs the provider's thread (every one read only by the program: rx_hold, no
 * timer pending) its tick sleeps: an idle process is not woken 200 times a second. Work given
 * to a QP meanwhile wakes it: a reassembly begun by a datagram the caller fed expires on time
 * (50 ms) with the program making no call, not at the idle tick's next second. */
Test(ud, idle_tick_sleeps_until_a_qp_has_work)
{
	dgv_set_thread_hook(note_progress_tid);
	open_ctx();
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .max_send_wr = 64, .max_recv_wr = 64, .rx_hold = 1};
	cr_assert_eq(side_open(&A, &a, 1u << 20), 0);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(fd, (struct sockaddr *)&lo, sizeof lo), 0);
	struct dgv_qp_init_attr b = {.qp_type = DGV_QPT_UD, .max_send_wr = 64, .max_recv_wr = 64, .rx_hold = 1,
				     .use_adopt_fd = 1, .adopt_fd = fd, .reasm_timeout_us = 50000};
	cr_assert_eq(side_open(&B, &b, 1u << 20), 0);
	link_sides();
	for (int i = 0; i < 200 && !atomic_load(&progress_tid); i++)
		usleep(1000);
	pid_t tid = atomic_load(&progress_tid);
	cr_assert_gt(tid, 0, "the provider's thread ran the thread hook");
	usleep(100000); /* a tick or two find nothing to do */
	long s0 = thread_switches(tid);
	usleep(300000);
	long idle_wakes = thread_switches(tid) - s0;
	cr_assert_leq(idle_wakes, 3, "the idle thread woke %ld times in 300 ms (a 5 ms tick: 60)", idle_wakes);

	/* the first of three segments, read and fed by the caller; the others never come */
	post_recv(&B, 0, 65536, 9);
	fill(A.buf, 4000, 3);
	post_send(&A, DGV_WR_SEND, 0, 4000, 0, 0, 1);
	static uint8_t d[65536];
	union dgv_sockaddr from;
	socklen_t fl = sizeof from;
	ssize_t n = recvfrom(fd, d, sizeof d, 0, &from.sa, &fl);
	cr_assert_gt(n, 0);
	cr_assert_lt(n, 1500, "a segment, not the whole message");
	while (recv(fd, d + n, sizeof d - (size_t)n, MSG_DONTWAIT) > 0)
		; /* the rest lost */
	struct dgv_qp_stats st;
	cr_assert_eq(dgv_qp_stats(B.qp, &st), 0);
	cr_assert_eq(st.reasm_timeouts, 0);
	cr_assert_eq(dgv_qp_rx_feed(B.qp, d, (size_t)n, &from.sa, fl), 0);
	uint64_t t0 = now_ms(), waited = 0;
	for (;;) {
		cr_assert_eq(dgv_qp_stats(B.qp, &st), 0); /* reads counters: no progress */
		waited = now_ms() - t0;
		if (st.reasm_timeouts || waited > 3000)
			break;
		usleep(2000);
	}
	cr_assert_eq(st.reasm_timeouts, 1, "the partial message was given up");
	cr_assert_lt(waited, 300, "given up after %" PRIu64 " ms (timeout 50 ms): the tick slept on", waited);
	struct dgv_wc wc;
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 0, "a Send given up completes nothing");
	teardown_pair();
	close(fd);
}

/* IPv6 queue pairs and address handles. */
Test(ud, ipv6_send_and_write_record)
{
	open_ctx();
	struct side *s[2] = {&A, &B};
	for (int i = 0; i < 2; i++) {
		struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
		struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .bind_addr = (struct sockaddr *)&lo,
					     .bind_len = sizeof lo};
		int rc = side_open(s[i], &a, BUFSZ);
		if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT)
			cr_skip_test("no IPv6 loopback here");
		cr_assert_eq(rc, 0);
	}
	link_sides();
	post_recv(&B, 0, 65536, 1);
	fill(A.buf, 20000, 4);
	post_send(&A, DGV_WR_SEND, 0, 20000, 0, 0, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.src.sa.sa_family, AF_INET6);
	cr_assert_eq(wc.src_len, sizeof(struct sockaddr_in6));
	cr_assert_eq(memcmp(A.buf, B.buf, 20000), 0);
	post_send(&A, DGV_WR_WRITE_RECORD, 0, 5000, (uint64_t)(uintptr_t)(B.buf + 100000), B.mr->rkey, 2);
	do
		cr_assert(wait_wc(&B, &wc, 3000));
	while (wc.opcode != DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(wc.record.valid_bytes, 5000);
	teardown_pair();
}

/* The CQ's fd: armed, it turns readable when a completion arrives; poll(2) can wait on it. */
Test(verbs, cq_fd_readable_after_notify)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	post_recv(&B, 0, 4096, 1);
	cr_assert_eq(dgv_req_notify_cq(B.cq, 0), 0);
	struct pollfd p = {.fd = dgv_cq_fd(B.cq), .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 0), 0, "not readable before anything arrived");
	fill(A.buf, 100, 1);
	post_send(&A, DGV_WR_SEND, 0, 100, 0, 0, 1);
	/* nobody polls B: the progress thread must receive it and raise the fd */
	cr_assert_eq(poll(&p, 1, 3000), 1, "the fd became readable");
	cr_assert_eq(dgv_cq_ack_event(B.cq), 0);
	struct dgv_wc wc;
	cr_assert_eq(dgv_poll_cq(B.cq, 1, &wc), 1);
	cr_assert_eq(wc.opcode, DGV_WC_RECV);
	cr_assert_eq(dgv_cq_wait(B.cq, 20), -ETIMEDOUT, "a blocking wait times out when nothing comes");
	teardown_pair();
}

/* Eventfds this process holds now (/proc/self/fd links to "anon_inode:[eventfd]"). */
static int eventfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	struct dirent *e;
	cr_assert_not_null(d);
	while ((e = readdir(d))) {
		char path[300], link[64];
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t l = readlink(path, link, sizeof link - 1);
		if (l > 0) {
			link[l] = 0;
			n += strcmp(link, "anon_inode:[eventfd]") == 0;
		}
	}
	closedir(d);
	return n;
}

/* A CQ makes its eventfd only when first asked for it (the shim's UDP sockets never ask), and
 * says whether every completion of its QPs comes from the program's own calls: a UD QP that
 * reads its socket only then (rx_hold), not RD, not one with fault injection, not one the
 * provider's thread reads. An eventfd made while a completion waits starts readable. */
Test(verbs, cq_self_driven_and_eventfd_on_first_use)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	cr_assert_eq(dgv_cq_self_driven(A.cq), 0, "the provider's thread reads a QP without rx_hold");
	int e0 = eventfds();
	struct side C = {0};
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .max_send_wr = 64, .max_recv_wr = 64, .rx_hold = 1};
	cr_assert_eq(side_open(&C, &a, 1u << 20), 0);
	cr_assert_eq(dgv_cq_self_driven(C.cq), 1);
	union dgv_sockaddr ca, ba;
	socklen_t cl, bl;
	struct dgv_ah *to_c;
	cr_assert_eq(dgv_qp_local_addr(C.qp, &ca, &cl), 0);
	cr_assert_eq(dgv_qp_local_addr(B.qp, &ba, &bl), 0);
	cr_assert_eq(dgv_create_ah(pd, &ca.sa, cl, &to_c), 0);
	cr_assert_eq(dgv_create_ah(pd, &ba.sa, bl, &C.ah_peer), 0);
	/* A -> C, polled by C's own calls */
	post_recv(&C, 0, 4096, 5);
	fill(A.buf, 100, 3);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)A.buf, 100, A.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND, .ah = to_c};
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	struct dgv_wc wc;
	int got = 0;
	for (int i = 0; i < 3000 && !got; i++)
		if (!(got = dgv_poll_cq(C.cq, 1, &wc)))
			usleep(1000);
	cr_assert_eq(got, 1, "C's own poll received the datagram");
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(memcmp(C.buf, A.buf, 100), 0);
	cr_assert_eq(eventfds(), e0, "no eventfd made for C's CQ while nobody asked for it");
	/* C -> B, its send completion left in the CQ: the eventfd made now starts readable */
	post_send(&C, DGV_WR_SEND, 0, 100, 0, 0, 9);
	for (int i = 0; i < 3000 && dgv_cq_ready(C.cq) < 1; i++)
		usleep(1000);
	cr_assert_eq(dgv_cq_ready(C.cq), 1, "the send completed");
	int fd = dgv_cq_fd(C.cq);
	cr_assert_geq(fd, 0);
	cr_assert_eq(eventfds(), e0 + 1);
	cr_assert_eq(dgv_cq_fd(C.cq), fd, "made once");
	struct pollfd p = {.fd = fd, .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 0), 1, "readable: a completion was there before the eventfd");
	cr_assert_eq(dgv_cq_ack_event(C.cq), 0);
	cr_assert_eq(dgv_poll_cq(C.cq, 1, &wc), 1);
	cr_assert_eq(wc.wr_id, 9);
	dgv_destroy_ah(to_c);
	side_fini(&C);
	/* RD, and UD with fault injection: the provider's thread makes completions of their own */
	struct side D = {0}, E = {0};
	struct dgv_qp_init_attr ad = {.qp_type = DGV_QPT_RD, .max_send_wr = 64, .max_recv_wr = 64, .rx_hold = 1};
	cr_assert_eq(side_open(&D, &ad, 1u << 20), 0);
	cr_assert_eq(dgv_cq_self_driven(D.cq), 0, "RD");
	static const struct dgv_fault loss = {.loss_pct = 1};
	struct dgv_qp_init_attr ae = {.qp_type = DGV_QPT_UD, .max_send_wr = 64, .max_recv_wr = 64, .rx_hold = 1,
				      .fault_rx = &loss};
	cr_assert_eq(side_open(&E, &ae, 1u << 20), 0);
	cr_assert_eq(dgv_cq_self_driven(E.cq), 0, "fault injection");
	side_fini(&D);
	side_fini(&E);
	teardown_pair();
}

/* One CQ fed by more QPs than it holds inline (4): its list grows, and polling it still
 * progresses every QP (each receives a datagram that only its own socket has). */
Test(verbs, cq_with_many_qps)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	enum { NQ = 7 };
	struct dgv_qp *q[NQ];
	struct dgv_ah *ah[NQ];
	static const struct dgv_fault none;
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	for (int i = 0; i < NQ; i++) {
		struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = B.cq, .recv_cq = B.cq,
					     .max_send_wr = 16, .max_recv_wr = 16, .fault_tx = &none,
					     .fault_rx = &none, .bind_addr = (struct sockaddr *)&lo,
					     .bind_len = sizeof lo};
		cr_assert_eq(dgv_create_qp(pd, &a, &q[i]), 0, "QP %d on B's CQ", i);
		union dgv_sockaddr la;
		socklen_t ll;
		cr_assert_eq(dgv_qp_local_addr(q[i], &la, &ll), 0);
		cr_assert_eq(dgv_create_ah(pd, &la.sa, ll, &ah[i]), 0);
		struct dgv_sge sge = {(uint64_t)(uintptr_t)(B.buf + (size_t)i * 4096), 4096, B.mr->lkey};
		struct dgv_recv_wr wr = {.wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1};
		cr_assert_eq(dgv_post_recv(q[i], &wr, NULL), 0);
	}
	for (int i = 0; i < NQ; i++) {
		fill(A.buf + (size_t)i * 64, 64, (uint32_t)i);
		struct dgv_sge sge = {(uint64_t)(uintptr_t)(A.buf + (size_t)i * 64), 64, A.mr->lkey};
		struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND, .ah = ah[i]};
		cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	}
	unsigned seen = 0;
	struct dgv_wc wc;
	for (int n = 0; n < NQ && wait_wc(&B, &wc, 3000); n++) {
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert(wc.wr_id >= 100 && wc.wr_id < 100 + NQ);
		seen |= 1u << (wc.wr_id - 100);
	}
	cr_assert_eq(seen, (1u << NQ) - 1, "every QP's datagram completed on the shared CQ (seen 0x%x)", seen);
	for (int i = NQ - 1; i >= 0; i--) {
		dgv_destroy_ah(ah[i]);
		cr_assert_eq(dgv_destroy_qp(q[i]), 0);
	}
	teardown_pair();
}

/* qp.c test hook: the QP's socket takes at most cap bytes of the next send, then is full, until
 * 0; a UD datagram goes whole or not at all, so any cap makes the socket full. */
void soft_qp_test_tx_cap(struct dgv_qp *qpb, uint32_t cap);
#define soft_qp_test_block_tx(qp, on) soft_qp_test_tx_cap((qp), (on) ? UINT32_MAX : 0)

/* DGV_SEND_INLINE: an unsignaled Send from memory nobody registered, which the caller may
 * overwrite as soon as the post returns: sent at once it makes no completion; queued behind a
 * full socket it is sent later with the bytes it had at the post. RD refuses the flag. */
Test(ud, inline_send_from_unregistered_memory)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	struct dgv_caps caps;
	cr_assert_eq(dgv_query_caps(ctx, &caps), 0);
	cr_assert(caps.flags & DGV_CAP_SEND_INLINE);
	char msg[300];
	struct dgv_sge sge = {(uint64_t)(uintptr_t)msg, sizeof msg, 0};
	struct dgv_send_wr wr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_INLINE, .ah = A.ah_peer};
	struct dgv_wc wc;
	for (int round = 0; round < 2; round++) {
		/* round 1: the socket is full during the post, so the provider keeps a copy */
		post_recv(&B, 0, 4096, 10 + (uint64_t)round);
		memset(msg, 'a' + round, sizeof msg);
		soft_qp_test_block_tx(A.qp, round == 1);
		cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
		memset(msg, 'z', sizeof msg); /* the caller's again */
		soft_qp_test_block_tx(A.qp, false);
		cr_assert(wait_wc(&B, &wc, 3000), "round %d: the datagram arrived", round);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.byte_len, sizeof msg);
		for (size_t i = 0; i < sizeof msg; i++)
			cr_assert_eq(B.buf[i], 'a' + round, "round %d byte %zu: what the buffer held at the post", round, i);
		cr_assert_eq(dgv_poll_cq(A.cq, 1, &wc), 0, "round %d: an unsignaled send that went makes no completion", round);
	}
	teardown_pair();
	setup_pair(DGV_QPT_RD, NULL, 0);
	wr.ah = A.ah_peer;
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), -EINVAL, "RD keeps its sends for retransmission: no inline");
	teardown_pair();
}

/* dgv_send_now: a one-datagram UD Send goes during the call from the caller's pieces (one
 * datagram, no completion, the receiver gets the bytes and the order); what it cannot send now
 * (a message of several datagrams, a socket with no room, something queued before it) it
 * leaves alone with -EAGAIN, so that dgv_post_send takes it; RD and bad arguments are refused. */
Test(ud, send_now_sends_one_datagram_or_leaves_it_to_the_post)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	char a[100], b[200];
	memset(a, 'a', sizeof a);
	memset(b, 'b', sizeof b);
	struct iovec two[2] = {{a, sizeof a}, {b, sizeof b}};
	struct dgv_qp_stats st0, st1;
	struct dgv_wc wc;
	cr_assert_eq(dgv_qp_stats(A.qp, &st0), 0);
	post_recv(&B, 0, 4096, 30);
	cr_assert_eq(dgv_send_now(A.qp, A.ah_peer, two, 2), 0);
	memset(a, 'z', sizeof a); /* the caller's again */
	cr_assert(wait_wc(&B, &wc, 3000), "the datagram arrived");
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(wc.byte_len, sizeof a + sizeof b);
	for (size_t i = 0; i < sizeof a + sizeof b; i++)
		cr_assert_eq(B.buf[i], i < sizeof a ? 'a' : 'b', "byte %zu: the pieces in order", i);
	cr_assert_eq(dgv_qp_stats(A.qp, &st1), 0);
	cr_assert_eq(st1.tx_datagrams - st0.tx_datagrams, 1);
	cr_assert_eq(st1.tx_msgs - st0.tx_msgs, 1);
	cr_assert_eq(dgv_poll_cq(A.cq, 1, &wc), 0, "no completion for a send that went");

	/* larger than one datagram: not sent, the post sends it */
	static char big[5000];
	memset(big, 'c', sizeof big);
	struct iovec bv = {big, sizeof big};
	cr_assert_eq(dgv_send_now(A.qp, A.ah_peer, &bv, 1), -EAGAIN);
	cr_assert_eq(dgv_qp_stats(A.qp, &st0), 0);
	cr_assert_eq(st0.tx_datagrams, st1.tx_datagrams, "nothing sent for a message it left");

	/* a full socket: nothing sent, nothing queued; the post then queues it, and a send_now
	 * behind the queued one is refused too (it would overtake it) */
	post_recv(&B, 4096, 4096, 31);
	post_recv(&B, 8192, 4096, 32);
	soft_qp_test_block_tx(A.qp, true);
	struct iovec av = {a, sizeof a};
	memset(a, 'd', sizeof a);
	cr_assert_eq(dgv_send_now(A.qp, A.ah_peer, &av, 1), -EAGAIN);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)a, sizeof a, 0};
	struct dgv_send_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_INLINE, .ah = A.ah_peer};
	cr_assert_eq(dgv_post_send(A.qp, &wr, NULL), 0);
	soft_qp_test_block_tx(A.qp, false);
	memset(b, 'e', sizeof b);
	struct iovec ev = {b, 10};
	int r = dgv_send_now(A.qp, A.ah_peer, &ev, 1);
	if (r == -EAGAIN) /* still queued: the post goes behind it */
		cr_assert_eq(dgv_post_send(A.qp, &(struct dgv_send_wr){.wr_id = 6, .sg_list = &(struct dgv_sge){(uint64_t)(uintptr_t)b, 10, 0},
						   .num_sge = 1, .opcode = DGV_WR_SEND, .send_flags = DGV_SEND_INLINE,
						   .ah = A.ah_peer}, NULL), 0);
	else
		cr_assert_eq(r, 0, "the queue had drained (the provider's thread pumped it) before this call");
	for (int k = 0; k < 2; k++) {
		cr_assert(wait_wc(&B, &wc, 3000), "datagram %d arrived", k);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.byte_len, k ? 10u : sizeof a, "datagram %d: in the order sent", k);
		cr_assert_eq(B.buf[wc.wr_id == 31 ? 4096 : 8192], k ? 'e' : 'd');
	}

	cr_assert_eq(dgv_send_now(A.qp, NULL, &av, 1), -EINVAL);
	cr_assert_eq(dgv_send_now(A.qp, A.ah_peer, NULL, 1), -EINVAL);
	teardown_pair();
	setup_pair(DGV_QPT_RD, NULL, 0);
	cr_assert_eq(dgv_send_now(A.qp, A.ah_peer, &av, 1), -EAGAIN, "RD keeps its sends: the post's way");
	teardown_pair();
}

/* An inline Send posted while an earlier one waits in the queue (its socket was full) goes
 * behind it, not straight to UDP as a Send into an empty queue does; a signaled one sent at once
 * still completes. */
Test(ud, inline_send_queues_behind_a_waiting_one)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	char m1[64], m2[64];
	memset(m1, 'a', sizeof m1);
	memset(m2, 'b', sizeof m2);
	struct dgv_sge s1 = {(uint64_t)(uintptr_t)m1, sizeof m1, 0}, s2 = {(uint64_t)(uintptr_t)m2, sizeof m2, 0};
	struct dgv_send_wr w1 = {.wr_id = 1, .sg_list = &s1, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_INLINE, .ah = A.ah_peer},
			   w2 = {.wr_id = 2, .sg_list = &s2, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_INLINE | DGV_SEND_SIGNALED, .ah = A.ah_peer};
	struct dgv_wc wc;
	for (int round = 0; round < 2; round++) {
		post_recv(&B, 0, 4096, 20);
		post_recv(&B, 4096, 4096, 21);
		soft_qp_test_block_tx(A.qp, round == 1); /* round 0: both go at once */
		cr_assert_eq(dgv_post_send(A.qp, &w1, NULL), 0);
		soft_qp_test_block_tx(A.qp, false);
		cr_assert_eq(dgv_post_send(A.qp, &w2, NULL), 0);
		for (int k = 0; k < 2; k++) {
			cr_assert(wait_wc(&B, &wc, 3000), "round %d: datagram %d arrived", round, k);
			cr_assert_eq(wc.status, DGV_WC_SUCCESS);
			cr_assert_eq(wc.byte_len, sizeof m1);
			cr_assert_eq(B.buf[wc.wr_id == 20 ? 0 : 4096], k ? 'b' : 'a',
				     "round %d: the datagrams arrive in the order posted", round);
		}
		cr_assert(wait_wc(&A, &wc, 3000), "round %d: the signaled send completes", round);
		cr_assert_eq(wc.wr_id, 2);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.byte_len, sizeof m2);
		cr_assert_eq(dgv_poll_cq(A.cq, 1, &wc), 0, "round %d: the unsignaled one made none", round);
	}
	teardown_pair();
}

/* Asynchronous progress: the target application never calls in, yet one-sided Write-Records
 * are placed and RD acknowledgements flow, so the source's work completes. */
Test(rd, async_progress_without_target_polling)
{
	setup_pair(DGV_QPT_RD, NULL, 0);
	uint32_t len = 300000;
	fill(A.buf, len, 8);
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, (uint64_t)(uintptr_t)B.buf, B.mr->rkey, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&A, &wc, 5000), "the source completes: the target's thread acked");
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	/* The placement is ordered before this read by the acknowledgement on the wire, which
	 * ThreadSanitizer does not see: taking B's QP lock (placement runs under it) shows it. */
	struct dgv_qp_stats fence;
	dgv_qp_stats(B.qp, &fence);
	cr_assert_eq(memcmp(A.buf, B.buf, len), 0, "placed while the target application slept");
	teardown_pair();
}

/* A silent RD peer: error completion within the retry budget, not a hang. */
Test(rd, silent_peer_fails_the_send)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	cr_assert_eq(dgv_create_cq(ctx, 64, &A.cq), 0);
	static const struct dgv_fault none;
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_RD, .send_cq = A.cq, .recv_cq = A.cq,
				     .bind_addr = (struct sockaddr *)&lo, .bind_len = sizeof lo,
				     .fault_tx = &none, .fault_rx = &none, .rd_max_retries = 3};
	cr_assert_eq(dgv_create_qp(pd, &a, &A.qp), 0);
	A.buf = aligned_alloc(4096, 4096);
	cr_assert_eq(dgv_reg_mr(pd, A.buf, 4096, DGV_ACCESS_LOCAL_WRITE, &A.mr), 0);
	/* a bound socket that never answers */
	int mute = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_eq(bind(mute, (struct sockaddr *)&lo, sizeof lo), 0);
	union dgv_sockaddr m;
	socklen_t ml = sizeof m;
	getsockname(mute, &m.sa, &ml);
	cr_assert_eq(dgv_create_ah(pd, &m.sa, ml, &A.ah_peer), 0);
	post_send(&A, DGV_WR_SEND, 0, 100, 0, 0, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&A, &wc, 10000), "no hang");
	cr_assert_eq(wc.status, DGV_WC_RETRY_EXC_ERR);
	struct dgv_qp_stats st;
	dgv_qp_stats(A.qp, &st);
	cr_assert_eq(st.rd_retransmits, 3);
	close(mute);
	dgv_destroy_ah(A.ah_peer);
	dgv_destroy_qp(A.qp);
	dgv_destroy_cq(A.cq);
	dgv_dereg_mr(A.mr);
	free(A.buf);
	dgv_dealloc_pd(pd);
	dgv_close(ctx);
}

/* Destroying a QP flushes what it still holds. */
Test(ud, destroy_flushes_receives)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	post_recv(&B, 0, 4096, 11);
	post_recv(&B, 4096, 4096, 12);
	cr_assert_eq(dgv_destroy_qp(B.qp), 0);
	struct dgv_wc wc[4];
	cr_assert_eq(dgv_poll_cq(B.cq, 4, wc), 2);
	cr_assert_eq(wc[0].status, DGV_WC_WR_FLUSH_ERR);
	cr_assert_eq(wc[0].wr_id, 11);
	cr_assert_eq(wc[1].wr_id, 12);
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD, .send_cq = B.cq, .recv_cq = B.cq};
	cr_assert_eq(dgv_create_qp(pd, &a, &B.qp), 0); /* teardown destroys this one */
	teardown_pair();
}

/* The largest message: 16 MiB as one Write-Record on UD and RD, and as one Send on RD. */
static void max_message(enum dgv_qp_type t)
{
	open_ctx();
	const uint32_t len = 16u << 20;
	struct side *s[2] = {&A, &B};
	for (int i = 0; i < 2; i++) {
		struct dgv_qp_init_attr a = {.qp_type = t, .seg_size = 65000, .reasm_timeout_us = 200000};
		cr_assert_eq(side_open(s[i], &a, len), 0);
	}
	link_sides();
	fill(A.buf, len, 21);
	struct dgv_wc wc;
	if (t == DGV_QPT_RD) {
		/* (on UD one lost datagram of 259 would lose the whole Send: RD only) */
		post_recv(&B, 0, len, 1);
		post_send(&A, DGV_WR_SEND, 0, len, 0, 0, 1);
		do
			cr_assert(wait_wc(&B, &wc, 10000));
		while (wc.opcode != DGV_WC_RECV);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.byte_len, len);
		cr_assert_eq(memcmp(A.buf, B.buf, len), 0);
		memset(B.buf, 0, len);
		/* What orders this memset (and the memcmp) before the Write-Record's placement into
		 * B.buf is that datagram on the wire, which ThreadSanitizer does not see: a call that
		 * takes B's QP lock, under which the soft RNIC places, makes the order visible. */
		struct dgv_qp_stats fence;
		dgv_qp_stats(B.qp, &fence);
	}
	post_send(&A, DGV_WR_WRITE_RECORD, 0, len, (uint64_t)(uintptr_t)B.buf, B.mr->rkey, 2);
	do
		cr_assert(wait_wc(&B, &wc, 10000));
	while (wc.opcode != DGV_WC_RECV_WRITE_RECORD);
	if (t == DGV_QPT_RD)
		cr_assert_eq(wc.record.valid_bytes, len);
	/* UD has no flow control: a busy receiver may lose part of 16 MiB sent at once, but the
	 * record must name exactly the bytes that are right */
	cr_assert_gt(wc.record.valid_bytes, 0);
	uint64_t sum = 0;
	for (uint32_t r = 0; r < wc.record.nranges; r++) {
		cr_assert_eq(memcmp(A.buf + wc.record.ranges[r].offset, B.buf + wc.record.ranges[r].offset,
				    wc.record.ranges[r].length), 0);
		sum += wc.record.ranges[r].length;
	}
	cr_assert_eq(sum, wc.record.valid_bytes);
	teardown_pair();
}

Test(ud, max_message_16mib, .timeout = 60) { max_message(DGV_QPT_UD); }
Test(rd, max_message_16mib, .timeout = 60) { max_message(DGV_QPT_RD); }

/* A receive whose region was deregistered after the post: completes with a local protection
 * error and the memory is not written. */
Test(ud, receive_into_deregistered_region_refused)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	static uint8_t mem[4096];
	memset(mem, 0, sizeof mem);
	struct dgv_mr *m2;
	cr_assert_eq(dgv_reg_mr(pd, mem, sizeof mem, DGV_ACCESS_LOCAL_WRITE, &m2), 0);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)mem, sizeof mem, m2->lkey};
	struct dgv_recv_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1};
	cr_assert_eq(dgv_post_recv(B.qp, &wr, NULL), 0);
	cr_assert_eq(dgv_dereg_mr(m2), 0);
	fill(A.buf, 100, 3);
	post_send(&A, DGV_WR_SEND, 0, 100, 0, 0, 1);
	struct dgv_wc wc;
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.wr_id, 5);
	cr_assert_eq(wc.status, DGV_WC_LOC_PROT_ERR);
	for (size_t i = 0; i < sizeof mem; i++)
		cr_assert_eq(mem[i], 0);
	teardown_pair();
}

/* pass_plain: a plain UDP peer's datagrams reach the QP's receives untouched, a corrupted
 * datagram-iWARP one is still dropped, and SEND_PLAIN reaches the plain peer as its bytes. */
static void plain_case(enum dgv_qp_type t)
{
	open_ctx();
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct dgv_qp_init_attr a = {.qp_type = t, .pass_plain = 1};
	cr_assert_eq(side_open(&B, &a, 65536), 0);
	int plain = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_eq(bind(plain, (struct sockaddr *)&lo, sizeof lo), 0);
	union dgv_sockaddr qa, pa;
	socklen_t ql, pl = sizeof pa;
	dgv_qp_local_addr(B.qp, &qa, &ql);
	getsockname(plain, &pa.sa, &pl);
	post_recv(&B, 0, 2048, 1);
	post_recv(&B, 2048, 2048, 2);
	/* RTP-like, text-like and binary plain datagrams */
	const char *msgs[] = {"\x80\x60\x12\x34 rtp-ish payload", "INVITE sip:bob@example SIP/2.0", "\x47\x40\x11"};
	for (int i = 0; i < 2; i++)
		cr_assert_eq(sendto(plain, msgs[i], strlen(msgs[i]), 0, &qa.sa, ql), (ssize_t)strlen(msgs[i]));
	struct dgv_wc wc;
	for (int i = 0; i < 2; i++) {
		cr_assert(wait_wc(&B, &wc, 3000));
		cr_assert_eq(wc.opcode, DGV_WC_RECV_PLAIN);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		cr_assert_eq(wc.byte_len, strlen(msgs[i]));
		cr_assert_eq(memcmp(B.buf + wc.wr_id * 2048 - 2048, msgs[i], wc.byte_len), 0);
		cr_assert_eq(wc.src.sin.sin_port, pa.sin.sin_port);
	}
	/* A real datagram-iWARP datagram (from a QP of the same type, caught by the plain socket)
	 * with one payload byte flipped is corruption, not plain data. */
	struct dgv_qp_init_attr aa = {.qp_type = t};
	cr_assert_eq(side_open(&A, &aa, 65536), 0);
	cr_assert_eq(dgv_create_ah(pd, &pa.sa, pl, &A.ah_peer), 0);
	fill(A.buf, 30, 7);
	post_send(&A, DGV_WR_SEND, 0, 30, 0, 0, 1);
	uint8_t d[2048];
	ssize_t dl = recv(plain, d, sizeof d, 0);
	cr_assert_gt(dl, 30 + DG_CRC_LEN);
	d[dl - DG_CRC_LEN - 1] ^= 0x5a;
	side_fini(&A);
	post_recv(&B, 4096, 2048, 3);
	cr_assert_eq(sendto(plain, d, (size_t)dl, 0, &qa.sa, ql), dl);
	cr_assert_eq(sendto(plain, msgs[2], 3, 0, &qa.sa, ql), 3);
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.opcode, DGV_WC_RECV_PLAIN);
	cr_assert_eq(wc.byte_len, 3, "the corrupted one was not handed up");
	struct dgv_qp_stats st;
	dgv_qp_stats(B.qp, &st);
	cr_assert_eq(st.crc_drops, 1);
	cr_assert_eq(st.rx_plain, 3);
	/* SEND_PLAIN: exactly the bytes, no framing */
	memcpy(B.buf + 8192, "plain reply", 11);
	struct dgv_ah *ah;
	cr_assert_eq(dgv_create_ah(pd, &pa.sa, pl, &ah), 0);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)(B.buf + 8192), 11, B.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND_PLAIN,
				 .send_flags = DGV_SEND_SIGNALED, .ah = ah};
	cr_assert_eq(dgv_post_send(B.qp, &wr, NULL), 0);
	char got[64];
	ssize_t n = recv(plain, got, sizeof got, 0);
	cr_assert_eq(n, 11);
	cr_assert_eq(memcmp(got, "plain reply", 11), 0);
	cr_assert(wait_wc(&B, &wc, 3000));
	cr_assert_eq(wc.opcode, DGV_WC_SEND_PLAIN);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	close(plain);
	dgv_destroy_ah(ah);
	side_fini(&B);
	dgv_dealloc_pd(pd);
	dgv_close(ctx);
}

Test(ud, pass_plain_interop) { plain_case(DGV_QPT_UD); }
Test(rd, pass_plain_interop) { plain_case(DGV_QPT_RD); }

/* Without pass_plain, plain datagrams never reach a receive (they are not ours). */
Test(ud, plain_dropped_without_pass_plain)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	post_recv(&B, 0, 2048, 1);
	int plain = socket(AF_INET, SOCK_DGRAM, 0);
	union dgv_sockaddr qa;
	socklen_t ql;
	dgv_qp_local_addr(B.qp, &qa, &ql);
	cr_assert_eq(sendto(plain, "hello", 5, 0, &qa.sa, ql), 5);
	struct dgv_wc wc;
	cr_assert_eq(wait_wc(&B, &wc, 100), 0);
	struct dgv_qp_stats st;
	dgv_qp_stats(B.qp, &st);
	cr_assert_eq(st.crc_drops, 1);
	close(plain);
	teardown_pair();
}

/* DGSHIM_FAULT_RX / _TX configure QPs that were given no fault settings; a bad value is refused. */
Test(verbs, fault_injection_from_environment)
{
	open_ctx();
	setenv("DGSHIM_FAULT_RX", "loss=100,seed=1", 1);
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_UD};
	struct dgv_fault none = {0};
	a.fault_tx = &none;
	a.fault_rx = NULL; /* side_open would default it: set up B by hand */
	cr_assert_eq(dgv_create_cq(ctx, 64, &B.cq), 0);
	a.send_cq = a.recv_cq = B.cq;
	cr_assert_eq(dgv_create_qp(pd, &a, &B.qp), 0);
	B.buf = aligned_alloc(4096, 4096);
	cr_assert_eq(dgv_reg_mr(pd, B.buf, 4096, DGV_ACCESS_LOCAL_WRITE, &B.mr), 0);
	B.ah_peer = NULL;
	unsetenv("DGSHIM_FAULT_RX");
	struct dgv_qp_init_attr sa = {.qp_type = DGV_QPT_UD};
	cr_assert_eq(side_open(&A, &sa, 65536), 0);
	link_sides();
	post_recv(&B, 0, 4096, 1);
	for (int i = 0; i < 20; i++)
		post_send(&A, DGV_WR_SEND, 0, 100, 0, 0, (uint64_t)i);
	struct dgv_wc wc;
	cr_assert_eq(wait_wc(&B, &wc, 200), 0, "every datagram dropped at B's receive edge");
	struct dgv_qp_stats st;
	dgv_qp_stats(B.qp, &st);
	cr_assert_eq(st.fault_dropped, 20);
	setenv("DGSHIM_FAULT_TX", "loss=1,nonsense", 1);
	struct dgv_qp *bad;
	struct dgv_qp_init_attr b = {.qp_type = DGV_QPT_UD, .send_cq = B.cq, .recv_cq = B.cq};
	cr_assert_eq(dgv_create_qp(pd, &b, &bad), -EINVAL);
	unsetenv("DGSHIM_FAULT_TX");
	teardown_pair();
}

/* RD with a tiny receive CQ and a slow reader: nothing is lost to CQ overflow; the sender is
 * held back (receiver not ready) until the reader polls. */
Test(rd, full_cq_holds_the_sender)
{
	open_ctx();
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_RD};
	cr_assert_eq(side_open(&A, &a, 1 << 20), 0);
	/* B: its own small receive CQ */
	struct dgv_cq *small;
	cr_assert_eq(dgv_create_cq(ctx, 4, &small), 0);
	struct dgv_qp_init_attr b = {.qp_type = DGV_QPT_RD};
	cr_assert_eq(side_open(&B, &b, 1 << 20), 0);
	dgv_destroy_qp(B.qp);
	static const struct dgv_fault none;
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct dgv_qp_init_attr b2 = {.qp_type = DGV_QPT_RD, .send_cq = B.cq, .recv_cq = small,
				      .bind_addr = (struct sockaddr *)&lo, .bind_len = sizeof lo,
				      .fault_tx = &none, .fault_rx = &none};
	cr_assert_eq(dgv_create_qp(pd, &b2, &B.qp), 0);
	link_sides();
	enum { N = 50 };
	for (int i = 0; i < N; i++)
		post_recv(&B, (uint64_t)i * 1024, 1024, (uint64_t)i);
	for (int i = 0; i < N; i++) {
		A.buf[i * 1024] = (uint8_t)i;
		post_send(&A, DGV_WR_SEND, (uint64_t)i * 1024, 500, 0, 0, (uint64_t)i);
	}
	int got = 0;
	struct dgv_wc wc;
	for (int spins = 0; got < N && spins < 20000; spins++) {
		if (dgv_poll_cq(small, 1, &wc) == 1) {
			cr_assert_eq(wc.status, DGV_WC_SUCCESS);
			cr_assert_eq(wc.msn, (uint32_t)got, "in order");
			cr_assert_eq(B.buf[wc.wr_id * 1024], (uint8_t)got);
			got++;
			usleep(2000); /* a slow reader */
		} else {
			dgv_cq_wait(small, 5);
		}
		dgv_poll_cq(A.cq, 1, &wc);
	}
	cr_assert_eq(got, N);
	struct dgv_qp_stats st;
	dgv_qp_stats(B.qp, &st);
	cr_assert_eq(st.cq_overflows, 0);
	dgv_destroy_qp(B.qp);
	B.qp = NULL;
	cr_assert_eq(dgv_destroy_cq(small), 0);
	teardown_pair();
}

/* device.c's route probes, once per destination host: a server answering many ports of one
 * client host (a socket per call) probed the route for every port */
uint64_t soft_test_path_probes(void);
Test(verbs, path_mtu_probed_once_per_host)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	struct dgv_ah *ah[12];
	uint64_t p0 = soft_test_path_probes();
	for (int i = 0; i < 10; i++) {
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(40000 + i)),
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		cr_assert_eq(dgv_create_ah(pd, (struct sockaddr *)&a, sizeof a, &ah[i]), 0);
	}
	cr_assert_eq(soft_test_path_probes() - p0, 1, "%lu probes for 10 ports of one host",
		     (unsigned long)(soft_test_path_probes() - p0));
	struct sockaddr_in b = {.sin_family = AF_INET, .sin_port = htons(40000), .sin_addr.s_addr = htonl(0x7f000002)};
	cr_assert_eq(dgv_create_ah(pd, (struct sockaddr *)&b, sizeof b, &ah[10]), 0);
	struct sockaddr_in6 c = {.sin6_family = AF_INET6, .sin6_port = htons(40000), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	cr_assert_eq(dgv_create_ah(pd, (struct sockaddr *)&c, sizeof c, &ah[11]), 0);
	cr_assert_eq(soft_test_path_probes() - p0, 3, "another host, another family: probed each");
	for (int i = 0; i < 12; i++)
		cr_assert_eq(dgv_destroy_ah(ah[i]), 0);
	cr_assert_eq(dgv_dealloc_pd(pd), 0);
	dgv_close(ctx);
}

/* A burst of Sends larger than the receive queue, all in the socket's buffer before the
 * receiver polls: the program reposts as completions come, so every one finds a receive. A
 * drain that read on after the queue ran dry dropped the rest (no_wqe) before the program
 * could repost: dgperf UD send_bw of 1 KB messages delivered 1 088 of 5 000 one run in four. */
Test(verbs, ud_burst_beyond_receive_queue_waits_for_reposts)
{
	/* Only the program's polls read B. With the progress thread (DGV_PROGRESS_AUTO) a QP
	 * nobody polls is read by the thread, and a drain that starts with no receive posted
	 * drops Sends as a NIC without a receive would (qp.c rx_drain_into): on a slow machine
	 * (ASan, TSan) the thread took B's first 8 and dropped the other 56 before the test
	 * polled B. The hold under test is the program's own drain's; the whole burst waits in
	 * B's socket before the first poll. */
	struct dgv_context_attr ca = {.progress = DGV_PROGRESS_APP};
	cr_assert_eq(dgv_open(&ca, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	side_init(&A, DGV_QPT_UD, NULL, 0);
	side_init(&B, DGV_QPT_UD, NULL, 0);
	link_sides();
	enum { RQ = 8, N = 64, LEN = 256 };
	for (int i = 0; i < RQ; i++)
		post_recv(&B, (uint64_t)i * LEN, LEN, (uint64_t)i);
	for (int i = 0; i < N; i++)
		post_send(&A, DGV_WR_SEND, (uint64_t)i * LEN, LEN, 0, 0, 1000 + (uint64_t)i);
	struct dgv_wc wc;
	for (int i = 0; i < N; i++) {
		cr_assert_eq(wait_wc(&A, &wc, 2000), 1, "send %d did not complete", i);
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	}
	usleep(50000);
	int got = 0;
	while (got < N && wait_wc(&B, &wc, 300) == 1) {
		cr_assert_eq(wc.status, DGV_WC_SUCCESS);
		got++;
		post_recv(&B, wc.wr_id * LEN, LEN, wc.wr_id); /* the same buffer again */
	}
	struct dgv_qp_stats st;
	cr_assert_eq(dgv_qp_stats(B.qp, &st), 0);
	cr_assert_eq(got, N, "%d of %d received, %lu dropped for want of a receive", got, N,
		     (unsigned long)st.no_wqe_drops);
	cr_assert_eq(st.no_wqe_drops, 0);
	teardown_pair();
}

/* zpages.c: a freed run of zeroed pages is kept for reuse without writing into it (its free-list
 * place is apart from it), so the next object of its size starts with no page resident: an RC
 * QP's rest, recycled by the next connection, costs nothing until that connection writes it. */
void *dg_zalloc(size_t size);
void dg_zfree(void *p, size_t size);

Test(verbs, a_freed_page_run_comes_back_unwritten)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = 9 * (size_t)pg;
	unsigned char v[9];
	uint8_t *p = dg_zalloc(n);
	cr_assert(p);
	memset(p, 0xa5, n);
	cr_assert_eq(mincore(p, n, v), 0);
	for (int i = 0; i < 9; i++)
		cr_assert(v[i] & 1, "page %d written", i);
	dg_zfree(p, n);
	uint8_t *q = dg_zalloc(n);
	cr_assert_eq(q, p, "the freed run is reused");
	cr_assert_eq(mincore(q, n, v), 0);
	for (int i = 0; i < 9; i++)
		cr_assert(!(v[i] & 1), "page %d of the reused run is resident", i);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(q[i], 0, "byte %zu not zero", i);
	dg_zfree(q, n);
}

/* DGV_SEND_NOW is RC's (DGV_CAP_RC_SEND_NOW): on a UD QP the post says -EOPNOTSUPP and posts
 * nothing, so a caller falls back to its queued way. */
Test(verbs, send_now_is_not_for_ud)
{
	setup_pair(DGV_QPT_UD, NULL, 0);
	uint8_t b[16] = {0};
	struct dgv_sge sg = {(uint64_t)(uintptr_t)b, sizeof b, 0};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = DGV_WR_SEND,
				 .send_flags = DGV_SEND_NOW, .ah = A.ah_peer}, *bad = NULL;
	cr_assert_eq(dgv_post_send(A.qp, &wr, &bad), -EOPNOTSUPP);
	cr_assert_eq(bad, &wr);
	struct dgv_wc wc;
	cr_assert_eq(wait_wc(&A, &wc, 50), 0, "nothing was posted");
	teardown_pair();
}
