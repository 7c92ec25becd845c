/*
 * rules.c - the rules file, DGSHIM_RULES, DGSHIM_MODE and the built-in exceptions, compiled into
 * one immutable array that dg_rules_match() walks (first match wins). See rules.h and
 * docs/rules.md; the file format is one rule per line of key=value words, read by the small
 * parser below (docs/rules.md says why not inih).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rules.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "env.h"
#include "log.h"

/* Protocol of a rule: any, or one of the two the shim carries. */
enum { P_ANY = 0, P_UDP = 1, P_TCP = 2 };
/* Address family of a rule or of an address being matched: 0 = any / none. */
enum { F_ANY = 0, F_V4 = 4, F_V6 = 6 };

struct dg_rule {
	uint8_t mode;     /* enum iwarp_mode */
	uint8_t proto;    /* P_* */
	uint8_t role;     /* enum dg_role */
	uint8_t family;   /* F_*; F_ANY: addr=* */
	uint8_t plen;     /* prefix length (bits of the family's address) */
	uint8_t port_any; /* port=* (matches port 0 too, and "no address yet") */
	uint8_t owned;    /* where was allocated for this rule */
	uint16_t port_lo, port_hi;
	uint64_t net[2], mask[2]; /* address bytes (v4: first 4 bytes) as two words, pre-masked */
	const char *where;        /* "<file>:<line>", "DGSHIM_RULES:<n>", "built-in DNS", ... */
	char *program;            /* program= glob, NULL for any (only until compiled) */
};

struct dg_rules {
	unsigned n;
	int disabled;                /* an error left everything to the OS */
	struct dg_rule *rule;
	uint8_t fallback[3];         /* final default indexed by P_UDP / P_TCP */
	char program[NAME_MAX + 1];  /* basename of /proc/self/exe (or argv[0]) */
	char argv0[NAME_MAX + 1];    /* basename of argv[0] */
	char exe[PATH_MAX];          /* full path of /proc/self/exe, "" if unknown */
};

/* What an allocation failure leaves: never written, never freed. */
static const struct dg_rules g_off = {.disabled = 1};

/* ------------------------------------------------------------------ modes */

static const char *const mode_names[] = {"off", "ud", "rd", "rc", "auto"};

int dg_mode_valid(int mode)
{
	return mode >= IWARP_MODE_OFF && mode <= IWARP_MODE_AUTO;
}

int dg_mode_parse(const char *s, enum iwarp_mode *out)
{
	if (!s)
		return -EINVAL;
	for (int m = IWARP_MODE_OFF; m <= IWARP_MODE_AUTO; m++)
		if (!strcasecmp(s, mode_names[m])) {
			if (out)
				*out = (enum iwarp_mode)m;
			return 0;
		}
	return -EINVAL;
}

const char *dg_mode_name(int mode)
{
	return dg_mode_valid(mode) ? mode_names[mode] : "invalid";
}

int dg_mode_fits(int proto, int mode)
{
	if (proto != IPPROTO_UDP && proto != IPPROTO_TCP)
		return 0;
	switch (mode) {
	case IWARP_MODE_OFF:
	case IWARP_MODE_AUTO:
		return 1;
	case IWARP_MODE_UD:
	case IWARP_MODE_RD:
		return proto == IPPROTO_UDP;
	case IWARP_MODE_RC:
		return proto == IPPROTO_TCP;
	default:
		return 0;
	}
}

/* ------------------------------------------------------------------ addresses */

/* Sets net/mask of ru from 16 address bytes and a prefix length in bits (of 32 or 128). */
static void set_prefix(struct dg_rule *ru, int family, const uint8_t bytes[16], unsigned plen)
{
	uint8_t m[16] = {0}, a[16];
	for (unsigned i = 0; i < 16; i++) {
		unsigned bits = plen > i * 8 ? plen - i * 8 : 0;
		m[i] = bits >= 8 ? 0xff : (uint8_t)(0xff00u >> bits);
		a[i] = bytes[i] & m[i];
	}
	ru->family = (uint8_t)family;
	ru->plen = (uint8_t)plen;
	memcpy(ru->net, a, 16);
	memcpy(ru->mask, m, 16);
}

