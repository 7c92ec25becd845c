/*
 * rcpeer.c - a TCP peer that stops reading, or is killed mid-message (issue "Hardening",
 * item 6, the RC part). Run by rcpeer.sh natively and with both ends preloaded (the connection
 * carried over RC); the script kills, signals and measures the processes from outside.
 *
 *   rcpeer read HOST PORT stall      accept one connection, read nothing until SIGUSR1, then
 *                                    read to the end of the stream checking every byte
 *   rcpeer read HOST PORT stop N     accept, read N bytes (checked), then read no more (wait
 *                                    for the SIGKILL)
 *   rcpeer read HOST PORT all        accept, read to the end or an error, checking every byte
 *   rcpeer write HOST PORT stall     fill the connection non-blocking until EAGAIN, check that
 *                                    poll and epoll say not writable and that SO_SNDTIMEO
 *                                    expires, then one blocking send of the rest of 64 MiB
 *   rcpeer write HOST PORT until [N] send N bytes (16 MiB) at a time until a send fails (the reader
 *                                    was killed): exit 0 for EPIPE or ECONNRESET
 *   rcpeer write HOST PORT untilpoll the same non-blocking, waiting in poll(POLLOUT)
 *
 * Every byte of the stream is a function of its offset (pattern()), so a reader proves each
 * byte it got is the one sent at that place, exactly once and in order. Lines on stdout say
 * what happened ("key=value" words, for the script); "FAIL: ..." and exit 1 when something is
 * not as the kernel's TCP would have it. Times are CLOCK_REALTIME in seconds, so the script
 * can compare them with the moment it sent a signal.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOTAL (64ul << 20)    /* the stall case's stream: at least 10x any buffer on the way */
#define BURST (16ul << 20)    /* one send of the "until" writer */
#define FILL_CAP (40ul << 20) /* more accepted than this while nobody reads: no back-pressure */
#define SNDTIMEO_MS 400

static int fail(const char *what)
{
	printf("FAIL: %s (errno %d %s)\n", what, errno, strerror(errno));
	fflush(stdout);
	exit(1);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

/* The stream byte at offset i: a 64-bit word per 8-byte block, different for every block. */
static uint8_t pattern(uint64_t i)
{
	uint64_t w = (i >> 3) * 0x9e3779b97f4a7c15ull ^ 0x5bd1e995c0ffee00ull;
	return (uint8_t)(w >> (8 * (i & 7)));
}

static void fill(uint8_t *p, uint64_t from, size_t n)
{
	for (size_t k = 0; k < n; k++)
		p[k] = pattern(from + k);
}

/* Offset in p (stream offset `from`) of the first byte that is not the pattern's, or n. */
static size_t check(const uint8_t *p, uint64_t from, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (p[k] != pattern(from + k))
			return k;
	return n;
}

static void addr_of(const char *host, int port, struct sockaddr_in *a)
{
	memset(a, 0, sizeof *a);
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
		fail("bad address");
}

/* Reads up to `limit` bytes (to the end when limit is 0) checking each. Returns the count;
 * *how is "EOF" or the errno's name. Exits on a wrong byte. */
static uint64_t read_checked(int c, uint64_t limit, const char **how)
{
	static uint8_t buf[1 << 16];
	uint64_t got = 0;
	*how = "EOF";
	while (!limit || got < limit) {
		size_t want = sizeof buf;
		if (limit && limit - got < want)
			want = (size_t)(limit - got);
		ssize_t n = recv(c, buf, want, 0);
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			*how = errno == ECONNRESET ? "ECONNRESET" : strerrorname_np(errno);
			break;
		}
		size_t bad = check(buf, got, (size_t)n);
		if (bad != (size_t)n) {
			printf("FAIL: stream byte %llu is %#x, the writer sent %#x there (%llu bytes read before)\n",
			       (unsigned long long)(got + bad), buf[bad], pattern(got + bad), (unsigned long long)got);
			fflush(stdout);
			exit(1);
		}
		got += (uint64_t)n;
	}
	return got;
}

