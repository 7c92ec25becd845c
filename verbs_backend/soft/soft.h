/*
 * soft.h - internal structures of the software datagram-iWARP RNIC.
 *
 * Locking (outermost first): ctx->loop_lock (libev loop, QP list) -> qp->lock -> cq->lock.
 * ctx->mr_lock only serialises registration; placement looks MRs up without it (mr.c).
 * The app thread and the libev thread both make progress on a QP, whichever holds qp->lock.
 */
#ifndef DG_SOFT_H
#define DG_SOFT_H

#include <errno.h>
#include <ev.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "fault.h"
#include "frame.h"
#include "provider.h"
#include "rd.h"

/* 65 536 regions per context: a carried TCP connection registers two (its receive ring, its send
 * side), and a process holds 10 000 connections (SIPp -t tn; at 16 384 slots the 8 192nd
 * connection found none and went plain) */
#define SOFT_MR_SLOTS (1u << 16)
#define SOFT_MR_INDEX(stag) (((stag) >> 8) & (SOFT_MR_SLOTS - 1))
#define SOFT_MAX_SGE 8
/* Bytes of receive queue a QP holds inside itself (rq_inline): 32 entries of 4 SGEs. */
#define SOFT_RQ_INLINE 2560
#define SOFT_SQ_INLINE (40 * 240) /* 40 send queue entries (struct soft_swqe) */
/* An RC QP's queues of at most this many bytes are small objects (dg_small_alloc): a stream's
 * 4 receives of 2 SGEs (192 bytes) and its first send queue, SOFT_RC_SQ_SMALL entries */
#define SOFT_Q_SMALL 512
#define SOFT_REASM_SLOTS 64
#define SOFT_MAX_ORD 16
#define SOFT_MAX_IRD 64 /* > SOFT_MAX_ORD: one requester cannot overflow it */
#define SOFT_ERRQ 64
#define SOFT_RX_BATCH 16
#define SOFT_APP_IDLE_TICKS 2 /* app silent this many 1 ms ticks: the libev thread watches the socket */
#define SOFT_TICK_IDLE_S 1.0  /* the tick's pace while no QP needs it (a backstop: work wakes it) */

struct soft_qp;

struct soft_ctx {
	struct dgv_context base;
	enum dgv_progress_mode progress;
	/* memory regions: type-stable slots, never freed before the context */
	pthread_mutex_t mr_lock;
	struct soft_mr *_Atomic mrs[SOFT_MR_SLOTS];
	uint32_t mr_count;
	struct soft_mr *mr_free; /* deregistered, kept in their slots: reused first (mr_lock) */
	uint32_t mr_next;        /* where the search for a never-used slot starts (mr_lock) */
	/* async progress */
	pthread_mutex_t loop_lock;
	struct ev_loop *loop;
	int loop_epfd;       /* libev's epoll descriptor (loop_epoll_fd), or -1 */
	ev_async wake;
	ev_timer tick;
	pthread_t thread;
	bool thread_running;
	atomic_bool stopping;
	/* The tick sleeps (SOFT_TICK_IDLE_S) while no QP needs it (soft_qp_needs_tick): an idle
	 * process, or one whose sockets the program alone reads, is not woken 200 times a second
	 * (that wake-up on the receiver's CPU cost a loopback UDP stream's sender 10 %). Set by the
	 * thread at each tick's start, cleared by whoever gives a QP work (soft_tick_need). */
	atomic_bool tick_idle;
	struct soft_qp *qps; /* list, under loop_lock */
	struct rc_cm *cm;    /* RC connection management (rc_cm.c) */
};

struct soft_pd {
	struct dgv_pd base;
	atomic_int refs;
};

struct soft_mr {
	struct dgv_mr pub;
	_Atomic uint32_t stag; /* 0 while the slot is free */
	atomic_uint users;     /* placements in progress */
	uint32_t index;
	/* RC Send with Invalidate: the STag that was invalidated for remote access (a new
	 * registration of the slot has a new STag, so a stale value never matches) */
	_Atomic uint32_t invalid_stag;
	struct soft_mr *next_free; /* on ctx->mr_free while deregistered (mr_lock) */
};

struct soft_cqe {
	struct dgv_wc wc;
	struct soft_slot *slot;   /* record whose ranges are made at poll time, or NULL */
	struct dgv_range range;   /* the single range of a one-segment record */
};

#define SOFT_CQ_MAX_QPS 64

