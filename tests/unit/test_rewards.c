/* Reward scorers: answer extraction and number normalisation, the countdown
 * evaluator on hostile input, the data_source routing, custom scorers from a
 * shared library, and isolation of scorers that crash, hang or exit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/rewards/reward.h"
#include "worker/rewards/reward_test_paths.h"
#include "worker/rewards/scorers.h"

static double arith(const char *response, const char *gt) { return reward_score_arithmetic(response, gt, NULL, 0); }
static double gsm(const char *response, const char *gt) { return reward_score_gsm8k(response, gt, NULL, 0); }
static double cd(const char *response, const char *gt) { return reward_score_countdown(response, gt, NULL, 0); }
static double math_(const char *response, const char *gt) { return reward_score_math(response, gt, NULL, 0); }

#define CD24 "{\"target\": 24, \"numbers\": [3, 4, 6, 1]}"

static bool num_eq(const char *a, const char *b)
{
    struct reward_number x, y;
    return reward_parse_number(a, strlen(a), &x) && reward_parse_number(b, strlen(b), &y) &&
           reward_numbers_equal(&x, &y);
}

static bool parses(const char *a)
{
    struct reward_number x;
    return reward_parse_number(a, strlen(a), &x);
}

static void test_number_normalisation(void **state)
{
    (void)state;
    assert_true(num_eq("1,234", "1234"));
    assert_true(num_eq("$1,234", "1234"));
    assert_true(num_eq("1,234,567.50", "1234567.5"));
    assert_true(num_eq("12.0", "12"));
    assert_true(num_eq("12.", "12"));
    assert_true(num_eq("012", "12"));
    assert_true(num_eq("-5", "-5.000"));
    assert_true(num_eq("-0", "0"));
    assert_true(num_eq("+7", "7"));
    assert_true(num_eq("\xe2\x88\x92"
                       "7",
                       "-7")); /* U+2212 minus */
    assert_true(num_eq("3/4", "0.75"));
    assert_true(num_eq("\\frac{3}{4}", "0.75"));
    assert_true(num_eq("-\\dfrac{1}{2}", "-0.5"));
    assert_true(num_eq("$42$", "42"));
    assert_true(num_eq("\\$42", "42"));
    assert_true(num_eq("1{,}000", "1000"));
    assert_true(num_eq(" 42 \n", "42"));
    assert_true(num_eq(".5", "0.5"));
    assert_false(num_eq("12", "13"));
    assert_false(num_eq("-5", "5"));
    assert_false(num_eq("1/3", "0.333"));
    /* huge numbers compare exactly, digit by digit */
    assert_true(num_eq("123456789012345678901234567890", "123,456,789,012,345,678,901,234,567,890"));
    assert_false(num_eq("123456789012345678901234567890", "123456789012345678901234567891"));
    /* not numbers */
    assert_false(parses(""));
    assert_false(parses("abc"));
    assert_false(parses("12 apples"));
    assert_false(parses("1e5"));
    assert_false(parses("3/0"));
    assert_false(parses("--5"));
    assert_false(parses("1,23"));
    char big[2000];
    memset(big, '9', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_false(parses(big)); /* too long to compare exactly */
}

static void test_extraction(void **state)
{
    (void)state;
    const char *a;
    size_t n;
    assert_true(reward_find_hash_answer("so\n#### 72", &a, &n));
    assert_int_equal(n, 2);
    assert_memory_equal(a, "72", 2);
    assert_true(reward_find_hash_answer("#### 5 then #### -1,000.", &a, &n));
    assert_memory_equal(a, "-1,000", n);
    assert_false(reward_find_hash_answer("#### abc", &a, &n));
    assert_true(reward_find_hash_answer("##### 9", &a, &n));
    assert_memory_equal(a, "9", n);

    assert_true(reward_find_boxed("x \\boxed{\\frac{1}{2}} and \\boxed{{3}+{4}}", &a, &n));
    assert_int_equal(n, strlen("{3}+{4}"));
    assert_memory_equal(a, "{3}+{4}", n);
    assert_false(reward_find_boxed("\\boxed{5} then \\boxed{6", &a, &n)); /* last one unterminated */
    assert_true(reward_find_boxed("\\boxed 12$", &a, &n));
    assert_memory_equal(a, "12", n);
    assert_true(reward_find_boxed("\\fbox{7}", &a, &n));
    assert_false(reward_find_boxed("no box", &a, &n));

    assert_true(reward_find_answer_is("The answer is 12. Answer: 13", &a, &n));
    assert_memory_equal(a, "13", n);
    assert_true(reward_find_answer_is("**Answer:** $1,200", &a, &n));
    assert_memory_equal(a, "$1,200", n);
    assert_false(reward_find_answer_is("the answer 12", &a, &n));

    assert_true(reward_find_last_number("37 + 48 = 85.", &a, &n));
    assert_memory_equal(a, "85", n);
    assert_true(reward_find_last_number("5-3 gives 2", &a, &n));
    assert_memory_equal(a, "2", n);
    assert_true(reward_find_last_number("48 - 37 = -11", &a, &n));
    assert_memory_equal(a, "-11", n);
    assert_false(reward_find_last_number("none here", &a, &n));
}

static void test_gsm8k(void **state)
{
    (void)state;
    assert_true(gsm("She pays 3 * 24 = 72.\n#### 72", "72") == 1.0);
    assert_true(gsm("#### 1,234", "1234") == 1.0);
    assert_true(gsm("#### $1,234.00", "1234") == 1.0);
    assert_true(gsm("####72", "72") == 1.0);
    assert_true(gsm("#### -3", "-3") == 1.0);
    assert_true(gsm("#### 71", "72") == 0.0);
    assert_true(gsm("#### 72\n#### 71", "72") == 0.0); /* the last #### counts */
    assert_true(gsm("#### 71\n#### 72", "72") == 1.0);
    assert_true(gsm("The answer is 72", "72") == 0.0); /* strict: only the #### form */
    assert_true(gsm("\\boxed{72}", "72") == 0.0);
    assert_true(gsm("", "72") == 0.0);
    char why[128];
    assert_true(reward_score_gsm8k("#### 1", "", why, sizeof why) == 0.0);
    assert_true(why[0] != '\0');
}

/* The gsm8k scorer against verl's (verl/utils/reward_score/gsm8k.py, strict) on a shared table: the expected
 * values are what verl's rule gives (worked by hand from its regex and comparison); the lenient forms differ only
 * with reward_model.lenient_scorers. */
