/* env.c - the table of DGSHIM_* environment variables and their only reader (env.h). */
#include "env.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"

enum kind { K_STR, K_LONG, K_WORD };

struct word {
	const char *w;
	int v; /* what dg_env_word returns for it */
};

struct var {
	const char *name;
	enum kind kind;
	/* read with secure_getenv: it names a file to load or rules to obey, which a set-uid
	 * program must not take from its caller */
	bool secure;
	long lo, hi, dflt;     /* K_LONG; K_WORD: dflt is the value when unset */
	struct word words[6];  /* K_WORD */
	const char *expect;    /* what a bad value is told */
};

static const struct var vars[DG_ENV_COUNT] = {
	[DG_ENV_LOG] = {"DGSHIM_LOG", K_STR},
	[DG_ENV_LOG_FILE] = {"DGSHIM_LOG_FILE", K_STR},
	[DG_ENV_CONF] = {"DGSHIM_CONF", K_STR, .secure = true},
	[DG_ENV_MODE] = {"DGSHIM_MODE", K_STR, .secure = true},
	[DG_ENV_RULES] = {"DGSHIM_RULES", K_STR, .secure = true},
	[DG_ENV_PROVIDER] = {"DGSHIM_PROVIDER", K_WORD, .dflt = DG_PROVIDER_AUTO,
			     .words = {{"auto", DG_PROVIDER_AUTO}, {"soft", DG_PROVIDER_SOFT},
				       {"ibverbs", DG_PROVIDER_IBVERBS}},
			     .expect = "soft, ibverbs or auto"},
	[DG_ENV_IBV_DEVICE] = {"DGSHIM_IBV_DEVICE", K_STR},
	[DG_ENV_IBV_LIB] = {"DGSHIM_IBV_LIB", K_STR, .secure = true},
	[DG_ENV_RDMACM_LIB] = {"DGSHIM_RDMACM_LIB", K_STR, .secure = true},
	[DG_ENV_PROGRESS] = {"DGSHIM_PROGRESS", K_WORD, .dflt = DG_PROGRESS_AUTO,
			     .words = {{"auto", DG_PROGRESS_AUTO}, {"app", DG_PROGRESS_APP},
				       {"thread", DG_PROGRESS_THREAD}},
			     .expect = "auto, app or thread"},
	[DG_ENV_MPA_CRC] = {"DGSHIM_MPA_CRC", K_WORD, .dflt = DG_ON,
			    .words = {{"on", DG_ON}, {"off", DG_OFF}, {"1", DG_ON}, {"0", DG_OFF}},
			    .expect = "on or off"},
	[DG_ENV_FAULT_TX] = {"DGSHIM_FAULT_TX", K_STR},
	[DG_ENV_FAULT_RX] = {"DGSHIM_FAULT_RX", K_STR},
	[DG_ENV_SPIN_US] = {"DGSHIM_SPIN_US", K_LONG, .lo = 0, .hi = 100000, .dflt = 20,
			    .expect = "0..100000 microseconds"},
	[DG_ENV_ZCOPY_THRESHOLD] = {"DGSHIM_ZCOPY_THRESHOLD", K_LONG, .lo = 0, .hi = 0x7fffffff, .dflt = -1,
				    .expect = "a byte count"},
	[DG_ENV_STREAM_BUF] = {"DGSHIM_STREAM_BUF", K_STR},
	[DG_ENV_DISCOVERY] = {"DGSHIM_DISCOVERY", K_WORD, .dflt = DG_ON,
			      .words = {{"on", DG_ON}, {"off", DG_OFF}}, .expect = "on or off"},
	[DG_ENV_DISCOVERY_PORT] = {"DGSHIM_DISCOVERY_PORT", K_LONG, .lo = 0, .hi = 65535, .dflt = 18517,
				   .expect = "0 (off) or 1..65535"},
	[DG_ENV_STATS] = {"DGSHIM_STATS", K_WORD, .dflt = DG_ON,
			  .words = {{"on", DG_ON}, {"off", DG_OFF}}, .expect = "on or off"},
};

/* one complaint per variable and process, however often it is read */
static atomic_bool said[DG_ENV_COUNT];

const char *dg_env_name(enum dg_env v)
{
	return (unsigned)v < DG_ENV_COUNT ? vars[v].name : "DGSHIM_?";
}

const char *dg_env_str(enum dg_env v)
{
	if ((unsigned)v >= DG_ENV_COUNT)
		return NULL;
	const char *s = vars[v].secure ? secure_getenv(vars[v].name) : getenv(vars[v].name);
	return s && *s ? s : NULL;
}

long dg_env_long(enum dg_env v)
{
	const char *s = dg_env_str(v);
	if (!s || vars[v].kind != K_LONG)
		return (unsigned)v < DG_ENV_COUNT ? vars[v].dflt : 0;
	char *end;
	errno = 0;
	long l = strtol(s, &end, 10);
	if (*end || errno || l < vars[v].lo || l > vars[v].hi) {
		if (!atomic_exchange(&said[v], true)) {
			if (vars[v].dflt >= 0)
				dg_log_always("%s=%.64s: expected %s; using %ld", vars[v].name, s, vars[v].expect,
					      vars[v].dflt);
			else
				dg_log_always("%s=%.64s: expected %s; using the default", vars[v].name, s,
					      vars[v].expect);
		}
		return vars[v].dflt;
	}
	return l;
}

int dg_env_word(enum dg_env v)
{
	const char *s = dg_env_str(v);
	if ((unsigned)v >= DG_ENV_COUNT || vars[v].kind != K_WORD)
		return -EINVAL;
	if (!s)
		return (int)vars[v].dflt;
	for (const struct word *w = vars[v].words; w < vars[v].words + 6 && w->w; w++)
		if (!strcasecmp(s, w->w))
			return w->v;
	if (!atomic_exchange(&said[v], true))
		dg_log_always("%s=%.64s: unknown value (expected %s)", vars[v].name, s, vars[v].expect);
	return -EINVAL;
}
