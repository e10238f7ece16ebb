#include "agent_loop.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/agent/interaction.h"
#include "worker/agent/tool.h"
#include "worker/agent/tool_parser.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

enum sanity_mode { SANITY_STRICT, SANITY_IGNORE_STRIPPABLE, SANITY_DISABLE };

/* One trajectory's conversation. Its fields are touched by one thread at a time: the generating thread in begin
 * and finish, a worker while its turn is out (generation hands it over and waits for the answer). */
struct atraj {
    bool tool_agent;
    json_t *prompt;    /* the prompt's messages */
    json_t *msgs;      /* what the template renders: the prompt, then {role, content} per turn */
    json_t *audit;     /* the same with the parsed tool calls and each answer's tool name and error flag */
    json_t *extra;     /* the sample's extra_info (an object), or NULL */
    json_t *instances; /* {tool name: instance id} of the tools this trajectory created */
    const struct interaction *interaction; /* its simulated user, or NULL */
    char iid[48];                          /* its interaction's instance id (a Python interaction's state) */
    json_t *turn_scores;                   /* the interaction's score of each answer (verl's turn_scores) */
    json_t *tool_rewards;                  /* each tool call's step reward (verl's tool_rewards) */
    int assistant_turns, user_turns, tool_calls, tool_errors, template_errors;
    bool cut; /* its last model turn ran out of the response budget (no stop token: the template closes it) */
    double tool_s;
    int32_t *resp; /* every response token so far (the model's and the answers') */
    int resp_n, resp_cap;
};

struct job {
    struct job *next;
    int traj;
    int32_t *ids;
    int n, budget;
    bool stopped;
};

struct agent_env {
    struct turn_env base;
    const struct grpo_config *cfg;
    const struct tokenizer *tok;
    struct tool_set tools;
    struct interaction_set interactions;
    char *tools_json;
    enum tool_format format;
    enum sanity_mode sanity;
    bool default_tool_agent;
    pthread_mutex_t mu;
    pthread_cond_t job_cv, reply_cv;
    struct job *jobs, **jobs_tail;
    struct turn_reply *replies;
    int n_replies, cap_replies;
    struct atraj **trajs; /* by trajectory id; the array is guarded by mu */
    int n_trajs;
    pthread_t *threads;
    int n_threads;
    bool stopping;
};

static atomic_ullong instance_counter;

/* A tool's or interaction's instance id, unique within the process and across processes: "PID-N". */
static void instance_id(char *id, size_t len)
{
    snprintf(id, len, "%ld-%llu", (long)getpid(), (unsigned long long)atomic_fetch_add(&instance_counter, 1));
}

/* ------------------------------------------------------------------ tools */

static int load_tools(const struct grpo_config *c, struct tool_set *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    const char *yaml = c->rollout_multi_turn_tool_config_path, *py = c->rollout_multi_turn_function_tool_path;
    int rc = yaml && *yaml ? tool_set_load_yaml(s, yaml, err, errlen) : 0;
    if (rc == 0 && py && *py)
        rc = tool_set_load_function_tools(s, py, err, errlen);
    if (rc == 0 && (!yaml || !*yaml) && (!py || !*py))
        rc = tool_set_builtins(s, err, errlen);
    if (rc != 0) {
        tool_set_free(s);
        return -1;
    }
    const int side = tool_truncate_side_from_name(c->rollout_multi_turn_tool_response_truncate_side);
    for (size_t i = 0; i < s->n; i++) { /* verl's agent loop cuts every answer by the multi_turn keys */
        s->tools[i]->max_response_length = (size_t)c->rollout_multi_turn_max_tool_response_length;
        s->tools[i]->truncate_side = side < 0 ? TOOL_TRUNCATE_MIDDLE : (enum tool_truncate_side)side;
    }
    return 0;
}

static char *schemas_json(const struct tool_set *s)
{
    json_t *a = json_array();
    for (size_t i = 0; i < s->n; i++)
        json_array_append(a, s->tools[i]->schema);
    char *text = CHECK_ALLOC(json_dumps(a, JSON_COMPACT));
    json_decref(a);
    return text;
}

