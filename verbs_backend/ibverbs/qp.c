/*
 * qp.c - the ibverbs provider's RC queue pairs, work requests, completions and connection
 * management through librdmacm.
 *
 * Connections. dgv_connect resolves the address and the route synchronously on a private
 * event channel (bounded, 2 s each: on a local network that is one ARP or neighbour lookup),
 * because the QP must exist on the right device before dgv_connect returns (the caller may
 * post receives at once), then moves the id to the caller's channel; rdma_connect is deferred
 * like rdma_accept below; the outcome comes as an event like the soft provider's. dgv_accept creates the QP and
 * defers rdma_accept to the caller's next call into the provider (a CM or CQ call, or a send),
 * so receives posted right after dgv_accept are there before the peer can send: an iWARP
 * device (no RNR retry) ends the connection on a Send that finds no receive.
 *
 * Events. A channel is an rdma_event_channel plus a queue of translated events: one rdma_cm
 * event may give none (TIMEWAIT_EXIT) or one dgv event, and a dgv_disconnect after the peer's
 * gives a DISCONNECTED nobody else reports. The channel's fd is an epoll set of the rdma_cm fd
 * and an eventfd that is readable while the queue holds events (or a deferred accept waits).
 *
 * Private data. InfiniBand CM pads private data (a REQ always carries 56 bytes), so on IB and
 * RoCE ours is prefixed with 4 bytes, 'd' 'g' and the length (big-endian), and the receiver
 * strips them; data without the prefix (a foreign peer) is handed up padded as it came.
 * iWARP (MPA) carries the exact length, so nothing is added there, except that a reject with no
 * private data sends the bare prefix: iWARP reports a refused TCP connection and an MPA
 * reject alike (-ECONNREFUSED), and only a reject carries private data.
 *
 * Write-Record on RC (docs/design.md, "The ibverbs provider"). The target consumes a posted
 * receive either way (wr_id is that receive's; the soft provider consumes none and reports 0)
 * and reports DGV_WC_RECV_WRITE_RECORD with the record a reliable transport gives: the region's
 * STag, the base address, the length, all bytes valid, one range.
 *  - InfiniBand/RoCE: RDMA Write with Immediate. The immediate is the low 32 bits of the
 *    target address (network byte order, as ibv_send_wr.imm_data); the target finds the
 *    remotely writable region of the QP's PD that holds [address, address + byte_len).
 *  - iWARP has no immediate data: an unsignaled RDMA Write, then a Send of a 24-byte
 *    descriptor (struct iv_wrec: "dgWRrec1", base, length, STag, big-endian) from a registered
 *    per-QP array; RC keeps the order, so the data is placed when the Send arrives. The target
 *    recognises a 24-byte receive that starts with the magic (in the receive's first piece) and
 *    reports the record from it. A program's own 24-byte Send starting with "dgWRrec1" would be
 *    taken for one: the price of a device without immediate data.
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

#define RECV_BIT (1ull << 63) /* device wr_id of a receive: slot counter | RECV_BIT */
#define PD_MAGIC0 'd'
#define PD_MAGIC1 'g'
#define IB_REQ_PDATA 56        /* rdma_cm's room in an IB CM REQ (RDMA_PS_TCP) */
#define IB_REP_PDATA 196
#define IB_REJ_PDATA 148

/* ---------------------------------------------------------------- private data */

/* Our private data as it goes on the wire into buf; returns its length or -EINVAL. */
static int pdata_put(struct iv_ctx *ctx, const void *p, uint16_t len, uint8_t *buf, int room, bool reject)
{
	if (ctx->iwarp && !(reject && !len)) {
		if (len > room)
			return -EINVAL;
		if (len)
			memcpy(buf, p, len);
		return len;
	}
	if (len + 4 > room)
		return -EINVAL;
	buf[0] = PD_MAGIC0;
	buf[1] = PD_MAGIC1;
	buf[2] = (uint8_t)(len >> 8);
	buf[3] = (uint8_t)len;
	if (len)
		memcpy(buf + 4, p, len);
	return len + 4;
}

static void pdata_get(const void *p, uint8_t len, struct dgv_cm_event *ev)
{
	const uint8_t *b = p;
	ev->pdata_len = 0;
	if (!p || !len)
		return;
	if (len >= 4 && b[0] == PD_MAGIC0 && b[1] == PD_MAGIC1 && ((b[2] << 8) | b[3]) <= len - 4) {
		ev->pdata_len = (uint16_t)((b[2] << 8) | b[3]);
		memcpy(ev->pdata, b + 4, ev->pdata_len);
		return;
	}
	ev->pdata_len = len;
	memcpy(ev->pdata, b, len);
}

/* ---------------------------------------------------------------- channels */

static void chan_efd_sync(struct iv_chan *ch, bool want)
{
	uint64_t v = 1;
	if (want && !ch->efd_set) {
		if (write(ch->efd, &v, sizeof v) == sizeof v)
			ch->efd_set = true;
	} else if (!want && ch->efd_set) {
		if (read(ch->efd, &v, sizeof v) == sizeof v)
			ch->efd_set = false;
	}
}

int iv_chan_new(struct iv_ctx *ctx, struct iv_chan **out)
{
	struct iv_chan *ch = calloc(1, sizeof *ch);
	if (!ch)
		return -ENOMEM;
	ch->base.ctx = &ctx->base;
	ch->efd = ch->epfd = -1;
	ch->rch = rdma_create_event_channel();
	if (!ch->rch)
		goto fail;
	int fl = fcntl(ch->rch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->rch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		goto fail;
	ch->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ch->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ch->efd < 0 || ch->epfd < 0)
		goto fail;
	struct epoll_event e = {.events = EPOLLIN};
	if (epoll_ctl(ch->epfd, EPOLL_CTL_ADD, ch->rch->fd, &e) || epoll_ctl(ch->epfd, EPOLL_CTL_ADD, ch->efd, &e))
		goto fail;
	pthread_mutex_init(&ch->lock, NULL);
	*out = ch;
	return 0;
fail:;
	int err = errno ? -errno : -ENOMEM;
	if (ch->efd >= 0)
		close(ch->efd);
	if (ch->epfd >= 0)
		close(ch->epfd);
	if (ch->rch)
		rdma_destroy_event_channel(ch->rch);
	free(ch);
	return err;
}

void iv_chan_free(struct iv_chan *ch)
{
	close(ch->efd);
	close(ch->epfd);
	rdma_destroy_event_channel(ch->rch);
	pthread_mutex_destroy(&ch->lock);
	free(ch);
}

/* Queues a translated event. Needs ch->lock. */
static void chan_push(struct iv_chan *ch, const struct dgv_cm_event *ev)
{
	if (ch->qn == IV_EVQ) {
		DG_ERR("ibverbs: CM event queue full, event %d dropped", ev->type);
		return;
	}
	ch->q[(ch->qhead + ch->qn) % IV_EVQ] = *ev;
	ch->qn++;
	chan_efd_sync(ch, true);
}

static void qp_set_state(struct iv_qp *qp, enum dgv_qp_state s) { atomic_store(&qp->state, (int)s); }

static void fill_info(struct iv_qp *qp, struct rdma_cm_id *id, const struct rdma_conn_param *cp)
{
	struct iv_ctx *ctx = to_ictx(qp->base.ctx);
	struct sockaddr *la = rdma_get_local_addr(id), *pa = rdma_get_peer_addr(id);
	socklen_t ll = la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	socklen_t pl = pa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	memcpy(&qp->info.local, la, ll);
	memcpy(&qp->info.peer, pa, pl);
	qp->info.local_len = ll;
	qp->info.peer_len = pl;
	qp->info.mpa_rev = ctx->iwarp ? 2 : 0; /* the kernel's iWARP CM negotiates; it does not say */
	qp->info.crc = ctx->iwarp;
	if (cp) {
		qp->info.ird = cp->responder_resources;
		qp->info.ord = cp->initiator_depth;
	}
}

static void qp_send_held(struct iv_qp *qp);
static void errq_push(struct iv_qp *qp, uint8_t layer, uint8_t etype, uint8_t ecode, bool remote);

