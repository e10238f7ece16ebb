# shellcheck shell=bash
# Shared by bench/run_model_bench.sh and bench/run_grpo_bench.sh (sourced, not run).
#
# Environment (all optional):
#   BUILD_DIR        meson build directory (default build-bench, configured as a release build if missing)
#   BENCH_VENV       Python venv with the peers (default $BUILD_DIR/.venv-bench)
#   BENCH_PYTHON     interpreter that creates the venv (default python3)
#   OURS_CORETYPES   OpenBLAS kernel sets to run our side with, space-separated; "default" leaves the
#                    environment as it is (OpenBLAS's own detection, or an OPENBLAS_CORETYPE already set).
#                    Default: "default", plus SkylakeX (AVX-512) or Haswell (AVX2) when OpenBLAS falls back
#                    to a generic kernel set on a CPU that has those.

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$BENCH_ROOT/build-bench}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$BENCH_ROOT/$BUILD_DIR" ;; esac
BENCH_VENV="${BENCH_VENV:-$BUILD_DIR/.venv-bench}"

# The peers, pinned: the numbers in docs/results/performance.md were taken with these.
TORCH_VERSION="${TORCH_VERSION:-2.15.0}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-5.24.0}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"

bench_log() { echo "[bench] $*" >&2; }

bench_loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# bench_rev: the commit the build came from, "+modified" when tracked files differ from it (read-only git calls).
bench_rev() {
    local rev
    rev="$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if [ "$rev" != unknown ] && ! git -C "$BENCH_ROOT" diff --quiet HEAD -- 2>/dev/null; then
        rev="$rev+modified"
    fi
    echo "$rev"
}

# bench_build TARGET...: configure (once) and build the named ninja targets.
bench_build() {
    if [ ! -f "$BUILD_DIR/build.ninja" ]; then
        bench_log "configuring $BUILD_DIR (release)"
        meson setup "$BUILD_DIR" "$BENCH_ROOT" -Dbuildtype=release >&2
    fi
    ninja -C "$BUILD_DIR" "$@" >&2
}

# bench_venv torch|trl: the venv with torch and transformers (and TRL too with "trl") at the pinned versions.
bench_venv() {
    local want="torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION"
    local check="import torch, transformers; assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__; assert transformers.__version__ == '$TRANSFORMERS_VERSION', transformers.__version__"
    if [ "${1:-}" = trl ]; then
        want="$want trl==$TRL_VERSION"
        check="$check; import trl; assert trl.__version__ == '$TRL_VERSION', trl.__version__"
    fi
    if [ ! -x "$BENCH_VENV/bin/python" ]; then
        bench_log "creating $BENCH_VENV"
        "${BENCH_PYTHON:-python3}" -m venv "$BENCH_VENV" >&2
    fi
    if ! "$BENCH_VENV/bin/python" -c "$check" >/dev/null 2>&1; then
        bench_log "installing $want into $BENCH_VENV (PyPI; torch brings several GB)"
        # shellcheck disable=SC2086
        "$BENCH_VENV/bin/python" -m pip install --disable-pip-version-check -q $want >&2
        "$BENCH_VENV/bin/python" -c "$check" >&2
    fi
    # shellcheck disable=SC2034 # used by the drivers that source this file
    BENCH_PY="$BENCH_VENV/bin/python"
}

# bench_model: sets BENCH_MODEL to the bundled model in the Hugging Face layout (F32), converting the GGUF
# once with grpo-model convert; both sides load this directory, so their weights are identical.
bench_model() {
    local gguf
    gguf="$("$BENCH_ROOT/scripts/fetch_model.sh" | tail -n 1)"
    BENCH_MODEL="$BUILD_DIR/bench-model/SmolLM2-135M-Instruct"
    if [ ! -f "$BENCH_MODEL/model.safetensors" ] || [ "$gguf" -nt "$BENCH_MODEL/model.safetensors" ]; then
        bench_log "converting $gguf -> $BENCH_MODEL"
        "$BUILD_DIR/worker/grpo-model" convert "$gguf" "$BENCH_MODEL" >&2
    fi
}

# bench_coretypes: sets OURS_CORETYPES (see the top of this file). Needs $BUILD_DIR/bench/model_bench.
bench_coretypes() {
    if [ -n "${OURS_CORETYPES:-}" ]; then
        return
    fi
    OURS_CORETYPES="default"
    local core flags
    core="$("$BUILD_DIR/bench/model_bench" --openblas-core)"
    flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
    case "$core" in
        Prescott | Katmai | Coppermine | Northwood | Core2 | Penryn | Dunnington | Nehalem | Atom | Banias | Yonah)
            if [[ "$flags" == *" avx512f "* ]]; then
                OURS_CORETYPES="default SkylakeX"
            elif [[ "$flags" == *" avx2 "* ]]; then
                OURS_CORETYPES="default Haswell"
            fi
            if [ "$OURS_CORETYPES" != default ]; then
                bench_log "OpenBLAS detects this CPU as '$core' (generic kernels): our side also runs with" \
                    "OPENBLAS_CORETYPE=${OURS_CORETYPES#default }"
            fi
            ;;
    esac
}

# bench_ours_env CORETYPE: the env(1) assignment that selects an OpenBLAS kernel set for our side
# (for "default" a harmless no-op assignment, so callers can always pass it).
bench_ours_env() {
    if [ "$1" = default ]; then
        echo "BENCH_CORETYPE=default"
    else
        echo "OPENBLAS_CORETYPE=$1"
    fi
}

# bench_ours_label CORETYPE: the side's name in the tables.
bench_ours_label() {
    if [ "$1" = default ]; then echo ours; else echo "ours[$1]"; fi
}