static const uint8_t v4mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* The address and port a socket names, in the form rules are compiled to. */
struct key {
	int family; /* F_V4 (also for v4-mapped IPv6), F_V6 */
	uint16_t port;
	uint64_t a[2];
};

/* 0 and *k filled, or -1 for anything that is not a usable IPv4/IPv6 socket address. */
static int addr_key(const struct sockaddr *sa, socklen_t len, struct key *k)
{
	uint8_t b[16] = {0};
	sa_family_t fam;
	if (len < (socklen_t)sizeof fam)
		return -1;
	memcpy(&fam, (const char *)sa + offsetof(struct sockaddr, sa_family), sizeof fam);
	if (fam == AF_INET) {
		struct sockaddr_in s;
		if (len < (socklen_t)sizeof s)
			return -1;
		memcpy(&s, sa, sizeof s);
		memcpy(b, &s.sin_addr, 4);
		k->family = F_V4;
		k->port = ntohs(s.sin_port);
	} else if (fam == AF_INET6) {
		/* The kernel accepts the RFC 2133 size without sin6_scope_id (24 bytes). */
		struct sockaddr_in6 s;
		memset(&s, 0, sizeof s);
		if (len < 24)
			return -1;
		memcpy(&s, sa, len < (socklen_t)sizeof s ? len : sizeof s);
		if (!memcmp(s.sin6_addr.s6_addr, v4mapped_prefix, 12)) {
			memcpy(b, s.sin6_addr.s6_addr + 12, 4);
			k->family = F_V4;
		} else {
			memcpy(b, s.sin6_addr.s6_addr, 16);
			k->family = F_V6;
		}
		k->port = ntohs(s.sin6_port);
	} else {
		return -1;
	}
	memcpy(k->a, b, 16);
	return 0;
}

/* ------------------------------------------------------------------ matching */

static int rule_matches(const struct dg_rule *ru, int proto, int role, const struct key *k)
{
	if (ru->proto != P_ANY && ru->proto != proto)
		return 0;
	if (ru->role != DG_ROLE_ANY && ru->role != role)
		return 0;
	if (!k) /* no address yet */
		return ru->port_any && ru->family == F_ANY;
	if (!ru->port_any && (k->port < ru->port_lo || k->port > ru->port_hi))
		return 0;
	if (ru->family != F_ANY &&
	    (ru->family != k->family || (k->a[0] & ru->mask[0]) != ru->net[0] ||
	     (k->a[1] & ru->mask[1]) != ru->net[1]))
		return 0;
	return 1;
}

enum iwarp_mode dg_rules_match_where(const struct dg_rules *r, int proto, int role,
				     const struct sockaddr *addr, socklen_t len, const char **where)
{
	const char *w = "not an IP socket";
	enum iwarp_mode m = IWARP_MODE_OFF;
	struct key key, *k = NULL;
	int p = proto == IPPROTO_UDP ? P_UDP : proto == IPPROTO_TCP ? P_TCP : -1;
	if (!r || p < 0 || (addr && addr_key(addr, len, &key) < 0))
		goto out;
	if (r->disabled) {
		w = "disabled (rules error)";
		goto out;
	}
	if (addr)
		k = &key;
	for (unsigned i = 0; i < r->n; i++)
		if (rule_matches(&r->rule[i], p, role, k)) {
			w = r->rule[i].where;
			m = (enum iwarp_mode)r->rule[i].mode;
			goto out;
		}
	w = "default mode";
	m = (enum iwarp_mode)r->fallback[p];
out:
	if (where)
		*where = w;
	return m;
}

enum iwarp_mode dg_rules_match(const struct dg_rules *r, int proto, int role,
			       const struct sockaddr *addr, socklen_t len)
{
	return dg_rules_match_where(r, proto, role, addr, len, NULL);
}

const char *dg_rules_program(const struct dg_rules *r)
{
	return r ? r->program : "";
}

unsigned dg_rules_count(const struct dg_rules *r)
{
	return r ? r->n : 0;
}

int dg_rules_disabled(const struct dg_rules *r)
{
	return !r || r->disabled;
}

