/*
 * dgperf.c - a perftest-style micro-benchmark of the dgshim verbs interface, with a plain-UDP
 * baseline (--raw-udp). `dgperf --help` documents the usage, the tests and how every figure is
 * measured; this comment only maps the file.
 *
 *  1. options and their validation (exit 2 on a bad value, naming the option);
 *  2. the TCP control channel: handshake (both sides must run the same test), address and MR
 *     exchange, a barrier before and after every message size, the receiver's counts;
 *  3. the verbs data path: one registered buffer per side, split in a source half (tx) and a
 *     target half (rx) of the largest message size each; client and server loops per test;
 *  4. the raw-UDP data path: the same patterns over a connected UDP socket, no framing;
 *  5. statistics and output (text rows or one JSON object per row).
 *
 * Nothing is allocated in the timed loops: work requests, SGEs, completion arrays and the sample
 * array are prepared before a size starts.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dgverbs.h"
#include "wire.h" /* only for the per-datagram overhead fallback of write_bw on UD */

/* ---------------------------------------------------------------- constants */

#define NS_PER_S 1000000000ull
#define NS_PER_MS 1000000ull
#define DEFAULT_PORT 18515u
#define MAX_SIZE (16ull << 20)        /* -s upper bound (the QP's default max_msg_size) */
#define SWEEP_MAX (4ull << 20)        /* -a: 1 B .. 4 MiB */
#define DEFAULT_LAT_SIZE 64u
#define DEFAULT_BW_SIZE 65536u
#define DEFAULT_LAT_ITERS 1000u
#define DEFAULT_BW_ITERS 2000u
#define MAX_ITERS 10000000ull         /* keeps the sample array at most 80 MB */
#define LAT_ATTEMPTS(n) (4 * (n))     /* lossy latency runs stop after this many round trips */
#define BYTES_PER_SIZE (256ull << 20) /* iteration scaling: at most ~256 MiB moved per size */
#define MAX_TX_DEPTH 128u
#define TX_DEPTH_BYTES (16ull << 20)  /* bandwidth tests keep at most this many bytes in flight */
#define SQ_WR 256u
#define RQ_LAT 64u                    /* receives kept posted for send_lat */
#define RQ_BW 1024u                   /* receives kept posted by the send_bw server */
#define SCHAIN 32                     /* send WRs posted per dgv_post_send call */
#define RCHAIN 64                     /* receive WRs posted per dgv_post_recv call */
#define WC_BATCH 64
#define SCQ_ENTRIES 1024
#define RCQ_ENTRIES 4096
#define RAW_SOCKBUF (4 << 20)
#define RAW_READ_REQ 16u              /* raw-udp read_*: size of the request datagram */
#define RAW_RXBUF 65536u
#define CONNECT_TIMEOUT_MS 10000
#define ACCEPT_TIMEOUT_MS 120000
#define CTL_TIMEOUT_MS 30000
#define CTL_POLL_NS (1 * NS_PER_MS)   /* how often a busy server looks at the control channel */
#define DRAIN_IDLE_NS (200 * NS_PER_MS) /* after "done": this long without an arrival ends a phase */
#define REASM_NS (20 * NS_PER_MS)     /* the provider's default UD reassembly timeout */
#define SEG_DEFAULT 1472u
#define SEG_DEFAULT6 1452u
#define SEG_MIN 64u
#define SEG_MAX 65507u
#define SEG_OVERHEAD 64u              /* our datagram headers stay below this */
#define CR_TAG 0xffffffffull          /* RC: wr_id >> 32 of a credit Write */

/* ---------------------------------------------------------------- tests and options */

enum { K_SEND = 0, K_WR, K_WRITE, K_READ }; /* operation kind: test / 2 */
enum { TR_UD = 0, TR_RD, TR_RC };

static const char *const test_names[] = { "send_lat", "send_bw", "wr_lat", "wr_bw",
					  "write_lat", "write_bw", "read_lat", "read_bw" };
#define NTESTS ((int)(sizeof test_names / sizeof test_names[0]))
static const char *const tr_names[] = { "UD", "RD", "RC" };

static struct {
	int test;
	int transport;
	bool raw;
	bool raw_connected; /* --raw-connected: connect() + send() */
	bool raw_tcp;       /* --raw-tcp: one plain TCP connection (opt.raw is set too) */
	const char *bind;   /* --bind ADDR: the server's control port on this IPv4 address only */
	bool sweep;
	uint64_t size;
	bool size_set;
	uint64_t iters;
	bool iters_set;
	double loss;
	bool loss_set;
	bool json;
	bool detail;        /* --detail: extra JSON keys (sent/delivered counts, wire datagrams) */
	unsigned port;
	uint32_t seg;
	bool seg_set;
	enum dgv_provider_kind provider;
	const char *peer;
	int verbose;
} opt = { .test = 0, .transport = TR_UD, .port = DEFAULT_PORT, .provider = DGV_PROV_AUTO };

static int test_kind(void) { return opt.test / 2; }
static bool test_lat(void) { return opt.test % 2 == 0; }
static const char *transport_name(void)
{
	if (opt.raw_tcp)
		return "raw-tcp";
	return opt.raw ? (opt.raw_connected ? "raw-udp-connected" : "raw-udp") : tr_names[opt.transport];
}
/* RC and --raw-tcp carry the data on a second TCP connection to the server's control port. */
static bool data_on_tcp(void) { return opt.raw ? opt.raw_tcp : opt.transport == TR_RC; }

/* ---------------------------------------------------------------- errors */

static int g_ctl = -1;    /* the control connection */
static int g_lfd = -1;    /* server, RC and --raw-tcp: the control port's listening socket, kept
			     open for the data connection */
static bool g_server;
static bool g_dying;

static void ctl_send_err(int code, const char *text);
static void (*g_die_hook)(void); /* -v: the QP counters when a run fails */

/* Prints the error, tells the peer (so it does not wait for a timeout), exits with code. */
static void __attribute__((noreturn, format(printf, 2, 3))) die(int code, const char *fmt, ...)
{
	char text[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "dgperf: %s\n", text);
	if (g_die_hook && !g_dying) {
		void (*hook)(void) = g_die_hook;

		g_die_hook = NULL;
		hook();
	}
	if (g_ctl >= 0 && !g_dying) {
		g_dying = true;
		ctl_send_err(code, text);
	}
	exit(code);
}

static void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "dgperf: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see dgperf --help)\n");
	exit(2);
}

static void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vlog(const char *fmt, ...)
{
	va_list ap;

	if (!opt.verbose)
		return;
	fprintf(stderr, "dgperf[%s]: ", g_server ? "server" : "client");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- option parsing */

static const char usage_text[] =
"Usage: dgperf [options] [PEER]\n"
"\n"
"A perftest-style micro-benchmark of the dgshim verbs interface (and of plain UDP and TCP).\n"
"Start the server without PEER, then the client with PEER (an IPv4/IPv6 address or a name).\n"
"Both sides must be given the same -c/-t/-s/-a/-n/--seg/--loss/--raw-* options (checked at\n"
"connect time: a mismatch is an error, exit 2). The client prints the results; the server\n"
"prints nothing but errors unless -v, and exits after one client.\n"
"\n"
"Options:\n"
"  -c, --connection UD|RD|RC  QP type (default UD). RC: standard iWARP over TCP (see RC\n"
"                        below); if the provider does not implement it, dgperf says so\n"
"                        and exits 2.\n"
"  -t, --test TEST       send_lat (default), send_bw, wr_lat, wr_bw, write_lat, write_bw,\n"
"                        read_lat, read_bw (see TESTS).\n"
"  -s, --size SIZE       message size in bytes, 1..16M; suffixes K and M are 1024-based\n"
"                        (default 64 for *_lat, 64K for *_bw).\n"
"  -a, --all             sweep sizes 1 B .. 4 MiB in powers of two (excludes -s).\n"
"  -n, --iters N         iterations per size (default 1000 for *_lat, 2000 for *_bw). With\n"
"                        -a, or when -n is not given, large sizes get fewer iterations so\n"
"                        that one size moves at most ~256 MiB. *_lat tests add a few\n"
"                        untimed warm-up round trips (min(16, N/8)).\n"
"      --loss PCT        (UD, RD, --raw-udp only; TCP never loses a byte)\n"
"                        drop PCT % (0..100) of the datagrams at the receiving edge of BOTH\n"
"                        sides' QPs (struct dgv_fault loss_pct of fault_rx). Without --loss\n"
"                        the provider reads DGSHIM_FAULT_RX/TX from the environment; with it,\n"
"                        DGSHIM_FAULT_RX is ignored (DGSHIM_FAULT_TX still applies).\n"
"                        With --raw-udp each receiver drops PCT % of its datagrams itself.\n"
"      --seg SIZE        UDP payload bytes per datagram, 64..65507 (QP seg_size, headers\n"
"                        included; default: the provider's, 1472 for IPv4, 1452 for IPv6;\n"
"                        65507 gives 64 KB datagrams). With --raw-udp: the datagram size.\n"
"                        RC: passed to the QP as is. Not with --raw-tcp.\n"
"  -p, --port PORT       the server's port (default 18515): the control channel is TCP PORT;\n"
"                        UD/RD: the server's data QP (or raw socket) is UDP PORT; RC and\n"
"                        --raw-tcp: the data connection is a second TCP connection to PORT.\n"
"      --raw-udp         baseline: the same traffic pattern over plain UDP sockets (below).\n"
"      --raw-connected   the same over connected UDP sockets (below).\n"
"      --raw-tcp         baseline for RC: the same patterns over one plain TCP connection\n"
"                        (below).\n"
"      --bind ADDR       server: listen on the TCP control port at this IPv4 address only\n"
"                        (default: every address, IPv6 and IPv4).\n"
"  -P, --provider soft|ibverbs|auto   verbs provider (default auto: DGSHIM_PROVIDER or the\n"
"                        best available).\n"
"      --json            print one JSON object per size instead of the text table.\n"
"      --detail          --json with more keys per row (client side only): *_bw: sent_msgs,\n"
"                        delivered_msgs, delivered_bytes, elapsed_s, and from the client's QP\n"
"                        tx_datagrams, tx_wire_bytes (headers included), rd_retransmits (null\n"
"                        for raw sockets); *_lat: pings, lost (round trips timed out).\n"
"  -v, --verbose         progress and QP counters on stderr (both sides).\n"
"  -h, --help            this text.\n"
"\n"
"TESTS (SIZE bytes per message; all loops busy-poll dgv_poll_cq, never sleep):\n"
"  send_lat   Send ping-pong: both sides keep receives posted, the client sends, the server\n"
"             replies (echoes the message) on receipt. Reports half the round trip.\n"
"  wr_lat     RDMA Write-Record ping-pong: the target sees a RECV_WRITE_RECORD completion\n"
"             and writes the region back. Half round trip; also valid[%] (see below).\n"
"  write_lat  RDMA Write ping-pong, the perftest way: the target spins (volatile read) on the\n"
"             last byte of its buffer until it changes, then writes back. Half round trip.\n"
"  read_lat   the client issues an RDMA Read of SIZE bytes; time to its completion (the\n"
"             FULL round trip).\n"
"  send_bw, wr_bw, write_bw, read_bw   streaming: the client posts N operations keeping up\n"
"             to min(128, 16 MiB/SIZE) outstanding, all signaled. The send_bw server keeps\n"
"             1024 receives posted; the wr_bw server counts Write-Record completions and sums\n"
"             record.valid_bytes; read_bw counts the bytes its Reads fetched (UD: the\n"
"             record's valid bytes). write_bw: a Write leaves no completion at the target;\n"
"             on RD every completed Write was acknowledged, so placed; on RC every posted\n"
"             Write is placed (TCP delivers or the connection fails), and the server's\n"
"             QP counters tell when the last one arrived; on UD the placed\n"
"             payload comes from the target QP's dgv_qp_stats (rx_bytes - rx_datagrams x\n"
"             header overhead) and MsgRate counts message equivalents (bytes / SIZE).\n"
"\n"
"MEASUREMENT:\n"
"  Latency: per-iteration CLOCK_MONOTONIC timestamps into a preallocated array; t_min,\n"
"  t_typical (median), t_avg and p99 over the N timed iterations (the iters column). On UD\n"
"  (and raw) a round trip whose messages are lost times out (25 ms plus 40 ns per byte;\n"
"  +40 ms for multi-datagram Write-Records and Reads, which complete partial only after\n"
"  reassembly; at least 100 ms for UD Reads) and is left out: dgperf tries up to 4 N round\n"
"  trips to collect N samples, and the text output says how many were lost.\n"
"  Bandwidth: bytes DELIVERED to the receiver (not sent) / elapsed time. Elapsed runs on the\n"
"  client's clock from the first post to the last arrival at the receiver: the server reports\n"
"  how long before its report the last message arrived, and that is subtracted from the\n"
"  time the report reaches the client (read_bw: the client is the receiver; until its last\n"
"  completion). After the client says it is done, a server phase ends when all N messages\n"
"  arrived or after 200 ms without an arrival (UD loss), never hanging. MsgRate counts\n"
"  delivered messages (wr_bw: records; one message may yield several partial records).\n"
"  valid[%] (wr_*) = valid bytes in the target's records / bytes sent.\n"
"  MB = 10^6 bytes. On UD the text output also shows delivered/sent messages.\n"
"\n"
"--raw-udp: plain UDP sockets (SO_SNDBUF/SO_RCVBUF 4 MiB), no framing and no verbs; every\n"
"  datagram is sent with sendto() to the peer's address, the pattern of a UD QP, which names\n"
"  its destination (address handle) in every send. --raw-connected: the same over connect()ed\n"
"  sockets and send(), which the kernel serves faster (cached route), a pattern a QP cannot\n"
"  use since it receives from anyone. -c and -P are ignored. A SIZE-byte message is\n"
"  ceil(SIZE/seg) datagrams; receivers count bytes. *_lat: ping-pong of SIZE-byte messages,\n"
"  half round trip (read_lat: a 16-byte request answered by SIZE bytes, full round trip).\n"
"  *_bw: the client streams N messages to the server (also for read_bw); valid[%] of wr_* =\n"
"  bytes received / bytes sent. Latency loops busy-poll recv(MSG_DONTWAIT), like the verbs\n"
"  loops busy-poll the CQ; senders retry on EAGAIN. A message missing datagrams is given up\n"
"  after 20 ms of silence (as UD reassembly). --loss: each receiver drops that share of its\n"
"  datagrams itself.\n"
"\n"
"RC: the server's listening socket for the control connection stays open and the provider\n"
"  listens on it (dgv_listen with adopt_fd), so the client's dgv_connect goes to TCP PORT too.\n"
"  The MPA Request carries the client's buffer (address, length, STag) and a cookie the server\n"
"  sent over the control channel; the MPA Reply carries the server's buffer and its credits.\n"
"  A request without the cookie is rejected (MPA Reject) and the server keeps waiting; a\n"
"  request that has it but does not fit is rejected and ends both sides. MPA revision 2, CRC\n"
"  as the provider defaults (DGSHIM_MPA_CRC), no markers; the header line shows what was\n"
"  negotiated. RC has no receiver-not-ready: a Send that finds no posted receive ends the\n"
"  connection. So send_bw is flow-controlled the way rsockets does it: the server keeps 256\n"
"  receives posted and RDMA-Writes the total it has ever posted into a credit word in the\n"
"  client's buffer after every 64 it reposted; the client posts a Send only while that total\n"
"  is ahead of what it sent. wr_bw uses the same credits for the server's receive CQ (1024\n"
"  unpolled Write-Records at most). read_bw keeps at most the negotiated ORD Reads in flight.\n"
"  The latency tests are the same ping-pongs as on UD (write_lat spins on the last byte).\n"
"  At the end both sides dgv_disconnect() and wait up to 3 s for DISCONNECTED.\n"
"\n"
"--raw-tcp: one plain TCP connection (the second one to PORT; its first 8 bytes are the\n"
"  cookie), TCP_NODELAY on both ends, kernel default buffers (autotuning), no framing and no\n"
"  verbs; -c and -P are ignored. *_lat: a ping-pong of SIZE-byte messages, each side reading\n"
"  the whole message before it answers (read_lat: a 16-byte request answered by SIZE bytes,\n"
"  full round trip); both ends busy-poll recv(MSG_DONTWAIT) like the verbs loops busy-poll\n"
"  the CQ. *_bw: the client writes N messages of SIZE bytes, one send() each (waiting in\n"
"  poll() while the socket is full), the server counts bytes until N x SIZE arrived; BW and\n"
"  MsgRate as for the verbs tests (bytes delivered over the client's first send to the\n"
"  server's last byte). So 'RC send_lat vs --raw-tcp send_lat' compares a Send ping-pong over\n"
"  MPA/DDP/RDMAP on TCP with the same ping-pong on bare TCP, and 'send_bw -s 64K' the stream\n"
"  throughput of both; scripts/bench-verbs prints these ratios.\n"
"\n"
"OUTPUT (client): a '#' header line naming test, transport and provider, then one row per\n"
"  size: '#bytes iters t_min[us] t_typical[us] t_avg[us] p99[us]' for *_lat,\n"
"  '#bytes iters BW[MB/s] MsgRate[Mpps]' for *_bw, plus valid[%] for wr_*. --json: one\n"
"  object per row with keys test, transport, size, iters, t_min_us, t_typical_us, t_avg_us,\n"
"  p99_us, bw_MBps, msg_rate_Mpps, valid_fraction (null where not applicable).\n"
"\n"
"TIMEOUTS AND EXIT STATUS: the client gives up connecting after 10 s (it retries while the\n"
"  server is not listening yet); the server waits 120 s for a client; the RC and raw TCP\n"
"  data connections must be up within 15 s (RC: ESTABLISHED, else the event's cause is\n"
"  printed: connection refused, MPA Reject with the server's reason, timeout, Terminate);\n"
"  a failed RC completion also prints the connection events behind it. Control messages\n"
"  time out after 30 s; a latency client gives up after 30 s without a completed round trip, a\n"
"  server after 60 s without a datagram from its client; a client sees a dead server at\n"
"  once (control connection closed). Exit 0 on success, 1 on a runtime error\n"
"  (peer unreachable or gone, timeout, failed completion: its status is printed), 2 on a bad\n"
"  option, an option mismatch between the sides, or an unsupported transport.\n"
"\n"
"Examples: dgperf -c RD -t send_bw -a &   dgperf -c RD -t send_bw -a 127.0.0.1\n"
"          dgperf -c RC -t send_lat -s 64 &   dgperf -c RC -t send_lat -s 64 127.0.0.1\n"
"          dgperf --raw-tcp -t send_lat -s 64 &   dgperf --raw-tcp -t send_lat -s 64 127.0.0.1\n";

/* Decimal digits only (no sign, no spaces), no overflow. */
static bool parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

/* Digits with an optional K or M (1024-based), optionally followed by B or iB. */
static bool parse_size(const char *s, uint64_t *out)
{
	char num[32];
	size_t n = 0;
	uint64_t v, mult = 1;

	if (!s)
		return false;
	while (s[n] >= '0' && s[n] <= '9')
		n++;
	if (n == 0 || n >= sizeof num)
		return false;
	memcpy(num, s, n);
	num[n] = 0;
	if (!parse_u64(num, &v))
		return false;
	s += n;
	if (*s == 'k' || *s == 'K') {
		mult = 1024;
		s++;
	} else if (*s == 'm' || *s == 'M') {
		mult = 1024 * 1024;
		s++;
	}
	if (mult > 1 && (!strcmp(s, "B") || !strcmp(s, "iB")))
		s += strlen(s);
	if (*s)
		return false;
	if (v > UINT64_MAX / mult)
		return false;
	*out = v * mult;
	return true;
}


/* Index of s in names[0..n), compared with or without case; -1 when absent. */
static int name_index(const char *s, const char *const *names, int n, bool nocase)
{
	for (int i = 0; i < n; i++)
		if (nocase ? !strcasecmp(s, names[i]) : !strcmp(s, names[i]))
			return i;
	return -1;
}

static void parse_options(int argc, char **argv)
{
	enum { O_LOSS = 256, O_JSON, O_RAW, O_RAWC, O_RAWT, O_SEG, O_DETAIL, O_BIND };
	static const struct option longopts[] = {
		{ "connection", required_argument, NULL, 'c' },
		{ "test", required_argument, NULL, 't' },
		{ "size", required_argument, NULL, 's' },
		{ "all", no_argument, NULL, 'a' },
		{ "iters", required_argument, NULL, 'n' },
		{ "loss", required_argument, NULL, O_LOSS },
		{ "json", no_argument, NULL, O_JSON },
		{ "detail", no_argument, NULL, O_DETAIL },
		{ "port", required_argument, NULL, 'p' },
		{ "raw-udp", no_argument, NULL, O_RAW },
		{ "raw-connected", no_argument, NULL, O_RAWC },
		{ "raw-tcp", no_argument, NULL, O_RAWT },
		{ "bind", required_argument, NULL, O_BIND },
		{ "seg", required_argument, NULL, O_SEG },
		{ "provider", required_argument, NULL, 'P' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":c:t:s:an:p:P:vh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': {
			static const char *const names[] = { "UD", "RD", "RC" };
			static const int values[] = { TR_UD, TR_RD, TR_RC };
			int i = name_index(optarg, names, 3, true);

			if (i < 0)
				usage_error("invalid -c value '%s': expected UD, RD or RC", optarg);
			opt.transport = values[i];
			break;
		}
		case 't': {
			int i = name_index(optarg, test_names, NTESTS, false);

			if (i < 0)
				usage_error("invalid -t value '%s': expected send_lat, send_bw, wr_lat, wr_bw, "
					    "write_lat, write_bw, read_lat or read_bw", optarg);
			opt.test = i;
			break;
		}
		case 's':
			if (!parse_size(optarg, &opt.size) || opt.size == 0 || opt.size > MAX_SIZE)
				usage_error("invalid -s value '%s': expected a size of 1..16M bytes "
					    "(suffixes K, M = 1024-based)", optarg);
			opt.size_set = true;
			break;
		case 'a':
			opt.sweep = true;
			break;
		case 'n':
			if (!parse_u64(optarg, &opt.iters) || opt.iters == 0 || opt.iters > MAX_ITERS)
				usage_error("invalid -n value '%s': expected an iteration count of 1..%llu",
					    optarg, (unsigned long long)MAX_ITERS);
			opt.iters_set = true;
			break;
		case 'p': {
			uint64_t p;

			if (!parse_u64(optarg, &p) || p == 0 || p > 65535)
				usage_error("invalid -p value '%s': expected a port number 1..65535", optarg);
			opt.port = (unsigned)p;
			break;
		}
		case 'P': {
			static const char *const names[] = { "soft", "ibverbs", "auto" };
			static const enum dgv_provider_kind values[] = { DGV_PROV_SOFT, DGV_PROV_IBVERBS,
									 DGV_PROV_AUTO };
			int i = name_index(optarg, names, 3, false);

			if (i < 0)
				usage_error("invalid -P value '%s': expected soft, ibverbs or auto", optarg);
			opt.provider = values[i];
			break;
		}
		case 'v':
			opt.verbose++;
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(0);
		case O_LOSS: {
			char *end = NULL;
			double d;

			errno = 0;
			d = strtod(optarg, &end);
			if (!*optarg || errno || !end || *end || !isfinite(d) || d < 0.0 || d > 100.0 ||
			    strchr(optarg, 'x') || strchr(optarg, 'X'))
				usage_error("invalid --loss value '%s': expected a percentage 0..100", optarg);
			opt.loss = d;
			opt.loss_set = true;
			break;
		}
		case O_JSON:
			opt.json = true;
			break;
		case O_DETAIL:
			opt.json = true;
			opt.detail = true;
			break;
		case O_RAW:
			opt.raw = true;
			break;
		case O_RAWC:
			opt.raw = true;
			opt.raw_connected = true;
			break;
		case O_RAWT:
			opt.raw_tcp = true;
			break;
		case O_BIND: {
			struct in_addr ia;
			if (inet_pton(AF_INET, optarg, &ia) != 1)
				usage_error("invalid --bind address '%s': expected an IPv4 address", optarg);
			opt.bind = optarg;
			break;
		}
		case O_SEG: {
			uint64_t s;

			if (!parse_size(optarg, &s) || s < SEG_MIN || s > SEG_MAX)
				usage_error("invalid --seg value '%s': expected %u..%u bytes per datagram",
					    optarg, SEG_MIN, SEG_MAX);
			opt.seg = (uint32_t)s;
			opt.seg_set = true;
			break;
		}
		case ':':
			if (optopt)
				usage_error("option -%c needs a value", optopt);
			usage_error("option %s needs a value", argv[optind - 1]);
		default:
			if (optopt)
				usage_error("unknown option -%c", optopt);
			usage_error("unknown option %s", argv[optind - 1]);
		}
	}
	if (optind < argc)
		opt.peer = argv[optind++];
	if (optind < argc)
		usage_error("unexpected argument '%s' (only one PEER may be given)", argv[optind]);
	if (opt.sweep && opt.size_set)
		usage_error("-s and -a exclude each other");
	if (opt.raw_tcp && opt.raw)
		usage_error("--raw-tcp excludes --raw-udp and --raw-connected");
	if (opt.raw_tcp)
		opt.raw = true;
	if (opt.loss_set && data_on_tcp())
		usage_error("--loss applies to UD, RD and raw UDP only: %s runs over TCP, which never "
			    "loses a byte (DGSHIM_FAULT_* still reach an RC QP)", opt.raw_tcp ? "--raw-tcp" :
			    "-c RC");
	if (opt.seg_set && opt.raw_tcp)
		usage_error("--seg has no meaning with --raw-tcp (TCP segments the stream itself)");
	if (!opt.size_set && !opt.sweep)
		opt.size = test_lat() ? DEFAULT_LAT_SIZE : DEFAULT_BW_SIZE;
}

