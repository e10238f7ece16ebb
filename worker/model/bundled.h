/* Where the bundled model (SmolLM2-135M-Instruct, fetched by scripts/fetch_model.sh) lies in the cache. */
#ifndef GRPO_WORKER_MODEL_BUNDLED_H
#define GRPO_WORKER_MODEL_BUNDLED_H

#include <stddef.h>

/* The bundled SmolLM2-135M-Instruct (actor_rollout_ref.model.path empty): its converted HF directory in the
 * cache, else the GGUF. 0, or -1 with the cache directory in out. */
int model_bundled_path(char *out, size_t len);

#endif
