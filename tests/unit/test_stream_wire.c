/* test_stream_wire.c - the stream rendezvous (verbs_backend/wire.h struct stream_rv) as the client
 * reads it (shim/stream_wire.c stream_rv_decode, used by stream.c rv_step): a device listener's
 * address, and "stay plain" (port 0), which names nothing else. */
#include <criterion/criterion.h>

#include <endian.h>
#include <errno.h>
#include <string.h>

#include "../../shim/stream_wire.h"
#include "wire.h"

static struct stream_rv rv_of(uint16_t fam, uint16_t port, uint64_t cookie)
{
	struct stream_rv rv;
	memset(&rv, 0, sizeof rv);
	rv.magic = htobe32(STREAM_RV_MAGIC);
	rv.family = htobe16(fam);
	rv.port = htobe16(port);
	rv.cookie = cookie;
	return rv;
}

Test(stream_rv, names_the_device_listener)
{
	struct stream_rv rv = rv_of(4, 40123, 0x1122334455667788ull);
	memcpy(rv.addr, "\x0a\x00\x00\x07", 4);
	struct stream_rendezvous z;
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), 0);
	cr_assert_eq(z.family, 4);
	cr_assert_eq(z.port, 40123);
	cr_assert_eq(z.cookie, 0x1122334455667788ull, "the cookie is echoed as sent, never converted");
	cr_assert_arr_eq(z.addr, "\x0a\x00\x00\x07", 4);
}

Test(stream_rv, stay_plain_is_port_zero_and_nothing_else)
{
	struct stream_rv rv = rv_of(0, 0, 0);
	struct stream_rendezvous z;
	memset(&z, 0x5a, sizeof z);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), 0);
	cr_assert_eq(z.port, 0, "port 0: stay plain");
	cr_assert_eq(z.family, 0);
	cr_assert_eq(z.cookie, 0);
}

Test(stream_rv, stay_plain_that_names_something_is_refused)
{
	struct stream_rendezvous z;
	struct stream_rv rv = rv_of(4, 0, 0);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), -EPROTO, "port 0 with a family");
	rv = rv_of(0, 0, 1);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), -EPROTO, "port 0 with a cookie");
	rv = rv_of(0, 0, 0);
	rv.addr[15] = 1;
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), -EPROTO, "port 0 with an address");
}

Test(stream_rv, not_ours_is_refused)
{
	struct stream_rendezvous z;
	struct stream_rv rv = rv_of(0, 0, 0);
	rv.magic = htobe32(STREAM_RV_MAGIC ^ 1);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), -EPROTO, "another magic");
	rv = rv_of(5, 7000, 0);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv, &z), -EPROTO, "family 5");
	rv = rv_of(0, 7000, 0);
	cr_assert_eq(stream_rv_decode(&rv, sizeof rv - 1, &z), -EPROTO, "one byte short");
	cr_assert_eq(stream_rv_decode(NULL, sizeof rv, &z), -EPROTO);
}
