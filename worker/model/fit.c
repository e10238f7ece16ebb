#include "fit.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/config.h"

/* A cgroup's memory limit (v2 memory.max, or v1 memory.limit_in_bytes), or 0 when there is none. */
static uint64_t cgroup_limit(void)
{
    static const char *const files[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f)
            continue;
        char line[64] = "";
        const bool got = fgets(line, sizeof line, f) != NULL;
        fclose(f);
        char *end = NULL;
        errno = 0;
        unsigned long long v = got ? strtoull(line, &end, 10) : 0; /* "max" (no limit) does not parse */
        if (got && end != line && errno == 0 && v > 0)
            return (uint64_t)v;
    }
    return 0;
}

uint64_t machine_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    uint64_t cg = cgroup_limit(); /* v1 reports "no limit" as a huge number: the minimum takes care of it */
    if (cg && (!phys || cg < phys))
        return cg;
    return phys ? phys : UINT64_MAX;
}

double model_weight_bytes(const struct model_config *c)
{
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const double QD = (double)c->n_heads * c->head_dim, KD = (double)c->n_kv_heads * c->head_dim;
    double layer = 2 * D + QD * D + 2 * KD * D + D * QD + 3 * F * D;
    if (c->n_experts) /* the router and every expert instead of the dense MLP */
        layer += (double)c->n_experts * D * (1 + 3.0 * c->moe_intermediate) - 3 * F * D;
    if (c->attention_bias)
        layer += QD + 2 * KD;
    if (c->qk_norm)
        layer += 2.0 * c->head_dim;
    double floats = V * D + (double)c->n_layers * layer + D + (c->tie_word_embeddings ? 0 : V * D);
    return floats * (double)sizeof(float);
}

/* Sequences model_generate() decodes together for n_prompts prompts of n samples: max_num_seqs, at least a group,
 * at most every sequence of the call. */
static int gen_slots(long long max_num_seqs, long long n, long long n_prompts)
{
    long long s = max_num_seqs > n ? max_num_seqs : n;
    if (s > n_prompts * n)
        s = n_prompts * n;
    return (int)(s < 1 ? 1 : s);
}

/* KV caches and logits of s sequences of up to cap tokens decoded together, and the outputs of `all` sequences
 * of up to new_tokens tokens. */
static double gen_bytes(const struct model_config *m, double s, double cap, double all, double new_tokens)
{
    const double KD = (double)m->n_kv_heads * m->head_dim;
    return s * cap * m->n_layers * 2 * KD * sizeof(float) + s * (double)m->vocab_size * sizeof(float) +
           all * (new_tokens + 1) * (sizeof(int32_t) + sizeof(float));
}

void run_footprint(const struct model_config *m, const struct grpo_config *c, struct run_footprint *fp)
{
    const double w = model_weight_bytes(m);
    const bool ref = c->actor_use_kl_loss || c->alg_use_kl_in_reward;
    fp->state_bytes = w * (4 + (ref ? 1 : 0)); /* weights, gradients, two AdamW moments, reference */
    fp->seq_tokens = (int)(c->data_max_prompt_length + c->data_max_response_length);
    const double cap = (double)fp->seq_tokens, R = (double)c->data_max_response_length;
    const long long n = c->rollout_n, B = c->data_train_batch_size;
    const int s_train = gen_slots(c->rollout_max_num_seqs, n, B);
    const double g_train = gen_bytes(m, s_train, cap, (double)B * n, R);
    const long long nv = c->rollout_val_do_sample ? c->rollout_val_n : 1;
    const int s_val = gen_slots(c->rollout_max_num_seqs, nv, c->data_val_batch_size);
    const double g_val = gen_bytes(m, s_val, cap, (double)c->data_val_batch_size * nv, R);
    fp->gen_is_val = g_val > g_train;
    fp->gen_bytes = fp->gen_is_val ? g_val : g_train;
    fp->gen_seqs = fp->gen_is_val ? s_val : s_train;
}

static const double GIB = 1024.0 * 1024.0 * 1024.0;

int run_fit_check(const struct model_config *m, const struct grpo_config *c, uint64_t mem, char *err, size_t errlen)
{
    const long long seq = c->data_max_prompt_length + c->data_max_response_length;
    if (seq > m->max_position_embeddings) {
        snprintf(err, errlen,
                 KEY_data_max_prompt_length
                 " (%lld) + " KEY_data_max_response_length " (%lld) = %lld tokens, more than the "
                 "model's max_position_embeddings (%d): a prompt and its response must fit the model's positions",
                 c->data_max_prompt_length, c->data_max_response_length, seq, m->max_position_embeddings);
        return -1;
    }
    if (!mem)
        mem = machine_memory_bytes();
    struct run_footprint fp;
    run_footprint(m, c, &fp);
    const double need = fp.state_bytes + fp.gen_bytes;
    if (need <= (double)mem)
        return 0;
    char what[512];
    if (fp.gen_bytes >= fp.state_bytes) {
        if (fp.gen_is_val)
            snprintf(what, sizeof what,
                     KEY_data_val_batch_size " = %lld (x " KEY_rollout_val_n ", at most " KEY_rollout_max_num_seqs
                                             " = %lld: %d sequences decoded together) of up to %d "
                                             "tokens (" KEY_data_max_prompt_length " + " KEY_data_max_response_length
                                             "): validation's KV caches and logits "
                                             "need %.0f bytes",
                     c->data_val_batch_size, c->rollout_max_num_seqs, fp.gen_seqs, fp.seq_tokens, fp.gen_bytes);
        else
            snprintf(what, sizeof what,
                     KEY_rollout_max_num_seqs
                     " = %lld (%d sequences decoded together: " KEY_data_train_batch_size " "
                     "x " KEY_rollout_n " at most) of up to %d tokens (" KEY_data_max_prompt_length
                     " + " KEY_data_max_response_length "): the rollout's KV caches and logits need %.0f bytes",
                     c->rollout_max_num_seqs, fp.gen_seqs, fp.seq_tokens, fp.gen_bytes);
    } else {
        snprintf(what, sizeof what,
                 KEY_arr_model_path ": the model's weights, gradients and AdamW moments%s need %.0f bytes",
                 c->actor_use_kl_loss || c->alg_use_kl_in_reward ? " and the reference's weights" : "", fp.state_bytes);
    }
    snprintf(err, errlen,
             "%s; the run needs at least %.0f bytes (%.1f GiB), the machine has %" PRIu64 " bytes (%.1f GiB)", what,
             need, need / GIB, mem, (double)mem / GIB);
    return -1;
}
