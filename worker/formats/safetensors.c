/* safetensors reader and writer: see safetensors.h. */
#include "worker/formats/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fs.h"
#include "worker/formats/fmt_util.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},   [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(enum st_dtype dt) { return (unsigned)dt < ST_DTYPE_COUNT ? dtypes[dt].name : "unknown"; }

size_t st_dtype_size(enum st_dtype dt) { return (unsigned)dt < ST_DTYPE_COUNT ? dtypes[dt].size : 0; }

static int dtype_from_name(const char *s, enum st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (enum st_dtype)i;
            return 0;
        }
    return -1;
}

/* ================================ reading ================================ */

struct st_file {
    char *path;
    const uint8_t *map;
    size_t size;
    const uint8_t *data; /* start of the data buffer */
    uint64_t data_len;
    struct st_tensor_info *tensors; /* sorted by data offset */
    int n_tensors;
    struct st_tensor_info **by_name;
    char **meta_keys, **meta_vals;
    int n_meta;
};

static int cmp_info_name(const void *a, const void *b)
{
    const struct st_tensor_info *x = *(const struct st_tensor_info *const *)a;
    const struct st_tensor_info *y = *(const struct st_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_info_offset(const void *a, const void *b)
{
    const struct st_tensor_info *x = a, *y = b;
    if (x->data_begin != y->data_begin)
        return x->data_begin < y->data_begin ? -1 : 1;
    return x->data_end < y->data_end ? -1 : x->data_end > y->data_end ? 1 : 0;
}

void st_close(struct st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_tensors; i++)
        free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map)
        munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

/* A JSON integer >= 0 (jansson reads integers as long long; reals are refused). */
static int json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_metadata(struct st_file *f, json_t *meta, char *err, size_t errlen)
{
    if (json_is_null(meta))
        return 0;
    if (!json_is_object(meta)) {
        error_set(err, errlen, "%s: \"__metadata__\" is not a JSON object", f->path);
        return -1;
    }
    size_t n = json_object_size(meta);
    f->meta_keys = xcalloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_vals = xcalloc(n ? n : 1, sizeof *f->meta_vals);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v)
    {
        if (!json_is_string(v)) {
            error_set(err, errlen, "%s: metadata key '%s' is not a string", f->path, k);
            return -1;
        }
        f->meta_keys[f->n_meta] = xstrdup(k);
        f->meta_vals[f->n_meta] = xstrdup(json_string_value(v));
        f->n_meta++;
    }
    return 0;
}

static int parse_tensor_entry(struct st_file *f, const char *name, json_t *v, struct st_tensor_info *t, char *err,
                              size_t errlen)
{
    const char *p = f->path;
    if (!json_is_object(v)) {
        error_set(err, errlen, "%s: tensor '%s': header entry is not a JSON object", p, name);
        return -1;
    }
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0) {
            error_set(err, errlen, "%s: tensor '%s': unexpected field '%s' in the header", p, name, k);
            return -1;
        }
    }
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) {
        error_set(err, errlen, "%s: tensor '%s': missing or non-string \"dtype\"", p, name);
        return -1;
    }
    if (dtype_from_name(json_string_value(dt), &t->dtype)) {
        error_set(err, errlen, "%s: tensor '%s': unknown dtype '%s'", p, name, json_string_value(dt));
        return -1;
    }
    if (!json_is_array(shape)) {
        error_set(err, errlen, "%s: tensor '%s': missing or non-array \"shape\"", p, name);
        return -1;
    }
    if (json_array_size(shape) > ST_MAX_DIMS) {
        error_set(err, errlen, "%s: tensor '%s' has %zu dimensions (at most %d supported)", p, name,
                  json_array_size(shape), ST_MAX_DIMS);
        return -1;
    }
    t->n_dims = (int)json_array_size(shape);
    uint64_t n = 1;
    for (int d = 0; d < ST_MAX_DIMS; d++)
        t->shape[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t s;
        if (json_uint(json_array_get(shape, (size_t)d), &s)) {
            error_set(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", p, name, d);
            return -1;
        }
        t->shape[d] = (int64_t)s;
        if (__builtin_mul_overflow(n, s, &n) || n > (uint64_t)INT64_MAX) {
            error_set(err, errlen, "%s: tensor '%s': element count overflows", p, name);
            return -1;
        }
    }
    t->n_elements = n;
    if (__builtin_mul_overflow(n, (uint64_t)st_dtype_size(t->dtype), &t->n_bytes)) {
        error_set(err, errlen, "%s: tensor '%s': byte size overflows", p, name);
        return -1;
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 || json_uint(json_array_get(offs, 0), &t->data_begin) ||
        json_uint(json_array_get(offs, 1), &t->data_end)) {
        error_set(err, errlen, "%s: tensor '%s': \"data_offsets\" is not a pair of non-negative integers", p, name);
        return -1;
    }
    if (t->data_end < t->data_begin) {
        error_set(err, errlen, "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin", p, name,
                  t->data_begin, t->data_end);
        return -1;
    }
    if (t->data_end - t->data_begin != t->n_bytes) {
        error_set(err, errlen,
                  "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64 " bytes but dtype %s "
                  "and its shape need %" PRIu64,
                  p, name, t->data_begin, t->data_end, t->data_end - t->data_begin, st_dtype_name(t->dtype),
                  t->n_bytes);
        return -1;
    }
    if (t->data_end > f->data_len) {
        error_set(err, errlen,
                  "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") runs past the end of the file (%zu bytes)", p, name,
                  (uint64_t)(f->data - f->map) + t->data_begin, (uint64_t)(f->data - f->map) + t->data_end, f->size);
        return -1;
    }
    t->data = f->data + t->data_begin;
    return 0;
}

