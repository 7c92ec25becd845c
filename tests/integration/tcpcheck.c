/*
 * tcpcheck: an ordinary TCP program (plain BSD sockets, nothing of the project) for
 * tcp_interop.sh. A server and a client exchange deterministic byte patterns both ways and
 * verify every byte:
 *
 *   phase D  duplex: both send DUPLEX bytes at once (a sender thread per side) and read as many;
 *   phase A  client -> server A bytes, then the client shutdown(SHUT_WR)s: the server must read
 *            exactly A bytes and then EOF (and the client must still be able to receive);
 *   phase B  server -> client B bytes, then the server close()s at once with data still queued
 *            (the client reads late and slowly; the server reports SIOCOUTQ at its close), or
 *            with --end shutdown first shutdown(SHUT_WR)s and then close()s, as Python's
 *            socketserver does: the client must read exactly B bytes and then EOF. With
 *            --reader poll the client reads phase B as an event-driven program (curl, VLC) does:
 *            non-blocking, poll(POLLIN) before every read, no delay (EAGAIN after POLLIN is
 *            tolerated and counted).
 *
 * Writes have random sizes (log-uniform 1 B - 256 KiB, through write, send, writev and sendmsg);
 * reads mix read() of random sizes (short reads), 1-byte reads, recv(MSG_PEEK) followed by a
 * read that must return the peeked bytes, recv(MSG_WAITALL) that must return the full count,
 * readv and recvmsg. The first 16 bytes each side receives are also compared with the iWARP MPA
 * request and reply keys ("MPA ID Req Frame", "MPA ID Rep Frame"): an unmodified program must
 * never see them.
 *
 * Connect styles (client, --connect): "block" (connect), "nonblock" (O_NONBLOCK connect, poll
 * POLLOUT, SO_ERROR, a second and a third connect, then blocking again), "epoll" (the same,
 * waiting for EPOLLOUT in a level-triggered epoll instance instead of poll), "fastopen" (what VLC's
 * HTTP client does: non-blocking socket, sendmsg(MSG_NOSIGNAL|MSG_FASTOPEN) with the first data
 * and the destination, poll POLLOUT, SO_ERROR, connect, the unsent data written again). The
 * results of those calls are printed as seq=... so a script can require the same sequence with
 * and without the shim.
 *
 * Usage: tcpcheck server|client PORT [--seed N] [--duplex BYTES] [--a BYTES] [--b BYTES]
 *                                    [--connect block|nonblock|epoll|fastopen] [--accept4] [--timeout S]
 *                                    [--end close|shutdown] [--reader slow|poll] [--host A]
 * Prints one line: "tcpcheck: ROLE OK ..." (exit 0) or "tcpcheck: ROLE FAIL: why" (exit 1); a
 * watchdog (default 60 s) fails with where each direction was.
 * On 127.0.0.1 unless --host A names another IPv4 address (the VM test bed's devices).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "dgshim.h"

static const char *role = "?";
static uint64_t seed = 1;
/* --reader poll: the receive in progress is non-blocking and waits in poll(POLLIN) */
static int poll_reader;
static unsigned long eagain_after_pollin;
/* Where each direction is, for the watchdog's message. */
static const char *volatile rx_what = "connecting", *volatile tx_what = "-";
static volatile size_t rx_off, tx_off;