/* Translates one rdma_cm event into 0 or 1 queued dgv events. Needs ch->lock. */
static void chan_translate(struct iv_chan *ch, struct rdma_cm_event *rev)
{
	struct iv_ctx *ctx = to_ictx(ch->base.ctx);
	struct iv_tag *tag = rev->id ? rev->id->context : NULL;
	struct dgv_cm_event ev;
	char a[64];
	memset(&ev, 0, sizeof ev);

	if (rev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct iv_tag *lt = rev->listen_id ? rev->listen_id->context : NULL;
		struct iv_listener *l = lt && lt->kind == IV_LISTENER ? lt->obj : NULL;
		struct rdma_cm_id *id = rev->id;
		if (!l || id->verbs != ctx->verbs) {
			/* wildcard listener, connection on another device: our PDs cannot serve it */
			DG_WARN("ibverbs: connection request on device %s refused: the context is on %s",
				id->verbs ? ibv_get_device_name(id->verbs->device) : "?", ctx->dev);
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(rev);
			rdma_destroy_id(id);
			return;
		}
		struct iv_req *req = calloc(1, sizeof *req);
		if (!req) {
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(rev);
			rdma_destroy_id(id);
			return;
		}
		req->base.ctx = &ctx->base;
		req->id = id;
		req->ch = ch;
		req->l = l;
		req->tag = (struct iv_tag){IV_REQ, req};
		id->context = &req->tag;
		ev.type = DGV_CM_CONNECT_REQUEST;
		ev.req = &req->base;
		ev.listener = &l->base;
		ev.user = l->user;
		pdata_get(rev->param.conn.private_data, rev->param.conn.private_data_len, &ev);
		struct sockaddr *la = rdma_get_local_addr(id), *pa = rdma_get_peer_addr(id);
		ev.info.local_len = la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
		ev.info.peer_len = pa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
		memcpy(&ev.info.local, la, ev.info.local_len);
		memcpy(&ev.info.peer, pa, ev.info.peer_len);
		ev.info.ird = rev->param.conn.responder_resources;
		ev.info.ord = rev->param.conn.initiator_depth;
		ev.info.mpa_rev = ctx->iwarp ? 2 : 0;
		req->info = ev.info;
		rdma_ack_cm_event(rev);
		DG_INFO("ibverbs: connection request from %s on %s", iv_addr_str(&ev.info.peer.sa, a, sizeof a), ctx->dev);
		chan_push(ch, &ev);
		return;
	}
	if (!tag || tag->kind != IV_QP) {
		/* a listener's or a pending request's: nothing a dgv caller waits for */
		DG_DBG("ibverbs: %s (status %d) on a %s id ignored", rdma_event_str(rev->event), rev->status,
		       tag && tag->kind == IV_LISTENER ? "listening" : "request");
		if (rev->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
			DG_ERR("ibverbs: device %s removed under a listener", ctx->dev);
		rdma_ack_cm_event(rev);
		return;
	}
	struct iv_qp *qp = tag->obj;
	int st = rev->status;
	ev.qp = &qp->base;
	ev.user = qp->user;
	switch (rev->event) {
	case RDMA_CM_EVENT_ESTABLISHED:
		fill_info(qp, rev->id, &rev->param.conn);
		ev.type = DGV_CM_ESTABLISHED;
		pdata_get(rev->param.conn.private_data, rev->param.conn.private_data_len, &ev);
		ev.info = qp->info;
		qp->established = true;
		pthread_mutex_lock(&qp->lock);
		qp_set_state(qp, DGV_QPS_RTS);
		qp_send_held(qp);
		pthread_mutex_unlock(&qp->lock);
		DG_INFO("ibverbs: RC QP %u on %s connected to %s", qp->qp->qp_num, ctx->dev,
			iv_addr_str(&qp->info.peer.sa, a, sizeof a));
		break;
	case RDMA_CM_EVENT_REJECTED:
		pdata_get(rev->param.conn.private_data, rev->param.conn.private_data_len, &ev);
		qp_set_state(qp, DGV_QPS_ERROR);
		/* IB CM: reason 28 is a consumer's reject, anything else (8: no listener on that
		 * service ID) is a refusal. iWARP: -ECONNREFUSED both ways; only a reject carries
		 * private data (ours always does, see pdata_put). */
		if (ctx->iwarp ? rev->param.conn.private_data_len > 0 : st == 28) {
			ev.type = DGV_CM_REJECTED;
		} else {
			ev.type = DGV_CM_CONNECT_ERROR;
			ev.status = -ECONNREFUSED;
			ev.pdata_len = 0;
		}
		DG_INFO("ibverbs: connection %s (%s status %d)", ev.type == DGV_CM_REJECTED ? "rejected" : "refused",
			ctx->dev, st);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		qp_set_state(qp, DGV_QPS_ERROR);
		ev.type = DGV_CM_CONNECT_ERROR;
		ev.status = st < 0 ? st : rev->event == RDMA_CM_EVENT_UNREACHABLE ? -EHOSTUNREACH : -ECONNRESET;
		DG_INFO("ibverbs: %s on %s (status %d)", rdma_event_str(rev->event), ctx->dev, st);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		if (qp->disc_called || atomic_load(&qp->state) == DGV_QPS_ERROR) {
			ev.type = DGV_CM_DISCONNECTED;
			ev.status = atomic_load(&qp->state) == DGV_QPS_ERROR && !qp->disc_called ? -ECONNRESET : 0;
			qp_set_state(qp, ev.status ? DGV_QPS_ERROR : DGV_QPS_CLOSED);
		} else {
			/* The peer first. rdma_cm has no half-close: the connection is over for both
			 * directions (the device flushes what is still posted); dgv_disconnect then
			 * gives DISCONNECTED as on the soft provider. */
			ev.type = DGV_CM_PEER_CLOSED;
			qp->peer_closed = true;
			qp_set_state(qp, DGV_QPS_CLOSING);
		}
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		DG_ERR("ibverbs: device %s removed under a connection", ctx->dev);
		ev.type = qp->established ? DGV_CM_DISCONNECTED : DGV_CM_CONNECT_ERROR;
		ev.status = -ENODEV;
		qp_set_state(qp, DGV_QPS_ERROR);
		break;
	default: /* TIMEWAIT_EXIT, ADDR_CHANGE, CONNECT_RESPONSE (not with a QP), multicast */
		DG_DBG("ibverbs: %s ignored", rdma_event_str(rev->event));
		rdma_ack_cm_event(rev);
		return;
	}
	rdma_ack_cm_event(rev);
	chan_push(ch, &ev);
}

/*
 * The device's asynchronous events (non-blocking: the async fd is made so at open). A QP the
 * device put in error for a reason no completion carries (an iWARP target that refused a
 * tagged access, a fatal error) gets an error queue entry and DGV_QPS_ERROR here, so the
 * DISCONNECTED that follows reports an error rather than an orderly close. Called from the CM
 * calls (the path a program watching its connection takes).
 */
static void async_drain(struct iv_ctx *ctx)
{
	struct ibv_async_event e;
	while (ibv_get_async_event(ctx->verbs, &e) == 0) {
		enum ibv_event_type t = e.event_type;
		if (t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR) {
			/* qp_context is ours for every QP made through this provider (qp_attach) */
			struct iv_qp *qp = e.element.qp->qp_context;
			if (qp && qp->tag.kind == IV_QP && qp->tag.obj == qp) {
				pthread_mutex_lock(&qp->lock);
				if (t == IBV_EVENT_QP_ACCESS_ERR)
					errq_push(qp, DGV_LAYER_RDMAP, 1, 0xff, false);
				else
					errq_push(qp, DGV_LAYER_RDMAP, t == IBV_EVENT_QP_FATAL ? 0 : 2, 0xff, false);
				pthread_mutex_unlock(&qp->lock);
				qp_set_state(qp, DGV_QPS_ERROR);
				DG_INFO("ibverbs: QP %u on %s: %s", e.element.qp->qp_num, ctx->dev, ibv_event_type_str(t));
			}
		} else if (t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_PORT_ERR) {
			DG_ERR("ibverbs: %s: %s", ctx->dev, ibv_event_type_str(t));
		} else {
			DG_DBG("ibverbs: %s: %s", ctx->dev, ibv_event_type_str(t));
		}
		ibv_ack_async_event(&e);
	}
}

/* Reads every rdma_cm event waiting (non-blocking) into the queue. Needs ch->lock. */
static void chan_drain(struct iv_chan *ch)
{
	struct rdma_cm_event *rev;
	async_drain(to_ictx(ch->base.ctx));
	while (ch->qn < IV_EVQ && rdma_get_cm_event(ch->rch, &rev) == 0)
		chan_translate(ch, rev);
}

int iv_cm_create_channel(struct dgv_context *cb, struct dgv_cm_channel **out)
{
	struct iv_chan *ch;
	int r = iv_chan_new(to_ictx(cb), &ch);
	if (!r)
		*out = &ch->base;
	return r;
}

int iv_cm_destroy_channel(struct dgv_cm_channel *cb)
{
	struct iv_chan *ch = to_ichan(cb);
	if (ch == to_ictx(cb->ctx)->defch)
		return -EINVAL;
	pthread_mutex_lock(&ch->lock);
	bool busy = ch->users > 0;
	pthread_mutex_unlock(&ch->lock);
	if (busy)
		return -EBUSY;
	iv_chan_free(ch);
	return 0;
}

struct dgv_cm_channel *iv_cm_default_channel(struct dgv_context *cb) { return &to_ictx(cb)->defch->base; }
int iv_cm_channel_fd(struct dgv_cm_channel *cb) { return to_ichan(cb)->epfd; }

int iv_cm_get_event(struct dgv_cm_channel *cb, struct dgv_cm_event *ev)
{
	struct iv_chan *ch = to_ichan(cb);
	iv_run_accepts(to_ictx(cb->ctx));
	pthread_mutex_lock(&ch->lock);
	chan_drain(ch);
	int r = -EAGAIN;
	if (ch->qn) {
		*ev = ch->q[ch->qhead];
		ch->qhead = (ch->qhead + 1) % IV_EVQ;
		ch->qn--;
		r = 0;
	}
	chan_efd_sync(ch, ch->qn > 0);
	pthread_mutex_unlock(&ch->lock);
	return r;
}

int iv_cm_pending(struct dgv_cm_channel *cb)
{
	struct iv_chan *ch = to_ichan(cb);
	if (__atomic_load_n(&ch->qn, __ATOMIC_ACQUIRE) ||
	    atomic_load_explicit(&to_ictx(cb->ctx)->naccepts, memory_order_relaxed))
		return 1;
	/* rdma_cm's own queue: one poll, no lock, nothing driven */
	struct pollfd p = {.fd = ch->rch->fd, .events = POLLIN};
	return poll(&p, 1, 0) > 0;
}

int iv_cm_wait(struct dgv_cm_channel *cb, int timeout_ms)
{
	struct iv_chan *ch = to_ichan(cb);
	struct iv_ctx *ctx = to_ictx(cb->ctx);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : iv_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		iv_run_accepts(ctx);
		pthread_mutex_lock(&ch->lock);
		chan_drain(ch);
		uint32_t n = ch->qn;
		pthread_mutex_unlock(&ch->lock);
		if (n)
			return 0;
		uint64_t now = iv_now_ms();
		if (now >= deadline)
			return -ETIMEDOUT;
		int left = deadline == UINT64_MAX ? -1 : (int)(deadline - now);
		if (atomic_load_explicit(&ctx->naccepts, memory_order_relaxed) && (left < 0 || left > 10))
			left = 10;
		struct pollfd p = {.fd = ch->rch->fd, .events = POLLIN};
		if (poll(&p, 1, left) < 0 && errno == EINTR)
			return -EINTR;
	}
}