static void test_gsm8k_verl_table(void **state)
{
    (void)state;
    char pad[420];
    memset(pad, 'x', sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    char late[480];
    snprintf(late, sizeof late, "#### 72%s", pad); /* the answer before the last 300 characters */
    static const struct {
        const char *response, *gt;
        double verl, lenient;
    } cases[] = {
        {"She pays 3 * 24 = 72.\n#### 72", "72", 1, 1},
        {"#### $72", "72", 0, 1},  /* '$' before the digits: verl's pattern does not match */
        {"#### ,72", "72", 1, 0},  /* ",72" matches, its comma dropped */
        {"####72", "72", 0, 1},    /* verl wants the space */
        {"#### 72.0", "72", 0, 1}, /* equal as text, not as numbers */
        {"#### 72.", "72", 0, 1},  /* the final period is part of the match */
        {"#### 1,234", "1234", 1, 1},
        {"#### -3", "-3", 1, 1},
        {"#### 72\n#### 71", "72", 0, 0},
        {"#### 71\n#### 72", "72", 1, 1},
        {"The answer is 72", "72", 0, 0},
        {"#### 7 2", "7", 1, 1},
        {"", "3", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const double v = reward_builtin_score("openai/gsm8k", cases[i].response, cases[i].gt, NULL, NULL, 0);
        const double l =
            reward_builtin_score_lenient("openai/gsm8k", cases[i].response, cases[i].gt, NULL, true, NULL, 0);
        if (v != cases[i].verl || l != cases[i].lenient)
            fail_msg("case %zu '%s' vs '%s': verl's rule %g (want %g), lenient %g (want %g)", i, cases[i].response,
                     cases[i].gt, v, cases[i].verl, l, cases[i].lenient);
        assert_true(reward_builtin_accuracy("openai/gsm8k", cases[i].response, cases[i].gt) == cases[i].verl);
    }
    assert_true(reward_builtin_score("openai/gsm8k", late, "72", NULL, NULL, 0) == 0.0);
    assert_true(reward_builtin_score_lenient("openai/gsm8k", late, "72", NULL, true, NULL, 0) == 1.0);
    /* the configuration key picks the rule */
    struct grpo_config c;
    config_init(&c);
    char err[256];
    struct reward_fn *r = reward_create(&c, err, sizeof err);
    struct reward_item it = {"openai/gsm8k", "#### $72", "72", NULL};
    assert_true(reward_score_one(r, &it, NULL, 0) == 0.0);
    reward_free(r);
    struct cfg_error ce;
    assert_int_equal(config_set(&c, "reward_model.lenient_scorers", "true", "test", &ce), 0);
    r = reward_create(&c, err, sizeof err);
    assert_true(reward_score_one(r, &it, NULL, 0) == 1.0);
    reward_free(r);
    config_free(&c);
}

/* The math scorer against verl's (verl/utils/reward_score/math_reward.py) on a shared table: the expected values
 * are what verl's last_boxed_only_string, remove_boxed and strip_string give (worked by hand); "lenient" is the
 * scorer with reward_model.lenient_scorers. */
static void test_math_verl_table(void **state)
{
    (void)state;
    static const struct {
        const char *response, *gt;
        double verl, lenient;
    } cases[] = {
        {"so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", 1, -1},
        {"\\boxed{\\dfrac{1}{2}}", "\\frac12", 1, -1},      /* dfrac, and fix_fracs on \frac12 */
        {"\\boxed{0.5}", "\\frac{1}{2}", 1, -1},            /* 0.5 becomes \frac{1}{2} */
        {"\\boxed{1/2}", "\\frac{1}{2}", 1, -1},            /* fix_a_slash_b */
        {"\\boxed{.5}", "0.5", 1, -1},                      /* a leading '.' gets its 0 */
        {"\\boxed{0.50}", "0.5", 0, 1},                     /* text: 0.50 is not 0.5 */
        {"\\boxed{x = 3}", "3", 1, -1},                     /* a short left side of '=' goes */
        {"\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1, -1}, /* \left, \right and spaces go */
        {"\\boxed{90^\\circ}", "90", 1, -1},
        {"\\boxed{\\sqrt2}", "\\sqrt{2}", 1, -1}, /* fix_sqrt */
        {"\\boxed{5 \\text{ cm}}", "5", 1, -1},   /* remove_right_units */
        {"\\boxed{10\\%}", "10", 1, -1},
        {"\\boxed 7$ and more", "7", 1, -1}, /* "\boxed " up to '$' */
        {"\\fbox{7}", "7", 0, 1},            /* remove_boxed rejects \fbox */
        {"\\boxed{\\frac{3}{4}}", "0.75", 0, 1},
        {"\\boxed{7} then \\boxed{8}", "8", 1, -1}, /* the last one */
        {"\\boxed{7", "7", 0, -1},                  /* unterminated */
        {"the answer is 7", "7", 0, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const double v = reward_builtin_score("lighteval/MATH", cases[i].response, cases[i].gt, NULL, NULL, 0);
        const double l =
            reward_builtin_score_lenient("lighteval/MATH", cases[i].response, cases[i].gt, NULL, true, NULL, 0);
        if (v != cases[i].verl || (cases[i].lenient >= 0 && l != cases[i].lenient))
            fail_msg("case %zu '%s' vs '%s': verl's rule %g (want %g), lenient %g (want %g)", i, cases[i].response,
                     cases[i].gt, v, cases[i].verl, l, cases[i].lenient);
    }
}

static void test_arithmetic(void **state)
{
    (void)state;
    const double eps = 1e-12;
    assert_true(fabs(arith("#### 85", "85") - 1.0) < eps);
    assert_true(fabs(arith("37 + 48 = 85", "85") - 0.9) < eps);    /* last number, not the format */
    assert_true(fabs(arith("\\boxed{85}", "85") - 0.9) < eps);     /* boxed */
    assert_true(fabs(arith("\\boxed{x = 85}", "85") - 0.9) < eps); /* boxed with '=' */
    assert_true(fabs(arith("The answer is 85. Check: 85-48=37", "85") - 0.9) < eps);
    assert_true(fabs(arith("#### 84", "85") - 0.1) < eps);          /* formatted, wrong */
    assert_true(fabs(arith("#### 85 ... 37", "85") - 1.0) < eps);   /* #### beats the last number */
    assert_true(fabs(arith("#### 84\n#### 85", "85") - 1.0) < eps); /* the last #### */
    assert_true(fabs(arith("#### 85\n#### 84", "85") - 0.1) < eps);
    assert_true(fabs(arith("85 is it, 37 + 48", "85") - 0.0) < eps); /* last number is 48 */
    assert_true(fabs(arith("#### -11", "-11") - 1.0) < eps);
    assert_true(fabs(arith("#### 11", "-11") - 0.1) < eps);
    assert_true(fabs(arith("#### 85.0", "85") - 1.0) < eps);
    assert_true(fabs(arith("\\boxed{85", "85") - 0.9) < eps); /* unterminated box: last number */
    assert_true(fabs(arith("", "85") - 0.0) < eps);
    assert_true(fabs(arith("no digits at all", "85") - 0.0) < eps);
    assert_true(fabs(arith("\xf0\x9f\x98\x80 #### 85 \xe2\x9c\x93", "85") - 1.0) < eps); /* unicode around */
    char why[128];
    assert_true(reward_score_arithmetic("#### 5", "five", why, sizeof why) == 0.0);
    assert_non_null(strstr(why, "not a number"));
    /* a long response of digits is scanned in linear time and scores 0 */
    size_t big = 1 << 20;
    char *s = malloc(big + 1);
    memset(s, '7', big);
    s[big] = '\0';
    assert_true(arith(s, "85") == 0.0);
    for (size_t i = 0; i < big; i += 2)
        s[i] = '#';
    assert_true(arith(s, "85") == 0.0); /* "#7#7...": the last number is 7 */
    memset(s, '#', big / 2);
    memset(s + big / 2, '7', big / 2);
    assert_true(arith(s, "85") == 0.0); /* "####...####7777...": no number short enough */
    free(s);
}

static void test_math(void **state)
{
    (void)state;
    assert_true(math_("so \\boxed{\\frac{1}{2}}", "0.5") == 1.0);
    assert_true(math_("so \\boxed{\\frac{1}{2}}", "\\frac12") == 0.0);
    assert_true(math_("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}") == 1.0);
    assert_true(math_("\\boxed{x^2 + 1}", "x^2+1") == 1.0);
    assert_true(math_("\\boxed{\\left( 1, 2 \\right)}", "(1,2)") == 1.0);
    assert_true(math_("\\boxed{3}", "\\boxed{3}") == 1.0);
    assert_true(math_("3", "3") == 0.0); /* needs a box */
    assert_true(math_("\\boxed{4}", "3") == 0.0);
}

static void test_countdown_eval(void **state)
{
    (void)state;
    int64_t num, den, lits[COUNTDOWN_MAX_NUMBERS];
    int nl;
    char err[128];
#define EVAL(s) countdown_eval((s), strlen(s), &num, &den, lits, &nl, err, sizeof err)
    assert_int_equal(EVAL("(6 - 4) * (3 * 4)"), 0);
    assert_true(num == 24 && den == 1 && nl == 4);
    assert_int_equal(EVAL("6 / 4"), 0);
    assert_true(num == 3 && den == 2);
    assert_int_equal(EVAL("1 - 2 - 3"), 0); /* left associative */
    assert_true(num == -4 && den == 1);
    assert_int_equal(EVAL("2 + 3 * 4"), 0); /* precedence */
    assert_true(num == 14);
    assert_int_equal(EVAL("8 / 3 * 3"), 0); /* exact rationals */
    assert_true(num == 8 && den == 1);
    assert_int_equal(EVAL(" \t(1)\n"), 0);

    static const char *const bad[] = {
        "__import__('os').system('ls')",
        "1e999",
        "9**9**9",
        "2^3",
        "1 / 0",
        "4 / (2 - 2)",
        "",
        "()",
        "(1 + 2",
        "1 + 2)",
        "1 +",
        "-1 + 2",
        "+1",
        "1 2",
        "1.5 + 2",
        "0x10",
        "3 \xc3\x97 4",
        "\xef\xbc\x93 + 1",
        "abs(1)",
        "1 // 2",
        "1;2",
        "1 = 1",
        "9999999999 + 1",
        "99999999 * 99999999 * 99999999 * 99999999",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (EVAL(bad[i]) == 0)
            fail_msg("'%s' evaluated", bad[i]);
        assert_true(err[0] != '\0');
    }
    assert_int_equal(EVAL("1 / 0"), -1);
    assert_non_null(strstr(err, "division by zero"));
    assert_int_equal(EVAL("1e999"), -1);
    assert_non_null(strstr(err, "'e'"));

    /* deeply nested parentheses: refused, no stack overflow */
    char deep[COUNTDOWN_MAX_EXPR + 1];
    int d = 100;
    memset(deep, '(', (size_t)d);
    deep[d] = '1';
    memset(deep + d + 1, ')', (size_t)d);
    assert_int_equal(countdown_eval(deep, (size_t)(2 * d + 1), &num, &den, lits, &nl, err, sizeof err), -1);
    assert_non_null(strstr(err, "nested"));
    d = COUNTDOWN_MAX_DEPTH;
    memset(deep, '(', (size_t)d);
    deep[d] = '1';
    memset(deep + d + 1, ')', (size_t)d);
    assert_int_equal(countdown_eval(deep, (size_t)(2 * d + 1), &num, &den, lits, &nl, err, sizeof err), 0);
    /* too long */
    char *longs = malloc(10000);
    for (int i = 0; i < 5000; i++) {
        longs[2 * i] = '1';
        longs[2 * i + 1] = '+';
    }
    assert_int_equal(countdown_eval(longs, 9999, &num, &den, lits, &nl, err, sizeof err), -1);
    free(longs);
#undef EVAL
}

static void test_countdown_scorer(void **state)
{
    (void)state;
    assert_true(cd("<think>6-4=2</think><answer>(6 - 4) * 3 * 4</answer>", CD24) == 0.1); /* 4 twice, 1 unused */
    assert_true(cd("<answer>(1 + 3) * 6 * 4</answer>", CD24) == 0.1);                     /* all used, 96 */
    assert_true(cd("<answer>(4 - 1) * (6 + 3) - 3</answer>", CD24) == 0.1);               /* 3 reused */
    assert_true(cd("<answer>6 * 4 * 1</answer>", CD24) == 0.1);                           /* 3 unused */
    assert_true(cd("<answer>6 * 4 * (3 - 3 + 1)</answer>", CD24) == 0.1);                 /* 3 twice */
    assert_true(cd("<answer>6*(3+1)</answer>", CD24) == 0.1);                             /* 4 unused */
    assert_true(cd("<answer>(6 / (1 - 3 / 4))</answer>", CD24) == 1.0);                   /* 6 / (1/4) = 24, exactly */
    const char *gt = "{\"target\": 24, \"numbers\": [3, 4, 6, 2]}";
    assert_true(cd("<answer>(6 - 2) * 3 * ... </answer>", gt) == 0.1);
    assert_true(cd("<answer>(6 - 2) * (3 + 4) - 4</answer>", gt) == 0.1);
    assert_true(cd("<answer>6 * 4 * (3 - 2)</answer>", gt) == 1.0);
    assert_true(cd("<answer>6*4*(3-2)</answer>", gt) == 1.0);
    assert_true(cd("<answer>\n  6 * 4 * ( 3 - 2 )\t</answer>", gt) == 1.0);
    assert_true(cd("<answer>6 * 4 * (3 - 2) = 24</answer>", gt) == 1.0); /* "= target" allowed */
    assert_true(cd("<answer>6 * 4 * (3 - 2) = 25</answer>", gt) == 0.1);
    assert_true(cd("<answer>24 = 6 * 4 * (3 - 2)</answer>", gt) == 0.1);
    assert_true(cd("<answer>6 * 4 * (2 - 3)</answer>", gt) == 0.1);                        /* -24 */
    assert_true(cd("<answer>wrong</answer> <answer>6 * 4 * (3 - 2)</answer>", gt) == 1.0); /* the last */
    assert_true(cd("<answer>6 * 4 * (3 - 2)</answer> <answer>wrong</answer>", gt) == 0.1);
    assert_true(cd("6 * 4 * (3 - 2)", gt) == 0.0);                  /* no tags */
    assert_true(cd("<answer>6 * 4 * (3 - 2)", gt) == 0.0);          /* unterminated */
    assert_true(cd("</answer>6 * 4 * (3 - 2)<answer>", gt) == 0.0); /* reversed */
    assert_true(cd("<answer>__import__('os').system('rm -rf /')</answer>", gt) == 0.1);
    assert_true(cd("<answer>9**9**9</answer>", gt) == 0.1);
    assert_true(cd("<answer>1e999</answer>", gt) == 0.1);
    assert_true(cd("<answer>(6 * 4) / (3 - 3) * 2</answer>", gt) == 0.1);         /* division by zero */
    assert_true(cd("<answer>6 \xc3\x97 4 \xc3\x97 (3 - 2)</answer>", gt) == 0.1); /* unicode times */
    assert_true(cd("<answer>6 * 4 * (3 - 2) + 0</answer>", gt) == 0.1);           /* extra number */
    /* a deep or long answer is refused quickly */
    char deep[600] = "<answer>";
    size_t k = strlen(deep);
    for (int i = 0; i < 200; i++)
        deep[k++] = '(';
    memcpy(deep + k, "6</answer>", 11);
    assert_true(cd(deep, gt) == 0.1);
    /* fractions reach integer targets exactly */
    assert_true(cd("<answer>8 / (3 - 8 / 3)</answer>", "{\"target\": 24, \"numbers\": [8, 3, 8, 3]}") == 1.0);
    /* ground truth problems are reasons, not crashes */
    char why[200];
    assert_true(reward_score_countdown("<answer>1</answer>", "not json", why, sizeof why) == 0.0);
    assert_non_null(strstr(why, "not JSON"));
    assert_true(reward_score_countdown("<answer>1</answer>", "{\"target\": 1}", why, sizeof why) == 0.0);
    assert_true(why[0] != '\0');
    assert_true(reward_score_countdown("<answer>1</answer>", "{\"target\": 1, \"nums\": [1]}", why, sizeof why) == 1.0);
    assert_true(why[0] == '\0');
}

static void test_routing(void **state)
{
    (void)state;
    assert_string_equal(reward_builtin_scorer_name("openai/gsm8k"), "gsm8k");
    assert_string_equal(reward_builtin_scorer_name("gsm8k"), "gsm8k");
    assert_string_equal(reward_builtin_scorer_name("arithmetic"), "arithmetic");
    assert_string_equal(reward_builtin_scorer_name("countdown"), "countdown");
    assert_string_equal(reward_builtin_scorer_name("lighteval/MATH"), "math");
    assert_null(reward_builtin_scorer_name("GSM8K"));
    assert_null(reward_builtin_scorer_name(""));
    assert_null(reward_builtin_scorer_name(NULL));

    char err[512];
    struct reward_fn *r = reward_create(NULL, err, sizeof err);
    assert_non_null(r);
    assert_false(reward_is_custom(r));
    assert_true(reward_supports(r, "countdown"));
    assert_false(reward_supports(r, "nope"));
    struct reward_item items[] = {
        {"openai/gsm8k", "#### 72", "72", NULL},
        {"arithmetic", "#### 5", "5", NULL},
        {"countdown", "<answer>1 + 2</answer>", "{\"target\": 3, \"numbers\": [1, 2]}", "{}"},
        {"nope", "#### 1", "1", NULL},
        {"math", "\\boxed{2}", "2", NULL},
        {"arithmetic", "#### 5", NULL, NULL},
    };
    int n = (int)(sizeof items / sizeof items[0]);
    double s[6];
    char *why[6];
    reward_score_batch(r, items, n, s, why);
    assert_true(s[0] == 1.0 && s[1] == 1.0 && s[2] == 1.0 && s[3] == 0.0 && s[4] == 1.0 && s[5] == 0.0);
    assert_null(why[0]);
    assert_null(why[2]);
    assert_non_null(why[3]);
    assert_non_null(strstr(why[3], "no built-in scorer for data_source 'nope'"));
    assert_non_null(why[5]);
    assert_int_equal(reward_num_failures(r), 2);
    for (int i = 0; i < n; i++)
        free(why[i]);

    /* the same batch isolated in a child gives the same scores */
    reward_set_isolate_builtin(r, true);
    double s2[6];
    reward_score_batch(r, items, n, s2, NULL);
    assert_memory_equal(s, s2, sizeof s);
    reward_free(r);
}

/* The arithmetic score's two parts, and the exact-answer accuracy that leaves the format credit out. */
static void test_accuracy_split(void **state)
{
    (void)state;
    static const struct {
        const char *ds, *response, *gt;
        bool correct, formatted; /* arithmetic only */
        double score, acc;
    } cases[] = {
        {"arithmetic", "#### 85", "85", true, true, 1.0, 1.0},       /* right, in the asked form */
        {"arithmetic", "37 + 48 = 85", "85", true, false, 0.9, 0.0}, /* right number, other form: no acc */
        {"arithmetic", "\\boxed{85}", "85", true, false, 0.9, 0.0},
        {"arithmetic", "The answer is 85.", "85", true, false, 0.9, 0.0},
        {"arithmetic", "#### 84", "85", false, true, 0.1, 0.0},         /* format credit only */
        {"arithmetic", "#### 84\n#### 85", "85", true, true, 1.0, 1.0}, /* the last #### counts */
        {"arithmetic", "#### 85\n#### 84", "85", false, true, 0.1, 0.0},
        {"arithmetic", "#### 85.0", "85", true, true, 1.0, 1.0},
        {"arithmetic", "#### -11", "-11", true, true, 1.0, 1.0},
        {"arithmetic", "no answer", "85", false, false, 0.0, 0.0},
        {"arithmetic", "", "85", false, false, 0.0, 0.0},
        {"gsm8k", "#### 85", "85", false, false, 1.0, 1.0},
        {"gsm8k", "85", "85", false, false, 0.0, 0.0},
        {"math", "\\boxed{\\frac{3}{4}}", "\\frac34", false, false, 1.0, 1.0},
        {"math", "\\boxed{\\frac{3}{4}}", "0.75", false, false, 0.0, 0.0}, /* verl's rule: text, not numbers */
        {"countdown", "<answer>(6 - 3 + 1) * ...</answer>", CD24, false, false, 0.1, 0.0},   /* form only */
        {"countdown", "<answer>4 * 6 * (3 - 1 - 1)</answer>", CD24, false, false, 0.1, 0.0}, /* 1 used twice */
        {"countdown", "<answer>(6 / (1 - 3 / 4))</answer>", CD24, false, false, 1.0, 1.0},
    };
    const double eps = 1e-12;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[128];
        double score = reward_builtin_score(cases[i].ds, cases[i].response, cases[i].gt, NULL, why, sizeof why);
        double acc = reward_builtin_accuracy(cases[i].ds, cases[i].response, cases[i].gt);
        if (fabs(score - cases[i].score) > eps || acc != cases[i].acc)
            fail_msg("case %zu (%s, '%s'): score %g acc %g, expected %g and %g", i, cases[i].ds, cases[i].response,
                     score, acc, cases[i].score, cases[i].acc);
        if (strcmp(cases[i].ds, "arithmetic") == 0) {
            bool correct, formatted;
            assert_true(reward_arithmetic_parts(cases[i].response, cases[i].gt, &correct, &formatted, NULL, 0));
            assert_true(correct == cases[i].correct && formatted == cases[i].formatted);
            /* the score is the weighted sum of the parts; the accuracy needs both */
            assert_true(fabs(score - ((1 - REWARD_FORMAT_WEIGHT) * correct + REWARD_FORMAT_WEIGHT * formatted)) < eps);
            assert_true(acc == (correct && formatted ? 1.0 : 0.0));
        }
    }
    /* malformed ground truth: no parts, accuracy 0; unknown data_source: accuracy unknown */
    bool correct = true, formatted = true;
    char why[128];
    assert_false(reward_arithmetic_parts("#### 5", "five", &correct, &formatted, why, sizeof why));
    assert_false(correct || formatted);
    assert_non_null(strstr(why, "not a number"));
    assert_true(reward_builtin_accuracy("arithmetic", "#### 5", "five") == 0.0);
    assert_true(isnan(reward_builtin_accuracy("no-such-source", "#### 5", "5")));
    /* through a reward function: built-ins know it, a custom scorer does not */
    char err[256];
    struct reward_fn *r = reward_create(NULL, err, sizeof err);
    assert_non_null(r);
    struct reward_item it = {"arithmetic", "so 2 + 3 = 5\n#### 5", "5", NULL};
    assert_true(reward_accuracy(r, &it) == 1.0);
    it.solution_str = "5";
    assert_true(reward_accuracy(r, &it) == 0.0);
    assert_true(fabs(reward_score_one(r, &it, NULL, 0) - 0.9) < eps);
    reward_free(r);
    r = reward_create_custom(REWARD_TEST_SCORER_PATH, "compute_score", err, sizeof err);
    assert_non_null(r);
    assert_true(isnan(reward_accuracy(r, &it)));
    reward_free(r);
}

static void test_overlong_penalty(void **state)
{
    (void)state;
    assert_true(reward_overlong_penalty(10, 64, 16, 1.0) == 0.0);
    assert_true(reward_overlong_penalty(48, 64, 16, 1.0) == 0.0);
    assert_true(fabs(reward_overlong_penalty(56, 64, 16, 1.0) + 0.5) < 1e-12);
    assert_true(fabs(reward_overlong_penalty(64, 64, 16, 2.0) + 2.0) < 1e-12);
    assert_true(reward_overlong_penalty(64, 64, 0, 1.0) == 0.0);
}

static void test_custom_errors(void **state)
{
    (void)state;
    char err[1024];
    assert_null(reward_create_custom("/nonexistent/scorer.so", "compute_score", err, sizeof err));
    assert_non_null(strstr(err, "custom_reward_function.path"));
    assert_non_null(strstr(err, "/nonexistent/scorer.so"));
    assert_null(reward_create_custom("README.md", "compute_score", err, sizeof err));
    assert_non_null(strstr(err, "README.md"));
    assert_null(reward_create_custom(REWARD_TEST_SCORER_PATH, "no_such_symbol", err, sizeof err));
    assert_non_null(strstr(err, "custom_reward_function.name"));
    assert_non_null(strstr(err, "no_such_symbol"));
    assert_non_null(strstr(err, REWARD_TEST_SCORER_PATH));

    /* through the configuration */
    struct grpo_config c;
    config_init(&c);
    struct cfg_error ce;
    assert_int_equal(config_set(&c, "custom_reward_function.path", REWARD_TEST_SCORER_PATH, "test", &ce), 0);
    assert_int_equal(config_set(&c, "custom_reward_function.name", "length_score", "test", &ce), 0);
    struct reward_fn *r = reward_create(&c, err, sizeof err);
    assert_non_null(r);
    assert_true(reward_is_custom(r));
    assert_true(reward_supports(r, "anything"));
    struct reward_item it = {"anything", "12345", "", NULL};
    char why[REWARD_REASON_MAX];
    assert_true(reward_score_one(r, &it, why, sizeof why) == 5.0);
    assert_string_equal(why, "");
    reward_free(r);
    config_free(&c);
}

/* The example of docs/rewards.md builds and scores as documented. */
static void test_documented_example(void **state)
{
    (void)state;
    char err[1024];
    struct reward_fn *r = reward_create_custom(REWARD_EXAMPLE_SCORER_PATH, "compute_score", err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    struct reward_item items[] = {
        {"qa", "Let me think.\nParis ", "paris", NULL},
        {"qa", "Paris, I believe.\nNo idea", "Paris", NULL},
        {"yes_no", "y", "yes", "{\"id\": 3}"},
        {"qa", "London", "Paris", NULL},
    };
    double s[4];
    reward_score_batch(r, items, 4, s, NULL);
    assert_true(s[0] == 1.0 && s[1] == 0.2 && s[2] == 1.0 && s[3] == 0.0);
    reward_free(r);
}

static void test_custom_isolation(void **state)
{
    (void)state;
    char err[1024];
    struct reward_fn *r = reward_create_custom(REWARD_TEST_SCORER_PATH, NULL, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    reward_set_timeout(r, 1.0);
    struct reward_item items[] = {
        {"a", "x", "x", NULL},            /* 1 */
        {"b", "SEGV", "x", NULL},         /* crash */
        {"c", "y", "y", NULL},            /* 1 */
        {"d", "HANG", "x", NULL},         /* busy loop */
        {"e", "z", "q", NULL},            /* 0 */
        {"f", "ABORT", "x", NULL},        /* SIGABRT */
        {"g", "EXIT", "x", NULL},         /* exit(3) */
        {"h", "NAN", "x", NULL},          /* non-finite */
        {"i", "EXTRA", "x", NULL},        /* extra_info NULL -> "{}" -> 0.5 */
        {"j", "EXTRA", "x", "{\"k\":1}"}, /* 0.25 */
        {"k", "SLEEP", "x", NULL},        /* blocked in pause() */
        {"l", "w", "w", NULL},            /* 1 */
    };
    int n = (int)(sizeof items / sizeof items[0]);
    double s[12];
    char *why[12];
    double t0 = clock_now_s();
    reward_score_batch(r, items, n, s, why);
    double took = clock_now_s() - t0;
    static const double want[12] = {1, 0, 1, 0, 0, 0, 0, 0, 0.5, 0.25, 0, 1};
    for (int i = 0; i < n; i++)
        if (s[i] != want[i])
            fail_msg("sample %d: score %g, want %g (%s)", i, s[i], want[i], why[i] ? why[i] : "no reason");
    assert_null(why[0]);
    assert_null(why[2]);
    assert_null(why[4]);
    assert_null(why[11]);
    assert_non_null(why[1]);
    assert_non_null(strstr(why[1], "SIGSEGV"));
    assert_non_null(why[3]);
    assert_non_null(strstr(why[3], "timed out after 1 s"));
    assert_non_null(strstr(why[5], "SIGABRT"));
    assert_non_null(strstr(why[6], "exited with status 3"));
    assert_non_null(strstr(why[7], "NaN"));
    assert_non_null(strstr(why[10], "timed out"));
    assert_int_equal(reward_num_failures(r), 6);
    /* two timeouts of 1 s plus process starts; far below the 5 s default */
    assert_true(took < 4.5);
    for (int i = 0; i < n; i++)
        free(why[i]);

    /* a batch where every sample hangs stays bounded: n * timeout */
    reward_set_timeout(r, 0.2);
    struct reward_item hangs[3] = {{"a", "HANG", "", NULL}, {"a", "HANG", "", NULL}, {"a", "x", "x", NULL}};
    t0 = clock_now_s();
    reward_score_batch(r, hangs, 3, s, NULL);
    took = clock_now_s() - t0;
    assert_true(s[0] == 0.0 && s[1] == 0.0 && s[2] == 1.0);
    assert_true(took < 2.0);
    reward_free(r);
}

/* A Python scorer in verl's form (tests/fixtures/rewards/verl_reward.py): its scores agree with the built-in gsm8k
 * scorer on plain answers; an exception, a non-number, NaN, an exit or a hang fails that sample alone, with the
 * reason (the exception's last line) logged, and the samples after it are still scored. The same holds, with the
 * same scores, for a pool of 1 and of 3 processes (reward_model.num_workers). */
static struct reward_fn *python_scorer_pool(const char *path, const char *name, const char *python, int nproc,
                                            char *err, size_t errlen)
{
    struct grpo_config c;
    config_init(&c);
    struct cfg_error ce;
    char procs[16];
    snprintf(procs, sizeof procs, "%d", nproc);
    assert_int_equal(config_set(&c, "custom_reward_function.path", path, "test", &ce), 0);
    assert_int_equal(config_set(&c, "custom_reward_function.name", name, "test", &ce), 0);
    assert_int_equal(config_set(&c, "custom_reward_function.python", python, "test", &ce), 0);
    assert_int_equal(config_set(&c, "custom_reward_function.timeout_s", "1.5", "test", &ce), 0);
    assert_int_equal(config_set(&c, "reward_model.num_workers", procs, "test", &ce), 0);
    struct reward_fn *r = reward_create(&c, err, errlen);
    config_free(&c);
    return r;
}

static struct reward_fn *python_scorer(const char *path, const char *name, const char *python, char *err, size_t errlen)
{
    return python_scorer_pool(path, name, python, 1, err, errlen);
}

#define PY_REWARD "tests/fixtures/rewards/verl_reward.py"

/* One batch with every failure kind on a pool of nproc processes; its scores in out[0..*n). */
static void python_batch(int nproc, double *out, int *n_out)
{
    char err[512] = "";
    struct reward_fn *r = python_scorer_pool(PY_REWARD, "compute_score", "python3", nproc, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    assert_true(reward_is_custom(r));
    static const char *const plain[][2] = {
        {"She pays 3 * 24 = 72.\n#### 72", "72"},
        {"#### 71", "72"},
        {"#### 1,234", "1234"},
        {"The answer is 72", "72"},
        {"#### 72\n#### 71", "72"},
        {"PRINT #### 5", "5"},
        {"", "3"},
        {"\xff\xfe bytes that are not UTF-8 #### 72", "72"}, /* sent as U+FFFD, as tokenizer.decode gives them */
        {"#### 7\xc3", "7"},
    };
    const int np = (int)(sizeof plain / sizeof *plain);
    struct reward_item items[32];
    for (int i = 0; i < np; i++)
        items[i] = (struct reward_item){"openai/gsm8k", plain[i][0], plain[i][1], NULL};
    int n = np;
    items[n++] = (struct reward_item){"openai/gsm8k", "RAISE", "1", NULL};                /* np */
    items[n++] = (struct reward_item){"openai/gsm8k", "STRING", "1", NULL};               /* np + 1 */
    items[n++] = (struct reward_item){"openai/gsm8k", "DICT", "1", NULL};                 /* np + 2 */
    items[n++] = (struct reward_item){"openai/gsm8k", "NAN", "1", NULL};                  /* np + 3 */
    items[n++] = (struct reward_item){"openai/gsm8k", "EXIT", "1", NULL};                 /* np + 4 */
    items[n++] = (struct reward_item){"openai/gsm8k", "#### 9", "9", NULL};               /* np + 5: after the exit */
    items[n++] = (struct reward_item){"openai/gsm8k", "HANG", "1", NULL};                 /* np + 6 */
    items[n++] = (struct reward_item){"x", "EXTRA", "{\"target\": 1}", "{\"index\": 7}"}; /* np + 7 */
    items[n++] = (struct reward_item){"openai/gsm8k", "#### 4", "4", NULL};               /* np + 8: after the hang */
    items[n++] = (struct reward_item){"openai/gsm8k", "#### 5", "4", NULL};               /* np + 9 */
    double scores[32];
    char *reasons[32];
    const double t0 = clock_now_s();
    reward_score_batch(r, items, n, scores, reasons);
    const double took = clock_now_s() - t0;
    memcpy(out, scores, (size_t)n * sizeof *scores);
    for (int i = 0; i < np; i++) {
        char why[128];
        const double builtin = reward_score_gsm8k_verl(plain[i][0], plain[i][1], why, sizeof why);
        if (scores[i] != builtin || reasons[i])
            fail_msg("pool %d, sample %d (%s): Python %g, built-in %g (%s)", nproc, i, plain[i][0], scores[i], builtin,
                     reasons[i] ? reasons[i] : "");
    }
    assert_true(scores[0] == 1.0 && scores[1] == 0.0 && scores[2] == 1.0 && scores[5] == 1.0);
    assert_non_null(reasons[np]);
    assert_non_null(strstr(reasons[np], "compute_score raised ValueError: no answer in 'RAISE'"));
    assert_non_null(strstr(reasons[np + 1], "returned str, not a number"));
    assert_null(reasons[np + 2]);
    assert_true(scores[np + 2] == 0.25); /* a dict's "score" (its "acc" is not read) */
    assert_non_null(strstr(reasons[np + 3], "returned nan"));
    assert_non_null(strstr(reasons[np + 4], "exited (status 3)"));
    assert_null(reasons[np + 5]);
    assert_true(scores[np + 5] == 1.0);
    assert_non_null(strstr(reasons[np + 6], "timed out after 1.5 s"));
    assert_null(reasons[np + 7]);
    assert_true(scores[np + 7] == 8.0); /* extra_info as a dict, a JSON ground truth as an object */
    assert_null(reasons[np + 8]);
    assert_true(scores[np + 8] == 1.0);
    assert_null(reasons[np + 9]);
    assert_true(scores[np + 9] == 0.0);
    for (int i = 0; i < n; i++)
        if (scores[i] != 0.0 && reasons[i])
            fail_msg("pool %d, sample %d failed with score %g", nproc, i, scores[i]);
    assert_int_equal(reward_num_failures(r), 5);
    assert_true(took < 30.0);
    for (int i = 0; i < n; i++)
        free(reasons[i]);
    /* the processes live on (or start again) between batches */
    assert_true(reward_score_one(r, &items[0], NULL, 0) == 1.0);
    reward_score_batch(r, items, np, scores, NULL);
    assert_true(scores[0] == 1.0 && scores[2] == 1.0);
    reward_free(r);
    *n_out = n;
}

static void test_python_scorer(void **state)
{
    (void)state;
    char err[512] = "";
    double one[32], three[32];
    int n1 = 0, n3 = 0;
    python_batch(1, one, &n1);
    python_batch(3, three, &n3);
    assert_int_equal(n1, n3);
    for (int i = 0; i < n1; i++)
        if (one[i] != three[i])
            fail_msg("sample %d: %g with one process, %g with three", i, one[i], three[i]);
    struct reward_fn *r;
    /* errors at start-up name the key and Python's reason */
    assert_null(python_scorer(PY_REWARD, "nope", "python3", err, sizeof err));
    assert_non_null(strstr(err, "custom_reward_function.name"));
    assert_non_null(strstr(err, "no function 'nope'"));
    assert_null(python_scorer("tests/fixtures/rewards/broken_reward.py", "compute_score", "python3", err, sizeof err));
    assert_non_null(strstr(err, "custom_reward_function.path"));
    assert_non_null(strstr(err, "ModuleNotFoundError"));
    assert_null(python_scorer("tests/fixtures/rewards/missing.py", "compute_score", "python3", err, sizeof err));
    assert_non_null(strstr(err, "cannot load"));
    assert_null(python_scorer(PY_REWARD, "compute_score", "/nonexistent/python3", err, sizeof err));
    assert_non_null(strstr(err, "exited (status 127)"));
    /* another function of the file */
    r = python_scorer(PY_REWARD, "other_name", "python3", err, sizeof err);
    assert_non_null(r);
    const struct reward_item item = {"openai/gsm8k", "#### 72", "72", NULL};
    assert_true(reward_score_one(r, &item, NULL, 0) == 0.5);
    reward_free(r);
}

/* GDPO's reward components (algorithm.gdpo_reward_keys): the entries of the dict a Python scorer returns, in the
 * keys' order; an entry that is not a number is left out, a dict without a key fails that sample (its score and
 * components 0, the reason naming the key), and a scorer that returns one score has no components. Only a Python
 * scorer has them: gdpo with a C or built-in scorer is refused when the reward function is made. */
static void test_reward_parts(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error ce;
    char err[512] = "";
    assert_int_equal(config_set(&c, "algorithm.adv_estimator", "gdpo", "test", &ce), 0);
    assert_int_equal(config_set(&c, "algorithm.gdpo_reward_keys", "[len_reward, 'byte_reward']", "test", &ce), 0);
    assert_null(reward_create(&c, err, sizeof err)); /* built-in scorers: one score */
    assert_non_null(strstr(err, "algorithm.gdpo_reward_keys"));
    assert_non_null(strstr(err, "a built-in scorer returns one score"));
    assert_int_equal(
        config_set(&c, "custom_reward_function.path", "tests/fixtures/rewards/gdpo_reward.py", "test", &ce), 0);
    struct reward_fn *r = reward_create(&c, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    assert_int_equal(reward_num_parts(r), 2);
    assert_string_equal(reward_part_name(r, 0), "len_reward");
    assert_string_equal(reward_part_name(r, 1), "byte_reward");
    const struct reward_item items[3] = {
        {"x", "ab", "", NULL},    /* bytes 97 + 98 = 195 = 6 mod 7: 6/7; length 2: 1 */
        {"x", "NOKEY", "", NULL}, /* no len_reward */
        {"x", "abc", "", NULL},   /* 294 = 0 mod 7: 0; length 3: 0 */
    };
    double scores[3], parts[6];
    char *reasons[3];
    reward_score_batch_parts(r, items, 3, scores, reasons, parts);
    assert_null(reasons[0]);
    assert_float_equal(scores[0], 6.0 / 7 + 1.0, 1e-15);
    assert_float_equal(parts[0], 1.0, 0);
    assert_float_equal(parts[1], 6.0 / 7, 1e-15);
    assert_non_null(reasons[1]);
    assert_non_null(
        strstr(reasons[1], "compute_score returned a dict without 'len_reward' (algorithm.gdpo_reward_keys)"));
    assert_true(scores[1] == 0.0 && parts[2] == 0.0 && parts[3] == 0.0);
    assert_null(reasons[2]);
    assert_true(scores[2] == 0.0 && parts[4] == 0.0 && parts[5] == 0.0);
    for (int i = 0; i < 3; i++)
        free(reasons[i]);
    reward_score_batch(r, items, 1, scores, NULL); /* no components wanted */
    assert_float_equal(scores[0], 6.0 / 7 + 1.0, 1e-15);
    reward_free(r);
    /* a scorer of one score: no dict, so no components */
    assert_int_equal(config_set(&c, "custom_reward_function.path", PY_REWARD, "test", &ce), 0);
    assert_int_equal(config_set(&c, "algorithm.gdpo_reward_keys", "score_part", "test", &ce), 0);
    r = reward_create(&c, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    const struct reward_item plain = {"openai/gsm8k", "#### 72", "72", NULL};
    reward_score_batch_parts(r, &plain, 1, scores, reasons, parts);
    assert_non_null(reasons[0]);
    assert_non_null(strstr(reasons[0], "returned no dict, so no 'score_part'"));
    free(reasons[0]);
    reward_free(r);
    /* without gdpo the keys are not read */
    assert_int_equal(config_set(&c, "algorithm.adv_estimator", "grpo", "test", &ce), 0);
    r = reward_create(&c, err, sizeof err);
    assert_non_null(r);
    assert_int_equal(reward_num_parts(r), 0);
    reward_free(r);
    config_free(&c);
}

/* Wait for process pid (not our child) to end, as an event: its pidfd turns readable when it exits (a zombie
 * waiting for its new parent counts as ended). true when it ended within timeout_s, or was gone already. */
static bool wait_process_end(long pid, double timeout_s)
{
    const int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0u);
    if (fd < 0)
        return true; /* ESRCH: gone (and reaped) already */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    const int rc = poll(&p, 1, (int)(timeout_s * 1000));
    close(fd);
    return rc == 1;
}

/* A Python reward that forks (a child, and the child's child) leaves nothing behind: the scorer process leads a
 * process group of its own, ended whole when the pool is freed, and when a call times out and the process is
 * killed. Each pid is awaited as an event (its end), bounded by 30 s. */
static void test_python_children_ended(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo_pykids_XXXXXX", err[512] = "", extra[600], pids[560];
    assert_non_null(mkdtemp(dir));
    snprintf(pids, sizeof pids, "%s/pids", dir);
    snprintf(extra, sizeof extra, "{\"pids\": \"%s\"}", pids);
    struct reward_fn *r =
        python_scorer("tests/fixtures/rewards/forking_reward.py", "compute_score", "python3", err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    const struct reward_item ok = {"x", "fine", "1", extra}, hang = {"x", "HANG", "1", extra};
    assert_true(reward_score_one(r, &ok, NULL, 0) == 1.0);
    char *why = NULL;
    double score = 1.0;
    reward_score_batch(r, &hang, 1, &score, &why); /* timed out: that process is killed, with its group */
    assert_non_null(why);
    assert_non_null(strstr(why, "timed out"));
    free(why);
    assert_true(reward_score_one(r, &ok, NULL, 0) == 1.0); /* a new process, which forks again */
    reward_free(r);
    FILE *f = fopen(pids, "r");
    assert_non_null(f);
    long pid[16];
    int n = 0;
    while (n < 16 && fscanf(f, "%ld", &pid[n]) == 1)
        n++;
    fclose(f);
    assert_int_equal(n, 6); /* three calls, a child and a grandchild each */
    for (int i = 0; i < n; i++) {
        if (!wait_process_end(pid[i], 30.0))
            fail_msg("process %ld, started by the reward (call %d), outlived the scorer", pid[i], i / 2 + 1);
    }
    must_rm_rf(dir);
}

/* A slow reward (0.25 s a sample) on a pool of 1 and of 2: the same scores; the times are printed, not asserted
 * (the machine may be loaded). */
static void test_python_pool_speedup(void **state)
{
    (void)state;
    struct reward_item items[8];
    for (int i = 0; i < 8; i++)
        items[i] = (struct reward_item){"openai/gsm8k", "SLEEP 0.25", "1", NULL};
    double took[2];
    for (int k = 0; k < 2; k++) {
        char err[512] = "";
        struct reward_fn *r = python_scorer_pool(PY_REWARD, "compute_score", "python3", k + 1, err, sizeof err);
        if (!r)
            fail_msg("%s", err);
        double scores[8];
        const double t0 = clock_now_s();
        reward_score_batch(r, items, 8, scores, NULL);
        took[k] = clock_now_s() - t0;
        for (int i = 0; i < 8; i++)
            assert_true(scores[i] == 1.0);
        assert_int_equal(reward_num_failures(r), 0);
        reward_free(r);
    }
    print_message("python scorer, 8 samples of 0.25 s: 1 process %.2f s, 2 processes %.2f s (x%.2f)\n", took[0],
                  took[1], took[0] / took[1]);
}

/* The pool's processes work at once, shown without timing: two samples that each wait until two processes have
 * reached a shared folder both score on a pool of 2 (one process alone times out on the first); and a batch of
 * 9 on a pool of 3 is scored by 3 processes. */
static void test_python_pool_concurrent(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo-meet-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char meet[64];
    snprintf(meet, sizeof meet, "MEET %s 2", dir);
    struct reward_item items[9];
    for (int i = 0; i < 2; i++)
        items[i] = (struct reward_item){"openai/gsm8k", meet, "1", NULL};
    char err[512] = "";
    struct reward_fn *r = python_scorer_pool(PY_REWARD, "compute_score", "python3", 2, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    double scores[9];
    char *reasons[9];
    reward_score_batch(r, items, 2, scores, reasons);
    for (int i = 0; i < 2; i++) {
        if (reasons[i])
            fail_msg("sample %d: %s", i, reasons[i]);
        assert_true(scores[i] == 1.0);
    }
    reward_free(r);
    char cmd[128]; /* the folder holds a file per process, named by its pid */
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    r = python_scorer_pool(PY_REWARD, "compute_score", "python3", 3, err, sizeof err);
    if (!r)
        fail_msg("%s", err);
    for (int i = 0; i < 9; i++)
        items[i] = (struct reward_item){"openai/gsm8k", "PID", "1", NULL};
    reward_score_batch(r, items, 9, scores, NULL);
    int distinct = 0;
    for (int i = 0; i < 9; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || scores[j] == scores[i];
        distinct += !seen && scores[i] > 0;
    }
    assert_int_equal(distinct, 3);
    reward_free(r);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_number_normalisation),
        cmocka_unit_test(test_extraction),
        cmocka_unit_test(test_gsm8k),
        cmocka_unit_test(test_gsm8k_verl_table),
        cmocka_unit_test(test_math_verl_table),
        cmocka_unit_test(test_arithmetic),
        cmocka_unit_test(test_math),
        cmocka_unit_test(test_countdown_eval),
        cmocka_unit_test(test_countdown_scorer),
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_accuracy_split),
        cmocka_unit_test(test_overlong_penalty),
        cmocka_unit_test(test_custom_errors),
        cmocka_unit_test(test_documented_example),
        cmocka_unit_test(test_custom_isolation),
        cmocka_unit_test(test_python_scorer),
        cmocka_unit_test(test_reward_parts),
        cmocka_unit_test(test_python_pool_speedup),
        cmocka_unit_test(test_python_pool_concurrent),
        cmocka_unit_test(test_python_children_ended),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
