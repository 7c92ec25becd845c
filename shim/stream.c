/*
 * stream.c - TCP sockets carried over RC queue pairs (iWARP on the program's own TCP connection).
 *
 * Who speaks it. A preloaded listener binds the abstract name "dgshim/rc/<port>"; a preloaded
 * client that finds that name (destination on this host) binds "dgshim/rcc/<cport>-<sport>"
 * before its TCP connect, then runs MPA on the connection. The server's accept looks the
 * client's name up for each connection: found, the connection is iWARP (it reads the MPA
 * Request); not found, the program gets the plain TCP connection untouched. So an unmodified
 * peer, client or server, never sees an iWARP byte, and nobody waits to learn who speaks first.
 * Remote destinations are iWARP only when a rules line says mode=rc for them.
 *
 * The byte stream. Each side registers a receive ring (power of two) followed by control slots
 * and tells the peer where they are in the MPA private data (struct stream_hello). send()
 * copies into a local ring and posts RDMA Write-Records into the peer's ring at the same stream
 * position modulo its size; the peer's record completion says which bytes arrived (paper 000:
 * Write-Record on a reliable transport needs no posted receive). The reader returns credit
 * (bytes consumed, records polled) with a small Write-Record into the writer's control slots
 * when a quarter of the ring or of the record budget has been used: the writer never overruns
 * the ring or the reader's CQ. FIN travels in a control message (with the stream's total
 * length), so half-close works without closing TCP, whose direction still carries credit.
 * One receive stays posted as a sentinel: a connection that fails flushes it, which wakes a
 * waiter on the CQ descriptor, the only descriptor a poll needs for a carried stream.
 *
 * Locking: everything here runs under s->lock (sock.c), provider locks nest inside.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "rules.h"
#include "sock.h"
#include "stream_wire.h"
#include "wire.h"

#define RING_DEFAULT (512u << 10)
#define RING_MIN (16u << 10)
#define RING_MAX (64u << 20)
#define CTL_SLOTS 16u           /* with CTL_SLOT_SZ: a quarter page (res_setup's layout) */
#define CTL_SLOT_SZ 64u
#define MAX_RECS 256u          /* data records a peer may have in flight towards us */
#define SQ_DEPTH 512u
#define CQ_DEPTH (MAX_RECS + SQ_DEPTH + CTL_SLOTS + 64u)
#define CHUNK (64u << 10)      /* one Write-Record at most: the reader sees data as it streams */
/* The MPA exchange of a connect: the server's shim answers it when the program accepts, and a
 * busy server accepts late (SIPp's UAS at 500 new connections a second fell 10 s behind, where
 * the provider's 10 s deadline failed the connects): the kernel's connect does not wait for
 * accept at all, so ours waits as long as a connect to an unanswering host would (~60 s) */
#define MPA_WAIT_MS 60000u
#define CONNECT_WAIT_MS (MPA_WAIT_MS + 5000) /* a blocking connect: the provider's deadline first */
#define DEV_CONNECT_WAIT_MS 15000 /* a blocking connect on a device: the server's device connection */
#define OUTQ_STALL_US 200000   /* close: TCP's send queue unchanged this long, the peer reads no more */
#define FLUSH_EVENT_US 2000000 /* device: a flush's connection event, awaited this long at most */
#define ACCEPT_WAIT_MS 5000    /* the MPA Request of a connection found to be ours */
/* An accepted connection of ours that the program has not used this long is answered by the
 * shim's answering thread, unless the process forked meanwhile (the child answers it). */
#define ANSWER_AFTER_MS 100
/* ... and looked at again this often while the client's MPA Request is not whole yet */
#define LATE_LOOK_MS 20
/* A remote client's first bytes: how long the shim waits for them when the program's first
 * use of the connection comes before they did (a server that speaks first); a preloaded
 * client sends its MPA Request as soon as TCP is up, so the wait is about one round trip. */
#define PROBE_WAIT_MS 20
/* A connect to another host waits this long at most for its discovery port's first answer
 * (one round trip; connects within the answer's lease find it cached). */
#define DISCO_CONNECT_WAIT_MS 10

enum { WR_DATA = 1, WR_CTL = 2, WR_SENTINEL = 3 };
/* A data or control Write-Record's wr_id: WR_SEND | (data records posted so far) << 8 | kind.
 * Any of them completing retires every data record posted before it (RC completes in order),
 * which lets a device stream leave most data records unsignaled: a send completion on an armed
 * CQ would wake a program waiting for the reply once more per message. */
#define WR_SEND (1ull << 63)
#define SIGNAL_EVERY 16u /* device: one data record in this many asks for a completion */
/* DGV_SEND_NOW: a write of at most this many bytes in at most NOW_SGE pieces is offered to the
 * provider from the program's buffer (the soft provider's one-FPDU post takes up to ~1.5 kB) */
#define NOW_MAX 1400u
#define NOW_SGE 2 /* the stream QP's max_sge (rc_attr) */
/* A device consumes a posted receive per Write-Record (docs/design.md, "The ibverbs
 * provider"): a device stream keeps one posted per record the peer may have in flight (data and
 * control), each with its own 64-byte buffer (an iWARP record's descriptor lands there), wr_id
 * WR_DREC + index, reposted as its record is taken. */
#define WR_DREC 0x100u
#define NDREC (MAX_RECS + CTL_SLOTS + 8u)
#define DREC_SZ 64u
#define RV_WAIT_MS 5000        /* a device listener's connection request for a rendezvous */
#define RV_STASH 16            /* requests waiting for their accept() on a device listener */
/* Threads asleep at once in a poll or blocking call on one stream with their bells: more wait
 * in slices of BELL_SLICE_MS (a stream watched by that many threads is rare) */
#define STREAM_BELLS 4
enum { CHECK_IO = 1, CHECK_QUEUED = 2, LOOK_LAZY = 3 }; /* struct stream's look */

struct stream {
	enum stream_state state;
	int err;                 /* error to report once to recv/send (then EOF / EPIPE) */
	int so_error;            /* SO_ERROR of a failed non-blocking connect */
	bool connect_pending;    /* EINPROGRESS given: the next connect after success returns 0 */
	bool nodelay_mine;       /* carried: TCP_NODELAY is answered from nodelay, not the kernel */
	int nodelay;             /* TCP_NODELAY as the program set it (the provider sets it on TCP) */
	int lowat;               /* SO_RCVLOWAT (the kernel's value; 0 or 1: any byte) */
	bool counted;            /* in the conns total */
	/* SS_ANSWER from a client on another host: no registry says whether it speaks, so its
	 * first bytes do (an MPA Request, or anything else: plain) */
	bool probe;
	int mode;                /* IWARP_MODE_AUTO, _RC or _OFF */
	struct dgv_cm_channel *ch;
	struct dgv_qp *qp;
	struct dgv_cq *cq;
	/* qfd: the program's descriptor the QP runs on (it moves when the program closes that
	 * number and keeps another, stream_fd_closing); regfd: registry entry (listener "rc",
	 * client "rcc"), or -1 */
	int qfd, regfd;
	bool qfd_own;            /* qfd is a private duplicate (stream_fd_closing's last resort) */
	bool rx_wait_off;        /* its socket is non-blocking at the kernel: rx_wait cannot wait */
	/* listener: its port is named (by this process, or by the parent before a fork: the
	 * child's accepts still expect MPA from clients that saw the name) */
	bool named;
	bool budget_off;         /* listener: name withdrawn at the descriptor budget (own_room) */
	int lport_held;          /* listener: the port counted in ports_held (0: none) */
	struct shim_pv *pv;      /* the context its QP and CQ are on (res_setup) */
	/* pv's provider sets connections up itself (no DGV_CAP_ADOPT_FD: a device's rdma_cm):
	 * the program's TCP connection only meets the peer there (rendezvous) */
	bool own_cm;
	bool rv_wait;            /* client: the server's stream_rv has not come yet */
	bool armed;              /* device: the CQ's channel is armed (an event, once acked, is not) */
	bool cm_due;             /* device: a completion failed, connection events to look at */
	bool cm_estab;           /* device: rdma_cm's ESTABLISHED has been taken */
	uint8_t cm_skip;
	uint8_t *drec;           /* NDREC receive buffers (in the out region) */
	int dregfd;              /* the device name: listener "rcv", client "rccv" */
	int wfd;                 /* device: an epoll set of the CQ's and the channel's descriptors,
				  * the one a poll or epoll of the program waits on */
	struct dgv_listener *dlis; /* listener: the device's */
	struct dgv_cm_channel *lch;
	union dgv_sockaddr dlis_addr;
	/* device connection requests that came before their accept() */
	/* a device listener's requests that came before their accept(): RV_STASH entries, made
	 * by the first such request (900 bytes every stream would carry otherwise) */
	struct rv_stashed { struct dgv_conn_req *req; struct stream_dhello dh; } *stash;
	unsigned stash_next;
	uint64_t cookie;         /* client: echoed in its connection request */
	uint8_t *area;
	size_t area_len;
	struct dgv_mr *mr_in, *mr_ctl, *mr_out;
	uint32_t ring;           /* our receive ring and send ring size */
	uint8_t *rx, *tx, *ctl_in, *ctl_out, *sentinel;
	/* the peer's ring, from its hello (host order) */
	uint32_t p_ring, p_stag, p_slots, p_max_recs;
	uint64_t p_ring_addr, p_ctl_addr;
	/* sending */
	uint64_t sent, peer_consumed, recs_sent, peer_recs;
	uint32_t tx_out, ctl_out_n, ctl_seq;
	uint64_t data_seq, data_done; /* data records posted, and retired by a completion */
	uint64_t sig_seq;             /* the last data record posted signaled */
	bool fin_sent, shut_wr;
	bool ctl_owed;           /* a control message could not be posted (SQ full): retry */
	/* receiving */
	uint64_t arrived, consumed, recs_polled, adv_consumed, adv_recs;
	bool peer_fin, peer_close, tcp_down, shut_rd;
	/* the receives flushed (the connection went down) while connection events were still
	 * queued: an orderly TCP end among them (a peer that exited: its kernel's FIN) is the
	 * end of stream, as natively; progress() decides after reading them */
	bool flush_seen;
	/* a device's receives flushed before rdma_cm queued the event that says how the
	 * connection ended (siw flushes as soon as the peer's TCP closes; the event follows from
	 * a work queue): until this time (shim_now_us) progress() waits for that event instead of
	 * taking the flush for a reset. 0: no such wait. */
	uint64_t flush_wait_us;
	bool peer_abort;         /* the peer announced an abortive close (CTL_ABORT) */
	bool reset;              /* ended as by a TCP reset (readiness: both directions over) */
	bool end_counted;        /* in the rc_reset or rc_peer_gone total */
	bool closing;            /* closed by the program, read by the closing thread (closing_add) */
	uint64_t fin_total;
	/* Waking another thread's wait (shim.h "Waking a waiter"): completions and connection
	 * events taken so far (progress compares), bumped by tell_waiters when a call took some
	 * while a wait watches the stream (read without the lock by epoll rescans), and the
	 * bells of the polls and blocking calls asleep on it now */
	uint64_t took;
	uint8_t look;            /* the kind of look drain_cq is asked for (CHECK_IO...), else 0 */
	_Atomic uint32_t kicks;
	uint8_t nbells;
	struct bell *bells[STREAM_BELLS];
	/* The idle list ("Giving an idle stream's memory back" below): its links and idle_seen
	 * under R.lock; idle_state written under R.lock, and changed from IDLE_LOOKED only under
	 * s->lock too, so that idle_touch (s->lock) may read it alone; act bumped by each send and
	 * receive of the program's (s->lock), read by the sweep */
	struct stream *idle_prev, *idle_next;
	struct sock *idle_s;
	_Atomic uint8_t idle_state;
	uint8_t idle_tries;
	_Atomic uint32_t act;
	uint32_t idle_seen;
};

static struct {
	_Atomic uint64_t conns, plain, tx_bytes, rx_bytes, dev, resets, peer_gone, no_room, idle_freed;
} T;

/* Counts how a carried connection ended, once per connection (the first cause seen). */
static void count_end(struct stream *t, _Atomic uint64_t *total)
{
	if (t->counted && !t->end_counted) {
		t->end_counted = true;
		atomic_fetch_add(total, 1);
	}
}

void stream_totals(struct stream_totals *t)
{
	t->conns = atomic_load(&T.conns), t->plain = atomic_load(&T.plain), t->dev = atomic_load(&T.dev);
	t->tx_bytes = atomic_load(&T.tx_bytes), t->rx_bytes = atomic_load(&T.rx_bytes);
	t->resets = atomic_load(&T.resets), t->peer_gone = atomic_load(&T.peer_gone);
	t->no_room = atomic_load(&T.no_room);
	t->idle_freed = atomic_load(&T.idle_freed);
}


/* STREAM_RING from the environment (bytes, rounded up to a power of two), once. Threads may
 * compute it at the same time (an accept in one program thread, a connect in another):
 * the result is the same, so v is only read and stored atomically (ThreadSanitizer). */
static uint32_t ring_size(void)
{
	static uint32_t v;
	uint32_t have = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (have)
		return have;
	uint32_t r = RING_DEFAULT;
	const char *e = dg_env_str(DG_ENV_STREAM_BUF);
	if (e) {
		char *end;
		unsigned long x = strtoul(e, &end, 10);
		if (*end == 'k' || *end == 'K')
			x <<= 10, end++;
		else if (*end == 'm' || *end == 'M')
			x <<= 20, end++;
		if (*end || x < RING_MIN || x > RING_MAX)
			dg_log_always("DGSHIM_STREAM_BUF=%s: expected %u..%u bytes (k/M suffix allowed); using %u",
				      e, RING_MIN, RING_MAX, RING_DEFAULT);
		else
			for (r = RING_MIN; r < x; r <<= 1)
				;
	}
	__atomic_store_n(&v, r, __ATOMIC_RELAXED);
	return r;
}

int stream_attach(struct sock *s)
{
	struct stream *t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	t->qfd = -1, t->regfd = -1, t->dregfd = -1, t->wfd = -1;
	t->mode = s->mode;
	s->strm = t;
	s->ent.ops = &stream_ops;
	return 0;
}

/* ------------------------------------------------------------------ resources */

/* How many named listeners this process holds per port (a forked child's copy counts the
 * listeners it inherited; it holds them too): a connect to one of them stays plain. */
static _Atomic uint8_t ports_held[65536];

static void port_held(int port, int d)
{
	if (port > 0 && port < 65536)
		atomic_fetch_add(&ports_held[port], (uint8_t)d);
}

static size_t ctl_bytes(void) { return (size_t)CTL_SLOTS * CTL_SLOT_SZ; }

/* A new epoll descriptor at a high number (close-on-exec), or -errno. */
static int high_fd_epoll(void)
{
	int e = real.epoll_create1(EPOLL_CLOEXEC);
	return e < 0 ? -errno : fd_to_high(e);
}

/* The ring area, its two regions, the CQ and the channel, on pv (&G.host, or &G.dev that
 * dev_get has opened). Returns 0 or -errno. */
