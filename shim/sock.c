/*
 * sock.c - taken UDP sockets: one queue pair per socket on the program's own kernel socket.
 *
 * The QP adopts the program's own descriptor (the kernel socket itself, so bind, connect,
 * getsockname, socket options and multicast memberships stay the kernel's), with pass_plain
 * so plain datagrams from unmodified peers come up as receives, and rx_hold so the kernel's
 * buffer, not ours, decides what is dropped when the program does not read.
 * Receives land in pre-registered slots and are copied to the program; sends below the
 * zero-copy threshold are copied into registered slots, larger UD sends go from the program's
 * own buffer through a registration cache. Framed or plain is decided per destination by
 * discovery (peer.c; docs/shim.md).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "rules.h"
#include "sock.h"

struct shim_global G = {.zcopy_default = SHIM_ZCOPY_DEFAULT};

/* ------------------------------------------------------------------ small helpers */

uint64_t shim_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int shim_nap(struct pollfd *p, nfds_t n, int *timeout_ms)
{
	uint64_t t0 = *timeout_ms > 0 ? shim_now_us() : 0;
	int ms = *timeout_ms < 0 || *timeout_ms > 200 ? 200 : *timeout_ms;
	int c = shim_cancel_open();
	int r = real.poll(p, n, ms);
	shim_cancel_close(c);
	if (r < 0 && errno == EINTR)
		return -EINTR;
	if (*timeout_ms > 0) {
		uint64_t spent = (shim_now_us() - t0) / 1000;
		*timeout_ms = spent >= (uint64_t)*timeout_ms ? 0 : *timeout_ms - (int)spent;
		if (*timeout_ms == 0)
			return -EAGAIN;
	}
	return 0;
}

void *shim_pages(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* The program's descriptor limit now (RLIMIT_NOFILE's soft value), at most INT_MAX. */
static int nofile_cur(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT_MAX)
		return INT_MAX;
	return (int)rl.rlim_cur;
}

/* Where the shim's own descriptors start: away from the low numbers programs expect (the
 * kernel hands out the lowest free number, so a program under the shim gets the numbers it
 * gets natively), in the top quarter of a small limit, 2048-4096 below a large one. */
static int high_lo(void)
{
	int cur = nofile_cur();
	if (cur == INT_MAX)
		return 3;
	if (cur > 4096)
		return cur - 4096 + (cur > 8192 ? 2048 : 0);
	return cur / 4 * 3 > 3 ? cur / 4 * 3 : 3;
}

/* A private duplicate of fd for the shim's own use (marked own, close-on-exec), away from the
 * low numbers programs expect when one is free there, or -1 with errno. */
int high_fd(int fd)
{
	int n = real.fcntl(fd, F_DUPFD_CLOEXEC, high_lo());
	if (n < 0)
		n = real.fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (n >= 0)
		own_mark(n);
	return n;
}

bool own_room(int need, const char *what)
{
	int cur = nofile_cur(), cap = cur == INT_MAX ? INT_MAX : cur / 4;
	if (own_count() + need <= cap)
		return true;
	static atomic_bool said;
	if (what && !atomic_exchange(&said, true))
		DG_INFO("%s stays with the OS: the shim holds %d descriptors, a quarter of RLIMIT_NOFILE (%d), "
			"and leaves the rest to the program (raise the limit, e.g. ulimit -n, to carry more)",
			what, own_count(), cur);
	return false;
}

int own_close(int fd)
{
	own_clear(fd);
	return real.close(fd);
}

