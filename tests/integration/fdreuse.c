/*
 * fdreuse - descriptors the shim did not take must behave exactly as natively, also after their
 * numbers are reused, and the calls programs make around fork and syscall() must see the same
 * datagrams. Run once natively and once preloaded (fdreuse.sh): each case prints a transcript of
 * what the kernel (or the shim) answered, and the two transcripts must be identical; each case
 * also checks itself and exits non-zero on a wrong answer.
 *
 *   fdreuse epoll     epoll/poll/select over pipes, eventfd, timerfd, signalfd, socketpairs, TCP
 *                     and UDP sockets through close, dup2, close_range, SCM_RIGHTS reuse
 *   fdreuse syscall   sendmmsg/recvmmsg/sendto/recvfrom/close through libc's syscall()
 *   fdreuse peekfork  MSG_PEEK in the parent, the read in a forked child (socat's UDP fork relay)
 *   fdreuse share     parent and child reading one UDP socket: every datagram read once
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                               \
			say(__VA_ARGS__);                                                          \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* A call's answer as the transcript shows it: the value, or -1 and the errno's name. */
static const char *res(long r)
{
	static char b[8][64];
	static int k;
	char *o = b[k++ % 8];
	if (r < 0)
		snprintf(o, 64, "-1 %s", strerrorname_np(errno) ? strerrorname_np(errno) : "?");
	else
		snprintf(o, 64, "%ld", r);
	return o;
}

static int ep_ctl(int ep, int op, int fd, uint32_t ev, uint64_t data)
{
	struct epoll_event e = {.events = ev, .data.u64 = data};
	return epoll_ctl(ep, op, fd, &e);
}

/* Waits up to ms for one event; returns its data (0: none), *evs gets the events. */
static uint64_t ep_one(int ep, int ms, uint32_t *evs)
{
	struct epoll_event e[4];
	int n = epoll_wait(ep, e, 4, ms);
	*evs = 0;
	if (n <= 0)
		return 0;
	*evs = e[0].events;
	return e[0].data.u64;
}

static int udp_bound(struct sockaddr_in *a)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in b = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof b;
	if (s < 0 || bind(s, (struct sockaddr *)&b, sizeof b) || getsockname(s, (struct sockaddr *)&b, &l))
		exit(2);
	if (a)
		*a = b;
	return s;
}

/* A TCP connection on loopback accepted from a forked client, which writes one byte and
 * waits for the connection's end (a carried connect returns once the server accepted, so the
 * client cannot be in the same thread). Returns the accepted end; *child the client's pid. */
static int tcp_accepted(pid_t *child)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4) ||
	    getsockname(l, (struct sockaddr *)&a, &al))
		exit(2);
	fflush(stdout);
	*child = fork();
	if (*child == 0) {
		close(l);
		int c = socket(AF_INET, SOCK_STREAM, 0);
		char b;
		if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) || write(c, "x", 1) != 1)
			_exit(2);
		while (read(c, &b, 1) > 0)
			;
		_exit(0);
	}
	int s = accept(l, NULL, NULL);
	close(l);
	return s;
}

static int poll_in(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int r = poll(&p, 1, ms);
	return r > 0 ? p.revents : r;
}

static int select_in(int fd, int ms)
{
	fd_set r;
	FD_ZERO(&r);
	FD_SET(fd, &r);
	struct timeval tv = {0, ms * 1000};
	int n = select(fd + 1, &r, NULL, NULL, &tv);
	return n > 0 && FD_ISSET(fd, &r);
}

