/*
 * rc_interop.c - our end of the RC interop test (scripts/vm-test): the soft provider's RC queue
 * pairs (standard iWARP over kernel TCP), driven only through dgverbs.h with DGV_PROV_SOFT, run
 * against tests/vm/siw_peer on the kernel's siw device, or against another rc_interop (control).
 * Both follow the protocol of interop_proto.h (READY, Send echo, RDMA Write and Read each way,
 * byte-exact, BYE).
 *
 *   rc_interop [options] server IP [PORT]   passive: dgv_listen on IP:PORT, dgv_accept one request
 *   rc_interop [options] client IP [PORT]   active: dgv_connect to IP:PORT
 *   options: -r 1|2      MPA revision to offer (default: the provider's, 2)
 *            -c on|off   MPA CRC: require / do not ask (default: the provider's default)
 *            -m          ask for MPA markers
 *            -E          (server, conformance probe for tests/vm/mpa_responder_probe.py) Send one
 *                        control message right after ESTABLISHED instead of running the protocol,
 *                        wait (5 s at most) for the initiator's first Send, then exit
 *
 * Exit: 0 every op passed, 1 an op failed (the @@OP lines and stderr say which and how),
 * 2 set-up error, 77 the provider has no RC (EOPNOTSUPP).
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
#include "interop_proto.h"

struct side {
	struct dgv_context *ctx;
	struct dgv_pd *pd;
	struct dgv_cq *scq, *rcq;
	struct dgv_cm_channel *ch;
	struct dgv_listener *lst;
	struct dgv_qp *qp;
	struct dgv_mr *mr;
	uint8_t *arena;
	uint64_t wr_seq;
};

static struct side S;

static void dump_errq(void)
{
	struct dgv_async_err e[8];
	int n;

	if (!S.qp)
		return;
	n = dgv_poll_errq(S.qp, 8, e);
	if (n > 0) {
		size_t l = strlen(iop_err);

		snprintf(iop_err + l, sizeof iop_err - l, "%s%s: %s (layer %u type %#x code %#x) opcode %u len %u",
			 l ? "; " : "", e[0].remote ? "peer's Terminate" : "detected here",
			 dgv_err_str(e[0].layer, e[0].etype, e[0].ecode), e[0].layer, e[0].etype, e[0].ecode,
			 e[0].opcode, e[0].length);
	}
	for (int i = 0; i < n; i++)
		fprintf(stderr, "  error queue: %s %s (layer %u type %#x code %#x) opcode %u msn %u stag %#x to %#" PRIx64
			" len %u\n", e[i].remote ? "peer's Terminate:" : "detected here:",
			dgv_err_str(e[i].layer, e[i].etype, e[i].ecode), e[i].layer, e[i].etype, e[i].ecode, e[i].opcode,
			e[i].msn, e[i].stag, e[i].to, e[i].length);
}

static void __attribute__((noreturn)) die(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "rc_interop: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	dump_errq();
	exit(code);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "rc_interop: overall time limit reached, giving up\n";
	(void)!write(2, m, sizeof m - 1);
	_exit(3);
}

static const char *ev_name(enum dgv_cm_event_type t)
{
	switch (t) {
	case DGV_CM_CONNECT_REQUEST: return "CONNECT_REQUEST";
	case DGV_CM_ESTABLISHED: return "ESTABLISHED";
	case DGV_CM_REJECTED: return "REJECTED";
	case DGV_CM_CONNECT_ERROR: return "CONNECT_ERROR";
	case DGV_CM_DISCONNECTED: return "DISCONNECTED";
	case DGV_CM_PEER_CLOSED: return "PEER_CLOSED";
	}
	return "?";
}

static void ev_explain(const struct dgv_cm_event *ev)
{
	fprintf(stderr, "  event %s status %d (%s)", ev_name(ev->type), ev->status, ev->status ? strerror(-ev->status) : "ok");
	if (ev->term_layer || ev->term_etype || ev->term_ecode)
		fprintf(stderr, ", Terminate: %s (layer %u type %#x code %#x)",
			dgv_err_str(ev->term_layer, ev->term_etype, ev->term_ecode), ev->term_layer, ev->term_etype,
			ev->term_ecode);
	if (ev->pdata_len)
		fprintf(stderr, ", %u bytes of private data", ev->pdata_len);
	fprintf(stderr, "\n");
}

/* The next CM event (bounded); returns -1 on timeout. */
static int next_event(struct dgv_cm_event *ev, int timeout_ms)
{
	for (int waited = 0;; waited += 50) {
		int r = dgv_cm_get_event(S.ch, ev);

		if (r == 0)
			return 0;
		if (r != -EAGAIN)
			die(2, "dgv_cm_get_event: %s", strerror(-r));
		if (waited >= timeout_ms)
			return -1;
		r = dgv_cm_wait(S.ch, 50);
		if (r && r != -ETIMEDOUT && r != -EINTR && r != -EAGAIN)
			die(2, "dgv_cm_wait: %s", strerror(-r));
	}
}

