/*
 * dgverbs.h - the verbs interface between the shim (and apps) and the backends.
 *
 * This is the only header the shim and the applications include from verbs_backend/.
 * Semantics follow the OFA/RDMAC verbs with the datagram-iWARP extensions of paper 003
 * section III.A (QP types UD and RD, address handles, source address in completions) and
 * RDMA Write-Record of paper 000 section IV.B.3.
 *
 * Conventions:
 *  - every function returning int returns 0 (or a count) on success and -errno on failure;
 *  - objects are opaque except struct dgv_mr, whose public fields may be read;
 *  - a context may be used from several threads; a QP serialises its own operations,
 *    a CQ its own; nothing here takes a process-wide lock on the data path.
 */
#ifndef DGVERBS_H
#define DGVERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

struct dgv_context;
struct dgv_pd;
struct dgv_cq;
struct dgv_qp;
struct dgv_ah;

/* ---------------------------------------------------------------- context */

enum dgv_provider_kind {
	DGV_PROV_AUTO = 0, /* DGSHIM_PROVIDER from the environment, else the best available */
	DGV_PROV_SOFT,     /* software datagram-iWARP RNIC over kernel UDP/TCP */
	DGV_PROV_IBVERBS,  /* libibverbs/librdmacm device (verbs_backend/ibverbs; RC) */
};

enum dgv_progress_mode {
	DGV_PROGRESS_AUTO = 0, /* app drives progress while it polls; a libev thread when it does not */
	DGV_PROGRESS_APP,      /* only calls into the provider make progress (no thread) */
	DGV_PROGRESS_THREAD,   /* the libev thread handles every receive */
};

struct dgv_context_attr {
	enum dgv_provider_kind provider;
	enum dgv_progress_mode progress;
	/* ibverbs: the device is the one whose netdev carries this address (a local address, or a
	 * remote one resolved through the routing table by rdma_cm). NULL: the device named by
	 * `device` or DGSHIM_IBV_DEVICE, else the first one with an active port. AUTO picks
	 * ibverbs only when an address or a device name is given and that device opens. */
	const struct sockaddr *addr;
	socklen_t addrlen;
	const char *device;
};

/* Opens a provider. attr may be NULL (defaults). Returns 0 or -errno (-ENODEV: no such provider). */
int dgv_open(const struct dgv_context_attr *attr, struct dgv_context **out);
void dgv_close(struct dgv_context *ctx);
/* "soft" or "ibverbs"; never NULL. */
const char *dgv_provider_name(const struct dgv_context *ctx);
/* A function every thread a provider starts runs first: the shim marks the thread as its own,
 * so the provider's socket calls there reach libc directly even on a descriptor number the
 * program holds (a queue pair adopts the program's own socket). Set before the first dgv_open;
 * NULL: none. */
void dgv_set_thread_hook(void (*fn)(void));
/* Why this provider was chosen, one line for logs and counters, e.g. "auto: ibverbs (device
 * rxe0 (InfiniBand/RoCE))" or "auto: soft (ibverbs: no RDMA device ...)"; never NULL. */
const char *dgv_provider_why(const struct dgv_context *ctx);

/* What a provider's objects do, beyond the calls every provider answers. Callers decide by
 * these, never by the provider's name (docs/design.md "Capabilities"). */
enum dgv_cap_flag {
	/* QPs and connections run on a kernel socket the caller hands over (use_adopt_fd,
	 * dgv_conn_req_adopt): plain datagrams from unmodified peers complete as
	 * DGV_WC_RECV_PLAIN, and that socket's readiness, send queue (SIOCOUTQ) and reset are the
	 * QP's. Without it the provider has its own path (a device): plain datagrams stay in the
	 * caller's socket beside the QP, and a connection is set up by the provider's CM. */
	DGV_CAP_ADOPT_FD = 1u << 0,
	/* dgv_peek and dgv_qp_set_rx_cap work (a QP on an adopted socket) */
	DGV_CAP_PEEK = 1u << 1,
	/* a CQ's channel fires once per dgv_req_notify_cq and only for completions after it:
	 * arm before each wait, and look at the CQ once more after arming */
	DGV_CAP_ARM_ONCE = 1u << 2,
	/* completions come within microseconds of the wire: a waiter polls a while first */
	DGV_CAP_BUSY_POLL = 1u << 3,
	/* dgv_cq_notify_background: the provider's thread progresses a QP nobody polls */
	DGV_CAP_BACKGROUND = 1u << 4,
	/* each signalled completion may wake a program waiting on the channel (a device's
	 * interrupt; on the soft provider an eventfd write when the CQ is armed, and its read):
	 * signal one send in several where in-order completion allows */
	DGV_CAP_SIGNAL_COSTS = 1u << 5,
	/* RC: a Write-Record goes as a Write and a Send (two send queue entries), and consumes a
	 * posted receive at the target (docs/design.md "The ibverbs provider") */
	DGV_CAP_RC_WREC_AS_SEND = 1u << 6,
	/* UD peers are reached by the provider's own address resolution (SIDR), not by kernel
	 * UDP ports: a peer must be served by the same kind of provider */
	DGV_CAP_UD_SIDR = 1u << 7,
	/* RDMA Read on UD and RD QPs */
	DGV_CAP_DGRAM_READ = 1u << 8,
	/* DGV_SEND_INLINE on UD QPs */
	DGV_CAP_SEND_INLINE = 1u << 9,
	/* dgv_qp_rx_feed: the caller may read a datagram off an adopted socket itself (a
	 * blocking read, the kernel's own wait) and hand it to the QP */
	DGV_CAP_RX_FEED = 1u << 10,
	/* dgv_qp_rx_claim / dgv_qp_rx_stream_feed: the caller may read an adopted RC QP's TCP
	 * socket itself (a blocking read, the kernel's own wait) and hand the bytes to the QP */
	DGV_CAP_RC_RX_FEED = 1u << 11,
	/* RC: sends are handed to the transport during dgv_post_send when it has room (the soft
	 * provider's TCP socket), DGV_SEND_SIGNAL_HELD and dgv_qp_tx_held work */
	DGV_CAP_RC_TX_HELD = 1u << 12,
	/* RC: DGV_SEND_NOW (the soft provider's TCP socket) */
	DGV_CAP_RC_SEND_NOW = 1u << 13,
	/* RC: dgv_qp_discard (registered memory is not pinned: the soft provider) */
	DGV_CAP_RC_DISCARD = 1u << 14,
};

