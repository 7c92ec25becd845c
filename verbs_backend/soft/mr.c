/*
 * mr.c - memory registration and the STag checks of every tagged placement.
 *
 * STag layout (RFC 5040 section 2.1 splits it into a 24-bit index and an 8-bit key): our index
 * is 16 bits (bits 8..23) into a table of type-stable slots; bits 24..31 and the key byte are
 * random from getrandom(), so 16 bits of every STag are unpredictable, and a stale STag (after
 * re-registration of the slot) is refused: never the slot's previous one. Lookups take no lock: a slot's soft_mr is never
 * freed before the context, users counts placements in flight and dereg waits for it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "log.h"
#include "soft.h"

static uint32_t random_u32(void)
{
	uint32_t v;
	if (getrandom(&v, sizeof v, 0) != sizeof v) {
		/* getrandom cannot fail for 4 bytes once the pool is initialised; keep going */
		v = (uint32_t)random() * 2654435761u;
	}
	return v;
}

/* Returns 0 or -ENOMEM/-ENOSPC; takes ctx->mr_lock. */
int soft_reg_mr(struct dgv_pd *pdb, void *addr, size_t len, unsigned access, struct dgv_mr **out)
{
	struct soft_pd *pd = to_spd(pdb);
	struct soft_ctx *ctx = to_sctx(pdb->ctx);
	if ((uint64_t)(uintptr_t)addr + len < (uint64_t)(uintptr_t)addr)
		return -EINVAL;
	pthread_mutex_lock(&ctx->mr_lock);
	if (ctx->mr_count >= SOFT_MR_SLOTS - 1) {
		pthread_mutex_unlock(&ctx->mr_lock);
		return -ENOSPC;
	}
	/* A region object stays in its slot for good once made (placement looks slots up without
	 * the lock): a deregistered one is taken again before a new one is made, so a process
	 * that registers and deregisters for each socket keeps as many objects as it has regions
	 * at once, not one per registration (up to the table's 65 536). New ones come from pages
	 * of their own (dg_small_alloc), not the program's heap. */
	struct soft_mr *mr = ctx->mr_free;
	uint32_t idx;
	if (mr) {
		ctx->mr_free = mr->next_free;
		mr->next_free = NULL;
		idx = mr->index;
	} else {
		/* the next never-used slot: the table's pages are touched as far as regions were
		 * made at once (a random index spread 300 sockets' regions over the 512 KiB table:
		 * fdcost's RSS per socket); the STag's random bits make it unpredictable */
		idx = ctx->mr_next;
		while (idx == 0 || atomic_load(&ctx->mrs[idx]))
			idx = (idx + 1) & (SOFT_MR_SLOTS - 1);
		ctx->mr_next = (idx + 1) & (SOFT_MR_SLOTS - 1);
		_Static_assert(sizeof(struct soft_mr) <= DG_SMALL_MAX, "soft_mr fits dg_small_alloc");
		mr = dg_small_alloc(sizeof *mr);
		if (!mr) {
			pthread_mutex_unlock(&ctx->mr_lock);
			return -ENOMEM;
		}
		mr->index = idx;
	}
	while (atomic_load(&mr->users))
		sched_yield(); /* a lookup raced with the slot's last dereg; it backs off at once */
	/* never the STag the slot's last registration had (its rkey stays in the object): with 18
	 * random bits (16 now) one re-registration in 262 144 took it again, and a peer holding the old
	 * STag would have placed into the new region (unit test reregistration_... caught it) */
	uint32_t stag, old = mr->pub.rkey;
	do {
		uint32_t r = random_u32();
		_Static_assert(SOFT_MR_SLOTS == 1u << 16, "the STag's random bits are those the index leaves");
		stag = (r & 0xff000000u) | (idx << 8) | (r & 0xffu);
	} while (stag == old);
	mr->pub.addr = addr;
	mr->pub.length = len;
	mr->pub.access = access;
	mr->pub.pd = pdb;
	mr->pub.lkey = stag;
	mr->pub.rkey = stag;
	atomic_store(&mr->stag, stag);
	atomic_store(&ctx->mrs[idx], mr);
	ctx->mr_count++;
	atomic_fetch_add(&pd->refs, 1);
	pthread_mutex_unlock(&ctx->mr_lock);
	*out = &mr->pub;
	return 0;
}

