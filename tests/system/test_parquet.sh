#!/usr/bin/env bash
# verl's parquet datasets load directly: a gsm8k-layout parquet file (made here with pyarrow) is converted once
# into the cache by scripts/parquet_to_jsonl.py and a short GRPO run on a tiny model trains on it; a second run
# uses the cached copy (not rewritten), a touched file is converted again; a corrupt file, a file without a
# prompt column, a bad row and a python without pyarrow are errors that name the parquet file, exit 2, no crash.
# A run with actor_rollout_ref.model.custom_chat_template renders its prompts with that template; validation's
# responses are written (trainer.validation_data_dir), and a val_only run on the checkpoint reproduces them.
# Usage: test_parquet.sh   (from the source root; the build's programs by name, tests/lib.sh). Exit 77 (skipped)
# when the pyarrow venv of scripts/parquet_env.sh cannot be made (no network).
set -u
. "$(dirname "$0")/../lib.sh" grpo-parquet
test_env
# the dataset cache goes here, not into the user's; the pyarrow venv is the shared one (made once)
export GRPO_CACHE="$TMP/cache"
unset GRPO_PARQUET_PYTHON GRPO_PARQUET_TOOL
crashed() { grep -qE "Segmentation|Aborted|core dumped|Traceback|AddressSanitizer" "$1"; }

if ! py="$(./scripts/parquet_env.sh 2>"$TMP/env.log")"; then
    tail -3 "$TMP/env.log"
    echo "SKIP: scripts/parquet_env.sh could not make the pyarrow venv (no network?)"
    exit 77
fi

# verl's gsm8k layout (examples/data_preprocess/gsm8k.py): chat-message prompts, reward_model.ground_truth
"$py" - "$TMP" <<'PY'
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
instr = 'Let\'s think step by step and output the final answer after "####".'
rows = []
for i in range(8):
    a, b = 3 + i, 4 + 2 * i
    q = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
    rows.append({
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": q + " " + instr}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": "train", "index": i, "answer": f"{a} + {b} = {a + b}\n#### {a + b}", "question": q},
    })
table = pa.Table.from_pylist(rows)
pq.write_table(table, os.path.join(d, "gsm8k.parquet"))
pq.write_table(table, os.path.join(d, "fresh.parquet"))
pq.write_table(pa.table({"question": ["1 + 1?"], "answer": ["2"]}), os.path.join(d, "noprompt.parquet"))
rows[2] = dict(rows[2], reward_model=None)  # the third row has no ground truth
pq.write_table(pa.Table.from_pylist(rows), os.path.join(d, "badrow.parquet"))
PY
expect "pyarrow wrote the test parquet files" $?
head -c 4096 /dev/urandom >"$TMP/corrupt.parquet"

"$MODEL_TOOL" init "$TOK/config.json" "$TMP/tiny" --tokenizer-from "$TOK" >"$TMP/init.log" 2>&1
expect "tiny model written" $?
n=0
# run NAME DIR OVERRIDES...: a 2-step run of the tiny model from directory DIR, output in $TMP/NAME.out, rc in $rc
run() {
    local name="$1" dir="$2"
    shift 2
    n=$((n + 1))
    (cd "$dir" && timeout "$(scaled 180)" "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" \
        trainer.default_local_dir="$TMP/runs$n" trainer.total_training_steps=2 trainer.val_before_train=false \
        trainer.test_freq=-1 data.train_batch_size=2 actor_rollout_ref.rollout.n=2 \
        actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=8 data.max_prompt_length=320 \
        "$@") >"$TMP/$name.out" 2>&1
    rc=$?
}
cached() { ls "$GRPO_CACHE/datasets"/gsm8k-*.jsonl 2>/dev/null; }

# --- first run: converted once (train and val name the same file: the second load already finds the copy)
run first . data.train_files="$TMP/gsm8k.parquet" data.val_files="$TMP/gsm8k.parquet"
expect "a run on a parquet file finishes (rc $rc)" $rc
says "$TMP/first.out" "run finished at step 2"; expect "it trained 2 steps" $?
says "$TMP/first.out" "data: converted $TMP/gsm8k.parquet (8 rows) to $GRPO_CACHE/datasets/gsm8k-"
expect "the conversion is logged with its rows and cache file" $?
[ "$(grep -c "data: converted" "$TMP/first.out")" -eq 1 ]; expect "converted once for train and val" $?
says "$TMP/first.out" "data: $TMP/gsm8k.parquet: 8 samples"; expect "the samples are counted under the parquet name" $?
! crashed "$TMP/first.out"; expect "no crash" $?
copy="$(cached)"
[ "$(echo "$copy" | wc -w)" -eq 1 ] && [ "$(wc -l <"$copy")" -eq 8 ]; expect "one cache file, 8 JSONL rows" $?
"$py" - "$copy" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r = rows[0]
assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math", r
assert [m["role"] for m in r["prompt"]] == ["system", "user"], r["prompt"]
assert r["reward_model"] == {"style": "rule", "ground_truth": "7"}, r["reward_model"]
assert r["extra_info"]["index"] == 0 and r["extra_info"]["answer"].endswith("#### 7"), r["extra_info"]
assert [x["extra_info"]["index"] for x in rows] == list(range(8))
PY
expect "every column kept: prompt messages, reward_model, ability, extra_info" $?
ls "$TMP/runs1"/*/*/metrics.jsonl >/dev/null 2>&1; expect "metrics written" $?

