#!/usr/bin/env bash
# Build and run the test suites (unit, mpi, system, gpu, cluster; not slow).
#   ./scripts/test.sh                 everything but the slow suite
#   ./scripts/test.sh --suite unit    meson test arguments pass through
# Installs missing Debian packages (as root) and fetches the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
# the bundled model: tests that read it skip without it, so fetch it first
if ! GRPO_MODEL_GGUF="$(./scripts/fetch_model.sh)"; then
    echo "warning: could not fetch the bundled model; tests that need it will be skipped" >&2
else
    export GRPO_MODEL_GGUF
fi
# pyarrow, for verl's parquet datasets (tests/system/test_parquet.sh skips without it)
./scripts/parquet_env.sh >/dev/null || echo "warning: could not install pyarrow; the parquet test will be skipped" >&2
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
rc=0
meson test -C build --print-errorlogs --num-processes 2 "$@" || rc=$?
python3 scripts/count_tests.py build/meson-logs/testlog.json || rc=1
exit $rc
