/*
 * sockapi - socket semantics that a program sees, checked natively and under libdgshim.so.
 *
 *   sockapi SUBTEST [ARGS...]       exit 0 pass, 1 fail, 77 skip; one line per failed check
 *
 * Every subtest that uses the network takes a first argument PORT and uses the ports PORT ..
 * PORT+k-1 on 127.0.0.1 (::1 for basic6); k is given in the usage below. What is checked is what
 * the kernel does for a UDP socket: a subtest passes natively, and must pass in the same way under
 * LD_PRELOAD=libdgshim.so. Under the shim (detected: getsockopt(SOL_IWARP) is answered instead of
 * failing as in the kernel, EOPNOTSUPP or ENOPROTOOPT) some subtests also check the shim's counters.
 *
 * SOCKAPI_EXPECT=native|preload (set by sockapi.sh) says how the runner started us: a mismatch
 * (e.g. the library was named in LD_PRELOAD but did not load) is a failure.
 *
 * Diagnostics go to stdout; stderr is left to the shim (the badrules check counts its lines).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dgshim.h"

extern char **environ;

#define MAX_PRINTED 40      /* failure lines printed per process; the rest are counted */
#define WATCHDOG_S 25       /* a subtest that hangs ends here (the runner allows 30 s) */
#define BIGBUF 70000        /* more than any UDP payload: a longer datagram would show */

static const char *g_test = "sockapi";
static int g_fails;
static int g_printed;
static int g_shim;          /* 1: SOL_IWARP is answered (libdgshim.so is loaded) */

/* ---------------------------------------------------------------------------------------- */
/* Reporting                                                                                */

__attribute__((format(printf, 2, 3))) static void failf(int line, const char *fmt, ...)
{
	__atomic_add_fetch(&g_fails, 1, __ATOMIC_SEQ_CST);
	int n = __atomic_add_fetch(&g_printed, 1, __ATOMIC_SEQ_CST);
	if (n > MAX_PRINTED) {
		if (n == MAX_PRINTED + 1)
			printf("sockapi: %s: further failures not shown\n", g_test);
		return;
	}
	char msg[1536];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	printf("sockapi: %s: FAIL (pid %d, line %d): %s\n", g_test, (int)getpid(), line, msg);
	fflush(stdout);
}

static _Noreturn void finish(void)
{
	fflush(stdout);
	exit(g_fails ? 1 : 0);
}

static int skip(const char *why)
{
	printf("sockapi: %s: SKIP: %s\n", g_test, why);
	fflush(stdout);
	return 77;
}

/* Small rotating buffers so that several formatted values fit in one message. */
static char *ring(void)
{
	static __thread char bufs[8][160];
	static __thread unsigned idx;
	return bufs[idx++ % 8];
}

static const char *en(int e)
{
	char *b = ring();
	const char *n = strerrorname_np(e);
	snprintf(b, 160, "%s (%s)", n ? n : "E?", strerror(e));
	return b;
}

static const char *hex(const void *p, long n)
{
	char *b = ring();
	const unsigned char *c = p;
	int o = 0;
	for (long i = 0; i < n && i < 24; i++)
		o += snprintf(b + o, 160 - o, "%02x", c[i]);
	if (n > 24)
		snprintf(b + o, 160 - o, "...");
	if (n <= 0)
		snprintf(b, 160, "(empty)");
	return b;
}

#define FAIL(...) failf(__LINE__, __VA_ARGS__)
#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			FAIL(__VA_ARGS__);                                                         \
	} while (0)
/* call must return exp; the value says whether it did */
#define EXPECT_RET(call, exp)                                                                      \
	({                                                                                         \
		errno = 0;                                                                         \
		long r_ = (long)(call);                                                            \
		int e_ = errno;                                                                    \
		long x_ = (long)(exp);                                                             \
		if (r_ != x_) {                                                                    \
			if (r_ == -1)                                                              \
				FAIL("%s: expected %ld, got -1 %s", #call, x_, en(e_));            \
			else                                                                       \
				FAIL("%s: expected %ld, got %ld", #call, x_, r_);                  \
		}                                                                                  \
		r_ == x_;                                                                          \
	})
/* call must fail with errno err */
#define EXPECT_ERR(call, err)                                                                      \
	({                                                                                         \
		long r_ = (long)(call);                                                            \
		int e_ = errno;                                                                    \
		bool ok_ = r_ == -1 && e_ == (err);                                                \
		if (!ok_) {                                                                        \
			if (r_ == -1)                                                              \
				FAIL("%s: expected -1 %s, got -1 %s", #call, en(err), en(e_));     \
			else                                                                       \
				FAIL("%s: expected -1 %s, got %ld", #call, en(err), r_);           \
		}                                                                                  \
		ok_;                                                                               \
	})
/* call must not return -1; gives its value */
#define EXPECT_OK(call)                                                                            \
	({                                                                                         \
		long r_ = (long)(call);                                                            \
		int e_ = errno;                                                                    \
		if (r_ == -1)                                                                      \
			FAIL("%s: expected success, got -1 %s", #call, en(e_));                    \
		r_;                                                                                \
	})
/* setup that the rest depends on: failure ends the subtest */
#define MUST(call)                                                                                 \
	({                                                                                         \
		long r_ = (long)(call);                                                            \
		int e_ = errno;                                                                    \
		if (r_ == -1) {                                                                    \
			FAIL("%s: %s (cannot continue)", #call, en(e_));                           \
			finish();                                                                  \
		}                                                                                  \
		r_;                                                                                \
	})

static void start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	int r = pthread_create(t, NULL, fn, arg);
	if (r) {
		FAIL("pthread_create: %s (cannot continue)", en(r));
		finish();
	}
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

/* how long since t0: must lie in [lo, hi] milliseconds */
#define CHECK_ELAPSED(what, t0, lo, hi)                                                            \
	do {                                                                                       \
		double el_ = now_ms() - (t0);                                                      \
		CHECK(el_ >= (lo) && el_ <= (hi), "%s: took %.1f ms, expected %d..%d ms", what,    \
		      el_, (int)(lo), (int)(hi));                                                  \
	} while (0)

/* Children still running: the watchdog kills them, so that none outlives the subtest (a child
 * can hang before main(), e.g. in a library constructor, where its own watchdog is not armed). */
static volatile pid_t g_children[8];

static void child_started(pid_t pid)
{
	for (int i = 0; i < 8; i++)
		if (!g_children[i]) {
			g_children[i] = pid;
			return;
		}
}

static void child_gone(pid_t pid)
{
	for (int i = 0; i < 8; i++)
		if (g_children[i] == pid)
			g_children[i] = 0;
}

static void on_alarm(int sig)
{
	static const char m[] = "sockapi: watchdog: subtest did not finish in time (hung?)\n";
	ssize_t w = write(1, m, sizeof m - 1);
	(void)w;
	for (int i = 0; i < 8; i++)
		if (g_children[i] > 0)
			kill(g_children[i], SIGKILL);
	_exit(1);
}

static pid_t fork_child(void)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		FAIL("fork: %s (cannot continue)", en(errno));
		finish();
	}
	if (pid == 0) {
		for (int i = 0; i < 8; i++)
			g_children[i] = 0;
	} else {
		child_started(pid);
	}
	return pid;
}

/* ---------------------------------------------------------------------------------------- */
/* Addresses, sockets, payloads                                                             */

typedef struct {
	struct sockaddr_storage ss;
	socklen_t len;
} addr_t;

#define SA(a) ((struct sockaddr *)&(a)->ss)

static addr_t mkaddr(int fam, int port)
{
	addr_t a;
	memset(&a, 0, sizeof a);
	if (fam == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)&a.ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		a.len = sizeof *s;
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&a.ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		s->sin6_addr = in6addr_loopback;
		a.len = sizeof *s;
	}
	return a;
}

static const char *addrstr(const struct sockaddr_storage *ss, socklen_t len)
{
	char *b = ring();
	char ip[INET6_ADDRSTRLEN] = "?";
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
		snprintf(b, 160, "%s:%u (len %u)", ip, ntohs(s->sin_port), (unsigned)len);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
		snprintf(b, 160, "[%s]:%u flow %u scope %u (len %u)", ip, ntohs(s->sin6_port),
			 (unsigned)s->sin6_flowinfo, (unsigned)s->sin6_scope_id, (unsigned)len);
	} else {
		snprintf(b, 160, "family %d (len %u)", ss->ss_family, (unsigned)len);
	}
	return b;
}

static bool addr_same(const struct sockaddr_storage *got, socklen_t glen, const addr_t *exp)
{
	if (glen != exp->len || got->ss_family != exp->ss.ss_family)
		return false;
	if (got->ss_family == AF_INET) {
		const struct sockaddr_in *g = (const void *)got, *x = (const void *)&exp->ss;
		return g->sin_port == x->sin_port && g->sin_addr.s_addr == x->sin_addr.s_addr;
	}
	const struct sockaddr_in6 *g = (const void *)got, *x = (const void *)&exp->ss;
	return g->sin6_port == x->sin6_port && !memcmp(&g->sin6_addr, &x->sin6_addr, 16) &&
	       g->sin6_flowinfo == 0 && g->sin6_scope_id == 0;
}

#define CHECK_ADDR(ssp, glen, exp, ...)                                                            \
	do {                                                                                       \
		if (!addr_same(ssp, glen, exp)) {                                                  \
			char w_[200];                                                              \
			snprintf(w_, sizeof w_, __VA_ARGS__);                                      \
			FAIL("%s: expected address %s, got %s", w_, addrstr(&(exp)->ss, (exp)->len), \
			     addrstr(ssp, glen));                                                  \
		}                                                                                  \
	} while (0)

/* getsockname / getpeername must give exp */
static void check_name(int line, int fd, bool peer, const addr_t *exp, const char *what)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	socklen_t sl = sizeof ss;
	int r = peer ? getpeername(fd, (struct sockaddr *)&ss, &sl)
		     : getsockname(fd, (struct sockaddr *)&ss, &sl);
	if (r < 0) {
		failf(line, "%s: %s: %s", what, peer ? "getpeername" : "getsockname", en(errno));
		return;
	}
	if (!addr_same(&ss, sl, exp))
		failf(line, "%s: %s: expected %s, got %s", what, peer ? "getpeername" : "getsockname",
		      addrstr(&exp->ss, exp->len), addrstr(&ss, sl));
}
#define CHECK_NAME(fd, exp, what) check_name(__LINE__, fd, false, exp, what)
#define CHECK_PEER(fd, exp, what) check_name(__LINE__, fd, true, exp, what)

static int udp_bound(int fam, int port, int flags)
{
	int s = MUST(socket(fam, SOCK_DGRAM | flags, 0));
	addr_t a = mkaddr(fam, port);
	if (bind(s, SA(&a), a.len) < 0) {
		FAIL("bind(%s): %s (cannot continue; port in use?)", addrstr(&a.ss, a.len), en(errno));
		finish();
	}
	return s;
}

/* The two-process roles between two hosts (tests/twohost/sockapi.sh): SOCKAPI_SELF names the
 * IPv4 address to bind, SOCKAPI_PEER the other side's; both default to 127.0.0.1. */
static addr_t mkaddr_env(int port, const char *var)
{
	addr_t a = mkaddr(AF_INET, port);
	const char *h = getenv(var);
	if (h && *h && inet_pton(AF_INET, h, &((struct sockaddr_in *)&a.ss)->sin_addr) != 1)
		FAIL("%s=%s: not an IPv4 address", var, h);
	return a;
}

static int udp_bound_self(int port)
{
	int s = MUST(socket(AF_INET, SOCK_DGRAM, 0));
	addr_t a = mkaddr_env(port, "SOCKAPI_SELF");
	if (bind(s, SA(&a), a.len) < 0) {
		FAIL("bind(%s): %s (cannot continue; port in use?)", addrstr(&a.ss, a.len), en(errno));
		finish();
	}
	return s;
}

static void set_rcvtimeo(int fd, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	MUST(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
}

/* Deterministic payload bytes for (seed, offset). */
static void fill(unsigned char *p, long n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 0x9e3779b9u;
	for (long i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (unsigned char)(x >> 17);
	}
}

/* got[0..glen) must be the payload (seed) of length elen */
static bool data_ok(int line, const char *what, const unsigned char *got, long glen, long elen,
		    uint32_t seed)
{
	if (glen != elen) {
		failf(line, "%s: expected %ld bytes, got %ld bytes (starting %s)", what, elen, glen,
		      hex(got, glen));
		return false;
	}
	unsigned char *exp = malloc(elen + 1);
	fill(exp, elen, seed);
	for (long i = 0; i < elen; i++) {
		if (got[i] != exp[i]) {
			failf(line, "%s: %ld bytes, byte %ld differs: expected %s, got %s", what, elen,
			      i, hex(exp + i, elen - i), hex(got + i, glen - i));
			free(exp);
			return false;
		}
	}
	free(exp);
	return true;
}

static bool send_to(int line, int fd, long len, uint32_t seed, const addr_t *to, const char *what)
{
	unsigned char *p = malloc(len + 1);
	fill(p, len, seed);
	long r = to ? sendto(fd, p, len, 0, SA(to), to->len) : send(fd, p, len, 0);
	int e = errno;
	free(p);
	if (r != len) {
		if (r < 0)
			failf(line, "%s: send of %ld bytes: -1 %s", what, len, en(e));
		else
			failf(line, "%s: send of %ld bytes returned %ld", what, len, r);
		return false;
	}
	return true;
}

/* recvfrom one datagram: length, bytes and (if from) the source must be exact */
static bool recv_check(int line, int fd, long len, uint32_t seed, const addr_t *from,
		       const char *what)
{
	unsigned char *p = malloc(BIGBUF);
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	socklen_t sl = sizeof ss;
	long r = recvfrom(fd, p, BIGBUF, 0, (struct sockaddr *)&ss, &sl);
	int e = errno;
	bool ok;
	if (r < 0) {
		failf(line, "%s: recvfrom: expected a datagram of %ld bytes, got -1 %s", what, len,
		      en(e));
		ok = false;
	} else {
		ok = data_ok(line, what, p, r, len, seed);
		if (from && !addr_same(&ss, sl, from)) {
			failf(line, "%s: source: expected %s, got %s", what,
			      addrstr(&from->ss, from->len), addrstr(&ss, sl));
			ok = false;
		}
	}
	free(p);
	return ok;
}
#define SEND(fd, len, seed, to, what) send_to(__LINE__, fd, len, seed, to, what)
#define RECV(fd, len, seed, from, what) recv_check(__LINE__, fd, len, seed, from, what)

/* Nothing more may arrive on fd within ms: anything that does is reported. */
static void expect_nothing(int line, int fd, int ms, const char *what)
{
	struct pollfd pf = {fd, POLLIN, 0};
	double t0 = now_ms();
	int extra = 0;
	for (;;) {
		int left = ms - (int)(now_ms() - t0);
		if (left < 0)
			left = 0;
		int r = poll(&pf, 1, left);
		if (r <= 0)
			break;
		unsigned char *p = malloc(BIGBUF);
		struct sockaddr_storage ss;
		memset(&ss, 0, sizeof ss);
		socklen_t sl = sizeof ss;
		long n = recvfrom(fd, p, BIGBUF, MSG_DONTWAIT, (struct sockaddr *)&ss, &sl);
		if (n >= 0)
			failf(line, "%s: unexpected extra datagram of %ld bytes from %s: %s", what, n,
			      addrstr(&ss, sl), hex(p, n));
		else if (errno != EAGAIN)
			failf(line, "%s: poll said readable, recvfrom: %s", what, en(errno));
		free(p);
		if (n < 0 || ++extra >= 5)
			break;
	}
}

static bool get_stats(int fd, struct iwarp_stats *st)
{
	memset(st, 0, sizeof *st);
	socklen_t l = sizeof *st;
	if (getsockopt(fd, SOL_IWARP, IWARP_STATS, st, &l) < 0) {
		FAIL("getsockopt(fd %d, SOL_IWARP, IWARP_STATS): %s", fd, en(errno));
		return false;
	}
	CHECK(l == sizeof *st, "getsockopt(IWARP_STATS): optlen %u, expected %zu", (unsigned)l,
	      sizeof *st);
	return true;
}

static const char *statstr(const struct iwarp_stats *s)
{
	char *b = ring();
	snprintf(b, 160,
		 "tx_framed %" PRIu64 " rx_framed %" PRIu64 " tx_plain %" PRIu64 " rx_plain %" PRIu64
		 " lost %" PRIu64 " retransmits %" PRIu64 " crc_drops %" PRIu64,
		 s->tx_framed, s->rx_framed, s->tx_plain, s->rx_plain, s->lost, s->retransmits,
		 s->crc_drops);
	return b;
}

/* getsockopt(SOL_IWARP, opt) as an int; -1 with errno on failure */
static int geti(int fd, int opt, socklen_t *lenp)
{
	int v = -12345;
	socklen_t l = sizeof v;
	if (getsockopt(fd, SOL_IWARP, opt, &v, &l) < 0)
		return -1;
	if (lenp)
		*lenp = l;
	return v;
}

static int seti(int fd, int opt, int v)
{
	return setsockopt(fd, SOL_IWARP, opt, &v, sizeof v);
}

static void need_shim(void)
{
	if (!g_shim) {
		FAIL("this subtest checks the shim and needs LD_PRELOAD=libdgshim.so; "
		     "getsockopt(SOL_IWARP) fails as in the kernel, so it is not loaded");
		finish();
	}
}

static void detect_shim(void)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0) {
		FAIL("socket(AF_INET, SOCK_DGRAM): %s", en(errno));
		finish();
	}
	int v;
	socklen_t l = sizeof v;
	if (getsockopt(s, SOL_IWARP, IWARP_TAKEN, &v, &l) == 0)
		g_shim = 1;
	else if (errno == ENOPROTOOPT || errno == EOPNOTSUPP)
		g_shim = 0; /* Linux: EOPNOTSUPP from getsockopt on AF_INET, ENOPROTOOPT on AF_INET6 */
	else
		FAIL("getsockopt(SOL_IWARP, IWARP_TAKEN) on a new UDP socket: %s (expected success "
		     "under the shim, EOPNOTSUPP or ENOPROTOOPT without it)",
		     en(errno));
	close(s);
	const char *exp = getenv("SOCKAPI_EXPECT");
	if (exp && !strcmp(exp, "preload") && !g_shim)
		FAIL("started with LD_PRELOAD=%s but SOL_IWARP is not answered (kernel error): the "
		     "shim did not load",
		     getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "(unset)");
	if (exp && !strcmp(exp, "native") && g_shim)
		FAIL("started natively but SOL_IWARP is answered: something preloaded the shim");
}

