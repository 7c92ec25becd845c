/*
 * wire.h - every byte datagram-iWARP puts on the wire, in one place.
 *
 * All multi-byte fields are big-endian (the be16/be32/be64 types are a reminder: convert with
 * be16toh & co. before use). Structures are packed and their sizes are checked at compile time.
 * docs/wire.md explains each field with a worked hex example that tests/unit/test_frame.c checks.
 *
 * A datagram of a UD QP:   [DDP/RDMAP datagram header][payload][CRC32c]
 * A datagram of an RD QP:  [RD header][DDP/RDMAP datagram header][payload][CRC32c]
 * An RD acknowledgement:   [RD header][CRC32c]
 * There is no MPA layer (paper 003 III.G): each DDP segment is exactly one UDP datagram.
 */
#ifndef DG_WIRE_H
#define DG_WIRE_H

#include <stdint.h>

typedef uint16_t be16;
typedef uint32_t be32;
typedef uint64_t be64;

/* ------------------------------------------------------------------------------------------
 * DDP/RDMAP control field (16 bits, host order after be16toh).
 * RFC 5041 section 4.2/4.3: T (tagged), L (last), 4 reserved bits, DV (DDP version, 1).
 * RFC 5040 section 4.2: RV (RDMAP version, 1), 2 reserved bits, Opcode (4 bits).
 */
enum {
	DDP_CTRL_TAGGED = 0x8000,
	DDP_CTRL_LAST = 0x4000,
	DDP_CTRL_RSVD = 0x3c00,
	DDP_CTRL_DV_MASK = 0x0300,
	DDP_CTRL_DV_1 = 0x0100,
	RDMAP_CTRL_RV_MASK = 0x00c0,
	RDMAP_CTRL_RV_1 = 0x0040,
	RDMAP_CTRL_RSVD = 0x0030,
	RDMAP_CTRL_OPCODE = 0x000f,
};

/* RFC 5040 section 4.3 opcodes; 0x8 is datagram-iWARP's RDMA Write-Record (paper 000 IV.B.3). */
enum rdmap_opcode {
	RDMAP_WRITE = 0x0,
	RDMAP_READ_REQ = 0x1,
	RDMAP_READ_RESP = 0x2,
	RDMAP_SEND = 0x3,
	RDMAP_SEND_INV = 0x4,
	RDMAP_SEND_SE = 0x5,
	RDMAP_SEND_SE_INV = 0x6,
	RDMAP_TERMINATE = 0x7,
	RDMAP_WRITE_RECORD = 0x8,
	RDMAP_OPCODE_MAX = 0x8,
};

/* RFC 5040 section 5.1 / RFC 5041 section 5: untagged queue numbers. */
enum ddp_qn {
	DDP_QN_SEND = 0,
	DDP_QN_READ_REQ = 1,
	DDP_QN_TERMINATE = 2,
};

/*
 * Tagged datagram header (30 bytes): RDMA Write, RDMA Write-Record, RDMA Read Response.
 * The first 14 bytes are the RFC 5041 section 4.2 tagged header. The last 16 bytes are the
 * datagram extension (our design, docs/wire.md "datagram extension"): because a message may span
 * several datagrams that arrive out of order or not at all, every segment says which message it
 * belongs to, where it sits in it, and how the sender cut it, so the target can keep a validity
 * map without per-peer state.
 */
struct dg_tagged_hdr {
	be16 ctrl;  /* RFC 5041 4.2 + RFC 5040 4.2: T=1, L, DV=1, RV=1, opcode */
	be32 stag;  /* RFC 5041 4.2: data sink STag */
	be64 to;    /* RFC 5041 4.2: data sink tagged offset of this segment's first byte */
	be32 msn;   /* ext: message sequence number (Read Response: the Read Request's MSN) */
	be32 mo;    /* ext: offset of this segment in the message; to - mo is the message base */
	be32 ml;    /* ext: total message length in bytes */
	be16 segsz; /* ext: payload bytes of every segment but the last (mo is a multiple of it) */
	be16 rsvd;  /* ext: zero */
} __attribute__((packed));

