/*
 * dgshim-stat - live counters of preloaded processes (/dev/shm/dgshim.<pid>), `dgshim stat`.
 *
 *   dgshim-stat [PID...] [-i SECONDS] [-c COUNT] [--json]
 *
 * The counters file says what the shim knows per socket (mode, queue pair, counters); what the
 * kernel knows (protocol, TCP state, addresses) is read from /proc/PID/fd and /proc/PID/net,
 * so a listener and a connection are told apart without the shim having to say it.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stats_file.h"

#define MAX_PROCS 4096

struct knet { /* one line of /proc/PID/net/{udp,tcp}{,6} */
	unsigned long ino;
	char proto[4];
	int state; /* TCP state number (1 established, 10 listen), 7 for UDP */
	char local[64], remote[64];
};

struct row {
	int fd;
	uint32_t slot;
	const char *proto, *state, *mode, *carrier;
	char local[64], remote[64];
	struct iwarp_stats st;
};

struct proc {
	int pid;
	bool gone;
	char program[256];
	char provider[192];
	int nrows;
	struct row *rows;
};

/* previous report, for rates: (pid, slot, fd) -> counters */
struct prev {
	int pid, fd;
	uint32_t slot;
	struct iwarp_stats st;
};
static struct prev *prevs;
static size_t nprev, capprev;

static const char *mode_name(int m)
{
	static const char *n[] = {"off", "ud", "rd", "rc", "auto"};
	return m >= 0 && m <= 4 ? n[m] : "?";
}

static const char *tcp_state(int st)
{
	static const char *n[] = {"?", "conn", "syn-sent", "syn-recv", "fin-wait1", "fin-wait2",
				  "time-wait", "closed", "close-wait", "last-ack", "listen", "closing"};
	return st >= 0 && st <= 11 ? n[st] : "?";
}

static void addr_str(const char *hex, bool v6, char *out, size_t size)
{
	/* /proc/net: the address as 32-bit words in host order, then :PORT in hex */
	const char *colon = strchr(hex, ':');
	if (!colon) {
		snprintf(out, size, "?");
		return;
	}
	unsigned port = (unsigned)strtoul(colon + 1, NULL, 16);
	unsigned char a[16];
	int words = v6 ? 4 : 1;
	for (int w = 0; w < words; w++) {
		char part[9];
		memcpy(part, hex + 8 * w, 8);
		part[8] = 0;
		uint32_t x = (uint32_t)strtoul(part, NULL, 16);
		memcpy(a + 4 * w, &x, 4);
	}
	char ip[INET6_ADDRSTRLEN];
	inet_ntop(v6 ? AF_INET6 : AF_INET, a, ip, sizeof ip);
	if (v6)
		snprintf(out, size, "[%s]:%u", ip, port);
	else
		snprintf(out, size, "%s:%u", ip, port);
}

static int knet_load(int pid, struct knet **out)
{
	static const char *files[] = {"udp", "udp6", "tcp", "tcp6"};
	struct knet *v = NULL;
	int n = 0, cap = 0;
	for (int f = 0; f < 4; f++) {
		char path[64], line[512];
		snprintf(path, sizeof path, "/proc/%d/net/%s", pid, files[f]);
		FILE *fp = fopen(path, "r");
		if (!fp)
			continue;
		if (!fgets(line, sizeof line, fp)) { /* header */
			fclose(fp);
			continue;
		}
		while (fgets(line, sizeof line, fp)) {
			char la[64], ra[64];
			unsigned st;
			unsigned long ino;
			if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", la, ra, &st, &ino) != 4)
				continue;
			if (n == cap) {
				cap = cap ? cap * 2 : 64;
				struct knet *nv = realloc(v, (size_t)cap * sizeof *v);
				if (!nv)
					break;
				v = nv;
			}
			struct knet *k = &v[n++];
			k->ino = ino;
			snprintf(k->proto, sizeof k->proto, "%.3s", files[f]);
			k->state = (int)st;
			bool v6 = files[f][3] == '6';
			addr_str(la, v6, k->local, sizeof k->local);
			addr_str(ra, v6, k->remote, sizeof k->remote);
		}
		fclose(fp);
	}
	*out = v;
	return n;
}

