/*
 * test_rd.c - the reliable-datagram LLP (soft/rd.c) between several rd_ep instances in one
 * process, connected by a simulated channel: xmit queues the bytes with a random latency (which
 * reorders), loss and duplication; the pump verifies and strips the CRC, hands the datagram to
 * the destination's rd_input, and drives a fake clock and rd_tick.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc.h"
#include "rd.h"
#include "wire.h"

/* rd.c test hooks (not in rd.h) */
void rd_test_set_clock(struct rd_ep *ep, uint64_t (*fn)(void *), void *arg);
void rd_test_set_isn(uint32_t isn);

#define MAXN 8
#define MSG_MAGIC 0x4d534721u
#define SEQ_TRACK 4096

struct pkt {
	uint64_t at, serial;
	int src, dst;
	size_t len;
	uint8_t *data;
};

struct node;

struct sim {
	uint64_t now, serial, rng;
	struct pkt *heap;
	size_t n, cap;
	unsigned loss_pm, dup_pm;   /* per mille */
	uint32_t lat_min, lat_jit; /* µs */
	bool hold;                  /* keep everything queued */
	int drop_from;              /* a node whose every datagram is lost, or -1 */
	uint64_t outage_from, outage_to; /* everything sent in [from, to) is lost */
	bool fifo;                  /* latency varies but never reorders (a loopback socket) */
	uint64_t fifo_at[MAXN][MAXN];
	uint64_t stall_every, stall_len; /* nothing is delivered for stall_len of every stall_every µs */
	uint64_t data_lost;         /* DATA datagrams the channel dropped */
	/* a test's own losses: true drops this datagram (h: its header) */
	bool (*drop)(struct sim *s, const struct node *src, const struct dg_rd_hdr *h);
	struct node *nodes[MAXN];
	int nnodes;
};

struct rcv_state {
	bool seen;
	uint32_t gen, next;
	uint64_t count;
};

struct node {
	struct sim *sim;
	int id;
	struct rd_cfg cfg;
	struct rd_ep *ep;
	union dgv_sockaddr addr;
	socklen_t alen;
	uint32_t gen;
	bool lenient;   /* fuzzing: deliveries are not checked */
	bool any_first; /* after our restart a peer's first message may have any index */
	struct rcv_state rcv[MAXN];
	uint64_t ndeliver;
	int rnr_budget;    /* refuse this many deliveries with -EAGAIN (receiver not ready) */
	uint64_t nrefused;
	/* sending */
	uint32_t next_idx[MAXN];
	uint64_t nacked[MAXN], nfailed[MAXN];
	int64_t last_acked[MAXN], last_failed[MAXN];
	int last_err;
	uint64_t failed_at_us;
	uint32_t first_seq_xmits_at_fail;
	/* sniffed from our own xmit */
	uint64_t xmits, data_xmits;
	uint32_t seq_xmits[SEQ_TRACK]; /* DATA transmissions by seq - isn */
	uint32_t cur_epoch, epoch_changes;
	bool saw_seq_hi, saw_seq_lo;
	uint32_t isn;
	/* hooks */
	void (*on_deliver)(struct node *n, int src, const uint8_t *seg, size_t len);
	void (*on_acked)(struct node *n, uint64_t cookie);
	void (*on_failed)(struct node *n, uint64_t cookie, int err);
	void *ctx;
};

struct msg_hdr {
	uint32_t magic, src, gen, idx, len;
};

/* ------------------------------------------------------------------ helpers */

static uint64_t xrand(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

static uint64_t sim_clock(void *arg) { return ((struct sim *)arg)->now; }

static bool pkt_before(const struct pkt *a, const struct pkt *b)
{
	return a->at < b->at || (a->at == b->at && a->serial < b->serial);
}

static void heap_push(struct sim *s, struct pkt p)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 1024;
		s->heap = realloc(s->heap, s->cap * sizeof(*s->heap));
		cr_assert_not_null(s->heap);
	}
	size_t i = s->n++;
	while (i > 0 && pkt_before(&p, &s->heap[(i - 1) / 2])) {
		s->heap[i] = s->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	s->heap[i] = p;
}

