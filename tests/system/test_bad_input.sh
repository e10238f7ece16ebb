#!/usr/bin/env bash
# Bad input to grpo-worker (issue 12): each case is refused with a message naming the key, field or tensor, or
# (greedy rollout, a huge max_num_seqs) now works; none may hang, exhaust memory or exit 0 having done nothing.
# Usage: test_bad_input.sh   (from the source root; python3 patches files; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-bad-input
clean_fail() { [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ]; } # an error exit: not 0, not a crash, timeout or signal
export OPENBLAS_NUM_THREADS=1

"$MODEL_TOOL" init "$TOK/config.json" "$TMP/tiny" --tokenizer-from "$TOK" >"$TMP/init" 2>&1
expect "tiny model written" $?
n=0
# run NAME OVERRIDES...: a short run of the tiny model in its own directory, output in $TMP/NAME.out, rc in $rc
run() {
    local name="$1"
    shift
    n=$((n + 1))
    (cd "$TMP" && timeout "$(scaled 120)" "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/runs$n" \
        trainer.total_training_steps=2 trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 \
        "$@") >"$TMP/$name.out" 2>&1
    rc=$?
}
# patch FILE PYTHON: rewrite a JSON file in place; the expression edits `d`
patch_json() {
    python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(d, open(sys.argv[1], "w"))
PY
}
# fill FILE VALUE [TENSOR]: set every element of a safetensors F32 tensor (default: all of them) to VALUE
fill() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, value, only = sys.argv[1], float(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    for name, t in json.loads(f.read(n)).items():
        if name != "__metadata__" and t["dtype"] == "F32" and only in (None, name):
            b, e = t["data_offsets"]
            f.seek(8 + n + b)
            f.write(struct.pack("<f", value) * ((e - b) // 4))
PY
}
# model_copy NAME: a copy of the tiny model to break
model_copy() { rm -rf "$TMP/$1" && cp -r "$TMP/tiny" "$TMP/$1"; }

# --- 5: run names stay inside trainer.default_local_dir
run escape trainer.experiment_name=../../escaped
[ $rc -eq 2 ]; expect "experiment_name=../../x exits 2 (got $rc)" $?
says "$TMP/escape.out" "trainer.experiment_name = '../../escaped'"; expect "the error names the key and value" $?
[ ! -e "$TMP/escaped" ]; expect "nothing written outside the run directory" $?
run escape2 trainer.project_name=..
[ $rc -eq 2 ]; expect "project_name=.. exits 2 (got $rc)" $?
says "$TMP/escape2.out" "trainer.project_name"; expect "the error names trainer.project_name" $?

# --- 10: values without a documented meaning
run steps0 trainer.total_training_steps=0
[ $rc -eq 2 ]; expect "total_training_steps=0 exits 2 (got $rc)" $?
says "$TMP/steps0.out" "trainer.total_training_steps = 0"; expect "the error names total_training_steps" $?
run clipc actor_rollout_ref.actor.clip_ratio_c=1
[ $rc -eq 2 ]; expect "clip_ratio_c=1 exits 2 (got $rc)" $?
says "$TMP/clipc.out" "actor_rollout_ref.actor.clip_ratio_c = 1 must be greater than 1"; expect "the error says > 1" $?
"$WORKER" --print-config data.seed >"$TMP/stray.out" 2>&1
rc=$?
[ $rc -eq 2 ]; expect "--print-config with a stray word exits 2 (got $rc)" $?
says "$TMP/stray.out" "'data.seed' is not a key=value override"; expect "the stray word is named" $?
model_copy layers
patch_json "$TMP/layers/config.json" 'd["num_hidden_layers"] = 1'
run layers actor_rollout_ref.model.path="$TMP/layers"
clean_fail; expect "num_hidden_layers below the weights' layers is refused (rc $rc)" $?
says "$TMP/layers.out" "num_hidden_layers is 1, but"; expect "the error names num_hidden_layers and the tensor" $?
model_copy pos0
patch_json "$TMP/pos0/config.json" 'd["max_position_embeddings"] = 0'
run pos0 actor_rollout_ref.model.path="$TMP/pos0"
clean_fail; expect "max_position_embeddings 0 is refused (rc $rc)" $?
says "$TMP/pos0.out" "max_position_embeddings (0) must be positive"; expect "the error names max_position_embeddings" $?

# --- 6: non-finite weights are refused with the tensor's name; a run whose steps all skip ends with the reason
model_copy nan
fill "$TMP/nan/model.safetensors" nan model.layers.0.mlp.up_proj.weight
run nan actor_rollout_ref.model.path="$TMP/nan"
clean_fail; expect "a model with NaN weights is refused (rc $rc)" $?
says "$TMP/nan.out" "tensor 'model.layers.0.mlp.up_proj.weight' holds"; expect "the error names the tensor" $?
run ckpt trainer.total_training_steps=1
ck="$TMP/runs$n/grpo/demo/checkpoints/global_step_1/actor/model.safetensors"
[ $rc -eq 0 ] && [ -f "$ck" ]; expect "a checkpoint to resume from (rc $rc)" $?
fill "$ck" nan model.norm.weight
(cd "$TMP" && timeout "$(scaled 120)" "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/runs$n" \
    trainer.total_training_steps=2 trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0) >"$TMP/resume.out" 2>&1
rc=$?
clean_fail; expect "resuming a NaN checkpoint is refused (rc $rc)" $?
says "$TMP/resume.out" "global_step_1/actor/model.safetensors: tensor 'model.norm.weight'"
expect "the error names the checkpoint's tensor" $?
model_copy huge
fill "$TMP/huge/model.safetensors" 1e30 # finite, but every forward overflows: every gradient is NaN
run skipped actor_rollout_ref.model.path="$TMP/huge" trainer.total_training_steps=20 \
    trainer.max_consecutive_skipped_steps=3
clean_fail; expect "a run whose optimizer steps all skip fails (rc $rc)" $?
says "$TMP/skipped.out" "step 3: 3 consecutive steps skipped their optimizer step"
expect "it stops at step 3 naming the reason" $?
says "$TMP/skipped.out" "trainer.max_consecutive_skipped_steps = 3"; expect "and the key" $?

# --- 7: token ids far past what the tokenizer file defines: an error, not a hang or gigabytes
for id in 2147483600 100000000; do
    model_copy tok
    patch_json "$TMP/tok/tokenizer.json" "d['model']['vocab']['zz'] = $id"
    run tok$id actor_rollout_ref.model.path="$TMP/tok"
    clean_fail; expect "tokenizer id $id is refused (rc $rc)" $?
    says "$TMP/tok$id.out" "model.vocab['zz'] has id $id"; expect "the error names the entry" $?
done

# --- 8: absurd sizes are refused before allocating (or, for max_num_seqs, cost nothing)
run resp data.max_response_length=1048576
clean_fail; expect "max_response_length past the model's positions fails (rc $rc)" $?
says "$TMP/resp.out" "data.max_response_length (1048576)"; expect "the error names the key" $?
says "$TMP/resp.out" "max_position_embeddings (512)"; expect "and the model's positions" $?
# (AddressSanitizer's shadow memory needs terabytes of address space: its build runs without the limit)
vlimit=4000000 within="in 4 GB of address space"
ldd "$WORKER" | grep -q libasan && vlimit=unlimited within="(no address-space limit: AddressSanitizer build)"
(ulimit -v $vlimit; run seqs actor_rollout_ref.rollout.max_num_seqs=1000000; exit $rc)
rc=$?
n=$((n + 1)) # run's count stayed in the subshell
[ $rc -eq 0 ]; expect "max_num_seqs=1000000 runs $within (rc $rc)" $?
run many actor_rollout_ref.rollout.n=65536 data.train_batch_size=1000 actor_rollout_ref.actor.ppo_mini_batch_size=1000 \
    actor_rollout_ref.rollout.max_num_seqs=1000000 data.max_prompt_length=400 data.max_response_length=100
clean_fail; expect "a generation batch larger than the machine fails (rc $rc)" $?
says "$TMP/many.out" "actor_rollout_ref.rollout.max_num_seqs = 1000000"; expect "the error names max_num_seqs" $?
grep -Eq "needs at least [0-9]+ bytes .* the machine has [0-9]+ bytes" "$TMP/many.out"
expect "and the bytes needed and available" $?
model_copy wide
patch_json "$TMP/wide/config.json" 'd["hidden_size"] = 1000000000'
run wide actor_rollout_ref.model.path="$TMP/wide"
clean_fail; expect "hidden_size=1e9 is refused (rc $rc)" $?
grep -Eq "the weights need [0-9]+ bytes \(hidden_size 1000000000.*the machine's memory, [0-9]+ bytes" "$TMP/wide.out"
expect "the error names hidden_size and the bytes" $?

# --- 9: greedy rollout works (argmax sampling, log-probs at temperature 1)
run greedy actor_rollout_ref.rollout.temperature=0
[ $rc -eq 0 ]; expect "temperature=0 trains (rc $rc)" $?
grep -q '^{"step": 2,' "$TMP/runs$n/grpo/demo/metrics.jsonl"
expect "both steps logged" $?

# --- trainer.device=cuda where it cannot run: a machine without a usable GPU, alone and in split roles
run cuda trainer.device=cuda
if grep -q "kernels: cuda" "$TMP/cuda.out"; then
    echo "ok   (a CUDA device is here: the cuda run is the gpu suite's gpu-run test)"
else
    clean_fail; expect "trainer.device=cuda without a usable CUDA device fails (rc $rc)" $?
    # a build with the CUDA back-end names the device it could not use; one without it (the sanitizer build) says so
    want="trainer.device=cuda: cuda"
    grep -q "this build has no CUDA back-end" "$TMP/cuda.out" && want="trainer.device=cuda: device 'cuda': this build has no"
    says "$TMP/cuda.out" "$want"; expect "the error names trainer.device and the device" $?
    ! grep -q '"step"' "$TMP/runs$n/grpo/demo/metrics.jsonl" 2>/dev/null; expect "no step was run" $?
fi
# split runs: trainers (DP, TP, PP, ZeRO-1) and rollout ranks (rollout TP too) run on GPUs
(cd "$TMP" && timeout "$(scaled 120)" mpirun --oversubscribe -np 2 "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" \
    trainer.default_local_dir="$TMP/runs-split" trainer.total_training_steps=2 trainer.nnodes=1 \
    trainer.n_gpus_per_node=1 rollout.nnodes=1 rollout.n_gpus_per_node=1 trainer.device=cuda) >"$TMP/cuda-split.out" 2>&1
rc=$?
if grep -q "kernels: cuda" "$TMP/cuda-split.out"; then
    echo "ok   (a CUDA device is here: split runs on GPUs are the gpu suite's gpu-dist test)"
else
    clean_fail; expect "trainer.device=cuda with separate rollout ranks, without a usable GPU, fails (rc $rc)" $?
    want="trainer.device=cuda: cuda:0: no CUDA device usable"
    grep -q "this build has no CUDA back-end" "$TMP/cuda-split.out" &&
        want="trainer.device=cuda: device 'cuda:0': this build has no"
    says "$TMP/cuda-split.out" "$want"
    expect "the error names trainer.device and the rank's device" $?
fi
finish "$TMP"/*.out
