/*
 * log.h - diagnostics on stderr (or in DGSHIM_LOG_FILE, %p the pid), only when asked for
 * (DGSHIM_LOG=error|warn|info|debug or 0-4; anything else warns once and means warn).
 * Never on stdout: the host program owns it. Not for hot paths except behind dg_log_on().
 */
#ifndef DG_LOG_H
#define DG_LOG_H

enum dg_log_level { DG_LOG_OFF = 0, DG_LOG_ERROR, DG_LOG_WARN, DG_LOG_INFO, DG_LOG_DEBUG };

/* The level in force (read once from DGSHIM_LOG). */
int dg_log_level(void);
static inline int dg_log_on(int level) { return level <= dg_log_level(); }
/* Writes "dgshim[pid]: <level>: <message>\n" with one write(2) so lines do not interleave. */
void dg_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like dg_log but printed whatever the level (for errors a user must see, such as a bad
 * config line, when the caller has decided it must be said once). */
void dg_log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define DG_ERR(...) do { if (dg_log_on(DG_LOG_ERROR)) dg_log(DG_LOG_ERROR, __VA_ARGS__); } while (0)
#define DG_WARN(...) do { if (dg_log_on(DG_LOG_WARN)) dg_log(DG_LOG_WARN, __VA_ARGS__); } while (0)
#define DG_INFO(...) do { if (dg_log_on(DG_LOG_INFO)) dg_log(DG_LOG_INFO, __VA_ARGS__); } while (0)
#define DG_DBG(...) do { if (dg_log_on(DG_LOG_DEBUG)) dg_log(DG_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