static bool have_ipv6(void)
{
	int s = socket(AF_INET6, SOCK_DGRAM, 0);
	if (s < 0)
		return false;
	addr_t a = mkaddr(AF_INET6, 0);
	bool ok = bind(s, SA(&a), a.len) == 0;
	close(s);
	return ok;
}

/* IWARP_TAKEN must be want (under the shim only) */
static void check_taken(int line, int fd, int want, const char *what)
{
	if (!g_shim)
		return;
	int v = geti(fd, IWARP_TAKEN, NULL);
	if (v == -1)
		failf(line, "%s: getsockopt(IWARP_TAKEN): %s", what, en(errno));
	else if (v != want)
		failf(line, "%s: IWARP_TAKEN: expected %d, got %d", what, want, v);
}

/* a socket the shim must leave alone: IWARP_TAKEN 0, or the kernel's own error */
static void check_not_ip(int line, int fd, const char *what)
{
	if (!g_shim)
		return;
	errno = 0;
	int v = geti(fd, IWARP_TAKEN, NULL);
	if (!(v == 0 || (v == -1 && (errno == EOPNOTSUPP || errno == ENOPROTOOPT))))
		failf(line, "%s: IWARP_TAKEN expected 0, or -1 EOPNOTSUPP as the kernel says (or "
		      "ENOPROTOOPT), got %d %s", what, v, v == -1 ? en(errno) : "");
}

/* ---------------------------------------------------------------------------------------- */
/* basic4 / basic6 PORT (3 ports)                                                            */

static int test_basic(int fam, int port)
{
	if (fam == AF_INET6 && !have_ipv6())
		return skip("no IPv6 loopback (::1)");
	addr_t A = mkaddr(fam, port), B = mkaddr(fam, port + 1);
	int a = udp_bound(fam, port, 0), b = udp_bound(fam, port + 1, 0);
	set_rcvtimeo(a, 5000);
	set_rcvtimeo(b, 5000);
	struct iwarp_stats sa0, sb0;
	if (g_shim) {
		check_taken(__LINE__, a, 1, "bound UDP socket a");
		check_taken(__LINE__, b, 1, "bound UDP socket b");
		get_stats(a, &sa0);
		get_stats(b, &sb0);
	}
	CHECK_NAME(a, &A, "a");
	CHECK_NAME(b, &B, "b");
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	EXPECT_ERR(getpeername(a, (struct sockaddr *)&ss, &sl), ENOTCONN);
	EXPECT_ERR(send(a, "x", 1, 0), EDESTADDRREQ);
	EXPECT_ERR(write(a, "x", 1), EDESTADDRREQ);

	/* sendto / recvfrom, both ways, sizes up to near the maximum */
	static const long sizes[] = {1, 2, 100, 1472, 1473, 9000, 60000};
	char what[120];
	unsigned char buf0[1];
	for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		snprintf(what, sizeof what, "a->b sendto/recvfrom %ld bytes", sizes[i]);
		if (SEND(a, sizes[i], 100 + i, &B, what))
			RECV(b, sizes[i], 100 + i, &A, what);
		snprintf(what, sizeof what, "b->a sendto/recvfrom %ld bytes", sizes[i]);
		if (SEND(b, sizes[i], 150 + i, &A, what))
			RECV(a, sizes[i], 150 + i, &B, what);
	}

	/* datagram boundaries: three sent back to back, three received */
	for (int i = 0; i < 3; i++)
		SEND(a, 10 * (i + 1), 200 + i, &B, "boundaries: send");
	for (int i = 0; i < 3; i++) {
		snprintf(what, sizeof what, "boundaries: datagram %d of 3", i + 1);
		RECV(b, 10 * (i + 1), 200 + i, &A, what);
	}

	/* a burst: 64 small datagrams queued before the first read (the kernel buffer holds them
	 * all, about 50 KB of its 208 KB) arrive all, in order */
	{
		enum { BURST = 64 };
		int sent = 0, got = 0;
		for (int i = 0; i < BURST && SEND(a, 100, 250 + i, &B, "burst: send"); i++)
			sent++;
		if (sent == BURST) {
			struct pollfd pf = {b, POLLIN, 0};
			poll(&pf, 1, 2000);
			sleep_ms(50); /* let every datagram arrive before reading any */
			for (int i = 0; i < BURST; i++) {
				snprintf(what, sizeof what, "burst of %d queued datagrams: datagram %d", BURST, i);
				if (!RECV(b, 100, 250 + i, &A, what))
					break;
				got++;
			}
			CHECK(got == BURST, "burst: %d of %d queued datagrams received in order", got, BURST);
		}
		EXPECT_ERR(recv(b, buf0, 1, MSG_DONTWAIT), EAGAIN);
	}

	/* recvfrom with an address buffer too small: truncated, addrlen says the real size */
	unsigned char *buf = malloc(BIGBUF);
	SEND(a, 33, 210, &B, "short addrlen");
	memset(&ss, 0, sizeof ss);
	sl = 4;
	if (EXPECT_RET(recvfrom(b, buf, BIGBUF, 0, (struct sockaddr *)&ss, &sl), 33)) {
		CHECK(sl == A.len, "recvfrom with addrlen 4: addrlen expected %u, got %u",
		      (unsigned)A.len, (unsigned)sl);
		CHECK(!memcmp(&ss, &A.ss, 4), "recvfrom with addrlen 4: first 4 address bytes %s, "
		      "expected %s", hex(&ss, 4), hex(&A.ss, 4));
		CHECK(!memcmp((char *)&ss + 4, (char[12]){0}, 12),
		      "recvfrom with addrlen 4 wrote past the 4 bytes: %s", hex((char *)&ss + 4, 12));
		data_ok(__LINE__, "recvfrom with addrlen 4", buf, 33, 33, 210);
	}
	/* recv / recvfrom without an address */
	SEND(a, 34, 211, &B, "recvfrom NULL address");
	if (EXPECT_RET(recvfrom(b, buf, BIGBUF, 0, NULL, NULL), 34))
		data_ok(__LINE__, "recvfrom NULL address", buf, 34, 34, 211);

	/* sendmsg with 3 iovecs (one empty), recvmsg into 2 iovecs, control buffer unused */
	{
		unsigned char p[305], r1[7], r2[1000], all[1007], cbuf[256];
		fill(p, 305, 300);
		struct iovec siov[3] = {{p, 5}, {p + 5, 0}, {p + 5, 300}};
		struct msghdr m;
		memset(&m, 0, sizeof m);
		m.msg_name = SA(&B);
		m.msg_namelen = B.len;
		m.msg_iov = siov;
		m.msg_iovlen = 3;
		EXPECT_RET(sendmsg(a, &m, 0), 305);
		struct iovec riov[2] = {{r1, 7}, {r2, 1000}};
		struct sockaddr_storage from;
		memset(&from, 0, sizeof from);
		struct msghdr rm;
		memset(&rm, 0, sizeof rm);
		rm.msg_name = &from;
		rm.msg_namelen = sizeof from;
		rm.msg_iov = riov;
		rm.msg_iovlen = 2;
		rm.msg_control = cbuf;
		rm.msg_controllen = sizeof cbuf;
		rm.msg_flags = -1;
		if (EXPECT_RET(recvmsg(b, &rm, 0), 305)) {
			memcpy(all, r1, 7);
			memcpy(all + 7, r2, 298);
			data_ok(__LINE__, "sendmsg/recvmsg iovecs", all, 305, 305, 300);
			CHECK_ADDR(&from, rm.msg_namelen, &A, "recvmsg msg_name");
			CHECK(rm.msg_flags == 0, "recvmsg: msg_flags expected 0, got 0x%x", rm.msg_flags);
			CHECK(rm.msg_controllen == 0,
			      "recvmsg with no ancillary option set: msg_controllen expected 0, got %zu",
			      (size_t)rm.msg_controllen);
		}
	}

	/* sendmmsg / recvmmsg: 5 datagrams of different sizes, 2 iovecs each */
	{
		enum { MM = 5 };
		static const long msz[MM] = {1, 64, 1000, 4000, 12000};
		struct mmsghdr mm[MM], rmm[MM];
		struct iovec siov[MM][2], riov[MM];
		unsigned char *sb[MM], *rb[MM];
		struct sockaddr_storage from[MM];
		memset(mm, 0, sizeof mm);
		memset(rmm, 0, sizeof rmm);
		for (int i = 0; i < MM; i++) {
			sb[i] = malloc(msz[i]);
			rb[i] = malloc(16384);
			fill(sb[i], msz[i], 400 + i);
			siov[i][0] = (struct iovec){sb[i], msz[i] / 2};
			siov[i][1] = (struct iovec){sb[i] + msz[i] / 2, msz[i] - msz[i] / 2};
			mm[i].msg_hdr.msg_iov = siov[i];
			mm[i].msg_hdr.msg_iovlen = 2;
			mm[i].msg_hdr.msg_name = SA(&B);
			mm[i].msg_hdr.msg_namelen = B.len;
			riov[i] = (struct iovec){rb[i], 16384};
			rmm[i].msg_hdr.msg_iov = &riov[i];
			rmm[i].msg_hdr.msg_iovlen = 1;
			rmm[i].msg_hdr.msg_name = &from[i];
			rmm[i].msg_hdr.msg_namelen = sizeof from[i];
		}
		if (EXPECT_RET(sendmmsg(a, mm, MM, 0), MM))
			for (int i = 0; i < MM; i++)
				CHECK(mm[i].msg_len == msz[i], "sendmmsg: msg_len[%d] expected %ld, got %u",
				      i, msz[i], mm[i].msg_len);
		int got = 0;
		while (got < MM) {
			int r = recvmmsg(b, rmm + got, MM - got, MSG_WAITFORONE, NULL);
			if (r <= 0) {
				FAIL("recvmmsg after %d of %d datagrams: returned %d %s", got, MM, r,
				     r < 0 ? en(errno) : "");
				break;
			}
			got += r;
		}
		for (int i = 0; i < got; i++) {
			snprintf(what, sizeof what, "sendmmsg/recvmmsg datagram %d", i);
			data_ok(__LINE__, what, rb[i], rmm[i].msg_len, msz[i], 400 + i);
			CHECK_ADDR(&from[i], rmm[i].msg_hdr.msg_namelen, &A, "%s source", what);
			CHECK(rmm[i].msg_hdr.msg_flags == 0, "%s: msg_flags 0x%x", what,
			      rmm[i].msg_hdr.msg_flags);
		}
		for (int i = 0; i < MM; i++) {
			free(sb[i]);
			free(rb[i]);
		}
	}

	/* connected sockets: send/recv, write/read, writev/readv */
	MUST(connect(a, SA(&B), B.len));
	MUST(connect(b, SA(&A), A.len));
	CHECK_PEER(a, &B, "connected a");
	CHECK_PEER(b, &A, "connected b");
	CHECK_NAME(a, &A, "connected a");
	if (SEND(a, 77, 500, NULL, "connected send/recv"))
		if (EXPECT_RET(recv(b, buf, BIGBUF, 0), 77))
			data_ok(__LINE__, "connected send/recv", buf, 77, 77, 500);
	{
		unsigned char p[500];
		fill(p, 500, 501);
		EXPECT_RET(write(a, p, 500), 500);
		long r = read(b, buf, BIGBUF);
		if (r < 0)
			FAIL("connected write/read: read: %s", en(errno));
		else
			data_ok(__LINE__, "connected write/read", buf, r, 500, 501);
	}
	{
		unsigned char p[100], r1[30], r2[1000], all[100];
		fill(p, 100, 502);
		struct iovec w[3] = {{p, 10}, {p + 10, 0}, {p + 10, 90}};
		EXPECT_RET(writev(a, w, 3), 100);
		struct iovec rv[2] = {{r1, 30}, {r2, 1000}};
		if (EXPECT_RET(readv(b, rv, 2), 100)) {
			memcpy(all, r1, 30);
			memcpy(all + 30, r2, 70);
			data_ok(__LINE__, "connected writev/readv", all, 100, 100, 502);
		}
	}
	{
		unsigned char p[64];
		fill(p, 64, 503);
		EXPECT_RET(write(b, p, 64), 64);
		RECV(a, 64, 503, &B, "connected b write -> a recvfrom");
		fill(p, 64, 504);
		EXPECT_RET(sendto(a, p, 64, 0, NULL, 0), 64);
		RECV(b, 64, 504, &A, "connected sendto(NULL address)");
	}
	/* a connected socket only receives from its peer: the kernel drops the intruder's */
	{
		int c = udp_bound(fam, port + 2, 0);
		SEND(c, 40, 600, &A, "intruder -> connected a");
		SEND(b, 41, 601, &A, "peer b -> connected a");
		RECV(a, 41, 601, &B, "connected a receives only from its peer");
		EXPECT_ERR(recv(a, buf, BIGBUF, MSG_DONTWAIT), EAGAIN);
		close(c);
	}
	/* connect(AF_UNSPEC) dissolves the association */
	{
		struct sockaddr us;
		memset(&us, 0, sizeof us);
		us.sa_family = AF_UNSPEC;
		EXPECT_RET(connect(a, &us, sizeof us), 0);
		sl = sizeof ss;
		EXPECT_ERR(getpeername(a, (struct sockaddr *)&ss, &sl), ENOTCONN);
		EXPECT_ERR(send(a, "x", 1, 0), EDESTADDRREQ);
		if (SEND(a, 55, 602, &B, "sendto after disconnect"))
			RECV(b, 55, 602, &A, "sendto after disconnect");
	}
	if (g_shim) {
		struct iwarp_stats sa1, sb1;
		if (get_stats(a, &sa1) && get_stats(b, &sb1)) {
			CHECK(sa1.tx_framed > sa0.tx_framed && sa1.rx_framed > sa0.rx_framed,
			      "two preloaded sockets in one process: a's framed counters did not grow: "
			      "before %s, after %s",
			      statstr(&sa0), statstr(&sa1));
			CHECK(sb1.tx_framed > sb0.tx_framed && sb1.rx_framed > sb0.rx_framed,
			      "two preloaded sockets in one process: b's framed counters did not grow: "
			      "before %s, after %s",
			      statstr(&sb0), statstr(&sb1));
		}
	}
	free(buf);
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* trunc PORT (2 ports)                                                                      */

