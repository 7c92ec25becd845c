/*
 * verbs_conf.c - conformance of a verbs provider's RC queue pairs, through dgverbs.h only, so
 * the same program judges the soft provider on the host (meson test verbs_conf_soft) and the
 * ibverbs provider on rxe and siw in the VM test bed (scripts/vm-test). Plain C, no Criterion:
 * it runs in the VM guest. One process plays both ends, each with its own context (as two
 * hosts would), so no second program or protocol is needed.
 *
 *   verbs_conf [-P soft|ibverbs|auto] [-d DEV] IP PORT
 *   verbs_conf -P ibverbs -H SECONDS IP PORT   rc_connect, hold the connection while someone
 *                 removes the device, then let go: check "vanish" (hold_connection; manual)
 *
 * It uses PORT (the listener), PORT+1 (where nobody listens) and PORT+2..PORT+4 (UD). Checks, one line each,
 * "PASS|FAIL|SKIP <name> <detail>":
 *   open          both contexts open on the provider asked for
 *   rc_connect    listen, connect with private data, CONNECT_REQUEST carries it byte-exact,
 *                 accept with private data, ESTABLISHED on both ends carries the reply's
 *   send_sizes    Send of 1 B .. 1 MiB, byte-exact, byte_len and opcode right (and Send with SE)
 *   rdma_write    RDMA Write of 256 KiB at an offset, byte-exact at the target
 *   rdma_read     RDMA Read of 256 KiB from an offset, byte-exact in the sink
 *   write_record  Write-Record of 5000 B at an offset: the target's completion is
 *                 RECV_WRITE_RECORD with STag, base, length, valid bytes and the single range of
 *                 a reliable transport, the source address; the source's is WRITE_RECORD
 *   disconnect    orderly close from the active side right after posting Sends: they all
 *                 arrive, then both ends see the end
 *   refused       connect to a port nobody listens on: CONNECT_ERROR with -ECONNREFUSED
 *   rejected      the server rejects with private data: REJECTED with it, byte-exact
 *   rem_access    RDMA Write with a wrong STag: the connection ends in error, with the reason
 *                 where the provider has one (REM_ACCESS_ERR completion on IB/RoCE, the peer's
 *                 Terminate in the error queue on soft; siw tells neither end)
 *   rem_bounds    the same with the right STag beyond the region's end (siw tells the target)
 *   ud_send       UD QPs on PORT+2 and PORT+3, an address handle by address, Sends of 1 B..1000 B
 *                 byte-exact with the sender's address as source (skipped where the device
 *                 has no UD: iWARP)
 *   ud_large      UD Sends of 4 KiB and 64 KiB (segmented where a datagram is smaller)
 *   ud_write_record  UD Write-Records of 700 B and 20000 B: placed, record, source
 *   ud_write      a UD RDMA Write of 30000 B, placed, no target completion
 *   ud_no_peer    an address handle to PORT+4, where no UD QP is, fails on a device (discovery);
 *                 skipped on soft, whose address handles ask nothing
 * Exit: 0 nothing failed, 1 a check failed, 2 usage, 77 the provider cannot be opened here
 * (no RDMA device for ibverbs).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgverbs.h"

#define MIB (1u << 20)
#define NRECV 4
#define RBUF MIB             /* each receive buffer */
#define REGION MIB           /* the server's region for Write/Read/Write-Record */
#define WAIT_MS 10000

struct side {
	const char *name;
	struct dgv_context *ctx;
	struct dgv_pd *pd;
	struct dgv_cq *scq, *rcq;
	struct dgv_cm_channel *ch;
	struct dgv_qp *qp;
	struct dgv_mr *mr;
	uint8_t *arena;          /* server: NRECV receive buffers then the region; client: send then sink */
	size_t arena_len;
	struct dgv_cm_event q[8];
	int nq;
};

static struct side S = {.name = "server"}, C = {.name = "client"};
static struct dgv_listener *L;
static int npass, nfail, nskip;
static bool iwarp_dev; /* an ibverbs iWARP device (MPA negotiated): it reports errors differently */
static char why[512];

static void result(const char *st, const char *name, const char *fmt, ...)
{
	va_list ap;
	char d[600];
	va_start(ap, fmt);
	vsnprintf(d, sizeof d, fmt, ap);
	va_end(ap);
	printf("%s %s %s\n", st, name, d);
	if (!strcmp(st, "PASS"))
		npass++;
	else if (!strcmp(st, "FAIL"))
		nfail++;
	else
		nskip++;
}

static void fail_why(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
}

static const char *ev_name(int t)
{
	static const char *n[] = {"?", "CONNECT_REQUEST", "ESTABLISHED", "REJECTED", "CONNECT_ERROR",
				  "DISCONNECTED", "PEER_CLOSED"};
	return t >= 1 && t <= 6 ? n[t] : "?";
}

/* Moves every event waiting on either side's channel into that side's queue. */
static void pump(void)
{
	struct side *sides[2] = {&S, &C};
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (!s->ch)
			continue;
		while (s->nq < 8 && dgv_cm_get_event(s->ch, &s->q[s->nq]) == 0)
			s->nq++;
	}
}

/* The next event of side s (driving both sides while waiting); it must be of type want
 * (want2 too if not 0). 0 or -1 with why set. */
static int wait_ev(struct side *s, int want, int want2, struct dgv_cm_event *out)
{
	for (int waited = 0; waited < WAIT_MS; waited += 5) {
		pump();
		if (s->nq) {
			*out = s->q[0];
			memmove(&s->q[0], &s->q[1], (size_t)(--s->nq) * sizeof s->q[0]);
			if ((int)out->type == want || (want2 && (int)out->type == want2))
				return 0;
			fail_why("%s: expected %s, got %s (status %d %s)", s->name, ev_name(want), ev_name(out->type),
				 out->status, out->status ? strerror(-out->status) : "");
			return -1;
		}
		dgv_cm_wait(s->ch, 5);
	}
	fail_why("%s: no %s within %d ms", s->name, ev_name(want), WAIT_MS);
	return -1;
}

/* One completion from cq within WAIT_MS (driving the other side's CQs too). */
static int wait_wc(struct side *s, struct dgv_cq *cq, struct dgv_wc *wc, const char *what)
{
	for (int waited = 0; waited < WAIT_MS; waited += 2) {
		int n = dgv_poll_cq(cq, 1, wc);
		if (n < 0) {
			fail_why("%s: %s: dgv_poll_cq: %s", s->name, what, strerror(-n));
			return -1;
		}
		if (n == 1)
			return 0;
		pump();
		dgv_cm_wait(s->ch, 0);
		dgv_cq_wait(cq, 2);
	}
	fail_why("%s: %s: no completion within %d ms", s->name, what, WAIT_MS);
	return -1;
}

