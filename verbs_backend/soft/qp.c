/*
 * qp.c - datagram queue pairs of the soft RNIC: segmentation and transmission, the receive
 * path (CRC, RD, DDP validation, placement), reassembly with validity bitmaps, RDMA
 * Write-Record records, RDMA Read, Terminate and the error queue.
 *
 * Everything here runs under qp->lock unless a comment says otherwise. The data path does not
 * allocate: queues, reassembly slots and receive buffers are sized at creation (a slot's bitmap
 * is allocated the first time that slot holds a multi-datagram message, then kept).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include "crc.h"
#include "env.h"
#include "log.h"
#include "soft.h"
#include "sys.h"

#define DEFAULT_WR 256
#define DEFAULT_MAX_MSG (16u << 20)
#define DEFAULT_REASM_US 20000
#define TERM_PER_100MS 64

#ifndef SOL_UDP
#define SOL_UDP IPPROTO_UDP
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
/* A coalesced receive holds at most the kernel's UDP_MAX_SEGMENTS (128 since Linux 6.x; GRO
 * itself stops at 64): more is not a train the kernel made, and is dropped as malformed. */
#define GRO_MAX_SEGS 128
/* Receive control space per buffer: one UDP_GRO cmsg (an int), with room to spare. */
#define RXCTL_LEN 64

static void pump(struct soft_qp *qp);
static int rx_segment(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
		      const uint8_t *buf, size_t len);

/* ------------------------------------------------------------------ helpers */

static inline bool msn_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

/* The clock for this progress pass, read at most once per pass. */
static inline uint64_t qp_now(struct soft_qp *qp)
{
	if (!qp->now_us)
		qp->now_us = dg_now_us();
	return qp->now_us;
}

static void errq_add(struct soft_qp *qp, const struct dg_reject *why, bool remote, uint8_t opcode,
		     uint32_t msn, uint32_t stag, uint64_t to, uint32_t len, const union dgv_sockaddr *peer)
{
	if (qp->errq_count == SOFT_ERRQ) {
		qp->errq_head = (qp->errq_head + 1) % SOFT_ERRQ;
		qp->errq_count--;
		qp->st.errq_overflows++;
	}
	struct dgv_async_err *e = &qp->x->errq[(qp->errq_head + qp->errq_count) % SOFT_ERRQ];
	*e = (struct dgv_async_err){.layer = why->layer, .etype = why->etype, .ecode = why->ecode,
				    .remote = remote, .opcode = opcode, .msn = msn, .stag = stag,
				    .to = to, .length = len};
	if (peer)
		e->peer = *peer;
	qp->errq_count++;
}

/* ------------------------------------------------------------------ transmission */

struct tx_ctx {
	struct soft_qp *qp;
	int err;
};

/* Up to an Ethernet MTU's datagram, the pieces are copied into one buffer and sent with sendto:
 * a copy of 1.5 kB costs less than the kernel importing and walking an iovec (sendmsg). */
#define FLAT_MAX 1536

