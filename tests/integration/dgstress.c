/*
 * dgstress - two-process checks of the soft RNIC over loopback.
 *
 *   dgstress [-c UD|RD] [--fault SPEC] [-n N] [--seed S] [-p PORT] server
 *   dgstress [-c UD|RD] [--fault SPEC] [-n N] [--seed S] [-p PORT] client HOST
 *   dgstress --ops [-c UD|RD] ...          every opcode once, verified on both sides
 *
 * Stream mode: the client sends N messages of log-uniform random sizes (1 B .. 1 MiB) whose
 * bytes are a function of (seed, index); the server checks each one byte for byte and, on RD,
 * that they arrive exactly once and in order. SPEC is a dgv_fault spec applied at the receive
 * edge of both processes (data at the server, acks at the client).
 * Exit 0 when everything checked out, 1 otherwise; a watchdog ends a stuck run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dgverbs.h"

#define MAXMSG (1u << 20)
#define RING 32

static enum dgv_qp_type qpt = DGV_QPT_RD;
static struct dgv_fault fault;
static int nmsgs = 10000;
static uint64_t seed = 1;
static int port = 19875;
static int ops_mode;

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static struct dgv_cq *cq;
static struct dgv_qp *qp;
static struct dgv_mr *mr;
static uint8_t *buf;
static size_t bufsz;

static void die(const char *what, int err)
{
	fprintf(stderr, "dgstress: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Log-uniform in [1, MAXMSG]: every order of magnitude equally likely. */
static uint32_t msg_size(int i)
{
	uint64_t r = mix(seed * 1000003u + (uint64_t)i);
	unsigned bits = (unsigned)(r % 21); /* 2^0 .. 2^20 */
	uint32_t lo = 1u << bits >> 1, hi = 1u << bits;
	uint32_t sz = lo + (uint32_t)((r >> 8) % (hi - lo + 1));
	return sz ? sz : 1;
}

static void msg_fill(uint8_t *p, uint32_t len, int i)
{
	uint64_t s = mix(seed ^ ((uint64_t)i << 20));
	for (uint32_t k = 0; k < len; k += 8) {
		uint64_t v = mix(s + k);
		uint32_t n = len - k < 8 ? len - k : 8;
		memcpy(p + k, &v, n);
	}
}

static void setup(int bind_port)
{
	int rc;
	if ((rc = dgv_open(NULL, &ctx)))
		die("open", rc);
	if ((rc = dgv_alloc_pd(ctx, &pd)))
		die("alloc_pd", rc);
	if ((rc = dgv_create_cq(ctx, 4096, &cq)))
		die("create_cq", rc);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)bind_port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	static const struct dgv_fault none;
	struct dgv_qp_init_attr at = {.qp_type = qpt, .send_cq = cq, .recv_cq = cq, .max_send_wr = 512,
				      .max_recv_wr = 512, .bind_addr = (struct sockaddr *)&a,
				      .bind_len = sizeof a, .fault_tx = &none, .fault_rx = &fault,
				      .max_msg_size = MAXMSG, .rd_max_retries = 30};
	if ((rc = dgv_create_qp(pd, &at, &qp)))
		die("create_qp", rc);
	bufsz = (size_t)(RING + 2) * MAXMSG;
	buf = aligned_alloc(4096, bufsz);
	memset(buf, 0, bufsz);
	if ((rc = dgv_reg_mr(pd, buf, bufsz,
			     DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE | DGV_ACCESS_REMOTE_READ, &mr)))
		die("reg_mr", rc);
}

static struct dgv_ah *the_ah;

/* Releases everything, so the sanitizer build can hold us to no leaks. */
static void teardown(void)
{
	if (the_ah)
		dgv_destroy_ah(the_ah);
	dgv_destroy_qp(qp);
	dgv_dereg_mr(mr);
	dgv_destroy_cq(cq);
	dgv_dealloc_pd(pd);
	dgv_close(ctx);
	free(buf);
}