/* ---------------------------------------------------------------- sizes and iterations */

static uint64_t max_msg_size(void) { return opt.sweep ? SWEEP_MAX : opt.size; }

/* Bytes one iteration moves (a ping-pong moves the message twice). */
static uint64_t bytes_per_iter(uint64_t size)
{
	if (!test_lat())
		return size;
	if (test_kind() == K_READ)
		return size;
	return 2 * size;
}

static uint64_t iters_for(uint64_t size)
{
	uint64_t n = opt.iters_set ? opt.iters : (test_lat() ? DEFAULT_LAT_ITERS : DEFAULT_BW_ITERS);

	if (opt.sweep || !opt.iters_set) {
		uint64_t cap = BYTES_PER_SIZE / bytes_per_iter(size);

		if (cap < 1)
			cap = 1;
		if (n > cap)
			n = cap;
	}
	return n;
}

static uint64_t warmup_for(uint64_t iters)
{
	uint64_t w = iters / 8;

	return test_lat() ? (w > 16 ? 16 : w) : 0;
}

static unsigned tx_depth(uint64_t size)
{
	uint64_t d = TX_DEPTH_BYTES / size;

	if (d < 1)
		d = 1;
	if (d > MAX_TX_DEPTH)
		d = MAX_TX_DEPTH;
	return (unsigned)d;
}

static uint32_t seg_effective(int family)
{
	if (opt.seg_set)
		return opt.seg;
	return family == AF_INET6 ? SEG_DEFAULT6 : SEG_DEFAULT;
}

static bool reliable(void) { return opt.raw ? opt.raw_tcp : opt.transport != TR_UD; }

/* How long one latency iteration may take before it counts as lost (UD, raw) or fails. */
static uint64_t lat_timeout_ns(uint64_t size, int family)
{
	uint64_t t;

	if (reliable())
		return 10 * NS_PER_S + size * 2000; /* >= 1 MB/s round trip */
	t = 25 * NS_PER_MS + size * 40;             /* 50 MB/s round trip */
	/* A partial Write-Record (or UD Read) completes only after the reassembly timeout, at both
	 * ends; an incomplete Send is dropped and a partial Write is echoed at once. */
	if (!opt.raw && (test_kind() == K_WR || test_kind() == K_READ) &&
	    size + SEG_OVERHEAD > seg_effective(family))
		t += 2 * REASM_NS;
	/* A UD Read whose request or response got lost completes (partial, maybe empty) when the
	 * initiator gives up on it, after 4 reassembly timeouts in the soft provider: wait for that
	 * rather than leave it outstanding under the next iteration. */
	if (!opt.raw && test_kind() == K_READ && t < 4 * REASM_NS + 20 * NS_PER_MS)
		t = 4 * REASM_NS + 20 * NS_PER_MS;
	return t;
}

/* An upper bound for one whole phase, for the side that only waits (the server). */
static uint64_t phase_budget_ns(uint64_t size, uint64_t iters)
{
	return 120 * NS_PER_S + iters * 30 * NS_PER_MS + iters * bytes_per_iter(size) * 1000;
}

/* ---------------------------------------------------------------- addresses */

static void sa_normalize(union dgv_sockaddr *a, socklen_t *len)
{
	if (a->sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) {
		struct sockaddr_in sin;

		memset(&sin, 0, sizeof sin);
		sin.sin_family = AF_INET;
		sin.sin_port = a->sin6.sin6_port;
		memcpy(&sin.sin_addr, &a->sin6.sin6_addr.s6_addr[12], 4);
		memset(a, 0, sizeof *a);
		a->sin = sin;
	}
	*len = a->sa.sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static bool sa_is_any(const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET)
		return a->sin.sin_addr.s_addr == htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&a->sin6.sin6_addr);
}

static void sa_set_port(union dgv_sockaddr *a, unsigned port)
{
	if (a->sa.sa_family == AF_INET)
		a->sin.sin_port = htons((uint16_t)port);
	else
		a->sin6.sin6_port = htons((uint16_t)port);
}

static unsigned sa_port(const union dgv_sockaddr *a)
{
	return ntohs(a->sa.sa_family == AF_INET ? a->sin.sin_port : a->sin6.sin6_port);
}

static const char *sa_str(const union dgv_sockaddr *a, char *buf, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof ip);
		snprintf(buf, n, "%s:%u", ip, sa_port(a));
	} else {
		inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof ip);
		snprintf(buf, n, "[%s]:%u", ip, sa_port(a));
	}
	return buf;
}

/* ---------------------------------------------------------------- control channel */

#define CTL_MAGIC 0x44475046u /* "DGPF" */
#define CTL_VERSION 1u
enum { CTL_ANY = 0, CTL_HELLO, CTL_HELLO_OK, CTL_ERR, CTL_SETUP, CTL_START, CTL_READY, CTL_DONE,
       CTL_REPORT, CTL_BYE };
static const char *const ctl_names[] = { "any", "HELLO", "HELLO_OK", "ERR", "SETUP", "START",
					 "READY", "DONE", "REPORT", "BYE" };
#define CTL_NV 12

/* Fixed-size message; integers travel big-endian. */
struct ctl_msg {
	uint32_t magic;
	uint32_t type;
	uint64_t v[CTL_NV];
	uint8_t addr[16];
	char text[320];
};

static const char *peer_role(void) { return g_server ? "client" : "server"; }

static int io_wait(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		uint64_t t = now_ns();
		struct pollfd p = { .fd = fd, .events = ev };
		int r;

		if (t >= deadline)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int)((deadline - t + NS_PER_MS - 1) / NS_PER_MS));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int ctl_write(const struct ctl_msg *m, int timeout_ms)
{
	struct ctl_msg w = *m;
	const uint8_t *p = (const uint8_t *)&w;
	size_t left = sizeof w;
	uint64_t dl = now_ns() + (uint64_t)timeout_ms * NS_PER_MS;

	w.magic = htobe32(CTL_MAGIC);
	w.type = htobe32(m->type);
	for (int i = 0; i < CTL_NV; i++)
		w.v[i] = htobe64(m->v[i]);
	w.text[sizeof w.text - 1] = 0;
	while (left) {
		ssize_t r = send(g_ctl, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r > 0) {
			p += r;
			left -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int e = io_wait(g_ctl, POLLOUT, dl);

			if (e)
				return e;
			continue;
		}
		return r < 0 ? -errno : -EPIPE;
	}
	return 0;
}

static void ctl_send_err(int code, const char *text)
{
	struct ctl_msg m;

	memset(&m, 0, sizeof m);
	m.type = CTL_ERR;
	m.v[0] = (uint64_t)code;
	memcpy(m.text, text, strnlen(text, sizeof m.text - 1));
	(void)ctl_write(&m, 1000);
}

static void ctl_send(uint32_t type, struct ctl_msg *m)
{
	int r;

	m->type = type;
	r = ctl_write(m, CTL_TIMEOUT_MS);
	if (r)
		die(1, "control channel: cannot send %s to the %s: %s", ctl_names[type], peer_role(),
		    strerror(-r));
}

/* Reads one whole message: 0, -ETIMEDOUT, -EPIPE (closed), -EPROTO (not ours) or -errno. */
static int ctl_read(struct ctl_msg *m, uint64_t deadline)
{
	uint8_t *p = (uint8_t *)m;
	size_t got = 0;

	while (got < sizeof *m) {
		ssize_t r = recv(g_ctl, p + got, sizeof *m - got, MSG_DONTWAIT);

		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		if (r == 0)
			return -EPIPE;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int e = io_wait(g_ctl, POLLIN, deadline);

			if (e)
				return e;
			continue;
		}
		return -errno;
	}
	m->magic = be32toh(m->magic);
	m->type = be32toh(m->type);
	for (int i = 0; i < CTL_NV; i++)
		m->v[i] = be64toh(m->v[i]);
	m->text[sizeof m->text - 1] = 0;
	if (m->magic != CTL_MAGIC || m->type == CTL_ANY || m->type > CTL_BYE)
		return -EPROTO;
	return 0;
}

/* Receives a message of type want (CTL_ANY: any but ERR); an ERR from the peer ends us. */
static void ctl_recv(uint32_t want, struct ctl_msg *m, int timeout_ms, const char *what)
{
	int r = ctl_read(m, now_ns() + (uint64_t)timeout_ms * NS_PER_MS);

	if (r == -ETIMEDOUT)
		die(1, "timed out after %d s waiting for the %s (%s)", timeout_ms / 1000, peer_role(), what);
	if (r == -EPIPE || r == -ECONNRESET)
		die(1, "the %s closed the control connection (while waiting for %s)", peer_role(), what);
	if (r == -EPROTO)
		die(1, "garbage on the control connection: is the peer a dgperf of the same version?");
	if (r)
		die(1, "control channel: %s", strerror(-r));
	if (m->type == CTL_ERR) {
		int code = m->v[0] == 2 ? 2 : 1;

		fflush(stdout);
		fprintf(stderr, "dgperf: the %s failed: %s\n", peer_role(), m->text);
		if (g_die_hook)
			g_die_hook();
		g_dying = true;
		exit(code);
	}
	if (want != CTL_ANY && m->type != want)
		die(1, "control channel: got %s from the %s while waiting for %s", ctl_names[m->type],
		    peer_role(), ctl_names[want]);
}