static struct pkt heap_pop(struct sim *s)
{
	struct pkt top = s->heap[0], last = s->heap[--s->n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= s->n)
			break;
		if (c + 1 < s->n && pkt_before(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!pkt_before(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (s->n)
		s->heap[i] = last;
	return top;
}

static bool addr_same(const union dgv_sockaddr *a, const union dgv_sockaddr *b)
{
	if (a->sa.sa_family != b->sa.sa_family)
		return false;
	if (a->sa.sa_family == AF_INET)
		return a->sin.sin_port == b->sin.sin_port && a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
	return a->sin6.sin6_port == b->sin6.sin6_port &&
	       !memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, sizeof(struct in6_addr));
}

static struct node *node_by_addr(struct sim *s, const union dgv_sockaddr *a)
{
	for (int i = 0; i < s->nnodes; i++)
		if (s->nodes[i] && s->nodes[i]->ep && addr_same(&s->nodes[i]->addr, a))
			return s->nodes[i];
	return NULL;
}

/* ------------------------------------------------------------------ rd callbacks */

static int cb_xmit(void *arg, const struct iovec *iov, int iovcnt, const union dgv_sockaddr *to,
		   socklen_t tolen)
{
	struct node *n = arg;
	struct sim *s = n->sim;
	size_t len = 0;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	cr_assert_geq(len, DG_RD_HLEN + DG_CRC_LEN);
	uint8_t *b = malloc(len);
	cr_assert_not_null(b);
	size_t off = 0;
	for (int i = 0; i < iovcnt; i++) {
		memcpy(b + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	cr_assert(tolen == sizeof(struct sockaddr_in) || tolen == sizeof(struct sockaddr_in6));
	cr_assert(dg_crc_check(b, len), "bad CRC on transmit");

	struct dg_rd_hdr h;
	memcpy(&h, b, sizeof(h));
	cr_assert_eq(h.magic, RD_MAGIC);
	n->xmits++;
	if (h.flags & RD_FLAG_DATA) {
		uint32_t seq = be32toh(h.seq), ep = be32toh(h.epoch);
		n->data_xmits++;
		if (ep != n->cur_epoch) {
			n->cur_epoch = ep;
			n->epoch_changes++;
		}
		if (seq - n->isn < SEQ_TRACK)
			n->seq_xmits[seq - n->isn]++;
		if (seq >= 0xfffffff0u)
			n->saw_seq_hi = true;
		if (seq < 0x10u)
			n->saw_seq_lo = true;
	}

	struct node *dst = node_by_addr(s, to);
	bool lost = !dst || s->drop_from == n->id || (s->now >= s->outage_from && s->now < s->outage_to) ||
		    xrand(&s->rng) % 1000 < s->loss_pm || (s->drop && s->drop(s, n, &h));
	if (lost) {
		if (h.flags & RD_FLAG_DATA)
			s->data_lost++;
		free(b);
		return 0;
	}
	int copies = xrand(&s->rng) % 1000 < s->dup_pm ? 2 : 1;
	for (int c = 0; c < copies; c++) {
		struct pkt p = {
			.at = s->now + s->lat_min + (s->lat_jit ? xrand(&s->rng) % s->lat_jit : 0),
			.serial = s->serial++,
			.src = n->id,
			.dst = dst->id,
			.len = len,
			.data = c ? malloc(len) : b,
		};
		cr_assert_not_null(p.data);
		if (c)
			memcpy(p.data, b, len);
		if (s->fifo) {
			if (p.at < s->fifo_at[n->id][dst->id])
				p.at = s->fifo_at[n->id][dst->id];
			s->fifo_at[n->id][dst->id] = p.at;
		}
		heap_push(s, p);
	}
	return 0;
}

static int cb_deliver(void *arg, const union dgv_sockaddr *from, socklen_t fromlen,
		      const uint8_t *seg, size_t len)
{
	struct node *n = arg;
	struct msg_hdr m;
	(void)fromlen;
	if (n->rnr_budget > 0) {
		n->rnr_budget--;
		n->nrefused++;
		return -EAGAIN; /* receiver not ready: RD must keep it and offer it again */
	}
	n->ndeliver++;
	if (n->lenient)
		return 0;
	cr_assert_geq(len, sizeof(m));
	memcpy(&m, seg, sizeof(m));
	cr_assert_eq(m.magic, MSG_MAGIC);
	cr_assert_lt(m.src, (uint32_t)n->sim->nnodes);
	struct node *src = n->sim->nodes[m.src];
	cr_assert(addr_same(from, &src->addr), "segment of node %u from the wrong address", m.src);
	cr_assert_eq(m.len, len);
	for (size_t k = sizeof(m); k < len; k++)
		cr_assert_eq(seg[k], (uint8_t)(m.idx * 131 + k * 7 + m.src * 29 + m.gen),
			     "payload byte %zu of msg %u", k, m.idx);

	struct rcv_state *r = &n->rcv[m.src];
	if (!r->seen) {
		if (!n->any_first)
			cr_assert_eq(m.idx, 0, "first message from %u is %u", m.src, m.idx);
		r->seen = true;
	} else if (m.gen != r->gen) {
		cr_assert_eq(m.idx, 0, "restarted node %u began at %u", m.src, m.idx);
	} else {
		cr_assert_eq(m.idx, r->next, "node %d got msg %u from %u, expected %u", n->id, m.idx,
			     m.src, r->next);
	}
	r->gen = m.gen;
	r->next = m.idx + 1;
	r->count++;
	if (n->on_deliver)
		n->on_deliver(n, (int)m.src, seg, len);
	return 0;
}

static void cb_acked(void *arg, uint64_t cookie)
{
	struct node *n = arg;
	cr_assert_neq(cookie, 0, "zero cookie reported");
	int dst = (int)(cookie >> 32) - 1;
	int64_t idx = (int64_t)(uint32_t)cookie - 1;
	cr_assert(dst >= 0 && dst < MAXN);
	cr_assert_gt(idx, n->last_acked[dst], "acked out of order: %ld after %ld", (long)idx,
		     (long)n->last_acked[dst]);
	cr_assert_gt(idx, n->last_failed[dst], "acked after failed");
	n->last_acked[dst] = idx;
	n->nacked[dst]++;
	if (n->on_acked)
		n->on_acked(n, cookie);
}

static void cb_failed(void *arg, uint64_t cookie, int err)
{
	struct node *n = arg;
	cr_assert_neq(cookie, 0, "zero cookie reported");
	int dst = (int)(cookie >> 32) - 1;
	int64_t idx = (int64_t)(uint32_t)cookie - 1;
	cr_assert(dst >= 0 && dst < MAXN);
	cr_assert_gt(idx, n->last_failed[dst], "failed out of order");
	cr_assert_gt(idx, n->last_acked[dst], "failed after acked");
	n->last_failed[dst] = idx;
	n->nfailed[dst]++;
	n->last_err = err;
	if (!n->failed_at_us) {
		n->failed_at_us = n->sim->now;
		n->first_seq_xmits_at_fail = n->seq_xmits[0];
	}
	if (n->on_failed)
		n->on_failed(n, cookie, err);
}

static const struct rd_ops test_ops = {
	.xmit = cb_xmit, .deliver = cb_deliver, .acked = cb_acked, .failed = cb_failed,
};

/* ------------------------------------------------------------------ the simulation */

static void sim_init(struct sim *s, uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	s->now = 1000000;
	/* RD_TEST_SEED varies every channel, to hunt for rare interleavings */
	const char *env = getenv("RD_TEST_SEED");
	if (env)
		seed = seed * 0x9e3779b97f4a7c15ull ^ strtoull(env, NULL, 0);
	s->rng = seed | 1;
	s->lat_min = 50;
	s->drop_from = -1;
}

static void sim_fini(struct sim *s)
{
	for (int i = 0; i < s->nnodes; i++) {
		if (s->nodes[i]) {
			rd_destroy(s->nodes[i]->ep);
			free(s->nodes[i]);
		}
	}
	while (s->n)
		free(heap_pop(s).data);
	free(s->heap);
}

static void node_start(struct node *n)
{
	cr_assert_eq(rd_create(&n->cfg, &test_ops, n, &n->ep), 0);
	rd_test_set_clock(n->ep, sim_clock, n->sim);
}

static struct node *node_add(struct sim *s, const struct rd_cfg *cfg, bool v6)
{
	struct node *n = calloc(1, sizeof(*n));
	cr_assert_not_null(n);
	n->sim = s;
	n->id = s->nnodes;
	s->nodes[s->nnodes++] = n;
	n->cfg = *cfg;
	for (int i = 0; i < MAXN; i++)
		n->last_acked[i] = n->last_failed[i] = -1;
	if (v6) {
		n->addr.sin6.sin6_family = AF_INET6;
		n->addr.sin6.sin6_port = htons((uint16_t)(20000 + n->id));
		n->addr.sin6.sin6_addr.s6_addr[15] = 1;
		n->addr.sin6.sin6_flowinfo = htonl(0x1234); /* must not matter */
		n->alen = sizeof(struct sockaddr_in6);
	} else {
		n->addr.sin.sin_family = AF_INET;
		n->addr.sin.sin_port = htons((uint16_t)(20000 + n->id));
		n->addr.sin.sin_addr.s_addr = htonl(0x7f000001);
		n->alen = sizeof(struct sockaddr_in);
	}
	node_start(n);
	return n;
}

/* The node's process restarts: new rd_ep at the same address, every piece of state lost. */
static void node_restart(struct node *n)
{
	rd_destroy(n->ep);
	n->ep = NULL;
	n->gen++;
	memset(n->rcv, 0, sizeof(n->rcv));
	n->ndeliver = 0;
	memset(n->next_idx, 0, sizeof(n->next_idx));
	for (int i = 0; i < MAXN; i++)
		n->last_acked[i] = n->last_failed[i] = -1;
	n->any_first = true;
	node_start(n);
}

/* One step: deliver what is due, run every timer, advance the clock to the next event.
 * Returns false when nothing at all is pending. */
static bool sim_step(struct sim *s)
{
	bool held = s->hold || (s->stall_every && s->now % s->stall_every < s->stall_len);
	while (!held && s->n && s->heap[0].at <= s->now) {
		struct pkt p = heap_pop(s);
		struct node *dst = s->nodes[p.dst];
		if (dst->ep) {
			cr_assert(dg_crc_check(p.data, p.len));
			int rc = rd_input(dst->ep, &s->nodes[p.src]->addr, s->nodes[p.src]->alen, p.data,
					  p.len - DG_CRC_LEN);
			cr_assert_eq(rc, 0, "rd_input of a well-formed datagram: %d", rc);
		}
		free(p.data);
	}
	uint64_t next = UINT64_MAX;
	if (!held && s->n)
		next = s->heap[0].at;
	else if (!s->hold && s->n)
		next = s->now - s->now % s->stall_every + s->stall_len; /* the stall's end */
	for (int i = 0; i < s->nnodes; i++) {
		if (!s->nodes[i]->ep)
			continue;
		uint64_t t = rd_tick(s->nodes[i]->ep, s->now);
		if (t != UINT64_MAX && s->now + t < next)
			next = s->now + t;
	}
	if (next == UINT64_MAX)
		return false;
	s->now = next > s->now ? next : s->now + 1;
	return true;
}

static void advance(struct sim *s, uint64_t us)
{
	s->now += us;
	sim_step(s);
}

/* Runs the simulation until nothing is pending (bounded). */
static void sim_settle(struct sim *s)
{
	for (int k = 0; k < 1000000 && sim_step(s); k++)
		;
	cr_assert_eq(s->n, 0);
	for (int i = 0; i < s->nnodes; i++)
		if (s->nodes[i]->ep)
			cr_assert(!rd_busy(s->nodes[i]->ep), "node %d still busy", i);
}

static void build_msg(const struct node *a, uint32_t idx, size_t len, uint8_t *buf)
{
	struct msg_hdr m = { MSG_MAGIC, (uint32_t)a->id, a->gen, idx, (uint32_t)len };
	memcpy(buf, &m, sizeof(m));
	for (size_t k = sizeof(m); k < len; k++)
		buf[k] = (uint8_t)(idx * 131 + k * 7 + a->id * 29 + a->gen);
}

/* Sends a's next message to b, split over two iovecs. Returns rd_send's result. */
static int send_msg(struct node *a, struct node *b, size_t len, bool with_cookie)
{
	static uint8_t buf[DG_MAX_DATAGRAM];
	uint32_t idx = a->next_idx[b->id];
	build_msg(a, idx, len, buf);
	struct iovec iov[2] = { { buf, 7 }, { buf + 7, len - 7 } };
	uint64_t cookie = with_cookie ? ((uint64_t)(b->id + 1) << 32 | (idx + 1)) : 0;
	int rc = rd_send(a->ep, &b->addr, b->alen, iov, 2, cookie);
	if (rc == 0)
		a->next_idx[b->id]++;
	return rc;
}

struct flow {
	struct node *a, *b;
	uint32_t total, sent;
	uint64_t rcvd0, acked0, failed0;
};

static size_t rand_len(struct sim *s, const struct node *a)
{
	return sizeof(struct msg_hdr) + xrand(&s->rng) % (a->cfg.max_dgram - sizeof(struct msg_hdr) + 1);
}

/* Pushes each flow's messages through as fast as the windows allow, then settles; checks that
 * each arrived exactly once, in order, and was acked. Returns the steps it took. */
static uint64_t run_flows(struct sim *s, struct flow *f, int nf, uint64_t max_steps)
{
	uint64_t steps = 0;
	for (int i = 0; i < nf; i++) {
		f[i].rcvd0 = f[i].b->rcv[f[i].a->id].count;
		f[i].acked0 = f[i].a->nacked[f[i].b->id];
		f[i].failed0 = f[i].a->nfailed[f[i].b->id];
		f[i].sent = 0;
	}
	for (;;) {
		bool done = true;
		for (int i = 0; i < nf; i++) {
			while (f[i].sent < f[i].total) {
				int rc = send_msg(f[i].a, f[i].b, rand_len(s, f[i].a), true);
				if (rc == -EAGAIN) {
					cr_assert(!rd_can_send(f[i].a->ep, &f[i].b->addr, f[i].b->alen));
					break;
				}
				cr_assert_eq(rc, 0, "rd_send: %d", rc);
				f[i].sent++;
			}
			if (f[i].sent < f[i].total ||
			    f[i].a->nacked[f[i].b->id] - f[i].acked0 < f[i].total)
				done = false;
		}
		if (done)
			break;
		sim_step(s);
		cr_assert_lt(++steps, max_steps, "no progress after %lu steps", (unsigned long)steps);
	}
	sim_settle(s);
	for (int i = 0; i < nf; i++) {
		cr_assert_eq(f[i].b->rcv[f[i].a->id].count - f[i].rcvd0, f[i].total);
		cr_assert_eq(f[i].a->nacked[f[i].b->id] - f[i].acked0, f[i].total);
		cr_assert_eq(f[i].a->nfailed[f[i].b->id], f[i].failed0);
	}
	return steps;
}

static struct rd_cfg base_cfg(void)
{
	struct rd_cfg c = { .max_dgram = 1024 };
	return c;
}

static struct rd_stats stats(struct node *n)
{
	struct rd_stats st;
	rd_get_stats(n->ep, &st);
	return st;
}

/* ------------------------------------------------------------------ tests */

Test(rd, lossless_in_order)
{
	struct sim s;
	sim_init(&s, 1);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 2000 };
	run_flows(&s, &f, 1, 100000);

	struct rd_stats sa = stats(a), sb = stats(b);
	cr_assert_eq(sa.data_sent, 2000);
	cr_assert_eq(sa.retransmits, 0);
	cr_assert_eq(sa.probes, 0, "a probe on a path that lost nothing, its acks in time");
	cr_assert_eq(sb.dup_drops, 0);
	cr_assert_eq(sb.ooo_buffered, 0);
	cr_assert_eq(sb.malformed, 0);
	cr_assert_eq(sa.peers, 1);
	cr_assert_eq(sb.peers, 1);
	/* one ack per two datagrams at most, plus delayed acks at the end of bursts */
	cr_assert_leq(sb.acks_sent, 1000 + 100);
	cr_assert_eq(b->ndeliver, 2000);
	cr_assert_eq(rd_tick(a->ep, s.now), UINT64_MAX);
	cr_assert_eq(rd_tick(b->ep, s.now), UINT64_MAX);
	sim_fini(&s);
}

Test(rd, ipv6_peers)
{
	struct sim s;
	sim_init(&s, 2);
	s.loss_pm = 20;
	s.lat_jit = 100;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, true), *b = node_add(&s, &c, true);
	struct flow f[2] = { { .a = a, .b = b, .total = 1000 }, { .a = b, .b = a, .total = 1000 } };
	run_flows(&s, f, 2, 1000000);
	sim_fini(&s);
}

Test(rd, delayed_ack_policy)
{
	struct sim s;
	sim_init(&s, 3);
	struct rd_cfg c = base_cfg();
	c.ack_delay_us = 700;
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);

	cr_assert_eq(send_msg(a, b, 100, true), 0);
	cr_assert(rd_busy(a->ep));
	uint64_t t0 = s.now;
	while (b->ndeliver == 0)
		cr_assert(sim_step(&s));
	cr_assert_eq(stats(b).acks_sent, 0, "a lone datagram is acked after the delay");
	cr_assert(rd_busy(b->ep));
	while (stats(b).acks_sent == 0)
		cr_assert(sim_step(&s));
	cr_assert_geq(s.now - t0, 700 + s.lat_min);
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], 1);

	/* two in-order datagrams: acked at once */
	cr_assert_eq(send_msg(a, b, 100, true), 0);
	cr_assert_eq(send_msg(a, b, 100, true), 0);
	while (b->ndeliver < 3)
		cr_assert(sim_step(&s));
	cr_assert_eq(stats(b).acks_sent, 2);
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], 3);
	cr_assert_eq(stats(a).retransmits, 0);
	sim_fini(&s);
}

