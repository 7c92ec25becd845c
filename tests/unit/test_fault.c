/* test_fault.c - fault spec parsing, and what each fault does to a stream of datagrams. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

/* ------------------------------------------------------------------ parsing */

Test(fault_parse, full_spec)
{
	struct dgv_fault f;
	const char *why = "untouched";
	cr_assert_eq(dgv_fault_parse("loss=1,burst=0.5:4,reorder=5:3,dup=1,corrupt=0.1,seed=7", &f, &why), 0);
	cr_assert_null(why);
	cr_assert_float_eq(f.loss_pct, 1.0, 1e-12);
	cr_assert_float_eq(f.burst_pct, 0.5, 1e-12);
	cr_assert_eq(f.burst_len, 4u);
	cr_assert_float_eq(f.reorder_pct, 5.0, 1e-12);
	cr_assert_eq(f.reorder_depth, 3u);
	cr_assert_float_eq(f.dup_pct, 1.0, 1e-12);
	cr_assert_float_eq(f.corrupt_pct, 0.1, 1e-12);
	cr_assert_eq(f.seed, 7u);
}

Test(fault_parse, empty_and_null_are_zero)
{
	struct dgv_fault f;
	const char *why;
	memset(&f, 0x5a, sizeof f);
	cr_assert_eq(dgv_fault_parse("", &f, &why), 0);
	struct dgv_fault zero;
	memset(&zero, 0, sizeof zero);
	cr_assert_arr_eq(&f, &zero, sizeof f);
	memset(&f, 0x5a, sizeof f);
	cr_assert_eq(dgv_fault_parse(NULL, &f, &why), 0);
	cr_assert_arr_eq(&f, &zero, sizeof f);
}

