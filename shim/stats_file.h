/*
 * stats_file.h - layout of /dev/shm/dgshim.<pid>, the live counters of one preloaded process
 * (written by libdgshim.so, read by `dgshim stat`). Native byte order: same host only.
 */
#ifndef DGSHIM_STATS_FILE_H
#define DGSHIM_STATS_FILE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dgshim.h"

/* The pid a /dev/shm entry named "dgshim.<pid>" is for, or -1 (another name). */
static inline long dgshim_stat_name_pid(const char *name)
{
	char *end;
	if (strncmp(name, "dgshim.", 7))
		return -1;
	long pid = strtol(name + 7, &end, 10);
	return *end || pid <= 0 || pid > 0x7fffffff ? -1 : pid;
}

#define DGSHIM_STAT_MAGIC 0x64677374u /* "dgst" */
#define DGSHIM_STAT_VERSION 3
#define DGSHIM_STAT_SLOTS 1024

struct dgshim_stat_slot {
	uint32_t in_use;
	int32_t fd;
	uint16_t family;
	uint8_t mode, qp_type;
	uint8_t provider;       /* 0 soft, 1 the RDMA device (ibverbs) */
	uint8_t pad[3];
	struct iwarp_stats st;
};

struct dgshim_stat_file {
	uint32_t magic, version, pid, nslots;
	uint32_t used; /* slots at or beyond this index were never used */
	uint32_t pad;
	char program[256];
	char provider[192];    /* the provider choice for UDP sockets and its reason ("" : soft) */
	struct dgshim_stat_slot slot[DGSHIM_STAT_SLOTS];
};

#endif
