# shellcheck shell=bash
# The distributed shell tests' layer over tests/lib.sh: mpirun's options on a 2-core machine as root ($MPIRUN),
# and a tiny model with the byte-level tokenizer in $TMP/tiny (seed 11, std 0.1) made with $MODEL_TOOL.
# usage: . dist_lib.sh PREFIX
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" "$1"
test_env
MPIRUN=(mpirun --oversubscribe --bind-to none)
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
