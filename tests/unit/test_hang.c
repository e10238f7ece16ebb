/* The hang verdict (proto/hang.c) on hand-made ranks: a laggard, a mismatch of collective and of number, a
 * mismatch across groups, a rank stuck in I/O, a rollout rank starved of grants, a rank that never registered
 * (named with its host), a collective every member is in, a pause that waits for ranks that do not reach a safe
 * point, and no hang while the ranks make progress. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proto/hang.h"

#define MAXR 8

struct world {
    struct hang_rank r[MAXR];
    int n;
    struct hang_run run;
};

static struct world *world(int n)
{
    static struct world W;
    memset(&W, 0, sizeof W);
    W.n = n;
    W.run.min_wait_s = 30;
    for (int i = 0; i < n; i++)
        W.r[i] = (struct hang_rank){.rank = i,
                                    .presence = HANG_LIVE,
                                    .host = i < n / 2 ? "node-a" : "node-b",
                                    .role = GRPO__ROLE__ROLE_HYBRID,
                                    .phase = GRPO__PHASE__PHASE_UPDATE_ACTOR,
                                    .layer = -1};
    return &W;
}

static void waits(struct world *W, int rank, const char *op, const char *group, const char *members, int size,
                  uint64_t seq, double seconds)
{
    struct hang_rank *r = &W->r[rank];
    r->waiting = true;
    r->wait = (struct hang_wait){.kind = "collective",
                                 .op = op,
                                 .group = group,
                                 .members = members,
                                 .group_size = size,
                                 .seq = seq,
                                 .peer = -1,
                                 .phase = r->phase,
                                 .layer = 3,
                                 .backward = true,
                                 .seconds = seconds};
}

static int judge(struct world *W, struct hang_finding *out)
{
    const int n = hang_analyse(W->r, W->n, &W->run, out, HANG_MAX_FINDINGS);
    for (int i = 0; i < n; i++)
        print_message("    %s (rank %d) %s\n", hang_kind_name(out[i].kind), out[i].rank, out[i].text);
    return n;
}

static void has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("\"%s\" lacks \"%s\"", text, part);
}

static void test_laggard(void **state)
{
    (void)state;
    struct world *W = world(8);
    for (int i = 0; i < 8; i++)
        if (i != 5)
            waits(W, i, "all-reduce", "dp", "0-7", 8, 1234, 90 + i);
    static const struct hang_wait last = {.kind = "collective",
                                          .op = "all-reduce",
                                          .group = "tp",
                                          .members = "4-5",
                                          .group_size = 2,
                                          .seq = 77,
                                          .peer = -1,
                                          .layer = 12,
                                          .backward = true};
    W->r[5].last = &last;
    struct hang_finding f[HANG_MAX_FINDINGS];
    const int n = judge(W, f);
    assert_int_equal(n, 1);
    assert_int_equal(f[0].kind, HANG_LAGGARD);
    assert_int_equal(f[0].rank, 5);
    has(f[0].text, "rank 5 (host node-b) has not entered all-reduce #1234 of dp (ranks 0-4,6-7 waiting "
                   "there 97 s); rank 5 is in phase update_actor, in no wait (its last: all-reduce #77 of tp (ranks "
                   "4-5), layer 12 backward)");
    /* its heartbeat says the layer it is in now: that, rather than its last wait's */
    W->r[5].layer = 9;
    W->r[5].backward = true;
    assert_int_equal(judge(W, f), 1);
    has(f[0].text, "; rank 5 is in phase update_actor, layer 9 backward, in no wait");
}

static void test_mismatch_op(void **state)
{
    (void)state;
    struct world *W = world(4);
    waits(W, 0, "all-reduce", "dp", "0-3", 4, 12, 95);
    waits(W, 1, "broadcast", "dp", "0-3", 4, 12, 95);
    waits(W, 2, "all-reduce", "dp", "0-3", 4, 12, 94);
    waits(W, 3, "all-reduce", "dp", "0-3", 4, 12, 93);
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_MISMATCH);
    has(f[0].text, "mismatch in dp (ranks 0-3)");
    has(f[0].text, "ranks 0,2-3 in all-reduce #12, rank 1 in broadcast #12");
}

static void test_mismatch_seq(void **state)
{
    (void)state;
    struct world *W = world(2);
    waits(W, 0, "all-reduce", "dp", "0-1", 2, 12, 60);
    waits(W, 1, "all-reduce", "dp", "0-1", 2, 13, 1); /* a short wait: the numbers still say they never meet */
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_MISMATCH);
    has(f[0].text, "rank 0 in all-reduce #12, rank 1 in all-reduce #13");
}

