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

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 19890;
	int count = argc > 2 ? atoi(argv[2]) : 12;
	if (port <= 0 || port > 65534 || count <= 0) {
		fprintf(stderr, "usage: iwarp_toggle [PORT] [COUNT]\n");
		return 2;
	}
	int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (rx < 0 || tx < 0 || bind(rx, (struct sockaddr *)&a, sizeof a)) {
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
	static const int cycle[] = {IWARP_MODE_OFF, IWARP_MODE_UD, IWARP_MODE_RD};
	int bad = 0, framed = 0, plain = 0;
	for (int i = 0; i < count; i++) {
		int mode = cycle[(i / 4) % 3];
		if (setsockopt(tx, SOL_IWARP, IWARP_MODE, &mode, sizeof mode)) {
			fprintf(stderr, "iwarp_toggle: setsockopt(IWARP_MODE, %s): %s\n", mode_name(mode), strerror(errno));
			return 1;
		}
		/* the receiver says which service it takes, as a program that wants the same would */
		int rmode = mode == IWARP_MODE_RD ? IWARP_MODE_RD : IWARP_MODE_UD;
		setsockopt(rx, SOL_IWARP, IWARP_MODE, &rmode, sizeof rmode);
		if (i % 4 == 0)
			usleep(2000); /* senders ask again within a millisecond after a "no" */
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
