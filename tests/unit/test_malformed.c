/*
 * test_malformed.c - hostile datagrams sent from a plain UDP socket at UD and RD queue pairs:
 * each is dropped or rejected, counted, never placed, and never crashes (run under ASan too).
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc.h"
#include "dgverbs.h"
#include "frame.h"
#include "wire.h"

static struct dgv_context *ctx;
static struct dgv_pd *pd;
static struct dgv_cq *cq;
static struct dgv_qp *qp;
static struct dgv_mr *mr;
static uint8_t *region;
static int raw;
static union dgv_sockaddr qaddr;
static socklen_t qlen;
#define REGION 65536

static void setup(enum dgv_qp_type t)
{
	cr_assert_eq(dgv_open(NULL, &ctx), 0);
	cr_assert_eq(dgv_alloc_pd(ctx, &pd), 0);
	cr_assert_eq(dgv_create_cq(ctx, 256, &cq), 0);
	struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	static const struct dgv_fault none;
	struct dgv_qp_init_attr a = {.qp_type = t, .send_cq = cq, .recv_cq = cq,
				     .bind_addr = (struct sockaddr *)&lo, .bind_len = sizeof lo,
				     .fault_tx = &none, .fault_rx = &none, .max_msg_size = 1 << 20};
	cr_assert_eq(dgv_create_qp(pd, &a, &qp), 0);
	cr_assert_eq(dgv_qp_local_addr(qp, &qaddr, &qlen), 0);
	region = calloc(1, REGION);
	cr_assert_eq(dgv_reg_mr(pd, region, REGION, DGV_ACCESS_LOCAL_WRITE | DGV_ACCESS_REMOTE_WRITE, &mr), 0);
	raw = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_geq(raw, 0);
	cr_assert_eq(bind(raw, (struct sockaddr *)&lo, sizeof lo), 0);
}

static void teardown(void)
{
	close(raw);
	dgv_destroy_qp(qp);
	dgv_dereg_mr(mr);
	dgv_destroy_cq(cq);
	dgv_dealloc_pd(pd);
	dgv_close(ctx);
	free(region);
}

/* Sends buf (len bytes), appending a correct CRC when with_crc. */
static void inject(const void *buf, size_t len, bool with_crc)
{
	uint8_t d[70000];
	cr_assert_leq(len, sizeof d - 4);
	memcpy(d, buf, len);
	if (with_crc) {
		be32 c = htobe32(dg_crc32c(d, len));
		memcpy(d + len, &c, 4);
		len += 4;
	}
	cr_assert_eq(sendto(raw, d, len, 0, &qaddr.sa, qlen), (ssize_t)len);
}

static struct dgv_qp_stats settle(void)
{
	struct dgv_wc wc;
	for (int i = 0; i < 20; i++) {
		dgv_poll_cq(cq, 1, &wc);
		usleep(1000);
	}
	struct dgv_qp_stats st;
	dgv_qp_stats(qp, &st);
	return st;
}

static void region_untouched(void)
{
	for (int i = 0; i < REGION; i++)
		cr_assert_eq(region[i], 0, "byte %d of the region was written", i);
}

/* A tagged Write-Record header aimed at the region, payload of plen 0xAB bytes. */
static size_t make_wrec(uint8_t *out, uint32_t stag, uint64_t to, uint32_t plen, uint32_t ml)
{
	struct dg_tagged_hdr h;
	dg_put_tagged(&h, RDMAP_WRITE_RECORD, plen == ml, stag, to, 1, 0, ml, (uint16_t)(plen == ml ? 0 : plen));
	memcpy(out, &h, sizeof h);
	memset(out + sizeof h, 0xab, plen);
	return sizeof h + plen;
}

