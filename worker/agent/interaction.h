/* Interactions: verl's simulated user (multi_turn.interaction_config_path). After a model turn that calls no tool,
 * the trajectory's interaction answers as the user, and the trajectory goes on until the interaction ends it, or
 * multi_turn.max_user_turns, max_assistant_turns or the response budget does.
 *
 * The config file is verl's: `interaction: [{name, class_name, config}]`. A sample picks one by
 * extra_info.interaction_kwargs.name (verl's), or gets the first. Class names:
 *
 *   grpo.interactions.Retry   answers every turn with config.message (default: a request to check the answer and
 *                             try again); a deterministic user, also what the multi-turn equivalence tests use
 *
 * Errors name FILE:LINE (an unknown class, an unknown key, a second interaction of one name). */
#ifndef GRPO_AGENT_INTERACTION_H
#define GRPO_AGENT_INTERACTION_H

#include <stddef.h>

struct interaction {
    char *name;
    char *message; /* Retry's answer */
};

struct interaction_set {
    struct interaction *items;
    int n;
};

/* 0, or -1 with err naming FILE:LINE. */
int interaction_set_load_yaml(struct interaction_set *s, const char *path, char *err, size_t errlen);
/* The interaction called name, or the first one when name is NULL; NULL when none matches. */
const struct interaction *interaction_find(const struct interaction_set *s, const char *name);
/* The user's answer to the conversation (a malloc'd text); *terminate set when the interaction ends the
 * trajectory instead. */
char *interaction_respond(const struct interaction *it, int *terminate);
void interaction_set_free(struct interaction_set *s);

#endif
