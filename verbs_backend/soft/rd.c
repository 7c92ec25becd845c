/*
 * rd.c - the reliable-datagram LLP beneath DDP for RD queue pairs (rd.h).
 *
 * Per peer: a send sequence space identified by a random epoch, a receive sequence space of the
 * peer's epoch, cumulative + 32-bit selective acks, and a receive window counted from the
 * cumulative ack (this peer's buffered datagrams plus the free out-of-order buffers).
 *
 * Loss recovery retransmits what is known lost, once: within the SACK's reach a datagram is lost
 * once 3 later ones arrived (first transmissions only) or once one first sent sufficiently later
 * arrived (RACK, RFC 8985, with Karn's rule). One timer per peer covers the oldest datagram
 * (RFC 6298: SRTT/RTTVAR, Karn, exponential backoff): a timeout retransmits only that one, and
 * the acks that follow decide whether the rest was lost too (rec_ack), so a receiver that was
 * merely descheduled costs one duplicate, not a window of them. A fast retransmission not acked
 * within SRTT + 4 RTTVAR was lost as well and goes again without waiting for the RTO floor.
 * The retry budget of the oldest datagram decides the peer's failure. The receiver acks every
 * second datagram, a hole or what arrived after it within the SACK's reach at once.
 *
 * Memory: everything is allocated in rd_create. Lists are singly linked through indices (RD_NIL
 * ends them): a peer's in-flight datagrams and its buffered out-of-order datagrams (both in
 * sequence order), the free lists, and the completion FIFO. Peers live in a fixed array, so a
 * peer pointer stays valid across callbacks; a pin count keeps a peer from being reaped while a
 * call works on it.
 *
 * Re-entrancy: acked()/failed() are never called from inside a state change; the slots concerned
 * are queued on the completion FIFO and reported once the state is consistent, so the callbacks
 * may call rd_send(). deliver() is called with the receive state already advanced past the
 * segment, so an rd_send() from it piggybacks an ack that covers it.
 */
#include "rd.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "crc.h"
#include "log.h"
#include "wire.h"

#define RD_NIL UINT32_MAX

/* Until its first ack arrives, an epoch only uses sequence numbers below isn + RD_INIT_WND. A
 * receiver without state for an epoch can then tell the start of a new epoch (adopt it) from the
 * middle of one it has forgotten (answer RST). */
#define RD_INIT_WND 32u
/* Data further ahead than a 16-bit window cannot come from a conforming sender: dropped. */
#define RD_RX_SPAN 65536u
#define RD_REAP_IDLE_US (60ull * 1000000u)
/* Shorter than RD_REAP_IDLE_US, so a sender starts a new epoch before the receiver may have
 * reaped the old one; otherwise the receiver's housekeeping would turn into spurious resets. */
#define RD_RENEW_IDLE_US (30ull * 1000000u)
#define RD_REAP_SCAN_US 1000000ull
/* A receiver that lost its state while our epoch was young (cumulative ack still below
 * RD_INIT_WND) adopts the epoch again from its start and acks isn for ever, behind our cumulative
 * ack. A stale, reordered ack of isn does not keep arriving after our oldest datagram timed out
 * twice, so this many of them mean a reset. */
#define RD_BEHIND_ACKS 4u
#define RD_BEHIND_TIMEOUTS 2u
/* A spurious timeout's raised RTO floor halves after this long. */
#define RD_FLOOR_DECAY_US 1000000ull
#define RD_MAX_SLOTS (1u << 20)
#define RD_MAX_PEERS (1u << 20)
#define RD_MAX_RETRIES 1000u
/* rd_cork: the most datagrams one train carries (the kernel's smallest UDP_MAX_SEGMENTS, as
 * frame.h DG_GSO_MAX_SEGS), and the most bytes (an IP datagram's payload) */
#define RD_CORK_MAX 64u
#define RD_TRAIN_BYTES 65000u
/* rd_rx_batch_begin: peers one receive batch acks at its end (more: acked as they come) */
#define RD_ACK_BATCH 8u
/* A tail-loss probe goes after max(2 SRTT, this) without an ack (see tx_timers); unanswered,
 * another after twice that, up to RD_PROBES_MAX in a row, then only the RTO */
#define RD_PTO_MIN_US 200u
#define RD_PROBES_MAX 3u

struct rd_txslot {
	uint64_t cookie;
	uint64_t sent_us; /* last (re)transmission */
	uint32_t seq;
	uint32_t len;     /* RD header + segment; room for the CRC follows */
	uint32_t next;
	int32_t err;      /* on the completion FIFO: 0 for acked, else -errno for failed */
	uint16_t retries; /* retransmissions so far, by timer or fast retransmit */
	uint8_t backoff;  /* timer expiries: each one doubles this datagram's RTO */
	uint8_t sacked;
};

struct rd_rxslot {
	uint32_t seq;
	uint32_t len; /* segment only */
	uint32_t next;
};

struct rd_peer {
	union dgv_sockaddr addr; /* normalised: compared and hashed as raw bytes */
	socklen_t addrlen;
	uint32_t hnext;        /* hash chain, or free list */
	uint32_t anext, aprev; /* active list: peers with timers */
	uint64_t last_us;      /* last datagram from it or data to it */
	uint64_t una_us;       /* snd_una last advanced: the oldest datagram's timer restarts */
	uint64_t ack_due;      /* delayed-ack deadline, 0: none armed */
	uint64_t rack_us;      /* latest transmission time of a datagram known delivered */
	uint64_t quiet_us;     /* the last ack from it or new data to it: the probe timer's start */
	uint64_t probe_us;     /* when the last probe went, 0: answered or none */
	/* send side */
	uint32_t tx_epoch, snd_una, snd_nxt;
	uint32_t tx_head, tx_tail, inflight;
	uint32_t peer_wnd;
	uint32_t srtt, rttvar, rto; /* µs; srtt 0: no sample yet */
	uint32_t min_rtt;           /* µs, 0: no sample yet */
	uint32_t behind;
	uint32_t probe_id;          /* the last probe's id: its answer echoes it */
	uint32_t probe_n;           /* probes since the last ack (or new data) */
	/* recovery after a timeout (rec_start != 0): see rec_ack() */
	uint64_t rec_start;         /* the first timeout of the episode */
	uint64_t rec_due;           /* next batch of go-back retransmissions, 0: none armed */
	uint64_t rec_base;          /* since when the oldest datagram waited for its ack */
	uint32_t rec_end;           /* snd_nxt at rec_start */
	uint32_t rec_burst;         /* datagrams in that batch */
	uint8_t rec_clean;          /* no loss was in sight at the timeout: it may prove spurious */
	uint32_t rto_floor;         /* µs: raised by a spurious timeout, 0: rto_min */
	uint64_t floor_us;          /* when rto_floor last changed */
	/* receive side */
	uint32_t rx_epoch, rx_old_epoch, rcv_nxt;
	uint32_t rx_head, rx_tail;
	uint32_t rx_count;   /* buffered out-of-order datagrams */
	uint32_t rx_unacked; /* in-order datagrams since our last ack */
	uint16_t pin;
	uint8_t in_use, active, synced, rx_valid, rx_old_valid, ack_dirty;
	uint8_t sack_seen; /* the previous ack had SACK bits: the receiver sat on a hole */
	uint8_t rnr;       /* receive side: deliver() refused rcv_nxt; we answer RNR */
	uint8_t peer_rnr;  /* send side: the peer answered RNR: no new data, no retry spent */
	uint8_t ack_urgent; /* receive batch: the owed ack carries news (a hole, a duplicate) */
};

struct rd_ep {
	struct rd_cfg cfg;
	struct rd_ops ops;
	void *arg;
	uint64_t (*clock)(void *);
	void *clock_arg;

	size_t tx_stride, rx_stride;
	uint8_t *txbuf, *rxbuf;
	struct rd_txslot *tx;
	struct rd_rxslot *rx;
	uint32_t tx_free, tx_nfree, rx_free, rx_nfree;
	uint32_t done_head, done_tail;

	struct rd_peer *peers;
	uint32_t *bucket;
	uint32_t bucket_mask;
	uint32_t peer_free;
	uint32_t last_peer;     /* peer_find's last answer (RD_NIL: none): most traffic is one peer's */
	uint32_t peer_high;     /* peers[peer_high..] never used: taken in order, untouched memory */
	uint32_t act_head, act_tail;

