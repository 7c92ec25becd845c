/*
 * stream.h - taken TCP sockets: a stream carried over an RC queue pair (iWARP over the program's
 * own TCP connection), or left to the OS when the peer does not speak it.
 *
 * The byte stream travels as RDMA Write-Records into the peer's receive ring (paper 000 IV.B.3:
 * Write-Record on a reliable transport): no posted receive is needed, and the record completion
 * tells the receiver which bytes arrived. The receiver returns credit (bytes consumed, records
 * polled) with small Write-Records into the sender's control slots. docs/shim.md ("Streams")
 * describes the protocol; struct stream_hello and struct stream_ctl are its wire formats.
 */
#ifndef DGSHIM_STREAM_H
#define DGSHIM_STREAM_H

#include <stdint.h>

#include "shim.h"
#include "wire.h"

struct sock;

/* The wire formats (struct stream_hello, stream_rv, stream_dhello, stream_ctl, STREAM_MAGIC,
 * STREAM_RV_MAGIC, STREAM_CTL_*) are in verbs_backend/wire.h with the rest of what goes on the
 * wire; CTL_* are the control flags under the names stream.c uses. */
enum { CTL_HELLO = STREAM_CTL_HELLO, CTL_FIN = STREAM_CTL_FIN, CTL_CLOSE = STREAM_CTL_CLOSE,
       CTL_ABORT = STREAM_CTL_ABORT };

enum stream_state {
	SS_NEW = 0,    /* not connected yet; the OS answers what it can */
	SS_LISTEN,     /* listening: accept decides per connection */
	SS_CONNECTING, /* TCP and MPA in progress */
	SS_ESTAB,      /* carried over RC */
	SS_DEAD,       /* connection over (error or both sides closed); err says how */
	/* accepted from a preloaded client: the MPA exchange runs with the program's first use of
	 * the connection, in whichever process makes it (a forking server's child) */
	SS_ANSWER,
};

/* Creates the stream part of a taken TCP socket. Returns 0 or -ENOMEM. */
int stream_attach(struct sock *s);
/* Last reference gone: sends what is owed (FIN), tears down. Needs s->lock. */
void stream_teardown(struct sock *s);
/* The program is closing fd, one of its descriptors of stream socket s, and keeps the socket
 * by another number: a QP that runs on fd moves there (dgv_qp_set_fd; to a private duplicate
 * if no other number is found). Needs s->lock. Returns 0, or -errno when it could not move
 * (the connection is then dead: ECONNRESET, logged). */
int stream_fd_closing(struct sock *s, int fd);
void stream_after_fork(struct sock *s);
/* Fork, once per process: in the parent (child false) after it, in the child before the
 * sockets are reset. */
void stream_fork(bool child);
/* At exit: waits (at most ~2 s) for the connections still closing in the background to end as
 * a close() used to make them end before it returned (stream.c "closing in the background"). */
void stream_fini(void);

int stream_connect(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
int stream_listen(struct sock *s, int fd, int backlog);
/* accept4 on a listening socket (taken or not). Returns the new fd or -errno. */
int stream_accept(int fd, struct sockaddr *a, socklen_t *l, int flags);
int stream_shutdown(struct sock *s, int fd, int how);
ssize_t stream_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags);
ssize_t stream_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags);
/* POLLIN / POLLOUT readiness: > 0 ready (a mask: POLLIN or POLLOUT, with POLLRDHUP, POLLHUP and
 * POLLERR as the kernel's tcp_poll would give them), 0 not (wait on stream_wait_fds), -1 the OS
 * decides. */
int stream_poll_in(struct sock *s, int fd);
int stream_poll_out(struct sock *s, int fd);
/* The same without I/O of their own (stream.c progress_for_check): for the checks a poll or
 * epoll_wait makes of every registration on every round. */
int stream_poll_in_queued(struct sock *s, int fd);
int stream_poll_out_queued(struct sock *s, int fd);
/* What a wait on the stream watches (sock ops wait_fds): the TCP socket while it may still
 * bring news (-1 once it ended: it would stay readable) with *qev, and the CQ's descriptor,
 * armed (-1 when the TCP socket's readiness announces everything, stream_self). Returns 0, or
 * -1 when the stream is not carried (the kernel's readiness is the truth). */
int stream_wait_fds(struct sock *s, int *qfd, short *qev, int *cqfd);
/* The poll that gathered with bell b (shim_wait_bell) is over: b no longer rings for s. */
void stream_unwait(struct sock *s, struct bell *b);
/* Bumped when a call took news off s that the kernel will not report again (shim.h "Waking a
 * waiter"); lock-free. */
uint32_t stream_kicks(struct sock *s);
int stream_fionread(struct sock *s, int fd, int *out);
/* SO_ERROR of a stream socket the shim carries (pending error, consumed), or -ENOSYS. */
int stream_so_error(struct sock *s, int *out);
int stream_setmode(struct sock *s, int mode);
/* TCP_NODELAY of a carried stream (set: 1, *l the length given): 0 or -errno; -ENOSYS when the
 * kernel answers (not carried). */
int stream_nodelay(struct sock *s, int fd, int set, void *v, socklen_t *l);
/* SO_RCVLOWAT was set (or inherited): takes the kernel's value for reads and POLLIN. */
void stream_lowat(struct sock *s, int fd);
/* getpeername of a carried stream: its peer, or -ENOTCONN once it is over as a kernel socket
 * would be closed (both FINs, a reset, a failed connect); -ENOSYS: the kernel answers. (The
 * TCP socket under it is the provider's: it may be closed or reset while the stream is not.) */
int stream_getpeername(struct sock *s, struct sockaddr *a, socklen_t *l);
/* 1 when the stream is (being) carried over RC. */
int stream_carried(struct sock *s);
/* IWARP_TAKEN: stream_carried, after answering an accepted connection not answered yet (the
 * question is whether it is carried, which the exchange decides). */
int stream_taken(struct sock *s, int fd);
void stream_cq_ack(struct sock *s);
/* What a reader could have news of: the bytes arrived, the peer's end, an error (a number
 * that changes with each); edge-triggered epoll reports EPOLLIN once per change. */
uint64_t stream_news(struct sock *s);

/* Process-wide counters for the exit summary. */
struct stream_totals {
	uint64_t conns, plain, tx_bytes, rx_bytes;
	uint64_t dev;        /* of conns: carried on the RDMA device */
	uint64_t resets;     /* of conns: ended by an error (a reset, a Terminate, a broken peer) */
	uint64_t peer_gone;  /* of conns: TCP ended without the peer's close (its process ended) */
	uint64_t no_room;    /* of plain: a server without resources said "stay plain" (either end) */
	uint64_t idle_freed; /* an idle connection's memory given back (stream.c "idle memory") */
};
void stream_totals(struct stream_totals *t);

#endif
