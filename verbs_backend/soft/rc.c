/*
 * rc.c - RC queue pairs of the soft RNIC: standard iWARP over one kernel TCP connection.
 *
 *   MPA (RFC 5044) with the enhanced connection set-up of RFC 6581 (revision 2, IRD/ORD word,
 *   peer-to-peer RTR message), CRC32c, optional markers;
 *   DDP (RFC 5041) tagged and untagged headers on the stream;
 *   RDMAP (RFC 5040) Send (SE, Invalidate), RDMA Write, RDMA Read, Terminate, and RDMA
 *   Write-Record (opcode 0x8, paper 000 IV.B.3) on a reliable transport;
 *   connection management in the manner of rdma_cm: channels, connect, listen, accept, reject,
 *   disconnect.
 *
 * An RC QP is a struct soft_qp (rings, CQs, lock, stats, error queue, ORD/IRD tables of qp.c)
 * with qp->rc pointing at the connection below, so CQ-driven progress, the libev thread and
 * dgv_cq_wait apply unchanged; soft_qp_progress() comes here for RC QPs.
 *
 * Locks: everything about a QP runs under qp->lock. Listeners and pending requests are under
 * cm->lock. A channel's queue is under ch->lock, the innermost lock (events are queued with a
 * QP or cm->lock held). Order: ctx->loop_lock -> cm->lock -> qp->lock -> cq->lock / ch->lock.
 *
 * Data path: no allocation, no formatting, no global lock. Transmission gathers several FPDUs
 * into one sendmsg (headers and trailers from a per-QP staging area, payload straight from the
 * registered buffers); reception reads large chunks into a per-QP stream buffer and parses
 * FPDUs from it. Adopted descriptors are never made non-blocking and never closed: every call
 * passes MSG_DONTWAIT and waits with poll().
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

#include "crc.h"
#include "env.h"
#include "log.h"
#include "mpa.h"
#include "soft.h"

#define RC_DEFAULT_WR 256
#define RC_DEFAULT_MAX_MSG (16u << 20)
#define RC_TIMEOUT_MS 10000
#define RC_RXBUF (256u << 10)     /* stream receive buffer */
#define RC_RX_ROOM (72u << 10)    /* free room kept at the tail: one largest FPDU with markers */
#define RC_IOV 256                /* iovec entries of one transmit batch */
#define RC_FPDUS 64               /* FPDUs in one transmit batch */
#define RC_HBUF 8192              /* staging for headers and trailers of one batch */
#define RC_BATCH_BYTES (1u << 20)
#define RC_FLAT (70u << 10)       /* one FPDU without or with markers */
#define RC_STAG_RTR 1u            /* STag of zero-length RTR messages (as Linux siw sends) */

enum rc_phase {
	PH_TCP = 0,   /* TCP connect in progress */
	PH_TX_REQ,    /* sending the MPA Request */
	PH_RX_REP,    /* waiting for the MPA Reply */
	PH_TX_REP,    /* sending the MPA Reply */
	PH_WAIT_RTR,  /* responder, peer-to-peer: waiting for the initiator's RTR message */
	PH_RTS,       /* FPDUs flow */
};

enum rtr_kind { RTR_NONE = 0, RTR_WRITE, RTR_READ, RTR_SEND };

enum fp_kind { FP_NONE = 0, FP_SQ_DONE, FP_IRD_DONE, FP_TERM };

struct rc_fp {
	uint64_t end;   /* batch offset just past this FPDU */
	uint8_t kind;
	uint32_t idx;   /* SQ index (FP_SQ_DONE) */
};

