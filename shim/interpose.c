/*
 * interpose.c - the libc names libdgshim.so exports (exports.map lists exactly these).
 *
 * Every wrapper is a dispatch: a descriptor the shim did not take, or a call made from inside
 * the shim or the provider (shim_depth), goes straight to libc (`real`, real.c); a taken
 * socket goes through its kind's table (s->ops: data.c datagrams, stream.c streams) found in
 * the descriptor table (fdtab.c), and epoll/poll/select to events.c. Their -errno results
 * are turned into -1/errno here and only here. Nothing in shim/ calls back into this file.
 */
/* Both fcntl and fcntl64 are exported: with 64-bit offsets the headers would rename one to
 * the other. */
#undef _FILE_OFFSET_BITS
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"

/* ------------------------------------------------------------------ helpers */

static inline long ret(long r)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

#define ENTER() (shim_depth++)
#define LEAVE() (shim_depth--)
__thread int shim_cancel_prev __attribute__((tls_model("initial-exec")));
/* The data path holds socket and queue-pair locks around calls that are cancellation points
 * (the provider's sendto): cancellation is held off there and let through only where the
 * shim waits with no lock held (wait_sock), as the kernel's own blocking calls would. */
#define DENTER() (pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &shim_cancel_prev), shim_depth++)
#define DLEAVE() (shim_depth--, pthread_setcancelstate(shim_cancel_prev, NULL))

/* sock for fd when the call should be handled by the shim, else NULL. A socket returned is
 * held for the call (sock_hold): declare the variable HELD, which drops the reference on every
 * way out of its scope (thread cancellation included: the shim is built with -fexceptions), so
 * another thread's close of the last descriptor tears the socket down but leaves its memory to
 * this call, which then fails with EBADF (before, it woke in freed memory). */
static inline struct sock *taken(int fd)
{
	if (shim_depth)
		return NULL;
	struct ent *e = fd_get(fd);
	if (!e || e->kind != ENT_SOCK)
		return NULL;
	if (unlikely(atomic_load_explicit(&e->plain_due, memory_order_acquire))) {
		stream_let_go(fd); /* the kernel carries it from now on */
		return NULL;
	}
	struct sock *s = (struct sock *)e;
	if (unlikely(!sock_hold(s)))
		return NULL; /* going: the kernel answers (EBADF) */
	if (unlikely(fd_get(fd) != e)) {
		/* closed between the lookup and the hold, its object reused for another socket
		 * (type-stable: sock.c's list): not this descriptor's */
		sock_unhold(s);
		return NULL;
	}
	return s;
}

static inline void held_drop(struct sock **sp)
{
	if (*sp)
		sock_unhold(*sp);
}
#define HELD __attribute__((cleanup(held_drop)))

/* ------------------------------------------------------------------ lifecycle */

/* A descriptor the shim or the provider just made (shim_depth): moved away from the program's
 * numbers and marked its own, so that a program closing every descriptor leaves it alone. */
static int own_new(int fd)
{
	return fd >= 0 ? fd_to_high(fd) : fd;
}

/* Says (once at info, then at debug) that a program's call aimed at one of the shim's own
 * descriptors left it alone. */
static void own_kept(const char *call, int fd)
{
	static atomic_bool said;
	if (!atomic_exchange(&said, true))
		DG_INFO("%s: descriptor %d is the shim's own and stays open; a program that closes every "
			"descriptor goes on working", call, fd);
	else
		DG_DBG("%s: descriptor %d is the shim's own and stays open", call, fd);
}

/* A program's close or dup2 aimed at one of the shim's own descriptors: natively no such
 * descriptor is the program's, so the answer is the kernel's for a number not open (EBADF),
 * or EBUSY for dup2 (the kernel's answer while the number is being set up). */
static int own_refused(const char *call, int fd, int err)
{
	own_kept(call, fd);
	return (int)ret(-err);
}

SHIM_EXPORT int socket(int domain, int type, int protocol)
{
	shim_real_init();
	int fd = real.socket(domain, type, protocol);
	if (shim_depth)
		return own_new(fd);
	if (fd >= 0 && (domain == AF_INET || domain == AF_INET6)) {
		ENTER();
		sock_created(fd, domain, type, protocol);
		LEAVE();
	}
	return fd;
}

/* libev's and the provider's event descriptors (the program's own eventfds pass straight). */
SHIM_EXPORT int eventfd(unsigned int initval, int flags)
{
	shim_real_init();
	int fd = real.eventfd(initval, flags);
	return shim_depth ? own_new(fd) : fd;
}

/* fd is about to be closed or to name something else: the shim lets go of what it knew of it.
 * Call between ENTER and LEAVE. */
