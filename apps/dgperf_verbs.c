/*
 * dgperf_verbs.c - dgperf, the verbs data path: state, posting, completions; RC set-up, tear-down.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* ---------------------------------------------------------------- verbs: state */

struct verbs_state V;

static struct dgv_fault g_fault_rx;

/*
 * Server: a client that is alive but stuck (stopped, wedged) sends nothing and never says DONE;
 * CLIENT_SILENCE_NS without a single datagram ends the server instead of the phase budget.
 */
#define CLIENT_SILENCE_NS (60 * NS_PER_S)

void watch_client(struct watch *w, uint64_t t, const struct report *rep, uint64_t size)
{
	uint64_t v = rep->dgrams;

	if (t < w->next)
		return;
	w->next = t + NS_PER_S;
	if (!opt.raw) {
		struct dgv_qp_stats st;

		v = dgv_qp_stats(V.qp, &st) == 0 ? st.rx_datagrams + st.rx_bytes : 0;
	}
	if (w->since == 0 || v != w->val) {
		w->val = v;
		w->since = t;
	} else if (t - w->since > CLIENT_SILENCE_NS) {
		die(1, "the client sent nothing for %.0f s at %" PRIu64 " B (stopped?)",
		    (double)CLIENT_SILENCE_NS / 1e9, size);
	}
}

bool server_tick(uint64_t t, uint64_t *next_ctl, struct watch *w, const struct report *rep, uint64_t size,
		 uint64_t budget_dl)
{
	if (t < *next_ctl)
		return false;
	*next_ctl = t + CTL_POLL_NS;
	if (ctl_readable()) {
		struct ctl_msg m;

		ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
		return true;
	}
	watch_client(w, t, rep, size);
	if (t > budget_dl)
		die(1, "the client did not finish size %" PRIu64 " in time", size);
	return false;
}

static const char *wc_status_str(enum dgv_wc_status s)
{
	switch (s) {
	case DGV_WC_SUCCESS: return "SUCCESS";
	case DGV_WC_LOC_LEN_ERR: return "LOC_LEN_ERR (message longer than the posted buffer)";
	case DGV_WC_LOC_PROT_ERR: return "LOC_PROT_ERR (local protection error)";
	case DGV_WC_LOC_QP_OP_ERR: return "LOC_QP_OP_ERR (opcode not valid on this QP)";
	case DGV_WC_WR_FLUSH_ERR: return "WR_FLUSH_ERR (flushed)";
	case DGV_WC_REM_ACCESS_ERR: return "REM_ACCESS_ERR (the target rejected the access)";
	case DGV_WC_REM_OP_ERR: return "REM_OP_ERR (the target reported an error)";
	case DGV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR (the peer stayed silent)";
	case DGV_WC_PARTIAL: return "PARTIAL";
	case DGV_WC_GENERAL_ERR: return "GENERAL_ERR";
	}
	return "unknown status";
}

static const char *wc_opcode_str(enum dgv_wc_opcode o)
{
	switch (o) {
	case DGV_WC_SEND: return "SEND";
	case DGV_WC_WRITE: return "WRITE";
	case DGV_WC_WRITE_RECORD: return "WRITE_RECORD";
	case DGV_WC_READ: return "READ";
	case DGV_WC_RECV: return "RECV";
	case DGV_WC_RECV_WRITE_RECORD: return "RECV_WRITE_RECORD";
	case DGV_WC_RECV_PLAIN: return "RECV_PLAIN";
	case DGV_WC_SEND_PLAIN: return "SEND_PLAIN";
	}
	return "?";
}

static void rc_explain(void);

void check_wc(const struct dgv_wc *wc, const char *cq)
{
	struct dgv_async_err e[4];
	int n;

	if (wc->status == DGV_WC_SUCCESS || wc->status == DGV_WC_PARTIAL)
		return;
	/* The QP's error queue says why (e.g. the peer's Terminate). */
	n = V.qp ? dgv_poll_errq(V.qp, 4, e) : 0;
	for (int i = 0; i < n; i++)
		fprintf(stderr, "dgperf: QP error queue: %s (%s, layer %u type %u code %u, msn %u)\n",
			dgv_err_str(e[i].layer, e[i].etype, e[i].ecode),
			e[i].remote ? "reported by the peer" : "detected here", e[i].layer, e[i].etype,
			e[i].ecode, e[i].msn);
	rc_explain();
	die(1, "failed completion on the %s CQ: status %s (%d), opcode %s, wr_id %#" PRIx64
	    ", byte_len %u", cq, wc_status_str(wc->status), (int)wc->status,
	    wc_opcode_str(wc->opcode), wc->wr_id, wc->byte_len);
}

