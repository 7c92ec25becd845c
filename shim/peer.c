/*
 * peer.c - what each destination speaks (docs/shim.md, "Discovery").
 *
 * A taken socket with a queue pair binds the abstract unix name "dgshim/<svc>/<port>" (svc
 * ud or rd). Abstract names live in the network namespace, as UDP ports do, and vanish with
 * the process, so a name never outlives its owner. Before sending framed to a destination on
 * this host, a sender asks whether that name exists (one connect() on a private unix socket,
 * repeated at most every 100 ms per destination); a framed datagram from a source proves it
 * speaks; a plain one from a source believed to speak makes the next send ask again.
 * Destinations elsewhere are framed only when a rules line (not the default) names them,
 * or with DGSHIM_DISCOVERY=off. Everything else gets plain UDP: a program that did not ask for
 * datagram-iWARP never receives a framed byte.
 *
 * The table: open addressing, 64 stripes of locks (no process-wide lock on the send path),
 * one address handle per destination, created once. A destination unused for
 * DGSHIM_DEST_IDLE_MS (60 s) is forgotten, at most twice that later: a server that answers
 * clients which come and go (a new port each) keeps what it knows of the ones still talking,
 * not of every client it ever had (the soak's servers grew ~0.3 kB a client before).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "rules.h"
#include "sock.h"
#include "wire.h"

#define PEER_SLOTS (1u << 16)
#define PEER_STRIPES 64
#define LEASE_LOCAL_US 100000u /* a "yes" is asked again after this */
#define RECHECK_NO_US 1000u     /* a "no" for the wanted service: after this */

enum { CAP_UD = 1, CAP_RD = 2, CAP_UDV = 4, CAP_RC = 8 };
/* Discovery across hosts (disco.c): a remote "yes" is believed for its lease and asked again
 * halfway through it while the destination is used; a question unanswered after ASK_WAIT_US
 * (no shim there, or it was lost) counts as "no", asked again after RETRY_NO_REMOTE_US. */
#define ASK_WAIT_US 200000u
#define RETRY_NO_REMOTE_US 1000000u
static _Atomic int asked; /* questions outstanding, so a sender reads answers only then */
#define RETRY_DEV_US 1000000u   /* a device peer that refused SIDR: asked again after this */

/* The clock of every time a destination's entry keeps (checked_us, the lease, the questions,
 * the sweep): the coarse monotonic clock (the kernel's tick, 1-4 ms), read from the vDSO's data
 * without the TSC, because route_once reads it for every datagram sent and peer_heard for every
 * one received, and every period it is compared with is at least a millisecond. Never mixed
 * with shim_now_us. */
