/*
 * events.c - poll, select and epoll over taken sockets.
 *
 * A taken socket is readable when a datagram is ready for the program, which the kernel cannot
 * know: a datagram in its buffer may be an acknowledgement or one segment of a message, and the
 * provider's thread may have drained the buffer into the CQ already. So for each taken socket
 * the wait covers the kernel socket (something to process) and the CQ's descriptor (something
 * processed in the background); what they report is checked against the socket's queue before
 * the program hears of it, and a wait that only saw work, not data, waits again.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sock.h"

static int remaining(uint64_t deadline, int timeout_ms)
{
	if (timeout_ms < 0)
		return -1;
	uint64_t now = shim_now_us();
	return now >= deadline ? 0 : (int)((deadline - now + 999) / 1000);
}

/* ------------------------------------------------------------------ poll */

/* A carried stream decides these too (stream_poll_in/out give them as tcp_poll would). */
#define STREAM_ENDS (POLLRDHUP | POLLHUP | POLLERR)

/* What a carried stream reports for the events asked, from stream_poll_in/out (-1: not asked). */
static int stream_rdy(short events, int in, int out)
{
	return ((in > 0 ? in : 0) | (out > 0 ? out : 0)) & (events | POLLHUP | POLLERR);
}

#define POLL_STACK 64
#define POLL_FIRED (1 << 30) /* in ev_poll's ready[]: one of the entry's own descriptors fired */

/* Before poll sleeps on device sockets: their readiness looked at again for up to
 * shim_spin_us (a device completes within microseconds; a wake-up through the channel costs
 * more). Updates ready[] (see ev_poll) for what became ready. Returns whether anything did. */
static bool spin_ready(const struct pollfd *fds, nfds_t n, int32_t *ready)
{
	uint64_t until = shim_now_us() + (uint64_t)shim_spin_us();
	bool any = false;
	shim_depth++;
	while (!any && shim_now_us() < until)
		for (nfds_t i = 0; i < n; i++) {
			if (ready[i] < 0 || !(ready[i] >> 16 & POLLIN) || !(fds[i].events & POLLIN))
				continue;
			struct sock *s = fd_sock(fds[i].fd);
			if (!s || !sock_busy_poll(s))
				continue;
			int in = sock_poll_in(s, fds[i].fd);
			int rdy = sock_is_stream(s) ? stream_rdy(fds[i].events, in, -1) : (in > 0 ? POLLIN : 0);
			if (rdy) {
				ready[i] |= rdy;
				any = true;
			}
		}
	shim_depth--;
	return any;
}

/* Frees what ev_poll took from the heap (each buffer that is not its stack one). */
static void poll_bufs_free(struct pollfd *p, struct pollfd *stack, int32_t *ready, int32_t *sready, uint8_t *isq,
			   uint8_t *sisq, nfds_t *qidx, nfds_t *sqidx)
{
	if (p != stack)
		free(p);
	if (ready != sready)
		free(ready);
	if (isq != sisq)
		free(isq);
	if (qidx != sqidx)
		free(qidx);
}

/* poll/ppoll over taken and untaken descriptors: the shim's readiness for taken sockets, the
 * kernel's for the rest, one real poll over both with each socket's wait descriptors added.
 * One function (~150 lines) on purpose: its four arrays live on its stack for the common case
 * (no malloc per call) and every phase indexes all of them. Returns what poll returns. */
int ev_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask)
{
	nfds_t ntaken = 0, nstream = 0;
	for (nfds_t i = 0; i < n; i++) {
		struct sock *s = fd_sock(fds[i].fd);
		if (s) {
			ntaken++;
			nstream += sock_is_stream(s);
		}
	}
	if (!ntaken) {
		if (mask) {
			struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
			return real.ppoll(fds, n, timeout_ms < 0 ? NULL : &ts, mask);
		}
		return real.poll(fds, n, timeout_ms);
	}
	struct pollfd stack[POLL_STACK];
	int32_t sready[POLL_STACK];
	uint8_t sisq[POLL_STACK];
	nfds_t sqidx[POLL_STACK];
	/* each taken socket may add its CQ's descriptor and, for a stream, its TCP socket; and
	 * the bell of a wait on streams (shim.h "Waking a waiter") */
	nfds_t cap = n + 2 * ntaken + 1;
	struct pollfd *p = cap <= POLL_STACK ? stack : malloc(cap * sizeof *p);
	/* per entry: -1 the kernel decides everything; else the events the shim decides (high
	 * half) and those of them ready (low half) */
	int32_t *ready = cap <= POLL_STACK ? sready : malloc(n * sizeof *ready);
	/* isq[j]: entry j (>= n) is a stream's TCP socket (only watched), not a CQ's eventfd */
	uint8_t *isq = cap <= POLL_STACK ? sisq : malloc(cap);
	/* qidx[j]: the entry whose wait descriptor entry j (>= n) is */
	nfds_t *qidx = cap <= POLL_STACK ? sqidx : malloc(cap * sizeof *qidx);
	if (!p || !ready || !isq || !qidx) {
		poll_bufs_free(p, stack, ready, sready, isq, sisq, qidx, sqidx);
		errno = ENOMEM;
		return -1;
	}
	uint64_t deadline = timeout_ms > 0 ? shim_now_us() + (uint64_t)timeout_ms * 1000 : 0;
	int t = timeout_ms, rc;
	struct bell *bell = nstream && timeout_ms != 0 ? bell_take() : NULL;
	for (;;) {
		nfds_t m = n;
		bool any_ready = false;
		int ndev = 0;
		shim_depth++;
		bell_clear(bell); /* rung for the last round (no stream of it on the bell now) */
		shim_wait_bell = bell; /* the streams' checks register it (check_begin) */
		shim_wait_sliced = !bell && nstream;
		for (nfds_t i = 0; i < n; i++) {
			p[i] = fds[i];
			ready[i] = -1;
			struct sock *s = fds[i].fd >= 0 ? fd_sock(fds[i].fd) : NULL;
			if (!s || !(fds[i].events & (POLLIN | POLLOUT)))
				continue;
			/* a datagram socket's kernel socket stays in the set: what waits there is
			 * read after the kernel reports it (one receive per datagram, as natively,
			 * instead of one that finds nothing before the wait and one after) */
			int in = (fds[i].events & POLLIN) ? sock_poll_in_queued(s, fds[i].fd) : -1;
			int out = (fds[i].events & POLLOUT) ? sock_poll_out_queued(s, fds[i].fd) : -1;
			if (in < 0 && out < 0)
				continue; /* the OS carries it: its readiness is the truth */
			int own, rdy;
			if (sock_is_stream(s)) {
				/* a carried stream: the kernel socket is the provider's, its data, send
				 * room, hang-ups and errors are not the program's; the stream says them
				 * all, and the kernel socket is not polled unless asked for more */
				own = POLLIN | POLLOUT | STREAM_ENDS;
				rdy = stream_rdy(fds[i].events, in, out);
				p[i].events &= (short)~own;
				if (!p[i].events)
					p[i].fd = -1;
			} else {
				own = (in >= 0 ? POLLIN : 0) | (out >= 0 ? POLLOUT : 0);
				rdy = (in > 0 ? POLLIN : 0) | (out > 0 ? POLLOUT : 0);
				if (own & POLLOUT)
					p[i].events &= (short)~POLLOUT;
			}
			ready[i] = own << 16 | rdy;
			ndev += sock_busy_poll(s);
			if (rdy) {
				any_ready = true;
				continue;
			}
			int qfd, cqfd;
			short qev;
			if (sock_wait_fds(s, &qfd, &qev, &cqfd) == 0) {
				if (cqfd == -1 && !sock_is_stream(s)) {
					/* no CQ to watch (dgv_cq_self_driven): the kernel socket's room
					 * is the send room, and what arrives there is read by the check
					 * after the wait */
					p[i].events = (short)(p[i].events | (fds[i].events & POLLOUT));
					continue;
				}
				if (cqfd >= 0) {
					isq[m] = 0;
					qidx[m] = i;
					p[m++] = (struct pollfd){.fd = cqfd, .events = POLLIN};
				}
				/* a stream's TCP data wakes this thread, which then processes it itself
				 * (the provider's thread would only after the program looks idle); a
				 * stream whose CQ makes no eventfd (stream_wait_fds) waits here alone,
				 * with the room the provider waits for */
				if (qfd >= 0 && sock_is_stream(s)) {
					isq[m] = 1;
					qidx[m] = i;
					p[m++] = (struct pollfd){.fd = qfd, .events = qev};
				}
			}
		}
		shim_depth--;
		shim_wait_bell = NULL;
		if (bell) {
			isq[m] = 2;
			qidx[m] = n;
			p[m++] = (struct pollfd){.fd = bell_fd(bell), .events = POLLIN};
		}
		if (!any_ready && t != 0 && ndev)
			any_ready = spin_ready(fds, n, ready);
		int wt = any_ready ? 0 : t;
		if (shim_wait_sliced && (wt < 0 || wt > BELL_SLICE_MS))
			wt = BELL_SLICE_MS; /* a stream it could not ring: looked at again after this */
		int r;
		if (mask) {
			struct timespec ts = {wt / 1000, (long)(wt % 1000) * 1000000};
			r = real.ppoll(p, m, wt < 0 ? NULL : &ts, mask);
		} else {
			r = real.poll(p, m, wt);
		}
		if (bell)
			for (nfds_t i = 0; i < n; i++) {
				struct sock *s = ready[i] >= 0 ? fd_sock(fds[i].fd) : NULL;
				if (s && sock_is_stream(s))
					stream_unwait(s, bell);
			}
		if (r < 0) {
			rc = -1;
			break;
		}
		int count = 0;
		shim_depth++;
		/* which entries' own descriptors reported something: only those are looked at again
		 * with I/O (the others' readiness was current before the wait); the bell: another
		 * thread took news of a stream, each is looked at again */
		for (nfds_t j = n; j < m; j++) {
			if (isq[j] == 2 && p[j].revents) {
				for (nfds_t i = 0; i < n; i++)
					if (ready[i] >= 0)
						ready[i] |= POLL_FIRED;
			} else if (isq[j] != 2 && p[j].revents && ready[qidx[j]] >= 0) {
				ready[qidx[j]] |= POLL_FIRED;
			}
		}
		for (nfds_t i = 0; i < n; i++) {
			short rev = p[i].revents;
			if (ready[i] >= 0) {
				int own = (ready[i] >> 16) & 0x3fff, rdy = ready[i] & 0xffff;
				bool fired = (ready[i] & POLL_FIRED) || rev;
				rev &= (short)~own;
				struct sock *s = r > 0 && fired && (own & ~rdy) ? fd_sock(fds[i].fd) : NULL;
				if (s && sock_is_stream(s)) {
					short ev = fds[i].events;
					rdy = stream_rdy(ev, (ev & POLLIN) ? sock_poll_in(s, fds[i].fd) : -1,
							 (ev & POLLOUT) ? sock_poll_out(s, fds[i].fd) : -1);
				} else if (s) {
					if ((own & ~rdy & POLLIN) &&
					    ((p[i].revents & POLLIN) ? sock_poll_in_fired(s, fds[i].fd)
								     : sock_poll_in(s, fds[i].fd)) > 0)
						rdy |= POLLIN;
					if ((own & ~rdy & POLLOUT) && sock_poll_out(s, fds[i].fd) > 0)
						rdy |= POLLOUT;
				}
				rev |= (short)rdy;
			}
			fds[i].revents = rev;
			if (rev)
				count++;
		}
		for (nfds_t j = n; j < m; j++) {
			struct sock *s = (p[j].revents & POLLIN) && isq[j] == 0 ? fd_sock(fds[qidx[j]].fd) : NULL;
			if (s)
				sock_cq_ack(s); /* the provider's way: a device counts its events */
		}
		shim_depth--;
		t = remaining(deadline, timeout_ms);
		if (count || t == 0) {
			rc = count;
			break;
		}
	}
	bell_put(bell);
	poll_bufs_free(p, stack, ready, sready, isq, sisq, qidx, sqidx);
	return rc;
}

