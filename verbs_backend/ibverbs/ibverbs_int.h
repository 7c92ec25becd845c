/*
 * ibverbs_int.h - the ibverbs provider's objects: dgverbs.h on a real RDMA device through
 * libibverbs and librdmacm (RC queue pairs; see docs/design.md, "The ibverbs provider").
 * Every object starts with its provider.h base so dgverbs.c dispatches without knowing us.
 */
#ifndef DG_IBVERBS_INT_H
#define DG_IBVERBS_INT_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>

#include "provider.h"
#include "wire.h"
#include "syms.h"     /* last: the ibv_ and rdma_ calls below go through the lazy table */

#define IV_GRH 40
#define IV_UD_MAX_SGE 7
#define IV_UD_MAX_MSG 65536u   /* a UDP datagram's worth */
#define IV_UD_REASM 8          /* messages being reassembled per QP */
#define IV_UD_MAX_SEGS 320     /* 64 KiB in segments of a 256-byte MTU */

struct iv_qp;
struct iv_chan;

/* rdma_cm_id.context points at one of these, so an event finds its object whatever it is. */
enum iv_kind { IV_LISTENER = 1, IV_REQ, IV_QP };
struct iv_tag {
	enum iv_kind kind;
	void *obj;
};

struct iv_ctx {
	struct dgv_context base;
	struct ibv_context *verbs;   /* librdmacm's context of the device (not ours to close) */
	char dev[IBV_SYSFS_NAME_MAX];
	bool iwarp;                  /* IBV_TRANSPORT_IWARP: exact private data, Read sinks need
					remote write (below) */
	struct ibv_device_attr dattr;
	struct iv_chan *defch;
	pthread_mutex_t lock;        /* the deferred accepts list (cold) */
	struct iv_qp *accepts;       /* accepted QPs whose rdma_accept waits (iv_run_accepts) */
	struct iv_qp *discs;         /* QPs whose rdma_disconnect waits for their sends (same) */
	atomic_int naccepts;         /* entries on both lists; read without the lock on the poll path */
	union dgv_sockaddr addr;     /* the local address the device was chosen by (port 0), if any */
	bool have_addr;
	/* UD (ud.c): a thread answers address resolution requests (SIDR) for the UD QPs */
	pthread_mutex_t ud_lock;
	pthread_t sidr_thr;
	int sidr_ep, sidr_efd;
	bool sidr_running;
};

/* Registration cache: one entry per (addr, length, access) per PD, shared by reference. */
#define IV_MR_BUCKETS 64
struct iv_mr {
	struct dgv_mr pub;
	struct ibv_mr *mr;
	struct iv_mr *next;
	uint32_t refs;
};

struct iv_pd {
	struct dgv_pd base;
	struct ibv_pd *pd;
	pthread_mutex_t lock;        /* the cache; taken at registration and by a Write-Record
					completion looking its region up */
	struct iv_mr *mrs[IV_MR_BUCKETS];
	uint32_t nmrs, nqps;
};

/* Completions polled from the device but not handed out yet (dgv_cq_wait must see a
 * completion without consuming it; ibverbs has no peek). */
#define IV_STASH 16
#define IV_CQ_QPS 64
struct iv_cq {
	struct dgv_cq base;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	pthread_mutex_t lock;
	struct ibv_wc stash[IV_STASH];
	int nstash, sthead;
	struct iv_qp *qps[IV_CQ_QPS]; /* qp_num -> QP for the completions of this CQ */
	uint32_t nqps;
	uint32_t need;               /* completions its QPs may have outstanding (qp.c cq_demand) */
	struct dgv_range *ranges;    /* one per completion a poll may return: Write-Record records */
	int nranges;
	struct dgv_range partial[IV_UD_MAX_SEGS / 2 + 1]; /* a partial UD Write-Record's ranges */
};

/* What a send work request was, for its completion (the device reports only wr_id). */
struct iv_swr {
	uint64_t wr_id;
	uint32_t len;
	uint8_t opcode;              /* enum dgv_wc_opcode */
	bool deliver;                /* the program asked for a completion (DGV_SEND_SIGNALED); the
					device is always asked, to know when the send queue is empty */
};

/* A posted receive: its wr_id, and where its first piece is (an iWARP Write-Record's
 * descriptor arrives there, qp.c). */
struct iv_rwr {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t len;
};

/* iWARP has no immediate data: a Write-Record is an RDMA Write then a Send of this (qp.c). */
#define IV_WREC_MAGIC "dgWRrec1"
struct iv_wrec {
	char magic[8];
	uint64_t base;               /* big-endian */
	uint32_t length, stag;       /* big-endian */
};

