/*
 * rc_rx.c - RC queue pairs of the soft RNIC, reception: the TCP stream is read in large chunks
 * into a per-QP buffer, FPDUs are taken from it (RFC 5044 length, markers, CRC32c), their DDP
 * (RFC 5041) and RDMAP (RFC 5040) headers checked, then each segment goes to the handler of its
 * RDMAP opcode (rx_op[]), as Linux siw's receive path does. Every rejection sends a Terminate
 * with the RFC layer, type and code.
 *
 * rc_int.h describes the split and the locks: everything here runs under qp->lock.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "crc.h"
#include "log.h"
#include "mpa.h"
#include "rc_int.h"
#include "sys.h"

/* ------------------------------------------------------------------ completions */

/* rc_int.h. */
void rc_recv_done(struct soft_qp *qp, const struct soft_rwqe *w, enum dgv_wc_status st, uint32_t len,
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

/* ------------------------------------------------------------------ reception */

/* A violation found on an incoming segment: log, Terminate, end. qp->lock held. */
static void rx_violation(struct soft_qp *qp, uint8_t l, uint8_t t, uint8_t c, const char *reason,
			 const uint8_t *seg, uint32_t hlen, uint32_t seglen)
{
	struct dg_reject why = {l, t, c, reason};
	qp->st.malformed_drops++;
	DG_WARN("RC QP fd %d: %s (%u/%u/0x%02x): sending Terminate", qp->fd, reason, l, t, c);
	rc_fail(qp, -EPROTO, &why, true, seg, hlen, seglen);
}

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

/* The region under stag for a remote access to [to, to+len), held; NULL (why filled) when the
 * access is not allowed or, for a remote access, the STag was invalidated by a Send with
 * Invalidate. */
static struct soft_mr *remote_mr(struct soft_qp *qp, uint32_t stag, uint64_t to, uint32_t len, unsigned access,
				 struct dg_reject *why)
{
	struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, stag, to, len, access, why);
	if (mr && access != DGV_ACCESS_LOCAL_WRITE &&
	    atomic_load_explicit(&mr->invalid_stag, memory_order_relaxed) == stag) {
		soft_mr_put(mr);
		mr = NULL;
		*why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG,
					  "invalidated STag"};
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
	struct soft_mr *mr = remote_mr(qp, stag, to, plen, access, &why);
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
 * True if this segment is one of the RTR forms (a zero-length Write, Read or Send). */
static bool is_rtr(uint8_t op, bool tagged, uint32_t plen, uint32_t read_size)
{
	if (tagged)
		return op == RDMAP_WRITE && plen == 0;
	if (op == RDMAP_READ_REQ)
		return read_size == 0;
	return op == RDMAP_SEND && plen == 0;
}

/* One DDP segment as rx_segment found it: the header fields in host order. */
struct rx_seg {
	const uint8_t *buf; /* the ULPDU: DDP/RDMAP header, then payload */
	uint32_t len;       /* ULPDU bytes */
	uint32_t hlen;      /* DDP header bytes (14 tagged, 18 untagged) */
	const uint8_t *pl;  /* payload */
	uint32_t plen;
	uint8_t op;         /* RDMAP opcode */
	bool tagged;        /* DDP T bit */
	bool last;          /* DDP L bit */
	uint32_t stag;      /* tagged: RFC 5041 4.2 */
	uint64_t to;
	uint32_t qn, msn, mo, inv; /* untagged: RFC 5041 4.3, RFC 5040 4.2 */
};

/* A violation naming the segment's DDP header; returns -EPROTO. */
static int seg_violation(struct soft_qp *qp, const struct rx_seg *s, uint8_t l, uint8_t t, uint8_t c,
			 const char *reason)
{
	rx_violation(qp, l, t, c, reason, s->buf, s->hlen, s->len);
	return -EPROTO;
}

/* Checks the DDP and RDMAP control bits of buf[0..len) and fills s. Returns 0 or -EPROTO. */
static int rx_header(struct soft_qp *qp, const uint8_t *buf, uint32_t len, struct rx_seg *s)
{
	uint16_t ctrl = (uint16_t)(buf[0] << 8 | buf[1]);
	bool tagged = ctrl & DDP_CTRL_TAGGED;
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
	*s = (struct rx_seg){.buf = buf, .len = len, .hlen = hlen, .pl = buf + hlen, .plen = len - hlen,
			     .op = op, .tagged = tagged, .last = ctrl & DDP_CTRL_LAST};
	if (tagged) {
		struct ddp_tagged_hdr h;
		memcpy(&h, buf, sizeof h);
		s->stag = be32toh(h.stag);
		s->to = be64toh(h.to);
	} else {
		struct ddp_untagged_hdr h;
		memcpy(&h, buf, sizeof h);
		s->qn = be32toh(h.qn);
		s->msn = be32toh(h.msn);
		s->mo = be32toh(h.mo);
		s->inv = be32toh(h.inv_stag);
	}
	return 0;
}

/* What every tagged segment passes before its handler: the RTR in peer-to-peer mode (consumed
 * here), a tagged offset that does not wrap. Returns 1 (go on), 0 (consumed) or -EPROTO. */
static int rx_tagged_common(struct soft_qp *qp, const struct rx_seg *s)
{
	if (qp->rc->phase == PH_WAIT_RTR) {
		if (!is_rtr(s->op, true, s->plen, 0) || !s->last)
			return seg_violation(qp, s, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
					     "first FPDU is not the RTR message");
		rc_become_rts(qp, NULL, 0);
		return 0;
	}
	if (s->plen && s->to + s->plen < s->to)
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_TO_WRAP,
				     "tagged offset wraps");
	return 1;
}

