#include "units.h"

#include <stdlib.h>

#include "common/check.h"
#include "worker/comm/comm.h"
#include "worker/plane/dispatch_core.h"

enum { AT_STEP = 0, AT_ENGINES = 1 }; /* v[AT_STEP], then engine e's next and end at 1 + 2e and 2 + 2e */

int units_table_len(int engines) { return AT_ENGINES + 2 * engines; }

int units_take(int64_t *v, int engines, int units, int64_t step, int engine, bool steal, bool *stolen)
{
    *stolen = false;
    if (v[AT_STEP] != step) { /* the first engine to take in this step sets it up */
        v[AT_STEP] = step;
        for (int e = 0; e < engines; e++) {
            int lo, hi;
            dispatch_unit_range(units, engines, e, &lo, &hi);
            v[AT_ENGINES + 2 * e] = lo;
            v[AT_ENGINES + 2 * e + 1] = hi;
        }
    }
    int64_t *mine = &v[AT_ENGINES + 2 * engine];
    if (mine[0] < mine[1])
        return (int)mine[0]++;
    if (!steal)
        return -1;
    int victim = -1;
    int64_t most = 0;
    for (int e = 0; e < engines; e++) { /* the most left; the lower engine on a tie */
        const int64_t left = v[AT_ENGINES + 2 * e + 1] - v[AT_ENGINES + 2 * e];
        if (left > most) {
            most = left;
            victim = e;
        }
    }
    if (victim < 0)
        return -1;
    *stolen = true;
    return (int)--v[AT_ENGINES + 2 * victim + 1];
}

struct units_ledger {
    struct comm_table *table;
    int engines, units;
    bool steal;
    int64_t *v;
};

struct units_ledger *units_ledger_create(struct comm *all, int engines, int units, bool steal)
{
    struct comm_table *t = NULL; /* without stealing nobody else touches an engine's units */
    if (steal && !(t = comm_table_create(all, (size_t)units_table_len(engines))))
        return NULL;
    struct units_ledger *l = xcalloc(1, sizeof *l);
    *l = (struct units_ledger){.table = t, .engines = engines, .units = units, .steal = steal};
    l->v = xcalloc((size_t)units_table_len(engines), sizeof *l->v);
    return l;
}

struct take {
    struct units_ledger *l;
    int64_t step;
    int engine, unit;
    bool stolen;
};

static void take_locked(void *ud, int64_t *v)
{
    struct take *k = ud;
    k->unit = units_take(v, k->l->engines, k->l->units, k->step, k->engine, k->l->steal, &k->stolen);
}

int units_ledger_take(struct units_ledger *l, int64_t step, int engine, bool *stolen)
{
    struct take k = {.l = l, .step = step, .engine = engine};
    if (l->table)
        comm_table_update(l->table, l->v, take_locked, &k);
    else
        take_locked(&k, l->v);
    *stolen = k.stolen;
    return k.unit;
}

void units_ledger_free(struct units_ledger *l)
{
    if (!l)
        return;
    comm_table_free(l->table);
    free(l->v);
    free(l);
}
