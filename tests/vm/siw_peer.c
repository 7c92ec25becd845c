/*
 * siw_peer.c - the Linux-verbs end of the RC interop test (scripts/vm-test). A small libibverbs +
 * librdmacm program, run inside the test VM on the kernel's soft-iWARP device (siw0), that follows
 * the protocol of interop_proto.h (read its header comment: READY, Send echo, RDMA Write and Read
 * each way with byte-exact checks, BYE) against any peer that follows it too: another siw_peer
 * (sanity check, both ends on siw0) or tests/vm/rc_interop (our soft provider's RC).
 *
 *   siw_peer server IP [PORT]   passive side: rdma_listen on IP:PORT, accept one connection
 *   siw_peer client IP [PORT]   active side: rdma_connect to IP:PORT
 *   options (before the mode): -d DEV  fail unless the connection's device is DEV (e.g. siw0)
 *
 * Environment: SIW_PEER_SHOW_CMD, a shell command run (system()) while the connection is still
 * up, after the exchange and before the disconnect: the test bed lists the QP and CM id on siw0
 * with `rdma resource show` there, as proof that this traffic went through siw.
 *
 * Build: gcc -O2 -Wall -o siw_peer siw_peer.c -libverbs -lrdmacm (libibverbs-dev librdmacm-dev).
 * Exit: 0 when every op passed, 1 on a failed op, 2 on usage or set-up errors.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interop_proto.h"

struct peer {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *lid, *id;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_comp_channel *scc, *rcc;
	struct ibv_mr *mr;
	uint8_t *arena;
	uint64_t wr_seq;
};

static void __attribute__((noreturn)) die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "siw_peer: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "siw_peer: overall time limit reached, giving up\n";
	(void)!write(2, m, sizeof m - 1);
	_exit(3);
}

/* The next CM event of the wanted type (within IOP_TIMEOUT_MS); anything else is fatal. */
static void cm_expect(struct peer *p, enum rdma_cm_event_type want, struct rdma_cm_event *copy,
		      uint8_t *pdata, uint8_t *pdata_len, struct rdma_cm_id **id)
{
	struct pollfd pfd = {.fd = p->ch->fd, .events = POLLIN};
	struct rdma_cm_event *ev;

	if (poll(&pfd, 1, IOP_TIMEOUT_MS) != 1)
		die("no %s within %d ms", rdma_event_str(want), IOP_TIMEOUT_MS);
	if (rdma_get_cm_event(p->ch, &ev))
		die("rdma_get_cm_event: %m");
	if (ev->event != want)
		die("expected %s, got %s (status %d%s%s)", rdma_event_str(want), rdma_event_str(ev->event), ev->status,
		    ev->status < 0 ? ": " : "", ev->status < 0 ? strerror(-ev->status) : "");
	if (copy)
		*copy = *ev;
	if (pdata) {
		*pdata_len = ev->param.conn.private_data_len;
		if (*pdata_len)
			memcpy(pdata, ev->param.conn.private_data, *pdata_len);
	}
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
}

/* One completion from cq (via its channel, bounded); -1 on timeout or error status. */
static int wait_wc(struct ibv_cq *cq, struct ibv_comp_channel *cc, struct ibv_wc *wc, const char *what)
{
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		struct pollfd pfd = {.fd = cc->fd, .events = POLLIN};
		struct ibv_cq *ecq;
		void *ectx;

		if (n < 0) {
			fprintf(stderr, "%s: ibv_poll_cq failed\n", what);
			return -1;
		}
		if (n == 1) {
			if (wc->status != IBV_WC_SUCCESS) {
				fprintf(stderr, "%s: completion status %s (%d), vendor_err %#x\n", what,
					ibv_wc_status_str(wc->status), wc->status, wc->vendor_err);
				snprintf(iop_err, sizeof iop_err, "%s completed with status '%s' (siw)", what,
					 ibv_wc_status_str(wc->status));
				return -1;
			}
			return 0;
		}
		if (ibv_req_notify_cq(cq, 0)) {
			fprintf(stderr, "%s: ibv_req_notify_cq failed\n", what);
			return -1;
		}
		n = ibv_poll_cq(cq, 1, wc); /* one that came before the arm */
		if (n != 0)
			continue;
		if (poll(&pfd, 1, IOP_TIMEOUT_MS) != 1) {
			fprintf(stderr, "%s: no completion within %d ms\n", what, IOP_TIMEOUT_MS);
			snprintf(iop_err, sizeof iop_err, "%s: no completion within %d ms (siw)", what, IOP_TIMEOUT_MS);
			return -1;
		}
		if (ibv_get_cq_event(cc, &ecq, &ectx) == 0)
			ibv_ack_cq_events(ecq, 1);
	}
}