/* What every untagged segment passes before its handler: the queue number its opcode goes on
 * (RFC 5040 5.1). Returns 1 (go on) or -EPROTO. */
static int rx_untagged_common(struct soft_qp *qp, const struct rx_seg *s)
{
	uint32_t want_qn = s->op == RDMAP_READ_REQ ? DDP_QN_READ_REQ
			   : s->op == RDMAP_TERMINATE ? DDP_QN_TERMINATE : DDP_QN_SEND;
	if (s->qn != want_qn)
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_QN,
				     "invalid queue number");
	return 1;
}

/* MSN and message offset of an untagged segment (RFC 5041 5.3): mid says whether it continues
 * the Send being received. Returns 0 or -EPROTO. */
static int rx_msn_check(struct soft_qp *qp, const struct rx_seg *s, bool mid)
{
	struct rc_conn *rc = qp->rc;
	if (mid ? s->msn != rc->rcv_msn : s->msn != rc->exp_msn[s->qn])
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MSN_RANGE,
				     "unexpected MSN");
	if (mid ? s->mo != rc->rcv_off : s->mo != 0)
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_INVALID_MO,
				     "unexpected message offset");
	return 0;
}

/* RDMA Read Response (RFC 5040 4.5): placed into the oldest outstanding Read, which completes
 * with its last segment. Returns 0, -EAGAIN (send CQ full) or -EPROTO. */
static int rx_read_resp(struct soft_qp *qp, const struct rx_seg *s)
{
	struct rc_conn *rc = qp->rc;
	if (rc->rtr_read_wait && s->plen == 0 && s->last) {
		rc->rtr_read_wait = false;
		return 0;
	}
	struct soft_ord *o = &qp->x->ord[rc->ord_head];
	if (!qp->ord_count || !o->used || s->stag != o->stag || s->to != o->to + o->got || s->plen > o->len - o->got)
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
				     "Read Response outside the outstanding Read");
	if (s->last && soft_cq_full(qp->scq))
		return -EAGAIN;
	if (place_tagged(qp, s->stag, s->to, s->pl, s->plen, DGV_ACCESS_LOCAL_WRITE, s->buf, s->hlen, s->len))
		return -EPROTO;
	o->got += s->plen;
	qp->st.rx_bytes += s->plen;
	if (!s->last)
		return 0;
	if (o->got != o->len)
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
				     "Read Response shorter than the Read");
	o->used = false;
	rc->ord_head = (rc->ord_head + 1) % SOFT_MAX_ORD;
	qp->ord_count--;
	soft_sq_at(qp, o->sq_idx)->read_ord = false;
	rc_sq_done(qp, o->sq_idx, DGV_WC_SUCCESS, o->len);
	return 0;
}

