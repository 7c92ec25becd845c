/*
 * fdtab.c - the descriptor table: which object (a taken socket, an epoll instance) stands
 * behind each descriptor number. Lock-free reads; a socket's kind table (s->ops) says what
 * each call does with it.
 */
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "shim.h"

/* One pointer per possible descriptor, in mapped pages (untouched pages cost nothing). */
static _Atomic(struct ent *) *fdtab;
static size_t fdtab_n;
/* One bit per descriptor: the shim's or the provider's own (own_mark), in the same pages. */
static atomic_ulong *ownmap;
static atomic_int own_n;       /* how many are marked */
static atomic_int own_hi = -1; /* the highest ever marked */
static atomic_int fdtab_hi = -1; /* the highest descriptor that ever had an entry */
static pthread_once_t fdtab_once = PTHREAD_ONCE_INIT;

static void fdtab_alloc(void)
{
	struct rlimit rl;
	size_t n = 1 << 16;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > n)
		n = rl.rlim_max > (1u << 22) ? (1u << 22) : (size_t)rl.rlim_max;
	size_t words = (n + 63) / 64;
	size_t len = n * sizeof *fdtab + words * sizeof *ownmap;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	shim_lsan_root(p, n * sizeof *fdtab); /* sockets live until exit, reachable from here */
	ownmap = (atomic_ulong *)((char *)p + n * sizeof *fdtab);
	fdtab = p;
	fdtab_n = n;
}

struct ent *fd_get(int fd)
{
	if (unlikely(!fdtab) || (unsigned)fd >= fdtab_n)
		return NULL;
	return atomic_load_explicit(&fdtab[fd], memory_order_acquire);
}

int fd_max(void)
{
	return atomic_load(&fdtab_hi);
}

struct ent *fd_set_ent(int fd, struct ent *e)
{
	pthread_once(&fdtab_once, fdtab_alloc);
	if (!fdtab || (unsigned)fd >= fdtab_n)
		return NULL;
	for (int hi = atomic_load(&fdtab_hi); e && fd > hi && !atomic_compare_exchange_weak(&fdtab_hi, &hi, fd);)
		;
	return atomic_exchange(&fdtab[fd], e);
}

/* ------------------------------------------------------------------ the shim's own descriptors */

void own_mark(int fd)
{
	pthread_once(&fdtab_once, fdtab_alloc);
	if (!fdtab || (unsigned)fd >= fdtab_n)
		return;
	unsigned long bit = 1ul << (fd % 64);
	if (atomic_fetch_or(&ownmap[fd / 64], bit) & bit)
		return;
	atomic_fetch_add(&own_n, 1);
	for (int hi = atomic_load(&own_hi); fd > hi && !atomic_compare_exchange_weak(&own_hi, &hi, fd);)
		;
}

void own_clear(int fd)
{
	if (!fdtab || (unsigned)fd >= fdtab_n)
		return;
	unsigned long bit = 1ul << (fd % 64);
	if (atomic_fetch_and(&ownmap[fd / 64], ~bit) & bit)
		atomic_fetch_sub(&own_n, 1);
}

bool own_has(int fd)
{
	if (unlikely(!fdtab) || (unsigned)fd >= fdtab_n)
		return false;
	return atomic_load_explicit(&ownmap[fd / 64], memory_order_relaxed) >> (fd % 64) & 1;
}

int own_count(void) { return atomic_load(&own_n); }

int own_max(void) { return atomic_load(&own_hi); }