Test(rd, lossy_reorder_dup_20000, .timeout = 240)
{
	struct sim s;
	sim_init(&s, 0x5eed);
	s.loss_pm = 50;
	s.dup_pm = 20;
	s.lat_jit = 300;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 20000 };
	run_flows(&s, &f, 1, 5000000);

	struct rd_stats sa = stats(a), sb = stats(b);
	cr_assert_eq(sa.data_sent, 20000);
	cr_assert_gt(sa.retransmits, 500);
	cr_assert_lt(sa.retransmits, 20000 / 5, "too many retransmissions: %lu",
		     (unsigned long)sa.retransmits);
	cr_assert_gt(sb.dup_drops, 0);
	cr_assert_gt(sb.ooo_buffered, 0);
	cr_assert_eq(sa.peer_failures, 0);
	cr_assert_eq(sa.resets_rcvd + sb.resets_sent, 0);
	cr_assert_eq(b->rcv[a->id].count, 20000);
	cr_assert_eq(b->ndeliver, 20000);
	cr_assert_eq(a->nacked[b->id], 20000);
	cr_assert_eq(a->last_acked[b->id], 19999);
	sim_fini(&s);
}

Test(rd, acked_cookies_in_order_zero_cookies_silent)
{
	struct sim s;
	sim_init(&s, 4);
	s.loss_pm = 30;
	s.lat_jit = 200;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	uint32_t sent = 0, with = 0;
	for (int k = 0; k < 200000 && sent < 3000; k++) {
		bool ck = sent % 3 != 0;
		int rc = send_msg(a, b, rand_len(&s, a), ck);
		if (rc == 0) {
			sent++;
			with += ck;
		} else {
			cr_assert_eq(rc, -EAGAIN);
			sim_step(&s);
		}
	}
	cr_assert_eq(sent, 3000);
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], with); /* cb_acked asserts order and non-zero cookies */
	cr_assert_eq(b->rcv[a->id].count, 3000);
	sim_fini(&s);
}

Test(rd, window_limit_eagain_and_resume)
{
	struct sim s;
	sim_init(&s, 5);
	struct rd_cfg c = base_cfg();
	c.max_wnd = 8;
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);

	s.hold = true;
	for (int k = 0; k < 8; k++)
		cr_assert_eq(send_msg(a, b, 64, true), 0);
	cr_assert(!rd_can_send(a->ep, &b->addr, b->alen));
	cr_assert_eq(send_msg(a, b, 64, true), -EAGAIN);
	cr_assert_eq(stats(a).window_stalls, 1);
	cr_assert_eq(stats(a).data_sent, 8);

	s.hold = false;
	for (int k = 0; k < 1000 && !rd_can_send(a->ep, &b->addr, b->alen); k++)
		sim_step(&s);
	cr_assert(rd_can_send(a->ep, &b->addr, b->alen));
	cr_assert_eq(send_msg(a, b, 64, true), 0);
	sim_settle(&s);
	struct flow f = { .a = a, .b = b, .total = 500 };
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(b->rcv[a->id].count, 509);
	cr_assert_eq(stats(a).retransmits, 0);
	sim_fini(&s);
}

Test(rd, initial_window_and_shared_pool)
{
	struct sim s;
	sim_init(&s, 6);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct rd_cfg small = base_cfg();
	small.tx_slots = 40;
	struct node *p = node_add(&s, &small, false), *q = node_add(&s, &c, false);

	/* before the first ack of an epoch at most 32 datagrams are in flight */
	s.hold = true;
	int n = 0;
	while (send_msg(a, b, 64, true) == 0)
		n++;
	cr_assert_eq(n, 32);
	s.hold = false;
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], 32);
	/* acked: now the advertised window rules */
	s.hold = true;
	n = 0;
	while (send_msg(a, b, 64, true) == 0)
		n++;
	cr_assert_eq(n, 256);
	s.hold = false;
	sim_settle(&s);

	/* the retransmission buffers are shared by all peers */
	s.hold = true;
	for (int k = 0; k < 32; k++)
		cr_assert_eq(send_msg(p, q, 64, true), 0);
	for (int k = 0; k < 8; k++)
		cr_assert_eq(send_msg(p, a, 64, true), 0);
	cr_assert_eq(send_msg(p, b, 64, true), -EAGAIN);
	cr_assert(!rd_can_send(p->ep, &b->addr, b->alen));
	s.hold = false;
	sim_settle(&s);
	cr_assert(rd_can_send(p->ep, &b->addr, b->alen));
	cr_assert_eq(send_msg(p, b, 64, true), 0);
	sim_settle(&s);
	cr_assert_eq(p->nacked[q->id] + p->nacked[a->id] + p->nacked[b->id], 41);
	sim_fini(&s);
}

static void resend_on_failure(struct node *n, uint64_t cookie, int err)
{
	struct node *b = n->ctx;
	(void)cookie;
	(void)err;
	/* re-entrant: rd_send from failed(), while rd_tick is reporting */
	if (n->nfailed[b->id] == 1)
		cr_assert_eq(send_msg(n, b, 200, true), 0);
}

