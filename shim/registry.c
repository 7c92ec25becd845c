/*
 * registry.c - this host's discovery registry: which ports speak datagram-iWARP or carried TCP
 * (docs/shim.md "Discovery").
 *
 * One shared-memory table per network namespace (/dev/shm/dgshim-reg2-<netns inode>, mapped by
 * every preloaded process of the namespace) holds one entry per name ("ud/5060", "rc/80",
 * "rcc/41000-80", ...), each marked with its owner's token; and each process holds ONE
 * abstract unix socket, "dgshim/p/<token>", its presence. An entry counts only while its
 * owner's presence name exists: abstract names are per network namespace and vanish with the
 * last process holding the socket, so an entry never outlives its owner, whether the owner
 * deleted it (close) or died. Before this, each taken socket bound a name of its own: one
 * descriptor per socket; now one per process.
 *
 * The presence socket is inherited by fork (as the per-socket names were), so a name made
 * before the fork stays while parent or child lives (a daemon's parent may exit and leave the
 * serving to the child); the child names the sockets it makes after the fork under a token of
 * its own (reg_after_fork: its presence is bound at its first name), so they vanish with the
 * child, not with the last of parent and child (an RD sender asks the registry whether a
 * destination that stopped acknowledging is gone). A child never deletes its parent's entries
 * (its sockets forget the handles at fork). exec closes both (close-on-exec): a new image gets
 * a new token.
 *
 * Concurrency: entries are claimed with a compare-and-swap on the owner, then the key (one
 * 64-bit word) is stored; a reader checks the key again after reading the owner. Two processes naming the same key at once may both get an entry: the name then exists
 * while either lives, which is what the host's ports say too. Lookups scan a fixed window of
 * REG_PROBE entries (no tombstones needed); a dead owner's entry is taken over when a window
 * has no free one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "sock.h"

#define REG_SLOTS (1u << 16)
#define REG_PROBE 64u
#define REG_FILE_FMT "/dev/shm/dgshim-reg2-%llu"

/* 16 bytes: the whole table is 1 MiB, and what a process touches of it counts in its RSS */
struct reg_ent {
	_Atomic uint64_t owner; /* the holder's token; 0: free */
	_Atomic uint64_t key;   /* REG_KEY(...) once claimed; 0: none */
};
_Static_assert(sizeof(struct reg_ent) == 16, "packed entries");

static struct {
	pthread_mutex_t lock;   /* making the table mapping and the presence socket */
	struct reg_ent *tab;    /* NULL: not mapped (yet) */
	bool failed;            /* could not be mapped: this process names nothing */
	int pfd;                /* the presence socket, or -1 */
	uint64_t token;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .pfd = -1};

static uint32_t key_hash(uint64_t k)
{
	k ^= k >> 29;
	k *= 0xbf58476d1ce4e5b9ull;
	k ^= k >> 32;
	return (uint32_t)k;
}

static void presence_name(struct sockaddr_un *u, socklen_t *len, uint64_t token)
{
	char n[40];
	snprintf(n, sizeof n, "dgshim/p/%016" PRIx64, token);
	abstract_name(u, len, n);
}

/* Maps the namespace's table. Needs R.lock. Returns 0 or -errno. */
static int map_table(void)
{
	struct stat ns;
	if (stat("/proc/self/ns/net", &ns))
		ns.st_ino = 0; /* no /proc: one table for the host */
	char path[64];
	snprintf(path, sizeof path, REG_FILE_FMT, (unsigned long long)ns.st_ino);
	size_t size = (size_t)REG_SLOTS * sizeof(struct reg_ent);
	/* every user's preloaded programs share it, as they share the abstract names */
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd >= 0)
		fchmod(fd, 0666); /* past the umask */
	else if (errno == EEXIST)
		fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) || (!S_ISREG(st.st_mode) && (errno = EINVAL)) ||
	    ((size_t)st.st_size < size && ftruncate(fd, (off_t)size))) {
		rc = -errno;
	} else {
		void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			rc = -errno;
		else
			__atomic_store_n(&R.tab, (struct reg_ent *)p, __ATOMIC_RELEASE);
	}
	real.close(fd);
	return rc;
}

/* The table, mapped on first use; NULL when it cannot be (logged once). */
static struct reg_ent *table(void)
{
	struct reg_ent *t = __atomic_load_n(&R.tab, __ATOMIC_ACQUIRE);
	if (likely(t) || __atomic_load_n(&R.failed, __ATOMIC_RELAXED))
		return t;
	pthread_mutex_lock(&R.lock);
	if (!R.tab && !R.failed) {
		int rc = map_table();
		if (rc) {
			R.failed = true;
			DG_WARN("discovery registry (/dev/shm) unavailable (%s): this process's ports are not "
				"named, peers on this host send to them plain", strerror(-rc));
		}
	}
	pthread_mutex_unlock(&R.lock);
	return __atomic_load_n(&R.tab, __ATOMIC_ACQUIRE);
}

