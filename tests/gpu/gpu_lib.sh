# shellcheck shell=bash
# The GPU shell tests' layer over tests/lib.sh, sourced after their arguments are read: the device they run on
# ($DEV: cuda, or GRPO_TEST_DEVICE=cpu to run a test's own plumbing on a machine without a GPU), and the skip
# (exit 77) when no CUDA device is visible, asked of $PROBE (test_gpu_kernels --probe).
# usage: . gpu_lib.sh PREFIX
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" "$1"
DEV="${GRPO_TEST_DEVICE:-cuda}"
if [ "$DEV" = cuda ]; then
    "$PROBE" --probe 1 >/dev/null 2>&1
    [ $? -eq 77 ] && { echo "no CUDA device visible: skipped"; exit 77; }
fi
