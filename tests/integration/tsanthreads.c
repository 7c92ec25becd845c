/*
 * tsanthreads PORT: many threads on one socket, and fork while threads run (issue 15, item 2).
 * Written for the ThreadSanitizer build (docs/tsan.md), where it runs with the shim preloaded;
 * it runs natively and in the other builds too. Ports PORT .. PORT+4 on 127.0.0.1.
 *
 *   udp   four threads each send on one UDP socket A and receive on it (a datagram, then its
 *         echo: at most four in flight, so loopback loses nothing); an echo thread on B.
 *   fork  while those threads run, the main thread forks three times; each child sends on the
 *         inherited socket A (a datagram the echo thread drops: the child must not hang on a
 *         lock a parent thread held at the fork) and then on a socket of its own (echoed back),
 *         and returns through exit() (exit handlers run in the child).
 *   tcp   one TCP connection: four threads write on the client socket at once, two threads read
 *         the server socket at once in a forked child (a connection within one process is plain
 *         under the shim); every byte arrives once (counted per writer), then EOF.
 *   close while blocked  a thread blocks in recv on a carried UDP socket, another on a carried
 *         TCP connection, and the main thread closes each descriptor under it. Natively the
 *         blocked call goes on with the file it had (the datagram or bytes sent next arrive);
 *         under the shim it fails with EBADF within a nap (before, the shim freed the socket
 *         under the sleeping call: a use after free, which the ASan build reports).
 *
 * TSANTHREADS_EXPECT=preload (set by meson.build for the preloaded run): the sockets must be
 * carried (SOL_IWARP answers, UDP framed, the TCP connection taken). Exit 0 pass, 1 fail.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dgshim.h"

#define UDP_THREADS 4
#define UDP_ROUNDS 300
#define TCP_WRITERS 4
#define TCP_READERS 2
#define TCP_CHUNK 1000
#define TCP_CHUNKS 200
#define FORKS 3
#define MAGIC 0x54534e54u /* "TSNT" */

static atomic_int fails;
static int port0;
static int sa, sb; /* UDP: A (the threads), B (the echo) */
static struct sockaddr_in addr_a, addr_b;
static atomic_int udp_done, udp_replies;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		printf("tsanthreads: FAIL: " __VA_ARGS__);                                         \
		putchar('\n');                                                                     \
		fflush(stdout);                                                                    \
		atomic_fetch_add(&fails, 1);                                                       \
	} while (0)

static struct sockaddr_in loop_addr(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static int udp_bound(int port)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = loop_addr(port);
	struct timeval tv = {5, 0};
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) ||
	    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv)) {
		FAIL("udp socket on port %d: %s", port, strerror(errno));
		exit(1);
	}
	return s;
}

/* A datagram: magic, thread, round, then bytes derived from them; length 16..515. */
static size_t dg_fill(uint8_t *b, uint32_t t, uint32_t r)
{
	size_t len = 16 + (t * 131 + r * 17) % 500;
	uint32_t h[3] = {MAGIC, t, r};
	memcpy(b, h, sizeof h);
	for (size_t i = 12; i < len; i++)
		b[i] = (uint8_t)(t * 7 + r + i);
	return len;
}

static bool dg_valid(const uint8_t *b, ssize_t n)
{
	uint8_t exp[600];
	uint32_t h[3];
	if (n < 12)
		return false;
	memcpy(h, b, sizeof h);
	if (h[0] != MAGIC || h[1] > 1000 || h[2] > 100000)
		return false;
	size_t len = dg_fill(exp, h[1], h[2]);
	return (size_t)n == len && !memcmp(b, exp, len);
}

static void *echo_main(void *arg)
{
	uint8_t b[2048];
	(void)arg;
	for (;;) {
		struct sockaddr_in from;
		socklen_t fl = sizeof from;
		ssize_t n = recvfrom(sb, b, sizeof b, 0, (struct sockaddr *)&from, &fl);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			FAIL("echo: recvfrom: %s", strerror(errno));
			return NULL;
		}
		if (n == 4 && !memcmp(b, "STOP", 4))
			return NULL;
		if (n >= 1 && b[0] == 'X')
			continue; /* a child's datagram on the inherited socket: not echoed */
		if (sendto(sb, b, (size_t)n, 0, (struct sockaddr *)&from, fl) != n)
			FAIL("echo: sendto: %s", strerror(errno));
	}
}

