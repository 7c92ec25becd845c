/*
 * dgperf_output.c - dgperf, statistics and output (text rows or JSON), the receiver's report.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* ---------------------------------------------------------------- results */

uint64_t *g_samples;
uint64_t g_samples_cap;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Text output: columns are padded, lines end without blanks. */
static char g_line[256];
static size_t g_len;

static void line_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line_add(const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(g_line + g_len, sizeof g_line - g_len, fmt, ap);
	va_end(ap);
	if (n > 0)
		g_len = g_len + (size_t)n < sizeof g_line ? g_len + (size_t)n : sizeof g_line - 1;
}

static void line_end(void)
{
	while (g_len && g_line[g_len - 1] == ' ')
		g_len--;
	g_line[g_len] = 0;
	puts(g_line);
	g_len = 0;
}

static bool show_delivered(void) { return opt.raw ? !opt.raw_tcp : opt.transport == TR_UD; }

void print_header(const char *provider, const char *extra)
{
	if (opt.json)
		return;
	printf("# dgperf %s: transport %s, provider %s%s\n", test_names[opt.test], transport_name(),
	       provider, extra);
	if (test_lat()) {
		line_add("#%-9s %-9s %-11s %-14s %-11s %-11s", "bytes", "iters", "t_min[us]",
			 "t_typical[us]", "t_avg[us]", "p99[us]");
	} else {
		line_add("#%-9s %-9s %-12s %-14s", "bytes", "iters", "BW[MB/s]", "MsgRate[Mpps]");
		if (show_delivered())
			line_add(" %-15s", "delivered/sent");
	}
	if (test_kind() == K_WR)
		line_add(" %s", "valid[%]");
	line_end();
	fflush(stdout);
}

struct row_detail g_detail;

static void json_num(const char *key, double v, bool null, int prec, bool last)
{
	if (null || !isfinite(v))
		printf("\"%s\":null%s", key, last ? "" : ",");
	else
		printf("\"%s\":%.*f%s", key, prec, v, last ? "" : ",");
}

/* Latency row from n samples of round trips (scale: 0.5 for half round trips). */
void print_lat_row(uint64_t size, uint64_t n, double scale, double valid_fraction,
		   uint64_t lost, uint64_t pings)
{
	double min = NAN, med = NAN, avg = NAN, p99 = NAN;
	bool wr = test_kind() == K_WR;

	if (n > 0) {
		uint64_t sum = 0, idx = (99 * n + 99) / 100 - 1;

		qsort(g_samples, n, sizeof *g_samples, cmp_u64);
		for (uint64_t i = 0; i < n; i++)
			sum += g_samples[i];
		min = g_samples[0] * scale / 1e3;
		med = (n % 2 ? (double)g_samples[n / 2] :
		       ((double)g_samples[n / 2 - 1] + (double)g_samples[n / 2]) / 2) * scale / 1e3;
		avg = (double)sum / (double)n * scale / 1e3;
		p99 = g_samples[idx] * scale / 1e3;
	}
	if (opt.json) {
		printf("{\"test\":\"%s\",\"transport\":\"%s\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64 ",",
		       test_names[opt.test], transport_name(), size, n);
		json_num("t_min_us", min, n == 0, 3, false);
		json_num("t_typical_us", med, n == 0, 3, false);
		json_num("t_avg_us", avg, n == 0, 3, false);
		json_num("p99_us", p99, n == 0, 3, false);
		json_num("bw_MBps", 0, true, 0, false);
		json_num("msg_rate_Mpps", 0, true, 0, false);
		json_num("valid_fraction", valid_fraction, !wr, 6, true);
		if (opt.detail)
			printf(",\"pings\":%" PRIu64 ",\"lost\":%" PRIu64, pings, lost);
		printf("}\n");
		if (lost)
			vlog("size %" PRIu64 ": %" PRIu64 " of %" PRIu64 " round trips timed out", size,
			     lost, pings);
	} else {
		line_add("%-10" PRIu64 " %-9" PRIu64 " %-11.2f %-14.2f %-11.2f %-11.2f", size, n, min, med,
			 avg, p99);
		if (wr)
			line_add(" %.2f", valid_fraction * 100);
		line_end();
		if (lost)
			printf("# %" PRIu64 " of %" PRIu64 " round trips at %" PRIu64 " B timed out (lost "
			       "messages); they are not in the statistics\n", lost, pings, size);
	}
	fflush(stdout);
}