static void fd_forget(int fd)
{
	struct ent *e = fd_get(fd);
	if (!e)
		return;
	if (e->kind == ENT_SOCK)
		sock_closing(fd);
	else
		ev_epoll_closing(fd);
}

SHIM_EXPORT int close(int fd)
{
	shim_real_init();
	if (shim_depth) {
		own_clear(fd); /* the provider's or libev's own, closed by them */
		return real.close(fd);
	}
	bool own = unlikely(own_has(fd)), known = !own && fd_get(fd);
	if ((own || known) && shim_foreign_child())
		return real.close(fd);
	if (own)
		return own_refused("close", fd, EBADF);
	if (known) {
		ENTER();
		fd_forget(fd);
		LEAVE();
	}
	return real.close(fd);
}

/* Every entry in first..last (capped at the highest ever used) let go of, before a range close:
 * left behind, a stale entry would make the next file or socket given that number look taken. */
static void fd_forget_range(unsigned first, unsigned last)
{
	int hi = fd_max();
	if (shim_depth || hi < 0 || first > (unsigned)hi)
		return;
	if (last > (unsigned)hi)
		last = (unsigned)hi;
	ENTER();
	for (unsigned fd = first; fd <= last; fd++)
		fd_forget((int)fd);
	LEAVE();
}

static int close_range_real(unsigned first, unsigned last, int flags)
{
	if (!real.close_range)
		return (int)real.syscall(SYS_close_range, first, last, flags);
	return real.close_range(first, last, flags);
}

/* close_range over first..last but for the shim's own descriptors: the kernel's call once per
 * run of the program's numbers between them. Returns 0 or -1/errno (the first failure). */
static int close_range_around_own(unsigned first, unsigned last, int flags)
{
	int hi = own_max();
	if (shim_depth || (flags & CLOSE_RANGE_CLOEXEC) || hi < 0 || first > (unsigned)hi)
		return close_range_real(first, last, flags); /* close-on-exec: ours have it already */
	unsigned from = first; /* where the current run of the program's numbers starts */
	int rc = 0;
	for (unsigned fd = first; fd <= (unsigned)hi && fd <= last; fd++) {
		if (!own_has((int)fd))
			continue;
		DG_DBG("close_range: descriptor %d is the shim's own and stays open", (int)fd);
		if (fd > from && close_range_real(from, fd - 1, flags) && !rc)
			rc = -1;
		from = fd + 1; /* fd <= INT_MAX: no wrap */
	}
	if (from <= last && close_range_real(from, last, flags) && !rc)
		rc = -1;
	return rc;
}

/* Whether a range from first up may touch what the shim knows: a foreign child's (vfork)
 * closes are its own business (shim_foreign_child). */
static bool range_ours(unsigned first)
{
	int hi = fd_max() > own_max() ? fd_max() : own_max();
	return hi >= 0 && first <= (unsigned)hi && !shim_depth && !shim_foreign_child();
}

SHIM_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	shim_real_init();
	if (first > last || !range_ours(first))
		return close_range_real(first, last, flags); /* the kernel's EINVAL */
	/* CLOSE_RANGE_CLOEXEC closes nothing now; exec starts the shim over anyway */
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		fd_forget_range(first, last);
	return close_range_around_own(first, last, flags);
}

static void closefrom_real(int lowfd)
{
	if (real.closefrom)
		real.closefrom(lowfd);
	else
		real.syscall(SYS_close_range, (unsigned)lowfd, ~0u, 0); /* a libc older than closefrom */
}

SHIM_EXPORT void closefrom(int lowfd)
{
	shim_real_init();
	if (lowfd < 0)
		lowfd = 0;
	if (!range_ours((unsigned)lowfd)) {
		closefrom_real(lowfd);
		return;
	}
	fd_forget_range((unsigned)lowfd, ~0u);
	if (own_max() >= lowfd)
		close_range_around_own((unsigned)lowfd, ~0u, 0);
	else
		closefrom_real(lowfd);
}

static int dup_common(int fd, int fd2)
{
	if (fd2 >= 0 && !shim_depth && fd2 != fd && (fd_get(fd2) || fd_get(fd)) && !shim_foreign_child()) {
		ENTER();
		fd_forget(fd2); /* a fresh number freed behind the shim's back may carry a stale entry */
		if (fd_sock(fd))
			sock_duped(fd, fd2);
		LEAVE();
	}
	return fd2;
}

SHIM_EXPORT int dup(int fd)
{
	shim_real_init();
	int r = real.dup(fd);
	return r >= 0 ? dup_common(fd, r) : r;
}

