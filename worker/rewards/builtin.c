/* Built-in rule scorers and the data_source -> scorer table. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "scorers.h"

static void set_why(char *why, size_t whylen, const char *fmt, const char *arg)
{
    if (why && whylen)
        snprintf(why, whylen, fmt, arg);
}

static void clear_why(char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
}

/* Ground truth of the numeric scorers; "" / NULL is a malformed sample. */
static bool numeric_ground_truth(const char *gt, char *why, size_t whylen)
{
    if (!gt || !*gt) {
        set_why(why, whylen, "empty ground truth%s", "");
        return false;
    }
    return true;
}

double reward_score_gsm8k(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    clear_why(why, whylen);
    if (!numeric_ground_truth(ground_truth, why, whylen))
        return 0.0;
    const char *a;
    size_t n;
    if (!reward_find_hash_answer(solution, &a, &n))
        return 0.0;
    return reward_answer_matches(a, n, ground_truth) ? 1.0 : 0.0;
}

bool reward_arithmetic_parts(const char *solution, const char *ground_truth, bool *correct, bool *formatted, char *why,
                             size_t whylen)
{
    clear_why(why, whylen);
    *correct = *formatted = false;
    struct reward_number g;
    if (!numeric_ground_truth(ground_truth, why, whylen))
        return false;
    if (!reward_parse_number(ground_truth, strlen(ground_truth), &g)) {
        set_why(why, whylen, "ground truth '%.60s' is not a number", ground_truth);
        return false;
    }
    const char *a;
    size_t n;
    bool found;
    if ((found = reward_find_hash_answer(solution, &a, &n))) {
        *formatted = true;
    } else if ((found = reward_find_boxed(solution, &a, &n))) {
        /* "\boxed{x = 85}": the part after the last '=' */
        const char *eq = NULL;
        for (size_t i = 0; i < n; i++)
            if (a[i] == '=')
                eq = a + i;
        if (eq) {
            n -= (size_t)(eq + 1 - a);
            a = eq + 1;
        }
    } else if (!(found = reward_find_answer_is(solution, &a, &n))) {
        found = reward_find_last_number(solution, &a, &n);
    }
    *correct = found && reward_answer_matches(a, n, ground_truth);
    return true;
}

double reward_score_arithmetic(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    bool correct, formatted;
    if (!reward_arithmetic_parts(solution, ground_truth, &correct, &formatted, why, whylen))
        return 0.0;
    return (1.0 - REWARD_FORMAT_WEIGHT) * (correct ? 1.0 : 0.0) + REWARD_FORMAT_WEIGHT * (formatted ? 1.0 : 0.0);
}

double reward_score_math(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    clear_why(why, whylen);
    if (!numeric_ground_truth(ground_truth, why, whylen))
        return 0.0;
    const char *a;
    size_t n;
    if (!reward_find_boxed(solution, &a, &n))
        return 0.0;
    /* a ground truth given as "\boxed{...}" compares by its content */
    const char *g;
    size_t gn;
    if (reward_find_boxed(ground_truth, &g, &gn) && gn < 4096) {
        char buf[4096];
        memcpy(buf, g, gn);
        buf[gn] = '\0';
        return reward_answer_matches(a, n, buf) ? 1.0 : 0.0;
    }
    return reward_answer_matches(a, n, ground_truth) ? 1.0 : 0.0;
}

double reward_score_gsm8k_verl(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    clear_why(why, whylen);
    /* the last 300 characters (code points: UTF-8 continuation bytes are not counted) */
    const char *s = solution + strlen(solution);
    for (int chars = 0; s > solution && chars < 300;) {
        s--;
        if (((unsigned char)*s & 0xc0) != 0x80)
            chars++;
    }
    const char *last = NULL;
    size_t last_n = 0;
    for (const char *p = strstr(s, "#### "); p; p = strstr(p, "#### ")) {
        const char *a = p + 5;
        size_t n = *a == '-' ? 1 : 0;
        const size_t digits = strspn(a + n, "0123456789.,");
        if (digits == 0) {
            p += 1;
            continue;
        }
        n += digits;
        last = a;
        last_n = n;
        p = a + n; /* findall: the next match starts after this one */
    }
    if (!last)
        return 0.0;
    char ans[128];
    size_t k = 0;
    for (size_t i = 0; i < last_n && k + 1 < sizeof ans; i++)
        if (last[i] != ',')
            ans[k++] = last[i];
    ans[k] = '\0';
    return strcmp(ans, ground_truth) == 0 ? 1.0 : 0.0;
}