void print_bw_row(uint64_t size, uint64_t iters, uint64_t bytes, uint64_t msgs,
		  uint64_t elapsed_ns, double valid_fraction)
{
	double secs = (double)elapsed_ns / 1e9;
	double bw = secs > 0 ? (double)bytes / secs / 1e6 : 0;
	double rate = secs > 0 ? (double)msgs / secs / 1e6 : 0;
	bool wr = test_kind() == K_WR;

	if (opt.json) {
		printf("{\"test\":\"%s\",\"transport\":\"%s\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64 ",",
		       test_names[opt.test], transport_name(), size, iters);
		json_num("t_min_us", 0, true, 0, false);
		json_num("t_typical_us", 0, true, 0, false);
		json_num("t_avg_us", 0, true, 0, false);
		json_num("p99_us", 0, true, 0, false);
		json_num("bw_MBps", bw, false, 3, false);
		json_num("msg_rate_Mpps", rate, false, 6, false);
		json_num("valid_fraction", valid_fraction, !wr, 6, true);
		if (opt.detail) {
			printf(",\"sent_msgs\":%" PRIu64 ",\"delivered_msgs\":%" PRIu64
			       ",\"delivered_bytes\":%" PRIu64 ",", g_detail.sent, msgs, bytes);
			json_num("elapsed_s", secs, false, 6, false);
			json_num("cpu_client_s", (double)g_detail.cpu_client_ns / 1e9, false, 6, false);
			json_num("cpu_server_s", (double)g_detail.cpu_server_ns / 1e9, false, 6, false);
			if (g_detail.qp_stats)
				printf("\"tx_datagrams\":%" PRIu64 ",\"tx_wire_bytes\":%" PRIu64
				       ",\"rd_retransmits\":%" PRIu64 ",\"peer_fault_drops\":%" PRIu64,
				       g_detail.tx_dg, g_detail.tx_bytes, g_detail.retx, g_detail.peer_drops);
			else
				printf("\"tx_datagrams\":null,\"tx_wire_bytes\":null,\"rd_retransmits\":null,"
				       "\"peer_fault_drops\":null");
		}
		printf("}\n");
	} else {
		char dlv[48];

		line_add("%-10" PRIu64 " %-9" PRIu64 " %-12.2f %-14.6f", size, iters, bw, rate);
		snprintf(dlv, sizeof dlv, "%" PRIu64 "/%" PRIu64, msgs, iters);
		if (show_delivered())
			line_add(" %-15s", dlv);
		if (wr)
			line_add(" %.2f", valid_fraction * 100);
		line_end();
	}
	vlog("size %" PRIu64 ": delivered %" PRIu64 " of %" PRIu64 " messages, %" PRIu64 " bytes in %.3f ms",
	     size, msgs, iters, bytes, secs * 1e3);
	fflush(stdout);
}

/* Elapsed time to the receiver's last arrival, from the client's first post. */
uint64_t bw_elapsed(uint64_t t_start, uint64_t t_report, uint64_t t_local_end,
		    const struct report *rep)
{
	uint64_t e = t_report - t_start;

	if (rep->delta_ns < e)
		e -= rep->delta_ns;
	else
		e = t_local_end - t_start; /* cannot happen with sane clocks */
	return e ? e : 1;
}

void report_put(struct ctl_msg *m, uint64_t phase, const struct report *r)
{
	memset(m, 0, sizeof *m);
	m->v[0] = phase;
	m->v[1] = r->count;
	m->v[2] = r->bytes;
	m->v[3] = r->valid;
	m->v[4] = r->lensum;
	m->v[5] = r->delta_ns;
	m->v[6] = r->dgrams;
	m->v[7] = r->rejects;
	m->v[8] = r->fault_drops;
	m->v[9] = r->cpu_ns;
}

void report_get(const struct ctl_msg *m, uint64_t phase, struct report *r)
{
	if (m->v[0] != phase)
		die(1, "control channel: report for phase %" PRIu64 " while in phase %" PRIu64, m->v[0],
		    phase);
	r->count = m->v[1];
	r->bytes = m->v[2];
	r->valid = m->v[3];
	r->lensum = m->v[4];
	r->delta_ns = m->v[5];
	r->dgrams = m->v[6];
	r->rejects = m->v[7];
	r->fault_drops = m->v[8];
	r->cpu_ns = m->v[9];
}
