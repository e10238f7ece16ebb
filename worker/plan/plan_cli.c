/* grpo-model plan: the planner's command line. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "planner.h"
#include "worker/model/model_io.h"

static void usage(FILE *out)
{
    fputs("usage: grpo-model plan CONFIG.json [options]\n"
          "\n"
          "Memory per device and communication per step of every trainer layout (TP x PP x SP/CP x DP, with and\n"
          "without ZeRO-1, each sequence shared by 1, 2, 4 or 8 ranks with Ulysses SP or ring CP, and for a mixture\n"
          "of experts every expert-parallel size EP out of DP) of the model in "
          "CONFIG.json (a Hugging Face config.json, or a model directory)\n"
          "on a cluster, the rollout's tensor-parallel size, and the recommended layout: the fastest\n"
          "estimated step that fits in 90% of a device's memory. The model: docs/scaling.md.\n"
          "\n"
          "cluster (defaults: nodes of 8 H200):\n"
          "  --nodes N (1)  --gpus-per-node G (8)  --gpu-mem GB (141)  --nvlink GB/s (450 per direction)\n"
          "  --net GB/s (50 per device: 8x400 Gb/s per node)  --tflops T (989 dense BF16)  --mfu F (0.4)\n"
          "  --rollout-gpus R (0: the rollout shares the trainers' devices)  --cpu (FP32 everything)\n"
          "batch (verl's keys in brackets; defaults of a typical GSM8K GRPO run):\n"
          "  --prompts B (256, data.train_batch_size)  --n N (8, rollout.n)\n"
          "  --prompt-len L (512, data.max_prompt_length)  --response-len L (1024, data.max_response_length)\n"
          "  --micro-batch M (4, actor.ppo_micro_batch_size_per_gpu)\n"
          "  --mini-batches K (4, train_batch_size / actor.ppo_mini_batch_size)  --epochs E (1, actor.ppo_epochs)\n"
          "  --no-recompute (default: full activation recompute, model.enable_gradient_checkpointing)\n"
          "  --no-kl (default: a reference policy is held, actor.use_kl_loss)\n"
          "  --step-tokens T (tokens through each forward pass of a step over all DP ranks; default\n"
          "           prompts x n x (prompt-len + response-len); a run's perf/forward_tokens/update, the rows\n"
          "           it forwarded with each group's prompt shared, makes the TP and PP bytes exact)\n"
          "  --all (print layouts that do not fit too)\n"
          "  --bytes (after the table, each layout's bytes per device per step: to compare with a run's\n"
          "           perf/comm_bytes/dp, /tp and /pp metrics)\n",
          out);
}

static double gb(double bytes) { return bytes / 1e9; }

/* SEQ's column: "-" (each sequence on one rank), "SP2" (Ulysses over 2 ranks) or "CP2" (ring attention) */
static void seq_name(const struct plan_layout *l, char *out, size_t len)
{
    if (l->cp > 1)
        snprintf(out, len, "%s%d", l->ring ? "CP" : "SP", l->cp);
    else
        snprintf(out, len, "-");
}

