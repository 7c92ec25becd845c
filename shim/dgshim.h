/*
 * dgshim.h - the public interface of libdgshim.so for programs that want to choose, per socket,
 * whether and how it is carried over datagram-iWARP (paper 001 section 3.1: IWARP_MODE).
 * Unmodified programs need none of this: rules (DGSHIM_CONF) and the environment decide for them.
 *
 *   int mode = IWARP_MODE_UD;
 *   setsockopt(fd, SOL_IWARP, IWARP_MODE, &mode, sizeof mode);
 *
 * Without the shim loaded these calls fail (ENOPROTOOPT or EOPNOTSUPP), so a program can tell.
 */
#ifndef DGSHIM_H
#define DGSHIM_H

/* Socket option level: outside every level the kernel uses (SOL_* are small numbers). */
#define SOL_IWARP 0x1d9a

/* int: one of the IWARP_MODE_* values. May change between datagrams. */
#define IWARP_MODE 1
/* int: payloads of at least this many bytes are sent from the program's own (registered)
 * buffer; smaller ones are copied through pre-registered buffers. */
#define IWARP_ZCOPY_THRESHOLD 2
/* struct iwarp_stats, getsockopt only: what crossed this socket so far. */
#define IWARP_STATS 3
/* int, getsockopt only: 1 if the socket is carried by a queue pair (taken), 0 if the
 * operating system carries it untouched (not taken, or excluded by rules). */
#define IWARP_TAKEN 4

enum iwarp_mode {
	IWARP_MODE_OFF = 0, /* the operating system carries the socket, untouched */
	IWARP_MODE_UD = 1,  /* unreliable datagram-iWARP (UDP sockets) */
	IWARP_MODE_RD = 2,  /* reliable datagram-iWARP: in order, exactly once per source (UDP) */
	IWARP_MODE_RC = 3,  /* reliable connection, iWARP over TCP (stream sockets) */
	IWARP_MODE_AUTO = 4 /* the rules and the peer decide (the default) */
};


#include <stdint.h>

/* Counters of one socket (all of its descriptors). "framed": carried as datagram-iWARP
 * messages; "plain": ordinary UDP datagrams (a peer without datagram-iWARP, multicast,
 * broadcast, mode off). Datagram counts are the program's datagrams, not wire segments. */
struct iwarp_stats {
	uint64_t tx_framed, tx_plain, rx_framed, rx_plain;                 /* datagrams */
	uint64_t tx_framed_bytes, tx_plain_bytes, rx_framed_bytes, rx_plain_bytes; /* payload bytes */
	uint64_t tx_zcopy;     /* framed datagrams sent from the program's own registered buffer */
	uint64_t crc_drops;    /* received datagrams dropped for a bad CRC */
	uint64_t lost;         /* losses detected: incomplete messages given up, receives refused */
	uint64_t retransmits;  /* RD retransmissions */
	uint64_t wire_tx, wire_rx; /* UDP datagrams on the wire (segments, acks included) */
	uint64_t rejected;     /* framed datagrams refused: malformed, or naming memory (STag,
				* offset, rights) this socket never advertised; never placed */
};

#endif
