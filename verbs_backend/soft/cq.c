/*
 * cq.c - completion queues: a ring under a per-CQ mutex, an eventfd for readiness, and the
 * conversion of Write-Record validity bitmaps into ranges at poll time (so the producer never
 * formats anything on the receive path).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "soft.h"
#include "sys.h"

/* A ring of n entries: packed with other small objects while it is small (two to a page),
 * else whole zeroed pages (zpages.c). NULL: out of memory. */
static struct soft_cqe *ring_alloc(uint32_t n)
{
	size_t b = (size_t)n * sizeof(struct soft_cqe);
	return b <= DG_SMALL_MAX ? dg_small_alloc(b) : dg_zalloc(b);
}

static void ring_free(struct soft_cqe *r, uint32_t n)
{
	size_t b = (size_t)n * sizeof(struct soft_cqe);
	if (b <= DG_SMALL_MAX)
		dg_small_free(r, b);
	else
		dg_zfree(r, b);
}

/* The first ring's entries: a connection's CQ holds one or two completions at a time (a
 * record, a control message), and 4 (544 bytes) let its small objects (this, the RC
 * connection's state, its regions) share a page with another connection's, where 15 (2 kB)
 * made them a page of their own (issue 14: 4 kB of every carried TCP connection end). */
#define RING_FIRST 4u

/* Makes room for one more entry in a ring that is full (or not made yet) but below the CQ's
 * capacity: at first RING_FIRST entries, then what fits a small object (15), then a ring four
 * times larger each time (at most cap), the entries in order from its start. Returns 0 or
 * -ENOMEM. cq->lock held. */
static int ring_grow(struct soft_cq *cq)
{
	uint32_t small = (uint32_t)(DG_SMALL_MAX / sizeof *cq->ring);
	uint32_t n = RING_FIRST;
	if (cq->phys)
		n = cq->phys < small ? small : cq->phys * 4;
	if (n > cq->cap || cq->phys > cq->cap / 4)
		n = cq->cap;
	struct soft_cqe *r = ring_alloc(n);
	if (!r) {
		DG_WARN("completion queue: no memory to grow its ring to %u entries", n);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < cq->count; i++)
		r[i] = cq->ring[(cq->head + i) % cq->phys];
	if (cq->ring)
		ring_free(cq->ring, cq->phys);
	cq->ring = r, cq->phys = n, cq->head = 0;
	return 0;
}

void soft_cq_trim(struct soft_cq *cq)
{
	pthread_mutex_lock(&cq->lock);
	if (!cq->count && cq->ring) {
		ring_free(cq->ring, cq->phys);
		cq->ring = NULL, cq->phys = 0, cq->head = 0;
	}
	pthread_mutex_unlock(&cq->lock);
}

/* Tests: the entries cq's ring has now (0: none made, or given back by soft_cq_trim). */
uint32_t soft_cq_test_entries(struct dgv_cq *cqb);
uint32_t soft_cq_test_entries(struct dgv_cq *cqb)
{
	struct soft_cq *cq = to_scq(cqb);
	pthread_mutex_lock(&cq->lock);
	uint32_t n = cq->phys;
	pthread_mutex_unlock(&cq->lock);
	return n;
}