int ev_select(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts,
	      const sigset_t *mask)
{
	if (nfds < 0 || nfds > FD_SETSIZE) {
		errno = EINVAL;
		return -1;
	}
	bool any = false;
	for (int fd = 0; fd < nfds && !any; fd++)
		if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x))) && fd_sock(fd))
			any = true;
	if (!any) {
		if (mask || ts) {
			return real.pselect(nfds, r, w, x, ts, mask);
		}
		return real.select(nfds, r, w, x, NULL);
	}
	struct pollfd p[FD_SETSIZE];
	int n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (r && FD_ISSET(fd, r))
			ev |= POLLIN;
		if (w && FD_ISSET(fd, w))
			ev |= POLLOUT;
		if (x && FD_ISSET(fd, x))
			ev |= POLLPRI;
		if (ev)
			p[n++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int ms = -1;
	if (ts) {
		ms = shim_timeout_ms(ts->tv_sec, (ts->tv_nsec + 999999) / 1000000);
	}
	int rc = ev_poll(p, (nfds_t)n, ms, mask);
	if (rc < 0)
		return rc;
	for (int i = 0; i < n; i++)
		if (p[i].revents & POLLNVAL) {
			errno = EBADF;
			return -1;
		}
	if (r)
		FD_ZERO(r);
	if (w)
		FD_ZERO(w);
	if (x)
		FD_ZERO(x);
	int count = 0;
	for (int i = 0; i < n; i++) {
		short rev = p[i].revents;
		if (r && (p[i].events & POLLIN) && (rev & (POLLIN | POLLHUP | POLLERR)))
			FD_SET(p[i].fd, r), count++;
		if (w && (p[i].events & POLLOUT) && (rev & (POLLOUT | POLLERR)))
			FD_SET(p[i].fd, w), count++;
		if (x && (p[i].events & POLLPRI) && (rev & POLLPRI))
			FD_SET(p[i].fd, x), count++;
	}
	return count;
}

/* ------------------------------------------------------------------ bells (shim.h) */

struct bell {
	int fd;
	_Atomic bool rung;
	struct bell *next;
};

static pthread_mutex_t bell_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bell *bell_free; /* under bell_lock; as many as waits ever overlapped */
__thread struct bell *shim_wait_bell __attribute__((tls_model("initial-exec")));
__thread struct ep *shim_ep_check __attribute__((tls_model("initial-exec")));
__thread bool shim_wait_sliced __attribute__((tls_model("initial-exec")));

/* An eventfd of the shim's own (non-blocking, close-on-exec, at a high number), or -1: a
 * bell's, or an epoll instance's. */
static int high_eventfd(void)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	return fd < 0 ? -1 : fd_to_high(fd);
}

struct bell *bell_take(void)
{
	pthread_mutex_lock(&bell_lock);
	struct bell *b = bell_free;
	if (b)
		bell_free = b->next;
	pthread_mutex_unlock(&bell_lock);
	if (!b) {
		int fd = high_eventfd();
		if (fd < 0 || !(b = calloc(1, sizeof *b))) {
			if (fd >= 0)
				own_close(fd);
			return NULL;
		}
		b->fd = fd;
	}
	bell_clear(b); /* a ring its last wait did not take */
	return b;
}

void bell_clear(struct bell *b)
{
	if (b && atomic_exchange(&b->rung, false)) {
		uint64_t v;
		ssize_t r = real.read(b->fd, &v, sizeof v);
		(void)r;
	}
}

void bell_put(struct bell *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&bell_lock);
	b->next = bell_free;
	bell_free = b;
	pthread_mutex_unlock(&bell_lock);
}

int bell_fd(const struct bell *b) { return b->fd; }

void bell_ring(struct bell *b)
{
	if (atomic_exchange(&b->rung, true))
		return; /* readable already */
	uint64_t one = 1;
	ssize_t r = real.write(b->fd, &one, sizeof one);
	(void)r;
}

/* ------------------------------------------------------------------ epoll */

