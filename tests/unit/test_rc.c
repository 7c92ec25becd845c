/*
 * test_rc.c - RC queue pairs of the soft provider (standard iWARP over TCP) through the public
 * verbs interface: two contexts in one process over 127.0.0.1. Connection management (listen,
 * adopt, reject, disconnect, destroy while connecting), MPA revisions, CRC, markers, every
 * opcode byte-exact up to 16 MiB, ORD limits, Write-Record records, and hostile peers written
 * with raw TCP sockets (malformed MPA frames, CRC mismatch, oversized FPDU, invalid STag, bad
 * QN/MSN), each of which must end in a clear error and, where the connection was up, a
 * Terminate with the expected layer/type/code.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc.h"
#include "dgverbs.h"
#include "frame.h"
#include "mpa.h"
#include "wire.h"

#define BUFSZ (17u << 20)
#define TMO 10000

struct end {
	struct dgv_context *ctx;
	struct dgv_pd *pd;
	struct dgv_cq *cq;
	struct dgv_cm_channel *ch;
	struct dgv_qp *qp;
	uint8_t *buf;
	struct dgv_mr *mr;
};

static struct end C, S; /* client (active) and server (passive) */
static struct dgv_listener *L;

static void end_open(struct end *e)
{
	cr_assert_eq(dgv_open(NULL, &e->ctx), 0);
	cr_assert_eq(dgv_alloc_pd(e->ctx, &e->pd), 0);
	cr_assert_eq(dgv_create_cq(e->ctx, 4096, &e->cq), 0);
	e->ch = dgv_cm_default_channel(e->ctx);
	cr_assert(e->ch);
	e->buf = aligned_alloc(4096, BUFSZ);
	cr_assert(e->buf);
	memset(e->buf, 0, BUFSZ);
	cr_assert_eq(dgv_reg_mr(e->pd, e->buf, BUFSZ,
				DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &e->mr), 0);
	e->qp = NULL;
}

static void end_close(struct end *e)
{
	if (!e->ctx)
		return;
	if (e->qp)
		cr_assert_eq(dgv_destroy_qp(e->qp), 0);
	cr_assert_eq(dgv_dereg_mr(e->mr), 0);
	cr_assert_eq(dgv_destroy_cq(e->cq), 0);
	cr_assert_eq(dgv_dealloc_pd(e->pd), 0);
	dgv_close(e->ctx);
	free(e->buf);
	memset(e, 0, sizeof *e);
}

static void setup(void)
{
	end_open(&C);
	end_open(&S);
	L = NULL;
}

static void teardown(void)
{
	if (L)
		dgv_listener_destroy(L);
	L = NULL;
	end_close(&C);
	end_close(&S);
}

/* Next event on ch within TMO; asserts its type. */
static struct dgv_cm_event wait_ev(struct dgv_cm_channel *ch, enum dgv_cm_event_type type)
{
	struct dgv_cm_event ev;
	for (;;) {
		int r = dgv_cm_get_event(ch, &ev);
		if (r == 0)
			break;
		cr_assert_eq(r, -EAGAIN);
		cr_assert_eq(dgv_cm_wait(ch, TMO), 0, "no CM event (wanted %d)", type);
	}
	cr_assert_eq(ev.type, type, "event %d status %d, wanted %d", ev.type, ev.status, type);
	return ev;
}

static struct dgv_qp_init_attr rc_attr(struct end *e)
{
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_RC, .send_cq = e->cq, .recv_cq = e->cq,
				     .max_send_wr = 1024, .max_recv_wr = 1024};
	return a;
}

static void listen_any(struct sockaddr_in *out)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(dgv_listen(S.ctx, (struct sockaddr *)&a, sizeof a, 16, -1, NULL, &S, &L), 0);
	union dgv_sockaddr la;
	socklen_t ll;
	cr_assert_eq(dgv_listener_addr(L, &la, &ll), 0);
	*out = la.sin;
}

/* Connects C to S through a listener with params cp (client) and sp (server). */
static void connect_pair(const struct dgv_conn_param *cp, const struct dgv_conn_param *sp)
{
	struct sockaddr_in a;
	listen_any(&a);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, cp, &C.qp), 0);
	struct dgv_cm_event rq = wait_ev(S.ch, DGV_CM_CONNECT_REQUEST);
	cr_assert(rq.req);
	cr_assert_eq(rq.listener, L);
	if (cp && cp->private_data_len) {
		cr_assert_eq(rq.pdata_len, cp->private_data_len);
		cr_assert_arr_eq(rq.pdata, cp->private_data, cp->private_data_len);
	}
	struct dgv_qp_init_attr sa = rc_attr(&S);
	cr_assert_eq(dgv_accept(rq.req, S.pd, &sa, sp, &S.qp), 0);
	struct dgv_cm_event e1 = wait_ev(C.ch, DGV_CM_ESTABLISHED);
	cr_assert_eq(e1.qp, C.qp);
	if (sp && sp->private_data_len) {
		cr_assert_eq(e1.pdata_len, sp->private_data_len);
		cr_assert_arr_eq(e1.pdata, sp->private_data, sp->private_data_len);
	}
	struct dgv_cm_event e2 = wait_ev(S.ch, DGV_CM_ESTABLISHED);
	cr_assert_eq(e2.qp, S.qp);
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_RTS);
	cr_assert_eq(dgv_qp_state(S.qp), DGV_QPS_RTS);
}

static struct dgv_wc wait_wc(struct dgv_cq *cq)
{
	struct dgv_wc wc;
	for (;;) {
		int n = dgv_poll_cq(cq, 1, &wc);
		cr_assert(n >= 0);
		if (n == 1)
			return wc;
		cr_assert_eq(dgv_cq_wait(cq, TMO), 0, "no completion");
	}
}

static void post_recv(struct end *e, uint64_t id, uint64_t off, uint32_t len)
{
	struct dgv_sge sg = {(uint64_t)(uintptr_t)(e->buf + off), len, e->mr->lkey};
	struct dgv_recv_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1};
	cr_assert_eq(dgv_post_recv(e->qp, &wr, NULL), 0);
}

static void post_send(struct end *e, enum dgv_wr_opcode op, uint64_t id, uint64_t off, uint32_t len,
		      uint64_t raddr, uint32_t rkey, uint32_t inv)
{
	struct dgv_sge sg = {(uint64_t)(uintptr_t)(e->buf + off), len, e->mr->lkey};
	struct dgv_send_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .remote_addr = raddr, .rkey = rkey,
				 .invalidate_rkey = inv};
	cr_assert_eq(dgv_post_send(e->qp, &wr, NULL), 0);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

/* A Send of len bytes C -> S, byte-exact. */
static void send_case(uint32_t len)
{
	fill(C.buf, len, len);
	memset(S.buf, 0xee, len + 16);
	post_recv(&S, 7, 0, len + 16);
	post_send(&C, DGV_WR_SEND, 9, 0, len, 0, 0, 0);
	struct dgv_wc s = wait_wc(C.cq);
	cr_assert_eq(s.status, DGV_WC_SUCCESS);
	cr_assert_eq(s.wr_id, 9);
	cr_assert_eq(s.opcode, DGV_WC_SEND);
	struct dgv_wc r = wait_wc(S.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS, "status %d", r.status);
	cr_assert_eq(r.opcode, DGV_WC_RECV);
	cr_assert_eq(r.wr_id, 7);
	cr_assert_eq(r.byte_len, len);
	cr_assert(memcmp(S.buf, C.buf, len) == 0, "payload differs");
	cr_assert_eq(S.buf[len], 0xee);
	/* a later placement into S.buf or C.buf comes after these reads: each end's QP lock (the
	 * soft RNIC places under it) shows ThreadSanitizer the order that TCP makes */
	struct dgv_qp_stats qs;
	(void)dgv_qp_stats(S.qp, &qs);
	(void)dgv_qp_stats(C.qp, &qs);
}

TestSuite(rc, .init = setup, .fini = teardown, .timeout = 60);

Test(rc, connect_rev2_crc_pdata_both_ways)
{
	const char cpd[] = "hello from the initiator", spd[] = "and from the responder";
	struct dgv_conn_param cp = {.private_data = cpd, .private_data_len = sizeof cpd, .crc = 1};
	struct dgv_conn_param sp = {.private_data = spd, .private_data_len = sizeof spd};
	connect_pair(&cp, &sp);
	struct dgv_conn_info ci, si;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert_eq(dgv_conn_info(S.qp, &si), 0);
	cr_assert_eq(ci.mpa_rev, 2);
	cr_assert_eq(si.mpa_rev, 2);
	cr_assert(ci.crc && si.crc);
	cr_assert(!ci.markers_rx && !ci.markers_tx);
	cr_assert(ci.ord >= 1 && ci.ird >= 1);
	cr_assert_eq(ci.peer.sin.sin_port, si.local.sin.sin_port);
	send_case(64);
}

Test(rc, connect_rev1_no_crc)
{
	struct dgv_conn_param cp = {.mpa_rev = 1, .crc = 0};
	struct dgv_conn_param sp = {.mpa_rev = 1, .crc = 0};
	connect_pair(&cp, &sp);
	struct dgv_conn_info ci;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert_eq(ci.mpa_rev, 1);
	cr_assert(!ci.crc);
	send_case(1000);
	send_case(0);
}

Test(rc, crc_if_either_side_asks)
{
	struct dgv_conn_param cp = {.crc = 0};
	struct dgv_conn_param sp = {.crc = 1};
	connect_pair(&cp, &sp);
	struct dgv_conn_info ci, si;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert_eq(dgv_conn_info(S.qp, &si), 0);
	cr_assert(ci.crc && si.crc);
	send_case(5000);
}