static char *agent_tools_json(const struct grpo_config *c, char *err, size_t errlen)
{
    struct tool_set s;
    if (load_tools(c, &s, err, errlen) != 0)
        return NULL;
    char *text = schemas_json(&s);
    tool_set_free(&s);
    return text;
}

/* -------------------------------------------------------------- rendering */

static char *render(const struct agent_env *e, const json_t *msgs, bool gen_prompt, char *err, size_t errlen)
{
    char *m = CHECK_ALLOC(json_dumps(msgs, JSON_COMPACT));
    char *text = tokenizer_render_chat(e->tok, m, e->tools_json, gen_prompt, NULL, err, errlen);
    free(m);
    return text;
}

static bool all_space(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\n' && *s != '\t' && *s != '\r')
            return false;
    return true;
}

/* The text that follows the conversation msgs once the answers are added: B less A, where A renders msgs and B
 * msgs + answers with the generation prompt, preceded by what A puts after the model's stop token (ChatML's "\n"
 * after <|im_end|>), which the model did not generate. NULL with err when B does not continue A. */
static char *answer_text(const struct agent_env *e, json_t *msgs, json_t *answers, const char *stop_text, char *err,
                         size_t errlen)
{
    char *a = render(e, msgs, false, err, errlen);
    if (!a)
        return NULL;
    json_t *all = json_copy(msgs);
    json_array_extend(all, answers);
    char *b = render(e, all, true, err, errlen);
    json_decref(all);
    if (!b) {
        free(a);
        return NULL;
    }
    const size_t la = strlen(a);
    if (strncmp(a, b, la) != 0) {
        free(a), free(b);
        error_set(err, errlen,
                  "the chat template renders the conversation differently once the tool answers are "
                  "added (its text without them is not the start of its text with them)");
        return NULL;
    }
    const char *tail = "";
    if (stop_text && *stop_text) {
        const char *at = NULL;
        for (const char *p = strstr(a, stop_text); p; p = strstr(p + 1, stop_text))
            at = p;
        if (at && all_space(at + strlen(stop_text)))
            tail = at + strlen(stop_text);
    }
    const size_t lt = strlen(tail), lb = strlen(b + la);
    char *out = xmalloc(lt + lb + 1);
    memcpy(out, tail, lt);
    memcpy(out + lt, b + la, lb + 1);
    free(a), free(b);
    return out;
}

/* ------------------------------------------------------------------ turns */

static const char *instance_of(struct atraj *a, struct tool *t)
{
    json_t *have = json_object_get(a->instances, t->name);
    if (have)
        return json_string_value(have);
    char id[64];
    instance_id(id, sizeof id);
    json_t *kw = NULL; /* extra_info.tools_kwargs.NAME.create_kwargs (verl's) */
    json_t *tk = a->extra ? json_object_get(a->extra, "tools_kwargs") : NULL;
    if (json_is_object(tk) && json_is_object(json_object_get(tk, t->name)))
        kw = json_object_get(json_object_get(tk, t->name), "create_kwargs");
    char err[512];
    if (tool_create(t, id, json_is_object(kw) ? kw : NULL, err, sizeof err) != 0) {
        log_warn_every("agent", "tool %s: create failed: %s (its calls in this trajectory answer an error)", t->name,
                       err);
        return NULL;
    }
    json_object_set_new(a->instances, t->name, json_string(id));
    return json_string_value(json_object_get(a->instances, t->name));
}

/* Run one call; its answer text (malloc'd) and *is_error. */
static char *run_call(struct agent_env *e, struct atraj *a, const struct parsed_call *pc, int *is_error)
{
    *is_error = 1;
    if (pc->error)
        return xstrdup(pc->error);
    struct tool *t = tool_set_find(&e->tools, pc->name);
    if (!t) {
        char *names = tool_set_names(&e->tools);
        char m[768];
        snprintf(m, sizeof m, "Error: there is no tool '%s' (the tools are: %s)", pc->name, names);
        free(names);
        return xstrdup(m);
    }
    const char *id = instance_of(a, t);
    if (!id)
        return xstrdup("Error: the tool could not be started");
    double reward = 0;
    *is_error = 0;
    char *out = tool_call_in(t, id, pc->arguments, &reward, is_error);
    json_array_append_new(a->tool_rewards, json_real(isfinite(reward) ? reward : 0));
    return out;
}

