#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/crc32c.h"
#include "worker/comm/comm.h"
#include "worker/flight/flight.h"
#include "worker/watchdog/watchdog.h"
#include "worker/model/lora.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"
#include "common/config_key_names.h"

/* A checkpoint directory removed without a shell (fs_remove_tree: links not followed); a failure is logged. */
static int remove_tree(const char *path)
{
    char err[4400];
    if (fs_remove_tree(path, err, sizeof err) == 0)
        return 0;
    log_warn("checkpoint", "%s", err);
    return -1;
}

#define OPT_MAGIC "GRPOADAM"

int optim_state_write(const char *path, const struct adamw *o, char *err, size_t errlen)
{
    size_t len = 8 + 8 + 8 + 8 + 4 * 8 + 2 * o->n * sizeof(float) + 4;
    unsigned char *buf = xmalloc(len), *p = buf;
    uint32_t version = 1, reserved = 0;
    uint64_t n = o->n;
    int64_t t = o->t;
    double hp[4] = {o->beta1, o->beta2, o->eps, o->weight_decay};
    memcpy(p, OPT_MAGIC, 8), p += 8;
    memcpy(p, &version, 4), p += 4;
    memcpy(p, &reserved, 4), p += 4;
    memcpy(p, &n, 8), p += 8;
    memcpy(p, &t, 8), p += 8;
    memcpy(p, hp, sizeof hp), p += sizeof hp;
    memcpy(p, o->m, o->n * sizeof(float)), p += o->n * sizeof(float);
    memcpy(p, o->v, o->n * sizeof(float)), p += o->n * sizeof(float);
    uint32_t crc = crc32c(buf, (size_t)(p - buf));
    memcpy(p, &crc, 4);
    int rc = fs_write_atomic(path, buf, len, err, errlen);
    free(buf);
    return rc;
}

int optim_state_read(const char *path, struct adamw *o, char *err, size_t errlen)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f)
        return error_set(err, errlen, "%s: cannot open: %s", path, why);
    const size_t want = 8 + 8 + 8 + 8 + 4 * 8 + 2 * o->n * sizeof(float) + 4;
    unsigned char *buf = xmalloc(want + 1);
    size_t got = fread(buf, 1, want + 1, f);
    fclose(f);
    int rc = -1;
    uint64_t n;
    uint32_t version, crc;
    if (got < 24 || memcmp(buf, OPT_MAGIC, 8) != 0) {
        error_set(err, errlen, "%s: not an optimizer state file", path);
        goto out;
    }
    memcpy(&version, buf + 8, 4);
    memcpy(&n, buf + 16, 8);
    if (version != 1 || n != o->n) {
        error_set(err, errlen, "%s: version %u with %llu values; expected version 1 with %zu (a different model?)",
                  path, version, (unsigned long long)n, o->n);
        goto out;
    }
    if (got != want) {
        error_set(err, errlen, "%s: %zu bytes, expected %zu (truncated or corrupt)", path, got, want);
        goto out;
    }
    memcpy(&crc, buf + want - 4, 4);
    if (crc != crc32c(buf, want - 4)) {
        error_set(err, errlen, "%s: checksum mismatch (corrupt file)", path);
        goto out;
    }
    double hp[4];
    memcpy(&o->t, buf + 24, 8);
    memcpy(hp, buf + 32, sizeof hp);
    o->beta1 = hp[0], o->beta2 = hp[1], o->eps = hp[2], o->weight_decay = hp[3];
    /* moments that went non-finite would turn every later update into NaN weights */
    for (size_t i = 0; i < 2 * o->n; i++) {
        float x;
        memcpy(&x, buf + 64 + i * sizeof(float), sizeof x);
        if (!isfinite(x)) {
            error_set(err, errlen, "%s: AdamW moment %s[%zu] is %g: corrupt optimizer state (a diverged run?)", path,
                      i < o->n ? "m" : "v", i < o->n ? i : i - o->n, (double)x);
            goto out;
        }
    }
    memcpy(o->m, buf + 64, o->n * sizeof(float));
    memcpy(o->v, buf + 64 + o->n * sizeof(float), o->n * sizeof(float));
    rc = 0;