/* The last segment of a Write or Write-Record has been placed: the message is counted, and a
 * Write-Record completes on the receive CQ with the range it covers (paper 000 IV.B.3). */
static void rx_write_done(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	rc->t_active = false;
	qp->st.rx_msgs++;
	if (rc->t_op != RDMAP_WRITE_RECORD)
		return;
	struct dgv_range r = {0, rc->t_len};
	struct dgv_wc wc = {.opcode = DGV_WC_RECV_WRITE_RECORD, .byte_len = rc->t_len, .qp = &qp->base,
			    .src = rc->info.peer, .src_len = rc->info.peer_len};
	wc.record = (struct dgv_record){.stag = rc->t_stag, .base = rc->t_base, .length = rc->t_len,
					.valid_bytes = rc->t_len, .nranges = 1};
	if (soft_cq_push(qp->rcq, &wc, NULL, &r))
		qp->st.cq_overflows++;
}

/* RDMA Write (RFC 5040 4.3) and Write-Record (paper 000 IV.B.3). Messages are never interleaved
 * on the stream, so the segments of one message follow each other with contiguous tagged
 * offsets. Returns 0, -EAGAIN (receive CQ full for a record) or -EPROTO. */
static int rx_write(struct soft_qp *qp, const struct rx_seg *s)
{
	struct rc_conn *rc = qp->rc;
	if (rc->t_active && (s->op != rc->t_op || s->stag != rc->t_stag || s->to != rc->t_next))
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
				     "tagged segment does not continue its message");
	if (s->op == RDMAP_WRITE_RECORD && s->last && soft_cq_full(qp->rcq))
		return -EAGAIN;
	if (place_tagged(qp, s->stag, s->to, s->pl, s->plen, DGV_ACCESS_REMOTE_WRITE, s->buf, s->hlen, s->len))
		return -EPROTO;
	qp->st.rx_bytes += s->plen;
	if (!rc->t_active) {
		rc->t_active = true;
		rc->t_op = s->op;
		rc->t_stag = s->stag;
		rc->t_base = s->to;
		rc->t_len = 0;
	}
	rc->t_len += s->plen;
	rc->t_next = s->to + s->plen;
	if (s->last)
		rx_write_done(qp);
	return 0;
}

/* The peer's Terminate (RFC 5040 4.8, 6.x): its triple is reported and the connection ends.
 * Returns -EPROTO. */
static int rx_terminate(struct soft_qp *qp, const struct rx_seg *s)
{
	if (s->plen < 4 || !s->last || s->mo) {
		struct dg_reject why = {TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
					"truncated Terminate"};
		rc_fail(qp, -ECONNRESET, &why, false, NULL, 0, 0);
		return -EPROTO;
	}
	const uint8_t *pl = s->pl;
	uint32_t tc = (uint32_t)pl[0] << 24 | (uint32_t)pl[1] << 16 | (uint32_t)pl[2] << 8 | pl[3];
	struct dg_reject why = {(uint8_t)(tc >> 28), (uint8_t)((tc >> 24) & 0xf), (uint8_t)((tc >> 16) & 0xff),
				"Terminate received"};
	qp->st.terminates_rcvd++;
	rc_errq_put(qp, why.layer, why.etype, why.ecode, true, 0, s->msn, 0, 0, 0);
	DG_WARN("RC QP fd %d: peer sent Terminate %u/%u/0x%02x (%s)", qp->fd, why.layer, why.etype, why.ecode,
		dgv_err_str(why.layer, why.etype, why.ecode));
	rc_fail(qp, -ECONNRESET, &why, false, NULL, 0, 0);
	return -EPROTO;
}

/* RDMA Read Request (RFC 5040 4.4): checked against IRD, max_msg_size and the source region,
 * then queued for rc_tx.c to answer. In peer-to-peer mode a zero-size one may be the RTR.
 * Returns 0 or -EPROTO. */
