/*
 * streamapi - the stream (TCP) socket calls a program sees, checked natively and under
 * libdgshim.so with both ends preloaded (issue 4: "stream sockets behave as the kernel's").
 *
 *   streamapi PORT      uses 127.0.0.1:PORT (listener), PORT+1 (listener with a full backlog),
 *                       PORT+2 (nothing listens: refused) and [::1]:PORT+3
 *
 * Between two hosts (tests/twohost/streamapi.sh): STREAMAPI_SERVER_NETNS and
 * STREAMAPI_CLIENT_NETNS name the network namespaces (/run/netns) the server and the client
 * enter right after the fork; STREAMAPI_SERVER4, STREAMAPI_CLIENT4, STREAMAPI_SERVER6 and
 * STREAMAPI_CLIENT6 their addresses in place of 127.0.0.1 and ::1.
 *
 * One process forks before it makes any socket: the child is the server (it listens and
 * accepts), the parent the client. They keep step over an AF_UNIX socketpair (which the shim
 * leaves to the OS) and each runs its half of every case on a fresh TCP connection. Every check
 * prints "ok <name>: detail" or "FAIL <name>: detail"; a difference the shim is known to have
 * (documented in docs/shim.md, "Limits") prints "KNOWN <name>: ..." instead of failing. Exit 1
 * when any check failed (either process), else 0.
 *
 * Every expectation is what Linux does (the native run of streamapi.sh proves it): where the
 * kernel's answer depends on timing (a send racing the peer's RST), the check accepts only the
 * answers the kernel can give. Under the shim (getsockopt(SOL_IWARP) answers) each connection
 * must also be carried (IWARP_TAKEN = 1), or the checks would only test the kernel again.
 *
 * Cases, in order (client / server):
 *   names      getsockname/getpeername both ends, accept()'s address, no O_NONBLOCK/FD_CLOEXEC
 *              after accept(), TCP_NODELAY read before and after set (1 and 0), a second
 *              connect after a blocking one -> EISCONN
 *   accept4    accept4(SOCK_NONBLOCK|SOCK_CLOEXEC): flags visible through fcntl, the accepted
 *              socket does not block (EAGAIN), then data arrives (poll POLLIN)
 *   reads      MSG_DONTWAIT on an empty stream -> EAGAIN, O_NONBLOCK -> EAGAIN, FIONREAD 0,
 *              SO_RCVTIMEO -> EAGAIN after the timeout, FIONREAD counts what arrived (and what
 *              is left after a short read), MSG_PEEK, MSG_WAITALL with SO_RCVTIMEO returns the
 *              part that arrived
 *   sndtimeo   SO_SNDTIMEO with a peer that does not read: once the buffers are full a send ends
 *              after the timeout (short count, or EAGAIN)
 *   nbconnect  non-blocking connect: EINPROGRESS, POLLOUT, SO_ERROR 0, connect -> 0, -> EISCONN
 *   ealready   non-blocking connect to a listener whose backlog is full: EINPROGRESS, then
 *              EALREADY while in progress; once accepted: POLLOUT, SO_ERROR 0, 0, EISCONN
 *   preaccept  connect (blocking; non-blocking: POLLOUT) returns before the server accepts, as
 *              the kernel completes the handshake: KNOWN under the shim (it waits for the MPA
 *              exchange, which the server's accept answers)
 *   v6         over ::1 (PORT+3): names as sockaddr_in6, accept's address, data both ways, ends
 *   epollet    EPOLLET: one report per arrival; EPOLLONESHOT until EPOLL_CTL_MOD; level-triggered
 *              again after MOD
 *   dup        closing one descriptor of a connection ends nothing, the last close does
 *   lowat      SO_RCVLOWAT 5: no POLLIN with 3 bytes, a recv waits (SO_RCVTIMEO ends it with the
 *              3), POLLIN and recv at once with 5
 *   fork       a forking server: the child serves the accepted connection, the parent closes its
 *              copy; the client reads the child's bytes (KNOWN under the shim: a carried stream
 *              belongs to the process that made it)
 *   refused    non-blocking connect to a closed port: SO_ERROR ECONNREFUSED once, then 0;
 *              blocking connect -> ECONNREFUSED
 *   shutwr     client SHUT_WR: its send -> EPIPE + SIGPIPE, MSG_NOSIGNAL -> EPIPE without,
 *              write() -> EPIPE + SIGPIPE, POLLOUT; server: POLLIN|POLLRDHUP (poll, epoll),
 *              data then 0, 0, can still send; server SHUT_WR -> POLLHUP on both ends, and
 *              getpeername ENOTCONN (the connection is closed)
 *   shutrd     client SHUT_RD with 5 bytes queued: recv returns them, then 0 without waiting,
 *              POLLIN|POLLRDHUP without POLLHUP; the client can still send; the server's sends
 *              succeed and (Linux) the client still reads what arrives after its SHUT_RD
 *   shutrdwr   client SHUT_RDWR: recv 0, send EPIPE, POLLIN|POLLOUT|POLLHUP|POLLRDHUP;
 *              server sees end of stream and POLLRDHUP
 *   close      client sends then closes: server POLLIN|POLLRDHUP (no POLLHUP), data, 0, 0;
 *              getpeername still works; its sends end in EPIPE (SIGPIPE counted; MSG_NOSIGNAL:
 *              no signal), then POLLHUP and getpeername ENOTCONN
 *   wake       the server waits in poll (epoll_wait) when the client shuts (closes) a connection:
 *              the wait ends with POLLIN|POLLRDHUP
 *   linger0    SO_LINGER {1,0} read back; client sends and closes at once: server POLLIN|POLLHUP|
 *              POLLRDHUP, reads the data, then ECONNRESET, then 0; send -> EPIPE
 *   resetso    the same reset read through SO_ERROR first: ECONNRESET, then 0, POLLERR gone,
 *              the data, then 0
 *   unread     client closes with data unread: the server's connection is reset (ECONNRESET,
 *              then 0, POLLERR|POLLHUP)
 *   flags      recvmsg/recvfrom give no address and no flags, MSG_TRUNC discards, select with
 *              data (read, write), MSG_WAITALL cut short by the end, MSG_PEEK at the end 0,
 *              select at the end (read), FIONREAD 0 at the end
 *   pollout    non-blocking sends until EAGAIN, no POLLOUT; a poll (then an epoll_wait) waiting
 *              for POLLOUT is woken when the peer reads
 *   blocked    a blocked recv ends with ECONNRESET when the peer resets; a send blocked for room
 *              ends (short count, ECONNRESET or EPIPE) when the peer closes unread, and the
 *              next send fails
 *   lingern    SO_LINGER {1,3}: 1 MiB written, close returns within the linger time once the
 *              data is out; server reads every byte (verified) then 0
 *   etnews     an edge-triggered epoll registration reports a byte that came after the last
 *              EAGAIN even when a call in between (FIONREAD) looked at it first
 *   duplex     two threads on one connection, as a Go or Java runtime runs them: one reads
 *              (poll, then non-blocking recv) what the peer echoes, the other writes 8 MiB
 *              (non-blocking send, epoll_wait for EPOLLOUT, edge-triggered, and goes on
 *              waiting there until the reader is done); each thread's wait ends when the
 *              other's call took the bytes it waits for (credit, data): no wait lasts 5 s,
 *              every byte comes back in order
 *   halfbulk   after the client's SHUT_WR the server writes 2 MiB (non-blocking, poll for POLLOUT):
 *              the client's credit still reaches it (no poll waits 5 s), every byte arrives
 *   xpoll      one thread answers 300 pings, each waited for in poll(POLLIN); meanwhile another
 *              thread waits in epoll_wait for EPOLLOUT on the same connection (edge-triggered:
 *              its wake-ups look at the connection too): no ping waits 2 s
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
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dgshim.h"

#define WATCHDOG_S 60
#define LINGER_BYTES (1u << 20)

static const char *role = "?";
static int port;
/* the server's and the client's addresses (127.0.0.1 and ::1 unless STREAMAPI_* say) */
static struct in_addr srv4, cli4; /* set in main */
static bool twohost; /* STREAMAPI_SERVER_NETNS given */
static struct in6_addr srv6 = IN6ADDR_LOOPBACK_INIT, cli6 = IN6ADDR_LOOPBACK_INIT;
static int ctl = -1;          /* the other process, over AF_UNIX */
static int fails;
static int shim;              /* 1: libdgshim.so answers SOL_IWARP */
static const char *cur = "start";
static volatile sig_atomic_t sigpipes;

/* ------------------------------------------------------------------ reporting */

static void vreport(const char *kind, const char *name, const char *fmt, va_list ap)
{
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	printf("%s %s.%s: %s: %s\n", kind, cur, name, role, msg);
	fflush(stdout);
}

/* check COND NAME FMT...: one result line. Returns cond. */
static bool check(bool cond, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport(cond ? "ok" : "FAIL", name, fmt, ap);
	va_end(ap);
	if (!cond)
		fails++;
	return cond;
}

/* A check where the shim has a documented difference (docs/shim.md, "Limits"): natively a
 * failure is a FAIL; under the shim it prints KNOWN (listed by streamapi.sh, not failed). */
static bool check_known(bool cond, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport(cond ? "ok" : shim ? "KNOWN" : "FAIL", name, fmt, ap);
	va_end(ap);
	if (!cond && !shim)
		fails++;
	return cond;
}

/* A fatal problem in the test's own machinery (sync lost, socket() failed): report, end. */
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("FAIL", "fatal", fmt, ap);
	va_end(ap);
	exit(1);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "FAIL watchdog: a case hung (60 s)\n";
	ssize_t r = write(1, m, sizeof m - 1);
	(void)r;
	_exit(1);
}

static void on_pipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static const char *ename(int e)
{
	switch (e) {
	case 0: return "0";
	case EAGAIN: return "EAGAIN";
	case EPIPE: return "EPIPE";
	case ECONNRESET: return "ECONNRESET";
	case ECONNREFUSED: return "ECONNREFUSED";
	case EINPROGRESS: return "EINPROGRESS";
	case EALREADY: return "EALREADY";
	case EISCONN: return "EISCONN";
	case ENOTCONN: return "ENOTCONN";
	case EINVAL: return "EINVAL";
	case ETIMEDOUT: return "ETIMEDOUT";
	default: return strerror(e);
	}
}

/* "3" or "-1 EAGAIN": a call's result for a detail */
static const char *res(ssize_t r, int e)
{
	static char b[4][64];
	static int i;
	char *p = b[i++ & 3];
	if (r < 0)
		snprintf(p, 64, "-1 %s", ename(e));
	else
		snprintf(p, 64, "%zd", r);
	return p;
}

static const char *pollstr(int ev)
{
	static char b[4][96];
	static int i;
	char *p = b[i++ & 3];
	p[0] = 0;
	static const struct { int bit; const char *n; } names[] = {
		{POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"}, {POLLHUP, "HUP"},
		{POLLNVAL, "NVAL"}, {POLLRDHUP, "RDHUP"}};
	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
		if (ev & names[k].bit)
			snprintf(p + strlen(p), 96 - strlen(p), "%s%s", p[0] ? "|" : "", names[k].n);
	if (!p[0])
		strcpy(p, "0");
	return p;
}

/* ------------------------------------------------------------------ keeping step */

/* Tags are 16 bytes on the control socket; a mismatch means the two halves lost step. */
static void say(const char *tag)
{
	char b[16] = {0};
	size_t n = strnlen(tag, sizeof b - 1);
	memcpy(b, tag, n);
	if (write(ctl, b, sizeof b) != (ssize_t)sizeof b)
		die("control socket write (%s): %s", tag, strerror(errno));
}

static void ctl_read(void *p, size_t n, const char *what)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd pf = {.fd = ctl, .events = POLLIN};
		int r = poll(&pf, 1, 30000);
		if (r == 0)
			die("waiting for the other side (%s): 30 s without word", what);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("poll on the control socket: %s", strerror(errno));
		}
		ssize_t k = read(ctl, (char *)p + got, n - got);
		if (k == 0)
			die("the other side ended while we waited for %s", what);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			die("control socket read: %s", strerror(errno));
		}
		got += (size_t)k;
	}
}

