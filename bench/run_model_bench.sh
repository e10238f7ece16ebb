#!/usr/bin/env bash
# Model engine vs PyTorch on this machine, in one run: forward+backward tokens/s (B x S packed tokens,
# loss = sum of next-token log-probs), GFLOP/s against the measured sgemm peak, and greedy decode
# tokens/s with a KV cache at several batch sizes; T threads on both sides (OpenBLAS for us, torch
# intra-op threads for PyTorch). Prints a table of ratios (ours/torch: above 1 we are faster).
#
#   bench/run_model_bench.sh                 # T = 1 and 2, B = 4, S = 256, decode batches 1, 8, 32
#   THREADS=2 ITERS=3 bench/run_model_bench.sh
#   QUICK=1 bench/run_model_bench.sh         # small sizes: checks that everything runs (about a minute)
#   BF16=1 bench/run_model_bench.sh          # also forward+backward with BF16 GEMMs (model_bench --bf16, side
#                                            #   "ours[bf16]") against PyTorch under BF16 autocast ("torch[bf16]")
#
# Environment: THREADS ("1 2"), BATCH (4), SEQLEN (256), WARMUP (1), ITERS (2), DECODE_BATCHES (1,8,32),
# PROMPT_LEN (32), DECODE_STEPS (32), SGEMM_N (1024), OUT (results file, default
# $BUILD_DIR/bench-results/model-<time>.jsonl), and those of bench/bench_common.sh.
# Timings depend on everything else the machine runs: the load average is recorded before and after
# each side and printed with the table.
set -euo pipefail
# shellcheck source=bench/bench_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"

# The whole script is one function, so bash has read all of it before it starts (editing this file while a
# run is in progress cannot change what that run executes).
main() {
    THREADS="${THREADS:-1 2}"
    BATCH="${BATCH:-4}"
    SEQLEN="${SEQLEN:-256}"
    WARMUP="${WARMUP:-1}"
    ITERS="${ITERS:-2}"
    DECODE_BATCHES="${DECODE_BATCHES:-1,8,32}"
    PROMPT_LEN="${PROMPT_LEN:-32}"
    DECODE_STEPS="${DECODE_STEPS:-32}"
    SGEMM_N="${SGEMM_N:-1024}"
    if [ -n "${QUICK:-}" ]; then
        THREADS="${QUICK_THREADS:-1}" BATCH=1 SEQLEN=32 WARMUP=0 ITERS=1 DECODE_BATCHES=1,4 DECODE_STEPS=4 SGEMM_N=256
    fi

    bench_build bench/model_bench worker/grpo-model
    bench_venv torch
    bench_model
    bench_coretypes

    mkdir -p "$BUILD_DIR/bench-results"
    OUT="${OUT:-$BUILD_DIR/bench-results/model-$(date +%Y%m%d-%H%M%S).jsonl}"
    : >"$OUT"
    note() { # what, side, threads
        printf '{"what":"load","when":"%s","side":"%s","threads":%s,"loadavg":"%s","time":"%s"}\n' \
            "$1" "$2" "$3" "$(bench_loadavg)" "$(date -Is)" >>"$OUT"
    }
    args=(--batch "$BATCH" --seqlen "$SEQLEN" --warmup "$WARMUP" --iters "$ITERS" --decode-batches "$DECODE_BATCHES"
        --prompt-len "$PROMPT_LEN" --decode-steps "$DECODE_STEPS" --sgemm-n "$SGEMM_N")
    bench_log "model $BENCH_MODEL; threads: $THREADS; our OpenBLAS kernel sets: $OURS_CORETYPES; results -> $OUT"
    bench_log "load average at start: $(bench_loadavg) on $(nproc) CPUs"
    printf '{"what":"rev","git":"%s","cpu":"%s","cpus":%s}\n' "$(bench_rev)" \
        "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" "$(nproc)" >>"$OUT"
    t_start=$(date +%s)
    for T in $THREADS; do
        for ct in $OURS_CORETYPES; do
            label="$(bench_ours_label "$ct")"
            bench_log "$label, $T thread(s)"
            note before "$label" "$T"
            env "$(bench_ours_env "$ct")" OPENBLAS_NUM_THREADS="$T" \
                "$BUILD_DIR/bench/model_bench" "$BENCH_MODEL" --threads "$T" "${args[@]}" |
                sed "s/\"side\":\"ours\"/\"side\":\"$label\"/" >>"$OUT"
            note after "$label" "$T"
            if [ "$ct" = default ]; then # torch right after our default run, so both see similar load
                bench_log "torch, $T thread(s)"
                note before torch "$T"
                OMP_NUM_THREADS="$T" MKL_NUM_THREADS="$T" "$BENCH_PY" "$BENCH_ROOT/bench/model_bench_torch.py" \
                    "$BENCH_MODEL" --threads "$T" "${args[@]}" 2> >(grep -v -e '^Loading weights' -e 'Warning' >&2) >>"$OUT"
                note after torch "$T"
            fi
        done
        if [ -n "${BF16:-}" ]; then # BF16 GEMMs: forward+backward only (decode stays fp32)
            bf_args=("${args[@]}" --decode-batches 0)
            bench_log "ours[bf16], $T thread(s)"
            note before "ours[bf16]" "$T"
            OPENBLAS_NUM_THREADS="$T" "$BUILD_DIR/bench/model_bench" "$BENCH_MODEL" --threads "$T" "${bf_args[@]}" \
                --bf16 | sed 's/"side":"ours"/"side":"ours[bf16]"/' >>"$OUT"
            note after "ours[bf16]" "$T"
            bench_log "torch[bf16], $T thread(s)"
            note before "torch[bf16]" "$T"
            OMP_NUM_THREADS="$T" MKL_NUM_THREADS="$T" "$BENCH_PY" "$BENCH_ROOT/bench/model_bench_torch.py" \
                "$BENCH_MODEL" --threads "$T" "${bf_args[@]}" --bf16 \
                2> >(grep -v -e '^Loading weights' -e 'Warning' >&2) |
                sed 's/"side": "torch"/"side": "torch[bf16]"/' | grep -v -e '"what": "sgemm"' -e '"what": "env"' >>"$OUT"
            note after "torch[bf16]" "$T"
        fi
    done
    bench_log "done in $(($(date +%s) - t_start)) s; load average at end: $(bench_loadavg)"
    echo
    echo "Model benchmark: SmolLM2-135M-Instruct (fp32, identical weights), $(nproc) CPUs, $(date -Is)"
    "$BENCH_PY" "$BENCH_ROOT/bench/model_bench_report.py" "$OUT"
    echo "results: $OUT"
}

main "$@"; exit