/* A send held until the connection is up (dgverbs.h: posting from dgv_connect on is legal). */
struct iv_held {
	struct dgv_send_wr wr;
	struct dgv_sge sge[];
};

#define IV_ERRQ 64
#define IV_EVQ 32
struct iv_qp {
	struct dgv_qp base;
	struct iv_pd *pd;
	struct iv_cq *scq, *rcq;
	struct iv_chan *ch;
	void *user;
	struct iv_tag tag;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	pthread_mutex_t lock;        /* posting (slot counters, held sends); never across a wait */
	_Atomic int state;           /* enum dgv_qp_state */
	struct iv_swr *sslots;       /* indexed by the device wr_id modulo nsslots */
	struct iv_rwr *rslots;       /* receives, same */
	struct iv_wrec *wrec;        /* iWARP Write-Record descriptors, one per send slot */
	struct ibv_mr *wrec_mr;
	struct ibv_sge *wrec_sge;
	uint32_t nsslots, nrslots, max_sge, max_inline;
	uint64_t shead, rhead;
	uint64_t sdone;              /* device send WRs completed (RC completes them in order) */
	uint64_t disc_deadline;      /* ms: a deferred disconnect goes ahead at the latest then */
	struct iv_qp *next_disc;
	uint8_t *held;               /* held sends, nsslots records of held_sz bytes */
	size_t held_sz;
	uint32_t nheld;
	uint32_t rx_msn;
	/* UD (ud.c) */
	bool ud;
	struct iv_ud *u;
	bool disc_called, peer_closed, established;
	/* deferred rdma_accept, or rdma_connect with connecting (iv_run_accepts) */
	struct iv_qp *next_accept;
	bool connecting;
	struct rdma_conn_param acc;
	uint8_t acc_pdata[DGV_MAX_PDATA + 4];
	struct dgv_conn_info info;
	struct dgv_async_err errq[IV_ERRQ];
	uint32_t errq_head, errq_n;
	struct dgv_qp_stats st;
};

struct iv_chan {
	struct dgv_cm_channel base;
	struct rdma_event_channel *rch;
	int efd;                     /* eventfd: readable while translated events are queued */
	int epfd;                    /* the channel's fd: rch->fd and efd */
	pthread_mutex_t lock;
	struct dgv_cm_event q[IV_EVQ];
	uint32_t qhead, qn;
	bool efd_set;
	uint32_t users;
};

struct iv_listener {
	struct dgv_listener base;
	struct rdma_cm_id *id;
	struct iv_chan *ch;
	void *user;
	struct iv_tag tag;
};

struct iv_req {
	struct dgv_conn_req base;
	struct rdma_cm_id *id;
	struct iv_chan *ch;
	struct iv_listener *l;
	struct iv_tag tag;
	struct dgv_conn_info info;
};

static inline struct iv_ctx *to_ictx(struct dgv_context *c) { return (struct iv_ctx *)c; }
static inline struct iv_pd *to_ipd(struct dgv_pd *p) { return (struct iv_pd *)p; }
static inline struct iv_cq *to_icq(struct dgv_cq *c) { return (struct iv_cq *)c; }
static inline struct iv_qp *to_iqp(struct dgv_qp *q) { return (struct iv_qp *)q; }
static inline struct iv_chan *to_ichan(struct dgv_cm_channel *c) { return (struct iv_chan *)c; }


/* The placement header in front of every UD segment (ud.c) is struct iv_udh of wire.h. */

struct iv_arecv {                /* a receive the program posted on a UD QP */
	uint64_t wr_id;
	int num_sge;
	struct dgv_sge sge[IV_UD_MAX_SGE];
};

struct iv_reasm {                /* one message arriving in segments */
	bool used, wr, have_recv;
	uint8_t op;
	union dgv_sockaddr src;
	socklen_t src_len;
	uint32_t msn, total, got, nseg;
	uint64_t bits[(IV_UD_MAX_SEGS + 63) / 64];
	uint32_t stag;
	uint64_t to;
	uint64_t last_ms;
	struct iv_arecv rcv;
};

struct iv_ud {
	uint8_t *pool;               /* npool receive buffers of bufsz: GRH, header, payload */
	struct ibv_mr *pool_mr;
	uint32_t npool, bufsz, mtu, payload;
	struct iv_udh *hdr;          /* one per send slot */
	struct ibv_mr *hdr_mr;
	struct iv_arecv *ar;         /* the program's receives, a ring */
	uint32_t ar_cap, ar_head, ar_n;
	struct iv_reasm re[IV_UD_REASM];
	uint32_t nactive;
	uint32_t tx_msn;
	uint16_t port;               /* ours, host order */
};

