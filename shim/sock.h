/*
 * sock.h - the taken-socket object and the pieces of sock.c, data.c, peer.c and stats.c.
 */
#ifndef DGSHIM_SOCK_H
#define DGSHIM_SOCK_H

#include <sys/un.h>

#include "shim.h"
#include "stream.h"

/* Receive and send slots: one datagram each (UDP's largest fits), in mapped pages that are
 * touched only as far as datagrams reach, reused warm-first. */
#define SHIM_SLOT 65536u
#define SHIM_RX_SLOTS 32
#define SHIM_TX_SLOTS 32
#define SHIM_MAX_DGRAM 65507u
#define SHIM_MAX_EPS 8
#define SHIM_ZC_CACHE 8
/* Default zero-copy threshold (bytes), from the crossover measured by scripts/bench-shim
 * (docs/shim.md). */
#define SHIM_ZCOPY_DEFAULT 16384

struct rules_handle;

/* A verbs context the shim carries sockets on, and what its provider can do (dgv_query_caps,
 * asked when it opened): the shim decides by these capabilities, never by which provider it
 * is. A socket points at the G slot it was placed on; the slot is re-made in a forked child. */
struct shim_pv {
	struct dgv_context *ctx;
	struct dgv_pd *pd;        /* published last (release): non-NULL means ctx and caps are set */
	struct dgv_caps caps;
	unsigned gen;             /* the G.gen it was opened in */
};

struct shim_global {
	struct dg_rules *rules;
	bool disabled;             /* configuration error or no provider: everything to the OS */
	bool trust_all;            /* DGSHIM_DISCOVERY=off: every peer speaks datagram-iWARP */
	int zcopy_default;
	unsigned gen;              /* bumped in a forked child */
	/* The provider that runs on the program's own kernel sockets (DGV_CAP_ADOPT_FD): streams,
	 * and UDP sockets no device carries. */
	struct shim_pv host;
	/* The RDMA device chosen by a socket's address, when DGSHIM_PROVIDER asks for one
	 * (docs/shim.md "Providers"); pd NULL: none (yet). */
	struct shim_pv dev;
	int want_dev;              /* DEV_NO, DEV_AUTO or DEV_YES, from DGSHIM_PROVIDER */
	char dev_why[192];         /* the last choice and its reason, for logs and `dgshim stat` */
};
extern struct shim_global G;

enum { DEV_NO = 0, DEV_AUTO = 1, DEV_YES = 2 };

/* For a log line after pv's resources failed with rc: a device's registration fails with
 * ENOMEM when it would pin more than RLIMIT_MEMLOCK (without CAP_IPC_LOCK), the usual cause. */
static inline const char *dev_res_hint(const struct shim_pv *pv, int rc)
{
	return pv == &G.dev && rc == -ENOMEM ? "; RLIMIT_MEMLOCK, `ulimit -l`, may be too low for the device" : "";
}
/* Discovery services (registry names and peer capabilities): the IWARP_MODE of the service,
 * or SVC_UDV: UD on an RDMA device (reached through the device, by SIDR, not kernel UDP). */
enum { SVC_UDV = 0x100 };

/* A received datagram waiting for the program: its bytes and its source are in its receive
 * slot (rx_data, rx_head). */
struct pend {
	uint32_t len;
	uint8_t slot;
	bool framed;
	bool peeked;                  /* the program saw it with MSG_PEEK: a forked child gets it */
};
_Static_assert(SHIM_RX_SLOTS <= 256, "struct pend's slot is a byte");

/* A receive slot starts with the datagram's source, SHIM_RX_HEAD bytes before where the
 * provider places the datagram: in the page the datagram's first bytes write anyway. Kept in
 * struct sock, the sources were 1.4 kB of every socket's resident memory (issue 14). */
struct rx_head {
	socklen_t srclen;
	union dgv_sockaddr src;
};
#define SHIM_RX_HEAD 64u
#define SHIM_RX_STRIDE (SHIM_SLOT + SHIM_RX_HEAD)
_Static_assert(sizeof(struct rx_head) <= SHIM_RX_HEAD, "a receive slot's head holds the source");

struct zc_ent {
	uintptr_t start, end;
	struct dgv_mr *mr;
	uint64_t used;
};

/* A socket's memo of one address and service until a time: peer_heard_memo's (the last source
 * told framed, and until when telling it again adds nothing) and route_memo's key */
struct peer_memo {
	union dgv_sockaddr a;
	socklen_t len;          /* 0: none */
	int svc;
	uint64_t until;         /* peer.c's coarse clock */
};

