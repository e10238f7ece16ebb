/* The layout planner against independent references: parameter counts against the published counts of
 * Qwen2.5-7B and SmolLM2-135M and against the parameters this code allocates for a model; memory and bytes
 * per step against the formulas worked by hand below (Megatron-LM's 18 bytes per parameter, 6 + 12/DP with
 * ZeRO-1; ring collectives); invalid layouts named; the recommendation is the fastest layout that fits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../test_util.h"

#include "worker/model/model.h"
#include "worker/model/model_io.h"
#include "worker/plan/planner.h"

/* Qwen2.5-7B's config.json (the numbers that matter) */
static struct model_config qwen7b(void)
{
    return (struct model_config){.arch = 0,
                                 .vocab_size = 152064,
                                 .hidden_size = 3584,
                                 .intermediate_size = 18944,
                                 .n_layers = 28,
                                 .n_heads = 28,
                                 .n_kv_heads = 4,
                                 .head_dim = 128,
                                 .tie_word_embeddings = false,
                                 .attention_bias = true,
                                 .max_position_embeddings = 32768};
}

#define H200x8 plan_default_cluster
#define GSM8K plan_default_batch

static void near(double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want))
        fail_msg("got %.6g, want %.6g (relative %.2g allowed)", got, want, rel);
}

static void test_param_counts(void **state)
{
    (void)state;
    struct model_config q = qwen7b();
    assert_true(plan_param_count(&q) == 7615616512.0); /* the model card's 7,615,616,512 */
    struct model_config s = {.vocab_size = 49152,
                             .hidden_size = 576,
                             .intermediate_size = 1536,
                             .n_layers = 30,
                             .n_heads = 9,
                             .n_kv_heads = 3,
                             .head_dim = 64,
                             .tie_word_embeddings = true};
    assert_true(plan_param_count(&s) == 134515008.0); /* SmolLM2-135M */
    /* the parameters this code allocates for the test tokenizer's tiny model, with and without biases and q/k
     * norms */
    struct model_config t;
    char err[512];
    assert_int_equal(model_config_from_hf_json(TEST_TOKENIZER_FIXTURE "/config.json", &t, err, sizeof err), 0);
    for (int bias = 0; bias < 3; bias++) { /* no bias; q/k/v biases; Qwen3's q/k norms with a head_dim of its own */
        t.attention_bias = bias == 1;
        t.tie_word_embeddings = bias != 1;
        t.qk_norm = bias == 2;
        t.head_dim = bias == 2 ? 24 : t.hidden_size / t.n_heads;
        struct model *m = model_create(&t);
        assert_non_null(m);
        assert_true(plan_param_count(&t) == (double)model_num_params(m));
        model_free(m);
    }
}

