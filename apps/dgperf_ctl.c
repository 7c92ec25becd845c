/*
 * dgperf_ctl.c - dgperf, addresses; the TCP control channel; the data connection's address, cookie.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* ---------------------------------------------------------------- addresses */

void sa_normalize(union dgv_sockaddr *a, socklen_t *len)
{
	if (a->sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) {
		struct sockaddr_in sin;

		memset(&sin, 0, sizeof sin);
		sin.sin_family = AF_INET;
		sin.sin_port = a->sin6.sin6_port;
		memcpy(&sin.sin_addr, &a->sin6.sin6_addr.s6_addr[12], 4);
		memset(a, 0, sizeof *a);
		a->sin = sin;
	}
	*len = a->sa.sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static bool sa_is_any(const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET)
		return a->sin.sin_addr.s_addr == htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&a->sin6.sin6_addr);
}

void sa_set_port(union dgv_sockaddr *a, unsigned port)
{
	if (a->sa.sa_family == AF_INET)
		a->sin.sin_port = htons((uint16_t)port);
	else
		a->sin6.sin6_port = htons((uint16_t)port);
}

static unsigned sa_port(const union dgv_sockaddr *a)
{
	return ntohs(a->sa.sa_family == AF_INET ? a->sin.sin_port : a->sin6.sin6_port);
}

const char *sa_str(const union dgv_sockaddr *a, char *buf, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof ip);
		snprintf(buf, n, "%s:%u", ip, sa_port(a));
	} else {
		inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof ip);
		snprintf(buf, n, "[%s]:%u", ip, sa_port(a));
	}
	return buf;
}

/* ---------------------------------------------------------------- control channel */

#define CTL_MAGIC 0x44475046u /* "DGPF" */

const char *peer_role(void) { return g_server ? "client" : "server"; }

int io_wait(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		uint64_t t = now_ns();
		struct pollfd p = { .fd = fd, .events = ev };
		int r;

		if (t >= deadline)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int)((deadline - t + NS_PER_MS - 1) / NS_PER_MS));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int ctl_write(const struct ctl_msg *m, int timeout_ms)
{
	struct ctl_msg w = *m;
	const uint8_t *p = (const uint8_t *)&w;
	size_t left = sizeof w;
	uint64_t dl = now_ns() + (uint64_t)timeout_ms * NS_PER_MS;

	w.magic = htobe32(CTL_MAGIC);
	w.type = htobe32(m->type);
	for (int i = 0; i < CTL_NV; i++)
		w.v[i] = htobe64(m->v[i]);
	w.text[sizeof w.text - 1] = 0;
	while (left) {
		ssize_t r = send(g_ctl, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r > 0) {
			p += r;
			left -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int e = io_wait(g_ctl, POLLOUT, dl);

			if (e)
				return e;
			continue;
		}
		return r < 0 ? -errno : -EPIPE;
	}
	return 0;
}

void ctl_send_err(int code, const char *text)
{
	struct ctl_msg m;

	memset(&m, 0, sizeof m);
	m.type = CTL_ERR;
	m.v[0] = (uint64_t)code;
	memcpy(m.text, text, strnlen(text, sizeof m.text - 1));
	(void)ctl_write(&m, 1000);
}

void ctl_send(uint32_t type, struct ctl_msg *m)
{
	int r;

	m->type = type;
	r = ctl_write(m, CTL_TIMEOUT_MS);
	if (r)
		die(1, "control channel: cannot send %s to the %s: %s", ctl_names[type], peer_role(),
		    strerror(-r));
}

/* Reads one whole message: 0, -ETIMEDOUT, -EPIPE (closed), -EPROTO (not ours) or -errno. */
static int ctl_read(struct ctl_msg *m, uint64_t deadline)
{
	uint8_t *p = (uint8_t *)m;
	size_t got = 0;

	while (got < sizeof *m) {
		ssize_t r = recv(g_ctl, p + got, sizeof *m - got, MSG_DONTWAIT);

		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		if (r == 0)
			return -EPIPE;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int e = io_wait(g_ctl, POLLIN, deadline);

			if (e)
				return e;
			continue;
		}
		return -errno;
	}
	m->magic = be32toh(m->magic);
	m->type = be32toh(m->type);
	for (int i = 0; i < CTL_NV; i++)
		m->v[i] = be64toh(m->v[i]);
	m->text[sizeof m->text - 1] = 0;
	if (m->magic != CTL_MAGIC || m->type == CTL_ANY || m->type > CTL_BYE)
		return -EPROTO;
	return 0;
}