static int test_trunc(int port)
{
	addr_t A = mkaddr(AF_INET, port), B = mkaddr(AF_INET, port + 1);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(b, 5000);
	unsigned char buf[2000];
	struct sockaddr_storage ss;
	socklen_t sl;

	/* short buffer: the buffer's worth, the rest of the datagram is gone */
	SEND(a, 100, 1, &B, "short recv");
	if (EXPECT_RET(recv(b, buf, 10, 0), 10))
		data_ok(__LINE__, "short recv: the first 10 bytes", buf, 10, 10, 1);
	SEND(a, 50, 2, &B, "datagram after a short recv");
	RECV(b, 50, 2, &A, "datagram after a short recv (rest of the previous one discarded)");

	/* MSG_TRUNC: the real length */
	SEND(a, 100, 3, &B, "recv MSG_TRUNC");
	if (EXPECT_RET(recv(b, buf, 10, MSG_TRUNC), 100))
		data_ok(__LINE__, "recv MSG_TRUNC: the first 10 bytes", buf, 10, 10, 3);
	SEND(a, 20, 4, &B, "datagram after recv MSG_TRUNC");
	RECV(b, 20, 4, &A, "datagram after recv MSG_TRUNC");

	/* read() on a short buffer (connected) */
	MUST(connect(b, SA(&A), A.len));
	SEND(a, 100, 5, &B, "short read");
	if (EXPECT_RET(read(b, buf, 10), 10))
		data_ok(__LINE__, "short read: the first 10 bytes", buf, 10, 10, 5);
	SEND(a, 21, 6, &B, "datagram after a short read");
	RECV(b, 21, 6, &A, "datagram after a short read");

	/* recvmsg: MSG_TRUNC in msg_flags */
	struct iovec iov;
	struct msghdr m;
	for (int mode = 0; mode < 3; mode++) {
		SEND(a, 100, 10 + mode, &B, "recvmsg");
		iov = (struct iovec){buf, mode == 2 ? 200 : 10};
		memset(&m, 0, sizeof m);
		m.msg_name = &ss;
		m.msg_namelen = sizeof ss;
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		long r = recvmsg(b, &m, mode == 1 ? MSG_TRUNC : 0);
		if (r < 0) {
			FAIL("recvmsg (case %d): %s", mode, en(errno));
			continue;
		}
		if (mode == 0) {
			CHECK(r == 10, "recvmsg into 10 bytes of a 100-byte datagram: returned %ld, "
			      "expected 10", r);
			CHECK(m.msg_flags & MSG_TRUNC, "recvmsg into 10 bytes of a 100-byte datagram: "
			      "MSG_TRUNC not set in msg_flags (0x%x)", m.msg_flags);
		} else if (mode == 1) {
			CHECK(r == 100, "recvmsg(MSG_TRUNC) into 10 bytes of a 100-byte datagram: "
			      "returned %ld, expected 100", r);
			CHECK(m.msg_flags & MSG_TRUNC, "recvmsg(MSG_TRUNC) into 10 bytes: MSG_TRUNC not "
			      "set in msg_flags (0x%x)", m.msg_flags);
		} else {
			CHECK(r == 100, "recvmsg into 200 bytes of a 100-byte datagram: returned %ld", r);
			CHECK(m.msg_flags == 0, "recvmsg of a whole datagram: msg_flags expected 0, got "
			      "0x%x", m.msg_flags);
		}
		long placed = mode == 2 ? 100 : 10; /* what the buffer holds */
		data_ok(__LINE__, "recvmsg: the bytes placed", buf, r < placed ? r : placed, placed,
			10 + mode);
		CHECK_ADDR(&ss, m.msg_namelen, &A, "recvmsg (case %d) msg_name", mode);
	}

	/* MSG_PEEK, then a normal recv, return the same datagram */
	SEND(a, 100, 20, &B, "peek");
	if (EXPECT_RET(recv(b, buf, sizeof buf, MSG_PEEK), 100))
		data_ok(__LINE__, "recv MSG_PEEK", buf, 100, 100, 20);
	EXPECT_RET(recv(b, NULL, 0, MSG_PEEK | MSG_TRUNC), 100);
	sl = sizeof ss;
	memset(buf, 0, sizeof buf);
	if (EXPECT_RET(recvfrom(b, buf, 10, MSG_PEEK, (struct sockaddr *)&ss, &sl), 10)) {
		data_ok(__LINE__, "recvfrom MSG_PEEK 10 bytes", buf, 10, 10, 20);
		CHECK_ADDR(&ss, sl, &A, "recvfrom MSG_PEEK source");
	}
	{
		int n = -1;
		EXPECT_RET(ioctl(b, FIONREAD, &n), 0);
		CHECK(n == 100, "FIONREAD after peeks: expected 100, got %d", n);
	}
	RECV(b, 100, 20, &A, "recv after MSG_PEEK gives the same datagram");
	EXPECT_ERR(recv(b, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);

	/* zero-length datagrams */
	EXPECT_RET(sendto(a, buf, 0, 0, SA(&B), B.len), 0);
	sl = sizeof ss;
	memset(&ss, 0, sizeof ss);
	{
		struct pollfd pf = {b, POLLIN, 0};
		EXPECT_RET(poll(&pf, 1, 2000), 1);
		CHECK(pf.revents == POLLIN, "poll on a queued zero-length datagram: revents 0x%x",
		      pf.revents);
	}
	EXPECT_RET(recv(b, buf, sizeof buf, MSG_PEEK), 0);
	if (EXPECT_RET(recvfrom(b, buf, sizeof buf, 0, (struct sockaddr *)&ss, &sl), 0))
		CHECK_ADDR(&ss, sl, &A, "zero-length datagram source");
	EXPECT_RET(sendto(a, buf, 0, 0, SA(&B), B.len), 0);
	SEND(a, 5, 30, &B, "datagram after a zero-length one");
	iov = (struct iovec){buf, sizeof buf};
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (EXPECT_RET(recvmsg(b, &m, 0), 0))
		CHECK(m.msg_flags == 0, "recvmsg of a zero-length datagram: msg_flags 0x%x",
		      m.msg_flags);
	RECV(b, 5, 30, &A, "datagram after a zero-length one");
	/* connected send of zero bytes */
	MUST(connect(a, SA(&B), B.len));
	EXPECT_RET(send(a, buf, 0, 0), 0);
	EXPECT_RET(read(b, buf, sizeof buf), 0);
	SEND(a, 6, 31, NULL, "datagram after a connected zero-length send");
	RECV(b, 6, 31, &A, "datagram after a connected zero-length send");
	EXPECT_ERR(recv(b, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* nonblock PORT (3 ports)                                                                   */

static void expect_eagain_all(int line, int fd, int flags, const char *what)
{
	unsigned char buf[64];
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	struct iovec iov = {buf, sizeof buf};
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	struct mmsghdr mm;
	memset(&mm, 0, sizeof mm);
	mm.msg_hdr.msg_iov = &iov;
	mm.msg_hdr.msg_iovlen = 1;
	long r;
	const char *call;
	for (int k = 0; k < 6; k++) {
		if (k >= 4 && flags)
			break; /* read/readv take no flags */
		errno = 0;
		switch (k) {
		case 0: call = "recv"; r = recv(fd, buf, sizeof buf, flags); break;
		case 1: call = "recvfrom"; r = recvfrom(fd, buf, sizeof buf, flags, (struct sockaddr *)&ss, &sl); break;
		case 2: call = "recvmsg"; r = recvmsg(fd, &m, flags); break;
		case 3: call = "recvmmsg"; r = recvmmsg(fd, &mm, 1, flags, NULL); break;
		case 4: call = "read"; r = read(fd, buf, sizeof buf); break;
		default: call = "readv"; r = readv(fd, &iov, 1); break;
		}
		int e = errno;
		if (r != -1 || (e != EAGAIN && e != EWOULDBLOCK))
			failf(line, "%s: %s on an empty socket: expected -1 EAGAIN, got %ld %s", what,
			      call, r, r == -1 ? en(e) : "");
	}
}

static void check_nonblock_flag(int line, int fd, bool want, const char *what)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		failf(line, "%s: fcntl(F_GETFL): %s", what, en(errno));
	else if (!!(fl & O_NONBLOCK) != want)
		failf(line, "%s: F_GETFL 0x%x: O_NONBLOCK expected %s", what, fl,
		      want ? "set" : "clear");
}

static int test_nonblock(int port)
{
	addr_t B = mkaddr(AF_INET, port + 1), C = mkaddr(AF_INET, port + 2);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	int c = udp_bound(AF_INET, port + 2, SOCK_NONBLOCK);
	unsigned char buf[2000];

	/* SOCK_NONBLOCK at socket() */
	check_nonblock_flag(__LINE__, c, true, "socket(SOCK_NONBLOCK)");
	expect_eagain_all(__LINE__, c, 0, "socket(SOCK_NONBLOCK)");
	if (SEND(a, 50, 1, &C, "to a SOCK_NONBLOCK socket")) {
		struct pollfd pf = {c, POLLIN, 0};
		EXPECT_RET(poll(&pf, 1, 2000), 1);
		RECV(c, 50, 1, NULL, "non-blocking recv with data queued");
	}
	if (SEND(c, 51, 2, &B, "send from a SOCK_NONBLOCK socket")) {
		set_rcvtimeo(b, 5000);
		RECV(b, 51, 2, &C, "send from a SOCK_NONBLOCK socket");
	}

	/* blocking socket: flag clear, MSG_DONTWAIT */
	check_nonblock_flag(__LINE__, b, false, "blocking socket");
	expect_eagain_all(__LINE__, b, MSG_DONTWAIT, "MSG_DONTWAIT on a blocking socket");
	check_nonblock_flag(__LINE__, b, false, "after MSG_DONTWAIT");

	/* fcntl O_NONBLOCK */
	int fl = MUST(fcntl(b, F_GETFL));
	EXPECT_RET(fcntl(b, F_SETFL, fl | O_NONBLOCK), 0);
	check_nonblock_flag(__LINE__, b, true, "fcntl(F_SETFL, O_NONBLOCK)");
	expect_eagain_all(__LINE__, b, 0, "fcntl(F_SETFL, O_NONBLOCK)");
	EXPECT_RET(fcntl(b, F_SETFL, fl & ~O_NONBLOCK), 0);
	check_nonblock_flag(__LINE__, b, false, "fcntl(F_SETFL) clearing O_NONBLOCK");

	/* ioctl FIONBIO */
	int one = 1, zero = 0;
	EXPECT_RET(ioctl(b, FIONBIO, &one), 0);
	check_nonblock_flag(__LINE__, b, true, "ioctl(FIONBIO, 1)");
	expect_eagain_all(__LINE__, b, 0, "ioctl(FIONBIO, 1)");
	EXPECT_RET(ioctl(b, FIONBIO, &zero), 0);
	check_nonblock_flag(__LINE__, b, false, "ioctl(FIONBIO, 0)");

	/* FIONREAD / SIOCINQ: the size of the next datagram */
	int n = -1;
	EXPECT_RET(ioctl(b, FIONREAD, &n), 0);
	CHECK(n == 0, "FIONREAD on an empty socket: expected 0, got %d", n);
	SEND(a, 123, 3, &B, "FIONREAD");
	SEND(a, 456, 4, &B, "FIONREAD");
	struct pollfd pf = {b, POLLIN, 0};
	EXPECT_RET(poll(&pf, 1, 2000), 1);
	n = -1;
	EXPECT_RET(ioctl(b, FIONREAD, &n), 0);
	CHECK(n == 123, "FIONREAD with datagrams of 123 and 456 bytes queued: expected 123, got %d",
	      n);
	n = -1;
	EXPECT_RET(ioctl(b, SIOCINQ, &n), 0);
	CHECK(n == 123, "SIOCINQ: expected 123, got %d", n);
	RECV(b, 123, 3, NULL, "FIONREAD first datagram");
	EXPECT_RET(poll(&pf, 1, 2000), 1);
	n = -1;
	EXPECT_RET(ioctl(b, FIONREAD, &n), 0);
	CHECK(n == 456, "FIONREAD after reading the first: expected 456, got %d", n);
	RECV(b, 456, 4, NULL, "FIONREAD second datagram");
	n = -1;
	EXPECT_RET(ioctl(b, FIONREAD, &n), 0);
	CHECK(n == 0, "FIONREAD after draining: expected 0, got %d", n);

	/* SO_RCVTIMEO: a blocking recv gives up with EAGAIN */
	set_rcvtimeo(b, 200);
	struct timeval tv = {0, 0};
	socklen_t tl = sizeof tv;
	EXPECT_RET(getsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, &tl), 0);
	CHECK(tv.tv_sec == 0 && tv.tv_usec == 200000, "SO_RCVTIMEO read back %ld.%06ld, expected "
	      "0.200000", (long)tv.tv_sec, (long)tv.tv_usec);
	double t0 = now_ms();
	EXPECT_ERR(recv(b, buf, sizeof buf, 0), EAGAIN);
	CHECK_ELAPSED("recv with SO_RCVTIMEO 200 ms", t0, 190, 1500);
	t0 = now_ms();
	struct iovec iov = {buf, sizeof buf};
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	EXPECT_ERR(recvmsg(b, &m, 0), EAGAIN);
	CHECK_ELAPSED("recvmsg with SO_RCVTIMEO 200 ms", t0, 190, 1500);

	/* MSG_ERRQUEUE: the kernel socket's error queue, at once even on a blocking socket (the
	 * shim waited 200 ms there for a datagram, or for ever without a timeout); with
	 * IP_RECVERR a datagram to a closed port comes back there as ECONNREFUSED */
	t0 = now_ms();
	EXPECT_ERR(recvmsg(b, &m, MSG_ERRQUEUE), EAGAIN);
	CHECK_ELAPSED("recvmsg(MSG_ERRQUEUE) on an empty error queue", t0, 0, 150);
	int closed = udp_bound(AF_INET, 0, 0);
	struct sockaddr_in cz;
	socklen_t czl = sizeof cz;
	MUST(getsockname(closed, (struct sockaddr *)&cz, &czl));
	close(closed);
	EXPECT_RET(setsockopt(b, SOL_IP, IP_RECVERR, &one, sizeof one), 0);
	EXPECT_RET(sendto(b, buf, 20, 0, (struct sockaddr *)&cz, czl), 20);
	char ctl[512];
	int got = -1;
	for (int k = 0; k < 100 && got < 0; k++) {
		memset(&m, 0, sizeof m);
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		m.msg_control = ctl;
		m.msg_controllen = sizeof ctl;
		if (recvmsg(b, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0)
			got = 0;
		else
			sleep_ms(10);
	}
	CHECK(got == 0, "IP_RECVERR: no error queued for a datagram to a closed port");
	int ee = 0;
	for (struct cmsghdr *cm = got ? NULL : CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
		if (cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR)
			ee = (int)((struct sock_extended_err *)(void *)CMSG_DATA(cm))->ee_errno;
	CHECK(got || ee == ECONNREFUSED, "IP_RECVERR: the queued error says %s, expected ECONNREFUSED",
	      en(ee));
	close(a);
	close(b);
	close(c);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* poll PORT (3 ports)                                                                       */

static void drain_n(int line, int fd, int n, const char *what)
{
	unsigned char buf[2048];
	for (int i = 0; i < n; i++)
		if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) < 0)
			failf(line, "%s: reading datagram %d of %d: %s", what, i + 1, n, en(errno));
	if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) >= 0)
		failf(line, "%s: more than %d datagrams were queued", what, n);
}

/* wait (up to 2 s) until fd has a datagram, without consuming the event under test */
static void settle(int fd)
{
	int n = 0;
	for (int i = 0; i < 2000 && (ioctl(fd, FIONREAD, &n) < 0 || n == 0); i++) {
		unsigned char c;
		if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0)
			return;
		sleep_ms(1);
	}
}