static void udp_emit(void *arg, const struct dg_pkt *pkt)
{
	struct tx_ctx *t = arg;
	struct msghdr mh = {.msg_name = (void *)pkt->addr, .msg_namelen = pkt->addrlen,
			    .msg_iov = (struct iovec *)pkt->iov, .msg_iovlen = (size_t)pkt->iovcnt};
	if (t->qp->has_peer && dgv_addr_eq(pkt->addr, &t->qp->peer))
		mh.msg_name = NULL, mh.msg_namelen = 0; /* connected: the kernel's cached route */
	ssize_t r;
	if (pkt->iovcnt == 1) {
		do
			r = dg_sys_sendto(t->qp->fd, pkt->iov[0].iov_base, pkt->iov[0].iov_len,
					  MSG_DONTWAIT | MSG_NOSIGNAL, mh.msg_name, mh.msg_namelen);
		while (r == -EINTR);
	} else if (pkt->len <= FLAT_MAX) {
		/* small: one copy is cheaper than the kernel importing an iovec */
		uint8_t flat[FLAT_MAX];
		size_t off = 0;
		for (int i = 0; i < pkt->iovcnt; i++) {
			memcpy(flat + off, pkt->iov[i].iov_base, pkt->iov[i].iov_len);
			off += pkt->iov[i].iov_len;
		}
		do
			r = dg_sys_sendto(t->qp->fd, flat, off, MSG_DONTWAIT | MSG_NOSIGNAL, mh.msg_name,
					  mh.msg_namelen);
		while (r == -EINTR);
	} else {
		do
			r = dg_sys_sendmsg(t->qp->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		while (r == -EINTR);
	}
	if (r < 0) {
		t->err = (int)r;
		return;
	}
	t->qp->st.tx_datagrams++;
	t->qp->st.tx_bytes += (uint64_t)r;
}

/* Hands one complete datagram (CRC included) to UDP through the send-edge faults.
 * Returns 0, -EAGAIN (socket full) or -errno. */
static int udp_xmit(struct soft_qp *qp, const struct iovec *iov, int iovcnt,
		    const union dgv_sockaddr *to, socklen_t tolen)
{
	if (__builtin_expect(qp->tx_test_cap != 0, 0))
		return -EAGAIN; /* soft_qp_test_tx_cap: the socket is "full" */
	struct tx_ctx t = {qp, 0};
	size_t len = 0;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	struct dg_pkt pkt = {iov, iovcnt, len, to, tolen};
	if (qp->ftx_on)
		dg_fault_apply(&qp->x->ftx, &pkt, udp_emit, &t);
	else
		udp_emit(&t, &pkt);
	if (t.err == -EWOULDBLOCK || t.err == -ENOBUFS)
		return -EAGAIN;
	return t.err;
}

static int rd_xmit_cb(void *arg, const struct iovec *iov, int iovcnt, const union dgv_sockaddr *to,
		      socklen_t tolen)
{
	return udp_xmit(arg, iov, iovcnt, to, tolen);
}

/*
 * Sends one DDP segment: header + payload pieces. UD: appends the CRC and sends; RD: the RD
 * layer adds its header and CRC and keeps a copy for retransmission.
 * Returns 0, -EAGAIN (try again later) or -errno.
 */
static int tx_segment(struct soft_qp *qp, const void *hdr, uint32_t hlen, const struct iovec *pl,
		      int npl, const union dgv_sockaddr *to, socklen_t tolen, uint64_t cookie)
{
	struct iovec iov[SOFT_MAX_SGE + 4];
	int n = 0;
	iov[n++] = (struct iovec){(void *)hdr, hlen};
	for (int i = 0; i < npl; i++)
		iov[n++] = pl[i];
	if (qp->base.type == DGV_QPT_RD) {
		int rc = rd_send(qp->rd, to, tolen, iov, n, cookie);
		if (rc == -EAGAIN)
			qp->st.rd_window_stalls++;
		return rc;
	}
	be32 crc = htobe32(dg_crc32c_iov(iov, n));
	iov[n++] = (struct iovec){&crc, sizeof crc};
	int rc = udp_xmit(qp, iov, n, to, tolen);
	if (rc == -EAGAIN)
		__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
	return rc;
}

/* Payload bytes per segment for a header of hlen bytes. */
static uint32_t seg_payload(const struct soft_qp *qp, uint32_t hlen)
{
	uint32_t over = hlen + DG_CRC_LEN + (qp->base.type == DGV_QPT_RD ? DG_RD_HLEN : 0);
	return qp->seg_size - over;
}

/* Payload bytes per segment to ah behind a header of hlen bytes: seg_payload, grown to the
 * route's MTU when the QP sizes segments by path (seg_path). */
static uint32_t ah_seg_payload(const struct soft_qp *qp, const struct dgv_ah *ah, uint32_t hlen)
{
	uint32_t segsz = seg_payload(qp, hlen);
	uint32_t ps = qp->seg_path ? ((const struct soft_ah *)ah)->path_seg : 0;
	return ps > qp->seg_size ? segsz + (ps - qp->seg_size) : segsz;
}

/* Payload bytes per segment of send wr (ah_seg_payload for its kind of header). */
static uint32_t wr_seg_payload(const struct soft_qp *qp, const struct dgv_send_wr *wr)
{
	bool tagged = wr->opcode == DGV_WR_WRITE || wr->opcode == DGV_WR_WRITE_RECORD;
	return ah_seg_payload(qp, wr->ah, tagged ? DG_TAGGED_HLEN : DG_UNTAGGED_HLEN);
}

static void send_terminate(struct soft_qp *qp, const union dgv_sockaddr *to, socklen_t tolen,
			   const struct dg_reject *why, const uint8_t *hdr, uint32_t hlen,
			   uint32_t seglen, const uint8_t *rdmahdr)
{
	uint64_t now = dg_now_us();
	if (now - qp->term_window_start > 100000) {
		qp->term_window_start = now;
		qp->term_in_window = 0;
	}
	if (qp->term_in_window++ >= TERM_PER_100MS)
		return; /* a flood of bad segments must not become a flood of replies */
	struct dg_terminate_msg m;
	unsigned hdrct = TERM_HDRCT_M;
	uint32_t clen = 0;
	if (hdr && hlen) {
		hdrct |= TERM_HDRCT_D;
		clen = hlen > DG_TAGGED_HLEN ? DG_TAGGED_HLEN : hlen;
		memcpy(m.copy, hdr, clen);
		if (rdmahdr) {
			hdrct |= TERM_HDRCT_R;
			memcpy(m.copy + clen, rdmahdr, DG_READ_REQ_LEN);
			clen += DG_READ_REQ_LEN;
		}
	}
	m.t.term_ctrl = htobe32(term_ctrl_make(why->layer, why->etype, why->ecode, hdrct));
	m.t.ddp_seg_len = htobe16((uint16_t)(seglen > 0xffff ? 0xffff : seglen));
	m.t.pad = 0;
	uint32_t plen = DG_TERM_LEN + clen;
	dg_put_untagged(&m.h, RDMAP_TERMINATE, true, DDP_QN_TERMINATE, qp->msn_term++, 0, plen, 0, 0);
	struct iovec pl = {&m.t, plen};
	if (tx_segment(qp, &m.h, DG_UNTAGGED_HLEN, &pl, 1, to, tolen, 0) == 0)
		qp->st.terminates_sent++;
}

/* The completion of a send (unless it is unsignaled and succeeded). Needs qp->lock. */
static void send_cqe(struct soft_qp *qp, uint64_t wr_id, enum dgv_wr_opcode op, bool signaled,
		     enum dgv_wc_status status, uint32_t bytes, uint32_t msn)
{
	static const enum dgv_wc_opcode map[] = {
		[DGV_WR_SEND] = DGV_WC_SEND, [DGV_WR_SEND_SE] = DGV_WC_SEND,
		[DGV_WR_WRITE] = DGV_WC_WRITE, [DGV_WR_WRITE_RECORD] = DGV_WC_WRITE_RECORD,
		[DGV_WR_READ] = DGV_WC_READ, [DGV_WR_SEND_PLAIN] = DGV_WC_SEND_PLAIN};
	if (status == DGV_WC_SUCCESS)
		qp->st.tx_msgs++;
	if (status == DGV_WC_SUCCESS && !signaled)
		return;
	struct dgv_wc wc = {.wr_id = wr_id, .status = status, .opcode = map[op], .byte_len = bytes,
			    .msn = msn, .qp = &qp->base};
	if (soft_cq_push(qp->scq, &wc, NULL, NULL))
		qp->st.cq_overflows++;
}

/* Makes the completion of send WQE idx (unless it is unsignaled and succeeded). */
static void sq_complete(struct soft_qp *qp, uint32_t idx, enum dgv_wc_status status, uint32_t bytes)
{
	struct soft_swqe *w = &qp->sq[idx];
	if (w->done)
		return;
	w->done = true;
	if (w->ibuf)
		free(w->ibuf), w->ibuf = NULL;
	send_cqe(qp, w->wr_id, w->opcode, w->flags & DGV_SEND_SIGNALED, status, bytes, w->msn);
	while (qp->sq_head != qp->sq_tail && qp->sq[qp->sq_head % qp->sq_cap].done)
		qp->sq_head++;
}

/* RD cookies name a ring entry (idx + 1) or, with RDPEND_BIT, a parked send (index + 1);
 * the high half is the entry's generation. */
#define RDPEND_BIT 0x80000000u

/* A parked-send entry for the last segment of WQE idx, as its cookie; 0 when none is free
 * (the send then waits in the ring as before). Needs qp->lock. */
static uint64_t park_cookie(struct soft_qp *qp, uint32_t idx)
{
	uint32_t k = qp->rdpend_free;
	if (k == UINT32_MAX)
		return 0;
	struct soft_rdpend *e = &qp->rdpend[k];
	const struct soft_swqe *w = &qp->sq[idx];
	qp->rdpend_free = e->next;
	*e = (struct soft_rdpend){.wr_id = w->wr_id, .len = w->len, .msn = w->msn, .gen = e->gen + 1,
				  .opcode = (uint8_t)w->opcode, .signaled = w->flags & DGV_SEND_SIGNALED,
				  .used = true, .next = UINT32_MAX};
	return (uint64_t)e->gen << 32 | (RDPEND_BIT | (k + 1));
}

static void park_release(struct soft_qp *qp, uint32_t k)
{
	qp->rdpend[k].used = false;
	qp->rdpend[k].next = qp->rdpend_free;
	qp->rdpend_free = k;
}

/* The parked send a cookie names, or NULL (not a parked one, or stale). */
static struct soft_rdpend *park_lookup(struct soft_qp *qp, uint64_t cookie, uint32_t *k)
{
	uint32_t lo = (uint32_t)cookie;
	if (!(lo & RDPEND_BIT))
		return NULL;
	uint32_t i = (lo & ~RDPEND_BIT) - 1;
	if (i >= qp->rdpend_cap || !qp->rdpend[i].used || qp->rdpend[i].gen != (uint32_t)(cookie >> 32))
		return NULL;
	*k = i;
	return &qp->rdpend[i];
}

/* Completes a parked send with status and frees its entry. */
static void park_complete(struct soft_qp *qp, uint32_t k, enum dgv_wc_status status)
{
	struct soft_rdpend *e = &qp->rdpend[k];
	send_cqe(qp, e->wr_id, (enum dgv_wr_opcode)e->opcode, e->signaled, status,
		 status == DGV_WC_SUCCESS ? e->len : 0, e->msn);
	park_release(qp, k);
}

/* Same, with a Write-Record-style record (UD Read). */
static void sq_complete_read_partial(struct soft_qp *qp, uint32_t idx, struct soft_slot *s,
				     const struct soft_ord *o)
{
	struct soft_swqe *w = &qp->sq[idx];
	w->done = true;
	struct dgv_wc wc = {.wr_id = w->wr_id, .status = DGV_WC_PARTIAL, .opcode = DGV_WC_READ,
			    .byte_len = s ? s->got_bytes : 0, .msn = w->msn, .qp = &qp->base};
	wc.record = (struct dgv_record){.stag = o->stag, .base = o->to, .length = o->len,
					.valid_bytes = s ? s->got_bytes : 0};
	if (soft_cq_push(qp->scq, &wc, s && s->got_segs ? s : NULL, NULL))
		qp->st.cq_overflows++;
	while (qp->sq_head != qp->sq_tail && qp->sq[qp->sq_head % qp->sq_cap].done)
		qp->sq_head++;
}

static inline uint64_t make_cookie(struct soft_qp *qp, uint32_t idx)
{
	return (uint64_t)qp->sq[idx].gen << 32 | (uint64_t)(idx + 1);
}

static struct soft_swqe *cookie_wqe(struct soft_qp *qp, uint64_t cookie, uint32_t *idx)
{
	if ((uint32_t)cookie & RDPEND_BIT)
		return NULL;
	uint32_t i = (uint32_t)cookie - 1;
	if (i >= qp->sq_cap || qp->sq[i].gen != (uint32_t)(cookie >> 32))
		return NULL;
	*idx = i;
	return &qp->sq[i];
}

static int ord_alloc(struct soft_qp *qp)
{
	for (int i = 0; i < SOFT_MAX_ORD; i++)
		if (!qp->x->ord[i].used)
			return i;
	return -1;
}

#define TX_BATCH 32

/*
 * UD bulk path: segments of one message go out TX_BATCH at a time through sendmmsg (one system
 * call instead of 32). Leaves w->sent at the first byte not handed to UDP. Returns 0 (all sent
 * or the caller finishes the tail), -EAGAIN (socket full), or -errno after completing the WQE
 * with an error.
 */
static int pump_ud_batched(struct soft_qp *qp, uint32_t idx, uint8_t op, bool tagged)
{
	struct soft_swqe *w = &qp->sq[idx];
	union {
		struct dg_tagged_hdr t;
		struct dg_untagged_hdr u;
	} h[TX_BATCH];
	be32 crc[TX_BATCH];
	struct iovec iov[TX_BATCH][SOFT_MAX_SGE + 2];
	struct mmsghdr mm[TX_BATCH];
	uint32_t off[TX_BATCH], plens[TX_BATCH];
	bool conn = qp->has_peer && dgv_addr_eq(&w->dst, &qp->peer);
	while (w->len - w->sent > w->segsz) {
		int n = 0;
		uint32_t pos = w->sent;
		/* the last segment is left to the caller, which completes the WQE */
		while (n < TX_BATCH && w->len - pos > w->segsz) {
			uint32_t plen = w->segsz;
			int k = 0;
			if (tagged) {
				dg_put_tagged(&h[n].t, op, false, w->rkey, w->remote_addr + pos, w->msn, pos,
					      w->len, (uint16_t)w->segsz);
				iov[n][k++] = (struct iovec){&h[n], DG_TAGGED_HLEN};
			} else {
				dg_put_untagged(&h[n].u, op, false, DDP_QN_SEND, w->msn, pos, w->len,
						(uint16_t)w->segsz, 0);
				iov[n][k++] = (struct iovec){&h[n], DG_UNTAGGED_HLEN};
			}
			k += soft_sge_iov(w->sge, w->num_sge, pos, plen, &iov[n][k], SOFT_MAX_SGE);
			crc[n] = htobe32(dg_crc32c_iov(iov[n], k));
			iov[n][k++] = (struct iovec){&crc[n], sizeof crc[n]};
			mm[n].msg_hdr = (struct msghdr){.msg_name = conn ? NULL : &w->dst,
							.msg_namelen = conn ? 0 : w->dstlen,
							.msg_iov = iov[n], .msg_iovlen = (size_t)k};
			off[n] = pos;
			plens[n] = plen;
			pos += plen;
			n++;
		}
		int sent = dg_sys_sendmmsg(qp->fd, mm, (unsigned)n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (sent < 0) {
			if (sent == -EAGAIN || sent == -EWOULDBLOCK || sent == -ENOBUFS || sent == -EINTR) {
				__atomic_store_n(&qp->pump_blocked, sent != -EINTR, __ATOMIC_RELAXED);
				return -EAGAIN;
			}
			int err = sent;
			DG_WARN("send to peer failed: %s", strerror(-err));
			w->all_sent = true;
			sq_complete(qp, idx, DGV_WC_GENERAL_ERR, w->sent);
			return err;
		}
		for (int i = 0; i < sent; i++) {
			qp->st.tx_datagrams++;
			qp->st.tx_bytes += mm[i].msg_len;
		}
		w->sent = sent ? off[sent - 1] + plens[sent - 1] : w->sent;
		if (sent < n) {
			__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
			return -EAGAIN;
		}
	}
	return 0;
}

/* errno values with which a UDP_SEGMENT send says "not here" (kernel without UDP GSO, a
 * device without checksum offload, a route whose MTU is below the segment size): the QP then
 * sends one datagram per system call from now on. */
static bool gso_refused(int err)
{
	return err == EINVAL || err == EIO || err == ENOPROTOOPT || err == EOPNOTSUPP ||
	       err == EMSGSIZE;
}

/* Hands k iovec entries, whole datagrams of seg bytes (the last may be shorter), to UDP as one
 * GSO train (a UDP_SEGMENT cmsg of seg). to NULL: the socket's connected peer. Returns the bytes
 * sent or -errno (EINTR retried). */
static ssize_t udp_send_train(struct soft_qp *qp, const struct iovec *iov, int k, uint16_t seg,
			      const union dgv_sockaddr *to, socklen_t tolen)
{
	union {
		char buf[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct cmsghdr *cm = &ctl.align;
	cm->cmsg_level = SOL_UDP;
	cm->cmsg_type = UDP_SEGMENT;
	cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
	memcpy(CMSG_DATA(cm), &seg, sizeof seg);
	struct msghdr mh = {.msg_name = (void *)(uintptr_t)to, .msg_namelen = to ? tolen : 0,
			    .msg_iov = (struct iovec *)(uintptr_t)iov, .msg_iovlen = (size_t)k,
			    .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
	ssize_t r;
	do
		r = dg_sys_sendmsg(qp->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (r == -EINTR);
	return r;
}

/* What a train's failed send (errno e) means: -EAGAIN when the socket is full; -EOPNOTSUPP when
 * the kernel refuses GSO (qp->gso_off is set: one datagram per send from now on, said once);
 * else -e. Needs qp->lock. */
static int train_failed(struct soft_qp *qp, int e)
{
	if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS)
		return -EAGAIN;
	if (!gso_refused(e))
		return -e;
	qp->gso_off = true;
	DG_INFO("UDP GSO refused on fd %d (%s): one datagram per send from now on", qp->fd, strerror(e));
	return -EOPNOTSUPP;
}

/*
 * UD bulk path with UDP GSO: up to dg_gso_max_segs() whole datagrams of one message (each its
 * own DDP/RDMAP header, payload and CRC, exactly what pump_ud_batched sends one by one) laid
 * back to back in one iovec and handed down by one sendmsg with a UDP_SEGMENT cmsg of the
 * datagram size; the kernel (or the device) cuts the train at those boundaries, so the wire
 * carries the same datagrams. Every datagram of a train is full-size; the message's last one
 * is left to the caller, which completes the WQE. Leaves w->sent at the first byte not handed
 * to UDP. Returns 0 (the rest goes by pump_ud_batched, also after the kernel refused GSO:
 * qp->gso_off is then set), -EAGAIN (socket full), or -errno after completing the WQE with an
 * error.
 */
static int pump_ud_gso(struct soft_qp *qp, uint32_t idx, uint8_t op, bool tagged)
{
	struct soft_swqe *w = &qp->sq[idx];
	uint32_t hlen = tagged ? DG_TAGGED_HLEN : DG_UNTAGGED_HLEN;
	uint32_t dgram = hlen + w->segsz + DG_CRC_LEN;
	uint32_t per = dg_gso_max_segs(dgram);
	if (per < 2 || dgram > UINT16_MAX)
		return 0;
	union {
		struct dg_tagged_hdr t;
		struct dg_untagged_hdr u;
	} h[DG_GSO_MAX_SEGS];
	be32 crc[DG_GSO_MAX_SEGS];
	struct iovec iov[DG_GSO_MAX_SEGS * (SOFT_MAX_SGE + 2)];
	bool conn = qp->has_peer && dgv_addr_eq(&w->dst, &qp->peer);
	while (w->len - w->sent > 2 * (uint64_t)w->segsz) {
		uint32_t pos = w->sent, n = 0;
		int k = 0;
		while (n < per && w->len - pos > w->segsz) {
			int first = k;
			if (tagged)
				dg_put_tagged(&h[n].t, op, false, w->rkey, w->remote_addr + pos, w->msn, pos,
					      w->len, (uint16_t)w->segsz);
			else
				dg_put_untagged(&h[n].u, op, false, DDP_QN_SEND, w->msn, pos, w->len,
						(uint16_t)w->segsz, 0);
			iov[k++] = (struct iovec){&h[n], hlen};
			k += soft_sge_iov(w->sge, w->num_sge, pos, w->segsz, &iov[k], SOFT_MAX_SGE);
			crc[n] = htobe32(dg_crc32c_iov(&iov[first], k - first));
			iov[k++] = (struct iovec){&crc[n], sizeof crc[n]};
			pos += w->segsz;
			n++;
		}
		if (n < 2)
			break; /* one datagram: no train to make */
		ssize_t r = udp_send_train(qp, iov, k, (uint16_t)dgram, conn ? NULL : &w->dst, w->dstlen);
		if (r < 0) {
			int e = (int)-r, rc = train_failed(qp, e);
			if (rc == -EAGAIN) {
				__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
				return -EAGAIN;
			}
			if (rc == -EOPNOTSUPP)
				return 0; /* nothing of this train left: the old path sends it datagram by datagram */
			DG_WARN("send to peer failed: %s", strerror(e));
			w->all_sent = true;
			sq_complete(qp, idx, DGV_WC_GENERAL_ERR, w->sent);
			return -e;
		}
		qp->st.tx_datagrams += n;
		qp->st.tx_bytes += (uint64_t)r;
		w->sent = pos;
	}
	return 0;
}

/* Whether send WQE w is a whole message of one datagram that pump_ud_train may carry: a
 * Send or a Write(-Record) not begun, 1..segsz bytes. */
static bool ud_train_fits(const struct soft_swqe *w)
{
	return !w->all_sent && !w->done && w->sent == 0 && w->len > 0 && w->len <= w->segsz &&
	       (w->opcode == DGV_WR_SEND || w->opcode == DGV_WR_SEND_SE || w->opcode == DGV_WR_WRITE ||
		w->opcode == DGV_WR_WRITE_RECORD);
}

/*
 * UD: consecutive one-datagram messages to one destination (a stream of small Sends or
 * Write-Records, or sends the socket had no room for) leave as one GSO train, as a long
 * message's segments do (pump_ud_gso): the datagrams are the ones pump_swqe would send, each
 * whole (header, payload pieces, CRC), of one size but the last, which may be shorter. Each
 * WQE completes once the train is handed to UDP. Returns the WQEs sent from sq index i on
 * (>= 2), 0 when no train forms or the kernel refuses it (qp->gso_off is then set; the caller
 * sends WQE i its usual way, errors included), -EAGAIN when the socket is full (nothing sent).
 * Needs qp->lock.
 */
static int pump_ud_train(struct soft_qp *qp, uint32_t i)
{
	if (qp->gso_off || qp->ftx_on || __builtin_expect(qp->tx_test_cap != 0, 0))
		return 0;
	struct soft_swqe *first = &qp->sq[i % qp->sq_cap];
	if (!ud_train_fits(first) || i + 1 == qp->sq_tail)
		return 0;
	union {
		struct dg_tagged_hdr t;
		struct dg_untagged_hdr u;
	} h[DG_GSO_MAX_SEGS];
	be32 crc[DG_GSO_MAX_SEGS];
	struct iovec iov[DG_GSO_MAX_SEGS * (SOFT_MAX_SGE + 2)];
	uint32_t seg = 0, per = 0, n = 0, bytes = 0;
	int k = 0;
	for (uint32_t j = i; j != qp->sq_tail && n < DG_GSO_MAX_SEGS; j++) {
		struct soft_swqe *w = &qp->sq[j % qp->sq_cap];
		if (!ud_train_fits(w) || !dgv_addr_eq(&w->dst, &first->dst))
			break;
		bool tagged = w->opcode == DGV_WR_WRITE || w->opcode == DGV_WR_WRITE_RECORD;
		uint32_t hlen = tagged ? DG_TAGGED_HLEN : DG_UNTAGGED_HLEN;
		uint32_t dgram = hlen + w->len + DG_CRC_LEN;
		if (n == 0) {
			seg = dgram;
			per = dg_gso_max_segs(dgram);
			if (per < 2 || dgram > UINT16_MAX)
				return 0;
		} else if (dgram > seg || n == per || bytes + dgram > 65000u) {
			break;
		}
		uint8_t op = w->opcode == DGV_WR_SEND ? RDMAP_SEND : w->opcode == DGV_WR_SEND_SE ? RDMAP_SEND_SE
			     : w->opcode == DGV_WR_WRITE ? RDMAP_WRITE : RDMAP_WRITE_RECORD;
		int head = k;
		if (tagged)
			dg_put_tagged(&h[n].t, op, true, w->rkey, w->remote_addr, w->msn, 0, w->len,
				      (uint16_t)w->segsz);
		else
			dg_put_untagged(&h[n].u, op, true, DDP_QN_SEND, w->msn, 0, w->len, (uint16_t)w->segsz, 0);
		iov[k++] = (struct iovec){&h[n], hlen};
		k += soft_sge_iov(w->sge, w->num_sge, 0, w->len, &iov[k], SOFT_MAX_SGE);
		crc[n] = htobe32(dg_crc32c_iov(&iov[head], k - head));
		iov[k++] = (struct iovec){&crc[n], sizeof crc[n]};
		bytes += dgram;
		n++;
		if (dgram < seg)
			break; /* a shorter datagram ends the train */
	}
	if (n < 2)
		return 0;
	bool conn = qp->has_peer && dgv_addr_eq(&first->dst, &qp->peer);
	ssize_t r = udp_send_train(qp, iov, k, (uint16_t)seg, conn ? NULL : &first->dst, first->dstlen);
	if (r < 0) {
		if (train_failed(qp, (int)-r) == -EAGAIN) {
			__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
			return -EAGAIN;
		}
		return 0; /* the usual way sends (or fails) WQE i by itself */
	}
	qp->st.tx_datagrams += n;
	qp->st.tx_bytes += (uint64_t)r;
	for (uint32_t j = i; j != i + n; j++) {
		uint32_t idx = j % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		w->sent = w->len;
		w->all_sent = true;
		/* UD completes on hand-off to UDP (paper 003 III.F) */
		sq_complete(qp, idx, DGV_WC_SUCCESS, w->len);
	}
	return (int)n;
}

/* Transmits what it can of send WQE idx. Returns 0 when the WQE is fully handed down,
 * -EAGAIN when the LLP is full, or another -errno after completing the WQE with an error. */
static int pump_swqe(struct soft_qp *qp, uint32_t idx)
{
	struct soft_swqe *w = &qp->sq[idx];
	if (w->opcode == DGV_WR_READ) {
		int o = ord_alloc(qp);
		if (o < 0)
			return -EAGAIN; /* ORD full: wait for an outstanding Read to finish */
		struct dg_untagged_hdr h;
		struct rdmap_read_req rr;
		dg_put_untagged(&h, RDMAP_READ_REQ, true, DDP_QN_READ_REQ, w->msn, 0, DG_READ_REQ_LEN, 0, 0);
		dg_put_read_req(&rr, w->sge[0].lkey, w->sge[0].addr, w->len, w->rkey, w->remote_addr);
		struct iovec pl = {&rr, sizeof rr};
		int rc = tx_segment(qp, &h, sizeof h, &pl, 1, &w->dst, w->dstlen,
				    qp->base.type == DGV_QPT_RD ? make_cookie(qp, idx) : 0);
		if (rc)
			return rc;
		qp->ord_count++;
		qp->x->ord[o] = (struct soft_ord){.used = true, .sq_idx = idx, .msn = w->msn,
					       .stag = w->sge[0].lkey, .to = w->sge[0].addr, .len = w->len,
					       .slot = -1, .peer = w->dst, .peerlen = w->dstlen};
		if (qp->base.type == DGV_QPT_UD)
			qp->x->ord[o].deadline_us = dg_now_us() + 4ull * qp->reasm_us;
		w->read_ord = true;
		w->all_sent = true;
		return 0;
	}
	if (w->opcode == DGV_WR_SEND_PLAIN) {
		/* bypasses DDP (and RD): the bytes go out as the program gave them */
		struct iovec pl[SOFT_MAX_SGE];
		int npl = soft_sge_iov(w->sge, w->num_sge, 0, w->len, pl, SOFT_MAX_SGE);
		int rc = udp_xmit(qp, pl, npl, &w->dst, w->dstlen);
		if (rc == -EAGAIN) {
			__atomic_store_n(&qp->pump_blocked, true, __ATOMIC_RELAXED);
			return rc;
		}
		w->all_sent = true;
		if (rc == 0)
			qp->st.tx_plain++;
		sq_complete(qp, idx, rc ? DGV_WC_GENERAL_ERR : DGV_WC_SUCCESS, rc ? 0 : w->len);
		return rc;
	}
	bool tagged = w->opcode == DGV_WR_WRITE || w->opcode == DGV_WR_WRITE_RECORD;
	uint8_t op = w->opcode == DGV_WR_SEND ? RDMAP_SEND : w->opcode == DGV_WR_SEND_SE ? RDMAP_SEND_SE
		     : w->opcode == DGV_WR_WRITE ? RDMAP_WRITE : RDMAP_WRITE_RECORD;
	if (qp->base.type == DGV_QPT_UD && !qp->ftx_on && w->len - w->sent > w->segsz) {
		int rc = qp->gso_off ? 0 : pump_ud_gso(qp, idx, op, tagged);
		if (!rc)
			rc = pump_ud_batched(qp, idx, op, tagged);
		if (rc)
			return rc;
	}
	while (w->sent < w->len || (w->len == 0 && !w->all_sent)) {
		uint32_t plen = w->len - w->sent;
		if (plen > w->segsz)
			plen = w->segsz;
		bool last = w->sent + plen == w->len;
		struct iovec pl[SOFT_MAX_SGE];
		int npl = soft_sge_iov(w->sge, w->num_sge, w->sent, plen, pl, SOFT_MAX_SGE);
		union {
			struct dg_tagged_hdr t;
			struct dg_untagged_hdr u;
		} h;
		uint32_t hlen;
		if (tagged) {
			dg_put_tagged(&h.t, op, last, w->rkey, w->remote_addr + w->sent, w->msn, w->sent,
				      w->len, (uint16_t)w->segsz);
			hlen = DG_TAGGED_HLEN;
		} else {
			dg_put_untagged(&h.u, op, last, DDP_QN_SEND, w->msn, w->sent, w->len,
					(uint16_t)w->segsz, 0);
			hlen = DG_UNTAGGED_HLEN;
		}
		uint64_t cookie = 0;
		if (last && qp->base.type == DGV_QPT_RD && !(cookie = park_cookie(qp, idx)))
			cookie = make_cookie(qp, idx);
		int rc = tx_segment(qp, &h, hlen, pl, npl, &w->dst, w->dstlen, cookie);
		if (rc && ((uint32_t)cookie & RDPEND_BIT))
			park_release(qp, ((uint32_t)cookie & ~RDPEND_BIT) - 1);
		else if (!rc && ((uint32_t)cookie & RDPEND_BIT)) {
			/* parked: the ring entry is free now, the ack completes the send */
			w->sent += plen;
			w->all_sent = true;
			w->done = true;
			while (qp->sq_head != qp->sq_tail && qp->sq[qp->sq_head % qp->sq_cap].done)
				qp->sq_head++;
			return 0;
		}
		if (rc == -EAGAIN)
			return rc;
		if (rc) {
			DG_WARN("send to peer failed: %s", strerror(-rc));
			w->all_sent = true;
			sq_complete(qp, idx, DGV_WC_GENERAL_ERR, w->sent);
			return rc;
		}
		w->sent += plen;
		if (w->len == 0)
			break;
	}
	w->all_sent = true;
	/* UD completes on hand-off to UDP (paper 003 III.F); RD when acknowledged (rd acked()). */
	if (qp->base.type == DGV_QPT_UD)
		sq_complete(qp, idx, DGV_WC_SUCCESS, w->len);
	return 0;
}

/* Sends queued Read Responses. Returns 0 when all went, -EAGAIN when the LLP is full. */
static int pump_ird(struct soft_qp *qp)
{
	while (qp->ird_count) {
		struct soft_ird *r = NULL;
		for (int i = 0; i < SOFT_MAX_IRD; i++)
			if (qp->x->ird[i].used && (!r || msn_before(qp->x->ird[i].msn, r->msn)))
				r = &qp->x->ird[i];
		if (!r)
			break;
		do {
			uint32_t plen = r->len - r->sent;
			if (plen > r->segsz)
				plen = r->segsz;
			struct dg_reject why;
			struct soft_mr *mr = plen ? soft_mr_get_remote(qp->ctx, qp->pd, r->src_stag,
							r->src_to + r->sent, plen, DGV_ACCESS_REMOTE_READ, &why) : NULL;
			if (plen && !mr) {
				/* Deregistered since the request was accepted. */
				send_terminate(qp, &r->peer, r->peerlen, &why, NULL, 0, 0, NULL);
				break;
			}
			struct dg_tagged_hdr h;
			bool last = r->sent + plen == r->len;
			dg_put_tagged(&h, RDMAP_READ_RESP, last, r->sink_stag, r->sink_to + r->sent, r->msn,
				      r->sent, r->len, (uint16_t)r->segsz);
			struct iovec pl = {(void *)(uintptr_t)(r->src_to + r->sent), plen};
			int rc = tx_segment(qp, &h, sizeof h, &pl, plen ? 1 : 0, &r->peer, r->peerlen, 0);
			if (mr)
				soft_mr_put(mr);
			if (rc == -EAGAIN)
				return rc;
			if (rc)
				break;
			r->sent += plen;
		} while (r->sent < r->len);
		r->used = false;
		qp->ird_count--;
	}
	return 0;
}

static void pump_queue(struct soft_qp *qp);

/* Hands down what the send queue and the Read Responses hold. RD: the datagrams of one peer
 * leave in GSO trains (rd_cork). Needs qp->lock. */
static void pump(struct soft_qp *qp)
{
	if (!qp->rd) {
		pump_queue(qp);
		return;
	}
	rd_cork(qp->rd);
	pump_queue(qp);
	rd_uncork(qp->rd);
}

static void pump_queue(struct soft_qp *qp)
{
	/* pump_blocked is read without the lock (soft_qp_wants_pollout, from soft_cq_wait):
	 * every store is atomic, as rc.c's are */
	__atomic_store_n(&qp->pump_blocked, false, __ATOMIC_RELAXED);
	if (pump_ird(qp) == -EAGAIN)
		return;
	/* RD: a peer whose window is full (slow, or dead until its retries run out, seconds)
	 * must not hold up what is queued for other peers behind it (one RD QP serves many
	 * peers, as one UDP socket does): its WQEs are stepped over, up to PUMP_STALLED peers
	 * and PUMP_STEP WQEs (a deep queue to one slow peer costs a bounded scan per call), and
	 * each peer's own WQEs still leave in order. sq_pump stays at the first WQE not wholly
	 * handed down. */
	enum { PUMP_STALLED = 8, PUMP_STEP = 64 };
	const union dgv_sockaddr *stalled[PUMP_STALLED];
	unsigned nstalled = 0, stepped = 0;
	bool behind = false; /* a stepped-over WQE is before i */
	for (uint32_t i = qp->sq_pump; i != qp->sq_tail; i++) {
		uint32_t idx = i % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		if (!w->all_sent && !w->done) {
			if (qp->base.type == DGV_QPT_UD) {
				int n = pump_ud_train(qp, i);
				if (n == -EAGAIN)
					return;
				if (n > 0) {
					i += (uint32_t)n - 1;
					qp->sq_pump = i + 1; /* UD steps over nothing */
					continue;
				}
			}
			bool skip = false;
			for (unsigned k = 0; k < nstalled && !skip; k++)
				skip = dgv_addr_eq(stalled[k], &w->dst);
			int rc = skip ? -EAGAIN : pump_swqe(qp, idx);
			if (rc == -EAGAIN) {
				if (qp->base.type != DGV_QPT_RD || w->opcode == DGV_WR_READ ||
				    w->opcode == DGV_WR_SEND_PLAIN || !rd_can_send_any(qp->rd))
					return; /* the LLP or the pool is full, not one peer's window */
				if (++stepped > PUMP_STEP || (!skip && nstalled == PUMP_STALLED))
					return;
				if (!skip)
					stalled[nstalled++] = &w->dst;
				behind = true;
				continue;
			}
		}
		if (!behind)
			qp->sq_pump = i + 1;
	}
}

/* ------------------------------------------------------------------ reassembly slots */

static void slot_release(struct soft_slot *s)
{
	s->kind = SLOT_FREE;
	s->done = false;
}

static bool slot_usable(struct soft_slot *s)
{
	return s->kind == SLOT_FREE && !atomic_load_explicit(&s->in_cq, memory_order_acquire);
}

static inline bool slot_is(const struct soft_slot *s, bool send_class, const union dgv_sockaddr *src,
			   uint32_t msn)
{
	if (s->kind == SLOT_FREE || s->kind == SLOT_READ || s->msn != msn)
		return false;
	bool sc = s->kind == SLOT_SEND || s->kind == SLOT_DISCARD;
	return sc == send_class && dgv_addr_eq(&s->src, src);
}

/* The slot of (class, src, msn). Segments of one message come in runs, so the last hit is
 * tried first. */
static struct soft_slot *slot_find(struct soft_qp *qp, bool send_class, const union dgv_sockaddr *src,
				   uint32_t msn)
{
	if (!qp->slots_active)
		return NULL;
	struct soft_slot *h = &qp->x->slots[qp->slot_hint];
	if (slot_is(h, send_class, src, msn))
		return h;
	for (uint32_t i = 0; i < SOFT_REASM_SLOTS; i++)
		if (slot_is(&qp->x->slots[i], send_class, src, msn)) {
			qp->slot_hint = i;
			return &qp->x->slots[i];
		}
	return NULL;
}

static void slot_expire(struct soft_qp *qp, struct soft_slot *s);

/* How long a partly received message may go without a new segment. RD delivers every segment
 * or fails the peer, so its slots only expire when a peer vanished mid-message. */
static inline uint64_t slot_idle_us(const struct soft_qp *qp)
{
	return qp->base.type == DGV_QPT_RD ? 30000000ull : qp->reasm_us;
}

/* A free slot; on UD, evicting the one closest to its deadline when all are busy. NULL when
 * none is free (RD: the segment waits, "not ready") or every slot is referenced by an
 * unpolled completion. */
static struct soft_slot *slot_alloc(struct soft_qp *qp)
{
	struct soft_slot *victim = NULL;
	for (int i = 0; i < SOFT_REASM_SLOTS; i++) {
		struct soft_slot *s = &qp->x->slots[i];
		if (slot_usable(s))
			return s;
		if (s->kind != SLOT_FREE && s->kind != SLOT_READ &&
		    (!victim || s->deadline_us < victim->deadline_us))
			victim = s;
	}
	if (!victim || qp->base.type == DGV_QPT_RD)
		return NULL;
	slot_expire(qp, victim);
	return slot_usable(victim) ? victim : NULL;
}

/* Prepares s for a message of ml bytes cut at segsz. Returns 0 or -ENOMEM. */
static int slot_init(struct soft_qp *qp, struct soft_slot *s, enum slot_kind kind,
		     const union dgv_sockaddr *src, socklen_t srclen, const struct dg_seg *g)
{
	uint32_t nsegs = g->segsz ? (g->ml + g->segsz - 1) / g->segsz : 1;
	if (nsegs == 0)
		nsegs = 1;
	uint32_t need = (nsegs + 7) / 8;
	if (need > s->bitmap_cap) {
		/* Once per slot high-water mark, not per message. */
		uint8_t *b = realloc(s->bitmap, need);
		if (!b)
			return -ENOMEM;
		s->bitmap = b;
		s->bitmap_cap = need;
	}
	memset(s->bitmap, 0, need);
	qp->slot_hint = (uint32_t)(s - qp->x->slots);
	s->kind = kind;
	s->done = false;
	s->src = *src;
	s->srclen = srclen;
	s->msn = g->msn;
	s->ml = g->ml;
	s->segsz = g->segsz ? g->segsz : g->ml;
	s->nsegs = nsegs;
	s->got_segs = 0;
	s->got_bytes = 0;
	s->stag = g->stag;
	s->base = g->to - g->mo;
	s->solicited = g->opcode == RDMAP_SEND_SE || g->opcode == RDMAP_SEND_SE_INV;
	s->deadline_us = qp_now(qp) + slot_idle_us(qp);
	qp->slots_active++;
	return 0;
}

/* Marks segment g in s and restarts its inactivity deadline. Returns 1 if new, 0 if a
 * duplicate, -1 if inconsistent with s. */
static int slot_mark(struct soft_qp *qp, struct soft_slot *s, const struct dg_seg *g)
{
	if (g->ml != s->ml || (g->segsz ? g->segsz : g->ml) != s->segsz)
		return -1;
	uint32_t i = s->segsz ? g->mo / s->segsz : 0;
	if (i >= s->nsegs)
		return -1;
	if (s->bitmap[i >> 3] & (1u << (i & 7)))
		return 0;
	s->bitmap[i >> 3] |= (uint8_t)(1u << (i & 7));
	s->got_segs++;
	s->got_bytes += g->plen;
	if (s->kind != SLOT_READ)
		s->deadline_us = qp_now(qp) + slot_idle_us(qp);
	return 1;
}

static void rq_push_front(struct soft_qp *qp, const struct soft_rwqe *w)
{
	if (qp->rq_count == qp->rq_cap)
		return;
	qp->rq_head = (qp->rq_head + qp->rq_cap - 1) % qp->rq_cap;
	soft_rwqe_put(soft_rq_at(qp, qp->rq_head), w);
	qp->rq_count++;
}

static void recv_complete(struct soft_qp *qp, const struct soft_rwqe *w, enum dgv_wc_status st,
			  uint32_t len, uint32_t msn, const union dgv_sockaddr *src, socklen_t srclen,
			  bool solicited)
{
	struct dgv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = DGV_WC_RECV, .byte_len = len,
			    .flags = solicited ? DGV_WC_SOLICITED : 0, .msn = msn, .qp = &qp->base,
			    .src = *src, .src_len = srclen};
	if (st == DGV_WC_SUCCESS)
		qp->st.rx_msgs++;
	if (soft_cq_push(qp->rcq, &wc, NULL, NULL)) {
		qp->st.cq_overflows++;
		DG_WARN("receive completion queue full: a message was lost (enlarge the CQ)");
	}
}

/* True when an older Send from src is still being reassembled: per-source completion order. */
static bool older_send_active(struct soft_qp *qp, const union dgv_sockaddr *src, uint32_t msn)
{
	if (!qp->slots_active)
		return false;
	for (int i = 0; i < SOFT_REASM_SLOTS; i++) {
		struct soft_slot *s = &qp->x->slots[i];
		if ((s->kind == SLOT_SEND || s->kind == SLOT_DISCARD) && !s->done &&
		    msn_before(s->msn, msn) && dgv_addr_eq(&s->src, src))
			return true;
	}
	return false;
}

/* Emits finished Sends of src that no longer wait for an older one, oldest first. */
static void release_done_sends(struct soft_qp *qp, const union dgv_sockaddr *src)
{
	for (;;) {
		struct soft_slot *best = NULL;
		for (int i = 0; i < SOFT_REASM_SLOTS; i++) {
			struct soft_slot *s = &qp->x->slots[i];
			if (s->kind == SLOT_SEND && s->done && dgv_addr_eq(&s->src, src) &&
			    (!best || msn_before(s->msn, best->msn)))
				best = s;
		}
		if (!best || older_send_active(qp, src, best->msn))
			return;
		recv_complete(qp, &best->wqe, DGV_WC_SUCCESS, best->ml, best->msn, &best->src,
			      best->srclen, best->solicited);
		slot_release(best);
		qp->slots_active--;
	}
}

/* A complete record carries its one range inline, so its slot is free at once; only a partial
 * record keeps the slot's bitmap until the application polls it (cq.c makes the ranges). */
static void wrec_complete(struct soft_qp *qp, struct soft_slot *s)
{
	bool whole = s->got_segs == s->nsegs;
	struct dgv_wc wc = {.status = whole ? DGV_WC_SUCCESS : DGV_WC_PARTIAL,
			    .opcode = DGV_WC_RECV_WRITE_RECORD, .byte_len = s->got_bytes, .msn = s->msn,
			    .qp = &qp->base, .src = s->src, .src_len = s->srclen};
	wc.record = (struct dgv_record){.stag = s->stag, .base = s->base, .length = s->ml,
					.valid_bytes = s->got_bytes, .nranges = whole && s->ml ? 1 : 0};
	struct dgv_range whole_range = {0, s->ml};
	qp->st.rx_msgs++;
	s->kind = SLOT_FREE;
	qp->slots_active--;
	if (soft_cq_push(qp->rcq, &wc, whole ? NULL : s, whole ? &whole_range : NULL)) {
		qp->st.cq_overflows++;
		DG_WARN("receive completion queue full: a Write-Record record was lost");
	}
}

/* Gives up on an incomplete message: Sends are dropped (their receive goes back to the
 * queue), Write-Records complete as partial, discards end. */
static void slot_expire(struct soft_qp *qp, struct soft_slot *s)
{
	union dgv_sockaddr src = s->src;
	switch (s->kind) {
	case SLOT_SEND:
		if (s->done) {
			/* finished but waiting: complete it now rather than lose it */
			recv_complete(qp, &s->wqe, DGV_WC_SUCCESS, s->ml, s->msn, &s->src, s->srclen, s->solicited);
		} else {
			qp->st.reasm_timeouts++;
			rq_push_front(qp, &s->wqe);
		}
		slot_release(s);
		qp->slots_active--;
		release_done_sends(qp, &src);
		break;
	case SLOT_DISCARD:
		slot_release(s);
		qp->slots_active--;
		release_done_sends(qp, &src);
		break;
	case SLOT_WREC:
		qp->st.reasm_timeouts++;
		wrec_complete(qp, s);
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------------------ receive handlers */

static void reject(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
		   const struct dg_seg *g, const struct dg_reject *why, const uint8_t *rdmahdr)
{
	qp->st.placement_rejects++;
	errq_add(qp, why, false, g->opcode, g->msn, g->stag, g->to, g->plen, from);
	DG_DBG("rejected %s msn %u: %s", dg_opcode_name(g->opcode), g->msn, why->reason);
	send_terminate(qp, from, fromlen, why, g->hdr, g->hlen, g->hlen + g->plen, rdmahdr);
}

/* A Send segment. Returns 0, or -EAGAIN on RD when no receive is posted for a new message
 * (the RD layer holds it and tells the sender "not ready"; UD drops it, as UDP would). */
static int rx_send(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
		   const struct dg_seg *g)
{
	bool se = g->opcode == RDMAP_SEND_SE || g->opcode == RDMAP_SEND_SE_INV;
	bool rd = qp->base.type == DGV_QPT_RD;
	if (rd && soft_cq_full(qp->rcq))
		return -EAGAIN; /* reliable: wait for the application to poll rather than lose it */
	qp->rx_single = g->mo == 0 && g->plen == g->ml;
	if (qp->rx_single) {
		struct soft_rwqe w;
		if (!soft_rq_pop(qp, &w)) {
			if (rd)
				return -EAGAIN;
			qp->st.no_wqe_drops++;
			return 0;
		}
		if (g->ml > w.len) {
			recv_complete(qp, &w, DGV_WC_LOC_LEN_ERR, g->ml, g->msn, from, fromlen, se);
			return 0;
		}
		if (soft_rwqe_copy(qp, &w, 0, g->payload, g->plen)) {
			recv_complete(qp, &w, DGV_WC_LOC_PROT_ERR, 0, g->msn, from, fromlen, se);
			return 0;
		}
		if (!rd && older_send_active(qp, from, g->msn)) {
			struct soft_slot *s = slot_alloc(qp);
			if (s && slot_init(qp, s, SLOT_SEND, from, fromlen, g) == 0) {
				s->wqe = w;
				s->got_segs = s->nsegs;
				s->got_bytes = g->ml;
				s->done = true;
				return 0;
			}
		}
		recv_complete(qp, &w, DGV_WC_SUCCESS, g->ml, g->msn, from, fromlen, se);
		return 0;
	}
	struct soft_slot *s = slot_find(qp, true, from, g->msn);
	if (!s) {
		struct soft_rwqe w;
		if (!qp->rq_count) {
			if (rd)
				return -EAGAIN;
			qp->st.no_wqe_drops++;
			return 0;
		}
		s = slot_alloc(qp);
		if (!s || !soft_rq_pop(qp, &w)) {
			if (rd)
				return -EAGAIN;
			qp->st.no_wqe_drops++;
			return 0;
		}
		if (slot_init(qp, s, SLOT_SEND, from, fromlen, g)) {
			rq_push_front(qp, &w);
			if (rd)
				return -EAGAIN;
			qp->st.no_wqe_drops++;
			return 0;
		}
		s->wqe = w;
		if (g->ml > w.len) {
			recv_complete(qp, &w, DGV_WC_LOC_LEN_ERR, g->ml, g->msn, from, fromlen, se);
			s->kind = SLOT_DISCARD;
		}
	}
	int m = slot_mark(qp, s, g);
	if (m <= 0) {
		if (m == 0)
			qp->st.dup_drops++;
		else
			qp->st.malformed_drops++;
		return 0;
	}
	if (s->kind == SLOT_SEND && soft_rwqe_copy(qp, &s->wqe, g->mo, g->payload, g->plen)) {
		recv_complete(qp, &s->wqe, DGV_WC_LOC_PROT_ERR, 0, g->msn, from, fromlen, false);
		s->kind = SLOT_DISCARD; /* the rest of the message goes nowhere */
	}
	if (s->got_segs < s->nsegs)
		return 0;
	if (s->kind == SLOT_DISCARD) {
		slot_release(s);
		qp->slots_active--;
		release_done_sends(qp, from);
		return 0;
	}
	s->done = true;
	release_done_sends(qp, from);
	return 0;
}

/* RDMA Write and Write-Record: check, place, and for Write-Record keep the validity map.
 * Returns 0, or -EAGAIN on RD when no record slot is free (not consumed). */
static int rx_tagged(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
		      const struct dg_seg *g)
{
	struct dg_reject why;
	if (g->plen) {
		struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, g->stag, g->to, g->plen,
							DGV_ACCESS_REMOTE_WRITE, &why);
		if (!mr) {
			reject(qp, from, fromlen, g, &why, NULL);
			return 0;
		}
		memcpy((void *)(uintptr_t)g->to, g->payload, g->plen);
		soft_mr_put(mr);
	}
	if (g->opcode == RDMAP_WRITE)
		return 0;
	if (qp->base.type == DGV_QPT_RD && soft_cq_full(qp->rcq))
		return -EAGAIN; /* placed again when offered again: same bytes */
	if (g->mo == 0 && g->plen == g->ml) {
		struct dgv_range r = {0, g->ml};
		struct dgv_wc wc = {.status = DGV_WC_SUCCESS, .opcode = DGV_WC_RECV_WRITE_RECORD,
				    .byte_len = g->ml, .msn = g->msn, .qp = &qp->base, .src = *from,
				    .src_len = fromlen};
		wc.record = (struct dgv_record){.stag = g->stag, .base = g->to, .length = g->ml,
						.valid_bytes = g->ml, .nranges = g->ml ? 1 : 0};
		qp->st.rx_msgs++;
		if (soft_cq_push(qp->rcq, &wc, NULL, &r))
			qp->st.cq_overflows++;
		return 0;
	}
	struct soft_slot *s = slot_find(qp, false, from, g->msn);
	if (!s) {
		s = slot_alloc(qp);
		if (!s || slot_init(qp, s, SLOT_WREC, from, fromlen, g)) {
			if (qp->base.type == DGV_QPT_RD)
				return -EAGAIN; /* placed again when offered again: same bytes */
			qp->st.cq_overflows++; /* no room to record: counted, data is placed */
			return 0;
		}
	}
	int m = slot_mark(qp, s, g);
	if (m == 0)
		qp->st.dup_drops++;
	if (m < 0)
		qp->st.malformed_drops++;
	if (s->got_segs == s->nsegs)
		wrec_complete(qp, s);
	return 0;
}

static void rx_read_req(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
			const struct dg_seg *g)
{
	struct rdmap_read_req rr;
	memcpy(&rr, g->payload, sizeof rr);
	uint32_t size = be32toh(rr.read_size);
	uint64_t src_to = be64toh(rr.src_to);
	uint32_t src_stag = be32toh(rr.src_stag);
	struct dg_reject why;
	if (size > qp->max_msg) {
		why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
					 "read larger than the maximum message"};
		reject(qp, from, fromlen, g, &why, g->payload);
		return;
	}
	if (size) {
		struct soft_mr *mr = soft_mr_get_remote(qp->ctx, qp->pd, src_stag, src_to, size,
							DGV_ACCESS_REMOTE_READ, &why);
		if (!mr) {
			reject(qp, from, fromlen, g, &why, g->payload);
			return;
		}
		soft_mr_put(mr);
	}
	struct soft_ird *r = NULL;
	for (int i = 0; i < SOFT_MAX_IRD; i++)
		if (!qp->x->ird[i].used) {
			r = &qp->x->ird[i];
			break;
		}
	if (!r) {
		why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_UNTAGGED_BUF, DDP_ECODE_UT_NO_BUFFER,
					 "too many outstanding reads"};
		reject(qp, from, fromlen, g, &why, g->payload);
		return;
	}
	*r = (struct soft_ird){.used = true, .peer = *from, .peerlen = fromlen, .msn = g->msn,
			       .src_stag = src_stag, .sink_stag = be32toh(rr.sink_stag),
			       .src_to = src_to, .sink_to = be64toh(rr.sink_to), .len = size,
			       .segsz = seg_payload(qp, DG_TAGGED_HLEN)};
	qp->ird_count++;
}

static void ord_finish(struct soft_qp *qp, struct soft_ord *o, enum dgv_wc_status st, uint32_t bytes)
{
	if (o->slot >= 0) {
		struct soft_slot *s = &qp->x->slots[o->slot];
		if (st == DGV_WC_PARTIAL) {
			sq_complete_read_partial(qp, o->sq_idx, s, o);
		} else {
			sq_complete(qp, o->sq_idx, st, bytes);
		}
		s->kind = SLOT_FREE;
		qp->slots_active--;
	} else if (st == DGV_WC_PARTIAL) {
		sq_complete_read_partial(qp, o->sq_idx, NULL, o);
	} else {
		sq_complete(qp, o->sq_idx, st, bytes);
	}
	o->used = false;
	qp->ord_count--;
}

static void rx_read_resp(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
			 const struct dg_seg *g)
{
	struct soft_ord *o = NULL;
	for (int i = 0; i < SOFT_MAX_ORD; i++)
		if (qp->x->ord[i].used && qp->x->ord[i].msn == g->msn && dgv_addr_eq(&qp->x->ord[i].peer, from)) {
			o = &qp->x->ord[i];
			break;
		}
	if (!o) {
		qp->st.dup_drops++; /* late response to a read that already ended */
		return;
	}
	/* The response may only land inside the sink this read advertised. */
	if (g->stag != o->stag || g->ml != o->len || g->to < o->to || g->to - o->to != g->mo) {
		struct dg_reject why = {TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
					"read response outside the requested sink"};
		reject(qp, from, fromlen, g, &why, NULL);
		return;
	}
	if (g->plen) {
		struct dgv_sge sge = {g->to, g->plen, g->stag};
		struct soft_mr *mr = soft_mr_get_local(qp->ctx, qp->pd, &sge, true);
		if (!mr) {
			struct dg_reject why = {TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG,
						"read sink no longer registered"};
			errq_add(qp, &why, false, g->opcode, g->msn, g->stag, g->to, g->plen, from);
			ord_finish(qp, o, DGV_WC_LOC_PROT_ERR, 0);
			return;
		}
		memcpy((void *)(uintptr_t)g->to, g->payload, g->plen);
		soft_mr_put(mr);
	}
	if (qp->base.type == DGV_QPT_RD) {
		o->got += g->plen;
		if (g->last)
			ord_finish(qp, o, DGV_WC_SUCCESS, o->got);
		return;
	}
	if (g->mo == 0 && g->plen == g->ml) {
		ord_finish(qp, o, DGV_WC_SUCCESS, g->ml);
		return;
	}
	if (o->slot < 0) {
		struct soft_slot *s = slot_alloc(qp);
		if (!s || slot_init(qp, s, SLOT_READ, from, fromlen, g)) {
			ord_finish(qp, o, DGV_WC_PARTIAL, 0);
			return;
		}
		o->slot = (int)(s - qp->x->slots);
		s->deadline_us = UINT64_MAX; /* the ORD deadline governs */
	}
	struct soft_slot *s = &qp->x->slots[o->slot];
	int m = slot_mark(qp, s, g);
	if (m == 0)
		qp->st.dup_drops++;
	if (m == 1) /* the response is still coming: only a silence ends the Read */
		o->deadline_us = qp_now(qp) + 4ull * qp->reasm_us;
	if (s->got_segs == s->nsegs)
		ord_finish(qp, o, DGV_WC_SUCCESS, s->ml);
}

static void rx_terminate(struct soft_qp *qp, const union dgv_sockaddr *from, const struct dg_seg *g)
{
	struct rdmap_terminate t;
	memcpy(&t, g->payload, sizeof t);
	uint32_t c = be32toh(t.term_ctrl);
	struct dg_reject why = {(uint8_t)(c >> 28), (uint8_t)((c >> 24) & 0xf), (uint8_t)((c >> 16) & 0xff), NULL};
	uint8_t op = 0xff;
	uint32_t msn = 0, stag = 0;
	uint64_t to = 0;
	const uint8_t *h = g->payload + DG_TERM_LEN;
	uint32_t hl = g->plen - DG_TERM_LEN;
	if ((c & TERM_HDRCT_D) && hl >= 2) {
		uint16_t ctrl = (uint16_t)(h[0] << 8 | h[1]);
		op = ctrl & RDMAP_CTRL_OPCODE;
		if ((ctrl & DDP_CTRL_TAGGED) && hl >= DG_TAGGED_HLEN) {
			struct dg_tagged_hdr th;
			memcpy(&th, h, sizeof th);
			msn = be32toh(th.msn);
			stag = be32toh(th.stag);
			to = be64toh(th.to);
		} else if (!(ctrl & DDP_CTRL_TAGGED) && hl >= DG_UNTAGGED_HLEN) {
			struct dg_untagged_hdr uh;
			memcpy(&uh, h, sizeof uh);
			msn = be32toh(uh.msn);
		}
	}
	qp->st.terminates_rcvd++;
	errq_add(qp, &why, true, op, msn, stag, to, 0, from);
	DG_INFO("terminate from peer for %s msn %u: %s", dg_opcode_name(op), msn,
		dgv_err_str(why.layer, why.etype, why.ecode));
	if (op == RDMAP_READ_REQ) {
		for (int i = 0; i < SOFT_MAX_ORD; i++)
			if (qp->x->ord[i].used && qp->x->ord[i].msn == msn && dgv_addr_eq(&qp->x->ord[i].peer, from)) {
				/* protection: RDMAP remote protection or a DDP tagged-buffer error;
				 * anything else (e.g. the responder's read queue full) is an operation error */
				bool prot = (why.layer == TERM_LAYER_RDMAP && why.etype == RDMAP_ETYPE_REMOTE_PROT) ||
					    (why.layer == TERM_LAYER_DDP && why.etype == DDP_ETYPE_TAGGED_BUF);
				ord_finish(qp, &qp->x->ord[i], prot ? DGV_WC_REM_ACCESS_ERR : DGV_WC_REM_OP_ERR, 0);
			}
	}
}

/* One DDP segment. Returns 0, or -EAGAIN when an RD Send found no receive (not consumed). */
static int rx_segment(struct soft_qp *qp, const union dgv_sockaddr *from, socklen_t fromlen,
		      const uint8_t *buf, size_t len)
{
	struct dg_seg g;
	struct dg_reject why;
	if (dg_seg_parse(buf, len, qp->max_msg, &g, &why)) {
		qp->st.malformed_drops++;
		struct dg_seg none = {.opcode = len >= 2 ? (buf[1] & 0xf) : 0xff};
		errq_add(qp, &why, false, none.opcode, 0, 0, 0, (uint32_t)len, from);
		DG_DBG("malformed segment (%zu bytes): %s", len, why.reason);
		return 0;
	}
	switch (g.opcode) {
	case RDMAP_SEND:
	case RDMAP_SEND_SE:
	case RDMAP_SEND_INV:
	case RDMAP_SEND_SE_INV:
		return rx_send(qp, from, fromlen, &g);
	case RDMAP_WRITE:
	case RDMAP_WRITE_RECORD:
		return rx_tagged(qp, from, fromlen, &g);
	case RDMAP_READ_REQ:
		rx_read_req(qp, from, fromlen, &g);
		break;
	case RDMAP_READ_RESP:
		rx_read_resp(qp, from, fromlen, &g);
		break;
	case RDMAP_TERMINATE:
		rx_terminate(qp, from, &g);
		break;
	default:
		qp->st.malformed_drops++;
		break;
	}
	return 0;
}

static int rd_deliver_cb(void *arg, const union dgv_sockaddr *from, socklen_t fromlen,
			 const uint8_t *seg, size_t len)
{
	return rx_segment(arg, from, fromlen, seg, len);
}

static void rd_acked_cb(void *arg, uint64_t cookie)
{
	struct soft_qp *qp = arg;
	uint32_t idx;
	if (park_lookup(qp, cookie, &idx)) {
		park_complete(qp, idx, DGV_WC_SUCCESS);
		return;
	}
	struct soft_swqe *w = cookie_wqe(qp, cookie, &idx);
	if (!w || w->done || w->opcode == DGV_WR_READ)
		return; /* a Read completes with its response */
	sq_complete(qp, idx, DGV_WC_SUCCESS, w->len);
}

static void rd_failed_cb(void *arg, uint64_t cookie, int err)
{
	struct soft_qp *qp = arg;
	uint32_t idx;
	enum dgv_wc_status st = err == -ECONNRESET ? DGV_WC_REM_OP_ERR : DGV_WC_RETRY_EXC_ERR;
	if (park_lookup(qp, cookie, &idx)) {
		qp->st.rd_peer_failures++;
		park_complete(qp, idx, st);
		return;
	}
	struct soft_swqe *w = cookie_wqe(qp, cookie, &idx);
	if (!w || w->done)
		return;
	qp->st.rd_peer_failures++;
	if (w->opcode == DGV_WR_READ)
		for (int i = 0; i < SOFT_MAX_ORD; i++)
			if (qp->x->ord[i].used && qp->x->ord[i].sq_idx == idx) {
				ord_finish(qp, &qp->x->ord[i], st, 0);
				return;
			}
	sq_complete(qp, idx, st, w->sent);
}

/* RD's GSO trains (rd.h xmit_train). Fault injection and a QP without GSO send the datagrams
 * one by one here (each through the send-edge faults); a kernel that refuses GSO turns it off
 * for the QP (-EOPNOTSUPP: RD then sends this train and the rest one by one). Needs qp->lock. */
static int rd_train_cb(void *arg, const struct iovec *iov, int n, uint16_t seg, const union dgv_sockaddr *to,
		       socklen_t tolen)
{
	struct soft_qp *qp = arg;
	if (qp->gso_off || qp->ftx_on || __builtin_expect(qp->tx_test_cap != 0, 0)) {
		int rc = 0;
		for (int j = 0; j < n; j++) {
			int e = udp_xmit(qp, &iov[j], 1, to, tolen);
			if (e && !rc)
				rc = e;
		}
		return rc;
	}
	ssize_t r = udp_send_train(qp, iov, n, seg, to, tolen);
	if (r < 0)
		return train_failed(qp, (int)-r);
	qp->st.tx_datagrams += (uint64_t)n;
	qp->st.tx_bytes += (uint64_t)r;
	return 0;
}

static const struct rd_ops qp_rd_ops = {
	.xmit = rd_xmit_cb,
	.xmit_train = rd_train_cb,
	.deliver = rd_deliver_cb,
	.acked = rd_acked_cb,
	.failed = rd_failed_cb,
};

/* One datagram from UDP (after receive-edge faults). */
/* True when buf is laid out like one of our datagrams: a CRC failure then means corruption,
 * not a plain datagram. The whole header must hold together (opcode, queue number, lengths
 * against the datagram's size), not just the control bits: plain text starting "AB" has valid
 * control bits, and a plain datagram must never be dropped. Common plain protocols fail at
 * the first byte (RTP's 0x80 has DV=0, MPEG-TS 0x47 sets DDP reserved bits). */
static bool looks_framed(const struct soft_qp *qp, const uint8_t *buf, size_t len)
{
	if (qp->base.type == DGV_QPT_RD) {
		if (len < DG_RD_HLEN + DG_CRC_LEN || buf[0] != RD_MAGIC)
			return false;
		buf += DG_RD_HLEN;
		len -= DG_RD_HLEN;
		if (len == DG_CRC_LEN)
			return true; /* a bare acknowledgement */
	}
	if (len < DG_UNTAGGED_HLEN + DG_CRC_LEN)
		return false;
	uint16_t ctrl = (uint16_t)(buf[0] << 8 | buf[1]);
	if ((ctrl & (DDP_CTRL_RSVD | DDP_CTRL_DV_MASK | RDMAP_CTRL_RV_MASK | RDMAP_CTRL_RSVD)) !=
		    (DDP_CTRL_DV_1 | RDMAP_CTRL_RV_1) ||
	    (ctrl & RDMAP_CTRL_OPCODE) > RDMAP_OPCODE_MAX)
		return false;
	struct dg_seg g;
	struct dg_reject why;
	return dg_seg_parse(buf, len - DG_CRC_LEN, qp->max_msg, &g, &why) == 0;
}

/* A plain datagram on a pass_plain QP: copied whole into the next posted receive. */
static void rx_plain(struct soft_qp *qp, const uint8_t *buf, size_t len, const union dgv_sockaddr *from,
		     socklen_t fromlen)
{
	struct soft_rwqe w;
	if (!soft_rq_pop(qp, &w)) {
		qp->st.no_wqe_drops++; /* as a full socket buffer would */
		return;
	}
	if (len > w.len) {
		recv_complete(qp, &w, DGV_WC_LOC_LEN_ERR, (uint32_t)len, 0, from, fromlen, false);
		return;
	}
	if (soft_rwqe_copy(qp, &w, 0, buf, (uint32_t)len)) {
		recv_complete(qp, &w, DGV_WC_LOC_PROT_ERR, 0, 0, from, fromlen, false);
		return;
	}
	qp->st.rx_plain++;
	struct dgv_wc wc = {.wr_id = w.wr_id, .status = DGV_WC_SUCCESS, .opcode = DGV_WC_RECV_PLAIN,
			    .byte_len = (uint32_t)len, .qp = &qp->base, .src = *from, .src_len = fromlen};
	if (soft_cq_push(qp->rcq, &wc, NULL, NULL))
		qp->st.cq_overflows++;
}

static void rx_datagram(struct soft_qp *qp, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
			socklen_t fromlen)
{
	qp->st.rx_datagrams++;
	qp->st.rx_bytes += len;
	if (len < DG_CRC_LEN + 2 || !dg_crc_check(buf, len)) {
		if (qp->pass_plain && !looks_framed(qp, buf, len))
			rx_plain(qp, buf, len, from, fromlen);
		else
			qp->st.crc_drops++;
		return;
	}
	len -= DG_CRC_LEN;
	if (qp->base.type == DGV_QPT_RD) {
		if (buf[0] != RD_MAGIC || rd_input(qp->rd, from, fromlen, buf, len)) {
			qp->st.malformed_drops++;
			return;
		}
		return;
	}
	rx_segment(qp, from, fromlen, buf, len);
}

struct rx_emit_ctx {
	struct soft_qp *qp;
};

static void rx_fault_emit(void *arg, const struct dg_pkt *pkt)
{
	struct rx_emit_ctx *c = arg;
	/* The fault layer hands back either our receive buffer or its own copy; both writable
	 * for the duration of the call, and rx_datagram only reads. */
	rx_datagram(c->qp, pkt->iov[0].iov_base, pkt->len, pkt->addr, pkt->addrlen);
}

/* One datagram as UDP sent it (a GRO train already cut): through the receive-edge faults,
 * which so drop, hold or damage single datagrams, then the receive path. */
static void rx_piece(struct soft_qp *qp, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
		     socklen_t fromlen)
{
	if (qp->frx_on) {
		struct iovec v = {buf, len};
		struct dg_pkt pkt = {&v, 1, len, from, fromlen};
		struct rx_emit_ctx c = {qp};
		dg_fault_apply(&qp->x->frx, &pkt, rx_fault_emit, &c);
	} else {
		rx_datagram(qp, buf, len, from, fromlen);
	}
}

/* The segment size of a GRO-coalesced receive (its UDP_GRO cmsg), 0 when the buffer is one
 * datagram, -1 when the cmsg holds no usable size. */
/*
 * The receive batch: per thread, not per QP. A QP reads its socket into a batch of buffers and
 * places every datagram before its drain returns (under its lock; fault injection and RD keep
 * copies of what they hold), so nothing refers to the buffers afterwards and one batch per
 * reading thread serves every QP it reads. Per QP it cost each idle UDP socket its message
 * headers (432 bytes of heap) and each socket that ever received a page of buffer or more
 * (issue 14 item 2). The buffers are pages touched only as far as datagrams reach.
 */
struct rx_batch {
	uint8_t *buf;  /* dg_pages_alloc(cap) */
	size_t cap;
	uint32_t size, n; /* buffer size and count the headers below are built for */
	bool busy;        /* a drain of this thread reads into it */
	int slot;         /* in rx_all, or -1 */
	struct mmsghdr msg[SOFT_RX_BATCH];
	struct iovec iov[SOFT_RX_BATCH];
	union dgv_sockaddr addr[SOFT_RX_BATCH];
	_Alignas(struct cmsghdr) uint8_t ctl[SOFT_RX_BATCH][RXCTL_LEN];
};
_Static_assert(SOFT_RX_BATCH >= 8, "a GRO QP reads 8 buffers at once");

static __thread struct rx_batch *rx_tls __attribute__((tls_model("initial-exec")));
static pthread_key_t rx_key;
static pthread_once_t rx_once = PTHREAD_ONCE_INIT;
/* Every thread's batch: a forked child keeps those of the threads that did not come along, which
 * are then reachable only from here (LeakSanitizer counted them as leaks). Slots taken and
 * given back atomically: no lock a thread's end (the key's destructor, also after a
 * pthread_cancel) or a fork must get right. A thread that finds every slot taken goes unlisted. */
#define RX_ALL_MAX 1024
static _Atomic(struct rx_batch *) rx_all[RX_ALL_MAX];

/* At the thread's end (the key's destructor runs in it): a destructor of another key that reads
 * a socket after this one makes a new batch (set again, freed in the next round). */
static void rx_batch_free(void *arg)
{
	struct rx_batch *b = arg;
	if (rx_tls == b)
		rx_tls = NULL;
	if (b->slot >= 0)
		atomic_store_explicit(&rx_all[b->slot], NULL, memory_order_release);
	if (b->buf)
		dg_pages_free(b->buf, b->cap);
	free(b);
}


static void rx_key_make(void)
{
	pthread_key_create(&rx_key, rx_batch_free);
}

/* This thread's receive batch, its headers built for qp's buffer size and count, marked busy
 * (rx_batch_put clears it). NULL without memory, or when a drain of this thread is already
 * reading into it (none does today: placing a datagram reads no socket). */
static struct rx_batch *rx_batch_get(const struct soft_qp *qp)
{
	struct rx_batch *b = rx_tls;
	if (__builtin_expect(!b, 0)) {
		if (!(b = calloc(1, sizeof *b)))
			goto nomem;
		b->slot = -1;
		for (int i = 0; i < RX_ALL_MAX && b->slot < 0; i++) {
			struct rx_batch *none = NULL;
			if (atomic_compare_exchange_strong_explicit(&rx_all[i], &none, b, memory_order_acq_rel,
								    memory_order_relaxed))
				b->slot = i;
		}
		pthread_once(&rx_once, rx_key_make);
		pthread_setspecific(rx_key, b); /* freed when the thread ends */
		rx_tls = b;
	}
	if (__builtin_expect(b->busy, 0))
		return NULL;
	size_t need = (size_t)qp->rxbuf_size * qp->rx_batch;
	if (__builtin_expect(b->cap < need, 0)) {
		uint8_t *nb = dg_pages_alloc(need);
		if (!nb)
			goto nomem;
		if (b->buf)
			dg_pages_free(b->buf, b->cap);
		b->buf = nb, b->cap = need, b->n = 0;
	}
	if (__builtin_expect(b->size != qp->rxbuf_size || b->n != qp->rx_batch, 0)) {
		for (uint32_t i = 0; i < qp->rx_batch; i++) {
			b->iov[i] = (struct iovec){b->buf + (size_t)i * qp->rxbuf_size, qp->rxbuf_size};
			b->msg[i].msg_hdr = (struct msghdr){.msg_name = &b->addr[i], .msg_namelen = sizeof b->addr[i],
							    .msg_iov = &b->iov[i], .msg_iovlen = 1,
							    .msg_control = b->ctl[i]};
		}
		b->size = qp->rxbuf_size, b->n = qp->rx_batch;
	}
	b->busy = true;
	return b;
nomem:;
	static atomic_bool said;
	if (!atomic_exchange(&said, true))
		DG_WARN("no memory for a thread's receive buffers: its sockets are read once it has some");
	return NULL;
}

static inline void rx_batch_put(struct rx_batch *b) { b->busy = false; }

static long rx_gro_size(struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_UDP || cm->cmsg_type != UDP_GRO)
			continue;
		int v;
		if (cm->cmsg_len < CMSG_LEN(sizeof v))
			return -1;
		memcpy(&v, CMSG_DATA(cm), sizeof v);
		return v > 0 ? v : -1;
	}
	return 0;
}

/* Receive buffer i as the kernel filled it: one datagram, or with GRO a train of datagrams
 * of one sender, each handed on alone with its own boundaries (a plain datagram of a
 * pass_plain QP too). Resets the message header for the next read. */
/* A datagram larger than the QP's buffer (the kernel truncated it, or a caller's was longer):
 * counted and dropped. Needs qp->lock. */
static void drop_oversize(struct soft_qp *qp)
{
	qp->st.rx_datagrams++;
	qp->st.malformed_drops++;
	DG_DBG("datagram larger than the segment size (%u): dropped", qp->rxbuf_size);
}

static void rx_one(struct soft_qp *qp, struct rx_batch *b, uint32_t i)
{
	struct msghdr *mh = &b->msg[i].msg_hdr;
	size_t len = b->msg[i].msg_len;
	socklen_t al = mh->msg_namelen;
	mh->msg_namelen = sizeof b->addr[i];
	long gso = qp->gro ? rx_gro_size(mh) : 0;
	if (mh->msg_flags & MSG_TRUNC) {
		drop_oversize(qp);
		return;
	}
	uint8_t *buf = b->iov[i].iov_base;
	/* gso >= len: the kernel says train but the buffer holds one datagram; taken as one */
	if (gso < 0 || (gso && (size_t)gso < len)) {
		struct dg_gso_piece pc[GRO_MAX_SEGS];
		int n = gso < 0 ? -EINVAL : dg_gso_split(buf, len, (size_t)gso, false, pc, GRO_MAX_SEGS);
		if (n < 0) {
			qp->st.rx_datagrams++;
			qp->st.malformed_drops++;
			DG_DBG("coalesced receive of %zu bytes with segment size %ld: dropped", len, gso);
			return;
		}
		/* one skb: its pieces arrived at one instant, one clock reading for RD's timers */
		if (qp->rd)
			rd_clock_hold(qp->rd);
		for (int k = 0; k < n; k++)
			rx_piece(qp, pc[k].buf, pc[k].len, &b->addr[i], al);
		if (qp->rd)
			rd_clock_release(qp->rd);
		return;
	}
	rx_piece(qp, buf, len, &b->addr[i], al);
}

/*
 * Drains the socket. Returns the number of datagrams read.
 * Two modes: while datagrams come one at a time (ping-pong), one recvmsg per call and no second
 * look (the caller polls again anyway), which keeps the latency path short; two reads in a row
 * that found data mean a burst, served by recvmmsg batches until a batch finds only one.
 * The message headers were built at creation; the kernel only rewrites namelen and flags.
 */
/* rx_drain's reads into this thread's batch b. */
static int rx_drain_into(struct soft_qp *qp, struct rx_batch *b, int budget)
{
	if (qp->rx_vlen <= 1 && qp->gro) {
		/* GRO: the segment size comes in a control message, which needs recvmsg */
		b->msg[0].msg_hdr.msg_controllen = RXCTL_LEN;
		ssize_t r = dg_sys_recvmsg(qp->fd, &b->msg[0].msg_hdr, MSG_DONTWAIT);
		if (r < 0) {
			qp->rx_streak = 0;
			return 0;
		}
		b->msg[0].msg_len = (unsigned)r;
		rx_one(qp, b, 0);
		if (++qp->rx_streak >= 2 && qp->rx_cap != 1)
			qp->rx_vlen = qp->rx_batch;
		return 1;
	}
	if (qp->rx_vlen <= 1) {
		/* recvfrom: no message header for the kernel to import; MSG_TRUNC returns the real
		 * length, so an oversized datagram is still recognised */
		socklen_t al = sizeof b->addr[0];
		ssize_t r = dg_sys_recvfrom(qp->fd, b->buf, qp->rxbuf_size, MSG_DONTWAIT | MSG_TRUNC,
					    &b->addr[0].sa, &al);
		if (r < 0) {
			qp->rx_streak = 0;
			return 0;
		}
		b->msg[0].msg_len = (unsigned)r;
		b->msg[0].msg_hdr.msg_namelen = al;
		b->msg[0].msg_hdr.msg_flags = (size_t)r > qp->rxbuf_size ? MSG_TRUNC : 0;
		rx_one(qp, b, 0);
		if (++qp->rx_streak >= 2 && qp->rx_cap != 1)
			qp->rx_vlen = qp->rx_batch;
		return 1;
	}
	int total = 0;
	/* A UD QP receiving Sends of one datagram each that starts the drain with receives posted
	 * reads no more datagrams than it has receives and stops when they ran out: the rest wait
	 * in the kernel's buffer until the program reposts (a NIC places a burst while the program
	 * reposts; this drain runs only when the program polls, and read on, it dropped what the
	 * program was about to take: dgperf UD send_bw of 1 KB lost 3 912 of 5 000 one run in four).
	 * Not for messages of many datagrams: one receive takes thousands of them, and a drain
	 * paused between two messages let a fast sender overflow the socket's buffer. Without
	 * receives at the start it reads as before (Sends dropped, Write-Records placed). */
	bool ud_hold = !qp->rx_hold && qp->base.type == DGV_QPT_UD && qp->rx_single && qp->rq_count > 0;
	while (total < budget) {
		/* rx_hold: read no more datagrams than there are receives to take them (a datagram
		 * takes at most one; the rest stay in the kernel's buffer) */
		uint32_t vlen = qp->rx_batch;
		/* (ud_hold ends with the first multi-datagram Send this drain meets) */
		if ((qp->rx_hold || (ud_hold && qp->rx_single && !qp->slots_active)) && qp->rq_count < vlen)
			vlen = qp->rq_count;
		if (qp->rx_cap && qp->rx_cap - (uint32_t)total < vlen)
			vlen = qp->rx_cap - (uint32_t)total;
		if (!vlen)
			break;
		/* the batch serves every QP of this thread: a control buffer only for GRO's */
		for (uint32_t i = 0; i < vlen; i++)
			b->msg[i].msg_hdr.msg_controllen = qp->gro ? RXCTL_LEN : 0;
		int n = dg_sys_recvmmsg(qp->fd, b->msg, vlen, MSG_DONTWAIT);
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++)
			rx_one(qp, b, (uint32_t)i);
		total += n;
		if ((uint32_t)n < vlen)
			break;
	}
	if (total <= 1) {
		qp->rx_vlen = 1;
		qp->rx_streak = 0;
	}
	return total;
}