static int res_setup(struct stream *t, struct shim_pv *pv)
{
	/* its descriptors: the CQ's event descriptor (which the soft provider's connection
	 * events share); on a device also the channel's, and an epoll descriptor with the
	 * provider's own socket. The QP runs on the program's own descriptor (no duplicate). */
	/* the context first: pv's capabilities are set when it opens (another thread may be
	 * opening it now) */
	int rc = ctx_get();
	if (rc)
		return rc;
	if (!own_room(pv_can(pv, DGV_CAP_ADOPT_FD) ? 1 : 4, "a TCP connection"))
		return -EMFILE;
	t->pv = pv;
	t->own_cm = !pv_can(pv, DGV_CAP_ADOPT_FD);
	struct dgv_context *ctx = pv->ctx;
	struct dgv_pd *pd = pv->pd;
	bool drec = pv_can(pv, DGV_CAP_RC_WREC_AS_SEND); /* a receive per record */
	t->ring = ring_size();
	/* [slots out | slots in | receive ring ...][... send ring][sentinel][device records]:
	 * both directions' control slots (1 kB each) and the receive ring's first 2 kB share the
	 * area's first page, so a connection that got its peer's hello, sent its own and received
	 * a few bytes has written one page of the receive side, not two; the send ring starts on
	 * the page the receive ring ends on (issue 14: memory per idle connection). The rings need
	 * no page alignment: the peer writes at addresses its hello names, inside the regions.
	 * Three regions: the peer writes [slots in, receive ring] (mr_in); control messages go out
	 * of the slots out (mr_ctl), data of the send ring, and receives land in the sentinel
	 * and the device records (mr_out): no byte is registered twice (a device pins each
	 * region's pages). */
	size_t ctl = ctl_bytes();
	t->area_len = 2 * ctl + t->ring + t->ring + 4096 + (drec ? NDREC * DREC_SZ : 0);
	void *p = mmap(NULL, t->area_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	t->area = p;
	t->ctl_out = t->area;
	t->ctl_in = t->ctl_out + ctl;
	t->rx = t->ctl_in + ctl;
	t->tx = t->rx + t->ring;
	t->sentinel = t->tx + t->ring;
	t->drec = drec ? t->sentinel + 4096 : NULL;
	size_t out = (size_t)(t->area + t->area_len - t->tx);
	if ((rc = dgv_reg_mr(pd, t->ctl_in, ctl + t->ring, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE,
			     &t->mr_in)) ||
	    (rc = dgv_reg_mr(pd, t->ctl_out, ctl, DGV_ACCESS_LOCAL_WRITE, &t->mr_ctl)) ||
	    (rc = dgv_reg_mr(pd, t->tx, out, DGV_ACCESS_LOCAL_WRITE, &t->mr_out)) ||
	    (rc = dgv_create_cq(ctx, (int)(CQ_DEPTH + (drec ? NDREC + SQ_DEPTH : 0)), &t->cq)))
		return rc;
	/* connection events through the CQ's descriptor where the provider can: one descriptor
	 * per connection fewer (a device's rdma_cm channel is a descriptor of its own) */
	if ((rc = dgv_cm_create_channel_on_cq(ctx, t->cq, &t->ch)) == -EOPNOTSUPP)
		rc = dgv_cm_create_channel(ctx, &t->ch);
	if (rc)
		return rc;
	if (pv_can(pv, DGV_CAP_BACKGROUND))
		dgv_cq_notify_background(t->cq, 1);
	if (!t->own_cm)
		return 0;
	/* its own CM's connection events (ESTABLISHED, DISCONNECTED) are not completions: one
	 * descriptor for both, so that a program's epoll registration made while connecting
	 * still wakes for data */
	if ((t->wfd = high_fd_epoll()) < 0)
		return t->wfd;
	struct epoll_event e = {.events = EPOLLIN};
	if (real.epoll_ctl(t->wfd, EPOLL_CTL_ADD, dgv_cq_fd(t->cq), &e) ||
	    real.epoll_ctl(t->wfd, EPOLL_CTL_ADD, dgv_cm_channel_fd(t->ch), &e))
		return -errno;
	return 0;
}

static void idle_forget(struct stream *t);

static void res_free(struct stream *t)
{
	idle_forget(t);
	if (t->qp)
		dgv_destroy_qp(t->qp), t->qp = NULL;
	if (t->ch)
		dgv_cm_destroy_channel(t->ch), t->ch = NULL;
	if (t->cq)
		dgv_destroy_cq(t->cq), t->cq = NULL, t->armed = false;
	if (t->mr_in)
		dgv_dereg_mr(t->mr_in), t->mr_in = NULL;
	if (t->mr_ctl)
		dgv_dereg_mr(t->mr_ctl), t->mr_ctl = NULL;
	if (t->mr_out)
		dgv_dereg_mr(t->mr_out), t->mr_out = NULL;
	if (t->area)
		munmap(t->area, t->area_len), t->area = NULL;
	if (t->qfd >= 0 && t->qfd_own)
		own_close(t->qfd);
	t->qfd = -1, t->qfd_own = false; /* else the program's: it closes it */
	if (t->regfd >= 0)
		reg_del(t->regfd), t->regfd = -1, t->named = false;
	if (t->lport_held)
		port_held(t->lport_held, -1), t->lport_held = 0;
	if (t->dregfd >= 0)
		reg_del(t->dregfd), t->dregfd = -1;
	if (t->wfd >= 0)
		own_close(t->wfd), t->wfd = -1;
	for (int i = 0; t->stash && i < RV_STASH; i++)
		if (t->stash[i].req)
			dgv_reject(t->stash[i].req, NULL, 0);
	free(t->stash);
	t->stash = NULL;
	if (t->dlis)
		dgv_listener_destroy(t->dlis), t->dlis = NULL;
	if (t->lch)
		dgv_cm_destroy_channel(t->lch), t->lch = NULL;
}

static void hello_make(const struct stream *t, struct stream_hello *h)
{
	h->magic = htobe32(STREAM_MAGIC);
	h->ring_size = htobe32(t->ring);
	h->ring_stag = htobe32(t->mr_in->rkey);
	h->ctl_slots = htobe32(CTL_SLOTS);
	h->ring_addr = htobe64((uint64_t)(uintptr_t)t->rx);
	h->ctl_addr = htobe64((uint64_t)(uintptr_t)t->ctl_in);
	h->max_recs = htobe32(MAX_RECS);
	h->rsvd = 0;
}

/* Takes the peer's hello. Returns 0 or -EPROTO (not ours, or nonsense). */
static int hello_take(struct stream *t, const uint8_t *pd, unsigned len)
{
	struct stream_hello h;
	if (len < sizeof h)
		return -EPROTO;
	memcpy(&h, pd, sizeof h);
	uint32_t ring = be32toh(h.ring_size), slots = be32toh(h.ctl_slots), recs = be32toh(h.max_recs);
	if (be32toh(h.magic) != STREAM_MAGIC || ring < RING_MIN || ring > RING_MAX || (ring & (ring - 1)) ||
	    !slots || slots > 4096 || !recs) {
		DG_WARN("stream: the peer's hello is not a dgshim stream hello (magic %08x ring %u slots %u)",
			be32toh(h.magic), ring, slots);
		return -EPROTO;
	}
	t->p_ring = ring, t->p_slots = slots, t->p_max_recs = recs;
	t->p_stag = be32toh(h.ring_stag);
	t->p_ring_addr = be64toh(h.ring_addr);
	t->p_ctl_addr = be64toh(h.ctl_addr);
	return 0;
}

/* Posts device receive i (one record's). Returns 0 or -errno. */
static int post_drec(struct stream *t, uint32_t i)
{
	struct dgv_sge sge = {(uint64_t)(uintptr_t)(t->drec + (size_t)i * DREC_SZ), DREC_SZ, t->mr_out->lkey};
	struct dgv_recv_wr wr = {.wr_id = WR_DREC + i, .sg_list = &sge, .num_sge = 1}, *bad;
	return dgv_post_recv(t->qp, &wr, &bad);
}

/* The sentinel receive, or with DGV_CAP_RC_WREC_AS_SEND every record's receive (each of them
 * is a sentinel as well, flushed when the connection fails). */
static void post_sentinel(struct stream *t)
{
	if (t->drec) {
		for (uint32_t i = 0; i < NDREC; i++)
			if (post_drec(t, i))
				break;
		return;
	}
	struct dgv_sge sge = {(uint64_t)(uintptr_t)t->sentinel, 64, t->mr_out->lkey};
	struct dgv_recv_wr wr = {.wr_id = WR_SENTINEL, .sg_list = &sge, .num_sge = 1}, *bad;
	dgv_post_recv(t->qp, &wr, &bad);
}

static struct dgv_qp_init_attr rc_attr(struct stream *t, struct sock *s)
{
	/* DGV_CAP_RC_WREC_AS_SEND: a Write-Record may take two send queue entries, and a
	 * receive per record; else the sentinel is the one receive ever posted (a queue of 4 was
	 * 432 bytes more of every connection end) */
	bool drec = t->drec != NULL;
	struct dgv_qp_init_attr a = {.qp_type = DGV_QPT_RC, .send_cq = t->cq, .recv_cq = t->cq,
				     .max_send_wr = drec ? 2 * SQ_DEPTH : SQ_DEPTH,
				     .max_recv_wr = drec ? NDREC + 4 : 1, .max_sge = 2, .cm_channel = t->ch,
				     .cm_user = s};
	/* rx_hold: only our calls read the connection (the thread writes for it), so a wait on
	 * it needs the program's own descriptor alone while TCP takes every send (stream_self) */
	if (!t->own_cm)
		a.use_adopt_fd = 1, a.adopt_fd = t->qfd, a.rx_hold = 1;
	return a;
}

/* ------------------------------------------------------------------ control messages */

/* Posts a control message with the current credit (and flags). Returns 0 or -errno; an SQ
 * without room leaves it owed. */
static int ctl_send(struct stream *t, uint32_t flags)
{
	if (!t->qp || t->tcp_down || !t->p_ring)
		return -ENOTCONN;
	/* a slot is not reused, ours or the peer's, before its write completed */
	if (t->ctl_out_n >= CTL_SLOTS || t->ctl_out_n >= t->p_slots) {
		t->ctl_owed = true;
		return -EAGAIN;
	}
	uint32_t seq = t->ctl_seq;
	uint8_t *slot = t->ctl_out + (size_t)(seq % CTL_SLOTS) * CTL_SLOT_SZ;
	struct stream_ctl c = {.consumed = htobe64(t->consumed), .recs = htobe64(t->recs_polled),
			       .fin_total = htobe64(t->sent), .flags = htobe32(flags), .seq = htobe32(seq)};
	memcpy(slot, &c, sizeof c);
	struct dgv_sge sge = {(uint64_t)(uintptr_t)slot, sizeof c, t->mr_ctl->lkey};
	struct dgv_send_wr wr = {.wr_id = WR_SEND | t->data_seq << 8 | WR_CTL, .sg_list = &sge, .num_sge = 1,
				 .opcode = DGV_WR_WRITE_RECORD, .send_flags = DGV_SEND_SIGNALED,
				 .remote_addr = t->p_ctl_addr + (uint64_t)(seq % t->p_slots) * CTL_SLOT_SZ,
				 .rkey = t->p_stag},
			   *bad;
	int rc = dgv_post_send(t->qp, &wr, &bad);
	if (rc) {
		t->ctl_owed = true;
		return rc;
	}
	t->ctl_seq++;
	t->ctl_out_n++;
	t->ctl_owed = false;
	t->adv_consumed = t->consumed, t->adv_recs = t->recs_polled;
	return 0;
}

/* Whether the writer is owed a credit: a quarter of the ring or of its record budget used up
 * since the last one, or a control message that could not be posted. */
static bool credit_due(const struct stream *t)
{
	return t->ctl_owed || t->consumed - t->adv_consumed >= t->ring / 4 ||
	       t->recs_polled - t->adv_recs >= MAX_RECS / 4;
}

/* Sends the writer its credit when it is due. */
static void credit_maybe(struct stream *t)
{
	/* a peer that closed reads no credit, and bytes reaching its closed socket reset it */
	if (t->state != SS_ESTAB || t->tcp_down || t->peer_close)
		return;
	if (credit_due(t))
		ctl_send(t, t->fin_sent ? CTL_FIN : 0);
}

static void fail(struct stream *t, int err, const char *why)
{
	/* a connection the program closed ended by its close (what the peer does after it, a
	 * reset as its process exits, is the closing thread's business alone) */
	if (!t->err && !t->peer_fin && !t->closing) {
		t->err = err;
		t->reset = true;
		count_end(t, &T.resets);
		DG_INFO("stream: connection ends: %s (%s)", why, strerror(err));
	}
	t->tcp_down = true;
}

/* ------------------------------------------------------------------ progress */

static void take_ctl(struct stream *t, const struct dgv_record *rec)
{
	uint64_t off = rec->base - (uint64_t)(uintptr_t)t->ctl_in;
	if (rec->length != sizeof(struct stream_ctl) || off % CTL_SLOT_SZ || off >= ctl_bytes()) {
		fail(t, EPROTO, "control record outside the control slots");
		return;
	}
	struct stream_ctl c;
	memcpy(&c, t->ctl_in + off, sizeof c);
	uint64_t consumed = be64toh(c.consumed), recs = be64toh(c.recs);
	uint32_t flags = be32toh(c.flags);
	if (consumed > t->sent || recs > t->recs_sent) {
		fail(t, EPROTO, "peer acknowledged bytes never sent");
		return;
	}
	if (consumed > t->peer_consumed)
		t->peer_consumed = consumed;
	if (recs > t->peer_recs)
		t->peer_recs = recs;
	if (flags & CTL_FIN) {
		uint64_t total = be64toh(c.fin_total);
		if (!t->peer_fin) {
			t->peer_fin = true;
			t->fin_total = total;
		}
	}
	if (flags & CTL_CLOSE)
		t->peer_close = true;
	if (flags & CTL_ABORT)
		t->peer_abort = true;
}

static void take_data(struct sock *s, struct stream *t, const struct dgv_record *rec)
{
	/* the one decoder the fuzz harness checks (tests/fuzz/fuzz_stream.c), which also refuses
	 * a record crossing the ring's end (placed beyond the ring, into the control slots) */
	if (stream_data_check(rec->base, rec->length, (uint64_t)(uintptr_t)t->rx, (uint32_t)t->ring, t->arrived,
			      t->consumed, t->peer_fin, t->fin_total)) {
		fail(t, EPROTO, "data record out of stream order, beyond the credit given or across the ring's end");
		return;
	}
	t->arrived += rec->length;
	t->recs_polled++;
	s->st->rx_framed++;
	s->st->rx_framed_bytes += rec->length;
}

/* Takes every completion queued so far. Returns how many. */
static int drain_cq(struct sock *s, struct stream *t)
{
	struct dgv_wc wc[16];
	int n, got = 0;
	/* the provider reads TCP inside a poll that finds the CQ empty: one that found it holding
	 * completions (our sends') did not, so the poll is repeated until one asked. What woke a
	 * wait must be read (an edge-triggered wait gets no second edge for it), and our peer's
	 * control bytes must not wait in TCP (a process killed with them unread resets the
	 * connection, and its kernel drops what it still had to send). A check without I/O of
	 * its own (CHECK_QUEUED) takes only what is queued; a receive (LOOK_LAZY) reads TCP next
	 * anyway, or waits for it, and so does a write waiting for its records' completions */
	bool asked = t->look == CHECK_QUEUED || t->look == LOOK_LAZY || dgv_cq_ready(t->cq) == 0;
	while ((n = dgv_poll_cq(t->cq, 16, wc)) > 0) {
		got += n;
		t->took += (uint64_t)n;
		for (int i = 0; i < n; i++) {
			struct dgv_wc *w = &wc[i];
			if (w->opcode == DGV_WC_RECV_WRITE_RECORD) {
				if (w->status != DGV_WC_SUCCESS || w->record.stag != t->mr_in->rkey) {
					t->cm_due = true;
					if (!t->err)
						DG_WARN("stream: record completion: status %d, wr_id %#llx, STag %#x "
							"(ours %#x)", w->status, (unsigned long long)w->wr_id,
							w->record.stag, t->mr_in->rkey);
					fail(t, w->status == DGV_WC_WR_FLUSH_ERR ? ECONNRESET : EPROTO, "bad record");
				}
				else if (w->record.base - (uint64_t)(uintptr_t)t->ctl_in < ctl_bytes())
					take_ctl(t, &w->record);
				else
					take_data(s, t, &w->record);
				/* its receive was consumed on a device: the next record's */
				if (t->drec && w->wr_id >= WR_DREC && w->wr_id < WR_DREC + NDREC && !t->tcp_down &&
				    post_drec(t, (uint32_t)(w->wr_id - WR_DREC)))
					fail(t, ENOBUFS, "receive for the next record not posted");
				continue;
			}
			if (w->wr_id & WR_SEND) {
				uint64_t seq = (w->wr_id & ~WR_SEND) >> 8;
				if (seq > t->data_done && seq <= t->data_seq) {
					uint64_t k = seq - t->data_done;
					t->tx_out -= k < t->tx_out ? (uint32_t)k : t->tx_out;
					t->data_done = seq;
				}
				if ((w->wr_id & 0xff) == WR_CTL && t->ctl_out_n)
					t->ctl_out_n--;
			}
			if (w->status != DGV_WC_SUCCESS) {
				t->cm_due = true;
				/* the sentinel flushed, or a send failed: the connection is over */
				if ((w->wr_id == WR_SENTINEL || w->wr_id >= WR_DREC) && w->status == DGV_WC_WR_FLUSH_ERR) {
					if (t->ch && dgv_cm_pending(t->ch) != 0) {
						t->flush_seen = true;
						t->tcp_down = true;
					} else if (t->own_cm && t->ch && t->state == SS_ESTAB &&
						   (!t->flush_wait_us || shim_now_us() < t->flush_wait_us)) {
						if (!t->flush_wait_us)
							t->flush_wait_us = shim_now_us() + FLUSH_EVENT_US;
					} else {
						fail(t, ECONNRESET, "connection closed without an end of stream");
					}
				}
				else
					fail(t, ECONNRESET, "work request failed");
			}
		}
		/* A short batch with nothing left queued: the provider was just asked. Polling
		 * again would only make it read the empty TCP socket once more. */
		if (n < 16 && !dgv_cq_ready(t->cq) && asked)
			return got;
		asked = true; /* the next poll, finding the CQ empty, asks it */
	}
	if (n < 0)
		fail(t, -n, "completion queue error");
	return got;
}

/* Drains the CQ and the connection events. Needs s->lock. */
static void rv_step(struct sock *s, struct stream *t);
static void dev_unreached(struct sock *s, struct stream *t, int rc);
static void plain_after_rv(struct sock *s, struct stream *t);

/* Whether an MPA Reject's private data is a server's "stay plain" (refuse_plain). */
static bool stay_plain_said(const uint8_t *pd, unsigned len)
{
	struct stream_rendezvous z;
	return len == sizeof(struct stream_rv) && stream_rv_decode(pd, len, &z) == 0 && z.port == 0;
}

/* What the stream's waits on other threads and epoll instances must hear of: this call took
 * completions or connection events off a stream whose TCP socket alone they watch (those
 * bytes will not wake them). Needs s->lock (the bells and s->eps are read under it). */
static void tell_waiters(struct sock *s, struct stream *t)
{
	bool other = false;
	for (int i = 0; i < s->neps; i++)
		other |= s->eps[i] != shim_ep_check; /* the instance checking now reports it itself */
	if (!t->nbells && !other)
		return;
	atomic_fetch_add(&t->kicks, 1);
	for (unsigned i = 0; i < t->nbells; i++)
		bell_ring(t->bells[i]);
	for (int i = 0; i < s->neps; i++)
		if (s->eps[i] != shim_ep_check)
			ep_kick(s->eps[i], s->ep_reg[i]);
}

static void progress_take(struct sock *s, struct stream *t);
static void progress(struct sock *s, struct stream *t);

/* progress with drain_cq asked for a kind of look (CHECK_IO, CHECK_QUEUED, LOOK_LAZY, or 0:
 * TCP read even with completions queued). Needs s->lock. */
static void progress_look(struct sock *s, struct stream *t, uint8_t look)
{
	t->look = look;
	progress(s, t);
	t->look = 0;
}

/* Drives the stream: completions and connection events taken, and told to the waits of other
 * threads and instances (tell_waiters) when there were any. Needs s->lock. */
static void progress(struct sock *s, struct stream *t)
{
	uint64_t took = t->took;
	progress_take(s, t);
	if (t->took != took && (t->nbells || s->neps))
		tell_waiters(s, t);
}

static void progress_take(struct sock *s, struct stream *t)
{
	if (!t->cq)
		return;
	if (t->rv_wait) {
		rv_step(s, t);
		if (!t->cq)
			return; /* "stay plain": the kernel carries it now */
	}
	drain_cq(s, t);
	/* DGV_CAP_ARM_ONCE: left armed, and looked at once more after that (one arming per
	 * wake-up, not per call), so a wait that follows misses nothing */
	if (pv_can(t->pv, DGV_CAP_ARM_ONCE) && t->qp && cq_arm(t->cq, t->pv, &t->armed))
		drain_cq(s, t);
	if (!t->ch)
		return;
	/* Established: drain_cq has just progressed the QP, which queues any event it finds;
	 * asking for events on an empty channel would drive the connection again (a TCP read
	 * and CM locks on every send and receive). */
	if (t->state == SS_ESTAB) {
		if (!t->own_cm) {
			if (dgv_cm_pending(t->ch) == 0)
				return;
		} else if (t->cm_estab && !t->cm_due && (++t->cm_skip & 63)) {
			/* once rdma_cm has said ESTABLISHED (the provider posts what it held until
			 * then), a device's connection events come with completions (a failed or
			 * closed connection flushes our receives): asked for after one of those, and
			 * every 64th call, instead of a poll of rdma_cm's descriptor on every one */
			return;
		}
		t->cm_due = false;
	}
	struct dgv_cm_event ev;
	bool tcp_eof = false, stay = false;
	int unreached = 0;
	while (!unreached && !stay && dgv_cm_get_event(t->ch, &ev) == 0) {
		t->took++;
		if (ev.type == DGV_CM_CONNECT_ERROR && ev.local && t->own_cm && t->state == SS_CONNECTING) {
			unreached = ev.status < 0 ? ev.status : -EIO; /* the server never heard of it */
			break;
		}
		switch (ev.type) {
		case DGV_CM_ESTABLISHED:
			t->cm_estab = true;
			if (t->state == SS_CONNECTING) {
				if (!t->p_ring && hello_take(t, ev.pdata, ev.pdata_len)) {
					fail(t, EPROTO, "peer is not a dgshim stream");
					t->so_error = ECONNRESET;
					t->state = SS_DEAD;
					break;
				}
				t->state = SS_ESTAB;
				/* the server read our name when it accepted: withdrawn now, not at close.
				 * A program that sets SO_REUSEADDR gets ports from our autobind that its
				 * other connections use (the kernel's bind(0) shares them once the range
				 * is spent: SIPp at 500 connections a second), and a name still there for
				 * a connection that is over would make the server take a new plain one on
				 * that port for ours */
				if (t->regfd >= 0 && !t->own_cm)
					reg_del(t->regfd), t->regfd = -1;
				/* the MPA Reply is as good as a discovery answer: the next connection
				 * to that port need not wait for one (peer.c's lease) */
				if (s->peerlen && !ip_local(&s->peer))
					peer_heard(&s->peer, s->peerlen, true, IWARP_MODE_RC);
				if (!t->counted) {
					t->counted = true, atomic_fetch_add(&T.conns, 1);
					if (t->pv == &G.dev)
						atomic_fetch_add(&T.dev, 1);
					stats_note_stream(s, t->pv);
				}
				DG_DBG("stream: connected over RC (MPA rev %u, crc %s)", ev.info.mpa_rev,
				       ev.info.crc ? "on" : "off");
			}
			break;
		case DGV_CM_REJECTED:
			if (t->state == SS_CONNECTING && stay_plain_said(ev.pdata, ev.pdata_len)) {
				stay = true; /* the server has no resources for it: plain (below) */
				break;
			}
			/* fall through */
		case DGV_CM_CONNECT_ERROR: {
			int e = ev.type == DGV_CM_REJECTED ? ECONNREFUSED : (ev.status < 0 ? -ev.status : EPROTO);
			DG_WARN("stream: iWARP connection set-up failed: %s", strerror(e));
			t->so_error = e;
			t->err = e;
			t->tcp_down = true;
			t->state = SS_DEAD;
			break;
		}
		case DGV_CM_PEER_CLOSED:
			tcp_eof = true;
			break;
		case DGV_CM_DISCONNECTED:
			if (ev.status == -ECONNRESET && !ev.term_layer && !ev.term_etype && !t->peer_abort && !t->own_cm &&
			    t->state == SS_ESTAB) {
				/* a reset after whole records, with no abort announced: a writer that
				 * died (exit, _exit, a signal) with our control bytes unread, whose
				 * kernel would otherwise have sent FIN: what it wrote has arrived (the
				 * writer's send returned once TCP had it), so it is the end of stream */
				tcp_eof = true;
				DG_DBG("stream: the peer's TCP reset without an abort: its process ended; end of stream");
			} else if (ev.status < 0) {
				fail(t, -ev.status, ev.term_layer || ev.term_etype ? "Terminate" : "TCP error");
			}
			else if (t->own_cm)
				tcp_eof = true; /* the device's orderly end: what came before it has arrived */
			t->tcp_down = true;
			break;
		default:
			break;
		}
	}
	if (unreached) {
		dev_unreached(s, t, unreached);
		return;
	}
	if (stay) {
		DG_INFO("stream: the server has no resources for this connection (MPA Reject, \"stay plain\"): plain TCP");
		atomic_fetch_add(&T.no_room, 1);
		plain_after_rv(s, t);
		return;
	}
	/* Taking the connection's events drove it as well (the provider reads TCP for them): the
	 * records behind an event (a client's first data right behind its ready-to-receive) may
	 * be on the CQ now, and a wait that watches TCP alone would not hear of them: a server's
	 * first read of a new connection slept until its nap ran out (200 ms, 2 % of the
	 * connections of a serial request-response client) */
	if (dgv_cq_ready(t->cq) > 0)
		drain_cq(s, t);
	if (tcp_eof) {
		/* the provider queued every record that came before TCP's end ahead of the event,
		 * but they may have arrived since the CQ was drained above: take them first */
		drain_cq(s, t);
		if (!t->peer_fin) {
			/* TCP ended without the peer's FIN: everything it sent has arrived */
			t->peer_fin = true;
			t->fin_total = t->arrived;
		}
		if (!t->peer_close) {
			/* nor its close: the peer's process ended (killed, or exited without the
			 * shim's close). It reads nothing more: a write fails with EPIPE and poll
			 * says writable, where waiting for its credit would wait for ever (a writer
			 * blocked on a full ring when the reader was killed) */
			t->peer_close = true;
			count_end(t, &T.peer_gone);
		}
	}
	if (t->flush_seen && !t->peer_fin)
		fail(t, ECONNRESET, "connection closed without an end of stream");
	if (t->flush_wait_us && !t->peer_fin && !t->err && !t->tcp_down) {
		/* still no event after a device's flush: asked for at every call (a blocking wait
		 * naps at most 200 ms, shim_nap), and a reset when none came in time */
		t->cm_due = true;
		if (shim_now_us() >= t->flush_wait_us)
			fail(t, ECONNRESET, "connection closed without an end of stream (no connection event)");
	}
	if (t->ctl_owed)
		credit_maybe(t);
}

/* Whether every completion and connection event of t comes from our own calls as they read
 * its TCP socket (a soft QP read by nobody else, dgv_cq_self_driven): a wait then watches that
 * socket alone and the CQ makes no eventfd. Not before the QP exists (a device's rendezvous,
 * a connect still looking for its peer). Needs s->lock. */
static bool stream_self(const struct stream *t)
{
	return !t->own_cm && t->qp && dgv_cq_self_driven(t->cq);
}

/* Registers b for a wait on t (tell_waiters rings it); when t has no room left, the wait
 * naps in slices instead (shim_wait_sliced). Needs s->lock. */
static void bell_add(struct stream *t, struct bell *b)
{
	for (unsigned i = 0; i < t->nbells; i++)
		if (t->bells[i] == b)
			return;
	if (t->nbells < STREAM_BELLS)
		t->bells[t->nbells++] = b;
	else
		shim_wait_sliced = true;
}

/* Needs s->lock. */
static void bell_drop(struct stream *t, struct bell *b)
{
	for (unsigned i = 0; i < t->nbells; i++)
		if (t->bells[i] == b) {
			t->bells[i] = t->bells[--t->nbells];
			return;
		}
}

void stream_unwait(struct sock *s, struct bell *b)
{
	sock_lock(s);
	if (s->strm)
		bell_drop(s->strm, b);
	sock_unlock(s);
}

uint32_t stream_kicks(struct sock *s)
{
	struct stream *t = __atomic_load_n(&s->strm, __ATOMIC_ACQUIRE);
	return t ? atomic_load(&t->kicks) : 0;
}

/* The TCP socket a wait on t watches, and (*ev) for what: its data (our progress reads it),
 * and its room while the provider waits for it (dgv_qp_socket_events: a connect under way, a
 * send TCP refused); -1: none. Its data also after the peer's FIN (a half-close: its credit
 * still comes), not once the peer closed (TCP's end follows, and it would stay readable). On a
 * device it carries only the rendezvous. Needs s->lock; read before the wait's last look. */
static int tcp_wait(const struct stream *t, short *ev)
{
	*ev = 0;
	if (!t->cq || t->tcp_down || (t->own_cm && !t->rv_wait))
		return -1;
	*ev = (short)((t->peer_close ? 0 : POLLIN) | (t->qp && !t->own_cm ? dgv_qp_socket_events(t->qp) : 0));
	return *ev ? t->qfd : -1;
}

/* Waits until the CQ or the connection has news, the timeout passes (-EAGAIN) or a signal
 * (-EINTR). Called with s->lock held; drops it while waiting. */
static int stream_wait(struct sock *s, struct stream *t, int *timeout_ms)
{
	if (!t->cq)
		return -ENOTCONN;
	/* the TCP socket too: data that arrives is then processed by this thread at once (one
	 * wake-up, as a plain TCP read) instead of by the provider's thread and then us */
	short qev;
	int qfd = tcp_wait(t, &qev);
	bool self = stream_self(t);
	int cqfd = self ? -1 : dgv_cq_fd(t->cq), chfd = t->ch && !self ? dgv_cm_channel_fd(t->ch) : -1;
	if (chfd == cqfd)
		chfd = -1; /* the channel signals through the CQ's descriptor */
	/* another thread's call that takes this stream's news (off TCP, or off the CQ before
	 * this wait armed it) rings the bell */
	struct bell *bell = bell_take();
	if (bell)
		bell_add(t, bell);
	if (pv_can(t->pv, DGV_CAP_BUSY_POLL) && t->qp && t->state == SS_ESTAB && *timeout_ms != 0) {
		/* a device completes within microseconds: look for a while before sleeping, as a
		 * wake-up through the channel costs more than that (DGSHIM_SPIN_US) */
		uint64_t until = shim_now_us() + (uint64_t)shim_spin_us();
		while (shim_now_us() < until)
			if (drain_cq(s, t))
				return 0;
	}
	if ((!t->own_cm || t->qp) && cq_arm(t->cq, t->pv, &t->armed) && drain_cq(s, t))
		return 0;
	sock_unlock(s);
	struct pollfd p[4] = {{.fd = cqfd, .events = POLLIN}, {.fd = chfd, .events = POLLIN},
			      {.fd = qfd, .events = qev}, {.fd = bell ? bell_fd(bell) : -1, .events = POLLIN}};
	int r = shim_nap(p, 4, timeout_ms);
	sock_lock(s);
	if (bell) {
		bell_drop(t, bell); /* t's memory outlives a close meanwhile (stream_teardown) */
		bell_put(bell);
	}
	if (unlikely(sock_gone(s)))
		return -EBADF; /* another thread closed its last descriptor meanwhile: t is dead */
	if ((p[0].revents & POLLIN) && t->cq) {
		dgv_cq_ack_event(t->cq);
		t->armed = false;
	}
	return r;
}

/* ------------------------------------------------------------------ who speaks it */

/* The registry names: a listener ("rc", or "rcv" for its device listener beside it) and a
 * client that wants the soft RC ("rcc") or the device ("rccv"). */
static uint64_t name_listen(unsigned port, bool cm)
{
	return REG_KEY(cm ? REG_RCV : REG_RC, port, 0);
}

static uint64_t name_client(unsigned cport, unsigned sport, bool cm)
{
	return REG_KEY(cm ? REG_RCCV : REG_RCC, cport, sport);
}

/* *o = a, an IPv4-mapped IPv6 address as IPv4 (what a device and rdma_cm route by), *ol its
 * length. */
static void unmap4(const union dgv_sockaddr *a, union dgv_sockaddr *o, socklen_t *ol)
{
	*o = *a;
	if (a->sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) {
		*o = (union dgv_sockaddr){.sin = {.sin_family = AF_INET, .sin_port = a->sin6.sin6_port}};
		memcpy(&o->sin.sin_addr, &a->sin6.sin6_addr.s6_addr[12], 4);
		*ol = sizeof o->sin;
	}
}

/* The connection failed before it was carried: connect's answer (SO_ERROR) is e. */
static void connect_failed(struct stream *t, int e, const char *why)
{
	DG_WARN("stream: connection set-up failed: %s (%s)", why, strerror(e));
	t->so_error = e;
	t->err = e;
	t->tcp_down = true;
	t->rv_wait = false;
	t->state = SS_DEAD;
}

/* "Stay plain": a struct stream_rv naming nothing (wire.h), on TCP or as a Reject's private
 * data. */
static struct stream_rv stay_rv(void)
{
	return (struct stream_rv){.magic = htobe32(STREAM_RV_MAGIC)};
}

/* Writes "stay plain" (a struct stream_rv with port 0 and nothing named) on a device stream's
 * TCP connection: from the server instead of its rendezvous, from the client when it cannot
 * reach the listener named there. Returns whether all of it went. */
static bool stay_plain_send(int fd)
{
	const struct stream_rv stay = stay_rv();
	return real.send(fd, &stay, sizeof stay, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof stay;
}

/* The server said "stay plain" (its device has no room for the connection): the kernel
 * carries the TCP connection both programs made, which carried nothing but the rendezvous.
 * The socket answers as not carried (SS_NEW) at once; the descriptor is forgotten at the
 * program's next call that holds none of the shim's locks (ent.plain_due, interpose.c
 * taken(), events.c), as forgetting it needs the epoll instances' locks. Needs s->lock.
 * A program thread still asleep in this socket's blocking connect() when another thread's
 * call forgets the descriptor holds the object for its call (sock_hold), wakes to SS_NEW and
 * goes on with the kernel. */
static void plain_after_rv(struct sock *s, struct stream *t)
{
	res_free(t);
	t->state = SS_NEW;
	t->mode = IWARP_MODE_OFF;
	t->rv_wait = false;
	atomic_fetch_add(&T.plain, 1);
	atomic_store_explicit(&s->ent.plain_due, true, memory_order_release);
}

/* Client of a device stream that could not start its connection to the server's device
 * listener (rc; nothing of it reached the server, which waits for it up to RV_WAIT_MS while it
 * watches the TCP connection): tells the server "stay plain" and lets the kernel carry the
 * connection, or fails it when even that cannot be said. Needs s->lock. */
static void dev_unreached(struct sock *s, struct stream *t, int rc)
{
	if (t->qfd >= 0 && stay_plain_send(t->qfd)) {
		DG_WARN("stream: cannot connect to the server's device listener (%s): plain TCP", strerror(-rc));
		plain_after_rv(s, t);
	} else {
		connect_failed(t, -rc, "connect to the server's device listener");
	}
}

/* Takes one whole rendezvous (struct stream_rv: the server's, or either end's "stay plain") off
 * a device stream's TCP connection fd into *z once all of it has come. Returns 1 taken, 0 not
 * yet (nothing consumed), -ECONNRESET the peer closed first, -EPROTO bytes that are not one,
 * else the socket's -errno. */
static int rv_take(int fd, struct stream_rendezvous *z)
{
	struct stream_rv rv;
	ssize_t n = real.recv(fd, &rv, sizeof rv, MSG_PEEK | MSG_DONTWAIT);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
	if (n == 0)
		return -ECONNRESET;
	if ((size_t)n < sizeof rv)
		return 0; /* the rest is on its way */
	if (stream_rv_decode(&rv, sizeof rv, z))
		return -EPROTO;
	return real.recv(fd, &rv, sizeof rv, MSG_DONTWAIT) == (ssize_t)sizeof rv ? 1 : -EPROTO;
}

/* Client of a device stream: once the server's stream_rv has come whole on the TCP
 * connection, connects to the device listener it names (family 0: the address TCP went to)
 * with our hello and its cookie. Needs s->lock. */
static void rv_step(struct sock *s, struct stream *t)
{
	struct stream_rendezvous z;
	int got = rv_take(t->qfd, &z);
	if (got == 0)
		return;
	if (got < 0) {
		connect_failed(t, -got, got == -EPROTO ? "the server's rendezvous is not a dgshim one"
					: got == -ECONNRESET ? "the server closed before naming its device listener"
							     : "TCP connection");
		return;
	}
	t->rv_wait = false;
	if (!z.port) {
		/* the server cannot carry it (its log says why): the kernel carries the connection
		 * both ends made, and the rendezvous was the only byte of ours on it */
		DG_INFO("stream: the server has no device resources for this connection: plain TCP");
		plain_after_rv(s, t);
		return;
	}
	uint16_t port = z.port;
	union dgv_sockaddr a;
	socklen_t al = s->peerlen;
	unmap4(&s->peer, &a, &al);
	if (z.family == 4) {
		a = (union dgv_sockaddr){.sin = {.sin_family = AF_INET}};
		memcpy(&a.sin.sin_addr, z.addr, 4);
		al = sizeof a.sin;
	} else if (z.family == 6) {
		a = (union dgv_sockaddr){.sin6 = {.sin6_family = AF_INET6}};
		memcpy(&a.sin6.sin6_addr, z.addr, 16);
		al = sizeof a.sin6;
	}
	if (a.sa.sa_family == AF_INET)
		a.sin.sin_port = htons(port);
	else
		a.sin6.sin6_port = htons(port);
	struct stream_dhello dh;
	hello_make(t, &dh.h);
	dh.cookie = z.cookie;
	struct dgv_conn_param cp = {.private_data = &dh, .private_data_len = sizeof dh};
	struct dgv_qp_init_attr qa = rc_attr(t, s);
	int rc = dgv_connect(t->pv->pd, &qa, &a.sa, al, &cp, &t->qp);
	if (rc) {
		t->qp = NULL;
		dev_unreached(s, t, rc);
		return;
	}
	post_sentinel(t);
}

/* The mode for a connection of ours to/from a (role): IWARP_MODE_RC (trust the rules), _AUTO
 * (discovery) or _OFF. */
static int decide(struct stream *t, int role, const union dgv_sockaddr *a, socklen_t al)
{
	if (t->mode == IWARP_MODE_OFF)
		return IWARP_MODE_OFF;
	if (t->mode == IWARP_MODE_RC)
		return IWARP_MODE_RC; /* the program asked (setsockopt) */
	const char *where = NULL;
	int m = G.rules ? (int)dg_rules_match_where(G.rules, IPPROTO_TCP, role, &a->sa, al, &where)
			: IWARP_MODE_AUTO;
	if (m == IWARP_MODE_OFF)
		return IWARP_MODE_OFF;
	if ((m == IWARP_MODE_RC && where && strcmp(where, "default mode")) || G.trust_all)
		return IWARP_MODE_RC; /* a rules line names it */
	return IWARP_MODE_AUTO;
}

int stream_fd_closing(struct sock *s, int fd)
{
	struct stream *t = s->strm;
	if (!t || t->qfd != fd)
		return 0;
	int other = sock_other_fd(s, fd);
	int to = other >= 0 ? other : high_fd(fd), rc = 0;
	if (to < 0)
		rc = -errno;
	else if (t->qp && !t->own_cm)
		rc = dgv_qp_set_fd(t->qp, to);
	if (rc) {
		/* cannot happen with the soft provider (the same socket, a QP on the caller's
		 * descriptor): the connection cannot go on on a number about to be closed */
		DG_ERR("fd %d: closing one of the connection's descriptors: its queue pair cannot move "
		       "to fd %d (%s): the connection reads as reset", fd, to, strerror(-rc));
		if (other < 0 && to >= 0)
			own_close(to);
		if (t->qp)
			dgv_destroy_qp(t->qp), t->qp = NULL;
		t->qfd = -1, t->qfd_own = false;
		if (t->state == SS_ESTAB || t->state == SS_CONNECTING)
			t->state = SS_DEAD, t->err = ECONNRESET, t->tcp_down = true;
		return rc;
	}
	if (t->qfd_own)
		own_close(t->qfd);
	t->qfd = to, t->qfd_own = other < 0;
	DG_DBG("fd %d: the program keeps the connection as fd %d: its queue pair moved there", fd, to);
	return 0;
}

void stream_let_go(int fd)
{
	struct sock *s = fd_sock(fd);
	if (s)
		ev_fd_gone(s, fd, true); /* the program's epoll registrations stay, the kernel's */
	sock_closing(fd);
}

/* Lets the OS carry the socket from now on: the shim forgets the descriptor (counted). */
static void go_plain(int fd)
{
	atomic_fetch_add(&T.plain, 1);
	stream_let_go(fd);
}

/* ------------------------------------------------------------------ TCP_NODELAY */

/* The provider turns Nagle off on a carried connection's TCP socket (it sends whole FPDUs);
 * the program still reads back what it set, or the kernel's value from before. */
static void nodelay_take(struct stream *t, int fd)
{
	int v = 0;
	socklen_t l = sizeof v;
	if (real.getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l) == 0) {
		t->nodelay = v != 0;
		t->nodelay_mine = true;
	}
}

static void lowat_take(struct stream *t, int fd)
{
	int v = 1;
	socklen_t l = sizeof v;
	if (real.getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &l) == 0)
		t->lowat = v;
}