static void hear(const char *tag)
{
	char b[16];
	ctl_read(b, sizeof b, tag);
	if (strncmp(b, tag, sizeof b - 1))
		die("out of step: expected '%s' from the other side, got '%.15s'", tag, b);
}

static void put_data(const void *p, size_t n)
{
	if (write(ctl, p, n) != (ssize_t)n)
		die("control socket write: %s", strerror(errno));
}

/* ------------------------------------------------------------------ sockets */

static struct sockaddr_in addr_of(int p)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
	a.sin_addr = srv4;
	return a;
}

static int tcp_socket(int flags)
{
	int fd = socket(AF_INET, SOCK_STREAM | flags, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	return fd;
}

static int listen_on(int p, int backlog)
{
	int fd = tcp_socket(0), one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = addr_of(p);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0)
		die("bind 127.0.0.1:%d: %s", p, strerror(errno));
	if (listen(fd, backlog) < 0)
		die("listen: %s", strerror(errno));
	return fd;
}

static int connect_block(void)
{
	int fd = tcp_socket(0);
	struct sockaddr_in a = addr_of(port);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect 127.0.0.1:%d: %s", port, strerror(errno));
	return fd;
}

static int accept_one(int ls, int flags)
{
	int fd = flags ? accept4(ls, NULL, NULL, flags) : accept(ls, NULL, NULL);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	return fd;
}

/* Under the shim a connection between two preloaded ends must be carried over RC. */
static void check_carried(int fd)
{
	if (!shim)
		return;
	int v = -1;
	socklen_t l = sizeof v;
	int r = getsockopt(fd, SOL_IWARP, IWARP_TAKEN, &v, &l);
	check(r == 0 && v == 1, "carried", "IWARP_TAKEN = %d (%s): %s", v, res(r, errno),
	      v == 1 ? "carried over RC" : "the connection is plain TCP: these checks test the kernel only");
}

static int pollrev(int fd, short events, int ms)
{
	struct pollfd p = {.fd = fd, .events = events};
	int r = poll(&p, 1, ms);
	return r < 0 ? -1 : p.revents;
}

/* poll until every bit of WANT is reported (or ms pass); returns the last revents. Where data
 * comes just ahead of the end (FIN, reset), a kernel on loopback has both by the time the
 * peer's call returns; a carried stream may show the data a moment before the end, which a
 * program's next poll then reports: the check is on what poll settles at. */
static int pollrev_until(int fd, short events, int want, int ms)
{
	double end = now_ms() + ms;
	int rev;
	for (;;) {
		int left = (int)(end - now_ms());
		rev = pollrev(fd, events, left > 0 ? left : 0);
		if (rev < 0 || (rev & want) == want || left <= 0)
			return rev;
		sleep_ms(2);
	}
}

/* epoll_wait on fd alone with EVENTS; returns the events reported (0: none within ms). */
static int epollrev(int fd, uint32_t events, int ms)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1: %s", strerror(errno));
	struct epoll_event ev = {.events = events, .data.u32 = 7};
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll_ctl ADD: %s", strerror(errno));
	struct epoll_event out = {0};
	int n = epoll_wait(ep, &out, 1, ms);
	close(ep);
	if (n == 1 && out.data.u32 != 7)
		return -2;
	return n == 1 ? (int)out.events : n;
}

/* getpeername's answer: 0 (connected) or the errno */
static int peer_err(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	return getpeername(fd, (struct sockaddr *)&a, &l) == 0 ? 0 : errno;
}

static int self_err(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	return getsockname(fd, (struct sockaddr *)&a, &l) == 0 && a.sin_port ? 0 : errno ? errno : EINVAL;
}

static bool eq_addr(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
	return a->sin_family == b->sin_family && a->sin_port == b->sin_port &&
	       a->sin_addr.s_addr == b->sin_addr.s_addr;
}

static const char *astr(const struct sockaddr_in *a)
{
	static char b[4][48];
	static int i;
	char *p = b[i++ & 3], ip[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
	snprintf(p, 48, "%s:%u", ip, ntohs(a->sin_port));
	return p;
}

/* The client's and the server's end of a case's connection, checked as carried (under the shim). */
static int connect_carried(void)
{
	int fd = connect_block();
	check_carried(fd);
	return fd;
}

static int accept_carried(int ls)
{
	int fd = accept_one(ls, 0);
	check_carried(fd);
	return fd;
}

/* recv into a fresh buffer; the result and errno in *e */
static ssize_t rcv(int fd, char *buf, size_t len, int flags, int *e)
{
	errno = 0;
	ssize_t r = recv(fd, buf, len, flags);
	*e = errno;
	return r;
}

static ssize_t snd(int fd, const char *buf, size_t len, int flags, int *e)
{
	errno = 0;
	ssize_t r = send(fd, buf, len, flags);
	*e = errno;
	return r;
}

/* connect to a; the result, and errno in *e */
static int conn(int fd, const struct sockaddr_in *a, int *e)
{
	errno = 0;
	int r = connect(fd, (const struct sockaddr *)a, sizeof *a);
	*e = errno;
	return r;
}

/* One recv (flags 0, room for 16 bytes) must return exactly the bytes of want: check "recv". */
static void expect_recv(int fd, const char *want)
{
	char b[16] = {0};
	size_t len = strlen(want);
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == (ssize_t)len && !memcmp(b, want, len), "recv", "%s", res(n, e));
}

/* ------------------------------------------------------------------ cases */

static void c_names(void)
{
	int fd = connect_carried();
	struct sockaddr_in me, peer;
	socklen_t ml = sizeof me, pl = sizeof peer;
	memset(&me, 0, sizeof me), memset(&peer, 0, sizeof peer);
	int r1 = getsockname(fd, (struct sockaddr *)&me, &ml);
	int r2 = getpeername(fd, (struct sockaddr *)&peer, &pl);
	struct sockaddr_in want = addr_of(port);
	check(r1 == 0 && ml == sizeof me && me.sin_family == AF_INET && me.sin_port != 0 &&
		      me.sin_addr.s_addr == cli4.s_addr,
	      "getsockname", "%s len %u", astr(&me), (unsigned)ml);
	check(r2 == 0 && pl == sizeof peer && eq_addr(&peer, &want), "getpeername", "%s len %u (want %s)",
	      astr(&peer), (unsigned)pl, astr(&want));
	put_data(&me, sizeof me);
	put_data(&peer, sizeof peer);
	/* TCP_NODELAY: off on a new connection, and reads back what was set */
	int v = -1;
	socklen_t l = sizeof v;
	int r = getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	check(r == 0 && v == 0, "nodelay_default", "TCP_NODELAY before any setsockopt: %d (%s)", v, res(r, errno));
	int one = 1, zero = 0;
	r = setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	v = -1;
	getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	check(r == 0 && v == 1, "nodelay_set", "set 1 (%s), read back %d", res(r, errno), v);
	r = setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &zero, sizeof zero);
	v = -1;
	getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	check(r == 0 && v == 0, "nodelay_clear", "set 0 (%s), read back %d", res(r, errno), v);
	/* a second connect on a connected socket */
	errno = 0;
	r = connect(fd, (struct sockaddr *)&want, sizeof want);
	check(r < 0 && errno == EISCONN, "connect_again", "connect after a blocking connect: %s (want -1 EISCONN)",
	      res(r, errno));
	int e;
	ssize_t n = snd(fd, "ping", 4, 0, &e);
	check(n == 4, "send", "%s", res(n, e));
	hear("names-done");
	close(fd);
}

static void s_names(int ls)
{
	struct sockaddr_in from;
	socklen_t fl = sizeof from;
	memset(&from, 0, sizeof from);
	int fd = accept(ls, (struct sockaddr *)&from, &fl);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	check_carried(fd);
	int fl_ = fcntl(fd, F_GETFL), fd_ = fcntl(fd, F_GETFD);
	check(fl_ >= 0 && !(fl_ & O_NONBLOCK) && fd_ >= 0 && !(fd_ & FD_CLOEXEC), "accept_flags",
	      "accept(): O_NONBLOCK %d FD_CLOEXEC %d (want 0 0)", !!(fl_ & O_NONBLOCK), !!(fd_ & FD_CLOEXEC));
	struct sockaddr_in me, peer, cme, cpeer;
	socklen_t ml = sizeof me, pl = sizeof peer;
	memset(&me, 0, sizeof me), memset(&peer, 0, sizeof peer);
	int r1 = getsockname(fd, (struct sockaddr *)&me, &ml);
	int r2 = getpeername(fd, (struct sockaddr *)&peer, &pl);
	ctl_read(&cme, sizeof cme, "client's names");
	ctl_read(&cpeer, sizeof cpeer, "client's names");
	check(fl == sizeof from && eq_addr(&from, &cme), "accept_addr", "accept() says %s, the client is %s",
	      astr(&from), astr(&cme));
	check(r1 == 0 && eq_addr(&me, &cpeer), "getsockname", "%s, the client's peer %s", astr(&me), astr(&cpeer));
	check(r2 == 0 && pl == sizeof peer && eq_addr(&peer, &cme), "getpeername", "%s, the client's name %s",
	      astr(&peer), astr(&cme));
	int v = -1;
	socklen_t l = sizeof v;
	int r = getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	check(r == 0 && v == 0, "nodelay_default", "accepted socket's TCP_NODELAY: %d (%s)", v, res(r, errno));
	int one = 1;
	r = setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	v = -1;
	getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	check(r == 0 && v == 1, "nodelay_set", "set 1 (%s), read back %d", res(r, errno), v);
	char b[16] = {0};
	int e;
	ssize_t n = recv(fd, b, sizeof b, 0);
	e = errno;
	check(n == 4 && !memcmp(b, "ping", 4), "recv", "%s '%.*s'", res(n, e), n > 0 ? (int)n : 0, b);
	say("names-done");
	close(fd);
}

static void c_accept4(void)
{
	int fd = connect_carried();
	hear("a4-ready");
	int e;
	ssize_t n = snd(fd, "four", 4, 0, &e);
	check(n == 4, "send", "%s", res(n, e));
	hear("a4-done");
	close(fd);
}

static void s_accept4(int ls)
{
	int fd = accept_one(ls, SOCK_NONBLOCK | SOCK_CLOEXEC);
	check_carried(fd);
	int fl = fcntl(fd, F_GETFL), fdf = fcntl(fd, F_GETFD);
	check(fl >= 0 && (fl & O_NONBLOCK), "nonblock", "fcntl(F_GETFL) & O_NONBLOCK = %d", !!(fl & O_NONBLOCK));
	check(fdf >= 0 && (fdf & FD_CLOEXEC), "cloexec", "fcntl(F_GETFD) & FD_CLOEXEC = %d", !!(fdf & FD_CLOEXEC));
	char b[16];
	int e;
	double t0 = now_ms();
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n < 0 && e == EAGAIN && now_ms() - t0 < 500, "recv_empty", "recv on the empty non-blocking socket: %s",
	      res(n, e));
	say("a4-ready");
	int rev = pollrev(fd, POLLIN, 5000);
	check(rev == POLLIN, "pollin", "poll(POLLIN): %s", pollstr(rev));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 4 && !memcmp(b, "four", 4), "recv", "%s", res(n, e));
	/* O_NONBLOCK cleared through fcntl: the socket blocks again (SO_RCVTIMEO bounds it) */
	fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	struct timeval tv = {0, 200000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	t0 = now_ms();
	n = rcv(fd, b, sizeof b, 0, &e);
	double dt = now_ms() - t0;
	check(n < 0 && e == EAGAIN && dt >= 150, "blocks_after_fcntl", "recv after clearing O_NONBLOCK: %s after %.0f ms",
	      res(n, e), dt);
	say("a4-done");
	close(fd);
}

