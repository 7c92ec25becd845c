/*
 * fdcost.c - what a socket costs in descriptors and memory (issue 14), and that the queue pair
 * of a taken UDP socket, which reads the program's own descriptor number, leaves a number the
 * program closed alone (promise 1).
 *
 *   fdcost udp N   N bound UDP sockets, idle: prints "fds F" and "rss_kb R" per socket; then
 *                  each carries a datagram to itself and all are waited on (epoll, poll, a
 *                  blocking receive that times out): "udp-waited N wfds F wrss_kb R"
 *   fdcost tcp N   N loopback TCP connections, idle after one exchange: per client end (the
 *                  server ends in a forked child: a connection within one process is plain)
 *   fdcost tcpidle N WAIT_MS BYTES  N connections trade BYTES each way: kB of RSS per client
 *                  end then ("busy_kb"), after WAIT_MS idle ("idle_kb": the shim gives an idle
 *                  connection's buffers back) and after BYTES more each way, checked ("again_kb")
 *   fdcost dests N one UDP server socket answers N short-lived client sockets: kB of RSS per
 *                  new destination ("dests N rss_kb R")
 *   fdcost churn R N GAP_MS  R rounds of N new clients, GAP_MS apart: the server's kB of RSS
 *                  per destination in the second half (what is known of idle ones is forgotten)
 *   fdcost rdstall S  a blocking RD sender whose receiver stopped acknowledging: the CPU it
 *                  uses while it waits S s for room ("rdstall ... cpu_frac F", of one CPU)
 *   fdcost rdkill N [fork]  a blocking RD sender whose receiver (another program, or a forked
 *                  child) was killed: seconds for N datagrams
 *   fdcost tcpclose N  N connections trade a byte, then all are closed: ms per close()
 *                  ("tcpclose N close_ms X"); the server child must read the end of each
 *                  (EOF, no reset) within 10 s
 *   fdcost epollwait N  N idle connections (one byte each way): microseconds per epoll_wait
 *                  (timeout 0, nothing ready) with a tenth of them registered in one instance,
 *                  then with all N ("epollwait N small_us S big_us B"), and per epoll_ctl MOD
 *                  ("mod_us M"): a wait costs what is ready, not what is registered
 *   fdcost tcprr N  N connections one after another, each a request-response: connect, write
 *                  64 bytes, read the 64 echoed by a server that accepts, reads and writes
 *                  with blocking calls, close. Prints "tcprr N avg_ms A max_ms M slow S", S the
 *                  connections that took 150 ms or more (a wake-up lost: the shim's waits nap
 *                  at most 200 ms)
 *   fdcost move    dup, close the original, reuse its number for a pipe: the socket goes on
 *                  through the duplicate and the pipe's byte stays the program's
 *
 * Runs natively and preloaded (fdcost.sh compares the two). Exit 0 when its own checks pass.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int fails;
#define FAIL(...) (fprintf(stdout, "fdcost: FAIL: " __VA_ARGS__), fputc('\n', stdout), fails++)

static int nfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, "VmRSS:", 6))
			v = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static struct sockaddr_in lo(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static int udp_bound(void)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = lo(0);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a)) {
		FAIL("udp socket/bind: %s", strerror(errno));
		exit(1);
	}
	return s;
}

static void report(const char *what, int n, int f0, int f1, long r0, long r1)
{
	printf("# %s: %d sockets: fds %.3f rss_kb %.2f per socket\n", what, n, (double)(f1 - f0) / n,
	       (double)(r1 - r0) / n);
	printf("%s %d fds %.3f rss_kb %.2f\n", what, n, (double)(f1 - f0) / n, (double)(r1 - r0) / n);
}

/* The sockets waited on the ways a program waits (one epoll set holding them all, a poll of
 * them all; datagram sockets also a blocking receive on each with a timeout, after each
 * carried one datagram to itself): a wait must not make the shim a descriptor per socket
 * (issue 14 item 1). Returns the number of failed checks. */