static int rx_read_req(struct soft_qp *qp, const struct rx_seg *s)
{
	struct rc_conn *rc = qp->rc;
	if (rx_msn_check(qp, s, false))
		return -EPROTO;
	uint32_t whole = s->hlen + s->plen; /* the Terminate quotes the Read Request too */
	if (s->plen != DG_READ_REQ_LEN || !s->last)
		return seg_violation(qp, s, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP, RDMAP_ECODE_INVALID_VERSION,
				     "Read Request not exactly 28 bytes");
	struct rdmap_read_req r;
	memcpy(&r, s->pl, sizeof r);
	uint32_t size = be32toh(r.read_size);
	struct dg_reject why = {0};
	if (rc->phase == PH_WAIT_RTR && !is_rtr(s->op, false, s->plen, size))
		why = (struct dg_reject){TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
					 "first FPDU is not the RTR message"};
	else if (qp->ird_count >= rc->info.ird && !(rc->phase == PH_WAIT_RTR && qp->ird_count < SOFT_MAX_IRD))
		why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_NO_BUFFER,
					 "Read Request beyond the negotiated IRD"};
	else if (size > qp->max_msg)
		why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
					 "Read larger than max_msg_size"};
	if (why.reason) {
		rx_violation(qp, why.layer, why.etype, why.ecode, why.reason, s->buf, whole, s->len);
		return -EPROTO;
	}
	uint32_t src_stag = be32toh(r.src_stag);
	uint64_t src_to = be64toh(r.src_to);
	if (size) {
		struct soft_mr *mr = remote_mr(qp, src_stag, src_to, size, DGV_ACCESS_REMOTE_READ, &why);
		if (!mr) {
			qp->st.placement_rejects++;
			rx_violation(qp, why.layer, why.etype, why.ecode, why.reason, s->buf, whole, s->len);
			return -EPROTO;
		}
		soft_mr_put(mr);
	}
	rc->exp_msn[DDP_QN_READ_REQ]++;
	uint32_t slot = (rc->ird_head + rc->ird_unbuilt) % SOFT_MAX_IRD;
	qp->x->ird[slot] = (struct soft_ird){.used = true, .msn = s->msn, .src_stag = src_stag,
					  .sink_stag = be32toh(r.sink_stag), .src_to = src_to,
					  .sink_to = be64toh(r.sink_to), .len = size};
	qp->ird_count++;
	rc->ird_unbuilt++;
	if (rc->phase == PH_WAIT_RTR)
		rc_become_rts(qp, NULL, 0);
	return 0;
}

/* The last segment of a Send has been placed: Send with Invalidate invalidates its STag
 * (RFC 5040 6.4.2), then the receive completes. Returns 0 or -EPROTO. */
static int rx_send_done(struct soft_qp *qp, const struct rx_seg *s)
{
	struct rc_conn *rc = qp->rc;
	rc->rcv_active = false;
	rc->exp_msn[DDP_QN_SEND]++;
	unsigned flags = (rc->rcv_op == RDMAP_SEND_SE || rc->rcv_op == RDMAP_SEND_SE_INV) ? DGV_WC_SOLICITED : 0;
	uint32_t invd = 0;
	if (rc->rcv_op == RDMAP_SEND_INV || rc->rcv_op == RDMAP_SEND_SE_INV) {
		struct soft_mr *mr = mr_by_stag(qp, rc->rcv_inv);
		if (!mr) {
			rc_recv_done(qp, rc->rcv, DGV_WC_REM_OP_ERR, rc->rcv_off, rc->rcv_msn, flags, 0);
			return seg_violation(qp, s, TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OP,
					     RDMAP_ECODE_CANNOT_INVALIDATE,
					     "Send with Invalidate names an unknown STag");
		}
		atomic_store(&mr->invalid_stag, rc->rcv_inv);
		soft_mr_put(mr);
		flags |= DGV_WC_WITH_INV;
		invd = rc->rcv_inv;
	}
	rc_recv_done(qp, rc->rcv, DGV_WC_SUCCESS, rc->rcv_off, rc->rcv_msn, flags, invd);
	return 0;
}

/* Send, Send with Solicited Event, with Invalidate, both (RFC 5040 4.6, 4.7): copied into the
 * oldest posted receive. Returns 0, -EAGAIN (no receive posted or receive CQ full: the segment
 * waits and TCP holds the peer back) or -EPROTO. */