struct iv_ah {
	struct dgv_ah base;
	struct ibv_ah *ah;
	uint32_t qpn, qkey;
};

/* ud.c */
int iv_ud_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
void iv_ud_destroy(struct iv_qp *qp);
int iv_ud_post_send(struct iv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
int iv_ud_post_recv(struct iv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
bool iv_ud_recv(struct iv_qp *qp, const struct ibv_wc *w, struct dgv_wc *o, struct dgv_range *range);
bool iv_ud_expire(struct iv_qp *qp, struct dgv_wc *o, struct dgv_range *ranges, uint32_t maxr);
void iv_ud_close(struct iv_ctx *ctx);

/* qp.c, shared with ud.c */
struct iv_qp *iv_qp_alloc(struct iv_pd *pd, const struct dgv_qp_init_attr *attr, struct iv_chan *ch);
void iv_qp_free(struct iv_qp *qp);
int iv_cq_add_qp(struct iv_cq *cq, struct iv_qp *qp);
void iv_cq_del_qp(struct iv_cq *cq, struct iv_qp *qp);

/* device.c */
uint64_t iv_now_ms(void);
const char *iv_addr_str(const struct sockaddr *sa, char *buf, size_t len);
int iv_wait_event(struct rdma_event_channel *rch, enum rdma_cm_event_type want, int timeout_ms, int *status);
/* Completions ready (stashed from the device if need be); never blocks. */
int iv_cq_ready(struct dgv_cq *cq);
bool iv_record_target(struct iv_pd *pd, uint32_t imm_lo, uint32_t len, uint32_t *stag, uint64_t *base);

/* qp.c */
int iv_chan_new(struct iv_ctx *ctx, struct iv_chan **out);
void iv_chan_free(struct iv_chan *ch);
void iv_run_accepts_slow(struct iv_ctx *ctx);
/* Sends the rdma_accept of QPs accepted since (cheap when there are none). */
static inline void iv_run_accepts(struct iv_ctx *ctx)
{
	if (atomic_load_explicit(&ctx->naccepts, memory_order_relaxed))
		iv_run_accepts_slow(ctx);
}
int iv_poll_cq(struct dgv_cq *cq, int n, struct dgv_wc *wc);
/* Notes the send completions among n device completions just taken off cq (stashed, not yet
 * converted). Needs cq->lock. */
void iv_note_sends(struct iv_cq *cq, const struct ibv_wc *w, int n);
int iv_create_ah(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out);
int iv_destroy_ah(struct dgv_ah *ah);
int iv_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
int iv_destroy_qp(struct dgv_qp *qp);
int iv_qp_local_addr(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len);
int iv_post_send(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
int iv_post_recv(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
int iv_poll_errq(struct dgv_qp *qp, int n, struct dgv_async_err *out);
int iv_qp_stats(struct dgv_qp *qp, struct dgv_qp_stats *out);
int iv_cm_create_channel(struct dgv_context *ctx, struct dgv_cm_channel **out);
int iv_cm_destroy_channel(struct dgv_cm_channel *ch);
struct dgv_cm_channel *iv_cm_default_channel(struct dgv_context *ctx);
int iv_cm_channel_fd(struct dgv_cm_channel *ch);
int iv_cm_get_event(struct dgv_cm_channel *ch, struct dgv_cm_event *ev);
int iv_cm_pending(struct dgv_cm_channel *ch);
int iv_cm_wait(struct dgv_cm_channel *ch, int timeout_ms);
int iv_connect(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
	       socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out);
int iv_listen(struct dgv_context *ctx, const struct sockaddr *addr, socklen_t len, int backlog,
	      int adopt_fd, struct dgv_cm_channel *ch, void *user, struct dgv_listener **out);
int iv_listener_destroy(struct dgv_listener *l);
int iv_listener_addr(struct dgv_listener *l, union dgv_sockaddr *out, socklen_t *len);
int iv_conn_req_adopt(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
		      struct dgv_conn_req **out);
int iv_accept(struct dgv_conn_req *req, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
	      const struct dgv_conn_param *param, struct dgv_qp **out);
int iv_reject(struct dgv_conn_req *req, const void *pdata, uint16_t len);
int iv_disconnect(struct dgv_qp *qp);
enum dgv_qp_state iv_qp_state(struct dgv_qp *qp);
int iv_conn_info(struct dgv_qp *qp, struct dgv_conn_info *out);

#endif
