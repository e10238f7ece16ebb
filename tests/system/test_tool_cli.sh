#!/usr/bin/env bash
# grpo-model tool: one tool call as a rollout makes it. The calculator against Python's own arithmetic (python3
# computes every reference value here: big integers, floor division and modulo with signs, powers, floats, and
# the errors), the code interpreter's answer, the exit statuses (0 whenever the tool answered, errors included;
# 2 for an unknown tool, naming the known ones, and for arguments that are not JSON; 1 for a tool config that
# cannot be read), truncation from the command line, and verl's tool-config YAML: SandboxFusionTool without a
# URL is the built-in code interpreter with its limits; with a URL, the SandboxFusion client against the stand-in
# server (tests/fixtures/tools/sandbox_fusion_standin.py), and a failing or stopped server is an answer; a Python
# class (tests/fixtures/tools/counter.yaml) with its create kwargs, step reward and calc_reward, an exception and
# a timeout as answers; --function-tool-path's @function_tool functions, alone and beside a tool config; and a
# name that is no class, a module that cannot be imported, a schema error are refused naming FILE:LINE.
# Usage: test_tool_cli.sh (the build's grpo-model by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-tool-cli
M="$(prog grpo-model)"
json() { python3 -c 'import json,sys; print(json.dumps({sys.argv[1]: sys.argv[2]}))' "$1" "$2"; }

"$M" tool --help >"$TMP/h" 2>&1 && says "$TMP/h" "usage: grpo-model tool"; expect "tool --help" $?
"$M" --help >"$TMP/h" 2>&1 && says "$TMP/h" "tool [--tool-config FILE] [--function-tool-path FILE] NAME --args JSON"
expect "--help lists tool" $?

# ---- the calculator against Python ----
python3 - >"$TMP/cases" <<'EOF'
import json, random, sys
sys.set_int_max_str_digits(0)
rnd = random.Random(38)
def num(big):
    k = rnd.choice([1, 3, 9, 18, 30, 60] if big else [1, 2, 3])
    return str(rnd.randrange(1, 10 ** k))
def flt():
    return rnd.choice(["0.5", "1.25", "3.14159", "2.5e3", "1e-7", "7.0", "0.1", "123.456"])
cases = ["2**200", "-2**2", "(-2)**3", "2**-2", "2**3**2", "-7//2", "-7%3", "7%-3", "-7//-2", "10**30//-7",
         "-(10**30)%7", "1/3", "0.1+0.2", "1e16", "1.5e-5", "2**0.5", "-8.5//2", "-8.5%3", "7.5//-2", "1e308*10",
         "10**20/3", "(10**50+1)/(10**49)", "3 - -3", "+-+5", "((((1+2)*3)-4)//5)", "1/0", "5%0", "5//0",
         "1.0/0", "0**-1", "2**10000 // 3**6000", "(10**200+7) % (10**100+3)", "123456789**7 - 987654321**6"]
for _ in range(40):
    a, b = num(True), num(rnd.random() < 0.5)
    op = rnd.choice(["+", "-", "*", "//", "%", "*"])
    e = f"{'-' if rnd.random() < 0.3 else ''}{a} {op} {'-' if rnd.random() < 0.3 else ''}{b}"
    if rnd.random() < 0.3:
        e = f"({e}) {rnd.choice(['+', '-', '*', '//', '%'])} {num(False)}"
    cases.append(e)
for _ in range(12):
    cases.append(f"{flt()} {rnd.choice(['+', '-', '*', '/', '//', '%'])} {rnd.choice([flt(), num(False)])}")
for _ in range(6):
    cases.append(f"{num(False)} ** {rnd.randrange(0, 60)}")
for e in cases:
    try:
        v = eval(e, {"__builtins__": {}})
        out = "ERROR" if isinstance(v, complex) else repr(v)
    except (ZeroDivisionError, OverflowError):
        out = "ERROR"
    print(f"{e}\t{out}\t{json.dumps({'expression': e})}")
EOF
n=0 bad=0
while IFS=$'\t' read -r e want args; do
    n=$((n + 1))
    got="$("$M" tool calculator --max-response-length 0 --args "$args" 2>"$TMP/calc.err")"
    rc=$?
    if [ "$want" = ERROR ]; then [[ "$got" == Error:* ]] || got="(not an error) $got"; want="$got"; fi
    if [ $rc -ne 0 ] || [ "$got" != "$want" ]; then
        bad=$((bad + 1))
        echo "     calculator: $e = $want (Python), got '$got' (exit $rc)"
    fi
