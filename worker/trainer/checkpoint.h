/* Checkpoints, verl's layout, written so that a crash at any moment leaves the
 * previous checkpoint intact:
 *
 *   RUN_DIR/checkpoints/global_step_K/actor/      policy, Hugging Face layout (+ tokenizer); with LoRA the
 *                                                 adapter alone, PEFT's layout (adapter_config.json,
 *                                                 adapter_model.safetensors)
 *   RUN_DIR/checkpoints/global_step_K/optim.bin   AdamW moments and step (CRC32C-checked)
 *   RUN_DIR/checkpoints/global_step_K/state.json  step, epoch, data cursor, seed, config digest, and the size
 *                                                 and CRC32C of every other file of the checkpoint
 *   RUN_DIR/checkpoints/latest_checkpointed_iteration.txt
 *
 * Everything is written under .global_step_K.tmp, fsync'd, then the directory
 * is renamed into place and the parent fsync'd; only then is "latest" updated
 * (itself tmp + fsync + rename). Older checkpoints beyond the keep count are
 * removed after the new one is complete. */
#ifndef GRPO_WORKER_CHECKPOINT_H
#define GRPO_WORKER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint_state.h"
#include "optim.h"
#include "worker/model/model.h"

struct tokenizer;

/* Write checkpoint global_step_K (K = st->global_step) under ckpt_root (created if needed), then keep only the
 * newest `keep` checkpoints (keep <= 0: all). The tokenizer (may be NULL) is saved beside the weights.
 * 0, or -1 with err (the previous checkpoints are untouched). */
int checkpoint_save(const char *ckpt_root, const struct model *m, const struct adamw *opt, const struct tokenizer *tok,
                    const struct run_state *st, int keep, char *err, size_t errlen);

/* checkpoint_save with one more file, extra_name (in the checkpoint's directory, listed in state.json with its size
 * and checksum like the others): extra[0..extra_len). */
int checkpoint_save_extra(const char *ckpt_root, const struct model *m, const struct adamw *opt,
                          const struct tokenizer *tok, const struct run_state *st, int keep, const char *extra_name,
                          const void *extra, size_t extra_len, char *err, size_t errlen);

/* Path of the newest complete checkpoint under ckpt_root (from latest_checkpointed_iteration.txt, or the
 * highest complete global_step_* if that file is missing or stale) into out; 0, or -1 if there is none. */
int checkpoint_find_latest(const char *ckpt_root, char *out, size_t outlen);

/* Load a checkpoint directory: weights into m (same architecture; with a LoRA adapter attached, the adapter of
 * the same rank and targets), optimizer state into opt (same size), run state into st. The directory must be
 * named global_step_K with K the state's global_step, optim.bin's step count the one state.json records, and
 * every file state.json lists of the size and CRC32C it records (a checkpoint written before state.json listed
 * its files is loaded without that check).
 * 0, or -1 with err naming the file. */
int checkpoint_load(const char *dir, struct model *m, struct adamw *opt, struct run_state *st, char *err,
                    size_t errlen);

/* Write / read just the optimizer state (used by checkpoint_save/load; exposed for tests). */
int optim_state_write(const char *path, const struct adamw *opt, char *err, size_t errlen);
int optim_state_read(const char *path, struct adamw *opt, char *err, size_t errlen);

#endif