Test(malformed, ud_every_kind_counted_and_never_placed, .init = NULL)
{
	setup(DGV_QPT_UD);
	uint8_t d[70000];
	uint64_t base = (uint64_t)(uintptr_t)region;
	size_t n;

	/* bad CRC */
	n = make_wrec(d, mr->rkey, base, 64, 64);
	d[n] = 1, d[n + 1] = 2, d[n + 2] = 3, d[n + 3] = 4;
	inject(d, n + 4, false);
	/* truncated: header cut short, CRC valid over what is there */
	inject(d, 10, true);
	/* shorter than a CRC */
	inject(d, 3, false);
	/* unknown opcodes 0x9..0xf */
	for (uint8_t op = 0x9; op <= 0xf; op++) {
		n = make_wrec(d, mr->rkey, base, 16, 16);
		d[1] = (uint8_t)((d[1] & 0xf0) | op);
		inject(d, n, true);
	}
	struct dgv_qp_stats st = settle();
	cr_assert_eq(st.crc_drops, 2, "crc drops %lu", (unsigned long)st.crc_drops);
	cr_assert_eq(st.malformed_drops, 8, "malformed %lu", (unsigned long)st.malformed_drops);

	/* bad STag, offset past the region, offset before it, absurd length */
	inject(d, make_wrec(d, mr->rkey ^ 0x5a, base, 64, 64), true);
	inject(d, make_wrec(d, mr->rkey, base + REGION - 10, 64, 64), true);
	inject(d, make_wrec(d, mr->rkey, base - 64, 64, 64), true);
	inject(d, make_wrec(d, mr->rkey, UINT64_MAX - 8, 64, 64), true);
	st = settle();
	cr_assert_eq(st.placement_rejects + st.malformed_drops, 8 + 4);
	cr_assert_geq(st.placement_rejects, 3);
	/* ml larger than the QP's maximum message */
	inject(d, make_wrec(d, mr->rkey, base, 300, 1u << 30), true);
	/* a header claiming more payload segments than fit, multi-segment with tiny segsz */
	struct dg_tagged_hdr h;
	dg_put_tagged(&h, RDMAP_WRITE_RECORD, false, mr->rkey, base, 2, 0, 100000, 16);
	memcpy(d, &h, sizeof h);
	inject(d, sizeof h + 16, true);
	/* an RD header sent to a UD QP */
	memset(d, 0, 64);
	d[0] = RD_MAGIC;
	inject(d, 64, true);
	st = settle();
	cr_assert_eq(st.malformed_drops, 8 + 3 + (st.placement_rejects == 3 ? 1 : 0),
		     "malformed %lu rejects %lu", (unsigned long)st.malformed_drops,
		     (unsigned long)st.placement_rejects);
	/* random garbage with valid CRCs */
	srand(1);
	for (int i = 0; i < 20000; i++) {
		size_t len = (size_t)(rand() % 200);
		for (size_t j = 0; j < len; j++)
			d[j] = (uint8_t)rand();
		if (len >= 2 && (i & 1)) {
			d[0] = (uint8_t)((d[0] & 0xc0) | 0x01); /* plausible versions get deeper */
			d[1] = (uint8_t)(0x40 | (d[1] & 0x0f));
		}
		inject(d, len, true);
		if (i % 500 == 0)
			settle();
	}
	settle();
	region_untouched();
	/* the QP still works afterwards */
	n = make_wrec(d, mr->rkey, base + 128, 32, 32);
	inject(d, n, true);
	struct dgv_wc wc;
	int got = 0;
	for (int i = 0; i < 200 && !got; i++) {
		got = dgv_poll_cq(cq, 1, &wc);
		if (!got)
			dgv_cq_wait(cq, 5);
	}
	cr_assert_eq(got, 1);
	cr_assert_eq(wc.opcode, DGV_WC_RECV_WRITE_RECORD);
	cr_assert_eq(region[128], 0xab);
	teardown();
}

Test(malformed, rd_garbage_never_crashes)
{
	setup(DGV_QPT_RD);
	uint8_t d[2048];
	srand(2);
	for (int i = 0; i < 20000; i++) {
		size_t len = (size_t)(rand() % 300);
		for (size_t j = 0; j < len; j++)
			d[j] = (uint8_t)rand();
		if (len > 0 && (i & 1))
			d[0] = RD_MAGIC;
		inject(d, len, true);
		if (i % 500 == 0)
			settle();
	}
	struct dgv_qp_stats st = settle();
	cr_assert_gt(st.malformed_drops, 0);
	region_untouched();
	teardown();
}
