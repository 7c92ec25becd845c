/*
 * rc_cm.c - RC queue pairs of the soft RNIC, connection management: standard iWARP over one
 * kernel TCP connection, set up and torn down in the manner of rdma_cm.
 *
 *   channels and events; listeners and pending requests (the passive side reads the MPA
 *   Request); connect, accept, reject, disconnect; the MPA exchange (RFC 5044 with the
 *   enhanced connection set-up of RFC 6581: revision 2, IRD/ORD word, peer-to-peer RTR);
 *   progress of a QP (set-up, then rc_rx.c and rc_tx.c); teardown (rc_fail, rc_closed).
 *
 * rc_int.h describes the split and the locks.
 */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "mpa.h"
#include "rc_int.h"

struct soft_cm_channel {
	struct dgv_cm_channel base;
	pthread_mutex_t lock;
	int efd;                 /* EFD_SEMAPHORE: readable while events are queued; -1 when on_cq */
	struct soft_cq *on_cq;   /* dgv_cm_create_channel_on_cq: events kick this CQ's descriptor */
	struct dgv_cm_event *q;  /* ring */
	uint32_t cap, head, count;
	atomic_int refs;         /* QPs, listeners and requests reporting here */
	struct rc_conn *conns;   /* the QPs reporting here (rc_conn ch_next), under cm->lock */
	struct soft_cm_channel *next;
};

struct soft_listener {
	struct dgv_listener base;
	struct soft_ctx *ctx;
	int fd;
	bool own_fd;
	struct soft_cm_channel *ch;
	void *user;
	ev_io io;
	bool io_on;
	struct soft_listener *next;
};

enum req_state { REQ_READING = 0, REQ_READY, REQ_FAILED };

struct soft_conn_req {
	struct dgv_conn_req base;
	struct soft_ctx *ctx;
	int fd;
	bool own_fd;
	enum req_state state;
	struct soft_cm_channel *ch;
	void *user;
	struct soft_listener *listener; /* NULL when adopted */
	uint64_t deadline_us;
	uint8_t buf[MPA_RR_MAX];
	uint32_t got, need;
	struct mpa_rr rr;
	ev_io io;
	bool io_on;
	bool watched; /* its watcher was started once: the descriptor may still be in libev's set */
	/* adopted on a channel made on a CQ: read only by that channel's caller (get_event,
	 * cm_wait), who then needs no descriptor of ours to wait on */
	bool app_read;
	struct soft_conn_req *next;
};

struct rc_cm {
	pthread_mutex_t lock;
	struct soft_cm_channel *def;
	struct soft_cm_channel *channels;
	struct soft_listener *listeners;
	struct soft_conn_req *reqs;
	struct rc_conn *conns; /* every RC QP of the context */
};

/* ------------------------------------------------------------------ channels */

/* Queues ev on ch (copy). Caller may hold a QP lock or cm->lock. Returns 0 or -ENOMEM. */
static int ch_push(struct soft_cm_channel *ch, const struct dgv_cm_event *ev)
{
	pthread_mutex_lock(&ch->lock);
	if (ch->count == ch->cap) {
		uint32_t ncap = ch->cap ? ch->cap * 2 : 4;
		struct dgv_cm_event *nq = malloc(ncap * sizeof *nq);
		if (!nq) {
			pthread_mutex_unlock(&ch->lock);
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < ch->count; i++)
			nq[i] = ch->q[(ch->head + i) % ch->cap];
		free(ch->q);
		ch->q = nq;
		ch->cap = ncap;
		ch->head = 0;
	}
	ch->q[(ch->head + ch->count) % ch->cap] = *ev;
	/* count is peeked without the lock (soft_cm_pending, soft_cm_get_event, soft_cm_wait):
	 * every change is an atomic store, release so a peek that sees the event sees it written */
	__atomic_store_n(&ch->count, ch->count + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ch->lock);
	if (ch->on_cq) {
		soft_cq_kick(ch->on_cq);
		return 0;
	}
	uint64_t one = 1;
	ssize_t w = write(ch->efd, &one, sizeof one);
	(void)w;
	return 0;
}

/* Drops queued events about qp or req (they are being freed). */
static void ch_purge(struct soft_cm_channel *ch, const struct dgv_qp *qp, const struct dgv_conn_req *req)
{
	pthread_mutex_lock(&ch->lock);
	uint32_t kept = 0, dropped = 0;
	for (uint32_t i = 0; i < ch->count; i++) {
		struct dgv_cm_event *e = &ch->q[(ch->head + i) % ch->cap];
		if ((qp && e->qp == qp) || (req && e->req == req)) {
			dropped++;
			continue;
		}
		ch->q[(ch->head + kept) % ch->cap] = *e;
		kept++;
	}
	__atomic_store_n(&ch->count, kept, __ATOMIC_RELEASE); /* peeked unlocked: ch_push */
	pthread_mutex_unlock(&ch->lock);
	for (uint32_t i = 0; i < dropped && ch->efd >= 0; i++) {
		uint64_t v;
		ssize_t r = read(ch->efd, &v, sizeof v);
		(void)r;
	}
}

/* An empty channel (not yet listed in the context), signalling through on_cq's descriptor or
 * (NULL) an eventfd of its own. Returns NULL without memory or eventfd. */
static struct soft_cm_channel *ch_new(struct soft_ctx *ctx, struct soft_cq *on_cq)
{
	struct soft_cm_channel *ch = calloc(1, sizeof *ch);
	if (!ch)
		return NULL;
	ch->base.ctx = &ctx->base;
	ch->on_cq = on_cq;
	ch->efd = on_cq ? -1 : eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->efd < 0 && !on_cq) {
		free(ch);
		return NULL;
	}
	pthread_mutex_init(&ch->lock, NULL);
	return ch;
}

static void ch_free(struct soft_cm_channel *ch)
{
	if (ch->efd >= 0)
		close(ch->efd);
	free(ch->q);
	pthread_mutex_destroy(&ch->lock);
	free(ch);
}

static int channel_add(struct soft_ctx *ctx, struct soft_cq *on_cq, struct dgv_cm_channel **out)
{
	struct soft_cm_channel *ch = ch_new(ctx, on_cq);
	if (!ch)
		return -ENOMEM;
	pthread_mutex_lock(&ctx->cm->lock);
	ch->next = ctx->cm->channels;
	ctx->cm->channels = ch;
	pthread_mutex_unlock(&ctx->cm->lock);
	*out = &ch->base;
	return 0;
}

int soft_cm_create_channel(struct dgv_context *cb, struct dgv_cm_channel **out)
{
	return channel_add(to_sctx(cb), NULL, out);
}

int soft_cm_create_channel_on_cq(struct dgv_context *cb, struct dgv_cq *cq, struct dgv_cm_channel **out)
{
	return channel_add(to_sctx(cb), to_scq(cq), out);
}

int soft_cm_destroy_channel(struct dgv_cm_channel *cb)
{
	struct soft_cm_channel *ch = (struct soft_cm_channel *)cb;
	struct rc_cm *cm = to_sctx(cb->ctx)->cm;
	if (ch == cm->def)
		return -EINVAL; /* destroyed with the context */
	pthread_mutex_lock(&cm->lock);
	if (atomic_load(&ch->refs)) {
		pthread_mutex_unlock(&cm->lock);
		return -EBUSY;
	}
	for (struct soft_cm_channel **p = &cm->channels; *p; p = &(*p)->next)
		if (*p == ch) {
			*p = ch->next;
			break;
		}
	pthread_mutex_unlock(&cm->lock);
	ch_free(ch);
	return 0;
}

struct dgv_cm_channel *soft_cm_default_channel(struct dgv_context *cb)
{
	return &to_sctx(cb)->cm->def->base;
}

int soft_cm_channel_fd(struct dgv_cm_channel *cb)
{
	struct soft_cm_channel *ch = (struct soft_cm_channel *)cb;
	return ch->on_cq ? soft_cq_fd(&ch->on_cq->base) : ch->efd;
}

static struct soft_cm_channel *ch_or_default(struct soft_ctx *ctx, struct dgv_cm_channel *ch)
{
	return ch ? (struct soft_cm_channel *)ch : ctx->cm->def;
}

