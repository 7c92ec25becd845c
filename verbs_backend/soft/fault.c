/*
 * fault.c - loss, burst loss, reordering, duplication and corruption at one edge of a QP.
 *
 * Decisions come from a seeded xorshift64* generator, so a failing test replays exactly with
 * the same seed and the same datagram sequence. Every buffer is allocated in dg_fault_init:
 * dg_fault_apply runs on the data path and must not allocate.
 *
 * Per datagram, in this order (each roll only when its rate is non-zero, so adding a fault
 * kind does not shift the dice of a configuration without it):
 *   burst / loss -> dropped (a burst drops this datagram and burst_len - 1 more);
 *   corrupt      -> a copy with one byte inverted goes on in its place;
 *   reorder      -> held, released after reorder_depth further datagrams reached the edge
 *                   (dropped ones count: the delay is in arrivals, like a queue position);
 *   dup          -> emitted twice (when it leaves, held or not).
 */
#include "fault.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "wire.h"

#define DG_FAULT_MAX_DEPTH 64u

struct dg_fault_held {
	uint8_t *buf; /* max_dgram bytes, carved from one allocation */
	size_t len;
	uint32_t countdown; /* arrivals still to pass before release; 0: slot free */
	bool dup;
	bool has_addr;
	socklen_t addrlen;
	union dgv_sockaddr addr;
};

/* ------------------------------------------------------------------ random numbers */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* True with probability pct / 100: 53 random bits give a uniform double in [0, 100). */
static bool roll(uint64_t *s, double pct)
{
	return (double)(rng_next(s) >> 11) * (100.0 / 9007199254740992.0) < pct;
}

/* ------------------------------------------------------------------ spec parsing */

static bool rate_ok(double pct)
{
	return pct >= 0.0 && pct <= 100.0; /* false for NaN too */
}

/*
 * Our own decimal reader: strtod follows LC_NUMERIC, which the host program of the shim may
 * have changed, and accepts "inf", "nan" and hex floats that make no sense as a rate.
 */
static const char *parse_pct(const char *s, double *out)
{
	double v = 0.0;
	int digits = 0;
	while (*s >= '0' && *s <= '9') {
		if (v < 1e6) /* anything this large is out of range anyway */
			v = v * 10.0 + (*s - '0');
		s++, digits++;
	}
	if (*s == '.') {
		double scale = 0.1;
		s++;
		while (*s >= '0' && *s <= '9') {
			v += (*s - '0') * scale;
			scale *= 0.1;
			s++, digits++;
		}
	}
	if (!digits)
		return NULL;
	*out = v;
	return s;
}

static const char *parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	const char *start = s;
	while (*s >= '0' && *s <= '9') {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return NULL;
		v = v * 10 + d;
		s++;
	}
	if (s == start)
		return NULL;
	*out = v;
	return s;
}

static bool key_is(const char *k, size_t klen, const char *name)
{
	return strlen(name) == klen && memcmp(k, name, klen) == 0;
}

/* Parses one "key=value" item in [s, end). Returns NULL or the reason it is wrong. */
static const char *parse_item(const char *s, const char *end, struct dgv_fault *f)
{
	const char *eq = memchr(s, '=', (size_t)(end - s));
	if (!eq)
		return "item without '=' (expected key=value)";
	size_t klen = (size_t)(eq - s);
	const char *v = eq + 1;
	const char *p;
	double pct;
	uint64_t n;

	if (key_is(s, klen, "loss") || key_is(s, klen, "dup") || key_is(s, klen, "corrupt")) {
		p = parse_pct(v, &pct);
		if (!p || p != end)
			return "bad number in loss/dup/corrupt (expected a decimal percentage)";
		if (!rate_ok(pct))
			return "rate outside 0..100 in loss/dup/corrupt";
		if (key_is(s, klen, "loss"))
			f->loss_pct = pct;
		else if (key_is(s, klen, "dup"))
			f->dup_pct = pct;
		else
			f->corrupt_pct = pct;
		return NULL;
	}
	if (key_is(s, klen, "burst") || key_is(s, klen, "reorder")) {
		bool burst = key_is(s, klen, "burst");
		p = parse_pct(v, &pct);
		if (!p || *p != ':')
			return burst ? "bad burst (expected burst=PCT:LEN)"
				     : "bad reorder (expected reorder=PCT:DEPTH)";
		if (!rate_ok(pct))
			return burst ? "rate outside 0..100 in burst" : "rate outside 0..100 in reorder";
		p = parse_u64(p + 1, &n);
		if (!p || p != end)
			return burst ? "bad burst length (expected burst=PCT:LEN)"
				     : "bad reorder depth (expected reorder=PCT:DEPTH)";
		if (burst) {
			if (n < 1 || n > UINT32_MAX)
				return "burst length outside 1..4294967295";
			f->burst_pct = pct;
			f->burst_len = (uint32_t)n;
		} else {
			if (n < 1 || n > DG_FAULT_MAX_DEPTH)
				return "reorder depth outside 1..64";
			f->reorder_pct = pct;
			f->reorder_depth = (uint32_t)n;
		}
		return NULL;
	}
	if (key_is(s, klen, "seed")) {
		p = parse_u64(v, &n);
		if (!p || p != end)
			return "bad seed (expected a decimal integer)";
		f->seed = n;
		return NULL;
	}
	return "unknown key (expected loss, burst, reorder, dup, corrupt or seed)";
}

