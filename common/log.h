/* Levelled logging that names the subsystem and, in MPI programs, the rank.
 *
 *   log_info("config", "loaded %s", path);
 *   -> 2026-11-30T08:50:01.123Z info  [rank 3] config: loaded run.yaml
 *
 * The level comes from log_set_level() or the GRPO_LOG_LEVEL environment
 * variable (error, warn, info, debug). Lines go to stderr, one write() each,
 * so lines from several ranks sharing a terminal do not interleave mid-line. */
#ifndef GRPO_COMMON_LOG_H
#define GRPO_COMMON_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Set the most verbose level that is printed. */
void log_set_level(enum log_level level);
/* Current level. */
enum log_level log_get_level(void);
/* Parse "error"/"warn"/"info"/"debug"; returns -1 when the name is unknown. */
int log_level_from_name(const char *name);
/* Tag every following line with this MPI rank (-1: no rank shown). */
void log_set_rank(int rank);
/* Read GRPO_LOG_LEVEL from the environment; returns -1 (and warns) if it is invalid. */
int log_init_from_env(void);

/* Write one log line; prefer the macros below. */
void log_write(enum log_level level, const char *subsys, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void log_vwrite(enum log_level level, const char *subsys, const char *fmt, va_list ap);

/* Rate limiting: at most one line per interval from one call site (one reason); the lines held back in between
 * are counted and the next line printed says how many. log_limit_pass is the decision, with the time given
 * (monotonic seconds): true to print, with *held the number held back since the last printed line. */
struct log_limit {
    double last;
    unsigned held;
    int used;
};
int log_limit_pass(struct log_limit *l, double now, double interval_s, unsigned *held);
/* log_write at most once per interval_s from the call site that owns l; a line after held ones ends with
 * " (N more like this in the last S s)". */
void log_write_limited(struct log_limit *l, double interval_s, enum log_level level, const char *subsys,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define LOG_EVERY_S 5.0
/* log_warn / log_info, at most one line per 5 s from this call site */
#define log_warn_every(subsys, ...)                                                                                    \
    do {                                                                                                               \
        static struct log_limit log_limit_here_;                                                                       \
        log_write_limited(&log_limit_here_, LOG_EVERY_S, LOG_WARN, (subsys), __VA_ARGS__);                             \
    } while (0)
#define log_info_every(subsys, ...)                                                                                    \
    do {                                                                                                               \
        static struct log_limit log_limit_here_;                                                                       \
        log_write_limited(&log_limit_here_, LOG_EVERY_S, LOG_INFO, (subsys), __VA_ARGS__);                             \
    } while (0)

/* A byte count for people, in out: "512 B", "4.0 KiB", "1.5 MiB", "2.00 GiB". */
void log_bytes_text(uint64_t b, char *out, size_t len);

#define log_error(subsys, ...) log_write(LOG_ERROR, (subsys), __VA_ARGS__)
#define log_warn(subsys, ...) log_write(LOG_WARN, (subsys), __VA_ARGS__)
#define log_info(subsys, ...) log_write(LOG_INFO, (subsys), __VA_ARGS__)
#define log_debug(subsys, ...) log_write(LOG_DEBUG, (subsys), __VA_ARGS__)

#endif
