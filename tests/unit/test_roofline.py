#!/usr/bin/env python3
"""scripts/roofline.py counts what it should: the Qwen2.5 parameter counts of the model cards, a hand-worked tiny
model's FLOPs, bytes and launches, the time formula, and agreement with the standard approximations (6 N FLOPs a
trained token, 2 N a forward token) on attention-light shapes.

    tests/unit/test_roofline.py [SOURCE_ROOT]
"""
import importlib.util
import json
import os
import sys
import unittest

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
_spec = importlib.util.spec_from_file_location("roofline", os.path.join(ROOT, "scripts", "roofline.py"))
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

# A tiny Llama-style model (no biases, tied head): hidden 4, 2 query heads and 1 KV head of 2, MLP 8, vocabulary 16
TINY = dict(name="tiny", model_type="llama", hidden_size=4, intermediate_size=8, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, vocab_size=16, tie_word_embeddings=True)
# one sequence of a 1-token prompt and a 2-token response, one micro-batch, one optimizer step
TINY_WL = dict(prompts=1, n=1, prompt=1, response=2, micro=1, mini_batches=1, epochs=1, ckpt=False)


def row(o, group, name):
    return o.rows[(group, name)]


class Counts(unittest.TestCase):
    def test_model_card_parameters(self):
        # huggingface.co/Qwen/Qwen2.5-*: 0.49B (0.36B non-embedding), 1.54B (1.31B), 7.61B (6.53B); the 7B is
        # also the planner's count (docs/scaling.md)
        for key, total, non_embed in (("0.5b", 494032768, 357898112), ("1.5b", 1543714304, 1310340608),
                                      ("7b", 7615616512, 6525621760)):
            m = R.Model(R.MODELS[key])
            self.assertEqual(m.params(), total, key)
            head = 0 if m.tied else m.V * m.D
            self.assertEqual(m.params() - m.V * m.D - head, non_embed, key)

    def test_7b_matches_plan_config(self):
        with open(os.path.join(ROOT, "docs", "plan-configs", "qwen2.5-7b.json")) as f:
            c = json.load(f)
        a, b = R.Model(c), R.Model(R.MODELS["7b"])
        for k in ("D", "F", "L", "Hq", "Hkv", "hd", "V", "tied", "bias"):
            self.assertEqual(getattr(a, k), getattr(b, k), k)

    def test_tiny_update_by_hand(self):
        m = R.Model(TINY)
        self.assertEqual((m.QD, m.KD, m.hd, m.bias), (4, 2, 2, False))
        # parameters: embedding 16x4 = 64; the layer: q 16, k 8, v 8, o 16, MLP 3x32 = 96, norms 8 -> 152; final
        # norm 4 -> 220 (tied)
        self.assertEqual(m.params(), 220)
        o, st = R.update(m, TINY_WL, "today-fp32")
        # layer GEMMs: per token 2 (16 + 8 + 8 + 16 + 96) = 288 forward, 3 tokens -> 864; backward twice -> 1728
        gemms = sum(r[0] for (g, _), r in o.rows.items() if g == "layer GEMMs")
        self.assertEqual(gemms, 864 + 1728)
        # attention: 3 x 4 / 2 = 6 causal pairs a head, 2 heads: forward 4 hd = 8 a pair -> 96, today's backward
        # 14 hd = 28 a pair -> 336
        self.assertEqual(row(o, "attention", "attention forward")[0], 96)
        self.assertEqual(row(o, "attention", "attention backward")[0], 336)
        # LM head on the 2 response rows, one chunk: forward, recompute, dh, dW, each 2 x 2 x 16 x 4 = 256
        head = sum(r[0] for (g, _), r in o.rows.items() if g == "LM head")
        self.assertEqual(head, 4 * 256)
        self.assertEqual(st["recompute_flops"], 256)
        # AdamW: 12 FLOPs a parameter, one step
        self.assertEqual(row(o, "optimizer", "AdamW (fp32 p, g, m, v)")[0], 12 * 220)
        self.assertEqual(st["executed_flops"], 864 + 1728 + 96 + 336 + 1024 + 2640)
        # bytes of the q projection (fp32): x 3x4, W 4x4, y 3x4 floats = 160; AdamW 28 a parameter
        self.assertEqual(row(o, "layer GEMMs", "q projection")[1], 160)
        self.assertEqual(row(o, "optimizer", "AdamW (fp32 p, g, m, v)")[1], 28 * 220)
        # q's weight gradient dW (4, 4) += dy^T (4, 3) x (3, 4): dy and x read, dW read and written = 48 + 48 + 128
        self.assertEqual(row(o, "layer GEMMs", "q dW")[1], 224)
        # launches: one per projection forward, two per backward (dx and dW); per layer two host syncs (the
        # attention's cu_seqlens, forward and backward), plus logp and entropy, plus the gradient norm
        self.assertEqual(row(o, "layer GEMMs", "q projection")[2], 1)
        self.assertEqual(o.total(3), 2 + 2 + 1)
        # perf/mfu/actor's FLOPs: 3 x (288 + 4 QD ctx / 2 = 24, + 2 V D = 128) x 3 tokens
        self.assertEqual(st["model_flops"], 3 * (288 + 24 + 128) * 3)

    def test_tiny_bf16_conversions(self):
        # today's BF16: each forward GEMM rounds x (1 launch, 6 bytes an element), each backward dy and x (2); W
        # comes from the kept BF16 copy; the 7 projections of the layer -> 7 x 3 = 21 conversions in the layers
        m = R.Model(TINY)
        o, _ = R.update(m, TINY_WL, "today-bf16")
        conv = row(o, "convert", "fp32 -> BF16 operands")
        # the LM head: h once per call (2 calls) and the chunk's dz once -> 3
        self.assertEqual(conv[2], 21 + 3)
        # the kept copy made again after the optimizer step: 4 bytes read and 2 written per parameter, once
        self.assertEqual(row(o, "optimizer", "BF16 weight copy refreshed")[1:3], [220 * 6, 1])
        # the q projection forward in BF16: x and W at 2 bytes, y fp32: 24 + 32 + 48
        self.assertEqual(row(o, "layer GEMMs", "q projection")[1], 104)
        o, _ = R.update(m, TINY_WL, "designed")
        self.assertNotIn(("convert", "fp32 -> BF16 operands"), o.rows)

    def test_tiny_decode_rounds_no_weight(self):
        # a BF16 decode step of 3 sequences rounds only its activations: the x of q, k, v, o, gate, up (3 x 4 each),
        # down (3 x 8) and the logits' (3 x 4): 108 elements, 6 bytes each, a launch per product (8); the weights
        # (208 elements of the products) are read from the kept copy at 2 bytes, rounded never
        m = R.Model(TINY)
        o, _ = R.decode(m, 3, 5, "today-bf16")
        self.assertEqual(row(o, "convert", "fp32 -> BF16 operands")[1:3], [6 * 108, 8])

    def test_tiny_decode_kv_bytes(self):
        # the batched decode attention of 3 sequences at context 5: each reads 6 K and V rows of KD = 2 (the 5 cached
        # and the new one) and writes the new row to its cache, 3 x 7 x 2 x 2 = 84 elements: 4 bytes in today's fp32
        # cache, 2 in the BF16 context's since 2026-12-06; plus q read and out written (3 x 2 x 4 fp32 floats: 96
        # bytes) and the partials (3 sequences x 2 heads x 1 split x (hd + 2) x 8 bytes = 192)
        m = R.Model(TINY)
        name = ("attention", "decode attention (batched, KV append fused)")
        for vn, kv in (("today-fp32", 4), ("today-bf16", 2)):
            o, _ = R.decode(m, 3, 5, vn)
            self.assertEqual(o.rows[name][1], 84 * kv + 96 + 192, vn)

    def test_tiny_decode_launches(self):
        m = R.Model(TINY)
        B = 3
        o, st = R.decode(m, B, 5, "today-fp32")
        # a layer: rmsnorm, q, k, v, 2 x rope, o, add, rmsnorm, gate, up, swiglu, down, add = 14, and the batched
        # KV append and attention (1); the step: its inputs (positions, ids, the caches' table) in one copy, the
        # graph's launch, the embedding, the final norm, the logits, 6 for sampling (before the batched decode, 4
        # per sequence: 14 + 4 B + ...; before 2026-12-06, 3 copies of the inputs and one per sequence's last row)
        self.assertEqual(o.total(2), 14 + 1 + 1 + 1 + 1 + 1 + 1 + 6)
        # the graph's kernels at 1 us, the rest at the launch's 4
        self.assertAlmostEqual(sum(r[2] * (1e-6 if g not in ("copies and syncs", "sampling") else 4e-6)
                                   for (g, _), r in o.rows.items()) + 10e-6,
                               o.time() - sum(max(r[0] / R.H200[r[4]], r[1] / R.H200["hbm"])
                                              for r in o.rows.values()))
        o, _ = R.decode(m, B, 5, "designed")
        self.assertEqual(row(o, "attention", "decode attention (batched, KV append fused)")[2], 1)
        self.assertEqual(o.total(2), 14 + 1 + 1 + 1 + 1 + 1 + 1 + 6)
        # the HBM bound: BF16 weights of the layer (152), the head (64) and the final norm (4), B embedding rows, and
        # the BF16 K and V of 6 positions a sequence
        self.assertEqual(st["weights_bytes"], 2 * (152 + 64 + 4) + 2 * B * 4)
        self.assertEqual(st["kv_bytes"], 2 * 1 * B * 6 * 2 * 2)
        self.assertAlmostEqual(st["bound"], (st["weights_bytes"] + st["kv_bytes"]) / 4.8e12)

    def test_time_formula(self):
        o = R.Ops(R.H200, 4e-6)
        o.add("g", "compute", flops=989e12, nbytes=1e9, launches=1, peak="bf16")
        o.add("g", "memory", flops=1e9, nbytes=4.8e12, launches=2, syncs=1)
        o.add("g", "fp32", flops=67e12, peak="fp32")
        self.assertAlmostEqual(row(o, "g", "compute")[5], 1 + 4e-6)
        self.assertAlmostEqual(row(o, "g", "memory")[5], 1 + 8e-6 + 10e-6)
        self.assertAlmostEqual(row(o, "g", "fp32")[5], 1)
        self.assertAlmostEqual(o.time(), 3 + 22e-6)