static void c_reads(void)
{
	int fd = connect_carried();
	char b[64];
	int e, v = -1;
	ssize_t n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(n < 0 && e == EAGAIN, "dontwait_empty", "recv(MSG_DONTWAIT) on an empty stream: %s", res(n, e));
	n = rcv(fd, b, sizeof b, MSG_DONTWAIT | MSG_PEEK, &e);
	check(n < 0 && e == EAGAIN, "peek_dontwait_empty", "recv(MSG_PEEK|MSG_DONTWAIT): %s", res(n, e));
	n = rcv(fd, b, 0, MSG_DONTWAIT, &e);
	check(n < 0 && e == EAGAIN, "recv_len0_dontwait", "recv of 0 bytes with MSG_DONTWAIT on an empty stream: %s",
	      res(n, e));
	n = snd(fd, b, 0, 0, &e);
	check(n == 0, "send_len0", "send of 0 bytes: %s", res(n, e));
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n < 0 && e == EAGAIN, "nonblock_empty", "recv with O_NONBLOCK: %s", res(n, e));
	errno = 0;
	n = read(fd, b, sizeof b);
	e = errno;
	check(n < 0 && e == EAGAIN, "read_nonblock_empty", "read with O_NONBLOCK: %s", res(n, e));
	fcntl(fd, F_SETFL, fl);
	int r = ioctl(fd, FIONREAD, &v);
	check(r == 0 && v == 0, "fionread_empty", "FIONREAD %d (%s)", v, res(r, errno));
	int rev = pollrev(fd, POLLIN | POLLRDHUP, 0);
	check(rev == 0, "poll_quiet", "poll(POLLIN|POLLRDHUP) on a quiet stream: %s", pollstr(rev));
	struct timeval tv = {0, 300000}, got = {0, 0};
	socklen_t tl = sizeof got;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &got, &tl);
	check(got.tv_sec == 0 && got.tv_usec == 300000, "rcvtimeo_get", "SO_RCVTIMEO read back %ld.%06ld",
	      (long)got.tv_sec, (long)got.tv_usec);
	double t0 = now_ms();
	n = rcv(fd, b, sizeof b, 0, &e);
	double dt = now_ms() - t0;
	check(n < 0 && e == EAGAIN && dt >= 250 && dt < 3000, "rcvtimeo", "recv: %s after %.0f ms (timeout 300 ms)",
	      res(n, e), dt);
	/* Linux: a blocking read of 0 bytes waits for data like any read, then returns 0 (also
	 * when the timeout ends the wait) */
	t0 = now_ms();
	n = rcv(fd, b, 0, 0, &e);
	dt = now_ms() - t0;
	check(n == 0 && dt >= 250 && dt < 3000, "recv_len0_timeo", "recv of 0 bytes on an empty stream: %s after %.0f ms "
	      "(want 0 after the 300 ms timeout)", res(n, e), dt);
	say("reads-send");
	hear("reads-sent");
	/* "abc" and "defg" in two sends: FIONREAD counts both once they arrived */
	rev = pollrev(fd, POLLIN, 5000);
	check(rev == POLLIN, "pollin", "poll(POLLIN): %s", pollstr(rev));
	t0 = now_ms();
	n = rcv(fd, b, 0, 0, &e);
	dt = now_ms() - t0;
	check(n == 0 && dt < 200, "recv_len0_data", "recv of 0 bytes with data queued: %s after %.0f ms (want 0 at once)",
	      res(n, e), dt);
	t0 = now_ms();
	do {
		v = -1;
		r = ioctl(fd, FIONREAD, &v);
	} while (r == 0 && v < 7 && now_ms() - t0 < 2000 && (sleep_ms(5), 1));
	check(r == 0 && v == 7, "fionread", "FIONREAD %d after two sends of 3 and 4 bytes", v);
	n = rcv(fd, b, 3, 0, &e);
	check(n == 3 && !memcmp(b, "abc", 3), "short_read", "recv(3): %s", res(n, e));
	v = -1;
	r = ioctl(fd, FIONREAD, &v);
	int v2 = -1;
	ioctl(fd, SIOCINQ, &v2);
	check(r == 0 && v == 4 && v2 == 4, "fionread_left", "FIONREAD %d, SIOCINQ %d after reading 3 of 7", v, v2);
	memset(b, 0, sizeof b);
	n = rcv(fd, b, sizeof b, MSG_PEEK, &e);
	check(n == 4 && !memcmp(b, "defg", 4), "peek", "recv(MSG_PEEK): %s '%.4s'", res(n, e), b);
	/* MSG_WAITALL for more than will come: the timeout ends it with what arrived */
	memset(b, 0, sizeof b);
	t0 = now_ms();
	n = rcv(fd, b, 10, MSG_WAITALL, &e);
	dt = now_ms() - t0;
	check(n == 4 && !memcmp(b, "defg", 4) && dt >= 250, "waitall_timeout",
	      "recv(10, MSG_WAITALL) with SO_RCVTIMEO 300 ms: %s '%.4s' after %.0f ms (want 4)", res(n, e), b, dt);
	v = -1;
	r = ioctl(fd, FIONREAD, &v);
	check(r == 0 && v == 0, "fionread_drained", "FIONREAD %d", v);
	n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(n < 0 && e == EAGAIN, "dontwait_drained", "recv(MSG_DONTWAIT) after reading all: %s", res(n, e));
	say("reads-done");
	close(fd);
}

static void s_reads(int ls)
{
	int fd = accept_carried(ls);
	hear("reads-send");
	int e;
	ssize_t n1 = snd(fd, "abc", 3, 0, &e);
	ssize_t n2 = snd(fd, "defg", 4, 0, &e);
	check(n1 == 3 && n2 == 4, "send", "%zd and %zd", n1, n2);
	say("reads-sent");
	hear("reads-done");
	close(fd);
}

static void c_sndtimeo(void)
{
	int fd = connect_carried();
	struct timeval tv = {0, 200000};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	static char chunk[64 << 10];
	memset(chunk, 'x', sizeof chunk);
	size_t total = 0;
	ssize_t n = 0;
	int e = 0;
	double t0 = now_ms(), dt = 0;
	/* the peer does not read: once the buffers are full a send must end within the timeout */
	while (total < (256u << 20) && now_ms() - t0 < 20000) {
		double s0 = now_ms();
		n = snd(fd, chunk, sizeof chunk, 0, &e);
		dt = now_ms() - s0;
		if (n < (ssize_t)sizeof chunk)
			break;
		total += (size_t)n;
	}
	/* the kernel returns what it took before the timeout (or EAGAIN when it took nothing) */
	check(((n < 0 && e == EAGAIN) || (n >= 0 && n < (ssize_t)sizeof chunk)) && dt >= 150 && dt < 3000, "sndtimeo",
	      "after %zu bytes a send of 64 KiB: %s after %.0f ms (want a short count or EAGAIN after the 200 ms "
	      "timeout)", total, res(n, e), dt);
	say("sndtimeo-done");
	close(fd);
}

static void s_sndtimeo(int ls)
{
	int fd = accept_carried(ls);
	hear("sndtimeo-done");
	close(fd);
}

static void c_nbconnect(void)
{
	int fd = tcp_socket(SOCK_NONBLOCK);
	struct sockaddr_in a = addr_of(port);
	int e;
	int r = conn(fd, &a, &e);
	check(r < 0 && e == EINPROGRESS, "einprogress", "non-blocking connect: %s", res(r, e));
	int rev = pollrev(fd, POLLOUT, 10000);
	check(rev == POLLOUT, "pollout", "poll(POLLOUT): %s", pollstr(rev));
	int v = -1;
	socklen_t l = sizeof v;
	r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	check(r == 0 && v == 0, "so_error", "SO_ERROR %s", ename(v));
	r = conn(fd, &a, &e);
	check(r == 0, "connect_again", "second connect after POLLOUT: %s (want 0, as VLC expects)", res(r, e));
	r = conn(fd, &a, &e);
	check(r < 0 && e == EISCONN, "connect_third", "third connect: %s (want -1 EISCONN)", res(r, e));
	check_carried(fd);
	ssize_t n = snd(fd, "nb", 2, 0, &e);
	check(n == 2, "send", "%s", res(n, e));
	hear("nb-done");
	close(fd);
}

static void s_nbconnect(int ls)
{
	int fd = accept_one(ls, 0);
	expect_recv(fd, "nb");
	say("nb-done");
	close(fd);
}

/* Edge-triggered and one-shot epoll: one report per arrival; ONESHOT until EPOLL_CTL_MOD. */
static void c_epollet(void)
{
	int fd = connect_carried();
	for (int i = 0; i < 5; i++) {
		hear("et-next");
		int e;
		ssize_t n = snd(fd, "e", 1, 0, &e);
		if (n != 1)
			check(false, "send", "%s", res(n, e));
	}
	hear("et-done");
	close(fd);
}

static void s_epollet(int ls)
{
	int fd = accept_carried(ls);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u32 = 5}, out;
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	int n0 = epoll_wait(ep, &out, 1, 100);
	say("et-next");
	int n1 = epoll_wait(ep, &out, 1, 5000);
	uint32_t e1 = n1 == 1 ? out.events : 0;
	int n2 = epoll_wait(ep, &out, 1, 200); /* not read: no new edge */
	check(n0 == 0 && n1 == 1 && e1 == EPOLLIN && n2 == 0, "edge", "EPOLLET: before data %d, on data %d (%s), again "
	      "without reading %d (want 0, 1 IN, 0)", n0, n1, pollstr((int)e1), n2);
	say("et-next");
	n1 = epoll_wait(ep, &out, 1, 5000);
	check(n1 == 1 && out.events == EPOLLIN, "edge_again", "EPOLLET: a second arrival, still unread: %d (%s) (want 1 IN)",
	      n1, n1 == 1 ? pollstr((int)out.events) : "-");
	ev.events = EPOLLIN | EPOLLONESHOT;
	epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
	n1 = epoll_wait(ep, &out, 1, 1000);
	n2 = epoll_wait(ep, &out, 1, 200);
	check(n1 == 1 && n2 == 0, "oneshot", "EPOLLONESHOT with data queued: %d, then %d (want 1, 0)", n1, n2);
	epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
	n1 = epoll_wait(ep, &out, 1, 1000);
	check(n1 == 1 && out.events == EPOLLIN, "oneshot_mod", "after EPOLL_CTL_MOD: %d (want 1 IN)", n1);
	char b[8];
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 2, "recv", "%s", res(n, e));
	ev.events = EPOLLIN;
	epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
	n2 = epoll_wait(ep, &out, 1, 200);
	say("et-next");
	n1 = epoll_wait(ep, &out, 1, 5000);
	int n3 = epoll_wait(ep, &out, 1, 100);
	check(n2 == 0 && n1 == 1 && n3 == 1, "level", "level-triggered: drained %d, on data %d, again unread %d "
	      "(want 0, 1, 1)", n2, n1, n3);
	/* Deleted, then added again: with a wait between (the data that came meanwhile is not
	 * reported while deleted) and without (the shim keeps a deleted stream's registration
	 * until the next wait and takes it back: hiredis deletes and adds around every request) */
	for (int round = 0; round < 2; round++) {
		n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
		check(n == 1, "del_drain", "round %d: %s (want 1 byte)", round, res(n, e));
		check(epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL) == 0, "del", "round %d: %s", round, strerror(errno));
		errno = 0;
		int m = epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev), me = errno;
		errno = 0;
		int d = epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL), de = errno;
		check(m == -1 && me == ENOENT && d == -1 && de == ENOENT, "del_enoent", "round %d: MOD and DEL after "
		      "DEL: %d %s, %d %s (want ENOENT)", round, m, strerror(me), d, strerror(de));
		say("et-next");
		if (round == 0) {
			n1 = epoll_wait(ep, &out, 1, 300);
			check(n1 == 0, "del_quiet", "data for a deleted registration reported: %d (want 0)", n1);
		} else {
			sleep_ms(100); /* the data is there before the ADD */
		}
		ev.events = EPOLLIN | EPOLLET;
		ev.data.u32 = 7 + (uint32_t)round;
		check(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "readd", "round %d: %s", round, strerror(errno));
		n1 = epoll_wait(ep, &out, 1, 5000);
		uint32_t d1 = n1 == 1 ? out.data.u32 : 0;
		n2 = epoll_wait(ep, &out, 1, 200);
		check(n1 == 1 && d1 == 7 + (uint32_t)round && n2 == 0, "readd_edge", "round %d: added again with data "
		      "unread: %d (data %u), then %d (want 1 with the new data, then 0)", round, n1, d1, n2);
	}
	close(ep);
	say("et-done");
	close(fd);
}