int shim_thread(void *(*fn)(void *), void *arg)
{
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals are not ours */
	pthread_t th;
	int r = pthread_create(&th, &at, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
	return -r;
}

int shim_spin_us(void)
{
	static int v = -1;
	int x = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (x >= 0)
		return x;
	x = (int)dg_env_long(DG_ENV_SPIN_US);
	__atomic_store_n(&v, x, __ATOMIC_RELAXED);
	return x;
}

int fd_to_high(int fd)
{
	int h = high_fd(fd);
	if (h < 0) {
		own_mark(fd);
		return fd;
	}
	own_close(fd);
	return h;
}

/*
 * Grows the process's descriptor table to cover the shim's range now, at load, while the
 * process has one thread. The kernel grows it on the first descriptor above its size, and in
 * a process with several threads growing it waits for an RCU grace period (expand_fdtable):
 * 10-15 ms on these machines, paid by the first send of a socket taken after the program
 * started threads (VLC's sender, inside its stream). Single-threaded it costs ~40 us. Tables
 * never shrink; a table for more than 256K descriptors (2 MiB) is left to be grown on use.
 */
static void high_fd_reserve(void)
{
	if (G.disabled)
		return; /* no socket will be taken */
	int lo = high_lo();
	if (lo <= 3 || lo >= (1 << 18))
		return;
	int t = eventfd(0, EFD_CLOEXEC);
	if (t < 0)
		return;
	int n = real.fcntl(t, F_DUPFD_CLOEXEC, lo);
	if (n >= 0)
		real.close(n);
	own_close(t);
}

int sock_lock(struct sock *s)
{
	pthread_mutex_lock(&s->lock);
	if (unlikely(s->gen != G.gen))
		sock_reset_after_fork(s);
	return 0;
}

void sock_unlock(struct sock *s) { pthread_mutex_unlock(&s->lock); }
#define lock_sock sock_lock
#define unlock_sock sock_unlock

/* ------------------------------------------------------------------ process start */

static void scan_inherited(void);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* A provider's thread (dgv_set_thread_hook): everything it calls is the shim's own. */
static void own_thread(void) { shim_depth++; }

static void init_once_fn(void)
{
	G.gen = 1;
	dgv_set_thread_hook(own_thread);
	if (dg_rules_from_env(&G.rules) < 0 && !G.rules)
		G.disabled = true;
	if (G.rules && dg_rules_disabled(G.rules))
		G.disabled = true;
	long z = dg_env_long(DG_ENV_ZCOPY_THRESHOLD);
	if (z >= 0)
		G.zcopy_default = (int)z;
	/* a bad provider name (env.c said so) keeps every socket on soft: the program runs */
	int pw = dg_env_word(DG_ENV_PROVIDER);
	G.want_dev = pw == DG_PROVIDER_AUTO ? DEV_AUTO : pw == DG_PROVIDER_IBVERBS ? DEV_YES : DEV_NO;
	G.trust_all = dg_env_word(DG_ENV_DISCOVERY) == DG_OFF; /* a bad value keeps it on */
	shim_pid = getpid();
	pthread_atfork(NULL, shim_atfork_parent, shim_atfork_child);
	stats_init();
	peer_init();
	disco_init();
	high_fd_reserve(); /* from the constructor: the process has one thread yet */
	if (!G.disabled)
		scan_inherited();
	DG_DBG("loaded: %s, %u rules, default mode %s, zero-copy from %d bytes",
		G.disabled ? "disabled (sockets left to the OS)" : "active",
		G.rules ? dg_rules_count(G.rules) : 0, dg_mode_name(shim_default_mode()),
		G.zcopy_default);
}

void shim_init(void) { pthread_once(&init_once, init_once_fn); }

int shim_default_mode(void)
{
	if (G.disabled || !G.rules)
		return IWARP_MODE_OFF;
	return dg_rules_match(G.rules, IPPROTO_UDP, DG_ROLE_ANY, NULL, 0);
}

/* The verbs context, PD and the CQ size, made with the first queue pair (the provider's
 * thread must not start in a constructor). Returns 0 or -errno. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

/* Opens a context as ca says into pv: context, capabilities, then the PD, published last for
 * the lock-free readers. Needs ctx_lock. Returns 0 or -errno (pv->pd NULL then). */
static int pv_open(struct shim_pv *pv, const struct dgv_context_attr *ca)
{
	__atomic_store_n(&pv->pd, NULL, __ATOMIC_RELAXED);
	pv->ctx = NULL;
	struct dgv_context *c;
	struct dgv_pd *pd;
	int rc = dgv_open(ca, &c);
	if (rc)
		return rc;
	if ((rc = dgv_query_caps(c, &pv->caps)) || (rc = dgv_alloc_pd(c, &pd))) {
		dgv_close(c);
		return rc;
	}
	pv->ctx = c;
	pv->gen = G.gen;
	__atomic_store_n(&pv->pd, pd, __ATOMIC_RELEASE);
	return 0;
}

int ctx_get(void)
{
	if (likely(__atomic_load_n(&G.host.pd, __ATOMIC_ACQUIRE) && G.host.gen == G.gen))
		return 0;
	pthread_mutex_lock(&ctx_lock);
	int rc = 0;
	if (!G.host.pd || G.host.gen != G.gen) {
		/* after fork the parent's context is abandoned: its thread does not exist here;
		 * the soft provider is the one that adopts the program's sockets (a device context
		 * is dev_get's) */
		rc = pv_open(&G.host, &(struct dgv_context_attr){.provider = DGV_PROV_SOFT});
		if (!rc)
			DG_INFO("verbs provider %s", dgv_provider_name(G.host.ctx));
		static bool said_err, said_fds; /* under ctx_lock */
		if (rc == -EMFILE || rc == -ENFILE) {
			/* the descriptor limit, not a broken installation: tried again by the next
			 * socket, when the program may have closed some */
			if (!said_fds)
				DG_INFO("no verbs provider yet (%s): sockets stay with the OS until descriptors "
					"are free", strerror(-rc));
			said_fds = true;
		} else if (rc && !said_err) {
			dg_log_always("no verbs provider (%s): UDP sockets left to the OS", strerror(-rc));
			said_err = true;
		}
	}
	pthread_mutex_unlock(&ctx_lock);
	return rc;
}

static bool addr_unspecified(const union dgv_sockaddr *a)
{
	return a->sa.sa_family == AF_INET ? a->sin.sin_addr.s_addr == htonl(INADDR_ANY)
					  : IN6_IS_ADDR_UNSPECIFIED(&a->sin6.sin6_addr);
}

static bool addr_loopback(const union dgv_sockaddr *a)
{
	return a->sa.sa_family == AF_INET ? (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127
					  : IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr);
}

/*
 * The RDMA device's context for a UDP socket bound to `local` (which may be the wildcard;
 * `dest`, when not NULL, is where its first datagram goes), opened with the first socket that
 * wants one (and again in a forked child). DGSHIM_PROVIDER=ibverbs tries for every socket;
 * auto only when there is a specific address to choose a device by: the socket's own, else
 * its destination (rdma_cm resolves it through the routing table), or DGSHIM_IBV_DEVICE names
 * one. Loopback never has a device. One device per process: a socket on another address
 * stays soft. A failed open is not retried for the same address. Returns 0 (G.dev
 * set) or -errno; either way G.dev_why says what was chosen and why. Takes ctx_lock.
 */
int dev_get(const union dgv_sockaddr *local, socklen_t ll, const union dgv_sockaddr *dest)
{
	if (G.want_dev == DEV_NO)
		return -ENODEV;
	if (likely(__atomic_load_n(&G.dev.pd, __ATOMIC_ACQUIRE) && G.dev.gen == G.gen))
		return 0;
	/* the address that chooses the device: the socket's own, else its destination */
	const union dgv_sockaddr *by = local;
	if (addr_unspecified(local)) {
		by = dest && dest->sa.sa_family == local->sa.sa_family && !addr_unspecified(dest) ? dest : NULL;
		ll = local->sa.sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	}
	if (by && addr_loopback(by))
		by = NULL;
	if (!by && G.want_dev == DEV_AUTO && !dg_env_str(DG_ENV_IBV_DEVICE))
		return -ENODEV;
	static union dgv_sockaddr failed_at;
	static unsigned failed_gen, tries;
	pthread_mutex_lock(&ctx_lock);
	int rc = 0;
	if (!G.dev.pd || G.dev.gen != G.gen) {
		union dgv_sockaddr a = {0};
		if (by) {
			a = *by;
			if (a.sa.sa_family == AF_INET)
				a.sin.sin_port = 0;
			else
				a.sin6.sin6_port = 0;
		}
		/* a failed open costs a device scan: not again for the same address, and not more
		 * than 8 times in a process (a program on many addresses of a host without one) */
		if (failed_gen == G.gen && (dgv_addr_eq(&failed_at, &a) || tries >= 8)) {
			rc = -ENODEV;
			goto out;
		}
		if (failed_gen != G.gen)
			tries = 0;
		tries++;
		struct dgv_context_attr ca = {.provider = DGV_PROV_IBVERBS, .addr = by ? &a.sa : NULL,
					      .addrlen = by ? ll : 0};
		rc = pv_open(&G.dev, &ca);
		if (!rc) {
			/* "ibverbs: asked for (device rxe0 (...))": the device part */
			const char *w = dgv_provider_why(G.dev.ctx), *d = strstr(w, "(device ");
			int dl = d ? (int)strlen(d) - 9 : -1; /* "(device " and the last ")" */
			snprintf(G.dev_why, sizeof G.dev_why, "%s: on the RDMA device %.*s",
				 G.want_dev == DEV_YES ? "ibverbs" : "auto", dl > 0 ? dl : (int)strlen(w),
				 dl > 0 ? d + 8 : w);
			dg_log(DG_LOG_INFO, "provider %s", G.dev_why);
		}
		if (rc) {
			failed_at = a, failed_gen = G.gen;
			/* named by the address the program used (a loopback one included) */
			const union dgv_sockaddr *shown = by ? by : !addr_unspecified(local) ? local : NULL;
			char as[INET6_ADDRSTRLEN] = "*";
			if (shown)
				inet_ntop(shown->sa.sa_family,
					  shown->sa.sa_family == AF_INET ? (const void *)&shown->sin.sin_addr
									 : (const void *)&shown->sin6.sin6_addr,
					  as, sizeof as);
			snprintf(G.dev_why, sizeof G.dev_why,
				 "%s: UDP sockets on soft (no RDMA device opened for %s: %s)",
				 G.want_dev == DEV_YES ? "ibverbs" : "auto", as,
				 rc == -ENODEV ? "none found or none serves it" : strerror(-rc));
			/* asked for by name: say so even when logging is off */
			if (G.want_dev == DEV_YES)
				dg_log_always("DGSHIM_PROVIDER=%s", G.dev_why); /* "ibverbs: ..." */
			else
				DG_INFO("provider %s", G.dev_why);
		}
	}
out:
	pthread_mutex_unlock(&ctx_lock);
	return rc;
}

/* ------------------------------------------------------------------ socket objects */

/*
 * Socket objects are type-stable: one whose last reference went is kept on this list and
 * reused by the next sock_new, never given back to malloc. A program call that looked its
 * descriptor up (fd_get) just as another thread's close took it out of the table so touches a
 * struct sock, never freed memory: its sock_hold finds holds 0 (on the list), or finds another
 * socket made there since, which taken() sees by looking the descriptor up again. What the
 * list keeps is at most the most sockets the program had open at once (malloc's heap would
 * have kept the chunks too); sockets opened and closed one after another reuse one object.
 */
static struct {
	pthread_mutex_t lock;
	struct sock *head[2]; /* through retire_next: datagram objects, stream (small) ones */
} pool = {PTHREAD_MUTEX_INITIALIZER, {NULL, NULL}};

/* A zeroed object for sock_new, from the list or the heap: a whole struct sock, or for a
 * stream (small) SOCK_STREAM_SIZE bytes of it. holds and gone of a reused one are not written
 * but atomically (a late lookup may read them meanwhile). NULL: no memory. */
static struct sock *sock_alloc(bool small)
{
	size_t size = small ? SOCK_STREAM_SIZE : sizeof(struct sock);
	pthread_mutex_lock(&pool.lock);
	struct sock *s = pool.head[small];
	if (s)
		pool.head[small] = s->retire_next;
	pthread_mutex_unlock(&pool.lock);
	if (!s) {
		if ((s = calloc(1, size)))
			s->small = small;
		return s;
	}
	_Static_assert(offsetof(struct sock, gone) > offsetof(struct sock, holds), "holds, then gone");
	_Static_assert(offsetof(struct sock, small) < SOCK_STREAM_SIZE, "a small object has its size");
	size_t after = offsetof(struct sock, gone) + sizeof s->gone;
	memset(s, 0, offsetof(struct sock, holds));
	memset((char *)s + after, 0, size - after);
	atomic_store_explicit(&s->gone, false, memory_order_relaxed);
	s->small = small;
	return s;
}

void sock_unhold(struct sock *s)
{
	if (atomic_fetch_sub_explicit(&s->holds, 1, memory_order_acq_rel) != 1)
		return;
	free(s->strm); /* a stream's part stayed (dead) for the calls in flight: stream_teardown */
	s->strm = NULL;
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_lock(&pool.lock);
	s->retire_next = pool.head[s->small];
	pool.head[s->small] = s;
	pthread_mutex_unlock(&pool.lock);
}

static struct sock *sock_new(int fd, int domain, int mode, bool stream)
{
	struct sock *s = sock_alloc(stream);
	if (!s)
		return NULL;
	s->ent.kind = ENT_SOCK;
	s->ent.ops = &dgram_ops; /* stream_attach makes it a stream */
	pthread_mutex_init(&s->lock, NULL);
	atomic_store(&s->refs, 1);
	static _Atomic uint64_t next_id;
	s->id = atomic_fetch_add(&next_id, 1) + 1;
	s->family = domain;
	s->mode = mode;
	s->qfd = -1;
	s->regfd = -1;
	s->zcopy = G.zcopy_default;
	s->gen = G.gen;
	s->st = stats_slot(s, fd);
	/* last: a late lookup of a reused object may hold it from here (taken() then finds
	 * whether the descriptor names it) */
	atomic_store_explicit(&s->holds, 1, memory_order_release);
	return s;
}

/* A stream socket object installed at fd (accepted or created). Returns it, or NULL (out of
 * memory: the OS carries the socket). */
struct sock *sock_new_stream(int fd, int domain, bool nonblock, int mode)
{
	struct sock *s = sock_new(fd, domain, mode, true);
	if (!s)
		return NULL;
	if (stream_attach(s)) {
		stats_release(s);
		sock_unhold(s); /* back to the list: never given back to malloc */
		return NULL;
	}
	s->user_nonblock = nonblock;
	struct ent *old = fd_set_ent(fd, &s->ent);
	if (old && old->kind == ENT_SOCK)
		sock_put((struct sock *)old);
	return s;
}

static void sock_take(int fd, int domain, int type, int protocol);

void sock_created(int fd, int domain, int type, int protocol)
{
	shim_init();
	sock_take(fd, domain, type, protocol);
}

/* Takes a new or inherited socket; the start-up scan calls it from inside shim_init. */
static void sock_take(int fd, int domain, int type, int protocol)
{
	if (G.disabled)
		return;
	if ((type & 0xff) == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP)) {
		/* TCP: whether it is carried is decided at connect/listen (stream.c) */
		bool off = G.rules && dg_rules_match(G.rules, IPPROTO_TCP, DG_ROLE_ANY, NULL, 0) == IWARP_MODE_OFF;
		sock_new_stream(fd, domain, (type & SOCK_NONBLOCK) != 0, off ? IWARP_MODE_OFF : IWARP_MODE_AUTO);
		return;
	}
	if ((type & 0xff) != SOCK_DGRAM || (protocol != 0 && protocol != IPPROTO_UDP))
		return; /* raw, ICMP, SCTP and UDP-Lite stay with the OS */
	int mode = shim_default_mode();
	if (mode == IWARP_MODE_OFF || mode == IWARP_MODE_RC)
		mode = IWARP_MODE_OFF;
	struct sock *s = sock_new(fd, domain, mode == IWARP_MODE_OFF ? IWARP_MODE_AUTO : mode, false);
	if (!s)
		return; /* out of memory: the OS carries it */
	s->user_nonblock = (type & SOCK_NONBLOCK) != 0;
	if (mode == IWARP_MODE_OFF) {
		/* the rules keep it on the OS unless a later rule (bind address) or the program says
		 * otherwise: remember it, untaken */
		s->mode = IWARP_MODE_OFF;
	}
	struct ent *old = fd_set_ent(fd, &s->ent);
	if (old && old->kind == ENT_SOCK)
		sock_put((struct sock *)old);
}

