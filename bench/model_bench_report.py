#!/usr/bin/env python3
"""Table of the model benchmark: reads the JSON lines that model_bench (our side, possibly several
times with different OpenBLAS kernel sets: sides "ours", "ours[SkylakeX]", ...) and
model_bench_torch.py (side "torch") appended to one file, and prints each measurement side by side
with the ratio ours/torch (above 1: we are faster), two agreement checks that show both sides
computed the same thing (loss of the forward, greedy tokens of the decode), and the load averages
recorded around each run."""
import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def find(rows, side, what, **kw):
    for r in rows:
        if r.get("side") == side and r.get("what") == what and all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def fmt(x, spec=".1f"):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def main():
    rows = load(sys.argv[1])
    for r in rows:
        if r.get("what") == "decode" and r.get("prefill_s"):
            r["prefill_tokens_per_s"] = r["batch"] * r["prompt_len"] / r["prefill_s"]
    ours_sides = []
    for r in rows:
        s = r.get("side", "")
        if s.startswith("ours") and s not in ours_sides:
            ours_sides.append(s)
    threads = sorted({r["threads"] for r in rows if r.get("what") == "sgemm"})
    # peers: torch (fp32) and, with BF16=1, torch[bf16] (autocast), the peer of the ours[...bf16] sides
    peers = ["torch"] + (["torch[bf16]"] if any(r.get("side") == "torch[bf16]" for r in rows) else [])

    def peer(s):
        return "torch[bf16]" if "bf16" in s and "torch[bf16]" in peers else "torch"

    cols = ours_sides + peers + [f"{s}/{peer(s)}" for s in ours_sides]
    ws = [max(8, len(c) + 2) for c in cols]
    head = f"{'T':>2}  {'measurement':<46}" + "".join(f"{c:>{w}}" for c, w in zip(cols, ws))
    out = [head, "-" * len(head)]
    checks = []

    def line(T, label, key, what, **kw):
        vals = {s: (find(rows, s, what, threads=T, **kw) or {}).get(key) for s in ours_sides + peers}
        if all(v is None for v in vals.values()):
            return None
        cells = [fmt(vals[s]) for s in ours_sides + peers]
        cells += [fmt(vals[s] / vals[peer(s)], ".2f") if vals[s] and vals[peer(s)] else "-" for s in ours_sides]
        out.append(f"{T:>2}  {label:<46}" + "".join(f"{c:>{w}}" for c, w in zip(cells, ws)))
        return vals

    for T in threads:
        any_s = next((r for r in rows if r.get("what") == "sgemm" and r["threads"] == T), {})
        line(T, f"GEMM GFLOP/s (our sgemm / torch.mm, {any_s.get('n', '?')}^3)", "gflops", "sgemm")
        fb = next((r for r in rows if r.get("what") == "fwd_bwd" and r["threads"] == T), None)
        if fb:
            line(T, f"fwd+bwd tokens/s ({fb['batch']} x {fb['seqlen']} tokens)", "tokens_per_s", "fwd_bwd")
            line(T, "fwd+bwd model GFLOP/s", "gflops", "fwd_bwd")
            cells = []
            for s in ours_sides + peers:
                r = find(rows, s, "fwd_bwd", threads=T)
                cells.append(fmt(r["gflops"] / r["peak_gflops"], ".2f") if r and r.get("peak_gflops") else "-")
            out.append(f"{T:>2}  {'  / its own GEMM GFLOP/s above':<46}" + "".join(f"{c:>{w}}" for c, w in zip(cells, ws)))
            best = max((r["gflops"] for r in rows if r.get("what") == "sgemm" and r["threads"] == T), default=0)
            cells = []
            for s in ours_sides + peers:
                r = find(rows, s, "fwd_bwd", threads=T)
                cells.append(fmt(r["gflops"] / best, ".2f") if r and best else "-")
            out.append(f"{T:>2}  {'  / best GEMM GFLOP/s here (any side)':<46}"
                       + "".join(f"{c:>{w}}" for c, w in zip(cells, ws)))
            for s in ours_sides:
                o, t = find(rows, s, "fwd_bwd", threads=T), find(rows, peer(s), "fwd_bwd", threads=T)
                if o and t:
                    lo, lt = o["loss_sum_logp"], t["loss_sum_logp"]
                    checks.append(f"T={T} {s} vs {peer(s)}, forward loss (sum of next-token log-probs): {lo:.4f} vs "
                                  f"{lt:.4f}, relative difference {abs(lo - lt) / max(abs(lt), 1e-12):.1e}")
        batches = sorted({r["batch"] for r in rows if r.get("what") == "decode" and r["threads"] == T})
        for B in batches:
            d = next(r for r in rows if r.get("what") == "decode" and r["threads"] == T and r["batch"] == B)
            line(T, f"decode tokens/s, batch {B} ({d['steps']} steps)", "tokens_per_s", "decode", batch=B)
            line(T, f"  prefill tokens/s ({B} x {d['prompt_len']}-token prompts)", "prefill_tokens_per_s", "decode",
                 batch=B)
            t = find(rows, "torch", "decode", threads=T, batch=B)
            for s in ours_sides:
                o = find(rows, s, "decode", threads=T, batch=B)
                if o and t:
                    g0, g1 = o["greedy0"], t["greedy0"]
                    n = min(len(g0), len(g1))
                    same = next((i for i in range(n) if g0[i] != g1[i]), n)
                    checks.append(f"T={T} {s} vs torch, decode batch {B}: greedy tokens of sequence 0 agree for "
                                  f"{same}/{n}")
    print("\n".join(out))
    if checks:
        print("\nagreement checks:")
        for c in checks:
            print("  " + c)
    print("\nruns:")
    for r in rows:
        if r.get("what") == "rev":
            print(f"  build from {r.get('git')}, {r.get('cpus')} x {r.get('cpu')}")
    for r in rows:
        if r.get("what") == "env":
            print(f"  torch {r.get('torch')}, transformers {r.get('transformers')}, attention "
                  f"{r.get('attn_implementation')}, BLAS {r.get('blas')}")
            break
    for s in ours_sides:
        r = next((r for r in rows if r.get("side") == s and r.get("what") == "sgemm"), {})
        print(f"  {s}: OpenBLAS kernel set {r.get('openblas_core', '?')}"
              + (f" (OPENBLAS_CORETYPE={r['openblas_coretype_env']})" if r.get("openblas_coretype_env") else ""))
    for r in rows:
        if r.get("what") == "load":
            print(f"  load average {r['loadavg']} {r['when']} {r['side']} T={r['threads']} ({r['time']})")


if __name__ == "__main__":
    main()