/* ------------------------------------------------------------------ helpers */

static inline uint64_t rc_now(struct soft_qp *qp)
{
	if (!qp->now_us)
		qp->now_us = dg_now_us();
	return qp->now_us;
}

static void set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void fill_addrs(int fd, struct dgv_conn_info *info)
{
	info->local_len = sizeof info->local;
	if (getsockname(fd, &info->local.sa, &info->local_len))
		info->local_len = 0;
	info->peer_len = sizeof info->peer;
	if (getpeername(fd, &info->peer.sa, &info->peer_len))
		info->peer_len = 0;
}

static bool env_crc_default(void)
{
	return dg_env_word(DG_ENV_MPA_CRC) != DG_OFF; /* a bad value (said once) keeps CRCs on */
}

/* rc_int.h. */
void rc_event(struct soft_qp *qp, enum dgv_cm_event_type type, int status,
	      const uint8_t *pdata, uint16_t pdlen)
{
	struct rc_conn *rc = qp->rc;
	struct dgv_cm_event ev;
	memset(&ev, 0, sizeof ev);
	ev.type = type;
	ev.status = status;
	ev.qp = &qp->base;
	ev.user = rc->user;
	ev.info = rc->info;
	if (pdlen) {
		ev.pdata_len = pdlen;
		memcpy(ev.pdata, pdata, pdlen);
	}
	ev.term_layer = rc->term_l;
	ev.term_etype = rc->term_t;
	ev.term_ecode = rc->term_c;
	ch_push(rc->ch, &ev);
}

/* rc_int.h. */
void rc_errq_put(struct soft_qp *qp, uint8_t l, uint8_t t, uint8_t c, bool remote, uint8_t opcode,
		 uint32_t msn, uint32_t stag, uint64_t to, uint32_t len)
{
	if (qp->errq_count == SOFT_ERRQ) {
		qp->errq_head = (qp->errq_head + 1) % SOFT_ERRQ;
		qp->errq_count--;
		qp->st.errq_overflows++;
	}
	struct dgv_async_err *e = &qp->x->errq[(qp->errq_head + qp->errq_count) % SOFT_ERRQ];
	*e = (struct dgv_async_err){.layer = l, .etype = t, .ecode = c, .remote = remote, .opcode = opcode,
				    .msn = msn, .stag = stag, .to = to, .length = len, .peer = qp->rc->info.peer};
	qp->errq_count++;
}

/* Every outstanding work request completes with WR_FLUSH_ERR, except first_status for the
 * oldest send WQE already (partly) transmitted when a Terminate names it. qp->lock held. */
void rc_flush_all(struct soft_qp *qp, enum dgv_wc_status first_status)
{
	struct rc_conn *rc = qp->rc;
	bool first = first_status != DGV_WC_WR_FLUSH_ERR;
	for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++) {
		struct soft_swqe *w = soft_sq_at(qp, i);
		if (w->done)
			continue;
		if (first && (w->read_ord || w->sent)) {
			rc_sq_done(qp, i, first_status, 0);
			first = false;
		} else {
			rc_sq_done(qp, i, DGV_WC_WR_FLUSH_ERR, 0);
		}
	}
	qp->sq_pump = qp->sq_tail;
	rc->cur = 0;
	for (uint32_t i = 0; i < SOFT_MAX_ORD; i++)
		qp->x->ord[i].used = false;
	qp->ord_count = 0;
	for (uint32_t i = 0; i < SOFT_MAX_IRD; i++)
		qp->x->ird[i].used = false;
	qp->ird_count = 0;
	rc->ird_unbuilt = 0;
	if (rc->rcv_active) {
		rc_recv_done(qp, rc->rcv, DGV_WC_WR_FLUSH_ERR, 0, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
	}
	struct soft_rwqe w;
	while (soft_rq_pop(qp, &w))
		rc_recv_done(qp, &w, DGV_WC_WR_FLUSH_ERR, 0, 0, 0, 0);
}

/* ------------------------------------------------------------------ QP objects */

static void conn_list_add(struct soft_ctx *ctx, struct rc_conn *rc)
{
	pthread_mutex_lock(&ctx->cm->lock);
	if ((rc->next = ctx->cm->conns))
		rc->next->pprev = &rc->next;
	rc->pprev = &ctx->cm->conns;
	ctx->cm->conns = rc;
	if ((rc->ch_next = rc->ch->conns))
		rc->ch_next->ch_pprev = &rc->ch_next;
	rc->ch_pprev = &rc->ch->conns;
	rc->ch->conns = rc;
	pthread_mutex_unlock(&ctx->cm->lock);
}

static void conn_list_remove(struct soft_ctx *ctx, struct rc_conn *rc)
{
	pthread_mutex_lock(&ctx->cm->lock);
	if (rc->pprev) {
		if ((*rc->pprev = rc->next))
			rc->next->pprev = rc->pprev;
		if ((*rc->ch_pprev = rc->ch_next))
			rc->ch_next->ch_pprev = rc->ch_pprev;
		rc->pprev = rc->ch_pprev = NULL;
	}
	pthread_mutex_unlock(&ctx->cm->lock);
}

/* Frees an RC QP that is in no list any more; closes its descriptor only if it is ours. */
static void rc_qp_free(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc) {
		dg_spare_put(DG_SPARE_RC_RXBUF, rc->rxb, RC_RXBUF);
		dg_spare_put(DG_SPARE_RC_BATCH, rc->bt, sizeof *rc->bt);
		free(rc->rx_flat);
		free(rc->flat);
		free(rc->marked);
		free(rc->spill);
		dg_small_free(rc->hs, sizeof *rc->hs);
		dg_small_free(rc->term_fpdu, RC_TERM_FPDU);
		dg_small_free(rc->rcv, sizeof *rc->rcv);
		dg_small_free(rc, sizeof *rc);
	}
	if (qp->own_fd && qp->fd >= 0)
		close(qp->fd);
	soft_sq_free(qp);
	soft_rq_free(qp);
	pthread_mutex_destroy(&qp->lock);
	soft_qp_release(qp);
}

/* Applies a connection parameter block (NULL: defaults) to what this side asks for. */
static void apply_param(struct rc_conn *rc, const struct dgv_conn_param *p)
{
	rc->want_rev = p && p->mpa_rev ? p->mpa_rev : 2;
	rc->want_crc = p && p->crc >= 0 ? p->crc == 1 : env_crc_default();
	rc->want_markers = p && p->markers == 1;
	rc->want_ird = p && p->ird ? (p->ird > SOFT_MAX_IRD ? SOFT_MAX_IRD : p->ird) : SOFT_MAX_IRD;
	rc->want_ord = p && p->ord ? (p->ord > SOFT_MAX_ORD ? SOFT_MAX_ORD : p->ord) : SOFT_MAX_ORD;
	uint32_t tmo = p && p->timeout_ms ? p->timeout_ms : RC_TIMEOUT_MS;
	rc->deadline_us = dg_now_us() + (uint64_t)tmo * 1000;
	rc->pd_len = p ? p->private_data_len : 0;
	if (rc->pd_len)
		memcpy(rc->hs->pdata, p->private_data, rc->pd_len);
}

