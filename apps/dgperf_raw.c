/*
 * dgperf_raw.c - dgperf, the baselines without verbs: --raw-udp/--raw-connected and --raw-tcp.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* ---------------------------------------------------------------- raw UDP */

struct raw_udp_state R;

static bool raw_drop(void)
{
	double u;

	if (!opt.loss_set || opt.loss <= 0)
		return false;
	R.rng ^= R.rng << 13;
	R.rng ^= R.rng >> 7;
	R.rng ^= R.rng << 17;
	u = (double)(R.rng >> 11) * 0x1.0p-53;
	if (u * 100.0 < opt.loss) {
		R.dropped++;
		return true;
	}
	return false;
}

void raw_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	union dgv_sockaddr a = *ctl_local, mine, peer;
	socklen_t len = ctl_local->sa.sa_family == AF_INET ? sizeof a.sin : sizeof a.sin6, plen, ml;
	int sz = RAW_SOCKBUF, got = 0;
	socklen_t gl = sizeof got;
	struct ctl_msg m;
	char s1[80], s2[80];

	R.family = a.sa.sa_family;
	R.seg = seg_effective(R.family);
	R.rng = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	if (!R.rng)
		R.rng = 1;
	R.txbuf = calloc(1, R.seg);
	R.rxbuf = calloc(1, RAW_RXBUF);
	if (!R.txbuf || !R.rxbuf)
		die(1, "out of memory");
	for (uint32_t i = 0; i < R.seg; i++)
		R.txbuf[i] = (uint8_t)(i * 7 + 1);
	R.fd = socket(R.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (R.fd < 0)
		die(1, "socket: %s", strerror(errno));
	if (setsockopt(R.fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz) < 0)
		setsockopt(R.fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	if (setsockopt(R.fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz) < 0)
		setsockopt(R.fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	getsockopt(R.fd, SOL_SOCKET, SO_RCVBUF, &got, &gl);
	sa_set_port(&a, g_server ? opt.port : 0);
	if (bind(R.fd, &a.sa, len) < 0)
		die(1, "cannot bind UDP %s: %s", sa_str(&a, s1, sizeof s1), strerror(errno));
	ml = sizeof mine;
	memset(&mine, 0, sizeof mine);
	getsockname(R.fd, &mine.sa, &ml);
	sa_normalize(&mine, &ml);
	memset(&m, 0, sizeof m);
	msg_put_addr(&m, &mine);
	ctl_send(CTL_SETUP, &m);
	ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its UDP address");
	msg_get_addr(&m, ctl_peer, &peer, &plen);
	R.peer = peer;
	R.peerlen = plen;
	if (opt.raw_connected && connect(R.fd, &peer.sa, plen) < 0)
		die(1, "connect UDP to %s: %s", sa_str(&peer, s1, sizeof s1), strerror(errno));
	vlog("raw UDP %s -> %s, %u-byte datagrams, SO_RCVBUF %d", sa_str(&mine, s1, sizeof s1),
	     sa_str(&peer, s2, sizeof s2), R.seg, got);
}

/* Sends one message of size bytes as ceil(size/seg) datagrams; false at the deadline. */
/* --event: waits until fd is ready for ev or EVENT_WAIT_MS pass (then the loop looks at its
 * control channel and deadlines). Dies on a poll error. */
static void event_wait(int fd, short ev)
{
	int e = io_wait(fd, ev, now_ns() + EVENT_WAIT_MS * NS_PER_MS);

	if (e && e != -ETIMEDOUT)
		die(1, "poll: %s", strerror(-e));
}

static bool raw_send_msg(uint64_t size, uint64_t deadline)
{
	uint64_t left = size;
	unsigned spin = 0;

	while (left) {
		size_t len = left < R.seg ? (size_t)left : R.seg;
		ssize_t r = opt.raw_connected ? send(R.fd, R.txbuf, len, MSG_DONTWAIT)
					      : sendto(R.fd, R.txbuf, len, MSG_DONTWAIT, &R.peer.sa, R.peerlen);

		if (r >= 0) {
			left -= len;
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR) {
			if (opt.event) {
				uint64_t t = now_ns();

				if (t > deadline)
					return false;
				event_wait(R.fd, POLLOUT);
				continue;
			}
			if ((++spin & 255) == 0 && now_ns() > deadline)
				return false;
			continue;
		}
		if (errno == ECONNREFUSED)
			die(1, "the %s's UDP port is unreachable (ICMP port unreachable)", peer_role());
		die(1, "send (UDP): %s", strerror(errno));
	}
	return true;
}

/* One datagram if there is one (after simulated loss): its length, else 0. */
static size_t raw_recv(void)
{
	for (;;) {
		ssize_t r = recv(R.fd, R.rxbuf, RAW_RXBUF, MSG_DONTWAIT);

		if (r > 0) {
			if (raw_drop())
				continue;
			return (size_t)r;
		}
		if (r == 0)
			continue; /* zero-length datagram: not ours */
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return 0;
		if (errno == ECONNREFUSED)
			continue; /* a stale ICMP error from an earlier run */
		die(1, "recv (UDP): %s", strerror(errno));
	}
}

void raw_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	uint64_t to = lat_timeout_ns(size, R.family), last_ok = now_ns();
	uint64_t req = test_kind() == K_READ ? RAW_READ_REQ : size;

	memset(out, 0, sizeof *out);
	for (uint64_t i = 0, good = 0; out->nsamp < iters && i < LAT_ATTEMPTS(warm + iters); i++) {
		uint64_t t0 = now_ns(), t1 = 0, got = 0, last_rx = t0;

		if (raw_send_msg(req, t0 + to)) {
			out->pings++;
			for (unsigned spin = 1;; spin++) {
				size_t r = raw_recv();

				if (r) {
					got += r;
					if (got >= size) {
						t1 = now_ns();
						break;
					}
					last_rx = 0;
					continue;
				}
				if ((spin & 63) == 0) {
					uint64_t t = now_ns();

					if (last_rx == 0)
						last_rx = t;
					if (got && t - last_rx > REASM_NS)
						got = 0; /* the rest of this message was lost */
					if (t > t0 + to)
						break;
				}
			}
		}
		if (!t1) {
			out->lost++;
			lat_timeout_check(last_ok);
			continue;
		}
		last_ok = t1;
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
	}
}

void raw_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	uint64_t need = test_kind() == K_READ ? RAW_READ_REQ : size, got = 0, last_rx = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS;
	struct watch w = { 0, 0, 0 };

	for (;;) {
		size_t r = raw_recv();
		uint64_t t;

		if (r) {
			got += r;
			rep->dgrams++;
			rep->bytes += r;
			last_rx = 0;
			if (got >= need) {
				got = 0;
				rep->count++;
				if (!raw_send_msg(size, now_ns() + NS_PER_S))
					vlog("could not send a reply within 1 s");
			}
			continue;
		}
		t = now_ns();
		if (last_rx == 0)
			last_rx = t;
		if (got && t - last_rx > REASM_NS)
			got = 0;
		if (server_tick(t, &next_ctl, &w, rep, size, budget_dl))
			return;
	}
}

