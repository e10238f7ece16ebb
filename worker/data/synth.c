/* Built-in synthetic tasks: arithmetic questions and countdown puzzles,
 * generated from a seed with integer-only arithmetic and our own PRNG, so the
 * same seed gives the same prompts on every machine. Validation samples come
 * from their own stream and are kept out of the training set. */
#include "dataset.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

/* most numbers in a generated countdown task */
#define COUNTDOWN_GEN_MAX 8

/* streams of a seed */
enum { STREAM_TRAIN = 0x7472, STREAM_VAL = 0x76616c };

const char *synth_task_name(enum synth_task task)
{
    return task == SYNTH_COUNTDOWN ? "countdown" : task == SYNTH_TOOL_ARITHMETIC ? "tool_arithmetic" : "arithmetic";
}

int synth_task_from_name(const char *name)
{
    if (name && strcmp(name, "arithmetic") == 0)
        return SYNTH_ARITHMETIC;
    if (name && strcmp(name, "countdown") == 0)
        return SYNTH_COUNTDOWN;
    if (name && strcmp(name, "tool_arithmetic") == 0)
        return SYNTH_TOOL_ARITHMETIC;
    return -1;
}

void synth_default_opts(enum synth_task task, struct synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->task = task;
    o->min_digits = 1;
    o->max_digits = 2;
    o->num_operands = 2;
    snprintf(o->ops, sizeof o->ops, "+-");
    o->allow_negative = false;
    o->min_numbers = 3;
    o->max_numbers = 4;
    o->max_number = 99;
    o->max_target = 100;
}

char *synth_arithmetic_prompt(const char *expression)
{
    char buf[512];
    /* The wording of the embedded demo: the bundled 135M model rarely follows it at first (about 8% reward
     * greedy), which leaves GRPO room to show in a few steps; "Answer with just the number, written after
     * ####, like this: #### <number>" is followed more often (about 30%) and improves less visibly. */
    snprintf(buf, sizeof buf, "What is %s? Reply with only the final number after ####.", expression);
    return xstrdup(buf);
}

char *synth_countdown_prompt(const int64_t *numbers, int n, int64_t target)
{
    char list[256];
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", i ? ", " : "", (long long)numbers[i]);
    char buf[1024];
    snprintf(buf, sizeof buf,
             "Using the numbers [%s], write an equation that equals %lld. You may use +, -, *, / and "
             "parentheses, and must use each number exactly once. Think it through, then give only the "
             "equation inside <answer> </answer> tags, for example <answer>(1 + 2) * 3</answer>.",
             list, (long long)target);
    return xstrdup(buf);
}

/* ---- a set of 64-bit keys (FNV-1a of the prompt) ---- */

struct keyset {
    uint64_t *slot; /* 0 = empty; keys are never 0 (see key_of) */
    size_t cap;
};

static uint64_t key_of(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h ? h : 1;
}

static void keyset_init(struct keyset *k, size_t expected)
{
    k->cap = 16;
    while (k->cap < 2 * expected + 16)
        k->cap *= 2;
    k->slot = xcalloc(k->cap, sizeof *k->slot);
}

static bool keyset_has(const struct keyset *k, uint64_t key)
{
    for (size_t i = key & (k->cap - 1);; i = (i + 1) & (k->cap - 1)) {
        if (k->slot[i] == key)
            return true;
        if (k->slot[i] == 0)
            return false;
    }
}

static void keyset_add(struct keyset *k, uint64_t key)
{
    size_t i = key & (k->cap - 1);
    while (k->slot[i] != 0 && k->slot[i] != key)
        i = (i + 1) & (k->cap - 1);
    k->slot[i] = key;
}

/* ---- one problem ---- */

struct problem {
    char prompt[1024];
    char ground_truth[256];
    char solution[256]; /* countdown: an equation that reaches the target */
};

static int64_t draw_range(struct data_rng *g, int64_t lo, int64_t hi)
{
    return lo + (int64_t)data_rng_below(g, (uint64_t)(hi - lo + 1));
}

static int64_t pow10i(int d)
{
    int64_t p = 1;
    while (d-- > 0)
        p *= 10;
    return p;
}

