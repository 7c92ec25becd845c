/*
 * daemonclose - a daemon-like program that closes every descriptor after making sockets and
 * goes on without exec (issue "Hardening" items 5 and 7), natively or under the shim.
 *
 *   daemonclose METHOD     METHOD: close_range, closefrom, loop (close 3..limit one by one),
 *                          procfd (close each number /proc/self/fd lists), dup2 (dup2 /dev/null
 *                          over every number 3..limit that is open, then close them)
 *   daemonclose nofile     RLIMIT_NOFILE 64: how many UDP sockets the program can open and use
 *   daemonclose aslimit    RLIMIT_AS 24 MiB above what the program has: UDP sockets still work
 *                          (plain), a TCP connect works or fails with ENOMEM: "aslimit used N of 4
 *                          tcp ok|ENOMEM|<error>"
 *
 * METHOD: forks an echo server (UDP and TCP on ephemeral loopback ports) before it makes any
 * socket, then talks to it (UDP ping-pong, a TCP echo), closes every descriptor from 3 up the
 * way METHOD says, and then must still work as natively: socket() gives back number 3 (the
 * lowest free: the shim's own descriptors did not take the program's numbers), 200 datagrams
 * and 1 MiB over a new TCP connection come back exact. Prints "ok METHOD" and exits 0.
 * nofile: prints "nofile opened N used M" (N sockets opened before EMFILE, each used as soon
 * as it was made; M of them echoed two datagrams through the server child).
 * Exit 1 on any mismatch, with the reason on stderr.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c, ...)                                                                              \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "daemonclose: " __VA_ARGS__);                              \
			fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));               \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static struct sockaddr_in lo_addr(unsigned port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static unsigned port_of(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	CHECK(getsockname(fd, (struct sockaddr *)&a, &l) == 0, "getsockname");
	return ntohs(a.sin_port);
}

/* The echo server: UDP datagrams back to their sender, TCP connections echoed until EOF. */
static void serve(int wr)
{
	int u = socket(AF_INET, SOCK_DGRAM, 0), l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = lo_addr(0);
	CHECK(u >= 0 && l >= 0, "server sockets");
	CHECK(bind(u, (struct sockaddr *)&a, sizeof a) == 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 &&
		      listen(l, 64) == 0, "server bind/listen");
	unsigned ports[2] = {port_of(u), port_of(l)};
	CHECK(write(wr, ports, sizeof ports) == sizeof ports, "server ports");
	close(wr);
	static char buf[65536];
	struct pollfd p[66];
	int n = 2;
	p[0] = (struct pollfd){.fd = u, .events = POLLIN};
	p[1] = (struct pollfd){.fd = l, .events = POLLIN};
	for (;;) {
		if (poll(p, (nfds_t)n, -1) < 0)
			continue;
		if (p[0].revents & POLLIN) {
			struct sockaddr_in from;
			socklen_t fl = sizeof from;
			ssize_t r = recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
			if (r >= 0)
				sendto(u, buf, (size_t)r, 0, (struct sockaddr *)&from, fl);
		}
		if ((p[1].revents & POLLIN) && n < 66) {
			int c = accept(l, NULL, NULL);
			if (c >= 0)
				p[n++] = (struct pollfd){.fd = c, .events = POLLIN};
		}
		for (int i = 2; i < n; i++) {
			if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t r = read(p[i].fd, buf, sizeof buf);
			size_t off = 0;
			while (r > 0 && off < (size_t)r) {
				ssize_t w = write(p[i].fd, buf + off, (size_t)r - off);
				if (w <= 0)
					break;
				off += (size_t)w;
			}
			if (r <= 0) {
				close(p[i].fd);
				p[i--] = p[--n];
			}
		}
	}
}

static pid_t start_server(unsigned ports[2])
{
	int pp[2];
	CHECK(pipe(pp) == 0, "pipe");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(pp[0]);
		serve(pp[1]);
		_exit(0);
	}
	close(pp[1]);
	CHECK(read(pp[0], ports, 2 * sizeof *ports) == (ssize_t)(2 * sizeof *ports), "reading the server's ports");
	close(pp[0]);
	return pid;
}

/* n datagrams of growing size to the echo server and back, byte-exact. Returns 0 or -1. */
static int udp_pingpong(int u, unsigned port, int n)
{
	struct sockaddr_in a = lo_addr(port);
	char out[1400], in[1500];
	for (int i = 0; i < n; i++) {
		size_t len = 1 + (size_t)(i * 37) % sizeof out;
		for (size_t k = 0; k < len; k++)
			out[k] = (char)(i + k * 7);
		if (sendto(u, out, len, 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)len)
			return -1;
		struct pollfd p = {.fd = u, .events = POLLIN};
		if (poll(&p, 1, 5000) != 1)
			return -1;
		ssize_t r = recv(u, in, sizeof in, 0);
		if (r != (ssize_t)len || memcmp(in, out, len))
			return -1;
	}
	return 0;
}