	uint64_t hash_seed, rng;
	uint64_t next_deadline; /* never later than the earliest armed timer */
	uint32_t rnr_peers;     /* peers with rnr set */
	uint64_t last_reap, last_full_scan;
	struct rd_stats st;
	/* rd_cork: new datagrams waiting for rd_uncork (all to peer cork_peer), in order */
	bool corked, no_trains;
	uint32_t cork_n, cork_peer;
	uint64_t cork_us;       /* rd_send's clock for the datagrams corked for one train */
	uint64_t held_us;       /* rd_clock_hold's reading (0: none; rd_now reads the clock) */
	uint32_t cork[RD_CORK_MAX];
	/* rd_rx_batch_begin: peers whose in-order ack waits for rd_rx_batch_end */
	bool rx_batch;
	uint32_t ack_n;
	uint32_t ack_peer[RD_ACK_BATCH];
};

/* Sequence numbers of a fresh epoch start here: 0 on the wire (wire.h); tests move it near 2^32
 * to exercise wraparound. Both ends must agree, hence process-wide. */
static uint32_t rd_isn;

/* Test hooks, declared by tests/unit/test_rd.c; not part of rd.h. */
void rd_test_set_clock(struct rd_ep *ep, uint64_t (*fn)(void *), void *arg);
void rd_test_set_isn(uint32_t isn);

static inline int32_t seq_diff(uint32_t a, uint32_t b) { return (int32_t)(a - b); }
static inline bool seq_lt(uint32_t a, uint32_t b) { return seq_diff(a, b) < 0; }

static inline uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Elapsed time that treats a clock seen going backwards as no time at all. */
static inline uint64_t since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

uint64_t dg_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t default_clock(void *arg)
{
	(void)arg;
	return dg_now_us();
}

void rd_test_set_clock(struct rd_ep *ep, uint64_t (*fn)(void *), void *arg)
{
	ep->clock = fn ? fn : default_clock;
	ep->clock_arg = arg;
	ep->last_reap = ep->last_full_scan = ep->clock(ep->clock_arg);
}

void rd_test_set_isn(uint32_t isn) { rd_isn = isn; }

static inline uint64_t rd_now(struct rd_ep *ep)
{
	return ep->held_us ? ep->held_us : ep->clock(ep->clock_arg);
}

void rd_clock_hold(struct rd_ep *ep)
{
	ep->held_us = ep->clock(ep->clock_arg);
}

void rd_clock_release(struct rd_ep *ep)
{
	ep->held_us = 0;
}

static uint32_t rd_random32(struct rd_ep *ep)
{
	uint32_t v;
	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v))
		return v;
	/* xorshift64 seeded at creation: epochs only need to differ, not to be secret */
	uint64_t x = ep->rng;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	ep->rng = x;
	return (uint32_t)(x >> 32);
}

static uint32_t new_epoch(struct rd_ep *ep, uint32_t old)
{
	uint32_t e;
	do
		e = rd_random32(ep);
	while (e == old);
	return e;
}

static inline void arm(struct rd_ep *ep, uint64_t t)
{
	if (t < ep->next_deadline)
		ep->next_deadline = t;
}

/* ------------------------------------------------------------------ addresses and peers */

/* Returns 0, or -EINVAL for anything but a complete IPv4 or IPv6 address. */
static int addr_norm(const union dgv_sockaddr *in, socklen_t len, union dgv_sockaddr *out,
		     socklen_t *olen)
{
	if (!in || len < (socklen_t)sizeof(sa_family_t))
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (in->sa.sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		out->sin.sin_family = AF_INET;
		out->sin.sin_port = in->sin.sin_port;
		out->sin.sin_addr = in->sin.sin_addr;
		*olen = sizeof(struct sockaddr_in);
		return 0;
	}
	if (in->sa.sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
		out->sin6.sin6_family = AF_INET6;
		out->sin6.sin6_port = in->sin6.sin6_port;
		out->sin6.sin6_addr = in->sin6.sin6_addr;
		/* link-local addresses are only unique with their interface */
		out->sin6.sin6_scope_id = in->sin6.sin6_scope_id;
		*olen = sizeof(struct sockaddr_in6);
		return 0;
	}
	return -EINVAL;
}

_Static_assert(sizeof(union dgv_sockaddr) % sizeof(uint32_t) == 0, "address hashed by words");

static uint32_t addr_hash(const struct rd_ep *ep, const union dgv_sockaddr *a)
{
	uint32_t w[sizeof(*a) / sizeof(uint32_t)];
	uint64_t h = ep->hash_seed;
	memcpy(w, a, sizeof(w));
	for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
		h = (h ^ w[i]) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	return (uint32_t)(h ^ (h >> 32));
}

/* Returns the peer's index or RD_NIL. The peer found last is looked at first: a stream of
 * segments and acknowledgements to and from one peer then hashes no address (the hash and the
 * probe were 5 % of an RD sender's CPU at 512 KB messages). */
static uint32_t peer_find(struct rd_ep *ep, const union dgv_sockaddr *a)
{
	uint32_t i = ep->last_peer;
	if (i != RD_NIL && ep->peers[i].in_use && memcmp(&ep->peers[i].addr, a, sizeof(*a)) == 0)
		return i;
	i = ep->bucket[addr_hash(ep, a) & ep->bucket_mask];
	while (i != RD_NIL && memcmp(&ep->peers[i].addr, a, sizeof(*a)) != 0)
		i = ep->peers[i].hnext;
	if (i != RD_NIL)
		ep->last_peer = i;
	return i;
}

static void activate(struct rd_ep *ep, uint32_t i)
{
	struct rd_peer *p = &ep->peers[i];
	if (p->active)
		return;
	p->active = 1;
	p->anext = RD_NIL;
	p->aprev = ep->act_tail;
	if (ep->act_tail != RD_NIL)
		ep->peers[ep->act_tail].anext = i;
	else
		ep->act_head = i;
	ep->act_tail = i;
}

static void deactivate(struct rd_ep *ep, uint32_t i)
{
	struct rd_peer *p = &ep->peers[i];
	if (!p->active)
		return;
	if (p->aprev != RD_NIL)
		ep->peers[p->aprev].anext = p->anext;
	else
		ep->act_head = p->anext;
	if (p->anext != RD_NIL)
		ep->peers[p->anext].aprev = p->aprev;
	else
		ep->act_tail = p->aprev;
	p->active = 0;
	p->anext = p->aprev = RD_NIL;
}

static inline uint32_t peer_index(const struct rd_ep *ep, const struct rd_peer *p)
{
	return (uint32_t)(p - ep->peers);
}

/* ------------------------------------------------------------------ slots */

static inline uint8_t *txbuf(const struct rd_ep *ep, uint32_t s) { return ep->txbuf + (size_t)s * ep->tx_stride; }
static inline uint8_t *rxbuf(const struct rd_ep *ep, uint32_t r) { return ep->rxbuf + (size_t)r * ep->rx_stride; }

static uint32_t tx_alloc(struct rd_ep *ep)
{
	uint32_t s = ep->tx_free;
	if (s != RD_NIL) {
		ep->tx_free = ep->tx[s].next;
		ep->tx_nfree--;
	}
	return s;
}

static void tx_release(struct rd_ep *ep, uint32_t s)
{
	ep->tx[s].next = ep->tx_free;
	ep->tx_free = s;
	ep->tx_nfree++;
}

static uint32_t rx_alloc(struct rd_ep *ep)
{
	uint32_t r = ep->rx_free;
	if (r != RD_NIL) {
		ep->rx_free = ep->rx[r].next;
		ep->rx_nfree--;
	}
	return r;
}

static void rx_release(struct rd_ep *ep, uint32_t r)
{
	ep->rx[r].next = ep->rx_free;
	ep->rx_free = r;
	ep->rx_nfree++;
}

/* A datagram leaves its peer: a non-zero cookie waits on the completion FIFO for drain(). */
static void done_push(struct rd_ep *ep, uint32_t s, int err)
{
	struct rd_txslot *t = &ep->tx[s];
	if (!t->cookie) {
		tx_release(ep, s);
		return;
	}
	t->err = err;
	t->next = RD_NIL;
	if (ep->done_tail != RD_NIL)
		ep->tx[ep->done_tail].next = s;
	else
		ep->done_head = s;
	ep->done_tail = s;
}

/* Reports queued completions in order. The slot is freed and the FIFO advanced before each
 * callback, so a callback's rd_send() (or a nested drain) sees consistent state. */
static void drain(struct rd_ep *ep)
{
	while (ep->done_head != RD_NIL) {
		uint32_t s = ep->done_head;
		uint64_t cookie = ep->tx[s].cookie;
		int err = ep->tx[s].err;
		ep->done_head = ep->tx[s].next;
		if (ep->done_head == RD_NIL)
			ep->done_tail = RD_NIL;
		tx_release(ep, s);
		if (err) {
			if (ep->ops.failed)
				ep->ops.failed(ep->arg, cookie, err);
		} else if (ep->ops.acked) {
			ep->ops.acked(ep->arg, cookie);
		}
	}
}

