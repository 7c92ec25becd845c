/*
 * iwarp_toggle - a program that chooses per socket, mid-stream, how its datagrams travel
 * (paper 001 section 3.1: IWARP_MODE). Run it under the shim:
 *
 *   build/shim/dgshim -- build/apps/iwarp_toggle [PORT] [COUNT]
 *
 * It streams COUNT datagrams from one UDP socket to another, switching the sender's
 * IWARP_MODE off -> ud -> rd -> off ... every 4 datagrams with setsockopt, and prints for
 * each datagram the path it took (the sender's IWARP_STATS before and after) and whether it
 * arrived intact. Exit 0 when every datagram arrived intact and both paths were used.
 *
 * Between two hosts (tests/twohost/iwarp_toggle.sh), one process each:
 *
 *   iwarp_toggle PORT COUNT recv ADDR    binds ADDR:PORT, echoes COUNT datagrams back to their
 *                                        sender, taking before datagram i the service the
 *                                        sender uses for it (UD for off and ud, RD for rd)
 *   iwarp_toggle PORT COUNT send ADDR    the toggling sender above, to ADDR:PORT; a datagram
 *                                        arrived intact when its echo equals it; it waits
 *                                        150 ms at each switch (the other host's discovery
 *                                        answer is asked again every 50 ms)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dgshim.h"

static const char *mode_name(int m)
{
	static const char *n[] = {"off", "ud", "rd", "rc", "auto"};
	return m >= 0 && m <= 4 ? n[m] : "?";
}

static int stats(int fd, struct iwarp_stats *st)
{
	socklen_t l = sizeof *st;
	return getsockopt(fd, SOL_IWARP, IWARP_STATS, st, &l);
}

static const int cycle[] = {IWARP_MODE_OFF, IWARP_MODE_UD, IWARP_MODE_RD};

/* recv ADDR: echo COUNT datagrams (the other host's end of "send") */
static int echo(struct sockaddr_in *a, int count)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0 || bind(s, (struct sockaddr *)a, sizeof *a)) {
		perror("iwarp_toggle: socket/bind");
		return 1;
	}
	struct timeval tv = {10, 0};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	int i;
	for (i = 0; i < count; i++) {
		int rmode = cycle[(i / 4) % 3] == IWARP_MODE_RD ? IWARP_MODE_RD : IWARP_MODE_UD;
		setsockopt(s, SOL_IWARP, IWARP_MODE, &rmode, sizeof rmode);
		char m[300];
		struct sockaddr_in from;
		socklen_t fl = sizeof from;
		ssize_t r = recvfrom(s, m, sizeof m, 0, (struct sockaddr *)&from, &fl);
		if (r < 0 || sendto(s, m, (size_t)r, 0, (struct sockaddr *)&from, fl) != r)
			break;
	}
	printf("echoed %d of %d datagrams\n", i, count);
	return i == count ? 0 : 1;
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 19890;
	int count = argc > 2 ? atoi(argv[2]) : 12;
	const char *role = argc > 4 ? argv[3] : NULL;
	if (port <= 0 || port > 65534 || count <= 0 || (argc > 3 && argc != 5) ||
	    (role && strcmp(role, "recv") && strcmp(role, "send"))) {
		fprintf(stderr, "usage: iwarp_toggle [PORT] [COUNT] [recv|send ADDR]\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (role && inet_pton(AF_INET, argv[4], &a.sin_addr) != 1) {
		fprintf(stderr, "iwarp_toggle: %s: not an IPv4 address\n", argv[4]);
		return 2;
	}
	if (role && !strcmp(role, "recv"))
		return echo(&a, count);
	/* send: the datagrams come back from the other host's echo to the sending socket */
	int rx = role ? -1 : socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
	if (role)
		rx = tx;
	if (rx < 0 || tx < 0 || (!role && bind(rx, (struct sockaddr *)&a, sizeof a))) {
		perror("iwarp_toggle: socket/bind");
		return 1;
	}
	struct timeval tv = {2, 0};
	setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	struct iwarp_stats before, after;
	if (stats(tx, &before)) {
		fprintf(stderr, "iwarp_toggle: getsockopt(SOL_IWARP): %s - run it under the shim "
			"(build/shim/dgshim -- ...)\n", strerror(errno));
		return 1;
	}
	int bad = 0, framed = 0, plain = 0;
	for (int i = 0; i < count; i++) {
		int mode = cycle[(i / 4) % 3];
		if (setsockopt(tx, SOL_IWARP, IWARP_MODE, &mode, sizeof mode)) {
			fprintf(stderr, "iwarp_toggle: setsockopt(IWARP_MODE, %s): %s\n", mode_name(mode), strerror(errno));
			return 1;
		}
		/* the receiver says which service it takes, as a program that wants the same would */
		int rmode = mode == IWARP_MODE_RD ? IWARP_MODE_RD : IWARP_MODE_UD;
		if (!role)
			setsockopt(rx, SOL_IWARP, IWARP_MODE, &rmode, sizeof rmode);
		if (i % 4 == 0)
			usleep(role ? 150000 : 2000); /* senders ask again within a millisecond after a "no" */
		char msg[256], got[300];
		int n = snprintf(msg, sizeof msg, "datagram %d sent with IWARP_MODE=%s", i, mode_name(mode));
		stats(tx, &before);
		if (sendto(tx, msg, (size_t)n, 0, (struct sockaddr *)&a, sizeof a) != n) {
			perror("iwarp_toggle: sendto");
			return 1;
		}
		stats(tx, &after);
		ssize_t r = recv(rx, got, sizeof got, 0);
		bool ok = r == n && !memcmp(got, msg, (size_t)n);
		bool was_framed = after.tx_framed > before.tx_framed;
		framed += was_framed, plain += !was_framed;
		bad += !ok;
		printf("%3d  mode %-3s  path %-6s  %s\n", i, mode_name(mode), was_framed ? "framed" : "plain",
		       ok ? "arrived intact" : "LOST OR CORRUPTED");
	}
	printf("%d framed, %d plain, %d bad\n", framed, plain, bad);
	return bad || !framed || !plain ? 1 : 0;
}
