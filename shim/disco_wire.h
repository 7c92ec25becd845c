/*
 * disco_wire.h - the discovery messages between hosts (verbs_backend/wire.h struct dg_disco,
 * docs/wire.md "Discovery") as pure functions of their bytes, so that they can be fuzzed
 * (tests/fuzz/fuzz_disco.c) apart from disco.c's sockets. Nothing logs, nothing allocates.
 */
#ifndef DGSHIM_DISCO_WIRE_H
#define DGSHIM_DISCO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* A discovery message of type (DG_DISCO_PROBE or DG_DISCO_ANSWER): 0 and its fields (caps and
 * lease_ms may be NULL), or -1 when the bytes are not exactly one well-formed message of that
 * type (the only accepted form is the one disco_put writes). */
int disco_parse(const void *buf, size_t len, int type, unsigned *port, uint64_t *nonce, uint8_t *caps,
		uint32_t *lease_ms);

/* Writes a message of type into *m (a probe carries caps 0 and lease 0). */
void disco_put(struct dg_disco *m, int type, unsigned port, uint64_t nonce, uint8_t caps, uint32_t lease);

#endif
