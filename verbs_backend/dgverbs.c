/* dgverbs.c - verbs front end: argument checks and dispatch to the provider (provider.h). */
#include "provider.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "env.h"
#include "log.h"

/* DGSHIM_PROVIDER as a kind. Returns it, or -EINVAL (env.c said why). */
static int provider_from_env(void)
{
	switch (dg_env_word(DG_ENV_PROVIDER)) {
	case DG_PROVIDER_AUTO:
		return DGV_PROV_AUTO;
	case DG_PROVIDER_SOFT:
		return DGV_PROV_SOFT;
	case DG_PROVIDER_IBVERBS:
		return DGV_PROV_IBVERBS;
	default:
		return -EINVAL;
	}
}

int dgv_open(const struct dgv_context_attr *attr, struct dgv_context **out)
{
	struct dgv_context_attr a = {0};
	if (!out)
		return -EINVAL;
	if (attr)
		a = *attr;
	if (a.provider == DGV_PROV_AUTO) {
		int p = provider_from_env();
		if (p < 0)
			return p;
		a.provider = (enum dgv_provider_kind)p;
	}
	char why[160] = "";
	int r = -EINVAL;
	switch (a.provider) {
	case DGV_PROV_AUTO:
#ifdef DGV_HAVE_IBVERBS
		/* A device is chosen by the address (or name) the caller will use it for; without
		 * one there is no telling whether a device would reach the peer, so soft. */
		if (!a.addr && !a.device && !dg_env_str(DG_ENV_IBV_DEVICE)) {
			snprintf(why, sizeof why, "auto: soft (no address or device name to choose an RDMA device by)");
		} else {
			r = dgv_ibverbs_open(&a, out);
			if (r == 0) {
				snprintf(why, sizeof why, "auto: ibverbs (%s)", dgv_ibverbs_why());
				DG_INFO("provider %s", why);
				break;
			}
			snprintf(why, sizeof why, "auto: soft (ibverbs: %s)", r == -ENODEV ? dgv_ibverbs_why() : strerror(-r));
		}
#else
		snprintf(why, sizeof why, "auto: soft (no ibverbs backend built)");
#endif
		DG_INFO("provider %s", why);
		r = dgv_soft_open(&a, out);
		break;
	case DGV_PROV_SOFT:
		snprintf(why, sizeof why, "soft: asked for");
		r = dgv_soft_open(&a, out);
		break;
	case DGV_PROV_IBVERBS:
#ifdef DGV_HAVE_IBVERBS
		r = dgv_ibverbs_open(&a, out);
		if (r)
			DG_ERR("provider ibverbs: %s", r == -ENODEV ? dgv_ibverbs_why() : strerror(-r));
		else
			snprintf(why, sizeof why, "ibverbs: asked for (%s)", dgv_ibverbs_why());
#else
		DG_ERR("provider ibverbs requested but this build has no ibverbs backend "
		       "(libibverbs-dev and librdmacm-dev were not found)");
		r = -ENODEV;
#endif
		break;
	}
	if (r == 0)
		snprintf((*out)->why, sizeof (*out)->why, "%s", why);
	return r;
}

void dgv_close(struct dgv_context *ctx)
{
	if (ctx)
		ctx->ops->close(ctx);
}

static void (*thread_hook)(void);

void dgv_set_thread_hook(void (*fn)(void)) { __atomic_store_n(&thread_hook, fn, __ATOMIC_RELEASE); }

void dgv_thread_started(void)
{
	void (*fn)(void) = __atomic_load_n(&thread_hook, __ATOMIC_ACQUIRE);
	if (fn)
		fn();
}

const char *dgv_provider_name(const struct dgv_context *ctx)
{
	return ctx ? ctx->name : "none";
}

const char *dgv_provider_why(const struct dgv_context *ctx)
{
	return ctx ? ctx->why : "no context";
}

int dgv_query_caps(const struct dgv_context *ctx, struct dgv_caps *out)
{
	if (!ctx || !out)
		return -EINVAL;
	*out = ctx->caps;
	return 0;
}

int dgv_alloc_pd(struct dgv_context *ctx, struct dgv_pd **out)
{
	if (!ctx || !out)
		return -EINVAL;
	return ctx->ops->alloc_pd(ctx, out);
}

int dgv_dealloc_pd(struct dgv_pd *pd)
{
	return pd ? pd->ctx->ops->dealloc_pd(pd) : -EINVAL;
}