/* Makes an RC QP on fd (not yet in the context's lists). Returns 0 or -errno. */
static int rc_qp_new(struct dgv_pd *pdb, const struct dgv_qp_init_attr *a, int fd, bool own_fd,
		     struct soft_qp **out)
{
	if (a->max_sge > SOFT_MAX_SGE)
		return -EINVAL;
	struct soft_qp *qp = soft_qp_alloc(true); /* its fields a small object, the rest apart */
	/* its scalars only (the batch is rc_tx.c's while it is used): two to a page, not the
	 * program's heap */
	_Static_assert(sizeof(struct rc_conn) <= DG_SMALL_MAX, "rc_conn fits dg_small_alloc");
	_Static_assert(sizeof(struct rc_hs) <= DG_SMALL_MAX, "rc_hs fits dg_small_alloc");
	struct rc_conn *rc = dg_small_alloc(sizeof *rc);
	struct rc_hs *hs = dg_small_alloc(sizeof *hs);
	if (!qp || !rc || !hs) {
		soft_qp_release(qp);
		dg_small_free(rc, sizeof *rc);
		dg_small_free(hs, sizeof *hs);
		return -ENOMEM;
	}
	rc->hs = hs;
	qp->base.ctx = pdb->ctx;
	qp->base.type = DGV_QPT_RC;
	qp->ctx = to_sctx(pdb->ctx);
	qp->pd = to_spd(pdb);
	qp->scq = to_scq(a->send_cq);
	qp->rcq = to_scq(a->recv_cq);
	qp->fd = fd;
	qp->own_fd = own_fd;
	qp->rx_app = a->rx_hold != 0;
	qp->rc = rc;
	rc->qp = qp;
	pthread_mutex_init(&qp->lock, NULL);
	qp->max_msg = a->max_msg_size ? a->max_msg_size : RC_DEFAULT_MAX_MSG;
	qp->max_sge = a->max_sge ? a->max_sge : 4;
	qp->sq_max = a->max_send_wr ? a->max_send_wr : RC_DEFAULT_WR;
	qp->sq_cap = qp->sq_max > SOFT_RC_SQ_SMALL ? SOFT_RC_SQ_SMALL : qp->sq_max;
	qp->rq_cap = a->max_recv_wr ? a->max_recv_wr : RC_DEFAULT_WR;
	soft_sq_alloc(qp);
	soft_rq_alloc(qp);
	/* rc->rxb: only while bytes wait in it (dg_spare_get) */
	rc->ch = ch_or_default(qp->ctx, a->cm_channel);
	rc->user = a->cm_user;
	rc->state = DGV_QPS_CONNECTING;
	rc->msn_send = rc->msn_read = rc->msn_term = 1;
	rc->exp_msn[0] = rc->exp_msn[1] = rc->exp_msn[2] = 1;
	if (!qp->sq || !qp->rq) {
		rc_qp_free(qp);
		return -ENOMEM;
	}
	int err = soft_cq_attach(qp->scq, qp);
	if (!err && qp->rcq != qp->scq && (err = soft_cq_attach(qp->rcq, qp)))
		soft_cq_detach(qp->scq, qp);
	if (err) {
		qp->fd = -1; /* the caller decides about the descriptor */
		rc_qp_free(qp);
		return err;
	}
	atomic_fetch_add(&rc->ch->refs, 1);
	atomic_fetch_add(&qp->pd->refs, 1);
	*out = qp;
	return 0;
}

/* Publishes a new QP: progress by the CQs, the libev thread and cm_wait. */
static void rc_qp_publish(struct soft_qp *qp)
{
	conn_list_add(qp->ctx, qp->rc);
	soft_ctx_add_qp(qp->ctx, qp);
}

bool soft_rc_fd_watched(const struct soft_qp *qp)
{
	return qp->rc->fd_watched;
}

int soft_rc_destroy(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	soft_ctx_remove_qp(qp->ctx, qp);
	conn_list_remove(qp->ctx, rc);
	pthread_mutex_lock(&qp->lock);
	if (!rc->ended) {
		__atomic_store_n(&rc->ended, true, __ATOMIC_RELAXED); /* read unlocked: cm_drive */
		rc->state = DGV_QPS_ERROR;
	}
	rc_flush_all(qp, DGV_WC_WR_FLUSH_ERR);
	/* the batch may point into the program's buffers: nothing more is sent from them */
	rc_batch_reset(rc);
	soft_qp_unlock(qp);
	soft_qp_quiesce(qp);
	ch_purge(rc->ch, &qp->base, NULL);
	atomic_fetch_sub(&rc->ch->refs, 1);
	atomic_fetch_sub(&qp->pd->refs, 1);
	rc_qp_free(qp);
	return 0;
}

/* ------------------------------------------------------------------ connection end */

/* The connection is over in order: both directions closed. qp->lock held. */
void rc_closed(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		return;
	__atomic_store_n(&rc->ended, true, __ATOMIC_RELAXED); /* read unlocked: cm_drive */
	rc->state = DGV_QPS_CLOSED;
	rc_flush_all(qp, DGV_WC_WR_FLUSH_ERR);
	__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
	rc_event(qp, DGV_CM_DISCONNECTED, 0, NULL, 0);
}


/*
 * Ends the connection with an error: QP to ERROR, work requests flushed, the event queued
 * (CONNECT_ERROR before ESTABLISHED, DISCONNECTED after). why: the RFC triple (NULL: none, a
 * TCP error). send_term: a Terminate naming the offending segment (off_hdr, its DDP header and
 * RDMAP header, off_hlen bytes; seg_len the segment's length) goes out first, then our
 * direction is shut. qp->lock held.
 */
void rc_fail(struct soft_qp *qp, int err, const struct dg_reject *why, bool send_term,
	     const uint8_t *off_hdr, uint32_t off_hlen, uint32_t seg_len)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		return;
	__atomic_store_n(&rc->ended, true, __ATOMIC_RELAXED); /* read unlocked: cm_drive */
	rc->state = DGV_QPS_ERROR;
	if (why) {
		rc->term_l = why->layer;
		rc->term_t = why->etype;
		rc->term_c = why->ecode;
		if (send_term)
			rc_errq_put(qp, why->layer, why->etype, why->ecode, false, 0, 0, 0, 0, seg_len);
	}
	__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
	if (send_term && why && rc->phase >= PH_WAIT_RTR) {
		rc_tx_terminate(qp, why, off_hdr, off_hlen, seg_len);
	} else if (rc->phase >= PH_TX_REQ) {
		rc_batch_reset(rc);
		shutdown(qp->fd, SHUT_WR);
	} else {
		rc_batch_reset(rc);
	}
	enum dgv_wc_status first = DGV_WC_WR_FLUSH_ERR;
	if (why && !send_term) /* a peer's Terminate: the oldest operation it refers to */
		first = (why->layer == TERM_LAYER_DDP && why->etype == DDP_ETYPE_TAGGED_BUF) ||
				(why->layer == TERM_LAYER_RDMAP && why->etype == RDMAP_ETYPE_REMOTE_PROT)
			? DGV_WC_REM_ACCESS_ERR : DGV_WC_REM_OP_ERR;
	rc_flush_all(qp, first);
	rc_event(qp, rc->established ? DGV_CM_DISCONNECTED : DGV_CM_CONNECT_ERROR, err, NULL, 0);
	if (rc->term_pending)
		rc_tx_pump(qp);
}

/* ------------------------------------------------------------------ connection set-up */

/* Once the MPA exchange has fixed markers and CRC: the MULPDU we send and the largest ULPDU we
 * accept, and the marker buffers if markers are on. */
static void init_stream(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int mss = 0;
	socklen_t l = sizeof mss;
	if (getsockopt(qp->fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) || mss <= 0)
		mss = 1460;
	rc->mulpdu = mpa_mulpdu((uint32_t)mss, rc->info.markers_tx);
	/* The MSS read now may be bounded by half of the peer's still small window (Linux
	 * tcp_bound_to_half_wnd) and grows later, and so does the peer's: Linux siw was seen
	 * sending 34518-byte ULPDUs on a 64 KiB-MTU loopback, more than our set-up MSS. Accept
	 * what the largest segment of the path could carry: MTU less IP and TCP headers. */
	uint32_t rx_mss = (uint32_t)mss;
	int mtu = 0;
	l = sizeof mtu;
	if (getsockopt(qp->fd, IPPROTO_IP, IP_MTU, &mtu, &l) == 0 && mtu > 40)
		rx_mss = (uint32_t)mtu - 40;
	else if (l = sizeof mtu, getsockopt(qp->fd, IPPROTO_IPV6, IPV6_MTU, &mtu, &l) == 0 && mtu > 60)
		rx_mss = (uint32_t)mtu - 60;
	if (rx_mss < (uint32_t)mss)
		rx_mss = (uint32_t)mss;
	rc->rx_max_ulpdu = mpa_mulpdu(rx_mss, false);
	if (rc->info.markers_tx) {
		rc->flat = malloc(RC_FLAT);
		rc->marked = malloc(RC_FLAT);
	}
	if (rc->info.markers_rx)
		rc->rx_flat = malloc(RC_FLAT);
}