static json_t *call_json(const struct parsed_call *pc)
{
    json_t *o = json_object();
    if (pc->name)
        json_object_set_new(o, "name", json_string(pc->name));
    json_t *args = pc->arguments ? json_loads(pc->arguments, 0, NULL) : NULL;
    if (args)
        json_object_set_new(o, "arguments", args);
    if (pc->error)
        json_object_set_new(o, "error", json_string(pc->error));
    return o;
}

/* Trajectory traj's answer: ids (n) to append, then the trajectory goes on, or ends when last; NULL: it ends. */
static void reply(struct agent_env *e, int traj, int32_t *ids, int n, bool last)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_replies == e->cap_replies) {
        e->cap_replies = e->cap_replies ? 2 * e->cap_replies : 64;
        e->replies = xrealloc(e->replies, (size_t)e->cap_replies * sizeof *e->replies);
    }
    e->replies[e->n_replies++] = (struct turn_reply){.traj = traj, .done = ids == NULL || last, .ids = ids, .n = n};
    pthread_cond_signal(&e->reply_cv);
    pthread_mutex_unlock(&e->mu);
}

static void keep_tokens(struct atraj *a, const int32_t *ids, int n)
{
    if (a->resp_n + n > a->resp_cap) {
        a->resp_cap = (a->resp_n + n) * 2;
        a->resp = xrealloc(a->resp, (size_t)a->resp_cap * sizeof(int32_t));
    }
    memcpy(a->resp + a->resp_n, ids, (size_t)n * sizeof(int32_t));
    a->resp_n += n;
}

static int32_t *append_answers(struct agent_env *e, struct atraj *a, const struct job *j, json_t *answers,
                               json_t *shown, int *n);
static int32_t *answer_tokens(struct agent_env *e, struct atraj *a, const struct job *j, json_t *answers, int *n);

/* A model turn: the tokens to append after it (*n; *last when the trajectory ends after them: an interaction's
 * closing answer), or NULL when the trajectory ends. */
static int32_t *take_turn(struct agent_env *e, struct atraj *a, const struct job *j, int *n, bool *last)
{
    *last = false;
    const struct grpo_config *c = e->cfg;
    keep_tokens(a, j->ids, j->n);
    a->cut = !j->stopped;
    const int body = j->stopped && j->n > 0 ? j->n - 1 : j->n; /* the stop token is the template's, not content */
    char *text = tokenizer_decode_utf8(e->tok, j->ids, (size_t)body, false);
    json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    json_array_append(a->msgs, msg);
    json_t *amsg = json_copy(msg);
    json_array_append_new(a->audit, amsg);
    json_decref(msg);
    a->assistant_turns++;
    struct parsed_turn pt = {0};
    bool over = !j->stopped ||
                (c->rollout_multi_turn_max_assistant_turns > 0 &&
                 a->assistant_turns >= c->rollout_multi_turn_max_assistant_turns) ||
                (c->rollout_multi_turn_max_user_turns > 0 && a->user_turns >= c->rollout_multi_turn_max_user_turns);
    if (!over) {
        tool_parse_turn(e->format, text, &pt);
        over = pt.n_calls == 0 && !a->interaction;
    }
    free(text);
    if (!over && pt.n_calls == 0) { /* no call: the simulated user answers */
        parsed_turn_free(&pt);
        struct interaction_reply r;
        char err[1024];
        const json_t *kw = a->extra ? json_object_get(a->extra, "interaction_kwargs") : NULL;
        if (interaction_respond(a->interaction, a->iid, json_is_object(kw) ? kw : NULL, a->msgs, &r, err, sizeof err) !=
            0) {
            a->tool_errors++; /* the trajectory ends here; the run goes on */
            log_warn_every("agent", "interaction %s: %s: the trajectory ends there", a->interaction->name, err);
            return NULL;
        }
        if (r.scored)
            json_array_append_new(a->turn_scores, json_real(isfinite(r.score) ? r.score : 0));
        /* verl appends the answer that ends the trajectory too (masked, as every answer) */
        *last = r.terminate;
        char *said = r.text;
        json_t *answers = json_array(), *shown = json_array();
        json_array_append_new(answers, json_pack("{s:s, s:s}", "role", "user", "content", said));
        json_array_append_new(shown, json_pack("{s:s, s:s}", "role", "user", "content", said));
        free(said);
        return append_answers(e, a, j, answers, shown, n);
    }
    if (over) {
        if (pt.n_calls > 0) { /* calls the turn limits left unanswered are still shown */
            json_t *calls = json_array();
            for (int k = 0; k < pt.n_calls; k++)
                json_array_append_new(calls, call_json(&pt.calls[k]));
            json_object_set_new(amsg, "tool_calls", calls);
        }
        parsed_turn_free(&pt);
        return NULL;
    }
    json_t *calls = json_array(), *answers = json_array(), *shown = json_array();
    const int run = pt.n_calls < c->rollout_multi_turn_max_parallel_calls
                        ? pt.n_calls
                        : (int)c->rollout_multi_turn_max_parallel_calls;
    for (int k = 0; k < pt.n_calls; k++) {
        json_t *cj = call_json(&pt.calls[k]);
        if (k >= run) {
            json_object_set_new(cj, "dropped", json_true()); /* past max_parallel_calls, as verl drops them */
            json_array_append_new(calls, cj);
            continue;
        }
        const double t0 = clock_now_s();
        int is_error = 0;
        char *out = run_call(e, a, &pt.calls[k], &is_error);
        a->tool_s += clock_now_s() - t0;
        a->tool_calls++;
        a->tool_errors += is_error != 0;
        json_array_append_new(answers, json_pack("{s:s, s:s}", "role", "tool", "content", out));
        json_t *audit_answer = json_pack("{s:s, s:s, s:b}", "role", "tool", "content", out, "is_error", is_error != 0);
        if (pt.calls[k].name)
            json_object_set_new(audit_answer, "name", json_string(pt.calls[k].name));
        json_array_append_new(calls, cj);
        free(out);
        json_array_append_new(shown, audit_answer);
    }
    json_object_set_new(amsg, "tool_calls", calls);
    parsed_turn_free(&pt);
    return append_answers(e, a, j, answers, shown, n);
}