struct dgv_caps {
	uint32_t qp_types;     /* 1u << DGV_QPT_UD | ...: the QP types the provider makes */
	uint32_t max_msg_size; /* the largest message one UD Send carries */
	uint32_t flags;        /* enum dgv_cap_flag */
};
/* Fills *out for ctx's provider. Returns 0 or -EINVAL. */
int dgv_query_caps(const struct dgv_context *ctx, struct dgv_caps *out);

/* ---------------------------------------------------------------- protection domains and memory */

int dgv_alloc_pd(struct dgv_context *ctx, struct dgv_pd **out);
/* Returns -EBUSY while MRs, QPs or AHs still use the PD. */
int dgv_dealloc_pd(struct dgv_pd *pd);

enum dgv_access {
	DGV_ACCESS_LOCAL_WRITE = 1u << 0,
	DGV_ACCESS_REMOTE_WRITE = 1u << 1, /* RDMA Write and Write-Record may place here */
	DGV_ACCESS_REMOTE_READ = 1u << 2,  /* RDMA Read may fetch from here */
};

/*
 * A registered region. lkey is used in local SGEs, rkey (the STag, RFC 5040 section 2.1:
 * 24-bit index, 8-bit key) is advertised to peers. In the soft provider every bit of the STag
 * except the table index is random (getrandom), so a peer cannot guess a valid STag from one
 * it has seen. Remote access is checked against pd, bounds and access on every segment.
 */
struct dgv_mr {
	void *addr;
	size_t length;
	uint32_t lkey;
	uint32_t rkey;
	unsigned access;
	struct dgv_pd *pd;
};

int dgv_reg_mr(struct dgv_pd *pd, void *addr, size_t length, unsigned access, struct dgv_mr **out);
/* Waits for placements in progress on the region, then invalidates it. */
int dgv_dereg_mr(struct dgv_mr *mr);

/* ---------------------------------------------------------------- completion queues */

int dgv_create_cq(struct dgv_context *ctx, int cqe, struct dgv_cq **out);
int dgv_destroy_cq(struct dgv_cq *cq);
/* A file descriptor that becomes readable when a completion arrives after dgv_req_notify_cq;
 * -errno (EMFILE) when the provider makes it on first use and cannot. */
int dgv_cq_fd(struct dgv_cq *cq);
/* Arms the fd for the next completion (solicited_only: only Send with SE and errors). */
int dgv_req_notify_cq(struct dgv_cq *cq, int solicited_only);
/* Consumes the fd's pending event (call after it polled readable). */
int dgv_cq_ack_event(struct dgv_cq *cq);
/* on != 0: every completion the provider makes on its own (its progress thread, while the
 * program is not polling) also makes the fd readable, armed or not. For a program waiting on
 * many CQs at once (epoll), which cannot afford to arm each one before every wait; its own
 * polling sees the completions it makes. */
int dgv_cq_notify_background(struct dgv_cq *cq, int on);
/* Completions ready to poll now (>= 0), without driving progress; lock-free, never blocks. */
int dgv_cq_ready(struct dgv_cq *cq);
/* 1 when every completion a program waits for on this CQ is made inside its own calls into
 * the provider (dgv_poll_cq, dgv_post_*) as it reads the QPs' sockets: a waiter then needs only
 * those sockets' readiness, not dgv_cq_fd, which is made on first use (so such a CQ costs no
 * descriptor). 0 otherwise (a device's CQ, RD, RC, fault injection). Depends on the QPs
 * attached: ask again after creating or destroying one. */
int dgv_cq_self_driven(struct dgv_cq *cq);

/* ---------------------------------------------------------------- addresses */

union dgv_sockaddr {
	struct sockaddr sa;
	struct sockaddr_in sin;
	struct sockaddr_in6 sin6;
};

/* True when a and b name the same UDP endpoint (family, address, port; IPv6 flow label and
 * scope ignored, as the kernel's delivery does for a given interface). */
static inline bool dgv_addr_eq(const union dgv_sockaddr *a, const union dgv_sockaddr *b)
{
	if (a->sa.sa_family != b->sa.sa_family)
		return false;
	if (a->sa.sa_family == AF_INET)
		return a->sin.sin_port == b->sin.sin_port && a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
	return a->sin6.sin6_port == b->sin6.sin6_port &&
	       !memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, sizeof a->sin6.sin6_addr);
}

/* An address handle: the UDP address (IPv4 or IPv6) of a remote datagram QP. */
int dgv_create_ah(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out);
int dgv_destroy_ah(struct dgv_ah *ah);

/* ---------------------------------------------------------------- queue pairs */

enum dgv_qp_type {
	DGV_QPT_UD = 1, /* unreliable datagram: paper 003 III.B */
	DGV_QPT_RD = 2, /* reliable datagram: in order per source over UDP */
	DGV_QPT_RC = 3, /* reliable connection: standard iWARP (MPA/DDP/RDMAP) over TCP */
};