/*
 * An epoll instance the program made is the program's: descriptors the shim did not take are
 * registered there by the kernel alone, with the program's own event data, so they behave as
 * natively whatever happens to their numbers (nginx closes a registered socketpair and gets the
 * number back for its first connection; a table of the shim's would answer EEXIST).
 *
 * Taken sockets are registered in the same instance, with event data of the shim's (a tag: a
 * registration's generation and index, the program's own data lives here), so that one wait
 * of the kernel's returns both kinds: the program's events as they are, and the taken
 * sockets' for translation. Their readiness is the shim's (a datagram in the kernel socket
 * may be an acknowledgement or one segment of a message), so they are checked before the
 * program sees them. A tag carries TAG_MAGIC in its top 16 bits, which no user-space address,
 * kernel address or small number has; a program that registers its own descriptor with data
 * that has them anyway gets a registration of the shim's for it too (foreign: its events are
 * passed through with its data), so no data of the program's is ever taken for a tag. (Before,
 * taken sockets sat in a second instance nested in the program's: every wake-up cost a second
 * epoll_wait, one system call in four of an epoll server's request.) Entries live in chunks
 * that never move, so epoll_wait reads them without the instance's lock.
 */
#define REG_CHUNK 1024
#define REG_CHUNKS 256
#define TAG_MAGIC 0xd95aull
#define TAG_IDX_BITS 18
#define TAG_GEN_MASK ((1u << 29) - 1)
_Static_assert(REG_CHUNK * REG_CHUNKS <= 1u << TAG_IDX_BITS, "a registration's index fits its tag");
/* The event data of the instance's bell (never a registration's: its generation, 0, is even,
 * and even generations are not in use). */
#define EP_BELL_TAG (TAG_MAGIC << 48)
/* Registrations deleted by the program kept in the kernel until the next wait (struct reg's
 * parked): hiredis deletes and adds its connection around every request. */
#define EP_PARKED 16

struct reg {
	_Atomic uint32_t gen; /* odd: in use */
	int fd;
	struct sock *ps;      /* the taken socket it was added for (linked to it) */
	uint64_t sid;         /* ps's id: a socket freed and made again at fd is another one */
	struct sock *s;       /* ps once it has a queue pair or stream (its readiness the shim's) */
	uint32_t events;      /* as the program asked */
	uint64_t data;
	int cqfd;             /* registered too, or -1 */
	uint32_t round;       /* last epoll_wait that reported it (dedupe) */
	bool armed;           /* EPOLLONESHOT: not reported since the last ADD/MOD */
	bool pending;         /* a stream not carried yet: attach once it connects */
	/* ADD, MOD or attaching looked at the kernel socket when the shim may already hold its
	 * data (a stream's exchange read the first records): the next wait reports what is
	 * ready once, as the kernel's ADD/MOD of a ready file does, also for EPOLLET. Set under
	 * ep->lock, consumed without it by whichever thread's epoll_wait rescans first: always
	 * accessed atomically (exchanged when consumed, so two waiting threads take it once) */
	bool kick;
	/* EPOLLET on a carried stream: stream_news() when EPOLLIN was last reported; an event with
	 * nothing new for the reader (a control record, credit) does not report it again, as the
	 * kernel reports an edge-triggered read once per arrival */
	uint64_t last_in;
	/* Deleted by the program, still in the kernel (a carried stream's, ep->parked): an ADD of
	 * the same socket before the next wait takes it back without a system call. Ignored by
	 * the waits meanwhile. Written under ep->lock, read atomically without it. */
	bool parked;
	bool fresh; /* taken back: the next rescan reads TCP (its edges were ignored) */
	/* a carried stream: its stream_kicks() when this instance last looked at it; a change
	 * means another call found news the kernel will not report (rescanned) */
	_Atomic uint32_t kicks_seen;
	/* in ep->hot: the next wait looks at it (hot_add; cleared by the look); only ever
	 * accessed atomically (__atomic builtins, as kick: clang takes no _Atomic bool there) */
	bool hot;
	/* The program's own descriptor registered with data that looks like a tag (TAG_MAGIC):
	 * its events are the kernel's, passed through with r->data. ps is NULL; dev and ino name
	 * the file, to see a descriptor closed and its number reused. */
	bool foreign;
	dev_t dev;
	ino_t ino;
};

struct ep {
	struct ent ent;
	pthread_mutex_t lock;
	int epfd;             /* the program's instance, where the shim's registrations are too */
	struct reg *chunk[REG_CHUNKS];
	uint32_t nregs;       /* indices handed out */
	uint32_t *free_idx;
	uint32_t nfree, free_cap;
	_Atomic int nlive;    /* registrations in use (in the kernel with a tag) */
	_Atomic int ntaken;   /* registrations attached to a taken socket */
	_Atomic int npending; /* registrations with pending set */
	_Atomic uint32_t round;
	uint32_t parked[EP_PARKED]; /* indices of parked registrations */
	_Atomic int nparked;
	/* threads inside epoll_wait from before their rescan until the kernel's wait returned,
	 * and the bell ep_ring writes for them (-1 until a carried stream is attached) */
	_Atomic int sleepers;
	_Atomic int bell;
	/* The registrations a wait looks at before (or instead of) asking the kernel (ep_rescan):
	 * those whose readiness the kernel may not show. A carried stream or a datagram socket
	 * holds data the kernel no longer has (the shim took it off TCP or the UDP socket), so a
	 * level-triggered registration once ready is looked at until it is not; what changes it
	 * without a kernel event puts it here: an ADD or MOD (kick), another call's news
	 * (ep_kick), a stream not carried yet (pending), a kernel event's translation. Looking at
	 * every registration at every wait cost SIPp's UAS, at 10 000 connections, most of its
	 * time (O(registrations) per epoll_wait). Datagram sockets stay listed (their queues are
	 * filled by other calls without a kick). hot_lock guards the list alone (a leaf). */
	pthread_mutex_t hot_lock;
	uint32_t *hot, nhot, hot_cap;
	uint32_t *spare, spare_cap; /* the list a rescan took, kept for the next one */
	bool scan_all; /* a socket registered twice (dup): kicks name one; every one is looked at */
	/* index + 1 of the registration of each descriptor (reg_find), 0: none; byfd_off: it
	 * could not grow, the registrations are searched instead. Guarded by lock. */
	uint32_t *byfd, byfd_cap;
	bool byfd_off;
};

static inline struct reg *reg_at(struct ep *ep, uint32_t i)
{
	struct reg *c = ep->chunk[i / REG_CHUNK];
	return c ? &c[i % REG_CHUNK] : NULL;
}

void ev_epoll_created(int epfd)
{
	struct ep *ep = calloc(1, sizeof *ep);
	if (!ep)
		return; /* the instance stays the kernel's alone: taken sockets get its readiness */
	ep->ent.kind = ENT_EPOLL;
	ep->epfd = epfd;
	ep->bell = -1;
	pthread_mutex_init(&ep->lock, NULL);
	pthread_mutex_init(&ep->hot_lock, NULL);
	struct ent *old = fd_set_ent(epfd, &ep->ent);
	if (old && old->kind == ENT_SOCK)
		sock_put((struct sock *)old);
}

static void ep_free(struct ep *ep)
{
	for (int i = 0; i < REG_CHUNKS; i++)
		free(ep->chunk[i]);
	free(ep->free_idx);
	free(ep->hot);
	free(ep->spare);
	free(ep->byfd);
	pthread_mutex_destroy(&ep->hot_lock);
	pthread_mutex_destroy(&ep->lock);
	free(ep);
}

void ep_ring(struct ep *ep)
{
	/* after the caller's kick (stream_kicks): a thread that counted itself in before that
	 * rescans after it, or is counted here and woken (seq_cst both ways) */
	if (!atomic_load(&ep->sleepers))
		return;
	int fd = atomic_load(&ep->bell);
	uint64_t one = 1;
	if (fd >= 0 && real.write(fd, &one, sizeof one) < 0)
		DG_DBG("epoll instance %d: its bell: %s", ep->epfd, strerror(errno));
}

/* Lists registration i for the next wait's look (once: r->hot). Takes ep->hot_lock. Out of
 * memory: every registration is looked at from then on. */
