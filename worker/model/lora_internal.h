/* Inside LoRA, for its own files (lora.c, lora_attach.c, lora_parts.c, lora_peft.c): the adapter's layout and
 * its named tensors on any shard. */
#ifndef GRPO_WORKER_LORA_INTERNAL_H
#define GRPO_WORKER_LORA_INTERNAL_H

#include <stddef.h>

#include "lora.h"
#include "model.h"

/* The MLP's projections: a mixture of experts' are the experts' (struct lora_layer's Agu ... Bd). */
#define LORA_MLP (1u << PROJ_GATE | 1u << PROJ_UP | 1u << PROJ_DOWN)

/* The adapter's layout on shard sh of a model of mc: the layers of its stage, each projection's A (r, Din) and B
 * (Dout, r) with the shard's Din and Dout, the experts' adapters of its experts; lay's matrices are pointed into
 * base (lay NULL: only count); returns the floats. */
size_t lora_layout_over(const struct model_config *mc, const struct model_shard *sh, const struct lora_config *c,
                        float *base, struct lora_layer *lay);
/* The same on m's own shard. */
size_t lora_layout(const struct model *m, const struct lora_config *c, float *base, struct lora_layer *lay);
/* The whole model's shard: every layer, row, column and expert (the whole adapter's layout, PEFT's). */
struct model_shard lora_whole_shard(const struct model_config *mc);
/* The named tensors of a buffer laid out as shard sh's adapter, allocated; the count in *n. */
struct param_ref *lora_refs_alloc(const struct model_config *mc, const struct model_shard *sh,
                                  const struct lora_config *c, const float *buf, int *n);
/* m's adapter on the host (*host), with its named tensors over that copy (*refs); the caller frees both. Returns
 * the count. */
int lora_host_refs(const struct model *m, float **host, struct param_ref **refs);

#endif