/* Fault injection at one edge of a QP (tests and benchmarks). Percentages are 0..100. */
struct dgv_fault {
	double loss_pct;      /* independent loss */
	double burst_pct;     /* chance that a burst of burst_len losses starts */
	uint32_t burst_len;
	double reorder_pct;   /* chance a datagram is held back and sent after reorder_depth others */
	uint32_t reorder_depth;
	double dup_pct;       /* chance a datagram is delivered twice */
	double corrupt_pct;   /* chance one byte is flipped */
	uint64_t seed;        /* 0: from the clock */
};

/*
 * Parses "loss=1,burst=0.5:4,reorder=5:3,dup=1,corrupt=0.1,seed=7" into f (zeroed first).
 * Returns 0 or -EINVAL; on error *why points at a static text naming the bad item.
 */
int dgv_fault_parse(const char *spec, struct dgv_fault *f, const char **why);

struct dgv_qp_init_attr {
	enum dgv_qp_type qp_type;
	struct dgv_cq *send_cq;
	struct dgv_cq *recv_cq; /* receives, Write-Record records, and nothing else */
	uint32_t max_send_wr;   /* 0: 256 */
	uint32_t max_recv_wr;   /* 0: 256 */
	uint32_t max_sge;       /* 0: 4 */
	uint32_t max_msg_size;  /* 0: 16 MiB; larger messages are rejected with -EMSGSIZE */
	/* UDP payload bytes per datagram, headers included; 0: 1472 (IPv4, 1500-byte MTU) or
	 * 1452 (IPv6). 65507 at most. */
	uint32_t seg_size;
	/* Local UDP address to bind; NULL: the wildcard of family bind_family, ephemeral port. */
	const struct sockaddr *bind_addr;
	socklen_t bind_len;
	int bind_family;        /* AF_INET (default when 0) or AF_INET6 */
	/* use_adopt_fd != 0: use the UDP socket adopt_fd instead of creating one (the shim passes
	 * the program's socket). The QP makes it non-blocking and does not close it. */
	int use_adopt_fd;
	int adopt_fd;
	/* How long a partly received message waits for its missing segments, microseconds.
	 * 0: 20000 for UD; RD uses its own retry budget. */
	uint32_t reasm_timeout_us;
	/* RD: give up on a silent peer after this many retransmissions of one datagram; 0: 12. */
	uint32_t rd_max_retries;
	/* RD: datagrams in flight (and buffered out of order), shared by all peers of the QP;
	 * 0: 256, capped at 4 MiB worth of segments. Each costs one segment of memory twice:
	 * programs with thousands of RD QPs want a small window. */
	uint32_t rd_window;
	/* Hand datagrams that are not datagram-iWARP up as DGV_WC_RECV_PLAIN receives instead of
	 * dropping them (for a socket shared with peers that speak plain UDP). A datagram whose
	 * header looks like ours but whose CRC is wrong is still dropped as corrupted. Receive
	 * buffers are then 64 KiB so that no plain datagram is ever truncated. */
	int pass_plain;
	/* UD: read the socket only from the program's own calls (poll_cq, cq_wait), never from
	 * the provider's thread, and no more datagrams than there are posted receives: the kernel
	 * socket buffer keeps the rest, so it queues and drops exactly as it would without us,
	 * and nothing read ahead is lost if the program execs. The shim sets this; it waits on
	 * the socket itself. The thread still runs the QP's timers.
	 * RC (dgv_connect, dgv_accept on an adopted socket): likewise only the program's calls
	 * (poll_cq, cm_get_event, cm_wait, cq_wait) read the connection and decide its fate (set-up
	 * failures and timeouts included); the thread only writes for it (the MPA Request once
	 * TCP is up, sends TCP refused), so a waiter needs the socket alone (dgv_cq_self_driven,
	 * dgv_qp_socket_events) until TCP refuses a send. Data stays in TCP until then, as it
	 * would without us. */
	int rx_hold;
	/* NULL: read DGSHIM_FAULT_TX / DGSHIM_FAULT_RX from the environment. */
	const struct dgv_fault *fault_tx;
	const struct dgv_fault *fault_rx;
	/* RC only: where the QP's connection events go (NULL: the context's default channel,
	 * dgv_cm_default_channel) and an opaque pointer echoed in every event about this QP. */
	struct dgv_cm_channel *cm_channel;
	void *cm_user;
};

int dgv_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
/* Flushes outstanding work requests (WR_FLUSH_ERR completions), then frees the QP. */
int dgv_destroy_qp(struct dgv_qp *qp);
/* The address peers use to reach this QP. */
int dgv_qp_local_addr(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len);
enum dgv_qp_type dgv_qp_type(const struct dgv_qp *qp);

/* ---------------------------------------------------------------- work requests */

struct dgv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

enum dgv_wr_opcode {
	DGV_WR_SEND = 0,
	DGV_WR_SEND_SE,       /* Send with Solicited Event (RFC 5040 section 5.3) */
	DGV_WR_WRITE,         /* RDMA Write: placed at the target, no target completion */
	DGV_WR_WRITE_RECORD,  /* RDMA Write-Record: placed, then a record completion at the target */
	DGV_WR_READ,          /* RDMA Read */
	DGV_WR_SEND_PLAIN,    /* the payload as one plain UDP datagram, no framing (interop) */
	DGV_WR_SEND_INV,      /* RC: Send with Invalidate of invalidate_rkey (RFC 5040 section 5.3) */
	DGV_WR_SEND_SE_INV,   /* RC: Send with Solicited Event and Invalidate */
};

