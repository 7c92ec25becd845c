/* log.c - stderr diagnostics gated by DGSHIM_LOG. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int g_level = -1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void level_init(void)
{
	const char *s = getenv("DGSHIM_LOG");
	int lvl = DG_LOG_OFF;
	if (s && *s) {
		static const char *names[] = {"off", "error", "warn", "info", "debug"};
		if (s[0] >= '0' && s[0] <= '9' && s[1] == 0)
			lvl = s[0] - '0' > DG_LOG_DEBUG ? DG_LOG_DEBUG : s[0] - '0';
		else
			for (int i = 0; i <= DG_LOG_DEBUG; i++)
				if (!strcasecmp(s, names[i]))
					lvl = i;
	}
	g_level = lvl;
}

int dg_log_level(void)
{
	if (__builtin_expect(g_level < 0, 0))
		pthread_once(&g_once, level_init);
	return g_level;
}

static void vlog(const char *tag, const char *fmt, va_list ap)
{
	char buf[1024];
	int n = snprintf(buf, sizeof buf, "dgshim[%d]: %s: ", (int)getpid(), tag);
	if (n < 0)
		return;
	int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
	if (m < 0)
		return;
	size_t len = (size_t)n + (size_t)m;
	if (len > sizeof buf - 2)
		len = sizeof buf - 2;
	buf[len++] = '\n';
	ssize_t w = write(2, buf, len);
	(void)w;
}

void dg_log(int level, const char *fmt, ...)
{
	static const char *tags[] = {"off", "error", "warn", "info", "debug"};
	va_list ap;
	va_start(ap, fmt);
	vlog(tags[level < 0 ? 0 : level > DG_LOG_DEBUG ? DG_LOG_DEBUG : level], fmt, ap);
	va_end(ap);
}

void dg_log_always(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("error", fmt, ap);
	va_end(ap);
}