bool transient(int r) { return r == -ENOMEM || r == -EAGAIN || r == -ENOBUFS || r == -ENOSPC; }

/* --event: sleeps until cq holds a completion or EVENT_WAIT_MS pass; the provider progresses
 * meanwhile. Dies on an error other than the time-out or a signal. */
void cq_event_wait(struct dgv_cq *cq)
{
	int r = dgv_cq_wait(cq, EVENT_WAIT_MS);

	if (r && r != -ETIMEDOUT && r != -EINTR)
		die(1, "dgv_cq_wait: %s", strerror(-r));
}

/* Polls the send CQ once (drives progress), accounting completions of the current phase. */
int drain_scq(void)
{
	int n = dgv_poll_cq(V.scq, WC_BATCH, V.wcs);

	if (n < 0)
		die(1, "dgv_poll_cq (send CQ): %s", strerror(-n));
	if (n == 0)
		return 0;
	for (int i = 0; i < n; i++) {
		const struct dgv_wc *wc = &V.wcs[i];

		V.sq_out--;
		check_wc(wc, "send");
		if (wc->wr_id >> 32 == CR_TAG) {
			V.cr_inflight--;
			continue;
		}
		if (wc->wr_id >> 32 != V.phase)
			continue;
		V.c_done++;
		if (wc->opcode == DGV_WC_READ) {
			uint64_t b = wc->status == DGV_WC_PARTIAL ? wc->record.valid_bytes : wc->byte_len;

			V.c_bytes += b;
			V.c_msgs += b > 0;
			if (wc->wr_id == V.want_id) {
				V.want_hit = true;
				V.want_bytes = b;
			}
		}
	}
	V.t_last_c = now_ns();
	return n;
}

/* Posts one WR; while the send queue is full, reaps completions until deadline. */
bool post_one(struct dgv_send_wr *wr, uint64_t deadline)
{
	for (unsigned spin = 0;; spin++) {
		struct dgv_send_wr *bad = NULL;
		int r = dgv_post_send(V.qp, wr, &bad);

		if (r == 0) {
			V.sq_out++;
			return true;
		}
		if (!transient(r))
			die(1, "dgv_post_send: %s", strerror(-r));
		drain_scq();
		if ((spin & 15) == 15 && now_ns() > deadline)
			return false;
	}
}

void post_recvs(void)
{
	while (V.rq_posted < V.rq_want) {
		long k = V.rq_want - V.rq_posted;
		struct dgv_recv_wr *bad = NULL;
		int r;

		if (k > RCHAIN)
			k = RCHAIN;
		for (long j = 0; j < k; j++)
			V.rwr[j].next = j + 1 < k ? &V.rwr[j + 1] : NULL;
		r = dgv_post_recv(V.qp, V.rwr, &bad);
		if (r == 0) {
			V.rq_posted += k;
			V.rq_total += (uint64_t)k;
			continue;
		}
		if (!transient(r))
			die(1, "dgv_post_recv: %s", strerror(-r));
		for (struct dgv_recv_wr *w = V.rwr; w && w != bad; w = w->next) {
			V.rq_posted++;
			V.rq_total++;
		}
		return; /* the receive queue is fuller than we thought: try again later */
	}
}

void prepare_wr(struct dgv_send_wr *wr, struct dgv_sge *sge, uint64_t size, bool echo)
{
	memset(wr, 0, sizeof *wr);
	memset(sge, 0, sizeof *sge);
	sge->lkey = V.mr->lkey;
	sge->length = (uint32_t)size;
	sge->addr = (uintptr_t)(echo ? V.rx : V.tx);
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->send_flags = DGV_SEND_SIGNALED;
	wr->ah = V.ah;
	wr->rkey = V.r_rkey;
	switch (test_kind()) {
	case K_SEND:
		wr->opcode = DGV_WR_SEND;
		break;
	case K_WR:
		wr->opcode = DGV_WR_WRITE_RECORD;
		wr->remote_addr = V.r_base + V.area;
		break;
	case K_WRITE:
		wr->opcode = DGV_WR_WRITE;
		wr->remote_addr = V.r_base + V.area;
		break;
	case K_READ:
		wr->opcode = DGV_WR_READ;
		sge->addr = (uintptr_t)V.rx;       /* sink: our target half */
		wr->remote_addr = V.r_base;        /* source: the peer's source half */
		break;
	}
}

void stats_snapshot(void)
{
	if (dgv_qp_stats(V.qp, &V.st0))
		memset(&V.st0, 0, sizeof V.st0);
}