enum dgv_send_flags {
	DGV_SEND_SIGNALED = 1u << 0, /* generate a completion on success (errors always complete) */
	/* UD Send (DGV_CAP_SEND_INLINE): the SGEs' memory is the caller's again when dgv_post_send
	 * returns, registered or not (lkeys are not looked at): what the provider could not hand
	 * to the network during the post it copies. A send from a program's own buffer with no
	 * staging copy, no registration and, unsignaled, no completion (-EINVAL elsewhere). */
	DGV_SEND_INLINE = 1u << 1,
	/* RC (DGV_CAP_RC_TX_HELD): signaled only if dgv_post_send returns with the send not yet
	 * wholly handed to the transport (then its completion says when it is): a writer that must
	 * know its bytes left the process asks dgv_qp_tx_held after the post and waits for a
	 * completion only then, instead of making and taking one per send */
	DGV_SEND_SIGNAL_HELD = 1u << 2,
	/* RC (DGV_CAP_RC_SEND_NOW), one work request: the message goes to the transport during
	 * dgv_post_send, which reads the SGEs' memory only then (registered or not: lkeys are not
	 * looked at), or nothing is posted and it returns -EAGAIN (something is queued or on its way
	 * before it, the transport has no room, more than one FPDU). What the transport took only
	 * part of the provider keeps a copy of. A stream's small write then goes from the program's
	 * buffer, and the send ring's pages are not written for it (issue 14 item 2). -EINVAL with
	 * a chain, -EOPNOTSUPP where the provider has no such way. */
	DGV_SEND_NOW = 1u << 3,
};

struct dgv_send_wr {
	uint64_t wr_id;
	struct dgv_send_wr *next;
	struct dgv_sge *sg_list;
	int num_sge;
	enum dgv_wr_opcode opcode;
	unsigned send_flags;
	struct dgv_ah *ah;    /* destination (UD and RD) */
	uint64_t remote_addr; /* WRITE, WRITE_RECORD, READ: the target's virtual address (tagged offset) */
	uint32_t rkey;        /* and its STag */
	uint32_t invalidate_rkey; /* SEND_INV, SEND_SE_INV: the target's STag to invalidate */
};

struct dgv_recv_wr {
	uint64_t wr_id;
	struct dgv_recv_wr *next;
	struct dgv_sge *sg_list;
	int num_sge;
};