/* ---------------------------------------------------------------- deferred accepts */

static void do_accept(struct iv_qp *qp)
{
	if ((qp->connecting ? rdma_connect(qp->id, &qp->acc) : rdma_accept(qp->id, &qp->acc)) == 0)
		return;
	int err = -errno;
	DG_WARN("ibverbs: %s on %s: %s", qp->connecting ? "rdma_connect" : "rdma_accept", to_ictx(qp->base.ctx)->dev,
		strerror(-err));
	/* a failed rdma_connect sent nothing (siw binds its TCP socket first: EADDRINUSE) */
	struct dgv_cm_event ev = {.type = DGV_CM_CONNECT_ERROR, .status = err, .qp = &qp->base, .user = qp->user,
				  .local = qp->connecting};
	qp_set_state(qp, DGV_QPS_ERROR);
	pthread_mutex_lock(&qp->ch->lock);
	chan_push(qp->ch, &ev);
	pthread_mutex_unlock(&qp->ch->lock);
}

/* Puts qp on the deferred list: its rdma_accept (or rdma_connect) runs at the caller's next
 * call into the provider. Takes ctx->lock, then ch->lock. */
static void defer_start(struct iv_ctx *ctx, struct iv_chan *ch, struct iv_qp *qp)
{
	pthread_mutex_lock(&ctx->lock);
	qp->next_accept = ctx->accepts;
	ctx->accepts = qp;
	atomic_fetch_add(&ctx->naccepts, 1);
	pthread_mutex_unlock(&ctx->lock);
	pthread_mutex_lock(&ch->lock);
	chan_efd_sync(ch, true); /* a caller asleep on the channel fd must come back to start it */
	pthread_mutex_unlock(&ch->lock);
}

/* Removes qp from the deferred list; true when it was there. */
static bool accept_unlink(struct iv_ctx *ctx, struct iv_qp *qp)
{
	bool found = false;
	pthread_mutex_lock(&ctx->lock);
	for (struct iv_qp **pp = &ctx->accepts; *pp; pp = &(*pp)->next_accept)
		if (*pp == qp) {
			*pp = qp->next_accept;
			atomic_fetch_sub(&ctx->naccepts, 1);
			found = true;
			break;
		}
	pthread_mutex_unlock(&ctx->lock);
	return found;
}

/* Removes qp from the deferred disconnects. */
static void disc_unlink(struct iv_ctx *ctx, struct iv_qp *qp)
{
	pthread_mutex_lock(&ctx->lock);
	for (struct iv_qp **pp = &ctx->discs; *pp; pp = &(*pp)->next_disc)
		if (*pp == qp) {
			*pp = qp->next_disc;
			atomic_fetch_sub(&ctx->naccepts, 1);
			break;
		}
	pthread_mutex_unlock(&ctx->lock);
}

static void do_disconnect(struct iv_qp *qp);