/* A forking server: the parent accepts, a child serves the connection, the parent closes its
 * copy. The shim answers an accepted connection at its first use, so the child carries it
 * (docs/shim.md, "Forking servers"). */
static void c_fork(void)
{
	int fd = connect_carried();
	struct timeval tv = {3, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char b[16] = {0};
	int e;
	ssize_t n = rcv(fd, b, sizeof b, MSG_WAITALL, &e);
	check(n == 5 && !memcmp(b, "child", 5), "served", "what the forked child sent, then the end: %s '%.5s' "
		    "(want 5 'child')", res(n, e), b);
	hear("fork-done");
	close(fd);
}

static void s_fork(int ls)
{
	int fd = accept_one(ls, 0);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		ssize_t n = send(fd, "child", 5, MSG_NOSIGNAL);
		close(fd);
		_exit(n == 5 ? 0 : 1);
	}
	close(fd); /* the parent's copy: the connection stays the child's */
	int st = -1;
	if (pid > 0)
		waitpid(pid, &st, 0);
	check(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child_send", "the child's send: %s",
		    pid < 0 ? "fork failed" : WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "5 bytes" : "failed");
	say("fork-done");
}

/* SO_RCVLOWAT: readable (poll, recv) only once that many bytes are there. */
static void c_lowat(void)
{
	int fd = connect_carried();
	int lw = 5, got = -1;
	socklen_t l = sizeof got;
	int r = setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lw, sizeof lw);
	getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &got, &l);
	check(r == 0 && got == 5, "get", "SO_RCVLOWAT set 5 (%s), read back %d", res(r, errno), got);
	say("lowat-send3");
	hear("lowat-sent3");
	sleep_ms(100);
	int rev = pollrev(fd, POLLIN, 200);
	check(rev == 0, "poll_below", "poll(POLLIN) with 3 of 5 bytes: %s (want 0)", pollstr(rev));
	struct timeval tv = {0, 300000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char b[16] = {0};
	int e;
	double t0 = now_ms();
	ssize_t n = rcv(fd, b, sizeof b, MSG_PEEK, &e);
	double dt = now_ms() - t0;
	check(n == 3 && dt >= 250, "recv_below", "recv(MSG_PEEK) with 3 of 5 bytes and SO_RCVTIMEO 300 ms: %s after %.0f ms "
	      "(want 3 once the timeout ends the wait)", res(n, e), dt);
	say("lowat-send2");
	hear("lowat-sent2");
	rev = pollrev(fd, POLLIN, 2000);
	check(rev == POLLIN, "poll_reached", "poll(POLLIN) with 5 bytes: %s", pollstr(rev));
	t0 = now_ms();
	n = rcv(fd, b, sizeof b, 0, &e);
	dt = now_ms() - t0;
	check(n == 5 && dt < 200, "recv_reached", "recv with 5 bytes: %s after %.0f ms (want 5 at once)", res(n, e), dt);
	say("lowat-done");
	close(fd);
}

static void s_lowat(int ls)
{
	int fd = accept_carried(ls);
	int e;
	hear("lowat-send3");
	ssize_t n = snd(fd, "abc", 3, 0, &e);
	say("lowat-sent3");
	hear("lowat-send2");
	ssize_t n2 = snd(fd, "de", 2, 0, &e);
	check(n == 3 && n2 == 2, "send", "%zd, %zd", n, n2);
	say("lowat-sent2");
	hear("lowat-done");
	close(fd);
}

/* dup: closing one descriptor of a connection ends nothing; the last close does. */
static void c_dup(void)
{
	int fd = connect_carried();
	int d = dup(fd);
	check(d >= 0, "dup", "%d", d);
	close(fd);
	/* the closed number is reused at once (the kernel hands out the lowest free one): whatever
	 * ran on it must have moved to the duplicate, or it now reads and writes this pipe */
	int pf[2];
	check(pipe(pf) == 0, "pipe", "%s", strerror(errno));
	check(write(pf[1], "pipe", 4) == 4, "pipe_write", "%s", strerror(errno));
	int e;
	ssize_t n = snd(d, "via dup", 7, 0, &e);
	check(n == 7, "send_dup", "send through the duplicate after closing the original: %s", res(n, e));
	hear("dup-read");
	char b[16] = {0};
	n = rcv(d, b, sizeof b, 0, &e);
	check(n == 8 && !memcmp(b, "dup back", 8), "recv_dup", "the answer through the duplicate: %s '%.8s'",
	      res(n, e), b);
	memset(b, 0, sizeof b);
	fcntl(pf[0], F_SETFL, O_NONBLOCK);
	n = read(pf[0], b, sizeof b);
	check(n == 4 && !memcmp(b, "pipe", 4), "pipe_intact",
	      "the pipe on the closed number (fd %d, was the connection's %d) holds what was written: %zd '%.4s'",
	      pf[0], fd, n, b);
	close(pf[0]);
	close(pf[1]);
	close(d);
	say("dup-closed");
	hear("dup-done");
}

static void s_dup(int ls)
{
	int fd = accept_carried(ls);
	char b[16] = {0};
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 7 && !memcmp(b, "via dup", 7), "recv", "%s '%.7s'", res(n, e), b);
	int rev = pollrev(fd, POLLIN | POLLRDHUP, 200);
	check(rev == 0, "open", "poll(IN|RDHUP) while a duplicate is open: %s (want 0)", pollstr(rev));
	say("dup-read");
	n = snd(fd, "dup back", 8, 0, &e);
	check(n == 8, "send_back", "%s", res(n, e));
	hear("dup-closed");
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "after the last descriptor closed: %s (want 0)", res(n, e));
	say("dup-done");
	close(fd);
}

/* IPv6 (::1, PORT+3): names as sockaddr_in6, data both ways, the end. */
static void c_v6(void)
{
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket(AF_INET6): %s", strerror(errno));
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)(port + 3)),
				 .sin6_addr = srv6};
	hear("v6-listening");
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect [::1]:%d: %s", port + 3, strerror(errno));
	check_carried(fd);
	struct sockaddr_in6 me, peer;
	socklen_t ml = sizeof me, pl = sizeof peer;
	int r1 = getsockname(fd, (struct sockaddr *)&me, &ml);
	int r2 = getpeername(fd, (struct sockaddr *)&peer, &pl);
	check(r1 == 0 && ml == sizeof me && me.sin6_family == AF_INET6 && IN6_ARE_ADDR_EQUAL(&me.sin6_addr, &cli6) &&
		      me.sin6_port, "getsockname", "len %u family %d port %u", (unsigned)ml, me.sin6_family,
	      ntohs(me.sin6_port));
	check(r2 == 0 && pl == sizeof peer && peer.sin6_family == AF_INET6 && IN6_ARE_ADDR_EQUAL(&peer.sin6_addr, &srv6) &&
		      peer.sin6_port == a.sin6_port, "getpeername", "len %u family %d port %u", (unsigned)pl,
	      peer.sin6_family, ntohs(peer.sin6_port));
	put_data(&me, sizeof me);
	int e;
	ssize_t n = snd(fd, "six", 3, 0, &e);
	check(n == 3, "send", "%s", res(n, e));
	int r = shutdown(fd, SHUT_WR);
	check(r == 0, "shutdown", "%s", res(r, errno));
	char b[8] = {0};
	n = rcv(fd, b, sizeof b, MSG_WAITALL, &e);
	check(n == 4 && !memcmp(b, "back", 4), "recv", "%s '%.4s' then the end", res(n, e), b);
	hear("v6-done");
	close(fd);
}

static void s_v6(int ls)
{
	(void)ls;
	int l6 = socket(AF_INET6, SOCK_STREAM, 0), one = 1;
	if (l6 < 0)
		die("socket(AF_INET6): %s", strerror(errno));
	setsockopt(l6, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)(port + 3)),
				 .sin6_addr = srv6};
	if (bind(l6, (struct sockaddr *)&a, sizeof a) < 0 || listen(l6, 4) < 0)
		die("bind/listen [::1]:%d: %s", port + 3, strerror(errno));
	say("v6-listening");
	struct sockaddr_in6 from;
	socklen_t fl = sizeof from;
	int fd = accept(l6, (struct sockaddr *)&from, &fl);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	check_carried(fd);
	struct sockaddr_in6 cme;
	ctl_read(&cme, sizeof cme, "the client's name");
	check(fl == sizeof from && from.sin6_port == cme.sin6_port && IN6_ARE_ADDR_EQUAL(&from.sin6_addr, &cli6), "accept_addr",
	      "accept() port %u, the client's %u", ntohs(from.sin6_port), ntohs(cme.sin6_port));
	char b[8] = {0};
	int e;
	ssize_t n = rcv(fd, b, sizeof b, MSG_WAITALL, &e);
	check(n == 3 && !memcmp(b, "six", 3), "recv", "%s '%.3s' then the end", res(n, e), b);
	n = snd(fd, "back", 4, 0, &e);
	check(n == 4, "send", "%s", res(n, e));
	close(fd);
	say("v6-done");
	close(l6);
}

/* The kernel completes a connection before the server accepts it: connect returns (POLLOUT
 * for a non-blocking one) while the server is still busy. A carried stream's connect waits for
 * the MPA exchange, which the server's accept answers: KNOWN under the shim. */
static void c_preaccept(void)
{
	say("pa-go"); /* the server accepts 600 ms from now */
	double t0 = now_ms();
	int fd = connect_block();
	double dt = now_ms() - t0;
	check_known(dt < 300, "connect", "blocking connect while the server has not accepted yet: returned after %.0f ms "
		    "(the kernel: at once; the server accepts after 600 ms)", dt);
	hear("pa-accepted");
	check_carried(fd);
	int nb = tcp_socket(SOCK_NONBLOCK);
	struct sockaddr_in a = addr_of(port);
	say("pa-go2");
	int e;
	int r = conn(nb, &a, &e);
	int rev = pollrev(nb, POLLOUT, 300);
	check(r < 0 && e == EINPROGRESS, "nb_einprogress", "non-blocking connect: %s", res(r, e));
	check_known(rev == POLLOUT, "nb_pollout", "poll(POLLOUT, 300 ms) while the server has not accepted yet: %s "
		    "(the kernel: OUT at once)", pollstr(rev));
	rev = pollrev(nb, POLLOUT, 10000);
	check(rev == POLLOUT, "nb_pollout_accepted", "poll(POLLOUT) once accepted: %s", pollstr(rev));
	int v = -1;
	socklen_t l = sizeof v;
	getsockopt(nb, SOL_SOCKET, SO_ERROR, &v, &l);
	check(v == 0, "nb_so_error", "SO_ERROR %s", ename(v));
	ssize_t n = snd(nb, "pa", 2, 0, &e);
	check(n == 2, "send", "%s", res(n, e));
	hear("pa-done");
	close(fd);
	close(nb);
}

static void s_preaccept(int ls)
{
	hear("pa-go");
	sleep_ms(600);
	int a1 = accept_one(ls, 0);
	say("pa-accepted");
	hear("pa-go2");
	sleep_ms(600);
	int a2 = accept_one(ls, 0);
	expect_recv(a2, "pa");
	say("pa-done");
	close(a1);
	close(a2);
}

/* The listener on PORT+1 has backlog 0: one connection fills its queue, the SYN of a second
 * is dropped until the first is accepted, so the second stays connecting. */
