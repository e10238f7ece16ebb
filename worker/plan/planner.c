#include "planner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const struct plan_cluster plan_default_cluster = {.nodes = 1,
                                                  .gpus_per_node = 8,
                                                  .gpu_mem_gib = 141,
                                                  .nvlink_gbs = 450,
                                                  .net_gbs = 50,
                                                  .peak_tflops = 989,
                                                  .mfu = 0.4};
const struct plan_batch plan_default_batch = {.prompts = 256,
                                              .n = 8,
                                              .prompt_len = 512,
                                              .response_len = 1024,
                                              .micro_batch = 4,
                                              .mini_batches = 4,
                                              .ppo_epochs = 1,
                                              .recompute = true,
                                              .kl = true};

/* Bytes per parameter of each kind of state. */
struct widths {
    double weights, grads, master, moments, ref, act; /* act: one activation element */
};

static struct widths widths_of(const struct plan_cluster *c)
{
    if (c->cpu) /* FP32 weights are the master weights */
        return (struct widths){4, 4, 0, 8, 4, 4};
    return (struct widths){2, 4, 4, 8, 2, 2};
}

/* A TP rank's query and KV heads (Megatron's split; one shared KV head when there are fewer than TP ranks). */
static void tp_heads(const struct model_config *m, int tp, double *hq, double *hkv)
{
    tp = tp > 1 ? tp : 1;
    *hq = (double)m->n_heads / tp;
    *hkv = m->n_kv_heads >= tp ? (double)m->n_kv_heads / tp : 1.0;
}

double plan_sp_alltoall_bytes(const struct model_config *m, double N, int sp, int tp, double fwd, double bwd)
{
    if (sp <= 1)
        return 0;
    double Hq, Hkv;
    tp_heads(m, tp, &Hq, &Hkv);
    const double hq = Hq / sp, hk = Hkv >= sp ? Hkv / sp : 1.0;
    return (sp - 1.0) / sp * N * m->head_dim * 4.0 * (fwd * (2 * hq + 2 * hk) + bwd * (3 * hq + 2 * hk));
}

double plan_cp_ring_bytes(const struct model_config *m, double N, int cp, int tp, double fwd, double bwd)
{
    if (cp <= 1)
        return 0;
    double Hq, Hkv;
    tp_heads(m, tp, &Hq, &Hkv);
    const double c = ceil(N / (2.0 * cp)); /* tokens per chunk, the sequence padded to 2 cp chunks */
    return (cp - 1.0) * 2.0 * (2.0 * c) * Hkv * m->head_dim * 4.0 * (fwd + 2.0 * bwd);
}

double plan_param_count(const struct model_config *m)
{
    const double h = m->hidden_size, f = m->intermediate_size, a = m->n_heads, g = m->n_kv_heads, d = m->head_dim,
                 V = m->vocab_size;
    double layer = 2 * h + h * a * d + 2 * h * g * d + a * d * h + 3 * h * f;
    if (m->n_experts) /* the router and every expert instead of the dense MLP */
        layer += (double)m->n_experts * h * (1 + 3.0 * m->moe_intermediate) - 3 * h * f;
    if (m->attention_bias)
        layer += a * d + 2 * g * d;
    if (m->qk_norm)
        layer += 2 * d;
    return V * h + m->n_layers * layer + h + (m->tie_word_embeddings ? 0 : V * h);
}

/* One layer's experts: E x (gate, up, down) of moe_intermediate rows. */
static double layer_experts(const struct model_config *m)
{
    return (double)m->n_experts * 3.0 * m->hidden_size * m->moe_intermediate;
}

double plan_active_params(const struct model_config *m)
{
    const double experts = m->n_layers * layer_experts(m);
    return plan_param_count(m) - (m->n_experts ? experts * (1.0 - (double)m->n_experts_per_tok / m->n_experts) : 0);
}

/* Parameters of one layer on one TP rank (all its experts): q, o and the MLP split, KV heads split (or replicated
 * when fewer than TP), norms replicated; each expert split over TP by its intermediate rows like the dense MLP, the
 * router whole on every TP rank. */