void stream_lowat(struct sock *s, int fd)
{
	sock_lock(s);
	lowat_take(s->strm, fd);
	sock_unlock(s);
}

/* Bytes a read waits for before it returns (the kernel's sock_rcvlowat for len bytes). */
static size_t lowat_target(const struct stream *t, size_t len)
{
	size_t lw = t->lowat > 1 ? (size_t)t->lowat : 1;
	if (t->ring && lw > t->ring / 2)
		lw = t->ring / 2; /* as the kernel caps it at half its buffer */
	return lw < len ? lw : len;
}

int stream_nodelay(struct sock *s, int fd, int set, void *v, socklen_t *l)
{
	sock_lock(s);
	struct stream *t = s->strm;
	int rc = -ENOSYS;
	if (t->nodelay_mine && set) {
		int x;
		if (*l < sizeof x) {
			rc = -EINVAL;
		} else if (!v) {
			rc = -EFAULT;
		} else {
			memcpy(&x, v, sizeof x);
			t->nodelay = x != 0;
			rc = 0;
		}
	} else if (t->nodelay_mine) {
		int x = t->nodelay;
		socklen_t n = *l < sizeof x ? *l : sizeof x;
		if (!v && n) {
			rc = -EFAULT;
		} else {
			memcpy(v, &x, n);
			*l = n;
			rc = 0;
		}
	}
	sock_unlock(s);
	return rc;
}

/* ------------------------------------------------------------------ connect */

static int local_port(int fd, union dgv_sockaddr *la)
{
	socklen_t ll = sizeof *la;
	if (getsockname(fd, &la->sa, &ll))
		return -errno;
	return (int)port_of(la);
}