done <"$TMP/cases"
[ "$n" -ge 90 ] && [ "$bad" -eq 0 ]; expect "calculator matches Python on $n expressions" $?

# ---- exit statuses and answers ----
out="$("$M" tool calculator --args '{"expression": "1/0"}' 2>/dev/null)"
[ $? -eq 0 ] && [ "$out" = "Error: division by zero" ]; expect "a tool error is an answer (exit 0)" $?
out="$("$M" tool calculator --args '{"expr": "1"}' 2>/dev/null)"
[ $? -eq 0 ] && [ "$out" = "Error: missing required argument 'expression'" ]; expect "a schema error is an answer" $?
out="$("$M" tool calculator --args '{"expression": 7}' 2>/dev/null)"
[ "$out" = "Error: argument 'expression' must be of type string, not integer" ]; expect "a mistyped argument" $?
"$M" tool nosuch --args '{}' >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && says "$TMP/e" "unknown tool 'nosuch' (known: code_interpreter, calculator)"
expect "an unknown tool: exit 2, the known ones listed" $?
"$M" tool calculator --args '{"expression": ' >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && says "$TMP/e" "--args is not JSON"; expect "arguments that are not JSON: exit 2" $?
"$M" tool calculator >/dev/null 2>"$TMP/e"; [ $? -eq 2 ]; expect "no --args: exit 2" $?
"$M" tool calculator --args '{}' --truncate-side up >/dev/null 2>&1; [ $? -eq 2 ]; expect "a bad side: exit 2" $?

out="$("$M" tool code_interpreter --args "$(json code $'import sys\nprint(6*7)\nprint("oops", file=sys.stderr)\nsys.exit(4)')" 2>/dev/null)"
[ $? -eq 0 ] && [ "$out" = $'42\noops\n[exit status 4]' ]; expect "code_interpreter: output and exit status" $?
out="$("$M" tool code_interpreter --args "$(json code 'print(open("/etc/shadow").read())')" 2>/dev/null)"
[ $? -eq 0 ] && [[ "$out" == *"FileNotFoundError"* ]]; expect "code_interpreter: /etc/shadow is not there" $?
out="$("$M" tool code_interpreter --args "$(json code 'print("x" * 1000)')" 2>/dev/null)"
[ "${#out}" -lt 400 ] && [[ "$out" == *"...(truncated 745 characters)..."* ]]
expect "the default limit: 256 characters, cut in the middle (verl's defaults)" $?
out="$("$M" tool calculator --max-response-length 5 --truncate-side left --args '{"expression": "10**20"}')"
[ "$out" = "10000...(truncated 16 characters)" ]; expect "--truncate-side left keeps the start" $?
out="$("$M" tool calculator --max-response-length 5 --truncate-side right --args '{"expression": "2**70"}')"
[ "$out" = "(truncated 17 characters)...03424" ]; expect "--truncate-side right keeps the end" $?

# ---- verl's tool config ----
cat >"$TMP/tools.yaml" <<'EOF'
tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config:
      type: native
      default_timeout: 1
      memory_limit_mb: 256
      num_workers: 4
      max_response_length: 1000
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
  - class_name: grpo.tools.Calculator
    config: {max_response_length: 8, tool_response_truncate_side: left}
    tool_schema:
      type: function
      function:
        name: calc
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression],
                     additionalProperties: false}
EOF
out="$("$M" tool --tool-config "$TMP/tools.yaml" calc --args '{"expression": "10**10"}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "10000000...(truncated 3 characters)" ]; expect "tool config: a renamed calculator with its limit" $?
out="$("$M" tool --tool-config "$TMP/tools.yaml" calc --args '{"expression": "1", "x": 1}' 2>"$TMP/e")"
[ "$out" = "Error: unknown argument 'x' (this tool takes: expression)" ]
expect "tool config: additionalProperties false refuses an unknown argument" $?
"$M" tool --tool-config "$TMP/tools.yaml" calculator --args '{}' >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && says "$TMP/e" "(known: code_interpreter, calc)"; expect "tool config: its names are the known ones" $?
out="$("$M" tool --tool-config "$TMP/tools.yaml" code_interpreter --args "$(json code $'import time\nprint("start", flush=True)\ntime.sleep(60)')" 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = $'start\n[stopped: the wall-time limit of 1 s was reached]' ]
expect "SandboxFusionTool without a URL: the built-in sandbox, default_timeout its wall limit" $?
out="$("$M" tool --tool-config "$TMP/tools.yaml" code_interpreter --args "$(json code 'x = bytearray(300 << 20)')" 2>"$TMP/e")"
[[ "$out" == *MemoryError* ]]; expect "SandboxFusionTool: memory_limit_mb is the memory limit" $?