void stats_log(const char *label)
{
	struct dgv_qp_stats s;
	const struct dgv_qp_stats *o = &V.st0;

	if (!opt.verbose || dgv_qp_stats(V.qp, &s))
		return;
#define D(f) (s.f - o->f)
	vlog("%s QP: tx %" PRIu64 " dg/%" PRIu64 " msgs, rx %" PRIu64 " dg/%" PRIu64
	     " msgs; drops: no_wqe %" PRIu64 " reasm_timeout %" PRIu64 " crc %" PRIu64 " malformed %"
	     PRIu64 " placement %" PRIu64 " dup %" PRIu64 " cq_overflow %" PRIu64 " fault %" PRIu64
	     "; rd: retransmits %" PRIu64 " window_stalls %" PRIu64 " ooo_buffered %" PRIu64 " timeouts %" PRIu64 " probes %" PRIu64, label, D(tx_datagrams), D(tx_msgs),
	     D(rx_datagrams), D(rx_msgs), D(no_wqe_drops), D(reasm_timeouts), D(crc_drops),
	     D(malformed_drops), D(placement_rejects), D(dup_drops), D(cq_overflows), D(fault_dropped),
	     D(rd_retransmits), D(rd_window_stalls), D(rd_ooo_buffered), D(rd_timeouts), D(rd_probes));
#undef D
}

static void die_stats(void)
{
	stats_log("at the failure:");
}

/* ---------------------------------------------------------------- verbs: RC connection set-up */

/*
 * RC: the client's dgv_connect() goes to the server's TCP PORT, where the provider listens on the
 * control port's listening socket (dgv_listen with adopt_fd). Each side's buffer (address, length,
 * STag) travels in the MPA private data: the client's in the MPA Request, the server's in the
 * Reply. The same private data carries the run's cookie (a stray connection request is rejected)
 * and the server's credits (below).
 *
 * Credits: an RC Send that finds no posted receive ends the connection (RFC 5040: no RNR on
 * iWARP), and a local completion only says the data went to TCP. So for send_bw the client may
 * post a Send only while the server has a receive posted for it: the server's Reply says how many
 * receives it posts first, and the server RDMA-Writes the total it has ever posted into the
 * client's credit word whenever it reposted a quarter of that (as rsockets do). wr_bw uses the
 * same scheme for the server's receive CQ: at most RC_WR_WINDOW Write-Records the server has not
 * polled yet. The credit word is 16 bytes (total, ~total) in a page after the two halves, so a
 * torn read is recognised.
 */
#define RC_PD_MAGIC 0x44475243u /* "DGRC" */
#define RC_RQ 256u              /* receives the RC server keeps posted (send_bw) */
#define RC_EVENT_NS ((uint64_t)(CONNECT_TIMEOUT_MS + 5000) * NS_PER_MS)

struct rc_pdata { /* big-endian in the private data */
	uint32_t magic, version;
	uint64_t cookie, base, len, area;
	uint32_t rkey, credits;
};

static uint8_t *credit_word(void) { return V.buf + 2 * V.area; }

static void pdata_put(struct rc_pdata *p, uint32_t credits)
{
	p->magic = htobe32(RC_PD_MAGIC);
	p->version = htobe32(CTL_VERSION);
	p->cookie = htobe64(g_cookie);
	p->base = htobe64((uintptr_t)V.buf);
	p->len = htobe64(V.buflen);
	p->area = htobe64(V.area);
	p->rkey = htobe32(V.mr->rkey);
	p->credits = htobe32(credits);
}

/* NULL when the private data is this run's (decoded into *p), else why not. */
static const char *pdata_get(const uint8_t *d, uint16_t n, struct rc_pdata *p)
{
	memset(p, 0, sizeof *p);
	if (n < sizeof *p)
		return "no dgperf private data in the MPA frame";
	memcpy(p, d, sizeof *p);
	p->magic = be32toh(p->magic);
	p->version = be32toh(p->version);
	p->cookie = be64toh(p->cookie);
	p->base = be64toh(p->base);
	p->len = be64toh(p->len);
	p->area = be64toh(p->area);
	p->rkey = be32toh(p->rkey);
	p->credits = be32toh(p->credits);
	if (p->magic != RC_PD_MAGIC)
		return "no dgperf private data in the MPA frame";
	if (p->version != CTL_VERSION)
		return "private data of another dgperf version";
	if (p->cookie != g_cookie)
		return "private data without this run's cookie";
	if (p->area != V.area || p->len < 2 * V.area + CTL_PAGE)
		return "the peer's buffer layout differs from ours";
	return NULL;
}

static const char *cm_ev_name(enum dgv_cm_event_type t)
{
	switch (t) {
	case DGV_CM_CONNECT_REQUEST: return "CONNECT_REQUEST";
	case DGV_CM_ESTABLISHED: return "ESTABLISHED";
	case DGV_CM_REJECTED: return "REJECTED";
	case DGV_CM_CONNECT_ERROR: return "CONNECT_ERROR";
	case DGV_CM_DISCONNECTED: return "DISCONNECTED";
	case DGV_CM_PEER_CLOSED: return "PEER_CLOSED";
	}
	return "unknown event";
}