void raw_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	uint64_t dl;

	memset(out, 0, sizeof *out);
	out->t_start = now_ns();
	dl = out->t_start + 60 * NS_PER_S + iters * size * 1000;
	for (uint64_t i = 0, next_check = out->t_start + CTL_CHECK_NS; i < iters; i++) {
		if (!raw_send_msg(size, dl))
			die(1, "raw UDP: the socket stayed full (send of %" PRIu64 " B)", size);
		out->posted++;
		if ((i & 63) == 63 && now_ns() >= next_check) {
			next_check = now_ns() + CTL_CHECK_NS;
			ctl_check_peer();
		}
	}
	out->t_end = now_ns();
}

void raw_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	uint64_t t_last = 0, t_done = 0, next_ctl = now_ns() + CTL_POLL_NS, want = iters * size;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (;;) {
		size_t r = raw_recv();
		uint64_t t;

		if (r) {
			rep->bytes += r;
			rep->dgrams++;
			t_last = now_ns();
			continue;
		}
		if (opt.event)
			event_wait(R.fd, POLLIN);
		t = now_ns();
		if (t >= next_ctl && !done) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				done = true;
				t_done = t;
			}
		}
		if (done && (rep->bytes >= want || t - (t_last > t_done ? t_last : t_done) > DRAIN_IDLE_NS))
			break;
		if (!done)
			watch_client(&w, t, rep, size);
		if (t > budget_dl)
			die(1, "the client did not finish size %" PRIu64 " in time", size);
	}
	rep->count = rep->bytes / size;
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}

/* ---------------------------------------------------------------- raw TCP */

#define TCP_ACCEPT_NS (20 * NS_PER_S) /* server: the client's data connection must come by then */

struct raw_tcp_state T = { .fd = -1 };