int soft_create_cq(struct dgv_context *ctx, int cqe, struct dgv_cq **out)
{
	/* a small object, not the program's heap (zpages.c: what lives long pins glibc's heap) */
	_Static_assert(sizeof(struct soft_cq) <= DG_SMALL_MAX, "soft_cq fits dg_small_alloc");
	struct soft_cq *cq = dg_small_alloc(sizeof *cq);
	if (!cq)
		return -ENOMEM;
	cq->base.ctx = ctx;
	cq->cap = (uint32_t)cqe;
	/* The ring is made by the first completion, with RING_FIRST entries, and grows when a
	 * burst fills it (ring_grow): an idle CQ has none, and most CQs (a socket's, a
	 * connection's) hold a few completions at a time, the emptied ring starting again at its
	 * first entry, so they rarely grow, and several share a page (issue 14: memory
	 * per idle socket and connection; a ring of the whole capacity cost a page each once
	 * used). Not from the heap: a ring of a socket's size (80 entries, 9.6 kB) had its first
	 * and last pages touched by the chunk headers around it. */
	cq->ring = NULL, cq->phys = 0;
	/* the eventfd is made when somebody first needs to wait on it (soft_cq_fd): a socket's
	 * CQ that only its own calls fill (soft_cq_self_driven) never needs one, and a process
	 * with 10 000 sockets would otherwise hold 10 000 eventfds (issue 14: descriptors) */
	atomic_init(&cq->efd, -1);
	cq->qps = cq->qps_inline;
	cq->scratch = cq->scratch_in, cq->scratch_cap = sizeof cq->scratch_in / sizeof cq->scratch_in[0];
	if (!cq->cap) {
		dg_small_free(cq, sizeof *cq);
		return -EINVAL;
	}
	pthread_mutex_init(&cq->lock, NULL);
	*out = &cq->base;
	return 0;
}

int soft_destroy_cq(struct dgv_cq *cqb)
{
	struct soft_cq *cq = to_scq(cqb);
	pthread_mutex_lock(&cq->lock);
	bool busy = cq->nqps > 0;
	pthread_mutex_unlock(&cq->lock);
	if (busy)
		return -EBUSY;
	int efd = atomic_load(&cq->efd);
	if (efd >= 0)
		close(efd);
	if (cq->qps != cq->qps_inline)
		free(cq->qps);
	if (cq->ring)
		ring_free(cq->ring, cq->phys);
	if (cq->scratch != cq->scratch_in)
		free(cq->scratch);
	pthread_mutex_destroy(&cq->lock);
	dg_small_free(cq, sizeof *cq);
	return 0;
}

/* Returns the CQ's eventfd, made now if it has none yet, or -errno (EMFILE) when it cannot be
 * made. Takes cq->lock to make it. A completion pushed before the eventfd existed woke nobody
 * (soft_cq_kick had nothing to write): one is in the ring, so the new eventfd starts readable,
 * and a waiter that arms and then waits on it does not miss it. */
int soft_cq_fd(struct dgv_cq *cqb)
{
	struct soft_cq *cq = to_scq(cqb);
	int fd = atomic_load_explicit(&cq->efd, memory_order_acquire);
	if (fd >= 0)
		return fd;
	pthread_mutex_lock(&cq->lock);
	fd = atomic_load_explicit(&cq->efd, memory_order_relaxed);
	if (fd < 0) {
		fd = eventfd(cq->count ? 1 : 0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
		} else {
			if (cq->count)
				atomic_store(&cq->kicked, true);
			atomic_store_explicit(&cq->efd, fd, memory_order_release);
		}
	}
	pthread_mutex_unlock(&cq->lock);
	return fd;
}

/* Whether every QP on cq is self-driven (soft_qp_self_driven); a CQ with none: `empty`.
 * Takes cq->lock. */
static bool cq_qps_self_driven(struct soft_cq *cq, bool empty)
{
	pthread_mutex_lock(&cq->lock);
	bool r = cq->nqps > 0 || empty;
	for (uint32_t i = 0; r && i < cq->nqps; i++)
		r = soft_qp_self_driven(cq->qps[i]);
	pthread_mutex_unlock(&cq->lock);
	return r;
}

/* soft.h. cq->lock not held. */
int soft_cq_wait_fd(struct soft_cq *cq)
{
	int fd = atomic_load_explicit(&cq->efd, memory_order_acquire);
	if (fd >= 0)
		return fd;
	return cq_qps_self_driven(cq, true) ? -1 : soft_cq_fd(&cq->base);
}

int soft_cq_self_driven(struct dgv_cq *cqb)
{
	return cq_qps_self_driven(to_scq(cqb), false);
}