struct soft_cq {
	struct dgv_cq base;
	pthread_mutex_t lock;
	struct soft_cqe *ring;
	uint32_t cap, head, count; /* count: changed under lock by atomic stores, peeked without */
	uint32_t phys;            /* entries the ring has now (<= cap: cq.c ring_grow) */
	_Atomic int efd;          /* -1 until soft_cq_fd makes it */
	atomic_int armed;         /* 1 any, 2 solicited only */
	const void *armer;        /* the thread that armed it (cq_armer_many: several); lock */
	bool deferred;            /* the armer's own progress fired the arm inside its poll; lock */
	atomic_int waiters;       /* threads blocked in cq_wait */
	atomic_bool bg_notify;    /* dgv_cq_notify_background */
	atomic_bool kicked;       /* the eventfd may be readable (cq.c soft_cq_ack_event) */
	atomic_int pollers;       /* threads inside cq_progress (detach waits for 0) */
	/* QPs feeding this CQ (progress is driven from poll): qps_inline, or SOFT_CQ_MAX_QPS
	 * entries made when a fifth attaches (a socket's CQ has one or two; 64 inline were half a
	 * kilobyte of every UDP socket's heap). Read lock-free by cq_progress: the pointer changes
	 * once, the inline entries stay as they were. */
	struct soft_qp **qps;
	struct soft_qp *qps_inline[4];
	uint32_t nqps;
	/* ranges handed out by the last poll: scratch_in until a poll found it short (a burst of
	 * records; scratch_short), then a buffer of the heap, doubled up to 64 (a 64-entry buffer
	 * on the first record was half a kilobyte of the program's heap per connection) */
	struct dgv_range *scratch;
	uint32_t scratch_cap;
	bool scratch_short;
	struct dgv_range scratch_in[4];
};

struct soft_ah {
	struct dgv_ah base;
	struct soft_pd *pd;
	/* UDP payload bytes per datagram that the route to base.addr carries unfragmented (its
	 * MTU less the IP and UDP headers, at most 65507), 0 when unknown: a QP that segments by
	 * the path (soft_qp.seg_path) cuts messages to this destination so */
	uint32_t path_seg;
};

/* A send work request as queued. */
struct soft_swqe {
	uint64_t wr_id;
	enum dgv_wr_opcode opcode;
	unsigned flags;
	uint32_t num_sge;
	struct dgv_sge sge[SOFT_MAX_SGE];
	uint32_t len;   /* total payload */
	uint32_t sent;  /* bytes handed to the LLP so far */
	uint32_t msn;
	uint32_t segsz;
	uint64_t remote_addr;
	uint32_t rkey;
	union dgv_sockaddr dst;
	socklen_t dstlen;
	uint32_t gen;   /* distinguishes reuse of the ring entry in RD cookies */
	bool all_sent;  /* every datagram handed down */
	bool done;      /* completed (CQE made or suppressed), entry reusable once head passes */
	bool read_ord;  /* READ waiting in the ORD table */
	uint32_t inv_stag;  /* RC: SEND_INV, SEND_SE_INV */
	uint8_t *ibuf;      /* DGV_SEND_INLINE: the payload, copied when the post could not send
			     * it all (sge[0] then names it); freed when the entry completes */
	uint8_t rc_status;  /* RC: enum dgv_wc_status once done (completions are made in order) */
	uint32_t rc_bytes;
};

_Static_assert(40 * sizeof(struct soft_swqe) <= SOFT_SQ_INLINE, "a socket's send queue fits in the QP");
/* An RC queue pair's first send queue: the largest power of two of entries that fits sq_inline
 * (a power of two: positions wrap at 2^32 onto the same entries) */
#define SOFT_RC_SQ_FIRST 32u
_Static_assert(SOFT_RC_SQ_FIRST * sizeof(struct soft_swqe) <= SOFT_SQ_INLINE, "an RC QP's first send queue fits");
/* ...and before that, a small object of 2 entries (a power of two too): a connection that
 * queues a message or two at a time (a stream's hello while the responder waits for the
 * initiator's first FPDU, a reply behind another) writes no page of the QP's rest for them */
#define SOFT_RC_SQ_SMALL 2u
_Static_assert(SOFT_RC_SQ_SMALL * sizeof(struct soft_swqe) <= SOFT_Q_SMALL, "an RC QP's small send queue fits");

struct soft_rdpend {
	uint64_t wr_id;
	uint32_t len, msn;
	uint32_t gen;      /* distinguishes reuse of the entry in RD cookies */
	uint32_t next;     /* free list */
	uint8_t opcode;    /* enum dgv_wr_opcode */
	bool signaled;
	bool used;
};

struct soft_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t len;
	struct dgv_sge sge[SOFT_MAX_SGE];
};

enum slot_kind { SLOT_FREE = 0, SLOT_SEND, SLOT_DISCARD, SLOT_WREC, SLOT_READ };