/* An arithmetic question; false when this draw must be redrawn (negative, overflow). */
static bool make_arithmetic(const struct synth_opts *o, struct data_rng *g, struct problem *p)
{
    int64_t v[8] = {0};
    char op[8] = {0};
    int k = o->num_operands;
    size_t nops = strlen(o->ops);
    for (int i = 0; i < k; i++) {
        int d = (int)draw_range(g, o->min_digits, o->max_digits);
        v[i] = draw_range(g, d == 1 ? 1 : pow10i(d - 1), pow10i(d) - 1);
        if (i > 0)
            op[i - 1] = o->ops[data_rng_below(g, nops)];
    }
    char expr[256];
    size_t e = 0;
    e += (size_t)snprintf(expr, sizeof expr, "%lld", (long long)v[0]);
    for (int i = 1; i < k; i++)
        e += (size_t)snprintf(expr + e, sizeof expr - e, " %c %lld", op[i - 1], (long long)v[i]);
    /* value with the usual precedence: products first, then sums left to right */
    int64_t terms[8];
    char sign[8];
    int nt = 0;
    terms[0] = v[0];
    sign[0] = '+';
    nt = 1;
    for (int i = 1; i < k; i++) {
        if (op[i - 1] == '*') {
            if (__builtin_mul_overflow(terms[nt - 1], v[i], &terms[nt - 1]))
                return false;
        } else {
            sign[nt] = op[i - 1];
            terms[nt++] = v[i];
        }
    }
    int64_t r = 0;
    for (int i = 0; i < nt; i++) {
        bool ovf = sign[i] == '+' ? __builtin_add_overflow(r, terms[i], &r) : __builtin_sub_overflow(r, terms[i], &r);
        if (ovf)
            return false;
    }
    if (r < 0 && !o->allow_negative)
        return false;
    if (o->task == SYNTH_TOOL_ARITHMETIC) { /* the question alone: the system message and the example say the rest */
        snprintf(p->prompt, sizeof p->prompt, "What is %s?", expr);
    } else {
        char *prompt = synth_arithmetic_prompt(expr);
        snprintf(p->prompt, sizeof p->prompt, "%s", prompt);
        free(prompt);
    }
    snprintf(p->ground_truth, sizeof p->ground_truth, "%lld", (long long)r);
    p->solution[0] = '\0';
    return true;
}

/* A countdown task built backwards from a random equation over the drawn numbers. */
static bool make_countdown(const struct synth_opts *o, struct data_rng *g, struct problem *p)
{
    int n = (int)draw_range(g, o->min_numbers, o->max_numbers);
    int64_t nums[COUNTDOWN_GEN_MAX];
    for (int i = 0; i < n; i++)
        nums[i] = draw_range(g, 1, o->max_number);
    for (int attempt = 0; attempt < 64; attempt++) {
        int64_t val[COUNTDOWN_GEN_MAX];
        char text[COUNTDOWN_GEN_MAX][256];
        int m = n;
        for (int i = 0; i < n; i++) {
            val[i] = nums[i];
            snprintf(text[i], sizeof text[i], "%lld", (long long)nums[i]);
        }
        while (m > 1) {
            int i = (int)data_rng_below(g, (uint64_t)m);
            int j = (int)data_rng_below(g, (uint64_t)(m - 1));
            if (j >= i)
                j++;
            int64_t a = val[i], b = val[j];
            const char *ta = text[i], *tb = text[j];
            char opc = "+-*/"[data_rng_below(g, 4)];
            if (opc == '-' && a < b) { /* keep intermediate values non-negative */
                int64_t t = a;
                a = b;
                b = t;
                const char *tt = ta;
                ta = tb;
                tb = tt;
            }
            if (opc == '/' && (b == 0 || a % b != 0)) {
                if (a != 0 && b % a == 0) {
                    int64_t t = a;
                    a = b;
                    b = t;
                    const char *tt = ta;
                    ta = tb;
                    tb = tt;
                } else {
                    opc = '+';
                }
            }
            int64_t r;
            bool ovf = false;
            if (opc == '*')
                ovf = __builtin_mul_overflow(a, b, &r);
            else if (opc == '+')
                ovf = __builtin_add_overflow(a, b, &r);
            else
                r = opc == '-' ? a - b : a / b;
            if (ovf)
                break;
            char joined[256];
            snprintf(joined, sizeof joined, "(%.120s %c %.120s)", ta, opc, tb);
            int lo = i < j ? i : j, hi = i < j ? j : i;
            val[lo] = r;
            snprintf(text[lo], sizeof text[lo], "%s", joined);
            val[hi] = val[m - 1];
            memcpy(text[hi], text[m - 1], sizeof text[hi]);
            m--;
        }
        if (m == 1 && val[0] >= 1 && val[0] <= o->max_target) {
            size_t L = strlen(text[0]);
            if (L >= 2 && text[0][0] == '(') /* drop the outermost parentheses */
                snprintf(p->solution, sizeof p->solution, "%.*s", (int)(L - 2), text[0] + 1);
            else
                snprintf(p->solution, sizeof p->solution, "%s", text[0]);
            char *prompt = synth_countdown_prompt(nums, n, val[0]);
            snprintf(p->prompt, sizeof p->prompt, "%s", prompt);
            free(prompt);
            size_t k = (size_t)snprintf(p->ground_truth, sizeof p->ground_truth, "{\"target\": %lld, \"numbers\": [",
                                        (long long)val[0]);
            for (int i = 0; i < n; i++)
                k += (size_t)snprintf(p->ground_truth + k, sizeof p->ground_truth - k, "%s%lld", i ? ", " : "",
                                      (long long)nums[i]);
            snprintf(p->ground_truth + k, sizeof p->ground_truth - k, "]}");
            return true;
        }
    }
    return false;
}

