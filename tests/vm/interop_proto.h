/*
 * interop_proto.h - the little protocol that tests/vm/siw_peer.c (libibverbs + librdmacm, run on
 * the kernel's siw device) and tests/vm/rc_interop.c (the dgverbs soft provider) both follow, so
 * that any pairing of the two (siw<->siw, soft<->soft, soft<->siw both ways) runs the same
 * exchange and checks every byte. Header-only: both programs include it; neither links the other.
 *
 * Roles: the ACTIVE side connects (rdma_connect / dgv_connect), the PASSIVE side listens and
 * accepts. Each side registers one region of IOP_REGION bytes with local write, remote write and
 * remote read, and fills its upper half [IOP_HALF, IOP_REGION) with iop_pat(own read seed, i),
 * its lower half with zeros. The region is advertised in the MPA private data (the connect
 * request's for the active side, the accept reply's for the passive side) as a struct iop_pdata,
 * all fields big-endian.
 *
 * Every Send carries either test data (phase 1) or one struct iop_ctl (big-endian). Each side
 * keeps IOP_NRECV receives of IOP_RBUF bytes posted (the passive side posts them before it
 * accepts, the active side before it connects), and reposts each one it consumes.
 *
 *   0. active -> passive  ctl READY           (the initiator speaks first: RFC 5044 section
 *                                               7.1.2 forbids an MPA responder to send an FPDU
 *                                               before it received one, unless RFC 6581's
 *                                               peer-to-peer RTR is negotiated; Linux siw as
 *                                               initiator fails the connection when an FPDU
 *                                               arrives together with the MPA Reply)
 *   1. for each size S in IOP_SEND_SIZES (seed IOP_SEED_SEND + index):
 *        active  -> passive Send of S bytes iop_pat(seed, i)
 *        passive checks it byte for byte and Sends the received bytes back unchanged
 *        active checks the echo byte for byte
 *   2. the active side works on the passive side's region:
 *        for each (off, len) in IOP_WRITES (seed IOP_SEED_WRITE_A + index):
 *          RDMA Write of iop_pat(seed, i) to peer.addr + off, then
 *          ctl WROTE {off, len, seed}; the owner checks those bytes and answers ctl ACK {status}
 *        for each (off, len) in IOP_READS: RDMA Read of peer.addr + IOP_HALF + off, checked
 *          against iop_pat(owner's read seed, IOP_HALF + off + i)
 *        RDMA Read back of every IOP_WRITES range, checked against what was written
 *        ctl READ_RESULT {status} so the owner can report the outcome of the reads of its memory
 *   3. the passive side does the same on the active side's region (WROTE/ACK, reads, read back,
 *      READ_RESULT), with IOP_SEED_WRITE_P.
 *   4. active -> passive ctl BYE, passive -> active ctl BYE; both disconnect and wait (bounded)
 *      for the disconnected event.
 *
 * Read seeds: IOP_SEED_READ_P for the passive side's upper half, IOP_SEED_READ_A for the active's.
 * Status values in ACK/READ_RESULT: 0 = every byte matched, else the 1-based offset of the first
 * bad byte (capped), so a failure is visible on both ends.
 *
 * Output (both programs, stdout, one line each, parsed by scripts/vm-test):
 *   @@OP <op> PASS|FAIL <detail>
 * op: connect, send_echo, write_by_active, read_by_active, write_by_passive, read_by_passive,
 *     disconnect. Each side reports what it saw of each op (the owner's view of a Write is its own
 *     byte check). Exit status 0 only if every op this side saw passed.
 */
#ifndef IOP_PROTO_H
#define IOP_PROTO_H

#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define IOP_MAGIC 0x44474957u /* "DGIW" */
#define IOP_VERSION 1u
#define IOP_REGION (256u * 1024u)
#define IOP_HALF (IOP_REGION / 2)
#define IOP_RBUF (128u * 1024u)
#define IOP_NRECV 8
#define IOP_IRD_ORD 4
#define IOP_DEFAULT_PORT 7700
#define IOP_TIMEOUT_MS 15000 /* any single wait; TCG is slow */

#define IOP_SEED_SEND 0x10u
#define IOP_SEED_WRITE_A 0x20u
#define IOP_SEED_WRITE_P 0x30u
#define IOP_SEED_READ_P 0x50u
#define IOP_SEED_READ_A 0x60u