/*
 * Untagged datagram header (26 bytes): Send variants, RDMA Read Request, Terminate.
 * The first 18 bytes are the RFC 5041 section 4.3 untagged header (with the RFC 5040 section
 * 4.2 Invalidate STag in the RsvdULP field); the last 8 bytes are the datagram extension.
 */
struct dg_untagged_hdr {
	be16 ctrl;     /* RFC 5041 4.3 + RFC 5040 4.2: T=0, L, DV=1, RV=1, opcode */
	be32 inv_stag; /* RFC 5040 4.2: STag to invalidate (Send with Invalidate), else 0 */
	be32 qn;       /* RFC 5041 4.3: queue number (enum ddp_qn) */
	be32 msn;      /* RFC 5041 4.3: message sequence number on that queue */
	be32 mo;       /* RFC 5041 4.3: message offset of this segment's first byte */
	be32 ml;       /* ext: total message length in bytes */
	be16 segsz;    /* ext: payload bytes of every segment but the last */
	be16 rsvd;     /* ext: zero */
} __attribute__((packed));

/* RFC 5040 section 4.4: RDMA Read Request header, the payload of an untagged QN=1 message. */
struct rdmap_read_req {
	be32 sink_stag;
	be64 sink_to;
	be32 read_size;
	be32 src_stag;
	be64 src_to;
} __attribute__((packed));

/*
 * RFC 5040 section 4.8: Terminate header, the payload of an untagged QN=2 message. In
 * datagram-iWARP it does not tear anything down: it tells the source which message failed
 * (paper 003 III.C "error message identifying the erroneous message number").
 * term_ctrl: layer (4 bits) | etype (4) | ecode (8) | M (1) | D (1) | R (1) | reserved (13).
 * When D is set, the offending datagram header (tagged or untagged, by its T bit) follows
 * ddp_seg_len and pad; when R is set (Read Request), its rdmap_read_req follows that.
 */
struct rdmap_terminate {
	be32 term_ctrl;
	be16 ddp_seg_len; /* RFC 5040 4.8: length of the terminated segment (valid with M) */
	be16 pad;         /* keeps the copied header 4-byte aligned; zero */
} __attribute__((packed));

enum {
	TERM_HDRCT_M = 1u << 15,
	TERM_HDRCT_D = 1u << 14,
	TERM_HDRCT_R = 1u << 13,
};

static inline uint32_t term_ctrl_make(unsigned layer, unsigned etype, unsigned ecode, unsigned hdrct)
{
	return (layer & 0xfu) << 28 | (etype & 0xfu) << 24 | (ecode & 0xffu) << 16 | (hdrct & 0xe000u);
}

/* RFC 5040 section 7.1 error layers and types, RFC 5041 section 7.2 DDP codes. */
enum {
	TERM_LAYER_RDMAP = 0,
	TERM_LAYER_DDP = 1,
	TERM_LAYER_LLP = 2,

	RDMAP_ETYPE_CATASTROPHIC = 0,
	RDMAP_ETYPE_REMOTE_PROT = 1,
	RDMAP_ETYPE_REMOTE_OP = 2,
	/* RDMAP_ETYPE_REMOTE_PROT codes */
	RDMAP_ECODE_INVALID_STAG = 0x00,
	RDMAP_ECODE_BASE_BOUNDS = 0x01,
	RDMAP_ECODE_ACCESS_RIGHTS = 0x02,
	RDMAP_ECODE_STAG_NOT_ASSOC = 0x03,
	RDMAP_ECODE_TO_WRAP = 0x04,
	/* RDMAP_ETYPE_REMOTE_OP codes */
	RDMAP_ECODE_INVALID_VERSION = 0x05,
	RDMAP_ECODE_UNEXPECTED_OPCODE = 0x06,
	RDMAP_ECODE_CATASTROPHIC_STREAM = 0x07,
	RDMAP_ECODE_UNSPECIFIED = 0xff,

