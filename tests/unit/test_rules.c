/*
 * test_rules.c - the rules that decide, per socket, whether the shim takes it and in which mode:
 * every dimension matching and not matching, first match wins, prefixes, ranges, globs, the
 * built-in exceptions, DGSHIM_MODE/CONF/RULES, and every malformed file (exactly one error line
 * naming file and line, and then the OS for every socket).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "rules.h"

#define UDP IPPROTO_UDP
#define TCP IPPROTO_TCP
#define SND DG_ROLE_SENDER
#define RCV DG_ROLE_RECEIVER

static void quiet_env(void)
{
	/* Each test runs in its own process: nothing here leaks into another test. */
	unsetenv("DGSHIM_LOG");
	unsetenv("DGSHIM_CONF");
	unsetenv("DGSHIM_MODE");
	unsetenv("DGSHIM_RULES");
}

TestSuite(mode, .init = quiet_env);
TestSuite(match, .init = quiet_env);
TestSuite(builtin, .init = quiet_env);
TestSuite(env, .init = quiet_env);
TestSuite(malformed, .init = quiet_env);
TestSuite(file, .init = quiet_env);

/* ------------------------------------------------------------------ helpers */

/* A temporary rules file holding text (len bytes, or strlen). The name is in a static buffer. */
static const char *write_rules_n(const char *text, size_t len)
{
	static char path[64];
	snprintf(path, sizeof path, "/tmp/dgshim-rules-XXXXXX");
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

static const char *write_rules(const char *text)
{
	return write_rules_n(text, strlen(text));
}

/* stderr into a pipe between begin and end; end returns what was written (static buffer). */
static int saved_fd = -1, pipe_rd = -1;

static void capture_begin(void)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	fflush(stderr);
	saved_fd = dup(2);
	cr_assert_geq(saved_fd, 0);
	cr_assert_geq(dup2(p[1], 2), 0);
	close(p[1]);
	pipe_rd = p[0];
}

static const char *capture_end(void)
{
	static char buf[8192];
	fflush(stderr);
	dup2(saved_fd, 2);
	close(saved_fd);
	size_t n = 0;
	ssize_t k;
	while (n < sizeof buf - 1 && (k = read(pipe_rd, buf + n, sizeof buf - 1 - n)) > 0)
		n += (size_t)k;
	buf[n] = 0;
	close(pipe_rd);
	return buf;
}

static unsigned count_lines(const char *s)
{
	unsigned n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* What one call that builds rules returned, and what it wrote on stderr (capture_end's buffer). */
struct loaded {
	int rc;
	const char *err;
};

static struct loaded load_env(struct dg_rules **r)
{
	capture_begin();
	int rc = dg_rules_from_env(r);
	return (struct loaded){rc, capture_end()};
}

static struct loaded load_file(const char *path, struct dg_rules **r)
{
	capture_begin();
	int rc = dg_rules_load(path, r);
	return (struct loaded){rc, capture_end()};
}

static struct loaded load_cfg(const struct dg_rules_config *cfg, struct dg_rules **r)
{
	capture_begin();
	int rc = dg_rules_build(cfg, r);
	return (struct loaded){rc, capture_end()};
}

/* Success, and not a word on stderr; what names the case in a failure. */
static void assert_quiet_ok(struct loaded l, const char *what)
{
	cr_assert_eq(l.rc, 0, "%s: rc %d, stderr: %s", what, l.rc, l.err);
	cr_assert_str_empty(l.err, "%s", what);
}

struct addr {
	struct sockaddr_storage ss;
	socklen_t len;
};

static struct addr A(const char *ip, unsigned port)
{
	struct addr a;
	memset(&a, 0, sizeof a);
	if (strchr(ip, ':')) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&a.ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons((uint16_t)port);
		cr_assert_eq(inet_pton(AF_INET6, ip, &s->sin6_addr), 1, "%s", ip);
		a.len = sizeof *s;
	} else {
		struct sockaddr_in *s = (struct sockaddr_in *)&a.ss;
		s->sin_family = AF_INET;
		s->sin_port = htons((uint16_t)port);
		cr_assert_eq(inet_pton(AF_INET, ip, &s->sin_addr), 1, "%s", ip);
		a.len = sizeof *s;
	}
	return a;
}

static enum iwarp_mode M(const struct dg_rules *r, int proto, int role, const char *ip, unsigned port)
{
	struct addr a = A(ip, port);
	return dg_rules_match(r, proto, role, (struct sockaddr *)&a.ss, a.len);
}

/* Rules for a process whose executable is exe (argv[0] the same), from text in a file;
 * asserts success and silence. */
static struct dg_rules *rules_for(const char *text, const char *exe, enum iwarp_mode fallback)
{
	struct dg_rules_config cfg = {.path = write_rules(text), .path_required = 1,
				      .fallback = fallback, .exe = exe, .argv0 = exe};
	struct dg_rules *r = NULL;
	struct loaded l = load_cfg(&cfg, &r);
	unlink(cfg.path);
	assert_quiet_ok(l, text);
	cr_assert_not_null(r);
	cr_assert_eq(dg_rules_disabled(r), 0);
	return r;
}

static struct dg_rules *rules(const char *text)
{
	return rules_for(text, "/usr/bin/testprog", IWARP_MODE_AUTO);
}

/* Every probe a disabled rules object must answer with off. */
static void assert_all_off(const struct dg_rules *r)
{
	static const char *ips[] = {"10.0.0.1", "127.0.0.1", "::1", "::ffff:10.0.0.1", "224.0.0.251",
				    "ff02::fb", "0.0.0.0", "::"};
	static const unsigned ports[] = {1, 53, 123, 5000, 5353, 65535};
	for (unsigned i = 0; i < sizeof ips / sizeof *ips; i++)
		for (unsigned j = 0; j < sizeof ports / sizeof *ports; j++)
			for (int role = 0; role <= 2; role++) {
				cr_assert_eq(M(r, UDP, role, ips[i], ports[j]), IWARP_MODE_OFF, "%s:%u", ips[i], ports[j]);
				cr_assert_eq(M(r, TCP, role, ips[i], ports[j]), IWARP_MODE_OFF, "%s:%u", ips[i], ports[j]);
			}
	cr_assert_eq(dg_rules_match(r, UDP, SND, NULL, 0), IWARP_MODE_OFF);
	cr_assert_eq(dg_rules_match(r, TCP, RCV, NULL, 0), IWARP_MODE_OFF);
	cr_assert_eq(dg_rules_disabled(r), 1);
	cr_assert_eq(dg_rules_count(r), 0u);
}

/* The error rc, exactly one line on stderr, holding needle (unless NULL), and rules r that leave
 * every socket to the OS. */
static void assert_one_error(struct loaded l, int rc, const char *needle, const struct dg_rules *r)
{
	cr_assert_eq(l.rc, rc, "rc %d, stderr: %s", l.rc, l.err);
	cr_assert_eq(count_lines(l.err), 1u, "expected one line, got: %s", l.err);
	if (needle)
		cr_assert_not_null(strstr(l.err, needle), "'%s' not in: %s", needle, l.err);
	cr_assert_not_null(r);
	assert_all_off(r);
}

/* ------------------------------------------------------------------ modes */

Test(mode, parse_names_any_case)
{
	static const struct { const char *s; enum iwarp_mode m; } ok[] = {
		{"off", IWARP_MODE_OFF}, {"ud", IWARP_MODE_UD}, {"rd", IWARP_MODE_RD}, {"rc", IWARP_MODE_RC},
		{"auto", IWARP_MODE_AUTO}, {"OFF", IWARP_MODE_OFF}, {"Ud", IWARP_MODE_UD}, {"rD", IWARP_MODE_RD},
		{"RC", IWARP_MODE_RC}, {"AuTo", IWARP_MODE_AUTO}};
	for (unsigned i = 0; i < sizeof ok / sizeof *ok; i++) {
		enum iwarp_mode m = (enum iwarp_mode)77;
		cr_assert_eq(dg_mode_parse(ok[i].s, &m), 0, "%s", ok[i].s);
		cr_assert_eq(m, ok[i].m, "%s", ok[i].s);
	}
}

Test(mode, parse_rejects_everything_else)
{
	static const char *bad[] = {"", "of", "offf", "ud ", " ud", "u d", "0", "1", "4", "udp", "tcp",
				    "none", "on", "auto\n", "rd,ud"};
	for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
		enum iwarp_mode m = (enum iwarp_mode)77;
		cr_assert_eq(dg_mode_parse(bad[i], &m), -EINVAL, "'%s'", bad[i]);
		cr_assert_eq((int)m, 77, "'%s' touched the output", bad[i]);
	}
	cr_assert_eq(dg_mode_parse(NULL, NULL), -EINVAL);
}