static int next_wc(struct dgv_wc *wc, int timeout_ms)
{
	for (;;) {
		int n = dgv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("poll_cq", n);
		if (n == 1)
			return 1;
		int r = dgv_cq_wait(cq, timeout_ms);
		if (r == -ETIMEDOUT)
			return dgv_poll_cq(cq, 1, wc);
		if (r && r != -EINTR)
			die("cq_wait", r);
	}
}

static void post_recv_slot(int slot)
{
	struct dgv_sge sge = {(uint64_t)(uintptr_t)(buf + (size_t)slot * MAXMSG), MAXMSG, mr->lkey};
	struct dgv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1};
	int rc = dgv_post_recv(qp, &wr, NULL);
	if (rc)
		die("post_recv", rc);
}

static void post(struct dgv_ah *ah, enum dgv_wr_opcode op, void *p, uint32_t len, uint64_t raddr,
		 uint32_t rkey, uint64_t id)
{
	struct dgv_sge sge = {(uint64_t)(uintptr_t)p, len, mr->lkey};
	struct dgv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = DGV_SEND_SIGNALED, .ah = ah, .remote_addr = raddr, .rkey = rkey};
	int rc;
	while ((rc = dgv_post_send(qp, &wr, NULL)) == -ENOMEM) {
		struct dgv_wc wc;
		dgv_poll_cq(cq, 1, &wc); /* send queue full: let it drain */
	}
	if (rc)
		die("post_send", rc);
}

struct hello {
	uint64_t addr;
	uint32_t rkey;
	uint32_t n;
};

static int server(void)
{
	setup(port);
	for (int i = 0; i < RING; i++)
		post_recv_slot(i);
	int got = 0, bad = 0;
	uint64_t bytes = 0;
	uint8_t *expect = malloc(MAXMSG);
	struct dgv_wc wc;
	int idle_ms = qpt == DGV_QPT_RD ? 30000 : 3000;
	while (got < nmsgs) {
		if (!next_wc(&wc, idle_ms))
			break;
		if (wc.opcode != DGV_WC_RECV)
			continue;
		if (wc.status != DGV_WC_SUCCESS) {
			fprintf(stderr, "dgstress: receive status %d\n", wc.status);
			bad++;
			post_recv_slot((int)wc.wr_id);
			continue;
		}
		int idx = qpt == DGV_QPT_RD ? got : (int)wc.msn;
		uint32_t want = msg_size(idx);
		msg_fill(expect, want, idx);
		if (wc.byte_len != want || memcmp(buf + wc.wr_id * MAXMSG, expect, want)) {
			fprintf(stderr, "dgstress: message %d (msn %u) wrong: %u bytes, want %u\n", idx, wc.msn,
				wc.byte_len, want);
			bad++;
		}
		if (qpt == DGV_QPT_RD && wc.msn != (uint32_t)got) {
			fprintf(stderr, "dgstress: out of order: msn %u at position %d\n", wc.msn, got);
			bad++;
		}
		bytes += wc.byte_len;
		got++;
		post_recv_slot((int)wc.wr_id);
	}
	/* Linger like TCP's TIME_WAIT: our last acks may have been lost, and the client's
	 * retransmissions must still find us, or it would report the peer failed. */
	for (uint64_t end = (uint64_t)time(NULL) + 2; (uint64_t)time(NULL) < end;) {
		dgv_poll_cq(cq, 1, &wc);
		dgv_cq_wait(cq, 100);
	}
	struct dgv_qp_stats st;
	dgv_qp_stats(qp, &st);
	printf("server: %d of %d messages, %" PRIu64 " bytes, %d bad; crc drops %" PRIu64
	       ", injected drops %" PRIu64 " dups %" PRIu64 " reorders %" PRIu64 ", rd dup drops %" PRIu64 "\n",
	       got, nmsgs, bytes, bad, st.crc_drops, st.fault_dropped, st.fault_duplicated,
	       st.fault_reordered, st.dup_drops);
	free(expect);
	teardown();
	if (bad || (qpt == DGV_QPT_RD && got != nmsgs))
		return 1;
	return got > 0 ? 0 : 1;
}

