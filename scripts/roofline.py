#!/usr/bin/env python3
"""A roofline model of the CUDA back-end: FLOPs, HBM bytes, kernel launches and host syncs of a GRPO update and of
a decode step, counted op by op from what the code launches (kernels/cuda/backend.c, worker/model/model_layer.c,
model_train.c, model_step.c), for the code as it is today and for the design of issue 43; each op's time is
max(flops / peak, bytes / bandwidth) + launches x overhead + syncs x round trip. Nothing here ran on a GPU: these
are predictions to read the first device run against (docs/results/roofline.md).

    scripts/roofline.py                      the tables of docs/results/roofline.md (0.5B, 1.5B, 7B on one H200)
    scripts/roofline.py --ops 7b             the per-op breakdown of one model (0.5b, 1.5b, 7b or a config.json)
    scripts/roofline.py --bench              the predicted rows of tests/gpu/gpu_bench (scripts/gpu_check.sh)
    scripts/roofline.py --launch-us 3        another launch-overhead assumption (default 4 us)

Variants (--variants, comma-separated; default all four):
    today-fp32   the default: fp32 GEMMs without TF32 (cuBLAS FP32 SIMT), fp32 activations, fp32 KV cache; decode
                 attention batched (one launch per layer per step, the KV append fused; since 2026-12-05); a decode
                 step replayed as a CUDA graph (1 us per kernel in it; since 2026-12-06), its inputs in one copy
    today-bf16   actor.dtype=bfloat16 today: every GEMM call rounds its fp32 activations to BF16 first; the weights
                 come from a BF16 copy kept per weights buffer, made again once after each optimizer step (until
                 2026-12-05 every call rounded its weights too: 8 bytes per parameter per decode step, now 2); a
                 BF16 KV cache (since 2026-12-06: 2 bytes an element, the fp32 cache's 4 before); the training
                 attention on tensor cores, batched BF16 GEMMs per sequence and tile of up to 512 query rows over
                 materialised fp32 scores (until 2026-12-05 the FP32 SIMT flash kernels of today-fp32); decode
                 steps as CUDA graphs, as today-fp32
    designed     issue 43: BF16 weight copies kept (refreshed once per optimizer step), BF16 activations, BF16 KV
                 cache, tensor-core (BF16) flash attention, decode attention batched: one launch per layer per step,
                 decode steps replayed as CUDA graphs
    designed+    designed, plus what this model finds next: fused QKV and gate/up GEMMs with bias and residual in
                 the epilogue, no per-layer host sync (cu_seqlens' maximum known on the host), LM-head chunks of
                 2048 rows
"""
import argparse
import json
import math
import sys

# H200 SXM peaks (dense), and the overheads this model assumes (stated in docs/results/roofline.md)
H200 = {
    "bf16": 989e12,  # tensor cores, dense
    "tf32": 494e12,  # tensor cores, dense (not used by the code: fp32 means fp32)
    "fp32": 67e12,  # SIMT FP32 (no tensor cores): cuBLAS FP32 GEMMs and today's fp32 attention
    "hbm": 4.8e12,  # bytes/s
    "launch": 4e-6,  # s per kernel launch or memcpy call (assumed: 3-5 us)
    "graph": 1e-6,  # s per kernel inside a replayed CUDA graph (assumed)
    "sync": 10e-6,  # s per host round trip (cudaStreamSynchronize after a small copy; assumed)
}

