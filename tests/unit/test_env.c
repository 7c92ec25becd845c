/* test_env.c - config/env.c: the one reader of DGSHIM_* variables, and the capabilities a
 * provider answers (dgv_query_caps), which the shim decides by. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgverbs.h"
#include "env.h"

Test(env, names_and_strings)
{
	cr_assert_str_eq(dg_env_name(DG_ENV_LOG), "DGSHIM_LOG");
	cr_assert_str_eq(dg_env_name(DG_ENV_DISCOVERY_PORT), "DGSHIM_DISCOVERY_PORT");
	cr_assert_str_eq(dg_env_name(DG_ENV_COUNT), "DGSHIM_?");
	for (int v = 0; v < DG_ENV_COUNT; v++)
		cr_assert_eq(strncmp(dg_env_name(v), "DGSHIM_", 7), 0, "%d", v);
	unsetenv("DGSHIM_IBV_DEVICE");
	cr_assert_null(dg_env_str(DG_ENV_IBV_DEVICE));
	setenv("DGSHIM_IBV_DEVICE", "", 1);
	cr_assert_null(dg_env_str(DG_ENV_IBV_DEVICE), "empty reads as unset");
	setenv("DGSHIM_IBV_DEVICE", "rxe0", 1);
	cr_assert_str_eq(dg_env_str(DG_ENV_IBV_DEVICE), "rxe0");
}

Test(env, numbers)
{
	unsetenv("DGSHIM_SPIN_US");
	cr_assert_eq(dg_env_long(DG_ENV_SPIN_US), 20);
	setenv("DGSHIM_SPIN_US", "0", 1);
	cr_assert_eq(dg_env_long(DG_ENV_SPIN_US), 0);
	setenv("DGSHIM_SPIN_US", "100000", 1);
	cr_assert_eq(dg_env_long(DG_ENV_SPIN_US), 100000);
	setenv("DGSHIM_DISCOVERY_PORT", "65535", 1);
	cr_assert_eq(dg_env_long(DG_ENV_DISCOVERY_PORT), 65535);
	unsetenv("DGSHIM_ZCOPY_THRESHOLD");
	cr_assert_eq(dg_env_long(DG_ENV_ZCOPY_THRESHOLD), -1, "unset: the caller's default");
}

Test(env, bad_number_said_once, .init = cr_redirect_stderr)
{
	setenv("DGSHIM_SPIN_US", "100001", 1);
	cr_assert_eq(dg_env_long(DG_ENV_SPIN_US), 20);
	setenv("DGSHIM_SPIN_US", "12x", 1);
	cr_assert_eq(dg_env_long(DG_ENV_SPIN_US), 20);
	setenv("DGSHIM_DISCOVERY_PORT", "99999999999999999999999", 1);
	cr_assert_eq(dg_env_long(DG_ENV_DISCOVERY_PORT), 18517, "overflow gives the default");
	fflush(stderr);
	FILE *err = cr_get_redirected_stderr();
	char line[512];
	cr_assert_not_null(fgets(line, sizeof line, err));
	cr_assert_not_null(strstr(line, "DGSHIM_SPIN_US=100001: expected 0..100000 microseconds; using 20"), "%s", line);
	cr_assert_not_null(fgets(line, sizeof line, err));
	cr_assert_not_null(strstr(line, "DGSHIM_DISCOVERY_PORT="), "the second bad SPIN_US is not said again: %s", line);
	cr_assert_null(fgets(line, sizeof line, err));
}

Test(env, words)
{
	unsetenv("DGSHIM_PROVIDER");
	cr_assert_eq(dg_env_word(DG_ENV_PROVIDER), DG_PROVIDER_AUTO);
	setenv("DGSHIM_PROVIDER", "IBVerbs", 1);
	cr_assert_eq(dg_env_word(DG_ENV_PROVIDER), DG_PROVIDER_IBVERBS);
	setenv("DGSHIM_PROVIDER", "soft", 1);
	cr_assert_eq(dg_env_word(DG_ENV_PROVIDER), DG_PROVIDER_SOFT);
	setenv("DGSHIM_MPA_CRC", "0", 1);
	cr_assert_eq(dg_env_word(DG_ENV_MPA_CRC), DG_OFF);
	setenv("DGSHIM_MPA_CRC", "on", 1);
	cr_assert_eq(dg_env_word(DG_ENV_MPA_CRC), DG_ON);
	setenv("DGSHIM_PROGRESS", "thread", 1);
	cr_assert_eq(dg_env_word(DG_ENV_PROGRESS), DG_PROGRESS_THREAD);
	cr_assert_eq(dg_env_word(DG_ENV_SPIN_US), -EINVAL, "not a word variable");
}

Test(env, bad_word_refused_and_said, .init = cr_redirect_stderr)
{
	setenv("DGSHIM_PROVIDER", "verbs", 1);
	cr_assert_eq(dg_env_word(DG_ENV_PROVIDER), -EINVAL);
	fflush(stderr);
	FILE *err = cr_get_redirected_stderr();
	char line[512];
	cr_assert_not_null(fgets(line, sizeof line, err));
	cr_assert_not_null(strstr(line, "DGSHIM_PROVIDER=verbs: unknown value (expected soft, ibverbs or auto)"), "%s", line);
	/* dgv_open with the provider from the environment refuses the same value */
	struct dgv_context *c = NULL;
	cr_assert_eq(dgv_open(NULL, &c), -EINVAL);
}

Test(caps, soft_provider)
{
	unsetenv("DGSHIM_PROVIDER");
	struct dgv_context *c;
	cr_assert_eq(dgv_open(&(struct dgv_context_attr){.provider = DGV_PROV_SOFT}, &c), 0);
	struct dgv_caps k;
	cr_assert_eq(dgv_query_caps(c, &k), 0);
	cr_assert_eq(k.qp_types, 1u << DGV_QPT_UD | 1u << DGV_QPT_RD | 1u << DGV_QPT_RC);
	cr_assert(k.flags & DGV_CAP_ADOPT_FD);
	cr_assert(k.flags & DGV_CAP_PEEK);
	cr_assert(k.flags & DGV_CAP_BACKGROUND);
	cr_assert_not(k.flags & DGV_CAP_ARM_ONCE, "an eventfd that any completion raises");
	cr_assert_not(k.flags & DGV_CAP_UD_SIDR);
	cr_assert_geq(k.max_msg_size, 65536u);
	cr_assert_eq(dgv_query_caps(NULL, &k), -EINVAL);
	cr_assert_eq(dgv_query_caps(c, NULL), -EINVAL);
	dgv_close(c);
}