static void c_ealready(void)
{
	struct sockaddr_in a = addr_of(port + 1);
	int c1 = tcp_socket(SOCK_NONBLOCK), c2 = tcp_socket(SOCK_NONBLOCK);
	int e;
	int r = conn(c1, &a, &e);
	check(r < 0 && e == EINPROGRESS, "first_einprogress", "first connect: %s", res(r, e));
	sleep_ms(100); /* its handshake is done: it fills the queue */
	r = conn(c2, &a, &e);
	check(r < 0 && e == EINPROGRESS, "einprogress", "second socket's connect: %s", res(r, e));
	r = conn(c2, &a, &e);
	check(r < 0 && e == EALREADY, "ealready", "connect again while in progress: %s (want -1 EALREADY)", res(r, e));
	int rev = pollrev(c2, POLLOUT, 0);
	check(rev == 0, "no_pollout_yet", "poll(POLLOUT) while in progress: %s", pollstr(rev));
	say("ea-accept");
	int v;
	socklen_t l = sizeof v;
	for (int i = 0; i < 2; i++) {
		int fd = i ? c2 : c1;
		const char *w = i ? "second" : "first";
		rev = pollrev(fd, POLLOUT, 10000);
		check(rev == POLLOUT, i ? "pollout" : "first_pollout", "%s: poll(POLLOUT): %s", w, pollstr(rev));
		v = -1;
		r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
		check(r == 0 && v == 0, i ? "so_error" : "first_so_error", "%s: SO_ERROR %s", w, ename(v));
	}
	r = conn(c2, &a, &e);
	check(r == 0, "connect_done", "connect once connected: %s (want 0)", res(r, e));
	r = conn(c2, &a, &e);
	check(r < 0 && e == EISCONN, "connect_isconn", "and again: %s (want -1 EISCONN)", res(r, e));
	check_carried(c2);
	ssize_t n = snd(c2, "c2", 2, 0, &e);
	check(n == 2, "send", "%s", res(n, e));
	hear("ea-done");
	close(c1);
	close(c2);
}

static void s_ealready(int ls2)
{
	hear("ea-accept");
	int a1 = accept_one(ls2, 0);
	int a2 = accept_one(ls2, 0); /* the second's SYN comes again after 1 s */
	expect_recv(a2, "c2");
	say("ea-done");
	close(a1);
	close(a2);
}

static void c_refused(void)
{
	struct sockaddr_in a = addr_of(port + 2);
	int fd = tcp_socket(SOCK_NONBLOCK);
	int e;
	int r = conn(fd, &a, &e);
	check(r < 0 && e == EINPROGRESS, "einprogress", "non-blocking connect to a closed port: %s", res(r, e));
	int rev = pollrev(fd, POLLOUT, 5000);
	check(rev >= 0 && (rev & POLLOUT) && (rev & POLLERR) && (rev & POLLHUP), "poll", "poll(POLLOUT): %s",
	      pollstr(rev));
	int v = -1;
	socklen_t l = sizeof v;
	r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	check(r == 0 && v == ECONNREFUSED, "so_error", "SO_ERROR %s (want ECONNREFUSED)", ename(v));
	v = -1;
	r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	check(r == 0 && v == 0, "so_error_cleared", "SO_ERROR read again: %s", ename(v));
	close(fd);
	fd = tcp_socket(0);
	r = conn(fd, &a, &e);
	check(r < 0 && e == ECONNREFUSED, "blocking", "blocking connect to a closed port: %s", res(r, e));
	close(fd);
}

static void c_shutwr(void)
{
	int fd = connect_carried();
	int e;
	ssize_t n = snd(fd, "hello", 5, 0, &e);
	check(n == 5, "send", "%s", res(n, e));
	int r = shutdown(fd, SHUT_WR);
	check(r == 0, "shutdown", "shutdown(SHUT_WR): %s", res(r, errno));
	r = shutdown(fd, SHUT_WR);
	check(r == 0, "shutdown_again", "shutdown(SHUT_WR) again: %s", res(r, errno));
	int before = sigpipes;
	n = snd(fd, "x", 1, 0, &e);
	check(n < 0 && e == EPIPE && sigpipes == before + 1, "send_epipe_sigpipe",
	      "send after SHUT_WR: %s, %d SIGPIPE", res(n, e), (int)(sigpipes - before));
	before = sigpipes;
	n = snd(fd, "x", 1, MSG_NOSIGNAL, &e);
	check(n < 0 && e == EPIPE && sigpipes == before, "send_nosignal", "send(MSG_NOSIGNAL): %s, %d SIGPIPE",
	      res(n, e), (int)(sigpipes - before));
	before = sigpipes;
	errno = 0;
	n = write(fd, "x", 1);
	e = errno;
	check(n < 0 && e == EPIPE && sigpipes == before + 1, "write_epipe_sigpipe", "write: %s, %d SIGPIPE",
	      res(n, e), (int)(sigpipes - before));
	int rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == POLLOUT, "poll", "poll(IN|OUT|RDHUP) after our SHUT_WR: %s (want OUT)", pollstr(rev));
	say("shutwr-shut");
	hear("shutwr-replied");
	char b[16] = {0};
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 5 && !memcmp(b, "reply", 5), "recv_reply", "the server still sends after our SHUT_WR: %s '%.5s'",
	      res(n, e), b);
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "after the server's SHUT_WR: %s", res(n, e));
	rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 2000);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "poll_both_shut", "poll(IN|OUT|RDHUP): %s (want IN|OUT|HUP|RDHUP)",
	      pollstr(rev));
	rev = epollrev(fd, EPOLLIN | EPOLLRDHUP, 2000);
	check(rev == (EPOLLIN | EPOLLRDHUP | EPOLLHUP), "epoll_both_shut", "epoll(IN|RDHUP): %s (want IN|HUP|RDHUP)",
	      pollstr(rev));
	int pe = peer_err(fd), se = self_err(fd);
	check(pe == ENOTCONN && se == 0, "names_both_shut", "getpeername %s (want ENOTCONN: both FINs went), getsockname %s",
	      ename(pe), ename(se));
	r = shutdown(fd, SHUT_RDWR);
	check(r < 0 && errno == ENOTCONN, "shutdown_closed", "shutdown(SHUT_RDWR) once both FINs went: %s (want -1 ENOTCONN)",
	      res(r, errno));
	say("shutwr-done");
	close(fd);
}

/* The peer's last bytes want and its FIN, as the reader sees them: poll and epoll report IN|RDHUP
 * (after: what the peer did, for the message), recv returns those bytes, then 0, then 0 again
 * (recv flags again_flags). */
static void expect_last_bytes_then_eof(int fd, const char *after, const char *want, int again_flags)
{
	int rev = pollrev_until(fd, POLLIN | POLLRDHUP, POLLIN | POLLRDHUP, 5000);
	check(rev == (POLLIN | POLLRDHUP), "poll", "poll(IN|RDHUP) %s: %s (want IN|RDHUP)", after, pollstr(rev));
	rev = epollrev(fd, EPOLLIN | EPOLLRDHUP, 5000);
	check(rev == (EPOLLIN | EPOLLRDHUP), "epoll", "epoll(IN|RDHUP): %s (want IN|RDHUP)", pollstr(rev));
	expect_recv(fd, want);
	char b[16];
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "%s", res(n, e));
	n = rcv(fd, b, sizeof b, again_flags, &e);
	check(n == 0, "recv_eof_again", "%s", res(n, e));
}

static void s_shutwr(int ls)
{
	int fd = accept_carried(ls);
	hear("shutwr-shut");
	expect_last_bytes_then_eof(fd, "after the client's SHUT_WR", "hello", MSG_DONTWAIT);
	int e;
	ssize_t n;
	int rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP), "poll_drained", "poll(IN|OUT|RDHUP) after reading 0: %s",
	      pollstr(rev));
	n = snd(fd, "reply", 5, 0, &e);
	check(n == 5, "send", "the half-closed peer still reads: %s", res(n, e));
	int r = shutdown(fd, SHUT_WR);
	check(r == 0, "shutdown", "shutdown(SHUT_WR): %s", res(r, errno));
	rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "poll_both_shut", "poll(IN|OUT|RDHUP): %s (want IN|OUT|HUP|RDHUP)",
	      pollstr(rev));
	say("shutwr-replied");
	hear("shutwr-done");
	int pe = peer_err(fd), se = self_err(fd);
	check(pe == ENOTCONN && se == 0, "names_both_shut", "getpeername %s (want ENOTCONN: both FINs went), getsockname %s",
	      ename(pe), ename(se));
	r = shutdown(fd, SHUT_RDWR);
	check(r < 0 && errno == ENOTCONN, "shutdown_closed", "shutdown(SHUT_RDWR) once both FINs went: %s (want -1 ENOTCONN)",
	      res(r, errno));
	close(fd);
}

static void c_shutrd(void)
{
	int fd = connect_carried();
	hear("shutrd-early");
	int rev = pollrev(fd, POLLIN, 5000);
	check(rev == POLLIN, "pollin", "poll(POLLIN) with data queued: %s", pollstr(rev));
	int r = shutdown(fd, SHUT_RD);
	check(r == 0, "shutdown", "shutdown(SHUT_RD): %s", res(r, errno));
	char b[16] = {0};
	int e;
	/* Linux: SHUT_RD only ends the reading side once nothing is queued; what had arrived is
	 * still read */
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 5 && !memcmp(b, "early", 5), "recv_queued", "recv after SHUT_RD with 5 bytes queued: %s '%.5s' (want 5)",
	      res(n, e), b);
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "recv after SHUT_RD, nothing queued: %s (want 0, no wait)", res(n, e));
	n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(n == 0, "recv_eof_dontwait", "recv(MSG_DONTWAIT) after SHUT_RD: %s (want 0)", res(n, e));
	rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP), "poll", "poll(IN|OUT|RDHUP) after SHUT_RD: %s (want IN|OUT|RDHUP)",
	      pollstr(rev));
	n = snd(fd, "still", 5, 0, &e);
	check(n == 5, "send", "send after SHUT_RD: %s", res(n, e));
	say("shutrd-sent");
	hear("shutrd-late");
	/* Linux queues what the peer sends after our SHUT_RD, and recv returns it */
	double t0 = now_ms();
	memset(b, 0, sizeof b);
	do
		n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	while (n == 0 && now_ms() - t0 < 2000 && (sleep_ms(5), 1));
	check(n == 4 && !memcmp(b, "late", 4), "recv_late", "data sent after our SHUT_RD: %s '%.4s' (want 4, as Linux)",
	      res(n, e), b);
	say("shutrd-done");
	close(fd);
}

static void s_shutrd(int ls)
{
	int fd = accept_carried(ls);
	int e;
	ssize_t n = snd(fd, "early", 5, 0, &e);
	check(n == 5, "send_early", "%s", res(n, e));
	say("shutrd-early");
	hear("shutrd-sent");
	char b[16] = {0};
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 5 && !memcmp(b, "still", 5), "recv", "the client's data after its SHUT_RD: %s", res(n, e));
	int rev = pollrev(fd, POLLIN | POLLRDHUP, 200);
	check(rev == 0, "poll", "poll(IN|RDHUP): %s (the peer's SHUT_RD is not seen)", pollstr(rev));
	n = snd(fd, "late", 4, MSG_NOSIGNAL, &e);
	check(n == 4, "send", "send to a peer that shut its read side: %s", res(n, e));
	say("shutrd-late");
	hear("shutrd-done");
	close(fd);
}

static void c_shutrdwr(void)
{
	int fd = connect_carried();
	int r = shutdown(fd, SHUT_RDWR);
	check(r == 0, "shutdown", "shutdown(SHUT_RDWR): %s", res(r, errno));
	char b[16];
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "%s", res(n, e));
	n = snd(fd, "x", 1, MSG_NOSIGNAL, &e);
	check(n < 0 && e == EPIPE, "send_epipe", "%s", res(n, e));
	int rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "poll", "poll(IN|OUT|RDHUP): %s (want IN|OUT|HUP|RDHUP)",
	      pollstr(rev));
	rev = epollrev(fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, 0);
	check(rev == (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP), "epoll", "epoll(IN|OUT|RDHUP): %s", pollstr(rev));
	say("shutrdwr-shut");
	hear("shutrdwr-done");
	close(fd);
}