bad_config() { # NAME EXPECTED-TEXT: the YAML on stdin is refused with exit 1 and the text
    cat >"$TMP/bad.yaml"
    "$M" tool --tool-config "$TMP/bad.yaml" code_interpreter --args '{"code": ""}' >/dev/null 2>"$TMP/e"
    local rc=$?
    [ $rc -eq 1 ] && says "$TMP/e" "$2"
    expect "tool config refused: $1" $?
}
bad_config "a module that cannot be imported" \
    "$TMP/bad.yaml:5: cannot load class 'my.tools.Search': ModuleNotFoundError: No module named 'my'" <<'EOF'
tools:
  - class_name: grpo.tools.Calculator
    config: {}
    tool_schema: {type: function, function: {name: c, parameters: {type: object, properties: {expression: {type: string}}}}}
  - class_name: my.tools.Search
    tool_schema: {type: function, function: {name: s}}
EOF
bad_config "a class name that is no class path" "$TMP/bad.yaml:2: unknown tool class 'Search Tool'" <<'EOF'
tools:
  - class_name: Search Tool
    tool_schema: {type: function, function: {name: s}}
EOF
bad_config "a schema type" "$TMP/bad.yaml:10: tool_schema.function.parameters.properties.code.type: unknown type 'str'" <<'EOF'
tools:
  - class_name: grpo.tools.CodeInterpreter
    tool_schema:
      type: function
      function:
        name: code_interpreter
        parameters:
          type: object
          properties:
            code: {type: str}
EOF
bad_config "an unknown config key" "$TMP/bad.yaml:3: config: unknown key 'colour'" <<'EOF'
tools:
  - class_name: grpo.tools.CodeInterpreter
    config: {colour: red}
    tool_schema: {type: function, function: {name: code_interpreter, parameters: {type: object, properties: {code: {type: string}}}}}
EOF
"$M" tool --tool-config "$TMP/nonexistent.yaml" calc --args '{}' >/dev/null 2>"$TMP/e"
[ $? -eq 1 ] && says "$TMP/e" "nonexistent.yaml: No such file or directory"; expect "a missing tool config: exit 1" $?

# ---- Python tools ----
FIX="$SRC_ROOT/tests/fixtures/tools"
out="$("$M" tool --tool-config "$FIX/counter.yaml" counter --args '{}' --show-reward 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "call 1 of grpo-model-tool!" ] && says "$TMP/e" "step reward 0.5, calc_reward 1"
expect "a Python class: its answer, step reward and calc_reward" $?
out="$("$M" tool --tool-config "$FIX/counter.yaml" counter --args '{}' --create-kwargs '{"start": 41}' --show-reward \
    2>"$TMP/e")"
[ "$out" = "call 42 of grpo-model-tool!" ] && says "$TMP/e" "calc_reward 42"; expect "--create-kwargs reach create" $?
out="$("$M" tool --tool-config "$FIX/counter.yaml" counter --args '{"what": "raise"}' --show-reward 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "Error: ValueError: the counter was asked to fail" ] && says "$TMP/e" "(an error answer)"
expect "a Python exception is an error answer (exit 0)" $?
out="$("$M" tool --tool-config "$FIX/counter.yaml" counter --args '{"what": "hang"}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "Error: the tool timed out after 2 s" ] && says "$TMP/e" "a call timed out after 2 s"
expect "a hanging Python tool: answered after its timeout (exit 0)" $?
out="$("$M" tool --tool-config "$FIX/counter.yaml" sync --args '{"what": "int"}' 2>"$TMP/e")"
[ "$out" = 42 ]; expect "a sync class's int answer, as text" $?
"$M" tool --tool-config "$FIX/counter.yaml" counter --args '{}' --create-kwargs '[1]' >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && says "$TMP/e" "--create-kwargs is not a JSON object"; expect "--create-kwargs not an object: exit 2" $?
"$M" tool --tool-config "$FIX/counter.yaml" counter --args '{}' --create-kwargs '{"start": "x"}' >/dev/null 2>"$TMP/e"
[ $? -eq 1 ] && says "$TMP/e" "counter: create: ValueError: invalid literal for int()"
expect "create raising: exit 1, the exception named" $?