/* Sends all n bytes (non-blocking socket; waits in poll while it is full); false at deadline. */
static bool tcp_send_all(const uint8_t *p, size_t n, uint64_t deadline)
{
	while (n) {
		ssize_t r = send(T.fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r > 0) {
			p += r;
			n -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int e = io_wait(T.fd, POLLOUT, deadline);

			if (e == -ETIMEDOUT)
				return false;
			if (e)
				die(1, "poll (TCP data connection): %s", strerror(-e));
			continue;
		}
		if (r < 0 && (errno == EPIPE || errno == ECONNRESET))
			die(1, "the %s closed the data connection (%s)", peer_role(), strerror(errno));
		die(1, "send (TCP data connection): %s", r < 0 ? strerror(errno) : "sent nothing");
	}
	return true;
}

/* Up to max bytes if any are there (never blocks): their count, else 0. */
static size_t tcp_recv_some(uint64_t max)
{
	for (;;) {
		ssize_t r = recv(T.fd, T.rx, max < TCP_CHUNK ? (size_t)max : TCP_CHUNK, MSG_DONTWAIT);

		if (r > 0)
			return (size_t)r;
		if (r == 0)
			die(1, "the %s closed the data connection", peer_role());
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		die(1, "recv (TCP data connection): %s", strerror(errno));
	}
}

/* Client: a non-blocking TCP connection to dst within the connect timeout, or die naming why. */
static int tcp_connect_to(const union dgv_sockaddr *dst, socklen_t len)
{
	uint64_t deadline = now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * NS_PER_MS;
	int fd = tcp_socket(dst->sa.sa_family, true), e = 0;
	socklen_t el = sizeof e;
	char s1[80];

	if (fd < 0)
		die(1, "socket: %s", strerror(errno));
	if (connect(fd, &dst->sa, len) < 0) {
		if (errno != EINPROGRESS)
			e = errno;
		else if ((e = -io_wait(fd, POLLOUT, deadline)) == 0 &&
			 getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
			e = errno;
	}
	if (e == ECONNREFUSED)
		die(1, "data connection to TCP %s refused (the server's listener is gone?)",
		    sa_str(dst, s1, sizeof s1));
	if (e == ETIMEDOUT)
		die(1, "data connection to TCP %s: no answer within %d s", sa_str(dst, s1, sizeof s1),
		    CONNECT_TIMEOUT_MS / 1000);
	if (e)
		die(1, "data connection to TCP %s: %s", sa_str(dst, s1, sizeof s1), strerror(e));
	return fd;
}

void tcp_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	uint64_t len = max_msg_size() > RAW_READ_REQ ? max_msg_size() : RAW_READ_REQ, be;
	union dgv_sockaddr mine, peer;
	socklen_t ml = sizeof mine, pl = sizeof peer;
	struct ctl_msg m;
	char s1[80], s2[80];
	int one = 1;

	T.family = ctl_local->sa.sa_family;
	T.tx = malloc(len);
	T.rx = malloc(TCP_CHUNK);
	if (!T.tx || !T.rx)
		die(1, "out of memory");
	for (uint64_t i = 0; i < len; i++)
		T.tx[i] = (uint8_t)(i * 7 + 1);
	if (g_server) {
		uint64_t dl = now_ns() + TCP_ACCEPT_NS;

		g_cookie = make_cookie();
		memset(&m, 0, sizeof m);
		m.v[0] = g_cookie;
		ctl_send(CTL_SETUP, &m);
		for (;;) {
			int e = io_wait(g_lfd, POLLIN, dl), fd;
			uint64_t got = 0;
			size_t n = 0;

			if (e == -ETIMEDOUT)
				die(1, "the client did not open its data connection to TCP port %u within %.0f s",
				    opt.port, (double)TCP_ACCEPT_NS / 1e9);
			if (e)
				die(1, "waiting for the data connection: %s", strerror(-e));
			fd = tcp_accept(g_lfd, true);
			if (fd < 0) {
				if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
					continue;
				die(1, "accept (data connection): %s", strerror(errno));
			}
			/* its first 8 bytes must be our cookie, within 2 s */
			while (n < sizeof got && io_wait(fd, POLLIN, now_ns() + 2 * NS_PER_S) == 0) {
				ssize_t r = recv(fd, (uint8_t *)&got + n, sizeof got - n, MSG_DONTWAIT);

				if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR)))
					break;
				if (r > 0)
					n += (size_t)r;
			}
			if (n == sizeof got && be64toh(got) == g_cookie) {
				T.fd = fd;
				break;
			}
			vlog("turned away a data connection without this run's cookie");
			close(fd);
		}
	} else {
		union dgv_sockaddr dst;
		socklen_t dl;

		ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its data port");
		g_cookie = m.v[0];
		data_dst(ctl_peer, &dst, &dl);
		T.fd = tcp_connect_to(&dst, dl);
		be = htobe64(g_cookie);
		if (!tcp_send_all((const uint8_t *)&be, sizeof be, now_ns() + (uint64_t)CTL_TIMEOUT_MS * NS_PER_MS))
			die(1, "data connection: cannot send the cookie");
	}
	setsockopt(T.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	memset(&mine, 0, sizeof mine);
	memset(&peer, 0, sizeof peer);
	getsockname(T.fd, &mine.sa, &ml);
	getpeername(T.fd, &peer.sa, &pl);
	sa_normalize(&mine, &ml);
	sa_normalize(&peer, &pl);
	vlog("raw TCP %s -> %s, TCP_NODELAY", sa_str(&mine, s1, sizeof s1), sa_str(&peer, s2, sizeof s2));
}

