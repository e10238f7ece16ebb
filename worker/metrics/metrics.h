/* Training metrics: a per-step container of (name, value) pairs with verl's
 * names, and the sinks that record them in the run directory.
 *
 *   RUN_DIR/metrics.jsonl                    one JSON object per step (metrics_jsonl_*)
 *   RUN_DIR/tensorboard/events.out.tfevents.<unix_time>.<hostname>
 *                                            TensorBoard event file (metrics_tb_*)
 *   RUN_DIR/metrics.svg                      small-multiple charts (metrics_write_svg)
 *   stderr                                   one summary line per step (metrics_console_*)
 *
 * metrics_logger_* drives all of them for the trainer. See docs/metrics.md for
 * the metric names and their meanings.
 *
 *   struct metrics m;
 *   metrics_init(&m);
 *   metrics_set(&m, "actor/pg_loss", loss);
 *   metrics_set_stats(&m, "critic/score", scores, n);   // critic/score/mean|max|min
 *   metrics_logger_log(&lg, step, &m);
 *   metrics_free(&m);
 *
 * Nothing here is thread-safe; rank 0 owns the sinks. */
#ifndef GRPO_WORKER_METRICS_H
#define GRPO_WORKER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- container */

struct metric {
    char *name;
    double value;
};

/* The metrics of one step, in the order they were first set. */
struct metrics {
    struct metric *items;
    size_t n, cap;
};

void metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);
/* Forget every entry (keeps the allocation). */
void metrics_clear(struct metrics *m);
/* Set name to value: an existing name keeps its position, a new one is appended. */
void metrics_set(struct metrics *m, const char *name, double value);
/* true and *value when name is present (value may be NULL); false otherwise. */
bool metrics_get(const struct metrics *m, const char *name, double *value);
/* Value of name, or fallback when absent. */
double metrics_get_or(const struct metrics *m, const char *name, double fallback);
/* Remove name; true if it was present. */
bool metrics_remove(struct metrics *m, const char *name);
static inline size_t metrics_count(const struct metrics *m) { return m->n; }
/* Iteration: for (size_t i = 0; i < metrics_count(m); i++) metrics_name(m, i), metrics_value(m, i). */
static inline const char *metrics_name(const struct metrics *m, size_t i) { return m->items[i].name; }
static inline double metrics_value(const struct metrics *m, size_t i) { return m->items[i].value; }
/* Set every entry of src into dst (src's values win). */
void metrics_merge(struct metrics *dst, const struct metrics *src);
/* dst becomes a deep copy of src (dst must be initialised). */
void metrics_copy(struct metrics *dst, const struct metrics *src);
/* PREFIX/mean, PREFIX/max, PREFIX/min of the finite values among values[0..n). With no finite value
 * the three are NaN (written as null in JSONL, skipped in charts). */
void metrics_set_stats(struct metrics *m, const char *prefix, const double *values, size_t n);
/* PREFIX/mean|max|min from a sum, maximum, minimum and count (summaries combined across ranks). */
void metrics_set_stats3(struct metrics *m, const char *prefix, double sum, double mx, double mn, size_t k);
/* Sum, largest, smallest and count of a set of values: what PREFIX/mean|max|min are made of. */
struct metrics_summary {
    double sum, max, min;
    size_t n;
};
/* The summary of the finite values among values[0..n) (n 0 when there is none). */
struct metrics_summary metrics_summarize(const double *values, size_t n);
/* PREFIX/mean|max|min of a summary (metrics_set_stats3 of its fields). */
void metrics_set_summary(struct metrics *m, const char *prefix, const struct metrics_summary *s);
void metrics_set_stats_f(struct metrics *m, const char *prefix, const float *values, size_t n);
/* Resident set size of this process in GiB (VmRSS of /proc/self/status); NaN when unavailable. */
double proc_rss_gb(void);
/* Peak resident set size of this process in GiB (VmHWM); NaN when unavailable. */
double proc_peak_rss_gb(void);

/* ------------------------------------------------------------------ history */

struct metrics_step {
    long step;
    struct metrics m;
};

/* Per-step metrics of a whole run, ordered by step (what the charts draw). */
struct metrics_history {
    struct metrics_step *steps;
    size_t n, cap;
};

void metrics_history_init(struct metrics_history *h);
void metrics_history_free(struct metrics_history *h);
/* Record m for step (copied). A step already present is merged (new values win), so validation
 * metrics logged separately for a step join that step's training metrics. Steps stay sorted. */