/* One completion from cq (bounded); -1 on timeout or an error status. */
static int wait_wc(struct dgv_cq *cq, struct dgv_wc *wc, const char *what)
{
	for (int waited = 0;; waited += 100) {
		int n = dgv_poll_cq(cq, 1, wc);

		if (n < 0) {
			fprintf(stderr, "%s: dgv_poll_cq: %s\n", what, strerror(-n));
			return -1;
		}
		if (n == 1) {
			if (wc->status != DGV_WC_SUCCESS) {
				fprintf(stderr, "%s: completion status %d, QP state %d\n", what, wc->status,
					(int)dgv_qp_state(S.qp));
				snprintf(iop_err, sizeof iop_err, "%s completed with status %d", what, wc->status);
				dump_errq();
				return -1;
			}
			return 0;
		}
		if (waited >= IOP_TIMEOUT_MS) {
			fprintf(stderr, "%s: no completion within %d ms, QP state %d\n", what, IOP_TIMEOUT_MS,
				(int)dgv_qp_state(S.qp));
			snprintf(iop_err, sizeof iop_err, "%s: no completion within %d ms", what, IOP_TIMEOUT_MS);
			dump_errq();
			return -1;
		}
		n = dgv_cq_wait(cq, 100);
		if (n && n != -ETIMEDOUT && n != -EINTR) {
			fprintf(stderr, "%s: dgv_cq_wait: %s\n", what, strerror(-n));
			return -1;
		}
	}
}

static int post_and_wait(enum dgv_wr_opcode op, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
			 const char *what)
{
	struct dgv_sge sge = {.addr = (uintptr_t)(S.arena + off), .length = len, .lkey = S.mr->lkey};
	struct dgv_send_wr wr = {.wr_id = ++S.wr_seq, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .remote_addr = raddr, .rkey = rkey}, *bad;
	struct dgv_wc wc;
	int r = dgv_post_send(S.qp, &wr, &bad);

	if (r) {
		fprintf(stderr, "%s: dgv_post_send: %s\n", what, strerror(-r));
		return -1;
	}
	if (wait_wc(S.scq, &wc, what))
		return -1;
	if (wc.wr_id != wr.wr_id) {
		fprintf(stderr, "%s: completion for wr_id %" PRIu64 ", expected %" PRIu64 "\n", what, wc.wr_id, wr.wr_id);
		return -1;
	}
	if (op == DGV_WR_READ && wc.byte_len != len) {
		fprintf(stderr, "%s: completion byte_len %u, expected %u\n", what, wc.byte_len, len);
		return -1;
	}
	return 0;
}

static int op_send(void *c, uint32_t off, uint32_t len)
{
	return post_and_wait(DGV_WR_SEND, off, len, 0, 0, "Send");
}

static int op_write(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return post_and_wait(DGV_WR_WRITE, off, len, raddr, rkey, "RDMA Write");
}

static int op_read(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return post_and_wait(DGV_WR_READ, off, len, raddr, rkey, "RDMA Read");
}