/* peer_route_memo's: the last destination routed framed (key.a, key.len, key.svc; good until
 * key.until) and its handle, while no destination lost its service (epoch) and no fork made new
 * handles (gen) */
struct route_memo {
	struct peer_memo key;
	unsigned epoch;
	unsigned gen;
	struct dgv_ah *ah;
};

struct sock {
	struct ent ent;
	pthread_mutex_t lock;         /* everything below */
	atomic_int refs;              /* descriptors naming this socket */
	/* 1 while a descriptor names it, plus one per program call in flight on it (sock_hold):
	 * the object's memory (and its stream's) lives while > 0, so a call asleep in a blocking
	 * wait while another thread closes the last descriptor wakes to a torn-down object, not
	 * freed memory */
	atomic_int holds;
	atomic_bool gone;             /* its last descriptor closed (torn down): calls in flight fail EBADF */
	struct sock *retire_next;     /* sock.c's list of objects to reuse, once holds reached 0 */
	uint64_t id;                  /* sock_id */
	unsigned gen;
	int family;
	int mode;                     /* enum iwarp_mode */
	bool explicit_mode;           /* set by the program: rules no longer apply */
	bool user_nonblock;
	bool broken;                  /* QP creation failed: the OS carries it */
	bool small;                   /* made SOCK_STREAM_SIZE bytes, without the datagram part */
	struct shim_pv *pv;           /* the context its QP is on (&G.host or &G.dev); NULL: none yet */
	bool armed;                   /* DGV_CAP_ARM_ONCE: its CQ's channel is armed (an acked event is not) */
	/* its CQ's eventfd is made, which waits watch; false only while every queue pair it had
	 * on this CQ was dgv_cq_self_driven (qp_setup makes it for any other) */
	bool cq_fd;                   /* read unlocked by sock_cqfd_made */
	/* Another process may read the same kernel socket (forked, inherited, received): the
	 * shim takes off the wire only what the program asks for, one datagram at a time, never
	 * for a readiness check, and MSG_PEEK leaves the datagram in the kernel (docs/shim.md
	 * "Fork and exec"). */
	bool shared;
	const union dgv_sockaddr *dest_hint; /* during sock_send: where the datagram goes */
	bool connected;
	bool shut_rd, shut_wr;
	int so_error;
	int zcopy;
	int rcvtimeo_ms, sndtimeo_ms;
	union dgv_sockaddr peer;
	socklen_t peerlen;

	int qfd;                      /* the program's number an adopting QP reads (DGV_CAP_ADOPT_FD), else -1 */
	int regfd;                    /* registry entry (registry.c reg_add), or -1 */
	int qp_type;
	struct dgv_qp *qp;
	struct dgv_cq *cq;            /* sends and receives */
	struct dgv_mr *rx_mr, *tx_mr;
	uint8_t *rx_area, *tx_area;

	struct ep *eps[SHIM_MAX_EPS]; /* epoll instances watching it */
	uint32_t ep_reg[SHIM_MAX_EPS]; /* its registration in each (ep_kick) */
	int neps;

	struct stream *strm;          /* SOCK_STREAM: the stream part (stream.c), else NULL */

	struct iwarp_stats *st;       /* in the shared counters file, or own */
	struct iwarp_stats own_st;
	int stat_slot;
	uint64_t base_crc, base_lost, base_rexmit, base_wtx, base_wrx, base_rej;

	/*
	 * The datagram part: last, and not there at all in a stream socket's object (sock.c
	 * sock_alloc makes that SOCK_STREAM_SIZE bytes): its slot lists, pending datagrams and
	 * memos were 0.8 kB of every carried TCP connection's resident memory (issue 14). Only
	 * a datagram socket's calls touch it (!sock_is_stream); AddressSanitizer sees a stream's
	 * object end before it.
	 */
	struct {
		/* A datagram the parent had peeked but not received when this process was forked
		 * from it: the next receive here gets it first (malloc'd, NULL: none). */
		uint8_t *carry;
		uint32_t carry_len;
		socklen_t carry_srclen;
		union dgv_sockaddr carry_src;
		uint16_t rx_free[SHIM_RX_SLOTS], rx_free_n;
		uint16_t tx_free[SHIM_TX_SLOTS], tx_free_n;
		struct pend pend[SHIM_RX_SLOTS];
		uint32_t pend_head, pend_n;
		uint64_t zc_seq, zc_done;     /* zero-copy sends posted / completed */
		struct zc_ent zc[SHIM_ZC_CACHE];
		uint32_t ops;                 /* counter-refresh pacing */
		/* RD: where each send slot goes, to resend it plain if the peer vanishes (SHIM_TX_SLOTS
		 * of them, made with the socket's first RD queue pair; NULL before: a UD socket's would
		 * be 1.5 kB of its resident memory for nothing) */
		struct shim_txd {
			union dgv_sockaddr to;
			socklen_t tolen;
			uint32_t len;
			uint64_t gone_at; /* rd_gone_check: when its destination was first seen gone (0: not) */
		} *txd;
		struct peer_memo heard;       /* consume_cq's peer_heard_memo */
		struct route_memo route;      /* dgram_send's peer_route_memo */
		uint64_t gone_check_us;       /* rd_gone_check's last look */
		bool gone_seen;               /* rd_gone_check's last look found a destination gone */
	};
};