Test(mode, valid_values)
{
	for (int m = 0; m <= 4; m++)
		cr_assert_eq(dg_mode_valid(m), 1, "%d", m);
	static const int bad[] = {-1, 5, 42, -42, 255, 256, INT_MIN, INT_MAX};
	for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++)
		cr_assert_eq(dg_mode_valid(bad[i]), 0, "%d", bad[i]);
	cr_assert_eq(IWARP_MODE_OFF, 0);
	cr_assert_eq(IWARP_MODE_AUTO, 4);
}

Test(mode, names)
{
	cr_assert_str_eq(dg_mode_name(IWARP_MODE_OFF), "off");
	cr_assert_str_eq(dg_mode_name(IWARP_MODE_UD), "ud");
	cr_assert_str_eq(dg_mode_name(IWARP_MODE_RD), "rd");
	cr_assert_str_eq(dg_mode_name(IWARP_MODE_RC), "rc");
	cr_assert_str_eq(dg_mode_name(IWARP_MODE_AUTO), "auto");
	cr_assert_str_eq(dg_mode_name(5), "invalid");
	cr_assert_str_eq(dg_mode_name(-1), "invalid");
}

Test(mode, fits_protocol)
{
	cr_assert(dg_mode_fits(UDP, IWARP_MODE_OFF) && dg_mode_fits(TCP, IWARP_MODE_OFF));
	cr_assert(dg_mode_fits(UDP, IWARP_MODE_AUTO) && dg_mode_fits(TCP, IWARP_MODE_AUTO));
	cr_assert(dg_mode_fits(UDP, IWARP_MODE_UD) && !dg_mode_fits(TCP, IWARP_MODE_UD));
	cr_assert(dg_mode_fits(UDP, IWARP_MODE_RD) && !dg_mode_fits(TCP, IWARP_MODE_RD));
	cr_assert(!dg_mode_fits(UDP, IWARP_MODE_RC) && dg_mode_fits(TCP, IWARP_MODE_RC));
	cr_assert(!dg_mode_fits(UDP, 5) && !dg_mode_fits(TCP, -1));
	cr_assert(!dg_mode_fits(IPPROTO_SCTP, IWARP_MODE_OFF));
}

/* ------------------------------------------------------------------ matching */

Test(match, empty_file_gives_builtins_and_default)
{
	struct dg_rules *r = rules("");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5000), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, TCP, RCV, "::1", 80), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
	cr_assert_str_eq(dg_rules_program(r), "testprog");
	dg_rules_free(r);
}

Test(match, comments_blank_lines_crlf_bom)
{
	struct dg_rules *r = rules("\xef\xbb\xbf# first line after a byte order mark\r\n"
				   "\r\n"
				   "   \t  \n"
				   "   # indented comment\n"
				   "mode=ud port=5000   # trailing comment\r\n"
				   "MODE=RD PORT=6000\tPROTO=UDP\n"
				   "mode=rc port=7000"); /* no final newline */
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5000), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 6000), IWARP_MODE_RD);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 7000), IWARP_MODE_RC);
	dg_rules_free(r);
}

Test(match, proto)
{
	struct dg_rules *r = rules("mode=off proto=udp port=1000\n"
				   "mode=off proto=tcp port=2000\n"
				   "mode=off proto=any port=3000\n"
				   "mode=off proto=* port=4000\n");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 1000), IWARP_MODE_OFF);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 1000), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 2000), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 2000), IWARP_MODE_OFF);
	for (unsigned port = 3000; port <= 4000; port += 1000) {
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", port), IWARP_MODE_OFF);
		cr_assert_eq(M(r, TCP, SND, "10.0.0.1", port), IWARP_MODE_OFF);
	}
	/* protocols the shim does not carry are always off */
	struct addr a = A("10.0.0.1", 5000);
	cr_assert_eq(dg_rules_match(r, IPPROTO_SCTP, SND, (struct sockaddr *)&a.ss, a.len), IWARP_MODE_OFF);
	cr_assert_eq(dg_rules_match(r, 0, SND, (struct sockaddr *)&a.ss, a.len), IWARP_MODE_OFF);
	dg_rules_free(r);
}