Test(rc, markers_both_ways)
{
	struct dgv_conn_param cp = {.markers = 1, .crc = 1};
	struct dgv_conn_param sp = {.markers = 1, .crc = 1};
	connect_pair(&cp, &sp);
	struct dgv_conn_info ci;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert(ci.markers_rx && ci.markers_tx);
	for (uint32_t len = 0; len < 3000; len += 337)
		send_case(len);
	send_case(200000);
	/* the other direction and a Write */
	fill(S.buf, 70000, 3);
	post_send(&S, DGV_WR_WRITE, 1, 0, 70000, (uint64_t)(uintptr_t)C.buf + 100, C.mr->rkey, 0);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_SUCCESS);
	post_recv(&C, 2, 1 << 20, 16);
	post_send(&S, DGV_WR_SEND, 3, 0, 8, 0, 0, 0);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_SUCCESS);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	cr_assert(memcmp(C.buf + 100, S.buf, 70000) == 0);
}

Test(rc, markers_asked_by_one_side_only)
{
	struct dgv_conn_param cp = {.markers = 1};
	connect_pair(&cp, NULL);
	struct dgv_conn_info ci, si;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert_eq(dgv_conn_info(S.qp, &si), 0);
	cr_assert(ci.markers_rx && !ci.markers_tx);
	cr_assert(si.markers_tx && !si.markers_rx);
	send_case(3000);
	fill(S.buf + 4096, 1500, 9);
	post_recv(&C, 5, 0, 2000);
	post_send(&S, DGV_WR_SEND, 6, 4096, 1500, 0, 0, 0);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_SUCCESS);
	struct dgv_wc r = wait_wc(C.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert(memcmp(C.buf, S.buf + 4096, 1500) == 0);
}

Test(rc, send_sizes_byte_exact)
{
	connect_pair(NULL, NULL);
	static const uint32_t sizes[] = {0, 1, 3, 64, 1500, 4096, 65474, 65536, 1u << 20, 16u << 20};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		send_case(sizes[i]);
}

Test(rc, send_se_and_invalidate)
{
	connect_pair(NULL, NULL);
	post_recv(&S, 1, 0, 64);
	post_send(&C, DGV_WR_SEND_SE, 2, 0, 10, 0, 0, 0);
	struct dgv_wc r = wait_wc(S.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert(r.flags & DGV_WC_SOLICITED);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	/* a second region on S, invalidated by the Send */
	uint8_t *extra = aligned_alloc(4096, 8192);
	struct dgv_mr *mr2;
	cr_assert_eq(dgv_reg_mr(S.pd, extra, 8192, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &mr2), 0);
	post_recv(&S, 3, 0, 64);
	post_send(&C, DGV_WR_SEND_SE_INV, 4, 0, 20, 0, 0, mr2->rkey);
	r = wait_wc(S.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert(r.flags & DGV_WC_WITH_INV);
	cr_assert(r.flags & DGV_WC_SOLICITED);
	cr_assert_eq(r.invalidated_rkey, mr2->rkey);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	post_recv(&S, 5, 0, 64);
	post_send(&C, DGV_WR_SEND_INV, 6, 0, 0, 0, 0, mr2->rkey);
	r = wait_wc(S.cq);
	cr_assert(r.flags & DGV_WC_WITH_INV);
	cr_assert(!(r.flags & DGV_WC_SOLICITED));
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	/* the invalidated STag no longer takes a Write: Terminate, both sides end */
	post_send(&C, DGV_WR_WRITE, 7, 0, 100, (uint64_t)(uintptr_t)extra, mr2->rkey, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS); /* handed to TCP */
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, -EPROTO);
	cr_assert_eq(e.term_layer, DGV_LAYER_DDP);
	cr_assert_eq(e.term_etype, 1);
	cr_assert_eq(e.term_ecode, 0);
	e = wait_ev(C.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, -ECONNRESET);
	cr_assert_eq(e.term_layer, DGV_LAYER_DDP);
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_ERROR);
	struct dgv_async_err ae;
	cr_assert_eq(dgv_poll_errq(C.qp, 1, &ae), 1);
	cr_assert(ae.remote);
	cr_assert_eq(dgv_dereg_mr(mr2), 0);
	free(extra);
}

Test(rc, write_read_write_record)
{
	connect_pair(NULL, NULL);
	/* Write 300000 bytes into S at offset 1000 */
	fill(C.buf, 300000, 11);
	post_send(&C, DGV_WR_WRITE, 1, 0, 300000, (uint64_t)(uintptr_t)S.buf + 1000, S.mr->rkey, 0);
	struct dgv_wc w = wait_wc(C.cq);
	cr_assert_eq(w.status, DGV_WC_SUCCESS);
	cr_assert_eq(w.opcode, DGV_WC_WRITE);
	/* Read it back into C at 4 MiB: the Read completes after the Write is placed */
	post_send(&C, DGV_WR_READ, 2, 4u << 20, 300000, (uint64_t)(uintptr_t)S.buf + 1000, S.mr->rkey, 0);
	w = wait_wc(C.cq);
	cr_assert_eq(w.status, DGV_WC_SUCCESS, "read status %d", w.status);
	cr_assert_eq(w.opcode, DGV_WC_READ);
	cr_assert_eq(w.byte_len, 300000);
	cr_assert(memcmp(C.buf + (4u << 20), C.buf, 300000) == 0);
	/* Write-Record of 200000 bytes: one record on S's CQ, no receive consumed */
	fill(C.buf + (8u << 20), 200000, 12);
	post_send(&C, DGV_WR_WRITE_RECORD, 3, 8u << 20, 200000, (uint64_t)(uintptr_t)S.buf + 8192, S.mr->rkey, 0);
	w = wait_wc(C.cq);
	cr_assert_eq(w.status, DGV_WC_SUCCESS);
	cr_assert_eq(w.opcode, DGV_WC_WRITE_RECORD);
	struct dgv_wc r = wait_wc(S.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert_eq(r.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(r.record.stag, S.mr->rkey);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf + 8192);
	cr_assert_eq(r.record.length, 200000);
	cr_assert_eq(r.record.valid_bytes, 200000);
	cr_assert_eq(r.record.nranges, 1);
	cr_assert_eq(r.record.ranges[0].offset, 0);
	cr_assert_eq(r.record.ranges[0].length, 200000);
	cr_assert(memcmp(S.buf + 8192, C.buf + (8u << 20), 200000) == 0);
	/* zero-length Read and Write */
	post_send(&C, DGV_WR_READ, 4, 0, 0, 0, 0, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	post_send(&C, DGV_WR_WRITE, 5, 0, 0, 0, 0, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
}

/* qp.c test hook: TCP takes at most cap bytes of the next send, then is full until 0. */
void soft_qp_test_tx_cap(struct dgv_qp *qpb, uint32_t cap);
uint32_t soft_cq_test_entries(struct dgv_cq *cqb);
uint32_t soft_qp_test_sq_entries(struct dgv_qp *qpb);

/* A one-FPDU post into an idle connection goes to TCP during the post (rc_post_now): placed
 * byte-exact, in order, a completion only when signaled. When TCP takes only part of the FPDU
 * (the hook), the rest stays ahead of everything posted after it, which queues behind it; all
 * of it arrives once TCP has room, the Write-Records' records in posting order. */
Test(rc, small_post_goes_now_and_a_cut_fpdu_finishes_first)
{
	connect_pair(NULL, NULL);
	fill(C.buf, 4096, 21);
	struct dgv_wc w, r;
	struct dgv_qp_stats st0, st1;
	cr_assert_eq(dgv_qp_stats(C.qp, &st0), 0);
	struct dgv_sge sg = {(uint64_t)(uintptr_t)C.buf, 300, C.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				 .remote_addr = (uint64_t)(uintptr_t)S.buf, .rkey = S.mr->rkey};
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 0, "TCP took it during the post");
	r = wait_wc(S.cq);
	cr_assert_eq(r.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf);
	cr_assert_eq(r.record.length, 300);
	cr_assert(memcmp(S.buf, C.buf, 300) == 0);
	cr_assert_eq(dgv_poll_cq(C.cq, 1, &w), 0, "unsignaled: no completion");
	cr_assert_eq(dgv_qp_stats(C.qp, &st1), 0);
	cr_assert_eq(st1.tx_msgs - st0.tx_msgs, 1);
	cr_assert_eq(st1.tx_datagrams - st0.tx_datagrams, 1, "one FPDU");

	/* signaled Send: its completion, and the server's receive */
	post_recv(&S, 50, 65536, 4096);
	post_send(&C, DGV_WR_SEND, 2, 300, 100, 0, 0, 0);
	w = wait_wc(C.cq);
	cr_assert_eq(w.wr_id, 2);
	cr_assert_eq(w.status, DGV_WC_SUCCESS);
	cr_assert_eq(w.opcode, DGV_WC_SEND);
	cr_assert_eq(w.byte_len, 100);
	r = wait_wc(S.cq);
	cr_assert_eq(r.wr_id, 50);
	cr_assert_eq(r.byte_len, 100);
	cr_assert(memcmp(S.buf + 65536, C.buf + 300, 100) == 0);

	/* TCP takes 7 bytes of the next FPDU, then has no room */
	soft_qp_test_tx_cap(C.qp, 7);
	sg = (struct dgv_sge){(uint64_t)(uintptr_t)C.buf + 400, 500, C.mr->lkey};
	wr = (struct dgv_send_wr){.wr_id = 3, .sg_list = &sg, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				  .send_flags = DGV_SEND_SIGNAL_HELD, .remote_addr = (uint64_t)(uintptr_t)S.buf + 1000,
				  .rkey = S.mr->rkey};
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 1, "the rest of the FPDU waits for TCP");
	struct dgv_sge sg2 = {(uint64_t)(uintptr_t)C.buf + 1000, 200, C.mr->lkey};
	struct dgv_send_wr wr2 = {.wr_id = 4, .sg_list = &sg2, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				  .send_flags = DGV_SEND_SIGNALED, .remote_addr = (uint64_t)(uintptr_t)S.buf + 2000,
				  .rkey = S.mr->rkey};
	cr_assert_eq(dgv_post_send(C.qp, &wr2, NULL), 0, "queued behind the cut FPDU");
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(dgv_poll_cq(S.cq, 1, &r), 0, "nothing whole has reached the server yet");
		usleep(1000);
	}
	soft_qp_test_tx_cap(C.qp, 0); /* room again */
	r = wait_wc(S.cq);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf + 1000, "the cut FPDU's record first");
	cr_assert_eq(r.record.length, 500);
	r = wait_wc(S.cq);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf + 2000);
	cr_assert_eq(r.record.length, 200);
	cr_assert(memcmp(S.buf + 1000, C.buf + 400, 500) == 0);
	cr_assert(memcmp(S.buf + 2000, C.buf + 1000, 200) == 0);
	/* completions in posting order: the held one (SIGNAL_HELD, not wholly in TCP at its post)
	 * and the signaled one */
	w = wait_wc(C.cq);
	cr_assert_eq(w.wr_id, 3);
	cr_assert_eq(w.status, DGV_WC_SUCCESS);
	cr_assert_eq(w.byte_len, 500);
	w = wait_wc(C.cq);
	cr_assert_eq(w.wr_id, 4);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 0);
}

