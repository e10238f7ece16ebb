/* Tool calls read from a model turn's text, in the formats verl's multi_turn.format names:
 *
 *   hermes       <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>, any number of
 *                them anywhere in the turn (Qwen2.5, Qwen3, SmolLM3, Hermes); "arguments" may be an object or a
 *                JSON text of one.
 *   llama3_json  the turn is one JSON object {"name": ..., "parameters": {...}} (or "arguments"), optionally after
 *                <|python_tag|>, several separated by ';' (Llama 3.1-3.3's JSON tool calling).
 *
 * A call that cannot be read (not JSON, no name, arguments not an object, a <tool_call> never closed) is kept as
 * a malformed call with the error message the model gets for it; it is never dropped silently and never fatal. */
#ifndef GRPO_AGENT_TOOL_PARSER_H
#define GRPO_AGENT_TOOL_PARSER_H

#include <stddef.h>

enum tool_format {
    TOOL_FORMAT_HERMES,
    TOOL_FORMAT_LLAMA3_JSON,
};

/* "hermes" / "llama3_json" -> format; -1 when unknown */
int tool_format_from_name(const char *name);

struct parsed_call {
    char *name;      /* the tool's name (NULL when malformed before a name was read) */
    char *arguments; /* the arguments as a compact JSON object text (NULL when malformed) */
    char *error;     /* malformed: "Error: ..." for the model; NULL when the call was read */
};

struct parsed_turn {
    struct parsed_call *calls;
    int n_calls;
    char *content; /* the text with the calls taken out (malloc'd) */
};

/* Read the calls of text. Never fails; free with parsed_turn_free. */
void tool_parse_turn(enum tool_format fmt, const char *text, struct parsed_turn *out);
void parsed_turn_free(struct parsed_turn *t);

#endif
