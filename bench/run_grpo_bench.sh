#!/usr/bin/env bash
# One GRPO step of our trainer (grpo-worker, one process) against TRL's GRPOTrainer on this machine,
# in one run, on the same model weights, prompts and settings:
#   N_PROMPTS synthetic arithmetic prompts x N responses (num_generations), at most MAX_NEW new tokens,
#   temperature 1.0, top-p 1, no top-k; micro-batches of MICRO sequences, one optimizer step over all
#   N_PROMPTS x N responses (TRL: per_device_train_batch_size=MICRO, gradient_accumulation_steps=
#   N_PROMPTS*N/MICRO, so generation_batch_size = N_PROMPTS*N, generated in one batch as ours);
#   no KL term (ours use_kl_loss=false, TRL beta=0.0: no reference model on either side); clip 0.2;
#   token-mean loss (TRL loss_type="dapo"); advantages scaled by the group std; AdamW lr 1e-6,
#   weight decay 0, grad clip 1.0, constant schedule; no gradient checkpointing; fp32; THREADS threads
#   (default 1: on a 2-core machine that other work shares, 2 threads per side oversubscribe the cores and
#   torch's spinning OpenMP threads slow down far more than ours; see docs/results/performance.md).
# STEPS steps run on each side (default 2: the first is a warm-up); the table compares the last one.
#
#   bench/run_grpo_bench.sh
#   THREADS=2 STEPS=3 bench/run_grpo_bench.sh
#   QUICK=1 bench/run_grpo_bench.sh          # 2 prompts x 2, 4 new tokens: checks that everything runs
#
# Our side runs with each group's prompt packed once per micro-batch (the default) and, as "ours[whole]", with
# every sequence packed whole as TRL packs them (WHOLE=0 skips that run).
# Environment: THREADS (1), STEPS (2), N_PROMPTS (4), N (4), MAX_NEW (32), MICRO (4), SEED (1), WHOLE (1), and
# those of bench/bench_common.sh. Results go to $BUILD_DIR/bench-results/grpo-<time>/.
set -euo pipefail
# shellcheck source=bench/bench_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

