/*
 * rc_tx.c - RC queue pairs of the soft RNIC, transmission: RDMAP (RFC 5040) Send (SE,
 * Invalidate), RDMA Write, Write-Record (paper 000 IV.B.3), Read Request, Read Response and
 * Terminate cut into DDP segments (RFC 5041) and framed as MPA FPDUs (RFC 5044: length, pad,
 * CRC32c, optional markers); several FPDUs go out in one sendmsg.
 *
 * rc_int.h describes the split and the locks: everything here runs under qp->lock.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "crc.h"
#include "log.h"
#include "mpa.h"
#include "rc_int.h"
#include "sys.h"

/* ------------------------------------------------------------------ completions */

static const enum dgv_wc_opcode wc_of_wr[] = {
	[DGV_WR_SEND] = DGV_WC_SEND, [DGV_WR_SEND_SE] = DGV_WC_SEND, [DGV_WR_WRITE] = DGV_WC_WRITE,
	[DGV_WR_WRITE_RECORD] = DGV_WC_WRITE_RECORD, [DGV_WR_READ] = DGV_WC_READ,
	[DGV_WR_SEND_PLAIN] = DGV_WC_SEND_PLAIN, [DGV_WR_SEND_INV] = DGV_WC_SEND,
	[DGV_WR_SEND_SE_INV] = DGV_WC_SEND};

/* Marks the send WQE at position pos done; completions are pushed in posting order (a Send
 * posted after a Read completes after it, as on a hardware RNIC). qp->lock held. */