int soft_dereg_mr(struct dgv_mr *m)
{
	struct soft_mr *mr = to_smr(m);
	struct soft_ctx *ctx = to_sctx(m->pd->ctx);
	struct soft_pd *pd = to_spd(m->pd);
	pthread_mutex_lock(&ctx->mr_lock);
	if (atomic_load(&mr->stag) == 0) {
		pthread_mutex_unlock(&ctx->mr_lock);
		return -EINVAL;
	}
	atomic_store(&mr->stag, 0);
	/* Placements that validated before the store finish their copy; none starts after. */
	while (atomic_load(&mr->users))
		sched_yield();
	ctx->mr_count--;
	mr->next_free = ctx->mr_free;
	ctx->mr_free = mr;
	atomic_fetch_sub(&pd->refs, 1);
	pthread_mutex_unlock(&ctx->mr_lock);
	return 0;
}

/* Takes a user reference on the MR that holds stag now, or returns NULL. */
static struct soft_mr *mr_hold(struct soft_ctx *ctx, uint32_t stag)
{
	struct soft_mr *mr = atomic_load_explicit(&ctx->mrs[SOFT_MR_INDEX(stag)], memory_order_acquire);
	if (!mr || stag == 0)
		return NULL;
	atomic_fetch_add(&mr->users, 1);
	if (atomic_load(&mr->stag) != stag) {
		atomic_fetch_sub(&mr->users, 1);
		return NULL;
	}
	return mr;
}

void *dg_pages_alloc(size_t size)
{
	if (size < 16384)
		return calloc(1, size ? size : 1);
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void dg_pages_free(void *p, size_t size)
{
	if (!p)
		return;
	if (size < 16384)
		free(p);
	else
		munmap(p, size);
}

struct spare_cache {
	void *b[DG_SPARE_KINDS][DG_SPARES];
	size_t size[DG_SPARE_KINDS];
	unsigned n[DG_SPARE_KINDS];
	bool keyed; /* the destructor's key is set for this thread */
};
/* initial-exec: a get and a put come with every message (no __tls_get_addr call) */
static __thread struct spare_cache spares __attribute__((tls_model("initial-exec")));
static pthread_key_t spare_key; /* its destructor empties an exiting thread's cache */
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_key_ok;

static void spare_drop(void *arg)
{
	struct spare_cache *c = arg;
	for (unsigned k = 0; k < DG_SPARE_KINDS; k++)
		while (c->n[k])
			dg_pages_free(c->b[k][--c->n[k]], c->size[k]);
	c->keyed = false; /* the key's value is NULL now: a later put sets it again */
}

static void spare_key_init(void)
{
	spare_key_ok = pthread_key_create(&spare_key, spare_drop) == 0;
}

void *dg_spare_get(unsigned kind, size_t size)
{
	struct spare_cache *c = &spares;
	if (c->n[kind])
		return c->b[kind][--c->n[kind]];
	return dg_pages_alloc(size);
}

void dg_spare_put(unsigned kind, void *b, size_t size)
{
	if (!b)
		return;
	struct spare_cache *c = &spares;
	if (c->n[kind] < DG_SPARES) {
		if (!c->keyed) {
			pthread_once(&spare_once, spare_key_init);
			/* the destructor runs only for a thread whose value is not NULL */
			c->keyed = spare_key_ok && pthread_setspecific(spare_key, c) == 0;
		}
		if (c->keyed) {
			c->size[kind] = size;
			c->b[kind][c->n[kind]++] = b;
			return;
		}
	}
	dg_pages_free(b, size);
}

struct soft_mr *soft_mr_get_remote(struct soft_ctx *ctx, struct soft_pd *pd, uint32_t stag,
				   uint64_t to, uint64_t len, unsigned access, struct dg_reject *why)
{
	struct soft_mr *mr = mr_hold(ctx, stag);
	if (!mr) {
		*why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_INVALID_STAG,
					  "invalid STag"};
		return NULL;
	}
	if (to_spd(mr->pub.pd) != pd) {
		*why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_STAG_NOT_ASSOC,
					  "STag of another protection domain"};
		goto fail;
	}
	if (!(mr->pub.access & access)) {
		*why = (struct dg_reject){TERM_LAYER_RDMAP, RDMAP_ETYPE_REMOTE_PROT, RDMAP_ECODE_ACCESS_RIGHTS,
					  "access rights violation"};
		goto fail;
	}
	uint64_t start = (uint64_t)(uintptr_t)mr->pub.addr;
	if (to < start || len > mr->pub.length || to - start > mr->pub.length - len) {
		*why = (struct dg_reject){TERM_LAYER_DDP, DDP_ETYPE_TAGGED_BUF, DDP_ECODE_T_BASE_BOUNDS,
					  "base or bounds violation"};
		goto fail;
	}
	return mr;
