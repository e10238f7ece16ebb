#!/usr/bin/env bash
# The demo's training (scripts/demo.sh: 2 colocated ranks, the embedded defaults) on several seeds, without grpod,
# one after the other: does a setting learn on every seed, or by chance? For each seed, the greedy validation
# accuracy (exact `#### N`) at every validation step; then the mean, the spread and the least over the seeds at the
# last step. Issue 40 item 0 asks for more than 0.3 at step 40 on 5 seeds, on AVX2 and on AVX-512 CPUs.
#   bench/demo_seeds.sh [SEEDS] [key=value ...]    SEEDS: "1 2 3 4 5" by default; the keys go to every run
#   OUT=DIR                                        where the runs go (default runs/demo-seeds)
#   ISA=avx2                                       compute as a CPU with AVX2 and no AVX-512 does, on this one
# The CPU's name and its vector extensions are printed first: a trajectory depends on the CPU's kernels. A run's
# bits depend on OpenBLAS's kernel set and on the lanes of our few-row products, nothing else of the CPU (our other
# loops compute the same bits on every ISA: tests/unit/test_kernel_isa.c). So ISA=avx2 (OpenBLAS's Haswell kernels,
# which compute what its Zen kernels do, and GRPO_CPU_ISA=avx2) follows an AVX2 machine's run here, bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS="${1:-1 2 3 4 5}"
[ $# -gt 0 ] && shift
OUT="${OUT:-runs/demo-seeds}"
./scripts/build.sh build >/dev/null
gguf="$(./scripts/fetch_model.sh)"
hf="$(dirname "$gguf")/SmolLM2-135M-Instruct"
if [ ! -f "$hf/config.json" ]; then
    build/worker/grpo-model convert "$gguf" "$hf.tmp" && rm -rf "$hf" && mv "$hf.tmp" "$hf"
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1);" \
    "$(grep -o 'avx512[a-z_0-9]*\|avx2\|amx_[a-z0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
case "${ISA:-}" in
"") ;;
avx2) export OPENBLAS_CORETYPE=Haswell GRPO_CPU_ISA=avx2
    echo "== computing as an AVX2 CPU: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE GRPO_CPU_ISA=$GRPO_CPU_ISA" ;;
*) echo "demo_seeds: ISA=$ISA: expected avx2 (or nothing: this CPU's own)" >&2; exit 2 ;;
esac
echo "== keys beside the defaults: ${*:-(none)}"
mkdir -p "$OUT"
for s in $SEEDS; do
    t0=$SECONDS
    mpirun --oversubscribe --bind-to none -np 2 build/worker/grpo-worker actor_rollout_ref.model.path="$hf" \
        trainer.nnodes=1 trainer.n_gpus_per_node=2 data.seed="$s" trainer.default_local_dir="$OUT" \
        trainer.experiment_name="seed$s" "$@" >"$OUT/seed$s.log" 2>&1 ||
        { echo "seed $s: the run failed (exit $?), its log: $OUT/seed$s.log"; continue; }
    echo "seed $s: $((SECONDS - t0)) s"
done
python3 - "$OUT" $SEEDS <<'PY'
import glob, json, math, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
last = []
for s in seeds:
    files = glob.glob(f"{out}/*/seed{s}/metrics.jsonl")
    if not files:
        print(f"seed {s}: no metrics")
        continue
    rows = [json.loads(l) for l in open(files[0]) if l.strip()]
    acc = [(r["step"], v) for r in rows for k, v in r.items()
           if k.startswith("val-core/") and "/acc/mean@" in k and v is not None]
    print(f"seed {s}: " + ", ".join(f"step {st} {a:.3f}" for st, a in acc))
    if acc:
        last.append((acc[-1][0], acc[-1][1]))
if last:
    a = [x[1] for x in last]
    sd = statistics.stdev(a) if len(a) > 1 else float("nan")
    print(f"at step {last[0][0]}: mean {statistics.mean(a):.3f}, standard deviation {sd:.3f} over {len(a)} seeds, "
          f"least {min(a):.3f}, most {max(a):.3f}; above 0.3 on {sum(x > 0.3 for x in a)} of {len(a)}")
PY