static void *udp_main(void *arg)
{
	uint32_t t = (uint32_t)(uintptr_t)arg;
	uint8_t b[600], r[2048];
	for (uint32_t i = 0; i < UDP_ROUNDS; i++) {
		size_t len = dg_fill(b, t, i);
		if (sendto(sa, b, len, 0, (struct sockaddr *)&addr_b, sizeof addr_b) != (ssize_t)len) {
			FAIL("udp thread %u round %u: sendto: %s", t, i, strerror(errno));
			break;
		}
		/* any thread's echo may come to this thread: only well-formed and counted */
		ssize_t n = recv(sa, r, sizeof r, 0);
		if (n < 0) {
			FAIL("udp thread %u round %u: recv: %s (no echo within 5 s)", t, i, strerror(errno));
			break;
		}
		if (!dg_valid(r, n))
			FAIL("udp thread %u round %u: a malformed echo of %zd bytes", t, i, n);
		atomic_fetch_add(&udp_replies, 1);
	}
	atomic_fetch_add(&udp_done, 1);
	return NULL;
}

/* The child of a fork taken while the UDP threads run. */
static int child_main(int k)
{
	uint8_t x[64] = "X from a child on the inherited socket";
	if (sendto(sa, x, sizeof x, 0, (struct sockaddr *)&addr_b, sizeof addr_b) != (ssize_t)sizeof x) {
		printf("tsanthreads: FAIL: child %d: sendto on the inherited socket: %s\n", k, strerror(errno));
		return 1;
	}
	int c = udp_bound(port0 + 2);
	uint8_t b[600], r[2048];
	size_t len = dg_fill(b, 900 + (uint32_t)k, (uint32_t)k);
	if (sendto(c, b, len, 0, (struct sockaddr *)&addr_b, sizeof addr_b) != (ssize_t)len) {
		printf("tsanthreads: FAIL: child %d: sendto on its own socket: %s\n", k, strerror(errno));
		return 1;
	}
	ssize_t n = recv(c, r, sizeof r, 0);
	if (n != (ssize_t)len || memcmp(b, r, len)) {
		printf("tsanthreads: FAIL: child %d: echo on its own socket: %zd bytes (%s), want %zu\n", k,
		       n, n < 0 ? strerror(errno) : "", len);
		return 1;
	}
	close(c);
	/* the inherited one too: the parent's threads were in calls on it at the fork, which the
	 * child must not wait for to let the object go (LeakSanitizer in the ASan build) */
	close(sa);
	return 0;
}

static void test_udp_fork(bool preload)
{
	sa = udp_bound(port0);
	sb = udp_bound(port0 + 1);
	addr_a = loop_addr(port0);
	addr_b = loop_addr(port0 + 1);
	pthread_t echo, th[UDP_THREADS];
	if (pthread_create(&echo, NULL, echo_main, NULL)) {
		FAIL("pthread_create");
		exit(1);
	}
	for (uintptr_t t = 0; t < UDP_THREADS; t++)
		if (pthread_create(&th[t], NULL, udp_main, (void *)t)) {
			FAIL("pthread_create");
			exit(1);
		}
	for (int k = 0; k < FORKS; k++) {
		/* spread the forks over the run: after 1/4, 2/4, 3/4 of the replies */
		int want = (k + 1) * UDP_THREADS * UDP_ROUNDS / (FORKS + 1);
		for (int w = 0; w < 20000 && atomic_load(&udp_replies) < want &&
				atomic_load(&udp_done) < UDP_THREADS;
		     w++)
			usleep(1000);
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0) {
			FAIL("fork: %s", strerror(errno));
			break;
		}
		if (pid == 0)
			exit(child_main(k)); /* exit(), not _exit(): the child's exit handlers run */
		int st = 0;
		pid_t w = 0;
		for (int i = 0; i < 200 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++)
			usleep(50000);
		if (w == 0) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			FAIL("fork %d: the child did not finish within 10 s (hung in the shim?)", k);
		} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			FAIL("fork %d: the child failed (status 0x%x)", k, st);
		}
	}
	for (int t = 0; t < UDP_THREADS; t++)
		pthread_join(th[t], NULL);
	if (sendto(sa, "STOP", 4, 0, (struct sockaddr *)&addr_b, sizeof addr_b) != 4)
		FAIL("sendto STOP: %s", strerror(errno));
	pthread_join(echo, NULL);
	int got = atomic_load(&udp_replies);
	if (got != UDP_THREADS * UDP_ROUNDS)
		FAIL("udp: %d echoes for %d datagrams", got, UDP_THREADS * UDP_ROUNDS);
	if (preload) {
		struct iwarp_stats st;
		socklen_t sl = sizeof st;
		if (getsockopt(sa, SOL_IWARP, IWARP_STATS, &st, &sl))
			FAIL("udp: IWARP_STATS: %s", strerror(errno));
		else if (st.tx_framed == 0)
			FAIL("udp: nothing framed on A (tx_framed 0, tx_plain %llu)",
			     (unsigned long long)st.tx_plain);
	}
	printf("tsanthreads: udp: %d datagrams echoed through %d threads on one socket, %d forks "
	       "meanwhile\n",
	       got, UDP_THREADS, FORKS);
	close(sa);
	close(sb);
}

