/*
 * exiteof: tests/integration/exiteof.py in C for the VM test bed (its guest has no Python): a
 * writer sends N bytes on TCP and then ends in one of six ways, and a reader must read exactly
 * those bytes and then end of file (issue "Hardening", item 3). Plain BSD sockets, nothing of the
 * project: scripts/vm-test runs both ends under libdgshim.so on a device's address.
 *
 *   exiteof read HOST PORT N          accept one connection, read to the end (20 s without a
 *                                     byte is a failure), print "COUNT EOF|error same|DIFFERENT
 *                                     bytes"; exit 0 only for N bytes, as written, then EOF
 *   exiteof write HOST PORT N HOW     connect, write N bytes (writes of 1 B - 64 KiB), then HOW:
 *                                     close (and return), shutdown (SHUT_WR, wait for the
 *                                     reader's end, return), return (from main, socket open),
 *                                     exit (exit(0)), _exit (_exit(0)), kill (SIGKILL itself)
 *
 * Byte i of the stream is (i + (i >> 8) * 7 + (i >> 16) * 13) & 255: a lost or repeated block
 * of any size below 16 MiB changes what follows it. Exit 2: usage or set-up error.
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
#include <sys/socket.h>
#include <unistd.h>

static unsigned char pat(uint64_t i) { return (unsigned char)(i + (i >> 8) * 7 + (i >> 16) * 13); }

static int die(const char *what)
{
	fprintf(stderr, "exiteof: %s: %s\n", what, strerror(errno));
	return 2;
}

static volatile uint64_t got_so_far;
static volatile int in_call = 3; /* 1 in poll, 2 in read, 3 before the connection */

/* SIGTERM (the test's timeout): say where the reader was, then end (async-signal-safe). */
static void on_term(int sig)
{
	char m[96], d[24];
	int k = 0, j = 0;
	uint64_t v = got_so_far;
	do
		d[j++] = (char)('0' + v % 10);
	while ((v /= 10) && j < 20);
	const char *a = "stopped by a signal after ", *b = in_call == 3   ? " bytes, before accept returned\n"
						      : in_call == 2 ? " bytes, in read\n"
								     : " bytes, in poll\n";
	while (*a)
		m[k++] = *a++;
	while (j)
		m[k++] = d[--j];
	while (*b && k < (int)sizeof m)
		m[k++] = *b++;
	(void)!write(1, m, (size_t)k);
	_exit(128 + sig);
}

static int do_read(const struct sockaddr_in *a, uint64_t n)
{
	signal(SIGTERM, on_term);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(l, (const struct sockaddr *)a, sizeof *a) < 0 || listen(l, 1) < 0)
		return die("listen");
	printf("listening\n");
	fflush(stdout);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		return die("accept");
	static unsigned char buf[1 << 16];
	uint64_t got = 0, bad_at = UINT64_MAX;
	const char *how = "EOF";
	char err[96];
	for (;;) {
		struct pollfd p = {.fd = c, .events = POLLIN};
		in_call = 1;
		int pr = poll(&p, 1, 20000);
		if (pr == 0) {
			how = "timeout (20 s without a byte or an end)";
			break;
		}
		if (pr < 0 && errno == EINTR)
			continue;
		in_call = 2;
		ssize_t r = read(c, buf, sizeof buf);
		in_call = 0;
		if (r == 0)
			break;
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			snprintf(err, sizeof err, "error %s", strerror(errno));
			how = err;
			break;
		}
		for (ssize_t k = 0; k < r && bad_at == UINT64_MAX; k++)
			if (buf[k] != pat(got + (uint64_t)k))
				bad_at = got + (uint64_t)k;
		got += (uint64_t)r;
		got_so_far = got;
	}
	bool ok = got == n && strcmp(how, "EOF") == 0 && bad_at == UINT64_MAX;
	if (bad_at == UINT64_MAX)
		printf("%llu %s same bytes\n", (unsigned long long)got, how);
	else
		printf("%llu %s DIFFERENT bytes from offset %llu\n", (unsigned long long)got, how,
		       (unsigned long long)bad_at);
	fflush(stdout);
	close(c);
	close(l);
	return ok ? 0 : 1;
}

static int do_write(const struct sockaddr_in *a, uint64_t n, const char *how)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (const struct sockaddr *)a, sizeof *a) < 0)
		return die("connect");
	static unsigned char buf[1 << 16];
	uint64_t off = 0, x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
	while (off < n) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t len = (size_t)(1 + (x >> 40) % sizeof buf); /* mixed sizes, as programs write */
		if (len > n - off)
			len = (size_t)(n - off);
		for (size_t k = 0; k < len; k++)
			buf[k] = pat(off + k);
		ssize_t w = write(s, buf, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return die("write");
		}
		off += (uint64_t)w;
	}
	/* every write returned: from here on the bytes are the kernel's (natively) to deliver */
	if (strcmp(how, "close") == 0) {
		if (close(s) < 0)
			return die("close");
	} else if (strcmp(how, "shutdown") == 0) {
		if (shutdown(s, SHUT_WR) < 0)
			return die("shutdown");
		char c;
		while (read(s, &c, 1) < 0 && errno == EINTR)
			;
	} else if (strcmp(how, "exit") == 0) {
		exit(0);
	} else if (strcmp(how, "_exit") == 0) {
		_exit(0);
	} else if (strcmp(how, "kill") == 0) {
		kill(getpid(), SIGKILL);
	} else if (strcmp(how, "return") != 0) {
		fprintf(stderr, "exiteof: unknown way to end '%s'\n", how);
		return 2;
	}
	return 0;
}

int main(int argc, char **argv)
{
	bool rd = argc == 5 && strcmp(argv[1], "read") == 0;
	if (!rd && !(argc == 6 && strcmp(argv[1], "write") == 0)) {
		fprintf(stderr, "usage: exiteof read HOST PORT N | exiteof write HOST PORT N "
				"close|shutdown|return|exit|_exit|kill\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "exiteof: not an IPv4 address: %s\n", argv[2]);
		return 2;
	}
	uint64_t n = strtoull(argv[4], NULL, 0);
	signal(SIGPIPE, SIG_IGN);
	return rd ? do_read(&a, n) : do_write(&a, n, argv[5]);
}