/* Deferred disconnects whose sends are all complete (or whose deadline passed) go ahead. */
static void run_discs(struct iv_ctx *ctx)
{
	struct iv_qp *ready = NULL;
	pthread_mutex_lock(&ctx->lock);
	for (struct iv_qp **pp = &ctx->discs; *pp;) {
		struct iv_qp *qp = *pp;
		iv_cq_ready(&qp->scq->base); /* takes what the device completed (iv_note_sends) */
		if (__atomic_load_n(&qp->sdone, __ATOMIC_ACQUIRE) >= __atomic_load_n(&qp->shead, __ATOMIC_ACQUIRE) ||
		    iv_now_ms() >= qp->disc_deadline || atomic_load(&qp->state) == DGV_QPS_ERROR) {
			*pp = qp->next_disc;
			atomic_fetch_sub(&ctx->naccepts, 1);
			qp->next_disc = ready;
			ready = qp;
		} else {
			pp = &qp->next_disc;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	for (; ready; ready = ready->next_disc)
		do_disconnect(ready);
}

void iv_run_accepts_slow(struct iv_ctx *ctx)
{
	pthread_mutex_lock(&ctx->lock);
	struct iv_qp *list = ctx->accepts;
	bool discs = ctx->discs != NULL;
	for (struct iv_qp *q = list; q; q = q->next_accept)
		atomic_fetch_sub(&ctx->naccepts, 1);
	ctx->accepts = NULL;
	pthread_mutex_unlock(&ctx->lock);
	if (discs)
		run_discs(ctx);
	/* oldest first (the list is newest first) */
	struct iv_qp *rev = NULL;
	while (list) {
		struct iv_qp *n = list->next_accept;
		list->next_accept = rev;
		rev = list;
		list = n;
	}
	for (; rev; rev = rev->next_accept)
		do_accept(rev);
}

/* ---------------------------------------------------------------- queue pairs */

static void errq_push(struct iv_qp *qp, uint8_t layer, uint8_t etype, uint8_t ecode, bool remote)
{
	struct dgv_async_err *e = &qp->errq[(qp->errq_head + qp->errq_n) % IV_ERRQ];
	if (qp->errq_n == IV_ERRQ) {
		qp->errq_head = (qp->errq_head + 1) % IV_ERRQ;
		qp->errq_n--;
		qp->st.errq_overflows++;
	}
	memset(e, 0, sizeof *e);
	e->layer = layer;
	e->etype = etype;
	e->ecode = ecode;
	e->remote = remote;
	e->peer = qp->info.peer;
	qp->errq_n++;
}

/* What qp may have outstanding on cq at once: every device send is signaled (iv_swr.deliver),
 * so a CQ must hold the whole send queue, not just what the program asked to see. */
static uint32_t cq_demand(const struct iv_cq *cq, const struct iv_qp *qp)
{
	return (cq == qp->scq ? qp->nsslots : 0) + (cq == qp->rcq ? qp->nrslots : 0);
}

int iv_cq_add_qp(struct iv_cq *cq, struct iv_qp *qp)
{
	int r = 0;
	pthread_mutex_lock(&cq->lock);
	if (cq->nqps == IV_CQ_QPS) {
		r = -ENOSPC;
	} else {
		cq->qps[cq->nqps++] = qp;
		cq->need += cq_demand(cq, qp);
		/* grow the device CQ rather than let it overflow (an overrun puts every QP on it in
		 * error); a device that cannot resize keeps the size asked for, with a warning */
		if ((int)cq->need > cq->cq->cqe && ibv_resize_cq(cq->cq, (int)cq->need))
			DG_WARN("ibverbs: CQ of %d entries serves QPs that may have %u outstanding (resize failed)",
				cq->cq->cqe, cq->need);
	}
	pthread_mutex_unlock(&cq->lock);
	if (r)
		DG_WARN("ibverbs: more than %d QPs on one CQ", IV_CQ_QPS);
	return r;
}

void iv_cq_del_qp(struct iv_cq *cq, struct iv_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i < cq->nqps; i++)
		if (cq->qps[i] == qp) {
			cq->qps[i] = cq->qps[--cq->nqps];
			cq->need -= cq_demand(cq, qp);
			break;
		}
	pthread_mutex_unlock(&cq->lock);
}

struct iv_qp *iv_qp_alloc(struct iv_pd *pd, const struct dgv_qp_init_attr *attr, struct iv_chan *ch)
{
	struct iv_qp *qp = calloc(1, sizeof *qp);
	if (!qp)
		return NULL;
	qp->base.ctx = pd->base.ctx;
	qp->base.type = DGV_QPT_RC;
	qp->pd = pd;
	qp->scq = to_icq(attr->send_cq);
	qp->rcq = to_icq(attr->recv_cq);
	qp->ch = ch;
	qp->user = attr->cm_user;
	qp->tag = (struct iv_tag){IV_QP, qp};
	pthread_mutex_init(&qp->lock, NULL);
	atomic_store(&qp->state, DGV_QPS_CONNECTING);
	return qp;
}

void iv_qp_free(struct iv_qp *qp)
{
	if (qp->wrec_mr)
		ibv_dereg_mr(qp->wrec_mr);
	free(qp->wrec);
	free(qp->wrec_sge);
	free(qp->sslots);
	free(qp->rslots);
	free(qp->held);
	pthread_mutex_destroy(&qp->lock);
	free(qp);
}

/* Creates the device QP on id (rdma_create_qp leaves it in INIT: receives may be posted). */
static int qp_attach(struct iv_qp *qp, struct rdma_cm_id *id, const struct dgv_qp_init_attr *attr)
{
	struct iv_ctx *ctx = to_ictx(qp->base.ctx);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.send_cq = qp->scq->cq;
	ia.recv_cq = qp->rcq->cq;
	ia.cap.max_send_wr = attr->max_send_wr ? attr->max_send_wr : 256;
	ia.cap.max_recv_wr = attr->max_recv_wr ? attr->max_recv_wr : 256;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = attr->max_sge ? attr->max_sge : 4;
	ia.cap.max_inline_data = 64;
	if ((int)ia.cap.max_send_wr > ctx->dattr.max_qp_wr)
		ia.cap.max_send_wr = ia.cap.max_recv_wr = (uint32_t)ctx->dattr.max_qp_wr;
	if ((int)ia.cap.max_recv_wr > ctx->dattr.max_qp_wr)
		ia.cap.max_recv_wr = (uint32_t)ctx->dattr.max_qp_wr;
	if ((int)ia.cap.max_send_sge > ctx->dattr.max_sge)
		ia.cap.max_send_sge = ia.cap.max_recv_sge = (uint32_t)ctx->dattr.max_sge;
	ia.sq_sig_all = 0;
	ia.qp_context = qp; /* async events name the QP by it (iv_async_drain) */
	if (rdma_create_qp(id, qp->pd->pd, &ia)) {
		ia.cap.max_inline_data = 0; /* iWARP devices may have no inline data at all */
		if (rdma_create_qp(id, qp->pd->pd, &ia)) {
			int err = -errno;
			DG_WARN("ibverbs: rdma_create_qp on %s: %s", ctx->dev, strerror(errno));
			return err;
		}
	}
	qp->id = id;
	qp->qp = id->qp;
	qp->nsslots = ia.cap.max_send_wr;
	qp->nrslots = ia.cap.max_recv_wr;
	qp->max_sge = ia.cap.max_send_sge < ia.cap.max_recv_sge ? ia.cap.max_send_sge : ia.cap.max_recv_sge;
	qp->max_inline = ia.cap.max_inline_data;
	qp->held_sz = sizeof(struct iv_held) + qp->max_sge * sizeof(struct dgv_sge);
	qp->sslots = calloc(qp->nsslots, sizeof *qp->sslots);
	qp->rslots = calloc(qp->nrslots, sizeof *qp->rslots);
	qp->held = calloc(qp->nsslots, qp->held_sz);
	int r = 0;
	if (ctx->iwarp) {
		/* Write-Record descriptors: registered once, one per send slot */
		qp->wrec = calloc(qp->nsslots, sizeof *qp->wrec);
		qp->wrec_sge = calloc(qp->nsslots, sizeof *qp->wrec_sge);
		if (qp->wrec && qp->wrec_sge &&
		    (qp->wrec_mr = ibv_reg_mr(qp->pd->pd, qp->wrec, qp->nsslots * sizeof *qp->wrec, IBV_ACCESS_LOCAL_WRITE)))
			for (uint32_t i = 0; i < qp->nsslots; i++)
				qp->wrec_sge[i] = (struct ibv_sge){(uintptr_t)&qp->wrec[i], sizeof *qp->wrec, qp->wrec_mr->lkey};
	}
	if (!qp->sslots || !qp->rslots || !qp->held || (ctx->iwarp && !qp->wrec_mr))
		r = -ENOMEM;
	else if ((r = iv_cq_add_qp(qp->scq, qp)) == 0 && qp->rcq != qp->scq && (r = iv_cq_add_qp(qp->rcq, qp)))
		iv_cq_del_qp(qp->scq, qp);
	if (r) {
		rdma_destroy_qp(id);
		qp->qp = NULL;
		return r;
	}
	pthread_mutex_lock(&qp->pd->lock);
	qp->pd->nqps++;
	pthread_mutex_unlock(&qp->pd->lock);
	pthread_mutex_lock(&qp->ch->lock);
	qp->ch->users++;
	pthread_mutex_unlock(&qp->ch->lock);
	return 0;
}

int iv_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out)
{
	if (attr->qp_type == DGV_QPT_RC) {
		DG_INFO("ibverbs: RC QPs come from dgv_connect or dgv_accept");
		return -EINVAL;
	}
	if (attr->qp_type == DGV_QPT_UD)
		return iv_ud_create_qp(pd, attr, out);
	DG_WARN("ibverbs: RD QPs are not implemented in the ibverbs provider (datagram sockets that "
		"need them stay on soft)");
	return -EOPNOTSUPP;
}

int iv_destroy_qp(struct dgv_qp *qb)
{
	struct iv_qp *qp = to_iqp(qb);
	struct iv_ctx *ctx = to_ictx(qb->ctx);
	if (qp->ud) {
		iv_ud_destroy(qp);
		iv_qp_free(qp);
		return 0;
	}
	accept_unlink(ctx, qp);
	disc_unlink(ctx, qp);
	if (qp->qp) {
		/* to ERROR first, so the device stops placing before the QP goes */
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		ibv_modify_qp(qp->qp, &a, IBV_QP_STATE);
		iv_cq_del_qp(qp->scq, qp);
		if (qp->rcq != qp->scq)
			iv_cq_del_qp(qp->rcq, qp);
		rdma_destroy_qp(qp->id);
		pthread_mutex_lock(&qp->pd->lock);
		qp->pd->nqps--;
		pthread_mutex_unlock(&qp->pd->lock);
	}
	/* queued events about this QP would name freed memory */
	pthread_mutex_lock(&qp->ch->lock);
	uint32_t keep = 0;
	for (uint32_t i = 0; i < qp->ch->qn; i++) {
		struct dgv_cm_event *e = &qp->ch->q[(qp->ch->qhead + i) % IV_EVQ];
		if (e->qp != qb)
			qp->ch->q[(qp->ch->qhead + keep++) % IV_EVQ] = *e;
	}
	qp->ch->qn = keep;
	chan_efd_sync(qp->ch, keep > 0);
	if (qp->qp)
		qp->ch->users--;
	pthread_mutex_unlock(&qp->ch->lock);
	if (qp->id)
		rdma_destroy_id(qp->id);
	iv_qp_free(qp);
	return 0;
}

int iv_qp_local_addr(struct dgv_qp *qb, union dgv_sockaddr *out, socklen_t *len)
{
	struct iv_qp *qp = to_iqp(qb);
	struct sockaddr *la = rdma_get_local_addr(qp->id);
	*len = la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	memcpy(out, la, *len);
	return 0;
}

/* ---------------------------------------------------------------- work requests */

static const char *op_name(enum dgv_wr_opcode op)
{
	switch (op) {
	case DGV_WR_SEND_PLAIN: return "SEND_PLAIN";
	default: return "?";
	}
}

/* Fills w for one dgv WR (the second half of an iWARP Write-Record into w2). Returns the number of
 * device WRs (1 or 2) or -errno. */