static void test_memory_and_bytes(void **state)
{
    (void)state;
    struct model_config q = qwen7b();
    const double P = 7615616512.0, h = 3584, S = 1536, T_mb = 4 * S;
    struct plan_result r;
    /* TP1 PP1 DP8 without ZeRO: 2 + 4 + 12 bytes per parameter, and 2 for the reference */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 8, false, 1, 1, false}, &r);
    assert_true(r.valid);
    near(r.mem_weights, 2 * P, 1e-12);
    near(r.mem_grads, 4 * P, 1e-12);
    near(r.mem_optim, 12 * P, 1e-12);
    near(r.mem_ref, 2 * P, 1e-12);
    /* full recompute: the 28 layers' inputs (2 s b h) plus one layer's working set (34 s b h) */
    near(r.mem_act, 28 * 2 * T_mb * h + 34 * T_mb * h, 1e-12);
    assert_false(r.fits); /* 20 bytes x 7.6 B = 152 GB > 0.9 x 141 GB */
    /* ring all-reduce of the FP32 gradients, 2(n-1)/n of them, once per optimizer step (4 a step) */
    near(r.bytes_dp, 4 * 2.0 * 7 / 8 * 4 * P, 1e-12);
    assert_true(r.bytes_tp == 0 && r.bytes_pp == 0);
    /* ZeRO-1: the 12 bytes of master weights and moments are sharded: 6 + 12/8, and the all-reduce becomes a
     * reduce-scatter of FP32 gradients and an all-gather of BF16 weights */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 8, true, 1, 1, false}, &r);
    near(r.mem_optim, 12 * P / 8, 1e-12);
    near(r.bytes_dp, 4 * (7.0 / 8 * 4 * P + 7.0 / 8 * 2 * P), 1e-12);
    assert_true(r.fits);
    /* TP2: per pass two all-reduces of s x h per layer and one for the embedding (forward) or the head's input
     * gradient (backward): 2 x 28 + 1 = 57; two forward-only passes, the update's forward and backward, and the
     * recompute's 2 x 28; 2(n-1)/n = 1 for n = 2; over this DP rank's 1/4 of the tokens; 4 KV heads split */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){2, 1, 4, false, 1, 1, false}, &r);
    const double tokens_dp = 256.0 * 8 * S / 4;
    near(r.bytes_tp, 1.0 * h * 2 * tokens_dp * (2 * 57 + 2 * 57 + 56), 1e-12);
    /* PP2: stage 1 holds 14 layers, the head and the final norm; the stage boundary carries s x h forward
     * (3 passes) and backward (1) */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 2, 4, false, 1, 1, false}, &r);
    const double layer = 2 * h + 2 * h * 28 * 128 + 2 * h * 4 * 128 + 3 * h * 18944 + 28 * 128 + 2 * 4 * 128;
    near(r.stage_params, 14 * layer + 152064 * h + h, 1e-12);
    /* the first stage sends s x h forward in 3 passes (old, reference, update), the last back in 1; Qwen2.5-7B's
     * head is untied: no embedding gradient between them */
    near(r.bytes_pp, h * 2 * (256.0 * 8 * S / 4) * 3, 1e-12);
    /* 1F1B bubble (p-1)/(m+p-1): 512 sequences per optimizer step over DP 4 in micro-batches of 4 = 32 */
    near(r.bubble, 1.0 / 33, 1e-12);
    /* PP4: a middle stage sends forward in 3 passes and back in 1 */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 4, 2, false, 1, 1, false}, &r);
    near(r.bytes_pp, h * 2 * (256.0 * 8 * S / 2) * 4, 1e-12);
}

static void test_invalid_and_recommended(void **state)
{
    (void)state;
    struct model_config q = qwen7b();
    struct plan_result r;
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){3, 1, 1, false, 1, 1, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "28 attention heads"));
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){8, 1, 1, false, 1, 1, false}, &r);
    assert_false(r.valid); /* 28 heads over TP 8 */
    struct model_config q2 = q;
    q2.n_kv_heads = 2;
    plan_evaluate(&q2, &H200x8, &GSM8K, &(struct plan_layout){4, 1, 2, false, 1, 1, false}, &r);
    assert_true(r.valid); /* 2 KV heads replicated over TP 4 */
    q2.n_kv_heads = 3;
    plan_evaluate(&q2, &H200x8, &GSM8K, &(struct plan_layout){4, 1, 2, false, 1, 1, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "3 KV heads"));
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 29, 1, false, 1, 1, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "28 layers"));
    struct plan_cluster two = H200x8;
    two.nodes = 2;
    plan_evaluate(&q, &two, &GSM8K, &(struct plan_layout){16, 1, 1, false, 1, 1, false}, &r);
    assert_false(r.valid);
    static struct plan_result all[4096];
    int best;
    int n = plan_candidates(&q, &H200x8, &GSM8K, all, 4096, &best);
    assert_true(n > 8 && n < 4096);
    assert_true(best >= 0 && all[best].fits);
    for (int i = 0; i < n; i++) {
        assert_true(all[i].valid && all[i].lay.tp * all[i].lay.pp * all[i].lay.cp * all[i].lay.dp == 8);
        if (all[i].fits)
            assert_true(all[best].time_step <= all[i].time_step);
    }
    struct plan_rollout ro;
    plan_rollout(&q, &H200x8, &GSM8K, &ro);
    /* TP 1: 15.2 GB of BF16 weights; 256 x 8 sequences over 8 devices, 1536 tokens of 2 x 28 x 4 x 128 x 2 bytes */
    assert_int_equal(ro.tp, 1);
    assert_int_equal(ro.concurrent, 256);
    near(ro.mem_kv, 256 * 1536.0 * 2 * 28 * 4 * 128 * 2, 1e-12);
    /* the CPU mode's cache is fp32: 4 bytes an element where the GPU's BF16 cache takes 2 */
    struct plan_cluster cpu = H200x8;
    cpu.cpu = true;
    plan_rollout(&q, &cpu, &GSM8K, &ro);
    assert_int_equal(ro.tp, 1); /* 30.5 GB of fp32 weights and 22.5 GB of cache still fit one device */
    near(ro.mem_kv, 256 * 1536.0 * 2 * 28 * 4 * 128 * 4, 1e-12);
}

