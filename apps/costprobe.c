/*
 * costprobe.c - what one socket costs a process: descriptors and resident memory per UDP socket
 * and per TCP connection, measured the same way natively and under LD_PRELOAD=libdgshim.so
 * (issue 14: "<= 0.1 extra descriptors per taken socket, an idle taken UDP socket <= 8 kB RSS,
 * a carried idle TCP connection <= 16 kB"). scripts/bench's cost section runs it both ways.
 *
 *   costprobe [-u N] [-t M] [-p PORT]
 *       Starts a peer (this program again, as a child: --peer) with a UDP socket bound to
 *       127.0.0.1:PORT and a TCP listener on 127.0.0.1:PORT. Then, measuring its own open
 *       descriptors (/proc/self/fd) and VmRSS after each step:
 *         base   nothing opened yet;
 *         udp1   one UDP socket bound to 127.0.0.1:0 that sent a 16-byte datagram to the peer
 *                (under the shim the first taken socket also pays the per-process set-up);
 *         udp    N more such sockets;
 *         tcp1   one TCP connection to the peer that sent one byte;
 *         tcp    M more such connections.
 *       The slope between udp1 and udp (tcp1 and tcp) is the cost of one more socket. The peer
 *       reports the same for the connections it accepted (peer_base, peer_tcp).
 *       Under the shim every socket is then asked whether it was really carried: a UDP socket
 *       whose IWARP_STATS say tx_framed >= 1, a TCP socket whose IWARP_TAKEN is 1.
 *   Defaults: N = 1000, M = 1000, PORT = 19700. The soft descriptor limit is raised to the
 *   hard one (RLIMIT_NOFILE); a limit too low for the plan is an error before anything opens.
 *
 * Output (stdout, one fact per line, "key=value" words; counts are absolute, RSS in kB):
 *   costprobe: mode=shim|native udp=N tcp=M port=PORT
 *   phase NAME fds=F rss_kb=R ms=T      (NAME: base udp1 udp tcp1 tcp peer_base peer_tcp;
 *                                        T the phase's time, 0 for the first of a process)
 *   carried udp=K/N+1 tcp=K/M+1          (mode=native: "carried udp=native tcp=native")
 *   per_socket udp fds=X rss_kb=Y        (the slopes, for people; scripts compute their own)
 *   per_socket tcp fds=X rss_kb=Y
 *   per_socket tcp_accepted fds=X rss_kb=Y
 *   idle wakeups=W ms=T                  (context switches of all this process's threads while
 *                                        its main thread sleeps T ms with every socket open and
 *                                        idle: natively 1, the sleep itself)
 * With COSTPROBE_SMAPS=DIR each phase also copies /proc/self/smaps to DIR/NAME.smaps (where the
 * memory is: which mappings grew).
 * Exit status: 0 ok, 1 a socket call or the peer failed (stderr says which), 2 usage.
 * Plain libc only, except dgshim.h's option numbers (they fail natively, which says "native").
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dgshim.h"

static void die(const char *what)
{
	fprintf(stderr, "costprobe: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Open descriptors of this process, not counting the directory stream that counts them. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		die("opendir /proc/self/fd");
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

/* VmRSS of this process in kB (all threads), -1 if /proc does not say. */
static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return -1;
	char line[256];
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

static struct timespec last; /* when the previous measurement ended */

struct point {
	int fds;
	long rss;
};

static double ms_since(const struct timespec *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) * 1e3 + (double)(now.tv_nsec - t->tv_nsec) / 1e6;
}

/* COSTPROBE_SMAPS=DIR: a copy of /proc/self/smaps at each phase, DIR/NAME.smaps, to see
 * which mappings a socket's memory is in (the slopes say how much, not where). */