static int reader(const char *host, int port, const char *mode, uint64_t n)
{
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	struct sockaddr_in a;
	addr_of(host, port, &a);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
	    bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
		fail("listen");
	printf("listening\n");
	fflush(stdout);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		fail("accept");
	const char *how;
	if (!strcmp(mode, "stall")) {
		printf("stalled rss=%ld\n", rss_kb());
		fflush(stdout);
		int sig;
		sigwait(&usr1, &sig); /* alive, reading nothing, until the script says */
		double t0 = now();
		uint64_t got = read_checked(c, 0, &how);
		printf("read bytes=%llu end=%s secs=%.2f t=%.3f\n", (unsigned long long)got, how, now() - t0, now());
		return strcmp(how, "EOF") && strcmp(how, "ECONNRESET") ? 1 : 0;
	}
	if (!strcmp(mode, "stop")) {
		uint64_t got = read_checked(c, n, &how);
		printf("stopped bytes=%llu\n", (unsigned long long)got);
		fflush(stdout);
		for (;;)
			pause(); /* the SIGKILL comes here */
	}
	uint64_t got = read_checked(c, 0, &how);
	printf("read bytes=%llu end=%s t=%.3f\n", (unsigned long long)got, how, now());
	return strcmp(how, "EOF") && strcmp(how, "ECONNRESET") ? 1 : 0;
}

static int connect_to(const char *host, int port)
{
	struct sockaddr_in a;
	addr_of(host, port, &a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a))
		fail("connect");
	return s;
}

/* Sends non-blocking from buf + off until EAGAIN. Returns the bytes accepted; exits when more
 * than FILL_CAP were accepted in all (off included): no back-pressure. */
static uint64_t fill_nb(int s, const uint8_t *buf, uint64_t off)
{
	uint64_t took = 0;
	for (;;) {
		ssize_t n = send(s, buf + off + took, 1 << 16, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return took;
		if (n < 0)
			fail("non-blocking send");
		took += (uint64_t)n;
		if (off + took > FILL_CAP) {
			printf("FAIL: %llu bytes accepted by non-blocking sends while the reader reads nothing\n",
			       (unsigned long long)(off + took));
			fflush(stdout);
			exit(1);
		}
	}
}

/* The stall case's writer; see the file's comment. */
static int write_stall(int s)
{
	uint8_t *buf = mmap(NULL, TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		fail("mmap");
	fill(buf, 0, TOTAL);
	long rss0 = rss_kb();
	uint64_t off = 0;
	/* 2. not writable: poll and epoll, each waiting SNDTIMEO_MS. The kernel may find room
	 * meanwhile (its send buffer grows with the congestion window, and it accepts a write
	 * before poll calls the socket writable): then fill again, a few times at most. */
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLOUT, .data.fd = s}, out;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev))
		fail("epoll");
	int round, pr = 0, er = 0, refills = 0;
	struct pollfd p = {.fd = s, .events = POLLOUT};
	for (round = 0; round < 5; round++) {
		off += fill_nb(s, buf, off);
		pr = poll(&p, 1, SNDTIMEO_MS);
		er = pr ? -1 : epoll_wait(ep, &out, 1, SNDTIMEO_MS);
		if (pr == 0 && er == 0)
			break;
		refills++;
	}
	if (round == 5) {
		printf("FAIL: poll says %d (revents %#x), epoll_wait %d, after each of 5 fills of the window\n", pr,
		       p.revents, er);
		return 1;
	}
	close(ep);
	/* 3. a blocking send with SO_SNDTIMEO gives up with EAGAIN after about that long (or
	 * returns what fitted, as the kernel's does when room opened meanwhile: then again; on a
	 * loaded machine the kernel's buffers kept growing through 5 such rounds once) */
	struct timeval tv = {0, SNDTIMEO_MS * 1000};
	if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv))
		fail("SO_SNDTIMEO");
	double took = 0;
	ssize_t n = 0;
	for (round = 0; round < 64; round++) {
		double t0 = now();
		n = send(s, buf + off, 1 << 16, 0);
		took = now() - t0;
		if (n <= 0)
			break;
		off += (uint64_t)n;
		refills++;
	}
	if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
		printf("FAIL: a send with SO_SNDTIMEO on a full window returned %zd (errno %s), not EAGAIN\n", n,
		       strerrorname_np(errno));
		return 1;
	}
	if (took < SNDTIMEO_MS / 1000.0 * 0.9 || took > SNDTIMEO_MS / 1000.0 + 2) {
		printf("FAIL: the send with SO_SNDTIMEO=%d ms returned EAGAIN after %.3f s\n", SNDTIMEO_MS, took);
		return 1;
	}
	tv.tv_usec = 0;
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	/* 4. the rest in one blocking send, which waits for the reader */
	printf("blocking buffered=%llu refills=%d sndtimeo_secs=%.3f rss0=%ld\n", (unsigned long long)off, refills,
	       took, rss0);
	fflush(stdout);
	while (off < TOTAL) {
		n = send(s, buf + off, TOTAL - off, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("blocking send");
		off += (uint64_t)n;
	}
	if (close(s))
		fail("close");
	printf("sent bytes=%llu\n", (unsigned long long)off);
	return 0;
}

