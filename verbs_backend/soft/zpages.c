/*
 * zpages.c - zeroed, page-aligned objects for per-QP state that cost resident memory only
 * where they are written (docs/shim.md "Descriptors and memory per socket").
 *
 * calloc touches every page of what it returns (it clears recycled heap memory), so a QP
 * object of 27 kB cost 27 kB of RSS from its creation, most of it reassembly slots, work queue
 * entries and error queues an idle socket never uses. These objects come instead from large
 * MAP_NORESERVE anonymous chunks (one mapping per 64 MiB, not one per object: the number of
 * mappings a process may have is limited), rounded up to whole pages; a freed object's pages
 * are given back with MADV_DONTNEED (zero again, nothing resident) and kept by size in stacks
 * of their own (not linked through the runs, which would write a page of each). Objects above ZP_MAX_PAGES pages get a mapping of their own (dg_pages_alloc).
 *
 * Small objects that live long and come one per destination (address handles) are carved from
 * the same chunks by dg_small_alloc, not taken from the program's heap: each one left between
 * a program's freed buffers pins glibc's heap, which then grows instead of reusing them (the
 * soak's Python UDP echo server grew 1.5 kB of heap per client process, none natively).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "soft.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#define ZP_CHUNK ((size_t)64 << 20)
#define ZP_MAX_PAGES 16

struct zp_free {
	struct zp_free *next;
};

static pthread_mutex_t zp_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *zp_cur;
static size_t zp_left;
/* Freed page runs by size, kept apart from them: a link written into a freed run would make its
 * first page resident again (an RC QP's rest, recycled by the next connection, is meant to stay
 * unwritten). Each bin is a stack of addresses in pages of its own, grown by doubling. */
static struct zp_bin {
	void **v;
	size_t n, cap;
} zp_bins[ZP_MAX_PAGES + 1];
static size_t zp_page;
static pthread_once_t zp_once = PTHREAD_ONCE_INIT;
/* dg_small_alloc: free objects by size class (16-byte steps up to DG_SMALL_MAX) and the rest of
 * the page being carved */
static struct zp_free *sm_bins[DG_SMALL_MAX / 16 + 1];
static uint8_t *sm_cur;
static size_t sm_left;

/* A fork while another thread holds the lock must not leave it held in the child. */
static void zp_prepare(void) { pthread_mutex_lock(&zp_lock); }
static void zp_release(void) { pthread_mutex_unlock(&zp_lock); }

/*
 * Registered from a constructor that runs before the shim's (priority 101): fork's parent and
 * child handlers run in the order they were registered, so the lock is given back before the
 * shim's handlers take socket locks. Registered lazily (after the shim's), the parent handler
 * took a socket's lock while this one was still held, and a thread holding that socket's lock
 * in dg_zalloc deadlocked the fork (ThreadSanitizer, tsanthreads: lock-order inversion).
 */
__attribute__((constructor(101))) static void zp_atfork(void)
{
	pthread_atfork(zp_prepare, zp_release, zp_release);
}

static void zp_init(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	zp_page = pg > 0 ? (size_t)pg : 4096;
}

static size_t zp_pages(size_t size)
{
	return (size + zp_page - 1) / zp_page;
}

/* A fresh run of n pages from the current chunk (a new chunk when it is used up). Needs
 * zp_lock. Returns NULL when no chunk can be mapped. */
static void *zp_carve(size_t n)
{
	size_t bytes = n * zp_page;
	if (zp_left < bytes) {
		void *c = mmap(NULL, ZP_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
		if (c == MAP_FAILED)
			return NULL;
#if defined(__SANITIZE_ADDRESS__)
		/* objects here hold the only pointers to heap objects: LeakSanitizer scans it */
		__lsan_register_root_region(c, ZP_CHUNK);
#endif
		zp_cur = c; /* the rest of the old chunk stays unused: address space only */
		zp_left = ZP_CHUNK;
	}
	void *p = zp_cur;
	zp_cur += bytes;
	zp_left -= bytes;
	return p;
}

void *dg_small_alloc(size_t size)
{
	pthread_once(&zp_once, zp_init);
	if (size > DG_SMALL_MAX)
		return NULL;
	size_t c = (size + 15) / 16, bytes = (c ? c : 1) * 16;
	pthread_mutex_lock(&zp_lock);
	struct zp_free *f = sm_bins[c];
	if (f) {
		sm_bins[c] = f->next;
	} else {
		if (sm_left < bytes) {
			sm_cur = zp_carve(1); /* what was left of the last page stays unused */
			sm_left = sm_cur ? zp_page : 0;
		}
		if (sm_cur) {
			f = (struct zp_free *)sm_cur;
			sm_cur += bytes;
			sm_left -= bytes;
		}
	}
	pthread_mutex_unlock(&zp_lock);
	if (f)
		memset(f, 0, bytes);
	return f;
}

void dg_small_free(void *p, size_t size)
{
	if (!p)
		return;
	size_t c = (size + 15) / 16;
	struct zp_free *f = p;
	pthread_mutex_lock(&zp_lock);
	f->next = sm_bins[c];
	sm_bins[c] = f;
	pthread_mutex_unlock(&zp_lock);
}

void *dg_zalloc(size_t size)
{
	pthread_once(&zp_once, zp_init);
	size_t n = zp_pages(size ? size : 1);
	if (n > ZP_MAX_PAGES)
		return dg_pages_alloc(size); /* a mapping of its own, as lazy */
	pthread_mutex_lock(&zp_lock);
	struct zp_bin *b = &zp_bins[n];
	void *p = b->n ? b->v[--b->n] : zp_carve(n); /* a freed run: zero since MADV_DONTNEED */
	pthread_mutex_unlock(&zp_lock);
	return p;
}

/* Pushes p on b, growing its stack (a failed growth leaves the run unused: address space only).
 * Needs zp_lock. */
static void zp_bin_push(struct zp_bin *b, void *p)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : zp_page / sizeof(void *);
		void **v = mmap(NULL, cap * sizeof *v, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (v == MAP_FAILED)
			return;
		if (b->v) {
			memcpy(v, b->v, b->n * sizeof *v);
			munmap(b->v, b->cap * sizeof *v);
		}
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n++] = p;
}

void dg_zfree(void *p, size_t size)
{
	if (!p)
		return;
	pthread_once(&zp_once, zp_init);
	size_t n = zp_pages(size ? size : 1);
	if (n > ZP_MAX_PAGES) {
		dg_pages_free(p, size);
		return;
	}
	madvise(p, n * zp_page, MADV_DONTNEED);
	pthread_mutex_lock(&zp_lock);
	zp_bin_push(&zp_bins[n], p);
	pthread_mutex_unlock(&zp_lock);
}
