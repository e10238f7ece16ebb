/* The one clock of the programs: monotonic seconds for durations, deadlines and
 * rates (immune to wall-clock jumps), the wall clock for timestamps, and a
 * sleep that resumes when a signal interrupts it.
 *
 *   double t0 = clock_now_s();
 *   ...
 *   double elapsed = clock_now_s() - t0;
 */
#ifndef GRPO_COMMON_CLOCK_H
#define GRPO_COMMON_CLOCK_H

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double clock_now_s(void);
/* Wall-clock time in unix seconds (CLOCK_REALTIME). */
double clock_wall_s(void);
/* Sleep for the given seconds (nothing when <= 0; an interrupted sleep resumes). */
void clock_sleep_s(double seconds);
/* For the tests only: sleep the seconds environment variable `name` gives (above 0 and below 10; anything else is
 * none), read once into *cache, which starts at -1 (a slow engine or trainer made on purpose). */
void clock_test_sleep(const char *name, double *cache);

#endif