static void test_mismatch_across_groups(void **state)
{
    (void)state;
    struct world *W = world(2);
    waits(W, 0, "all-reduce", "dp", "0-1", 2, 7, 60);
    waits(W, 1, "all-gather", "trainers", "0-1", 2, 5, 60);
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1); /* told once, not once per group */
    assert_int_equal(f[0].kind, HANG_MISMATCH);
    has(f[0].text, "rank 1 waits in all-gather #5 of trainers (ranks 0-1) while rank 0 waits in all-reduce #7 of dp");
}

static void test_io(void **state)
{
    (void)state;
    struct world *W = world(4);
    W->r[2].waiting = true;
    W->r[2].phase = GRPO__PHASE__PHASE_CHECKPOINT;
    W->r[2].wait = (struct hang_wait){.kind = "io",
                                      .op = "checkpoint write",
                                      .group = "checkpoint",
                                      .members = "/runs/x/ckpt",
                                      .seq = 40,
                                      .peer = -1,
                                      .layer = -1,
                                      .seconds = 300};
    waits(W, 0, "all-reduce", "dp", "0-3", 4, 9, 290);
    waits(W, 1, "all-reduce", "dp", "0-3", 4, 9, 291);
    waits(W, 3, "all-reduce", "dp", "0-3", 4, 9, 292);
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1); /* not a laggard besides: the same rank, told once */
    assert_int_equal(f[0].kind, HANG_IO);
    assert_int_equal(f[0].rank, 2);
    has(f[0].text, "rank 2 (host node-b) is stuck in I/O: checkpoint write of step 40 in /runs/x/ckpt, 300 s so far; "
                   "ranks 0-1,3 wait for it (all-reduce #9 of dp (ranks 0-3), up to 292 s)");
}

static void test_grant(void **state)
{
    (void)state;
    struct world *W = world(3);
    W->r[0].role = W->r[1].role = GRPO__ROLE__ROLE_TRAINER;
    W->r[2].role = GRPO__ROLE__ROLE_ROLLOUT;
    W->r[2].phase = GRPO__PHASE__PHASE_IDLE;
    W->r[2].waiting = true;
    W->r[2].wait = (struct hang_wait){.kind = "plane",
                                      .op = "work request",
                                      .group = "dispatcher",
                                      .members = "tcp://node-a:10001",
                                      .peer = -1,
                                      .layer = -1,
                                      .seconds = 120};
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_GRANT);
    assert_int_equal(f[0].rank, 2);
    has(f[0].text, "rollout rank 2 has waited 120 s for a work grant that does not come (work request to dispatcher "
                   "at tcp://node-a:10001)");
    has(f[0].text, "the trainers: rank 0 is in phase update_actor, in no wait; rank 1 is in phase update_actor");
}

static void test_unregistered(void **state)
{
    (void)state;
    struct world *W = world(4);
    W->r[3].presence = HANG_UNREGISTERED;
    W->r[3].host = "node-c";
    W->run.waiting_for_ranks_s = 45;
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_UNREGISTERED_RANK);
    assert_int_equal(f[0].rank, 3);
    has(f[0].text, "start-up waits for rank 3 (host node-c), which never registered: 3 rank(s) registered and have "
                   "waited 45 s for it");
    /* the ranks that did register wait in a collective for it: the cause comes first, then the symptom */
    for (int i = 0; i < 3; i++)
        waits(W, i, "all-gather", "world", "0-3", 4, 1, 44);
    const int n = judge(W, f);
    assert_int_equal(n, 2);
    assert_int_equal(f[0].kind, HANG_UNREGISTERED_RANK);
    assert_int_equal(f[1].kind, HANG_LAGGARD);
    has(f[1].text, "rank 3 (host node-c) never registered");
    /* not yet long enough: no verdict */
    W = world(4);
    W->r[3].presence = HANG_UNREGISTERED;
    W->run.waiting_for_ranks_s = 10;
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_NONE);
}

static void test_stuck_everyone_in(void **state)
{
    (void)state;
    struct world *W = world(2);
    waits(W, 0, "all-reduce", "dp", "0-1", 2, 3, 50);
    waits(W, 1, "all-reduce", "dp", "0-1", 2, 3, 50);
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_STUCK);
    has(f[0].text, "every rank of dp (ranks 0-1) has been in all-reduce #3 for up to 50 s: the operation itself");
}

