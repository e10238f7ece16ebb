"""Two runs' validation dumps (trainer.validation_data_dir) hold the same responses, and the first's hold answers.

    same_val_dumps.py DIR_A DIR_B ANSWER   exit 0 when every dump file (one a validation step) of A and B lists the same
                                           outputs in the same order and A's outputs contain ANSWER (an interaction's
                                           answer text: the validation was multi-turn) at least once; else 1, saying
                                           how they differ
"""
import glob
import json
import sys


def outputs(d):
    return [[json.loads(line)["output"] for line in open(f)] for f in sorted(glob.glob(d + "/*.jsonl"))]


def main():
    a, b, answer = outputs(sys.argv[1]), outputs(sys.argv[2]), sys.argv[3]
    answered = sum(o.count(answer) for dump in a for o in dump)
    if not a or a != b or not answered:
        sys.exit(f"{len(a)} and {len(b)} dumps, equal: {a == b}, answers in them: {answered}")
    print(f"{sum(map(len, a))} validation responses in {len(a)} dumps, {answered} answers")


main()