Test(fault_parse, numbers)
{
	struct dgv_fault f;
	const char *why;
	cr_assert_eq(dgv_fault_parse("loss=0", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 0.0, 1e-12);
	cr_assert_eq(dgv_fault_parse("loss=100", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 100.0, 1e-12);
	cr_assert_eq(dgv_fault_parse("loss=100.000", &f, &why), 0);
	cr_assert_eq(dgv_fault_parse("loss=.25", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 0.25, 1e-12);
	cr_assert_eq(dgv_fault_parse("loss=3.", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 3.0, 1e-12);
	cr_assert_eq(dgv_fault_parse("loss=012.5", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 12.5, 1e-12);
	cr_assert_eq(dgv_fault_parse("seed=18446744073709551615", &f, &why), 0);
	cr_assert_eq(f.seed, UINT64_MAX);
	cr_assert_eq(dgv_fault_parse("reorder=100:64", &f, &why), 0);
	cr_assert_eq(f.reorder_depth, 64u);
	cr_assert_eq(dgv_fault_parse("burst=0:4294967295", &f, &why), 0);
	cr_assert_eq(f.burst_len, UINT32_MAX);
	/* blanks around items, later items win */
	cr_assert_eq(dgv_fault_parse(" loss=1 ,\tdup=2, loss=3 ", &f, &why), 0);
	cr_assert_float_eq(f.loss_pct, 3.0, 1e-12);
	cr_assert_float_eq(f.dup_pct, 2.0, 1e-12);
}

static void bad(const char *spec, const char *why_part)
{
	struct dgv_fault f;
	const char *why = NULL;
	memset(&f, 0x5a, sizeof f);
	cr_assert_eq(dgv_fault_parse(spec, &f, &why), -EINVAL, "\"%s\" accepted", spec);
	cr_assert_not_null(why, "\"%s\": no reason", spec);
	cr_assert_not_null(strstr(why, why_part), "\"%s\": reason \"%s\" lacks \"%s\"", spec, why, why_part);
	/* a failed parse leaves nothing half-configured */
	struct dgv_fault zero;
	memset(&zero, 0, sizeof zero);
	cr_assert_arr_eq(&f, &zero, sizeof f, "\"%s\": f not zeroed", spec);
}

Test(fault_parse, unknown_key)
{
	bad("drop=5", "unknown key");
	bad("loss=1,jitter=3", "unknown key");
	bad("LOSS=1", "unknown key");
	bad("loss =1", "unknown key");
	bad("=5", "unknown key");
}

Test(fault_parse, missing_equals)
{
	bad("loss", "'='");
	bad("loss=1,dup", "'='");
}

Test(fault_parse, empty_items)
{
	bad(",", "empty item");
	bad("loss=1,", "empty item");
	bad(",loss=1", "empty item");
	bad("loss=1,,dup=1", "empty item");
	bad("loss=1, ,dup=1", "empty item");
}

Test(fault_parse, bad_rate_numbers)
{
	bad("loss=", "bad number");
	bad("loss=abc", "bad number");
	bad("loss=1x", "bad number");
	bad("loss=-1", "bad number");
	bad("loss=+1", "bad number");
	bad("loss=1e2", "bad number");
	bad("loss=0x10", "bad number");
	bad("loss=nan", "bad number");
	bad("loss=inf", "bad number");
	bad("loss=.", "bad number");
	bad("loss=1.2.3", "bad number");
	bad("dup=", "bad number");
	bad("corrupt=x", "bad number");
	bad("loss= 5", "bad number");
}

Test(fault_parse, rate_out_of_range)
{
	bad("loss=100.01", "rate outside 0..100");
	bad("loss=101", "rate outside 0..100");
	bad("dup=1000", "rate outside 0..100");
	bad("corrupt=99999999999999999999", "rate outside 0..100");
	bad("burst=101:3", "rate outside 0..100");
	bad("reorder=200:3", "rate outside 0..100");
}

Test(fault_parse, bad_burst)
{
	bad("burst=5", "burst=PCT:LEN");
	bad("burst=5:", "burst length");
	bad("burst=5:x", "burst length");
	bad("burst=5:3:2", "burst length");
	bad("burst=:3", "burst=PCT:LEN");
	bad("burst=5:0", "burst length outside");
	bad("burst=5:4294967296", "burst length outside");
	bad("burst=5:99999999999999999999999", "burst length");
}

Test(fault_parse, bad_reorder)
{
	bad("reorder=5", "reorder=PCT:DEPTH");
	bad("reorder=5:", "reorder depth");
	bad("reorder=5:-1", "reorder depth");
	bad("reorder=5:0", "reorder depth outside 1..64");
	bad("reorder=5:65", "reorder depth outside 1..64");
}

Test(fault_parse, bad_seed)
{
	bad("seed=", "bad seed");
	bad("seed=-1", "bad seed");
	bad("seed=12a", "bad seed");
	bad("seed=18446744073709551616", "bad seed");
	bad("seed=1.5", "bad seed");
}

Test(fault_parse, why_may_be_null)
{
	struct dgv_fault f;
	cr_assert_eq(dgv_fault_parse("nope=1", &f, NULL), -EINVAL);
	cr_assert_eq(dgv_fault_parse("loss=1", &f, NULL), 0);
}

Test(fault_env, from_env)
{
	struct dgv_fault f;
	unsetenv("DGSHIM_FAULT_TX");
	memset(&f, 0x5a, sizeof f);
	cr_assert_eq(dg_fault_from_env(DG_ENV_FAULT_TX, &f), 0);
	cr_assert_eq(f.loss_pct, 0.0);
	cr_assert_eq(f.seed, 0u);

	setenv("DGSHIM_FAULT_TX", "", 1);
	cr_assert_eq(dg_fault_from_env(DG_ENV_FAULT_TX, &f), 0);
	cr_assert_eq(f.dup_pct, 0.0);

	setenv("DGSHIM_FAULT_TX", "dup=12.5,seed=3", 1);
	cr_assert_eq(dg_fault_from_env(DG_ENV_FAULT_TX, &f), 0);
	cr_assert_float_eq(f.dup_pct, 12.5, 1e-12);
	cr_assert_eq(f.seed, 3u);

	setenv("DGSHIM_FAULT_TX", "dup=12.5,bogus", 1);
	cr_assert_eq(dg_fault_from_env(DG_ENV_FAULT_TX, &f), -EINVAL);
	unsetenv("DGSHIM_FAULT_TX");
}

Test(fault_env, bad_spec_logs_one_line, .init = cr_redirect_stderr)
{
	struct dgv_fault f;
	setenv("DGSHIM_FAULT_RX", "loss=7,reorder=5:99", 1);
	cr_assert_eq(dg_fault_from_env(DG_ENV_FAULT_RX, &f), -EINVAL);
	unsetenv("DGSHIM_FAULT_RX");
	FILE *err = cr_get_redirected_stderr();
	char line[512];
	cr_assert_not_null(fgets(line, sizeof line, err));
	cr_assert_not_null(strstr(line, "DGSHIM_FAULT_RX=loss=7,reorder=5:99"), "%s", line);
	cr_assert_not_null(strstr(line, "reorder depth"), "%s", line);
	cr_assert_eq(line[strlen(line) - 1], '\n');
}

/* ------------------------------------------------------------------ init */

Test(fault_init, validation)
{
	struct dg_fault_state st;
	struct dgv_fault c;
	memset(&c, 0, sizeof c);
	cr_assert_eq(dg_fault_init(&st, NULL, 1500), 0);
	cr_assert_not(st.active);
	dg_fault_fini(&st);

	c.loss_pct = 100.5;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.loss_pct = -0.1;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.loss_pct = NAN;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.loss_pct = 0;
	c.dup_pct = 101;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.dup_pct = 0;
	c.corrupt_pct = 1000;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.corrupt_pct = 0;
	c.burst_pct = 200;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.burst_pct = 0;
	c.reorder_pct = 150;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.reorder_pct = 10;
	c.reorder_depth = 65;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), -EINVAL);
	c.reorder_depth = 64;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), 0);
	cr_assert(st.active);
	cr_assert_not_null(st.held);
	cr_assert_null(st.scratch);
	dg_fault_fini(&st);
	cr_assert_null(st.held);

	memset(&c, 0, sizeof c);
	c.corrupt_pct = 1;
	cr_assert_eq(dg_fault_init(&st, &c, 1500), 0);
	cr_assert_not_null(st.scratch);
	cr_assert_null(st.held);
	dg_fault_fini(&st);
}

/* ------------------------------------------------------------------ datagram stream harness */

#define MAXD 256

/* What came out: datagram id (first 4 bytes), length, content checksum, address port. */
struct out {
	uint32_t *id;
	size_t n, cap;
	uint8_t last[MAXD];
	size_t last_len;
	uint16_t *port;
	int diff_bytes_total; /* sum over emitted packets of bytes differing from the original */
};

static void make_pkt(uint32_t id, uint8_t *b, size_t len)
{
	memcpy(b, &id, 4);
	for (size_t i = 4; i < len; i++)
		b[i] = (uint8_t)(id * 31 + i);
}

static void collect(void *arg, const struct dg_pkt *p)
{
	struct out *o = arg;
	if (o->n == o->cap) {
		o->cap = o->cap ? o->cap * 2 : 1024;
		o->id = realloc(o->id, o->cap * sizeof *o->id);
		o->port = realloc(o->port, o->cap * sizeof *o->port);
	}
	uint8_t b[MAXD];
	size_t off = 0;
	for (int i = 0; i < p->iovcnt; i++) {
		memcpy(b + off, p->iov[i].iov_base, p->iov[i].iov_len);
		off += p->iov[i].iov_len;
	}
	cr_assert_eq(off, p->len);
	uint32_t id;
	memcpy(&id, b, 4);
	o->id[o->n] = id;
	o->port[o->n] = p->addr ? ntohs(p->addr->sin.sin_port) : 0;
	o->n++;
	memcpy(o->last, b, p->len);
	o->last_len = p->len;
}

static void out_free(struct out *o)
{
	free(o->id);
	free(o->port);
	memset(o, 0, sizeof *o);
}

/* Sends ids 0..n-1 of len bytes (split over two iovecs) through st into o. */
static void run(struct dg_fault_state *st, uint32_t n, size_t len, struct out *o)
{
	uint8_t b[MAXD];
	union dgv_sockaddr a;
	memset(&a, 0, sizeof a);
	a.sin.sin_family = AF_INET;
	for (uint32_t id = 0; id < n; id++) {
		make_pkt(id, b, len);
		a.sin.sin_port = htons((uint16_t)(1000 + id % 1000));
		struct iovec iov[2] = {{b, len / 2}, {b + len / 2, len - len / 2}};
		struct dg_pkt p = {.iov = iov, .iovcnt = 2, .len = len, .addr = &a, .addrlen = sizeof a.sin};
		dg_fault_apply(st, &p, collect, o);
	}
}

static struct dg_fault_state mk(const char *spec, size_t max_dgram)
{
	struct dgv_fault c;
	const char *why;
	cr_assert_eq(dgv_fault_parse(spec, &c, &why), 0, "%s: %s", spec, why);
	struct dg_fault_state st;
	cr_assert_eq(dg_fault_init(&st, &c, max_dgram), 0);
	return st;
}

/* ------------------------------------------------------------------ behaviour */

struct seen {
	const struct dg_pkt *last;
	int calls;
};

static void seen_cb(void *arg, const struct dg_pkt *q)
{
	struct seen *r = arg;
	r->last = q;
	r->calls++;
}

Test(fault, zero_config_passes_through)
{
	struct dg_fault_state st;
	cr_assert_eq(dg_fault_init(&st, NULL, 1500), 0);
	uint8_t b[64];
	make_pkt(9, b, sizeof b);
	struct iovec iov = {b, sizeof b};
	struct dg_pkt p = {.iov = &iov, .iovcnt = 1, .len = sizeof b, .addr = NULL, .addrlen = 0};

	/* inactive: the very same descriptor comes out, untouched */
	struct seen r = {NULL, 0};
	for (int i = 0; i < 1000; i++)
		dg_fault_apply(&st, &p, seen_cb, &r);
	cr_assert_eq(r.calls, 1000);
	cr_assert_eq(r.last, &p);

	struct out o = {0};
	run(&st, 5000, 100, &o);
	cr_assert_eq(o.n, 5000u);
	for (uint32_t i = 0; i < 5000; i++)
		cr_assert_eq(o.id[i], i);
	cr_assert_eq(st.dropped + st.duplicated + st.reordered + st.corrupted, 0u);
	dg_fault_flush(&st, collect, &o);
	cr_assert_eq(o.n, 5000u);
	out_free(&o);
	dg_fault_fini(&st);

	/* an explicit all-zero config (with a seed and depth but no rates) is just as inert */
	st = mk("seed=3,reorder=0:4,burst=0:9", 1500);
	cr_assert_not(st.active);
	r.calls = 0;
	dg_fault_apply(&st, &p, seen_cb, &r);
	cr_assert_eq(r.last, &p);
	dg_fault_fini(&st);
}

Test(fault, deterministic_with_seed)
{
	const char *spec = "loss=10,burst=2:3,reorder=10:4,dup=5,corrupt=5,seed=12345";
	struct out a = {0}, b = {0};
	struct dg_fault_state s1 = mk(spec, 1500), s2 = mk(spec, 1500);
	run(&s1, 20000, 64, &a);
	run(&s2, 20000, 64, &b);
	dg_fault_flush(&s1, collect, &a);
	dg_fault_flush(&s2, collect, &b);
	cr_assert_eq(a.n, b.n);
	cr_assert_arr_eq(a.id, b.id, a.n * sizeof *a.id);
	cr_assert_arr_eq(a.port, b.port, a.n * sizeof *a.port);
	cr_assert_eq(s1.dropped, s2.dropped);
	cr_assert_eq(s1.duplicated, s2.duplicated);
	cr_assert_eq(s1.reordered, s2.reordered);
	cr_assert_eq(s1.corrupted, s2.corrupted);
	cr_assert_gt(s1.dropped, 0u);
	cr_assert_gt(s1.duplicated, 0u);
	cr_assert_gt(s1.reordered, 0u);
	cr_assert_gt(s1.corrupted, 0u);
	dg_fault_fini(&s1);
	dg_fault_fini(&s2);

	/* another seed gives another stream */
	struct out c = {0};
	struct dg_fault_state s3 = mk("loss=10,burst=2:3,reorder=10:4,dup=5,corrupt=5,seed=54321", 1500);
	run(&s3, 20000, 64, &c);
	dg_fault_flush(&s3, collect, &c);
	cr_assert(c.n != a.n || memcmp(c.id, a.id, a.n * sizeof *a.id) != 0);
	dg_fault_fini(&s3);
	out_free(&a);
	out_free(&b);
	out_free(&c);
}

Test(fault, loss_rate_statistics)
{
	const double rates[] = {1, 5, 25, 50};
	for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
		char spec[64];
		snprintf(spec, sizeof spec, "loss=%g,seed=%zu", rates[r], 99 + r);
		struct dg_fault_state st = mk(spec, 1500);
		struct out o = {0};
		const uint32_t n = 100000;
		run(&st, n, 16, &o);
		double p = rates[r] / 100.0;
		double sd = sqrt(n * p * (1 - p));
		double dropped = (double)st.dropped;
		/* 5 standard deviations: a false failure about once in 3 million runs */
		cr_assert(fabs(dropped - n * p) < 5 * sd, "loss=%g: dropped %.0f of %u (expected %.0f +- %.0f)",
			  rates[r], dropped, n, n * p, 5 * sd);
		cr_assert_eq(o.n + st.dropped, n);
		/* survivors keep their order */
		for (size_t i = 1; i < o.n; i++)
			cr_assert_lt(o.id[i - 1], o.id[i]);
		out_free(&o);
		dg_fault_fini(&st);
	}
	/* the extremes */
	struct dg_fault_state st = mk("loss=100,seed=1", 1500);
	struct out o = {0};
	run(&st, 1000, 16, &o);
	cr_assert_eq(o.n, 0u);
	cr_assert_eq(st.dropped, 1000u);
	dg_fault_fini(&st);
}