/*
 * Who armed a CQ. A thread that arms, then makes progress itself inside its own poll of the
 * CQ (the shim's poll: arm, sleep on the socket and the CQ's fd, wake on the socket, read the
 * datagram through dgv_poll_cq) sees the completion it made as it makes it; writing the fd
 * for it would only leave a stale event behind, which made its next wait return at once and
 * cost a read, a write and two more receive attempts per datagram (VLC's poll+recvmsg loop).
 * So such a completion does not write the fd; the poll that made it writes it afterwards
 * only if it leaves completions in the CQ (the armer did not take them all), and any other
 * thread that armed too (armer = cq_armer_many) is woken as before.
 */
static __thread char self_token;
static const char cq_armer_many_c;
#define cq_armer_many ((const void *)&cq_armer_many_c)
/* The CQ whose dgv_poll_cq this thread is making progress in. */
static __thread struct soft_cq *self_polling __attribute__((tls_model("initial-exec")));

int soft_req_notify_cq(struct dgv_cq *cqb, int solicited_only)
{
	struct soft_cq *cq = to_scq(cqb);
	pthread_mutex_lock(&cq->lock);
	if (cq->count && !solicited_only) {
		/* Something is already there: make the fd readable now rather than losing the edge. */
		soft_cq_kick(cq);
	} else {
		bool again = atomic_load(&cq->armed) && cq->armer != &self_token;
		cq->armer = again ? cq_armer_many : &self_token;
		atomic_store(&cq->armed, solicited_only ? 2 : 1);
	}
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

void soft_cq_kick(struct soft_cq *cq)
{
	int fd = atomic_load_explicit(&cq->efd, memory_order_acquire);
	if (fd < 0)
		return; /* nobody waits on an eventfd not made yet (soft_cq_fd looks at the ring) */
	uint64_t one = 1;
	(void)dg_sys_write(fd, &one, sizeof one);
	/* after the write: a reader that finds the flag set finds the count there too, and one
	 * that comes between the two skips a read the next event's look makes (the descriptor
	 * stays readable until then) */
	atomic_store(&cq->kicked, true);
}

/* Empties the CQ's eventfd fd (non-blocking), clearing the flag first: a kick after the clear
 * sets it again. Returns read's result. */
static ssize_t efd_drain(struct soft_cq *cq, int fd)
{
	atomic_store(&cq->kicked, false);
	uint64_t v;
	return dg_sys_read(fd, &v, sizeof v);
}

/* Reads the eventfd only when a kick may have made it readable: a wake-up that came through
 * the socket (the shim's epoll, poll and blocking waits watch both) found it empty and paid a
 * read for nothing, once per message (redis: 1 of 6 system calls per request). */
int soft_cq_ack_event(struct dgv_cq *cqb)
{
	struct soft_cq *cq = to_scq(cqb);
	int fd = atomic_load_explicit(&cq->efd, memory_order_acquire);
	if (fd < 0 || !atomic_load(&cq->kicked))
		return 0;
	ssize_t r = efd_drain(cq, fd);
	return r == sizeof(uint64_t) ? 0 : (errno == EAGAIN ? 0 : -errno);
}

__thread bool soft_in_progress_thread __attribute__((tls_model("initial-exec")));
/* The CQ this thread waits on in soft_cq_wait while it makes progress itself: its own
 * completions need no eventfd wake-up (it looks at the count right after). */
static __thread struct soft_cq *self_waiting __attribute__((tls_model("initial-exec")));

int soft_cq_notify_background(struct dgv_cq *cqb, int on)
{
	atomic_store(&to_scq(cqb)->bg_notify, on != 0);
	return 0;
}

int soft_cq_ready(struct dgv_cq *cqb)
{
	return (int)__atomic_load_n(&to_scq(cqb)->count, __ATOMIC_ACQUIRE);
}

int soft_cq_push(struct soft_cq *cq, const struct dgv_wc *wc, struct soft_slot *slot,
		 const struct dgv_range *range)
{
	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap || (cq->count == cq->phys && ring_grow(cq))) {
		pthread_mutex_unlock(&cq->lock);
		return -ENOSPC;
	}
	struct soft_cqe *e = &cq->ring[(cq->head + cq->count) % cq->phys];
	e->wc = *wc;
	e->slot = slot;
	if (slot)
		atomic_store(&slot->in_cq, true);
	if (range)
		e->range = *range;
	/* count is peeked without the lock (soft_poll_cq, soft_cq_wait, soft_cq_full,
	 * soft_cq_count): every change is an atomic store, release so that a peek that sees the
	 * entry also sees it written. Reads under the lock stay plain (writers hold it too). */
	__atomic_store_n(&cq->count, cq->count + 1, __ATOMIC_RELEASE);
	int armed = atomic_load(&cq->armed);
	bool wake = atomic_load(&cq->waiters) > (self_waiting == cq ? 1 : 0) ||
		    (soft_in_progress_thread && atomic_load(&cq->bg_notify));
	if (armed == 1 || (armed == 2 && ((wc->flags & DGV_WC_SOLICITED) || wc->status != DGV_WC_SUCCESS))) {
		atomic_store(&cq->armed, 0);
		if (self_polling == cq && cq->armer == &self_token)
			cq->deferred = true; /* the armer is polling: soft_poll_cq decides */
		else
			wake = true;
	}
	pthread_mutex_unlock(&cq->lock);
	if (wake)
		soft_cq_kick(cq);
	return 0;
}