/* DGV_SEND_NOW: the message goes from the caller's unregistered memory during the post, or
 * nothing is posted (-EAGAIN) when it cannot go now; what TCP took only part of is kept as a
 * copy, so the caller's buffer may change the moment the post returns. */
Test(rc, send_now_reads_the_callers_memory_only_during_the_post)
{
	connect_pair(NULL, NULL);
	uint8_t mine[1200], orig[1200];
	fill(mine, sizeof mine, 33);
	memcpy(orig, mine, sizeof mine);
	struct dgv_wc r;
	struct dgv_sge sg[2] = {{(uint64_t)(uintptr_t)mine, 500, 0}, {(uint64_t)(uintptr_t)mine + 500, 700, 0}};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = sg, .num_sge = 2, .opcode = DGV_WR_WRITE_RECORD,
				 .send_flags = DGV_SEND_NOW, .remote_addr = (uint64_t)(uintptr_t)S.buf, .rkey = S.mr->rkey};
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0, "an idle connection takes it now");
	memset(mine, 0xee, sizeof mine); /* the caller's again */
	r = wait_wc(S.cq);
	cr_assert_eq(r.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(r.record.length, 1200);
	cr_assert(memcmp(S.buf, orig, 1200) == 0, "placed as it was at the post");

	struct dgv_send_wr two = wr;
	two.next = &wr;
	cr_assert_eq(dgv_post_send(C.qp, &two, NULL), -EINVAL, "one work request only");

	/* TCP takes 9 bytes of it: the rest is a copy, sent once TCP has room */
	memcpy(mine, orig, sizeof mine);
	soft_qp_test_tx_cap(C.qp, 9);
	wr.remote_addr = (uint64_t)(uintptr_t)S.buf + 4096;
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0, "begun during the post");
	memset(mine, 0x5a, sizeof mine);
	/* now something is on its way: the next one cannot go now, and nothing of it is posted */
	struct dgv_sge sg3 = {(uint64_t)(uintptr_t)mine, 100, 0};
	struct dgv_send_wr wr3 = {.wr_id = 3, .sg_list = &sg3, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
				  .send_flags = DGV_SEND_NOW, .remote_addr = (uint64_t)(uintptr_t)S.buf + 8192,
				  .rkey = S.mr->rkey};
	struct dgv_send_wr *bad = NULL;
	cr_assert_eq(dgv_post_send(C.qp, &wr3, &bad), -EAGAIN);
	cr_assert_eq(bad, &wr3);
	soft_qp_test_tx_cap(C.qp, 0);
	r = wait_wc(S.cq);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf + 4096);
	cr_assert_eq(r.record.length, 1200);
	cr_assert(memcmp(S.buf + 4096, orig, 1200) == 0, "the cut FPDU's rest was kept as posted");
	usleep(20000);
	cr_assert_eq(dgv_poll_cq(S.cq, 1, &r), 0, "the refused post sent nothing");
	/* room again: it goes now */
	cr_assert_eq(dgv_post_send(C.qp, &wr3, NULL), 0);
	r = wait_wc(S.cq);
	cr_assert_eq(r.record.base, (uint64_t)(uintptr_t)S.buf + 8192);
	cr_assert_eq(r.record.length, 100);
	cr_assert(S.buf[8192] == 0x5a && S.buf[8291] == 0x5a);
}

/* dgv_qp_discard: an idle connection's pages go back to the kernel. Never while a completion
 * is queued (it names bytes the caller has not taken) nor while a send is still being handed to
 * TCP (it reads its buffer); once both are done, the whole pages inside the range read as zero
 * and are not resident, the partial page at its start is left as it was, and a record placed
 * there afterwards lands whole. */
