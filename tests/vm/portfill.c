/* portfill - holds most of the kernel's ephemeral TCP ports, as a busy host's connections and
 * TIME_WAIT sockets do, so that a port rdma_cm picks for an iWARP device (which binds a kernel
 * TCP socket to it) is likely taken (vm-test shim_tcp_ports).
 *
 *   portfill PERCENT ADDR: binds a TCP socket to ADDR and each port of the kernel's ephemeral
 *   range (/proc/sys/net/ipv4/ip_local_port_range) whose offset in it is below PERCENT modulo
 *   100 (one already taken is skipped), prints "portfill: holding N ports" and sleeps until
 *   killed. Explicit ports: port 0 makes the kernel search, slow as the range fills (minutes
 *   under TCG). Exit 1 when it cannot hold them (descriptor limit: it raises its own).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: portfill PERCENT ADDR\n");
		return 2;
	}
	int lo = 32768, hi = 60999;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2)
			lo = 32768, hi = 60999;
		fclose(f);
	}
	long want = (long)(hi - lo + 1) * atoi(argv[1]) / 100;
	struct rlimit rl = {(rlim_t)want + 64, (rlim_t)want + 64};
	if (setrlimit(RLIMIT_NOFILE, &rl)) {
		fprintf(stderr, "portfill: RLIMIT_NOFILE %ld: %s\n", want + 64, strerror(errno));
		return 1;
	}
	struct sockaddr_in a = {.sin_family = AF_INET};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "portfill: bad address %s\n", argv[2]);
		return 2;
	}
	long n = 0;
	int pct = atoi(argv[1]);
	for (int p = lo; p <= hi; p++) {
		if ((p - lo) % 100 >= pct)
			continue;
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0) {
			fprintf(stderr, "portfill: after %ld ports: %s\n", n, strerror(errno));
			return 1;
		}
		a.sin_port = htons((uint16_t)p);
		if (bind(s, (struct sockaddr *)&a, sizeof a)) {
			close(s); /* in use already */
			continue;
		}
		n++;
	}
	printf("portfill: holding %ld ports of %d-%d\n", n, lo, hi);
	fflush(stdout);
	for (;;)
		pause();
}