static int op_repost(void *c, uint32_t off)
{
	struct dgv_sge sge = {.addr = (uintptr_t)(S.arena + off), .length = IOP_RBUF, .lkey = S.mr->lkey};
	struct dgv_recv_wr wr = {.wr_id = off, .sg_list = &sge, .num_sge = 1}, *bad;
	int r = dgv_post_recv(S.qp, &wr, &bad);

	if (r) {
		fprintf(stderr, "dgv_post_recv: %s\n", strerror(-r));
		return -1;
	}
	return 0;
}

static int op_recv(void *c, uint32_t *off, uint32_t *len)
{
	struct dgv_wc wc;

	if (wait_wc(S.rcq, &wc, "Receive"))
		return -1;
	if (wc.opcode != DGV_WC_RECV) {
		fprintf(stderr, "Receive: completion opcode %d\n", wc.opcode);
		return -1;
	}
	*off = (uint32_t)wc.wr_id;
	*len = wc.byte_len;
	return 0;
}

static const struct iop_ops soft_ops = {op_send, op_write, op_read, op_recv, op_repost};

static void unsupported(const char *call, int r)
{
	printf("@@OP connect SKIP the %s provider has no RC (%s: %s)\n", dgv_provider_name(S.ctx), call, strerror(-r));
	exit(77);
}

static void addr_of(const char *ip, const char *port, union dgv_sockaddr *sa, socklen_t *len)
{
	struct addrinfo h = {.ai_family = AF_UNSPEC, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *res;
	int r = getaddrinfo(ip, port, &h, &res);

	if (r)
		die(2, "address %s port %s: %s", ip, port, gai_strerror(r));
	memset(sa, 0, sizeof *sa);
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
}

static const char *sa_str(const union dgv_sockaddr *a, char *b, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (a->sa.sa_family == AF_INET)
		inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof ip);
	else if (a->sa.sa_family == AF_INET6)
		inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof ip);
	snprintf(b, n, "%s:%u", ip, ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port));
	return b;
}

static void disconnect(void)
{
	struct dgv_cm_event ev;
	int r = dgv_disconnect(S.qp), ok = 0;

	if (r)
		fprintf(stderr, "dgv_disconnect: %s\n", strerror(-r));
	while (next_event(&ev, 5000) == 0) {
		if (ev.type == DGV_CM_CONNECT_REQUEST) {
			dgv_reject(ev.req, NULL, 0);
			continue;
		}
		if (ev.qp != S.qp)
			continue;
		if (ev.type == DGV_CM_DISCONNECTED) {
			ok = ev.status == 0;
			if (!ok)
				ev_explain(&ev);
			break;
		}
	}
	iop_report("disconnect", ok, ok ? "DGV_CM_DISCONNECTED (orderly) after dgv_disconnect" :
					  "no orderly DGV_CM_DISCONNECTED within 5 s of dgv_disconnect");
}

