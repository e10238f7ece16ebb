/* Inside the model: sequence (Ulysses) and context parallelism's data movement (model_seq.c), and the split of
 * a batch's tokens and a TP rank's heads over the SP ranks. */
#ifndef GRPO_WORKER_MODEL_SEQ_H
#define GRPO_WORKER_MODEL_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "model_internal.h"

struct comm;
struct ring_attn;

/* Sequence parallelism's split: rank r of S holds tokens [sp_lo(N, S, r), sp_lo(N, S, r + 1)) and attends with
 * sp_hq query heads and sp_hk KV heads, peer j's KV heads starting at sp_kv_lo(m, j) (with fewer KV heads than
 * ranks, the one its query heads read, replicated). */
static inline int sp_lo(int N, int S, int r) { return (int)((int64_t)N * r / S); }
static inline int sp_hq(const struct model *m) { return m->sh.n_heads / m->sh.sp_size; }
static inline int sp_hk(const struct model *m)
{
    return m->sh.n_kv_heads >= m->sh.sp_size ? m->sh.n_kv_heads / m->sh.sp_size : 1;
}
static inline int sp_kv_lo(const struct model *m, int j)
{
    const int S = m->sh.sp_size, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    return Hkv >= S ? j * (Hkv / S) : j * (Hq / S) / (Hq / Hkv);
}

/* Sequence parallelism's swap before attention: this rank's n tokens of C columns (src, (n, C)) to every token
 * (Nf) of its heads (dst, (Nf, w)): peer j receives columns [j w, (j + 1) w), or with kv those of its KV heads. */
void model_sp_to_heads(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv);
/* Its reverse after attention: every token of this rank's heads (src, (Nf, w)) back to the ranks holding the
 * tokens, this rank's into its columns of dst (n, C); with kv, added (a replicated KV head's gradients sum over
 * the ranks that read it; dst zeroed by the caller). */
void model_sp_to_tokens(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv);
/* Sequence parallelism: host rows [t0, t0 + n) of v (Nf) from each rank, every row on every rank. */
void model_sp_share_rows(struct comm *sp, float *v, int Nf, int t0, int n);
/* Context parallelism: the ring of the whole batch b over m's group (each sequence padded to a multiple of 2C, rank
 * r holding chunks r and 2C - 1 - r of each); this rank's ids, targets and positions (3 x n, host) into *local,
 * and the batch row of each of its n rows (-1: padding) into *rowof. */
struct ring_attn *model_cp_plan(const struct model *m, const struct packed_batch *b, int32_t **local, int32_t **rowof);
/* Context parallelism: this rank's host values (n, at batch rows rowof) into their rows of v (the whole batch's)
 * on every rank; the rows a caller does not read (logp_from) stay 0. */
void model_cp_share_rows(const struct model *m, const int32_t *rowof, int n, const struct packed_batch *b, float *v,
                         const float *mine);
/* Context parallelism: this rank's n rows (batch rows rowof; -1: padding, 0) of a whole batch's host values. */
void model_cp_take_rows(const int32_t *rowof, int n, float *dst, const float *src);

#endif
