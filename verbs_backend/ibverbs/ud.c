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
 * Data path. Every UD datagram starts with a 28-byte placement header (wire.h struct iv_udh,
 * big-endian: magic 0xD6, opcode, the sender's port, message number, message length, this
 * segment's offset, and for a Write-Record or Write the target STag and address), because a device
 * carries UD messages of one MTU and a completion names its sender only by GID and QP number.
 * Messages up to 64 KiB are cut into MTU-sized segments (header + the next piece of the
 * program's buffers, read in place). The receiver posts its own pool of MTU-sized buffers
 * (UD has no receiver-not-ready: a segment that finds no buffer is lost) and does in software
 * what the soft provider does: a Send is copied into the program's oldest receive at its
 * offset and completes when whole; a Write-Record is checked (STag, rights, bounds) and
 * copied into the region, consumes no receive and completes with its record, or as
 * DGV_WC_PARTIAL with the ranges that arrived when the rest does not come within 20 ms; an
 * RDMA Write is placed the same way and completes nothing at the target. The
 * source address is the IP from the GRH (RoCE v2 over IPv4: the IPv4 header in the GRH area's
 * last 20 bytes; otherwise the source GID) and the header's port. One copy per byte on
 * receive, as on the soft provider; none on send.
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
	dgv_thread_started();
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

static uint32_t clamp_u32(uint32_t v, uint32_t lo, uint32_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Hands pool buffer i to the device. */
static int pool_post(struct iv_qp *qp, uint32_t i)
{
	struct iv_ud *u = qp->u;
	struct ibv_sge sge = {(uintptr_t)(u->pool + (size_t)i * u->bufsz), u->bufsz, u->pool_mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = (1ull << 63) | i, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(qp->qp, &wr, &bad);
}

static void ud_free(struct iv_ud *u)
{
	if (!u)
		return;
	if (u->pool_mr)
		ibv_dereg_mr(u->pool_mr);
	if (u->hdr_mr)
		ibv_dereg_mr(u->hdr_mr);
	free(u->pool);
	free(u->hdr);
	free(u->ar);
	free(u);
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
	if (attr->bind_addr) {
		memcpy(&bind, attr->bind_addr, attr->bind_len < sizeof bind ? attr->bind_len : sizeof bind);
		/* a wildcard address names no device: it is this context's address, on the port asked
		 * for (the shim binds a UDP socket's port, which peers resolve by SIDR) */
		bool any = bind.sa.sa_family == AF_INET ? bind.sin.sin_addr.s_addr == htonl(INADDR_ANY)
			   : IN6_IS_ADDR_UNSPECIFIED(&bind.sin6.sin6_addr);
		if (any && ctx->have_addr && ctx->addr.sa.sa_family == bind.sa.sa_family) {
			in_port_t port = bind.sa.sa_family == AF_INET ? bind.sin.sin_port : bind.sin6.sin6_port;
			bind = ctx->addr;
			if (bind.sa.sa_family == AF_INET)
				bind.sin.sin_port = port;
			else
				bind.sin6.sin6_port = port;
		}
	} else if (ctx->have_addr)
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
	struct iv_ud *u = calloc(1, sizeof *u);
	if (!qp || !u) {
		free(u);
		if (qp)
			iv_qp_free(qp);
		iv_chan_free(ch);
		return -ENOMEM;
	}
	qp->ud = true;
	qp->u = u;
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
	u->mtu = mtu_bytes(pa.active_mtu);
	u->payload = u->mtu - (uint32_t)sizeof(struct iv_udh);
	u->bufsz = IV_GRH + u->mtu;
	u->port = ntohs(rdma_get_src_port(qp->id));
	uint32_t sge = attr->max_sge ? attr->max_sge : 4;
	if (sge > IV_UD_MAX_SGE)
		sge = IV_UD_MAX_SGE;
	if ((int)sge + 1 > ctx->dattr.max_sge)
		sge = (uint32_t)ctx->dattr.max_sge - 1;
	uint32_t swr = attr->max_send_wr ? attr->max_send_wr : 256, rwr = attr->max_recv_wr ? attr->max_recv_wr : 256;
	uint32_t maxwr = (uint32_t)ctx->dattr.max_qp_wr;
	/* A message is up to IV_UD_MAX_MSG in segments of one MTU each: the send queue holds a few
	 * whole large messages; the receive pool absorbs bursts between two polls (UD has no
	 * receiver-not-ready: a segment that finds no buffer is dropped by the device). */
	uint32_t segs = (IV_UD_MAX_MSG + u->payload - 1) / u->payload;
	ia.qp_type = IBV_QPT_UD;
	ia.send_cq = qp->scq->cq;
	ia.recv_cq = qp->rcq->cq;
	ia.cap.max_send_wr = clamp_u32(swr * 4 > segs * 8 ? swr * 4 : segs * 8, 64, maxwr < 16384 ? maxwr : 16384);
	ia.cap.max_recv_wr = u->npool = clamp_u32(rwr * 4, 256, maxwr < 4096 ? maxwr : 4096);
	ia.cap.max_send_sge = sge + 1; /* the header, then pieces of the program's buffers */
	ia.cap.max_recv_sge = 1;
	ia.qp_context = qp;
	qp->qp = ibv_create_qp(pd->pd, &ia);
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
	qp->nrslots = u->npool;
	qp->max_sge = sge;
	u->ar_cap = rwr;
	qp->sslots = calloc(qp->nsslots, sizeof *qp->sslots);
	qp->rslots = calloc(1, sizeof *qp->rslots);
	u->ar = calloc(u->ar_cap, sizeof *u->ar);
	u->hdr = calloc(qp->nsslots, sizeof *u->hdr);
	u->pool = calloc(u->npool, u->bufsz);
	if (!qp->sslots || !qp->rslots || !u->ar || !u->hdr || !u->pool ||
	    !(u->hdr_mr = ibv_reg_mr(pd->pd, u->hdr, qp->nsslots * sizeof *u->hdr, IBV_ACCESS_LOCAL_WRITE)) ||
	    !(u->pool_mr = ibv_reg_mr(pd->pd, u->pool, (size_t)u->npool * u->bufsz, IBV_ACCESS_LOCAL_WRITE))) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < u->npool; i++)
		if ((r = pool_post(qp, i))) {
			r = -r;
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
	DG_INFO("ibverbs: UD QP %u on %s at %s (MTU %u: messages up to %u bytes in %u-byte segments)",
		qp->qp->qp_num, ctx->dev, iv_addr_str(rdma_get_local_addr(qp->id), a, sizeof a), u->mtu, IV_UD_MAX_MSG,
		u->payload);
	*out = &qp->base;
	return 0;
fail_mod:
	r = -r;
	DG_WARN("ibverbs: UD QP state change on %s: %s", ctx->dev, strerror(-r));
fail:
	if (qp->qp)
		ibv_destroy_qp(qp->qp);
	ud_free(u);
	qp->u = NULL;
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
	ud_free(qp->u);
	qp->u = NULL;
	iv_chan_free(qp->ch);
	pthread_mutex_lock(&qp->pd->lock);
	qp->pd->nqps--;
	pthread_mutex_unlock(&qp->pd->lock);
}

/* ---------------------------------------------------------------- send */

/*
 * One message: ceil(len / payload) Sends (at least one), each the 28-byte header from the
 * QP's registered header array and the next piece of the program's buffers, which the device
 * reads in place (no copy). Only the last segment's completion is delivered, and only if the
 * program asked. A message the send queue cannot take whole is refused (-ENOMEM) before any
 * of it is posted. Needs qp->lock.
 */
static int ud_post_one(struct iv_qp *qp, const struct dgv_send_wr *wr)
{
	enum { B = 16 };
	struct iv_ud *u = qp->u;
	uint32_t len = 0;
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list))
		return -EINVAL;
	for (int i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	uint8_t op;
	switch (wr->opcode) {
	case DGV_WR_SEND: op = 0; break;
	case DGV_WR_SEND_SE: op = 1; break;
	case DGV_WR_WRITE_RECORD: op = 2; break;
	case DGV_WR_WRITE: op = 3; break;
	default:
		DG_WARN("ibverbs: opcode %d is not implemented on a device's UD QP (Send, Send with SE, "
			"Write-Record, Write are)", wr->opcode);
		return -EOPNOTSUPP;
	}
	if (!wr->ah || wr->ah->ctx != qp->base.ctx)
		return -EINVAL;
	if (len > IV_UD_MAX_MSG)
		return -EMSGSIZE;
	uint32_t nseg = len ? (len + u->payload - 1) / u->payload : 1;
	uint64_t inflight = qp->shead - __atomic_load_n(&qp->sdone, __ATOMIC_ACQUIRE);
	if (inflight + nseg > qp->nsslots)
		return -ENOMEM;
	struct iv_ah *ah = (struct iv_ah *)wr->ah;
	uint32_t msn = ++u->tx_msn;
	struct ibv_send_wr iw[B], *ibad;
	struct ibv_sge sg[B][IV_UD_MAX_SGE + 1];
	int si = 0;          /* the program's SGE the next piece starts in */
	uint32_t so = 0;     /* and the offset in it */
	for (uint32_t seg = 0; seg < nseg;) {
		int n = 0;
		for (; seg < nseg && n < B; seg++, n++) {
			uint64_t slot = qp->shead + (uint64_t)n;
			uint32_t off = seg * u->payload, left = len - off < u->payload ? len - off : u->payload;
			struct iv_udh *h = &u->hdr[slot % qp->nsslots];
			*h = (struct iv_udh){.magic = IV_UDH_MAGIC, .op = op, .port = htons(u->port), .msn = htonl(msn),
					     .total = htonl(len), .offset = htonl(off), .stag = htonl(wr->rkey),
					     .to_hi = htonl((uint32_t)(wr->remote_addr >> 32)),
					     .to_lo = htonl((uint32_t)wr->remote_addr)};
			sg[n][0] = (struct ibv_sge){(uintptr_t)h, sizeof *h, u->hdr_mr->lkey};
			int k = 1;
			while (left) {
				const struct dgv_sge *g = &wr->sg_list[si];
				uint32_t take = g->length - so < left ? g->length - so : left;
				if (take)
					sg[n][k++] = (struct ibv_sge){g->addr + so, take, g->lkey};
				so += take;
				left -= take;
				if (so == g->length) {
					si++;
					so = 0;
				}
			}
			bool last = seg == nseg - 1;
			iw[n] = (struct ibv_send_wr){.wr_id = slot, .next = &iw[n + 1], .sg_list = sg[n], .num_sge = k,
						     .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
			if (last && op == 1)
				iw[n].send_flags |= IBV_SEND_SOLICITED;
			iw[n].wr.ud.ah = ah->ah;
			iw[n].wr.ud.remote_qpn = ah->qpn;
			iw[n].wr.ud.remote_qkey = ah->qkey;
			qp->sslots[slot % qp->nsslots] = (struct iv_swr){
				.wr_id = wr->wr_id, .len = len,
				.opcode = op == 2 ? DGV_WC_WRITE_RECORD : op == 3 ? DGV_WC_WRITE : DGV_WC_SEND,
				.deliver = last && (wr->send_flags & DGV_SEND_SIGNALED)};
		}
		iw[n - 1].next = NULL;
		int r = ibv_post_send(qp->qp, iw, &ibad);
		if (r) {
			/* part of the message may be out: the target drops it when it times out */
			qp->shead += (uint64_t)(ibad - iw);
			return -r;
		}
		qp->shead += (uint64_t)n;
	}
	return 0;
}

int iv_ud_post_send(struct iv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	for (; wr; wr = wr->next) {
		int r = ud_post_one(qp, wr);
		if (r) {
			*bad = wr;
			return r;
		}
	}
	return 0;
}

int iv_ud_post_recv(struct iv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad)
{
	struct iv_ud *u = qp->u;
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || u->ar_n == u->ar_cap) {
			*bad = wr;
			return u->ar_n == u->ar_cap ? -ENOMEM : -EINVAL;
		}
		struct iv_arecv *a = &u->ar[(u->ar_head + u->ar_n++) % u->ar_cap];
		a->wr_id = wr->wr_id;
		a->num_sge = wr->num_sge;
		if (wr->num_sge)
			memcpy(a->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *a->sge);
	}
	return 0;
}

/* ---------------------------------------------------------------- receive */

/* The sender's address: IP from the GRH slot, port from the header. */
static void ud_src(const uint8_t *grh, uint16_t port, bool have_grh, struct dgv_wc *o)
{
	static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	const uint8_t *sgid = grh + 8; /* GRH: 8 bytes, then SGID, DGID */
	if (!have_grh)
		return; /* no GRH (IB within a subnet): the source stays unknown */
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

/* Copies n bytes to offset off of a receive's pieces; false when they do not fit. */
static bool scatter(const struct iv_arecv *a, uint32_t off, const uint8_t *p, uint32_t n)
{
	for (int i = 0; i < a->num_sge && n; i++) {
		uint32_t l = a->sge[i].length;
		if (off >= l) {
			off -= l;
			continue;
		}
		uint32_t take = l - off < n ? l - off : n;
		memcpy((void *)(uintptr_t)(a->sge[i].addr + off), p, take);
		p += take;
		n -= take;
		off = 0;
	}
	return n == 0;
}

static uint32_t recv_room(const struct iv_arecv *a)
{
	uint32_t t = 0;
	for (int i = 0; i < a->num_sge; i++)
		t += a->sge[i].length;
	return t;
}

/*
 * Places a Write-Record segment: the STag must name a remotely writable region of the QP's PD
 * that holds [to, to + total) (checked for every segment, under the PD's lock, so a region
 * cannot be deregistered in the middle of a copy: dgv_dereg_mr takes the same lock).
 */
static bool place(struct iv_pd *pd, uint32_t stag, uint64_t to, uint32_t total, uint32_t off, const uint8_t *p,
		  uint32_t n)
{
	bool ok = false;
	pthread_mutex_lock(&pd->lock);
	for (unsigned b = 0; b < IV_MR_BUCKETS && !ok; b++)
		for (struct iv_mr *m = pd->mrs[b]; m; m = m->next) {
			if (m->pub.rkey != stag)
				continue;
			uint64_t lo = (uintptr_t)m->pub.addr, hi = lo + m->pub.length;
			if ((m->pub.access & DGV_ACCESS_REMOTE_WRITE) && to >= lo && to + total <= hi && to + total >= to) {
				memcpy((void *)(uintptr_t)(to + off), p, n);
				ok = true;
			}
			break;
		}
	pthread_mutex_unlock(&pd->lock);
	return ok;
}

static void reasm_release(struct iv_qp *qp, struct iv_reasm *re)
{
	if (re->have_recv) {
		/* an unfinished Send gives its receive back, first in line (nothing was reported) */
		struct iv_ud *u = qp->u;
		u->ar_head = (u->ar_head + u->ar_cap - 1) % u->ar_cap;
		u->ar[u->ar_head] = re->rcv;
		u->ar_n++;
	}
	re->used = false;
	qp->u->nactive--;
}

/* The ranges of a partial message, from its segment bitmap. */
static uint32_t reasm_ranges(const struct iv_reasm *re, uint32_t payload, struct dgv_range *r, uint32_t maxr)
{
	uint32_t n = 0;
	for (uint32_t s = 0; s < re->nseg && n < maxr;) {
		if (!(re->bits[s / 64] >> (s % 64) & 1)) {
			s++;
			continue;
		}
		uint32_t e = s;
		while (e < re->nseg && re->bits[e / 64] >> (e % 64) & 1)
			e++;
		uint32_t end = e * payload < re->total ? e * payload : re->total;
		r[n++] = (struct dgv_range){s * payload, end - s * payload};
		s = e;
	}
	return n;
}

/*
 * One device receive on a UD QP (qp.c convert, under the CQ's lock): checks the header, places
 * the segment (a Send into the program's oldest receive, a Write-Record into its region),
 * reposts the pool buffer, and reports a completion when a message is whole. A Write-Record
 * consumes no receive, as on the soft provider. One function (~150 lines) on purpose: every
 * step reads the same header and pool buffer, and it can be checked only on a device (the VM
 * bed), so it was left whole when the soft RC path was split into handlers.
 */
bool iv_ud_recv(struct iv_qp *qp, const struct ibv_wc *w, struct dgv_wc *o, struct dgv_range *range)
{
	struct iv_ud *u = qp->u;
	uint32_t idx = (uint32_t)(w->wr_id & ~(1ull << 63));
	if (w->status != IBV_WC_SUCCESS || idx >= u->npool)
		return false; /* flushed at destruction */
	const uint8_t *buf = u->pool + (size_t)idx * u->bufsz;
	struct iv_udh h;
	bool out = false;
	uint32_t plen = w->byte_len >= IV_GRH + sizeof h ? w->byte_len - IV_GRH - (uint32_t)sizeof h : 0;
	memcpy(&h, buf + IV_GRH, sizeof h);
	uint32_t total = ntohl(h.total), off = ntohl(h.offset), msn = ntohl(h.msn), stag = ntohl(h.stag);
	uint64_t to = (uint64_t)ntohl(h.to_hi) << 32 | ntohl(h.to_lo);
	const uint8_t *p = buf + IV_GRH + sizeof h;
	pthread_mutex_lock(&qp->lock);
	if (w->byte_len < IV_GRH + sizeof h || h.magic != IV_UDH_MAGIC || h.op > 3 || total > IV_UD_MAX_MSG ||
	    off % u->payload || off + plen > total || (plen != u->payload && off + plen != total)) {
		qp->st.malformed_drops++;
		goto done;
	}
	qp->st.rx_datagrams++;
	qp->st.rx_bytes += plen;
	memset(o, 0, sizeof *o);
	o->qp = &qp->base;
	o->msn = msn;
	ud_src(buf, ntohs(h.port), w->wc_flags & IBV_WC_GRH, o);
	bool tagged = h.op >= 2, wrec = h.op == 2; /* Write-Record, or Write (no target completion) */
	if (off == 0 && plen == total) {
		/* a whole message in one datagram: no reassembly */
		if (tagged) {
			if (!place(qp->pd, stag, to, total, 0, p, plen)) {
				qp->st.placement_rejects++;
				goto done;
			}
			if (!wrec)
				goto done;
			o->opcode = DGV_WC_RECV_WRITE_RECORD;
			o->byte_len = total;
			*range = (struct dgv_range){0, total};
			o->record = (struct dgv_record){.stag = stag, .base = to, .length = total, .valid_bytes = total,
							.nranges = 1, .ranges = range};
		} else {
			if (!u->ar_n) {
				qp->st.no_wqe_drops++;
				goto done;
			}
			struct iv_arecv *a = &u->ar[u->ar_head];
			u->ar_head = (u->ar_head + 1) % u->ar_cap;
			u->ar_n--;
			o->wr_id = a->wr_id;
			o->opcode = DGV_WC_RECV;
			o->byte_len = total;
			if (h.op == 1)
				o->flags |= DGV_WC_SOLICITED;
			if (!scatter(a, 0, p, plen))
				o->status = DGV_WC_LOC_LEN_ERR;
		}
		qp->st.rx_msgs++;
		out = true;
		goto done;
	}
	/* a segment: find its message by sender and number */
	struct iv_reasm *re = NULL, *freeone = NULL, *oldest = NULL;
	for (int i = 0; i < IV_UD_REASM; i++) {
		struct iv_reasm *x = &u->re[i];
		if (!x->used) {
			if (!freeone)
				freeone = x;
			continue;
		}
		if (x->msn == msn && dgv_addr_eq(&x->src, &o->src)) {
			re = x;
			break;
		}
		if (!oldest || x->last_ms < oldest->last_ms)
			oldest = x;
	}
	uint64_t now = iv_now_ms();
	if (!re) {
		if (!freeone) {
			/* all busy: the one that waited longest gives way (UD may lose it anyway) */
			qp->st.reasm_timeouts++;
			reasm_release(qp, oldest);
			freeone = oldest;
		}
		re = freeone;
		memset(re, 0, sizeof *re);
		re->used = true;
		re->wr = tagged;
		re->op = h.op;
		re->src = o->src;
		re->src_len = o->src_len;
		re->msn = msn;
		re->total = total;
		re->nseg = (total + u->payload - 1) / u->payload;
		re->stag = stag;
		re->to = to;
		u->nactive++;
		if (!tagged) {
			if (!u->ar_n || recv_room(&u->ar[u->ar_head]) < total) {
				/* no receive, or too small: the message is dropped, its segments too */
				qp->st.no_wqe_drops++;
				re->have_recv = false;
			} else {
				re->rcv = u->ar[u->ar_head];
				u->ar_head = (u->ar_head + 1) % u->ar_cap;
				u->ar_n--;
				re->have_recv = true;
			}
		}
	}
	re->last_ms = now;
	uint32_t s = off / u->payload;
	if (re->total != total || re->wr != tagged || re->op != h.op || s >= re->nseg) {
		qp->st.malformed_drops++;
		goto done;
	}
	if (re->bits[s / 64] >> (s % 64) & 1) {
		qp->st.dup_drops++;
		goto done;
	}
	if (tagged ? !place(qp->pd, stag, to, total, off, p, plen) : re->have_recv && !scatter(&re->rcv, off, p, plen)) {
		qp->st.placement_rejects++;
		goto done;
	}
	re->bits[s / 64] |= 1ull << (s % 64);
	re->got += plen;
	if (re->got < total)
		goto done;
	/* whole */
	if (wrec) {
		o->opcode = DGV_WC_RECV_WRITE_RECORD;
		o->byte_len = total;
		*range = (struct dgv_range){0, total};
		o->record = (struct dgv_record){.stag = stag, .base = to, .length = total, .valid_bytes = total,
						.nranges = 1, .ranges = range};
		out = true;
	} else if (re->have_recv) {
		o->wr_id = re->rcv.wr_id;
		o->opcode = DGV_WC_RECV;
		o->byte_len = total;
		if (re->op == 1)
			o->flags |= DGV_WC_SOLICITED;
		out = true;
	}
	if (out)
		qp->st.rx_msgs++;
	re->have_recv = false;
	reasm_release(qp, re);
done:
	pthread_mutex_unlock(&qp->lock);
	if (pool_post(qp, idx))
		DG_WARN("ibverbs: reposting a UD receive buffer failed");
	return out;
}

/*
 * Messages that stopped arriving (reasm timeout, 20 ms as on the soft provider): a Send is
 * dropped and its receive given back; a Write-Record completes as DGV_WC_PARTIAL with the
 * byte ranges that did arrive (paper 000's record). At most one completion per call.
 */
bool iv_ud_expire(struct iv_qp *qp, struct dgv_wc *o, struct dgv_range *ranges, uint32_t maxr)
{
	struct iv_ud *u = qp->u;
	uint64_t now = iv_now_ms();
	bool out = false;
	pthread_mutex_lock(&qp->lock);
	for (int i = 0; i < IV_UD_REASM && !out; i++) {
		struct iv_reasm *re = &u->re[i];
		if (!re->used || now - re->last_ms < 20)
			continue;
		qp->st.reasm_timeouts++;
		if (re->wr && re->op == 2 && re->got) { /* a Write has no target completion, whole or not */
			memset(o, 0, sizeof *o);
			o->qp = &qp->base;
			o->status = DGV_WC_PARTIAL;
			o->opcode = DGV_WC_RECV_WRITE_RECORD;
			o->msn = re->msn;
			o->src = re->src;
			o->src_len = re->src_len;
			o->byte_len = re->got;
			o->record = (struct dgv_record){.stag = re->stag, .base = re->to, .length = re->total,
							.valid_bytes = re->got, .ranges = ranges};
			o->record.nranges = reasm_ranges(re, u->payload, ranges, maxr);
			out = true;
		}
		reasm_release(qp, re);
	}
	pthread_mutex_unlock(&qp->lock);
	return out;
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