static const char *st_name(int st)
{
	static const char *n[] = {"SUCCESS", "LOC_LEN_ERR", "LOC_PROT_ERR", "LOC_QP_OP_ERR", "WR_FLUSH_ERR",
				  "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "PARTIAL", "GENERAL_ERR"};
	return st >= 0 && st <= 9 ? n[st] : "?";
}

static int post_recv(struct side *s, int i)
{
	struct dgv_sge sge = {(uintptr_t)(s->arena + (size_t)i * RBUF), RBUF, s->mr->lkey};
	struct dgv_recv_wr wr = {.wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1};
	int r = dgv_post_recv(s->qp, &wr, NULL);
	if (r)
		fail_why("%s: dgv_post_recv: %s", s->name, strerror(-r));
	return r;
}

/* Posts one signaled WR from the client's arena and waits for its completion (status must be
 * want_st). */
static int client_op(enum dgv_wr_opcode op, size_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
		     int want_st, struct dgv_wc *wc, const char *what)
{
	static uint64_t seq = 1;
	struct dgv_sge sge = {(uintptr_t)(C.arena + off), len, C.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = ++seq, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .remote_addr = raddr, .rkey = rkey};
	int r = dgv_post_send(C.qp, &wr, NULL);
	if (r) {
		fail_why("client: %s: dgv_post_send: %s", what, strerror(-r));
		return -1;
	}
	if (wait_wc(&C, C.scq, wc, what))
		return -1;
	if (wc->wr_id != wr.wr_id || (int)wc->status != want_st) {
		fail_why("client: %s: completion wr_id %" PRIu64 " (want %" PRIu64 ") status %s (want %s)", what,
			 wc->wr_id, wr.wr_id, st_name(wc->status), st_name(want_st));
		return -1;
	}
	return 0;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

/* -1 when equal, else the first differing offset */
static long diff_at(const uint8_t *a, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return (long)i;
	return -1;
}

static int open_side(struct side *s, enum dgv_provider_kind prov, const char *dev, const struct sockaddr *addr,
		     socklen_t alen)
{
	struct dgv_context_attr ca = {.provider = prov, .addr = addr, .addrlen = alen, .device = dev};
	int r = dgv_open(&ca, &s->ctx);
	if (r)
		return r;
	s->arena_len = s == &S ? (size_t)NRECV * RBUF + REGION : 2 * (size_t)MIB;
	s->arena = aligned_alloc(4096, s->arena_len);
	if (!s->arena)
		return -ENOMEM;
	memset(s->arena, 0, s->arena_len);
	if ((r = dgv_alloc_pd(s->ctx, &s->pd)) || (r = dgv_create_cq(s->ctx, 64, &s->scq)) ||
	    (r = dgv_create_cq(s->ctx, 64, &s->rcq)) ||
	    (r = dgv_reg_mr(s->pd, s->arena, s->arena_len,
			    DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &s->mr)))
		return r;
	s->ch = dgv_cm_default_channel(s->ctx);
	return 0;
}

static struct dgv_qp_init_attr qp_attr(struct side *s)
{
	return (struct dgv_qp_init_attr){.qp_type = DGV_QPT_RC, .send_cq = s->scq, .recv_cq = s->rcq,
					 .max_send_wr = 32, .max_recv_wr = 16, .max_sge = 1};
}

struct region_pd {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

/* Connects C to S through L. 0 or -1 (why). */
static int connect_pair(const struct sockaddr *dst, socklen_t dlen, struct region_pd *peer_region,
			char *detail, size_t dl)
{
	static const char hello[] = "dgconf-hello";
	struct dgv_conn_param cp = {.private_data = hello, .private_data_len = sizeof hello - 1};
	struct dgv_qp_init_attr qa = qp_attr(&C);
	struct dgv_cm_event ev;
	int r = dgv_connect(C.pd, &qa, dst, dlen, &cp, &C.qp);
	if (r) {
		fail_why("client: dgv_connect: %s", strerror(-r));
		return -1;
	}
	if (wait_ev(&S, DGV_CM_CONNECT_REQUEST, 0, &ev))
		return -1;
	if (ev.pdata_len != sizeof hello - 1 || memcmp(ev.pdata, hello, sizeof hello - 1)) {
		fail_why("server: CONNECT_REQUEST private data %u bytes, want the %zu of \"%s\"", ev.pdata_len,
			 sizeof hello - 1, hello);
		dgv_reject(ev.req, NULL, 0);
		return -1;
	}
	struct region_pd mine = {(uintptr_t)(S.arena + (size_t)NRECV * RBUF), S.mr->rkey, REGION};
	struct dgv_conn_param ap = {.private_data = &mine, .private_data_len = sizeof mine};
	qa = qp_attr(&S);
	if ((r = dgv_accept(ev.req, S.pd, &qa, &ap, &S.qp))) {
		fail_why("server: dgv_accept: %s", strerror(-r));
		return -1;
	}
	for (int i = 0; i < NRECV; i++)
		if (post_recv(&S, i))
			return -1;
	if (wait_ev(&S, DGV_CM_ESTABLISHED, 0, &ev) || wait_ev(&C, DGV_CM_ESTABLISHED, 0, &ev))
		return -1;
	if (ev.pdata_len != sizeof mine) {
		fail_why("client: ESTABLISHED private data %u bytes, want %zu", ev.pdata_len, sizeof mine);
		return -1;
	}
	memcpy(peer_region, ev.pdata, sizeof *peer_region);
	if (peer_region->rkey != mine.rkey || peer_region->addr != mine.addr) {
		fail_why("client: ESTABLISHED private data differs from what the server sent");
		return -1;
	}
	if (dgv_qp_state(C.qp) != DGV_QPS_RTS || dgv_qp_state(S.qp) != DGV_QPS_RTS) {
		fail_why("QP states %d/%d after ESTABLISHED, want RTS", dgv_qp_state(S.qp), dgv_qp_state(C.qp));
		return -1;
	}
	struct dgv_conn_info ci;
	iwarp_dev = !strcmp(dgv_provider_name(C.ctx), "ibverbs") && dgv_conn_info(C.qp, &ci) == 0 && ci.mpa_rev;
	char a[INET6_ADDRSTRLEN] = "?";
	if (ev.info.peer.sa.sa_family == AF_INET)
		inet_ntop(AF_INET, &ev.info.peer.sin.sin_addr, a, sizeof a);
	snprintf(detail, dl, "to %s:%u, private data %zu B out and %zu B back byte-exact, ird/ord %u/%u", a,
		 ntohs(ev.info.peer.sin.sin_port), sizeof hello - 1, sizeof mine, ev.info.ird, ev.info.ord);
	return 0;
}

static void destroy_qps(void)
{
	if (C.qp)
		dgv_destroy_qp(C.qp);
	if (S.qp)
		dgv_destroy_qp(S.qp);
	C.qp = S.qp = NULL;
	C.nq = S.nq = 0;
}

/* Server's receive completion of a Send of len bytes, byte-exact against the client's. */
static int server_recv_check(uint32_t len, const char *what)
{
	struct dgv_wc wc;
	if (wait_wc(&S, S.rcq, &wc, what))
		return -1;
	if (wc.status != DGV_WC_SUCCESS || wc.opcode != DGV_WC_RECV || wc.byte_len != len) {
		fail_why("server: %s: completion status %s opcode %d byte_len %u (want SUCCESS RECV %u)", what,
			 st_name(wc.status), wc.opcode, wc.byte_len, len);
		return -1;
	}
	int i = (int)(wc.wr_id - 100);
	if (i < 0 || i >= NRECV) {
		fail_why("server: %s: receive completion with wr_id %" PRIu64 " we never posted", what, wc.wr_id);
		return -1;
	}
	long d = diff_at(S.arena + (size_t)i * RBUF, C.arena, len);
	if (d >= 0) {
		fail_why("server: %s: byte %ld differs (%02x, sent %02x)", what, d, S.arena[(size_t)i * RBUF + d],
			 C.arena[d]);
		return -1;
	}
	return post_recv(&S, i);
}

/* -H: after rc_connect, hold the connection for SECONDS while someone removes the device
 * (rdma link delete), report how the connection ended, then take everything down as a program
 * would. A device with disassociate_ucontext (mlx5) ends the connection with DEVICE_REMOVAL
 * (DISCONNECTED -ENODEV here, and the provider logs the device's fatal event); rxe and siw
 * have none: the kernel waits for the device's users and tells them nothing, and librdmacm
 * keeps its device contexts open until the process exits, so the removal completes only then.
 * That case is reported as SKIP. */
static int hold_connection(int seconds)
{
	struct dgv_cm_event ev = {0};
	printf("holding the connection for %d s\n", seconds);
	int got = 0;
	for (int i = 0; i < seconds * 100 && !got; i++) {
		pump();
		if (C.nq) {
			ev = C.q[0];
			got = 1;
		} else {
			dgv_cm_wait(C.ch, 10);
		}
	}
	destroy_qps();
	if (L)
		dgv_listener_destroy(L);
	struct side *sides[2] = {&S, &C};
	for (int i = 0; i < 2; i++) {
		dgv_dereg_mr(sides[i]->mr);
		dgv_destroy_cq(sides[i]->scq);
		dgv_destroy_cq(sides[i]->rcq);
		dgv_dealloc_pd(sides[i]->pd);
		dgv_close(sides[i]->ctx);
	}
	if (!got) {
		result("SKIP", "vanish", "no event within %d s: this device does not tell its users it is going "
		       "(no disassociate_ucontext); everything freed", seconds);
		return 77;
	}
	int ok = (ev.type == DGV_CM_DISCONNECTED || ev.type == DGV_CM_CONNECT_ERROR) && ev.status < 0;
	result(ok ? "PASS" : "FAIL", "vanish", "the connection ended: %s status %d (%s); everything freed",
	       ev_name(ev.type), ev.status, ev.status ? strerror(-ev.status) : "no error");
	return ok ? 0 : 1;
}

/* A Write the target must refuse, on a fresh connection: a wrong STag, or (bounds) the right
 * STag beyond the region's end. The connection ends in error; who is told what depends on the
 * provider (comments below). */
static void rem_test(const char *name, const union dgv_sockaddr *dst, socklen_t dlen, bool bounds)
{
	struct region_pd rg;
	char detail[300];
	if (!L) {
		result("SKIP", name, "no listener");
	} else if (connect_pair(&dst->sa, dlen, &rg, detail, sizeof detail)) {
		result("FAIL", name, "second connection: %s", why);
	} else {
		/* A device reports the target's refusal in the Write's completion; the soft provider
		 * completes a Write once TCP has it and learns of the refusal from the Terminate that
		 * follows (error queue, remote). Either way the QP must end in ERROR. */
		struct dgv_wc wc;
		struct dgv_sge sge = {(uintptr_t)C.arena, 4096, C.mr->lkey};
		struct dgv_send_wr wr = {.wr_id = 999, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_WRITE,
					 .send_flags = DGV_SEND_SIGNALED, .remote_addr = bounds ? rg.addr + REGION - 2048 : rg.addr,
					 .rkey = bounds ? rg.rkey : rg.rkey ^ 0x5a5a5a00u};
		int rr = dgv_post_send(C.qp, &wr, NULL);
		if (rr) {
			result("FAIL", name, "dgv_post_send: %s", strerror(-rr));
		} else if (wait_wc(&C, C.scq, &wc, "RDMA Write with a wrong STag")) {
			result("FAIL", name, "%s", why);
		} else {
			/* wait for the requester's QP to leave RTS, collecting both ends' error queues */
			struct dgv_async_err ce[4], se[4];
			int nce = 0, nse = 0, st = DGV_QPS_IDLE, ended = 0;
			for (int i = 0; i < 300; i++) {
				pump();
				for (int k = 0; k < C.nq; k++)
					if (C.q[k].type == DGV_CM_DISCONNECTED || C.q[k].type == DGV_CM_PEER_CLOSED ||
					    C.q[k].type == DGV_CM_CONNECT_ERROR)
						ended = 1;
				C.nq = S.nq = 0;
				struct dgv_wc more;
				dgv_poll_cq(C.scq, 1, &more);
				dgv_poll_cq(S.rcq, 1, &more);
				if (nce < 4)
					nce += dgv_poll_errq(C.qp, 4 - nce, ce + nce);
				if (nse < 4)
					nse += dgv_poll_errq(S.qp, 4 - nse, se + nse);
				st = dgv_qp_state(C.qp);
				if ((st == DGV_QPS_ERROR || ended) && (wc.status == DGV_WC_REM_ACCESS_ERR || nce || nse))
					break;
				if (ended && iwarp_dev && !bounds && i > 20)
					break; /* nothing more will come (below) */
				dgv_cm_wait(C.ch, 10);
			}
			int cprot = -1, sprot = -1;
			for (int i = 0; i < nce; i++)
				if (cprot < 0 && ce[i].remote && ce[i].etype == 1 &&
				    (ce[i].layer == DGV_LAYER_RDMAP || ce[i].layer == DGV_LAYER_DDP))
					cprot = i;
			for (int i = 0; i < nse; i++)
				if (sprot < 0 && !se[i].remote && se[i].etype == 1)
					sprot = i;
			if (wc.status == DGV_WC_REM_ACCESS_ERR && st == DGV_QPS_ERROR)
				result("PASS", name, "Write completion REM_ACCESS_ERR, QP in ERROR%s%s",
				       nce > 0 ? "; error queue: " : "", nce > 0 ? dgv_err_str(ce[0].layer, ce[0].etype, ce[0].ecode) : "");
			else if (cprot >= 0 && st == DGV_QPS_ERROR)
				result("PASS", name, "Write completion %s, then the peer's Terminate (%s), QP in ERROR",
				       st_name(wc.status), dgv_err_str(ce[cprot].layer, ce[cprot].etype, ce[cprot].ecode));
			else if (sprot >= 0 && (ended || st == DGV_QPS_ERROR))
				/* an iWARP device tells the target (a bounds or rights violation), which
				 * ends the connection; the requester only sees the end */
				result("PASS", name, "Write completion %s; the target reported %s and the requester's "
				       "connection ended (state %d)", st_name(wc.status),
				       dgv_err_str(se[sprot].layer, se[sprot].etype, se[sprot].ecode), st);
			else if (iwarp_dev && !bounds && wc.status == DGV_WC_SUCCESS && (ended || st == DGV_QPS_ERROR))
				/* siw answers an unknown STag with a Terminate and no event on either
				 * side: the requester sees the connection end, the reason is in dmesg */
				result("PASS", name, "Write completion SUCCESS (an iWARP Write completes when sent); the target "
				       "ended the connection (requester state %d; no event says why on this device)", st);
			else
				result("FAIL", name, "Write completion %s, requester QP state %d%s, %d/%d error queue "
				       "entries (requester/target): no remote access error reported", st_name(wc.status), st,
				       ended ? " (connection ended)" : "", nce, nse);
		}
		destroy_qps();
	}

}

/* UD: QPs at PORT+2 (server) and PORT+3 (client), an address handle by address (on a device:
 * service ID resolution, the discovery of the remote QP number and Q_Key), Sends byte-exact
 * with the right source address; then an address handle to PORT+4 where no UD QP is. */
static void ud_tests(const union dgv_sockaddr *dst, socklen_t dlen)
{
	union dgv_sockaddr sa = *dst, ca = *dst, none = *dst;
	uint16_t p0 = ntohs(dst->sin.sin_port); /* sin_port and sin6_port share the offset */
	sa.sin.sin_port = htons((uint16_t)(p0 + 2));
	ca.sin.sin_port = htons((uint16_t)(p0 + 3));
	none.sin.sin_port = htons((uint16_t)(p0 + 4));
	struct dgv_qp_init_attr qa = {.qp_type = DGV_QPT_UD, .send_cq = S.scq, .recv_cq = S.rcq, .max_send_wr = 32,
				      .max_recv_wr = 16, .max_sge = 1, .bind_addr = &sa.sa, .bind_len = dlen};
	struct dgv_ah *ah = NULL;
	struct dgv_wc junk[8];
	/* flushes of the RC QPs destroyed before */
	while (dgv_poll_cq(S.rcq, 8, junk) > 0 || dgv_poll_cq(S.scq, 8, junk) > 0 || dgv_poll_cq(C.rcq, 8, junk) > 0 ||
	       dgv_poll_cq(C.scq, 8, junk) > 0)
		;
	int r = dgv_create_qp(S.pd, &qa, &S.qp);
	if (r == -EOPNOTSUPP) {
		result("SKIP", "ud_send", "provider %s on this device has no UD queue pairs (iWARP: datagram sockets "
		       "stay on soft)", dgv_provider_name(S.ctx));
		result("SKIP", "ud_large", "no UD");
		result("SKIP", "ud_write", "no UD");
		result("SKIP", "ud_write_record", "no UD");
		result("SKIP", "ud_no_peer", "no UD");
		S.qp = NULL;
		return;
	}
	qa.send_cq = C.scq;
	qa.recv_cq = C.rcq;
	qa.bind_addr = &ca.sa;
	if (r || (r = dgv_create_qp(C.pd, &qa, &C.qp))) {
		result("FAIL", "ud_send", "dgv_create_qp(UD): %s", strerror(-r));
		result("SKIP", "ud_large", "no UD QP");
		result("SKIP", "ud_write", "no UD QP");
		result("SKIP", "ud_write_record", "no UD QP");
		result("SKIP", "ud_no_peer", "no UD QP");
		destroy_qps();
		return;
	}
	union dgv_sockaddr cl;
	socklen_t cll = sizeof cl;
	dgv_qp_local_addr(C.qp, &cl, &cll);
	static const uint32_t sizes[] = {1, 64, 1000, 4096, 65536};
	size_t k = 0, nsmall = 3;
	uint32_t too_big = 0;
	const char *fail = NULL;
	for (int i = 0; i < NRECV && !fail; i++)
		if (post_recv(&S, i))
			fail = why;
	if (!fail && (r = dgv_create_ah(C.pd, &sa.sa, dlen, &ah))) {
		fail_why("dgv_create_ah to the server's UD QP: %s", strerror(-r));
		fail = why;
	}
	for (; !fail && k < sizeof sizes / sizeof *sizes; k++) {
		struct dgv_sge sge = {(uintptr_t)C.arena, sizes[k], C.mr->lkey};
		struct dgv_send_wr wr = {.wr_id = 700 + k, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND,
					 .send_flags = DGV_SEND_SIGNALED, .ah = ah};
		struct dgv_wc wc;
		fill(C.arena, sizes[k], sizes[k] + 5);
		if ((r = dgv_post_send(C.qp, &wr, NULL))) {
			if (r == -EMSGSIZE && k >= nsmall) {
				too_big = sizes[k];
				break;
			}
			fail_why("size %u: dgv_post_send: %s", sizes[k], strerror(-r));
			fail = why;
		} else if (wait_wc(&C, C.scq, &wc, "UD Send") || wc.status != DGV_WC_SUCCESS) {
			if (!*why || wc.status != DGV_WC_SUCCESS)
				fail_why("size %u: send completion %s", sizes[k], st_name(wc.status));
			fail = why;
		} else if (wait_wc(&S, S.rcq, &wc, "UD Receive")) {
			fail = why;
		} else {
			int i = (int)(wc.wr_id - 100);
			long d = i >= 0 && i < NRECV ? diff_at(S.arena + (size_t)i * RBUF, C.arena, sizes[k]) : 0;
			if (wc.status != DGV_WC_SUCCESS || wc.opcode != DGV_WC_RECV || wc.byte_len != sizes[k] || i < 0 ||
			    i >= NRECV)
				fail_why("size %u: receive status %s opcode %d byte_len %u wr_id %" PRIu64, sizes[k],
					 st_name(wc.status), wc.opcode, wc.byte_len, wc.wr_id);
			else if (d >= 0)
				fail_why("size %u: byte %ld differs", sizes[k], d);
			else if (!dgv_addr_eq(&wc.src, &cl))
				fail_why("size %u: source address is not the client QP's", sizes[k]);
			else if (post_recv(&S, i) == 0)
				continue;
			fail = why;
		}
	}
	if (fail)
		result("FAIL", "ud_send", "%s", fail);
	else
		result("PASS", "ud_send", "%zu UD Sends of 1..%u B through an address handle by address, byte-exact, "
		       "source address right", k, sizes[(k ? k : 1) - 1]);
	if (fail)
		result("SKIP", "ud_large", "ud_send failed");
	else if (too_big)
		result("SKIP", "ud_large", "%u-byte UD message: -EMSGSIZE (the provider does not segment)", too_big);
	else
		result("PASS", "ud_large", "UD messages of 4 KiB and 64 KiB (segmented) byte-exact");
	/* ud_write_record: one datagram and many, into the server's region, no receive consumed */
	if (fail || !ah) {
		result("SKIP", "ud_write", "ud_send failed");
		result("SKIP", "ud_write_record", "ud_send failed");
	} else {
		static const uint32_t wl[] = {700, 20000};
		const char *wf = NULL;
		for (size_t j = 0; j < 2 && !wf; j++) {
			uint32_t off = 333 + (uint32_t)j * 40000;
			uint8_t *target = S.arena + (size_t)NRECV * RBUF + off;
			uint64_t raddr = (uintptr_t)target;
			struct dgv_sge sge = {(uintptr_t)C.arena, wl[j], C.mr->lkey};
			struct dgv_send_wr wr = {.wr_id = 800 + j, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_WRITE_RECORD,
						 .send_flags = DGV_SEND_SIGNALED, .ah = ah, .remote_addr = raddr, .rkey = S.mr->rkey};
			struct dgv_wc wc;
			fill(C.arena, wl[j], 91 + (uint32_t)j);
			memset(target, 0, wl[j]);
			if ((r = dgv_post_send(C.qp, &wr, NULL))) {
				fail_why("%u B: dgv_post_send: %s", wl[j], strerror(-r));
				wf = why;
			} else if (wait_wc(&C, C.scq, &wc, "UD Write-Record") || wc.status != DGV_WC_SUCCESS ||
				   wc.opcode != DGV_WC_WRITE_RECORD) {
				if (!*why || wc.status != DGV_WC_SUCCESS)
					fail_why("%u B: source completion %s opcode %d", wl[j], st_name(wc.status), wc.opcode);
				wf = why;
			} else if (wait_wc(&S, S.rcq, &wc, "UD Write-Record target")) {
				wf = why;
			} else if (wc.status != DGV_WC_SUCCESS || wc.opcode != DGV_WC_RECV_WRITE_RECORD || wc.byte_len != wl[j] ||
				   wc.record.stag != S.mr->rkey || wc.record.base != raddr || wc.record.length != wl[j] ||
				   wc.record.valid_bytes != wl[j] || wc.record.nranges != 1 || wc.record.ranges[0].offset ||
				   wc.record.ranges[0].length != wl[j]) {
				fail_why("%u B: target completion status %s opcode %d byte_len %u stag %#x base %#" PRIx64
					 " length %u valid %u nranges %u", wl[j], st_name(wc.status), wc.opcode, wc.byte_len,
					 wc.record.stag, wc.record.base, wc.record.length, wc.record.valid_bytes, wc.record.nranges);
				wf = why;
			} else if (!dgv_addr_eq(&wc.src, &cl)) {
				fail_why("%u B: source address is not the client QP's", wl[j]);
				wf = why;
			} else if (diff_at(target, C.arena, wl[j]) >= 0) {
				fail_why("%u B: byte %ld of the target differs", wl[j], diff_at(target, C.arena, wl[j]));
				wf = why;
			}
		}
		/* ud_write: an RDMA Write (no target completion), then a Send to know it was placed
		 * (both from the same QP to the same one, in order on this path) */
		{
			const uint32_t len = 30000, off = 100000;
			uint8_t *target = S.arena + (size_t)NRECV * RBUF + off;
			struct dgv_sge sge = {(uintptr_t)C.arena, len, C.mr->lkey}, sge2 = {(uintptr_t)C.arena + MIB, 8, C.mr->lkey};
			struct dgv_send_wr w2 = {.wr_id = 811, .sg_list = &sge2, .num_sge = 1, .opcode = DGV_WR_SEND,
						 .send_flags = DGV_SEND_SIGNALED, .ah = ah};
			struct dgv_send_wr w1 = {.wr_id = 810, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_WRITE,
						 .send_flags = DGV_SEND_SIGNALED, .ah = ah, .remote_addr = (uintptr_t)target,
						 .rkey = S.mr->rkey, .next = &w2};
			struct dgv_wc wc;
			const char *ww = NULL;
			fill(C.arena, len, 17);
			memset(target, 0, len);
			if ((r = dgv_post_send(C.qp, &w1, NULL)) == -EOPNOTSUPP) {
				result("SKIP", "ud_write", "RDMA Write on UD: not supported by provider %s", dgv_provider_name(C.ctx));
			} else {
				if (r)
					fail_why("dgv_post_send: %s", strerror(-r)), ww = why;
				else if (wait_wc(&C, C.scq, &wc, "UD Write") || wc.status != DGV_WC_SUCCESS || wc.opcode != DGV_WC_WRITE)
					fail_why("Write completion %s opcode %d", st_name(wc.status), wc.opcode), ww = why;
				else if (wait_wc(&S, S.rcq, &wc, "UD Receive after the Write") || wc.opcode != DGV_WC_RECV)
					fail_why("the target's next completion after the Write: opcode %d (want RECV: a Write "
						 "completes nothing at the target)", wc.opcode), ww = why;
				else if (diff_at(target, C.arena, len) >= 0)
					fail_why("byte %ld of the target differs", diff_at(target, C.arena, len)), ww = why;
				else
					post_recv(&S, (int)(wc.wr_id - 100));
				if (ww)
					result("FAIL", "ud_write", "%s", ww);
				else
					result("PASS", "ud_write", "UD RDMA Write of %u B placed byte-exact before the Send that followed, no "
					       "target completion", len);
			}
		}
		if (wf)
			result("FAIL", "ud_write_record", "%s", wf);
		else
			result("PASS", "ud_write_record", "UD Write-Records of 700 B and 20000 B: placed byte-exact, record "
			       "(stag, base, length, valid, 1 range) and source right, no receive consumed");
	}
	if (ah)
		dgv_destroy_ah(ah);
	/* ud_no_peer */
	struct dgv_ah *ah2 = NULL;
	r = dgv_create_ah(C.pd, &none.sa, dlen, &ah2);
	if (r == 0 && !strcmp(dgv_provider_name(C.ctx), "soft"))
		result("SKIP", "ud_no_peer", "soft: an address handle is a UDP address, nothing is asked (discovery is "
		       "the shim's)");
	else if (r == 0)
		result("FAIL", "ud_no_peer", "dgv_create_ah to port %u, where no UD QP is, succeeded", p0 + 4);
	else if (r == -ECONNREFUSED || r == -ETIMEDOUT || r == -EHOSTUNREACH)
		result("PASS", "ud_no_peer", "dgv_create_ah to port %u (no UD QP there): %s", p0 + 4, strerror(-r));
	else
		result("FAIL", "ud_no_peer", "dgv_create_ah to port %u: %s (want -ECONNREFUSED)", p0 + 4, strerror(-r));
	if (ah2)
		dgv_destroy_ah(ah2);
	destroy_qps();
}

int main(int argc, char **argv)
{
	enum dgv_provider_kind prov = DGV_PROV_AUTO;
	const char *pname = "auto", *dev = NULL;
	int opt;
	setvbuf(stdout, NULL, _IOLBF, 0);
	int hold = 0;
	while ((opt = getopt(argc, argv, "P:d:H:")) != -1) {
		if (opt == 'P') {
			pname = optarg;
			prov = !strcmp(optarg, "soft") ? DGV_PROV_SOFT : !strcmp(optarg, "ibverbs") ? DGV_PROV_IBVERBS
											    : DGV_PROV_AUTO;
		} else if (opt == 'd') {
			dev = optarg;
		} else if (opt == 'H') {
			hold = atoi(optarg);
		} else {
			fprintf(stderr, "usage: verbs_conf [-P soft|ibverbs|auto] [-d DEV] [-H SECONDS] IP PORT\n");
			return 2;
		}
	}
	if (argc - optind != 2) {
		fprintf(stderr, "usage: verbs_conf [-P soft|ibverbs|auto] [-d DEV] [-H SECONDS] IP PORT\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	alarm(180);
	struct addrinfo h = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *res;
	if (getaddrinfo(argv[optind], argv[optind + 1], &h, &res)) {
		fprintf(stderr, "verbs_conf: bad address %s port %s\n", argv[optind], argv[optind + 1]);
		return 2;
	}
	union dgv_sockaddr dst, dst_none;
	socklen_t dlen = res->ai_addrlen;
	memcpy(&dst, res->ai_addr, dlen);
	freeaddrinfo(res);
	dst_none = dst;
	if (dst.sa.sa_family == AF_INET)
		dst_none.sin.sin_port = htons((uint16_t)(ntohs(dst.sin.sin_port) + 1));
	else
		dst_none.sin6.sin6_port = htons((uint16_t)(ntohs(dst.sin6.sin6_port) + 1));

	/* ---- open */
	int r = open_side(&S, prov, dev, &dst.sa, dlen);
	if (!r)
		r = open_side(&C, prov, dev, &dst.sa, dlen);
	if (r == -ENODEV && prov == DGV_PROV_IBVERBS) {
		result("SKIP", "open", "provider ibverbs: no RDMA device serves %s (DGSHIM_LOG=info says why)",
		       argv[optind]);
		printf("verbs_conf: 0 passed, 0 failed, 1 skipped (provider %s)\n", pname);
		return 77;
	}
	if (r) {
		result("FAIL", "open", "provider %s: %s", pname, strerror(-r));
		return 1;
	}
	result("PASS", "open", "two contexts on provider %s: %s", dgv_provider_name(S.ctx), dgv_provider_why(S.ctx));

	/* ---- rc_connect */
	r = dgv_listen(S.ctx, &dst.sa, dlen, 4, -1, NULL, NULL, &L);
	if (r == -EOPNOTSUPP) {
		result("SKIP", "rc_connect", "provider %s has no RC", dgv_provider_name(S.ctx));
		return 77;
	}
	struct region_pd rg;
	char detail[300];
	const char *later[] = {"send_sizes", "rdma_write", "rdma_read", "write_record", "disconnect"};
	if (r || connect_pair(&dst.sa, dlen, &rg, detail, sizeof detail)) {
		if (r)
			fail_why("server: dgv_listen: %s", strerror(-r));
		result("FAIL", "rc_connect", "%s", why);
		for (size_t i = 0; i < sizeof later / sizeof *later; i++)
			result("SKIP", later[i], "no connection");
		destroy_qps();
		goto independent;
	}
	result("PASS", "rc_connect", "%s", detail);
	if (hold)
		return hold_connection(hold);

	/* ---- send_sizes */
	{
		static const uint32_t sizes[] = {1, 7, 64, 1000, 4096, 65536, 262144, MIB};
		size_t k = 0;
		struct dgv_wc wc;
		for (; k < sizeof sizes / sizeof *sizes; k++) {
			fill(C.arena, sizes[k], sizes[k]);
			if (client_op(k == 2 ? DGV_WR_SEND_SE : DGV_WR_SEND, 0, sizes[k], 0, 0, DGV_WC_SUCCESS, &wc, "Send"))
				break;
			if (wc.opcode != DGV_WC_SEND || wc.byte_len != sizes[k]) {
				fail_why("client: Send completion opcode %d byte_len %u", wc.opcode, wc.byte_len);
				break;
			}
			if (server_recv_check(sizes[k], "Receive"))
				break;
		}
		if (k == sizeof sizes / sizeof *sizes)
			result("PASS", "send_sizes", "%zu Sends of 1 B..1 MiB (one with SE) byte-exact, byte_len and opcodes right", k);
		else
			result("FAIL", "send_sizes", "size %u: %s", sizes[k], why);
	}

	/* ---- rdma_write: 256 KiB at offset 4096, then a Send to know it has been placed */
	{
		const uint32_t len = 256 * 1024, off = 4096;
		uint8_t *target = S.arena + (size_t)NRECV * RBUF + off;
		struct dgv_wc wc;
		fill(C.arena, len, 77);
		memset(target, 0, len);
		/* the target QP's lock (dgv_qp_stats takes it; the soft RNIC places under it) orders
		 * the clearing before the placement for ThreadSanitizer, which sees no order through
		 * the TCP connection the Write travels on (docs/tsan.md) */
		struct dgv_qp_stats qs;
		(void)dgv_qp_stats(S.qp, &qs);
		if (client_op(DGV_WR_WRITE, 0, len, rg.addr + off, rg.rkey, DGV_WC_SUCCESS, &wc, "RDMA Write") ||
		    (wc.opcode != DGV_WC_WRITE && (fail_why("client: Write completion opcode %d", wc.opcode), 1)) ||
		    client_op(DGV_WR_SEND, 0, 8, 0, 0, DGV_WC_SUCCESS, &wc, "Send after Write") ||
		    server_recv_check(8, "Receive after Write")) {
			result("FAIL", "rdma_write", "%s", why);
		} else {
			fill(C.arena, len, 77);
			long d = diff_at(target, C.arena, len);
			if (d >= 0)
				result("FAIL", "rdma_write", "byte %ld of the target differs", d);
			else if (target[-1] != 0 || target[len] != 0)
				result("FAIL", "rdma_write", "bytes outside [off, off+len) were written");
			else
				result("PASS", "rdma_write", "%u B at offset %u byte-exact, nothing outside", len, off);
		}
	}

	/* ---- rdma_read: 256 KiB from offset 8192 into the client's sink */
	{
		const uint32_t len = 256 * 1024, off = 8192;
		uint8_t *src = S.arena + (size_t)NRECV * RBUF + off, *sink = C.arena + MIB;
		struct dgv_wc wc;
		fill(src, len, 99);
		memset(sink, 0, len);
		/* the server's thread answers the Read from src: the server QP's lock, taken here,
		 * orders our fill before it for ThreadSanitizer (no happens-before through TCP) */
		struct dgv_qp_stats qs;
		(void)dgv_qp_stats(S.qp, &qs);
		if (client_op(DGV_WR_READ, MIB, len, rg.addr + off, rg.rkey, DGV_WC_SUCCESS, &wc, "RDMA Read")) {
			result("FAIL", "rdma_read", "%s", why);
		} else if (wc.opcode != DGV_WC_READ || wc.byte_len != len) {
			result("FAIL", "rdma_read", "completion opcode %d byte_len %u (want READ %u)", wc.opcode, wc.byte_len, len);
		} else {
			long d = diff_at(sink, src, len);
			if (d >= 0)
				result("FAIL", "rdma_read", "byte %ld of the sink differs", d);
			else
				result("PASS", "rdma_read", "%u B from offset %u byte-exact", len, off);
		}
	}

	/* ---- write_record: 5000 B at offset 1234 */
	{
		const uint32_t len = 5000, off = 1234;
		uint8_t *target = S.arena + (size_t)NRECV * RBUF + off;
		struct dgv_wc wc, twc;
		fill(C.arena, len, 55);
		memset(target, 0, len);
		if (client_op(DGV_WR_WRITE_RECORD, 0, len, rg.addr + off, rg.rkey, DGV_WC_SUCCESS, &wc, "Write-Record")) {
			result("FAIL", "write_record", "%s", why);
		} else if (wc.opcode != DGV_WC_WRITE_RECORD) {
			result("FAIL", "write_record", "source completion opcode %d, want WRITE_RECORD", wc.opcode);
		} else if (wait_wc(&S, S.rcq, &twc, "Write-Record target")) {
			result("FAIL", "write_record", "%s", why);
		} else {
			const struct dgv_record *rec = &twc.record;
			union dgv_sockaddr cl;
			socklen_t cll = sizeof cl;
			dgv_qp_local_addr(C.qp, &cl, &cll);
			long d = diff_at(target, C.arena, len);
			if (twc.status != DGV_WC_SUCCESS || twc.opcode != DGV_WC_RECV_WRITE_RECORD)
				result("FAIL", "write_record", "target completion status %s opcode %d (want SUCCESS RECV_WRITE_RECORD)",
				       st_name(twc.status), twc.opcode);
			else if (twc.byte_len != len || rec->stag != S.mr->rkey || rec->base != rg.addr + off ||
				 rec->length != len || rec->valid_bytes != len || rec->nranges != 1 || !rec->ranges ||
				 rec->ranges[0].offset != 0 || rec->ranges[0].length != len)
				result("FAIL", "write_record",
				       "record byte_len %u stag %#x base %#" PRIx64 " length %u valid %u nranges %u "
				       "(want %u %#x %#" PRIx64 " %u %u 1 [0,%u))",
				       twc.byte_len, rec->stag, rec->base, rec->length, rec->valid_bytes, rec->nranges, len,
				       S.mr->rkey, rg.addr + off, len, len, len);
			else if (!dgv_addr_eq(&twc.src, &cl))
				result("FAIL", "write_record", "completion source address is not the client's QP address");
			else if (d >= 0)
				result("FAIL", "write_record", "byte %ld of the target differs", d);
			else {
				bool consumed = twc.wr_id >= 100 && twc.wr_id < 100 + NRECV;
				if (consumed)
					post_recv(&S, (int)(twc.wr_id - 100));
				result("PASS", "write_record",
				       "%u B at offset %u byte-exact; record stag, base, length, valid bytes, 1 range, source right; %s",
				       len, off, consumed ? "one posted receive consumed"
							  : "no receive consumed");
			}
		}
	}

	/* ---- disconnect: from the active side, with NRECV unsignaled Sends still in flight: an
	 * orderly close delivers them first */
	{
		struct dgv_cm_event ev = {0};
		struct dgv_sge sge[NRECV];
		struct dgv_send_wr wr[NRECV];
		const uint32_t len = 200000;
		fill(C.arena, len, 11);
		for (int i = 0; i < NRECV; i++) {
			sge[i] = (struct dgv_sge){(uintptr_t)C.arena, len, C.mr->lkey};
			wr[i] = (struct dgv_send_wr){.wr_id = 500 + (uint64_t)i, .sg_list = &sge[i], .num_sge = 1,
						     .opcode = DGV_WR_SEND, .next = i + 1 < NRECV ? &wr[i + 1] : NULL};
		}
		int rr = dgv_post_send(C.qp, wr, NULL), first = 0, got = 0;
		if (rr)
			fail_why("client: dgv_post_send: %s", strerror(-rr));
		else if ((rr = dgv_disconnect(C.qp)))
			fail_why("client: dgv_disconnect: %s", strerror(-rr));
		else if (wait_ev(&S, DGV_CM_PEER_CLOSED, DGV_CM_DISCONNECTED, &ev))
			rr = -1;
		else if ((first = ev.type) == DGV_CM_PEER_CLOSED) {
			if ((rr = dgv_disconnect(S.qp)))
				fail_why("server: dgv_disconnect: %s", strerror(-rr));
			else if (wait_ev(&S, DGV_CM_DISCONNECTED, 0, &ev))
				rr = -1;
		}
		if (!rr && wait_ev(&C, DGV_CM_DISCONNECTED, 0, &ev))
			rr = -1;
		/* every Send posted before the close arrived whole */
		for (struct dgv_wc wc; !rr && got < NRECV && dgv_poll_cq(S.rcq, 1, &wc) == 1; got++)
			if (wc.status != DGV_WC_SUCCESS || wc.byte_len != len) {
				fail_why("server: receive %d after the close: status %s byte_len %u", got, st_name(wc.status),
					 wc.byte_len);
				rr = -1;
			}
		if (!rr && got < NRECV) {
			fail_why("server: %d of the %d Sends posted before dgv_disconnect arrived", got, NRECV);
			rr = -1;
		}
		if (!rr)
			result("PASS", "disconnect", "%d unsignaled Sends then client dgv_disconnect: all %d received whole; "
			       "server %s; DISCONNECTED on both (client status %d)", NRECV, got,
			       first == DGV_CM_PEER_CLOSED ? "PEER_CLOSED, then its dgv_disconnect" : "DISCONNECTED",
			       ev.status);
		else
			result("FAIL", "disconnect", "%s", why);
	}
	destroy_qps();

independent:
	/* ---- refused */
	{
		struct dgv_qp_init_attr qa = qp_attr(&C);
		struct dgv_cm_event ev;
		r = dgv_connect(C.pd, &qa, &dst_none.sa, dlen, NULL, &C.qp);
		if (r == -ECONNREFUSED)
			result("PASS", "refused", "dgv_connect returned -ECONNREFUSED at once");
		else if (r)
			result("FAIL", "refused", "dgv_connect: %s (want -ECONNREFUSED)", strerror(-r));
		else if (wait_ev(&C, DGV_CM_CONNECT_ERROR, DGV_CM_REJECTED, &ev))
			result("FAIL", "refused", "%s", why);
		else if (ev.type != DGV_CM_CONNECT_ERROR || ev.status != -ECONNREFUSED)
			result("FAIL", "refused", "%s status %d (%s), want CONNECT_ERROR -ECONNREFUSED", ev_name(ev.type),
			       ev.status, strerror(-ev.status));
		else
			result("PASS", "refused", "port %u: CONNECT_ERROR -ECONNREFUSED, QP state %d (ERROR is %d)",
			       ntohs(dst_none.sin.sin_port), dgv_qp_state(C.qp), DGV_QPS_ERROR);
		destroy_qps();
	}

	/* ---- rejected: the server answers a request with dgv_reject and private data */
	if (!L) {
		result("SKIP", "rejected", "no listener");
	} else {
		static const char hello[] = "dgconf-hello", no[] = "not-today";
		struct dgv_conn_param cp = {.private_data = hello, .private_data_len = sizeof hello - 1};
		struct dgv_qp_init_attr qa = qp_attr(&C);
		struct dgv_cm_event ev;
		r = dgv_connect(C.pd, &qa, &dst.sa, dlen, &cp, &C.qp);
		if (r)
			result("FAIL", "rejected", "dgv_connect: %s", strerror(-r));
		else if (wait_ev(&S, DGV_CM_CONNECT_REQUEST, 0, &ev))
			result("FAIL", "rejected", "%s", why);
		else if ((r = dgv_reject(ev.req, no, sizeof no - 1)))
			result("FAIL", "rejected", "dgv_reject: %s", strerror(-r));
		else if (wait_ev(&C, DGV_CM_REJECTED, 0, &ev))
			result("FAIL", "rejected", "%s", why);
		else if (ev.pdata_len != sizeof no - 1 || memcmp(ev.pdata, no, sizeof no - 1))
			result("FAIL", "rejected", "REJECTED with %u bytes of private data, want the %zu of \"%s\"", ev.pdata_len,
			       sizeof no - 1, no);
		else
			result("PASS", "rejected", "dgv_reject with private data: REJECTED at the client with it byte-exact, "
			       "QP state %d (ERROR is %d)", dgv_qp_state(C.qp), DGV_QPS_ERROR);
		destroy_qps();
	}

	/* ---- rem_access and rem_bounds */
	rem_test("rem_access", &dst, dlen, false);
	rem_test("rem_bounds", &dst, dlen, true);

	/* ---- ud_send, ud_large, ud_no_peer */
	ud_tests(&dst, dlen);

	if (L)
		dgv_listener_destroy(L);
	printf("verbs_conf: %d passed, %d failed, %d skipped (provider %s)\n", npass, nfail, nskip,
	       dgv_provider_name(S.ctx));
	return nfail ? 1 : 0;
}