static int sock_waits(const int *s, int n, bool dgram)
{
	int bad = 0, ep = epoll_create1(EPOLL_CLOEXEC);
	struct pollfd *p = calloc((size_t)n, sizeof *p);
	if (ep < 0 || !p) {
		FAIL("epoll_create1/calloc: %s", strerror(errno));
		return 1;
	}
	for (int i = 0; i < n; i++) {
		struct sockaddr_in a;
		if (!dgram)
			goto add;
		socklen_t al = sizeof a;
		char b = 'd';
		struct timeval tv = {0, 20000};
		if (getsockname(s[i], (struct sockaddr *)&a, &al) ||
		    sendto(s[i], &b, 1, 0, (struct sockaddr *)&a, al) != 1 || recv(s[i], &b, 1, 0) != 1 ||
		    setsockopt(s[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
		    recv(s[i], &b, 1, 0) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
			FAIL("socket %d: one datagram to itself, then a receive that times out: %s", i, strerror(errno));
			bad++;
		}
	add:;
		struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, s[i], &e)) {
			FAIL("epoll_ctl ADD: %s", strerror(errno));
			bad++;
		}
		p[i] = (struct pollfd){.fd = s[i], .events = POLLIN | POLLOUT};
	}
	struct epoll_event ev[8];
	int r = epoll_wait(ep, ev, 8, 50);
	if (r != 0) {
		FAIL("epoll_wait of idle sockets: %d (%s)", r, r < 0 ? strerror(errno) : "events");
		bad++;
	}
	r = poll(p, (nfds_t)n, 50);
	if (r != n) { /* every one writable, none readable */
		FAIL("poll of idle sockets: %d of %d ready", r, n);
		bad++;
	}
	for (int i = 0; i < n && r == n; i++)
		if (p[i].revents != POLLOUT) {
			FAIL("poll: socket %d revents 0x%x, not POLLOUT alone", i, p[i].revents);
			bad++;
			break;
		}
	free(p); /* the epoll set stays: its registrations are what is counted */
	return bad;
}

static int run_udp(int n)
{
	int warm = udp_bound(); /* the shim's per-process state (context, registry) comes first */
	int *s = calloc((size_t)n, sizeof *s);
	if (!s)
		return 1;
	int f0 = nfds();
	long r0 = rss_kb();
	for (int i = 0; i < n; i++)
		s[i] = udp_bound();
	usleep(200000);
	long r1 = rss_kb(); /* idle: before any of them carried a datagram */
	int f1 = nfds();
	report("udp", n, f0, f1, r0, r1);
	/* one warm socket waited on the same ways first: the per-process descriptors (the epoll
	 * set and the shim's inner one) are not counted against the sockets */
	int wf0 = nfds();
	sock_waits(&warm, 1, true);
	int wf1 = nfds();
	sock_waits(s, n, true);
	usleep(100000);
	/* RSS now: each socket has sent and received a datagram (its send queue, receive slot and
	 * CQ ring written once), less the warm socket's share */
	printf("udp-waited %d wfds %.3f wrss_kb %.2f\n", n, (double)(nfds() - (wf1 - wf0) - f0) / n,
	       (double)(rss_kb() - r0) / n);
	free(s);
	return fails ? 1 : 0;
}

/* The server ends live in a forked child (a connection within one process is plain under the
 * shim): it accepts and echoes what each connection sends, and holds them all until the pipe
 * closes. */
/* tcpclose: the server exits once each of its n + 1 connections ended (0: all by EOF, 2: some
 * by an error such as a reset) */
static bool server_ends_exit;

/* A server child's listener on 127.0.0.1 (an ephemeral port), its port told through wr; the
 * child exits when it cannot listen. */
static int child_listen(int backlog, int wr)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = lo(0);
	socklen_t al = sizeof a;
	unsigned port = 0;
	if (l >= 0 && !bind(l, (struct sockaddr *)&a, sizeof a) && !listen(l, backlog) &&
	    !getsockname(l, (struct sockaddr *)&a, &al))
		port = ntohs(a.sin_port);
	if (write(wr, &port, sizeof port) != sizeof port || !port)
		_exit(1);
	return l;
}

static void tcp_server(int n, int wr, int done)
{
	int l = child_listen(4096, wr);
	struct pollfd *p = calloc((size_t)n + 3, sizeof *p);
	if (!p)
		_exit(1);
	int ends = 0, resets = 0;
	p[0] = (struct pollfd){.fd = done, .events = POLLIN};
	p[1] = (struct pollfd){.fd = l, .events = POLLIN};
	int np = 2;
	static char b[65536];
	for (;;) {
		if (poll(p, (nfds_t)np, -1) < 0)
			_exit(1);
		if (p[0].revents)
			_exit(0); /* the measuring parent closed its end */
		if (p[1].revents && np < n + 3) {
			int c = accept(l, NULL, NULL);
			if (c < 0)
				_exit(1);
			p[np++] = (struct pollfd){.fd = c, .events = POLLIN};
		}
		for (int i = 2; i < np; i++) {
			if (!p[i].revents)
				continue;
			ssize_t r = read(p[i].fd, b, sizeof b);
			if (r <= 0) {
				resets += r < 0;
				p[i].fd = -1; /* kept open: the peer's close is not answered by ours at once */
				if (server_ends_exit && ++ends == n + 1)
					_exit(resets ? 2 : 0); /* every connection ended: tcpclose's check */
				continue;
			}
			for (ssize_t o = 0, w; o < r; o += w)
				if ((w = write(p[i].fd, b + o, (size_t)(r - o))) <= 0)
					_exit(1);
		}
	}
}