static double layer_params_tp(const struct model_config *m, int tp)
{
    const double h = m->hidden_size, f = m->intermediate_size, a = (double)m->n_heads / tp, d = m->head_dim;
    const double g = m->n_kv_heads >= tp ? (double)m->n_kv_heads / tp : 1;
    double layer = 2 * h + h * a * d + 2 * h * g * d + a * d * h + 3 * h * f / tp;
    if (m->n_experts) /* the router, and every expert's rows of this TP rank, instead of the dense MLP */
        layer += (double)m->n_experts * h * (1 + 3.0 * m->moe_intermediate / tp) - 3 * h * f / tp;
    if (m->attention_bias)
        layer += a * d + 2 * g * d;
    if (m->qk_norm)
        layer += 2 * d;
    return layer;
}

static double ring_allreduce(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0; }
static double ring_half(int n) { return n > 1 ? (double)(n - 1) / n : 0; }

void plan_evaluate(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                   const struct plan_layout *l, struct plan_result *r)
{
    memset(r, 0, sizeof *r);
    r->lay = *l;
    r->params = plan_param_count(m);
    const int tp = l->tp, pp = l->pp, dp = l->dp, ep = l->ep > 1 ? l->ep : 1, cp = l->cp > 1 ? l->cp : 1;
    const int kv_tp = tp >= 1 && m->n_kv_heads >= tp ? m->n_kv_heads / tp : 1; /* KV heads on a TP rank */
    if (tp < 1 || pp < 1 || dp < 1)
        snprintf(r->why_invalid, sizeof r->why_invalid, "sizes must be at least 1");
    else if (cp > 1 && !l->ring && (m->n_heads % tp == 0) && ((m->n_heads / tp) % cp || (kv_tp % cp && cp % kv_tp)))
        snprintf(r->why_invalid, sizeof r->why_invalid, "SP %d: %d query and %d KV heads a TP rank do not split", cp,
                 m->n_heads / tp, kv_tp);
    else if (tp * cp > c->gpus_per_node)
        snprintf(r->why_invalid, sizeof r->why_invalid, "TP %d x %s %d spans nodes of %d devices", tp,
                 l->ring ? "CP" : "SP", cp, c->gpus_per_node);
    else if (ep > 1 && !m->n_experts)
        snprintf(r->why_invalid, sizeof r->why_invalid, "EP %d on a dense model", ep);
    else if (ep > 1 && (m->n_experts % ep || dp % ep))
        snprintf(r->why_invalid, sizeof r->why_invalid, "EP %d divides neither %d experts and DP %d", ep, m->n_experts,
                 dp);
    else if (m->n_experts && m->moe_intermediate % tp)
        snprintf(r->why_invalid, sizeof r->why_invalid, "experts of %d rows do not divide by TP %d",
                 m->moe_intermediate, tp);
    else if (m->n_heads % tp)
        snprintf(r->why_invalid, sizeof r->why_invalid, "%d attention heads do not divide by TP %d", m->n_heads, tp);
    else if (m->n_kv_heads % tp && tp % m->n_kv_heads)
        snprintf(r->why_invalid, sizeof r->why_invalid, "%d KV heads neither divide by TP %d nor divide it",
                 m->n_kv_heads, tp);
    else if (pp > m->n_layers)
        snprintf(r->why_invalid, sizeof r->why_invalid, "%d layers are fewer than PP %d stages", m->n_layers, pp);
    else if (tp > c->gpus_per_node)
        snprintf(r->why_invalid, sizeof r->why_invalid, "TP %d spans nodes of %d devices", tp, c->gpus_per_node);
    if (r->why_invalid[0])
        return;
    r->valid = true;
    const struct widths w = widths_of(c);
    const double h = m->hidden_size, V = m->vocab_size;
    const int layers_stage = (m->n_layers + pp - 1) / pp;
    /* under EP the stage's layers hold E / EP experts each, under TP 1 / TP of each expert's rows */
    r->stage_experts = layers_stage * layer_experts(m) / ((double)ep * tp);
    const double body = layers_stage * layer_params_tp(m, tp) - layers_stage * layer_experts(m) / tp + r->stage_experts,
                 vocab = V * h / tp;
    /* stage 0 holds the embedding; the last stage the head and the final norm (its own copy when tied) */
    const double first = body + vocab + (pp == 1 ? (m->tie_word_embeddings ? 0 : vocab) + h : 0);
    const double last = body + vocab + h;
    r->stage_params = pp == 1 ? first : fmax(first, last);
    const double sp = r->stage_params;
    r->mem_weights = w.weights * sp;
    r->mem_grads = w.grads * sp;
    /* ZeRO-1 shards the dense parameters' state over DP, the experts' over the ranks holding the same ones */
    const double dense = sp - r->stage_experts;
    r->mem_optim =
        (w.master + w.moments) * (dense / (l->zero1 ? dp * cp : 1) + r->stage_experts / (l->zero1 ? dp * cp / ep : 1));
    r->mem_ref = b->kl ? w.ref * sp : 0;

    /* T_mb: a micro-batch's tokens on this rank (1 / CP of them when CP ranks share it) */
    const double S = (double)b->prompt_len + b->response_len, T_mb = (double)b->micro_batch * S / cp;
    const double seqs = (double)b->prompts * b->n;
    const double per_opt = seqs / (b->mini_batches > 0 ? b->mini_batches : 1) / dp;
    r->micro_batches = (int)ceil(per_opt / (b->micro_batch > 0 ? b->micro_batch : 1));
    if (r->micro_batches < 1)
        r->micro_batches = 1;
    /* Korthikanti et al.: 34 s b h bytes per layer at 16-bit, divided by TP with sequence parallelism */
    double full_layer = 34.0 * T_mb * h / tp * (w.act / 2);
    if (m->n_experts) /* the MLP's 19 s b h become the routed slots' buffers (their hidden rows on every TP rank,
                       * their intermediate rows split over TP) and the router's probabilities */
        full_layer +=
            (-19.0 * T_mb * h / tp + m->n_experts_per_tok * T_mb * (2.0 * h + 3.0 * m->moe_intermediate / tp) +
             2.0 * T_mb * m->n_experts) *
            (w.act / 2);
    const double per_layer = b->recompute ? 2.0 * T_mb * h / tp * (w.act / 2) : full_layer;
    const int in_flight = pp < r->micro_batches ? pp : r->micro_batches;
    r->mem_act = in_flight * layers_stage * per_layer + (b->recompute ? full_layer : 0);
    r->mem_total = r->mem_weights + r->mem_grads + r->mem_optim + r->mem_ref + r->mem_act;
    r->fits = r->mem_total <= 0.9 * c->gpu_mem_gib * 1e9;

    /* forward-only passes over every sequence: old log-probs, and the reference's */
    const double fwd_only = 1 + (b->kl ? 1 : 0);
    const double tok_dp = (b->step_tokens > 0 ? b->step_tokens : seqs * S) / dp / cp; /* on this rank */
    /* TP: two all-reduces of s x h per layer per forward (attention and MLP outputs), two per backward (their
     * inputs' gradients), two more per recomputed forward; one more per forward (the vocab-parallel embedding) and
     * per backward (the LM head's input gradient). With fewer KV heads than TP ranks, the k/v gradients of the
     * ranks that share a head are summed once per optimizer step. */
    const double tp_pass = ring_allreduce(tp) * h * w.act * (2.0 * layers_stage + 1);
    const double tp_recompute = ring_allreduce(tp) * h * w.act * 2.0 * layers_stage;
    r->bytes_tp = tok_dp * (tp_pass * fwd_only + b->ppo_epochs * (2 * tp_pass + (b->recompute ? tp_recompute : 0)));
    /* Qwen3's q/k norms: whole on every TP rank, each saw its heads: their gradients summed once per optimizer step */
    if (tp > 1 && m->qk_norm)
        r->bytes_tp += (double)(b->mini_batches > 0 ? b->mini_batches : 1) * b->ppo_epochs * ring_allreduce(tp) *
                       w.grads * layers_stage * 2.0 * m->head_dim;
    /* MoE layers: in each backward also the routing weights' gradients (k floats a token), each TP rank's part */
    if (m->n_experts)
        r->bytes_tp += tok_dp * b->ppo_epochs * ring_allreduce(tp) * m->n_experts_per_tok * w.act * layers_stage;
    if (tp > 1 && m->n_kv_heads < tp)
        r->bytes_tp += (double)(b->mini_batches > 0 ? b->mini_batches : 1) * b->ppo_epochs * ring_allreduce(tp) *
                       w.grads * layers_stage * 2.0 * m->n_kv_heads * m->head_dim * (h + (m->attention_bias ? 1 : 0));
    const double opt_steps = (double)(b->mini_batches > 0 ? b->mini_batches : 1) * b->ppo_epochs;
    /* PP, the busiest stage: a middle stage sends its output forward in every forward pass and its input
     * gradient back in every backward; the first stage only forward, the last only back, and with tied
     * embeddings both send the embedding's gradient (its vocabulary shard) once per optimizer step */
    if (pp > 1) {
        const double fwd = h * w.act * tok_dp * (fwd_only + b->ppo_epochs), bwd = h * w.act * tok_dp * b->ppo_epochs;
        const double tied = m->tie_word_embeddings ? opt_steps * w.grads * V * h / tp : 0;
        r->bytes_pp = fmax(fwd + tied, bwd + tied);
        if (pp > 2)
            r->bytes_pp = fmax(r->bytes_pp, fwd + bwd);
    } else {
        r->bytes_pp = 0;
    }
    /* the dense gradients over DP, the experts' over the DP / EP ranks holding the same experts */
    const double gd = w.grads * dense, ge = w.grads * r->stage_experts;
    const int edp = dp / ep;                    /* ep divides dp (checked above) */
    const int dpcp = dp * cp, edpcp = edp * cp; /* the sequence-sharing ranks' gradients add up too */
    r->bytes_dp = opt_steps * (l->zero1 ? ring_half(dpcp) * (gd + w.weights * dense) +
                                              ring_half(edpcp) * (ge + w.weights * r->stage_experts)
                                        : ring_allreduce(dpcp) * gd + ring_allreduce(edpcp) * ge);
    /* EP: per MoE layer and pass, the slots off this device go out and their outputs come back (a forward), the
     * outputs' and inputs' gradients the same way (a backward); a recompute is a forward. Under TP every TP rank
     * sends the same whole hidden rows within its own EP group (each expert's rows are split, its inputs and
     * outputs are not): TP does not shrink a device's bytes */
    const double passes = fwd_only + b->ppo_epochs * (2.0 + (b->recompute ? 1 : 0));
    r->bytes_ep = ep > 1 ? tok_dp * layers_stage * 2.0 * m->n_experts_per_tok * h * w.act * ring_half(ep) * passes : 0;
    /* SP / CP: the heads a TP rank holds; every layer's forward passes (the recompute's too) and backwards */
    if (cp > 1) {
        const double fwd = layers_stage * (fwd_only + b->ppo_epochs * (1.0 + (b->recompute ? 1 : 0))),
                     bwd = layers_stage * (double)b->ppo_epochs;
        r->bytes_cp = l->ring ? seqs / dp * plan_cp_ring_bytes(m, S, cp, tp, fwd, bwd)
                              : plan_sp_alltoall_bytes(m, tok_dp * cp, cp, tp, fwd, bwd);
    }
    r->bytes_sync = w.weights * r->params;
    /* (PP, DP, CP, TP), TP fastest: whether a group's ranks reach past one node */
    const bool pp_crosses = tp * cp * pp > c->gpus_per_node, dp_crosses = tp * cp * pp * dp > c->gpus_per_node;
    const double nv = c->nvlink_gbs * 1e9, net = c->net_gbs * 1e9;
    const bool ep_crosses = tp * cp * ep > c->gpus_per_node; /* an EP group: neighbouring DP ranks */
    r->time_comm = r->bytes_tp / nv + r->bytes_pp / (pp_crosses ? net : nv) + r->bytes_dp / (dp_crosses ? net : nv) +
                   r->bytes_ep / (ep_crosses ? net : nv) + r->bytes_cp / nv; /* TP x CP within a node (checked) */
    const double tokens = seqs * S, P = plan_active_params(m);
    const double flops = 2 * P * tokens * fwd_only + 6 * P * tokens * b->ppo_epochs +
                         (b->recompute ? 2 * P * tokens * b->ppo_epochs : 0);
    r->time_compute = flops / ((double)tp * pp * cp * dp * c->peak_tflops * 1e12 * c->mfu);
    r->bubble = (double)(pp - 1) / (r->micro_batches + pp - 1);
    r->time_step = r->time_compute / (1 - r->bubble) + r->time_comm;
}