/* ------------------------------------------------------------------ peer life cycle */

static void rx_reset(struct rd_ep *ep, struct rd_peer *p)
{
	uint32_t r = p->rx_head;
	while (r != RD_NIL) {
		uint32_t n = ep->rx[r].next;
		rx_release(ep, r);
		r = n;
	}
	p->rx_head = p->rx_tail = RD_NIL;
	p->rx_count = 0;
	p->rx_unacked = 0;
	p->ack_dirty = 0;
	p->ack_due = 0;
	if (p->rnr) {
		p->rnr = 0;
		ep->rnr_peers--;
	}
}

/* Ends the current send epoch: every datagram in flight is reported failed with err (none when
 * nothing is in flight), and the next rd_send starts a new epoch at isn. */
static void tx_reset(struct rd_ep *ep, struct rd_peer *p, int err)
{
	if (ep->cork_n && &ep->peers[ep->cork_peer] == p)
		ep->cork_n = 0; /* the corked datagrams are this epoch's: they end with it */
	uint32_t s = p->tx_head;
	while (s != RD_NIL) {
		uint32_t n = ep->tx[s].next;
		done_push(ep, s, err);
		s = n;
	}
	p->tx_head = p->tx_tail = RD_NIL;
	p->inflight = 0;
	p->tx_epoch = new_epoch(ep, p->tx_epoch);
	p->snd_una = p->snd_nxt = rd_isn;
	p->synced = 0;
	p->behind = 0;
	p->sack_seen = 0;
	p->rack_us = 0;
	p->probe_us = 0;
	p->rec_start = p->rec_due = 0;
	p->peer_wnd = UINT16_MAX;
	p->peer_rnr = 0;
}

static void peer_release(struct rd_ep *ep, uint32_t i)
{
	struct rd_peer *p = &ep->peers[i];
	uint32_t *link = &ep->bucket[addr_hash(ep, &p->addr) & ep->bucket_mask];
	while (*link != i)
		link = &ep->peers[*link].hnext;
	*link = p->hnext;
	deactivate(ep, i);
	rx_reset(ep, p);
	p->in_use = 0;
	p->hnext = ep->peer_free;
	ep->peer_free = i;
	ep->st.peers--;
}

static bool peer_reapable(const struct rd_peer *p, uint64_t now)
{
	return p->in_use && !p->pin && !p->inflight && !p->ack_due &&
	       since(now, p->last_us) > RD_REAP_IDLE_US;
}

/* Forgets peers idle for RD_REAP_IDLE_US; with one_only, stops at the first. Returns how many. */
static uint32_t reap_idle(struct rd_ep *ep, uint64_t now, bool one_only)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < ep->peer_high; i++) {
		if (!peer_reapable(&ep->peers[i], now))
			continue;
		DG_DBG("rd: reaping idle peer %u", i);
		peer_release(ep, i);
		n++;
		if (one_only)
			break;
	}
	return n;
}

/* Returns the new peer's index, or RD_NIL when the table is full of live peers. */
static uint32_t peer_new(struct rd_ep *ep, const union dgv_sockaddr *a, socklen_t alen, uint64_t now)
{
	/* a full table of busy peers would otherwise be scanned for every unknown datagram */
	if (ep->peer_free == RD_NIL && ep->peer_high == ep->cfg.max_peers &&
	    since(now, ep->last_full_scan) >= RD_REAP_SCAN_US) {
		ep->last_full_scan = now;
		reap_idle(ep, now, true);
	}
	uint32_t i = ep->peer_free;
	if (i != RD_NIL)
		ep->peer_free = ep->peers[i].hnext;
	else if (ep->peer_high < ep->cfg.max_peers)
		i = ep->peer_high++; /* the table is only touched as far as it was ever used */
	else
		return RD_NIL;
	struct rd_peer *p = &ep->peers[i];
	memset(p, 0, sizeof(*p));
	p->addr = *a;
	p->addrlen = alen;
	uint32_t *b = &ep->bucket[addr_hash(ep, a) & ep->bucket_mask];
	p->hnext = *b;
	*b = i;
	p->anext = p->aprev = RD_NIL;
	p->tx_head = p->tx_tail = p->rx_head = p->rx_tail = RD_NIL;
	p->last_us = now;
	p->rto = ep->cfg.rto_min_us;
	p->in_use = 1;
	p->tx_epoch = rd_random32(ep);
	p->snd_una = p->snd_nxt = rd_isn;
	p->peer_wnd = UINT16_MAX;
	ep->st.peers++;
	return i;
}

/* ------------------------------------------------------------------ transmission */

/* The receive window offered to p, counted from our cumulative ack as the sender counts what it
 * has in flight: the datagram at rcv_nxt (delivered without a buffer), the ones p already has
 * buffered here, and the free buffers (shared by all peers). Returns it clamped to 1..65535. */
static uint16_t adv_wnd(const struct rd_ep *ep, const struct rd_peer *p)
{
	uint32_t w = ep->rx_nfree + (p ? p->rx_count + 1 : 0);
	/* never 0: the peer must keep probing, or it would never learn the window reopened */
	if (w < 1)
		w = 1;
	if (w > UINT16_MAX)
		w = UINT16_MAX;
	return (uint16_t)w;
}

static uint32_t sack_bits(const struct rd_ep *ep, const struct rd_peer *p)
{
	uint32_t bits = 0;
	for (uint32_t r = p->rx_head; r != RD_NIL; r = ep->rx[r].next) {
		uint32_t off = ep->rx[r].seq - p->rcv_nxt - 1;
		if (off >= 32)
			break;
		bits |= 1u << off;
	}
	return bits;
}

static void hdr_fill(const struct rd_ep *ep, const struct rd_peer *p, struct dg_rd_hdr *h,
		     uint8_t flags, uint32_t seq)
{
	memset(h, 0, sizeof(*h));
	h->magic = RD_MAGIC;
	h->wnd = htobe16(adv_wnd(ep, p));
	h->epoch = htobe32(p->tx_epoch);
	h->seq = htobe32(seq);
	if (p->rx_valid) {
		flags |= RD_FLAG_ACK;
		if (p->rnr)
			flags |= RD_FLAG_RNR;
		h->ack_epoch = htobe32(p->rx_epoch);
		h->ack = htobe32(p->rcv_nxt);
		h->sack = htobe32(sack_bits(ep, p));
	}
	h->flags = flags;
}

/* Appends the CRC (buf has room for it) and hands the datagram to UDP. Returns xmit's result. */
static int xmit_raw(struct rd_ep *ep, uint8_t *buf, size_t len, const union dgv_sockaddr *to,
		    socklen_t tolen)
{
	uint32_t crc = htobe32(dg_crc32c(buf, len));
	memcpy(buf + len, &crc, sizeof(crc));
	struct iovec iov = { .iov_base = buf, .iov_len = len + DG_CRC_LEN };
	return ep->ops.xmit(ep->arg, &iov, 1, to, tolen);
}

static inline void ack_sent(struct rd_peer *p)
{
	p->ack_dirty = 0;
	p->ack_urgent = 0;
	p->rx_unacked = 0;
	p->ack_due = 0;
}

/* (Re)transmits a datagram with a fresh ack piggybacked. */
static void xmit_slot(struct rd_ep *ep, struct rd_peer *p, uint32_t s)
{
	uint8_t *b = txbuf(ep, s);
	struct dg_rd_hdr h;
	hdr_fill(ep, p, &h, RD_FLAG_DATA, ep->tx[s].seq);
	memcpy(b, &h, sizeof(h));
	if (xmit_raw(ep, b, ep->tx[s].len, &p->addr, p->addrlen) == 0 && p->rx_valid)
		ack_sent(p);
}

/* Hands down the corked datagrams: trains of equal-size datagrams (the last of a train may be
 * shorter) through xmit_train, single ones (and every one once trains failed) by xmit_slot. */