struct soft_cm_channel {
	struct dgv_cm_channel base;
	pthread_mutex_t lock;
	int efd;                 /* EFD_SEMAPHORE: readable while events are queued */
	struct dgv_cm_event *q;  /* ring */
	uint32_t cap, head, count;
	atomic_int refs;         /* QPs, listeners and requests reporting here */
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

struct rc_conn {
	struct soft_qp *qp;
	struct rc_conn *next; /* cm->conns */
	struct soft_cm_channel *ch;
	void *user;
	bool active;
	enum rc_phase phase;
	enum dgv_qp_state state;
	uint64_t deadline_us;
	int pending_err;        /* an error found before the first progress (connect) */
	/* what this side asks for */
	uint8_t want_rev;
	bool want_crc, want_markers;
	uint16_t want_ird, want_ord;
	uint16_t pd_len;
	uint8_t pdata[MPA_MAX_PDATA];
	/* negotiated */
	struct dgv_conn_info info;
	bool p2p;
	enum rtr_kind rtr;
	bool rtr_pending;       /* initiator: RTR to send first */
	bool rtr_read_wait;     /* initiator: zero-length Read Response of a Read RTR expected */
	bool hold_first;        /* responder without peer-to-peer mode: no FPDU out before the
				 * initiator's first FPDU has arrived (RFC 5044 section 7.1.2) */
	uint32_t mulpdu, rx_max_ulpdu;
	/* MPA frame on the way out */
	uint8_t mpa_out[MPA_RR_MAX];
	uint32_t mpa_out_len, mpa_out_sent;
	/* transmit batch */
	struct iovec iov[RC_IOV];
	int niov, iov_idx;
	uint64_t b_bytes, b_sent;
	struct rc_fp fp[RC_FPDUS];
	uint32_t nfp, fp_done;
	uint8_t hbuf[RC_HBUF];
	uint32_t hused;
	uint64_t tx_pos;        /* FPDU stream position (markers) of the next batch byte to build */
	uint8_t *flat, *marked; /* markers_tx: one FPDU built flat, then marked (RC_FLAT each) */
	int cur;                /* message being cut: 0 none, 1 SQ (sq_pump), 2 IRD (ird head) */
	uint32_t cur_off;
	uint32_t ord_head, ird_head;
	uint32_t ird_unbuilt;   /* IRD entries whose response is not yet all in a batch */
	uint32_t empty_probes;  /* recv() calls in a row that found nothing */
	uint32_t msn_send, msn_read, msn_term; /* next MSN per queue, from 1 */
	/* Terminate going out */
	bool term_pending, term_sent, shut_after_term;
	uint8_t term_fpdu[128];
	uint32_t term_len;
	uint8_t *spill;         /* rest of a half-sent FPDU when the connection fails */
	/* receive */
	uint8_t *rxb;
	uint32_t rx_start, rx_end;
	uint64_t rx_pos;        /* FPDU stream position of rxb[rx_start] */
	uint8_t *rx_flat;
	uint32_t exp_msn[3];
	bool rcv_active;        /* a Send is being received into rcv */
	struct soft_rwqe rcv;
	uint32_t rcv_off, rcv_msn;
	uint8_t rcv_op;
	uint32_t rcv_inv;
	bool t_active;          /* a tagged message (Write, Write-Record) is being placed */
	uint8_t t_op;
	uint32_t t_stag, t_len;
	uint64_t t_base, t_next;
	bool rx_paused, eof, want_close, wr_closed, peer_closed_told, ended, established;
	uint8_t term_l, term_t, term_c;
};

static void rc_fail(struct soft_qp *qp, int err, const struct dg_reject *why, bool send_term,
		    const uint8_t *off_hdr, uint32_t off_hlen, uint32_t seg_len);

/* ------------------------------------------------------------------ channels */

/* Queues ev on ch (copy). Caller may hold a QP lock or cm->lock. Returns 0 or -ENOMEM. */
static int ch_push(struct soft_cm_channel *ch, const struct dgv_cm_event *ev)
{
	pthread_mutex_lock(&ch->lock);
	if (ch->count == ch->cap) {
		uint32_t ncap = ch->cap ? ch->cap * 2 : 16;
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
	ch->count++;
	pthread_mutex_unlock(&ch->lock);
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
	ch->count = kept;
	pthread_mutex_unlock(&ch->lock);
	for (uint32_t i = 0; i < dropped; i++) {
		uint64_t v;
		ssize_t r = read(ch->efd, &v, sizeof v);
		(void)r;
	}
}

static struct soft_cm_channel *ch_new(struct soft_ctx *ctx)
{
	struct soft_cm_channel *ch = calloc(1, sizeof *ch);
	if (!ch)
		return NULL;
	ch->base.ctx = &ctx->base;
	ch->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->efd < 0) {
		free(ch);
		return NULL;
	}
	pthread_mutex_init(&ch->lock, NULL);
	return ch;
}

static void ch_free(struct soft_cm_channel *ch)
{
	close(ch->efd);
	free(ch->q);
	pthread_mutex_destroy(&ch->lock);
	free(ch);
}

int soft_cm_create_channel(struct dgv_context *cb, struct dgv_cm_channel **out)
{
	struct soft_ctx *ctx = to_sctx(cb);
	struct soft_cm_channel *ch = ch_new(ctx);
	if (!ch)
		return -ENOMEM;
	pthread_mutex_lock(&ctx->cm->lock);
	ch->next = ctx->cm->channels;
	ctx->cm->channels = ch;
	pthread_mutex_unlock(&ctx->cm->lock);
	*out = &ch->base;
	return 0;
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

int soft_cm_channel_fd(struct dgv_cm_channel *cb) { return ((struct soft_cm_channel *)cb)->efd; }

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

static void event_for_qp(struct soft_qp *qp, enum dgv_cm_event_type type, int status,
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

static void errq_put(struct soft_qp *qp, uint8_t l, uint8_t t, uint8_t c, bool remote, uint8_t opcode,
		     uint32_t msn, uint32_t stag, uint64_t to, uint32_t len)
{
	if (qp->errq_count == SOFT_ERRQ) {
		qp->errq_head = (qp->errq_head + 1) % SOFT_ERRQ;
		qp->errq_count--;
		qp->st.errq_overflows++;
	}
	struct dgv_async_err *e = &qp->errq[(qp->errq_head + qp->errq_count) % SOFT_ERRQ];
	*e = (struct dgv_async_err){.layer = l, .etype = t, .ecode = c, .remote = remote, .opcode = opcode,
				    .msn = msn, .stag = stag, .to = to, .length = len, .peer = qp->rc->info.peer};
	qp->errq_count++;
}

/* ------------------------------------------------------------------ completions */

static const enum dgv_wc_opcode wc_of_wr[] = {
	[DGV_WR_SEND] = DGV_WC_SEND, [DGV_WR_SEND_SE] = DGV_WC_SEND, [DGV_WR_WRITE] = DGV_WC_WRITE,
	[DGV_WR_WRITE_RECORD] = DGV_WC_WRITE_RECORD, [DGV_WR_READ] = DGV_WC_READ,
	[DGV_WR_SEND_PLAIN] = DGV_WC_SEND_PLAIN, [DGV_WR_SEND_INV] = DGV_WC_SEND,
	[DGV_WR_SEND_SE_INV] = DGV_WC_SEND};

/* Marks send WQE idx done; completions are pushed in posting order (a Send posted after a Read
 * completes after it, as on a hardware RNIC). qp->lock held. */
static void sq_done(struct soft_qp *qp, uint32_t idx, enum dgv_wc_status st, uint32_t bytes)
{
	struct soft_swqe *w = &qp->sq[idx];
	if (w->done)
		return;
	w->done = true;
	w->rc_status = (uint8_t)st;
	w->rc_bytes = bytes;
	while (qp->sq_head != qp->sq_tail) {
		struct soft_swqe *h = &qp->sq[qp->sq_head % qp->sq_cap];
		if (!h->done)
			break;
		if (h->rc_status == DGV_WC_SUCCESS)
			qp->st.tx_msgs++;
		if (h->rc_status != DGV_WC_SUCCESS || (h->flags & DGV_SEND_SIGNALED)) {
			struct dgv_wc wc = {.wr_id = h->wr_id, .status = (enum dgv_wc_status)h->rc_status,
					    .opcode = wc_of_wr[h->opcode], .byte_len = h->rc_bytes,
					    .msn = h->msn, .qp = &qp->base};
			if (soft_cq_push(qp->scq, &wc, NULL, NULL))
				qp->st.cq_overflows++;
		}
		qp->sq_head++;
	}
}

static void recv_done(struct soft_qp *qp, const struct soft_rwqe *w, enum dgv_wc_status st, uint32_t len,
		      uint32_t msn, unsigned flags, uint32_t inv)
{
	struct rc_conn *rc = qp->rc;
	struct dgv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = DGV_WC_RECV, .byte_len = len,
			    .flags = flags, .msn = msn, .qp = &qp->base, .src = rc->info.peer,
			    .src_len = rc->info.peer_len, .invalidated_rkey = inv};
	if (st == DGV_WC_SUCCESS)
		qp->st.rx_msgs++;
	if (soft_cq_push(qp->rcq, &wc, NULL, NULL))
		qp->st.cq_overflows++;
}

/* Every outstanding work request completes with WR_FLUSH_ERR, except first_status for the
 * oldest send WQE already (partly) transmitted when a Terminate names it. qp->lock held. */
static void flush_all(struct soft_qp *qp, enum dgv_wc_status first_status)
{
	struct rc_conn *rc = qp->rc;
	bool first = first_status != DGV_WC_WR_FLUSH_ERR;
	for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++) {
		uint32_t idx = i % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		if (w->done)
			continue;
		if (first && (w->read_ord || w->sent)) {
			sq_done(qp, idx, first_status, 0);
			first = false;
		} else {
			sq_done(qp, idx, DGV_WC_WR_FLUSH_ERR, 0);
		}
	}
	qp->sq_pump = qp->sq_tail;
	rc->cur = 0;
	for (uint32_t i = 0; i < SOFT_MAX_ORD; i++)
		qp->ord[i].used = false;
	qp->ord_count = 0;
	for (uint32_t i = 0; i < SOFT_MAX_IRD; i++)
		qp->ird[i].used = false;
	qp->ird_count = 0;
	rc->ird_unbuilt = 0;
	if (rc->rcv_active) {
		recv_done(qp, &rc->rcv, DGV_WC_WR_FLUSH_ERR, 0, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
	}
	struct soft_rwqe w;
	while (soft_rq_pop(qp, &w))
		recv_done(qp, &w, DGV_WC_WR_FLUSH_ERR, 0, 0, 0, 0);
}

/* ------------------------------------------------------------------ QP objects */

static void conn_list_add(struct soft_ctx *ctx, struct rc_conn *rc)
{
	pthread_mutex_lock(&ctx->cm->lock);
	rc->next = ctx->cm->conns;
	ctx->cm->conns = rc;
	pthread_mutex_unlock(&ctx->cm->lock);
}

static void conn_list_remove(struct soft_ctx *ctx, struct rc_conn *rc)
{
	pthread_mutex_lock(&ctx->cm->lock);
	for (struct rc_conn **p = &ctx->cm->conns; *p; p = &(*p)->next)
		if (*p == rc) {
			*p = rc->next;
			break;
		}
	pthread_mutex_unlock(&ctx->cm->lock);
}

static void rc_qp_free(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc) {
		dg_pages_free(rc->rxb, RC_RXBUF);
		free(rc->rx_flat);
		free(rc->flat);
		free(rc->marked);
		free(rc->spill);
		free(rc);
	}
	if (qp->own_fd && qp->fd >= 0)
		close(qp->fd);
	dg_pages_free(qp->sq, (size_t)qp->sq_cap * sizeof *qp->sq);
	dg_pages_free(qp->rq, (size_t)qp->rq_cap * sizeof *qp->rq);
	pthread_mutex_destroy(&qp->lock);
	free(qp);
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
		memcpy(rc->pdata, p->private_data, rc->pd_len);
}

/* Makes an RC QP on fd (not yet in the context's lists). Returns 0 or -errno. */
static int rc_qp_new(struct dgv_pd *pdb, const struct dgv_qp_init_attr *a, int fd, bool own_fd,
		     struct soft_qp **out)
{
	if (a->max_sge > SOFT_MAX_SGE)
		return -EINVAL;
	struct soft_qp *qp = calloc(1, sizeof *qp);
	struct rc_conn *rc = calloc(1, sizeof *rc);
	if (!qp || !rc) {
		free(qp);
		free(rc);
		return -ENOMEM;
	}
	qp->base.ctx = pdb->ctx;
	qp->base.type = DGV_QPT_RC;
	qp->ctx = to_sctx(pdb->ctx);
	qp->pd = to_spd(pdb);
	qp->scq = to_scq(a->send_cq);
	qp->rcq = to_scq(a->recv_cq);
	qp->fd = fd;
	qp->own_fd = own_fd;
	qp->rc = rc;
	rc->qp = qp;
	pthread_mutex_init(&qp->lock, NULL);
	qp->max_msg = a->max_msg_size ? a->max_msg_size : RC_DEFAULT_MAX_MSG;
	qp->max_sge = a->max_sge ? a->max_sge : 4;
	qp->sq_cap = a->max_send_wr ? a->max_send_wr : RC_DEFAULT_WR;
	qp->rq_cap = a->max_recv_wr ? a->max_recv_wr : RC_DEFAULT_WR;
	qp->sq = dg_pages_alloc((size_t)qp->sq_cap * sizeof *qp->sq);
	qp->rq = dg_pages_alloc((size_t)qp->rq_cap * sizeof *qp->rq);
	rc->rxb = dg_pages_alloc(RC_RXBUF);
	rc->ch = ch_or_default(qp->ctx, a->cm_channel);
	rc->user = a->cm_user;
	rc->state = DGV_QPS_CONNECTING;
	rc->msn_send = rc->msn_read = rc->msn_term = 1;
	rc->exp_msn[0] = rc->exp_msn[1] = rc->exp_msn[2] = 1;
	if (!qp->sq || !qp->rq || !rc->rxb) {
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

int soft_rc_destroy(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	soft_ctx_remove_qp(qp->ctx, qp);
	conn_list_remove(qp->ctx, rc);
	pthread_mutex_lock(&qp->lock);
	if (!rc->ended) {
		rc->ended = true;
		rc->state = DGV_QPS_ERROR;
	}
	flush_all(qp, DGV_WC_WR_FLUSH_ERR);
	/* the batch may point into the program's buffers: nothing more is sent from them */
	rc->niov = rc->iov_idx = 0;
	rc->b_bytes = rc->b_sent = 0;
	pthread_mutex_unlock(&qp->lock);
	soft_cq_detach(qp->scq, qp);
	if (qp->rcq != qp->scq)
		soft_cq_detach(qp->rcq, qp);
	while (atomic_load(&qp->refs))
		sched_yield();
	pthread_mutex_lock(&qp->lock);
	pthread_mutex_unlock(&qp->lock);
	ch_purge(rc->ch, &qp->base, NULL);
	atomic_fetch_sub(&rc->ch->refs, 1);
	atomic_fetch_sub(&qp->pd->refs, 1);
	rc_qp_free(qp);
	return 0;
}

/* ------------------------------------------------------------------ transmission */

static uint8_t *hstage(struct rc_conn *rc, uint32_t n)
{
	if (rc->hused + n > RC_HBUF)
		return NULL;
	uint8_t *p = rc->hbuf + rc->hused;
	rc->hused += n;
	return p;
}

static void batch_reset(struct rc_conn *rc)
{
	rc->niov = rc->iov_idx = 0;
	rc->b_bytes = rc->b_sent = 0;
	rc->nfp = rc->fp_done = 0;
	rc->hused = 0;
}

/* The FPDU just added completes something when its last byte is handed to TCP. */
static void fp_mark_last(struct rc_conn *rc, uint8_t kind, uint32_t idx)
{
	rc->fp[rc->nfp - 1].kind = kind;
	rc->fp[rc->nfp - 1].idx = idx;
}

/* Adds one FPDU to the batch: hdr (DDP header + RDMAP header, hlen bytes) and the payload
 * pieces pl[0..npl). Returns 0, or -ENOSPC when the batch has no room (nothing added). */
static int batch_fpdu(struct soft_qp *qp, const void *hdr, uint32_t hlen, const struct iovec *pl, int npl,
		      uint32_t plen)
{
	struct rc_conn *rc = qp->rc;
	uint32_t ulen = hlen + plen;
	uint32_t pad = mpa_pad(ulen);
	if (rc->info.markers_tx) {
		/* Markers (rare: only between two of our own QPs): build the FPDU flat, then
		 * marked, as the only FPDU of its batch. */
		if (rc->niov || rc->nfp == RC_FPDUS)
			return -ENOSPC;
		memcpy(rc->flat, hdr, hlen);
		uint32_t o = hlen;
		for (int i = 0; i < npl; i++) {
			memcpy(rc->flat + o, pl[i].iov_base, pl[i].iov_len);
			o += (uint32_t)pl[i].iov_len;
		}
		size_t n = mpa_fpdu_build(rc->marked, rc->flat, (uint16_t)ulen, rc->info.crc, (int64_t)rc->tx_pos);
		rc->iov[rc->niov++] = (struct iovec){rc->marked, n};
		rc->b_bytes += n;
		rc->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_NONE};
		rc->tx_pos += n;
		qp->st.tx_datagrams++;
		qp->st.tx_bytes += n;
		return 0;
	}
	if (rc->niov + npl + 2 > RC_IOV || rc->nfp == RC_FPDUS)
		return -ENOSPC;
	uint8_t *h = hstage(rc, MPA_HDR_LEN + hlen + 8);
	if (!h)
		return -ENOSPC;
	h[0] = (uint8_t)(ulen >> 8);
	h[1] = (uint8_t)ulen;
	memcpy(h + 2, hdr, hlen);
	uint8_t *t = h + 2 + hlen; /* trailer: pad + CRC */
	memset(t, 0, pad);
	uint32_t crc = 0;
	if (rc->info.crc) {
		uint32_t s = dg_crc32c_update(DG_CRC32C_INIT, h, 2 + hlen);
		for (int i = 0; i < npl; i++)
			s = dg_crc32c_update(s, pl[i].iov_base, pl[i].iov_len);
		if (pad)
			s = dg_crc32c_update(s, t, pad);
		crc = dg_crc32c_final(s);
	}
	mpa_crc_put(t + pad, crc);
	rc->iov[rc->niov++] = (struct iovec){h, 2 + hlen};
	for (int i = 0; i < npl; i++)
		rc->iov[rc->niov++] = pl[i];
	rc->iov[rc->niov++] = (struct iovec){t, pad + MPA_CRC_LEN};
	uint32_t flen = mpa_fpdu_len(ulen);
	rc->b_bytes += flen;
	rc->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_NONE};
	rc->tx_pos += flen;
	qp->st.tx_datagrams++;
	qp->st.tx_bytes += flen;
	return 0;
}

/* One FPDU of the send WQE at sq_pump. Returns 1 when the message is complete, 0 when more
 * FPDUs follow, -ENOSPC (batch full) or -EAGAIN (ORD full). */
static int emit_sq(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	uint32_t idx = qp->sq_pump % qp->sq_cap;
	struct soft_swqe *w = &qp->sq[idx];
	struct iovec pl[SOFT_MAX_SGE];
	if (w->opcode == DGV_WR_READ) {
		if (qp->ord_count >= rc->info.ord)
			return -EAGAIN;
		struct {
			struct ddp_untagged_hdr d;
			struct rdmap_read_req r;
		} __attribute__((packed)) h;
		uint32_t msn = rc->msn_read;
		rc_put_untagged(&h.d, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, msn, 0, 0);
		dg_put_read_req(&h.r, w->sge[0].lkey, w->sge[0].addr, w->len, w->rkey, w->remote_addr);
		if (batch_fpdu(qp, &h, sizeof h, NULL, 0, 0))
			return -ENOSPC;
		rc->msn_read++;
		w->msn = msn;
		w->sent = 1;
		w->read_ord = true;
		struct soft_ord *o = &qp->ord[(rc->ord_head + qp->ord_count) % SOFT_MAX_ORD];
		*o = (struct soft_ord){.used = true, .sq_idx = idx, .msn = msn, .stag = w->sge[0].lkey,
				       .to = w->sge[0].addr, .len = w->len};
		qp->ord_count++;
		return 1;
	}
	bool tagged = w->opcode == DGV_WR_WRITE || w->opcode == DGV_WR_WRITE_RECORD;
	uint32_t hlen = tagged ? DDP_TAGGED_HLEN : DDP_UNTAGGED_HLEN;
	uint32_t room = rc->mulpdu - hlen;
	uint32_t off = rc->cur_off;
	uint32_t chunk = w->len - off < room ? w->len - off : room;
	bool last = off + chunk == w->len;
	int npl = soft_sge_iov(w->sge, w->num_sge, off, chunk, pl, SOFT_MAX_SGE);
	union {
		struct ddp_tagged_hdr t;
		struct ddp_untagged_hdr u;
	} h;
	if (tagged) {
		rc_put_tagged(&h.t, w->opcode == DGV_WR_WRITE ? RDMAP_WRITE : RDMAP_WRITE_RECORD, last, w->rkey,
			      w->remote_addr + off);
	} else {
		static const uint8_t ops[] = {[DGV_WR_SEND] = RDMAP_SEND, [DGV_WR_SEND_SE] = RDMAP_SEND_SE,
					      [DGV_WR_SEND_INV] = RDMAP_SEND_INV,
					      [DGV_WR_SEND_SE_INV] = RDMAP_SEND_SE_INV};
		/* MSNs are given at transmission: an RTR Send may go first */
		rc_put_untagged(&h.u, ops[w->opcode], last, DDP_QN_SEND, off ? w->msn : rc->msn_send, off,
				(w->opcode == DGV_WR_SEND_INV || w->opcode == DGV_WR_SEND_SE_INV) ? w->inv_stag : 0);
	}
	if (batch_fpdu(qp, &h, hlen, pl, npl, chunk))
		return -ENOSPC;
	if (!tagged && !off)
		w->msn = rc->msn_send++;
	rc->cur_off += chunk;
	w->sent = rc->cur_off ? rc->cur_off : 1;
	if (!last)
		return 0;
	fp_mark_last(rc, FP_SQ_DONE, idx);
	return 1;
}

/* One FPDU of the Read Response at the IRD head. Returns 1 when complete, 0 when more follow,
 * -ENOSPC, or -EFAULT when the source region became invalid (a Terminate was sent). */
static int emit_ird(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	struct soft_ird *r = &qp->ird[rc->ird_head];
	uint32_t room = rc->mulpdu - DDP_TAGGED_HLEN;
	uint32_t off = rc->cur_off;
	uint32_t chunk = r->len - off < room ? r->len - off : room;
	bool last = off + chunk == r->len;
	struct iovec pl[1];
	int npl = 0;
	if (chunk) {
		/* re-checked per FPDU: a region deregistered mid-response stops the response */
		struct dg_reject why;
		struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, r->src_stag, r->src_to + off, chunk,
							DGV_ACCESS_REMOTE_READ, &why);
		if (!mr) {
			rc_fail(qp, -EPROTO, &why, true, NULL, 0, 0);
			return -EFAULT;
		}
		soft_mr_put(mr);
		pl[0] = (struct iovec){(void *)(uintptr_t)(r->src_to + off), chunk};
		npl = 1;
	}
	struct ddp_tagged_hdr h;
	rc_put_tagged(&h, RDMAP_READ_RESP, last, r->sink_stag, r->sink_to + off);
	if (batch_fpdu(qp, &h, sizeof h, pl, npl, chunk))
		return -ENOSPC;
	rc->cur_off += chunk;
	if (!last)
		return 0;
	fp_mark_last(rc, FP_IRD_DONE, rc->ird_head);
	return 1;
}