Test(rc, discard_gives_back_pages_only_when_idle)
{
	connect_pair(NULL, NULL);
	enum { N = 12288 };
	uint8_t *dst = S.buf + (1u << 20); /* page-aligned */
	fill(C.buf, N, 3);
	cr_assert_eq(dgv_qp_discard(NULL, dst, N), -EINVAL);
	post_send(&C, DGV_WR_WRITE_RECORD, 1, 0, N, (uint64_t)(uintptr_t)dst, S.mr->rkey, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	/* the provider's thread places it while nobody polls (within its idle tick) */
	for (int i = 0; i < 5000 && dgv_cq_ready(S.cq) <= 0; i++)
		usleep(1000);
	cr_assert_gt(dgv_cq_ready(S.cq), 0, "the record was not placed in 5 s");
	cr_assert_eq(dgv_qp_discard(S.qp, dst, N), -EBUSY, "a completion is queued");
	cr_assert(memcmp(dst, C.buf, N) == 0, "nothing was given back");
	struct dgv_wc r = wait_wc(S.cq);
	cr_assert_eq(r.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(r.record.length, N);
	cr_assert_gt(soft_cq_test_entries(S.cq), 0, "the record's completion made the ring");
	cr_assert_eq(dgv_qp_discard(S.qp, dst + 100, N), 0);
	cr_assert_eq(soft_cq_test_entries(S.cq), 0, "the empty CQ's ring was given back");
	unsigned char v[3];
	cr_assert_eq(mincore(dst, N, v), 0);
	cr_assert(v[0] & 1, "the partial first page stays");
	cr_assert(!(v[1] & 1) && !(v[2] & 1), "whole pages given back: %d %d", v[1] & 1, v[2] & 1);
	cr_assert(memcmp(dst, C.buf, 4096) == 0, "the partial page is as it was");
	for (size_t i = 4096; i < N; i++)
		cr_assert_eq(dst[i], 0, "byte %zu of a page given back is %#x", i, dst[i]);

	/* the reads above come before the placements below: S's QP lock (taken by dgv_qp_stats;
	 * the soft RNIC places under it) shows ThreadSanitizer the order that TCP makes */
	struct dgv_qp_stats qs;
	(void)dgv_qp_stats(S.qp, &qs);
	/* a send TCP took 9 bytes of: still under way, so its side is not idle */
	soft_qp_test_tx_cap(C.qp, 9);
	post_send(&C, DGV_WR_WRITE_RECORD, 2, 0, N, (uint64_t)(uintptr_t)dst, S.mr->rkey, 0);
	cr_assert_eq(dgv_qp_discard(C.qp, C.buf, N), -EBUSY, "a send is under way");
	soft_qp_test_tx_cap(C.qp, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	r = wait_wc(S.cq);
	cr_assert_eq(r.record.length, N);
	cr_assert(memcmp(dst, C.buf, N) == 0, "placed whole into the pages given back");
	cr_assert_gt(soft_cq_test_entries(S.cq), 0, "a completion after the give-back made a ring again");
	cr_assert_eq(dgv_qp_discard(C.qp, C.buf + N, N), 0, "the sender's side is idle again");
	cr_assert_eq(soft_qp_test_sq_entries(C.qp), 0, "the idle sender gave its send queue back");

	/* the queue is made again by what needs it: a send TCP cuts, then two queued behind it
	 * (the second finds the small queue full and grows it) */
	(void)dgv_qp_stats(S.qp, &qs);
	soft_qp_test_tx_cap(C.qp, 9);
	for (int k = 0; k < 3; k++)
		post_send(&C, DGV_WR_WRITE_RECORD, 10 + (uint64_t)k, (uint64_t)k * 1000, 1000,
			  (uint64_t)(uintptr_t)dst + (uint64_t)k * 1000, S.mr->rkey, 0);
	cr_assert_gt(soft_qp_test_sq_entries(C.qp), 2, "three sends under way need more than the small queue");
	soft_qp_test_tx_cap(C.qp, 0);
	for (int k = 0; k < 3; k++) {
		struct dgv_wc w = wait_wc(C.cq);
		cr_assert_eq(w.status, DGV_WC_SUCCESS);
		cr_assert_eq(w.wr_id, 10 + (uint64_t)k, "completions in order");
		r = wait_wc(S.cq);
		cr_assert_eq(r.record.length, 1000);
	}
	cr_assert(memcmp(dst, C.buf, 3000) == 0, "the three records placed whole");
}

/* Record completions carry their ranges in the CQ's scratch, which starts at 4 entries inside
 * the CQ and grows when a poll found it short: a burst of 40 records, polled 16 at a time,
 * hands each its own valid range, whatever the scratch held at the time. */
Test(rc, a_burst_of_records_each_gets_its_range)
{
	connect_pair(NULL, NULL);
	enum { K = 40 };
	fill(C.buf, K * 100, 9);
	for (int i = 0; i < K; i++)
		post_send(&C, DGV_WR_WRITE_RECORD, (uint64_t)i, (uint64_t)i * 100, 100 + (uint32_t)i,
			  (uint64_t)(uintptr_t)S.buf + (uint64_t)i * 256, S.mr->rkey, 0);
	for (int i = 0; i < K; i++)
		cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	/* all placed before the polls below (S's thread places them while nobody polls) */
	for (int i = 0; i < 5000 && dgv_cq_ready(S.cq) < K; i++)
		usleep(1000);
	cr_assert_eq(dgv_cq_ready(S.cq), K, "all %d records placed", K);
	int seen = 0, polls = 0;
	while (seen < K) {
		struct dgv_wc w[16];
		int n = dgv_poll_cq(S.cq, 16, w);
		cr_assert_gt(n, 0);
		polls++;
		for (int j = 0; j < n; j++, seen++) {
			cr_assert_eq(w[j].opcode, DGV_WC_RECV_WRITE_RECORD);
			cr_assert_eq(w[j].record.base, (uint64_t)(uintptr_t)S.buf + (uint64_t)seen * 256);
			cr_assert_eq(w[j].record.length, 100u + (uint32_t)seen);
			cr_assert_eq(w[j].record.nranges, 1);
			cr_assert_eq(w[j].record.ranges[0].offset, 0);
			cr_assert_eq(w[j].record.ranges[0].length, 100u + (uint32_t)seen);
		}
	}
	cr_assert_geq(polls, 3, "the scratch started small (%d polls)", polls);
}

Test(rc, reads_beyond_ord_wait)
{
	struct dgv_conn_param cp = {.ord = 1};
	connect_pair(&cp, NULL);
	struct dgv_conn_info ci;
	cr_assert_eq(dgv_conn_info(C.qp, &ci), 0);
	cr_assert_eq(ci.ord, 1);
	fill(S.buf, 1 << 20, 5);
	/* The Read Requests (over TCP, after this) order the fill before the responder's reads of
	 * S.buf; TSan cannot see that. A look at S's QP takes its lock, which the provider's
	 * thread takes before it serves a request: an order TSan sees. */
	struct dgv_qp_stats st;
	cr_assert_eq(dgv_qp_stats(S.qp, &st), 0);
	for (int i = 0; i < 8; i++)
		post_send(&C, DGV_WR_READ, 100 + i, (uint64_t)i << 20, 100000 + i,
			  (uint64_t)(uintptr_t)S.buf + (uint64_t)i * 1000, S.mr->rkey, 0);
	for (int i = 0; i < 8; i++) {
		struct dgv_wc w = wait_wc(C.cq);
		cr_assert_eq(w.status, DGV_WC_SUCCESS);
		cr_assert_eq(w.wr_id, 100 + (uint64_t)i, "completions in order");
		cr_assert(memcmp(C.buf + ((size_t)i << 20), S.buf + i * 1000, 100000 + (size_t)i) == 0);
	}
}

Test(rc, many_wrs_in_flight_both_ways)
{
	connect_pair(NULL, NULL);
	enum { N = 500, SZ = 3000 };
	for (int i = 0; i < N; i++) {
		post_recv(&S, (uint64_t)i, (uint64_t)i * SZ, SZ);
		post_recv(&C, (uint64_t)i, (8u << 20) + (uint64_t)i * SZ, SZ);
	}
	fill(C.buf + (4u << 20), N * SZ, 1);
	fill(S.buf + (12u << 20), N * SZ, 2);
	for (int i = 0; i < N; i++) {
		post_send(&C, DGV_WR_SEND, 1000 + (uint64_t)i, (4u << 20) + (uint64_t)i * SZ, SZ - (uint32_t)i, 0, 0, 0);
		post_send(&S, DGV_WR_SEND, 1000 + (uint64_t)i, (12u << 20) + (uint64_t)i * SZ, SZ - (uint32_t)i, 0, 0, 0);
	}
	int sc = 0, rc = 0, sc2 = 0, rc2 = 0;
	while (sc + rc < 2 * N || sc2 + rc2 < 2 * N) {
		struct dgv_wc wc[32];
		int n = dgv_poll_cq(C.cq, 32, wc);
		for (int i = 0; i < n; i++) {
			cr_assert_eq(wc[i].status, DGV_WC_SUCCESS);
			if (wc[i].opcode == DGV_WC_RECV) {
				cr_assert_eq(wc[i].wr_id, (uint64_t)rc);
				cr_assert_eq(wc[i].byte_len, SZ - (uint32_t)rc);
				rc++;
			} else {
				cr_assert_eq(wc[i].wr_id, 1000 + (uint64_t)sc);
				sc++;
			}
		}
		n = dgv_poll_cq(S.cq, 32, wc);
		for (int i = 0; i < n; i++) {
			cr_assert_eq(wc[i].status, DGV_WC_SUCCESS);
			if (wc[i].opcode == DGV_WC_RECV)
				rc2++;
			else
				sc2++;
		}
	}
	for (int i = 0; i < N; i++) {
		cr_assert(memcmp(S.buf + (size_t)i * SZ, C.buf + (4u << 20) + (size_t)i * SZ, SZ - (size_t)i) == 0);
		cr_assert(memcmp(C.buf + (8u << 20) + (size_t)i * SZ, S.buf + (12u << 20) + (size_t)i * SZ,
				 SZ - (size_t)i) == 0);
	}
}

/* A connection's send queue starts with 32 entries inside the QP and grows to max_send_wr
 * when a post finds it full (issue 14: memory per idle connection). Growth must keep every
 * entry at its position: a Read waiting in the ORD table, FPDUs of a batch in TCP and the
 * completions' order all name entries by position. ord = 1 holds Reads in the queue, so one
 * post of 60 work requests grows it for certain; a 6 MiB Read posted before, still in flight
 * when its 20 Sends have completed, has the queue's positions past its first 32 entries then
 * (the ring wrapped once before it grew). Every completion comes in posting order with the
 * right bytes, and the queue goes on working after. */
Test(rc, send_queue_grows_with_work_in_flight)
{
	struct dgv_conn_param cp = {.ord = 1};
	connect_pair(&cp, NULL);
	enum { SENDS = 300, SSZ = 700, BIG = 6u << 20 };
	fill(S.buf, 8u << 20, 7);            /* what the Reads fetch */
	fill(C.buf + (8u << 20), SENDS * SSZ, 8); /* what the Sends carry */
	for (int i = 0; i < SENDS; i++)
		post_recv(&S, 5000 + (uint64_t)i, (8u << 20) + (uint64_t)i * SSZ, SSZ);
	uint64_t next_id = 0, want_id = 0;
	int nsend = 0, nread = 0;
	struct {
		bool read;
		uint64_t loff, roff;
		uint32_t len;
	} wrs[400];
	struct dgv_send_wr w[64];
	struct dgv_sge g[64];
	/* posts n work requests as one chain: Reads where is_read says so, Sends elsewhere */
#define POST_CHAIN(n, is_read, rlen)                                                                                   \
	do {                                                                                                           \
		for (int k = 0; k < (n); k++) {                                                                        \
			bool rd = (is_read);                                                                           \
			uint64_t id = next_id++;                                                                       \
			cr_assert(id < 400);                                                                           \
			if (rd) {                                                                                      \
				wrs[id].read = true, wrs[id].len = (rlen), wrs[id].roff = (uint64_t)nread * 4096;      \
				wrs[id].loff = (rlen) > 4096 ? (2u << 20) : (12u << 20) + (uint64_t)nread * 4096;     \
				nread++;                                                                               \
				cr_assert(nread < 256);                                                                \
			} else {                                                                                       \
				cr_assert(nsend < SENDS);                                                              \
				wrs[id].read = false, wrs[id].len = SSZ - (uint32_t)nsend;                            \
				wrs[id].loff = (8u << 20) + (uint64_t)nsend++ * SSZ;                                   \
			}                                                                                              \
			g[k] = (struct dgv_sge){(uint64_t)(uintptr_t)(C.buf + wrs[id].loff), wrs[id].len, C.mr->lkey}; \
			w[k] = (struct dgv_send_wr){.wr_id = id, .sg_list = &g[k], .num_sge = 1,                      \
						    .opcode = rd ? DGV_WR_READ : DGV_WR_SEND,                          \
						    .send_flags = DGV_SEND_SIGNALED,                                   \
						    .remote_addr = (uint64_t)(uintptr_t)S.buf + wrs[id].roff,         \
						    .rkey = S.mr->rkey,                                                \
						    .next = k + 1 < (n) ? &w[k + 1] : NULL};                          \
		}                                                                                                      \
		struct dgv_send_wr *bad = NULL;                                                                        \
		cr_assert_eq(dgv_post_send(C.qp, &w[0], &bad), 0, "post of %d work requests", (int)(n));              \
	} while (0)
	/* checks completions in posting order up to id upto (excluded) */
#define DRAIN(upto)                                                                                                    \
	while (want_id < (upto)) {                                                                                     \
		struct dgv_wc c = wait_wc(C.cq);                                                                       \
		cr_assert_eq(c.status, DGV_WC_SUCCESS, "wr %llu: status %d", (unsigned long long)c.wr_id, c.status);  \
		cr_assert_eq(c.wr_id, want_id, "completion of wr %llu where %llu was next",                         \
			     (unsigned long long)c.wr_id, (unsigned long long)want_id);                               \
		cr_assert_eq(c.opcode, wrs[want_id].read ? DGV_WC_READ : DGV_WC_SEND);                               \
		want_id++;                                                                                             \
	}
	/* a big Read behind 20 Sends in one post: the Sends complete, the Read holds position 20
	 * (posted alone it would find the queue empty and start again at position 0) */
	POST_CHAIN(21, k == 20, BIG);
	DRAIN(20);
	/* 60 at once, every third a Read: more than the first 32 entries hold */
	POST_CHAIN(60, k % 3 == 2, 1000 + (uint32_t)k);
	DRAIN(next_id);
	/* the grown queue keeps working: chains of every size up to 64, completed in order */
	for (int n = 1; n <= 64 && next_id + (uint64_t)n <= 400 && nsend + n <= SENDS; n += 9) {
		POST_CHAIN(n, k % 5 == 4, 64 + (uint32_t)k);
		if (n % 2)
			DRAIN(next_id);
	}
	DRAIN(next_id);
#undef POST_CHAIN
#undef DRAIN
	/* every Read's bytes, every Send's bytes at the server, in order */
	for (uint64_t id = 0; id < next_id; id++)
		if (wrs[id].read)
			cr_assert(memcmp(C.buf + wrs[id].loff, S.buf + wrs[id].roff, wrs[id].len) == 0,
				  "Read %llu: bytes differ", (unsigned long long)id);
	for (int i = 0; i < nsend; i++) {
		struct dgv_wc c = wait_wc(S.cq);
		cr_assert_eq(c.status, DGV_WC_SUCCESS);
		cr_assert_eq(c.wr_id, 5000 + (uint64_t)i, "receive %d out of order", i);
		cr_assert_eq(c.byte_len, SSZ - (uint32_t)i);
		cr_assert(memcmp(S.buf + (8u << 20) + (size_t)i * SSZ, C.buf + (8u << 20) + (size_t)i * SSZ,
				 SSZ - (size_t)i) == 0,
			  "Send %d: bytes differ", i);
	}
}

/* DGV_SEND_SIGNAL_HELD and dgv_qp_tx_held (DGV_CAP_RC_TX_HELD): a send TCP took whole during
 * its post makes no completion and is not held; one TCP had no room for (the server's provider
 * reads only when the server calls it, and it does not) is held and completes once the server
 * reads, with a completion. */
Test(rc, signal_held_completes_only_what_tcp_did_not_take)
{
	end_close(&S);
	cr_assert_eq(dgv_open(&(struct dgv_context_attr){.progress = DGV_PROGRESS_APP}, &S.ctx), 0);
	cr_assert_eq(dgv_alloc_pd(S.ctx, &S.pd), 0);
	cr_assert_eq(dgv_create_cq(S.ctx, 4096, &S.cq), 0);
	S.ch = dgv_cm_default_channel(S.ctx);
	S.buf = aligned_alloc(4096, BUFSZ);
	cr_assert(S.ch && S.buf);
	memset(S.buf, 0, BUFSZ);
	cr_assert_eq(dgv_reg_mr(S.pd, S.buf, BUFSZ, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &S.mr), 0);
	struct dgv_caps caps;
	cr_assert_eq(dgv_query_caps(C.ctx, &caps), 0);
	cr_assert(caps.flags & DGV_CAP_RC_TX_HELD);
	connect_pair(NULL, NULL);
	fill(C.buf, BUFSZ, 11);
	struct dgv_sge sg = {(uint64_t)(uintptr_t)C.buf, 1000, C.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = DGV_WR_WRITE,
				 .send_flags = DGV_SEND_SIGNAL_HELD, .remote_addr = (uint64_t)(uintptr_t)S.buf,
				 .rkey = S.mr->rkey};
	/* 1000 bytes: TCP takes them during the post */
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 0);
	struct dgv_wc wc;
	cr_assert_eq(dgv_cq_wait(C.cq, 50), -ETIMEDOUT, "no completion for a send TCP took");
	cr_assert_eq(dgv_poll_cq(C.cq, 1, &wc), 0);
	/* 16 MiB to a reader that does not read: more than TCP's buffers hold */
	wr.wr_id = 2, sg.addr += 1000, sg.length = 16u << 20, wr.remote_addr += 1000;
	cr_assert_eq(dgv_post_send(C.qp, &wr, NULL), 0);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 1, "the rest waits for room in TCP");
	cr_assert_eq(dgv_poll_cq(C.cq, 1, &wc), 0);
	/* the server reads: the held send completes, with a completion */
	struct dgv_wc sw;
	int got = 0;
	for (int i = 0; i < 5000 && !(got = dgv_poll_cq(C.cq, 1, &wc)); i++) {
		cr_assert_eq(dgv_poll_cq(S.cq, 1, &sw), 0, "a Write makes no completion at the target");
		usleep(1000);
	}
	cr_assert_eq(got, 1, "the held send completed");
	cr_assert_eq(wc.wr_id, 2);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert_eq(dgv_qp_tx_held(C.qp), 0);
	for (int i = 0; i < 5000 && memcmp(S.buf, C.buf, 1000 + (16u << 20)); i++) {
		dgv_poll_cq(S.cq, 1, &sw);
		usleep(1000);
	}
	cr_assert(memcmp(S.buf, C.buf, 1000 + (16u << 20)) == 0, "both writes placed byte-exact");
	cr_assert_eq(dgv_qp_tx_held(NULL), -EINVAL);
}

Test(rc, receiver_not_ready_holds_the_sender)
{
	connect_pair(NULL, NULL);
	fill(C.buf, 1000, 4);
	post_send(&C, DGV_WR_SEND, 1, 0, 1000, 0, 0, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	struct dgv_wc wc;
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(dgv_poll_cq(S.cq, 1, &wc), 0);
		usleep(2000);
	}
	cr_assert_eq(dgv_qp_state(S.qp), DGV_QPS_RTS);
	post_recv(&S, 2, 0, 1000);
	wc = wait_wc(S.cq);
	cr_assert_eq(wc.status, DGV_WC_SUCCESS);
	cr_assert(memcmp(S.buf, C.buf, 1000) == 0);
}

Test(rc, graceful_disconnect_delivers_queued_data_then_peer_closed)
{
	connect_pair(NULL, NULL);
	enum { N = 64, SZ = 100000 };
	for (int i = 0; i < N; i++)
		post_recv(&S, (uint64_t)i, (uint64_t)i * SZ, SZ);
	fill(C.buf, (size_t)N * SZ, 77);
	for (int i = 0; i < N; i++)
		post_send(&C, DGV_WR_SEND, (uint64_t)i, (uint64_t)i * SZ, SZ, 0, 0, 0);
	cr_assert_eq(dgv_disconnect(C.qp), 0);
	/* every receive completes before PEER_CLOSED is queued */
	for (int i = 0; i < N; i++) {
		struct dgv_wc w = wait_wc(S.cq);
		cr_assert_eq(w.status, DGV_WC_SUCCESS);
		cr_assert_eq(w.wr_id, (uint64_t)i);
	}
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_PEER_CLOSED);
	cr_assert_eq(e.qp, S.qp);
	cr_assert(memcmp(S.buf, C.buf, (size_t)N * SZ) == 0);
	cr_assert_eq(dgv_qp_state(S.qp), DGV_QPS_CLOSING);
	/* the passive side may still send */
	post_recv(&C, 9, 0, 10);
	post_send(&S, DGV_WR_SEND, 10, 0, 10, 0, 0, 0);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_SUCCESS);
	for (int i = 0; i < N; i++)
		cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	struct dgv_wc r = wait_wc(C.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert_eq(r.opcode, DGV_WC_RECV);
	cr_assert_eq(dgv_disconnect(S.qp), 0);
	e = wait_ev(S.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, 0);
	e = wait_ev(C.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, 0);
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_CLOSED);
	cr_assert_eq(dgv_qp_state(S.qp), DGV_QPS_CLOSED);
	/* posted after the end: flushed */
	post_recv(&S, 11, 0, 10);
	struct dgv_wc f = wait_wc(S.cq);
	cr_assert_eq(f.status, DGV_WC_WR_FLUSH_ERR);
}