/* A new TCP connection: len bytes out and back, byte-exact, then closed. Returns 0 or -1. */
static int tcp_echo(unsigned port, size_t len)
{
	int c = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = lo_addr(port);
	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a))
		return -1;
	char *out = malloc(len), *in = malloc(len);
	for (size_t k = 0; k < len; k++)
		out[k] = (char)(k * 13 + 5);
	size_t sent = 0, got = 0;
	int rc = 0;
	while (got < len) {
		struct pollfd p = {.fd = c, .events = POLLIN | (sent < len ? POLLOUT : 0)};
		if (poll(&p, 1, 10000) != 1) {
			rc = -1;
			break;
		}
		if ((p.revents & POLLOUT) && sent < len) {
			ssize_t w = send(c, out + sent, len - sent > 65536 ? 65536 : len - sent, MSG_DONTWAIT);
			if (w > 0)
				sent += (size_t)w;
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t r = recv(c, in + got, len - got, MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN)) {
				rc = -1;
				break;
			}
			if (r > 0)
				got += (size_t)r;
		}
	}
	if (!rc && memcmp(in, out, len))
		rc = -1;
	free(out);
	free(in);
	close(c);
	return rc;
}

static void close_all(const char *how)
{
	int lim = (int)sysconf(_SC_OPEN_MAX);
	if (!strcmp(how, "close_range")) {
		CHECK(close_range(3, ~0u, 0) == 0, "close_range(3, ~0)");
	} else if (!strcmp(how, "closefrom")) {
		closefrom(3);
	} else if (!strcmp(how, "loop")) {
		for (int fd = 3; fd < lim; fd++)
			close(fd);
	} else if (!strcmp(how, "procfd") || !strcmp(how, "dup2")) {
		/* as daemons that read the list first: numbers collected, then each one handled */
		static int fds[65536];
		int n = 0;
		DIR *d = opendir("/proc/self/fd");
		CHECK(d, "opendir /proc/self/fd");
		struct dirent *e;
		while ((e = readdir(d)) && n < 65536) {
			int fd = atoi(e->d_name);
			if (e->d_name[0] != '.' && fd >= 3 && fd != dirfd(d))
				fds[n++] = fd;
		}
		closedir(d);
		int nul = open("/dev/null", O_RDWR);
		CHECK(nul >= 0, "open /dev/null");
		for (int i = 0; i < n; i++) {
			if (fds[i] == nul)
				continue;
			if (!strcmp(how, "dup2"))
				dup2(nul, fds[i]); /* refused (EBUSY) on the shim's own numbers */
			close(fds[i]);
		}
		close(nul);
	} else {
		fprintf(stderr, "daemonclose: unknown method %s\n", how);
		exit(2);
	}
}

static int run_method(const char *how)
{
	unsigned ports[2];
	pid_t srv = start_server(ports);
	int u = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(u >= 0, "udp socket");
	CHECK(udp_pingpong(u, ports[0], 50) == 0, "UDP ping-pong before closing everything");
	CHECK(tcp_echo(ports[1], 256 * 1024) == 0, "TCP echo before closing everything");
	close_all(how);
	/* natively every number from 3 up is free now: so it must be under the shim */
	int n = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(n == 3, "after %s, socket() gave %d, natively 3", how, n);
	CHECK(fcntl(u, F_GETFD) < 0 || u == n, "the old UDP socket %d is still open after %s", u, how);
	CHECK(udp_pingpong(n, ports[0], 200) == 0, "UDP ping-pong after %s", how);
	CHECK(tcp_echo(ports[1], 1 << 20) == 0, "TCP echo after %s", how);
	close(n);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
	printf("ok %s pid %d\n", how, (int)getpid());
	return 0;
}

static int run_nofile(void)
{
	unsigned ports[2];
	struct rlimit rl = {64, 64};
	pid_t srv = start_server(ports); /* before the limit: the server is not what is measured */
	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit 64");
	int n = 0, used = 0;
	while (n < 64) { /* each one used as soon as it is made, as servers do */
		int fd = socket(AF_INET, SOCK_DGRAM, 0);
		if (fd < 0) {
			CHECK(errno == EMFILE, "socket() failed with another error than EMFILE");
			break;
		}
		n++;
		used += udp_pingpong(fd, ports[0], 2) == 0;
	}
	printf("nofile opened %d used %d\n", n, used);
	for (int fd = 3; fd < 64; fd++) /* room for what runs at exit (LeakSanitizer reads /proc) */
		close(fd);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
	return 0;
}

/* The address space limited to what the program has now plus 24 MiB: the shim's queue pair
 * memory (mapped in 64 MiB chunks) cannot be had, the program's own sockets still work. */
static int run_aslimit(void)
{
	unsigned ports[2];
	pid_t srv = start_server(ports); /* before the limit: the server is not what is measured */
	long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	CHECK(f && fscanf(f, "%ld", &pages) == 1, "reading /proc/self/statm");
	fclose(f);
	rlim_t now = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE);
	struct rlimit rl = {now + (24u << 20), now + (24u << 20)};
	CHECK(setrlimit(RLIMIT_AS, &rl) == 0, "setrlimit RLIMIT_AS");
	int used = 0;
	for (int i = 0; i < 4; i++) {
		int u = socket(AF_INET, SOCK_DGRAM, 0);
		CHECK(u >= 0, "udp socket under RLIMIT_AS");
		used += udp_pingpong(u, ports[0], 20) == 0;
		close(u);
	}
	/* a carried connection needs its queue pair after the kernel's connect has begun: when
	 * that fails the connect fails with ENOMEM (no byte was sent either way) */
	errno = 0;
	int tcp = tcp_echo(ports[1], 256 * 1024) == 0;
	printf("aslimit used %d of 4 tcp %s\n", used, tcp ? "ok" : errno == ENOMEM ? "ENOMEM" : strerror(errno));
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: daemonclose close_range|closefrom|loop|procfd|dup2|nofile\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(argv[1], "aslimit"))
		return run_aslimit();
	return !strcmp(argv[1], "nofile") ? run_nofile() : run_method(argv[1]);
}