/* Takes fd if it is an AF_INET/AF_INET6 UDP socket the program already holds (inherited, or
 * received over a unix socket). Returns true when it was one (taken unless the rules say off). */
static bool take_existing_udp(int fd)
{
	int dom = 0, type = 0, proto = 0;
	socklen_t l = sizeof dom;
	if (real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) || (dom != AF_INET && dom != AF_INET6))
		return false;
	l = sizeof type;
	if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) || type != SOCK_DGRAM)
		return false;
	l = sizeof proto;
	if (real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) || proto != IPPROTO_UDP)
		return false;
	int fl = real.fcntl(fd, F_GETFL);
	sock_take(fd, dom, SOCK_DGRAM | (fl >= 0 && (fl & O_NONBLOCK) ? SOCK_NONBLOCK : 0), proto);
	struct sock *s = fd_sock(fd);
	if (s)
		s->shared = true; /* the process that handed it over may still read it */
	return true;
}

/* Inherited across exec: the new image takes its UDP sockets again (the old image's registry
 * names died with it, peers re-discover). */
static void scan_inherited(void)
{
	struct rlimit rl;
	int max = 1024;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		max = (int)(rl.rlim_cur < 65536 ? rl.rlim_cur : 65536);
	for (int fd = 0; fd < max; fd++) {
		struct stat st;
		if (fstat(fd, &st) < 0) {
			if (errno == EBADF && fd > 256) {
				/* sparse tables: stop after a long run of closed descriptors */
				int gap = 0;
				while (fd < max && real.fcntl(fd, F_GETFD) < 0 && ++gap < 1024)
					fd++;
				if (gap >= 1024)
					break;
			}
			continue;
		}
		if (!S_ISSOCK(st.st_mode))
			continue;
		if (!take_existing_udp(fd))
			continue;
		/* the queue pair (and its registry name) comes with the first use: no provider
		 * thread may start inside a constructor */
		DG_DBG("fd %d: inherited UDP socket taken", fd);
	}
}