/* Sizes cross the interesting lines: 1 byte (pad 1), unaligned, one page, several FPDUs. */
static const uint32_t IOP_SEND_SIZES[] = {1, 333, 4096, 100000};
struct iop_range { uint32_t off, len; };
static const struct iop_range IOP_WRITES[] = {{0, 100000}, {100003, 7}, {120000, 1}}; /* disjoint */
static const struct iop_range IOP_READS[] = {{0, 100000}, {11, 1}, {65531, 70}};
#define IOP_N(a) (sizeof(a) / sizeof((a)[0]))

struct iop_pdata {      /* MPA private data, big-endian, 24 bytes */
	uint32_t magic;
	uint32_t version;
	uint64_t addr;  /* the region's tagged offset (its virtual address) */
	uint32_t rkey;  /* its STag */
	uint32_t len;
};

enum iop_ctl_type { IOP_READY = 1, IOP_WROTE, IOP_ACK, IOP_READ_RESULT, IOP_BYE };

struct iop_ctl {        /* one Send, big-endian, 24 bytes */
	uint32_t magic;
	uint32_t type;
	uint32_t off, len, seed;
	uint32_t status;
};

/* Position-dependent bytes: a shifted or truncated copy never matches. */
static inline uint8_t iop_pat(uint32_t seed, uint32_t i)
{
	uint32_t x = (i + 1u) * 2654435761u ^ (seed * 0x9E3779B9u);
	x ^= x >> 15;
	x *= 0x85EBCA6Bu;
	x ^= x >> 13;
	return (uint8_t)x;
}

static inline void iop_fill(uint8_t *p, uint32_t len, uint32_t seed, uint32_t base)
{
	for (uint32_t i = 0; i < len; i++)
		p[i] = iop_pat(seed, base + i);
}

/* 0 when p[0..len) == iop_pat(seed, base + i); else 1 + the first bad offset (printed). */
static inline uint32_t iop_check(const char *what, const uint8_t *p, uint32_t len, uint32_t seed, uint32_t base)
{
	for (uint32_t i = 0; i < len; i++) {
		if (p[i] != iop_pat(seed, base + i)) {
			uint32_t s = i >= 8 ? i - 8 : 0, e = i + 8 < len ? i + 8 : len;
			fprintf(stderr, "MISMATCH %s: %u bytes, first bad byte at offset %u: got 0x%02x, expected 0x%02x\n",
				what, len, i, p[i], iop_pat(seed, base + i));
			fprintf(stderr, "  got     [%u..%u):", s, e);
			for (uint32_t k = s; k < e; k++)
				fprintf(stderr, " %02x", p[k]);
			fprintf(stderr, "\n  expected[%u..%u):", s, e);
			for (uint32_t k = s; k < e; k++)
				fprintf(stderr, " %02x", iop_pat(seed, base + k));
			fprintf(stderr, "\n");
			return i + 1;
		}
	}
	return 0;
}

static inline void iop_pdata_put(struct iop_pdata *pd, uint64_t addr, uint32_t rkey, uint32_t len)
{
	pd->magic = htobe32(IOP_MAGIC);
	pd->version = htobe32(IOP_VERSION);
	pd->addr = htobe64(addr);
	pd->rkey = htobe32(rkey);
	pd->len = htobe32(len);
}

/* NULL when buf holds a valid iop_pdata (decoded into *out, host order), else why not. */
static inline const char *iop_pdata_get(const void *buf, size_t len, struct iop_pdata *out)
{
	struct iop_pdata pd;

	if (len < sizeof pd)
		return "private data too short";
	memcpy(&pd, buf, sizeof pd);
	if (be32toh(pd.magic) != IOP_MAGIC)
		return "private data: bad magic";
	if (be32toh(pd.version) != IOP_VERSION)
		return "private data: other version";
	out->magic = IOP_MAGIC;
	out->version = IOP_VERSION;
	out->addr = be64toh(pd.addr);
	out->rkey = be32toh(pd.rkey);
	out->len = be32toh(pd.len);
	if (out->len < IOP_REGION)
		return "private data: region too small";
	return NULL;
}

static inline void iop_ctl_put(struct iop_ctl *c, uint32_t type, uint32_t off, uint32_t len, uint32_t seed,
			       uint32_t status)
{
	c->magic = htobe32(IOP_MAGIC);
	c->type = htobe32(type);
	c->off = htobe32(off);
	c->len = htobe32(len);
	c->seed = htobe32(seed);
	c->status = htobe32(status);
}