/* Qwen3-30B-A3B's config.json (the numbers that matter) */
static struct model_config qwen3_30b_a3b(void)
{
    return (struct model_config){.vocab_size = 151936,
                                 .hidden_size = 2048,
                                 .intermediate_size = 6144,
                                 .n_layers = 48,
                                 .n_heads = 32,
                                 .n_kv_heads = 4,
                                 .head_dim = 128,
                                 .qk_norm = true,
                                 .n_experts = 128,
                                 .n_experts_per_tok = 8,
                                 .moe_intermediate = 768,
                                 .norm_topk_prob = true};
}

/* The sequence-parallel byte counts, worked by hand for 2 KV heads of 64 and a 4,096-token sequence. */
static void test_sequence_parallel_bytes(void **state)
{
    (void)state;
    struct model_config m = {.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .n_layers = 1};
    /* CP 2: chunks of 1,024 tokens; forward 1 x 2 (K, V) x 2,048 rows x 2 x 64 x 4 = 2,097,152 bytes, backward
     * twice that */
    near(plan_cp_ring_bytes(&m, 4096, 2, 1, 1, 0), 2097152, 1e-15);
    near(plan_cp_ring_bytes(&m, 4096, 2, 1, 1, 1), 3 * 2097152, 1e-15);
    /* CP 4: chunks of 512, 3 steps of 1,024 rows: 3,145,728 forward; 4,097 tokens pad to chunks of 513 */
    near(plan_cp_ring_bytes(&m, 4096, 4, 1, 1, 0), 3145728, 1e-15);
    near(plan_cp_ring_bytes(&m, 4097, 4, 1, 1, 0), 3.0 * 2 * 1026 * 2 * 64 * 4, 1e-15);
    assert_true(plan_cp_ring_bytes(&m, 4096, 1, 1, 1, 1) == 0);
    /* CP 2 x TP 2: the ring carries the TP rank's one KV head: half of CP 2's 2,097,152; at TP 4 the two KV heads
     * are shared by pairs of TP ranks, still one a rank: the same */
    near(plan_cp_ring_bytes(&m, 4096, 2, 2, 1, 0), 1048576, 1e-15);
    near(plan_cp_ring_bytes(&m, 4096, 2, 4, 1, 0), 1048576, 1e-15);
    /* Ulysses SP 2: 4 query heads and 1 KV head a rank; forward 1/2 x 4,096 x 64 x 4 x (8 + 2) = 5,242,880 */
    near(plan_sp_alltoall_bytes(&m, 4096, 2, 1, 1, 0), 5242880, 1e-15);
    /* SP 2 x TP 2: a TP rank's 4 query heads and 1 KV head, 2 query heads and the (replicated) KV head a rank:
     * 1/2 x 4,096 x 64 x 4 x (4 + 2) = 3,145,728 a forward; a backward 1/2 x 4,096 x 64 x 4 x (6 + 2) = 4,194,304 */
    near(plan_sp_alltoall_bytes(&m, 4096, 2, 2, 1, 0), 3145728, 1e-15);
    near(plan_sp_alltoall_bytes(&m, 4096, 2, 2, 0, 1), 4194304, 1e-15);
}