void sock_adopt_fd(int fd)
{
	if (G.disabled || fd_get(fd))
		return;
	if (!take_existing_udp(fd))
		return;
	struct sock *s = fd_sock(fd);
	if (s && s->mode != IWARP_MODE_OFF) {
		union dgv_sockaddr la;
		socklen_t ll = sizeof la;
		/* a bound socket may already be someone's peer: take over its traffic now */
		if (getsockname(fd, &la.sa, &ll) == 0 &&
		    (la.sa.sa_family == AF_INET ? la.sin.sin_port : la.sin6.sin6_port)) {
			pthread_mutex_lock(&s->lock);
			qp_setup(s, fd);
			pthread_mutex_unlock(&s->lock);
		}
	}
}

void sock_duped(int fd, int fd2)
{
	struct sock *s = fd_sock(fd);
	if (!s)
		return;
	atomic_fetch_add(&s->refs, 1);
	struct ent *old = fd_set_ent(fd2, &s->ent);
	if (old && old->kind == ENT_SOCK)
		sock_put((struct sock *)old);
}

int sock_other_fd(struct sock *s, int fd)
{
	for (int x = 0, hi = fd_max(); x <= hi; x++)
		if (x != fd && fd_sock(x) == s)
			return x;
	return -1;
}

/* The program lets go of fd, the number s's queue pair reads (s->qfd), while another of its
 * numbers still names the socket: the queue pair moves to that one (a new QP on the same
 * kernel socket, as a mode change makes; what arrived stays queued), so the shim never
 * touches a number the program no longer holds; a stream's live QP moves instead
 * (stream_fd_closing: dgv_qp_set_fd). Takes s->lock. */
static void qp_move_off(struct sock *s, int fd)
{
	if (atomic_load(&s->refs) < 2)
		return; /* the last number: sock_put tears the QP down before the kernel closes */
	sock_lock(s);
	if (sock_is_stream(s)) {
		stream_fd_closing(s, fd);
	} else if (s->qp && s->qfd == fd) {
		int other = sock_other_fd(s, fd);
		qp_teardown(s, false);
		if (other >= 0)
			qp_setup(s, other);
	}
	sock_unlock(s);
}

void sock_closing(int fd)
{
	struct sock *s = fd_sock(fd);
	if (s) {
		ev_fd_gone(s, fd, false);
		qp_move_off(s, fd);
	}
	struct ent *e = fd_set_ent(fd, NULL);
	if (e && e->kind == ENT_SOCK)
		sock_put((struct sock *)e);
}

bool sock_hold(struct sock *s)
{
	int h = atomic_load_explicit(&s->holds, memory_order_relaxed);
	do {
		if (h <= 0 || sock_gone(s))
			return false;
	} while (!atomic_compare_exchange_weak_explicit(&s->holds, &h, h + 1, memory_order_acquire,
							memory_order_relaxed));
	return true;
}

/* Drops one descriptor's reference; the last one tears the queue pair down (the object's
 * memory goes with the last sock_hold reference). */
