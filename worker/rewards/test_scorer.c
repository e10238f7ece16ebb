/* Test helper only (built as a shared module when the tests are built): custom
 * scorers that behave, crash, hang, exit or return NaN on magic inputs, for
 * tests/unit/test_rewards.c. Not part of the worker library. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

double compute_score(const char *data_source, const char *solution_str, const char *ground_truth,
                     const char *extra_info_json);
double length_score(const char *data_source, const char *solution_str, const char *ground_truth,
                    const char *extra_info_json);

/* 1 when the response equals the ground truth, else 0; magic responses misbehave. */
double compute_score(const char *data_source, const char *solution_str, const char *ground_truth,
                     const char *extra_info_json)
{
    (void)data_source;
    if (strcmp(solution_str, "SEGV") == 0)
        raise(SIGSEGV);
    if (strcmp(solution_str, "ABORT") == 0)
        abort();
    if (strcmp(solution_str, "HANG") == 0)
        for (volatile unsigned long spin = 0;; spin++)
            ;
    if (strcmp(solution_str, "SLEEP") == 0)
        for (;;)
            pause();
    if (strcmp(solution_str, "EXIT") == 0)
        exit(3);
    if (strcmp(solution_str, "NAN") == 0)
        return NAN;
    if (strcmp(solution_str, "EXTRA") == 0)
        return strcmp(extra_info_json, "{}") == 0 ? 0.5 : 0.25;
    return strcmp(solution_str, ground_truth) == 0 ? 1.0 : 0.0;
}

/* The response length, to check that another symbol name is used. */
double length_score(const char *data_source, const char *solution_str, const char *ground_truth,
                    const char *extra_info_json)
{
    (void)data_source;
    (void)ground_truth;
    (void)extra_info_json;
    return (double)strlen(solution_str);
}

double byte_score(const char *data_source, const char *solution_str, const char *ground_truth,
                  const char *extra_info_json);

/* A reward that varies with every response's content (bytes summed, modulo 7, scaled to [0, 1)): a random
 * tiny model gets a learning signal in every group, for equivalence tests. */
double byte_score(const char *data_source, const char *solution_str, const char *ground_truth,
                  const char *extra_info_json)
{
    (void)data_source;
    (void)ground_truth;
    (void)extra_info_json;
    unsigned sum = 0;
    for (const unsigned char *p = (const unsigned char *)solution_str; *p; p++)
        sum += *p;
    return (double)(sum % 7) / 7.0;
}

double stall_score(const char *data_source, const char *solution_str, const char *ground_truth,
                   const char *extra_info_json);

/* 0, or, while the file GRPO_TEST_STALL_FILE names exists, a scorer that stalls: it creates FILE.stalled and
 * sleeps (a step that cannot reach its end, for the signal tests). */
double stall_score(const char *data_source, const char *solution_str, const char *ground_truth,
                   const char *extra_info_json)
{
    (void)data_source;
    (void)solution_str;
    (void)ground_truth;
    (void)extra_info_json;
    const char *flag = getenv("GRPO_TEST_STALL_FILE");
    if (!flag || access(flag, F_OK) != 0)
        return 0.0;
    char marker[4096];
    snprintf(marker, sizeof marker, "%s.stalled", flag);
    FILE *f = fopen(marker, "w");
    if (f)
        fclose(f);
    sleep(30);
    return 0.0;
}

double held_byte_score(const char *data_source, const char *solution_str, const char *ground_truth,
                       const char *extra_info_json);

/* byte_score, each sample held (up to 3 s) while the file GRPO_TEST_HOLD_FILE names exists: the same rewards,
 * and a trainer that waits for the step meanwhile (for the data-plane tests' strangers). */
double held_byte_score(const char *data_source, const char *solution_str, const char *ground_truth,
                       const char *extra_info_json)
{
    const char *flag = getenv("GRPO_TEST_HOLD_FILE");
    for (int i = 0; flag && i < 60 && access(flag, F_OK) == 0; i++)
        usleep(50000);
    return byte_score(data_source, solution_str, ground_truth, extra_info_json);
}

double hold_after_score(const char *data_source, const char *solution_str, const char *ground_truth,
                        const char *extra_info_json);

/* byte_score; once this process has scored GRPO_TEST_HOLD_AFTER samples, and while the file GRPO_TEST_HOLD_FILE
 * names exists, it creates FILE.held and holds (up to 10 minutes): the run stops at a point its steps decide, not a
 * machine's speed (the tests that kill a rank mid-run: a fast run used to end before the kill, a loaded machine's
 * grpoctl to see step 5 after step 30). The same rewards as byte_score, so a relaunch with byte_score goes on. */
double hold_after_score(const char *data_source, const char *solution_str, const char *ground_truth,
                        const char *extra_info_json)
{
    const char *after = getenv("GRPO_TEST_HOLD_AFTER");
    const char *flag = getenv("GRPO_TEST_HOLD_FILE");
    if (!after || !flag)
        return byte_score(data_source, solution_str, ground_truth, extra_info_json);
    /* samples are counted in FILE.count, a byte each (appends are atomic): the scorers of a job may be several
     * processes */
    char counter[4096];
    snprintf(counter, sizeof counter, "%s.count", flag);
    long scored = 0;
    int fd = open(counter, O_WRONLY | O_CREAT | O_APPEND, 0600);
    struct stat st;
    if (fd >= 0 && write(fd, "s", 1) == 1 && fstat(fd, &st) == 0)
        scored = (long)st.st_size;
    if (fd >= 0)
        close(fd);
    if (scored > strtol(after, NULL, 10) && access(flag, F_OK) == 0) {
        char marker[4096];
        snprintf(marker, sizeof marker, "%s.held", flag);
        FILE *f = fopen(marker, "w");
        if (f)
            fclose(f);
        for (int i = 0; i < 12000 && access(flag, F_OK) == 0; i++)
            usleep(50000);
    }
    return byte_score(data_source, solution_str, ground_truth, extra_info_json);
}
