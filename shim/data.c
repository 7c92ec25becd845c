/*
 * data.c - the data path of a taken socket: send (plain, copied, zero-copy) and receive.
 * Everything here runs under the socket's own lock, never a process-wide one, and does not
 * allocate: slots, pending entries and the registration cache are the socket's.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "log.h"
#include "rules.h"
#include "sock.h"

#define WR_TX (1ull << 32)
#define WR_ZC (2ull << 32)
#define WR_IN (3ull << 32) /* an inline send: completes only if it failed */
#define INLINE_SGE 4       /* the QP's max_sge (the provider's default) */

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Moves finished work from the CQ into the pending list and the free lists. Needs s->lock.
 * Returns the number of completions taken. */
int consume_cq(struct sock *s)
{
	if (!s->cq)
		return 0;
	struct dgv_wc wc[16];
	int n, got = 0;
	while ((n = dgv_poll_cq(s->cq, 16, wc)) > 0) {
		got += n;
		for (int i = 0; i < n; i++) {
			struct dgv_wc *w = &wc[i];
			uint64_t tag = w->wr_id & ~0xffffffffull;
			uint32_t idx = (uint32_t)w->wr_id;
			if (w->opcode == DGV_WC_RECV || w->opcode == DGV_WC_RECV_PLAIN) {
				if (idx >= SHIM_RX_SLOTS)
					continue;
				if (w->status != DGV_WC_SUCCESS) {
					if (w->status != DGV_WC_WR_FLUSH_ERR)
						s->st->lost++;
					s->rx_free[s->rx_free_n++] = (uint16_t)idx;
					continue;
				}
				bool framed = w->opcode == DGV_WC_RECV;
				struct pend *p = &s->pend[(s->pend_head + s->pend_n++) % SHIM_RX_SLOTS];
				p->slot = (uint8_t)idx, p->len = w->byte_len, p->framed = framed, p->peeked = false;
				struct rx_head *h = rx_head(s, idx);
				h->src = w->src, h->srclen = w->src_len;
				if (framed)
					s->st->rx_framed++, s->st->rx_framed_bytes += w->byte_len;
				else
					s->st->rx_plain++, s->st->rx_plain_bytes += w->byte_len;
				peer_heard_memo(&s->heard, &w->src, w->src_len, framed, sock_svc(s));
			} else if (tag == WR_IN) {
				if (w->status != DGV_WC_SUCCESS && w->status != DGV_WC_WR_FLUSH_ERR)
					s->st->lost++;
			} else if (tag == WR_ZC) {
				s->zc_done++;
				if (w->status != DGV_WC_SUCCESS)
					s->st->lost++;
			} else if (tag == WR_TX && idx < SHIM_TX_SLOTS) {
				if ((w->status == DGV_WC_RETRY_EXC_ERR || w->status == DGV_WC_REM_OP_ERR) && s->txd) {
					/* the RD peer stopped answering: what it did not acknowledge goes
					 * plain, so nothing is lost to a peer that is no longer ours */
					peer_failed(&s->txd[idx].to, s->txd[idx].tolen);
					ssize_t r = real.sendto(s->qfd, s->tx_area + (size_t)idx * SHIM_SLOT,
								s->txd[idx].len, MSG_DONTWAIT | MSG_NOSIGNAL,
								&s->txd[idx].to.sa, s->txd[idx].tolen);
					DG_WARN("RD peer silent (%s): datagram resent plain (%s)",
						w->status == DGV_WC_RETRY_EXC_ERR ? "retries exhausted" : "reset",
						r < 0 ? strerror(errno) : "sent");
					if (r >= 0)
						s->st->tx_plain++, s->st->tx_plain_bytes += (uint64_t)r;
					else
						s->st->lost++;
				} else if (w->status != DGV_WC_SUCCESS && w->status != DGV_WC_WR_FLUSH_ERR) {
					s->st->lost++;
				}
				s->tx_free[s->tx_free_n++] = (uint16_t)idx;
			}
		}
		if (n < 16)
			break;
	}
	return got;
}

/* Waits for the socket to have something for `events` (POLLIN: a completion or a datagram
 * to process; POLLOUT: room in the kernel socket, or a completion), up to timeout_ms (< 0:
 * forever). fd is the program's descriptor. Called with s->lock held, returns with it held.
 * Returns 0, -EAGAIN on timeout, -EINTR. */
static int wait_sock(struct sock *s, int fd, short events, int *timeout_ms)
{
	int cqfd = sock_cqfd(s);
	if (sock_can(s, DGV_CAP_BUSY_POLL) && *timeout_ms != 0) {
		/* completions come within microseconds: look for a while before sleeping */
		uint64_t until = shim_now_us() + (uint64_t)shim_spin_us();
		while (shim_now_us() < until)
			if (consume_cq(s))
				return 0;
	}
	if (cq_arm(s->cq, s->pv, &s->armed) && consume_cq(s))
		return 0;
	/* an adopting QP: its socket (datagrams to read, room to send); else the kernel socket
	 * only for plain datagrams from unmodified peers, sends wait for completions */
	int qfd = sock_can(s, DGV_CAP_ADOPT_FD) ? s->qfd : (events & POLLIN) ? fd : -1;
	/* RD's room to send comes with acknowledgements (and its timers, through the CQ), not
	 * with room in the kernel socket: waiting for POLLOUT there returned at once, and a
	 * sender whose window was full spun a CPU until the acks came */
	short qev = s->qp_type == DGV_QPT_RD && (events & POLLOUT) ? (short)((events & ~POLLOUT) | POLLIN) : events;
	pthread_mutex_unlock(&s->lock);
	struct pollfd p[2] = {{.fd = qfd, .events = qev}, {.fd = cqfd, .events = POLLIN}};
	/* the provider's thread runs the timers of a QP nobody polls; the naps are bounded */
	int r = shim_nap(p, 2, timeout_ms);
	pthread_mutex_lock(&s->lock);
	if (unlikely(sock_gone(s)))
		return -EBADF; /* another thread closed its last descriptor meanwhile: torn down */
	if (unlikely(s->gen != G.gen))
		sock_reset_after_fork(s);
	if ((p[1].revents & POLLIN) && s->cq) {
		dgv_cq_ack_event(s->cq);
		s->armed = false;
	}
	return r;
}