static int test_poll(int port)
{
	addr_t B = mkaddr(AF_INET, port + 1), C = mkaddr(AF_INET, port + 2);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	double t0;
	struct pollfd pf = {b, POLLIN, 0};

	/* poll */
	t0 = now_ms();
	EXPECT_RET(poll(&pf, 1, 100), 0);
	CHECK_ELAPSED("poll(POLLIN, 100 ms) on an empty socket", t0, 99, 1000);
	CHECK(pf.revents == 0, "poll timeout: revents 0x%x", pf.revents);
	pf.events = POLLOUT;
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents == POLLOUT, "poll(POLLOUT) on an idle socket: revents 0x%x", pf.revents);
	pf.events = POLLIN | POLLOUT;
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents == POLLOUT, "poll(POLLIN|POLLOUT) on an idle empty socket: revents 0x%x",
	      pf.revents);
	SEND(a, 10, 1, &B, "poll");
	pf.events = POLLIN;
	EXPECT_RET(poll(&pf, 1, 2000), 1);
	CHECK(pf.revents == POLLIN, "poll(POLLIN) with a datagram queued: revents 0x%x",
	      pf.revents);
	pf.events = POLLIN | POLLOUT;
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents == (POLLIN | POLLOUT), "poll(POLLIN|POLLOUT) with a datagram: revents 0x%x",
	      pf.revents);
	{
		struct pollfd two[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
		EXPECT_RET(poll(two, 2, 0), 1);
		CHECK(two[0].revents == 0 && two[1].revents == POLLIN,
		      "poll on [empty a, b with data]: revents 0x%x 0x%x", two[0].revents,
		      two[1].revents);
	}
	drain_n(__LINE__, b, 1, "poll");
	pf.events = POLLIN;
	EXPECT_RET(poll(&pf, 1, 0), 0);

	/* ppoll */
	{
		struct timespec ts = {0, 100000000};
		sigset_t set;
		sigemptyset(&set);
		t0 = now_ms();
		EXPECT_RET(ppoll(&pf, 1, &ts, &set), 0);
		CHECK_ELAPSED("ppoll(100 ms) on an empty socket", t0, 99, 1000);
		SEND(a, 10, 2, &B, "ppoll");
		ts = (struct timespec){2, 0};
		EXPECT_RET(ppoll(&pf, 1, &ts, NULL), 1);
		CHECK(pf.revents == POLLIN, "ppoll with a datagram: revents 0x%x", pf.revents);
		drain_n(__LINE__, b, 1, "ppoll");
	}

	/* select / pselect */
	{
		fd_set r, w;
		struct timeval tv = {0, 100000};
		FD_ZERO(&r);
		FD_SET(b, &r);
		t0 = now_ms();
		EXPECT_RET(select(b + 1, &r, NULL, NULL, &tv), 0);
		CHECK_ELAPSED("select(100 ms) on an empty socket", t0, 99, 1000);
		CHECK(!FD_ISSET(b, &r), "select timeout left the fd set");
		FD_ZERO(&w);
		FD_SET(b, &w);
		tv = (struct timeval){0, 0};
		EXPECT_RET(select(b + 1, NULL, &w, NULL, &tv), 1);
		CHECK(FD_ISSET(b, &w), "select: idle socket not writable");
		SEND(a, 10, 3, &B, "select");
		FD_ZERO(&r);
		FD_SET(b, &r);
		FD_SET(a, &r);
		FD_ZERO(&w);
		FD_SET(b, &w);
		tv = (struct timeval){2, 0};
		EXPECT_RET(select((a > b ? a : b) + 1, &r, &w, NULL, &tv), 2);
		CHECK(FD_ISSET(b, &r) && !FD_ISSET(a, &r) && FD_ISSET(b, &w),
		      "select: expected b readable and writable, a not readable; got b r%d w%d, a r%d",
		      FD_ISSET(b, &r), FD_ISSET(b, &w), FD_ISSET(a, &r));
		drain_n(__LINE__, b, 1, "select");
		FD_ZERO(&r);
		FD_SET(b, &r);
		tv = (struct timeval){0, 0};
		EXPECT_RET(select(b + 1, &r, NULL, NULL, &tv), 0);

		struct timespec ts = {0, 100000000};
		sigset_t set;
		sigemptyset(&set);
		FD_ZERO(&r);
		FD_SET(b, &r);
		t0 = now_ms();
		EXPECT_RET(pselect(b + 1, &r, NULL, NULL, &ts, &set), 0);
		CHECK_ELAPSED("pselect(100 ms) on an empty socket", t0, 99, 1000);
		SEND(a, 10, 4, &B, "pselect");
		FD_ZERO(&r);
		FD_SET(b, &r);
		ts = (struct timespec){2, 0};
		EXPECT_RET(pselect(b + 1, &r, NULL, NULL, &ts, NULL), 1);
		CHECK(FD_ISSET(b, &r), "pselect: socket with a datagram not readable");
		drain_n(__LINE__, b, 1, "pselect");
	}

	/* epoll, level-triggered */
	int ep = MUST(epoll_create1(EPOLL_CLOEXEC));
	struct epoll_event ev, evs[8];
	const uint64_t ck = 0x1122334455667788ull;
	ev.events = EPOLLIN;
	ev.data.u64 = ck;
	EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev), 0);
	EXPECT_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev), EEXIST);
	EXPECT_ERR(epoll_ctl(ep, EPOLL_CTL_DEL, a, NULL), ENOENT);
	EXPECT_RET(epoll_wait(ep, evs, 8, 0), 0);
	t0 = now_ms();
	EXPECT_RET(epoll_wait(ep, evs, 8, 100), 0);
	CHECK_ELAPSED("epoll_wait(100 ms) on an empty socket", t0, 99, 1000);
	for (int i = 0; i < 3; i++)
		SEND(a, 10 + i, 10 + i, &B, "epoll LT");
	if (EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1))
		CHECK(evs[0].events == EPOLLIN && evs[0].data.u64 == ck,
		      "epoll LT: event 0x%x data 0x%" PRIx64 ", expected EPOLLIN and 0x%" PRIx64,
		      evs[0].events, evs[0].data.u64, ck);
	settle(b);
	RECV(b, 10, 10, NULL, "epoll LT: first of 3");
	if (EXPECT_RET(epoll_wait(ep, evs, 8, 0), 1))
		CHECK(evs[0].events == EPOLLIN, "epoll LT: 2 datagrams left: events 0x%x",
		      evs[0].events);
	RECV(b, 11, 11, NULL, "epoll LT: second of 3");
	EXPECT_RET(epoll_wait(ep, evs, 8, 0), 1);
	RECV(b, 12, 12, NULL, "epoll LT: third of 3");
	t0 = now_ms();
	EXPECT_RET(epoll_wait(ep, evs, 8, 100), 0);
	CHECK_ELAPSED("epoll_wait(100 ms) after draining", t0, 99, 1000);

	/* epoll, edge-triggered */
	ev.events = EPOLLIN | EPOLLET;
	EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_MOD, b, &ev), 0);
	EXPECT_RET(epoll_wait(ep, evs, 8, 0), 0);
	SEND(a, 20, 20, &B, "epoll ET");
	EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1);
	EXPECT_RET(epoll_wait(ep, evs, 8, 50), 0); /* no new arrival: no new report */
	SEND(a, 21, 21, &B, "epoll ET");
	if (EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1)) /* a new arrival: a new report */
		CHECK(evs[0].events == EPOLLIN && evs[0].data.u64 == ck,
		      "epoll ET: event 0x%x data 0x%" PRIx64, evs[0].events, evs[0].data.u64);
	EXPECT_RET(epoll_wait(ep, evs, 8, 0), 0);
	settle(b);
	RECV(b, 20, 20, NULL, "epoll ET: first");
	RECV(b, 21, 21, NULL, "epoll ET: second");
	{
		unsigned char c;
		EXPECT_ERR(recv(b, &c, 1, MSG_DONTWAIT), EAGAIN);
	}
	t0 = now_ms();
	EXPECT_RET(epoll_wait(ep, evs, 8, 100), 0);
	CHECK_ELAPSED("epoll_wait ET after draining", t0, 99, 1000);
	SEND(a, 22, 22, &B, "epoll ET");
	EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1);
	settle(b);
	RECV(b, 22, 22, NULL, "epoll ET: third");

	/* EPOLLONESHOT and rearming with EPOLL_CTL_MOD */
	ev.events = EPOLLIN | EPOLLONESHOT;
	EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_MOD, b, &ev), 0);
	SEND(a, 30, 30, &B, "oneshot");
	EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1);
	SEND(a, 31, 31, &B, "oneshot");
	settle(b);
	EXPECT_RET(epoll_wait(ep, evs, 8, 100), 0); /* disarmed */
	EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_MOD, b, &ev), 0);
	EXPECT_RET(epoll_wait(ep, evs, 8, 1000), 1);
	EXPECT_RET(epoll_wait(ep, evs, 8, 50), 0);
	RECV(b, 30, 30, NULL, "oneshot: first");
	RECV(b, 31, 31, NULL, "oneshot: second");

	/* epoll_pwait */
	{
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGUSR1);
		ev.events = EPOLLIN;
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_MOD, b, &ev), 0);
		t0 = now_ms();
		EXPECT_RET(epoll_pwait(ep, evs, 8, 100, &set), 0);
		CHECK_ELAPSED("epoll_pwait(100 ms)", t0, 99, 1000);
		SEND(a, 40, 40, &B, "epoll_pwait");
		if (EXPECT_RET(epoll_pwait(ep, evs, 8, 2000, &set), 1))
			CHECK(evs[0].events == EPOLLIN && evs[0].data.u64 == ck,
			      "epoll_pwait: event 0x%x data 0x%" PRIx64, evs[0].events,
			      evs[0].data.u64);
		settle(b);
		RECV(b, 40, 40, NULL, "epoll_pwait");
	}

	/* EPOLLOUT on an idle socket */
	{
		int ep2 = MUST(epoll_create1(0));
		struct epoll_event e2 = {.events = EPOLLOUT, .data.u64 = 7};
		EXPECT_RET(epoll_ctl(ep2, EPOLL_CTL_ADD, a, &e2), 0);
		if (EXPECT_RET(epoll_wait(ep2, evs, 8, 0), 1))
			CHECK(evs[0].events == EPOLLOUT && evs[0].data.u64 == 7,
			      "EPOLLOUT: event 0x%x data %" PRIu64, evs[0].events, evs[0].data.u64);
		close(ep2);
	}

	/* closing a socket removes it from the epoll set, even with data queued */
	{
		int c = udp_bound(AF_INET, port + 2, 0);
		struct epoll_event e3 = {.events = EPOLLIN, .data.u64 = 0xc0ffee};
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_ADD, c, &e3), 0);
		SEND(a, 50, 50, &C, "epoll close");
		if (EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1))
			CHECK(evs[0].data.u64 == 0xc0ffee, "epoll close: data 0x%" PRIx64,
			      evs[0].data.u64);
		int cnum = c;
		close(c);
		t0 = now_ms();
		int r = epoll_wait(ep, evs, 8, 100);
		CHECK(r == 0, "epoll_wait after closing the only registered socket with data: "
		      "returned %d (event data 0x%" PRIx64 "), expected 0",
		      r, r > 0 ? evs[0].data.u64 : 0);
		int d = udp_bound(AF_INET, port + 2, 0); /* normally gets the same number */
		CHECK(d == cnum, "new socket got fd %d, not the lowest free %d", d, cnum);
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_ADD, d, &e3), 0); /* not EEXIST */
		SEND(a, 51, 51, &C, "epoll after re-adding");
		if (EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1))
			CHECK(evs[0].data.u64 == 0xc0ffee, "epoll re-added: data 0x%" PRIx64,
			      evs[0].data.u64);
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL), 0);
		settle(d);
		RECV(d, 51, 51, NULL, "epoll re-added socket");
		close(d);
	}

	/* A descriptor of the program's own registered with data that looks like the shim's
	 * event data for a taken socket (its top 16 bits 0xd95a, then anything): the program gets
	 * its data back, after MOD too, and the taken socket's event its own (the shim registers
	 * taken sockets in the program's instance and tells the two apart by those bits) */
	{
		int tp[2];
		MUST(pipe(tp));
		uint64_t look = 0xd95a000000080003ull, look2 = 0xd95affffffffffffull;
		struct epoll_event pe = {.events = EPOLLIN, .data.u64 = look};
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_ADD, tp[0], &pe), 0);
		EXPECT_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, tp[0], &pe), EEXIST);
		EXPECT_RET(epoll_wait(ep, evs, 8, 0), 0);
		MUST(write(tp[1], "x", 1));
		if (EXPECT_RET(epoll_wait(ep, evs, 8, 2000), 1))
			CHECK(evs[0].events == EPOLLIN && evs[0].data.u64 == look,
			      "tag-like data: event 0x%x data 0x%" PRIx64 ", expected 0x%" PRIx64, evs[0].events,
			      evs[0].data.u64, look);
		pe.data.u64 = look2;
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_MOD, tp[0], &pe), 0);
		SEND(a, 52, 52, &B, "epoll beside tag-like data");
		settle(b);
		int got_pipe = 0, got_sock = 0;
		for (int tries = 0; tries < 4 && !(got_pipe && got_sock); tries++) {
			int n = epoll_wait(ep, evs, 8, 2000);
			for (int q = 0; q < n; q++) {
				got_pipe |= evs[q].data.u64 == look2;
				got_sock |= evs[q].data.u64 == ck;
				CHECK(evs[q].data.u64 == look2 || evs[q].data.u64 == ck,
				      "tag-like data after MOD: data 0x%" PRIx64, evs[q].data.u64);
			}
		}
		CHECK(got_pipe && got_sock, "tag-like data after MOD: pipe reported %d, socket %d", got_pipe,
		      got_sock);
		RECV(b, 52, 52, NULL, "epoll beside tag-like data");
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_DEL, tp[0], NULL), 0);
		EXPECT_ERR(epoll_ctl(ep, EPOLL_CTL_DEL, tp[0], NULL), ENOENT);
		EXPECT_RET(epoll_wait(ep, evs, 8, 50), 0); /* the pipe is still readable, no longer watched */
		close(tp[0]);
		close(tp[1]);
	}
	close(ep);
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* threads PORT (2 ports)                                                                    */

#define TH_SEND 4
#define TH_RECV 4
#define TH_MSGS 2000
#define TH_WINDOW 48
#define TH_MAGIC 0x54485244u

static struct {
	int a, b;
	addr_t A, B;
	long sent, rcvd;
	unsigned char seen[TH_SEND][TH_MSGS];
	int bad;
} T;

static long th_len(int t, int seq)
{
	return 12 + (seq * 131 + t * 17) % 600;
}

