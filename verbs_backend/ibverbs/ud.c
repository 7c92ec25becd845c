/*
 * ud.c - the ibverbs provider's UD queue pairs (InfiniBand and RoCE; iWARP has no UD).
 *
 * A dgv UD QP is named by a UDP-style address (IP, port). On a device that address is an
 * rdma_cm id of the UDP port space bound to it, and a sender learns the QP number and Q_Key
 * behind it by rdma_cm's service ID resolution (SIDR: rdma_resolve_addr, rdma_resolve_route,
 * then rdma_connect on a UDP id, which the target's listening id answers). That is the
 * discovery exchange, done once per address handle: dgv_create_ah resolves synchronously
 * (2 s per step) and fails with -ECONNREFUSED when no UD QP listens at that address. The
 * route step is what gives RoCE v2 the right source GID (the IPv4-mapped one of the netdev
 * that carries the address); building the GID by hand is what rsocket gets wrong on rxe.
 *
 * The target side answers SIDR from a thread per context (epoll on the UD QPs' rdma_cm
 * channels): a UD QP is expected to be reachable while its program is busy elsewhere, as a
 * UDP socket is.
 *
 * Every Send is a Send with Immediate whose immediate carries the sender's port (upper 16
 * bits, network order), because a UD completion names the sender only by GID and QP number:
 * the GRH gives the IP address (RoCE v2 over IPv4: the IPv4 header in the GRH slot's last 20
 * bytes; otherwise the source GID, IPv4-mapped or IPv6), the immediate the port, and together
 * they are the source address the soft provider reports. Receives get a 40-byte slot from a
 * registered per-QP array in front of the program's buffer, where the device puts the GRH.
 * A message is at most the port's active MTU (no segmentation yet: larger ones get
 * -EMSGSIZE), and only Send and Send with Solicited Event exist on UD for now.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ibverbs_int.h"
#include "log.h"

/* ---------------------------------------------------------------- SIDR answers */

static void *sidr_main(void *arg)
{
	struct iv_ctx *ctx = arg;
	for (;;) {
		struct epoll_event ev[8];
		int n = epoll_wait(ctx->sidr_ep, ev, 8, -1);
		if (n < 0 && errno != EINTR)
			break;
		pthread_mutex_lock(&ctx->ud_lock);
		if (!ctx->sidr_running) {
			pthread_mutex_unlock(&ctx->ud_lock);
			break;
		}
		for (int i = 0; i < n; i++) {
			struct iv_qp *qp = ev[i].data.ptr;
			struct rdma_cm_event *e;
			if (!qp)
				continue; /* the wake-up eventfd */
			while (rdma_get_cm_event(qp->ch->rch, &e) == 0) {
				struct rdma_cm_id *id = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ? e->id : NULL;
				rdma_ack_cm_event(e);
				if (!id)
					continue;
				struct rdma_conn_param cp = {.qp_num = qp->qp->qp_num};
				if (rdma_accept(id, &cp))
					DG_WARN("ibverbs: answering an address resolution for UD QP %u: %s", qp->qp->qp_num,
						strerror(errno));
				rdma_destroy_id(id);
			}
		}
		pthread_mutex_unlock(&ctx->ud_lock);
	}
	return NULL;
}

/* Starts the SIDR thread (first UD QP). Needs ctx->ud_lock. */
static int sidr_start(struct iv_ctx *ctx)
{
	if (ctx->sidr_running)
		return 0;
	ctx->sidr_ep = epoll_create1(EPOLL_CLOEXEC);
	ctx->sidr_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
	if (ctx->sidr_ep < 0 || ctx->sidr_efd < 0 || epoll_ctl(ctx->sidr_ep, EPOLL_CTL_ADD, ctx->sidr_efd, &e))
		goto fail;
	ctx->sidr_running = true;
	int r = pthread_create(&ctx->sidr_thr, NULL, sidr_main, ctx);
	if (r) {
		ctx->sidr_running = false;
		errno = r;
		goto fail;
	}
	return 0;
fail:;
	int err = -errno;
	if (ctx->sidr_ep >= 0)
		close(ctx->sidr_ep);
	if (ctx->sidr_efd >= 0)
		close(ctx->sidr_efd);
	ctx->sidr_ep = ctx->sidr_efd = -1;
	return err;
}