# --- second run: the cached copy, untouched
before="$(stat -c '%i %y' "$copy")" # inode and nanosecond mtime: a rewrite changes one or the other
run second . data.train_files="$TMP/gsm8k.parquet" data.val_files="$TMP/gsm8k.parquet" trainer.log_level=debug
expect "a second run finishes (rc $rc)" $rc
says "$TMP/second.out" "data: $TMP/gsm8k.parquet: using its converted copy $copy"; expect "it uses the cache" $?
! grep -q "data: converted" "$TMP/second.out"; expect "no conversion the second time" $?
[ "$(stat -c '%i %y' "$copy")" = "$before" ]; expect "the cache file is not rewritten" $?

# --- actor_rollout_ref.model.custom_chat_template (verl's key): the prompts are rendered with it instead of the
# model's template; the trajectories written (trainer.rollout_data_dir) hold the rendering, checked against the rows'
# messages put together by hand. A template that cannot render is refused at start, naming the key.
tpl='{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|reply|>{% endif %}'
run custom . data.train_files="$TMP/gsm8k.parquet" "actor_rollout_ref.model.custom_chat_template=$tpl" \
    trainer.rollout_data_dir="$TMP/custom-audit"
expect "a run with custom_chat_template finishes (rc $rc)" $rc
"$py" - "$TMP/gsm8k.parquet" "$TMP/custom-audit" <<'PY'
import glob, json, sys
import pyarrow.parquet as pq
rows = pq.read_table(sys.argv[1]).to_pylist()
want = {"".join(f"<|{m['role']}|>{m['content']}" for m in r["prompt"]) + "<|reply|>" for r in rows}
seen = [json.loads(l)["prompt"] for f in sorted(glob.glob(sys.argv[2] + "/*.jsonl")) for l in open(f)]
assert seen, "no trajectories written"
for p in seen:
    assert p in want, f"a prompt not rendered with the custom template: {p[:200]!r}"
print(f"{len(seen)} trajectories, each prompt rendered with the custom template")
PY
expect "every prompt of the trajectories is the custom template's rendering of its row's messages" $?
run badtpl . data.train_files="$TMP/gsm8k.parquet" "actor_rollout_ref.model.custom_chat_template={% for m in messages %}"
[ $rc -eq 2 ]; expect "an unclosed template: exit 2 (got $rc)" $?
says "$TMP/badtpl.out" "actor_rollout_ref.model.custom_chat_template: "; expect "the error names the key" $?
! crashed "$TMP/badtpl.out"; expect "no crash" $?

# --- trainer.validation_data_dir and trainer.val_only (verl's): a 2-step run validates at its end into DIR/2.jsonl;
# launched again on its directory with val_only it resumes at step 2, validates and trains nothing: its 2.jsonl is
# the first run's byte for byte (the same weights, the same seed), and no step 3 is taken
run valtrain . data.train_files="$TMP/gsm8k.parquet" data.val_files="$TMP/gsm8k.parquet" \
    trainer.default_local_dir="$TMP/valrun" trainer.validation_data_dir="$TMP/vd1"
expect "a 2-step run with validation_data_dir finishes (rc $rc)" $rc
[ "$(wc -l <"$TMP/vd1/2.jsonl")" -eq 8 ] && python3 -c "import json,sys; \
l = [json.loads(x) for x in open(sys.argv[1])]; \
assert all(set(x) >= {'input', 'output', 'gts', 'score', 'step'} and x['step'] == 2 for x in l), l[0]" "$TMP/vd1/2.jsonl"
expect "its validation at step 2 is written: 8 lines with verl's fields" $?
run valonly . data.train_files="$TMP/gsm8k.parquet" data.val_files="$TMP/gsm8k.parquet" \
    trainer.default_local_dir="$TMP/valrun" trainer.validation_data_dir="$TMP/vd2" trainer.val_only=true \
    trainer.val_before_train=true trainer.total_training_steps=4