struct st_file *st_open(const char *path, char *err, size_t errlen)
{
    error_set(err, errlen, "%s", "");
    if (!path) {
        error_set(err, errlen, "(null): no path given");
        return NULL;
    }
    struct st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    json_t *root = NULL;
    if (fmt_map_file(path, 8, "safetensors", &f->map, &f->size, err, errlen))
        goto fail;
    uint64_t hlen = fmt_ld_u64(f->map);
    if (hlen > ST_MAX_HEADER_BYTES) {
        error_set(err, errlen, "%s: header length %" PRIu64 " is larger than the %u-byte limit (corrupt file?)", path,
                  hlen, ST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (hlen > f->size - 8) {
        error_set(err, errlen, "%s: truncated: the %" PRIu64 "-byte header runs past the end of the file (%zu bytes)",
                  path, hlen, f->size);
        goto fail;
    }
    if (hlen < 2 || f->map[8] != '{') {
        error_set(err, errlen, "%s: the header is not a JSON object (not a safetensors file?)", path);
        goto fail;
    }
    f->data = f->map + 8 + hlen;
    f->data_len = f->size - 8 - hlen;

    json_error_t jerr;
    root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, errlen, "%s: bad header JSON at byte %d of the header: %s", path, jerr.position, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        error_set(err, errlen, "%s: the header is not a JSON object", path);
        goto fail;
    }
    size_t n = json_object_size(root);
    if (n > INT_MAX) {
        error_set(err, errlen, "%s: too many header entries", path);
        goto fail;
    }
    f->tensors = xcalloc(n ? n : 1, sizeof *f->tensors);
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (strcmp(k, "__metadata__") == 0) {
            if (parse_metadata(f, v, err, errlen))
                goto fail;
            continue;
        }
        struct st_tensor_info *t = &f->tensors[f->n_tensors];
        if (parse_tensor_entry(f, k, v, t, err, errlen))
            goto fail;
        t->name = xstrdup(k);
        f->n_tensors++;
    }
    json_decref(root);
    root = NULL;

    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_info_offset);
    for (int i = 1; i < f->n_tensors; i++) {
        const struct st_tensor_info *a = &f->tensors[i - 1], *b = &f->tensors[i];
        if (a->data_end > b->data_begin) {
            error_set(err, errlen,
                      "%s: data of tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                      path, a->name, a->data_begin, a->data_end, b->name, b->data_begin, b->data_end);
            goto fail;
        }
    }
    f->by_name = xmalloc(sizeof *f->by_name * (size_t)(f->n_tensors ? f->n_tensors : 1));
    for (int i = 0; i < f->n_tensors; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)f->n_tensors, sizeof *f->by_name, cmp_info_name);
    return f;