/* ------------------------------------------------------------------ receive */

static ssize_t recv_plain_os(int fd, const struct iovec *iov, int iovcnt, int flags,
			     struct sockaddr *src, socklen_t *srclen, int *mflags)
{
	struct msghdr m = {.msg_name = src, .msg_namelen = src && srclen ? *srclen : 0,
			   .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
	ssize_t r = real.recvmsg(fd, &m, flags);
	if (r < 0)
		return -errno;
	if (src && srclen)
		*srclen = m.msg_namelen;
	*mflags = m.msg_flags;
	return r;
}

/* Copies n bytes of a message of msg_len into iov; returns what recv returns for flags. */
static ssize_t deliver(const uint8_t *data, uint32_t n, uint32_t msg_len, const struct iovec *iov,
		       int iovcnt, int flags, int *mflags)
{
	size_t off = 0;
	for (int i = 0; i < iovcnt && off < n; i++) {
		size_t c = iov[i].iov_len < n - off ? iov[i].iov_len : n - off;
		if (c)
			memcpy(iov[i].iov_base, data + off, c);
		off += c;
	}
	*mflags = off < msg_len ? MSG_TRUNC : 0;
	return (flags & MSG_TRUNC) ? (ssize_t)msg_len : (ssize_t)off;
}

/* The source a receive reports: as much of from as *srclen holds, *srclen set to its length
 * (as the kernel does); nothing when the caller asked for none. */
static void give_src(struct sockaddr *src, socklen_t *srclen, const void *from, socklen_t fl)
{
	if (!src || !srclen)
		return;
	memcpy(src, from, *srclen < fl ? *srclen : fl);
	*srclen = fl;
}

/* MSG_PEEK on a shared socket with nothing of its own queued: the provider looks at the
 * kernel's next datagram without taking it, so the next reader, in whichever process, gets
 * it. Needs s->lock (dropped while waiting). Returns what recv returns, or -ENOMSG when the
 * next datagram is not a whole message by itself (the caller receives it the usual way). */
static ssize_t peek_shared(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			   struct sockaddr *src, socklen_t *srclen, int *mflags, bool nb, int *timeout)
{
	for (;;) {
		if (!s->tx_free_n || !s->qp || s->pend_n)
			return -ENOMSG;
		/* a free send slot is scratch space while the lock is held */
		uint8_t *scratch = s->tx_area + (size_t)s->tx_free[s->tx_free_n - 1] * SHIM_SLOT;
		struct dgv_peek pk;
		int r = dgv_peek(s->qp, scratch, SHIM_SLOT, &pk);
		if (r == 0) {
			give_src(src, srclen, &pk.src, pk.src_len);
			return deliver(scratch, pk.copied, pk.msg_len, iov, iovcnt, flags, mflags);
		}
		if (r != -EAGAIN)
			return -ENOMSG;
		if (nb)
			return -EAGAIN;
		pthread_mutex_unlock(&s->lock);
		struct pollfd p = {.fd = fd, .events = POLLIN};
		r = shim_nap(&p, 1, timeout);
		pthread_mutex_lock(&s->lock);
		if (unlikely(sock_gone(s)))
			return -EBADF;
		if (unlikely(s->gen != G.gen))
			sock_reset_after_fork(s);
		if (r)
			return r;
	}
}

void sock_drop_peeked(struct sock *s)
{
	if (!s->pend_n || !s->pend[s->pend_head].peeked)
		return;
	s->rx_free[s->rx_free_n++] = (uint16_t)s->pend[s->pend_head].slot;
	s->pend_head = (s->pend_head + 1) % SHIM_RX_SLOTS;
	s->pend_n--;
	sock_post_rx(s);
}

/* The datagram carried over from the parent (sock.h `carry`). Needs s->lock. */
static ssize_t recv_carry(struct sock *s, const struct iovec *iov, int iovcnt, int flags,
			  struct sockaddr *src, socklen_t *srclen, int *mflags)
{
	ssize_t rc = deliver(s->carry, s->carry_len, s->carry_len, iov, iovcnt, flags, mflags);
	give_src(src, srclen, &s->carry_src, s->carry_srclen);
	if (!(flags & MSG_PEEK)) {
		free(s->carry);
		s->carry = NULL;
	}
	return rc;
}

/* shim.h. A receive that waits in the kernel writes there, not into the socket's memory,
 * which another thread's close may unmap meanwhile. Mapped per thread that ever waited so
 * (touched as far as datagrams reach), unmapped when the thread exits. */
static pthread_key_t rxbuf_key;
static pthread_once_t rxbuf_once = PTHREAD_ONCE_INIT;
static bool rxbuf_key_ok;
static __thread uint8_t *rxbuf;

static void rxbuf_free(void *p) { munmap(p, SHIM_SLOT); }
static void rxbuf_key_make(void) { rxbuf_key_ok = pthread_key_create(&rxbuf_key, rxbuf_free) == 0; }

uint8_t *shim_rxbuf(void)
{
	if (likely(rxbuf != NULL))
		return rxbuf;
	pthread_once(&rxbuf_once, rxbuf_key_make);
	if (!rxbuf_key_ok)
		return NULL;
	void *p = shim_pages(SHIM_SLOT);
	if (!p)
		return NULL;
	if (pthread_setspecific(rxbuf_key, p)) {
		munmap(p, SHIM_SLOT);
		return NULL;
	}
	return rxbuf = p;
}

/* Whether a receive on s may read the program's socket itself (rx_direct): a UD queue pair on
 * the program's socket whose completions are all made in the program's calls (no CQ eventfd to
 * watch), not shared with another process, every receive slot posted (the QP takes no more
 * datagrams than it has receives), and the thread's buffer at hand. Such a socket's readiness
 * to read is then its queue's, or else the kernel socket's (dgram_poll_in). Needs s->lock. */
static bool rx_direct_ok(const struct sock *s)
{
	return s->qp && s->qp_type == DGV_QPT_UD && !s->cq_fd && !s->shared && !s->rx_free_n &&
	       sock_can(s, DGV_CAP_ADOPT_FD) && sock_can(s, DGV_CAP_RX_FEED) && shim_rxbuf();
}

/* A receive straight off the program's socket into the thread's buffer: one recvfrom (the
 * kernel's own wait when blocking: SO_RCVTIMEO, signals and cancellation are the kernel's and
 * libc's, as natively; natively a receive that waits is one system call, and a look that found
 * nothing, a poll and then a read made it three). A datagram that is by itself the next whole
 * message is taken where it lies (dgv_qp_rx_take: checked as placement checks it, one QP lock,
 * no receive slot written, no completion made or taken, no receive posted again); anything
 * else (a segment of a longer message, a datagram that fails its checks, MSG_PEEK) goes to the
 * QP as if it had read it (dgv_qp_rx_feed). One datagram per call, as the QP reads such a
 * socket (rx_cap 1): what stays in the kernel wakes the program's other threads asleep on it.
 * nb: MSG_DONTWAIT, with s->lock kept. Called with s->lock held (rx_direct_ok), returns with it
 * held. Returns -ENOMSG (the datagram went to the QP: look at the completions), or what the
 * program's receive returns: the message's length, -EAGAIN (nothing there, or the socket's
 * timeout), -EINTR, -EBADF (closed meanwhile), another -errno, or the datagram's length when the
 * QP went away meanwhile (a mode change) and the datagram was delivered here as read. A
 * datagram the QP refuses is dropped and counted lost, never handed up raw (it may be framed). */
static ssize_t rx_direct(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			 struct sockaddr *src, socklen_t *srclen, int *mflags, bool nb)
{
	uint8_t *d = rxbuf;
	union dgv_sockaddr from;
	socklen_t fl = sizeof from;
	ssize_t n;
	/* MSG_TRUNC: the real length, so the QP drops what exceeds its buffer as when it reads */
	if (nb) {
		n = real.recvfrom(fd, d, SHIM_SLOT, MSG_TRUNC | MSG_DONTWAIT, &from.sa, &fl);
		if (n < 0)
			return -errno;
	} else {
		pthread_mutex_unlock(&s->lock);
		int c = shim_cancel_open();
		n = real.recvfrom(fd, d, SHIM_SLOT, MSG_TRUNC, &from.sa, &fl);
		shim_cancel_close(c);
		int e = errno;
		pthread_mutex_lock(&s->lock);
		if (n < 0)
			return -e;
		if (unlikely(sock_gone(s)))
			return -EBADF; /* closed by another thread meanwhile: torn down */
		if (unlikely(s->gen != G.gen))
			sock_reset_after_fork(s);
	}
	if (s->qp) {
		struct dgv_rx_msg m;
		/* never handed up raw: it may be framed */
		int r = (flags & MSG_PEEK) ? dgv_qp_rx_feed(s->qp, d, (size_t)n, &from.sa, fl)
					   : dgv_qp_rx_take(s->qp, d, (size_t)n, &from.sa, fl, SHIM_SLOT, &m);
		if (r == 1) {
			ssize_t rc = deliver(d + m.off, m.len, m.len, iov, iovcnt, flags, mflags);
			give_src(src, srclen, &from, fl);
			if (m.framed)
				s->st->rx_framed++, s->st->rx_framed_bytes += m.len;
			else
				s->st->rx_plain++, s->st->rx_plain_bytes += m.len;
			peer_heard_memo(&s->heard, &from, fl, m.framed, sock_svc(s));
			if ((++s->ops & 255) == 0)
				stats_pull(s);
			return rc;
		}
		if (unlikely(r < 0)) {
			s->st->lost++;
			DG_WARN("fd %d: a datagram read for the queue pair was refused by it (%s): dropped", fd,
				strerror(-r));
		}
		return -ENOMSG;
	}
	/* no QP now (a mode change tore it down): the socket is the kernel's, and so is this */
	uint32_t len = (size_t)n < SHIM_SLOT ? (uint32_t)n : SHIM_SLOT;
	ssize_t rc = deliver(d, len, (uint32_t)n, iov, iovcnt, flags, mflags);
	give_src(src, srclen, &from, fl);
	s->st->rx_plain++, s->st->rx_plain_bytes += len;
	return rc;
}

static ssize_t dgram_recv(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			  struct sockaddr *src, socklen_t *srclen, int *mflags)
{
	pthread_mutex_lock(&s->lock);
	if (unlikely(sock_gone(s))) {
		pthread_mutex_unlock(&s->lock);
		return -EBADF; /* closed by another thread since this call looked it up */
	}
	if (unlikely(s->gen != G.gen))
		sock_reset_after_fork(s);
	if (!s->qp && (s->mode == IWARP_MODE_OFF || s->broken || !sock_is_bound(fd) || qp_setup(s, fd))) {
		pthread_mutex_unlock(&s->lock);
		return recv_plain_os(fd, iov, iovcnt, flags, src, srclen, mflags);
	}
	bool nb = s->user_nonblock || (flags & MSG_DONTWAIT);
	int timeout = nb ? 0 : s->rcvtimeo_ms > 0 ? s->rcvtimeo_ms : -1;
	ssize_t rc;
	if (s->carry) {
		rc = recv_carry(s, iov, iovcnt, flags, src, srclen, mflags);
		goto out;
	}
	/* MSG_PEEK leaves a whole message in the kernel, where a forked child or another
	 * process sharing the socket reads it next, as natively */
	if ((flags & MSG_PEEK) && !s->pend_n && sock_can(s, DGV_CAP_PEEK)) {
		rc = peek_shared(s, fd, iov, iovcnt, flags, src, srclen, mflags, nb, &timeout);
		if (rc != -ENOMSG)
			goto out;
	}
	for (;;) {
		/* a receive reads the program's socket itself (rx_direct), blocking in the kernel's
		 * own wait; the completions are looked at first only when one is there (a message of
		 * several datagrams that a read completed, the provider thread's timers) */
		bool direct = !s->pend_n && rx_direct_ok(s), looked = false;
		if (!s->pend_n && (!direct || dgv_cq_ready(s->cq) > 0))
			consume_cq(s), looked = true;
		if (s->pend_n)
			break;
		if (s->shut_rd) {
			rc = 0;
			goto out;
		}
		if (!sock_can(s, DGV_CAP_ADOPT_FD)) {
			/* a plain datagram from an unmodified peer waits in the kernel socket */
			rc = recv_plain_os(fd, iov, iovcnt, flags | MSG_DONTWAIT, src, srclen, mflags);
			if (rc >= 0) {
				if (!(flags & MSG_PEEK))
					s->st->rx_plain++, s->st->rx_plain_bytes += (uint64_t)rc;
				if (src && srclen && *srclen)
					peer_heard((const union dgv_sockaddr *)src, *srclen, false, sock_svc(s));
				goto out;
			}
			if (rc != -EAGAIN)
				goto out;
		}
		/* asked again: a look at the completions may have freed receive slots. A datagram
		 * that went to the QP is followed by another read, also when not blocking: an
		 * edge-triggered program reads until EAGAIN, which must mean the socket is empty */
		if (looked ? rx_direct_ok(s) : direct) {
			rc = rx_direct(s, fd, iov, iovcnt, flags, src, srclen, mflags, nb);
			if (rc == -ENOMSG)
				continue;
			goto out;
		}
		if (nb) {
			rc = -EAGAIN;
			goto out;
		}
		int w = wait_sock(s, fd, POLLIN, &timeout);
		if (w) {
			rc = w;
			goto out;
		}
		if (!s->qp) { /* torn down under us (mode change failed): the OS has it now */
			pthread_mutex_unlock(&s->lock);
			return recv_plain_os(fd, iov, iovcnt, flags, src, srclen, mflags);
		}
	}
	struct pend *p = &s->pend[s->pend_head];
	rc = deliver(rx_data(s, p->slot), p->len, p->len, iov, iovcnt, flags, mflags);
	give_src(src, srclen, &rx_head(s, p->slot)->src, rx_head(s, p->slot)->srclen);
	if (flags & MSG_PEEK) {
		p->peeked = true;
	} else {
		p->peeked = false;
		s->rx_free[s->rx_free_n++] = (uint16_t)p->slot;
		s->pend_head = (s->pend_head + 1) % SHIM_RX_SLOTS;
		s->pend_n--;
		sock_post_rx(s);
	}
	if ((++s->ops & 255) == 0)
		stats_pull(s);
out:
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int dgram_fionread(struct sock *s, int fd, int *out)
{
	pthread_mutex_lock(&s->lock);
	if (!s->qp) {
		pthread_mutex_unlock(&s->lock);
		return -ENOSYS; /* the OS carries it: the caller asks the kernel */
	}
	consume_cq(s);
	if (!s->pend_n && !sock_can(s, DGV_CAP_ADOPT_FD)) {
		pthread_mutex_unlock(&s->lock);
		return -ENOSYS; /* a plain datagram in the kernel socket, or nothing: the kernel says */
	}
	*out = s->carry ? (int)s->carry_len : s->pend_n ? (int)s->pend[s->pend_head].len : 0;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ------------------------------------------------------------------ readiness */

int sock_is_bound(int fd)
{
	union dgv_sockaddr la;
	socklen_t ll = sizeof la;
	if (getsockname(fd, &la.sa, &ll))
		return 0;
	return (la.sa.sa_family == AF_INET ? la.sin.sin_port : la.sin6.sin6_port) != 0;
}

/* Readiness to read (shim.h poll_in). kernel_in: the kernel has just reported the program's
 * socket readable (a wait that watched it), so an rx_direct socket with nothing of its own
 * queued is readable without another look; otherwise such a socket asks the kernel (one poll,
 * no read: the receive that follows reads the datagram into the caller's buffer, where a read
 * here would have put it into a receive slot first, a page of every active socket). A datagram
 * there that turns out to be no message by itself (a segment of a longer one, a damaged one)
 * made the socket readable without a message, as a UDP datagram with a bad checksum does
 * natively: the receive then says EAGAIN, or waits when blocking. */
static int poll_in(struct sock *s, int fd, bool kernel_in)
{
	pthread_mutex_lock(&s->lock);
	if (unlikely(s->gen != G.gen))
		sock_reset_after_fork(s);
	int r;
	/* waiting on an unbound socket must not bind it (SIPp adds it to epoll, then binds):
	 * until it has a port the kernel's readiness is the truth */
	if (!s->qp && (s->mode == IWARP_MODE_OFF || s->broken || !sock_is_bound(fd) || qp_setup(s, fd))) {
		r = -1; /* the kernel's readiness is the truth */
	} else if (s->shared && sock_can(s, DGV_CAP_ADOPT_FD)) {
		/* reading here would take a datagram another process may be about to read */
		r = s->pend_n || s->carry || s->shut_rd ? POLLIN : -1;
	} else if (!s->pend_n && !s->carry && !s->shut_rd && rx_direct_ok(s) && dgv_cq_ready(s->cq) <= 0) {
		struct pollfd k = {.fd = fd, .events = POLLIN};
		r = kernel_in || (real.poll(&k, 1, 0) > 0 && (k.revents & POLLIN)) ? POLLIN : 0;
	} else {
		consume_cq(s);
		/* DGV_CAP_ARM_ONCE: left armed, and looked at once more after that (one arming
		 * per wake-up), so a wait that follows misses nothing */
		if (sock_can(s, DGV_CAP_ARM_ONCE) && !s->pend_n && cq_arm(s->cq, s->pv, &s->armed))
			consume_cq(s);
		r = s->pend_n || s->shut_rd ? POLLIN : 0;
		if (!r && !sock_can(s, DGV_CAP_ADOPT_FD)) {
			/* plain datagrams from unmodified peers wait in the kernel socket */
			struct pollfd k = {.fd = fd, .events = POLLIN};
			if (real.poll(&k, 1, 0) > 0 && (k.revents & POLLIN))
				r = POLLIN;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

static int dgram_poll_in(struct sock *s, int fd) { return poll_in(s, fd, false); }
static int dgram_poll_in_fired(struct sock *s, int fd) { return poll_in(s, fd, true); }

static int dgram_poll_in_queued(struct sock *s, int fd)
{
	/* a channel that fires once per arming is armed before the last look (dgram_poll_in
	 * does both) */
	if (sock_can(s, DGV_CAP_ARM_ONCE))
		return dgram_poll_in(s, fd);
	pthread_mutex_lock(&s->lock);
	if (unlikely(s->gen != G.gen) || !s->qp || s->shared) {
		pthread_mutex_unlock(&s->lock);
		return dgram_poll_in(s, fd);
	}
	if (!s->pend_n && dgv_cq_ready(s->cq) > 0)
		consume_cq(s);
	int r = s->pend_n || s->shut_rd ? POLLIN : 0;
	pthread_mutex_unlock(&s->lock);
	return r;
}

static int dgram_wait_fds(struct sock *s, int *qfd, short *qev, int *cqfd)
{
	pthread_mutex_lock(&s->lock);
	int r = -1;
	if (s->qp) {
		*qfd = s->qfd; /* -1 unless adopting: the program's own descriptor is watched anyway */
		*qev = POLLIN;
		*cqfd = sock_cqfd(s);
		cq_arm(s->cq, s->pv, &s->armed); /* ARM_ONCE: sock_poll_in before this armed it */
		r = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

static void dgram_cq_ack(struct sock *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->cq)
		dgv_cq_ack_event(s->cq);
	s->armed = false; /* an event disarms an ARM_ONCE channel: the next readiness check arms */
	pthread_mutex_unlock(&s->lock);
}

int sock_ep_link(struct sock *s, struct ep *ep, int on, uint32_t idx)
{
	pthread_mutex_lock(&s->lock);
	int i, rc = 1;
	for (i = 0; i < s->neps && s->eps[i] != ep; i++)
		;
	if (on && i == s->neps) {
		if (s->neps < SHIM_MAX_EPS)
			s->eps[s->neps] = ep, s->ep_reg[s->neps++] = idx;
		else
			rc = 0;
	} else if (on == 2) {
		if (i < s->neps)
			s->ep_reg[i] = idx;
	} else if (on) {
		rc = 2;
	} else if (i < s->neps) {
		s->neps--;
		s->eps[i] = s->eps[s->neps], s->ep_reg[i] = s->ep_reg[s->neps];
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int sock_eps(struct sock *s, struct ep **eps)
{
	pthread_mutex_lock(&s->lock);
	int n = s->neps;
	memcpy(eps, s->eps, (size_t)n * sizeof *eps);
	pthread_mutex_unlock(&s->lock);
	return n;
}

uint64_t sock_id(const struct sock *s)
{
	return s->id;
}

/* ------------------------------------------------------------------ send */

static bool is_group(const union dgv_sockaddr *a)
{
	if (a->sa.sa_family == AF_INET) {
		uint32_t ip = ntohl(a->sin.sin_addr.s_addr);
		return IN_MULTICAST(ip) || ip == INADDR_BROADCAST;
	}
	if (a->sa.sa_family == AF_INET6) {
		if (IN6_IS_ADDR_MULTICAST(&a->sin6.sin6_addr))
			return true;
		if (IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) {
			uint32_t ip;
			memcpy(&ip, &a->sin6.sin6_addr.s6_addr[12], 4);
			ip = ntohl(ip);
			return IN_MULTICAST(ip) || ip == INADDR_BROADCAST;
		}
	}
	return false;
}

/* Plain UDP through the kernel, blocking as the program asked. Called without s->lock. */
static ssize_t send_plain(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			  const struct sockaddr *dest, socklen_t destlen, bool nb)
{
	struct msghdr m = {.msg_name = (void *)dest, .msg_namelen = dest ? destlen : 0,
			   .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
	for (;;) {
		ssize_t r = real.sendmsg(fd, &m, flags | MSG_DONTWAIT);
		if (r >= 0) {
			pthread_mutex_lock(&s->lock);
			s->st->tx_plain++, s->st->tx_plain_bytes += (uint64_t)r; /* after a close: own_st */
			pthread_mutex_unlock(&s->lock);
			return r;
		}
		if ((errno != EAGAIN && errno != EWOULDBLOCK) || nb)
			return -errno;
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		if (shim_cancel_prev == PTHREAD_CANCEL_ENABLE)
			pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		int pr = real.poll(&p, 1, s->sndtimeo_ms > 0 ? s->sndtimeo_ms : -1);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		if (pr == 0)
			return -EAGAIN;
	}
}

/* The registration covering [p, p+len) from the socket's cache, registering (64 KiB-aligned,
 * so neighbouring buffers share it) on a miss. Needs s->lock. NULL on failure. */
static struct dgv_mr *zc_lookup(struct sock *s, const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p, e = a + len;
	struct zc_ent *victim = &s->zc[0];
	for (int i = 0; i < SHIM_ZC_CACHE; i++) {
		struct zc_ent *z = &s->zc[i];
		if (z->mr && z->start <= a && e <= z->end) {
			z->used = ++s->ops;
			return z->mr;
		}
		if (!z->mr || z->used < victim->used)
			victim = z;
	}
	uintptr_t start = a & ~(uintptr_t)0xffff, end = (e + 0xffff) & ~(uintptr_t)0xffff;
	if (victim->mr)
		dgv_dereg_mr(victim->mr), victim->mr = NULL;
	/* the soft provider reads through the mapping at send time; a region that stops being
	 * mapped is never read again once evicted (ibverbs pins: see docs/shim.md) */
	if (dgv_reg_mr(sock_pd(s), (void *)start, end - start, 0, &victim->mr) &&
	    dgv_reg_mr(sock_pd(s), (void *)a, len, 0, &victim->mr))
		return NULL;
	victim->start = (uintptr_t)victim->mr->addr;
	victim->end = victim->start + victim->mr->length;
	victim->used = ++s->ops;
	return victim->mr;
}

void zc_cache_clear(struct sock *s)
{
	for (int i = 0; i < SHIM_ZC_CACHE; i++)
		if (s->zc[i].mr)
			dgv_dereg_mr(s->zc[i].mr), s->zc[i].mr = NULL;
}

void rd_gone_check(struct sock *s)
{
	if (!s->qp || s->qp_type != DGV_QPT_RD || s->tx_free_n == SHIM_TX_SLOTS || !s->txd)
		return;
	uint64_t now = shim_now_us();
	if (now - s->gone_check_us < 10000)
		return;
	s->gone_check_us = now;
	bool held[SHIM_TX_SLOTS], gone = false;
	memset(held, 1, sizeof held);
	for (unsigned i = 0; i < s->tx_free_n; i++)
		held[s->tx_free[i]] = false;
	/* the slots held are mostly for one destination: its registry look (a system call when
	 * the name is there) is made once per run of them */
	const union dgv_sockaddr *last = NULL;
	bool last_there = true;
	for (unsigned i = 0; i < SHIM_TX_SLOTS; i++) {
		const union dgv_sockaddr *to = &s->txd[i].to;
		if (!held[i] || (to->sa.sa_family != AF_INET && to->sa.sa_family != AF_INET6) || !ip_local(to))
			continue;
		unsigned port = port_of(to);
		if (!last || !dgv_addr_eq(last, to))
			last_there = reg_has(reg_key(IWARP_MODE_RD, port)), last = to;
		if (last_there)
			continue;
		gone = true;
		/* A receiver sends the acknowledgements it owes before its name goes (rd_ack_owed at
		 * its QP's end), but this QP may take them in only at its next progress: a destination
		 * is failed only once this slot has seen it gone for a while (what it acknowledged,
		 * failed, would be resent plain: a duplicate where its socket lives on in another mode) */
		if (!s->txd[i].gone_at)
			s->txd[i].gone_at = now;
		if (now - s->txd[i].gone_at < 20000)
			continue;
		DG_DBG("RD destination port %u on this host: its socket is gone (no registry name): its "
		       "datagrams in flight fail now", port);
		dgv_qp_peer_gone(s->qp, &to->sa, s->txd[i].tolen);
	}
	s->gone_seen = gone;
}

/* Waits for room to send: events POLLOUT for a free slot, 0 for a completion only. Returns 0
 * to try again, 1 when the socket lost its queue pair meanwhile (send plain), or -errno
 * (-EAGAIN at once when nb). Needs s->lock. */
static int tx_room_wait(struct sock *s, int fd, bool nb, short events, int *timeout)
{
	if (nb)
		return -EAGAIN;
	int w = wait_sock(s, fd, events, timeout);
	if (w)
		return w;
	return s->qp ? 0 : 1;
}

static ssize_t dgram_send(struct sock *s, int fd, const struct iovec *iov, int iovcnt, int flags,
			  const struct sockaddr *dest, socklen_t destlen)
{
	size_t total = iov_total(iov, iovcnt);
	pthread_mutex_lock(&s->lock);
	if (unlikely(sock_gone(s))) {
		pthread_mutex_unlock(&s->lock);
		return -EBADF; /* closed by another thread since this call looked it up */
	}
	if (unlikely(s->gen != G.gen))
		sock_reset_after_fork(s);
	bool nb = s->user_nonblock || (flags & MSG_DONTWAIT);
	const union dgv_sockaddr *to = (const union dgv_sockaddr *)dest;
	socklen_t tolen = destlen;
	if (!dest && s->connected)
		to = &s->peer, tolen = s->peerlen;
	struct dgv_ah *ah = NULL;
	if (to && tolen >= sizeof(struct sockaddr_in) && total <= SHIM_MAX_DGRAM && !s->shut_wr &&
	    s->mode != IWARP_MODE_OFF && !s->broken && !is_group(to) && to->sa.sa_family == s->family) {
		if (!s->qp) {
			/* a rules line for this destination chooses the service of a socket that
			 * neither the program nor a receiver rule has (the peer's receiver rule
			 * chose the same, or the datagram would be dropped there) */
			if (!s->explicit_mode && s->mode == IWARP_MODE_AUTO && G.rules) {
				int m = dg_rules_match(G.rules, IPPROTO_UDP, DG_ROLE_SENDER, &to->sa, tolen);
				if (m == IWARP_MODE_UD || m == IWARP_MODE_RD)
					s->mode = m;
			}
			s->dest_hint = to; /* may choose the device (sock.c dev_get) */
			qp_setup(s, fd);
			s->dest_hint = NULL;
		}
		/* RD promised the program reliability, which a plain datagram cannot keep: a datagram
		 * to another host whose discovery question is out waits for the answer (at most
		 * RD_ANSWER_WAIT_MS) rather than going plain meanwhile */
		if (s->qp)
			ah = peer_route_memo(&s->route, to, tolen, sock_svc(s),
					     s->qp_type == DGV_QPT_RD ? RD_ANSWER_WAIT_MS : 0);
	}
	if (!ah) {
		pthread_mutex_unlock(&s->lock);
		return send_plain(s, fd, iov, iovcnt, flags & ~MSG_DONTWAIT, dest, destlen, nb);
	}
	int timeout = nb ? 0 : s->sndtimeo_ms > 0 ? s->sndtimeo_ms : -1;
	ssize_t rc;
	int pr;
	if (s->qp_type == DGV_QPT_UD && sock_can(s, DGV_CAP_SEND_INLINE) && iovcnt <= INLINE_SGE) {
		/* The provider sends from the program's own buffer during the post, and copies what
		 * the kernel had no room for: no send slot written (a page per socket), no copy into
		 * it, and unsignaled no completion to make and take (issue 14 items 2 and 4).
		 * dgv_send_now is the common case without a work request; what it leaves the post
		 * takes (queued behind a full socket, or the error said) */
		if (dgv_send_now(s->qp, ah, iov, iovcnt) == 0) {
			s->st->tx_framed++, s->st->tx_framed_bytes += total, s->st->tx_zcopy++;
			rc = (ssize_t)total;
			goto out;
		}
		struct dgv_sge sge[INLINE_SGE];
		int n = 0;
		for (int i = 0; i < iovcnt; i++)
			if (iov[i].iov_len)
				sge[n++] = (struct dgv_sge){(uint64_t)(uintptr_t)iov[i].iov_base, (uint32_t)iov[i].iov_len, 0};
		struct dgv_send_wr wr = {.wr_id = WR_IN, .sg_list = sge, .num_sge = n, .opcode = DGV_WR_SEND,
					 .send_flags = DGV_SEND_INLINE, .ah = ah},
				   *bad;
		while ((pr = dgv_post_send(s->qp, &wr, &bad)) == -ENOMEM) {
			/* the send queue is full of sends the kernel's buffer had no room for: they
			 * leave as it drains, which the socket's room says */
			int w = tx_room_wait(s, fd, nb, POLLOUT, &timeout);
			if (w < 0) {
				rc = w;
				goto out;
			}
			if (w > 0)
				goto plain;
			consume_cq(s); /* progress: the queue's sends go out */
		}
		if (pr) {
			rc = pr;
			goto out;
		}
		s->st->tx_framed++, s->st->tx_framed_bytes += total, s->st->tx_zcopy++;
		rc = (ssize_t)total;
		goto out;
	}
	if (s->qp_type == DGV_QPT_UD && iovcnt == 1 && total >= (size_t)s->zcopy && total > 0) {
		/* zero-copy: the provider reads the program's buffer; UD hands it to the kernel
		 * during the post, so the wait below is normally already over */
		struct dgv_mr *mr = zc_lookup(s, iov[0].iov_base, total);
		if (mr) {
			struct dgv_sge sge = {(uint64_t)(uintptr_t)iov[0].iov_base, (uint32_t)total, mr->lkey};
			uint64_t seq = ++s->zc_seq;
			struct dgv_send_wr wr = {.wr_id = WR_ZC | (uint32_t)seq, .sg_list = &sge, .num_sge = 1,
						 .opcode = DGV_WR_SEND, .send_flags = DGV_SEND_SIGNALED, .ah = ah},
					   *bad;
			pr = dgv_post_send(s->qp, &wr, &bad);
			if (pr == 0) {
				int t = -1; /* the buffer is the program's: it cannot go back half sent */
				while (s->zc_done < seq) {
					consume_cq(s);
					if (s->zc_done < seq && wait_sock(s, fd, POLLOUT, &t) == -EBADF) {
						rc = -EBADF; /* closed meanwhile: the QP is gone */
						goto out;
					}
				}
				s->st->tx_framed++, s->st->tx_framed_bytes += total, s->st->tx_zcopy++;
				rc = (ssize_t)total;
				goto out;
			}
			s->zc_seq--;
		}
	}
again:
	for (;;) {
		if (!s->tx_free_n)
			consume_cq(s);
		if (s->tx_free_n)
			break;
		if (s->qp_type == DGV_QPT_RD) {
			/* a destination whose socket is gone holds slots for seconds: fail it now */
			rd_gone_check(s);
			if (consume_cq(s), s->tx_free_n)
				break;
		}
		/* a destination seen gone: look again in 10 ms, not at the nap's 200 */
		bool brief = s->gone_seen && !nb && (timeout < 0 || timeout > 10);
		int t = 10;
		int w = tx_room_wait(s, fd, nb, POLLOUT, brief ? &t : &timeout);
		if (brief) {
			if (w == -EAGAIN)
				w = 0;
			if (timeout > 0)
				timeout -= 10 - t;
		}
		if (w < 0) {
			rc = w;
			goto out;
		}
		if (w > 0)
			goto plain;
	}
	uint32_t slot = s->tx_free[--s->tx_free_n];
	uint8_t *b = s->tx_area + (size_t)slot * SHIM_SLOT;
	size_t off = 0;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len)
			memcpy(b + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	if (s->txd) {
		struct shim_txd *d = &s->txd[slot];
		memcpy(&d->to, to, tolen < sizeof d->to ? tolen : sizeof d->to);
		d->tolen = tolen;
		d->len = (uint32_t)total;
		d->gone_at = 0;
	}
	struct dgv_sge sge = {(uint64_t)(uintptr_t)b, (uint32_t)total, s->tx_mr->lkey};
	struct dgv_send_wr wr = {.wr_id = WR_TX | slot, .sg_list = &sge, .num_sge = 1,
				 .opcode = DGV_WR_SEND, .send_flags = DGV_SEND_SIGNALED, .ah = ah},
			   *bad;
	pr = dgv_post_send(s->qp, &wr, &bad);
	if (pr == -ENOMEM) {
		/* the send queue is full behind a WQE still in flight (an RD peer that stopped
		 * answering holds its entries until its retries run out): a blocking send waits
		 * as the kernel's does when the send buffer is full, never ENOBUFS */
		s->tx_free[s->tx_free_n++] = (uint16_t)slot;
		/* only a completion frees the entries: the kernel socket's room would wake at once */
		int w = tx_room_wait(s, fd, nb, 0, &timeout);
		if (w < 0) {
			rc = w;
			goto out;
		}
		if (w > 0)
			goto plain;
		goto again;
	}
	if (pr) {
		s->tx_free[s->tx_free_n++] = (uint16_t)slot;
		rc = pr;
		goto out;
	}
	s->st->tx_framed++, s->st->tx_framed_bytes += total;
	rc = (ssize_t)total;
	/* a UD send may complete during the post (the soft provider's does): reclaim at once so
	 * the warm slot is reused */
	if (s->qp_type == DGV_QPT_UD)
		consume_cq(s);
out:
	if ((++s->ops & 255) == 0)
		stats_pull(s);
	pthread_mutex_unlock(&s->lock);
	return rc;
plain: /* the socket lost its queue pair while the send waited */
	pthread_mutex_unlock(&s->lock);
	return send_plain(s, fd, iov, iovcnt, flags & ~MSG_DONTWAIT, dest, destlen, nb);
}

/* UDP over UD or RD, on whichever provider carries the socket (its capabilities decide the
 * differences); the kernel's send buffer decides POLLOUT, so poll_out is the kernel's. */
const struct sock_ops dgram_ops = {
	.kind = "udp",
	.bound = dgram_bound,
	.connect = dgram_connect,
	.shutdown = dgram_shutdown,
	.setopt = dgram_setopt,
	.send = dgram_send,
	.recv = dgram_recv,
	.fionread = dgram_fionread,
	.poll_in = dgram_poll_in,
	.poll_in_queued = dgram_poll_in_queued,
	.poll_in_fired = dgram_poll_in_fired,
	.wait_fds = dgram_wait_fds,
	.cq_ack = dgram_cq_ack,
};