out:
    free(buf);
    return rc;
}

static int state_write(const char *path, const struct run_state *st, int64_t optim_steps, char *err, size_t errlen)
{
    char *text = checkpoint_state_text(st, optim_steps);
    int rc = fs_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

static int state_read(const char *path, struct run_state *st, char *err, size_t errlen)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why); /* a FIFO as state.json is refused, not waited on */
    if (!f)
        return error_set(err, errlen, "%s: cannot read: %s", path, why);
    enum { MAX_STATE = 1 << 20 }; /* a few hundred bytes when written */
    char *text = xmalloc(MAX_STATE);
    size_t len = fread(text, 1, MAX_STATE, f);
    const bool whole = feof(f) && !ferror(f);
    fclose(f);
    if (!whole) {
        free(text);
        return error_set(err, errlen, "%s: cannot read it whole (over %d bytes, or a read error)", path, MAX_STATE);
    }
    int rc = checkpoint_state_parse(text, len, path, st, err, errlen);
    free(text);
    return rc;
}

/* Size and CRC32C of a file: 0, or -1 when it cannot be read (errno set). */
static int file_sum(const char *path, int64_t *bytes, uint32_t *crc)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f)
        return -1;
    static char buf[1 << 16];
    uint32_t c = 0;
    int64_t n = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        c = crc32c_update(c, buf, got);
        n += (int64_t)got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return -1;
    *bytes = n, *crc = c;
    return 0;
}

/* Record the size and checksum of every file under dir/sub (one level: the actor's files) and of dir/optim.bin. */
static int record_files(const char *dir, struct run_state *st, const char *extra, char *err, size_t errlen)
{
    st->n_files = 0;
    char path[4400];
    snprintf(path, sizeof path, "%s/actor", dir);
    DIR *dp = opendir(path);
    if (!dp)
        return error_set(err, errlen, "%s: cannot list: %s", path, check_errno_text());
    const char *names[CKPT_MAX_FILES];
    char store[CKPT_MAX_FILES][CKPT_FILE_NAME];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == CKPT_MAX_FILES - 1) {
            closedir(dp);
            return error_set(err, errlen, "%s: more than %d files", path, CKPT_MAX_FILES - 1);
        }
        if (strlen(e->d_name) > CKPT_FILE_NAME - 8) {
            closedir(dp);
            return error_set(err, errlen, "%s/%s: a name too long to list in state.json", path, e->d_name);
        }
        snprintf(store[n], CKPT_FILE_NAME, "actor/%.*s", CKPT_FILE_NAME - 8, e->d_name);
        names[n] = store[n];
        n++;
    }
    closedir(dp);
    snprintf(store[n], CKPT_FILE_NAME, "optim.bin");
    names[n] = store[n];
    n++;
    if (extra && n < CKPT_MAX_FILES) { /* a source's state (fully-async training's async_state.bin) */
        snprintf(store[n], CKPT_FILE_NAME, "%s", extra);
        names[n] = store[n];
        n++;
    }
    for (int i = 0; i < n; i++) {
        struct ckpt_file *f = &st->files[st->n_files];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue; /* a directory the model writer made: not listed */
        if (file_sum(path, &f->bytes, &f->crc32c) != 0)
            return error_set(err, errlen, "%s: cannot read back: %s", path, check_errno_text());
        snprintf(f->name, sizeof f->name, "%s", names[i]);
        st->n_files++;
    }
    return 0;
}