fail:
    json_decref(root);
    st_close(f);
    return NULL;
}

const char *st_path(const struct st_file *f) { return f ? f->path : NULL; }
int st_num_tensors(const struct st_file *f) { return f ? f->n_tensors : 0; }

const struct st_tensor_info *st_tensor(const struct st_file *f, int i)
{
    return f && i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct st_tensor_info *st_find(const struct st_file *f, const char *name)
{
    if (!f || !name || f->n_tensors == 0)
        return NULL;
    struct st_tensor_info key = {.name = name};
    const struct st_tensor_info *kp = &key;
    struct st_tensor_info **hit = bsearch(&kp, f->by_name, (size_t)f->n_tensors, sizeof *f->by_name, cmp_info_name);
    return hit ? *hit : NULL;
}

int st_num_metadata(const struct st_file *f) { return f ? f->n_meta : 0; }

const char *st_metadata_at(const struct st_file *f, int i, const char **key)
{
    if (!f || i < 0 || i >= f->n_meta)
        return NULL;
    if (key)
        *key = f->meta_keys[i];
    return f->meta_vals[i];
}

const char *st_metadata(const struct st_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_vals[i];
    return NULL;
}

int st_tensor_to_f32(const struct st_file *f, const struct st_tensor_info *t, float *out, char *err, size_t errlen)
{
    if (!f || !t || !out) {
        error_set(err, errlen, "%s: st_tensor_to_f32 called with a NULL argument", f ? f->path : "(null)");
        return -1;
    }
    if (t < f->tensors || t >= f->tensors + f->n_tensors) {
        error_set(err, errlen, "%s: tensor '%s' does not belong to this file", f->path, t->name ? t->name : "?");
        return -1;
    }
    const uint8_t *src = t->data;
    const uint64_t n = t->n_elements;
    switch (t->dtype) {
    case ST_F32:
        if (n)
            memcpy(out, src, (size_t)n * 4);
        return 0;
    case ST_BF16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = fmt_bf16_to_f32(fmt_ld_u16(src + 2 * i));
        return 0;
    case ST_F16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = fmt_f16_to_f32(fmt_ld_u16(src + 2 * i));
        return 0;
    case ST_F64:
        for (uint64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, sizeof d);
            out[i] = (float)d;
        }
        return 0;
    default:
        error_set(err, errlen, "%s: tensor '%s' has dtype %s, which cannot be converted to f32", f->path, t->name,
                  st_dtype_name(t->dtype));
        return -1;
    }
}

/* ================================ checkpoints ================================ */

struct model_entry {
    const struct st_tensor_info *t;
    int file;
};

struct st_model {
    struct st_file **files;
    int n_files;
    struct model_entry *entries; /* sorted by name */
    int n_entries;
};

static int cmp_entry_name(const void *a, const void *b)
{
    const struct model_entry *x = a, *y = b;
    return strcmp(x->t->name, y->t->name);
}

void st_model_close(struct st_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_files; i++)
        st_close(m->files[i]);
    free(m->files);
    free(m->entries);
    free(m);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *r = xmalloc(a + b + 2);
    memcpy(r, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/')
        r[k++] = '/';
    memcpy(r + k, name, b + 1);
    return r;
}

static int is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static struct st_model *model_single(const char *file, char *err, size_t errlen)
{
    struct st_file *f = st_open(file, err, errlen);
    if (!f)
        return NULL;
    struct st_model *m = xcalloc(1, sizeof *m);
    m->files = xmalloc(sizeof *m->files);
    m->files[0] = f;
    m->n_files = 1;
    m->n_entries = f->n_tensors;
    m->entries = xmalloc(sizeof *m->entries * (size_t)(f->n_tensors ? f->n_tensors : 1));
    for (int i = 0; i < f->n_tensors; i++)
        m->entries[i] = (struct model_entry){.t = f->by_name[i], .file = 0};
    return m;
}