/* ESTABLISHED: posted work requests start flowing. */
void rc_become_rts(struct soft_qp *qp, const uint8_t *pdata, uint16_t pdlen)
{
	struct rc_conn *rc = qp->rc;
	rc->phase = PH_RTS;
	rc->state = rc->want_close ? DGV_QPS_CLOSING : DGV_QPS_RTS;
	rc->established = true;
	rc_event(qp, DGV_CM_ESTABLISHED, 0, pdata, pdlen);
}

/* Sends the rest of rc->mpa_out. Returns 1 when all sent, 0 when TCP is full, -errno. */
static int mpa_send(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	while (rc->mpa_out_sent < rc->mpa_out_len) {
		struct iovec v = {rc->hs->mpa_out + rc->mpa_out_sent, rc->mpa_out_len - rc->mpa_out_sent};
		ssize_t n = rc_send_some(qp, &v, 1);
		if (n <= 0)
			return (int)n;
		rc->mpa_out_sent += (uint32_t)n;
	}
	/* the frame is all in TCP: nothing builds one again (a Reject is built on the stack) */
	dg_small_free(rc->hs, sizeof *rc->hs);
	rc->hs = NULL;
	__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
	return 1;
}

/* The connection set-up failed: logged (a protocol error loudly), then rc_fail. qp->lock held. */
static void setup_fail(struct soft_qp *qp, int err, const char *cause)
{
	if (err == -EPROTO)
		DG_ERR("RC connection on fd %d: %s", qp->fd, cause);
	else
		DG_WARN("RC connection on fd %d: %s (%s)", qp->fd, cause, strerror(-err));
	rc_fail(qp, err, NULL, false, NULL, 0, 0);
}

/* Initiator: the MPA Reply is complete in rxb[0..len). */
static void process_reply(struct soft_qp *qp, uint32_t len)
{
	struct rc_conn *rc = qp->rc;
	struct mpa_rr rr;
	const char *why;
	if (mpa_rr_parse(rc->rxb, len, false, &rr, &why)) {
		setup_fail(qp, -EPROTO, why);
		return;
	}
	if (rr.flags & MPA_FLAG_R) {
		DG_WARN("RC connection on fd %d: rejected by the peer", qp->fd);
		__atomic_store_n(&rc->ended, true, __ATOMIC_RELAXED); /* read unlocked: cm_drive */
		rc->state = DGV_QPS_ERROR;
		__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
		rc_flush_all(qp, DGV_WC_WR_FLUSH_ERR);
		rc_event(qp, DGV_CM_REJECTED, -ECONNREFUSED, rr.pdata, rr.pd_len);
		return;
	}
	if (rr.rev > rc->want_rev) {
		setup_fail(qp, -EPROTO, "MPA Reply with a higher revision than the Request");
		return;
	}
	rc->info.mpa_rev = rr.rev;
	rc->info.crc = rc->want_crc || (rr.flags & MPA_FLAG_C);
	rc->info.markers_rx = rc->want_markers;
	rc->info.markers_tx = rr.flags & MPA_FLAG_M;
	rc->info.ird = rc->want_ird;
	rc->info.ord = rc->want_ord;
	if (rr.enhanced) {
		uint16_t pird = rr.ird & MPA_V2_MASK, pord = rr.ord & MPA_V2_MASK;
		if (pird < rc->info.ord)
			rc->info.ord = pird; /* never more Reads in flight than the peer takes */
		if (pord > rc->info.ird)
			rc->info.ird = pord > SOFT_MAX_IRD ? SOFT_MAX_IRD : pord;
		if (rr.ird & MPA_V2_IRD_P2P) {
			rc->p2p = true;
			if (rr.ord & MPA_V2_ORD_WRITE_RTR)
				rc->rtr = RTR_WRITE;
			else if (rr.ord & MPA_V2_ORD_READ_RTR)
				rc->rtr = RTR_READ;
			else if (rr.ird & MPA_V2_IRD_SEND_RTR)
				rc->rtr = RTR_SEND;
			else {
				setup_fail(qp, -EPROTO, "peer-to-peer Reply names no RTR type we offered");
				return;
			}
			rc->rtr_pending = true;
		}
	} else if (rc->want_rev == 2 && rr.rev == 2) {
		setup_fail(qp, -EPROTO, "revision 2 Reply without the enhanced (E) flag");
		return;
	}
	init_stream(qp);
	/* bytes after the Reply are the first FPDUs */
	rc->rx_start = len;
	rc_become_rts(qp, rr.pdata, rr.pd_len);
}

/* Connection set-up steps. Returns >0 when something moved. */
static int setup_step(struct soft_qp *qp, bool decide)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	if (rc->pending_err && !decide)
		return 0;
	if (rc->pending_err) {
		setup_fail(qp, rc->pending_err, "TCP connect failed");
		return 1;
	}
	if (rc->phase == PH_TCP) {
		struct pollfd p = {.fd = qp->fd, .events = POLLOUT};
		if (poll(&p, 1, 0) <= 0) {
			__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
			return 0;
		}
		int soerr = 0;
		socklen_t l = sizeof soerr;
		if (!decide && (p.revents & (POLLHUP | POLLERR)))
			return 0; /* the program's next call reads the failure (and consumes SO_ERROR) */
		if (getsockopt(qp->fd, SOL_SOCKET, SO_ERROR, &soerr, &l) == 0 && soerr) {
			setup_fail(qp, -soerr, "TCP connect failed");
			return 1;
		}
		fill_addrs(qp->fd, &rc->info);
		if (!rc->info.peer_len) {
			if (p.revents & (POLLHUP | POLLERR)) {
				setup_fail(qp, -ENOTCONN, "TCP socket is not connected");
				return 1;
			}
			__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
			return 0;
		}
		set_nodelay(qp->fd);
		qp->local = rc->info.local;
		qp->locallen = rc->info.local_len;
		uint8_t flags = (rc->want_crc ? MPA_FLAG_C : 0) | (rc->want_markers ? MPA_FLAG_M : 0);
		struct mpa_v2_word v2 = {htobe16((uint16_t)(rc->want_ird | MPA_V2_IRD_P2P)),
					 htobe16((uint16_t)(rc->want_ord | MPA_V2_ORD_WRITE_RTR | MPA_V2_ORD_READ_RTR))};
		rc->mpa_out_len = (uint32_t)mpa_rr_build(rc->hs->mpa_out, true, flags, rc->want_rev,
							 rc->want_rev == 2 ? &v2 : NULL, rc->hs->pdata, rc->pd_len);
		rc->phase = PH_TX_REQ;
		__atomic_store_n(&qp->tcp_wait, false, __ATOMIC_RELAXED);
		did = 1;
	}
	if (rc->phase == PH_TX_REQ || rc->phase == PH_TX_REP) {
		int r = mpa_send(qp);
		if (r < 0 && !decide)
			return did; /* the socket reports the error to the program's wait */
		if (r < 0) {
			setup_fail(qp, r, "sending the MPA frame failed");
			return 1;
		}
		if (r == 0)
			return did;
		did = 1;
		if (rc->phase == PH_TX_REQ) {
			rc->phase = PH_RX_REP;
			rc->rx_start = rc->rx_end = 0;
		} else if (rc->p2p) {
			rc->phase = PH_WAIT_RTR;
		} else {
			/* Without peer-to-peer mode the initiator speaks first: the program may post
			 * now, its FPDUs leave once the initiator's first has arrived. */
			rc->hold_first = true;
			rc_become_rts(qp, NULL, 0);
		}
	}
	if (rc->phase == PH_RX_REP && decide) {
		/* read exactly the Reply (its header, then the rest): a Reject that keeps TCP
		 * (dgv_reject_keep) leaves the peer's next bytes to whoever reads the socket
		 * after us, as plain TCP */
		for (;;) {
			uint32_t need = MPA_RR_HLEN;
			if (rc->rx_end >= MPA_RR_HLEN) {
				const char *why;
				int n = mpa_rr_check_hdr(rc->rxb, false, &why);
				if (n < 0) {
					setup_fail(qp, -EPROTO, why);
					return 1;
				}
				need = (uint32_t)n;
			}
			if (rc->rx_end >= need) {
				process_reply(qp, need);
				return 1;
			}
			if (!rc->rxb && !(rc->rxb = dg_spare_get(DG_SPARE_RC_RXBUF, RC_RXBUF))) {
				setup_fail(qp, -ENOMEM, "no memory for the MPA Reply");
				return 1;
			}
			ssize_t n = recv(qp->fd, rc->rxb + rc->rx_end, need - rc->rx_end, MSG_DONTWAIT);
			if (n > 0) {
				rc->rx_end += (uint32_t)n;
				did = 1;
				continue;
			}
			if (n == 0) {
				setup_fail(qp, -ECONNRESET, "peer closed the connection before the MPA Reply");
				return 1;
			}
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				setup_fail(qp, -errno, "receiving the MPA Reply failed");
				return 1;
			}
			break;
		}
	}
	return did;
}

