/*
 * stats.c - per-socket counters in a file other processes can read while this one runs:
 * /dev/shm/dgshim.<pid> (`dgshim stat <pid>` prints it), and the exit summary line.
 * The file holds a header and SHIM_STAT_SLOTS slots; a socket beyond them counts in its own
 * memory (still in IWARP_STATS and the summary).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "sock.h"
#include "stats_file.h"

static struct dgshim_stat_file *file;
static char path[64];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static struct iwarp_stats closed;  /* totals of sockets already closed */
static unsigned closed_socks, closed_dev;

static void open_file(void)
{
	snprintf(path, sizeof path, "/dev/shm/dgshim.%d", (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (ftruncate(fd, sizeof *file)) {
		close(fd);
		unlink(path);
		return;
	}
	void *p = mmap(NULL, sizeof *file, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		unlink(path);
		return;
	}
	file = p;
	file->magic = DGSHIM_STAT_MAGIC;
	file->version = DGSHIM_STAT_VERSION;
	file->pid = (uint32_t)getpid();
	file->nslots = DGSHIM_STAT_SLOTS;
	/* argv[0], not /proc/self/exe: one executable can be several programs (redis-server is a
	 * link to redis-check-rdb) and the user knows the name they ran */
	int cfd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	ssize_t n = cfd >= 0 ? read(cfd, file->program, sizeof file->program - 1) : -1;
	if (cfd >= 0)
		close(cfd);
	if (n <= 0)
		n = readlink("/proc/self/exe", file->program, sizeof file->program - 1);
	if (n > 0)
		file->program[n] = 0;
}

/* Removes the counters files of processes that are gone. A process removes its own at exit,
 * but not one killed by a signal, nor one that changed its user after it started (a server
 * dropping root: /dev/shm is sticky, the file is root's): without this, /dev/shm keeps a file
 * per such process for ever (the test suite left hundreds). Files of live processes and of
 * other users stay (kill(pid, 0) answers EPERM, not ESRCH, for those). */
static void sweep_stale(void)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		long pid = dgshim_stat_name_pid(e->d_name);
		if (pid < 0 || pid == (long)getpid())
			continue;
		if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
			unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

void stats_init(void)
{
	if (dg_env_word(DG_ENV_STATS) == DG_OFF)
		return;
	sweep_stale();
	open_file();
}

void stats_after_fork(void)
{
	pthread_mutex_init(&slot_lock, NULL);
	if (!file)
		return;
	/* the child gets its own file; its sockets start counting from zero there */
	struct dgshim_stat_file *old = file;
	file = NULL;
	open_file();
	for (int fd = 0, hi = fd_max(); fd <= hi; fd++) {
		struct sock *s = fd_sock(fd);
		if (!s)
			continue;
		if (s->stat_slot >= 0 && file) {
			file->slot[s->stat_slot] = old->slot[s->stat_slot];
			s->st = &file->slot[s->stat_slot].st;
		} else if (s->stat_slot >= 0) {
			s->own_st = old->slot[s->stat_slot].st;
			s->st = &s->own_st;
			s->stat_slot = -1;
		}
	}
	munmap(old, sizeof *old);
}

struct iwarp_stats *stats_slot(struct sock *s, int fd)
{
	s->stat_slot = -1;
	if (file) {
		pthread_mutex_lock(&slot_lock);
		for (int i = 0; i < DGSHIM_STAT_SLOTS; i++)
			if (!file->slot[i].in_use) {
				memset(&file->slot[i], 0, sizeof file->slot[i]);
				file->slot[i].in_use = 1;
				file->slot[i].fd = fd;
				file->slot[i].family = (uint16_t)s->family;
				/* what the socket starts as (a TCP socket's stays: the stream code does
				 * not report it), so a listener reads auto or off, as the rules said */
				file->slot[i].mode = (uint8_t)s->mode;
				s->stat_slot = i;
				if ((uint32_t)i >= file->used)
					file->used = (uint32_t)i + 1;
				break;
			}
		pthread_mutex_unlock(&slot_lock);
	}
	return s->stat_slot >= 0 ? &file->slot[s->stat_slot].st : &s->own_st;
}

static void add(struct iwarp_stats *t, const struct iwarp_stats *a)
{
	uint64_t *d = (uint64_t *)t;
	const uint64_t *x = (const uint64_t *)a;
	for (size_t i = 0; i < sizeof *t / sizeof(uint64_t); i++)
		d[i] += x[i];
}

void stats_release(struct sock *s)
{
	if (s->qp || s->st->tx_framed || s->st->rx_framed || s->st->tx_plain || s->st->rx_plain) {
		pthread_mutex_lock(&slot_lock);
		add(&closed, s->st);
		closed_socks++;
		closed_dev += s->pv == &G.dev;
		pthread_mutex_unlock(&slot_lock);
	}
	if (s->stat_slot >= 0 && file) {
		pthread_mutex_lock(&slot_lock);
		file->slot[s->stat_slot].in_use = 0;
		pthread_mutex_unlock(&slot_lock);
	}
	s->st = &s->own_st;
}

void stats_note_mode(struct sock *s)
{
	if (s->stat_slot >= 0 && file) {
		file->slot[s->stat_slot].mode = (uint8_t)s->mode;
		file->slot[s->stat_slot].qp_type = (uint8_t)s->qp_type;
		file->slot[s->stat_slot].provider = s->pv == &G.dev;
	}
	if (file && G.dev_why[0])
		memcpy(file->provider, G.dev_why, sizeof file->provider);
}

void stats_note_stream(struct sock *s, const struct shim_pv *pv)
{
	if (s->stat_slot >= 0 && file) {
		file->slot[s->stat_slot].mode = IWARP_MODE_RC;
		file->slot[s->stat_slot].provider = pv == &G.dev;
	}
}

void shim_fini(void)
{
	stream_fini();
	if (dg_log_on(DG_LOG_INFO) && G.gen) {
		struct iwarp_stats t = closed;
		unsigned n = closed_socks, ndev = closed_dev;
		for (int fd = 0, hi = fd_max(); fd <= hi; fd++) {
			struct sock *s = fd_sock(fd);
			if (s && pthread_mutex_trylock(&s->lock) == 0) {
				stats_pull(s);
				if (s->qp || s->st->tx_plain || s->st->rx_plain) {
					add(&t, s->st);
					n++;
					ndev += s->pv == &G.dev;
				}
				pthread_mutex_unlock(&s->lock);
			}
		}
		struct stream_totals rc;
		stream_totals(&rc);
		unsigned dests;
		unsigned long long dests_gone;
		peer_totals(&dests, &dests_gone);
		if (n == 0 && !rc.conns && !rc.plain && !dg_log_on(DG_LOG_DEBUG))
			goto out; /* a process without sockets (a shell on the way) says nothing */
		dg_log(DG_LOG_INFO,
		       "summary: sockets=%u tx_framed=%llu tx_plain=%llu rx_framed=%llu rx_plain=%llu "
		       "tx_zcopy=%llu tx_bytes=%llu rx_bytes=%llu crc_drops=%llu rejected=%llu lost=%llu "
		       "retransmits=%llu rc_conns=%llu rc_plain=%llu rc_tx_bytes=%llu rc_rx_bytes=%llu rc_on_device=%llu "
		       "rc_reset=%llu rc_peer_gone=%llu rc_no_room=%llu rc_idle_freed=%llu udp_on_device=%u dests=%u dests_forgotten=%llu "
		       "disco_asks=%llu%s%s",
		       n, (unsigned long long)t.tx_framed, (unsigned long long)t.tx_plain,
		       (unsigned long long)t.rx_framed, (unsigned long long)t.rx_plain,
		       (unsigned long long)t.tx_zcopy, (unsigned long long)(t.tx_framed_bytes + t.tx_plain_bytes),
		       (unsigned long long)(t.rx_framed_bytes + t.rx_plain_bytes),
		       (unsigned long long)t.crc_drops, (unsigned long long)t.rejected, (unsigned long long)t.lost,
		       (unsigned long long)t.retransmits, (unsigned long long)rc.conns,
		       (unsigned long long)rc.plain, (unsigned long long)rc.tx_bytes,
		       (unsigned long long)rc.rx_bytes, (unsigned long long)rc.dev,
		       (unsigned long long)rc.resets, (unsigned long long)rc.peer_gone, (unsigned long long)rc.no_room,
		       (unsigned long long)rc.idle_freed, ndev, dests, dests_gone,
		       (unsigned long long)disco_asks(), G.dev_why[0] ? " provider=" : "", G.dev_why);
	}
out:
	if (file && file->pid == (uint32_t)getpid())
		unlink(path);
}