bool soft_cq_full(struct soft_cq *cq)
{
	return __atomic_load_n(&cq->count, __ATOMIC_ACQUIRE) >= cq->cap;
}

int soft_cq_attach(struct soft_cq *cq, struct soft_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i < cq->nqps; i++)
		if (cq->qps[i] == qp) {
			pthread_mutex_unlock(&cq->lock);
			return 0;
		}
	if (cq->nqps == SOFT_CQ_MAX_QPS) {
		pthread_mutex_unlock(&cq->lock);
		return -ENOSPC;
	}
	if (cq->nqps == sizeof cq->qps_inline / sizeof cq->qps_inline[0] && cq->qps == cq->qps_inline) {
		struct soft_qp **a = calloc(SOFT_CQ_MAX_QPS, sizeof *a);
		if (!a) {
			pthread_mutex_unlock(&cq->lock);
			return -ENOMEM;
		}
		memcpy(a, cq->qps_inline, sizeof cq->qps_inline);
		__atomic_store_n(&cq->qps, a, __ATOMIC_SEQ_CST);
	}
	__atomic_store_n(&cq->qps[cq->nqps], qp, __ATOMIC_SEQ_CST);
	__atomic_store_n(&cq->nqps, cq->nqps + 1, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

/* Unlinks qp and drops its pending Write-Record completions whose bitmaps die with the QP;
 * its other completions stay for the application to poll. */
void soft_cq_detach(struct soft_cq *cq, struct soft_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i < cq->nqps; i++)
		if (cq->qps[i] == qp) {
			uint32_t last = cq->nqps - 1;
			__atomic_store_n(&cq->qps[i], cq->qps[last], __ATOMIC_SEQ_CST);
			__atomic_store_n(&cq->qps[last], NULL, __ATOMIC_SEQ_CST);
			__atomic_store_n(&cq->nqps, last, __ATOMIC_SEQ_CST);
			break;
		}
	uint32_t kept = 0;
	for (uint32_t i = 0; i < cq->count; i++) {
		struct soft_cqe *e = &cq->ring[(cq->head + i) % cq->phys];
		if (e->wc.qp == &qp->base && e->slot)
			continue;
		cq->ring[(cq->head + kept) % cq->phys] = *e;
		kept++;
	}
	__atomic_store_n(&cq->count, kept, __ATOMIC_RELEASE); /* peeked unlocked: soft_cq_push */
	pthread_mutex_unlock(&cq->lock);
	while (atomic_load(&cq->pollers))
		sched_yield(); /* a poller may still hold the pointer it read before the unlink */
}

