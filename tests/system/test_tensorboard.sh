#!/usr/bin/env bash
# The metrics sinks read back by independent readers: TensorBoard's own
# EventAccumulator and event-file loader for the event files (tags, steps,
# values, and the resume that drops the steps after the checkpoint), Python's
# json module for metrics.jsonl, and xml.etree for metrics.svg.
#
#   test_tensorboard.sh   (the build's test_tensorboard_writer by name, tests/lib.sh)
#
# TensorBoard comes from the venv scripts/tensorboard_env.sh makes (scripts/test.sh runs it before the tests);
# this test installs nothing. Exit 77 (skipped) when that venv is not there.
set -u
if ! py="$("$(dirname "$0")/../../scripts/tensorboard_env.sh" --no-install)"; then
    echo "SKIP: no TensorBoard venv (run scripts/tensorboard_env.sh, as scripts/test.sh does)"
    exit 77
fi

. "$(dirname "$0")/../lib.sh" grpo-tensorboard
writer="$(prog tensorboard-writer)"
run="$TMP/runs/grpo/demo"

if ! "$writer" "$run" 2>"$TMP/stderr"; then
    cat "$TMP/stderr"
    fail "the writer runs"
    finish
fi

TF_CPP_MIN_LOG_LEVEL=3 "$py" - "$run" "$TMP/stderr" <<'PY'
import glob, json, math, os, sys
import xml.etree.ElementTree as ET

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

run, stderr_path = sys.argv[1], sys.argv[2]
fails = 0

def expect(name, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "  " + str(detail)))
    if not ok:
        fails += 1

def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))

# ---- TensorBoard event files
tbdir = os.path.join(run, "tensorboard")
files = sorted(glob.glob(os.path.join(tbdir, "events.out.tfevents.*")))
expect("two event files (fresh run, resumed run)", len(files) == 2, files)
host = os.uname().nodename.replace("/", "_")
expect("event file names end with the host name", all(f.endswith("." + host) for f in files), files)

# the raw loader: every record's CRCs check out and the first event is the file version
events = list(event_file_loader.LegacyEventFileLoader(files[0]).Load())
expect("first event is file_version brain.Event:2", events[0].file_version == "brain.Event:2", events[0])
expect("second event is a SessionLog START at step 0",
       events[1].HasField("session_log") and events[1].session_log.status == 1 and events[1].step == 0, events[1])
n_scalars = sum(len(e.summary.value) for e in events)
expect("run A wrote 1 + 5*10 + 1 scalars", n_scalars == 52, n_scalars)
events_b = list(event_file_loader.LegacyEventFileLoader(files[1]).Load())
expect("run B starts with a SessionLog START at step 4",
       events_b[1].HasField("session_log") and events_b[1].session_log.status == 1 and events_b[1].step == 4,
       events_b[1])

acc = event_accumulator.EventAccumulator(tbdir, size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want_tags = {"critic/score/mean", "critic/score/max", "critic/score/min", "actor/pg_loss", "actor/kl_loss",
             "actor/entropy", "response_length/mean", "perf/throughput", "perf/cpu_memory_used_gb",
             "timing_s/step", "val-core/gsm8k/reward/mean@1"}
expect("scalar tags", tags == want_tags, sorted(tags ^ want_tags))

def series(tag):
    ev = acc.Scalars(tag)
    return [e.step for e in ev], [e.value for e in ev]

steps, vals = series("critic/score/mean")
expect("reward steps 1..6 (steps 4, 5 of run A dropped by the resume)", steps == [1, 2, 3, 4, 5, 6], steps)
expect("reward values: run A up to 3, run B after", close(vals, [0.25, 0.5, 0.75, 11.0, 11.25, 11.5]), vals)
steps, vals = series("critic/score/max")
expect("critic/score/max", close(vals, [0.4, 0.65, 0.9, 11.15, 11.4, 11.65]), vals)
steps, vals = series("actor/kl_loss")
expect("kl values with NaN at step 2", steps == [1, 2, 3, 4, 5, 6]
       and close(vals, [0.001, float("nan"), 0.003, 0.004, 0.005, 0.006]), vals)
steps, vals = series("perf/throughput")
expect("throughput", close(vals, [100, 200, 300, 400, 500, 600]), vals)
steps, vals = series("val-core/gsm8k/reward/mean@1")
expect("validation at steps 0 and 6 (step 5 of run A dropped)", steps == [0, 6] and close(vals, [0.125, 0.5]),
       list(zip(steps, vals)))
steps, vals = series("perf/cpu_memory_used_gb")
expect("cpu memory is a plausible GiB figure", all(0 < v < 1024 for v in vals), vals)
wall = [e.wall_time for e in acc.Scalars("actor/entropy")]
import time
expect("wall times are recent seconds since the epoch", all(abs(w - time.time()) < 3600 for w in wall), wall)

# ---- metrics.jsonl, with Python's json module
rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
expect("metrics.jsonl has steps 0..6 once each", [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6],
       [r["step"] for r in rows])
expect("NaN is written as null", rows[2]["actor/kl_loss"] is None, rows[2].get("actor/kl_loss"))
expect("values read back", abs(rows[4]["critic/score/mean"] - 11.0) < 1e-12 and rows[3]["actor/entropy"] == 2.0 - 0.1 * 3,
       (rows[4].get("critic/score/mean"), rows[3].get("actor/entropy")))
expect("validation merged into step 6", rows[6].get("val-core/gsm8k/reward/mean@1") == 0.5
       and rows[0] == {"step": 0, "val-core/gsm8k/reward/mean@1": 0.125}, rows[0])

# ---- metrics.svg, with a real XML parser
svg = ET.parse(os.path.join(run, "metrics.svg")).getroot()
ns = "{http://www.w3.org/2000/svg}"
expect("SVG root element", svg.tag == ns + "svg", svg.tag)
texts = [t.text for t in svg.iter(ns + "text")]
for title in ["reward", "KL", "entropy", "response length", "throughput (tokens/s)", "tensorboard system test"]:
    expect("SVG has the title " + repr(title), title in texts, texts[:12])
expect("SVG draws lines", len(list(svg.iter(ns + "polyline"))) >= 5)
expect("SVG has no script", not list(svg.iter(ns + "script")))

# ---- the console lines (stderr is not a terminal here: plain lines, no control characters)
err = open(stderr_path, encoding="utf-8").read()
lines = [l for l in err.splitlines() if l.startswith("step ")]
expect("one console line per logged step", len(lines) == 9, lines)
expect("console line content", any(l.startswith("step 6/6 [############] 100% | reward 11.500 (+0.250)")
                                   for l in lines), lines[-2:])
expect("no carriage returns or escapes off a terminal", "\r" not in err and "\x1b" not in err)

sys.exit(1 if fails else 0)
PY
