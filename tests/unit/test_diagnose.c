/* grpoctl diagnose's pure verdict (daemon/diagnose.c) on hand-made ledgers: one per kind of bottleneck, a
 * balanced run that must yield none, and the knobs named being real configuration keys. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "daemon/diagnose.h"

#define MAXR 8

struct ledger {
    struct diag_rank r[MAXR];
    int n;
    struct diag_run run;
};

static struct ledger *ledger(void)
{
    static struct ledger L;
    memset(&L, 0, sizeof L);
    L.run = (struct diag_run){.steps = 10,
                              .step_s = 2.0,
                              .wait_data_s = NAN,
                              .update_weights_s = NAN,
                              .staleness = NAN,
                              .gen_wait_peers_s = NAN,
                              .gen_imbalance = NAN,
                              .units_stolen = NAN};
    return &L;
}

/* A rank with idle and busy seconds since its first step; its last step's gen (or update) seconds. */
static struct diag_rank *rank(struct ledger *L, Grpo__Role role, double idle, double busy)
{
    struct diag_rank *r = &L->r[L->n];
    *r = (struct diag_rank){.rank = L->n,
                            .role = role,
                            .live = true,
                            .host = "h0",
                            .idle_s = idle,
                            .busy_s = busy,
                            .peak_rss_gb = NAN,
                            .host_memory_gb = NAN};
    r->phase_s[role == GRPO__ROLE__ROLE_TRAINER ? GRPO__PHASE__PHASE_UPDATE_ACTOR : GRPO__PHASE__PHASE_GEN] = busy / 10;
    L->n++;
    return r;
}

static int judge(struct ledger *L, struct diag_finding *out)
{
    int n = diagnose(L->r, L->n, &L->run, out, DIAG_MAX_FINDINGS);
    for (int i = 0; i < n; i++)
        print_message("    %s [%s] %s | %s\n", diag_kind_name(out[i].kind), diag_severity_name(out[i].severity),
                      out[i].text, out[i].knob);
    return n;
}

static bool has_kind(const struct diag_finding *f, int n, enum diag_kind k)
{
    for (int i = 0; i < n; i++)
        if (f[i].kind == k)
            return true;
    return false;
}

/* Every dotted word of the knob that looks like a key (a.b...=, or a known section's prefix) is one. */
static void knob_keys_exist(const char *knob)
{
    char buf[DIAG_TEXT_MAX];
    snprintf(buf, sizeof buf, "%s", knob);
    int keys = 0;
    for (char *tok = strtok(buf, " ,();:"); tok; tok = strtok(NULL, " ,();:")) {
        char *eq = strchr(tok, '=');
        if (eq)
            *eq = 0;
        size_t l = strlen(tok);
        while (l && (tok[l - 1] == '.' || tok[l - 1] == '*'))
            tok[--l] = 0;
        if (!strchr(tok, '.') || strchr(tok, '/'))
            continue; /* not a dotted name */
        static const char *const prefixes[] = {"rollout.", "trainer.",   "actor_rollout_ref.",
                                               "data.",    "placement.", "reward_model."};
        bool keyed = false;
        for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++)
            keyed |= strncmp(tok, prefixes[p], strlen(prefixes[p])) == 0;
        if (!keyed)
            continue;
        if (strcmp(tok, "reward_model.overlong_buffer") == 0)
            tok = "reward_model.overlong_buffer.enable";
        if (!config_find(tok))
            fail_msg("knob names '%s', which is not a configuration key (in: %s)", tok, knob);
        keys++;
    }
    assert_true(keys > 0);
}

static void test_too_early(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.steps = 0;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 9, 1);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 1, 9);
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_TOO_EARLY);
}

static void test_balanced(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 1;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 1, 19);
    rank(L, GRPO__ROLE__ROLE_TRAINER, 1.2, 18.8);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 1.5, 18.5);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 2, 18);
    L->run.update_weights_s = 0.1;
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_BALANCED);
    assert_int_equal(f[0].severity, DIAG_INFO);
    assert_non_null(strstr(f[0].text, "2 trainer rank(s) idle 6%"));
    assert_non_null(strstr(f[0].text, "2 rollout rank(s) idle 9%"));
}

