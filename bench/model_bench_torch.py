#!/usr/bin/env python3
"""PyTorch side of the model benchmark: the same measurements as bench/model_bench.c, on the same
weights (a Hugging Face directory written by `grpo-model convert`), the same token ids and the
same thread count, in float32 on the CPU. One JSON object per line on stdout, same fields.

  mm        torch.mm GFLOP/s at n^3 (x @ W.T), best of 5: what this torch build's GEMM reaches here
  fwd_bwd   model(ids) over B x S tokens (no padding, no attention mask), loss = sum of next-token
            log-probs, loss.backward(); gradients zeroed (not freed) outside the timing, as ours
  --bf16    fwd_bwd under torch.autocast("cpu", dtype=torch.bfloat16) (fp32 weights, BF16 matrix
            products: the mixed precision our --bf16 runs); the log-softmax in fp32 on both sides
  decode    manual greedy loop with past_key_values (a DynamicCache), one token per sequence per
            step, under torch.inference_mode(); prefill of the P-token prompts is timed apart
"""
import argparse
import contextlib
import json
import sys
import time

import torch


def bench_token(b, t, V):
    """Same as bench_token() in model_bench.c."""
    m = (1 << 64) - 1
    x = (b * 1000003 + t * 7919 + 12345) & m
    x ^= x >> 13
    x = (x * 0x9E3779B1) & m
    x ^= x >> 16
    return 16 + x % (V - 16)


def flops_per_token(cfg, ctx):
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or D // cfg.num_attention_heads
    QD, KD = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_layer = 2 * (D * QD + 2 * D * KD + QD * D + 3 * D * F) + 4 * QD * ctx / 2
    return cfg.num_hidden_layers * per_layer + 2 * V * D


def emit(d):
    print(json.dumps(d), flush=True)


def bench_mm(n, threads):
    a = torch.rand(n, n)
    w = torch.rand(n, n)
    torch.mm(a, w.t())
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, w.t())
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n ** 3 / dt / 1e9)
    emit({"side": "torch", "what": "sgemm", "threads": threads, "n": n, "gflops": round(best, 3)})
    return best


def bench_fwd_bwd(model, B, S, warmup, iters, threads, peak, bf16=False):
    V = model.config.vocab_size
    ids = torch.tensor([[bench_token(b, t, V) for t in range(S)] for b in range(B)], dtype=torch.long)
    model.train()
    times, loss = [], 0.0
    for it in range(warmup + iters):
        model.zero_grad(set_to_none=False)  # no-op before the first backward allocates the grads
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        t0 = time.perf_counter()
        with amp:
            logits = model(input_ids=ids, use_cache=False).logits  # (B, S, V) float32 (bf16 under autocast)
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).sum()
        logp.backward()
        dt = time.perf_counter() - t0
        loss = logp.item()
        del logits, logp
        print(f"  fwd_bwd {'warmup' if it < warmup else 'iter'} {it if it < warmup else it - warmup}: {dt:.3f} s",
              file=sys.stderr, flush=True)
        if it >= warmup:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    N = B * S
    flops = 3.0 * flops_per_token(model.config, S) * N
    emit({"side": "torch", "what": "fwd_bwd", "threads": threads, "batch": B, "seqlen": S, "iters": iters,
          "median_s": round(med, 6), "best_s": round(times[0], 6), "tokens_per_s": round(N / med, 3),
          "gflops": round(flops / med / 1e9, 3), "peak_gflops": round(peak, 3), "loss_sum_logp": round(loss, 6),
          "matmul": "bf16" if bf16 else "fp32"})
    model.zero_grad(set_to_none=True)


def bench_decode(model, B, P, steps, threads):
    import inspect

    from transformers import DynamicCache

    V = model.config.vocab_size
    model.eval()
    # transformers 5.x names the cache argument `cache`, 4.x `past_key_values`; the cache is updated in place
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.tensor([[bench_token(b, t, V) for t in range(P)] for b in range(B)], dtype=torch.long)
    with torch.inference_mode():
        past = DynamicCache()
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: past})
        nxt = out.logits[:, -1].argmax(-1)
        t_prefill = time.perf_counter() - t0
        first = [int(nxt[0])]
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt[:, None], use_cache=True, logits_to_keep=1, **{kw: past})
            nxt = out.logits[:, -1].argmax(-1)
            first.append(int(nxt[0]))
        t_dec = time.perf_counter() - t0
    print(f"  decode batch {B}: prefill {t_prefill:.3f} s, {steps} steps {t_dec:.3f} s", file=sys.stderr, flush=True)
    emit({"side": "torch", "what": "decode", "threads": threads, "batch": B, "prompt_len": P, "steps": steps,
          "prefill_s": round(t_prefill, 6), "decode_s": round(t_dec, 6), "tokens_per_s": round(B * steps / t_dec, 3),
          "greedy0": first[:16]})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="Hugging Face model directory (grpo-model convert output)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--decode-batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--sgemm-n", type=int, default=1024)
    ap.add_argument("--skip-fwd-bwd", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="fwd_bwd under BF16 autocast")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import transformers
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    attn = getattr(model.config, "_attn_implementation", "?")
    print(f"model_bench_torch: loaded {a.model} in {time.perf_counter() - t0:.2f} s, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, attention {attn}, {torch.get_num_threads()} threads",
          file=sys.stderr, flush=True)
    emit({"side": "torch", "what": "env", "threads": a.threads, "torch": torch.__version__,
          "transformers": transformers.__version__, "attn_implementation": attn,
          "blas": "mkl" if torch.backends.mkl.is_available() else "other",
          "mkldnn": torch.backends.mkldnn.is_available()})
    peak = bench_mm(a.sgemm_n, a.threads)
    if not a.skip_fwd_bwd:
        bench_fwd_bwd(model, a.batch, a.seqlen, a.warmup, a.iters, a.threads, peak, a.bf16)
    for tok in a.decode_batches.split(","):
        if tok.strip() and int(tok) > 0:
            bench_decode(model, int(tok), a.prompt_len, a.decode_steps, a.threads)


if __name__ == "__main__":
    main()
