/* The colocated work-unit ledger's rule (worker/hybrid/units.c): each engine's own units from the front, then the
 * unstarted ones of the engine with the most left, from the back; every unit made exactly once whatever the
 * interleaving; a new step sets the ledger up again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_then_steal),
        cmocka_unit_test(test_no_steal),
        cmocka_unit_test(test_steals_from_the_most_left),
        cmocka_unit_test(test_every_unit_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