Test(match, mode_implies_proto)
{
	/* a ud/rd rule is a UDP rule, an rc rule a TCP rule: never a mode that does not fit */
	struct dg_rules *r = rules("mode=ud port=5000\nmode=rc port=5000\nmode=rd\n");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5000), IWARP_MODE_UD);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 5000), IWARP_MODE_RC);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 9), IWARP_MODE_AUTO);
	dg_rules_free(r);
}

Test(match, role)
{
	struct dg_rules *r = rules("mode=ud role=sender port=1000\n"
				   "mode=rd role=receiver port=1000\n"
				   "mode=off role=any port=2000\n"
				   "mode=off role=* port=3000\n");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 1000), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, RCV, "10.0.0.1", 1000), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, DG_ROLE_ANY, "10.0.0.1", 1000), IWARP_MODE_AUTO, "unknown role: only role=any rules");
	for (int role = 0; role <= 2; role++) {
		cr_assert_eq(M(r, UDP, role, "10.0.0.1", 2000), IWARP_MODE_OFF);
		cr_assert_eq(M(r, UDP, role, "10.0.0.1", 3000), IWARP_MODE_OFF);
	}
	dg_rules_free(r);
}

Test(match, ipv4_prefixes)
{
	struct dg_rules *r = rules("mode=ud addr=192.168.1.7/32\n"
				   "mode=rd addr=192.168.1.0/24\n"
				   "mode=off addr=10.0.0.0/8\n"
				   "mode=ud addr=172.16.5.9\n" /* no prefix: /32 */
				   "mode=rd addr=100.64.1.2/10\n" /* host bits ignored: 100.64.0.0/10 */
				   "mode=auto addr=0.0.0.0/0\n");
	cr_assert_eq(M(r, UDP, SND, "192.168.1.7", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "192.168.1.8", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "192.168.1.255", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "192.168.2.1", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.255.255.255", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.0", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "11.0.0.0", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "9.255.255.255", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "172.16.5.9", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "172.16.5.8", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "100.127.255.1", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "100.128.0.1", 9), IWARP_MODE_AUTO);
	dg_rules_free(r);
}