static void save_smaps(const char *name)
{
	const char *dir = getenv("COSTPROBE_SMAPS");
	if (!dir || !*dir)
		return;
	char path[4096];
	snprintf(path, sizeof path, "%s/%s.smaps", dir, name);
	FILE *in = fopen("/proc/self/smaps", "r"), *to = fopen(path, "w");
	char buf[65536];
	size_t n;
	while (in && to && (n = fread(buf, 1, sizeof buf, in)) > 0)
		if (fwrite(buf, 1, n, to) != n)
			break;
	if (!in || !to)
		fprintf(stderr, "costprobe: COSTPROBE_SMAPS: %s: %s\n", in ? path : "/proc/self/smaps", strerror(errno));
	if (in)
		fclose(in);
	if (to)
		fclose(to);
}

/* Context switches of every thread of this process so far (a thread's each sleep is one): what
 * an idle process costs the machine beyond its memory. */
static long switches(void)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		die("opendir /proc/self/task");
	long n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[300], line[128];
		snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue; /* a thread that ended meanwhile */
		long v;
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1 ||
			    sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
				n += v;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Prints a phase line with the time the phase took (ms, since the previous measurement);
 * returns the point. Measures after a 100 ms pause: a provider thread may still be finishing
 * what the last call started. */
static struct point measure(const char *name, FILE *out)
{
	double ms = last.tv_sec ? ms_since(&last) : 0;
	struct timespec ts = {0, 100 * 1000 * 1000};
	nanosleep(&ts, NULL);
	struct point p = {count_fds(), rss_kb()};
	fprintf(out, "phase %s fds=%d rss_kb=%ld ms=%.0f\n", name, p.fds, p.rss, ms);
	fflush(out);
	save_smaps(name);
	clock_gettime(CLOCK_MONOTONIC, &last);
	return p;
}

static void raise_nofile(long need)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &r))
		die("getrlimit");
	r.rlim_cur = r.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &r))
		die("setrlimit RLIMIT_NOFILE");
	if (r.rlim_cur != RLIM_INFINITY && (long)r.rlim_cur < need) {
		fprintf(stderr, "costprobe: descriptor limit %ld is below the %ld this plan may need (at "
				"up to 6 per socket): ask for fewer sockets\n", (long)r.rlim_cur, need);
		exit(1);
	}
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((unsigned short)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

/* The peer: a UDP socket and a listener on PORT; accepts `expect` connections and keeps them,
 * reads and drops datagrams and each connection's byte, writes its measurements to stdout (the parent's pipe), and ends
 * when stdin (the parent's other pipe) reaches end of file. Returns the exit status. */
static int peer(int port, int expect)
{
	raise_nofile(16 + 6L * expect);
	struct sockaddr_in a = loopback(port);
	int one = 1;
	int u = socket(AF_INET, SOCK_DGRAM, 0);
	if (u < 0 || bind(u, (struct sockaddr *)&a, sizeof a))
		die("peer: UDP socket on the port");
	int l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
	    bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, expect + 16))
		die("peer: TCP listener on the port");
	int *conns = calloc((size_t)expect + 1, sizeof *conns);
	if (!conns)
		die("peer: calloc");
	int n = 0;
	measure("peer_base", stdout);
	for (;;) {
		struct pollfd p[3] = {{.fd = 0, .events = POLLIN}, {.fd = u, .events = POLLIN},
				      {.fd = l, .events = POLLIN}};
		if (poll(p, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("peer: poll");
		}
		if (p[1].revents & POLLIN) {
			char buf[2048];
			while (recv(u, buf, sizeof buf, MSG_DONTWAIT) >= 0)
				;
		}
		if (p[2].revents & POLLIN) {
			int c = accept(l, NULL, NULL);
			if (c < 0 && errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				die("peer: accept");
			if (c >= 0) {
				/* the client's byte follows its connect at once: read it, so the
				 * connection is idle with nothing unread (as a server's would be) */
				struct pollfd q = {.fd = c, .events = POLLIN};
				char b;
				if (poll(&q, 1, 5000) != 1 || recv(c, &b, 1, 0) != 1)
					die("peer: the client's byte on an accepted connection");
				if (n < expect)
					conns[n++] = c;
				else
					close(c);
			}
			if (c >= 0 && n == expect)
				measure("peer_tcp", stdout);
		}
		if (p[0].revents & (POLLIN | POLLHUP)) {
			char b;
			if (read(0, &b, 1) <= 0)
				break;
		}
	}
	/* the connections end with the process, as a server's usually do (an explicit close of
	 * each would measure the shim's close path, not what an idle connection costs) */
	free(conns);
	return 0;
}

/* A line from the peer's report pipe into buf (NUL-terminated, newline kept), waiting at most
 * ms milliseconds for each byte. Returns 0, or -1 on timeout, end of file or a full buffer. */
static int peer_line(int fd, char *buf, int len, int ms)
{
	for (int n = 0; n < len - 1;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, ms) <= 0 || read(fd, buf + n, 1) != 1)
			return -1;
		if (buf[n++] == '\n') {
			buf[n] = 0;
			return 0;
		}
	}
	return -1;
}

