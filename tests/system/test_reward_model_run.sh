#!/usr/bin/env bash
# A reward model as the reward source of a GRPO run (reward_model.enable): a tiny Llama made into a
# LlamaForSequenceClassification checkpoint (score.weight, one label) scores every response, alone or added to
# the rule scores; timing_s/reward covers it; the scores are the reward model's, not the rules'; with separate
# rollout ranks it scores beside generation there, to the same scores.
# usage: test_reward_model_run.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-rmrun
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tiny_model "$TMP/policy"
expect "tiny policy initialised" $?
tiny_model "$TMP/rm" 21
expect "tiny backbone for the reward model initialised" $?
# make it a one-label LlamaForSequenceClassification: a score head [1, hidden], no LM head
python3 - "$TMP/rm" <<'PY'
import json, random, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
cfg.update(architectures=["LlamaForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
           pad_token_id=0, tie_word_embeddings=False)
json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
raw = open(f"{d}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
head.pop("lm_head.weight", None)
tensors = {k: v for k, v in head.items() if k != "__metadata__"}
out, blobs, off = {}, [], 0
for name in sorted(tensors):
    b, e = tensors[name]["data_offsets"]
    blob = data[b:e]
    out[name] = dict(tensors[name], data_offsets=[off, off + len(blob)])
    blobs.append(blob)
    off += len(blob)
rnd = random.Random(5)
D = cfg["hidden_size"]
score = struct.pack(f"<{D}f", *[rnd.gauss(0, 0.5) for _ in range(D)])
out["score.weight"] = {"dtype": "F32", "shape": [1, D], "data_offsets": [off, off + len(score)]}
blobs.append(score)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
expect "converted to a one-label LlamaForSequenceClassification checkpoint" $?
COMMON=(actor_rollout_ref.model.path="$TMP/policy" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=4
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=12
    data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4 custom_reward_function.path="$SCORER"
    custom_reward_function.name=byte_score)
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/rules" >"$TMP/rules.log" 2>&1
expect "a run with the rule scorer finishes" $?
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/rm-run" reward_model.enable=true \
    reward_model.model.path="$TMP/rm" >"$TMP/rm.log" 2>&1
expect "a run with the reward model finishes" $?
grep -q "reward model $TMP/rm scores every response" "$TMP/rm.log"; expect "it says the reward model scores" $?
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/both" reward_model.enable=true \
    reward_model.model.path="$TMP/rm" reward_model.rule_reward_weight=1.0 >"$TMP/both.log" 2>&1
expect "a run with the reward model plus the rule scores finishes" $?
python3 - "$TMP/rules/p/e/metrics.jsonl" "$TMP/rm-run/p/e/metrics.jsonl" "$TMP/both/p/e/metrics.jsonl" <<'PY'
import json, sys
rules, rm, both = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
r1, m1, b1 = rules[0], rm[0], both[0]
# step 1 generates with the same weights, so the same responses: the scores differ only by their source
assert r1["response_length/mean"] == m1["response_length/mean"] == b1["response_length/mean"], (r1, m1)
assert abs(m1["critic/score/mean"] - r1["critic/score/mean"]) > 1e-6, (m1["critic/score/mean"], r1["critic/score/mean"])
# rule weight 1: the rule scores plus the reward model's, response by response, so on average too
assert abs(b1["critic/score/mean"] - (r1["critic/score/mean"] + m1["critic/score/mean"])) < 1e-9, (b1, r1, m1)
for x in (m1, b1):
    assert x["timing_s/reward"] > 0
print("reward-model scores:", m1["critic/score/mean"], "rules:", r1["critic/score/mean"], "both:", b1["critic/score/mean"])
PY
expect "the scores are the reward model's, alone or added to the rules' (step 1, same responses)" $?
# split: the rollout rank scores with the reward model beside its generation, to the same scores
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none -np 2 \
    "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/split" reward_model.enable=true \
    reward_model.model.path="$TMP/rm" placement.trainer_ranks=1 placement.rollout_ranks=1 >"$TMP/split.log" 2>&1
expect "1 rollout + 1 trainer rank with the reward model finish" $?
grep -q "\[rank 1\] reward: reward model .* scores every response" "$TMP/split.log"
expect "the rollout rank loads the reward model" $?
python3 - "$TMP/rm-run/p/e/metrics.jsonl" "$TMP/split/p/e/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
for x, y in zip(a, b):
    assert abs(x["critic/score/mean"] - y["critic/score/mean"]) <= 1e-6 * max(1, abs(x["critic/score/mean"])), (x, y)
PY
expect "... and its scores equal the single process's, step by step" $?
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" reward_model.enable=true \
    reward_model.model.path="$TMP/policy" >"$TMP/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "architectures is 'LlamaForCausalLM', not a \*ForSequenceClassification" "$TMP/bad.log"
expect "a causal LM given as the reward model is refused by name" $?
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad2" reward_model.enable=true >"$TMP/bad2.log" 2>&1
[ $? -ne 0 ] && grep -q "reward_model.enable is true but reward_model.model.path is empty" "$TMP/bad2.log"
expect "an empty reward_model.model.path is refused" $?
finish