static struct dgv_ah *peer_ah(const char *host)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		die("bad host (IPv4 literal expected)", EINVAL);
	struct dgv_ah *ah;
	int rc = dgv_create_ah(pd, (struct sockaddr *)&a, sizeof a, &ah);
	if (rc)
		die("create_ah", rc);
	the_ah = ah;
	return ah;
}

/* Waits for one send completion and counts it. */
static void reap_send(int *inflight, int *done, int *failed)
{
	struct dgv_wc wc;
	if (!next_wc(&wc, 60000))
		die("no send completion", ETIMEDOUT);
	(*inflight)--;
	(*done)++;
	if (wc.status != DGV_WC_SUCCESS) {
		fprintf(stderr, "dgstress: send %" PRIu64 " status %d\n", wc.wr_id, wc.status);
		(*failed)++;
	}
}

static int client(const char *host)
{
	setup(0);
	struct dgv_ah *ah = peer_ah(host);
	int inflight = 0, done = 0, failed = 0;
	struct dgv_wc wc;
	for (int i = 0; i < nmsgs; i++) {
		uint8_t *p = buf + (size_t)(i % RING) * MAXMSG;
		/* never overwrite a buffer still in flight: at most RING outstanding */
		while (inflight >= RING)
			reap_send(&inflight, &done, &failed);
		uint32_t len = msg_size(i);
		msg_fill(p, len, i);
		post(ah, DGV_WR_SEND, p, len, 0, 0, (uint64_t)i);
		inflight++;
		/* UD has no flow control: pace so the receiver's socket buffer is not the limit */
		if (qpt == DGV_QPT_UD && (i % 8) == 7)
			usleep(2000);
	}
	while (inflight > 0)
		reap_send(&inflight, &done, &failed);
	struct dgv_qp_stats st;
	dgv_qp_stats(qp, &st);
	printf("client: %d sent, %d failed; datagrams %" PRIu64 ", retransmits %" PRIu64 "\n", done, failed,
	       st.tx_datagrams, st.rd_retransmits);
	/* let the last acks and retransmissions finish before leaving */
	for (int i = 0; i < 50; i++) {
		dgv_poll_cq(cq, 1, &wc);
		usleep(2000);
	}
	teardown();
	return failed ? 1 : 0;
}

/* --ops: Send, Send with SE, Write, Write-Record and Read once each, checked on both ends. */
static int ops_server(void)
{
	setup(port);
	post_recv_slot(0);
	post_recv_slot(1);
	struct dgv_wc wc;
	if (!next_wc(&wc, 10000) || wc.opcode != DGV_WC_RECV || wc.status)
		die("no hello", ETIMEDOUT);
	struct dgv_ah *ah;
	int rc = dgv_create_ah(pd, &wc.src.sa, wc.src_len, &ah);
	if (rc)
		die("create_ah", rc);
	the_ah = ah;
	struct hello *h = (struct hello *)(buf + (size_t)(RING + 1) * MAXMSG);
	*h = (struct hello){(uint64_t)(uintptr_t)(buf + 2 * MAXMSG), mr->rkey, 0};
	post(ah, DGV_WR_SEND, h, sizeof *h, 0, 0, 100);
	int errors = 0, record = 0, se = 0;
	while (!(record && se)) {
		if (!next_wc(&wc, 10000)) {
			fprintf(stderr, "dgstress: ops server timed out (record %d, se %d)\n", record, se);
			return 1;
		}
		if (wc.opcode == DGV_WC_RECV_WRITE_RECORD) {
			uint8_t expect[5000];
			msg_fill(expect, sizeof expect, 2);
			if (wc.status || wc.record.valid_bytes != sizeof expect ||
			    memcmp((void *)(uintptr_t)wc.record.base, expect, sizeof expect))
				errors++;
			record = 1;
		} else if (wc.opcode == DGV_WC_RECV) {
			if (!(wc.flags & DGV_WC_SOLICITED) || wc.status)
				errors++;
			se = 1;
		}
	}
	uint8_t expect[3000];
	msg_fill(expect, sizeof expect, 1);
	if (memcmp(buf + 2 * MAXMSG, expect, sizeof expect))
		errors++; /* the plain Write landed before the Send that follows it */
	printf("ops server: write %s, write-record %s, send-se %s\n", errors ? "?" : "ok", "ok", "ok");
	usleep(200000); /* serve the client's Read (the progress thread answers it) */
	teardown();
	return errors ? 1 : 0;
}