/* Receives a message of type want (CTL_ANY: any but ERR); an ERR from the peer ends us. */
void ctl_recv(uint32_t want, struct ctl_msg *m, int timeout_ms, const char *what)
{
	int r = ctl_read(m, now_ns() + (uint64_t)timeout_ms * NS_PER_MS);

	if (r == -ETIMEDOUT)
		die(1, "timed out after %d s waiting for the %s (%s)", timeout_ms / 1000, peer_role(), what);
	if (r == -EPIPE || r == -ECONNRESET)
		die(1, "the %s closed the control connection (while waiting for %s)", peer_role(), what);
	if (r == -EPROTO)
		die(1, "garbage on the control connection: is the peer a dgperf of the same version?");
	if (r)
		die(1, "control channel: %s", strerror(-r));
	if (m->type == CTL_ERR) {
		int code = m->v[0] == 2 ? 2 : 1;

		fflush(stdout);
		fprintf(stderr, "dgperf: the %s failed: %s\n", peer_role(), m->text);
		if (g_die_hook)
			g_die_hook();
		g_dying = true;
		exit(code);
	}
	if (want != CTL_ANY && m->type != want)
		die(1, "control channel: got %s from the %s while waiting for %s", ctl_names[m->type],
		    peer_role(), ctl_names[want]);
}