Test(match, ipv4_slash0_matches_all_ipv4_only)
{
	struct dg_rules *r = rules_for("mode=ud addr=0.0.0.0/0\n", "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "1.2.3.4", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "255.255.255.255", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, RCV, "0.0.0.0", 0), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "::ffff:1.2.3.4", 9), IWARP_MODE_UD, "v4-mapped is IPv4");
	cr_assert_eq(M(r, UDP, SND, "::1", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "2001:db8::1", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, RCV, "::", 9), IWARP_MODE_OFF);
	dg_rules_free(r);
}

Test(match, ipv6_prefixes)
{
	struct dg_rules *r = rules_for("mode=ud addr=::1/128\n"
				       "mode=rd addr=2001:db8::/32\n"
				       "mode=auto addr=fe80::/10\n"
				       "mode=ud addr=2001:db9:1:2:3:4:5:6\n"
				       "mode=rd addr=::/0\n",
				       "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "::1", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "::2", 9), IWARP_MODE_RD, "falls to ::/0");
	cr_assert_eq(M(r, UDP, SND, "2001:db8:ffff::1", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "fe80::1234", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "febf:ffff::1", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "fec0::1", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "2001:db9:1:2:3:4:5:6", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "2001:db9:1:2:3:4:5:7", 9), IWARP_MODE_RD);
	/* ::/0 is "all IPv6": IPv4 and v4-mapped addresses are IPv4 and do not match it */
	cr_assert_eq(M(r, UDP, SND, "127.0.0.1", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "::ffff:127.0.0.1", 9), IWARP_MODE_OFF);
	dg_rules_free(r);
}

Test(match, ipv6_prefix_bits_inside_a_byte)
{
	struct dg_rules *r = rules_for("mode=ud addr=2001:db8:8000::/33\n", "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "2001:db8:8000::1", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "2001:db8:ffff::1", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "2001:db8:7fff::1", 9), IWARP_MODE_OFF);
	dg_rules_free(r);
}

Test(match, v4_mapped_addresses)
{
	/* v4-mapped addresses are matched as IPv4, and mapped rules are IPv4 rules */
	struct dg_rules *r = rules_for("mode=ud addr=127.0.0.0/8\n"
				       "mode=rd addr=::ffff:10.0.0.0/104\n" /* = 10.0.0.0/8 */
				       "mode=auto addr=::ffff:192.168.0.1\n", /* = 192.168.0.1/32 */
				       "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "::ffff:127.0.0.1", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "127.0.0.1", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.2.3.4", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "::ffff:10.2.3.4", 9), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "192.168.0.1", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "::ffff:192.168.0.1", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "::1", 9), IWARP_MODE_OFF, "::1 is not 127.0.0.1");
	cr_assert_eq(M(r, UDP, SND, "::127.0.0.1", 9), IWARP_MODE_OFF, "v4-compatible is plain IPv6");
	dg_rules_free(r);
}

Test(match, ports_and_ranges)
{
	struct dg_rules *r = rules_for("mode=ud port=5000-5100\n"
				       "mode=rd port=7000\n"
				       "mode=auto port=1-1\n"
				       "mode=rd port=65535\n"
				       "mode=ud port=65000-65535\n"
				       "mode=auto port=*\n",
				       "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 4999), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5000), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5050), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5100), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5101), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 7000), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 7001), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 1), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 65535), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 65534), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(match, port_zero_only_matches_star)
{
	/* bind to port 0 (any port): a range never matches it, port=* does */
	struct dg_rules *r = rules_for("mode=ud port=1-65535\nmode=rd port=*\n", "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, RCV, "0.0.0.0", 0), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, RCV, "::", 0), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, RCV, "0.0.0.0", 4000), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(match, all_dimensions_together)
{
	struct dg_rules *r = rules_for("mode=rd proto=udp role=sender addr=10.0.0.0/8 port=5000-5100 program=vlc\n",
				       "/usr/bin/vlc", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.1.1.1", 5000), IWARP_MODE_RD);
	cr_assert_eq(M(r, TCP, SND, "10.1.1.1", 5000), IWARP_MODE_OFF, "proto");
	cr_assert_eq(M(r, UDP, RCV, "10.1.1.1", 5000), IWARP_MODE_OFF, "role");
	cr_assert_eq(M(r, UDP, SND, "11.1.1.1", 5000), IWARP_MODE_OFF, "addr");
	cr_assert_eq(M(r, UDP, SND, "10.1.1.1", 5101), IWARP_MODE_OFF, "port");
	dg_rules_free(r);
	r = rules_for("mode=rd proto=udp role=sender addr=10.0.0.0/8 port=5000-5100 program=vlc\n",
		      "/usr/bin/sipp", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.1.1.1", 5000), IWARP_MODE_OFF, "program");
	dg_rules_free(r);
}

Test(match, first_match_wins)
{
	struct dg_rules *r = rules("mode=off addr=10.0.0.1\n"
				   "mode=ud addr=10.0.0.0/8\n"
				   "mode=rd addr=10.0.0.0/8\n" /* never reached */
				   "mode=rd port=6000\n"
				   "mode=ud port=6000\n");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.2", 9), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.2", 6000), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "11.0.0.2", 6000), IWARP_MODE_RD);
	const char *where = NULL;
	struct addr a = A("10.0.0.2", 9);
	cr_assert_eq(dg_rules_match_where(r, UDP, SND, (struct sockaddr *)&a.ss, a.len, &where), IWARP_MODE_UD);
	cr_assert_not_null(strstr(where, ":2"), "%s", where);
	cr_assert_not_null(strstr(where, "/tmp/dgshim-rules-"), "%s", where);
	a = A("11.0.0.2", 9);
	cr_assert_eq(dg_rules_match_where(r, UDP, SND, (struct sockaddr *)&a.ss, a.len, &where), IWARP_MODE_AUTO);
	cr_assert_str_eq(where, "default mode");
	dg_rules_free(r);
}

Test(match, program_globs)
{
	static const char *text = "mode=ud program=vlc\n"
				  "mode=rd program=sip*\n"
				  "mode=off program=python3.?\n"
				  "mode=rc program=[ab]prog\n"
				  "mode=off program=/opt/*/bin/*\n" /* with '/': the full path */
				  "mode=ud program=*\n";
	static const struct { const char *exe; int proto; enum iwarp_mode m; } cases[] = {
		{"/usr/bin/vlc", UDP, IWARP_MODE_UD},
		{"/usr/bin/vlc-wrapper", UDP, IWARP_MODE_UD}, /* only program=* */
		{"/usr/bin/vlc-wrapper", TCP, IWARP_MODE_AUTO},
		{"/usr/bin/sipp", UDP, IWARP_MODE_RD},
		{"/usr/local/bin/sip", UDP, IWARP_MODE_RD},
		{"/usr/bin/python3.9", TCP, IWARP_MODE_OFF},
		{"/usr/bin/python3.11", TCP, IWARP_MODE_AUTO}, /* '?' is one character */
		{"/usr/bin/aprog", TCP, IWARP_MODE_RC},
		{"/usr/bin/cprog", TCP, IWARP_MODE_AUTO},
		{"/opt/x/bin/tool", TCP, IWARP_MODE_OFF},
		{"/opt/x/y/bin/tool", TCP, IWARP_MODE_AUTO}, /* '*' does not cross '/' */
		{"/usr/bin/tool", TCP, IWARP_MODE_AUTO},
		{"/opt/x/bin/vlc", UDP, IWARP_MODE_UD}, /* first match */
	};
	for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct dg_rules *r = rules_for(text, cases[i].exe, IWARP_MODE_AUTO);
		cr_assert_eq(M(r, cases[i].proto, SND, "10.0.0.1", 9), cases[i].m, "%s", cases[i].exe);
		dg_rules_free(r);
	}
}

Test(match, program_matches_argv0_too)
{
	struct dg_rules_config cfg = {.path = write_rules("mode=ud program=myapp\n"), .path_required = 1,
				      .fallback = IWARP_MODE_OFF, .exe = "/usr/bin/python3.11",
				      .argv0 = "./bin/myapp"};
	struct dg_rules *r;
	cr_assert_eq(dg_rules_build(&cfg, &r), 0);
	unlink(cfg.path);
	cr_assert_str_eq(dg_rules_program(r), "python3.11");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(match, program_of_this_process)
{
	struct dg_rules_config cfg = {.path = write_rules("mode=ud program=test_rules*\n"),
				      .path_required = 1, .fallback = IWARP_MODE_OFF};
	struct dg_rules *r;
	cr_assert_eq(dg_rules_build(&cfg, &r), 0);
	unlink(cfg.path);
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	cr_assert_gt(n, 0);
	exe[n] = 0;
	cr_assert_str_eq(dg_rules_program(r), strrchr(exe, '/') + 1);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(match, no_address_yet)
{
	struct dg_rules *r = rules_for("mode=ud port=5000\nmode=rd addr=10.0.0.0/8\nmode=off role=receiver\n"
				       "mode=auto proto=tcp\n",
				       "/bin/x", IWARP_MODE_UD);
	cr_assert_eq(dg_rules_match(r, UDP, SND, NULL, 0), IWARP_MODE_UD, "only the default applies");
	cr_assert_eq(dg_rules_match(r, UDP, RCV, NULL, 0), IWARP_MODE_OFF);
	cr_assert_eq(dg_rules_match(r, TCP, SND, NULL, 0), IWARP_MODE_AUTO);
	dg_rules_free(r);
}

Test(match, not_an_ip_address)
{
	struct dg_rules *r = rules_for("mode=ud\n", "/bin/x", IWARP_MODE_UD);
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	const char *where;
	cr_assert_eq(dg_rules_match_where(r, UDP, SND, (struct sockaddr *)&un, sizeof un, &where), IWARP_MODE_OFF);
	cr_assert_str_eq(where, "not an IP socket");
	struct addr a = A("10.0.0.1", 9);
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)&a.ss, a.len), IWARP_MODE_UD);
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)&a.ss, a.len - 1), IWARP_MODE_OFF, "short");
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)&a.ss, 1), IWARP_MODE_OFF, "shorter");
	a = A("::1", 9);
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)&a.ss, 24), IWARP_MODE_UD, "RFC 2133 size");
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)&a.ss, 23), IWARP_MODE_OFF);
	cr_assert_eq(dg_rules_match(NULL, UDP, SND, (struct sockaddr *)&a.ss, a.len), IWARP_MODE_OFF);
	dg_rules_free(r);
}