void sock_put(struct sock *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	struct ep *eps[SHIM_MAX_EPS];
	int n;
	atomic_store_explicit(&s->gone, true, memory_order_release);
	pthread_mutex_lock(&s->lock);
	n = s->neps;
	memcpy(eps, s->eps, (size_t)n * sizeof *eps);
	s->neps = 0;
	pthread_mutex_unlock(&s->lock);
	ev_sock_gone(s, eps, n);
	pthread_mutex_lock(&s->lock);
	if (sock_ops(s)->release)
		sock_ops(s)->release(s);
	if (s->gen == G.gen)
		qp_teardown(s, true);
	stats_release(s);
	if (!s->small) {
		free(s->carry);
		s->carry = NULL;
		free(s->txd);
		s->txd = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	sock_unhold(s);
}

/* ------------------------------------------------------------------ queue pairs */

static void registry_set(struct sock *s, int fd);

void sock_post_rx(struct sock *s)
{
	while (s->qp && s->rx_free_n) {
		uint32_t slot = s->rx_free[--s->rx_free_n];
		struct dgv_sge sge = {(uint64_t)(uintptr_t)rx_data(s, slot), SHIM_SLOT, s->rx_mr->lkey};
		struct dgv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
		if (dgv_post_recv(s->qp, &wr, &bad)) {
			s->rx_free[s->rx_free_n++] = slot;
			break;
		}
	}
}

/* Creates the QP (type from the mode): on the RDMA device when dev_get gives one for the
 * socket's address (UD only; RD is the soft provider's), else soft on the program's own
 * descriptor fd. A device QP that cannot be made (another address than the device's, no UD)
 * leaves the socket to soft, with the reason logged. Needs s->lock. Returns 0 or -errno; on
 * error the socket stays with the OS. */
int qp_setup(struct sock *s, int fd)
{
	if (s->qp)
		return 0;
	if (unlikely(sock_gone(s)))
		return -EBADF; /* closed under a call in flight: fd may name another file by now */
	if (s->broken)
		return -ENODEV;
	int rc = ctx_get();
	if (rc)
		goto fail;
	union dgv_sockaddr la;
	socklen_t ll = sizeof la;
	if (!s->rx_mr) {
		/* a kernel socket must have a port before the QP reads its address */
		if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &(int){0}, &(socklen_t){sizeof(int)}) < 0) {
			rc = -errno;
			goto fail;
		}
		if (getsockname(fd, &la.sa, &ll) == 0 &&
		    ((la.sa.sa_family == AF_INET && la.sin.sin_port == 0) ||
		     (la.sa.sa_family == AF_INET6 && la.sin6.sin6_port == 0))) {
			union dgv_sockaddr any = {0};
			any.sa.sa_family = la.sa.sa_family;
			socklen_t al = la.sa.sa_family == AF_INET ? sizeof any.sin : sizeof any.sin6;
			real.bind(fd, &any.sa, al); /* as the kernel's autobind on first send */
		}
		/* the provider is chosen once per socket: its registrations are that provider's */
		ll = sizeof la;
		s->pv = &G.host;
		if (G.want_dev != DEV_NO && getsockname(fd, &la.sa, &ll) == 0 &&
		    dev_get(&la, ll, s->connected ? &s->peer : s->dest_hint) == 0 &&
		    (G.dev.caps.qp_types & 1u << qp_type_of(s->mode)))
			s->pv = &G.dev;
	}
retry:
	if (!s->rx_area) {
		s->rx_area = shim_pages((size_t)SHIM_RX_SLOTS * SHIM_RX_STRIDE);
		s->tx_area = shim_pages((size_t)SHIM_TX_SLOTS * SHIM_SLOT);
		if (!s->rx_area || !s->tx_area) {
			rc = -ENOMEM;
			goto fail;
		}
		/* reverse order: the stack hands out slot 0 first and keeps reusing the warm ones */
		s->rx_free_n = 0, s->tx_free_n = 0;
		for (int i = SHIM_RX_SLOTS - 1; i >= 0; i--)
			s->rx_free[s->rx_free_n++] = (uint16_t)i;
		for (int i = SHIM_TX_SLOTS - 1; i >= 0; i--)
			s->tx_free[s->tx_free_n++] = (uint16_t)i;
	}
	if (!s->rx_mr &&
	    ((rc = dgv_reg_mr(sock_pd(s), s->rx_area, (size_t)SHIM_RX_SLOTS * SHIM_RX_STRIDE, DGV_ACCESS_LOCAL_WRITE,
			      &s->rx_mr)) ||
	     (rc = dgv_reg_mr(sock_pd(s), s->tx_area, (size_t)SHIM_TX_SLOTS * SHIM_SLOT, 0, &s->tx_mr))))
		goto dev_fail;
	/* the QP reads the program's own number: sock_closing moves it off a number the program
	 * lets go of (docs/shim.md "The queue pair sits on the program's own socket") */
	bool adopt = sock_can(s, DGV_CAP_ADOPT_FD);
	s->qfd = adopt ? fd : -1;
	if (!s->cq && (rc = dgv_create_cq(s->pv->ctx, SHIM_RX_SLOTS + SHIM_TX_SLOTS + 16, &s->cq)))
		goto dev_fail;
	if (sock_can(s, DGV_CAP_BACKGROUND))
		dgv_cq_notify_background(s->cq, 1);
	s->qp_type = qp_type_of(s->mode);
	if (s->qp_type == DGV_QPT_RD && !s->txd && !(s->txd = calloc(SHIM_TX_SLOTS, sizeof *s->txd))) {
		rc = -ENOMEM;
		goto fail;
	}
	struct dgv_qp_init_attr a = {.qp_type = s->qp_type, .send_cq = s->cq, .recv_cq = s->cq,
				     .max_send_wr = SHIM_TX_SLOTS + 8, .max_recv_wr = SHIM_RX_SLOTS,
				     .max_msg_size = SHIM_SLOT, .use_adopt_fd = 1, .adopt_fd = s->qfd,
				     .pass_plain = 1, .rx_hold = 1, .rd_window = 64};
	if (!adopt) {
		/* the device's QP answers on the socket's address and port (SIDR); plain datagrams
		 * from unmodified peers still arrive on the kernel socket, read by data.c */
		ll = sizeof la;
		if (getsockname(fd, &la.sa, &ll)) {
			rc = -errno;
			goto dev_fail;
		}
		a.use_adopt_fd = 0, a.adopt_fd = -1, a.pass_plain = 0, a.rx_hold = 0;
		a.bind_addr = &la.sa, a.bind_len = ll, a.bind_family = la.sa.sa_family;
	}
	if ((rc = dgv_create_qp(sock_pd(s), &a, &s->qp)))
		goto dev_fail;
	/* A socket whose completions its own calls make (a soft UD QP on the program's socket,
	 * dgv_cq_self_driven) is waited on through that socket alone and its CQ never makes an
	 * eventfd; any other gets its CQ's eventfd now, within the shim's share of the
	 * descriptors, so no later wait finds it missing */
	if (!s->cq_fd && !dgv_cq_self_driven(s->cq)) {
		if (adopt && !own_room(1, "a UDP socket")) {
			qp_teardown(s, false);
			s->broken = true; /* its CQ's eventfd would not fit: own_room said why */
			return -EMFILE;
		}
		if ((rc = dgv_cq_fd(s->cq)) < 0) {
			qp_teardown(s, false);
			goto fail;
		}
		__atomic_store_n(&s->cq_fd, true, __ATOMIC_RELAXED);
	}
	sock_post_rx(s);
	/* One datagram off the kernel socket per look: a socket shared with another process leaves
	 * it the rest, and one with no CQ eventfd must not hide datagrams from its other threads
	 * (read ahead into the socket's queue, they would not wake a thread asleep in poll or
	 * epoll on the kernel socket, which an eventfd used to; the rate did not change: udpbench
	 * stream 64 B 198-204 k datagrams/s either way) */
	if (s->shared || !s->cq_fd)
		dgv_qp_set_rx_cap(s->qp, 1);
	registry_set(s, fd);
	stats_note_mode(s);
	DG_DBG("fd %d: %s queue pair %s", fd, s->qp_type == DGV_QPT_RD ? "RD" : "UD",
	       adopt ? "on the program's socket" : "on the RDMA device");
	return 0;
