/*
 * dgperf.h - what the parts of dgperf share (internal; dgperf is one program, this is not an API).
 * Where each part lives:
 *   dgperf.c               errors (die, usage_error, vlog), the phases of a run, main
 *   dgperf_opts.c          options: usage text, parsing, validation; sizes, iterations, timeouts
 *   dgperf_ctl.c           addresses; the TCP control channel; the data connection's address, cookie
 *   dgperf_output.c        statistics and output (text rows or JSON), the receiver's report
 *   dgperf_verbs.c         the verbs data path: state, posting, completions; RC set-up, tear-down
 *   dgperf_verbs_tests.c   the verbs tests: latency and bandwidth, client and server loops
 *   dgperf_raw.c           the baselines without verbs: --raw-udp/--raw-connected and --raw-tcp
 */
#ifndef DGPERF_H
#define DGPERF_H

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
#define NTESTS ((int)(sizeof test_names / sizeof test_names[0]))
#define CTL_VERSION 2u /* 2: the server's report carries its CPU time (v[9]) */
#define CTL_NV 12
#define CTL_CHECK_NS (10 * NS_PER_MS)
#define LAT_SILENCE_NS (30 * NS_PER_S) /* no completed round trip for this long: give up */
#define RC_WR_WINDOW 1024u
#define CTL_PAGE 4096u          /* after the two halves: credit word, then CR_SLOTS sources */
#define CR_SLOTS 32u
#define TCP_CHUNK (256u << 10)       /* bytes one recv() may take */

/* ---------------------------------------------------------------- tests, options, control messages */

enum { K_SEND = 0, K_WR, K_WRITE, K_READ }; /* operation kind: test / 2 */
enum { TR_UD = 0, TR_RD, TR_RC };
static const char *const test_names[] = { "send_lat", "send_bw", "wr_lat", "wr_bw",
					  "write_lat", "write_bw", "read_lat", "read_bw" };
static const char *const tr_names[] = { "UD", "RD", "RC" };
enum { CTL_ANY = 0, CTL_HELLO, CTL_HELLO_OK, CTL_ERR, CTL_SETUP, CTL_START, CTL_READY, CTL_DONE,
       CTL_REPORT, CTL_BYE };
static const char *const ctl_names[] = { "any", "HELLO", "HELLO_OK", "ERR", "SETUP", "START",
					 "READY", "DONE", "REPORT", "BYE" };

struct dgperf_opt {
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
	bool event;         /* --event: *_bw waits block (CQ wait, poll) instead of busy-polling */
	unsigned port;
	uint32_t seg;
	bool seg_set;
	enum dgv_provider_kind provider;
	const char *peer;
	int verbose;
};

/* Fixed-size message; integers travel big-endian. */
struct ctl_msg {
	uint32_t magic;
	uint32_t type;
	uint64_t v[CTL_NV];
	uint8_t addr[16];
	char text[320];
};

struct report { /* the receiver's view of one phase */
	uint64_t count;   /* messages (send/records/writes) or datagrams-derived messages (raw) */
	uint64_t bytes;   /* bytes delivered (send: byte_len; raw: payload bytes) */
	uint64_t valid;   /* Write-Record: sum of record.valid_bytes */
	uint64_t lensum;  /* Write-Record: sum of record.length */
	uint64_t delta_ns; /* time from the last arrival to the report */
	uint64_t dgrams;  /* datagrams received (raw; write_bw: QP rx_datagrams) */
	uint64_t rejects; /* write_bw: datagrams the QP received but did not place */
	uint64_t fault_drops; /* verbs: datagrams the receiver's --loss dropped (QP fault_dropped) */
	uint64_t cpu_ns;  /* the receiver's CPU time (all its threads) from START to its report */
};

