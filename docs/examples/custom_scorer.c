/* An example custom reward scorer for grpo (docs/rewards.md).
 *
 * Build:   cc -O2 -shared -fPIC -o custom_scorer.so docs/examples/custom_scorer.c
 * Use:     grpo-worker ... custom_reward_function.path=./custom_scorer.so \
 *                          custom_reward_function.name=compute_score
 *
 * The trainer calls the function once per response, in a separate process:
 * a crash or an endless loop costs that one sample (reward 0, logged), not
 * the run. Every argument is a NUL-terminated UTF-8 string, never NULL. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

double compute_score(const char *data_source, const char *solution_str, const char *ground_truth,
                     const char *extra_info_json);

/* Reward 1 when the response's last line, trimmed, equals the ground truth
 * ignoring case; 0.2 when the ground truth appears anywhere else in the
 * response; 0 otherwise. A "yes_no" data source also accepts y/n. */
double compute_score(const char *data_source, const char *solution_str, const char *ground_truth,
                     const char *extra_info_json)
{
    (void)extra_info_json; /* "{}" when the sample has no extra_info */
    const char *last = strrchr(solution_str, '\n');
    last = last ? last + 1 : solution_str;
    while (isspace((unsigned char)*last))
        last++;
    size_t n = strlen(last);
    while (n > 0 && isspace((unsigned char)last[n - 1]))
        n--;
    size_t g = strlen(ground_truth);
    if (n == g && strncasecmp(last, ground_truth, n) == 0)
        return 1.0;
    if (strcmp(data_source, "yes_no") == 0 && n == 1 && g > 0 &&
        tolower((unsigned char)*last) == tolower((unsigned char)*ground_truth))
        return 1.0;
    if (g > 0 && strstr(solution_str, ground_truth))
        return 0.2;
    return 0.0;
}