/* The initiator's RTR message (RFC 6581 section 7). Returns 0 or -ENOSPC. */
static int emit_rtr(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->rtr == RTR_WRITE) {
		struct ddp_tagged_hdr h;
		rc_put_tagged(&h, RDMAP_WRITE, true, RC_STAG_RTR, 0);
		return batch_fpdu(qp, &h, sizeof h, NULL, 0, 0);
	}
	if (rc->rtr == RTR_READ) {
		struct {
			struct ddp_untagged_hdr d;
			struct rdmap_read_req r;
		} __attribute__((packed)) h;
		rc_put_untagged(&h.d, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, rc->msn_read, 0, 0);
		dg_put_read_req(&h.r, RC_STAG_RTR, 0, 0, 0, 0);
		int err = batch_fpdu(qp, &h, sizeof h, NULL, 0, 0);
		if (!err) {
			rc->msn_read++;
			rc->rtr_read_wait = true;
		}
		return err;
	}
	struct ddp_untagged_hdr h;
	rc_put_untagged(&h, RDMAP_SEND, true, DDP_QN_SEND, rc->msn_send, 0, 0);
	int err = batch_fpdu(qp, &h, sizeof h, NULL, 0, 0);
	if (!err)
		rc->msn_send++;
	return err;
}

/* Fills the batch with whole FPDUs from: Terminate, RTR, Read Responses, the send queue. */
static void batch_build(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->term_pending) {
		rc->iov[rc->niov++] = (struct iovec){rc->term_fpdu, rc->term_len};
		rc->b_bytes += rc->term_len;
		rc->tx_pos += rc->term_len;
		rc->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_TERM};
		rc->term_pending = false;
		return;
	}
	if (rc->ended || rc->phase != PH_RTS)
		return;
	if (rc->rtr_pending) {
		if (emit_rtr(qp))
			return;
		rc->rtr_pending = false;
	}
	while (rc->b_bytes < RC_BATCH_BYTES && !rc->ended) {
		if (!rc->cur) {
			if (rc->ird_unbuilt) {
				rc->cur = 2;
			} else if (qp->sq_pump != qp->sq_tail) {
				struct soft_swqe *w = &qp->sq[qp->sq_pump % qp->sq_cap];
				if (w->done) { /* refused at post time: completed already */
					qp->sq_pump++;
					continue;
				}
				rc->cur = 1;
			} else {
				return;
			}
			rc->cur_off = 0;
		}
		int r = rc->cur == 1 ? emit_sq(qp) : emit_ird(qp);
		if (r < 0)
			return;
		if (r == 1) {
			if (rc->cur == 1)
				qp->sq_pump++;
			else {
				rc->ird_head = (rc->ird_head + 1) % SOFT_MAX_IRD;
				rc->ird_unbuilt--;
			}
			rc->cur = 0;
		}
	}
}