static int rx_drain(struct soft_qp *qp, int budget)
{
	if (qp->rx_hold && !qp->rq_count)
		return 0; /* the kernel keeps them until a receive is posted */
	struct rx_batch *b = rx_batch_get(qp);
	if (!b)
		return 0;
	/* RD: what one drain reads (a GRO train's pieces, a recvmmsg batch) is acknowledged once */
	if (qp->rd)
		rd_rx_batch_begin(qp->rd);
	int total = rx_drain_into(qp, b, budget);
	if (qp->rd)
		rd_rx_batch_end(qp->rd);
	rx_batch_put(b);
	return total;
}

static void fault_flush_emit_tx(void *arg, const struct dg_pkt *pkt)
{
	udp_emit(arg, pkt);
}

/* Timers: reassembly and read deadlines, RD, held faults. Deadlines are tens of milliseconds,
 * so the scans run at most every 500 µs, not on every poll. */
static void run_timers(struct soft_qp *qp, uint64_t now)
{
	bool scan = now - qp->last_scan_us >= 500;
	if (scan)
		qp->last_scan_us = now;
	if (scan && qp->slots_active)
		for (int i = 0; i < SOFT_REASM_SLOTS; i++) {
			struct soft_slot *s = &qp->x->slots[i];
			if (s->kind != SLOT_FREE && s->kind != SLOT_READ && s->deadline_us <= now)
				slot_expire(qp, s);
		}
	if (scan && qp->base.type == DGV_QPT_UD)
		for (int i = 0; i < SOFT_MAX_ORD; i++)
			if (qp->x->ord[i].used && qp->x->ord[i].deadline_us <= now) {
				qp->st.reasm_timeouts++;
				ord_finish(qp, &qp->x->ord[i], DGV_WC_PARTIAL, 0);
			}
	if (qp->rd)
		rd_tick(qp->rd, now);
	if (qp->ftx_on && qp->x->ftx.nheld) {
		struct tx_ctx t = {qp, 0};
		dg_fault_flush(&qp->x->ftx, fault_flush_emit_tx, &t);
	}
	if (qp->frx_on && qp->x->frx.nheld) {
		struct rx_emit_ctx c = {qp};
		dg_fault_flush(&qp->x->frx, rx_fault_emit, &c);
	}
}

