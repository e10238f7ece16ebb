/* A checkpoint's state.json: where the run stands after its step, and what the checkpoint's other files were
 * when they were written (their sizes and CRC32C checksums), as text and back. No file is read here: the
 * parser takes the text, so the fuzzer (tests/fuzz/fuzz_checkpoint.c) drives it alone. */
#ifndef GRPO_WORKER_TRAINER_CHECKPOINT_STATE_H
#define GRPO_WORKER_TRAINER_CHECKPOINT_STATE_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_MAX_FILES 32
#define CKPT_FILE_NAME 128

/* One file of the checkpoint as written: its path relative to the checkpoint directory, size and checksum. */
struct ckpt_file {
    char name[CKPT_FILE_NAME];
    int64_t bytes;
    uint32_t crc32c;
};

/* Where the data pipeline and the run stand after step global_step. */
struct run_state {
    int64_t global_step; /* steps completed */
    int64_t epoch;       /* data epoch of the next prompt */
    int64_t cursor;      /* index of the next prompt within the epoch's order */
    uint64_t seed;       /* base seed: every random draw of step k derives from (seed, k) */
    uint64_t config_digest;
    int64_t total_steps;
    int64_t optim_steps; /* AdamW steps taken (optim.bin's count); -1 when an older checkpoint did not say */
    int n_files;         /* the checkpoint's files as written (0: an older checkpoint did not record them) */
    struct ckpt_file files[CKPT_MAX_FILES];
};

/* state.json's text for st, with optim_steps AdamW steps (malloc'd). */
char *checkpoint_state_text(const struct run_state *st, int64_t optim_steps);
/* Parse state.json's text (len bytes; path names it in messages) into *st: 0, or -1 with err naming path and
 * what is wrong (malformed JSON, a missing or unknown key, a negative count, a file entry that is not a plain
 * relative path, too many files). */
int checkpoint_state_parse(const char *text, size_t len, const char *path, struct run_state *st, char *err,
                           size_t errlen);

#endif