/*
 * Runs progress on every QP feeding cq. Returns the number that did work.
 * Lock-free on purpose (this is the busy-poll loop): the pollers count is raised before the
 * QP list is read, and soft_cq_detach() waits for it to drop after unlinking a QP, so no QP
 * is freed under a poller. Both sides use sequentially consistent atomics.
 */
static int cq_progress(struct soft_cq *cq)
{
	atomic_fetch_add(&cq->pollers, 1);
	struct soft_qp **qps = __atomic_load_n(&cq->qps, __ATOMIC_SEQ_CST);
	uint32_t n = __atomic_load_n(&cq->nqps, __ATOMIC_SEQ_CST);
	if (qps == cq->qps_inline && n > sizeof cq->qps_inline / sizeof cq->qps_inline[0])
		n = sizeof cq->qps_inline / sizeof cq->qps_inline[0]; /* grown since: the next look sees all */
	int did = 0;
	for (uint32_t i = 0; i < n && i < SOFT_CQ_MAX_QPS; i++) {
		struct soft_qp *qp = __atomic_load_n(&qps[i], __ATOMIC_SEQ_CST);
		if (qp && soft_qp_progress(qp, true, false) > 0)
			did++;
	}
	atomic_fetch_sub(&cq->pollers, 1);
	return did;
}

/* Turns a slot's segment bitmap into coalesced ranges at out. Returns the count. */
static uint32_t bitmap_ranges(const struct soft_slot *s, struct dgv_range *out)
{
	uint32_t n = 0;
	uint32_t i = 0;
	while (i < s->nsegs) {
		if (!(s->bitmap[i >> 3] & (1u << (i & 7)))) {
			i++;
			continue;
		}
		uint32_t j = i;
		while (j < s->nsegs && (s->bitmap[j >> 3] & (1u << (j & 7))))
			j++;
		uint32_t off = i * s->segsz;
		uint32_t end = j == s->nsegs ? s->ml : j * s->segsz;
		out[n++] = (struct dgv_range){off, end - off};
		i = j;
	}
	return n;
}

/* Makes the scratch hold at least need ranges. Only with none of them handed out by the poll
 * under way (the last poll's are the caller's no more). Returns false without memory. Needs
 * cq->lock. */
static bool scratch_room(struct soft_cq *cq, uint32_t need)
{
	if (need <= cq->scratch_cap)
		return true;
	struct dgv_range *r = malloc(need * sizeof *r);
	if (!r)
		return false;
	if (cq->scratch != cq->scratch_in)
		free(cq->scratch);
	cq->scratch = r, cq->scratch_cap = need;
	return true;
}

int soft_poll_cq(struct dgv_cq *cqb, int n, struct dgv_wc *wc)
{
	struct soft_cq *cq = to_scq(cqb);
	if (!__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE)) {
		self_polling = cq;
		cq_progress(cq);
		self_polling = NULL;
		if (!__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE))
			return 0;
	}
	pthread_mutex_lock(&cq->lock);
	int got = 0;
	uint32_t used = 0;
	if (cq->scratch_short) {
		/* the last poll stopped for want of ranges: twice as many this time */
		cq->scratch_short = false;
		scratch_room(cq, cq->scratch_cap < 32 ? cq->scratch_cap * 2 : 64);
	}
	while (got < n && cq->count) {
		struct soft_cqe *e = &cq->ring[cq->head];
		if (e->slot) {
			uint32_t need = e->slot->nsegs / 2 + 1;
			if (need > cq->scratch_cap - used) {
				if (got) {
					cq->scratch_short = true;
					break; /* earlier records' ranges must stay valid: stop here */
				}
				if (!scratch_room(cq, need))
					break;
			}
			wc[got] = e->wc;
			wc[got].record.ranges = cq->scratch + used;
			wc[got].record.nranges = bitmap_ranges(e->slot, cq->scratch + used);
			used += wc[got].record.nranges;
			atomic_store_explicit(&e->slot->in_cq, false, memory_order_release);
		} else {
			wc[got] = e->wc;
			if (e->wc.opcode == DGV_WC_RECV_WRITE_RECORD || e->wc.record.nranges) {
				if (cq->scratch_cap - used < 1) {
					cq->scratch_short = true;
					break; /* got > 0: the scratch holds at least one range */
				}
				wc[got].record.ranges = cq->scratch + used;
				if (e->wc.record.nranges)
					cq->scratch[used++] = e->range;
			}
		}
		got++;
		cq->head = (cq->head + 1) % cq->phys;
		__atomic_store_n(&cq->count, cq->count - 1, __ATOMIC_RELEASE); /* see soft_cq_push */
	}
	/* emptied: the next completion goes to the first entry again, so a CQ that holds a few at
	 * a time keeps writing the ring's first page instead of each of its pages in turn (each
	 * idle socket's CQ ring came to 3 pages of resident memory) */
	if (!cq->count)
		cq->head = 0;
	/* an arm its armer's own progress fired: the event is due only if completions are left */
	bool notify = cq->deferred && cq->count;
	cq->deferred = false;
	pthread_mutex_unlock(&cq->lock);
	if (notify)
		soft_cq_kick(cq);
	return got;
}