/* One line about an event: its type, status, the Terminate triple and printable private data. */
static const char *cm_ev_str(const struct dgv_cm_event *ev, char *buf, size_t n)
{
	size_t k = 0;
	int w = snprintf(buf, n, "%s", cm_ev_name(ev->type));

	k = w > 0 && (size_t)w < n ? (size_t)w : n - 1;
	if (ev->status && ev->type != DGV_CM_REJECTED && k < n) {
		int e = -ev->status;

		w = snprintf(buf + k, n - k, ": %s", e == ECONNREFUSED ? "connection refused (nobody listening)" :
			     e == ETIMEDOUT ? "timed out (TCP connect or MPA exchange)" :
			     e == EPROTO ? "protocol error (malformed or unexpected MPA/DDP/RDMAP)" :
			     e == ECONNRESET ? "connection reset by the peer" : strerror(e));
		k += w > 0 ? (size_t)w : 0;
	}
	if ((ev->term_layer || ev->term_etype || ev->term_ecode) && k < n) {
		w = snprintf(buf + k, n - k, "; Terminate: %s (layer %u type %u code %u)",
			     dgv_err_str(ev->term_layer, ev->term_etype, ev->term_ecode), ev->term_layer,
			     ev->term_etype, ev->term_ecode);
		k += w > 0 ? (size_t)w : 0;
	}
	if (ev->pdata_len && k < n) {
		bool text = true;

		for (uint16_t i = 0; i < ev->pdata_len && text; i++)
			text = (ev->pdata[i] >= 0x20 && ev->pdata[i] < 0x7f) || (!ev->pdata[i] && i + 1 == ev->pdata_len);
		if (text)
			snprintf(buf + k, n - k, "; peer says \"%.*s\"", (int)ev->pdata_len, (const char *)ev->pdata);
	}
	return buf;
}

/* After a failed completion on RC: the connection events say why (printed, not consumed). */
static void rc_explain(void)
{
	struct dgv_cm_event ev;
	char b[400];

	if (!V.ch)
		return;
	while (dgv_cm_get_event(V.ch, &ev) == 0)
		fprintf(stderr, "dgperf: RC connection event: %s\n", cm_ev_str(&ev, b, sizeof b));
}

/* Client: the total number of messages the server has room for (see Credits above). */
uint64_t rc_credit(void)
{
	const volatile uint64_t *w = (const volatile uint64_t *)(const void *)credit_word();
	uint64_t a = be64toh(w[0]), b = be64toh(w[1]);

	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (b == ~a && a > V.credit)
		V.credit = a;
	return V.credit;
}

/* Server: tells the client its new total once it grew by a quarter of the window. */
void rc_give_credit(uint64_t total)
{
	uint64_t step = (test_kind() == K_SEND ? V.max_recv_wr : RC_WR_WINDOW) / 4, a, b;
	struct dgv_send_wr wr, *bad = NULL;
	struct dgv_sge sge;
	uint8_t *slot;
	int r;

	if (total - V.cr_given < step)
		return;
	if (V.cr_inflight >= (long)CR_SLOTS) {
		drain_scq();
		if (V.cr_inflight >= (long)CR_SLOTS)
			return;
	}
	slot = credit_word() + 64 + (V.cr_seq % CR_SLOTS) * 16; /* untouched until its Write completes */
	a = htobe64(total);
	b = htobe64(~total);
	memcpy(slot, &a, 8);
	memcpy(slot + 8, &b, 8);
	memset(&wr, 0, sizeof wr);
	sge.addr = (uintptr_t)slot;
	sge.length = 16;
	sge.lkey = V.mr->lkey;
	wr.wr_id = CR_TAG << 32 | (V.cr_seq & 0xffffffffu);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = DGV_WR_WRITE;
	wr.send_flags = DGV_SEND_SIGNALED;
	wr.remote_addr = V.r_base + 2 * V.area;
	wr.rkey = V.r_rkey;
	r = dgv_post_send(V.qp, &wr, &bad);
	if (r) {
		if (!transient(r))
			die(1, "dgv_post_send (credit Write): %s", strerror(-r));
		return; /* the send queue is full: next time */
	}
	V.sq_out++;
	V.cr_inflight++;
	V.cr_seq++;
	V.cr_given = total;
}

/* The next connection event by deadline (false at the deadline); the peer's ERR or death on the
 * control connection ends us meanwhile. */