int main(int argc, char **argv)
{
	struct dgv_context_attr ca = {.provider = DGV_PROV_SOFT};
	struct dgv_qp_init_attr qa;
	struct dgv_conn_param cp;
	struct dgv_cm_event ev;
	struct dgv_conn_info ci;
	struct dgv_qp_stats st;
	struct iop_pdata mine, theirs;
	union dgv_sockaddr addr;
	socklen_t alen;
	const char *why, *port = "7700";
	char b1[80], b2[80], d[300];
	int active, fails, opt, r, early = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	memset(&cp, 0, sizeof cp);
	cp.crc = -1;
	while ((opt = getopt(argc, argv, "+r:c:mE")) != -1) {
		switch (opt) {
		case 'r': cp.mpa_rev = (uint8_t)atoi(optarg); break;
		case 'c': cp.crc = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : -1; break;
		case 'm': cp.markers = 1; break;
		case 'E': early = 1; break;
		default: die(2, "usage: rc_interop [-r 1|2] [-c on|off] [-m] server|client IP [PORT]");
		}
	}
	if (argc - optind < 2 || (strcmp(argv[optind], "server") && strcmp(argv[optind], "client")))
		die(2, "usage: rc_interop [-r 1|2] [-c on|off] [-m] server|client IP [PORT]");
	active = !strcmp(argv[optind], "client");
	if (argc - optind > 2)
		port = argv[optind + 2];
	addr_of(argv[optind + 1], port, &addr, &alen);
	signal(SIGALRM, on_alarm);
	alarm(120);

	if ((r = dgv_open(&ca, &S.ctx)))
		die(2, "dgv_open(soft): %s", strerror(-r));
	if ((r = dgv_alloc_pd(S.ctx, &S.pd)) || (r = dgv_create_cq(S.ctx, 64, &S.scq)) ||
	    (r = dgv_create_cq(S.ctx, 64, &S.rcq)))
		die(2, "pd/cq: %s", strerror(-r));
	r = dgv_cm_create_channel(S.ctx, &S.ch);
	if (r == -EOPNOTSUPP || r == -ENOSYS)
		unsupported("dgv_cm_create_channel", r);
	if (r)
		die(2, "dgv_cm_create_channel: %s", strerror(-r));
	if (posix_memalign((void **)&S.arena, 4096, IOP_ARENA))
		die(2, "out of memory");
	iop_arena_init(S.arena, active);
	r = dgv_reg_mr(S.pd, S.arena, IOP_ARENA,
		       DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &S.mr);
	if (r)
		die(2, "dgv_reg_mr: %s", strerror(-r));
	iop_pdata_put(&mine, (uintptr_t)S.arena, S.mr->rkey, IOP_REGION);
	cp.private_data = &mine;
	cp.private_data_len = sizeof mine;
	cp.ird = cp.ord = IOP_IRD_ORD;
	cp.timeout_ms = IOP_TIMEOUT_MS;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = DGV_QPT_RC;
	qa.send_cq = S.scq;
	qa.recv_cq = S.rcq;
	qa.max_send_wr = 16;
	qa.max_recv_wr = IOP_NRECV + 2;
	qa.max_sge = 1;
	qa.cm_channel = S.ch;

	if (active) {
		r = dgv_connect(S.pd, &qa, &addr.sa, alen, &cp, &S.qp);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			unsupported("dgv_connect", r);
		if (r)
			die(2, "dgv_connect %s: %s", sa_str(&addr, b1, sizeof b1), strerror(-r));
	} else {
		r = dgv_listen(S.ctx, &addr.sa, alen, 4, -1, S.ch, NULL, &S.lst);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			unsupported("dgv_listen", r);
		if (r)
			die(2, "dgv_listen %s: %s", sa_str(&addr, b1, sizeof b1), strerror(-r));
		printf("listening on %s\n", sa_str(&addr, b1, sizeof b1));
		if (next_event(&ev, 60000))
			die(1, "no connection request within 60 s");
		if (ev.type != DGV_CM_CONNECT_REQUEST) {
			ev_explain(&ev);
			iop_report("connect", 0, "the listener reported a failed connection instead of a request");
			return 1;
		}
		printf("connect request from %s: MPA rev %u, CRC %s, markers %s, IRD %u ORD %u, %u bytes of private data\n",
		       sa_str(&ev.info.peer, b1, sizeof b1), ev.info.mpa_rev, ev.info.crc ? "on" : "off",
		       ev.info.markers_rx ? "on" : "off", ev.info.ird, ev.info.ord, ev.pdata_len);
		if ((why = iop_pdata_get(ev.pdata, ev.pdata_len, &theirs))) {
			dgv_reject(ev.req, NULL, 0);
			iop_report("connect", 0, why);
			return 1;
		}
		r = dgv_accept(ev.req, S.pd, &qa, &cp, &S.qp);
		if (r)
			die(2, "dgv_accept: %s", strerror(-r));
	}
	for (uint32_t i = 0; i < IOP_NRECV; i++)
		if (op_repost(NULL, IOP_A_RECV + i * IOP_RBUF))
			die(2, "posting receives failed");
	for (;;) {
		if (next_event(&ev, IOP_TIMEOUT_MS)) {
			iop_report("connect", 0, "no ESTABLISHED within the time limit");
			dump_errq();
			return 1;
		}
		if (ev.type == DGV_CM_CONNECT_REQUEST) { /* not ours to serve */
			dgv_reject(ev.req, NULL, 0);
			continue;
		}
		if (ev.qp == S.qp)
			break;
	}
	if (ev.type != DGV_CM_ESTABLISHED) {
		ev_explain(&ev);
		snprintf(d, sizeof d, "%s instead of ESTABLISHED (status %d %s)", ev_name(ev.type), ev.status,
			 ev.status ? strerror(-ev.status) : "");
		iop_report("connect", 0, d);
		dump_errq();
		return 1;
	}
	if (active && (why = iop_pdata_get(ev.pdata, ev.pdata_len, &theirs))) {
		iop_report("connect", 0, why);
		return 1;
	}
	if ((r = dgv_conn_info(S.qp, &ci)))
		die(2, "dgv_conn_info: %s", strerror(-r));
	snprintf(d, sizeof d, "%s, soft provider, %s -> %s, MPA rev %u, CRC %s, markers rx %s tx %s, IRD %u ORD %u, "
		 "peer region rkey %#x len %u", active ? "dgv_connect" : "dgv_accept", sa_str(&ci.local, b1, sizeof b1),
		 sa_str(&ci.peer, b2, sizeof b2), ci.mpa_rev, ci.crc ? "on" : "off", ci.markers_rx ? "on" : "off",
		 ci.markers_tx ? "on" : "off", ci.ird, ci.ord, theirs.rkey, theirs.len);
	iop_report("connect", 1, d);

	if (early && !active) { /* the responder speaks first: the provider must hold it (RFC 5044 7.1.2) */
		struct dgv_send_wr *bad;
		struct dgv_sge sge = {.addr = (uintptr_t)(S.arena + IOP_A_SEND), .length = sizeof(struct iop_ctl),
				      .lkey = S.mr->lkey};
		struct dgv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DGV_WR_SEND,
					 .send_flags = DGV_SEND_SIGNALED};
		struct dgv_wc wc;
		uint32_t off, len;

		iop_ctl_put((struct iop_ctl *)(void *)(S.arena + IOP_A_SEND), IOP_READY, 0, 0, 0, 0);
		if ((r = dgv_post_send(S.qp, &wr, &bad)))
			die(2, "dgv_post_send: %s", strerror(-r));
		printf("posted a Send right after ESTABLISHED\n");
		r = op_recv(NULL, &off, &len);
		printf("initiator's first Send %s\n", r ? "not received" : "received");
		r = wait_wc(S.scq, &wc, "early Send");
		printf("early Send %s\n", r ? "not completed" : "completed");
		dgv_disconnect(S.qp);
		return 0;
	}
	fails = iop_run(&soft_ops, NULL, S.arena, active, &theirs);
	if (fails)
		dump_errq();
	disconnect();
	if (dgv_qp_stats(S.qp, &st) == 0)
		printf("qp stats: tx %" PRIu64 " FPDUs %" PRIu64 " bytes %" PRIu64 " msgs, rx %" PRIu64 " FPDUs %" PRIu64
		       " bytes %" PRIu64 " msgs, malformed %" PRIu64 ", crc drops %" PRIu64 ", placement rejects %" PRIu64
		       ", terminates sent %" PRIu64 " rcvd %" PRIu64 "\n", st.tx_datagrams, st.tx_bytes, st.tx_msgs,
		       st.rx_datagrams, st.rx_bytes, st.rx_msgs, st.malformed_drops, st.crc_drops, st.placement_rejects,
		       st.terminates_sent, st.terminates_rcvd);
	dgv_destroy_qp(S.qp);
	if (S.lst)
		dgv_listener_destroy(S.lst);
	while (dgv_cm_get_event(S.ch, &ev) == 0)
		if (ev.type == DGV_CM_CONNECT_REQUEST)
			dgv_reject(ev.req, NULL, 0);
	dgv_cm_destroy_channel(S.ch);
	dgv_dereg_mr(S.mr);
	dgv_destroy_cq(S.scq);
	dgv_destroy_cq(S.rcq);
	dgv_dealloc_pd(S.pd);
	dgv_close(S.ctx);
	free(S.arena);
	printf("rc_interop %s: %s\n", active ? "client" : "server", fails ? "FAILED" : "OK");
	return fails ? 1 : 0;
}