static void hot_add(struct ep *ep, uint32_t i)
{
	struct reg *r = i < __atomic_load_n(&ep->nregs, __ATOMIC_ACQUIRE) ? reg_at(ep, i) : NULL;
	if (!r || __atomic_exchange_n(&r->hot, true, __ATOMIC_ACQ_REL))
		return;
	pthread_mutex_lock(&ep->hot_lock);
	if (ep->nhot == ep->hot_cap) {
		uint32_t nc = ep->hot_cap ? ep->hot_cap * 2 : 64;
		uint32_t *nv = realloc(ep->hot, nc * sizeof *nv);
		if (!nv) {
			__atomic_store_n(&ep->scan_all, true, __ATOMIC_RELEASE);
			pthread_mutex_unlock(&ep->hot_lock);
			return;
		}
		ep->hot = nv, ep->hot_cap = nc;
	}
	ep->hot[ep->nhot++] = i;
	pthread_mutex_unlock(&ep->hot_lock);
}

void ep_kick(struct ep *ep, uint32_t idx)
{
	hot_add(ep, idx);
	ep_ring(ep);
}

/* The instance's bell, made and registered on first need (a carried stream attached).
 * Edge-triggered: never read, every write is one wake-up. Needs ep->lock. */
static void ep_bell_make(struct ep *ep)
{
	if (atomic_load(&ep->bell) >= 0)
		return;
	int fd = high_eventfd();
	if (fd < 0)
		return; /* its waits then see another thread's news at their next event */
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = EP_BELL_TAG};
	if (real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		own_close(fd);
		return;
	}
	atomic_store(&ep->bell, fd);
}

void ev_epoll_closing(int epfd)
{
	struct ent *e = fd_set_ent(epfd, NULL);
	if (!e || e->kind != ENT_EPOLL)
		return;
	struct ep *ep = (struct ep *)e;
	/* unlink from the sockets it watched */
	for (uint32_t i = 0; i < ep->nregs; i++) {
		struct reg *r = reg_at(ep, i);
		if (r && (atomic_load(&r->gen) & 1) && r->ps)
			sock_ep_link(r->ps, ep, 0, 0);
	}
	if (ep->bell >= 0)
		own_close(ep->bell);
	/* a concurrent epoll_wait on a closing instance is the program's race; the kernel makes
	 * that wait return EBADF before it reads our entries */
	ep_free(ep);
}

/* Names i the registration of fd (i + 1; 0: none) in ep->byfd, grown as needed (out of
 * memory: reg_find looks at every registration from then on). Needs ep->lock. */
static void byfd_set(struct ep *ep, int fd, uint32_t v)
{
	if (fd < 0 || ep->byfd_off)
		return;
	if ((uint32_t)fd >= ep->byfd_cap) {
		if (!v)
			return;
		uint32_t nc = ep->byfd_cap ? ep->byfd_cap : 256;
		while (nc <= (uint32_t)fd)
			nc *= 2;
		uint32_t *nv = realloc(ep->byfd, nc * sizeof *nv);
		if (!nv) {
			ep->byfd_off = true;
			return;
		}
		memset(nv + ep->byfd_cap, 0, (nc - ep->byfd_cap) * sizeof *nv);
		ep->byfd = nv, ep->byfd_cap = nc;
	}
	ep->byfd[fd] = v;
}

/* The registration of fd in ep (*idx its index), or NULL. Needs ep->lock. */
static struct reg *reg_find(struct ep *ep, int fd, uint32_t *idx)
{
	if (!ep->byfd_off) {
		uint32_t v = fd >= 0 && (uint32_t)fd < ep->byfd_cap ? ep->byfd[fd] : 0;
		struct reg *r = v ? reg_at(ep, v - 1) : NULL;
		if (!r || !(atomic_load(&r->gen) & 1) || r->fd != fd)
			return NULL;
		*idx = v - 1;
		return r;
	}
	for (uint32_t i = 0; i < ep->nregs; i++) {
		struct reg *r = reg_at(ep, i);
		if (r && (atomic_load(&r->gen) & 1) && r->fd == fd) {
			*idx = i;
			return r;
		}
	}
	return NULL;
}

static struct reg *reg_new(struct ep *ep, uint32_t *idx)
{
	uint32_t i;
	if (ep->nfree) {
		i = ep->free_idx[--ep->nfree];
	} else {
		if (ep->nregs >= REG_CHUNK * REG_CHUNKS)
			return NULL;
		i = ep->nregs;
		if (!ep->chunk[i / REG_CHUNK] && !(ep->chunk[i / REG_CHUNK] = calloc(REG_CHUNK, sizeof(struct reg))))
			return NULL;
		__atomic_store_n(&ep->nregs, ep->nregs + 1, __ATOMIC_RELEASE);
	}
	*idx = i;
	return reg_at(ep, i);
}

static void pending_set(struct ep *ep, struct reg *r, bool on)
{
	if (r->pending == on)
		return;
	r->pending = on;
	atomic_fetch_add(&ep->npending, on ? 1 : -1);
}

/* r (index i) no longer parked. Needs ep->lock. */
static void parked_forget(struct ep *ep, struct reg *r, uint32_t i)
{
	if (!r->parked)
		return;
	int n = atomic_load(&ep->nparked);
	for (int k = 0; k < n; k++)
		if (ep->parked[k] == i) {
			ep->parked[k] = ep->parked[--n];
			break;
		}
	atomic_store(&ep->nparked, n);
	__atomic_store_n(&r->parked, false, __ATOMIC_RELEASE);
}

/* Frees r's slot (the kernel's registrations are the caller's business). Needs ep->lock. */
static void reg_release(struct ep *ep, struct reg *r, uint32_t i)
{
	parked_forget(ep, r, i);
	__atomic_store_n(&r->fresh, false, __ATOMIC_RELAXED);
	if (!ep->byfd_off && r->fd >= 0 && (uint32_t)r->fd < ep->byfd_cap && ep->byfd[r->fd] == i + 1)
		ep->byfd[r->fd] = 0;
	r->foreign = false;
	atomic_fetch_add(&r->gen, 1); /* even: free; stale kernel events no longer match */
	atomic_fetch_sub(&ep->nlive, 1);
	pending_set(ep, r, false);
	if (r->s)
		atomic_fetch_sub(&ep->ntaken, 1);
	r->s = NULL;
	r->ps = NULL;
	if (ep->nfree == ep->free_cap) {
		uint32_t nc = ep->free_cap ? ep->free_cap * 2 : 64;
		uint32_t *nf = realloc(ep->free_idx, nc * sizeof *nf);
		if (!nf)
			return; /* the index is lost, not reused */
		ep->free_idx = nf, ep->free_cap = nc;
	}
	ep->free_idx[ep->nfree++] = i;
}

/* r removed from the kernel (its socket and CQ descriptors) and freed. Needs ep->lock. */
static void reg_drop(struct ep *ep, struct reg *r, uint32_t i)
{
	real.epoll_ctl(ep->epfd, EPOLL_CTL_DEL, r->fd, NULL);
	if (r->cqfd >= 0)
		real.epoll_ctl(ep->epfd, EPOLL_CTL_DEL, r->cqfd, NULL);
	reg_release(ep, r, i);
}

/* r's event data in the kernel: TAG_MAGIC, its generation, index i, and whether it is for the
 * CQ's descriptor */
static inline uint64_t tag(struct reg *r, uint32_t i, bool cq)
{
	return TAG_MAGIC << 48 | (uint64_t)(atomic_load(&r->gen) & TAG_GEN_MASK) << (TAG_IDX_BITS + 1) |
	       (uint64_t)i << 1 | cq;
}

static inline bool tag_ours(uint64_t d) { return d >> 48 == TAG_MAGIC; }
static inline uint32_t tag_idx(uint64_t d) { return (uint32_t)(d >> 1) & ((1u << TAG_IDX_BITS) - 1); }

/* Whether d is r's tag in its present generation (not a removed registration's). */
static inline bool tag_current(struct reg *r, uint64_t d)
{
	return (atomic_load(&r->gen) & TAG_GEN_MASK) == ((uint32_t)(d >> (TAG_IDX_BITS + 1)) & TAG_GEN_MASK);
}

