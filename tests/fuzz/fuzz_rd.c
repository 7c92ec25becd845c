/*
 * fuzz_rd.c - the reliable-datagram LLP (verbs_backend/soft/rd.c): RD headers, cumulative and
 * selective acknowledgements, RNR, resets, epochs, retransmission timers, tail-loss probes and
 * their answers, out-of-order buffers,
 * against one endpoint with a fake clock (rd_test_set_clock), so every run is reproducible.
 *
 * The input is a program of operations:
 *   0 peer flags len16 bytes  a datagram from peer (0, 1: IPv4; 2: IPv6) as rd_input gets it
 *                             (RD header onward, CRC already checked and removed); flags bit 0
 *                             writes our current epoch towards that peer into ack_epoch, bit 1
 *                             into epoch (what the peer would echo), so that acks of ours can
 *                             be reached: epochs are random and the fuzzer cannot guess them
 *   1 peer len16              rd_send of len bytes (a new cookie) to peer
 *   2 t16                     advance the clock by t * 100 us, rd_tick
 *   3                         rd_kick
 *   4 on                      deliver() answers -EAGAIN (no receive buffer) while on
 *   5 on                      xmit() fails (-EAGAIN) while on
 *   6 peer                    rd_can_send
 * The first byte picks the initial sequence number (0, near 2^31, near 2^32) so that wraparound
 * is reached.
 * Oracles: every datagram rd sends has a valid CRC and a well-formed header; deliver() gets
 * segments no longer than max_dgram; no cookie is reported twice or unknown; after the
 * program, ticking on with a working network reports every cookie exactly once (acked or
 * failed) and leaves the endpoint idle.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>

#include "crc.h"
#include "fuzz.h"
#include "rd.h"
#include "wire.h"

void rd_test_set_clock(struct rd_ep *ep, uint64_t (*fn)(void *), void *arg);
void rd_test_set_isn(uint32_t isn);

#define MAX_DGRAM 1500u
#define NPEER 3
#define MAX_COOKIES 4096

static uint64_t now_us;
static union dgv_sockaddr peers[NPEER];
static socklen_t peer_len[NPEER];
static uint32_t our_epoch[NPEER]; /* from the last datagram we sent each peer */
static bool refuse, xmit_fail;
static uint8_t reported[MAX_COOKIES + 1];
static uint32_t cookies;

static uint64_t fake_clock(void *arg)
{
	(void)arg;
	return now_us;
}

static int peer_of(const union dgv_sockaddr *a, socklen_t len)
{
	for (int i = 0; i < NPEER; i++)
		if (len == peer_len[i] && !memcmp(a, &peers[i], len))
			return i;
	return -1;
}

static int xmit(void *arg, const struct iovec *iov, int iovcnt, const union dgv_sockaddr *to,
		socklen_t tolen)
{
	uint8_t d[DG_RD_HLEN + MAX_DGRAM + DG_CRC_LEN];
	size_t n = 0;
	for (int i = 0; i < iovcnt; i++) {
		FUZZ_CHECK(n + iov[i].iov_len <= sizeof d);
		memcpy(d + n, iov[i].iov_base, iov[i].iov_len);
		n += iov[i].iov_len;
	}
	FUZZ_CHECK(n >= DG_RD_HLEN + DG_CRC_LEN);
	FUZZ_CHECK(dg_crc_check(d, n));
	struct dg_rd_hdr h;
	memcpy(&h, d, sizeof h);
	FUZZ_CHECK(h.magic == RD_MAGIC && h.flags);
	FUZZ_CHECK(!(h.flags & ~(RD_FLAG_DATA | RD_FLAG_ACK | RD_FLAG_RST | RD_FLAG_RNR | RD_FLAG_PROBE |
				 RD_FLAG_ANSWER)));
	/* RNR and ANSWER ride on an ack; a probe is header only and answers nothing */
	FUZZ_CHECK(!(h.flags & (RD_FLAG_RNR | RD_FLAG_ANSWER)) || (h.flags & RD_FLAG_ACK));
	FUZZ_CHECK(!(h.flags & RD_FLAG_PROBE) || !(h.flags & (RD_FLAG_DATA | RD_FLAG_ANSWER)));
	FUZZ_CHECK(!(h.flags & RD_FLAG_DATA) == (n == DG_RD_HLEN + DG_CRC_LEN));
	FUZZ_CHECK(be16toh(h.wnd) >= 1);
	int p = peer_of(to, tolen);
	FUZZ_CHECK(p >= 0);
	if (!(h.flags & RD_FLAG_RST))
		our_epoch[p] = be32toh(h.epoch);
	return xmit_fail ? -EAGAIN : 0;
}

static int deliver(void *arg, const union dgv_sockaddr *from, socklen_t fromlen, const uint8_t *seg,
		   size_t len)
{
	FUZZ_CHECK(peer_of(from, fromlen) >= 0);
	FUZZ_CHECK(len > 0 && len <= MAX_DGRAM);
	/* touch every byte: ASan checks the buffer really holds len bytes */
	volatile uint8_t sum = 0;
	for (size_t i = 0; i < len; i++)
		sum ^= seg[i];
	(void)sum;
	return refuse ? -EAGAIN : 0;
}

