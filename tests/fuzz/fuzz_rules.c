/*
 * fuzz_rules.c - the rules file and environment parsers (config/rules.c): DGSHIM_RULES inline
 * rules, the rules file (read through a memfd, so getc and every line-reading branch run),
 * dg_rules_from_env with DGSHIM_MODE, DGSHIM_RULES and DGSHIM_CONF, and the fault
 * specification parser of DGSHIM_FAULT_TX/RX (dgv_fault_parse).
 *
 * Input: a selector byte, then text. The environment form splits the text at NUL bytes into
 * DGSHIM_MODE, DGSHIM_RULES and the file's contents.
 * Oracles (rules.h): every build gives a usable object; an error costs exactly one
 * dg_log_always() line and leaves an object that says off for every socket, success costs
 * none; dg_rules_match() only ever answers a mode that fits the socket's protocol.
 * dg_log_always is wrapped (-Wl,--wrap) to count lines and format them without writing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dgverbs.h"
#include "fuzz.h"
#include "rules.h"

static unsigned log_lines;
static int memfd = -1;
static char memfd_path[64];

void __wrap_dg_log_always(const char *fmt, ...);
void __wrap_dg_log_always(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	FUZZ_CHECK(n >= 0);
	log_lines++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	memfd = memfd_create("dgshim-fuzz-rules", MFD_CLOEXEC);
	FUZZ_CHECK(memfd >= 0);
	snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
	return 0;
}

static void put_file(const char *p, size_t n)
{
	FUZZ_CHECK(ftruncate(memfd, 0) == 0);
	FUZZ_CHECK(pwrite(memfd, p, n, 0) == (ssize_t)n);
}

/* Asks r about a spread of sockets: both protocols, both roles, v4, v6, v4-mapped, none. */
static void probe(const struct dg_rules *r, int rc)
{
	static const char *v4[] = {"127.0.0.1", "10.1.2.3", "224.0.0.251", "0.0.0.0"};
	static const char *v6[] = {"::1", "ff02::fb", "::ffff:10.1.2.3", "2001:db8::1"};
	static const uint16_t ports[] = {53, 5353, 20000, 0, 65535, 123};
	static const int protos[] = {IPPROTO_UDP, IPPROTO_TCP};
	FUZZ_CHECK(r != NULL);
	FUZZ_CHECK(dg_rules_program(r) != NULL);
	FUZZ_CHECK(rc == 0 || dg_rules_disabled(r));
	for (unsigned k = 0; k < 2; k++)
		for (int role = DG_ROLE_ANY; role <= DG_ROLE_RECEIVER; role++) {
			int proto = protos[k];
			const char *where = NULL;
			enum iwarp_mode m = dg_rules_match_where(r, proto, role, NULL, 0, &where);
			FUZZ_CHECK(where && dg_mode_fits(proto, (int)m));
			for (unsigned i = 0; i < 4; i++) {
				struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ports[(i + role) % 6])};
				inet_pton(AF_INET, v4[i], &a.sin_addr);
				m = dg_rules_match_where(r, proto, role, (struct sockaddr *)&a, sizeof a, &where);
				FUZZ_CHECK(where && dg_mode_fits(proto, (int)m));
				FUZZ_CHECK(!rc || m == IWARP_MODE_OFF);
				struct sockaddr_in6 b = {.sin6_family = AF_INET6, .sin6_port = htons(ports[(i + k) % 6])};
				inet_pton(AF_INET6, v6[i], &b.sin6_addr);
				m = dg_rules_match(r, proto, role, (struct sockaddr *)&b, sizeof b);
				FUZZ_CHECK(dg_mode_fits(proto, (int)m));
				FUZZ_CHECK(!rc || m == IWARP_MODE_OFF);
			}
		}
}

static void build(const struct dg_rules_config *cfg)
{
	struct dg_rules *r = NULL;
	log_lines = 0;
	int rc = dg_rules_build(cfg, &r);
	FUZZ_CHECK(rc <= 0);
	FUZZ_CHECK(log_lines == (rc ? 1u : 0u));
	probe(r, rc);
	dg_rules_free(r);
}

static void from_env(char *text, size_t n)
{
	/* text is NUL-terminated at n: three NUL-separated parts, missing ones unset */
	char *mode = text, *rules = NULL, *file = NULL;
	size_t l = strlen(mode);
	if (l < n) {
		rules = mode + l + 1;
		size_t l2 = strlen(rules);
		if ((size_t)(rules + l2 - text) < n)
			file = rules + l2 + 1;
	}
	setenv("DGSHIM_MODE", mode, 1);
	if (rules)
		setenv("DGSHIM_RULES", rules, 1);
	else
		unsetenv("DGSHIM_RULES");
	if (file) {
		put_file(file, n - (size_t)(file - text));
		setenv("DGSHIM_CONF", memfd_path, 1);
	} else {
		unsetenv("DGSHIM_CONF"); /* the default /etc/dgshim.conf: absent is fine */
	}
	struct dg_rules *r = NULL;
	log_lines = 0;
	int rc = dg_rules_from_env(&r);
	FUZZ_CHECK(rc <= 0);
	FUZZ_CHECK(log_lines == (rc ? 1u : 0u));
	enum iwarp_mode m;
	if (*mode && dg_mode_parse(mode, &m) < 0)
		FUZZ_CHECK(rc == -EINVAL);
	probe(r, rc);
	dg_rules_free(r);
}

static void fault_spec(const char *text)
{
	struct dgv_fault f;
	const char *why = NULL;
	if (dgv_fault_parse(text, &f, &why)) {
		FUZZ_CHECK(why != NULL);
		return;
	}
	FUZZ_CHECK(f.loss_pct >= 0 && f.loss_pct <= 100);
	FUZZ_CHECK(f.burst_pct >= 0 && f.burst_pct <= 100);
	FUZZ_CHECK(f.reorder_pct >= 0 && f.reorder_pct <= 100);
	FUZZ_CHECK(f.dup_pct >= 0 && f.dup_pct <= 100);
	FUZZ_CHECK(f.corrupt_pct >= 0 && f.corrupt_pct <= 100);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t n = size - 1;
	char *text = malloc(n + 1);
	memcpy(text, data + 1, n);
	text[n] = 0;
	struct dg_rules_config cfg = {.fallback = IWARP_MODE_AUTO, .exe = "/usr/bin/fuzzprog",
				      .argv0 = "fuzzprog"};
	switch (data[0] % 5) {
	case 0:
		cfg.inline_rules = text;
		build(&cfg);
		break;
	case 1:
		put_file(text, n);
		cfg.path = memfd_path;
		cfg.path_required = 1;
		build(&cfg);
		break;
	case 2:
		from_env(text, n);
		break;
	case 3: {
		enum iwarp_mode m = IWARP_MODE_OFF;
		if (dg_mode_parse(text, &m) == 0)
			FUZZ_CHECK(dg_mode_valid((int)m) && strcmp(dg_mode_name((int)m), "invalid") != 0);
		fault_spec(text);
		break;
	}
	default:
		/* the inline rules and the file together, split at the first NUL */
		cfg.inline_rules = text;
		size_t l = strlen(text);
		put_file(l < n ? text + l + 1 : "", l < n ? n - l - 1 : 0);
		cfg.path = memfd_path;
		cfg.fallback = (enum iwarp_mode)(data[0] / 5 % 6); /* 5 is not a mode: an error */
		build(&cfg);
		break;
	}
	free(text);
	return 0;
}