static bool rc_next_event(struct dgv_cm_event *ev, uint64_t deadline)
{
	for (;;) {
		int r = dgv_cm_get_event(V.ch, ev);
		uint64_t t;

		if (r == 0)
			return true;
		if (r != -EAGAIN)
			die(1, "dgv_cm_get_event: %s", strerror(-r));
		ctl_check_peer();
		t = now_ns();
		if (t >= deadline)
			return false;
		r = dgv_cm_wait(V.ch, (int)((deadline - t) / NS_PER_MS < 100 ? (deadline - t) / NS_PER_MS + 1 : 100));
		if (r && r != -ETIMEDOUT && r != -EINTR && r != -EAGAIN)
			die(1, "dgv_cm_wait: %s", strerror(-r));
	}
}

static void __attribute__((noreturn)) rc_unsupported(const char *call, int r)
{
	die(2, "transport RC is not supported by the %s provider (%s: %s)", dgv_provider_name(V.ctx), call,
	    strerror(-r));
}

/* Waits for ESTABLISHED of our QP; anything else about it is fatal, naming the cause. */
static void rc_wait_established(const char *what, struct rc_pdata *peer_pd)
{
	uint64_t dl = now_ns() + RC_EVENT_NS;
	struct dgv_cm_event ev;
	char b[400];

	for (;;) {
		if (!rc_next_event(&ev, dl))
			die(1, "%s: no ESTABLISHED, REJECTED or CONNECT_ERROR within %.0f s", what,
			    (double)RC_EVENT_NS / 1e9);
		if (ev.type == DGV_CM_CONNECT_REQUEST) { /* server: a second request while we accept */
			vlog("rejected a second connection request");
			dgv_reject(ev.req, "dgperf: busy", 12);
			continue;
		}
		if (ev.qp != V.qp) {
			vlog("ignored %s about another connection", cm_ev_str(&ev, b, sizeof b));
			continue;
		}
		if (ev.type == DGV_CM_REJECTED)
			die(1, "%s: the server rejected the connection (MPA Reply with the Reject bit)%s", what,
			    cm_ev_str(&ev, b, sizeof b) + strlen("REJECTED"));
		if (ev.type != DGV_CM_ESTABLISHED)
			die(1, "%s failed: %s", what, cm_ev_str(&ev, b, sizeof b));
		if (peer_pd) {
			const char *why = pdata_get(ev.pdata, ev.pdata_len, peer_pd);

			if (why)
				die(1, "%s: the server's MPA Reply: %s", what, why);
		}
		V.conn = ev.info;
		sa_normalize(&V.conn.local, &V.conn.local_len); /* (a dual-stack listener's v4-mapped) */
		sa_normalize(&V.conn.peer, &V.conn.peer_len);
		V.rc_up = true;
		return;
	}
}

