/*
 * device.c - the ibverbs provider's context, protection domains, memory registration and
 * completion queues. Queue pairs and connections are in qp.c.
 *
 * The device is the one rdma_cm would use for the address the caller names (bind to it if it
 * is local, else resolve it through the routing table), so that the connections rdma_cm makes
 * later land on the same ibv_context as our PDs: rdma_create_qp refuses a PD of another
 * context. We therefore use librdmacm's own per-device contexts (rdma_get_devices, id->verbs)
 * and never open one ourselves.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "ibverbs_int.h"
#include "env.h"
#include "log.h"

_Static_assert(sizeof(struct dgv_sge) == sizeof(struct ibv_sge) &&
		       offsetof(struct dgv_sge, addr) == offsetof(struct ibv_sge, addr) &&
		       offsetof(struct dgv_sge, length) == offsetof(struct ibv_sge, length) &&
		       offsetof(struct dgv_sge, lkey) == offsetof(struct ibv_sge, lkey),
	       "dgv_sge is handed to the device as ibv_sge");

uint64_t iv_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

const char *iv_addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char a[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)sa;
		inet_ntop(AF_INET, &s->sin_addr, a, sizeof a);
		port = ntohs(s->sin_port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)sa;
		inet_ntop(AF_INET6, &s->sin6_addr, a, sizeof a);
		port = ntohs(s->sin6_port);
	}
	snprintf(buf, len, sa && sa->sa_family == AF_INET6 ? "[%s]:%u" : "%s:%u", a, port);
	return buf;
}

/* Waits (bounded) for the next event on a private channel; it must be `want`. 0 or -errno. */
int iv_wait_event(struct rdma_event_channel *rch, enum rdma_cm_event_type want, int timeout_ms,
		  int *status)
{
	struct pollfd p = {.fd = rch->fd, .events = POLLIN};
	struct rdma_cm_event *ev;
	int r = poll(&p, 1, timeout_ms);
	if (r == 0)
		return -ETIMEDOUT;
	if (r < 0)
		return -errno;
	if (rdma_get_cm_event(rch, &ev))
		return -errno;
	enum rdma_cm_event_type got = ev->event;
	if (status)
		*status = ev->status;
	rdma_ack_cm_event(ev);
	if (got == want)
		return 0;
	DG_DBG("ibverbs: expected %s, got %s", rdma_event_str(want), rdma_event_str(got));
	return got == RDMA_CM_EVENT_ADDR_ERROR || got == RDMA_CM_EVENT_ROUTE_ERROR ? -EHOSTUNREACH : -EPROTO;
}

/* ---------------------------------------------------------------- context */

static struct ibv_context *ctx_by_addr(const struct sockaddr *addr, socklen_t len, char *why, size_t whylen,
				       bool *local)
{
	struct rdma_event_channel *rch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	struct ibv_context *v = NULL;
	union dgv_sockaddr a;
	char s[64];
	if (!rch) {
		snprintf(why, whylen, "librdmacm: %s (no RDMA device, or rdma_ucm not loaded)", strerror(errno));
		return NULL;
	}
	memset(&a, 0, sizeof a);
	memcpy(&a, addr, len < sizeof a ? len : sizeof a);
	if (a.sa.sa_family == AF_INET)
		a.sin.sin_port = 0;
	else
		a.sin6.sin6_port = 0;
	if (rdma_create_id(rch, &id, NULL, RDMA_PS_TCP)) {
		snprintf(why, whylen, "rdma_create_id: %s", strerror(errno));
		goto out;
	}
	/* A local address: the device under its netdev. Otherwise the device that would carry
	 * traffic to it (rdma_cm resolves through the routing table). */
	if (rdma_bind_addr(id, &a.sa) == 0 && id->verbs) {
		v = id->verbs;
		*local = true;
		goto out;
	}
	rdma_destroy_id(id);
	id = NULL;
	if (rdma_create_id(rch, &id, NULL, RDMA_PS_TCP) == 0 && rdma_resolve_addr(id, NULL, &a.sa, 2000) == 0 &&
	    iv_wait_event(rch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000, NULL) == 0 && id->verbs)
		v = id->verbs;
	else
		snprintf(why, whylen, "address %s is not reached through an RDMA device's netdev",
			 iv_addr_str(addr, s, sizeof s));
out:
	if (id)
		rdma_destroy_id(id);
	rdma_destroy_event_channel(rch);
	return v;
}

