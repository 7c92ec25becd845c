/*
 * fuzz_disco.c - the discovery messages between hosts (shim/disco_wire.c): what the answering
 * side parses from a probe and the asking side from an answer, both from the network.
 *
 * Input: the bytes of one datagram, parsed as a probe and as an answer.
 * Oracles: a message is accepted only in its one canonical form, so an accepted message must
 * re-encode (disco_put) to exactly the input's bytes: no field the parser ignores, no second
 * spelling a spoofer could use; the fields read back are the ones encoded; a probe carries no
 * services and no lease; an answer names only known services; port 0 is never accepted.
 */
#include "disco_wire.h"
#include "fuzz.h"

static void check(const uint8_t *d, size_t n, int type)
{
	unsigned port = 0;
	uint64_t nonce = 0;
	uint8_t caps = 0xff;
	uint32_t lease = 0xffffffffu;
	if (disco_parse(d, n, type, &port, &nonce, &caps, &lease))
		return;
	FUZZ_CHECK(n == sizeof(struct dg_disco));
	FUZZ_CHECK(port != 0 && port <= 0xffff);
	if (type == DG_DISCO_PROBE)
		FUZZ_CHECK(caps == 0 && lease == 0);
	else
		FUZZ_CHECK(!(caps & ~(DG_DISCO_UD | DG_DISCO_RD | DG_DISCO_UDV | DG_DISCO_RC)));
	struct dg_disco m;
	disco_put(&m, type, port, nonce, caps, lease);
	FUZZ_CHECK(memcmp(&m, d, sizeof m) == 0);
	/* the optional fields may be left out */
	unsigned p2;
	uint64_t n2;
	FUZZ_CHECK(disco_parse(d, n, type, &p2, &n2, NULL, NULL) == 0 && p2 == port && n2 == nonce);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	check(d, n, DG_DISCO_PROBE);
	check(d, n, DG_DISCO_ANSWER);
	return 0;
}