static void fail(const char *fmt, ...)
{
	va_list ap;
	printf("tcpcheck: %s FAIL: ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The pattern: byte OFF of stream KEY (one stream per phase and direction). */
static void pattern(uint64_t key, uint64_t off, unsigned char *buf, size_t len)
{
	uint64_t w = splitmix(key ^ (off >> 3) * 0x2545f4914f6cdd1dull);
	for (size_t i = 0; i < len; i++, off++) {
		if (i && (off & 7) == 0)
			w = splitmix(key ^ (off >> 3) * 0x2545f4914f6cdd1dull);
		buf[i] = (unsigned char)(w >> ((off & 7) * 8));
	}
}

static uint64_t stream_key(char phase, int from_client)
{
	return splitmix(seed * 1000003u + (uint64_t)phase * 2 + (uint64_t)from_client);
}

/* A small PRNG for sizes and choices (per thread). */
struct rng {
	uint64_t s;
};
static uint64_t rnd(struct rng *r)
{
	r->s = splitmix(r->s);
	return r->s;
}
/* log-uniform in [1, max] */
static size_t rnd_size(struct rng *r, size_t max)
{
	int bits = 0;
	while (((size_t)1 << (bits + 1)) <= max)
		bits++;
	size_t hi = (size_t)1 << (rnd(r) % (uint64_t)(bits + 1));
	size_t v = hi + rnd(r) % hi;
	if (v > max)
		v = max;
	return v ? v : 1;
}

struct counts {
	unsigned long writes, reads, short_reads, one_byte, peeks, waitall, readv, recvmsg;
};

/* send_stream: writes bytes [START, LEN) of stream KEY in random-size chunks through several
 * calls. */
static void send_stream(int fd, uint64_t key, size_t start, size_t len, struct rng *r, struct counts *c,
			const char *what)
{
	unsigned char *buf = malloc(262144);
	if (!buf)
		fail("out of memory");
	size_t off = start;
	tx_what = what;
	while (off < len) {
		tx_off = off;
		size_t n = rnd_size(r, 262144);
		if (n > len - off)
			n = len - off;
		pattern(key, off, buf, n);
		size_t done = 0;
		while (done < n) {
			ssize_t k;
			size_t m = n - done, h = m / 2;
			struct iovec iov[2] = {{buf + done, h}, {buf + done + h, m - h}};
			struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
			switch (rnd(r) % 4) {
			case 0: k = write(fd, buf + done, m); break;
			case 1: k = send(fd, buf + done, m, MSG_NOSIGNAL); break;
			case 2: k = writev(fd, iov, 2); break;
			default: k = sendmsg(fd, &mh, MSG_NOSIGNAL); break;
			}
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				fail("%s: write at offset %zu of %zu: %s", what, off + done, len,
				     k < 0 ? strerror(errno) : "returned 0");
			done += (size_t)k;
			c->writes++;
		}
		off += n;
	}
	free(buf);
}

static const char *mpa_keys[] = {"MPA ID Req Frame", "MPA ID Rep Frame"};

/* check: the received bytes at stream offset OFF must be the pattern. */
static void check(uint64_t key, size_t off, const unsigned char *got, size_t n, const char *what, int first)
{
	static __thread unsigned char exp[262144];
	if (first && off == 0 && n >= 16)
		for (int i = 0; i < 2; i++)
			if (!memcmp(got, mpa_keys[i], 16))
				fail("%s: the stream starts with \"%s\": iWARP MPA bytes reached this program", what, mpa_keys[i]);
	pattern(key, off, exp, n);
	if (memcmp(exp, got, n)) {
		size_t i = 0;
		while (exp[i] == got[i])
			i++;
		fail("%s: byte %zu is 0x%02x, expected 0x%02x (%zu bytes verified before it)", what, off + i, got[i],
		     exp[i], off + i);
	}
}

/* recv_stream: reads exactly LEN bytes of stream KEY with mixed calls, verifying all; with
 * EXPECT_EOF, then requires EOF (read and MSG_PEEK both return 0). FIRST: the first bytes this
 * side receives on the connection (checked against the MPA keys). PACE_US: a pause after each
 * read (a slow reader keeps the peer's send queue full). */
static void recv_stream(int fd, uint64_t key, size_t len, int expect_eof, struct rng *r, struct counts *c,
			const char *what, int first, unsigned pace_us)
{
	static __thread unsigned char buf[262144], buf2[262144];
	size_t off = 0;
	rx_what = what;
	while (off < len) {
		rx_off = off;
		size_t want = rnd_size(r, 131072), rem = len - off;
		ssize_t k;
		int how = (int)(rnd(r) % 8);
		if (poll_reader) {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			int n = poll(&p, 1, 20000);
			if (n != 1)
				fail("%s: poll(POLLIN) at offset %zu of %zu returned %d (%s)", what, off, len, n,
				     n < 0 ? strerror(errno) : "nothing readable for 20 s");
			if (how == 3)
				how = 7; /* MSG_WAITALL on a non-blocking socket returns what is there */
		}
		if (first && off == 0 && rem >= 16) {
			/* the start of the stream: MSG_WAITALL 16 bytes for the MPA-key comparison */
			want = 16;
			how = 3;
		}
		if (want > rem)
			want = rem;
		switch (how) {
		case 0: /* a 1-byte read */
			k = read(fd, buf, 1);
			c->one_byte++;
			break;
		case 1:
		case 2: /* peek, then a read of at most what was peeked must give the same bytes */
			k = recv(fd, buf, want, MSG_PEEK);
			if (k > 0) {
				size_t m = 1 + rnd(r) % (size_t)k;
				ssize_t k2;
				do
					k2 = read(fd, buf2, m);
				while (k2 < 0 && errno == EINTR);
				if (k2 <= 0)
					fail("%s: read after MSG_PEEK of %zd bytes at offset %zu: %s", what, k, off,
					     k2 < 0 ? strerror(errno) : "EOF");
				if (memcmp(buf, buf2, (size_t)k2))
					fail("%s: read after MSG_PEEK at offset %zu returned other bytes than the peek", what,
					     off);
				c->peeks++;
				k = k2;
			}
			break;
		case 3: /* MSG_WAITALL must return everything asked for (the stream has it) */
			k = recv(fd, buf, want, MSG_WAITALL);
			if (k >= 0 && (size_t)k != want)
				fail("%s: recv(MSG_WAITALL, %zu) at offset %zu returned %zd", what, want, off, k);
			c->waitall++;
			break;
		case 4: { /* readv into three pieces */
			size_t a = want / 3, b = want / 3;
			struct iovec iov[3] = {{buf, a}, {buf + a, b}, {buf + a + b, want - a - b}};
			k = readv(fd, iov, 3);
			c->readv++;
			break;
		}
		case 5: {
			struct iovec iov = {buf, want};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
			k = recvmsg(fd, &mh, 0);
			c->recvmsg++;
			break;
		}
		default:
			k = read(fd, buf, want);
			break;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && poll_reader && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			eagain_after_pollin++;
			continue;
		}
		if (k < 0)
			fail("%s: read at offset %zu of %zu: %s", what, off, len, strerror(errno));
		if (k == 0)
			fail("%s: EOF after %zu of %zu bytes", what, off, len);
		if ((size_t)k < want)
			c->short_reads++;
		c->reads++;
		check(key, off, buf, (size_t)k, what, first);
		off += (size_t)k;
		if (pace_us)
			usleep(pace_us);
	}
	rx_off = off;
	if (expect_eof) {
		if (poll_reader) {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			if (poll(&p, 1, 20000) != 1)
				fail("%s: after all %zu bytes, poll(POLLIN) did not report the EOF within 20 s", what, len);
		}
		ssize_t k = recv(fd, buf, sizeof buf, MSG_PEEK);
		if (k != 0)
			fail("%s: after all %zu bytes, MSG_PEEK returned %zd (%s) instead of EOF", what, len, k,
			     k < 0 ? strerror(errno) : "more data");
		k = read(fd, buf, sizeof buf);
		if (k != 0)
			fail("%s: after all %zu bytes, read returned %zd instead of EOF", what, len, k);
	}
}

struct sender {
	int fd;
	uint64_t key;
	size_t start, len;
	struct rng r;
	struct counts c;
};

static void *sender_main(void *arg)
{
	struct sender *s = arg;
	send_stream(s->fd, s->key, s->start, s->len, &s->r, &s->c, "duplex send");
	return NULL;
}

static const char *err_name(int e)
{
	switch (e) {
	case 0: return "0";
	case EINPROGRESS: return "EINPROGRESS";
	case EALREADY: return "EALREADY";
	case EISCONN: return "EISCONN";
	case EAGAIN: return "EAGAIN";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case ECONNREFUSED: return "ECONNREFUSED";
	default: return strerror(e);
	}
}

static char seq[256];
static void seq_add(const char *what, int e)
{
	size_t l = strlen(seq);
	snprintf(seq + l, sizeof seq - l, "%s%s:%s", l ? "," : "", what, err_name(e));
}

static void set_blocking(int fd, int blocking)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK) < 0)
		fail("fcntl: %s", strerror(errno));
}