/* A stream socket's object: struct sock up to its datagram part. */
#define SOCK_STREAM_SIZE offsetof(struct sock, carry)

/* Receive slot `slot` of s: where the provider places its datagram, and its head. */
static inline uint8_t *rx_data(const struct sock *s, uint32_t slot)
{
	return s->rx_area + (size_t)slot * SHIM_RX_STRIDE + SHIM_RX_HEAD;
}
static inline struct rx_head *rx_head(const struct sock *s, uint32_t slot)
{
	return (struct rx_head *)(void *)(s->rx_area + (size_t)slot * SHIM_RX_STRIDE);
}

/* The descriptor a wait on s watches for its completions: its CQ's eventfd, or -1 when it has
 * none (its completions are made in the program's own calls: the socket's readiness serves).
 * Needs s->lock. */
static inline int sock_cqfd(struct sock *s) { return s->cq_fd ? dgv_cq_fd(s->cq) : -1; }

/* Whether s's CQ eventfd is made, without s->lock (set once under it): a look that misses it
 * looks again at the next event. */
static inline bool sock_cqfd_made(struct sock *s) { return __atomic_load_n(&s->cq_fd, __ATOMIC_RELAXED); }

/* The two kinds of taken socket (shim.h struct sock_ops): data.c, stream.c. */
extern const struct sock_ops dgram_ops, stream_ops;
/* The datagram kind's calls that live in sock.c (its table is data.c's). */
int dgram_bound(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
int dgram_connect(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
int dgram_shutdown(struct sock *s, int fd, int how);
int dgram_setopt(struct sock *s, int fd, int level, int name, const void *v, socklen_t l);

uint64_t shim_now_us(void);
/* n bytes of fresh zeroed pages, resident only as far as they are written (munmap them), or
 * NULL. */
void *shim_pages(size_t n);
/* A detached thread of the shim's, with every signal blocked (the program's are not ours).
 * Returns 0 or -errno. */
int shim_thread(void *(*fn)(void *), void *arg);
/* One nap of a blocking socket call: poll(p, n) for at most 200 ms of *timeout_ms (< 0:
 * forever; bounded so a sleeper looks again now and then), as a cancellation point when the
 * program's thread allows it. Call without locks. Returns 0 (woken or napped; *timeout_ms
 * reduced by the time spent), -EAGAIN when *timeout_ms ran out, -EINTR on a signal. */
int shim_nap(struct pollfd *p, nfds_t n, int *timeout_ms);
int shim_default_mode(void);
void sock_put(struct sock *s);
/* Whether the socket's last descriptor was closed while a call was in flight on it: the call
 * returns -EBADF when it next looks (after a wait, at its start). */
static inline bool sock_gone(struct sock *s)
{
	return atomic_load_explicit(&s->gone, memory_order_acquire);
}
/* 1 if the kernel socket behind fd has a port (bound or autobound). */
int sock_is_bound(int fd);
int qp_setup(struct sock *s, int fd);
/* Posts every free receive slot of s's QP (none without one). Needs s->lock. */
void sock_post_rx(struct sock *s);
void qp_teardown(struct sock *s, bool all);
void sock_reset_after_fork(struct sock *s);
void stats_pull(struct sock *s);
void abstract_name(struct sockaddr_un *u, socklen_t *len, const char *name);
int registry_bind(const struct sockaddr_un *a, socklen_t al);
bool registry_exists(const struct sockaddr_un *a, socklen_t al);
/* a on this host (loopback or one of its addresses): discovery applies */
bool ip_local(const union dgv_sockaddr *a);
/* The port of an AF_INET or AF_INET6 address, host order. */
static inline unsigned port_of(const union dgv_sockaddr *a)
{
	return ntohs(a->sa.sa_family == AF_INET ? a->sin.sin_port : a->sin6.sin6_port);
}
/* s->lock, resetting a forked child's copy first. */
int sock_lock(struct sock *s);
void sock_unlock(struct sock *s);
/* A stream socket object installed at fd, mode IWARP_MODE_AUTO/RC/OFF; NULL: out of memory. */
struct sock *sock_new_stream(int fd, int domain, bool nonblock, int mode);
/* The verbs context and PD (made once per process and after fork). Returns 0 or -errno. */
int ctx_get(void);
/* The RDMA device's context for a socket at `local` (wildcard allowed) going to `dest` (or
 * NULL), as DGSHIM_PROVIDER asks (sock.c). Returns 0 (G.dev usable) or -errno. */
int dev_get(const union dgv_sockaddr *local, socklen_t ll, const union dgv_sockaddr *dest);
void zc_cache_clear(struct sock *s);
/* Drops the queued datagram the program had peeked (a forked child got it). Needs s->lock. */
void sock_drop_peeked(struct sock *s);
/* Moves finished work from the CQ to the pending and free lists. Needs s->lock. Returns the
 * number of completions taken. */
int consume_cq(struct sock *s);
void stats_note_mode(struct sock *s);
/* A stream is carried over RC now, on pv: `dgshim stat` says rc, or rc-dev on G.dev. */
void stats_note_stream(struct sock *s, const struct shim_pv *pv);

/* registry.c: this host's names (docs/shim.md "Discovery"): a kind (a UDP socket's service, a
 * TCP listener, a TCP client) and one or two ports, packed (never 0). */
enum { REG_UD = 1, REG_RD, REG_UDV, REG_RC, REG_RCV, REG_RCC, REG_RCCV };
#define REG_KEY(kind, p1, p2) \
	((uint64_t)1 << 48 | (uint64_t)(kind) << 32 | (uint64_t)((p1) & 0xffff) << 16 | ((p2) & 0xffff))
/* Names key for this process. Returns the entry's handle (>= 0) or -errno: -EADDRINUSE when a
 * living process has it, -ENOSYS when the registry cannot be used here. */
int reg_add(uint64_t key);
/* Deletes the entry reg_add returned (nothing when h < 0 or it is no longer this process's). */
void reg_del(int h);
/* Whether a living process of this network namespace has named key. */
bool reg_has(uint64_t key);
/* In a forked child: names made from now on are the child's own (registry.c). */
void reg_after_fork(void);
/* The key of a UDP socket's service svc (IWARP_MODE_UD/RD, SVC_UDV) on port. */
uint64_t reg_key(int svc, unsigned port);

/* RD: every send slot held by a destination on this host whose RD socket is gone (its registry
 * name vanished: closed, or its process died), seen so by a slot for 20 ms, is failed (dgv_qp_peer_gone), not after
 * the retransmissions' seconds during which it held the socket's sends to everyone. Looks at
 * most every 10 ms. Needs s->lock. */
void rd_gone_check(struct sock *s);

/* peer.c: what a destination speaks. */
void peer_init(void);
void peer_after_fork(void);
/* For a framed send to `to` with service svc (IWARP_MODE_UD/RD, SVC_UDV): an address handle
 * (of the device's context for SVC_UDV) when the destination speaks it, else NULL (send
 * plain). wait_ms 0: never blocks; else, while a question to the destination's host is out,
 * waits up to wait_ms for its answer (RD). Takes a stripe lock. */
struct dgv_ah *peer_route(const union dgv_sockaddr *to, socklen_t tolen, int svc, int wait_ms);
/* peer_route through the socket's memo m: the destination routed last, within 10 ms, while no
 * destination lost its service (a plain datagram heard, a failure, a lease run out, an answer
 * saying less), takes no lock; what the memo may hold back is at most 10 ms of the time-based
 * rechecks (a local registry look, a remote lease), and handles outlive a forgotten
 * destination by 100 ms or more (retire). The caller serializes m (the socket's lock). */
struct dgv_ah *peer_route_memo(struct route_memo *m, const union dgv_sockaddr *to, socklen_t tolen, int svc,
			       int wait_ms);
/* Whether pv's provider has capability f (enum dgv_cap_flag); false for no context yet. */
static inline bool pv_can(const struct shim_pv *pv, uint32_t f) { return pv && (pv->caps.flags & f); }
/* The same for the context a socket's QP is on. */
static inline bool sock_can(const struct sock *s, uint32_t f) { return pv_can(s->pv, f); }

/* Arms cq's notification before a wait. Without DGV_CAP_ARM_ONCE: every time (cheap, and
 * idempotent). With it the channel fires once per arming and only for completions after it,
 * so it is armed only when it is not already (*armed; an acknowledged event disarms it: the
 * caller clears *armed then). Returns true when such a CQ was armed just now: the caller looks
 * at the CQ once more, since what completed before the arming raises nothing. */
static inline bool cq_arm(struct dgv_cq *cq, const struct shim_pv *pv, bool *armed)
{
	if (!pv_can(pv, DGV_CAP_ARM_ONCE)) {
		dgv_req_notify_cq(cq, 0);
		return false;
	}
	if (*armed || dgv_req_notify_cq(cq, 0))
		return false;
	*armed = true;
	return true;
}

/* The queue pair type a UDP socket in mode gets. */
static inline int qp_type_of(int mode) { return mode == IWARP_MODE_RD ? DGV_QPT_RD : DGV_QPT_UD; }
/* The discovery service a UDP socket's QP serves: its mode's, or SVC_UDV for UD on a provider
 * that reaches peers by its own address resolution. */
static inline int sock_svc(const struct sock *s)
{
	return s->qp_type == DGV_QPT_RD ? IWARP_MODE_RD : sock_can(s, DGV_CAP_UD_SIDR) ? SVC_UDV : IWARP_MODE_UD;
}

/* The PD of the socket's queue pair. */
static inline struct dgv_pd *sock_pd(const struct sock *s) { return s->pv->pd; }
/* A datagram came from `from`: framed (it speaks datagram-iWARP) or plain (it may have
 * stopped). */
void peer_heard(const union dgv_sockaddr *from, socklen_t fromlen, bool framed, int svc);
/* The same for a socket's datagrams, through its memo m: a framed datagram from the source the
 * socket told last, within 10 ms of telling it, tells nothing new (the lease it renews is 80
 * ms or more) and takes no lock. The caller serializes m (the socket's lock). */
void peer_heard_memo(struct peer_memo *m, const union dgv_sockaddr *from, socklen_t fromlen, bool framed,
		     int svc);
/* The destinations known now and forgotten so far (idle for DGSHIM_DEST_IDLE_MS), for the exit
 * summary. Takes each stripe's lock that is free. */
void peer_totals(unsigned *known, unsigned long long *gone);
/* An RD peer failed: stop sending it framed until discovery says otherwise. */
void peer_failed(const union dgv_sockaddr *to, socklen_t tolen);

/* A destination on another host: whether its port serves svc (IWARP_MODE_UD/RD, SVC_UDV or
 * IWARP_MODE_RC: a carried listener), its discovery port said so within wait_ms for a question
 * outstanding. A destination on this host or one a rules line decides returns at once.
 * Returns 1 or 0. Takes a stripe lock. */
int peer_remote_wait(const union dgv_sockaddr *to, socklen_t tolen, int svc, int wait_ms);

/* disco.c: discovery between hosts (wire.h struct dg_disco). */
#define DISCO_LEASE_MS 80      /* how long an answer may be believed (asked again at a quarter): with
                                * the answer's way, the window after a restart stays under 100 ms */
/* An RD datagram to another host waits this long at most for an outstanding discovery answer
 * (the asker's own "no answer" bound, ASK_WAIT_US in peer.c), instead of going plain. */
#define RD_ANSWER_WAIT_MS 200
typedef void (*disco_answer_fn)(const union dgv_sockaddr *from, unsigned port, uint64_t nonce, uint8_t caps,
				uint32_t lease_ms);
/* DGSHIM_DISCOVERY_PORT (default 18517; 0: no discovery between hosts). */
void disco_init(void);
void disco_after_fork(void);
unsigned disco_port(void);
/* This process answers questions on the host's discovery port from now on (idempotent). */
void disco_serve(void);
uint64_t disco_nonce(void);
/* Asks to's host whether to's port speaks. Returns 0 or -errno. Never blocks. */
int disco_ask(const union dgv_sockaddr *to, uint64_t nonce);
/* Reads the answers waiting, each to fn. Returns how many. */
int disco_read(disco_answer_fn fn);
/* Waits up to ms for an answer on the asking socket of family. */
int disco_wait(int family, int ms);
uint64_t disco_drops(void);
/* Questions this process sent to other hosts' discovery ports. */
uint64_t disco_asks(void);

/* stats.c: counters readable from outside (/dev/shm/dgshim.<pid>). */
void stats_init(void);
void stats_after_fork(void);
struct iwarp_stats *stats_slot(struct sock *s, int fd);
void stats_release(struct sock *s);

/* events.c */
void ev_after_fork(void);

#endif
