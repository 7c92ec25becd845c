/*
 * rd.h - the reliable-datagram LLP beneath DDP for RD queue pairs (paper 003 III.B: "a reliable
 * form of UDP", its mechanism outside the iWARP specification). Reliable and in order per source,
 * with light per-peer state: sequence numbers, cumulative + selective acks, retransmission of
 * what the acks show lost (once per loss; one backed-off timer per peer for the rest), a receive
 * window. A peer silent past the retry budget fails its cookies. docs/design.md ("RD
 * reliability") describes the algorithm.
 *
 * Datagram format: wire.h struct dg_rd_hdr, then the DDP segment, then CRC32c over both.
 *
 * Threading: an rd_ep is used under its owner's lock only (the QP lock); callbacks run under it
 * too, and may call rd_send() on the same ep (re-entrancy is supported).
 * No malloc after rd_create on the data path: buffers come from pools sized at creation.
 */
#ifndef DG_RD_H
#define DG_RD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dgverbs.h"

struct rd_ep;

struct rd_ops {
	/* Hand a complete datagram to UDP. Returns 0, or -EAGAIN/-errno (RD treats it as lost
	 * and retransmits later). */
	int (*xmit)(void *arg, const struct iovec *iov, int iovcnt, const union dgv_sockaddr *to,
		    socklen_t tolen);
	/* The next in-order DDP segment from a peer (RD header and CRC removed). seg is only valid
	 * during the call. Returns 0 when consumed, -EAGAIN when the receiver has no buffer for it
	 * (nothing was done): RD keeps it undelivered, tells the peer "not ready" and offers it
	 * again after rd_kick(). */
	int (*deliver)(void *arg, const union dgv_sockaddr *from, socklen_t fromlen,
		       const uint8_t *seg, size_t len);
	/* The datagram sent with this (non-zero) cookie, and everything before it to that peer,
	 * has been acknowledged. */
	void (*acked)(void *arg, uint64_t cookie);
	/* The peer failed (retry budget exhausted, or it reset): each pending non-zero cookie to it
	 * is reported once with err (-ETIMEDOUT or -ECONNRESET). */
	void (*failed)(void *arg, uint64_t cookie, int err);
	/* Optional (NULL: none). Hand n >= 2 complete datagrams to UDP in one call as a GSO train
	 * (UDP_SEGMENT of seg bytes): each iov entry one whole datagram, CRC included, every one seg
	 * bytes but the last, which may be shorter. Returns 0; -EOPNOTSUPP when trains cannot go
	 * (the kernel refused GSO, fault injection is on): nothing was sent and RD sends each
	 * datagram by xmit, now and from then on; or -EAGAIN/-errno (all of them lost, as xmit's). */
	int (*xmit_train)(void *arg, const struct iovec *iov, int n, uint16_t seg,
			  const union dgv_sockaddr *to, socklen_t tolen);
};

struct rd_cfg {
	uint32_t max_dgram;    /* largest DDP segment rd_send gets (without RD header and CRC) */
	uint32_t tx_slots;     /* retransmission buffers shared by all peers; 0: 4 MiB / max_dgram, 16..1024 */
	uint32_t rx_slots;     /* out-of-order buffers shared by all peers; 0: same rule */
	uint32_t max_wnd;      /* most datagrams in flight to one peer; 0: 256 (capped by tx_slots) */
	uint32_t max_peers;    /* 0: 4096 */
	uint32_t max_retries;  /* retransmissions of one datagram before the peer fails; 0: 12 */
	uint32_t rto_min_us;   /* 0: 2000 */
	uint32_t rto_max_us;   /* 0: 500000 */
	uint32_t ack_delay_us; /* delayed-ack bound; 0: 500 */
};

struct rd_stats {
	uint64_t data_sent, retransmits, acks_sent, acks_rcvd, dup_drops, ooo_buffered;
	uint64_t window_stalls, peer_failures, resets_sent, resets_rcvd, malformed;
	uint64_t timeouts;    /* retransmissions by a timer (the others: SACK and RACK, go-back) */
	uint64_t spurious_timeouts; /* timeouts the acks after them showed needless */
	uint64_t nobuf_drops; /* out-of-order datagrams dropped for want of a buffer */
	uint64_t probes;      /* tail-loss probes sent (RD_FLAG_PROBE) */
	uint32_t peers;
};

