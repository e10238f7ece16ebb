/* Every sink of a run directory behind one call per step. */
#include "worker/metrics/metrics.h"

#include "common/fs.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "worker/metrics/metrics_internal.h"

#define SUBSYS "metrics"

int metrics_logger_open(struct metrics_logger *lg, const char *run_dir, unsigned sinks, long total_steps,
                        long start_after, const char *title)
{
    memset(lg, 0, sizeof *lg);
    metrics_history_init(&lg->history);
    metrics_console_init(&lg->console, total_steps);
    lg->run_dir = xstrdup(run_dir);
    lg->title = title ? xstrdup(title) : NULL;
    lg->svg_path = metrics_path_join(run_dir, "metrics.svg");
    if (start_after < -1)
        start_after = -1;
    if (fs_mkdir_p(run_dir) != 0) {
        log_error(SUBSYS, "cannot create %s: %s", run_dir, check_errno_text());
        lg->sinks = sinks & METRICS_SINK_CONSOLE;
        return -1;
    }
    int rc = 0;
    char *jsonl = metrics_path_join(run_dir, "metrics.jsonl");
    if (sinks & (METRICS_SINK_JSONL | METRICS_SINK_SVG)) {
        /* forget what an earlier run recorded after the point this one starts from */
        if ((sinks & METRICS_SINK_JSONL) && metrics_jsonl_truncate_after(jsonl, start_after) < 0)
            rc = -1;
        if (metrics_history_load_jsonl(&lg->history, jsonl, true) < 0)
            rc = -1;
        metrics_history_truncate_after(&lg->history, start_after);
    }
    lg->sinks = sinks;
    if ((sinks & METRICS_SINK_JSONL) && metrics_jsonl_open(&lg->jsonl, jsonl) != 0) {
        lg->sinks &= ~(unsigned)METRICS_SINK_JSONL;
        rc = -1;
    }
    free(jsonl);
    if (sinks & METRICS_SINK_TENSORBOARD) {
        char *dir = metrics_path_join(run_dir, "tensorboard");
        if (metrics_tb_open(&lg->tb, dir, start_after + 1) != 0) {
            metrics_tb_close(&lg->tb);
            lg->sinks &= ~(unsigned)METRICS_SINK_TENSORBOARD;
            rc = -1;
        }
        free(dir);
    }
    /* a resumed run continues the reward delta and the ETA from its history */
    for (size_t i = 0; i < lg->history.n; i++)
        metrics_console_update(&lg->console, &lg->history.steps[i].m);
    return rc;
}

int metrics_logger_log(struct metrics_logger *lg, long step, const struct metrics *m)
{
    int rc = 0;
    if (lg->sinks & METRICS_SINK_JSONL)
        rc |= metrics_jsonl_write(&lg->jsonl, step, m);
    if (lg->sinks & METRICS_SINK_TENSORBOARD)
        rc |= metrics_tb_write(&lg->tb, step, m, metrics_wall_time());
    metrics_history_append(&lg->history, step, m);
    if (lg->sinks & METRICS_SINK_SVG)
        rc |= metrics_write_svg(lg->svg_path, &lg->history, lg->title);
    if (lg->sinks & METRICS_SINK_CONSOLE)
        metrics_console_print(&lg->console, step, m);
    return rc ? -1 : 0;
}

int metrics_logger_sync(struct metrics_logger *lg)
{
    int rc = 0;
    if (lg->sinks & METRICS_SINK_JSONL)
        rc |= metrics_jsonl_sync(&lg->jsonl);
    if (lg->sinks & METRICS_SINK_TENSORBOARD)
        rc |= metrics_tb_sync(&lg->tb);
    return rc ? -1 : 0;
}

void metrics_logger_close(struct metrics_logger *lg)
{
    if (lg->sinks & METRICS_SINK_JSONL)
        metrics_jsonl_close(&lg->jsonl);
    if (lg->sinks & METRICS_SINK_TENSORBOARD)
        metrics_tb_close(&lg->tb);
    metrics_history_free(&lg->history);
    free(lg->run_dir);
    free(lg->svg_path);
    free(lg->title);
    memset(lg, 0, sizeof *lg);
}
