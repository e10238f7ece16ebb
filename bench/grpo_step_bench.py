#!/usr/bin/env python3
"""GRPO step benchmark, Python side (bench/run_grpo_bench.sh drives it):

  prompts OUT.jsonl [--n 4] [--seed 1]
        write N synthetic arithmetic prompts in our trainer's JSONL layout
        ({"prompt", "ground_truth", "data_source": "arithmetic"}); both sides read this file
  trl MODEL_DIR PROMPTS.jsonl OUT.jsonl [--threads T] [--steps S] [--n 4] [--micro 4] [--max-new 32]
        run S optimizer steps of TRL's GRPOTrainer on the CPU (float32) with the same settings as
        our trainer and write one JSON line per step: step time and its phases, tokens, lengths
  report OURS_METRICS.jsonl TRL_STEPS.jsonl
        print both sides' phase split and the ratios (ours/TRL) of step time and tokens/s

TRL phases are measured with wrappers around its own methods (nothing in TRL is changed):
  gen       GRPOTrainer._generate_single_turn (transformers generate, left-padded batch)
  gen_total GRPOTrainer._generate_and_score_completions (gen + tokenizing, rewards, advantages,
            and old log-probs when TRL needs them: it skips them when on-policy, as here)
  fwd       GRPOTrainer.compute_loss, summed over the micro-batches (policy forward + loss)
  bwd       accelerator.backward, summed over the micro-batches
  optim     optimizer.step (between the Trainer's pre/post optimizer-step callbacks)
  step      Trainer callbacks on_step_begin .. on_step_end (one optimizer step, generation included)
"""
import argparse
import json
import random
import re
import sys
import time


# ---------------------------------------------------------------- prompts


