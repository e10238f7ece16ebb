# shellcheck shell=bash
# The one shell library of the system, mpi and gpu suites, sourced by every shell test (directly or through its
# suite's layer: tests/system/grpod_lib.sh, tests/mpi/dist_lib.sh, tests/gpu/gpu_lib.sh).
# usage: . "$(dirname "$0")/../lib.sh" PREFIX
# It gives:
#   $TMP            a fresh temporary directory /tmp/PREFIX.XXXXXX, removed at exit (kept when KEEP_TMP is set);
#                   at exit every background process the test started (and their children) is killed first
#   $SRC_ROOT, $TOK the source tree, and the byte-level tokenizer fixture (tests/fixtures/tokenizers/bytes-chatml)
#   $fails          the failed checks so far; expect NAME STATUS, fail NAME, finish [LOG...]
#   has FILE TEXT, says FILE TEXT, lines_with FILE TEXT, has_lines FILE TEXT N, steps_logged METRICS N
#   wait_for SECONDS CMD..., scaled SECONDS (bounds x GRPO_TEST_TIME_SCALE: timeout "$(scaled N)" CMD),
#   switches PID, ran_since PID COUNT SWITCHES, paused_in_place LOG...
#   track PID       a background process to kill at exit (besides the shell's own jobs); kill_tree PID: now
#   prog NAME       the build's program NAME (grpo-worker, grpod, ...: by name, not passed by position)
#   tiny_run ARRAY DIR [STEPS]  the keys of a tiny run; test_env, tiny_model DIR [SEED [CONFIG]]
#   grpod: start_grpod, stop_grpod, status_field, state_is, field_is, field_at_least, step_at_least (with $GRPOD, $GRPOCTL and $EP set)
# Waits are bounded and FAIL when time runs out: a check that something did not happen follows an observable
# event that proves the run went past the point where it would have happened, never a sleep.
set -u
[ -n "${GRPO_TEST_LIB:-}" ] && return 0 # sourced already (through two suite layers)
GRPO_TEST_LIB=1
SRC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOK="$SRC_ROOT/tests/fixtures/tokenizers/bytes-chatml"
TMP="$(mktemp -d "/tmp/${1:-grpo-test}.XXXXXX")" || { echo "FAIL cannot make a temporary directory"; exit 1; }
fails=0
FAILED_CHECKS=() # their names, repeated after the log tails by finish (a CI log keeps only its end)
FAILED_LOGS=()   # the log written last before each failed check (finish shows them last)
PIDS=()

# descendants PID: the process's children, their children, ... (deepest last)
descendants() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}