/* This process's token, its presence name bound on first use. Returns 0 when there is none. */
static uint64_t my_token(void)
{
	uint64_t t = __atomic_load_n(&R.token, __ATOMIC_ACQUIRE);
	if (likely(t))
		return t;
	pthread_mutex_lock(&R.lock);
	for (int tries = 0; !R.token && tries < 4; tries++) {
		uint64_t tok = 0;
		if (getrandom(&tok, sizeof tok, GRND_NONBLOCK) != sizeof tok)
			tok = shim_now_us() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 20 ^ (uint64_t)tries;
		if (!tok)
			continue;
		struct sockaddr_un u;
		socklen_t ul;
		presence_name(&u, &ul, tok);
		int fd = registry_bind(&u, ul);
		if (fd >= 0) {
			R.pfd = fd;
			__atomic_store_n(&R.token, tok, __ATOMIC_RELEASE);
		} else if (fd != -EADDRINUSE) {
			DG_WARN("discovery registry: no presence name (%s): this process's ports are not named",
				strerror(-fd));
			break;
		}
	}
	pthread_mutex_unlock(&R.lock);
	return R.token;
}

/* Whether the process holding token still lives (its presence name exists). */
static bool alive(uint64_t token)
{
	if (token == __atomic_load_n(&R.token, __ATOMIC_ACQUIRE))
		return true;
	struct sockaddr_un u;
	socklen_t ul;
	presence_name(&u, &ul, token);
	return registry_exists(&u, ul);
}

int reg_add(uint64_t key)
{
	struct reg_ent *t = table();
	if (!t)
		return -ENOSYS;
	uint64_t tok = my_token();
	if (!tok)
		return -ENOSYS;
	uint32_t base = key_hash(key) % REG_SLOTS;
	int freei = -1;
	for (uint32_t k = 0; k < REG_PROBE; k++) {
		uint32_t i = (base + k) % REG_SLOTS;
		struct reg_ent *e = &t[i];
		uint64_t o = atomic_load(&e->owner);
		if (!o) {
			if (freei < 0)
				freei = (int)i;
			continue;
		}
		if (atomic_load(&e->key) == key && alive(o))
			return -EADDRINUSE;
	}
	/* a free entry, else one whose owner is gone */
	for (uint32_t k = 0; k < REG_PROBE; k++) {
		uint32_t i = freei >= 0 && k == 0 ? (uint32_t)freei : (base + k) % REG_SLOTS;
		struct reg_ent *e = &t[i];
		uint64_t o = atomic_load(&e->owner);
		if (o && (freei >= 0 || alive(o)))
			continue;
		if (!atomic_compare_exchange_strong(&e->owner, &o, tok))
			continue;
		atomic_store(&e->key, key);
		return (int)i;
	}
	DG_WARN("discovery registry full around key %#" PRIx64 ": not named, peers send to it plain", key);
	return -ENOSPC;
}

void reg_del(int h)
{
	struct reg_ent *t = __atomic_load_n(&R.tab, __ATOMIC_ACQUIRE);
	if (h < 0 || (unsigned)h >= REG_SLOTS || !t)
		return;
	struct reg_ent *e = &t[h];
	uint64_t tok = __atomic_load_n(&R.token, __ATOMIC_ACQUIRE);
	if (!tok || atomic_load(&e->owner) != tok)
		return; /* taken over since: not ours any more */
	atomic_store(&e->key, 0);
	atomic_compare_exchange_strong(&e->owner, &tok, 0);
}

void reg_after_fork(void)
{
	pthread_mutex_init(&R.lock, NULL);
	/* the inherited presence stays open (the parent's names live on with the child) but is no
	 * longer this process's: the next name binds the child's own */
	R.pfd = -1;
	__atomic_store_n(&R.token, 0, __ATOMIC_RELEASE);
}

bool reg_has(uint64_t key)
{
	struct reg_ent *t = table();
	if (!t)
		return false;
	uint32_t base = key_hash(key) % REG_SLOTS;
	for (uint32_t k = 0; k < REG_PROBE; k++) {
		struct reg_ent *e = &t[(base + k) % REG_SLOTS];
		if (atomic_load(&e->key) != key)
			continue;
		uint64_t o = atomic_load(&e->owner);
		/* the key again: a slot deleted and claimed for another key in between */
		if (o && atomic_load(&e->key) == key && alive(o))
			return true;
	}
	return false;
}

uint64_t reg_key(int svc, unsigned port)
{
	return REG_KEY(svc == IWARP_MODE_RD ? REG_RD : svc == SVC_UDV ? REG_UDV : REG_UD, port, 0);
}
