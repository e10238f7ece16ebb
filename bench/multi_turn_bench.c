/* Multi-turn rollout throughput with a slow tool (issue 38, item 6): the product's multi-turn generation
 * (worker/gen/multi_turn.c) against a turn environment whose every answer takes TOOL_MS of wall time, in three
 * modes on the same trajectories (same seed, same answers):
 *   none     answers at once: the cost of generation alone
 *   sync     the tool runs on the generating thread (a rollout that waits for each call)
 *   overlap  the tool runs on its own thread while generation goes on (the agent loop's design)
 * and reports tokens/s, trajectories/s, the tool time, and the share of it the overlap hides:
 *   hidden = 1 - (T_overlap - T_none) / (T_sync - T_none).
 * Also the prefill tokens per resumed turn (the cache is kept: the stop token and the answer only).
 *
 *   build/bench/multi_turn_bench MODEL_DIR [--prompts 8] [--n 4] [--turns 2] [--tool-ms 50] [--max-new 96] [--reps 3]
 *
 * The modes run in turn, rotated each repetition (none sync overlap, sync overlap none, ...), so drift in the
 * machine's load falls on all three; the summary takes each mode's median. One JSON line per run on stdout. The answer
 * appended after each turn is the Qwen/ChatML tool-response turn with "42" in it, encoded once. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "worker/gen/multi_turn.h"
#include "worker/model/model.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"

enum mode { NONE, SYNC, OVERLAP };

struct benv {
    struct turn_env base;
    enum mode mode;
    int turns, tool_ms;
    const int32_t *answer;
    int answer_n;
    int answered[4096];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct turn_reply *ready;
    int n_ready, cap;
    long long calls;
};

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

static void put(struct benv *e, struct turn_reply r)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_ready == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 64;
        e->ready = realloc(e->ready, (size_t)e->cap * sizeof *e->ready);
    }
    e->ready[e->n_ready++] = r;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

struct call {
    struct benv *e;
    struct turn_reply r;
};

static void *tool_thread(void *arg)
{
    struct call *c = arg;
    sleep_ms(c->e->tool_ms);
    put(c->e, c->r);
    free(c);
    return NULL;
}

static int b_begin(struct turn_env *te, int traj, const char *m, const char *x, const char *a)
{
    struct benv *e = (struct benv *)te;
    (void)m, (void)x, (void)a;
    e->answered[traj] = 0;
    return 0;
}

static void b_turn_end(struct turn_env *te, int traj, const int32_t *ids, int n, bool stopped, int budget)
{
    struct benv *e = (struct benv *)te;
    (void)ids, (void)n;
    struct turn_reply r = {.traj = traj, .done = true};
    if (stopped && e->answered[traj] < e->turns && budget > e->answer_n) {
        e->answered[traj]++;
        r.done = false;
        r.n = e->answer_n;
        r.ids = malloc((size_t)r.n * sizeof(int32_t));
        memcpy(r.ids, e->answer, (size_t)r.n * sizeof(int32_t));
    }
    if (r.done || e->mode == NONE) {
        put(e, r);
        return;
    }
    e->calls++;
    if (e->mode == SYNC) {
        sleep_ms(e->tool_ms);
        put(e, r);
        return;
    }
    struct call *c = malloc(sizeof *c);
    *c = (struct call){e, r};
    pthread_t t;
    pthread_create(&t, NULL, tool_thread, c);
    pthread_detach(t);
}

static int b_poll(struct turn_env *te, struct turn_reply *out, int max, bool wait)
{
    struct benv *e = (struct benv *)te;
    pthread_mutex_lock(&e->mu);
    while (wait && e->n_ready == 0)
        pthread_cond_wait(&e->cv, &e->mu);
    const int k = e->n_ready < max ? e->n_ready : max;
    if (k > 0) {
        memcpy(out, e->ready, (size_t)k * sizeof *out);
        memmove(e->ready, e->ready + k, (size_t)(e->n_ready - k) * sizeof *e->ready);
        e->n_ready -= k;
    }
    pthread_mutex_unlock(&e->mu);
    return k;
}

static void b_finish(struct turn_env *te, int traj, struct turn_summary *out)
{
    struct benv *e = (struct benv *)te;
    memset(out, 0, sizeof *out);
    out->turns = 2 * e->answered[traj] + 2;
}

static const struct turn_env_ops bench_ops = {b_begin, b_turn_end, b_poll, b_finish};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [--prompts 8] [--n 4] [--turns 2] [--tool-ms 50] [--max-new 96]\n",
                argv[0]);
        return 2;
    }
    int prompts = 8, n = 4, turns = 2, tool_ms = 50, max_new = 96, reps = 3;
    for (int i = 2; i + 1 < argc; i += 2) {
        const int v = (int)strtol(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--prompts"))
            prompts = v;
        else if (!strcmp(argv[i], "--n"))
            n = v;
        else if (!strcmp(argv[i], "--turns"))
            turns = v;
        else if (!strcmp(argv[i], "--tool-ms"))
            tool_ms = v;
        else if (!strcmp(argv[i], "--max-new"))
            max_new = v;
        else if (!strcmp(argv[i], "--reps"))
            reps = v > 0 && v <= 15 ? v : 3;
    }
    char err[1024], path[1024];
    struct model *m = model_load(argv[1], err, sizeof err);
    snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
    struct tokenizer *tok = m ? tokenizer_from_json(path, err, sizeof err) : NULL;
    if (!m || !tok) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const char *qs[] = {"Name three colours.", "Say hello to a friend.", "What is a cat?", "Count to five.",
                        "Give me a fruit.",    "Describe the sea.",      "What is rain?",  "Name a city."};
    int32_t **pids = calloc((size_t)prompts, sizeof *pids);
    int *plen = calloc((size_t)prompts, sizeof *plen);
    for (int p = 0; p < prompts; p++) {
        char text[256];
        snprintf(text, sizeof text, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", qs[p % 8]);
        size_t k;
        pids[p] = tokenizer_encode(tok, text, strlen(text), 0, &k);
        plen[p] = (int)k;
    }
    const char *ans = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    size_t an;
    int32_t *answer = tokenizer_encode(tok, ans, strlen(ans), 0, &an);
    int32_t stops[2] = {tokenizer_token_id(tok, "<|im_end|>"), tokenizer_eos_id(tok)};
    struct gen_params gp = {.sampling = {1.0f, 1.0f, 0},
                            .max_new_tokens = max_new,
                            .n_samples = n,
                            .max_batch = prompts * n,
                            .stop_ids = stops,
                            .n_stop = stops[1] >= 0 && stops[1] != stops[0] ? 2 : 1,
                            .seed = 1234};
    const int total = prompts * n;
    struct gen_output *out = calloc((size_t)total, sizeof *out);
    struct turn_summary *sums = calloc((size_t)total, sizeof *sums);
    const char *names[] = {"none", "sync", "overlap"};
    double walls[3][15] = {{0}};
    for (int run = 0; run < 3 * reps; run++) {
        const int mode = (run + run / 3) % 3;
        struct benv e = {.base.ops = &bench_ops,
                         .mode = (enum mode)mode,
                         .turns = turns,
                         .tool_ms = tool_ms,
                         .answer = answer,
                         .answer_n = (int)an};
        pthread_mutex_init(&e.mu, NULL);
        pthread_cond_init(&e.cv, NULL);
        struct multi_turn_stats st = {0};
        const double t0 = bench_now();
        gen_generate_multi_turn(m, &e.base, (const int32_t *const *)pids, plen, NULL, NULL, NULL, prompts, &gp, out,
                                sums, &st);
        const double w = bench_now() - t0;
        walls[mode][run / 3] = w;
        long long model_tokens = 0, tokens = 0;
        for (int i = 0; i < total; i++) {
            for (int t = 0; t < out[i].len; t++)
                model_tokens += out[i].mask[t];
            tokens += out[i].len;
            model_gen_output_free(&out[i]);
        }
        printf("{\"mode\":\"%s\",\"tool_ms\":%d,\"trajectories\":%d,\"tool_calls\":%lld,\"wall_s\":%.3f,"
               "\"model_tokens_per_s\":%.1f,\"trajectories_per_s\":%.2f,\"response_tokens\":%lld,"
               "\"prefill_tokens_per_resumed_turn\":%.2f,\"resumed_turns\":%lld,\"evictions\":%lld,"
               "\"env_wait_s\":%.3f}\n",
               names[mode], tool_ms, total, e.calls, w, (double)model_tokens / w, (double)total / w, tokens,
               st.resumed_turns ? (double)st.resume_tokens / (double)st.resumed_turns : 0.0, st.resumed_turns,
               st.evictions, st.env_wait_s);
        fflush(stdout);
        free(e.ready);
    }
    double wall[3];
    for (int mode = 0; mode < 3; mode++) { /* the median */
        double *v = walls[mode];
        for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                const double t = v[j];
                v[j] = v[j - 1], v[j - 1] = t;
            }
        wall[mode] = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
    }
    const double sync_extra = wall[SYNC] - wall[NONE], overlap_extra = wall[OVERLAP] - wall[NONE];
    printf("{\"summary\":\"tool time hidden by overlap (medians of %d)\",\"none_s\":%.3f,\"sync_s\":%.3f,"
           "\"overlap_s\":%.3f,\"sync_extra_s\":%.3f,\"overlap_extra_s\":%.3f,\"hidden\":%.3f}\n",
           reps, wall[NONE], wall[SYNC], wall[OVERLAP], sync_extra, overlap_extra,
           sync_extra > 0 ? 1.0 - overlap_extra / sync_extra : 0.0);
    for (int p = 0; p < prompts; p++)
        free(pids[p]);
    free(pids), free(plen), free(out), free(sums), free(answer);
    tokenizer_free(tok);
    model_free(m);
    return 0;
}