/* dup2/dup3 onto a taken descriptor close it first: let go of it before the kernel does
 * (unless fd is invalid, when nothing is replaced). */
static void dup_replacing(int fd, int fd2)
{
	if (!shim_depth && fd != fd2 && fd_get(fd2) && real.fcntl(fd, F_GETFD) >= 0 && !shim_foreign_child()) {
		ENTER();
		fd_forget(fd2);
		LEAVE();
	}
}

SHIM_EXPORT int dup2(int fd, int fd2)
{
	shim_real_init();
	if (unlikely(!shim_depth && fd != fd2 && own_has(fd2)) && !shim_foreign_child())
		return own_refused("dup2", fd2, EBUSY);
	dup_replacing(fd, fd2);
	int r = real.dup2(fd, fd2);
	return r >= 0 ? dup_common(fd, r) : r;
}

SHIM_EXPORT int dup3(int fd, int fd2, int flags)
{
	shim_real_init();
	if (unlikely(!shim_depth && fd != fd2 && own_has(fd2)) && !shim_foreign_child())
		return own_refused("dup3", fd2, EBUSY);
	dup_replacing(fd, fd2);
	int r = real.dup3(fd, fd2, flags);
	return r >= 0 ? dup_common(fd, r) : r;
}

static int fcntl_common(int fd, int cmd, void *arg)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (s) {
		int r;
		switch (cmd) {
		case F_GETFL:
			ENTER();
			r = sock_getfl(s, fd);
			LEAVE();
			return (int)ret(r);
		case F_SETFL:
			ENTER();
			r = sock_fcntl_setfl(s, fd, (int)(intptr_t)arg);
			LEAVE();
			return (int)ret(r);
		case F_DUPFD:
		case F_DUPFD_CLOEXEC:
			r = real.fcntl(fd, cmd, (int)(intptr_t)arg);
			return r >= 0 ? dup_common(fd, r) : r;
		default:
			break;
		}
	}
	return real.fcntl(fd, cmd, arg);
}

SHIM_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg);
}

SHIM_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(fd, cmd, arg);
}

SHIM_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (s && (req == FIONREAD || req == FIONBIO)) {
		if (!arg)
			return (int)ret(-EFAULT);
		ENTER();
		/* the provider never relies on the file's O_NONBLOCK (it passes MSG_DONTWAIT), so
		 * blocking is emulated entirely from the program's setting */
		int r = req == FIONREAD ? sock_ops(s)->fionread(s, fd, arg) : sock_fionbio(s, *(int *)arg);
		LEAVE();
		if (r == -ENOSYS || (r == 0 && req == FIONBIO))
			return real.ioctl(fd, req, arg); /* FIONBIO: the file's flag stays the program's */
		return (int)ret(r);
	}
	return real.ioctl(fd, req, arg);
}

/* A control call on fd: libc's when the shim did not take fd, else the shim's (0 or -errno, made
 * -1/errno here), with s naming the socket inside shim_call. */
#define CONTROL(fd, real_call, shim_call)                                                          \
	do {                                                                                       \
		shim_real_init();                                                                  \
		struct sock *s HELD = taken(fd);                                                        \
		if (!s)                                                                            \
			return real_call;                                                          \
		ENTER();                                                                           \
		int r_ = (shim_call);                                                              \
		LEAVE();                                                                           \
		return (int)ret(r_);                                                               \
	} while (0)

SHIM_EXPORT int bind(int fd, const struct sockaddr *a, socklen_t l)
{
	CONTROL(fd, real.bind(fd, a, l), sock_bind(s, fd, a, l));
}

SHIM_EXPORT int connect(int fd, const struct sockaddr *a, socklen_t l)
{
	CONTROL(fd, real.connect(fd, a, l), sock_ops(s)->connect(s, fd, a, l));
}

SHIM_EXPORT int listen(int fd, int backlog)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s || !sock_ops(s)->listen)
		return real.listen(fd, backlog);
	ENTER();
	int r = sock_ops(s)->listen(s, fd, backlog);
	LEAVE();
	return (int)ret(r);
}

/* accept blocks like the kernel's (no shim lock is held while it waits) and stays a
 * cancellation point; only the MPA exchange of a connection found to be ours runs inside. */
static int accept_common(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	shim_real_init();
	if (shim_depth) /* the provider's own listener */
		return own_new(real.accept4(fd, a, l, flags));
	struct sock *s HELD = taken(fd);
	if (!s || !sock_ops(s)->accept)
		return real.accept4(fd, a, l, flags);
	ENTER();
	int r = sock_ops(s)->accept(s, fd, a, l, flags);
	LEAVE();
	return (int)ret(r);
}