void iv_ud_close(struct iv_ctx *ctx)
{
	pthread_mutex_lock(&ctx->ud_lock);
	bool running = ctx->sidr_running;
	ctx->sidr_running = false;
	pthread_mutex_unlock(&ctx->ud_lock);
	if (!running)
		return;
	uint64_t one = 1;
	if (write(ctx->sidr_efd, &one, sizeof one) != sizeof one)
		DG_WARN("ibverbs: waking the SIDR thread: %s", strerror(errno));
	pthread_join(ctx->sidr_thr, NULL);
	close(ctx->sidr_ep);
	close(ctx->sidr_efd);
}

/* ---------------------------------------------------------------- QPs */

static uint32_t mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256: return 256;
	case IBV_MTU_512: return 512;
	case IBV_MTU_1024: return 1024;
	case IBV_MTU_2048: return 2048;
	default: return 4096;
	}
}

int iv_ud_create_qp(struct dgv_pd *pb, const struct dgv_qp_init_attr *attr, struct dgv_qp **out)
{
	struct iv_ctx *ctx = to_ictx(pb->ctx);
	struct iv_pd *pd = to_ipd(pb);
	char a[64];
	if (ctx->iwarp) {
		DG_WARN("ibverbs: %s is an iWARP device: no UD queue pairs (datagram sockets stay on soft)", ctx->dev);
		return -EOPNOTSUPP;
	}
	if (attr->use_adopt_fd) {
		DG_WARN("ibverbs: a UD QP on a device cannot adopt a UDP socket");
		return -EOPNOTSUPP;
	}
	union dgv_sockaddr bind;
	memset(&bind, 0, sizeof bind);
	if (attr->bind_addr)
		memcpy(&bind, attr->bind_addr, attr->bind_len < sizeof bind ? attr->bind_len : sizeof bind);
	else if (ctx->have_addr)
		bind = ctx->addr;
	else {
		DG_WARN("ibverbs: a UD QP needs a local address (bind_addr) to be reached by");
		return -EINVAL;
	}
	struct iv_chan *ch;
	int r = iv_chan_new(ctx, &ch);
	if (r)
		return r;
	struct iv_qp *qp = iv_qp_alloc(pd, attr, ch);
	if (!qp) {
		iv_chan_free(ch);
		return -ENOMEM;
	}
	qp->ud = true;
	qp->base.type = DGV_QPT_UD;
	atomic_store(&qp->state, DGV_QPS_IDLE);
	struct ibv_qp_init_attr ia;
	struct ibv_port_attr pa;
	memset(&ia, 0, sizeof ia);
	if (rdma_create_id(ch->rch, &qp->id, &qp->tag, RDMA_PS_UDP) || rdma_bind_addr(qp->id, &bind.sa)) {
		r = -errno;
		DG_INFO("ibverbs: UD QP on %s: %s", iv_addr_str(&bind.sa, a, sizeof a), strerror(-r));
		goto fail;
	}
	if (qp->id->verbs != ctx->verbs) {
		DG_WARN("ibverbs: %s is not an address of %s", iv_addr_str(&bind.sa, a, sizeof a), ctx->dev);
		r = -EADDRNOTAVAIL;
		goto fail;
	}
	if ((r = ibv_query_port(ctx->verbs, qp->id->port_num, &pa))) {
		r = -r;
		goto fail;
	}
	qp->ud_mtu = mtu_bytes(pa.active_mtu);
	qp->ud_port = ntohs(rdma_get_src_port(qp->id));
	ia.qp_type = IBV_QPT_UD;
	ia.send_cq = qp->scq->cq;
	ia.recv_cq = qp->rcq->cq;
	ia.cap.max_send_wr = attr->max_send_wr ? attr->max_send_wr : 256;
	ia.cap.max_recv_wr = attr->max_recv_wr ? attr->max_recv_wr : 256;
	uint32_t sge = attr->max_sge ? attr->max_sge : 4;
	if (sge > IV_UD_MAX_SGE)
		sge = IV_UD_MAX_SGE;
	if ((int)sge + 1 > ctx->dattr.max_sge)
		sge = (uint32_t)ctx->dattr.max_sge - 1;
	ia.cap.max_send_sge = sge;
	ia.cap.max_recv_sge = sge + 1; /* the GRH slot */
	ia.cap.max_inline_data = 64;
	if ((int)ia.cap.max_send_wr > ctx->dattr.max_qp_wr)
		ia.cap.max_send_wr = (uint32_t)ctx->dattr.max_qp_wr;
	if ((int)ia.cap.max_recv_wr > ctx->dattr.max_qp_wr)
		ia.cap.max_recv_wr = (uint32_t)ctx->dattr.max_qp_wr;
	ia.qp_context = qp;
	qp->qp = ibv_create_qp(pd->pd, &ia);
	if (!qp->qp) {
		ia.cap.max_inline_data = 0;
		qp->qp = ibv_create_qp(pd->pd, &ia);
	}
	if (!qp->qp) {
		r = -errno;
		DG_WARN("ibverbs: ibv_create_qp(UD) on %s: %s", ctx->dev, strerror(-r));
		goto fail;
	}
	/* RESET -> INIT -> RTR -> RTS; the Q_Key is rdma_cm's for its UDP port space, which is what
	 * SIDR hands to senders */
	struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = qp->id->port_num,
				 .qkey = RDMA_UDP_QKEY};
	if ((r = ibv_modify_qp(qp->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)))
		goto fail_mod;
	qa = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
	if ((r = ibv_modify_qp(qp->qp, &qa, IBV_QP_STATE)))
		goto fail_mod;
	qa = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 0};
	if ((r = ibv_modify_qp(qp->qp, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN)))
		goto fail_mod;
	qp->nsslots = ia.cap.max_send_wr;
	qp->nrslots = ia.cap.max_recv_wr;
	qp->max_sge = sge;
	qp->max_inline = ia.cap.max_inline_data;
	qp->sslots = calloc(qp->nsslots, sizeof *qp->sslots);
	qp->rslots = calloc(qp->nrslots, sizeof *qp->rslots);
	qp->grh = calloc(qp->nrslots, IV_GRH);
	if (!qp->sslots || !qp->rslots || !qp->grh ||
	    !(qp->grh_mr = ibv_reg_mr(pd->pd, qp->grh, (size_t)qp->nrslots * IV_GRH, IBV_ACCESS_LOCAL_WRITE))) {
		r = -ENOMEM;
		goto fail;
	}
	if (rdma_listen(qp->id, 64)) {
		r = -errno;
		goto fail;
	}
	if ((r = iv_cq_add_qp(qp->scq, qp)))
		goto fail;
	if (qp->rcq != qp->scq && (r = iv_cq_add_qp(qp->rcq, qp))) {
		iv_cq_del_qp(qp->scq, qp);
		goto fail;
	}
	pthread_mutex_lock(&ctx->ud_lock);
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = qp};
	r = sidr_start(ctx);
	if (!r && epoll_ctl(ctx->sidr_ep, EPOLL_CTL_ADD, ch->rch->fd, &e))
		r = -errno;
	pthread_mutex_unlock(&ctx->ud_lock);
	if (r) {
		iv_cq_del_qp(qp->scq, qp);
		if (qp->rcq != qp->scq)
			iv_cq_del_qp(qp->rcq, qp);
		goto fail;
	}
	pthread_mutex_lock(&pd->lock);
	pd->nqps++;
	pthread_mutex_unlock(&pd->lock);
	DG_INFO("ibverbs: UD QP %u on %s at %s (messages up to %u bytes)", qp->qp->qp_num, ctx->dev,
		iv_addr_str(rdma_get_local_addr(qp->id), a, sizeof a), qp->ud_mtu);
	*out = &qp->base;
	return 0;