Test(fault, burst_lengths)
{
	/* burst_pct 2 with length 7: every loss run is a whole number of bursts (they can abut,
	 * only the one in progress at the end is cut short), and about 2 % of the datagrams
	 * that could start a burst did. */
	struct dg_fault_state st = mk("burst=2:7,seed=5", 1500);
	struct out o = {0};
	const uint32_t n = 100000;
	run(&st, n, 16, &o);
	cr_assert_eq(o.n + st.dropped, n);

	uint32_t prev = UINT32_MAX; /* id -1 */
	int runs = 0;
	for (size_t i = 0; i < o.n; i++) {
		uint32_t gap = o.id[i] - prev - 1;
		cr_assert_eq(gap % 7, 0u, "gap of %u before id %u", gap, o.id[i]);
		if (gap)
			runs++;
		prev = o.id[i];
	}
	uint32_t tail = n - 1 - prev;
	cr_assert_eq((tail + st.burst_left) % 7, 0u, "trailing run %u, burst_left %u", tail, st.burst_left);
	cr_assert_gt(runs, 100);

	uint64_t bursts = (st.dropped + st.burst_left) / 7;
	cr_assert_eq((st.dropped + st.burst_left) % 7, 0u);
	/* starts are rolled only outside a burst: one roll per survivor and one per burst */
	double trials = (double)(o.n + bursts), p = 0.02;
	double sd = sqrt(trials * p * (1 - p));
	cr_assert(fabs((double)bursts - trials * p) < 5 * sd, "bursts %lu of %.0f", (unsigned long)bursts,
		  trials);
	out_free(&o);
	dg_fault_fini(&st);

	/* burst=100:3 is total loss */
	st = mk("burst=100:3,seed=5", 1500);
	run(&st, 99, 16, &o);
	cr_assert_eq(o.n, 0u);
	cr_assert_eq(st.dropped, 99u);
	out_free(&o);
	dg_fault_fini(&st);

	/* burst and loss combine */
	st = mk("burst=3:5,loss=10,seed=6", 1500);
	run(&st, 20000, 16, &o);
	cr_assert_eq(o.n + st.dropped, 20000u);
	cr_assert_gt(st.dropped, 2000u);
	out_free(&o);
	dg_fault_fini(&st);
}