/* --detail: what the client knows about the row being printed (filled by client_phase). */
struct row_detail {
	uint64_t pings, lost;                  /* *_lat */
	uint64_t sent, tx_dg, tx_bytes, retx;  /* *_bw; the QP counters only when qp_stats */
	uint64_t peer_drops;                   /* *_bw: the server's fault_drops (its report) */
	uint64_t cpu_client_ns, cpu_server_ns; /* *_bw: each side's CPU time over the phase */
	bool qp_stats;
};

struct verbs_state {
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
};

struct watch {
	uint64_t next, val, since;
};

struct lat_run {
	uint64_t nsamp, lost, pings;
};

struct bw_run {
	uint64_t posted, t_start, t_end;
	uint64_t lost; /* UD reads given up */
};

struct raw_udp_state {
	int fd;
	uint8_t *txbuf, *rxbuf;
	uint32_t seg;
	uint64_t rng;
	uint64_t dropped;
	int family;
	union dgv_sockaddr peer; /* where sendto() goes (--raw-udp) */
	socklen_t peerlen;
};

struct raw_tcp_state {
	int fd;
	uint8_t *tx, *rx; /* tx: one message (max_msg_size), rx: TCP_CHUNK */
	int family;
};

/* ---------------------------------------------------------------- shared state */

/* dgperf.c */
extern int g_ctl;
extern int g_lfd;
extern bool g_server;
extern bool g_dying;
extern void (*g_die_hook)(void);

/* dgperf_opts.c */
extern struct dgperf_opt opt;

/* dgperf_ctl.c */
/*
 * RC and --raw-tcp carry their data on a second TCP connection to the server's control port:
 * the server keeps the control port's listening socket (g_lfd) open; for RC the provider listens
 * on it (dgv_listen with adopt_fd), for --raw-tcp dgperf accepts on it. The server sends a random
 * cookie in its SETUP message and the client presents it (RC: in the MPA private data; raw TCP:
 * the first 8 bytes of the stream), so a stray connection to the port is turned away.
 */
extern uint64_t g_cookie;

/* dgperf_output.c */
extern uint64_t *g_samples;
extern uint64_t g_samples_cap;
extern struct row_detail g_detail;

/* dgperf_verbs.c */
extern struct verbs_state V;

/* dgperf_raw.c */
extern struct raw_udp_state R;
extern struct raw_tcp_state T;

static inline int test_kind(void) { return opt.test / 2; }
static inline bool test_lat(void) { return opt.test % 2 == 0; }
static inline const char *transport_name(void)
{
	if (opt.raw_tcp)
		return "raw-tcp";
	return opt.raw ? (opt.raw_connected ? "raw-udp-connected" : "raw-udp") : tr_names[opt.transport];
}
/* RC and --raw-tcp carry the data on a second TCP connection to the server's control port. */
static inline bool data_on_tcp(void) { return opt.raw ? opt.raw_tcp : opt.transport == TR_RC; }
static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* CPU time of the whole process (every thread: the provider's progress thread too), ns. */
static inline uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* --event: the longest a wait for a completion or a datagram sleeps before the loop looks at
 * its control channel and deadlines again. */
#define EVENT_WAIT_MS 1

/* ---------------------------------------------------------------- functions, by file */

/* dgperf.c */
void __attribute__((noreturn, format(printf, 2, 3))) die(int code, const char *fmt, ...);
void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...);
void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* dgperf_opts.c */
void parse_options(int argc, char **argv);
uint64_t max_msg_size(void);
uint64_t iters_for(uint64_t size);
uint64_t warmup_for(uint64_t iters);
unsigned tx_depth(uint64_t size);
uint32_t seg_effective(int family);
bool reliable(void);
uint64_t lat_timeout_ns(uint64_t size, int family);
uint64_t phase_budget_ns(uint64_t size, uint64_t iters);