static void test_moe_and_ep(void **state)
{
    (void)state;
    struct model_config q = qwen3_30b_a3b();
    const double h = 2048, L = 48, experts = L * 128 * 3 * h * 768, S = 1536;
    /* the model card: 30.5B parameters, 3.3B activated */
    near(plan_param_count(&q), 30.5e9, 0.005);
    near(plan_active_params(&q), 3.3e9, 0.02);
    near(plan_param_count(&q) - plan_active_params(&q), experts * 120 / 128, 1e-12);
    struct plan_result one, r;
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 8, true, 1, 1, false}, &one);
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 8, true, 8, 1, false}, &r);
    assert_true(one.valid && r.valid);
    /* EP8: 16 of each layer's 128 experts per device, everything else whole */
    near(r.stage_experts, experts / 8, 1e-12);
    near(one.stage_params - r.stage_params, experts * 7 / 8, 1e-12);
    near(r.mem_weights, 2 * r.stage_params, 1e-12);
    /* ZeRO-1: the dense state over DP 8, the experts' over the 8 / 8 = 1 rank holding them */
    near(r.mem_optim, 12 * ((r.stage_params - experts / 8) / 8 + experts / 8), 1e-12);
    /* gradients: the dense over DP 8 (reduce-scatter of FP32, all-gather of BF16), the experts' nowhere */
    const double dense = r.stage_params - experts / 8;
    near(r.bytes_dp, 4 * 7.0 / 8 * (4 * dense + 2 * dense), 1e-12);
    /* the all-to-alls: each of 48 layers, 8 slots a token, 7/8 of them off the device, BF16 hidden each way, in
     * 2 forward-only passes and the update's forward, backward (both ways again) and recompute: 5 of 2 */
    const double tok_dp = 256.0 * 8 * S / 8;
    near(r.bytes_ep, tok_dp * L * 2 * 8 * h * 2 * 7.0 / 8 * 5, 1e-12);
    assert_true(one.bytes_ep == 0);
    /* the compute counts the active parameters */
    near(r.time_compute, one.time_compute, 1e-12);
    near(r.time_compute * 8 * 989e12 * 0.4, (2 * 2 + 6 + 2) * plan_active_params(&q) * 256 * 8 * S, 1e-12);
    /* EP that divides neither the experts nor DP is named */
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 6, false, 3, 1, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "EP 3"));
    static struct plan_result all[4096];
    int best, n = plan_candidates(&q, &H200x8, &GSM8K, all, 4096, &best), eps = 0;
    for (int i = 0; i < n; i++)
        eps += all[i].lay.ep > 1;
    assert_true(eps > 0 && best >= 0);
}

/* Sequences shared by SP or CP ranks, worked by hand for Qwen2.5-7B (28 query and 4 KV heads of 128, 28 layers) on
 * 32k-token sequences: 256 of them a step, one a micro-batch, on the 8 devices of a node. */
