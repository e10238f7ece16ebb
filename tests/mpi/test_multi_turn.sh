#!/usr/bin/env bash
# Multi-turn rollouts (docs/agents.md) reproduce the single-process run in every layout (mpirun --oversubscribe on
# 2 cores): tiny Llama, a simulated user that answers every model turn without a tool call
# (grpo.interactions.Retry, a deterministic other side: the tiny model writes no tool calls) within
# multi_turn.max_user_turns, two GRPO steps:
#  - colocated DP2 and split 2 trainers + 1 rollout rank give the single-process per-step losses, grad norms,
#    entropies and scores, and its weights, within 1e-5 relative;
#  - the run is really multi-turn: trajectories with answers (num_turns/max above 2, tool tokens in the responses),
#    and the split run's audit lines carry the response mask (0 on the answers' tokens) and the conversation
#    (the user's answer in messages) across the data plane;
#  - a rollout TP group of 2, and with validation: colocated DP 2 generating as one engine of rollout TP 2, colocated
#    TP 2 generating as the engine, colocated PP 2, split runs of TP 2 or PP 2 trainers (their validation generates
#    on the model copy) give the same, and the validation's greedy multi-turn responses are one process's;
#  - a Python interaction written for verl answers with its own per-trajectory state, and its scores reach a Python
#    scorer as extra_info.turn_scores;
#  - one-step-off (rollout.mode=async) runs multi-turn too;
#  - fully-async training: staleness 0 + a push every step equals the on-policy 1+1 run bit for bit; with partial
#    rollout (trajectories continued with new weights mid-turn) and without it, the float64 stream check and a
#    bit-identical replay; a run ended at step 2 and launched again to step 4 equals the replay of its schedule;
#  - a tool config that does not load stops the run at start naming FILE:LINE.
# usage: test_multi_turn.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-mt
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none -x GRPO_TEST_DECODE_SLEEP_S -x GRPO_TEST_ANSWER_DELAY_S)
export GRPO_TEST_DECODE_SLEEP_S=0 GRPO_TEST_ANSWER_DELAY_S=0
. "$(dirname "$0")/equiv_lib.sh"

cat >"$TMP/again.yaml" <<'EOF'
interaction:
  - name: again
    class_name: grpo.interactions.Retry
    config:
      message: Again.
EOF
# byte-level tokens: a budget in which a turn that stops (1 in 260 tokens) leaves room for the answer's ~30
MT=(data.max_response_length=96 actor_rollout_ref.rollout.multi_turn.enable=true
    actor_rollout_ref.rollout.multi_turn.interaction_config_path="$TMP/again.yaml"
    actor_rollout_ref.rollout.multi_turn.max_user_turns=2 trainer.val_before_train=false)
# shellcheck disable=SC2046 # common's words are the keys
"$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/one" >"$TMP/one.log" 2>&1
expect "single-process multi-turn run finishes" $?
out=$(python3 - "$TMP/one/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "num_turns/max" in r]
turns = max(r["num_turns/max"] for r in rows)
tool = sum(r["response_length/tool_tokens/mean"] for r in rows)
print(f"num_turns/max {turns}, tool tokens {tool:.1f}")
sys.exit(0 if rows and turns > 2 and tool > 0 else 1)
PY
)
expect "the run has trajectories with answers ($out)" $?

# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/colo" \
    trainer.nnodes=1 trainer.n_gpus_per_node=2 >"$TMP/colo.log" 2>&1
expect "colocated DP2 multi-turn run finishes" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 3 "$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/split" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 trainer.rollout_data_dir="$TMP/split/audit" \
    >"$TMP/split.log" 2>&1
expect "split 2+1 multi-turn run finishes" $?
for run in colo split; do
    out=$(same_metrics one $run 2>&1)
    expect "$run: per-step losses, grad norms, entropies and scores match one process ($out)" $?
    out=$(same_weights one $run)
    expect "$run: weights after $STEPS steps match one process within 1e-5 ($out)" $?
done