static void fp_complete(struct soft_qp *qp, const struct rc_fp *f)
{
	struct rc_conn *rc = qp->rc;
	switch (f->kind) {
	case FP_SQ_DONE: {
		struct soft_swqe *w = &qp->sq[f->idx];
		if (!rc->ended)
			sq_done(qp, f->idx, DGV_WC_SUCCESS, w->len);
		break;
	}
	case FP_IRD_DONE:
		if (!rc->ended) {
			qp->ird[f->idx].used = false;
			qp->ird_count--;
		}
		break;
	case FP_TERM:
		rc->term_sent = true;
		qp->st.terminates_sent++;
		break;
	default:
		break;
	}
}

/* Sends the batch. Returns 1 when it is all handed to TCP, 0 when TCP is full (POLLOUT),
 * -errno on a connection error. */
static int batch_send(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	while (rc->b_sent < rc->b_bytes) {
		struct msghdr m = {.msg_iov = rc->iov + rc->iov_idx, .msg_iovlen = (size_t)(rc->niov - rc->iov_idx)};
		ssize_t n = sendmsg(qp->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
				return 0;
			}
			return -errno;
		}
		rc->b_sent += (uint64_t)n;
		size_t left = (size_t)n;
		while (left) {
			struct iovec *v = &rc->iov[rc->iov_idx];
			if (left >= v->iov_len) {
				left -= v->iov_len;
				rc->iov_idx++;
			} else {
				v->iov_base = (uint8_t *)v->iov_base + left;
				v->iov_len -= left;
				left = 0;
			}
		}
		while (rc->fp_done < rc->nfp && rc->fp[rc->fp_done].end <= rc->b_sent)
			fp_complete(qp, &rc->fp[rc->fp_done++]);
	}
	while (rc->fp_done < rc->nfp)
		fp_complete(qp, &rc->fp[rc->fp_done++]);
	batch_reset(rc);
	__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
	return 1;
}

static void maybe_close_write(struct soft_qp *qp);

/* Transmits what is queued. Returns >0 if something went out. */
static int tx_pump(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	if (rc->hold_first && !rc->term_pending && !rc->b_bytes)
		return 0; /* rx_parse lifts the hold and its caller pumps again */
	if (__atomic_load_n(&qp->pump_blocked, __ATOMIC_RELAXED)) {
		/* TCP was full: ask tcp_poll (lockless) before sendmsg. Retrying sendmsg in a
		 * spin holds the socket lock and delays the very ACKs that would make room. */
		struct pollfd pf = {.fd = qp->fd, .events = POLLOUT};
		if (poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLOUT | POLLERR | POLLHUP)))
			return 0;
	}
	for (;;) {
		if (rc->b_sent < rc->b_bytes) {
			int r = batch_send(qp);
			if (r < 0) {
				rc_fail(qp, r, NULL, false, NULL, 0, 0);
				return did;
			}
			if (r == 0)
				return did;
			did = 1;
		}
		if (rc->term_sent && rc->shut_after_term) {
			rc->shut_after_term = false;
			shutdown(qp->fd, SHUT_WR);
		}
		batch_build(qp);
		if (!rc->b_bytes)
			break;
	}
	maybe_close_write(qp);
	return did;
}

/* ------------------------------------------------------------------ connection end */

/* The connection is over in order: both directions closed. qp->lock held. */
static void rc_closed(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		return;
	rc->ended = true;
	rc->state = DGV_QPS_CLOSED;
	flush_all(qp, DGV_WC_WR_FLUSH_ERR);
	__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
	event_for_qp(qp, DGV_CM_DISCONNECTED, 0, NULL, 0);
}

/* Shuts our direction once dgv_disconnect asked and everything queued went out. */
static void maybe_close_write(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (!rc->want_close || rc->wr_closed || rc->ended || rc->phase != PH_RTS)
		return;
	if (rc->b_bytes || rc->cur || qp->sq_pump != qp->sq_tail || rc->ird_unbuilt || rc->rtr_pending)
		return;
	shutdown(qp->fd, SHUT_WR);
	rc->wr_closed = true;
	if (rc->eof && rc->peer_closed_told)
		rc_closed(qp);
}

/*
 * Ends the connection with an error: QP to ERROR, work requests flushed, the event queued
 * (CONNECT_ERROR before ESTABLISHED, DISCONNECTED after). why: the RFC triple (NULL: none, a
 * TCP error). send_term: a Terminate naming the offending segment (off_hdr, its DDP header and
 * RDMAP header, off_hlen bytes; seg_len the segment's length) goes out first, then our
 * direction is shut. qp->lock held.
 */
