"""check_audit.py DIR N B STEPS: every step has one audit file, STEP.jsonl (as verl writes: whatever the number of
DP ranks, no STEP.dpR.jsonl beside it), holding each of the step's B groups ("group") exactly N times, each group
one prompt, and a "uid" names a prompt: the same uid is the same prompt in every step. Exit 1 naming the first
step that does not."""
import collections
import glob
import json
import sys

d, n, groups, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompt_of = {}
for k in range(1, steps + 1):
    count = collections.Counter()
    uid_of = {}
    split = glob.glob(f"{d}/{k}.dp*.jsonl")
    if split:
        sys.exit(f"step {k}: the step's rollouts are split over {len(split) + 1} files ({split[0]}); want one")
    for f in [f"{d}/{k}.jsonl"]:
        for line in open(f):
            r = json.loads(line)
            count[r["group"]] += 1
            if uid_of.setdefault(r["group"], r["uid"]) != r["uid"]:
                sys.exit(f"step {k}: group {r['group']} holds uids {uid_of[r['group']]} and {r['uid']}")
            if prompt_of.setdefault(r["uid"], r["prompt_ids"]) != r["prompt_ids"]:
                sys.exit(f"step {k}: uid {r['uid']} is another prompt than in an earlier step (not the dataset's uid)")
    if len(count) != groups or any(c != n for c in count.values()):
        sys.exit(f"step {k}: group counts {dict(count)}, want {groups} groups {n} times each")
print(f"every group exactly {n} times in each of {steps} steps, and each uid one prompt")
