/*
 * stream_wire.h - decoding the stream protocol's messages (stream.h: struct stream_hello,
 * stream_dhello, stream_rv, stream_ctl, and the data records of the receive ring) as pure
 * functions of their bytes and the receiver's counters, so that they can be fuzzed
 * (tests/fuzz/fuzz_stream.c) apart from the connection state of stream.c.
 *
 * Each function applies the checks stream.c applies at the same point (hello_take, take_ctl,
 * take_data, rv_step, rv_request), plus one: a data record must end inside the ring
 * (stream_data_check). All return 0 or -EPROTO; nothing logs, nothing allocates.
 */
#ifndef DGSHIM_STREAM_WIRE_H
#define DGSHIM_STREAM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STREAM_WIRE_RING_MIN (16u << 10)
#define STREAM_WIRE_RING_MAX (64u << 20)
#define STREAM_WIRE_SLOTS_MAX 4096u
#define STREAM_WIRE_SLOT_SZ 64u

/* The peer's receive ring and control slots, from its hello (host order). */
struct stream_peer {
	uint32_t ring, slots, max_recs, stag;
	uint64_t ring_addr, ctl_addr;
};

/* A hello in MPA private data (len bytes; more is allowed, as stream.c allows). */
int stream_hello_decode(const void *pd, size_t len, struct stream_peer *out);
/* A device hello (hello + cookie, the cookie as sent: compared, never converted). */
int stream_dhello_decode(const void *pd, size_t len, struct stream_peer *out, uint64_t *cookie);

/* The server's rendezvous: exactly sizeof(struct stream_rv) bytes. family is 0 (the address
 * TCP went to), 4 or 6. port 0 is "stay plain" (the server cannot carry the connection; TCP
 * does), valid only with family 0 and nothing else set. Returns 0 or -EPROTO. */
struct stream_rendezvous {
	uint16_t family, port;
	uint8_t addr[16];
	uint64_t cookie; /* as sent */
};
int stream_rv_decode(const void *buf, size_t len, struct stream_rendezvous *out);

/* A control message (host order). */
struct stream_ctl_msg {
	uint64_t consumed, recs, fin_total;
	uint32_t flags, seq;
};
/*
 * A control record: length bytes at tagged offset base into our nslots control slots of
 * STREAM_WIRE_SLOT_SZ bytes each, which start at tagged offset ctl_base and whose bytes are
 * at slots. It must fill the start of one slot with exactly one struct stream_ctl, and
 * acknowledge no more bytes than we sent (sent) nor records than we wrote (recs_sent).
 */
int stream_ctl_decode(uint64_t base, uint32_t length, uint64_t ctl_base, uint32_t nslots,
		      const uint8_t *slots, uint64_t sent, uint64_t recs_sent, struct stream_ctl_msg *out);

/*
 * A data record: length bytes at tagged offset base into our ring of ring bytes (a power of
 * two) at ring_base, after arrived bytes of which the program consumed consumed; peer_fin
 * and fin_total when the peer said its stream ends. It must continue the stream where it
 * stands, fit the credit given, end inside the ring (the sender cuts records at the ring's
 * end; one crossing it was placed beyond the ring), and not pass the peer's end of stream.
 */
int stream_data_check(uint64_t base, uint32_t length, uint64_t ring_base, uint32_t ring, uint64_t arrived,
		      uint64_t consumed, bool peer_fin, uint64_t fin_total);

#endif