bool ctl_readable(void)
{
	struct pollfd p = { .fd = g_ctl, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/*
 * Client, during a measurement: the server says nothing until the client is done, so anything
 * readable on the control connection means it failed (ERR) or died (EOF). Cheap enough for
 * timeouts and a 10 ms cadence, not for every iteration.
 */
void ctl_check_peer(void)
{
	struct ctl_msg m;
	char c;
	ssize_t r;

	if (!ctl_readable())
		return;
	r = recv(g_ctl, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		die(1, "the %s closed the control connection during the run (did it die?)",
		    peer_role());
	if (r < 0)
		return;
	ctl_recv(CTL_ANY, &m, CTL_TIMEOUT_MS, "the rest of a message");
	die(1, "control channel: unexpected %s from the %s during the run", ctl_names[m.type],
	    peer_role());
}

static void ctl_tune(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* TCP sockets made the plainest way (socket(SOCK_STREAM) or accept, then fcntl for
 * close-on-exec and non-blocking) so that preloaded socket libraries that take only a bare
 * SOCK_STREAM, such as rsocket's librspreload, take ours too (the side-by-side compares them).
 * Returns the fd or -1 (errno). */
static int tcp_setfl(int fd, bool nonblock)
{
	if (fd >= 0 && (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
			(nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0))) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

int tcp_socket(int family, bool nonblock) { return tcp_setfl(socket(family, SOCK_STREAM, 0), nonblock); }

int tcp_accept(int lfd, bool nonblock) { return tcp_setfl(accept(lfd, NULL, NULL), nonblock); }

int ctl_connect(const char *host, unsigned port)
{
	struct addrinfo hints, *res = NULL, *ai;
	char ps[16], where[300];
	uint64_t deadline = now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * NS_PER_MS;
	int err = 0, r;

	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof ps, "%u", port);
	snprintf(where, sizeof where, "%s port %u", host, port);
	r = getaddrinfo(host, ps, &hints, &res);
	if (r)
		die(1, "cannot resolve peer '%s': %s", host,
		    r == EAI_SYSTEM ? strerror(errno) : gai_strerror(r));
	for (;;) {
		bool refused_only = true;

		for (ai = res; ai; ai = ai->ai_next) {
			int fd = tcp_socket(ai->ai_family, true);
			int e = 0;
			socklen_t el = sizeof e;

			if (fd < 0) {
				err = errno;
				refused_only = false;
				continue;
			}
			if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
				e = 0;
			else if (errno == EINPROGRESS) {
				e = io_wait(fd, POLLOUT, deadline);
				if (e == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
					e = errno;
				else if (e < 0)
					e = -e;
			} else
				e = errno;
			if (e == 0) {
				int fl = fcntl(fd, F_GETFL);

				fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
				freeaddrinfo(res);
				ctl_tune(fd);
				return fd;
			}
			close(fd);
			err = e;
			if (e != ECONNREFUSED)
				refused_only = false;
		}
		/* Nobody listening yet: the server may still be starting; retry until the deadline. */
		if (!refused_only || now_ns() + 100 * NS_PER_MS >= deadline)
			break;
		usleep(100000);
	}
	freeaddrinfo(res);
	if (err == ETIMEDOUT)
		die(1, "cannot connect to %s: no answer within %d s", where, CONNECT_TIMEOUT_MS / 1000);
	if (err == ECONNREFUSED)
		die(1, "cannot connect to %s: connection refused for %d s (is a dgperf server running "
		    "there with the same -p?)", where, CONNECT_TIMEOUT_MS / 1000);
	die(1, "cannot connect to %s: %s", where, strerror(err));
}

int ctl_accept(unsigned port)
{
	union dgv_sockaddr a;
	int one = 1, zero = 0, lfd, fd, e;

	memset(&a, 0, sizeof a);
	lfd = opt.bind ? -1 : tcp_socket(AF_INET6, false);
	if (lfd >= 0) {
		a.sin6.sin6_family = AF_INET6;
		a.sin6.sin6_addr = in6addr_any;
		a.sin6.sin6_port = htons((uint16_t)port);
		setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(lfd, &a.sa, sizeof a.sin6) < 0) {
			e = errno;
			close(lfd);
			lfd = -1;
			if (e == EADDRINUSE)
				die(1, "cannot listen on TCP port %u: %s (another dgperf server?)", port,
				    strerror(e));
		}
	}
	if (lfd < 0) { /* no IPv6 here: IPv4 only */
		memset(&a, 0, sizeof a);
		lfd = tcp_socket(AF_INET, false);
		if (lfd < 0)
			die(1, "socket: %s", strerror(errno));
		a.sin.sin_family = AF_INET;
		a.sin.sin_port = htons((uint16_t)port);
		if (opt.bind)
			inet_pton(AF_INET, opt.bind, &a.sin.sin_addr);
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(lfd, &a.sa, sizeof a.sin) < 0)
			die(1, "cannot listen on TCP port %u: %s", port, strerror(errno));
	}
	if (listen(lfd, 4) < 0)
		die(1, "cannot listen on TCP port %u: %s", port, strerror(errno));
	vlog("waiting for a client on TCP port %u", port);
	e = io_wait(lfd, POLLIN, now_ns() + (uint64_t)ACCEPT_TIMEOUT_MS * NS_PER_MS);
	if (e == -ETIMEDOUT)
		die(1, "no client connected to TCP port %u within %d s", port, ACCEPT_TIMEOUT_MS / 1000);
	if (e)
		die(1, "waiting for a client: %s", strerror(-e));
	fd = tcp_accept(lfd, false);
	if (fd < 0)
		die(1, "accept: %s", strerror(errno));
	if (data_on_tcp())
		g_lfd = lfd; /* the data connection comes to the same port */
	else
		close(lfd);
	ctl_tune(fd);
	return fd;
}

void ctl_local_peer(union dgv_sockaddr *local, socklen_t *llen, union dgv_sockaddr *peer,
		    socklen_t *plen)
{
	socklen_t l = sizeof *local;

	memset(local, 0, sizeof *local);
	memset(peer, 0, sizeof *peer);
	if (getsockname(g_ctl, &local->sa, &l) < 0)
		die(1, "getsockname: %s", strerror(errno));
	l = sizeof *peer;
	if (getpeername(g_ctl, &peer->sa, &l) < 0)
		die(1, "getpeername: %s", strerror(errno));
	sa_normalize(local, llen);
	sa_normalize(peer, plen);
}

void msg_put_addr(struct ctl_msg *m, const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET) {
		m->v[0] = 4;
		memcpy(m->addr, &a->sin.sin_addr, 4);
	} else {
		m->v[0] = 6;
		m->v[2] = a->sin6.sin6_scope_id;
		memcpy(m->addr, &a->sin6.sin6_addr, 16);
	}
	m->v[1] = sa_port(a);
}

/* The peer's data address; a wildcard address becomes the control connection's peer address. */
void msg_get_addr(const struct ctl_msg *m, const union dgv_sockaddr *ctl_peer,
		  union dgv_sockaddr *a, socklen_t *len)
{
	memset(a, 0, sizeof *a);
	if (m->v[0] == 4) {
		a->sin.sin_family = AF_INET;
		memcpy(&a->sin.sin_addr, m->addr, 4);
	} else if (m->v[0] == 6) {
		a->sin6.sin6_family = AF_INET6;
		a->sin6.sin6_scope_id = (uint32_t)m->v[2];
		memcpy(&a->sin6.sin6_addr, m->addr, 16);
	} else
		die(1, "control channel: the %s sent an unknown address family", peer_role());
	if (m->v[1] == 0 || m->v[1] > 65535)
		die(1, "control channel: the %s sent port %" PRIu64, peer_role(), m->v[1]);
	sa_set_port(a, (unsigned)m->v[1]);
	sa_normalize(a, len);
	if (sa_is_any(a) && a->sa.sa_family == ctl_peer->sa.sa_family) {
		unsigned port = sa_port(a);

		*a = *ctl_peer;
		sa_set_port(a, port);
	}
}

/* Handshake: the client describes its run, the server checks it runs the same. */
void hello_fill(struct ctl_msg *m)
{
	memset(m, 0, sizeof *m);
	m->v[0] = CTL_VERSION;
	m->v[1] = (uint64_t)opt.test;
	m->v[2] = opt.raw_tcp ? 5 : opt.raw ? (opt.raw_connected ? 4 : 0) : (uint64_t)opt.transport + 1;
	m->v[3] = opt.seg_set ? opt.seg : 0;
	m->v[4] = opt.loss_set ? (uint64_t)llround(opt.loss * 1e6) + 1 : 0;
	m->v[5] = opt.sweep;
	m->v[6] = opt.sweep ? 0 : opt.size;
	m->v[7] = opt.iters_set ? opt.iters : 0;
}

static void describe(const struct ctl_msg *m, int i, char *buf, size_t n)
{
	switch (i) {
	case 1:
		snprintf(buf, n, "-t %s", m->v[1] < (uint64_t)NTESTS ? test_names[m->v[1]] : "?");
		break;
	case 2:
		snprintf(buf, n, "%s", m->v[2] == 0 ? "--raw-udp" : m->v[2] == 4 ? "--raw-connected" :
			 m->v[2] == 5 ? "--raw-tcp" :
			 m->v[2] <= 3 ? (const char *[]){ "-c UD", "-c RD", "-c RC" }[m->v[2] - 1] : "?");
		break;
	case 3:
		if (m->v[3])
			snprintf(buf, n, "--seg %" PRIu64, m->v[3]);
		else
			snprintf(buf, n, "no --seg");
		break;
	case 4:
		if (m->v[4])
			snprintf(buf, n, "--loss %g", (double)(m->v[4] - 1) / 1e6);
		else
			snprintf(buf, n, "no --loss");
		break;
	case 5:
	case 6:
		if (m->v[5])
			snprintf(buf, n, "-a");
		else
			snprintf(buf, n, "-s %" PRIu64, m->v[6]);
		break;
	case 7:
		if (m->v[7])
			snprintf(buf, n, "-n %" PRIu64, m->v[7]);
		else
			snprintf(buf, n, "no -n");
		break;
	default:
		snprintf(buf, n, "protocol version %" PRIu64, m->v[0]);
	}
}

void hello_check(const struct ctl_msg *theirs)
{
	struct ctl_msg mine;

	hello_fill(&mine);
	for (int i = 0; i < 8; i++) {
		char a[64], b[64];

		if (mine.v[i] == theirs->v[i])
			continue;
		describe(theirs, i, a, sizeof a);
		describe(&mine, i, b, sizeof b);
		die(2, "option mismatch: the client has %s, the server has %s (both sides need the same "
		    "-c/-t/-s/-a/-n/--seg/--loss/--raw-udp/--raw-tcp)", a, b);
	}
}

/* ---------------------------------------------------------------- the data connection over TCP */

/*
 * RC and --raw-tcp carry their data on a second TCP connection to the server's control port:
 * the server keeps the control port's listening socket (g_lfd) open; for RC the provider listens
 * on it (dgv_listen with adopt_fd), for --raw-tcp dgperf accepts on it. The server sends a random
 * cookie in its SETUP message and the client presents it (RC: in the MPA private data; raw TCP:
 * the first 8 bytes of the stream), so a stray connection to the port is turned away.
 */
uint64_t g_cookie;

uint64_t make_cookie(void)
{
	uint64_t c = 0;

	if (getrandom(&c, sizeof c, 0) != (ssize_t)sizeof c)
		c = now_ns() ^ ((uint64_t)getpid() << 40);
	return c ? c : 1;
}

/* Where the client opens the data connection: the server's control address (port PORT). */
void data_dst(const union dgv_sockaddr *ctl_peer, union dgv_sockaddr *dst, socklen_t *len)
{
	*dst = *ctl_peer;
	sa_set_port(dst, opt.port);
	*len = dst->sa.sa_family == AF_INET ? sizeof dst->sin : sizeof dst->sin6;
}