/* Reassembly of one multi-datagram message (or a finished one waiting for older ones). */
struct soft_slot {
	enum slot_kind kind;
	atomic_bool in_cq;       /* a CQE references it; the CQ releases it after making ranges */
	bool done;               /* complete, waiting for older messages of the same source */
	union dgv_sockaddr src;
	socklen_t srclen;
	uint32_t msn, ml, segsz, nsegs, got_segs, got_bytes;
	uint32_t stag;
	uint64_t base;
	uint64_t deadline_us;
	struct soft_rwqe wqe;    /* SLOT_SEND: the receive it fills */
	uint32_t ord;            /* SLOT_READ: ORD index */
	uint8_t *bitmap;         /* nsegs bits; allocated on first use, kept */
	uint32_t bitmap_cap;     /* bytes */
	bool solicited;
};

/* An outstanding RDMA Read (requester side). */
struct soft_ord {
	bool used;
	uint32_t sq_idx;
	uint32_t msn;
	uint32_t stag;  /* local sink */
	uint64_t to;
	uint32_t len;
	uint32_t got;   /* RD: bytes arrived in order */
	uint64_t deadline_us; /* UD: give up */
	int slot;       /* UD: reassembly slot or -1 */
	union dgv_sockaddr peer;
	socklen_t peerlen;
};

/* A Read Response still to send (responder side). */
struct soft_ird {
	bool used;
	union dgv_sockaddr peer;
	socklen_t peerlen;
	uint32_t msn;
	uint32_t src_stag, sink_stag;
	uint64_t src_to, sink_to;
	uint32_t len, sent, segsz;
};

