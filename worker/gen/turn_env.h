/* Multi-turn generation's other side: what answers a model turn. Generation (worker/gen/multi_turn.c) drives the
 * tokens: it prefills, decodes, keeps each trajectory's KV cache across turns and batches every trajectory that
 * has work. When a trajectory's model turn ends it hands the turn to a turn environment and goes on with the
 * others; the environment answers later, from its own threads, with the tokens to append (a tool's answer rendered
 * by the chat template) or with the end of the trajectory. Generation knows nothing of tools or messages: the agent
 * room (worker/agent/agent_loop.c) implements this interface, and the program wires the two together
 * (gen_turn_env_register), so generation, the trainer and the rollout role never include the agent room.
 *
 * Threads: turn_end and begin/finish are called from the generating thread; the environment may answer from any
 * thread through the poll it implements. */
#ifndef GRPO_WORKER_GEN_TURN_ENV_H
#define GRPO_WORKER_GEN_TURN_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct tokenizer;

/* The environment's answer to a model turn. */
struct turn_reply {
    int traj;     /* which trajectory (the id begin got) */
    bool done;    /* the trajectory ends here, after ids where there are any (an interaction's closing answer) */
    int32_t *ids; /* (n) tokens to append after the model's turn, not trained on (malloc'd, the generator frees) */
    int n;
};

/* What a trajectory's environment reports at its end; every pointer is malloc'd and handed to the caller. */
struct turn_summary {
    int turns;           /* verl's num_turns: user (tool) turns + model turns + 1 */
    int tool_calls;      /* tool calls run */
    int tool_errors;     /* calls answered with an error (malformed, unknown tool, bad arguments, failures) */
    double tool_seconds; /* wall time of its tool calls */
    bool mismatch;       /* tokenization sanity check failed (multi_turn.tokenization_sanity_check_mode) */
    int template_errors; /* answers the chat template could not render (the trajectory ended there) */
    /* filled by generation (worker/gen/multi_turn.c), not by the environment */
    int resumed_turns;   /* turns resumed after an answer */
    int prefill_tokens;  /* tokens prefilled for them: the stop token and the answer, or everything after an eviction */
    int evictions;       /* times its cache was given up while it waited */
    char *messages_json; /* the conversation (prompt messages, the model's turns, tool calls and answers), or NULL */
    char *reward_json;   /* extra_info for the scorer: the sample's extra_info plus num_turns and the tools'
                            rollout_reward_scores (verl's), or NULL to keep the sample's own */
};

struct turn_env;
struct turn_env_ops {
    /* A trajectory starts: prompt `messages_json` (the sample's chat messages), its extra_info (may be NULL; verl's
     * tools_kwargs live there) and agent name (NULL: the default). traj is the caller's id, unique within a call of
     * gen_generate_multi_turn. 0, or -1: the trajectory is single-turn (its first model turn ends it). */
    int (*begin)(struct turn_env *e, int traj, const char *messages_json, const char *extra_info,
                 const char *agent_name);
    /* A model turn of trajectory traj ended: ids[0..n) are the tokens it generated this turn (its stop token last
     * when stopped), budget the response tokens still allowed after them. The environment works on it (tool calls,
     * rendering) and answers through poll; it must answer every turn_end exactly once. */
    void (*turn_end)(struct turn_env *e, int traj, const int32_t *ids, int n, bool stopped, int budget);
    /* Answers ready: up to max into out; with wait, blocks until at least one is ready (there is one pending).
     * Returns how many. */
    int (*poll)(struct turn_env *e, struct turn_reply *out, int max, bool wait);
    /* The trajectory is over (after its last answer, or at its first turn when single-turn): its summary. */
    void (*finish)(struct turn_env *e, int traj, struct turn_summary *out);
};

struct turn_env {
    const struct turn_env_ops *ops;
};

/* The program's environment factory: makes the environment a configuration asks for (multi_turn.enable), or NULL
 * with err. tools_json (may be NULL): the JSON array of tool schemas that prompts are rendered with. */
struct turn_env_factory {
    struct turn_env *(*create)(const struct grpo_config *cfg, const struct tokenizer *tok, char *err, size_t errlen);
    /* the tools of a configuration as a JSON array text (malloc'd), or NULL with err (a tool config that does not
     * load, naming FILE:LINE) */
    char *(*tools_json)(const struct grpo_config *cfg, char *err, size_t errlen);
    void (*destroy)(struct turn_env *e);
};
/* Set once by the program (grpo-worker, grpo-model) before any role starts. */
void gen_turn_env_register(const struct turn_env_factory *f);
/* The registered factory, or NULL (a program that has none: multi_turn.enable is then refused). */
const struct turn_env_factory *gen_turn_env_factory(void);

#endif
