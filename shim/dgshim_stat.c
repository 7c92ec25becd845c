/* dgshim-stat - prints the live counters of a preloaded process (/dev/shm/dgshim.<pid>). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stats_file.h"

static const char *mode_name(int m)
{
	static const char *n[] = {"off", "ud", "rd", "rc", "auto"};
	return m >= 0 && m <= 4 ? n[m] : "?";
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: dgshim-stat PID\n");
		return 2;
	}
	char *end;
	long pid = strtol(argv[1], &end, 10);
	if (*end || pid <= 0) {
		fprintf(stderr, "dgshim-stat: '%s' is not a process id\n", argv[1]);
		return 2;
	}
	char path[64];
	snprintf(path, sizeof path, "/dev/shm/dgshim.%ld", pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "dgshim-stat: %s: %s (is process %ld running under the shim?)\n", path,
			strerror(errno), pid);
		return 1;
	}
	struct dgshim_stat_file *f = mmap(NULL, sizeof *f, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (f == MAP_FAILED || f->magic != DGSHIM_STAT_MAGIC || f->version != DGSHIM_STAT_VERSION) {
		fprintf(stderr, "dgshim-stat: %s: not a counters file of this version\n", path);
		return 1;
	}
	printf("pid %u  %s\n", f->pid, f->program);
	printf("provider for UDP: %s\n", f->provider[0] ? f->provider : "soft");
	printf("%5s %4s %4s %10s %10s %10s %10s %12s %12s %6s %6s %6s\n", "fd", "mode", "qp", "tx_framed",
	       "tx_plain", "rx_framed", "rx_plain", "tx_bytes", "rx_bytes", "crc", "lost", "rexmit");
	for (uint32_t i = 0; i < f->used && i < DGSHIM_STAT_SLOTS; i++) {
		const struct dgshim_stat_slot *s = &f->slot[i];
		if (!s->in_use)
			continue;
		const struct iwarp_stats *t = &s->st;
		printf("%5d %4s %4s %10llu %10llu %10llu %10llu %12llu %12llu %6llu %6llu %6llu\n", s->fd,
		       mode_name(s->mode), s->qp_type == 2 ? "rd" : s->qp_type == 1 ? (s->provider ? "udv" : "ud") : "-",
		       (unsigned long long)t->tx_framed, (unsigned long long)t->tx_plain,
		       (unsigned long long)t->rx_framed, (unsigned long long)t->rx_plain,
		       (unsigned long long)(t->tx_framed_bytes + t->tx_plain_bytes),
		       (unsigned long long)(t->rx_framed_bytes + t->rx_plain_bytes),
		       (unsigned long long)t->crc_drops, (unsigned long long)t->lost,
		       (unsigned long long)t->retransmits);
	}
	return 0;
}