fail_mod:
	r = -r;
	DG_WARN("ibverbs: UD QP state change on %s: %s", ctx->dev, strerror(-r));
fail:
	if (qp->grh_mr)
		ibv_dereg_mr(qp->grh_mr);
	qp->grh_mr = NULL;
	free(qp->grh);
	qp->grh = NULL;
	if (qp->qp)
		ibv_destroy_qp(qp->qp);
	if (qp->id)
		rdma_destroy_id(qp->id);
	iv_qp_free(qp);
	iv_chan_free(ch);
	return r ? r : -EIO;
}

void iv_ud_destroy(struct iv_qp *qp)
{
	struct iv_ctx *ctx = to_ictx(qp->base.ctx);
	/* out of the SIDR thread's sight first (it holds ud_lock while it looks at a QP) */
	pthread_mutex_lock(&ctx->ud_lock);
	epoll_ctl(ctx->sidr_ep, EPOLL_CTL_DEL, qp->ch->rch->fd, NULL);
	pthread_mutex_unlock(&ctx->ud_lock);
	iv_cq_del_qp(qp->scq, qp);
	if (qp->rcq != qp->scq)
		iv_cq_del_qp(qp->rcq, qp);
	ibv_destroy_qp(qp->qp);
	rdma_destroy_id(qp->id);
	qp->id = NULL;
	ibv_dereg_mr(qp->grh_mr);
	qp->grh_mr = NULL;
	free(qp->grh);
	qp->grh = NULL;
	iv_chan_free(qp->ch);
	pthread_mutex_lock(&qp->pd->lock);
	qp->pd->nqps--;
	pthread_mutex_unlock(&qp->pd->lock);
}