	DDP_ETYPE_CATASTROPHIC = 0,
	DDP_ETYPE_TAGGED_BUF = 1,
	DDP_ETYPE_UNTAGGED_BUF = 2,
	/* DDP_ETYPE_TAGGED_BUF codes */
	DDP_ECODE_T_INVALID_STAG = 0x00,
	DDP_ECODE_T_BASE_BOUNDS = 0x01,
	DDP_ECODE_T_STAG_NOT_ASSOC = 0x02,
	DDP_ECODE_T_TO_WRAP = 0x03,
	DDP_ECODE_T_INVALID_VERSION = 0x04,
	/* DDP_ETYPE_UNTAGGED_BUF codes */
	DDP_ECODE_UT_INVALID_QN = 0x01,
	DDP_ECODE_UT_NO_BUFFER = 0x02,
	DDP_ECODE_UT_INVALID_MSN_RANGE = 0x03,
	DDP_ECODE_UT_INVALID_MO = 0x04,
	DDP_ECODE_UT_MSG_TOO_LONG = 0x05,
	DDP_ECODE_UT_INVALID_VERSION = 0x06,
};

/*
 * RD header (24 bytes): the reliable-UDP LLP beneath DDP for RD QPs (paper 003 III.B leaves the
 * mechanism to the LLP). Its first byte, 0xD2, has DDP reserved bits set, so a UD QP that
 * receives an RD datagram rejects it as malformed instead of misreading it.
 */
enum {
	RD_MAGIC = 0xd2,
	RD_FLAG_DATA = 0x01, /* seq is valid and a DDP segment follows */
	RD_FLAG_ACK = 0x02,  /* ack, ack_epoch and sack are valid */
	RD_FLAG_RST = 0x04,  /* the sender has no state for ack_epoch: start over */
	RD_FLAG_RNR = 0x08,  /* ACK: receiver not ready: the datagram at `ack` found no receive
			      * buffer; it is kept or will be retransmitted. The sender sends no new
			      * data and counts no retries until an ack without RNR (flow control) */
	RD_FLAG_PROBE = 0x10, /* no DATA, no payload: the sender of `epoch`, its acks silent for a
			       * while, asks for an ack now; seq carries the probe's id (a tail-loss
			       * probe, RFC 8985 7, without resending data) */
	RD_FLAG_ANSWER = 0x20, /* ACK: sent on a PROBE (seq: the probe's id); the ack covers all
				* the receiver had when the probe arrived, so a datagram sent before
				* the probe and neither acked nor SACKed was lost (RACK, RFC 8985) */
};

struct dg_rd_hdr {
	uint8_t magic;  /* RD_MAGIC */
	uint8_t flags;  /* RD_FLAG_* */
	be16 wnd;       /* receive window the sender of this datagram offers, in datagrams */
	be32 epoch;     /* random per (QP, peer) incarnation of the sender's sequence space */
	be32 seq;       /* DATA: sequence number, 0 for the first datagram of an epoch; PROBE,
			 * ANSWER: the probe's id */
	be32 ack_epoch; /* ACK: the epoch the ack refers to (the peer's) */
	be32 ack;       /* ACK: next sequence number expected (all below received) */
	be32 sack;      /* ACK: bit i set: ack + 1 + i received out of order */
} __attribute__((packed));

/* CRC32c (Castagnoli, as iSCSI and MPA) of every preceding byte of the datagram; big-endian. */
typedef be32 dg_crc_t;

enum {
	DG_TAGGED_HLEN = 30,
	DG_UNTAGGED_HLEN = 26,
	DG_RD_HLEN = 24,
	DG_CRC_LEN = 4,
	DG_READ_REQ_LEN = 28,
	DG_TERM_LEN = 8,
	DG_MAX_DATAGRAM = 65507, /* largest UDP payload over IPv4 */
};