void tcp_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	uint64_t to = lat_timeout_ns(size, T.family);
	uint64_t req = test_kind() == K_READ ? RAW_READ_REQ : size;

	memset(out, 0, sizeof *out);
	for (uint64_t i = 0, good = 0; out->nsamp < iters; i++) {
		uint64_t t0 = now_ns(), t1 = 0, got = 0;

		if (!tcp_send_all(T.tx, (size_t)req, t0 + to))
			die(1, "%s: the data connection stayed full for %.1f s at %" PRIu64 " B",
			    test_names[opt.test], (double)to / 1e9, size);
		out->pings++;
		for (unsigned spin = 1;; spin++) {
			size_t r = tcp_recv_some(size - got);

			if (r) {
				got += r;
				if (got >= size) {
					t1 = now_ns();
					break;
				}
				continue;
			}
			if ((spin & 255) == 0 && now_ns() > t0 + to) {
				ctl_check_peer();
				die(1, "%s: no reply within %.1f s at %" PRIu64 " B (iteration %" PRIu64 "): is "
				    "the server alive?", test_names[opt.test], (double)to / 1e9, size, i);
			}
		}
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
	}
}

void tcp_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	uint64_t need = test_kind() == K_READ ? RAW_READ_REQ : size, got = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS;
	struct watch w = { 0, 0, 0 };
	struct ctl_msg m;

	for (;;) {
		size_t r = tcp_recv_some(need - got);
		uint64_t t;

		if (r) {
			got += r;
			rep->bytes += r;
			rep->dgrams++;
			if (got == need) {
				got = 0;
				rep->count++;
				if (!tcp_send_all(T.tx, (size_t)size, now_ns() + 10 * NS_PER_S))
					die(1, "could not send a reply within 10 s (the client stopped reading?)");
			}
			continue;
		}
		t = now_ns();
		if (t >= next_ctl) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				if (got)
					die(1, "the client said DONE in the middle of a %" PRIu64 "-byte message", need);
				return;
			}
			watch_client(&w, t, rep, size);
			if (t > budget_dl)
				die(1, "the client did not finish size %" PRIu64 " in time", size);
		}
	}
}

void tcp_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	uint64_t dl, next_check;

	memset(out, 0, sizeof *out);
	out->t_start = now_ns();
	dl = out->t_start + 60 * NS_PER_S + iters * size * 1000;
	next_check = out->t_start + CTL_CHECK_NS;
	for (uint64_t i = 0; i < iters; i++) {
		if (!tcp_send_all(T.tx, (size_t)size, dl))
			die(1, "raw TCP: the connection stayed full (did the server stop reading?)");
		out->posted++;
		if ((i & 63) == 63 && now_ns() >= next_check) {
			next_check = now_ns() + CTL_CHECK_NS;
			ctl_check_peer();
		}
	}
	out->t_end = now_ns();
}

/* Counts the stream's bytes until all iters x size arrived and the client said DONE. */
void tcp_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	uint64_t t_last = 0, next_ctl = now_ns() + CTL_POLL_NS, want = iters * size;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (;;) {
		uint64_t t;

		if (rep->bytes < want) {
			size_t r = tcp_recv_some(want - rep->bytes);

			if (r) {
				rep->bytes += r;
				rep->dgrams++;
				t_last = now_ns();
				continue;
			}
			if (opt.event)
				event_wait(T.fd, POLLIN);
		}
		t = now_ns();
		if (!done && (t >= next_ctl || rep->bytes >= want)) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				done = true;
			}
		}
		if (done && rep->bytes >= want)
			break;
		if (!done)
			watch_client(&w, t, rep, size);
		if (t > budget_dl)
			die(1, "the client did not finish size %" PRIu64 " in time (%" PRIu64 " of %" PRIu64
			    " bytes arrived)", size, rep->bytes, want);
	}
	rep->count = rep->bytes / size;
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}