Test(fault, dup_count)
{
	struct dg_fault_state st = mk("dup=10,seed=77", 1500);
	struct out o = {0};
	const uint32_t n = 100000;
	run(&st, n, 32, &o);
	cr_assert_eq(o.n, n + st.duplicated);
	double sd = sqrt(n * 0.1 * 0.9);
	cr_assert(fabs((double)st.duplicated - n * 0.1) < 5 * sd, "duplicated %lu",
		  (unsigned long)st.duplicated);
	/* a duplicate follows its original immediately */
	size_t dups = 0;
	for (size_t i = 1; i < o.n; i++) {
		if (o.id[i] == o.id[i - 1])
			dups++;
		else
			cr_assert_eq(o.id[i], o.id[i - 1] + 1);
	}
	cr_assert_eq(dups, st.duplicated);
	out_free(&o);
	dg_fault_fini(&st);

	st = mk("dup=100,seed=1", 1500);
	run(&st, 100, 32, &o);
	cr_assert_eq(o.n, 200u);
	cr_assert_eq(st.duplicated, 100u);
	out_free(&o);
	dg_fault_fini(&st);
}

/* Checks every emitted datagram against the original: counts bytes that differ. */
struct cmp {
	int packets, one_byte, intact, other;
	const uint8_t *src;
	size_t len;
	const uint8_t *src_mem; /* the caller's buffer */
};

