/*
 * shim.h - internals of libdgshim.so (nothing here is exported; see exports.map).
 *
 * Layers: interpose.c (the exported libc names, one-line dispatch) -> sock.c (taken sockets:
 * queue pairs, send and receive, discovery, counters) and events.c (poll/select/epoll) ->
 * dgverbs.h (the verbs interface; the shim never knows the backend).
 *
 * Lock order: sock->lock -> (provider locks). ep->lock is never held while taking sock->lock.
 * Functions return 0/count or -errno; interpose.c turns that into -1/errno once.
 */
#ifndef DGSHIM_SHIM_H
#define DGSHIM_SHIM_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dgshim.h"
#include "dgverbs.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* An object left behind on purpose (a forked child abandons the parent's verbs objects: destroying
 * them could reach shared device state); tells LeakSanitizer it is not a leak. */
#define shim_abandon(p) __lsan_ignore_object(p)
/* Memory outside malloc that holds the only pointers to live objects (LeakSanitizer scans it). */
#define shim_lsan_root(p, n) __lsan_register_root_region(p, n)
#else
#define shim_abandon(p) ((void)(p))
#define shim_lsan_root(p, n) ((void)(p), (void)(n))
#endif

/* ------------------------------------------------------------------ the libc we stand on */

struct real_fns {
	int (*socket)(int, int, int);
	int (*bind)(int, const struct sockaddr *, socklen_t);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept)(int, struct sockaddr *, socklen_t *);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	ssize_t (*sendfile64)(int, int, off_t *, size_t);
	int (*close)(int);
	int (*eventfd)(unsigned, int);
	int (*close_range)(unsigned, unsigned, int);
	void (*closefrom)(int);
	int (*shutdown)(int, int);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*ioctl)(int, unsigned long, ...);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	int (*getsockopt)(int, int, int, void *, socklen_t *);
	int (*getpeername)(int, struct sockaddr *, socklen_t *);
	ssize_t (*send)(int, const void *, size_t, int);
	ssize_t (*sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	ssize_t (*sendmsg)(int, const struct msghdr *, int);
	int (*sendmmsg)(int, struct mmsghdr *, unsigned, int);
	ssize_t (*recv)(int, void *, size_t, int);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	int (*recvmmsg)(int, struct mmsghdr *, unsigned, int, struct timespec *);
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*readv)(int, const struct iovec *, int);
	ssize_t (*writev)(int, const struct iovec *, int);
	int (*poll)(struct pollfd *, nfds_t, int);
	int (*ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
	int (*select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
	int (*pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
	int (*epoll_create)(int);
	int (*epoll_create1)(int);
	int (*epoll_ctl)(int, int, int, struct epoll_event *);
	int (*epoll_wait)(int, struct epoll_event *, int, int);
	int (*epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
	pid_t (*fork)(void);
	long (*syscall)(long, ...);
	ssize_t (*splice)(int, loff_t *, int, loff_t *, size_t, unsigned);
};

extern struct real_fns real;
/* Fills `real` (idempotent, cheap: dlsym only). */
void shim_real_init(void);

/* Nonzero while this thread runs shim or provider code: the provider's own socket calls and
 * libev's then reach libc directly. The provider's progress thread keeps it set for good. */
extern __thread int shim_depth __attribute__((tls_model("initial-exec")));
/* The program's cancel state on entry to a data call (see DENTER in interpose.c). */
extern __thread int shim_cancel_prev __attribute__((tls_model("initial-exec")));

/* Around a blocking system call made for the program with no lock held: a blocking socket call
 * is a cancellation point, so cancellation is let through there when the program's thread
 * allows it, with the depth at 0 (a cancelled thread's handlers call libc as the program).
 * shim_cancel_open returns what shim_cancel_close needs; close keeps errno. */
static inline int shim_cancel_open(void)
{
	if (shim_cancel_prev != PTHREAD_CANCEL_ENABLE)
		return -1;
	int depth = shim_depth;
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	shim_depth = 0;
	return depth;
}
static inline void shim_cancel_close(int depth)
{
	if (depth < 0)
		return;
	int e = errno;
	shim_depth = depth;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	errno = e;
}

/* sec seconds plus extra_ms milliseconds as a poll timeout in milliseconds, at most INT32_MAX
 * for any sec (a program's "forever" may be LLONG_MAX seconds), 0 for a negative sec. */
static inline int shim_timeout_ms(long long sec, long long extra_ms)
{
	if (sec < 0)
		return 0;
	if (sec > INT32_MAX / 1000)
		return INT32_MAX;
	long long ms = sec * 1000 + extra_ms;
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* The process the shim's state belongs to (set at start and in fork's child handler). */
extern pid_t shim_pid;
/*
 * A child that shares the parent's memory without fork's handlers: vfork, posix_spawn and
 * clone(CLONE_VM) (Python's subprocess, glibc's posix_spawn) run our interposed close and
 * close_range between the clone and the exec. Its descriptor table is its own, its memory is
 * the parent's: the shim must not touch its state there, or the parent's sockets are
 * forgotten. One getpid, paid only where the shim would act.
 */
static inline bool shim_foreign_child(void)
{
	return unlikely(getpid() != shim_pid);
}

/* ------------------------------------------------------------------ descriptor table */

enum ent_kind { ENT_SOCK = 1, ENT_EPOLL = 2 };

struct sock_ops;

struct ent {
	enum ent_kind kind;
	const struct sock_ops *ops; /* ENT_SOCK: what its kind does (set once, at creation) */
	/* ENT_SOCK: a stream that went plain while a call held the shim's locks (stream.c
	 * plain_after_rv); read without a lock by the next call that holds none, which forgets
	 * the descriptor (stream_let_go) */
	atomic_bool plain_due;
};

struct sock;
struct ep;

/* The object behind fd, or NULL (lock-free read). */
struct ent *fd_get(int fd);
static inline struct sock *fd_sock(int fd)
{
	struct ent *e = fd_get(fd);
	return e && e->kind == ENT_SOCK ? (struct sock *)e : NULL;
}
/* A program call's reference to s (interpose.c taken()): false when the socket is already
 * going (its last descriptor closed), and then no reference was taken. Lock-free. */
bool sock_hold(struct sock *s);
/* Drops a sock_hold reference; the last one returns the object to sock.c's list (objects
 * are type-stable: a lookup racing with the close never touches freed memory). */
void sock_unhold(struct sock *s);
static inline struct ep *fd_ep(int fd)
{
	struct ent *e = fd_get(fd);
	return e && e->kind == ENT_EPOLL ? (struct ep *)e : NULL;
}
/* Installs e at fd (NULL clears). Returns the previous object. */
struct ent *fd_set_ent(int fd, struct ent *e);
/* The highest descriptor that ever had an entry (-1: none): the bound for walks over the table. */
int fd_max(void);
/* (stream.c) The shim forgets fd (its epoll registrations become the kernel's again): the OS
 * carries the connection from now on. Needs no lock held (takes the epoll instances'). */
void stream_let_go(int fd);

/*
 * The shim's and the provider's own descriptors (event and epoll descriptors, the registry's
 * presence, a carried stream's TCP socket, the provider's sockets): marked when made, cleared
 * when the shim closes them. A program's close, close_range, closefrom or dup2 never takes a
 * marked number from under the shim (interpose.c): a daemon that closes every descriptor goes
 * on working (docs/shim.md "The shim's own descriptors").
 */
void own_mark(int fd);
void own_clear(int fd);
bool own_has(int fd);
/* How many are marked now; the highest number ever marked (-1: none). */
int own_count(void);
int own_max(void);
/* (sock.c) */
/* A private duplicate of fd at a high descriptor number (close-on-exec), marked the shim's own
 * (own_mark), or -1. */
int high_fd(int fd);
/* fd moved to a high descriptor number (the original closed), marked own; fd itself (marked)
 * when none is free. */
int fd_to_high(int fd);
/* Closes one of the shim's own descriptors (clears its mark first). Returns close's result. */
int own_close(int fd);
/* Whether the shim may make `need` more descriptors of its own for `what` (a log line's
 * subject; NULL: say nothing): it keeps to a quarter of RLIMIT_NOFILE, the rest is the
 * program's. Says why once per process when not. */
bool own_room(int need, const char *what);

/* ------------------------------------------------------------------ taken sockets (sock.c) */

/* Starts the shim once: rules, logging, counters; the verbs context comes with the first QP. */
void shim_init(void);

/* socket() that was created by libc: decides whether to take it. */
void sock_created(int fd, int domain, int type, int protocol);
/* fd2 now refers to the same socket as fd (dup*). */
void sock_duped(int fd, int fd2);
/* A descriptor arrived by SCM_RIGHTS: take it if it is a UDP socket. */
void sock_adopt_fd(int fd);
/* fd is being closed. Returns 0 (the caller closes the kernel fd). */
void sock_closing(int fd);
/* Another of the program's descriptors naming s than fd, or -1. Scans the descriptor table:
 * for a close while the socket has more references (the rare dup-then-close). */
int sock_other_fd(struct sock *s, int fd);
/* The calling thread's SHIM_SLOT-byte buffer for a receive that waits in the kernel's own call
 * (data.c rx_direct, stream.c rx_wait), or NULL when it cannot be had (wait the other way). */
uint8_t *shim_rxbuf(void);

/*
 * What a kind of taken socket does with each call a program makes on it: one table per kind,
 * datagrams (data.c dgram_ops: UDP over UD/RD, on soft or on a device alike, since what differs
 * there is the provider's capabilities) and streams (stream.c stream_ops: TCP over RC).
 * interpose.c dispatches through s->ops (sock_ops()); the descriptor table (fdtab.c) holds the
 * sockets. Each returns what its libc call returns, as a count or 0, or -errno. A NULL entry:
 * the kernel's call answers for this kind.
 */
struct sock_ops {
	const char *kind;     /* "udp" or "tcp", for logs */
	bool stream;          /* readiness is the shim's alone (sock_is_stream) */
	/* after the kernel bound fd to a */
	int (*bound)(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
	int (*connect)(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
	int (*listen)(struct sock *s, int fd, int backlog);
	int (*accept)(struct sock *s, int fd, struct sockaddr *a, socklen_t *l, int flags);
	int (*shutdown)(struct sock *s, int fd, int how);
	/* -ENOSYS: the kernel's answer stands */
	int (*getpeername)(struct sock *s, struct sockaddr *a, socklen_t *l);
	/* the kind's own options (IWARP_MODE, TCP_NODELAY, ...): -ENOSYS when it has none by
	 * that name, and the common handling (sock.c) goes on */
	int (*setopt)(struct sock *s, int fd, int level, int name, const void *v, socklen_t l);
	int (*getopt)(struct sock *s, int fd, int level, int name, void *v, socklen_t *l);
	/* dest NULL: the connected peer. Returns bytes or -errno. */
	ssize_t (*send)(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			const struct sockaddr *dest, socklen_t destlen);
	/* bytes (or the datagram length with MSG_TRUNC) or -errno; *mflags gets MSG_TRUNC */
	ssize_t (*recv)(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			struct sockaddr *src, socklen_t *srclen, int *mflags);
	/* FIONREAD; -ENOSYS: the kernel's */
	int (*fionread)(struct sock *s, int fd, int *out);
	/* Readiness for events.c. poll_in drives progress: POLLIN when something is ready to
	 * read, 0 if not, -1 if the OS carries the socket (its own readiness is the truth);
	 * never blocks. poll_in_queued: the same without reading the kernel socket (what is
	 * already queued or completed), for a wait that has the kernel socket in its set
	 * anyway and drives progress only once the kernel reports something there. */
	int (*poll_in)(struct sock *s, int fd);
	int (*poll_in_queued)(struct sock *s, int fd);
	/* poll_in after the wait saw the kernel socket readable (the program's descriptor fired):
	 * a kind whose data waits there may say so without looking again; NULL: poll_in */
	int (*poll_in_fired)(struct sock *s, int fd);
	/* POLLOUT the shim decides (> 0 ready, 0 wait on the CQ fd), -1: the kernel's; NULL:
	 * always the kernel's */
	int (*poll_out)(struct sock *s, int fd);
	int (*poll_out_queued)(struct sock *s, int fd);
	/* the descriptors to wait on: the kernel socket (or -1) with the poll events to ask of it
	 * (*qev), and the CQ's (or -1: a CQ whose completions the socket's own readiness
	 * announces, dgv_cq_self_driven). Returns 0, or -1 when there is nothing to wait on. */
	int (*wait_fds)(struct sock *s, int *qfd, short *qev, int *cqfd);
	/* after the CQ's descriptor polled readable */
	void (*cq_ack)(struct sock *s);
	/* 1 when bytes the kernel wrote on its own (sendfile) would land inside the shim's
	 * framing, so the shim must send them itself; NULL: never */
	int (*carried)(struct sock *s);
	/* the socket object goes (sock_put, s->lock held): the kind's own resources */
	void (*release)(struct sock *s);
};

static inline const struct sock_ops *sock_ops(const struct sock *s) { return ((const struct ent *)s)->ops; }

/* bind: the kernel's, then the kind's. Returns 0 or -errno. */
int sock_bind(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
int sock_setsockopt(struct sock *s, int fd, int level, int name, const void *v, socklen_t l);
int sock_getsockopt(struct sock *s, int fd, int level, int name, void *v, socklen_t *l);
/* SOL_IWARP on a socket that is not taken. */
int shim_iwarp_opt_untaken(int fd, int set, int name, void *v, socklen_t *l);
int sock_fcntl_setfl(struct sock *s, int fd, int flags);
int sock_getfl(struct sock *s, int fd);
int sock_fionbio(struct sock *s, int on);

static inline ssize_t sock_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
				const struct sockaddr *dest, socklen_t destlen)
{
	return sock_ops(s)->send(s, fd, iov, iovcnt, flags, dest, destlen);
}
static inline ssize_t sock_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
				struct sockaddr *src, socklen_t *srclen, int *mflags)
{
	return sock_ops(s)->recv(s, fd, iov, iovcnt, flags, src, srclen, mflags);
}
static inline int sock_poll_in(struct sock *s, int fd) { return sock_ops(s)->poll_in(s, fd); }
static inline int sock_poll_in_queued(struct sock *s, int fd) { return sock_ops(s)->poll_in_queued(s, fd); }
static inline int sock_poll_in_fired(struct sock *s, int fd)
{
	return sock_ops(s)->poll_in_fired ? sock_ops(s)->poll_in_fired(s, fd) : sock_ops(s)->poll_in(s, fd);
}
static inline int sock_poll_out(struct sock *s, int fd)
{
	return sock_ops(s)->poll_out ? sock_ops(s)->poll_out(s, fd) : -1;
}
static inline int sock_poll_out_queued(struct sock *s, int fd)
{
	return sock_ops(s)->poll_out_queued ? sock_ops(s)->poll_out_queued(s, fd) : -1;
}
static inline int sock_wait_fds(struct sock *s, int *qfd, short *qev, int *cqfd)
{
	return sock_ops(s)->wait_fds(s, qfd, qev, cqfd);
}
static inline void sock_cq_ack(struct sock *s) { sock_ops(s)->cq_ack(s); }
/* True when fd is a socket whose POLLIN/POLLOUT the shim decides entirely (a carried stream:
 * the kernel socket's own readiness says nothing the program should see). */
static inline bool sock_is_stream(struct sock *s) { return sock_ops(s)->stream; }
/* Its provider completes within microseconds (DGV_CAP_BUSY_POLL): a UDP socket's QP, or an
 * established stream's. A waiter looks a while (shim_spin_us) before sleeping. */
bool sock_busy_poll(struct sock *s);
/* How long a wait on a device socket looks at its CQ before sleeping (DGSHIM_SPIN_US,
 * default 20 us; 0: never). */
int shim_spin_us(void);
/* Registers (on 1) / unregisters (0) an epoll instance as watching s (for cleanup on close),
 * or (on 2) names idx its registration there (for ep_kick). Returns 0 when s is watched by as
 * many instances as it can remember (SHIM_MAX_EPS), 2 when ep watched it already (another
 * registration: a duplicate descriptor), else 1. */
int sock_ep_link(struct sock *s, struct ep *ep, int on, uint32_t idx);
/* The epoll instances watching s, into eps (SHIM_MAX_EPS of room); returns how many. */
int sock_eps(struct sock *s, struct ep **eps);
/* A number that names s alone for the life of the process (a socket made again at the same
 * address is another one). */
uint64_t sock_id(const struct sock *s);

/*
 * Waking a waiter whose news another call took (events.c). A carried stream whose completions
 * only our calls make (stream.c stream_self) is waited on through its TCP socket alone; when a
 * call other than the wait itself reads that socket and finds something a waiter wants (data,
 * credit, the end), the kernel will not report those bytes again. Such a call tells:
 *  - the threads asleep in a poll, select or blocking call on the stream, each through its
 *    bell (an eventfd taken from a process-wide pool for the length of one wait, registered
 *    on the streams it waits on before its last look, stream.c bell_add / stream_unwait; also
 *    on a stream whose CQ has an eventfd: another thread may take the completion off the CQ
 *    before the wait armed it);
 *  - the epoll instances watching it (ep_ring: the instance's bell, a descriptor of its own
 *    registered edge-triggered in the instance, written only while a thread sleeps
 *    there), whose next rescan looks at the stream again (stream_kicks changed).
 * A single-threaded program never rings: nobody sleeps while it calls.
 */
struct bell;
/* A bell for one wait, or NULL (no descriptor could be made: the wait naps in slices). */
struct bell *bell_take(void);
void bell_put(struct bell *b);
/* Takes a ring off b (NULL: nothing), for its next round of the same wait. */
void bell_clear(struct bell *b);
/* A wait whose bell a stream could not hold sleeps this long at most per round. */
#define BELL_SLICE_MS 20
int bell_fd(const struct bell *b);
/* Makes b's descriptor readable (once until it is taken again). Needs the lock under which b
 * was registered, so that it is not rung after its wait put it back. */
void bell_ring(struct bell *b);
/* Wakes the threads asleep in epoll_wait on ep (none: nothing). */
void ep_ring(struct ep *ep);
/* News of registration idx of ep that the kernel will not report: its next wait looks at it
 * (the registrations a wait looks at without a kernel event are a list, not all of them),
 * and ep_ring. */
void ep_kick(struct ep *ep, uint32_t idx);
/* The bell of the poll or select this thread is gathering (check_begin registers it on the
 * streams it looks at), and the epoll instance whose wait is looking at sockets now (news a
 * check of it finds is its own to report): NULL outside those. */
extern __thread struct bell *shim_wait_bell __attribute__((tls_model("initial-exec")));
extern __thread struct ep *shim_ep_check __attribute__((tls_model("initial-exec")));
/* Set by a check that could not register shim_wait_bell (the stream has as many as it holds):
 * that poll then sleeps in slices. */
extern __thread bool shim_wait_sliced __attribute__((tls_model("initial-exec")));

/* Fork: the child starts over with fresh queue pairs on the same kernel sockets; in both
 * processes every UDP socket is shared from then on (sock.h `shared`). */
void shim_atfork_child(void);
void shim_atfork_parent(void);
/* Called at process exit: summary line. */
void shim_fini(void);

/* ------------------------------------------------------------------ events.c */

int ev_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask);
int ev_select(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts,
	      const sigset_t *mask);
void ev_epoll_created(int epfd);
int ev_epoll_ctl(struct ep *ep, int epfd, int op, int fd, struct epoll_event *ev);
/* ts2: epoll_pwait2's timeout (timeout_ms its value rounded up), else NULL. */
int ev_epoll_wait(struct ep *ep, int epfd, struct epoll_event *evs, int max, int timeout_ms,
		  const sigset_t *mask, const struct timespec *ts2);
void ev_epoll_closing(int epfd);
/* s is going away: drop it from every epoll watching it. */
void ev_sock_gone(struct sock *s, struct ep **eps, int n);
/* Descriptor fd of s is being closed (keep false: its registrations go) or left to the OS
 * (keep true: they move to the program's own instances, as the program made them). Call
 * without s->lock. */
void ev_fd_gone(struct sock *s, int fd, bool keep);

#endif