static inline uint64_t peer_clock(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
enum { RULE_AUTO = 0, RULE_OFF = 1, RULE_TRUST = 2 };

struct peer {
	uint8_t used;
	uint8_t ref;      /* used since the stripe's last sweep (stab_sweep) */
	uint8_t doomed;   /* stab_sweep: to be forgotten */
	uint32_t h;       /* hash_addr(&a) */
	uint8_t caps;     /* CAP_* known to be spoken */
	uint8_t rule;     /* RULE_* */
	uint8_t rule_caps; /* RULE_TRUST: the services the rules line names (CAP_*) */
	uint8_t local;    /* on this host (registry applies) */
	socklen_t alen;
	union dgv_sockaddr a;
	struct dgv_ah *ah;
	unsigned ah_gen;
	struct dgv_ah *dah;      /* on the device (G.dev): made by SIDR */
	unsigned dah_gen;
	uint64_t checked_us;
	uint64_t dah_fail_us;    /* when SIDR last failed */
	/* another host's (!local, no rules line): what its discovery port said */
	uint64_t nonce;          /* the question outstanding (0: none) */
	uint64_t asked_us, next_ask_us, lease_until_us;
	bool said_silent;        /* the info line about a host that does not answer was written */
};

/* Per stripe, an open-addressing table that grows as destinations come (at most
 * PEER_SLOTS / PEER_STRIPES entries): memory in proportion to the destinations a process has
 * talked to. (One table of PEER_SLOTS entries spread by hash touched a new page for almost
 * every new destination: a long-lived server's RSS grew ~200 kB a minute in the soak.) Each
 * table is used under its stripe's lock only; a pointer find() returns does not outlive it. */
static struct stab {
	struct peer *v;
	uint32_t cap, n;
	uint64_t swept_us;           /* the last sweep (0: none yet) */
} tabs[PEER_STRIPES];
/* Bumped whenever a destination may have stopped speaking what it spoke (caps_set): a socket's
 * route memo (peer_route_memo) made before the bump is void. */
static _Atomic unsigned route_epoch;

/* p's capabilities become caps; one lost voids every socket's route memo. Needs p's stripe. */
static void caps_set(struct peer *p, uint8_t caps)
{
	if (p->caps & ~caps)
		atomic_fetch_add_explicit(&route_epoch, 1, memory_order_release);
	p->caps = caps;
}

/* Address handles of forgotten destinations wait one idle interval before they are destroyed:
 * a sender that had one from peer_route may still be posting with it (under its socket's lock,
 * not the stripe's). One list for the process, under its own lock (taken inside a stripe's). */
static struct {
	pthread_mutex_t lock;
	struct retiree {
		struct dgv_ah *ah;
		uint64_t at; /* when it was retired */
	} *v;
	uint32_t n, cap;
} retired = {.lock = PTHREAD_MUTEX_INITIALIZER};
static _Atomic unsigned long long forgotten; /* destinations forgotten, for the exit summary */
static pthread_mutex_t stripes[PEER_STRIPES];
static int probe_fd = -1;
static struct {
	int n;
	union dgv_sockaddr a[32];
} locals;
static bool warned_full;
/* The host's addresses are read at the first question about an address that is not loopback,
 * not at load: every process the library is preloaded into (a shell pipeline's, a version
 * manager's wrapper scripts) would pay a netlink conversation (getifaddrs) it never uses. */
static pthread_once_t locals_once = PTHREAD_ONCE_INIT;

static void load_locals(void)
{
	struct ifaddrs *ifa;
	if (getifaddrs(&ifa))
		return;
	for (struct ifaddrs *i = ifa; i && locals.n < 32; i = i->ifa_next)
		if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6))
			memcpy(&locals.a[locals.n++], i->ifa_addr,
			       i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
								 : sizeof(struct sockaddr_in6));
	freeifaddrs(ifa);
}

void peer_init(void)
{
	for (int i = 0; i < PEER_STRIPES; i++)
		pthread_mutex_init(&stripes[i], NULL);
}

void peer_after_fork(void)
{
	for (int i = 0; i < PEER_STRIPES; i++)
		pthread_mutex_init(&stripes[i], NULL);
	for (int k = 0; k < PEER_STRIPES; k++)
		for (uint32_t i = 0; i < tabs[k].cap; i++) {
			struct peer *p = &tabs[k].v[i];
			if (p->used) {
				if (p->ah)
					shim_abandon(p->ah); /* the parent's context */
				if (p->dah)
					shim_abandon(p->dah);
				p->ah = p->dah = NULL;
			}
		}
	pthread_mutex_init(&retired.lock, NULL);
	for (uint32_t i = 0; i < retired.n; i++)
		shim_abandon(retired.v[i].ah);
	retired.n = 0;
}

bool ip_local(const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET) {
		uint32_t ip = ntohl(a->sin.sin_addr.s_addr);
		if ((ip >> 24) == 127)
			return true;
		pthread_once(&locals_once, load_locals);
		for (int i = 0; i < locals.n; i++)
			if (locals.a[i].sa.sa_family == AF_INET && locals.a[i].sin.sin_addr.s_addr == a->sin.sin_addr.s_addr)
				return true;
		return false;
	}
	const struct in6_addr *x = &a->sin6.sin6_addr;
	if (IN6_IS_ADDR_LOOPBACK(x))
		return true;
	if (IN6_IS_ADDR_V4MAPPED(x)) {
		union dgv_sockaddr v4 = {.sin = {.sin_family = AF_INET}};
		memcpy(&v4.sin.sin_addr, &x->s6_addr[12], 4);
		return ip_local(&v4);
	}
	pthread_once(&locals_once, load_locals);
	for (int i = 0; i < locals.n; i++)
		if (locals.a[i].sa.sa_family == AF_INET6 && !memcmp(&locals.a[i].sin6.sin6_addr, x, sizeof *x))
			return true;
	return false;
}