/* The example: on-policy, the rollout rank idles 81% while the trainers update. */
static void test_trainer_bound(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 0;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 3.6, 16.4);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 16.2, 3.8);
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_TRAINER_BOUND);
    assert_int_equal(f[0].severity, DIAG_WARN);
    assert_non_null(strstr(f[0].text, "idle 81%"));
    assert_non_null(strstr(f[0].text, "on-policy"));
    assert_non_null(strstr(f[0].knob, "run colocated"));
    assert_non_null(strstr(f[0].knob, "actor_rollout_ref.rollout.mode=async"));
    knob_keys_exist(f[0].knob);
    /* async: no colocated or async advice, but the ranks' balance */
    L->run.staleness = 1;
    assert_int_equal(judge(L, f), 1);
    assert_null(strstr(f[0].knob, "mode=async"));
    knob_keys_exist(f[0].knob);
}

static void test_rollout_bound(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 0;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 14, 6);
    rank(L, GRPO__ROLE__ROLE_TRAINER, 14.2, 5.8);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 3, 17);
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_ROLLOUT_BOUND);
    assert_non_null(strstr(f[0].text, "2 trainer rank(s) idle 70%"));
    assert_non_null(strstr(f[0].knob, "rollout.n_gpus_per_node"));
    knob_keys_exist(f[0].knob);
    /* just under the bound: nothing */
    L->r[0].idle_s = L->r[1].idle_s = 5.5;
    L->r[0].busy_s = L->r[1].busy_s = 14.5;
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_BALANCED);
}

static void test_weight_sync_bound(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    rank(L, GRPO__ROLE__ROLE_TRAINER, 2, 18);
    struct diag_rank *ro = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 3, 17);
    ro->phase_s[GRPO__PHASE__PHASE_WEIGHT_SYNC] = 0.9; /* the rollout rank's fetch of a 2 s step */
    L->run.update_weights_s = 0.2;
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_WEIGHT_SYNC_BOUND);
    assert_non_null(strstr(f[0].text, "0.90 s (on rank 1) of a 2.00 s step (45%)"));
    assert_non_null(strstr(f[0].knob, "weight_sync=broadcast"));
    knob_keys_exist(f[0].knob);
    /* the trainers' own figure counts too */
    ro->phase_s[GRPO__PHASE__PHASE_WEIGHT_SYNC] = 0;
    L->run.update_weights_s = 0.6;
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_WEIGHT_SYNC_BOUND);
    L->run.update_weights_s = 0.3;
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_BALANCED);
}

/* Colocated ranks: the hybrid ranks' metrics say how long they waited for the slowest one's generation. */
static void test_long_tail_colocated(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    for (int i = 0; i < 4; i++)
        rank(L, GRPO__ROLE__ROLE_HYBRID, 1, 19);
    L->run.gen_wait_peers_s = 0.5;
    L->run.gen_imbalance = 1.4;
    L->run.units_stolen = 3;
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_LONG_TAIL);
    assert_non_null(strstr(f[0].text, "0.50 s of a 2.00 s step (25%)"));
    assert_non_null(strstr(f[0].text, "3 unit(s)"));
    assert_non_null(strstr(f[0].knob, "placement.colocated_steal=true")); /* colocated: the units are the knob */
    knob_keys_exist(f[0].knob);
    /* imbalance alone is enough */
    L->run.gen_wait_peers_s = NAN;
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_LONG_TAIL);
    /* an even step: nothing */
    L->run.gen_imbalance = 1.05;
    L->run.gen_wait_peers_s = 0.05;
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_BALANCED);
    assert_non_null(strstr(f[0].text, "4 colocated rank(s) idle 5%"));
}

/* Split: the last step's generation seconds far apart while the run's busy time is even (a long tail, not a
 * slow rank). */
static void test_long_tail_split(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 1;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 2, 18);
    struct diag_rank *a = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 2, 18);
    struct diag_rank *b = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 2.5, 17.5);
    a->phase_s[GRPO__PHASE__PHASE_GEN] = 1.8;
    b->phase_s[GRPO__PHASE__PHASE_GEN] = 0.9;
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_LONG_TAIL);
    assert_non_null(strstr(f[0].text, "1.80 s on rank 1"));
    knob_keys_exist(f[0].knob);
}