/* Every file state.json lists is there, of the size and checksum it records. */
static int files_agree(const char *dir, const struct run_state *st, char *err, size_t errlen)
{
    for (int i = 0; i < st->n_files; i++) {
        const struct ckpt_file *f = &st->files[i];
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        int64_t bytes;
        uint32_t crc;
        if (file_sum(path, &bytes, &crc) != 0)
            return error_set(err, errlen, "%s/state.json lists %s, but %s cannot be read: %s", dir, f->name, path,
                             check_errno_text());
        if (bytes != f->bytes || crc != f->crc32c)
            return error_set(err, errlen,
                             "%s/state.json records %s as %lld bytes with CRC32C %08x, but %s has %lld bytes with "
                             "CRC32C %08x: the file was changed or comes from another checkpoint",
                             dir, f->name, (long long)f->bytes, (unsigned)f->crc32c, path, (long long)bytes,
                             (unsigned)crc);
    }
    return 0;
}

/* Steps of the complete checkpoints (global_step_K with a state.json) under root, ascending; count returned. */
static int list_checkpoints(const char *root, int64_t **steps_out)
{
    DIR *d = opendir(root);
    int n = 0, cap = 16;
    int64_t *steps = xmalloc((size_t)cap * sizeof *steps);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long long k;
        char rest;
        if (sscanf(e->d_name, "global_step_%lld%c", &k, &rest) != 1) // NOLINT(cert-err34-c): exact-match parse
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/state.json", root, e->d_name);
        if (access(path, R_OK) != 0)
            continue;
        if (n == cap)
            steps = xrealloc(steps, (size_t)(cap *= 2) * sizeof *steps);
        steps[n++] = k;
    }
    if (d)
        closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    *steps_out = steps;
    return n;
}

int checkpoint_save(const char *root, const struct model *m, const struct adamw *opt, const struct tokenizer *tok,
                    const struct run_state *st, int keep, char *err, size_t errlen)
{
    return checkpoint_save_extra(root, m, opt, tok, st, keep, NULL, NULL, 0, err, errlen);
}

static int save_extra(const char *root, const struct model *m, const struct adamw *opt, const struct tokenizer *tok,
                      const struct run_state *st, int keep, const char *extra_name, const void *extra, size_t extra_len,
                      char *err, size_t errlen);

/* the flight recorder's record of a checkpoint's files: a rank stuck in I/O says so */
static int io_begin(enum flight_op op, const char *where, int64_t step)
{
    return flight_begin(op, flight_group("checkpoint", where, 0), step > 0 ? (uint64_t)step : 0, 0, -1, clock_now_s());
}

int checkpoint_save_extra(const char *root, const struct model *m, const struct adamw *opt, const struct tokenizer *tok,
                          const struct run_state *st, int keep, const char *extra_name, const void *extra,
                          size_t extra_len, char *err, size_t errlen)
{
    const int tok_ = io_begin(FLIGHT_OP_CKPT_WRITE, root, st->global_step);
    watchdog_test_point(WATCHDOG_AT_CKPT_WRITE, st->global_step); /* test.block_at=checkpoint_write only */
    const int rc = save_extra(root, m, opt, tok, st, keep, extra_name, extra, extra_len, err, errlen);
    flight_end(tok_, clock_now_s(), rc != 0);
    return rc;
}