static void case_epoll(void)
{
	uint32_t ev;
	int ep = epoll_create1(EPOLL_CLOEXEC);

	/* nginx: a socketpair registered at start-up and closed; the first connection gets
	 * its number back and must register */
	int sp[2];
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp);
	say("A add socketpair: %s", res(ep_ctl(ep, EPOLL_CTL_ADD, sp[0], EPOLLIN, 111)));
	int old = sp[0];
	close(sp[0]);
	close(sp[1]);
	pid_t client;
	int conn = tcp_accepted(&client);
	say("A number reused: %d", conn == old);
	int r = ep_ctl(ep, EPOLL_CTL_ADD, conn, EPOLLIN, 222);
	say("A add connection at the old number: %s", res(r));
	CHECK(r == 0, "ADD of a reused number: %s", res(r));
	uint64_t d = ep_one(ep, 2000, &ev);
	say("A event: data %llu events %#x", (unsigned long long)d, ev);
	CHECK(d == 222 && (ev & EPOLLIN), "event of the connection: %llu %#x", (unsigned long long)d, ev);
	char c1;
	say("A read: %s", res(read(conn, &c1, 1)));
	say("A del: %s", res(ep_ctl(ep, EPOLL_CTL_DEL, conn, 0, 0)));
	close(conn);
	waitpid(client, NULL, 0);

	/* a pipe registered and closed, an eventfd at its number */
	int p[2];
	pipe2(p, O_CLOEXEC);
	say("B add pipe: %s", res(ep_ctl(ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 333)));
	old = p[0];
	close(p[0]);
	close(p[1]);
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	say("B eventfd at the pipe's number: %d", efd == old);
	r = ep_ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN, 444);
	say("B add eventfd: %s", res(r));
	CHECK(r == 0, "ADD eventfd: %s", res(r));
	say("B mod eventfd: %s", res(ep_ctl(ep, EPOLL_CTL_MOD, efd, EPOLLIN | EPOLLET, 445)));
	uint64_t one = 1;
	write(efd, &one, sizeof one);
	d = ep_one(ep, 2000, &ev);
	say("B event: data %llu events %#x", (unsigned long long)d, ev);
	CHECK(d == 445, "eventfd event: %llu", (unsigned long long)d);
	say("B edge once: data %llu", (unsigned long long)ep_one(ep, 50, &ev));

	/* dup2 over a registered descriptor */
	pipe2(p, O_CLOEXEC);
	say("C add pipe: %s", res(ep_ctl(ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 555)));
	say("C dup2 eventfd over it: %s", res(dup2(efd, p[0]) == p[0] ? 0 : -1));
	r = ep_ctl(ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 556);
	say("C add at the same number: %s", res(r));
	CHECK(r == 0, "ADD after dup2: %s", res(r));
	say("C del: %s", res(ep_ctl(ep, EPOLL_CTL_DEL, p[0], 0, 0)));
	say("C del again: %s", res(ep_ctl(ep, EPOLL_CTL_DEL, p[0], 0, 0)));
	close(p[0]);
	close(p[1]);
	say("B del: %s", res(ep_ctl(ep, EPOLL_CTL_DEL, efd, 0, 0)));
	close(efd);

	/* a taken UDP socket registered and closed; a timerfd, then a signalfd at its number */
	struct sockaddr_in ua;
	int u = udp_bound(&ua);
	say("D add udp: %s", res(ep_ctl(ep, EPOLL_CTL_ADD, u, EPOLLIN, 666)));
	old = u;
	close(u);
	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	say("D timerfd at the socket's number: %d", tfd == old);
	r = ep_ctl(ep, EPOLL_CTL_ADD, tfd, EPOLLIN, 777);
	say("D add timerfd: %s", res(r));
	CHECK(r == 0, "ADD timerfd: %s", res(r));
	struct itimerspec its = {.it_value = {0, 10 * 1000 * 1000}};
	timerfd_settime(tfd, 0, &its, NULL);
	d = ep_one(ep, 2000, &ev);
	say("D timer event: data %llu", (unsigned long long)d);
	CHECK(d == 777, "timer event: %llu", (unsigned long long)d);
	say("D select/poll timer: %d %#x", select_in(tfd, 0), poll_in(tfd, 0));
	close(tfd);
	sigset_t m;
	sigemptyset(&m);
	sigaddset(&m, SIGUSR1);
	sigprocmask(SIG_BLOCK, &m, NULL);
	int sfd = signalfd(-1, &m, SFD_CLOEXEC);
	say("D signalfd at the same number: %d", sfd == old);
	r = ep_ctl(ep, EPOLL_CTL_ADD, sfd, EPOLLIN, 888);
	say("D add signalfd: %s", res(r));
	CHECK(r == 0, "ADD signalfd: %s", res(r));
	raise(SIGUSR1);
	d = ep_one(ep, 2000, &ev);
	say("D signal event: data %llu", (unsigned long long)d);
	CHECK(d == 888, "signal event: %llu", (unsigned long long)d);
	close(sfd);

	/* close_range over registered pipes, then taken UDP sockets at those numbers */
	int lo = -1, hi = -1, all[6];
	for (int i = 0; i < 3; i++) {
		pipe2(p, O_CLOEXEC);
		ep_ctl(ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 900 + (uint64_t)i);
		all[2 * i] = p[0], all[2 * i + 1] = p[1];
		if (lo < 0)
			lo = p[0];
		hi = p[1];
	}
	/* a range with another descriptor inside it (the shim's own, made earlier at a free low
	 * number) is closed one by one: a program's close_range over the shim's descriptors is
	 * the hardening issue's, not this test's */
	int cr = hi - lo == 5 ? close_range((unsigned)lo, (unsigned)hi, 0) : 0;
	for (int i = 0; hi - lo != 5 && i < 6; i++)
		close(all[i]);
	say("E close_range: %s", res(cr));
	int us[3];
	struct sockaddr_in ub[3];
	for (int i = 0; i < 3; i++) {
		us[i] = udp_bound(&ub[i]);
		r = ep_ctl(ep, EPOLL_CTL_ADD, us[i], EPOLLIN, 1000 + (uint64_t)i);
		say("E add udp %d in the closed range: %d, %s", i, us[i] >= lo && us[i] <= hi, res(r));
		CHECK(r == 0, "ADD udp after close_range: %s", res(r));
	}
	sendto(us[0], "hello", 5, 0, (struct sockaddr *)&ub[2], sizeof ub[2]);
	d = ep_one(ep, 2000, &ev);
	say("E udp event: data %llu events %#x", (unsigned long long)d, ev);
	CHECK(d == 1002, "udp event: %llu", (unsigned long long)d);
	char buf[64];
	say("E recv: %s", res(recv(us[2], buf, sizeof buf, 0)));
	for (int i = 0; i < 3; i++) {
		say("E del udp %d: %s", i, res(ep_ctl(ep, EPOLL_CTL_DEL, us[i], 0, 0)));
		close(us[i]);
	}

	/* a pipe at a closed taken socket's number: poll and select see the pipe */
	u = udp_bound(NULL);
	old = u;
	close(u);
	pipe2(p, O_CLOEXEC);
	say("F pipe at the socket's number: %d", p[0] == old);
	say("F poll/select empty: %#x %d", poll_in(p[0], 0), select_in(p[0], 0));
	write(p[1], "y", 1);
	int pr = poll_in(p[0], 1000);
	say("F poll/select full: %#x %d", pr, select_in(p[0], 0));
	CHECK(pr == POLLIN, "poll on the pipe: %#x", pr);
	say("F read: %s", res(read(p[0], buf, sizeof buf)));
	say("F add: %s", res(ep_ctl(ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 1)));
	say("F mod: %s", res(ep_ctl(ep, EPOLL_CTL_MOD, p[0], EPOLLOUT, 2)));
	say("F del: %s", res(ep_ctl(ep, EPOLL_CTL_DEL, p[0], 0, 0)));
	close(p[0]);
	close(p[1]);

	/* SCM_RIGHTS: a pipe received at a closed taken socket's number */
	socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sp);
	pipe2(p, O_CLOEXEC);
	u = udp_bound(NULL);
	old = u;
	ep_ctl(ep, EPOLL_CTL_ADD, u, EPOLLIN, 1100);
	close(u);
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iv = {"z", 1};
	struct msghdr mh = {.msg_iov = &iv, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &p[0], sizeof(int));
	sendmsg(sp[0], &mh, 0);
	close(p[0]);
	char z;
	struct iovec riv = {&z, 1};
	struct msghdr rh = {.msg_iov = &riv, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	recvmsg(sp[1], &rh, 0);
	int got = -1;
	memcpy(&got, CMSG_DATA(CMSG_FIRSTHDR(&rh)), sizeof got);
	say("G received at the socket's number: %d", got == old || got == p[0]);
	r = ep_ctl(ep, EPOLL_CTL_ADD, got, EPOLLIN, 1200);
	say("G add received pipe: %s", res(r));
	CHECK(r == 0, "ADD received: %s", res(r));
	write(p[1], "w", 1);
	d = ep_one(ep, 2000, &ev);
	say("G event: data %llu", (unsigned long long)d);
	CHECK(d == 1200, "received pipe's event: %llu", (unsigned long long)d);
	close(got);
	close(p[1]);
	close(sp[0]);
	close(sp[1]);

	/* an epoll instance inside poll (libuv embedders, GLib): readable when a member is */
	u = udp_bound(&ua);
	ep_ctl(ep, EPOLL_CTL_ADD, u, EPOLLIN, 1300);
	say("H poll epoll, empty: %#x", poll_in(ep, 0));
	sendto(u, "q", 1, 0, (struct sockaddr *)&ua, sizeof ua);
	pr = poll_in(ep, 2000);
	say("H poll epoll, datagram: %#x", pr);
	CHECK(pr == POLLIN, "epoll fd in poll: %#x", pr);
	d = ep_one(ep, 0, &ev);
	say("H event: data %llu", (unsigned long long)d);
	CHECK(d == 1300, "udp event through poll: %llu", (unsigned long long)d);
	close(u);
	close(ep);
}