static struct st_model *model_sharded(const char *index, char *err, size_t errlen)
{
    const uint8_t *map = NULL;
    size_t size = 0;
    if (fmt_map_file(index, 1, "index", &map, &size, err, errlen))
        return NULL;
    struct st_model *m = xcalloc(1, sizeof *m);
    char *dir = fs_dir_of(index);
    json_t *root = NULL;
    json_error_t jerr;
    if (size > ST_MAX_HEADER_BYTES) {
        error_set(err, errlen, "%s: %zu bytes is too large for a checkpoint index", index, size);
        goto fail;
    }
    root = json_loadb((const char *)map, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, errlen, "%s: bad JSON at line %d column %d: %s", index, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        error_set(err, errlen, "%s: no \"weight_map\" object", index);
        goto fail;
    }
    size_t n = json_object_size(wm);
    if (n > INT_MAX) {
        error_set(err, errlen, "%s: too many tensors", index);
        goto fail;
    }
    m->files = xcalloc(n ? n : 1, sizeof *m->files);
    m->entries = xcalloc(n ? n : 1, sizeof *m->entries);
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v)
    {
        const char *shard = json_string_value(v);
        if (!shard || !*shard || strchr(shard, '/') || strcmp(shard, ".") == 0 || strcmp(shard, "..") == 0) {
            error_set(err, errlen, "%s: tensor '%s' is mapped to '%s', which is not a file name in the same directory",
                      index, name, shard ? shard : "(not a string)");
            goto fail;
        }
        int fi = -1;
        for (int i = 0; i < m->n_files; i++)
            if (strcmp(strrchr(m->files[i]->path, '/') + 1, shard) == 0) {
                fi = i;
                break;
            }
        if (fi < 0) {
            char *p = join_path(dir, shard);
            struct st_file *f = st_open(p, err, errlen);
            free(p);
            if (!f)
                goto fail;
            fi = m->n_files++;
            m->files[fi] = f;
        }
        const struct st_tensor_info *t = st_find(m->files[fi], name);
        if (!t) {
            error_set(err, errlen, "%s: tensor '%s' is mapped to %s, which has no such tensor", index, name,
                      m->files[fi]->path);
            goto fail;
        }
        m->entries[m->n_entries++] = (struct model_entry){.t = t, .file = fi};
    }
    /* every tensor of every shard must be in the index, mapped to that shard */
    int total = 0;
    for (int i = 0; i < m->n_files; i++)
        total += m->files[i]->n_tensors;
    if (total != m->n_entries) {
        for (int i = 0; i < m->n_files; i++)
            for (int j = 0; j < m->files[i]->n_tensors; j++) {
                const char *tn = m->files[i]->tensors[j].name;
                const char *mapped = json_string_value(json_object_get(wm, tn));
                const char *base = strrchr(m->files[i]->path, '/') + 1;
                if (!mapped) {
                    error_set(err, errlen, "%s: tensor '%s' is not in the index %s", m->files[i]->path, tn, index);
                    goto fail;
                }
                if (strcmp(mapped, base) != 0) {
                    error_set(err, errlen, "%s: tensor '%s' is also in %s, where the index %s maps it",
                              m->files[i]->path, tn, mapped, index);
                    goto fail;
                }
            }
    }
    qsort(m->entries, (size_t)m->n_entries, sizeof *m->entries, cmp_entry_name);
    json_decref(root);
    free(dir);
    munmap((void *)map, size);
    return m;
fail:
    json_decref(root);
    free(dir);
    munmap((void *)map, size);
    st_model_close(m);
    return NULL;
}

struct st_model *st_model_open(const char *path, char *err, size_t errlen)
{
    error_set(err, errlen, "%s", "");
    if (!path) {
        error_set(err, errlen, "(null): no path given");
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        error_set(err, errlen, "%s: %s", path, check_errno_text());
        return NULL;
    }
    if (!S_ISDIR(st.st_mode))
        return ends_with(path, ".json") ? model_sharded(path, err, errlen) : model_single(path, err, errlen);
    char *single = join_path(path, "model.safetensors");
    char *index = join_path(path, "model.safetensors.index.json");
    struct st_model *m = NULL;
    if (is_regular(single))
        m = model_single(single, err, errlen);
    else if (is_regular(index))
        m = model_sharded(index, err, errlen);
    else
        error_set(err, errlen, "%s: neither model.safetensors nor model.safetensors.index.json is there", path);
    free(single);
    free(index);
    return m;
}