static int save_extra(const char *root, const struct model *m, const struct adamw *opt, const struct tokenizer *tok,
                      const struct run_state *st, int keep, const char *extra_name, const void *extra, size_t extra_len,
                      char *err, size_t errlen)
{
    char final[4096], tmp[4096], path[4200];
    if (fs_mkdir_p(root) != 0)
        return error_set(err, errlen, "%s: cannot create directory: %s", root, check_errno_text());
    snprintf(final, sizeof final, "%s/global_step_%lld", root, (long long)st->global_step);
    snprintf(tmp, sizeof tmp, "%s/.global_step_%lld.tmp", root, (long long)st->global_step);
    remove_tree(tmp); /* left by a crash during an earlier attempt */
    if (mkdir(tmp, 0755) != 0)
        return error_set(err, errlen, "%s: cannot create: %s", tmp, check_errno_text());
    snprintf(path, sizeof path, "%s/actor", tmp);
    /* with LoRA the adapter alone, in PEFT's layout (the base weights are frozen: the model's path has them) */
    if ((m->lora ? lora_save(m, path, NULL, err, errlen) : model_save_hf(m, path, 0, err, errlen)) != 0)
        goto fail_tmp;
    if (tok) {
        snprintf(path, sizeof path, "%s/actor/tokenizer.json", tmp);
        if (tokenizer_save_json(tok, path, err, errlen) != 0)
            goto fail_tmp;
        snprintf(path, sizeof path, "%s/actor/tokenizer_config.json", tmp);
        if (tokenizer_save_config_json(tok, path, err, errlen) != 0)
            goto fail_tmp;
    }
    snprintf(path, sizeof path, "%s/optim.bin", tmp);
    if (optim_state_write(path, opt, err, errlen) != 0)
        goto fail_tmp;
    comm_test_hold("ckpt"); /* tests: the writer dies here, its weights and optimizer state written, not in place */
    if (extra_name) {
        snprintf(path, sizeof path, "%s/%s", tmp, extra_name);
        if (fs_write_atomic(path, extra, extra_len, err, errlen) != 0)
            goto fail_tmp;
    }
    struct run_state *rec = xmalloc(sizeof *rec);
    *rec = *st;
    if (record_files(tmp, rec, extra_name, err, errlen) != 0) {
        free(rec);
        goto fail_tmp;
    }
    snprintf(path, sizeof path, "%s/state.json", tmp);
    int wrc = state_write(path, rec, opt->t, err, errlen);
    free(rec);
    if (wrc != 0)
        goto fail_tmp;
    snprintf(path, sizeof path, "%s/actor", tmp);
    if (fs_fsync_path(path) != 0 || fs_fsync_path(tmp) != 0) {
        error_set(err, errlen, "%s: fsync failed: %s", tmp, check_errno_text());
        goto fail_tmp;
    }
    /* the same step saved again (a resumed run): move the old one aside first */
    char old[4200];
    snprintf(old, sizeof old, "%s.old", final);
    if (access(final, F_OK) == 0 && rename(final, old) != 0) {
        error_set(err, errlen, "%s: cannot replace: %s", final, check_errno_text());
        goto fail_tmp;
    }
    if (rename(tmp, final) != 0) {
        error_set(err, errlen, "%s: cannot rename into place: %s", final, check_errno_text());
        goto fail_tmp;
    }
    fs_fsync_path(root);
    remove_tree(old);
    char latest[64];
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", root);
    snprintf(latest, sizeof latest, "%lld\n", (long long)st->global_step);
    if (fs_write_atomic(path, latest, strlen(latest), err, errlen) != 0)
        return -1;
    fs_fsync_path(root);
    if (keep > 0) {
        int64_t *steps;
        int n = list_checkpoints(root, &steps);
        for (int i = 0; i + keep < n; i++) {
            snprintf(path, sizeof path, "%s/global_step_%lld", root, (long long)steps[i]);
            if (steps[i] != st->global_step && remove_tree(path) != 0)
                log_warn("checkpoint", "could not remove old checkpoint %s", path);
        }
        free(steps);
    }
    return 0;
fail_tmp:
    remove_tree(tmp);
    return -1;
}

int checkpoint_find_latest(const char *root, char *out, size_t outlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", root);
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    long long k = -1;
    char line[64];
    if (f) {
        char *end;
        if (fgets(line, sizeof line, f)) {
            k = strtoll(line, &end, 10);
            if (end == line || (*end && *end != '\n'))
                k = -1; /* not a step number: fall back to scanning */
        }
        fclose(f);
    }
    if (k >= 0) {
        snprintf(out, outlen, "%s/global_step_%lld", root, k);
        snprintf(path, sizeof path, "%s/state.json", out);
        if (access(path, R_OK) == 0)
            return 0;
        log_warn("checkpoint",
                 "%s/latest_checkpointed_iteration.txt names step %lld, which is incomplete; "
                 "using the newest complete checkpoint",
                 root, k);
    }
    int64_t *steps;
    int n = list_checkpoints(root, &steps);
    int rc = -1;
    if (n > 0) {
        snprintf(out, outlen, "%s/global_step_%lld", root, (long long)steps[n - 1]);
        rc = 0;
    }
    free(steps);
    return rc;
}