static int build_send(struct iv_qp *qp, const struct dgv_send_wr *wr, uint64_t slot, struct ibv_send_wr *w,
		      struct ibv_send_wr *w2)
{
	uint32_t len = 0;
	uint8_t wc_op;
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list))
		return -EINVAL;
	for (int i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	memset(w, 0, sizeof *w);
	w->sg_list = (struct ibv_sge *)wr->sg_list;
	w->num_sge = wr->num_sge;
	w->send_flags = IBV_SEND_SIGNALED; /* always: iv_swr.deliver */
	w->wr.rdma.remote_addr = wr->remote_addr;
	w->wr.rdma.rkey = wr->rkey;
	switch (wr->opcode) {
	case DGV_WR_SEND_SE:
		w->send_flags |= IBV_SEND_SOLICITED;
		/* fall through */
	case DGV_WR_SEND:
		w->opcode = IBV_WR_SEND;
		wc_op = DGV_WC_SEND;
		break;
	case DGV_WR_SEND_SE_INV:
		w->send_flags |= IBV_SEND_SOLICITED;
		/* fall through */
	case DGV_WR_SEND_INV:
		w->opcode = IBV_WR_SEND_WITH_INV;
		w->invalidate_rkey = wr->invalidate_rkey;
		wc_op = DGV_WC_SEND;
		break;
	case DGV_WR_WRITE:
		w->opcode = IBV_WR_RDMA_WRITE;
		wc_op = DGV_WC_WRITE;
		break;
	case DGV_WR_WRITE_RECORD:
		wc_op = DGV_WC_WRITE_RECORD;
		if (!qp->wrec) {
			w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w->imm_data = htobe32((uint32_t)wr->remote_addr);
			break;
		}
		/* iWARP: the Write, unsignaled, then the descriptor as a Send that completes the WR
		 * (RC keeps their order, so the target has the data when the Send arrives) */
		w->opcode = IBV_WR_RDMA_WRITE;
		w->send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
		struct iv_wrec *d = &qp->wrec[(slot + 1) % qp->nsslots];
		memcpy(d->magic, IV_WREC_MAGIC, sizeof d->magic);
		d->base = htobe64(wr->remote_addr);
		d->length = htobe32(len);
		d->stag = htobe32(wr->rkey);
		memset(w2, 0, sizeof *w2);
		w2->opcode = IBV_WR_SEND;
		/* inline when the device can: copied at post time, so the descriptor's memory is
		 * never read after the device has taken the WQE (siw frees a ring slot then) */
		w2->send_flags = (wr->send_flags & DGV_SEND_SIGNALED ? IBV_SEND_SIGNALED : 0) |
				 (qp->max_inline >= sizeof *d ? IBV_SEND_INLINE : 0);
		w2->sg_list = &qp->wrec_sge[(slot + 1) % qp->nsslots];
		w2->num_sge = 1;
		w2->wr_id = slot + 1;
		qp->sslots[slot % qp->nsslots] = (struct iv_swr){.wr_id = wr->wr_id, .len = len, .opcode = wc_op};
		qp->sslots[(slot + 1) % qp->nsslots] = (struct iv_swr){
			.wr_id = wr->wr_id, .len = len, .opcode = wc_op, .deliver = !!(wr->send_flags & DGV_SEND_SIGNALED)};
		w->wr_id = slot;
		w->next = w2;
		return 2;
	case DGV_WR_READ:
		w->opcode = IBV_WR_RDMA_READ;
		wc_op = DGV_WC_READ;
		break;
	default:
		DG_WARN("ibverbs: %s work requests are not supported on an RC QP of a device", op_name(wr->opcode));
		return -EOPNOTSUPP;
	}
	if (len <= qp->max_inline && wr->opcode != DGV_WR_READ && len)
		w->send_flags |= IBV_SEND_INLINE; /* copied at post time: no DMA read later */
	qp->sslots[slot % qp->nsslots] = (struct iv_swr){
		.wr_id = wr->wr_id, .len = len, .opcode = wc_op, .deliver = !!(wr->send_flags & DGV_SEND_SIGNALED)};
	w->wr_id = slot;
	return 1;
}

/* Posts a chain on the device, up to B device WRs per ibv_post_send. Needs qp->lock. */
static int post_now(struct iv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	enum { B = 16 };
	struct ibv_send_wr iw[B], *ibad;
	struct dgv_send_wr *src[B];
	int err = 0;
	while (wr && !err) {
		int n = 0;
		for (; wr && n < B - 1; wr = wr->next) {
			/* a slot (its wr_id, an iWARP record's descriptor) is ours until its completion
			 * is polled: the device's own ring may have room sooner */
			if (qp->shead + (uint64_t)n + 2 - __atomic_load_n(&qp->sdone, __ATOMIC_ACQUIRE) > qp->nsslots) {
				err = -ENOMEM;
				*bad = wr;
				break;
			}
			int k = build_send(qp, wr, qp->shead + (uint64_t)n, &iw[n], &iw[n + 1]);
			if (k < 0) {
				err = k;
				*bad = wr;
				break;
			}
			for (int i = 0; i < k; i++)
				src[n + i] = wr;
			n += k;
			iw[n - 1].next = &iw[n];
		}
		if (!n)
			break;
		iw[n - 1].next = NULL;
		int r = ibv_post_send(qp->qp, iw, &ibad);
		if (r) {
			int k = (int)(ibad - iw);
			qp->shead += (uint64_t)k;
			*bad = src[k];
			return -r;
		}
		qp->shead += (uint64_t)n;
	}
	return err;
}

/* Posts the sends held while the connection was being made. Needs qp->lock. */
static void qp_send_held(struct iv_qp *qp)
{
	for (uint32_t i = 0; i < qp->nheld; i++) {
		struct iv_held *h = (struct iv_held *)(qp->held + (size_t)i * qp->held_sz);
		struct dgv_send_wr *bad;
		h->wr.next = NULL;
		h->wr.sg_list = h->sge;
		int r = post_now(qp, &h->wr, &bad);
		if (r)
			DG_WARN("ibverbs: posting a held send failed: %s", strerror(-r));
	}
	qp->nheld = 0;
}

int iv_post_send(struct dgv_qp *qb, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	struct iv_qp *qp = to_iqp(qb);
	for (struct dgv_send_wr *w = wr; w; w = w->next)
		if (w->send_flags & DGV_SEND_INLINE) { /* not DGV_CAP_SEND_INLINE here */
			*bad = w;
			return -EINVAL;
		}
	iv_run_accepts(to_ictx(qb->ctx));
	pthread_mutex_lock(&qp->lock);
	int r = 0;
	if (qp->ud) {
		r = iv_ud_post_send(qp, wr, bad);
	} else if (atomic_load(&qp->state) == DGV_QPS_CONNECTING) {
		/* not in RTS yet: the device would refuse; keep a copy until ESTABLISHED */
		for (; wr; wr = wr->next) {
			if (qp->nheld == qp->nsslots || wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge) {
				*bad = wr;
				r = qp->nheld == qp->nsslots ? -ENOMEM : -EINVAL;
				break;
			}
			struct iv_held *h = (struct iv_held *)(qp->held + (size_t)qp->nheld++ * qp->held_sz);
			h->wr = *wr;
			if (wr->num_sge)
				memcpy(h->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *h->sge);
		}
	} else {
		r = post_now(qp, wr, bad);
	}
	pthread_mutex_unlock(&qp->lock);
	return r;
}

int iv_post_recv(struct dgv_qp *qb, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad)
{
	enum { B = 16 };
	struct iv_qp *qp = to_iqp(qb);
	struct ibv_recv_wr iw[B], *ibad;
	struct dgv_recv_wr *src[B];
	int r = 0;
	if (qp->ud) {
		pthread_mutex_lock(&qp->lock);
		r = iv_ud_post_recv(qp, wr, bad);
		pthread_mutex_unlock(&qp->lock);
		return r;
	}
	pthread_mutex_lock(&qp->lock);
	while (wr && !r) {
		int n = 0;
		for (; wr && n < B; wr = wr->next, n++) {
			if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge) {
				r = -EINVAL;
				break;
			}
			uint64_t slot = qp->rhead + (uint64_t)n;
			qp->rslots[slot % qp->nrslots] = (struct iv_rwr){
				.wr_id = wr->wr_id, .addr = wr->num_sge ? wr->sg_list[0].addr : 0,
				.len = wr->num_sge ? wr->sg_list[0].length : 0};
			iw[n] = (struct ibv_recv_wr){.wr_id = slot | RECV_BIT, .next = &iw[n + 1],
						     .sg_list = (struct ibv_sge *)wr->sg_list, .num_sge = wr->num_sge};
			src[n] = wr;
		}
		if (r)
			*bad = wr;
		if (!n)
			break;
		iw[n - 1].next = NULL;
		int e = ibv_post_recv(qp->qp, iw, &ibad);
		if (e) {
			int k = (int)(ibad - iw);
			qp->rhead += (uint64_t)k;
			*bad = src[k];
			r = -e;
			break;
		}
		qp->rhead += (uint64_t)n;
	}
	pthread_mutex_unlock(&qp->lock);
	return r;
}

/* ---------------------------------------------------------------- completions */

static enum dgv_wc_status map_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS: return DGV_WC_SUCCESS;
	case IBV_WC_LOC_LEN_ERR: return DGV_WC_LOC_LEN_ERR;
	case IBV_WC_LOC_PROT_ERR: return DGV_WC_LOC_PROT_ERR;
	case IBV_WC_LOC_QP_OP_ERR: return DGV_WC_LOC_QP_OP_ERR;
	case IBV_WC_WR_FLUSH_ERR: return DGV_WC_WR_FLUSH_ERR;
	case IBV_WC_REM_ACCESS_ERR: return DGV_WC_REM_ACCESS_ERR;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_INV_REQ_ERR: return DGV_WC_REM_OP_ERR;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR: return DGV_WC_RETRY_EXC_ERR;
	default: return DGV_WC_GENERAL_ERR;
	}
}