Test(rc, reject_with_private_data)
{
	struct sockaddr_in a;
	listen_any(&a);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, NULL, &C.qp), 0);
	struct dgv_cm_event rq = wait_ev(S.ch, DGV_CM_CONNECT_REQUEST);
	cr_assert_eq(dgv_reject(rq.req, "go away", 8), 0);
	struct dgv_cm_event e = wait_ev(C.ch, DGV_CM_REJECTED);
	cr_assert_eq(e.status, -ECONNREFUSED);
	cr_assert_eq(e.pdata_len, 8);
	cr_assert_str_eq((const char *)e.pdata, "go away");
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_ERROR);
}

Test(rc, connect_refused)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
	socklen_t l = sizeof a;
	getsockname(s, (struct sockaddr *)&a, &l);
	close(s); /* nobody listens there now */
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, NULL, &C.qp), 0);
	struct dgv_cm_event e = wait_ev(C.ch, DGV_CM_CONNECT_ERROR);
	cr_assert_eq(e.status, -ECONNREFUSED);
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_ERROR);
}

Test(rc, destroy_while_connecting_and_mpa_timeout)
{
	/* a plain TCP listener that never answers the MPA Request */
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(listen(ls, 4), 0);
	socklen_t l = sizeof a;
	getsockname(ls, (struct sockaddr *)&a, &l);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	/* a posted send is held, then flushed by the destruction */
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, NULL, &C.qp), 0);
	post_send(&C, DGV_WR_SEND, 1, 0, 10, 0, 0, 0);
	cr_assert_eq(dgv_qp_state(C.qp), DGV_QPS_CONNECTING);
	cr_assert_eq(dgv_destroy_qp(C.qp), 0);
	C.qp = NULL;
	struct dgv_wc w = wait_wc(C.cq);
	cr_assert_eq(w.status, DGV_WC_WR_FLUSH_ERR);
	/* and with a short MPA deadline: CONNECT_ERROR -ETIMEDOUT */
	struct dgv_conn_param cp = {.timeout_ms = 200};
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, &cp, &C.qp), 0);
	struct dgv_cm_event e = wait_ev(C.ch, DGV_CM_CONNECT_ERROR);
	cr_assert_eq(e.status, -ETIMEDOUT);
	close(ls);
}

Test(rc, adopted_descriptors_both_sides)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(listen(ls, 4), 0);
	socklen_t l = sizeof a;
	getsockname(ls, (struct sockaddr *)&a, &l);
	/* the program's client socket: non-blocking connect in progress, flags must stay */
	int cs = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int r = connect(cs, (struct sockaddr *)&a, sizeof a);
	cr_assert(r == 0 || errno == EINPROGRESS);
	int cflags = fcntl(cs, F_GETFL);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	ca.use_adopt_fd = 1;
	ca.adopt_fd = cs;
	cr_assert_eq(dgv_connect(C.pd, &ca, NULL, 0, NULL, &C.qp), 0);
	/* the program's server accepts itself (blocking socket) and hands the connection over */
	int ss = accept(ls, NULL, NULL);
	cr_assert(ss >= 0);
	int sflags = fcntl(ss, F_GETFL);
	struct dgv_conn_req *req;
	cr_assert_eq(dgv_conn_req_adopt(S.ctx, ss, NULL, &S, &req), 0);
	struct dgv_cm_event rq = wait_ev(S.ch, DGV_CM_CONNECT_REQUEST);
	cr_assert_eq(rq.req, req);
	cr_assert_null(rq.listener);
	cr_assert_eq(rq.user, &S);
	struct dgv_qp_init_attr sa = rc_attr(&S);
	cr_assert_eq(dgv_accept(req, S.pd, &sa, NULL, &S.qp), 0);
	wait_ev(C.ch, DGV_CM_ESTABLISHED);
	wait_ev(S.ch, DGV_CM_ESTABLISHED);
	send_case(100000);
	cr_assert_eq(fcntl(cs, F_GETFL), cflags);
	cr_assert_eq(fcntl(ss, F_GETFL), sflags);
	int nd = 0;
	socklen_t nl = sizeof nd;
	getsockopt(ss, IPPROTO_TCP, TCP_NODELAY, &nd, &nl);
	cr_assert(nd);
	cr_assert_eq(dgv_destroy_qp(C.qp), 0);
	cr_assert_eq(dgv_destroy_qp(S.qp), 0);
	C.qp = S.qp = NULL;
	/* never closed by the provider */
	cr_assert_neq(fcntl(cs, F_GETFD), -1);
	cr_assert_neq(fcntl(ss, F_GETFD), -1);
	close(cs);
	close(ss);
	close(ls);
}