void metrics_history_append(struct metrics_history *h, long step, const struct metrics *m);
/* Drop the steps > step (a resumed run restarts after its checkpoint). */
void metrics_history_truncate_after(struct metrics_history *h, long step);
/* Append every step of a metrics.jsonl file; the number of lines read, or -1 (logged) when the
 * file cannot be opened. A missing file reads as 0 lines when missing_ok. */
long metrics_history_load_jsonl(struct metrics_history *h, const char *path, bool missing_ok);

/* -------------------------------------------------------------------- JSONL */

/* RUN_DIR/metrics.jsonl: one line per step, {"step": 3, "actor/pg_loss": 0.12, ...}, numbers in
 * the shortest form that reads back to the same double, NaN and +-Inf as null (JSON has neither). */
struct metrics_jsonl {
    FILE *f;
    char *path;
};

/* Open path for appending (created if missing). 0, or -1 (logged). */
int metrics_jsonl_open(struct metrics_jsonl *w, const char *path);
/* Append one line and flush it to the kernel. 0, or -1 (logged) on a write error. */
int metrics_jsonl_write(struct metrics_jsonl *w, long step, const struct metrics *m);
/* fflush + fsync: the lines written so far survive a crash (called at checkpoints). */
int metrics_jsonl_sync(struct metrics_jsonl *w);
void metrics_jsonl_close(struct metrics_jsonl *w);
/* Render one line (with the final '\n') into a malloc'd string. */
char *metrics_jsonl_format(long step, const struct metrics *m);
/* Rewrite path (atomically: tmp + fsync + rename) without the lines whose step is > step, nor
 * unreadable lines (a line torn by a crash). Returns the number of lines dropped (0: the file is
 * untouched; a missing file is 0), or -1 (logged). step = -1 drops every line. */
long metrics_jsonl_truncate_after(const char *path, long step);
/* Called for each readable line; m is valid during the call only. Nonzero stops the reading. */
typedef int (*metrics_jsonl_cb)(long step, const struct metrics *m, void *ctx);
/* Read path line by line: null reads as NaN; non-numeric values are ignored; a line that is not a
 * JSON object with an integer "step" is skipped with a warning. The number of lines delivered,
 * or -1 (logged) when path cannot be opened. */
long metrics_jsonl_read(const char *path, metrics_jsonl_cb cb, void *ctx);

/* -------------------------------------------------------------- TensorBoard */

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t crc32c_masked(const void *data, size_t n);
/* Frame data as one TFRecord into out (n + 16 bytes): uint64 LE length, masked CRC of the length,
 * data, masked CRC of the data. Returns the bytes written. */
size_t tfrecord_frame(uint8_t *out, const void *data, size_t n);
/* Encoders of tensorflow.Event messages; each returns the encoded size, or 0 when cap is short. */
size_t tb_encode_file_version(uint8_t *buf, size_t cap, double wall_time);
size_t tb_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *tag, float value);
/* SessionLog START at step: TensorBoard then drops the events of earlier files with step >= step. */
size_t tb_encode_session_start(uint8_t *buf, size_t cap, double wall_time, int64_t step);

struct metrics_tb {
    FILE *f;
    char *path;
};

/* Create dir (and parents) and a new event file events.out.tfevents.<unix_time>.<hostname> in it
 * (a later second when that name exists), starting with the file_version record. When
 * start_step >= 0, a SessionLog START at start_step follows, so that TensorBoard forgets the
 * steps >= start_step of older files in dir (a resumed or restarted run). 0, or -1 (logged). */
int metrics_tb_open(struct metrics_tb *w, const char *dir, long start_step);
/* One scalar event per metric (values as float, NaN included), then a flush. 0, or -1 (logged). */
int metrics_tb_write(struct metrics_tb *w, long step, const struct metrics *m, double wall_time);
/* fflush + fsync. */
int metrics_tb_sync(struct metrics_tb *w);
void metrics_tb_close(struct metrics_tb *w);
/* Seconds since the epoch, with microseconds (Event.wall_time). */
double metrics_wall_time(void);

/* ------------------------------------------------------------------ console */

/* One line per step:
 *   step  12/40 [###.........]  30% | reward 0.410 (+0.120) | kl 0.0031 | entropy 1.920 | len 23.4 |
 *   412 tok/s | step 38.2s | eta 17m
 * Fields whose metric is absent are left out; validation rewards (val-core/DS/reward/mean@N)
 * are appended as "val DS 0.512". */
struct metrics_console {
    long total_steps;     /* <= 0: unknown (no bar, no ETA) */
    int bar_width;        /* characters between the brackets */
    double prev_reward;   /* critic/score/mean of the previous printed step; NaN before the first */
    double step_time_sum; /* timing_s/step summed over the printed steps (for the ETA) */
    long step_time_n;
};