struct soft_qp {
	struct dgv_qp base;
	struct soft_ctx *ctx;
	struct soft_pd *pd;
	struct soft_cq *scq, *rcq;
	struct soft_qp *next; /* ctx list */
	pthread_mutex_t lock;
	atomic_int refs;      /* progress callers outside qp->lock (cq poll snapshots) */
	int fd;
	bool own_fd;
	union dgv_sockaddr local;
	socklen_t locallen;
	union dgv_sockaddr peer;   /* the adopted socket's connect()ed peer, if has_peer */
	bool has_peer;
	uint32_t max_msg;
	uint32_t seg_size;     /* UDP payload per datagram, everything included */
	bool seg_path;         /* UD, seg_size not given, pass_plain: cut at each route's MTU */
	uint32_t reasm_us;
	uint32_t max_sge;
	bool rx_hold;          /* UD: do not drain the socket while no receive is posted */
	bool rx_single;        /* UD: the last Send received was one datagram (rx_drain_into) */
	/* RC (attr rx_hold): only the program's calls read the connection's socket; the thread
	 * only writes for it (what TCP refused, the MPA Request once TCP is up), so every
	 * completion and connection event comes from the program's calls until TCP refuses a send
	 * (tx_refused, stored atomically): soft_qp_self_driven */
	bool rx_app;
	bool tx_refused;
	bool tcp_wait; /* rx_app: TCP's connect not through yet (the thread's part); atomic */
	/* RC: a caller reads the socket itself now (dgv_qp_rx_claim .. dgv_qp_rx_stream_feed);
	 * nobody else reads it meanwhile. Under lock; read atomically by the progress thread. */
	bool rx_claimed;
	bool pass_plain;       /* hand non-datagram-iWARP datagrams up (dgv_qp_init_attr) */
	/* send queue */
	struct soft_swqe *sq;
	uint32_t sq_cap, sq_head, sq_pump, sq_tail; /* head: oldest not done; pump: next to send */
	/* RC: the queue starts as a small object (SOFT_RC_SQ_SMALL entries), grows into sq_inline
	 * (SOFT_RC_SQ_FIRST) and then to sq_max entries as posts find it full (rc_tx.c sq_grow);
	 * sq_cap is its size now; sq is NULL while an idle connection gave the small one back
	 * (rc_tx.c rc_sq_release). An idle
	 * connection's queue then shares the QP's first page instead of writing a page of its own
	 * (issue 14: 4 kB of every carried TCP connection). Elsewhere sq_max == sq_cap. */
	uint32_t sq_max;
	/* RD: sends wholly handed to the RD layer wait for their ack here, not in the ring, so a
	 * peer that stopped answering (seconds until its retries run out) does not hold the
	 * ring's head and with it every later send (qp.c park_rd) */
	struct soft_rdpend *rdpend;
	uint32_t rdpend_cap, rdpend_free;
	uint32_t msn_send, msn_read, msn_wrec, msn_term;
	/* receive queue (deque: a failed message gives its WQE back at the front) */
	struct soft_rwqe *rq;
	uint32_t rq_cap, rq_head, rq_count;
	uint32_t slots_active;
	uint32_t slot_hint;     /* index of the slot used last */
	uint64_t last_scan_us;  /* last deadline scan */
	uint64_t now_us;        /* clock of the current progress pass, 0 until read (qp_now) */
	uint32_t ord_count;     /* ORD entries in use */
	uint32_t ird_count;
	/* errors (errq: at the end) */
	uint32_t errq_head, errq_count;
	uint64_t term_window_start;
	uint32_t term_in_window;
	/* lower layers */
	struct rd_ep *rd;
	/* fault injection on (DGSHIM_FAULT_TX/RX, dgv_qp_init_attr): its state is in the rest
	 * (qp->x), 304 bytes an RC QP's fields no longer carry */
	bool ftx_on, frx_on;
	/* receive buffers: the reading thread's batch (qp.c rx_batch_get) of rx_batch buffers of
	 * rxbuf_size bytes */
	uint32_t rxbuf_size, rx_batch;
	uint32_t rx_cap;       /* dgv_qp_set_rx_cap: datagrams per progress round (0: no cap) */
	uint32_t rx_vlen;      /* 1: one recvmsg per call; rx_batch: recvmmsg batches */
	uint32_t rx_streak;    /* successful single reads in a row */
	/* UDP GSO and GRO (qp.c "UDP GSO/GRO"): gso_off once DGSHIM_UDP_GSO=off or the kernel
	 * refused a UDP_SEGMENT send; gro: UDP_GRO is on (own sockets only), and each receive
	 * buffer of the batch comes with a control message (the segment size of a train) */
	bool gso_off;
	bool gro;
	/* progress coordination with the libev thread */
	atomic_uint app_polls;      /* bumped by every application progress call */
	uint32_t seen_polls;        /* loop thread: app_polls at its last tick */
	uint32_t quiet_ticks;       /* loop thread: ticks since app_polls last moved */
	atomic_int app_waiting;     /* application blocked in cq_wait on this QP's socket */
	bool io_on;                 /* libev io watcher started (loop thread only) */
	bool io_used;               /* it was started once: libev may hold its descriptor (lazily) */
	ev_io io;
	bool pump_blocked;          /* UDP socket full: need POLLOUT (stored atomically: read unlocked) */
	/* qp.c soft_qp_test_tx_cap (tests): the socket takes at most this many bytes of the next
	 * send (RC: TCP; UD: nothing, a datagram is whole or not at all), then is full
	 * (UINT32_MAX) until the hook is cleared (0) */
	uint32_t tx_test_cap;
	struct rc_conn *rc;         /* RC QPs: the connection (rc_int.h); NULL on UD/RD */
	struct dgv_qp_stats st;
	/* The rest of the QP (struct soft_qp_ext). A UD or RD QP's follows these fields in the same
	 * zeroed pages (soft_qp_alloc), so its receive queue shares their page; an RC QP's fields
	 * are a small object, three or so to a page, and its rest pages of their own that a
	 * connection which only sends at once and receives into its stream ring never writes (a
	 * page less per carried TCP connection end: issue 14 item 2) */
	struct soft_qp_ext *x;
	bool x_apart;
};

/* What a QP holds besides its fields, in the order an idle one writes it. */
struct soft_qp_ext {
	/* The receive queue when it fits here (a socket's 32 entries of 80 bytes, soft_rq_stride):
	 * on the page the QP's fields are on, which an idle QP writes anyway, instead of a page
	 * of its own (4 kB of every idle UDP socket) */
	_Alignas(16) uint8_t rq_inline[SOFT_RQ_INLINE];
	/* The send queue when it fits here (a socket's 40 entries, soft_sq_alloc), right after the
	 * receive queue: its first entries share the page above, and an emptied queue starts again
	 * at entry 0, so a socket that sends a datagram at a time writes no page of its own for it
	 * (4 kB of every socket that sent; an idle one writes none of it) */
	_Alignas(16) uint8_t sq_inline[SOFT_SQ_INLINE];
	/* Last, after everything an idle QP writes: zeroed pages (dg_zalloc), and these arrays
	 * (25 kB) are written only by multi-segment messages, Reads and errors, so an idle QP's
	 * resident memory is the page or two of the fields above (in the middle of the object they
	 * made it 3-4 pages: 12-16 kB per socket) */
	struct soft_slot slots[SOFT_REASM_SLOTS];
	struct soft_ord ord[SOFT_MAX_ORD];
	struct soft_ird ird[SOFT_MAX_IRD];
	struct dgv_async_err errq[SOFT_ERRQ];
	struct dg_fault_state ftx, frx; /* UD and RD: written when fault injection is on */
};