static int rx_send(struct soft_qp *qp, const struct rx_seg *s)
{
	struct rc_conn *rc = qp->rc;
	bool mid = rc->rcv_active;
	if (rx_msn_check(qp, s, mid))
		return -EPROTO;
	if (rc->phase == PH_WAIT_RTR) {
		if (!is_rtr(s->op, false, s->plen, 0) || !s->last)
			return seg_violation(qp, s, TERM_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_NO_MATCHING_RTR,
					     "first FPDU is not the RTR message");
		rc->exp_msn[DDP_QN_SEND]++;
		rc_become_rts(qp, NULL, 0);
		return 0;
	}
	if (!mid) {
		if (!qp->rq_count || soft_cq_full(qp->rcq))
			return -EAGAIN; /* receiver not ready: TCP flow control holds the peer */
		if (!rc->rcv && !(rc->rcv = dg_small_alloc(sizeof *rc->rcv))) {
			struct dg_reject why = {TERM_LAYER_RDMAP, RDMAP_ETYPE_CATASTROPHIC, 0, "no memory to receive a Send"};
			rc_fail(qp, -ENOMEM, &why, true, s->buf, s->hlen, s->len);
			return -EPROTO;
		}
		soft_rq_pop(qp, rc->rcv);
		rc->rcv_active = true;
		rc->rcv_off = 0;
		rc->rcv_msn = s->msn;
		rc->rcv_op = s->op;
		rc->rcv_inv = s->inv;
	}
	if (s->plen > rc->rcv->len - rc->rcv_off || (uint64_t)rc->rcv_off + s->plen > qp->max_msg) {
		rc_recv_done(qp, rc->rcv, DGV_WC_LOC_LEN_ERR, rc->rcv_off, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
		return seg_violation(qp, s, TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_MSG_TOO_LONG,
				     "Send longer than the posted receive");
	}
	if (s->plen && soft_rwqe_copy(qp, rc->rcv, rc->rcv_off, s->pl, s->plen)) {
		rc_recv_done(qp, rc->rcv, DGV_WC_LOC_PROT_ERR, rc->rcv_off, rc->rcv_msn, 0, 0);
		rc->rcv_active = false;
		struct dg_reject why = {TERM_LAYER_RDMAP, RDMAP_ETYPE_CATASTROPHIC, 0, "receive buffer deregistered"};
		rc_fail(qp, -EFAULT, &why, true, s->buf, s->hlen, s->len);
		return -EPROTO;
	}
	rc->rcv_off += s->plen;
	qp->st.rx_bytes += s->plen;
	if (!s->last)
		return 0;
	return rx_send_done(qp, s);
}

/* One handler per RDMAP opcode (RFC 5040 4.3; 0x8 Write-Record, paper 000 IV.B.3). rx_header
 * has checked that the opcode is in the table and matches the T bit. */
typedef int (*rx_handler)(struct soft_qp *qp, const struct rx_seg *s);
static const rx_handler rx_op[RDMAP_OPCODE_MAX + 1] = {
	[RDMAP_WRITE] = rx_write,         [RDMAP_READ_REQ] = rx_read_req, [RDMAP_READ_RESP] = rx_read_resp,
	[RDMAP_SEND] = rx_send,           [RDMAP_SEND_INV] = rx_send,     [RDMAP_SEND_SE] = rx_send,
	[RDMAP_SEND_SE_INV] = rx_send,    [RDMAP_TERMINATE] = rx_terminate,
	[RDMAP_WRITE_RECORD] = rx_write,
};

/*
 * Handles one DDP segment (ULPDU of len bytes). Returns 0 (consumed), -EAGAIN (receiver not
 * ready: no receive posted or a CQ full; the segment stays in the stream buffer and TCP holds
 * the peer back) or -EPROTO (connection ended with a Terminate).
 */
static int rx_segment(struct soft_qp *qp, const uint8_t *buf, uint32_t len)
{
	struct rx_seg s;
	if (rx_header(qp, buf, len, &s))
		return -EPROTO;
	qp->st.rx_datagrams++;
	int r = s.tagged ? rx_tagged_common(qp, &s) : rx_untagged_common(qp, &s);
	if (r <= 0)
		return r;
	return rx_op[s.op](qp, &s);
}

/* Parses the FPDUs in the stream buffer. Returns >0 if it consumed any, 0 if it needs more
 * bytes or is paused, -EPROTO when the connection ended. */
static int rx_parse(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	int did = 0;
	while (!rc->ended && (rc->phase == PH_RTS || rc->phase == PH_WAIT_RTR)) {
		uint32_t avail = rc->rx_end - rc->rx_start;
		uint32_t lo = 0; /* offset of the length field */
		if (rc->info.markers_rx && rc->rx_pos % MPA_MARKER_SPACING == 0)
			lo = MPA_MARKER_LEN;
		if (avail < lo + 2)
			break; /* (an empty connection may hold no buffer: rxb NULL) */
		uint8_t *p = rc->rxb + rc->rx_start;
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

/* A read of the connection's TCP socket failed with err (-errno): the connection ends. */
static void rx_tcp_error(struct soft_qp *qp, int err)
{
	DG_WARN("RC QP fd %d: TCP error: %s", qp->fd, strerror(-err));
	rc_fail(qp, err, NULL, false, NULL, 0, 0);
}

/* Gives the connection's receive buffer back once nothing waits in it and no caller's read
 * (a claim) is about to fill it. qp->lock held. */
static void rx_buf_settle(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->rxb && rc->rx_start == rc->rx_end && !__atomic_load_n(&qp->rx_claimed, __ATOMIC_RELAXED)) {
		dg_spare_put(DG_SPARE_RC_RXBUF, rc->rxb, RC_RXBUF);
		rc->rxb = NULL;
		rc->rx_start = rc->rx_end = 0;
	}
}

/* The room at the stream buffer's end, after moving what is unparsed to its start when little
 * is left. qp->lock held. */
static uint32_t rx_room(struct rc_conn *rc)
{
	if (rc->rx_start == rc->rx_end) {
		rc->rx_start = rc->rx_end = 0;
	} else if (RC_RXBUF - rc->rx_end < RC_RX_ROOM) {
		memmove(rc->rxb, rc->rxb + rc->rx_start, rc->rx_end - rc->rx_start);
		rc->rx_end -= rc->rx_start;
		rc->rx_start = 0;
	}
	return RC_RXBUF - rc->rx_end;
}

/* rc_rx_pump's reading and parsing. Returns >0 if it did something. */
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
			if (rc->tx_err) {
				/* TCP's end after the peer's reset (our send found it): the reset */
				rc_fail(qp, rc->tx_err, NULL, false, NULL, 0, 0);
				return 1;
			}
			if (!rc->peer_closed_told) {
				rc->peer_closed_told = true;
				__atomic_store_n(&qp->rx_hold, true, __ATOMIC_RELAXED);
				if (rc->wr_closed) {
					rc_closed(qp);
				} else {
					rc->state = DGV_QPS_CLOSING;
					rc_event(qp, DGV_CM_PEER_CLOSED, 0, NULL, 0);
				}
			}
			break;
		}
		if (drained)
			break;
		if (__atomic_load_n(&qp->rx_claimed, __ATOMIC_RELAXED))
			break; /* a caller's read is under way (soft_qp_rx_claim): the socket is its */
		uint32_t space = rx_room(rc);
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
		if (!rc->rxb && !(rc->rxb = dg_spare_get(DG_SPARE_RC_RXBUF, RC_RXBUF)))
			break; /* out of memory: the bytes stay in TCP, a later call reads them */
		ssize_t n = dg_sys_recvfrom(qp->fd, rc->rxb + rc->rx_end, space, MSG_DONTWAIT, NULL, NULL);
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
		if (n == -EINTR)
			continue;
		if (n == -EAGAIN || n == -EWOULDBLOCK) {
			rc->empty_probes++;
		} else {
			rx_tcp_error(qp, (int)n);
			return 1;
		}
		break;
	}
	return did;
}

