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
	char why[160]; /* dgv_provider_why: set by dgverbs.c after the backend opened */
	struct dgv_caps caps; /* dgv_query_caps: set by the backend's open */
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
	/* optional (NULL: 0): dgv_cq_self_driven */
	int (*cq_self_driven)(struct dgv_cq *cq);
	int (*poll_cq)(struct dgv_cq *cq, int n, struct dgv_wc *wc);
	int (*cq_wait)(struct dgv_cq *cq, int timeout_ms);
	int (*create_ah)(struct dgv_pd *pd, const struct sockaddr *addr, socklen_t len, struct dgv_ah **out);
	int (*destroy_ah)(struct dgv_ah *ah);
	int (*create_qp)(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, struct dgv_qp **out);
	int (*destroy_qp)(struct dgv_qp *qp);
	int (*qp_local_addr)(struct dgv_qp *qp, union dgv_sockaddr *out, socklen_t *len);
	int (*post_send)(struct dgv_qp *qp, struct dgv_send_wr *wr, struct dgv_send_wr **bad);
	/* optional (NULL: -EOPNOTSUPP): dgv_send_now */
	int (*send_now)(struct dgv_qp *qp, struct dgv_ah *ah, const struct iovec *iov, int iovcnt);
	int (*post_recv)(struct dgv_qp *qp, struct dgv_recv_wr *wr, struct dgv_recv_wr **bad);
	int (*poll_errq)(struct dgv_qp *qp, int n, struct dgv_async_err *out);
	int (*qp_stats)(struct dgv_qp *qp, struct dgv_qp_stats *out);
	/* optional (NULL: -EOPNOTSUPP): dgv_peek */
	int (*peek)(struct dgv_qp *qp, void *buf, size_t len, struct dgv_peek *out);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_set_rx_cap */
	int (*set_rx_cap)(struct dgv_qp *qp, unsigned n);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_peer_gone */
	int (*qp_peer_gone)(struct dgv_qp *qp, const struct sockaddr *to, socklen_t tolen);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_rx_feed (take NULL), dgv_qp_rx_take */
	int (*qp_rx_feed)(struct dgv_qp *qp, void *dgram, size_t len, const struct sockaddr *src,
			  socklen_t srclen, uint32_t max, struct dgv_rx_msg *take);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_tx_held */
	int (*qp_tx_held)(struct dgv_qp *qp);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_rx_claim, dgv_qp_rx_stream_feed */
	int (*qp_rx_claim)(struct dgv_qp *qp, size_t *room);
	int (*qp_rx_stream_feed)(struct dgv_qp *qp, const void *buf, ssize_t n);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_discard */
	int (*qp_discard)(struct dgv_qp *qp, void *addr, size_t len);
	/* optional (NULL: -EOPNOTSUPP): dgv_qp_set_fd */
	int (*qp_set_fd)(struct dgv_qp *qp, int fd);
	/* optional (NULL: 0): dgv_qp_socket_events */
	int (*qp_socket_events)(struct dgv_qp *qp);
	/* connections (RC); NULL in a backend without them: the front end returns -EOPNOTSUPP */
	int (*cm_create_channel)(struct dgv_context *ctx, struct dgv_cm_channel **out);
	/* optional (NULL: -EOPNOTSUPP): dgv_cm_create_channel_on_cq */
	int (*cm_create_channel_on_cq)(struct dgv_context *ctx, struct dgv_cq *cq, struct dgv_cm_channel **out);
	int (*cm_destroy_channel)(struct dgv_cm_channel *ch);
	struct dgv_cm_channel *(*cm_default_channel)(struct dgv_context *ctx);
	int (*cm_channel_fd)(struct dgv_cm_channel *ch);
	int (*cm_get_event)(struct dgv_cm_channel *ch, struct dgv_cm_event *ev);
	int (*cm_pending)(struct dgv_cm_channel *ch); /* optional: NULL reads as "maybe" */
	int (*cm_wait)(struct dgv_cm_channel *ch, int timeout_ms);
	int (*connect)(struct dgv_pd *pd, const struct dgv_qp_init_attr *attr, const struct sockaddr *dst,
		       socklen_t dstlen, const struct dgv_conn_param *param, struct dgv_qp **out);
	int (*listen)(struct dgv_context *ctx, const struct sockaddr *addr, socklen_t len, int backlog,
		      int adopt_fd, struct dgv_cm_channel *ch, void *user, struct dgv_listener **out);
	int (*listener_destroy)(struct dgv_listener *l);
	int (*listener_addr)(struct dgv_listener *l, union dgv_sockaddr *out, socklen_t *len);
	int (*conn_req_adopt)(struct dgv_context *ctx, int fd, struct dgv_cm_channel *ch, void *user,
			      struct dgv_conn_req **out);
	int (*accept)(struct dgv_conn_req *req, struct dgv_pd *pd, const struct dgv_qp_init_attr *attr,
		      const struct dgv_conn_param *param, struct dgv_qp **out);
	int (*reject)(struct dgv_conn_req *req, const void *pdata, uint16_t len);
	/* optional: NULL reads as -EOPNOTSUPP (the connection is not a TCP socket of the caller's) */
	int (*reject_keep)(struct dgv_conn_req *req, const void *pdata, uint16_t len, int wait_ms);
	int (*disconnect)(struct dgv_qp *qp);
	enum dgv_qp_state (*qp_state)(struct dgv_qp *qp);
	int (*conn_info)(struct dgv_qp *qp, struct dgv_conn_info *out);
};

/* Connection objects start with these (the front end reaches the ops through ctx). */
struct dgv_cm_channel {
	struct dgv_context *ctx;
};
struct dgv_listener {
	struct dgv_context *ctx;
};
struct dgv_conn_req {
	struct dgv_context *ctx;
};

/* Backend entry points. Return 0 or -errno (-ENODEV: not usable on this host). */
int dgv_soft_open(const struct dgv_context_attr *attr, struct dgv_context **out);
/* A provider's own thread calls this first (dgv_set_thread_hook). */
void dgv_thread_started(void);
/* ibverbs/device.c (built when libibverbs and librdmacm are found: DGV_HAVE_IBVERBS).
 * -ENODEV when no device serves attr's address or name; dgv_ibverbs_why() then says why (and
 * after a success, which device was chosen). */
int dgv_ibverbs_open(const struct dgv_context_attr *attr, struct dgv_context **out);
const char *dgv_ibverbs_why(void);

#endif