static void compare_cb(void *arg, const struct dg_pkt *p)
{
	struct cmp *c = arg;
	uint8_t b[MAXD];
	size_t off = 0;
	for (int i = 0; i < p->iovcnt; i++) {
		memcpy(b + off, p->iov[i].iov_base, p->iov[i].iov_len);
		off += p->iov[i].iov_len;
	}
	cr_assert_eq(off, c->len);
	int diff = 0;
	for (size_t i = 0; i < c->len; i++)
		if (b[i] != c->src[i]) {
			diff++;
			cr_assert_eq((uint8_t)(b[i] ^ c->src[i]), 0xff, "byte %zu not inverted", i);
		}
	c->packets++;
	if (diff == 0)
		c->intact++;
	else if (diff == 1)
		c->one_byte++;
	else
		c->other++;
	/* a corrupted copy never lives in the caller's buffer */
	if (diff)
		for (int i = 0; i < p->iovcnt; i++) {
			const uint8_t *q = p->iov[i].iov_base;
			cr_assert(q + p->iov[i].iov_len <= c->src_mem || q >= c->src_mem + c->len,
				  "corrupted data emitted from the source buffer");
		}
}

Test(fault, corruption_flips_one_byte_never_the_source)
{
	struct dg_fault_state st = mk("corrupt=30,seed=4242", 1500);
	uint8_t src[200], orig[200];
	make_pkt(1, src, sizeof src);
	memcpy(orig, src, sizeof src);
	struct iovec iov[3] = {{src, 50}, {src + 50, 100}, {src + 150, 50}};
	struct dg_pkt p = {.iov = iov, .iovcnt = 3, .len = sizeof src};
	struct cmp c = {.src = orig, .len = sizeof src, .src_mem = src};
	for (int i = 0; i < 20000; i++) {
		dg_fault_apply(&st, &p, compare_cb, &c);
		cr_assert_arr_eq(src, orig, sizeof src, "source buffer modified at round %d", i);
	}
	cr_assert_eq(c.packets, 20000);
	cr_assert_eq(c.other, 0);
	cr_assert_eq((uint64_t)c.one_byte, st.corrupted);
	double sd = sqrt(20000 * 0.3 * 0.7);
	cr_assert(fabs(c.one_byte - 6000.0) < 5 * sd, "corrupted %d", c.one_byte);
	dg_fault_fini(&st);

	/* corrupt=100: every datagram, still one byte each */
	st = mk("corrupt=100,seed=9", 1500);
	struct iovec one = {src, 16};
	struct dg_pkt q = {.iov = &one, .iovcnt = 1, .len = 16};
	struct cmp c2 = {.src = orig, .len = 16, .src_mem = src};
	for (int i = 0; i < 2000; i++)
		dg_fault_apply(&st, &q, compare_cb, &c2);
	cr_assert_eq(c2.one_byte, 2000);
	cr_assert_arr_eq(src, orig, sizeof src);
	dg_fault_fini(&st);
}