_Static_assert(sizeof(struct dg_tagged_hdr) == DG_TAGGED_HLEN, "tagged header size");
_Static_assert(sizeof(struct dg_untagged_hdr) == DG_UNTAGGED_HLEN, "untagged header size");
_Static_assert(sizeof(struct rdmap_read_req) == DG_READ_REQ_LEN, "read request size");
_Static_assert(sizeof(struct rdmap_terminate) == DG_TERM_LEN, "terminate size");
_Static_assert(sizeof(struct dg_rd_hdr) == DG_RD_HLEN, "rd header size");

/* RFC 5040 section 4.8 in a datagram (paper 003 III.C): a Terminate message of a UD or RD QP as
 * it leaves. Only as many bytes of copy as the offending datagram's headers go out (D: its
 * tagged or untagged datagram header; R: its Read Request too). */
struct dg_terminate_msg {
	struct dg_untagged_hdr h;   /* RFC 5041 4.3 + ext: QN 2, L=1 */
	struct rdmap_terminate t;   /* RFC 5040 4.8: control word, segment length, pad */
	uint8_t copy[DG_TAGGED_HLEN + DG_READ_REQ_LEN]; /* RFC 5040 4.8: the terminated headers */
} __attribute__((packed));
_Static_assert(sizeof(struct dg_terminate_msg) ==
		       DG_UNTAGGED_HLEN + DG_TERM_LEN + DG_TAGGED_HLEN + DG_READ_REQ_LEN,
	       "datagram Terminate message size");

/* ==========================================================================================
 * RC: standard iWARP over TCP (RFC 5044 MPA + RFC 6581, RFC 5041 DDP, RFC 5040 RDMAP).
 * docs/wire.md section 12 explains every field with a worked example (tests/unit/test_mpa.c).
 *
 * Stream after connection set-up, each direction:
 *   [MPA Request or Reply frame] then FPDUs:
 *   FPDU = [ULPDU_Length (2)][DDP/RDMAP header (14 tagged, 18 untagged)][payload]
 *          [pad to a multiple of 4 over the whole FPDU][CRC32c (4)]
 *   with a 4-byte marker at every 512th octet of the FPDU stream when markers were negotiated.
 * ========================================================================================== */

/* RFC 5044 section 7.1: the 16-byte keys of the MPA Request and Reply frames. */
#define MPA_KEY_REQ "MPA ID Req Frame"
#define MPA_KEY_REP "MPA ID Rep Frame"

/* RFC 5044 section 7.1 (flags byte of the Request/Reply frame), RFC 6581 section 5 (E). */
enum {
	MPA_FLAG_M = 0x80,     /* RFC 5044 7.1: the sender wants markers in what it receives */
	MPA_FLAG_C = 0x40,     /* RFC 5044 7.1: the sender wants CRC32c (used if either asks) */
	MPA_FLAG_R = 0x20,     /* RFC 5044 7.1: Reply only: the connection is rejected */
	MPA_FLAG_E = 0x10,     /* RFC 6581 5: enhanced set-up, IRD/ORD word leads the private data */
	MPA_FLAG_RSVD = 0x0f,  /* RFC 5044 7.1: zero when sent, ignored when received */
	MPA_MAX_PDATA = 512,   /* RFC 5044 7.1: private data of one frame */
	MPA_MARKER_SPACING = 512, /* RFC 5044 section 5 */
	MPA_MAX_ULPDU = 65535, /* RFC 5044 4.1: ULPDU_Length is 16 bits */
};