static void rc_fail(struct soft_qp *qp, int err, const struct dg_reject *why, bool send_term,
		    const uint8_t *off_hdr, uint32_t off_hlen, uint32_t seg_len)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		return;
	rc->ended = true;
	rc->state = DGV_QPS_ERROR;
	if (why) {
		rc->term_l = why->layer;
		rc->term_t = why->etype;
		rc->term_c = why->ecode;
		if (send_term)
			errq_put(qp, why->layer, why->etype, why->ecode, false, 0, 0, 0, 0, seg_len);
	}
	__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
	if (send_term && why && rc->phase >= PH_WAIT_RTR) {
		/* Finish the FPDU that is half on the wire (from a private copy: the program's
		 * buffers are given back below), drop the rest of the batch, then the Terminate. */
		uint64_t cut = rc->b_sent;
		for (uint32_t i = rc->fp_done; i < rc->nfp; i++)
			if (rc->fp[i].end > rc->b_sent) {
				cut = rc->fp[i].end;
				break;
			}
		if (rc->b_sent == 0 || rc->b_sent == rc->b_bytes)
			cut = rc->b_sent;
		uint64_t rest = cut - rc->b_sent;
		if (rest && (rc->spill || (rc->spill = malloc(RC_FLAT)))) {
			uint64_t o = 0;
			for (int i = rc->iov_idx; i < rc->niov && o < rest; i++) {
				size_t take = rc->iov[i].iov_len < rest - o ? rc->iov[i].iov_len : (size_t)(rest - o);
				memcpy(rc->spill + o, rc->iov[i].iov_base, take);
				o += take;
			}
		} else {
			rest = 0;
		}
		batch_reset(rc);
		if (rest) {
			rc->iov[rc->niov++] = (struct iovec){rc->spill, rest};
			rc->b_bytes = rest;
			rc->fp[rc->nfp++] = (struct rc_fp){.end = rest, .kind = FP_NONE};
		}
		/* Terminate: untagged QN 2, RFC 5040 4.8 */
		uint8_t u[DDP_UNTAGGED_HLEN + RC_TERM_LEN + DDP_UNTAGGED_HLEN + DG_READ_REQ_LEN];
		struct ddp_untagged_hdr *d = (struct ddp_untagged_hdr *)u;
		rc_put_untagged(d, RDMAP_TERMINATE, true, DDP_QN_TERMINATE, rc->msn_term++, 0, 0);
		struct rdmap_rc_terminate t;
		unsigned hdrct = 0;
		uint32_t copy = 0;
		if (off_hdr && off_hlen) {
			hdrct = TERM_HDRCT_M | TERM_HDRCT_D;
			copy = off_hlen > DDP_UNTAGGED_HLEN + DG_READ_REQ_LEN ? DDP_UNTAGGED_HLEN + DG_READ_REQ_LEN
									   : off_hlen;
			if (copy > DDP_UNTAGGED_HLEN)
				hdrct |= TERM_HDRCT_R;
		}
		t.term_ctrl = htobe32(term_ctrl_make(why->layer, why->etype, why->ecode, hdrct));
		t.ddp_seg_len = htobe16((uint16_t)seg_len);
		memcpy(u + DDP_UNTAGGED_HLEN, &t, sizeof t);
		if (copy)
			memcpy(u + DDP_UNTAGGED_HLEN + RC_TERM_LEN, off_hdr, copy);
		uint32_t ulen = DDP_UNTAGGED_HLEN + RC_TERM_LEN + copy;
		rc->term_len = (uint32_t)mpa_fpdu_build(rc->term_fpdu, u, (uint16_t)ulen, rc->info.crc,
							rc->info.markers_tx ? (int64_t)(rc->tx_pos + rest) : -1);
		if (rest)
			rc->tx_pos += rest;
		rc->term_pending = true;
		rc->shut_after_term = true;
	} else if (rc->phase >= PH_TX_REQ) {
		batch_reset(rc);
		shutdown(qp->fd, SHUT_WR);
	} else {
		batch_reset(rc);
	}
	enum dgv_wc_status first = DGV_WC_WR_FLUSH_ERR;
	if (why && !send_term) /* a peer's Terminate: the oldest operation it refers to */
		first = (why->layer == TERM_LAYER_DDP && why->etype == DDP_ETYPE_TAGGED_BUF) ||
				(why->layer == TERM_LAYER_RDMAP && why->etype == RDMAP_ETYPE_REMOTE_PROT)
			? DGV_WC_REM_ACCESS_ERR : DGV_WC_REM_OP_ERR;
	flush_all(qp, first);
	event_for_qp(qp, rc->established ? DGV_CM_DISCONNECTED : DGV_CM_CONNECT_ERROR, err, NULL, 0);
	if (rc->term_pending)
		tx_pump(qp);
}

/* A violation found on an incoming segment: log, Terminate, end. qp->lock held. */
static void rx_violation(struct soft_qp *qp, uint8_t l, uint8_t t, uint8_t c, const char *reason,
			 const uint8_t *seg, uint32_t hlen, uint32_t seglen)
{
	struct dg_reject why = {l, t, c, reason};
	qp->st.malformed_drops++;
	DG_WARN("RC QP fd %d: %s (%u/%u/0x%02x): sending Terminate", qp->fd, reason, l, t, c);
	rc_fail(qp, -EPROTO, &why, true, seg, hlen, seglen);
}

/* ------------------------------------------------------------------ reception */

/* The MR registered under stag in this PD, held, for invalidation; NULL if none. */
static struct soft_mr *mr_by_stag(struct soft_qp *qp, uint32_t stag)
{
	struct soft_mr *mr = atomic_load_explicit(&qp->ctx->mrs[SOFT_MR_INDEX(stag)], memory_order_acquire);
	if (!mr || !stag)
		return NULL;
	atomic_fetch_add(&mr->users, 1);
	if (atomic_load(&mr->stag) != stag || to_spd(mr->pub.pd) != qp->pd) {
		soft_mr_put(mr);
		return NULL;
	}
	return mr;
}

/* Places a tagged segment (Write, Write-Record, Read Response) at [to, to+plen) of stag.
 * Returns 0 or -EPROTO after sending the Terminate. */
static int place_tagged(struct soft_qp *qp, uint32_t stag, uint64_t to, const uint8_t *pl, uint32_t plen,
			unsigned access, const uint8_t *seg, uint32_t hlen, uint32_t seglen)
{
	if (!plen)
		return 0; /* zero-length tagged messages are not checked (RFC 6581 RTR, siw) */
	struct dg_reject why;
	struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, stag, to, plen, access, &why);
	if (mr && access != DGV_ACCESS_LOCAL_WRITE &&
	    atomic_load_explicit(&mr->invalid_stag, memory_order_relaxed) == stag) {
		soft_mr_put(mr);
		mr = NULL;
		why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG,
					 "invalidated STag"};
	}
	if (!mr) {
		qp->st.placement_rejects++;
		rx_violation(qp, why.layer, why.etype, why.ecode, why.reason, seg, hlen, seglen);
		return -EPROTO;
	}
	memcpy((void *)(uintptr_t)to, pl, plen);
	soft_mr_put(mr);
	return 0;
}

/* The responder's first FPDU in peer-to-peer mode must be the RTR (RFC 6581 section 7).
 * Returns 1 if this was it (consumed), 0 if not an RTR. */
static bool is_rtr(uint8_t op, bool tagged, uint32_t plen, uint32_t read_size)
{
	if (tagged)
		return op == RDMAP_WRITE && plen == 0;
	if (op == RDMAP_READ_REQ)
		return read_size == 0;
	return op == RDMAP_SEND && plen == 0;
}

static void become_rts(struct soft_qp *qp, const uint8_t *pdata, uint16_t pdlen);

/*
 * Handles one DDP segment (ULPDU of len bytes). Returns 0 (consumed), -EAGAIN (receiver not
 * ready: no receive posted or a CQ full; the segment stays in the stream buffer and TCP holds
 * the peer back) or -EPROTO (connection ended with a Terminate).
 */