static void test_no_hang(void **state)
{
    (void)state;
    struct world *W = world(4); /* ranks at work: short waits, each in its own place of the step */
    waits(W, 0, "all-reduce", "dp", "0-3", 4, 100, 0.2);
    waits(W, 2, "all-reduce", "dp", "0-3", 4, 100, 0.1);
    struct hang_finding f[HANG_MAX_FINDINGS];
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_NONE);
    has(f[0].text, "no hang: no rank has waited 30 s in one place (the longest wait now: rank 0, 0.2 s in all-reduce "
                   "#100 of dp (ranks 0-3))");
    W = world(2);
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_NONE);
    /* a lost rank is not waited for by the verdict: gone ranks are named when others wait for them */
    W = world(2);
    W->r[1].presence = HANG_GONE;
    waits(W, 0, "all-reduce", "dp", "0-1", 2, 4, 40);
    assert_int_equal(judge(W, f), 1);
    assert_int_equal(f[0].kind, HANG_LAGGARD);
    has(f[0].text, "rank 1 (host node-b) is gone");
}

/* A pausing run: the ranks held (paused) wait on purpose, and are judged no hang; the pause that has waited
 * min_wait_s for the others comes first, naming each with where it is, and the laggard behind it follows. */
static void test_pause(void **state)
{
    (void)state;
    struct world *W = world(4);
    /* ranks 2-3 paused, rank 2 held in the broadcast of its leader's word for longer than min_wait_s */
    W->r[2].held = W->r[3].held = true;
    waits(W, 2, "broadcast", "trainers", "2-3", 2, 40, 200);
    /* rank 0 waits for rank 1 in an all-reduce; rank 1 is in the update, in no wait */
    waits(W, 0, "all-reduce", "dp", "0-1", 2, 12, 45);
    W->run.pausing_s = 50;
    struct hang_finding f[HANG_MAX_FINDINGS];
    int n = judge(W, f);
    assert_int_equal(n, 2);
    assert_int_equal(f[0].kind, HANG_PAUSE);
    assert_int_equal(f[0].rank, 1); /* the one of them in no wait */
    assert_string_equal(f[0].text, "the pause has waited 50 s for ranks 0-1 to reach a safe point: rank 0 (host "
                                   "node-a) is in all-reduce #12 of dp (ranks 0-1), layer 3 backward, waiting 45 s; "
                                   "rank 1 (host node-a) is in phase update_actor, in no wait");
    assert_int_equal(f[1].kind, HANG_LAGGARD);
    assert_int_equal(f[1].rank, 1);
    /* a pause shorter than min_wait_s is no finding; the laggard stays */
    W->run.pausing_s = 20;
    n = judge(W, f);
    assert_int_equal(n, 1);
    assert_int_equal(f[0].kind, HANG_LAGGARD);
    /* one rank left: the pause names it alone; nothing else is found (a held rank's long wait is none) */
    W->r[0].held = true;
    W->run.pausing_s = 31;
    n = judge(W, f);
    assert_int_equal(n, 1);
    assert_int_equal(f[0].kind, HANG_PAUSE);
    assert_int_equal(f[0].rank, 1);
    assert_string_equal(f[0].text, "the pause has waited 31 s for rank 1 to reach a safe point: rank 1 (host node-a) "
                                   "is in phase update_actor, in no wait");
    /* the same ranks, not held (a running run): rank 2's wait in the broadcast is a hang */
    for (int i = 0; i < 4; i++)
        W->r[i].held = false;
    W->run.pausing_s = 0;
    n = judge(W, f);
    assert_true(n >= 1);
    assert_int_not_equal(f[0].kind, HANG_PAUSE);
    assert_int_not_equal(f[0].kind, HANG_NONE);
    assert_string_equal(hang_kind_name(HANG_PAUSE), "pause");
}

static void test_parse_ranks(void **state)
{
    (void)state;
    int r[16];
    assert_int_equal(hang_parse_ranks("0-4,6-7", r, 16), 7);
    assert_int_equal(r[5], 6);
    assert_int_equal(hang_parse_ranks("3", r, 16), 1);
    assert_int_equal(hang_parse_ranks("0-3,...", r, 16), -1);
    assert_int_equal(hang_parse_ranks("/runs/x", r, 16), -1);
    assert_int_equal(hang_parse_ranks("", r, 16), -1);
    assert_int_equal(hang_parse_ranks("0-100", r, 16), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_laggard),      cmocka_unit_test(test_mismatch_op),
        cmocka_unit_test(test_mismatch_seq), cmocka_unit_test(test_mismatch_across_groups),
        cmocka_unit_test(test_io),           cmocka_unit_test(test_grant),
        cmocka_unit_test(test_unregistered), cmocka_unit_test(test_stuck_everyone_in),
        cmocka_unit_test(test_no_hang),      cmocka_unit_test(test_parse_ranks),
        cmocka_unit_test(test_pause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