/* RFC 5044 section 7.1: MPA Request / Reply frame header (private data follows). */
struct mpa_rr_hdr {
	uint8_t key[16]; /* MPA_KEY_REQ or MPA_KEY_REP, no terminating NUL */
	uint8_t flags;   /* MPA_FLAG_*: M C R E Res(4) */
	uint8_t rev;     /* RFC 5044 7.1: revision 1; RFC 6581: 2 */
	be16 pd_len;     /* RFC 5044 7.1: private data bytes that follow (<= 512, + 4 with E) */
} __attribute__((packed));

/* RFC 6581 section 5 (Figure 8): the first 4 bytes of the private data when E is set. */
enum {
	MPA_V2_IRD_P2P = 0x8000,       /* IRD word bit A: peer-to-peer model, RTR message follows */
	MPA_V2_IRD_SEND_RTR = 0x4000,  /* IRD word bit B: zero-length Send may be the RTR */
	MPA_V2_ORD_WRITE_RTR = 0x8000, /* ORD word bit C: zero-length RDMA Write may be the RTR */
	MPA_V2_ORD_READ_RTR = 0x4000,  /* ORD word bit D: zero-length RDMA Read may be the RTR */
	MPA_V2_MASK = 0x3fff,          /* 14-bit IRD / ORD value */
};
struct mpa_v2_word {
	be16 ird; /* RFC 6581 5: A B IRD(14) */
	be16 ord; /* RFC 6581 5: C D ORD(14) */
} __attribute__((packed));

/* RFC 5044 section 5: a marker; FPDUPTR is the distance in octets from the first octet of the
 * FPDU the marker lies in (its ULPDU_Length, or the marker itself when the FPDU starts with
 * one) back from the marker: 0 for a marker in front of an FPDU. */
struct mpa_marker {
	be16 rsvd;    /* zero */
	be16 fpduptr; /* RFC 5044 5 */
} __attribute__((packed));

/* RFC 5041 section 4.2 (+ RFC 5040 4.2 ctrl half): tagged DDP header, 14 bytes. */
struct ddp_tagged_hdr {
	be16 ctrl; /* T=1, L, DV=1, RV=1, opcode */
	be32 stag; /* RFC 5041 4.2: data sink STag */
	be64 to;   /* RFC 5041 4.2: data sink tagged offset of the first payload byte */
} __attribute__((packed));

/* RFC 5041 section 4.3 (+ RFC 5040 4.2): untagged DDP header, 18 bytes. */
struct ddp_untagged_hdr {
	be16 ctrl;     /* T=0, L, DV=1, RV=1, opcode */
	be32 inv_stag; /* RFC 5040 4.2 / RFC 5041 4.3 RsvdULP: STag to invalidate, else 0 */
	be32 qn;       /* RFC 5041 4.3: queue number (enum ddp_qn) */
	be32 msn;      /* RFC 5041 4.3: message sequence number, 1 for the first message of a queue */
	be32 mo;       /* RFC 5041 4.3: offset of this segment's first byte in the message */
} __attribute__((packed));

/* RFC 5040 section 4.8: Terminate payload (untagged QN 2): control word, then (M) the length
 * of the terminated DDP segment, then (D) its DDP header, then (R) its Read Request header. */
struct rdmap_rc_terminate {
	be32 term_ctrl;   /* term_ctrl_make(): layer, etype, ecode, M, D, R */
	be16 ddp_seg_len; /* RFC 5040 4.8: valid with M; always present when D is set */
} __attribute__((packed));

/* RFC 5044 section 7.1 / RFC 6581 section 6: LLP (MPA) error codes of the Terminate. */
enum {
	LLP_ETYPE_MPA = 0,
	LLP_ECODE_TCP_LOST = 0x01,
	LLP_ECODE_CRC = 0x02,
	LLP_ECODE_MARKER = 0x03,          /* FPDU marker / framing error */
	LLP_ECODE_BAD_REQ_REP = 0x04,     /* invalid MPA Request/Reply */
	LLP_ECODE_LOCAL_CATASTROPHIC = 0x05,
	LLP_ECODE_INSUFFICIENT_IRD = 0x06,
	LLP_ECODE_NO_MATCHING_RTR = 0x07,
	RDMAP_ECODE_CANNOT_INVALIDATE = 0x09, /* RDMAP remote operation: Send with Invalidate */
};

