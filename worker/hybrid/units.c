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

/* ---- the per-host lock-free ledger ---- */

#define KEY_MASK ((UINT64_C(1) << UNITS_KEY_BITS) - 1)
#define INDEX_MASK ((UINT64_C(1) << UNITS_INDEX_BITS) - 1)

/* The key as a word holds it: never 0, so that fresh (zeroed) memory is no round's */
static uint64_t key_bits(int64_t key) { return (uint64_t)(key % (int64_t)KEY_MASK) + 1; }

static uint64_t word_of(int64_t key, int next, int end)
{
    return key_bits(key) << (2 * UNITS_INDEX_BITS) | ((uint64_t)next & INDEX_MASK) << UNITS_INDEX_BITS |
           ((uint64_t)end & INDEX_MASK);
}

/* w's next and end for the round key: w's own, or the whole range when w is another round's */
static void word_range(uint64_t w, int64_t key, int lo, int hi, int *next, int *end)
{
    if (w >> (2 * UNITS_INDEX_BITS) == key_bits(key)) {
        *next = (int)(w >> UNITS_INDEX_BITS & INDEX_MASK);
        *end = (int)(w & INDEX_MASK);
    } else {
        *next = lo;
        *end = hi;
    }
}

bool units_word_take(uint64_t w, int64_t key, int lo, int hi, bool from_back, uint64_t *next, int *unit)
{
    int n, e;
    word_range(w, key, lo, hi, &n, &e);
    if (n >= e)
        return false;
    *unit = from_back ? e - 1 : n;
    *next = from_back ? word_of(key, n, e - 1) : word_of(key, n + 1, e);
    return true;
}

int units_word_left(uint64_t w, int64_t key, int lo, int hi)
{
    int n, e;
    word_range(w, key, lo, hi, &n, &e);
    return e > n ? e - n : 0;
}

/* One unit from engine v's word by compare-and-swap, retried while another rank changed the word in between. */
static int take_word(uint64_t *word, int64_t key, int lo, int hi, bool from_back)
{
    uint64_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    for (;;) {
        uint64_t next;
        int unit;
        if (!units_word_take(w, key, lo, hi, from_back, &next, &unit))
            return -1;
        if (__atomic_compare_exchange_n(word, &w, next, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return unit; /* (on failure w holds the word now, and the rule runs again on it) */
    }
}

int units_take_shared(uint64_t *words, const int *local, int n_local, int engines, int units, int64_t key, int engine,
                      bool *stolen)
{
    *stolen = false;
    int lo, hi;
    dispatch_unit_range(units, engines, engine, &lo, &hi);
    int u = take_word(&words[engine], key, lo, hi, false);
    if (u >= 0)
        return u;
    for (;;) { /* the host's engine with the most left; taken from its back, or looked at again if it went */
        int victim = -1, most = 0, vlo = 0, vhi = 0;
        for (int i = 0; i < n_local; i++) {
            const int e = local[i];
            if (e == engine)
                continue;
            int elo, ehi;
            dispatch_unit_range(units, engines, e, &elo, &ehi);
            const int left = units_word_left(__atomic_load_n(&words[e], __ATOMIC_ACQUIRE), key, elo, ehi);
            if (left > most || (left == most && left > 0 && e < victim)) {
                most = left;
                victim = e;
                vlo = elo;
                vhi = ehi;
            }
        }
        if (victim < 0)
            return -1;
        u = take_word(&words[victim], key, vlo, vhi, true);
        if (u >= 0) {
            *stolen = true;
            return u;
        }
    }
}

struct units_ledger {
    struct comm_table *table;
    int engines, units;
    bool steal;
    int64_t *v;
    /* per host: the words in the host's shared memory, and this host's engines */
    struct comm *host;
    struct comm_shared *shared;
    int *local, n_local;
};

/* The per-host ledger: the host's ranks' group, its shared words, and which engines its ranks head. */
static int per_host_setup(struct units_ledger *l, struct comm *all, int engine, bool head)
{
    l->host = comm_split_node(all, comm_rank(all));
    if (!l->host)
        return -1;
    l->shared = comm_shared_create(l->host, (size_t)l->engines * sizeof(uint64_t));
    if (!l->shared)
        return -1;
    const int n = comm_size(l->host);
    int mine = head ? engine : -1, *theirs = xcalloc((size_t)n, sizeof *theirs);
    comm_allgather(l->host, &mine, theirs, 1, COMM_I32);
    l->local = xcalloc((size_t)n, sizeof *l->local);
    for (int i = 0; i < n; i++)
        if (theirs[i] >= 0)
            l->local[l->n_local++] = theirs[i];
    free(theirs);
    return 0;
}

struct units_ledger *units_ledger_create(struct comm *all, int engines, int units, bool steal, bool per_host,
                                         int engine, bool head)
{
    struct units_ledger *l = xcalloc(1, sizeof *l);
    *l = (struct units_ledger){.engines = engines, .units = units, .steal = steal};
    l->v = xcalloc((size_t)units_table_len(engines), sizeof *l->v);
    if (!steal) /* nobody else touches an engine's units: no table */
        return l;
    if (per_host && units > (int)INDEX_MASK)
        check_failf(__FILE__, __LINE__, "%d work units a round: the per-host ledger holds at most %d", units,
                    (int)INDEX_MASK);
    const bool made = per_host ? per_host_setup(l, all, engine, head) == 0
                               : (l->table = comm_table_create(all, (size_t)units_table_len(engines))) != NULL;
    if (!made) {
        units_ledger_free(l);
        return NULL;
    }
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
    if (l->shared)
        return units_take_shared(comm_shared_base(l->shared), l->local, l->n_local, l->engines, l->units, step, engine,
                                 stolen);
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
    comm_shared_free(l->shared);
    if (l->host)
        comm_free(l->host);
    free(l->local);
    free(l->v);
    free(l);
}