static void test_straggler(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 1;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 1, 19);
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 10, 10);
    struct diag_rank *slow = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 1, 19);
    slow->host = "node7";
    slow->phase_s[GRPO__PHASE__PHASE_GEN] = 1.9;
    rank(L, GRPO__ROLE__ROLE_ROLLOUT, 9, 11);
    struct diag_finding f[DIAG_MAX_FINDINGS];
    int n = judge(L, f);
    assert_int_equal(f[0].kind, DIAG_STRAGGLER);
    assert_non_null(strstr(f[0].text, "rank 2 (rollout on host node7) was busy 19.0 s"));
    assert_non_null(strstr(f[0].text, "1.8x its peers' 10.50 s"));
    assert_false(has_kind(f, n, DIAG_LONG_TAIL)); /* the slow rank's gen is its own, not the responses' */
    knob_keys_exist(f[0].knob);
    /* a lost rank is nobody's straggler */
    slow->live = false;
    n = judge(L, f);
    assert_false(has_kind(f, n, DIAG_STRAGGLER));
    /* nor one a hair slower */
    slow->live = true;
    slow->busy_s = 12;
    n = judge(L, f);
    assert_false(has_kind(f, n, DIAG_STRAGGLER));
}

static void test_memory_headroom(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 1;
    struct diag_rank *t0 = rank(L, GRPO__ROLE__ROLE_TRAINER, 1, 19), *t1 = rank(L, GRPO__ROLE__ROLE_TRAINER, 1, 19);
    struct diag_rank *ro = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 1, 19);
    t0->peak_rss_gb = 10, t1->peak_rss_gb = 11;
    t0->host_memory_gb = t1->host_memory_gb = 24;
    ro->host = "h1", ro->peak_rss_gb = 23, ro->host_memory_gb = 64;
    struct diag_finding f[DIAG_MAX_FINDINGS];
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_MEMORY_HEADROOM);
    assert_non_null(strstr(f[0].text, "host h0's 2 rank(s) (0,1) peak at 21.0 GB of its 24.0 GB (88%)"));
    knob_keys_exist(f[0].knob);
    t0->peak_rss_gb = 8; /* 19 of 24: room enough */
    assert_int_equal(judge(L, f), 1);
    assert_int_equal(f[0].kind, DIAG_BALANCED);
}

/* Several findings come worst first, and max bounds them. */
static void test_order_and_bound(void **state)
{
    (void)state;
    struct ledger *L = ledger();
    L->run.staleness = 0;
    rank(L, GRPO__ROLE__ROLE_TRAINER, 2, 18);
    struct diag_rank *ro = rank(L, GRPO__ROLE__ROLE_ROLLOUT, 16, 4);
    ro->phase_s[GRPO__PHASE__PHASE_WEIGHT_SYNC] = 0.6; /* 30% of the step */
    struct diag_finding f[DIAG_MAX_FINDINGS];
    int n = judge(L, f);
    assert_int_equal(n, 2);
    assert_int_equal(f[0].kind, DIAG_TRAINER_BOUND); /* 80% before 30% */
    assert_int_equal(f[1].kind, DIAG_WEIGHT_SYNC_BOUND);
    assert_true(f[0].share >= f[1].share);
    assert_int_equal(diagnose(L->r, L->n, &L->run, f, 1), 1);
    assert_int_equal(diagnose(L->r, L->n, &L->run, f, 0), 0);
    assert_string_equal(diag_kind_name(DIAG_WEIGHT_SYNC_BOUND), "weight_sync_bound");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_too_early),         cmocka_unit_test(test_balanced),
        cmocka_unit_test(test_trainer_bound),     cmocka_unit_test(test_rollout_bound),
        cmocka_unit_test(test_weight_sync_bound), cmocka_unit_test(test_long_tail_colocated),
        cmocka_unit_test(test_long_tail_split),   cmocka_unit_test(test_straggler),
        cmocka_unit_test(test_memory_headroom),   cmocka_unit_test(test_order_and_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