int soft_rc_progress(struct soft_qp *qp, bool from_app, bool block)
{
	if (from_app)
		atomic_store_explicit(&qp->app_polls, atomic_load_explicit(&qp->app_polls, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	/* rx_app: the program's call must read what its wait was woken for, even if the thread
	 * holds the lock for a moment (its tick looks at every QP): the edge that woke it is
	 * not given again */
	if (block || (from_app && qp->rx_app))
		pthread_mutex_lock(&qp->lock);
	else if (pthread_mutex_trylock(&qp->lock))
		return -EBUSY;
	struct rc_conn *rc = qp->rc;
	qp->now_us = 0;
	int did = 0;
	/* rx_app: the thread reads nothing and decides nothing (a failure, a timeout: the
	 * program's waits watch the socket alone); it sends the MPA Request once TCP is up, and
	 * what TCP refused before (tx_refused: that CQ has an eventfd from then on) */
	bool decide = from_app || !qp->rx_app;
	if (!rc->ended) {
		if (rc->phase < PH_WAIT_RTR)
			did |= setup_step(qp, decide);
		if (!rc->ended && rc->phase >= PH_WAIT_RTR) {
			if (decide) {
				int got = rc_rx_pump(qp);
				did |= got;
				/* a send failed: the peer's last bytes read (above, until its end), then
				 * the failure */
				if (rc->tx_err && !rc->ended && !qp->rx_claimed && !got)
					rc_fail(qp, rc->tx_err, NULL, false, NULL, 0, 0);
			}
			if (rc_tx_owed(qp) && (decide || __atomic_load_n(&qp->tx_refused, __ATOMIC_ACQUIRE)))
				did |= rc_tx_pump(qp);
		}
		if (decide && !rc->ended && rc->phase < PH_RTS && rc_now(qp) >= rc->deadline_us)
			setup_fail(qp, -ETIMEDOUT, "MPA exchange timed out");
	} else if (rc->b_bytes || rc->term_pending) {
		rc_tx_pump(qp); /* the Terminate still going out */
	}
	soft_qp_unlock(qp);
	return did;
}

bool soft_rc_wants_pollout(struct soft_qp *qp)
{
	return __atomic_load_n(&qp->pump_blocked, __ATOMIC_RELAXED);
}

bool soft_rc_timers_pending(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (qp->rx_app && !__atomic_load_n(&qp->tx_refused, __ATOMIC_RELAXED))
		return !rc->ended && rc->phase == PH_TCP; /* the thread's only part: the MPA Request */
	/* everything soft_rc_progress would send without news from the peer */
	return (!rc->ended && rc->phase < PH_RTS) || qp->pump_blocked || rc_tx_owed(qp);
}

uint64_t soft_rc_next_timer_locked(struct soft_qp *qp, uint64_t now)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended || rc->phase >= PH_RTS)
		return UINT64_MAX;
	return rc->deadline_us > now ? rc->deadline_us - now : 0;
}

/* ------------------------------------------------------------------ verbs on RC QPs */

int soft_rc_disconnect(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	struct rc_conn *rc = qp->rc;
	pthread_mutex_lock(&qp->lock);
	int ret = 0;
	if (rc->ended) {
		ret = -ENOTCONN;
	} else if (!rc->want_close) {
		rc->want_close = true;
		if (rc->phase == PH_RTS)
			rc->state = DGV_QPS_CLOSING;
		if (rc->phase == PH_RTS)
			rc_tx_pump(qp);
	}
	soft_qp_unlock(qp);
	soft_qp_progress(qp, true, true);
	return ret;
}

enum dgv_qp_state soft_rc_qp_state(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	enum dgv_qp_state s = qp->rc->state;
	soft_qp_unlock(qp);
	return s;
}

int soft_rc_conn_info(struct dgv_qp *qpb, struct dgv_conn_info *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	int ret = qp->rc->established ? 0 : -ENOTCONN;
	if (!ret)
		*out = qp->rc->info;
	soft_qp_unlock(qp);
	return ret;
}

int soft_rc_connect(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
		    socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out)
{
	int fd;
	bool own = !attr->use_adopt_fd;
	int pending = 0;
	if (own) {
		fd = socket(dst->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (attr->bind_addr && bind(fd, attr->bind_addr, attr->bind_len)) {
			int err = -errno;
			close(fd);
			return err;
		}
		set_nodelay(fd);
		if (connect(fd, dst, dstlen) && errno != EINPROGRESS)
			pending = -errno;
	} else {
		fd = attr->adopt_fd;
		int type = 0;
		socklen_t l = sizeof type;
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) || type != SOCK_STREAM)
			return -ENOTSOCK;
	}
	struct soft_qp *qp;
	int err = rc_qp_new(pd, attr, fd, own, &qp);
	if (err) {
		if (own)
			close(fd);
		return err;
	}
	struct rc_conn *rc = qp->rc;
	rc->active = true;
	__atomic_store_n(&qp->tcp_wait, true, __ATOMIC_RELAXED);
	rc->pending_err = pending;
	apply_param(rc, param);
	qp->locallen = sizeof qp->local;
	getsockname(fd, &qp->local.sa, &qp->locallen);
	rc_qp_publish(qp);
	*out = &qp->base;
	soft_qp_progress(qp, true, true);
	return 0;
}

/* ------------------------------------------------------------------ passive side */

static void req_event(struct soft_conn_req *r, enum dgv_cm_event_type type, int status)
{
	struct dgv_cm_event ev;
	memset(&ev, 0, sizeof ev);
	ev.type = type;
	ev.status = status;
	ev.req = type == DGV_CM_CONNECT_REQUEST || !r->listener ? &r->base : NULL;
	ev.listener = r->listener ? &r->listener->base : NULL;
	ev.user = r->user;
	if (type == DGV_CM_CONNECT_REQUEST) {
		ev.info.mpa_rev = r->rr.rev;
		ev.info.crc = r->rr.flags & MPA_FLAG_C;
		ev.info.markers_tx = r->rr.flags & MPA_FLAG_M;
		ev.info.ird = r->rr.enhanced ? r->rr.ird & MPA_V2_MASK : 0;
		ev.info.ord = r->rr.enhanced ? r->rr.ord & MPA_V2_MASK : 0;
		ev.pdata_len = r->rr.pd_len;
		memcpy(ev.pdata, r->rr.pdata, r->rr.pd_len);
	}
	fill_addrs(r->fd, &ev.info);
	ch_push(r->ch, &ev);
}

static void req_io_cb(struct ev_loop *loop, ev_io *w, int revents);