/* The tool task's conversation before its question: what the calculator is for, and two worked examples (with one,
 * the bundled 135M model calls the tool in about a third of its answers and mostly malformed; with two, in nearly
 * all, and GRPO then has correct and wrong calls to tell apart) */
static const char *const TOOL_SHOT[][2] = {
    {"system", "Use the calculator for arithmetic. Answer with #### and the number."},
    {"user", "What is 4821 * 7390?"},
    {"assistant", "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"4821 * 7390\"}}\n"
                  "</tool_call>"},
    {"tool", "35627190"},
    {"assistant", "#### 35627190"},
    {"user", "What is 65123 * 20917?"},
    {"assistant", "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"65123 * 20917\"}}\n"
                  "</tool_call>"},
    {"tool", "1362177791"},
    {"assistant", "#### 1362177791"},
};

/* The arithmetic task's worked examples (data.synthetic.shots): a question in the task's wording and an answer that
 * writes the calculation, then `#### N`. Without them the bundled 135M model's first answers are mostly prose or a
 * bare (often wrong) `#### N`, and which of those GRPO reinforces first decides a run (docs/results/performance.md,
 * "A demo that learns on every CPU"). */
static const char *const ARITH_SHOT[SYNTH_MAX_SHOTS][2] = {
    {"27 + 58", "27 + 58 = 85\n#### 85"},
    {"93 - 46", "93 - 46 = 47\n#### 47"},
};

static void emit(struct dataset *d, const struct synth_opts *o, const struct problem *p, const char *split, int index)
{
    struct prompt_sample *s = &d->samples[d->n++];
    memset(s, 0, sizeof *s);
    const bool tool = o->task == SYNTH_TOOL_ARITHMETIC;
    s->data_source = xstrdup(tool ? "arithmetic" : synth_task_name(o->task)); /* the tool task is scored as one */
    s->ground_truth = xstrdup(p->ground_truth);
    const int arith_shots = o->task == SYNTH_ARITHMETIC ? o->shots : 0;
    const int shot = tool ? (int)(sizeof TOOL_SHOT / sizeof TOOL_SHOT[0]) : 2 * arith_shots;
    s->n_messages = shot + 1;
    s->messages = xcalloc((size_t)s->n_messages, sizeof *s->messages);
    for (int k = 0; k < shot && tool; k++) {
        s->messages[k].role = xstrdup(TOOL_SHOT[k][0]);
        s->messages[k].content = xstrdup(TOOL_SHOT[k][1]);
    }
    for (int k = 0; k < arith_shots; k++) {
        s->messages[2 * k].role = xstrdup("user");
        s->messages[2 * k].content = synth_arithmetic_prompt(ARITH_SHOT[k][0]);
        s->messages[2 * k + 1].role = xstrdup("assistant");
        s->messages[2 * k + 1].content = xstrdup(ARITH_SHOT[k][1]);
    }
    s->messages[shot].role = xstrdup("user");
    s->messages[shot].content = xstrdup(p->prompt);
    if (tool)
        s->agent_name = xstrdup("tool_agent");
    char extra[512];
    if (p->solution[0])
        snprintf(extra, sizeof extra, "{\"split\":\"%s\",\"index\":%d,\"solution\":\"%s\"}", split, index, p->solution);
    else
        snprintf(extra, sizeof extra, "{\"split\":\"%s\",\"index\":%d}", split, index);
    s->extra_info_json = xstrdup(extra);
}

