/* The progress watchdog's timeout (worker/watchdog): a fixed trainer.hang_timeout_s as given; the automatic one
 * max(300 s, 10 x the median step interval), 1800 s before any interval is known; the median, not the mean (one
 * long step, a checkpoint or a validation, does not move it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker/watchdog/watchdog.h"

static void test_fixed(void **state)
{
    (void)state;
    const double v[3] = {100, 100, 100};
    assert_float_equal(watchdog_timeout_for(5, v, 3), 5, 0);
    assert_float_equal(watchdog_timeout_for(5, NULL, 0), 5, 0);
}

static void test_auto(void **state)
{
    (void)state;
    assert_float_equal(watchdog_timeout_for(-1, NULL, 0), 1800, 0); /* no step timed yet */
    const double quick[4] = {0.5, 0.4, 0.6, 0.5};
    assert_float_equal(watchdog_timeout_for(-1, quick, 4), 300, 0); /* the floor: minutes, not a slow step */
    const double slow[5] = {60, 40, 900, 50, 45};                   /* one long step (a checkpoint): the median */
    assert_float_equal(watchdog_timeout_for(-1, slow, 5), 500, 1e-9);
    const double even[4] = {40, 60, 50, 70}; /* an even count: the two middle ones' mean, 55 */
    assert_float_equal(watchdog_timeout_for(-1, even, 4), 550, 1e-9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixed), cmocka_unit_test(test_auto)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