Test(rd, silent_peer_times_out, .timeout = 120)
{
	struct sim s;
	sim_init(&s, 7);
	struct rd_cfg c = base_cfg(); /* max_retries 12, rto 2 ms .. 500 ms */
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	a->ctx = b;
	a->on_failed = resend_on_failure;
	b->any_first = true; /* the first message b sees is the one resent after the failure */

	s.drop_from = a->id;
	uint64_t t0 = s.now;
	for (int k = 0; k < 12; k++)
		cr_assert_eq(send_msg(a, b, 100, k % 6 != 5), 0); /* 10 cookies, 2 zero */
	for (int k = 0; k < 100000 && a->nfailed[b->id] < 10; k++)
		cr_assert(sim_step(&s));
	cr_assert_eq(a->nfailed[b->id], 10);
	cr_assert_eq(a->last_err, -ETIMEDOUT);
	cr_assert_eq(a->nacked[b->id], 0);
	cr_assert_eq(stats(a).peer_failures, 1);
	/* the first datagram went out exactly 1 + max_retries times before the peer failed */
	cr_assert_eq(a->first_seq_xmits_at_fail, 13);
	/* and the failure came after every backoff: 2+4+...+256 ms, then 5 x 500 ms */
	uint64_t budget = 2000ull * 255 + 500000ull * 5;
	cr_assert_geq(a->failed_at_us - t0, budget);
	cr_assert_lt(a->failed_at_us - t0, budget + 10000);
	cr_assert_eq(b->ndeliver, 0);
	/* only the oldest is retransmitted on a timeout: the rest waits for the acks it brings */
	cr_assert_eq(stats(a).retransmits, 12u);

	/* the datagram sent from failed() belongs to a new epoch, which works once the path does */
	s.drop_from = -1;
	sim_settle(&s);
	cr_assert_eq(b->rcv[a->id].count, 1);
	cr_assert_eq(a->nacked[b->id], 1);
	cr_assert_eq(a->epoch_changes, 2);
	sim_fini(&s);
}

/* The caller knows the peer is gone (the shim: its registry name vanished): what is in flight
 * fails at once with -ECONNRESET, not after the retries' 3.0 s; a peer with nothing in flight,
 * or unknown, is left alone. */
Test(rd, peer_gone_fails_in_flight_at_once)
{
	struct sim s;
	sim_init(&s, 11);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false), *x = node_add(&s, &c, false);
	s.drop_from = a->id;
	for (int k = 0; k < 8; k++)
		cr_assert_eq(send_msg(a, b, 100, true), 0);
	for (int k = 0; k < 3; k++)
		cr_assert(sim_step(&s));
	cr_assert_eq(a->nfailed[b->id], 0);
	uint64_t t0 = s.now;
	cr_assert_eq(rd_peer_gone(a->ep, &x->addr, x->alen), 0, "nothing in flight to x: untouched");
	cr_assert_eq(rd_peer_gone(a->ep, &b->addr, b->alen), 1);
	cr_assert_eq(a->nfailed[b->id], 8, "every datagram in flight failed: %lu", (unsigned long)a->nfailed[b->id]);
	cr_assert_eq(a->last_err, -ECONNRESET);
	cr_assert_eq(s.now, t0, "at once, not on a timer");
	cr_assert_eq(stats(a).peer_failures, 1);
	cr_assert_eq(rd_peer_gone(a->ep, &b->addr, b->alen), 0, "nothing left in flight");
	cr_assert_eq(rd_peer_gone(a->ep, &b->addr, 3), -EINVAL);
	/* the path works again: a new epoch to b delivers */
	s.drop_from = -1;
	b->any_first = true;
	cr_assert_eq(send_msg(a, b, 100, true), 0);
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], 1);
	sim_fini(&s);
}

Test(rd, sender_restart_new_epoch)
{
	struct sim s;
	sim_init(&s, 8);
	s.loss_pm = 30;
	s.lat_jit = 200;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 300 };
	run_flows(&s, &f, 1, 1000000);

	/* b also sends to a, so a's restart leaves b with an epoch a no longer knows */
	struct flow g = { .a = b, .b = a, .total = 100 };
	run_flows(&s, &g, 1, 1000000);

	node_restart(a); /* gen 1, message indices from 0 again: cb_deliver checks */
	run_flows(&s, &f, 1, 1000000);
	cr_assert_eq(b->rcv[a->id].count, 600);
	cr_assert_eq(b->rcv[a->id].gen, 1);
	cr_assert_eq(stats(b).resets_sent, 0);

	/* b's old epoch is unknown to the new a (seq >= 32), but the new a's datagrams acked
	 * nothing of it: b, with nothing in flight, started a new epoch, which a adopts at once
	 * (before, an RST and a failed datagram; receiver_restart_rst still needs one) */
	cr_assert_eq(send_msg(b, a, 100, true), 0);
	sim_settle(&s);
	cr_assert_eq(b->nfailed[a->id], 0);
	cr_assert_eq(a->rcv[b->id].count, 1);
	cr_assert_eq(stats(a).resets_sent, 0);
	cr_assert_eq(stats(b).resets_rcvd, 0);
	struct flow h = { .a = b, .b = a, .total = 100 };
	run_flows(&s, &h, 1, 1000000);
	sim_fini(&s);
}

Test(rd, receiver_restart_rst)
{
	struct sim s;
	sim_init(&s, 9);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 100 };
	run_flows(&s, &f, 1, 100000);

	node_restart(b);
	for (int k = 0; k < 5; k++)
		cr_assert_eq(send_msg(a, b, 100, true), 0);
	sim_settle(&s);
	cr_assert_eq(a->nfailed[b->id], 5);
	cr_assert_eq(a->last_err, -ECONNRESET);
	cr_assert_eq(stats(a).resets_rcvd, 1);
	cr_assert_geq(stats(b).resets_sent, 1);
	cr_assert_eq(b->ndeliver, 0);
	cr_assert_eq(stats(b).peers, 0, "an RST costs the receiver no state");

	/* a's next datagrams start a new epoch that the new b adopts */
	uint32_t first = a->next_idx[b->id];
	f.total = 50;
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(b->rcv[a->id].count, 50);
	cr_assert_eq(b->rcv[a->id].next, first + 50);
	sim_fini(&s);
}

Test(rd, receiver_restart_young_epoch)
{
	struct sim s;
	sim_init(&s, 10);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 10 };
	run_flows(&s, &f, 1, 100000);

	/* seqs 10..14 look like the start of an epoch to the new b, which waits for 0..9 that
	 * a will never resend: a must notice the acks stuck at the epoch's start */
	node_restart(b);
	for (int k = 0; k < 5; k++)
		cr_assert_eq(send_msg(a, b, 100, true), 0);
	for (int k = 0; k < 100000 && a->nfailed[b->id] < 5; k++)
		cr_assert(sim_step(&s));
	cr_assert_eq(a->nfailed[b->id], 5);
	cr_assert_eq(a->last_err, -ECONNRESET);
	cr_assert_eq(b->ndeliver, 0);

	uint32_t first = a->next_idx[b->id];
	f.total = 40;
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(b->rcv[a->id].count, 40);
	cr_assert_eq(b->rcv[a->id].next, first + 40);
	sim_fini(&s);
}

/* A client closes and a new socket gets its port (a server answering many short-lived clients:
 * fdcost's rdchurn). The new client speaks first, knowing nothing of the server's epoch: the
 * answer must start a new epoch at once, not be adopted mid-epoch and wait behind acks of what
 * came before (retries for seconds, then a reset and a plain resend). */
Test(rd, restarted_peer_speaking_first_gets_a_new_epoch)
{
	struct sim s;
	sim_init(&s, 11);
	struct rd_cfg c = base_cfg();
	struct node *srv = node_add(&s, &c, false), *cl = node_add(&s, &c, false);
	for (int round = 0; round < 3; round++) {
		if (round)
			node_restart(cl);
		cr_assert_eq(send_msg(cl, srv, 100, true), 0);
		for (int k = 0; k < 100000 && srv->rcv[cl->id].count < (uint32_t)round + 1; k++)
			cr_assert(sim_step(&s));
		cr_assert_eq(srv->rcv[cl->id].count, (uint32_t)round + 1);
		uint64_t t0 = s.now;
		cr_assert_eq(send_msg(srv, cl, 100, true), 0);
		for (int k = 0; k < 100000 && cl->rcv[srv->id].count < 1; k++)
			cr_assert(sim_step(&s));
		cr_assert_eq(cl->rcv[srv->id].count, 1, "round %d: the answer did not arrive", round);
		cr_assert_lt(s.now - t0, 2000, "round %d: the answer took %llu us", round,
			     (unsigned long long)(s.now - t0));
		sim_settle(&s);
	}
	cr_assert_eq(srv->nfailed[cl->id], 0);
	cr_assert_eq(stats(srv).retransmits, 0);
	cr_assert_eq(stats(srv).peer_failures, 0);
	sim_fini(&s);
}