static struct iv_qp *cq_find_qp(struct iv_cq *cq, uint32_t qpn)
{
	for (uint32_t i = 0; i < cq->nqps; i++)
		if (cq->qps[i]->qp && cq->qps[i]->qp->qp_num == qpn)
			return cq->qps[i];
	return NULL;
}

/* One device completion into *o; false when it belongs to no QP we know (destroyed). Needs
 * cq->lock. */
static bool convert(struct iv_cq *cq, const struct ibv_wc *w, struct dgv_wc *o, int idx)
{
	struct iv_qp *qp = cq_find_qp(cq, w->qp_num);
	if (!qp)
		return false;
	memset(o, 0, sizeof *o);
	o->status = map_status(w->status);
	o->qp = &qp->base;
	if (w->wr_id & RECV_BIT) {
		if (qp->ud)
			return iv_ud_recv(qp, w, o, &cq->ranges[idx]);
		const struct iv_rwr *rs = &qp->rslots[(w->wr_id & ~RECV_BIT) % qp->nrslots];
		o->wr_id = rs->wr_id;
		o->opcode = DGV_WC_RECV;
		o->src = qp->info.peer;
		o->src_len = qp->info.peer_len;
		if (o->status == DGV_WC_SUCCESS) {
			o->byte_len = w->byte_len;
			o->msn = ++qp->rx_msn;
			qp->st.rx_msgs++;
			qp->st.rx_bytes += w->byte_len;
			if (w->wc_flags & IBV_WC_WITH_INV) {
				o->flags |= DGV_WC_WITH_INV;
				o->invalidated_rkey = w->invalidated_rkey;
			}
			struct iv_wrec d;
			if (qp->wrec && w->opcode == IBV_WC_RECV && w->byte_len == sizeof d && rs->len >= sizeof d &&
			    (memcpy(&d, (void *)(uintptr_t)rs->addr, sizeof d), !memcmp(d.magic, IV_WREC_MAGIC, sizeof d.magic))) {
				/* an iWARP Write-Record's descriptor (header comment) */
				uint32_t len = be32toh(d.length);
				o->opcode = DGV_WC_RECV_WRITE_RECORD;
				o->byte_len = len;
				qp->st.rx_bytes += len - (uint32_t)sizeof d;
				cq->ranges[idx] = (struct dgv_range){0, len};
				o->record = (struct dgv_record){.stag = be32toh(d.stag), .base = be64toh(d.base), .length = len,
								.valid_bytes = len, .nranges = 1, .ranges = &cq->ranges[idx]};
			} else if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				uint32_t lo = be32toh(w->imm_data);
				o->opcode = DGV_WC_RECV_WRITE_RECORD;
				cq->ranges[idx] = (struct dgv_range){0, w->byte_len};
				o->record = (struct dgv_record){.length = w->byte_len, .valid_bytes = w->byte_len,
								.nranges = 1, .ranges = &cq->ranges[idx]};
				if (!iv_record_target(qp->pd, lo, w->byte_len, &o->record.stag, &o->record.base)) {
					/* a foreign peer's Write with Immediate, or a region already gone */
					DG_WARN("ibverbs: Write-Record at ...%08x (%u bytes): no such region", lo, w->byte_len);
					o->record.base = lo;
					o->status = DGV_WC_GENERAL_ERR;
				}
			}
		}
	} else {
		struct iv_swr *s = &qp->sslots[w->wr_id % qp->nsslots];
		o->wr_id = s->wr_id;
		o->opcode = s->opcode;
		o->byte_len = s->opcode == DGV_WC_READ ? w->byte_len : s->len;
		if (w->wr_id + 1 > __atomic_load_n(&qp->sdone, __ATOMIC_RELAXED))
			__atomic_store_n(&qp->sdone, w->wr_id + 1, __ATOMIC_RELEASE);
		if (o->status == DGV_WC_SUCCESS) {
			qp->st.tx_msgs++;
			qp->st.tx_bytes += o->byte_len;
			if (!s->deliver)
				return false; /* the program did not ask for it */
		}
	}
	if (o->status != DGV_WC_SUCCESS && o->status != DGV_WC_WR_FLUSH_ERR) {
		/* the device has put the QP in error; say why the way the soft provider would */
		bool rem = o->status == DGV_WC_REM_ACCESS_ERR || o->status == DGV_WC_REM_OP_ERR;
		pthread_mutex_lock(&qp->lock);
		errq_push(qp, rem ? DGV_LAYER_RDMAP : DGV_LAYER_LLP, o->status == DGV_WC_REM_ACCESS_ERR ? 1 : 2,
			  0xff, rem); /* the device does not say which check failed */
		pthread_mutex_unlock(&qp->lock);
		qp_set_state(qp, DGV_QPS_ERROR);
		DG_INFO("ibverbs: QP %u: %s completion %s (vendor error %#x)", w->qp_num,
			w->wr_id & RECV_BIT ? "receive" : "send", ibv_wc_status_str(w->status), w->vendor_err);
	}
	return true;
}

void iv_note_sends(struct iv_cq *cq, const struct ibv_wc *w, int n)
{
	for (int i = 0; i < n; i++) {
		struct iv_qp *qp;
		if ((w[i].wr_id & RECV_BIT) || !(qp = cq_find_qp(cq, w[i].qp_num)))
			continue;
		if (w[i].wr_id + 1 > __atomic_load_n(&qp->sdone, __ATOMIC_RELAXED))
			__atomic_store_n(&qp->sdone, w[i].wr_id + 1, __ATOMIC_RELEASE);
	}
}

int iv_poll_cq(struct dgv_cq *cb, int n, struct dgv_wc *wc)
{
	struct iv_cq *cq = to_icq(cb);
	enum { B = 32 };
	struct ibv_wc w[B];
	iv_run_accepts(to_ictx(cb->ctx));
	if (n > B)
		n = B; /* the CQ owns B record ranges: one poll hands out at most that many */
	pthread_mutex_lock(&cq->lock);
	if (!cq->ranges)
		cq->ranges = calloc(B, sizeof *cq->ranges);
	if (!cq->ranges) {
		pthread_mutex_unlock(&cq->lock);
		return -ENOMEM;
	}
	int got = 0;
	/* UD messages whose missing segments did not come in time (ud.c); at most one partial
	 * Write-Record per call, since its ranges live in cq->partial */
	for (uint32_t i = 0; i < cq->nqps && got < n; i++) {
		struct iv_qp *uq = cq->qps[i];
		if (uq->ud && uq->rcq == cq && uq->u->nactive &&
		    iv_ud_expire(uq, &wc[got], cq->partial, sizeof cq->partial / sizeof *cq->partial)) {
			got++;
			break;
		}
	}
	while (got < n && cq->nstash) {
		if (convert(cq, &cq->stash[cq->sthead], &wc[got], got))
			got++;
		cq->sthead++;
		__atomic_store_n(&cq->nstash, cq->nstash - 1, __ATOMIC_RELEASE);
	}
	while (got < n) {
		int want = n - got;
		int k = ibv_poll_cq(cq->cq, want, w);
		if (k < 0) {
			pthread_mutex_unlock(&cq->lock);
			return got ? got : -EIO;
		}
		for (int i = 0; i < k; i++)
			if (convert(cq, &w[i], &wc[got], got))
				got++;
		if (k < want)
			break; /* the device's CQ is empty (completions nobody asked for were dropped) */
	}
	pthread_mutex_unlock(&cq->lock);
	return got;
}

int iv_poll_errq(struct dgv_qp *qb, int n, struct dgv_async_err *out)
{
	struct iv_qp *qp = to_iqp(qb);
	int got = 0;
	pthread_mutex_lock(&qp->lock);
	while (got < n && qp->errq_n) {
		out[got++] = qp->errq[qp->errq_head];
		qp->errq_head = (qp->errq_head + 1) % IV_ERRQ;
		qp->errq_n--;
	}
	pthread_mutex_unlock(&qp->lock);
	return got;
}

int iv_qp_stats(struct dgv_qp *qb, struct dgv_qp_stats *out)
{
	*out = to_iqp(qb)->st;
	return 0;
}

/* ---------------------------------------------------------------- connections */

static void conn_param(struct iv_ctx *ctx, const struct dgv_conn_param *p, struct rdma_conn_param *cp)
{
	memset(cp, 0, sizeof *cp);
	int ird = p && p->ird ? p->ird : 16, ord = p && p->ord ? p->ord : 16;
	cp->responder_resources = (uint8_t)(ird < ctx->dattr.max_qp_rd_atom ? ird : ctx->dattr.max_qp_rd_atom);
	cp->initiator_depth = (uint8_t)(ord < ctx->dattr.max_qp_init_rd_atom ? ord : ctx->dattr.max_qp_init_rd_atom);
	cp->retry_count = 7;
	cp->rnr_retry_count = 7; /* IB: infinite RNR retry, as the soft provider waits for a receive */
	if (p && (p->mpa_rev == 1 || p->markers == 1 || p->crc == 0))
		DG_DBG("ibverbs: MPA revision, CRC and markers are the kernel's choice on a device");
}