uint64_t soft_qp_next_timer_locked(struct soft_qp *qp, uint64_t now)
{
	if (qp->rc)
		return soft_rc_next_timer_locked(qp, now);
	uint64_t next = UINT64_MAX;
	if (qp->slots_active)
		for (int i = 0; i < SOFT_REASM_SLOTS; i++) {
			struct soft_slot *s = &qp->x->slots[i];
			if (s->kind != SLOT_FREE && s->kind != SLOT_READ && s->deadline_us < next)
				next = s->deadline_us;
		}
	for (int i = 0; i < SOFT_MAX_ORD; i++)
		if (qp->x->ord[i].used && qp->x->ord[i].deadline_us && qp->x->ord[i].deadline_us < next)
			next = qp->x->ord[i].deadline_us;
	uint64_t rel = next == UINT64_MAX ? UINT64_MAX : (next > now ? next - now : 0);
	if (qp->rd) {
		uint64_t r = rd_tick(qp->rd, now);
		if (r < rel)
			rel = r;
	}
	if (((qp->ftx_on && qp->x->ftx.nheld) || (qp->frx_on && qp->x->frx.nheld)) && rel > 1000)
		rel = 1000;
	return rel;
}

bool soft_qp_timers_pending(struct soft_qp *qp)
{
	if (qp->rc)
		return soft_rc_timers_pending(qp);
	return qp->rd || qp->slots_active || qp->ord_count || qp->ird_count ||
	       (qp->ftx_on && qp->x->ftx.nheld) || (qp->frx_on && qp->x->frx.nheld) || qp->pump_blocked || qp->sq_pump != qp->sq_tail;
}