static int check_opts(const struct synth_opts *o, char *err, size_t errlen)
{
    if (o->task == SYNTH_ARITHMETIC || o->task == SYNTH_TOOL_ARITHMETIC) {
        if (o->min_digits < 1 || o->max_digits < o->min_digits || o->max_digits > 9) {
            snprintf(err, errlen, "synthetic arithmetic: digits must satisfy 1 <= min <= max <= 9 (got %d..%d)",
                     o->min_digits, o->max_digits);
            return -1;
        }
        if (o->num_operands < 2 || o->num_operands > 8) {
            snprintf(err, errlen, "synthetic arithmetic: num_operands must be 2..8 (got %d)", o->num_operands);
            return -1;
        }
        if (o->shots < 0 || o->shots > SYNTH_MAX_SHOTS) {
            snprintf(err, errlen, "synthetic arithmetic: shots must be 0..%d (got %d)", SYNTH_MAX_SHOTS, o->shots);
            return -1;
        }
        if (!o->ops[0] || strspn(o->ops, "+-*") != strlen(o->ops)) {
            snprintf(err, errlen, "synthetic arithmetic: ops must be a non-empty subset of \"+-*\" (got \"%s\")",
                     o->ops);
            return -1;
        }
    } else if (o->task == SYNTH_COUNTDOWN) {
        if (o->min_numbers < 2 || o->max_numbers < o->min_numbers || o->max_numbers > COUNTDOWN_GEN_MAX) {
            snprintf(err, errlen, "synthetic countdown: numbers per task must satisfy 2 <= min <= max <= %d",
                     COUNTDOWN_GEN_MAX);
            return -1;
        }
        if (o->max_number < 1 || o->max_number > 9999 || o->max_target < 1) {
            snprintf(err, errlen, "synthetic countdown: need 1 <= max_number <= 9999 and max_target >= 1");
            return -1;
        }
    } else {
        snprintf(err, errlen, "synthetic task %d is unknown", (int)o->task);
        return -1;
    }
    return 0;
}

/* Fill d with n problems of one stream. unique: no two alike; avoid: keys to skip (may be NULL);
 * seen receives every emitted key when not NULL. */
static int generate_split(const struct synth_opts *o, uint64_t seed, uint64_t stream, int n, const char *split,
                          bool unique, const struct keyset *avoid, struct keyset *seen, struct dataset *d, char *err,
                          size_t errlen)
{
    struct data_rng g;
    data_rng_seed(&g, seed, stream);
    d->n = 0;
    d->samples = n ? xcalloc((size_t)n, sizeof *d->samples) : NULL;
    long long budget = 1000LL * n + 100000;
    struct problem p;
    while (d->n < n) {
        if (budget-- <= 0) {
            snprintf(err, errlen,
                     "synthetic %s: only %d distinct %s prompts found for %d requested; raise the difficulty "
                     "or lower the count",
                     synth_task_name(o->task), d->n, split, n);
            return -1;
        }
        bool ok = o->task == SYNTH_COUNTDOWN ? make_countdown(o, &g, &p) : make_arithmetic(o, &g, &p);
        if (!ok)
            continue;
        uint64_t key = key_of(p.prompt);
        if ((avoid && keyset_has(avoid, key)) || (unique && seen && keyset_has(seen, key)))
            continue;
        if (seen)
            keyset_add(seen, key);
        emit(d, o, &p, split, d->n);
    }
    return 0;
}

int synth_generate(const struct synth_opts *o, uint64_t seed, int num_train, int num_val, struct dataset *train,
                   struct dataset *val, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen) < 0)
        return -1;
    if (num_train < 0 || num_val < 0 || (num_train > 0 && !train) || (num_val > 0 && !val)) {
        snprintf(err, errlen, "synthetic %s: bad sample counts", synth_task_name(o->task));
        return -1;
    }
    /* validation first: its prompts are then kept out of the training set */
    struct keyset vkeys;
    keyset_init(&vkeys, (size_t)num_val);
    int rc = 0;
    struct dataset v = {0}, t = {0};
    if (num_val > 0)
        rc = generate_split(o, seed, STREAM_VAL, num_val, "val", true, NULL, &vkeys, &v, err, errlen);
    if (rc == 0 && num_train > 0)
        rc = generate_split(o, seed, STREAM_TRAIN, num_train, "train", false, &vkeys, NULL, &t, err, errlen);
    free(vkeys.slot);
    if (rc < 0) {
        dataset_free(&v);
        dataset_free(&t);
        return -1;
    }
    if (val)
        *val = v;
    if (train)
        *train = t;
    return 0;
}