enum {
	MPA_RR_HLEN = 20,
	MPA_V2_LEN = 4,
	MPA_HDR_LEN = 2,  /* ULPDU_Length */
	MPA_CRC_LEN = 4,
	MPA_MARKER_LEN = 4,
	DDP_TAGGED_HLEN = 14,
	DDP_UNTAGGED_HLEN = 18,
	RC_TERM_LEN = 6,
};

_Static_assert(sizeof(struct mpa_rr_hdr) == MPA_RR_HLEN, "MPA frame header size");
_Static_assert(sizeof(struct mpa_v2_word) == MPA_V2_LEN, "MPA v2 word size");
_Static_assert(sizeof(struct mpa_marker) == MPA_MARKER_LEN, "marker size");
_Static_assert(sizeof(struct ddp_tagged_hdr) == DDP_TAGGED_HLEN, "RC tagged header size");
_Static_assert(sizeof(struct ddp_untagged_hdr) == DDP_UNTAGGED_HLEN, "RC untagged header size");
_Static_assert(sizeof(struct rdmap_rc_terminate) == RC_TERM_LEN, "RC terminate size");

/* RFC 5040 section 4.4 on RFC 5041 section 4.3: an RC RDMA Read Request as one ULPDU (the
 * Request is the whole payload of its untagged QN 1 segment; also the RFC 6581 section 7
 * Read RTR, with every field zero). */
struct rc_read_req_msg {
	struct ddp_untagged_hdr ddp; /* RFC 5041 4.3: QN 1, L=1, MO 0, MSN of the Read queue */
	struct rdmap_read_req req;   /* RFC 5040 4.4: sink STag/TO, size, source STag/TO */
} __attribute__((packed));

/* RFC 5040 section 4.8: an RC Terminate as one ULPDU (untagged QN 2). Only as many bytes of
 * hdrs as the offending segment had go out (D: its DDP header; R: its Read Request too). */
struct rc_terminate_msg {
	struct ddp_untagged_hdr ddp;     /* RFC 5041 4.3: QN 2, L=1, MO 0, MSN of the Terminate queue */
	struct rdmap_rc_terminate term;  /* RFC 5040 4.8: control word and DDP segment length */
	uint8_t hdrs[DDP_UNTAGGED_HLEN + DG_READ_REQ_LEN]; /* RFC 5040 4.8: the terminated headers */
} __attribute__((packed));

_Static_assert(sizeof(struct rc_read_req_msg) == DDP_UNTAGGED_HLEN + DG_READ_REQ_LEN, "RC Read Request size");
_Static_assert(sizeof(struct rc_terminate_msg) == DDP_UNTAGGED_HLEN + RC_TERM_LEN + DDP_UNTAGGED_HLEN +
		       DG_READ_REQ_LEN, "RC Terminate message size");

/* ------------------------------------------------------------------------------------------
 * Discovery between hosts (docs/wire.md section 13, docs/shim.md "Discovery"): a sender asks
 * the destination host's well-known discovery port (DGSHIM_DISCOVERY_PORT, default 18517) which
 * services the program on a port speaks; a preloaded process there answers from the host's
 * registry. Both are one UDP datagram of exactly 24 bytes to and from that port.
 */