# ---- @function_tool files ----
out="$("$M" tool --function-tool-path "$FIX/function_tools.py" add --args '{"a": 2, "b": 0.5}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = 2.5 ]; expect "--function-tool-path: a function's answer" $?
out="$("$M" tool --function-tool-path "$FIX/function_tools.py" slow_echo --args '{"text": "ab", "tags": []}' \
    --show-reward 2>"$TMP/e")"
[ "$out" = AB ] && says "$TMP/e" "step reward 0.25"; expect "--function-tool-path: an async function with a reward" $?
out="$("$M" tool --function-tool-path "$FIX/function_tools.py" add --args '{"a": "2", "b": 1}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "Error: argument 'a' must be of type integer, not string" ]
expect "--function-tool-path: the derived schema checks the arguments" $?
out="$("$M" tool --tool-config "$FIX/counter.yaml" --function-tool-path "$FIX/function_tools.py" sync --args '{}' \
    2>"$TMP/e")"
[ "$out" = "plain sync" ]; expect "--tool-config and --function-tool-path together" $?
"$M" tool --function-tool-path "$FIX/function_tools.py" nosuch --args '{}' >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && says "$TMP/e" "(known: add, fail, get_weather, slow_echo)"; expect "an unknown function tool: exit 2" $?
"$M" tool --function-tool-path "$FIX/broken_function_tools.py" x --args '{}' >/dev/null 2>"$TMP/e"
[ $? -eq 1 ] && says "$TMP/e" "the docstring has no description for the argument 'y'"
expect "a function without its parameter described: exit 1" $?

# ---- SandboxFusion ----
export no_proxy=127.0.0.1 NO_PROXY=127.0.0.1 # the stand-in is local whatever proxy the environment names
python3 "$FIX/sandbox_fusion_standin.py" "$TMP/port" 2>"$TMP/standin.log" &
STANDIN=$!
wait_for 30 test -s "$TMP/port"; expect "the stand-in SandboxFusion server starts" $?
PORT="$(cat "$TMP/port")"
sf_config() { # URL: a tool config with the SandboxFusion client at URL
    cat >"$TMP/sf.yaml" <<EOF
tools:
  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
    config: {sandbox_fusion_url: "$1", default_timeout: 2, memory_limit_mb: 128, num_workers: 2, rate_limit: 2}
    tool_schema:
      type: function
      function: {name: code_interpreter, parameters: {type: object, properties: {code: {type: string}}, required: [code]}}
EOF
}
sf_config "http://127.0.0.1:$PORT/run_code"
out="$("$M" tool --tool-config "$TMP/sf.yaml" code_interpreter --args "$(json code $'print(6*7)\nimport sys; sys.exit(3)')" \
    2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = $'42\n[exit status 3]' ]; expect "SandboxFusionTool with a URL: run by the server" $?
out="$("$M" tool --tool-config "$TMP/sf.yaml" code_interpreter --args "$(json code 'x = bytearray(300 << 20)')" 2>"$TMP/e")"
[[ "$out" == *MemoryError* ]]; expect "SandboxFusionTool: memory_limit_mb reaches the server" $?
sf_config "http://127.0.0.1:$PORT/status500/run_code"
out="$("$M" tool --tool-config "$TMP/sf.yaml" code_interpreter --args '{"code": "1"}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "Error: the code sandbox failed: HTTP 500 (3 attempts)" ]
expect "a failing server: an error answer after 3 attempts (exit 0)" $?
kill "$STANDIN" && wait "$STANDIN" 2>/dev/null
sf_config "http://127.0.0.1:$PORT/run_code"
out="$("$M" tool --tool-config "$TMP/sf.yaml" code_interpreter --args '{"code": "1"}' 2>"$TMP/e")"
[ $? -eq 0 ] && [ "$out" = "Error: the code sandbox cannot be reached (Couldn't connect to server; 3 attempts)" ]
expect "a server that is gone: an error answer without the URL (exit 0)" $?
finish
