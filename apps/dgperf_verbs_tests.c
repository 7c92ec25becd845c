/*
 * dgperf_verbs_tests.c - dgperf, the verbs tests: latency and bandwidth, client and server loops.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* ---------------------------------------------------------------- verbs: latency */

static bool record_covers(const struct dgv_record *rec, uint64_t k)
{
	return rec->nranges > 0 && rec->ranges && rec->ranges[0].offset == 0 && rec->ranges[0].length >= k;
}

/* Waits for the pong on the receive CQ (send_lat: RECV; wr_lat: RECV_WRITE_RECORD) whose first
 * k bytes echo our ping; returns the time it was seen, or 0 at the deadline. */
static uint64_t wait_rcq_pong(uint64_t size, uint64_t k, uint64_t deadline)
{
	int kind = test_kind();

	for (unsigned spin = 1;; spin++) {
		int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
		uint64_t hit = 0;
		long consumed = 0;

		if (n < 0)
			die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
		for (int j = 0; j < n; j++) {
			const struct dgv_wc *wc = &V.wcr[j];

			check_wc(wc, "receive");
			if (wc->opcode == DGV_WC_RECV) {
				consumed++;
				if (kind == K_SEND && !hit && wc->byte_len == size && !memcmp(V.rx, V.tx, k))
					hit = now_ns();
			} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD) {
				if (kind == K_WR && !hit && wc->record.valid_bytes > 0 && wc->record.length == size &&
				    (!record_covers(&wc->record, k) || !memcmp(V.rx, V.tx, k)))
					hit = now_ns();
			}
		}
		if (consumed) {
			V.rq_posted -= consumed;
			post_recvs();
		}
		if (hit)
			return hit;
		if ((spin & 15) == 0) {
			drain_scq(); /* errors of our sends surface here */
			if (now_ns() > deadline)
				return 0;
		}
	}
}

/* write_lat: spin on the last byte of our target half until the peer's write changes it. */
static uint64_t wait_byte(const uint8_t *p, uint8_t val, uint64_t deadline)
{
	const volatile uint8_t *vp = p;

	for (unsigned spin = 1;; spin++) {
		if (*vp == val) {
			uint64_t t = now_ns();

			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			return t;
		}
		drain_scq(); /* drives progress, so the peer's write gets placed */
		if ((spin & 15) == 0 && now_ns() > deadline)
			return 0;
	}
}

static uint64_t wait_read(uint64_t deadline)
{
	for (unsigned spin = 1;; spin++) {
		drain_scq();
		if (V.want_hit)
			return V.want_bytes ? now_ns() : 0;
		if ((spin & 15) == 0 && now_ns() > deadline)
			return 0;
	}
}

/* After a lost round trip (client): is the server still there, and answering at all? */
void lat_timeout_check(uint64_t last_ok)
{
	ctl_check_peer();
	if (now_ns() - last_ok > LAT_SILENCE_NS)
		die(1, "%s: no round trip completed for %.0f s: the server stopped answering",
		    test_names[opt.test], (double)LAT_SILENCE_NS / 1e9);
}

static uint32_t g_seq;

void vb_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	struct dgv_send_wr wr;
	struct dgv_sge sge;
	int kind = test_kind();
	uint64_t k = size < 4 ? size : 4;
	uint64_t to = lat_timeout_ns(size, V.family), last_ok;

	prepare_wr(&wr, &sge, size, false);
	memset(out, 0, sizeof *out);
	last_ok = now_ns();
	for (uint64_t i = 0, good = 0; out->nsamp < iters && i < LAT_ATTEMPTS(warm + iters); i++) {
		uint32_t seq = ++g_seq;
		uint8_t val = (uint8_t)(seq % 255u + 1u);
		uint64_t t0, t1 = 0;

		if (kind == K_SEND || kind == K_WR)
			memcpy(V.tx, &seq, k);
		else if (kind == K_WRITE)
			V.tx[size - 1] = val;
		wr.wr_id = V.phase << 32 | (i & 0xffffffffu);
		V.want_id = wr.wr_id;
		V.want_hit = false;
		t0 = now_ns();
		if (post_one(&wr, t0 + to)) {
			out->pings++;
			switch (kind) {
			case K_SEND:
			case K_WR:
				t1 = wait_rcq_pong(size, k, t0 + to);
				break;
			case K_WRITE:
				t1 = wait_byte(V.rx + size - 1, val, t0 + to);
				break;
			case K_READ:
				t1 = wait_read(t0 + to);
				break;
			}
		}
		if (!t1) {
			if (reliable())
				die(1, "%s: no %s within %.1f s at %" PRIu64 " B (iteration %" PRIu64 "): is the "
				    "server alive?", test_names[opt.test],
				    kind == K_READ ? (V.want_hit ? "data in the Read's completion" :
						      "Read completion") : "reply",
				    (double)to / 1e9, size, i);
			out->lost++;
			lat_timeout_check(last_ok);
			continue;
		}
		last_ok = t1;
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
		drain_scq(); /* untimed: reap our send completions */
	}
}

