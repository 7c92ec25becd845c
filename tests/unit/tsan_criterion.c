/*
 * Linked into the unit tests of a ThreadSanitizer build only (tests/unit/meson.build): lets
 * Criterion start under TSan (Criterion issue #274, "Could not initialize inheritable arena").
 *
 * Criterion's BoxFort places its inheritable arena (shared with the test workers) at a random
 * address in [0x200000000000, 0x7f0000000000): it asks mincore() whether a candidate is free
 * and maps it MAP_FIXED, and gives up after about ten candidates. Under TSan nearly all of that
 * window is TSan's own (shadow, meta, reserved: mapped, so "not free"), the only application
 * range in it is 0x550000000000-0x568000000000, and most unit test binaries abort before their
 * first test. These two wrappers move BoxFort there: a candidate in TSan's part of the window is
 * reported free, and mapping it goes to 0x567000000000 + (the candidate's low bits), a range
 * above where ASLR puts a PIE executable (0x5555.. plus at most 2^40), as a plain hint the
 * kernel honours (never MAP_FIXED, so nothing is clobbered). BoxFort accepts any address inside
 * its window; the workers map the arena at that same address, which TSan allows.
 * Everything else passes through unchanged to TSan's own interceptors (RTLD_NEXT: libtsan is
 * loaded before libc), so TSan still records every mapping; none of our code is affected.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>

#define VIS __attribute__((visibility("default")))

VIS void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off);
VIS int mincore(void *addr, size_t len, unsigned char *vec);

/* In BoxFort's window but not in TSan's application range there: TSan's, never the program's. */
static int tsan_only(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	return a >= 0x200000000000u && a < 0x7f0000000000u &&
	       !(a >= 0x550000000000u && a < 0x568000000000u);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static void *(*next)(void *, size_t, int, int, int, off_t);

	if (!next)
		next = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap64");
	if (addr && tsan_only(addr) && fd >= 0) {
		addr = (void *)(0x567000000000u + ((uintptr_t)addr & 0x000fff000000u));
		flags &= ~MAP_FIXED;
	}
	return next(addr, len, prot, flags, fd, off);
}

int mincore(void *addr, size_t len, unsigned char *vec)
{
	static int (*next)(void *, size_t, unsigned char *);

	if (tsan_only(addr)) {
		errno = ENOMEM; /* "not mapped": no mapping of the program's can be there */
		return -1;
	}
	if (!next)
		next = (int (*)(void *, size_t, unsigned char *))dlsym(RTLD_NEXT, "mincore");
	return next(addr, len, vec);
}