int soft_cq_wait(struct dgv_cq *cqb, int timeout_ms)
{
	struct soft_cq *cq = to_scq(cqb);
	uint64_t start = dg_now_us();
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000;
	int rc = 0;
	atomic_fetch_add(&cq->waiters, 1);
	for (;;) {
		if (__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE))
			break;
		self_waiting = cq;
		cq_progress(cq);
		self_waiting = NULL;
		if (__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE))
			break;
		uint64_t now = dg_now_us();
		if (now >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		struct pollfd pfd[SOFT_CQ_MAX_QPS + 1];
		struct soft_qp *snap[SOFT_CQ_MAX_QPS];
		uint32_t nq;
		uint64_t next = deadline;
		pthread_mutex_lock(&cq->lock);
		nq = cq->nqps;
		for (uint32_t i = 0; i < nq; i++) {
			snap[i] = cq->qps[i];
			atomic_fetch_add(&snap[i]->refs, 1);
		}
		pthread_mutex_unlock(&cq->lock);
		/* no eventfd (EMFILE, or none needed: soft_cq_wait_fd): the sockets and the
		 * timers wake this wait, the rest within 10 ms */
		int efd = soft_cq_wait_fd(cq);
		pfd[0] = (struct pollfd){.fd = efd, .events = POLLIN};
		for (uint32_t i = 0; i < nq; i++) {
			struct soft_qp *qp = snap[i];
			pfd[i + 1] = (struct pollfd){.fd = qp->fd, .events = POLLIN};
			if (soft_qp_wants_pollout(qp))
				pfd[i + 1].events |= POLLOUT;
			if (pthread_mutex_trylock(&qp->lock) == 0) {
				uint64_t t = soft_qp_next_timer_locked(qp, now);
				soft_qp_unlock(qp);
				if (t != UINT64_MAX && now + t < next)
					next = now + t;
			}
			atomic_store(&qp->app_waiting, 1);
		}
		uint64_t wait_us = next > now ? next - now : 0;
		int ms = wait_us >= (uint64_t)INT32_MAX * 1000 ? -1 : (int)((wait_us + 999) / 1000);
		if (efd < 0 && (ms < 0 || ms > 10))
			ms = 10;
		int pr = poll(pfd, nq + 1, ms);
		int perr = errno;
		for (uint32_t i = 0; i < nq; i++) {
			atomic_store(&snap[i]->app_waiting, 0);
			atomic_fetch_sub(&snap[i]->refs, 1);
		}
		if (pr < 0 && perr == EINTR) {
			rc = -EINTR;
			break;
		}
		if (pfd[0].revents & POLLIN)
			(void)efd_drain(cq, efd);
	}
	atomic_fetch_sub(&cq->waiters, 1);
	return rc;
}