/* The tokens of the answers (their reference is taken) after the turn j, or NULL when they do not render or
 * would reach the response budget. shown (taken): the answers as the audit keeps them; marked "shown": false
 * when the model does not get them. */
static int32_t *append_answers(struct agent_env *e, struct atraj *a, const struct job *j, json_t *answers,
                               json_t *shown, int *n)
{
    int32_t *ids = answer_tokens(e, a, j, answers, n);
    size_t k;
    json_t *x;
    json_array_foreach(shown, k, x) if (!ids) json_object_set_new(x, "shown", json_false());
    json_array_extend(a->audit, shown);
    json_decref(shown);
    return ids;
}

static int32_t *answer_tokens(struct agent_env *e, struct atraj *a, const struct job *j, json_t *answers, int *n)
{
    char err[1024];
    const char *stop_text = j->stopped && j->n > 0 ? tokenizer_token_text(e->tok, j->ids[j->n - 1]) : NULL;
    char *delta = answer_text(e, a->msgs, answers, stop_text, err, sizeof err);
    if (!delta) {
        log_warn_every("agent", "a trajectory ends: %s", err);
        a->template_errors++;
        json_decref(answers);
        return NULL;
    }
    size_t m;
    int32_t *ids = tokenizer_encode(e->tok, delta, strlen(delta), 0, &m);
    free(delta);
    if ((int)m >= j->budget) { /* verl: a trajectory never ends on an answer cut short */
        free(ids);
        json_decref(answers);
        return NULL;
    }
    json_array_extend(a->msgs, answers);
    json_decref(answers);
    a->user_turns++;
    keep_tokens(a, ids, (int)m);
    *n = (int)m;
    return ids;
}

static struct atraj *traj_at(struct agent_env *e, int i)
{
    pthread_mutex_lock(&e->mu);
    struct atraj *a = i >= 0 && i < e->n_trajs ? e->trajs[i] : NULL;
    pthread_mutex_unlock(&e->mu);
    return a;
}