/* The server side of a ping-pong (read_lat: passive, drives progress) until the client is done. */
void vb_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	struct dgv_send_wr wr;
	struct dgv_sge sge;
	int kind = test_kind();
	const volatile uint8_t *last = V.rx + size - 1;
	uint8_t seen = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS, i = 0;
	struct watch w = { 0, 0, 0 };

	prepare_wr(&wr, &sge, size, true);
	for (;;) {
		int arrivals = 0;

		if (kind == K_SEND || kind == K_WR) {
			int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
			long consumed = 0;

			if (n < 0)
				die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
			for (int j = 0; j < n; j++) {
				const struct dgv_wc *wc = &V.wcr[j];
				bool echo = false;

				check_wc(wc, "receive");
				if (wc->opcode == DGV_WC_RECV) {
					consumed++;
					rep->count++;
					rep->bytes += wc->byte_len;
					if (kind == K_SEND) {
						sge.length = wc->byte_len;
						echo = true;
					}
				} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD && wc->record.length == size) {
					/* (other lengths: late records of an earlier size) */
					rep->count++;
					rep->valid += wc->record.valid_bytes;
					rep->lensum += wc->record.length;
					echo = kind == K_WR;
				}
				if (echo) {
					wr.wr_id = V.phase << 32 | (i++ & 0xffffffffu);
					if (!post_one(&wr, now_ns() + lat_timeout_ns(size, V.family)) && reliable())
						die(1, "%s: the send queue stayed full", test_names[opt.test]);
				}
			}
			if (consumed) {
				V.rq_posted -= consumed;
				post_recvs();
			}
			arrivals = n;
			if (n == 0 || V.sq_out > 32)
				drain_scq();
		} else if (kind == K_WRITE) {
			uint8_t b = *last;

			if (b != seen) {
				__atomic_thread_fence(__ATOMIC_ACQUIRE);
				seen = b;
				rep->count++;
				wr.wr_id = V.phase << 32 | (i++ & 0xffffffffu);
				if (!post_one(&wr, now_ns() + lat_timeout_ns(size, V.family)) && reliable())
					die(1, "%s: the send queue stayed full", test_names[opt.test]);
				arrivals = 1;
			}
			drain_scq();
		} else {
			drain_scq();
		}
		if (!arrivals) {
			uint64_t t = now_ns();

			if (server_tick(t, &next_ctl, &w, rep, size, budget_dl))
				break;
		}
	}
}

/* ---------------------------------------------------------------- verbs: bandwidth */

void vb_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	unsigned depth = tx_depth(size);
	uint64_t posted = 0, last_progress, stall_ns, next_check;
	bool ud = opt.transport == TR_UD;

	bool credits = opt.transport == TR_RC && (test_kind() == K_SEND || test_kind() == K_WR);

	if (depth > SQ_WR / 2)
		depth = SQ_WR / 2;
	/* RC Reads beyond the negotiated ORD would only wait in the provider's queue */
	if (opt.transport == TR_RC && test_kind() == K_READ && V.conn.ord && depth > V.conn.ord)
		depth = V.conn.ord;
	stall_ns = !ud ? 60 * NS_PER_S : test_kind() == K_READ ? 2 * NS_PER_S : 10 * NS_PER_S;
	for (int j = 0; j < SCHAIN; j++)
		prepare_wr(&V.swr[j], &V.ssge[j], size, false);
	memset(out, 0, sizeof *out);
	out->t_start = last_progress = next_check = now_ns();
	while (V.c_done < iters) {
		uint64_t before = V.c_done, t;
		bool full = false; /* the provider refused a post: its queue is full */

		while (posted < iters && posted - V.c_done < depth) {
			uint64_t room = depth - (posted - V.c_done), k = iters - posted;
			struct dgv_send_wr *bad = NULL;
			int r;

			if (k > room)
				k = room;
			if (k > SCHAIN)
				k = SCHAIN;
			if (credits) {
				uint64_t c = rc_credit();

				if (V.cr_sent >= c)
					break; /* the server has no room: wait for its credit Write */
				if (k > c - V.cr_sent)
					k = c - V.cr_sent;
			}
			for (uint64_t j = 0; j < k; j++) {
				V.swr[j].wr_id = V.phase << 32 | ((posted + j) & 0xffffffffu);
				V.swr[j].next = j + 1 < k ? &V.swr[j + 1] : NULL;
			}
			r = dgv_post_send(V.qp, V.swr, &bad);
			if (r == 0) {
				posted += k;
				V.sq_out += (long)k;
				V.cr_sent += k;
				continue;
			}
			if (!transient(r))
				die(1, "dgv_post_send: %s", strerror(-r));
			for (struct dgv_send_wr *w = V.swr; w && w != bad; w = w->next) {
				posted++;
				V.sq_out++;
				V.cr_sent++;
			}
			full = true;
			break;
		}
		drain_scq();
		/* --event: nothing to post until a completion comes (a credit wait still spins) */
		if (opt.event && V.c_done == before && (full || posted == iters || posted - V.c_done >= depth))
			cq_event_wait(V.scq);
		t = V.c_done != before ? V.t_last_c : now_ns();
		if (t >= next_check) {
			next_check = t + CTL_CHECK_NS;
			ctl_check_peer();
		}
		if (V.c_done != before) {
			last_progress = V.t_last_c;
		} else if (t - last_progress > stall_ns) {
			if (ud && test_kind() == K_READ) {
				out->lost = posted - V.c_done;
				break;
			}
			if (credits && V.c_done == posted)
				die(1, "%s: no credit from the server for %.0f s at %" PRIu64 " B (%" PRIu64
				    " of %" PRIu64 " done; room for %" PRIu64 " messages in total, %" PRIu64
				    " sent)", test_names[opt.test], (double)stall_ns / 1e9, size, V.c_done, iters,
				    V.credit, V.cr_sent);
			die(1, "%s: no completion for %.0f s at %" PRIu64 " B (%" PRIu64 " of %" PRIu64
			    " done)", test_names[opt.test], (double)stall_ns / 1e9, size, V.c_done, iters);
		}
	}
	out->posted = posted;
	out->t_end = V.c_done ? V.t_last_c : now_ns();
}