static double wall_s(void);

/* tcprr's server: one connection at a time, each served by a blocking accept, read and write
 * (a first read that waits on a connection just accepted), until the parent kills it. */
static void tcp_server_blocking(int wr)
{
	int l = child_listen(128, wr);
	for (;;) {
		char b[64];
		int c = accept(l, NULL, NULL);
		if (c < 0)
			_exit(1);
		size_t got = 0;
		while (got < sizeof b) {
			ssize_t r = read(c, b + got, sizeof b - got);
			if (r <= 0)
				_exit(1);
			got += (size_t)r;
		}
		if (write(c, b, sizeof b) != (ssize_t)sizeof b)
			_exit(1);
		close(c);
	}
}

static int run_tcprr(int n)
{
	int pp[2];
	if (pipe(pp)) {
		FAIL("pipe: %s", strerror(errno));
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		FAIL("fork: %s", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		close(pp[0]);
		tcp_server_blocking(pp[1]);
	}
	close(pp[1]);
	unsigned port = 0;
	if (read(pp[0], &port, sizeof port) != sizeof port || !port)
		FAIL("the server child did not listen");
	close(pp[0]);
	struct sockaddr_in a = lo((int)port);
	double sum = 0, max = 0;
	int slow = 0;
	for (int i = 0; i < n && !fails; i++) {
		char b[64], r[64];
		memset(b, 'a' + i % 26, sizeof b);
		double t0 = wall_s();
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) || write(c, b, sizeof b) != (ssize_t)sizeof b) {
			FAIL("connection %d: %s", i, strerror(errno));
			break;
		}
		size_t got = 0;
		while (got < sizeof r) {
			ssize_t k = read(c, r + got, sizeof r - got);
			if (k <= 0) {
				FAIL("connection %d: read %zd (%s)", i, k, k < 0 ? strerror(errno) : "end of stream");
				break;
			}
			got += (size_t)k;
		}
		if (got == sizeof r && memcmp(b, r, sizeof b))
			FAIL("connection %d: the echo differs", i);
		close(c);
		double d = wall_s() - t0;
		sum += d;
		max = d > max ? d : max;
		slow += d >= 0.150;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	printf("tcprr %d avg_ms %.3f max_ms %.2f slow %d\n", n, sum * 1000 / (n > 0 ? n : 1), max * 1000, slow);
	return fails ? 1 : 0;
}

/* Forks the echo server for n + 1 connections. Returns its port (0: failed), *pid and *done
 * (the pipe end whose close ends it). */
static unsigned tcp_server_start(int n, pid_t *pid, int *done)
{
	int pp[2], dp[2];
	if (pipe(pp) || pipe(dp)) {
		FAIL("pipe: %s", strerror(errno));
		return 0;
	}
	if ((*pid = fork()) < 0) {
		FAIL("fork: %s", strerror(errno));
		return 0;
	}
	if (*pid == 0) {
		close(pp[0]), close(dp[1]);
		tcp_server(n, pp[1], dp[0]);
	}
	close(pp[1]), close(dp[0]);
	unsigned port = 0;
	if (read(pp[0], &port, sizeof port) != sizeof port || !port)
		FAIL("the server child did not listen");
	close(pp[0]);
	*done = dp[1];
	return port;
}

/* The echo server for n + 1 connections, its address *a, and room for n client sockets.
 * Returns that array, or NULL (FAIL said, or out of memory). */
static int *tcp_begin(int n, pid_t *pid, int *done, struct sockaddr_in *a)
{
	unsigned port = tcp_server_start(n, pid, done);
	if (!port)
		return NULL;
	*a = lo((int)port);
	return calloc((size_t)n, sizeof(int));
}