/* A connect under way (t->state SS_CONNECTING, s->lock held, released on return): the
 * non-blocking answer, or the blocking wait for the outcome (CONNECT_WAIT_MS at most, on a
 * device DEV_CONNECT_WAIT_MS).
 * Returns connect's answer. */
static int connect_finish(struct sock *s, struct stream *t, bool nb)
{
	if (nb) {
		progress(s, t);
		t->connect_pending = true;
		sock_unlock(s);
		return -EINPROGRESS;
	}
	int left = t->own_cm ? DEV_CONNECT_WAIT_MS : (int)CONNECT_WAIT_MS;
	for (;;) {
		progress(s, t);
		if (t->state != SS_CONNECTING)
			break;
		int w = stream_wait(s, t, &left);
		if (w == -EINTR) {
			t->connect_pending = true; /* as the kernel: it goes on in the background */
			sock_unlock(s);
			return -EINTR;
		}
		if (w == -EAGAIN && (progress(s, t), t->state == SS_CONNECTING)) {
			connect_failed(t, ETIMEDOUT, t->own_cm ? "no device connection from the server in time"
							    : "MPA exchange timed out");
			break;
		}
	}
	/* SS_NEW: the server said "stay plain"; the kernel's connect, made already, stands */
	int rc = t->state == SS_ESTAB || t->state == SS_NEW ? 0 : -(t->err ? t->err : ECONNREFUSED);
	if (rc)
		t->err = 0, t->so_error = 0;
	sock_unlock(s);
	return rc;
}

int stream_connect(struct sock *s, int fd, const struct sockaddr *a, socklen_t l)
{
	sock_lock(s);
	struct stream *t = s->strm;
	int rc;
	switch (t->state) {
	case SS_CONNECTING:
		progress(s, t);
		if (t->state == SS_NEW) {
			sock_unlock(s); /* "stay plain": the kernel's connect answers */
			return real.connect(fd, a, l) < 0 ? -errno : 0;
		}
		if (t->state == SS_CONNECTING)
			rc = -EALREADY;
		else if (t->state == SS_ESTAB)
			rc = 0, t->connect_pending = false;
		else
			rc = t->so_error ? -t->so_error : -ECONNREFUSED, t->so_error = 0;
		sock_unlock(s);
		return rc;
	case SS_ESTAB:
		rc = t->connect_pending ? 0 : -EISCONN;
		t->connect_pending = false;
		sock_unlock(s);
		return rc;
	case SS_LISTEN:
	case SS_DEAD:
	case SS_ANSWER: /* an accepted connection: the kernel says EISCONN */
		sock_unlock(s);
		return real.connect(fd, a, l) < 0 ? -errno : 0; /* the kernel's answer */
	case SS_NEW:
		break;
	}
	union dgv_sockaddr dst = {0};
	if (!a || l < sizeof(struct sockaddr_in) || l > sizeof dst ||
	    (a->sa_family != AF_INET && a->sa_family != AF_INET6)) {
		sock_unlock(s);
		return real.connect(fd, a, l) < 0 ? -errno : 0;
	}
	memcpy(&dst, a, l);
	int m = decide(t, DG_ROLE_SENDER, &dst, l);
	unsigned dport = port_of(&dst);
	uint64_t un;
	if (m == IWARP_MODE_AUTO) {
		un = name_listen(dport, false);
		if (ip_local(&dst) ? !reg_has(un)
				   : !peer_remote_wait(&dst, l, IWARP_MODE_RC, DISCO_CONNECT_WAIT_MS))
			m = IWARP_MODE_OFF;
		else if (ip_local(&dst) && atomic_load_explicit(&ports_held[dport], memory_order_relaxed)) {
			/* a listener this process holds: the MPA exchange needs its accept, which a
			 * program that connects and then accepts in one thread makes only after
			 * connect returns (natively the kernel completes the handshake); nothing to
			 * gain within one process anyway */
			m = IWARP_MODE_OFF;
			DG_DBG("fd %d: TCP to port %u: a listener of this process, plain TCP", fd, dport);
		}
	}
	if (m == IWARP_MODE_OFF) {
		sock_unlock(s);
		go_plain(fd);
		DG_DBG("fd %d: TCP to port %u: the peer does not speak iWARP, plain TCP", fd, dport);
		return real.connect(fd, a, l) < 0 ? -errno : 0;
	}
	/* on the RDMA device when the listener has a device listener too and we have a device
	 * for the destination (same host only: the server learns it from our name) */
	struct shim_pv *pv = &G.host;
	if (ip_local(&dst)) {
		uint64_t dn = name_listen(dport, true);
		union dgv_sockaddr d4, any = {0};
		socklen_t d4l = l;
		unmap4(&dst, &d4, &d4l);
		any.sa.sa_family = d4.sa.sa_family;
		if (reg_has(dn) && dev_get(&any, d4l, &d4) == 0 &&
		    (G.dev.caps.qp_types & 1u << DGV_QPT_RC))
			pv = &G.dev;
	}
	/* ours: a port first (as the kernel's autobind would), then the name the server looks up */
	union dgv_sockaddr la;
	int lport = local_port(fd, &la);
	if (lport == 0) {
		union dgv_sockaddr any = {0};
		any.sa.sa_family = dst.sa.sa_family;
		if (real.bind(fd, &any.sa, any.sa.sa_family == AF_INET ? sizeof any.sin : sizeof any.sin6)) {
			rc = -errno;
			goto out_unlock;
		}
		lport = local_port(fd, &la);
	}
	if (lport <= 0) {
		rc = lport < 0 ? lport : -EADDRNOTAVAIL;
		goto out_unlock;
	}
	if ((rc = res_setup(t, pv)))
		goto fallback;
	un = name_client((unsigned)lport, dport, t->own_cm);
	t->regfd = reg_add(un);
	if (t->regfd < 0) {
		rc = t->regfd;
		t->regfd = -1;
		goto fallback;
	}
	t->qfd = fd;
	/* the kernel connects the program's socket with the program's own blocking mode */
	bool nb = s->user_nonblock;
	sock_unlock(s);
	int cr = real.connect(fd, a, l);
	int ce = errno;
	sock_lock(s);
	if (cr < 0 && ce != EINPROGRESS) {
		res_free(t); /* refused, unreachable, interrupted: the kernel's answer stands */
		sock_unlock(s);
		return -ce;
	}
	nodelay_take(t, fd);
	if (t->own_cm) {
		/* the server's rendezvous comes on TCP, then rdma_cm (rv_step, from progress) */
		t->rv_wait = true;
		t->state = SS_CONNECTING;
		memcpy(&s->peer, &dst, l);
		s->peerlen = l;
		s->connected = true;
		DG_DBG("fd %d: TCP to port %u: on the RDMA device (%s)", fd, dport, G.dev_why);
		return connect_finish(s, t, nb);
	}
	struct stream_hello h;
	hello_make(t, &h);
	struct dgv_conn_param cp = {.private_data = &h, .private_data_len = sizeof h, .timeout_ms = MPA_WAIT_MS};
	struct dgv_qp_init_attr qa = rc_attr(t, s);
	if ((rc = dgv_connect(t->pv->pd, &qa, &dst.sa, l, &cp, &t->qp))) {
		DG_WARN("fd %d: iWARP connect to port %u failed to start (%s)", fd, dport, strerror(-rc));
		t->qp = NULL;
		res_free(t);
		t->state = SS_DEAD;
		t->so_error = -rc;
		sock_unlock(s);
		return rc;
	}
	post_sentinel(t);
	t->state = SS_CONNECTING;
	memcpy(&s->peer, &dst, l);
	s->peerlen = l;
	s->connected = true;
	return connect_finish(s, t, nb);
fallback:
	/* nothing was sent on the connection yet: the OS can still carry it plain */
	DG_WARN("fd %d: no iWARP resources (%s%s): plain TCP", fd, strerror(-rc), dev_res_hint(pv, rc));
	res_free(t);
	sock_unlock(s);
	go_plain(fd);
	return real.connect(fd, a, l) < 0 ? -errno : 0;
out_unlock:
	sock_unlock(s);
	return rc;
}

/* ------------------------------------------------------------------ listen and accept */

/* A device listener beside a named one, when DGSHIM_PROVIDER gives a device for the listening
 * address: rdma_cm on an ephemeral port (an iWARP device's listener would take the kernel's
 * TCP port, which the program's socket holds), bound to the listening address (the wildcard:
 * every device; clients are told "the address you connected to"), named "rcv". Needs s->lock. */
static void dev_listen(struct stream *t, int fd, const union dgv_sockaddr *la, socklen_t ll, int port)
{
	/* a dual-stack IPv6 socket takes IPv4 clients too: the device listens for them on IPv4
	 * (an IPv6 wildcard in rdma_cm does not reach an iWARP device's IPv4 address) */
	union dgv_sockaddr a;
	unmap4(la, &a, &ll);
	if (a.sa.sa_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&a.sin6.sin6_addr)) {
		int v6only = 0;
		socklen_t vl = sizeof v6only;
		if (real.getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &vl) == 0 && !v6only) {
			a = (union dgv_sockaddr){.sin = {.sin_family = AF_INET}};
			ll = sizeof a.sin;
		}
	}
	if (t->dlis || dev_get(&a, ll, NULL))
		return;
	if (a.sa.sa_family == AF_INET)
		a.sin.sin_port = 0;
	else
		a.sin6.sin6_port = 0;
	socklen_t al = sizeof t->dlis_addr;
	uint64_t un;
	int rc = dgv_cm_create_channel(G.dev.ctx, &t->lch);
	if (!rc)
		rc = dgv_listen(G.dev.ctx, &a.sa, ll, 128, -1, t->lch, NULL, &t->dlis);
	if (!rc)
		rc = dgv_listener_addr(t->dlis, &t->dlis_addr, &al);
	if (!rc) {
		un = name_listen((unsigned)port, true);
		t->dregfd = reg_add(un);
		if (t->dregfd < 0)
			rc = t->dregfd, t->dregfd = -1;
	}
	if (rc) {
		DG_WARN("fd %d: TCP port %d: no device listener (%s): connections stay on soft RC", fd, port,
			strerror(-rc));
		if (t->dlis)
			dgv_listener_destroy(t->dlis), t->dlis = NULL;
		if (t->lch)
			dgv_cm_destroy_channel(t->lch), t->lch = NULL;
		return;
	}
	DG_INFO("fd %d: TCP port %d: device listener on port %u (%s)", fd, port, port_of(&t->dlis_addr), G.dev_why);
}

/* Binds the listener name of port for t unless the rules keep it plain. Needs s->lock. */
static void stream_name_listener(struct stream *t, int fd, const union dgv_sockaddr *la, int port)
{
	socklen_t ll = la->sa.sa_family == AF_INET ? sizeof la->sin : sizeof la->sin6;
	if (t->regfd >= 0 || t->named || decide(t, DG_ROLE_RECEIVER, la, ll) == IWARP_MODE_OFF)
		return;
	if (!own_room(3 * 4, "a TCP listener"))
		return; /* clients connect plain */
	uint64_t un = name_listen((unsigned)port, false);
	t->regfd = reg_add(un);
	if (t->regfd < 0) {
		DG_DBG("fd %d: registry name for TCP port %d not made (%s)", fd, port, strerror(-t->regfd));
		t->regfd = -1;
		return;
	}
	t->named = true;
	if (!t->lport_held)
		port_held(port, 1), t->lport_held = port;
	disco_serve(); /* clients on other hosts may ask whether this port speaks */
	dev_listen(t, fd, la, ll, port);
}

static void late_prestart(void);

int stream_listen(struct sock *s, int fd, int backlog)
{
	sock_lock(s);
	struct stream *t = s->strm;
	/* The name goes up before the kernel listens: a client that sees the port listening
	 * (a benchmark polling /proc/net/tcp, a client retrying) must also see the name, or it
	 * takes the server for an unmodified one while the server takes it for a dgshim
	 * client. A socket not bound yet gets its port from listen itself: named after. */
	union dgv_sockaddr la;
	int port = t->state == SS_NEW ? local_port(fd, &la) : -1;
	bool named_before = port > 0;
	if (named_before)
		stream_name_listener(t, fd, &la, port);
	sock_unlock(s);
	if (real.listen(fd, backlog) < 0) {
		int e = errno;
		sock_lock(s);
		if (named_before && t->regfd >= 0) {
			reg_del(t->regfd);
			t->regfd = -1;
			t->named = false;
			res_free(t); /* the device listener and its name, if any */
		}
		sock_unlock(s);
		return -e;
	}
	sock_lock(s);
	if (t->state == SS_NEW) {
		if (!named_before && (port = local_port(fd, &la)) > 0)
			stream_name_listener(t, fd, &la, port);
		t->state = SS_LISTEN;
	}
	sock_unlock(s);
	late_prestart();
	return 0;
}

/* Accepts req (the peer's hello in pd, len) with our hello, on the device or soft as t is.
 * Needs ns->lock. Returns 0 or -errno (req rejected or consumed). */
/* The host cannot carry an accepted connection (cause: its -errno; the descriptor budget, no
 * memory, no queue pair): answers the client's MPA Request with a Reject whose private data
 * says "stay plain" (a struct stream_rv naming nothing, as a device server's rendezvous) and
 * lets the kernel carry the TCP connection both programs made, whose only bytes of ours were
 * the Request and the Reply. req: the request adopted already, or NULL to adopt one on nfd
 * here (on the program's descriptor and the provider's default channel: no descriptor of
 * ours). Frees the stream's resources. Returns 0 (plain now, t->state SS_NEW) or cause (the
 * Reply could not be given: the stream is dead as before). Needs ns->lock. */
static int refuse_plain(struct sock *ns, struct stream *t, int nfd, struct dgv_conn_req *req, int cause)
{
	const struct stream_rv stay = stay_rv();
	int rc = -EOPNOTSUPP; /* no provider context to adopt the request with */
	if (!req && G.host.ctx)
		rc = dgv_conn_req_adopt(G.host.ctx, nfd, NULL, ns, &req);
	if (req) {
		rc = dgv_reject_keep(req, &stay, sizeof stay, ACCEPT_WAIT_MS);
		if (rc == -EOPNOTSUPP && t->own_cm)
			/* a device's request came on a connection of its own (rdma_cm's): its
			 * Reject carries "stay plain", and the program's TCP connection, which
			 * carried only our rendezvous, is as it was */
			rc = dgv_reject(req, &stay, sizeof stay);
		else if (rc)
			dgv_reject(req, NULL, 0);
	}
	int lfd = nfd >= 0 ? nfd : t->qfd; /* for the log: the program's descriptor */
	res_free(t);
	if (rc)
		return cause;
	t->state = SS_NEW;
	t->mode = IWARP_MODE_OFF;
	if (!t->own_cm)
		atomic_fetch_add(&T.plain, 1); /* a device stream's accept lets it go (go_plain counts) */
	atomic_fetch_add(&T.no_room, 1);
	DG_WARN("fd %d: no resources for an iWARP connection (%s%s): plain TCP, the client told so", lfd,
		strerror(-cause), cause == -EMFILE ? "; the shim keeps to a quarter of RLIMIT_NOFILE" : "");
	return 0;
}

static int accept_hello(struct sock *ns, struct stream *t, struct dgv_conn_req *req, const uint8_t *pd,
			unsigned len)
{
	int rc = hello_take(t, pd, len);
	if (rc) {
		dgv_reject(req, NULL, 0);
		return rc;
	}
	struct stream_hello h;
	hello_make(t, &h);
	struct dgv_conn_param cp = {.private_data = &h, .private_data_len = sizeof h};
	struct dgv_qp_init_attr qa = rc_attr(t, ns);
	if ((rc = dgv_accept(req, t->pv->pd, &qa, &cp, &t->qp))) {
		t->qp = NULL; /* req is still ours */
		return refuse_plain(ns, t, -1, req, rc);
	}
	/* a device defers rdma_accept to our next call: the receives are there before the
	 * peer's first record */
	post_sentinel(t);
	t->state = SS_ESTAB;
	t->counted = true;
	atomic_fetch_add(&T.conns, 1);
	if (t->pv == &G.dev)
		atomic_fetch_add(&T.dev, 1);
	stats_note_stream(ns, t->pv);
	/* the first control message wakes the connecting side's CQ */
	ctl_send(t, CTL_HELLO);
	return 0;
}

/* Runs the passive side on an accepted connection that is ours: reads the MPA Request,
 * answers with our hello, or with "stay plain" when the host has no resources for it
 * (refuse_plain: t->state SS_NEW then). Needs ns->lock. Returns 0 or -errno. */
static int accept_rc(struct sock *ns, int nfd)
{
	struct stream *t = ns->strm;
	int rc = res_setup(t, &G.host);
	if (!rc)
		t->qfd = nfd;
	struct dgv_conn_req *req = NULL;
	if (!rc)
		rc = dgv_conn_req_adopt(t->pv->ctx, t->qfd, t->ch, ns, &req);
	if (rc)
		return refuse_plain(ns, t, nfd, NULL, rc);
	struct dgv_cm_event ev;
	int left = ACCEPT_WAIT_MS;
	for (;;) {
		rc = dgv_cm_get_event(t->ch, &ev);
		if (rc == 0)
			break;
		if (rc != -EAGAIN || left <= 0) {
			dgv_reject(req, NULL, 0);
			return rc == -EAGAIN ? -ETIMEDOUT : rc;
		}
		dgv_cm_wait(t->ch, 50);
		left -= 50;
	}
	if (ev.type != DGV_CM_CONNECT_REQUEST) {
		dgv_reject(req, NULL, 0);
		return ev.status < 0 ? ev.status : -EPROTO;
	}
	return accept_hello(ns, t, ev.req, ev.pdata, ev.pdata_len);
}

static void late_forget(struct sock *s);

/* Whether the connection at fd starts with an MPA Request (RFC 5044 7.1: its 16-byte key),
 * waiting up to wait_ms for the first bytes. Never consumes a byte. Returns 1 (it does), 0 (it
 * does not, or nothing came in time, or the connection ended). */
static int mpa_request_first(int fd, int wait_ms)
{
	static const char key[16] = MPA_KEY_REQ; /* RFC 5044 7.1, wire.h */
	uint64_t until = shim_now_us() + (uint64_t)wait_ms * 1000;
	for (;;) {
		char b[16];
		ssize_t n = real.recv(fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT);
		if (n == (ssize_t)sizeof b)
			return !memcmp(b, key, sizeof b);
		if (n > 0 && memcmp(b, key, (size_t)n))
			return 0;
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return 0;
		uint64_t now = shim_now_us();
		if (now >= until)
			return 0;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		real.poll(&p, 1, (int)((until - now + 999) / 1000));
		if (n > 0)
			usleep(100); /* part of the key: the rest is on its way */
	}
}

/* Whether the MPA Request on fd can now be read whole (RFC 5044 7.1: its header's PD_Length
 * says how long it is), or something else is there that accept_rc must meet at once: bytes
 * that are not a Request's header, a length no Request has, the connection's end or an error.
 * Never consumes a byte. */