/* recvmmsg/sendmmsg and friends through syscall(), as libuv makes them. */
static void case_syscall(void)
{
	struct sockaddr_in ra, sa;
	int rx = udp_bound(&ra), tx = udp_bound(&sa);
	char out[5][16], in[5][64];
	struct mmsghdr mo[5], mi[5];
	struct iovec vo[5], vi[5];
	memset(mo, 0, sizeof mo);
	memset(mi, 0, sizeof mi);
	for (int i = 0; i < 5; i++) {
		snprintf(out[i], sizeof out[i], "batch-%d", i);
		vo[i] = (struct iovec){out[i], strlen(out[i])};
		mo[i].msg_hdr = (struct msghdr){.msg_name = &ra, .msg_namelen = sizeof ra, .msg_iov = &vo[i], .msg_iovlen = 1};
		vi[i] = (struct iovec){in[i], sizeof in[i]};
		mi[i].msg_hdr = (struct msghdr){.msg_iov = &vi[i], .msg_iovlen = 1};
	}
	long n = syscall(SYS_sendmmsg, tx, mo, 5, 0);
	say("sendmmsg: %s", res(n));
	CHECK(n == 5, "sendmmsg sent %ld", n);
	int got = 0;
	for (int tries = 0; got < 5 && tries < 50; tries++) {
		if (poll_in(rx, 200) <= 0)
			continue;
		long r = syscall(SYS_recvmmsg, rx, mi + got, 5 - got, MSG_DONTWAIT, NULL);
		if (r > 0)
			got += (int)r;
	}
	say("recvmmsg: %d", got);
	CHECK(got == 5, "recvmmsg got %d of 5", got);
	for (int i = 0; i < got; i++) {
		say("  %.*s", (int)mi[i].msg_len, in[i]);
		CHECK(mi[i].msg_len == strlen(out[i]) && !memcmp(in[i], out[i], mi[i].msg_len), "datagram %d differs", i);
	}
	n = syscall(SYS_sendto, tx, "single", 6, 0, &ra, sizeof ra);
	say("sendto: %s", res(n));
	char b[64];
	poll_in(rx, 2000);
	n = syscall(SYS_recvfrom, rx, b, sizeof b, 0, NULL, NULL);
	say("recvfrom: %s %.*s", res(n), n > 0 ? (int)n : 0, b);
	CHECK(n == 6 && !memcmp(b, "single", 6), "recvfrom through syscall");
	say("close: %s %s", res(syscall(SYS_close, rx)), res(syscall(SYS_close, tx)));
	/* the numbers come back for something else, which must not look taken */
	int p[2];
	pipe(p);
	write(p[1], "k", 1);
	say("pipe after: read %s", res(read(p[0], b, sizeof b)));
	close(p[0]);
	close(p[1]);
}