static int rx_segment(struct soft_qp *qp, const uint8_t *buf, uint32_t len)
{
	struct rc_conn *rc = qp->rc;
	uint16_t ctrl = (uint16_t)(buf[0] << 8 | buf[1]);
	bool tagged = ctrl & DDP_CTRL_TAGGED;
	bool last = ctrl & DDP_CTRL_LAST;
	uint8_t op = ctrl & RDMAP_CTRL_OPCODE;
	uint32_t hlen = tagged ? DDP_TAGGED_HLEN : DDP_UNTAGGED_HLEN;
	uint8_t dtype = tagged ? DDP_ETYPE_TAGGED_BUF : DDP_ETYPE_UNTAGGED_BUF;
	uint8_t dver = tagged ? DDP_ECODE_T_INVALID_VERSION : DDP_ECODE_UT_INVALID_VERSION;
	if (len < hlen) {
		rx_violation(qp, TERM_LAYER_DDP, dtype, dver, "segment shorter than its DDP header", buf, 0, len);
		return -EPROTO;
	}
	if ((ctrl & DDP_CTRL_DV_MASK) != DDP_CTRL_DV_1 || (ctrl & DDP_CTRL_RSVD)) {
		rx_violation(qp, TERM_LAYER_DDP, dtype, dver, "bad DDP version or reserved bits", buf, 0, len);
		return -EPROTO;
	}
	if ((ctrl & RDMAP_CTRL_RV_MASK) != RDMAP_CTRL_RV_1 || (ctrl & RDMAP_CTRL_RSVD)) {
		rx_violation(qp, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
			     "bad RDMAP version or reserved bits", buf, 0, len);
		return -EPROTO;
	}
	bool op_tagged = op == RDMAP_WRITE || op == RDMAP_READ_RESP || op == RDMAP_WRITE_RECORD;
	if (op > RDMAP_OPCODE_MAX || op_tagged != tagged) {
		rx_violation(qp, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_UNEXPECTED_OPCODE,
			     "unexpected opcode", buf, hlen, len);
		return -EPROTO;
	}
	const uint8_t *pl = buf + hlen;
	uint32_t plen = len - hlen;
	qp->st.rx_datagrams++;
	if (tagged) {
		struct ddp_tagged_hdr h;
		memcpy(&h, buf, sizeof h);
		uint32_t stag = be32toh(h.stag);
		uint64_t to = be64toh(h.to);
		if (rc->phase == PH_WAIT_RTR) {
			if (!is_rtr(op, true, plen, 0) || !last) {
				rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
					     "first FPDU is not the RTR message", buf, hlen, len);
				return -EPROTO;
			}
			become_rts(qp, NULL, 0);
			return 0;
		}
		if (plen && to + plen < to) {
			rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_TO_WRAP,
				     "tagged offset wraps", buf, hlen, len);
			return -EPROTO;
		}
		if (op == RDMAP_READ_RESP) {
			if (rc->rtr_read_wait && plen == 0 && last) {
				rc->rtr_read_wait = false;
				return 0;
			}
			struct soft_ord *o = &qp->ord[rc->ord_head];
			if (!qp->ord_count || !o->used || stag != o->stag || to != o->to + o->got ||
			    plen > o->len - o->got) {
				rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
					     "Read Response outside the outstanding Read", buf, hlen, len);
				return -EPROTO;
			}
			if (last && soft_cq_full(qp->scq))
				return -EAGAIN;
			if (place_tagged(qp, stag, to, pl, plen, DGV_ACCESS_LOCAL_WRITE, buf, hlen, len))
				return -EPROTO;
			o->got += plen;
			qp->st.rx_bytes += plen;
			if (last) {
				if (o->got != o->len) {
					rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
						     "Read Response shorter than the Read", buf, hlen, len);
					return -EPROTO;
				}
				o->used = false;
				rc->ord_head = (rc->ord_head + 1) % SOFT_MAX_ORD;
				qp->ord_count--;
				qp->sq[o->sq_idx].read_ord = false;
				sq_done(qp, o->sq_idx, DGV_WC_SUCCESS, o->len);
			}
			return 0;
		}
		/* Write and Write-Record: messages are never interleaved on the stream, so the
		 * segments of one message follow each other with contiguous tagged offsets. */
		if (rc->t_active && (op != rc->t_op || stag != rc->t_stag || to != rc->t_next)) {
			rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
				     "tagged segment does not continue its message", buf, hlen, len);
			return -EPROTO;
		}
		if (op == RDMAP_WRITE_RECORD && last && soft_cq_full(qp->rcq))
			return -EAGAIN;
		if (place_tagged(qp, stag, to, pl, plen, DGV_ACCESS_REMOTE_WRITE, buf, hlen, len))
			return -EPROTO;
		qp->st.rx_bytes += plen;
		if (!rc->t_active) {
			rc->t_active = true;
			rc->t_op = op;
			rc->t_stag = stag;
			rc->t_base = to;
			rc->t_len = 0;
		}
		rc->t_len += plen;
		rc->t_next = to + plen;
		if (last) {
			rc->t_active = false;
			qp->st.rx_msgs++;
			if (op == RDMAP_WRITE_RECORD) {
				struct dgv_range r = {0, rc->t_len};
				struct dgv_wc wc = {.opcode = DGV_WC_RECV_WRITE_RECORD, .byte_len = rc->t_len,
						    .qp = &qp->base, .src = rc->info.peer,
						    .src_len = rc->info.peer_len};
				wc.record = (struct dgv_record){.stag = rc->t_stag, .base = rc->t_base,
								.length = rc->t_len, .valid_bytes = rc->t_len,
								.nranges = 1};
				if (soft_cq_push(qp->rcq, &wc, NULL, &r))
					qp->st.cq_overflows++;
			}
		}
		return 0;
	}
	/* untagged */
	struct ddp_untagged_hdr h;
	memcpy(&h, buf, sizeof h);
	uint32_t qn = be32toh(h.qn), msn = be32toh(h.msn), mo = be32toh(h.mo), inv = be32toh(h.inv_stag);
	uint32_t want_qn = op == RDMAP_READ_REQ ? DDP_QN_READ_REQ : op == RDMAP_TERMINATE ? DDP_QN_TERMINATE
											     : DDP_QN_SEND;
	if (qn != want_qn) {
		rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_QN,
			     "invalid queue number", buf, hlen, len);
		return -EPROTO;
	}
	if (op == RDMAP_TERMINATE) {
		/* the peer's Terminate: report its triple, end (RFC 5040 4.8, 6.x) */
		if (plen < 4 || !last || mo) {
			struct dg_reject why = {TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
						"truncated Terminate"};
			rc_fail(qp, -ECONNRESET, &why, false, NULL, 0, 0);
			return -EPROTO;
		}
		uint32_t tc = (uint32_t)pl[0] << 24 | (uint32_t)pl[1] << 16 | (uint32_t)pl[2] << 8 | pl[3];
		struct dg_reject why = {(uint8_t)(tc >> 28), (uint8_t)((tc >> 24) & 0xf), (uint8_t)((tc >> 16) & 0xff),
					"Terminate received"};
		qp->st.terminates_rcvd++;
		errq_put(qp, why.layer, why.etype, why.ecode, true, 0, msn, 0, 0, 0);
		DG_WARN("RC QP fd %d: peer sent Terminate %u/%u/0x%02x (%s)", qp->fd, why.layer, why.etype,
			why.ecode, dgv_err_str(why.layer, why.etype, why.ecode));
		rc_fail(qp, -ECONNRESET, &why, false, NULL, 0, 0);
		return -EPROTO;
	}
	bool mid = qn == DDP_QN_SEND && rc->rcv_active;
	if (mid ? msn != rc->rcv_msn : msn != rc->exp_msn[qn]) {
		rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MSN_RANGE,
			     "unexpected MSN", buf, hlen, len);
		return -EPROTO;
	}
	if (mid ? mo != rc->rcv_off : mo != 0) {
		rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MO,
			     "unexpected message offset", buf, hlen, len);
		return -EPROTO;
	}
	if (op == RDMAP_READ_REQ) {
		if (plen != DG_READ_REQ_LEN || !last) {
			rx_violation(qp, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
				     "Read Request not exactly 28 bytes", buf, hlen, len);
			return -EPROTO;
		}
		struct rdmap_read_req r;
		memcpy(&r, pl, sizeof r);
		uint32_t size = be32toh(r.read_size);
		if (rc->phase == PH_WAIT_RTR && !is_rtr(op, false, plen, size)) {
			rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
				     "first FPDU is not the RTR message", buf, hlen + plen, len);
			return -EPROTO;
		}
		if (qp->ird_count >= rc->info.ird && !(rc->phase == PH_WAIT_RTR && qp->ird_count < SOFT_MAX_IRD)) {
			rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_NO_BUFFER,
				     "Read Request beyond the negotiated IRD", buf, hlen + plen, len);
			return -EPROTO;
		}
		if (size > qp->max_msg) {
			rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
				     "Read larger than max_msg_size", buf, hlen + plen, len);
			return -EPROTO;
		}
		uint32_t src_stag = be32toh(r.src_stag);
		uint64_t src_to = be64toh(r.src_to);
		if (size) {
			struct dg_reject why;
			struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, src_stag, src_to, size,
								DGV_ACCESS_REMOTE_READ, &why);
			if (mr && atomic_load_explicit(&mr->invalid_stag, memory_order_relaxed) == src_stag) {
				soft_mr_put(mr);
				mr = NULL;
				why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG,
							 "invalidated STag"};
			}
			if (!mr) {
				qp->st.placement_rejects++;
				rx_violation(qp, why.layer, why.etype, why.ecode, why.reason, buf, hlen + plen, len);
				return -EPROTO;
			}
			soft_mr_put(mr);
		}
		rc->exp_msn[DDP_QN_READ_REQ]++;
		uint32_t slot = (rc->ird_head + rc->ird_unbuilt) % SOFT_MAX_IRD;
		qp->ird[slot] = (struct soft_ird){.used = true, .msn = msn, .src_stag = src_stag,
						  .sink_stag = be32toh(r.sink_stag), .src_to = src_to,
						  .sink_to = be64toh(r.sink_to), .len = size};
		qp->ird_count++;
		rc->ird_unbuilt++;
		if (rc->phase == PH_WAIT_RTR)
			become_rts(qp, NULL, 0);
		return 0;
	}
	/* the four Sends */
	if (rc->phase == PH_WAIT_RTR) {
		if (!is_rtr(op, false, plen, 0) || !last) {
			rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
				     "first FPDU is not the RTR message", buf, hlen, len);
			return -EPROTO;
		}
		rc->exp_msn[DDP_QN_SEND]++;
		become_rts(qp, NULL, 0);
		return 0;
	}
	if (!mid) {
		if (!qp->rq_count || soft_cq_full(qp->rcq))
			return -EAGAIN; /* receiver not ready: TCP flow control holds the peer */
		soft_rq_pop(qp, &rc->rcv);
		rc->rcv_active = true;
		rc->rcv_off = 0;
		rc->rcv_msn = msn;
		rc->rcv_op = op;
		rc->rcv_inv = inv;
	}
	if (plen > rc->rcv.len - rc->rcv_off || (uint64_t)rc->rcv_off + plen > qp->max_msg) {
		recv_done(qp, &rc->rcv, DGV_WC_LOC_LEN_ERR, rc->rcv_off, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
		rx_violation(qp, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_MSG_TOO_LONG,
			     "Send longer than the posted receive", buf, hlen, len);
		return -EPROTO;
	}
	if (plen && soft_rwqe_copy(qp, &rc->rcv, rc->rcv_off, pl, plen)) {
		recv_done(qp, &rc->rcv, DGV_WC_LOC_PROT_ERR, rc->rcv_off, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
		struct dg_reject why = {TERM_LAYER_RDMAP, RDMAP_ETYPE_CATASTROPHIC, 0, "receive buffer deregistered"};
		rc_fail(qp, -EFAULT, &why, true, buf, hlen, len);
		return -EPROTO;
	}
	rc->rcv_off += plen;
	qp->st.rx_bytes += plen;
	if (!last)
		return 0;
	rc->rcv_active = false;
	rc->exp_msn[DDP_QN_SEND]++;
	unsigned flags = (rc->rcv_op == RDMAP_SEND_SE || rc->rcv_op == RDMAP_SEND_SE_INV) ? DGV_WC_SOLICITED : 0;
	uint32_t invd = 0;
	if (rc->rcv_op == RDMAP_SEND_INV || rc->rcv_op == RDMAP_SEND_SE_INV) {
		struct soft_mr *mr = mr_by_stag(qp, rc->rcv_inv);
		if (!mr) {
			recv_done(qp, &rc->rcv, DGV_WC_REM_OP_ERR, rc->rcv_off, rc->rcv_msn, flags, 0);
			rx_violation(qp, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_CANNOT_INVALIDATE,
				     "Send with Invalidate names an unknown STag", buf, hlen, len);
			return -EPROTO;
		}
		atomic_store(&mr->invalid_stag, rc->rcv_inv);
		soft_mr_put(mr);
		flags |= DGV_WC_WITH_INV;
		invd = rc->rcv_inv;
	}
	recv_done(qp, &rc->rcv, DGV_WC_SUCCESS, rc->rcv_off, rc->rcv_msn, flags, invd);
	return 0;
}

/* Parses the FPDUs in the stream buffer. Returns >0 if it consumed any, 0 if it needs more
 * bytes or is paused, -EPROTO when the connection ended. */
static int rx_parse(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	while (!rc->ended && (rc->phase == PH_RTS || rc->phase == PH_WAIT_RTR)) {
		uint32_t avail = rc->rx_end - rc->rx_start;
		uint8_t *p = rc->rxb + rc->rx_start;
		uint32_t lo = 0; /* offset of the length field */
		if (rc->info.markers_rx && rc->rx_pos % MPA_MARKER_SPACING == 0)
			lo = MPA_MARKER_LEN;
		if (avail < lo + 2)
			break;
		uint32_t ulen = (uint32_t)p[lo] << 8 | p[lo + 1];
		if (ulen < DDP_TAGGED_HLEN || ulen > rc->rx_max_ulpdu) {
			static const uint8_t none[1];
			rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_MARKER,
				     ulen < DDP_TAGGED_HLEN ? "ULPDU shorter than a DDP header"
							    : "ULPDU longer than MULPDU",
				     none, 0, ulen);
			return -EPROTO;
		}
		uint32_t flen = mpa_fpdu_len(ulen);
		uint32_t raw = rc->info.markers_rx ? mpa_raw_len(rc->rx_pos, flen) : flen;
		if (avail < raw)
			break;
		if (rc->info.crc && mpa_crc_get(p + raw - MPA_CRC_LEN) != dg_crc32c(p, raw - MPA_CRC_LEN)) {
			qp->st.crc_drops++;
			rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_CRC, "FPDU CRC mismatch", p + lo + 2,
				     0, ulen);
			return -EPROTO;
		}
		const uint8_t *ulpdu = p + 2;
		if (rc->info.markers_rx) {
			int n = mpa_strip_markers(rc->rx_flat, p, raw, rc->rx_pos);
			if (n != (int)flen) {
				rx_violation(qp, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_MARKER, "bad marker", p, 0, ulen);
				return -EPROTO;
			}
			ulpdu = rc->rx_flat + 2;
		}
		int r = rx_segment(qp, ulpdu, ulen);
		if (r == -EAGAIN) {
			rc->rx_paused = true;
			__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
			break;
		}
		if (r < 0)
			return r;
		rc->rx_start += raw;
		rc->rx_pos += raw;
		rc->hold_first = false;
		did = 1;
	}
	return did;
}