/* ------------------------------------------------------------------ tcp */

static int tc, ts; /* client and server ends of the connection */
static atomic_long tcp_count[TCP_WRITERS];
static atomic_int tcp_bad;

static void *writer_main(void *arg)
{
	int t = (int)(uintptr_t)arg;
	uint8_t b[TCP_CHUNK];
	memset(b, t + 1, sizeof b);
	for (int i = 0; i < TCP_CHUNKS; i++) {
		size_t off = 0;
		while (off < sizeof b) {
			ssize_t n = send(tc, b + off, sizeof b - off, MSG_NOSIGNAL);
			if (n <= 0) {
				FAIL("tcp writer %d: send: %s", t, n < 0 ? strerror(errno) : "0");
				return NULL;
			}
			off += (size_t)n;
		}
	}
	return NULL;
}

static void *reader_main(void *arg)
{
	uint8_t b[4096];
	(void)arg;
	for (;;) {
		ssize_t n = recv(ts, b, sizeof b, 0);
		if (n == 0)
			return NULL; /* end of stream: the writers are done and the client shut down */
		if (n < 0) {
			if (errno == EINTR)
				continue;
			FAIL("tcp reader: recv: %s", strerror(errno));
			return NULL;
		}
		for (ssize_t i = 0; i < n; i++) {
			if (b[i] >= 1 && b[i] <= TCP_WRITERS)
				atomic_fetch_add(&tcp_count[b[i] - 1], 1);
			else
				atomic_fetch_add(&tcp_bad, 1);
		}
	}
}

/* Accepts, then reads with a second reader. */
static void acceptor_main(int ls)
{
	ts = accept(ls, NULL, NULL);
	if (ts < 0) {
		FAIL("tcp accept: %s", strerror(errno));
		return;
	}
	pthread_t r[TCP_READERS - 1];
	for (int i = 0; i < TCP_READERS - 1; i++)
		pthread_create(&r[i], NULL, reader_main, NULL);
	reader_main(NULL);
	for (int i = 0; i < TCP_READERS - 1; i++)
		pthread_join(r[i], NULL);
}

/* The server end lives in a forked child (under the shim a connection within one process is
 * plain TCP: docs/shim.md "A listener of the same process"); it reports what each writer's
 * bytes added up to through a pipe. */