/* socat's UDP-RECVFROM fork: the parent peeks to learn the sender, a child reads the datagram;
 * the child must get exactly the datagram the parent peeked. */
static void case_peekfork(void)
{
	struct sockaddr_in ra;
	int rx = udp_bound(&ra), tx = udp_bound(NULL);
	int n = 40, same = 0;
	for (int i = 0; i < n; i++) {
		char m[32], pk[64];
		int ml = snprintf(m, sizeof m, "datagram-%03d", i);
		sendto(tx, m, (size_t)ml, 0, (struct sockaddr *)&ra, sizeof ra);
		if (i % 2)
			sendto(tx, "next", 4, 0, (struct sockaddr *)&ra, sizeof ra); /* one behind it */
		poll_in(rx, 2000);
		ssize_t pl = recv(rx, pk, sizeof pk, MSG_PEEK);
		if (pl != ml || memcmp(pk, m, (size_t)ml)) {
			say("peek %d: wrong datagram (%zd)", i, pl);
			failures++;
		}
		fflush(stdout);
		pid_t c = fork();
		if (c == 0) {
			char cb[64];
			ssize_t cl = recv(rx, cb, sizeof cb, 0);
			_exit(cl == pl && !memcmp(cb, pk, (size_t)pl) ? 0 : 1);
		}
		int st = 0;
		waitpid(c, &st, 0);
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			same++;
		if (i % 2) {
			char b[16];
			ssize_t r = recv(rx, b, sizeof b, 0);
			if (r != 4 || memcmp(b, "next", 4)) {
				say("after child %d: expected the next datagram, got %zd", i, r);
				failures++;
			}
		}
	}
	say("children that read what the parent peeked: %d of %d", same, n);
	CHECK(same == n, "peek/fork: %d of %d", same, n);
	char b[16];
	say("left over: %s", res(recv(rx, b, sizeof b, MSG_DONTWAIT)));
}

