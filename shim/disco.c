/*
 * disco.c - discovery between hosts: whether a program on another host speaks datagram-iWARP
 * on a port (docs/shim.md "Discovery across hosts", wire format in verbs_backend/wire.h).
 *
 * No daemon: every preloaded process that has bound a registry name (a taken UDP socket with a
 * queue pair, a carried TCP listener) also answers on the host's well-known discovery port,
 * bound with SO_REUSEPORT by all of them (the kernel hands each question to one); any of them
 * answers for the whole host, since the registry (abstract unix names) is the network
 * namespace's. A process whose bind is refused (another user's processes hold the port) tries
 * again every second, so the host keeps an answerer while one preloaded server lives.
 *
 * The asking side sends a question from one private socket per process and reads answers when
 * it next routes a datagram (peer.c) or while a TCP connect waits (a few milliseconds). An
 * answer counts only when it comes from the asked host's address and discovery port and echoes
 * the question's random nonce, so an off-path host cannot make a sender frame to a port.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "sock.h"
#include "disco_wire.h"
#include "wire.h"

static struct {
	unsigned port;          /* host order; 0: discovery between hosts off */
	int ask_fd, ask_fd6;    /* the asking sockets (-1: not made yet) */
	int serve_fd;           /* the answering socket (-1: none) */
	pthread_mutex_t lock;   /* making the sockets and the answering thread */
	bool serving;           /* the answering thread runs */
	unsigned gen;           /* G.gen the sockets and thread belong to */
	_Atomic uint64_t drops; /* malformed, unasked or spoofed messages (debug counter) */
	_Atomic uint64_t asks;  /* questions sent (the exit summary's disco_asks) */
} D = {.ask_fd = -1, .ask_fd6 = -1, .serve_fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

unsigned disco_port(void) { return D.port; }

void disco_init(void)
{
	D.port = (unsigned)dg_env_long(DG_ENV_DISCOVERY_PORT);
}

void disco_after_fork(void)
{
	/* the child has no answering thread: a copy of the answering socket nobody reads would
	 * take questions meant for a living answerer once the parent is gone; the asking sockets
	 * would read the parent's answers */
	pthread_mutex_init(&D.lock, NULL);
	D.serving = false;
	if (D.serve_fd >= 0)
		own_close(D.serve_fd);
	if (D.ask_fd >= 0)
		own_close(D.ask_fd);
	if (D.ask_fd6 >= 0)
		own_close(D.ask_fd6);
	D.serve_fd = D.ask_fd = D.ask_fd6 = -1;
}

/* The services the host's registry has for port (DG_DISCO_*). */
static uint8_t host_caps(unsigned port)
{
	return (uint8_t)((reg_has(reg_key(IWARP_MODE_UD, port)) ? DG_DISCO_UD : 0) |
			 (reg_has(reg_key(IWARP_MODE_RD, port)) ? DG_DISCO_RD : 0) |
			 (reg_has(reg_key(SVC_UDV, port)) ? DG_DISCO_UDV : 0) |
			 (reg_has(REG_KEY(REG_RC, port, 0)) ? DG_DISCO_RC : 0));
}

/* One bound answering socket (IPv4, or IPv6 dual-stack), or -1. */
static int serve_socket(void)
{
	int fd = real.socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int v6only = 0, one = 1;
	bool v6 = fd >= 0;
	if (fd < 0)
		fd = real.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (v6)
		real.setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
	real.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	real.setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	union dgv_sockaddr a;
	memset(&a, 0, sizeof a);
	socklen_t al;
	if (v6) {
		a.sin6.sin6_family = AF_INET6, a.sin6.sin6_port = htons((uint16_t)D.port), al = sizeof a.sin6;
	} else {
		a.sin.sin_family = AF_INET, a.sin.sin_port = htons((uint16_t)D.port), al = sizeof a.sin;
	}
	if (real.bind(fd, &a.sa, al) < 0) {
		own_close(fd);
		return -1;
	}
	return fd_to_high(fd);
}

static void *serve_thread(void *arg)
{
	(void)arg;
	shim_depth++; /* everything here is the shim's own */
	int fd = __atomic_load_n(&D.serve_fd, __ATOMIC_ACQUIRE);
	bool said = false;
	for (;;) {
		if (fd < 0 && (fd = serve_socket()) >= 0)
			__atomic_store_n(&D.serve_fd, fd, __ATOMIC_RELEASE);
		if (fd < 0) {
			if (!said)
				DG_DBG("discovery port %u: not bound here (%s): another process answers, or "
				       "this one tries again every second", D.port, strerror(errno));
			said = true;
			sleep(1);
			continue;
		}
		uint8_t buf[64];
		union dgv_sockaddr from;
		socklen_t fl = sizeof from;
		ssize_t n = real.recvfrom(fd, buf, sizeof buf, 0, &from.sa, &fl);
		if (n < 0)
			continue;
		unsigned port;
		uint64_t nonce;
		if (disco_parse(buf, (size_t)n, DG_DISCO_PROBE, &port, &nonce, NULL, NULL)) {
			atomic_fetch_add(&D.drops, 1);
			DG_DBG("discovery: %zd bytes that are not a question: ignored", n);
			continue;
		}
		struct dg_disco m;
		disco_put(&m, DG_DISCO_ANSWER, port, nonce, host_caps(port), DISCO_LEASE_MS);
		real.sendto(fd, &m, sizeof m, MSG_DONTWAIT, &from.sa, fl);
	}
	return NULL;
}

void disco_serve(void)
{
	if (!D.port || __atomic_load_n(&D.serving, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&D.lock);
	/* bound here, before the listen or bind that named a port returns: a client told "the
	 * server is up" asks at once, and a question before the bind was lost (the asker then
	 * took the host for one without the shim for a second: connects plain meanwhile) */
	if (!D.serving && D.serve_fd < 0) {
		shim_depth++;
		int fd = serve_socket();
		shim_depth--;
		if (fd >= 0)
			__atomic_store_n(&D.serve_fd, fd, __ATOMIC_RELEASE);
	}
	if (!D.serving && shim_thread(serve_thread, NULL) == 0)
		__atomic_store_n(&D.serving, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&D.lock);
}

/* The asking socket for family fam (made on first use), or -1. */
static int ask_socket(int fam)
{
	int *slot = fam == AF_INET6 ? &D.ask_fd6 : &D.ask_fd;
	int fd = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (fd >= 0)
		return fd;
	pthread_mutex_lock(&D.lock);
	if (*slot < 0) {
		int s = real.socket(fam, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (s >= 0)
			__atomic_store_n(slot, fd_to_high(s), __ATOMIC_RELEASE);
	}
	fd = *slot;
	pthread_mutex_unlock(&D.lock);
	return fd;
}

uint64_t disco_nonce(void)
{
	uint64_t n = 0;
	if (getrandom(&n, sizeof n, GRND_NONBLOCK) != sizeof n)
		n = shim_now_us() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	return n | 1; /* never 0: 0 means "nothing asked" */
}

int disco_ask(const union dgv_sockaddr *to, uint64_t nonce)
{
	if (!D.port)
		return -ENOTSUP;
	int fd = ask_socket(to->sa.sa_family);
	if (fd < 0)
		return -errno;
	union dgv_sockaddr d; /* to may be the program's own sockaddr_in: copy only what it has */
	if (to->sa.sa_family == AF_INET)
		d.sin = to->sin;
	else
		d.sin6 = to->sin6;
	socklen_t dl;
	unsigned port;
	if (to->sa.sa_family == AF_INET)
		port = ntohs(to->sin.sin_port), d.sin.sin_port = htons((uint16_t)D.port), dl = sizeof d.sin;
	else
		port = ntohs(to->sin6.sin6_port), d.sin6.sin6_port = htons((uint16_t)D.port), dl = sizeof d.sin6;
	struct dg_disco m;
	disco_put(&m, DG_DISCO_PROBE, port, nonce, 0, 0);
	if (real.sendto(fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL, &d.sa, dl) < 0)
		return -errno;
	atomic_fetch_add_explicit(&D.asks, 1, memory_order_relaxed);
	return 0;
}

int disco_read(disco_answer_fn fn)
{
	int got = 0;
	for (int k = 0; k < 2; k++) {
		int fd = __atomic_load_n(k ? &D.ask_fd6 : &D.ask_fd, __ATOMIC_ACQUIRE);
		if (fd < 0)
			continue;
		for (;;) {
			uint8_t buf[64];
			union dgv_sockaddr from;
			socklen_t fl = sizeof from;
			ssize_t n = real.recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, &from.sa, &fl);
			if (n < 0)
				break;
			unsigned port, fport;
			uint64_t nonce;
			uint8_t caps;
			uint32_t lease;
			fport = from.sa.sa_family == AF_INET ? ntohs(from.sin.sin_port) : ntohs(from.sin6.sin6_port);
			if (fport != D.port || disco_parse(buf, (size_t)n, DG_DISCO_ANSWER, &port, &nonce, &caps, &lease)) {
				atomic_fetch_add(&D.drops, 1);
				DG_DBG("discovery: %zd bytes that are not an answer from a discovery port: ignored", n);
				continue;
			}
			fn(&from, port, nonce, caps, lease);
			got++;
		}
	}
	return got;
}

int disco_wait(int family, int ms)
{
	int fd = __atomic_load_n(family == AF_INET6 ? &D.ask_fd6 : &D.ask_fd, __ATOMIC_ACQUIRE);
	if (fd < 0)
		return 0;
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return real.poll(&p, 1, ms);
}

uint64_t disco_drops(void) { return atomic_load(&D.drops); }
uint64_t disco_asks(void) { return atomic_load(&D.asks); }
