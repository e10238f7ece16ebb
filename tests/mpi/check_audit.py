"""check_audit.py DIR N B STEPS: every step's audit files (STEP.jsonl and STEP.dpR.jsonl) hold each of the step's
B groups ("uid") exactly N times. Exit 1 naming the first step that does not."""
import collections
import glob
import json
import sys

d, n, groups, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for k in range(1, steps + 1):
    uids = collections.Counter()
    for f in glob.glob(f"{d}/{k}.jsonl") + glob.glob(f"{d}/{k}.dp*.jsonl"):
        for line in open(f):
            uids[json.loads(line)["uid"]] += 1
    if len(uids) != groups or any(c != n for c in uids.values()):
        sys.exit(f"step {k}: uid counts {dict(uids)}, want {groups} uids {n} times each")
print(f"every uid exactly {n} times in each of {steps} steps")
