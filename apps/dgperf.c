/*
 * dgperf.c - a perftest-style micro-benchmark of the dgshim verbs interface, with a plain-UDP
 * baseline (--raw-udp). `dgperf --help` documents the usage, the tests and how every figure is
 * measured; this comment only maps the program (dgperf.h declares what the parts share).
 *
 *  1. options and their validation (exit 2 on a bad value, naming the option): dgperf_opts.c;
 *  2. the TCP control channel: handshake (both sides must run the same test), address and MR
 *     exchange, a barrier before and after every message size, the receiver's counts:
 *     dgperf_ctl.c;
 *  3. the verbs data path: one registered buffer per side, split in a source half (tx) and a
 *     target half (rx) of the largest message size each (dgperf_verbs.c); client and server
 *     loops per test (dgperf_verbs_tests.c);
 *  4. the raw-UDP data path: the same patterns over a connected UDP socket, no framing, and the
 *     raw-TCP one: dgperf_raw.c;
 *  5. statistics and output (text rows or one JSON object per row): dgperf_output.c;
 *  6. errors, the phases of a run (client and server) and main: this file.
 *
 * Nothing is allocated in the timed loops: work requests, SGEs, completion arrays and the sample
 * array are prepared before a size starts.
 */
#include "dgperf.h"
#include "env.h"
#include "wire.h" /* only for the per-datagram overhead fallback of write_bw on UD */

/* ---------------------------------------------------------------- errors */

int g_ctl = -1;    /* the control connection */
int g_lfd = -1;    /* server, RC and --raw-tcp: the control port's listening socket, kept
			     open for the data connection */
bool g_server;
bool g_dying;

void (*g_die_hook)(void); /* -v: the QP counters when a run fails */

/* Prints the error, tells the peer (so it does not wait for a timeout), exits with code. */
void __attribute__((noreturn, format(printf, 2, 3))) die(int code, const char *fmt, ...)
{
	char text[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "dgperf: %s\n", text);
	if (g_die_hook && !g_dying) {
		void (*hook)(void) = g_die_hook;

		g_die_hook = NULL;
		hook();
	}
	if (g_ctl >= 0 && !g_dying) {
		g_dying = true;
		ctl_send_err(code, text);
	}
	exit(code);
}

void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "dgperf: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see dgperf --help)\n");
	exit(2);
}