static int post_and_wait(struct peer *p, enum ibv_wr_opcode op, uint32_t off, uint32_t len, uint64_t raddr,
			 uint32_t rkey, const char *what)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(p->arena + off), .length = len, .lkey = p->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = ++p->wr_seq, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	struct ibv_wc wc;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if ((errno = ibv_post_send(p->id->qp, &wr, &bad))) {
		fprintf(stderr, "%s: ibv_post_send: %m\n", what);
		return -1;
	}
	if (wait_wc(p->scq, p->scc, &wc, what))
		return -1;
	if (wc.wr_id != wr.wr_id) {
		fprintf(stderr, "%s: completion for wr_id %llu, expected %llu\n", what, (unsigned long long)wc.wr_id,
			(unsigned long long)wr.wr_id);
		return -1;
	}
	return 0;
}

static int op_send(void *c, uint32_t off, uint32_t len)
{
	return post_and_wait(c, IBV_WR_SEND, off, len, 0, 0, "Send");
}

static int op_write(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return post_and_wait(c, IBV_WR_RDMA_WRITE, off, len, raddr, rkey, "RDMA Write");
}

static int op_read(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return post_and_wait(c, IBV_WR_RDMA_READ, off, len, raddr, rkey, "RDMA Read");
}

static int op_repost(void *c, uint32_t off)
{
	struct peer *p = c;
	struct ibv_sge sge = {.addr = (uintptr_t)(p->arena + off), .length = IOP_RBUF, .lkey = p->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = off, .sg_list = &sge, .num_sge = 1}, *bad;

	if ((errno = ibv_post_recv(p->id->qp, &wr, &bad))) {
		fprintf(stderr, "ibv_post_recv: %m\n");
		return -1;
	}
	return 0;
}

static int op_recv(void *c, uint32_t *off, uint32_t *len)
{
	struct peer *p = c;
	struct ibv_wc wc;

	if (wait_wc(p->rcq, p->rcc, &wc, "Receive"))
		return -1;
	if (wc.opcode != IBV_WC_RECV) {
		fprintf(stderr, "Receive: completion opcode %d\n", wc.opcode);
		return -1;
	}
	*off = (uint32_t)wc.wr_id;
	*len = wc.byte_len;
	return 0;
}

static const struct iop_ops siw_ops = {op_send, op_write, op_read, op_recv, op_repost};

