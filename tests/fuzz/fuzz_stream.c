/*
 * fuzz_stream.c - the shim's stream protocol messages (shim/stream.h), through the decoders
 * of shim/stream_wire.c: the hello in MPA private data, the device hello with its cookie, the
 * server's rendezvous on TCP, control records in the control slots, and the sequence of data
 * records into the receive ring.
 *
 * Input: a selector byte, then
 *   0  private data: hello and device hello; an accepted one must re-encode to its bytes
 *   1  sent64 recs64 base-offset32 length32 then the control slots' bytes (64 slots, the rest
 *      zero): an accepted record is one whole slot inside the slots and acknowledges nothing
 *      unsent
 *   2  a rendezvous message
 *   3  a ring-size byte, then records [kind][length32][extra32]: kind bit 0 places the record
 *      where the stream stands (else at base + extra), bit 1 consumes extra bytes first,
 *      bit 2 is the peer's FIN at arrived + extra. The harness keeps arrived and consumed as
 *      stream.c does; every accepted record must lie inside the ring, within the credit, and
 *      before the peer's end of stream.
 */
#include <endian.h>
#include <errno.h>

#include "fuzz.h"
#include "stream.h"
#include "stream_wire.h"

static void hello(const uint8_t *d, size_t n)
{
	uint8_t *pd = malloc(n ? n : 1);
	memcpy(pd, d, n);
	struct stream_peer p;
	if (stream_hello_decode(pd, n, &p) == 0) {
		FUZZ_CHECK(n >= sizeof(struct stream_hello));
		FUZZ_CHECK(p.ring >= STREAM_WIRE_RING_MIN && p.ring <= STREAM_WIRE_RING_MAX && !(p.ring & (p.ring - 1)));
		FUZZ_CHECK(p.slots >= 1 && p.slots <= STREAM_WIRE_SLOTS_MAX && p.max_recs >= 1);
		struct stream_hello h = {htobe32(STREAM_MAGIC), htobe32(p.ring), htobe32(p.stag), htobe32(p.slots),
					 htobe64(p.ring_addr), htobe64(p.ctl_addr), htobe32(p.max_recs), 0};
		/* everything but the reserved word is what the peer sent */
		FUZZ_CHECK(memcmp(&h, pd, offsetof(struct stream_hello, rsvd)) == 0);
	}
	uint64_t cookie;
	if (stream_dhello_decode(pd, n, &p, &cookie) == 0) {
		FUZZ_CHECK(n >= sizeof(struct stream_dhello));
		FUZZ_CHECK(memcmp(&cookie, pd + offsetof(struct stream_dhello, cookie), 8) == 0);
		FUZZ_CHECK(stream_hello_decode(pd, n, &p) == 0);
	}
	free(pd);
}

static void ctl(struct fz *f)
{
	enum { NSLOTS = 64 };
	uint64_t sent = (uint64_t)fz_u32(f) << 32 | fz_u32(f);
	uint64_t recs = (uint64_t)fz_u32(f) << 32 | fz_u32(f);
	uint64_t ctl_base = 0x7f0000100000ull;
	uint64_t base = ctl_base + (uint64_t)(int64_t)(int32_t)fz_u32(f);
	uint32_t length = fz_u32(f);
	/* exactly the slots' size: ASan sees a read outside them */
	uint8_t *slots = calloc(NSLOTS, STREAM_WIRE_SLOT_SZ);
	size_t n;
	const uint8_t *b = fz_bytes(f, NSLOTS * STREAM_WIRE_SLOT_SZ, &n);
	memcpy(slots, b, n);
	struct stream_ctl_msg m;
	if (stream_ctl_decode(base, length, ctl_base, NSLOTS, slots, sent, recs, &m) == 0) {
		FUZZ_CHECK(base >= ctl_base && base + length <= ctl_base + NSLOTS * STREAM_WIRE_SLOT_SZ);
		FUZZ_CHECK((base - ctl_base) % STREAM_WIRE_SLOT_SZ == 0 && length == sizeof(struct stream_ctl));
		FUZZ_CHECK(m.consumed <= sent && m.recs <= recs);
	}
	free(slots);
}

static void rv(const uint8_t *d, size_t n)
{
	uint8_t *b = malloc(n ? n : 1);
	memcpy(b, d, n);
	struct stream_rendezvous r;
	if (stream_rv_decode(b, n, &r) == 0) {
		FUZZ_CHECK(n == sizeof(struct stream_rv));
		FUZZ_CHECK(r.family == 0 || r.family == 4 || r.family == 6);
		FUZZ_CHECK(r.port != 0 || (r.family == 0 && r.cookie == 0)); /* "stay plain" */
	}
	free(b);
}

static void data(struct fz *f)
{
	uint32_t ring = STREAM_WIRE_RING_MIN << (fz_u8(f) % 4);
	uint64_t ring_base = 0x7f0000000000ull, arrived = 0, consumed = 0, fin_total = 0;
	bool peer_fin = false;
	for (unsigned steps = 0; fz_more(f) && steps < 256; steps++) {
		uint8_t kind = fz_u8(f);
		uint32_t length = fz_u32(f), extra = fz_u32(f);
		if ((kind & 2) && extra <= arrived - consumed)
			consumed += extra;
		if ((kind & 4) && !peer_fin) {
			peer_fin = true;
			fin_total = arrived + extra;
		}
		uint64_t base = kind & 1 ? ring_base + (arrived & (ring - 1)) : ring_base + extra;
		if (stream_data_check(base, length, ring_base, ring, arrived, consumed, peer_fin, fin_total))
			continue;
		FUZZ_CHECK(base >= ring_base && base + length <= ring_base + ring);
		FUZZ_CHECK(arrived + length - consumed <= ring);
		FUZZ_CHECK(!peer_fin || arrived + length <= fin_total);
		arrived += length;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
	struct fz f = {d, size};
	switch (fz_u8(&f) & 3) {
	case 0:
		hello(f.p, f.n);
		break;
	case 1:
		ctl(&f);
		break;
	case 2:
		rv(f.p, f.n);
		break;
	default:
		data(&f);
		break;
	}
	return 0;
}