static void cork_flush(struct rd_ep *ep)
{
	uint32_t n = ep->cork_n;
	ep->cork_n = 0;
	if (!n)
		return;
	struct rd_peer *p = &ep->peers[ep->cork_peer];
	uint32_t i = 0;
	while (i < n) {
		uint32_t seg = ep->tx[ep->cork[i]].len + DG_CRC_LEN, k = i + 1, bytes = seg;
		while (k < n && !ep->no_trains && ep->tx[ep->cork[k - 1]].len + DG_CRC_LEN == seg &&
		       ep->tx[ep->cork[k]].len + DG_CRC_LEN <= seg && bytes + seg <= RD_TRAIN_BYTES)
			bytes += ep->tx[ep->cork[k++]].len + DG_CRC_LEN;
		if (k - i < 2 || !ep->ops.xmit_train || seg > UINT16_MAX) {
			xmit_slot(ep, p, ep->cork[i++]);
			continue;
		}
		struct iovec iov[RD_CORK_MAX];
		for (uint32_t j = i; j < k; j++) {
			uint32_t s = ep->cork[j];
			uint8_t *b = txbuf(ep, s);
			struct dg_rd_hdr h;
			hdr_fill(ep, p, &h, RD_FLAG_DATA, ep->tx[s].seq);
			memcpy(b, &h, sizeof(h));
			uint32_t crc = htobe32(dg_crc32c(b, ep->tx[s].len));
			memcpy(b + ep->tx[s].len, &crc, sizeof(crc));
			iov[j - i] = (struct iovec){b, ep->tx[s].len + DG_CRC_LEN};
		}
		int rc = ep->ops.xmit_train(ep->arg, iov, (int)(k - i), (uint16_t)seg, &p->addr, p->addrlen);
		if (rc == -EOPNOTSUPP) {
			ep->no_trains = true; /* one by one from here on, this train too */
			continue;
		}
		if (rc == 0 && p->rx_valid)
			ack_sent(p);
		i = k;
	}
}

void rd_cork(struct rd_ep *ep)
{
	ep->corked = true;
}

void rd_uncork(struct rd_ep *ep)
{
	ep->corked = false;
	cork_flush(ep);
}

/* A header-only datagram to p (an ack, a probe, an answer), with our ack when we have one.
 * Returns xmit's result. */
static int xmit_ctl(struct rd_ep *ep, struct rd_peer *p, uint8_t flags, uint32_t seq)
{
	uint8_t b[DG_RD_HLEN + DG_CRC_LEN];
	struct dg_rd_hdr h;
	hdr_fill(ep, p, &h, flags, seq);
	memcpy(b, &h, sizeof(h));
	int rc = xmit_raw(ep, b, DG_RD_HLEN, &p->addr, p->addrlen);
	if (rc == 0 && p->rx_valid)
		ack_sent(p);
	return rc;
}

static void send_ack(struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	if (!p->rx_valid)
		return;
	if (xmit_ctl(ep, p, 0, p->snd_nxt) == 0) {
		ep->st.acks_sent++;
	} else {
		/* UDP refused it: try again later rather than wait for a retransmission */
		p->ack_due = now + ep->cfg.ack_delay_us;
		arm(ep, p->ack_due);
		activate(ep, peer_index(ep, p));
	}
}

static void send_rst(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen,
		     uint32_t their_epoch)
{
	uint8_t b[DG_RD_HLEN + DG_CRC_LEN];
	struct dg_rd_hdr h;
	memset(&h, 0, sizeof(h));
	h.magic = RD_MAGIC;
	h.flags = RD_FLAG_RST;
	h.wnd = htobe16(adv_wnd(ep, NULL));
	h.ack_epoch = htobe32(their_epoch);
	memcpy(b, &h, sizeof(h));
	xmit_raw(ep, b, DG_RD_HLEN, to, tolen);
	ep->st.resets_sent++;
	DG_DBG("rd: RST for unknown epoch %08x", their_epoch);
}

static inline uint64_t slot_rto(const struct rd_ep *ep, const struct rd_peer *p,
				const struct rd_txslot *t)
{
	unsigned shift = t->backoff > 24 ? 24 : t->backoff;
	return min64((uint64_t)p->rto << shift, ep->cfg.rto_max_us);
}

/* How long p's acks may be silent, with data of ours unacked, before a probe asks for one: two
 * round trips (RFC 8985 7.2), plus the receiver's ack delay when one datagram is out (it may
 * hold its ack for a second one). Never below RD_PTO_MIN_US: a receiver descheduled briefly
 * would draw a probe every time. */
static inline uint64_t pto(const struct rd_ep *ep, const struct rd_peer *p)
{
	uint64_t t = 2 * (uint64_t)p->srtt;
	if (t < RD_PTO_MIN_US)
		t = RD_PTO_MIN_US;
	if (p->inflight == 1)
		t += ep->cfg.ack_delay_us;
	return t;
}

/* p's acks or new data to it: the probe timer restarts now. */
static inline void quiet_from(struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	p->quiet_us = now;
	p->probe_n = 0;
	if (p->srtt && p->inflight)
		arm(ep, now + pto(ep, p));
}

static uint32_t send_wnd(const struct rd_ep *ep, const struct rd_peer *p)
{
	uint32_t w = ep->cfg.max_wnd;
	if (p->peer_wnd < w)
		w = p->peer_wnd;
	if (!p->synced && RD_INIT_WND < w)
		w = RD_INIT_WND;
	if (p->peer_rnr)
		w = 0; /* the receiver has no buffer: only the probes of the timer go out */
	return w;
}

static bool may_send(struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	/* an epoch idle this long may have been reaped by the receiver: start a new one */
	if (!p->inflight && p->snd_nxt != rd_isn && since(now, p->last_us) > RD_RENEW_IDLE_US)
		tx_reset(ep, p, 0);
	return p->inflight < send_wnd(ep, p) && ep->tx_nfree > 0;
}

int rd_send(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen,
	    const struct iovec *iov, int iovcnt, uint64_t cookie)
{
	union dgv_sockaddr a;
	socklen_t alen;
	size_t total = 0;

	if (iovcnt < 0 || (iovcnt > 0 && !iov))
		return -EINVAL;
	for (int k = 0; k < iovcnt; k++) {
		if (iov[k].iov_len > ep->cfg.max_dgram - total)
			return -EMSGSIZE;
		total += iov[k].iov_len;
	}
	/* the receiver rejects DATA without payload as malformed */
	if (total == 0 || addr_norm(to, tolen, &a, &alen))
		return -EINVAL;

	uint32_t i = peer_find(ep, &a);
	/* The datagrams of one train leave together at cork_flush: they take the clock of its
	 * first (a clock read per 1472-byte segment was 6 % of an RD sender's CPU) */
	bool joins = ep->corked && ep->cork_n && ep->cork_peer == i && ep->cork_n < RD_CORK_MAX;
	uint64_t now = joins ? ep->cork_us : rd_now(ep);
	if (i == RD_NIL && (i = peer_new(ep, &a, alen, now)) == RD_NIL)
		return -ENOMEM;
	struct rd_peer *p = &ep->peers[i];
	if (!may_send(ep, p, now)) {
		ep->st.window_stalls++;
		return -EAGAIN;
	}

	uint32_t s = tx_alloc(ep);
	struct rd_txslot *t = &ep->tx[s];
	uint8_t *b = txbuf(ep, s) + DG_RD_HLEN;
	for (int k = 0; k < iovcnt; k++) {
		if (iov[k].iov_len)
			memcpy(b, iov[k].iov_base, iov[k].iov_len);
		b += iov[k].iov_len;
	}
	t->cookie = cookie;
	t->seq = p->snd_nxt++;
	t->len = (uint32_t)(DG_RD_HLEN + total);
	t->next = RD_NIL;
	t->err = 0;
	t->retries = 0;
	t->backoff = 0;
	t->sacked = 0;
	t->sent_us = now;
	if (p->tx_tail != RD_NIL)
		ep->tx[p->tx_tail].next = s;
	else
		p->tx_head = s;
	p->tx_tail = s;
	p->inflight++;
	p->last_us = now;
	ep->st.data_sent++;
	activate(ep, i);
	arm(ep, now + slot_rto(ep, p, t));
	quiet_from(ep, p, now);
	if (!ep->corked || ep->no_trains || !ep->ops.xmit_train) {
		xmit_slot(ep, p, s);
		return 0;
	}
	if (ep->cork_n && (ep->cork_peer != i || ep->cork_n == RD_CORK_MAX))
		cork_flush(ep);
	if (!ep->cork_n)
		ep->cork_us = now;
	ep->cork_peer = i;
	ep->cork[ep->cork_n++] = s;
	return 0;
}

bool rd_can_send(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen)
{
	union dgv_sockaddr a;
	socklen_t alen;
	if (addr_norm(to, tolen, &a, &alen))
		return false;
	uint32_t i = peer_find(ep, &a);
	if (i == RD_NIL)
		return ep->tx_nfree > 0;
	return may_send(ep, &ep->peers[i], rd_now(ep));
}

bool rd_can_send_any(const struct rd_ep *ep) { return ep->tx_nfree > 0; }

/* ------------------------------------------------------------------ acknowledgements */

