/* Built-in rule scorers and the answer-parsing pieces they share. Pure
 * functions of their arguments, bounded in time and memory by the length of
 * the text (reward.h runs them; tests and the data module call them directly).
 *
 * Which data_source selects which scorer, the accepted answer forms and the
 * score values are documented in docs/rewards.md. */
#ifndef GRPO_WORKER_REWARD_SCORERS_H
#define GRPO_WORKER_REWARD_SCORERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Weight of the format part of the arithmetic and countdown scores:
 * score = (1 - W) * correct + W * well_formatted, so a correct answer in the
 * required form is 1.0, a correct one in another form 0.9, a wrong one in the
 * required form 0.1 and anything else 0. */
#define REWARD_FORMAT_WEIGHT 0.1

/* ---- numbers ---- */

/* Longest canonical number text (digits, sign, point) that is compared exactly. */
#define REWARD_NUM_MAX 160

/* A number as written in an answer: "1,234", "-$5", "12.0", "12.", "3/4", ".5". */
struct reward_number {
    bool is_fraction;           /* written as a/b (or \frac{a}{b}) */
    double value;               /* its value (fractions are compared through it) */
    char canon[REWARD_NUM_MAX]; /* decimal without grouping, leading/trailing zeros or "-0": "-1234.5" */
};

/* Parse a whole string as one number, after trimming whitespace, a trailing
 * '.', LaTeX $...$ / \( \) wrappers, "\$", "{,}" / "\," / "\!" and \frac{a}{b}
 * (also \dfrac, \tfrac). False when anything else is left or the number has
 * more digits than REWARD_NUM_MAX allows. */
bool reward_parse_number(const char *s, size_t len, struct reward_number *out);
/* Equal numbers: exact decimal comparison ("12.0" == "12", "1,234" == "1234"),
 * and for fractions a relative tolerance of 1e-9 ("3/4" == "0.75"). */
bool reward_numbers_equal(const struct reward_number *a, const struct reward_number *b);
/* An answer span against a ground truth text: numerically when both are
 * numbers, otherwise as text with whitespace, $, \left, \right, \!, \, and a
 * trailing '.' removed. */
bool reward_answer_matches(const char *answer, size_t len, const char *ground_truth);

/* ---- answer extraction: each finds the LAST occurrence; the span points into text ---- */

/* "#### N" (GSM8K): "####", optional spaces/tabs, then a number (optional sign, '$', commas). */
bool reward_find_hash_answer(const char *text, const char **ans, size_t *len);
/* Content of the last \boxed{...} (nested braces balanced) or \fbox{...}, or of "\boxed N".
 * False when there is none or the last one is unterminated. */
bool reward_find_boxed(const char *text, const char **ans, size_t *len);
/* "answer: N", "answer is N", "answer is: N", "answer = N" (any case, markdown ** allowed). */
bool reward_find_answer_is(const char *text, const char **ans, size_t *len);
/* The last number anywhere in the text. */
bool reward_find_last_number(const char *text, const char **ans, size_t *len);

/* ---- countdown ---- */

#define COUNTDOWN_MAX_EXPR 256   /* longest equation inside <answer> tags (bytes) */
#define COUNTDOWN_MAX_DEPTH 32   /* deepest parenthesis nesting */
#define COUNTDOWN_MAX_NUMBERS 16 /* most numbers in a task / literals in an equation */

/* Evaluate an equation of non-negative integer literals (at most 9 digits),
 * binary + - * /, parentheses and whitespace, exactly (rationals in 64-bit
 * integers). No unary operators, no other characters. On success returns 0,
 * the value num/den (den > 0, reduced) and the literals in order. On failure
 * returns -1 with err ("unexpected character 'e' at column 2", "division by
 * zero", "overflow", "nested too deeply", ...). */
int countdown_eval(const char *expr, size_t len, int64_t *num, int64_t *den, int64_t *literals, int *n_literals,
                   char *err, size_t errlen);