/* Parent and child read one socket at once: every datagram read exactly once. */
static void case_share(void)
{
	struct sockaddr_in ra;
	int rx = udp_bound(&ra);
	int n = 300;
	int pp[2];
	pipe(pp);
	struct timeval tv = {0, 400 * 1000};
	setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	fflush(stdout);
	pid_t c = fork();
	unsigned char seen[300] = {0};
	int mine = 0;
	if (c == 0) {
		close(pp[0]);
		for (;;) {
			char b[16];
			ssize_t r = recv(rx, b, sizeof b, 0);
			if (r < 0)
				break;
			if (r == 4 && write(pp[1], b, 4) != 4)
				_exit(2);
		}
		_exit(0);
	}
	close(pp[1]);
	int tx = udp_bound(NULL);
	pid_t s = fork();
	if (s == 0) {
		for (int i = 0; i < n; i++) {
			uint32_t v = (uint32_t)i;
			sendto(tx, &v, 4, 0, (struct sockaddr *)&ra, sizeof ra);
			if (i % 10 == 9)
				usleep(2000);
		}
		_exit(0);
	}
	int dup_seen = 0, bad = 0;
	for (;;) {
		/* the first datagram may take a while on a loaded machine (the sender is a new
		 * process): the socket's 400 ms (the child's, shared) would end the parent's part
		 * before it began, and the child read everything (nothing to say for this side) */
		struct pollfd pf = {rx, POLLIN, 0};
		if (poll(&pf, 1, mine ? 400 : 5000) <= 0)
			break;
		uint32_t v;
		ssize_t r = recv(rx, &v, sizeof v, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			continue; /* the child took it */
		if (r < 0)
			break;
		if (r != 4 || v >= 300) {
			bad++;
			continue;
		}
		dup_seen += seen[v]++ > 0;
		mine++;
	}
	waitpid(s, NULL, 0);
	waitpid(c, NULL, 0);
	uint32_t v;
	int theirs = 0;
	while (read(pp[0], &v, 4) == 4) {
		if (v >= 300) {
			bad++;
			continue;
		}
		dup_seen += seen[v]++ > 0;
		theirs++;
	}
	int total = 0;
	for (int i = 0; i < n; i++)
		total += seen[i] > 0;
	say("distinct datagrams read: %d of %d, read twice: %d, foreign: %d", total, n, dup_seen, bad);
	CHECK(total == n && !dup_seen && !bad, "shared socket: %d of %d, %d twice, %d foreign", total, n, dup_seen, bad);
	printf("# parent read %d, child read %d\n", mine, theirs); /* not in the compared transcript */
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "";
	if (!strcmp(c, "epoll"))
		case_epoll();
	else if (!strcmp(c, "syscall"))
		case_syscall();
	else if (!strcmp(c, "peekfork"))
		case_peekfork();
	else if (!strcmp(c, "share"))
		case_share();
	else {
		fprintf(stderr, "usage: fdreuse epoll|syscall|peekfork|share\n");
		return 2;
	}
	return failures ? 1 : 0;
}