# The whole script is one function, so bash has read all of it before it starts (editing this file while a
# run is in progress cannot change what that run executes).
main() {
    THREADS="${THREADS:-1}"
    STEPS="${STEPS:-2}"
    N_PROMPTS="${N_PROMPTS:-4}"
    N="${N:-4}"
    MAX_NEW="${MAX_NEW:-32}"
    MICRO="${MICRO:-4}"
    SEED="${SEED:-1}"
    if [ -n "${QUICK:-}" ]; then
        N_PROMPTS=2 N=2 MAX_NEW=4 MICRO=2
    fi
    TOTAL=$((N_PROMPTS * N))
    if [ $((TOTAL % MICRO)) -ne 0 ]; then
        echo "run_grpo_bench: N_PROMPTS x N ($TOTAL) must be a multiple of MICRO ($MICRO)" >&2
        exit 2
    fi

    bench_build worker/grpo-worker worker/grpo-model bench/model_bench
    bench_venv trl
    bench_model
    bench_coretypes

    WORK="$BUILD_DIR/bench-results/grpo-$(date +%Y%m%d-%H%M%S)"
    mkdir -p "$WORK"
    "$BENCH_PY" "$BENCH_ROOT/bench/grpo_step_bench.py" prompts "$WORK/prompts.jsonl" --n "$N_PROMPTS" --seed "$SEED"
    LOADS="$WORK/loadavg.txt"
    : >"$LOADS"
    note() { echo "load average $(bench_loadavg) $1 $2 ($(date -Is))" >>"$LOADS"; }
    bench_log "model $BENCH_MODEL; $N_PROMPTS prompts x n=$N, $MAX_NEW new tokens, micro-batch $MICRO, $STEPS steps," \
        "$THREADS thread(s); our OpenBLAS kernel sets: $OURS_CORETYPES; results -> $WORK"
    bench_log "load average at start: $(bench_loadavg) on $(nproc) CPUs"
    echo "build from $(bench_rev)" >"$WORK/rev.txt"

    run_ours() { # coretype label [more overrides]
        local run="$WORK/runs" ct="$1" label="$2"
        shift 2
        note before "$label"
        bench_log "$label: grpo-worker, $STEPS steps"
        if ! env "$(bench_ours_env "$ct")" OPENBLAS_NUM_THREADS="$THREADS" "$BUILD_DIR/worker/grpo-worker" \
            actor_rollout_ref.model.path="$BENCH_MODEL" \
            data.train_files="$WORK/prompts.jsonl" data.val_files="$WORK/prompts.jsonl" \
            data.train_batch_size="$N_PROMPTS" data.max_response_length="$MAX_NEW" data.seed="$SEED" \
            actor_rollout_ref.rollout.n="$N" actor_rollout_ref.rollout.temperature=1.0 \
            actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1 \
            actor_rollout_ref.rollout.max_num_seqs="$TOTAL" \
            actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO" \
            actor_rollout_ref.actor.ppo_mini_batch_size="$N_PROMPTS" \
            actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" \
            actor_rollout_ref.actor.ppo_epochs=1 actor_rollout_ref.actor.use_dynamic_bsz=false \
            actor_rollout_ref.actor.use_kl_loss=false algorithm.use_kl_in_reward=false \
            actor_rollout_ref.actor.clip_ratio=0.2 actor_rollout_ref.actor.loss_agg_mode=token-mean \
            actor_rollout_ref.actor.entropy_coeff=0 algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=true \
            actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.0 \
            actor_rollout_ref.actor.optim.warmup_style=constant actor_rollout_ref.actor.grad_clip=1.0 \
            actor_rollout_ref.model.enable_gradient_checkpointing=false \
            trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
            trainer.resume_mode=disable trainer.num_threads="$THREADS" \
            trainer.default_local_dir="$run" trainer.project_name=bench trainer.experiment_name="$label" "$@" \
            >"$WORK/$label.log" 2>&1; then
            tail -n 20 "$WORK/$label.log" >&2
            echo "run_grpo_bench: grpo-worker failed (log: $WORK/$label.log)" >&2
            exit 1
        fi
        note after "$label"
        cp "$run/bench/$label/metrics.jsonl" "$WORK/$label.metrics.jsonl"
        rm -rf "$run/bench/$label/checkpoints" # the end-of-run checkpoint (outside the timed step): 1.6 GB
    }

    run_trl() {
        note before trl
        bench_log "TRL $TRL_VERSION GRPOTrainer, $STEPS steps"
        if ! OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$BENCH_PY" -W ignore::FutureWarning \
            "$BENCH_ROOT/bench/grpo_step_bench.py" trl "$BENCH_MODEL" "$WORK/prompts.jsonl" "$WORK/trl.jsonl" \
            --threads "$THREADS" --steps "$STEPS" --n "$N" --micro "$MICRO" --max-new "$MAX_NEW" --seed "$SEED" \
            --output-dir "$WORK/trl-out" >"$WORK/trl.log" 2>&1; then
            tail -n 20 "$WORK/trl.log" >&2
            echo "run_grpo_bench: TRL failed (log: $WORK/trl.log)" >&2
            exit 1
        fi
        note after trl
    }

    t_start=$(date +%s)
    labels=()
    for ct in $OURS_CORETYPES; do
        label="$(bench_ours_label "$ct")"
        labels+=("$label")
        run_ours "$ct" "$label"
        if [ "$ct" = default ]; then # TRL right after our default run, so both see similar load
            run_trl
        fi
    done
    if [ "${WHOLE:-1}" = 1 ]; then # the same with every sequence packed whole: what shared prompts save
        labels+=("ours[whole]")
        run_ours default "ours[whole]" actor_rollout_ref.actor.shared_prompt_packing=false
    fi
    if [ -n "${BF16:-}" ]; then
        labels+=("ours[bf16]")
        run_ours default "ours[bf16]" actor_rollout_ref.actor.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16
    fi
    bench_log "done in $(($(date +%s) - t_start)) s; load average at end: $(bench_loadavg)"
    echo
    echo "GRPO step benchmark: SmolLM2-135M-Instruct (fp32), $N_PROMPTS prompts x n=$N, <= $MAX_NEW new tokens," \
        "micro-batch $MICRO, $THREADS thread(s), $(nproc) CPUs, $(date -Is)"
    for label in "${labels[@]}"; do
        echo
        echo "== $label vs TRL"
        "$BENCH_PY" "$BENCH_ROOT/bench/grpo_step_bench.py" report "$WORK/$label.metrics.jsonl" "$WORK/trl.jsonl" \
            --label "$label"
    done
    echo
    cat "$LOADS"
    cat "$WORK/rev.txt"
    echo "results: $WORK"
}

main "$@"; exit