/* Reads the socket into the stream buffer and parses. Returns >0 if it did something. */
int rc_rx_pump(struct soft_qp *qp)
{
	int did = rx_pump(qp);
	rx_buf_settle(qp);
	return did;
}

int soft_qp_rx_claim(struct dgv_qp *qpb, size_t *room)
{
	struct soft_qp *qp = to_sqp(qpb);
	struct rc_conn *rc = qp->rc;
	if (!rc)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&qp->lock);
	int r = -EBUSY;
	/* only while FPDUs flow and nothing holds the reading back (a paused receive path, the
	 * end seen): anything else is progress's to do, with its own reads */
	if (!qp->rx_claimed && !rc->ended && rc->phase == PH_RTS && !rc->rx_paused && !rc->eof) {
		/* the buffer the feed copies into, held until the claim ends */
		if (!rc->rxb && !(rc->rxb = dg_spare_get(DG_SPARE_RC_RXBUF, RC_RXBUF))) {
			soft_qp_unlock(qp);
			return -ENOMEM;
		}
		*room = rx_room(rc);
		__atomic_store_n(&qp->rx_claimed, true, __ATOMIC_RELAXED);
		r = 0;
	}
	soft_qp_unlock(qp);
	return r;
}

int soft_qp_rx_stream_feed(struct dgv_qp *qpb, const void *buf, ssize_t n)
{
	struct soft_qp *qp = to_sqp(qpb);
	struct rc_conn *rc = qp->rc;
	if (!rc)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&qp->lock);
	if (!qp->rx_claimed) {
		soft_qp_unlock(qp);
		return -EINVAL;
	}
	int r = 0;
	if (n > 0 && (size_t)n > RC_RXBUF - rc->rx_end) {
		r = -EINVAL; /* more than the claim's room: nothing of it is taken */
	} else if (n > 0) {
		memcpy(rc->rxb + rc->rx_end, buf, (size_t)n);
		rc->rx_end += (uint32_t)n;
		rc->empty_probes = 0;
	} else if (n == 0) {
		rc->eof = true;
	} else if (n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR && n != -ECANCELED && !rc->ended) {
		rx_tcp_error(qp, (int)n);
	}
	/* parsed while still claimed: rc_rx_pump then reads nothing more (the caller read) */
	if (!r && n >= 0 && !rc->ended)
		rc_rx_pump(qp);
	__atomic_store_n(&qp->rx_claimed, false, __ATOMIC_RELAXED);
	rx_buf_settle(qp);
	if (!r && n >= 0 && !rc->ended && rc_tx_owed(qp))
		rc_tx_pump(qp); /* what the bytes asked for (Read Responses, a Terminate) */
	soft_qp_unlock(qp);
	return r;
}