/* Reads the socket into the stream buffer and parses. Returns >0 if it did something. */
static int rx_pump(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	if (rc->rx_paused) {
		rc->rx_paused = false;
		__atomic_store_n(&qp->rx_hold, false, __ATOMIC_RELAXED);
	}
	bool drained = false;
	for (int round = 0; round < 64 && !rc->ended; round++) {
		int r = rx_parse(qp);
		if (r < 0)
			return 1;
		did |= r;
		if (rc->rx_paused || rc->ended)
			break;
		if (rc->eof) {
			if (rc->rx_end != rc->rx_start) {
				struct dg_reject why = {TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_TCP_LOST,
							"stream ended inside an FPDU"};
				DG_WARN("RC QP fd %d: %s", qp->fd, why.reason);
				rc_fail(qp, -ECONNRESET, &why, false, NULL, 0, 0);
				return 1;
			}
			if (!rc->peer_closed_told) {
				rc->peer_closed_told = true;
				__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
				if (rc->wr_closed) {
					rc_closed(qp);
				} else {
					rc->state = DGV_QPS_CLOSING;
					event_for_qp(qp, DGV_CM_PEER_CLOSED, 0, NULL, 0);
				}
			}
			break;
		}
		if (drained)
			break;
		if (rc->rx_start == rc->rx_end) {
			rc->rx_start = rc->rx_end = 0;
		} else if (RC_RXBUF - rc->rx_end < RC_RX_ROOM) {
			memmove(rc->rxb, rc->rxb + rc->rx_start, rc->rx_end - rc->rx_start);
			rc->rx_end -= rc->rx_start;
			rc->rx_start = 0;
		}
		uint32_t space = RC_RXBUF - rc->rx_end;
		if (round == 0 && rc->empty_probes >= 4) {
			/* Busy polling: ask tcp_poll (lockless) first. A recv() on an empty socket
			 * takes the socket lock, and segments arriving meanwhile wait in the
			 * backlog until it is released: measured, that doubles ping-pong latency
			 * under a spinning poller. A few direct probes first keep the blocking path
			 * (poll_cq, then cq_wait) at one syscall per look. */
			struct pollfd pf = {.fd = qp->fd, .events = POLLIN};
			if (poll(&pf, 1, 0) <= 0)
				break;
		}
		ssize_t n = recv(qp->fd, rc->rxb + rc->rx_end, space, MSG_DONTWAIT);
		if (n > 0) {
			rc->rx_end += (uint32_t)n;
			rc->empty_probes = 0;
			did = 1;
			if ((uint32_t)n < space)
				drained = true; /* parse what came, then stop (no EAGAIN recv) */
			continue;
		}
		if (n == 0) {
			rc->eof = true;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			rc->empty_probes++;
		} else {
			int err = -errno;
			DG_WARN("RC QP fd %d: TCP error: %s", qp->fd, strerror(-err));
			rc_fail(qp, err, NULL, false, NULL, 0, 0);
			return 1;
		}
		break;
	}
	return did;
}

/* ------------------------------------------------------------------ connection set-up */

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
static void become_rts(struct soft_qp *qp, const uint8_t *pdata, uint16_t pdlen)
{
	struct rc_conn *rc = qp->rc;
	rc->phase = PH_RTS;
	rc->state = rc->want_close ? DGV_QPS_CLOSING : DGV_QPS_RTS;
	rc->established = true;
	event_for_qp(qp, DGV_CM_ESTABLISHED, 0, pdata, pdlen);
}