#define DG_DISCO_MAGIC "DGDS"
enum {
	DG_DISCO_VERSION = 1,
	DG_DISCO_PROBE = 1,  /* type: a question */
	DG_DISCO_ANSWER = 2, /* type: its answer */
	DG_DISCO_UD = 1,     /* caps: a UD queue pair on the soft provider ("dgshim/ud/<port>") */
	DG_DISCO_RD = 2,     /*       an RD queue pair ("dgshim/rd/<port>") */
	DG_DISCO_UDV = 4,    /*       UD on an RDMA device ("dgshim/udv/<port>") */
	DG_DISCO_RC = 8,     /*       a TCP listener carried over RC ("dgshim/rc/<port>") */
	DG_DISCO_LEN = 24,
};
struct dg_disco {
	uint8_t magic[4];   /* "DGDS" */
	uint8_t version;    /* 1 */
	uint8_t type;       /* DG_DISCO_PROBE or DG_DISCO_ANSWER */
	be16 port;          /* the UDP or TCP port asked about */
	be64 nonce;         /* the prober's random number, echoed: an answer must carry it */
	uint8_t caps;       /* answer: DG_DISCO_* of what listens on port (probe: 0) */
	uint8_t rsvd[3];    /* 0 */
	be32 lease_ms;      /* answer: how long the prober may believe it (probe: 0) */
} __attribute__((packed));
_Static_assert(sizeof(struct dg_disco) == DG_DISCO_LEN, "discovery message size");

/* ------------------------------------------------------------------------------------------
 * Streams between two shims (docs/shim.md "Streams", "TCP on an RDMA device"): what a TCP
 * socket carried over an RC queue pair puts in the MPA private data and in its Write-Records.
 * The byte stream itself travels as RDMA Write-Records into the peer's receive ring (paper 000
 * IV.B.3: Write-Record on a reliable transport); shim/stream_wire.c decodes these.
 */

/* Private data of the MPA Request and Reply between two shims (RFC 5044 7.1 private data;
 * after the RFC 6581 section 5 IRD/ORD word in revision 2). */
#define STREAM_MAGIC 0x44475331u /* "DGS1" */
struct stream_hello {
	be32 magic;      /* STREAM_MAGIC */
	be32 ring_size;  /* bytes in the receive ring (power of two) */
	be32 ring_stag;  /* STag of the ring and the control slots (one region; RFC 5040 4.3) */
	be32 ctl_slots;  /* control slots (just before the ring: ctl_addr says where) */
	be64 ring_addr;  /* tagged offset of the ring's first byte (RFC 5041 4.2 TO) */
	be64 ctl_addr;   /* tagged offset of control slot 0 */
	be32 max_recs;   /* data records the receiver takes in flight (its CQ room) */
	be32 rsvd;       /* zero */
} __attribute__((packed));

/*
 * Streams on an RDMA device (docs/shim.md "TCP on an RDMA device"). Both programs' TCP
 * connection is made as always (it gives accept(), the addresses and the fallback); when the
 * client's registry name says it wants the device, the server writes one struct stream_rv on
 * that connection, naming its device listener (rdma_cm, ephemeral port) and a cookie, and the
 * client connects there with struct stream_dhello as private data (40 + 8 bytes: an IB CM REQ
 * holds 52 of ours). The TCP connection carries nothing else.
 * A server that cannot carry the connection on its device (no memory it may pin, no queue pair:
 * RLIMIT_MEMLOCK, a full device) writes a "stay plain" rendezvous instead: port 0, family 0,
 * address and cookie zero; both ends then let the kernel carry the same TCP connection, the
 * rendezvous being the only byte of ours on it.
 * The same 32 bytes are the private data of an MPA Reject (RFC 5044 7.1, R bit) that means
 * "stay plain" where the server runs out of room later: on a soft stream, after the client's
 * MPA Request came on the program's connection (the Request and that Reply are then the only
 * bytes of ours on it); on a device, rejecting the client's rdma_cm request.
 */
#define STREAM_RV_MAGIC 0x64675256u /* "dgRV" */
struct stream_rv {
	be32 magic;          /* STREAM_RV_MAGIC */
	be16 family;         /* 0: the address TCP went to, 4: IPv4, 6: IPv6 */
	be16 port;           /* the device listener's port (rdma_cm RDMA_PS_TCP); 0: stay plain */
	uint8_t addr[16];    /* its address (IPv4: the first 4 bytes) */
	uint64_t cookie;     /* opaque, echoed byte for byte in the client's stream_dhello */
} __attribute__((packed));