int dgv_reg_mr(struct dgv_pd *pd, void *addr, size_t length, unsigned access, struct dgv_mr **out)
{
	if (!pd || !out || (!addr && length) || (access & ~7u))
		return -EINVAL;
	/* Remote write without local write is refused by the verbs specifications too. */
	if ((access & DGV_ACCESS_REMOTE_WRITE) && !(access & DGV_ACCESS_LOCAL_WRITE))
		return -EINVAL;
	return pd->ctx->ops->reg_mr(pd, addr, length, access, out);
}

int dgv_dereg_mr(struct dgv_mr *mr)
{
	return mr ? mr->pd->ctx->ops->dereg_mr(mr) : -EINVAL;
}

int dgv_create_cq(struct dgv_context *ctx, int cqe, struct dgv_cq **out)
{
	if (!ctx || !out || cqe <= 0 || cqe > (1 << 22))
		return -EINVAL;
	return ctx->ops->create_cq(ctx, cqe, out);
}

int dgv_destroy_cq(struct dgv_cq *cq) { return cq ? cq->ctx->ops->destroy_cq(cq) : -EINVAL; }
int dgv_cq_fd(struct dgv_cq *cq) { return cq ? cq->ctx->ops->cq_fd(cq) : -EINVAL; }
int dgv_req_notify_cq(struct dgv_cq *cq, int so) { return cq ? cq->ctx->ops->req_notify_cq(cq, so) : -EINVAL; }
int dgv_cq_ack_event(struct dgv_cq *cq) { return cq ? cq->ctx->ops->cq_ack_event(cq) : -EINVAL; }
int dgv_cq_notify_background(struct dgv_cq *cq, int on)
{
	return cq ? cq->ctx->ops->cq_notify_background(cq, on) : -EINVAL;
}
int dgv_cq_ready(struct dgv_cq *cq) { return cq ? cq->ctx->ops->cq_ready(cq) : -EINVAL; }
int dgv_cq_self_driven(struct dgv_cq *cq)
{
	return cq && cq->ctx->ops->cq_self_driven ? cq->ctx->ops->cq_self_driven(cq) : 0;
}

int dgv_poll_cq(struct dgv_cq *cq, int n, struct dgv_wc *wc)
{
	if (!cq || n < 0 || (n && !wc))
		return -EINVAL;
	return cq->ctx->ops->poll_cq(cq, n, wc);
}

int dgv_cq_wait(struct dgv_cq *cq, int timeout_ms)
{
	return cq ? cq->ctx->ops->cq_wait(cq, timeout_ms) : -EINVAL;
}

int dgv_create_ah(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out)
{
	if (!pd || !addr || !out)
		return -EINVAL;
	if (!((addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) ||
	      (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))))
		return -EAFNOSUPPORT;
	return pd->ctx->ops->create_ah(pd, addr, len, out);
}

int dgv_destroy_ah(struct dgv_ah *ah) { return ah ? ah->ctx->ops->destroy_ah(ah) : -EINVAL; }

int dgv_create_qp(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out)
{
	if (!pd || !attr || !out || !attr->send_cq || !attr->recv_cq)
		return -EINVAL;
	if (attr->qp_type != DGV_QPT_UD && attr->qp_type != DGV_QPT_RD && attr->qp_type != DGV_QPT_RC)
		return -EINVAL;
	if (attr->seg_size > 65507u)
		return -EINVAL;
	return pd->ctx->ops->create_qp(pd, attr, out);
}

int dgv_destroy_qp(struct dgv_qp *qp) { return qp ? qp->ctx->ops->destroy_qp(qp) : -EINVAL; }

int dgv_qp_local_addr(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len)
{
	if (!qp || !out || !len)
		return -EINVAL;
	return qp->ctx->ops->qp_local_addr(qp, out, len);
}

enum dgv_qp_type dgv_qp_type(const struct dgv_qp *qp) { return qp->type; }

int dgv_post_send(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad)
{
	struct dgv_send_wr *dummy;
	if (!bad)
		bad = &dummy;
	*bad = wr;
	if (!qp || !wr)
		return -EINVAL;
	if (__builtin_expect((wr->send_flags & DGV_SEND_NOW) != 0, 0)) {
		if (!(qp->ctx->caps.flags & DGV_CAP_RC_SEND_NOW) || qp->type != DGV_QPT_RC)
			return -EOPNOTSUPP;
		if (wr->next)
			return -EINVAL;
	}
	return qp->ctx->ops->post_send(qp, wr, bad);
}

int dgv_send_now(struct dgv_qp *qp, struct dgv_ah *ah, const struct iovec *iov, int iovcnt)
{
	if (!qp || !ah || (iovcnt && !iov) || iovcnt < 0)
		return -EINVAL;
	return qp->ctx->ops->send_now ? qp->ctx->ops->send_now(qp, ah, iov, iovcnt) : -EOPNOTSUPP;
}