/* Fills w for a UD Send (qp.c build_send does the rest). 0 or -errno. */
int iv_ud_build(struct iv_qp *qp, const struct dgv_send_wr *wr, uint32_t len, struct ibv_send_wr *w)
{
	if (wr->opcode != DGV_WR_SEND && wr->opcode != DGV_WR_SEND_SE) {
		DG_WARN("ibverbs: only Send is implemented on a device's UD QP (opcode %d)", wr->opcode);
		return -EOPNOTSUPP;
	}
	if (!wr->ah || wr->ah->ctx != qp->base.ctx)
		return -EINVAL;
	if (len > qp->ud_mtu) {
		DG_INFO("ibverbs: %u-byte UD message on a %u-byte MTU: no segmentation on a device yet", len, qp->ud_mtu);
		return -EMSGSIZE;
	}
	struct iv_ah *ah = (struct iv_ah *)wr->ah;
	w->opcode = IBV_WR_SEND_WITH_IMM;
	w->imm_data = htobe32((uint32_t)qp->ud_port << 16);
	if (wr->opcode == DGV_WR_SEND_SE)
		w->send_flags |= IBV_SEND_SOLICITED;
	if (len && len <= qp->max_inline)
		w->send_flags |= IBV_SEND_INLINE;
	w->wr.ud.ah = ah->ah;
	w->wr.ud.remote_qpn = ah->qpn;
	w->wr.ud.remote_qkey = ah->qkey;
	return 0;
}

/* A successful UD receive: length without the GRH, source address from GRH and immediate. */
void iv_ud_recv(struct iv_qp *qp, const struct ibv_wc *w, uint64_t slot, struct dgv_wc *o)
{
	o->byte_len = w->byte_len >= IV_GRH ? w->byte_len - IV_GRH : 0;
	o->msn = ++qp->rx_msn;
	if (!(w->wc_flags & IBV_WC_GRH))
		return; /* no GRH (IB within a subnet): the source stays unknown */
	const uint8_t *grh = qp->grh + slot * IV_GRH;
	const uint8_t *sgid = grh + 8; /* GRH: 8 bytes, then SGID, DGID */
	uint16_t port = w->wc_flags & IBV_WC_WITH_IMM ? (uint16_t)(be32toh(w->imm_data) >> 16) : 0;
	static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (grh[0] >> 4 != 6 && grh[20] >> 4 == 4) {
		/* RoCE v2 over IPv4: the device leaves 20 bytes and puts the IPv4 header in the
		 * last 20 (source address at its byte 12) */
		o->src.sin.sin_family = AF_INET;
		memcpy(&o->src.sin.sin_addr, grh + 20 + 12, 4);
		o->src.sin.sin_port = htons(port);
		o->src_len = sizeof o->src.sin;
	} else if (!memcmp(sgid, v4mapped, sizeof v4mapped)) {
		o->src.sin.sin_family = AF_INET;
		memcpy(&o->src.sin.sin_addr, sgid + 12, 4);
		o->src.sin.sin_port = htons(port);
		o->src_len = sizeof o->src.sin;
	} else {
		o->src.sin6.sin6_family = AF_INET6;
		memcpy(&o->src.sin6.sin6_addr, sgid, 16);
		o->src.sin6.sin6_port = htons(port);
		o->src_len = sizeof o->src.sin6;
	}
}