/* Unlinks and frees a request. cm->lock held. */
static void req_free_locked(struct rc_cm *cm, struct soft_conn_req *r)
{
	for (struct soft_conn_req **p = &cm->reqs; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	if (r->io_on && r->ctx->loop) {
		ev_io_stop(r->ctx->loop, &r->io);
		r->io_on = false;
	}
	ch_purge(r->ch, NULL, &r->base);
	atomic_fetch_sub(&r->ch->refs, 1);
	if (r->own_fd && r->fd >= 0)
		close(r->fd);
	free(r);
}

static void req_fail(struct rc_cm *cm, struct soft_conn_req *r, int err, const char *cause)
{
	if (err == -EPROTO)
		DG_ERR("RC connection request on fd %d: %s", r->fd, cause);
	else
		DG_WARN("RC connection request on fd %d: %s (%s)", r->fd, cause, strerror(-err));
	if (r->io_on && r->ctx->loop) {
		ev_io_stop(r->ctx->loop, &r->io);
		r->io_on = false;
	}
	if (!r->listener) {
		/* adopted: the caller frees it with dgv_reject */
		r->state = REQ_FAILED;
		req_event(r, DGV_CM_CONNECT_ERROR, err);
		return;
	}
	req_event(r, DGV_CM_CONNECT_ERROR, err);
	req_free_locked(cm, r);
}

/* Reads the MPA Request of r (exactly its bytes: nothing of the stream after it). cm->lock
 * held. Returns >0 when it moved. */
static int req_step(struct rc_cm *cm, struct soft_conn_req *r, uint64_t now)
{
	if (r->state != REQ_READING)
		return 0;
	int did = 0;
	for (;;) {
		ssize_t n = recv(r->fd, r->buf + r->got, r->need - r->got, MSG_DONTWAIT);
		if (n > 0) {
			r->got += (uint32_t)n;
			did = 1;
			if (r->got < r->need)
				continue;
			const char *why;
			if (r->need == MPA_RR_HLEN) {
				int tot = mpa_rr_check_hdr(r->buf, true, &why);
				if (tot < 0) {
					req_fail(cm, r, -EPROTO, why);
					return 1;
				}
				r->need = (uint32_t)tot;
				if (r->got < r->need)
					continue;
			}
			if (mpa_rr_parse(r->buf, r->need, true, &r->rr, &why)) {
				req_fail(cm, r, -EPROTO, why);
				return 1;
			}
			r->state = REQ_READY;
			if (r->io_on && r->ctx->loop) {
				ev_io_stop(r->ctx->loop, &r->io);
				r->io_on = false;
			}
			req_event(r, DGV_CM_CONNECT_REQUEST, 0);
			return 1;
		}
		if (n == 0) {
			req_fail(cm, r, -ECONNRESET, "peer closed the connection before its MPA Request");
			return 1;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			req_fail(cm, r, -errno, "receiving the MPA Request failed");
			return 1;
		}
		break;
	}
	if (now >= r->deadline_us) {
		req_fail(cm, r, -ETIMEDOUT, "no MPA Request before the deadline");
		return 1;
	}
	return did;
}

/* Makes a request object for fd. cm->lock held (and loop_lock when called from the loop). */
static struct soft_conn_req *req_new(struct soft_ctx *ctx, int fd, bool own, struct soft_cm_channel *ch,
				     void *user, struct soft_listener *l, bool loop_locked)
{
	struct soft_conn_req *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->base.ctx = &ctx->base;
	r->ctx = ctx;
	r->fd = fd;
	r->own_fd = own;
	r->ch = ch;
	r->user = user;
	r->listener = l;
	r->need = MPA_RR_HLEN;
	r->deadline_us = dg_now_us() + (uint64_t)RC_TIMEOUT_MS * 1000;
	atomic_fetch_add(&ch->refs, 1);
	r->next = ctx->cm->reqs;
	ctx->cm->reqs = r;
	soft_tick_need(ctx); /* its deadline is the tick's (soft_rc_tick) */
	set_nodelay(fd);
	if (ctx->loop && loop_locked) {
		ev_io_init(&r->io, req_io_cb, fd, EV_READ);
		r->io.data = r;
		ev_io_start(ctx->loop, &r->io);
		r->io_on = true;
		r->watched = true;
		ev_async_send(ctx->loop, &ctx->wake); /* the loop picks the watcher up */
	}
	return r;
}

/* Accepts what the listener has. cm->lock held. */
static int listener_step(struct soft_listener *l, bool loop_locked)
{
	int did = 0;
	for (int i = 0; i < 64; i++) {
		int fd;
		if (l->own_fd) {
			fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		} else {
			/* the program's listening socket may be blocking: accept only what is there */
			struct pollfd p = {.fd = l->fd, .events = POLLIN};
			if (poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN))
				break;
			fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		}
		if (fd < 0)
			break;
		if (!req_new(l->ctx, fd, true, l->ch, l->user, l, loop_locked)) {
			close(fd);
			continue;
		}
		did = 1;
	}
	return did;
}

static void req_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct soft_conn_req *r = w->data;
	struct rc_cm *cm = r->ctx->cm;
	(void)loop;
	(void)revents;
	pthread_mutex_lock(&cm->lock);
	req_step(cm, r, dg_now_us());
	pthread_mutex_unlock(&cm->lock);
}

static void listener_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct soft_listener *l = w->data;
	struct rc_cm *cm = l->ctx->cm;
	(void)loop;
	(void)revents;
	pthread_mutex_lock(&cm->lock);
	listener_step(l, true);
	for (struct soft_conn_req *r = cm->reqs, *nx; r; r = nx) {
		nx = r->next;
		if (r->listener == l && r->state == REQ_READING && r->got == 0)
			req_step(cm, r, dg_now_us()); /* the Request often arrives with the connection */
	}
	pthread_mutex_unlock(&cm->lock);
}

/* Returns whether a connection request is still the thread's to read (or cm->lock was busy):
 * the tick keeps its pace for it. */
bool soft_rc_tick(struct soft_ctx *ctx)
{
	struct rc_cm *cm = ctx->cm;
	if (pthread_mutex_trylock(&cm->lock))
		return true;
	uint64_t now = dg_now_us();
	bool left = false;
	for (struct soft_conn_req *r = cm->reqs, *nx; r; r = nx) {
		nx = r->next;
		if (r->state == REQ_READING && !r->app_read)
			req_step(cm, r, now); /* may free r */
	}
	for (struct soft_conn_req *r = cm->reqs; r && !left; r = r->next)
		left = r->state == REQ_READING && !r->app_read;
	pthread_mutex_unlock(&cm->lock);
	return left;
}

int soft_rc_listen(struct dgv_context *cb, const struct sockaddr *addr, socklen_t len, int backlog,
		   int adopt_fd, struct dgv_cm_channel *chb, void *user, struct dgv_listener **out)
{
	struct soft_ctx *ctx = to_sctx(cb);
	struct soft_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->base.ctx = cb;
	l->ctx = ctx;
	l->ch = ch_or_default(ctx, chb);
	l->user = user;
	if (adopt_fd >= 0) {
		l->fd = adopt_fd;
		l->own_fd = false;
	} else {
		l->fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (l->fd < 0) {
			int err = -errno;
			free(l);
			return err;
		}
		l->own_fd = true;
		int one = 1;
		setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l->fd, addr, len) || listen(l->fd, backlog > 0 ? backlog : 128)) {
			int err = -errno;
			close(l->fd);
			free(l);
			return err;
		}
	}
	atomic_fetch_add(&l->ch->refs, 1);
	if (ctx->loop)
		pthread_mutex_lock(&ctx->loop_lock);
	pthread_mutex_lock(&ctx->cm->lock);
	l->next = ctx->cm->listeners;
	ctx->cm->listeners = l;
	if (ctx->loop) {
		ev_io_init(&l->io, listener_io_cb, l->fd, EV_READ);
		l->io.data = l;
		ev_io_start(ctx->loop, &l->io);
		l->io_on = true;
		ev_async_send(ctx->loop, &ctx->wake);
	}
	pthread_mutex_unlock(&ctx->cm->lock);
	if (ctx->loop)
		pthread_mutex_unlock(&ctx->loop_lock);
	*out = &l->base;
	return 0;
}

int soft_rc_listener_destroy(struct dgv_listener *lb)
{
	struct soft_listener *l = (struct soft_listener *)lb;
	struct soft_ctx *ctx = l->ctx;
	if (ctx->loop)
		pthread_mutex_lock(&ctx->loop_lock);
	pthread_mutex_lock(&ctx->cm->lock);
	for (struct soft_listener **p = &ctx->cm->listeners; *p; p = &(*p)->next)
		if (*p == l) {
			*p = l->next;
			break;
		}
	if (l->io_on) {
		ev_io_stop(ctx->loop, &l->io);
		ev_async_send(ctx->loop, &ctx->wake);
	}
	/* requests still reading their MPA Request die with it; the announced ones stay */
	for (struct soft_conn_req *r = ctx->cm->reqs, *nx; r; r = nx) {
		nx = r->next;
		if (r->listener == l) {
			if (r->state == REQ_READING)
				req_free_locked(ctx->cm, r);
			else
				r->listener = NULL;
		}
	}
	pthread_mutex_unlock(&ctx->cm->lock);
	if (ctx->loop)
		pthread_mutex_unlock(&ctx->loop_lock);
	atomic_fetch_sub(&l->ch->refs, 1);
	if (l->own_fd)
		close(l->fd);
	free(l);
	return 0;
}

