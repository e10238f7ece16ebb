# shellcheck shell=bash
# The GPU shell tests' layer over tests/lib.sh: the device they run on ($DEV: cuda, or GRPO_TEST_DEVICE=cpu to run
# a test's own plumbing on a machine without a GPU), and the skip (exit 77) when no CUDA device is visible, asked of
# the build's test_gpu_kernels --probe ($PROBE, by name).
# usage: . gpu_lib.sh PREFIX
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" "$1"
DEV="${GRPO_TEST_DEVICE:-cuda}"
if [ "$DEV" = cuda ]; then
    PROBE="$(prog gpu-kernels)"
    "$PROBE" --probe 1 >/dev/null 2>&1
    [ $? -eq 77 ] && { echo "no CUDA device visible: skipped"; exit 77; }
fi
# gpu_same_metrics BASE RUN TOL [split]: RUN's per-step metrics (metrics.jsonl) against BASE's (the one-process
# run's), within TOL relative; with "split", each step after the first also moved its weights to a rollout rank
gpu_same_metrics() {
    python3 - "$1" "$2" "$3" "${4:-}" <<'PY'
import json, sys
one = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
two = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
tol, split = float(sys.argv[3]), sys.argv[4] == "split"
assert len(one) == len(two) == 3, (len(one), len(two))
worst = 0
for a, b in zip(one, two):
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
              "response_length/mean", "perf/total_num_tokens"):
        rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-2)
        worst = max(worst, rel)
        if rel > tol:
            sys.exit(f"step {a['step']} {k}: one process {a[k]}, parallel {b[k]} (relative {rel:.2e}, bound {tol:g})")
    # a split run's weights reach the rollout rank every step; colocated ranks generate with them in place
    assert not split or "training/staleness" not in b or b["perf/update_weights_bytes"] > 0 or b["step"] == 1, b
print(f"per-step metrics agree: worst relative difference {worst:.2e} (bound {tol:g})")
PY
}