fail:
	soft_mr_put(mr);
	return NULL;
}

static bool local_ok(const struct soft_mr *mr, struct soft_pd *pd, const struct dgv_sge *sge,
		     bool need_write)
{
	uint64_t start = (uint64_t)(uintptr_t)mr->pub.addr;
	return to_spd(mr->pub.pd) == pd && (!need_write || (mr->pub.access & DGV_ACCESS_LOCAL_WRITE)) &&
	       sge->addr >= start && sge->length <= mr->pub.length &&
	       sge->addr - start <= mr->pub.length - sge->length;
}

/* At post time: a check, not a hold (no atomics on the send path). The receive path holds the
 * region again while it writes (soft_mr_get_local), so a region deregistered after the post is
 * never written. */
int soft_mr_check_local(struct soft_ctx *ctx, struct soft_pd *pd, const struct dgv_sge *sge,
			bool need_write)
{
	if (sge->length == 0)
		return 0;
	struct soft_mr *mr = atomic_load_explicit(&ctx->mrs[SOFT_MR_INDEX(sge->lkey)], memory_order_acquire);
	if (!mr || !sge->lkey || atomic_load_explicit(&mr->stag, memory_order_relaxed) != sge->lkey)
		return -EFAULT;
	return local_ok(mr, pd, sge, need_write) ? 0 : -EFAULT;
}

struct soft_mr *soft_mr_get_local(struct soft_ctx *ctx, struct soft_pd *pd, const struct dgv_sge *sge,
				  bool need_write)
{
	struct soft_mr *mr = mr_hold(ctx, sge->lkey);
	if (mr && !local_ok(mr, pd, sge, need_write)) {
		soft_mr_put(mr);
		return NULL;
	}
	return mr;
}

void soft_mr_table_fini(struct soft_ctx *ctx)
{
	for (uint32_t i = 0; i < SOFT_MR_SLOTS; i++)
		dg_small_free(atomic_load(&ctx->mrs[i]), sizeof(struct soft_mr));
	ctx->mr_free = NULL;
}

int soft_sge_iov(const struct dgv_sge *sge, uint32_t nsge, uint32_t off, uint32_t len, struct iovec *iov,
		 int max)
{
	int n = 0;
	for (uint32_t i = 0; i < nsge && len; i++) {
		if (off >= sge[i].length) {
			off -= sge[i].length;
			continue;
		}
		uint32_t take = sge[i].length - off < len ? sge[i].length - off : len;
		if (n == max)
			break;
		iov[n].iov_base = (void *)(uintptr_t)(sge[i].addr + off);
		iov[n].iov_len = take;
		n++;
		len -= take;
		off = 0;
	}
	return n;
}

int soft_rwqe_copy(struct soft_qp *qp, const struct soft_rwqe *w, uint32_t off, const uint8_t *src,
		   uint32_t len)
{
	for (uint32_t i = 0; i < w->num_sge && len; i++) {
		const struct dgv_sge *g = &w->sge[i];
		if (off >= g->length) {
			off -= g->length;
			continue;
		}
		uint32_t take = g->length - off < len ? g->length - off : len;
		struct soft_mr *mr = soft_mr_get_local(qp->ctx, qp->pd, g, true);
		if (!mr)
			return -EFAULT;
		memcpy((void *)(uintptr_t)(g->addr + off), src, take);
		soft_mr_put(mr);
		src += take;
		len -= take;
		off = 0;
	}
	return 0;
}