/* Kernel events for a registration: the socket's own events; EPOLLIN of a taken socket is
 * checked before the program sees it; a carried stream's EPOLLIN/EPOLLOUT/EPOLLRDHUP (and
 * its hang-ups and errors) come from the shim alone (the kernel socket's data, room and
 * state are the provider's): the kernel's registration only wakes the wait, edge-triggered
 * so that a hang-up of the provider's socket the stream does not report is no busy loop.
 * It asks EPOLLIN whatever the program asked: TCP data (the peer's records, its credit for
 * a writer waiting on EPOLLOUT) then wakes the waiting thread, which processes it itself in
 * shim_ready (a stream whose CQ has no eventfd is woken by nothing else). And EPOLLOUT: room
 * after a send TCP refused and a connect that went through are the provider's to act on, in
 * our call; an edge whose bytes another call took meanwhile is then still reported (the
 * socket is writable when the kernel looks again), so its translation looks at the stream. */
static uint32_t kernel_events(const struct reg *r)
{
	if (r->s && sock_is_stream(r->s))
		return (r->events & ~(uint32_t)EPOLLRDHUP) | EPOLLIN | EPOLLOUT | EPOLLET;
	return r->events;
}

/* Readiness a carried stream decides for r's socket among the events asked: in *own what it
 * decides (EPOLLIN, EPOLLOUT, and with either EPOLLRDHUP, EPOLLHUP, EPOLLERR: epoll's bits are
 * poll's), the return value what is ready. */
static uint32_t shim_ready(struct reg *r, uint32_t asked, uint32_t *own, bool queued)
{
	uint32_t o = 0, rdy = 0;
	if (asked & EPOLLIN) {
		int in = queued ? sock_poll_in_queued(r->s, r->fd) : sock_poll_in(r->s, r->fd);
		if (in >= 0)
			o |= EPOLLIN | STREAM_ENDS, rdy |= in > 0 ? (uint32_t)in : 0;
	}
	if (asked & EPOLLOUT) {
		int out = queued ? sock_poll_out_queued(r->s, r->fd) : sock_poll_out(r->s, r->fd);
		if (out >= 0)
			o |= EPOLLOUT | STREAM_ENDS, rdy |= out > 0 ? (uint32_t)out : 0;
	}
	*own = o;
	return rdy & (r->events | EPOLLHUP | EPOLLERR);
}

/* Registers cqfd (the CQ's eventfd of r's socket) in the kernel; -1 (a CQ its socket's own
 * readiness serves, dgv_cq_self_driven) registers nothing. Needs ep->lock. */
static void reg_add_cq(struct ep *ep, struct reg *r, uint32_t idx, int cqfd)
{
	struct epoll_event cev = {.events = EPOLLIN | (r->events & EPOLLET), .data.u64 = tag(r, idx, true)};
	if (cqfd >= 0 && real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, cqfd, &cev) == 0)
		r->cqfd = cqfd;
}

/* A socket registered while its CQ needed no eventfd whose CQ needs one now (a datagram
 * socket's mode became RD: a queue pair the provider's thread reads; a stream whose send TCP
 * refused, which the thread finishes): the eventfd joins the registration at the socket's
 * next event. cqfd: the one sock_wait_fds gave, -1 to ask. Takes ep->lock. */
static void reg_cq_late(struct ep *ep, struct reg *r, uint32_t idx, uint64_t d, int cqfd)
{
	int qfd;
	short qev;
	if (cqfd < 0 && (sock_wait_fds(r->s, &qfd, &qev, &cqfd) || cqfd < 0))
		return;
	pthread_mutex_lock(&ep->lock);
	if (tag_current(r, d) && r->cqfd < 0)
		reg_add_cq(ep, r, idx, cqfd);
	pthread_mutex_unlock(&ep->lock);
}

/* Makes r a taken socket's registration (its CQ's descriptor registered too) once the socket
 * has a queue pair: at ADD (in_kernel false: the caller then adds the socket to the kernel with
 * kernel_events, which now are the attached ones), or at its first event when it was added
 * before bind (in_kernel: a stream's registration there is changed to them). A stream is
 * checked without a read of TCP: the kernel's ADD of its registration reports the data waiting
 * there (edge-triggered, a ready file's ADD queues an event), whose translation reads it. Needs
 * ep->lock. Returns true when r is (now) a taken socket's. */
static bool reg_attach(struct ep *ep, struct reg *r, uint32_t idx, bool in_kernel)
{
	if (r->s)
		return true;
	struct sock *s = fd_sock(r->fd);
	int qfd, cqfd;
	short qev;
	if (!s || s != r->ps || sock_id(s) != r->sid)
		return false;
	bool strm = sock_is_stream(s);
	if ((strm ? sock_poll_in_queued(s, r->fd) : sock_poll_in(s, r->fd)) < 0 ||
	    sock_wait_fds(s, &qfd, &qev, &cqfd)) {
		pending_set(ep, r, strm); /* a stream may connect later */
		if (strm)
			hot_add(ep, idx);
		return false;
	}
	pending_set(ep, r, false);
	reg_add_cq(ep, r, idx, cqfd);
	if (strm) {
		ep_bell_make(ep);
		atomic_store(&r->kicks_seen, stream_kicks(s));
	}
	r->s = s;
	__atomic_store_n(&r->kick, true, __ATOMIC_RELAXED);
	hot_add(ep, idx);
	atomic_fetch_add(&ep->ntaken, 1);
	if (strm && in_kernel) {
		struct epoll_event kev = {.events = kernel_events(r), .data.u64 = tag(r, idx, false)};
		real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, r->fd, &kev);
	}
	return true;
}

/* Whether ep still has a registration of s. Needs ep->lock. */
static bool ep_watches(struct ep *ep, struct sock *s)
{
	for (uint32_t i = 0; i < ep->nregs; i++) {
		struct reg *r = reg_at(ep, i);
		if (r && (atomic_load(&r->gen) & 1) && r->ps == s)
			return true;
	}
	return false;
}

/* reg_drop, and the socket no longer tells ep when it goes unless another registration of it
 * stays. Needs ep->lock. */
static void reg_drop_unlink(struct ep *ep, struct reg *r, uint32_t i)
{
	struct sock *old = r->ps;
	reg_drop(ep, r, i);
	/* without scan_all no socket has two registrations here: no search */
	if (old && (!__atomic_load_n(&ep->scan_all, __ATOMIC_ACQUIRE) || !ep_watches(ep, old)))
		sock_ep_link(old, ep, 0, 0);
}

/* r still names the socket (a foreign one: the file) it was added for, not a closed one whose
 * number came back. */
static bool reg_current(const struct reg *r)
{
	if (r->foreign) {
		struct stat st;
		return fstat(r->fd, &st) == 0 && st.st_dev == r->dev && st.st_ino == r->ino;
	}
	struct sock *s = fd_sock(r->fd);
	return s && s == r->ps && sock_id(s) == r->sid;
}

/* An ADD of a parked registration's socket: taken back with the program's new events and data
 * when the kernel's registrations need no change (a one-shot or exclusive one is made anew).
 * Its next rescan reports what is ready, reading TCP first (the edges that came while it was
 * parked were ignored). Needs ep->lock. Returns whether it was taken back. */
static bool unpark(struct ep *ep, struct reg *r, uint32_t idx, const struct epoll_event *ev)
{
	uint32_t was_k = kernel_events(r), was = r->events;
	if ((ev->events & (EPOLLONESHOT | EPOLLEXCLUSIVE)) || ((was ^ ev->events) & EPOLLET))
		return false;
	r->events = ev->events;
	if (kernel_events(r) != was_k) {
		r->events = was;
		return false;
	}
	r->data = ev->data.u64;
	r->armed = true;
	r->round = 0;
	r->last_in = 0;
	__atomic_store_n(&r->fresh, true, __ATOMIC_RELAXED);
	__atomic_store_n(&r->kick, true, __ATOMIC_RELAXED);
	parked_forget(ep, r, idx); /* last: a rescan that sees it unparked sees the rest */
	hot_add(ep, idx);
	return true;
}

/* Parked registrations not taken back before this wait: deleted now. Takes ep->lock. */
static void parked_purge(struct ep *ep)
{
	pthread_mutex_lock(&ep->lock);
	int n;
	while ((n = atomic_load(&ep->nparked)) > 0) {
		uint32_t i = ep->parked[n - 1];
		reg_drop_unlink(ep, reg_at(ep, i), i); /* forgets it from ep->parked */
	}
	pthread_mutex_unlock(&ep->lock);
}

