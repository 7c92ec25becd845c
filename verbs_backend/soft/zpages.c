/*
 * zpages.c - zeroed, page-aligned objects for per-QP state that cost resident memory only
 * where they are written (docs/shim.md "Descriptors and memory per socket").
 *
 * calloc touches every page of what it returns (it clears recycled heap memory), so a QP
 * object of 27 kB cost 27 kB of RSS from its creation, most of it reassembly slots, work queue
 * entries and error queues an idle socket never uses. These objects come instead from large
 * MAP_NORESERVE anonymous chunks (one mapping per 64 MiB, not one per object: the number of
 * mappings a process may have is limited), rounded up to whole pages; a freed object's pages
 * are given back with MADV_DONTNEED (zero again, nothing resident) and kept on a free list by
 * size. Objects above ZP_MAX_PAGES pages get a mapping of their own (dg_pages_alloc).
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
static struct zp_free *zp_bins[ZP_MAX_PAGES + 1];
static size_t zp_page;
static pthread_once_t zp_once = PTHREAD_ONCE_INIT;

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

void *dg_zalloc(size_t size)
{
	pthread_once(&zp_once, zp_init);
	size_t n = zp_pages(size ? size : 1);
	if (n > ZP_MAX_PAGES)
		return dg_pages_alloc(size); /* a mapping of its own, as lazy */
	size_t bytes = n * zp_page;
	pthread_mutex_lock(&zp_lock);
	struct zp_free *f = zp_bins[n];
	if (f) {
		zp_bins[n] = f->next;
		pthread_mutex_unlock(&zp_lock);
		f->next = NULL; /* the only word written since MADV_DONTNEED zeroed it */
		return f;
	}
	if (zp_left < bytes) {
		void *c = mmap(NULL, ZP_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
		if (c == MAP_FAILED) {
			pthread_mutex_unlock(&zp_lock);
			return NULL;
		}
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
	pthread_mutex_unlock(&zp_lock);
	return p;
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
	struct zp_free *f = p;
	pthread_mutex_lock(&zp_lock);
	f->next = zp_bins[n];
	zp_bins[n] = f;
	pthread_mutex_unlock(&zp_lock);
}