static void *worker_main(void *arg)
{
    struct agent_env *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->jobs && !e->stopping)
            pthread_cond_wait(&e->job_cv, &e->mu);
        struct job *j = e->jobs;
        if (!j) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        e->jobs = j->next;
        if (!e->jobs)
            e->jobs_tail = &e->jobs;
        pthread_mutex_unlock(&e->mu);
        int n = 0;
        bool last;
        int32_t *ids = take_turn(e, traj_at(e, j->traj), j, &n, &last);
        /* for the tests only: GRPO_TEST_ANSWER_DELAY_S=S makes every answer S seconds slower (a slow tool, so that
         * weight pushes come while trajectories wait for their answers) */
        static double delay_s = -1;
        clock_test_sleep("GRPO_TEST_ANSWER_DELAY_S", &delay_s);
        reply(e, j->traj, ids, n, last);
        free(j->ids);
        free(j);
    }
}

/* ------------------------------------------------------------- interface */

static void atraj_free(struct atraj *a)
{
    if (!a)
        return;
    json_decref(a->prompt), json_decref(a->msgs), json_decref(a->audit), json_decref(a->extra);
    json_decref(a->instances), json_decref(a->turn_scores), json_decref(a->tool_rewards);
    free(a->resp);
    free(a);
}

static int env_begin(struct turn_env *te, int traj, const char *messages_json, const char *extra_info,
                     const char *agent_name)
{
    struct agent_env *e = (struct agent_env *)te;
    struct atraj *a = xcalloc(1, sizeof *a);
    a->tool_agent = agent_name && *agent_name ? strcmp(agent_name, "tool_agent") == 0 : e->default_tool_agent;
    a->prompt = messages_json ? json_loads(messages_json, 0, NULL) : NULL;
    if (!json_is_array(a->prompt)) {
        json_decref(a->prompt);
        a->prompt = json_array();
    }
    a->msgs = json_copy(a->prompt);
    a->audit = json_deep_copy(a->prompt);
    a->extra = extra_info ? json_loads(extra_info, 0, NULL) : NULL;
    if (a->extra && !json_is_object(a->extra)) {
        json_decref(a->extra);
        a->extra = NULL;
    }
    a->instances = json_object();
    a->turn_scores = json_array();
    a->tool_rewards = json_array();
    if (e->interactions.n > 0) { /* extra_info.interaction_kwargs.name (verl's), or the first */
        json_t *kw = a->extra ? json_object_get(a->extra, "interaction_kwargs") : NULL;
        const char *name = json_string_value(json_object_get(kw, "name"));
        a->interaction = interaction_find(&e->interactions, name);
        instance_id(a->iid, sizeof a->iid);
        if (!a->interaction)
            log_warn_every("agent", "a sample asks for interaction '%s', which %s does not define: it has none", name,
                           e->cfg->rollout_multi_turn_interaction_config_path);
    }
    pthread_mutex_lock(&e->mu);
    if (traj >= e->n_trajs) {
        const int want = traj + 1 > 2 * e->n_trajs ? traj + 1 : 2 * e->n_trajs;
        e->trajs = xrealloc(e->trajs, (size_t)want * sizeof *e->trajs);
        memset(e->trajs + e->n_trajs, 0, (size_t)(want - e->n_trajs) * sizeof *e->trajs);
        e->n_trajs = want;
    }
    atraj_free(e->trajs[traj]);
    e->trajs[traj] = a;
    pthread_mutex_unlock(&e->mu);
    return a->tool_agent ? 0 : -1;
}

static void env_turn_end(struct turn_env *te, int traj, const int32_t *ids, int n, bool stopped, int budget)
{
    struct agent_env *e = (struct agent_env *)te;
    struct job *j = xcalloc(1, sizeof *j);
    j->traj = traj;
    j->ids = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    memcpy(j->ids, ids, (size_t)n * sizeof(int32_t));
    j->n = n;
    j->stopped = stopped;
    j->budget = budget;
    pthread_mutex_lock(&e->mu);
    if (!e->threads) {
        e->n_threads = (int)e->cfg->rollout_agent_num_workers;
        e->threads = xcalloc((size_t)e->n_threads, sizeof *e->threads);
        for (int i = 0; i < e->n_threads; i++)
            if (!(pthread_create(&e->threads[i], NULL, worker_main, e) == 0))
                check_failf(__FILE__, __LINE__, "agent: cannot start a thread");
    }
    *e->jobs_tail = j;
    e->jobs_tail = &j->next;
    pthread_cond_signal(&e->job_cv);
    pthread_mutex_unlock(&e->mu);
}