SHIM_EXPORT int accept(int fd, struct sockaddr *a, socklen_t *l)
{
	return accept_common(fd, a, l, 0);
}

SHIM_EXPORT int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	return accept_common(fd, a, l, flags);
}

SHIM_EXPORT int shutdown(int fd, int how)
{
	CONTROL(fd, real.shutdown(fd, how), sock_ops(s)->shutdown(s, fd, how));
}

/* A carried stream's TCP socket is the provider's: open after both ends finished, possibly
 * reset while the stream is only half-closed. The stream answers. */
SHIM_EXPORT int getpeername(int fd, struct sockaddr *a, socklen_t *l)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s || !sock_ops(s)->getpeername)
		return real.getpeername(fd, a, l);
	ENTER();
	int r = sock_ops(s)->getpeername(s, a, l);
	if (r == -ENOSYS)
		r = real.getpeername(fd, a, l) < 0 ? -errno : 0;
	LEAVE();
	return (int)ret(r);
}

/* set/getsockopt: SOL_IWARP options also answer on sockets the shim did not take (IWARP_MODE
 * can take one). *l is the value length for set, in/out for get. */
static int sockopt(int fd, bool set, int level, int name, void *v, socklen_t *l)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s && (level != SOL_IWARP || shim_depth))
		return set ? real.setsockopt(fd, level, name, v, *l) : real.getsockopt(fd, level, name, v, l);
	ENTER();
	int r = !s ? shim_iwarp_opt_untaken(fd, set, name, v, l)
	    : set  ? sock_setsockopt(s, fd, level, name, v, *l)
		   : sock_getsockopt(s, fd, level, name, v, l);
	LEAVE();
	return (int)ret(r);
}

SHIM_EXPORT int setsockopt(int fd, int level, int name, const void *v, socklen_t l)
{
	return sockopt(fd, true, level, name, (void *)v, &l);
}

SHIM_EXPORT int getsockopt(int fd, int level, int name, void *v, socklen_t *l)
{
	return sockopt(fd, false, level, name, v, l);
}

/* ------------------------------------------------------------------ data */

static ssize_t send_one(struct sock *s, int fd, const void *buf, size_t len, int flags,
			const struct sockaddr *to, socklen_t tolen)
{
	struct iovec v = {(void *)buf, len};
	DENTER();
	ssize_t r = sock_send(s, fd, &v, 1, flags, to, tolen);
	DLEAVE();
	return ret(r);
}

static ssize_t recv_one(struct sock *s, int fd, void *buf, size_t len, int flags,
			struct sockaddr *from, socklen_t *fromlen)
{
	struct iovec v = {buf, len};
	int mf = 0;
	if (flags & MSG_ERRQUEUE)
		return real.recvfrom(fd, buf, len, flags, from, fromlen); /* as recvmsg's */
	DENTER();
	ssize_t r = sock_recv(s, fd, &v, 1, flags, from, fromlen, &mf);
	DLEAVE();
	return ret(r);
}

SHIM_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? send_one(s, fd, buf, len, flags, NULL, 0) : real.send(fd, buf, len, flags);
}

SHIM_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
			   socklen_t tolen)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? send_one(s, fd, buf, len, flags, to, tolen) : real.sendto(fd, buf, len, flags, to, tolen);
}

SHIM_EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s)
		return real.sendmsg(fd, m, flags);
	if (!m)
		return ret(-EFAULT);
	if (m->msg_iovlen > IOV_MAX)
		return ret(-EMSGSIZE);
	DENTER();
	ssize_t r = sock_send(s, fd, m->msg_iov, (int)m->msg_iovlen, flags, m->msg_name, m->msg_namelen);
	DLEAVE();
	return ret(r);
}

SHIM_EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s)
		return real.sendmmsg(fd, v, n, flags);
	unsigned i;
	ssize_t r = 0;
	DENTER();
	for (i = 0; i < n && i < UIO_MAXIOV; i++) {
		r = sock_send(s, fd, v[i].msg_hdr.msg_iov, (int)v[i].msg_hdr.msg_iovlen,
			      flags | (i ? MSG_DONTWAIT : 0), v[i].msg_hdr.msg_name, v[i].msg_hdr.msg_namelen);
		if (r < 0)
			break;
		v[i].msg_len = (unsigned)r;
	}
	DLEAVE();
	return i ? (int)i : (int)ret(r);
}

SHIM_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? recv_one(s, fd, buf, len, flags, NULL, NULL) : real.recv(fd, buf, len, flags);
}