static void rc_setup(struct dgv_qp_init_attr *qa, const union dgv_sockaddr *ctl_peer)
{
	struct dgv_conn_param param;
	struct rc_pdata mine, theirs;
	struct ctl_msg m;
	char s1[80], s2[80];
	int r;

	r = dgv_cm_create_channel(V.ctx, &V.ch);
	if (r == -EOPNOTSUPP || r == -ENOSYS)
		rc_unsupported("dgv_cm_create_channel", r);
	if (r)
		die(1, "dgv_cm_create_channel: %s", strerror(-r));
	qa->cm_channel = V.ch;
	memset(&param, 0, sizeof param);
	param.crc = -1;
	param.private_data = &mine;
	param.private_data_len = sizeof mine;

	if (g_server) {
		uint32_t credits = test_kind() == K_SEND ? (test_lat() ? RQ_LAT : RC_RQ) : RC_WR_WINDOW;
		uint64_t dl;
		struct dgv_cm_event ev;

		uint16_t own_port = 0;
		r = dgv_listen(V.ctx, NULL, 0, 4, g_lfd, V.ch, NULL, &V.lst);
		struct dgv_caps caps = {0};
		dgv_query_caps(V.ctx, &caps);
		if (r == -EOPNOTSUPP && !(caps.flags & DGV_CAP_ADOPT_FD)) {
			/* a provider that cannot listen on our socket (a device: its own kernel TCP
			 * port, which our control socket already holds): a port of its choice on the
			 * control connection's address, told to the client in CTL_SETUP */
			union dgv_sockaddr la;
			socklen_t ll = sizeof la;
			if (getsockname(g_ctl, &la.sa, &ll))
				die(1, "getsockname (control connection): %s", strerror(errno));
			sa_normalize(&la, &ll);
			sa_set_port(&la, 0);
			r = dgv_listen(V.ctx, &la.sa, ll, 4, -1, V.ch, NULL, &V.lst);
			if (!r && (r = dgv_listener_addr(V.lst, &la, &ll)) == 0) {
				own_port = la.sa.sa_family == AF_INET ? ntohs(la.sin.sin_port) : ntohs(la.sin6.sin6_port);
				vlog("RC listener on its own TCP port %u (the device cannot share port %u)", own_port,
				     opt.port);
			}
		}
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_listen", r);
		if (r)
			die(1, "dgv_listen on TCP port %u: %s", opt.port, strerror(-r));
		g_cookie = make_cookie();
		memset(&m, 0, sizeof m);
		m.v[0] = g_cookie;
		m.v[1] = own_port; /* 0: the control port */
		ctl_send(CTL_SETUP, &m); /* "listening" */
		dl = now_ns() + RC_EVENT_NS;
		for (;;) {
			const char *why;
			char b[400];

			if (!rc_next_event(&ev, dl))
				die(1, "no RC connection request from the client on TCP port %u within %.0f s",
				    opt.port, (double)RC_EVENT_NS / 1e9);
			if (ev.type != DGV_CM_CONNECT_REQUEST) {
				/* a connection that failed before its MPA Request was read */
				vlog("listener: %s", cm_ev_str(&ev, b, sizeof b));
				if (ev.req)
					dgv_reject(ev.req, NULL, 0);
				continue;
			}
			why = pdata_get(ev.pdata, ev.pdata_len, &theirs);
			if (!why)
				break;
			if (theirs.magic == RC_PD_MAGIC && theirs.cookie == g_cookie) { /* our client, but wrong */
				char text[120];

				snprintf(text, sizeof text, "dgperf: %s", why);
				dgv_reject(ev.req, text, (uint16_t)strlen(text));
				die(1, "the client's MPA Request: %s (rejected)", why);
			}
			sa_normalize(&ev.info.peer, &ev.info.peer_len);
			vlog("rejected a connection request from %s: %s", sa_str(&ev.info.peer, b, sizeof b), why);
			dgv_reject(ev.req, "dgperf: not this run", 20);
		}
		pdata_put(&mine, credits);
		V.cr_given = credits; /* the client starts from these */
		r = dgv_accept(ev.req, V.pd, qa, &param, &V.qp);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_accept", r);
		if (r)
			die(1, "dgv_accept: %s", strerror(-r));
		g_die_hook = die_stats;
		rc_wait_established("RC accept", NULL);
	} else {
		union dgv_sockaddr dst;
		socklen_t dlen;

		ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its RC listener");
		g_cookie = m.v[0];
		data_dst(ctl_peer, &dst, &dlen);
		if (m.v[1] && m.v[1] <= 65535)
			sa_set_port(&dst, (unsigned)m.v[1]); /* the server's device listens on its own port */
		pdata_put(&mine, 0);
		r = dgv_connect(V.pd, qa, &dst.sa, dlen, &param, &V.qp);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_connect", r);
		if (r)
			die(1, "dgv_connect to TCP %s: %s", sa_str(&dst, s1, sizeof s1), strerror(-r));
		g_die_hook = die_stats;
		snprintf(s2, sizeof s2, "RC connection to TCP %s", sa_str(&dst, s1, sizeof s1));
		rc_wait_established(s2, &theirs);
		V.credit = theirs.credits;
	}
	/* the peer's buffer: the client's came in its MPA Request, the server's in its Reply */
	V.r_base = theirs.base;
	V.r_rkey = theirs.rkey;
	vlog("provider %s, RC %s -> %s, MPA rev %u, CRC %s, markers rx %s tx %s, IRD %u ORD %u, rkey %#x, "
	     "buffer 2 x %" PRIu64 " B", dgv_provider_name(V.ctx), sa_str(&V.conn.local, s1, sizeof s1),
	     sa_str(&V.conn.peer, s2, sizeof s2), V.conn.mpa_rev, V.conn.crc ? "on" : "off",
	     V.conn.markers_rx ? "on" : "off", V.conn.markers_tx ? "on" : "off", V.conn.ird, V.conn.ord,
	     V.r_rkey, V.area);
}