Test(match, misaligned_address)
{
	struct dg_rules *r = rules_for("mode=ud addr=10.0.0.0/8 port=5000\n", "/bin/x", IWARP_MODE_OFF);
	_Alignas(16) unsigned char buf[sizeof(struct sockaddr_in6) + 1];
	struct addr a = A("10.9.9.9", 5000);
	memcpy(buf + 1, &a.ss, a.len);
	cr_assert_eq(dg_rules_match(r, UDP, SND, (struct sockaddr *)(buf + 1), a.len), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(match, fallback_per_protocol)
{
	static const struct { enum iwarp_mode fb, udp, tcp; } cases[] = {
		{IWARP_MODE_OFF, IWARP_MODE_OFF, IWARP_MODE_OFF},    {IWARP_MODE_AUTO, IWARP_MODE_AUTO, IWARP_MODE_AUTO},
		{IWARP_MODE_UD, IWARP_MODE_UD, IWARP_MODE_AUTO},     {IWARP_MODE_RD, IWARP_MODE_RD, IWARP_MODE_AUTO},
		{IWARP_MODE_RC, IWARP_MODE_AUTO, IWARP_MODE_RC},
	};
	for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct dg_rules *r = rules_for("", "/bin/x", cases[i].fb);
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), cases[i].udp, "%d", i);
		cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 9), cases[i].tcp, "%d", i);
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF, "%d", i);
		dg_rules_free(r);
	}
}

struct race {
	const struct dg_rules *r;
	int bad;
};

static void *racer(void *arg)
{
	struct race *x = arg;
	struct addr a = A("10.0.0.7", 5050), b = A("::1", 53), c = A("192.168.0.1", 9);
	for (int i = 0; i < 200000; i++) {
		x->bad += dg_rules_match(x->r, UDP, SND, (struct sockaddr *)&a.ss, a.len) != IWARP_MODE_RD;
		x->bad += dg_rules_match(x->r, UDP, SND, (struct sockaddr *)&b.ss, b.len) != IWARP_MODE_OFF;
		x->bad += dg_rules_match(x->r, TCP, RCV, (struct sockaddr *)&c.ss, c.len) != IWARP_MODE_AUTO;
	}
	return NULL;
}

Test(match, concurrent_readers)
{
	struct dg_rules *r = rules("mode=off addr=10.0.0.1\nmode=rd addr=10.0.0.0/8 port=5000-5100\n");
	pthread_t t[4];
	struct race x[4];
	for (int i = 0; i < 4; i++) {
		x[i] = (struct race){.r = r};
		cr_assert_eq(pthread_create(&t[i], NULL, racer, &x[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(x[i].bad, 0);
	}
	dg_rules_free(r);
}

/* ------------------------------------------------------------------ built-in exceptions */

Test(builtin, os_keeps_dns_ntp_dhcp_mdns_before_user_rules)
{
	struct dg_rules *r = rules_for("mode=ud\nmode=rc\n", "/bin/x", IWARP_MODE_UD);
	struct { int proto; const char *ip; unsigned port; const char *service; } off[] = {
		{UDP, "10.0.0.1", 53, "built-in DNS"},	   {TCP, "10.0.0.1", 53, "built-in DNS"},
		{UDP, "::1", 53, "built-in DNS"},	   {UDP, "10.0.0.1", 123, "built-in NTP"},
		{UDP, "255.255.255.255", 67, "built-in DHCP"}, {UDP, "0.0.0.0", 68, "built-in DHCP"},
		{UDP, "ff02::1:2", 547, "built-in DHCP"},  {UDP, "fe80::1", 546, "built-in DHCP"},
		{UDP, "224.0.0.251", 5353, "built-in mDNS"}, {UDP, "10.0.0.1", 5353, "built-in mDNS"},
		{UDP, "224.0.0.251", 9999, "built-in mDNS"}, {UDP, "ff02::fb", 5353, "built-in mDNS"},
		{UDP, "ff02::fb", 1234, "built-in mDNS"},   {UDP, "::ffff:224.0.0.251", 1234, "built-in mDNS"},
	};
	for (unsigned i = 0; i < sizeof off / sizeof *off; i++)
		for (int role = 0; role <= 2; role++) {
			struct addr a = A(off[i].ip, off[i].port);
			const char *where;
			cr_assert_eq(dg_rules_match_where(r, off[i].proto, role, (struct sockaddr *)&a.ss, a.len, &where),
				     IWARP_MODE_OFF, "%s:%u", off[i].ip, off[i].port);
			cr_assert_str_eq(where, off[i].service);
		}
	/* neighbours are not exceptions */
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 54), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5354), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "224.0.0.252", 9999), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "ff02::fc", 9999), IWARP_MODE_UD);
	/* NTP, DHCP and mDNS are UDP services: TCP on their ports follows the rules */
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 123), IWARP_MODE_RC);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 5353), IWARP_MODE_RC);
	cr_assert_eq(dg_rules_count(r), 9u + 2u);
	dg_rules_free(r);
}