Test(rd, two_senders_one_receiver, .timeout = 120)
{
	struct sim s;
	sim_init(&s, 11);
	s.loss_pm = 50;
	s.dup_pm = 10;
	s.lat_jit = 300;
	struct rd_cfg c = base_cfg();
	struct rd_cfg rc = base_cfg();
	rc.rx_slots = 64; /* the two senders compete for the receiver's out-of-order buffers */
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &rc, false);
	struct node *d = node_add(&s, &c, true);
	struct flow f[2] = { { .a = a, .b = b, .total = 5000 }, { .a = d, .b = b, .total = 5000 } };
	run_flows(&s, f, 2, 5000000);
	cr_assert_eq(stats(b).peers, 2);
	cr_assert_eq(b->ndeliver, 10000);
	sim_fini(&s);
}

Test(rd, sequence_wraparound)
{
	struct sim s;
	sim_init(&s, 12);
	s.loss_pm = 50;
	s.dup_pm = 20;
	s.lat_jit = 300;
	rd_test_set_isn(0xffffff00u);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	a->isn = b->isn = 0xffffff00u;
	struct flow f[2] = { { .a = a, .b = b, .total = 3000 }, { .a = b, .b = a, .total = 3000 } };
	run_flows(&s, f, 2, 5000000);
	cr_assert(a->saw_seq_hi && a->saw_seq_lo, "the sequence numbers did not wrap");
	cr_assert_gt(stats(a).retransmits, 0);
	cr_assert_eq(stats(a).peer_failures + stats(b).peer_failures, 0);
	rd_test_set_isn(0);
	sim_fini(&s);
}

Test(rd, heavy_loss)
{
	struct sim s;
	sim_init(&s, 18);
	s.loss_pm = 200;
	s.dup_pm = 50;
	s.lat_jit = 500;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f[2] = { { .a = a, .b = b, .total = 3000 }, { .a = b, .b = a, .total = 3000 } };
	run_flows(&s, f, 2, 5000000);
	cr_assert_eq(stats(a).peer_failures + stats(b).peer_failures, 0);
	sim_fini(&s);
}

/* The path drops everything for 150 ms in the middle of a transfer with a full window: the
 * backoff rides it out within the retry budget, and the window beyond the SACK's reach is
 * recovered without waiting one RTO per datagram. */
Test(rd, outage_recovery)
{
	struct sim s;
	sim_init(&s, 19);
	s.loss_pm = 10;
	s.lat_jit = 100;
	s.outage_from = s.now + 20000;
	s.outage_to = s.outage_from + 150000;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 20000 };
	run_flows(&s, &f, 1, 5000000);
	cr_assert_eq(stats(a).peer_failures, 0);
	cr_assert_lt(s.now, s.outage_to + 1000000, "recovery took %lu us",
		     (unsigned long)(s.now - s.outage_to));
	sim_fini(&s);
}

static uint8_t *mk(uint8_t *buf, uint8_t magic, uint8_t flags)
{
	struct dg_rd_hdr h = { .magic = magic, .flags = flags, .wnd = htobe16(4) };
	memcpy(buf, &h, sizeof(h));
	return buf;
}

Test(rd, malformed_rejected)
{
	struct sim s;
	sim_init(&s, 13);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	uint8_t buf[64] = { 0 };
	struct { uint8_t magic, flags; size_t len; } bad[] = {
		{ RD_MAGIC, RD_FLAG_DATA, 0 },
		{ RD_MAGIC, RD_FLAG_ACK, DG_RD_HLEN - 1 },
		{ 0xd3, RD_FLAG_ACK, DG_RD_HLEN },
		{ 0x00, RD_FLAG_DATA, DG_RD_HLEN + 20 },
		{ RD_MAGIC, 0, DG_RD_HLEN },
		{ RD_MAGIC, 0x08, DG_RD_HLEN },
		{ RD_MAGIC, RD_FLAG_ACK | 0x80, DG_RD_HLEN },
		{ RD_MAGIC, RD_FLAG_DATA, DG_RD_HLEN },
		{ RD_MAGIC, RD_FLAG_DATA | RD_FLAG_ACK, DG_RD_HLEN },
		{ RD_MAGIC, RD_FLAG_ACK, DG_RD_HLEN + 1 },
		{ RD_MAGIC, RD_FLAG_RST, DG_RD_HLEN + 10 },
		{ RD_MAGIC, RD_FLAG_PROBE | RD_FLAG_DATA, DG_RD_HLEN + 10 },
		{ RD_MAGIC, RD_FLAG_PROBE, DG_RD_HLEN + 10 },
		{ RD_MAGIC, RD_FLAG_ANSWER, DG_RD_HLEN },
		{ RD_MAGIC, RD_FLAG_PROBE | RD_FLAG_ANSWER | RD_FLAG_ACK, DG_RD_HLEN },
	};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
		cr_assert_eq(rd_input(b->ep, &a->addr, a->alen, mk(buf, bad[k].magic, bad[k].flags),
				      bad[k].len),
			     -EPROTO, "case %zu", k);
	cr_assert_eq(stats(b).malformed, sizeof(bad) / sizeof(bad[0]));
	cr_assert_eq(stats(b).peers, 0);

	/* well-formed but about nothing we know: accepted and ignored */
	cr_assert_eq(rd_input(b->ep, &a->addr, a->alen, mk(buf, RD_MAGIC, RD_FLAG_ACK), DG_RD_HLEN), 0);
	cr_assert_eq(rd_input(b->ep, &a->addr, a->alen, mk(buf, RD_MAGIC, RD_FLAG_RST), DG_RD_HLEN), 0);
	cr_assert_eq(rd_input(b->ep, &a->addr, a->alen, mk(buf, RD_MAGIC, RD_FLAG_PROBE), DG_RD_HLEN), 0);
	cr_assert_eq(rd_input(b->ep, &a->addr, a->alen, mk(buf, RD_MAGIC, RD_FLAG_ACK | RD_FLAG_ANSWER), DG_RD_HLEN), 0);
	cr_assert_eq(stats(b).malformed, sizeof(bad) / sizeof(bad[0]));
	cr_assert_eq(b->xmits, 0);

	/* a bad source address is the caller's error */
	union dgv_sockaddr unix_addr = { .sa.sa_family = AF_UNIX };
	cr_assert_eq(rd_input(b->ep, &unix_addr, sizeof(unix_addr), mk(buf, RD_MAGIC, RD_FLAG_ACK), DG_RD_HLEN),
		     -EINVAL);
	cr_assert_eq(rd_input(b->ep, &a->addr, 4, mk(buf, RD_MAGIC, RD_FLAG_ACK), DG_RD_HLEN), -EINVAL);

	/* rd_send's own checks */
	static uint8_t big[2048];
	struct iovec iov = { big, 1025 };
	cr_assert_eq(rd_send(a->ep, &b->addr, b->alen, &iov, 1, 1), -EMSGSIZE);
	iov.iov_len = 0;
	cr_assert_eq(rd_send(a->ep, &b->addr, b->alen, &iov, 1, 1), -EINVAL);
	cr_assert_eq(rd_send(a->ep, &b->addr, b->alen, NULL, 0, 1), -EINVAL);
	iov.iov_len = 1024;
	cr_assert_eq(rd_send(a->ep, &unix_addr, sizeof(unix_addr), &iov, 1, 1), -EINVAL);
	b->lenient = true;
	cr_assert_eq(rd_send(a->ep, &b->addr, b->alen, &iov, 1, 0), 0);
	sim_settle(&s);
	cr_assert_eq(b->ndeliver, 1);

	/* configuration checks */
	struct rd_ep *ep;
	struct rd_cfg bc = { 0 };
	cr_assert_eq(rd_create(&bc, &test_ops, NULL, &ep), -EINVAL);
	bc.max_dgram = DG_MAX_DATAGRAM;
	cr_assert_eq(rd_create(&bc, &test_ops, NULL, &ep), -EINVAL);
	struct rd_ops no_xmit = { .deliver = cb_deliver };
	cr_assert_eq(rd_create(&c, &no_xmit, NULL, &ep), -EINVAL);
	sim_fini(&s);
}

/* Random bytes, and random headers that parse, from a few known and many unknown addresses;
 * rd_input must return 0 or -EPROTO and the endpoint must still work afterwards. */