/* NULL when buf (len bytes) is a ctl of the expected type (decoded into *out), else why not. */
static inline const char *iop_ctl_get(const void *buf, uint32_t len, uint32_t type, struct iop_ctl *out)
{
	static char why[96];
	struct iop_ctl c;

	if (len != sizeof c) {
		snprintf(why, sizeof why, "control message of %u bytes (expected %zu)", len, sizeof c);
		return why;
	}
	memcpy(&c, buf, sizeof c);
	out->magic = be32toh(c.magic);
	out->type = be32toh(c.type);
	out->off = be32toh(c.off);
	out->len = be32toh(c.len);
	out->seed = be32toh(c.seed);
	out->status = be32toh(c.status);
	if (out->magic != IOP_MAGIC)
		return "control message: bad magic";
	if (out->type != type) {
		snprintf(why, sizeof why, "control message of type %u (expected %u)", out->type, type);
		return why;
	}
	return NULL;
}

/* What the transport said last when an operation failed (set by the programs' ops), so that a
 * FAIL line names the cause; empty: see stderr. */
static char iop_err[320];

static inline void iop_report(const char *op, int ok, const char *detail)
{
	printf("@@OP %s %s %s\n", op, ok ? "PASS" : "FAIL", detail ? detail : "");
	fflush(stdout);
}

/* A FAIL for an op stopped by a transport error: iop_err when set, else a pointer to stderr. */
static inline void iop_report_err(const char *op, const char *what)
{
	char d[400];

	snprintf(d, sizeof d, "%s: %s", what, iop_err[0] ? iop_err : "transport error (see stderr)");
	iop_report(op, 0, d);
}

/* ---------------------------------------------------------------- the exchange, transport-neutral
 *
 * Each program registers one arena laid out as below (one MR, all rights) and hands the driver
 * these operations; each returns 0, or -1 after printing why on stderr. Offsets are arena offsets.
 */
#define IOP_A_REGION 0u                        /* advertised region (IOP_REGION) */
#define IOP_A_SEND (IOP_A_REGION + IOP_REGION) /* IOP_NSTAGE stagings for Sends and Write sources */
#define IOP_NSTAGE 4u
#define IOP_A_READ (IOP_A_SEND + IOP_NSTAGE * IOP_RBUF) /* RDMA Read sink */
#define IOP_A_RECV (IOP_A_READ + IOP_RBUF)     /* IOP_NRECV receive buffers */
#define IOP_ARENA (IOP_A_RECV + IOP_NRECV * IOP_RBUF)

struct iop_ops {
	int (*send)(void *c, uint32_t off, uint32_t len);                 /* Send, wait for it */
	int (*write)(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey);
	int (*read)(void *c, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey);
	int (*recv)(void *c, uint32_t *off, uint32_t *len);               /* next received Send */
	int (*repost)(void *c, uint32_t off);                             /* give a buffer back */
};

/* The arena's initial contents: region lower half zero, upper half the owner's read pattern. */
static inline void iop_arena_init(uint8_t *arena, int active)
{
	memset(arena, 0, IOP_ARENA);
	iop_fill(arena + IOP_HALF, IOP_HALF, active ? IOP_SEED_READ_A : IOP_SEED_READ_P, IOP_HALF);
}

/* The next staging buffer for a Send or a Write source, in turn: a Send's completion does not
 * mean its bytes have left (siw sends pages zero-copy: TCP reads them when it transmits, and
 * the CRC was computed before), so a buffer is written again only after the IOP_NSTAGE - 1
 * Sends after it (the echo that reused one buffer reached the other side with a bad CRC). */
static inline uint32_t iop_stage(void)
{
	static uint32_t n;
	return IOP_A_SEND + (n++ % IOP_NSTAGE) * IOP_RBUF;
}

static inline int iop_send_ctl(const struct iop_ops *o, void *c, uint8_t *arena, uint32_t type, uint32_t off,
			       uint32_t len, uint32_t seed, uint32_t status)
{
	uint32_t s = iop_stage();
	iop_ctl_put((struct iop_ctl *)(void *)(arena + s), type, off, len, seed, status);
	return o->send(c, s, sizeof(struct iop_ctl));
}

static inline int iop_recv_ctl(const struct iop_ops *o, void *c, uint8_t *arena, uint32_t type, struct iop_ctl *out)
{
	uint32_t off, len;
	const char *why;

	if (o->recv(c, &off, &len))
		return -1;
	why = iop_ctl_get(arena + off, len, type, out);
	if (o->repost(c, off))
		return -1;
	if (why) {
		fprintf(stderr, "protocol: %s\n", why);
		return -1;
	}
	return 0;
}