static bool ctl_readable(void)
{
	struct pollfd p = { .fd = g_ctl, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/*
 * Client, during a measurement: the server says nothing until the client is done, so anything
 * readable on the control connection means it failed (ERR) or died (EOF). Cheap enough for
 * timeouts and a 10 ms cadence, not for every iteration.
 */
static void ctl_check_peer(void)
{
	struct ctl_msg m;
	char c;
	ssize_t r;

	if (!ctl_readable())
		return;
	r = recv(g_ctl, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		die(1, "the %s closed the control connection during the run (did it die?)",
		    peer_role());
	if (r < 0)
		return;
	ctl_recv(CTL_ANY, &m, CTL_TIMEOUT_MS, "the rest of a message");
	die(1, "control channel: unexpected %s from the %s during the run", ctl_names[m.type],
	    peer_role());
}

#define CTL_CHECK_NS (10 * NS_PER_MS)
#define LAT_SILENCE_NS (30 * NS_PER_S) /* no completed round trip for this long: give up */

static void ctl_tune(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* TCP sockets made the plainest way (socket(SOCK_STREAM) or accept, then fcntl for
 * close-on-exec and non-blocking) so that preloaded socket libraries that take only a bare
 * SOCK_STREAM, such as rsocket's librspreload, take ours too (the side-by-side compares them).
 * Returns the fd or -1 (errno). */
static int tcp_setfl(int fd, bool nonblock)
{
	if (fd >= 0 && (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
			(nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0))) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int tcp_socket(int family, bool nonblock) { return tcp_setfl(socket(family, SOCK_STREAM, 0), nonblock); }

static int tcp_accept(int lfd, bool nonblock) { return tcp_setfl(accept(lfd, NULL, NULL), nonblock); }

static int ctl_connect(const char *host, unsigned port)
{
	struct addrinfo hints, *res = NULL, *ai;
	char ps[16], where[300];
	uint64_t deadline = now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * NS_PER_MS;
	int err = 0, r;

	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof ps, "%u", port);
	snprintf(where, sizeof where, "%s port %u", host, port);
	r = getaddrinfo(host, ps, &hints, &res);
	if (r)
		die(1, "cannot resolve peer '%s': %s", host,
		    r == EAI_SYSTEM ? strerror(errno) : gai_strerror(r));
	for (;;) {
		bool refused_only = true;

		for (ai = res; ai; ai = ai->ai_next) {
			int fd = tcp_socket(ai->ai_family, true);
			int e = 0;
			socklen_t el = sizeof e;

			if (fd < 0) {
				err = errno;
				refused_only = false;
				continue;
			}
			if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
				e = 0;
			else if (errno == EINPROGRESS) {
				e = io_wait(fd, POLLOUT, deadline);
				if (e == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
					e = errno;
				else if (e < 0)
					e = -e;
			} else
				e = errno;
			if (e == 0) {
				int fl = fcntl(fd, F_GETFL);

				fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
				freeaddrinfo(res);
				ctl_tune(fd);
				return fd;
			}
			close(fd);
			err = e;
			if (e != ECONNREFUSED)
				refused_only = false;
		}
		/* Nobody listening yet: the server may still be starting; retry until the deadline. */
		if (!refused_only || now_ns() + 100 * NS_PER_MS >= deadline)
			break;
		usleep(100000);
	}
	freeaddrinfo(res);
	if (err == ETIMEDOUT)
		die(1, "cannot connect to %s: no answer within %d s", where, CONNECT_TIMEOUT_MS / 1000);
	if (err == ECONNREFUSED)
		die(1, "cannot connect to %s: connection refused for %d s (is a dgperf server running "
		    "there with the same -p?)", where, CONNECT_TIMEOUT_MS / 1000);
	die(1, "cannot connect to %s: %s", where, strerror(err));
}

static int ctl_accept(unsigned port)
{
	union dgv_sockaddr a;
	int one = 1, zero = 0, lfd, fd, e;

	memset(&a, 0, sizeof a);
	lfd = opt.bind ? -1 : tcp_socket(AF_INET6, false);
	if (lfd >= 0) {
		a.sin6.sin6_family = AF_INET6;
		a.sin6.sin6_addr = in6addr_any;
		a.sin6.sin6_port = htons((uint16_t)port);
		setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(lfd, &a.sa, sizeof a.sin6) < 0) {
			e = errno;
			close(lfd);
			lfd = -1;
			if (e == EADDRINUSE)
				die(1, "cannot listen on TCP port %u: %s (another dgperf server?)", port,
				    strerror(e));
		}
	}
	if (lfd < 0) { /* no IPv6 here: IPv4 only */
		memset(&a, 0, sizeof a);
		lfd = tcp_socket(AF_INET, false);
		if (lfd < 0)
			die(1, "socket: %s", strerror(errno));
		a.sin.sin_family = AF_INET;
		a.sin.sin_port = htons((uint16_t)port);
		if (opt.bind)
			inet_pton(AF_INET, opt.bind, &a.sin.sin_addr);
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(lfd, &a.sa, sizeof a.sin) < 0)
			die(1, "cannot listen on TCP port %u: %s", port, strerror(errno));
	}
	if (listen(lfd, 4) < 0)
		die(1, "cannot listen on TCP port %u: %s", port, strerror(errno));
	vlog("waiting for a client on TCP port %u", port);
	e = io_wait(lfd, POLLIN, now_ns() + (uint64_t)ACCEPT_TIMEOUT_MS * NS_PER_MS);
	if (e == -ETIMEDOUT)
		die(1, "no client connected to TCP port %u within %d s", port, ACCEPT_TIMEOUT_MS / 1000);
	if (e)
		die(1, "waiting for a client: %s", strerror(-e));
	fd = tcp_accept(lfd, false);
	if (fd < 0)
		die(1, "accept: %s", strerror(errno));
	if (data_on_tcp())
		g_lfd = lfd; /* the data connection comes to the same port */
	else
		close(lfd);
	ctl_tune(fd);
	return fd;
}

static void ctl_local_peer(union dgv_sockaddr *local, socklen_t *llen, union dgv_sockaddr *peer,
			   socklen_t *plen)
{
	socklen_t l = sizeof *local;

	memset(local, 0, sizeof *local);
	memset(peer, 0, sizeof *peer);
	if (getsockname(g_ctl, &local->sa, &l) < 0)
		die(1, "getsockname: %s", strerror(errno));
	l = sizeof *peer;
	if (getpeername(g_ctl, &peer->sa, &l) < 0)
		die(1, "getpeername: %s", strerror(errno));
	sa_normalize(local, llen);
	sa_normalize(peer, plen);
}

static void msg_put_addr(struct ctl_msg *m, const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET) {
		m->v[0] = 4;
		memcpy(m->addr, &a->sin.sin_addr, 4);
	} else {
		m->v[0] = 6;
		m->v[2] = a->sin6.sin6_scope_id;
		memcpy(m->addr, &a->sin6.sin6_addr, 16);
	}
	m->v[1] = sa_port(a);
}

/* The peer's data address; a wildcard address becomes the control connection's peer address. */
static void msg_get_addr(const struct ctl_msg *m, const union dgv_sockaddr *ctl_peer,
			 union dgv_sockaddr *a, socklen_t *len)
{
	memset(a, 0, sizeof *a);
	if (m->v[0] == 4) {
		a->sin.sin_family = AF_INET;
		memcpy(&a->sin.sin_addr, m->addr, 4);
	} else if (m->v[0] == 6) {
		a->sin6.sin6_family = AF_INET6;
		a->sin6.sin6_scope_id = (uint32_t)m->v[2];
		memcpy(&a->sin6.sin6_addr, m->addr, 16);
	} else
		die(1, "control channel: the %s sent an unknown address family", peer_role());
	if (m->v[1] == 0 || m->v[1] > 65535)
		die(1, "control channel: the %s sent port %" PRIu64, peer_role(), m->v[1]);
	sa_set_port(a, (unsigned)m->v[1]);
	sa_normalize(a, len);
	if (sa_is_any(a) && a->sa.sa_family == ctl_peer->sa.sa_family) {
		unsigned port = sa_port(a);

		*a = *ctl_peer;
		sa_set_port(a, port);
	}
}

/* Handshake: the client describes its run, the server checks it runs the same. */
static void hello_fill(struct ctl_msg *m)
{
	memset(m, 0, sizeof *m);
	m->v[0] = CTL_VERSION;
	m->v[1] = (uint64_t)opt.test;
	m->v[2] = opt.raw_tcp ? 5 : opt.raw ? (opt.raw_connected ? 4 : 0) : (uint64_t)opt.transport + 1;
	m->v[3] = opt.seg_set ? opt.seg : 0;
	m->v[4] = opt.loss_set ? (uint64_t)llround(opt.loss * 1e6) + 1 : 0;
	m->v[5] = opt.sweep;
	m->v[6] = opt.sweep ? 0 : opt.size;
	m->v[7] = opt.iters_set ? opt.iters : 0;
}

static void describe(const struct ctl_msg *m, int i, char *buf, size_t n)
{
	switch (i) {
	case 1:
		snprintf(buf, n, "-t %s", m->v[1] < (uint64_t)NTESTS ? test_names[m->v[1]] : "?");
		break;
	case 2:
		snprintf(buf, n, "%s", m->v[2] == 0 ? "--raw-udp" : m->v[2] == 4 ? "--raw-connected" :
			 m->v[2] == 5 ? "--raw-tcp" :
			 m->v[2] <= 3 ? (const char *[]){ "-c UD", "-c RD", "-c RC" }[m->v[2] - 1] : "?");
		break;
	case 3:
		if (m->v[3])
			snprintf(buf, n, "--seg %" PRIu64, m->v[3]);
		else
			snprintf(buf, n, "no --seg");
		break;
	case 4:
		if (m->v[4])
			snprintf(buf, n, "--loss %g", (double)(m->v[4] - 1) / 1e6);
		else
			snprintf(buf, n, "no --loss");
		break;
	case 5:
	case 6:
		if (m->v[5])
			snprintf(buf, n, "-a");
		else
			snprintf(buf, n, "-s %" PRIu64, m->v[6]);
		break;
	case 7:
		if (m->v[7])
			snprintf(buf, n, "-n %" PRIu64, m->v[7]);
		else
			snprintf(buf, n, "no -n");
		break;
	default:
		snprintf(buf, n, "protocol version %" PRIu64, m->v[0]);
	}
}

static void hello_check(const struct ctl_msg *theirs)
{
	struct ctl_msg mine;

	hello_fill(&mine);
	for (int i = 0; i < 8; i++) {
		char a[64], b[64];

		if (mine.v[i] == theirs->v[i])
			continue;
		describe(theirs, i, a, sizeof a);
		describe(&mine, i, b, sizeof b);
		die(2, "option mismatch: the client has %s, the server has %s (both sides need the same "
		    "-c/-t/-s/-a/-n/--seg/--loss/--raw-udp/--raw-tcp)", a, b);
	}
}

/* ---------------------------------------------------------------- the data connection over TCP */

/*
 * RC and --raw-tcp carry their data on a second TCP connection to the server's control port:
 * the server keeps the control port's listening socket (g_lfd) open; for RC the provider listens
 * on it (dgv_listen with adopt_fd), for --raw-tcp dgperf accepts on it. The server sends a random
 * cookie in its SETUP message and the client presents it (RC: in the MPA private data; raw TCP:
 * the first 8 bytes of the stream), so a stray connection to the port is turned away.
 */
static uint64_t g_cookie;

static uint64_t make_cookie(void)
{
	uint64_t c = 0;

	if (getrandom(&c, sizeof c, 0) != (ssize_t)sizeof c)
		c = now_ns() ^ ((uint64_t)getpid() << 40);
	return c ? c : 1;
}

/* Where the client opens the data connection: the server's control address (port PORT). */
static void data_dst(const union dgv_sockaddr *ctl_peer, union dgv_sockaddr *dst, socklen_t *len)
{
	*dst = *ctl_peer;
	sa_set_port(dst, opt.port);
	*len = dst->sa.sa_family == AF_INET ? sizeof dst->sin : sizeof dst->sin6;
}

/* ---------------------------------------------------------------- results */

struct report { /* the receiver's view of one phase */
	uint64_t count;   /* messages (send/records/writes) or datagrams-derived messages (raw) */
	uint64_t bytes;   /* bytes delivered (send: byte_len; raw: payload bytes) */
	uint64_t valid;   /* Write-Record: sum of record.valid_bytes */
	uint64_t lensum;  /* Write-Record: sum of record.length */
	uint64_t delta_ns; /* time from the last arrival to the report */
	uint64_t dgrams;  /* datagrams received (raw; write_bw: QP rx_datagrams) */
	uint64_t rejects; /* write_bw: datagrams the QP received but did not place */
};

static uint64_t *g_samples;
static uint64_t g_samples_cap;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Text output: columns are padded, lines end without blanks. */
static char g_line[256];
static size_t g_len;

static void line_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line_add(const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(g_line + g_len, sizeof g_line - g_len, fmt, ap);
	va_end(ap);
	if (n > 0)
		g_len = g_len + (size_t)n < sizeof g_line ? g_len + (size_t)n : sizeof g_line - 1;
}

static void line_end(void)
{
	while (g_len && g_line[g_len - 1] == ' ')
		g_len--;
	g_line[g_len] = 0;
	puts(g_line);
	g_len = 0;
}

static bool show_delivered(void) { return opt.raw ? !opt.raw_tcp : opt.transport == TR_UD; }

static void print_header(const char *provider, const char *extra)
{
	if (opt.json)
		return;
	printf("# dgperf %s: transport %s, provider %s%s\n", test_names[opt.test], transport_name(),
	       provider, extra);
	if (test_lat()) {
		line_add("#%-9s %-9s %-11s %-14s %-11s %-11s", "bytes", "iters", "t_min[us]",
			 "t_typical[us]", "t_avg[us]", "p99[us]");
	} else {
		line_add("#%-9s %-9s %-12s %-14s", "bytes", "iters", "BW[MB/s]", "MsgRate[Mpps]");
		if (show_delivered())
			line_add(" %-15s", "delivered/sent");
	}
	if (test_kind() == K_WR)
		line_add(" %s", "valid[%]");
	line_end();
	fflush(stdout);
}

/* --detail: what the client knows about the row being printed (filled by client_phase). */
static struct {
	uint64_t pings, lost;                  /* *_lat */
	uint64_t sent, tx_dg, tx_bytes, retx;  /* *_bw; the QP counters only when qp_stats */
	bool qp_stats;
} g_detail;

static void json_num(const char *key, double v, bool null, int prec, bool last)
{
	if (null || !isfinite(v))
		printf("\"%s\":null%s", key, last ? "" : ",");
	else
		printf("\"%s\":%.*f%s", key, prec, v, last ? "" : ",");
}

/* Latency row from n samples of round trips (scale: 0.5 for half round trips). */
static void print_lat_row(uint64_t size, uint64_t n, double scale, double valid_fraction,
			  uint64_t lost, uint64_t pings)
{
	double min = NAN, med = NAN, avg = NAN, p99 = NAN;
	bool wr = test_kind() == K_WR;

	if (n > 0) {
		uint64_t sum = 0, idx = (99 * n + 99) / 100 - 1;

		qsort(g_samples, n, sizeof *g_samples, cmp_u64);
		for (uint64_t i = 0; i < n; i++)
			sum += g_samples[i];
		min = g_samples[0] * scale / 1e3;
		med = (n % 2 ? (double)g_samples[n / 2] :
		       ((double)g_samples[n / 2 - 1] + (double)g_samples[n / 2]) / 2) * scale / 1e3;
		avg = (double)sum / (double)n * scale / 1e3;
		p99 = g_samples[idx] * scale / 1e3;
	}
	if (opt.json) {
		printf("{\"test\":\"%s\",\"transport\":\"%s\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64 ",",
		       test_names[opt.test], transport_name(), size, n);
		json_num("t_min_us", min, n == 0, 3, false);
		json_num("t_typical_us", med, n == 0, 3, false);
		json_num("t_avg_us", avg, n == 0, 3, false);
		json_num("p99_us", p99, n == 0, 3, false);
		json_num("bw_MBps", 0, true, 0, false);
		json_num("msg_rate_Mpps", 0, true, 0, false);
		json_num("valid_fraction", valid_fraction, !wr, 6, true);
		if (opt.detail)
			printf(",\"pings\":%" PRIu64 ",\"lost\":%" PRIu64, pings, lost);
		printf("}\n");
		if (lost)
			vlog("size %" PRIu64 ": %" PRIu64 " of %" PRIu64 " round trips timed out", size,
			     lost, pings);
	} else {
		line_add("%-10" PRIu64 " %-9" PRIu64 " %-11.2f %-14.2f %-11.2f %-11.2f", size, n, min, med,
			 avg, p99);
		if (wr)
			line_add(" %.2f", valid_fraction * 100);
		line_end();
		if (lost)
			printf("# %" PRIu64 " of %" PRIu64 " round trips at %" PRIu64 " B timed out (lost "
			       "messages); they are not in the statistics\n", lost, pings, size);
	}
	fflush(stdout);
}

static void print_bw_row(uint64_t size, uint64_t iters, uint64_t bytes, uint64_t msgs,
			 uint64_t elapsed_ns, double valid_fraction)
{
	double secs = (double)elapsed_ns / 1e9;
	double bw = secs > 0 ? (double)bytes / secs / 1e6 : 0;
	double rate = secs > 0 ? (double)msgs / secs / 1e6 : 0;
	bool wr = test_kind() == K_WR;

	if (opt.json) {
		printf("{\"test\":\"%s\",\"transport\":\"%s\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64 ",",
		       test_names[opt.test], transport_name(), size, iters);
		json_num("t_min_us", 0, true, 0, false);
		json_num("t_typical_us", 0, true, 0, false);
		json_num("t_avg_us", 0, true, 0, false);
		json_num("p99_us", 0, true, 0, false);
		json_num("bw_MBps", bw, false, 3, false);
		json_num("msg_rate_Mpps", rate, false, 6, false);
		json_num("valid_fraction", valid_fraction, !wr, 6, true);
		if (opt.detail) {
			printf(",\"sent_msgs\":%" PRIu64 ",\"delivered_msgs\":%" PRIu64
			       ",\"delivered_bytes\":%" PRIu64 ",", g_detail.sent, msgs, bytes);
			json_num("elapsed_s", secs, false, 6, false);
			if (g_detail.qp_stats)
				printf("\"tx_datagrams\":%" PRIu64 ",\"tx_wire_bytes\":%" PRIu64
				       ",\"rd_retransmits\":%" PRIu64, g_detail.tx_dg, g_detail.tx_bytes,
				       g_detail.retx);
			else
				printf("\"tx_datagrams\":null,\"tx_wire_bytes\":null,\"rd_retransmits\":null");
		}
		printf("}\n");
	} else {
		char dlv[48];

		line_add("%-10" PRIu64 " %-9" PRIu64 " %-12.2f %-14.6f", size, iters, bw, rate);
		snprintf(dlv, sizeof dlv, "%" PRIu64 "/%" PRIu64, msgs, iters);
		if (show_delivered())
			line_add(" %-15s", dlv);
		if (wr)
			line_add(" %.2f", valid_fraction * 100);
		line_end();
	}
	vlog("size %" PRIu64 ": delivered %" PRIu64 " of %" PRIu64 " messages, %" PRIu64 " bytes in %.3f ms",
	     size, msgs, iters, bytes, secs * 1e3);
	fflush(stdout);
}

/* Elapsed time to the receiver's last arrival, from the client's first post. */
static uint64_t bw_elapsed(uint64_t t_start, uint64_t t_report, uint64_t t_local_end,
			   const struct report *rep)
{
	uint64_t e = t_report - t_start;

	if (rep->delta_ns < e)
		e -= rep->delta_ns;
	else
		e = t_local_end - t_start; /* cannot happen with sane clocks */
	return e ? e : 1;
}

static void report_put(struct ctl_msg *m, uint64_t phase, const struct report *r)
{
	memset(m, 0, sizeof *m);
	m->v[0] = phase;
	m->v[1] = r->count;
	m->v[2] = r->bytes;
	m->v[3] = r->valid;
	m->v[4] = r->lensum;
	m->v[5] = r->delta_ns;
	m->v[6] = r->dgrams;
	m->v[7] = r->rejects;
}

static void report_get(const struct ctl_msg *m, uint64_t phase, struct report *r)
{
	if (m->v[0] != phase)
		die(1, "control channel: report for phase %" PRIu64 " while in phase %" PRIu64, m->v[0],
		    phase);
	r->count = m->v[1];
	r->bytes = m->v[2];
	r->valid = m->v[3];
	r->lensum = m->v[4];
	r->delta_ns = m->v[5];
	r->dgrams = m->v[6];
	r->rejects = m->v[7];
}

/* ---------------------------------------------------------------- verbs: state */

static struct {
	struct dgv_context *ctx;
	struct dgv_pd *pd;
	struct dgv_mr *mr;
	struct dgv_cq *scq, *rcq;
	struct dgv_qp *qp;
	struct dgv_ah *ah;
	uint8_t *buf, *tx, *rx; /* tx: source half, rx: target half; area bytes each */
	uint64_t area;
	uint64_t r_base;        /* the peer's buffer: tx half at r_base, rx half at r_base + area */
	uint32_t r_rkey;
	uint32_t max_recv_wr;
	int family;
	long sq_out;            /* send WRs posted and not completed */
	long rq_posted;         /* receives posted and not consumed */
	long rq_want;
	uint64_t phase;         /* wr_id = phase << 32 | index */
	/* send-CQ accounting of the current phase (drain_scq) */
	uint64_t c_done, c_bytes, c_msgs, t_last_c;
	uint64_t want_id;
	bool want_hit;
	uint64_t want_bytes;
	struct dgv_sge rsge;
	struct dgv_recv_wr rwr[RCHAIN];
	struct dgv_send_wr swr[SCHAIN];
	struct dgv_sge ssge[SCHAIN];
	struct dgv_wc wcs[WC_BATCH]; /* send CQ */
	struct dgv_wc wcr[WC_BATCH]; /* receive CQ */
	struct dgv_qp_stats st0;
	/* RC */
	struct dgv_cm_channel *ch;
	struct dgv_listener *lst;
	struct dgv_conn_info conn;
	uint64_t buflen;        /* 2 x area + CTL_PAGE (credit words) */
	uint64_t credit;        /* client: messages the server has room for, in total */
	uint64_t cr_sent;       /* client: Sends (send_bw) or Write-Records (wr_bw) posted, in total */
	uint64_t rq_total;      /* receives ever posted */
	uint64_t rec_total;     /* server: Write-Record completions ever polled */
	uint64_t cr_given;      /* server: the last credit total written to the client */
	uint64_t cr_seq;
	long cr_inflight;       /* server: credit Writes not completed */
	bool rc_up;             /* ESTABLISHED seen */
} V;

static struct dgv_fault g_fault_rx;

/*
 * Server: a client that is alive but stuck (stopped, wedged) sends nothing and never says DONE;
 * CLIENT_SILENCE_NS without a single datagram ends the server instead of the phase budget.
 */
#define CLIENT_SILENCE_NS (60 * NS_PER_S)

struct watch {
	uint64_t next, val, since;
};

static void watch_client(struct watch *w, uint64_t t, const struct report *rep, uint64_t size)
{
	uint64_t v = rep->dgrams;

	if (t < w->next)
		return;
	w->next = t + NS_PER_S;
	if (!opt.raw) {
		struct dgv_qp_stats st;

		v = dgv_qp_stats(V.qp, &st) == 0 ? st.rx_datagrams + st.rx_bytes : 0;
	}
	if (w->since == 0 || v != w->val) {
		w->val = v;
		w->since = t;
	} else if (t - w->since > CLIENT_SILENCE_NS) {
		die(1, "the client sent nothing for %.0f s at %" PRIu64 " B (stopped?)",
		    (double)CLIENT_SILENCE_NS / 1e9, size);
	}
}

static const char *wc_status_str(enum dgv_wc_status s)
{
	switch (s) {
	case DGV_WC_SUCCESS: return "SUCCESS";
	case DGV_WC_LOC_LEN_ERR: return "LOC_LEN_ERR (message longer than the posted buffer)";
	case DGV_WC_LOC_PROT_ERR: return "LOC_PROT_ERR (local protection error)";
	case DGV_WC_LOC_QP_OP_ERR: return "LOC_QP_OP_ERR (opcode not valid on this QP)";
	case DGV_WC_WR_FLUSH_ERR: return "WR_FLUSH_ERR (flushed)";
	case DGV_WC_REM_ACCESS_ERR: return "REM_ACCESS_ERR (the target rejected the access)";
	case DGV_WC_REM_OP_ERR: return "REM_OP_ERR (the target reported an error)";
	case DGV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR (the peer stayed silent)";
	case DGV_WC_PARTIAL: return "PARTIAL";
	case DGV_WC_GENERAL_ERR: return "GENERAL_ERR";
	}
	return "unknown status";
}

static const char *wc_opcode_str(enum dgv_wc_opcode o)
{
	switch (o) {
	case DGV_WC_SEND: return "SEND";
	case DGV_WC_WRITE: return "WRITE";
	case DGV_WC_WRITE_RECORD: return "WRITE_RECORD";
	case DGV_WC_READ: return "READ";
	case DGV_WC_RECV: return "RECV";
	case DGV_WC_RECV_WRITE_RECORD: return "RECV_WRITE_RECORD";
	case DGV_WC_RECV_PLAIN: return "RECV_PLAIN";
	case DGV_WC_SEND_PLAIN: return "SEND_PLAIN";
	}
	return "?";
}

static void rc_explain(void);

static void check_wc(const struct dgv_wc *wc, const char *cq)
{
	struct dgv_async_err e[4];
	int n;

	if (wc->status == DGV_WC_SUCCESS || wc->status == DGV_WC_PARTIAL)
		return;
	/* The QP's error queue says why (e.g. the peer's Terminate). */
	n = V.qp ? dgv_poll_errq(V.qp, 4, e) : 0;
	for (int i = 0; i < n; i++)
		fprintf(stderr, "dgperf: QP error queue: %s (%s, layer %u type %u code %u, msn %u)\n",
			dgv_err_str(e[i].layer, e[i].etype, e[i].ecode),
			e[i].remote ? "reported by the peer" : "detected here", e[i].layer, e[i].etype,
			e[i].ecode, e[i].msn);
	rc_explain();
	die(1, "failed completion on the %s CQ: status %s (%d), opcode %s, wr_id %#" PRIx64
	    ", byte_len %u", cq, wc_status_str(wc->status), (int)wc->status,
	    wc_opcode_str(wc->opcode), wc->wr_id, wc->byte_len);
}

static bool transient(int r) { return r == -ENOMEM || r == -EAGAIN || r == -ENOBUFS || r == -ENOSPC; }

/* Polls the send CQ once (drives progress), accounting completions of the current phase. */
static int drain_scq(void)
{
	int n = dgv_poll_cq(V.scq, WC_BATCH, V.wcs);

	if (n < 0)
		die(1, "dgv_poll_cq (send CQ): %s", strerror(-n));
	if (n == 0)
		return 0;
	for (int i = 0; i < n; i++) {
		const struct dgv_wc *wc = &V.wcs[i];

		V.sq_out--;
		check_wc(wc, "send");
		if (wc->wr_id >> 32 == CR_TAG) {
			V.cr_inflight--;
			continue;
		}
		if (wc->wr_id >> 32 != V.phase)
			continue;
		V.c_done++;
		if (wc->opcode == DGV_WC_READ) {
			uint64_t b = wc->status == DGV_WC_PARTIAL ? wc->record.valid_bytes : wc->byte_len;

			V.c_bytes += b;
			V.c_msgs += b > 0;
			if (wc->wr_id == V.want_id) {
				V.want_hit = true;
				V.want_bytes = b;
			}
		}
	}
	V.t_last_c = now_ns();
	return n;
}

/* Posts one WR; while the send queue is full, reaps completions until deadline. */
static bool post_one(struct dgv_send_wr *wr, uint64_t deadline)
{
	for (unsigned spin = 0;; spin++) {
		struct dgv_send_wr *bad = NULL;
		int r = dgv_post_send(V.qp, wr, &bad);

		if (r == 0) {
			V.sq_out++;
			return true;
		}
		if (!transient(r))
			die(1, "dgv_post_send: %s", strerror(-r));
		drain_scq();
		if ((spin & 15) == 15 && now_ns() > deadline)
			return false;
	}
}

static void post_recvs(void)
{
	while (V.rq_posted < V.rq_want) {
		long k = V.rq_want - V.rq_posted;
		struct dgv_recv_wr *bad = NULL;
		int r;

		if (k > RCHAIN)
			k = RCHAIN;
		for (long j = 0; j < k; j++)
			V.rwr[j].next = j + 1 < k ? &V.rwr[j + 1] : NULL;
		r = dgv_post_recv(V.qp, V.rwr, &bad);
		if (r == 0) {
			V.rq_posted += k;
			V.rq_total += (uint64_t)k;
			continue;
		}
		if (!transient(r))
			die(1, "dgv_post_recv: %s", strerror(-r));
		for (struct dgv_recv_wr *w = V.rwr; w && w != bad; w = w->next) {
			V.rq_posted++;
			V.rq_total++;
		}
		return; /* the receive queue is fuller than we thought: try again later */
	}
}

static void prepare_wr(struct dgv_send_wr *wr, struct dgv_sge *sge, uint64_t size, bool echo)
{
	memset(wr, 0, sizeof *wr);
	memset(sge, 0, sizeof *sge);
	sge->lkey = V.mr->lkey;
	sge->length = (uint32_t)size;
	sge->addr = (uintptr_t)(echo ? V.rx : V.tx);
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->send_flags = DGV_SEND_SIGNALED;
	wr->ah = V.ah;
	wr->rkey = V.r_rkey;
	switch (test_kind()) {
	case K_SEND:
		wr->opcode = DGV_WR_SEND;
		break;
	case K_WR:
		wr->opcode = DGV_WR_WRITE_RECORD;
		wr->remote_addr = V.r_base + V.area;
		break;
	case K_WRITE:
		wr->opcode = DGV_WR_WRITE;
		wr->remote_addr = V.r_base + V.area;
		break;
	case K_READ:
		wr->opcode = DGV_WR_READ;
		sge->addr = (uintptr_t)V.rx;       /* sink: our target half */
		wr->remote_addr = V.r_base;        /* source: the peer's source half */
		break;
	}
}

static void stats_snapshot(void)
{
	if (dgv_qp_stats(V.qp, &V.st0))
		memset(&V.st0, 0, sizeof V.st0);
}

static void stats_log(const char *label)
{
	struct dgv_qp_stats s;
	const struct dgv_qp_stats *o = &V.st0;

	if (!opt.verbose || dgv_qp_stats(V.qp, &s))
		return;
#define D(f) (s.f - o->f)
	vlog("%s QP: tx %" PRIu64 " dg/%" PRIu64 " msgs, rx %" PRIu64 " dg/%" PRIu64
	     " msgs; drops: no_wqe %" PRIu64 " reasm_timeout %" PRIu64 " crc %" PRIu64 " malformed %"
	     PRIu64 " placement %" PRIu64 " dup %" PRIu64 " cq_overflow %" PRIu64 " fault %" PRIu64
	     "; rd: retransmits %" PRIu64 " window_stalls %" PRIu64, label, D(tx_datagrams), D(tx_msgs),
	     D(rx_datagrams), D(rx_msgs), D(no_wqe_drops), D(reasm_timeouts), D(crc_drops),
	     D(malformed_drops), D(placement_rejects), D(dup_drops), D(cq_overflows), D(fault_dropped),
	     D(rd_retransmits), D(rd_window_stalls));
#undef D
}

static void die_stats(void)
{
	stats_log("at the failure:");
}

/* ---------------------------------------------------------------- verbs: RC connection set-up */

/*
 * RC: the client's dgv_connect() goes to the server's TCP PORT, where the provider listens on the
 * control port's listening socket (dgv_listen with adopt_fd). Each side's buffer (address, length,
 * STag) travels in the MPA private data: the client's in the MPA Request, the server's in the
 * Reply. The same private data carries the run's cookie (a stray connection request is rejected)
 * and the server's credits (below).
 *
 * Credits: an RC Send that finds no posted receive ends the connection (RFC 5040: no RNR on
 * iWARP), and a local completion only says the data went to TCP. So for send_bw the client may
 * post a Send only while the server has a receive posted for it: the server's Reply says how many
 * receives it posts first, and the server RDMA-Writes the total it has ever posted into the
 * client's credit word whenever it reposted a quarter of that (as rsockets do). wr_bw uses the
 * same scheme for the server's receive CQ: at most RC_WR_WINDOW Write-Records the server has not
 * polled yet. The credit word is 16 bytes (total, ~total) in a page after the two halves, so a
 * torn read is recognised.
 */
#define RC_PD_MAGIC 0x44475243u /* "DGRC" */
#define RC_RQ 256u              /* receives the RC server keeps posted (send_bw) */
#define RC_WR_WINDOW 1024u
#define CTL_PAGE 4096u          /* after the two halves: credit word, then CR_SLOTS sources */
#define CR_SLOTS 32u
#define RC_EVENT_NS ((uint64_t)(CONNECT_TIMEOUT_MS + 5000) * NS_PER_MS)

struct rc_pdata { /* big-endian in the private data */
	uint32_t magic, version;
	uint64_t cookie, base, len, area;
	uint32_t rkey, credits;
};

static uint8_t *credit_word(void) { return V.buf + 2 * V.area; }

static void pdata_put(struct rc_pdata *p, uint32_t credits)
{
	p->magic = htobe32(RC_PD_MAGIC);
	p->version = htobe32(CTL_VERSION);
	p->cookie = htobe64(g_cookie);
	p->base = htobe64((uintptr_t)V.buf);
	p->len = htobe64(V.buflen);
	p->area = htobe64(V.area);
	p->rkey = htobe32(V.mr->rkey);
	p->credits = htobe32(credits);
}

/* NULL when the private data is this run's (decoded into *p), else why not. */
static const char *pdata_get(const uint8_t *d, uint16_t n, struct rc_pdata *p)
{
	memset(p, 0, sizeof *p);
	if (n < sizeof *p)
		return "no dgperf private data in the MPA frame";
	memcpy(p, d, sizeof *p);
	p->magic = be32toh(p->magic);
	p->version = be32toh(p->version);
	p->cookie = be64toh(p->cookie);
	p->base = be64toh(p->base);
	p->len = be64toh(p->len);
	p->area = be64toh(p->area);
	p->rkey = be32toh(p->rkey);
	p->credits = be32toh(p->credits);
	if (p->magic != RC_PD_MAGIC)
		return "no dgperf private data in the MPA frame";
	if (p->version != CTL_VERSION)
		return "private data of another dgperf version";
	if (p->cookie != g_cookie)
		return "private data without this run's cookie";
	if (p->area != V.area || p->len < 2 * V.area + CTL_PAGE)
		return "the peer's buffer layout differs from ours";
	return NULL;
}

static const char *cm_ev_name(enum dgv_cm_event_type t)
{
	switch (t) {
	case DGV_CM_CONNECT_REQUEST: return "CONNECT_REQUEST";
	case DGV_CM_ESTABLISHED: return "ESTABLISHED";
	case DGV_CM_REJECTED: return "REJECTED";
	case DGV_CM_CONNECT_ERROR: return "CONNECT_ERROR";
	case DGV_CM_DISCONNECTED: return "DISCONNECTED";
	case DGV_CM_PEER_CLOSED: return "PEER_CLOSED";
	}
	return "unknown event";
}

/* One line about an event: its type, status, the Terminate triple and printable private data. */
static const char *cm_ev_str(const struct dgv_cm_event *ev, char *buf, size_t n)
{
	size_t k = 0;
	int w = snprintf(buf, n, "%s", cm_ev_name(ev->type));

	k = w > 0 && (size_t)w < n ? (size_t)w : n - 1;
	if (ev->status && ev->type != DGV_CM_REJECTED && k < n) {
		int e = -ev->status;

		w = snprintf(buf + k, n - k, ": %s", e == ECONNREFUSED ? "connection refused (nobody listening)" :
			     e == ETIMEDOUT ? "timed out (TCP connect or MPA exchange)" :
			     e == EPROTO ? "protocol error (malformed or unexpected MPA/DDP/RDMAP)" :
			     e == ECONNRESET ? "connection reset by the peer" : strerror(e));
		k += w > 0 ? (size_t)w : 0;
	}
	if ((ev->term_layer || ev->term_etype || ev->term_ecode) && k < n) {
		w = snprintf(buf + k, n - k, "; Terminate: %s (layer %u type %u code %u)",
			     dgv_err_str(ev->term_layer, ev->term_etype, ev->term_ecode), ev->term_layer,
			     ev->term_etype, ev->term_ecode);
		k += w > 0 ? (size_t)w : 0;
	}
	if (ev->pdata_len && k < n) {
		bool text = true;

		for (uint16_t i = 0; i < ev->pdata_len && text; i++)
			text = (ev->pdata[i] >= 0x20 && ev->pdata[i] < 0x7f) || (!ev->pdata[i] && i + 1 == ev->pdata_len);
		if (text)
			snprintf(buf + k, n - k, "; peer says \"%.*s\"", (int)ev->pdata_len, (const char *)ev->pdata);
	}
	return buf;
}

/* After a failed completion on RC: the connection events say why (printed, not consumed). */
static void rc_explain(void)
{
	struct dgv_cm_event ev;
	char b[400];

	if (!V.ch)
		return;
	while (dgv_cm_get_event(V.ch, &ev) == 0)
		fprintf(stderr, "dgperf: RC connection event: %s\n", cm_ev_str(&ev, b, sizeof b));
}

/* Client: the total number of messages the server has room for (see Credits above). */
static uint64_t rc_credit(void)
{
	const volatile uint64_t *w = (const volatile uint64_t *)(const void *)credit_word();
	uint64_t a = be64toh(w[0]), b = be64toh(w[1]);

	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (b == ~a && a > V.credit)
		V.credit = a;
	return V.credit;
}

/* Server: tells the client its new total once it grew by a quarter of the window. */
static void rc_give_credit(uint64_t total)
{
	uint64_t step = (test_kind() == K_SEND ? V.max_recv_wr : RC_WR_WINDOW) / 4, a, b;
	struct dgv_send_wr wr, *bad = NULL;
	struct dgv_sge sge;
	uint8_t *slot;
	int r;

	if (total - V.cr_given < step)
		return;
	if (V.cr_inflight >= (long)CR_SLOTS) {
		drain_scq();
		if (V.cr_inflight >= (long)CR_SLOTS)
			return;
	}
	slot = credit_word() + 64 + (V.cr_seq % CR_SLOTS) * 16; /* untouched until its Write completes */
	a = htobe64(total);
	b = htobe64(~total);
	memcpy(slot, &a, 8);
	memcpy(slot + 8, &b, 8);
	memset(&wr, 0, sizeof wr);
	sge.addr = (uintptr_t)slot;
	sge.length = 16;
	sge.lkey = V.mr->lkey;
	wr.wr_id = CR_TAG << 32 | (V.cr_seq & 0xffffffffu);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = DGV_WR_WRITE;
	wr.send_flags = DGV_SEND_SIGNALED;
	wr.remote_addr = V.r_base + 2 * V.area;
	wr.rkey = V.r_rkey;
	r = dgv_post_send(V.qp, &wr, &bad);
	if (r) {
		if (!transient(r))
			die(1, "dgv_post_send (credit Write): %s", strerror(-r));
		return; /* the send queue is full: next time */
	}
	V.sq_out++;
	V.cr_inflight++;
	V.cr_seq++;
	V.cr_given = total;
}

/* The next connection event by deadline (false at the deadline); the peer's ERR or death on the
 * control connection ends us meanwhile. */
static bool rc_next_event(struct dgv_cm_event *ev, uint64_t deadline)
{
	for (;;) {
		int r = dgv_cm_get_event(V.ch, ev);
		uint64_t t;

		if (r == 0)
			return true;
		if (r != -EAGAIN)
			die(1, "dgv_cm_get_event: %s", strerror(-r));
		ctl_check_peer();
		t = now_ns();
		if (t >= deadline)
			return false;
		r = dgv_cm_wait(V.ch, (int)((deadline - t) / NS_PER_MS < 100 ? (deadline - t) / NS_PER_MS + 1 : 100));
		if (r && r != -ETIMEDOUT && r != -EINTR && r != -EAGAIN)
			die(1, "dgv_cm_wait: %s", strerror(-r));
	}
}

static void __attribute__((noreturn)) rc_unsupported(const char *call, int r)
{
	die(2, "transport RC is not supported by the %s provider (%s: %s)", dgv_provider_name(V.ctx), call,
	    strerror(-r));
}

/* Waits for ESTABLISHED of our QP; anything else about it is fatal, naming the cause. */
static void rc_wait_established(const char *what, struct rc_pdata *peer_pd)
{
	uint64_t dl = now_ns() + RC_EVENT_NS;
	struct dgv_cm_event ev;
	char b[400];

	for (;;) {
		if (!rc_next_event(&ev, dl))
			die(1, "%s: no ESTABLISHED, REJECTED or CONNECT_ERROR within %.0f s", what,
			    (double)RC_EVENT_NS / 1e9);
		if (ev.type == DGV_CM_CONNECT_REQUEST) { /* server: a second request while we accept */
			vlog("rejected a second connection request");
			dgv_reject(ev.req, "dgperf: busy", 12);
			continue;
		}
		if (ev.qp != V.qp) {
			vlog("ignored %s about another connection", cm_ev_str(&ev, b, sizeof b));
			continue;
		}
		if (ev.type == DGV_CM_REJECTED)
			die(1, "%s: the server rejected the connection (MPA Reply with the Reject bit)%s", what,
			    cm_ev_str(&ev, b, sizeof b) + strlen("REJECTED"));
		if (ev.type != DGV_CM_ESTABLISHED)
			die(1, "%s failed: %s", what, cm_ev_str(&ev, b, sizeof b));
		if (peer_pd) {
			const char *why = pdata_get(ev.pdata, ev.pdata_len, peer_pd);

			if (why)
				die(1, "%s: the server's MPA Reply: %s", what, why);
		}
		V.conn = ev.info;
		sa_normalize(&V.conn.local, &V.conn.local_len); /* (a dual-stack listener's v4-mapped) */
		sa_normalize(&V.conn.peer, &V.conn.peer_len);
		V.rc_up = true;
		return;
	}
}

static void rc_setup(struct dgv_qp_init_attr *qa, const union dgv_sockaddr *ctl_peer)
{
	struct dgv_conn_param param;
	struct rc_pdata mine, theirs;
	struct ctl_msg m;
	char s1[80], s2[80];
	int r;

	r = dgv_cm_create_channel(V.ctx, &V.ch);
	if (r == -EOPNOTSUPP || r == -ENOSYS)
		rc_unsupported("dgv_cm_create_channel", r);
	if (r)
		die(1, "dgv_cm_create_channel: %s", strerror(-r));
	qa->cm_channel = V.ch;
	memset(&param, 0, sizeof param);
	param.crc = -1;
	param.private_data = &mine;
	param.private_data_len = sizeof mine;

	if (g_server) {
		uint32_t credits = test_kind() == K_SEND ? (test_lat() ? RQ_LAT : RC_RQ) : RC_WR_WINDOW;
		uint64_t dl;
		struct dgv_cm_event ev;

		uint16_t own_port = 0;
		r = dgv_listen(V.ctx, NULL, 0, 4, g_lfd, V.ch, NULL, &V.lst);
		if (r == -EOPNOTSUPP && !strcmp(dgv_provider_name(V.ctx), "ibverbs")) {
			/* an iWARP device listens on a kernel TCP port of its own, which our control
			 * socket already holds: a port of its choice on the control connection's
			 * address, told to the client in CTL_SETUP */
			union dgv_sockaddr la;
			socklen_t ll = sizeof la;
			if (getsockname(g_ctl, &la.sa, &ll))
				die(1, "getsockname (control connection): %s", strerror(errno));
			sa_normalize(&la, &ll);
			sa_set_port(&la, 0);
			r = dgv_listen(V.ctx, &la.sa, ll, 4, -1, V.ch, NULL, &V.lst);
			if (!r && (r = dgv_listener_addr(V.lst, &la, &ll)) == 0) {
				own_port = la.sa.sa_family == AF_INET ? ntohs(la.sin.sin_port) : ntohs(la.sin6.sin6_port);
				vlog("RC listener on its own TCP port %u (the device cannot share port %u)", own_port,
				     opt.port);
			}
		}
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_listen", r);
		if (r)
			die(1, "dgv_listen on TCP port %u: %s", opt.port, strerror(-r));
		g_cookie = make_cookie();
		memset(&m, 0, sizeof m);
		m.v[0] = g_cookie;
		m.v[1] = own_port; /* 0: the control port */
		ctl_send(CTL_SETUP, &m); /* "listening" */
		dl = now_ns() + RC_EVENT_NS;
		for (;;) {
			const char *why;
			char b[400];

			if (!rc_next_event(&ev, dl))
				die(1, "no RC connection request from the client on TCP port %u within %.0f s",
				    opt.port, (double)RC_EVENT_NS / 1e9);
			if (ev.type != DGV_CM_CONNECT_REQUEST) {
				/* a connection that failed before its MPA Request was read */
				vlog("listener: %s", cm_ev_str(&ev, b, sizeof b));
				if (ev.req)
					dgv_reject(ev.req, NULL, 0);
				continue;
			}
			why = pdata_get(ev.pdata, ev.pdata_len, &theirs);
			if (!why)
				break;
			if (theirs.magic == RC_PD_MAGIC && theirs.cookie == g_cookie) { /* our client, but wrong */
				char text[120];

				snprintf(text, sizeof text, "dgperf: %s", why);
				dgv_reject(ev.req, text, (uint16_t)strlen(text));
				die(1, "the client's MPA Request: %s (rejected)", why);
			}
			sa_normalize(&ev.info.peer, &ev.info.peer_len);
			vlog("rejected a connection request from %s: %s", sa_str(&ev.info.peer, b, sizeof b), why);
			dgv_reject(ev.req, "dgperf: not this run", 20);
		}
		pdata_put(&mine, credits);
		V.cr_given = credits; /* the client starts from these */
		r = dgv_accept(ev.req, V.pd, qa, &param, &V.qp);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_accept", r);
		if (r)
			die(1, "dgv_accept: %s", strerror(-r));
		g_die_hook = die_stats;
		rc_wait_established("RC accept", NULL);
	} else {
		union dgv_sockaddr dst;
		socklen_t dlen;

		ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its RC listener");
		g_cookie = m.v[0];
		data_dst(ctl_peer, &dst, &dlen);
		if (m.v[1] && m.v[1] <= 65535)
			sa_set_port(&dst, (unsigned)m.v[1]); /* the server's device listens on its own port */
		pdata_put(&mine, 0);
		r = dgv_connect(V.pd, qa, &dst.sa, dlen, &param, &V.qp);
		if (r == -EOPNOTSUPP || r == -ENOSYS)
			rc_unsupported("dgv_connect", r);
		if (r)
			die(1, "dgv_connect to TCP %s: %s", sa_str(&dst, s1, sizeof s1), strerror(-r));
		g_die_hook = die_stats;
		snprintf(s2, sizeof s2, "RC connection to TCP %s", sa_str(&dst, s1, sizeof s1));
		rc_wait_established(s2, &theirs);
		V.credit = theirs.credits;
	}
	/* the peer's buffer: the client's came in its MPA Request, the server's in its Reply */
	V.r_base = theirs.base;
	V.r_rkey = theirs.rkey;
	vlog("provider %s, RC %s -> %s, MPA rev %u, CRC %s, markers rx %s tx %s, IRD %u ORD %u, rkey %#x, "
	     "buffer 2 x %" PRIu64 " B", dgv_provider_name(V.ctx), sa_str(&V.conn.local, s1, sizeof s1),
	     sa_str(&V.conn.peer, s2, sizeof s2), V.conn.mpa_rev, V.conn.crc ? "on" : "off",
	     V.conn.markers_rx ? "on" : "off", V.conn.markers_tx ? "on" : "off", V.conn.ird, V.conn.ord,
	     V.r_rkey, V.area);
}

/* UD and RD: the QP is bound to a UDP address; address and MR go over the control channel. */
static void dg_setup(struct dgv_qp_init_attr *qa, const union dgv_sockaddr *bind_addr,
		     const union dgv_sockaddr *ctl_peer)
{
	union dgv_sockaddr mine, peer;
	socklen_t mlen = sizeof mine, plen;
	struct ctl_msg m;
	char s1[80], s2[80];
	int r;

	r = dgv_create_qp(V.pd, qa, &V.qp);
	if (r == -EINVAL && qa->max_recv_wr > 256) { /* the provider may cap the receive queue */
		qa->max_recv_wr = 0;
		r = dgv_create_qp(V.pd, qa, &V.qp);
	}
	if (r == -EADDRINUSE)
		die(1, "cannot bind the QP to UDP %s: %s", sa_str(bind_addr, s1, sizeof s1), strerror(-r));
	if (r == -EINVAL && opt.seg_set)
		die(2, "invalid --seg value %u for the %s provider: dgv_create_qp rejects it (%s); it must "
		    "leave room for the datagram headers and the provider's smallest segment",
		    opt.seg, dgv_provider_name(V.ctx), strerror(-r));
	if (r)
		die(1, "dgv_create_qp (%s, seg %u, bound to %s): %s", tr_names[opt.transport], qa->seg_size,
		    sa_str(bind_addr, s1, sizeof s1), strerror(-r));
	g_die_hook = die_stats;
	memset(&mine, 0, sizeof mine);
	r = dgv_qp_local_addr(V.qp, &mine, &mlen);
	if (r)
		die(1, "dgv_qp_local_addr: %s", strerror(-r));
	sa_normalize(&mine, &mlen);

	/* exchange QP address and MR */
	memset(&m, 0, sizeof m);
	msg_put_addr(&m, &mine);
	m.v[3] = (uintptr_t)V.buf;
	m.v[4] = V.mr->rkey;
	m.v[5] = V.buflen;
	m.v[6] = V.area;
	ctl_send(CTL_SETUP, &m);
	ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its QP address");
	msg_get_addr(&m, ctl_peer, &peer, &plen);
	if (m.v[6] != V.area || m.v[5] < 2 * V.area)
		die(1, "the %s registered %" PRIu64 " bytes with %" PRIu64 "-byte halves, we expected %"
		    PRIu64 "-byte halves", peer_role(), m.v[5], m.v[6], V.area);
	V.r_base = m.v[3];
	V.r_rkey = (uint32_t)m.v[4];
	r = dgv_create_ah(V.pd, &peer.sa, plen, &V.ah);
	if (r)
		die(1, "dgv_create_ah(%s): %s", sa_str(&peer, s1, sizeof s1), strerror(-r));
	vlog("provider %s, %s QP %s -> peer %s, rkey %#x, buffer 2 x %" PRIu64 " B",
	     dgv_provider_name(V.ctx), tr_names[opt.transport], sa_str(&mine, s1, sizeof s1),
	     sa_str(&peer, s2, sizeof s2), V.r_rkey, V.area);
}

static void vb_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	struct dgv_context_attr ca = { .provider = opt.provider, .progress = DGV_PROGRESS_AUTO };
	struct dgv_qp_init_attr qa;
	union dgv_sockaddr bind_addr;
	socklen_t blen;
	int r;

	V.area = (max_msg_size() + 4095) & ~(uint64_t)4095;
	V.family = ctl_local->sa.sa_family;
	r = dgv_open(&ca, &V.ctx);
	if (r == -ENODEV)
		die(1, "the %s verbs provider is not available (dgv_open: %s)",
		    opt.provider == DGV_PROV_SOFT ? "soft" : opt.provider == DGV_PROV_IBVERBS ? "ibverbs" :
		    "default", strerror(-r));
	if (r)
		die(1, "dgv_open: %s", strerror(-r));
	r = dgv_alloc_pd(V.ctx, &V.pd);
	if (r)
		die(1, "dgv_alloc_pd: %s", strerror(-r));
	V.buflen = 2 * V.area + CTL_PAGE;
	if (posix_memalign((void **)&V.buf, 4096, (size_t)V.buflen))
		die(1, "cannot allocate %" PRIu64 " bytes", V.buflen);
	memset(V.buf, 0, (size_t)V.buflen);
	V.tx = V.buf;
	V.rx = V.buf + V.area;
	for (uint64_t i = 0; i < V.area; i++)
		V.tx[i] = (uint8_t)(i * 7 + 1);
	r = dgv_reg_mr(V.pd, V.buf, (size_t)V.buflen,
		       DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &V.mr);
	if (r)
		die(1, "dgv_reg_mr of %" PRIu64 " bytes: %s", V.buflen, strerror(-r));
	r = dgv_create_cq(V.ctx, SCQ_ENTRIES, &V.scq);
	if (r)
		die(1, "dgv_create_cq: %s", strerror(-r));
	r = dgv_create_cq(V.ctx, RCQ_ENTRIES, &V.rcq);
	if (r)
		die(1, "dgv_create_cq: %s", strerror(-r));

	bind_addr = *ctl_local;
	sa_set_port(&bind_addr, g_server ? opt.port : 0);
	blen = bind_addr.sa.sa_family == AF_INET ? sizeof bind_addr.sin : sizeof bind_addr.sin6;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = opt.transport == TR_UD ? DGV_QPT_UD : opt.transport == TR_RD ? DGV_QPT_RD : DGV_QPT_RC;
	qa.send_cq = V.scq;
	qa.recv_cq = V.rcq;
	qa.max_send_wr = SQ_WR;
	qa.max_recv_wr = test_kind() == K_SEND ? RQ_BW : 0;
	qa.seg_size = opt.seg_set ? opt.seg : 0;
	qa.bind_addr = &bind_addr.sa;
	qa.bind_len = blen;
	qa.bind_family = bind_addr.sa.sa_family;
	if (opt.loss_set) {
		memset(&g_fault_rx, 0, sizeof g_fault_rx);
		g_fault_rx.loss_pct = opt.loss;
		qa.fault_rx = &g_fault_rx;
	}
	if (opt.transport == TR_RC) {
		qa.max_recv_wr = RC_RQ;
		if (g_server) { /* dgv_accept uses the request's socket */
			qa.bind_addr = NULL;
			qa.bind_len = 0;
		} else {
			sa_set_port(&bind_addr, 0);
		}
		rc_setup(&qa, ctl_peer);
	} else {
		dg_setup(&qa, &bind_addr, ctl_peer);
	}
	V.max_recv_wr = qa.max_recv_wr ? qa.max_recv_wr : 256;

	V.rsge.addr = (uintptr_t)V.rx;
	V.rsge.length = (uint32_t)V.area;
	V.rsge.lkey = V.mr->lkey;
	for (int j = 0; j < RCHAIN; j++) {
		V.rwr[j].wr_id = j;
		V.rwr[j].sg_list = &V.rsge;
		V.rwr[j].num_sge = 1;
	}
	V.rq_want = 0;
	if (test_kind() == K_SEND) {
		if (g_server)
			V.rq_want = test_lat() ? RQ_LAT : (long)V.max_recv_wr;
		else
			V.rq_want = test_lat() ? RQ_LAT : 0;
	}
	post_recvs();
}

/* RC: an orderly close (both sides call it after BYE), bounded; then the objects go. */
static void rc_teardown(void)
{
	struct dgv_cm_event ev;
	uint64_t dl = now_ns() + 3 * NS_PER_S;
	char b[400];
	int r;

	if (!V.qp || !V.rc_up)
		return;
	r = dgv_disconnect(V.qp);
	if (r) {
		vlog("dgv_disconnect: %s", strerror(-r));
		return;
	}
	for (;;) {
		r = dgv_cm_get_event(V.ch, &ev);
		if (r == 0) {
			if (ev.type == DGV_CM_CONNECT_REQUEST) {
				dgv_reject(ev.req, NULL, 0);
				continue;
			}
			if (ev.qp == V.qp && ev.type == DGV_CM_DISCONNECTED) {
				if (ev.status)
					vlog("disconnect: %s", cm_ev_str(&ev, b, sizeof b));
				return;
			}
			continue;
		}
		if (r != -EAGAIN || now_ns() >= dl)
			break;
		dgv_cm_wait(V.ch, 50);
	}
	vlog("no DISCONNECTED within 3 s of dgv_disconnect (QP state %d)", (int)dgv_qp_state(V.qp));
}

static void vb_teardown(void)
{
	int r;

	if (opt.transport == TR_RC)
		rc_teardown();
	if (V.ah && (r = dgv_destroy_ah(V.ah)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_ah: %s\n", strerror(-r));
	if ((r = dgv_destroy_qp(V.qp)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_qp: %s\n", strerror(-r));
	if (V.lst && (r = dgv_listener_destroy(V.lst)))
		fprintf(stderr, "dgperf: warning: dgv_listener_destroy: %s\n", strerror(-r));
	if (V.ch) {
		struct dgv_cm_event ev;

		while (dgv_cm_get_event(V.ch, &ev) == 0)
			if (ev.type == DGV_CM_CONNECT_REQUEST)
				dgv_reject(ev.req, NULL, 0);
		if ((r = dgv_cm_destroy_channel(V.ch)))
			fprintf(stderr, "dgperf: warning: dgv_cm_destroy_channel: %s\n", strerror(-r));
	}
	if ((r = dgv_destroy_cq(V.scq)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_cq: %s\n", strerror(-r));
	if ((r = dgv_destroy_cq(V.rcq)))
		fprintf(stderr, "dgperf: warning: dgv_destroy_cq: %s\n", strerror(-r));
	if ((r = dgv_dereg_mr(V.mr)))
		fprintf(stderr, "dgperf: warning: dgv_dereg_mr: %s\n", strerror(-r));
	if ((r = dgv_dealloc_pd(V.pd)))
		fprintf(stderr, "dgperf: warning: dgv_dealloc_pd: %s\n", strerror(-r));
	dgv_close(V.ctx);
	free(V.buf);
}

/* ---------------------------------------------------------------- verbs: latency */

static bool record_covers(const struct dgv_record *rec, uint64_t k)
{
	return rec->nranges > 0 && rec->ranges && rec->ranges[0].offset == 0 && rec->ranges[0].length >= k;
}

/* Waits for the pong on the receive CQ (send_lat: RECV; wr_lat: RECV_WRITE_RECORD) whose first
 * k bytes echo our ping; returns the time it was seen, or 0 at the deadline. */
static uint64_t wait_rcq_pong(uint64_t size, uint64_t k, uint64_t deadline)
{
	int kind = test_kind();

	for (unsigned spin = 1;; spin++) {
		int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
		uint64_t hit = 0;
		long consumed = 0;

		if (n < 0)
			die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
		for (int j = 0; j < n; j++) {
			const struct dgv_wc *wc = &V.wcr[j];

			check_wc(wc, "receive");
			if (wc->opcode == DGV_WC_RECV) {
				consumed++;
				if (kind == K_SEND && !hit && wc->byte_len == size && !memcmp(V.rx, V.tx, k))
					hit = now_ns();
			} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD) {
				if (kind == K_WR && !hit && wc->record.valid_bytes > 0 && wc->record.length == size &&
				    (!record_covers(&wc->record, k) || !memcmp(V.rx, V.tx, k)))
					hit = now_ns();
			}
		}
		if (consumed) {
			V.rq_posted -= consumed;
			post_recvs();
		}
		if (hit)
			return hit;
		if ((spin & 15) == 0) {
			drain_scq(); /* errors of our sends surface here */
			if (now_ns() > deadline)
				return 0;
		}
	}
}

/* write_lat: spin on the last byte of our target half until the peer's write changes it. */
static uint64_t wait_byte(const uint8_t *p, uint8_t val, uint64_t deadline)
{
	const volatile uint8_t *vp = p;

	for (unsigned spin = 1;; spin++) {
		if (*vp == val) {
			uint64_t t = now_ns();

			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			return t;
		}
		drain_scq(); /* drives progress, so the peer's write gets placed */
		if ((spin & 15) == 0 && now_ns() > deadline)
			return 0;
	}
}

static uint64_t wait_read(uint64_t deadline)
{
	for (unsigned spin = 1;; spin++) {
		drain_scq();
		if (V.want_hit)
			return V.want_bytes ? now_ns() : 0;
		if ((spin & 15) == 0 && now_ns() > deadline)
			return 0;
	}
}

struct lat_run {
	uint64_t nsamp, lost, pings;
};

/* After a lost round trip (client): is the server still there, and answering at all? */
static void lat_timeout_check(uint64_t last_ok)
{
	ctl_check_peer();
	if (now_ns() - last_ok > LAT_SILENCE_NS)
		die(1, "%s: no round trip completed for %.0f s: the server stopped answering",
		    test_names[opt.test], (double)LAT_SILENCE_NS / 1e9);
}

static uint32_t g_seq;

static void vb_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	struct dgv_send_wr wr;
	struct dgv_sge sge;
	int kind = test_kind();
	uint64_t k = size < 4 ? size : 4;
	uint64_t to = lat_timeout_ns(size, V.family), last_ok;

	prepare_wr(&wr, &sge, size, false);
	memset(out, 0, sizeof *out);
	last_ok = now_ns();
	for (uint64_t i = 0, good = 0; out->nsamp < iters && i < LAT_ATTEMPTS(warm + iters); i++) {
		uint32_t seq = ++g_seq;
		uint8_t val = (uint8_t)(seq % 255u + 1u);
		uint64_t t0, t1 = 0;

		if (kind == K_SEND || kind == K_WR)
			memcpy(V.tx, &seq, k);
		else if (kind == K_WRITE)
			V.tx[size - 1] = val;
		wr.wr_id = V.phase << 32 | (i & 0xffffffffu);
		V.want_id = wr.wr_id;
		V.want_hit = false;
		t0 = now_ns();
		if (post_one(&wr, t0 + to)) {
			out->pings++;
			switch (kind) {
			case K_SEND:
			case K_WR:
				t1 = wait_rcq_pong(size, k, t0 + to);
				break;
			case K_WRITE:
				t1 = wait_byte(V.rx + size - 1, val, t0 + to);
				break;
			case K_READ:
				t1 = wait_read(t0 + to);
				break;
			}
		}
		if (!t1) {
			if (reliable())
				die(1, "%s: no %s within %.1f s at %" PRIu64 " B (iteration %" PRIu64 "): is the "
				    "server alive?", test_names[opt.test],
				    kind == K_READ ? (V.want_hit ? "data in the Read's completion" :
						      "Read completion") : "reply",
				    (double)to / 1e9, size, i);
			out->lost++;
			lat_timeout_check(last_ok);
			continue;
		}
		last_ok = t1;
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
		drain_scq(); /* untimed: reap our send completions */
	}
}

/* The server side of a ping-pong (read_lat: passive, drives progress) until the client is done. */
static void vb_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	struct dgv_send_wr wr;
	struct dgv_sge sge;
	int kind = test_kind();
	const volatile uint8_t *last = V.rx + size - 1;
	uint8_t seen = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS, i = 0;
	struct watch w = { 0, 0, 0 };
	struct ctl_msg m;

	prepare_wr(&wr, &sge, size, true);
	for (;;) {
		int arrivals = 0;

		if (kind == K_SEND || kind == K_WR) {
			int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
			long consumed = 0;

			if (n < 0)
				die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
			for (int j = 0; j < n; j++) {
				const struct dgv_wc *wc = &V.wcr[j];
				bool echo = false;

				check_wc(wc, "receive");
				if (wc->opcode == DGV_WC_RECV) {
					consumed++;
					rep->count++;
					rep->bytes += wc->byte_len;
					if (kind == K_SEND) {
						sge.length = wc->byte_len;
						echo = true;
					}
				} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD && wc->record.length == size) {
					/* (other lengths: late records of an earlier size) */
					rep->count++;
					rep->valid += wc->record.valid_bytes;
					rep->lensum += wc->record.length;
					echo = kind == K_WR;
				}
				if (echo) {
					wr.wr_id = V.phase << 32 | (i++ & 0xffffffffu);
					if (!post_one(&wr, now_ns() + lat_timeout_ns(size, V.family)) && reliable())
						die(1, "%s: the send queue stayed full", test_names[opt.test]);
				}
			}
			if (consumed) {
				V.rq_posted -= consumed;
				post_recvs();
			}
			arrivals = n;
			if (n == 0 || V.sq_out > 32)
				drain_scq();
		} else if (kind == K_WRITE) {
			uint8_t b = *last;

			if (b != seen) {
				__atomic_thread_fence(__ATOMIC_ACQUIRE);
				seen = b;
				rep->count++;
				wr.wr_id = V.phase << 32 | (i++ & 0xffffffffu);
				if (!post_one(&wr, now_ns() + lat_timeout_ns(size, V.family)) && reliable())
					die(1, "%s: the send queue stayed full", test_names[opt.test]);
				arrivals = 1;
			}
			drain_scq();
		} else {
			drain_scq();
		}
		if (!arrivals) {
			uint64_t t = now_ns();

			if (t >= next_ctl) {
				next_ctl = t + CTL_POLL_NS;
				if (ctl_readable()) {
					ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
					break;
				}
				watch_client(&w, t, rep, size);
				if (t > budget_dl)
					die(1, "the client did not finish size %" PRIu64 " in time", size);
			}
		}
	}
}

/* ---------------------------------------------------------------- verbs: bandwidth */

struct bw_run {
	uint64_t posted, t_start, t_end;
	uint64_t lost; /* UD reads given up */
};

static void vb_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	unsigned depth = tx_depth(size);
	uint64_t posted = 0, last_progress, stall_ns, next_check;
	bool ud = opt.transport == TR_UD;

	bool credits = opt.transport == TR_RC && (test_kind() == K_SEND || test_kind() == K_WR);

	if (depth > SQ_WR / 2)
		depth = SQ_WR / 2;
	/* RC Reads beyond the negotiated ORD would only wait in the provider's queue */
	if (opt.transport == TR_RC && test_kind() == K_READ && V.conn.ord && depth > V.conn.ord)
		depth = V.conn.ord;
	stall_ns = !ud ? 60 * NS_PER_S : test_kind() == K_READ ? 2 * NS_PER_S : 10 * NS_PER_S;
	for (int j = 0; j < SCHAIN; j++)
		prepare_wr(&V.swr[j], &V.ssge[j], size, false);
	memset(out, 0, sizeof *out);
	out->t_start = last_progress = next_check = now_ns();
	while (V.c_done < iters) {
		uint64_t before = V.c_done, t;

		while (posted < iters && posted - V.c_done < depth) {
			uint64_t room = depth - (posted - V.c_done), k = iters - posted;
			struct dgv_send_wr *bad = NULL;
			int r;

			if (k > room)
				k = room;
			if (k > SCHAIN)
				k = SCHAIN;
			if (credits) {
				uint64_t c = rc_credit();

				if (V.cr_sent >= c)
					break; /* the server has no room: wait for its credit Write */
				if (k > c - V.cr_sent)
					k = c - V.cr_sent;
			}
			for (uint64_t j = 0; j < k; j++) {
				V.swr[j].wr_id = V.phase << 32 | ((posted + j) & 0xffffffffu);
				V.swr[j].next = j + 1 < k ? &V.swr[j + 1] : NULL;
			}
			r = dgv_post_send(V.qp, V.swr, &bad);
			if (r == 0) {
				posted += k;
				V.sq_out += (long)k;
				V.cr_sent += k;
				continue;
			}
			if (!transient(r))
				die(1, "dgv_post_send: %s", strerror(-r));
			for (struct dgv_send_wr *w = V.swr; w && w != bad; w = w->next) {
				posted++;
				V.sq_out++;
				V.cr_sent++;
			}
			break;
		}
		drain_scq();
		t = V.c_done != before ? V.t_last_c : now_ns();
		if (t >= next_check) {
			next_check = t + CTL_CHECK_NS;
			ctl_check_peer();
		}
		if (V.c_done != before) {
			last_progress = V.t_last_c;
		} else if (t - last_progress > stall_ns) {
			if (ud && test_kind() == K_READ) {
				out->lost = posted - V.c_done;
				break;
			}
			if (credits && V.c_done == posted)
				die(1, "%s: no credit from the server for %.0f s at %" PRIu64 " B (%" PRIu64
				    " of %" PRIu64 " done; room for %" PRIu64 " messages in total, %" PRIu64
				    " sent)", test_names[opt.test], (double)stall_ns / 1e9, size, V.c_done, iters,
				    V.credit, V.cr_sent);
			die(1, "%s: no completion for %.0f s at %" PRIu64 " B (%" PRIu64 " of %" PRIu64
			    " done)", test_names[opt.test], (double)stall_ns / 1e9, size, V.c_done, iters);
		}
	}
	out->posted = posted;
	out->t_end = V.c_done ? V.t_last_c : now_ns();
}

/* The receiving side of a bandwidth phase; ends when the client is done and everything arrived
 * or nothing arrived for DRAIN_IDLE_NS. */
static void vb_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	int kind = test_kind();
	uint64_t t_last = 0, t_done = 0, next_ctl = now_ns() + CTL_POLL_NS, expect_dg = UINT64_MAX;
	uint64_t expect_b = 0;
	const struct dgv_qp_stats *o = &V.st0;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (unsigned spin = 1;; spin++) {
		int arrivals = 0;

		if (kind == K_SEND || kind == K_WR) {
			int n = dgv_poll_cq(V.rcq, WC_BATCH, V.wcr);
			long consumed = 0;

			if (n < 0)
				die(1, "dgv_poll_cq (receive CQ): %s", strerror(-n));
			for (int j = 0; j < n; j++) {
				const struct dgv_wc *wc = &V.wcr[j];

				check_wc(wc, "receive");
				/* Completions of another length are late arrivals of an earlier size. */
				if (wc->opcode == DGV_WC_RECV) {
					consumed++;
					if (kind == K_SEND && wc->byte_len == size) {
						rep->count++;
						rep->bytes += wc->byte_len;
					}
				} else if (wc->opcode == DGV_WC_RECV_WRITE_RECORD && kind == K_WR) {
					V.rec_total++;
					if (wc->record.length == size) {
						rep->count++;
						rep->valid += wc->record.valid_bytes;
						rep->lensum += wc->record.length;
					}
				}
			}
			if (consumed) {
				V.rq_posted -= consumed;
				post_recvs();
			}
			arrivals = n;
			if (opt.transport == TR_RC) {
				rc_give_credit(kind == K_SEND ? V.rq_total : RC_WR_WINDOW + V.rec_total);
				if (V.cr_inflight > 0 && (n == 0 || V.cr_inflight >= (long)CR_SLOTS / 2))
					drain_scq();
			}
		} else {
			drain_scq(); /* nothing completes here, but it drives progress */
			/* Plain Writes leave no trace but the QP's counters: watch them. */
			if (kind == K_WRITE && ((spin & 31) == 0 || done)) {
				struct dgv_qp_stats s;

				if (dgv_qp_stats(V.qp, &s) == 0 && (s.rx_datagrams - o->rx_datagrams != rep->dgrams ||
								    s.rx_bytes - o->rx_bytes != rep->bytes)) {
					rep->dgrams = s.rx_datagrams - o->rx_datagrams;
					rep->bytes = s.rx_bytes - o->rx_bytes;
					rep->rejects = (s.crc_drops - o->crc_drops) +
						       (s.malformed_drops - o->malformed_drops) +
						       (s.placement_rejects - o->placement_rejects);
					arrivals = 1;
				}
			}
		}
		if (arrivals) {
			t_last = now_ns();
			continue;
		}
		{
			uint64_t t = now_ns();

			if (t >= next_ctl && !done) {
				next_ctl = t + CTL_POLL_NS;
				if (ctl_readable()) {
					ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
					done = true;
					t_done = t;
					expect_dg = m.v[3];
					/* RC: every byte the client posted arrives (rx_bytes counts the
					 * placed payload, or more if a provider counts headers too) */
					expect_b = opt.transport == TR_RC ? m.v[2] : 0;
				}
			}
			if (done) {
				uint64_t ref = t_last > t_done ? t_last : t_done;
				/* (Write-Record: one message may yield several partial records) */
				bool all = kind == K_WRITE ? rep->dgrams >= expect_dg && rep->bytes >= expect_b :
					   kind == K_WR ? rep->valid >= iters * size : rep->count >= iters;

				if (kind == K_READ || all || t - ref > DRAIN_IDLE_NS)
					break;
			} else {
				watch_client(&w, t, rep, size);
			}
			if (t > budget_dl)
				die(1, "the client did not finish size %" PRIu64 " in time", size);
		}
	}
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}

/* ---------------------------------------------------------------- raw UDP */

static struct {
	int fd;
	uint8_t *txbuf, *rxbuf;
	uint32_t seg;
	uint64_t rng;
	uint64_t dropped;
	int family;
	union dgv_sockaddr peer; /* where sendto() goes (--raw-udp) */
	socklen_t peerlen;
} R;

static bool raw_drop(void)
{
	double u;

	if (!opt.loss_set || opt.loss <= 0)
		return false;
	R.rng ^= R.rng << 13;
	R.rng ^= R.rng >> 7;
	R.rng ^= R.rng << 17;
	u = (double)(R.rng >> 11) * 0x1.0p-53;
	if (u * 100.0 < opt.loss) {
		R.dropped++;
		return true;
	}
	return false;
}

static void raw_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	union dgv_sockaddr a = *ctl_local, mine, peer;
	socklen_t len = ctl_local->sa.sa_family == AF_INET ? sizeof a.sin : sizeof a.sin6, plen, ml;
	int sz = RAW_SOCKBUF, got = 0;
	socklen_t gl = sizeof got;
	struct ctl_msg m;
	char s1[80], s2[80];

	R.family = a.sa.sa_family;
	R.seg = seg_effective(R.family);
	R.rng = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	if (!R.rng)
		R.rng = 1;
	R.txbuf = calloc(1, R.seg);
	R.rxbuf = calloc(1, RAW_RXBUF);
	if (!R.txbuf || !R.rxbuf)
		die(1, "out of memory");
	for (uint32_t i = 0; i < R.seg; i++)
		R.txbuf[i] = (uint8_t)(i * 7 + 1);
	R.fd = socket(R.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (R.fd < 0)
		die(1, "socket: %s", strerror(errno));
	if (setsockopt(R.fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz) < 0)
		setsockopt(R.fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	if (setsockopt(R.fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz) < 0)
		setsockopt(R.fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	getsockopt(R.fd, SOL_SOCKET, SO_RCVBUF, &got, &gl);
	sa_set_port(&a, g_server ? opt.port : 0);
	if (bind(R.fd, &a.sa, len) < 0)
		die(1, "cannot bind UDP %s: %s", sa_str(&a, s1, sizeof s1), strerror(errno));
	ml = sizeof mine;
	memset(&mine, 0, sizeof mine);
	getsockname(R.fd, &mine.sa, &ml);
	sa_normalize(&mine, &ml);
	memset(&m, 0, sizeof m);
	msg_put_addr(&m, &mine);
	ctl_send(CTL_SETUP, &m);
	ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its UDP address");
	msg_get_addr(&m, ctl_peer, &peer, &plen);
	R.peer = peer;
	R.peerlen = plen;
	if (opt.raw_connected && connect(R.fd, &peer.sa, plen) < 0)
		die(1, "connect UDP to %s: %s", sa_str(&peer, s1, sizeof s1), strerror(errno));
	vlog("raw UDP %s -> %s, %u-byte datagrams, SO_RCVBUF %d", sa_str(&mine, s1, sizeof s1),
	     sa_str(&peer, s2, sizeof s2), R.seg, got);
}

/* Sends one message of size bytes as ceil(size/seg) datagrams; false at the deadline. */
static bool raw_send_msg(uint64_t size, uint64_t deadline)
{
	uint64_t left = size;
	unsigned spin = 0;

	while (left) {
		size_t len = left < R.seg ? (size_t)left : R.seg;
		ssize_t r = opt.raw_connected ? send(R.fd, R.txbuf, len, MSG_DONTWAIT)
					      : sendto(R.fd, R.txbuf, len, MSG_DONTWAIT, &R.peer.sa, R.peerlen);

		if (r >= 0) {
			left -= len;
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR) {
			if ((++spin & 255) == 0 && now_ns() > deadline)
				return false;
			continue;
		}
		if (errno == ECONNREFUSED)
			die(1, "the %s's UDP port is unreachable (ICMP port unreachable)", peer_role());
		die(1, "send (UDP): %s", strerror(errno));
	}
	return true;
}

/* One datagram if there is one (after simulated loss): its length, else 0. */
static size_t raw_recv(void)
{
	for (;;) {
		ssize_t r = recv(R.fd, R.rxbuf, RAW_RXBUF, MSG_DONTWAIT);

		if (r > 0) {
			if (raw_drop())
				continue;
			return (size_t)r;
		}
		if (r == 0)
			continue; /* zero-length datagram: not ours */
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return 0;
		if (errno == ECONNREFUSED)
			continue; /* a stale ICMP error from an earlier run */
		die(1, "recv (UDP): %s", strerror(errno));
	}
}

static void raw_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	uint64_t to = lat_timeout_ns(size, R.family), last_ok = now_ns();
	uint64_t req = test_kind() == K_READ ? RAW_READ_REQ : size;

	memset(out, 0, sizeof *out);
	for (uint64_t i = 0, good = 0; out->nsamp < iters && i < LAT_ATTEMPTS(warm + iters); i++) {
		uint64_t t0 = now_ns(), t1 = 0, got = 0, last_rx = t0;

		if (raw_send_msg(req, t0 + to)) {
			out->pings++;
			for (unsigned spin = 1;; spin++) {
				size_t r = raw_recv();

				if (r) {
					got += r;
					if (got >= size) {
						t1 = now_ns();
						break;
					}
					last_rx = 0;
					continue;
				}
				if ((spin & 63) == 0) {
					uint64_t t = now_ns();

					if (last_rx == 0)
						last_rx = t;
					if (got && t - last_rx > REASM_NS)
						got = 0; /* the rest of this message was lost */
					if (t > t0 + to)
						break;
				}
			}
		}
		if (!t1) {
			out->lost++;
			lat_timeout_check(last_ok);
			continue;
		}
		last_ok = t1;
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
	}
}

static void raw_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	uint64_t need = test_kind() == K_READ ? RAW_READ_REQ : size, got = 0, last_rx = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS;
	struct watch w = { 0, 0, 0 };
	struct ctl_msg m;

	for (;;) {
		size_t r = raw_recv();
		uint64_t t;

		if (r) {
			got += r;
			rep->dgrams++;
			rep->bytes += r;
			last_rx = 0;
			if (got >= need) {
				got = 0;
				rep->count++;
				if (!raw_send_msg(size, now_ns() + NS_PER_S))
					vlog("could not send a reply within 1 s");
			}
			continue;
		}
		t = now_ns();
		if (last_rx == 0)
			last_rx = t;
		if (got && t - last_rx > REASM_NS)
			got = 0;
		if (t >= next_ctl) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				return;
			}
			watch_client(&w, t, rep, size);
			if (t > budget_dl)
				die(1, "the client did not finish size %" PRIu64 " in time", size);
		}
	}
}