/* The program's own registration of fd (ADD, or MOD of one the kernel holds) whose data looks
 * like a tag: made a foreign registration of the shim's, so that its events come back with the
 * program's data and the data is never taken for a tag. Needs ep->lock. Returns 0 or -errno. */
static int foreign_reg(struct ep *ep, int op, int fd, const struct epoll_event *ev)
{
	struct stat st;
	if (fstat(fd, &st))
		return -errno;
	uint32_t idx;
	struct reg *r = reg_new(ep, &idx);
	if (!r)
		return -ENOMEM;
	r->fd = fd, r->events = ev->events, r->data = ev->data.u64, r->cqfd = -1, r->s = NULL;
	byfd_set(ep, fd, idx + 1);
	r->ps = NULL, r->sid = 0;
	r->round = 0;
	r->armed = true;
	r->pending = false;
	__atomic_store_n(&r->kick, false, __ATOMIC_RELAXED);
	r->last_in = 0;
	r->foreign = true, r->dev = st.st_dev, r->ino = st.st_ino;
	atomic_fetch_add(&r->gen, 1); /* odd: in use */
	atomic_fetch_add(&ep->nlive, 1);
	struct epoll_event kev = {.events = ev->events, .data.u64 = tag(r, idx, false)};
	if (real.epoll_ctl(ep->epfd, op, fd, &kev) < 0) {
		int e = errno;
		reg_release(ep, r, idx);
		return -e;
	}
	DG_DBG("epoll instance %d: fd %d registered with data %#llx, which looks like the shim's: "
	       "passed through a registration of the shim's", ep->epfd, fd, (unsigned long long)ev->data.u64);
	return 0;
}

/* The program's own registration, the kernel's with the program's data (a foreign one when
 * that data looks like a tag). Needs ep->lock; releases it. Returns 0 or -errno. */
static int kernel_own(struct ep *ep, int op, int fd, struct epoll_event *ev)
{
	int rc;
	if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && tag_ours(ev->data.u64))
		rc = foreign_reg(ep, op, fd, ev);
	else
		rc = real.epoll_ctl(ep->epfd, op, fd, ev) < 0 ? -errno : 0;
	pthread_mutex_unlock(&ep->lock);
	return rc;
}

/* MOD or DEL of a foreign registration (r, index idx), or an ADD of its descriptor again.
 * Needs ep->lock. Returns 0 or -errno. */
static int foreign_ctl(struct ep *ep, struct reg *r, uint32_t idx, int op, struct epoll_event *ev)
{
	if (op == EPOLL_CTL_ADD)
		return -EEXIST;
	if (op == EPOLL_CTL_DEL) {
		reg_drop(ep, r, idx);
		return 0;
	}
	if (op != EPOLL_CTL_MOD)
		return -EINVAL;
	struct epoll_event kev = {.events = ev->events, .data.u64 = tag(r, idx, false)};
	if (real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, r->fd, &kev) < 0)
		return -errno;
	r->events = ev->events, r->data = ev->data.u64;
	r->armed = true;
	return 0;
}

int ev_epoll_ctl(struct ep *ep, int epfd, int op, int fd, struct epoll_event *ev)
{
	if (op != EPOLL_CTL_DEL && !ev)
		return -EFAULT;
	pthread_mutex_lock(&ep->lock);
	int rc = 0;
	uint32_t idx;
	struct reg *r = reg_find(ep, fd, &idx);
	if (r && !reg_current(r)) {
		/* the socket went away behind the shim's back (a close it did not see) */
		reg_drop_unlink(ep, r, idx);
		r = NULL;
	}
	if (r && r->foreign) {
		int frc = foreign_ctl(ep, r, idx, op, ev);
		pthread_mutex_unlock(&ep->lock);
		return frc;
	}
	if (r && r->parked) {
		/* deleted by the program: MOD and DEL find nothing, as natively; an ADD takes it
		 * back when the kernel's registrations can stay as they are */
		if (op != EPOLL_CTL_ADD) {
			pthread_mutex_unlock(&ep->lock);
			return -ENOENT;
		}
		if (!ev || !unpark(ep, r, idx, ev)) {
			reg_drop_unlink(ep, r, idx);
			r = NULL;
		} else {
			pthread_mutex_unlock(&ep->lock);
			return 0;
		}
	}
	struct sock *s = r ? r->ps : fd_sock(fd);
	if (!r && (!s || op != EPOLL_CTL_ADD))
		return kernel_own(ep, op, fd, ev); /* not a taken socket's registration */
	switch (op) {
	case EPOLL_CTL_ADD: {
		if (r) {
			rc = -EEXIST;
			break;
		}
		if (ev->events & EPOLLEXCLUSIVE)
			return kernel_own(ep, op, fd, ev); /* the kernel's rules for these (EINVAL for a
							      * taken socket's MOD later) */
		/* a parked registration of the same socket under another number (a dup) holds the
		 * CQ's descriptor in the kernel: deleted first, so this one can register it */
		for (int k = atomic_load(&ep->nparked) - 1; k >= 0; k--) {
			uint32_t pi = ep->parked[k];
			struct reg *pr = reg_at(ep, pi);
			if (pr->ps == s)
				reg_drop(ep, pr, pi);
		}
		int lk = sock_ep_link(s, ep, 1, 0);
		if (!lk)
			return kernel_own(ep, op, fd, ev); /* watched by too many instances to be told
							      * when it goes: the kernel's readiness */
		if (!(r = reg_new(ep, &idx))) {
			sock_ep_link(s, ep, 0, 0);
			rc = -ENOMEM;
			break;
		}
		if (lk == 1 || !ep_watches(ep, s))
			sock_ep_link(s, ep, 2, idx); /* (2: a parked one of a dup, dropped above) */
		else
			/* a second registration of s: kicks name one only */
			__atomic_store_n(&ep->scan_all, true, __ATOMIC_RELEASE);
		r->fd = fd, r->events = ev->events, r->data = ev->data.u64, r->cqfd = -1, r->s = NULL;
		byfd_set(ep, fd, idx + 1);
		r->ps = s, r->sid = sock_id(s);
		r->round = 0;
		r->armed = true;
		r->pending = false;
		__atomic_store_n(&r->kick, false, __ATOMIC_RELAXED);
		r->last_in = 0;
		r->foreign = false;
		atomic_fetch_add(&r->gen, 1); /* odd: in use */
		atomic_fetch_add(&ep->nlive, 1);
		/* attached first: the kernel's registration is made once, with the events it keeps */
		reg_attach(ep, r, idx, false);
		struct epoll_event kev = {.events = kernel_events(r), .data.u64 = tag(r, idx, false)};
		if (real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &kev) < 0) {
			rc = -errno;
			sock_ep_link(s, ep, 0, 0);
			reg_drop(ep, r, idx); /* the CQ's descriptor, when attached */
			break;
		}
		break;
	}
	case EPOLL_CTL_MOD: {
		/* A carried stream's kernel registration only wakes the wait (kernel_events): a MOD
		 * that leaves what it asks of the kernel as it was (a program switching EPOLLOUT
		 * on and off around each write, as hiredis does) leaves the kernel's alone. What a
		 * MOD reports at once is the shim's to report (kick: ep_rescan), and every edge the
		 * kernel gave was read by its translation. A one-shot one is armed again by it. */
		uint32_t was_k = r->s ? kernel_events(r) : 0, was = r->events;
		r->events = ev->events, r->data = ev->data.u64;
		r->armed = true;
		__atomic_store_n(&r->kick, true, __ATOMIC_RELAXED);
		hot_add(ep, idx);
		bool same = r->s && sock_is_stream(r->s) && !((was | ev->events) & EPOLLONESHOT) &&
			    kernel_events(r) == was_k;
		struct epoll_event kev = {.events = kernel_events(r), .data.u64 = tag(r, idx, false)};
		if (!same && real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, fd, &kev) < 0)
			rc = -errno;
		if (r->cqfd >= 0 && !(same && !((was ^ ev->events) & EPOLLET))) {
			struct epoll_event cev = {.events = EPOLLIN | (ev->events & EPOLLET),
						  .data.u64 = tag(r, idx, true)};
			real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, r->cqfd, &cev);
		}
		break;
	}
	case EPOLL_CTL_DEL: {
		/* a carried stream's registrations stay in the kernel until the next wait, parked: an
		 * ADD of it meanwhile (hiredis's next request) takes them back for nothing */
		int np = atomic_load(&ep->nparked);
		if (r->s && sock_is_stream(r->s) && !(r->events & EPOLLONESHOT) && np < EP_PARKED) {
			ep->parked[np] = idx;
			atomic_store(&ep->nparked, np + 1);
			__atomic_store_n(&r->parked, true, __ATOMIC_RELEASE);
			break;
		}
		reg_drop_unlink(ep, r, idx);
		break;
	}
	default:
		rc = -EINVAL;
	}
	pthread_mutex_unlock(&ep->lock);
	return rc;
}

