/* The layout planner: for a model (its config.json), a cluster and the batch
 * settings, the memory per device and the communication per step of each
 * candidate trainer layout (TP x PP x DP, with or without ZeRO-1), the rollout
 * side's tensor-parallel size, and a recommendation.
 *
 * The memory model is Megatron-LM's accounting of mixed precision with Adam:
 * 2 bytes of BF16 weights, 4 of FP32 gradients, 4 of FP32 master weights and 8
 * of Adam moments per parameter (18), of which the last 12 are sharded over DP
 * by ZeRO-1 (6 + 12/DP); plus a BF16 reference policy when the KL term needs
 * it. Activations follow Korthikanti et al. (2022), "Reducing activation
 * recomputation": 34·s·b·h bytes per layer with flash attention and sequence
 * parallelism over TP, or only the layer inputs (2·s·b·h) with full recompute;
 * pipeline stage 0 holds min(PP, micro-batches) micro-batches in flight under
 * 1F1B. Communication counts the bytes each device sends in ring collectives:
 * 2(n-1)/n of the buffer for an all-reduce, (n-1)/n for a reduce-scatter or an
 * all-gather. Times divide by the link's bandwidth: NVLink inside a node, the
 * network across nodes. The CPU mode (--cpu) counts FP32 weights without a
 * separate master copy (4 + 4 + 8 bytes, and 4 for the reference), as this
 * code's CPU trainer holds them.
 *
 * Mixture of experts: each layer holds the router and n_experts SwiGLU experts; the compute counts the active
 * parameters (the dense ones, and k of the E experts). Expert parallelism (EP, carved out of DP) holds E / EP
 * experts per device, and TP splits each expert by its intermediate rows (Megatron's expert TP = TP; the router
 * whole on every TP rank); the optimizer state of the experts is sharded by ZeRO-1 over the ranks holding the same
 * experts (DP / EP), their gradients all-reduced over those; every MoE layer's forward sends its routed slots
 * (tokens x k) to the experts' ranks and the outputs back, (EP - 1) / EP of them off the device with uniform
 * routing, hidden activations each way (each TP rank the same rows within its own EP group, so TP does not shrink
 * them), and its backward the same again; under TP each backward also sums the routing weights' gradients (k a
 * token). A MoE layer's working activations replace Korthikanti's MLP share (19 s b h) with the permuted slots
 * (2 h in and out, 3 F / TP of gate, up and product per slot) and the router's FP32 probabilities.
 *
 * Long sequences: a layout may share each sequence over CP ranks (DP is what is left: devices = TP x PP x CP x
 * DP), either Ulysses sequence parallelism (all-to-alls around attention, heads split: H / TP must divide by CP)
 * or context parallelism (ring attention, every head on every rank). Each rank holds 1 / CP of every micro-batch's
 * tokens: activations, and the TP, PP and EP traffic, fall by CP; the dense gradients add up over DP x CP (and
 * ZeRO-1 shards over DP x CP); the sequence traffic is plan_sp_alltoall_bytes / plan_cp_ring_bytes with the heads
 * a TP rank holds. Candidates try CP in {1, 2, 4, 8} within a node (TP x CP devices), both kinds. */
#ifndef GRPO_WORKER_PLAN_PLANNER_H
#define GRPO_WORKER_PLAN_PLANNER_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/model/model.h"

struct plan_cluster {
    int nodes, gpus_per_node;
    double gpu_mem_gib; /* memory per device */
    double nvlink_gbs;  /* per-device bandwidth inside a node, GB/s */
    double net_gbs;     /* per-device bandwidth across nodes, GB/s */
    double peak_tflops; /* dense BF16 peak per device */
    double mfu;         /* the share of peak a step reaches (0.4: Megatron-LM's 41-48% on H100, rounded down) */
    int rollout_gpus;   /* devices set aside for rollout (0: the rollout shares the trainers' devices) */
    bool cpu;           /* FP32 everything (this code's CPU trainer) */
};

struct plan_batch {
    int prompts;      /* data.train_batch_size */
    int n;            /* rollout.n */
    int prompt_len;   /* data.max_prompt_length */
    int response_len; /* data.max_response_length */
    int micro_batch;  /* sequences per micro-batch (ppo_micro_batch_size_per_gpu) */
    int mini_batches; /* optimizer steps per GRPO step (train_batch_size / ppo_mini_batch_size) */
    int ppo_epochs;
    bool recompute;     /* full activation recompute (gradient checkpointing) */
    bool kl;            /* a reference policy is held (use_kl_loss or a KL penalty) */
    double step_tokens; /* tokens through each forward pass of a step, all DP ranks (0: prompts x n x (prompt_len +
                           response_len)); a run's perf/total_num_tokens less one per sequence gives exact bytes */
};

struct plan_layout {
    int tp, pp, dp;
    bool zero1;
    int ep;    /* expert parallelism out of DP (0 or 1: none) */
    int cp;    /* the ranks that share each sequence (0 or 1: none): Ulysses SP, or CP when ring */
    bool ring; /* cp is context parallelism (ring attention) rather than Ulysses sequence parallelism */
};

