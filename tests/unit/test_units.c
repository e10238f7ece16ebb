/* The colocated work-unit ledger's rule (worker/hybrid/units.c): each engine's own units from the front, then the
 * unstarted ones of the engine with the most left, from the back; every unit made exactly once whatever the
 * interleaving; a new step sets the ledger up again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/hybrid/units.h"
#include "worker/plane/dispatch_core.h"

static void test_own_then_steal(void **state)
{
    (void)state;
    int64_t v[16] = {0};
    bool stolen;
    /* 2 engines, 8 units: engine 0 owns 0..3, engine 1 owns 4..7 */
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 0);
    assert_false(stolen);
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 1);
    assert_int_equal(units_take(v, 2, 8, 1, 1, true, &stolen), 4);
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 2);
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 3);
    /* engine 0 is done with its own: it takes engine 1's last unstarted unit */
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 7);
    assert_true(stolen);
    assert_int_equal(units_take(v, 2, 8, 1, 1, true, &stolen), 5);
    assert_false(stolen);
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), 6);
    assert_true(stolen);
    assert_int_equal(units_take(v, 2, 8, 1, 1, true, &stolen), -1); /* nothing left anywhere */
    assert_int_equal(units_take(v, 2, 8, 1, 0, true, &stolen), -1);
    /* the next step starts over */
    assert_int_equal(units_take(v, 2, 8, 2, 1, true, &stolen), 4);
}

static void test_no_steal(void **state)
{
    (void)state;
    int64_t v[16] = {0};
    bool stolen;
    for (int u = 0; u < 4; u++)
        assert_int_equal(units_take(v, 2, 8, 1, 0, false, &stolen), u);
    assert_int_equal(units_take(v, 2, 8, 1, 0, false, &stolen), -1); /* engine 1 keeps its four */
    for (int u = 4; u < 8; u++)
        assert_int_equal(units_take(v, 2, 8, 1, 1, false, &stolen), u);
}

static void test_steals_from_the_most_left(void **state)
{
    (void)state;
    int64_t v[16] = {0};
    bool stolen;
    /* 3 engines, 9 units: 0..2, 3..5, 6..8. Engine 1 has started one, engine 2 none: engine 0 takes from 2 */
    for (int u = 0; u < 3; u++)
        units_take(v, 3, 9, 5, 0, true, &stolen);
    assert_int_equal(units_take(v, 3, 9, 5, 1, true, &stolen), 3);
    assert_int_equal(units_take(v, 3, 9, 5, 0, true, &stolen), 8);
    assert_true(stolen);
    /* now 1 and 2 have two left each: the lower engine on a tie */
    assert_int_equal(units_take(v, 3, 9, 5, 0, true, &stolen), 5);
}

/* Random interleavings of 4 engines over 13 units: every unit made exactly once, each engine's own first. */
static void test_every_unit_once(void **state)
{
    (void)state;
    uint64_t x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        int64_t v[16] = {0};
        int made[13] = {0};
        bool done[4] = {false};
        int left = 4;
        while (left) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const int e = (int)((x >> 33) % 4);
            if (done[e])
                continue;
            bool stolen;
            const int u = units_take(v, 4, 13, trial + 1, e, true, &stolen);
            if (u < 0) {
                done[e] = true;
                left--;
                continue;
            }
            assert_in_range(u, 0, 12);
            made[u]++;
            int lo, hi;
            dispatch_unit_range(13, 4, e, &lo, &hi);
            assert_int_equal(stolen, u < lo || u >= hi);
        }
        for (int u = 0; u < 13; u++)
            assert_int_equal(made[u], 1);
    }
}

/* units_word_take on *w for the round key over [lo, hi): the unit, *w moved on; -1 (w unchanged) when none */
static int take_from(uint64_t *w, int64_t key, int lo, int hi, bool from_back)
{
    uint64_t next;
    int u;
    if (!units_word_take(*w, key, lo, hi, from_back, &next, &u))
        return -1;
    *w = next;
    return u;
}

/* The per-host word: the owner from the front, a thief from the back; a word of another round, or fresh zeros, is
 * the engine's whole range; nothing left, nothing taken. */