/* The lowest RTO for p: rto_min, or higher while a spurious timeout is recent (halved every
 * RD_FLOOR_DECAY_US). */
static uint32_t rto_floor(const struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	while (p->rto_floor > ep->cfg.rto_min_us && since(now, p->floor_us) >= RD_FLOOR_DECAY_US) {
		p->rto_floor /= 2;
		p->floor_us += RD_FLOOR_DECAY_US;
	}
	return p->rto_floor > ep->cfg.rto_min_us ? p->rto_floor : ep->cfg.rto_min_us;
}

static void rtt_sample(const struct rd_ep *ep, struct rd_peer *p, uint64_t r64, uint64_t now)
{
	uint32_t r = r64 > UINT32_MAX / 16 ? UINT32_MAX / 16 : (uint32_t)r64;
	if (r == 0)
		r = 1; /* srtt 0 means "no sample" */
	if (!p->min_rtt || r < p->min_rtt)
		p->min_rtt = r;
	if (!p->srtt) {
		p->srtt = r;
		p->rttvar = r / 2;
	} else {
		uint32_t delta = p->srtt > r ? p->srtt - r : r - p->srtt;
		p->rttvar = (uint32_t)(((uint64_t)p->rttvar * 3 + delta) / 4);
		p->srtt = (uint32_t)(((uint64_t)p->srtt * 7 + r) / 8);
	}
	/* RFC 6298, but never below two RTTs: the receiver delays acks by up to ack_delay */
	uint64_t var = (uint64_t)p->rttvar * 4;
	uint64_t rto = p->srtt + (var > p->srtt ? var : p->srtt);
	uint32_t lo = rto_floor(ep, p, now);
	if (rto < lo)
		rto = lo;
	if (rto > ep->cfg.rto_max_us)
		rto = ep->cfg.rto_max_us;
	p->rto = (uint32_t)rto;
}

/* RACK: the latest transmission known delivered. Only first transmissions count (Karn's rule
 * applied to RACK): without timestamps, the ack of a retransmitted datagram may be the
 * original's, still queued at a slow receiver, and taking the retransmission's time for it would
 * declare everything sent in between lost. A lost retransmission is still found by RACK, once a
 * datagram first sent after it is acked. */
static inline void rack_note(const struct rd_txslot *t, uint64_t *rack)
{
	if (!t->retries && t->sent_us > *rack)
		*rack = t->sent_us;
}

/* How much later than a datagram another may be sent and still arrive first. Returns
 * UINT64_MAX (no time-based loss detection) until an RTT was measured. */
static inline uint64_t reo_wnd(const struct rd_peer *p)
{
	return p->min_rtt ? p->min_rtt / 4 : UINT64_MAX;
}

/* Asks p for an ack now (RD_FLAG_PROBE). Datagrams corked before it go first: its answer
 * speaks of everything sent before it. */
static void send_probe(struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	if (ep->cork_n)
		cork_flush(ep);
	if (xmit_ctl(ep, p, RD_FLAG_PROBE, ++p->probe_id) == 0) {
		p->probe_us = now;
		p->probe_n++;
		ep->st.probes++;
	}
}

static void retransmit(struct rd_ep *ep, struct rd_peer *p, uint32_t s, uint64_t now)
{
	ep->tx[s].retries++;
	ep->tx[s].sent_us = now;
	ep->st.retransmits++;
	xmit_slot(ep, p, s);
}

/*
 * Recovery after a timeout. A timeout retransmits only the oldest datagram: the peer may merely
 * have been slow (descheduled) while everything else is still on its way, and retransmitting the
 * whole window then would be a window of duplicates. The acks that follow tell the cases apart
 * (the question of RFC 5682, answered with sequence numbers instead of new data): an ack that
 * covers or SACKs a transmission from before the timeout means the originals arrive, so the
 * timeout was spurious or SACK and RACK take over, and recovery ends. An ack that covers only
 * what was retransmitted since means the rest was lost as well (an outage): it is retransmitted
 * in batches doubling each round trip (rec_go), each after a short wait for originals that a
 * slow receiver may still be reading.
 * news: the ack SACKs something or covers a transmission from before the timeout.
 */
static void rec_ack(struct rd_ep *ep, struct rd_peer *p, bool advanced, bool news, uint32_t ack,
		    uint64_t now)
{
	if (news && p->rec_clean && !p->peer_rnr) {
		/* Spurious: no loss was in sight (the last ack before the timeout showed no hole, the
		 * oldest datagram had not been retransmitted) and the originals were only late. As
		 * Eifel's response (RFC 4015) adapts the timer, the RTO is kept above twice what
		 * the oldest waited until it is halved again (RD_FLOOR_DECAY_US): a receiver
		 * descheduled again and again costs a duplicate the first time, not every time.
		 * (With a hole in sight the same ack shape only says the receiver had buffered
		 * what followed the lost datagram.) */
		uint64_t seen = 2 * since(now, p->rec_base);
		if (seen > ep->cfg.rto_max_us)
			seen = ep->cfg.rto_max_us;
		if (seen > p->rto_floor) {
			p->rto_floor = (uint32_t)seen;
			p->floor_us = now;
		}
		if (p->rto < p->rto_floor)
			p->rto = p->rto_floor;
		ep->st.spurious_timeouts++;
	}
	if (news || !seq_lt(ack, p->rec_end) || p->peer_rnr) {
		p->rec_start = p->rec_due = 0;
		return;
	}
	if (advanced && !p->rec_due) {
		uint64_t wait = p->srtt ? p->srtt : p->rto;
		p->rec_due = now + min64(wait, p->rto);
		arm(ep, p->rec_due);
	}
}

/* The next batch of a recovery after a timeout: datagrams sent before it and not since. */
static void rec_go(struct rd_ep *ep, struct rd_peer *p, uint64_t now)
{
	uint32_t n = p->rec_burst;
	p->rec_due = 0;
	for (uint32_t s = p->tx_head; s != RD_NIL && n; s = ep->tx[s].next) {
		struct rd_txslot *t = &ep->tx[s];
		if (!seq_lt(t->seq, p->rec_end))
			break;
		if (t->sacked || t->sent_us >= p->rec_start)
			continue;
		retransmit(ep, p, s, now);
		n--;
	}
	if (p->rec_burst < ep->cfg.max_wnd)
		p->rec_burst *= 2;
}