/* The receiving side of a bandwidth phase; ends when the client is done and everything arrived
 * or nothing arrived for DRAIN_IDLE_NS. */
void vb_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	int kind = test_kind();
	uint64_t t_last = 0, t_done = 0, next_ctl = now_ns() + CTL_POLL_NS, expect_dg = UINT64_MAX;
	uint64_t expect_b = 0;
	const struct dgv_qp_stats *o = &V.st0;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (unsigned spin = 1;; spin++) {
		int arrivals = 0;

		if (kind == K_SEND || kind == K_WR) {
			int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
			long consumed = 0;

			if (n < 0)
				die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
			for (int j = 0; j < n; j++) {
				const struct dgv_wc *wc = &V.wcr[j];

				check_wc(wc, "receive");
				/* Completions of another length are late arrivals of an earlier size. */
				if (wc->opcode == DGV_WC_RECV) {
					consumed++;
					if (kind == K_SEND && wc->byte_len == size) {
						rep->count++;
						rep->bytes += wc->byte_len;
					}
				} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD && kind == K_WR) {
					V.rec_total++;
					if (wc->record.length == size) {
						rep->count++;
						rep->valid += wc->record.valid_bytes;
						rep->lensum += wc->record.length;
					}
				}
			}
			if (consumed) {
				V.rq_posted -= consumed;
				post_recvs();
			}
			arrivals = n;
			if (opt.transport == TR_RC) {
				rc_give_credit(kind == K_SEND ? V.rq_total : RC_WR_WINDOW + V.rec_total);
				if (V.cr_inflight > 0 && (n == 0 || V.cr_inflight >= (long)CR_SLOTS / 2))
					drain_scq();
			}
		} else {
			drain_scq(); /* nothing completes here, but it drives progress */
			/* Plain Writes leave no trace but the QP's counters: watch them. */
			if (kind == K_WRITE && ((spin & 31) == 0 || done || opt.event)) {
				struct dgv_qp_stats s;

				if (dgv_qp_stats(V.qp, &s) == 0 && (s.rx_datagrams - o->rx_datagrams != rep->dgrams ||
								    s.rx_bytes - o->rx_bytes != rep->bytes)) {
					rep->dgrams = s.rx_datagrams - o->rx_datagrams;
					rep->bytes = s.rx_bytes - o->rx_bytes;
					rep->rejects = (s.crc_drops - o->crc_drops) +
						       (s.malformed_drops - o->malformed_drops) +
						       (s.placement_rejects - o->placement_rejects);
					arrivals = 1;
				}
			}
		}
		if (arrivals) {
			t_last = now_ns();
			continue;
		}
		if (opt.event) {
			if (kind == K_SEND || kind == K_WR) {
				cq_event_wait(V.rcq);
			} else {
				/* a Write or a Read makes no completion here: look again in 0.1 ms */
				struct timespec ts = { 0, 100000 };

				nanosleep(&ts, NULL);
			}
		}
		{
			uint64_t t = now_ns();

			if (t >= next_ctl && !done) {
				next_ctl = t + CTL_POLL_NS;
				if (ctl_readable()) {
					ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
					done = true;
					t_done = t;
					expect_dg = m.v[3];
					/* RC: every byte the client posted arrives (rx_bytes counts the
					 * placed payload, or more if a provider counts headers too) */
					expect_b = opt.transport == TR_RC ? m.v[2] : 0;
				}
			}
			if (done) {
				uint64_t ref = t_last > t_done ? t_last : t_done;
				/* (Write-Record: one message may yield several partial records) */
				bool all = kind == K_WRITE ? rep->dgrams >= expect_dg && rep->bytes >= expect_b :
					   kind == K_WR ? rep->valid >= iters * size : rep->count >= iters;

				if (kind == K_READ || all || t - ref > DRAIN_IDLE_NS)
					break;
			} else {
				watch_client(&w, t, rep, size);
			}
			if (t > budget_dl)
				die(1, "the client did not finish size %" PRIu64 " in time", size);
		}
	}
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}
