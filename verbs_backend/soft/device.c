/*
 * device.c - the soft provider's context: ops table, protection domains, address handles and
 * the libev progress thread.
 *
 * Progress model (DGV_PROGRESS_AUTO): an application thread that polls or waits on a CQ makes
 * progress itself (lowest latency, no thread hand-off). When a QP has seen no application call
 * for SOFT_APP_IDLE_US, the libev thread starts watching its socket, so one-sided placement, RD
 * acks and Read Responses go on while the application is busy elsewhere. A 1-5 ms tick runs RD
 * retransmission, reassembly timeouts and the switch between the two, and sleeps while no QP
 * needs it (tick_cb). The loop's mutex is
 * released while it sleeps (libev's documented locking pattern), so other threads may add and
 * remove watchers under it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "soft.h"

static void loop_release(struct ev_loop *loop)
{
	struct soft_ctx *ctx = ev_userdata(loop);
	pthread_mutex_unlock(&ctx->loop_lock);
}

static void loop_acquire(struct ev_loop *loop)
{
	struct soft_ctx *ctx = ev_userdata(loop);
	pthread_mutex_lock(&ctx->loop_lock);
}

/* Whether nobody but the program reads qp's socket (rx_hold changes under the QP's lock: an RC
 * QP's receive path; rx_claimed while a caller reads the socket itself). */
static bool rx_held(struct soft_qp *qp)
{
	return qp->rx_app || __atomic_load_n(&qp->rx_hold, __ATOMIC_RELAXED) ||
	       __atomic_load_n(&qp->rx_claimed, __ATOMIC_RELAXED);
}

static void io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct soft_qp *qp = w->data;
	(void)loop;
	(void)revents;
	soft_qp_progress(qp, false, false);
	if (rx_held(qp)) { /* its readiness is the program's (or a claiming caller's) */
		ev_io_stop(loop, w);
		qp->io_on = false;
	}
}

/* soft_qp_timers_pending under the QP's lock, taken only if free (-1: busy). The check reads
 * what that lock guards (the send queue's indices, pump_blocked, an RC connection's phase and
 * batch): without it the thread raced the program's posts (ThreadSanitizer). A busy QP is
 * inside a program's call, which progresses it; soft_qp_progress from here would only have
 * failed its own trylock, and the next tick looks again. */
static int timers_pending_trylock(struct soft_qp *qp)
{
	if (pthread_mutex_trylock(&qp->lock))
		return -1;
	bool pending = soft_qp_timers_pending(qp);
	pthread_mutex_unlock(&qp->lock);
	return pending;
}

bool soft_qp_needs_tick(struct soft_qp *qp)
{
	return !rx_held(qp) || soft_qp_timers_pending(qp);
}

/* The tick's repeat. The loop's thread only (loop_lock). */
static void tick_pace(struct soft_ctx *ctx, double s)
{
	if (ctx->tick.repeat != s) {
		ctx->tick.repeat = s;
		ev_timer_again(ctx->loop, &ctx->tick);
	}
}

void soft_tick_need(struct soft_ctx *ctx)
{
	if (!atomic_exchange(&ctx->tick_idle, false) || !ctx->loop)
		return;
	if (soft_in_progress_thread)
		tick_pace(ctx, 0.005); /* inside its loop (io_cb, tick_cb: one thread per context) */
	else
		ev_async_send(ctx->loop, &ctx->wake); /* wake_cb sets the pace */
}

/* Timers of every QP, and socket watching for the QPs nobody polls. Runs every millisecond
 * while the thread is responsible for a QP with timers pending, every 5 ms while some QP needs
 * it otherwise, and every SOFT_TICK_IDLE_S while none does: a QP whose application polls runs
 * its own timers, and neither a busy-polling application nor an idle one should be woken a
 * thousand or two hundred times a second for nothing.
 * Going idle without losing work: tick_idle is set before the scan, and every QP the scan
 * passes over unlocked (below) or finds locked can only get work under its lock, whose release
 * (soft_qp_unlock) then sees the flag and wakes the tick. */
