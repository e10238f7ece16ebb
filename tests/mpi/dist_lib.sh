# Sourced by the distributed shell tests: a temporary directory $TMP (removed at exit), mpirun's environment on a
# 2-core machine as root ($MPIRUN), expect NAME RC (counts failures in $fails), and a tiny model with the
# byte-level tokenizer in $TMP/tiny (seed 11, std 0.1) made with $MODEL_TOOL.
# usage: . dist_lib.sh PREFIX
TMP="$(mktemp -d "/tmp/$1.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
fails=0
expect() { if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

"$MODEL_TOOL" init tests/fixtures/tokenizers/bytes-chatml/config.json "$TMP/tiny" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml --seed 11 --std 0.1 >"$TMP/init.log" 2>&1
expect "tiny model initialised" $?