/* A new QP, zeroed: its fields and its rest (qp->x), apart for RC (see x_apart). NULL: out of
 * memory. soft_qp_release gives both back. */
struct soft_qp *soft_qp_alloc(bool rc);
void soft_qp_release(struct soft_qp *qp);

/* The receive queue's entries hold the QP's max_sge SGEs, not SOFT_MAX_SGE: with the default 4
 * an entry is 80 bytes instead of 144, and the 32 receives a socket posts when it is made fit
 * one page instead of two. Bytes per entry: */
static inline size_t soft_rq_stride(uint32_t max_sge)
{
	return offsetof(struct soft_rwqe, sge) + (size_t)max_sge * sizeof(struct dgv_sge);
}

/* Entry i of the receive queue: only its first num_sge SGEs exist (copy with soft_rwqe_put). */
static inline struct soft_rwqe *soft_rq_at(struct soft_qp *qp, uint32_t i)
{
	return (struct soft_rwqe *)((uint8_t *)qp->rq + (size_t)i * soft_rq_stride(qp->max_sge));
}

/* Copies a receive WQE: its fields and its num_sge SGEs, never the rest of a full one. */
static inline void soft_rwqe_put(struct soft_rwqe *dst, const struct soft_rwqe *w)
{
	dst->wr_id = w->wr_id;
	dst->num_sge = w->num_sge;
	dst->len = w->len;
	if (w->num_sge)
		memcpy(dst->sge, w->sge, (size_t)w->num_sge * sizeof *w->sge);
}

/* Takes the oldest posted receive into *out. Returns false if none. Needs qp->lock. */
static inline bool soft_rq_pop(struct soft_qp *qp, struct soft_rwqe *out)
{
	if (!qp->rq_count)
		return false;
	soft_rwqe_put(out, soft_rq_at(qp, qp->rq_head));
	qp->rq_head = (qp->rq_head + 1) % qp->rq_cap;
	qp->rq_count--;
	return true;
}

static inline struct soft_ctx *to_sctx(struct dgv_context *c) { return (struct soft_ctx *)c; }
static inline struct soft_pd *to_spd(struct dgv_pd *p) { return (struct soft_pd *)p; }
static inline struct soft_cq *to_scq(struct dgv_cq *c) { return (struct soft_cq *)c; }
static inline struct soft_qp *to_sqp(struct dgv_qp *q) { return (struct soft_qp *)q; }
static inline struct soft_mr *to_smr(struct dgv_mr *m) { return (struct soft_mr *)m; }

/* Zeroed memory for rings and buffers. Large ones come straight from mmap, so the pages a QP
 * never uses (most of a 256-entry ring for a socket that sends a few datagrams, the receive
 * batch of a QP that never sees a burst) cost no memory: thousands of QPs stay cheap.
 * dg_pages_free needs the size given to dg_pages_alloc. */
void *dg_pages_alloc(size_t size);
void dg_pages_free(void *p, size_t size);
/* Buffers a connection needs only while bytes are in them (an RC stream's receive buffer, its
 * transmit batch), from a cache of DG_SPARES of each kind per thread: getting and giving back
 * costs no system call, and an idle connection holds none. dg_spare_get: a buffer of size
 * bytes (the same size for every call of a kind), not zeroed, or NULL (out of memory);
 * dg_spare_put: b back (NULL: nothing), to the caller's cache or the system. A thread's cache
 * goes back to the system when it exits. No lock: the cache is the calling thread's. */
enum { DG_SPARE_RC_RXBUF, DG_SPARE_RC_BATCH, DG_SPARE_KINDS };
#define DG_SPARES 2
void *dg_spare_get(unsigned kind, size_t size);
void dg_spare_put(unsigned kind, void *b, size_t size);
/* zpages.c: a zeroed object whose pages cost resident memory only once written (per-QP state
 * of which an idle QP touches little); dg_zfree needs the size given to dg_zalloc. NULL: out
 * of memory. */
void *dg_zalloc(size_t size);
void dg_zfree(void *p, size_t size);

/* Zeroed objects of at most DG_SMALL_MAX bytes packed into pages of zpages.c's chunks (not the
 * program's heap); dg_small_free needs the size given to dg_small_alloc. NULL: out of memory
 * or too large. Free objects are kept by size for reuse, never returned to the system. */
#define DG_SMALL_MAX 2048
void *dg_small_alloc(size_t size);
void dg_small_free(void *p, size_t size);

/* Zeroed memory for one of qp's queues, n bytes: a small object for an RC QP's small queue,
 * else the QP's own area `in` (room bytes) when it fits, else zeroed pages. NULL: out of
 * memory. soft_q_free takes the same n and `in`. */