static void s_shutrdwr(int ls)
{
	int fd = accept_carried(ls);
	hear("shutrdwr-shut");
	int rev = pollrev_until(fd, POLLIN | POLLRDHUP, POLLIN | POLLRDHUP, 5000);
	check(rev == (POLLIN | POLLRDHUP), "poll", "poll(IN|RDHUP): %s (want IN|RDHUP)", pollstr(rev));
	char b[16];
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "%s", res(n, e));
	say("shutrdwr-done");
	close(fd);
}

/* Sends until EPIPE (the kernel's first sends may still succeed: the peer's RST is on its
 * way). Returns the number of tries; *e the last errno. */
static int send_until_epipe(int fd, int flags, int *e, ssize_t *last)
{
	int i;
	for (i = 1; i <= 20; i++) {
		*last = snd(fd, "data", 4, flags, e);
		if (*last < 0)
			break;
		sleep_ms(50);
	}
	return i;
}

static void c_close(void)
{
	int fd = connect_carried();
	int e;
	ssize_t n = snd(fd, "bye", 3, 0, &e);
	check(n == 3, "send", "%s", res(n, e));
	int r = close(fd);
	check(r == 0, "close", "%s", res(r, errno));
	say("close-closed");
	hear("close-done");
}

static void s_close(int ls)
{
	int fd = accept_carried(ls);
	hear("close-closed");
	expect_last_bytes_then_eof(fd, "after the peer closed", "bye", 0);
	char b[16];
	int e, rev;
	ssize_t n;
	int pe = peer_err(fd);
	check(pe == 0, "getpeername", "after the peer's close: %s (want 0: half-closed, not closed)", ename(pe));
	int before = sigpipes;
	int tries = send_until_epipe(fd, 0, &e, &n);
	check(n < 0 && e == EPIPE && sigpipes == before + 1, "send_epipe_sigpipe",
	      "sends to the closed peer: %s at try %d, %d SIGPIPE", res(n, e), tries, (int)(sigpipes - before));
	before = sigpipes;
	n = snd(fd, "x", 1, MSG_NOSIGNAL, &e);
	check(n < 0 && e == EPIPE && sigpipes == before, "send_nosignal", "send(MSG_NOSIGNAL): %s, %d SIGPIPE",
	      res(n, e), (int)(sigpipes - before));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_after_epipe", "%s", res(n, e));
	rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev >= 0 && (rev & (POLLIN | POLLOUT | POLLRDHUP | POLLHUP)) == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP),
	      "poll_reset", "poll(IN|OUT|RDHUP) after EPIPE: %s (want IN|OUT|HUP|RDHUP)", pollstr(rev));
	pe = peer_err(fd);
	check(pe == ENOTCONN, "getpeername_reset", "after the reset: %s (want ENOTCONN)", ename(pe));
	say("close-done");
	close(fd);
}

static void c_linger0(void)
{
	int fd = connect_carried();
	struct linger lg = {1, 0}, got = {-1, -1};
	socklen_t l = sizeof got;
	int r = setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	getsockopt(fd, SOL_SOCKET, SO_LINGER, &got, &l);
	check(r == 0 && got.l_onoff == 1 && got.l_linger == 0, "get", "SO_LINGER set {1,0} (%s), read back {%d,%d}",
	      res(r, errno), got.l_onoff, got.l_linger);
	int e;
	ssize_t n = snd(fd, "abort", 5, 0, &e);
	check(n == 5, "send", "%s", res(n, e));
	r = close(fd); /* at once: the data is not read yet */
	check(r == 0, "close", "%s", res(r, errno));
	say("linger0-closed");
	hear("linger0-done");
}

static void s_linger0(int ls)
{
	int fd = accept_carried(ls);
	char b[16] = {0};
	int e;
	hear("linger0-closed");
	int rev = pollrev_until(fd, POLLIN | POLLRDHUP, POLLIN | POLLRDHUP | POLLHUP, 5000);
	check(rev >= 0 && (rev & (POLLIN | POLLRDHUP | POLLHUP)) == (POLLIN | POLLRDHUP | POLLHUP), "poll",
	      "poll(IN|RDHUP) after the abortive close: %s (want IN|HUP|RDHUP, ERR while the error is pending)",
	      pollstr(rev));
	/* what arrived before the reset is read first (Linux) */
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 5 && !memcmp(b, "abort", 5), "recv", "data sent before the abortive close: %s (want 5)", res(n, e));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n < 0 && e == ECONNRESET, "recv_reset", "recv: %s (want -1 ECONNRESET)", res(n, e));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_after_reset", "recv again: %s (want 0)", res(n, e));
	n = snd(fd, "x", 1, MSG_NOSIGNAL, &e);
	check(n < 0 && e == EPIPE, "send_epipe", "%s", res(n, e));
	rev = pollrev(fd, POLLIN | POLLOUT | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "poll_after", "poll(IN|OUT|RDHUP): %s (want IN|OUT|HUP|RDHUP)",
	      pollstr(rev));
	say("linger0-done");
	close(fd);
}

/* The server is already waiting (poll, then epoll) when the client half-closes one connection
 * and closes another: the end must wake the wait, not only be seen by a later one. */
static void c_wake(void)
{
	int c1 = connect_block(), c2 = connect_block();
	check_carried(c1);
	check_carried(c2);
	hear("wake-waiting");
	sleep_ms(200);
	int r = shutdown(c1, SHUT_WR);
	check(r == 0, "shutdown", "shutdown(SHUT_WR): %s", res(r, errno));
	hear("wake-epoll");
	sleep_ms(200);
	r = close(c2);
	check(r == 0, "close", "%s", res(r, errno));
	hear("wake-done");
	close(c1);
}

static void s_wake(int ls)
{
	int a1 = accept_one(ls, 0), a2 = accept_one(ls, 0);
	say("wake-waiting");
	double t0 = now_ms();
	int rev = pollrev(a1, POLLIN | POLLRDHUP, 5000);
	double dt = now_ms() - t0;
	check(rev == (POLLIN | POLLRDHUP) && dt < 2000, "poll", "poll(IN|RDHUP) waiting when the peer shut: %s after %.0f ms",
	      pollstr(rev), dt);
	say("wake-epoll");
	t0 = now_ms();
	rev = epollrev(a2, EPOLLIN | EPOLLRDHUP, 5000);
	dt = now_ms() - t0;
	check(rev == (EPOLLIN | EPOLLRDHUP) && dt < 2000, "epoll",
	      "epoll_wait(IN|RDHUP) waiting when the peer closed: %s after %.0f ms", pollstr(rev), dt);
	say("wake-done");
	close(a1);
	close(a2);
}

/* MSG_TRUNC discards (TCP), MSG_WAITALL cut short by the end, MSG_PEEK at the end, select. */
static void c_flags(void)
{
	int fd = connect_carried();
	hear("flags-sent");
	char b[16] = {0};
	int e;
	int rev = pollrev(fd, POLLIN, 5000);
	check(rev == POLLIN, "pollin", "%s", pollstr(rev));
	fd_set r, w, x;
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_ZERO(&x);
	FD_SET(fd, &r);
	FD_SET(fd, &w);
	FD_SET(fd, &x);
	struct timeval tv = {0, 0};
	int k = select(fd + 1, &r, &w, &x, &tv);
	check(k == 2 && FD_ISSET(fd, &r) && FD_ISSET(fd, &w) && !FD_ISSET(fd, &x), "select", "select with data "
	      "queued: %d, read %d write %d except %d (want 2: read, write)", k, FD_ISSET(fd, &r), FD_ISSET(fd, &w),
	      FD_ISSET(fd, &x));
	/* recvmsg/recvfrom on a stream: no address (length 0), no flags */
	struct sockaddr_in from;
	memset(&from, 0x55, sizeof from);
	struct iovec iov = {b, 1};
	struct msghdr mh = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_flags = -1};
	ssize_t n = recvmsg(fd, &mh, MSG_PEEK);
	check(n == 1 && mh.msg_namelen == 0 && mh.msg_flags == 0, "recvmsg_name", "recvmsg(MSG_PEEK): %zd, msg_namelen %u, "
	      "msg_flags %#x (want 1, 0, 0)", n, (unsigned)mh.msg_namelen, mh.msg_flags);
	socklen_t fl = sizeof from;
	n = recvfrom(fd, b, 1, MSG_PEEK, (struct sockaddr *)&from, &fl);
	check(n == 1 && fl == 0, "recvfrom_name", "recvfrom(MSG_PEEK): %zd, address length %u (want 1, 0)", n, (unsigned)fl);
	n = rcv(fd, b, 3, MSG_TRUNC, &e);
	check(n == 3, "trunc", "recv(3, MSG_TRUNC): %s (want 3, discarded)", res(n, e));
	memset(b, 0, sizeof b);
	n = rcv(fd, b, 3, 0, &e);
	check(n == 3 && !memcmp(b, "def", 3), "after_trunc", "recv(3): %s '%.3s' (want 'def')", res(n, e), b);
	say("flags-read");
	hear("flags-shut");
	/* "ghi" then the end: MSG_WAITALL for 10 returns the 3 */
	memset(b, 0, sizeof b);
	n = rcv(fd, b, 10, MSG_WAITALL, &e);
	check(n == 3 && !memcmp(b, "ghi", 3), "waitall_eof", "recv(10, MSG_WAITALL) before the end: %s '%.3s' (want 3)",
	      res(n, e), b);
	n = rcv(fd, b, 10, MSG_PEEK, &e);
	check(n == 0, "peek_eof", "recv(MSG_PEEK) at the end: %s (want 0)", res(n, e));
	FD_ZERO(&r);
	FD_ZERO(&x);
	FD_SET(fd, &r);
	FD_SET(fd, &x);
	tv.tv_sec = 2;
	k = select(fd + 1, &r, NULL, &x, &tv);
	check(k == 1 && FD_ISSET(fd, &r) && !FD_ISSET(fd, &x), "select_eof", "select at the end: %d, read %d except %d "
	      "(want 1: read)", k, FD_ISSET(fd, &r), FD_ISSET(fd, &x));
	int v = -1;
	int rr = ioctl(fd, FIONREAD, &v);
	check(rr == 0 && v == 0, "fionread_eof", "FIONREAD at the end: %d", v);
	say("flags-done");
	close(fd);
}

static void s_flags(int ls)
{
	int fd = accept_carried(ls);
	int e;
	ssize_t n = snd(fd, "abcdef", 6, 0, &e);
	check(n == 6, "send", "%s", res(n, e));
	say("flags-sent");
	hear("flags-read");
	n = snd(fd, "ghi", 3, 0, &e);
	int r = shutdown(fd, SHUT_WR);
	check(n == 3 && r == 0, "send_shut", "send %s, shutdown(SHUT_WR) %s", res(n, e), res(r, errno));
	say("flags-shut");
	hear("flags-done");
	close(fd);
}

/* POLLOUT/EPOLLOUT come back once the peer reads what filled the buffers (a waiter is woken). */
static void c_pollout(void)
{
	int fd = connect_carried();
	hear("pollout-full");
	sleep_ms(200);
	static char b[64 << 10];
	size_t total = 0;
	ssize_t n;
	int e;
	while ((n = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e)) > 0 || (n < 0 && e == EAGAIN && pollrev(fd, POLLIN, 1000) > 0))
		if (n > 0)
			total += (size_t)n;
	check(n == 0, "drain", "read %zu bytes, then %s (want the end)", total, res(n, e));
	say("pollout-done");
	close(fd);
}