dev_fail:
	if (s->pv != &G.host) {
		DG_WARN("fd %d: no UD queue pair on the device (%s%s): the soft provider carries this socket", fd,
			strerror(-rc), dev_res_hint(s->pv, rc));
		qp_teardown(s, true);
		s->pv = &G.host;
		goto retry;
	}
fail:
	DG_WARN("fd %d: no queue pair (%s): the OS carries this socket", fd, strerror(-rc));
	s->broken = true;
	return rc;
}

/* Pulls provider counters into the socket's. Needs s->lock. */
void stats_pull(struct sock *s)
{
	if (!s->qp)
		return;
	struct dgv_qp_stats q;
	if (dgv_qp_stats(s->qp, &q))
		return;
	s->st->crc_drops = s->base_crc + q.crc_drops;
	s->st->rejected = s->base_rej + q.malformed_drops + q.placement_rejects;
	s->st->lost = s->base_lost + q.reasm_timeouts + q.no_wqe_drops + q.cq_overflows;
	s->st->retransmits = s->base_rexmit + q.rd_retransmits;
	s->st->wire_tx = s->base_wtx + q.tx_datagrams;
	s->st->wire_rx = s->base_wrx + q.rx_datagrams;
}


/* Destroys the QP (keeps slots, MRs and CQ unless all). Needs s->lock. Queued receives are
 * moved to the pending list first, and RD sends are given time to be acknowledged. */
void qp_teardown(struct sock *s, bool all)
{
	if (s->qp) {
		if (s->qp_type == DGV_QPT_RD) {
			uint64_t end = shim_now_us() + 2000000;
			while (s->tx_free_n < SHIM_TX_SLOTS && shim_now_us() < end) {
				rd_gone_check(s);
				consume_cq(s);
				if (s->tx_free_n < SHIM_TX_SLOTS)
					dgv_cq_wait(s->cq, 10);
			}
		}
		/* closing: the socket may live on in another process (fork, exec), so read nothing
		 * more from it; a mode change keeps what arrived */
		if (!all)
			consume_cq(s);
		stats_pull(s);
		s->base_crc = s->st->crc_drops, s->base_lost = s->st->lost, s->base_rej = s->st->rejected;
		s->base_rexmit = s->st->retransmits, s->base_wtx = s->st->wire_tx, s->base_wrx = s->st->wire_rx;
		dgv_destroy_qp(s->qp);
		s->qp = NULL;
		s->qfd = -1; /* the program's number: not ours to close */
		/* flushed receives come back as WR_FLUSH_ERR: their slots are free again */
		if (!all)
			consume_cq(s);
	}
	if (s->regfd >= 0) {
		reg_del(s->regfd);
		s->regfd = -1;
	}
	if (!all)
		return;
	if (s->cq)
		dgv_destroy_cq(s->cq), s->cq = NULL, s->armed = false, __atomic_store_n(&s->cq_fd, false, __ATOMIC_RELAXED);
	if (!s->small)
		zc_cache_clear(s);
	if (s->rx_mr)
		dgv_dereg_mr(s->rx_mr), s->rx_mr = NULL;
	if (s->tx_mr)
		dgv_dereg_mr(s->tx_mr), s->tx_mr = NULL;
	if (s->rx_area)
		munmap(s->rx_area, (size_t)SHIM_RX_SLOTS * SHIM_RX_STRIDE), s->rx_area = NULL;
	if (s->tx_area)
		munmap(s->tx_area, (size_t)SHIM_TX_SLOTS * SHIM_SLOT), s->tx_area = NULL;
}

/* In a forked child: the parent's queue pair, CQ and context belong to the parent (their
 * memory was copied, their thread was not). Start over on the same kernel socket; what the
 * parent had queued stays the parent's. Needs s->lock (re-initialised by the atfork handler). */
void sock_reset_after_fork(struct sock *s)
{
	stream_after_fork(s);
	/* natively a datagram the program peeked is still in the kernel for whoever reads next,
	 * which after fork is most often the child (socat's UDP-RECVFROM fork); the parent drops
	 * its copy (shim_atfork_parent) */
	if (!s->small && s->pend_n && s->pend[s->pend_head].peeked && s->rx_area && !s->carry) {
		struct pend *p = &s->pend[s->pend_head];
		if ((s->carry = malloc(p->len ? p->len : 1))) {
			memcpy(s->carry, rx_data(s, p->slot), p->len);
			s->carry_len = p->len;
			s->carry_src = rx_head(s, p->slot)->src;
			s->carry_srclen = rx_head(s, p->slot)->srclen;
		}
	}
	__atomic_store_n(&s->cq_fd, false, __ATOMIC_RELAXED);
	s->qp = NULL, s->cq = NULL, s->armed = false, s->rx_mr = NULL, s->tx_mr = NULL;
	if (!sock_is_stream(s))
		s->qfd = -1; /* the child's QP takes the number of its first call */
	if (!s->small) {
		s->pend_head = s->pend_n = 0;
		s->rx_free_n = 0, s->tx_free_n = 0; /* qp_setup fills them with the new areas */
		memset(s->zc, 0, sizeof s->zc);
	}
	if (s->rx_area) {
		/* the copied areas are ours; register them with the child's context later */
		munmap(s->rx_area, (size_t)SHIM_RX_SLOTS * SHIM_RX_STRIDE);
		munmap(s->tx_area, (size_t)SHIM_TX_SLOTS * SHIM_SLOT);
		s->rx_area = s->tx_area = NULL;
	}
	s->regfd = -1; /* the parent's entry stays the parent's (registry.c) */
	s->broken = false;
	s->pv = NULL; /* chosen again with the child's first QP */
	s->shared = !sock_is_stream(s); /* the parent reads the same kernel socket */
	s->gen = G.gen;
}

/* In the parent after fork: every UDP socket is now read by two processes. */
void shim_atfork_parent(void)
{
	stream_fork(false);
	for (int fd = 0, hi = fd_max(); fd <= hi; fd++) {
		struct sock *s = fd_sock(fd);
		if (!s || sock_is_stream(s) || s->shared)
			continue;
		pthread_mutex_lock(&s->lock);
		s->shared = true;
		if (s->qp && sock_can(s, DGV_CAP_PEEK))
			dgv_qp_set_rx_cap(s->qp, 1);
		sock_drop_peeked(s); /* the child has it (sock_reset_after_fork) */
		pthread_mutex_unlock(&s->lock);
	}
}