int soft_rc_listener_addr(struct dgv_listener *lb, union dgv_sockaddr *out, socklen_t *len)
{
	struct soft_listener *l = (struct soft_listener *)lb;
	*len = sizeof *out;
	return getsockname(l->fd, &out->sa, len) ? -errno : 0;
}

int soft_rc_conn_req_adopt(struct dgv_context *cb, int fd, struct dgv_cm_channel *chb, void *user,
			   struct dgv_conn_req **out)
{
	struct soft_ctx *ctx = to_sctx(cb);
	int type = 0;
	socklen_t l = sizeof type;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) || type != SOCK_STREAM)
		return -ENOTSOCK;
	if (ctx->loop)
		pthread_mutex_lock(&ctx->loop_lock);
	pthread_mutex_lock(&ctx->cm->lock);
	struct soft_cm_channel *ch = ch_or_default(ctx, chb);
	struct soft_conn_req *r = req_new(ctx, fd, false, ch, user, NULL, !ch->on_cq);
	if (r) {
		r->app_read = ch->on_cq != NULL;
		req_step(ctx->cm, r, dg_now_us());
	}
	pthread_mutex_unlock(&ctx->cm->lock);
	if (ctx->loop) {
		ev_async_send(ctx->loop, &ctx->wake);
		pthread_mutex_unlock(&ctx->loop_lock);
	}
	if (!r)
		return -ENOMEM;
	*out = &r->base;
	return 0;
}

/* Takes r out of the lists (without freeing it: accept hands its descriptor to a QP) and stops its watcher. forget: its descriptor is not becoming a
 * QP's (a reject: the caller keeps it, or it is closed next), so it also leaves libev's epoll
 * set now, before anyone closes it (soft_loop_forget_fd_unlock). */