static void *th_sender(void *arg)
{
	int t = (int)(intptr_t)arg;
	unsigned char buf[700];
	for (int seq = 0; seq < TH_MSGS; seq++) {
		double t0 = now_ms();
		while (__atomic_load_n(&T.sent, __ATOMIC_SEQ_CST) -
			       __atomic_load_n(&T.rcvd, __ATOMIC_SEQ_CST) >=
		       TH_WINDOW) {
			if (now_ms() - t0 > 5000) {
				FAIL("sender %d: no datagram received for 5 s (at seq %d, %ld sent, %ld "
				     "received): datagrams lost",
				     t, seq, T.sent, T.rcvd);
				return NULL;
			}
			usleep(50);
		}
		long len = th_len(t, seq);
		fill(buf, len, (uint32_t)(t << 16 | seq));
		uint32_t hdr[3] = {TH_MAGIC, (uint32_t)t, (uint32_t)seq};
		memcpy(buf, hdr, sizeof hdr);
		long r = sendto(T.a, buf, len, 0, SA(&T.B), T.B.len);
		if (r != len) {
			FAIL("sender %d seq %d: sendto %ld bytes: %ld %s", t, seq, len, r,
			     r < 0 ? en(errno) : "");
			return NULL;
		}
		__atomic_add_fetch(&T.sent, 1, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

static void *th_receiver(void *arg)
{
	int id = (int)(intptr_t)arg;
	unsigned char buf[2048], exp[700];
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		long r = recvfrom(T.b, buf, sizeof buf, 0, (struct sockaddr *)&ss, &sl);
		if (r < 0) {
			FAIL("receiver %d: recvfrom: %s (after %ld received in all)", id, en(errno),
			     T.rcvd);
			return NULL;
		}
		if (r == 4 && !memcmp(buf, "STOP", 4))
			return NULL;
		uint32_t hdr[3];
		if (r < 12) {
			FAIL("receiver %d: runt datagram of %ld bytes: %s", id, r, hex(buf, r));
			__atomic_add_fetch(&T.bad, 1, __ATOMIC_SEQ_CST);
			continue;
		}
		memcpy(hdr, buf, sizeof hdr);
		if (hdr[0] != TH_MAGIC || hdr[1] >= TH_SEND || hdr[2] >= TH_MSGS) {
			FAIL("receiver %d: corrupt header in a %ld-byte datagram: %s", id, r,
			     hex(buf, r));
			__atomic_add_fetch(&T.bad, 1, __ATOMIC_SEQ_CST);
			continue;
		}
		int t = hdr[1], seq = hdr[2];
		long len = th_len(t, seq);
		fill(exp, len, (uint32_t)(t << 16 | seq));
		if (r != len || memcmp(buf + 12, exp + 12, len - 12)) {
			FAIL("receiver %d: (thread %d, seq %d): expected %ld bytes, got %ld, payload "
			     "%s",
			     id, t, seq, len, r, r == len ? "differs" : "-");
			__atomic_add_fetch(&T.bad, 1, __ATOMIC_SEQ_CST);
		}
		if (!addr_same(&ss, sl, &T.A))
			FAIL("receiver %d: source %s, expected %s", id, addrstr(&ss, sl),
			     addrstr(&T.A.ss, T.A.len));
		__atomic_add_fetch(&T.seen[t][seq], 1, __ATOMIC_SEQ_CST);
		__atomic_add_fetch(&T.rcvd, 1, __ATOMIC_SEQ_CST);
	}
}

static int test_threads(int port)
{
	T.A = mkaddr(AF_INET, port);
	T.B = mkaddr(AF_INET, port + 1);
	T.a = udp_bound(AF_INET, port, 0);
	T.b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(T.b, 8000);
	int rb = 1 << 20;
	setsockopt(T.b, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb);
	pthread_t s[TH_SEND], r[TH_RECV];
	double t0 = now_ms();
	for (int i = 0; i < TH_RECV; i++)
		start_thread(&r[i], th_receiver, (void *)(intptr_t)i);
	for (int i = 0; i < TH_SEND; i++)
		start_thread(&s[i], th_sender, (void *)(intptr_t)i);
	for (int i = 0; i < TH_SEND; i++)
		pthread_join(s[i], NULL);
	for (int i = 0; i < TH_RECV; i++)
		EXPECT_RET(sendto(T.a, "STOP", 4, 0, SA(&T.B), T.B.len), 4);
	for (int i = 0; i < TH_RECV; i++)
		pthread_join(r[i], NULL);
	int missing = 0, dups = 0;
	for (int t = 0; t < TH_SEND; t++)
		for (int q = 0; q < TH_MSGS; q++) {
			if (T.seen[t][q] == 0 && missing++ < 5)
				FAIL("datagram (thread %d, seq %d) never received", t, q);
			if (T.seen[t][q] > 1 && dups++ < 5)
				FAIL("datagram (thread %d, seq %d) received %d times", t, q,
				     T.seen[t][q]);
		}
	CHECK(!missing && !dups && !T.bad, "%d x %d datagrams: %d missing, %d duplicated, %d bad "
	      "(never more than %d in flight)",
	      TH_SEND, TH_MSGS, missing, dups, T.bad, TH_WINDOW + TH_SEND);
	struct iwarp_stats sa, sb;
	if (g_shim && (missing || dups || T.bad) && get_stats(T.a, &sa) && get_stats(T.b, &sb))
		FAIL("stats: sender %s; receiver %s", statstr(&sa), statstr(&sb));
	printf("sockapi: threads: %d datagrams through %d senders and %d receivers in %.0f ms\n",
	       TH_SEND * TH_MSGS, TH_SEND, TH_RECV, now_ms() - t0);
	close(T.a);
	close(T.b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* cancel PORT (2 ports)                                                                     */

enum { K_POLL, K_PPOLL, K_SELECT, K_PSELECT, K_EPOLL, K_EPOLL_PWAIT, K_RECV, K_RECVFROM,
       K_RECVMSG, K_READ, K_N };
static const char *const kname[K_N] = {"poll", "ppoll", "select", "pselect", "epoll_wait",
				       "epoll_pwait", "recv", "recvfrom", "recvmsg", "read"};

struct cctx {
	int kind, fd, ep;
	int started, cleaned, returned;
	long ret;
	int err;
};

/* The frames that pthread_cancel unwinds are kept out of ASan's stack instrumentation: its
 * runtime (GCC 12) reports a false stack-buffer-overflow in its own sigaltstack interceptor when an
 * instrumented landing pad runs after a cancellation (google/sanitizers#1399). The shim's frames,
 * built without -fexceptions, have no landing pads; everything else stays checked. */
#if defined(__SANITIZE_ADDRESS__)
#define CANCEL_FRAME __attribute__((no_sanitize_address))
#else
#define CANCEL_FRAME
#endif

static void cancel_cleanup(void *p)
{
	__atomic_store_n(&((struct cctx *)p)->cleaned, 1, __ATOMIC_SEQ_CST);
}

CANCEL_FRAME static long blocking_call(struct cctx *c)
{
	unsigned char buf[64];
	switch (c->kind) {
	case K_POLL: {
		struct pollfd pf = {c->fd, POLLIN, 0};
		return poll(&pf, 1, -1);
	}
	case K_PPOLL: {
		struct pollfd pf = {c->fd, POLLIN, 0};
		return ppoll(&pf, 1, NULL, NULL);
	}
	case K_SELECT:
	case K_PSELECT: {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(c->fd, &r);
		return c->kind == K_SELECT ? select(c->fd + 1, &r, NULL, NULL, NULL)
					   : pselect(c->fd + 1, &r, NULL, NULL, NULL, NULL);
	}
	case K_EPOLL:
	case K_EPOLL_PWAIT: {
		struct epoll_event ev;
		return c->kind == K_EPOLL ? epoll_wait(c->ep, &ev, 1, -1)
					  : epoll_pwait(c->ep, &ev, 1, -1, NULL);
	}
	case K_RECV:
		return recv(c->fd, buf, sizeof buf, 0);
	case K_RECVFROM: {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		return recvfrom(c->fd, buf, sizeof buf, 0, (struct sockaddr *)&ss, &sl);
	}
	case K_RECVMSG: {
		struct iovec iov = {buf, sizeof buf};
		struct msghdr m;
		memset(&m, 0, sizeof m);
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		return recvmsg(c->fd, &m, 0);
	}
	default:
		return read(c->fd, buf, sizeof buf);
	}
}

CANCEL_FRAME static void *cancel_thread(void *p)
{
	struct cctx *c = p;
	pthread_cleanup_push(cancel_cleanup, c);
	__atomic_store_n(&c->started, 1, __ATOMIC_SEQ_CST);
	c->ret = blocking_call(c);
	c->err = errno;
	__atomic_store_n(&c->returned, 1, __ATOMIC_SEQ_CST);
	pthread_cleanup_pop(0);
	return NULL;
}

static int test_cancel(int port)
{
	int b = udp_bound(AF_INET, port, 0), c = udp_bound(AF_INET, port + 1, 0);
	int ep = MUST(epoll_create1(0));
	struct epoll_event ev = {.events = EPOLLIN};
	MUST(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev));
	MUST(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
	static struct cctx ctx[K_N];
	pthread_t th[K_N];
	for (int k = 0; k < K_N; k++) {
		ctx[k] = (struct cctx){.kind = k, .fd = k % 2 ? c : b, .ep = ep};
		start_thread(&th[k], cancel_thread, &ctx[k]);
	}
	double t0 = now_ms();
	for (int k = 0; k < K_N; k++)
		while (!__atomic_load_n(&ctx[k].started, __ATOMIC_SEQ_CST) && now_ms() - t0 < 2000)
			sleep_ms(1);
	sleep_ms(200); /* let them block */
	bool stuck = false;
	for (int k = 0; k < K_N; k++) {
		if (__atomic_load_n(&ctx[k].returned, __ATOMIC_SEQ_CST)) {
			FAIL("%s on an idle socket returned %ld %s instead of blocking", kname[k],
			     ctx[k].ret, ctx[k].ret < 0 ? en(ctx[k].err) : "");
			pthread_join(th[k], NULL);
			continue;
		}
		double t1 = now_ms();
		int r = pthread_cancel(th[k]);
		if (r) {
			FAIL("pthread_cancel (thread blocked in %s): %s", kname[k], en(r));
			continue;
		}
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 1;
		void *ret = NULL;
		r = pthread_timedjoin_np(th[k], &ret, &dl);
		if (r) {
			FAIL("thread blocked in %s: not cancelled within 1 s (pthread_timedjoin_np: %s): "
			     "%s is not a cancellation point under this library",
			     kname[k], en(r), kname[k]);
			stuck = true;
			continue;
		}
		CHECK(ret == PTHREAD_CANCELED, "thread blocked in %s: joined with %p, expected "
		      "PTHREAD_CANCELED (returned %d, ret %ld)",
		      kname[k], ret, ctx[k].returned, ctx[k].ret);
		CHECK(ctx[k].cleaned, "thread blocked in %s: cleanup handler did not run", kname[k]);
		CHECK_ELAPSED(kname[k], t1, 0, 1000);
	}
	/* the sockets still work after the cancellations */
	addr_t B = mkaddr(AF_INET, port), C = mkaddr(AF_INET, port + 1);
	set_rcvtimeo(b, 3000);
	set_rcvtimeo(c, 3000);
	if (SEND(c, 99, 1, &B, "after cancellations"))
		RECV(b, 99, 1, &C, "after cancellations");
	if (stuck) {
		fflush(stdout);
		_exit(1);
	}
	close(ep);
	close(b);
	close(c);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* fork PORT (3 ports)                                                                       */

/* The child must exit with status 0 within timeout_ms; if it does not, it is killed. */
static bool wait_child(int line, pid_t pid, const char *what, int timeout_ms)
{
	int st = 0;
	double t0 = now_ms();
	pid_t r;
	while ((r = waitpid(pid, &st, WNOHANG)) == 0 && now_ms() - t0 < timeout_ms)
		sleep_ms(5);
	if (r == 0) {
		failf(line, "%s (pid %d): still running after %d s: killed (hung?)", what, (int)pid,
		      timeout_ms / 1000);
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		child_gone(pid);
		return false;
	}
	child_gone(pid);
	if (r < 0) {
		failf(line, "%s: waitpid: %s", what, en(errno));
		return false;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return true;
	if (WIFEXITED(st))
		failf(line, "%s: exited with status %d", what, WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		failf(line, "%s: killed by signal %d (%s)", what, WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		failf(line, "%s: wait status 0x%x", what, st);
	return false;
}

static long fork_len(int i)
{
	return 1 + (i * 397) % 5000;
}

static int test_fork(int port)
{
	addr_t A = mkaddr(AF_INET, port), B = mkaddr(AF_INET, port + 1), C = mkaddr(AF_INET, port + 2);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(a, 5000);
	set_rcvtimeo(b, 5000);
	if (SEND(a, 100, 1, &B, "before fork"))
		RECV(b, 100, 1, &A, "before fork");
	if (SEND(b, 100, 2, &A, "before fork"))
		RECV(a, 100, 2, &B, "before fork");
	pid_t pid = fork_child();
	if (pid == 0) {
		g_test = "fork (child)";
		for (int i = 0; i < 20; i++) {
			if (!SEND(a, fork_len(i), 1000 + i, &B, "child on the inherited socket"))
				break;
			if (!RECV(a, fork_len(i) + 1, 2000 + i, &B, "child: reply from the parent"))
				break;
		}
		int c = udp_bound(AF_INET, port + 2, 0);
		set_rcvtimeo(c, 5000);
		if (SEND(c, 333, 3000, &B, "child's own socket"))
			RECV(c, 444, 3001, &B, "child's own socket: reply");
		close(c);
		exit(g_fails ? 1 : 0); /* exit(), not _exit(): destructors run in the child */
	}
	for (int i = 0; i < 20; i++) {
		if (!RECV(b, fork_len(i), 1000 + i, &A, "parent: datagram from the child"))
			break;
		if (!SEND(b, fork_len(i) + 1, 2000 + i, &A, "parent: reply"))
			break;
	}
	if (RECV(b, 333, 3000, &C, "parent: datagram from the child's own socket"))
		SEND(b, 444, 3001, &C, "parent: reply to the child's own socket");
	wait_child(__LINE__, pid, "child", 10000);
	/* the parent's sockets after the child ran its exit handlers */
	if (SEND(a, 500, 4000, &B, "parent after the child exited"))
		RECV(b, 500, 4000, &A, "parent after the child exited");
	if (SEND(b, 600, 4001, &A, "parent after the child exited"))
		RECV(a, 600, 4001, &B, "parent after the child exited");
	/* a child that only closes its copies */
	pid = fork_child();
	if (pid == 0) {
		close(a);
		close(b);
		exit(0);
	}
	wait_child(__LINE__, pid, "second child (closes the inherited sockets)", 10000);
	if (SEND(a, 700, 4002, &B, "parent after a child closed its copies"))
		RECV(b, 700, 4002, &A, "parent after a child closed its copies");
	if (SEND(b, 800, 4003, &A, "parent after a child closed its copies"))
		RECV(a, 800, 4003, &B, "parent after a child closed its copies");
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* exec PORT (3 ports); exec-child FD CLOEXEC_FD PORT                                        */

static const long exec_sizes[] = {1, 100, 1400, 1473, 8000, 30000, 2};
#define EXEC_ROUNDS ((int)(sizeof exec_sizes / sizeof *exec_sizes))

static int test_exec(int port)
{
	addr_t P = mkaddr(AF_INET, port), S = mkaddr(AF_INET, port + 1);
	int p = udp_bound(AF_INET, port, SOCK_CLOEXEC);
	int s = udp_bound(AF_INET, port + 1, 0);
	int sc = udp_bound(AF_INET, port + 2, SOCK_CLOEXEC);
	set_rcvtimeo(p, 5000);
	set_rcvtimeo(s, 5000);
	/* some traffic both ways first, so the shim has state for both */
	if (SEND(p, 64, 1, &S, "before exec"))
		RECV(s, 64, 1, &P, "before exec");
	if (SEND(s, 64, 2, &P, "before exec"))
		RECV(p, 64, 2, &S, "before exec");
	/* queued on the inherited socket before the exec: the new program must get it intact */
	SEND(p, 300, 3, &S, "queued before exec");
	struct pollfd pf = {s, POLLIN, 0};
	/* Known limit under the shim (docs/shim.md, "Fork and exec"): to answer poll() it must
	 * read the datagram out of the kernel, and what it read is gone with the old image. So
	 * the datagram is only waited for here natively; preloaded, it must still be in the
	 * kernel when the new image starts (the shim reads nobody's socket in the background). */
	if (!getenv("LD_PRELOAD"))
		EXPECT_RET(poll(&pf, 1, 2000), 1);
	else
		usleep(20000);
	char fds[16], fdc[16], ports[16];
	snprintf(fds, sizeof fds, "%d", s);
	snprintf(fdc, sizeof fdc, "%d", sc);
	snprintf(ports, sizeof ports, "%d", port);
	pid_t pid = fork_child();
	if (pid == 0) {
		execl("/proc/self/exe", "sockapi", "exec-child", fds, fdc, ports, (char *)NULL);
		printf("sockapi: exec: execl(/proc/self/exe): %s\n", en(errno));
		fflush(stdout);
		_exit(127);
	}
	close(s); /* as a launcher would: the socket now lives on in the child only */
	close(sc);
	if (RECV(p, 5, 4, &S, "the exec'd child's first datagram (ready)")) {
		for (int i = 0; i < EXEC_ROUNDS; i++) {
			if (!SEND(p, exec_sizes[i], 10 + i, &S, "to the exec'd child"))
				break;
			if (!RECV(p, exec_sizes[i], 50 + i, &S, "answer from the exec'd child"))
				break;
		}
	}
	wait_child(__LINE__, pid, "exec'd child", 8000);
	expect_nothing(__LINE__, p, 100, "parent after the exec'd child finished");
	close(p);
	return g_fails ? 1 : 0;
}

static int exec_child(int fd, int cfd, int port)
{
	g_test = "exec (exec'd child)";
	addr_t P = mkaddr(AF_INET, port), S = mkaddr(AF_INET, port + 1), SC = mkaddr(AF_INET, port + 2);
	/* the CLOEXEC socket is gone (the number may hold something else now) */
	{
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		if (getsockname(cfd, (struct sockaddr *)&ss, &sl) == 0 && addr_same(&ss, sl, &SC))
			FAIL("fd %d, a SOCK_CLOEXEC socket bound to %s, survived execve", cfd,
			     addrstr(&SC.ss, SC.len));
	}
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0) {
		FAIL("inherited fd %d: fcntl(F_GETFD): %s", fd, en(errno));
		finish();
	}
	CHECK(!(fl & FD_CLOEXEC), "inherited fd %d has FD_CLOEXEC", fd);
	int type = -1;
	socklen_t tl = sizeof type;
	EXPECT_RET(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl), 0);
	CHECK(type == SOCK_DGRAM, "inherited fd: SO_TYPE %d, expected SOCK_DGRAM", type);
	CHECK_NAME(fd, &S, "inherited socket");
	set_rcvtimeo(fd, 5000);
	RECV(fd, 300, 3, &P, "datagram queued before the exec");
	SEND(fd, 5, 4, &P, "ready");
	for (int i = 0; i < EXEC_ROUNDS; i++) {
		if (!RECV(fd, exec_sizes[i], 10 + i, &P, "datagram sent after the exec"))
			break;
		if (!SEND(fd, exec_sizes[i], 50 + i, &P, "answer"))
			break;
	}
	expect_nothing(__LINE__, fd, 200, "inherited socket after the last datagram");
	finish();
}

/* ---------------------------------------------------------------------------------------- */
/* Two-process drivers: interop PORT N LIB none|recv|send; rd-loss PORT N                    */

enum { ENV_KEEP, ENV_NATIVE, ENV_PRELOAD };

/* A copy of environ without the names in drop, plus add (NAME=value strings). */
static char **make_env(const char *const *drop, char **add)
{
	size_t n = 0, m = 0;
	while (environ[n])
		n++;
	while (add[m])
		m++;
	char **e = calloc(n + m + 1, sizeof *e);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		bool skipit = false;
		for (const char *const *d = drop; *d; d++) {
			size_t l = strlen(*d);
			if (!strncmp(environ[i], *d, l) && environ[i][l] == '=')
				skipit = true;
		}
		if (!skipit)
			e[k++] = environ[i];
	}
	for (size_t i = 0; i < m; i++)
		e[k++] = add[i];
	e[k] = NULL;
	return e;
}

static pid_t spawn_role(const char *role, int port, long n, int envmode, const char *lib,
			const char *mode, const char *fault, int ready_fd)
{
	static const char *const drop[] = {"LD_PRELOAD", "SOCKAPI_EXPECT", "SOCKAPI_READY_FD",
					   "DGSHIM_FAULT_TX", "DGSHIM_MODE", NULL};
	char *add[8];
	int k = 0;
	char b1[4200], b2[64], b3[200], b4[300], b5[64];
	if (envmode == ENV_PRELOAD) {
		snprintf(b1, sizeof b1, "LD_PRELOAD=%s", lib);
		add[k++] = b1;
	} else if (envmode == ENV_KEEP && getenv("LD_PRELOAD")) {
		snprintf(b1, sizeof b1, "LD_PRELOAD=%s", getenv("LD_PRELOAD"));
		add[k++] = b1;
	}
	bool pre = envmode == ENV_PRELOAD || (envmode == ENV_KEEP && g_shim);
	snprintf(b2, sizeof b2, "SOCKAPI_EXPECT=%s", pre ? "preload" : "native");
	add[k++] = b2;
	if (mode) {
		snprintf(b3, sizeof b3, "DGSHIM_MODE=%s", mode);
		add[k++] = b3;
	}
	if (fault) {
		snprintf(b4, sizeof b4, "DGSHIM_FAULT_TX=%s", fault);
		add[k++] = b4;
	}
	int rfd = -1;
	if (ready_fd >= 0) {
		rfd = MUST(dup(ready_fd)); /* without FD_CLOEXEC */
		snprintf(b5, sizeof b5, "SOCKAPI_READY_FD=%d", rfd);
		add[k++] = b5;
	}
	add[k] = NULL;
	char **env = make_env(drop, add);
	char ps[16], ns[24];
	snprintf(ps, sizeof ps, "%d", port);
	snprintf(ns, sizeof ns, "%ld", n);
	char *argv[] = {"sockapi", (char *)role, ps, ns, NULL};
	pid_t pid = fork_child();
	if (pid == 0) {
		execve("/proc/self/exe", argv, env);
		printf("sockapi: execve(/proc/self/exe %s): %s\n", role, en(errno));
		fflush(stdout);
		_exit(127);
	}
	free(env);
	if (rfd >= 0)
		close(rfd);
	return pid;
}

static void signal_ready(void)
{
	const char *s = getenv("SOCKAPI_READY_FD");
	if (!s)
		return;
	int fd = atoi(s);
	if (write(fd, "R", 1) != 1)
		FAIL("writing to the ready pipe (fd %d): %s", fd, en(errno));
	close(fd);
}

/* Start the receiver role, wait until it has bound, start the sender role, wait for both. */
static int drive_pair(const char *rrole, const char *srole, int port, long n, int renv, int senv,
		      const char *lib, const char *mode, const char *rfault, const char *sfault,
		      int timeout_ms)
{
	int pp[2];
	MUST(pipe2(pp, O_CLOEXEC));
	pid_t pr = spawn_role(rrole, port, n, renv, lib, mode, rfault, pp[1]);
	close(pp[1]);
	struct pollfd pf = {pp[0], POLLIN, 0};
	char c;
	if (poll(&pf, 1, 5000) != 1 || read(pp[0], &c, 1) != 1) {
		FAIL("%s did not become ready within 5 s", rrole);
		wait_child(__LINE__, pr, rrole, 0);
		return 1;
	}
	close(pp[0]);
	pid_t ps = spawn_role(srole, port, n, senv, lib, mode, sfault, -1);
	double t0 = now_ms();
	bool okr = wait_child(__LINE__, pr, rrole, timeout_ms);
	bool oks = wait_child(__LINE__, ps, srole, timeout_ms - (int)(now_ms() - t0));
	return okr && oks && !g_fails ? 0 : 1;
}

/* interop: sizes cycle through these */
static const long io_sizes[] = {1, 1316, 1472, 8000, 65000, 0, 200};
#define IO_NSIZES ((long)(sizeof io_sizes / sizeof *io_sizes))

static void check_plain_stats(int fd, long n, const char *side)
{
	if (!g_shim)
		return;
	struct iwarp_stats st;
	if (!get_stats(fd, &st))
		return;
	CHECK(st.tx_framed == 0 && st.rx_framed == 0,
	      "%s (preloaded) talking to an unmodified peer sent or received framed datagrams: %s",
	      side, statstr(&st));
	CHECK(st.tx_plain == (uint64_t)n && st.rx_plain == (uint64_t)n,
	      "%s (preloaded): expected tx_plain == rx_plain == %ld, got %s", side, n,
	      statstr(&st));
}

static int interop_recv(int port, long n)
{
	addr_t S = mkaddr_env(port + 1, "SOCKAPI_PEER");
	int s = udp_bound_self(port);
	set_rcvtimeo(s, 5000);
	signal_ready();
	unsigned char *buf = malloc(BIGBUF);
	char what[100];
	for (long i = 0; i < n; i++) {
		struct sockaddr_storage ss;
		memset(&ss, 0, sizeof ss);
		socklen_t sl = sizeof ss;
		long r = recvfrom(s, buf, BIGBUF, 0, (struct sockaddr *)&ss, &sl);
		snprintf(what, sizeof what, "receiver: datagram %ld", i);
		if (r < 0) {
			FAIL("%s: recvfrom: %s", what, en(errno));
			break;
		}
		if (!data_ok(__LINE__, what, buf, r, io_sizes[i % IO_NSIZES], (uint32_t)i))
			break;
		CHECK_ADDR(&ss, sl, &S, "%s source", what);
		long w = sendto(s, buf, r, 0, (struct sockaddr *)&ss, sl);
		if (w != r) {
			FAIL("receiver: echo of datagram %ld (%ld bytes): %ld %s", i, r, w,
			     w < 0 ? en(errno) : "");
			break;
		}
	}
	expect_nothing(__LINE__, s, 300, "receiver after the last datagram");
	check_plain_stats(s, n, "receiver");
	free(buf);
	return g_fails ? 1 : 0;
}

static int interop_send(int port, long n)
{
	addr_t R = mkaddr_env(port, "SOCKAPI_PEER");
	int s = udp_bound_self(port + 1);
	set_rcvtimeo(s, 5000);
	char what[100];
	for (long i = 0; i < n; i++) {
		snprintf(what, sizeof what, "sender: datagram %ld", i);
		if (!SEND(s, io_sizes[i % IO_NSIZES], (uint32_t)i, &R, what))
			break;
		snprintf(what, sizeof what, "sender: echo of datagram %ld", i);
		if (!RECV(s, io_sizes[i % IO_NSIZES], (uint32_t)i, &R, what))
			break;
	}
	expect_nothing(__LINE__, s, 300, "sender after the last echo");
	check_plain_stats(s, n, "sender");
	return g_fails ? 1 : 0;
}

static int drive_interop(int port, long n, const char *lib, const char *side)
{
	int renv = ENV_NATIVE, senv = ENV_NATIVE;
	if (!strcmp(side, "recv"))
		renv = ENV_PRELOAD;
	else if (!strcmp(side, "send"))
		senv = ENV_PRELOAD;
	else if (strcmp(side, "none")) {
		FAIL("interop: SIDE must be none, recv or send, not '%s'", side);
		return 1;
	}
	if (strcmp(side, "none") && access(lib, R_OK) != 0) {
		FAIL("interop: shim library '%s': %s", lib, en(errno));
		return 1;
	}
	return drive_pair("interop-recv", "interop-send", port, n, renv, senv, lib, NULL, NULL, NULL,
			  15000);
}

/* rd-loss: every datagram once, in order, over RD with loss injected at the sender */
static long rd_len(long i)
{
	return i % 250 == 249 ? 6000 : 8 + (i * 7919) % 1200;
}

/* Between hosts the first datagram goes plain while discovery asks the other host
 * (docs/shim.md): SOCKAPI_RD_PLAIN_OK=N allows N plain datagrams (default 0, one host). */
static unsigned long rd_plain_ok(void)
{
	const char *e = getenv("SOCKAPI_RD_PLAIN_OK");
	return e ? strtoul(e, NULL, 10) : 0;
}

static void check_mode_rd(int fd, const char *side)
{
	int m = geti(fd, IWARP_MODE, NULL);
	if (m == -1)
		FAIL("%s: getsockopt(IWARP_MODE): %s", side, en(errno));
	else
		CHECK(m == IWARP_MODE_RD, "%s: with DGSHIM_MODE=rd, IWARP_MODE is %d, expected %d (RD)",
		      side, m, IWARP_MODE_RD);
}

static int rd_recv(int port, long n)
{
	need_shim();
	addr_t S = mkaddr_env(port + 1, "SOCKAPI_PEER");
	int s = udp_bound_self(port);
	set_rcvtimeo(s, 10000);
	signal_ready();
	unsigned char *buf = malloc(BIGBUF);
	long i;
	double t0 = 0;
	for (i = 0; i < n; i++) {
		struct sockaddr_storage ss;
		memset(&ss, 0, sizeof ss);
		socklen_t sl = sizeof ss;
		long r = recvfrom(s, buf, BIGBUF, 0, (struct sockaddr *)&ss, &sl);
		if (i == 0)
			t0 = now_ms();
		if (r < 0) {
			FAIL("receiver: waiting for datagram %ld of %ld: recvfrom: %s", i, n, en(errno));
			break;
		}
		uint32_t seq = UINT32_MAX;
		if (r >= 4)
			memcpy(&seq, buf, 4);
		if (seq != (uint32_t)i) {
			FAIL("receiver: datagram #%ld (%ld bytes) carries seq %" PRIu32 ", expected %ld "
			     "(lost, duplicated or out of order)",
			     i, r, seq, i);
			break;
		}
		unsigned char *exp = malloc(rd_len(i));
		fill(exp, rd_len(i), (uint32_t)i);
		memcpy(exp, &seq, 4);
		if (r != rd_len(i) || memcmp(buf, exp, r)) {
			FAIL("receiver: seq %ld: expected %ld bytes, got %ld (%s)", i, rd_len(i), r,
			     r == rd_len(i) ? "contents differ" : "length differs");
			free(exp);
			break;
		}
		free(exp);
		CHECK_ADDR(&ss, sl, &S, "receiver: seq %ld source", i);
	}
	printf("sockapi: rd-loss: received %ld of %ld datagrams in %.0f ms\n", i, n,
	       t0 ? now_ms() - t0 : 0.0);
	check_mode_rd(s, "receiver");
	/* tell the sender, so that it does not wait for nothing */
	EXPECT_RET(sendto(s, i == n ? "DONE" : "FAIL", 4, 0, SA(&S), S.len), 4);
	if (i == n)
		expect_nothing(__LINE__, s, 300, "receiver after the last datagram (duplicates?)");
	struct iwarp_stats st;
	if (get_stats(s, &st))
		CHECK(st.rx_framed + st.rx_plain == (uint64_t)n && st.rx_plain <= rd_plain_ok(),
		      "receiver: rx_framed expected %ld (less at most %lu plain): %s", n,
		      rd_plain_ok(), statstr(&st));
	free(buf);
	return g_fails ? 1 : 0;
}

static int rd_send(int port, long n)
{
	need_shim();
	addr_t R = mkaddr_env(port, "SOCKAPI_PEER");
	int s = udp_bound_self(port + 1);
	unsigned char *buf = malloc(BIGBUF);
	double t0 = now_ms();
	for (long i = 0; i < n; i++) {
		long len = rd_len(i);
		uint32_t seq = (uint32_t)i;
		fill(buf, len, seq);
		memcpy(buf, &seq, 4);
		long r = sendto(s, buf, len, 0, SA(&R), R.len);
		if (r != len) {
			FAIL("sender: seq %ld, %ld bytes: sendto returned %ld %s", i, len, r,
			     r < 0 ? en(errno) : "");
			break;
		}
	}
	check_mode_rd(s, "sender");
	set_rcvtimeo(s, 15000);
	long r = recv(s, buf, BIGBUF, 0);
	if (r < 0)
		FAIL("sender: waiting for the receiver's DONE: %s", en(errno));
	else
		CHECK(r == 4 && !memcmp(buf, "DONE", 4), "sender: expected DONE, got %ld bytes %s", r,
		      hex(buf, r));
	printf("sockapi: rd-loss: sender done in %.0f ms\n", now_ms() - t0);
	struct iwarp_stats st;
	if (get_stats(s, &st)) {
		CHECK(st.tx_framed + st.tx_plain == (uint64_t)n && st.tx_plain <= rd_plain_ok(),
		      "sender: tx_framed expected %ld (less at most %lu plain): %s", n,
		      rd_plain_ok(), statstr(&st));
		CHECK(st.retransmits > 0, "sender with DGSHIM_FAULT_TX loss: retransmits is 0: %s",
		      statstr(&st));
		printf("sockapi: rd-loss: sender stats: %s\n", statstr(&st));
	}
	free(buf);
	return g_fails ? 1 : 0;
}

static int drive_rd_loss(int port, long n)
{
	need_shim();
	const char *fault = getenv("DGSHIM_FAULT_TX");
	if (!fault || !*fault)
		fault = "loss=5";
	return drive_pair("rd-loss-recv", "rd-loss-send", port, n, ENV_KEEP, ENV_KEEP, NULL, "rd",
			  NULL, fault, 22000);
}

/* ---------------------------------------------------------------------------------------- */
/* mode PORT (2 ports)                                                                       */

static int test_mode(int port)
{
	need_shim();
	addr_t A = mkaddr(AF_INET, port), B = mkaddr(AF_INET, port + 1);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(b, 5000);
	check_taken(__LINE__, a, 1, "bound UDP socket");
	socklen_t l = 0;
	int m0 = geti(a, IWARP_MODE, &l);
	if (m0 == -1)
		FAIL("getsockopt(IWARP_MODE): %s", en(errno));
	CHECK(m0 >= 0 && m0 <= 4, "getsockopt(IWARP_MODE) on a new socket: %d, not a mode", m0);
	CHECK(l == sizeof(int), "getsockopt(IWARP_MODE): optlen %u", (unsigned)l);

	static const int bad[] = {5, -1, 100, INT_MAX, INT_MIN, IWARP_MODE_RC};
	for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
		int v = bad[i];
		errno = 0;
		int r = setsockopt(a, SOL_IWARP, IWARP_MODE, &v, sizeof v);
		CHECK(r == -1 && errno == EINVAL, "setsockopt(IWARP_MODE, %d)%s: expected -1 EINVAL, "
		      "got %d %s", v, v == IWARP_MODE_RC ? " (RC on a UDP socket)" : "", r,
		      r ? en(errno) : "");
	}
	{
		int v = IWARP_MODE_UD;
		EXPECT_ERR(setsockopt(a, SOL_IWARP, IWARP_MODE, &v, 3), EINVAL);
		EXPECT_ERR(setsockopt(a, SOL_IWARP, IWARP_MODE, &v, 0), EINVAL);
	}
	int m1 = geti(a, IWARP_MODE, NULL);
	CHECK(m1 == m0, "IWARP_MODE changed by refused setsockopt calls: %d, was %d", m1, m0);
	static const int good[] = {IWARP_MODE_OFF, IWARP_MODE_UD, IWARP_MODE_RD, IWARP_MODE_AUTO,
				   IWARP_MODE_OFF, IWARP_MODE_AUTO};
	for (unsigned i = 0; i < sizeof good / sizeof *good; i++) {
		if (!EXPECT_RET(seti(a, IWARP_MODE, good[i]), 0))
			continue;
		int v = geti(a, IWARP_MODE, NULL);
		CHECK(v == good[i], "IWARP_MODE set to %d, read back %d %s", good[i], v,
		      v == -1 ? en(errno) : "");
	}
	/* zero-copy threshold */
	int z = geti(a, IWARP_ZCOPY_THRESHOLD, NULL);
	CHECK(z >= 0, "getsockopt(IWARP_ZCOPY_THRESHOLD): %d %s", z, z == -1 ? en(errno) : "");
	EXPECT_RET(seti(a, IWARP_ZCOPY_THRESHOLD, 0), 0);
	CHECK((z = geti(a, IWARP_ZCOPY_THRESHOLD, NULL)) == 0, "IWARP_ZCOPY_THRESHOLD 0 read back %d",
	      z);
	EXPECT_RET(seti(a, IWARP_ZCOPY_THRESHOLD, 4096), 0);
	CHECK((z = geti(a, IWARP_ZCOPY_THRESHOLD, NULL)) == 4096,
	      "IWARP_ZCOPY_THRESHOLD 4096 read back %d", z);
	EXPECT_ERR(seti(a, IWARP_ZCOPY_THRESHOLD, -1), EINVAL);
	CHECK((z = geti(a, IWARP_ZCOPY_THRESHOLD, NULL)) == 4096,
	      "IWARP_ZCOPY_THRESHOLD after a refused -1: %d", z);
	/* read-only options, unknown options */
	{
		struct iwarp_stats st;
		int v = 1;
		CHECK(setsockopt(a, SOL_IWARP, IWARP_STATS, &st, sizeof st) == -1,
		      "setsockopt(IWARP_STATS) succeeded: it is getsockopt-only");
		CHECK(setsockopt(a, SOL_IWARP, IWARP_TAKEN, &v, sizeof v) == -1,
		      "setsockopt(IWARP_TAKEN) succeeded: it is getsockopt-only");
		errno = 0;
		int r = geti(a, 99, NULL);
		CHECK(r == -1 && (errno == ENOPROTOOPT || errno == EOPNOTSUPP || errno == EINVAL),
		      "getsockopt(SOL_IWARP, 99): expected -1 ENOPROTOOPT, EOPNOTSUPP or EINVAL, "
		      "got %d %s", r,
		      r == -1 ? en(errno) : "");
	}
	/* not a socket, not a descriptor, not an IP socket */
	{
		int pp[2];
		MUST(pipe(pp));
		int v;
		socklen_t vl = sizeof v;
		EXPECT_ERR(getsockopt(pp[0], SOL_IWARP, IWARP_TAKEN, &v, &vl), ENOTSOCK);
		EXPECT_ERR(seti(pp[0], IWARP_MODE, IWARP_MODE_UD), ENOTSOCK);
		close(pp[0]);
		close(pp[1]);
		EXPECT_ERR(getsockopt(pp[0], SOL_IWARP, IWARP_TAKEN, &v, &vl), EBADF);
		EXPECT_ERR(seti(pp[0], IWARP_MODE, IWARP_MODE_UD), EBADF);
		int u = MUST(socket(AF_UNIX, SOCK_DGRAM, 0));
		check_not_ip(__LINE__, u, "AF_UNIX socket");
		(void)seti(u, IWARP_MODE, IWARP_MODE_UD); /* whatever it says, it must not crash */
		(void)geti(u, IWARP_STATS, NULL);
		close(u);
	}
	/* the mode toggled between datagrams while streaming to a preloaded socket (left in AUTO,
	 * i.e. UD): OFF sends plain UDP, UD sends framed datagrams; RD is framed only toward a peer
	 * with an RD queue pair (docs: the service is matched per destination), so toward this one
	 * it may go either way, but every datagram must be counted once. Every datagram intact. */
	static const int phases[] = {IWARP_MODE_OFF, IWARP_MODE_UD, IWARP_MODE_RD, IWARP_MODE_OFF};
	static const char *const pname[] = {"OFF", "UD", "RD", "OFF"};
	int k = 0;
	char what[100];
	uint64_t plain = 0, framed = 0;
	for (int ph = 0; ph < 4; ph++) {
		if (!EXPECT_RET(seti(a, IWARP_MODE, phases[ph]), 0))
			continue;
		int v = geti(a, IWARP_MODE, NULL);
		CHECK(v == phases[ph], "IWARP_MODE set to %d, read back %d", phases[ph], v);
		struct iwarp_stats sa0, sb0, sa1, sb1;
		bool st0 = get_stats(a, &sa0) && get_stats(b, &sb0);
		for (int i = 0; i < 10; i++, k++) {
			long len = 1 + (k * 997) % 3000;
			snprintf(what, sizeof what, "mode %s, datagram %d", pname[ph], k);
			if (SEND(a, len, 700 + k, &B, what))
				RECV(b, len, 700 + k, &A, what);
		}
		if (!st0 || !get_stats(a, &sa1) || !get_stats(b, &sb1))
			continue;
		bool off = phases[ph] == IWARP_MODE_OFF;
		uint64_t txp = sa1.tx_plain - sa0.tx_plain, txf = sa1.tx_framed - sa0.tx_framed;
		uint64_t rxp = sb1.rx_plain - sb0.rx_plain, rxf = sb1.rx_framed - sb0.rx_framed;
		plain += txp;
		framed += txf;
		if (phases[ph] == IWARP_MODE_RD) {
			CHECK(txp + txf == 10 && rxp + rxf == 10 && txf == rxf,
			      "10 datagrams in mode RD toward a UD peer: sender tx_plain +%" PRIu64
			      " tx_framed +%" PRIu64 ", receiver rx_plain +%" PRIu64 " rx_framed +%"
			      PRIu64 "; expected each datagram counted once, the same way on both sides",
			      txp, txf, rxp, rxf);
			continue;
		}
		CHECK(txp == (off ? 10u : 0u) && txf == (off ? 0u : 10u),
		      "10 datagrams in mode %s to a preloaded socket: expected the sender's %s to grow "
		      "by 10; tx_plain +%" PRIu64 ", tx_framed +%" PRIu64,
		      pname[ph], off ? "tx_plain" : "tx_framed", txp, txf);
		CHECK(rxp == (off ? 10u : 0u) && rxf == (off ? 0u : 10u),
		      "10 datagrams in mode %s: expected the receiver's %s to grow by 10; rx_plain +%"
		      PRIu64 ", rx_framed +%" PRIu64,
		      pname[ph], off ? "rx_plain" : "rx_framed", rxp, rxf);
	}
	CHECK(plain > 0 && framed > 0, "toggling IWARP_MODE: the sender's stats show %" PRIu64
	      " plain and %" PRIu64 " framed datagrams; expected both", plain, framed);
	expect_nothing(__LINE__, b, 100, "receiver after the mode toggles");
	/* The receiver stops speaking: a sending framed a moment ago (its route to b fresh, and
	 * remembered for the next sends), b turns OFF and sends a a plain datagram. What a sends
	 * b at once after reading it must be plain: b takes it as a UDP program would. */
	if (EXPECT_RET(seti(a, IWARP_MODE, IWARP_MODE_AUTO), 0)) {
		set_rcvtimeo(a, 5000);
		for (int i = 0; i < 5; i++, k++) {
			snprintf(what, sizeof what, "to b while it speaks, datagram %d", i);
			if (SEND(a, 100, 700 + k, &B, what))
				RECV(b, 100, 700 + k, &A, what);
		}
		struct iwarp_stats sa0, sa1;
		if (EXPECT_RET(seti(b, IWARP_MODE, IWARP_MODE_OFF), 0) && get_stats(a, &sa0)) {
			if (SEND(b, 64, 900, &A, "plain from b once OFF"))
				RECV(a, 64, 900, &B, "plain from b once OFF");
			if (SEND(a, 200, 901, &B, "to b right after its plain datagram"))
				RECV(b, 200, 901, &A, "to b right after its plain datagram (sent framed to an OFF "
				     "socket, it would arrive with the framing)");
			if (get_stats(a, &sa1))
				CHECK(sa1.tx_plain - sa0.tx_plain == 1 && sa1.tx_framed == sa0.tx_framed,
				      "a's datagram to b right after b's plain one: tx_plain +%" PRIu64
				      " tx_framed +%" PRIu64 "; expected it plain (b stopped speaking)",
				      sa1.tx_plain - sa0.tx_plain, sa1.tx_framed - sa0.tx_framed);
		}
	}
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* unix (no ports)                                                                           */

static int test_unix(void)
{
	unsigned char buf[8192], p[5000];
	struct pollfd pf;
	int u[2];

	/* AF_UNIX datagram socketpair */
	MUST(socketpair(AF_UNIX, SOCK_DGRAM, 0, u));
	check_not_ip(__LINE__, u[0], "AF_UNIX datagram socket");
	pf = (struct pollfd){u[1], POLLIN, 0};
	EXPECT_RET(poll(&pf, 1, 0), 0);
	fill(p, 100, 1);
	EXPECT_RET(write(u[0], p, 100), 100);
	fill(p + 100, 200, 2);
	EXPECT_RET(send(u[0], p + 100, 200, 0), 200);
	EXPECT_RET(poll(&pf, 1, 1000), 1);
	CHECK(pf.revents == POLLIN, "unix dgram poll: revents 0x%x", pf.revents);
	if (EXPECT_RET(read(u[1], buf, sizeof buf), 100))
		CHECK(!memcmp(buf, p, 100), "unix dgram: bytes differ");
	if (EXPECT_RET(recv(u[1], buf, 50, 0), 50))
		CHECK(!memcmp(buf, p + 100, 50), "unix dgram short recv: bytes differ");
	EXPECT_ERR(recv(u[1], buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
	EXPECT_RET(write(u[1], "back", 4), 4);
	EXPECT_RET(read(u[0], buf, sizeof buf), 4);
	close(u[1]);
	EXPECT_ERR(write(u[0], "x", 1), ECONNREFUSED);
	close(u[0]);

	/* AF_UNIX stream socketpair */
	MUST(socketpair(AF_UNIX, SOCK_STREAM, 0, u));
	check_not_ip(__LINE__, u[0], "AF_UNIX stream socket");
	fill(p, 5000, 3);
	EXPECT_RET(write(u[0], p, 1000), 1000);
	EXPECT_RET(send(u[0], p + 1000, 4000, 0), 4000);
	long got = 0;
	while (got < 5000) {
		long r = read(u[1], buf + got, sizeof buf - got);
		if (r <= 0) {
			FAIL("unix stream read after %ld of 5000 bytes: %ld %s", got, r,
			     r < 0 ? en(errno) : "");
			break;
		}
		got += r;
	}
	CHECK(got != 5000 || !memcmp(buf, p, 5000), "unix stream: bytes differ");
	pf = (struct pollfd){u[1], POLLIN | POLLOUT, 0};
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents == POLLOUT, "unix stream idle: revents 0x%x", pf.revents);
	EXPECT_RET(shutdown(u[0], SHUT_WR), 0);
	EXPECT_RET(read(u[1], buf, sizeof buf), 0);
	close(u[0]);
	pf = (struct pollfd){u[1], POLLIN, 0};
	EXPECT_RET(poll(&pf, 1, 1000), 1);
	CHECK(pf.revents & POLLHUP, "unix stream, peer closed: revents 0x%x (no POLLHUP)",
	      pf.revents);
	close(u[1]);

	/* pipe */
	int pp[2];
	MUST(pipe(pp));
	pf = (struct pollfd){pp[0], POLLIN, 0};
	EXPECT_RET(poll(&pf, 1, 0), 0);
	EXPECT_RET(write(pp[1], "pipe data", 9), 9);
	EXPECT_RET(poll(&pf, 1, 1000), 1);
	{
		fd_set r;
		FD_ZERO(&r);
		FD_SET(pp[0], &r);
		struct timeval tv = {0, 0};
		EXPECT_RET(select(pp[0] + 1, &r, NULL, NULL, &tv), 1);
		int ep = MUST(epoll_create1(0));
		struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 5}, evs[2];
		EXPECT_RET(epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &ev), 0);
		if (EXPECT_RET(epoll_wait(ep, evs, 2, 0), 1))
			CHECK(evs[0].data.u64 == 5, "epoll on a pipe: data %" PRIu64, evs[0].data.u64);
		close(ep);
	}
	if (EXPECT_RET(read(pp[0], buf, sizeof buf), 9))
		CHECK(!memcmp(buf, "pipe data", 9), "pipe: bytes differ");
	close(pp[1]);
	EXPECT_RET(read(pp[0], buf, sizeof buf), 0);
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents & POLLHUP, "pipe, writer closed: revents 0x%x", pf.revents);
	close(pp[0]);
	MUST(pipe(pp));
	close(pp[0]);
	signal(SIGPIPE, SIG_IGN);
	EXPECT_ERR(write(pp[1], "x", 1), EPIPE);
	close(pp[1]);

	/* a regular file */
	char path[] = "/tmp/sockapi.XXXXXX";
	int f = MUST(mkstemp(path));
	unlink(path);
	fill(p, 5000, 4);
	EXPECT_RET(write(f, p, 5000), 5000);
	EXPECT_RET(lseek(f, 0, SEEK_SET), 0);
	if (EXPECT_RET(read(f, buf, sizeof buf), 5000))
		CHECK(!memcmp(buf, p, 5000), "file: bytes differ");
	EXPECT_RET(read(f, buf, sizeof buf), 0);
	struct iovec iov[2] = {{buf, 10}, {buf + 10, 20}};
	EXPECT_RET(pread(f, buf, 10, 100), 10);
	EXPECT_RET(lseek(f, 0, SEEK_SET), 0);
	EXPECT_RET(readv(f, iov, 2), 30);
	CHECK(!memcmp(buf, p, 30), "file readv: bytes differ");
	pf = (struct pollfd){f, POLLIN | POLLOUT, 0};
	EXPECT_RET(poll(&pf, 1, 0), 1);
	CHECK(pf.revents == (POLLIN | POLLOUT), "poll on a file: revents 0x%x", pf.revents);
	struct stat sb;
	if (EXPECT_RET(fstat(f, &sb), 0))
		CHECK(sb.st_size == 5000, "file size %ld", (long)sb.st_size);
	EXPECT_RET(close(f), 0);
	EXPECT_ERR(close(f), EBADF);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* badrules PORT (2 ports): run with a malformed rules file; the runner checks stderr         */

static int test_badrules(int port)
{
	need_shim();
	addr_t A = mkaddr(AF_INET, port), B = mkaddr(AF_INET, port + 1);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(a, 5000);
	set_rcvtimeo(b, 5000);
	check_taken(__LINE__, a, 0, "rules refused: socket a");
	check_taken(__LINE__, b, 0, "rules refused: socket b");
	static const long sz[] = {1, 1000, 1472, 8000, 0};
	for (int i = 0; i < 5; i++) {
		if (SEND(a, sz[i], 10 + i, &B, "rules refused: a->b"))
			RECV(b, sz[i], 10 + i, &A, "rules refused: a->b");
		if (SEND(b, sz[i], 20 + i, &A, "rules refused: b->a"))
			RECV(a, sz[i], 20 + i, &B, "rules refused: b->a");
	}
	check_taken(__LINE__, a, 0, "rules refused: socket a after traffic");
	struct iwarp_stats st;
	socklen_t l = sizeof st;
	memset(&st, 0, sizeof st);
	if (getsockopt(a, SOL_IWARP, IWARP_STATS, &st, &l) == 0)
		CHECK(st.tx_framed == 0 && st.rx_framed == 0,
		      "rules refused, yet framed datagrams counted: %s", statstr(&st));
	close(a);
	close(b);
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* dup PORT (3 ports)                                                                        */

static int send_fd(int via, int fd)
{
	char c = 'F';
	struct iovec iov = {&c, 1};
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.b;
	m.msg_controllen = sizeof u.b;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof fd);
	return sendmsg(via, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int via)
{
	char c;
	struct iovec iov = {&c, 1};
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.b;
	m.msg_controllen = sizeof u.b;
	if (recvmsg(via, &m, 0) != 1)
		return -1;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	if (!cm || cm->cmsg_type != SCM_RIGHTS) {
		errno = EPROTO;
		return -1;
	}
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof fd);
	return fd;
}

static int test_dup(int port)
{
	addr_t A = mkaddr(AF_INET, port), B = mkaddr(AF_INET, port + 1), C = mkaddr(AF_INET, port + 2);
	int a = udp_bound(AF_INET, port, 0), b = udp_bound(AF_INET, port + 1, 0);
	set_rcvtimeo(a, 5000);
	set_rcvtimeo(b, 5000);
	if (SEND(a, 10, 1, &B, "original"))
		RECV(b, 10, 1, &A, "original");

	int d1 = MUST(dup(a));
	if (SEND(d1, 11, 2, &B, "dup"))
		RECV(b, 11, 2, &A, "dup");
	int d2 = MUST(dup2(a, 100));
	CHECK(d2 == 100, "dup2(a, 100) returned %d", d2);
	CHECK(fcntl(d2, F_GETFD) == 0, "dup2: FD_CLOEXEC set");
	if (SEND(d2, 12, 3, &B, "dup2"))
		RECV(b, 12, 3, &A, "dup2");
	int d3 = MUST(dup3(a, 101, O_CLOEXEC));
	CHECK(d3 == 101, "dup3(a, 101) returned %d", d3);
	CHECK(fcntl(d3, F_GETFD) == FD_CLOEXEC, "dup3(O_CLOEXEC): FD_CLOEXEC not set");
	if (SEND(d3, 13, 4, &B, "dup3"))
		RECV(b, 13, 4, &A, "dup3");
	int d4 = MUST(fcntl(a, F_DUPFD_CLOEXEC, 200));
	CHECK(d4 >= 200, "fcntl(F_DUPFD_CLOEXEC, 200) returned %d", d4);
	CHECK(fcntl(d4, F_GETFD) == FD_CLOEXEC, "F_DUPFD_CLOEXEC: FD_CLOEXEC not set");
	if (SEND(d4, 14, 5, &B, "F_DUPFD_CLOEXEC"))
		RECV(b, 14, 5, &A, "F_DUPFD_CLOEXEC");
	CHECK_NAME(d4, &A, "F_DUPFD_CLOEXEC duplicate");
	if (g_shim) {
		check_taken(__LINE__, d1, 1, "dup of a taken socket");
		check_taken(__LINE__, d4, 1, "F_DUPFD_CLOEXEC of a taken socket");
		struct iwarp_stats s1, s2;
		if (get_stats(a, &s1) && get_stats(d3, &s2))
			CHECK(!memcmp(&s1, &s2, sizeof s1), "IWARP_STATS differ between descriptors "
			      "of one socket: %s vs %s", statstr(&s1), statstr(&s2));
	}
	/* receiving on a duplicate */
	int bd = MUST(dup(b));
	if (SEND(a, 15, 6, &B, "to a dup'd receiver"))
		RECV(bd, 15, 6, &A, "receive on a dup");
	/* the original closed: the duplicates go on */
	EXPECT_RET(close(a), 0);
	if (SEND(d1, 16, 7, &B, "dup after closing the original"))
		RECV(b, 16, 7, &A, "dup after closing the original");
	if (SEND(b, 17, 8, &A, "to a socket whose original fd is closed"))
		RECV(d1, 17, 8, &B, "dup receives after closing the original");
	int t = MUST(socket(AF_INET, SOCK_DGRAM, 0));
	EXPECT_ERR(bind(t, SA(&A), A.len), EADDRINUSE);
	close(t);
	/* dup2 over another taken socket closes that one */
	int c = udp_bound(AF_INET, port + 2, 0);
	int cnum = c;
	EXPECT_RET(dup2(d1, c), cnum);
	if (SEND(cnum, 18, 9, &B, "dup2 over another socket"))
		RECV(b, 18, 9, &A, "dup2 over another socket: sends as the duplicated socket");
	t = MUST(socket(AF_INET, SOCK_DGRAM, 0));
	EXPECT_RET(bind(t, SA(&C), C.len), 0); /* the replaced socket is closed */
	close(t);
	/* passed over AF_UNIX (SCM_RIGHTS) */
	{
		int u[2];
		MUST(socketpair(AF_UNIX, SOCK_DGRAM, 0, u));
		EXPECT_RET(send_fd(u[0], d1), 0);
		int e = recv_fd(u[1]);
		if (e < 0) {
			FAIL("receiving a socket with SCM_RIGHTS: %s", en(errno));
		} else {
			CHECK_NAME(e, &A, "socket received with SCM_RIGHTS");
			check_taken(__LINE__, e, 1, "socket received with SCM_RIGHTS");
			if (SEND(e, 19, 10, &B, "socket received with SCM_RIGHTS"))
				RECV(b, 19, 10, &A, "socket received with SCM_RIGHTS");
			if (SEND(b, 20, 11, &A, "to a socket received with SCM_RIGHTS"))
				RECV(e, 20, 11, &B, "socket received with SCM_RIGHTS receives");
			close(e);
		}
		close(u[0]);
		close(u[1]);
	}
	/* all closed: the port is free */
	close(d1);
	close(d2);
	close(d3);
	close(d4);
	close(cnum); /* the last descriptor of a */
	EXPECT_ERR(send(100, "x", 1, 0), EBADF);
	EXPECT_ERR(sendto(101, "x", 1, 0, SA(&B), B.len), EBADF);
	t = udp_bound(AF_INET, port, 0); /* fails the subtest if the port is still held */
	/* the receiver's original closed: its duplicate receives */
	close(b);
	if (SEND(t, 21, 12, &B, "to a dup whose original is closed"))
		RECV(bd, 21, 12, &A, "dup receives after closing the original");
	close(t);
	close(bd);
	/* close_range and closefrom close taken sockets too: a number they freed, given next to a
	 * pipe or an AF_UNIX socket (never taken), must behave as a plain descriptor. The numbers
	 * are placed with F_DUPFD (which cannot clear a stale entry itself). */
	{
		int x = udp_bound(AF_INET, port, 0), y = udp_bound(AF_INET, port + 1, 0);
		int X = MUST(fcntl(x, F_DUPFD, 500)), Y = MUST(fcntl(y, F_DUPFD, 500));
		close(x);
		close(y);
		CHECK(Y == X + 1, "F_DUPFD gave %d and %d, not neighbours", X, Y);
		check_taken(__LINE__, X, 1, "socket before close_range");
		EXPECT_RET(close_range((unsigned)X, (unsigned)Y, 0), 0);
		int pp[2];
		MUST(pipe(pp));
		int P = MUST(fcntl(pp[0], F_DUPFD, X));
		CHECK(P == X, "F_DUPFD(pipe, %d) returned %d", X, P);
		EXPECT_RET(write(pp[1], "pipe", 4), 4);
		char got[8] = {0};
		EXPECT_RET(read(P, got, sizeof got), 4);
		CHECK(!memcmp(got, "pipe", 4), "read from a pipe on a closed socket's number: '%.4s'", got);
		if (g_shim) {
			errno = 0;
			int v = geti(P, IWARP_TAKEN, NULL);
			CHECK(v == -1 && errno == ENOTSOCK, "IWARP_TAKEN on a pipe on a number close_range "
			      "freed: expected -1 ENOTSOCK, got %d %s", v, en(errno));
		}
		close(P);
		close(pp[0]);
		close(pp[1]);
		/* closefrom closes the shim's own descriptors too (hidden at high numbers), so as real
		 * programs do it: in a child on its way to exec, which goes on with what it keeps */
		int z = udp_bound(AF_INET, port, 0); /* the port was released by close_range */
		int Z = MUST(fcntl(z, F_DUPFD, 600));
		pid_t pid = fork_child();
		if (pid == 0) {
			closefrom(Z);
			int u[2];
			MUST(socketpair(AF_UNIX, SOCK_DGRAM, 0, u));
			int U = MUST(fcntl(u[0], F_DUPFD, Z));
			CHECK(U == Z, "F_DUPFD(unix socket, %d) returned %d", Z, U);
			EXPECT_RET(send(U, "unix", 4, 0), 4);
			memset(got, 0, sizeof got);
			EXPECT_RET(recv(u[1], got, sizeof got, MSG_DONTWAIT), 4);
			CHECK(!memcmp(got, "unix", 4), "AF_UNIX datagram on a closed socket's number: '%.4s'", got);
			check_not_ip(__LINE__, U, "AF_UNIX socket on a number closefrom freed");
			fflush(stdout);
			_exit(g_fails ? 1 : 0);
		}
		wait_child(__LINE__, pid, "closefrom child", 10000);
		close(Z);
		close(z);
	}
	return g_fails ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */

static void usage(void)
{
	printf("usage: sockapi SUBTEST [ARGS]   (exit 0 pass, 1 fail, 77 skip)\n"
	       "  basic4 PORT | basic6 PORT   (3 ports)  datagram calls, addresses, boundaries\n"
	       "  trunc PORT                  (2 ports)  short buffers, MSG_TRUNC, MSG_PEEK, empty\n"
	       "  nonblock PORT               (3 ports)  EAGAIN four ways, FIONREAD, SO_RCVTIMEO\n"
	       "  poll PORT                   (3 ports)  poll/ppoll/select/pselect/epoll\n"
	       "  threads PORT                (2 ports)  4 senders x 4 receivers on one pair\n"
	       "  cancel PORT                 (2 ports)  blocked calls are cancellation points\n"
	       "  fork PORT                   (3 ports)  inherited sockets across fork\n"
	       "  exec PORT                   (3 ports)  inherited socket across execve\n"
	       "  interop PORT N LIB none|recv|send  (2 ports)  one side preloaded, plain UDP\n"
	       "  rd-loss PORT N              (2 ports)  shim only: RD under loss, in order\n"
	       "  mode PORT                   (2 ports)  shim only: IWARP_MODE and friends\n"
	       "  unix                                   AF_UNIX, pipe, file untouched\n"
	       "  badrules PORT               (2 ports)  shim only, with a malformed rules file\n"
	       "  dup PORT                    (3 ports)  dup/dup2/dup3/F_DUPFD_CLOEXEC/SCM_RIGHTS,\n"
	       "                                         close_range, closefrom\n"
	       "internal: exec-child FD CFD PORT, interop-recv|interop-send|rd-loss-recv|"
	       "rd-loss-send PORT N\n");
}

static int argnum(const char *s, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi) {
		printf("sockapi: bad number '%s' (%ld..%ld)\n", s, lo, hi);
		exit(2);
	}
	return (int)v;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) {
		usage();
		return 2;
	}
	const char *t = argv[1];
	g_test = t;
	signal(SIGALRM, on_alarm);
	alarm(WATCHDOG_S);
	signal(SIGPIPE, SIG_IGN);
	detect_shim();
	if (g_fails)
		finish();
	int port = argc > 2 ? argnum(argv[2], 1, 65500) : 0;
	long n = argc > 3 ? argnum(argv[3], 1, 1000000) : 0;
	bool noport = !strcmp(t, "unix");
	if (!noport && argc < 3) {
		usage();
		return 2;
	}
	int rc;
	if (!strcmp(t, "basic4"))
		rc = test_basic(AF_INET, port);
	else if (!strcmp(t, "basic6"))
		rc = test_basic(AF_INET6, port);
	else if (!strcmp(t, "trunc"))
		rc = test_trunc(port);
	else if (!strcmp(t, "nonblock"))
		rc = test_nonblock(port);
	else if (!strcmp(t, "poll"))
		rc = test_poll(port);
	else if (!strcmp(t, "threads"))
		rc = test_threads(port);
	else if (!strcmp(t, "cancel"))
		rc = test_cancel(port);
	else if (!strcmp(t, "fork"))
		rc = test_fork(port);
	else if (!strcmp(t, "exec"))
		rc = test_exec(port);
	else if (!strcmp(t, "exec-child") && argc == 5)
		rc = exec_child(argnum(argv[2], 0, INT_MAX), argnum(argv[3], 0, INT_MAX),
				argnum(argv[4], 1, 65500));
	else if (!strcmp(t, "interop") && argc == 6)
		rc = drive_interop(port, n, argv[4], argv[5]);
	else if (!strcmp(t, "interop-recv") && argc == 4)
		rc = interop_recv(port, n);
	else if (!strcmp(t, "interop-send") && argc == 4)
		rc = interop_send(port, n);
	else if (!strcmp(t, "rd-loss") && argc == 4)
		rc = drive_rd_loss(port, n);
	else if (!strcmp(t, "rd-loss-recv") && argc == 4)
		rc = rd_recv(port, n);
	else if (!strcmp(t, "rd-loss-send") && argc == 4)
		rc = rd_send(port, n);
	else if (!strcmp(t, "mode"))
		rc = test_mode(port);
	else if (!strcmp(t, "unix"))
		rc = test_unix();
	else if (!strcmp(t, "badrules"))
		rc = test_badrules(port);
	else if (!strcmp(t, "dup"))
		rc = test_dup(port);
	else {
		usage();
		return 2;
	}
	fflush(stdout);
	if (rc == 77)
		return 77;
	return rc || g_fails ? 1 : 0;
}