pid_t shim_pid;

void shim_atfork_child(void)
{
	shim_pid = getpid();
	/* single-threaded here: locks held by the parent's other threads are void */
	G.gen++;
	stream_fork(true);
	disco_after_fork();
	peer_after_fork();
	reg_after_fork();
	stats_after_fork();
	for (int fd = 0, hi = fd_max(); fd <= hi; fd++) {
		struct sock *s = fd_sock(fd);
		if (s && s->gen != G.gen) {
			pthread_mutex_init(&s->lock, NULL);
			/* the parent's calls in flight are not here to let go of it */
			atomic_store_explicit(&s->holds, 1, memory_order_relaxed);
			sock_reset_after_fork(s);
		}
	}
	ev_after_fork();
}

/* ------------------------------------------------------------------ discovery registry */

/* u = the abstract unix name "name" (no trailing NUL: abstract names are length-delimited). */
void abstract_name(struct sockaddr_un *u, socklen_t *len, const char *name)
{
	memset(u, 0, sizeof *u);
	u->sun_family = AF_UNIX;
	size_t n = strlen(name);
	if (n > sizeof u->sun_path - 2)
		n = sizeof u->sun_path - 2;
	memcpy(u->sun_path + 1, name, n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Binds the abstract name on a private unix socket at a high descriptor number (per network
 * namespace like ports, and gone with the process). Returns the fd or -errno (-EADDRINUSE:
 * someone holds the name). */
int registry_bind(const struct sockaddr_un *a, socklen_t al)
{
	int u = real.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (u < 0)
		return -errno;
	u = fd_to_high(u);
	if (real.bind(u, (const struct sockaddr *)a, al)) {
		int e = errno;
		own_close(u);
		return -e;
	}
	return u;
}

/* Names the socket's port and current service in the registry (fd: the program's descriptor).
 * Needs s->lock. */
static void registry_set(struct sock *s, int fd)
{
	if (s->regfd >= 0)
		reg_del(s->regfd), s->regfd = -1;
	if (s->mode == IWARP_MODE_OFF || !s->qp)
		return;
	union dgv_sockaddr la;
	socklen_t ll = sizeof la;
	if (getsockname(fd, &la.sa, &ll))
		return;
	unsigned port = ntohs(la.sa.sa_family == AF_INET ? la.sin.sin_port : la.sin6.sin6_port);
	int u = reg_add(reg_key(sock_svc(s), port));
	if (u < 0) {
		DG_DBG("registry name for port %u not made (%s): another socket on this port answers",
		       port, strerror(-u));
		return;
	}
	s->regfd = u;
	disco_serve(); /* other hosts may ask whether this port speaks */
}

/* ------------------------------------------------------------------ options */

int sock_bind(struct sock *s, int fd, const struct sockaddr *a, socklen_t l)
{
	if (real.bind(fd, a, l) < 0)
		return -errno;
	/* TCP has nothing to do here: listen or connect decides */
	return sock_ops(s)->bound ? sock_ops(s)->bound(s, fd, a, l) : 0;
}

int dgram_bound(struct sock *s, int fd, const struct sockaddr *a, socklen_t l)
{
	lock_sock(s);
	if (!s->explicit_mode && G.rules) {
		int m = dg_rules_match(G.rules, IPPROTO_UDP, DG_ROLE_RECEIVER, a, l);
		if (m != IWARP_MODE_RC && m != s->mode && !s->qp)
			s->mode = m;
	}
	if (s->qp)
		registry_set(s, fd);
	else if (s->mode != IWARP_MODE_OFF)
		qp_setup(s, fd); /* bound: peers may start sending framed at once */
	unlock_sock(s);
	return 0;
}

int dgram_connect(struct sock *s, int fd, const struct sockaddr *a, socklen_t l)
{
	int r = real.connect(fd, a, l);
	if (r < 0)
		return -errno;
	lock_sock(s);
	if (a && l >= sizeof(sa_family_t) && a->sa_family == AF_UNSPEC) {
		s->connected = false;
	} else if (a && l <= sizeof s->peer) {
		memcpy(&s->peer, a, l);
		s->peerlen = l;
		s->connected = true;
		if (s->peer.sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s->peer.sin6.sin6_addr)) {
			/* the kernel speaks IPv4 to it; so do our address handles */
		}
	}
	unlock_sock(s);
	return 0;
}

int dgram_shutdown(struct sock *s, int fd, int how)
{
	int r = real.shutdown(fd, how);
	if (r < 0 && errno != ENOTCONN)
		return -errno;
	lock_sock(s);
	if (how == SHUT_RD || how == SHUT_RDWR)
		s->shut_rd = true;
	if (how == SHUT_WR || how == SHUT_RDWR)
		s->shut_wr = true;
	unlock_sock(s);
	return r < 0 ? -errno : 0;
}

static int set_mode(struct sock *s, int fd, int mode)
{
	if (!dg_mode_valid(mode) || mode == IWARP_MODE_RC)
		return -EINVAL;
	lock_sock(s);
	int old = s->mode;
	s->mode = mode;
	s->explicit_mode = true;
	int want = mode == IWARP_MODE_RD ? DGV_QPT_RD : DGV_QPT_UD;
	if (s->pv && !(s->pv->caps.qp_types & 1u << want)) {
		/* this socket's buffers are registered with its provider, which has no such QP */
		DG_WARN("fd %d: IWARP_MODE %s: this socket runs on provider %s, which has no such queue "
			"pair (DGSHIM_PROVIDER=soft gives RD)", fd, dg_mode_name(mode), dgv_provider_name(s->pv->ctx));
		s->mode = old;
		unlock_sock(s);
		return -EOPNOTSUPP;
	}
	if (s->qp && mode != IWARP_MODE_OFF && want != s->qp_type) {
		/* the service changes between datagrams: a new QP of the other type on the same
		 * socket; what the old one had received stays queued for the program */
		qp_teardown(s, false);
		qp_setup(s, fd);
	} else if (s->qp) {
		registry_set(s, fd); /* off: peers stop sending framed; on: they may start */
	} else if (mode != IWARP_MODE_OFF) {
		qp_setup(s, fd);
	}
	stats_note_mode(s);
	if (old != mode)
		DG_DBG("fd %d: IWARP_MODE %s -> %s", fd, dg_mode_name(old), dg_mode_name(mode));
	unlock_sock(s);
	return 0;
}

static int iwarp_get(struct sock *s, int fd, int name, void *v, socklen_t *l)
{
	if (!v || !l)
		return -EFAULT;
	switch (name) {
	case IWARP_MODE:
	case IWARP_ZCOPY_THRESHOLD:
	case IWARP_TAKEN: {
		if (*l < sizeof(int))
			return -EINVAL;
		int x = 0;
		if (s) {
			lock_sock(s);
			x = name == IWARP_MODE ? s->mode : name == IWARP_ZCOPY_THRESHOLD ? s->zcopy
								     : (s->mode != IWARP_MODE_OFF && !s->broken);
			unlock_sock(s);
		} else {
			x = name == IWARP_MODE ? IWARP_MODE_OFF : name == IWARP_ZCOPY_THRESHOLD ? G.zcopy_default : 0;
		}
		memcpy(v, &x, sizeof x);
		*l = sizeof x;
		return 0;
	}
	case IWARP_STATS: {
		struct iwarp_stats st = {0};
		if (s) {
			lock_sock(s);
			stats_pull(s);
			st = *s->st;
			unlock_sock(s);
		}
		size_t n = *l < sizeof st ? *l : sizeof st;
		memcpy(v, &st, n);
		*l = (socklen_t)n;
		return 0;
	}
	default:
		return -ENOPROTOOPT;
	}
}

int shim_iwarp_opt_untaken(int fd, int set, int name, void *v, socklen_t *l)
{
	/* a socket the shim does not carry: readable (off), and IWARP_MODE may take it when it is
	 * a UDP socket the rules left to the OS at creation */
	int probe;
	socklen_t pl = sizeof probe;
	if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &probe, &pl))
		return -errno; /* EBADF, ENOTSOCK as the kernel says */
	if (!set)
		return iwarp_get(NULL, fd, name, v, l);
	if (name != IWARP_MODE && name != IWARP_ZCOPY_THRESHOLD)
		return -ENOPROTOOPT;
	if (!v || *l < sizeof(int))
		return -EINVAL;
	int x;
	memcpy(&x, v, sizeof x);
	if (name == IWARP_MODE && (!dg_mode_valid(x) || x == IWARP_MODE_RC))
		return -EINVAL;
	if (name == IWARP_ZCOPY_THRESHOLD && x < 0)
		return -EINVAL;
	int type = 0, proto = 0, dom = 0;
	socklen_t tl = sizeof type;
	if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl))
		return -errno;
	tl = sizeof dom;
	real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &tl);
	tl = sizeof proto;
	real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &tl);
	if (type != SOCK_DGRAM || (dom != AF_INET && dom != AF_INET6) || proto != IPPROTO_UDP)
		return x == IWARP_MODE_OFF && name == IWARP_MODE ? 0 : -EOPNOTSUPP;
	if (name == IWARP_MODE && x == IWARP_MODE_OFF)
		return 0;
	if (G.disabled)
		return -EOPNOTSUPP; /* a configuration error left everything to the OS */
	shim_init();
	struct sock *s = sock_new(fd, dom, IWARP_MODE_AUTO, false);
	if (!s)
		return -ENOMEM;
	int fl = real.fcntl(fd, F_GETFL);
	s->user_nonblock = fl >= 0 && (fl & O_NONBLOCK);
	struct ent *old = fd_set_ent(fd, &s->ent);
	if (old && old->kind == ENT_SOCK)
		sock_put((struct sock *)old);
	return sock_setsockopt(s, fd, SOL_IWARP, name, v, *l);
}