/* Sends BURST bytes at a time until a send fails; see the file's comment. pollw: non-blocking,
 * waiting in poll(POLLOUT) whenever a send says EAGAIN (at most 10 s each: then a failure). */
static int write_until(int s, bool pollw, size_t burst)
{
	uint8_t *buf = malloc(burst);
	if (!buf)
		fail("malloc");
	uint64_t off = 0;
	for (;;) {
		fill(buf, off, burst);
		size_t done = 0;
		while (done < burst) {
			ssize_t n = send(s, buf + done, burst - done, pollw ? MSG_DONTWAIT : 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && pollw && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				struct pollfd p = {.fd = s, .events = POLLOUT};
				int r = poll(&p, 1, 10000);
				if (r == 0) {
					printf("FAIL: poll(POLLOUT) waited 10 s after %llu bytes\n",
					       (unsigned long long)(off + done));
					free(buf);
					return 1;
				}
				continue;
			}
			if (n < 0) {
				int e = errno;
				printf("send end=%s bytes=%llu t=%.3f\n", strerrorname_np(e),
				       (unsigned long long)(off + done), now());
				free(buf); /* LeakSanitizer (the ASan build) would fail the exit */
				return e == EPIPE || e == ECONNRESET ? 0 : 1;
			}
			done += (size_t)n;
		}
		off += burst;
		/* what the reader must get at least if this process is killed from now on */
		printf("writing bursts=%llu\n", (unsigned long long)off);
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("pid=%d\n", (int)getpid()); /* whatever ran it (ip netns exec, env), measured by pid */
	if (argc < 5)
		goto usage;
	const char *host = argv[2], *mode = argv[4];
	int port = atoi(argv[3]);
	if (!strcmp(argv[1], "read"))
		return reader(host, port, mode, argc > 5 ? strtoull(argv[5], NULL, 0) : 0);
	if (!strcmp(argv[1], "write")) {
		signal(SIGPIPE, SIG_IGN); /* a send to a dead peer returns EPIPE instead */
		int s = connect_to(host, port);
		printf("connected\n");
		if (!strcmp(mode, "stall"))
			return write_stall(s);
		if (!strcmp(mode, "until") || !strcmp(mode, "untilpoll"))
			return write_until(s, !strcmp(mode, "untilpoll"),
					   argc > 5 ? (size_t)strtoull(argv[5], NULL, 0) : BURST);
	}
usage:
	fprintf(stderr, "usage: rcpeer read|write HOST PORT MODE [N] (see rcpeer.c)\n");
	return 2;
}
