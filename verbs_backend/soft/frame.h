/*
 * frame.h - encode and validate datagram-iWARP DDP/RDMAP segments (wire.h layouts).
 * Pure functions, no state: safe from any thread.
 */
#ifndef DG_FRAME_H
#define DG_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* Smallest segsz accepted for a message that spans several datagrams: bounds the validity
 * bitmap of a 16 MiB message to 8 KiB. */
#define DG_MIN_SEGSZ 256u

/* A parsed segment, host order. */
struct dg_seg {
	uint8_t opcode; /* enum rdmap_opcode */
	bool tagged;
	bool last;
	uint32_t stag;     /* tagged */
	uint64_t to;       /* tagged */
	uint32_t inv_stag; /* untagged */
	uint32_t qn;       /* untagged */
	uint32_t msn;
	uint32_t mo;
	uint32_t ml;
	uint16_t segsz;
	const uint8_t *hdr; /* start of the segment (for copying into a Terminate) */
	uint32_t hlen;
	const uint8_t *payload;
	uint32_t plen;
};

/* Why a segment was refused: an RFC 5040/5041 error triple and a short text for the log. */
struct dg_reject {
	uint8_t layer, etype, ecode;
	const char *reason;
};

/*
 * Validates one segment (starting at the DDP header, without RD header or CRC) of len bytes.
 * Checks, in order: length covers the header; DDP version 1, RDMAP version 1, reserved bits zero;
 * opcode known and matching the T bit (Write, Write-Record, Read Response tagged; others
 * untagged) and the QN (Sends 0, Read Request 1, Terminate 2); ml <= max_msg; mo + plen <= ml;
 * single-segment (mo == 0 && plen == ml) or segsz >= DG_MIN_SEGSZ, mo % segsz == 0 and
 * plen == segsz unless L; L set iff mo + plen == ml; tagged: to - mo does not wrap;
 * Read Request payload exactly 28 bytes and single-segment; Terminate payload >= 8 bytes.
 * Returns 0 and fills *seg, or -EPROTO and fills *why.
 */
int dg_seg_parse(const uint8_t *buf, size_t len, uint32_t max_msg, struct dg_seg *seg,
		 struct dg_reject *why);

/* Fill a header in network order. */
void dg_put_tagged(struct dg_tagged_hdr *h, uint8_t opcode, bool last, uint32_t stag, uint64_t to,
		   uint32_t msn, uint32_t mo, uint32_t ml, uint16_t segsz);
void dg_put_untagged(struct dg_untagged_hdr *h, uint8_t opcode, bool last, uint32_t qn,
		     uint32_t msn, uint32_t mo, uint32_t ml, uint16_t segsz, uint32_t inv_stag);
void dg_put_read_req(struct rdmap_read_req *r, uint32_t sink_stag, uint64_t sink_to,
		     uint32_t size, uint32_t src_stag, uint64_t src_to);

/*
 * UDP GSO/GRO: several datagrams laid back to back in one buffer, each gso bytes except a last
 * that may be shorter (the layout of a UDP_SEGMENT send and of a UDP_GRO receive).
 * DG_GSO_MAX_SEGS is the kernel's smallest UDP_MAX_SEGMENTS (64; 128 from Linux 6.x on);
 * DG_GSO_MAX_BYTES the most UDP payload one send may carry (65535 less the IPv4 and UDP
 * headers), which bounds a train whatever the segment count.
 */
#define DG_GSO_MAX_SEGS 64u
#define DG_GSO_MAX_BYTES 65507u

/* One datagram of a coalesced buffer. */
struct dg_gso_piece {
	uint8_t *buf;
	uint32_t len;
};

/*
 * Cuts a coalesced receive of len bytes at buf into its datagrams of gso bytes (the last
 * len % gso when not zero) and writes them to out[0..max). truncated: the kernel cut the
 * buffer (MSG_TRUNC), so its last datagram is not whole.
 * Returns the count (>= 1), or -EINVAL when gso is 0, len is 0, gso > len, truncated is set,
 * or more than max pieces would be needed; out is then untouched. Reads no byte of buf.
 */
int dg_gso_split(uint8_t *buf, size_t len, size_t gso, bool truncated, struct dg_gso_piece *out,
		 uint32_t max);

/* How many datagrams of dgram bytes one UDP_SEGMENT send may carry (0 or 1: GSO gains
 * nothing for that size). */
uint32_t dg_gso_max_segs(uint32_t dgram);

/* Human-readable name of an opcode ("SEND", "WRITE_RECORD", ... or "UNKNOWN"). */
const char *dg_opcode_name(unsigned opcode);

#endif