static void req_detach(struct soft_ctx *ctx, struct soft_conn_req *r, bool forget)
{
	if (ctx->loop)
		pthread_mutex_lock(&ctx->loop_lock);
	pthread_mutex_lock(&ctx->cm->lock);
	for (struct soft_conn_req **p = &ctx->cm->reqs; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	if (r->io_on && ctx->loop) {
		ev_io_stop(ctx->loop, &r->io);
		r->io_on = false;
	}
	pthread_mutex_unlock(&ctx->cm->lock);
	if (ctx->loop && forget && r->watched)
		soft_loop_forget_fd_unlock(ctx, r->fd);
	else if (ctx->loop)
		pthread_mutex_unlock(&ctx->loop_lock);
	ch_purge(r->ch, NULL, &r->base);
	atomic_fetch_sub(&r->ch->refs, 1);
}

int soft_rc_accept(struct dgv_conn_req *rb, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
		   const struct dgv_conn_param *param, struct dgv_qp **out)
{
	struct soft_conn_req *r = (struct soft_conn_req *)rb;
	struct soft_ctx *ctx = r->ctx;
	pthread_mutex_lock(&ctx->cm->lock);
	bool ready = r->state == REQ_READY;
	pthread_mutex_unlock(&ctx->cm->lock);
	if (!ready)
		return -EINVAL;
	struct soft_qp *qp;
	int err = rc_qp_new(pd, attr, r->fd, r->own_fd, &qp);
	if (err)
		return err;
	req_detach(ctx, r, false); /* the QP watches the same descriptor from now on */
	struct rc_conn *rc = qp->rc;
	rc->fd_watched = r->watched;
	apply_param(rc, param);
	const struct mpa_rr *q = &r->rr;
	/* negotiation (RFC 5044 7.1, RFC 6581 5) */
	rc->info.mpa_rev = q->rev < rc->want_rev ? q->rev : rc->want_rev;
	rc->info.crc = rc->want_crc || (q->flags & MPA_FLAG_C);
	rc->info.markers_tx = q->flags & MPA_FLAG_M;
	rc->info.markers_rx = rc->want_markers;
	rc->info.ird = rc->want_ird;
	rc->info.ord = rc->want_ord;
	struct mpa_v2_word v2w, *v2 = NULL;
	if (rc->info.mpa_rev == 2 && q->enhanced) {
		uint16_t pird = q->ird & MPA_V2_MASK, pord = q->ord & MPA_V2_MASK;
		if (pird < rc->info.ord)
			rc->info.ord = pird;
		if (pord > rc->info.ird)
			rc->info.ird = pord > SOFT_MAX_IRD ? SOFT_MAX_IRD : pord;
		uint16_t wi = rc->info.ird, wo = rc->info.ord;
		if (q->ird & MPA_V2_IRD_P2P) {
			rc->p2p = true;
			wi |= MPA_V2_IRD_P2P;
			if (q->ord & MPA_V2_ORD_WRITE_RTR) {
				rc->rtr = RTR_WRITE;
				wo |= MPA_V2_ORD_WRITE_RTR;
			} else if (q->ord & MPA_V2_ORD_READ_RTR) {
				rc->rtr = RTR_READ;
				wo |= MPA_V2_ORD_READ_RTR;
			} else if (q->ird & MPA_V2_IRD_SEND_RTR) {
				rc->rtr = RTR_SEND;
				wi |= MPA_V2_IRD_SEND_RTR;
			} else {
				rc->rtr = RTR_WRITE; /* as siw: propose a zero-length Write */
				wo |= MPA_V2_ORD_WRITE_RTR;
			}
		}
		v2w = (struct mpa_v2_word){htobe16(wi), htobe16(wo)};
		v2 = &v2w;
	}
	uint8_t flags = (rc->info.crc ? MPA_FLAG_C : 0) | (rc->info.markers_rx ? MPA_FLAG_M : 0);
	rc->mpa_out_len = (uint32_t)mpa_rr_build(rc->hs->mpa_out, false, flags, rc->info.mpa_rev, v2,
						 rc->hs->pdata, rc->pd_len);
	fill_addrs(qp->fd, &rc->info);
	qp->local = rc->info.local;
	qp->locallen = rc->info.local_len;
	init_stream(qp);
	rc->phase = PH_TX_REP;
	free(r);
	rc_qp_publish(qp);
	*out = &qp->base;
	soft_qp_progress(qp, true, true);
	return 0;
}

int soft_rc_reject(struct dgv_conn_req *rb, const void *pdata, uint16_t len)
{
	struct soft_conn_req *r = (struct soft_conn_req *)rb;
	struct soft_ctx *ctx = r->ctx;
	pthread_mutex_lock(&ctx->cm->lock);
	enum req_state st = r->state;
	pthread_mutex_unlock(&ctx->cm->lock);
	if (st == REQ_READY) {
		uint8_t buf[MPA_RR_MAX];
		size_t n = mpa_rr_build(buf, false, MPA_FLAG_R, r->rr.rev, NULL, pdata, len);
		ssize_t w = send(r->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		(void)w;
	}
	if (st != REQ_READING)
		shutdown(r->fd, SHUT_WR);
	req_detach(ctx, r, true);
	if (r->own_fd)
		close(r->fd);
	free(r);
	return 0;
}

int soft_rc_reject_keep(struct dgv_conn_req *rb, const void *pdata, uint16_t len, int wait_ms)
{
	struct soft_conn_req *r = (struct soft_conn_req *)rb;
	struct soft_ctx *ctx = r->ctx;
	if (r->listener)
		return -EOPNOTSUPP; /* the provider accepted it: not the caller's socket */
	uint64_t until = dg_now_us() + (uint64_t)wait_ms * 1000;
	for (;;) {
		if (ctx->loop)
			pthread_mutex_lock(&ctx->loop_lock);
		pthread_mutex_lock(&ctx->cm->lock);
		req_step(ctx->cm, r, dg_now_us()); /* reads exactly the Request's bytes */
		enum req_state st = r->state;
		pthread_mutex_unlock(&ctx->cm->lock);
		if (ctx->loop)
			pthread_mutex_unlock(&ctx->loop_lock);
		if (st == REQ_READY)
			break;
		if (st == REQ_FAILED)
			return -EPROTO; /* req_fail logged why */
		uint64_t now = dg_now_us();
		if (now >= until)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = r->fd, .events = POLLIN};
		if (poll(&p, 1, (int)((until - now + 999) / 1000)) < 0 && errno != EINTR)
			return -errno;
	}
	uint8_t buf[MPA_RR_MAX];
	size_t n = mpa_rr_build(buf, false, MPA_FLAG_R, r->rr.rev, NULL, pdata, len);
	/* a fresh connection's send buffer takes the Reply whole; a part of it would leave the
	 * stream neither MPA nor plain, so that fails (the caller closes) */
	ssize_t w = send(r->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w != (ssize_t)n)
		return w < 0 && errno != EAGAIN && errno != EWOULDBLOCK ? -errno : -EIO;
	req_detach(ctx, r, true);
	if (r->own_fd)
		close(r->fd);
	free(r);
	return 0;
}

/* ------------------------------------------------------------------ events and waiting */

/* Drives connection progress for channel ch (NULL: all): pending requests, listeners and the
 * RC QPs reporting there. Fills pfd (up to max) with what to wait for. Returns the count. */
static int cm_drive(struct soft_ctx *ctx, struct soft_cm_channel *ch, struct pollfd *pfd, int max)
{
	struct rc_cm *cm = ctx->cm;
	int n = 0;
	struct soft_qp *snap[64];
	int nq = 0;
	uint64_t now = dg_now_us();
	/* loop_lock too: finishing a request stops its libev watcher */
	if (ctx->loop)
		pthread_mutex_lock(&ctx->loop_lock);
	pthread_mutex_lock(&cm->lock);
	for (struct soft_listener *l = cm->listeners; l; l = l->next)
		if (!ch || l->ch == ch) {
			listener_step(l, true);
			if (n < max)
				pfd[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
		}
	for (struct soft_conn_req *r = cm->reqs, *nx; r; r = nx) {
		nx = r->next;
		if ((!ch || r->ch == ch) && r->state == REQ_READING) {
			int fd = r->fd;
			req_step(cm, r, now);
			bool still = false;
			for (struct soft_conn_req *x = cm->reqs; x; x = x->next)
				if (x == r && x->state == REQ_READING)
					still = true;
			if (still && n < max)
				pfd[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
		}
	}
	for (struct rc_conn *rc = ch ? ch->conns : cm->conns; rc && nq < 64; rc = ch ? rc->ch_next : rc->next) {
		snap[nq++] = rc->qp;
		atomic_fetch_add(&rc->qp->refs, 1);
	}
	pthread_mutex_unlock(&cm->lock);
	if (ctx->loop)
		pthread_mutex_unlock(&ctx->loop_lock);
	for (int i = 0; i < nq; i++) {
		struct soft_qp *qp = snap[i];
		soft_qp_progress(qp, true, false); /* the program's call (get_event, cm_wait) */
		/* without the QP's lock (progress above took and left it): ended is stored atomically */
		if (n < max && !__atomic_load_n(&qp->rc->ended, __ATOMIC_RELAXED)) {
			pfd[n++] = (struct pollfd){.fd = qp->fd, .events = POLLIN};
			if (soft_rc_wants_pollout(qp))
				pfd[n - 1].events |= POLLOUT;
		}
		atomic_fetch_sub(&qp->refs, 1);
	}
	return n;
}

int soft_cm_pending(struct dgv_cm_channel *cb)
{
	return (int)__atomic_load_n(&((struct soft_cm_channel *)cb)->count, __ATOMIC_ACQUIRE);
}

int soft_cm_get_event(struct dgv_cm_channel *cb, struct dgv_cm_event *ev)
{
	struct soft_cm_channel *ch = (struct soft_cm_channel *)cb;
	struct pollfd dummy[1];
	if (!__atomic_load_n(&ch->count, __ATOMIC_ACQUIRE))
		cm_drive(to_sctx(cb->ctx), ch, dummy, 0);
	pthread_mutex_lock(&ch->lock);
	if (!ch->count) {
		pthread_mutex_unlock(&ch->lock);
		return -EAGAIN;
	}
	*ev = ch->q[ch->head];
	ch->head = (ch->head + 1) % ch->cap;
	__atomic_store_n(&ch->count, ch->count - 1, __ATOMIC_RELEASE); /* see ch_push */
	/* an emptied queue goes back to the heap: an event is some 600 bytes (its private data)
	 * and a connection's channel, after its few events, would otherwise keep 16 of them
	 * (10 kB of every idle carried TCP connection, issue 14: memory) */
	struct dgv_cm_event *gone = NULL;
	if (!ch->count)
		gone = ch->q, ch->q = NULL, ch->cap = 0, ch->head = 0;
	pthread_mutex_unlock(&ch->lock);
	free(gone);
	if (ch->efd >= 0) {
		uint64_t v;
		ssize_t r = read(ch->efd, &v, sizeof v);
		(void)r;
	}
	return 0;
}

int soft_cm_wait(struct dgv_cm_channel *cb, int timeout_ms)
{
	struct soft_cm_channel *ch = (struct soft_cm_channel *)cb;
	struct soft_ctx *ctx = to_sctx(cb->ctx);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : dg_now_us() + (uint64_t)timeout_ms * 1000;
	struct pollfd pfd[130];
	for (;;) {
		if (__atomic_load_n(&ch->count, __ATOMIC_ACQUIRE))
			return 0;
		int n = cm_drive(ctx, ch, pfd + 1, 129);
		if (__atomic_load_n(&ch->count, __ATOMIC_ACQUIRE))
			return 0;
		uint64_t now = dg_now_us();
		if (now >= deadline)
			return -ETIMEDOUT;
		/* a channel on a CQ whose eventfd nobody made: its events are the ones this call
		 * makes (cm_drive: app_read requests, rx_app QPs), and the slices bound the rest */
		int cfd = ch->on_cq ? soft_cq_wait_fd(ch->on_cq) : soft_cm_channel_fd(cb);
		pfd[0] = (struct pollfd){.fd = cfd, .events = POLLIN};
		/* short slices: a deadline of a request or a QP of this channel may pass meanwhile */
		uint64_t left = deadline - now;
		int ms = left > 20000 ? 20 : (int)((left + 999) / 1000);
		int r = poll(pfd, (nfds_t)n + 1, ms);
		if (r < 0 && errno == EINTR)
			return -EINTR;
		/* a CQ's descriptor stays readable until acknowledged: taken here (the count above
		 * is what says an event came), or the next poll would not wait; the CQ's own waiter
		 * looks at its queue before it waits, so nothing is missed by it */
		if (ch->on_cq && (pfd[0].revents & POLLIN))
			soft_cq_ack_event(&ch->on_cq->base);
	}
}

/* ------------------------------------------------------------------ context */

int soft_rc_ctx_init(struct soft_ctx *ctx)
{
	struct rc_cm *cm = calloc(1, sizeof *cm);
	if (!cm)
		return -ENOMEM;
	pthread_mutex_init(&cm->lock, NULL);
	cm->def = ch_new(ctx, NULL);
	if (!cm->def) {
		pthread_mutex_destroy(&cm->lock);
		free(cm);
		return -ENOMEM;
	}
	ctx->cm = cm;
	return 0;
}

void soft_rc_ctx_fini(struct soft_ctx *ctx)
{
	struct rc_cm *cm = ctx->cm;
	if (!cm)
		return;
	/* The loop thread is gone: nothing else touches these any more. */
	while (cm->reqs) {
		struct soft_conn_req *r = cm->reqs;
		r->io_on = false;
		req_free_locked(cm, r);
	}
	while (cm->listeners) {
		struct soft_listener *l = cm->listeners;
		cm->listeners = l->next;
		if (l->own_fd)
			close(l->fd);
		free(l);
	}
	while (cm->channels) {
		struct soft_cm_channel *ch = cm->channels;
		cm->channels = ch->next;
		ch_free(ch);
	}
	ch_free(cm->def);
	pthread_mutex_destroy(&cm->lock);
	free(cm);
	ctx->cm = NULL;
}
