/*
 * udpbench.c - a UDP benchmark written the way ordinary programs use UDP: one blocking
 * SOCK_DGRAM socket per side, sendto()/recvfrom(), libc only, no project headers. It is the
 * "unmodified program" that scripts/bench-shim runs natively and under LD_PRELOAD=libdgshim.so.
 *
 *   udpbench server PORT [-b ADDR]
 *       Echoes ping-pong datagrams and counts stream datagrams; runs until SIGINT/SIGTERM and
 *       then returns from main (so atexit handlers and library destructors run). Prints
 *       "udpbench server: listening on ADDR PORT" once bound, and one line per stream session.
 *   udpbench pingpong HOST PORT [-s SIZE] [-n N] [-w WARMUP] [-t SECONDS] [--json]
 *       N timed round trips (after WARMUP untimed ones). Prints the round-trip time (RTT)
 *       min, median, avg, p99 and max in microseconds.
 *   udpbench stream HOST PORT [-s SIZE] [-t SECONDS] [-r RATE] [--json]
 *       Sends SIZE-byte datagrams for SECONDS, as fast as blocking sendto() allows or paced at
 *       RATE datagrams/s, then asks the server for what it received. Prints the send rate, the
 *       receive rate (datagrams the server counted / the server's first-to-last arrival time)
 *       and the loss ((sent - received) / sent).
 *
 * Every datagram starts with a 16-byte header (magic, type, session, sequence; big-endian), so
 * SIZE is at least 16. The stream's control exchange (START/ACK before, END/REPORT after) is
 * retried on a 1 s receive timeout; END travels behind the data, so when the server answers it
 * every surviving datagram has been counted. Exit status: 0 ok, 1 runtime failure, 2 usage.
 */
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x75646231u /* "udb1" */
#define HDR_SIZE 16u
#define CTL_SIZE 64u
#define MAX_SIZE 65507u
#define NS_PER_S 1000000000ull
#define CTL_TIMEOUT_MS 1000
#define CTL_TRIES 5
#define PING_TRIES 5

enum msg_type { T_PING = 1, T_START, T_START_ACK, T_DATA, T_END, T_REPORT };

struct hdr {
	uint32_t magic;
	uint8_t type;
	uint8_t pad[3];
	uint32_t session;
	uint32_t seq;
};

/* END carries the client's counts, REPORT the server's; both follow the header. */
struct counts {
	uint64_t datagrams;
	uint64_t bytes;
	uint64_t first_ns; /* REPORT: first and last arrival, server's CLOCK_MONOTONIC */
	uint64_t last_ns;
};

struct opts {
	unsigned size;
	unsigned long n;
	unsigned long warmup;
	double seconds;
	double rate;
	bool json;
	bool warmup_set;
	const char *bind_addr;
	unsigned long rcvbuf;
};

static volatile sig_atomic_t stop_flag;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void put_hdr(void *buf, uint8_t type, uint32_t session, uint32_t seq)
{
	struct hdr h = { .magic = htobe32(MAGIC), .type = type, .session = htobe32(session),
			 .seq = htobe32(seq) };
	memcpy(buf, &h, sizeof h);
}

/* Returns false if the datagram is not ours. */
static bool get_hdr(const void *buf, ssize_t len, struct hdr *h)
{
	if (len < (ssize_t)HDR_SIZE)
		return false;
	memcpy(h, buf, sizeof *h);
	if (be32toh(h->magic) != MAGIC)
		return false;
	h->session = be32toh(h->session);
	h->seq = be32toh(h->seq);
	return true;
}

static void put_counts(void *buf, const struct counts *c)
{
	uint64_t v[4] = { htobe64(c->datagrams), htobe64(c->bytes), htobe64(c->first_ns),
			  htobe64(c->last_ns) };
	memcpy((char *)buf + HDR_SIZE, v, sizeof v);
}