/* The step a checkpoint directory's name says (global_step_K), or -1 when its name is not of that form. */
static long long dir_step(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    static const char prefix[] = "global_step_";
    const size_t pl = sizeof prefix - 1;
    if (n - b <= pl || strncmp(dir + b, prefix, pl) != 0)
        return -1;
    long long k = 0;
    for (size_t i = b + pl; i < n; i++) {
        if (dir[i] < '0' || dir[i] > '9' || k > (INT64_MAX - 9) / 10)
            return -1;
        k = 10 * k + (dir[i] - '0');
    }
    return k;
}

/* The optimizer state just loaded agrees with state.json (checkpoints that record optim_steps). */
static int optim_agrees(const char *dir, const struct adamw *opt, const struct run_state *st, char *err, size_t errlen)
{
    if (st->optim_steps < 0 || opt->t == st->optim_steps)
        return 0;
    return error_set(err, errlen,
                     "%s/state.json says the optimizer took %lld steps, but %s/optim.bin holds %lld: the files come "
                     "from different checkpoints",
                     dir, (long long)st->optim_steps, dir, (long long)opt->t);
}

static int load(const char *dir, struct model *m, struct adamw *opt, struct run_state *st, char *err, size_t errlen);

int checkpoint_load(const char *dir, struct model *m, struct adamw *opt, struct run_state *st, char *err, size_t errlen)
{
    const int tok_ = io_begin(FLIGHT_OP_CKPT_READ, dir, 0);
    const int rc = load(dir, m, opt, st, err, errlen);
    flight_end(tok_, clock_now_s(), rc != 0);
    return rc;
}

static int load(const char *dir, struct model *m, struct adamw *opt, struct run_state *st, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (state_read(path, st, err, errlen) != 0)
        return -1;
    const long long named = dir_step(dir);
    if (named < 0)
        return error_set(err, errlen, "%s: not a checkpoint directory (its name must be global_step_K, K the step)",
                         dir);
    if (named != st->global_step)
        return error_set(err, errlen,
                         "%s says global_step %lld, but the directory it sits in is global_step_%lld: a corrupt or "
                         "edited state.json, or a checkpoint moved under another step's name",
                         path, (long long)st->global_step, named);
    snprintf(path, sizeof path, "%s/actor/adapter_config.json", dir);
    const bool adapter = access(path, R_OK) == 0;
    if (adapter != (m->lora != NULL))
        return error_set(err, errlen,
                         "%s/actor holds %s, but this run %s: resume with the same " KEY_arr_model_lora_rank " "
                         "as the run that wrote it",
                         dir, adapter ? "a LoRA adapter" : "a whole model", m->lora ? "trains LoRA" : "has no LoRA");
    snprintf(path, sizeof path, "%s/actor", dir);
    if (m->lora) {
        if (lora_load(m, path, err, errlen) != 0)
            return -1;
        snprintf(path, sizeof path, "%s/optim.bin", dir);
        if (optim_state_read(path, opt, err, errlen) != 0)
            return -1;
        if (optim_agrees(dir, opt, st, err, errlen) != 0)
            return -1;
        return files_agree(dir, st, err, errlen); /* after the readers' own checks, which say more */
    }
    struct model *loaded = model_load_hf(path, err, errlen);
    if (!loaded)
        return -1;
    if (loaded->w.n_floats != m->w.n_floats) {
        model_free(loaded);
        return error_set(err, errlen, "%s: checkpoint has %zu parameters, the model %zu (a different model?)", path,
                         loaded->w.n_floats, m->w.n_floats);
    }
    memcpy(m->w.mem, loaded->w.mem, m->w.n_floats * sizeof(float));
    model_free(loaded);
    snprintf(path, sizeof path, "%s/optim.bin", dir);
    if (optim_state_read(path, opt, err, errlen) != 0)
        return -1;
    if (optim_agrees(dir, opt, st, err, errlen) != 0)
        return -1;
    return files_agree(dir, st, err, errlen);
}
