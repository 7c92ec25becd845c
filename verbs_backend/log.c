/* log.c - diagnostics gated by DGSHIM_LOG, on stderr or in DGSHIM_LOG_FILE. */
#include "log.h"

#include "env.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static int g_level = -1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void log_warn_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void level_init(void)
{
	const char *s = dg_env_str(DG_ENV_LOG);
	int lvl = DG_LOG_OFF;
	bool bad = false;
	if (s && *s) {
		static const char *names[] = {"off", "error", "warn", "info", "debug"};
		bad = true;
		if (s[0] >= '0' && s[0] <= '9' && s[1] == 0) {
			lvl = s[0] - '0' > DG_LOG_DEBUG ? DG_LOG_DEBUG : s[0] - '0';
			bad = false;
		} else {
			for (int i = 0; i <= DG_LOG_DEBUG; i++)
				if (!strcasecmp(s, names[i]))
					lvl = i, bad = false;
		}
	}
	/* Whoever set it wanted to hear something: a typo gives warnings and says so, where
	 * silence would look like "no problems". */
	if (bad)
		lvl = DG_LOG_WARN;
	g_level = lvl;
	if (bad) {
		char q[48];
		snprintf(q, sizeof q, "%s", s);
		log_warn_always("DGSHIM_LOG=%s%s is not a level (off, error, warn, info, debug or 0-4); "
				"using warn", q, strlen(s) >= sizeof q ? "..." : "");
	}
}

int dg_log_level(void)
{
	if (__builtin_expect(g_level < 0, 0))
		pthread_once(&g_once, level_init);
	return g_level;
}

/*
 * DGSHIM_LOG_FILE: for programs whose stderr is not the user's (daemons, a terminal UI, stderr
 * to /dev/null). %p is the pid, so each process of a tree (fork, exec) has its own file. The
 * descriptor is checked before every line: a program that closed it and got the number back
 * for a file of its own must not receive our lines; a forked child opens its own path.
 */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int out_fd = -1;
static pid_t out_pid;
static dev_t out_dev;
static ino_t out_ino;
static bool out_failed;

static bool out_is_ours(int fd)
{
	struct stat st;
	return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == out_dev && st.st_ino == out_ino;
}

/* path with %p as the pid and %% as %; 0, or -ENAMETOOLONG */
static int expand(const char *tmpl, pid_t pid, char *out, size_t size)
{
	size_t n = 0;
	for (const char *p = tmpl; *p; p++) {
		char num[16];
		const char *add = p;
		size_t len = 1;
		if (p[0] == '%' && p[1] == 'p') {
			len = (size_t)snprintf(num, sizeof num, "%d", (int)pid);
			add = num, p++;
		} else if (p[0] == '%' && p[1] == '%') {
			p++;
		}
		if (n + len >= size)
			return -ENAMETOOLONG;
		memcpy(out + n, add, len);
		n += len;
	}
	out[n] = 0;
	return 0;
}

static void say_stderr(const char *msg)
{
	ssize_t w = write(2, msg, strlen(msg));
	(void)w;
}

/* a fork while another thread wrote a line must not leave the child's lock held */
static void out_child(void) { pthread_mutex_init(&out_lock, NULL); }
static pthread_once_t out_once = PTHREAD_ONCE_INIT;
static void out_once_fn(void) { pthread_atfork(NULL, NULL, out_child); }

/* The descriptor for a line: the log file's, or 2. Needs out_lock. */
static int out_get(void)
{
	const char *tmpl = dg_env_str(DG_ENV_LOG_FILE);
	if (!tmpl)
		return 2;
	pid_t pid = getpid();
	if (out_pid == pid && out_failed)
		return 2;
	if (out_pid == pid && out_is_ours(out_fd))
		return out_fd;
	if (out_pid != pid && out_is_ours(out_fd))
		close(out_fd); /* the parent's, inherited: the parent keeps its own */
	out_fd = -1, out_pid = pid, out_failed = false;
	char path[4096];
	int rc = expand(tmpl, pid, path, sizeof path);
	int fd = rc ? -1 : open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		char msg[4400];
		snprintf(msg, sizeof msg, "dgshim[%d]: error: DGSHIM_LOG_FILE=%s: %s; diagnostics on stderr\n",
			 (int)pid, tmpl, strerror(rc ? -rc : errno));
		say_stderr(msg);
		out_failed = true;
		return 2;
	}
	/* away from the small numbers programs reuse and close in loops */
	int hi = fcntl(fd, F_DUPFD_CLOEXEC, 500);
	if (hi >= 0) {
		close(fd);
		fd = hi;
	}
	struct stat st;
	if (fstat(fd, &st)) {
		close(fd);
		out_failed = true;
		return 2;
	}
	out_fd = fd, out_dev = st.st_dev, out_ino = st.st_ino;
	return fd;
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
	pthread_once(&out_once, out_once_fn);
	pthread_mutex_lock(&out_lock);
	ssize_t w = write(out_get(), buf, len);
	pthread_mutex_unlock(&out_lock);
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

static void log_warn_always(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("warn", fmt, ap);
	va_end(ap);
}