static void rx_ack(struct rd_ep *ep, struct rd_peer *p, const struct dg_rd_hdr *h, uint64_t now)
{
	uint32_t ack = be32toh(h->ack), sack = be32toh(h->sack);
	uint16_t wnd = be16toh(h->wnd);

	if (be32toh(h->ack_epoch) != p->tx_epoch)
		return; /* about an epoch we ended */
	ep->st.acks_rcvd++;
	/* The answer to our probe: everything sent before it that the receiver lacks was lost (the
	 * loss loop below, as for a datagram that was sent then and acked) */
	uint64_t answered = 0;
	if ((h->flags & RD_FLAG_ANSWER) && p->probe_us && be32toh(h->seq) == p->probe_id) {
		/* (not ready: what it lacks may be the datagram it refused, not a lost one) */
		if (!(h->flags & RD_FLAG_RNR))
			answered = p->probe_us;
		p->probe_us = 0;
	}
	p->peer_wnd = wnd ? wnd : 1;
	p->peer_rnr = (h->flags & RD_FLAG_RNR) != 0;
	if (p->peer_rnr && p->tx_head != RD_NIL) {
		/* Alive but not ready: a slow reader is not a dead peer. Keep probing at a bounded
		 * interval without spending the retry budget. */
		struct rd_txslot *t = &ep->tx[p->tx_head];
		t->retries = 0;
		if (t->backoff > 4)
			t->backoff = 4;
	}

	if (seq_lt(ack, p->snd_una)) {
		uint32_t hd = p->tx_head;
		if (ack == rd_isn && hd != RD_NIL && ep->tx[hd].backoff >= RD_BEHIND_TIMEOUTS &&
		    ++p->behind >= RD_BEHIND_ACKS) {
			DG_DBG("rd: peer %u acks behind our epoch: it lost its state", peer_index(ep, p));
			ep->st.peer_failures++;
			tx_reset(ep, p, -ECONNRESET);
		}
		return;
	}
	if (seq_diff(ack, p->snd_nxt) > 0)
		return; /* acks what we never sent: not for us */
	p->behind = 0;
	p->synced = 1;

	/* RTT samples come from the first ack of a datagram sent once (Karn). Not sampled: a
	 * cumulative ack that may have waited for a hole to fill (the receiver reports a hole, or
	 * did just before), and SACK bits that only appear because the ack advanced (old news). */
	bool clean = !sack && !p->sack_seen;
	bool advanced = ack != p->snd_una;
	uint64_t rtt = UINT64_MAX, rack = 0;
	p->sack_seen = sack != 0;
	if (advanced)
		p->una_us = now;
	bool before_rec = false; /* acked: a transmission from before the timeout */
	while (p->tx_head != RD_NIL && seq_lt(ep->tx[p->tx_head].seq, ack)) {
		uint32_t s = p->tx_head;
		struct rd_txslot *t = &ep->tx[s];
		p->tx_head = t->next;
		p->inflight--;
		if (t->sent_us < p->rec_start)
			before_rec = true;
		if (!t->sacked) {
			rack_note(t, &rack);
			if (clean && !t->retries)
				rtt = since(now, t->sent_us);
		}
		done_push(ep, s, 0);
	}
	if (p->tx_head == RD_NIL)
		p->tx_tail = RD_NIL;
	else
		ep->tx[p->tx_head].sacked = 0; /* the ack says it is missing */
	p->snd_una = ack;
	quiet_from(ep, p, now);

	for (uint32_t s = p->tx_head; sack && s != RD_NIL; s = ep->tx[s].next) {
		struct rd_txslot *t = &ep->tx[s];
		uint32_t off = t->seq - ack; /* bit off-1 is this datagram's */
		if (off > 32)
			break;
		if (off > 0 && !t->sacked && (sack >> (off - 1)) & 1) {
			t->sacked = 1;
			rack_note(t, &rack);
			if (!advanced && !t->retries)
				rtt = since(now, t->sent_us);
		}
	}
	if (rtt != UINT64_MAX)
		rtt_sample(ep, p, rtt, now);
	if (answered > rack)
		rack = answered;
	if (rack > p->rack_us)
		p->rack_us = rack;
	if (p->rec_start)
		rec_ack(ep, p, advanced, before_rec || sack, ack, now);

	/* Loss detection within the SACK's reach: a datagram is lost once 3 later ones arrived
	 * (only before its first retransmission: those SACK bits stay set while the
	 * retransmission is on its way), or once one first sent sufficiently later arrived (RACK,
	 * RFC 8985: its retransmission is then newer than anything known delivered, so it is not
	 * marked again before a newer one arrives). The last retry is left to the timer, which
	 * decides the peer's failure. The answer to a probe needs no reordering allowance: the
	 * probe went through the same socket after them (a path that reorders it ahead of one
	 * costs a duplicate), and it is what finds a retransmission lost at once. */
	uint64_t reo = reo_wnd(p);
	bool resent = false;
	for (uint32_t s = p->tx_head; s != RD_NIL; s = ep->tx[s].next) {
		struct rd_txslot *t = &ep->tx[s];
		uint32_t off = t->seq - ack;
		if (off > 32)
			break;
		if (t->sacked || t->retries >= ep->cfg.max_retries)
			continue;
		uint32_t later = off >= 32 ? 0 : sack >> off;
		if ((reo != UINT64_MAX && t->sent_us + reo < p->rack_us) || t->sent_us <= answered ||
		    (!t->retries && __builtin_popcount(later) >= 3)) {
			retransmit(ep, p, s, now);
			resent = true;
		}
	}
	/* RACK finds a lost retransmission once something sent after it is acked; with the window
	 * full, or nothing more to send, nothing follows it, and its loss would wait for a timer.
	 * A probe right behind it is that something: its answer, a round trip later, says whether
	 * the retransmissions arrived (one header-only datagram per loss episode). */
	if (resent)
		send_probe(ep, p, now);
}

/* ------------------------------------------------------------------ reception */

static void rx_adopt(struct rd_ep *ep, struct rd_peer *p, uint32_t epoch)
{
	rx_reset(ep, p);
	if (p->rx_valid) {
		p->rx_old_epoch = p->rx_epoch;
		p->rx_old_valid = 1;
	}
	p->rx_epoch = epoch;
	p->rcv_nxt = rd_isn;
	p->rx_valid = 1;
}

/* Keeps an out-of-order datagram if a slot is free; a duplicate or a drop is fine either way:
 * the immediate ack that follows tells the sender what we have. */
static void rx_buffer(struct rd_ep *ep, struct rd_peer *p, uint32_t seq, const uint8_t *seg, size_t len)
{
	uint32_t prev = RD_NIL, cur = RD_NIL;
	if (p->rx_tail != RD_NIL && seq_lt(ep->rx[p->rx_tail].seq, seq)) {
		prev = p->rx_tail; /* the common case: the newest so far */
	} else {
		cur = p->rx_head;
		while (cur != RD_NIL && seq_lt(ep->rx[cur].seq, seq)) {
			prev = cur;
			cur = ep->rx[cur].next;
		}
		if (cur != RD_NIL && ep->rx[cur].seq == seq) {
			ep->st.dup_drops++;
			return;
		}
	}
	if (len > ep->rx_stride)
		return;
	uint32_t r = rx_alloc(ep);
	if (r == RD_NIL) {
		ep->st.nobuf_drops++;
		return;
	}
	memcpy(rxbuf(ep, r), seg, len);
	ep->rx[r].seq = seq;
	ep->rx[r].len = (uint32_t)len;
	ep->rx[r].next = cur;
	if (prev != RD_NIL)
		ep->rx[prev].next = r;
	else
		p->rx_head = r;
	if (cur == RD_NIL)
		p->rx_tail = r;
	p->rx_count++;
	ep->st.ooo_buffered++;
}

static void rnr_set(struct rd_ep *ep, struct rd_peer *p, uint8_t on)
{
	if (p->rnr == on)
		return;
	p->rnr = on;
	if (on)
		ep->rnr_peers++;
	else
		ep->rnr_peers--;
}

/* Delivers the buffered datagrams that are now in order, until deliver() refuses one.
 * Returns how many went. */
static uint32_t deliver_buffered(struct rd_ep *ep, struct rd_peer *p, uint32_t epoch)
{
	uint32_t n = 0;
	/* deliver() may have sent (piggybacking acks) but cannot change the receive state */
	while (p->rx_valid && p->rx_epoch == epoch && p->rx_head != RD_NIL &&
	       ep->rx[p->rx_head].seq == p->rcv_nxt) {
		uint32_t r = p->rx_head;
		p->rcv_nxt++;
		p->rx_unacked++;
		p->ack_dirty = 1;
		if (ep->ops.deliver(ep->arg, &p->addr, p->addrlen, rxbuf(ep, r), ep->rx[r].len) == -EAGAIN) {
			p->rcv_nxt--;
			p->rx_unacked--;
			rnr_set(ep, p, 1);
			break;
		}
		rnr_set(ep, p, 0);
		p->rx_head = ep->rx[r].next;
		if (p->rx_head == RD_NIL)
			p->rx_tail = RD_NIL;
		p->rx_count--;
		rx_release(ep, r);
		n++;
	}
	return n;
}

void rd_kick(struct rd_ep *ep)
{
	if (!ep->rnr_peers)
		return;
	uint64_t now = rd_now(ep);
	for (uint32_t i = 0; i < ep->peer_high && ep->rnr_peers; i++) {
		struct rd_peer *p = &ep->peers[i];
		if (!p->in_use || !p->rnr || !p->rx_valid)
			continue;
		p->pin++;
		if (p->rx_head == RD_NIL || ep->rx[p->rx_head].seq != p->rcv_nxt) {
			/* the refused datagram could not be kept: the sender's probe brings it back */
			rnr_set(ep, p, 0);
			send_ack(ep, p, now);
		} else if (deliver_buffered(ep, p, p->rx_epoch) || !p->rnr) {
			send_ack(ep, p, now);
		}
		p->pin--;
	}
	drain(ep);
}

/* Arms the delayed ack of peer i (p) unless it is armed already. */
static void ack_later(struct rd_ep *ep, struct rd_peer *p, uint32_t i, uint64_t now)
{
	if (p->ack_due)
		return;
	p->ack_due = now + ep->cfg.ack_delay_us;
	arm(ep, p->ack_due);
	activate(ep, i);
}

/* Within a receive batch: notes that peer i's in-order ack is owed at the batch's end. Returns
 * false when the batch's list is full (the caller acks as outside a batch). */
static bool ack_batched(struct rd_ep *ep, uint32_t i)
{
	for (uint32_t k = 0; k < ep->ack_n; k++)
		if (ep->ack_peer[k] == i)
			return true;
	if (ep->ack_n == RD_ACK_BATCH)
		return false;
	ep->ack_peer[ep->ack_n++] = i;
	return true;
}