static void test_word_rule(void **state)
{
    (void)state;
    uint64_t w = 0;
    assert_int_equal(units_word_left(w, 7, 4, 8), 4); /* fresh memory: the range, not started */
    assert_int_equal(take_from(&w, 7, 4, 8, false), 4);
    assert_int_equal(take_from(&w, 7, 4, 8, true), 7);
    assert_int_equal(units_word_left(w, 7, 4, 8), 2);
    assert_int_equal(take_from(&w, 7, 4, 8, false), 5);
    assert_int_equal(take_from(&w, 7, 4, 8, true), 6);
    assert_int_equal(take_from(&w, 7, 4, 8, false), -1);
    assert_int_equal(take_from(&w, 7, 4, 8, true), -1);
    assert_int_equal(units_word_left(w, 7, 4, 8), 0);
    /* the next round sees the old word as its whole range */
    assert_int_equal(units_word_left(w, 8, 4, 8), 4);
    assert_int_equal(take_from(&w, 8, 4, 8, false), 4);
    /* an empty range is empty in any round */
    w = 0;
    assert_int_equal(take_from(&w, 9, 3, 3, false), -1);
}

/* Engines take only from their own host's: engine 0 (host {0, 1}) steals from 1, never from 2 or 3. */
static void test_shared_steals_on_its_host(void **state)
{
    (void)state;
    uint64_t words[4] = {0};
    const int host_a[2] = {0, 1};
    bool stolen;
    /* 4 engines, 8 units: 0..1, 2..3, 4..5, 6..7 */
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 0, &stolen), 0);
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 0, &stolen), 1);
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 0, &stolen), 3); /* engine 1's last */
    assert_true(stolen);
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 1, &stolen), 2);
    assert_false(stolen);
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 0, &stolen), -1); /* 4..7 are another host's */
    assert_int_equal(units_take_shared(words, host_a, 2, 4, 8, 1, 1, &stolen), -1);
}

/* 4 processes, one engine each, on one shared page, over 50 rounds of 37 units: every unit of every round made
 * exactly once, whatever the interleaving of their compare-and-swaps (the host's ledger across processes). */
static void test_shared_every_unit_once_across_processes(void **state)
{
    (void)state;
    enum { E = 4, U = 37, ROUNDS = 50 };
    const size_t bytes = E * sizeof(uint64_t) + (size_t)ROUNDS * (U + 1) * sizeof(int);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    uint64_t *words = mem;
    int *made = (int *)(words + E);   /* made[round * U + unit]: by how many engines */
    int *arrived = made + ROUNDS * U; /* arrived[round]: engines done with it */
    const int local[E] = {0, 1, 2, 3};
    pid_t kids[E];
    for (int e = 0; e < E; e++) {
        kids[e] = fork();
        assert_true(kids[e] >= 0);
        if (kids[e] == 0) {
            for (int r = 0; r < ROUNDS; r++) {
                bool stolen;
                int u;
                while ((u = units_take_shared(words, local, E, E, U, 1000 + r, e, &stolen)) >= 0)
                    __atomic_add_fetch(&made[r * U + u], 1, __ATOMIC_RELAXED);
                /* the next round once every engine is done with this one (a step's engines meet in a collective) */
                __atomic_add_fetch(&arrived[r], 1, __ATOMIC_ACQ_REL);
                while (__atomic_load_n(&arrived[r], __ATOMIC_ACQUIRE) < E)
                    sched_yield();
            }
            _exit(0);
        }
    }
    for (int e = 0; e < E; e++) {
        int st = 0;
        assert_int_equal(waitpid(kids[e], &st, 0), kids[e]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int u = 0; u < U; u++)
            if (made[r * U + u] != 1)
                fail_msg("round %d unit %d made %d times", r, u, made[r * U + u]);
    munmap(mem, bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_then_steal),
        cmocka_unit_test(test_no_steal),
        cmocka_unit_test(test_steals_from_the_most_left),
        cmocka_unit_test(test_every_unit_once),
        cmocka_unit_test(test_word_rule),
        cmocka_unit_test(test_shared_steals_on_its_host),
        cmocka_unit_test(test_shared_every_unit_once_across_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