static void tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct soft_ctx *ctx = w->data;
	bool fast = false, need = false;
	(void)revents;
	atomic_store(&ctx->tick_idle, true);
	atomic_thread_fence(memory_order_seq_cst); /* against tx_refused's store: rc_tx.c */
	for (struct soft_qp *qp = ctx->qps; qp; qp = qp->next) {
		/* An RC QP the program alone reads, with no time-driven work (below): nothing to do,
		 * and nothing written (its poll count is looked at again once it has some: the
		 * program then counts as active until SOFT_APP_IDLE_TICKS quiet ticks). With
		 * 10 000 connections the bookkeeping alone was a third of a SIPp UAS's CPU. */
		if (qp->rx_app && !qp->io_on && !__atomic_load_n(&qp->tx_refused, __ATOMIC_RELAXED) &&
		    !__atomic_load_n(&qp->tcp_wait, __ATOMIC_RELAXED))
			continue;
		/* The application counts its polls; reading no clock on its side keeps the polling
		 * loop short. Quiet for SOFT_APP_IDLE_TICKS ticks means it went elsewhere. */
		uint32_t polls = atomic_load_explicit(&qp->app_polls, memory_order_relaxed);
		if (polls != qp->seen_polls) {
			qp->seen_polls = polls;
			qp->quiet_ticks = 0;
		} else if (qp->quiet_ticks < SOFT_APP_IDLE_TICKS) {
			qp->quiet_ticks++;
		}
		bool app_active = ctx->progress == DGV_PROGRESS_AUTO &&
				  (atomic_load(&qp->app_waiting) || qp->quiet_ticks < SOFT_APP_IDLE_TICKS);
		bool held = rx_held(qp);
		if (!app_active && !held && !qp->io_on) {
			ev_io_start(loop, &qp->io);
			qp->io_on = qp->io_used = true;
		} else if ((app_active || held) && qp->io_on) {
			ev_io_stop(loop, &qp->io);
			qp->io_on = false;
		}
		if (!held)
			need = true; /* its reading passes between the program and the thread */
		/* Only a QP with time-driven work is progressed here: reads are the io watcher's
		 * (or the program's), and a progress call costs an RC QP a recv on its socket,
		 * which with thousands of connections was most of a CPU (SIPp at 3 000 calls). An
		 * RC QP the program alone reads has none (soft_rc_timers_pending) unless TCP refused
		 * a send or its connect is not through: not even its lock is taken for it (10 000
		 * connections' trylocks were a quarter of the thread's time) */
		if (qp->rx_app && !__atomic_load_n(&qp->tx_refused, __ATOMIC_RELAXED) &&
		    !__atomic_load_n(&qp->tcp_wait, __ATOMIC_RELAXED))
			continue;
		/* busy: its holder's soft_qp_unlock looks at what it leaves */
		if (timers_pending_trylock(qp) == 1) {
			need = true;
			soft_qp_progress(qp, false, false);
			if (!app_active && timers_pending_trylock(qp) != 0)
				fast = true;
		}
	}
	if (soft_rc_tick(ctx))
		need = true;
	if (need)
		atomic_store(&ctx->tick_idle, false);
	bool idle = atomic_load(&ctx->tick_idle); /* false too when a holder woke it meanwhile */
	tick_pace(ctx, idle ? SOFT_TICK_IDLE_S : fast ? 0.001 : 0.005);
}

static void wake_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	struct soft_ctx *ctx = w->data;
	(void)revents;
	if (atomic_load(&ctx->stopping))
		ev_break(loop, EVBREAK_ALL);
	else if (!atomic_load(&ctx->tick_idle) && ctx->tick.repeat == SOFT_TICK_IDLE_S)
		tick_pace(ctx, 0.005);
}