static void s_pollout(int ls)
{
	int fd = accept_one(ls, SOCK_NONBLOCK);
	check_carried(fd);
	static char chunk[64 << 10];
	size_t total = 0;
	ssize_t n;
	int e;
	while ((n = snd(fd, chunk, sizeof chunk, 0, &e)) > 0)
		total += (size_t)n;
	check(n < 0 && e == EAGAIN, "full", "non-blocking sends: %zu bytes, then %s (want EAGAIN)", total, res(n, e));
	int rev = pollrev(fd, POLLOUT, 0);
	check(rev == 0, "no_pollout", "poll(POLLOUT) with the buffers full: %s (want 0)", pollstr(rev));
	say("pollout-full");
	double t0 = now_ms();
	rev = pollrev(fd, POLLOUT, 5000);
	double dt = now_ms() - t0;
	/* between two hosts the kernel frees send buffer as the peer's receive window grows,
	 * before it reads (measured natively over the veth: POLLOUT after ~50 ms) */
	check(rev == POLLOUT && (dt >= 100 || twohost) && dt < 3000, "pollout", "poll(POLLOUT) waiting while the peer reads: %s after "
	      "%.0f ms", pollstr(rev), dt);
	while ((n = snd(fd, chunk, sizeof chunk, 0, &e)) > 0)
		total += (size_t)n;
	t0 = now_ms();
	rev = epollrev(fd, EPOLLOUT, 5000);
	dt = now_ms() - t0;
	check(rev == EPOLLOUT && dt < 3000, "epollout", "epoll_wait(EPOLLOUT) with the buffers full again: %s after %.0f ms",
	      pollstr(rev), dt);
	int r = shutdown(fd, SHUT_WR);
	check(r == 0, "shutdown", "%s", res(r, errno));
	hear("pollout-done");
	close(fd);
}

/* Blocked calls woken by the peer's reset: a recv waiting for data (the peer's SO_LINGER {1,0}
 * close), a send waiting for room (the peer closes with our data unread). */
static void c_blocked(void)
{
	int c1 = connect_block(), c2 = connect_block();
	check_carried(c1);
	check_carried(c2);
	hear("blocked-waiting");
	sleep_ms(200);
	struct linger lg = {1, 0};
	setsockopt(c1, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(c1);
	hear("blocked-filling");
	sleep_ms(300); /* the server's sends have filled every buffer and it waits */
	close(c2);     /* with its data unread: a reset */
	hear("blocked-done");
}

static void s_blocked(int ls)
{
	int a1 = accept_one(ls, 0), a2 = accept_one(ls, 0);
	say("blocked-waiting");
	char b[16];
	int e;
	double t0 = now_ms();
	ssize_t n = rcv(a1, b, sizeof b, 0, &e);
	double dt = now_ms() - t0;
	check(n < 0 && e == ECONNRESET && dt < 3000, "recv", "recv waiting when the peer reset: %s after %.0f ms "
	      "(want -1 ECONNRESET)", res(n, e), dt);
	say("blocked-filling");
	static char chunk[64 << 10];
	size_t total = 0;
	t0 = now_ms();
	for (;;) {
		n = snd(a2, chunk, sizeof chunk, MSG_NOSIGNAL, &e);
		if (n < (ssize_t)sizeof chunk || now_ms() - t0 > 10000)
			break;
		total += (size_t)n;
	}
	dt = now_ms() - t0;
	/* the send that was waiting ends with the part it took or the reset; the next fails */
	bool first_ok = (n >= 0 && n < (ssize_t)sizeof chunk) || (n < 0 && (e == ECONNRESET || e == EPIPE));
	int e1 = e;
	ssize_t n1 = n;
	n = snd(a2, chunk, sizeof chunk, MSG_NOSIGNAL, &e);
	check(first_ok && n < 0 && (e == EPIPE || e == ECONNRESET) && dt < 5000, "send",
	      "sends into a peer that closes unread: after %zu bytes %s, then %s (want a short count or "
	      "ECONNRESET/EPIPE, then EPIPE/ECONNRESET)", total, res(n1, e1), res(n, e));
	say("blocked-done");
	close(a1);
	close(a2);
}

/* Closing with data not read resets the connection (Linux, RFC 2525 2.17), SO_LINGER or not. */
static void c_unread(void)
{
	int fd = connect_carried();
	hear("unread-sent");
	int rev = pollrev(fd, POLLIN, 5000);
	check(rev == POLLIN, "pollin", "poll(POLLIN): %s", pollstr(rev));
	int r = close(fd);
	check(r == 0, "close", "close with 6 bytes unread: %s", res(r, errno));
	say("unread-closed");
	hear("unread-done");
}

static void s_unread(int ls)
{
	int fd = accept_carried(ls);
	int e;
	ssize_t n = snd(fd, "unread", 6, 0, &e);
	check(n == 6, "send", "%s", res(n, e));
	say("unread-sent");
	hear("unread-closed");
	int rev = pollrev_until(fd, POLLIN | POLLRDHUP, POLLIN | POLLRDHUP | POLLHUP, 5000);
	check(rev == (POLLIN | POLLRDHUP | POLLHUP | POLLERR), "poll",
	      "poll(IN|RDHUP) after the peer closed with our data unread: %s (want IN|ERR|HUP|RDHUP)", pollstr(rev));
	char b[16];
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n < 0 && e == ECONNRESET, "recv_reset", "recv: %s (want -1 ECONNRESET)", res(n, e));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_after_reset", "recv again: %s (want 0)", res(n, e));
	say("unread-done");
	close(fd);
}

/* The same reset, read through SO_ERROR first (as an event loop does after POLLERR). */
static void c_resetso(void)
{
	int fd = connect_carried();
	struct linger lg = {1, 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	int e;
	ssize_t n = snd(fd, "abort", 5, 0, &e);
	check(n == 5, "send", "%s", res(n, e));
	int r = close(fd);
	check(r == 0, "close", "%s", res(r, errno));
	say("resetso-closed");
	hear("resetso-done");
}

static void s_resetso(int ls)
{
	int fd = accept_carried(ls);
	hear("resetso-closed");
	int rev = pollrev_until(fd, POLLIN | POLLRDHUP, POLLIN | POLLRDHUP | POLLHUP, 5000);
	check(rev == (POLLIN | POLLRDHUP | POLLHUP | POLLERR), "poll", "poll(IN|RDHUP) after the reset: %s (want IN|ERR|HUP|RDHUP)",
	      pollstr(rev));
	int v = -1;
	socklen_t l = sizeof v;
	int r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	check(r == 0 && v == ECONNRESET, "so_error", "SO_ERROR %s (want ECONNRESET)", ename(v));
	v = -1;
	r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	check(r == 0 && v == 0, "so_error_cleared", "SO_ERROR again: %s (want 0)", ename(v));
	rev = pollrev(fd, POLLIN | POLLRDHUP, 0);
	check(rev == (POLLIN | POLLRDHUP | POLLHUP), "poll_after", "poll(IN|RDHUP) once the error was read: %s (want IN|HUP|RDHUP)",
	      pollstr(rev));
	char b[16] = {0};
	int e;
	ssize_t n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 5 && !memcmp(b, "abort", 5), "recv", "the data: %s (want 5)", res(n, e));
	n = rcv(fd, b, sizeof b, 0, &e);
	check(n == 0, "recv_eof", "then: %s (want 0: the error was read through SO_ERROR)", res(n, e));
	say("resetso-done");
	close(fd);
}

static uint8_t pat(size_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

static void c_lingern(void)
{
	int fd = connect_carried();
	struct linger lg = {1, 3}, got = {-1, -1};
	socklen_t l = sizeof got;
	int r = setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	getsockopt(fd, SOL_SOCKET, SO_LINGER, &got, &l);
	check(r == 0 && got.l_onoff == 1 && got.l_linger == 3, "get", "SO_LINGER set {1,3} (%s), read back {%d,%d}",
	      res(r, errno), got.l_onoff, got.l_linger);
	uint8_t *buf = malloc(LINGER_BYTES);
	if (!buf)
		die("malloc");
	for (size_t i = 0; i < LINGER_BYTES; i++)
		buf[i] = pat(i);
	say("lingern-go"); /* the server starts reading 300 ms from now */
	size_t off = 0;
	while (off < LINGER_BYTES) {
		ssize_t n = send(fd, buf + off, LINGER_BYTES - off, 0);
		if (n < 0) {
			check(false, "send", "after %zu bytes: %s", off, strerror(errno));
			break;
		}
		off += (size_t)n;
	}
	double t0 = now_ms();
	r = close(fd);
	double dt = now_ms() - t0;
	check(r == 0 && dt < 3500, "close", "close with SO_LINGER {1,3}: %s after %.0f ms", res(r, errno), dt);
	free(buf);
	hear("lingern-done");
}

static void s_lingern(int ls)
{
	int fd = accept_carried(ls);
	hear("lingern-go");
	sleep_ms(300);
	static uint8_t b[64 << 10];
	size_t total = 0, bad = (size_t)-1;
	ssize_t n;
	int e = 0;
	for (;;) {
		n = rcv(fd, (char *)b, sizeof b, 0, &e);
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n && bad == (size_t)-1; i++)
			if (b[i] != pat(total + (size_t)i))
				bad = total + (size_t)i;
		total += (size_t)n;
	}
	check(total == LINGER_BYTES && bad == (size_t)-1 && n == 0, "recv_all",
	      "%zu of %u bytes, first wrong byte %zd, ended with %s", total, LINGER_BYTES,
	      bad == (size_t)-1 ? (ssize_t)-1 : (ssize_t)bad, res(n, e));
	say("lingern-done");
	close(fd);
}

static void c_etnews(void)
{
	int fd = connect_carried();
	int e;
	ssize_t n = snd(fd, "a", 1, 0, &e);
	check(n == 1, "send", "%s", res(n, e));
	hear("etnews-more");
	n = snd(fd, "b", 1, 0, &e);
	check(n == 1, "send_more", "%s", res(n, e));
	hear("etnews-done");
	close(fd);
}

static void s_etnews(int ls)
{
	int fd = accept_carried(ls);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u32 = 7}, out = {0};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll: %s", strerror(errno));
	int n = epoll_wait(ep, &out, 1, 5000);
	check(n == 1 && (out.events & EPOLLIN), "first", "epoll_wait(ET) for the first byte: %d %s", n,
	      pollstr((int)out.events));
	char b[8];
	int e;
	ssize_t r = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(r == 1, "recv", "%s", res(r, e));
	r = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(r < 0 && e == EAGAIN, "recv_again", "%s (want EAGAIN)", res(r, e));
	say("etnews-more");
	sleep_ms(300); /* the second byte arrives meanwhile */
	int q = -1;
	int rc = ioctl(fd, FIONREAD, &q);
	check(rc == 0 && q == 1, "fionread", "FIONREAD: %d, %d bytes (want 1)", rc, q);
	out.events = 0;
	n = epoll_wait(ep, &out, 1, 2000);
	check(n == 1 && (out.events & EPOLLIN), "edge_after_look",
	      "epoll_wait(ET) after FIONREAD saw the byte that came after EAGAIN: %d %s (want IN)", n,
	      pollstr((int)out.events));
	r = rcv(fd, b, sizeof b, MSG_DONTWAIT, &e);
	check(r == 1 && b[0] == 'b', "recv_more", "%s", res(r, e));
	say("etnews-done");
	close(ep);
	close(fd);
}

#define DUPLEX_BYTES (8u << 20)

/* The peer: echoes everything back until the end. */
static void c_duplex(void)
{
	int fd = connect_carried();
	static char b[64 << 10];
	uint64_t total = 0;
	for (;;) {
		int e;
		ssize_t n = rcv(fd, b, sizeof b, 0, &e);
		if (n <= 0) {
			check(n == 0, "echo_recv", "after %llu bytes: %s", (unsigned long long)total, res(n, e));
			break;
		}
		for (ssize_t off = 0; off < n;) {
			ssize_t w = snd(fd, b + off, (size_t)(n - off), MSG_NOSIGNAL, &e);
			if (w <= 0) {
				check(false, "echo_send", "%s", res(w, e));
				break;
			}
			off += w;
		}
		total += (uint64_t)n;
	}
	check(total == DUPLEX_BYTES, "echoed", "%llu bytes (want %u)", (unsigned long long)total, DUPLEX_BYTES);
	close(fd);
}

struct duplex_rd {
	int fd;
	uint64_t got, bad, stalls;
	_Atomic bool done;
};