/* Sends the rest of rc->mpa_out. Returns 1 when all sent, 0 when TCP is full, -errno. */
static int mpa_send(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	while (rc->mpa_out_sent < rc->mpa_out_len) {
		ssize_t n = send(qp->fd, rc->mpa_out + rc->mpa_out_sent, rc->mpa_out_len - rc->mpa_out_sent,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
				return 0;
			}
			return -errno;
		}
		rc->mpa_out_sent += (uint32_t)n;
	}
	__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
	return 1;
}

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
		rc->ended = true;
		rc->state = DGV_QPS_ERROR;
		__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
		flush_all(qp, DGV_WC_WR_FLUSH_ERR);
		event_for_qp(qp, DGV_CM_REJECTED, -ECONNREFUSED, rr.pdata, rr.pd_len);
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
	become_rts(qp, rr.pdata, rr.pd_len);
}

/* Connection set-up steps. Returns >0 when something moved. */
static int setup_step(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
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
		rc->mpa_out_len = (uint32_t)mpa_rr_build(rc->mpa_out, true, flags, rc->want_rev,
							 rc->want_rev == 2 ? &v2 : NULL, rc->pdata, rc->pd_len);
		rc->phase = PH_TX_REQ;
		did = 1;
	}
	if (rc->phase == PH_TX_REQ || rc->phase == PH_TX_REP) {
		int r = mpa_send(qp);
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
			become_rts(qp, NULL, 0);
		}
	}
	if (rc->phase == PH_RX_REP) {
		/* read the Reply; anything after it stays in the buffer as the first FPDUs */
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
			ssize_t n = recv(qp->fd, rc->rxb + rc->rx_end, RC_RXBUF - RC_RX_ROOM - rc->rx_end, MSG_DONTWAIT);
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
	if (block)
		pthread_mutex_lock(&qp->lock);
	else if (pthread_mutex_trylock(&qp->lock))
		return -EBUSY;
	struct rc_conn *rc = qp->rc;
	qp->now_us = 0;
	int did = 0;
	if (!rc->ended) {
		if (rc->phase < PH_WAIT_RTR)
			did |= setup_step(qp);
		if (!rc->ended && rc->phase >= PH_WAIT_RTR) {
			did |= rx_pump(qp);
			if (rc->b_bytes || rc->term_pending || qp->sq_pump != qp->sq_tail || rc->ird_unbuilt ||
			    rc->rtr_pending || rc->want_close || rc->cur)
				did |= tx_pump(qp);
		}
		if (!rc->ended && rc->phase < PH_RTS && rc_now(qp) >= rc->deadline_us)
			setup_fail(qp, -ETIMEDOUT, "MPA exchange timed out");
	} else if (rc->b_bytes || rc->term_pending) {
		tx_pump(qp); /* the Terminate still going out */
	}
	pthread_mutex_unlock(&qp->lock);
	return did;
}

bool soft_rc_wants_pollout(struct soft_qp *qp)
{
	return __atomic_load_n(&qp->pump_blocked, __ATOMIC_RELAXED);
}

bool soft_rc_timers_pending(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	/* everything soft_rc_progress would send without news from the peer */
	return (!rc->ended && rc->phase < PH_RTS) || qp->pump_blocked || qp->sq_pump != qp->sq_tail ||
	       rc->b_bytes || rc->term_pending || rc->ird_unbuilt || rc->rtr_pending || rc->want_close || rc->cur;
}

uint64_t soft_rc_next_timer_locked(struct soft_qp *qp, uint64_t now)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended || rc->phase >= PH_RTS)
		return UINT64_MAX;
	return rc->deadline_us > now ? rc->deadline_us - now : 0;
}

/* ------------------------------------------------------------------ verbs on RC QPs */

int soft_rc_post_send(struct soft_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	struct rc_conn *rc = qp->rc;
	int ret = 0;
	pthread_mutex_lock(&qp->lock);
	for (; wr; wr = wr->next) {
		if ((unsigned)wr->opcode > DGV_WR_SEND_SE_INV || wr->opcode == DGV_WR_SEND_PLAIN || wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list) ||
		    (wr->opcode == DGV_WR_READ && wr->num_sge != 1)) {
			ret = -EINVAL;
			break;
		}
		if (qp->sq_tail - qp->sq_head >= qp->sq_cap) {
			ret = -ENOMEM;
			break;
		}
		uint64_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		if (total > qp->max_msg) {
			ret = -EMSGSIZE;
			break;
		}
		int bad_sge = 0;
		for (int i = 0; i < wr->num_sge; i++)
			if (soft_mr_check_local(qp->ctx, qp->pd, &wr->sg_list[i], wr->opcode == DGV_WR_READ))
				bad_sge = 1;
		uint32_t idx = qp->sq_tail % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		*w = (struct soft_swqe){.wr_id = wr->wr_id, .opcode = wr->opcode, .flags = wr->send_flags,
					.num_sge = (uint32_t)wr->num_sge, .len = (uint32_t)total,
					.remote_addr = wr->remote_addr, .rkey = wr->rkey,
					.inv_stag = wr->invalidate_rkey, .gen = w->gen + 1};
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
		qp->sq_tail++;
		if (bad_sge)
			sq_done(qp, idx, DGV_WC_LOC_PROT_ERR, 0);
		else if (rc->ended || rc->wr_closed || rc->want_close)
			sq_done(qp, idx, DGV_WC_WR_FLUSH_ERR, 0);
	}
	*bad = wr;
	if (!rc->ended && rc->phase == PH_RTS && !rc->b_bytes)
		tx_pump(qp);
	pthread_mutex_unlock(&qp->lock);
	return ret;
}

void soft_rc_after_post_recv(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		flush_all(qp, DGV_WC_WR_FLUSH_ERR);
}

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
			tx_pump(qp);
	}
	pthread_mutex_unlock(&qp->lock);
	soft_qp_progress(qp, true, true);
	return ret;
}

enum dgv_qp_state soft_rc_qp_state(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	enum dgv_qp_state s = qp->rc->state;
	pthread_mutex_unlock(&qp->lock);
	return s;
}

int soft_rc_conn_info(struct dgv_qp *qpb, struct dgv_conn_info *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	int ret = qp->rc->established ? 0 : -ENOTCONN;
	if (!ret)
		*out = qp->rc->info;
	pthread_mutex_unlock(&qp->lock);
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
	set_nodelay(fd);
	if (ctx->loop && loop_locked) {
		ev_io_init(&r->io, req_io_cb, fd, EV_READ);
		r->io.data = r;
		ev_io_start(ctx->loop, &r->io);
		r->io_on = true;
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

void soft_rc_tick(struct soft_ctx *ctx)
{
	struct rc_cm *cm = ctx->cm;
	if (pthread_mutex_trylock(&cm->lock))
		return;
	uint64_t now = dg_now_us();
	for (struct soft_conn_req *r = cm->reqs, *nx; r; r = nx) {
		nx = r->next;
		if (r->state == REQ_READING)
			req_step(cm, r, now);
	}
	pthread_mutex_unlock(&cm->lock);
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
	struct soft_conn_req *r = req_new(ctx, fd, false, ch_or_default(ctx, chb), user, NULL, true);
	if (r)
		req_step(ctx->cm, r, dg_now_us());
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

/* Takes r out of the registry without freeing (accept hands its descriptor to a QP). */
static void req_detach(struct soft_ctx *ctx, struct soft_conn_req *r)
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
	if (ctx->loop)
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
	req_detach(ctx, r);
	struct rc_conn *rc = qp->rc;
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
	rc->mpa_out_len = (uint32_t)mpa_rr_build(rc->mpa_out, false, flags, rc->info.mpa_rev, v2, rc->pdata,
						 rc->pd_len);
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
	req_detach(ctx, r);
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
	for (struct rc_conn *rc = cm->conns; rc && nq < 64; rc = rc->next)
		if (!ch || rc->ch == ch) {
			snap[nq++] = rc->qp;
			atomic_fetch_add(&rc->qp->refs, 1);
		}
	pthread_mutex_unlock(&cm->lock);
	if (ctx->loop)
		pthread_mutex_unlock(&ctx->loop_lock);
	for (int i = 0; i < nq; i++) {
		struct soft_qp *qp = snap[i];
		soft_qp_progress(qp, false, false);
		if (n < max && !qp->rc->ended) {
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
	ch->count--;
	pthread_mutex_unlock(&ch->lock);
	uint64_t v;
	ssize_t r = read(ch->efd, &v, sizeof v);
	(void)r;
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
		pfd[0] = (struct pollfd){.fd = ch->efd, .events = POLLIN};
		/* short slices: a deadline of a request or a QP of this channel may pass meanwhile */
		uint64_t left = deadline - now;
		int ms = left > 20000 ? 20 : (int)((left + 999) / 1000);
		int r = poll(pfd, (nfds_t)n + 1, ms);
		if (r < 0 && errno == EINTR)
			return -EINTR;
	}
}

/* ------------------------------------------------------------------ context */

int soft_rc_ctx_init(struct soft_ctx *ctx)
{
	struct rc_cm *cm = calloc(1, sizeof *cm);
	if (!cm)
		return -ENOMEM;
	pthread_mutex_init(&cm->lock, NULL);
	cm->def = ch_new(ctx);
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