static void raw_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	uint64_t dl;

	memset(out, 0, sizeof *out);
	out->t_start = now_ns();
	dl = out->t_start + 60 * NS_PER_S + iters * size * 1000;
	for (uint64_t i = 0, next_check = out->t_start + CTL_CHECK_NS; i < iters; i++) {
		if (!raw_send_msg(size, dl))
			die(1, "raw UDP: the socket stayed full (send of %" PRIu64 " B)", size);
		out->posted++;
		if ((i & 63) == 63 && now_ns() >= next_check) {
			next_check = now_ns() + CTL_CHECK_NS;
			ctl_check_peer();
		}
	}
	out->t_end = now_ns();
}

static void raw_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	uint64_t t_last = 0, t_done = 0, next_ctl = now_ns() + CTL_POLL_NS, want = iters * size;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (;;) {
		size_t r = raw_recv();
		uint64_t t;

		if (r) {
			rep->bytes += r;
			rep->dgrams++;
			t_last = now_ns();
			continue;
		}
		t = now_ns();
		if (t >= next_ctl && !done) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				done = true;
				t_done = t;
			}
		}
		if (done && (rep->bytes >= want || t - (t_last > t_done ? t_last : t_done) > DRAIN_IDLE_NS))
			break;
		if (!done)
			watch_client(&w, t, rep, size);
		if (t > budget_dl)
			die(1, "the client did not finish size %" PRIu64 " in time", size);
	}
	rep->count = rep->bytes / size;
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}