static int run_tcp(int n)
{
	pid_t pid;
	int done, f0 = 0, first = -1;
	long r0 = 0;
	struct sockaddr_in a;
	int *cs = tcp_begin(n, &pid, &done, &a);
	if (!cs)
		return 1;
	for (int i = -1; i < n; i++) {
		if (i == 0)
			f0 = nfds(), r0 = rss_kb(); /* after one connection: per-process state made */
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (i < 0)
			first = c;
		else
			cs[i] = c;
		char b = 'x';
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) {
			FAIL("connect #%d: %s", i, strerror(errno));
			return 1;
		}
		if (write(c, &b, 1) != 1 || read(c, &b, 1) != 1) {
			FAIL("exchange #%d: %s", i, strerror(errno));
			return 1;
		}
	}
	usleep(200000);
	report("tcp-end", n, f0, nfds(), r0, rss_kb());
	/* then all waited on, the first one alone before (its epoll set is per process) */
	int wf0 = nfds();
	sock_waits(&first, 1, false);
	int wf1 = nfds();
	sock_waits(cs, n, false);
	printf("tcp-waited %d wfds %.3f\n", n, (double)(nfds() - (wf1 - wf0) - f0) / n);
	free(cs);
	close(done);
	waitpid(pid, NULL, 0);
	return fails ? 1 : 0;
}

static int run_move(void)
{
	int a = udp_bound(), b = udp_bound();
	struct sockaddr_in A, B;
	socklen_t l = sizeof A;
	getsockname(a, (struct sockaddr *)&A, &l);
	l = sizeof B;
	getsockname(b, (struct sockaddr *)&B, &l);
	struct timeval tv = {5, 0};
	setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char buf[64];
	if (sendto(a, "one", 3, 0, (struct sockaddr *)&B, sizeof B) != 3 || recv(b, buf, sizeof buf, 0) != 3)
		FAIL("first datagram: %s", strerror(errno));
	int d = dup(a);
	int anum = a;
	close(a);
	/* the number comes back as a pipe holding a byte nobody but the program may read */
	int pp[2];
	if (pipe(pp)) {
		FAIL("pipe: %s", strerror(errno));
		return 1;
	}
	int pr = pp[0];
	if (pr != anum) {
		/* make the pipe's read end take the closed socket's number */
		if (dup2(pp[0], anum) != anum) {
			FAIL("dup2 onto %d: %s", anum, strerror(errno));
			return 1;
		}
		close(pp[0]);
		pr = anum;
	}
	if (write(pp[1], "P", 1) != 1)
		FAIL("pipe write: %s", strerror(errno));
	/* traffic both ways on the duplicate, which the shim still carries */
	for (int i = 0; i < 20; i++) {
		if (sendto(d, "two", 3, 0, (struct sockaddr *)&B, sizeof B) != 3 || recv(b, buf, sizeof buf, 0) != 3)
			FAIL("datagram %d from the duplicate: %s", i, strerror(errno));
		if (sendto(b, "back", 4, 0, (struct sockaddr *)&A, sizeof A) != 4 || recv(d, buf, sizeof buf, 0) != 4)
			FAIL("datagram %d to the duplicate: %s", i, strerror(errno));
	}
	usleep(100000);
	struct pollfd p = {pr, POLLIN, 0};
	if (poll(&p, 1, 0) != 1 || read(pr, buf, sizeof buf) != 1 || buf[0] != 'P')
		FAIL("the pipe on the reused number %d lost its byte (read by someone else)", anum);
	else
		printf("move: the duplicate carried 40 datagrams; the pipe on the reused number kept its byte\n");
	return fails ? 1 : 0;
}

/* Bytes of the program's malloc heap in use (what the shim allocates there counts too). */
static long heap_used(void)
{
	struct mallinfo2 m = mallinfo2();
	return (long)(m.uordblks + m.hblkhd);
}

/* One server socket answers n short-lived client sockets (each its own port, one datagram
 * and its echo, then closed): what each new destination costs the server's process, in RSS and
 * in the program's own heap. The shim keeps what it knows of a destination in pages of its
 * own: an object kept per destination in the program's heap, between buffers the program
 * allocates and frees, pinned glibc's heap, and a Python echo server's grew 1.5 kB per client
 * (the soak). */
/* srv answers one new client socket (its own port: a new destination): returns 0, or -1 with
 * the failure said. */