/* Returns 0 or -ENOMEM/-EINVAL. */
int rd_create(const struct rd_cfg *cfg, const struct rd_ops *ops, void *arg, struct rd_ep **out);
/* Frees everything; pending cookies are not reported. */
void rd_destroy(struct rd_ep *ep);

/*
 * Sends one DDP segment (iov, no CRC) reliably to a peer. The bytes are copied. Returns 0,
 * -EAGAIN when the peer's window or the slot pool is full (rd_can_send() says when to retry),
 * -ENOMEM when the peer table is full, -EMSGSIZE above max_dgram.
 */
int rd_send(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen,
	    const struct iovec *iov, int iovcnt, uint64_t cookie);
bool rd_can_send(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen);
/*
 * Between rd_cork and rd_uncork, the new datagrams rd_send takes wait (at most RD_CORK_MAX, all
 * to one peer; another peer's, or the limit, sends what waits first) and rd_uncork hands them
 * down as GSO trains through xmit_train (issue 14 item 5: a bulk sender's system calls per
 * datagram). Retransmissions and acks never wait. What rd_send says is unchanged: a datagram it
 * took counts in flight, and one UDP refuses is lost and retransmitted, corked or not. Corks
 * do not nest.
 */
void rd_cork(struct rd_ep *ep);
void rd_uncork(struct rd_ep *ep);
/*
 * The datagrams rd_input gets between these two came in one read (the pieces of a GRO train, a
 * recvmmsg batch): each peer gets one ack at rd_rx_batch_end, with the SACK bits of all of it,
 * not one per second in-order datagram and one per out-of-order one (an ack with news still
 * goes at the batch's end, not at the delayed-ack deadline). Batches do not nest.
 */
void rd_rx_batch_begin(struct rd_ep *ep);
void rd_rx_batch_end(struct rd_ep *ep);
/* The datagrams rd_input gets between these two arrived at one instant (the pieces of one GRO
 * train, one skb): they take one clock reading, as they would have, instead of one each. */
void rd_clock_hold(struct rd_ep *ep);
void rd_clock_release(struct rd_ep *ep);
/* Whether the slot pool has room (a -EAGAIN from rd_send was then one peer's window). */
bool rd_can_send_any(const struct rd_ep *ep);

/*
 * A received datagram that starts with the RD header; its CRC was checked and is not included
 * in len. Calls deliver() for each segment that is now in order, sends acks as needed.
 * Returns 0, or -EPROTO for a malformed RD header (counted).
 */
int rd_input(struct rd_ep *ep, const union dgv_sockaddr *from, socklen_t fromlen, uint8_t *buf,
	     size_t len);

/* The receiver gained buffers: offer the segments deliver() refused again. Cheap when none
 * is waiting. */
void rd_kick(struct rd_ep *ep);

/* Runs retransmission, delayed-ack and peer-failure timers. now_us: CLOCK_MONOTONIC in µs.
 * Returns the µs until it next has something to do (UINT64_MAX: nothing pending). */
uint64_t rd_tick(struct rd_ep *ep, uint64_t now_us);

/* The caller knows the peer at `to` is gone (its socket closed): what is in flight to it fails
 * now with -ECONNRESET (ops.failed), not after the retries' seconds. Returns 1 when something
 * was in flight, 0 when nothing was, -EINVAL for a bad address. */
int rd_peer_gone(struct rd_ep *ep, const union dgv_sockaddr *to, socklen_t tolen);

/* Sends every acknowledgement owed now, not at its delayed-ack deadline: the endpoint is going
 * away (its socket closes), and a sender whose last datagrams it does not acknowledge would
 * retransmit them until it gave up, its window held meanwhile. */
void rd_ack_owed(struct rd_ep *ep, uint64_t now_us);

/* True while any datagram is unacknowledged or an ack is owed. */
bool rd_busy(struct rd_ep *ep);

void rd_get_stats(struct rd_ep *ep, struct rd_stats *out);

/* Monotonic clock in µs (shared helper). */
uint64_t dg_now_us(void);

#endif