def make_prompts(out, n, seed):
    """Arithmetic questions in the form our synthetic task uses (1-2 digit operands, + or -,
    non-negative results)."""
    rng = random.Random(seed)
    with open(out, "w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            op = rng.choice("+-")
            if op == "-" and b > a:
                a, b = b, a
            ans = a + b if op == "+" else a - b
            p = f"What is {a} {op} {b}? Reply with only the final number after ####."
            f.write(json.dumps({"prompt": p, "ground_truth": str(ans), "data_source": "arithmetic"}) + "\n")


# ---------------------------------------------------------------- reward (mirrors worker/rewards: arithmetic)

FORMAT_WEIGHT = 0.1  # REWARD_FORMAT_WEIGHT in worker/rewards/scorers.h
_NUM = r"[-+]?\$?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?"


def _to_number(s):
    s = s.strip().rstrip(".").replace("$", "").replace(",", "").replace(" ", "")
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return float(a) / float(b)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def arithmetic_score(text, ground_truth):
    """Our arithmetic scorer: the answer after the last '####' (formatted), else the last \\boxed{}
    (the part after its last '='), else 'answer is X', else the last number in the text; 0.9 for a
    correct number plus 0.1 for the '####' format."""
    answer, formatted = None, False
    hashes = re.findall(r"####[ \t]*(" + _NUM + ")", text)
    if hashes:
        answer, formatted = hashes[-1], True
    else:
        boxed = re.findall(r"\\(?:boxed|fbox)\{([^{}]*)\}", text)
        if boxed:
            answer = boxed[-1].split("=")[-1]
        else:
            m = re.findall(r"answer is[:\s]*(" + _NUM + ")", text, flags=re.IGNORECASE)
            if m:
                answer = m[-1]
            else:
                nums = re.findall(_NUM, text)
                answer = nums[-1] if nums else None
    g = _to_number(ground_truth)
    a = _to_number(answer) if answer is not None else None
    correct = a is not None and g is not None and abs(a - g) <= 1e-9 * max(1.0, abs(a), abs(g))
    return (1.0 - FORMAT_WEIGHT) * (1.0 if correct else 0.0) + FORMAT_WEIGHT * (1.0 if formatted else 0.0)


def reward_arithmetic(completions, ground_truth, **kwargs):
    out = []
    for c, gt in zip(completions, ground_truth):
        text = c[-1]["content"] if isinstance(c, list) else c
        out.append(arithmetic_score(text, gt))
    return out


# ---------------------------------------------------------------- TRL side


def run_trl(a):
    import torch

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(l) for l in open(a.prompts) if l.strip()]
    # conversational prompts: TRL renders them with the tokenizer's chat template and a generation prompt,
    # as our trainer does with a JSONL "prompt" string (one user message)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "ground_truth": r["ground_truth"]}
                            for r in rows])
    n_prompts = len(rows)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)

    ev = {"gen": 0.0, "gen_total": 0.0, "fwd": 0.0, "bwd": 0.0, "optim": 0.0, "tokens": 0, "prompt_tokens": 0,
          "completion_tokens": 0, "n_seq": 0, "t_begin": None, "t_pre_opt": None}
    steps_out = []

    class Timed(GRPOTrainer):
        def _generate_single_turn(self, *args, **kw):
            t0 = time.perf_counter()
            r = super()._generate_single_turn(*args, **kw)
            ev["gen"] += time.perf_counter() - t0
            return r

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            ev["gen_total"] += time.perf_counter() - t0
            pm, cm = out["prompt_mask"], out["completion_mask"]
            ev["prompt_tokens"] += int(pm.sum())
            ev["completion_tokens"] += int(cm.sum())
            ev["n_seq"] += int(cm.shape[0])
            return out

        def compute_loss(self, *args, **kw):
            t0 = time.perf_counter()
            r = super().compute_loss(*args, **kw)
            ev["fwd"] += time.perf_counter() - t0
            return r

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            for k in ("gen", "gen_total", "fwd", "bwd", "optim"):
                ev[k] = 0.0
            for k in ("prompt_tokens", "completion_tokens", "n_seq"):
                ev[k] = 0
            ev["t_begin"] = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            ev["t_pre_opt"] = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            ev["optim"] += time.perf_counter() - ev["t_pre_opt"]

        def on_step_end(self, args, state, control, **kw):
            step = time.perf_counter() - ev["t_begin"]
            tokens = ev["prompt_tokens"] + ev["completion_tokens"]
            rec = {"side": "trl", "step": state.global_step, "threads": a.threads, "timing_s/step": step,
                   "timing_s/gen": ev["gen"], "timing_s/gen_total": ev["gen_total"], "timing_s/fwd": ev["fwd"],
                   "timing_s/bwd": ev["bwd"], "timing_s/optim": ev["optim"],
                   "timing_s/other": step - ev["gen_total"] - ev["fwd"] - ev["bwd"] - ev["optim"],
                   "n_seq": ev["n_seq"], "perf/total_num_tokens": tokens,
                   "perf/throughput": tokens / step if step > 0 else 0.0,
                   "prompt_length/mean": ev["prompt_tokens"] / max(ev["n_seq"], 1),
                   "response_length/mean": ev["completion_tokens"] / max(ev["n_seq"], 1)}
            steps_out.append(rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)

    # one optimizer step covers n_prompts x n completions, in micro-batches of `micro` sequences, generated in
    # one batch (generation_batch_size = per_device_train_batch_size x steps_per_generation)
    total = n_prompts * a.n
    if total % a.micro:
        sys.exit(f"{n_prompts} prompts x n={a.n} is not a multiple of the micro-batch {a.micro}")
    cfg = GRPOConfig(
        output_dir=a.output_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=a.micro,
        gradient_accumulation_steps=total // a.micro,
        num_generations=a.n,
        max_completion_length=a.max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,  # no KL term, no reference model (ours: use_kl_loss=false)
        loss_type="dapo",  # token-level mean over the step's tokens (ours: loss_agg_mode=token-mean)
        scale_rewards="group",  # (r - group mean) / group std (ours: norm_adv_by_std_in_grpo=true)
        epsilon=0.2,
        num_iterations=1,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        gradient_checkpointing=False,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=a.seed,
        disable_dropout=True,
        dataloader_num_workers=0,
    )
    trainer = Timed(model=model, reward_funcs=[reward_arithmetic], args=cfg, train_dataset=ds,
                    processing_class=tok, callbacks=[StepTimer()])
    ckpt = getattr(trainer.model, "is_gradient_checkpointing", None)
    if ckpt is None:
        ckpt = getattr(trainer.model, "is_activation_checkpointing", "?")
    print(f"grpo_step_bench: gradient checkpointing {ckpt}, dtype {next(trainer.model.parameters()).dtype}, "
          f"reference model {'yes' if getattr(trainer, 'ref_model', None) is not None else 'no'}",
          file=sys.stderr, flush=True)
    acc_backward = trainer.accelerator.backward

    def timed_backward(*args, **kw):
        t0 = time.perf_counter()
        r = acc_backward(*args, **kw)
        ev["bwd"] += time.perf_counter() - t0
        return r

    trainer.accelerator.backward = timed_backward
    print(f"grpo_step_bench: TRL {trl.__version__}, transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {n_prompts} prompts x n={a.n}, micro-batch "
          f"{a.micro} x {cfg.gradient_accumulation_steps} accumulation, generation batch {cfg.generation_batch_size}, "
          f"optimizer {cfg.optim}", file=sys.stderr, flush=True)
    trainer.train()
    with open(a.out, "w") as f:
        env = {"side": "trl", "env": True, "trl": trl.__version__, "transformers": transformers.__version__,
               "torch": torch.__version__, "threads": a.threads, "optim": str(cfg.optim),
               "generation_batch_size": cfg.generation_batch_size,
               "gradient_accumulation_steps": cfg.gradient_accumulation_steps}
        f.write(json.dumps(env) + "\n")
        for r in steps_out:
            f.write(json.dumps(r) + "\n")


