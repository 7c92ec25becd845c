/*
 * syms.h - every libibverbs/librdmacm function the ibverbs provider calls, in one table that
 * syms.c fills with dlopen + dlvsym the first time the provider is opened (pthread_once).
 *
 * Why not link them: libdgshim.so is preloaded into every program. A DT_NEEDED on
 * libibverbs.so.1/librdmacm.so.1 made ld.so refuse to preload the shim at all on a host
 * without rdma-core (the program then ran without it), and made every preloaded program load
 * RDMA libraries (and libnl) that it almost never uses: the soft provider is the default, the
 * ibverbs provider opens only on DGSHIM_PROVIDER=ibverbs or an address a device serves. Now
 * the libraries are loaded at that first open; when they are missing the open fails with
 * -ENODEV and a reason naming the library, and auto falls back to soft with that reason.
 * tests/verbs_conf/rdma_lazy.sh fails if libdgshim.so needs either library again.
 *
 * The headers are still included for the types and for the many calls that are static inline
 * in <infiniband/verbs.h> and dispatch through the context's ops (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq, ibv_req_notify_cq...): those need no symbol. Only real exported functions are
 * here (`nm --undefined-only` on the provider's objects lists them; it must show none of them
 * once this header is in use). Each is looked up with the symbol version the static linker
 * bound before (readelf --dyn-syms), so the ABI the headers describe is the one we call.
 *
 * After this header (ibverbs_int.h includes it), `ibv_alloc_pd(pd)` in the provider's .c files
 * expands to `iv_sym.ibv_alloc_pd(pd)`, so the code reads as plain verbs. The two header
 * macros that wrap a real function in an inline (ibv_query_port, ibv_reg_mr) are redefined to
 * go through the table, since their inlines would reference the real symbol.
 */
#ifndef DG_IBVERBS_SYMS_H
#define DG_IBVERBS_SYMS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <string.h>

/* X(function, symbol version) */
#define IV_SYMS_IBVERBS(X)                                                                       \
	X(ibv_ack_async_event, "IBVERBS_1.1")                                                    \
	X(ibv_ack_cq_events, "IBVERBS_1.1")                                                      \
	X(ibv_alloc_pd, "IBVERBS_1.1")                                                           \
	X(ibv_create_ah, "IBVERBS_1.1")                                                          \
	X(ibv_create_comp_channel, "IBVERBS_1.0")                                                \
	X(ibv_create_cq, "IBVERBS_1.1")                                                          \
	X(ibv_create_qp, "IBVERBS_1.1")                                                          \
	X(ibv_dealloc_pd, "IBVERBS_1.1")                                                         \
	X(ibv_dereg_mr, "IBVERBS_1.1")                                                           \
	X(ibv_destroy_ah, "IBVERBS_1.1")                                                         \
	X(ibv_destroy_comp_channel, "IBVERBS_1.0")                                               \
	X(ibv_destroy_cq, "IBVERBS_1.1")                                                         \
	X(ibv_destroy_qp, "IBVERBS_1.1")                                                         \
	X(ibv_event_type_str, "IBVERBS_1.1")                                                     \
	X(ibv_get_async_event, "IBVERBS_1.1")                                                    \
	X(ibv_get_cq_event, "IBVERBS_1.1")                                                       \
	X(ibv_get_device_name, "IBVERBS_1.1")                                                    \
	X(ibv_modify_qp, "IBVERBS_1.1")                                                          \
	X(ibv_query_device, "IBVERBS_1.1")                                                       \
	X(ibv_query_gid, "IBVERBS_1.1")                                                          \
	X(ibv_query_port, "IBVERBS_1.1")                                                         \
	X(ibv_reg_mr, "IBVERBS_1.1")                                                             \
	X(ibv_resize_cq, "IBVERBS_1.1")                                                          \
	X(ibv_wc_status_str, "IBVERBS_1.1")

#define IV_SYMS_RDMACM(X)                                                                        \
	X(rdma_accept, "RDMACM_1.0")                                                             \
	X(rdma_ack_cm_event, "RDMACM_1.0")                                                       \
	X(rdma_bind_addr, "RDMACM_1.0")                                                          \
	X(rdma_connect, "RDMACM_1.0")                                                            \
	X(rdma_create_event_channel, "RDMACM_1.0")                                               \
	X(rdma_create_id, "RDMACM_1.0")                                                          \
	X(rdma_create_qp, "RDMACM_1.0")                                                          \
	X(rdma_destroy_event_channel, "RDMACM_1.0")                                              \
	X(rdma_destroy_id, "RDMACM_1.0")                                                         \
	X(rdma_destroy_qp, "RDMACM_1.0")                                                         \
	X(rdma_disconnect, "RDMACM_1.0")                                                         \
	X(rdma_event_str, "RDMACM_1.0")                                                          \
	X(rdma_free_devices, "RDMACM_1.0")                                                       \
	X(rdma_get_cm_event, "RDMACM_1.0")                                                       \
	X(rdma_get_devices, "RDMACM_1.0")                                                        \
	X(rdma_get_src_port, "RDMACM_1.0")                                                       \
	X(rdma_listen, "RDMACM_1.0")                                                             \
	X(rdma_migrate_id, "RDMACM_1.0")                                                         \
	X(rdma_reject, "RDMACM_1.0")                                                             \
	X(rdma_resolve_addr, "RDMACM_1.0")                                                       \
	X(rdma_resolve_route, "RDMACM_1.0")