int dgv_post_recv(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad)
{
	struct dgv_recv_wr *dummy;
	if (!bad)
		bad = &dummy;
	*bad = wr;
	if (!qp || !wr)
		return -EINVAL;
	return qp->ctx->ops->post_recv(qp, wr, bad);
}

int dgv_poll_errq(struct dgv_qp *qp, int n, struct dgv_async_err *out)
{
	if (!qp || n < 0 || (n && !out))
		return -EINVAL;
	return qp->ctx->ops->poll_errq(qp, n, out);
}

int dgv_qp_stats(struct dgv_qp *qp, struct dgv_qp_stats *out)
{
	if (!qp || !out)
		return -EINVAL;
	return qp->ctx->ops->qp_stats(qp, out);
}

int dgv_peek(struct dgv_qp *qp, void *buf, size_t len, struct dgv_peek *out)
{
	if (!qp || !out || (len && !buf))
		return -EINVAL;
	return qp->ctx->ops->peek ? qp->ctx->ops->peek(qp, buf, len, out) : -EOPNOTSUPP;
}

int dgv_qp_set_rx_cap(struct dgv_qp *qp, unsigned n)
{
	if (!qp)
		return -EINVAL;
	return qp->ctx->ops->set_rx_cap ? qp->ctx->ops->set_rx_cap(qp, n) : -EOPNOTSUPP;
}

int dgv_qp_rx_feed(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
		   socklen_t srclen)
{
	if (!qp || (!dgram && len) || !src || !srclen || srclen > sizeof(union dgv_sockaddr))
		return -EINVAL;
	return qp->ctx->ops->qp_rx_feed ? qp->ctx->ops->qp_rx_feed(qp, dgram, len, src, srclen, 0, NULL)
					: -EOPNOTSUPP;
}

int dgv_qp_rx_take(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
		   socklen_t srclen, uint32_t max, struct dgv_rx_msg *out)
{
	if (!qp || (!dgram && len) || !src || !srclen || srclen > sizeof(union dgv_sockaddr) || !out)
		return -EINVAL;
	return qp->ctx->ops->qp_rx_feed ? qp->ctx->ops->qp_rx_feed(qp, dgram, len, src, srclen, max, out)
					: -EOPNOTSUPP;
}

int dgv_qp_socket_events(struct dgv_qp *qp)
{
	return qp && qp->ctx->ops->qp_socket_events ? qp->ctx->ops->qp_socket_events(qp) : 0;
}

int dgv_qp_tx_held(struct dgv_qp *qp)
{
	if (!qp)
		return -EINVAL;
	return qp->ctx->ops->qp_tx_held ? qp->ctx->ops->qp_tx_held(qp) : -EOPNOTSUPP;
}

int dgv_qp_discard(struct dgv_qp *qp, void *addr, size_t len)
{
	if (!qp || (len && !addr) || (uintptr_t)addr + len < (uintptr_t)addr)
		return -EINVAL;
	if (!(qp->ctx->caps.flags & DGV_CAP_RC_DISCARD) || qp->type != DGV_QPT_RC)
		return -EOPNOTSUPP;
	return qp->ctx->ops->qp_discard ? qp->ctx->ops->qp_discard(qp, addr, len) : -EOPNOTSUPP;
}

int dgv_qp_rx_claim(struct dgv_qp *qp, size_t *room)
{
	if (!qp || !room)
		return -EINVAL;
	return qp->ctx->ops->qp_rx_claim ? qp->ctx->ops->qp_rx_claim(qp, room) : -EOPNOTSUPP;
}

int dgv_qp_rx_stream_feed(struct dgv_qp *qp, const void *buf, ssize_t n)
{
	if (!qp || (n > 0 && !buf))
		return -EINVAL;
	return qp->ctx->ops->qp_rx_stream_feed ? qp->ctx->ops->qp_rx_stream_feed(qp, buf, n) : -EOPNOTSUPP;
}

int dgv_qp_set_fd(struct dgv_qp *qp, int fd)
{
	if (!qp || fd < 0)
		return -EINVAL;
	return qp->ctx->ops->qp_set_fd ? qp->ctx->ops->qp_set_fd(qp, fd) : -EOPNOTSUPP;
}

int dgv_qp_peer_gone(struct dgv_qp *qp, const struct sockaddr *to, socklen_t tolen)
{
	if (!qp || !to || !tolen)
		return -EINVAL;
	return qp->ctx->ops->qp_peer_gone ? qp->ctx->ops->qp_peer_gone(qp, to, tolen) : -EOPNOTSUPP;
}