# Qwen2.5's published config.json values (huggingface.co/Qwen/Qwen2.5-{0.5B,1.5B,7B}); the 7B matches
# docs/plan-configs/qwen2.5-7b.json
MODELS = {
    "0.5b": dict(name="Qwen2.5-0.5B", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(name="Qwen2.5-1.5B", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(name="Qwen2.5-7B", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}


class Model:
    def __init__(self, c):
        self.name = c.get("name", c.get("_name_or_path", "model"))
        self.D = c["hidden_size"]
        self.F = c["intermediate_size"]
        self.L = c["num_hidden_layers"]
        self.Hq = c["num_attention_heads"]
        self.Hkv = c.get("num_key_value_heads", self.Hq)
        self.hd = c.get("head_dim", self.D // self.Hq)
        self.V = c["vocab_size"]
        self.tied = bool(c.get("tie_word_embeddings", False))
        mt = c.get("model_type", "qwen2")
        self.bias = c.get("attention_bias", mt == "qwen2")  # Qwen2's q/k/v biases
        self.QD, self.KD = self.Hq * self.hd, self.Hkv * self.hd

    def layer_params(self):
        D, QD, KD, F = self.D, self.QD, self.KD, self.F
        p = D * QD + 2 * D * KD + QD * D + 3 * D * F + 2 * D
        return p + (QD + 2 * KD if self.bias else 0)

    def params(self):
        """Every parameter: the embedding, the layers, the final norm, an untied head (the model cards' count)."""
        return self.V * self.D + self.L * self.layer_params() + self.D + (0 if self.tied else self.V * self.D)

    def matmul_params(self):
        """The weights of every matrix product a token goes through: the layers' and the LM head (the
        embedding is a lookup): the N of 2N FLOPs per token forward and 6N per token trained."""
        return self.L * self.layer_params() + self.V * self.D


def trainer_flops_per_token(m, ctx):
    """worker/trainer/step_metrics.c's flops_per_token: one token's forward at context ctx (causal half);
    perf/mfu/actor = 3 x this x tokens / update time / peak."""
    per_layer = 2 * (m.D * m.QD + 2 * m.D * m.KD + m.QD * m.D + 3 * m.D * m.F) + 4 * m.QD * ctx / 2
    return m.L * per_layer + 2 * m.V * m.D


def lmhead_chunk(V):
    """model_train.c's lmhead_chunk: tokens per LM-head chunk (2^24 logits, 16..256 rows)."""
    fit = (1 << 24) // max(V, 1)
    return 256 if fit > 256 else 16 if fit < 16 else fit


VARIANTS = {
    "today-fp32": dict(gemm="fp32", conv=False, a=4, w=4, attn="fp32", attn_bwd_hd=14, kv=4, batched=True,
                       sync=True, fused=False, chunk=None, graph=True, bf16_copy=False),
    "today-bf16": dict(gemm="bf16", conv=True, a=4, w=2, attn="bf16", attn_bwd_hd=10, kv=2, batched=True,
                       sync=True, fused=False, chunk=None, graph=True, bf16_copy=True, attn_tc=True),
    "designed": dict(gemm="bf16", conv=False, a=2, w=2, attn="bf16", attn_bwd_hd=10, kv=2, batched=True,
                     sync=True, fused=False, chunk=None, graph=True, bf16_copy=True),
    "designed+": dict(gemm="bf16", conv=False, a=2, w=2, attn="bf16", attn_bwd_hd=10, kv=2, batched=True,
                      sync=False, fused=True, chunk=2048, graph=True, bf16_copy=True),
}


class Ops:
    """Ops counted by group and name: flops, HBM bytes, launches, host syncs, and the compute peak they run at."""

    def __init__(self, hw, launch_s):
        self.hw, self.launch_s = hw, launch_s
        self.rows = {}  # (group, name) -> [flops, bytes, launches, syncs, peak, time]
        self.recompute = False  # while set, FLOPs are also counted in recompute_flops (a forward run again)
        self.recompute_flops = 0.0

    def add(self, group, name, flops=0.0, nbytes=0.0, launches=0, syncs=0, peak="fp32", times=1.0):
        t = max(flops / self.hw[peak], nbytes / self.hw["hbm"]) + launches * self.launch_s + syncs * self.hw["sync"]
        r = self.rows.setdefault((group, name), [0.0, 0.0, 0, 0, peak, 0.0])
        if self.recompute:
            self.recompute_flops += flops * times
        r[0] += flops * times
        r[1] += nbytes * times
        r[2] += launches * times
        r[3] += syncs * times
        r[5] += t * times

    def total(self, i):
        return sum(r[i] for r in self.rows.values())

    def time(self):
        return self.total(5)

    def by_group(self):
        g = {}
        for (grp, _), r in self.rows.items():
            g[grp] = g.get(grp, 0.0) + r[5]
        return g


def gemm(o, v, group, name, M, N, K, acc=False, c_bytes=None, a_conv=True, b_conv=True, a_elem=None, b_elem=None,
         times=1.0, weight=False):
    """Row-major C (M, N) = A (M, K) B (K, N) in the variant's precision (backend.c's gemm_rm). Today's BF16 rounds
    each fp32 activation operand into a workspace first (gemm_operand: one launch, 4 bytes read and 2 written per
    element); B a model weight (weight=True) is read from its kept BF16 copy (gemm_weight) where bf16_copy says so."""
    if weight and v["bf16_copy"]:
        b_conv = False
    e_in = 4 if v["gemm"] == "fp32" else 2
    ea = a_elem if a_elem is not None else e_in
    eb = b_elem if b_elem is not None else e_in
    ec = c_bytes if c_bytes is not None else (4 if v["gemm"] == "fp32" or v["conv"] else v["a"])
    if v["conv"]:
        for n, conv in ((M * K, a_conv), (K * N, b_conv)):
            if conv:
                o.add("convert", "fp32 -> BF16 operands", 0, 6.0 * n, 1, times=times)
    peak = "fp32" if v["gemm"] == "fp32" else "bf16"
    nbytes = M * K * ea + K * N * eb + M * N * ec * (2 if acc else 1)
    o.add(group, name, 2.0 * M * N * K, nbytes, 1, peak=peak, times=times)


def ew(o, group, name, nbytes, launches=1, times=1.0):
    """An element-wise or per-row op: memory bound."""
    o.add(group, name, 0, nbytes, launches, times=times)


def tc_tile_rows(L, Hq):
    """kernels/cuda/attention_tc.cu's attention_tc_tile_rows: query rows per tile of a sequence's scores (12 bytes a
    score in the backward, 256 MiB for every head's, 16 to 512 rows)."""
    return min(L, max(16, min(512, (256 << 20) // (12 * Hq * L))))


def attention_tc(o, m, v, seqs, L, backward, times):
    """A BF16 context's attention on tensor cores (backend.c's tc_forward and tc_backward) over seqs sequences of L
    rows: per sequence and tile of its query rows, each product one batched BF16 GEMM (over the KV heads) on
    materialised fp32 scores, the softmax (backward: P and dS) a kernel between them; around them, once a call, the
    operands rounded to BF16 (q and dout into the grouped layout, k, v), out (dq, added) scattered back, the
    backward's D = dout . out, and the host sync of read_seqlens. A tile of E scores: the forward's S = Q K^T writes
    4 bytes a score, the softmax reads them and writes P (2), O = P V reads P; the backward writes S and dP (4 + 4),
    reads both and writes P and dS (2 + 2), and dV += P^T dO, dK += dS^T Q (dv, dk read and written in fp32) and
    dQ = dS K read P once and dS twice. Its FLOPs: every product over the tile's rectangle of rows and keys (the
    masked part of the diagonal tile included): 4 hd a score forward, 10 hd backward."""
    hd, Hq, QD, KD = m.hd, m.Hq, m.QD, m.KD
    N = seqs * L
    g = "attention"
    w = "attention backward" if backward else "attention forward"
    nconv = (2 if backward else 1) * N * QD + 2 * N * KD
    o.add(g, w + ": operands to BF16, %s back" % ("dq" if backward else "out"),
          0, 6.0 * nconv + (12 if backward else 8) * N * QD, 5 if backward else 4, 1 if v["sync"] else 0, times=times)
    if backward:
        ew(o, g, w + ": D = dout . out", 8.0 * N * QD + 4 * N * Hq, times=times)
    rows = tc_tile_rows(L, Hq)
    t = times * seqs
    for i0 in range(0, L, rows):
        i1 = min(L, i0 + rows)
        R = i1 - i0
        E = Hq * R * i1
        fl = 2.0 * E * hd  # one product of the tile
        qb, kb = 2 * R * QD, 2 * i1 * KD  # the tile's BF16 query-side rows; the keys (or values) it sees
        prod = w + ": products (batched BF16 GEMMs)"
        if not backward:
            o.add(g, prod, fl, qb + kb + 4 * E, 1, peak="bf16", times=t)  # S
            ew(o, g, w + ": causal softmax of the fp32 scores", 6 * E + 4 * R * Hq, times=t)
            o.add(g, prod, fl, 2 * E + kb + 4 * R * QD, 1, peak="bf16", times=t)  # O
            continue
        o.add(g, prod, fl, qb + kb + 4 * E, 1, peak="bf16", times=t)  # S
        o.add(g, prod, fl, qb + kb + 4 * E, 1, peak="bf16", times=t)  # dP
        ew(o, g, w + ": P and dS from the fp32 scores", 12 * E + 8 * R * Hq, times=t)
        o.add(g, prod, fl, 2 * E + qb + 8 * i1 * KD, 1, peak="bf16", times=t)  # dV
        o.add(g, prod, fl, 2 * E + qb + 8 * i1 * KD, 1, peak="bf16", times=t)  # dK
        o.add(g, prod, fl, 2 * E + kb + 4 * R * QD, 1, peak="bf16", times=t)  # dQ


def layer_forward(o, m, v, seqs, L, times):
    a, D, QD, KD, F = v["a"], m.D, m.QD, m.KD, m.F
    N, pairs = seqs * L, seqs * L * (L + 1) / 2
    ew(o, "norms, RoPE, SwiGLU, adds", "rmsnorm forward", N * D * 2 * a + N * 4, times=times)
    if v["fused"]:
        gemm(o, v, "layer GEMMs", "qkv (fused, bias in epilogue)", N, QD + 2 * KD, D, times=times, weight=True)
    else:
        for n, out in (("q", QD), ("k", KD), ("v", KD)):
            gemm(o, v, "layer GEMMs", "%s projection" % n, N, out, D, times=times, weight=True)
            if m.bias:
                ew(o, "norms, RoPE, SwiGLU, adds", "bias add", N * out * 2 * a, times=times)
    ew(o, "norms, RoPE, SwiGLU, adds", "rope forward", N * (QD + KD) * 2 * a, 1 if v["fused"] else 2, times=times)
    if v.get("attn_tc"):
        attention_tc(o, m, v, seqs, L, False, times)
    else:
        o.add("attention", "attention forward", 4.0 * m.hd * m.Hq * pairs, N * (2 * QD + 2 * KD) * a + N * m.Hq * 4,
              1, 1 if v["sync"] else 0, v["attn"], times=times)
    gemm(o, v, "layer GEMMs", "o projection", N, D, QD, times=times, weight=True)
    if not v["fused"]:
        ew(o, "norms, RoPE, SwiGLU, adds", "residual add", N * D * 3 * a, times=times)
    ew(o, "norms, RoPE, SwiGLU, adds", "rmsnorm forward", N * D * 2 * a + N * 4, times=times)
    if v["fused"]:
        gemm(o, v, "layer GEMMs", "gate+up (fused)", N, 2 * F, D, times=times, weight=True)
    else:
        gemm(o, v, "layer GEMMs", "gate projection", N, F, D, times=times, weight=True)
        gemm(o, v, "layer GEMMs", "up projection", N, F, D, times=times, weight=True)
    ew(o, "norms, RoPE, SwiGLU, adds", "swiglu forward", N * F * 3 * a, times=times)
    gemm(o, v, "layer GEMMs", "down projection", N, D, F, times=times, weight=True)
    if not v["fused"]:
        ew(o, "norms, RoPE, SwiGLU, adds", "residual add", N * D * 3 * a, times=times)


def linear_backward(o, v, name, N, Din, Dout, bias, times):
    """k_linear_backward: dx (N, Din) += dy W, dW (Dout, Din) += dy^T x into the fp32 gradient, db column sums."""
    gemm(o, v, "layer GEMMs", name + " dx", N, Din, Dout, acc=True, times=times, weight=True)
    # the weight gradient: fp32, read and written (beta = 1); today's BF16 rounds dy again only for dx (one
    # conversion of dy serves both: backend.c converts dy once, W for dx, x for dW)
    gemm(o, v, "layer GEMMs", name + " dW", Dout, Din, N, acc=True, c_bytes=4, a_conv=False, times=times)
    if bias:
        ew(o, "norms, RoPE, SwiGLU, adds", "bias gradient (column sums)", N * Dout * v["a"], 2, times=times)


def layer_backward(o, m, v, seqs, L, times):
    a, D, QD, KD, F = v["a"], m.D, m.QD, m.KD, m.F
    N, pairs = seqs * L, seqs * L * (L + 1) / 2
    zeros = 0 if v["fused"] else 1
    ew(o, "norms, RoPE, SwiGLU, adds", "zero gradient buffers", (3 * N * F + N * D) * 4 * zeros, 4 * zeros, times)
    linear_backward(o, v, "down", N, F, D, False, times)
    ew(o, "norms, RoPE, SwiGLU, adds", "swiglu backward", N * F * 7 * a, times=times)
    if v["fused"]:
        linear_backward(o, v, "gate+up", N, D, 2 * F, False, times)
    else:
        linear_backward(o, v, "gate", N, D, F, False, times)
        linear_backward(o, v, "up", N, D, F, False, times)
    ew(o, "norms, RoPE, SwiGLU, adds", "rmsnorm backward", N * D * 4 * a + N * D * 4, 3, times=times)
    ew(o, "norms, RoPE, SwiGLU, adds", "zero gradient buffers", (2 * N * QD + 2 * N * KD) * 4 * zeros, 4 * zeros,
       times)
    linear_backward(o, v, "o", N, QD, D, False, times)
    # today's fp32: a dot kernel, dk/dv (one block per key tile, recomputing S and dP per query head) and dq
    # (recomputing S and dP again): 14 hd FLOPs per (query, key) pair; a FlashAttention-2 backward recomputes S
    # once: 10 hd
    if v.get("attn_tc"):
        attention_tc(o, m, v, seqs, L, True, times)
    else:
        o.add("attention", "attention backward", v["attn_bwd_hd"] * m.hd * m.Hq * pairs,
              N * (4 * QD + 4 * KD) * a + N * (2 * QD + 2 * KD) * 4, 3, 1 if v["sync"] else 0, v["attn"], times=times)
    ew(o, "norms, RoPE, SwiGLU, adds", "rope backward", N * (QD + KD) * 2 * 4, 1 if v["fused"] else 2, times=times)
    ew(o, "norms, RoPE, SwiGLU, adds", "zero gradient buffers", N * D * 4 * zeros, zeros, times)
    if v["fused"]:
        linear_backward(o, v, "qkv", N, D, QD + 2 * KD, m.bias, times)
    else:
        linear_backward(o, v, "q", N, D, QD, m.bias, times)
        linear_backward(o, v, "k", N, D, KD, m.bias, times)
        linear_backward(o, v, "v", N, D, KD, m.bias, times)
    ew(o, "norms, RoPE, SwiGLU, adds", "rmsnorm backward", N * D * 4 * a + N * D * 4, 3, times=times)


def lm_head(o, m, v, nk, seqs, times):
    """The LM head on the kept rows (nk) of a micro-batch of seqs sequences, forward then backward, in chunks
    (backend.c's cuda_lmhead_forward / _backward: each chunk's logits are recomputed in the backward)."""
    D, V, a = m.D, m.V, v["a"]
    c = v["chunk"] or lmhead_chunk(V)
    chunks = math.ceil(nk / c)
    full, last = divmod(nk, c)
    g = "LM head"
    ew(o, g, "kept rows in and out (a copy per sequence)", 2 * nk * D * a * 2, 2 * seqs, times)
    o.add(g, "targets, dlogp to the device; logp, entropy to the host", 0, 0, 4, 2, times=times)
    if v["conv"]:  # gemm_operand on the whole h, once per call (forward and backward), and W unless kept
        w_conv = 0 if v["bf16_copy"] else 1
        o.add("convert", "fp32 -> BF16 operands", 0, 6.0 * 2 * (nk * D + w_conv * V * D), 2 + 2 * w_conv, times=times)
    cv = dict(v, conv=False)
    for rows, n in ((c, full), (last, 1 if last else 0)):
        if not n:
            continue
        t = times * n
        # forward: z = h W^T (fp32 logits), row max, row sums (+ entropy terms), finalize
        gemm(o, cv, g, "logits (forward)", rows, V, D, c_bytes=4, times=t)
        ew(o, g, "logit statistics and finalize", 2 * rows * V * 4, 3, t)
        # backward: the logits again, their statistics, dlogits in place, dh += dz W, dW += dz^T h (fp32, read
        # and written for every chunk)
        o.recompute = True
        gemm(o, cv, g, "logits (backward recompute)", rows, V, D, c_bytes=4, times=t)
        o.recompute = False
        ew(o, g, "logit statistics and dlogits", 4 * rows * V * 4, 3, t)
        if v["conv"]:
            o.add("convert", "fp32 -> BF16 operands", 0, 6.0 * rows * V, 1, times=t)
        ez = 4 if v["gemm"] == "fp32" else 2
        gemm(o, cv, g, "dh (backward)", rows, D, V, acc=True, c_bytes=4, a_elem=ez, times=t)
        gemm(o, cv, g, "dW (backward, fp32 gradient read and written per chunk)", V, D, rows, acc=True, c_bytes=4,
             a_elem=ez, times=t)
    return chunks


def update(m, wl, vname, hw=H200, launch_s=None):
    """The update_actor phase of a GRPO step: forward and backward of every micro-batch (the layers recomputed in
    the backward under checkpointing) and the optimizer steps. Returns (ops, stats)."""
    v = VARIANTS[vname]
    o = Ops(hw, hw["launch"] if launch_s is None else launch_s)
    S = wl["prompt"] + wl["response"]
    seqs = wl["prompts"] * wl["n"]
    mb = wl["micro"]
    n_micro = math.ceil(seqs / mb)
    N = mb * S  # rows of a micro-batch (whole sequences; no shared-prompt packing on CUDA)
    nk = mb * wl["response"]  # rows whose log-probs are read
    P = m.params()
    for _ in range(m.L):
        layer_forward(o, m, v, mb, S, n_micro)
        if wl["ckpt"]:  # the backward runs the layer's forward again from its saved input
            o.recompute = True
            layer_forward(o, m, v, mb, S, n_micro)
            o.recompute = False
        layer_backward(o, m, v, mb, S, n_micro)
    ew(o, "norms, RoPE, SwiGLU, adds", "embedding forward and backward", N * m.D * (4 + 2 * 4), 2, n_micro)
    ew(o, "norms, RoPE, SwiGLU, adds", "final rmsnorm forward and backward", N * m.D * 6 * v["a"], 4, n_micro)
    o.add("copies and syncs", "ids, targets, positions, cu_seqlens to the device", 0, 0, 4, 0, times=n_micro)
    lm_head(o, m, v, nk, mb, n_micro)
    steps = wl["mini_batches"] * wl["epochs"]
    g = "optimizer"
    ew(o, g, "zero the gradients", P * 4, 1, steps)
    o.add(g, "gradient norm (sum of squares, to the host)", 0, P * 4, 2, 1, times=steps)
    ew(o, g, "gradient clip (scale)", P * 8, 1, steps)
    o.add(g, "AdamW (fp32 p, g, m, v)", 12.0 * P, P * 28, 1, times=steps)
    if v["bf16_copy"]:
        ew(o, g, "BF16 weight copy refreshed", P * 6, 1, steps)
    tokens = seqs * S * wl["epochs"]
    model_flops = 3 * trainer_flops_per_token(m, S) * tokens
    t = o.time()
    return o, dict(time=t, model_flops=model_flops, mfu=model_flops / t / hw["bf16"], tokens=tokens,
                   micro_batches=n_micro, executed_flops=o.total(0), recompute_flops=o.recompute_flops)


def decode(m, B, ctx, vname, hw=H200, launch_s=None):
    """One decode step of B sequences at context ctx each (model_step with one new token per sequence, the
    logits of the last rows, then k_sample on the device). Returns (ops, stats) with the HBM bound: BF16 weights
    read once (the LM head included, the embedding only its B rows) and the BF16 KV cache read once and appended.
    With graphs (model_step.c since 2026-12-06) the step's kernels are one graph's, each at the graph's cost; the
    inputs' copy, the graph's launch and the sampling are launched from the host."""
    v = VARIANTS[vname]
    ls = hw["launch"] if launch_s is None else launch_s
    o = Ops(hw, ls)
    D, QD, KD, F, V, a = m.D, m.QD, m.KD, m.F, m.V, v["a"]
    N = B
    g = "copies and syncs"
    # model_step.c: positions, ids and the batched decode's table (every layer's cache pointers and the lengths)
    o.add(g, "the inputs to the device (one copy)", 0, 0, 1)
    if v["graph"]:
        o.add(g, "the step's graph launched", 0, 0, 1)
        o.launch_s = hw["graph"]  # every kernel below, to the logits, is the graph's
    ew(o, "norms, RoPE, SwiGLU, adds", "embedding", N * D * 4 + N * D * a)
    for _ in range(m.L):
        layer_forward_decode(o, m, v, B, ctx)
    g = "LM head"
    # (each sequence's one new row is x's own: no copy of the last rows)
    ew(o, g, "final rmsnorm", B * D * 2 * a)
    gemm(o, v, g, "logits", B, V, D, c_bytes=4, weight=True)
    o.launch_s = ls
    # sampling: uniforms in, row statistics, keys, pick (top-p/top-k sort skipped at their defaults), tokens
    # and log-probs out, one sync
    o.add("sampling", "k_sample (row stats, keys, pick; tokens to the host)", 0, 3 * B * V * 4, 6, 1)
    weights = 2.0 * (m.L * m.layer_params() + m.V * m.D + m.D) + 2.0 * B * D
    kv = 2.0 * m.L * B * (ctx + 1) * 2 * KD  # K and V of every layer, BF16, read (and the new row written)
    bound = (weights + kv) / hw["hbm"]
    t = o.time()
    return o, dict(time=t, bound=bound, share=bound / t, bw_share=o.total(1) / t / hw["hbm"],
                   tokens_s=B / t, weights_bytes=weights, kv_bytes=kv)


def layer_forward_decode(o, m, v, B, ctx):
    a, D, QD, KD, F = v["a"], m.D, m.QD, m.KD, m.F
    N = B
    g = "norms, RoPE, SwiGLU, adds"
    ew(o, g, "rmsnorm", N * D * 2 * a + N * 4)
    if v["fused"]:
        gemm(o, v, "layer GEMMs", "qkv (fused)", N, QD + 2 * KD, D, weight=True)
    else:
        for n, out in (("q", QD), ("k", KD), ("v", KD)):
            gemm(o, v, "layer GEMMs", "%s projection" % n, N, out, D, weight=True)
            if m.bias:
                ew(o, g, "bias add", N * out * 2 * a)
    ew(o, g, "rope", N * (QD + KD) * 2 * a, 1 if v["fused"] else 2)
    T = ctx + 1
    kvb = v["kv"]
    # each query head reads its KV head's keys and values (the query heads of a group share them through L2:
    # read from HBM once); 4 hd FLOPs per (query, key) pair per head
    flops = 4.0 * m.hd * m.Hq * T * B
    nbytes = B * (T * 2 * KD * kvb + 2 * KD * kvb + 2 * QD * a) + B * m.Hq * math.ceil(T / 256) * (m.hd + 2) * 8
    if v["batched"]:  # append to the cache and attend, every sequence in one launch
        o.add("attention", "decode attention (batched, KV append fused)", flops, nbytes, 1, peak=v["attn"])
    else:  # per sequence: copy k, copy v into its cache, the split-key partials, the merge
        o.add("attention", "decode attention (4 launches per sequence)", flops, nbytes, 4 * B, peak=v["attn"])
    gemm(o, v, "layer GEMMs", "o projection", N, D, QD, weight=True)
    if not v["fused"]:
        ew(o, g, "residual add", N * D * 3 * a)
    ew(o, g, "rmsnorm", N * D * 2 * a + N * 4)
    if v["fused"]:
        gemm(o, v, "layer GEMMs", "gate+up (fused)", N, 2 * F, D, weight=True)
    else:
        gemm(o, v, "layer GEMMs", "gate projection", N, F, D, weight=True)
        gemm(o, v, "layer GEMMs", "up projection", N, F, D, weight=True)
    ew(o, g, "swiglu", N * F * 3 * a)
    gemm(o, v, "layer GEMMs", "down projection", N, D, F, weight=True)
    if not v["fused"]:
        ew(o, g, "residual add", N * D * 3 * a)


def decode_breakeven(m, B, ctx, vname, goal=0.7, hw=H200):
    """The kernels of a decode step and the overhead per kernel at which it would reach `goal` of the HBM bound
    (negative: not even with free launches)."""
    o, st = decode(m, B, ctx, vname, hw=dict(hw, graph=0.0), launch_s=0.0)
    n = o.total(2)
    return n, (st["bound"] / goal - st["time"]) / n


# The workload of the tables: docs/scaling.md's GSM8K-style GRPO batch on one device (prompt and response at
# their lengths), checkpointing where today's fp32 states and activations would not fit (7B)
def workload(key):
    w = dict(prompts=64, n=8, prompt=512, response=1024, micro=4, mini_batches=4, epochs=1, ckpt=False)
    if key == "7b":
        w["ckpt"] = True
    return w


DECODE_CTX = 1024  # the mean context of a decode step: a 512-token prompt and half of a 1024-token response


def load_model(key):
    if key in MODELS:
        return key, Model(MODELS[key])
    with open(key) as f:
        c = json.load(f)
    c.setdefault("name", key)
    return key, Model(c)


def fmt_t(s):
    return "%.3g ms" % (s * 1e3) if s < 1 else "%.3g s" % s


def tables(keys, variants, launch_s):
    out = []
    out.append("Update (update_actor phase): MFU = perf/mfu/actor's FLOPs / predicted time / 989 TFLOP/s")
    out.append("| model | workload | " + " | ".join(variants) + " |")
    out.append("|---|---|" + "---:|" * len(variants))
    for k in keys:
        _, m = load_model(k)
        wl = workload(k)
        cells = []
        for vn in variants:
            _, st = update(m, wl, vn, launch_s=launch_s)
            cells.append("%.1f%% (%s)" % (100 * st["mfu"], fmt_t(st["time"])))
        desc = "%dx%d, %d+%d tokens, micro-batch %d%s" % (wl["prompts"], wl["n"], wl["prompt"], wl["response"],
                                                         wl["micro"], ", recompute" if wl["ckpt"] else "")
        out.append("| %s | %s | %s |" % (m.name, desc, " | ".join(cells)))
    out.append("")
    out.append("Decode step at context %d: share of the HBM bound (BF16 weights + BF16 KV read once); tokens/s" %
               DECODE_CTX)
    out.append("| model | batch | HBM bound | " + " | ".join(variants) + " |")
    out.append("|---|---:|---:|" + "---:|" * len(variants))
    for k in keys:
        _, m = load_model(k)
        for B in (1, 128):
            cells = []
            bound = None
            for vn in variants:
                _, st = decode(m, B, DECODE_CTX, vn, launch_s=launch_s)
                bound = st["bound"]
                cells.append("%.1f%% (%.0f tok/s)" % (100 * st["share"], st["tokens_s"]))
            out.append("| %s | %d | %s | %s |" % (m.name, B, fmt_t(bound), " | ".join(cells)))
    out.append("")
    out.append("Decode: kernels per step, and the overhead per kernel at which a step reaches 70% of the HBM bound")
    out.append("| model | batch | " + " | ".join(variants) + " |")
    out.append("|---|---:|" + "---:|" * len(variants))
    for k in keys:
        _, m = load_model(k)
        for B in (1, 128):
            cells = []
            for vn in variants:
                n, ls = decode_breakeven(m, B, DECODE_CTX, vn)
                cells.append("%d kernels, %s" % (n, "%.2f us" % (ls * 1e6) if ls > 0 else "never"))
            out.append("| %s | %d | %s |" % (m.name, B, " | ".join(cells)))
    return "\n".join(out)


def breakdown(o, title):
    out = [title, "| group | op | GFLOP | GB | launches | syncs | time | share |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    t = o.time()
    for (grp, name), r in sorted(o.rows.items(), key=lambda kv: -kv[1][5]):
        out.append("| %s | %s | %.1f | %.2f | %d | %d | %s | %.1f%% |" % (grp, name, r[0] / 1e9, r[1] / 1e9, r[2],
                                                                        r[3], fmt_t(r[5]), 100 * r[5] / t))
    return "\n".join(out)


def groups_line(o):
    t = o.time()
    return ", ".join("%s %.0f%%" % (g, 100 * s / t) for g, s in sorted(o.by_group().items(), key=lambda kv: -kv[1]))


def bench_rows(launch_s):
    """Predictions for tests/gpu/gpu_bench's rows (the shapes it runs), today's code."""
    hw = H200
    out = ["| gpu_bench row | shape | predicted ms per call | predicted value | what bounds it |",
           "|---|---|---:|---:|---|"]
    for mm, N, Din, Dout in (("fp32", 8192, 4096, 4096), ("bf16", 8192, 4096, 4096), ("bf16", 16384, 4096, 14336)):
        v = VARIANTS["today-" + mm]
        o = Ops(hw, launch_s)
        gemm(o, v, "g", "fwd", N, Dout, Din)
        gemm(o, v, "g", "dx", N, Din, Dout, acc=True, a_conv=True)
        gemm(o, v, "g", "dW", Dout, Din, N, acc=True, c_bytes=4, a_conv=False)
        t = o.time()
        fl = 6.0 * N * Din * Dout
        out.append("| linear fwd+bwd, %s GEMMs | N=%d Din=%d Dout=%d | %.3f | %.0f TFLOP/s (%.1f%% of BF16 peak) | %s |"
                   % ("BF16" if mm == "bf16" else "fp32", N, Din, Dout, t * 1e3, fl / t / 1e12,
                      100 * fl / t / hw["bf16"], "FP32 SIMT peak" if mm == "fp32" else "BF16 peak + conversions"))
    B, L, Hq, Hkv, hd = 4, 2048, 32, 8, 128
    pairs = B * L * (L + 1) / 2
    for what, f_hd, rep in (("attention fwd (fp32 SIMT)", 4, 4), ("attention bwd (fp32 SIMT)", 14, 10)):
        fl = f_hd * hd * Hq * pairs
        t = fl / hw["fp32"] + launch_s + hw["sync"]
        # gpu_bench reports 4 hd (forward) and 10 hd (backward) FLOPs per pair: its TFLOP/s is of those
        out.append("| %s | B=%d L=%d Hq=%d Hkv=%d hd=%d | %.3f | %.0f TFLOP/s as gpu_bench counts (%.1f%%) | FP32 SIMT "
                   "peak, %d hd FLOPs executed per pair |" % (what, B, L, Hq, Hkv, hd, t * 1e3,
                                                              rep * hd * Hq * pairs / t / 1e12,
                                                              100 * rep * hd * Hq * pairs / t / hw["bf16"], f_hd))
    # today-bf16's attention on the same shape: gpu_bench's BF16 context, each call a host sync and the tiles' launches
    m = Model(dict(hidden_size=Hq * hd, intermediate_size=1, num_hidden_layers=1, num_attention_heads=Hq,
                   num_key_value_heads=Hkv, head_dim=hd, vocab_size=1))
    for what, backward, rep in (("attention fwd (BF16 tensor cores)", False, 4), ("attention bwd (BF16 tensor cores)",
                                                                                 True, 10)):
        o = Ops(hw, launch_s)
        attention_tc(o, m, VARIANTS["today-bf16"], B, L, backward, 1.0)
        t = o.time()
        out.append("| %s | B=%d L=%d Hq=%d Hkv=%d hd=%d | %.3f | %.0f TFLOP/s as gpu_bench counts (%.1f%%) | HBM (%.1f GB, "
                   "the scores most of it), %d launches |" % (what, B, L, Hq, Hkv, hd, t * 1e3,
                                                             rep * hd * Hq * pairs / t / 1e12,
                                                             100 * rep * hd * Hq * pairs / t / hw["bf16"],
                                                             o.total(1) / 1e9, o.total(2)))
    for Tk in (8192, 32768):
        Hq, Hkv, hd = 32, 8, 128
        nbytes = 2.0 * Tk * Hkv * hd * 4
        t = nbytes / hw["hbm"] + 2 * launch_s
        out.append("| attention_cached decode (fp32 KV) | Tq=1 Tk=%d Hq=%d Hkv=%d hd=%d | %.3f | %.0f GB/s (%.1f%%) "
                   "| HBM, 2 launches (KV heads shared through L2) |" % (Tk, Hq, Hkv, hd, t * 1e3, nbytes / t / 1e9,
                                                                         100 * nbytes / t / hw["hbm"]))
    return "\n".join(out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", metavar="MODEL", help="per-op breakdown of one model (0.5b, 1.5b, 7b or a config.json)")
    ap.add_argument("--bench", action="store_true", help="predicted rows of tests/gpu/gpu_bench")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    ap.add_argument("--launch-us", type=float, default=H200["launch"] * 1e6, help="launch overhead (default 4)")
    ap.add_argument("--batch", type=int, default=1, help="with --ops: the decode batch (default 1)")
    ap.add_argument("--workload", metavar="K=V,...",
                    help="with --ops: the update's workload changed, e.g. prompts=8,n=8,prompt=64,response=64,"
                         "micro=4,mini_batches=1,ckpt=0 (defaults: 64 prompts x 8, 512 + 1024 tokens, micro-batch 4, "
                         "4 optimizer steps, recompute for 7B only)")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    for vn in variants:
        if vn not in VARIANTS:
            ap.error("unknown variant %s (one of %s)" % (vn, ", ".join(VARIANTS)))
    ls = args.launch_us * 1e-6
    if args.bench:
        print(bench_rows(ls))
        return 0
    if args.ops:
        key, m = load_model(args.ops)
        wl = workload(key)
        for kv in (args.workload.split(",") if args.workload else []):
            k, _, val = kv.partition("=")
            if k not in wl:
                ap.error("unknown workload key %s (one of %s)" % (k, ", ".join(wl)))
            wl[k] = int(val)
        for vn in variants:
            o, st = update(m, wl, vn, launch_s=ls)
            print(breakdown(o, "\n%s, update, %s: %s, MFU %.1f%% (%s)" % (m.name, vn, fmt_t(st["time"]),
                                                                        100 * st["mfu"], groups_line(o))))
            o, st = decode(m, args.batch, DECODE_CTX, vn, launch_s=ls)
            print(breakdown(o, "\n%s, decode batch %d at context %d, %s: %s a step, %.1f%% of the HBM bound "
                               "(%s), %.1f%% of HBM bandwidth used (%s)" %
                            (m.name, args.batch, DECODE_CTX, vn, fmt_t(st["time"]), 100 * st["share"],
                             fmt_t(st["bound"]), 100 * st["bw_share"], groups_line(o))))
        return 0
    print("Assumed: H200 %.0f TFLOP/s BF16, %.0f FP32 SIMT, %.1f TB/s HBM; %.1f us a launch, %.0f us a host sync, "
          "%.0f us a kernel in a CUDA graph" % (H200["bf16"] / 1e12, H200["fp32"] / 1e12, H200["hbm"] / 1e12,
                                                args.launch_us, H200["sync"] * 1e6, H200["graph"] * 1e6))
    print(tables(list(MODELS), variants, ls))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