static uint32_t hash_addr(const union dgv_sockaddr *a)
{
	uint32_t h = 2166136261u;
	const uint8_t *p;
	size_t n;
	if (a->sa.sa_family == AF_INET)
		p = (const uint8_t *)&a->sin.sin_addr, n = 4;
	else
		p = (const uint8_t *)&a->sin6.sin6_addr, n = 16;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	h = (h ^ port_of(a)) * 16777619u;
	return h ^ (h >> 15);
}

/* n bytes rounded up to whole pages. */
static size_t pages_of(size_t n)
{
	size_t pg = 4096;
	return (n + pg - 1) / pg * pg;
}

/* The size of a table of cap entries, whole pages. */
static size_t stab_bytes(uint32_t cap)
{
	return pages_of((size_t)cap * sizeof(struct peer));
}

/* The slot where an entry of hash h starts its probe in a table of cap entries. */
static inline uint32_t home_of(uint32_t h, uint32_t cap)
{
	return (h / PEER_STRIPES) & (cap - 1);
}

/* Destroys the handles retired before now - grace_us, and keeps ah (when not NULL) to be
 * destroyed after its grace; without room for it (out of memory) it is destroyed at once.
 * Takes the list's lock (the caller may hold a stripe's). */
static void retire(struct dgv_ah *ah, uint64_t now, uint64_t grace_us)
{
	pthread_mutex_lock(&retired.lock);
	uint32_t kept = 0;
	for (uint32_t i = 0; i < retired.n; i++)
		if (now - retired.v[i].at >= grace_us)
			dgv_destroy_ah(retired.v[i].ah);
		else
			retired.v[kept++] = retired.v[i];
	retired.n = kept;
	if (ah && retired.n == retired.cap) {
		uint32_t cap = retired.cap ? retired.cap * 2 : 256;
		struct retiree *v = mmap(NULL, pages_of(cap * sizeof *v), PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (v == MAP_FAILED) {
			dgv_destroy_ah(ah);
			ah = NULL;
		} else {
			if (retired.v) {
				memcpy(v, retired.v, retired.n * sizeof *v);
				munmap(retired.v, pages_of(retired.cap * sizeof *v));
			}
			retired.v = v;
			retired.cap = cap;
		}
	}
	if (ah)
		retired.v[retired.n++] = (struct retiree){ah, now};
	pthread_mutex_unlock(&retired.lock);
}

/* Takes entry i out of t, moving the entries after it back where their probe finds them (no
 * tombstones: probes stay as short as the entries present). Needs t's stripe lock. */
static void stab_remove(struct stab *t, uint32_t i)
{
	uint32_t mask = t->cap - 1;
	for (uint32_t j = (i + 1) & mask; t->v[j].used; j = (j + 1) & mask) {
		uint32_t k = home_of(t->v[j].h, t->cap);
		/* j's entry may fill the hole at i unless its home lies cyclically in (i, j] */
		bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
		if (!stays) {
			t->v[i] = t->v[j];
			i = j;
		}
	}
	memset(&t->v[i], 0, sizeof t->v[i]);
	t->n--;
}

static uint64_t idle_us(void)
{
	static _Atomic uint64_t v;
	uint64_t x = atomic_load_explicit(&v, memory_order_relaxed);
	if (!x) {
		x = (uint64_t)dg_env_long(DG_ENV_DEST_IDLE_MS) * 1000;
		atomic_store_explicit(&v, x, memory_order_relaxed);
	}
	return x;
}

/* Forgets t's destinations unused since its last sweep (a clock sweep: a use sets ref, a sweep
 * clears it, an entry found clear is forgotten: after one to two intervals idle), except one
 * whose discovery question is out. Their handles are retired (retire). Needs t's stripe lock. */
static void stab_sweep(struct stab *t, uint64_t now)
{
	t->swept_us = now;
	retire(NULL, now, idle_us());
	uint32_t gone = 0;
	for (uint32_t i = 0; i < t->cap; i++) {
		struct peer *p = &t->v[i];
		p->doomed = p->used && !p->ref && !p->nonce;
		gone += p->doomed;
		p->ref = 0;
	}
	/* an entry moved into the hole is looked at again; none moves past one not yet looked at */
	for (uint32_t i = 0; gone && i < t->cap; i++)
		while (t->v[i].used && t->v[i].doomed) {
			struct peer *p = &t->v[i];
			struct dgv_ah *ahs[2] = {p->ah && p->ah_gen == G.gen ? p->ah : NULL,
						 p->dah && p->dah_gen == G.gen ? p->dah : NULL};
			for (int k = 0; k < 2; k++)
				if (ahs[k])
					retire(ahs[k], now, idle_us());
			stab_remove(t, i);
			gone--;
			atomic_fetch_add_explicit(&forgotten, 1, memory_order_relaxed);
		}
}

/* Moves t's entries into a table of cap entries (a power of two). Returns 0 or -ENOMEM. Needs
 * t's stripe lock. */
static int stab_grow(struct stab *t, uint32_t cap)
{
	/* pages of their own, not the program's heap: kept while the program's buffers come and
	 * go around it, a table (or any object kept per destination) pins glibc's heap, which then
	 * grows instead of reusing them (the soak's Python echo servers: +1.5 kB per client) */
	struct peer *v = mmap(NULL, stab_bytes(cap), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (v == MAP_FAILED)
		return -ENOMEM;
	for (uint32_t i = 0; i < t->cap; i++) {
		struct peer *o = &t->v[i];
		if (!o->used)
			continue;
		uint32_t at = home_of(o->h, cap);
		while (v[at].used)
			at = (at + 1) & (cap - 1);
		v[at] = *o;
	}
	if (t->v)
		munmap(t->v, stab_bytes(t->cap));
	t->v = v;
	t->cap = cap;
	return 0;
}

/* The entry for a, inserted when absent (insert=true), marked used. Needs the stripe of hash h.
 * A new entry may first sweep the stripe (stab_sweep). */
static struct peer *find(const union dgv_sockaddr *a, socklen_t alen, uint32_t h, bool insert)
{
	struct stab *t = &tabs[h % PEER_STRIPES];
	uint32_t max = PEER_SLOTS / PEER_STRIPES;
	bool swept = false;
again:
	if (!t->cap && !insert)
		return NULL;
	/* room for one more at three quarters full at most: probes stay short */
	if (insert && (t->n + 1) * 4 > t->cap * 3 && t->cap < max && stab_grow(t, t->cap ? t->cap * 2 : 16))
		return NULL;
	uint32_t mask = t->cap - 1, start = home_of(h, t->cap);
	for (uint32_t k = 0; k < t->cap; k++) {
		struct peer *p = &t->v[(start + k) & mask];
		if (!p->used) {
			if (!insert)
				break;
			/* a new destination: the time to forget the idle ones (the clock is read
			 * here only, not per datagram) */
			uint64_t now = peer_clock();
			bool full = (t->n + 1) * 4 > t->cap * 3;
			if (!swept && (!t->swept_us || now - t->swept_us >= idle_us() ||
				       (full && now - t->swept_us >= 1000000u))) {
				swept = true;
				if (t->swept_us) {
					stab_sweep(t, now);
					goto again; /* entries moved */
				}
				t->swept_us = now;
			}
			if (full)
				break; /* the stripe is full (three quarters of its most) */
			t->n++;
			memset(p, 0, sizeof *p);
			p->used = 1;
			p->ref = 1;
			p->h = h;
			p->alen = alen;
			memcpy(&p->a, a, alen < sizeof p->a ? alen : sizeof p->a);
			p->local = ip_local(a);
			const char *where = NULL;
			int m = G.rules ? (int)dg_rules_match_where(G.rules, IPPROTO_UDP, DG_ROLE_SENDER,
								    &a->sa, alen, &where)
					: IWARP_MODE_AUTO;
			if (m == IWARP_MODE_OFF)
				p->rule = RULE_OFF;
			else if (where && strcmp(where, "default mode") && m != IWARP_MODE_AUTO) {
				/* a rules line names this destination and its service: a socket of
				 * another service sends it plain (framed, the receiver would drop it) */
				p->rule = RULE_TRUST;
				p->rule_caps = m == IWARP_MODE_RD ? CAP_RD : (uint8_t)(CAP_UD | CAP_UDV);
			}
			if (G.trust_all && p->rule != RULE_OFF)
				p->rule = RULE_TRUST, p->rule_caps = 0xff;
			return p;
		}
		if (p->h == h && dgv_addr_eq(&p->a, a)) {
			p->ref = 1;
			return p;
		}
	}
	if (insert && !warned_full) {
		warned_full = true;
		DG_WARN("more than %u destinations: new ones go plain", PEER_SLOTS / 4 * 3);
	}
	return NULL;
}

/* Is the abstract unix name a bound somewhere in this network namespace? */
bool registry_exists(const struct sockaddr_un *a, socklen_t al)
{
	if (probe_fd < 0) {
		int fd = real.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return false;
		fd = fd_to_high(fd);
		int expect = -1;
		if (!__atomic_compare_exchange_n(&probe_fd, &expect, fd, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			own_close(fd);
	}
	/* connecting a datagram unix socket only checks that the name is bound */
	return real.connect(probe_fd, (const struct sockaddr *)a, al) == 0;
}

/* Does the registry name for (port, svc) exist on this host? */
static bool registry_has(unsigned port, int svc)
{
	return reg_has(reg_key(svc, port));
}

static uint8_t cap_of(int svc)
{
	return svc == IWARP_MODE_RD ? CAP_RD : svc == SVC_UDV ? CAP_UDV : svc == IWARP_MODE_RC ? CAP_RC : CAP_UD;
}

static uint8_t caps_of_disco(uint8_t c)
{
	return (uint8_t)(((c & DG_DISCO_UD) ? CAP_UD : 0) | ((c & DG_DISCO_RD) ? CAP_RD : 0) |
			 ((c & DG_DISCO_UDV) ? CAP_UDV : 0) | ((c & DG_DISCO_RC) ? CAP_RC : 0));
}

/* An answer from a discovery port (disco_read): believed when it is the one asked of that
 * host about that port. Takes the peer's stripe lock. */
static void on_answer(const union dgv_sockaddr *from, unsigned port, uint64_t nonce, uint8_t caps,
		      uint32_t lease_ms)
{
	union dgv_sockaddr a = *from;
	socklen_t al;
	if (a.sa.sa_family == AF_INET)
		a.sin.sin_port = htons((uint16_t)port), al = sizeof a.sin;
	else
		a.sin6.sin6_port = htons((uint16_t)port), a.sin6.sin6_flowinfo = 0, al = sizeof a.sin6;
	uint32_t h = hash_addr(&a);
	pthread_mutex_t *m = &stripes[h % PEER_STRIPES];
	pthread_mutex_lock(m);
	struct peer *p = find(&a, al, h, false);
	if (p && p->nonce && p->nonce == nonce) {
		uint64_t now = peer_clock();
		uint8_t had = p->caps;
		caps_set(p, caps_of_disco(caps));
		p->nonce = 0;
		atomic_fetch_sub(&asked, 1);
		if (lease_ms > 60000)
			lease_ms = 60000;
		p->lease_until_us = now + (uint64_t)lease_ms * 1000;
		/* asked again at a quarter of the lease: an answer may take three quarters of it on a
		 * loaded host before the destination goes plain */
		p->next_ask_us = p->caps ? now + (uint64_t)lease_ms * 250 : now + RETRY_NO_REMOTE_US;
		if (had != p->caps)
			DG_DBG("port %u on another host speaks:%s%s%s%s", port, p->caps & CAP_UD ? " ud" : "",
			       p->caps & CAP_RD ? " rd" : "", p->caps & CAP_UDV ? " ud-on-device" : "",
			       p->caps & CAP_RC ? " rc" : "");
	} else {
		DG_DBG("discovery: an answer about port %u that was not asked (or asked again since): ignored", port);
	}
	pthread_mutex_unlock(m);
}

/* Another host's destination with no rules line: asks its discovery port when due, expires
 * what was said. Needs p's stripe lock. */
static void remote_check(struct peer *p, const union dgv_sockaddr *to)
{
	uint64_t now = peer_clock();
	if (p->nonce && now - p->asked_us > ASK_WAIT_US) {
		p->nonce = 0; /* no answer: nobody there speaks it (or it was lost) */
		atomic_fetch_sub(&asked, 1);
		caps_set(p, 0);
		p->next_ask_us = now + RETRY_NO_REMOTE_US;
		if (!p->said_silent) {
			/* once per destination: why it stays plain */
			char h[INET6_ADDRSTRLEN] = "?";
			if (to->sa.sa_family == AF_INET)
				inet_ntop(AF_INET, &to->sin.sin_addr, h, sizeof h);
			else
				inet_ntop(AF_INET6, &to->sin6.sin6_addr, h, sizeof h);
			DG_INFO("%s port %u: no discovery answer from that host (no preloaded server there, or "
				"UDP %u filtered): plain", h, port_of(to), disco_port());
			p->said_silent = true;
		}
	}
	if (p->caps && now >= p->lease_until_us)
		caps_set(p, 0); /* not confirmed in time: plain until it is */
	if (!p->nonce && now >= p->next_ask_us) {
		p->nonce = disco_nonce();
		p->asked_us = now;
		if (disco_ask(to, p->nonce) == 0) {
			atomic_fetch_add(&asked, 1);
		} else {
			p->nonce = 0;
			p->next_ask_us = now + RETRY_NO_REMOTE_US;
		}
	}
}

/* One look for peer_route. *pending: no handle because a question to the destination's host is
 * still out (the answer may still say yes). Takes a stripe lock. */
static struct dgv_ah *route_once(const union dgv_sockaddr *to, socklen_t tolen, int svc, bool *pending)
{
	if (atomic_load_explicit(&asked, memory_order_relaxed) > 0)
		disco_read(on_answer);
	uint32_t h = hash_addr(to);
	pthread_mutex_t *m = &stripes[h % PEER_STRIPES];
	pthread_mutex_lock(m);
	struct dgv_ah *ah = NULL;
	struct peer *p = find(to, tolen, h, true);
	if (!p || p->rule == RULE_OFF)
		goto out;
	uint8_t want = cap_of(svc);
	bool sidr = svc == SVC_UDV; /* the device's address resolution: G.dev's handles */
	if (p->rule == RULE_TRUST && !(p->rule_caps & want)) {
		goto out;
	} else if (p->rule != RULE_TRUST) {
		if (p->local) {
			uint64_t now = peer_clock();
			if (now - p->checked_us > (p->caps & want ? LEASE_LOCAL_US : RECHECK_NO_US)) {
				p->checked_us = now;
				uint8_t had = p->caps;
				caps_set(p, (uint8_t)((registry_has(port_of(to), IWARP_MODE_UD) ? CAP_UD : 0) |
						      (registry_has(port_of(to), IWARP_MODE_RD) ? CAP_RD : 0) |
						      (registry_has(port_of(to), SVC_UDV) ? CAP_UDV : 0)));
				if (had != p->caps)
					DG_DBG("port %u now speaks:%s%s%s", port_of(to), p->caps & CAP_UD ? " ud" : "",
					       p->caps & CAP_RD ? " rd" : "", p->caps & CAP_UDV ? " ud-on-device" : "");
			}
		}
		else if (!p->local)
			remote_check(p, to);
		if (!(p->caps & want)) {
			*pending = !p->local && p->nonce;
			goto out;
		}
	}
	if (sidr) {
		if (!p->dah || p->dah_gen != G.gen) {
			/* SIDR asks the destination's device for its QP: one round trip, made once
			 * per destination; a refusal is believed for RETRY_DEV_US */
			uint64_t now = peer_clock();
			p->dah = NULL;
			if (p->dah_fail_us && now - p->dah_fail_us < RETRY_DEV_US)
				goto out;
			if (dgv_create_ah(G.dev.pd, &to->sa, tolen, &p->dah)) {
				p->dah_fail_us = now ? now : 1;
				goto out;
			}
			p->dah_fail_us = 0;
			p->dah_gen = G.gen;
		}
		ah = p->dah;
		goto out;
	}
	if (!p->ah || p->ah_gen != G.gen) {
		p->ah = NULL;
		if (dgv_create_ah(G.host.pd, &to->sa, tolen, &p->ah))
			goto out;
		p->ah_gen = G.gen;
	}
	ah = p->ah;
out:
	pthread_mutex_unlock(m);
	return ah;
}

/* Until `until` (shim_now_us): waits for a discovery answer of family's asking socket and
 * returns true; false once the time is up. */
static bool answer_wait(int family, uint64_t until)
{
	uint64_t now = shim_now_us();
	if (now >= until)
		return false;
	disco_wait(family, (int)((until - now + 999) / 1000));
	return true;
}

struct dgv_ah *peer_route(const union dgv_sockaddr *to, socklen_t tolen, int svc, int wait_ms)
{
	uint64_t until = 0; /* read only when an answer is awaited: not per datagram */
	for (;;) {
		bool pending = false;
		struct dgv_ah *ah = route_once(to, tolen, svc, &pending);
		if (ah || !pending || !wait_ms)
			return ah;
		if (!until)
			until = shim_now_us() + (uint64_t)wait_ms * 1000;
		if (!answer_wait(to->sa.sa_family, until))
			return ah;
	}
}

/* A socket's memo m (peer_heard_memo's, peer_route_memo's key) says a, len, svc until its time. */
static bool memo_hit(const struct peer_memo *m, const union dgv_sockaddr *a, socklen_t len, int svc)
{
	return m->len && m->len == len && m->svc == svc && dgv_addr_eq(&m->a, a) && peer_clock() < m->until;
}

/* m says a, len, svc for life_us from now (nothing when a does not fit). */
static void memo_set(struct peer_memo *m, const union dgv_sockaddr *a, socklen_t len, int svc, uint64_t life_us)
{
	m->len = 0;
	if (len > sizeof m->a)
		return;
	memcpy(&m->a, a, len);
	m->len = len;
	m->svc = svc;
	m->until = peer_clock() + life_us;
}

#define ROUTE_MEMO_US 10000u

struct dgv_ah *peer_route_memo(struct route_memo *m, const union dgv_sockaddr *to, socklen_t tolen, int svc,
			       int wait_ms)
{
	/* Read first: a destination losing its service while peer_route looks voids this memo. */
	unsigned ep = atomic_load_explicit(&route_epoch, memory_order_acquire);
	if (m->epoch == ep && m->gen == G.gen && memo_hit(&m->key, to, tolen, svc))
		return m->ah;
	struct dgv_ah *ah = peer_route(to, tolen, svc, wait_ms);
	m->key.len = 0;
	if (ah) {
		memo_set(&m->key, to, tolen, svc, ROUTE_MEMO_US);
		m->epoch = ep;
		m->gen = G.gen;
		m->ah = ah;
	}
	return ah;
}

void peer_heard(const union dgv_sockaddr *from, socklen_t fromlen, bool framed, int svc)
{
	if (from->sa.sa_family != AF_INET && from->sa.sa_family != AF_INET6)
		return;
	uint32_t h = hash_addr(from);
	pthread_mutex_t *m = &stripes[h % PEER_STRIPES];
	pthread_mutex_lock(m);
	struct peer *p = find(from, fromlen, h, framed);
	if (p) {
		if (framed) {
			p->caps |= cap_of(svc);
			p->checked_us = peer_clock();
			if (!p->local) {
				/* a framed datagram from that port is as good an answer as its host's: the
				 * question due while the destination is used waits for as long as after one
				 * (a SIP dialog's every request asked it again across hosts, on the reply's
				 * path: issue 14 item 3) */
				p->lease_until_us = p->checked_us + (uint64_t)DISCO_LEASE_MS * 1000;
				if (!p->nonce && p->next_ask_us < p->checked_us + (uint64_t)DISCO_LEASE_MS * 250)
					p->next_ask_us = p->checked_us + (uint64_t)DISCO_LEASE_MS * 250;
			}
		} else if (p->caps) {
			p->checked_us = 0; /* it may have stopped speaking: ask before the next send */
			atomic_fetch_add_explicit(&route_epoch, 1, memory_order_release); /* and no memo skips that */
			if (!p->local)
				p->caps = 0, p->next_ask_us = 0; /* another host: plain until it answers again */
		}
	}
	pthread_mutex_unlock(m);
}

#define HEARD_MEMO_US 10000u

void peer_heard_memo(struct peer_memo *m, const union dgv_sockaddr *from, socklen_t fromlen, bool framed,
		     int svc)
{
	/* a datagram at a time on one socket from one peer (a ping-pong, a SIP dialog): one stripe
	 * lock per datagram was a tenth of the shim's locking on the receive path (issue 14) */
	if (framed && memo_hit(m, from, fromlen, svc))
		return;
	peer_heard(from, fromlen, framed, svc);
	m->len = 0;
	if (framed)
		memo_set(m, from, fromlen, svc, HEARD_MEMO_US);
}

void peer_totals(unsigned *known, unsigned long long *gone)
{
	unsigned n = 0;
	for (int k = 0; k < PEER_STRIPES; k++)
		if (pthread_mutex_trylock(&stripes[k]) == 0) { /* at exit: a stripe held stays uncounted */
			n += tabs[k].n;
			pthread_mutex_unlock(&stripes[k]);
		}
	*known = n;
	*gone = atomic_load(&forgotten);
}

void peer_failed(const union dgv_sockaddr *to, socklen_t tolen)
{
	uint32_t h = hash_addr(to);
	pthread_mutex_t *m = &stripes[h % PEER_STRIPES];
	pthread_mutex_lock(m);
	struct peer *p = find(to, tolen, h, false);
	if (p) {
		caps_set(p, 0);
		p->checked_us = peer_clock(); /* plain for one lease, then ask again */
		if (p->rule == RULE_TRUST)
			p->rule = RULE_AUTO;
	}
	pthread_mutex_unlock(m);
}

int peer_remote_wait(const union dgv_sockaddr *to, socklen_t tolen, int svc, int wait_ms)
{
	if (to->sa.sa_family != AF_INET && to->sa.sa_family != AF_INET6)
		return 0;
	uint8_t want = svc == IWARP_MODE_RC ? CAP_RC : cap_of(svc);
	uint64_t until = shim_now_us() + (uint64_t)wait_ms * 1000;
	uint32_t h = hash_addr(to);
	pthread_mutex_t *m = &stripes[h % PEER_STRIPES];
	for (;;) {
		if (atomic_load_explicit(&asked, memory_order_relaxed) > 0)
			disco_read(on_answer);
		pthread_mutex_lock(m);
		struct peer *p = find(to, tolen, h, true);
		int r = -1;
		if (!p || p->local || p->rule == RULE_OFF) {
			r = 0; /* this host's registry or a rules line decides, at once */
		} else if (p->rule == RULE_TRUST) {
			r = (p->rule_caps & want) != 0;
		} else {
			remote_check(p, to);
			if (p->caps & want)
				r = 1;
			else if (!p->nonce)
				r = 0; /* answered "no", or could not ask */
		}
		pthread_mutex_unlock(m);
		if (r >= 0 || !answer_wait(to->sa.sa_family, until))
			return r > 0;
	}
}