int st_model_num_files(const struct st_model *m) { return m ? m->n_files : 0; }

const struct st_file *st_model_file(const struct st_model *m, int i)
{
    return m && i >= 0 && i < m->n_files ? m->files[i] : NULL;
}

int st_model_num_tensors(const struct st_model *m) { return m ? m->n_entries : 0; }

const struct st_tensor_info *st_model_tensor(const struct st_model *m, int i, const struct st_file **file)
{
    if (!m || i < 0 || i >= m->n_entries)
        return NULL;
    if (file)
        *file = m->files[m->entries[i].file];
    return m->entries[i].t;
}

const struct st_tensor_info *st_model_find(const struct st_model *m, const char *name, const struct st_file **file)
{
    if (!m || !name || m->n_entries == 0)
        return NULL;
    struct st_tensor_info kt = {.name = name};
    struct model_entry key = {.t = &kt};
    const struct model_entry *e = bsearch(&key, m->entries, (size_t)m->n_entries, sizeof *m->entries, cmp_entry_name);
    if (!e)
        return NULL;
    if (file)
        *file = m->files[e->file];
    return e->t;
}

int st_model_tensor_to_f32(const struct st_model *m, const char *name, float *out, char *err, size_t errlen)
{
    const struct st_file *f = NULL;
    const struct st_tensor_info *t = st_model_find(m, name, &f);
    if (!t) {
        error_set(err, errlen, "%s: no tensor '%s' in the checkpoint",
                  m && m->n_files ? m->files[0]->path : "(no checkpoint)", name ? name : "(null)");
        return -1;
    }
    return st_tensor_to_f32(f, t, out, err, errlen);
}

/* ================================ writing ================================ */

static int cmp_cstr_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validate tensors to write; fills bytes[i]. */
static int check_write_tensors(const char *path, const struct st_write_tensor *t, size_t n, uint64_t *bytes, char *err,
                               size_t errlen)
{
    if (n && !t) {
        error_set(err, errlen, "%s: no tensors array given", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *nm = t[i].name;
        if (!nm || !*nm || strcmp(nm, "__metadata__") == 0) {
            error_set(err, errlen, "%s: tensor #%zu has an invalid name '%s'", path, i, nm ? nm : "(null)");
            return -1;
        }
        if (t[i].dtype != ST_F32 && t[i].dtype != ST_BF16) {
            error_set(err, errlen, "%s: tensor '%s': can only write F32 or BF16, not %s", path, nm,
                      st_dtype_name(t[i].dtype));
            return -1;
        }
        if (t[i].n_dims < 0 || t[i].n_dims > ST_MAX_DIMS || (t[i].n_dims > 0 && !t[i].shape)) {
            error_set(err, errlen, "%s: tensor '%s': bad dimension count %d", path, nm, t[i].n_dims);
            return -1;
        }
        uint64_t e = 1;
        for (int d = 0; d < t[i].n_dims; d++) {
            if (t[i].shape[d] < 0 || __builtin_mul_overflow(e, (uint64_t)t[i].shape[d], &e) ||
                e > (uint64_t)INT64_MAX / 8) {
                error_set(err, errlen, "%s: tensor '%s': bad shape (dimension %d is %lld)", path, nm, d,
                          (long long)t[i].shape[d]);
                return -1;
            }
        }
        if (e > 0 && !t[i].data) {
            error_set(err, errlen, "%s: tensor '%s': no data", path, nm);
            return -1;
        }
        bytes[i] = e * st_dtype_size(t[i].dtype);
    }
    if (n > 1) {
        const char **names = xmalloc(sizeof *names * n);
        for (size_t i = 0; i < n; i++)
            names[i] = t[i].name;
        qsort(names, n, sizeof *names, cmp_cstr_ptr);
        for (size_t i = 1; i < n; i++)
            if (strcmp(names[i - 1], names[i]) == 0) {
                error_set(err, errlen, "%s: tensor name '%s' appears twice", path, names[i]);
                free(names);
                return -1;
            }
        free(names);
    }
    return 0;
}

static int json_set_new_checked(json_t *obj, const char *key, json_t *v)
{
    if (!v)
        return -1;
    return json_object_set_new(obj, key, v);
}

/* Header JSON (padded with spaces to a multiple of 8) for tensors in order ord[]. */
static char *build_header(const char *path, const struct st_write_tensor *t, const size_t *ord, const uint64_t *bytes,
                          size_t n, const struct st_kv *meta, size_t n_meta, size_t *hlen, char *err, size_t errlen)
{
    json_t *root = json_object();
    if (n_meta) {
        json_t *m = json_object();
        for (size_t i = 0; i < n_meta; i++) {
            if (!meta[i].key || !meta[i].value ||
                json_set_new_checked(m, meta[i].key, json_string(meta[i].value)) != 0) {
                error_set(err, errlen, "%s: metadata entry #%zu ('%s') is NULL or not valid UTF-8", path, i,
                          meta[i].key ? meta[i].key : "(null)");
                json_decref(m);
                json_decref(root);
                return NULL;
            }
        }
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const struct st_write_tensor *w = &t[ord[k]];
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < w->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)w->shape[d]));
        json_object_set_new(e, "dtype", json_string(st_dtype_name(w->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)off + (json_int_t)bytes[ord[k]]));
        off += bytes[ord[k]];
        if (json_set_new_checked(root, w->name, e) != 0) {
            error_set(err, errlen, "%s: tensor name '%s' is not valid UTF-8", path, w->name);
            json_decref(root);
            return NULL;
        }
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) {
        error_set(err, errlen, "%s: cannot encode the header JSON", path);
        return NULL;
    }
    size_t len = strlen(s), padded = (len + 7) / 8 * 8;
    char *r = xmalloc(padded + 1);
    memcpy(r, s, len);
    memset(r + len, ' ', padded - len);
    r[padded] = '\0';
    free(s);
    *hlen = padded;
    return r;
}