/* dgperf_ctl.c */
void sa_normalize(union dgv_sockaddr *a, socklen_t *len);
void sa_set_port(union dgv_sockaddr *a, unsigned port);
const char *sa_str(const union dgv_sockaddr *a, char *buf, size_t n);
const char *peer_role(void);
int io_wait(int fd, short ev, uint64_t deadline);
void ctl_send_err(int code, const char *text);
void ctl_send(uint32_t type, struct ctl_msg *m);
void ctl_recv(uint32_t want, struct ctl_msg *m, int timeout_ms, const char *what);
bool ctl_readable(void);
void ctl_check_peer(void);
int tcp_socket(int family, bool nonblock);
int tcp_accept(int lfd, bool nonblock);
int ctl_connect(const char *host, unsigned port);
int ctl_accept(unsigned port);
void ctl_local_peer(union dgv_sockaddr *local, socklen_t *llen, union dgv_sockaddr *peer,
		    socklen_t *plen);
void msg_put_addr(struct ctl_msg *m, const union dgv_sockaddr *a);
void msg_get_addr(const struct ctl_msg *m, const union dgv_sockaddr *ctl_peer,
		  union dgv_sockaddr *a, socklen_t *len);
void hello_fill(struct ctl_msg *m);
void hello_check(const struct ctl_msg *theirs);
uint64_t make_cookie(void);
void data_dst(const union dgv_sockaddr *ctl_peer, union dgv_sockaddr *dst, socklen_t *len);

/* dgperf_output.c */
void print_header(const char *provider, const char *extra);
void print_lat_row(uint64_t size, uint64_t n, double scale, double valid_fraction,
		   uint64_t lost, uint64_t pings);
void print_bw_row(uint64_t size, uint64_t iters, uint64_t bytes, uint64_t msgs,
		  uint64_t elapsed_ns, double valid_fraction);
uint64_t bw_elapsed(uint64_t t_start, uint64_t t_report, uint64_t t_local_end,
		    const struct report *rep);
void report_put(struct ctl_msg *m, uint64_t phase, const struct report *r);
void report_get(const struct ctl_msg *m, uint64_t phase, struct report *r);

/* dgperf_verbs.c */
void watch_client(struct watch *w, uint64_t t, const struct report *rep, uint64_t size);
/* A server's look at the control connection, at most every CTL_POLL_NS (*next_ctl): true when
 * the client's DONE came (and was read); dies when the client went silent or the size ran past
 * its time budget (budget_dl). */
bool server_tick(uint64_t t, uint64_t *next_ctl, struct watch *w, const struct report *rep, uint64_t size,
		 uint64_t budget_dl);
void check_wc(const struct dgv_wc *wc, const char *cq);
bool transient(int r);
int drain_scq(void);
void cq_event_wait(struct dgv_cq *cq);
bool post_one(struct dgv_send_wr *wr, uint64_t deadline);
void post_recvs(void);
void prepare_wr(struct dgv_send_wr *wr, struct dgv_sge *sge, uint64_t size, bool echo);
void stats_snapshot(void);
void stats_log(const char *label);
uint64_t rc_credit(void);
void rc_give_credit(uint64_t total);
void vb_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer);
void vb_teardown(void);

/* dgperf_verbs_tests.c */
void lat_timeout_check(uint64_t last_ok);
void vb_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out);
void vb_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep);
void vb_client_bw(uint64_t size, uint64_t iters, struct bw_run *out);
void vb_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep);

/* dgperf_raw.c */
void raw_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer);
void raw_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out);
void raw_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep);
void raw_client_bw(uint64_t size, uint64_t iters, struct bw_run *out);
void raw_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep);
void tcp_setup(const union dgv_sockaddr *ctl_local, const union dgv_sockaddr *ctl_peer);
void tcp_client_lat(uint64_t size, uint64_t iters, uint64_t warm, struct lat_run *out);
void tcp_server_lat(uint64_t size, uint64_t budget_dl, struct report *rep);
void tcp_client_bw(uint64_t size, uint64_t iters, struct bw_run *out);
void tcp_server_bw(uint64_t size, uint64_t iters, uint64_t budget_dl, struct report *rep);

#endif /* DGPERF_H */
