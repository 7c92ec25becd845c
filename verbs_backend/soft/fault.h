/*
 * fault.h - fault injection at one edge (send or receive) of a datagram QP: loss, burst loss,
 * reordering, duplication, corruption. tc netem does not exist on our machines, so tests and
 * benchmarks inject faults here. Configured per QP (struct dgv_fault) or from the environment.
 *
 * Not thread-safe: the owner (a QP, under its lock) serialises calls.
 */
#ifndef DG_FAULT_H
#define DG_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dgverbs.h"
#include "env.h"

/* One datagram passing the edge. iov may point at memory the fault layer must not modify. */
struct dg_pkt {
	const struct iovec *iov;
	int iovcnt;
	size_t len; /* total bytes in iov */
	const union dgv_sockaddr *addr;
	socklen_t addrlen;
};

/* Called for every datagram that leaves the edge (0, 1 or 2 times per dg_fault_apply). */
typedef void (*dg_fault_emit_fn)(void *arg, const struct dg_pkt *pkt);

struct dg_fault_held;

struct dg_fault_state {
	struct dgv_fault cfg;
	bool active;          /* any rate non-zero */
	uint64_t rng;         /* xorshift state */
	uint32_t burst_left;  /* losses still to inflict in the current burst */
	size_t max_dgram;
	struct dg_fault_held *held; /* reorder_depth slots (allocated at init when reordering) */
	uint32_t nheld;
	uint8_t *scratch;     /* max_dgram bytes for corrupted copies */
	uint64_t dropped, duplicated, reordered, corrupted;
};

/* Returns 0 or -ENOMEM/-EINVAL (rates outside 0..100, reorder depth over 64). cfg may be NULL. */
int dg_fault_init(struct dg_fault_state *f, const struct dgv_fault *cfg, size_t max_dgram);
void dg_fault_fini(struct dg_fault_state *f);
/* Passes one datagram through the faults; emit() sees what survives, in the order it leaves. */
void dg_fault_apply(struct dg_fault_state *f, const struct dg_pkt *pkt, dg_fault_emit_fn emit, void *arg);
/* Releases datagrams held for reordering (called from the progress timer so none is stuck). */
void dg_fault_flush(struct dg_fault_state *f, dg_fault_emit_fn emit, void *arg);
/* Reads a spec from environment variable var (DG_ENV_FAULT_TX/RX; unset or empty: all zero).
 * Returns 0 or -EINVAL, after logging one error line that names the variable and the bad item. */
int dg_fault_from_env(enum dg_env var, struct dgv_fault *out);

#endif