/* A UD QP that reads its socket only from the program's calls (rx_hold) makes every receive
 * completion inside them; what the provider's thread does on its own for it is timers (a
 * reassembly's expiry: an error completion nobody waits for) and pumping sends the kernel
 * refused (their room is the socket's POLLOUT, which the waiter watches). Held datagrams of
 * fault injection and RD's retransmissions and acknowledgements are not so. An RC QP read
 * only by the program (rx_app) is so until TCP refuses one of its sends: the thread then
 * finishes the send and completes it while the program may be asleep in a wait that watches
 * the socket, whose POLLOUT may already have been taken (by that wait's own look); the
 * eventfd made from then on starts readable if the completion came first (soft_cq_fd). */
bool soft_qp_self_driven(const struct soft_qp *qp)
{
	if (qp->rc)
		return qp->rx_app && !__atomic_load_n(&qp->tx_refused, __ATOMIC_ACQUIRE) && !qp->ftx_on &&
		       !qp->frx_on;
	return qp->base.type == DGV_QPT_UD && !qp->rd && qp->rx_hold && !qp->ftx_on && !qp->frx_on;
}

int soft_qp_socket_events(struct dgv_qp *qpb)
{
	return soft_qp_wants_pollout(to_sqp(qpb)) ? POLLOUT : 0;
}