/* ------------------------------------------------------------------ building */

struct vec {
	struct dg_rule *v;
	unsigned n, cap;
};

static void rule_release(struct dg_rule *ru)
{
	if (ru->owned)
		free((char *)ru->where);
	free(ru->program);
	ru->where = NULL;
	ru->program = NULL;
	ru->owned = 0;
}

static void vec_free(struct vec *v)
{
	for (unsigned i = 0; i < v->n; i++)
		rule_release(&v->v[i]);
	free(v->v);
	v->v = NULL;
	v->n = v->cap = 0;
}

/* Appends *ru (taking its allocations); -ENOMEM leaves ru to the caller. */
static int vec_push(struct vec *v, const struct dg_rule *ru)
{
	if (v->n == v->cap) {
		unsigned cap = v->cap ? v->cap * 2 : 16;
		struct dg_rule *nv = realloc(v->v, cap * sizeof *nv);
		if (!nv)
			return -ENOMEM;
		v->v = nv;
		v->cap = cap;
	}
	v->v[v->n++] = *ru;
	return 0;
}

/* Everything a load needs while it runs; the error message is said once, by fail(). */
struct loader {
	struct dg_rules *r; /* the object being built (program names already set) */
	struct vec user;    /* DGSHIM_RULES then the file, in order, for this program only */
	char msg[512];      /* first error, "" while none */
	int err;            /* its -errno */
};

static int fail(struct loader *ld, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct loader *ld, int err, const char *fmt, ...)
{
	if (!ld->err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ld->msg, sizeof ld->msg, fmt, ap);
		va_end(ap);
		ld->err = err;
	}
	return err;
}