/* Post a chain of WRs. On failure *bad is the first WR not posted. Never blocks. */
int dgv_post_send(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
int dgv_post_recv(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
/*
 * UD: one unsignaled Send of iov's bytes to ah, handed to the network during the call or not at
 * all, with no work request to build or completion to make (a datagram socket's send). The
 * memory is the caller's again on return. Returns 0 (sent), -EAGAIN (not now: the message needs
 * more than one datagram, something is queued before it, the socket is full, a fault injection
 * is on, or the send failed; post it with dgv_post_send, DGV_SEND_INLINE, which queues it or
 * says what failed), -EINVAL, -EOPNOTSUPP (the provider has no such way: dgv_post_send).
 */
int dgv_send_now(struct dgv_qp *qp, struct dgv_ah *ah, const struct iovec *iov, int iovcnt);

/* ---------------------------------------------------------------- completions */

enum dgv_wc_status {
	DGV_WC_SUCCESS = 0,
	DGV_WC_LOC_LEN_ERR,     /* message longer than the posted buffer */
	DGV_WC_LOC_PROT_ERR,    /* an SGE outside its lkey's region or without the right */
	DGV_WC_LOC_QP_OP_ERR,   /* the opcode is not valid on this QP type or state */
	DGV_WC_WR_FLUSH_ERR,    /* flushed by QP destruction */
	DGV_WC_REM_ACCESS_ERR,  /* the target rejected the tagged access (Terminate received) */
	DGV_WC_REM_OP_ERR,      /* the target reported another error (Terminate received) */
	DGV_WC_RETRY_EXC_ERR,   /* RD: the peer stayed silent past the retry budget */
	DGV_WC_PARTIAL,         /* Write-Record or UD Read: only the ranges in the record are valid */
	DGV_WC_GENERAL_ERR,
};

enum dgv_wc_opcode {
	DGV_WC_SEND = 0,
	DGV_WC_WRITE,
	DGV_WC_WRITE_RECORD,
	DGV_WC_READ,
	DGV_WC_RECV,              /* a Send matched a posted receive */
	DGV_WC_RECV_WRITE_RECORD, /* a Write-Record arrived: see record (no receive consumed) */
	DGV_WC_RECV_PLAIN,        /* pass_plain: a plain UDP datagram, copied whole */
	DGV_WC_SEND_PLAIN,
};

enum dgv_wc_flags {
	DGV_WC_SOLICITED = 1u << 0,
	DGV_WC_WITH_INV = 1u << 1, /* RECV of a Send with Invalidate: invalidated_rkey is now invalid */
};

/* One byte range [offset, offset+length) relative to the record's base. */
struct dgv_range {
	uint32_t offset;
	uint32_t length;
};

/* The validity record of paper 000 section IV.B.3, as an aggregated validity map. */
struct dgv_record {
	uint32_t stag;       /* target region */
	uint64_t base;       /* tagged offset of the message's first byte */
	uint32_t length;     /* message length */
	uint32_t valid_bytes;
	uint32_t nranges;
	const struct dgv_range *ranges; /* sorted, disjoint, coalesced; owned by the CQ:
					   valid until the next dgv_poll_cq on it */
};

struct dgv_wc {
	uint64_t wr_id;
	enum dgv_wc_status status;
	enum dgv_wc_opcode opcode;
	uint32_t byte_len;       /* bytes placed (RECV: message length; READ: bytes fetched) */
	unsigned flags;
	uint32_t msn;            /* DDP message sequence number of the message */
	struct dgv_qp *qp;
	union dgv_sockaddr src;  /* RECV and RECV_WRITE_RECORD: who sent it */
	socklen_t src_len;
	struct dgv_record record; /* RECV_WRITE_RECORD, and READ on UD */
	uint32_t invalidated_rkey; /* with DGV_WC_WITH_INV */
};

/* Drives progress on the CQ's QPs, then returns up to n completions (>= 0) or -errno. */
int dgv_poll_cq(struct dgv_cq *cq, int n, struct dgv_wc *wc);
/* Blocks until a completion is ready (0), timeout_ms passes (-ETIMEDOUT; < 0: forever),
 * or a signal interrupts (-EINTR). Drives progress while it waits. */
int dgv_cq_wait(struct dgv_cq *cq, int timeout_ms);

/* ---------------------------------------------------------------- connections (RC), rdma_cm style
 *
 * An RC QP runs standard iWARP over one kernel TCP connection: MPA (RFC 5044, and the enhanced
 * connection set-up of RFC 6581 when revision 2 is negotiated), DDP (RFC 5041), RDMAP
 * (RFC 5040). It interoperates with other iWARP implementations (Linux siw). Connection set-up
 * is asynchronous, in the manner of librdmacm: calls start it, events on a channel report it.
 *
 * Active side:  dgv_connect() -> DGV_CM_ESTABLISHED (peer's private data in the event)
 *                             or DGV_CM_REJECTED / DGV_CM_CONNECT_ERROR.
 * Passive side: dgv_listen() -> DGV_CM_CONNECT_REQUEST per connection (a dgv_conn_req with the
 *               initiator's private data) -> dgv_accept() -> DGV_CM_ESTABLISHED, or dgv_reject().
 *               dgv_conn_req_adopt() makes a request from a TCP connection someone else accepted
 *               (the shim accepts on the program's socket), the rest is the same.
 * Either side:  dgv_disconnect() (graceful: queued sends go out first) -> DGV_CM_DISCONNECTED
 *               when both directions are closed; DGV_CM_PEER_CLOSED when the peer closed its
 *               direction first; a Terminate or a TCP error also ends in
 *               DGV_CM_DISCONNECTED with status < 0 after the QP went to DGV_QPS_ERROR.
 * Work requests may be posted from dgv_connect/dgv_accept on: they are held until the QP is
 * in RTS. Posted receives are flushed (WR_FLUSH_ERR) when the connection ends.
 * RDMA Write-Record is valid on RC (paper 000 IV.B.3: Write-Record on a reliable transport):
 * a tagged message with RDMAP opcode 0x8; the target places it like a Write and, at the segment
 * with L set, queues DGV_WC_RECV_WRITE_RECORD on its receive CQ with the whole message as the
 * one valid range (no posted receive is consumed). Messages are never interleaved on the
 * stream, so the record's base is the tagged offset of the message's first segment.
 */

struct dgv_cm_channel;
struct dgv_conn_req;
struct dgv_listener;

#define DGV_MAX_PDATA 512 /* RFC 5044 section 7.1: private data of an MPA frame, at most 512 bytes
			     (with MPA revision 2 the provider's 4-byte IRD/ORD prefix is extra). */

struct dgv_conn_param {
	const void *private_data;
	uint16_t private_data_len;   /* <= DGV_MAX_PDATA */
	uint8_t mpa_rev;             /* 0: 2 (RFC 6581), or 1 (RFC 5044 only) */
	int8_t crc;                  /* -1: default (on; DGSHIM_MPA_CRC=off turns it off), 0: do not
					ask for CRC, 1: require it. CRC is used if either side asks. */
	int8_t markers;              /* 0: off (default), 1: ask for markers (RFC 5044 section 5) */
	uint16_t ird, ord;           /* RDMA Reads in flight inbound/outbound; 0: provider max */
	uint32_t timeout_ms;         /* MPA exchange deadline; 0: 10000 */
};

/* What a connection negotiated (dgv_conn_info and the events). */
struct dgv_conn_info {
	uint8_t mpa_rev;
	bool crc, markers_rx, markers_tx;
	uint16_t ird, ord;
	union dgv_sockaddr local, peer;
	socklen_t local_len, peer_len;
};

enum dgv_cm_event_type {
	DGV_CM_CONNECT_REQUEST = 1, /* listener or adopted request: ev.req, ev.pdata */
	DGV_CM_ESTABLISHED,         /* ev.qp is in RTS; ev.pdata: the peer's (the reply's on the
				       active side) */
	DGV_CM_REJECTED,            /* active side: the peer sent an MPA reject; ev.pdata */
	DGV_CM_CONNECT_ERROR,       /* TCP refused/unreachable/timed out, malformed MPA, bad key,
				       timeout: ev.status = -errno, ev.qp in DGV_QPS_ERROR */
	DGV_CM_DISCONNECTED,        /* connection over; ev.status 0 (orderly) or -errno */
	DGV_CM_PEER_CLOSED,         /* the peer shut down its sending direction (TCP FIN after its
				       last FPDU): everything it sent has already completed on the
				       CQ when this is queued; this side may still send. Stream
				       sockets read it as end of file. */
};

struct dgv_cm_event {
	enum dgv_cm_event_type type;
	int status;                 /* 0 or -errno (ECONNREFUSED, ECONNRESET, ETIMEDOUT, EPROTO...) */
	struct dgv_qp *qp;          /* all but CONNECT_REQUEST */
	struct dgv_conn_req *req;   /* CONNECT_REQUEST */
	struct dgv_listener *listener; /* CONNECT_REQUEST from a listener (NULL when adopted) */
	void *user;                 /* the cm_user of the QP or the listener */
	struct dgv_conn_info info;  /* ESTABLISHED, CONNECT_REQUEST (as offered) */
	uint16_t pdata_len;
	uint8_t pdata[DGV_MAX_PDATA];
	/* CONNECT_ERROR / DISCONNECTED from a Terminate: the RFC 5040 section 7 triple */
	uint8_t term_layer, term_etype, term_ecode;
	/* CONNECT_ERROR: the connection failed here before anything of it left (the provider's
	 * own start of it failed): the peer never heard of it */
	bool local;
};

/* Channels: an fd readable while events are queued (like rdma_cm's event channel). */
int dgv_cm_create_channel(struct dgv_context *ctx, struct dgv_cm_channel **out);
/* A channel with no descriptor of its own: its events make cq's descriptor readable (as an
 * unarmed completion would: the waiter acknowledges it with dgv_cq_ack_event and then looks
 * at both), and dgv_cm_channel_fd returns cq's. A connection that waits on its CQ anyway so
 * costs one descriptor, not two. cq must outlive the channel. Returns 0, -ENOMEM, or
 * -EOPNOTSUPP where the provider's channel is a descriptor of its own (rdma_cm's): the caller
 * makes a plain channel then. */
int dgv_cm_create_channel_on_cq(struct dgv_context *ctx, struct dgv_cq *cq, struct dgv_cm_channel **out);
/* Returns -EBUSY while QPs or listeners still report to it. */
int dgv_cm_destroy_channel(struct dgv_cm_channel *ch);
/* The context's own channel (never NULL for a valid ctx; destroyed with it). */
struct dgv_cm_channel *dgv_cm_default_channel(struct dgv_context *ctx);
int dgv_cm_channel_fd(struct dgv_cm_channel *ch);
/* Next event into *ev: 0, -EAGAIN when none is queued (never blocks; drives progress). */
int dgv_cm_get_event(struct dgv_cm_channel *ch, struct dgv_cm_event *ev);
/* Whether events are queued, without driving anything: > 0 some (or the backend cannot
 * tell), 0 none. For a caller that has just progressed its QPs (polling their CQ does), an
 * empty queue means dgv_cm_get_event would only drive them once more. */
int dgv_cm_pending(struct dgv_cm_channel *ch);
/* Blocks until an event is queued (0), timeout_ms passes (-ETIMEDOUT; < 0: forever) or a
 * signal interrupts (-EINTR). Drives progress while it waits. */
int dgv_cm_wait(struct dgv_cm_channel *ch, int timeout_ms);

/*
 * Active side. attr->qp_type must be DGV_QPT_RC. With attr->use_adopt_fd, adopt_fd is a TCP
 * socket that is connected or has a non-blocking connect in progress (the QP sends the MPA
 * Request once TCP is up, and does not close the fd); otherwise the QP makes its own socket
 * (bound to attr->bind_addr when given) and connects it to dst. *out is valid at once; the
 * outcome comes as an event. Returns 0 or -errno (-EINVAL: bad attr/param).
 */
int dgv_connect(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
		socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out);

/* Passive side: a TCP listening socket on addr (or on adopt_fd >= 0, already listening; not
 * closed by the provider). Connections are accepted and their MPA Requests read in the
 * background; each becomes a CONNECT_REQUEST event on ch (NULL: the default channel). */
int dgv_listen(struct dgv_context *ctx, const struct sockaddr *addr, socklen_t len, int backlog,
	       int adopt_fd, struct dgv_cm_channel *ch, void *user, struct dgv_listener **out);
int dgv_listener_destroy(struct dgv_listener *l);
int dgv_listener_addr(struct dgv_listener *l, union dgv_sockaddr *out, socklen_t *len);
/* A request from a TCP connection the caller accepted itself (the shim accepts on the
 * program's socket); the provider never closes fd. The MPA Request is read in the background,
 * or, on a channel made on a CQ (dgv_cm_create_channel_on_cq), by the caller's own
 * dgv_cm_get_event / dgv_cm_wait on ch (which then need no descriptor of the provider's);
 * CONNECT_REQUEST follows on ch, or CONNECT_ERROR with ev.req set (the caller then
 * dgv_reject()s it to free it). */
int dgv_conn_req_adopt(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
		       struct dgv_conn_req **out);
/* Answers a request with an MPA Reply: creates the QP (attr->qp_type RC; use_adopt_fd is
 * ignored: the request's socket is used) and frees req. ESTABLISHED follows. */
int dgv_accept(struct dgv_conn_req *req, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
	       const struct dgv_conn_param *param, struct dgv_qp **out);
/* Answers with an MPA Reply with the Reject bit, closes the connection, frees req. */
int dgv_reject(struct dgv_conn_req *req, const void *pdata, uint16_t len);
/* Answers an adopted request with an MPA Reply with the Reject bit and leaves the TCP
 * connection open and untouched beyond it: the Request (waited for up to wait_ms if it has
 * not come whole) and the Reply are the only bytes taken from and put on it, so both ends can
 * go on with it as plain TCP (the shim's "stay plain"). Returns 0 (req freed; the descriptor
 * stays the caller's), or -ETIMEDOUT (no whole Request in time), -EPROTO (not an MPA
 * Request), -EOPNOTSUPP (the provider's connections are not the caller's TCP sockets), -EIO
 * (the Reply did not go whole), the socket's -errno: req is still the caller's then
 * (dgv_reject() it). */
int dgv_reject_keep(struct dgv_conn_req *req, const void *pdata, uint16_t len, int wait_ms);

/* Graceful close: queued sends are transmitted, then TCP is shut down for writing. */
int dgv_disconnect(struct dgv_qp *qp);

enum dgv_qp_state {
	DGV_QPS_IDLE = 0,    /* UD/RD: always this */
	DGV_QPS_CONNECTING,  /* TCP connect or MPA exchange in progress */
	DGV_QPS_RTS,         /* connected */
	DGV_QPS_CLOSING,     /* dgv_disconnect called or the peer closed one direction */
	DGV_QPS_CLOSED,      /* both directions closed in order */
	DGV_QPS_ERROR,       /* Terminate sent or received, TCP error, MPA failure */
};
enum dgv_qp_state dgv_qp_state(struct dgv_qp *qp);
/* Negotiated parameters and addresses of an RC QP (-ENOTCONN before ESTABLISHED). */
int dgv_conn_info(struct dgv_qp *qp, struct dgv_conn_info *out);

/* ---------------------------------------------------------------- errors and counters */

/* RFC 5040 section 7 layers. */
enum dgv_err_layer { DGV_LAYER_RDMAP = 0, DGV_LAYER_DDP = 1, DGV_LAYER_LLP = 2 };

/* An entry of the QP's error queue (paper 003 III.C: replaces stream termination). */
struct dgv_async_err {
	uint8_t layer;  /* enum dgv_err_layer */
	uint8_t etype;  /* RFC 5040 section 7.1 / RFC 5041 section 7.2 error type */
	uint8_t ecode;  /* error code within that type */
	uint8_t remote; /* 0: detected here on an incoming segment; 1: a peer's Terminate */
	uint8_t opcode; /* RDMAP opcode of the offending segment */
	uint32_t msn;
	uint32_t stag;
	uint64_t to;
	uint32_t length;
	union dgv_sockaddr peer;
};

/* Returns up to n queued errors (>= 0). The queue keeps the newest 64; older are counted. */
int dgv_poll_errq(struct dgv_qp *qp, int n, struct dgv_async_err *out);
/* Short English text for an (layer, etype, ecode) triple; never NULL. */
const char *dgv_err_str(uint8_t layer, uint8_t etype, uint8_t ecode);

struct dgv_qp_stats {
	uint64_t tx_datagrams, tx_bytes;     /* datagrams handed to the LLP, bytes on the wire */
	uint64_t rx_datagrams, rx_bytes;
	uint64_t tx_msgs, rx_msgs;           /* completed messages */
	uint64_t tx_plain, rx_plain;         /* plain (unframed) datagrams sent and passed up */
	uint64_t crc_drops;                  /* bad CRC: dropped, never placed */
	uint64_t malformed_drops;            /* truncated, bad version, unknown opcode, absurd length */
	uint64_t placement_rejects;          /* STag/PD/rights/bounds failures */
	uint64_t no_wqe_drops;               /* a Send found no posted receive */
	uint64_t reasm_timeouts;             /* messages given up or recorded partial at timeout */
	uint64_t dup_drops;                  /* duplicate segments */
	uint64_t cq_overflows;
	uint64_t terminates_sent, terminates_rcvd;
	uint64_t errq_overflows;
	uint64_t rd_retransmits, rd_acks_sent, rd_acks_rcvd, rd_ooo_buffered, rd_window_stalls;
	uint64_t rd_peer_failures;
	uint64_t rd_timeouts;                /* retransmissions by a timer (the rest: acks, probes) */
	uint64_t rd_probes;                  /* tail-loss probes: header-only asks for an ack */
	uint64_t fault_dropped, fault_duplicated, fault_reordered, fault_corrupted;
};

int dgv_qp_stats(struct dgv_qp *qp, struct dgv_qp_stats *out);

/* A message looked at without taking it (dgv_peek). */
struct dgv_peek {
	uint32_t msg_len;      /* the whole message's length */
	uint32_t copied;       /* bytes of it copied into the caller's buffer */
	int framed;            /* 1: a datagram-iWARP Send; 0: a plain datagram (pass_plain) */
	union dgv_sockaddr src;
	socklen_t src_len;
};

/*
 * The next message waiting on a UD queue pair's socket, when one datagram holds it whole (a
 * plain datagram on a pass_plain QP, or a single-segment Send), copied into buf (len bytes at
 * most) without taking it off the wire: whoever receives next, in this process or another
 * sharing the socket, gets it, as with the kernel's MSG_PEEK. Returns 0 and fills *out,
 * -EAGAIN when nothing is waiting, -ENOMSG when the next datagram is not a whole message by
 * itself (a segment, an acknowledgement, a damaged one: take it with a posted receive), and
 * -EOPNOTSUPP where the provider cannot look (the caller then receives it).
 */
int dgv_peek(struct dgv_qp *qp, void *buf, size_t len, struct dgv_peek *out);

/*
 * At most n datagrams read from a UD queue pair's socket per progress round of an rx_hold QP
 * (0: as many as there are posted receives, the default). A socket shared with other processes
 * (after fork) sets 1, so that this process takes off the wire only what its program asked
 * for. Returns 0, -EOPNOTSUPP where the provider has no such knob.
 */
int dgv_qp_set_rx_cap(struct dgv_qp *qp, unsigned n);

/*
 * An RD queue pair's peer at `to` is known to be gone (the caller's discovery says its socket
 * closed): the sends in flight to it complete now with DGV_WC_REM_OP_ERR instead of after the
 * retransmissions' seconds, during which they hold the sender's window. Nothing happens when
 * none is in flight. Returns 0, -EINVAL, -EOPNOTSUPP (not RD, or no such knob).
 */
int dgv_qp_peer_gone(struct dgv_qp *qp, const struct sockaddr *to, socklen_t tolen);

/*
 * One datagram the caller read itself from the socket of a queue pair that adopted it
 * (DGV_CAP_RX_FEED), processed as if the QP had read it (its bytes may be changed): decoded and placed into a posted
 * receive (or, plain, passed up; or dropped and counted). So a program's blocking receive can
 * wait in the kernel's own recvfrom (one system call, the kernel's timeouts and signals)
 * instead of polling the socket and then reading it. The caller must not read more datagrams
 * than the QP has posted receives (rx_hold). Returns 0, -EINVAL, -EOPNOTSUPP.
 */
int dgv_qp_rx_feed(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
		   socklen_t srclen);

/* A whole message found in a datagram by dgv_qp_rx_take: its bytes are dgram[off, off + len). */
struct dgv_rx_msg {
	uint32_t off, len;
	bool framed; /* a Send (false: a plain datagram of a pass_plain QP) */
};

/*
 * dgv_qp_rx_feed, except that a datagram which is by itself a whole message of at most max
 * bytes, next in order (nothing of the QP waits in its receive CQ, no message of several
 * datagrams is being put together, no receive-edge fault holds datagrams), is not placed: it is
 * checked as placement would check it (CRC, header) and handed back where it lies, *out saying
 * where, with no receive consumed and no completion made. So a caller that reads the socket
 * into its own buffer takes a message with one lock and no copy into a posted receive; the QP
 * counts it received as if it had been placed. Everything else (segments of a longer message,
 * Write-Record, Read, Terminate, a datagram that fails its checks, or any datagram while order
 * asks for the queue) is processed as dgv_qp_rx_feed does. Returns 1 (taken: *out), 0 (fed),
 * -EINVAL, -EOPNOTSUPP.
 */
int dgv_qp_rx_take(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
		   socklen_t srclen, uint32_t max, struct dgv_rx_msg *out);

/*
 * Whether sends posted on an RC queue pair are still held by the provider, not yet wholly handed
 * to its transport (DGV_CAP_RC_TX_HELD): 1 when one is, 0 when every one is in it (a process
 * that exits now loses none of them). A send posted with DGV_SEND_SIGNAL_HELD and held when the
 * post returned completes with a completion. Returns 1, 0, -EINVAL, -EOPNOTSUPP.
 */
int dgv_qp_tx_held(struct dgv_qp *qp);

/*
 * An RC queue pair on an adopted TCP socket (DGV_CAP_RC_RX_FEED), read by the caller itself for
 * one read: so that a program's blocking receive waits in the kernel's own recv on its socket
 * (one system call, as natively) instead of in a poll followed by the provider's read.
 * dgv_qp_rx_claim makes the caller the socket's only reader (the provider's threads and
 * progress calls read nothing of it meanwhile) and says how many bytes *room it may read; it
 * fails -EBUSY when another caller holds it, or when the QP reads nothing now (not yet
 * established, ended, its receive path paused for want of a posted receive): wait as usual
 * then. The claim ends with dgv_qp_rx_stream_feed(qp, buf, n): n > 0 bytes read (at most
 * *room), placed and parsed as if the QP had read them; 0 the end of TCP's stream; a negative
 * n the read's -errno (-EAGAIN, -EINTR, -ECANCELED: nothing read; another: the connection's
 * error). Returns 0, -EINVAL (no claim held, n above the room: nothing taken), -EOPNOTSUPP.
 */
int dgv_qp_rx_claim(struct dgv_qp *qp, size_t *room);
int dgv_qp_rx_stream_feed(struct dgv_qp *qp, const void *buf, ssize_t n);

/* A queue pair on an adopted socket whose completions the caller's calls make
 * (dgv_cq_self_driven): the poll events besides POLLIN its waiter asks of that socket, i.e.
 * POLLOUT while the provider waits for room in it (a send TCP refused, a connect under way).
 * 0 for any other. Lock-free; read it before the last look at the CQ that precedes a wait. */
int dgv_qp_socket_events(struct dgv_qp *qp);

/*
 * A queue pair that runs on an adopted socket (DGV_CAP_ADOPT_FD) runs on fd from now on, another
 * descriptor of the same kernel socket: the caller is about to close the one the QP was given
 * while the socket lives on under another number (a program's dup, then close), so the
 * provider's threads never touch a number that may be reused once closed. The caller needs no
 * private duplicate per socket for this. Returns 0, -EINVAL (fd not the same socket, or a QP on
 * a socket of its own), -EOPNOTSUPP (the provider's QPs do not run on the caller's socket).
 */
int dgv_qp_set_fd(struct dgv_qp *qp, int fd);

/*
 * An idle RC queue pair's memory goes back to the kernel (DGV_CAP_RC_DISCARD), as the kernel
 * frees an idle socket's buffers: the whole pages inside [addr, addr + len), memory the caller
 * mapped private and anonymous and registered for this connection's transfers, read as zero
 * afterwards and take no RSS until written again. The provider does it under the QP's lock,
 * and only while nothing can still need their bytes: no completion queued on the QP's CQs (the
 * caller has taken every record and so every byte placed there), no tagged message or Send
 * partly placed, no send queued or partly handed to the transport (which reads the send
 * buffers). The caller promises the rest: that it has read what it wants of that memory. A
 * peer's Write that arrives later is placed as usual (the page comes back, zeroed, then
 * written). Returns 0 (done, or no whole page inside), -EBUSY (not idle now: try later),
 * -EINVAL, -EOPNOTSUPP (pinned memory: a device's; or not an RC queue pair).
 */
int dgv_qp_discard(struct dgv_qp *qp, void *addr, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* DGVERBS_H */
