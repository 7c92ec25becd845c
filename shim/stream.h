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

struct sock;

/* Private data of the MPA Request and Reply between two shims (big-endian fields). */
#define STREAM_MAGIC 0x44475331u /* "DGS1" */
struct stream_hello {
	uint32_t magic;      /* STREAM_MAGIC */
	uint32_t ring_size;  /* bytes in the receive ring (power of two) */
	uint32_t ring_stag;  /* STag of the ring and the control slots (one region) */
	uint32_t ctl_slots;  /* control slots after the ring */
	uint64_t ring_addr;  /* tagged offset of the ring's first byte */
	uint64_t ctl_addr;   /* tagged offset of control slot 0 */
	uint32_t max_recs;   /* data records the receiver takes in flight (its CQ room) */
	uint32_t rsvd;
} __attribute__((packed));

/*
 * Streams on an RDMA device (docs/shim.md "TCP on an RDMA device"). Both programs' TCP
 * connection is made as always (it gives accept(), the addresses and the fallback); when the
 * client's registry name says it wants the device, the server writes one struct stream_rv on
 * that connection, naming its device listener (rdma_cm, ephemeral port) and a cookie, and the
 * client connects there with struct stream_dhello as private data (40 + 8 bytes: an IB CM REQ
 * holds 52 of ours). The TCP connection carries nothing else.
 */
#define STREAM_RV_MAGIC 0x64675256u /* "dgRV" */
struct stream_rv {
	uint32_t magic;      /* STREAM_RV_MAGIC */
	uint16_t family;     /* 4: IPv4, 6: IPv6 */
	uint16_t port;       /* the device listener's port (rdma_cm RDMA_PS_TCP) */
	uint8_t addr[16];    /* its address (IPv4: the first 4 bytes) */
	uint64_t cookie;     /* echoed in the client's stream_dhello */
} __attribute__((packed));

struct stream_dhello {
	struct stream_hello h;
	uint64_t cookie;     /* from the server's stream_rv: which accepted TCP connection */
} __attribute__((packed));

/* One control message (a Write-Record into the peer's control slot seq % ctl_slots). */
/* CTL_ABORT: the sender's close is abortive (SO_LINGER {1, 0}, unread data): the reset of its
 * TCP connection that follows is a reset for the reader. A reset without it is the end of
 * a writer that died (its kernel would have sent FIN but for our control bytes unread). */
enum { CTL_HELLO = 1, CTL_FIN = 2, CTL_CLOSE = 4, CTL_ABORT = 8 };
struct stream_ctl {
	uint64_t consumed;   /* bytes of the peer's stream the program has read */
	uint64_t recs;       /* data records of the peer's polled from the CQ */
	uint64_t fin_total;  /* CTL_FIN: the sender's stream ends after this many bytes */
	uint32_t flags;      /* CTL_* */
	uint32_t seq;
} __attribute__((packed));

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
void stream_after_fork(struct sock *s);
/* Fork, once per process: in the parent (child false) after it, in the child before the
 * sockets are reset. */
void stream_fork(bool child);

int stream_connect(struct sock *s, int fd, const struct sockaddr *a, socklen_t l);
int stream_listen(struct sock *s, int fd, int backlog);
/* accept4 on a listening socket (taken or not). Returns the new fd or -errno. */
int stream_accept(int fd, struct sockaddr *a, socklen_t *l, int flags);
int stream_shutdown(struct sock *s, int fd, int how);
ssize_t stream_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags);
ssize_t stream_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags);
/* POLLIN / POLLOUT readiness: > 0 ready (a mask: POLLIN or POLLOUT, with POLLRDHUP, POLLHUP and
 * POLLERR as the kernel's tcp_poll would give them), 0 not (wait on stream_wait_fd), -1 the OS
 * decides. */
int stream_poll_in(struct sock *s, int fd);
int stream_poll_out(struct sock *s, int fd);
/* The same without I/O of their own (stream.c progress_for_check): for the checks a poll or
 * epoll_wait makes of every registration on every round. */
int stream_poll_in_queued(struct sock *s, int fd);
int stream_poll_out_queued(struct sock *s, int fd);
/* The descriptor that becomes readable when the stream has news (CQ), armed. -1: none. */
int stream_wait_fd(struct sock *s);
/* The TCP socket to watch too while TCP still carries data (-1 once it ended: it would stay
 * readable). */
int stream_tcp_fd(struct sock *s);
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
};
void stream_totals(struct stream_totals *t);

#endif
