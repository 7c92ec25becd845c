/*
 * stream_wire.c - the stream protocol's messages decoded from bytes (stream_wire.h). The
 * structures are wire.h's (struct stream_hello, stream_dhello, stream_rv, stream_ctl), the same
 * ones stream.c encodes, so the layouts cannot drift apart; only the checks live here.
 */
#include "stream_wire.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#include "wire.h"

_Static_assert(sizeof(struct stream_ctl) <= STREAM_WIRE_SLOT_SZ, "a control message fits a slot");

int stream_hello_decode(const void *pd, size_t len, struct stream_peer *out)
{
	struct stream_hello h;
	if (!pd || len < sizeof h)
		return -EPROTO;
	memcpy(&h, pd, sizeof h);
	uint32_t ring = be32toh(h.ring_size), slots = be32toh(h.ctl_slots), recs = be32toh(h.max_recs);
	if (be32toh(h.magic) != STREAM_MAGIC || ring < STREAM_WIRE_RING_MIN || ring > STREAM_WIRE_RING_MAX ||
	    (ring & (ring - 1)) || !slots || slots > STREAM_WIRE_SLOTS_MAX || !recs)
		return -EPROTO;
	out->ring = ring;
	out->slots = slots;
	out->max_recs = recs;
	out->stag = be32toh(h.ring_stag);
	out->ring_addr = be64toh(h.ring_addr);
	out->ctl_addr = be64toh(h.ctl_addr);
	return 0;
}

int stream_dhello_decode(const void *pd, size_t len, struct stream_peer *out, uint64_t *cookie)
{
	struct stream_dhello d;
	if (!pd || len < sizeof d)
		return -EPROTO;
	memcpy(&d, pd, sizeof d);
	*cookie = d.cookie;
	return stream_hello_decode(&d.h, sizeof d.h, out);
}

int stream_rv_decode(const void *buf, size_t len, struct stream_rendezvous *out)
{
	struct stream_rv rv;
	if (!buf || len != sizeof rv)
		return -EPROTO;
	memcpy(&rv, buf, sizeof rv);
	uint16_t fam = be16toh(rv.family), port = be16toh(rv.port);
	if (be32toh(rv.magic) != STREAM_RV_MAGIC || (fam != 0 && fam != 4 && fam != 6))
		return -EPROTO;
	static const uint8_t zero[sizeof rv.addr];
	if (!port && (fam || rv.cookie || memcmp(rv.addr, zero, sizeof zero)))
		return -EPROTO; /* "stay plain" names nothing */
	out->family = fam;
	out->port = port;
	memcpy(out->addr, rv.addr, sizeof out->addr);
	out->cookie = rv.cookie;
	return 0;
}

int stream_ctl_decode(uint64_t base, uint32_t length, uint64_t ctl_base, uint32_t nslots,
		      const uint8_t *slots, uint64_t sent, uint64_t recs_sent, struct stream_ctl_msg *out)
{
	uint64_t off = base - ctl_base; /* below ctl_base wraps to far beyond the slots */
	if (length != sizeof(struct stream_ctl) || off % STREAM_WIRE_SLOT_SZ ||
	    off >= (uint64_t)nslots * STREAM_WIRE_SLOT_SZ)
		return -EPROTO;
	struct stream_ctl c;
	memcpy(&c, slots + off, sizeof c);
	out->consumed = be64toh(c.consumed);
	out->recs = be64toh(c.recs);
	out->fin_total = be64toh(c.fin_total);
	out->flags = be32toh(c.flags);
	out->seq = be32toh(c.seq);
	if (out->consumed > sent || out->recs > recs_sent)
		return -EPROTO;
	return 0;
}

int stream_data_check(uint64_t base, uint32_t length, uint64_t ring_base, uint32_t ring, uint64_t arrived,
		      uint64_t consumed, bool peer_fin, uint64_t fin_total)
{
	uint64_t at = arrived & (ring - 1);
	if (base != ring_base + at || length > ring - (arrived - consumed) || length > ring - at ||
	    (peer_fin && arrived + length > fin_total))
		return -EPROTO;
	return 0;
}