/* The registrations of descriptor fd (or every descriptor when fd < 0) of s, in the instances
 * eps: dropped, or handed to the program's instance (keep: the socket lives on with the OS,
 * and the program's registration with it). Call without s->lock. */
static void regs_of(struct sock *s, int fd, struct ep **eps, int n, bool keep)
{
	for (int k = 0; k < n; k++) {
		struct ep *ep = eps[k];
		pthread_mutex_lock(&ep->lock);
		bool any_left = false;
		for (uint32_t i = 0; i < ep->nregs; i++) {
			struct reg *r = reg_at(ep, i);
			if (!r || !(atomic_load(&r->gen) & 1) || r->ps != s)
				continue;
			if (fd >= 0 && r->fd != fd) {
				any_left = true;
				continue;
			}
			/* the program's registration replaces ours, after it (one instance holds both) */
			struct epoll_event pev = {.events = r->events, .data.u64 = r->data};
			bool hand = keep && !r->parked && (!(r->events & EPOLLONESHOT) || r->armed);
			int rfd = r->fd;
			reg_drop(ep, r, i);
			if (hand && tag_ours(pev.data.u64))
				foreign_reg(ep, EPOLL_CTL_ADD, rfd, &pev);
			else if (hand)
				real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, rfd, &pev);
		}
		pthread_mutex_unlock(&ep->lock);
		if (fd >= 0 && !any_left)
			sock_ep_link(s, ep, 0, 0);
	}
}

void ev_sock_gone(struct sock *s, struct ep **eps, int n)
{
	/* The kernel drops the socket from its epoll sets when the last descriptor closes (the
	 * QP runs on the program's own descriptor); drop our registrations and the CQ's. */
	regs_of(s, -1, eps, n, false);
}

void ev_fd_gone(struct sock *s, int fd, bool keep)
{
	struct ep *eps[SHIM_MAX_EPS];
	int n = sock_eps(s, eps);
	regs_of(s, fd, eps, n, keep);
}

void ev_after_fork(void) {}

/* Is a datagram ready on a level-triggered registration, without a system call? */
static bool cheap_ready(struct sock *s)
{
	if (__atomic_load_n(&s->pend_n, __ATOMIC_RELAXED) || __atomic_load_n(&s->carry, __ATOMIC_RELAXED))
		return true;
	struct dgv_cq *cq = __atomic_load_n(&s->cq, __ATOMIC_ACQUIRE);
	return cq && dgv_cq_ready(cq) > 0;
}

#define EV_STACK 256

/* A carried stream whose server said "stay plain" while r was attached (ent.plain_due): the
 * shim forgets its descriptor, and r becomes the kernel's registration again, with the events
 * the program asked (a connect's EPOLLOUT among them, which the attached registration left to
 * the shim), reported from the next wait on. Needs no ep->lock (stream_let_go takes it).
 * Returns whether it did; r is not to be used after. */
static bool let_go_plain(struct reg *r)
{
	if (likely(!atomic_load_explicit(&r->s->ent.plain_due, memory_order_acquire)))
		return false;
	if (reg_current(r))
		stream_let_go(r->fd);
	return true;
}

/* ep_rescan's look at registration r (index i): writes its event into *ev when it has one to
 * report. Returns 1 (reported), 0 (nothing); *keep: whether the next wait must look at it
 * again without a kernel event (level-triggered and ready, a datagram socket, a stream not
 * carried yet). */
static int rescan_one(struct ep *ep, struct reg *r, uint32_t i, uint32_t round, struct epoll_event *ev, bool *keep)
{
	*keep = false;
	if (!(atomic_load(&r->gen) & 1) || __atomic_load_n(&r->parked, __ATOMIC_ACQUIRE))
		return 0;
	if (r->pending && !r->s) {
		/* a stream that connected since it was added: carried from now on */
		shim_depth++;
		pthread_mutex_lock(&ep->lock);
		if ((atomic_load(&r->gen) & 1) && !r->s)
			reg_attach(ep, r, i, true);
		pthread_mutex_unlock(&ep->lock);
		shim_depth--;
		*keep = r->pending && !r->s;
	}
	if (!r->s)
		return 0;
	uint32_t e = r->events, got = EPOLLIN;
	/* taken once: two threads waiting on this epoll instance rescan at the same time
	 * (ThreadSanitizer: they raced on it, and both could report the one event) */
	bool kick = __atomic_exchange_n(&r->kick, false, __ATOMIC_RELAXED);
	bool strm = sock_is_stream(r->s);
	if (strm) {
		/* news another call took off TCP (shim.h "Waking a waiter") */
		uint32_t k = stream_kicks(r->s);
		if (atomic_exchange(&r->kicks_seen, k) != k) {
			kick = true;
			if (r->cqfd < 0)
				reg_cq_late(ep, r, i, tag(r, i, false), -1); /* its CQ needs one now */
		}
	} else {
		*keep = true;
	}
	if (((e & EPOLLET) && !kick) || ((e & EPOLLONESHOT) && !r->armed))
		return 0;
	if (strm) {
		uint32_t own;
		shim_depth++;
		bool fresh = __atomic_exchange_n(&r->fresh, false, __ATOMIC_RELAXED);
		got = shim_ready(r, e & (EPOLLIN | EPOLLOUT), &own, !fresh);
		if (!own && let_go_plain(r)) {
			shim_depth--;
			return 0;
		}
		if ((e & EPOLLET) && (got & EPOLLIN))
			r->last_in = stream_news(r->s);
		shim_depth--;
		if (!got)
			return 0;
		*keep = !(e & (EPOLLET | EPOLLONESHOT));
	} else if (!(e & EPOLLIN) || !cheap_ready(r->s)) {
		return 0;
	}
	r->round = round;
	if (e & EPOLLONESHOT) {
		r->armed = false;
		/* the kernel must not report it again either until MOD */
		struct epoll_event kev = {.events = 0, .data.u64 = tag(r, i, false)};
		real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, r->fd, &kev);
	}
	*ev = (struct epoll_event){.events = got, .data.u64 = r->data};
	return 1;
}

/* Level-triggered registrations of taken sockets with data the kernel no longer shows (queued
 * from an earlier burst), and streams that connected since they were added, into evs: those
 * listed in ep->hot (every registration once a socket is registered twice). Returns the number
 * of events written. */
static int ep_rescan(struct ep *ep, struct epoll_event *evs, int max, uint32_t round)
{
	int out = 0;
	bool keep;
	if (__atomic_load_n(&ep->scan_all, __ATOMIC_ACQUIRE)) {
		uint32_t nr = __atomic_load_n(&ep->nregs, __ATOMIC_ACQUIRE);
		for (uint32_t i = 0; i < nr && out < max; i++) {
			struct reg *r = reg_at(ep, i);
			if (r)
				out += rescan_one(ep, r, i, round, &evs[out], &keep);
		}
		return out;
	}
	/* the list is taken whole (a new one gathers meanwhile); what is to be looked at again
	 * goes into the new one, and what max left unlooked at too */
	pthread_mutex_lock(&ep->hot_lock);
	uint32_t *v = ep->hot, n = ep->nhot, cap = ep->hot_cap;
	ep->hot = ep->spare, ep->hot_cap = ep->spare_cap, ep->nhot = 0;
	ep->spare = NULL, ep->spare_cap = 0;
	pthread_mutex_unlock(&ep->hot_lock);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = v[k];
		struct reg *r = reg_at(ep, i);
		if (!r || !__atomic_exchange_n(&r->hot, false, __ATOMIC_ACQ_REL))
			continue;
		if (out >= max) {
			hot_add(ep, i);
			continue;
		}
		out += rescan_one(ep, r, i, round, &evs[out], &keep);
		if (keep)
			hot_add(ep, i);
	}
	pthread_mutex_lock(&ep->hot_lock);
	if (!ep->spare)
		ep->spare = v, ep->spare_cap = cap, v = NULL;
	pthread_mutex_unlock(&ep->hot_lock);
	free(v);
	return out;
}