/* fwrite of n bytes; 0, or -1 with errno. */
static int put(FILE *f, const void *buf, size_t n) { return n == 0 || fwrite(buf, 1, n, f) == n ? 0 : -1; }

static int write_tensor_data(FILE *f, const struct st_write_tensor *w, uint64_t bytes)
{
    if (w->dtype == ST_F32)
        return put(f, w->data, (size_t)bytes);
    enum { CHUNK = 1 << 15 };
    uint16_t buf[CHUNK];
    uint64_t n = bytes / 2;
    for (uint64_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? (size_t)(n - i) : CHUNK;
        for (size_t j = 0; j < m; j++)
            buf[j] = fmt_f32_to_bf16(w->data[i + j]);
        if (put(f, buf, m * 2))
            return -1;
    }
    return 0;
}

/* What one safetensors file holds, in the order it is written (fs_write_fn's ctx). */
struct st_body {
    const struct st_write_tensor *t;
    const uint64_t *bytes;
    const size_t *ord;
    size_t n;
    const char *header;
    size_t hlen;
};

static int write_body(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const struct st_body *b = ctx;
    uint64_t h64 = b->hlen;
    int bad = put(f, &h64, 8) || put(f, b->header, b->hlen);
    for (size_t i = 0; i < b->n && !bad; i++)
        bad = write_tensor_data(f, &b->t[b->ord[i]], b->bytes[b->ord[i]]);
    return bad ? -1 : 0;
}

static int write_checked(const char *path, const struct st_write_tensor *t, const uint64_t *bytes, size_t n,
                         const struct st_kv *meta, size_t n_meta, char *err, size_t errlen)
{
    if (n_meta && !meta) {
        error_set(err, errlen, "%s: no metadata array given", path);
        return -1;
    }
    /* F32 first, then BF16, stable within each */
    size_t *ord = xmalloc(sizeof *ord * (n ? n : 1)), k = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].dtype == ST_F32)
            ord[k++] = i;
    for (size_t i = 0; i < n; i++)
        if (t[i].dtype != ST_F32)
            ord[k++] = i;
    size_t hlen;
    char *header = build_header(path, t, ord, bytes, n, meta, n_meta, &hlen, err, errlen);
    if (!header) {
        free(ord);
        return -1;
    }
    struct st_body body = {t, bytes, ord, n, header, hlen};
    int rc = fs_write_atomic_with(path, 0644, write_body, &body, err, errlen);
    free(header);
    free(ord);
    return rc;
}