# ---------------------------------------------------------------- report


def _load(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]


def report(a):
    ours = [r for r in _load(a.ours) if "timing_s/step" in r]
    trl_rows = _load(a.trl)
    trl_env = next((r for r in trl_rows if r.get("env")), {})
    trl = [r for r in trl_rows if "timing_s/step" in r]
    if not ours or not trl:
        sys.exit("report: no step metrics on one side")
    o, t = ours[-1], trl[-1]

    def g(r, k):
        return float(r.get(k, 0.0) or 0.0)

    lab = a.label
    print(f"step {int(o.get('step', len(ours)))} of {len(ours)} ({lab}) and {int(t.get('step', len(trl)))} of "
          f"{len(trl)} (TRL {trl_env.get('trl', '?')}); time rows: {lab}/TRL below 1 means we take less time")
    hdr = f"{'phase (seconds)':<40} {lab:>14} {'TRL':>9} {lab + '/TRL':>16}"
    print(hdr)
    print("-" * len(hdr))
    o_gen, t_gen = g(o, "timing_s/gen"), g(t, "timing_s/gen")
    o_score = g(o, "timing_s/reward") + g(o, "timing_s/adv")
    t_score = g(t, "timing_s/gen_total") - t_gen
    o_old, o_ref = g(o, "timing_s/old_log_prob"), g(o, "timing_s/ref")
    o_upd = g(o, "timing_s/update_actor")
    t_upd = g(t, "timing_s/fwd") + g(t, "timing_s/bwd") + g(t, "timing_s/optim")
    rows = [
        ("generation", o_gen, t_gen),
        ("rewards + advantages (+ TRL's glue)", o_score, t_score),
        ("old log-probs (both skip them on-policy)", o_old, None),
        ("reference log-probs (no KL: none)", o_ref, None),
        ("update: fwd + bwd + optimizer", o_upd, t_upd),
        ("  TRL fwd (compute_loss)", None, g(t, "timing_s/fwd")),
        ("  TRL bwd", None, g(t, "timing_s/bwd")),
        ("  TRL optimizer.step", None, g(t, "timing_s/optim")),
        ("step", g(o, "timing_s/step"), g(t, "timing_s/step")),
    ]
    if len(ours) > 1 and len(trl) > 1:
        rows.append(("first step (warm-up)", g(ours[0], "timing_s/step"), g(trl[0], "timing_s/step")))
    for name, x, y in rows:
        xs = f"{x:14.2f}" if x is not None else f"{'-':>14}"
        ys = f"{y:9.2f}" if y is not None else f"{'-':>9}"
        rs = f"{x / y:16.2f}" if x is not None and y else f"{'':>16}"
        print(f"{name:<40} {xs} {ys} {rs}")
    print("-" * len(hdr))
    ot, tt = g(o, "perf/throughput"), g(t, "perf/throughput")
    print(f"{'tokens/s (prompt + response / step)':<40} {ot:14.1f} {tt:9.1f} {ot / tt if tt else 0:16.2f}"
          f"   <- above 1: we are faster")
    print(f"{'tokens in the step':<40} {g(o, 'perf/total_num_tokens'):14.0f} {g(t, 'perf/total_num_tokens'):9.0f}")
    print(f"{'mean prompt length':<40} {g(o, 'prompt_length/mean'):14.1f} {g(t, 'prompt_length/mean'):9.1f}")
    print(f"{'mean response length':<40} {g(o, 'response_length/mean'):14.1f} {g(t, 'response_length/mean'):9.1f}")
    print(json.dumps({"side": lab, "step_time_ratio": round(g(o, "timing_s/step") / g(t, "timing_s/step"), 4),
                      "tokens_per_s_ratio": round(ot / tt, 4) if tt else None}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("out")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("trl")
    p.add_argument("model")
    p.add_argument("prompts")
    p.add_argument("out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-dir", default="/tmp/grpo-bench-trl")
    p = sub.add_parser("report")
    p.add_argument("ours")
    p.add_argument("trl")
    p.add_argument("--label", default="ours")
    a = ap.parse_args()
    if a.cmd == "prompts":
        make_prompts(a.out, a.n, a.seed)
    elif a.cmd == "trl":
        run_trl(a)
    else:
        report(a)


if __name__ == "__main__":
    main()