bool soft_qp_wants_pollout(struct soft_qp *qp)
{
	if (qp->rc)
		return soft_rc_wants_pollout(qp);
	return __atomic_load_n(&qp->pump_blocked, __ATOMIC_RELAXED);
}

/* What follows received datagrams: RD's segments refused for want of a slot or a receive may
 * go now, and the send queue's Read Responses and pumped sends. Needs qp->lock. */
static void after_rx_locked(struct soft_qp *qp)
{
	if (qp->rd)
		rd_kick(qp->rd);
	if (qp->sq_pump != qp->sq_tail || qp->ird_count)
		pump(qp);
}

int soft_qp_progress(struct soft_qp *qp, bool from_app, bool block)
{
	if (qp->rc)
		return soft_rc_progress(qp, from_app, block);
	if (from_app)
		atomic_store_explicit(&qp->app_polls,
				      atomic_load_explicit(&qp->app_polls, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	if (block)
		pthread_mutex_lock(&qp->lock);
	else if (pthread_mutex_trylock(&qp->lock))
		return -EBUSY;
	qp->now_us = 0;
	/* rx_hold: only the program's own calls read the socket (the thread runs timers) */
	int n = qp->rx_hold && !from_app ? 0 : rx_drain(qp, 256);
	/* An idle UD QP has no timers: the busy-poll path then reads no clock at all. */
	if (qp->rd || qp->slots_active || qp->ord_count || (qp->ftx_on && qp->x->ftx.nheld) || (qp->frx_on && qp->x->frx.nheld))
		run_timers(qp, qp_now(qp));
	after_rx_locked(qp);
	soft_qp_unlock(qp);
	return n;
}

/* Test hook, declared by tests/unit/test_verbs.c and test_rc.c (not part of soft.h): the QP's
 * socket takes at most cap bytes of its next send and then has no room (-EAGAIN, as a kernel
 * send buffer with no room) until the hook is set to 0, so that tests reach what a post leaves
 * queued and, on RC, an FPDU cut by TCP. A UD datagram goes whole or not at all: any cap is
 * "full". */
void soft_qp_test_tx_cap(struct dgv_qp *qpb, uint32_t cap);
void soft_qp_test_tx_cap(struct dgv_qp *qpb, uint32_t cap)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	qp->tx_test_cap = cap;
	soft_qp_unlock(qp);
}

/* Test hook (tests/unit/test_rc.c): the entries of qp's send queue now, 0 while it has none
 * (an idle RC connection gave it back: rc_sq_release). */
uint32_t soft_qp_test_sq_entries(struct dgv_qp *qpb);
uint32_t soft_qp_test_sq_entries(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	uint32_t n = qp->sq ? qp->sq_cap : 0;
	soft_qp_unlock(qp);
	return n;
}

/* Test hook, declared by tests/fuzz/fuzz_qp.c (not part of soft.h): one datagram as UDP would
 * have delivered it, without the socket, followed by what a progress pass does after reading
 * (RD redelivery, the pump for Read Responses). Lets the fuzzer reach the receive path at
 * hundreds of thousands of datagrams a second. */
void soft_qp_test_rx(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
		     socklen_t fromlen);
void soft_qp_test_rx(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
		     socklen_t fromlen)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	qp->now_us = 0;
	rx_datagram(qp, buf, len, from, fromlen);
	after_rx_locked(qp);
	soft_qp_unlock(qp);
}

/* dgv_qp_rx_take's check: whether buf (len bytes from *from) is by itself a whole message the
 * caller may take where it lies, and if so counts it received as placement would (rx_msgs, the
 * datagram counters) and says where it is in *out. Only what changes no QP state but the
 * counters qualifies: a single-segment Send or Send with Solicited Event (an Invalidate names
 * an STag), or a plain datagram of a pass_plain QP, at most max bytes; and only while order
 * allows it: no completion waits in the receive CQ (a message placed earlier goes first), no
 * message of several segments is being put together (rx_send holds a later message of the
 * same sender behind it), no receive-edge fault holds datagrams. An armed CQ is left armed: the
 * message goes to the caller, and a notification of it would be for nobody. Needs qp->lock.
 * Returns true when taken. */
static bool rx_takeable(struct soft_qp *qp, const uint8_t *buf, size_t len, uint32_t max,
			struct dgv_rx_msg *out)
{
	if (qp->base.type != DGV_QPT_UD || qp->frx_on || qp->slots_active ||
	    __atomic_load_n(&qp->rcq->count, __ATOMIC_ACQUIRE))
		return false;
	if (len < DG_CRC_LEN + 2 || !dg_crc_check(buf, len)) {
		if (!qp->pass_plain || len > max || looks_framed(qp, buf, len))
			return false; /* dropped, or too long for the receive: rx_datagram says so */
		qp->st.rx_plain++;
		*out = (struct dgv_rx_msg){.off = 0, .len = (uint32_t)len, .framed = false};
	} else {
		struct dg_seg g;
		struct dg_reject why;
		if (dg_seg_parse(buf, len - DG_CRC_LEN, qp->max_msg, &g, &why) ||
		    (g.opcode != RDMAP_SEND && g.opcode != RDMAP_SEND_SE) || g.mo != 0 || g.plen != g.ml ||
		    g.ml > max)
			return false;
		qp->st.rx_msgs++;
		*out = (struct dgv_rx_msg){.off = (uint32_t)(g.payload - buf), .len = g.ml, .framed = true};
	}
	qp->st.rx_datagrams++;
	qp->st.rx_bytes += len;
	return true;
}

/* soft_qp_rx_feed's work, also the fuzzer's (soft_qp_test_rx_take). Returns 1 (taken), 0. */
static int rx_feed_one(struct soft_qp *qp, uint8_t *dgram, size_t len, const struct sockaddr *src,
		       socklen_t srclen, uint32_t max, struct dgv_rx_msg *take)
{
	int r = 0;
	pthread_mutex_lock(&qp->lock);
	qp->now_us = 0;
	if (len > qp->rxbuf_size) {
		drop_oversize(qp); /* what the kernel's MSG_TRUNC says when the QP reads */
	} else {
		if (take && rx_takeable(qp, dgram, len, max, take)) {
			r = 1; /* handed back where it lies: its source is the caller's */
		} else {
			union dgv_sockaddr from;
			memset(&from, 0, sizeof from);
			memcpy(&from, src, srclen < sizeof from ? srclen : sizeof from);
			rx_piece(qp, dgram, len, &from, srclen);
		}
		after_rx_locked(qp);
	}
	soft_qp_unlock(qp);
	return r;
}

int soft_qp_rx_feed(struct dgv_qp *qpb, void *dgram, size_t len, const struct sockaddr *src,
		    socklen_t srclen, uint32_t max, struct dgv_rx_msg *take)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (qp->rc || qp->own_fd)
		return -EOPNOTSUPP; /* only a socket the caller may read: the program's own */
	return rx_feed_one(qp, dgram, len, src, srclen, max, take);
}

/* Test hook, declared by tests/fuzz/fuzz_qp.c (not part of soft.h): dgv_qp_rx_take on a QP that
 * reads its own socket too (the fuzzer's), so that hostile datagrams reach its checks. */
int soft_qp_test_rx_take(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
			 socklen_t fromlen, uint32_t max, struct dgv_rx_msg *out);
int soft_qp_test_rx_take(struct dgv_qp *qpb, uint8_t *buf, size_t len, const union dgv_sockaddr *from,
			 socklen_t fromlen, uint32_t max, struct dgv_rx_msg *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	return qp->rc ? -EOPNOTSUPP : rx_feed_one(qp, buf, len, &from->sa, fromlen, max, out);
}