static void test_sequence_sharing(void **state)
{
    (void)state;
    struct model_config q = qwen7b();
    struct plan_batch b = GSM8K;
    b.prompts = 32, b.prompt_len = 1024, b.response_len = 31744, b.micro_batch = 1;
    const double S = 32768, seqs = 256;
    struct plan_result one, sp2, cp2, tpsp;
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){1, 1, 8, false, 1, 1, false}, &one);
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){1, 1, 4, false, 1, 2, false}, &sp2);
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){1, 1, 4, false, 1, 2, true}, &cp2);
    assert_true(one.valid && sp2.valid && cp2.valid);
    /* a rank holds half of every micro-batch's tokens: half the activations, the same weights */
    near(sp2.mem_act, one.mem_act / 2, 1e-12);
    near(cp2.mem_act, one.mem_act / 2, 1e-12);
    near(sp2.mem_weights, one.mem_weights, 1e-12);
    /* the gradients add up over DP 4 x SP 2 = 8 ranks: the same ring all-reduce as DP 8 */
    near(sp2.bytes_dp, one.bytes_dp, 1e-12);
    near(sp2.time_compute, one.time_compute, 1e-12);
    assert_true(one.bytes_cp == 0);
    /* Ulysses: 14 query heads and 2 KV heads a rank; the layer forwards: old log-probs, reference, the update's and
     * its recompute (4 x 28), backwards 28; N = a DP group's tokens, 256 x 32,768 / 4 */
    const double N = seqs * S / 4;
    near(sp2.bytes_cp, 0.5 * N * 128 * 4 * (112.0 * (2 * 14 + 2 * 2) + 28.0 * (3 * 14 + 2 * 2)), 1e-12);
    /* ring: per sequence (64 of them a DP group), chunks of 32,768 / 4 = 8,192 tokens; 1 step of K and V (2 x 8,192
     * rows x 4 KV heads x 128 x 4 bytes) per layer forward, twice that per backward */
    near(cp2.bytes_cp, 64.0 * 1 * 2 * (2 * 8192.0) * 4 * 128 * 4 * (112 + 2 * 28), 1e-12);
    /* TP 2 x SP 2: 7 query heads and 1 KV head a rank; TP's all-reduces act on the rank's half of the tokens */
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){2, 1, 2, false, 1, 2, false}, &tpsp);
    assert_true(tpsp.valid);
    near(tpsp.bytes_cp, 0.5 * (seqs * S / 2) * 128 * 4 * (112.0 * (2 * 7 + 2 * 1) + 28.0 * (3 * 7 + 2 * 1)), 1e-12);
    struct plan_result tp2;
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){2, 1, 4, false, 1, 1, false}, &tp2);
    near(tpsp.bytes_tp, tp2.bytes_tp, 1e-12); /* half the tokens a rank, twice the tokens a DP rank */
    /* what does not split: SP 8 over 28 heads; SP 4 over TP 2's 14; TP 8 x SP 2 past the node */
    struct plan_result r;
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){1, 1, 1, false, 1, 8, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "SP 8"));
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){2, 1, 1, false, 1, 4, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "14 query"));
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){1, 1, 1, false, 1, 8, true}, &r);
    assert_true(r.valid); /* the ring keeps every head */
    plan_evaluate(&q, &H200x8, &b, &(struct plan_layout){8, 1, 1, false, 1, 2, true}, &r);
    assert_false(r.valid);
    /* the candidates try both kinds and cover the devices; the recommendation is the fastest that fits among the
     * layouts keeping sequences whole while one of them fits, else among all */
    static struct plan_result all[4096];
    int best, n;
    for (int len = 0; len < 2; len++) {
        b.response_len = len ? 130048 : 31744; /* 32k tokens with recompute, then 128k without */
        b.recompute = !len;
        n = plan_candidates(&q, &H200x8, &b, all, 4096, &best);
        int kinds[3] = {0}, whole_fit = 0;
        assert_true(n < 4096 && best >= 0);
        for (int i = 0; i < n; i++) {
            const struct plan_layout *l = &all[i].lay;
            assert_true(l->tp * l->pp * l->cp * l->dp == 8);
            kinds[l->cp == 1 ? 0 : l->ring ? 2 : 1]++;
            whole_fit += l->cp == 1 && all[i].fits;
        }
        assert_true(kinds[0] > 0 && kinds[1] > 0 && kinds[2] > 0);
        assert_int_equal(all[best].lay.cp > 1, whole_fit == 0);
        for (int i = 0; i < n; i++)
            if (all[i].fits && (all[i].lay.cp == 1 || !whole_fit))
                assert_true(all[best].time_step <= all[i].time_step);
        /* 32k tokens fit whole; 128k tokens without recompute only shared (whatever TP and PP) */
        assert_int_equal(whole_fit > 0, len == 0);
    }
}