static int one_client(int srv, const struct sockaddr_in *sa, int i)
{
	struct timeval tv = {5, 0};
	int c = udp_bound();
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char b[32] = "ping";
	struct sockaddr_in from;
	socklen_t fl = sizeof from;
	int r = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* srv -1: another process serves */
	if (sendto(c, b, sizeof b, 0, (const struct sockaddr *)sa, sizeof *sa) != sizeof b ||
	    (srv >= 0 && (recvfrom(srv, b, sizeof b, 0, (struct sockaddr *)&from, &fl) != sizeof b ||
			  sendto(srv, b, sizeof b, 0, (struct sockaddr *)&from, fl) != sizeof b)) ||
	    recv(c, b, sizeof b, 0) != sizeof b) {
		int e = errno;
		struct sockaddr_in me;
		socklen_t ml = sizeof me;
		getsockname(c, (struct sockaddr *)&me, &ml);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		/* the port and the time say which datagram to look for in the shim's log */
		FAIL("destination #%d (port %u): %s after %.3f s", i, ntohs(me.sin_port), strerror(e),
		     (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
		r = -1;
	}
	close(c);
	return r;
}

static int server_socket(struct sockaddr_in *sa)
{
	int srv = udp_bound();
	socklen_t sl = sizeof *sa;
	getsockname(srv, (struct sockaddr *)sa, &sl);
	struct timeval tv = {5, 0};
	setsockopt(srv, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return srv;
}

static int run_dests(int n)
{
	struct sockaddr_in sa;
	int srv = server_socket(&sa);
	long r0 = 0, h0 = 0;
	for (int i = -200; i < n; i++) {
		if (i == 0) {
			r0 = rss_kb(); /* after 200: the per-process state and the first pages made */
			h0 = heap_used();
		}
		if (one_client(srv, &sa, i))
			return 1;
	}
	long r1 = rss_kb(), h1 = heap_used();
	printf("dests %d rss_kb %.3f heap_b %.1f\n", n, (double)(r1 - r0) / n, (double)(h1 - h0) / n);
	return fails ? 1 : 0;
}

/* A long-lived server whose clients come and go: rounds of n new client sockets (in a child
 * process, as clients are), a pause of gap_ms between rounds (run with DGSHIM_DEST_IDLE_MS below
 * it). What the shim knows of a destination is forgotten once idle, so the server's RSS stays
 * flat once the pages of the host's registry (1 MiB shared, docs/shim.md "Discovery") that its
 * clients' ports hash to are touched: "churn R n N rss_kb R" is the server's kB per destination
 * over the second half of the rounds (natively ~0; with every destination kept ~0.22). */
static int run_churn(int rounds, int n, int gap_ms)
{
	/* the clients' process is forked before this one has a taken socket (and so the shim's
	 * threads): a fork while another thread holds the sanitizer's allocator lock leaves the
	 * child stuck in it (GCC 12's ASan); the server's address comes through a pipe */
	int pp[2];
	if (pipe(pp))
		return FAIL("pipe: %s", strerror(errno)), 1;
	struct sockaddr_in sa;
	pid_t pid = fork();
	if (pid < 0)
		return FAIL("fork: %s", strerror(errno)), 1;
	if (pid == 0) {
		if (read(pp[0], &sa, sizeof sa) != sizeof sa)
			_exit(1);
		for (int k = 1; k <= rounds; k++) {
			for (int i = 0; i < n; i++)
				if (one_client(-1, &sa, i))
					_exit(1);
			usleep((useconds_t)gap_ms * 1000);
		}
		_exit(0);
	}
	int srv = server_socket(&sa);
	if (write(pp[1], &sa, sizeof sa) != sizeof sa)
		FAIL("pipe write: %s", strerror(errno));
	long r0 = 0;
	char b[32];
	for (int i = 0; i < rounds * n; i++) {
		if (i == rounds / 2 * n)
			r0 = rss_kb(); /* the shared registry's pages are all touched by then */
		struct sockaddr_in from;
		socklen_t fl = sizeof from;
		if (recvfrom(srv, b, sizeof b, 0, (struct sockaddr *)&from, &fl) != sizeof b ||
		    sendto(srv, b, sizeof b, 0, (struct sockaddr *)&from, fl) != sizeof b) {
			FAIL("datagram #%d: %s", i, strerror(errno));
			break;
		}
	}
	long r1 = rss_kb();
	int st = 0;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("the clients failed (status %d)", st);
	int counted = (rounds - rounds / 2) * n;
	printf("churn %d n %d rss_kb %.3f\n", rounds, n, counted > 0 ? (double)(r1 - r0) / counted : 0.0);
	return fails ? 1 : 0;
}

/* CPU seconds of this process (all its threads: the shim's progress thread counts). */
static double cpu_s(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

static double wall_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A blocking RD sender whose receiver stops (SIGSTOP: no more acknowledgements): once its
 * window is full, sendto waits for acks that do not come. It must wait, not spin: "rdstall
 * cpu_frac F" is the CPU it used over `secs` s of that wait, a fraction of one CPU (a wait on
 * the kernel socket's POLLOUT, always true, made it ~1.0). Run preloaded with DGSHIM_MODE=rd. */
/* "fdcost rdrecv FD SIG": a bound UDP socket whose address goes to descriptor FD; receives one
 * datagram, then raises SIG. */
static int run_rdrecv(int wfd, int sig)
{
	int r = udp_bound();
	struct sockaddr_in a;
	socklen_t al = sizeof a;
	getsockname(r, (struct sockaddr *)&a, &al);
	char b[1024];
	if (write(wfd, &a, sizeof a) != sizeof a || recv(r, b, sizeof b, 0) < 0)
		return 1;
	raise(sig);
	return 0;
}

/* A receiver process (run_rdrecv) that receives one datagram (sent by s to *to) and then raises
 * sig (SIGSTOP: it stops acknowledging; SIGKILL: its socket is gone): a new image (exec), as
 * another program would be, or with forked a child of this process (its registry names are
 * its own, registry.c: they vanish with it). Returns its pid once the signal took effect, or
 * -1. */
static pid_t receiver_then(int sig, int *s, struct sockaddr_in *to, bool forked)
{
	int pp[2];
	if (pipe(pp))
		return FAIL("pipe: %s", strerror(errno)), -1;
	/* forked: the child must be forked from a process whose sockets are named (the case it
	 * checks), so ours comes first, and with it the shim's threads (fdcost.sh does not run it
	 * under a sanitizer: see run_churn); else after the fork */
	*s = forked ? udp_bound() : -1;
	pid_t pid = fork();
	if (pid < 0)
		return FAIL("fork: %s", strerror(errno)), -1;
	if (pid == 0 && forked)
		_exit(run_rdrecv(pp[1], sig));
	if (pid == 0) {
		char fdarg[16], sigarg[16];
		snprintf(fdarg, sizeof fdarg, "%d", pp[1]);
		snprintf(sigarg, sizeof sigarg, "%d", sig);
		execl("/proc/self/exe", "fdcost", "rdrecv", fdarg, sigarg, (char *)NULL);
		_exit(127);
	}
	if (read(pp[0], to, sizeof *to) != sizeof *to)
		return FAIL("the receiver did not start"), -1;
	close(pp[0]), close(pp[1]);
	if (*s < 0)
		*s = udp_bound(); /* after the fork: see run_churn */
	char b[1024] = {0};
	if (sendto(*s, b, sizeof b, 0, (struct sockaddr *)to, sizeof *to) != sizeof b)
		FAIL("first datagram: %s", strerror(errno));
	int st;
	waitpid(pid, &st, sig == SIGSTOP ? WUNTRACED : 0);
	return pid;
}

static int run_rdstall(double secs)
{
	struct sockaddr_in to;
	int s;
	pid_t pid = receiver_then(SIGSTOP, &s, &to, false); /* its datagrams stay unacknowledged */
	if (pid < 0)
		return 1;
	char b[1024] = {0};
	int st, sent = 0;
	struct timeval tv = {0, 20000};
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	/* fill the window; then each sendto waits its 20 ms for room and returns EAGAIN */
	double t0 = 0, c0 = 0, end = wall_s() + secs + 10;
	int stalls = 0;
	while (wall_s() < end) {
		ssize_t r = sendto(s, b, sizeof b, 0, (struct sockaddr *)&to, sizeof to);
		if (r == (ssize_t)sizeof b) {
			sent++;
			continue;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			FAIL("sendto: %s", strerror(errno));
			break;
		}
		if (++stalls == 1)
			t0 = wall_s(), c0 = cpu_s();
		else if (wall_s() - t0 >= secs)
			break;
	}
	double t1 = wall_s(), c1 = cpu_s();
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	if (stalls < 2 || t1 - t0 < secs / 2)
		return FAIL("the sender never waited long for room (%d datagrams sent, %d timeouts)", sent, stalls), 1;
	printf("rdstall sent %d waited_s %.2f cpu_frac %.3f\n", sent, t1 - t0, (c1 - c0) / (t1 - t0));
	return fails ? 1 : 0;
}

/* A blocking RD sender whose receiver on this host was killed after one datagram: n more
 * datagrams to it. The shim sees the receiver's registry name gone and fails what is in flight
 * at once (dgv_qp_peer_gone), then sends plain: "rdkill n N s S" (before, the first window of
 * datagrams held the socket for the retransmissions' ~6 s). Run preloaded with DGSHIM_MODE=rd. */
static int run_rdkill(int n, bool forked)
{
	struct sockaddr_in to;
	int s;
	if (receiver_then(SIGKILL, &s, &to, forked) < 0)
		return 1;
	char b[1024] = {0};
	double t0 = wall_s();
	for (int i = 0; i < n; i++)
		if (sendto(s, b, sizeof b, 0, (struct sockaddr *)&to, sizeof to) != sizeof b)
			return FAIL("datagram %d: %s", i, strerror(errno)), 1;
	printf("rdkill%s n %d s %.3f\n", forked ? "_forked" : "", n, wall_s() - t0);
	return fails ? 1 : 0;
}

/* Sends m pattern bytes (seeded by k) on c and reads them echoed back. Returns 0, or -1 (FAIL said). */
static int echo_check(int c, int k, size_t m)
{
	static uint8_t out[8192], in[8192];
	for (size_t i = 0; i < m; i++)
		out[i] = (uint8_t)(i * 7 + (size_t)k * 13 + 1);
	if (write(c, out, m) != (ssize_t)m)
		return FAIL("connection %d: write: %s", k, strerror(errno)), -1;
	for (size_t got = 0; got < m;) {
		ssize_t r = read(c, in + got, m - got);
		if (r <= 0)
			return FAIL("connection %d: read %zd (%s) after %zu of %zu", k, r, strerror(errno), got, m), -1;
		got += (size_t)r;
	}
	if (memcmp(in, out, m))
		return FAIL("connection %d: the echo differs from what was sent", k), -1;
	return 0;
}

/* n connections (server ends in a forked child), each trades m bytes each way, crossing pages
 * of its rings: kB of RSS per client end then, and again after wait_ms with no call on them
 * (an idle connection's buffers go back under the shim: DGSHIM_STREAM_IDLE_MS); then each
 * trades m bytes more, which must come back whole into the pages given back. */
static int run_tcpidle(int n, int wait_ms, size_t m)
{
	if (m > 8192)
		m = 8192;
	pid_t pid;
	int done;
	long r0 = 0;
	struct sockaddr_in a;
	int *cs = tcp_begin(n, &pid, &done, &a);
	if (!cs)
		return 1;
	for (int i = -1; i < n && !fails; i++) {
		if (i == 0)
			r0 = rss_kb();
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) {
			FAIL("connect #%d: %s", i, strerror(errno));
			break;
		}
		if (i >= 0)
			cs[i] = c;
		echo_check(c, i, m);
	}
	long r1 = rss_kb();
	usleep((useconds_t)wait_ms * 1000);
	long r2 = rss_kb();
	for (int i = 0; i < n && !fails; i++)
		echo_check(cs[i], i + n, m);
	long r3 = rss_kb();
	printf("tcpidle %d busy_kb %.2f idle_kb %.2f again_kb %.2f\n", n, (double)(r1 - r0) / n, (double)(r2 - r0) / n,
	       (double)(r3 - r0) / n);
	for (int i = 0; i < n; i++)
		close(cs[i]);
	free(cs);
	close(done);
	waitpid(pid, NULL, 0);
	return fails ? 1 : 0;
}

/* n + 1 connections trade a byte each way, then are closed one after another: the time the
 * closes took, per close. The server must see each end as an EOF (no reset) within 10 s. */
static int run_tcpclose(int n)
{
	pid_t pid;
	int done;
	struct sockaddr_in a;
	server_ends_exit = true;
	unsigned port = tcp_server_start(n, &pid, &done); /* n + 1 connections */
	int *cs = port ? calloc((size_t)n + 1, sizeof(int)) : NULL;
	if (!cs)
		return 1;
	a = lo((int)port);
	for (int i = 0; i <= n && !fails; i++) {
		char b = 'x';
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) || write(c, &b, 1) != 1 || read(c, &b, 1) != 1)
			FAIL("connection %d: %s", i, strerror(errno));
		cs[i] = c;
	}
	double t0 = wall_s();
	for (int i = 0; i <= n; i++)
		close(cs[i]);
	double dt = wall_s() - t0;
	printf("tcpclose %d close_ms %.3f\n", n + 1, dt * 1000 / (n + 1));
	int st = -1;
	for (int i = 0; i < 1000 && waitpid(pid, &st, WNOHANG) == 0; i++)
		usleep(10000);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		FAIL("the server did not read the end of every connection as EOF within 10 s (status %#x)", st);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	close(done);
	free(cs);
	return fails ? 1 : 0;
}

/* Microseconds per epoll_wait(ep, 0) over k rounds (nothing may be ready: a FAIL if it is). */
static double wait_us(int ep, int k)
{
	struct epoll_event ev[16];
	double t0 = wall_s();
	for (int i = 0; i < k; i++) {
		int r = epoll_wait(ep, ev, 16, 0);
		if (r != 0) {
			FAIL("epoll_wait on idle connections: %d (%s)", r, r < 0 ? strerror(errno) : "ready");
			break;
		}
	}
	return (wall_s() - t0) * 1e6 / k;
}

/* n idle connections in one epoll instance: what a wait with nothing ready costs with n/10 and
 * with n registered, and what a MOD costs. */
static int run_epollwait(int n)
{
	struct rlimit rl;
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max; /* the server child inherits it */
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)n + 200)
		n = rl.rlim_cur > 400 ? (int)rl.rlim_cur - 200 : 200; /* the figure says how many */
	pid_t pid;
	int done;
	struct sockaddr_in a;
	int *cs = tcp_begin(n - 1, &pid, &done, &a); /* n connections: the server's n - 1 + 1 */
	int ep = epoll_create1(0);
	if (!cs || ep < 0)
		return 1;
	int *all = calloc((size_t)n, sizeof(int));
	for (int i = 0; i < n && !fails; i++) {
		char b = 'x';
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) || write(c, &b, 1) != 1 || read(c, &b, 1) != 1)
			FAIL("connection %d: %s", i, strerror(errno));
		all[i] = c;
	}
	const int k = 20000;
	double small = 0, big = 0, mod = 0;
	for (int step = 0; step < 2 && !fails; step++) {
		for (int i = step ? n / 10 : 0; i < (step ? n : n / 10); i++) {
			struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
			if (epoll_ctl(ep, EPOLL_CTL_ADD, all[i], &ev))
				FAIL("epoll_ctl ADD %d: %s", i, strerror(errno));
		}
		wait_us(ep, 100); /* what the ADDs reported (nothing) is looked at once */
		*(step ? &big : &small) = wait_us(ep, k);
	}
	double t0 = wall_s();
	for (int i = 0; i < k && !fails; i++) {
		struct epoll_event ev = {.events = EPOLLIN | (i & 1 ? EPOLLRDHUP : 0), .data.u32 = (uint32_t)(i % n)};
		if (epoll_ctl(ep, EPOLL_CTL_MOD, all[i % n], &ev))
			FAIL("epoll_ctl MOD: %s", strerror(errno));
	}
	mod = (wall_s() - t0) * 1e6 / k;
	printf("epollwait %d small_us %.3f big_us %.3f mod_us %.3f\n", n, small, big, mod);
	for (int i = 0; i < n; i++)
		close(all[i]);
	close(ep);
	free(all);
	free(cs);
	close(done);
	waitpid(pid, NULL, 0);
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "udp"))
		return run_udp(atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "tcp"))
		return run_tcp(atoi(argv[2]));
	if (argc >= 5 && !strcmp(argv[1], "tcpidle"))
		return run_tcpidle(atoi(argv[2]), atoi(argv[3]), (size_t)atol(argv[4]));
	if (argc >= 3 && !strcmp(argv[1], "tcpclose"))
		return run_tcpclose(atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "epollwait") && atoi(argv[2]) >= 20)
		return run_epollwait(atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "tcprr"))
		return run_tcprr(atoi(argv[2]));
	if (argc >= 2 && !strcmp(argv[1], "move"))
		return run_move();
	if (argc >= 3 && !strcmp(argv[1], "dests"))
		return run_dests(atoi(argv[2]));
	if (argc >= 4 && !strcmp(argv[1], "rdrecv"))
		return run_rdrecv(atoi(argv[2]), atoi(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "rdkill"))
		return run_rdkill(atoi(argv[2]), argc >= 4 && !strcmp(argv[3], "fork"));
	if (argc >= 3 && !strcmp(argv[1], "rdstall"))
		return run_rdstall(atof(argv[2]));
	if (argc >= 5 && !strcmp(argv[1], "churn"))
		return run_churn(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: fdcost udp N | tcp N | tcpidle N WAIT_MS BYTES | tcpclose N | epollwait N | tcprr N | move | dests N | churn ROUNDS N GAP_MS | rdstall SECONDS | rdkill N [fork]\n");
	return 2;
}
