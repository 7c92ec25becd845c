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
static atomic_int fdtab_hi = -1; /* the highest descriptor that ever had an entry */
static pthread_once_t fdtab_once = PTHREAD_ONCE_INIT;

static void fdtab_alloc(void)
{
	struct rlimit rl;
	size_t n = 1 << 16;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > n)
		n = rl.rlim_max > (1u << 22) ? (1u << 22) : (size_t)rl.rlim_max;
	void *p = mmap(NULL, n * sizeof *fdtab, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	shim_lsan_root(p, n * sizeof *fdtab); /* sockets live until exit, reachable from here */
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