LIB_SHELL=$BASHPID
lib_cleanup() {
    # only the test's own shell cleans up: a subshell that runs the trap (bash may, in an asynchronous command's
    # expansions) must not kill the test's processes or remove $TMP
    [ "$BASHPID" = "$LIB_SHELL" ] || return 0
    local p all=()
    for p in "${PIDS[@]}"; do # a tracked process, if it is still the one tracked (not a reused pid)
        [ "$(started "${p%:*}")" = "${p#*:}" ] && all+=("${p%:*}" $(descendants "${p%:*}"))
    done
    for p in $(jobs -p); do
        kill -0 "$p" 2>/dev/null || continue
        all+=("$p" $(descendants "$p"))
    done
    for p in "${all[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ -n "${KEEP_TMP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap lib_cleanup EXIT

# kill_tree PID: SIGKILL a process the test started and every process below it (a job left hanging on purpose)
kill_tree() {
    local p all=("$1" $(descendants "$1"))
    for p in "${all[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait "$1" 2>/dev/null
    return 0
}

# started PID: the process's start time (clock ticks since boot), empty when there is no such process
started() { awk '{ sub(/.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }
# track PID: kill PID (and its children) at exit if it still runs. Its start time is kept with it: on a busy
# machine a pid is reused within minutes (pid_max 32768), and another test's process under a tracked pid that
# ended long ago must not be killed
track() { PIDS+=("$1:$(started "$1")"); }

# expect NAME STATUS: one check, passed when STATUS is 0
# (a failed check also notes the log written last: finish shows it last, next to the summary, where a CI that keeps
# only the output's end still shows it)
expect() {
    if [ "$2" -eq 0 ]; then
        echo "ok   $1"
    else
        echo "FAIL $1"; fails=$((fails + 1)); FAILED_CHECKS+=("$1")
        local newest
        newest="$(ls -t "$TMP"/*.log 2>/dev/null | head -n 1)"
        [ -n "$newest" ] && FAILED_LOGS+=("$newest")
    fi
}
# fail NAME: a failed check
fail() { expect "$1" 1; }

# finish [LOG...]: the summary line; on a failure the tails of LOG... (default: $TMP/*.log) and exit 1, else exit 0
finish() {
    echo "$fails failure(s)"
    [ "$fails" -eq 0 ] && exit 0
    local f g logs=("$@") last=()
    if [ $# -eq 0 ]; then # every log, the ones noted at a failed check last (once each, in the order noted)
        logs=()
        for f in "${FAILED_LOGS[@]}"; do [[ " ${last[*]} " == *" $f "* ]] || last+=("$f"); done
        for f in "$TMP"/*.log; do
            for g in "${last[@]}"; do [ "$f" = "$g" ] && continue 2; done
            logs+=("$f")
        done
    fi
    for f in "${logs[@]}"; do [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 30 "$f"; }; done
    for f in "${last[@]}"; do [ -f "$f" ] && { echo "---- $f (tail; written last before a failed check)"; tail -n 60 "$f"; }; done
    echo "---- $fails failed check(s) of $(basename "$0"), above in full:"
    printf 'FAIL %s\n' "${FAILED_CHECKS[@]}"
    exit 1
}

# has FILE TEXT: FILE contains TEXT (fixed string)
has() { grep -qF -- "$2" "$1"; }
# says FILE TEXT: has, and when TEXT is missing, FILE's tail is shown
says() { has "$1" "$2" || { echo "     missing '$2' in:"; tail -5 "$1" | sed 's/^/     | /'; return 1; }; }
# steps_logged METRICS N: METRICS (a run's metrics.jsonl) holds N steps or more
steps_logged() { [ "$(grep -c . "$1" 2>/dev/null)" -ge "$2" ]; }

# A machine slower than a quiet one, or loaded, gets longer bounds: GRPO_TEST_TIME_SCALE (scripts/test.sh sets it
# from scripts/time_scale.py; default 1) multiplies every bound of wait_for, and the tests write coreutils' timeout
# as `timeout "$(scaled N)" CMD`. A bound is a guard against a hang, never the thing tested: the checks wait on
# events. (Not a shell function named timeout: `timeout ... &` must leave coreutils' timeout in $!, for the tests
# that signal it.)
TIME_SCALE="${GRPO_TEST_TIME_SCALE:-1}"
[[ "$TIME_SCALE" =~ ^[0-9]+(\.[0-9]+)?$ ]] || TIME_SCALE=1
# scaled SECONDS: SECONDS x TIME_SCALE, rounded up to a whole second (SECONDS may have a fraction)
scaled() { awk -v s="$1" -v f="$TIME_SCALE" 'BEGIN { v = s * f; r = int(v); if (r < v) r++; print r }'; }
# wait_for SECONDS CMD...: run CMD until it succeeds (0) or SECONDS (x TIME_SCALE) run out (1)
wait_for() {
    local until=$(( $(date +%s%N) / 1000000 + $(scaled "$1") * 1000 )); shift
    while :; do
        "$@" 2>/dev/null && return 0
        [ $(( $(date +%s%N) / 1000000 )) -ge "$until" ] && return 1
        sleep 0.1 # sleep-ok: the poll interval of a bounded wait
    done
}

# lines_with FILE TEXT: how many lines of FILE hold TEXT (fixed string), 0 when there is no FILE
lines_with() { local n; n=$(grep -cF -- "$2" "$1" 2>/dev/null); echo "${n:-0}"; }
# has_lines FILE TEXT N: FILE holds at least N lines with TEXT
has_lines() { [ "$(lines_with "$1" "$2")" -ge "$3" ]; }

# switches PID: how many times PID's main thread has been scheduled off the CPU
switches() { awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "/proc/$1/task/$1/status" 2>/dev/null; }
# ran_since PID COUNT SWITCHES: PID's main thread was scheduled COUNT more times since it had SWITCHES: proof it
# went on running (through its loop) after an event
ran_since() { [ "$(switches "$1")" -ge $(( $3 + $2 )) ]; }

# The build's programs by name. GRPO_BUILD_ROOT is the build directory the test runs from (tests/meson.build's
# test setups set it; build/ under the checkout when a test is run by hand); prog NAME prints the path of the
# build's program NAME: grpod, grpoctl, grpo-worker, grpo-model, the test programs sim-worker, compare-weights,
# data-stranger, tensorboard-writer, test-comm, ft-ulfm (builds against Open MPI 5), gpu-kernels (CUDA builds),
# link-impair, test-scorer (the test scorers' shared object), and unit/NAME (the unit test NAME's program,
# tests/unit/test_NAME). A program that is not there (not built, or another build directory) is named on stderr;
# its path is printed all the same.
BUILD_ROOT="$(realpath -m "${GRPO_BUILD_ROOT:-$SRC_ROOT/build}")" # absolute: tests run programs from other directories
prog() {
    local p
    case "$1" in
    grpod) p=daemon/grpod ;;
    grpoctl) p=ctl/grpoctl ;;
    grpo-worker) p=worker/grpo-worker ;;
    grpo-model) p=worker/grpo-model ;;
    sim-worker) p=tests/system/sim_worker ;;
    sim-ranks) p=bench/sim_ranks ;;
    compare-weights) p=tests/mpi/compare_weights ;;
    data-stranger) p=tests/mpi/data_stranger ;;
    tensorboard-writer) p=tests/system/test_tensorboard_writer ;;
    test-comm) p=tests/mpi/test_comm ;;
    ft-ulfm) p=tests/ft/test_ulfm ;;
    gpu-kernels) p=tests/gpu/test_gpu_kernels ;;
    link-impair) p=tests/cluster/net/link_impair ;;
    test-scorer) p=worker/rewards/reward_test_scorer.so ;;
    unit/?*) p=tests/unit/test_${1#unit/} ;;
    *) echo "prog: no program named '$1' (tests/lib.sh)" >&2 && return 1 ;;
    esac
    [ -e "$BUILD_ROOT/$p" ] || echo "prog: $1 is not built: no $BUILD_ROOT/$p (GRPO_BUILD_ROOT)" >&2
    echo "$BUILD_ROOT/$p"
}

# The programs most tests run: the build's, by name (a test or its caller may set them first)
: "${WORKER:=$(prog grpo-worker)}" "${MODEL_TOOL:=$(prog grpo-model)}" "${COMPARE:=$(prog compare-weights)}"
: "${SCORER:=$(prog test-scorer)}"

# tiny_run ARRAY DIR [STEPS]: ARRAY gets the keys of a tiny run of the tiny model in $TMP/tiny (tiny_model): 2
# prompts x 2 responses of at most 8 tokens a step, 16 training and 2 validation prompts, no validation, STEPS steps
# (default 4), results under DIR/p/e. Keys given after them override them (the command line's last word wins).
# The question alone (data.synthetic.shots=0): the demo's worked example is for the bundled model; a random tiny
# model with a byte-level tokenizer would only read about 100 more prompt tokens.
tiny_run() {
    local -n tiny_keys_="$1"
    tiny_keys_=(actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$2" trainer.project_name=p
        trainer.experiment_name=e trainer.total_training_steps="${3:-4}" trainer.val_before_train=false
        trainer.test_freq=-1 data.train_batch_size=2 actor_rollout_ref.rollout.n=2
        actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=8 data.synthetic.num_train=16
        data.synthetic.num_val=2 data.synthetic.shots=0)
}

# test_env: one BLAS/OpenMP thread, mpirun as root
test_env() { export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; }

# tiny_model DIR [SEED [CONFIG]]: a tiny random model (std 0.1, default seed 11, default CONFIG the byte-level
# tokenizer's config.json) with the byte-level tokenizer, made in DIR by $MODEL_TOOL; log appended to
# $TMP/init.log; the tool's status
tiny_model() {
    "$MODEL_TOOL" init "${3:-$TOK/config.json}" "$1" --tokenizer-from "$TOK" --seed "${2:-11}" --std 0.1 \
        >>"$TMP/init.log" 2>&1
}

# tiny_moe_model DIR KIND [SEED]: tiny_model's model turned into a mixture of 4 experts, 2 per token, of KIND
# qwen3_moe (renormalised, q/k norms) or mixtral; the tool's status
tiny_moe_model() {
    python3 - "$TOK/config.json" "$2" "$TMP/$2-moe-config.json" <<'PY' || return 1
import json, sys
d = json.load(open(sys.argv[1]))
kind, out = sys.argv[2], sys.argv[3]
if kind == "qwen3_moe":
    d.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, norm_topk_prob=True, head_dim=16, use_sliding_window=False)
else:
    d.update(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=2,
             intermediate_size=32, sliding_window=None)
json.dump(d, open(out, "w"), indent=1)
PY
    tiny_model "$1" "${3:-11}" "$TMP/$2-moe-config.json"
}

# paused_in_place LOG...: each worker (each rank) logging to LOG... paused once and resumed at the very step it
# paused at: no step while paused. Read it after the "resumed at step" lines are there: they are the event that
# ends the pause, so nothing the pause held back can come later.
paused_in_place() {
    cat "$@" | awk '
        { r = match($0, /\[rank [0-9]+\]/) ? substr($0, RSTART, RLENGTH) : "-" }
        match($0, /control: paused at step [0-9]+;/) { p[r]++; ps[r] = substr($0, RSTART + 24) + 0 }
        match($0, /control: resumed at step [0-9]+/) { q[r]++; qs[r] = substr($0, RSTART + 25) + 0 }
        END {
            for (r in q) if (!(r in p)) exit 1
            for (r in p) { n++; if (p[r] != 1 || q[r] != 1 || ps[r] != qs[r]) exit 1 }
            exit n == 0
        }'
}

# ---- grpod ($GRPOD, $GRPOCTL, $EP)

# start_grpod NAME [key=value ...]: grpod with its state in $TMP/NAME.state, log in $TMP/NAME.log, pid in
# GRPOD_PID; waits until it answers (status 1 if it does not within 10 s)
start_grpod() {
    local name="$1"; shift
    "$GRPOD" grpod.endpoint="$EP" grpod.state_dir="$TMP/$name.state" grpod.http_listen=127.0.0.1:0 \
        grpod.heartbeat_interval_s=0.2 grpod.heartbeat_timeout_s=3 "$@" >>"$TMP/$name.log" 2>&1 &
    GRPOD_PID=$!
    track "$GRPOD_PID"
    wait_for 10 "$GRPOCTL" status >/dev/null
}
# stop_grpod [SIGNAL]: end the grpod of start_grpod (SIGTERM by default); its exit status
stop_grpod() { kill "-${1:-TERM}" "$GRPOD_PID" 2>/dev/null; wait "$GRPOD_PID" 2>/dev/null; }

# status_field EXPR: a jq expression over `grpoctl status --json`
status_field() { "$GRPOCTL" status --json 2>/dev/null | jq -r "$1"; }
# state_is STATE: the run is in STATE
state_is() { [ "$(status_field .state)" = "$1" ]; }
# field_is EXPR VALUE: status_field EXPR is VALUE
field_is() { [ "$(status_field "$1")" = "$2" ]; }
# field_at_least EXPR N: status_field EXPR is a number, N or more
field_at_least() { [ "$(status_field "$1")" -ge "$2" ] 2>/dev/null; }
# step_at_least N: grpod reports step N or later
step_at_least() { field_at_least .step "$1"; }