static struct ibv_context *ctx_by_name(const char *name, char *why, size_t whylen)
{
	int n = 0;
	struct ibv_context **list = rdma_get_devices(&n), *v = NULL;
	if (!list || n == 0) {
		snprintf(why, whylen, "no RDMA device (%s)",
			 !list ? strerror(errno) : "libibverbs lists none: is a driver such as rdma_rxe or siw loaded?");
		if (list)
			rdma_free_devices(list);
		return NULL;
	}
	for (int i = 0; i < n && !v; i++) {
		if (name) {
			if (!strcmp(ibv_get_device_name(list[i]->device), name))
				v = list[i];
			continue;
		}
		struct ibv_port_attr pa;
		if (ibv_query_port(list[i], 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE)
			v = list[i];
	}
	if (!v)
		snprintf(why, whylen, name ? "no RDMA device named %s" : "no RDMA device with an active port%s",
			 name ? name : "");
	rdma_free_devices(list);
	return v;
}

static void iv_close(struct dgv_context *cb)
{
	struct iv_ctx *ctx = to_ictx(cb);
	iv_ud_close(ctx);
	if (ctx->defch)
		iv_chan_free(ctx->defch);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

/* ---------------------------------------------------------------- PD and MR */

static int iv_alloc_pd(struct dgv_context *cb, struct dgv_pd **out)
{
	struct iv_ctx *ctx = to_ictx(cb);
	struct iv_pd *pd = calloc(1, sizeof *pd);
	if (!pd)
		return -ENOMEM;
	pd->pd = ibv_alloc_pd(ctx->verbs);
	if (!pd->pd) {
		int err = errno ? -errno : -ENOMEM;
		free(pd);
		return err;
	}
	pd->base.ctx = cb;
	pthread_mutex_init(&pd->lock, NULL);
	*out = &pd->base;
	return 0;
}

static int iv_dealloc_pd(struct dgv_pd *pb)
{
	struct iv_pd *pd = to_ipd(pb);
	pthread_mutex_lock(&pd->lock);
	bool busy = pd->nmrs || pd->nqps;
	pthread_mutex_unlock(&pd->lock);
	if (busy)
		return -EBUSY;
	int r = ibv_dealloc_pd(pd->pd);
	if (r)
		return -r;
	pthread_mutex_destroy(&pd->lock);
	free(pd);
	return 0;
}

static unsigned mr_bucket(uintptr_t addr, size_t len, unsigned access)
{
	uint64_t h = (uint64_t)addr * 0x9E3779B97F4A7C15ull ^ (uint64_t)len * 0xC2B2AE3D27D4EB4Full ^ access;
	return (unsigned)(h >> 58) & (IV_MR_BUCKETS - 1);
}

/*
 * The registration cache: a region registered again with the same address, length and
 * access gets the same registration (and a reference), so a program that registers per
 * message pays the pinning once while any registration of it is live. Entries are dropped at
 * the last dereg: we have no munmap hook, and a registration kept past its last user could
 * pin pages the program has unmapped and mapped anew (the classic stale-cache bug).
 */
static int iv_reg_mr(struct dgv_pd *pb, void *addr, size_t len, unsigned access, struct dgv_mr **out)
{
	struct iv_pd *pd = to_ipd(pb);
	struct iv_ctx *ctx = to_ictx(pb->ctx);
	unsigned b = mr_bucket((uintptr_t)addr, len, access);
	pthread_mutex_lock(&pd->lock);
	for (struct iv_mr *m = pd->mrs[b]; m; m = m->next)
		if (m->pub.addr == addr && m->pub.length == len && m->pub.access == access) {
			m->refs++;
			pthread_mutex_unlock(&pd->lock);
			*out = &m->pub;
			return 0;
		}
	int ia = 0;
	if (access & DGV_ACCESS_LOCAL_WRITE)
		ia |= IBV_ACCESS_LOCAL_WRITE;
	if (access & DGV_ACCESS_REMOTE_WRITE)
		ia |= IBV_ACCESS_REMOTE_WRITE;
	if (access & DGV_ACCESS_REMOTE_READ)
		ia |= IBV_ACCESS_REMOTE_READ;
	/* iWARP places a Read Response through the sink's STag like a Write (RFC 5040 4.4), so
	 * a device refuses a Read into a region without remote write. The soft provider has no
	 * such rule; to keep Read working the same, locally writable regions get it too on iWARP.
	 * The STag reaches the peer only inside our own Read Requests. */
	if (ctx->iwarp && (ia & IBV_ACCESS_LOCAL_WRITE))
		ia |= IBV_ACCESS_REMOTE_WRITE;
	struct iv_mr *m = calloc(1, sizeof *m);
	if (!m) {
		pthread_mutex_unlock(&pd->lock);
		return -ENOMEM;
	}
	m->mr = ibv_reg_mr(pd->pd, addr, len, ia);
	if (!m->mr) {
		int err = errno ? -errno : -ENOMEM;
		pthread_mutex_unlock(&pd->lock);
		free(m);
		DG_WARN("ibverbs: ibv_reg_mr(%zu bytes) on %s: %s", len, ctx->dev, strerror(-err));
		return err;
	}
	m->pub = (struct dgv_mr){.addr = addr, .length = len, .lkey = m->mr->lkey, .rkey = m->mr->rkey,
				 .access = access, .pd = pb};
	m->refs = 1;
	m->next = pd->mrs[b];
	pd->mrs[b] = m;
	pd->nmrs++;
	pthread_mutex_unlock(&pd->lock);
	*out = &m->pub;
	return 0;
}

static int iv_dereg_mr(struct dgv_mr *pub)
{
	struct iv_mr *m = (struct iv_mr *)pub;
	struct iv_pd *pd = to_ipd(pub->pd);
	unsigned b = mr_bucket((uintptr_t)pub->addr, pub->length, pub->access);
	pthread_mutex_lock(&pd->lock);
	if (--m->refs) {
		pthread_mutex_unlock(&pd->lock);
		return 0;
	}
	for (struct iv_mr **pp = &pd->mrs[b]; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	pd->nmrs--;
	pthread_mutex_unlock(&pd->lock);
	int r = ibv_dereg_mr(m->mr);
	free(m);
	return -r;
}

/*
 * Write-Record target lookup (qp.c's immediate encoding): the remotely writable region of the
 * PD that holds [addr, addr + len) where addr's low 32 bits are imm_lo. Returns true and fills
 * stag/base when exactly one region matches (the first one when several do, logged).
 */
bool iv_record_target(struct iv_pd *pd, uint32_t imm_lo, uint32_t len, uint32_t *stag, uint64_t *base)
{
	int found = 0;
	pthread_mutex_lock(&pd->lock);
	for (unsigned b = 0; b < IV_MR_BUCKETS; b++)
		for (struct iv_mr *m = pd->mrs[b]; m; m = m->next) {
			if (!(m->pub.access & DGV_ACCESS_REMOTE_WRITE))
				continue;
			uint64_t lo = (uintptr_t)m->pub.addr, hi = lo + m->pub.length;
			uint64_t a = (lo & ~0xffffffffull) | imm_lo;
			if (a < lo)
				a += 1ull << 32;
			if (a + len > hi)
				continue;
			if (!found++) {
				*stag = m->pub.rkey;
				*base = a;
			}
		}
	pthread_mutex_unlock(&pd->lock);
	if (found > 1)
		DG_WARN("ibverbs: Write-Record at ...%08x (%u bytes) matches %d regions; reporting STag %#x",
			imm_lo, len, found, *stag);
	return found > 0;
}

/* ---------------------------------------------------------------- CQ */

static int iv_create_cq(struct dgv_context *cb, int cqe, struct dgv_cq **out)
{
	struct iv_ctx *ctx = to_ictx(cb);
	struct iv_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		return -ENOMEM;
	cq->base.ctx = cb;
	cq->ch = ibv_create_comp_channel(ctx->verbs);
	if (!cq->ch)
		goto fail;
	/* dgv_cq_ack_event must never block: the channel fd is non-blocking */
	int fl = fcntl(cq->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(cq->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		goto fail;
	if (cqe > ctx->dattr.max_cqe)
		cqe = ctx->dattr.max_cqe;
	cq->cq = ibv_create_cq(ctx->verbs, cqe, cq, cq->ch, 0);
	if (!cq->cq)
		goto fail;
	pthread_mutex_init(&cq->lock, NULL);
	*out = &cq->base;
	return 0;
fail:;
	int err = errno ? -errno : -ENOMEM;
	if (cq->ch)
		ibv_destroy_comp_channel(cq->ch);
	free(cq);
	return err;
}

static int iv_destroy_cq(struct dgv_cq *cb)
{
	struct iv_cq *cq = to_icq(cb);
	pthread_mutex_lock(&cq->lock);
	bool busy = cq->nqps > 0;
	pthread_mutex_unlock(&cq->lock);
	if (busy)
		return -EBUSY;
	int r = ibv_destroy_cq(cq->cq);
	if (r)
		return -r;
	ibv_destroy_comp_channel(cq->ch);
	pthread_mutex_destroy(&cq->lock);
	free(cq);
	return 0;
}

static int iv_cq_fd(struct dgv_cq *cb) { return to_icq(cb)->ch->fd; }

static int iv_req_notify_cq(struct dgv_cq *cb, int solicited_only)
{
	struct iv_cq *cq = to_icq(cb);
	int r = ibv_req_notify_cq(cq->cq, solicited_only);
	if (r)
		return -r;
	/* Completions stashed by dgv_cq_wait are not in the device's CQ any more, so arming
	 * would not report them: make the fd readable ourselves (as the soft provider does). */
	if (!solicited_only && __atomic_load_n(&cq->nstash, __ATOMIC_ACQUIRE))
		DG_DBG("ibverbs: req_notify with %d stashed completions", cq->nstash);
	return 0;
}

static int iv_cq_ack_event(struct dgv_cq *cb)
{
	struct iv_cq *cq = to_icq(cb);
	struct ibv_cq *ecq;
	void *ectx;
	if (ibv_get_cq_event(cq->ch, &ecq, &ectx))
		return errno == EAGAIN ? 0 : -errno;
	/* Acked at once: ibv_destroy_cq waits for every event it handed out to be acked. */
	ibv_ack_cq_events(ecq, 1);
	return 0;
}

static int iv_cq_notify_background(struct dgv_cq *cb, int on)
{
	/* A device completes on its own all the time: there is no "background" to single out, and
	 * an unarmed channel never fires. Callers must arm (dgv_req_notify_cq) instead. */
	DG_INFO("ibverbs: dgv_cq_notify_background not supported (arm the CQ with dgv_req_notify_cq)");
	return on ? -EOPNOTSUPP : 0;
}

int iv_cq_ready(struct dgv_cq *cb)
{
	struct iv_cq *cq = to_icq(cb);
	if (pthread_mutex_trylock(&cq->lock))
		return __atomic_load_n(&cq->nstash, __ATOMIC_RELAXED);
	if (!cq->nstash) {
		int n = ibv_poll_cq(cq->cq, IV_STASH, cq->stash);
		if (n > 0) {
			iv_note_sends(cq, cq->stash, n);
			cq->sthead = 0;
			__atomic_store_n(&cq->nstash, n, __ATOMIC_RELEASE);
		}
	}
	int n = cq->nstash;
	pthread_mutex_unlock(&cq->lock);
	return n;
}

static int iv_cq_wait(struct dgv_cq *cb, int timeout_ms)
{
	struct iv_cq *cq = to_icq(cb);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : iv_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		iv_run_accepts(to_ictx(cb->ctx));
		if (iv_cq_ready(cb) > 0)
			return 0;
		int r = ibv_req_notify_cq(cq->cq, 0);
		if (r)
			return -r;
		if (iv_cq_ready(cb) > 0) /* one that came before the arm */
			return 0;
		uint64_t now = iv_now_ms();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = cq->ch->fd, .events = POLLIN};
		int left = deadline == UINT64_MAX ? -1 : (int)(deadline - now);
		/* bounded so a deferred accept (iv_run_accepts) is not held up by a long wait */
		if (left < 0 || left > 100)
			left = atomic_load_explicit(&to_ictx(cb->ctx)->naccepts, memory_order_relaxed) ? 10 : left;
		r = poll(&p, 1, left);
		if (r < 0 && errno == EINTR)
			return -EINTR;
		if (r > 0)
			iv_cq_ack_event(cb);
	}
}

/* ---------------------------------------------------------------- open */

static const struct dgv_ops iv_ops = {
	.close = iv_close,
	.alloc_pd = iv_alloc_pd,
	.dealloc_pd = iv_dealloc_pd,
	.reg_mr = iv_reg_mr,
	.dereg_mr = iv_dereg_mr,
	.create_cq = iv_create_cq,
	.destroy_cq = iv_destroy_cq,
	.cq_fd = iv_cq_fd,
	.req_notify_cq = iv_req_notify_cq,
	.cq_ack_event = iv_cq_ack_event,
	.cq_notify_background = iv_cq_notify_background,
	.cq_ready = iv_cq_ready,
	.poll_cq = iv_poll_cq,
	.cq_wait = iv_cq_wait,
	.create_ah = iv_create_ah,
	.destroy_ah = iv_destroy_ah,
	.create_qp = iv_create_qp,
	.destroy_qp = iv_destroy_qp,
	.qp_local_addr = iv_qp_local_addr,
	.post_send = iv_post_send,
	.post_recv = iv_post_recv,
	.poll_errq = iv_poll_errq,
	.qp_stats = iv_qp_stats,
	.cm_create_channel = iv_cm_create_channel,
	.cm_destroy_channel = iv_cm_destroy_channel,
	.cm_default_channel = iv_cm_default_channel,
	.cm_channel_fd = iv_cm_channel_fd,
	.cm_get_event = iv_cm_get_event,
	.cm_pending = iv_cm_pending,
	.cm_wait = iv_cm_wait,
	.connect = iv_connect,
	.listen = iv_listen,
	.listener_destroy = iv_listener_destroy,
	.listener_addr = iv_listener_addr,
	.conn_req_adopt = iv_conn_req_adopt,
	.accept = iv_accept,
	.reject = iv_reject,
	.disconnect = iv_disconnect,
	.qp_state = iv_qp_state,
	.conn_info = iv_conn_info,
};

/* An iWARP device chosen by name: the IPv4 address of its netdev, found by the MAC address its
 * GID holds (siw, and iWARP NICs, use the netdev's MAC as GID), so that listeners and QPs
 * without an address have one (rdma_cm will not listen on the wildcard beside an iWARP device
 * whose ports are the kernel's). Leaves have_addr false when none is found. */
static void iwarp_addr(struct iv_ctx *ctx)
{
	union ibv_gid g;
	static const uint8_t zero[6];
	if (ibv_query_gid(ctx->verbs, 1, 0, &g) || !memcmp(g.raw, zero, 6))
		return;
	struct ifaddrs *ifa;
	if (getifaddrs(&ifa))
		return;
	const char *ifname = NULL;
	for (struct ifaddrs *i = ifa; i && !ifname; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_PACKET) {
			const struct sockaddr_ll *ll = (const struct sockaddr_ll *)i->ifa_addr;
			if (ll->sll_halen == 6 && !memcmp(ll->sll_addr, g.raw, 6))
				ifname = i->ifa_name;
		}
	for (struct ifaddrs *i = ifa; i && ifname && !ctx->have_addr; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !strcmp(i->ifa_name, ifname)) {
			memcpy(&ctx->addr.sin, i->ifa_addr, sizeof ctx->addr.sin);
			ctx->addr.sin.sin_port = 0;
			ctx->have_addr = true;
		}
	char a[INET_ADDRSTRLEN] = "none";
	if (ctx->have_addr)
		inet_ntop(AF_INET, &ctx->addr.sin.sin_addr, a, sizeof a);
	DG_DBG("ibverbs: %s's netdev (GID %02x:%02x:%02x:%02x:%02x:%02x): %s, IPv4 address %s", ctx->dev, g.raw[0],
	       g.raw[1], g.raw[2], g.raw[3], g.raw[4], g.raw[5], ifname ? ifname : "not found", a);
	freeifaddrs(ifa);
}

/* per thread: dgv_open may run in several at once; initial-exec as soft/cq.c (the shim is
 * preloaded, and a dynamic TLS access may allocate) */
static __thread char open_why[256] __attribute__((tls_model("initial-exec")));

const char *dgv_ibverbs_why(void) { return open_why; }

int dgv_ibverbs_open(const struct dgv_context_attr *attr, struct dgv_context **out)
{
	const char *name = attr && attr->device ? attr->device : dg_env_str(DG_ENV_IBV_DEVICE);
	struct ibv_context *v;
	bool local = false;
	if (name && !*name)
		name = NULL;
	/* libibverbs and librdmacm are loaded here, at the first open (syms.h) */
	if (iv_syms_load(open_why, sizeof open_why)) {
		DG_INFO("ibverbs: %s", open_why);
		return -ENODEV;
	}
	if (attr && attr->addr && !name)
		v = ctx_by_addr(attr->addr, attr->addrlen, open_why, sizeof open_why, &local);
	else
		v = ctx_by_name(name, open_why, sizeof open_why);
	if (!v) {
		DG_INFO("ibverbs: %s", open_why);
		return -ENODEV;
	}
	struct iv_ctx *ctx = calloc(1, sizeof *ctx);
	if (!ctx)
		return -ENOMEM;
	ctx->base.ops = &iv_ops;
	ctx->base.name = "ibverbs";
	ctx->verbs = v;
	snprintf(ctx->dev, sizeof ctx->dev, "%s", ibv_get_device_name(v->device));
	ctx->iwarp = v->device->transport_type == IBV_TRANSPORT_IWARP;
	/* an iWARP device has RC only (no UD in iWARP); RoCE/InfiniBand have both */
	ctx->base.caps = (struct dgv_caps){
		.qp_types = 1u << DGV_QPT_RC | (ctx->iwarp ? 0u : 1u << DGV_QPT_UD),
		.max_msg_size = IV_UD_MAX_MSG,
		.flags = DGV_CAP_ARM_ONCE | DGV_CAP_BUSY_POLL | DGV_CAP_SIGNAL_COSTS | DGV_CAP_RC_WREC_AS_SEND |
			 DGV_CAP_UD_SIDR,
	};
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_mutex_init(&ctx->ud_lock, NULL);
	ctx->sidr_ep = ctx->sidr_efd = -1;
	if (local) {
		/* UD QPs without a bind address are reached here */
		memcpy(&ctx->addr, attr->addr, attr->addrlen < sizeof ctx->addr ? attr->addrlen : sizeof ctx->addr);
		if (ctx->addr.sa.sa_family == AF_INET)
			ctx->addr.sin.sin_port = 0;
		else
			ctx->addr.sin6.sin6_port = 0;
		ctx->have_addr = true;
	}
	if (!local && !ctx->iwarp) {
		/* chosen by name: the device's own IPv4 address, from its RoCE GID table (an
		 * IPv4-mapped GID), so that UD QPs and listeners without an address have one */
		union ibv_gid g;
		static const uint8_t v4m[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		for (int i = 0; i < 16 && !ctx->have_addr; i++)
			if (ibv_query_gid(v, 1, i, &g) == 0 && !memcmp(g.raw, v4m, sizeof v4m)) {
				ctx->addr.sin.sin_family = AF_INET;
				memcpy(&ctx->addr.sin.sin_addr, g.raw + 12, 4);
				ctx->have_addr = true;
			}
	}
	if (!ctx->have_addr && ctx->iwarp)
		iwarp_addr(ctx);
	int r = ibv_query_device(v, &ctx->dattr);
	if (r) {
		snprintf(open_why, sizeof open_why, "ibv_query_device(%s): %s", ctx->dev, strerror(r));
		free(ctx);
		return -ENODEV;
	}
	/* async events are read from the CM calls, never waited for (qp.c) */
	int fl = fcntl(v->async_fd, F_GETFL);
	if (fl >= 0)
		fcntl(v->async_fd, F_SETFL, fl | O_NONBLOCK);
	r = iv_chan_new(ctx, &ctx->defch);
	if (r) {
		snprintf(open_why, sizeof open_why, "rdma_create_event_channel: %s", strerror(-r));
		free(ctx);
		return r;
	}
	snprintf(open_why, sizeof open_why, "device %s (%s)", ctx->dev, ctx->iwarp ? "iWARP" : "InfiniBand/RoCE");
	DG_INFO("ibverbs: %s", open_why);
	*out = &ctx->base;
	return 0;
}