expect "launched again with val_only, it finishes (rc $rc)" $rc
says "$TMP/valonly.out" "trainer.val_only: validated at step 2; nothing is trained"; expect "it says so" $?
cmp -s "$TMP/vd1/2.jsonl" "$TMP/vd2/2.jsonl"; expect "val_only reproduces the step-2 validation byte for byte" $?
[ -z "$(find "$TMP/valrun" -name global_step_3)" ] && python3 -c "import json,sys; \
s = [json.loads(x)['step'] for x in open(sys.argv[1])]; assert max(s) == 2 and s.count(2) == 2, s" \
    "$(find "$TMP/valrun" -name metrics.jsonl)"
expect "no step 3 is taken; the validation is logged at step 2" $?
run valonly2 . data.train_files="$TMP/gsm8k.parquet" trainer.val_only=true
[ $rc -eq 2 ] && says "$TMP/valonly2.out" "trainer.val_only=true with trainer.val_before_train=false would train"
expect "val_only without val_before_train is refused, saying why (exit 2)" $?

# --- an edited file (new modification time) is converted again, from another directory (the converter is
# found beside the executable, ../../scripts/)
touch -d "2001-02-03 04:05:06" "$TMP/gsm8k.parquet"
run touched "$TMP" data.train_files=gsm8k.parquet
expect "a run from another directory with a relative path finishes (rc $rc)" $rc
says "$TMP/touched.out" "data: converted gsm8k.parquet (8 rows)"; expect "a touched file is converted again" $?
[ "$(cached | wc -l)" -eq 2 ]; expect "under a new cache name" $?

# --- bad input: errors that name the parquet file, exit 2
run corrupt "$TMP" data.train_files=corrupt.parquet
[ $rc -eq 2 ]; expect "random bytes named .parquet: exit 2 (got $rc)" $?
says "$TMP/corrupt.out" "data.train_files: corrupt.parquet: cannot convert (not a readable parquet file:"
expect "the error names the file and says it is not parquet" $?
! crashed "$TMP/corrupt.out"; expect "no crash, no traceback" $?

run noprompt . data.train_files="$TMP/gsm8k.parquet" data.val_files="$TMP/noprompt.parquet"
[ $rc -eq 2 ]; expect "no prompt column: exit 2 (got $rc)" $?
says "$TMP/noprompt.out" "data.val_files: $TMP/noprompt.parquet: cannot convert (no 'prompt' or 'messages' column;"
expect "the error names the file and the missing column" $?
says "$TMP/noprompt.out" "its columns: question, answer)"
expect "and lists the columns there are" $?

run badrow . data.train_files="$TMP/badrow.parquet"
[ $rc -eq 2 ]; expect "a row without ground truth: exit 2 (got $rc)" $?
says "$TMP/badrow.out" "$TMP/badrow.parquet:3: missing 'ground_truth' (or reward_model.ground_truth)"
expect "the error names the parquet file and the row" $?

printf '#!/bin/sh\nexec python3 -S "$@"\n' >"$TMP/nopyarrow"
chmod +x "$TMP/nopyarrow"
GRPO_PARQUET_PYTHON="$TMP/nopyarrow" run nopyarrow . data.train_files="$TMP/fresh.parquet"
[ $rc -eq 2 ]; expect "a python without pyarrow: exit 2 (got $rc)" $?
says "$TMP/nopyarrow.out" "data.train_files: $TMP/fresh.parquet: cannot convert (cannot import pyarrow"
expect "the error says pyarrow is missing" $?
says "$TMP/nopyarrow.out" "install pyarrow with scripts/parquet_env.sh"; expect "and how to install it" $?

[ -z "$(find "$GRPO_CACHE" -name '*.tmp')" ]; expect "failed conversions leave no temporary files" $?

# --- the converter by hand
"$py" scripts/parquet_to_jsonl.py "$TMP/gsm8k.parquet" "$TMP/by-hand.jsonl" >"$TMP/hand.out" 2>&1
expect "parquet_to_jsonl.py exits 0" $?
says "$TMP/hand.out" "8 rows"; expect "and reports the rows" $?
"$py" scripts/parquet_to_jsonl.py "$TMP/corrupt.parquet" "$TMP/c.jsonl" >"$TMP/hand.err" 2>&1
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/hand.err")" -eq 1 ] && [ ! -e "$TMP/c.jsonl" ]
expect "a corrupt file: exit 2, one line, no output file" $?

finish "$TMP"/*.out
