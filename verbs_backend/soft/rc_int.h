/*
 * rc_int.h - what the three parts of the soft RNIC's RC queue pairs share (internal).
 *
 *   rc_cm.c  connection management: channels and events, listeners and requests, the MPA
 *            Request/Reply exchange, connect/accept/reject, progress, disconnect and teardown
 *            (rc_fail, rc_closed);
 *   rc_tx.c  transmission: the send queue, Read Responses, RTR and Terminate cut into FPDUs
 *            and gathered into one sendmsg per batch, send completions;
 *   rc_rx.c  reception: the stream buffer, FPDU framing (length, markers, CRC), then one
 *            handler per RDMAP opcode; receive completions.
 *
 * An RC QP is a struct soft_qp (rings, CQs, lock, stats, error queue, ORD/IRD tables of qp.c)
 * with qp->rc pointing at the struct rc_conn below, so CQ-driven progress, the libev thread and
 * dgv_cq_wait apply unchanged; soft_qp_progress() comes to rc_cm.c for RC QPs.
 *
 * Locks: everything about a QP runs under qp->lock; every function declared here needs it
 * unless its comment says otherwise. Listeners and pending requests are under cm->lock. A
 * channel's queue is under ch->lock, the innermost lock (events are queued with a QP or cm->lock
 * held). Order: ctx->loop_lock -> cm->lock -> qp->lock -> cq->lock / ch->lock.
 *
 * Data path: no allocation, no formatting, no global lock. Transmission gathers several FPDUs
 * into one sendmsg (headers and trailers from a per-QP staging area, payload straight from the
 * registered buffers); reception reads large chunks into a per-QP stream buffer and parses
 * FPDUs from it. Adopted descriptors are never made non-blocking and never closed: every call
 * passes MSG_DONTWAIT and waits with poll().
 */
#ifndef DG_SOFT_RC_INT_H
#define DG_SOFT_RC_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "frame.h"
#include "mpa.h"
#include "soft.h"


#define RC_DEFAULT_WR 256
#define RC_DEFAULT_MAX_MSG (16u << 20)
#define RC_TIMEOUT_MS 10000
#define RC_TERM_FPDU 128u          /* a Terminate FPDU's room (rc->term_fpdu) */
#define RC_RXBUF (256u << 10)     /* stream receive buffer */
#define RC_RX_ROOM (72u << 10)    /* free room kept at the tail: one largest FPDU with markers */
#define RC_IOV 256                /* iovec entries of one transmit batch */
#define RC_FPDUS 64               /* FPDUs in one transmit batch */
#define RC_HBUF 8192              /* staging for headers and trailers of one batch */
#define RC_BATCH_BYTES (1u << 20)
#define RC_FLAT (70u << 10)       /* one FPDU without or with markers */
#define RC_FLAT_SEND 1536u        /* rc_send_some: a batch up to this is sent copied whole */
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
	uint32_t idx;   /* SQ position (FP_SQ_DONE: soft_sq_at), IRD index (FP_IRD_DONE) */
};

/* One transmit batch's vectors and staging: held by a connection only while a batch is being
 * built or is on its way into TCP (rc_tx_pump gives it back, to a small per-thread cache):
 * an idle connection holds none (issue 14: memory per idle connection; inside rc_conn they
 * were a page of every connection's RSS). */
struct rc_batch {
	struct iovec iov[RC_IOV];
	struct rc_fp fp[RC_FPDUS];
	uint8_t hbuf[RC_HBUF];
};

/* What a connection needs only while it sets up: the private data it sends and its MPA Request
 * or Reply (1 kB; kept in the connection they made it 1.7 kB for its whole life, issue 14). */
struct rc_hs {
	uint8_t pdata[MPA_MAX_PDATA];
	uint8_t mpa_out[MPA_RR_MAX];
};

struct rc_conn {
	struct soft_qp *qp;
	/* cm->conns, and its channel's (cm_drive looks at one channel's: a process with 10 000
	 * connections walked them all at every connection event look); both under cm->lock */
	struct rc_conn *next, **pprev, *ch_next, **ch_pprev;
	struct soft_cm_channel *ch;
	void *user;
	bool active;
	enum rc_phase phase;
	enum dgv_qp_state state;
	uint64_t deadline_us;
	int pending_err;        /* an error found before the first progress (connect) */
	/* rx_app: TCP refused our bytes with this error (the peer reset: a write to a closed
	 * socket). The connection fails at the program's next progress, once it has read what
	 * the peer sent before its reset (TCP keeps it readable; the provider's thread used to
	 * have read it already) */
	int tx_err;
	/* what this side asks for */
	uint8_t want_rev;
	bool want_crc, want_markers;
	uint16_t want_ird, want_ord;
	uint16_t pd_len;
	/* our private data and MPA frame: only until the frame is all in TCP (mpa_send frees it) */
	struct rc_hs *hs;
	/* negotiated */
	struct dgv_conn_info info;
	bool p2p;
	enum rtr_kind rtr;
	bool rtr_pending;       /* initiator: RTR to send first */
	bool rtr_read_wait;     /* initiator: zero-length Read Response of a Read RTR expected */
	bool hold_first;        /* responder without peer-to-peer mode: no FPDU out before the
				 * initiator's first FPDU has arrived (RFC 5044 section 7.1.2) */
	uint32_t mulpdu, rx_max_ulpdu;
	/* MPA frame on the way out (hs->mpa_out) */
	uint32_t mpa_out_len, mpa_out_sent;
	/* transmit batch (its arrays: at the end) */
	int niov, iov_idx;
	uint64_t b_bytes, b_sent;
	uint32_t nfp, fp_done;
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
	/* its FPDU: made by the first Terminate (128 bytes in every connection's state before;
	 * issue 14), freed with the connection */
	uint8_t *term_fpdu;
	uint32_t term_len;
	uint8_t *spill;         /* rest of a half-sent FPDU when the connection fails */
	/* receive */
	uint8_t *rxb;           /* while bytes wait in it (dg_spare_get), else NULL */
	uint32_t rx_start, rx_end;
	uint64_t rx_pos;        /* FPDU stream position of rxb[rx_start] */
	uint8_t *rx_flat;
	uint32_t exp_msn[3];
	bool rcv_active;        /* a Send is being received into rcv */
	/* the receive it fills: made by the first Send received (144 bytes of every connection's
	 * state before, issue 14: a carried stream receives none), freed with the connection */
	struct soft_rwqe *rcv;
	uint32_t rcv_off, rcv_msn;
	uint8_t rcv_op;
	uint32_t rcv_inv;
	bool t_active;          /* a tagged message (Write, Write-Record) is being placed */
	uint8_t t_op;
	uint32_t t_stag, t_len;
	uint64_t t_base, t_next;
	bool fd_watched; /* accepted: its request's libev watcher watched the descriptor (device.c
			  * soft_ctx_remove_qp takes it out of libev's set before the close) */
	bool rx_paused, eof, want_close, wr_closed, peer_closed_told, ended, established;
	uint8_t term_l, term_t, term_c;
	struct rc_batch *bt;    /* while a batch is built or sent (rc_tx.c batch_get), else NULL */
};

