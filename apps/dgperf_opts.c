/*
 * dgperf_opts.c - dgperf, options: usage text, parsing, validation; sizes, iterations, timeouts.
 * dgperf.h maps the parts; `dgperf --help` documents the program.
 */
#include "dgperf.h"

/* the options (parse_options fills them) */
struct dgperf_opt opt = {
	.test = 0, .transport = TR_UD, .port = DEFAULT_PORT, .provider = DGV_PROV_AUTO
};

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
"                        tx_datagrams, tx_wire_bytes (headers included), rd_retransmits, and\n"
"                        peer_fault_drops (datagrams the server's --loss dropped) (null for raw\n"
"                        sockets); cpu_client_s and cpu_server_s: each process's CPU time (all\n"
"                        its threads, CLOCK_PROCESS_CPUTIME_ID) from the phase's START to the\n"
"                        server's report; *_lat: pings, lost (round trips timed out).\n"
"      --event           *_bw tests: wait for completions (dgv_cq_wait) and for socket\n"
"                        readiness (poll) instead of busy-polling, so the CPU figures are the\n"
"                        work of moving the bytes rather than the spinning (as perftest's -e).\n"
"                        Applies to the side it is given to. Exceptions that still spin: an RC\n"
"                        send_bw/wr_bw client waiting for the server's credit Write (which\n"
"                        makes no completion). Refused with the *_lat tests.\n"
"  -v, --verbose         progress and QP counters on stderr (both sides).\n"
"  -h, --help            this text.\n"
"\n"
"TESTS (SIZE bytes per message; all loops busy-poll dgv_poll_cq, never sleep, unless --event):\n"
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

void parse_options(int argc, char **argv)
{
	enum { O_LOSS = 256, O_JSON, O_RAW, O_RAWC, O_RAWT, O_SEG, O_DETAIL, O_BIND, O_EVENT };
	static const struct option longopts[] = {
		{ "connection", required_argument, NULL, 'c' },
		{ "test", required_argument, NULL, 't' },
		{ "size", required_argument, NULL, 's' },
		{ "all", no_argument, NULL, 'a' },
		{ "iters", required_argument, NULL, 'n' },
		{ "loss", required_argument, NULL, O_LOSS },
		{ "json", no_argument, NULL, O_JSON },
		{ "detail", no_argument, NULL, O_DETAIL },
		{ "event", no_argument, NULL, O_EVENT },
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
		case O_EVENT:
			opt.event = true;
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
	if (opt.event && test_lat())
		usage_error("--event applies to the *_bw tests only: the *_lat tests busy-poll, as a "
			    "latency test must");
	if (!opt.size_set && !opt.sweep)
		opt.size = test_lat() ? DEFAULT_LAT_SIZE : DEFAULT_BW_SIZE;
}

/* ---------------------------------------------------------------- sizes and iterations */

uint64_t max_msg_size(void) { return opt.sweep ? SWEEP_MAX : opt.size; }

/* Bytes one iteration moves (a ping-pong moves the message twice). */
static uint64_t bytes_per_iter(uint64_t size)
{
	if (!test_lat())
		return size;
	if (test_kind() == K_READ)
		return size;
	return 2 * size;
}

uint64_t iters_for(uint64_t size)
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

uint64_t warmup_for(uint64_t iters)
{
	uint64_t w = iters / 8;

	return test_lat() ? (w > 16 ? 16 : w) : 0;
}

unsigned tx_depth(uint64_t size)
{
	uint64_t d = TX_DEPTH_BYTES / size;

	if (d < 1)
		d = 1;
	if (d > MAX_TX_DEPTH)
		d = MAX_TX_DEPTH;
	return (unsigned)d;
}

uint32_t seg_effective(int family)
{
	if (opt.seg_set)
		return opt.seg;
	return family == AF_INET6 ? SEG_DEFAULT6 : SEG_DEFAULT;
}

bool reliable(void) { return opt.raw ? opt.raw_tcp : opt.transport != TR_UD; }

/* How long one latency iteration may take before it counts as lost (UD, raw) or fails. */
uint64_t lat_timeout_ns(uint64_t size, int family)
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
uint64_t phase_budget_ns(uint64_t size, uint64_t iters)
{
	return 120 * NS_PER_S + iters * 30 * NS_PER_MS + iters * bytes_per_iter(size) * 1000;
}