/* ---------------------------------------------------------------- connections (RC) */

#define CM_OP(ctx, op) ((ctx)->ops->op ? 0 : -EOPNOTSUPP)

/* True when p is absent or within the limits of struct dgv_conn_param. */
static bool conn_param_ok(const struct dgv_conn_param *p)
{
	if (!p)
		return true;
	if (p->private_data_len > DGV_MAX_PDATA || (p->private_data_len && !p->private_data))
		return false;
	return p->mpa_rev <= 2 && p->crc >= -1 && p->crc <= 1 && (p->markers == 0 || p->markers == 1);
}

int dgv_cm_create_channel(struct dgv_context *ctx, struct dgv_cm_channel **out)
{
	if (!ctx || !out)
		return -EINVAL;
	return CM_OP(ctx, cm_create_channel) ?: ctx->ops->cm_create_channel(ctx, out);
}

int dgv_cm_create_channel_on_cq(struct dgv_context *ctx, struct dgv_cq *cq, struct dgv_cm_channel **out)
{
	if (!ctx || !cq || !out || cq->ctx != ctx)
		return -EINVAL;
	return CM_OP(ctx, cm_create_channel_on_cq) ?: ctx->ops->cm_create_channel_on_cq(ctx, cq, out);
}

int dgv_cm_destroy_channel(struct dgv_cm_channel *ch)
{
	if (!ch)
		return -EINVAL;
	return CM_OP(ch->ctx, cm_destroy_channel) ?: ch->ctx->ops->cm_destroy_channel(ch);
}

struct dgv_cm_channel *dgv_cm_default_channel(struct dgv_context *ctx)
{
	return ctx && ctx->ops->cm_default_channel ? ctx->ops->cm_default_channel(ctx) : NULL;
}

int dgv_cm_channel_fd(struct dgv_cm_channel *ch)
{
	if (!ch)
		return -EINVAL;
	return CM_OP(ch->ctx, cm_channel_fd) ?: ch->ctx->ops->cm_channel_fd(ch);
}

int dgv_cm_get_event(struct dgv_cm_channel *ch, struct dgv_cm_event *ev)
{
	if (!ch || !ev)
		return -EINVAL;
	return CM_OP(ch->ctx, cm_get_event) ?: ch->ctx->ops->cm_get_event(ch, ev);
}

int dgv_cm_pending(struct dgv_cm_channel *ch)
{
	if (!ch)
		return -EINVAL;
	return ch->ctx->ops->cm_pending ? ch->ctx->ops->cm_pending(ch) : 1;
}

int dgv_cm_wait(struct dgv_cm_channel *ch, int timeout_ms)
{
	if (!ch)
		return -EINVAL;
	return CM_OP(ch->ctx, cm_wait) ?: ch->ctx->ops->cm_wait(ch, timeout_ms);
}

int dgv_connect(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
		socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out)
{
	if (!pd || !attr || !out || attr->qp_type != DGV_QPT_RC || !attr->send_cq || !attr->recv_cq ||
	    !conn_param_ok(param))
		return -EINVAL;
	if (!attr->use_adopt_fd &&
	    (!dst || !((dst->sa_family == AF_INET && dstlen >= sizeof(struct sockaddr_in)) ||
		       (dst->sa_family == AF_INET6 && dstlen >= sizeof(struct sockaddr_in6)))))
		return dst ? -EAFNOSUPPORT : -EINVAL;
	return CM_OP(pd->ctx, connect) ?: pd->ctx->ops->connect(pd, attr, dst, dstlen, param, out);
}

int dgv_listen(struct dgv_context *ctx, const struct sockaddr *addr, socklen_t len, int backlog,
	       int adopt_fd, struct dgv_cm_channel *ch, void *user, struct dgv_listener **out)
{
	if (!ctx || !out || (adopt_fd < 0 && !addr))
		return -EINVAL;
	if (adopt_fd < 0 && !((addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) ||
			      (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))))
		return -EAFNOSUPPORT;
	return CM_OP(ctx, listen) ?: ctx->ops->listen(ctx, addr, len, backlog, adopt_fd, ch, user, out);
}

int dgv_listener_destroy(struct dgv_listener *l)
{
	if (!l)
		return -EINVAL;
	return CM_OP(l->ctx, listener_destroy) ?: l->ctx->ops->listener_destroy(l);
}

int dgv_listener_addr(struct dgv_listener *l, union dgv_sockaddr *out, socklen_t *len)
{
	if (!l || !out || !len)
		return -EINVAL;
	return CM_OP(l->ctx, listener_addr) ?: l->ctx->ops->listener_addr(l, out, len);
}