/* What a layout costs, per trainer device. Bytes are per step unless said. */
struct plan_result {
    struct plan_layout lay;
    bool valid; /* the layout divides the model (heads, KV heads, layers) */
    char why_invalid[160];
    double params;        /* the model's parameters */
    double stage_params;  /* parameters on the largest stage's device */
    double stage_experts; /* of them, the experts' (this device's E / EP of each layer) */
    double mem_weights, mem_grads, mem_optim, mem_ref, mem_act, mem_total; /* bytes */
    bool fits;                                                             /* mem_total <= 90% of the device's memory */
    double bytes_tp, bytes_pp, bytes_dp, bytes_sync; /* sent per device per step (sync: weights to rollout) */
    double bytes_ep;                                 /* expert parallelism's all-to-alls, sent per device per step */
    double bytes_cp; /* sequence parallelism's all-to-alls (Ulysses) or ring passes (CP), per device per step */
    double time_comm, time_compute, bubble, time_step; /* seconds */
    int micro_batches;                                 /* per DP rank per optimizer step */
};

/* The rollout side: the smallest TP whose weights and KV cache fit. */
struct plan_rollout {
    int tp;                                /* 0: nothing fits */
    double mem_weights, mem_kv, mem_total; /* bytes per device */
    int concurrent;                        /* sequences decoded at once per device group */
};

/* The defaults of `grpo-model plan`: a node of 8 H200 (141 GB, NVLink 450 GB/s per direction, 8 x 400 Gb/s of
 * network, 989 dense BF16 TFLOP/s at 40% MFU), and a GSM8K-style GRPO batch (256 prompts x 8, 512 + 1024
 * tokens, micro-batches of 4, 4 optimizer steps, 1 epoch, recompute, a reference policy). */
extern const struct plan_cluster plan_default_cluster;
extern const struct plan_batch plan_default_batch;

/* Parameters of a model from its configuration (embedding, layers, final norm, an untied head). */
double plan_param_count(const struct model_config *m);
/* Ulysses sequence parallelism over sp ranks of one TP rank (tp: the TP size, 1 none; with TP a rank's heads are
 * its TP rank's, Hq / tp query heads and max(Hkv / tp, 1) KV heads, written Hq' and Hkv' here): the bytes a rank
 * sends, on average over the group, in the all-to-alls around attention over N packed tokens in fwd layer forwards
 * (q, k and v to every token of a share of the heads, the output back) and bwd layer backwards (the output back
 * again, its gradient to the heads, q's, k's and v's gradients back; gradient checkpointing adds a forward to
 * each), fp32: (sp - 1) / sp x N x head_dim x 4 bytes x (2 hq + 2 hk) a forward, (3 hq + 2 hk) a backward,
 * hq = Hq' / sp, hk = max(Hkv' / sp, 1). Their sum over the group is exact for any split of the tokens. */
double plan_sp_alltoall_bytes(const struct model_config *m, double N, int sp, int tp, double fwd, double bwd);
/* Context parallelism over cp ranks of one TP rank (ring attention, every head of the TP rank on every rank; tp as
 * above): the bytes a rank sends around the ring for one sequence of N tokens, cut into 2 cp chunks of
 * c = ceil(N / 2 cp) tokens (padded), rank r holding chunks r and 2 cp - 1 - r: a layer forward passes its K and V
 * (2 c tokens x Hkv' x head_dim, fp32) to the next rank cp - 1 times, a backward passes them again and sends their
 * gradients home (twice the forward), so (cp - 1) x 2 x 2c x Hkv' x head_dim x 4 bytes x (fwd + 2 bwd). The same on
 * every rank (load-balanced chunks). */
double plan_cp_ring_bytes(const struct model_config *m, double N, int cp, int tp, double fwd, double bwd);
/* Of them, those a token runs through: the dense ones and k of each layer's E experts (all of them when dense). */
double plan_active_params(const struct model_config *m);
/* Cost of one layout (r->valid false, with the reason, when it does not divide the model). */
void plan_evaluate(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                   const struct plan_layout *l, struct plan_result *r);
/* Every layout of the trainer devices: TP in {1,2,4,8} and SP or CP in {1,2,4,8} within a node (TP x CP devices), PP
 * dividing the layers, with and without ZeRO-1, and for a mixture of experts every EP (a power of 2) dividing both DP
 * and the experts. Fills out[0..max) and returns how many; *best is the index of the fastest that fits (-1: none),
 * one keeping each sequence on one rank where any such layout fits (sharing sequences is a remedy for memory). */
int plan_candidates(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                    struct plan_result *out, int max, int *best);
void plan_rollout(const struct model_config *m, const struct plan_cluster *c, const struct plan_batch *b,
                  struct plan_rollout *r);

/* `grpo-model plan` */
int plan_main(int argc, char **argv);

#endif