/* Returns the peer's index (created and pinned here if it was unknown), or RD_NIL. */
static uint32_t rx_data(struct rd_ep *ep, uint32_t i, const union dgv_sockaddr *from, socklen_t fromlen,
			const struct dg_rd_hdr *h, const uint8_t *seg, size_t len, uint64_t now)
{
	uint32_t epoch = be32toh(h->epoch), seq = be32toh(h->seq);
	bool fresh = seq - rd_isn < RD_INIT_WND; /* could be the start of an epoch */
	struct rd_peer *p;

	if (i == RD_NIL) {
		if (!fresh) {
			send_rst(ep, from, fromlen, epoch);
			return RD_NIL;
		}
		i = peer_new(ep, from, fromlen, now);
		if (i == RD_NIL)
			return RD_NIL; /* table full: the sender retries */
		ep->peers[i].pin++;
	}
	p = &ep->peers[i];
	if (!p->rx_valid || epoch != p->rx_epoch) {
		if (p->rx_old_valid && epoch == p->rx_old_epoch) {
			ep->st.dup_drops++; /* straggler of the epoch this one replaced */
			return i;
		}
		if (!fresh) {
			send_rst(ep, from, fromlen, epoch);
			return i;
		}
		/* A new epoch from a peer that acks nothing of ours knows nothing of our epoch: a
		 * new socket on a port we talked to (a server's next short-lived client). Our next
		 * datagram, past our epoch's start, would have it adopt our epoch mid-way and wait
		 * for what came before: retries and acks behind ours for seconds, then a reset. With
		 * nothing of ours in flight, a new epoch costs nothing. A peer that renewed only
		 * its own epoch still acks ours (RD_FLAG_ACK): no cascade of renewals. */
		if (p->rx_valid && !(h->flags & RD_FLAG_ACK) && !p->inflight && p->snd_nxt != rd_isn)
			tx_reset(ep, p, 0);
		rx_adopt(ep, p, epoch);
	}

	int32_t d = seq_diff(seq, p->rcv_nxt);
	if (d != 0) {
		if (d < 0)
			ep->st.dup_drops++;
		else if ((uint32_t)d < RD_RX_SPAN)
			rx_buffer(ep, p, seq, seg, len);
		else
			return i;
		p->ack_dirty = 1;
		/* A duplicate, or news the SACK bits can carry (a hole, or what arrived after it):
		 * the sender needs to know at once (in a receive batch: once the batch is read, one
		 * ack with the SACK bits of all of it). Beyond the SACK's reach an ack only says the
		 * same again, so those are acked as in-order data is. */
		if (ep->rx_batch && ack_batched(ep, i)) {
			if (d <= 32)
				p->ack_urgent = 1;
			else
				p->rx_unacked++;
			return i;
		}
		if (d <= 32 || ++p->rx_unacked >= 2)
			send_ack(ep, p, now);
		else
			ack_later(ep, p, i, now);
		return i;
	}

	bool filled_hole = p->rx_head != RD_NIL;
	p->rcv_nxt++;
	p->rx_unacked++;
	p->ack_dirty = 1;
	if (ep->ops.deliver(ep->arg, &p->addr, p->addrlen, seg, len) == -EAGAIN) {
		/* no receive buffer: keep it (if we can) and say "not ready" */
		p->rcv_nxt--;
		p->rx_unacked--;
		rx_buffer(ep, p, seq, seg, len);
		rnr_set(ep, p, 1);
		send_ack(ep, p, now);
		return i;
	}
	if (p->rnr)
		rnr_set(ep, p, 0);
	deliver_buffered(ep, p, epoch);
	if (!p->ack_dirty)
		return i; /* a reply from deliver() carried the ack */
	if (ep->rx_batch && ack_batched(ep, i)) {
		p->ack_urgent |= filled_hole;
		return i; /* acked with the rest of the receive: rd_rx_batch_end */
	}
	if (filled_hole || p->rx_unacked >= 2)
		send_ack(ep, p, now);
	else
		ack_later(ep, p, i, now);
	return i;
}

void rd_rx_batch_begin(struct rd_ep *ep)
{
	ep->rx_batch = true;
	ep->ack_n = 0;
}

void rd_rx_batch_end(struct rd_ep *ep)
{
	ep->rx_batch = false;
	if (!ep->ack_n)
		return;
	uint64_t now = rd_now(ep);
	for (uint32_t k = 0; k < ep->ack_n; k++) {
		uint32_t i = ep->ack_peer[k];
		struct rd_peer *p = &ep->peers[i];
		if (!p->in_use || !p->rx_valid || !p->ack_dirty)
			continue; /* acked meanwhile (a reply) */
		if (p->ack_urgent || p->rx_unacked >= 2)
			send_ack(ep, p, now);
		else
			ack_later(ep, p, i, now);
	}
	ep->ack_n = 0;
	drain(ep);
}

int rd_input(struct rd_ep *ep, const union dgv_sockaddr *from, socklen_t fromlen, uint8_t *buf,
	     size_t len)
{
	struct dg_rd_hdr h;
	union dgv_sockaddr a;
	socklen_t alen;

	if (!buf || len < DG_RD_HLEN)
		goto malformed;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != RD_MAGIC || !h.flags ||
	    (h.flags & ~(RD_FLAG_DATA | RD_FLAG_ACK | RD_FLAG_RST | RD_FLAG_RNR | RD_FLAG_PROBE | RD_FLAG_ANSWER)) ||
	    ((h.flags & (RD_FLAG_RNR | RD_FLAG_ANSWER)) && !(h.flags & RD_FLAG_ACK)) ||
	    ((h.flags & RD_FLAG_PROBE) && (h.flags & (RD_FLAG_DATA | RD_FLAG_ANSWER))))
		goto malformed;
	if ((h.flags & RD_FLAG_DATA) ? len == DG_RD_HLEN : len != DG_RD_HLEN)
		goto malformed;
	if (addr_norm(from, fromlen, &a, &alen))
		return -EINVAL;

	uint64_t now = rd_now(ep);
	uint32_t i = peer_find(ep, &a);
	if (i != RD_NIL) {
		struct rd_peer *p = &ep->peers[i];
		p->pin++;
		p->last_us = now;
		if ((h.flags & RD_FLAG_RST) && be32toh(h.ack_epoch) == p->tx_epoch) {
			DG_DBG("rd: peer %u reset our epoch %08x", i, p->tx_epoch);
			ep->st.resets_rcvd++;
			tx_reset(ep, p, -ECONNRESET);
		} else if (h.flags & RD_FLAG_ACK) {
			rx_ack(ep, p, &h, now);
		}
		/* a probe of the epoch we receive: answered at once, after all that came before it */
		if ((h.flags & RD_FLAG_PROBE) && p->rx_valid && be32toh(h.epoch) == p->rx_epoch &&
		    xmit_ctl(ep, p, RD_FLAG_ANSWER, be32toh(h.seq)) == 0)
			ep->st.acks_sent++;
		drain(ep);
	}
	if (h.flags & RD_FLAG_DATA)
		i = rx_data(ep, i, &a, alen, &h, buf + DG_RD_HLEN, len - DG_RD_HLEN, now);
	if (i != RD_NIL)
		ep->peers[i].pin--;
	drain(ep);
	return 0;

malformed:
	ep->st.malformed++;
	return -EPROTO;
}

/* ------------------------------------------------------------------ timers */

/* The peer's timers: a due batch of recovery after a timeout, and the oldest datagram's
 * retransmission timer (RFC 6298 5.3: restarted whenever the cumulative ack advances), which
 * fails the peer when its retries are spent. Lowers *next to the next deadline. */