/* ---------------------------------------------------------------- raw TCP */

#define TCP_CHUNK (256u << 10)       /* bytes one recv() may take */
#define TCP_ACCEPT_NS (20 * NS_PER_S) /* server: the client's data connection must come by then */

static struct {
	int fd;
	uint8_t *tx, *rx; /* tx: one message (max_msg_size), rx: TCP_CHUNK */
	int family;
} T = { .fd = -1 };

/* Sends all n bytes (non-blocking socket; waits in poll while it is full); false at deadline. */
static bool tcp_send_all(const uint8_t *p, size_t n, uint64_t deadline)
{
	while (n) {
		ssize_t r = send(T.fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r > 0) {
			p += r;
			n -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int e = io_wait(T.fd, POLLOUT, deadline);

			if (e == -ETIMEDOUT)
				return false;
			if (e)
				die(1, "poll (TCP data connection): %s", strerror(-e));
			continue;
		}
		if (r < 0 && (errno == EPIPE || errno == ECONNRESET))
			die(1, "the %s closed the data connection (%s)", peer_role(), strerror(errno));
		die(1, "send (TCP data connection): %s", r < 0 ? strerror(errno) : "sent nothing");
	}
	return true;
}

/* Up to max bytes if any are there (never blocks): their count, else 0. */
static size_t tcp_recv_some(uint64_t max)
{
	for (;;) {
		ssize_t r = recv(T.fd, T.rx, max < TCP_CHUNK ? (size_t)max : TCP_CHUNK, MSG_DONTWAIT);

		if (r > 0)
			return (size_t)r;
		if (r == 0)
			die(1, "the %s closed the data connection", peer_role());
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		die(1, "recv (TCP data connection): %s", strerror(errno));
	}
}