int plan_candidates(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                    struct plan_result *out, int max, int *best)
{
    const int devices = c->nodes * c->gpus_per_node - c->rollout_gpus;
    int n = 0;
    *best = -1;
    static const int sizes[] = {1, 2, 4, 8};
    enum { NS = sizeof sizes / sizeof *sizes };
    /* kind 0: no sequence sharing (cp 1); 1: Ulysses SP; 2: CP (ring) */
    for (int i = 0; i < NS; i++)
        for (int k = 0; k < NS * 2 - 1; k++)
            for (int pp = 1; pp <= m->n_layers && pp <= 16; pp++) {
                const int tp = sizes[i], cp = sizes[(k + 1) / 2];
                const bool ring = k > 0 && k % 2 == 0;
                if (devices < 1 || devices % (tp * pp * cp) || tp * cp > c->gpus_per_node)
                    continue;
                const int dp = devices / (tp * pp * cp);
                for (int ep = 1; ep <= dp; ep *= 2)
                    for (int z = 0; z < (dp * cp > 1 ? 2 : 1); z++) {
                        if (ep > 1 && (!m->n_experts || m->n_experts % ep || dp % ep))
                            break;
                        if (n == max)
                            return n;
                        struct plan_layout l = {tp, pp, dp, z == 1, ep, cp, ring};
                        plan_evaluate(m, c, b, &l, &out[n]);
                        if (!out[n].valid)
                            continue; /* not a candidate */
                        n++;
                    }
            }
    /* the fastest that fits, keeping sequences whole where any such layout fits: the model prices neither the
     * smaller GEMMs and attention blocks of a slice nor the ring's overlap, so sharing sequences is the remedy
     * for memory it is, not a speed-up the estimate could promise */
    for (int pass = 0; pass < 2 && *best < 0; pass++)
        for (int i = 0; i < n; i++)
            if (out[i].fits && (pass == 1 || out[i].lay.cp <= 1) &&
                (*best < 0 || out[i].time_step < out[*best].time_step))
                *best = i;
    return n;
}