/* Experts under TP (each expert's 768 rows split like the dense MLP, the router whole), and EP x TP, by hand. */
static void test_moe_tp(void **state)
{
    (void)state;
    struct model_config q = qwen3_30b_a3b();
    const double h = 2048, L = 48, E = 128, Fe = 768, experts = L * E * 3 * h * Fe, S = 1536;
    struct plan_result one, tp2, ep4tp2;
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){1, 1, 8, false, 1, 1, false}, &one);
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){2, 1, 4, false, 1, 1, false}, &tp2);
    plan_evaluate(&q, &H200x8, &GSM8K, &(struct plan_layout){2, 1, 4, false, 4, 1, false}, &ep4tp2);
    assert_true(one.valid && tp2.valid && ep4tp2.valid);
    /* TP2: half of every expert (384 rows of gate, up and down) per device */
    near(tp2.stage_experts, experts / 2, 1e-12);
    /* what TP2 takes off one device: half the attention (q, k, v, o: 32 + 4 + 4 + 32 heads of 128 x 2,048), half
     * the experts and half the vocabulary (embedding and head); the router (128 x 2,048), the norms stay whole */
    const double attn = L * h * 128 * (32 + 4 + 4 + 32), vocab = 2 * 151936 * h;
    near(one.stage_params - tp2.stage_params, (attn + experts + vocab) / 2, 1e-12);
    /* EP4 x TP2: 32 experts of a layer, 384 rows of each, per device */
    near(ep4tp2.stage_experts, experts / 8, 1e-12);
    near(tp2.stage_params - ep4tp2.stage_params, experts / 2 * 3 / 4, 1e-12);
    /* the all-to-alls: tokens per DP rank (4 of them), 3/4 of 8 slots off the device, whole BF16 hidden rows,
     * 5 passes: TP leaves a device's bytes as they are */
    const double tok_dp = 256.0 * 8 * S / 4;
    near(ep4tp2.bytes_ep, tok_dp * L * 2 * 8 * h * 2 * 3.0 / 4 * 5, 1e-12);
    /* TP's all-reduces: 2L + 1 of s x h per pass (forward-only x 2, update forward + backward x 2, recompute 2L),
     * and each backward the 8 routing weights a token, BF16, ring 2 (2 - 1) / 2 = 1; per optimizer step (4) the
     * q/k norms' FP32 gradients (2 x 128 a layer) */
    const double pass = h * 2 * (2 * L + 1);
    near(tp2.bytes_tp, tok_dp * (pass * 2 + 2 * pass + h * 2 * 2 * L + 8 * 2 * L) + 4 * 4 * L * 2 * 128, 1e-12);
    /* experts whose rows TP does not divide are named */
    struct model_config odd = q;
    odd.moe_intermediate = 770;
    struct plan_result r;
    plan_evaluate(&odd, &H200x8, &GSM8K, &(struct plan_layout){4, 1, 2, false, 1, 1, false}, &r);
    assert_false(r.valid);
    assert_non_null(strstr(r.why_invalid, "770 rows"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_param_counts),
                                       cmocka_unit_test(test_memory_and_bytes),
                                       cmocka_unit_test(test_invalid_and_recommended),
                                       cmocka_unit_test(test_moe_and_ep),
                                       cmocka_unit_test(test_moe_tp),
                                       cmocka_unit_test(test_sequence_parallel_bytes),
                                       cmocka_unit_test(test_sequence_sharing)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
