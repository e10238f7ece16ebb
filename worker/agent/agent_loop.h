/* verl's tool agent as a turn environment (worker/gen/turn_env.h): after each model turn it reads the tool calls
 * (worker/agent/tool_parser.h), runs them (worker/agent/tool.h) on its own threads while generation goes on,
 * renders the answers with the model's chat template and hands back the tokens to append; at a trajectory's end it
 * reports the conversation, the counts and the tools' rewards.
 *
 * A turn, as verl's ToolAgentLoop takes it:
 *   - the model's tokens are decoded (special tokens kept) into the assistant message's content; a turn that ran
 *     out of the response budget, or that reached multi_turn.max_assistant_turns, or past max_user_turns, or that
 *     has no tool call, ends the trajectory;
 *   - at most multi_turn.max_parallel_calls calls are run, in order (the others are dropped and counted); a
 *     malformed call, an unknown tool or arguments that do not fit the schema are answered with an error message
 *     (counted in tool_errors) and the trajectory goes on;
 *   - the answers become "tool" messages; their tokens are the chat template's rendering of the conversation with
 *     them (and the generation prompt) less its rendering without them, plus the whitespace the template puts after
 *     the model's stop token; an answer that would reach data.max_response_length ends the trajectory instead. */
#ifndef GRPO_AGENT_AGENT_LOOP_H
#define GRPO_AGENT_AGENT_LOOP_H

#include "worker/gen/turn_env.h"

/* The factory grpo-worker and grpo-model register (gen_turn_env_register). */
extern const struct turn_env_factory agent_env_factory;

#endif