void plan_rollout(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                  struct plan_rollout *r)
{
    memset(r, 0, sizeof *r);
    const struct widths w = widths_of(c);
    const int devices = c->rollout_gpus > 0 ? c->rollout_gpus : c->nodes * c->gpus_per_node;
    const double S = (double)b->prompt_len + b->response_len, P = plan_param_count(m);
    for (int tp = 1; tp <= c->gpus_per_node && tp <= devices; tp *= 2) {
        if (m->n_heads % tp || (m->n_kv_heads % tp && tp % m->n_kv_heads))
            continue;
        const int groups = devices / tp;
        const double kv_heads = m->n_kv_heads >= tp ? (double)m->n_kv_heads / tp : 1;
        const int conc = (int)ceil((double)b->prompts * b->n / (groups > 0 ? groups : 1));
        /* K and V of every position at the weights' width: 2 bytes on GPUs, the BF16 KV cache of the CUDA
         * back-end's BF16 context (k_kv_elem_bytes), 4 in the CPU mode (the CPU's cache stays fp32) */
        const double kv = conc * S * 2.0 * m->n_layers * kv_heads * m->head_dim * w.weights;
        const double weights = w.weights * P / tp;
        if (weights + kv <= 0.9 * c->gpu_mem_gib * 1e9) {
            *r = (struct plan_rollout){tp, weights, kv, weights + kv, conc};
            return;
        }
    }
}
