/*
 * env.h - every DGSHIM_* environment variable, read and checked in one place (env.c): its
 * name, what it accepts and its default. Nothing else in the tree calls getenv for one of them
 * (docs/shim.md "Environment" is the user's list of the same table).
 *
 * A bad value is said once on stderr (dg_log_always: whatever DGSHIM_LOG says, since whoever
 * set it wants to know) naming the variable, the value and what it expects; the caller gets
 * the default, or -EINVAL where it must refuse (dg_env_word).
 */
#ifndef DG_ENV_H
#define DG_ENV_H

enum dg_env {
	DG_ENV_LOG,             /* off|error|warn|info|debug|0-4 (log.c parses the level) */
	DG_ENV_LOG_FILE,        /* a path, %p the pid */
	DG_ENV_CONF,            /* the rules file (secure_getenv) */
	DG_ENV_MODE,            /* the fallback mode (secure_getenv; rules.c parses it) */
	DG_ENV_RULES,           /* inline rules (secure_getenv) */
	DG_ENV_PROVIDER,        /* auto|soft|ibverbs */
	DG_ENV_IBV_DEVICE,      /* an RDMA device's name */
	DG_ENV_IBV_LIB,         /* the libibverbs to dlopen (secure_getenv) */
	DG_ENV_RDMACM_LIB,      /* the librdmacm to dlopen (secure_getenv) */
	DG_ENV_PROGRESS,        /* auto|app|thread */
	DG_ENV_MPA_CRC,         /* on|off|1|0 */
	DG_ENV_FAULT_TX,        /* a fault spec (dgv_fault_parse) */
	DG_ENV_FAULT_RX,
	DG_ENV_SPIN_US,         /* 0..100000 */
	DG_ENV_ZCOPY_THRESHOLD, /* bytes */
	DG_ENV_STREAM_BUF,      /* bytes, k/M suffix (stream.c checks the range) */
	DG_ENV_DISCOVERY,       /* on|off */
	DG_ENV_DISCOVERY_PORT,  /* 0 (off) or a UDP port */
	DG_ENV_STATS,           /* on|off */
	DG_ENV_UDP_GSO,         /* on|off: UDP GSO sends and GRO receives of the soft provider */
	DG_ENV_DEST_IDLE_MS,    /* 100..86400000: a destination unused this long is forgotten (peer.c) */
	DG_ENV_STREAM_IDLE_MS,  /* 0 (never)..86400000: an idle stream's buffers go back (stream.c) */
	DG_ENV_COUNT
};

/* The variable's name, e.g. "DGSHIM_LOG". */
const char *dg_env_name(enum dg_env v);
/* Its value, NULL when unset or empty. */
const char *dg_env_str(enum dg_env v);
/* A number variable: its value when it is a whole decimal number in the table's range, the
 * default when unset; a bad value is said once and gives the default. */
long dg_env_long(enum dg_env v);
/* A word variable: the index of its value in the table's words (case-insensitive), the
 * default word's index when unset; -EINVAL for anything else, said once. */
int dg_env_word(enum dg_env v);

/* Word indexes, in the table's order. */
enum { DG_PROVIDER_AUTO = 0, DG_PROVIDER_SOFT = 1, DG_PROVIDER_IBVERBS = 2 };
enum { DG_PROGRESS_AUTO = 0, DG_PROGRESS_APP = 1, DG_PROGRESS_THREAD = 2 };
enum { DG_ON = 0, DG_OFF = 1 }; /* on|off variables (MPA_CRC also takes 1 and 0) */

#endif