int dgv_conn_req_adopt(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
		       struct dgv_conn_req **out)
{
	if (!ctx || fd < 0 || !out)
		return -EINVAL;
	return CM_OP(ctx, conn_req_adopt) ?: ctx->ops->conn_req_adopt(ctx, fd, ch, user, out);
}

int dgv_accept(struct dgv_conn_req *req, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
	       const struct dgv_conn_param *param, struct dgv_qp **out)
{
	if (!req || !pd || !attr || !out || attr->qp_type != DGV_QPT_RC || !attr->send_cq ||
	    !attr->recv_cq || !conn_param_ok(param) || pd->ctx != req->ctx)
		return -EINVAL;
	return CM_OP(req->ctx, accept) ?: req->ctx->ops->accept(req, pd, attr, param, out);
}

int dgv_reject(struct dgv_conn_req *req, const void *pdata, uint16_t len)
{
	if (!req || len > DGV_MAX_PDATA || (len && !pdata))
		return -EINVAL;
	return CM_OP(req->ctx, reject) ?: req->ctx->ops->reject(req, pdata, len);
}

int dgv_reject_keep(struct dgv_conn_req *req, const void *pdata, uint16_t len, int wait_ms)
{
	if (!req || len > DGV_MAX_PDATA || (len && !pdata) || wait_ms < 0)
		return -EINVAL;
	return CM_OP(req->ctx, reject_keep) ?: req->ctx->ops->reject_keep(req, pdata, len, wait_ms);
}

int dgv_disconnect(struct dgv_qp *qp)
{
	if (!qp)
		return -EINVAL;
	if (qp->type != DGV_QPT_RC)
		return -EOPNOTSUPP;
	return CM_OP(qp->ctx, disconnect) ?: qp->ctx->ops->disconnect(qp);
}

enum dgv_qp_state dgv_qp_state(struct dgv_qp *qp)
{
	if (!qp || qp->type != DGV_QPT_RC || !qp->ctx->ops->qp_state)
		return DGV_QPS_IDLE;
	return qp->ctx->ops->qp_state(qp);
}

int dgv_conn_info(struct dgv_qp *qp, struct dgv_conn_info *out)
{
	if (!qp || !out)
		return -EINVAL;
	if (qp->type != DGV_QPT_RC)
		return -EOPNOTSUPP;
	return CM_OP(qp->ctx, conn_info) ?: qp->ctx->ops->conn_info(qp, out);
}

const char *dgv_err_str(uint8_t layer, uint8_t etype, uint8_t ecode)
{
	if (layer == DGV_LAYER_RDMAP) {
		if (etype == 0)
			return "RDMAP local catastrophic error";
		if (etype == 1)
			switch (ecode) {
			case 0x00: return "RDMAP: invalid STag";
			case 0x01: return "RDMAP: base or bounds violation";
			case 0x02: return "RDMAP: access rights violation";
			case 0x03: return "RDMAP: STag not associated with this stream";
			case 0x04: return "RDMAP: tagged offset wraps";
			default: return "RDMAP: remote protection error";
			}
		if (etype == 2)
			switch (ecode) {
			case 0x05: return "RDMAP: invalid RDMAP version";
			case 0x06: return "RDMAP: unexpected opcode";
			case 0x07: return "RDMAP: catastrophic error localised to stream";
			default: return "RDMAP: remote operation error";
			}
	} else if (layer == DGV_LAYER_DDP) {
		if (etype == 0)
			return "DDP local catastrophic error";
		if (etype == 1)
			switch (ecode) {
			case 0x00: return "DDP tagged: invalid STag";
			case 0x01: return "DDP tagged: base or bounds violation";
			case 0x02: return "DDP tagged: STag not associated with this stream";
			case 0x03: return "DDP tagged: tagged offset wraps";
			case 0x04: return "DDP tagged: invalid DDP version";
			default: return "DDP tagged buffer error";
			}
		if (etype == 2)
			switch (ecode) {
			case 0x01: return "DDP untagged: invalid queue number";
			case 0x02: return "DDP untagged: no receive buffer posted";
			case 0x03: return "DDP untagged: MSN out of range";
			case 0x04: return "DDP untagged: invalid message offset";
			case 0x05: return "DDP untagged: message too long for the buffer";
			case 0x06: return "DDP untagged: invalid DDP version";
			default: return "DDP untagged buffer error";
			}
	} else if (layer == DGV_LAYER_LLP) {
		return "LLP error (CRC or framing)";
	}
	return "unknown error";
}