Test(rd, fuzz_random_input, .timeout = 240)
{
	struct sim s;
	sim_init(&s, 14);
	struct rd_cfg c = base_cfg();
	c.max_peers = 64;
	c.rx_slots = 32;
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct node *v6 = node_add(&s, &c, true);
	struct flow f[3] = { { .a = a, .b = b, .total = 100 }, { .a = b, .b = a, .total = 100 },
			     { .a = v6, .b = b, .total = 100 } };
	run_flows(&s, f, 3, 100000);
	a->lenient = b->lenient = v6->lenient = true;

	uint32_t epochs[4] = { a->cur_epoch, b->cur_epoch, v6->cur_epoch, 0 };
	static uint8_t buf[1200];
	uint64_t rng = 0xf00d;
	unsigned eproto = 0;
	for (int k = 0; k < 100000; k++) {
		size_t len = xrand(&rng) % 8 ? xrand(&rng) % 64 : xrand(&rng) % sizeof(buf);
		for (size_t i = 0; i < len; i += 8) {
			uint64_t r = xrand(&rng);
			memcpy(buf + i, &r, len - i < 8 ? len - i : 8);
		}
		uint64_t r = xrand(&rng);
		if (len >= DG_RD_HLEN && r % 4 != 0) {
			struct dg_rd_hdr h;
			memcpy(&h, buf, sizeof(h));
			h.magic = RD_MAGIC;
			static const uint8_t fl[] = { RD_FLAG_DATA, RD_FLAG_ACK, RD_FLAG_DATA | RD_FLAG_ACK,
						      RD_FLAG_RST, RD_FLAG_RST | RD_FLAG_ACK, 0x7 };
			if (r % 3)
				h.flags = fl[(r >> 8) % sizeof(fl)];
			if ((r >> 16) % 2)
				h.epoch = htobe32(epochs[(r >> 20) % 4]);
			if ((r >> 24) % 2)
				h.ack_epoch = htobe32(epochs[(r >> 28) % 4]);
			if ((r >> 32) % 2)
				h.seq = htobe32((uint32_t)((r >> 36) % 300));
			if ((r >> 40) % 2)
				h.ack = htobe32((uint32_t)((r >> 44) % 300));
			if ((r >> 50) % 4 == 0)
				len = DG_RD_HLEN;
			memcpy(buf, &h, sizeof(h));
		}
		union dgv_sockaddr from;
		socklen_t flen;
		struct node *victim = (r >> 56) % 2 ? a : b;
		switch ((r >> 58) % 4) {
		case 0:
			from = a->addr;
			flen = a->alen;
			break;
		case 1:
			from = v6->addr;
			flen = v6->alen;
			break;
		case 2:
			from = b->addr;
			flen = b->alen;
			break;
		default:
			memset(&from, 0, sizeof(from));
			from.sin.sin_family = AF_INET;
			from.sin.sin_port = htons((uint16_t)(30000 + (r >> 8) % 200));
			from.sin.sin_addr.s_addr = htonl(0x0a000001);
			flen = sizeof(from.sin);
			break;
		}
		int rc = rd_input(victim->ep, &from, flen, buf, len);
		cr_assert(rc == 0 || rc == -EPROTO, "rd_input returned %d", rc);
		eproto += rc == -EPROTO;
		if (k % 64 == 0)
			sim_step(&s);
	}
	cr_assert_gt(eproto, 1000);
	cr_assert_eq(stats(a).malformed + stats(b).malformed, eproto);
	cr_assert_leq(stats(b).peers, 64);

	/* let the dust settle (timers of whatever the fuzzer made up), then new traffic works */
	for (int k = 0; k < 200000 && sim_step(&s); k++)
		;
	a->lenient = b->lenient = v6->lenient = false;
	memset(b->rcv, 0, sizeof(b->rcv));
	b->any_first = true;
	struct node *d = node_add(&s, &c, false);
	struct flow g = { .a = d, .b = b, .total = 300 };
	advance(&s, 61000000); /* idle fuzz peers become reapable */
	run_flows(&s, &g, 1, 1000000);
	sim_fini(&s);
}

/* Re-entrancy: b answers every message from inside deliver(); a sends its next message from
 * inside acked(). */
struct echo_ctx {
	uint32_t total, backlog;
};

static void echo_deliver(struct node *n, int src, const uint8_t *seg, size_t len)
{
	struct echo_ctx *e = n->ctx;
	struct node *to = n->sim->nodes[src];
	(void)seg;
	if (n->id == 0)
		return; /* a: just checks order */
	if (e->backlog || send_msg(n, to, len, true) == -EAGAIN)
		e->backlog++;
}

static void echo_acked(struct node *n, uint64_t cookie)
{
	struct echo_ctx *e = n->ctx;
	struct node *b = n->sim->nodes[1];
	(void)cookie;
	if (n->id == 0 && n->next_idx[1] < e->total)
		send_msg(n, b, rand_len(n->sim, n), true); /* may be -EAGAIN: the loop retries */
}

Test(rd, reentrant_callbacks)
{
	struct sim s;
	sim_init(&s, 15);
	s.loss_pm = 50;
	s.lat_jit = 200;
	struct rd_cfg c = base_cfg();
	c.max_wnd = 16;
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct echo_ctx ea = { .total = 3000 }, eb = { 0 };
	a->ctx = &ea;
	b->ctx = &eb;
	a->on_deliver = b->on_deliver = echo_deliver;
	a->on_acked = echo_acked;

	for (int k = 0; k < 4; k++)
		cr_assert_eq(send_msg(a, b, 200, true), 0);
	for (int k = 0; k < 3000000 && (a->rcv[1].count < 3000); k++) {
		while (eb.backlog && send_msg(b, a, 100, true) == 0)
			eb.backlog--;
		if (a->next_idx[1] < ea.total && rd_can_send(a->ep, &b->addr, b->alen))
			cr_assert_eq(send_msg(a, b, rand_len(&s, a), true), 0);
		sim_step(&s);
	}
	sim_settle(&s);
	cr_assert_eq(b->rcv[0].count, 3000);
	cr_assert_eq(a->rcv[1].count, 3000);
	cr_assert_eq(a->nacked[1], 3000);
	cr_assert_eq(b->nacked[0], 3000);
	sim_fini(&s);
}

Test(rd, peer_table_limit_and_reaping)
{
	struct sim s;
	sim_init(&s, 16);
	struct rd_cfg c = base_cfg();
	struct rd_cfg two = base_cfg();
	two.max_peers = 2;
	struct node *a = node_add(&s, &two, false);
	struct node *b = node_add(&s, &c, false), *d = node_add(&s, &c, false), *e = node_add(&s, &c, false);

	cr_assert_eq(send_msg(a, b, 64, true), 0);
	cr_assert_eq(send_msg(a, d, 64, true), 0);
	cr_assert_eq(send_msg(a, e, 64, true), -ENOMEM);
	sim_settle(&s);
	cr_assert_eq(stats(a).peers, 2);
	advance(&s, 30000000);
	cr_assert_eq(send_msg(a, e, 64, true), -ENOMEM, "peers idle for 30 s are kept");
	s.now += 31000000; /* no rd_tick: rd_send itself reaps when the table is full */
	cr_assert_eq(send_msg(a, e, 64, true), 0, "a peer idle for 61 s is reaped");
	sim_settle(&s);
	cr_assert_eq(e->rcv[a->id].count, 1);
	cr_assert_eq(stats(a).peers, 1, "rd_tick reaped the other idle peer");

	/* periodic reaping from rd_tick */
	advance(&s, 62000000);
	cr_assert_eq(stats(a).peers, 0);
	cr_assert_eq(stats(e).peers, 0);
	cr_assert_eq(rd_tick(a->ep, s.now), UINT64_MAX);
	sim_fini(&s);
}

Test(rd, idle_epoch_renewal)
{
	struct sim s;
	sim_init(&s, 17);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 100 };
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(a->epoch_changes, 1);

	advance(&s, 10000000);
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(a->epoch_changes, 1, "10 s idle keeps the epoch");

	advance(&s, 35000000);
	uint32_t before = a->seq_xmits[0];
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(a->epoch_changes, 2, "35 s idle starts a new epoch");
	cr_assert_eq(a->seq_xmits[0], before + 1, "the new epoch starts at seq 0");

	/* past the receiver's reaping: still no reset, no failure */
	advance(&s, 70000000);
	cr_assert_eq(stats(b).peers, 0);
	run_flows(&s, &f, 1, 100000);
	cr_assert_eq(b->rcv[a->id].count, 400);
	cr_assert_eq(stats(b).resets_sent, 0);
	cr_assert_eq(stats(a).peer_failures, 0);
	sim_fini(&s);
}

/* Receiver not ready: deliver() refuses for far longer than the retry budget lasts. The sender
 * must hold back (flow control), keep probing, never fail the peer, and once the receiver
 * kicks, everything arrives once and in order. */
Test(rd, receiver_not_ready_flow_control, .timeout = 120)
{
	struct sim s;
	sim_init(&s, 31);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	b->rnr_budget = 1 << 30;
	/* queue more than a window's worth; rd_send says -EAGAIN once the receiver stalls */
	uint32_t queued = 0;
	for (int step = 0; step < 200000 && s.now < 1000000 + 10000000ull; step++) {
		while (queued < 500 && send_msg(a, b, 100, true) == 0)
			queued++;
		if (!sim_step(&s))
			break;
	}
	cr_assert_geq(s.now, 1000000 + 10000000ull, "ten seconds of a receiver that is not ready");
	cr_assert_eq(a->nfailed[b->id], 0, "a slow receiver is not a dead peer");
	cr_assert_eq(b->ndeliver, 0);
	cr_assert_gt(b->nrefused, 1);
	cr_assert_lt(queued, 500, "the sender was held back");
	/* the receiver posts buffers */
	b->rnr_budget = 0;
	rd_kick(b->ep);
	for (int step = 0; step < 2000000 && (queued < 500 || a->nacked[b->id] < 500); step++) {
		while (queued < 500 && send_msg(a, b, 100, true) == 0)
			queued++;
		if (!sim_step(&s))
			break;
	}
	cr_assert_eq(b->ndeliver, 500);
	cr_assert_eq(b->rcv[a->id].count, 500);
	cr_assert_eq(a->nacked[b->id], 500);
	cr_assert_eq(a->nfailed[b->id], 0);
	sim_fini(&s);
}

