/*
 * wait_wc.h - shared by the Criterion suites that drive soft queue pairs (test_verbs.c,
 * test_gso.c): waiting for one completion on a CQ.
 */
#ifndef DG_TEST_WAIT_WC_H
#define DG_TEST_WAIT_WC_H

#include <criterion/criterion.h>
#include <errno.h>

#include "dgverbs.h"

/* Polls cq until one completion arrives or timeout_ms passes; returns 1 or 0. */
static inline int cq_wait_one(struct dgv_cq *cq, struct dgv_wc *wc, int timeout_ms)
{
	for (;;) {
		int n = dgv_poll_cq(cq, 1, wc);
		cr_assert_geq(n, 0);
		if (n == 1)
			return 1;
		int r = dgv_cq_wait(cq, timeout_ms);
		if (r == -ETIMEDOUT)
			return dgv_poll_cq(cq, 1, wc) == 1;
		cr_assert_eq(r, 0);
	}
}

#endif