/* The reading thread: poll, then non-blocking receives, checking the pattern. */
static void *duplex_reader(void *arg)
{
	struct duplex_rd *d = arg;
	static char b[64 << 10];
	d->bad = UINT64_MAX;
	while (d->got < DUPLEX_BYTES) {
		struct pollfd p = {.fd = d->fd, .events = POLLIN};
		int r = poll(&p, 1, 5000);
		if (r == 0) {
			d->stalls++;
			break;
		}
		ssize_t n = recv(d->fd, b, sizeof b, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			break;
		for (ssize_t i = 0; n > 0 && i < n; i++)
			if (d->bad == UINT64_MAX && (uint8_t)b[i] != (uint8_t)((d->got + (uint64_t)i) * 7 % 251))
				d->bad = d->got + (uint64_t)i;
		if (n > 0)
			d->got += (uint64_t)n;
	}
	atomic_store(&d->done, true);
	return NULL;
}

static void s_duplex(int ls)
{
	int fd = accept_carried(ls);
	struct duplex_rd d = {.fd = fd};
	pthread_t th;
	if (pthread_create(&th, NULL, duplex_reader, &d))
		die("pthread_create");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLOUT | EPOLLET, .data.u32 = 9}, out;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll: %s", strerror(errno));
	static char b[64 << 10];
	uint64_t sent = 0, stalls = 0, waits = 0;
	while (sent < DUPLEX_BYTES) {
		size_t len = DUPLEX_BYTES - sent < sizeof b ? DUPLEX_BYTES - sent : sizeof b;
		for (size_t i = 0; i < len; i++)
			b[i] = (char)((sent + i) * 7 % 251);
		ssize_t n = send(fd, b, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			sent += (uint64_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			break;
		waits++;
		if (epoll_wait(ep, &out, 1, 5000) == 0) {
			stalls++;
			break;
		}
	}
	/* the writer's waits go on while the last echoes come: whatever they take of them is the
	 * reader's news */
	while (!atomic_load(&d.done))
		epoll_wait(ep, &out, 1, 50);
	pthread_join(th, NULL);
	check(sent == DUPLEX_BYTES && !stalls, "writer", "%llu of %u bytes sent, %llu waits for EPOLLOUT, %llu of 5 s",
	      (unsigned long long)sent, DUPLEX_BYTES, (unsigned long long)waits, (unsigned long long)stalls);
	check(d.got == DUPLEX_BYTES && d.bad == UINT64_MAX && !d.stalls, "reader",
	      "%llu of %u bytes echoed back, first wrong byte %lld, %llu waits of 5 s", (unsigned long long)d.got,
	      DUPLEX_BYTES, d.bad == UINT64_MAX ? -1LL : (long long)d.bad, (unsigned long long)d.stalls);
	shutdown(fd, SHUT_WR);
	close(ep);
	close(fd);
}

#define HALFBULK_BYTES (2u << 20)

static void c_halfbulk(void)
{
	int fd = connect_carried();
	shutdown(fd, SHUT_WR);
	static char b[64 << 10];
	uint64_t got = 0;
	int e = 0;
	ssize_t n;
	while ((n = rcv(fd, b, sizeof b, 0, &e)) > 0)
		got += (uint64_t)n;
	check(got == HALFBULK_BYTES && n == 0, "recv_all", "%llu of %u bytes, then %s", (unsigned long long)got,
	      HALFBULK_BYTES, res(n, e));
	close(fd);
}

static void s_halfbulk(int ls)
{
	int fd = accept_carried(ls);
	char c;
	int e;
	ssize_t n = rcv(fd, &c, 1, 0, &e);
	check(n == 0, "peer_fin", "the client's SHUT_WR: %s", res(n, e));
	static char b[64 << 10];
	memset(b, 'h', sizeof b);
	uint64_t sent = 0;
	int stalls = 0;
	while (sent < HALFBULK_BYTES && !stalls) {
		size_t len = HALFBULK_BYTES - sent < sizeof b ? HALFBULK_BYTES - sent : sizeof b;
		n = send(fd, b, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			sent += (uint64_t)n;
		} else if (n < 0 && errno == EAGAIN) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			stalls += poll(&p, 1, 5000) == 0;
		} else {
			break;
		}
	}
	check(sent == HALFBULK_BYTES && !stalls, "send_all", "%llu of %u bytes sent after the peer's FIN%s",
	      (unsigned long long)sent, HALFBULK_BYTES, stalls ? ", then a poll for POLLOUT waited 5 s" : "");
	close(fd);
}

#define XPOLL_PINGS 300

static void c_xpoll(void)
{
	int fd = connect_carried();
	int bad = 0;
	for (int i = 0; i < XPOLL_PINGS && !bad; i++) {
		char b[8] = {(char)i}, r[8];
		int e;
		ssize_t n = snd(fd, b, sizeof b, 0, &e);
		if (n != (ssize_t)sizeof b || rcv(fd, r, sizeof r, MSG_WAITALL, &e) != (ssize_t)sizeof r || r[0] != (char)i)
			bad = i + 1;
	}
	check(!bad, "pingpong", "ping %d of %d not answered", bad - 1, XPOLL_PINGS);
	shutdown(fd, SHUT_WR);
	char c;
	int e;
	rcv(fd, &c, 1, 0, &e);
	close(fd);
}

struct xpoll_rd {
	int fd;
	_Atomic int answered, stalled;
};

static void *xpoll_reader(void *arg)
{
	struct xpoll_rd *d = arg;
	while (d->answered < XPOLL_PINGS) {
		struct pollfd p = {.fd = d->fd, .events = POLLIN};
		if (poll(&p, 1, 2000) == 0) {
			d->stalled = 1;
			break;
		}
		char b[8];
		ssize_t n = recv(d->fd, b, sizeof b, MSG_DONTWAIT | MSG_WAITALL);
		if (n == (ssize_t)sizeof b) {
			if (send(d->fd, b, sizeof b, MSG_NOSIGNAL) != (ssize_t)sizeof b)
				break;
			d->answered++;
		} else if (n == 0 || (n < 0 && errno != EAGAIN)) {
			break;
		}
	}
	return NULL;
}

static void s_xpoll(int ls)
{
	int fd = accept_carried(ls);
	struct xpoll_rd d = {.fd = fd};
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLOUT | EPOLLET, .data.u32 = 5}, out;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll: %s", strerror(errno));
	pthread_t th;
	if (pthread_create(&th, NULL, xpoll_reader, &d))
		die("pthread_create");
	for (int i = 0; i < 4000 && d.answered < XPOLL_PINGS && !d.stalled; i++)
		epoll_wait(ep, &out, 1, 5);
	pthread_join(th, NULL);
	check(d.answered == XPOLL_PINGS && !d.stalled, "answered", "%d of %d pings answered%s", d.answered, XPOLL_PINGS,
	      d.stalled ? ", then a poll waited 2 s for one that had come" : "");
	char c;
	int e;
	rcv(fd, &c, 1, 0, &e);
	close(ep);
	close(fd);
}

/* ------------------------------------------------------------------ main */

static const struct {
	const char *name;
	void (*client)(void);
	void (*server)(int ls); /* NULL: nothing to accept */
	bool second_listener;
} cases[] = {
	{"names", c_names, s_names, false},
	{"accept4", c_accept4, s_accept4, false},
	{"reads", c_reads, s_reads, false},
	{"sndtimeo", c_sndtimeo, s_sndtimeo, false},
	{"nbconnect", c_nbconnect, s_nbconnect, false},
	{"ealready", c_ealready, s_ealready, true},
	{"preaccept", c_preaccept, s_preaccept, false},
	{"v6", c_v6, s_v6, false},
	{"epollet", c_epollet, s_epollet, false},
	{"dup", c_dup, s_dup, false},
	{"lowat", c_lowat, s_lowat, false},
	{"fork", c_fork, s_fork, false},
	{"refused", c_refused, NULL, false},
	{"shutwr", c_shutwr, s_shutwr, false},
	{"shutrd", c_shutrd, s_shutrd, false},
	{"shutrdwr", c_shutrdwr, s_shutrdwr, false},
	{"close", c_close, s_close, false},
	{"wake", c_wake, s_wake, false},
	{"linger0", c_linger0, s_linger0, false},
	{"resetso", c_resetso, s_resetso, false},
	{"unread", c_unread, s_unread, false},
	{"flags", c_flags, s_flags, false},
	{"pollout", c_pollout, s_pollout, false},
	{"blocked", c_blocked, s_blocked, false},
	{"lingern", c_lingern, s_lingern, false},
	{"etnews", c_etnews, s_etnews, false},
	{"duplex", c_duplex, s_duplex, false},
	{"halfbulk", c_halfbulk, s_halfbulk, false},
	{"xpoll", c_xpoll, s_xpoll, false},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void server(void)
{
	int ls = listen_on(port, 16), ls2 = listen_on(port + 1, 0);
	say("listening");
	for (size_t i = 0; i < NCASES; i++) {
		cur = cases[i].name;
		hear(cur);
		if (cases[i].server)
			cases[i].server(cases[i].second_listener ? ls2 : ls);
		say("next");
	}
	close(ls);
	close(ls2);
}

static void client(void)
{
	hear("listening");
	for (size_t i = 0; i < NCASES; i++) {
		cur = cases[i].name;
		say(cur);
		cases[i].client();
		hear("next");
	}
}

int main(int argc, char **argv)
{
	if (argc != 2 || atoi(argv[1]) < 1024 || atoi(argv[1]) > 65000) {
		fprintf(stderr, "usage: streamapi PORT   (uses PORT, PORT+1, PORT+2 on 127.0.0.1, PORT+3 on ::1)\n");
		return 2;
	}
	port = atoi(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	srv4.s_addr = cli4.s_addr = htonl(INADDR_LOOPBACK);
	const char *e4s = getenv("STREAMAPI_SERVER4"), *e4c = getenv("STREAMAPI_CLIENT4");
	const char *e6s = getenv("STREAMAPI_SERVER6"), *e6c = getenv("STREAMAPI_CLIENT6");
	if ((e4s && inet_pton(AF_INET, e4s, &srv4) != 1) || (e4c && inet_pton(AF_INET, e4c, &cli4) != 1) ||
	    (e6s && inet_pton(AF_INET6, e6s, &srv6) != 1) || (e6c && inet_pton(AF_INET6, e6c, &cli6) != 1)) {
		fprintf(stderr, "streamapi: STREAMAPI_SERVER4/CLIENT4/SERVER6/CLIENT6: not an address\n");
		return 2;
	}
	struct sigaction sa = {.sa_handler = on_pipe};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPIPE, &sa, NULL);
	signal(SIGALRM, on_alarm);

	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		return 1;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	const char *ns = getenv(pid ? "STREAMAPI_CLIENT_NETNS" : "STREAMAPI_SERVER_NETNS");
	twohost = ns && *ns;
	if (twohost) {
		char path[300];
		snprintf(path, sizeof path, "/run/netns/%s", ns);
		int nfd = open(path, O_RDONLY | O_CLOEXEC);
		if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0) {
			fprintf(stderr, "streamapi: entering network namespace %s: %s\n", path, strerror(errno));
			return 1;
		}
		close(nfd);
	}
	/* the shim answers SOL_IWARP on any socket; the kernel does not know the level */
	int probe = socket(AF_INET, SOCK_STREAM, 0), m = 0;
	socklen_t ml = sizeof m;
	shim = probe >= 0 && getsockopt(probe, SOL_IWARP, IWARP_MODE, &m, &ml) == 0;
	if (probe >= 0)
		close(probe);
	const char *expect = getenv("STREAMAPI_EXPECT");
	if (expect && strcmp(expect, shim ? "preload" : "native")) {
		role = pid ? "client" : "server";
		die("STREAMAPI_EXPECT=%s but the shim is %s", expect, shim ? "loaded" : "not loaded");
	}
	alarm(WATCHDOG_S);
	if (pid == 0) {
		role = "server";
		close(sv[0]);
		ctl = sv[1];
		server();
		printf("server: %d failed\n", fails);
		return fails ? 1 : 0;
	}
	role = "client";
	close(sv[1]);
	ctl = sv[0];
	client();
	int st = 0;
	waitpid(pid, &st, 0);
	int srv_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) > 1)
		printf("FAIL server: ended with status %#x\n", st);
	printf("client: %d failed; server: %s\n", fails, srv_ok ? "0 failed" : "failures (above)");
	return fails || !srv_ok ? 1 : 0;
}