/* Loss on a path that never reorders (a loopback socket): every retransmission is of a datagram
 * the channel really dropped (or of one whose retransmission it dropped too), however full the
 * window: no timer fires for a datagram the SACKs already account for, no datagram is resent
 * while its first retransmission is on its way. */
static void loss_run(unsigned loss_pm, uint64_t seed)
{
	struct sim s;
	sim_init(&s, seed);
	s.loss_pm = loss_pm;
	s.lat_jit = 200;
	s.fifo = true;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 20000 };
	uint64_t t0 = s.now;
	run_flows(&s, &f, 1, 5000000);
	struct rd_stats sa = stats(a);
	/* ~75 ms at 1 %, ~300 ms at 5 %; a timeout taken for spurious while datagrams are being
	 * lost would raise the RTO floor towards rto_max and take seconds */
	cr_assert_lt(s.now - t0, 1000000, "20000 datagrams took %lu us (%lu timeouts, %lu spurious)",
		     (unsigned long)(s.now - t0), (unsigned long)sa.timeouts,
		     (unsigned long)sa.spurious_timeouts);
	cr_assert_eq(sa.data_sent, 20000);
	cr_assert_gt(s.data_lost, 0);
	cr_assert_geq(sa.retransmits, s.data_lost - sa.retransmits * loss_pm / 1000 - 5,
		      "%lu retransmissions for %lu datagrams lost", (unsigned long)sa.retransmits,
		      (unsigned long)s.data_lost);
	cr_assert_leq(sa.retransmits * 2, s.data_lost * 3, "%lu retransmissions for %lu datagrams lost",
		      (unsigned long)sa.retransmits, (unsigned long)s.data_lost);
	cr_assert_eq(sa.peer_failures, 0);
	sim_fini(&s);
}

Test(rd, loss_1pct_retransmits_only_lost) { loss_run(10, 31); }
Test(rd, loss_5pct_retransmits_only_lost) { loss_run(50, 32); }

/* A lossless path with a varying delay and a receiver that stops reading for 1.5 ms of every
 * 10 ms (descheduled), with a full window: not one retransmission. */
Test(rd, lossless_slow_receiver_no_retransmission)
{
	struct sim s;
	sim_init(&s, 33);
	s.lat_jit = 300;
	s.fifo = true;
	s.stall_every = 10000;
	s.stall_len = 1500;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 20000 };
	run_flows(&s, &f, 1, 5000000);
	struct rd_stats sa = stats(a), sb = stats(b);
	cr_assert_eq(sa.retransmits, 0, "%lu spurious retransmissions", (unsigned long)sa.retransmits);
	cr_assert_eq(sb.dup_drops, 0);
	cr_assert_eq(sb.ooo_buffered, 0);
	sim_fini(&s);
}

/* Stalls far longer than the timeout (6 ms of every 10 ms) with a full window: a timeout
 * retransmits the oldest datagram only (the timer backs off: at most 2 fit in a stall), never
 * the window behind it, which is on its way; the acks after it show the timeout spurious. */
Test(rd, long_receiver_stall_one_duplicate)
{
	struct sim s;
	sim_init(&s, 34);
	s.lat_jit = 100;
	s.fifo = true;
	s.stall_every = 10000;
	s.stall_len = 6000;
	s.now = 10000 * 200 + 6000; /* as a stall ends */
	uint64_t t0 = s.now;
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	struct flow f = { .a = a, .b = b, .total = 20000 };
	run_flows(&s, &f, 1, 5000000);
	uint64_t stalls = (s.now - t0) / 10000 + 1;
	struct rd_stats sa = stats(a), sb = stats(b);
	cr_assert_gt(stalls, 5);
	cr_assert_gt(sa.timeouts, 0);
	cr_assert_eq(sa.retransmits, sa.timeouts);
	cr_assert_leq(sa.retransmits, stalls * 2, "%lu retransmissions in %lu stalls",
		      (unsigned long)sa.retransmits, (unsigned long)stalls);
	cr_assert_eq(sb.dup_drops, sa.retransmits);
	/* and the timeouts found spurious raise the RTO above the stalls: the first stall costs
	 * its duplicates (the RTO floor of 2 ms and one backoff), the others none */
	cr_assert_geq(sa.spurious_timeouts, 1);
	cr_assert_leq(sa.retransmits, 3, "%lu retransmissions in %lu stalls", (unsigned long)sa.retransmits,
		      (unsigned long)stalls);
	sim_fini(&s);
}

/* ------------------------------------------------------------------ tail-loss probes */

/* Two nodes on a channel seeded with seed, a (node 0) having sent b (node 1) n datagrams, so
 * that a has measured the RTT (a probe needs one). */
static void warm_pair(struct sim *s, uint64_t seed, const struct rd_cfg *c, uint32_t n, struct node **a,
		      struct node **b)
{
	sim_init(s, seed);
	s->fifo = true;
	*a = node_add(s, c, false);
	*b = node_add(s, c, false);
	struct flow f = { .a = *a, .b = *b, .total = n };
	run_flows(s, &f, 1, 100000);
}

static bool drop_plain_acks_of_1(struct sim *s, const struct node *src, const struct dg_rd_hdr *h)
{
	(void)s;
	return src->id == 1 && !(h->flags & (RD_FLAG_DATA | RD_FLAG_ANSWER));
}

/* Every ack of a burst that ends the traffic is lost (nothing after it draws another): the
 * probe after two round trips brings the answer. The RTO (2 ms at least) would have sent
 * again data the receiver has, and a timeout taken for spurious raises the RTO floor. */
Test(rd, lost_acks_tail_probe)
{
	struct sim s;
	struct rd_cfg c = base_cfg();
	struct node *a, *b;
	warm_pair(&s, 35, &c, 100, &a, &b);
	struct rd_stats s0 = stats(a);
	s.drop = drop_plain_acks_of_1;
	uint64_t t0 = s.now, at = 0;
	for (int k = 0; k < 6; k++)
		cr_assert_eq(send_msg(a, b, 500, true), 0);
	while (a->nacked[b->id] < 106)
		at = s.now, sim_step(&s);
	struct rd_stats s1 = stats(a);
	cr_assert_lt(at - t0, 1000, "the burst was acked after %lu us", (unsigned long)(at - t0));
	cr_assert_eq(s1.retransmits, s0.retransmits, "data the receiver had went again");
	cr_assert_eq(s1.timeouts, s0.timeouts);
	cr_assert_eq(s1.probes, s0.probes + 1);
	s.drop = NULL;
	sim_settle(&s);
	cr_assert_eq(b->ndeliver, 106);
	sim_fini(&s);
}

/* A peer that went silent after an RTT was measured: a probe, at most two more each after twice
 * the wait of the one before, then only the retransmission timer, which fails the peer as it
 * always did (only the oldest datagram retransmitted, max_retries times). */
Test(rd, probes_back_off_to_a_silent_peer, .timeout = 120)
{
	struct sim s;
	struct rd_cfg c = base_cfg();
	struct node *a, *b;
	warm_pair(&s, 37, &c, 50, &a, &b);
	struct rd_stats s0 = stats(a);
	s.drop_from = b->id;
	uint64_t t0 = s.now;
	for (int k = 0; k < 4; k++)
		cr_assert_eq(send_msg(a, b, 100, true), 0);
	while (stats(a).timeouts == s0.timeouts)
		cr_assert(sim_step(&s));
	uint64_t np = stats(a).probes - s0.probes;
	cr_assert(np >= 1 && np <= 3, "%lu probes before the first timeout", (unsigned long)np);
	cr_assert_geq(s.now - t0, 2000, "the RTO came early");
	for (int k = 0; k < 100000 && !a->nfailed[b->id] && sim_step(&s); k++)
		;
	cr_assert_eq(a->nfailed[b->id], 4);
	cr_assert_eq(stats(a).probes, s0.probes + np, "probes after the timeouts began");
	cr_assert_eq(stats(a).retransmits, s0.retransmits + 12);
	sim_fini(&s);
}

static uint32_t drop_seq, drop_seq_left;
static bool drop_seq_of_0(struct sim *s, const struct node *src, const struct dg_rd_hdr *h)
{
	(void)s;
	if (src->id != 0 || !(h->flags & RD_FLAG_DATA) || be32toh(h->seq) != drop_seq || !drop_seq_left)
		return false;
	drop_seq_left--;
	return true;
}

/* A datagram and its fast retransmission are lost at the end of a burst that filled the
 * window: nothing new follows the retransmission for RACK to see past it. The probe sent
 * behind it does: the second retransmission goes a round trip later, not at a timer. */