Test(fault, corruption_covers_every_position)
{
	struct dg_fault_state st = mk("corrupt=100,seed=31337", 1500);
	uint8_t src[24];
	make_pkt(3, src, sizeof src);
	struct iovec iov = {src, sizeof src};
	struct dg_pkt p = {.iov = &iov, .iovcnt = 1, .len = sizeof src};
	struct out o = {0};
	int hit[24] = {0};
	for (int i = 0; i < 2000; i++) {
		dg_fault_apply(&st, &p, collect, &o);
		for (size_t k = 0; k < sizeof src; k++)
			if (o.last[k] != src[k])
				hit[k]++;
	}
	for (size_t k = 0; k < sizeof src; k++)
		cr_assert_gt(hit[k], 0, "byte %zu never corrupted", k);
	out_free(&o);
	dg_fault_fini(&st);
}

Test(fault, reorder_changes_order_and_flush_releases_all)
{
	struct dg_fault_state st = mk("reorder=20:3,seed=8", 1500);
	struct out o = {0};
	const uint32_t n = 10000;
	run(&st, n, 40, &o);
	cr_assert_gt(st.reordered, 0u);
	cr_assert_leq(st.nheld, 3u);
	uint64_t held_at_end = st.nheld;
	cr_assert_eq(o.n + held_at_end, n);
	dg_fault_flush(&st, collect, &o);
	cr_assert_eq(st.nheld, 0u);
	cr_assert_eq(o.n, n, "flush must release every held datagram");

	/* a permutation of 0..n-1 that is not the identity */
	uint8_t *seen = calloc(n, 1);
	int inversions = 0;
	for (size_t i = 0; i < o.n; i++) {
		cr_assert_lt(o.id[i], n);
		cr_assert_eq(seen[o.id[i]], 0, "id %u twice", o.id[i]);
		seen[o.id[i]] = 1;
		if (i && o.id[i] < o.id[i - 1])
			inversions++;
	}
	free(seen);
	cr_assert_gt(inversions, 100);

	/* nothing is ever more than 3 places late: held, then released after 3 more arrivals */
	for (size_t i = 0; i < o.n; i++)
		cr_assert_leq((long)i - (long)o.id[i], 3, "id %u emitted at %zu", o.id[i], i);
	/* and the address travels with its datagram */
	for (size_t i = 0; i < o.n; i++)
		cr_assert_eq(o.port[i], 1000 + o.id[i] % 1000);
	out_free(&o);
	dg_fault_fini(&st);
}

