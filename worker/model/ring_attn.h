/* Ring attention for context parallelism (Megatron's CP): causal grouped-query attention over rows that a group of
 * C ranks shares, each rank holding a front and a back piece of every row so that the causal work is balanced.
 *
 * A row of L tokens (L a multiple of 2C) is cut into 2C chunks of c = L / 2C tokens; rank r holds chunks r and
 * 2C-1-r, back to back: its local rows 0..c-1 are the row's tokens r c .. r c + c - 1 and its rows c..2c-1 are
 * tokens (2C-1-r) c .. (2C-r) c - 1 (ring_attn_row). The caller applies RoPE before, at those true positions.
 * Segments: a row may instead be cut segment by segment (each a multiple of 2C tokens holding whole sequences,
 * Megatron's split of packed sequences): rank r holds chunks r and 2C-1-r of every segment, segment after
 * segment, so a row that packs sequences of different lengths stays balanced.
 * Forward: the K/V pair of local chunks travels around the ring (C-1 sendrecv steps); each step adds one partial
 * attention of the local queries against the visiting keys, merged into the running output by log-sum-exp. The
 * first step (own keys: causal over the two local chunks) is the kernel's attention (k_attention_forward); the
 * others are blocks with no causal cut inside: either every local query sees the visiting front chunk, or the
 * local back chunk sees both visiting chunks. Backward: the gradients of the visiting K/V travel with them and come
 * home after the last step, so each rank ends with its own chunks' dQ, dK, dV.
 * Batch-invariant mode (k_batch_invariant, CPU): the forward gathers the whole row's keys and values instead and
 * computes each local query row over its sequence's keys in the decode kernel's one order (k_attention_rows), so
 * that a row's output and log-sum-exp are a one-process forward's and a rollout's bit for bit; the backward stays
 * the ring's.
 *
 * Packed rows: several sequences in one row (cu_seqlens over the whole row, covering it); a key is seen only by the
 * queries of its own sequence at or after its position. GQA: Hq a multiple of Hkv.
 *
 * On the CPU back-end the visiting blocks are computed here (threaded, on host memory) over an MPI group. On a
 * device (a context whose back-end has the attention_block ops: kernels/cuda/attention_block.cu) every buffer is
 * the context's memory and the blocks and merges are the kernel interface's ops; the ring travels over a device
 * group (NCCL) directly, or over an MPI group through host staging buffers. That device path is compiled but has
 * NOT RUN on a GPU yet (the trainer refuses context parallelism on cuda until scripts/gpu_check.sh has checked
 * it). The model's attention under context_parallel_size (model_set_cp in model.h). */
#ifndef GRPO_WORKER_RING_ATTN_H
#define GRPO_WORKER_RING_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "worker/comm/comm.h"

/* What a rank has computed and sent (since ring_attn_plan): for the load-balance and traffic checks. */
struct ring_attn_stats {
    unsigned long long scores; /* unmasked (query, key) pairs of one query head, forward */
    unsigned long long blocks; /* chunk-by-chunk score blocks with at least one unmasked pair, forward */
    double sent_bytes;         /* bytes this rank sent around the ring, forward and backward */
};

struct ring_attn {
    struct kctx *K;
    struct comm *cp;  /* NULL: a group of one */
    int C, rank;      /* group size and this rank */
    int L, n, c;      /* row length, local rows (L / C) and half of them (L / 2C: the chunk of one segment) */
    int S;            /* segments */
    int32_t *seg_off; /* (S + 1) where each segment starts in the row */
    int32_t *seg_loc; /* (S + 1) where each segment's local rows start (twice its chunk after the one before) */
    int32_t *rows;    /* (C, n) the row's token at each local row of each rank */
    int Hq, Hkv, hd;
    int32_t *first;   /* (L) the first token of each token's sequence in the row */
    int32_t *cu_diag; /* (nb_diag + 1) the local rows' runs of one sequence: the first step's kernel call */
    int nb_diag;
    float *ring[2]; /* (4, 2c, Hkv hd) each: K, V and their gradients, the visiting pair and the next one
                       (NULL in a group of one) */
    float *po;      /* (2c, Hq hd) a step's partial output */
    float *plse;    /* (2c, Hq) its log-sum-exp */
    double *drow;   /* (2c, Hq) the backward's dout . out */
    /* on a device (dev): ring, po and plse are the context's memory, and these */
    bool dev;
    int32_t *d_cu_diag; /* (nb_diag + 1) cu_diag in the context's memory */
    int32_t *d_seq;     /* (C, n) the sequence (its first token in the row) of every rank's local rows */
    float *d_drow;      /* (2c, Hq) the backward's dout . out */
    float *stage[2];    /* host buffers (4, 2c, Hkv hd) for the ring over an MPI group; NULL over a device group */
    struct ring_attn_stats stats;
};

/* Plan ring attention over cp (NULL or a group of one: plain attention) for rows of L tokens packed as B sequences
 * (cu_seqlens: B + 1 host offsets from 0 to L) cut into S segments (segments: S + 1 host offsets from 0 to L at
 * sequence starts, each segment a multiple of 2C tokens; NULL: the whole row is one), Hq query heads over Hkv KV
 * heads of hd. 0, or -1 with why naming the value that does not fit (a row or segment not a multiple of 2C, a
 * segment boundary inside a sequence, heads, offsets, a device context whose back-end has no attention_block ops).
 * q, k, v, out, lse and the gradients of forward and backward are K's memory. */
int ring_attn_plan(struct ring_attn *ra, struct kctx *K, struct comm *cp, int L, const int32_t *cu_seqlens, int B,
                   const int32_t *segments, int S, int Hq, int Hkv, int hd, char *why, size_t len);
void ring_attn_free(struct ring_attn *ra);
/* The row's token held as local row i (0..n-1) of this rank. */
int ring_attn_row(const struct ring_attn *ra, int i);
/* dst (n, width) = this rank's rows of src (L, width): a whole row's tensor cut to what this rank holds. */
void ring_attn_take(const struct ring_attn *ra, float *dst, const float *src, int width);
/* dst (n) = this rank's entries of src (L): a whole row's token ids, targets or positions (RoPE's, which the caller
 * applies before the attention at the tokens' true positions) cut to what this rank holds. */
void ring_attn_take_i32(const struct ring_attn *ra, int32_t *dst, const int32_t *src);
/* Forward over the n = 2c local rows: out (n, Hq hd) and lse (n, Hq) written from q (n, Hq hd), k and v
 * (n, Hkv hd), collective over the group. */
void ring_attn_forward(struct ring_attn *ra, float *out, float *lse, const float *q, const float *k, const float *v);
/* Backward: dq (2c, Hq hd), dk and dv (2c, Hkv hd) ACCUMULATED (+=), as the kernels' backward ops, from dout and
 * the forward's out and lse; collective over the group. */
void ring_attn_backward(struct ring_attn *ra, float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v);
/* Bytes one rank sends in a forward (backward false) or a backward over a group of C for chunks of c tokens:
 * (C-1) K/V pairs forward; backward the (C-1) pairs again and (C-1) gradient pairs home. */
double ring_attn_bytes(int C, int c, int Hkv, int hd, int backward);

#endif