/* ------------------------------------------------------------------ verbs */

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* The provider's own sockets (not a program's, whose buffers are its own): 4 MiB to receive
 * (the kernel doubles it), so bursts wait for the reader rather than drop; 1 MiB to send (2 MiB
 * charged). The send buffer is also all UDP queues ahead of the first hop: a UD sender has no
 * congestion control, and its skbs stay charged to the socket while a qdisc holds them, so the
 * socket's room is the only back-pressure it gets. With 8 MiB it out-queued a 10 Gbit/s tbf
 * (limit 7.25 MB), which dropped whole GSO trains: a 512 KB Write-Record stream across the
 * shaped veth lost 25 % of its datagrams (1 050 MB/s of valid bytes at 1.09 CPU-s/GB, against
 * 1 189 MB/s, every byte, at 0.49 with 2 MiB; docs/results.md section 6). 2 MiB is 1.7 ms at
 * 10 Gbit/s, under fq_codel's 5 ms target too. */
static void set_bufs(int fd)
{
	int sz = 4 << 20;
	/* FORCE works for root past rmem_max; otherwise the plain option takes what it can. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	sz = 1 << 20;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

static void qp_free(struct soft_qp *qp)
{
	if (qp->rd)
		rd_destroy(qp->rd);
	if (qp->ftx_on)
		dg_fault_fini(&qp->x->ftx);
	if (qp->frx_on)
		dg_fault_fini(&qp->x->frx);
	for (int i = 0; i < SOFT_REASM_SLOTS; i++)
		free(qp->x->slots[i].bitmap);
	if (qp->own_fd && qp->fd >= 0)
		close(qp->fd);
	for (uint32_t i = qp->sq_head; qp->sq && i != qp->sq_tail; i++)
		free(qp->sq[i % qp->sq_cap].ibuf); /* inline sends never sent */
	soft_sq_free(qp);
	free(qp->rdpend);
	soft_rq_free(qp);
	pthread_mutex_destroy(&qp->lock);
	soft_qp_release(qp);
}

_Static_assert(sizeof(struct soft_qp) <= DG_SMALL_MAX, "an RC QP's fields fit dg_small_alloc");
/* The UD/RD layout's rest starts right after the fields, aligned as the rest wants. */
#define QP_X_OFF ((sizeof(struct soft_qp) + _Alignof(struct soft_qp_ext) - 1) & ~(_Alignof(struct soft_qp_ext) - 1))

struct soft_qp *soft_qp_alloc(bool rc)
{
	if (!rc) {
		uint8_t *p = dg_zalloc(QP_X_OFF + sizeof(struct soft_qp_ext));
		if (!p)
			return NULL;
		struct soft_qp *qp = (struct soft_qp *)p;
		qp->x = (struct soft_qp_ext *)(p + QP_X_OFF);
		return qp;
	}
	struct soft_qp *qp = dg_small_alloc(sizeof *qp);
	struct soft_qp_ext *x = dg_zalloc(sizeof *x);
	if (!qp || !x) {
		dg_small_free(qp, sizeof *qp);
		dg_zfree(x, sizeof *x);
		return NULL;
	}
	qp->x = x;
	qp->x_apart = true;
	return qp;
}

void soft_qp_release(struct soft_qp *qp)
{
	if (!qp)
		return;
	if (!qp->x_apart) {
		dg_zfree(qp, QP_X_OFF + sizeof(struct soft_qp_ext));
		return;
	}
	dg_zfree(qp->x, sizeof *qp->x);
	dg_small_free(qp, sizeof *qp);
}

/* The QP's UDP socket: the adopted one, or a new one bound as a asks (non-blocking). Sets
 * qp->fd, own_fd, local, has_peer/peer and *family. Returns 0 or -errno (qp_free closes an
 * own socket). */
static int qp_socket(struct soft_qp *qp, const struct dgv_qp_init_attr *a, int *family_out)
{
	int family = a->bind_addr ? a->bind_addr->sa_family : (a->bind_family ? a->bind_family : AF_INET);
	qp->locallen = sizeof qp->local;
	if (a->use_adopt_fd) {
		if (getsockname(a->adopt_fd, &qp->local.sa, &qp->locallen))
			return -errno;
		family = qp->local.sa.sa_family;
		qp->fd = a->adopt_fd;
		qp->own_fd = false;
	} else {
		if (family != AF_INET && family != AF_INET6)
			return -EAFNOSUPPORT;
		qp->fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (qp->fd < 0)
			return -errno;
		qp->own_fd = true;
		union dgv_sockaddr any = {0};
		socklen_t al = family == AF_INET ? sizeof any.sin : sizeof any.sin6;
		any.sa.sa_family = (sa_family_t)family;
		if (bind(qp->fd, a->bind_addr ? a->bind_addr : &any.sa, a->bind_addr ? a->bind_len : al))
			return -errno;
		set_bufs(qp->fd);
	}
	/* Every socket call here passes MSG_DONTWAIT; an adopted socket's file flags are the
	 * program's and stay as it set them (they outlive us across exec). */
	int err;
	if (qp->own_fd && (err = set_nonblock(qp->fd)))
		return err;
	/* an adopted socket's address was read above (one system call less per taken socket) */
	if (qp->own_fd && getsockname(qp->fd, &qp->local.sa, &qp->locallen))
		return -errno;
	/* An adopted socket may be connect()ed (VLC does): sends to that peer then go without an
	 * address, on the kernel's cached route. */
	socklen_t pl = sizeof qp->peer;
	qp->has_peer = a->use_adopt_fd && getpeername(qp->fd, &qp->peer.sa, &pl) == 0;
	*family_out = family;
	return 0;
}

/*
 * UDP GSO/GRO (DGSHIM_UDP_GSO, default on). Sends: a UD message of several datagrams goes by
 * UDP_SEGMENT trains (pump_ud_gso) on any socket: the cmsg changes nothing on the socket.
 * Receives: UDP_GRO only on the QP's own socket, and not with rx_hold (which counts datagrams
 * per read). An adopted socket is the program's: it may read it itself again (a socket the
 * shim gives back, a fork's copy), and with UDP_GRO left on it would meet trains where it
 * expects datagrams; a GSO train reaching it is cut by the kernel into datagrams as before.
 */
static void qp_gso_setup(struct soft_qp *qp)
{
	if (dg_env_word(DG_ENV_UDP_GSO) == DG_OFF) {
		qp->gso_off = true;
		return;
	}
	int one = 1;
	qp->gro = qp->own_fd && !qp->rx_hold &&
		  setsockopt(qp->fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
}

/* The work queues of a UD or RD QP and the size and count of its receive batch (rx_batch_get). Returns 0 or
 * -ENOMEM (qp_free frees what was allocated). */
static int qp_rings(struct soft_qp *qp, const struct dgv_qp_init_attr *a)
{
	qp->sq_cap = a->max_send_wr ? a->max_send_wr : DEFAULT_WR;
	qp->sq_max = qp->sq_cap;
	qp->rq_cap = a->max_recv_wr ? a->max_recv_wr : DEFAULT_WR;
	soft_sq_alloc(qp);
	soft_rq_alloc(qp);
	/* pass_plain: a plain datagram may be as large as UDP allows, and must not be cut; GRO:
	 * a coalesced train is up to 64 KiB too. 8 such buffers (pages touched only as trains
	 * fill them) take 350 MTU datagrams per recvmmsg. */
	qp->rxbuf_size = qp->pass_plain || qp->gro ? 65536 : qp->seg_size < 2048 ? 2048 : qp->seg_size;
	qp->rx_batch = qp->rxbuf_size <= 4096 ? SOFT_RX_BATCH : qp->gro ? 8 : 4;
	if (!qp->sq || !qp->rq)
		return -ENOMEM;
	return 0;
}

int soft_create_qp(struct dgv_pd *pdb, const struct dgv_qp_init_attr *a, struct dgv_qp **out)
{
	if (a->qp_type == DGV_QPT_RC)
		return -EOPNOTSUPP; /* RC QPs come from dgv_connect / dgv_accept (rc_cm.c) */
	if (a->max_sge > SOFT_MAX_SGE)
		return -EINVAL;
	/* most of it (reassembly slots, read and error queues) is never touched by an idle QP */
	struct soft_qp *qp = soft_qp_alloc(false);
	if (!qp)
		return -ENOMEM;
	int err;
	qp->base.ctx = pdb->ctx;
	qp->base.type = a->qp_type;
	qp->ctx = to_sctx(pdb->ctx);
	qp->pd = to_spd(pdb);
	qp->scq = to_scq(a->send_cq);
	qp->rcq = to_scq(a->recv_cq);
	qp->fd = -1;
	pthread_mutex_init(&qp->lock, NULL);
	qp->max_msg = a->max_msg_size ? a->max_msg_size : DEFAULT_MAX_MSG;
	qp->max_sge = a->max_sge ? a->max_sge : 4;
	qp->reasm_us = a->reasm_timeout_us ? a->reasm_timeout_us : DEFAULT_REASM_US;
	qp->pass_plain = a->pass_plain != 0;
	qp->rx_hold = a->rx_hold && a->qp_type == DGV_QPT_UD;
	int family = AF_INET;
	if ((err = qp_socket(qp, a, &family)))
		goto fail;
	qp->seg_size = a->seg_size ? a->seg_size : (family == AF_INET6 ? 1452 : 1472);
	/* A socket's QP (pass_plain: its receive buffers hold UDP's largest datagram) cuts UD
	 * messages at each destination's route MTU (65507 on loopback, 8972 on a jumbo network)
	 * unless a segment size was asked for; RD keeps seg_size (its window holds segments). */
	qp->seg_path = !a->seg_size && a->pass_plain && a->qp_type == DGV_QPT_UD;
	uint32_t min_seg = DG_RD_HLEN + DG_TAGGED_HLEN + DG_CRC_LEN + DG_MIN_SEGSZ;
	if (qp->seg_size < min_seg || qp->seg_size > DG_MAX_DATAGRAM) {
		err = -EINVAL;
		goto fail;
	}
	qp_gso_setup(qp);
	if ((err = qp_rings(qp, a)))
		goto fail;
	struct dgv_fault ftx, frx;
	if (!a->fault_tx && (err = dg_fault_from_env(DG_ENV_FAULT_TX, &ftx)))
		goto fail;
	if (!a->fault_rx && (err = dg_fault_from_env(DG_ENV_FAULT_RX, &frx)))
		goto fail;
	/* made on the stack, kept in the rest only when on: an idle QP does not write the page
	 * they are on */
	struct dg_fault_state fs;
	if ((err = dg_fault_init(&fs, a->fault_tx ? a->fault_tx : &ftx, qp->seg_path ? DG_MAX_DATAGRAM : qp->seg_size)))
		goto fail;
	if ((qp->ftx_on = fs.active))
		qp->x->ftx = fs;
	else
		dg_fault_fini(&fs);
	if ((err = dg_fault_init(&fs, a->fault_rx ? a->fault_rx : &frx, qp->rxbuf_size)))
		goto fail;
	if ((qp->frx_on = fs.active))
		qp->x->frx = fs;
	else
		dg_fault_fini(&fs);
	if (a->qp_type == DGV_QPT_RD) {
		/* The window sizes the reordering pool and half the retransmission pool, which
		 * dominate an RD QP's memory: at most 4 and 8 MiB, whatever the segment size. */
		uint32_t dgram = qp->seg_size - DG_RD_HLEN - DG_CRC_LEN;
		uint32_t wnd = a->rd_window ? a->rd_window : 256;
		uint32_t cap = (4u << 20) / dgram;
		if (wnd > cap)
			wnd = cap < 16 ? 16 : cap;
		/* twice the window of retransmission slots: one peer whose window is full (a
		 * slow one, or a dead one until its retries run out) leaves room for the others */
		struct rd_cfg rc = {.max_dgram = dgram, .max_retries = a->rd_max_retries,
				    .tx_slots = 2 * wnd, .rx_slots = wnd, .max_wnd = wnd};
		if ((err = rd_create(&rc, &qp_rd_ops, qp, &qp->rd)))
			goto fail;
		/* one parked send per retransmission slot: each holds its last segment's slot */
		qp->rdpend_cap = rc.tx_slots;
		qp->rdpend = calloc(qp->rdpend_cap, sizeof *qp->rdpend);
		if (!qp->rdpend) {
			err = -ENOMEM;
			goto fail;
		}
		qp->rdpend_free = UINT32_MAX;
		for (uint32_t k = qp->rdpend_cap; k-- > 0;)
			park_release(qp, k);
	}
	if ((err = soft_cq_attach(qp->scq, qp)))
		goto fail;
	if (qp->rcq != qp->scq && (err = soft_cq_attach(qp->rcq, qp))) {
		soft_cq_detach(qp->scq, qp);
		goto fail;
	}
	atomic_fetch_add(&qp->pd->refs, 1);
	soft_ctx_add_qp(qp->ctx, qp);
	DG_DBG("%s QP on fd %d, segment size %u", a->qp_type == DGV_QPT_UD ? "UD" : "RD", qp->fd,
		qp->seg_size);
	*out = &qp->base;
	return 0;
fail:
	qp_free(qp);
	return err;
}

/* Takes qp off its CQs, then waits until no CQ walker holds it and a progress call that got in
 * before the detach has left: afterwards nothing but the caller touches qp. Called without
 * qp->lock, after the QP left the context's list. */
void soft_qp_quiesce(struct soft_qp *qp)
{
	soft_cq_detach(qp->scq, qp);
	if (qp->rcq != qp->scq)
		soft_cq_detach(qp->rcq, qp);
	while (atomic_load(&qp->refs))
		sched_yield();
	pthread_mutex_lock(&qp->lock);
	soft_qp_unlock(qp);
}

int soft_destroy_qp(struct dgv_qp *qpb)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (qp->rc)
		return soft_rc_destroy(qp);
	soft_ctx_remove_qp(qp->ctx, qp);
	pthread_mutex_lock(&qp->lock);
	if (qp->rd)
		rd_ack_owed(qp->rd, dg_now_us());
	/* Flush: every outstanding work request completes with WR_FLUSH_ERR. */
	for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++) {
		uint32_t idx = i % qp->sq_cap;
		if (!qp->sq[idx].done)
			sq_complete(qp, idx, DGV_WC_WR_FLUSH_ERR, 0);
	}
	for (uint32_t k = 0; k < qp->rdpend_cap; k++)
		if (qp->rdpend[k].used)
			park_complete(qp, k, DGV_WC_WR_FLUSH_ERR);
	struct soft_rwqe w;
	while (soft_rq_pop(qp, &w)) {
		union dgv_sockaddr none = {0};
		recv_complete(qp, &w, DGV_WC_WR_FLUSH_ERR, 0, 0, &none, 0, false);
	}
	for (int i = 0; i < SOFT_REASM_SLOTS; i++)
		if (qp->x->slots[i].kind == SLOT_SEND) {
			union dgv_sockaddr none = {0};
			recv_complete(qp, &qp->x->slots[i].wqe, DGV_WC_WR_FLUSH_ERR, 0, 0, &none, 0, false);
		}
	soft_qp_unlock(qp);
	soft_qp_quiesce(qp);
	atomic_fetch_sub(&qp->pd->refs, 1);
	qp_free(qp);
	return 0;
}

int soft_qp_local_addr(struct dgv_qp *qpb, union dgv_sockaddr *out, socklen_t *len)
{
	struct soft_qp *qp = to_sqp(qpb);
	*out = qp->local;
	*len = qp->locallen;
	return 0;
}

/* Checks one send WR. Returns 0, a WC status > 0 for errors reported by completion, or -errno
 * for errors that refuse the post. */
static int check_send_wr(struct soft_qp *qp, const struct dgv_send_wr *wr, uint64_t *total)
{
	if ((unsigned)wr->opcode > DGV_WR_SEND_PLAIN || wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge)
		return -EINVAL;
	if (!wr->ah || wr->ah->ctx != qp->base.ctx)
		return -EINVAL;
	if (wr->num_sge && !wr->sg_list)
		return -EINVAL;
	if (wr->opcode == DGV_WR_READ && wr->num_sge != 1)
		return -EINVAL; /* the Read Request advertises one sink STag */
	bool inl = wr->send_flags & DGV_SEND_INLINE;
	if (inl && (qp->base.type != DGV_QPT_UD || (wr->opcode != DGV_WR_SEND && wr->opcode != DGV_WR_SEND_SE)))
		return -EINVAL;
	uint64_t t = 0;
	for (int i = 0; i < wr->num_sge; i++)
		t += wr->sg_list[i].length;
	if (t > qp->max_msg || (wr->opcode == DGV_WR_SEND_PLAIN && t > DG_MAX_DATAGRAM))
		return -EMSGSIZE;
	*total = t;
	for (int i = 0; i < wr->num_sge && inl; i++)
		if (wr->sg_list[i].length && !wr->sg_list[i].addr)
			return -EFAULT;
	for (int i = 0; i < wr->num_sge && !inl; i++)
		if (soft_mr_check_local(qp->ctx, qp->pd, &wr->sg_list[i], wr->opcode == DGV_WR_READ))
			return DGV_WC_LOC_PROT_ERR;
	return 0;
}

