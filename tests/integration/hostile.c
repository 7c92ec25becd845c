/*
 * hostile - a hostile datagram-iWARP peer (issue "Hardening", item 6): floods HOST:PORT with
 * valid-looking framed datagrams (correct CRC32c, well-formed control bits) that name random
 * STags, tagged offsets, MSNs, message offsets and lengths, for SECONDS.
 *
 *   hostile HOST PORT SECONDS [SEED]
 *
 * Kinds, in turn: tagged RDMA Write, Write-Record and Read Response into random STags and
 * offsets; untagged Sends with random MSNs, offsets and lengths up to 1 MiB (reassemblies that
 * never complete); Read Requests for random remote memory; Terminates; RD datagrams with random
 * epochs and sequence numbers, and the same RD datagram replayed. It is not preloaded: it
 * writes the wire format itself, from verbs_backend/wire.h and the provider's framing helpers.
 * Prints how many datagrams of each kind it sent; exit 0, 1 on a socket error, 2 on usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "crc.h"
#include "frame.h"
#include "wire.h"

enum { K_WRITE, K_WREC, K_RRESP, K_SEND, K_RREQ, K_TERM, K_RD, K_RD_REPLAY, K_N };
static const char *const kname[K_N] = {"write", "write_record", "read_response", "send",
				       "read_request", "terminate", "rd", "rd_replay"};

static uint64_t rng;
static uint64_t rnd(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One datagram of kind k into buf; returns its length (CRC appended). */
static size_t build(int k, uint8_t *buf, uint8_t *rd_last, size_t *rd_last_len)
{
	size_t off = 0;
	if (k == K_RD_REPLAY && *rd_last_len) {
		memcpy(buf, rd_last, *rd_last_len);
		return *rd_last_len;
	}
	if (k == K_RD || k == K_RD_REPLAY) {
		struct dg_rd_hdr r = {.magic = RD_MAGIC, .flags = (uint8_t)(rnd() & 1 ? RD_FLAG_DATA : rnd()),
				      .wnd = htobe16((uint16_t)rnd()), .epoch = htobe32((uint32_t)rnd()),
				      .seq = htobe32((uint32_t)(rnd() & 0xff)), .ack_epoch = htobe32((uint32_t)rnd()),
				      .ack = htobe32((uint32_t)rnd()), .sack = htobe32((uint32_t)rnd())};
		memcpy(buf, &r, sizeof r);
		off = sizeof r;
		k = K_SEND; /* an RD datagram carries a DDP segment */
	}
	uint32_t plen = (uint32_t)(rnd() % 1200);
	uint32_t segsz = 1 + (uint32_t)(rnd() % 1400);
	uint32_t ml = (uint32_t)(rnd() % (1u << 20)) + plen;
	uint32_t mo = plen < ml ? (uint32_t)(rnd() % (ml - plen + 1)) : 0;
	mo -= mo % segsz;
	bool last = mo + plen >= ml;
	switch (k) {
	case K_WRITE:
	case K_WREC:
	case K_RRESP: {
		struct dg_tagged_hdr h;
		uint8_t op = k == K_WRITE ? RDMAP_WRITE : k == K_WREC ? RDMAP_WRITE_RECORD : RDMAP_READ_RESP;
		/* small STags are the ones a provider hands out first: half the time one of them */
		uint32_t stag = rnd() & 1 ? (uint32_t)(rnd() % 64) << 8 | (uint32_t)(rnd() & 0xff) : (uint32_t)rnd();
		dg_put_tagged(&h, op, last, stag, rnd(), (uint32_t)rnd(), mo, ml, (uint16_t)segsz);
		memcpy(buf + off, &h, sizeof h);
		off += sizeof h;
		break;
	}
	case K_SEND:
	case K_RREQ:
	case K_TERM: {
		struct dg_untagged_hdr h;
		uint8_t op = k == K_SEND ? RDMAP_SEND : k == K_RREQ ? RDMAP_READ_REQ : RDMAP_TERMINATE;
		uint32_t qn = k == K_SEND ? DDP_QN_SEND : k == K_RREQ ? DDP_QN_READ_REQ : DDP_QN_TERMINATE;
		if (k == K_RREQ) {
			plen = DG_READ_REQ_LEN, mo = 0, ml = plen, last = true;
		} else if (k == K_TERM) {
			plen = 28, mo = 0, ml = plen, last = true;
		}
		dg_put_untagged(&h, op, last, qn, (uint32_t)rnd(), mo, ml, (uint16_t)segsz, 0);
		memcpy(buf + off, &h, sizeof h);
		off += sizeof h;
		if (k == K_RREQ) {
			struct rdmap_read_req rr;
			dg_put_read_req(&rr, (uint32_t)rnd(), rnd(), (uint32_t)rnd(), (uint32_t)(rnd() % 4096) << 8,
					rnd() % 2 ? 0 : rnd());
			memcpy(buf + off, &rr, sizeof rr);
			off += sizeof rr;
			plen = 0;
		}
		break;
	}
	}
	for (uint32_t i = 0; i < plen; i++)
		buf[off++] = (uint8_t)rnd();
	be32 crc = htobe32(dg_crc32c(buf, off));
	memcpy(buf + off, &crc, sizeof crc);
	off += sizeof crc;
	if (buf[0] == RD_MAGIC && k == K_SEND) {
		memcpy(rd_last, buf, off);
		*rd_last_len = off;
	}
	return off;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: hostile HOST PORT SECONDS [SEED]\n");
		return 2;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *ai;
	if (getaddrinfo(argv[1], argv[2], &hints, &ai)) {
		fprintf(stderr, "hostile: cannot resolve %s %s\n", argv[1], argv[2]);
		return 2;
	}
	double secs = atof(argv[3]);
	rng = argc > 4 ? strtoull(argv[4], NULL, 0) : (uint64_t)time(NULL);
	if (!rng)
		rng = 1;
	int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("hostile: socket");
		return 1;
	}
	static uint8_t buf[2048], rd_last[2048];
	size_t rd_last_len = 0;
	unsigned long sent[K_N] = {0};
	double end = now_s() + secs;
	unsigned long n = 0;
	while ((n & 255) || now_s() < end) {
		int k = (int)(n++ % K_N);
		size_t len = build(k, buf, rd_last, &rd_last_len);
		if (sendto(fd, buf, len, 0, ai->ai_addr, ai->ai_addrlen) < 0) {
			if (errno == ECONNREFUSED || errno == ENOBUFS || errno == EAGAIN)
				continue; /* the target's ICMP, a full queue: keep on */
			perror("hostile: sendto");
			return 1;
		}
		sent[k]++;
	}
	printf("hostile: sent");
	for (int k = 0; k < K_N; k++)
		printf(" %s=%lu", kname[k], sent[k]);
	printf("\n");
	freeaddrinfo(ai);
	close(fd);
	return 0;
}