static void get_counts(const void *buf, struct counts *c)
{
	uint64_t v[4];
	memcpy(v, (const char *)buf + HDR_SIZE, sizeof v);
	c->datagrams = be64toh(v[0]);
	c->bytes = be64toh(v[1]);
	c->first_ns = be64toh(v[2]);
	c->last_ns = be64toh(v[3]);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: udpbench server PORT [-b ADDR] [-R BYTES]\n"
		"       udpbench pingpong HOST PORT [-s SIZE] [-n N] [-w WARMUP] [-t SECONDS] [--json]\n"
		"       udpbench stream HOST PORT [-s SIZE] [-t SECONDS] [-r RATE] [--json]\n"
		"  -s SIZE     datagram size in bytes, %u..%u (default 64 for pingpong, 1316 for stream)\n"
		"  -n N        timed round trips (default 10000)\n"
		"  -w WARMUP   untimed round trips first (default min(1000, N/10))\n"
		"  -t SECONDS  pingpong: stop early after this long; stream: duration (default 3)\n"
		"  -r RATE     stream: pace at RATE datagrams/s (default: as fast as sendto allows)\n"
		"  -b ADDR     server: bind address (default 0.0.0.0; use :: for IPv6)\n"
		"  -R BYTES    server: SO_RCVBUF (default: the system's, net.core.rmem_default)\n"
		"  --json      one JSON line instead of text\n"
		"pingpong prints round-trip times in microseconds; stream prints the send rate, the\n"
		"rate the server received (datagrams/s) and the loss.\n",
		HDR_SIZE, MAX_SIZE);
}

static void die_usage(const char *msg, const char *arg)
{
	fprintf(stderr, "udpbench: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
	usage(stderr);
	exit(2);
}

static unsigned long parse_ulong(const char *s, const char *opt, unsigned long lo, unsigned long hi)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi || s[0] == '-') {
		fprintf(stderr, "udpbench: bad value for %s: %s (%lu..%lu)\n", opt, s, lo, hi);
		exit(2);
	}
	return v;
}

static double parse_double(const char *s, const char *opt)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0) || v > 1e9) {
		fprintf(stderr, "udpbench: bad value for %s: %s (must be > 0)\n", opt, s);
		exit(2);
	}
	return v;
}

static int resolve(const char *host, const char *port, int flags, struct sockaddr_storage *ss,
		   socklen_t *len)
{
	struct addrinfo hints = { .ai_socktype = SOCK_DGRAM, .ai_flags = flags | AI_NUMERICSERV };
	struct addrinfo *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc) {
		fprintf(stderr, "udpbench: %s port %s: %s\n", host ? host : "*", port, gai_strerror(rc));
		return -1;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int set_rcv_timeout(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) {
		perror("udpbench: setsockopt(SO_RCVTIMEO)");
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- server */

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static int run_server(const char *port, const struct opts *o)
{
	struct sockaddr_storage local;
	socklen_t local_len;
	const char *addr = o->bind_addr ? o->bind_addr : "0.0.0.0";
	if (resolve(addr, port, AI_PASSIVE | AI_NUMERICHOST, &local, &local_len))
		return 1;
	int fd = socket(local.ss_family, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("udpbench: socket");
		return 1;
	}
	if (bind(fd, (struct sockaddr *)&local, local_len) < 0) {
		fprintf(stderr, "udpbench: bind %s port %s: %s\n", addr, port, strerror(errno));
		return 1;
	}
	if (o->rcvbuf) {
		int v = (int)o->rcvbuf;
		socklen_t vl = sizeof v;
		if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) < 0)
			perror("udpbench: setsockopt(SO_RCVBUF)");
		else if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &vl) == 0 && (unsigned long)v < o->rcvbuf)
			fprintf(stderr, "udpbench: SO_RCVBUF is %d, less than asked (net.core.rmem_max?)\n", v);
	}
	/* No SA_RESTART: a signal interrupts the blocking recvfrom and we leave main normally. */
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	printf("udpbench server: listening on %s port %s\n", addr, port);
	fflush(stdout);

	static char buf[65536];
	uint32_t session = 0;
	bool have_session = false, reported = false;
	struct counts c = { 0 };
	uint64_t total = 0, foreign = 0, pings = 0;
	while (!stop_flag) {
		struct sockaddr_storage peer;
		socklen_t peer_len = sizeof peer;
		ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&peer, &peer_len);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			perror("udpbench: recvfrom");
			return 1;
		}
		total++;
		struct hdr h;
		if (!get_hdr(buf, n, &h)) {
			foreign++;
			continue;
		}
		switch (h.type) {
		case T_PING:
			pings++;
			if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&peer, peer_len) < 0)
				perror("udpbench: sendto (pong)");
			break;
		case T_START:
			if (!have_session || h.session != session) {
				session = h.session;
				have_session = true;
				reported = false;
				memset(&c, 0, sizeof c);
			}
			put_hdr(buf, T_START_ACK, h.session, h.seq);
			if (sendto(fd, buf, CTL_SIZE, 0, (struct sockaddr *)&peer, peer_len) < 0)
				perror("udpbench: sendto (start ack)");
			break;
		case T_DATA:
			if (have_session && h.session == session) {
				uint64_t t = now_ns();
				if (c.datagrams++ == 0)
					c.first_ns = t;
				c.last_ns = t;
				c.bytes += (uint64_t)n;
			} else {
				foreign++;
			}
			break;
		case T_END: {
			if (!have_session || h.session != session || n < (ssize_t)(HDR_SIZE + sizeof c))
				break;
			struct counts sent;
			get_counts(buf, &sent);
			put_hdr(buf, T_REPORT, h.session, h.seq);
			put_counts(buf, &c);
			if (sendto(fd, buf, CTL_SIZE, 0, (struct sockaddr *)&peer, peer_len) < 0)
				perror("udpbench: sendto (report)");
			if (!reported) {
				double secs = (double)(c.last_ns - c.first_ns) / 1e9;
				printf("udpbench server: session %08" PRIx32 ": received %" PRIu64
				       " of %" PRIu64 " datagrams (%" PRIu64 " bytes) in %.3f s, %.0f datagrams/s\n",
				       session, c.datagrams, sent.datagrams, c.bytes, secs,
				       secs > 0 ? (double)c.datagrams / secs : 0.0);
				fflush(stdout);
				reported = true;
			}
			break;
		}
		default:
			foreign++;
			break;
		}
	}
	printf("udpbench server: exiting after %" PRIu64 " datagrams (%" PRIu64 " pings, %" PRIu64
	       " not ours)\n", total, pings, foreign);
	fflush(stdout);
	close(fd);
	return 0;
}