/* Translates n events of the shim's registrations (tags) into evs[*out..max). */
static void ep_translate(struct ep *ep, const struct epoll_event *k, int n, struct epoll_event *evs,
			 int *outp, int max, uint32_t round)
{
	int out = *outp;
	shim_depth++;
	for (int j = 0; j < n && out < max; j++) {
		uint64_t d = k[j].data.u64;
		if (d == EP_BELL_TAG)
			continue; /* another thread took a stream's news: the next rescan finds it */
		uint32_t i = tag_idx(d);
		bool cq = d & 1;
		struct reg *r = i < __atomic_load_n(&ep->nregs, __ATOMIC_ACQUIRE) ? reg_at(ep, i) : NULL;
		if (!r || !tag_current(r, d) || !(atomic_load(&r->gen) & 1) ||
		    __atomic_load_n(&r->parked, __ATOMIC_ACQUIRE))
			continue; /* a registration removed (or deleted by the program) since */
		uint32_t e = k[j].events;
		if (!r->s && !r->foreign) {
			pthread_mutex_lock(&ep->lock);
			if (tag_current(r, d))
				reg_attach(ep, r, i, true);
			pthread_mutex_unlock(&ep->lock);
		}
		if (r->s) {
			bool strm = sock_is_stream(r->s);
			/* what this event brought may outlast the report (level-triggered) */
			hot_add(ep, i);
			if (cq && !strm)
				sock_cq_ack(r->s);
			if (strm) {
				uint32_t own, own2, rdy = shim_ready(r, r->events & (EPOLLIN | EPOLLOUT), &own, false);
				if (!own && let_go_plain(r))
					continue;
				/* after shim_ready: the completions its progress made signalled the
				 * CQ descriptor as well; consumed now, that edge is not reported
				 * again (epoll looks at the descriptor before it reports), so an
				 * edge-triggered program sees one event per arrival */
				sock_cq_ack(r->s);
				/* Armed again, then looked at once more without I/O: what the
				 * provider's thread completes from now on (it may have held the QP
				 * while this thread looked, taking the TCP edge's data) raises the CQ
				 * descriptor, and what it completed meanwhile, or what one half's
				 * progress brought for the other (a record while looking at send
				 * room), is reported now: else an edge-triggered program (nginx)
				 * waits for an edge that already went. */
				int qfd_, cqfd_;
				short qev_;
				if (sock_wait_fds(r->s, &qfd_, &qev_, &cqfd_) == 0 && cqfd_ >= 0 && r->cqfd < 0)
					reg_cq_late(ep, r, i, d, cqfd_);
				rdy |= shim_ready(r, r->events & (EPOLLIN | EPOLLOUT), &own2, true);
				if ((r->events & EPOLLET) && (rdy & EPOLLIN)) {
					uint64_t nw = stream_news(r->s);
					if (nw == r->last_in)
						rdy &= ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
					r->last_in = nw;
				}
				e = (e & ~own) | rdy;
			} else if ((e & EPOLLIN) || cq) {
				if (r->cqfd < 0 && sock_cqfd_made(r->s))
					reg_cq_late(ep, r, i, d, -1);
				int in = !(r->events & EPOLLIN) ? 0
					 : (e & EPOLLIN) && !cq    ? sock_poll_in_fired(r->s, r->fd)
								   : sock_poll_in(r->s, r->fd);
				if (in >= 0) /* < 0: the OS carries it, the kernel's word stands */
					e = (e & ~EPOLLIN) | (in > 0 ? EPOLLIN : 0);
			}
			if (cq)
				e &= EPOLLIN | EPOLLOUT | (strm ? STREAM_ENDS : 0);
			e &= r->events | EPOLLERR | EPOLLHUP;
			if (!e) {
				if ((r->events & EPOLLONESHOT) && !cq) {
					/* the kernel disarmed it for nothing: arm it again */
					struct epoll_event kev = {.events = kernel_events(r), .data.u64 = d};
					real.epoll_ctl(ep->epfd, EPOLL_CTL_MOD, r->fd, &kev);
				}
				continue;
			}
			if (r->round == round) {
				/* reported already this round: merge */
				for (int q = 0; q < out; q++)
					if (evs[q].data.u64 == r->data)
						evs[q].events |= e;
				continue;
			}
			r->round = round;
		}
		if (r->events & EPOLLONESHOT) {
			if (!r->armed)
				continue;
			r->armed = false;
		}
		evs[out++] = (struct epoll_event){.events = e, .data.u64 = r->data};
	}
	shim_depth--;
	*outp = out;
}

int ev_epoll_wait(struct ep *ep, int epfd, struct epoll_event *evs, int max, int timeout_ms,
		  const sigset_t *mask, const struct timespec *ts2)
{
	if (!atomic_load(&ep->nlive) && atomic_load(&ep->bell) < 0) {
		/* nothing of the shim's in it: the kernel's instance as it is */
		if (ts2)
			return (int)real.syscall(SYS_epoll_pwait2, epfd, evs, max, ts2, mask, _NSIG / 8);
		return mask ? real.epoll_pwait(epfd, evs, max, timeout_ms, mask)
			    : real.epoll_wait(epfd, evs, max, timeout_ms);
	}
	if (max <= 0 || max > INT32_MAX / (int)sizeof(struct epoll_event)) {
		errno = EINVAL;
		return -1;
	}
	struct epoll_event stack[EV_STACK];
	struct epoll_event *k = max <= EV_STACK ? stack : malloc((size_t)max * sizeof *k);
	if (!k) {
		errno = ENOMEM;
		return -1;
	}
	if (atomic_load(&ep->nparked))
		parked_purge(ep);
	uint64_t deadline = timeout_ms > 0 ? shim_now_us() + (uint64_t)timeout_ms * 1000 : 0;
	int t = timeout_ms, out = 0;
	struct ep *was = shim_ep_check;
	for (;;) {
		uint32_t round = atomic_fetch_add(&ep->round, 1) + 1;
		out = 0;
		/* counted in before the rescan looks at the streams' kicks: another thread's news
		 * after that look rings the bell (ep_ring) */
		atomic_fetch_add(&ep->sleepers, 1);
		shim_ep_check = ep;
		if (atomic_load(&ep->ntaken) || atomic_load(&ep->npending))
			out = ep_rescan(ep, evs, max, round);
		shim_ep_check = was;
		/* The rescan found events (what a program's ADD or MOD made ready, data already
		 * taken off TCP): returned without asking the kernel, whose events stay queued for
		 * the next wait, except every fourth round, so that a program which re-registers at
		 * every turn of its loop (hiredis) still sees its own descriptors promptly. */
		if (out && (round & 3)) {
			atomic_fetch_sub(&ep->sleepers, 1);
			break;
		}
		int wt = out ? 0 : t;
		int kmax = max - out > 0 ? max - out : 1;
		int n = mask ? real.epoll_pwait(epfd, k, kmax, wt, mask) : real.epoll_wait(epfd, k, kmax, wt);
		atomic_fetch_sub(&ep->sleepers, 1);
		if (n < 0) {
			if (out)
				break; /* report what we have; the error will come again */
			if (k != stack)
				free(k);
			return -1;
		}
		int in = 0;
		for (int j = 0; j < n; j++) {
			if (tag_ours(k[j].data.u64))
				k[in++] = k[j]; /* the shim's, translated below (in <= j: in place) */
			else if (out < max)
				evs[out++] = k[j]; /* the program's own registration, as the kernel says */
		}
		shim_ep_check = ep;
		if (in > 0)
			ep_translate(ep, k, in, evs, &out, max, round);
		shim_ep_check = was;
		t = remaining(deadline, timeout_ms);
		if (out || t == 0)
			break;
	}
	if (k != stack)
		free(k);
	return out;
}