/* A TCP connection over loopback, both ends the test's (a program's sockets): *ls the
 * listener, *cs the client, *ss the accepted end. */
static void tcp_pair(int *ls, int *cs, int *ss)
{
	*ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(*ls, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(listen(*ls, 4), 0);
	socklen_t l = sizeof a;
	getsockname(*ls, (struct sockaddr *)&a, &l);
	*cs = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(*cs, (struct sockaddr *)&a, sizeof a), 0);
	*ss = accept(*ls, NULL, NULL);
	cr_assert(*ss >= 0);
}

/* Connects C and S over the test's own TCP pair (adopted descriptors); *cs and *ss stay the
 * test's. */
static void adopted_pair(int *ls, int *cs, int *ss)
{
	tcp_pair(ls, cs, ss);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	ca.use_adopt_fd = 1;
	ca.adopt_fd = *cs;
	cr_assert_eq(dgv_connect(C.pd, &ca, NULL, 0, NULL, &C.qp), 0);
	struct dgv_conn_req *req;
	cr_assert_eq(dgv_conn_req_adopt(S.ctx, *ss, NULL, &S, &req), 0);
	wait_ev(S.ch, DGV_CM_CONNECT_REQUEST);
	struct dgv_qp_init_attr sa = rc_attr(&S);
	cr_assert_eq(dgv_accept(req, S.pd, &sa, NULL, &S.qp), 0);
	wait_ev(C.ch, DGV_CM_ESTABLISHED);
	wait_ev(S.ch, DGV_CM_ESTABLISHED);
}

/* dgv_qp_rx_claim / dgv_qp_rx_stream_feed: while the caller holds the claim nothing of the
 * provider's reads the socket (a Send sent meanwhile does not complete), the caller's own
 * blocking read hands the bytes over and they complete as a receive, byte-exact; one claim at
 * a time; a feed without a claim or above the room is refused; TCP's end fed as 0 is the
 * peer's close. */
Test(rc, rx_claim_and_feed_read_by_the_caller)
{
	int ls, cs, ss;
	adopted_pair(&ls, &cs, &ss);
	send_case(3000); /* established both ways, the QPs reading their sockets */
	size_t room = 0, room2 = 0;
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room), 0);
	cr_assert_geq(room, 65536, "room %zu", room);
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room2), -EBUSY, "one reader at a time");
	fill(C.buf, 20000, 5);
	memset(S.buf, 0, 20000);
	post_recv(&S, 21, 0, 20000);
	post_send(&C, DGV_WR_SEND, 22, 0, 20000, 0, 0, 0);
	cr_assert_eq(wait_wc(C.cq).status, DGV_WC_SUCCESS);
	struct dgv_wc wc;
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(dgv_poll_cq(S.cq, 1, &wc), 0, "completed while the caller held the reading");
		usleep(5000);
	}
	/* the caller's own read, as a blocking program receive makes it */
	uint8_t *b = malloc(room);
	size_t got = 0;
	int polls = 0;
	for (;;) {
		cr_assert_lt(got, room);
		ssize_t n = recv(ss, b + got, room - got, MSG_DONTWAIT);
		if (n > 0) {
			got += (size_t)n;
			polls = 0;
			continue;
		}
		cr_assert(n < 0 && errno == EAGAIN, "recv: %zd %s", n, strerror(errno));
		if (got && ++polls > 20)
			break; /* everything of the message is in */
		usleep(2000);
	}
	cr_assert_gt(got, 20000, "the FPDUs' framing comes with the payload: %zu", got);
	cr_assert_eq(dgv_qp_rx_stream_feed(S.qp, b, (ssize_t)room + 1), -EINVAL, "above the room");
	cr_assert_eq(dgv_qp_rx_stream_feed(S.qp, b, (ssize_t)got), -EINVAL, "the claim ended with the refusal");
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room), 0);
	cr_assert_eq(dgv_qp_rx_stream_feed(S.qp, b, (ssize_t)got), 0);
	struct dgv_wc r = wait_wc(S.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert_eq(r.wr_id, 21);
	cr_assert_eq(r.byte_len, 20000);
	cr_assert(memcmp(S.buf, C.buf, 20000) == 0, "payload differs");
	/* nothing claimed now: the provider reads again */
	send_case(4000);
	/* an empty claim (a read that found nothing) changes nothing */
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room), 0);
	cr_assert_eq(dgv_qp_rx_stream_feed(S.qp, NULL, -EAGAIN), 0);
	send_case(5000);
	/* TCP's end, read by the caller */
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room), 0);
	shutdown(cs, SHUT_WR);
	char one;
	cr_assert_eq(recv(ss, &one, 1, 0), 0);
	cr_assert_eq(dgv_qp_rx_stream_feed(S.qp, NULL, 0), 0);
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_PEER_CLOSED);
	cr_assert_eq(e.qp, S.qp);
	cr_assert_eq(dgv_qp_rx_claim(S.qp, &room), -EBUSY, "nothing to read after the end");
	free(b);
	close(cs), close(ss), close(ls);
}

/* dgv_qp_set_fd: a live connection's QPs move to other descriptors of their sockets (a
 * program's dup, then close of the original); the closed numbers are reused at once by pipes,
 * which nothing of the provider's touches, and data keeps flowing both ways. A descriptor of
 * another socket is refused. */
Test(rc, set_fd_moves_a_live_connection)
{
	int ls, cs, ss;
	adopted_pair(&ls, &cs, &ss);
	send_case(5000);
	cr_assert_eq(dgv_qp_set_fd(C.qp, ls), -EINVAL, "another socket's descriptor");
	cr_assert_eq(dgv_qp_set_fd(C.qp, -1), -EINVAL);
	int cd = dup(cs), sd = dup(ss);
	cr_assert(cd >= 0 && sd >= 0);
	cr_assert_eq(dgv_qp_set_fd(C.qp, cd), 0);
	cr_assert_eq(dgv_qp_set_fd(S.qp, sd), 0);
	close(cs);
	close(ss);
	int p1[2], p2[2];
	cr_assert_eq(pipe(p1), 0);
	cr_assert_eq(pipe(p2), 0);
	cr_assert(p1[0] == cs || p1[1] == cs || p2[0] == cs || p2[1] == cs, "the number was reused");
	cr_assert_eq(write(p1[1], "one", 3), 3);
	cr_assert_eq(write(p2[1], "two", 3), 3);
	for (int i = 0; i < 4; i++)
		send_case(100000 + (uint32_t)i); /* the provider's thread reads the moved descriptor */
	/* and S -> C: the other direction through the moved QPs */
	fill(S.buf, 70000, 3);
	memset(C.buf, 0, 70000);
	post_recv(&C, 5, 0, 70000);
	post_send(&S, DGV_WR_SEND, 6, 0, 70000, 0, 0, 0);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_SUCCESS);
	struct dgv_wc r = wait_wc(C.cq);
	cr_assert_eq(r.status, DGV_WC_SUCCESS);
	cr_assert_eq(r.byte_len, 70000);
	cr_assert(memcmp(C.buf, S.buf, 70000) == 0);
	char b[8] = {0};
	fcntl(p1[0], F_SETFL, O_NONBLOCK);
	fcntl(p2[0], F_SETFL, O_NONBLOCK);
	cr_assert_eq(read(p1[0], b, sizeof b), 3);
	cr_assert_str_eq(b, "one");
	cr_assert_eq(read(p2[0], b, sizeof b), 3);
	cr_assert_str_eq(b, "two");
	cr_assert_eq(read(p1[0], b, sizeof b), -1, "nothing else written into the pipe");
	cr_assert_eq(dgv_destroy_qp(C.qp), 0);
	cr_assert_eq(dgv_destroy_qp(S.qp), 0);
	C.qp = S.qp = NULL;
	close(p1[0]), close(p1[1]), close(p2[0]), close(p2[1]);
	close(cd), close(sd), close(ls);
}

/* "stay plain" (dgv_reject_keep): the Reject goes out, the Request and the Reply are the only
 * bytes taken off and put on the connection, and both programs go on with it as plain TCP; the
 * server's first plain bytes, sent right behind the Reply, reach the client's program. */