static inline void *soft_q_alloc(struct soft_qp *qp, size_t n, uint8_t *in, size_t room)
{
	if (qp->x_apart && n <= SOFT_Q_SMALL)
		return dg_small_alloc(n);
	return n <= room ? (void *)in : dg_zalloc(n);
}
static inline void soft_q_free(struct soft_qp *qp, void *q, size_t n, uint8_t *in)
{
	if (!q || q == (void *)in)
		return;
	if (qp->x_apart && n <= SOFT_Q_SMALL)
		dg_small_free(q, n);
	else
		dg_zfree(q, n);
}

/* Makes qp's receive queue for rq_cap entries of max_sge SGEs (both set): inside the QP when it
 * fits (rq_inline), else zeroed pages. Returns 0 or -ENOMEM. */
static inline int soft_rq_alloc(struct soft_qp *qp)
{
	qp->rq = soft_q_alloc(qp, (size_t)qp->rq_cap * soft_rq_stride(qp->max_sge), qp->x->rq_inline,
			      sizeof qp->x->rq_inline);
	return qp->rq ? 0 : -ENOMEM;
}

static inline void soft_rq_free(struct soft_qp *qp)
{
	soft_q_free(qp, qp->rq, (size_t)qp->rq_cap * soft_rq_stride(qp->max_sge), qp->x->rq_inline);
	qp->rq = NULL;
}

/* The send queue of sq_cap entries: inside the QP object when it fits (sq_inline), else zeroed
 * pages of its own. Returns 0 or -ENOMEM. */
static inline int soft_sq_alloc(struct soft_qp *qp)
{
	qp->sq = soft_q_alloc(qp, (size_t)qp->sq_cap * sizeof *qp->sq, qp->x->sq_inline, sizeof qp->x->sq_inline);
	return qp->sq ? 0 : -ENOMEM;
}

static inline void soft_sq_free(struct soft_qp *qp)
{
	soft_q_free(qp, qp->sq, (size_t)qp->sq_cap * sizeof *qp->sq, qp->x->sq_inline);
	qp->sq = NULL;
}

/* The send queue entry at position i (sq_head .. sq_tail count on without wrapping; the entry
 * is at i modulo the queue's size now). RC code names entries by position, never by array
 * index, so that a queue that grew (sq_cap changed) still finds them. Needs qp->lock. */
static inline struct soft_swqe *soft_sq_at(struct soft_qp *qp, uint32_t i)
{
	return &qp->sq[i % qp->sq_cap];
}

/* mr.c */
int soft_reg_mr(struct dgv_pd *pd, void *addr, size_t len, unsigned access, struct dgv_mr **out);
int soft_dereg_mr(struct dgv_mr *mr);
/* Finds stag for a remote access [to, to+len) needing `access` from pd. Returns the MR with a
 * user reference (drop it with soft_mr_put) or NULL with *why set to the RFC error. */
struct soft_mr *soft_mr_get_remote(struct soft_ctx *ctx, struct soft_pd *pd, uint32_t stag,
				   uint64_t to, uint64_t len, unsigned access, struct dg_reject *why);
/* Checks a local SGE (lkey, bounds, and local write when need_write). Returns 0 or -EFAULT. */
int soft_mr_check_local(struct soft_ctx *ctx, struct soft_pd *pd, const struct dgv_sge *sge,
			bool need_write);
/* The MR of a local SGE, held (put it after the access), or NULL if it is no longer valid. */
struct soft_mr *soft_mr_get_local(struct soft_ctx *ctx, struct soft_pd *pd, const struct dgv_sge *sge,
				  bool need_write);
static inline void soft_mr_put(struct soft_mr *mr) { atomic_fetch_sub(&mr->users, 1); }

/* Fills iov (at most max entries) with the pieces of an SGE list covering message bytes
 * [off, off+len). Returns the count. Used by UD/RD and RC transmit paths alike. */
int soft_sge_iov(const struct dgv_sge *sge, uint32_t nsge, uint32_t off, uint32_t len, struct iovec *iov,
		 int max);
/* Copies len bytes into the receive WQE's buffers at message offset off, holding each region
 * while it writes. Returns 0, or -EFAULT if a region was deregistered since the post (nothing
 * more is written). */
int soft_rwqe_copy(struct soft_qp *qp, const struct soft_rwqe *w, uint32_t off, const uint8_t *src,
		   uint32_t len);
void soft_mr_table_fini(struct soft_ctx *ctx);