/* UD and RD: the QP is bound to a UDP address; address and MR go over the control channel. */
static void dg_setup(struct dgv_qp_init_attr *qa, const union dgv_sockaddr *bind_addr,
		     const union dgv_sockaddr *ctl_peer)
{
	union dgv_sockaddr mine, peer;
	socklen_t mlen = sizeof mine, plen;
	struct ctl_msg m;
	char s1[80], s2[80];
	int r;

	r = dgv_create_qp(V.pd, qa, &V.qp);
	if (r == -EINVAL && qa->max_recv_wr > 256) { /* the provider may cap the receive queue */
		qa->max_recv_wr = 0;
		r = dgv_create_qp(V.pd, qa, &V.qp);
	}
	if (r == -EADDRINUSE)
		die(1, "cannot bind the QP to UDP %s: %s", sa_str(bind_addr, s1, sizeof s1), strerror(-r));
	if (r == -EINVAL && opt.seg_set)
		die(2, "invalid --seg value %u for the %s provider: dgv_create_qp rejects it (%s); it must "
		    "leave room for the datagram headers and the provider's smallest segment",
		    opt.seg, dgv_provider_name(V.ctx), strerror(-r));
	if (r)
		die(1, "dgv_create_qp (%s, seg %u, bound to %s): %s", tr_names[opt.transport], qa->seg_size,
		    sa_str(bind_addr, s1, sizeof s1), strerror(-r));
	g_die_hook = die_stats;
	memset(&mine, 0, sizeof mine);
	r = dgv_qp_local_addr(V.qp, &mine, &mlen);
	if (r)
		die(1, "dgv_qp_local_addr: %s", strerror(-r));
	sa_normalize(&mine, &mlen);

	/* exchange QP address and MR */
	memset(&m, 0, sizeof m);
	msg_put_addr(&m, &mine);
	m.v[3] = (uintptr_t)V.buf;
	m.v[4] = V.mr->rkey;
	m.v[5] = V.buflen;
	m.v[6] = V.area;
	ctl_send(CTL_SETUP, &m);
	ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its QP address");
	msg_get_addr(&m, ctl_peer, &peer, &plen);
	if (m.v[6] != V.area || m.v[5] < 2 * V.area)
		die(1, "the %s registered %" PRIu64 " bytes with %" PRIu64 "-byte halves, we expected %"
		    PRIu64 "-byte halves", peer_role(), m.v[5], m.v[6], V.area);
	V.r_base = m.v[3];
	V.r_rkey = (uint32_t)m.v[4];
	r = dgv_create_ah(V.pd, &peer.sa, plen, &V.ah);
	if (r)
		die(1, "dgv_create_ah(%s): %s", sa_str(&peer, s1, sizeof s1), strerror(-r));
	vlog("provider %s, %s QP %s -> peer %s, rkey %#x, buffer 2 x %" PRIu64 " B",
	     dgv_provider_name(V.ctx), tr_names[opt.transport], sa_str(&mine, s1, sizeof s1),
	     sa_str(&peer, s2, sizeof s2), V.r_rkey, V.area);
}

void vb_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	struct dgv_context_attr ca = { .provider = opt.provider, .progress = DGV_PROGRESS_AUTO };
	struct dgv_qp_init_attr qa;
	union dgv_sockaddr bind_addr;
	socklen_t blen;
	int r;

	V.area = (max_msg_size() + 4095) & ~(uint64_t)4095;
	V.family = ctl_local->sa.sa_family;
	r = dgv_open(&ca, &V.ctx);
	if (r == -ENODEV)
		die(1, "the %s verbs provider is not available (dgv_open: %s)",
		    opt.provider == DGV_PROV_SOFT ? "soft" : opt.provider == DGV_PROV_IBVERBS ? "ibverbs" :
		    "default", strerror(-r));
	if (r)
		die(1, "dgv_open: %s", strerror(-r));
	r = dgv_alloc_pd(V.ctx, &V.pd);
	if (r)
		die(1, "dgv_alloc_pd: %s", strerror(-r));
	V.buflen = 2 * V.area + CTL_PAGE;
	if (posix_memalign((void **)&V.buf, 4096, (size_t)V.buflen))
		die(1, "cannot allocate %" PRIu64 " bytes", V.buflen);
	memset(V.buf, 0, (size_t)V.buflen);
	V.tx = V.buf;
	V.rx = V.buf + V.area;
	for (uint64_t i = 0; i < V.area; i++)
		V.tx[i] = (uint8_t)(i * 7 + 1);
	r = dgv_reg_mr(V.pd, V.buf, (size_t)V.buflen,
		       DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &V.mr);
	if (r)
		die(1, "dgv_reg_mr of %" PRIu64 " bytes: %s", V.buflen, strerror(-r));
	r = dgv_create_cq(V.ctx, SCQ_ENTRIES, &V.scq);
	if (r)
		die(1, "dgv_create_cq: %s", strerror(-r));
	r = dgv_create_cq(V.ctx, RCQ_ENTRIES, &V.rcq);
	if (r)
		die(1, "dgv_create_cq: %s", strerror(-r));

	bind_addr = *ctl_local;
	sa_set_port(&bind_addr, g_server ? opt.port : 0);
	blen = bind_addr.sa.sa_family == AF_INET ? sizeof bind_addr.sin : sizeof bind_addr.sin6;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = opt.transport == TR_UD ? DGV_QPT_UD : opt.transport == TR_RD ? DGV_QPT_RD : DGV_QPT_RC;
	qa.send_cq = V.scq;
	qa.recv_cq = V.rcq;
	qa.max_send_wr = SQ_WR;
	qa.max_recv_wr = test_kind() == K_SEND ? RQ_BW : 0;
	qa.seg_size = opt.seg_set ? opt.seg : 0;
	qa.bind_addr = &bind_addr.sa;
	qa.bind_len = blen;
	qa.bind_family = bind_addr.sa.sa_family;
	if (opt.loss_set) {
		memset(&g_fault_rx, 0, sizeof g_fault_rx);
		g_fault_rx.loss_pct = opt.loss;
		qa.fault_rx = &g_fault_rx;
	}
	if (opt.transport == TR_RC) {
		qa.max_recv_wr = RC_RQ;
		if (g_server) { /* dgv_accept uses the request's socket */
			qa.bind_addr = NULL;
			qa.bind_len = 0;
		} else {
			sa_set_port(&bind_addr, 0);
		}
		rc_setup(&qa, ctl_peer);
	} else {
		dg_setup(&qa, &bind_addr, ctl_peer);
	}
	V.max_recv_wr = qa.max_recv_wr ? qa.max_recv_wr : 256;

	V.rsge.addr = (uintptr_t)V.rx;
	V.rsge.length = (uint32_t)V.area;
	V.rsge.lkey = V.mr->lkey;
	for (int j = 0; j < RCHAIN; j++) {
		V.rwr[j].wr_id = j;
		V.rwr[j].sg_list = &V.rsge;
		V.rwr[j].num_sge = 1;
	}
	V.rq_want = 0;
	if (test_kind() == K_SEND) {
		if (g_server)
			V.rq_want = test_lat() ? RQ_LAT : (long)V.max_recv_wr;
		else
			V.rq_want = test_lat() ? RQ_LAT : 0;
	}
	post_recvs();
}

