/*
 * disco_wire.c - encoding and decoding the discovery messages (disco_wire.h).
 */
#include "disco_wire.h"

#include <endian.h>
#include <string.h>

int disco_parse(const void *buf, size_t len, int type, unsigned *port, uint64_t *nonce, uint8_t *caps,
		uint32_t *lease_ms)
{
	struct dg_disco m;
	if (len != sizeof m)
		return -1;
	memcpy(&m, buf, sizeof m);
	if (memcmp(m.magic, DG_DISCO_MAGIC, 4) || m.version != DG_DISCO_VERSION || m.type != type ||
	    m.rsvd[0] || m.rsvd[1] || m.rsvd[2] || !m.port)
		return -1;
	if (type == DG_DISCO_PROBE && (m.caps || m.lease_ms))
		return -1;
	if (type == DG_DISCO_ANSWER && (m.caps & ~(DG_DISCO_UD | DG_DISCO_RD | DG_DISCO_UDV | DG_DISCO_RC)))
		return -1;
	*port = be16toh(m.port);
	*nonce = be64toh(m.nonce);
	if (caps)
		*caps = m.caps;
	if (lease_ms)
		*lease_ms = be32toh(m.lease_ms);
	return 0;
}

void disco_put(struct dg_disco *m, int type, unsigned port, uint64_t nonce, uint8_t caps, uint32_t lease)
{
	memset(m, 0, sizeof *m);
	memcpy(m->magic, DG_DISCO_MAGIC, 4);
	m->version = DG_DISCO_VERSION;
	m->type = (uint8_t)type;
	m->port = htobe16((uint16_t)port);
	m->nonce = htobe64(nonce);
	m->caps = caps;
	m->lease_ms = htobe32(lease);
}