Test(rc, reject_keeping_tcp_leaves_a_plain_connection)
{
	int ls, cs, ss;
	tcp_pair(&ls, &cs, &ss);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	ca.use_adopt_fd = 1;
	ca.adopt_fd = cs;
	cr_assert_eq(dgv_connect(C.pd, &ca, NULL, 0, NULL, &C.qp), 0);
	struct dgv_conn_req *req;
	cr_assert_eq(dgv_conn_req_adopt(S.ctx, ss, NULL, &S, &req), 0);
	/* it waits for the whole Request itself; the banner follows the Reply at once */
	cr_assert_eq(dgv_reject_keep(req, "plain", 6, TMO), 0);
	static const char banner[] = "the server speaks first";
	cr_assert_eq(send(ss, banner, sizeof banner, 0), (ssize_t)sizeof banner);
	usleep(50000); /* both in the client's receive queue before its provider reads */
	struct dgv_cm_event e = wait_ev(C.ch, DGV_CM_REJECTED);
	cr_assert_eq(e.pdata_len, 6);
	cr_assert_str_eq((const char *)e.pdata, "plain");
	/* the server's event for the request was taken back with it */
	struct dgv_cm_event x;
	cr_assert_eq(dgv_cm_get_event(S.ch, &x), -EAGAIN);
	cr_assert_eq(dgv_destroy_qp(C.qp), 0);
	C.qp = NULL;
	char b[64] = {0};
	size_t got = 0;
	struct timeval tv = {.tv_sec = 5};
	setsockopt(cs, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	while (got < sizeof banner) {
		ssize_t n = recv(cs, b + got, sizeof banner - got, 0);
		cr_assert_gt(n, 0, "the client's program lost the server's first bytes");
		got += (size_t)n;
	}
	cr_assert_str_eq(b, banner);
	cr_assert_eq(send(cs, "pong", 4, 0), 4);
	cr_assert_eq(recv(ss, b, sizeof b, 0), 4, "the client's bytes after the Reject must be all there is");
	cr_assert(!memcmp(b, "pong", 4));
	/* nothing of the provider's on either side afterwards */
	cr_assert_eq(recv(cs, b, sizeof b, MSG_DONTWAIT), -1);
	cr_assert_eq(errno, EAGAIN);
	close(cs);
	close(ss);
	close(ls);
}

Test(rc, reject_keeping_tcp_refuses_a_stream_that_is_not_mpa)
{
	int ls, cs, ss;
	tcp_pair(&ls, &cs, &ss);
	struct dgv_conn_req *req;
	cr_assert_eq(dgv_conn_req_adopt(S.ctx, ss, NULL, &S, &req), 0);
	/* nothing comes: a timeout, the request still the caller's */
	cr_assert_eq(dgv_reject_keep(req, NULL, 0, 100), -ETIMEDOUT);
	/* not an MPA Request: -EPROTO, nothing written back */
	static const char junk[] = "GET / HTTP/1.0\r\n\r\n....";
	cr_assert_eq(send(cs, junk, sizeof junk, 0), (ssize_t)sizeof junk);
	cr_assert_eq(dgv_reject_keep(req, NULL, 0, TMO), -EPROTO);
	char b[8];
	cr_assert_eq(recv(cs, b, sizeof b, MSG_DONTWAIT), -1);
	cr_assert_eq(errno, EAGAIN);
	cr_assert_eq(dgv_reject(req, NULL, 0), 0);
	close(cs);
	close(ss);
	close(ls);
}

Test(rc, channels_and_pollable_fd)
{
	struct dgv_cm_channel *ch;
	cr_assert_eq(dgv_cm_create_channel(S.ctx, &ch), 0);
	int fd = dgv_cm_channel_fd(ch);
	cr_assert(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(dgv_listen(S.ctx, (struct sockaddr *)&a, sizeof a, 4, -1, ch, NULL, &L), 0);
	cr_assert_eq(dgv_cm_destroy_channel(ch), -EBUSY);
	union dgv_sockaddr la;
	socklen_t ll;
	cr_assert_eq(dgv_listener_addr(L, &la, &ll), 0);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, &la.sa, ll, NULL, &C.qp), 0);
	/* the libev thread accepts and reads the Request: the fd becomes readable by itself */
	struct pollfd p = {.fd = fd, .events = POLLIN};
	cr_assert_eq(poll(&p, 1, TMO), 1);
	struct dgv_cm_event ev;
	cr_assert_eq(dgv_cm_get_event(ch, &ev), 0);
	cr_assert_eq(ev.type, DGV_CM_CONNECT_REQUEST);
	cr_assert_eq(poll(&p, 1, 0), 0);
	cr_assert_eq(dgv_cm_get_event(ch, &ev), -EAGAIN);
	struct dgv_qp_init_attr sa = rc_attr(&S);
	sa.cm_channel = ch;
	cr_assert_eq(dgv_accept(ev.req, S.pd, &sa, NULL, &S.qp), 0);
	wait_ev(ch, DGV_CM_ESTABLISHED);
	wait_ev(C.ch, DGV_CM_ESTABLISHED);
	dgv_listener_destroy(L);
	L = NULL;
	cr_assert_eq(dgv_destroy_qp(S.qp), 0);
	S.qp = NULL;
	cr_assert_eq(dgv_cm_destroy_channel(ch), 0);
}

/* A channel on a CQ: no descriptor of its own; each event makes the CQ's readable. */
Test(rc, channel_on_cq_signals_through_the_cq)
{
	struct dgv_cm_channel *ch;
	cr_assert_eq(dgv_cm_create_channel_on_cq(S.ctx, C.cq, &ch), -EINVAL); /* another context's CQ */
	cr_assert_eq(dgv_cm_create_channel_on_cq(S.ctx, S.cq, &ch), 0);
	int fd = dgv_cm_channel_fd(ch);
	cr_assert_eq(fd, dgv_cq_fd(S.cq));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(dgv_listen(S.ctx, (struct sockaddr *)&a, sizeof a, 4, -1, ch, NULL, &L), 0);
	union dgv_sockaddr la;
	socklen_t ll;
	cr_assert_eq(dgv_listener_addr(L, &la, &ll), 0);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, &la.sa, ll, NULL, &C.qp), 0);
	/* the CQ is not armed: the event alone makes its descriptor readable */
	struct pollfd p = {.fd = fd, .events = POLLIN};
	cr_assert_eq(poll(&p, 1, TMO), 1);
	cr_assert_eq(dgv_cm_pending(ch), 1);
	cr_assert_eq(dgv_cq_ack_event(S.cq), 0);
	/* a kick writes the eventfd, then sets its flag (cq.c soft_cq_kick): an ack between the
	 * two leaves the descriptor readable until a look that finds the flag (seen once in ~10
	 * runs under load); no new event may come meanwhile */
	for (int i = 0; i < 100 && poll(&p, 1, 0) == 1; i++) {
		usleep(1000);
		cr_assert_eq(dgv_cm_pending(ch), 1, "no event but the request");
		cr_assert_eq(dgv_cq_ack_event(S.cq), 0);
	}
	cr_assert_eq(poll(&p, 1, 0), 0, "acknowledged: not readable until the next event");
	struct dgv_cm_event ev;
	cr_assert_eq(dgv_cm_get_event(ch, &ev), 0);
	cr_assert_eq(ev.type, DGV_CM_CONNECT_REQUEST);
	cr_assert_eq(dgv_cm_get_event(ch, &ev), -EAGAIN);
	struct dgv_qp_init_attr sa = rc_attr(&S);
	sa.cm_channel = ch;
	cr_assert_eq(dgv_accept(ev.req, S.pd, &sa, NULL, &S.qp), 0);
	wait_ev(ch, DGV_CM_ESTABLISHED); /* dgv_cm_wait on a channel without a descriptor */
	wait_ev(C.ch, DGV_CM_ESTABLISHED);
	send_case(4096);
	/* the peer's disconnect reaches the channel (PEER_CLOSED: its half) through the CQ's
	 * descriptor; the provider's thread reads it, nobody here polls */
	dgv_cq_ack_event(S.cq);
	cr_assert_eq(dgv_disconnect(C.qp), 0);
	cr_assert_eq(dgv_cq_notify_background(S.cq, 1), 0);
	p.revents = 0;
	cr_assert_eq(poll(&p, 1, TMO), 1, "no event through the CQ's descriptor");
	cr_assert_eq(dgv_cm_pending(ch), 1);
	cr_assert_eq(dgv_cm_get_event(ch, &ev), 0);
	cr_assert_eq(ev.type, DGV_CM_PEER_CLOSED);
	cr_assert_eq(ev.qp, S.qp);
	dgv_listener_destroy(L);
	L = NULL;
	cr_assert_eq(dgv_destroy_qp(S.qp), 0);
	S.qp = NULL;
	cr_assert_eq(dgv_cm_destroy_channel(ch), 0);
}

/* ------------------------------------------------------------------ hostile peers */

static int raw_connect(const struct sockaddr_in *a)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert(s >= 0);
	cr_assert_eq(connect(s, (const struct sockaddr *)a, sizeof *a), 0);
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct timeval tv = {10, 0};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return s;
}

static void read_full(int s, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = recv(s, (uint8_t *)buf + got, n - got, 0);
		cr_assert(r > 0, "raw peer: recv %zd (errno %d) after %zu of %zu", r, errno, got, n);
		got += (size_t)r;
	}
}

/* A listener on S whose request from a raw client carries frame[0..len). Asserts the
 * CONNECT_ERROR with -EPROTO and that the connection is closed on the raw side. */
static void bad_request(const void *frame, size_t len)
{
	struct sockaddr_in a;
	listen_any(&a);
	int s = raw_connect(&a);
	cr_assert_eq(send(s, frame, len, 0), (ssize_t)len);
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_CONNECT_ERROR);
	cr_assert_eq(e.status, -EPROTO);
	cr_assert_null(e.req);
	cr_assert_eq(e.listener, L);
	char c;
	cr_assert_leq(recv(s, &c, 1, 0), 0);
	close(s);
}

Test(rc_hostile, mpa_request_bad_key, .init = setup, .fini = teardown, .timeout = 60)
{
	uint8_t f[MPA_RR_MAX];
	size_t n = mpa_rr_build(f, true, MPA_FLAG_C, 1, NULL, NULL, 0);
	f[5] = 'x';
	bad_request(f, n);
}

Test(rc_hostile, mpa_request_bad_rev, .init = setup, .fini = teardown, .timeout = 60)
{
	uint8_t f[MPA_RR_MAX];
	size_t n = mpa_rr_build(f, true, 0, 7, NULL, NULL, 0);
	bad_request(f, n);
}

Test(rc_hostile, mpa_request_pdata_too_long, .init = setup, .fini = teardown, .timeout = 60)
{
	uint8_t f[MPA_RR_HLEN + 600] = {0};
	mpa_rr_build(f, true, 0, 1, NULL, NULL, 0);
	f[18] = 513 >> 8;
	f[19] = 513 & 0xff;
	bad_request(f, sizeof f);
}

Test(rc_hostile, mpa_request_enhanced_without_word, .init = setup, .fini = teardown, .timeout = 60)
{
	uint8_t f[MPA_RR_HLEN + 2];
	mpa_rr_build(f, true, 0, 2, NULL, "ab", 2);
	f[16] |= MPA_FLAG_E;
	bad_request(f, sizeof f);
}

