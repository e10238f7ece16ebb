/* The data plane's back-pressure (worker/plane/dataplane.h): a batch waits for the trainer's answer to the one
 * before it; an answer that comes lets it go, a refusal is said with its reason (-2), silence times out (-1). A
 * wait on a trainer that will never answer (it finished without reading a duplicate batch: granted again
 * elsewhere and done there) gives up as soon as the run's end is heard (dataplane_push_until), not after the
 * whole timeout: a CI run's rollout rank waited a minute so, and its finished job with it (2026-12-07). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/plane/dataplane.h"

/* An ipc endpoint of this test's own (pid in the name). */
static void endpoint(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "ipc:///tmp/test-dataplane-%d-%s.sock", (int)getpid(), tag);
}

struct pair {
    struct dataplane_pull *pull;
    struct dataplane_push *push;
};

static struct pair open_pair(const char *tag)
{
    char ep[128], err[256] = "";
    endpoint(ep, sizeof ep, tag);
    struct pair p = {.pull = dataplane_pull_open(ep, err, sizeof err)};
    assert_non_null(p.pull);
    const char *eps[] = {ep};
    p.push = dataplane_push_open(eps, 1, NULL, err, sizeof err);
    assert_non_null(p.push);
    return p;
}

static void close_pair(struct pair *p)
{
    dataplane_push_close(p->push);
    dataplane_pull_close(p->pull);
}

/* The trainer takes one batch, checks its bytes, and answers it. */
static void take(struct pair *p, const char *want, bool ok, const char *why)
{
    void *buf = NULL;
    size_t len = 0;
    char err[256] = "";
    assert_int_equal(dataplane_recv(p->pull, 10000, &buf, &len, err, sizeof err), 1);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
    dataplane_msg_free(buf);
    dataplane_answer(p->pull, ok, why, NULL);
}

static void test_answered_refused_silent(void **state)
{
    (void)state;
    struct pair p = open_pair("a");
    char err[512] = "";
    assert_int_equal(dataplane_send(p.push, 0, "one", 3, 1, 10000, err, sizeof err), 0); /* nothing awaited */
    take(&p, "one", true, "");
    assert_int_equal(dataplane_send(p.push, 0, "two", 3, 2, 10000, err, sizeof err), 0); /* "one" answered */
    take(&p, "two", false, "another model");
    /* the refusal of "two" is said when the next batch waits on it */
    assert_int_equal(dataplane_send(p.push, 0, "three", 5, 3, 10000, err, sizeof err), -2);
    assert_non_null(strstr(err, "refused a batch: another model"));
    assert_int_equal(dataplane_send(p.push, 0, "three", 5, 3, 10000, err, sizeof err), 0);
    /* "three" never read: the next one times out, and says so */
    assert_int_equal(dataplane_send(p.push, 0, "four", 4, 4, 300, err, sizeof err), -1);
    assert_non_null(strstr(err, "no answer from trainer DP rank 0: timed out (the trainer takes no data)"));
    take(&p, "three", true, ""); /* the trainer comes back: the batch waited for goes */
    assert_int_equal(dataplane_send(p.push, 0, "four", 4, 4, 10000, err, sizeof err), 0);
    take(&p, "four", true, "");
    close_pair(&p);
}

/* The run's end as the rollout process hears it: the third look finds it (after two slices of the wait). */
static bool ended_at_third(void *ud)
{
    int *looks = ud;
    return ++*looks >= 3;
}

static bool never_ended(void *ud)
{
    ++*(int *)ud;
    return false;
}

static void test_run_end_cuts_the_wait(void **state)
{
    (void)state;
    struct pair p = open_pair("b");
    char err[512] = "";
    int looks = 0;
    dataplane_push_until(p.push, never_ended, &looks);
    assert_int_equal(dataplane_send(p.push, 0, "dup", 3, 1, 10000, err, sizeof err), 0);
    /* the trainer finished without reading it: a run that goes on waits the timeout out, looking at the end
     * between slices */
    assert_int_equal(dataplane_send(p.push, 0, "next", 4, 2, 700, err, sizeof err), -1);
    assert_non_null(strstr(err, "timed out"));
    assert_true(looks >= 2);
    /* the end heard: an hour's timeout gives up at the third look, saying why */
    looks = 0;
    dataplane_push_until(p.push, ended_at_third, &looks);
    assert_int_equal(dataplane_send(p.push, 0, "next", 4, 2, 3600 * 1000, err, sizeof err), -1);
    assert_int_equal(looks, 3);
    assert_non_null(strstr(err, "no answer from trainer DP rank 0: the run ended meanwhile"));
    close_pair(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answered_refused_silent),
        cmocka_unit_test(test_run_end_cuts_the_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