int dgv_fault_parse(const char *spec, struct dgv_fault *f, const char **why)
{
	static const char *unused;
	if (!why)
		why = &unused;
	*why = NULL;
	if (!f)
		return -EINVAL;
	memset(f, 0, sizeof *f);
	if (!spec)
		return 0;

	const char *s = spec;
	while (*s) {
		const char *end = strchr(s, ',');
		if (!end)
			end = s + strlen(s);
		/* Blanks around an item are forgiven: specs get pasted into shell variables. */
		const char *b = s, *e = end;
		while (b < e && (*b == ' ' || *b == '\t'))
			b++;
		while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		const char *err = b == e ? "empty item" : parse_item(b, e, f);
		if (err) {
			*why = err;
			memset(f, 0, sizeof *f);
			return -EINVAL;
		}
		s = *end ? end + 1 : end;
		if (*end && !*s) {
			*why = "empty item";
			memset(f, 0, sizeof *f);
			return -EINVAL;
		}
	}
	return 0;
}

int dg_fault_from_env(enum dg_env var, struct dgv_fault *out)
{
	const char *why;
	const char *name = dg_env_name(var);
	const char *v = dg_env_str(var);
	if (!v) {
		memset(out, 0, sizeof *out);
		return 0;
	}
	int rc = dgv_fault_parse(v, out, &why);
	if (rc)
		dg_log_always("%s=%s: %s", name, v, why);
	return rc;
}

/* ------------------------------------------------------------------ state */

static uint64_t clock_seed(const void *salt)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
	       ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)salt;
}

static bool reordering(const struct dg_fault_state *f)
{
	return f->cfg.reorder_pct > 0 && f->cfg.reorder_depth > 0;
}

int dg_fault_init(struct dg_fault_state *f, const struct dgv_fault *cfg, size_t max_dgram)
{
	memset(f, 0, sizeof *f);
	if (cfg)
		f->cfg = *cfg;
	const struct dgv_fault *c = &f->cfg;
	if (!rate_ok(c->loss_pct) || !rate_ok(c->burst_pct) || !rate_ok(c->reorder_pct) ||
	    !rate_ok(c->dup_pct) || !rate_ok(c->corrupt_pct) || c->reorder_depth > DG_FAULT_MAX_DEPTH) {
		memset(f, 0, sizeof *f);
		return -EINVAL;
	}
	f->max_dgram = max_dgram ? max_dgram : DG_MAX_DATAGRAM;
	f->active = c->loss_pct > 0 || c->burst_pct > 0 || c->reorder_pct > 0 || c->dup_pct > 0 ||
		    c->corrupt_pct > 0;
	/* splitmix spreads small seeds (1, 2, 3...) over the whole state; xorshift needs != 0. */
	f->rng = splitmix64(c->seed ? c->seed : clock_seed(f));
	if (!f->rng)
		f->rng = 0x9e3779b97f4a7c15ull;

	if (c->corrupt_pct > 0) {
		f->scratch = malloc(f->max_dgram);
		if (!f->scratch)
			goto nomem;
	}
	if (reordering(f)) {
		uint32_t d = c->reorder_depth;
		f->held = calloc(d, sizeof *f->held);
		uint8_t *bufs = malloc(f->max_dgram * d);
		if (!f->held || !bufs) {
			free(bufs);
			goto nomem;
		}
		for (uint32_t i = 0; i < d; i++)
			f->held[i].buf = bufs + (size_t)i * f->max_dgram;
	}
	return 0;
nomem:
	dg_fault_fini(f);
	return -ENOMEM;
}