static int env_poll(struct turn_env *te, struct turn_reply *out, int max, bool wait)
{
    struct agent_env *e = (struct agent_env *)te;
    pthread_mutex_lock(&e->mu);
    while (wait && e->n_replies == 0)
        pthread_cond_wait(&e->reply_cv, &e->mu);
    const int k = e->n_replies < max ? e->n_replies : max;
    if (k > 0) { /* no reply yet: replies may still be NULL */
        memcpy(out, e->replies, (size_t)k * sizeof *out);
        memmove(e->replies, e->replies + k, (size_t)(e->n_replies - k) * sizeof *e->replies);
        e->n_replies -= k;
    }
    pthread_mutex_unlock(&e->mu);
    return k;
}

static char *squeeze(const char *s)
{
    char *o = xmalloc(strlen(s) + 1), *w = o;
    for (; *s; s++)
        if (*s != ' ' && *s != '\n' && *s != '\t' && *s != '\r')
            *w++ = *s;
    *w = '\0';
    return o;
}

/* verl's tokenization sanity check: the trajectory's tokens against the template's rendering of its messages. */
static bool tokens_match_messages(struct agent_env *e, struct atraj *a)
{
    char err[512];
    char *prompt = render(e, a->prompt, true, err, sizeof err);
    /* a trajectory that ended on an answer (an interaction's closing one) holds the generation prompt after it */
    const json_t *tail = json_array_get(a->msgs, json_array_size(a->msgs) - 1);
    const char *role = json_string_value(json_object_get(tail, "role"));
    const bool answered = role && strcmp(role, "assistant") != 0;
    char *full = prompt ? render(e, a->msgs, answered, err, sizeof err) : NULL;
    char *resp = tokenizer_decode_utf8(e->tok, a->resp, (size_t)a->resp_n, false);
    bool ok = false;
    if (full && strncmp(full, prompt, strlen(prompt)) == 0) {
        const char *want = full + strlen(prompt);
        if (e->sanity == SANITY_STRICT) {
            ok = strncmp(want, resp, strlen(resp)) == 0 && (a->cut || all_space(want + strlen(resp)));
        } else {
            char *x = squeeze(want), *y = squeeze(resp);
            ok = a->cut ? strncmp(x, y, strlen(y)) == 0 : strcmp(x, y) == 0;
            free(x), free(y);
        }
    }
    if (!ok && full) { /* where they part: a few characters of each from there */
        const char *want = strncmp(full, prompt, strlen(prompt)) == 0 ? full + strlen(prompt) : full;
        size_t at = 0;
        while (want[at] && want[at] == resp[at])
            at++;
        const size_t from = at > 12 ? at - 12 : 0;
        log_warn_every("agent",
                       "a trajectory's tokens differ from the chat template's rendering of its messages at response "
                       "byte %zu: template '%.40s', tokens '%.40s' (multi_turn.tokenization_sanity_check_mode=%s)",
                       at, want + from, resp + from, e->cfg->rollout_multi_turn_tokenization_sanity_check_mode);
    } else if (!ok) {
        log_warn_every("agent", "the tokenization sanity check cannot render the trajectory's messages: %s", err);
    }
    free(prompt), free(full), free(resp);
    return ok;
}

