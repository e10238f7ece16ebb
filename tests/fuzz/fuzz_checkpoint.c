/* libFuzzer harness of a checkpoint's state.json (worker/trainer/checkpoint_state.c): the parser that every
 * resume reads first. An accepted file must hold no negative count and only plain relative file names, and
 * writing it back and parsing that again gives the same state. The seeds are state.json files as the trainer
 * writes them (with and without the file list, and an older one without optim_steps).
 *
 * Built and run by run_fuzz.sh (clang -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "worker/trainer/checkpoint_state.h"

static void write_seed(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR);
    const char *dir = getenv("GRPO_FUZZ_SEEDS");
    if (!dir)
        return 0;
    mkdir(dir, 0755);
    struct run_state st = {
        .global_step = 120, .epoch = 2, .cursor = 17, .seed = 42, .config_digest = 0xdeadbeef, .total_steps = 200};
    char *t = checkpoint_state_text(&st, 120);
    write_seed(dir, "plain", t);
    free(t);
    st.n_files = 3;
    snprintf(st.files[0].name, CKPT_FILE_NAME, "actor/model.safetensors");
    st.files[0].bytes = 36144, st.files[0].crc32c = 0x1234abcd;
    snprintf(st.files[1].name, CKPT_FILE_NAME, "actor/config.json");
    st.files[1].bytes = 612, st.files[1].crc32c = 0x0badf00d;
    snprintf(st.files[2].name, CKPT_FILE_NAME, "optim.bin");
    st.files[2].bytes = 72352, st.files[2].crc32c = 0xffffffff;
    t = checkpoint_state_text(&st, 120);
    write_seed(dir, "files", t);
    free(t);
    write_seed(dir, "older",
               "{\"version\": 1, \"global_step\": 3, \"epoch\": 0, \"cursor\": 12, \"seed\": \"7\", "
               "\"config_digest\": \"00000000000000ff\", \"total_steps\": 10}");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct run_state st;
    char err[512];
    if (checkpoint_state_parse((const char *)data, size, "state.json", &st, err, sizeof err) != 0) {
        if (!strstr(err, "state.json"))
            abort(); /* an error names the file */
        return 0;
    }
    if (st.global_step < 0 || st.epoch < 0 || st.cursor < 0 || st.total_steps < 0 || st.optim_steps < -1 ||
        st.n_files < 0 || st.n_files > CKPT_MAX_FILES)
        abort();
    for (int i = 0; i < st.n_files; i++) {
        const char *name = st.files[i].name;
        size_t n = strlen(name);
        if (st.files[i].bytes < 0 || n == 0 || name[0] == '/' || strcmp(name, "..") == 0 ||
            strncmp(name, "../", 3) == 0 || strstr(name, "/../") || (n >= 3 && strcmp(name + n - 3, "/..") == 0))
            abort(); /* nothing outside the checkpoint's directory */
    }
    /* written back, it reads the same */
    char *again = checkpoint_state_text(&st, st.optim_steps);
    struct run_state st2;
    if (checkpoint_state_parse(again, strlen(again), "again", &st2, err, sizeof err) != 0)
        abort();
    if (st2.global_step != st.global_step || st2.cursor != st.cursor || st2.seed != st.seed ||
        st2.config_digest != st.config_digest || st2.n_files != st.n_files)
        abort();
    free(again);
    return 0;
}