static bool request_here(int fd)
{
	int avail = 0;
	if (ioctl(fd, SIOCINQ, &avail) != 0)
		return true;
	if (avail >= MPA_RR_HLEN) {
		static const char key[16] = MPA_KEY_REQ;
		struct mpa_rr_hdr h;
		if (real.recv(fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof h)
			return true;
		unsigned pd = be16toh(h.pd_len);
		return memcmp(h.key, key, sizeof key) || pd > MPA_MAX_PDATA + MPA_V2_LEN ||
		       (unsigned)avail >= MPA_RR_HLEN + pd;
	}
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
	return real.poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Leaving SS_ANSWER: the descriptor its wait watched is not a QP's (a private duplicate that
 * stream_fd_closing made, when the program closed the number the connection came on, goes). */
static void answer_qfd_drop(struct stream *t)
{
	if (t->qfd >= 0 && t->qfd_own)
		own_close(t->qfd);
	t->qfd = -1, t->qfd_own = false;
}

/* An accepted connection of ours the shim could not answer: it reads as reset (the client's
 * connect fails). Needs s->lock. */
static void answer_failed(struct stream *t, int fd, int rc)
{
	answer_qfd_drop(t);
	DG_WARN("fd %d: iWARP accept failed (%s): the connection reads as reset", fd, strerror(rc ? -rc : EPROTO));
	t->state = SS_DEAD;
	t->err = ECONNRESET;
	t->tcp_down = true;
}

/*
 * A connection accepted from a preloaded client (SS_ANSWER) answered at the program's first
 * use of it, on descriptor fd (any of the program's for this socket): the MPA Request the
 * client sent after its TCP connect is read and answered. A busy client sends it late (its
 * progress runs in its own calls), so the answer does not wait for it unless the call would
 * have waited for data anyway: wait_ms 0 (a non-blocking call, a readiness check, the
 * answering thread) looks once and leaves the stream SS_ANSWER when the Request is not whole
 * yet, which those calls report as "nothing yet" (EAGAIN, not ready) while the kernel socket's
 * POLLIN wakes the waits; > 0 waits that long at most (SO_RCVTIMEO, SO_SNDTIMEO); -1 waits
 * up to MPA_WAIT_MS, the client's own deadline, then the connection reads as reset. The wait
 * drops s->lock (another thread may answer meanwhile). Returns 0 (answered: carried, plain, or
 * dead), -EAGAIN (not yet) or -EINTR (a signal during the wait). Needs s->lock.
 */
static int answer_slow(struct sock *s, struct stream *t, int fd, int wait_ms)
{
	if (t->probe) {
		t->probe = false;
		if (!mpa_request_first(fd, PROBE_WAIT_MS)) {
			/* an unmodified client on another host: the OS carries it from here (the
			 * descriptor stays known, answered by the kernel as before a connect) */
			late_forget(s); /* its reference must not outlive the program's last close */
			answer_qfd_drop(t);
			t->state = SS_NEW;
			t->mode = IWARP_MODE_OFF;
			atomic_fetch_add(&T.plain, 1);
			DG_DBG("fd %d: a client on another host that does not speak iWARP: plain TCP", fd);
			tell_waiters(s, t);
			return 0;
		}
	}
	uint64_t until = wait_ms < 0 ? shim_now_us() + (uint64_t)MPA_WAIT_MS * 1000
				      : shim_now_us() + (uint64_t)wait_ms * 1000;
	while (!request_here(fd)) {
		uint64_t now = shim_now_us();
		if (now >= until) {
			if (wait_ms >= 0)
				return -EAGAIN;
			late_forget(s);
			answer_failed(t, fd, -ETIMEDOUT);
			tell_waiters(s, t);
			return 0;
		}
		uint64_t left = (until - now + 999) / 1000;
		struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
		sock_unlock(s);
		int r = real.poll(&p, 1, left > 200 ? 200 : (int)left);
		int e = errno;
		sock_lock(s);
		if (t->state != SS_ANSWER)
			return 0; /* another thread answered it meanwhile */
		if (r < 0 && e == EINTR)
			return -EINTR;
	}
	late_forget(s);
	answer_qfd_drop(t);
	t->state = SS_NEW; /* accept_rc makes it SS_ESTAB, or leaves it SS_NEW: plain */
	int rc = accept_rc(s, fd);
	bool stay_plain = !rc && t->state == SS_NEW && t->mode == IWARP_MODE_OFF; /* refuse_plain */
	if (!stay_plain && t->state != SS_ESTAB)
		answer_failed(t, fd, rc);
	tell_waiters(s, t);
	return 0;
}

static inline int answer(struct sock *s, struct stream *t, int fd, int wait_ms)
{
	return likely(t->state != SS_ANSWER) ? 0 : answer_slow(s, t, fd, wait_ms);
}

/*
 * Answering late. A forking server (accept, fork, the child serves, the parent closes its copy:
 * qperf, PostgreSQL, socat, inetd) must have the connection answered in the child, so an
 * accepted connection of ours is answered at the program's first use of it (answer()). A
 * program that accepts and then waits for something else before it uses the connection would
 * keep the client in connect() meanwhile; the answering thread answers what has waited
 * ANSWER_AFTER_MS, except what a fork since has handed to a child. The list holds a reference
 * to each socket; the descriptor is checked (same socket inode) before it is used.
 */
struct late {
	struct sock *s;
	int fd;
	ino_t ino;
	uint64_t due_us;
	uint64_t until_us; /* the client's deadline: a Request not whole by then is not coming */
};
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool running;
	struct late *v;
	int n, cap;
} L = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, NULL, 0, 0};

static ino_t fd_ino(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* A thread of the shim's (shim_thread) that waits on cv, made with CLOCK_MONOTONIC so that a
 * wait's deadline (mono_deadline) ignores changes of the wall clock. Returns true when started.
 * Needs the lock that guards cv. */
static bool mono_thread_start(pthread_cond_t *cv, void *(*fn)(void *))
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
	return shim_thread(fn, NULL) == 0;
}

/* The CLOCK_MONOTONIC time us microseconds from now, for pthread_cond_timedwait. */
static struct timespec mono_deadline(uint64_t us)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + us * 1000u;
	ts.tv_sec = (time_t)(ns / 1000000000u), ts.tv_nsec = (long)(ns % 1000000000u);
	return ts;
}

static bool served_room(bool *running, pthread_cond_t *cv, void *(*fn)(void *), void **v, int n, int *cap,
			size_t size);

static void *late_thread(void *arg)
{
	(void)arg;
	shim_depth++; /* everything here is the shim's own */
	pthread_mutex_lock(&L.lock);
	for (;;) {
		uint64_t now = shim_now_us(), next = 0;
		for (int i = 0; i < L.n;) {
			if (L.v[i].due_us > now) {
				if (!next || L.v[i].due_us < next)
					next = L.v[i].due_us;
				i++;
				continue;
			}
			struct late e = L.v[i];
			L.v[i] = L.v[--L.n];
			pthread_mutex_unlock(&L.lock);
			sock_lock(e.s);
			bool again = false;
			struct stream *t = e.s->strm;
			if (t && t->state == SS_ANSWER && fd_sock(e.fd) == e.s && fd_ino(e.fd) == e.ino &&
			    answer(e.s, t, e.fd, 0) == -EAGAIN) {
				/* not whole yet: looked at again until the client's own deadline */
				again = now < e.until_us;
				if (!again) {
					answer_failed(t, e.fd, -ETIMEDOUT);
					tell_waiters(e.s, t);
				}
			}
			sock_unlock(e.s);
			pthread_mutex_lock(&L.lock);
			if (again && served_room(&L.running, &L.cv, late_thread, (void **)&L.v, L.n, &L.cap, sizeof *L.v)) {
				e.due_us = shim_now_us() + LATE_LOOK_MS * 1000u;
				L.v[L.n++] = e; /* with its reference */
			} else {
				pthread_mutex_unlock(&L.lock);
				sock_put(e.s);
				pthread_mutex_lock(&L.lock);
			}
			now = shim_now_us();
			i = 0, next = 0;
		}
		if (!next) {
			pthread_cond_wait(&L.cv, &L.lock);
		} else {
			struct timespec ts = mono_deadline(next - now);
			pthread_cond_timedwait(&L.cv, &L.lock, &ts);
		}
	}
	return NULL;
}

/* For a list served by a thread of the shim's (late answers, closing connections): starts the
 * thread if *running is not yet, and makes room for one more entry in *v (n of *cap entries of
 * size bytes; doubled, from 16). Returns whether both are there. Needs the list's lock. */
static bool served_room(bool *running, pthread_cond_t *cv, void *(*fn)(void *), void **v, int n, int *cap,
			size_t size)
{
	if (!*running)
		*running = mono_thread_start(cv, fn);
	if (*running && n == *cap) {
		int nc = *cap ? *cap * 2 : 16;
		void *nv = realloc(*v, (size_t)nc * size);
		if (nv)
			*v = nv, *cap = nc;
	}
	return *running && n < *cap;
}

/* Starts the answering thread, if it is not running, when a listener is made: not at the first
 * accept, where the thread would start just before the fork of a forking server (accept, fork,
 * the child serves). ASan's runtime then left the child's own answering thread stuck at its
 * start (the parent's thread was registering itself at the fork), so the child never answered
 * the connection it accepted next, and its client waited in connect() until the child gave up
 * (qperf's data connection: the known app_qperf flake under ASan). The thread sleeps while the
 * list is empty. */
static void late_prestart(void)
{
	pthread_mutex_lock(&L.lock);
	(void)served_room(&L.running, &L.cv, late_thread, (void **)&L.v, L.n, &L.cap, sizeof *L.v);
	pthread_mutex_unlock(&L.lock);
}

/* Queues s (accepted at fd, SS_ANSWER) for the answering thread (started here if no listener
 * of this process started it: a child's inherited listener). */
static void late_add(struct sock *s, int fd)
{
	pthread_mutex_lock(&L.lock);
	if (served_room(&L.running, &L.cv, late_thread, (void **)&L.v, L.n, &L.cap, sizeof *L.v)) {
		atomic_fetch_add(&s->refs, 1);
		uint64_t now = shim_now_us();
		L.v[L.n++] = (struct late){s, fd, fd_ino(fd), now + ANSWER_AFTER_MS * 1000u,
					   now + (uint64_t)MPA_WAIT_MS * 1000u};
		pthread_cond_signal(&L.cv);
	}
	pthread_mutex_unlock(&L.lock);
}

/* s answered (or gone): out of the list, its reference dropped. The caller holds a reference
 * of its own (a descriptor's, or the thread's), so the count does not reach 0 here. */
static void late_forget(struct sock *s)
{
	pthread_mutex_lock(&L.lock);
	bool found = false;
	for (int i = 0; i < L.n; i++)
		if (L.v[i].s == s) {
			L.v[i] = L.v[--L.n];
			found = true;
			break;
		}
	pthread_mutex_unlock(&L.lock);
	if (found)
		atomic_fetch_sub(&s->refs, 1);
}

/* Fork: what waits to be answered is the child's to answer (at its first use); in the parent
 * only its own use answers it. Parent: the list is emptied (references dropped); child: the
 * thread is gone, the list and its references too (the child's descriptors hold their own). */
static void late_fork(bool child)
{
	if (child) {
		/* single-threaded here: the list's references go with the thread that is not
		 * here (a socket only the list still held is left alone: its descriptor was
		 * closed before the fork) */
		pthread_mutex_init(&L.lock, NULL);
		L.running = false;
		for (int i = 0; i < L.n; i++)
			if (atomic_fetch_sub(&L.v[i].s->refs, 1) == 1)
				shim_abandon(L.v[i].s);
		L.n = 0;
		return;
	}
	pthread_mutex_lock(&L.lock);
	int n = L.n;
	struct late v[64];
	int k = 0;
	while (L.n && k < 64)
		v[k++] = L.v[--L.n];
	pthread_mutex_unlock(&L.lock);
	for (int i = 0; i < k; i++)
		sock_put(v[i].s);
	if (n > 64)
		late_fork(false); /* the rest */
}

/* ------------------------------------------------------------------ idle memory
 *
 * Giving an idle stream's memory back. A carried connection writes its area as it works: the
 * peer's records into the control slots and the receive ring, ours into the send ring. The
 * kernel frees an idle TCP socket's buffers once they are read; the area's pages stayed
 * resident for the connection's life (4-8 kB of every SIPp call's connection end, 22 s on
 * hold, issue 14 item 2). So a stream that the program sent or read on joins the idle list
 * (idle_touch); a thread of the shim's looks at the list every DGSHIM_STREAM_IDLE_MS (1 s)
 * and gives back the area's pages (dgv_qp_discard) of each stream that no call touched for a
 * whole interval and that holds nothing: every byte arrived was read, no control message is
 * owed or on its way, and the provider finds no completion queued, no record partly placed and
 * no send queued (it checks under the QP's lock, which every placement takes). A stream that
 * stays busy (unread bytes) leaves the list after IDLE_TRIES looks; its next send or receive
 * lists it again. The thread sleeps on a condition while the list is empty: a process whose
 * streams are all given back is not woken. The pages come back zeroed when next written. */

enum { IDLE_OFF = 0, IDLE_LISTED, IDLE_LOOKED };
enum { IDLE_TRIES = 3 };

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool running, asleep; /* asleep: the thread waits for the list to have an entry */
	struct stream *head, *tail; /* oldest first */
	uint32_t n;
} R = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, NULL, NULL, 0};

/* DGSHIM_STREAM_IDLE_MS, once (0: streams keep their pages). */
static uint32_t idle_ms(void)
{
	static _Atomic uint32_t v = UINT32_MAX;
	uint32_t x = atomic_load_explicit(&v, memory_order_relaxed);
	if (x == UINT32_MAX) {
		x = (uint32_t)dg_env_long(DG_ENV_STREAM_IDLE_MS);
		atomic_store_explicit(&v, x, memory_order_relaxed);
	}
	return x;
}

/* Needs R.lock. */
static void idle_link(struct stream *t)
{
	t->idle_next = NULL;
	t->idle_prev = R.tail;
	if (R.tail)
		R.tail->idle_next = t;
	else
		R.head = t;
	R.tail = t;
	R.n++;
	atomic_store_explicit(&t->idle_state, IDLE_LISTED, memory_order_relaxed);
}

/* Needs R.lock; t is listed. */
static void idle_unlink(struct stream *t)
{
	if (t->idle_prev)
		t->idle_prev->idle_next = t->idle_next;
	else
		R.head = t->idle_next;
	if (t->idle_next)
		t->idle_next->idle_prev = t->idle_prev;
	else
		R.tail = t->idle_prev;
	t->idle_prev = t->idle_next = NULL;
	R.n--;
}

/* Gives t's area back when it holds nothing. Returns 0 (given back), -EBUSY (not idle now),
 * -EOPNOTSUPP (not an established soft stream). Needs s->lock. */
static int idle_give_back(struct sock *s, struct stream *t)
{
	if (t->state != SS_ESTAB || !t->qp || !t->area || t->own_cm || !pv_can(t->pv, DGV_CAP_RC_DISCARD))
		return -EOPNOTSUPP;
	/* our records' completions (and any the peer made) are taken first, as a poll of another
	 * thread's would take them: what they say is told to the waits */
	if (t->cq && dgv_cq_ready(t->cq) > 0)
		progress_look(s, t, CHECK_QUEUED);
	if (t->state != SS_ESTAB || !t->area)
		return -EOPNOTSUPP;
	if (t->arrived != t->consumed || t->ctl_owed || t->ctl_out_n) {
		DG_DBG("stream: not idle: %llu bytes unread, control message %s", (unsigned long long)(t->arrived - t->consumed),
		       t->ctl_owed ? "owed" : t->ctl_out_n ? "on its way" : "none");
		return -EBUSY;
	}
	/* the sentinel's page stays (its receive is posted there) */
	int r = dgv_qp_discard(t->qp, t->area, (size_t)(t->sentinel - t->area));
	if (r == 0)
		atomic_fetch_add(&T.idle_freed, 1);
	else
		DG_DBG("stream: its buffers stay: %s", strerror(-r));
	return r;
}

/* One look at every listed stream: one touched since the last look moves to the tail, one
 * that was not is given back (or, busy, kept for IDLE_TRIES looks). Needs R.lock (released
 * while a stream is looked at). */
static void idle_sweep(void)
{
	for (uint32_t k = R.n; k && R.head; k--) {
		struct stream *t = R.head;
		idle_unlink(t);
		uint32_t a = atomic_load_explicit(&t->act, memory_order_relaxed);
		if (a != t->idle_seen) {
			t->idle_seen = a;
			t->idle_tries = 0;
			idle_link(t);
			continue;
		}
		struct sock *s = t->idle_s;
		if (!sock_hold(s)) {
			/* release: the teardown that finds it off (idle_forget, acquire) and frees t
			 * comes after our writes to it (idle_unlink) */
			atomic_store_explicit(&t->idle_state, IDLE_OFF, memory_order_release);
			continue; /* closed: its teardown does not find it listed */
		}
		atomic_store_explicit(&t->idle_state, IDLE_LOOKED, memory_order_relaxed);
		pthread_mutex_unlock(&R.lock);
		sock_lock(s);
		int r = -EOPNOTSUPP;
		if (!sock_gone(s) && s->strm == t && atomic_load_explicit(&t->act, memory_order_relaxed) == a)
			r = idle_give_back(s, t);
		/* under s->lock: a send or receive after this sees the state this sets */
		pthread_mutex_lock(&R.lock);
		if (atomic_load_explicit(&t->act, memory_order_relaxed) != a)
			r = -EBUSY, t->idle_tries = 0; /* touched while looked at: look again */
		if (r == -EBUSY && !sock_gone(s) && s->strm == t && ++t->idle_tries < IDLE_TRIES)
			idle_link(t);
		else
			atomic_store_explicit(&t->idle_state, IDLE_OFF, memory_order_relaxed);
		pthread_mutex_unlock(&R.lock);
		sock_unlock(s);
		sock_unhold(s);
		pthread_mutex_lock(&R.lock);
	}
}

static void *idle_thread(void *arg)
{
	(void)arg;
	shim_depth++; /* everything here is the shim's own */
	pthread_mutex_lock(&R.lock);
	for (;;) {
		if (!R.head) {
			R.asleep = true;
			pthread_cond_wait(&R.cv, &R.lock);
			R.asleep = false;
			continue;
		}
		/* an interval from now; a stream listed meanwhile waits for the next one (idle
		 * between one and two intervals, as the destinations' sweep in peer.c) */
		struct timespec ts = mono_deadline((uint64_t)idle_ms() * 1000u);
		while (pthread_cond_timedwait(&R.cv, &R.lock, &ts) != ETIMEDOUT)
			;
		idle_sweep();
	}
	return NULL;
}

/* A send or receive of the program's on t: lists it (the thread started on first use). Needs
 * s->lock. */
static void idle_touch(struct sock *s, struct stream *t)
{
	atomic_store_explicit(&t->act, atomic_load_explicit(&t->act, memory_order_relaxed) + 1, memory_order_relaxed);
	if (atomic_load_explicit(&t->idle_state, memory_order_relaxed) != IDLE_OFF || !idle_ms())
		return;
	pthread_mutex_lock(&R.lock);
	if (!R.running)
		R.running = mono_thread_start(&R.cv, idle_thread);
	if (R.running) {
		t->idle_s = s;
		/* as if touched since the last look: the first look only notes it, so a stream is
		 * given back after one to two intervals untouched, never sooner */
		t->idle_seen = atomic_load_explicit(&t->act, memory_order_relaxed) - 1;
		t->idle_tries = 0;
		idle_link(t);
		if (R.asleep)
			pthread_cond_signal(&R.cv);
	}
	pthread_mutex_unlock(&R.lock);
}

/* t's resources go: off the list (the sweep, looking at it now, sees the socket gone). Needs
 * s->lock. */
static void idle_forget(struct stream *t)
{
	if (atomic_load_explicit(&t->idle_state, memory_order_acquire) != IDLE_LISTED)
		return;
	pthread_mutex_lock(&R.lock);
	if (atomic_load_explicit(&t->idle_state, memory_order_relaxed) == IDLE_LISTED) {
		idle_unlink(t);
		atomic_store_explicit(&t->idle_state, IDLE_OFF, memory_order_relaxed);
	}
	pthread_mutex_unlock(&R.lock);
}

/* Fork, in the child (single-threaded): the thread is not here; the parent's streams are
 * the parent's (stream_after_fork), so nothing listed stays listed. */