static void env_finish(struct turn_env *te, int traj, struct turn_summary *out)
{
    struct agent_env *e = (struct agent_env *)te;
    struct atraj *a = traj_at(e, traj);
    memset(out, 0, sizeof *out);
    if (!a)
        return;
    out->turns = a->user_turns + (a->assistant_turns > 0 ? a->assistant_turns : 1) + 1;
    out->tool_calls = a->tool_calls;
    out->tool_errors = a->tool_errors;
    out->tool_seconds = a->tool_s;
    out->template_errors = a->template_errors;
    if (a->tool_agent && a->user_turns > 0 && e->sanity != SANITY_DISABLE)
        out->mismatch = !tokens_match_messages(e, a);
    json_t *scores = json_object();
    const char *name;
    json_t *id;
    json_object_foreach(a->instances, name, id)
    {
        struct tool *t = tool_set_find(&e->tools, name);
        if (!t)
            continue;
        json_object_set_new(scores, name, json_real(tool_calc_reward(t, json_string_value(id))));
        tool_release(t, json_string_value(id));
    }
    interaction_finish(a->interaction, a->iid);
    if (a->tool_agent) {
        out->messages_json = CHECK_ALLOC(json_dumps(a->audit, JSON_COMPACT | JSON_ENSURE_ASCII));
        json_t *x = a->extra ? json_deep_copy(a->extra) : json_object();
        json_object_set_new(x, "num_turns", json_integer(out->turns));
        json_object_set_new(x, "rollout_reward_scores", scores);
        scores = NULL;
        json_object_set(x, "turn_scores", a->turn_scores); /* verl's agent loop's extra fields */
        json_object_set(x, "tool_rewards", a->tool_rewards);
        out->reward_json = CHECK_ALLOC(json_dumps(x, JSON_COMPACT | JSON_ENSURE_ASCII));
        json_decref(x);
    }
    json_decref(scores);
    pthread_mutex_lock(&e->mu);
    e->trajs[traj] = NULL;
    pthread_mutex_unlock(&e->mu);
    atraj_free(a);
}

static const struct turn_env_ops agent_ops = {env_begin, env_turn_end, env_poll, env_finish};

static struct turn_env *agent_env_create(const struct grpo_config *c, const struct tokenizer *tok, char *err,
                                         size_t errlen)
{
    const int fmt = tool_format_from_name(c->rollout_multi_turn_format);
    if (fmt < 0) {
        error_set(err, errlen, KEY_rollout_multi_turn_format ": unknown format '%s' (hermes, llama3_json)",
                  c->rollout_multi_turn_format);
        return NULL;
    }
    struct agent_env *e = xcalloc(1, sizeof *e);
    if (load_tools(c, &e->tools, err, errlen) != 0) {
        free(e);
        return NULL;
    }
    const char *ip = c->rollout_multi_turn_interaction_config_path;
    if (ip && *ip && interaction_set_load_yaml(&e->interactions, ip, err, errlen) != 0) {
        tool_set_free(&e->tools);
        free(e);
        return NULL;
    }
    e->base.ops = &agent_ops;
    e->cfg = c;
    e->tok = tok;
    e->format = (enum tool_format)fmt;
    e->tools_json = schemas_json(&e->tools);
    const char *m = c->rollout_multi_turn_tokenization_sanity_check_mode;
    e->sanity = strcmp(m, "disable") == 0             ? SANITY_DISABLE
                : strcmp(m, "ignore_strippable") == 0 ? SANITY_IGNORE_STRIPPABLE
                                                      : SANITY_STRICT;
    e->default_tool_agent =
        c->rollout_multi_turn_enable || strcmp(c->rollout_agent_default_agent_loop, "tool_agent") == 0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->job_cv, NULL);
    pthread_cond_init(&e->reply_cv, NULL);
    e->jobs_tail = &e->jobs;
    char *names = tool_set_names(&e->tools);
    log_info("agent", "multi-turn rollouts with tools: %s (format %s, %lld thread(s))", names,
             c->rollout_multi_turn_format, c->rollout_agent_num_workers);
    free(names);
    return &e->base;
}

static void agent_env_destroy(struct turn_env *te)
{
    struct agent_env *e = (struct agent_env *)te;
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_cond_broadcast(&e->job_cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->n_threads; i++)
        pthread_join(e->threads[i], NULL);
    free(e->threads);
    for (int i = 0; i < e->n_trajs; i++)
        atraj_free(e->trajs[i]);
    free(e->trajs);
    for (int i = 0; i < e->n_replies; i++)
        free(e->replies[i].ids);
    free(e->replies);
    tool_set_free(&e->tools);
    interaction_set_free(&e->interactions);
    free(e->tools_json);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->job_cv);
    pthread_cond_destroy(&e->reply_cv);
    free(e);
}

const struct turn_env_factory agent_env_factory = {agent_env_create, agent_tools_json, agent_env_destroy};