/* Client: a non-blocking TCP connection to dst within the connect timeout, or die naming why. */
static int tcp_connect_to(const union dgv_sockaddr *dst, socklen_t len)
{
	uint64_t deadline = now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * NS_PER_MS;
	int fd = tcp_socket(dst->sa.sa_family, true), e = 0;
	socklen_t el = sizeof e;
	char s1[80];

	if (fd < 0)
		die(1, "socket: %s", strerror(errno));
	if (connect(fd, &dst->sa, len) < 0) {
		if (errno != EINPROGRESS)
			e = errno;
		else if ((e = -io_wait(fd, POLLOUT, deadline)) == 0 &&
			 getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
			e = errno;
	}
	if (e == ECONNREFUSED)
		die(1, "data connection to TCP %s refused (the server's listener is gone?)",
		    sa_str(dst, s1, sizeof s1));
	if (e == ETIMEDOUT)
		die(1, "data connection to TCP %s: no answer within %d s", sa_str(dst, s1, sizeof s1),
		    CONNECT_TIMEOUT_MS / 1000);
	if (e)
		die(1, "data connection to TCP %s: %s", sa_str(dst, s1, sizeof s1), strerror(e));
	return fd;
}

static void tcp_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer)
{
	uint64_t len = max_msg_size() > RAW_READ_REQ ? max_msg_size() : RAW_READ_REQ, be;
	union dgv_sockaddr mine, peer;
	socklen_t ml = sizeof mine, pl = sizeof peer;
	struct ctl_msg m;
	char s1[80], s2[80];
	int one = 1;

	T.family = ctl_local->sa.sa_family;
	T.tx = malloc(len);
	T.rx = malloc(TCP_CHUNK);
	if (!T.tx || !T.rx)
		die(1, "out of memory");
	for (uint64_t i = 0; i < len; i++)
		T.tx[i] = (uint8_t)(i * 7 + 1);
	if (g_server) {
		uint64_t dl = now_ns() + TCP_ACCEPT_NS;

		g_cookie = make_cookie();
		memset(&m, 0, sizeof m);
		m.v[0] = g_cookie;
		ctl_send(CTL_SETUP, &m);
		for (;;) {
			int e = io_wait(g_lfd, POLLIN, dl), fd;
			uint64_t got = 0;
			size_t n = 0;

			if (e == -ETIMEDOUT)
				die(1, "the client did not open its data connection to TCP port %u within %.0f s",
				    opt.port, (double)TCP_ACCEPT_NS / 1e9);
			if (e)
				die(1, "waiting for the data connection: %s", strerror(-e));
			fd = tcp_accept(g_lfd, true);
			if (fd < 0) {
				if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
					continue;
				die(1, "accept (data connection): %s", strerror(errno));
			}
			/* its first 8 bytes must be our cookie, within 2 s */
			while (n < sizeof got && io_wait(fd, POLLIN, now_ns() + 2 * NS_PER_S) == 0) {
				ssize_t r = recv(fd, (uint8_t *)&got + n, sizeof got - n, MSG_DONTWAIT);

				if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR)))
					break;
				if (r > 0)
					n += (size_t)r;
			}
			if (n == sizeof got && be64toh(got) == g_cookie) {
				T.fd = fd;
				break;
			}
			vlog("turned away a data connection without this run's cookie");
			close(fd);
		}
	} else {
		union dgv_sockaddr dst;
		socklen_t dl;

		ctl_recv(CTL_SETUP, &m, CTL_TIMEOUT_MS, "its data port");
		g_cookie = m.v[0];
		data_dst(ctl_peer, &dst, &dl);
		T.fd = tcp_connect_to(&dst, dl);
		be = htobe64(g_cookie);
		if (!tcp_send_all((const uint8_t *)&be, sizeof be, now_ns() + (uint64_t)CTL_TIMEOUT_MS * NS_PER_MS))
			die(1, "data connection: cannot send the cookie");
	}
	setsockopt(T.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	memset(&mine, 0, sizeof mine);
	memset(&peer, 0, sizeof peer);
	getsockname(T.fd, &mine.sa, &ml);
	getpeername(T.fd, &peer.sa, &pl);
	sa_normalize(&mine, &ml);
	sa_normalize(&peer, &pl);
	vlog("raw TCP %s -> %s, TCP_NODELAY", sa_str(&mine, s1, sizeof s1), sa_str(&peer, s2, sizeof s2));
}