/* cq.c */
int soft_create_cq(struct dgv_context *ctx, int cqe, struct dgv_cq **out);
int soft_destroy_cq(struct dgv_cq *cq);
int soft_cq_fd(struct dgv_cq *cq);
int soft_cq_self_driven(struct dgv_cq *cq);
/* The eventfd a waiter on cq needs besides its QPs' sockets: -1 when none was made and every
 * QP on it is self-driven, or it has none yet (what comes then is made by the waiter's own
 * calls: a request read by cm_drive); else the eventfd, made now (or -errno). */
int soft_cq_wait_fd(struct soft_cq *cq);
/* Whether every completion of qp that a program waits for is made inside the program's own
 * calls (dgv_cq_self_driven). Needs the CQ's lock (reads fields fixed at creation). */
bool soft_qp_self_driven(const struct soft_qp *qp);
int soft_req_notify_cq(struct dgv_cq *cq, int solicited_only);
int soft_cq_ack_event(struct dgv_cq *cq);
int soft_cq_notify_background(struct dgv_cq *cq, int on);
int soft_cq_ready(struct dgv_cq *cq);
/* True in the provider's own progress thread. */
extern __thread bool soft_in_progress_thread;
int soft_poll_cq(struct dgv_cq *cq, int n, struct dgv_wc *wc);
int soft_cq_wait(struct dgv_cq *cq, int timeout_ms);
/* Adds a completion. Caller holds the producing QP's lock. Returns 0 or -ENOSPC (overflow). */
int soft_cq_push(struct soft_cq *cq, const struct dgv_wc *wc, struct soft_slot *slot,
		 const struct dgv_range *range);
int soft_cq_attach(struct soft_cq *cq, struct soft_qp *qp);
/* No room for another completion now (a hint without the lock: polls only make room). */
bool soft_cq_full(struct soft_cq *cq);
/* An empty CQ gives its ring back (the next completion makes one again, ring_grow): an idle
 * connection's 4 entries were 544 bytes of its resident memory (dgv_qp_discard). Takes
 * cq->lock (after the QP's, as a push does). */
void soft_cq_trim(struct soft_cq *cq);
void soft_cq_detach(struct soft_cq *cq, struct soft_qp *qp);