SHIM_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
			     socklen_t *fromlen)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? recv_one(s, fd, buf, len, flags, from, fromlen)
		 : real.recvfrom(fd, buf, len, flags, from, fromlen);
}

static ssize_t recvmsg_one(struct sock *s, int fd, struct msghdr *m, int flags)
{
	if (m->msg_iovlen > IOV_MAX)
		return -EMSGSIZE;
	int mf = 0;
	socklen_t nl = m->msg_name ? m->msg_namelen : 0;
	ssize_t r = sock_recv(s, fd, m->msg_iov, (int)m->msg_iovlen, flags,
			      m->msg_name, m->msg_name ? &nl : NULL, &mf);
	if (r >= 0) {
		m->msg_namelen = m->msg_name ? nl : 0;
		m->msg_flags = mf;
		m->msg_controllen = 0; /* no ancillary data is produced for taken sockets */
	}
	return r;
}

SHIM_EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s) {
		ssize_t r = real.recvmsg(fd, m, flags);
		if (r >= 0 && m && m->msg_controllen && !shim_depth) {
			/* sockets passed by SCM_RIGHTS are taken like inherited ones */
			int e = errno;
			ENTER();
			for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
				if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
					int *fds = (int *)CMSG_DATA(c);
					size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
					for (size_t i = 0; i < n; i++)
						sock_adopt_fd(fds[i]);
				}
			LEAVE();
			errno = e;
		}
		return r;
	}
	if (!m)
		return ret(-EFAULT);
	/* the kernel socket's error queue (IP_RECVERR, SO_TIMESTAMPING): never a datagram, never a
	 * wait; before, a blocking socket waited there for a datagram instead */
	if (flags & MSG_ERRQUEUE)
		return real.recvmsg(fd, m, flags);
	DENTER();
	ssize_t r = recvmsg_one(s, fd, m, flags);
	DLEAVE();
	return ret(r);
}

SHIM_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *tmo)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s)
		return real.recvmmsg(fd, v, n, flags, tmo);
	unsigned i;
	ssize_t r = 0;
	DENTER();
	for (i = 0; i < n && i < UIO_MAXIOV; i++) {
		int f = flags & ~MSG_WAITFORONE;
		if (i && (flags & MSG_WAITFORONE))
			f |= MSG_DONTWAIT;
		r = recvmsg_one(s, fd, &v[i].msg_hdr, f);
		if (r < 0)
			break;
		v[i].msg_len = (unsigned)r;
	}
	DLEAVE();
	if (i)
		return (int)i;
	return (int)ret(r);
}

SHIM_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? recv_one(s, fd, buf, len, 0, NULL, NULL) : real.read(fd, buf, len);
}

SHIM_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	return s ? send_one(s, fd, buf, len, 0, NULL, 0) : real.write(fd, buf, len);
}

/* sendfile into a carried stream: the kernel would put the file's bytes on the TCP connection
 * unframed, in the middle of the iWARP stream. Read them here and send them as the program's
 * data instead (one 64 KiB piece per round; a short count is what sendfile may return). */
static ssize_t sendfile_common(int out, int in, off_t *off, size_t count, bool is64)
{
	shim_real_init();
	struct sock *s HELD = taken(out);
	if (!s || !sock_ops(s)->carried || !sock_ops(s)->carried(s))
		return is64 ? real.sendfile64(out, in, off, count) : real.sendfile(out, in, off, count);
	uint8_t buf[65536];
	size_t want = count < sizeof buf ? count : sizeof buf;
	ssize_t n = off ? pread(in, buf, want, *off) : read(in, buf, want);
	if (n <= 0)
		return n;
	ssize_t w = send_one(s, out, buf, (size_t)n, 0, NULL, 0);
	if (w > 0) {
		if (off)
			*off += w;
		else if (w < n)
			lseek(in, w - n, SEEK_CUR); /* give back what was read but not sent */
	}
	return w;
}

SHIM_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	return sendfile_common(out, in, off, count, false);
}

SHIM_EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	return sendfile_common(out, in, off, count, true);
}

/* What the kernel's splice says of the other end: a pipe and no offset, else -errno. */
static int splice_other(int fd, const loff_t *off)
{
	struct stat st;
	if (fstat(fd, &st))
		return -errno;
	if (!S_ISFIFO(st.st_mode))
		return -EINVAL; /* a socket and a file: splice needs a pipe on one side */
	return off ? -ESPIPE : 0;
}

/* splice from a pipe into carried socket s: the bytes go as the program's data (one 64 KiB
 * piece per call). They are looked at with tee() first and taken from the pipe only as far as
 * they were sent, so none is lost to a short send. Returns bytes or -1/errno. */
