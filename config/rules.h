/*
 * rules.h - which sockets the shim takes, and in which mode (docs/rules.md is the user's side).
 *
 * A rules object is built once (per process, again after exec) from the rules file
 * (DGSHIM_CONF, default /etc/dgshim.conf), the inline rules in DGSHIM_RULES, the built-in
 * exceptions (DNS, NTP, DHCP, mDNS stay on the OS) and the final default (DGSHIM_MODE, or auto).
 * It is immutable afterwards: any number of threads may call dg_rules_match() and friends on it
 * concurrently without locks. The module has no global mutable state; the caller owns the object
 * and must not free it while another thread still reads it.
 *
 * Evaluation order for one socket (first match wins):
 *   1. built-in exceptions (mode off), except those a rule in effect releases by naming
 *      their port (port=53) or address (addr=224.0.0.251) exactly;
 *   2. DGSHIM_RULES, in order;
 *   3. the rules file, in order;
 *   4. the final default: DGSHIM_MODE (ud/rd for UDP sockets, rc for TCP sockets,
 *      off/auto for both), auto when unset.
 * Rules whose program= glob does not name this process are dropped at load time.
 * A rule never yields a mode that does not fit the socket: ud and rd rules match only UDP
 * sockets, rc rules only TCP sockets.
 *
 * Errors: a malformed file, a bad DGSHIM_RULES or DGSHIM_MODE, or a rules file named
 * explicitly that cannot be read, costs exactly one dg_log_always() line
 * ("<file>:<line>: <what is wrong>; all sockets left to the OS") and yields a rules object
 * that answers IWARP_MODE_OFF for every socket: the program runs with plain OS behaviour.
 * Nothing is ever half loaded.
 *
 * Only file I/O (fopen/getc/readlink) is used: nothing the shim interposes.
 */
#ifndef DG_RULES_H
#define DG_RULES_H

#include <sys/socket.h>

#include "dgshim.h"

/* The default rules file; a missing default file is not an error. */
#define DG_RULES_DEFAULT_PATH "/etc/dgshim.conf"
/* Longest accepted line in a rules file (and rule in DGSHIM_RULES), newline excluded. */
#define DG_RULES_MAX_LINE 1024
/* Most lines read from a rules file (comments included). */
#define DG_RULES_MAX_LINES 100000

/* What the socket does with the address given to dg_rules_match(). */
enum dg_role {
	DG_ROLE_ANY = 0,      /* unknown: only rules with role=any can match */
	DG_ROLE_SENDER = 1,   /* it sends to / connects to the address (connect, sendto) */
	DG_ROLE_RECEIVER = 2, /* it binds / listens on the address (bind, listen) */
};

struct dg_rules;

/* Everything a rules object is built from; dg_rules_from_env() fills it from the environment. */
struct dg_rules_config {
	const char *path;          /* rules file, or NULL for none */
	int path_required;         /* 1: a missing file is an error (the user named it) */
	const char *inline_rules;  /* DGSHIM_RULES: rules separated by ';' or newlines, or NULL */
	enum iwarp_mode fallback;  /* final default (DGSHIM_MODE); IWARP_MODE_AUTO normally */
	const char *exe;           /* path of the program; NULL: readlink("/proc/self/exe") */
	const char *argv0;         /* argv[0]; NULL: program_invocation_name */
};

/*
 * Builds a rules object from cfg. Always sets *out to a usable object (never NULL), which the
 * caller frees with dg_rules_free().
 * Returns 0 on success (this includes a missing file when !cfg->path_required);
 * -EINVAL for a malformed file or inline rules or a bad cfg->fallback, -ENOENT/-EACCES/... (the
 * errno of open/read) for a required file that cannot be read, -ENOMEM when out of memory.
 * On any error: one dg_log_always() line, and *out sends every socket to the OS (mode off).
 * Not async-signal-safe (allocates, opens files). Thread-safe: no shared state.
 */