void metrics_console_init(struct metrics_console *c, long total_steps);
/* Render step's line into buf (no newline; truncated to cap). Does not change c. Returns the
 * length the full line has (like snprintf). The ETA is (total - step) x the mean step time. */
int metrics_console_render(const struct metrics_console *c, long step, const struct metrics *m, char *buf, size_t cap);
/* Take m into the running state (previous reward, mean step time). */
void metrics_console_update(struct metrics_console *c, const struct metrics *m);
/* Render, write the line to stderr in one write() (clearing a transient status line first on a
 * terminal; no control characters otherwise), then update. */
void metrics_console_print(struct metrics_console *c, long step, const struct metrics *m);
/* "gen 12/64 sequences" (unit may be NULL; total <= 0: "gen 12"). Returns the snprintf length. */
int metrics_progress_render(char *buf, size_t cap, const char *phase, long done, long total, const char *unit);
/* Transient status line for long phases: on a terminal, "\r" + the line + erase-to-end, at most
 * ~10 times a second (always when done == total); nothing when stderr is not a terminal. */
void metrics_progress(const char *phase, long done, long total, const char *unit);
/* Erase the transient line (on a terminal; no-op otherwise or when none is shown). */
void metrics_progress_done(void);

/* -------------------------------------------------------------------- chart */

/* Write a self-contained SVG (no script, generic font families) with one panel per series:
 * reward (critic/score/mean, with val-core/DS/reward/mean@N as points), KL (actor/kl_loss, else
 * actor/ppo_kl), entropy (actor/entropy), response length (response_length/mean) and throughput
 * (perf/throughput), against the step. NaN values are skipped; a panel without data says so.
 * title may be NULL. Written to path.tmp.PID, fsync'd and renamed over path. 0, or -1 (logged). */
int metrics_write_svg(const char *path, const struct metrics_history *h, const char *title);

/* ------------------------------------------------------------ failed writes */

/* A run's records (metrics.jsonl, the TensorBoard event file, metrics.svg, and the rollout dumps of
 * trainer.rollout_data_dir) are written every step. When one cannot be written (a full disk, a quota, an I/O
 * error) the run must not train on for hundreds of steps recording nothing: every writer reports its failed
 * fwrite/fflush/fsync/fclose here. The first failure of each file is logged as an error (under subsys) and
 * the first of all is kept, process-wide (thread-safe); repeats are logged at debug level only. The trainer
 * looks at metrics_output_failure() at its safe points and stops the run with that reason. */
void metrics_output_failed(const char *subsys, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* true, with the first failure's text in why ("writing PATH: No space left on device"; why may be NULL),
 * when a write of the run's records has failed since the start (or the last reset). */
bool metrics_output_failure(char *why, size_t len);
/* Forget the failures (tests). */
void metrics_output_failure_reset(void);

/* ------------------------------------------------------------------- logger */

enum {
    METRICS_SINK_JSONL = 1u << 0,
    METRICS_SINK_TENSORBOARD = 1u << 1,
    METRICS_SINK_SVG = 1u << 2,
    METRICS_SINK_CONSOLE = 1u << 3,
    METRICS_SINK_ALL = 0xfu,
};

/* All the sinks of a run directory, with the history the chart is drawn from. */
struct metrics_logger {
    char *run_dir;
    char *svg_path;
    char *title;
    unsigned sinks;
    struct metrics_jsonl jsonl;
    struct metrics_tb tb;
    struct metrics_console console;
    struct metrics_history history;
};

/* Open the sinks of run_dir (created if missing). Steps > start_after recorded by an earlier run
 * are forgotten: metrics.jsonl is truncated after start_after and the history reloaded from it,
 * TensorBoard gets a SessionLog START at start_after + 1. A fresh run passes -1, a run resumed
 * from the checkpoint of step k passes k. title (may be NULL) heads the chart. 0, or -1 (logged;
 * the sinks that opened stay usable, the others are off). */
int metrics_logger_open(struct metrics_logger *lg, const char *run_dir, unsigned sinks, long total_steps,
                        long start_after, const char *title);
/* Record step's metrics in every sink (the chart is rewritten). 0, or -1 if a sink failed. */
int metrics_logger_log(struct metrics_logger *lg, long step, const struct metrics *m);
/* Make everything written so far durable (at checkpoints). */
int metrics_logger_sync(struct metrics_logger *lg);
void metrics_logger_close(struct metrics_logger *lg);

#endif