/* Private data of the client's rdma_cm connect to the device listener (IB CM REQ private data,
 * 56 bytes at most for RDMA_PS_TCP: 52 after rdma_cm's own header). */
struct stream_dhello {
	struct stream_hello h; /* as on the soft provider */
	uint64_t cookie;       /* opaque, from the server's stream_rv: which accepted TCP connection */
} __attribute__((packed));

/* One control message: a Write-Record (paper 000 IV.B.3) into the peer's control slot
 * seq % ctl_slots. STREAM_CTL_ABORT: the sender's close is abortive (SO_LINGER {1, 0}, unread
 * data): the reset of its TCP connection that follows is a reset for the reader. A reset
 * without it is the end of a writer that died (its kernel would have sent FIN but for our
 * control bytes unread). */
enum { STREAM_CTL_HELLO = 1, STREAM_CTL_FIN = 2, STREAM_CTL_CLOSE = 4, STREAM_CTL_ABORT = 8 };
struct stream_ctl {
	be64 consumed;   /* bytes of the peer's stream the program has read */
	be64 recs;       /* data records of the peer's polled from the CQ */
	be64 fin_total;  /* STREAM_CTL_FIN: the sender's stream ends after this many bytes */
	be32 flags;      /* STREAM_CTL_* */
	be32 seq;        /* control messages sent before this one */
} __attribute__((packed));

enum {
	STREAM_HELLO_LEN = 40,
	STREAM_RV_LEN = 32,
	STREAM_DHELLO_LEN = 48,
	STREAM_CTL_LEN = 32,
};
_Static_assert(sizeof(struct stream_hello) == STREAM_HELLO_LEN, "stream hello size");
_Static_assert(sizeof(struct stream_rv) == STREAM_RV_LEN, "stream rendezvous size");
_Static_assert(sizeof(struct stream_dhello) == STREAM_DHELLO_LEN, "device stream hello size");
_Static_assert(sizeof(struct stream_ctl) == STREAM_CTL_LEN, "stream control message size");

/* ------------------------------------------------------------------------------------------
 * UD on an RDMA device (the ibverbs provider, ibverbs/ud.c; docs/design.md "Data path" of the
 * ibverbs provider): a device carries UD messages of one MTU and names a sender only by GID and
 * QP number, so every UD datagram starts with this placement header (after the 40-byte GRH
 * area of the receive buffer). Our own format: the fields play the roles of the datagram
 * header's (paper 003 III; section 2 of docs/wire.md) on a transport that has no DDP.
 */
#define IV_UDH_MAGIC 0xD6
enum { IV_UDH_LEN = 28 };
struct iv_udh {
	uint8_t magic;  /* IV_UDH_MAGIC */
	uint8_t op;     /* 0 Send, 1 Send with SE, 2 Write-Record (paper 000 IV.B), 3 RDMA Write */
	be16 port;      /* the sender's UDP port (the GRH gives only its IP address) */
	be32 msn;       /* the sender's message number (per QP), like the datagram MSN (RFC 5041 4.3) */
	be32 total;     /* message length in bytes (at most 64 KiB) */
	be32 offset;    /* this segment's offset in the message: a multiple of the payload per segment */
	be32 stag;      /* Write-Record, Write: the target region's STag (RFC 5041 4.2) */
	be32 to_hi;     /* Write-Record, Write: the target address (RFC 5041 4.2 TO), high half */
	be32 to_lo;     /*                                                           low half */
} __attribute__((packed));
_Static_assert(sizeof(struct iv_udh) == IV_UDH_LEN, "ibverbs UD placement header size");

#endif /* DG_WIRE_H */