static ssize_t splice_out(struct sock *s, int in, loff_t *off_in, int out, size_t len, unsigned flags)
{
	int e = splice_other(in, off_in);
	if (e)
		return ret(e);
	uint8_t buf[65536];
	size_t want = len < sizeof buf ? len : sizeof buf;
	/* a pipe of our own for this call only (a cached one could be closed under us by a
	 * program that closes every descriptor); blocking, so tee waits as splice would */
	int tp[2];
	if (pipe2(tp, O_CLOEXEC) < 0)
		return -1;
	ssize_t n = tee(in, tp[1], want, flags & SPLICE_F_NONBLOCK);
	if (n > 0 && real.read(tp[0], buf, (size_t)n) != n)
		n = -EIO;
	real.close(tp[0]);
	real.close(tp[1]);
	if (n <= 0)
		return n < 0 && n != -1 ? ret(n) : n;
	struct iovec v = {buf, (size_t)n};
	DENTER();
	ssize_t w = sock_send(s, out, &v, 1, (flags & SPLICE_F_NONBLOCK ? MSG_DONTWAIT : 0) | MSG_NOSIGNAL, NULL, 0);
	DLEAVE();
	if (w > 0 && real.read(in, buf, (size_t)w) != w) /* what tee showed is there to take */
		DG_WARN("splice: %zd bytes sent could not be taken from the pipe", w);
	return ret(w);
}

/* splice from carried socket s into a pipe: the program's data, not the TCP bytes that carry
 * it. Looked at with MSG_PEEK, and taken only as far as the pipe took it. Returns bytes or
 * -1/errno. */
static ssize_t splice_in(struct sock *s, int in, int out, loff_t *off_out, size_t len, unsigned flags)
{
	int e = splice_other(out, off_out);
	if (e)
		return ret(e);
	uint8_t buf[65536];
	size_t want = len < sizeof buf ? len : sizeof buf;
	ssize_t n = recv_one(s, in, buf, want, MSG_PEEK | (flags & SPLICE_F_NONBLOCK ? MSG_DONTWAIT : 0), NULL,
			     NULL);
	if (n <= 0)
		return n;
	ssize_t w = real.write(out, buf, (size_t)n);
	if (w > 0)
		recv_one(s, in, buf, (size_t)w, MSG_DONTWAIT, NULL, NULL); /* peeked: it is there */
	return w;
}

/* splice to or from a socket the shim carries: the kernel would move bytes past the shim,
 * unframed into an RC stream or framed out of one. The shim moves them itself; everything else
 * (pipes, files, sockets it does not carry) is the kernel's. */
SHIM_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned flags)
{
	shim_real_init();
	struct sock *so HELD = taken(out);
	struct sock *si HELD = taken(in);
	if (so && sock_ops(so)->carried && sock_ops(so)->carried(so))
		return splice_out(so, in, off_in, out, len, flags);
	if (si && sock_ops(si)->carried && sock_ops(si)->carried(si))
		return splice_in(si, in, out, off_out, len, flags);
	return real.splice(in, off_in, out, off_out, len, flags);
}

SHIM_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s)
		return real.readv(fd, iov, n);
	if (n < 0 || n > IOV_MAX)
		return ret(-EINVAL);
	int mf = 0;
	DENTER();
	ssize_t r = sock_recv(s, fd, iov, n, 0, NULL, NULL, &mf);
	DLEAVE();
	return ret(r);
}

SHIM_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	shim_real_init();
	struct sock *s HELD = taken(fd);
	if (!s)
		return real.writev(fd, iov, n);
	if (n < 0 || n > IOV_MAX)
		return ret(-EINVAL);
	DENTER();
	ssize_t r = sock_send(s, fd, iov, n, 0, NULL, 0);
	DLEAVE();
	return ret(r);
}

/* _FORTIFY_SOURCE builds call these instead (VLC, SIPp on Debian). */
SHIM_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		abort();
	return recv(fd, buf, len, flags);
}

SHIM_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
				   struct sockaddr *from, socklen_t *fromlen)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, from, fromlen);
}

SHIM_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return read(fd, buf, len);
}

/* ------------------------------------------------------------------ readiness */

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	shim_real_init();
	if (shim_depth)
		return real.poll(fds, n, timeout);
	return ev_poll(fds, n, timeout, NULL);
}

SHIM_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		abort();
	return poll(fds, n, timeout);
}

static int ts_ms(const struct timespec *ts)
{
	if (!ts)
		return -1;
	if (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000)
		return -2;
	return shim_timeout_ms(ts->tv_sec, (ts->tv_nsec + 999999) / 1000000);
}