Test(builtin, a_range_does_not_release)
{
	struct dg_rules *r = rules_for("mode=ud port=1-65535\nmode=ud port=50-60\nmode=ud addr=224.0.0.0/4\n",
				       "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "224.0.0.251", 5353), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "224.0.0.251", 7000), IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 52), IWARP_MODE_UD);
	dg_rules_free(r);
}

Test(builtin, naming_the_port_releases_the_service)
{
	/* a rule naming port=53 hands DNS (UDP and TCP) to the user's rules, in their order */
	struct dg_rules *r = rules_for("mode=off addr=10.9.9.9\n"
				       "mode=ud port=53\n"
				       "mode=rd port=67\n", /* DHCP: releases 68 and 546/547 too */
				       "/bin/x", IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_UD);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 53), IWARP_MODE_AUTO, "released: the default decides");
	cr_assert_eq(M(r, UDP, SND, "10.9.9.9", 53), IWARP_MODE_OFF, "first match still wins");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 67), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 68), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 123), IWARP_MODE_OFF, "NTP still built in");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5353), IWARP_MODE_OFF, "mDNS still built in");
	dg_rules_free(r);
}

Test(builtin, naming_the_mdns_address_releases_mdns)
{
	struct dg_rules *r = rules_for("mode=ud addr=224.0.0.251\n", "/bin/x", IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "224.0.0.251", 5353), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "ff02::fb", 5353), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5353), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
	dg_rules_free(r);
	r = rules_for("mode=rd addr=ff02::fb/128 port=5353\n", "/bin/x", IWARP_MODE_OFF);
	cr_assert_eq(M(r, UDP, RCV, "ff02::fb", 5353), IWARP_MODE_RD);
	dg_rules_free(r);
}

Test(builtin, only_rules_for_this_program_release)
{
	static const char *text = "mode=ud port=53 program=mydns\n";
	struct dg_rules *r = rules_for(text, "/usr/sbin/mydns", IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, RCV, "0.0.0.0", 53), IWARP_MODE_UD);
	dg_rules_free(r);
	r = rules_for(text, "/usr/bin/other", IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
	dg_rules_free(r);
}

/* ------------------------------------------------------------------ environment */

Test(env, dgshim_mode_good_values)
{
	const char *path = write_rules("mode=rd port=5000\n");
	setenv("DGSHIM_CONF", path, 1);
	static const struct { const char *s; enum iwarp_mode udp, tcp; } cases[] = {
		{"off", IWARP_MODE_OFF, IWARP_MODE_OFF}, {"ud", IWARP_MODE_UD, IWARP_MODE_AUTO},
		{"RD", IWARP_MODE_RD, IWARP_MODE_AUTO},  {"rc", IWARP_MODE_AUTO, IWARP_MODE_RC},
		{"auto", IWARP_MODE_AUTO, IWARP_MODE_AUTO}, {"", IWARP_MODE_AUTO, IWARP_MODE_AUTO},
	};
	for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
		setenv("DGSHIM_MODE", cases[i].s, 1);
		struct dg_rules *r = NULL;
		assert_quiet_ok(load_env(&r), cases[i].s);
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), cases[i].udp, "%s", cases[i].s);
		cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 9), cases[i].tcp, "%s", cases[i].s);
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5000), IWARP_MODE_RD, "the rules come first");
		cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
		dg_rules_free(r);
	}
	unlink(path);
}

Test(env, dgshim_mode_bad_value)
{
	const char *path = write_rules("mode=rd\n");
	setenv("DGSHIM_CONF", path, 1);
	static const char *bad[] = {"fast", "1", "ud,rd", " ud", "udp"};
	for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
		setenv("DGSHIM_MODE", bad[i], 1);
		struct dg_rules *r = NULL;
		struct loaded l = load_env(&r);
		assert_one_error(l, -EINVAL, "DGSHIM_MODE", r);
		cr_assert_not_null(strstr(l.err, "error"), "%s", l.err);
		dg_rules_free(r);
	}
	unlink(path);
}

Test(env, missing_default_file_is_fine)
{
	struct stat st;
	if (stat(DG_RULES_DEFAULT_PATH, &st) == 0)
		cr_skip_test("%s exists on this host", DG_RULES_DEFAULT_PATH);
	struct dg_rules *r = NULL;
	assert_quiet_ok(load_env(&r), "no DGSHIM_CONF");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_AUTO);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 53), IWARP_MODE_OFF);
	dg_rules_free(r);
	/* an empty DGSHIM_CONF means the default too */
	setenv("DGSHIM_CONF", "", 1);
	assert_quiet_ok(load_env(&r), "empty DGSHIM_CONF");
	dg_rules_free(r);
	/* and dg_rules_load(NULL) */
	assert_quiet_ok(load_file(NULL, &r), "dg_rules_load(NULL)");
	dg_rules_free(r);
}

Test(env, missing_default_path_in_config_is_fine)
{
	struct dg_rules_config cfg = {.path = "/nonexistent/dir/dgshim.conf", .path_required = 0,
				      .fallback = IWARP_MODE_RD};
	struct dg_rules *r;
	assert_quiet_ok(load_cfg(&cfg, &r), cfg.path);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_RD);
	dg_rules_free(r);
}

Test(env, explicit_missing_file_is_an_error)
{
	setenv("DGSHIM_CONF", "/nonexistent/dgshim.conf", 1);
	setenv("DGSHIM_MODE", "ud", 1);
	struct dg_rules *r = NULL;
	struct loaded l = load_env(&r);
	assert_one_error(l, -ENOENT, "/nonexistent/dgshim.conf: cannot open", r);
	dg_rules_free(r);
	/* dg_rules_load with a path: the caller named it */
	l = load_file("/nonexistent/x.conf", &r);
	assert_one_error(l, -ENOENT, NULL, r);
	dg_rules_free(r);
}

Test(env, dgshim_rules_inline_before_the_file)
{
	const char *path = write_rules("mode=rd port=5000-6000\n");
	setenv("DGSHIM_CONF", path, 1);
	setenv("DGSHIM_RULES", "mode=ud port=5500; mode=off addr=10.0.0.9\n mode=rc port=80 ;;", 1);
	struct dg_rules *r = NULL;
	assert_quiet_ok(load_env(&r), "DGSHIM_RULES");
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5500), IWARP_MODE_UD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 5501), IWARP_MODE_RD);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.9", 5501), IWARP_MODE_OFF);
	cr_assert_eq(M(r, TCP, SND, "10.0.0.1", 80), IWARP_MODE_RC);
	const char *where;
	struct addr a = A("10.0.0.9", 1);
	dg_rules_match_where(r, UDP, SND, (struct sockaddr *)&a.ss, a.len, &where);
	cr_assert_str_eq(where, "DGSHIM_RULES:2");
	dg_rules_free(r);
	unlink(path);
}