static void idle_fork(bool child)
{
	if (!child)
		return;
	pthread_mutex_init(&R.lock, NULL);
	for (struct stream *t = R.head, *nx; t; t = nx) {
		nx = t->idle_next;
		t->idle_prev = t->idle_next = NULL;
		atomic_store_explicit(&t->idle_state, IDLE_OFF, memory_order_relaxed);
	}
	R.head = R.tail = NULL;
	R.n = 0;
	R.running = R.asleep = false;
}

static void closing_fork(bool child);

void stream_fork(bool child)
{
	late_fork(child);
	idle_fork(child);
	closing_fork(child);
}

/* What the client of a device stream said on its TCP connection nfd while we wait for its
 * device connection: 1 "stay plain" (it cannot reach our device listener; taken off the
 * connection), 0 nothing yet, -ECONNABORTED it closed, -EPROTO anything else (a dgshim client
 * says nothing else there). */
static int rv_client_said(int nfd)
{
	struct stream_rendezvous z;
	int got = rv_take(nfd, &z);
	if (got < 0)
		return got == -EPROTO ? -EPROTO : -ECONNABORTED;
	return got && z.port ? -EPROTO : got;
}

/* The device connection request that carries cookie, from the listener's stash or its
 * channel (others are stashed for their own accept), waiting up to RV_WAIT_MS, while the
 * client's TCP connection nfd is watched for its "stay plain" (rv_client_said). Takes ls->lock
 * (held while waiting on the channel: the listener cannot go away meanwhile). Returns 0 with
 * *req and *dh, 1 "stay plain", or -errno. */
static int rv_request(struct sock *ls, int nfd, uint64_t cookie, struct dgv_conn_req **req,
		      struct stream_dhello *dh)
{
	int left = RV_WAIT_MS, rc = -ETIMEDOUT;
	*req = NULL;
	sock_lock(ls);
	for (;;) {
		struct stream *lt = ls->strm;
		if (!lt || !lt->dlis) {
			rc = -ECONNABORTED;
			break;
		}
		for (int i = 0; lt->stash && i < RV_STASH && !*req; i++)
			if (lt->stash[i].req && lt->stash[i].dh.cookie == cookie) {
				*req = lt->stash[i].req, *dh = lt->stash[i].dh;
				lt->stash[i].req = NULL;
			}
		struct dgv_cm_event ev;
		while (!*req && dgv_cm_get_event(lt->lch, &ev) == 0) {
			if (ev.type != DGV_CM_CONNECT_REQUEST)
				continue;
			struct stream_dhello h;
			if (ev.pdata_len < sizeof h) {
				DG_WARN("stream: a device connection request without a dgshim hello: rejected");
				dgv_reject(ev.req, NULL, 0);
				continue;
			}
			memcpy(&h, ev.pdata, sizeof h);
			if (h.cookie == cookie) {
				*req = ev.req, *dh = h;
				break;
			}
			/* another connection's, its accept() is still to come: the oldest makes room */
			if (!lt->stash && !(lt->stash = calloc(RV_STASH, sizeof *lt->stash))) {
				DG_WARN("stream: no memory to keep a device connection request for its "
					"accept(): rejected");
				dgv_reject(ev.req, NULL, 0);
				continue;
			}
			unsigned k = lt->stash_next++ % RV_STASH;
			if (lt->stash[k].req)
				dgv_reject(lt->stash[k].req, NULL, 0);
			lt->stash[k].req = ev.req, lt->stash[k].dh = h;
		}
		if (*req) {
			rc = 0;
			break;
		}
		int said = rv_client_said(nfd);
		if (said) {
			rc = said;
			break;
		}
		if (left <= 0)
			break;
		dgv_cm_wait(lt->lch, 50);
		left -= 50;
	}
	sock_unlock(ls);
	return rc;
}

/* The passive side of a device stream on an accepted TCP connection whose client wants the
 * device: names our device listener and a cookie on the connection (stream_rv), then accepts
 * the client's rdma_cm request that echoes the cookie. Needs ns->lock. Returns 0, 1 when the
 * device has no room for it (memory it may not pin: RLIMIT_MEMLOCK; no queue, no descriptor:
 * the client was told "stay plain" and the kernel carries the connection), or -errno. */