/* The name not followed by '(' is not a macro call, so function-like macros such as
 * ibv_query_port give the real function's type here. */
struct iv_syms {
#define IV_SYM_FIELD(name, ver) __typeof__(&name) name;
	IV_SYMS_IBVERBS(IV_SYM_FIELD)
	IV_SYMS_RDMACM(IV_SYM_FIELD)
#undef IV_SYM_FIELD
};

/* Filled once by iv_syms_load; used only by objects of an opened ibverbs context, which exist
 * only after a successful load (pthread_once orders the writes before them). */
extern struct iv_syms iv_sym;

/* Loads the libraries once (later calls return the first result): 0, or -ENODEV with the
 * reason (naming the library) in why. DGSHIM_IBV_LIB / DGSHIM_RDMACM_LIB replace the file
 * names (a test and debug knob: tests/verbs_conf/rdma_lazy.sh points them at nothing). */
int iv_syms_load(char *why, size_t whylen);

#ifndef IV_SYMS_NO_REDIRECT
/* Mirrors <infiniband/verbs.h>'s ___ibv_query_port, calling the library through the table
 * (the parentheses keep the member name from being taken for the header's macro). */
static inline int iv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(context, query_port);
	if (!vctx) {
		memset(port_attr, 0, sizeof *port_attr);
		return (iv_sym.ibv_query_port)(context, port_num, (struct _compat_ibv_port_attr *)port_attr);
	}
	return vctx->query_port(context, port_num, port_attr, sizeof *port_attr);
}
#undef ibv_query_port
#define ibv_query_port(context, port_num, port_attr) iv_query_port(context, port_num, port_attr)
/* The header's wrapper goes to ibv_reg_mr_iova2 only for IBV_ACCESS_OPTIONAL_RANGE (or, at
 * -O0, access flags it cannot prove free of it); we never ask for optional ranges. */
#undef ibv_reg_mr
#define ibv_reg_mr(pd, addr, length, access) (iv_sym.ibv_reg_mr)(pd, addr, length, (int)(access))

#define ibv_ack_async_event iv_sym.ibv_ack_async_event
#define ibv_ack_cq_events iv_sym.ibv_ack_cq_events
#define ibv_alloc_pd iv_sym.ibv_alloc_pd
#define ibv_create_ah iv_sym.ibv_create_ah
#define ibv_create_comp_channel iv_sym.ibv_create_comp_channel
#define ibv_create_cq iv_sym.ibv_create_cq
#define ibv_create_qp iv_sym.ibv_create_qp
#define ibv_dealloc_pd iv_sym.ibv_dealloc_pd
#define ibv_dereg_mr iv_sym.ibv_dereg_mr
#define ibv_destroy_ah iv_sym.ibv_destroy_ah
#define ibv_destroy_comp_channel iv_sym.ibv_destroy_comp_channel
#define ibv_destroy_cq iv_sym.ibv_destroy_cq
#define ibv_destroy_qp iv_sym.ibv_destroy_qp
#define ibv_event_type_str iv_sym.ibv_event_type_str
#define ibv_get_async_event iv_sym.ibv_get_async_event
#define ibv_get_cq_event iv_sym.ibv_get_cq_event
#define ibv_get_device_name iv_sym.ibv_get_device_name
#define ibv_modify_qp iv_sym.ibv_modify_qp
#define ibv_query_device iv_sym.ibv_query_device
#define ibv_query_gid iv_sym.ibv_query_gid
#define ibv_resize_cq iv_sym.ibv_resize_cq
#define ibv_wc_status_str iv_sym.ibv_wc_status_str

#define rdma_accept iv_sym.rdma_accept
#define rdma_ack_cm_event iv_sym.rdma_ack_cm_event
#define rdma_bind_addr iv_sym.rdma_bind_addr
#define rdma_connect iv_sym.rdma_connect
#define rdma_create_event_channel iv_sym.rdma_create_event_channel
#define rdma_create_id iv_sym.rdma_create_id
#define rdma_create_qp iv_sym.rdma_create_qp
#define rdma_destroy_event_channel iv_sym.rdma_destroy_event_channel
#define rdma_destroy_id iv_sym.rdma_destroy_id
#define rdma_destroy_qp iv_sym.rdma_destroy_qp
#define rdma_disconnect iv_sym.rdma_disconnect
#define rdma_event_str iv_sym.rdma_event_str
#define rdma_free_devices iv_sym.rdma_free_devices
#define rdma_get_cm_event iv_sym.rdma_get_cm_event
#define rdma_get_devices iv_sym.rdma_get_devices
#define rdma_get_src_port iv_sym.rdma_get_src_port
#define rdma_listen iv_sym.rdma_listen
#define rdma_migrate_id iv_sym.rdma_migrate_id
#define rdma_reject iv_sym.rdma_reject
#define rdma_resolve_addr iv_sym.rdma_resolve_addr
#define rdma_resolve_route iv_sym.rdma_resolve_route
#endif

#endif