int plan_main(int argc, char **argv)
{
    struct plan_cluster c = plan_default_cluster;
    struct plan_batch b = plan_default_batch;
    bool all = false, bytes = false;
    static const struct option opts[] = {{"nodes", 1, 0, 'N'},
                                         {"gpus-per-node", 1, 0, 'G'},
                                         {"gpu-mem", 1, 0, 'M'},
                                         {"nvlink", 1, 0, 'L'},
                                         {"net", 1, 0, 'W'},
                                         {"tflops", 1, 0, 'T'},
                                         {"mfu", 1, 0, 'U'},
                                         {"rollout-gpus", 1, 0, 'R'},
                                         {"cpu", 0, 0, 'C'},
                                         {"prompts", 1, 0, 'b'},
                                         {"n", 1, 0, 'n'},
                                         {"prompt-len", 1, 0, 'p'},
                                         {"response-len", 1, 0, 'r'},
                                         {"micro-batch", 1, 0, 'm'},
                                         {"mini-batches", 1, 0, 'k'},
                                         {"epochs", 1, 0, 'e'},
                                         {"no-recompute", 0, 0, 'x'},
                                         {"no-kl", 0, 0, 'y'},
                                         {"step-tokens", 1, 0, 't'},
                                         {"all", 0, 0, 'a'},
                                         {"bytes", 0, 0, 'B'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        double v = optarg ? strtod(optarg, &end) : 0;
        if (optarg && (end == optarg || *end || !(v > 0))) {
            const char *name = "?";
            for (const struct option *q = opts; q->name; q++)
                if (q->val == o)
                    name = q->name;
            log_error("plan", "--%s expects a positive number, got '%s'", name, optarg);
            return 2;
        }
        switch (o) {
        case 'N': c.nodes = (int)v; break;
        case 'G': c.gpus_per_node = (int)v; break;
        case 'M': c.gpu_mem_gib = v; break;
        case 'L': c.nvlink_gbs = v; break;
        case 'W': c.net_gbs = v; break;
        case 'T': c.peak_tflops = v; break;
        case 'U': c.mfu = v; break;
        case 'R': c.rollout_gpus = (int)v; break;
        case 'C': c.cpu = true; break;
        case 'b': b.prompts = (int)v; break;
        case 'n': b.n = (int)v; break;
        case 'p': b.prompt_len = (int)v; break;
        case 'r': b.response_len = (int)v; break;
        case 'm': b.micro_batch = (int)v; break;
        case 'k': b.mini_batches = (int)v; break;
        case 'e': b.ppo_epochs = (int)v; break;
        case 'x': b.recompute = false; break;
        case 'y': b.kl = false; break;
        case 't': b.step_tokens = v; break;
        case 'a': all = true; break;
        case 'B': bytes = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    if (c.rollout_gpus >= c.nodes * c.gpus_per_node) {
        log_error("plan", "--rollout-gpus %d leaves no trainer device of %d", c.rollout_gpus,
                  c.nodes * c.gpus_per_node);
        return 2;
    }
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s", argv[optind]);
    size_t pl = strlen(path);
    if (pl < 5 || strcmp(path + pl - 5, ".json") != 0)
        snprintf(path + pl, sizeof path - pl, "/config.json");
    struct model_config m;
    if (model_config_from_hf_json(path, &m, err, sizeof err) != 0) {
        log_error("plan", "%s", err);
        return 1;
    }
    enum { MAXC = 4096 };
    static struct plan_result res[MAXC];
    int best;
    int n = plan_candidates(&m, &c, &b, res, MAXC, &best);
    const int trainers = c.nodes * c.gpus_per_node - c.rollout_gpus;
    printf("model     %s: %.3fB parameters (%d layers, hidden %d, %d/%d heads, vocab %d)\n", path,
           plan_param_count(&m) / 1e9, m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.vocab_size);
    if (m.n_experts)
        printf("experts   %d per layer of %d rows, %d per token: %.3fB parameters active per token\n", m.n_experts,
               m.moe_intermediate, m.n_experts_per_tok, plan_active_params(&m) / 1e9);
    printf("cluster   %d node(s) x %d devices of %.0f GB, %d for the trainers; NVLink %.0f GB/s, network %.0f GB/s; "
           "%.0f TFLOP/s at %.0f%% MFU%s\n",
           c.nodes, c.gpus_per_node, c.gpu_mem_gib, trainers, c.nvlink_gbs, c.net_gbs, c.peak_tflops, c.mfu * 100,
           c.cpu ? " (CPU: FP32)" : "");
    printf("batch     %d prompts x %d, %d+%d tokens, micro-batch %d, %d optimizer step(s) x %d epoch(s), %s, %s\n\n",
           b.prompts, b.n, b.prompt_len, b.response_len, b.micro_batch, b.mini_batches, b.ppo_epochs,
           b.recompute ? "recompute" : "no recompute", b.kl ? "reference policy" : "no reference");
    printf("%-3s %-3s %-4s %-3s %-3s %-4s | %8s %8s %8s %8s %8s %8s | %8s %8s %8s %8s %8s | %7s %7s %6s %7s\n", "TP",
           "PP", "SEQ", "DP", "EP", "ZeRO", "weights", "grads", "optim", "ref", "activ", "total", "TP GB", "PP GB",
           "DP GB", "EP GB", "SEQ GB", "comm s", "comp s", "bubble", "step s");
    for (int i = 0; i < n; i++) {
        const struct plan_result *r = &res[i];
        if (!r->fits && !all)
            continue;
        char seq[16];
        seq_name(&r->lay, seq, sizeof seq);
        printf("%-3d %-3d %-4s %-3d %-3d %-4s | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f %8.1f | "
               "%7.1f %7.1f %5.0f%% %7.1f%s%s\n",
               r->lay.tp, r->lay.pp, seq, r->lay.dp, r->lay.ep > 1 ? r->lay.ep : 1, r->lay.zero1 ? "yes" : "no",
               gb(r->mem_weights), gb(r->mem_grads), gb(r->mem_optim), gb(r->mem_ref), gb(r->mem_act), gb(r->mem_total),
               gb(r->bytes_tp), gb(r->bytes_pp), gb(r->bytes_dp), gb(r->bytes_ep), gb(r->bytes_cp), r->time_comm,
               r->time_compute, r->bubble * 100, r->time_step, r->fits ? "" : "  (does not fit)",
               i == best ? "  <- recommended" : "");
    }
    for (int i = 0; bytes && i < n; i++)
        printf("bytes tp=%d pp=%d dp=%d zero1=%d: tp %.0f pp %.0f dp %.0f sync %.0f memory %.0f ep=%d alltoall %.0f "
               "%s=%d seq %.0f\n",
               res[i].lay.tp, res[i].lay.pp, res[i].lay.dp, res[i].lay.zero1, res[i].bytes_tp, res[i].bytes_pp,
               res[i].bytes_dp, res[i].bytes_sync, res[i].mem_total, res[i].lay.ep > 1 ? res[i].lay.ep : 1,
               res[i].bytes_ep, res[i].lay.ring ? "cp" : "sp", res[i].lay.cp > 1 ? res[i].lay.cp : 1, res[i].bytes_cp);
    struct plan_rollout ro;
    plan_rollout(&m, &c, &b, &ro);
    printf("\n(memory in GB per trainer device; communication in GB sent per device per step; weight sync %.1f GB "
           "a step to the rollout)\n",
           gb(res[0].bytes_sync));
    if (ro.tp)
        printf("rollout   TP %d: %.1f GB of weights + %.1f GB of KV cache for %d sequences at once per group\n", ro.tp,
               gb(ro.mem_weights), gb(ro.mem_kv), ro.concurrent);
    else
        printf("rollout   no TP size up to a node fits the weights and the KV cache of every sequence at once: "
               "fewer sequences at a time (rollout.max_num_seqs) or more rollout devices\n");
    if (best < 0) {
        printf("no layout fits: more devices, ZeRO-1, recompute, or a smaller micro-batch\n");
        return 1;
    }
    const struct plan_result *r = &res[best];
    const int ep = r->lay.ep > 1 ? r->lay.ep : 1, cp = r->lay.cp > 1 ? r->lay.cp : 1;
    char seq[16], seqkey[96] = "";
    seq_name(&r->lay, seq, sizeof seq);
    if (cp > 1)
        snprintf(seqkey, sizeof seqkey, " %s=%d",
                 r->lay.ring ? "megatron.context_parallel_size" : "ulysses_sequence_parallel_size", cp);
    printf("recommended: TP %d x PP %d%s%s x DP %d%s%s (verl's actor_rollout_ref.actor.megatron.tensor_model_parallel_"
           "size=%d pipeline_model_parallel_size=%d expert_model_parallel_size=%d%s), %.1f GB per device, about %.1f "
           "s of training per step\n",
           r->lay.tp, r->lay.pp, cp > 1 ? " x " : "", cp > 1 ? seq : "", r->lay.dp, ep > 1 ? " with EP" : "",
           r->lay.zero1 ? " with ZeRO-1" : "", r->lay.tp, r->lay.pp, ep, seqkey, gb(r->mem_total), r->time_step);
    if ((ep > 1 || cp > 1) && !c.cpu)
        printf("note: %s on GPUs is not yet run on a device (its tests pass under the CUDA emulator, tests/cuemu); "
               "it runs on CPU trainers (docs/training.md)\n",
               ep > 1 && cp > 1 ? "expert parallelism with sequence sharing"
               : ep > 1         ? "expert parallelism"
               : r->lay.ring    ? "context parallelism"
                                : "Ulysses sequence parallelism");
    return 0;
}