int dg_rules_build(const struct dg_rules_config *cfg, struct dg_rules **out);

/*
 * Loads the rules file at path for this process, with the built-in exceptions and the final
 * default auto. The file must exist (the caller named it); path NULL means the default path
 * /etc/dgshim.conf, which need not exist. Same returns and guarantees as dg_rules_build().
 */
int dg_rules_load(const char *path, struct dg_rules **out);

/*
 * Builds the rules for this process from its environment (read with secure_getenv(), so a
 * set-user-ID program ignores them):
 *   DGSHIM_CONF   rules file; unset or empty: /etc/dgshim.conf, where a missing file is fine.
 *                 A file named here that is missing or unreadable is an error.
 *   DGSHIM_RULES  inline rules, evaluated before the file's.
 *   DGSHIM_MODE   off|ud|rd|rc|auto: the final default. A bad value is an error naming the
 *                 variable (the file is then not read).
 * Same returns and guarantees as dg_rules_build(): one error line at most, *out always usable.
 */
int dg_rules_from_env(struct dg_rules **out);

/*
 * The mode for a socket of protocol proto (IPPROTO_UDP or IPPROTO_TCP; anything else: off)
 * that acts as role (enum dg_role) on addr (struct sockaddr_in or sockaddr_in6 of at least
 * their size; other families and short lengths: off). addr NULL means "no address yet": only
 * rules with addr=* and port=* (and no built-in) can match. A v4-mapped IPv6 address
 * (::ffff:a.b.c.d) is matched as the IPv4 address a.b.c.d.
 * No allocation, no lock, no system call: a loop over the compiled rules. r NULL: off.
 * role is DG_ROLE_SENDER or DG_ROLE_RECEIVER (DG_ROLE_ANY: only role=any rules match).
 */
enum iwarp_mode dg_rules_match(const struct dg_rules *r, int proto, int role,
			       const struct sockaddr *addr, socklen_t len);

/*
 * Like dg_rules_match(), and sets *where (if where is not NULL) to what decided, for
 * diagnostics: "<file>:<line>", "DGSHIM_RULES:<n>", "built-in DNS" (NTP, DHCP, mDNS),
 * "default mode" (DGSHIM_MODE or auto), "disabled (rules error)" or "not an IP socket" (also
 * for r NULL or a protocol other than UDP/TCP). The string lives as long as r (or forever).
 */
enum iwarp_mode dg_rules_match_where(const struct dg_rules *r, int proto, int role,
				     const struct sockaddr *addr, socklen_t len, const char **where);

/* The program name used for program= globs: the basename of /proc/self/exe (or of argv[0]
 * when /proc is unavailable); "" if neither is known. Lives as long as r. */
const char *dg_rules_program(const struct dg_rules *r);

/* Number of rules in effect for this process (built-ins included, final default excluded). */
unsigned dg_rules_count(const struct dg_rules *r);

/* 1 if r is the "everything to the OS" object left by an error, else 0. */
int dg_rules_disabled(const struct dg_rules *r);

/* Frees r. NULL is fine. */
void dg_rules_free(struct dg_rules *r);

/* Parses "off", "ud", "rd", "rc" or "auto" (any case, nothing else) into *out.
 * Returns 0, or -EINVAL (s NULL or anything else; *out untouched). */
int dg_mode_parse(const char *s, enum iwarp_mode *out);

/* The name of a mode ("off", "ud", ...), or "invalid". */
const char *dg_mode_name(int mode);

/* 1 if mode is a defined enum iwarp_mode value (0..4), else 0 (setsockopt(IWARP_MODE) then
 * fails with EINVAL). */
int dg_mode_valid(int mode);

/* 1 if mode may carry a socket of protocol proto: off and auto fit both, ud and rd fit
 * IPPROTO_UDP, rc fits IPPROTO_TCP; else 0 (also for invalid modes and other protocols). */
int dg_mode_fits(int proto, int mode);

#endif