/* A receive posted after the end completes at once, flushed. qp->lock held (qp.c). */
void soft_rc_after_post_recv(struct soft_qp *qp)
{
	struct rc_conn *rc = qp->rc;
	if (rc->ended)
		rc_flush_all(qp, DGV_WC_WR_FLUSH_ERR);
}

/* dgv_qp_discard. The lock is what makes it safe: every placement into this QP's memory, and
 * every read of its send buffers, happens under qp->lock, so while it is held none runs, and
 * what the checks find idle stays idle until the pages are gone. */
int soft_qp_discard(struct dgv_qp *qpb, void *addr, size_t len)
{
	struct soft_qp *qp = to_sqp(qpb);
	struct rc_conn *rc = qp->rc;
	if (!rc)
		return -EOPNOTSUPP;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)addr + pg - 1) & ~(pg - 1), e = ((uintptr_t)addr + len) & ~(pg - 1);
	pthread_mutex_lock(&qp->lock);
	int r = -EBUSY;
	/* a queued completion may name bytes the caller has not taken; a message partly placed
	 * has bytes there that no completion names yet; a send not done is still read */
	bool cqs_empty = !__atomic_load_n(&qp->rcq->count, __ATOMIC_RELAXED) &&
			 !__atomic_load_n(&qp->scq->count, __ATOMIC_RELAXED);
	if (cqs_empty && !rc->t_active && !rc->rcv_active && qp->sq_head == qp->sq_tail && !rc_tx_owed(qp)) {
		r = 0;
		if (e > a && madvise((void *)a, e - a, MADV_DONTNEED))
			r = -errno;
		/* empty (checked above), they stay so while qp->lock is held: their rings go too */
		soft_cq_trim(qp->rcq);
		if (qp->scq != qp->rcq)
			soft_cq_trim(qp->scq);
		rc_sq_release(qp); /* nothing queued or under way: rc_tx_owed said */
	}
	soft_qp_unlock(qp);
	return r;
}
