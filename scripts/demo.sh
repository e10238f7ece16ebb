#!/usr/bin/env bash
# The main job on its embedded defaults. Installs what it needs, builds, runs.
# Today: checks the configuration and the collective plane across 4 MPI ranks
# with a 2-way tensor-parallel layout; the GRPO trainer lands here next.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="$(./scripts/fetch_model.sh)"
echo "== bundled model: $model"
echo "== effective configuration (embedded defaults)"
build/worker/grpo-worker --print-config
echo "== collective plane: 4 ranks, tp=2"
mpirun --oversubscribe -np 4 build/worker/grpo-worker --selftest --tp 2