/* wait_connected: poll POLLOUT (10 s), then SO_ERROR; records both. */
static bool wait_epoll; /* --connect epoll */

static void wait_connected(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	int n, err = -1;
	socklen_t l = sizeof err;
	if (wait_epoll) {
		int ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd};
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			fail("epoll: %s", strerror(errno));
		n = epoll_wait(ep, &ev, 1, 10000);
		if (n != 1 || ev.data.fd != fd)
			fail("epoll_wait(EPOLLOUT) on the connecting socket returned %d (%s)", n,
			     n < 0 ? strerror(errno) : "timeout");
		close(ep);
		p.revents = (short)((ev.events & EPOLLOUT ? POLLOUT : 0) | (ev.events & EPOLLERR ? POLLERR : 0) |
				    (ev.events & EPOLLHUP ? POLLHUP : 0));
	} else if ((n = poll(&p, 1, 10000)) != 1) {
		fail("poll(POLLOUT) on the connecting socket returned %d (%s)", n, n < 0 ? strerror(errno) : "timeout");
	}
	{
		size_t sl = strlen(seq);
		snprintf(seq + sl, sizeof seq - sl, ",%s:%s%s%s", wait_epoll ? "epoll" : "poll",
			 p.revents & POLLOUT ? "OUT" : "", p.revents & POLLERR ? "|ERR" : "",
			 p.revents & POLLHUP ? "|HUP" : "");
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
		fail("getsockopt(SO_ERROR): %s", strerror(errno));
	seq_add("so_error", err);
	if (err)
		fail("connect failed: SO_ERROR %s (seq=%s)", strerror(err), seq);
}