static void tcp_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out)
{
	uint64_t to = lat_timeout_ns(size, T.family);
	uint64_t req = test_kind() == K_READ ? RAW_READ_REQ : size;

	memset(out, 0, sizeof *out);
	for (uint64_t i = 0, good = 0; out->nsamp < iters; i++) {
		uint64_t t0 = now_ns(), t1 = 0, got = 0;

		if (!tcp_send_all(T.tx, (size_t)req, t0 + to))
			die(1, "%s: the data connection stayed full for %.1f s at %" PRIu64 " B",
			    test_names[opt.test], (double)to / 1e9, size);
		out->pings++;
		for (unsigned spin = 1;; spin++) {
			size_t r = tcp_recv_some(size - got);

			if (r) {
				got += r;
				if (got >= size) {
					t1 = now_ns();
					break;
				}
				continue;
			}
			if ((spin & 255) == 0 && now_ns() > t0 + to) {
				ctl_check_peer();
				die(1, "%s: no reply within %.1f s at %" PRIu64 " B (iteration %" PRIu64 "): is "
				    "the server alive?", test_names[opt.test], (double)to / 1e9, size, i);
			}
		}
		if (good++ >= warm)
			g_samples[out->nsamp++] = t1 - t0;
	}
}

static void tcp_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep)
{
	uint64_t need = test_kind() == K_READ ? RAW_READ_REQ : size, got = 0;
	uint64_t next_ctl = now_ns() + CTL_POLL_NS;
	struct watch w = { 0, 0, 0 };
	struct ctl_msg m;

	for (;;) {
		size_t r = tcp_recv_some(need - got);
		uint64_t t;

		if (r) {
			got += r;
			rep->bytes += r;
			rep->dgrams++;
			if (got == need) {
				got = 0;
				rep->count++;
				if (!tcp_send_all(T.tx, (size_t)size, now_ns() + 10 * NS_PER_S))
					die(1, "could not send a reply within 10 s (the client stopped reading?)");
			}
			continue;
		}
		t = now_ns();
		if (t >= next_ctl) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				if (got)
					die(1, "the client said DONE in the middle of a %" PRIu64 "-byte message", need);
				return;
			}
			watch_client(&w, t, rep, size);
			if (t > budget_dl)
				die(1, "the client did not finish size %" PRIu64 " in time", size);
		}
	}
}