static void report(uint64_t cookie)
{
	FUZZ_CHECK(cookie >= 1 && cookie <= cookies);
	FUZZ_CHECK(!reported[cookie]);
	reported[cookie] = 1;
}

static void acked(void *arg, uint64_t cookie) { report(cookie); }

static void failed(void *arg, uint64_t cookie, int err)
{
	FUZZ_CHECK(err == -ETIMEDOUT || err == -ECONNRESET);
	report(cookie);
}

static const struct rd_ops ops = {.xmit = xmit, .deliver = deliver, .acked = acked, .failed = failed};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	for (int i = 0; i < 2; i++) {
		peers[i].sin = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)(7000 + i)),
						    .sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)i)};
		peer_len[i] = sizeof peers[i].sin;
	}
	peers[2].sin6 = (struct sockaddr_in6){.sin6_family = AF_INET6, .sin6_port = htons(7002),
					      .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	peer_len[2] = sizeof peers[2].sin6;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t isns[] = {0, 0x7ffffff0u, 0xfffffff0u, 0xffffffffu};
	struct fz f = {data, size};
	rd_test_set_isn(isns[fz_u8(&f) & 3]);
	struct rd_cfg cfg = {.max_dgram = MAX_DGRAM, .tx_slots = 24, .rx_slots = 12, .max_wnd = 16,
			     .max_peers = 2, .max_retries = 3, .rto_min_us = 2000, .rto_max_us = 100000,
			     .ack_delay_us = 500};
	struct rd_ep *ep;
	FUZZ_CHECK(rd_create(&cfg, &ops, NULL, &ep) == 0);
	now_us = 1000000000ull;
	rd_test_set_clock(ep, fake_clock, NULL);
	refuse = xmit_fail = false;
	memset(our_epoch, 0, sizeof our_epoch);
	memset(reported, 0, sizeof reported);
	cookies = 0;
	uint8_t payload[MAX_DGRAM + 1];
	memset(payload, 0xab, sizeof payload);

	for (unsigned steps = 0; fz_more(&f) && steps < 256; steps++) {
		switch (fz_u8(&f) % 7) {
		case 0: {
			int p = fz_u8(&f) % NPEER;
			uint8_t fl = fz_u8(&f);
			size_t n;
			const uint8_t *b = fz_bytes(&f, fz_u16(&f) % (DG_RD_HLEN + MAX_DGRAM + 8), &n);
			uint8_t *d = malloc(n ? n : 1); /* exact size: ASan sees reads past the end */
			memcpy(d, b, n);
			if ((fl & 1) && n >= 16) {
				uint32_t e = htobe32(our_epoch[p]);
				memcpy(d + offsetof(struct dg_rd_hdr, ack_epoch), &e, 4);
			}
			if ((fl & 2) && n >= 8) {
				uint32_t e = htobe32(our_epoch[p]);
				memcpy(d + offsetof(struct dg_rd_hdr, epoch), &e, 4);
			}
			int r = rd_input(ep, &peers[p], peer_len[p], d, n);
			FUZZ_CHECK(r == 0 || r == -EPROTO);
			free(d);
			break;
		}
		case 1: {
			int p = fz_u8(&f) % NPEER;
			uint16_t n = fz_u16(&f) % (MAX_DGRAM + 2);
			if (cookies == MAX_COOKIES)
				break;
			struct iovec iov = {payload, n};
			int r = rd_send(ep, &peers[p], peer_len[p], &iov, 1, cookies + 1);
			if (r == 0)
				cookies++;
			else
				FUZZ_CHECK(r == -EAGAIN || r == -ENOMEM || r == -EMSGSIZE || (r == -EINVAL && n == 0));
			break;
		}
		case 2:
			now_us += (uint64_t)fz_u16(&f) * 100;
			rd_tick(ep, now_us);
			break;
		case 3:
			rd_kick(ep);
			break;
		case 4:
			refuse = fz_u8(&f) & 1;
			break;
		case 5:
			xmit_fail = fz_u8(&f) & 1;
			break;
		default: {
			int p = fz_u8(&f) % NPEER;
			(void)rd_can_send(ep, &peers[p], peer_len[p]);
			break;
		}
		}
	}

	/* The network heals and the receiver takes everything: every datagram sent is acked or
	 * its peer fails within the retry budget, and every cookie is told exactly once. */
	refuse = xmit_fail = false;
	rd_kick(ep);
	for (int i = 0; i < 100 && rd_busy(ep); i++) {
		now_us += 200000;
		rd_tick(ep, now_us);
	}
	FUZZ_CHECK(!rd_busy(ep));
	for (uint32_t c = 1; c <= cookies; c++)
		FUZZ_CHECK(reported[c]);
	struct rd_stats st;
	rd_get_stats(ep, &st);
	FUZZ_CHECK(st.peers <= cfg.max_peers);
	rd_destroy(ep);
	return 0;
}