static void test_tcp(bool preload)
{
	int pp[2];
	if (pipe(pp)) {
		FAIL("pipe: %s", strerror(errno));
		return;
	}
	struct sockaddr_in a = loop_addr(port0 + 3);
	pid_t pid = fork();
	if (pid < 0) {
		FAIL("fork: %s", strerror(errno));
		return;
	}
	if (pid == 0) {
		close(pp[0]);
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		char ready = 'L';
		if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4)) {
			FAIL("tcp listen on %d: %s", port0 + 3, strerror(errno));
			ready = 'E';
		}
		if (write(pp[1], &ready, 1) != 1 || ready != 'L')
			_exit(1);
		acceptor_main(ls);
		long res[TCP_WRITERS + 1];
		for (int i = 0; i < TCP_WRITERS; i++)
			res[i] = atomic_load(&tcp_count[i]);
		res[TCP_WRITERS] = atomic_load(&tcp_bad);
		ssize_t w = write(pp[1], res, sizeof res);
		close(ts);
		close(ls);
		exit(w == (ssize_t)sizeof res && !atomic_load(&fails) ? 0 : 1);
	}
	close(pp[1]);
	char ready = 0;
	if (read(pp[0], &ready, 1) != 1 || ready != 'L') {
		FAIL("tcp: the server child did not listen");
		close(pp[0]);
		waitpid(pid, NULL, 0);
		return;
	}
	pthread_t w[TCP_WRITERS];
	tc = socket(AF_INET, SOCK_STREAM, 0);
	if (tc < 0 || connect(tc, (struct sockaddr *)&a, sizeof a)) {
		FAIL("tcp connect: %s", strerror(errno));
		exit(1);
	}
	for (uintptr_t i = 0; i < TCP_WRITERS; i++)
		pthread_create(&w[i], NULL, writer_main, (void *)i);
	for (int i = 0; i < TCP_WRITERS; i++)
		pthread_join(w[i], NULL);
	if (preload) {
		int taken = -1;
		socklen_t sl = sizeof taken;
		if (getsockopt(tc, SOL_IWARP, IWARP_TAKEN, &taken, &sl) || taken != 1)
			FAIL("tcp: the connection is not carried (IWARP_TAKEN %d: %s)", taken,
			     strerror(errno));
	}
	shutdown(tc, SHUT_WR);
	long res[TCP_WRITERS + 1];
	ssize_t got = read(pp[0], res, sizeof res);
	close(pp[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	if (got != (ssize_t)sizeof res || !WIFEXITED(st) || WEXITSTATUS(st)) {
		FAIL("tcp: the server child failed (status %#x, %zd bytes of results)", st, got);
		close(tc);
		return;
	}
	long total = 0;
	for (int i = 0; i < TCP_WRITERS; i++) {
		total += res[i];
		if (res[i] != (long)TCP_CHUNK * TCP_CHUNKS)
			FAIL("tcp: writer %d: %ld bytes arrived, %ld sent", i, res[i], (long)TCP_CHUNK * TCP_CHUNKS);
	}
	if (res[TCP_WRITERS])
		FAIL("tcp: %ld bytes that no writer wrote", res[TCP_WRITERS]);
	printf("tsanthreads: tcp: %ld bytes from %d writers to %d readers on one connection\n", total,
	       TCP_WRITERS, TCP_READERS);
	close(tc);
}

struct blocked {
	int fd;
	ssize_t n;
	int err;
	atomic_bool done;
};

static void *blocked_main(void *arg)
{
	struct blocked *b = arg;
	char buf[64];
	b->n = recv(b->fd, buf, sizeof buf, 0);
	b->err = errno;
	atomic_store(&b->done, true);
	return NULL;
}

/* Starts a thread blocked in recv on fd, closes fd under it after 300 ms, then wake() (which
 * makes the native call return) and checks how the call ended: preloaded EBADF, natively what
 * wake sent. what names the case. */
static void close_under(const char *what, int fd, bool preload, void (*wake)(void))
{
	struct blocked b = {.fd = fd};
	pthread_t th;
	pthread_create(&th, NULL, blocked_main, &b);
	usleep(300000); /* asleep in its wait */
	if (close(fd))
		FAIL("%s: close: %s", what, strerror(errno));
	usleep(preload ? 400000 : 100000);
	wake();
	for (int i = 0; i < 500 && !atomic_load(&b.done); i++)
		usleep(10000);
	if (!atomic_load(&b.done)) {
		FAIL("%s: the call blocked when its descriptor was closed did not return in 5 s", what);
		pthread_detach(th);
		return;
	}
	pthread_join(th, NULL);
	if (preload ? !(b.n == -1 && b.err == EBADF) : b.n <= 0)
		FAIL("%s: the blocked recv returned %zd (%s), want %s", what, b.n, b.n < 0 ? strerror(b.err) : "-",
		     preload ? "EBADF" : "the bytes sent after the close");
	else
		printf("tsanthreads: close while blocked: %s: recv returned %zd%s%s\n", what, b.n,
		       b.n < 0 ? " " : "", b.n < 0 ? strerrorname_np(b.err) : "");
}

static int cu_port;
static void wake_udp(void)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = loop_addr(cu_port);
	sendto(s, "wake", 4, 0, (struct sockaddr *)&a, sizeof a);
	close(s);
}