static void *progress_thread(void *arg)
{
	struct soft_ctx *ctx = arg;
	sigset_t all;
	/* The host program's signals belong to its own threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	soft_in_progress_thread = true;
	dgv_thread_started();
	pthread_mutex_lock(&ctx->loop_lock);
	ev_run(ctx->loop, 0);
	pthread_mutex_unlock(&ctx->loop_lock);
	return NULL;
}

/* soft.h. One iteration of the progress thread passes after fd left libev's epoll set
 * because libev answers an event it had already taken for it with an epoll_ctl, which must not
 * meet the number closed or reused. Bounded: the progress thread may be held up by a lock our
 * caller holds. */
void soft_loop_forget_fd_unlock(struct soft_ctx *ctx, int fd)
{
	if (ctx->loop_epfd >= 0)
		epoll_ctl(ctx->loop_epfd, EPOLL_CTL_DEL, fd, NULL);
	unsigned it = ev_iteration(ctx->loop);
	ev_async_send(ctx->loop, &ctx->wake);
	bool wait = ctx->thread_running && !soft_in_progress_thread;
	pthread_mutex_unlock(&ctx->loop_lock);
	for (int i = 0; wait && i < 2000; i++) {
		pthread_mutex_lock(&ctx->loop_lock);
		bool moved = ev_iteration(ctx->loop) != it;
		pthread_mutex_unlock(&ctx->loop_lock);
		if (moved)
			break;
		if (i < 100)
			sched_yield();
		else
			usleep(25);
	}
}

void soft_ctx_add_qp(struct soft_ctx *ctx, struct soft_qp *qp)
{
	pthread_mutex_lock(&ctx->loop_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	ev_io_init(&qp->io, io_cb, qp->fd, EV_READ);
	qp->io.data = qp;
	qp->io_on = false;
	if (ctx->thread_running && ctx->progress == DGV_PROGRESS_THREAD && !qp->rx_app) {
		ev_io_start(ctx->loop, &qp->io);
		qp->io_on = qp->io_used = true;
		ev_async_send(ctx->loop, &ctx->wake);
	}
	pthread_mutex_unlock(&ctx->loop_lock);
	soft_tick_need(ctx); /* the tick looks at it: it may be one the thread reads */
}

void soft_ctx_remove_qp(struct soft_ctx *ctx, struct soft_qp *qp)
{
	pthread_mutex_lock(&ctx->loop_lock);
	for (struct soft_qp **p = &ctx->qps; *p; p = &(*p)->next)
		if (*p == qp) {
			*p = qp->next;
			break;
		}
	/* an accepted RC QP's descriptor was watched by libev before the QP had a watcher of its
	 * own: its connection request's, stopped but still in libev's epoll set (ThreadSanitizer:
	 * libev's epoll_ctl on it against the caller's close) */
	/* io_used, not io_on: a watcher the tick stopped (the program was active) left the
	 * descriptor in libev's epoll set, which libev touches again lazily (ThreadSanitizer:
	 * libev's epoll_ctl against the close of a SIPp -t tn connection's duplicate) */
	if ((!qp->io_used && !(qp->rc && soft_rc_fd_watched(qp))) || !ctx->loop) {
		pthread_mutex_unlock(&ctx->loop_lock);
		return;
	}
	int fd = qp->io_on ? qp->io.fd : qp->fd;
	if (qp->io_on)
		ev_io_stop(ctx->loop, &qp->io);
	qp->io_on = false;
	/* libev drops a stopped descriptor from its epoll set lazily, at its next iteration, and
	 * answers an event it had already taken for it with an epoll_ctl: after our caller has
	 * closed the descriptor (a stream's, the program's own), or on its number reused meanwhile
	 * (docs/tsan.md). Out of the set now (libev takes the ENOENT of a later MOD as "gone"),
	 * then one iteration of the progress thread lets a batch already taken pass. */
	soft_loop_forget_fd_unlock(ctx, fd);
}

/* Moves an adopted QP to fd, another descriptor of the same kernel socket: the caller is about
 * to close the one the QP ran on while its program keeps the socket by another number (dup,
 * then close), so from now on nothing of ours touches the old number (it may be reused the
 * moment it is closed). Returns 0, -EINVAL (not an adopted QP, or fd not the same socket) or
 * -errno from fstat. Takes the loop lock, then the QP's lock. */
int soft_qp_set_fd(struct dgv_qp *qpb, int fd)
{
	struct soft_qp *qp = to_sqp(qpb);
	struct soft_ctx *ctx = qp->ctx;
	struct stat a, b;
	if (qp->own_fd || qp->fd < 0)
		return -EINVAL;
	if (fstat(fd, &a) || fstat(qp->fd, &b))
		return -errno;
	if (a.st_dev != b.st_dev || a.st_ino != b.st_ino)
		return -EINVAL;
	if (fd == qp->fd)
		return 0;
	pthread_mutex_lock(&ctx->loop_lock);
	bool on = qp->io_on, in_set = qp->io_used || (qp->rc && soft_rc_fd_watched(qp));
	int old = on ? qp->io.fd : qp->fd;
	if (on)
		ev_io_stop(ctx->loop, &qp->io);
	pthread_mutex_lock(&qp->lock);
	qp->fd = fd;
	pthread_mutex_unlock(&qp->lock);
	ev_io_set(&qp->io, fd, EV_READ);
	if (on)
		ev_io_start(ctx->loop, &qp->io);
	if (!in_set || !ctx->loop) {
		pthread_mutex_unlock(&ctx->loop_lock);
		return 0;
	}
	/* the old number out of libev's epoll set now, and a batch already taken for it past,
	 * as when a QP goes (soft_ctx_remove_qp) */
	soft_loop_forget_fd_unlock(ctx, old);
	return 0;
}

static int soft_alloc_pd(struct dgv_context *ctx, struct dgv_pd **out)
{
	struct soft_pd *pd = calloc(1, sizeof *pd);
	if (!pd)
		return -ENOMEM;
	pd->base.ctx = ctx;
	*out = &pd->base;
	return 0;
}

static int soft_dealloc_pd(struct dgv_pd *pdb)
{
	struct soft_pd *pd = to_spd(pdb);
	if (atomic_load(&pd->refs))
		return -EBUSY;
	free(pd);
	return 0;
}

/* The UDP payload the route to addr carries in one unfragmented datagram: the route's MTU
 * (a connected UDP socket's IP_MTU / IPV6_MTU) less the IP and UDP headers, capped at UDP's
 * 65507. Returns 0 when the kernel does not say (no route). */
static uint32_t path_seg_probe(const struct sockaddr *addr, socklen_t len)
{
	int fd = socket(addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	int mtu = 0;
	socklen_t ml = sizeof mtu;
	bool v4 = addr->sa_family == AF_INET;
	if (connect(fd, addr, len) || getsockopt(fd, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_MTU : IPV6_MTU, &mtu, &ml))
		mtu = 0;
	close(fd);
	int seg = mtu - (v4 ? 28 : 48);
	if (mtu <= 0 || seg < 1200)
		return 0;
	return seg > DG_MAX_DATAGRAM ? DG_MAX_DATAGRAM : (uint32_t)seg;
}

/* path_seg_probe's answers by destination host: the route, and so its MTU, is the address's,
 * whatever the port. A server answering many ports of one host (a SIP UAS whose client opens
 * a socket per call) probed once per port: a socket, connect, getsockopt and close (six system
 * calls under the shim) on the way to each new peer's first reply. A route may change: an
 * answer is kept SEG_TTL_US. */
#define SEG_CACHE 64
#define SEG_TTL_US 10000000ull
static struct seg_entry {
	uint64_t at_us; /* 0: empty */
	uint8_t fam, ip[16];
	uint32_t seg;
} seg_cache[SEG_CACHE];
static pthread_mutex_t seg_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t seg_probes;

/* Test hook (tests/unit/test_verbs.c): route probes made so far. */
uint64_t soft_test_path_probes(void);
uint64_t soft_test_path_probes(void) { return atomic_load(&seg_probes); }

/* path_seg_probe, at most once per host and SEG_TTL_US. Takes seg_lock (not across the probe). */
static uint32_t path_seg(const struct sockaddr *addr, socklen_t len)
{
	uint8_t ip[16] = {0};
	if (addr->sa_family == AF_INET)
		memcpy(ip, &((const struct sockaddr_in *)addr)->sin_addr, 4);
	else
		memcpy(ip, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
	uint32_t h = addr->sa_family;
	for (int i = 0; i < 16; i++)
		h = h * 31u + ip[i];
	struct seg_entry *e = &seg_cache[h % SEG_CACHE];
	uint64_t now = dg_now_us();
	pthread_mutex_lock(&seg_lock);
	if (e->at_us && now - e->at_us < SEG_TTL_US && e->fam == addr->sa_family && !memcmp(e->ip, ip, 16)) {
		uint32_t seg = e->seg;
		pthread_mutex_unlock(&seg_lock);
		return seg;
	}
	pthread_mutex_unlock(&seg_lock);
	uint32_t seg = path_seg_probe(addr, len);
	atomic_fetch_add(&seg_probes, 1);
	if (!seg)
		return 0; /* no route (yet): asked again next time */
	pthread_mutex_lock(&seg_lock);
	*e = (struct seg_entry){.at_us = now ? now : 1, .fam = (uint8_t)addr->sa_family, .seg = seg};
	memcpy(e->ip, ip, 16);
	pthread_mutex_unlock(&seg_lock);
	return seg;
}

static int soft_create_ah(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out)
{
	/* one per destination, kept long: not from the program's heap (zpages.c) */
	_Static_assert(sizeof(struct soft_ah) <= DG_SMALL_MAX, "soft_ah fits dg_small_alloc");
	struct soft_ah *ah = dg_small_alloc(sizeof *ah);
	if (!ah)
		return -ENOMEM;
	ah->base.ctx = pd->ctx;
	ah->pd = to_spd(pd);
	ah->base.addrlen = addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	memcpy(&ah->base.addr, addr, ah->base.addrlen);
	ah->path_seg = path_seg(addr, ah->base.addrlen);
	atomic_fetch_add(&ah->pd->refs, 1);
	*out = &ah->base;
	return 0;
}

static int soft_destroy_ah(struct dgv_ah *ahb)
{
	struct soft_ah *ah = (struct soft_ah *)ahb;
	atomic_fetch_sub(&ah->pd->refs, 1);
	dg_small_free(ah, sizeof *ah);
	return 0;
}

static void soft_close(struct dgv_context *cb)
{
	struct soft_ctx *ctx = to_sctx(cb);
	if (ctx->thread_running) {
		atomic_store(&ctx->stopping, true);
		pthread_mutex_lock(&ctx->loop_lock);
		ev_async_send(ctx->loop, &ctx->wake);
		pthread_mutex_unlock(&ctx->loop_lock);
		pthread_join(ctx->thread, NULL);
	}
	soft_rc_ctx_fini(ctx);
	if (ctx->loop)
		ev_loop_destroy(ctx->loop);
	soft_mr_table_fini(ctx);
	pthread_mutex_destroy(&ctx->loop_lock);
	pthread_mutex_destroy(&ctx->mr_lock);
	free(ctx);
}

static const struct dgv_ops soft_ops = {
	.close = soft_close,
	.alloc_pd = soft_alloc_pd,
	.dealloc_pd = soft_dealloc_pd,
	.reg_mr = soft_reg_mr,
	.dereg_mr = soft_dereg_mr,
	.create_cq = soft_create_cq,
	.destroy_cq = soft_destroy_cq,
	.cq_fd = soft_cq_fd,
	.req_notify_cq = soft_req_notify_cq,
	.cq_ack_event = soft_cq_ack_event,
	.cq_notify_background = soft_cq_notify_background,
	.cq_ready = soft_cq_ready,
	.cq_self_driven = soft_cq_self_driven,
	.poll_cq = soft_poll_cq,
	.cq_wait = soft_cq_wait,
	.create_ah = soft_create_ah,
	.destroy_ah = soft_destroy_ah,
	.create_qp = soft_create_qp,
	.destroy_qp = soft_destroy_qp,
	.qp_local_addr = soft_qp_local_addr,
	.post_send = soft_post_send,
	.send_now = soft_send_now,
	.post_recv = soft_post_recv,
	.poll_errq = soft_poll_errq,
	.qp_stats = soft_qp_stats,
	.peek = soft_peek,
	.set_rx_cap = soft_set_rx_cap,
	.qp_peer_gone = soft_qp_peer_gone,
	.qp_rx_feed = soft_qp_rx_feed,
	.qp_set_fd = soft_qp_set_fd,
	.qp_socket_events = soft_qp_socket_events,
	.qp_tx_held = soft_qp_tx_held,
	.qp_rx_claim = soft_qp_rx_claim,
	.qp_discard = soft_qp_discard,
	.qp_rx_stream_feed = soft_qp_rx_stream_feed,
	.cm_create_channel = soft_cm_create_channel,
	.cm_create_channel_on_cq = soft_cm_create_channel_on_cq,
	.cm_destroy_channel = soft_cm_destroy_channel,
	.cm_default_channel = soft_cm_default_channel,
	.cm_channel_fd = soft_cm_channel_fd,
	.cm_get_event = soft_cm_get_event,
	.cm_pending = soft_cm_pending,
	.cm_wait = soft_cm_wait,
	.connect = soft_rc_connect,
	.listen = soft_rc_listen,
	.listener_destroy = soft_rc_listener_destroy,
	.listener_addr = soft_rc_listener_addr,
	.conn_req_adopt = soft_rc_conn_req_adopt,
	.accept = soft_rc_accept,
	.reject = soft_rc_reject,
	.reject_keep = soft_rc_reject_keep,
	.disconnect = soft_rc_disconnect,
	.qp_state = soft_rc_qp_state,
	.conn_info = soft_rc_conn_info,
};

/* The epoll descriptors open now, at most max of them, into v. Returns how many, or -1 when
 * /proc cannot say or there are more. */
static int epoll_fds(int *v, int max)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char link[32];
		if (e->d_name[0] == '.')
			continue;
		ssize_t l = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
		if (l <= 0)
			continue;
		link[l] = 0;
		if (strcmp(link, "anon_inode:[eventpoll]"))
			continue;
		if (n == max) {
			n = -1;
			break;
		}
		v[n++] = atoi(e->d_name);
	}
	closedir(d);
	return n;
}

/* ev_loop_new(flags), and *epfd the epoll descriptor it made (libev's API does not give it:
 * the one that was not there before), or -1 when that is not clear. */
static struct ev_loop *loop_new(unsigned flags, int *epfd)
{
	int before[64], after[65];
	int nb = epoll_fds(before, 64);
	struct ev_loop *loop = ev_loop_new(flags);
	*epfd = -1;
	int na = loop && nb >= 0 && ev_backend(loop) == EVBACKEND_EPOLL ? epoll_fds(after, 65) : -1;
	for (int i = 0; i < na; i++) {
		bool old = false;
		for (int k = 0; k < nb && !old; k++)
			old = after[i] == before[k];
		if (!old)
			*epfd = *epfd == -1 ? after[i] : -2; /* two new ones: another thread's too */
	}
	if (*epfd < 0)
		*epfd = -1;
	return loop;
}

int dgv_soft_open(const struct dgv_context_attr *attr, struct dgv_context **out)
{
	struct soft_ctx *ctx = calloc(1, sizeof *ctx);
	if (!ctx)
		return -ENOMEM;
	ctx->base.ops = &soft_ops;
	ctx->base.name = "soft";
	/* it runs on the caller's kernel sockets, completes in the caller's thread or its own,
	 * and wakes a waiter through an eventfd that any completion raises */
	ctx->base.caps = (struct dgv_caps){
		.qp_types = 1u << DGV_QPT_UD | 1u << DGV_QPT_RD | 1u << DGV_QPT_RC,
		.max_msg_size = 16u << 20, /* a message segments into datagrams (qp.c DEFAULT_MAX_MSG) */
		.flags = DGV_CAP_ADOPT_FD | DGV_CAP_PEEK | DGV_CAP_BACKGROUND | DGV_CAP_DGRAM_READ |
			 DGV_CAP_SEND_INLINE | DGV_CAP_RX_FEED | DGV_CAP_RC_RX_FEED | DGV_CAP_SIGNAL_COSTS |
			 DGV_CAP_RC_TX_HELD | DGV_CAP_RC_SEND_NOW | DGV_CAP_RC_DISCARD,
	};
	ctx->progress = attr ? attr->progress : DGV_PROGRESS_AUTO;
	ctx->loop_epfd = -1;
	if (dg_env_str(DG_ENV_PROGRESS)) {
		/* a bad value: env.c said so; the caller's (auto by default) stands */
		int w = dg_env_word(DG_ENV_PROGRESS);
		if (w == DG_PROGRESS_APP)
			ctx->progress = DGV_PROGRESS_APP;
		else if (w == DG_PROGRESS_THREAD)
			ctx->progress = DGV_PROGRESS_THREAD;
		else if (w == DG_PROGRESS_AUTO)
			ctx->progress = DGV_PROGRESS_AUTO;
	}
	pthread_mutex_init(&ctx->mr_lock, NULL);
	pthread_mutex_init(&ctx->loop_lock, NULL);
	int cerr = soft_rc_ctx_init(ctx);
	if (cerr) {
		pthread_mutex_destroy(&ctx->loop_lock);
		pthread_mutex_destroy(&ctx->mr_lock);
		free(ctx);
		return cerr;
	}
	if (ctx->progress != DGV_PROGRESS_APP) {
		ctx->loop = loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK, &ctx->loop_epfd);
		if (!ctx->loop) {
			/* libev says nothing; its epoll descriptor is what fails at the limit */
			int e = errno == EMFILE || errno == ENFILE ? errno : ENOMEM;
			soft_close(&ctx->base);
			return -e;
		}
		DG_DBG("soft provider: libev's epoll descriptor %d", ctx->loop_epfd);
		ev_set_userdata(ctx->loop, ctx);
		ev_set_loop_release_cb(ctx->loop, loop_release, loop_acquire);
		ev_async_init(&ctx->wake, wake_cb);
		ctx->wake.data = ctx;
		ev_async_start(ctx->loop, &ctx->wake);
		ev_timer_init(&ctx->tick, tick_cb, 0.001, 0.001);
		ctx->tick.data = ctx;
		ev_timer_start(ctx->loop, &ctx->tick);
		int err = pthread_create(&ctx->thread, NULL, progress_thread, ctx);
		if (err) {
			soft_close(&ctx->base);
			return -err;
		}
		ctx->thread_running = true;
	}
	DG_INFO("soft provider opened (progress %s)",
		ctx->progress == DGV_PROGRESS_APP ? "app" : ctx->progress == DGV_PROGRESS_THREAD ? "thread" : "auto");
	*out = &ctx->base;
	return 0;
}