typedef double (*builtin_fn)(const char *solution, const char *ground_truth, char *why, size_t whylen);

static const struct {
    const char *data_source;
    const char *scorer;
    builtin_fn fn;
} routes[] = {
    {"openai/gsm8k", "gsm8k", reward_score_gsm8k},
    {"gsm8k", "gsm8k", reward_score_gsm8k},
    {"arithmetic", "arithmetic", reward_score_arithmetic},
    {"countdown", "countdown", reward_score_countdown},
    {"Jiayi-Pan/Countdown-Tasks-3to4", "countdown", reward_score_countdown},
    {"lighteval/MATH", "math", reward_score_math},
    {"DigitalLearningGmbH/MATH-lighteval", "math", reward_score_math},
    {"HuggingFaceH4/MATH-500", "math", reward_score_math},
    {"math", "math", reward_score_math},
};

static int route_of(const char *data_source)
{
    if (!data_source)
        return -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(routes[i].data_source, data_source) == 0)
            return (int)i;
    return -1;
}

const char *reward_builtin_scorer_name(const char *data_source)
{
    int r = route_of(data_source);
    return r < 0 ? NULL : routes[r].scorer;
}

/* The scorer of route r: gsm8k's and math's are verl's rules unless lenient. */
static builtin_fn route_fn(int r, bool lenient)
{
    if (!lenient && routes[r].fn == reward_score_gsm8k)
        return reward_score_gsm8k_verl;
    if (!lenient && routes[r].fn == reward_score_math)
        return reward_score_math_verl;
    return routes[r].fn;
}

double reward_builtin_score_lenient(const char *data_source, const char *solution, const char *ground_truth,
                                    const char *extra_info_json, bool lenient, char *why, size_t whylen)
{
    (void)extra_info_json;
    int r = route_of(data_source);
    if (r < 0) {
        set_why(why, whylen, "no built-in scorer for data_source '%.80s'", data_source ? data_source : "(null)");
        return 0.0;
    }
    return route_fn(r, lenient)(solution ? solution : "", ground_truth ? ground_truth : "", why, whylen);
}

double reward_builtin_score(const char *data_source, const char *solution, const char *ground_truth,
                            const char *extra_info_json, char *why, size_t whylen)
{
    return reward_builtin_score_lenient(data_source, solution, ground_truth, extra_info_json, false, why, whylen);
}

double reward_builtin_accuracy(const char *data_source, const char *solution, const char *ground_truth)
{
    return reward_builtin_accuracy_lenient(data_source, solution, ground_truth, false);
}

double reward_builtin_accuracy_lenient(const char *data_source, const char *solution, const char *ground_truth,
                                       bool lenient)
{
    int r = route_of(data_source);
    if (r < 0)
        return NAN;
    solution = solution ? solution : "";
    ground_truth = ground_truth ? ground_truth : "";
    if (routes[r].fn == reward_score_arithmetic) {
        bool correct, formatted;
        if (!reward_arithmetic_parts(solution, ground_truth, &correct, &formatted, NULL, 0))
            return 0.0;
        return correct && formatted ? 1.0 : 0.0;
    }
    /* gsm8k and math score 1 or 0 already; countdown gives 1 only for a right equation (0.1 for the form) */
    return route_fn(r, lenient)(solution, ground_truth, NULL, 0) >= 1.0 ? 1.0 : 0.0;
}