void rc_sq_done(struct soft_qp *qp, uint32_t pos, enum dgv_wc_status st, uint32_t bytes)
{
	struct soft_swqe *w = soft_sq_at(qp, pos);
	if (w->done)
		return;
	w->done = true;
	w->rc_status = (uint8_t)st;
	w->rc_bytes = bytes;
	while (qp->sq_head != qp->sq_tail) {
		struct soft_swqe *h = soft_sq_at(qp, qp->sq_head);
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

/* ------------------------------------------------------------------ transmission */

/* n bytes of the batch's staging area for FPDU headers and trailers; NULL when it is full. */
static uint8_t *hstage(struct rc_conn *rc, uint32_t n)
{
	if (rc->hused + n > RC_HBUF)
		return NULL;
	uint8_t *p = rc->bt->hbuf + rc->hused;
	rc->hused += n;
	return p;
}

/* rc_int.h. */
void rc_batch_reset(struct rc_conn *rc)
{
	rc->niov = rc->iov_idx = 0;
	rc->b_bytes = rc->b_sent = 0;
	rc->nfp = rc->fp_done = 0;
	rc->hused = 0;
}

/* An empty batch's memory goes back to the thread's spares (rc_tx_pump, when it is done). */
static void batch_release(struct rc_conn *rc)
{
	if (rc->bt && !rc->b_bytes) {
		dg_spare_put(DG_SPARE_RC_BATCH, rc->bt, sizeof *rc->bt);
		rc->bt = NULL;
	}
}

/* The batch's vectors and staging, attached if they are not. Returns false when there is no
 * memory for them (the caller builds nothing: what is queued waits for a later pump). */
static bool batch_get(struct rc_conn *rc)
{
	if (!rc->bt && !(rc->bt = dg_spare_get(DG_SPARE_RC_BATCH, sizeof *rc->bt))) {
		DG_WARN("RC connection: no memory for a transmit batch");
		return false;
	}
	return true;
}

/* The FPDU just added completes something when its last byte is handed to TCP. */
static void fp_mark_last(struct rc_conn *rc, uint8_t kind, uint32_t idx)
{
	rc->bt->fp[rc->nfp - 1].kind = kind;
	rc->bt->fp[rc->nfp - 1].idx = idx;
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
		rc->bt->iov[rc->niov++] = (struct iovec){rc->marked, n};
		rc->b_bytes += n;
		rc->bt->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_NONE};
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
	rc->bt->iov[rc->niov++] = (struct iovec){h, 2 + hlen};
	for (int i = 0; i < npl; i++)
		rc->bt->iov[rc->niov++] = pl[i];
	rc->bt->iov[rc->niov++] = (struct iovec){t, pad + MPA_CRC_LEN};
	uint32_t flen = mpa_fpdu_len(ulen);
	rc->b_bytes += flen;
	rc->bt->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_NONE};
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
	uint32_t pos = qp->sq_pump;
	struct soft_swqe *w = soft_sq_at(qp, pos);
	struct iovec pl[SOFT_MAX_SGE];
	if (w->opcode == DGV_WR_READ) {
		if (qp->ord_count >= rc->info.ord)
			return -EAGAIN;
		struct rc_read_req_msg h;
		uint32_t msn = rc->msn_read;
		rc_put_untagged(&h.ddp, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, msn, 0, 0);
		dg_put_read_req(&h.req, w->sge[0].lkey, w->sge[0].addr, w->len, w->rkey, w->remote_addr);
		if (batch_fpdu(qp, &h, sizeof h, NULL, 0, 0))
			return -ENOSPC;
		rc->msn_read++;
		w->msn = msn;
		w->sent = 1;
		w->read_ord = true;
		struct soft_ord *o = &qp->x->ord[(rc->ord_head + qp->ord_count) % SOFT_MAX_ORD];
		*o = (struct soft_ord){.used = true, .sq_idx = pos, .msn = msn, .stag = w->sge[0].lkey,
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
	fp_mark_last(rc, FP_SQ_DONE, pos);
	return 1;
}

/* One FPDU of the Read Response at the IRD head. Returns 1 when complete, 0 when more follow,
 * -ENOSPC, or -EFAULT when the source region became invalid (a Terminate was sent). */
static int emit_ird(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	struct soft_ird *r = &qp->x->ird[rc->ird_head];
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
		struct rc_read_req_msg h;
		rc_put_untagged(&h.ddp, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, rc->msn_read, 0, 0);
		dg_put_read_req(&h.req, RC_STAG_RTR, 0, 0, 0, 0);
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
	if (!batch_get(rc))
		return;
	if (rc->term_pending) {
		rc->bt->iov[rc->niov++] = (struct iovec){rc->term_fpdu, rc->term_len};
		rc->b_bytes += rc->term_len;
		rc->tx_pos += rc->term_len;
		rc->bt->fp[rc->nfp++] = (struct rc_fp){.end = rc->b_bytes, .kind = FP_TERM};
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
				struct soft_swqe *w = soft_sq_at(qp, qp->sq_pump);
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

/* What an FPDU finishes once its last byte is in TCP: its send WQE completes, its IRD entry is
 * free again, or the Terminate counts as sent. */
static void fp_complete(struct soft_qp *qp, const struct rc_fp *f)
{
	struct rc_conn *rc = qp->rc;
	switch (f->kind) {
	case FP_SQ_DONE: {
		struct soft_swqe *w = soft_sq_at(qp, f->idx);
		if (!rc->ended)
			rc_sq_done(qp, f->idx, DGV_WC_SUCCESS, w->len);
		break;
	}
	case FP_IRD_DONE:
		if (!rc->ended) {
			qp->x->ird[f->idx].used = false;
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

/* TCP had no room: the pump waits for POLLOUT. Returns 0 (nothing sent). */
static ssize_t tcp_full(struct soft_qp *qp)
{
	__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
	/* the thread finishes it, completing sends while the program may wait:
	 * soft_qp_self_driven is false from now on (its waiters take the eventfd) */
	if (qp->rx_app && !qp->tx_refused) {
		__atomic_store_n(&qp->tx_refused, true, __ATOMIC_RELEASE);
		/* the tick reads it without the lock: a fence each side of the flags */
		atomic_thread_fence(memory_order_seq_cst);
		soft_tick_need(qp->ctx);
	}
	return 0;
}

/* rc_send_some under the test hook soft_qp_test_tx_cap (qp.c). */
static ssize_t test_capped(struct soft_qp *qp, const struct iovec *iov, int n)
{
	if (qp->tx_test_cap == UINT32_MAX)
		return tcp_full(qp);
	struct iovec v[RC_IOV];
	size_t cap = qp->tx_test_cap;
	int k = 0;
	for (; k < n && k < RC_IOV && cap; k++) {
		v[k] = iov[k];
		if (v[k].iov_len > cap)
			v[k].iov_len = cap;
		cap -= v[k].iov_len;
	}
	qp->tx_test_cap = UINT32_MAX;
	struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)k};
	ssize_t r = dg_sys_sendmsg(qp->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	return r == -EAGAIN ? tcp_full(qp) : r;
}

/* rc_int.h. MSG_NOSIGNAL: a peer's reset is an error return here, never SIGPIPE in the program. */
ssize_t rc_send_some(struct soft_qp *qp, const struct iovec *iov, int n)
{
	if (__builtin_expect(qp->tx_test_cap != 0, 0))
		return test_capped(qp, iov, n);
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
	/* A small batch (a request, a reply, a credit) goes copied into one buffer by send: the
	 * kernel importing and walking an iovec of header, payload and trailer costs more than
	 * the copy (as qp.c's FLAT_MAX for datagrams). */
	uint8_t flat[RC_FLAT_SEND];
	size_t flen = 0;
	for (int i = 0; i < n && flen <= sizeof flat; i++)
		flen += iov[i].iov_len;
	bool use_flat = n > 1 && flen <= sizeof flat;
	const void *one = n == 1 ? iov[0].iov_base : flat;
	if (n == 1)
		use_flat = true, flen = iov[0].iov_len;
	for (size_t i = 0, o = 0; use_flat && n > 1 && i < (size_t)n; o += iov[i].iov_len, i++)
		if (iov[i].iov_len)
			memcpy(flat + o, iov[i].iov_base, iov[i].iov_len);
	for (;;) {
		ssize_t r = use_flat ? dg_sys_sendto(qp->fd, one, flen, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0)
				     : dg_sys_sendmsg(qp->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r >= 0)
			return r;
		if (r == -EINTR)
			continue;
		if (r == -EAGAIN || r == -EWOULDBLOCK)
			return tcp_full(qp);
		return r;
	}
}

/* Sends the batch. Returns 1 when it is all handed to TCP, 0 when TCP is full (POLLOUT),
 * -errno on a connection error. */
static int batch_send(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	while (rc->b_sent < rc->b_bytes) {
		ssize_t n = rc_send_some(qp, rc->bt->iov + rc->iov_idx, rc->niov - rc->iov_idx);
		if (n <= 0)
			return (int)n;
		rc->b_sent += (uint64_t)n;
		size_t left = (size_t)n;
		while (left) {
			struct iovec *v = &rc->bt->iov[rc->iov_idx];
			if (left >= v->iov_len) {
				left -= v->iov_len;
				rc->iov_idx++;
			} else {
				v->iov_base = (uint8_t *)v->iov_base + left;
				v->iov_len -= left;
				left = 0;
			}
		}
		while (rc->fp_done < rc->nfp && rc->bt->fp[rc->fp_done].end <= rc->b_sent)
			fp_complete(qp, &rc->bt->fp[rc->fp_done++]);
	}
	while (rc->fp_done < rc->nfp)
		fp_complete(qp, &rc->bt->fp[rc->fp_done++]);
	rc_batch_reset(rc);
	__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
	return 1;
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

/* Transmits what is queued. Returns >0 if something went out. */
int rc_tx_pump(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	if (rc->hold_first && !rc->term_pending && !rc->b_bytes)
		return 0; /* rx_parse (rc_rx.c) lifts the hold and its caller pumps again */
	if (rc->tx_err)
		return 0; /* soft_rc_progress fails the connection */
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
			if (r < 0 && qp->rx_app && !rc->eof) {
				/* EPIPE with our direction open: the peer's reset came after its FIN
				 * (CLOSE_WAIT), as a reset all the same */
				rc->tx_err = r == -EPIPE && !rc->wr_closed && !rc->term_sent ? -ECONNRESET : r;
				__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
				return did;
			}
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
	batch_release(rc); /* all of it is in TCP: held only while a batch waits */
	maybe_close_write(qp);
	return did;
}

/* The send queue full: the small first queue (SOFT_RC_SQ_SMALL entries) becomes
 * SOFT_RC_SQ_FIRST in the QP's own area, that one sq_max entries, each entry still at its
 * position (the positions that batches, the ORD table and completions hold stay valid). The
 * new array is zeroed (pages: dg_zalloc) and written only as far as the queue is used. Returns
 * 0, or -ENOMEM (the post fails as on a full queue). qp->lock held. */
static int sq_grow(struct soft_qp *qp)
{
	/* the small first queue grows into the QP's own area, that into pages of its own */
	uint32_t n = qp->sq_cap < SOFT_RC_SQ_FIRST && SOFT_RC_SQ_FIRST < qp->sq_max ? SOFT_RC_SQ_FIRST : qp->sq_max;
	struct soft_swqe *nq = soft_q_alloc(qp, (size_t)n * sizeof *nq, qp->x->sq_inline, sizeof qp->x->sq_inline);
	if (!nq)
		return -ENOMEM;
	for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++)
		nq[i % n] = *soft_sq_at(qp, i);
	soft_sq_free(qp);
	qp->sq = nq;
	qp->sq_cap = n;
	return 0;
}

void rc_sq_release(struct soft_qp *qp)
{
	if (qp->x_apart && qp->sq && qp->sq_cap <= SOFT_RC_SQ_SMALL) {
		soft_sq_free(qp);
		qp->sq_head = qp->sq_pump = qp->sq_tail = 0;
	}
}

/* soft_rc_post_send's common case: one Send or Write(-Record) that is one FPDU of at most
 * RC_FLAT_SEND bytes, posted while nothing else is queued, being built or on its way into TCP.
 * The FPDU is built on the stack (length, header, payload, pad, CRC) and handed to TCP during
 * the post with no send queue entry, batch or pump: a request or a reply costs the lock and
 * the system call. When TCP takes part of it, the rest becomes the batch and the message a
 * send queue entry (built, waiting for its last byte), which the pump finishes as it finishes
 * any batch. Returns true when the post is done, false when the queued way must take it
 * (nothing was sent: TCP full, an error it reports, anything out of the common case). With
 * DGV_SEND_NOW the SGEs are the caller's memory (no region looked up): read only here, since
 * what TCP did not take goes to the batch as a copy. Needs qp->lock. */
static bool rc_post_now(struct soft_qp *qp, const struct dgv_send_wr *wr)
{
	struct rc_conn *rc = qp->rc;
	enum dgv_wr_opcode op = wr->opcode;
	if (wr->next || (op != DGV_WR_SEND && op != DGV_WR_SEND_SE && op != DGV_WR_WRITE && op != DGV_WR_WRITE_RECORD) ||
	    wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list) ||
	    rc->ended || rc->phase != PH_RTS || rc->rtr_pending || rc->term_pending || rc->b_bytes || rc->cur ||
	    rc->ird_unbuilt || rc->info.markers_tx || rc->hold_first || rc->tx_err || rc->wr_closed ||
	    rc->want_close || qp->sq_head != qp->sq_tail || qp->sq_pump != qp->sq_tail ||
	    __atomic_load_n(&qp->pump_blocked, __ATOMIC_RELAXED))
		return false;
	bool tagged = op == DGV_WR_WRITE || op == DGV_WR_WRITE_RECORD;
	uint32_t hlen = tagged ? DDP_TAGGED_HLEN : DDP_UNTAGGED_HLEN;
	uint64_t total = 0;
	for (int i = 0; i < wr->num_sge; i++)
		total += wr->sg_list[i].length;
	if (total > rc->mulpdu - hlen || mpa_fpdu_len((uint32_t)(hlen + total)) > RC_FLAT_SEND)
		return false;
	bool now = (wr->send_flags & DGV_SEND_NOW) != 0; /* the caller's memory, read only here */
	for (int i = 0; i < wr->num_sge && !now; i++)
		if (soft_mr_check_local(qp->ctx, qp->pd, &wr->sg_list[i], false))
			return false; /* the queued way completes it with the error */
	uint32_t ulen = hlen + (uint32_t)total, pad = mpa_pad(ulen), flen = mpa_fpdu_len(ulen);
	uint8_t f[RC_FLAT_SEND];
	f[0] = (uint8_t)(ulen >> 8);
	f[1] = (uint8_t)ulen;
	union {
		struct ddp_tagged_hdr t;
		struct ddp_untagged_hdr u;
	} h;
	if (tagged)
		rc_put_tagged(&h.t, op == DGV_WR_WRITE ? RDMAP_WRITE : RDMAP_WRITE_RECORD, true, wr->rkey, wr->remote_addr);
	else
		rc_put_untagged(&h.u, op == DGV_WR_SEND ? RDMAP_SEND : RDMAP_SEND_SE, true, DDP_QN_SEND, rc->msn_send, 0, 0);
	memcpy(f + MPA_HDR_LEN, &h, hlen);
	uint32_t o = MPA_HDR_LEN + hlen;
	for (int i = 0; i < wr->num_sge; i++) {
		if (wr->sg_list[i].length)
			memcpy(f + o, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		o += wr->sg_list[i].length;
	}
	memset(f + o, 0, pad);
	o += pad;
	mpa_crc_put(f + o, rc->info.crc ? dg_crc32c(f, o) : 0);
	ssize_t n = rc_send_some(qp, &(struct iovec){f, flen}, 1);
	if (n <= 0)
		return false; /* TCP full (the pump waits for its room) or an error it meets again */
	uint32_t msn = tagged ? 0 : rc->msn_send++;
	rc->tx_pos += flen;
	qp->st.tx_datagrams++;
	qp->st.tx_bytes += flen;
	if ((size_t)n == flen) {
		qp->st.tx_msgs++;
		if (wr->send_flags & DGV_SEND_SIGNALED) {
			struct dgv_wc wc = {.wr_id = wr->wr_id, .status = DGV_WC_SUCCESS, .opcode = wc_of_wr[op],
					    .byte_len = (uint32_t)total, .msn = msn, .qp = &qp->base};
			if (soft_cq_push(qp->scq, &wc, NULL, NULL))
				qp->st.cq_overflows++;
		}
		return true;
	}
	/* TCP took part of the FPDU: the rest must follow before anything else */
	if (!batch_get(rc) || (!qp->sq && soft_sq_alloc(qp))) {
		rc_fail(qp, -ENOMEM, NULL, false, NULL, 0, 0);
		return true; /* the connection failed: its queue flushes */
	}
	qp->sq_head = qp->sq_pump = qp->sq_tail = 0;
	struct soft_swqe *w = soft_sq_at(qp, 0);
	/* built whole: its SGEs are not read again (DGV_SEND_NOW's are not even kept) */
	uint32_t nsge = now ? 0 : (uint32_t)wr->num_sge;
	*w = (struct soft_swqe){.wr_id = wr->wr_id, .opcode = op, .flags = wr->send_flags, .num_sge = nsge,
				.len = (uint32_t)total, .remote_addr = wr->remote_addr, .rkey = wr->rkey,
				.msn = msn, .sent = total ? (uint32_t)total : 1, .gen = w->gen + 1};
	if (nsge)
		memcpy(w->sge, wr->sg_list, (size_t)nsge * sizeof *w->sge);
	qp->sq_tail = qp->sq_pump = 1;
	uint32_t rest = flen - (uint32_t)n;
	memcpy(rc->bt->hbuf, f + n, rest);
	rc->hused = rest;
	rc->bt->iov[0] = (struct iovec){rc->bt->hbuf, rest};
	rc->niov = 1;
	rc->b_bytes = rest;
	rc->bt->fp[0] = (struct rc_fp){.end = rest, .kind = FP_SQ_DONE, .idx = 0};
	rc->nfp = 1;
	rc_tx_pump(qp);
	/* DGV_SEND_SIGNAL_HELD: not wholly in TCP when the post returns, so it completes */
	if (qp->sq_head != qp->sq_tail && !w->done && (w->flags & DGV_SEND_SIGNAL_HELD))
		w->flags |= DGV_SEND_SIGNALED;
	return true;
}

int soft_rc_post_send(struct soft_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	struct rc_conn *rc = qp->rc;
	int ret = 0;
	pthread_mutex_lock(&qp->lock);
	if (wr && rc_post_now(qp, wr)) {
		*bad = NULL;
		soft_qp_unlock(qp);
		return 0;
	}
	if (wr && (wr->send_flags & DGV_SEND_NOW)) {
		/* not now: nothing posted, the caller copies and posts the queued way */
		soft_qp_unlock(qp);
		return -EAGAIN;
	}
	/* an empty send queue with no batch in flight (whose FPDUs name entries) starts again at
	 * its first entry: a connection that has a message or two out at a time writes one page of
	 * the queue, not each of its pages in turn (qp.c soft_post_send does the same) */
	if (qp->sq_head == qp->sq_tail && qp->sq_pump == qp->sq_tail && !rc->b_bytes && rc->cur != 1)
		qp->sq_head = qp->sq_pump = qp->sq_tail = 0;
	uint32_t first = qp->sq_tail;
	bool held_asked = false;
	for (; wr; wr = wr->next) {
		if ((unsigned)wr->opcode > DGV_WR_SEND_SE_INV || wr->opcode == DGV_WR_SEND_PLAIN || wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list) ||
		    (wr->opcode == DGV_WR_READ && wr->num_sge != 1)) {
			ret = -EINVAL;
			break;
		}
		if (qp->sq_tail - qp->sq_head >= qp->sq_cap) {
			ret = qp->sq_cap < qp->sq_max ? sq_grow(qp) : -ENOMEM;
			if (ret)
				break;
		}
		if (!qp->sq && (ret = soft_sq_alloc(qp)))
			break; /* given back while idle (rc_sq_release): made again */
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
		uint32_t pos = qp->sq_tail;
		struct soft_swqe *w = soft_sq_at(qp, pos);
		held_asked |= (wr->send_flags & DGV_SEND_SIGNAL_HELD) != 0;
		*w = (struct soft_swqe){.wr_id = wr->wr_id, .opcode = wr->opcode, .flags = wr->send_flags,
					.num_sge = (uint32_t)wr->num_sge, .len = (uint32_t)total,
					.remote_addr = wr->remote_addr, .rkey = wr->rkey,
					.inv_stag = wr->invalidate_rkey, .gen = w->gen + 1};
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
		qp->sq_tail++;
		if (bad_sge)
			rc_sq_done(qp, pos, DGV_WC_LOC_PROT_ERR, 0);
		else if (rc->ended || rc->wr_closed || rc->want_close)
			rc_sq_done(qp, pos, DGV_WC_WR_FLUSH_ERR, 0);
	}
	*bad = wr;
	if (!rc->ended && rc->phase == PH_RTS && !rc->b_bytes)
		rc_tx_pump(qp);
	/* DGV_SEND_SIGNAL_HELD: what TCP did not take whole during the post completes with a
	 * completion (the ones it took were retired as unsignaled, or wait done behind a Read) */
	for (uint32_t i = first; held_asked && i != qp->sq_tail; i++) {
		struct soft_swqe *w = soft_sq_at(qp, i);
		if ((int32_t)(i - qp->sq_head) >= 0 && !w->done && (w->flags & DGV_SEND_SIGNAL_HELD))
			w->flags |= DGV_SEND_SIGNALED;
	}
	soft_qp_unlock(qp);
	return ret;
}

int soft_qp_tx_held(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (!qp->rc)
		return -EOPNOTSUPP;
	int held = 0;
	pthread_mutex_lock(&qp->lock);
	/* in order: only a Read waits for its response after it went (not held) */
	for (uint32_t i = qp->sq_head; i != qp->sq_tail && !held; i++) {
		const struct soft_swqe *w = soft_sq_at(qp, i);
		held = !w->done && w->opcode != DGV_WR_READ;
	}
	soft_qp_unlock(qp);
	return held;
}

/* ------------------------------------------------------------------ Terminate */

/* Keeps of the batch only the rest of the FPDU half on the wire, copied (the program's buffers
 * are given back when the connection fails), so the peer's framing stays whole. Returns the
 * bytes kept (0 when no FPDU was cut, or no memory for the copy). */
static uint64_t keep_cut_fpdu(struct rc_conn *rc)
{
	uint64_t cut = rc->b_sent;
	for (uint32_t i = rc->fp_done; i < rc->nfp; i++)
		if (rc->bt->fp[i].end > rc->b_sent) {
			cut = rc->bt->fp[i].end;
			break;
		}
	if (rc->b_sent == 0 || rc->b_sent == rc->b_bytes)
		cut = rc->b_sent;
	uint64_t rest = cut - rc->b_sent;
	if (rest && (rc->spill || (rc->spill = malloc(RC_FLAT)))) {
		uint64_t o = 0;
		for (int i = rc->iov_idx; i < rc->niov && o < rest; i++) {
			size_t take = rc->bt->iov[i].iov_len < rest - o ? rc->bt->iov[i].iov_len : (size_t)(rest - o);
			memcpy(rc->spill + o, rc->bt->iov[i].iov_base, take);
			o += take;
		}
	} else {
		rest = 0;
	}
	rc_batch_reset(rc);
	if (rest && !batch_get(rc))
		rest = 0;
	if (rest) {
		rc->bt->iov[rc->niov++] = (struct iovec){rc->spill, rest};
		rc->b_bytes = rest;
		rc->bt->fp[rc->nfp++] = (struct rc_fp){.end = rest, .kind = FP_NONE};
	}
	return rest;
}

/* rc_int.h. Called by rc_fail with the QP already ended; rc_tx_pump sends it. */
void rc_tx_terminate(struct soft_qp *qp, const struct dg_reject *why, const uint8_t *off_hdr,
		     uint32_t off_hlen, uint32_t seg_len)
{
	struct rc_conn *rc = qp->rc;
	uint64_t rest = keep_cut_fpdu(rc);
	if (!rc->term_fpdu && !(rc->term_fpdu = dg_small_alloc(RC_TERM_FPDU))) {
		/* no memory for it: the peer gets the end of TCP without the reason */
		DG_WARN("RC: no memory for a Terminate: the connection ends without one");
		if (rest) {
			rc->tx_pos += rest;
			rc->term_sent = rc->shut_after_term = true; /* shut once the cut FPDU is out */
		} else {
			shutdown(qp->fd, SHUT_WR);
		}
		return;
	}
	/* Terminate: untagged QN 2, RFC 5040 4.8 */
	struct rc_terminate_msg m;
	rc_put_untagged(&m.ddp, RDMAP_TERMINATE, true, DDP_QN_TERMINATE, rc->msn_term++, 0, 0);
	unsigned hdrct = 0;
	uint32_t copy = 0;
	if (off_hdr && off_hlen) {
		hdrct = TERM_HDRCT_M | TERM_HDRCT_D;
		copy = off_hlen > sizeof m.hdrs ? (uint32_t)sizeof m.hdrs : off_hlen;
		if (copy > DDP_UNTAGGED_HLEN)
			hdrct |= TERM_HDRCT_R;
	}
	m.term.term_ctrl = htobe32(term_ctrl_make(why->layer, why->etype, why->ecode, hdrct));
	m.term.ddp_seg_len = htobe16((uint16_t)seg_len);
	if (copy)
		memcpy(m.hdrs, off_hdr, copy);
	uint32_t ulen = DDP_UNTAGGED_HLEN + RC_TERM_LEN + copy;
	rc->term_len = (uint32_t)mpa_fpdu_build(rc->term_fpdu, &m, (uint16_t)ulen, rc->info.crc,
						rc->info.markers_tx ? (int64_t)(rc->tx_pos + rest) : -1);
	if (rest)
		rc->tx_pos += rest;
	rc->term_pending = true;
	rc->shut_after_term = true;
}