static int one_udp(const struct sockaddr_in *peer_a)
{
	struct sockaddr_in a = loopback(0);
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0)
		die("UDP socket");
	if (bind(s, (struct sockaddr *)&a, sizeof a))
		die("UDP bind 127.0.0.1:0");
	char msg[16] = "costprobe udp";
	if (sendto(s, msg, sizeof msg, 0, (const struct sockaddr *)peer_a, sizeof *peer_a) != (ssize_t)sizeof msg)
		die("UDP sendto the peer");
	return s;
}

static int one_tcp(const struct sockaddr_in *peer_a)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("TCP socket");
	if (connect(s, (const struct sockaddr *)peer_a, sizeof *peer_a))
		die("TCP connect to the peer");
	if (send(s, "c", 1, MSG_NOSIGNAL) != 1)
		die("TCP send to the peer");
	return s;
}

static void usage(void)
{
	fprintf(stderr, "usage: costprobe [-u UDP_SOCKETS] [-t TCP_CONNECTIONS] [-p PORT]\n");
	exit(2);
}

static int num(const char *s, int lo, int hi)
{
	char *e;
	long v = strtol(s, &e, 10);
	if (!*s || *e || v < lo || v > hi)
		usage();
	return (int)v;
}

int main(int argc, char **argv)
{
	int nu = 1000, nt = 1000, port = 19700;
	if (argc == 4 && !strcmp(argv[1], "--peer"))
		return peer(num(argv[2], 1, 65535), num(argv[3], 1, 1000000));
	int o;
	while ((o = getopt(argc, argv, "u:t:p:")) != -1) {
		if (o == 'u')
			nu = num(optarg, 1, 100000);
		else if (o == 't')
			nt = num(optarg, 1, 100000);
		else if (o == 'p')
			port = num(optarg, 1024, 65535);
		else
			usage();
	}
	if (optind != argc)
		usage();
	raise_nofile(32 + 6L * (nu + nt + 2));
	signal(SIGPIPE, SIG_IGN);

	/* the peer, a fresh process image: stdin our control pipe, stdout its report pipe */
	int ctl[2], rep[2];
	if (pipe2(ctl, O_CLOEXEC) || pipe2(rep, O_CLOEXEC))
		die("pipe2");
	char ps[16], es[16];
	snprintf(ps, sizeof ps, "%d", port);
	snprintf(es, sizeof es, "%d", nt + 1);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (dup2(ctl[0], 0) < 0 || dup2(rep[1], 1) < 0)
			_exit(1);
		char *args[] = {argv[0], "--peer", ps, es, NULL};
		execv("/proc/self/exe", args);
		fprintf(stderr, "costprobe: exec of the peer: %s\n", strerror(errno));
		_exit(1);
	}
	close(ctl[0]);
	close(rep[1]);
	char line[256];
	if (peer_line(rep[0], line, sizeof line, 20000)) {
		fprintf(stderr, "costprobe: the peer did not start (no report within 20 s)\n");
		return 1;
	}
	fputs(line, stdout); /* phase peer_base */

	int probe = socket(AF_INET, SOCK_DGRAM, 0), mode = 0;
	socklen_t ml = sizeof mode;
	int shim = probe >= 0 && getsockopt(probe, SOL_IWARP, IWARP_MODE, &mode, &ml) == 0;
	if (probe >= 0)
		close(probe);
	printf("costprobe: mode=%s udp=%d tcp=%d port=%d\n", shim ? "shim" : "native", nu, nt, port);

	int *us = calloc((size_t)nu + 1, sizeof *us), *ts = calloc((size_t)nt + 1, sizeof *ts);
	if (!us || !ts)
		die("calloc");
	struct sockaddr_in pa = loopback(port);
	measure("base", stdout);
	us[0] = one_udp(&pa);
	struct point u1 = measure("udp1", stdout);
	for (int i = 1; i <= nu; i++)
		us[i] = one_udp(&pa);
	struct point u2 = measure("udp", stdout);
	ts[0] = one_tcp(&pa);
	struct point t1 = measure("tcp1", stdout);
	for (int i = 1; i <= nt; i++)
		ts[i] = one_tcp(&pa);
	struct point t2 = measure("tcp", stdout);

	/* the peer measures once it accepted every connection */
	struct point pb = {0, 0}, pt = {0, 0};
	sscanf(line, "phase peer_base fds=%d rss_kb=%ld ", &pb.fds, &pb.rss);
	if (peer_line(rep[0], line, sizeof line, 20000) ||
	    sscanf(line, "phase peer_tcp fds=%d rss_kb=%ld", &pt.fds, &pt.rss) != 2) {
		fprintf(stderr, "costprobe: the peer did not report its %d accepted connections\n", nt + 1);
		return 1;
	}
	fputs(line, stdout);

	if (shim) {
		int fu = 0, ft = 0;
		for (int i = 0; i <= nu; i++) {
			struct iwarp_stats st;
			socklen_t l = sizeof st;
			if (getsockopt(us[i], SOL_IWARP, IWARP_STATS, &st, &l) == 0 && st.tx_framed >= 1)
				fu++;
		}
		for (int i = 0; i <= nt; i++) {
			int v = 0;
			socklen_t l = sizeof v;
			if (getsockopt(ts[i], SOL_IWARP, IWARP_TAKEN, &v, &l) == 0 && v == 1)
				ft++;
		}
		printf("carried udp=%d/%d tcp=%d/%d\n", fu, nu + 1, ft, nt + 1);
	} else {
		printf("carried udp=native tcp=native\n");
	}
	printf("per_socket udp fds=%.3f rss_kb=%.2f\n", (double)(u2.fds - u1.fds) / nu, (double)(u2.rss - u1.rss) / nu);
	printf("per_socket tcp fds=%.3f rss_kb=%.2f\n", (double)(t2.fds - t1.fds) / nt, (double)(t2.rss - t1.rss) / nt);
	printf("per_socket tcp_accepted fds=%.3f rss_kb=%.2f\n", (double)(pt.fds - pb.fds) / (nt + 1),
	       (double)(pt.rss - pb.rss) / (nt + 1));
	fflush(stdout);

	long w0 = switches();
	struct timespec idle = {1, 0};
	nanosleep(&idle, NULL);
	printf("idle wakeups=%ld ms=1000\n", switches() - w0);
	fflush(stdout);

	free(us);
	free(ts);
	/* the peer's end of file: it exits; our sockets end with this process, as the peer's */
	close(ctl[1]);
	close(rep[0]);
	int st;
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "costprobe: the peer failed (status %#x)\n", st);
		return 1;
	}
	return 0;
}