static int accept_dev(struct sock *ns, int nfd, struct sock *ls, const union dgv_sockaddr *dlis)
{
	struct stream *t = ns->strm;
	int rc = res_setup(t, &G.dev);
	if (!rc)
		t->qfd = nfd;
	if (rc) {
		res_free(t);
		if (!stay_plain_send(nfd))
			return rc;
		DG_WARN("fd %d: no device resources for a client that asked for the device (%s%s): plain TCP",
			nfd, strerror(-rc), dev_res_hint(&G.dev, rc));
		return 1;
	}
	static _Atomic uint64_t seq;
	uint64_t cookie;
	if (getrandom(&cookie, sizeof cookie, GRND_NONBLOCK) != sizeof cookie)
		cookie = shim_now_us() ^ ((uint64_t)getpid() << 32);
	cookie ^= atomic_fetch_add(&seq, 1);
	struct stream_rv rv = {.magic = htobe32(STREAM_RV_MAGIC), .port = htobe16((uint16_t)port_of(dlis)),
			       .cookie = cookie};
	if (dlis->sa.sa_family == AF_INET && dlis->sin.sin_addr.s_addr != htonl(INADDR_ANY)) {
		rv.family = htobe16(4);
		memcpy(rv.addr, &dlis->sin.sin_addr, 4);
	} else if (dlis->sa.sa_family == AF_INET6 && !IN6_IS_ADDR_UNSPECIFIED(&dlis->sin6.sin6_addr)) {
		rv.family = htobe16(6);
		memcpy(rv.addr, &dlis->sin6.sin6_addr, 16);
	} /* else 0: the wildcard listens on every device, the client uses the address it knows */
	if (real.send(nfd, &rv, sizeof rv, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof rv)
		return -EIO;
	struct dgv_conn_req *req;
	struct stream_dhello dh;
	if ((rc = rv_request(ls, nfd, cookie, &req, &dh))) {
		if (rc == 1) {
			DG_WARN("fd %d: the client cannot reach our device listener: plain TCP", nfd);
			res_free(t);
		}
		return rc;
	}
	rc = accept_hello(ns, t, req, (const uint8_t *)&dh.h, sizeof dh.h);
	return !rc && t->state == SS_NEW ? 1 : rc; /* 1: no room for its queue pair, "stay plain" said */
}

/* A named listener's registry name follows the shim's descriptor budget: withdrawn when a few
 * more connections would not fit (new clients then connect plain, as they would to a program
 * without the shim; those already connecting are carried), named again when they fit. Needs
 * ls->lock. */
static void listener_budget(struct stream *lt, int fd)
{
	if (lt->regfd >= 0 && !lt->budget_off && !own_room(3 * 4, "a new TCP connection to a listener")) {
		reg_del(lt->regfd);
		lt->regfd = -1;
		lt->budget_off = true;
	} else if (lt->budget_off && own_room(3 * 8, NULL)) {
		union dgv_sockaddr la;
		int port = local_port(fd, &la);
		if (port > 0 && (lt->regfd = reg_add(name_listen((unsigned)port, false))) >= 0)
			lt->budget_off = false;
		else
			lt->regfd = -1;
	}
}

int stream_accept(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	struct sock *ls = fd_sock(fd);
	struct stream *lt = ls ? ls->strm : NULL;
	bool ours = false, devl = false;
	union dgv_sockaddr dlis = {0};
	if (lt) {
		sock_lock(ls);
		ours = lt->state == SS_LISTEN && lt->named;
		if (ours)
			listener_budget(lt, fd);
		if ((devl = ours && lt->dlis != NULL))
			dlis = lt->dlis_addr;
		sock_unlock(ls);
	}
	union dgv_sockaddr pa;
	socklen_t pl = sizeof pa;
	int nfd = real.accept4(fd, &pa.sa, &pl, flags);
	if (nfd < 0)
		return -errno;
	if (a && l) {
		memcpy(a, &pa, *l < pl ? *l : pl);
		*l = pl;
	}
	if (pa.sa.sa_family != AF_INET && pa.sa.sa_family != AF_INET6)
		return nfd;
	if (!ours) {
		if (lt)
			atomic_fetch_add(&T.plain, 1); /* a taken listener kept plain (IWARP_MODE_OFF, rules) */
		return nfd;
	}
	union dgv_sockaddr la;
	int lport = local_port(nfd, &la);
	uint64_t un;
	bool by_cm = false; /* the client asked for the device listener's path */
	if (devl && ip_local(&pa)) {
		un = name_client(port_of(&pa), lport > 0 ? (unsigned)lport : 0, true);
		by_cm = reg_has(un);
	}
	if (!by_cm)
		un = name_client(port_of(&pa), lport > 0 ? (unsigned)lport : 0, false);
	/* a client on this host said by its registry name whether it speaks; one on another
	 * host says it with its first bytes (answer(): an MPA Request or not), unless the rules
	 * keep its address plain */
	bool remote = !ip_local(&pa);
	if (remote && decide(lt, DG_ROLE_RECEIVER, &pa, pl) == IWARP_MODE_OFF)
		remote = false;
	if (!remote && (!ip_local(&pa) || !reg_has(un))) {
		atomic_fetch_add(&T.plain, 1);
		DG_DBG("fd %d: accepted TCP from port %u: not ours, plain TCP", nfd, port_of(&pa));
		return nfd;
	}
	struct sock *ns = sock_new_stream(nfd, pa.sa.sa_family, (flags & SOCK_NONBLOCK) != 0, IWARP_MODE_AUTO);
	if (!ns) {
		/* the client will not hear an MPA Reply: it fails, rather than read plain bytes */
		real.close(nfd);
		return -ENOMEM;
	}
	sock_lock(ns);
	memcpy(&ns->peer, &pa, pl);
	ns->peerlen = pl;
	ns->connected = true;
	nodelay_take(ns->strm, nfd);
	lowat_take(ns->strm, nfd); /* inherited from the listener, as the kernel's */
	int rc = 0;
	if (by_cm) {
		rc = accept_dev(ns, nfd, ls, &dlis);
		if (rc == 1) {
			sock_unlock(ns);
			go_plain(nfd);
			return nfd;
		}
	} else {
		/* the MPA Request waits in the kernel until the program first uses the connection:
		 * a forking server's child answers it in its own process (answer()) */
		ns->strm->state = SS_ANSWER;
		ns->strm->probe = remote;
		ns->strm->qfd = nfd; /* where the Request comes (stream_fd_closing moves it) */
		DG_DBG("fd %d: accepted TCP from port %u: %s, answered at first use", nfd, port_of(&pa),
		       remote ? "another host's, its first bytes decide" : "ours");
	}
	sock_unlock(ns);
	if (!rc && !by_cm)
		late_add(ns, nfd);
	if (rc) {
		DG_WARN("fd %d: iWARP accept failed (%s): connection closed", nfd, strerror(-rc));
		sock_closing(nfd);
		real.close(nfd);
		return rc == -ETIMEDOUT ? -ECONNABORTED : (rc == -ENOMEM ? -ENOMEM : -ECONNABORTED);
	}
	return nfd;
}

/* ------------------------------------------------------------------ data */

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

static void epipe(int flags)
{
	if (!(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
}

/* Bytes the peer's ring and record budget let us post now. */
static size_t tx_room(const struct stream *t)
{
	uint64_t win = t->p_ring < t->ring ? t->p_ring : t->ring;
	uint64_t used = t->sent - t->peer_consumed;
	if (used >= win || t->recs_sent - t->peer_recs >= t->p_max_recs || t->tx_out >= SQ_DEPTH - CTL_SLOTS - 4)
		return 0;
	return (size_t)(win - used);
}

/* The c bytes of iov from byte skip on as at most NOW_SGE SGEs of the program's memory (lkey 0:
 * DGV_SEND_NOW does not look). Returns how many, 0 when they take more. */
static int iov_sges(const struct iovec *iov, int iovcnt, size_t skip, size_t c, struct dgv_sge *sge)
{
	int k = 0;
	for (int i = 0; i < iovcnt && c; i++) {
		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		size_t l = iov[i].iov_len - skip < c ? iov[i].iov_len - skip : c;
		if (k == NOW_SGE)
			return 0;
		sge[k++] = (struct dgv_sge){(uint64_t)(uintptr_t)iov[i].iov_base + skip, (uint32_t)l, 0};
		c -= l;
		skip = 0;
	}
	return c ? 0 : k;
}

/* Copies up to n bytes of iov (from byte skip) into the send ring and posts them as data
 * records, as far as the window lets. Where completions cost (DGV_CAP_SIGNAL_COSTS) one record
 * in SIGNAL_EVERY asks for one, and with sig_last the one that ends the n bytes (a later
 * completion retires the records before it); elsewhere every record does. t->sig_seq is the
 * last record that will complete. Returns the bytes posted, or -errno when none was. Needs
 * s->lock. */
static ssize_t post_data(struct sock *s, struct stream *t, const struct iovec *iov, int iovcnt, size_t skip,
			 size_t n, bool sig_last)
{
	size_t done = 0;
	while (done < n) {
		uint64_t pos = t->sent;
		size_t toff = (size_t)(pos & (t->ring - 1)), poff = (size_t)(pos & (t->p_ring - 1));
		size_t c = n - done;
		if (c > CHUNK)
			c = CHUNK;
		if (c > t->ring - toff)
			c = t->ring - toff;
		if (c > t->p_ring - poff)
			c = t->p_ring - poff;
		bool sig = !pv_can(t->pv, DGV_CAP_SIGNAL_COSTS) || (t->data_seq + 1) % SIGNAL_EVERY == 0 ||
			   (sig_last && done + c == n);
		struct dgv_sge sge[NOW_SGE];
		struct dgv_send_wr wr = {.wr_id = WR_SEND | (t->data_seq + 1) << 8 | WR_DATA, .sg_list = sge, .num_sge = 1,
					 .opcode = DGV_WR_WRITE_RECORD, .send_flags = sig ? DGV_SEND_SIGNALED : 0,
					 .remote_addr = t->p_ring_addr + poff, .rkey = t->p_stag},
				   *bad;
		/* A small write into an idle connection goes from the program's own buffer during
		 * the post (DGV_SEND_NOW): the send ring is neither copied into nor written, so a
		 * connection that trades requests and replies never writes a page of it (issue 14
		 * item 2: SIPp's calls). Its bytes keep their place in the ring's positions. */
		int rc = -EAGAIN;
		if (c <= NOW_MAX && pv_can(t->pv, DGV_CAP_RC_SEND_NOW) &&
		    (wr.num_sge = iov_sges(iov, iovcnt, skip + done, c, sge)) > 0) {
			wr.send_flags |= DGV_SEND_NOW;
			rc = dgv_post_send(t->qp, &wr, &bad);
			wr.send_flags &= ~(unsigned)DGV_SEND_NOW;
		}
		if (rc) {
			/* gather the program's pieces into the ring */
			size_t got = 0, at = skip + done;
			for (int i = 0; i < iovcnt && got < c; i++) {
				if (at >= iov[i].iov_len) {
					at -= iov[i].iov_len;
					continue;
				}
				size_t k = iov[i].iov_len - at < c - got ? iov[i].iov_len - at : c - got;
				memcpy(t->tx + toff + got, (const uint8_t *)iov[i].iov_base + at, k);
				got += k;
				at = 0;
			}
			sge[0] = (struct dgv_sge){(uint64_t)(uintptr_t)(t->tx + toff), (uint32_t)c, t->mr_out->lkey};
			wr.num_sge = 1;
			if ((rc = dgv_post_send(t->qp, &wr, &bad)))
				return done ? (ssize_t)done : rc;
		}
		t->data_seq++;
		if (sig)
			t->sig_seq = t->data_seq;
		t->sent += c;
		t->recs_sent++;
		t->tx_out++;
		done += c;
		s->st->tx_framed++;
		s->st->tx_framed_bytes += c;
		if (t->recs_sent - t->peer_recs >= t->p_max_recs)
			break;
	}
	return (ssize_t)done;
}

/* Whether a blocking receive on t may wait in the kernel's own recv on the program's socket
 * (rx_wait): an established stream on a provider whose RC QP reads that socket and lets the
 * caller read it instead (DGV_CAP_RC_RX_FEED), no receive timeout to keep (the kernel's would
 * restart at each wait), and the thread's buffer at hand. Needs s->lock. */
static bool rx_wait_ok(const struct sock *s, const struct stream *t)
{
	return t->qp && !t->own_cm && t->state == SS_ESTAB && t->qfd >= 0 && !t->rx_wait_off && !t->tcp_down &&
	       !t->peer_fin && !t->shut_rd && !t->err && s->rcvtimeo_ms <= 0 && pv_can(t->pv, DGV_CAP_RC_RX_FEED) &&
	       shim_rxbuf();
}

struct rx_claim {
	struct sock *s;
	struct stream *t;
	struct dgv_qp *qp; /* the QP claimed (t->qp may change: a close tears it down) */
};

/* Ends a claim nothing was read for (why: -EAGAIN, -ECANCELED), unless a close tore its QP
 * down meanwhile. Needs s->lock. */
static void rx_unclaim(struct rx_claim *c, int why)
{
	if (c->qp && !sock_gone(c->s) && c->t->qp == c->qp)
		dgv_qp_rx_stream_feed(c->qp, NULL, why);
	c->qp = NULL;
}

/* Cancellation inside rx_wait's recv (the program's pthread_cancel): the claim must end, or
 * nothing would read the connection again. Takes s->lock. */
static void rx_wait_cancelled(void *arg)
{
	struct rx_claim *c = arg;
	sock_lock(c->s);
	rx_unclaim(c, -ECANCELED);
	sock_unlock(c->s);
}

/*
 * A blocking receive's wait as the kernel's own: one recv on the program's socket, which
 * sleeps until TCP brings bytes (signals and cancellation are the kernel's and libc's, as
 * natively), into the thread's buffer; the QP then takes them (dgv_qp_rx_stream_feed) as if it
 * had read them. Natively a receive that waits is one system call; a look that found nothing,
 * a poll and then the provider's read made it three. c holds the QP's claim (room: the most
 * bytes it takes), which this ends. Called with s->lock held, returns with it held. Returns 0
 * (look again), 1 (look again, reading TCP: the read filled the buffer, more may wait), -EINTR,
 * -EBADF (closed meanwhile).
 */
static int rx_wait(struct rx_claim *c, size_t room)
{
	struct sock *s = c->s;
	struct stream *t = c->t;
	uint8_t *b = shim_rxbuf();
	int fd = t->qfd;
	sock_unlock(s);
	ssize_t n;
	size_t want = room < SHIM_SLOT ? room : SHIM_SLOT;
	pthread_cleanup_push(rx_wait_cancelled, c);
	int cs = shim_cancel_open();
	n = real.recvfrom(fd, b, want, 0, NULL, NULL);
	shim_cancel_close(cs);
	pthread_cleanup_pop(0);
	int e = errno;
	sock_lock(s);
	if (unlikely(sock_gone(s)) || t->qp != c->qp) {
		c->qp = NULL;
		return -EBADF; /* closed by another thread meanwhile: torn down, the claim with it */
	}
	dgv_qp_rx_stream_feed(c->qp, b, n < 0 ? -e : n);
	c->qp = NULL;
	if (n < 0 && (e == EAGAIN || e == EWOULDBLOCK))
		t->rx_wait_off = true; /* O_NONBLOCK at the kernel (a duplicate's flags): wait by poll */
	return n < 0 && e == EINTR ? -EINTR : (size_t)n == want;
}

/* Waits for a connecting stream. Needs s->lock. Returns 0 when established, 1 when the server
 * said "stay plain" (the kernel carries the call), or -errno. */
static int wait_connected(struct sock *s, struct stream *t, bool nb)
{
	int timeout = -1;
	while (t->state == SS_CONNECTING) {
		progress(s, t);
		if (t->state != SS_CONNECTING)
			break;
		if (nb)
			return -EAGAIN;
		int w = stream_wait(s, t, &timeout);
		if (w)
			return w;
	}
	if (t->state == SS_NEW)
		return 1;
	return t->state == SS_ESTAB ? 0 : -(t->err ? t->err : ENOTCONN);
}

/* The start of a send or receive: takes s->lock and answers a waiting MPA Request (waiting
 * for it as the call would for data: not when it must not block, up to SO_RCVTIMEO or
 * SO_SNDTIMEO). Returns the stream with s->lock held when the shim carries the call, or NULL
 * (lock released) when the kernel does (not carried, or a listener: *err 0) or the Request is
 * not there yet (*err -EAGAIN or -EINTR). *nb: the call must not block. */
static struct stream *io_begin(struct sock *s, int fd, int flags, bool send, bool *nb, ssize_t *err)
{
	sock_lock(s);
	struct stream *t = s->strm;
	*nb = s->user_nonblock || (flags & MSG_DONTWAIT);
	*err = 0;
	if (unlikely(t->state == SS_ANSWER)) {
		int tmo = send ? s->sndtimeo_ms : s->rcvtimeo_ms;
		int rc = answer(s, t, fd, *nb ? 0 : tmo > 0 ? tmo : -1);
		if (rc) {
			sock_unlock(s);
			*err = rc;
			return NULL;
		}
	}
	if (t->state == SS_NEW || t->state == SS_LISTEN) {
		sock_unlock(s);
		return NULL;
	}
	if (t->state == SS_ESTAB && t->area)
		idle_touch(s, t);
	return t;
}

/* A send or receive the kernel carries. Returns its answer or -errno. */
static ssize_t kernel_io(int fd, const struct iovec *iov, int iovcnt, int flags, bool send)
{
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
	ssize_t r = send ? real.sendmsg(fd, &m, flags) : real.recvmsg(fd, &m, flags);
	return r < 0 ? -errno : r;
}

ssize_t stream_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	bool nb;
	ssize_t rc;
	struct stream *t = io_begin(s, fd, flags, true, &nb, &rc);
	if (!t) {
		if (rc)
			return rc;
		if (flags & MSG_FASTOPEN)
			return -EOPNOTSUPP; /* as a kernel without TCP Fast Open: the program connects */
		return kernel_io(fd, iov, iovcnt, flags, true);
	}
	rc = wait_connected(s, t, nb);
	if (rc == 1) {
		sock_unlock(s);
		return kernel_io(fd, iov, iovcnt, flags, true);
	}
	if (rc)
		goto out;
	size_t total = iov_total(iov, iovcnt), done = 0;
	int timeout = s->sndtimeo_ms > 0 ? s->sndtimeo_ms : -1;
	/* watched by other waits through TCP alone: if TCP refuses these bytes, the provider's
	 * thread completes them, and those waits must take the CQ's descriptor (below) */
	bool self0 = (t->nbells || s->neps) && stream_self(t);
	for (bool first = true;; first = false) {
		/* Room for all of it already: no need to look at the connection first (a read of the
		 * TCP socket); a peer's close is then found by the next call, as the kernel finds
		 * it only once the peer answers data sent after its close. */
		if (!first || t->err || t->tcp_down || tx_room(t) < total)
			progress(s, t);
		if (t->shut_wr || t->fin_sent || t->peer_close) {
			/* a kernel's write to a closed peer is answered with a reset: the
			 * socket is over both ways from then on (POLLHUP) */
			if (t->peer_close)
				t->reset = true;
			rc = -EPIPE;
			break;
		}
		if (t->err || t->tcp_down) {
			rc = t->err ? -t->err : -EPIPE;
			t->err = 0;
			break;
		}
		if (done == total && total)
			break;
		size_t room = tx_room(t);
		if (room) {
			size_t want = total - done < room ? total - done : room;
			/* a blocking write waits for its last record's completion (below): that record
			 * must ask for one */
			ssize_t p = want ? post_data(s, t, iov, iovcnt, done, want, !nb) : 0;
			if (p < 0) {
				if (p != -ENOMEM && p != -EAGAIN) {
					rc = p;
					break;
				}
			} else {
				done += (size_t)p;
			}
			if (done == total)
				break;
			continue;
		}
		if (nb)
			break;
		int w = stream_wait(s, t, &timeout);
		if (w) {
			rc = w;
			break;
		}
	}
	/* A blocking write returns once TCP has what it accepted, as the kernel's: then a writer
	 * that dies next (exit, _exit, a signal) loses nothing, and its reader sees the end.
	 * The soft provider hands records to TCP as they are posted; this waits only while TCP's
	 * buffer is full. A device's records are only posted: the device's QP dies with the
	 * process, and what it had not sent yet with it (siw: records not yet handed to its TCP
	 * socket; a writer that called _exit lost 55 kB of 8 MiB once), so a blocking write on a
	 * device waits for its last record's completion (siw: handed to TCP; rxe: acknowledged by
	 * the peer, one round trip per write). Not when that record could not ask for one (the
	 * write ended early on an error). */
	while (done && !nb && t->tx_out && t->sig_seq == t->data_seq && !t->err && !t->tcp_down) {
		progress_look(s, t, LOOK_LAZY); /* the completions it waits for are queued, or it waits */
		if (!t->tx_out || t->err || t->tcp_down)
			break;
		if (stream_wait(s, t, &timeout))
			break;
	}
	if (self0 && !stream_self(t))
		tell_waiters(s, t);
	if (done) {
		atomic_fetch_add(&T.tx_bytes, done);
		rc = (ssize_t)done;
	} else if (!rc) {
		rc = total ? -EAGAIN : 0;
	}
out:
	sock_unlock(s);
	if (rc == -EPIPE)
		epipe(flags);
	return rc;
}

/* Copies up to len stream bytes at offset `from` of the unread data into iov. */
static size_t copy_out(struct stream *t, const struct iovec *iov, int iovcnt, size_t iskip, uint64_t from,
		       size_t len)
{
	size_t done = 0;
	int i = 0;
	while (i < iovcnt && iskip >= iov[i].iov_len)
		iskip -= iov[i].iov_len, i++;
	for (; i < iovcnt && done < len; i++) {
		size_t room = iov[i].iov_len - iskip, k = room < len - done ? room : len - done;
		uint8_t *dst = (uint8_t *)iov[i].iov_base + iskip;
		iskip = 0;
		while (k) {
			size_t off = (size_t)((from + done) & (t->ring - 1));
			size_t c = k < t->ring - off ? k : t->ring - off;
			memcpy(dst, t->rx + off, c);
			dst += c, done += c, k -= c;
		}
	}
	return done;
}

ssize_t stream_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	bool nb;
	ssize_t rc;
	struct stream *t = io_begin(s, fd, flags, false, &nb, &rc);
	if (!t)
		return rc ? rc : kernel_io(fd, iov, iovcnt, flags, false);
	if (flags & MSG_OOB) {
		sock_unlock(s);
		return -EINVAL; /* no urgent data is ever carried */
	}
	rc = wait_connected(s, t, nb);
	if (rc == 1) {
		sock_unlock(s);
		return kernel_io(fd, iov, iovcnt, flags, false);
	}
	if (rc)
		goto out;
	size_t total = iov_total(iov, iovcnt), done = 0;
	bool waitall = (flags & MSG_WAITALL) && !(flags & MSG_PEEK);
	bool lowat_expired = false, eager = false;
	int timeout = s->rcvtimeo_ms > 0 ? s->rcvtimeo_ms : -1;
	for (;;) {
		/* a blocking receive with nothing at hand claims the socket's reading before it looks
		 * (rx_wait): the look then makes no system call, and when nothing came the wait is
		 * the one read. With bytes at hand the look reads TCP as far as it can, as before:
		 * a slow reader's peer must see its data taken off TCP (its close waits for that; and
		 * its end of stream, behind the data, stops our credit, which would reach its closed
		 * socket and reset the connection under data still unread). So after a direct read
		 * that filled its buffer, the next look reads TCP too (eager). */
		struct rx_claim cl = {s, t, NULL};
		size_t room = 0;
		if (!nb && total && !eager && t->arrived == t->consumed && rx_wait_ok(s, t) &&
		    dgv_qp_rx_claim(t->qp, &room) == 0)
			cl.qp = t->qp;
		/* Bytes at hand: they are returned without a look at TCP (a short read, as the
		 * kernel's when that is all it has). The readiness check that woke an epoll server
		 * has just read TCP, and a look would find nothing: one recvfrom for nothing per
		 * request. The look before a credit is not skipped (below). */
		if (cl.qp || t->arrived == t->consumed || eager || (flags & MSG_PEEK) || t->state != SS_ESTAB ||
		    t->rv_wait || t->err || t->tcp_down) {
			progress_look(s, t, LOOK_LAZY);
		}
		eager = false;
		if (cl.qp && (t->arrived != t->consumed || t->state != SS_ESTAB || t->peer_fin || t->shut_rd || t->err ||
			      t->tcp_down))
			rx_unclaim(&cl, -EAGAIN); /* no wait follows */
		/* after shutdown(SHUT_RD) what is queued (and, as Linux, what still comes) is read;
		 * with nothing queued the read returns 0 instead of waiting */
		uint64_t avail = t->arrived - t->consumed;
		/* SO_RCVLOWAT: a blocking read waits until that many bytes are there (or the end,
		 * an error, the timeout) */
		if (avail && !done && !waitall && !nb && !lowat_expired && avail < lowat_target(t, total) &&
		    !t->peer_fin && !t->shut_rd && !t->err && !t->tcp_down) {
			int w = stream_wait(s, t, &timeout);
			if (w == -EAGAIN)
				lowat_expired = true; /* the timeout: what is there is returned */
			else if (w) {
				rc = w;
				break;
			}
			continue;
		}
		if (avail && total > done) {
			size_t want = total - done < avail ? total - done : (size_t)avail;
			size_t c = (flags & MSG_TRUNC) ? want
				   : copy_out(t, iov, iovcnt, done, t->consumed + ((flags & MSG_PEEK) ? done : 0), want);
			done += c;
			if (!(flags & MSG_PEEK)) {
				t->consumed += c;
				/* A credit is sent only after a look that read TCP, even with completions
				 * on the CQ (look 0, drain_cq): the writer's end of stream may be behind
				 * the data, and a credit reaching its closed socket would reset the
				 * connection under bytes still unread in ours. */
				if (credit_due(t)) {
					progress(s, t);
					credit_maybe(t);
				}
			}
			if (!waitall || done == total)
				break;
			continue;
		}
		if (total == 0 && !avail && !t->peer_fin && !t->err && !t->tcp_down && nb) {
			rc = -EAGAIN;
			break;
		}
		/* Linux: a blocking read of 0 bytes waits for data (or the end, or the timeout) like
		 * any read, then returns 0 */
		if (total == 0 && (avail || t->peer_fin || t->shut_rd || t->err || t->tcp_down))
			break;
		if (t->shut_rd || (t->peer_fin && t->consumed >= t->fin_total))
			break; /* end of stream */
		if (t->err) {
			if (!done)
				rc = -t->err;
			t->err = 0;
			break;
		}
		if (t->tcp_down)
			break;
		if (nb) {
			if (!done)
				rc = -EAGAIN;
			break;
		}
		int w = cl.qp ? rx_wait(&cl, room) : stream_wait(s, t, &timeout);
		if (w == 1)
			eager = true, w = 0;
		if (w) {
			if (!done && !(total == 0 && w == -EAGAIN))
				rc = w;
			break;
		}
	}
	if (done) {
		rc = (ssize_t)done;
		if (!(flags & MSG_PEEK))
			atomic_fetch_add(&T.rx_bytes, done);
	}
out:
	sock_unlock(s);
	return rc;
}

/* Over as a kernel socket would be closed: both FINs went, a reset, a failed connect. */
static bool closed_like(const struct stream *t)
{
	return t->state == SS_DEAD || t->reset || ((t->fin_sent || t->shut_wr) && t->peer_fin);
}

int stream_shutdown(struct sock *s, int fd, int how)
{
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	sock_lock(s);
	struct stream *t = s->strm;
	int rc = answer(s, t, fd, -1);
	if (rc) {
		sock_unlock(s);
		return rc; /* a signal while the Request was awaited */
	}
	if (t->state == SS_ESTAB && (progress(s, t), closed_like(t))) {
		rc = -ENOTCONN; /* the kernel's socket would be closed */
	} else if (t->state == SS_ESTAB || t->state == SS_CONNECTING) {
		progress(s, t);
		/* TCP stays open both ways: the read direction carries credit for our writes and the
		 * write direction credit for the peer's; the end of stream is a control message */
		if (how != SHUT_RD && !t->fin_sent) {
			t->shut_wr = true;
			if (t->state == SS_ESTAB && ctl_send(t, CTL_FIN) == 0)
				t->fin_sent = true;
		}
		if (how != SHUT_WR)
			t->shut_rd = true; /* as Linux: queued data stays readable */
	} else if (t->state == SS_DEAD) {
		rc = -ENOTCONN;
	} else {
		sock_unlock(s);
		return real.shutdown(fd, how) < 0 ? -errno : 0;
	}
	sock_unlock(s);
	return rc;
}

/* ------------------------------------------------------------------ readiness */

/*
 * What the kernel's tcp_poll reports besides data and room, from the stream's own state (the
 * TCP socket's is the provider's: it stays open both ways after a shutdown, and its closing
 * and resets follow the protocol, not the program): POLLRDHUP once the read side is over
 * (the peer's FIN, shutdown(SHUT_RD), a reset), POLLHUP once both sides are (the kernel's
 * SHUTDOWN_MASK), POLLERR while an error waits to be read.
 */
static int end_bits(const struct stream *t)
{
	bool dead = t->state == SS_DEAD || t->reset;
	bool rd_end = dead || t->shut_rd || t->peer_fin;
	bool wr_end = dead || t->shut_wr || t->fin_sent;
	return (rd_end ? POLLRDHUP : 0) | (rd_end && wr_end ? POLLHUP : 0) | (t->err || t->so_error ? POLLERR : 0);
}

/* Progress for a readiness check: always (queued false), or (queued) only when something
 * waits that a progress takes without I/O of its own: completions in the CQ, a control message
 * owed, a connection being made, a device's channel to arm. The cheap form serves the checks
 * a poll or epoll_wait makes of every registered socket on every round; the kernel reports
 * new TCP data on the program's descriptor and completions on the CQ's, and the checks after
 * such an event take the full form. Needs s->lock. */
static void progress_for_check(struct sock *s, struct stream *t, bool queued)
{
	if (!queued || t->own_cm || t->state == SS_CONNECTING || t->ctl_owed) {
		progress_look(s, t, queued ? 0 : CHECK_IO);
	} else if (t->cq && dgv_cq_ready(t->cq) > 0) {
		progress_look(s, t, CHECK_QUEUED);
	}
}

/* The start of a readiness check: takes s->lock, answers a waiting MPA Request if it is there
 * (else the stream stays SS_ANSWER: ready for nothing, its kernel socket's POLLIN wakes the
 * wait, stream_wait_fds) and, unless the kernel decides for this socket (not carried, or a
 * listener: returns NULL, lock held), drives progress as far as the check needs. Returns the
 * stream, s->lock held. */
static struct stream *check_begin(struct sock *s, int fd, bool queued)
{
	sock_lock(s);
	struct stream *t = s->strm;
	if (answer(s, t, fd, 0))
		return t; /* still SS_ANSWER */
	if (t->state == SS_NEW || t->state == SS_LISTEN)
		return NULL;
	/* a poll about to sleep on it: its bell first, then the look (news another thread takes
	 * after the look rings it). Also with a CQ eventfd: another thread's call may take the
	 * completion itself between this look and the wait's arming, leaving nothing to kick */
	if (shim_wait_bell)
		bell_add(t, shim_wait_bell);
	progress_for_check(s, t, queued);
	return t->state == SS_NEW ? NULL : t; /* NULL: "stay plain" came just now */
}

static int poll_in(struct sock *s, int fd, bool queued)
{
	struct stream *t = check_begin(s, fd, queued);
	int r;
	if (!t) {
		r = -1;
	} else if (t->state == SS_CONNECTING || t->state == SS_ANSWER) {
		r = 0;
	} else {
		r = t->state == SS_DEAD || t->arrived - t->consumed >= lowat_target(t, SIZE_MAX) || t->err ||
		    t->tcp_down || t->shut_rd || (t->peer_fin && t->consumed >= t->fin_total);
		r = r ? POLLIN | end_bits(t) : end_bits(t);
	}
	sock_unlock(s);
	return r;
}

int stream_poll_in(struct sock *s, int fd) { return poll_in(s, fd, false); }
int stream_poll_in_queued(struct sock *s, int fd) { return poll_in(s, fd, true); }

static int poll_out(struct sock *s, int fd, bool queued)
{
	struct stream *t = check_begin(s, fd, queued);
	int r;
	if (!t) {
		r = -1;
	} else {
		if (t->state == SS_CONNECTING || t->state == SS_ANSWER)
			r = 0;
		else if (t->state == SS_DEAD || t->err || t->tcp_down || t->fin_sent || t->shut_wr || t->peer_close)
			r = POLLOUT | end_bits(t); /* a write would not block: it fails */
		else
			r = (tx_room(t) ? POLLOUT : 0) | end_bits(t);
	}
	sock_unlock(s);
	return r;
}

int stream_poll_out(struct sock *s, int fd) { return poll_out(s, fd, false); }
int stream_poll_out_queued(struct sock *s, int fd) { return poll_out(s, fd, true); }

int stream_wait_fds(struct sock *s, int *qfd, short *qev, int *cqfd)
{
	sock_lock(s);
	struct stream *t = s->strm;
	*qfd = *cqfd = -1;
	*qev = 0;
	int r = -1;
	if (t->state == SS_ANSWER && t->qfd >= 0) {
		r = 0; /* the MPA Request, not whole yet, comes on TCP (answer) */
		*qfd = t->qfd;
		*qev = POLLIN | POLLRDHUP;
	} else if (t->cq && t->state != SS_NEW && t->state != SS_LISTEN) {
		r = 0; /* carried: both may be -1 (TCP over, nothing more can come: a fixed state) */
		if (t->state == SS_CONNECTING || t->state == SS_ESTAB)
			*qfd = tcp_wait(t, qev);
		/* a device's: progress, run by the readiness check before this, armed it */
		if (!t->own_cm || t->qp)
			cq_arm(t->cq, t->pv, &t->armed);
		if (!stream_self(t))
			*cqfd = t->wfd >= 0 ? t->wfd : dgv_cq_fd(t->cq);
	}
	sock_unlock(s);
	return r;
}

int stream_fionread(struct sock *s, int fd, int *out)
{
	sock_lock(s);
	struct stream *t = s->strm;
	int rc = 0;
	if (answer(s, t, fd, 0)) {
		*out = 0; /* the MPA Request is not whole yet: no data of the program's either */
	} else if (t->state == SS_ESTAB || t->state == SS_DEAD) {
		progress(s, t);
		uint64_t a = t->arrived - t->consumed;
		*out = a > INT32_MAX ? INT32_MAX : (int)a;
	} else {
		rc = -ENOSYS; /* the kernel's answer */
	}
	sock_unlock(s);
	return rc;
}

int stream_so_error(struct sock *s, int *out)
{
	sock_lock(s);
	struct stream *t = s->strm;
	int rc = -ENOSYS;
	if (t->state == SS_CONNECTING || t->state == SS_ESTAB || t->state == SS_DEAD) {
		progress(s, t);
		*out = t->so_error;
		t->so_error = 0;
		if (!*out && t->state != SS_CONNECTING && t->err) {
			/* the kernel's sk_err: a reset is read once, through SO_ERROR or a read */
			*out = t->err;
			t->err = 0;
		}
		rc = 0;
	}
	sock_unlock(s);
	return rc;
}

int stream_setmode(struct sock *s, int mode)
{
	if (mode != IWARP_MODE_OFF && mode != IWARP_MODE_RC && mode != IWARP_MODE_AUTO)
		return -EINVAL; /* UD and RD are datagram services */
	sock_lock(s);
	struct stream *t = s->strm;
	int rc = 0;
	if (t->state != SS_NEW)
		rc = t->mode == mode ? 0 : -EISCONN; /* a connection keeps the service it started with */
	else
		t->mode = mode;
	s->mode = t->mode;
	s->explicit_mode = true;
	sock_unlock(s);
	return rc;
}

int stream_getpeername(struct sock *s, struct sockaddr *a, socklen_t *l)
{
	sock_lock(s);
	struct stream *t = s->strm;
	int r = -ENOSYS;
	if (t && t->state == SS_ANSWER) {
		r = -ENOSYS; /* not answered yet: the kernel's TCP connection is as good */
	} else if (t && t->state != SS_NEW && t->state != SS_LISTEN && t->state != SS_CONNECTING) {
		progress(s, t);
		if (closed_like(t)) {
			r = -ENOTCONN;
		} else if (s->peerlen && l) {
			if (a)
				memcpy(a, &s->peer, *l < s->peerlen ? *l : s->peerlen);
			*l = s->peerlen;
			r = a || !*l ? 0 : -EFAULT;
		}
	}
	sock_unlock(s);
	return r;
}

int stream_carried(struct sock *s)
{
	sock_lock(s);
	int r = s->strm && (s->strm->state == SS_CONNECTING || s->strm->state == SS_ESTAB ||
			    s->strm->state == SS_ANSWER);
	sock_unlock(s);
	return r;
}

uint64_t stream_news(struct sock *s)
{
	struct stream *t = __atomic_load_n(&s->strm, __ATOMIC_ACQUIRE);
	if (!t)
		return 0;
	return t->arrived * 4 + (t->peer_fin ? 1 : 0) + (t->err || t->tcp_down || t->state == SS_DEAD ? 2 : 0);
}

int stream_taken(struct sock *s, int fd)
{
	sock_lock(s);
	if (s->strm)
		answer(s, s->strm, fd, -1); /* interrupted: still SS_ANSWER, not carried yet */
	int r = s->strm && (s->strm->state == SS_CONNECTING || s->strm->state == SS_ESTAB);
	sock_unlock(s);
	return r;
}

void stream_cq_ack(struct sock *s)
{
	sock_lock(s);
	if (s->strm && s->strm->cq) {
		dgv_cq_ack_event(s->strm->cq);
		s->strm->armed = false; /* an event disarms: progress arms again */
	}
	sock_unlock(s);
}

bool sock_busy_poll(struct sock *s)
{
	struct stream *t = __atomic_load_n(&s->strm, __ATOMIC_ACQUIRE);
	return t ? pv_can(t->pv, DGV_CAP_BUSY_POLL) && t->state == SS_ESTAB : sock_can(s, DGV_CAP_BUSY_POLL);
}

/* ------------------------------------------------------------------ end */

/* Watching TCP's send queue drain at close (outq_draining). */
struct outq_watch {
	int last;          /* bytes queued at the last change */
	uint64_t since_us; /* when it last changed (0: not looked yet) */
};

/* Whether bytes are still queued in the connection's TCP and it is worth waiting: before end,
 * and while the queue keeps shrinking (a peer that stopped reading, or whose process closes
 * connection after connection without reading, leaves a zero window: waiting for it would
 * cost the full bound per connection, 2 s each, where the kernel's close costs nothing). */
static bool outq_draining(const struct stream *t, struct outq_watch *w, uint64_t end)
{
	int outq = 0;
	uint64_t now = shim_now_us();
	if (now >= end || ioctl(t->qfd, SIOCOUTQ, &outq) != 0 || outq <= 0)
		return false;
	if (!w->since_us || outq != w->last) {
		w->last = outq;
		w->since_us = now;
		return true;
	}
	return now - w->since_us < OUTQ_STALL_US;
}

/* ------------------------------------------------------------------ closing in the background
 *
 * A closed connection whose TCP still holds bytes the peer has not acknowledged (our last
 * control message and FIN, usually: the peer's delayed ACK comes 5-10 ms later) must be read
 * until they are, or bytes the peer's side sent meanwhile reach a closed socket and reset the
 * connection (stream_teardown). Waiting for that inside the program's close() cost every close
 * 5-10 ms (a server closing 5 000 connections one after another: 50 s). So the queue pair moves
 * to a private duplicate of the descriptor, the program's close() returns, and a thread of the
 * shim's reads the connection every few ms until TCP's queue is empty, stalls or the 2 s bound
 * passes, then frees it (closing the duplicate: the kernel's close, the FIN is out already).
 * The list holds a sock_hold reference to each socket. A process that exits waits for the list
 * (stream_fini, bounded by the same 2 s), as its close() used to; a forked child closes its
 * copies of the duplicates at once (the parent finishes them).
 */
struct closing {
	struct sock *s;
	uint64_t end;          /* the bound of stream_teardown's wait */
	struct outq_watch ow;
};
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool running;
	struct closing *v;
	int n, cap;
} C = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, NULL, 0, 0};

