/*
 * uringcheck: a small io_uring echo client (liburing), for uringcheck.sh. It sends a message to
 * an echo server and reads the echo back, both through io_uring requests (IORING_OP_SEND and
 * IORING_OP_RECV), on TCP or UDP.
 *
 *   uringcheck tcp|udp PORT    prints "uringcheck: OK echo N bytes" (exit 0), or
 *                              "uringcheck: REFUSED errno" when io_uring_submit refused the
 *                              request (exit 3), or "uringcheck: FAIL why" (exit 1)
 *
 * Natively the echo works; under the shim a carried connection's request must be refused
 * loudly (the kernel would move the bytes past the shim), and a plain one must work.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int one(struct io_uring *ring, int fd, void *buf, size_t len, int send)
{
	struct io_uring_sqe *e = io_uring_get_sqe(ring);
	if (send)
		io_uring_prep_send(e, fd, buf, len, 0);
	else
		io_uring_prep_recv(e, fd, buf, len, 0);
	int r = io_uring_submit(ring);
	if (r < 0) {
		printf("uringcheck: REFUSED %s\n", strerror(-r));
		exit(3);
	}
	struct io_uring_cqe *c;
	if ((r = io_uring_wait_cqe(ring, &c)) < 0) {
		printf("uringcheck: FAIL wait_cqe: %s\n", strerror(-r));
		exit(1);
	}
	int res = c->res;
	io_uring_cqe_seen(ring, c);
	return res;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "tcp") && strcmp(argv[1], "udp"))) {
		fprintf(stderr, "usage: uringcheck tcp|udp PORT\n");
		return 2;
	}
	int tcp = !strcmp(argv[1], "tcp");
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	int fd = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		printf("uringcheck: FAIL connect: %s\n", strerror(errno));
		return 1;
	}
	struct io_uring ring;
	int r = io_uring_queue_init(8, &ring, 0);
	if (r < 0) {
		printf("uringcheck: FAIL queue_init: %s\n", strerror(-r));
		return 1;
	}
	char msg[] = "uringcheck hello, 0123456789", got[sizeof msg] = {0};
	int n = one(&ring, fd, msg, sizeof msg, 1);
	if (n != (int)sizeof msg) {
		printf("uringcheck: FAIL send: %d\n", n);
		return 1;
	}
	size_t have = 0;
	while (have < sizeof msg) {
		n = one(&ring, fd, got + have, sizeof msg - have, 0);
		if (n <= 0) {
			printf("uringcheck: FAIL recv: %d after %zu bytes\n", n, have);
			return 1;
		}
		have += (size_t)n;
	}
	if (memcmp(msg, got, sizeof msg)) {
		printf("uringcheck: FAIL the echo differs\n");
		return 1;
	}
	printf("uringcheck: OK echo %zu bytes\n", sizeof msg);
	io_uring_queue_exit(&ring);
	close(fd);
	return 0;
}