/* basename of argv[0] as the process shows it now (a program may rewrite it, as redis-server
 * does; its executable's name can be another program's: redis-check-rdb) */
static bool live_name(int pid, char *out, size_t size)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	buf[strcspn(buf, " ")] = 0; /* a rewritten title: "redis-server *:6379" */
	const char *b = strrchr(buf, '/');
	b = b ? b + 1 : buf;
	size_t len = strnlen(b, size - 1);
	memcpy(out, b, len);
	out[len] = 0;
	return len != 0;
}

/* The process still maps its counters file: it is alive and it is the file's writer (a pid
 * reused after a crash left a stale file does not). */
static bool maps_file(int pid)
{
	char path[64], line[512], want[64];
	snprintf(path, sizeof path, "/proc/%d/maps", pid);
	snprintf(want, sizeof want, "/dev/shm/dgshim.%d", pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return false;
	bool found = false;
	while (!found && fgets(line, sizeof line, fp))
		found = strstr(line, want) != NULL;
	fclose(fp);
	return found;
}

/* 0 read, -ENOENT no such counters file, -ESRCH the writer is gone, other -errno */
static int proc_read(int pid, struct proc *p)
{
	memset(p, 0, sizeof *p);
	p->pid = pid;
	char path[64];
	snprintf(path, sizeof path, "/dev/shm/dgshim.%d", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat sb;
	if (fstat(fd, &sb) || (size_t)sb.st_size < sizeof(struct dgshim_stat_file)) {
		close(fd);
		return -EPROTO;
	}
	const struct dgshim_stat_file *f = mmap(NULL, sizeof *f, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (f == MAP_FAILED)
		return -errno;
	if (f->magic != DGSHIM_STAT_MAGIC || f->version != DGSHIM_STAT_VERSION) {
		munmap((void *)f, sizeof *f);
		return -EPROTO;
	}
	/* one copy, then all from it: the writer may exit (and unlink) meanwhile; the mapping
	 * stays valid, so what was counted until then is shown */
	struct dgshim_stat_file *c = malloc(sizeof *c);
	if (!c) {
		munmap((void *)f, sizeof *f);
		return -ENOMEM;
	}
	memcpy(c, f, sizeof *c);
	munmap((void *)f, sizeof *f);
	c->program[sizeof c->program - 1] = 0;
	c->provider[sizeof c->provider - 1] = 0;
	if (!live_name(pid, p->program, sizeof p->program)) {
		const char *b = strrchr(c->program, '/');
		snprintf(p->program, sizeof p->program, "%s", b ? b + 1 : c->program);
	}
	snprintf(p->provider, sizeof p->provider, "%s", c->provider[0] ? c->provider : "soft");
	struct knet *kn = NULL;
	int nk = knet_load(pid, &kn);
	uint32_t used = c->used < DGSHIM_STAT_SLOTS ? c->used : DGSHIM_STAT_SLOTS;
	p->rows = calloc(used ? used : 1, sizeof *p->rows);
	for (uint32_t i = 0; p->rows && i < used; i++) {
		const struct dgshim_stat_slot *s = &c->slot[i];
		if (!s->in_use)
			continue;
		struct row *r = &p->rows[p->nrows++];
		r->fd = s->fd, r->slot = i, r->st = s->st;
		r->proto = "?", r->state = "", r->local[0] = r->remote[0] = 0;
		char fdp[64], link[128];
		snprintf(fdp, sizeof fdp, "/proc/%d/fd/%d", pid, s->fd);
		ssize_t ln = readlink(fdp, link, sizeof link - 1);
		unsigned long ino = 0;
		if (ln > 0) {
			link[ln] = 0;
			sscanf(link, "socket:[%lu]", &ino);
		}
		const struct knet *k = NULL;
		for (int j = 0; ino && j < nk; j++)
			if (kn[j].ino == ino)
				k = &kn[j];
		bool tcp = k && !strcmp(k->proto, "tcp");
		if (k) {
			r->proto = tcp ? "tcp" : "udp";
			r->state = tcp ? tcp_state(k->state) : "";
			snprintf(r->local, sizeof r->local, "%s", k->local);
			if (tcp ? k->state != 10 : strcmp(k->remote, "0.0.0.0:0") && strcmp(k->remote, "[::]:0"))
				snprintf(r->remote, sizeof r->remote, "%s", k->remote);
		}
		r->mode = mode_name(s->mode);
		bool framed = s->st.tx_framed || s->st.rx_framed;
		bool plain = s->st.tx_plain || s->st.rx_plain;
		if (s->qp_type == 2)
			r->carrier = "rd";
		else if (s->qp_type == 1)
			r->carrier = s->provider ? "ud-dev" : "ud";
		else if (tcp && k->state == 10)
			r->carrier = "-"; /* a listener carries nothing; its connections have rows */
		else if (framed)
			r->carrier = tcp ? (s->provider ? "rc-dev" : "rc") : "framed";
		else if (plain)
			r->carrier = "plain";
		else
			r->carrier = "-";
	}
	free(kn);
	free(c);
	/* a writer gone now may have gone before the copy (its last counters are still shown) */
	if (!maps_file(pid))
		p->gone = true;
	return 0;
}

static void proc_free(struct proc *p)
{
	free(p->rows);
	p->rows = NULL;
}

static const struct prev *prev_find(int pid, uint32_t slot, int fd)
{
	for (size_t i = 0; i < nprev; i++)
		if (prevs[i].pid == pid && prevs[i].slot == slot && prevs[i].fd == fd)
			return &prevs[i];
	return NULL;
}

struct rates {
	double tx, rx, txb, rxb;
	bool have;
};

static struct rates rates_of(const struct proc *p, const struct row *r, double dt)
{
	struct rates x = {0};
	const struct prev *o = dt > 0 ? prev_find(p->pid, r->slot, r->fd) : NULL;
	if (!o)
		return x;
	const struct iwarp_stats *a = &o->st, *b = &r->st;
	x.tx = (double)(b->tx_framed + b->tx_plain - a->tx_framed - a->tx_plain) / dt;
	x.rx = (double)(b->rx_framed + b->rx_plain - a->rx_framed - a->rx_plain) / dt;
	x.txb = (double)(b->tx_framed_bytes + b->tx_plain_bytes - a->tx_framed_bytes - a->tx_plain_bytes) / dt;
	x.rxb = (double)(b->rx_framed_bytes + b->rx_plain_bytes - a->rx_framed_bytes - a->rx_plain_bytes) / dt;
	x.have = true;
	return x;
}

static void prev_save(const struct proc *ps, int n)
{
	nprev = 0;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < ps[i].nrows; j++) {
			if (nprev == capprev) {
				size_t nc = capprev ? capprev * 2 : 256;
				struct prev *np = realloc(prevs, nc * sizeof *np);
				if (!np)
					return;
				prevs = np, capprev = nc;
			}
			prevs[nprev++] = (struct prev){ps[i].pid, ps[i].rows[j].fd, ps[i].rows[j].slot, ps[i].rows[j].st};
		}
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

#define U(x) ((unsigned long long)(x))

static void print_json(const struct proc *ps, int n, double t, double dt)
{
	printf("{\"time\":%.3f,\"interval\":%.3f,\"processes\":[", t, dt);
	for (int i = 0; i < n; i++) {
		const struct proc *p = &ps[i];
		printf("%s{\"pid\":%d,\"program\":", i ? "," : "", p->pid);
		json_str(p->program);
		printf(",\"provider\":");
		json_str(p->provider);
		printf(",\"gone\":%s,\"sockets\":[", p->gone ? "true" : "false");
		for (int j = 0; j < p->nrows; j++) {
			const struct row *r = &p->rows[j];
			const struct iwarp_stats *s = &r->st;
			printf("%s{\"fd\":%d,\"proto\":\"%s\",\"state\":\"%s\",\"mode\":\"%s\",\"carrier\":\"%s\","
			       "\"local\":", j ? "," : "", r->fd, r->proto, r->state, r->mode, r->carrier);
			json_str(r->local);
			printf(",\"remote\":");
			json_str(r->remote);
			printf(",\"tx_framed\":%llu,\"tx_plain\":%llu,\"rx_framed\":%llu,\"rx_plain\":%llu,"
			       "\"tx_framed_bytes\":%llu,\"tx_plain_bytes\":%llu,\"rx_framed_bytes\":%llu,"
			       "\"rx_plain_bytes\":%llu,\"tx_zcopy\":%llu,\"crc_drops\":%llu,\"rejected\":%llu,\"lost\":%llu,"
			       "\"retransmits\":%llu,\"wire_tx\":%llu,\"wire_rx\":%llu",
			       U(s->tx_framed), U(s->tx_plain), U(s->rx_framed), U(s->rx_plain),
			       U(s->tx_framed_bytes), U(s->tx_plain_bytes), U(s->rx_framed_bytes),
			       U(s->rx_plain_bytes), U(s->tx_zcopy), U(s->crc_drops), U(s->rejected), U(s->lost),
			       U(s->retransmits), U(s->wire_tx), U(s->wire_rx));
			struct rates x = rates_of(p, r, dt);
			if (x.have)
				printf(",\"rates\":{\"tx_per_s\":%.1f,\"rx_per_s\":%.1f,\"tx_bytes_per_s\":%.1f,"
				       "\"rx_bytes_per_s\":%.1f}", x.tx, x.rx, x.txb, x.rxb);
			putchar('}');
		}
		printf("]}");
	}
	printf("]}\n");
}

static void human(double v, char *out, size_t size)
{
	if (v >= 1e9)
		snprintf(out, size, "%.1fG", v / 1e9);
	else if (v >= 1e6)
		snprintf(out, size, "%.1fM", v / 1e6);
	else if (v >= 1e4)
		snprintf(out, size, "%.1fk", v / 1e3);
	else
		snprintf(out, size, "%.0f", v);
}

static void print_text(const struct proc *ps, int n, double dt, bool all)
{
	if (n == 0 && all)
		printf("no process is running under dgshim (no /dev/shm/dgshim.* counters file)\n");
	for (int i = 0; i < n; i++) {
		const struct proc *p = &ps[i];
		printf("%spid %d  %s  provider: %s%s\n", i ? "\n" : "", p->pid, p->program, p->provider,
		       p->gone ? "  (exited; its last counters)" : "");
		if (!p->nrows) {
			printf("  no sockets taken\n");
			continue;
		}
		printf("%5s %-5s %-9s %-4s %-7s %-21s %-21s %9s %9s %9s %9s %10s %10s %5s %5s %6s", "fd",
		       "proto", "state", "mode", "carrier", "local", "remote", "tx_framed", "tx_plain",
		       "rx_framed", "rx_plain", "tx_bytes", "rx_bytes", "crc", "lost", "rexmit");
		if (dt > 0)
			printf(" %8s %8s %8s %8s", "tx/s", "rx/s", "txB/s", "rxB/s");
		putchar('\n');
		for (int j = 0; j < p->nrows; j++) {
			const struct row *r = &p->rows[j];
			const struct iwarp_stats *s = &r->st;
			printf("%5d %-5s %-9s %-4s %-7s %-21s %-21s %9llu %9llu %9llu %9llu %10llu %10llu %5llu %5llu %6llu",
			       r->fd, r->proto, r->state[0] ? r->state : "-", r->mode, r->carrier,
			       r->local[0] ? r->local : "-", r->remote[0] ? r->remote : "-", U(s->tx_framed),
			       U(s->tx_plain), U(s->rx_framed), U(s->rx_plain),
			       U(s->tx_framed_bytes + s->tx_plain_bytes), U(s->rx_framed_bytes + s->rx_plain_bytes),
			       U(s->crc_drops), U(s->lost), U(s->retransmits));
			struct rates x = rates_of(p, r, dt);
			if (x.have) {
				char a[16], b[16], c[16], d[16];
				human(x.tx, a, sizeof a), human(x.rx, b, sizeof b);
				human(x.txb, c, sizeof c), human(x.rxb, d, sizeof d);
				printf(" %8s %8s %8s %8s", a, b, c, d);
			}
			putchar('\n');
		}
	}
	fflush(stdout);
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* pids with a counters file whose writer is alive */
static int scan_all(int *pids, int max)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		long pid = dgshim_stat_name_pid(e->d_name);
		if (pid > 0 && maps_file((int)pid))
			pids[n++] = (int)pid;
	}
	closedir(d);
	qsort(pids, (size_t)n, sizeof *pids, cmp_int);
	return n;
}

static void usage(FILE *to)
{
	fprintf(to, "usage: dgshim stat [PID...] [-i SECONDS] [-c COUNT] [--json]\n"
		    "  no PID: every process running under dgshim\n"
		    "  -i SECONDS  repeat, with rates over the interval; -c COUNT: that many reports\n"
		    "  --json      one JSON object per report\n");
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int want[MAX_PROCS], nwant = 0;
	double interval = 0;
	long count = -1;
	bool json = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		char *end;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "-i") || !strcmp(a, "--interval")) {
			if (++i >= argc || (interval = strtod(argv[i], &end), *end) || !(interval >= 0.05) ||
			    interval > 86400) {
				fprintf(stderr, "dgshim stat: -i needs seconds, 0.05 to 86400\n");
				return 2;
			}
		} else if (!strcmp(a, "-c") || !strcmp(a, "--count")) {
			if (++i >= argc || (count = strtol(argv[i], &end, 10), *end) || count < 1) {
				fprintf(stderr, "dgshim stat: -c needs a count of at least 1\n");
				return 2;
			}
		} else {
			long pid = strtol(a, &end, 10);
			if (*end || pid <= 0 || pid > 0x7fffffff || end == a) {
				fprintf(stderr, "dgshim stat: '%s' is not a process id\n", a);
				usage(stderr);
				return 2;
			}
			if (nwant < MAX_PROCS)
				want[nwant++] = (int)pid;
		}
	}
	if (count > 0 && interval == 0)
		interval = 1;
	bool all = nwant == 0;
	signal(SIGPIPE, SIG_DFL);
	int rc = 0;
	double t0 = now_s(), last = 0;
	for (long rep = 0; count < 0 ? (rep == 0 || interval > 0) : rep < count; rep++) {
		if (rep > 0) {
			double next = last + interval, t = now_s();
			if (next > t) {
				struct timespec ts = {(time_t)(next - t), (long)(fmod(next - t, 1.0) * 1e9)};
				nanosleep(&ts, NULL);
			}
		}
		double t = now_s();
		double dt = rep > 0 ? t - last : 0;
		last = t;
		int pids[MAX_PROCS];
		int np = all ? scan_all(pids, MAX_PROCS) : nwant;
		if (!all)
			memcpy(pids, want, (size_t)nwant * sizeof *pids);
		struct proc *ps = calloc((size_t)(np ? np : 1), sizeof *ps);
		int n = 0;
		for (int i = 0; ps && i < np; i++) {
			int r = proc_read(pids[i], &ps[n]);
			if (r == 0) {
				n++;
			} else if (!all) {
				/* a named process without a file: say why; when repeating, once */
				if (r == -ENOENT && rep > 0)
					fprintf(stderr, "dgshim stat: process %d has exited\n", pids[i]);
				else if (r == -ENOENT)
					fprintf(stderr, "dgshim stat: no counters for process %d (%s)\n", pids[i],
						kill(pids[i], 0) == 0 || errno == EPERM
							? "it does not run under dgshim, or DGSHIM_STATS=off"
							: "no such process, or it has exited");
				else
					fprintf(stderr, "dgshim stat: /dev/shm/dgshim.%d: %s\n", pids[i],
						r == -EPROTO ? "not a counters file of this version" : strerror(-r));
				if (!interval)
					rc = 1;
				for (int k = 0; k < nwant; k++)
					if (want[k] == pids[i])
						want[k] = want[--nwant];
			}
		}
		if (json)
			print_json(ps, n, t - t0, dt);
		else {
			if (interval > 0 && rep > 0)
				printf("\n--- %.1f s\n", t - t0);
			print_text(ps, n, dt, all);
		}
		fflush(stdout);
		prev_save(ps, n);
		for (int i = 0; i < n; i++)
			proc_free(&ps[i]);
		free(ps);
		if (!all && nwant == 0)
			break; /* every process named has exited */
	}
	return rc;
}