/* how often each closing connection is read: seldom, since the thread competes with the program
 * for the CPU (SIPp closes a connection per call) and nobody waits for it */
enum { CLOSING_LOOK_MS = 10 };

static void teardown_end(struct stream *t);

/* One look at a closing connection: reads it. Returns true while it must stay (TCP's queue not
 * empty, still shrinking, before the bound). Needs s->lock. */
static bool closing_look(struct sock *s, struct stream *t, struct closing *c)
{
	if (t->tcp_down || !t->qp)
		return false;
	progress(s, t);
	return !t->tcp_down && outq_draining(t, &c->ow, c->end);
}

static void *closing_thread(void *arg)
{
	(void)arg;
	shim_depth++; /* everything here is the shim's own */
	pthread_mutex_lock(&C.lock);
	for (;;) {
		if (!C.n) {
			pthread_cond_wait(&C.cv, &C.lock);
			continue;
		}
		/* only this thread takes entries out: index i names the same entry after the lock
		 * was let go (closing_add appends) */
		for (int i = 0; i < C.n;) {
			struct closing e = C.v[i];
			pthread_mutex_unlock(&C.lock);
			sock_lock(e.s);
			struct stream *t = e.s->strm;
			bool stay = t && closing_look(e.s, t, &e);
			if (t && !stay)
				teardown_end(t);
			sock_unlock(e.s);
			pthread_mutex_lock(&C.lock);
			if (stay) {
				C.v[i++].ow = e.ow;
				continue;
			}
			C.v[i] = C.v[--C.n];
			pthread_cond_broadcast(&C.cv); /* stream_fini may wait for the list to empty */
			pthread_mutex_unlock(&C.lock);
			sock_unhold(e.s);
			pthread_mutex_lock(&C.lock);
		}
		if (C.n) {
			struct timespec ts = mono_deadline(CLOSING_LOOK_MS * 1000u);
			pthread_cond_timedwait(&C.cv, &C.lock, &ts);
		}
	}
	return NULL;
}

/* Hands t (its last descriptor closing, its FIN sent) to the closing thread: its queue pair
 * moves to a private duplicate of the program's descriptor, which the thread closes when done.
 * Returns 0 (the thread has it: the caller frees nothing), or -errno (no thread, no descriptor
 * or memory to spare: the caller waits itself). Needs s->lock; s is still held (sock_put). */
static int closing_add(struct sock *s, struct stream *t, const struct outq_watch *ow, uint64_t end)
{
	if (!t->qp || t->qfd < 0)
		return -EINVAL;
	if (!t->qfd_own && !own_room(1, "a closing TCP connection"))
		return -EMFILE;
	pthread_mutex_lock(&C.lock);
	int rc = served_room(&C.running, &C.cv, closing_thread, (void **)&C.v, C.n, &C.cap, sizeof *C.v) ? 0 : -ENOMEM;
	if (!rc && !t->qfd_own) {
		int d = high_fd(t->qfd);
		if (d < 0)
			rc = -errno;
		else if ((rc = dgv_qp_set_fd(t->qp, d)))
			own_close(d);
		else
			t->qfd = d, t->qfd_own = true;
	}
	if (!rc) {
		t->closing = true;
		atomic_fetch_add_explicit(&s->holds, 1, memory_order_relaxed); /* > 0: sock_put's */
		C.v[C.n++] = (struct closing){s, end, *ow};
		pthread_cond_broadcast(&C.cv);
	}
	pthread_mutex_unlock(&C.lock);
	return rc;
}

/* Fork. Child (single-threaded): the thread is not here; the duplicates it inherited are
 * closed (the parent finishes those connections), the list dropped with its references. */
static void closing_fork(bool child)
{
	if (!child)
		return;
	pthread_mutex_init(&C.lock, NULL);
	for (int i = 0; i < C.n; i++) {
		struct stream *t = C.v[i].s->strm;
		if (!t)
			continue;
		if (t->qfd >= 0 && t->qfd_own)
			own_close(t->qfd);
		t->qfd = -1, t->qfd_own = false, t->qp = NULL; /* the parent's QP */
	}
	C.n = 0;
	C.running = false;
}

void stream_fini(void)
{
	uint64_t end = shim_now_us() + 2100000;
	pthread_mutex_lock(&C.lock);
	while (C.n && C.running && shim_now_us() < end) {
		struct timespec ts = mono_deadline(10000);
		pthread_cond_timedwait(&C.cv, &C.lock, &ts);
	}
	pthread_mutex_unlock(&C.lock);
}

void stream_teardown(struct sock *s)
{
	struct stream *t = s->strm;
	if (!t)
		return;
	if (t->state == SS_ESTAB && t->qp) {
		/* SO_LINGER {1, 0}, or data the program never read: an abortive close, as the
		 * kernel's (RFC 2525 2.17 for the latter). No FIN, no orderly end of the QP: the
		 * program's close resets the connection and the peer reads ECONNRESET (what had
		 * been handed to TCP before arrives first, as on loopback) */
		struct linger lg = {0, 0};
		socklen_t ll = sizeof lg;
		bool abort = t->qfd >= 0 && real.getsockopt(t->qfd, SOL_SOCKET, SO_LINGER, &lg, &ll) == 0 &&
			     lg.l_onoff && lg.l_linger == 0;
		progress(s, t);
		if (t->arrived != t->consumed && !abort) {
			/* the provider has read TCP dry: the kernel would not see the unread data */
			struct linger now = {1, 0};
			abort = real.setsockopt(t->qfd, SOL_SOCKET, SO_LINGER, &now, sizeof now) == 0;
		}
		if (!t->tcp_down && !abort && !t->peer_close)
			ctl_send(t, CTL_FIN | CTL_CLOSE);
		else if (!t->tcp_down && abort && !t->own_cm)
			ctl_send(t, CTL_ABORT); /* handed to TCP before the program's close resets it */
		else if (t->own_cm && !t->tcp_down && !abort && t->tx_out && !t->ctl_out_n)
			ctl_send(t, 0); /* a signaled record: it retires the unsignaled data before it */
		/* queued data goes out before the QP: wait for our sends, bounded. Unsignaled data
		 * records complete only with a later record that asks for a completion: with none
		 * after them (the soft provider's, to a peer that closed: no control message goes
		 * to it) they are not waited for; the provider hands them to TCP as they are posted. */
		bool tail = t->sig_seq == t->data_seq || t->ctl_out_n;
		uint64_t end = shim_now_us() + 2000000;
		while (((t->tx_out && tail && !(abort && t->own_cm)) || t->ctl_out_n) && !t->tcp_down &&
		       shim_now_us() < end) {
			dgv_cq_wait(t->cq, 10);
			progress(s, t);
		}
		if (abort && !t->own_cm) {
			/* the reset the program's close sends drops what TCP has not sent yet: the
			 * announcement must have left first, or the peer reads the reset as the end
			 * of a writer that died (bounded by the same 2 s: a peer that does not read
			 * gets the reset without it) */
			struct outq_watch ow = {0};
			while (!t->tcp_down && outq_draining(t, &ow, end)) {
				dgv_cq_wait(t->cq, 1);
				progress(s, t);
			}
		}
		if (!abort) {
			dgv_disconnect(t->qp);
			/* Until the peer's TCP has acknowledged everything, keep reading: bytes the
			 * peer's side sent before it learnt of our close (its first control message,
			 * which MPA holds until our first FPDU; credit) would reach a closed socket,
			 * which answers with a reset and drops what it still had to send. Bounded
			 * by the same 2 s. The shim's thread does it (closing_add): the program's
			 * close returns at once, as the kernel's does, where waiting here for the
			 * peer's acknowledgement (its delayed ACK: 5-10 ms) held every close. */
			struct outq_watch ow = {0};
			if (!t->own_cm && !t->tcp_down && outq_draining(t, &ow, end) && closing_add(s, t, &ow, end) == 0)
				return; /* the socket is gone for the program's calls (sock_gone) */
			while (!t->own_cm && !t->tcp_down && outq_draining(t, &ow, end)) {
				dgv_cq_wait(t->cq, 5);
				progress(s, t);
			}
		}
	}
	teardown_end(t);
}

/* Frees t's resources and leaves calls still in flight on it a dead stream (EBADF). */
static void teardown_end(struct stream *t)
{
	res_free(t);
	/* the memory stays with the socket's (sock_unhold frees both): a call still in flight on
	 * it, asleep in a wait when another thread closed the last descriptor, wakes to a dead
	 * stream (EBADF). Not one the kernel carries (SS_NEW: a stream let go, whose descriptor
	 * is still the program's): a connect() asleep when another thread's call let it go
	 * returns the kernel's answer. A stream closing in the background (closing_add) keeps
	 * its resources until the thread frees them; its socket is gone for the program's calls. */
	t->rv_wait = false;
	if (t->state != SS_NEW) {
		t->state = SS_DEAD;
		t->err = EBADF;
		t->so_error = 0;
		t->tcp_down = true;
	}
}

void stream_after_fork(struct sock *s)
{
	/* the parent's queue pair and rings belong to the parent: the child's descriptor to a
	 * carried stream reads as a broken connection (documented limit) */
	struct stream *t = s->strm;
	if (!t)
		return;
	/* the parent's registry entries stay the parent's: the child's close must not delete them
	 * (t->named keeps a listener's accepts expecting MPA) */
	t->regfd = -1, t->dregfd = -1;
	if (t->dlis) {
		/* the parent's device listener: the child's accepts of device clients fail (the
		 * clients see the connection closed); soft and plain ones are served */
		shim_abandon(t->dlis), shim_abandon(t->lch);
		t->dlis = NULL, t->lch = NULL;
		free(t->stash); /* the parent's requests: this process's copy of the list */
		t->stash = NULL;
	}
	if (t->state != SS_NEW && t->state != SS_LISTEN && t->state != SS_ANSWER) {
		if (t->state == SS_ESTAB || t->state == SS_CONNECTING)
			DG_WARN("%s: fork: a TCP connection carried before the fork (port %u) stays the "
				"parent's; in this process it reads as a broken connection (docs/shim.md "
				"\"Forking servers\")", program_invocation_short_name, port_of(&s->peer));
		shim_abandon(t->qp), shim_abandon(t->cq), shim_abandon(t->ch);
		t->qp = NULL, t->cq = NULL, t->ch = NULL, t->mr_in = NULL, t->mr_ctl = NULL, t->mr_out = NULL;
		t->state = SS_DEAD;
		t->err = ENOTCONN;
		t->tcp_down = true;
	}
}

/* ------------------------------------------------------------------ the kind's table */

static ssize_t ops_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			const struct sockaddr *dest, socklen_t destlen)
{
	return stream_send(s, fd, iov, iovcnt, flags); /* TCP ignores a destination once connected */
}

static ssize_t ops_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			struct sockaddr *src, socklen_t *srclen, int *mflags)
{
	if (srclen)
		*srclen = 0; /* a stream names no source, as TCP */
	return stream_recv(s, fd, iov, iovcnt, flags);
}

static int ops_accept(struct sock *s, int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	return stream_accept(fd, a, l, flags);
}


/* IWARP_MODE, TCP_NODELAY (the program's view: the provider keeps Nagle off) and
 * SO_RCVLOWAT (the stream's wake-ups follow it). Returns 0, -errno, or -ENOSYS for the
 * common handling. */
static int ops_setopt(struct sock *s, int fd, int level, int name, const void *v, socklen_t l)
{
	if (level == SOL_IWARP && name == IWARP_MODE) {
		if (!v || l < sizeof(int))
			return -EINVAL;
		int x;
		memcpy(&x, v, sizeof x);
		return stream_setmode(s, x);
	}
	if (level == IPPROTO_TCP && name == TCP_NODELAY)
		return stream_nodelay(s, fd, 1, (void *)v, &l);
	if (level == SOL_SOCKET && name == SO_RCVLOWAT) {
		if (real.setsockopt(fd, level, name, v, l) < 0)
			return -errno;
		stream_lowat(s, fd);
		return 0;
	}
	return -ENOSYS;
}

/* IWARP_TAKEN (carried: connecting or established), TCP_NODELAY, and SO_ERROR (the
 * stream's own error first, else the kernel's). Returns 0, -errno, or -ENOSYS. */
static int ops_getopt(struct sock *s, int fd, int level, int name, void *v, socklen_t *l)
{
	if (level == SOL_IWARP && name == IWARP_TAKEN) {
		if (!v || !l)
			return -EFAULT;
		if (*l < sizeof(int))
			return -EINVAL;
		int x = stream_taken(s, fd); /* takes the lock itself */
		memcpy(v, &x, sizeof x);
		*l = sizeof x;
		return 0;
	}
	if (level == IPPROTO_TCP && name == TCP_NODELAY && l)
		return stream_nodelay(s, fd, 0, v, l);
	if (level == SOL_SOCKET && name == SO_ERROR && v && l && *l >= sizeof(int)) {
		int e = 0;
		if (stream_so_error(s, &e) == 0) {
			int k = 0;
			socklen_t kl = sizeof k;
			real.getsockopt(fd, level, name, &k, &kl); /* the kernel's (a TCP error) */
			if (!e)
				e = k;
			memcpy(v, &e, sizeof e);
			*l = sizeof e;
			return 0;
		}
	}
	return -ENOSYS;
}

/* Needs s->lock. */
static void ops_release(struct sock *s)
{
	if (!s->strm)
		return;
	if (s->gen == G.gen) {
		stream_teardown(s);
	} else {
		/* a forked child's copy: the parent owns the QP; freed with the socket */
		idle_forget(s->strm);
		s->strm->state = SS_DEAD, s->strm->err = EBADF;
	}
}

/* TCP over RC (or plain TCP until connect/listen decides, and after a fallback). */
const struct sock_ops stream_ops = {
	.kind = "tcp",
	.stream = true,
	.connect = stream_connect,
	.listen = stream_listen,
	.accept = ops_accept,
	.shutdown = stream_shutdown,
	.getpeername = stream_getpeername,
	.setopt = ops_setopt,
	.getopt = ops_getopt,
	.send = ops_send,
	.recv = ops_recv,
	.fionread = stream_fionread,
	.poll_in = stream_poll_in,
	.poll_in_queued = stream_poll_in_queued,
	.poll_out = stream_poll_out,
	.poll_out_queued = stream_poll_out_queued,
	.wait_fds = stream_wait_fds,
	.cq_ack = stream_cq_ack,
	.carried = stream_carried,
	.release = ops_release,
};