SHIM_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	shim_real_init();
	if (shim_depth)
		return real.ppoll(fds, n, ts, mask);
	int ms = ts_ms(ts);
	if (ms == -2)
		return (int)ret(-EINVAL);
	return ev_poll(fds, n, ms, mask);
}

SHIM_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
			    const sigset_t *mask, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		abort();
	return ppoll(fds, n, ts, mask);
}

SHIM_EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv)
{
	shim_real_init();
	if (shim_depth)
		return real.select(nfds, r, w, x, tv);
	if (tv && (tv->tv_sec < 0 || tv->tv_usec < 0 || tv->tv_usec >= 1000000))
		return (int)ret(-EINVAL);
	struct timespec ts, *tsp = NULL;
	if (tv) {
		ts = (struct timespec){tv->tv_sec, tv->tv_usec * 1000};
		tsp = &ts;
	}
	int rc = ev_select(nfds, r, w, x, tsp, NULL);
	if (tv && rc >= 0 && rc == 0)
		tv->tv_sec = 0, tv->tv_usec = 0; /* Linux reports the time left; all of it was used */
	return rc;
}

SHIM_EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts,
			const sigset_t *mask)
{
	shim_real_init();
	if (shim_depth)
		return real.pselect(nfds, r, w, x, ts, mask);
	if (ts && ts_ms(ts) == -2)
		return (int)ret(-EINVAL);
	return ev_select(nfds, r, w, x, ts, mask);
}

SHIM_EXPORT int epoll_create(int size)
{
	shim_real_init();
	int fd = real.epoll_create(size);
	if (shim_depth)
		return own_new(fd); /* libev's, the provider's */
	if (fd >= 0)
		ev_epoll_created(fd);
	return fd;
}

SHIM_EXPORT int epoll_create1(int flags)
{
	shim_real_init();
	int fd = real.epoll_create1(flags);
	if (shim_depth)
		return own_new(fd); /* libev's, the provider's */
	if (fd >= 0)
		ev_epoll_created(fd);
	return fd;
}

SHIM_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	shim_real_init();
	struct ep *ep;
	if (shim_depth || !(ep = fd_ep(epfd)))
		return real.epoll_ctl(epfd, op, fd, ev);
	ENTER();
	int r = ev_epoll_ctl(ep, epfd, op, fd, ev);
	LEAVE();
	return (int)ret(r);
}

int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *ts,
		 const sigset_t *mask);

SHIM_EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	shim_real_init();
	struct ep *ep;
	if (shim_depth || !(ep = fd_ep(epfd)))
		return real.epoll_wait(epfd, evs, max, timeout);
	return ev_epoll_wait(ep, epfd, evs, max, timeout, NULL, NULL);
}

SHIM_EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask)
{
	shim_real_init();
	struct ep *ep;
	if (shim_depth || !(ep = fd_ep(epfd)))
		return real.epoll_pwait(epfd, evs, max, timeout, mask);
	return ev_epoll_wait(ep, epfd, evs, max, timeout, mask, NULL);
}

/* glibc 2.35's call with a timespec; the kernel's own when the shim has nothing in the set
 * (ev_epoll_wait), else the shim's wait with the timeout rounded up to milliseconds. */
SHIM_EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *ts,
			     const sigset_t *mask)
{
	shim_real_init();
	struct ep *ep;
	if (shim_depth || !(ep = fd_ep(epfd)))
		return (int)real.syscall(SYS_epoll_pwait2, epfd, evs, max, ts, mask, _NSIG / 8);
	int ms = ts_ms(ts);
	if (ms == -2)
		return (int)ret(-EINVAL);
	return ev_epoll_wait(ep, epfd, evs, max, ms, mask, ts);
}

/* ------------------------------------------------------------------ process */

__attribute__((constructor)) static void shim_ctor(void)
{
	shim_real_init();
	/* only the cheap part here: the heavy start is lazy (pthread_once in shim_init) */
	shim_depth++;
	shim_init();
	shim_depth--;
}

__attribute__((destructor)) static void shim_dtor(void)
{
	shim_depth++;
	shim_fini();
}

/* ------------------------------------------------------------------ syscall() */

static inline struct pollfd *p0_cast(long a) { return (struct pollfd *)a; }

/*
 * Programs that make socket calls through libc's syscall() (libuv's recvmmsg/sendmmsg, some
 * runtimes' accept4): those on descriptors take the same path as the named call, so a taken
 * socket is never read or written behind the shim, and a close through syscall() is seen.
 * Everything else, and calls from inside the shim, go to the kernel unchanged. What bypasses
 * libc altogether (Go's runtime, static binaries, inline `syscall` instructions) is not seen:
 * docs/shim.md "Limits".
 */
