/*
 * mpa.h - MPA framing (RFC 5044, RFC 6581) and the standard DDP headers of RC (RFC 5041):
 * pure functions on buffers, no state, safe from any thread. rc_tx.c and rc_rx.c use them on the stream and
 * tests/unit/test_mpa.c checks them against the worked example of docs/wire.md section 12.
 */
#ifndef DG_MPA_H
#define DG_MPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* A parsed MPA Request or Reply (host order). */
struct mpa_rr {
	bool req;          /* Request (key "MPA ID Req Frame") or Reply */
	uint8_t flags;     /* MPA_FLAG_* as received */
	uint8_t rev;
	bool enhanced;     /* rev 2 with E: ird/ord below are valid */
	uint16_t ird, ord; /* the raw RFC 6581 words (control bits included) */
	uint16_t pd_len;   /* the application's private data (the v2 word not counted) */
	const uint8_t *pdata;
};

/* Bytes of a frame header plus private data at most (rev 2 word included). */
#define MPA_RR_MAX (MPA_RR_HLEN + MPA_V2_LEN + MPA_MAX_PDATA)

/* Writes a Request (req) or Reply frame into out (MPA_RR_MAX bytes). v2 != NULL sets E and
 * puts the word in front of the private data. Returns the frame length. */
size_t mpa_rr_build(uint8_t *out, bool req, uint8_t flags, uint8_t rev, const struct mpa_v2_word *v2,
		    const void *pdata, uint16_t len);

/* Checks the 20-byte header in buf: key (req or reply), revision 1 or 2, private data length
 * (<= 512, or 516 with E). Returns the whole frame's length (> 0) or -EPROTO with *why set. */
int mpa_rr_check_hdr(const uint8_t *buf, bool req, const char **why);

/* Parses a whole frame of len bytes (len as returned by mpa_rr_check_hdr). Returns 0 or -EPROTO
 * with *why (E set but fewer than 4 bytes of private data). out->pdata points into buf. */
int mpa_rr_parse(const uint8_t *buf, size_t len, bool req, struct mpa_rr *out, const char **why);

/* Pad bytes after a ULPDU of ulpdu_len bytes so that the FPDU is a multiple of 4. */
static inline uint32_t mpa_pad(uint32_t ulpdu_len) { return (4u - ((ulpdu_len + MPA_HDR_LEN) & 3u)) & 3u; }
/* FPDU length without markers: length field, ULPDU, pad, CRC. */
static inline uint32_t mpa_fpdu_len(uint32_t ulpdu_len)
{
	return MPA_HDR_LEN + ulpdu_len + mpa_pad(ulpdu_len) + MPA_CRC_LEN;
}

/* Largest ULPDU for an effective MSS (RFC 5044 section 8: an FPDU fits one TCP segment), capped
 * by the 16-bit length field; ULPDU + 2 is a multiple of 4, so such an FPDU needs no pad. */
uint32_t mpa_mulpdu(uint32_t emss, bool markers);

/* Marker positions (multiples of 512) in the stream interval [pos, pos + len). */
uint64_t mpa_markers_in(uint64_t pos, uint64_t len);
/* Length on the wire of an FPDU of flen bytes (without markers) that starts at stream position
 * pos of a marked stream. */
uint32_t mpa_raw_len(uint64_t pos, uint32_t flen);

/* The MPA CRC field: CRC32c stored least significant byte first (as iSCSI and Linux siw). */
static inline void mpa_crc_put(uint8_t *p, uint32_t crc)
{
	p[0] = (uint8_t)crc;
	p[1] = (uint8_t)(crc >> 8);
	p[2] = (uint8_t)(crc >> 16);
	p[3] = (uint8_t)(crc >> 24);
}
static inline uint32_t mpa_crc_get(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Builds a whole FPDU around ulpdu (DDP header + payload, len bytes) into out: length, ULPDU,
 * pad, CRC (crc: computed, else zero), with markers when pos_markers >= 0 (the FPDU starts at
 * that stream position). out needs mpa_raw_len() bytes. Returns the bytes written. */
size_t mpa_fpdu_build(uint8_t *out, const void *ulpdu, uint16_t len, bool crc, int64_t pos_markers);

/* Copies the FPDU of rawlen bytes at raw (starting at stream position pos of a marked stream)
 * to dst without its markers, checking each marker (reserved zero, FPDUPTR). Returns the
 * length copied or -EPROTO. */
int mpa_strip_markers(uint8_t *dst, const uint8_t *raw, uint32_t rawlen, uint64_t pos);

/* Standard DDP/RDMAP headers (RFC 5041 4.2/4.3), written in network order. */
void rc_put_tagged(struct ddp_tagged_hdr *h, uint8_t opcode, bool last, uint32_t stag, uint64_t to);
void rc_put_untagged(struct ddp_untagged_hdr *h, uint8_t opcode, bool last, uint32_t qn, uint32_t msn,
		     uint32_t mo, uint32_t inv_stag);

#endif