static void tcp_client_bw(uint64_t size, uint64_t iters, struct bw_run *out)
{
	uint64_t dl, next_check;

	memset(out, 0, sizeof *out);
	out->t_start = now_ns();
	dl = out->t_start + 60 * NS_PER_S + iters * size * 1000;
	next_check = out->t_start + CTL_CHECK_NS;
	for (uint64_t i = 0; i < iters; i++) {
		if (!tcp_send_all(T.tx, (size_t)size, dl))
			die(1, "raw TCP: the connection stayed full (did the server stop reading?)");
		out->posted++;
		if ((i & 63) == 63 && now_ns() >= next_check) {
			next_check = now_ns() + CTL_CHECK_NS;
			ctl_check_peer();
		}
	}
	out->t_end = now_ns();
}

/* Counts the stream's bytes until all iters x size arrived and the client said DONE. */
static void tcp_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep)
{
	uint64_t t_last = 0, next_ctl = now_ns() + CTL_POLL_NS, want = iters * size;
	struct watch w = { 0, 0, 0 };
	bool done = false;
	struct ctl_msg m;

	for (;;) {
		uint64_t t;

		if (rep->bytes < want) {
			size_t r = tcp_recv_some(want - rep->bytes);

			if (r) {
				rep->bytes += r;
				rep->dgrams++;
				t_last = now_ns();
				continue;
			}
		}
		t = now_ns();
		if (!done && (t >= next_ctl || rep->bytes >= want)) {
			next_ctl = t + CTL_POLL_NS;
			if (ctl_readable()) {
				ctl_recv(CTL_DONE, &m, CTL_TIMEOUT_MS, "DONE");
				done = true;
			}
		}
		if (done && rep->bytes >= want)
			break;
		if (!done)
			watch_client(&w, t, rep, size);
		if (t > budget_dl)
			die(1, "the client did not finish size %" PRIu64 " in time (%" PRIu64 " of %" PRIu64
			    " bytes arrived)", size, rep->bytes, want);
	}
	rep->count = rep->bytes / size;
	rep->delta_ns = t_last ? now_ns() - t_last : 0;
}

/* ---------------------------------------------------------------- phases */

/*
 * write_bw: an RDMA Write leaves no completion at the target, so the bytes it placed come from
 * the target QP's counters. RD (and RC): a Write completes at the source only once the target
 * acknowledged it, so every completed Write was placed. UD: the payload of the datagrams the
 * target QP accepted = rx_bytes - rx_datagrams x per-datagram overhead, less the share of the
 * datagrams it rejected. The overhead is measured on our side (tx_bytes - payload) / tx_datagrams
 * when no transmit-edge fault dropped anything, else taken from wire.h. msgs counts message
 * equivalents (placed bytes / size).
 */
static void write_delivered(uint64_t size, const struct dgv_qp_stats *st1, const struct report *rep,
			    uint64_t *bytes, uint64_t *msgs)
{
	const struct dgv_qp_stats *o = &V.st0;
	uint64_t tx_dg = st1->tx_datagrams - o->tx_datagrams, tx_b = st1->tx_bytes - o->tx_bytes;
	uint64_t sent = V.c_done * size;
	double ovh = DG_TAGGED_HLEN + DG_CRC_LEN, placed;

	if (opt.transport != TR_UD) {
		*bytes = sent;
		*msgs = V.c_done;
		return;
	}
	if (tx_dg && st1->fault_dropped == o->fault_dropped && tx_b >= sent)
		ovh = (double)(tx_b - sent) / (double)tx_dg;
	placed = (double)rep->bytes - (double)rep->dgrams * ovh;
	if (rep->dgrams && rep->rejects)
		placed *= (double)(rep->dgrams - (rep->rejects < rep->dgrams ? rep->rejects : rep->dgrams)) /
			  (double)rep->dgrams;
	if (placed < 0)
		placed = 0;
	*bytes = (uint64_t)llround(placed);
	if (*bytes > sent)
		*bytes = sent;
	*msgs = *bytes / size;
	vlog("write_bw: target accepted %" PRIu64 " of our %" PRIu64 " datagrams (%.1f B overhead each, "
	     "%" PRIu64 " rejected)", rep->dgrams, tx_dg, ovh, rep->rejects);
}

static void client_phase(uint64_t phase, uint64_t size)
{
	uint64_t iters = iters_for(size), warm = warmup_for(iters);
	char label[48];
	struct ctl_msg m;
	struct report rep;
	uint64_t t_report;

	snprintf(label, sizeof label, "size %" PRIu64 ":", size);
	memset(&rep, 0, sizeof rep);
	if (!opt.raw) {
		V.phase = phase;
		V.c_done = V.c_bytes = V.c_msgs = 0;
		V.want_id = 0;
		V.want_hit = false;
		memset(V.rx, 0, size);
		drain_scq();
		post_recvs();
		stats_snapshot();
	}
	memset(&m, 0, sizeof m);
	m.v[0] = phase;
	m.v[1] = size;
	m.v[2] = iters;
	ctl_send(CTL_START, &m);
	ctl_recv(CTL_READY, &m, CTL_TIMEOUT_MS, "READY");

	if (test_lat()) {
		struct lat_run lr;
		double scale = test_kind() == K_READ ? 1.0 : 0.5;
		double vf = NAN;

		if (opt.raw_tcp)
			tcp_client_lat(size, iters, warm, &lr);
		else if (opt.raw)
			raw_client_lat(size, iters, warm, &lr);
		else
			vb_client_lat(size, iters, warm, &lr);
		memset(&m, 0, sizeof m);
		m.v[0] = phase;
		m.v[1] = lr.pings;
		ctl_send(CTL_DONE, &m);
		ctl_recv(CTL_REPORT, &m, CTL_TIMEOUT_MS, "its report");
		report_get(&m, phase, &rep);
		/* valid bytes in the target's records (raw: bytes it received) / bytes sent */
		if (lr.pings)
			vf = (double)(opt.raw ? rep.bytes : rep.valid) / ((double)lr.pings * (double)size);
		if (!opt.raw)
			stats_log(label);
		print_lat_row(size, lr.nsamp, scale, vf, lr.lost, lr.pings);
	} else {
		struct bw_run br;
		struct dgv_qp_stats st1;
		uint64_t bytes, msgs, elapsed;
		double vf = NAN;

		memset(&st1, 0, sizeof st1);

		if (opt.raw_tcp)
			tcp_client_bw(size, iters, &br);
		else if (opt.raw)
			raw_client_bw(size, iters, &br);
		else
			vb_client_bw(size, iters, &br);
		memset(&m, 0, sizeof m);
		m.v[0] = phase;
		m.v[1] = br.posted;
		m.v[2] = br.posted * size;
		if (!opt.raw && dgv_qp_stats(V.qp, &st1) == 0)
			m.v[3] = st1.tx_datagrams - V.st0.tx_datagrams;
		ctl_send(CTL_DONE, &m);
		ctl_recv(CTL_REPORT, &m, CTL_TIMEOUT_MS, "its report");
		t_report = now_ns();
		report_get(&m, phase, &rep);
		if (!opt.raw && test_kind() == K_READ) {
			bytes = V.c_bytes;
			msgs = V.c_msgs;
			elapsed = br.t_end - br.t_start;
			if (br.lost)
				vlog("size %" PRIu64 ": %" PRIu64 " Reads never completed", size, br.lost);
		} else {
			elapsed = bw_elapsed(br.t_start, t_report, br.t_end, &rep);
			msgs = rep.count;
			bytes = rep.bytes;
			if (test_kind() == K_WR && !opt.raw)
				bytes = rep.valid;
			if (test_kind() == K_WR)
				vf = (double)bytes / ((double)br.posted * (double)size);
			if (test_kind() == K_WRITE && !opt.raw)
				write_delivered(size, &st1, &rep, &bytes, &msgs);
		}
		if (!opt.raw)
			stats_log(label);
		memset(&g_detail, 0, sizeof g_detail);
		g_detail.sent = br.posted;
		if (!opt.raw && dgv_qp_stats(V.qp, &st1) == 0) {
			/* after the server's report: retransmissions up to the last acknowledgement */
			g_detail.qp_stats = true;
			g_detail.tx_dg = st1.tx_datagrams - V.st0.tx_datagrams;
			g_detail.tx_bytes = st1.tx_bytes - V.st0.tx_bytes;
			g_detail.retx = st1.rd_retransmits - V.st0.rd_retransmits;
		}
		if (opt.raw)
			vlog("size %" PRIu64 ": server received %" PRIu64 " datagrams", size, rep.dgrams);
		vlog("size %" PRIu64 ": last local completion %.3f ms after the first post; the receiver's last "
		     "arrival %.3f ms", size, (double)(br.t_end - br.t_start) / 1e6, (double)elapsed / 1e6);
		print_bw_row(size, iters, bytes, msgs, elapsed ? elapsed : 1, vf);
	}
}

/* Serves phases until the client says BYE. */
static void server_phases(void)
{
	struct ctl_msg m;

	for (uint64_t expect = 1;; expect++) {
		uint64_t size, iters, budget;
		struct report rep;
		char label[48];

		ctl_recv(CTL_ANY, &m, CTL_TIMEOUT_MS, "the next size");
		if (m.type == CTL_BYE) {
			memset(&m, 0, sizeof m);
			ctl_send(CTL_BYE, &m);
			return;
		}
		if (m.type != CTL_START)
			die(1, "control channel: got %s while waiting for START", ctl_names[m.type]);
		size = m.v[1];
		iters = m.v[2];
		if (m.v[0] != expect || size == 0 || size > max_msg_size() || iters == 0 || iters > MAX_ITERS)
			die(1, "control channel: bad START (phase %" PRIu64 ", size %" PRIu64 ", iters %" PRIu64
			    ")", m.v[0], size, iters);
		snprintf(label, sizeof label, "size %" PRIu64 ":", size);
		memset(&rep, 0, sizeof rep);
		if (!opt.raw) {
			V.phase = expect;
			memset(V.rx, 0, size);
			drain_scq();
			post_recvs();
			stats_snapshot();
		}
		budget = now_ns() + phase_budget_ns(size, iters);
		memset(&m, 0, sizeof m);
		m.v[0] = expect;
		ctl_send(CTL_READY, &m);
		if (opt.raw_tcp) {
			if (test_lat())
				tcp_server_lat(size, budget, &rep);
			else
				tcp_server_bw(size, iters, budget, &rep);
		} else if (opt.raw) {
			if (test_lat())
				raw_server_lat(size, budget, &rep);
			else
				raw_server_bw(size, iters, budget, &rep);
		} else {
			if (test_lat())
				vb_server_lat(size, budget, &rep);
			else
				vb_server_bw(size, iters, budget, &rep);
			stats_log(label);
		}
		vlog("size %" PRIu64 ": received %" PRIu64 " messages, %" PRIu64 " bytes, %" PRIu64
		     " valid of %" PRIu64 " recorded", size, rep.count, rep.bytes, rep.valid, rep.lensum);
		report_put(&m, expect, &rep);
		ctl_send(CTL_REPORT, &m);
	}
}

int main(int argc, char **argv)
{
	union dgv_sockaddr local, peer;
	socklen_t llen, plen;
	struct ctl_msg m;
	uint64_t maxit = 0;
	char extra[200];

	parse_options(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	g_server = opt.peer == NULL;

	/* sample array for the largest iteration count of the run (latency tests only) */
	if (test_lat() && !g_server) {
		for (uint64_t s = opt.sweep ? 1 : opt.size; s <= max_msg_size(); s *= 2) {
			uint64_t it = iters_for(s) + warmup_for(iters_for(s));

			if (it > maxit)
				maxit = it;
			if (!opt.sweep)
				break;
		}
		g_samples_cap = maxit;
		g_samples = malloc(maxit * sizeof *g_samples);
		if (!g_samples)
			die(1, "cannot allocate %" PRIu64 " samples", maxit);
		memset(g_samples, 0, maxit * sizeof *g_samples);
	}

	/* control connection and handshake */
	if (g_server) {
		g_ctl = ctl_accept(opt.port);
		ctl_recv(CTL_HELLO, &m, CTL_TIMEOUT_MS, "HELLO");
		hello_check(&m);
		memset(&m, 0, sizeof m);
		ctl_send(CTL_HELLO_OK, &m);
	} else {
		g_ctl = ctl_connect(opt.peer, opt.port);
		hello_fill(&m);
		ctl_send(CTL_HELLO, &m);
		ctl_recv(CTL_HELLO_OK, &m, CTL_TIMEOUT_MS, "HELLO_OK");
	}
	ctl_local_peer(&local, &llen, &peer, &plen);

	if (opt.raw_tcp)
		tcp_setup(&local, &peer);
	else if (opt.raw)
		raw_setup(&local, &peer);
	else
		vb_setup(&local, &peer);

	if (g_server) {
		server_phases();
	} else {
		const char *env_tx = getenv("DGSHIM_FAULT_TX"), *env_rx = getenv("DGSHIM_FAULT_RX");
		int n = 0;
		uint64_t phase = 0;

		if (opt.raw_tcp)
			n += snprintf(extra + n, sizeof extra - (size_t)n, " (one plain TCP connection, "
				      "TCP_NODELAY, one send() per message)");
		else if (opt.raw)
			n += snprintf(extra + n, sizeof extra - (size_t)n, " (plain UDP sockets), %u-byte datagrams",
				      R.seg);
		else if (opt.transport == TR_RC)
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", MPA rev %u, CRC %s, markers %s",
				      V.conn.mpa_rev, V.conn.crc ? "on" : "off",
				      V.conn.markers_rx || V.conn.markers_tx ? "on" : "off");
		else if (opt.seg_set)
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", seg %u", opt.seg);
		else
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", seg default");
		if (!data_on_tcp())
			n += snprintf(extra + n, sizeof extra - (size_t)n, ", loss %g%%",
				      opt.loss_set ? opt.loss : 0.0);
		if (!opt.raw && ((env_tx && *env_tx) || (!opt.loss_set && env_rx && *env_rx)))
			snprintf(extra + n, sizeof extra - (size_t)n, " + environment faults");
		print_header(opt.raw ? "none" : dgv_provider_name(V.ctx), extra);
		for (uint64_t s = opt.sweep ? 1 : opt.size; s <= max_msg_size(); s *= 2) {
			client_phase(++phase, s);
			if (!opt.sweep)
				break;
		}
		memset(&m, 0, sizeof m);
		ctl_send(CTL_BYE, &m);
		ctl_recv(CTL_BYE, &m, CTL_TIMEOUT_MS, "BYE");
	}

	if (opt.raw_tcp) {
		close(T.fd);
		free(T.tx);
		free(T.rx);
	} else if (opt.raw) {
		close(R.fd);
		free(R.txbuf);
		free(R.rxbuf);
	} else {
		vb_teardown();
	}
	if (g_lfd >= 0)
		close(g_lfd);
	close(g_ctl);
	g_ctl = -1;
	free(g_samples);
	return 0;
}