static int ops_client(const char *host)
{
	setup(0);
	struct dgv_ah *ah = peer_ah(host);
	post_recv_slot(0);
	uint8_t *p = buf + (size_t)RING * MAXMSG;
	memcpy(p, "hello", 5);
	post(ah, DGV_WR_SEND, p, 5, 0, 0, 1);
	struct dgv_wc wc;
	struct hello h = {0};
	int errors = 0, seen = 0;
	while (!h.rkey) {
		if (!next_wc(&wc, 10000))
			die("no reply from server", ETIMEDOUT);
		if (wc.opcode == DGV_WC_RECV)
			memcpy(&h, buf, sizeof h);
		else if (wc.wr_id == 1 && wc.status == DGV_WC_SUCCESS)
			seen |= 2;
	}
	uint8_t *w = buf + 4 * MAXMSG;
	msg_fill(w, 3000, 1);
	post(ah, DGV_WR_WRITE, w, 3000, h.addr, h.rkey, 2);
	uint8_t *r = buf + 5 * MAXMSG;
	msg_fill(r, 5000, 2);
	post(ah, DGV_WR_WRITE_RECORD, r, 5000, h.addr + 65536, h.rkey, 3);
	uint8_t *back = buf + 6 * MAXMSG;
	post(ah, DGV_WR_READ, back, 3000, h.addr, h.rkey, 4);
	memcpy(p, "bye", 3);
	post(ah, DGV_WR_SEND_SE, p, 3, 0, 0, 5);
	while (seen != 0x3e) {
		if (!next_wc(&wc, 10000)) {
			fprintf(stderr, "dgstress: ops client timed out (seen %#x)\n", seen);
			return 1;
		}
		if (wc.status) {
			fprintf(stderr, "dgstress: wr %" PRIu64 " status %d\n", wc.wr_id, wc.status);
			errors++;
		}
		if (wc.wr_id < 8)
			seen |= 1 << wc.wr_id;
	}
	if (memcmp(back, w, 3000))
		errors++;
	printf("ops client: send ok, write ok, write-record ok, read %s, send-se ok\n",
	       memcmp(back, w, 3000) ? "WRONG" : "ok");
	teardown();
	return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {{"fault", 1, 0, 'f'}, {"seed", 1, 0, 's'}, {"ops", 0, 0, 'o'}, {0}};
	int c;
	while ((c = getopt_long(argc, argv, "c:n:p:", lo, NULL)) != -1) {
		const char *why;
		switch (c) {
		case 'c':
			qpt = !strcasecmp(optarg, "UD") ? DGV_QPT_UD : !strcasecmp(optarg, "RD") ? DGV_QPT_RD : 0;
			if (!qpt)
				die("-c takes UD or RD", EINVAL);
			break;
		case 'n':
			nmsgs = atoi(optarg);
			break;
		case 'p':
			port = atoi(optarg);
			break;
		case 's':
			seed = strtoull(optarg, NULL, 0);
			break;
		case 'o':
			ops_mode = 1;
			break;
		case 'f':
			if (dgv_fault_parse(optarg, &fault, &why)) {
				fprintf(stderr, "dgstress: --fault %s: %s\n", optarg, why);
				return 2;
			}
			break;
		default:
			return 2;
		}
	}
	if (optind >= argc)
		return 2;
	alarm(300); /* a stuck run fails instead of hanging CI */
	if (!strcmp(argv[optind], "server"))
		return ops_mode ? ops_server() : server();
	if (!strcmp(argv[optind], "client") && optind + 1 < argc)
		return ops_mode ? ops_client(argv[optind + 1]) : client(argv[optind + 1]);
	return 2;
}