/* PD, CQs, QP and the arena on the connection's device; receives posted. */
static void setup_qp(struct peer *p, const char *want_dev, int active)
{
	struct ibv_context *vctx = p->id->verbs;
	const char *dev = ibv_get_device_name(vctx->device);
	struct ibv_qp_init_attr ia;

	printf("device %s (transport %s), node %s\n", dev,
	       vctx->device->transport_type == IBV_TRANSPORT_IWARP ? "iWARP" : "IB/RoCE",
	       ibv_node_type_str(vctx->device->node_type));
	if (want_dev && strcmp(dev, want_dev))
		die("the connection uses device %s, not %s", dev, want_dev);
	if (!(p->pd = ibv_alloc_pd(vctx)))
		die("ibv_alloc_pd: %m");
	if (!(p->scc = ibv_create_comp_channel(vctx)) || !(p->rcc = ibv_create_comp_channel(vctx)))
		die("ibv_create_comp_channel: %m");
	if (!(p->scq = ibv_create_cq(vctx, 64, NULL, p->scc, 0)) || !(p->rcq = ibv_create_cq(vctx, 64, NULL, p->rcc, 0)))
		die("ibv_create_cq: %m");
	if (posix_memalign((void **)&p->arena, 4096, IOP_ARENA))
		die("out of memory");
	iop_arena_init(p->arena, active);
	/* iWARP: an RDMA Read's sink is written by the peer's Read Response, so it needs REMOTE_WRITE */
	p->mr = ibv_reg_mr(p->pd, p->arena, IOP_ARENA,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!p->mr)
		die("ibv_reg_mr: %m");
	memset(&ia, 0, sizeof ia);
	ia.send_cq = p->scq;
	ia.recv_cq = p->rcq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = IOP_NRECV + 2;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	if (rdma_create_qp(p->id, p->pd, &ia))
		die("rdma_create_qp: %m");
	for (uint32_t i = 0; i < IOP_NRECV; i++)
		if (op_repost(p, IOP_A_RECV + i * IOP_RBUF))
			die("posting receives failed");
}