class Approximations(unittest.TestCase):
    """The counts against the standard estimates on attention-light shapes: 64-token sequences, every row's log-prob
    read (no prompt), no recompute."""

    def test_training_is_6n_per_token(self):
        wl = dict(prompts=8, n=4, prompt=0, response=64, micro=4, mini_batches=1, epochs=1, ckpt=False)
        for key in R.MODELS:
            m = R.Model(R.MODELS[key])
            for vn in ("today-fp32", "designed"):
                o, st = R.update(m, wl, vn)
                opt = sum(r[0] for (g, _), r in o.rows.items() if g == "optimizer")
                counted = st["executed_flops"] - st["recompute_flops"] - opt
                ref = 6.0 * m.matmul_params() * st["tokens"]
                self.assertLess(abs(counted / ref - 1), 0.03, "%s %s: %.4f" % (key, vn, counted / ref))
                # without attention the GEMMs are 6 N exactly, up to the biases and norms (no FLOPs counted)
                att = sum(r[0] for (g, _), r in o.rows.items() if g == "attention")
                self.assertLess(abs((counted - att) / ref - 1), 1e-3, key)
                # and perf/mfu/actor's FLOPs are the same estimate
                self.assertLess(abs(st["model_flops"] / ref - 1), 0.03, key)

    def test_forward_is_2n_per_token(self):
        for key in R.MODELS:
            m = R.Model(R.MODELS[key])
            for B in (1, 128):
                o, _ = R.decode(m, B, 16, "designed")
                ref = 2.0 * m.matmul_params() * B
                self.assertLess(abs(o.total(0) / ref - 1), 0.03, key)

    def test_recompute_adds_a_forward(self):
        m = R.Model(R.MODELS["1.5b"])
        wl = dict(prompts=4, n=4, prompt=0, response=64, micro=4, mini_batches=1, epochs=1, ckpt=False)
        _, a = R.update(m, wl, "designed")
        _, b = R.update(m, dict(wl, ckpt=True), "designed")
        fwd = 2.0 * m.L * (m.layer_params() - 2 * m.D - (m.QD + 2 * m.KD)) * a["tokens"]
        att = 4.0 * m.hd * m.Hq * (4 * 64 * 65 / 2) * 4 * m.L  # 4 micro-batches of 4 sequences
        self.assertAlmostEqual((b["executed_flops"] - a["executed_flops"]) / (fwd + att), 1, places=9)