Test(env, dgshim_rules_bad_rule)
{
	setenv("DGSHIM_CONF", "/nonexistent/dgshim.conf", 1); /* never reached */
	setenv("DGSHIM_RULES", "mode=ud port=5500;mode=fast", 1);
	struct dg_rules *r = NULL;
	struct loaded l = load_env(&r);
	assert_one_error(l, -EINVAL, "DGSHIM_RULES:2: unknown mode 'fast'", r);
	dg_rules_free(r);
}

Test(env, out_may_be_null)
{
	const char *path = write_rules("mode=ud\n");
	struct loaded l = load_file(path, NULL);
	unlink(path);
	assert_quiet_ok(l, path);
	dg_rules_free(NULL);
}

/* ------------------------------------------------------------------ malformed files */

/* Loads text (len bytes) from a file and expects -EINVAL, exactly one stderr line naming
 * "<file>:<line>:" and containing what, and an object that sends everything to the OS. */
static void expect_bad_n(const char *text, size_t len, unsigned line, const char *what)
{
	const char *path = write_rules_n(text, len);
	char want[128];
	snprintf(want, sizeof want, "%s:%u: ", path, line);
	struct dg_rules *r = NULL;
	struct loaded l = load_file(path, &r);
	unlink(path);
	assert_one_error(l, -EINVAL, want, r);
	cr_assert_not_null(strstr(l.err, what), "'%s' not in: %s", what, l.err);
	cr_assert_not_null(strstr(l.err, "all sockets left to the OS"), "%s", l.err);
	cr_assert_not_null(strstr(l.err, "error: "), "%s", l.err);
	const char *where;
	cr_assert_eq(dg_rules_match_where(r, UDP, SND, NULL, 0, &where), IWARP_MODE_OFF);
	cr_assert_str_eq(where, "disabled (rules error)");
	dg_rules_free(r);
}

static void expect_bad(const char *text, unsigned line, const char *what)
{
	expect_bad_n(text, strlen(text), line, what);
}

/* A good rule before the bad one: all or nothing, so it must not be in effect either. */
#define GOOD "# good rules first\nmode=ud\nmode=rc\n"

Test(malformed, unknown_key)
{
	expect_bad(GOOD "mode=ud prot=udp\n", 4, "unknown key 'prot'");
	expect_bad("mode=ud address=10.0.0.1\n", 1, "unknown key 'address'");
	expect_bad("mode=ud =5\n", 1, "unknown key ''");
}

Test(malformed, unknown_mode)
{
	expect_bad(GOOD "mode=fast\n", 4, "unknown mode 'fast'");
	expect_bad("mode=5\n", 1, "unknown mode '5'");
	expect_bad("mode=udp\n", 1, "unknown mode 'udp'");
}

Test(malformed, bad_address)
{
	expect_bad(GOOD "mode=ud addr=10.0.0\n", 4, "bad address '10.0.0'");
	expect_bad("mode=ud addr=10.0.0.256\n", 1, "bad address");
	expect_bad("mode=ud addr=example.com\n", 1, "bad address 'example.com'");
	expect_bad("mode=ud addr=::g\n", 1, "bad address");
	expect_bad("mode=ud addr=[::1]\n", 1, "bad address");
	expect_bad("mode=ud addr=/8\n", 1, "bad address");
	expect_bad("mode=ud addr=fe80::1%eth0\n", 1, "bad address");
	expect_bad("mode=ud addr=1:2:3:4:5:6:7:8:9:10:11:12:13:14:15:16:17:18:19:20:21:22:23:24:25/8\n", 1,
		   "bad address");
}

Test(malformed, bad_prefix_length)
{
	expect_bad(GOOD "mode=ud addr=10.0.0.0/33\n", 4, "bad prefix length '33' for an IPv4 address");
	expect_bad("mode=ud addr=::/129\n", 1, "bad prefix length '129' for an IPv6 address");
	expect_bad("mode=ud addr=10.0.0.0/\n", 1, "bad prefix length ''");
	expect_bad("mode=ud addr=10.0.0.0/-1\n", 1, "bad prefix length '-1'");
	expect_bad("mode=ud addr=10.0.0.0/8/8\n", 1, "bad prefix length '8/8'");
	expect_bad("mode=ud addr=10.0.0.0/0x8\n", 1, "bad prefix length");
	expect_bad("mode=ud addr=::ffff:10.0.0.0/200\n", 1, "bad prefix length");
}

Test(malformed, bad_port)
{
	expect_bad(GOOD "mode=ud port=0\n", 4, "bad port 0");
	expect_bad("mode=ud port=65536\n", 1, "bad port '65536'");
	expect_bad("mode=ud port=99999999999\n", 1, "bad port");
	expect_bad("mode=ud port=5100-5000\n", 1, "bad port range 5100-5000");
	expect_bad("mode=ud port=0-5\n", 1, "bad port 0");
	expect_bad("mode=ud port=5-70000\n", 1, "bad port '5-70000'");
	expect_bad("mode=ud port=http\n", 1, "bad port 'http'");
	expect_bad("mode=ud port=-5\n", 1, "bad port");
	expect_bad("mode=ud port=5-\n", 1, "bad port");
	expect_bad("mode=ud port=1-2-3\n", 1, "bad port");
	expect_bad("mode=ud port=53,123\n", 1, "bad port");
	expect_bad("mode=ud port=+53\n", 1, "bad port");
}

Test(malformed, unknown_role_and_proto)
{
	expect_bad(GOOD "mode=ud role=client\n", 4, "unknown role 'client'");
	expect_bad("mode=ud proto=sctp\n", 1, "unknown proto 'sctp'");
	expect_bad("mode=off proto=udp6\n", 1, "unknown proto");
}

Test(malformed, rule_without_mode)
{
	expect_bad(GOOD "proto=udp port=5000\n", 4, "rule without a mode");
	expect_bad("program=vlc\n", 1, "rule without a mode");
}

Test(malformed, mode_that_does_not_fit_proto)
{
	expect_bad(GOOD "mode=rc proto=udp\n", 4, "mode=rc carries tcp sockets");
	expect_bad("mode=ud proto=tcp\n", 1, "mode=ud carries udp sockets");
	expect_bad("mode=rd proto=tcp\n", 1, "mode=rd carries udp sockets");
}

