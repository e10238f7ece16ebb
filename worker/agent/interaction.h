/* Interactions: verl's simulated user (multi_turn.interaction_config_path). After a model turn that calls no tool,
 * the trajectory's interaction answers as the user, and the trajectory goes on until the interaction ends it, or
 * multi_turn.max_user_turns, max_assistant_turns or the response budget does.
 *
 * The config file is verl's: `interaction: [{name, class_name, config}]`. A sample picks one by
 * extra_info.interaction_kwargs.name (verl's), or gets the first. Class names:
 *
 *   grpo.interactions.Retry   answers every turn with config.message (default: a request to check the answer and
 *                             try again); a deterministic user, also what the multi-turn equivalence tests use
 *   pkg.module.Class          a Python class written for verl (verl.interactions.base.BaseInteraction's methods:
 *                             start_interaction, generate_response, finalize_interaction), built as cls(config) in
 *                             a pool of helper processes (worker/agent/pytool.c; verl's modules, or stand-ins of
 *                             them where verl is not installed); its per-turn scores reach the scorer as
 *                             extra_info.turn_scores, as verl's agent loop gives them
 *
 * Errors name FILE:LINE (an unknown key, a class that does not load with Python's reason, a second interaction of
 * one name). */
#ifndef GRPO_AGENT_INTERACTION_H
#define GRPO_AGENT_INTERACTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct pyinteraction;

struct interaction {
    char *name;
    char *message;            /* Retry's answer */
    struct pyinteraction *py; /* a Python class's pool, or NULL (Retry) */
};

struct interaction_set {
    struct interaction *items;
    int n;
};

/* The answer to a model turn. */
struct interaction_reply {
    char *text;     /* the user's answer (malloc'd) */
    bool terminate; /* the interaction ends the trajectory after this answer */
    bool scored;    /* score holds the turn's score (verl's turn_scores) */
    double score;
};

/* 0, or -1 with err naming FILE:LINE. */
int interaction_set_load_yaml(struct interaction_set *s, const char *path, char *err, size_t errlen);
/* The interaction called name, or the first one when name is NULL; NULL when none matches. */
const struct interaction *interaction_find(const struct interaction_set *s, const char *name);
/* The answer to trajectory `instance`'s conversation (messages: verl's list of {role, content}, the model's last
 * turn last); kwargs: the sample's interaction_kwargs (or NULL). 0, or -1 with err (a Python interaction's
 * exception, timeout or lost process: the trajectory ends). */
int interaction_respond(const struct interaction *it, const char *instance, const json_t *kwargs,
                        const json_t *messages, struct interaction_reply *out, char *err, size_t errlen);
/* The trajectory `instance` is over (a Python interaction's finalize_interaction). */
void interaction_finish(const struct interaction *it, const char *instance);
void interaction_set_free(struct interaction_set *s);

#endif