class Tables(unittest.TestCase):
    def test_cli_runs(self):
        # the tables, a breakdown and the bench rows print (docs/results/roofline.md is made from them)
        import contextlib
        import io
        for args in ([], ["--ops", "0.5b"], ["--bench"], ["--launch-us", "3", "--variants", "designed"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                self.assertEqual(R.main(args), 0)
            self.assertIn("|", buf.getvalue())

    def test_doc_tables_are_the_scripts(self):
        # docs/results/roofline.md's update and decode tables are what the script predicts now
        with open(os.path.join(ROOT, "docs", "results", "roofline.md")) as f:
            doc = f.read().replace("**", "")
        for key in R.MODELS:
            m = R.Model(R.MODELS[key])
            cells = ["%.1f%% (%s)" % (100 * st["mfu"], R.fmt_t(st["time"]))
                     for st in (R.update(m, R.workload(key), vn)[1] for vn in R.VARIANTS)]
            self.assertIn(" | ".join(cells) + " |", doc, m.name)
            for B in (1, 128):
                cells = ["%.1f%% (%.0f)" % (100 * st["share"], st["tokens_s"])
                         for st in (R.decode(m, B, R.DECODE_CTX, vn)[1] for vn in R.VARIANTS)]
                self.assertIn("| %s | %d | " % (m.name, B), doc)
                self.assertIn(" | ".join(cells) + " |", doc, "%s batch %d" % (m.name, B))

    def test_designed_beats_today(self):
        # the design removes work: for every model its update and decode are predicted faster than today's
        for key in R.MODELS:
            m = R.Model(R.MODELS[key])
            wl = R.workload(key)
            t = [R.update(m, wl, vn)[1]["time"] for vn in R.VARIANTS]
            self.assertLess(t[2], t[1])
            self.assertLess(t[1], t[0])
            for B in (1, 128):
                d = {vn: R.decode(m, B, R.DECODE_CTX, vn)[1]["share"] for vn in R.VARIANTS}
                self.assertLess(d["today-fp32"], d["designed"])
                self.assertLess(d["designed"], d["designed+"])
                self.assertLessEqual(d["designed+"], 1.0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=1)