Test(malformed, garbage_lines)
{
	expect_bad(GOOD "hello world\n", 4, "expected key=value, found 'hello'");
	expect_bad("mode = ud\n", 1, "(no spaces around '=')");
	expect_bad("[rule]\nmode=ud\n", 1, "expected key=value, found '[rule]'");
	expect_bad("use udp_ud *:*:*:*\n", 1, "expected key=value");
	expect_bad("mode=ud port=5000 extra\n", 1, "found 'extra'");
	expect_bad("\n\n\nmode=ud\x01\n", 4, "control character 0x01");
	expect_bad("mode=ud\x1b[31m\n", 1, "control character 0x1b");
}

Test(malformed, empty_or_repeated_values)
{
	expect_bad("mode=\n", 1, "mode= has no value");
	expect_bad("mode=ud port=\n", 1, "port= has no value");
	expect_bad("mode=ud mode=rd\n", 1, "mode= given twice");
	expect_bad("mode=ud port=1 PORT=2\n", 1, "port= given twice");
}

Test(malformed, over_long_line)
{
	char text[4000];
	size_t n = (size_t)snprintf(text, sizeof text, GOOD "mode=ud program=");
	memset(text + n, 'a', 2000);
	n += 2000;
	text[n++] = '\n';
	text[n] = 0;
	expect_bad(text, 4, "line longer than 1024 characters");
	/* exactly the limit is fine; one more is not */
	char *ok = malloc(DG_RULES_MAX_LINE + 3);
	memset(ok, ' ', DG_RULES_MAX_LINE);
	memcpy(ok, "mode=ud", 7);
	ok[DG_RULES_MAX_LINE] = '\n';
	ok[DG_RULES_MAX_LINE + 1] = 0;
	struct dg_rules *r = rules(ok);
	cr_assert_eq(M(r, UDP, SND, "10.0.0.1", 9), IWARP_MODE_UD);
	dg_rules_free(r);
	ok[DG_RULES_MAX_LINE] = ' ';
	ok[DG_RULES_MAX_LINE + 1] = '\n';
	ok[DG_RULES_MAX_LINE + 2] = 0;
	expect_bad(ok, 1, "line longer than");
	/* a long last line without a newline */
	ok[DG_RULES_MAX_LINE + 1] = 0;
	expect_bad(ok, 1, "line longer than");
	free(ok);
}

Test(malformed, nul_byte_and_binary)
{
	static const char nul[] = "mode=ud\nmode=rd\0port=5\n";
	expect_bad_n(nul, sizeof nul - 1, 2, "NUL byte");
	static const unsigned char elf[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, '\n'};
	expect_bad_n((const char *)elf, sizeof elf, 1, "");
}

Test(malformed, line_number_counts_comments_and_blanks)
{
	expect_bad("# c\n\n   \n# c\nmode=ud\n\nmode=rd port=0\n", 7, "bad port 0");
	expect_bad("mode=ud\r\nmode=rd\r\nmode=x\r\n", 3, "unknown mode 'x'");
}

Test(malformed, bad_rule_for_another_program_still_counts)
{
	/* all or nothing: a typo in a rule for another program disables this one too */
	expect_bad("mode=ud program=vlc\nmode=fast program=nothing-runs-this\n", 2, "unknown mode");
}

Test(malformed, long_token_is_cut_in_the_message)
{
	char text[300];
	size_t n = (size_t)snprintf(text, sizeof text, "mode=");
	memset(text + n, 'x', 200);
	text[n + 200] = '\n';
	text[n + 201] = 0;
	expect_bad(text, 1, "...'");
}

Test(malformed, a_directory_is_not_a_rules_file)
{
	struct dg_rules *r = NULL;
	struct loaded l = load_file("/tmp", &r);
	assert_one_error(l, -EISDIR, "/tmp: cannot", r);
	dg_rules_free(r);
}

Test(malformed, endless_files_end)
{
	/* no newline ever: stopped at the first byte, one line, no hang */
	setenv("DGSHIM_CONF", "/dev/zero", 1);
	struct dg_rules *r = NULL;
	struct loaded l = load_env(&r);
	assert_one_error(l, -EINVAL, "/dev/zero:1: NUL byte", r);
	dg_rules_free(r);
	/* too many lines, even of comments */
	size_t n = (DG_RULES_MAX_LINES + 1) * 2;
	char *text = malloc(n + 1);
	for (size_t i = 0; i < n; i += 2)
		memcpy(text + i, "#\n", 2);
	text[n] = 0;
	expect_bad(text, DG_RULES_MAX_LINES + 1, "more than 100000 lines");
	free(text);
}

Test(env, dev_null_means_no_file)
{
	struct dg_rules *r = NULL;
	setenv("DGSHIM_CONF", "/dev/null", 1);
	assert_quiet_ok(load_env(&r), "/dev/null");
	cr_assert_eq(dg_rules_count(r), 9u);
	dg_rules_free(r);
}

Test(malformed, bad_fallback_in_config)
{
	struct dg_rules_config cfg = {.fallback = (enum iwarp_mode)42};
	struct dg_rules *r = NULL;
	struct loaded l = load_cfg(&cfg, &r);
	assert_one_error(l, -EINVAL, NULL, r);
	dg_rules_free(r);
}

/* ------------------------------------------------------------------ the example file */

Test(file, example_parses)
{
	/* config/dgshim.conf.example, found from this source file's path */
	char path[PATH_MAX];
	const char *src = __FILE__, *slash = strrchr(src, '/');
	snprintf(path, sizeof path, "%.*s/../../config/dgshim.conf.example", slash ? (int)(slash - src) : 1,
		 slash ? src : ".");
	if (access(path, R_OK) != 0)
		cr_skip_test("%s not found from the working directory", path);
	struct dg_rules_config cfg = {.path = path, .path_required = 1, .fallback = IWARP_MODE_AUTO,
				      .exe = "/usr/bin/vlc", .argv0 = "vlc"};
	struct dg_rules *r = NULL;
	assert_quiet_ok(load_cfg(&cfg, &r), path);
	cr_assert_gt(dg_rules_count(r), 9u);
	dg_rules_free(r);
}