void vlog(const char *fmt, ...)
{
	va_list ap;

	if (!opt.verbose)
		return;
	fprintf(stderr, "dgperf[%s]: ", g_server ? "server" : "client");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---------------------------------------------------------------- phases */

/*
 * write_bw: an RDMA Write leaves no completion at the target, so the bytes it placed come from
 * the target QP's counters. RD (and RC): a Write completes at the source only once the target
 * acknowledged it, so every completed Write was placed. UD: the payload of the datagrams the
 * target QP accepted = rx_bytes - rx_datagrams x per-datagram overhead, less the share of the
 * datagrams it rejected. The overhead is measured on our side (tx_bytes - payload) / tx_datagrams
 * when no transmit-edge fault dropped anything, else taken from wire.h. msgs counts message
 * equivalents (placed bytes / size).
 */
static void write_delivered(uint64_t size, const struct dgv_qp_stats *st1, const struct report *rep,
			    uint64_t *bytes, uint64_t *msgs)
{
	const struct dgv_qp_stats *o = &V.st0;
	uint64_t tx_dg = st1->tx_datagrams - o->tx_datagrams, tx_b = st1->tx_bytes - o->tx_bytes;
	uint64_t sent = V.c_done * size;
	double ovh = DG_TAGGED_HLEN + DG_CRC_LEN, placed;

	if (opt.transport != TR_UD) {
		*bytes = sent;
		*msgs = V.c_done;
		return;
	}
	if (tx_dg && st1->fault_dropped == o->fault_dropped && tx_b >= sent)
		ovh = (double)(tx_b - sent) / (double)tx_dg;
	placed = (double)rep->bytes - (double)rep->dgrams * ovh;
	if (rep->dgrams && rep->rejects)
		placed *= (double)(rep->dgrams - (rep->rejects < rep->dgrams ? rep->rejects : rep->dgrams)) /
			  (double)rep->dgrams;
	if (placed < 0)
		placed = 0;
	*bytes = (uint64_t)llround(placed);
	if (*bytes > sent)
		*bytes = sent;
	*msgs = *bytes / size;
	vlog("write_bw: target accepted %" PRIu64 " of our %" PRIu64 " datagrams (%.1f B overhead each, "
	     "%" PRIu64 " rejected)", rep->dgrams, tx_dg, ovh, rep->rejects);
}

static void client_phase(uint64_t phase, uint64_t size)
{
	uint64_t iters = iters_for(size), warm = warmup_for(iters);
	char label[48];
	struct ctl_msg m;
	struct report rep;
	uint64_t t_report, cpu0;

	snprintf(label, sizeof label, "size %" PRIu64 ":", size);
	memset(&rep, 0, sizeof rep);
	if (!opt.raw) {
		V.phase = phase;
		V.c_done = V.c_bytes = V.c_msgs = 0;
		V.want_id = 0;
		V.want_hit = false;
		memset(V.rx, 0, size);
		drain_scq();
		post_recvs();
		stats_snapshot();
	}
	memset(&m, 0, sizeof m);
	m.v[0] = phase;
	m.v[1] = size;
	m.v[2] = iters;
	cpu0 = cpu_ns(); /* the server's window starts as START arrives, ours as it leaves */
	ctl_send(CTL_START, &m);
	ctl_recv(CTL_READY, &m, CTL_TIMEOUT_MS, "READY");

	if (test_lat()) {
		struct lat_run lr;
		double scale = test_kind() == K_READ ? 1.0 : 0.5;
		double vf = NAN;

		if (opt.raw_tcp)
			tcp_client_lat(size, iters, warm, &lr);
		else if (opt.raw)
			raw_client_lat(size, iters, warm, &lr);
		else
			vb_client_lat(size, iters, warm, &lr);
		memset(&m, 0, sizeof m);
		m.v[0] = phase;
		m.v[1] = lr.pings;
		ctl_send(CTL_DONE, &m);
		ctl_recv(CTL_REPORT, &m, CTL_TIMEOUT_MS, "its report");
		report_get(&m, phase, &rep);
		/* valid bytes in the target's records (raw: bytes it received) / bytes sent */
		if (lr.pings)
			vf = (double)(opt.raw ? rep.bytes : rep.valid) / ((double)lr.pings * (double)size);
		if (!opt.raw)
			stats_log(label);
		print_lat_row(size, lr.nsamp, scale, vf, lr.lost, lr.pings);
	} else {
		struct bw_run br;
		struct dgv_qp_stats st1;
		uint64_t bytes, msgs, elapsed;
		double vf = NAN;

		memset(&st1, 0, sizeof st1);

		if (opt.raw_tcp)
			tcp_client_bw(size, iters, &br);
		else if (opt.raw)
			raw_client_bw(size, iters, &br);
		else
			vb_client_bw(size, iters, &br);
		memset(&m, 0, sizeof m);
		m.v[0] = phase;
		m.v[1] = br.posted;
		m.v[2] = br.posted * size;
		if (!opt.raw && dgv_qp_stats(V.qp, &st1) == 0)
			m.v[3] = st1.tx_datagrams - V.st0.tx_datagrams;
		ctl_send(CTL_DONE, &m);
		ctl_recv(CTL_REPORT, &m, CTL_TIMEOUT_MS, "its report");
		t_report = now_ns();
		g_detail.cpu_client_ns = cpu_ns() - cpu0;
		report_get(&m, phase, &rep);
		if (!opt.raw && test_kind() == K_READ) {
			bytes = V.c_bytes;
			msgs = V.c_msgs;
			elapsed = br.t_end - br.t_start;
			if (br.lost)
				vlog("size %" PRIu64 ": %" PRIu64 " Reads never completed", size, br.lost);
		} else {
			elapsed = bw_elapsed(br.t_start, t_report, br.t_end, &rep);
			msgs = rep.count;
			bytes = rep.bytes;
			if (test_kind() == K_WR && !opt.raw)
				bytes = rep.valid;
			if (test_kind() == K_WR)
				vf = (double)bytes / ((double)br.posted * (double)size);
			if (test_kind() == K_WRITE && !opt.raw)
				write_delivered(size, &st1, &rep, &bytes, &msgs);
		}
		if (!opt.raw)
			stats_log(label);
		uint64_t cpu_client = g_detail.cpu_client_ns;
		memset(&g_detail, 0, sizeof g_detail);
		g_detail.cpu_client_ns = cpu_client;
		g_detail.cpu_server_ns = rep.cpu_ns;
		g_detail.sent = br.posted;
		if (!opt.raw && dgv_qp_stats(V.qp, &st1) == 0) {
			/* after the server's report: retransmissions up to the last acknowledgement */
			g_detail.qp_stats = true;
			g_detail.tx_dg = st1.tx_datagrams - V.st0.tx_datagrams;
			g_detail.tx_bytes = st1.tx_bytes - V.st0.tx_bytes;
			g_detail.retx = st1.rd_retransmits - V.st0.rd_retransmits;
			g_detail.peer_drops = rep.fault_drops;
		}
		if (opt.raw)
			vlog("size %" PRIu64 ": server received %" PRIu64 " datagrams", size, rep.dgrams);
		vlog("size %" PRIu64 ": last local completion %.3f ms after the first post; the receiver's last "
		     "arrival %.3f ms", size, (double)(br.t_end - br.t_start) / 1e6, (double)elapsed / 1e6);
		vlog("size %" PRIu64 ": CPU over the phase: client %.3f s, server %.3f s (%.2f s per GB delivered)",
		     size, (double)g_detail.cpu_client_ns / 1e9, (double)rep.cpu_ns / 1e9,
		     bytes ? (double)(g_detail.cpu_client_ns + rep.cpu_ns) / (double)bytes : 0.0);
		print_bw_row(size, iters, bytes, msgs, elapsed ? elapsed : 1, vf);
	}
}

/* Serves phases until the client says BYE. */
static void server_phases(void)
{
	struct ctl_msg m;

	for (uint64_t expect = 1;; expect++) {
		uint64_t size, iters, budget;
		struct report rep;
		char label[48];

		ctl_recv(CTL_ANY, &m, CTL_TIMEOUT_MS, "the next size");
		if (m.type == CTL_BYE) {
			memset(&m, 0, sizeof m);
			ctl_send(CTL_BYE, &m);
			return;
		}
		if (m.type != CTL_START)
			die(1, "control channel: got %s while waiting for START", ctl_names[m.type]);
		uint64_t cpu0 = cpu_ns();
		size = m.v[1];
		iters = m.v[2];
		if (m.v[0] != expect || size == 0 || size > max_msg_size() || iters == 0 || iters > MAX_ITERS)
			die(1, "control channel: bad START (phase %" PRIu64 ", size %" PRIu64 ", iters %" PRIu64
			    ")", m.v[0], size, iters);
		snprintf(label, sizeof label, "size %" PRIu64 ":", size);
		memset(&rep, 0, sizeof rep);
		if (!opt.raw) {
			V.phase = expect;
			memset(V.rx, 0, size);
			drain_scq();
			post_recvs();
			stats_snapshot();
		}
		budget = now_ns() + phase_budget_ns(size, iters);
		memset(&m, 0, sizeof m);
		m.v[0] = expect;
		ctl_send(CTL_READY, &m);
		if (opt.raw_tcp) {
			if (test_lat())
				tcp_server_lat(size, budget, &rep);
			else
				tcp_server_bw(size, iters, budget, &rep);
		} else if (opt.raw) {
			if (test_lat())
				raw_server_lat(size, budget, &rep);
			else
				raw_server_bw(size, iters, budget, &rep);
		} else {
			if (test_lat())
				vb_server_lat(size, budget, &rep);
			else
				vb_server_bw(size, iters, budget, &rep);
			stats_log(label);
			struct dgv_qp_stats st;
			if (dgv_qp_stats(V.qp, &st) == 0)
				rep.fault_drops = st.fault_dropped - V.st0.fault_dropped;
		}
		vlog("size %" PRIu64 ": received %" PRIu64 " messages, %" PRIu64 " bytes, %" PRIu64
		     " valid of %" PRIu64 " recorded", size, rep.count, rep.bytes, rep.valid, rep.lensum);
		rep.cpu_ns = cpu_ns() - cpu0;
		report_put(&m, expect, &rep);
		ctl_send(CTL_REPORT, &m);
	}
}

int main(int argc, char **argv)
{
	union dgv_sockaddr local, peer;
	socklen_t llen, plen;
	struct ctl_msg m;
	uint64_t maxit = 0;
	char extra[200];

	parse_options(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	g_server = opt.peer == NULL;

	/* sample array for the largest iteration count of the run (latency tests only) */
	if (test_lat() && !g_server) {
		for (uint64_t s = opt.sweep ? 1 : opt.size; s <= max_msg_size(); s *= 2) {
			uint64_t it = iters_for(s) + warmup_for(iters_for(s));

			if (it > maxit)
				maxit = it;
			if (!opt.sweep)
				break;
		}
		g_samples_cap = maxit;
		g_samples = malloc(maxit * sizeof *g_samples);
		if (!g_samples)
			die(1, "cannot allocate %" PRIu64 " samples", maxit);
		memset(g_samples, 0, maxit * sizeof *g_samples);
	}

	/* control connection and handshake */
	if (g_server) {
		g_ctl = ctl_accept(opt.port);
		ctl_recv(CTL_HELLO, &m, CTL_TIMEOUT_MS, "HELLO");
		hello_check(&m);
		memset(&m, 0, sizeof m);
		ctl_send(CTL_HELLO_OK, &m);
	} else {
		g_ctl = ctl_connect(opt.peer, opt.port);
		hello_fill(&m);
		ctl_send(CTL_HELLO, &m);
		ctl_recv(CTL_HELLO_OK, &m, CTL_TIMEOUT_MS, "HELLO_OK");
	}
	ctl_local_peer(&local, &llen, &peer, &plen);

	if (opt.raw_tcp)
		tcp_setup(&local, &peer);
	else if (opt.raw)
		raw_setup(&local, &peer);
	else
		vb_setup(&local, &peer);

	if (g_server) {
		server_phases();
	} else {
		const char *env_tx = dg_env_str(DG_ENV_FAULT_TX), *env_rx = dg_env_str(DG_ENV_FAULT_RX);
		int n = 0;
		uint64_t phase = 0;

		if (opt.raw_tcp)
			n += snprintf(extra + n, sizeof extra - (size_t)n, " (one plain TCP connection, "
				      "TCP_NODELAY, one send() per message)");
		else if (opt.raw)
			n += snprintf(extra + n, sizeof extra - (size_t)n, " (plain UDP sockets), %u-byte datagrams",
				      R.seg);
		else if (opt.transport == TR_RC)
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", MPA rev %u, CRC %s, markers %s",
				      V.conn.mpa_rev, V.conn.crc ? "on" : "off",
				      V.conn.markers_rx || V.conn.markers_tx ? "on" : "off");
		else if (opt.seg_set)
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", seg %u", opt.seg);
		else
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", seg default");
		if (!data_on_tcp())
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", loss %g%%",
				      opt.loss_set ? opt.loss : 0.0);
		if (!opt.raw && ((env_tx && *env_tx) || (!opt.loss_set && env_rx && *env_rx)))
			snprintf(extra + n, sizeof extra - (size_t)n, " + environment faults");
		print_header(opt.raw ? "none" : dgv_provider_name(V.ctx), extra);
		for (uint64_t s = opt.sweep ? 1 : opt.size; s <= max_msg_size(); s *= 2) {
			client_phase(++phase, s);
			if (!opt.sweep)
				break;
		}
		memset(&m, 0, sizeof m);
		ctl_send(CTL_BYE, &m);
		ctl_recv(CTL_BYE, &m, CTL_TIMEOUT_MS, "BYE");
	}

	if (opt.raw_tcp) {
		close(T.fd);
		free(T.tx);
		free(T.rx);
	} else if (opt.raw) {
		close(R.fd);
		free(R.txbuf);
		free(R.rxbuf);
	} else {
		vb_teardown();
	}
	if (g_lfd >= 0)
		close(g_lfd);
	close(g_ctl);
	g_ctl = -1;
	free(g_samples);
	return 0;
}