/* A token quoted for an error message: at most 40 bytes, non-printables as '?'. */
static const char *quote(const char *s, size_t n, char buf[64])
{
	size_t o = 0;
	buf[o++] = '\'';
	for (size_t i = 0; i < n && s[i]; i++) {
		if (o >= 41) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		unsigned char c = (unsigned char)s[i];
		buf[o++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	buf[o++] = '\'';
	buf[o] = 0;
	return buf;
}

static int parse_uint(const char *s, size_t n, unsigned max, unsigned *out)
{
	unsigned v = 0;
	if (n == 0 || n > 6)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v > max)
		return -1;
	*out = v;
	return 0;
}

/* Parses "*", "N" or "N-M" into ru: 0, or -1 with the error message in buf. */
static int parse_port(const char *v, struct dg_rule *ru, char buf[160])
{
	char q[64];
	if (!strcmp(v, "*")) {
		ru->port_any = 1;
		ru->port_lo = 0;
		ru->port_hi = 65535;
		return 0;
	}
	const char *dash = strchr(v, '-');
	size_t n1 = dash ? (size_t)(dash - v) : strlen(v);
	unsigned lo, hi;
	if (parse_uint(v, n1, 999999, &lo) < 0 ||
	    (dash && parse_uint(dash + 1, strlen(dash + 1), 999999, &hi) < 0)) {
		snprintf(buf, 160, "bad port %s (a port 1-65535, a range like 5000-5100, or *)",
			 quote(v, SIZE_MAX, q));
		return -1;
	}
	if (!dash)
		hi = lo;
	if (lo == 0 || hi == 0) {
		snprintf(buf, 160, "bad port 0 (ports are 1-65535; use port=* for any port)");
		return -1;
	}
	if (lo > 65535 || hi > 65535) {
		snprintf(buf, 160, "bad port %s (ports are 1-65535)", quote(v, SIZE_MAX, q));
		return -1;
	}
	if (lo > hi) {
		snprintf(buf, 160, "bad port range %u-%u (the first port must not exceed the second)",
			 lo, hi);
		return -1;
	}
	ru->port_any = 0;
	ru->port_lo = (uint16_t)lo;
	ru->port_hi = (uint16_t)hi;
	return 0;
}

/* Parses "*", "ADDR" or "ADDR/LEN" (IPv4 or IPv6) into ru: 0, or -1 with the message in buf. */
static int parse_addr(const char *v, struct dg_rule *ru, char buf[160])
{
	char q[64], a[INET6_ADDRSTRLEN + 1];
	uint8_t b[16] = {0};
	if (!strcmp(v, "*")) {
		ru->family = F_ANY;
		return 0;
	}
	const char *slash = strchr(v, '/');
	size_t an = slash ? (size_t)(slash - v) : strlen(v);
	int v6 = memchr(v, ':', an) != NULL;
	int ok = an > 0 && an < sizeof a;
	if (ok) {
		memcpy(a, v, an);
		a[an] = 0;
		ok = inet_pton(v6 ? AF_INET6 : AF_INET, a, b) == 1;
	}
	if (!ok) {
		snprintf(buf, 160, "bad address %s (an IPv4 or IPv6 address, optionally /prefix, or *)",
			 quote(v, an, q));
		return -1;
	}
	unsigned max = v6 ? 128 : 32, plen = max;
	if (slash && parse_uint(slash + 1, strlen(slash + 1), max, &plen) < 0) {
		snprintf(buf, 160, "bad prefix length %s for an %s address (0-%u)",
			 quote(slash + 1, SIZE_MAX, q), v6 ? "IPv6" : "IPv4", max);
		return -1;
	}
	if (v6 && plen >= 96 && !memcmp(b, v4mapped_prefix, 12)) {
		/* ::ffff:a.b.c.d/N is the IPv4 prefix a.b.c.d/(N-96): matched like one. */
		uint8_t b4[16] = {0};
		memcpy(b4, b + 12, 4);
		set_prefix(ru, F_V4, b4, plen - 96);
	} else {
		set_prefix(ru, v6 ? F_V6 : F_V4, b, plen);
	}
	return 0;
}

enum { K_MODE, K_PROTO, K_ROLE, K_ADDR, K_PORT, K_PROGRAM, K_COUNT };
static const char *const key_names[K_COUNT] = {"mode", "proto", "role", "addr", "port", "program"};

/*
 * Parses one rule (a NUL-terminated line, modified in place) into *ru.
 * Returns 1 for a rule, 0 for a blank or comment line, -1 with *why set for an error (then
 * *ru holds no allocation).
 */
static int parse_rule(char *line, struct dg_rule *ru, const char **why, char buf[160])
{
	static const char ws[] = " \t\r\v\f";
	char q[64];
	int seen[K_COUNT] = {0}, words = 0;
	memset(ru, 0, sizeof *ru);
	ru->port_any = 1;
	ru->port_hi = 65535;
	for (const char *c = line; *c; c++)
		if (((unsigned char)*c < 0x20 && !strchr(ws, *c)) || *c == 0x7f) {
			snprintf(buf, 160, "control character 0x%02x in the line", (unsigned char)*c);
			*why = buf;
			return -1;
		}
	char *p = line;
	for (;;) {
		p += strspn(p, ws);
		if (!*p || *p == '#')
			break;
		char *tok = p;
		p += strcspn(p, ws);
		if (*p)
			*p++ = 0;
		words++;
		char *eq = strchr(tok, '=');
		if (!eq) {
			const char *next = p + strspn(p, ws);
			snprintf(buf, 160, "expected key=value, found %s%s", quote(tok, SIZE_MAX, q),
				 *next == '=' ? " (no spaces around '=')" : "");
			goto bad;
		}
		*eq = 0;
		const char *val = eq + 1;
		int k;
		for (k = 0; k < K_COUNT; k++)
			if (!strcasecmp(tok, key_names[k]))
				break;
		if (k == K_COUNT) {
			snprintf(buf, 160, "unknown key %s (keys are mode, proto, role, addr, port, program)",
				 quote(tok, SIZE_MAX, q));
			goto bad;
		}
		if (seen[k]) {
			snprintf(buf, 160, "%s= given twice", key_names[k]);
			goto bad;
		}
		seen[k] = 1;
		if (!*val) {
			snprintf(buf, 160, "%s= has no value", key_names[k]);
			goto bad;
		}
		switch (k) {
		case K_MODE: {
			enum iwarp_mode m;
			if (dg_mode_parse(val, &m) < 0) {
				snprintf(buf, 160, "unknown mode %s (use off, ud, rd, rc or auto)",
					 quote(val, SIZE_MAX, q));
				goto bad;
			}
			ru->mode = (uint8_t)m;
			break;
		}
		case K_PROTO:
			if (!strcasecmp(val, "udp"))
				ru->proto = P_UDP;
			else if (!strcasecmp(val, "tcp"))
				ru->proto = P_TCP;
			else if (!strcasecmp(val, "any") || !strcmp(val, "*"))
				ru->proto = P_ANY;
			else {
				snprintf(buf, 160, "unknown proto %s (use udp, tcp or any)",
					 quote(val, SIZE_MAX, q));
				goto bad;
			}
			break;
		case K_ROLE:
			if (!strcasecmp(val, "sender"))
				ru->role = DG_ROLE_SENDER;
			else if (!strcasecmp(val, "receiver"))
				ru->role = DG_ROLE_RECEIVER;
			else if (!strcasecmp(val, "any") || !strcmp(val, "*"))
				ru->role = DG_ROLE_ANY;
			else {
				snprintf(buf, 160, "unknown role %s (use sender, receiver or any)",
					 quote(val, SIZE_MAX, q));
				goto bad;
			}
			break;
		case K_ADDR:
			if (parse_addr(val, ru, buf) < 0)
				goto bad;
			break;
		case K_PORT:
			if (parse_port(val, ru, buf) < 0)
				goto bad;
			break;
		case K_PROGRAM:
			if (strcmp(val, "*") && !(ru->program = strdup(val))) {
				snprintf(buf, 160, "out of memory");
				goto bad;
			}
			break;
		}
	}
	if (!words)
		return 0;
	if (!seen[K_MODE]) {
		snprintf(buf, 160, "rule without a mode (add mode=off, ud, rd, rc or auto)");
		goto bad;
	}
	/* A mode only carries the protocol it is made for: ud/rd rules are UDP rules, rc TCP. */
	int want = P_ANY;
	if (ru->mode == IWARP_MODE_UD || ru->mode == IWARP_MODE_RD)
		want = P_UDP;
	else if (ru->mode == IWARP_MODE_RC)
		want = P_TCP;
	if (want != P_ANY) {
		if (ru->proto != P_ANY && ru->proto != want) {
			snprintf(buf, 160, "mode=%s carries %s sockets, not proto=%s", mode_names[ru->mode],
				 want == P_UDP ? "udp" : "tcp", want == P_UDP ? "tcp" : "udp");
			goto bad;
		}
		ru->proto = (uint8_t)want;
	}
	return 1;
bad:
	*why = buf;
	free(ru->program);
	ru->program = NULL;
	return -1;
}

/* 1 if glob names this process (see docs/rules.md: basename of the executable or of argv[0];
 * a glob with '/' is matched against the executable's full path). */
static int program_matches(const struct dg_rules *r, const char *glob)
{
	if (!glob)
		return 1;
	if (strchr(glob, '/'))
		return r->exe[0] && fnmatch(glob, r->exe, FNM_PATHNAME) == 0;
	return (r->program[0] && fnmatch(glob, r->program, 0) == 0) ||
	       (r->argv0[0] && fnmatch(glob, r->argv0, 0) == 0);
}

/* Parses one line of source src (line number lineno) and keeps the rule if it is for us. */
static int take_line(struct loader *ld, const char *src, unsigned lineno, char *line)
{
	struct dg_rule ru;
	const char *why = NULL;
	char buf[160];
	int rc = parse_rule(line, &ru, &why, buf);
	if (rc < 0)
		return fail(ld, -EINVAL, "%s:%u: %s", src, lineno, why);
	if (rc == 0)
		return 0;
	if (!program_matches(ld->r, ru.program)) {
		free(ru.program);
		return 0;
	}
	free(ru.program);
	ru.program = NULL;
	int n = snprintf(NULL, 0, "%s:%u", src, lineno);
	char *w = malloc((size_t)n + 1);
	if (!w)
		return fail(ld, -ENOMEM, "out of memory reading %s", src);
	snprintf(w, (size_t)n + 1, "%s:%u", src, lineno);
	ru.where = w;
	ru.owned = 1;
	if (vec_push(&ld->user, &ru) < 0) {
		free(w);
		return fail(ld, -ENOMEM, "out of memory reading %s", src);
	}
	return 0;
}

/* DGSHIM_RULES: rules separated by ';' or newlines, numbered from 1. */
static int read_inline(struct loader *ld, const char *text)
{
	char line[DG_RULES_MAX_LINE + 1];
	unsigned no = 0;
	const char *p = text;
	for (;;) {
		size_t n = strcspn(p, ";\n");
		no++;
		if (n > DG_RULES_MAX_LINE)
			return fail(ld, -EINVAL, "DGSHIM_RULES:%u: rule longer than %d characters", no,
				    DG_RULES_MAX_LINE);
		memcpy(line, p, n);
		line[n] = 0;
		int rc = take_line(ld, "DGSHIM_RULES", no, line);
		if (rc < 0)
			return rc;
		if (!p[n])
			return 0;
		p += n + 1;
	}
}

/*
 * The rules file, line by line: getc (no socket call, nothing the shim interposes). A line
 * longer than DG_RULES_MAX_LINE or holding a NUL byte is an error; a UTF-8 byte order mark at
 * the start and "\r\n" line ends are accepted.
 */
static int read_file(struct loader *ld, const char *path, int required, int *found)
{
	char line[DG_RULES_MAX_LINE + 2];
	*found = 0;
	FILE *f = fopen(path, "re");
	if (!f) {
		int e = errno;
		if (!required && (e == ENOENT || e == ENOTDIR))
			return 0;
		return fail(ld, -e, "%s: cannot open the rules file: %s", path, strerror(e));
	}
	*found = 1;
	unsigned lineno = 0;
	int rc = 0, c = 0, first = 1;
	while (rc == 0 && c != EOF) {
		size_t n = 0;
		int nul = 0, long_line = 0;
		/* stops at the first NUL or excess byte: /dev/zero must not keep us reading */
		while ((c = getc(f)) != EOF && c != '\n') {
			if (c == 0) {
				nul = 1;
				break;
			}
			if (n == DG_RULES_MAX_LINE) {
				long_line = 1;
				break;
			}
			line[n++] = (char)c;
		}
		if (c == EOF && ferror(f)) {
			int e = errno ? errno : EIO;
			rc = fail(ld, -e, "%s: cannot read the rules file: %s", path, strerror(e));
			break;
		}
		if (c == EOF && n == 0 && !long_line)
			break; /* end of file after a final newline */
		line[n] = 0;
		if (++lineno > DG_RULES_MAX_LINES)
			rc = fail(ld, -EINVAL, "%s:%u: more than %d lines", path, lineno,
				  DG_RULES_MAX_LINES);
		else if (long_line)
			rc = fail(ld, -EINVAL, "%s:%u: line longer than %d characters", path, lineno,
				  DG_RULES_MAX_LINE);
		else if (nul)
			rc = fail(ld, -EINVAL, "%s:%u: NUL byte in the line (not a text file?)", path,
				  lineno);
		else {
			char *s = line;
			if (first && !strncmp(s, "\xef\xbb\xbf", 3))
				s += 3;
			rc = take_line(ld, path, lineno, s);
		}
		first = 0;
	}
	fclose(f);
	return rc;
}

/* The built-in exceptions: these services stay on the OS unless a rule names them. */
struct builtin {
	const char *where;
	uint8_t proto;
	uint16_t port;    /* 0: any port */
	const char *addr; /* NULL: any address */
};
static const struct builtin builtins[] = {
	{"built-in DNS", P_ANY, 53, NULL},
	{"built-in NTP", P_UDP, 123, NULL},
	{"built-in DHCP", P_UDP, 67, NULL},
	{"built-in DHCP", P_UDP, 68, NULL},
	{"built-in DHCP", P_UDP, 546, NULL}, /* DHCPv6 client */
	{"built-in DHCP", P_UDP, 547, NULL}, /* DHCPv6 server/relay */
	{"built-in mDNS", P_UDP, 5353, NULL},
	{"built-in mDNS", P_UDP, 0, "224.0.0.251"},
	{"built-in mDNS", P_UDP, 0, "ff02::fb"},
};
#define NBUILTIN (sizeof builtins / sizeof builtins[0])

static void builtin_rule(const struct builtin *b, struct dg_rule *ru)
{
	memset(ru, 0, sizeof *ru);
	ru->mode = IWARP_MODE_OFF;
	ru->proto = b->proto;
	ru->role = DG_ROLE_ANY;
	ru->where = b->where;
	ru->port_any = b->port == 0;
	ru->port_lo = b->port ? b->port : 0;
	ru->port_hi = b->port ? b->port : 65535;
	if (b->addr) {
		uint8_t a[16] = {0};
		int v6 = strchr(b->addr, ':') != NULL;
		inet_pton(v6 ? AF_INET6 : AF_INET, b->addr, a);
		set_prefix(ru, v6 ? F_V6 : F_V4, a, v6 ? 128 : 32);
	}
}

/* 1 if user rule u names built-in b's port alone (port=53) or its address exactly. */
static int names_builtin(const struct dg_rule *u, const struct dg_rule *b)
{
	if (!b->port_any)
		return !u->port_any && u->port_lo == u->port_hi && u->port_lo == b->port_lo;
	return u->family == b->family && u->plen == b->plen && u->net[0] == b->net[0] &&
	       u->net[1] == b->net[1];
}

/* Copies src into dst[n], cut to fit. */
static void copy_str(char *dst, size_t n, const char *src)
{
	size_t l = strnlen(src, n - 1);
	memcpy(dst, src, l);
	dst[l] = 0;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* Fills r->exe, r->program, r->argv0 from cfg or from the process. */
static void set_program(struct dg_rules *r, const struct dg_rules_config *cfg)
{
	const char *argv0 = cfg->argv0 ? cfg->argv0 : program_invocation_name;
	if (cfg->exe) {
		copy_str(r->exe, sizeof r->exe, cfg->exe);
	} else {
		ssize_t n = readlink("/proc/self/exe", r->exe, sizeof r->exe - 1);
		r->exe[n > 0 ? n : 0] = 0;
		static const char del[] = " (deleted)"; /* the binary was replaced since exec */
		size_t l = strlen(r->exe);
		if (l > sizeof del - 1 && !strcmp(r->exe + l - (sizeof del - 1), del))
			r->exe[l - (sizeof del - 1)] = 0;
	}
	copy_str(r->argv0, sizeof r->argv0, argv0 ? base_name(argv0) : "");
	copy_str(r->program, sizeof r->program, r->exe[0] ? base_name(r->exe) : r->argv0);
}

void dg_rules_free(struct dg_rules *r)
{
	if (!r || r == &g_off)
		return;
	for (unsigned i = 0; i < r->n; i++)
		rule_release(&r->rule[i]);
	free(r->rule);
	free(r);
}

/* Turns r (or, when r is NULL, a new object) into "everything to the OS". Never NULL. */
static struct dg_rules *make_off(struct dg_rules *r, const struct dg_rules_config *cfg)
{
	if (!r) {
		r = calloc(1, sizeof *r);
		if (!r)
			return (struct dg_rules *)&g_off;
		set_program(r, cfg);
	}
	for (unsigned i = 0; i < r->n; i++)
		rule_release(&r->rule[i]);
	free(r->rule);
	r->rule = NULL;
	r->n = 0;
	r->disabled = 1;
	r->fallback[P_UDP] = r->fallback[P_TCP] = IWARP_MODE_OFF;
	return r;
}

/* Hands r to the caller (or frees it when out is NULL) and returns rc. */
static int give(struct dg_rules *r, struct dg_rules **out, int rc)
{
	if (out)
		*out = r;
	else
		dg_rules_free(r);
	return rc;
}

/* 1 if built-in b is released by a user rule naming one of its service's ports or addresses. */
static int released(const struct vec *user, unsigned b)
{
	for (unsigned c = 0; c < NBUILTIN; c++) {
		if (strcmp(builtins[c].where, builtins[b].where))
			continue;
		struct dg_rule cr;
		builtin_rule(&builtins[c], &cr);
		for (unsigned u = 0; u < user->n; u++)
			if (names_builtin(&user->v[u], &cr))
				return 1;
	}
	return 0;
}

int dg_rules_build(const struct dg_rules_config *cfg, struct dg_rules **out)
{
	static const struct dg_rules_config none = {.fallback = IWARP_MODE_AUTO};
	if (!cfg)
		cfg = &none;
	struct dg_rules *r = calloc(1, sizeof *r);
	if (!r) {
		dg_log_always("out of memory loading the rules; all sockets left to the OS");
		return give((struct dg_rules *)&g_off, out, -ENOMEM);
	}
	set_program(r, cfg);
	struct loader ld;
	memset(&ld, 0, sizeof ld);
	ld.r = r;
	int found = 0;
	if (!dg_mode_valid((int)cfg->fallback))
		fail(&ld, -EINVAL, "default mode %d is not a mode", (int)cfg->fallback);
	if (!ld.err && cfg->inline_rules)
		read_inline(&ld, cfg->inline_rules);
	if (!ld.err && cfg->path)
		read_file(&ld, cfg->path, cfg->path_required, &found);

	/* Built-ins first, minus those a rule in effect releases; then the user's rules. */
	struct vec all = {0};
	for (unsigned b = 0; !ld.err && b < NBUILTIN; b++) {
		struct dg_rule br;
		builtin_rule(&builtins[b], &br);
		if (!released(&ld.user, b) && vec_push(&all, &br) < 0)
			fail(&ld, -ENOMEM, "out of memory loading the rules");
	}
	for (unsigned u = 0; !ld.err && u < ld.user.n; u++) {
		if (vec_push(&all, &ld.user.v[u]) < 0) {
			fail(&ld, -ENOMEM, "out of memory loading the rules");
			break;
		}
		ld.user.v[u].owned = 0; /* its where string now belongs to all */
		ld.user.v[u].where = NULL;
	}
	vec_free(&ld.user);
	if (ld.err) {
		vec_free(&all);
		dg_log_always("%s; all sockets left to the OS", ld.msg);
		return give(make_off(r, cfg), out, ld.err);
	}
	r->rule = all.v;
	r->n = all.n;
	int fb = (int)cfg->fallback;
	r->fallback[P_UDP] = (uint8_t)(dg_mode_fits(IPPROTO_UDP, fb) ? fb : IWARP_MODE_AUTO);
	r->fallback[P_TCP] = (uint8_t)(dg_mode_fits(IPPROTO_TCP, fb) ? fb : IWARP_MODE_AUTO);
	DG_DBG("rules: %u in effect for program '%s' (rules file %s%s), default udp=%s tcp=%s", r->n,
		r->program, cfg->path ? cfg->path : "none", cfg->path && !found ? ", absent" : "",
		mode_names[r->fallback[P_UDP]], mode_names[r->fallback[P_TCP]]);
	return give(r, out, 0);
}

int dg_rules_load(const char *path, struct dg_rules **out)
{
	struct dg_rules_config cfg = {.path = path ? path : DG_RULES_DEFAULT_PATH,
				      .path_required = path != NULL,
				      .fallback = IWARP_MODE_AUTO};
	return dg_rules_build(&cfg, out);
}

int dg_rules_from_env(struct dg_rules **out)
{
	struct dg_rules_config cfg = {.fallback = IWARP_MODE_AUTO};
	const char *conf = dg_env_str(DG_ENV_CONF); /* each with secure_getenv (env.c) */
	const char *mode = dg_env_str(DG_ENV_MODE);
	cfg.inline_rules = dg_env_str(DG_ENV_RULES);
	cfg.path = conf ? conf : DG_RULES_DEFAULT_PATH;
	cfg.path_required = conf != NULL;
	if (mode && dg_mode_parse(mode, &cfg.fallback) < 0) {
		char q[64];
		dg_log_always("DGSHIM_MODE=%s is not a mode (use off, ud, rd, rc or auto); "
			      "all sockets left to the OS",
			      quote(mode, SIZE_MAX, q));
		return give(make_off(NULL, &cfg), out, -EINVAL);
	}
	return dg_rules_build(&cfg, out);
}