/* RC: an orderly close (both sides call it after BYE), bounded; then the objects go. */
static void rc_teardown(void)
{
	struct dgv_cm_event ev;
	uint64_t dl = now_ns() + 3 * NS_PER_S;
	char b[400];
	int r;

	if (!V.qp || !V.rc_up)
		return;
	r = dgv_disconnect(V.qp);
	if (r) {
		vlog("dgv_disconnect: %s", strerror(-r));
		return;
	}
	for (;;) {
		r = dgv_cm_get_event(V.ch, &ev);
		if (r == 0) {
			if (ev.type == DGV_CM_CONNECT_REQUEST) {
				dgv_reject(ev.req, NULL, 0);
				continue;
			}
			if (ev.qp == V.qp && ev.type == DGV_CM_DISCONNECTED) {
				if (ev.status)
					vlog("disconnect: %s", cm_ev_str(&ev, b, sizeof b));
				return;
			}
			continue;
		}
		if (r != -EAGAIN || now_ns() >= dl)
			break;
		dgv_cm_wait(V.ch, 50);
	}
	vlog("no DISCONNECTED within 3 s of dgv_disconnect (QP state %d)", (int)dgv_qp_state(V.qp));
}

void vb_teardown(void)
{
	int r;

	if (opt.transport == TR_RC)
		rc_teardown();
	if (V.ah && (r = dgv_destroy_ah(V.ah)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_ah: %s\n", strerror(-r));
	if ((r = dgv_destroy_qp(V.qp)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_qp: %s\n", strerror(-r));
	if (V.lst && (r = dgv_listener_destroy(V.lst)))
		fprintf(stderr, "dgperf: warning: dgv_listener_destroy: %s\n", strerror(-r));
	if (V.ch) {
		struct dgv_cm_event ev;

		while (dgv_cm_get_event(V.ch, &ev) == 0)
			if (ev.type == DGV_CM_CONNECT_REQUEST)
				dgv_reject(ev.req, NULL, 0);
		if ((r = dgv_cm_destroy_channel(V.ch)))
			fprintf(stderr, "dgperf: warning: dgv_cm_destroy_channel: %s\n", strerror(-r));
	}
	if ((r = dgv_destroy_cq(V.scq)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_cq: %s\n", strerror(-r));
	if ((r = dgv_destroy_cq(V.rcq)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_cq: %s\n", strerror(-r));
	if ((r = dgv_dereg_mr(V.mr)))
		fprintf(stderr, "dgperf: warning: dgv_dereg_mr: %s\n", strerror(-r));
	if ((r = dgv_dealloc_pd(V.pd)))
		fprintf(stderr, "dgperf: warning: dgv_dealloc_pd: %s\n", strerror(-r));
	dgv_close(V.ctx);
	free(V.buf);
}