SHIM_EXPORT long syscall(long nr, ...)
{
	va_list ap;
	va_start(ap, nr);
	long a0 = va_arg(ap, long), a1 = va_arg(ap, long), a2 = va_arg(ap, long);
	long a3 = va_arg(ap, long), a4 = va_arg(ap, long), a5 = va_arg(ap, long);
	va_end(ap);
	shim_real_init();
	if (shim_depth)
		return real.syscall(nr, a0, a1, a2, a3, a4, a5);
	int fd = (int)a0;
	void *p1 = (void *)a1, *p4 = (void *)a4;
	switch (nr) {
	case SYS_socket:
		return socket(fd, (int)a1, (int)a2);
	case SYS_close:
		return close(fd);
	case SYS_close_range:
		return close_range((unsigned)a0, (unsigned)a1, (int)a2);
	case SYS_dup:
		return dup(fd);
	case SYS_dup2:
		return dup2(fd, (int)a1);
	case SYS_dup3:
		return dup3(fd, (int)a1, (int)a2);
	case SYS_fcntl:
		return fcntl_common(fd, (int)a1, (void *)a2);
	case SYS_bind:
		return bind(fd, p1, (socklen_t)a2);
	case SYS_connect:
		return connect(fd, p1, (socklen_t)a2);
	case SYS_listen:
		return listen(fd, (int)a1);
	case SYS_accept:
		return accept(fd, p1, (socklen_t *)a2);
	case SYS_accept4:
		return accept4(fd, p1, (socklen_t *)a2, (int)a3);
	case SYS_shutdown:
		return shutdown(fd, (int)a1);
	case SYS_setsockopt:
		return setsockopt(fd, (int)a1, (int)a2, (const void *)a3, (socklen_t)a4);
	case SYS_getsockopt:
		return getsockopt(fd, (int)a1, (int)a2, (void *)a3, (socklen_t *)a4);
	case SYS_getpeername:
		return getpeername(fd, p1, (socklen_t *)a2);
	case SYS_sendto:
		return sendto(fd, p1, (size_t)a2, (int)a3, p4, (socklen_t)a5);
	case SYS_recvfrom:
		return recvfrom(fd, p1, (size_t)a2, (int)a3, p4, (socklen_t *)a5);
	case SYS_sendmsg:
		return sendmsg(fd, p1, (int)a2);
	case SYS_recvmsg:
		return recvmsg(fd, p1, (int)a2);
	case SYS_sendmmsg:
		return sendmmsg(fd, p1, (unsigned)a2, (int)a3);
	case SYS_recvmmsg:
		return recvmmsg(fd, p1, (unsigned)a2, (int)a3, p4);
	case SYS_read:
		return read(fd, p1, (size_t)a2);
	case SYS_write:
		return write(fd, p1, (size_t)a2);
	case SYS_readv:
		return readv(fd, p1, (int)a2);
	case SYS_writev:
		return writev(fd, p1, (int)a2);
	case SYS_sendfile:
		return sendfile(fd, (int)a1, (off_t *)a2, (size_t)a3);
	case SYS_splice:
		return splice(fd, (loff_t *)a1, (int)a2, (loff_t *)a3, (size_t)a4, (unsigned)a5);
	case SYS_ioctl:
		return ioctl(fd, (unsigned long)a1, (void *)a2);
	case SYS_poll:
		return poll(p0_cast(a0), (nfds_t)a1, (int)a2);
	case SYS_ppoll:
		/* the kernel's sigsetsize argument (a4) is implied by glibc's sigset_t */
		return ppoll(p0_cast(a0), (nfds_t)a1, (const struct timespec *)a2, (const sigset_t *)a3);
	case SYS_epoll_create1:
		return epoll_create1(fd);
	case SYS_epoll_ctl:
		return epoll_ctl(fd, (int)a1, (int)a2, (struct epoll_event *)a3);
	case SYS_epoll_wait:
		return epoll_wait(fd, (struct epoll_event *)a1, (int)a2, (int)a3);
	case SYS_epoll_pwait:
		return epoll_pwait(fd, (struct epoll_event *)a1, (int)a2, (int)a3, (const sigset_t *)a4);
	case SYS_epoll_pwait2:
		return epoll_pwait2(fd, (struct epoll_event *)a1, (int)a2, (const struct timespec *)a3,
				    (const sigset_t *)a4);
	default:
		return real.syscall(nr, a0, a1, a2, a3, a4, a5);
	}
}
