/*
 * uring.c - io_uring through liburing: the kernel moves the bytes of a submitted request
 * itself, past every libc call the shim reads. On a carried stream that would put raw bytes
 * inside the iWARP stream (or hand the stream's own bytes to the program), and a receive on a
 * UDP socket the shim took could hand the program a framed datagram. The shim cannot carry such
 * a request, so it refuses the submission loudly (-EOPNOTSUPP and one error line naming the
 * descriptor) instead of letting a stream be corrupted in silence (docs/shim.md).
 *
 * liburing's entry points are interposed (a program linked with liburing.so.2 calls them by
 * name; liburing itself enters the kernel with inline system calls, which nothing sees). The
 * requests not yet submitted are read from liburing's ring structure, whose layout is
 * liburing 2.x's ABI (its inline functions in liburing.h compile it into every program).
 * Requests on registered files (IOSQE_FIXED_FILE) name an index, not a descriptor: the files
 * are checked when io_uring_register_files hands them over.
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>

#include "log.h"
#include "shim.h"

/* liburing 2.x struct io_uring_sq: what the shim reads of it (liburing.h) */
struct lu_sq {
	unsigned *khead, *ktail, *kring_mask, *kring_entries, *kflags, *kdropped, *array;
	struct io_uring_sqe *sqes;
	unsigned sqe_head, sqe_tail;
};

static struct {
	int (*submit)(void *);
	int (*submit_and_wait)(void *, unsigned);
	int (*submit_and_wait_timeout)(void *, void **, unsigned, void *, void *);
	int (*submit_and_get_events)(void *);
	int (*register_files)(void *, const int *, unsigned);
	int (*queue_init)(unsigned, void *, unsigned);
	int (*queue_init_params)(unsigned, void *, void *);
} lu;
static pthread_once_t lu_once = PTHREAD_ONCE_INIT;

#define LU(name) lu.name = (__typeof__(lu.name))dlsym(RTLD_NEXT, "io_uring_" #name)

static void lu_load(void)
{
	LU(submit), LU(submit_and_wait), LU(submit_and_wait_timeout), LU(submit_and_get_events);
	LU(register_files), LU(queue_init), LU(queue_init_params);
}

/* Whether a request of opcode op on descriptor fd would move bytes past the shim. */
static bool bypasses(int fd, unsigned op)
{
	struct sock *s = fd_sock(fd);
	if (!s)
		return false;
	bool rx = false, tx = false;
	switch (op) {
	case IORING_OP_READV:
	case IORING_OP_READ_FIXED:
	case IORING_OP_RECVMSG:
	case IORING_OP_READ:
	case IORING_OP_RECV:
		rx = true;
		break;
	case IORING_OP_WRITEV:
	case IORING_OP_WRITE_FIXED:
	case IORING_OP_SENDMSG:
	case IORING_OP_WRITE:
	case IORING_OP_SEND:
	case IORING_OP_SPLICE:
	case IORING_OP_TEE:
		tx = true;
		break;
	default:
		/* later opcodes on a socket (send_zc, sendmsg_zc, uring_cmd) carry data too: one the
		 * shim does not know is taken as unsafe */
		tx = op > IORING_OP_SHUTDOWN;
		break;
	}
	if (!rx && !tx)
		return false; /* accept, connect, close, poll, timeouts: no payload */
	const struct sock_ops *o = sock_ops(s);
	if (o->stream)
		return o->carried && o->carried(s);
	return rx; /* a datagram socket: a plain send is harmless, a receive may be framed */
}

/* 0, or -EOPNOTSUPP after one error line when a request not yet submitted on ring would move
 * bytes past the shim. */
static int check_ring(void *ring)
{
	const struct lu_sq *sq = ring;
	if (!ring || !sq->sqes || !sq->kring_mask)
		return 0;
	unsigned mask = *sq->kring_mask;
	for (unsigned i = sq->sqe_head; i != sq->sqe_tail; i++) {
		const struct io_uring_sqe *e = &sq->sqes[i & mask];
		if (e->flags & IOSQE_FIXED_FILE)
			continue; /* checked at io_uring_register_files */
		if (bypasses(e->fd, e->opcode) ||
		    (e->opcode == IORING_OP_SPLICE && bypasses(e->splice_fd_in, IORING_OP_RECV))) {
			dg_log_always("io_uring: request %u on fd %d, a socket the shim carries: refused "
				      "(EOPNOTSUPP); io_uring moves bytes past the shim. Run this program with "
				      "its sockets plain (DGSHIM_RULES='mode=off program=NAME', docs/rules.md)",
				      e->opcode, e->fd);
			return -EOPNOTSUPP;
		}
	}
	return 0;
}

#define SUBMIT(call)                                      \
	do {                                              \
		pthread_once(&lu_once, lu_load);          \
		if (!shim_depth) {                        \
			int e_ = check_ring(ring);        \
			if (e_)                           \
				return e_;                \
		}                                         \
		return lu.call;                           \
	} while (0)

SHIM_EXPORT int io_uring_submit(void *ring)
{
	SUBMIT(submit ? lu.submit(ring) : -ENOSYS);
}

SHIM_EXPORT int io_uring_submit_and_wait(void *ring, unsigned n)
{
	SUBMIT(submit_and_wait ? lu.submit_and_wait(ring, n) : -ENOSYS);
}

SHIM_EXPORT int io_uring_submit_and_wait_timeout(void *ring, void **cqe, unsigned n, void *ts, void *sig)
{
	SUBMIT(submit_and_wait_timeout ? lu.submit_and_wait_timeout(ring, cqe, n, ts, sig) : -ENOSYS);
}

SHIM_EXPORT int io_uring_submit_and_get_events(void *ring)
{
	SUBMIT(submit_and_get_events ? lu.submit_and_get_events(ring) : -ENOSYS);
}

SHIM_EXPORT int io_uring_register_files(void *ring, const int *files, unsigned n)
{
	pthread_once(&lu_once, lu_load);
	for (unsigned i = 0; files && i < n && !shim_depth; i++) {
		struct sock *s = fd_sock(files[i]);
		if (s && (!sock_ops(s)->stream || (sock_ops(s)->carried && sock_ops(s)->carried(s)))) {
			dg_log_always("io_uring: fd %d, a socket the shim takes, cannot be a registered file: "
				      "refused (EOPNOTSUPP)", files[i]);
			return -EOPNOTSUPP;
		}
	}
	return lu.register_files ? lu.register_files(ring, files, n) : -ENOSYS;
}

/* A ring is made: say once that sockets given to it are checked (DGSHIM_LOG=info). */
static void said_ring(void)
{
	static atomic_bool said;
	if (!atomic_exchange(&said, true))
		DG_INFO("io_uring in use: requests on sockets the shim carries are refused at submission");
}

SHIM_EXPORT int io_uring_queue_init(unsigned entries, void *ring, unsigned flags)
{
	pthread_once(&lu_once, lu_load);
	said_ring();
	return lu.queue_init ? lu.queue_init(entries, ring, flags) : -ENOSYS;
}

SHIM_EXPORT int io_uring_queue_init_params(unsigned entries, void *ring, void *p)
{
	pthread_once(&lu_once, lu_load);
	said_ring();
	return lu.queue_init_params ? lu.queue_init_params(entries, ring, p) : -ENOSYS;
}