/* ---------------------------------------------------------------- clients */

struct client {
	int fd;
	struct sockaddr_storage peer;
	socklen_t peer_len;
};

static int client_open(struct client *cl, const char *host, const char *port)
{
	if (resolve(host, port, 0, &cl->peer, &cl->peer_len))
		return -1;
	cl->fd = socket(cl->peer.ss_family, SOCK_DGRAM, 0);
	if (cl->fd < 0) {
		perror("udpbench: socket");
		return -1;
	}
	return set_rcv_timeout(cl->fd, CTL_TIMEOUT_MS);
}

static int send_dg(struct client *cl, const void *buf, size_t len)
{
	for (;;) {
		if (sendto(cl->fd, buf, len, 0, (struct sockaddr *)&cl->peer, cl->peer_len) >= 0)
			return 0;
		if (errno == EINTR)
			continue;
		return -1;
	}
}

/* Waits for a datagram of `type` with `session` and `seq`; 0 ok, 1 timeout, -1 error. */
static int wait_reply(struct client *cl, void *buf, size_t cap, uint8_t type, uint32_t session,
		      uint32_t seq, ssize_t *len)
{
	for (;;) {
		ssize_t n = recvfrom(cl->fd, buf, cap, 0, NULL, NULL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 1;
			perror("udpbench: recvfrom");
			return -1;
		}
		struct hdr h;
		if (get_hdr(buf, n, &h) && h.type == type && h.session == session && h.seq == seq) {
			if (len)
				*len = n;
			return 0;
		}
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int run_pingpong(const char *host, const char *port, const struct opts *o)
{
	struct client cl;
	if (client_open(&cl, host, port))
		return 1;
	unsigned long warmup = o->warmup_set ? o->warmup : (o->n / 10 < 1000 ? o->n / 10 : 1000);
	int rc = 1;
	uint64_t *rtt = malloc(o->n * sizeof *rtt);
	char *buf = calloc(1, o->size), *rbuf = malloc(MAX_SIZE + 1);
	if (!rtt || !buf || !rbuf) {
		fprintf(stderr, "udpbench: out of memory\n");
		goto out;
	}
	uint32_t session = (uint32_t)getpid();
	unsigned long done = 0, lost = 0;
	uint64_t deadline = 0;
	for (unsigned long i = 0; i < warmup + o->n; i++) {
		if (i == warmup && o->seconds > 0)
			deadline = now_ns() + (uint64_t)(o->seconds * 1e9);
		int tries = 0, wr;
		uint64_t t0;
		ssize_t len;
		do {
			/* a fresh sequence number per attempt, so a late reply cannot be mistaken */
			uint32_t seq = (uint32_t)(i + (unsigned long)tries * 0x10000000ul);
			put_hdr(buf, T_PING, session, seq);
			t0 = now_ns();
			if (send_dg(&cl, buf, o->size) < 0) {
				perror("udpbench: sendto");
				goto out;
			}
			wr = wait_reply(&cl, rbuf, MAX_SIZE + 1, T_PING, session, seq, &len);
			if (wr < 0)
				goto out;
			if (wr > 0)
				lost++;
		} while (wr > 0 && ++tries < PING_TRIES);
		if (wr > 0) {
			fprintf(stderr, "udpbench: no reply from %s port %s after %d tries\n", host, port,
				PING_TRIES);
			goto out;
		}
		uint64_t t1 = now_ns();
		if (len != (ssize_t)o->size) {
			fprintf(stderr, "udpbench: reply of %zd bytes to a %u-byte ping\n", len, o->size);
			goto out;
		}
		if (i >= warmup) {
			rtt[done++] = t1 - t0;
			if (deadline && t1 >= deadline)
				break;
		}
	}
	if (!done) {
		fprintf(stderr, "udpbench: no timed round trips\n");
		goto out;
	}
	qsort(rtt, done, sizeof *rtt, cmp_u64);
	double sum = 0;
	for (unsigned long k = 0; k < done; k++)
		sum += (double)rtt[k];
	double min = (double)rtt[0] / 1e3, max = (double)rtt[done - 1] / 1e3;
	double med = done % 2 ? (double)rtt[done / 2] / 1e3
			      : ((double)rtt[done / 2 - 1] + (double)rtt[done / 2]) / 2e3;
	double avg = sum / (double)done / 1e3;
	unsigned long p99i = (unsigned long)((double)done * 0.99);
	double p99 = (double)rtt[p99i < done ? p99i : done - 1] / 1e3;
	if (o->json)
		printf("{\"test\":\"pingpong\",\"latency\":\"rtt\",\"size\":%u,\"n\":%lu,\"warmup\":%lu,"
		       "\"min_us\":%.3f,\"median_us\":%.3f,\"avg_us\":%.3f,\"p99_us\":%.3f,\"max_us\":%.3f,"
		       "\"timeouts\":%lu}\n",
		       o->size, done, warmup, min, med, avg, p99, max, lost);
	else
		printf("pingpong %u B, %lu round trips (RTT, us): min %.2f  median %.2f  avg %.2f  "
		       "p99 %.2f  max %.2f%s\n",
		       o->size, done, min, med, avg, p99, max, lost ? "  (with timeouts)" : "");
	rc = 0;
out:
	free(rtt);
	free(buf);
	free(rbuf);
	close(cl.fd);
	return rc;
}

/* Sends a control datagram and waits for its answer, retrying on timeout. */
static int control(struct client *cl, uint8_t type, uint8_t reply, uint32_t session,
		   const struct counts *c, char *rbuf, size_t cap)
{
	char buf[CTL_SIZE] = { 0 };
	for (int tries = 0; tries < CTL_TRIES; tries++) {
		put_hdr(buf, type, session, (uint32_t)tries);
		if (c)
			put_counts(buf, c);
		if (send_dg(cl, buf, sizeof buf) < 0) {
			perror("udpbench: sendto");
			return -1;
		}
		ssize_t len;
		int rc = wait_reply(cl, rbuf, cap, reply, session, (uint32_t)tries, &len);
		if (rc < 0)
			return -1;
		if (rc == 0 && len >= (ssize_t)(HDR_SIZE + sizeof(struct counts)))
			return 0;
	}
	fprintf(stderr, "udpbench: the server does not answer (no udpbench server there?)\n");
	return -1;
}

static int run_stream(const char *host, const char *port, const struct opts *o)
{
	struct client cl;
	if (client_open(&cl, host, port))
		return 1;
	int rc = 1;
	char *buf = calloc(1, o->size), *rbuf = malloc(MAX_SIZE + 1);
	if (!buf || !rbuf) {
		fprintf(stderr, "udpbench: out of memory\n");
		goto out;
	}
	uint32_t session = (uint32_t)(now_ns() ^ ((uint64_t)getpid() << 16));
	if (control(&cl, T_START, T_START_ACK, session, NULL, rbuf, MAX_SIZE + 1))
		goto out;

	struct counts sent = { 0 };
	uint64_t errors = 0;
	uint64_t start = now_ns(), end = start + (uint64_t)(o->seconds * 1e9), t = start;
	double gap_ns = o->rate > 0 ? 1e9 / o->rate : 0;
	for (uint32_t seq = 0; t < end; seq++) {
		if (gap_ns > 0) {
			uint64_t due = start + (uint64_t)((double)seq * gap_ns);
			if (due >= end)
				break;
			if (t < due) { /* sleep until due; overdue datagrams then go out back to back */
				struct timespec ts = { .tv_sec = (time_t)(due / NS_PER_S),
						       .tv_nsec = (long)(due % NS_PER_S) };
				while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
					;
			}
		}
		put_hdr(buf, T_DATA, session, seq);
		if (sendto(cl.fd, buf, o->size, 0, (struct sockaddr *)&cl.peer, cl.peer_len) < 0) {
			if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR && errno != ECONNREFUSED) {
				perror("udpbench: sendto");
				goto out;
			}
			errors++;
		} else {
			sent.datagrams++;
			sent.bytes += o->size;
		}
		t = now_ns();
	}
	double send_secs = (double)(t - start) / 1e9;

	struct counts got;
	if (control(&cl, T_END, T_REPORT, session, &sent, rbuf, MAX_SIZE + 1))
		goto out;
	get_counts(rbuf, &got);
	double rx_secs = (double)(got.last_ns - got.first_ns) / 1e9;
	if (got.datagrams < 2 || rx_secs <= 0)
		rx_secs = send_secs;
	double send_rate = (double)sent.datagrams / send_secs;
	double recv_rate = (double)got.datagrams / rx_secs;
	double loss = sent.datagrams ? 100.0 * ((double)sent.datagrams - (double)got.datagrams) /
					       (double)sent.datagrams
				     : 0;
	if (o->json)
		printf("{\"test\":\"stream\",\"size\":%u,\"seconds\":%.3f,\"rate_limit\":%.0f,"
		       "\"sent\":%" PRIu64 ",\"send_errors\":%" PRIu64 ",\"send_rate\":%.1f,"
		       "\"received\":%" PRIu64 ",\"recv_seconds\":%.3f,\"recv_rate\":%.1f,"
		       "\"recv_MBps\":%.2f,\"lost\":%" PRId64 ",\"loss_pct\":%.4f}\n",
		       o->size, send_secs, o->rate, sent.datagrams, errors, send_rate, got.datagrams,
		       rx_secs, recv_rate, recv_rate * o->size / 1e6,
		       (int64_t)(sent.datagrams - got.datagrams), loss);
	else
		printf("stream %u B for %.2f s%s: sent %" PRIu64 " (%.0f datagrams/s), received %" PRIu64
		       " (%.0f datagrams/s, %.1f MB/s), lost %" PRId64 " (%.3f %%)%s\n",
		       o->size, send_secs, o->rate > 0 ? " (paced)" : "", sent.datagrams, send_rate,
		       got.datagrams, recv_rate, recv_rate * o->size / 1e6,
		       (int64_t)(sent.datagrams - got.datagrams), loss,
		       errors ? " (sendto errors)" : "");
	rc = 0;
out:
	free(buf);
	free(rbuf);
	close(cl.fd);
	return rc;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *mode = argv[1];
	bool server = !strcmp(mode, "server"), pingpong = !strcmp(mode, "pingpong"),
	     stream = !strcmp(mode, "stream");
	if (!server && !pingpong && !stream)
		die_usage("unknown mode", mode);

	struct opts o = { .size = stream ? 1316 : 64, .n = 10000, .seconds = stream ? 3 : 0 };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' }, { "size", required_argument, NULL, 's' },
		{ "rate", required_argument, NULL, 'r' },
		{ "rcvbuf", required_argument, NULL, 'R' }, { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	/* GNU getopt permutes, so options may follow the positional arguments. */
	while ((c = getopt_long(argc - 1, argv + 1, "s:n:w:t:r:b:R:h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': o.size = (unsigned)parse_ulong(optarg, "-s", HDR_SIZE, MAX_SIZE); break;
		case 'n': o.n = parse_ulong(optarg, "-n", 1, 100000000ul); break;
		case 'w': o.warmup = parse_ulong(optarg, "-w", 0, 100000000ul); o.warmup_set = true; break;
		case 't': o.seconds = parse_double(optarg, "-t"); break;
		case 'r': o.rate = parse_double(optarg, "-r"); break;
		case 'b': o.bind_addr = optarg; break;
		case 'R': o.rcvbuf = parse_ulong(optarg, "-R", 1024, 1ul << 30); break;
		case 'j': o.json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	char **pos = argv + 1 + optind;
	int npos = argc - 1 - optind;
	if (server) {
		if (npos != 1)
			die_usage("server takes exactly one argument, PORT", NULL);
		parse_ulong(pos[0], "PORT", 1, 65535);
		return run_server(pos[0], &o);
	}
	if (npos != 2)
		die_usage(pingpong ? "pingpong takes HOST PORT" : "stream takes HOST PORT", NULL);
	parse_ulong(pos[1], "PORT", 1, 65535);
	return pingpong ? run_pingpong(pos[0], pos[1], &o) : run_stream(pos[0], pos[1], &o);
}