/* ---- rc_cm.c: connection management and teardown */

/* Queues a connection event about qp on its channel (copied; pdata may be NULL). */
void rc_event(struct soft_qp *qp, enum dgv_cm_event_type type, int status, const uint8_t *pdata,
	      uint16_t pdlen);
/* Records an RFC error triple in the QP's error queue (the oldest is dropped when full). */
void rc_errq_put(struct soft_qp *qp, uint8_t l, uint8_t t, uint8_t c, bool remote, uint8_t opcode,
		 uint32_t msn, uint32_t stag, uint64_t to, uint32_t len);
/* Completes every outstanding work request with WR_FLUSH_ERR (first_status: see rc_cm.c). */
void rc_flush_all(struct soft_qp *qp, enum dgv_wc_status first_status);
/* The connection is over in order: both directions closed. */
void rc_closed(struct soft_qp *qp);
/* Ends the connection with an error, optionally with a Terminate first (see rc_cm.c). */
void rc_fail(struct soft_qp *qp, int err, const struct dg_reject *why, bool send_term, const uint8_t *off_hdr,
	     uint32_t off_hlen, uint32_t seg_len);
/* ESTABLISHED: posted work requests start flowing; the event carries pdata. */
void rc_become_rts(struct soft_qp *qp, const uint8_t *pdata, uint16_t pdlen);

/* ---- rc_tx.c: transmission */

/* Marks the send WQE at position pos (soft_sq_at) done with status st; completions are pushed
 * in posting order. */
void rc_sq_done(struct soft_qp *qp, uint32_t pos, enum dgv_wc_status st, uint32_t bytes);
/* An empty small send queue is given back (dgv_qp_discard of an idle connection: 480 bytes of
 * its resident memory); the next post that queues makes it again (qp->sq NULL meanwhile, sq_cap
 * kept). Needs qp->lock, an empty queue and no batch or message under way (soft_qp_discard's
 * checks: it resets the queue's positions). */
void rc_sq_release(struct soft_qp *qp);
/* Forgets the transmit batch (nothing of it will be sent). */
void rc_batch_reset(struct rc_conn *rc);
/* Sends what it can of iov[0..n) with MSG_DONTWAIT. Returns the bytes taken (> 0), 0 when TCP
 * is full (qp->pump_blocked set: wait for POLLOUT), or -errno. */
ssize_t rc_send_some(struct soft_qp *qp, const struct iovec *iov, int n);
/* Transmits what is queued. Returns > 0 if something went out. */
int rc_tx_pump(struct soft_qp *qp);
/* Whether rc_tx_pump has something to send without news from the peer (queued work requests,
 * a batch under way, Read Responses, a Terminate, the close). qp->lock held. */
static inline bool rc_tx_owed(const struct soft_qp *qp)
{
	const struct rc_conn *rc = qp->rc;
	return rc->b_bytes || rc->term_pending || qp->sq_pump != qp->sq_tail || rc->ird_unbuilt || rc->rtr_pending ||
	       rc->want_close || rc->cur;
}
/* Replaces the batch by the rest of the FPDU half on the wire, then a Terminate carrying why
 * and (off_hdr, off_hlen) the offending DDP and RDMAP headers; our direction is shut after it. */
void rc_tx_terminate(struct soft_qp *qp, const struct dg_reject *why, const uint8_t *off_hdr,
		     uint32_t off_hlen, uint32_t seg_len);

/* ---- rc_rx.c: reception */

/* Pushes the receive completion of w. */
void rc_recv_done(struct soft_qp *qp, const struct soft_rwqe *w, enum dgv_wc_status st, uint32_t len,
		  uint32_t msn, unsigned flags, uint32_t inv);
/* Reads the socket into the stream buffer and handles the FPDUs. Returns > 0 if it did
 * something. */
int rc_rx_pump(struct soft_qp *qp);

#endif /* DG_SOFT_RC_INT_H */