Test(rd, lost_retransmission_probe)
{
	struct sim s;
	struct rd_cfg c = base_cfg();
	c.max_wnd = 16;
	struct node *a, *b;
	warm_pair(&s, 36, &c, 100, &a, &b);
	struct rd_stats s0 = stats(a);
	drop_seq = a->isn + 100 + 3;
	drop_seq_left = 2;
	s.drop = drop_seq_of_0;
	uint64_t t0 = s.now, at = 0;
	for (int k = 0; k < 16; k++)
		cr_assert_eq(send_msg(a, b, 500, true), 0);
	cr_assert_eq(send_msg(a, b, 500, true), -EAGAIN, "the window is full");
	while (a->nacked[b->id] < 116)
		at = s.now, sim_step(&s);
	struct rd_stats s1 = stats(a);
	cr_assert_eq(drop_seq_left, 0);
	cr_assert_eq(a->seq_xmits[103], 3);
	cr_assert_eq(s1.retransmits, s0.retransmits + 2);
	cr_assert_eq(s1.timeouts, s0.timeouts, "a timer found the lost retransmission");
	cr_assert_geq(s1.probes, s0.probes + 1);
	cr_assert_lt(at - t0, 1000, "recovered after %lu us", (unsigned long)(at - t0));
	s.drop = NULL;
	sim_settle(&s);
	cr_assert_eq(b->ndeliver, 116);
	sim_fini(&s);
}

/* ------------------------------------------------------------------ GSO trains, batched acks */

/* xmit_train for the tests: counts the trains and their shapes, checks that every datagram
 * but the last is seg bytes, then hands each datagram to the channel as xmit would; with
 * refuse set it answers -EOPNOTSUPP (a kernel without GSO) and sends nothing. */
static int train_calls, train_last_n, train_refuse;
static size_t train_last_seg, train_last_tail;
static int cb_train(void *arg, const struct iovec *iov, int n, uint16_t seg, const union dgv_sockaddr *to,
		    socklen_t tolen)
{
	train_calls++;
	if (train_refuse)
		return -EOPNOTSUPP;
	cr_assert_geq(n, 2, "a train of %d datagrams", n);
	for (int j = 0; j < n; j++) {
		if (j < n - 1)
			cr_assert_eq(iov[j].iov_len, seg, "datagram %d of %d: %zu bytes, not the train's %u", j, n,
				     iov[j].iov_len, seg);
		else
			cr_assert_leq(iov[j].iov_len, seg);
		cb_xmit(arg, &iov[j], 1, to, tolen);
	}
	train_last_n = n;
	train_last_seg = seg;
	train_last_tail = iov[n - 1].iov_len;
	return 0;
}

static const struct rd_ops train_ops = {
	.xmit = cb_xmit, .deliver = cb_deliver, .acked = cb_acked, .failed = cb_failed, .xmit_train = cb_train,
};

static struct node *node_add_trains(struct sim *s, const struct rd_cfg *cfg)
{
	struct node *n = node_add(s, cfg, false);
	rd_destroy(n->ep);
	cr_assert_eq(rd_create(&n->cfg, &train_ops, n, &n->ep), 0);
	rd_test_set_clock(n->ep, sim_clock, n->sim);
	return n;
}

Test(rd, cork_sends_gso_trains)
{
	struct sim s;
	sim_init(&s, 41);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add_trains(&s, &c), *b = node_add(&s, &c, false), *d = node_add(&s, &c, false);
	train_calls = train_refuse = 0;
	/* uncorked: one datagram at a time, as before */
	cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	cr_assert_eq(train_calls, 0);
	cr_assert_eq(a->data_xmits, 1);
	sim_settle(&s);
	/* corked: nothing leaves until rd_uncork, then one train of 10 full datagrams and a
	 * shorter last one */
	rd_cork(a->ep);
	for (int k = 0; k < 10; k++)
		cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	cr_assert_eq(send_msg(a, b, 100, true), 0);
	cr_assert_eq(a->data_xmits, 1, "corked datagrams left before rd_uncork");
	cr_assert(rd_busy(a->ep));
	rd_uncork(a->ep);
	cr_assert_eq(train_calls, 1);
	cr_assert_eq(train_last_n, 11);
	cr_assert_eq(train_last_seg, DG_RD_HLEN + c.max_dgram + DG_CRC_LEN);
	cr_assert_eq(train_last_tail, DG_RD_HLEN + 100 + DG_CRC_LEN);
	cr_assert_eq(a->data_xmits, 12);
	/* another peer's datagram ends the train: b's two go together, d's alone, b's last two
	 * together again; a shorter datagram ends a train too */
	rd_cork(a->ep);
	cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	cr_assert_eq(send_msg(a, d, c.max_dgram, true), 0);
	cr_assert_eq(send_msg(a, b, 200, true), 0);
	cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	rd_uncork(a->ep);
	cr_assert_eq(train_calls, 2, "trains: %d", train_calls);
	cr_assert_eq(a->data_xmits, 17);
	sim_settle(&s);
	cr_assert_eq(b->rcv[a->id].count, 16);
	cr_assert_eq(d->rcv[a->id].count, 1);
	cr_assert_eq(a->nacked[b->id], 16);
	cr_assert_eq(a->nacked[d->id], 1);
	cr_assert_eq(stats(a).retransmits, 0);
	/* a kernel that refuses GSO: the train goes one by one, and no train is tried again */
	train_refuse = 1;
	rd_cork(a->ep);
	for (int k = 0; k < 5; k++)
		cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	rd_uncork(a->ep);
	cr_assert_eq(train_calls, 3);
	cr_assert_eq(a->data_xmits, 22, "the refused train's datagrams were not sent one by one");
	rd_cork(a->ep);
	for (int k = 0; k < 5; k++)
		cr_assert_eq(send_msg(a, b, c.max_dgram, true), 0);
	rd_uncork(a->ep);
	cr_assert_eq(train_calls, 3);
	cr_assert_eq(a->data_xmits, 27);
	sim_settle(&s);
	cr_assert_eq(b->rcv[a->id].count, 26);
	cr_assert_eq(stats(a).retransmits, 0);
	sim_fini(&s);
}

/* The receiver reads a's queued datagrams itself, in order, inside or outside a batch. */
static void feed(struct sim *s, struct node *to, bool skip_first)
{
	bool first = true;
	while (s->n) {
		struct pkt p = heap_pop(s);
		if (!(skip_first && first) && p.dst == to->id)
			cr_assert_eq(rd_input(to->ep, &s->nodes[p.src]->addr, s->nodes[p.src]->alen, p.data,
					      p.len - DG_CRC_LEN), 0);
		first = false;
		free(p.data);
	}
}

Test(rd, rx_batch_acks_once)
{
	struct sim s;
	sim_init(&s, 42);
	struct rd_cfg c = base_cfg();
	struct node *a = node_add(&s, &c, false), *b = node_add(&s, &c, false);
	/* 20 in-order datagrams outside a batch: an ack per second one */
	s.hold = true;
	for (int k = 0; k < 20; k++)
		cr_assert_eq(send_msg(a, b, 300, true), 0);
	s.hold = false;
	uint64_t acks0 = stats(b).acks_sent;
	feed(&s, b, false);
	cr_assert_eq(stats(b).acks_sent - acks0, 10);
	sim_settle(&s);
	/* the same inside a batch: none until its end, then one */
	s.hold = true;
	for (int k = 0; k < 20; k++)
		cr_assert_eq(send_msg(a, b, 300, true), 0);
	s.hold = false;
	acks0 = stats(b).acks_sent;
	rd_rx_batch_begin(b->ep);
	feed(&s, b, false);
	cr_assert_eq(stats(b).acks_sent - acks0, 0, "acked inside the batch");
	rd_rx_batch_end(b->ep);
	cr_assert_eq(stats(b).acks_sent - acks0, 1);
	sim_settle(&s);
	cr_assert_eq(a->nacked[b->id], 40);
	/* a hole: the first of 20 lost; the 19 after it buffered, one ack with their SACK bits at
	 * the batch's end (not 19), and the sender retransmits just the one */
	s.hold = true;
	for (int k = 0; k < 20; k++)
		cr_assert_eq(send_msg(a, b, 300, true), 0);
	s.hold = false;
	acks0 = stats(b).acks_sent;
	uint64_t rtx0 = stats(a).retransmits;
	rd_rx_batch_begin(b->ep);
	feed(&s, b, true);
	cr_assert_eq(stats(b).acks_sent - acks0, 0);
	cr_assert_eq(stats(b).ooo_buffered, 19);
	rd_rx_batch_end(b->ep);
	cr_assert_eq(stats(b).acks_sent - acks0, 1, "acks for one batch with a hole: %lu",
		     (unsigned long)(stats(b).acks_sent - acks0));
	sim_settle(&s);
	cr_assert_eq(b->rcv[a->id].count, 60);
	cr_assert_eq(a->nacked[b->id], 60);
	cr_assert_eq(stats(a).retransmits - rtx0, 1);
	sim_fini(&s);
}