/* DGV_SEND_INLINE entries posted from index first on that the post's pump did not send whole
 * (the socket was full, fault injection, a long message's tail): their payload is copied into a
 * buffer of the entry's own, as the caller may reuse its memory once the post returns. Without
 * memory the entry fails (a lost datagram, counted) rather than read that memory later. Needs
 * qp->lock. */
static void inline_keep(struct soft_qp *qp, uint32_t first)
{
	for (uint32_t i = first; i != qp->sq_tail; i++) {
		uint32_t idx = i % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		if (!(w->flags & DGV_SEND_INLINE) || w->done || w->all_sent || w->ibuf)
			continue;
		uint8_t *b = malloc(w->len ? w->len : 1);
		if (!b) {
			DG_WARN("no memory to keep a queued send's %u bytes: dropped", w->len);
			w->all_sent = true;
			sq_complete(qp, idx, DGV_WC_GENERAL_ERR, 0);
			continue;
		}
		uint32_t off = 0;
		for (uint32_t k = 0; k < w->num_sge; k++) {
			if (w->sge[k].length)
				memcpy(b + off, (const void *)(uintptr_t)w->sge[k].addr, w->sge[k].length);
			off += w->sge[k].length;
		}
		w->ibuf = b;
		w->sge[0] = (struct dgv_sge){(uint64_t)(uintptr_t)b, w->len, 0};
		w->num_sge = w->len ? 1 : 0;
	}
}

/* One Send of total bytes from iov's pieces to ah as one datagram, handed to UDP now: up to
 * FLAT_MAX bytes laid out whole on the stack with the CRC taken in one pass (one sendto), larger
 * as header, pieces and CRC (sendmsg). Does not count the message or advance the MSN. Returns 0,
 * 1 when it needs more than one datagram (nothing sent), -EAGAIN (the socket is full) or -errno.
 * Needs qp->lock. */
static inline __attribute__((always_inline)) int
ud_datagram_now(struct soft_qp *qp, const struct dgv_ah *ah, uint8_t opcode, const struct iovec *iov, int n,
		uint64_t total)
{
	uint32_t segsz = ah_seg_payload(qp, ah, DG_UNTAGGED_HLEN);
	if (total > segsz)
		return 1;
	union {
		struct dg_untagged_hdr h;
		uint8_t b[FLAT_MAX];
	} f;
	dg_put_untagged(&f.h, opcode, true, DDP_QN_SEND, qp->msn_send, 0, (uint32_t)total, (uint16_t)segsz, 0);
	if (DG_UNTAGGED_HLEN + total + DG_CRC_LEN > FLAT_MAX)
		return tx_segment(qp, &f.h, DG_UNTAGGED_HLEN, iov, n, &ah->addr, ah->addrlen, 0);
	size_t off = DG_UNTAGGED_HLEN;
	for (int i = 0; i < n; i++) {
		if (iov[i].iov_len)
			memcpy(f.b + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	be32 crc = htobe32(dg_crc32c(f.b, off));
	memcpy(f.b + off, &crc, sizeof crc);
	struct iovec one = {f.b, off + sizeof crc};
	return udp_xmit(qp, &one, 1, &ah->addr, ah->addrlen);
}

/* UD's common case: one inline Send that fits one segment, nothing queued before it (no send,
 * no Read Response) and no fault injection. The datagram is handed to UDP during the post, with
 * no send-queue entry written, pumped and retired: a stream of small datagrams pays only the
 * system call (issue 14 item 4). Returns true when the post is done (sent, or completed with an
 * error), false when the queued way must take it (the socket is full, or more than one
 * segment). Needs qp->lock. */
static bool ud_send_now(struct soft_qp *qp, const struct dgv_send_wr *wr)
{
	uint64_t total = 0;
	if (check_send_wr(qp, wr, &total))
		return false; /* the queued way says why */
	struct iovec pl[SOFT_MAX_SGE];
	int npl = soft_sge_iov(wr->sg_list, (uint32_t)wr->num_sge, 0, (uint32_t)total, pl, SOFT_MAX_SGE);
	uint32_t msn = qp->msn_send;
	int rc = ud_datagram_now(qp, wr->ah, wr->opcode == DGV_WR_SEND ? RDMAP_SEND : RDMAP_SEND_SE, pl, npl, total);
	if (rc == -EAGAIN || rc == 1)
		return false; /* queued (its payload copied) until the socket has room, or segmented */
	qp->msn_send++;
	if (rc)
		DG_WARN("send to peer failed: %s", strerror(-rc));
	send_cqe(qp, wr->wr_id, wr->opcode, wr->send_flags & DGV_SEND_SIGNALED,
		 rc ? DGV_WC_GENERAL_ERR : DGV_WC_SUCCESS, rc ? 0 : (uint32_t)total, msn);
	return true;
}

/* dgv_send_now: ud_send_now's case with no work request to build, check and retire (a socket's
 * sendto costs the program one lock and the system call). Anything out of the common case says
 * -EAGAIN, and dgv_post_send then takes the message the queued way and reports what went wrong
 * as it always has. */
int soft_send_now(struct dgv_qp *qpb, struct dgv_ah *ah, const struct iovec *iov, int iovcnt)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (qp->base.type != DGV_QPT_UD || qp->rc || iovcnt > SOFT_MAX_SGE || ah->ctx != qp->base.ctx)
		return -EAGAIN;
	uint64_t total = 0;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len && !iov[i].iov_base)
			return -EAGAIN; /* check_send_wr's EFAULT */
		total += iov[i].iov_len;
	}
	int rc = -EAGAIN;
	pthread_mutex_lock(&qp->lock);
	if (qp->sq_head == qp->sq_tail && !qp->ird_count && !qp->ftx_on && total <= qp->max_msg &&
	    ud_datagram_now(qp, ah, RDMAP_SEND, iov, iovcnt, total) == 0) {
		qp->msn_send++;
		qp->st.tx_msgs++;
		rc = 0;
	}
	soft_qp_unlock(qp);
	return rc;
}

int soft_post_send(struct dgv_qp *qpb, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	struct soft_qp *qp = to_sqp(qpb);
	int rc = 0;
	if (qp->rc)
		return soft_rc_post_send(qp, wr, bad);
	pthread_mutex_lock(&qp->lock);
	if (qp->base.type == DGV_QPT_UD && wr && !wr->next && (wr->send_flags & DGV_SEND_INLINE) &&
	    qp->sq_head == qp->sq_tail && !qp->ird_count && !qp->ftx_on && ud_send_now(qp, wr)) {
		soft_qp_unlock(qp);
		*bad = NULL;
		return 0;
	}
	/* an empty ring starts again at its first entry: a socket that sends a datagram at a time
	 * then writes one page of it, not each of its pages in turn (each entry was retired: no
	 * cookie or read names one) */
	if (qp->sq_head == qp->sq_tail && qp->sq_pump == qp->sq_tail)
		qp->sq_head = qp->sq_pump = qp->sq_tail = 0;
	uint32_t first = qp->sq_tail;
	bool inl = false;
	for (; wr; wr = wr->next) {
		uint64_t total = 0;
		int chk = check_send_wr(qp, wr, &total);
		if (chk < 0) {
			rc = chk;
			break;
		}
		inl |= (wr->send_flags & DGV_SEND_INLINE) != 0;
		if (qp->sq_tail - qp->sq_head >= qp->sq_cap) {
			rc = -ENOMEM;
			break;
		}
		uint32_t idx = qp->sq_tail % qp->sq_cap;
		struct soft_swqe *w = &qp->sq[idx];
		uint32_t gen = w->gen + 1;
		*w = (struct soft_swqe){.wr_id = wr->wr_id, .opcode = wr->opcode, .flags = wr->send_flags,
					.num_sge = (uint32_t)wr->num_sge, .len = (uint32_t)total,
					.remote_addr = wr->remote_addr, .rkey = wr->rkey,
					.dst = wr->ah->addr, .dstlen = wr->ah->addrlen, .gen = gen};
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
		w->segsz = wr_seg_payload(qp, wr);
		switch (wr->opcode) {
		case DGV_WR_SEND:
		case DGV_WR_SEND_SE:
			w->msn = qp->msn_send++;
			break;
		case DGV_WR_READ:
			w->msn = qp->msn_read++;
			break;
		case DGV_WR_WRITE:
		case DGV_WR_WRITE_RECORD:
			w->msn = qp->msn_wrec++;
			break;
		case DGV_WR_SEND_PLAIN:
		case DGV_WR_SEND_INV:    /* RC only: refused above on datagram QPs */
		case DGV_WR_SEND_SE_INV:
			break;
		}
		qp->sq_tail++;
		if (chk > 0) {
			w->all_sent = true;
			sq_complete(qp, idx, (enum dgv_wc_status)chk, 0);
		}
	}
	*bad = wr;
	pump(qp);
	if (inl)
		inline_keep(qp, first);
	soft_qp_unlock(qp);
	return rc;
}

int soft_post_recv(struct dgv_qp *qpb, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad)
{
	struct soft_qp *qp = to_sqp(qpb);
	int rc = 0;
	pthread_mutex_lock(&qp->lock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list)) {
			rc = -EINVAL;
			break;
		}
		if (qp->rq_count == qp->rq_cap) {
			rc = -ENOMEM;
			break;
		}
		uint64_t total = 0;
		bool ok = true;
		for (int i = 0; i < wr->num_sge; i++) {
			total += wr->sg_list[i].length;
			if (soft_mr_check_local(qp->ctx, qp->pd, &wr->sg_list[i], true))
				ok = false;
		}
		if (!ok || total > UINT32_MAX) {
			rc = -EFAULT;
			break;
		}
		struct soft_rwqe *w = soft_rq_at(qp, (qp->rq_head + qp->rq_count) % qp->rq_cap);
		w->wr_id = wr->wr_id;
		w->num_sge = (uint32_t)wr->num_sge;
		w->len = (uint32_t)total;
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
		qp->rq_count++;
	}
	*bad = wr;
	if (qp->rd)
		rd_kick(qp->rd); /* RD segments refused for want of a receive can go now */
	if (qp->rc)
		soft_rc_after_post_recv(qp);
	soft_qp_unlock(qp);
	return rc;
}

int soft_poll_errq(struct dgv_qp *qpb, int n, struct dgv_async_err *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	soft_qp_progress(qp, true, true);
	pthread_mutex_lock(&qp->lock);
	int got = 0;
	while (got < n && qp->errq_count) {
		out[got++] = qp->x->errq[qp->errq_head];
		qp->errq_head = (qp->errq_head + 1) % SOFT_ERRQ;
		qp->errq_count--;
	}
	soft_qp_unlock(qp);
	return got;
}

int soft_qp_stats(struct dgv_qp *qpb, struct dgv_qp_stats *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	pthread_mutex_lock(&qp->lock);
	*out = qp->st;
	out->fault_dropped = qp->x->ftx.dropped + qp->x->frx.dropped;
	out->fault_duplicated = qp->x->ftx.duplicated + qp->x->frx.duplicated;
	out->fault_reordered = qp->x->ftx.reordered + qp->x->frx.reordered;
	out->fault_corrupted = qp->x->ftx.corrupted + qp->x->frx.corrupted;
	if (qp->rd) {
		struct rd_stats r;
		rd_get_stats(qp->rd, &r);
		out->rd_retransmits = r.retransmits;
		out->rd_acks_sent = r.acks_sent;
		out->rd_acks_rcvd = r.acks_rcvd;
		out->rd_ooo_buffered = r.ooo_buffered;
		out->rd_window_stalls += r.window_stalls;
		out->rd_peer_failures = r.peer_failures;
		out->rd_timeouts = r.timeouts;
		out->rd_probes = r.probes;
		out->dup_drops += r.dup_drops;
	}
	soft_qp_unlock(qp);
	return 0;
}

/* dgv_peek on a UD QP: MSG_PEEK of the socket's next datagram into this thread's receive batch
 * (under the QP's lock, as rx_drain uses it), then the same checks a receive makes. A Send behind a
 * message still being reassembled, or one the fault layer would hold, is not looked at: its
 * order against the others is the receive path's to decide. */
int soft_peek(struct dgv_qp *qpb, void *buf, size_t len, struct dgv_peek *out)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (qp->rc || qp->base.type != DGV_QPT_UD)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&qp->lock);
	int rc = -ENOMSG;
	struct rx_batch *b = NULL;
	if (qp->slots_active || qp->frx_on)
		goto out;
	if (!(b = rx_batch_get(qp))) {
		rc = -ENOMEM;
		goto out;
	}
	uint8_t *rxbuf = b->buf;
	union dgv_sockaddr from;
	socklen_t al = sizeof from;
	ssize_t r;
	if (qp->gro) {
		/* a coalesced train: its first datagram is the next one */
		struct iovec v = {rxbuf, qp->rxbuf_size};
		union {
			char buf[RXCTL_LEN];
			struct cmsghdr align;
		} ctl;
		struct msghdr mh = {.msg_name = &from, .msg_namelen = al, .msg_iov = &v, .msg_iovlen = 1,
				    .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
		r = recvmsg(qp->fd, &mh, MSG_PEEK | MSG_DONTWAIT | MSG_TRUNC);
		al = mh.msg_namelen;
		long gso = r >= 0 ? rx_gro_size(&mh) : 0;
		if (gso < 0)
			goto out;
		if (gso && r > gso)
			r = gso;
	} else {
		r = recvfrom(qp->fd, rxbuf, qp->rxbuf_size, MSG_PEEK | MSG_DONTWAIT | MSG_TRUNC, &from.sa, &al);
	}
	if (r < 0) {
		rc = -errno;
		goto out;
	}
	if ((size_t)r > qp->rxbuf_size)
		goto out;
	const uint8_t *p = rxbuf;
	size_t n = (size_t)r;
	if (n < DG_CRC_LEN + 2 || !dg_crc_check(rxbuf, n)) {
		if (!qp->pass_plain || looks_framed(qp, rxbuf, n))
			goto out; /* damaged: the receive path counts and drops it */
		out->framed = 0;
	} else {
		struct dg_seg g;
		struct dg_reject why;
		if (dg_seg_parse(p, n - DG_CRC_LEN, qp->max_msg, &g, &why) || g.tagged ||
		    (g.opcode != RDMAP_SEND && g.opcode != RDMAP_SEND_SE && g.opcode != RDMAP_SEND_INV &&
		     g.opcode != RDMAP_SEND_SE_INV) ||
		    g.mo != 0 || g.plen != g.ml)
			goto out;
		p = g.payload, n = g.plen;
		out->framed = 1;
	}
	out->msg_len = (uint32_t)n;
	out->copied = (uint32_t)(n < len ? n : len);
	if (out->copied)
		memcpy(buf, p, out->copied);
	out->src = from;
	out->src_len = al;
	rc = 0;
out:
	if (b)
		rx_batch_put(b);
	soft_qp_unlock(qp);
	return rc;
}

int soft_qp_peer_gone(struct dgv_qp *qpb, const struct sockaddr *to, socklen_t tolen)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (!qp->rd)
		return -EOPNOTSUPP;
	if (tolen > sizeof(union dgv_sockaddr))
		return -EINVAL;
	union dgv_sockaddr a;
	memcpy(&a, to, tolen);
	pthread_mutex_lock(&qp->lock);
	int r = rd_peer_gone(qp->rd, &a, tolen);
	soft_qp_unlock(qp);
	return r < 0 ? r : 0;
}

int soft_set_rx_cap(struct dgv_qp *qpb, unsigned n)
{
	struct soft_qp *qp = to_sqp(qpb);
	if (qp->rc)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&qp->lock);
	qp->rx_cap = n;
	if (n == 1)
		qp->rx_vlen = 1;
	soft_qp_unlock(qp);
	return 0;
}