static int cu_pipe = -1;
static void wake_tcp(void)
{
	if (write(cu_pipe, "w", 1) != 1)
		FAIL("close while blocked: tcp: the server child's pipe");
}

static void test_close_blocked(bool preload)
{
#if defined(__SANITIZE_THREAD__)
	if (!preload) {
		/* natively a close under a blocked recv is the kernel's business, and ThreadSanitizer
		 * (which takes a descriptor for a synchronisation object) reports it as a race: the
		 * case is the shim's, run preloaded */
		printf("tsanthreads: close while blocked: not run natively in the ThreadSanitizer build\n");
		return;
	}
#endif
	/* UDP: carried once a datagram crossed (framed under the shim) */
	cu_port = port0 + 4;
	int u = udp_bound(cu_port);
	struct timeval none = {0, 0};
	setsockopt(u, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
	wake_udp();
	char buf[8];
	if (recv(u, buf, sizeof buf, 0) != 4)
		FAIL("close while blocked: udp: the first datagram did not come: %s", strerror(errno));
	close_under("udp", u, preload, wake_udp);

	/* TCP: a carried connection to a forked child, which writes when told (after the close) */
	int pp[2], rp[2];
	if (pipe(pp) || pipe(rp)) {
		FAIL("pipe: %s", strerror(errno));
		return;
	}
	struct sockaddr_in a = loop_addr(port0 + 3);
	pid_t pid = fork();
	if (pid == 0) {
		close(pp[1]);
		close(rp[0]);
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		char ready = 'L';
		if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4))
			ready = 'E';
		if (write(rp[1], &ready, 1) != 1 || ready != 'L')
			_exit(1);
		int c = accept(ls, NULL, NULL);
		char w;
		if (c < 0 || read(pp[0], &w, 1) != 1)
			_exit(1);
		ssize_t n = write(c, "bytes", 5);
		usleep(200000);
		close(c);
		close(ls);
		_exit(n == 5 ? 0 : 1);
	}
	close(pp[0]);
	close(rp[1]);
	char ready = 0;
	if (pid < 0 || read(rp[0], &ready, 1) != 1 || ready != 'L') {
		FAIL("close while blocked: tcp: the server child did not listen");
		close(pp[1]);
		close(rp[0]);
		if (pid > 0)
			waitpid(pid, NULL, 0);
		return;
	}
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) {
		FAIL("close while blocked: tcp connect: %s", strerror(errno));
	} else {
		int taken = -1;
		socklen_t sl = sizeof taken;
		if (preload && (getsockopt(c, SOL_IWARP, IWARP_TAKEN, &taken, &sl) || taken != 1))
			FAIL("close while blocked: tcp: the connection is not carried (IWARP_TAKEN %d)", taken);
		cu_pipe = pp[1];
		close_under("tcp", c, preload, wake_tcp);
	}
	close(pp[1]);
	close(rp[0]);
	waitpid(pid, NULL, 0);
}

int main(int argc, char **argv)
{
	if (argc != 2 || (port0 = atoi(argv[1])) < 1024 || port0 > 65000) {
		fprintf(stderr, "usage: tsanthreads PORT (uses PORT..PORT+3 on 127.0.0.1)\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(120); /* a hang is a failure, not a stuck suite */
	const char *exp = getenv("TSANTHREADS_EXPECT");
	bool preload = exp && !strcmp(exp, "preload");
	if (preload) {
		int s = socket(AF_INET, SOCK_DGRAM, 0), m = 0;
		socklen_t ml = sizeof m;
		if (getsockopt(s, SOL_IWARP, IWARP_MODE, &m, &ml)) {
			FAIL("TSANTHREADS_EXPECT=preload but SOL_IWARP is not answered: the shim did not load");
			return 1;
		}
		close(s);
	}
	test_udp_fork(preload);
	test_tcp(preload);
	test_close_blocked(preload);
	int f = atomic_load(&fails);
	printf("tsanthreads: %s (%d failure%s)\n", f ? "FAIL" : "PASS", f, f == 1 ? "" : "s");
	return f ? 1 : 0;
}