static unsigned watchdog_secs = 60;
static void watchdog(int sig)
{
	char m[512];
	int n = snprintf(m, sizeof m,
			 "tcpcheck: %s FAIL: timed out after %u s; receiving: %s at byte %zu; sending: %s at byte %zu\n",
			 role, watchdog_secs, rx_what, (size_t)rx_off, tx_what, (size_t)tx_off);
	if (write(1, m, (size_t)n) < 0)
		_exit(1);
	_exit(1);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static const char *addr_str(const struct sockaddr_in *a, char *buf, size_t len)
{
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
	snprintf(buf, len, "%s:%u", ip, ntohs(a->sin_port));
	return buf;
}

/* --iwarp-mode: a modified program choosing per socket (only meaningful under the shim; the
 * kernel answers ENOPROTOOPT). Checks that getsockopt reads back what was set. */
static void set_iwarp_mode(int fd, int mode)
{
	if (mode < 0)
		return;
	if (setsockopt(fd, SOL_IWARP, IWARP_MODE, &mode, sizeof mode) < 0)
		fail("setsockopt(SOL_IWARP, IWARP_MODE, %d): %s", mode, strerror(errno));
	int got = -1;
	socklen_t l = sizeof got;
	if (getsockopt(fd, SOL_IWARP, IWARP_MODE, &got, &l) < 0 || got != mode)
		fail("getsockopt(SOL_IWARP, IWARP_MODE) after setting %d: %d (%s)", mode, got, strerror(errno));
}

int main(int argc, char **argv)
{
	size_t duplex = 2u << 20, alen = 6u << 20, blen = 6u << 20;
	const char *connect_mode = "block", *host = "127.0.0.1";
	int use_accept4 = 0, shutdown_end = 0, reader_poll = 0, iwarp_mode = -1;
	if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: tcpcheck server|client PORT [--seed N] [--duplex BYTES] [--a BYTES] "
				"[--b BYTES] [--connect block|nonblock|epoll|fastopen] [--accept4] [--timeout S] "
				"[--end close|shutdown] [--reader slow|poll] [--iwarp-mode off|rc|auto] [--host A]\n");
		return 2;
	}
	role = argv[1];
	int is_client = !strcmp(role, "client");
	int port = atoi(argv[2]);
	for (int i = 3; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(o, "--accept4")) {
			use_accept4 = 1;
			continue;
		}
		if (!v) {
			fprintf(stderr, "tcpcheck: %s needs a value\n", o);
			return 2;
		}
		i++;
		if (!strcmp(o, "--seed"))
			seed = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--duplex"))
			duplex = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--a"))
			alen = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--b"))
			blen = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--connect"))
			connect_mode = v;
		else if (!strcmp(o, "--reader") && (!strcmp(v, "slow") || !strcmp(v, "poll")))
			reader_poll = !strcmp(v, "poll");
		else if (!strcmp(o, "--end") && (!strcmp(v, "close") || !strcmp(v, "shutdown")))
			shutdown_end = !strcmp(v, "shutdown");
		else if (!strcmp(o, "--host"))
			host = v;
		else if (!strcmp(o, "--timeout"))
			watchdog_secs = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(o, "--iwarp-mode") && !strcmp(v, "off"))
			iwarp_mode = IWARP_MODE_OFF;
		else if (!strcmp(o, "--iwarp-mode") && !strcmp(v, "rc"))
			iwarp_mode = IWARP_MODE_RC;
		else if (!strcmp(o, "--iwarp-mode") && !strcmp(v, "auto"))
			iwarp_mode = IWARP_MODE_AUTO;
		else {
			fprintf(stderr, "tcpcheck: unknown option %s\n", o);
			return 2;
		}
	}
	if (!strcmp(connect_mode, "epoll"))
		connect_mode = "nonblock", wait_epoll = true;
	if (strcmp(connect_mode, "block") && strcmp(connect_mode, "nonblock") && strcmp(connect_mode, "fastopen")) {
		fprintf(stderr, "tcpcheck: --connect block|nonblock|epoll|fastopen\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, watchdog);
	alarm(watchdog_secs);
	setvbuf(stdout, NULL, _IOLBF, 0);

	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "tcpcheck: --host %s: not an IPv4 address\n", host);
		return 2;
	}
	struct rng r = {splitmix(seed ^ (is_client ? 0xc11eull : 0x5e7eull))};
	struct counts c = {0};
	int fd;
	double t0;

	/* The first chunk of phase D, written by the fastopen connect itself. */
	static unsigned char first[1024];
	size_t first_sent = 0;

	if (!is_client) {
		int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
		if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
			fail("socket: %s", strerror(errno));
		if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0)
			fail("bind %s:%d: %s", host, port, strerror(errno));
		set_iwarp_mode(ls, iwarp_mode);
		if (listen(ls, 4) < 0)
			fail("listen: %s", strerror(errno));
		rx_what = "accepting";
		fd = use_accept4 ? accept4(ls, NULL, NULL, SOCK_CLOEXEC) : accept(ls, NULL, NULL);
		if (fd < 0)
			fail("accept: %s", strerror(errno));
		close(ls);
		snprintf(seq, sizeof seq, "%s:ok", use_accept4 ? "accept4" : "accept");
	} else {
		int nb = strcmp(connect_mode, "block") != 0;
		fd = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
		if (fd < 0)
			fail("socket: %s", strerror(errno));
		set_iwarp_mode(fd, iwarp_mode);
		if (!strcmp(connect_mode, "block")) {
			if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
				fail("connect %s:%d: %s", host, port, strerror(errno));
			seq_add("connect", 0);
		} else if (!strcmp(connect_mode, "nonblock")) {
			int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
			seq_add("connect", rc < 0 ? errno : 0);
			if (rc < 0 && errno != EINPROGRESS)
				fail("non-blocking connect: %s", strerror(errno));
			wait_connected(fd);
			rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
			seq_add("connect2", rc < 0 ? errno : 0);
			rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
			seq_add("connect3", rc < 0 ? errno : 0);
			set_blocking(fd, 1);
		} else { /* fastopen: VLC's vlc_tls_ConnectWrite */
			pattern(stream_key('D', 1), 0, first, sizeof first);
			struct iovec iov = {first, sizeof first};
			struct msghdr mh = {.msg_name = &sa, .msg_namelen = sizeof sa, .msg_iov = &iov, .msg_iovlen = 1};
			ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_FASTOPEN);
			if (k >= 0) {
				size_t sl = strlen(seq);
				snprintf(seq + sl, sizeof seq - sl, "%ssendmsg_fastopen:sent", sl ? "," : "");
				first_sent = (size_t)k;
				/* still to learn when the connection is up */
				wait_connected(fd);
			} else {
				seq_add("sendmsg_fastopen", errno);
				if (errno == EINPROGRESS)
					wait_connected(fd);
				else if (errno != EOPNOTSUPP)
					fail("sendmsg(MSG_FASTOPEN): %s (seq=%s)", strerror(errno), seq);
				/* VLC's vlc_tls_Connect: connect must give 0, or EINPROGRESS and then a
				 * successful wait; anything else (EISCONN, EALREADY) fails VLC */
				int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
				seq_add("connect", rc < 0 ? errno : 0);
				if (rc < 0 && errno == EINPROGRESS)
					wait_connected(fd);
				else if (rc < 0)
					fail("connect after MSG_FASTOPEN: %s (seq=%s): VLC would fail here", strerror(errno), seq);
			}
			set_blocking(fd, 1);
		}
	}
	{
		int one = 1;
		if (rnd(&r) & 1)
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	struct sockaddr_in me, peer;
	socklen_t ml = sizeof me, pl = sizeof peer;
	char mes[64], peers[64];
	if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
		fail("getsockname/getpeername: %s", strerror(errno));
	t0 = now();

	/* phase D: duplex. The client's stream D begins with what a fastopen sendmsg already sent. */
	if (first_sent > duplex)
		fail("--duplex must be at least %zu with --connect fastopen", sizeof first);
	struct sender s = {.fd = fd, .key = stream_key('D', is_client), .start = first_sent, .len = duplex,
			   .r = {rnd(&r)}};
	pthread_t th;
	if (pthread_create(&th, NULL, sender_main, &s))
		fail("pthread_create failed");
	recv_stream(fd, stream_key('D', !is_client), duplex, 0, &r, &c, "duplex receive", 1, 0);
	pthread_join(th, NULL);
	c.writes += s.c.writes;

	int outq = -1;
	if (is_client) {
		/* phase A: send, then half-close; phase B: receive all, then EOF */
		send_stream(fd, stream_key('A', 1), 0, alen, &r, &c, "phase A send");
		if (shutdown(fd, SHUT_WR) < 0)
			fail("shutdown(SHUT_WR): %s", strerror(errno));
		if (reader_poll) {
			/* An event-driven reader (curl, VLC): non-blocking, poll(POLLIN), read at once. */
			set_blocking(fd, 0);
			poll_reader = 1;
			recv_stream(fd, stream_key('B', 0), blen, 1, &r, &c, "phase B receive (poll reader, server closed)",
				    0, 0);
		} else {
			/* A late and slow reader: the server's phase B fills the buffers and stays
			 * blocked, so data is still queued when it closes (it reports SIOCOUTQ). */
			usleep(200000);
			recv_stream(fd, stream_key('B', 0), blen, 1, &r, &c, "phase B receive (server closed)", 0, 500);
		}
		close(fd);
	} else {
		recv_stream(fd, stream_key('A', 1), alen, 1, &r, &c, "phase A receive (client shut down)", 0, 0);
		send_stream(fd, stream_key('B', 0), 0, blen, &r, &c, "phase B send");
		if (ioctl(fd, SIOCOUTQ, &outq) < 0)
			outq = -1;
		/* --end shutdown: what Python's socketserver does after a request */
		if (shutdown_end && shutdown(fd, SHUT_WR) < 0)
			fail("shutdown(SHUT_WR) after phase B: %s", strerror(errno));
		if (close(fd) < 0)
			fail("close: %s", strerror(errno));
	}
	double dt = now() - t0;
	char tail[64];
	if (!is_client)
		snprintf(tail, sizeof tail, " end=%s outq_at_close=%d", shutdown_end ? "shutdown" : "close", outq);
	else
		snprintf(tail, sizeof tail, " reader=%s eagain_after_pollin=%lu", reader_poll ? "poll" : "slow",
			 eagain_after_pollin);
	printf("tcpcheck: %s OK duplex=%zu a=%zu b=%zu seconds=%.2f local=%s peer=%s seq=%s writes=%lu reads=%lu "
	       "short_reads=%lu one_byte=%lu peeks=%lu waitall=%lu readv=%lu recvmsg=%lu%s\n",
	       role, duplex, alen, blen, dt, addr_str(&me, mes, sizeof mes), addr_str(&peer, peers, sizeof peers), seq,
	       c.writes, c.reads, c.short_reads, c.one_byte, c.peeks, c.waitall, c.readv, c.recvmsg, tail);
	return 0;
}