Test(rc_hostile, mpa_reply_bad_key, .init = setup, .fini = teardown, .timeout = 60)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(listen(ls, 4), 0);
	socklen_t l = sizeof a;
	getsockname(ls, (struct sockaddr *)&a, &l);
	struct dgv_qp_init_attr ca = rc_attr(&C);
	cr_assert_eq(dgv_connect(C.pd, &ca, (struct sockaddr *)&a, sizeof a, NULL, &C.qp), 0);
	int s = accept(ls, NULL, NULL);
	uint8_t req[MPA_RR_HLEN];
	read_full(s, req, sizeof req);
	cr_assert(memcmp(req, MPA_KEY_REQ, 16) == 0);
	uint8_t rest[MPA_RR_MAX];
	read_full(s, rest, be16toh(((struct mpa_rr_hdr *)req)->pd_len));
	uint8_t f[MPA_RR_MAX];
	size_t n = mpa_rr_build(f, true /* a Request key where a Reply belongs */, 0, 1, NULL, NULL, 0);
	cr_assert_eq(send(s, f, n, 0), (ssize_t)n);
	struct dgv_cm_event e = wait_ev(C.ch, DGV_CM_CONNECT_ERROR);
	cr_assert_eq(e.status, -EPROTO);
	cr_assert_eq(e.qp, C.qp);
	close(s);
	close(ls);
}

/* A raw initiator that completes MPA rev 1 (crc as asked) with our listener and accept. */
static int raw_established(bool crc)
{
	struct sockaddr_in a;
	listen_any(&a);
	int s = raw_connect(&a);
	uint8_t f[MPA_RR_MAX];
	size_t n = mpa_rr_build(f, true, crc ? MPA_FLAG_C : 0, 1, NULL, NULL, 0);
	cr_assert_eq(send(s, f, n, 0), (ssize_t)n);
	struct dgv_cm_event rq = wait_ev(S.ch, DGV_CM_CONNECT_REQUEST);
	struct dgv_conn_param sp = {.crc = crc ? 1 : 0, .mpa_rev = 1};
	struct dgv_qp_init_attr sa = rc_attr(&S);
	cr_assert_eq(dgv_accept(rq.req, S.pd, &sa, &sp, &S.qp), 0);
	uint8_t rep[MPA_RR_HLEN];
	read_full(s, rep, sizeof rep);
	cr_assert(memcmp(rep, MPA_KEY_REP, 16) == 0);
	cr_assert_eq(rep[17], 1);
	cr_assert_eq(!!(rep[16] & MPA_FLAG_C), crc);
	wait_ev(S.ch, DGV_CM_ESTABLISHED);
	return s;
}

/* Sends one FPDU around ulpdu from the raw peer. */
static void raw_fpdu(int s, const void *ulpdu, uint16_t len, bool crc)
{
	uint8_t *f = malloc(len + 16u);
	size_t n = mpa_fpdu_build(f, ulpdu, len, crc, -1);
	cr_assert_eq(send(s, f, n, 0), (ssize_t)n);
	free(f);
}

/* Reads the Terminate the raw peer gets and checks its triple; then end of stream. Checks the
 * event on S too. */
static void expect_terminate(int s, uint8_t l, uint8_t t, uint8_t c)
{
	uint8_t hdr[2];
	read_full(s, hdr, 2);
	uint32_t ulen = (uint32_t)hdr[0] << 8 | hdr[1];
	cr_assert_geq(ulen, DDP_UNTAGGED_HLEN + 4);
	uint8_t *u = malloc(ulen + 8);
	read_full(s, u, ulen + mpa_pad(ulen) + MPA_CRC_LEN);
	struct ddp_untagged_hdr d;
	memcpy(&d, u, sizeof d);
	cr_assert_eq(be16toh(d.ctrl) & RDMAP_CTRL_OPCODE, RDMAP_TERMINATE);
	cr_assert_eq(be32toh(d.qn), DDP_QN_TERMINATE);
	cr_assert_eq(be32toh(d.msn), 1);
	uint32_t tc;
	memcpy(&tc, u + DDP_UNTAGGED_HLEN, 4);
	tc = be32toh(tc);
	cr_assert_eq(tc >> 28, l, "layer %u", tc >> 28);
	cr_assert_eq((tc >> 24) & 0xf, t, "type %u", (tc >> 24) & 0xf);
	cr_assert_eq((tc >> 16) & 0xff, c, "code 0x%x", (tc >> 16) & 0xff);
	free(u);
	char x;
	cr_assert_eq(recv(s, &x, 1, 0), 0, "stream goes on after the Terminate");
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, -EPROTO);
	cr_assert_eq(e.term_layer, l);
	cr_assert_eq(e.term_etype, t);
	cr_assert_eq(e.term_ecode, c);
	cr_assert_eq(dgv_qp_state(S.qp), DGV_QPS_ERROR);
}

Test(rc_hostile, fpdu_crc_mismatch, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(true);
	post_recv(&S, 1, 0, 100);
	uint8_t u[DDP_UNTAGGED_HLEN + 8];
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_SEND, true, 0, 1, 0, 0);
	memcpy(u + DDP_UNTAGGED_HLEN, "payload!", 8);
	uint8_t f[64];
	size_t n = mpa_fpdu_build(f, u, sizeof u, true, -1);
	f[n - 1] ^= 0x5a;
	cr_assert_eq(send(s, f, n, 0), (ssize_t)n);
	expect_terminate(s, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_CRC);
	struct dgv_wc w = wait_wc(S.cq);
	cr_assert_eq(w.status, DGV_WC_WR_FLUSH_ERR);
	close(s);
}

Test(rc_hostile, oversized_fpdu, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	uint8_t len[2] = {0xff, 0xf0}; /* 65520 > MULPDU of loopback (65474) */
	cr_assert_eq(send(s, len, 2, 0), 2);
	expect_terminate(s, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_MARKER);
	close(s);
}

Test(rc_hostile, write_invalid_stag, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(true);
	uint8_t u[DDP_TAGGED_HLEN + 16];
	rc_put_tagged((struct ddp_tagged_hdr *)u, RDMAP_WRITE, true, S.mr->rkey ^ 0x100, (uint64_t)(uintptr_t)S.buf);
	memset(u + DDP_TAGGED_HLEN, 0xab, 16);
	raw_fpdu(s, u, sizeof u, true);
	expect_terminate(s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG);
	cr_assert_eq(S.buf[0], 0);
	close(s);
}

Test(rc_hostile, write_out_of_bounds, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	uint8_t u[DDP_TAGGED_HLEN + 16];
	rc_put_tagged((struct ddp_tagged_hdr *)u, RDMAP_WRITE, true, S.mr->rkey,
		      (uint64_t)(uintptr_t)S.buf + BUFSZ - 8);
	raw_fpdu(s, u, sizeof u, false);
	expect_terminate(s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS);
	close(s);
}

Test(rc_hostile, bad_qn, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	uint8_t u[DDP_UNTAGGED_HLEN + 4];
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_SEND, true, 5, 1, 0, 0);
	raw_fpdu(s, u, sizeof u, false);
	expect_terminate(s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_QN);
	close(s);
}

Test(rc_hostile, bad_msn, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	post_recv(&S, 1, 0, 100);
	post_recv(&S, 2, 100, 100);
	uint8_t u[DDP_UNTAGGED_HLEN + 4];
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_SEND, true, 0, 1, 0, 0);
	raw_fpdu(s, u, sizeof u, false);
	struct dgv_wc w = wait_wc(S.cq);
	cr_assert_eq(w.status, DGV_WC_SUCCESS);
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_SEND, true, 0, 5, 0, 0); /* want 2 */
	raw_fpdu(s, u, sizeof u, false);
	expect_terminate(s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MSN_RANGE);
	close(s);
}

Test(rc_hostile, bad_opcode_and_version, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	uint8_t u[DDP_UNTAGGED_HLEN];
	rc_put_untagged((struct ddp_untagged_hdr *)u, 0xb, true, 0, 1, 0, 0);
	raw_fpdu(s, u, sizeof u, false);
	expect_terminate(s, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_UNEXPECTED_OPCODE);
	close(s);
}

Test(rc_hostile, peer_terminate_is_reported, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	post_recv(&S, 1, 0, 100);
	uint8_t u[DDP_UNTAGGED_HLEN + RC_TERM_LEN];
	rc_put_untagged((struct ddp_untagged_hdr *)u, RDMAP_TERMINATE, true, DDP_QN_TERMINATE, 1, 0, 0);
	uint32_t tc = htobe32(term_ctrl_make(TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_PROT, RDMAP_ECODE_ACCESS_RIGHTS, 0));
	memcpy(u + DDP_UNTAGGED_HLEN, &tc, 4);
	u[DDP_UNTAGGED_HLEN + 4] = u[DDP_UNTAGGED_HLEN + 5] = 0;
	raw_fpdu(s, u, sizeof u, false);
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, -ECONNRESET);
	cr_assert_eq(e.term_layer, TERM_LAYER_RDMAP);
	cr_assert_eq(e.term_etype, RDMAP_ETYPE_REMOTE_PROT);
	cr_assert_eq(e.term_ecode, RDMAP_ECODE_ACCESS_RIGHTS);
	cr_assert_eq(wait_wc(S.cq).status, DGV_WC_WR_FLUSH_ERR);
	struct dgv_async_err ae;
	cr_assert_eq(dgv_poll_errq(S.qp, 1, &ae), 1);
	cr_assert(ae.remote);
	close(s);
}

Test(rc_hostile, peer_vanishes_mid_fpdu, .init = setup, .fini = teardown, .timeout = 60)
{
	int s = raw_established(false);
	uint8_t part[6] = {0, 40, 0x41, 0x43, 0, 0};
	cr_assert_eq(send(s, part, sizeof part, 0), 6);
	close(s);
	struct dgv_cm_event e = wait_ev(S.ch, DGV_CM_DISCONNECTED);
	cr_assert_eq(e.status, -ECONNRESET);
}
