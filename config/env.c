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
	[DG_ENV_LOG] = {.name = "DGSHIM_LOG", .kind = K_STR},
	[DG_ENV_LOG_FILE] = {.name = "DGSHIM_LOG_FILE", .kind = K_STR},
	[DG_ENV_CONF] = {.name = "DGSHIM_CONF", .kind = K_STR, .secure = true},
	[DG_ENV_MODE] = {.name = "DGSHIM_MODE", .kind = K_STR, .secure = true},
	[DG_ENV_RULES] = {.name = "DGSHIM_RULES", .kind = K_STR, .secure = true},
	[DG_ENV_PROVIDER] = {.name = "DGSHIM_PROVIDER", .kind = K_WORD, .dflt = DG_PROVIDER_AUTO,
			     .words = {{"auto", DG_PROVIDER_AUTO}, {"soft", DG_PROVIDER_SOFT},
				       {"ibverbs", DG_PROVIDER_IBVERBS}},
			     .expect = "soft, ibverbs or auto"},
	[DG_ENV_IBV_DEVICE] = {.name = "DGSHIM_IBV_DEVICE", .kind = K_STR},
	[DG_ENV_IBV_LIB] = {.name = "DGSHIM_IBV_LIB", .kind = K_STR, .secure = true},
	[DG_ENV_RDMACM_LIB] = {.name = "DGSHIM_RDMACM_LIB", .kind = K_STR, .secure = true},
	[DG_ENV_PROGRESS] = {.name = "DGSHIM_PROGRESS", .kind = K_WORD, .dflt = DG_PROGRESS_AUTO,
			     .words = {{"auto", DG_PROGRESS_AUTO}, {"app", DG_PROGRESS_APP},
				       {"thread", DG_PROGRESS_THREAD}},
			     .expect = "auto, app or thread"},
	[DG_ENV_MPA_CRC] = {.name = "DGSHIM_MPA_CRC", .kind = K_WORD, .dflt = DG_ON,
			    .words = {{"on", DG_ON}, {"off", DG_OFF}, {"1", DG_ON}, {"0", DG_OFF}},
			    .expect = "on or off"},
	[DG_ENV_FAULT_TX] = {.name = "DGSHIM_FAULT_TX", .kind = K_STR},
	[DG_ENV_FAULT_RX] = {.name = "DGSHIM_FAULT_RX", .kind = K_STR},
	[DG_ENV_SPIN_US] = {.name = "DGSHIM_SPIN_US", .kind = K_LONG, .lo = 0, .hi = 100000, .dflt = 20,
			    .expect = "0..100000 microseconds"},
	[DG_ENV_ZCOPY_THRESHOLD] = {.name = "DGSHIM_ZCOPY_THRESHOLD", .kind = K_LONG, .lo = 0, .hi = 0x7fffffff, .dflt = -1,
				    .expect = "a byte count"},
	[DG_ENV_STREAM_BUF] = {.name = "DGSHIM_STREAM_BUF", .kind = K_STR},
	[DG_ENV_DISCOVERY] = {.name = "DGSHIM_DISCOVERY", .kind = K_WORD, .dflt = DG_ON,
			      .words = {{"on", DG_ON}, {"off", DG_OFF}}, .expect = "on or off"},
	[DG_ENV_DISCOVERY_PORT] = {.name = "DGSHIM_DISCOVERY_PORT", .kind = K_LONG, .lo = 0, .hi = 65535, .dflt = 18517,
				   .expect = "0 (off) or 1..65535"},
	[DG_ENV_STATS] = {.name = "DGSHIM_STATS", .kind = K_WORD, .dflt = DG_ON,
			  .words = {{"on", DG_ON}, {"off", DG_OFF}}, .expect = "on or off"},
	[DG_ENV_UDP_GSO] = {.name = "DGSHIM_UDP_GSO", .kind = K_WORD, .dflt = DG_ON,
			    .words = {{"on", DG_ON}, {"off", DG_OFF}}, .expect = "on or off"},
	[DG_ENV_DEST_IDLE_MS] = {.name = "DGSHIM_DEST_IDLE_MS", .kind = K_LONG, .lo = 100, .hi = 86400000,
				 .dflt = 60000, .expect = "100..86400000 milliseconds"},
	[DG_ENV_STREAM_IDLE_MS] = {.name = "DGSHIM_STREAM_IDLE_MS", .kind = K_LONG, .lo = 0, .hi = 86400000,
				   .dflt = 1000, .expect = "0..86400000 milliseconds (0: never)"},
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
