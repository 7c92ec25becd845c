/*
 * provider.h - the boundary between the verbs front end (dgverbs.c) and the backends.
 * Each backend defines its objects with the base struct below as first member and fills one
 * struct dgv_ops; dgverbs.c only checks arguments and dispatches.
 */
#ifndef DG_PROVIDER_H
#define DG_PROVIDER_H

#include "dgverbs.h"

struct dgv_ops;

struct dgv_context {
	const struct dgv_ops *ops;
	const char *name;
};
struct dgv_pd {
	struct dgv_context *ctx;
};
struct dgv_cq {
	struct dgv_context *ctx;
};
struct dgv_qp {
	struct dgv_context *ctx;
	enum dgv_qp_type type;
};
struct dgv_ah {
	struct dgv_context *ctx;
	union dgv_sockaddr addr;
	socklen_t addrlen;
};

struct dgv_ops {
	void (*close)(struct dgv_context *ctx);
	int (*alloc_pd)(struct dgv_context *ctx, struct dgv_pd **out);
	int (*dealloc_pd)(struct dgv_pd *pd);
	int (*reg_mr)(struct dgv_pd *pd, void *addr, size_t len, unsigned access, struct dgv_mr **out);
	int (*dereg_mr)(struct dgv_mr *mr);
	int (*create_cq)(struct dgv_context *ctx, int cqe, struct dgv_cq **out);
	int (*destroy_cq)(struct dgv_cq *cq);
	int (*cq_fd)(struct dgv_cq *cq);
	int (*req_notify_cq)(struct dgv_cq *cq, int solicited_only);
	int (*cq_ack_event)(struct dgv_cq *cq);
	int (*cq_notify_background)(struct dgv_cq *cq, int on);
	int (*cq_ready)(struct dgv_cq *cq);
	int (*poll_cq)(struct dgv_cq *cq, int n, struct dgv_wc *wc);
	int (*cq_wait)(struct dgv_cq *cq, int timeout_ms);
	int (*create_ah)(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out);
	int (*destroy_ah)(struct dgv_ah *ah);
	int (*create_qp)(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
	int (*destroy_qp)(struct dgv_qp *qp);
	int (*qp_local_addr)(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len);
	int (*post_send)(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
	int (*post_recv)(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
	int (*poll_errq)(struct dgv_qp *qp, int n, struct dgv_async_err *out);
	int (*qp_stats)(struct dgv_qp *qp, struct dgv_qp_stats *out);
};

/* Backend entry points. Return 0 or -errno (-ENODEV: not usable on this host). */
int dgv_soft_open(const struct dgv_context_attr *attr, struct dgv_context **out);

#endif