/* ---------------------------------------------------------------- address handles */

/* The next event on a private channel, copied out (UD parameters included). */
static int next_event(struct rdma_event_channel *rch, int timeout_ms, struct rdma_cm_event *copy)
{
	struct pollfd p = {.fd = rch->fd, .events = POLLIN};
	struct rdma_cm_event *e;
	int r = poll(&p, 1, timeout_ms);
	if (r == 0)
		return -ETIMEDOUT;
	if (r < 0)
		return -errno;
	if (rdma_get_cm_event(rch, &e))
		return -errno;
	*copy = *e;
	rdma_ack_cm_event(e);
	return 0;
}

int iv_create_ah(struct dgv_pd *pb, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out)
{
	struct iv_ctx *ctx = to_ictx(pb->ctx);
	struct rdma_event_channel *rch = NULL;
	struct rdma_cm_id *id = NULL;
	struct rdma_cm_event ev;
	char a[64];
	int r;
	if (ctx->iwarp) {
		DG_WARN("ibverbs: %s is an iWARP device: no UD address handles", ctx->dev);
		return -EOPNOTSUPP;
	}
	struct iv_ah *ah = calloc(1, sizeof *ah);
	if (!ah)
		return -ENOMEM;
	if (!(rch = rdma_create_event_channel()) || rdma_create_id(rch, &id, NULL, RDMA_PS_UDP) ||
	    rdma_resolve_addr(id, ctx->have_addr ? &ctx->addr.sa : NULL, (struct sockaddr *)addr, 2000)) {
		r = -errno;
		goto out;
	}
	if ((r = next_event(rch, 3000, &ev)) || ev.event != RDMA_CM_EVENT_ADDR_RESOLVED) {
		r = r ? r : -EHOSTUNREACH;
		goto out;
	}
	if (id->verbs != ctx->verbs) {
		DG_WARN("ibverbs: %s is reached through %s, not %s", iv_addr_str(addr, a, sizeof a),
			id->verbs ? ibv_get_device_name(id->verbs->device) : "no RDMA device", ctx->dev);
		r = -ENODEV;
		goto out;
	}
	if (rdma_resolve_route(id, 2000)) {
		r = -errno;
		goto out;
	}
	if ((r = next_event(rch, 3000, &ev)) || ev.event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
		r = r ? r : -EHOSTUNREACH;
		goto out;
	}
	/* SIDR: who is the UD QP at this address (QP number and Q_Key, and the AH attributes) */
	struct rdma_conn_param cp = {0};
	if (rdma_connect(id, &cp)) {
		r = -errno;
		goto out;
	}
	if ((r = next_event(rch, 3000, &ev)))
		goto out;
	if (ev.event != RDMA_CM_EVENT_ESTABLISHED) {
		DG_INFO("ibverbs: no UD QP at %s (%s, status %d)", iv_addr_str(addr, a, sizeof a), rdma_event_str(ev.event),
			ev.status);
		r = -ECONNREFUSED;
		goto out;
	}
	ah->ah = ibv_create_ah(to_ipd(pb)->pd, &ev.param.ud.ah_attr);
	if (!ah->ah) {
		r = -errno;
		goto out;
	}
	ah->qpn = ev.param.ud.qp_num;
	ah->qkey = ev.param.ud.qkey;
	ah->base.ctx = pb->ctx;
	memcpy(&ah->base.addr, addr, len < sizeof ah->base.addr ? len : sizeof ah->base.addr);
	ah->base.addrlen = len;
	DG_DBG("ibverbs: AH to %s: QP %u, Q_Key %#x", iv_addr_str(addr, a, sizeof a), ah->qpn, ah->qkey);
	*out = &ah->base;
	r = 0;
out:
	if (r) {
		DG_INFO("ibverbs: address handle to %s: %s", iv_addr_str(addr, a, sizeof a), strerror(-r));
		free(ah);
	}
	if (id)
		rdma_destroy_id(id);
	if (rch)
		rdma_destroy_event_channel(rch);
	return r;
}

int iv_destroy_ah(struct dgv_ah *b)
{
	struct iv_ah *ah = (struct iv_ah *)b;
	int r = ibv_destroy_ah(ah->ah);
	if (r)
		return -r;
	free(ah);
	return 0;
}