void dg_fault_fini(struct dg_fault_state *f)
{
	if (f->held)
		free(f->held[0].buf); /* slot 0 owns the single buffer allocation */
	free(f->held);
	free(f->scratch);
	memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------------ data path */

static void gather(uint8_t *dst, const struct iovec *iov, int iovcnt, size_t len)
{
	for (int i = 0; i < iovcnt && len; i++) {
		size_t n = iov[i].iov_len < len ? iov[i].iov_len : len;
		memcpy(dst, iov[i].iov_base, n);
		dst += n;
		len -= n;
	}
}

static void emit_n(const struct dg_pkt *pkt, bool dup, dg_fault_emit_fn emit, void *arg)
{
	emit(arg, pkt);
	if (dup)
		emit(arg, pkt);
}

static void release(struct dg_fault_held *h, dg_fault_emit_fn emit, void *arg)
{
	struct iovec iov = {.iov_base = h->buf, .iov_len = h->len};
	struct dg_pkt out = {
		.iov = &iov,
		.iovcnt = 1,
		.len = h->len,
		.addr = h->has_addr ? &h->addr : NULL,
		.addrlen = h->addrlen,
	};
	h->countdown = 0;
	emit_n(&out, h->dup, emit, arg);
}

/* Stores pkt in a free slot; false when it cannot be held (no slot, too big). */
static bool hold(struct dg_fault_state *f, const struct dg_pkt *pkt, bool dup)
{
	if (pkt->len > f->max_dgram)
		return false;
	for (uint32_t i = 0; i < f->cfg.reorder_depth; i++) {
		struct dg_fault_held *h = &f->held[i];
		if (h->countdown)
			continue;
		gather(h->buf, pkt->iov, pkt->iovcnt, pkt->len);
		h->len = pkt->len;
		h->dup = dup;
		h->has_addr = pkt->addr != NULL;
		h->addrlen = pkt->addrlen;
		if (pkt->addr) {
			size_t n = pkt->addrlen < sizeof h->addr ? pkt->addrlen : sizeof h->addr;
			memset(&h->addr, 0, sizeof h->addr);
			memcpy(&h->addr, pkt->addr, n);
		}
		h->countdown = f->cfg.reorder_depth;
		f->nheld++;
		return true;
	}
	return false;
}

void dg_fault_apply(struct dg_fault_state *f, const struct dg_pkt *pkt, dg_fault_emit_fn emit, void *arg)
{
	if (!f->active) {
		emit(arg, pkt);
		return;
	}
	const struct dgv_fault *c = &f->cfg;

	/* Age the held datagrams first: this arrival is one of the depth they wait for. At most
	 * one slot can fall due per arrival because every slot starts from the same depth. */
	struct dg_fault_held *due = NULL;
	if (f->nheld) {
		for (uint32_t i = 0; i < c->reorder_depth; i++) {
			struct dg_fault_held *h = &f->held[i];
			if (h->countdown && --h->countdown == 0) {
				h->countdown = 1; /* still occupied until released below */
				due = h;
			}
		}
	}

	bool drop = false;
	if (f->burst_left == 0 && c->burst_pct > 0 && c->burst_len > 0 && roll(&f->rng, c->burst_pct))
		f->burst_left = c->burst_len;
	if (f->burst_left) {
		f->burst_left--;
		drop = true;
	} else if (c->loss_pct > 0 && roll(&f->rng, c->loss_pct)) {
		drop = true;
	}

	struct dg_pkt cur = *pkt;
	struct iovec civ;
	bool held = false;
	if (drop) {
		f->dropped++;
	} else {
		if (c->corrupt_pct > 0 && roll(&f->rng, c->corrupt_pct) && pkt->len > 0 &&
		    pkt->len <= f->max_dgram) {
			gather(f->scratch, pkt->iov, pkt->iovcnt, pkt->len);
			f->scratch[rng_next(&f->rng) % pkt->len] ^= 0xff;
			civ.iov_base = f->scratch;
			civ.iov_len = pkt->len;
			cur.iov = &civ;
			cur.iovcnt = 1;
			f->corrupted++;
		}
		bool want_hold = reordering(f) && roll(&f->rng, c->reorder_pct);
		bool dup = c->dup_pct > 0 && roll(&f->rng, c->dup_pct);
		if (dup)
			f->duplicated++;
		if (want_hold) {
			/* Release first so the slot that fell due can take this datagram. */
			if (due) {
				f->nheld--;
				release(due, emit, arg);
				due = NULL;
			}
			held = hold(f, &cur, dup);
			if (held)
				f->reordered++;
		}
		if (!held)
			emit_n(&cur, dup, emit, arg);
	}
	if (due) {
		f->nheld--;
		release(due, emit, arg);
	}
}

void dg_fault_flush(struct dg_fault_state *f, dg_fault_emit_fn emit, void *arg)
{
	/* Oldest first: the one with the least countdown left arrived earliest. */
	while (f->nheld) {
		struct dg_fault_held *oldest = NULL;
		for (uint32_t i = 0; i < f->cfg.reorder_depth; i++) {
			struct dg_fault_held *h = &f->held[i];
			if (h->countdown && (!oldest || h->countdown < oldest->countdown))
				oldest = h;
		}
		if (!oldest)
			break;
		f->nheld--;
		release(oldest, emit, arg);
	}
	f->nheld = 0;
}
