/* Python custom scorers: verl's compute_score(data_source, solution_str, ground_truth, extra_info) in a .py file,
 * run by a pool of long-lived CPython processes (custom_reward_function.python, reward_model.num_workers of them)
 * that score a batch concurrently, each a run of consecutive samples per request
 * (pyscorer.c describes the protocol). An exception, a non-numeric result, a crash or a hang is that sample's
 * failure, with a reason; the process is started again for the rest. */
#ifndef GRPO_WORKER_PYSCORER_H
#define GRPO_WORKER_PYSCORER_H

#include <stdbool.h>
#include <stddef.h>

#include "reward.h"

#define PYSCORER_REASON_MAX REWARD_REASON_MAX
#define PYSCORER_MAX_PROCS 64

struct pyscorer;

/* Start nproc (1..PYSCORER_MAX_PROCS, clamped) python processes on the driver with the file `path` and function
 * `name`, and wait until each has imported the file and found the function. NULL with err naming the key
 * (custom_reward_function.path or .name) and Python's reason. */
struct pyscorer *pyscorer_start(const char *python, const char *path, const char *name, int nproc, double timeout_s,
                                char *err, size_t errlen);
int pyscorer_num_procs(const struct pyscorer *p);
void pyscorer_free(struct pyscorer *p);
/* Named components of the results (entries of the dict the function returns, other than "score"): v[i x n + k]
 * gets entry keys[k] of item i. An item whose result lacks one (or holds one that is not a finite number) fails,
 * its reason ending with what (may be NULL). */
struct pyscorer_parts {
    const char *const *keys;
    int n;
    double *v;
    const char *what;
};
/* Score items[0..n) on the pool: scores[i], failed[i] and, for a failed one, reasons[i], the same whatever the
 * pool's size; with pp (may be NULL) each item's components too. At most timeout_s per result; a hang or a crash
 * fails that sample alone. */
void pyscorer_score(struct pyscorer *p, const struct reward_item *items, int n, double timeout_s, double *scores,
                    bool *failed, char (*reasons)[PYSCORER_REASON_MAX], const struct pyscorer_parts *pp);
/* Whether path is a Python scorer: it ends in .py, or it is not an ELF shared library. */
bool pyscorer_is_python(const char *path);

#endif