/* Runs steps 0-4 of the protocol; returns the number of failed ops (>= 1 when it stopped early). */
static inline int iop_run(const struct iop_ops *o, void *c, uint8_t *arena, int active, const struct iop_pdata *peer)
{
	uint8_t *region = arena + IOP_A_REGION, *rdbuf = arena + IOP_A_READ;
	uint32_t s;
	struct iop_ctl ctl;
	char d[200];
	int fails = 0;
	uint32_t bad = 0, off, len;

	/* 0: READY */
	if (active ? iop_send_ctl(o, c, arena, IOP_READY, 0, 0, 0, 0)
		   : iop_recv_ctl(o, c, arena, IOP_READY, &ctl)) {
		iop_report_err("send_echo", "READY not exchanged");
		return 1;
	}
	/* 1: Send and echo */
	for (size_t k = 0; k < IOP_N(IOP_SEND_SIZES); k++) {
		uint32_t sz = IOP_SEND_SIZES[k], seed = IOP_SEED_SEND + (uint32_t)k;

		snprintf(d, sizeof d, "%s Send #%zu (%u bytes)", active ? "echo of" : "received", k, sz);
		if (active) {
			s = iop_stage();
			iop_fill(arena + s, sz, seed, 0);
			if (o->send(c, s, sz) || o->recv(c, &off, &len))
				goto stop_send;
		} else {
			if (o->recv(c, &off, &len))
				goto stop_send;
		}
		if (len != sz) {
			fprintf(stderr, "MISMATCH %s: length %u, expected %u\n", d, len, sz);
			bad = 1;
		} else if (iop_check(d, arena + off, len, seed, 0))
			bad = 1;
		if (!active) {
			s = iop_stage();
			memcpy(arena + s, arena + off, len); /* echo exactly what arrived */
			if (o->repost(c, off) || o->send(c, s, len))
				goto stop_send;
		} else if (o->repost(c, off))
			goto stop_send;
	}
	snprintf(d, sizeof d, "%zu Sends of 1..100000 bytes %s, byte-exact", IOP_N(IOP_SEND_SIZES),
		 active ? "sent and their echoes checked" : "checked and echoed");
	iop_report("send_echo", !bad, bad ? "byte mismatch (see stderr)" : d);
	fails += !!bad;

	/* 2 and 3: the active side on the passive side's region, then the other way round */
	for (int phase = 0; phase < 2; phase++) {
		int actor = (phase == 0) == !!active;
		const char *wop = phase == 0 ? "write_by_active" : "write_by_passive";
		const char *rop = phase == 0 ? "read_by_active" : "read_by_passive";
		uint32_t wseed = phase == 0 ? IOP_SEED_WRITE_A : IOP_SEED_WRITE_P;
		uint32_t rseed = phase == 0 ? IOP_SEED_READ_P : IOP_SEED_READ_A;
		uint32_t wbad = 0, rbad = 0;

		if (actor) {
			for (size_t k = 0; k < IOP_N(IOP_WRITES); k++) {
				s = iop_stage();
				iop_fill(arena + s, IOP_WRITES[k].len, wseed + (uint32_t)k, 0);
				if (o->write(c, s, IOP_WRITES[k].len, peer->addr + IOP_WRITES[k].off, peer->rkey) ||
				    iop_send_ctl(o, c, arena, IOP_WROTE, IOP_WRITES[k].off, IOP_WRITES[k].len,
						 wseed + (uint32_t)k, 0) ||
				    iop_recv_ctl(o, c, arena, IOP_ACK, &ctl)) {
					iop_report_err(wop, "RDMA Write or its control messages");
					return fails + 1;
				}
				if (ctl.status && !wbad) {
					fprintf(stderr, "MISMATCH: the target found RDMA Write #%zu (%u bytes at +%u) wrong "
						"at byte %u\n", k, IOP_WRITES[k].len, IOP_WRITES[k].off, ctl.status - 1);
					wbad = 1;
				}
			}
			snprintf(d, sizeof d, "%zu RDMA Writes (1..100000 bytes) confirmed byte-exact by the target",
				 IOP_N(IOP_WRITES));
			iop_report(wop, !wbad, wbad ? "the target saw wrong bytes (see stderr)" : d);
			fails += !!wbad;
			for (size_t k = 0; k < IOP_N(IOP_READS) + IOP_N(IOP_WRITES); k++) {
				int back = k >= IOP_N(IOP_READS);
				const struct iop_range *r = back ? &IOP_WRITES[k - IOP_N(IOP_READS)] : &IOP_READS[k];
				uint32_t seed = back ? wseed + (uint32_t)(k - IOP_N(IOP_READS)) : rseed;
				uint32_t base = back ? 0 : IOP_HALF + r->off;
				uint64_t ra = peer->addr + (back ? r->off : IOP_HALF + r->off);

				for (uint32_t i = 0; i < r->len; i++) /* the sink starts out wrong everywhere */
					rdbuf[i] = (uint8_t)~iop_pat(seed, base + i);
				if (o->read(c, IOP_A_READ, r->len, ra, peer->rkey)) {
					iop_report_err(rop, "RDMA Read");
					return fails + 1;
				}
				snprintf(d, sizeof d, "RDMA Read %s (%u bytes at +%u)", back ? "back of a Write" : "",
					 r->len, (uint32_t)(ra - peer->addr));
				if (!rbad)
					rbad = iop_check(d, rdbuf, r->len, seed, base);
			}
			if (iop_send_ctl(o, c, arena, IOP_READ_RESULT, 0, 0, 0, rbad)) {
				iop_report_err(rop, "sending READ_RESULT");
				return fails + 1;
			}
			snprintf(d, sizeof d, "%zu RDMA Reads (1..100000 bytes) + read-back of the Writes, byte-exact",
				 IOP_N(IOP_READS));
			iop_report(rop, !rbad, rbad ? "byte mismatch (see stderr)" : d);
			fails += !!rbad;
		} else {
			for (size_t k = 0; k < IOP_N(IOP_WRITES); k++) {
				uint32_t st;

				if (iop_recv_ctl(o, c, arena, IOP_WROTE, &ctl)) {
					iop_report_err(wop, "waiting for WROTE");
					return fails + 1;
				}
				if (ctl.off != IOP_WRITES[k].off || ctl.len != IOP_WRITES[k].len ||
				    ctl.seed != wseed + (uint32_t)k) {
					fprintf(stderr, "protocol: WROTE %u@%u seed %u, expected %u@%u seed %u\n", ctl.len,
						ctl.off, ctl.seed, IOP_WRITES[k].len, IOP_WRITES[k].off, wseed + (uint32_t)k);
					iop_report(wop, 0, "protocol error");
					return fails + 1;
				}
				snprintf(d, sizeof d, "RDMA Write #%zu placed here (%u bytes at +%u)", k, ctl.len, ctl.off);
				st = iop_check(d, region + ctl.off, ctl.len, ctl.seed, 0);
				if (!st && ctl.off + ctl.len < IOP_HALF && region[ctl.off + ctl.len] != 0) {
					fprintf(stderr, "MISMATCH %s: the byte after it changed (0x%02x)\n", d,
						region[ctl.off + ctl.len]);
					st = ctl.len + 1;
				}
				if (st)
					wbad = 1;
				if (iop_send_ctl(o, c, arena, IOP_ACK, ctl.off, ctl.len, ctl.seed, st)) {
					iop_report_err(wop, "sending ACK");
					return fails + 1;
				}
			}
			snprintf(d, sizeof d, "%zu RDMA Writes into this side's region checked byte-exact (and the byte after)",
				 IOP_N(IOP_WRITES));
			iop_report(wop, !wbad, wbad ? "byte mismatch in this side's region (see stderr)" : d);
			fails += !!wbad;
			if (iop_recv_ctl(o, c, arena, IOP_READ_RESULT, &ctl)) {
				iop_report_err(rop, "waiting for READ_RESULT");
				return fails + 1;
			}
			snprintf(d, sizeof d, "the reader reports %s", ctl.status ? "a mismatch" : "every byte of its Reads of this side's region matched");
			iop_report(rop, !ctl.status, d);
			fails += !!ctl.status;
		}
	}
	/* 4: BYE */
	if (active ? iop_send_ctl(o, c, arena, IOP_BYE, 0, 0, 0, 0) || iop_recv_ctl(o, c, arena, IOP_BYE, &ctl)
		   : iop_recv_ctl(o, c, arena, IOP_BYE, &ctl) || iop_send_ctl(o, c, arena, IOP_BYE, 0, 0, 0, 0)) {
		fprintf(stderr, "BYE not exchanged\n");
		return fails + 1;
	}
	return fails;
stop_send:
	iop_report_err("send_echo", "Send or Receive");
	return fails + 1;
}

#endif