/*
 * Ports on an iWARP device. Its connections are kernel TCP connections: siw (and an RNIC's
 * driver without a port mapper daemon) binds a kernel TCP socket to the port rdma_cm picked for
 * the id, which rdma_cm picks in its own port space without asking the kernel. On a host whose
 * programs hold many TCP ports that bind failed with EADDRINUSE ("Address already in use") for
 * a device listener on port 0 and for rdma_connect, a few connections in a thousand (vm-test
 * shim_tcp_ports: most of them with 80 % of the range held). So for port 0 the kernel picks:
 * a TCP socket bound to the address with port 0 gets a port free in the kernel's space, and
 * the id is bound to that port once the probe is closed.
 *
 * Returns the port (network order) or 0 when the probe failed (rdma_cm then picks).
 */
static uint16_t kernel_free_port(const struct sockaddr *addr)
{
	union dgv_sockaddr a;
	socklen_t al = addr->sa_family == AF_INET6 ? sizeof a.sin6 : sizeof a.sin;
	memcpy(&a, addr, al);
	a.sin.sin_port = 0; /* same offset in sin6 */
	int s = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return 0;
	uint16_t port = 0;
	if (bind(s, &a.sa, al) == 0 && getsockname(s, &a.sa, &al) == 0)
		port = a.sin.sin_port;
	close(s);
	return port;
}

/* The port of a (network order; sin and sin6 keep it at the same offset). */
static uint16_t port_in(const struct sockaddr *a)
{
	return ((const struct sockaddr_in *)a)->sin_port;
}

int iv_connect(struct dgv_pd *pb, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
	       socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out)
{
	struct iv_ctx *ctx = to_ictx(pb->ctx);
	struct iv_chan *ch = attr->cm_channel ? to_ichan(attr->cm_channel) : ctx->defch;
	struct rdma_event_channel *tmp = NULL;
	struct rdma_cm_id *id = NULL;
	uint8_t pdata[DGV_MAX_PDATA + 4];
	char a[64];
	int r, st = 0;
	if (attr->use_adopt_fd) {
		DG_WARN("ibverbs: dgv_connect cannot adopt a TCP socket: a device connects through rdma_cm");
		return -EOPNOTSUPP;
	}
	int plen = pdata_put(ctx, param ? param->private_data : NULL, param ? param->private_data_len : 0, pdata,
			     ctx->iwarp ? DGV_MAX_PDATA : IB_REQ_PDATA, false);
	if (plen < 0) {
		DG_WARN("ibverbs: private data of %u bytes does not fit a connection request on %s",
			param->private_data_len, ctx->dev);
		return -EINVAL;
	}
	struct iv_qp *qp = iv_qp_alloc(to_ipd(pb), attr, ch);
	if (!qp)
		return -ENOMEM;
	tmp = rdma_create_event_channel();
	if (!tmp || rdma_create_id(tmp, &id, &qp->tag, RDMA_PS_TCP)) {
		r = -errno;
		goto fail;
	}
	/* iWARP: a source port the kernel's TCP has free (kernel_free_port) */
	const struct sockaddr *src = (const struct sockaddr *)attr->bind_addr;
	union dgv_sockaddr srcp;
	if (ctx->iwarp && (src ? !port_in(src) : ctx->have_addr && ctx->addr.sa.sa_family == dst->sa_family)) {
		srcp = src ? *(const union dgv_sockaddr *)src : ctx->addr;
		uint16_t port = kernel_free_port(&srcp.sa);
		if (port) {
			srcp.sin.sin_port = port;
			src = &srcp.sa;
		}
	}
	if (rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, 2000)) {
		r = -errno;
		goto fail;
	}
	if ((r = iv_wait_event(tmp, RDMA_CM_EVENT_ADDR_RESOLVED, 3000, &st))) {
		DG_INFO("ibverbs: address resolution of %s failed (%s, status %d)", iv_addr_str(dst, a, sizeof a),
			strerror(-r), st);
		goto fail;
	}
	if (id->verbs != ctx->verbs) {
		DG_WARN("ibverbs: %s is reached through %s, but this context is on %s", iv_addr_str(dst, a, sizeof a),
			id->verbs ? ibv_get_device_name(id->verbs->device) : "no RDMA device", ctx->dev);
		r = -ENODEV;
		goto fail;
	}
	/* the route: for RoCE v2 this picks the source GID of the right type and netdev */
	if (rdma_resolve_route(id, 2000)) {
		r = -errno;
		goto fail;
	}
	if ((r = iv_wait_event(tmp, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000, &st))) {
		DG_INFO("ibverbs: route resolution to %s failed (%s, status %d)", iv_addr_str(dst, a, sizeof a),
			strerror(-r), st);
		goto fail;
	}
	if ((r = qp_attach(qp, id, attr)))
		goto fail;
	if (rdma_migrate_id(id, ch->rch)) {
		r = -errno;
		goto fail_qp;
	}
	rdma_destroy_event_channel(tmp);
	tmp = NULL;
	/* rdma_connect on the caller's next call into us, as rdma_accept (header comment): the
	 * receives the caller posts right after this are there before the peer's first Send (the
	 * MPA exchange could finish first; siw then ended ~1 % of connections with a DDP
	 * Terminate, "no buffer", at the writer's first record) */
	conn_param(ctx, param, &qp->acc);
	memcpy(qp->acc_pdata, pdata, (size_t)plen);
	qp->acc.private_data = plen ? qp->acc_pdata : NULL;
	qp->acc.private_data_len = (uint8_t)plen;
	qp->connecting = true;
	defer_start(ctx, ch, qp);
	DG_INFO("ibverbs: connecting QP %u on %s to %s", qp->qp->qp_num, ctx->dev, iv_addr_str(dst, a, sizeof a));
	*out = &qp->base;
	return 0;
fail_qp:
	qp->id = id; /* iv_destroy_qp takes the id down with the QP */
	id = NULL;
	if (tmp)
		rdma_destroy_event_channel(tmp);
	iv_destroy_qp(&qp->base);
	return r;
fail:
	if (!r)
		r = -EIO;
	if (id)
		rdma_destroy_id(id);
	if (tmp)
		rdma_destroy_event_channel(tmp);
	iv_qp_free(qp);
	return r;
}

int iv_listen(struct dgv_context *cb, const struct sockaddr *addr, socklen_t len, int backlog, int adopt_fd,
	      struct dgv_cm_channel *chb, void *user, struct dgv_listener **out)
{
	struct iv_ctx *ctx = to_ictx(cb);
	struct iv_chan *ch = chb ? to_ichan(chb) : ctx->defch;
	char a[64];
	union dgv_sockaddr own;
	if (adopt_fd >= 0) {
		/* A device listens through rdma_cm, not on the socket: on RoCE/IB, rdma_cm's TCP port
		 * space is its own, so we listen at the socket's address there and connections made
		 * with dgv_connect to that address reach us (the socket itself is left alone). On
		 * iWARP the port is the kernel's TCP port, which the socket already holds. */
		socklen_t ol = sizeof own;
		if (ctx->iwarp || getsockname(adopt_fd, &own.sa, &ol)) {
			DG_WARN("ibverbs: dgv_listen cannot adopt a TCP socket on %s: a device listens through rdma_cm",
				ctx->dev);
			return -EOPNOTSUPP;
		}
		/* a wildcard socket: the device's own address (rdma_cm's wildcard would also cover
		 * iWARP devices, whose ports are the kernel's) */
		bool any = own.sa.sa_family == AF_INET ? own.sin.sin_addr.s_addr == htonl(INADDR_ANY)
						      : IN6_IS_ADDR_UNSPECIFIED(&own.sin6.sin6_addr);
		if (any && ctx->have_addr) {
			uint16_t port = port_in(&own.sa);
			own = ctx->addr;
			own.sin.sin_port = port; /* same offset in sin6 */
		}
		addr = &own.sa;
	} else if (addr && ctx->have_addr && addr->sa_family == ctx->addr.sa.sa_family &&
		   (addr->sa_family == AF_INET
			    ? ((const struct sockaddr_in *)addr)->sin_addr.s_addr == htonl(INADDR_ANY)
			    : IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)addr)->sin6_addr))) {
		/* the wildcard: this device's address (rdma_cm's wildcard would also cover iWARP
		 * devices, and does not listen beside them) */
		uint16_t port = port_in(addr);
		own = ctx->addr;
		own.sin.sin_port = port; /* same offset in sin6 */
		addr = &own.sa;
	}
	struct iv_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->base.ctx = cb;
	l->ch = ch;
	l->user = user;
	l->tag = (struct iv_tag){IV_LISTENER, l};
	int r = 0;
	/* iWARP on port 0: a port the kernel's TCP has free (kernel_free_port), again if another
	 * socket took it meanwhile */
	union dgv_sockaddr base, pick;
	bool any_port = ctx->iwarp && addr && !port_in(addr);
	if (any_port)
		memcpy(&base, addr, addr->sa_family == AF_INET6 ? sizeof base.sin6 : sizeof base.sin);
	for (int tries = 0;; tries++) {
		if (any_port) {
			pick = base;
			pick.sin.sin_port = kernel_free_port(&base.sa);
			addr = &pick.sa;
		}
		if (rdma_create_id(ch->rch, &l->id, &l->tag, RDMA_PS_TCP)) {
			r = -errno;
			free(l);
			return r;
		}
		if (rdma_bind_addr(l->id, (struct sockaddr *)addr))
			r = -errno;
		else if (l->id->verbs && l->id->verbs != ctx->verbs) {
			DG_WARN("ibverbs: %s belongs to device %s, but this context is on %s",
				iv_addr_str(addr, a, sizeof a), ibv_get_device_name(l->id->verbs->device), ctx->dev);
			r = -ENODEV;
		} else if (rdma_listen(l->id, backlog > 0 ? backlog : 16))
			r = -errno;
		if (r != -EADDRINUSE || !any_port || tries >= 7)
			break;
		DG_DBG("ibverbs: listen on %s: port taken meanwhile, another", iv_addr_str(addr, a, sizeof a));
		rdma_destroy_id(l->id);
		r = 0;
	}
	if (r) {
		DG_INFO("ibverbs: listen on %s: %s", iv_addr_str(addr, a, sizeof a), strerror(-r));
		rdma_destroy_id(l->id);
		free(l);
		return r;
	}
	pthread_mutex_lock(&ch->lock);
	ch->users++;
	pthread_mutex_unlock(&ch->lock);
	*out = &l->base;
	return 0;
}