static void addr_of(const char *ip, const char *port, struct sockaddr_storage *ss)
{
	struct addrinfo h = {.ai_family = AF_UNSPEC, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *res;
	int r = getaddrinfo(ip, port, &h, &res);

	if (r)
		die("address %s port %s: %s", ip, port, gai_strerror(r));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
}

static void disconnect(struct peer *p)
{
	struct pollfd pfd = {.fd = p->ch->fd, .events = POLLIN};
	struct rdma_cm_event *ev;
	int ok = 0;

	if (rdma_disconnect(p->id))
		fprintf(stderr, "rdma_disconnect: %m\n");
	/* the peer disconnects too after BYE; with iWARP the event comes when TCP is closed */
	while (poll(&pfd, 1, 5000) == 1 && rdma_get_cm_event(p->ch, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;

		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED) {
			ok = 1;
			break;
		}
	}
	iop_report("disconnect", ok, ok ? "RDMA_CM_EVENT_DISCONNECTED after rdma_disconnect" :
					  "no RDMA_CM_EVENT_DISCONNECTED within 5 s of rdma_disconnect");
}

int main(int argc, char **argv)
{
	const char *want_dev = NULL, *show;
	struct peer P = {0}, *p = &P;
	struct sockaddr_storage ss;
	struct rdma_conn_param cp;
	struct iop_pdata mine, theirs;
	uint8_t pd[256], pdl = 0;
	const char *why;
	char port[16] = "7700";
	int active, fails, opt;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((opt = getopt(argc, argv, "+d:")) != -1) {
		if (opt != 'd')
			die("usage: siw_peer [-d DEV] server|client IP [PORT]");
		want_dev = optarg;
	}
	if (argc - optind < 2 || (strcmp(argv[optind], "server") && strcmp(argv[optind], "client")))
		die("usage: siw_peer [-d DEV] server|client IP [PORT]");
	active = !strcmp(argv[optind], "client");
	if (argc - optind > 2)
		snprintf(port, sizeof port, "%s", argv[optind + 2]);
	addr_of(argv[optind + 1], port, &ss);
	signal(SIGALRM, on_alarm);
	alarm(120);

	if (!(p->ch = rdma_create_event_channel()))
		die("rdma_create_event_channel: %m");
	memset(&cp, 0, sizeof cp);
	cp.responder_resources = IOP_IRD_ORD;
	cp.initiator_depth = IOP_IRD_ORD;
	cp.private_data = &mine;
	cp.private_data_len = sizeof mine;
	if (active) {
		if (rdma_create_id(p->ch, &p->id, NULL, RDMA_PS_TCP))
			die("rdma_create_id: %m");
		if (rdma_resolve_addr(p->id, NULL, (struct sockaddr *)&ss, 2000))
			die("rdma_resolve_addr %s: %m", argv[optind + 1]);
		cm_expect(p, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, NULL, NULL);
		if (rdma_resolve_route(p->id, 2000))
			die("rdma_resolve_route: %m");
		cm_expect(p, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, NULL, NULL);
		setup_qp(p, want_dev, active);
		iop_pdata_put(&mine, (uintptr_t)p->arena, p->mr->rkey, IOP_REGION);
		if (rdma_connect(p->id, &cp))
			die("rdma_connect: %m");
		cm_expect(p, RDMA_CM_EVENT_ESTABLISHED, NULL, pd, &pdl, NULL);
		if ((why = iop_pdata_get(pd, pdl, &theirs))) {
			iop_report("connect", 0, why);
			return 1;
		}
	} else {
		if (rdma_create_id(p->ch, &p->lid, NULL, RDMA_PS_TCP))
			die("rdma_create_id: %m");
		if (rdma_bind_addr(p->lid, (struct sockaddr *)&ss))
			die("rdma_bind_addr %s:%s: %m", argv[optind + 1], port);
		if (rdma_listen(p->lid, 4))
			die("rdma_listen: %m");
		printf("listening on %s:%s\n", argv[optind + 1], port);
		cm_expect(p, RDMA_CM_EVENT_CONNECT_REQUEST, NULL, pd, &pdl, &p->id);
		if ((why = iop_pdata_get(pd, pdl, &theirs))) {
			rdma_reject(p->id, NULL, 0);
			iop_report("connect", 0, why);
			return 1;
		}
		setup_qp(p, want_dev, active);
		iop_pdata_put(&mine, (uintptr_t)p->arena, p->mr->rkey, IOP_REGION);
		if (rdma_accept(p->id, &cp))
			die("rdma_accept: %m");
		cm_expect(p, RDMA_CM_EVENT_ESTABLISHED, NULL, NULL, NULL, NULL);
	}
	{
		char d[200], a[64] = "?", b[64] = "?";
		struct sockaddr *la = rdma_get_local_addr(p->id), *ra = rdma_get_peer_addr(p->id);

		if (la->sa_family == AF_INET) {
			snprintf(a, sizeof a, "%s:%u", inet_ntoa(((struct sockaddr_in *)la)->sin_addr),
				 ntohs(rdma_get_src_port(p->id)));
			snprintf(b, sizeof b, "%s:%u", inet_ntoa(((struct sockaddr_in *)ra)->sin_addr),
				 ntohs(rdma_get_dst_port(p->id)));
		}
		snprintf(d, sizeof d, "%s on %s, qpn %u, %s -> %s, peer region rkey %#x len %u",
			 active ? "rdma_connect" : "rdma_accept", ibv_get_device_name(p->id->verbs->device),
			 p->id->qp->qp_num, a, b, theirs.rkey, theirs.len);
		iop_report("connect", 1, d);
	}
	fails = iop_run(&siw_ops, p, p->arena, active, &theirs);
	if ((show = getenv("SIW_PEER_SHOW_CMD")) && *show) {
		printf("--- while connected: %s\n", show);
		fflush(stdout);
		if (system(show) != 0)
			fprintf(stderr, "SIW_PEER_SHOW_CMD failed\n");
	}
	disconnect(p);
	rdma_destroy_qp(p->id);
	ibv_dereg_mr(p->mr);
	ibv_destroy_cq(p->scq);
	ibv_destroy_cq(p->rcq);
	ibv_destroy_comp_channel(p->scc);
	ibv_destroy_comp_channel(p->rcc);
	ibv_dealloc_pd(p->pd);
	rdma_destroy_id(p->id);
	if (p->lid)
		rdma_destroy_id(p->lid);
	rdma_destroy_event_channel(p->ch);
	printf("siw_peer %s: %s\n", active ? "client" : "server", fails ? "FAILED" : "OK");
	return fails ? 1 : 0;
}