/* Parse a countdown ground truth: JSON {"target": 24, "numbers": [3, 4, 6, 1]}
 * ("nums" is accepted for "numbers"). 0, or -1 with err. */
int countdown_parse_ground_truth(const char *gt, int64_t *target, int64_t *numbers, int *n_numbers, char *err,
                                 size_t errlen);

/* ---- scorers: score of one response; why receives a reason only when the
 * sample cannot be scored (malformed ground truth), else "" ---- */

/* gsm8k, lenient (reward_model.lenient_scorers): the last "#### N" (spaces, '$', commas and a trailing ".00"
 * allowed) equals the ground truth as a number: 1, else 0. */
double reward_score_gsm8k(const char *solution, const char *ground_truth, char *why, size_t whylen);
/* gsm8k, verl's rule (verl/utils/reward_score/gsm8k.py, strict, the default): in the last 300 characters, the
 * last match of "#### " followed by an optional '-' and digits, '.' and ','; its commas dropped, it must equal the
 * ground truth as text: 1, else 0. */
double reward_score_gsm8k_verl(const char *solution, const char *ground_truth, char *why, size_t whylen);
/* math, verl's rule (verl/utils/reward_score/math_reward.py, the default; math_verl.c): the last \boxed answer
 * and the ground truth equal after verl's strip_string: 1, else 0. */
double reward_score_math_verl(const char *solution, const char *ground_truth, char *why, size_t whylen);
/* arithmetic (lenient): the answer is the last "#### N", else the last \boxed{N}, else the last
 * "answer is N", else the last number; score 0.9 * correct + 0.1 * (a "#### N" form was used). */
double reward_score_arithmetic(const char *solution, const char *ground_truth, char *why, size_t whylen);
/* math: the last \boxed{...} matches the ground truth (numerically or as normalised text): 1, else 0. */
double reward_score_math(const char *solution, const char *ground_truth, char *why, size_t whylen);
/* countdown (TinyZero): the last <answer>EQUATION</answer> uses each given number exactly once and
 * equals the target: 1.0; an <answer> that is wrong or invalid: 0.1; no <answer>: 0. */
double reward_score_countdown(const char *solution, const char *ground_truth, char *why, size_t whylen);

/* The two parts of the arithmetic score: correct (the extracted answer, found as above, equals the ground
 * truth) and formatted (a "#### N" form was used). False, with both false and why set, when the ground truth
 * is malformed. */
bool reward_arithmetic_parts(const char *solution, const char *ground_truth, bool *correct, bool *formatted, char *why,
                             size_t whylen);

/* Exact-answer accuracy, apart from any format credit: 1 when the final answer is the right one, else 0 (verl's
 * "acc"). arithmetic and gsm8k: the last "#### N" equals the ground truth (a right number in another form is
 * 0, whatever partial score it earns); math: the last \boxed{} matches; countdown: a valid equation reaching
 * the target. NaN when no built-in scorer serves data_source. */
double reward_builtin_accuracy(const char *data_source, const char *solution, const char *ground_truth);
/* The same two with gsm8k's lenient forms (reward_model.lenient_scorers=true); the plain ones use verl's rule. */
double reward_builtin_accuracy_lenient(const char *data_source, const char *solution, const char *ground_truth,
                                       bool lenient);
double reward_builtin_score_lenient(const char *data_source, const char *solution, const char *ground_truth,
                                    const char *extra_info_json, bool lenient, char *why, size_t whylen);

/* Name of the built-in scorer serving data_source ("gsm8k", "arithmetic", "math", "countdown"), or NULL. */
const char *reward_builtin_scorer_name(const char *data_source);
/* Score with the built-in scorer of data_source; an unknown data_source scores 0 with a reason in why. */
double reward_builtin_score(const char *data_source, const char *solution, const char *ground_truth,
                            const char *extra_info_json, char *why, size_t whylen);

#endif