int iv_listener_destroy(struct dgv_listener *lb)
{
	struct iv_listener *l = (struct iv_listener *)lb;
	rdma_destroy_id(l->id);
	pthread_mutex_lock(&l->ch->lock);
	l->ch->users--;
	pthread_mutex_unlock(&l->ch->lock);
	free(l);
	return 0;
}

int iv_listener_addr(struct dgv_listener *lb, union dgv_sockaddr *out, socklen_t *len)
{
	struct iv_listener *l = (struct iv_listener *)lb;
	struct sockaddr *la = rdma_get_local_addr(l->id);
	*len = la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	memcpy(out, la, *len);
	return 0;
}

int iv_conn_req_adopt(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
		      struct dgv_conn_req **out)
{
	DG_WARN("ibverbs: dgv_conn_req_adopt: a device's connections come through rdma_cm, not a TCP socket");
	return -EOPNOTSUPP;
}

int iv_accept(struct dgv_conn_req *rb, struct dgv_pd *pb, const struct dgv_qp_init_attr *attr,
	      const struct dgv_conn_param *param, struct dgv_qp **out)
{
	struct iv_req *req = (struct iv_req *)rb;
	struct iv_ctx *ctx = to_ictx(rb->ctx);
	struct iv_chan *ch = attr->cm_channel ? to_ichan(attr->cm_channel) : ctx->defch;
	struct iv_qp *qp = iv_qp_alloc(to_ipd(pb), attr, ch);
	if (!qp)
		return -ENOMEM;
	int plen = pdata_put(ctx, param ? param->private_data : NULL, param ? param->private_data_len : 0,
			     qp->acc_pdata, ctx->iwarp ? DGV_MAX_PDATA : IB_REP_PDATA, false);
	if (plen < 0) {
		iv_qp_free(qp);
		return -EINVAL;
	}
	req->id->context = &qp->tag;
	int r = qp_attach(qp, req->id, attr);
	if (!r && ch != req->ch && rdma_migrate_id(req->id, ch->rch))
		r = -errno;
	if (r) {
		if (qp->qp) {
			qp->id = NULL;
			iv_cq_del_qp(qp->scq, qp);
			if (qp->rcq != qp->scq)
				iv_cq_del_qp(qp->rcq, qp);
			rdma_destroy_qp(req->id);
			pthread_mutex_lock(&qp->pd->lock);
			qp->pd->nqps--;
			pthread_mutex_unlock(&qp->pd->lock);
			pthread_mutex_lock(&ch->lock);
			ch->users--;
			pthread_mutex_unlock(&ch->lock);
		}
		req->id->context = &req->tag;
		iv_qp_free(qp);
		return r;
	}
	conn_param(ctx, param, &qp->acc);
	/* our IRD/ORD no larger than what the initiator offered to match */
	if (qp->acc.responder_resources > req->info.ord && req->info.ord)
		qp->acc.responder_resources = (uint8_t)req->info.ord;
	if (qp->acc.initiator_depth > req->info.ird)
		qp->acc.initiator_depth = (uint8_t)req->info.ird;
	qp->acc.private_data = plen ? qp->acc_pdata : NULL;
	qp->acc.private_data_len = (uint8_t)plen;
	qp->info = req->info;
	/* rdma_accept on the caller's next call into us (header comment) */
	defer_start(ctx, ch, qp);
	free(req);
	*out = &qp->base;
	return 0;
}

int iv_reject(struct dgv_conn_req *rb, const void *pdata, uint16_t len)
{
	struct iv_req *req = (struct iv_req *)rb;
	struct iv_ctx *ctx = to_ictx(rb->ctx);
	uint8_t buf[DGV_MAX_PDATA + 4];
	int plen = pdata_put(ctx, pdata, len, buf, ctx->iwarp ? DGV_MAX_PDATA : IB_REJ_PDATA, true);
	if (plen < 0)
		return -EINVAL;
	int r = rdma_reject(req->id, plen ? buf : NULL, (uint8_t)plen) ? -errno : 0;
	rdma_destroy_id(req->id);
	free(req);
	return r;
}

/* rdma_disconnect, and the DISCONNECTED nobody else will report. */
static void do_disconnect(struct iv_qp *qp)
{
	struct dgv_qp *qb = &qp->base;
	if (atomic_load(&qp->state) == DGV_QPS_CLOSED)
		return; /* the peer's DISCONNECTED came while we waited for our sends */
	pthread_mutex_lock(&qp->ch->lock);
	qp->disc_called = true;
	int r = rdma_disconnect(qp->id) ? -errno : 0;
	if (qp->peer_closed || r) {
		/* nothing more will come from rdma_cm: report the end ourselves */
		struct dgv_cm_event ev = {.type = DGV_CM_DISCONNECTED, .qp = qb, .user = qp->user};
		chan_push(qp->ch, &ev);
		qp_set_state(qp, DGV_QPS_CLOSED);
		r = 0;
	} else if (atomic_load(&qp->state) != DGV_QPS_ERROR) {
		qp_set_state(qp, DGV_QPS_CLOSING);
	}
	pthread_mutex_unlock(&qp->ch->lock);
}

/*
 * Graceful: rdma_disconnect moves the QP to error at once (IB) and flushes what is still in
 * the send queue, so it waits until every send posted so far has completed (each device send
 * is signaled for this: iv_swr.deliver), at most 5 s; the CQ and CM calls check (run_discs).
 */
int iv_disconnect(struct dgv_qp *qb)
{
	struct iv_qp *qp = to_iqp(qb);
	struct iv_ctx *ctx = to_ictx(qb->ctx);
	if (accept_unlink(ctx, qp)) {
		/* never accepted: refuse it instead (never connected: nothing to say) */
		if (!qp->connecting)
			rdma_reject(qp->id, NULL, 0);
		qp_set_state(qp, DGV_QPS_CLOSED);
		return 0;
	}
	if (qp->disc_called)
		return 0;
	pthread_mutex_lock(&qp->lock);
	bool busy = qp->established && atomic_load(&qp->state) != DGV_QPS_ERROR &&
		    __atomic_load_n(&qp->sdone, __ATOMIC_ACQUIRE) < qp->shead;
	pthread_mutex_unlock(&qp->lock);
	if (!busy) {
		do_disconnect(qp);
		return 0;
	}
	qp->disc_called = true;
	qp->disc_deadline = iv_now_ms() + 5000;
	if (atomic_load(&qp->state) != DGV_QPS_ERROR)
		qp_set_state(qp, DGV_QPS_CLOSING);
	pthread_mutex_lock(&ctx->lock);
	qp->next_disc = ctx->discs;
	ctx->discs = qp;
	atomic_fetch_add(&ctx->naccepts, 1);
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

enum dgv_qp_state iv_qp_state(struct dgv_qp *qb) { return (enum dgv_qp_state)atomic_load(&to_iqp(qb)->state); }

int iv_conn_info(struct dgv_qp *qb, struct dgv_conn_info *out)
{
	struct iv_qp *qp = to_iqp(qb);
	if (!qp->established)
		return -ENOTCONN;
	*out = qp->info;
	return 0;
}