out=$(python3 - "$TMP/split/audit" <<'PY'
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/*.jsonl") for l in open(f)]
multi = [r for r in lines if r.get("num_turns", 0) > 2]
if not multi:
    sys.exit("no multi-turn trajectory in the audit")
for r in multi:
    m = r.get("response_mask")
    if not m or len(m) != len(r["response_ids"]) or 0 not in m or m[-1] != 1:
        sys.exit(f"uid {r['uid']}: response_mask {m}")
    users = [x for x in r.get("messages", []) if x["role"] == "user" and x["content"] == "Again."
             and x.get("shown", True)]
    # num_turns = answers + model turns + 1, and every answer follows a model turn: answers = (num_turns - 2) / 2
    if len(users) != (r["num_turns"] - 2) // 2:
        sys.exit(f"uid {r['uid']}: {len(users)} answers in messages for num_turns {r['num_turns']}")
print(f"{len(multi)} multi-turn trajectories of {len(lines)}")
PY
)
expect "the split run's audit carries masks and conversations ($out)" $?

# a Python interaction written for verl (tests/fixtures/tools/grade_interaction.py) in a run: it answers in the
# trajectories with its per-trajectory tries, and its scores reach a Python scorer as extra_info.turn_scores (the
# scorer, strict, reads the key and returns the sum): each trajectory's score in the audit is the sum of 0.25 k over
# its answers k. Then on colocated ranks generating as one engine of rollout TP 2: the engine's first rank runs the
# interaction and every rank takes its trajectories' summaries, so the other rank's scorer finds turn_scores too (no
# scorer raises)
cp "$SRC_ROOT/tests/fixtures/tools/grade_interaction.py" "$TMP/"
cat >"$TMP/grade.yaml" <<'EOF'
interaction:
  - name: grader
    class_name: grade_interaction.Grade
    config:
      feedback: Not yet, look again.
EOF
cat >"$TMP/turn_scores.py" <<'EOF'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(extra_info["turn_scores"]))
EOF
PYINT=(actor_rollout_ref.rollout.multi_turn.interaction_config_path="$TMP/grade.yaml"
       custom_reward_function.path="$TMP/turn_scores.py" custom_reward_function.name=compute_score
       trainer.total_training_steps=1)
# pyint_check RUN: its audit's answers are the grader's, in order, and each score the sum of their turn scores
pyint_check() {
    python3 - "$TMP/$1/audit" 2>&1 <<'PY'
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/*.jsonl") for l in open(f)]
answered = 0
for r in lines:
    # every answer scored, one past the response budget too (not shown: the trajectory ended there, as in verl)
    said = [m["content"] for m in r.get("messages", []) if m["role"] == "user"][1:]
    want = [f"Not yet, look again. (try {k})" for k in range(1, len(said) + 1)]
    if said != want:
        sys.exit(f"uid {r['uid']}: answers {said}")
    expect = sum(0.25 * k for k in range(1, len(said) + 1))
    if abs(r["score"] - expect) > 1e-6:
        sys.exit(f"uid {r['uid']}: score {r['score']} for {len(said)} answers (want {expect})")
    answered += len(said) > 0
if not lines or not answered:
    sys.exit(f"{answered} of {len(lines)} trajectories answered")
print(f"{answered} of {len(lines)} trajectories answered, every score the sum of its turn scores")
PY
}
# shellcheck disable=SC2046
"$WORKER" $(common llama) "${MT[@]}" "${PYINT[@]}" trainer.default_local_dir="$TMP/pyint" \
    trainer.rollout_data_dir="$TMP/pyint/audit" >"$TMP/pyint.log" 2>&1
expect "a run with a Python interaction finishes" $?
out=$(pyint_check pyint)
expect "the Python interaction's answers and turn_scores reach the audit and the scorer ($out)" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" "${PYINT[@]}" trainer.default_local_dir="$TMP/pyintrtp" \
    trainer.rollout_data_dir="$TMP/pyintrtp/audit" trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 >"$TMP/pyintrtp.log" 2>&1
expect "a colocated run of one engine of rollout TP 2 with a Python interaction finishes" $?
out=$(pyint_check pyintrtp) && ! grep -aq "raised" "$TMP/pyintrtp.log"
expect "rollout TP 2: the grader's answers and turn_scores reach the scorer on both ranks, none raises ($out)" $?

# a rollout TP group of 2 (the model split over the two rollout ranks): its first rank runs the environment and tells
# the other each answer as it takes it, so both make the same steps; the run reproduces one process's
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 3 "$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/rtp" \
    placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    >"$TMP/rtp.log" 2>&1
expect "split 1+2 multi-turn run on a rollout TP group of 2 finishes" $?
out=$(same_metrics one rtp 2>&1)
expect "rollout TP 2: per-step losses, grad norms, entropies and scores match one process ($out)" $?
out=$(same_weights one rtp)
expect "rollout TP 2: weights after $STEPS steps match one process within 1e-5 ($out)" $?

# every other layout that generates on a split model, validation on (greedy, multi-turn too), against one process:
# colocated DP 2 generating as one engine of rollout TP 2 (each rank a shard of the generation model); the training
# TP 2 group generating as the engine; PP 2 (each rank a whole generation model, an engine of its own); split 2
# trainers of TP 2 or PP 2 + 1 rollout rank (the model copy validates as one). The engine's or copy's first rank runs
# the environment and tells the others each answer
VAL=(trainer.val_before_train=true)
# shellcheck disable=SC2046
"$WORKER" $(common llama) "${MT[@]}" "${VAL[@]}" trainer.default_local_dir="$TMP/onev" \
    trainer.validation_data_dir="$TMP/onev/val" >"$TMP/onev.log" 2>&1
expect "single-process multi-turn run with validation finishes" $?
RTP2=actor_rollout_ref.rollout.tensor_model_parallel_size=2
TP2=actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
PP2=actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
SPLIT=(placement.trainer_ranks=2 placement.rollout_ranks=1)
while IFS="|" read -r name np what keys; do
    # shellcheck disable=SC2046,SC2086 # the keys are words
    "${MPIRUN[@]}" -np "$np" "$WORKER" $(common llama) "${MT[@]}" "${VAL[@]}" trainer.default_local_dir="$TMP/$name" \
        trainer.validation_data_dir="$TMP/$name/val" $keys </dev/null >"$TMP/$name.log" 2>&1
    expect "$what: the multi-turn run finishes" $?
    out=$(same_metrics onev "$name" 2>&1)
    expect "$what: per-step losses, grad norms, entropies, scores and validation match one process ($out)" $?
    out=$(same_weights onev "$name")
    expect "$what: weights after $STEPS steps match one process within 1e-5 ($out)" $?
    # the validation's conversations, answers included, as one process wrote them
    out=$(python3 "$SRC_ROOT/tests/mpi/same_val_dumps.py" "$TMP/onev/val" "$TMP/$name/val" "Again." 2>&1)
    expect "$what: validation's multi-turn responses are one process's ($out)" $?
done <<EOF
colortp|2|colocated DP 2, one engine of rollout TP 2|$RTP2 trainer.nnodes=1 trainer.n_gpus_per_node=2
colotp|2|colocated TP 2 generating as the engine|$TP2 $RTP2 trainer.nnodes=1 trainer.n_gpus_per_node=2
colopp|2|colocated PP 2, an engine per rank|$PP2 trainer.nnodes=1 trainer.n_gpus_per_node=2
splittp|3|split 2+1, trainers of TP 2|$TP2 ${SPLIT[*]}
splitpp|3|split 2+1, trainers of PP 2|$PP2 ${SPLIT[*]}
EOF

# answers slower (1.6 s) than the group's watchdog allows silence (tp_group_timeout_s=1): the head tells its peer it
# still waits every half second, so no rank takes the other for lost
# shellcheck disable=SC2046
GRPO_TEST_ANSWER_DELAY_S=1.6 "${MPIRUN[@]}" -np 3 "$WORKER" $(common llama) "${MT[@]}" \
    trainer.default_local_dir="$TMP/rtpslow" trainer.total_training_steps=1 placement.trainer_ranks=1 \
    placement.rollout_ranks=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.tp_group_timeout_s=1 >"$TMP/rtpslow.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ! grep -q "has moved nothing" "$TMP/rtpslow.log"
expect "rollout TP 2 with tools slower than the group's timeout: the run finishes, no rank taken for lost (rc $rc)" $?

# one-step-off (rollout.mode=async): the rollout of step k+1 overlaps training of step k; it is not the same run,
# but it is a multi-turn one and it finishes
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/async" \
    placement.trainer_ranks=1 placement.rollout_ranks=1 actor_rollout_ref.rollout.mode=async >"$TMP/async.log" 2>&1
expect "one-step-off multi-turn run finishes" $?
out=$(python3 -c "import json,sys; print(max(r.get('num_turns/max', 0) for r in map(json.loads, open(sys.argv[1]))))" \
    "$TMP/async/p/e/metrics.jsonl")
[ "${out%.*}" -gt 2 ] 2>/dev/null
expect "one-step-off trajectories have answers (num_turns/max $out)" $?

# fully-async training (async_training.*): staleness 0 with a push every step is the on-policy split run of the same
# ranks, bit for bit. With partial rollout and a slow engine (GRPO_TEST_DECODE_SLEEP_S), staleness 1, a push every
# step, slow answers (GRPO_TEST_ANSWER_DELAY_S): trajectories go on with the new weights in the middle of their
# model turns and while they wait for answers (their caches recomputed, an answer appended in the phase it comes), check_fully_async.py recomputes the stream, each token's version and
# the staleness in float64, and the replay of its schedule (each trajectory stopped at its recorded tokens, an answer
# held past them for the next version) ends bit-identical with the same schedule. With partial rollout off, staleness
# 1 and a push every 2 steps, whole trajectories of one version each: the same checks
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" trainer.default_local_dir="$TMP/sync11" \
    placement.trainer_ranks=1 placement.rollout_ranks=1 >"$TMP/sync11.log" 2>&1
expect "split 1+1 on-policy multi-turn run finishes" $?
FA=(data.train_batch_size=0 async_training.require_batches=2 placement.trainer_ranks=1 placement.rollout_ranks=1)
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" "${FA[@]}" async_training.staleness_threshold=0 \
    async_training.trigger_parameter_sync_step=1 trainer.default_local_dir="$TMP/fa0" >"$TMP/fa0.log" 2>&1
expect "fully-async multi-turn run, staleness 0, a push every step, finishes" $?
"$COMPARE" "$(ckpt sync11 $STEPS)/actor" "$(ckpt fa0 $STEPS)/actor" 0 >"$TMP/cmp-fa0.txt" 2>&1
expect "fully-async multi-turn, staleness 0 + trigger 1: weights bit-identical to the on-policy 1+1 run ($(cat "$TMP/cmp-fa0.txt"))" $?
# fa_case NAME PARTIAL_FLAG OVERRIDES...: the run, the float64 check (--partial: some trajectory spans versions),
# answers in its trajectories, and its replay bit-identical with the same schedule
fa_case() {
    local name="$1" flag="$2"; shift 2
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np "${NP:-2}" "$WORKER" $(common llama) "${MT[@]}" "${FA[@]}" "$@" trainer.total_training_steps=4 \
        trainer.save_freq=2 trainer.default_local_dir="$TMP/$name" trainer.rollout_data_dir="$TMP/$name/audit" \
        >"$TMP/$name.log" 2>&1
    expect "$name: the fully-async multi-turn run finishes" $?
    python3 "$(dirname "$0")/check_fully_async.py" "$TMP/$name/p/e" "$TMP/$name/audit" "$T" "$S" 4 $flag \
        >"$TMP/check-$name.txt" 2>&1
    expect "$name: float64 check of its stream, versions and staleness ($(tail -1 "$TMP/check-$name.txt"))" $?
    local turns
    turns=$(python3 -c "import json,sys; print(max(r.get('num_turns/max', 0) for r in map(json.loads, open(sys.argv[1]))))" \
        "$TMP/$name/p/e/metrics.jsonl")
    [ "${turns%.*}" -gt 2 ] 2>/dev/null
    expect "$name: trajectories have answers (num_turns/max $turns)" $?
    if [ -n "$flag" ]; then
        local want=any also=""
        if [ "${AT_ANSWER:-1}" = 1 ]; then want=both also=" and while trajectories wait for answers"; fi
        out=$(python3 - "$TMP/$name/audit" "$want" <<'PY'
import glob, json, sys
mid = answer = 0
for f in glob.glob(sys.argv[1] + "/*.jsonl"):
    for r in map(json.loads, open(f)):
        v, m = r.get("policy_versions") or [], r.get("response_mask") or []
        for t in range(1, len(v)):
            if v[t] != v[t - 1] and m:
                mid += m[t] == 1
                answer += m[t] == 0 and m[t - 1] == 1
print(f"{mid} switches in a model turn, {answer} at an answer that came after the push")
sys.exit(0 if mid and (answer or sys.argv[2] == "any") else 1)
PY
)
        expect "$name: versions switch in the middle of model turns$also ($out)" $?
    fi
    # shellcheck disable=SC2046
    GRPO_TEST_DECODE_SLEEP_S=0 GRPO_TEST_ANSWER_DELAY_S=0 "${MPIRUN[@]}" -np "${NP:-2}" "$WORKER" $(common llama) "${MT[@]}" "${FA[@]}" "$@" \
        trainer.total_training_steps=4 trainer.save_freq=2 trainer.default_local_dir="$TMP/${name}r" \
        async_training.replay_schedule="$TMP/$name/p/e/async_schedule.jsonl" >"$TMP/${name}r.log" 2>&1
    expect "$name: the replay of its schedule finishes" $?
    "$COMPARE" "$(ckpt "$name" 4)/actor" "$(ckpt "${name}r" 4)/actor" 0 >"$TMP/cmp-$name.txt" 2>&1
    expect "$name: replay weights bit-identical to the recorded run ($(cat "$TMP/cmp-$name.txt"))" $?
    cmp -s "$TMP/$name/p/e/async_schedule.jsonl" "$TMP/${name}r/p/e/async_schedule.jsonl"
    expect "$name: the replay writes the same schedule" $?
}
T=1 S=1 GRPO_TEST_DECODE_SLEEP_S=0.004 GRPO_TEST_ANSWER_DELAY_S=0.2 fa_case fapartial --partial async_training.staleness_threshold=1 \
    async_training.trigger_parameter_sync_step=1
T=2 S=1 fa_case fawhole "" async_training.partial_rollout=false async_training.staleness_threshold=1 \
    async_training.trigger_parameter_sync_step=2
# the same with partial rollout on a rollout TP group of 2 (verl's retool recipe runs its tool agents on TP 4): the
# head decides each pause and tells its peer each answer (a switch at an answer is likely, not certain, here: three
# processes on two cores leave fewer pushes in a unit)
AT_ANSWER=0 NP=3 T=1 S=1 GRPO_TEST_DECODE_SLEEP_S=0.004 GRPO_TEST_ANSWER_DELAY_S=0.2 fa_case fatp --partial \
    async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1 placement.rollout_ranks=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2

# a fully-async multi-turn run ended at step 2 (its checkpoint drains the stream: the units not yet trained, their
# masks and conversations, go into async_state.bin) and launched again to step 4 resumes its stream; the replay of
# its schedule in one go ends bit-identical
RES=("${FA[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1
    trainer.save_freq=2 trainer.default_local_dir="$TMP/mtres")
# shellcheck disable=SC2046
GRPO_TEST_DECODE_SLEEP_S=0.004 GRPO_TEST_ANSWER_DELAY_S=0.2 "${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" \
    "${RES[@]}" trainer.total_training_steps=2 >"$TMP/mtres.log" 2>&1 &&
    # shellcheck disable=SC2046
    GRPO_TEST_DECODE_SLEEP_S=0.004 GRPO_TEST_ANSWER_DELAY_S=0.2 "${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) \
        "${MT[@]}" "${RES[@]}" trainer.total_training_steps=4 >>"$TMP/mtres.log" 2>&1
expect "a fully-async multi-turn run ended at step 2 and launched again to step 4 finishes" $?
grep -q "fully-async stream resumed from .*global_step_2/async_state.bin" "$TMP/mtres.log"
expect "the stream resumes from the checkpoint's state" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) "${MT[@]}" "${FA[@]}" async_training.staleness_threshold=1 \
    async_training.trigger_parameter_sync_step=1 trainer.save_freq=2 trainer.total_training_steps=4 \
    trainer.default_local_dir="$TMP/mtresr" async_training.replay_schedule="$TMP/mtres/p/e/async_schedule.jsonl" \
    >"$TMP/mtresr.log" 2>&1
expect "the replay of the resumed run's schedule, in one go, finishes" $?
"$COMPARE" "$(ckpt mtres 4)/actor" "$(ckpt mtresr 4)/actor" 0 >"$TMP/cmp-mtres.txt" 2>&1
expect "end + relaunch: weights bit-identical to the replay in one go ($(cat "$TMP/cmp-mtres.txt"))" $?

printf 'tools:\n  - class_name: my.Unknown\n' >"$TMP/bad-tools.yaml"
# shellcheck disable=SC2046
"$WORKER" $(common llama) "${MT[@]}" actor_rollout_ref.rollout.multi_turn.tool_config_path="$TMP/bad-tools.yaml" \
    trainer.default_local_dir="$TMP/bad" >"$TMP/bad.log" 2>&1
chk=$?
[ $chk -ne 0 ] && grep -q "bad-tools.yaml:2:" "$TMP/bad.log"
expect "a tool config that does not load stops the run naming FILE:LINE" $?
finish