static void tx_timers(struct rd_ep *ep, struct rd_peer *p, uint64_t now, uint64_t *next)
{
	uint32_t s = p->tx_head;
	if (s == RD_NIL)
		return;
	if (p->rec_due) {
		if (now >= p->rec_due)
			rec_go(ep, p, now);
		else
			*next = min64(*next, p->rec_due);
	}
	/* Tail-loss probe: acks silent for a PTO. The ack lost on its way, the last datagrams
	 * lost with nothing after them to SACK, a fast retransmission lost while the window is
	 * full (nothing newer for RACK): each would wait for the RTO (2 ms at least, then backed
	 * off); a header-only probe's answer tells in a round trip which. A probe or its answer
	 * lost: another after twice the wait, RD_PROBES_MAX in a row, then only the RTO (a dead
	 * peer is not probed at length). Not in a recovery after a timeout nor towards a peer
	 * that said "not ready" (the RTO probes those with data), nor before an RTT sample. */
	if (p->srtt && !p->peer_rnr && !p->rec_start && p->probe_n < RD_PROBES_MAX) {
		uint64_t at = p->probe_n ? p->probe_us + (pto(ep, p) << p->probe_n) : p->quiet_us + pto(ep, p);
		if (now >= at) {
			send_probe(ep, p, now);
			at = now + (pto(ep, p) << p->probe_n);
		}
		if (p->probe_n < RD_PROBES_MAX)
			*next = min64(*next, at);
	}
	struct rd_txslot *t = &ep->tx[s];
	uint64_t base = p->una_us > t->sent_us ? p->una_us : t->sent_us;
	uint64_t dl = base + slot_rto(ep, p, t);
	/* A fast retransmission that is not acked within a round trip (and its variation) was
	 * lost too: the path is known to be losing now, and when the window is full no later
	 * datagram's SACK can tell (RACK needs one). Not floored at rto_min: a receiver that was
	 * merely slow costs a duplicate here only while datagrams are being lost anyway. A probe
	 * sent after it answers that question exactly (or, lost, leaves it to the RTO). */
	if (t->retries && !t->backoff && p->srtt && !p->peer_rnr && p->probe_us < t->sent_us) {
		uint64_t lr = t->sent_us + p->srtt + 4 * (uint64_t)p->rttvar;
		if (lr < dl)
			dl = lr;
	}
	if (now < dl) {
		*next = min64(*next, dl);
		return;
	}
	if (t->retries >= ep->cfg.max_retries) {
		DG_DBG("rd: peer %u failed: seq %u unacked after %u retries", peer_index(ep, p),
		       t->seq, t->retries);
		ep->st.peer_failures++;
		tx_reset(ep, p, -ETIMEDOUT);
		return;
	}
	if (t->backoff < UINT8_MAX)
		t->backoff++;
	if (!p->rec_start && !p->peer_rnr) {
		p->rec_start = now;
		p->rec_base = base;
		p->rec_clean = !p->sack_seen && !t->retries;
		p->rec_end = p->snd_nxt;
		p->rec_burst = 2;
	}
	ep->st.timeouts++;
	retransmit(ep, p, s, now);
	*next = min64(*next, now + slot_rto(ep, p, t));
}

uint64_t rd_tick(struct rd_ep *ep, uint64_t now_us)
{
	bool reap = ep->st.peers && since(now_us, ep->last_reap) >= RD_REAP_SCAN_US;
	if (now_us < ep->next_deadline && !reap)
		return ep->next_deadline == UINT64_MAX ? UINT64_MAX : ep->next_deadline - now_us;

	uint64_t next = UINT64_MAX;
	ep->next_deadline = UINT64_MAX;
	for (uint32_t i = ep->act_head, ni; i != RD_NIL; i = ni) {
		struct rd_peer *p = &ep->peers[i];
		ni = p->anext;
		if (p->ack_due) {
			if (now_us >= p->ack_due)
				send_ack(ep, p, now_us);
			else
				next = min64(next, p->ack_due);
		}
		tx_timers(ep, p, now_us, &next);
		if (!p->inflight && !p->ack_due)
			deactivate(ep, i);
	}
	if (reap) {
		ep->last_reap = now_us;
		reap_idle(ep, now_us, false);
	}
	arm(ep, next);
	drain(ep); /* callbacks' rd_send() arm their own timers */
	if (ep->next_deadline == UINT64_MAX)
		return UINT64_MAX;
	return ep->next_deadline > now_us ? ep->next_deadline - now_us : 0;
}

int rd_peer_gone(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen)
{
	union dgv_sockaddr a;
	socklen_t alen;
	if (addr_norm(to, tolen, &a, &alen))
		return -EINVAL;
	uint32_t i = peer_find(ep, &a);
	if (i == RD_NIL || !ep->peers[i].inflight)
		return 0;
	DG_DBG("rd: peer %u gone (told by the caller): %u datagrams in flight fail", i, ep->peers[i].inflight);
	ep->st.peer_failures++;
	tx_reset(ep, &ep->peers[i], -ECONNRESET);
	drain(ep);
	return 1;
}

void rd_ack_owed(struct rd_ep *ep, uint64_t now_us)
{
	for (uint32_t i = ep->act_head; i != RD_NIL; i = ep->peers[i].anext)
		if (ep->peers[i].ack_due)
			send_ack(ep, &ep->peers[i], now_us);
}

bool rd_busy(struct rd_ep *ep)
{
	for (uint32_t i = ep->act_head; i != RD_NIL; i = ep->peers[i].anext)
		if (ep->peers[i].inflight || ep->peers[i].ack_due)
			return true;
	return false;
}

void rd_get_stats(struct rd_ep *ep, struct rd_stats *out) { *out = ep->st; }

/* ------------------------------------------------------------------ creation */

static uint32_t default_slots(uint32_t max_dgram)
{
	uint32_t n = (4u << 20) / max_dgram;
	return n < 16 ? 16 : n > 1024 ? 1024 : n;
}

int rd_create(const struct rd_cfg *cfg, const struct rd_ops *ops, void *arg, struct rd_ep **out)
{
	if (!cfg || !ops || !ops->xmit || !ops->deliver || !out)
		return -EINVAL;
	struct rd_cfg c = *cfg;
	if (c.max_dgram == 0 || c.max_dgram > DG_MAX_DATAGRAM - DG_RD_HLEN - DG_CRC_LEN)
		return -EINVAL;
	if (!c.tx_slots)
		c.tx_slots = default_slots(c.max_dgram);
	if (!c.rx_slots)
		c.rx_slots = default_slots(c.max_dgram);
	if (!c.max_wnd)
		c.max_wnd = 256;
	if (!c.max_peers)
		c.max_peers = 4096;
	if (!c.max_retries)
		c.max_retries = 12;
	if (!c.rto_min_us)
		c.rto_min_us = 2000;
	if (!c.rto_max_us)
		c.rto_max_us = 500000;
	if (!c.ack_delay_us)
		c.ack_delay_us = 500;
	if (c.tx_slots > RD_MAX_SLOTS || c.rx_slots > RD_MAX_SLOTS || c.max_peers > RD_MAX_PEERS ||
	    c.max_retries > RD_MAX_RETRIES)
		return -EINVAL;
	if (c.max_wnd > c.tx_slots)
		c.max_wnd = c.tx_slots;
	if (c.rto_max_us < c.rto_min_us)
		c.rto_max_us = c.rto_min_us;

	struct rd_ep *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	ep->cfg = c;
	ep->ops = *ops;
	ep->arg = arg;
	ep->clock = default_clock;
	ep->tx_stride = (DG_RD_HLEN + (size_t)c.max_dgram + DG_CRC_LEN + 7) & ~(size_t)7;
	ep->rx_stride = c.max_dgram;
	uint32_t nb = 1;
	while (nb < c.max_peers)
		nb <<= 1;
	ep->bucket_mask = nb - 1;
	ep->tx = calloc(c.tx_slots, sizeof(*ep->tx));
	ep->rx = calloc(c.rx_slots, sizeof(*ep->rx));
	ep->txbuf = malloc(c.tx_slots * ep->tx_stride);
	ep->rxbuf = malloc(c.rx_slots * ep->rx_stride);
	ep->peers = calloc(c.max_peers, sizeof(*ep->peers));
	ep->bucket = malloc(nb * sizeof(*ep->bucket));
	if (!ep->tx || !ep->rx || !ep->txbuf || !ep->rxbuf || !ep->peers || !ep->bucket) {
		rd_destroy(ep);
		return -ENOMEM;
	}
	ep->tx_free = ep->rx_free = ep->peer_free = ep->last_peer = RD_NIL;
	for (uint32_t k = c.tx_slots; k-- > 0;)
		tx_release(ep, k);
	for (uint32_t k = c.rx_slots; k-- > 0;)
		rx_release(ep, k);
	memset(ep->bucket, 0xff, nb * sizeof(*ep->bucket));
	ep->done_head = ep->done_tail = RD_NIL;
	ep->act_head = ep->act_tail = RD_NIL;
	ep->next_deadline = UINT64_MAX;
	if (getrandom(&ep->hash_seed, sizeof(ep->hash_seed), GRND_NONBLOCK) != (ssize_t)sizeof(ep->hash_seed))
		ep->hash_seed = dg_now_us() * 0x9e3779b97f4a7c15ull;
	ep->rng = ep->hash_seed ^ (uintptr_t)ep;
	if (!ep->rng)
		ep->rng = 1;
	ep->last_reap = ep->last_full_scan = dg_now_us();
	*out = ep;
	return 0;
}

void rd_destroy(struct rd_ep *ep)
{
	if (!ep)
		return;
	free(ep->tx);
	free(ep->rx);
	free(ep->txbuf);
	free(ep->rxbuf);
	free(ep->peers);
	free(ep->bucket);
	free(ep);
}