int st_write(const char *path, const struct st_write_tensor *tensors, size_t n, const struct st_kv *metadata,
             size_t n_meta, char *err, size_t errlen)
{
    error_set(err, errlen, "%s", "");
    if (!path) {
        error_set(err, errlen, "(null): no path given");
        return -1;
    }
    uint64_t *bytes = xmalloc(sizeof *bytes * (n ? n : 1));
    int rc = check_write_tensors(path, tensors, n, bytes, err, errlen);
    if (rc == 0)
        rc = write_checked(path, tensors, bytes, n, metadata, n_meta, err, errlen);
    free(bytes);
    return rc;
}

static int unlink_stale(const char *path, char *err, size_t errlen)
{
    if (unlink(path) != 0 && errno != ENOENT) {
        error_set(err, errlen, "%s: cannot remove the stale file: %s", path, check_errno_text());
        return -1;
    }
    return 0;
}

int st_write_sharded(const char *dir, const struct st_write_tensor *tensors, size_t n, const struct st_kv *metadata,
                     size_t n_meta, uint64_t max_shard_bytes, int *n_shards_out, char *err, size_t errlen)
{
    error_set(err, errlen, "%s", "");
    if (!dir) {
        error_set(err, errlen, "(null): no directory given");
        return -1;
    }
    char *single = join_path(dir, "model.safetensors");
    char *index = join_path(dir, "model.safetensors.index.json");
    uint64_t *bytes = xmalloc(sizeof *bytes * (n ? n : 1));
    size_t *first = xmalloc(sizeof *first * (n + 1)); /* shard s holds tensors [first[s], first[s+1]) */
    json_t *wm = NULL;
    int rc = -1;
    if (check_write_tensors(single, tensors, n, bytes, err, errlen))
        goto out;
    size_t n_shards = 0;
    uint64_t cur = 0, total = 0;
    first[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && cur + bytes[i] > max_shard_bytes) {
            first[++n_shards] = i;
            cur = 0;
        }
        cur += bytes[i];
        total += bytes[i];
    }
    n_shards++;
    first[n_shards] = n;
    if (n_shards > 99999) {
        error_set(err, errlen, "%s: %zu shards is too many (raise the shard size)", dir, n_shards);
        goto out;
    }
    if (n_shards_out)
        *n_shards_out = (int)n_shards;
    if (n_shards == 1) {
        if (write_checked(single, tensors, bytes, n, metadata, n_meta, err, errlen) ||
            unlink_stale(index, err, errlen) || fs_fsync_dir_of(index, err, errlen))
            goto out;
        rc = 0;
        goto out;
    }
    wm = json_object();
    for (size_t s = 0; s < n_shards; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        char *p = join_path(dir, name);
        int bad = write_checked(p, tensors + first[s], bytes + first[s], first[s + 1] - first[s], metadata, n_meta, err,
                                errlen);
        free(p);
        if (bad)
            goto out;
        for (size_t i = first[s]; i < first[s + 1]; i++)
            json_object_set_new(wm, tensors[i].name, json_string(name));
    }
    json_t *root = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) {
        error_set(err, errlen, "%s: cannot encode the index JSON", index);
        goto out;
    }
    size_t tl = strlen(text);
    char *withnl = xmalloc(tl + 2);
    memcpy(withnl, text, tl);
    memcpy(withnl + tl, "\n", 2);
    free(text);
    int bad = fs_write_atomic(index, withnl, strlen(withnl), err, errlen);
    free(withnl);
    if (bad || unlink_stale(single, err, errlen) || fs_fsync_dir_of(single, err, errlen))
        goto out;
    rc = 0;
out:
    json_decref(wm);
    free(bytes);
    free(first);
    free(single);
    free(index);
    return rc;
}