Test(fault, reorder_exact_delay)
{
	/* reorder=100:2: every datagram is held and comes out after two more arrive. */
	struct dg_fault_state st = mk("reorder=100:2,seed=1", 1500);
	struct out o = {0};
	run(&st, 5, 40, &o);
	cr_assert_eq(o.n, 3u);
	cr_assert_eq(o.id[0], 0u);
	cr_assert_eq(o.id[1], 1u);
	cr_assert_eq(o.id[2], 2u);
	cr_assert_eq(st.nheld, 2u);
	dg_fault_flush(&st, collect, &o);
	cr_assert_eq(o.n, 5u);
	cr_assert_eq(o.id[3], 3u);
	cr_assert_eq(o.id[4], 4u);
	/* flush on an empty state is harmless */
	dg_fault_flush(&st, collect, &o);
	cr_assert_eq(o.n, 5u);
	out_free(&o);
	dg_fault_fini(&st);
}

Test(fault, reorder_copies_the_datagram)
{
	/* The caller reuses its buffer right after apply; a held datagram must be a copy. */
	struct dg_fault_state st = mk("reorder=100:1,seed=1", 1500);
	uint8_t b[32];
	struct out o = {0};
	struct iovec iov = {b, sizeof b};
	struct dg_pkt p = {.iov = &iov, .iovcnt = 1, .len = sizeof b};
	make_pkt(1, b, sizeof b);
	dg_fault_apply(&st, &p, collect, &o);
	cr_assert_eq(o.n, 0u);
	memset(b, 0xee, sizeof b);
	make_pkt(2, b, sizeof b);
	dg_fault_apply(&st, &p, collect, &o);
	cr_assert_eq(o.n, 1u);
	uint8_t want[32];
	make_pkt(1, want, sizeof want);
	cr_assert_arr_eq(o.last, want, sizeof want);
	cr_assert_eq(o.port[0], 0); /* no address in, none out */
	dg_fault_fini(&st);
	out_free(&o);
}

Test(fault, oversize_datagram_passes_untouched)
{
	/* Larger than max_dgram: cannot be copied, so it is neither held nor corrupted. */
	struct dg_fault_state st = mk("reorder=100:2,corrupt=100,seed=1", 16);
	struct out o = {0};
	run(&st, 10, 64, &o);
	cr_assert_eq(o.n, 10u);
	cr_assert_eq(st.reordered, 0u);
	cr_assert_eq(st.corrupted, 0u);
	out_free(&o);
	dg_fault_fini(&st);
}

Test(fault, everything_at_once_conserves_datagrams)
{
	struct dg_fault_state st = mk("loss=5,burst=1:4,reorder=15:5,dup=7,corrupt=3,seed=2024", 1500);
	struct out o = {0};
	const uint32_t n = 50000;
	run(&st, n, 48, &o);
	dg_fault_flush(&st, collect, &o);
	cr_assert_eq(o.n, n - st.dropped + st.duplicated);
	dg_fault_fini(&st);
	out_free(&o);
}