/* IWARP_MODE of a UDP socket; the rest is the common handling's. */
int dgram_setopt(struct sock *s, int fd, int level, int name, const void *v, socklen_t l)
{
	if (level != SOL_IWARP || name != IWARP_MODE)
		return -ENOSYS;
	if (!v || l < sizeof(int))
		return -EINVAL;
	int x;
	memcpy(&x, v, sizeof x);
	return set_mode(s, fd, x);
}

int sock_setsockopt(struct sock *s, int fd, int level, int name, const void *v, socklen_t l)
{
	if (sock_ops(s)->setopt) {
		int r = sock_ops(s)->setopt(s, fd, level, name, v, l);
		if (r != -ENOSYS)
			return r;
	}
	if (level == SOL_IWARP) {
		if (!v || l < sizeof(int))
			return -EINVAL;
		int x;
		memcpy(&x, v, sizeof x);
		if (name == IWARP_ZCOPY_THRESHOLD) {
			if (x < 0)
				return -EINVAL;
			lock_sock(s);
			s->zcopy = x;
			unlock_sock(s);
			return 0;
		}
		return -ENOPROTOOPT;
	}
	if (real.setsockopt(fd, level, name, v, l) < 0)
		return -errno;
	if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) && v &&
	    l >= sizeof(struct timeval)) {
		const struct timeval *tv = v;
		int ms = shim_timeout_ms(tv->tv_sec, (tv->tv_usec + 999) / 1000);
		lock_sock(s);
		if (name == SO_RCVTIMEO)
			s->rcvtimeo_ms = (int)ms;
		else
			s->sndtimeo_ms = (int)ms;
		unlock_sock(s);
	}
	return 0;
}

int sock_getsockopt(struct sock *s, int fd, int level, int name, void *v, socklen_t *l)
{
	if (sock_ops(s)->getopt) {
		int r = sock_ops(s)->getopt(s, fd, level, name, v, l);
		if (r != -ENOSYS)
			return r;
	}
	if (level == SOL_IWARP)
		return iwarp_get(s, fd, name, v, l);
	if (level == SOL_SOCKET && name == SO_ERROR && v && l && *l >= sizeof(int)) {
		/* an asynchronous error of ours (RD peer gone) reads like ECONNREFUSED would */
		lock_sock(s);
		int e = s->so_error;
		s->so_error = 0;
		unlock_sock(s);
		if (e) {
			real.getsockopt(fd, level, name, v, l); /* clears the kernel's too */
			memcpy(v, &e, sizeof e);
			*l = sizeof e;
			return 0;
		}
	}
	return real.getsockopt(fd, level, name, v, l) < 0 ? -errno : 0;
}

int sock_getfl(struct sock *s, int fd)
{
	int fl = real.fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	return fl; /* the file's flags stay the program's: the QP passes MSG_DONTWAIT */
}

int sock_fcntl_setfl(struct sock *s, int fd, int flags)
{
	int r = real.fcntl(fd, F_SETFL, flags);
	if (r < 0)
		return -errno;
	lock_sock(s);
	s->user_nonblock = (flags & O_NONBLOCK) != 0;
	unlock_sock(s);
	return 0;
}

int sock_fionbio(struct sock *s, int on)
{
	lock_sock(s);
	s->user_nonblock = on != 0;
	unlock_sock(s);
	return 0;
}