/* qp.c */
int soft_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
int soft_destroy_qp(struct dgv_qp *qp);
int soft_qp_local_addr(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len);
int soft_post_send(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
int soft_send_now(struct dgv_qp *qp, struct dgv_ah *ah, const struct iovec *iov, int iovcnt);
int soft_post_recv(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
int soft_poll_errq(struct dgv_qp *qp, int n, struct dgv_async_err *out);
int soft_qp_stats(struct dgv_qp *qp, struct dgv_qp_stats *out);
int soft_peek(struct dgv_qp *qp, void *buf, size_t len, struct dgv_peek *out);
int soft_set_rx_cap(struct dgv_qp *qp, unsigned n);
int soft_qp_peer_gone(struct dgv_qp *qp, const struct sockaddr *to, socklen_t tolen);
int soft_qp_tx_held(struct dgv_qp *qp);
int soft_qp_rx_claim(struct dgv_qp *qp, size_t *room);
int soft_qp_discard(struct dgv_qp *qp, void *addr, size_t len);
int soft_qp_rx_stream_feed(struct dgv_qp *qp, const void *buf, ssize_t n);
int soft_qp_set_fd(struct dgv_qp *qp, int fd);
int soft_qp_socket_events(struct dgv_qp *qp);
int soft_qp_rx_feed(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
		    socklen_t srclen, uint32_t max, struct dgv_rx_msg *take);
/* Receives, runs timers and transmits what is queued. from_app: called by an application
 * call (records app activity). Takes qp->lock (trylock when !block). Returns >0 when it did
 * something, 0 when not, -EBUSY when another thread holds the QP. */
int soft_qp_progress(struct soft_qp *qp, bool from_app, bool block);
/* µs until the QP's next timer (UINT64_MAX: none); caller holds qp->lock. */
uint64_t soft_qp_next_timer_locked(struct soft_qp *qp, uint64_t now);
bool soft_qp_wants_pollout(struct soft_qp *qp);
/* Something will need doing without new input (retransmission, deadline, queued send).
 * Racy read without qp->lock: a hint for the progress thread's pace. */
bool soft_qp_timers_pending(struct soft_qp *qp);

/* qp.c: detach from the CQs and wait until nobody else uses qp (destroy of every type). */
void soft_qp_quiesce(struct soft_qp *qp);

/* rc_cm.c, rc_tx.c, rc_rx.c (rc_int.h): RC queue pairs over TCP (MPA/DDP/RDMAP) and their
 * connection management */
int soft_rc_ctx_init(struct soft_ctx *ctx);
void soft_rc_ctx_fini(struct soft_ctx *ctx);
/* Loop thread, ctx->loop_lock held: MPA deadlines of pending requests, listeners. */
bool soft_rc_tick(struct soft_ctx *ctx);
int soft_rc_progress(struct soft_qp *qp, bool from_app, bool block);
int soft_rc_destroy(struct soft_qp *qp);
/* An accepted RC QP whose descriptor its connection request's libev watcher watched. */
bool soft_rc_fd_watched(const struct soft_qp *qp);
int soft_rc_post_send(struct soft_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
/* After soft_post_recv added receives (qp->lock held): flushes them if the connection ended. */
void soft_rc_after_post_recv(struct soft_qp *qp);
bool soft_rc_wants_pollout(struct soft_qp *qp);
bool soft_rc_timers_pending(struct soft_qp *qp);
uint64_t soft_rc_next_timer_locked(struct soft_qp *qp, uint64_t now);
int soft_cm_create_channel(struct dgv_context *ctx, struct dgv_cm_channel **out);
int soft_cm_create_channel_on_cq(struct dgv_context *ctx, struct dgv_cq *cq, struct dgv_cm_channel **out);
/* Makes cq's descriptor readable whether armed or not (a connection event on a channel that
 * signals through it). */
void soft_cq_kick(struct soft_cq *cq);
int soft_cm_destroy_channel(struct dgv_cm_channel *ch);
struct dgv_cm_channel *soft_cm_default_channel(struct dgv_context *ctx);
int soft_cm_channel_fd(struct dgv_cm_channel *ch);
int soft_cm_get_event(struct dgv_cm_channel *ch, struct dgv_cm_event *ev);
int soft_cm_pending(struct dgv_cm_channel *ch);
int soft_cm_wait(struct dgv_cm_channel *ch, int timeout_ms);
int soft_rc_connect(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
		    socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out);
int soft_rc_listen(struct dgv_context *ctx, const struct sockaddr *addr, socklen_t len, int backlog,
		   int adopt_fd, struct dgv_cm_channel *ch, void *user, struct dgv_listener **out);
int soft_rc_listener_destroy(struct dgv_listener *l);
int soft_rc_listener_addr(struct dgv_listener *l, union dgv_sockaddr *out, socklen_t *len);
int soft_rc_conn_req_adopt(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
			   struct dgv_conn_req **out);
int soft_rc_accept(struct dgv_conn_req *req, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
		   const struct dgv_conn_param *param, struct dgv_qp **out);
int soft_rc_reject(struct dgv_conn_req *req, const void *pdata, uint16_t len);
int soft_rc_reject_keep(struct dgv_conn_req *req, const void *pdata, uint16_t len, int wait_ms);
int soft_rc_disconnect(struct dgv_qp *qp);
enum dgv_qp_state soft_rc_qp_state(struct dgv_qp *qp);
int soft_rc_conn_info(struct dgv_qp *qp, struct dgv_conn_info *out);

/* device.c */
void soft_ctx_add_qp(struct soft_ctx *ctx, struct soft_qp *qp);
/* fd leaves libev's epoll set now, and one iteration of the progress thread passes (an event
 * it had already taken for fd is answered before the caller closes or hands back the number).
 * Called with ctx->loop_lock held; releases it. */
void soft_loop_forget_fd_unlock(struct soft_ctx *ctx, int fd);
void soft_ctx_remove_qp(struct soft_ctx *ctx, struct soft_qp *qp);
/* Whether the progress thread's tick has a part in qp: its socket may need watching (nobody
 * holds its reading: rx_app, rx_hold, rx_claimed) or it has time-driven work
 * (soft_qp_timers_pending). Needs qp->lock. */
bool soft_qp_needs_tick(struct soft_qp *qp);
/* The tick runs at its working pace from now (it may have been idle): any thread, any lock.
 * A flag's exchange while the tick works; an ev_async_send when it had gone idle. */
void soft_tick_need(struct soft_ctx *ctx);

/* Releases qp->lock, first waking an idle tick when what the holder did left the QP needing
 * it (a reassembly begun, a send the kernel refused, a Read outstanding...). Every path that
 * changes a QP under its lock releases it here: the thread's scan (device.c tick_cb) takes
 * each lock, so either it saw the change or the holder sees tick_idle set. Hot paths pay one
 * relaxed load while the tick works. */
static inline void soft_qp_unlock(struct soft_qp *qp)
{
	if (__builtin_expect(atomic_load_explicit(&qp->ctx->tick_idle, memory_order_relaxed), 0) &&
	    soft_qp_needs_tick(qp))
		soft_tick_need(qp->ctx);
	pthread_mutex_unlock(&qp->lock);
}

#endif
