/* GGUF v2/v3 reader: see gguf.h. Layout (all little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset },
 *   padding to general.alignment (default 32), tensor data.
 * A string is u64 length + bytes (no NUL); an array value is u32 element type,
 * u64 count, elements. */
#include "worker/formats/gguf.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/check.h"
#include "worker/formats/fmt_util.h"

enum gguf_value_type {
    GV_U8 = 0,
    GV_I8 = 1,
    GV_U16 = 2,
    GV_I16 = 3,
    GV_U32 = 4,
    GV_I32 = 5,
    GV_F32 = 6,
    GV_BOOL = 7,
    GV_STRING = 8,
    GV_ARRAY = 9,
    GV_U64 = 10,
    GV_I64 = 11,
    GV_F64 = 12,
    GV_COUNT
};

/* bytes of a scalar value type (0 for string/array) */
static const uint8_t value_size[GV_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

struct strref {
    const char *p;
    uint64_t len;
};

struct gguf_kv {
    char *key;
    uint32_t type;
    /* scalars */
    uint8_t raw[8];
    /* GV_STRING: NUL-terminated copy */
    char *str;
    /* GV_ARRAY */
    uint32_t arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data; /* into the mapping (scalar element arrays) */
    struct strref *arr_strs; /* string arrays */
};

struct gguf_file {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    struct gguf_kv *kv;
    size_t n_kv;
    struct gguf_tensor_info *tensors;
    size_t n_tensors;
    struct gguf_tensor_info **by_name; /* sorted by name for gguf_find_tensor */
    uint64_t alignment;
    uint64_t data_start;
};

/* ---- tensor types ---- */

struct type_traits {
    const char *name;
    uint32_t block;     /* elements per block (0: unknown type) */
    uint32_t type_size; /* bytes per block */
};

#define QK_K 256
static const struct type_traits *type_traits(uint32_t type)
{
    static const struct type_traits t[] = {
        [0] = {"F32", 1, 4},
        [1] = {"F16", 1, 2},
        [2] = {"Q4_0", 32, 2 + 16},
        [3] = {"Q4_1", 32, 2 + 2 + 16},
        [6] = {"Q5_0", 32, 2 + 4 + 16},
        [7] = {"Q5_1", 32, 2 + 2 + 4 + 16},
        [8] = {"Q8_0", 32, 2 + 32},
        [9] = {"Q8_1", 32, 4 + 4 + 32},
        [10] = {"Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4},
        [11] = {"Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12},
        [12] = {"Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12},
        [13] = {"Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12},
        [14] = {"Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16},
        [15] = {"Q8_K", QK_K, 4 + QK_K + QK_K / 8},
        [16] = {"IQ2_XXS", QK_K, 2 + QK_K / 4},
        [17] = {"IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32},
        [18] = {"IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8},
        [19] = {"IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16},
        [20] = {"IQ4_NL", 32, 2 + 16},
        [21] = {"IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4},
        [22] = {"IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16},
        [23] = {"IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64},
        [24] = {"I8", 1, 1},
        [25] = {"I16", 1, 2},
        [26] = {"I32", 1, 4},
        [27] = {"I64", 1, 8},
        [28] = {"F64", 1, 8},
        [29] = {"IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32},
        [30] = {"BF16", 1, 2},
        [34] = {"TQ1_0", QK_K, 2 + 4 * 13},
        [35] = {"TQ2_0", QK_K, 2 + 64},
        [39] = {"MXFP4", 32, 1 + 16},
    };
    if (type >= sizeof t / sizeof t[0] || t[type].block == 0)
        return NULL;
    return &t[type];
}

const char *gguf_type_name(uint32_t type)
{
    const struct type_traits *tt = type_traits(type);
    return tt ? tt->name : "unknown";
}

/* ---- bounded cursor over the mapping ---- */

struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *path;
    char *err;
    size_t errlen;
};

static int need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos) {
        error_set(c->err, c->errlen,
                  "%s: truncated: %s needs %" PRIu64 " bytes at offset %zu but the file has %zu bytes", c->path, what,
                  n, c->pos, c->size);
        return -1;
    }
    return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *what)
{
    if (need(c, 4, what))
        return -1;
    *v = fmt_ld_u32(c->base + c->pos);
    c->pos += 4;
    return 0;
}

static int rd_u64(struct cursor *c, uint64_t *v, const char *what)
{
    if (need(c, 8, what))
        return -1;
    *v = fmt_ld_u64(c->base + c->pos);
    c->pos += 8;
    return 0;
}

/* A gguf string: pointer into the mapping and its length. */
static int rd_str(struct cursor *c, struct strref *s, const char *what)
{
    uint64_t len;
    if (rd_u64(c, &len, what))
        return -1;
    if (len > c->size - c->pos) {
        error_set(c->err, c->errlen,
                  "%s: %s: string length %" PRIu64 " at offset %zu runs past the end of the file (%zu bytes)", c->path,
                  what, len, c->pos - 8, c->size);
        return -1;
    }
    s->p = (const char *)(c->base + c->pos);
    s->len = len;
    c->pos += (size_t)len;
    return 0;
}

static char *dup_strref(const struct strref *s)
{
    char *r = xmalloc((size_t)s->len + 1);
    memcpy(r, s->p, (size_t)s->len);
    r[s->len] = '\0';
    return r;
}

/* ---- metadata values ---- */

static int is_int_type(uint32_t t)
{
    return t == GV_U8 || t == GV_I8 || t == GV_U16 || t == GV_I16 || t == GV_U32 || t == GV_I32 || t == GV_U64 ||
           t == GV_I64 || t == GV_BOOL;
}

/* Integer scalar at p of type t widened to int64; -1 if it does not fit (u64 > INT64_MAX). */
static int load_int(const uint8_t *p, uint32_t t, int64_t *out)
{
    switch (t) {
    case GV_U8: *out = p[0]; return 0;
    case GV_BOOL: *out = p[0] != 0; return 0;
    case GV_I8: *out = (int8_t)p[0]; return 0; // NOLINT(bugprone-signed-char-misuse): sign extension wanted
    case GV_U16: *out = fmt_ld_u16(p); return 0;
    case GV_I16: *out = (int16_t)fmt_ld_u16(p); return 0;
    case GV_U32: *out = fmt_ld_u32(p); return 0;
    case GV_I32: *out = (int32_t)fmt_ld_u32(p); return 0;
    case GV_I64: *out = (int64_t)fmt_ld_u64(p); return 0;
    case GV_U64: {
        uint64_t u = fmt_ld_u64(p);
        if (u > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)u;
        return 0;
    }
    default: return -1;
    }
}

static int load_float(const uint8_t *p, uint32_t t, double *out)
{
    if (t == GV_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        *out = f;
        return 0;
    }
    if (t == GV_F64) {
        memcpy(out, p, sizeof *out);
        return 0;
    }
    if (t == GV_U64) {
        *out = (double)fmt_ld_u64(p);
        return 0;
    }
    int64_t i;
    if (load_int(p, t, &i))
        return -1;
    *out = (double)i;
    return 0;
}

static int parse_kv(struct cursor *c, struct gguf_kv *kv, uint64_t idx)
{
    char what[320];
    struct strref key;
    snprintf(what, sizeof what, "the key of metadata entry #%" PRIu64, idx);
    if (rd_str(c, &key, what))
        return -1;
    if (memchr(key.p, '\0', (size_t)key.len)) {
        error_set(c->err, c->errlen, "%s: metadata entry #%" PRIu64 " has a key containing a NUL byte", c->path, idx);
        return -1;
    }
    kv->key = dup_strref(&key);
    snprintf(what, sizeof what, "the value type of key '%.200s'", kv->key);
    if (rd_u32(c, &kv->type, what))
        return -1;
    snprintf(what, sizeof what, "the value of key '%.200s'", kv->key);
    if (kv->type >= GV_COUNT) {
        error_set(c->err, c->errlen, "%s: key '%s' has unknown value type %" PRIu32, c->path, kv->key, kv->type);
        return -1;
    }
    if (kv->type == GV_STRING) {
        struct strref s;
        if (rd_str(c, &s, what))
            return -1;
        kv->str = dup_strref(&s);
        return 0;
    }
    if (kv->type != GV_ARRAY) {
        size_t n = value_size[kv->type];
        if (need(c, n, what))
            return -1;
        memcpy(kv->raw, c->base + c->pos, n);
        c->pos += n;
        return 0;
    }
    snprintf(what, sizeof what, "the element type of array '%.200s'", kv->key);
    if (rd_u32(c, &kv->arr_type, what))
        return -1;
    if (kv->arr_type >= GV_COUNT || kv->arr_type == GV_ARRAY) {
        error_set(c->err, c->errlen, "%s: array '%s' has %s element type %" PRIu32, c->path, kv->key,
                  kv->arr_type == GV_ARRAY ? "unsupported (nested array)" : "unknown", kv->arr_type);
        return -1;
    }
    snprintf(what, sizeof what, "the length of array '%.200s'", kv->key);
    if (rd_u64(c, &kv->arr_n, what))
        return -1;
    size_t left = c->size - c->pos;
    if (kv->arr_type == GV_STRING) {
        /* each element needs at least its 8-byte length */
        if (kv->arr_n > left / 8) {
            error_set(c->err, c->errlen,
                      "%s: array '%s' claims %" PRIu64 " strings but only %zu bytes remain in the file", c->path,
                      kv->key, kv->arr_n, left);
            return -1;
        }
        kv->arr_strs = xmalloc(sizeof *kv->arr_strs * (size_t)(kv->arr_n ? kv->arr_n : 1));
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            snprintf(what, sizeof what, "element %" PRIu64 " of array '%.200s'", i, kv->key);
            if (rd_str(c, &kv->arr_strs[i], what))
                return -1;
        }
        return 0;
    }
    size_t es = value_size[kv->arr_type];
    if (kv->arr_n > left / es) {
        error_set(c->err, c->errlen,
                  "%s: array '%s' of %" PRIu64 " elements of %zu bytes runs past the end of the file (%zu bytes)",
                  c->path, kv->key, kv->arr_n, es, c->size);
        return -1;
    }
    kv->arr_data = c->base + c->pos;
    c->pos += (size_t)kv->arr_n * es;
    return 0;
}

static const struct gguf_kv *find_kv(const struct gguf_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0)
            return &f->kv[i];
    return NULL;
}

/* ---- tensor infos ---- */

static int parse_tensor_info(struct cursor *c, struct gguf_tensor_info *t, uint64_t idx)
{
    char what[320];
    struct strref name;
    snprintf(what, sizeof what, "the name of tensor #%" PRIu64, idx);
    if (rd_str(c, &name, what))
        return -1;
    if (memchr(name.p, '\0', (size_t)name.len)) {
        error_set(c->err, c->errlen, "%s: tensor #%" PRIu64 " has a name containing a NUL byte", c->path, idx);
        return -1;
    }
    char *nm = dup_strref(&name);
    t->name = nm;
    snprintf(what, sizeof what, "the dimension count of tensor '%.200s'", nm);
    uint32_t n_dims;
    if (rd_u32(c, &n_dims, what))
        return -1;
    if (n_dims > 4) {
        error_set(c->err, c->errlen, "%s: tensor '%s' has %" PRIu32 " dimensions (at most 4 allowed)", c->path, nm,
                  n_dims);
        return -1;
    }
    t->n_dims = (int)n_dims;
    for (int d = 0; d < 4; d++)
        t->dims[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        snprintf(what, sizeof what, "dimension %" PRIu32 " of tensor '%.200s'", d, nm);
        if (rd_u64(c, &t->dims[d], what))
            return -1;
    }
    snprintf(what, sizeof what, "the type of tensor '%.200s'", nm);
    if (rd_u32(c, &t->type, what))
        return -1;
    snprintf(what, sizeof what, "the data offset of tensor '%.200s'", nm);
    if (rd_u64(c, &t->offset, what))
        return -1;

    const struct type_traits *tt = type_traits(t->type);
    if (!tt) {
        error_set(c->err, c->errlen, "%s: tensor '%s' has unknown type %" PRIu32, c->path, nm, t->type);
        return -1;
    }
    uint64_t n = 1;
    for (int d = 0; d < 4; d++) {
        if (__builtin_mul_overflow(n, t->dims[d], &n) || n > (uint64_t)INT64_MAX) {
            error_set(c->err, c->errlen,
                      "%s: tensor '%s' has dimensions [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                      "] whose element count overflows",
                      c->path, nm, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
            return -1;
        }
    }
    if (t->dims[0] % tt->block != 0) {
        error_set(c->err, c->errlen,
                  "%s: tensor '%s' of type %s has a row of %" PRIu64
                  " elements, not a multiple of the block size %" PRIu32,
                  c->path, nm, tt->name, t->dims[0], tt->block);
        return -1;
    }
    t->n_elements = n;
    if (__builtin_mul_overflow(n / tt->block, (uint64_t)tt->type_size, &t->n_bytes)) {
        error_set(c->err, c->errlen, "%s: tensor '%s': byte size overflows", c->path, nm);
        return -1;
    }
    return 0;
}

static int cmp_by_name(const void *a, const void *b)
{
    const struct gguf_tensor_info *x = *(const struct gguf_tensor_info *const *)a;
    const struct gguf_tensor_info *y = *(const struct gguf_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct gguf_tensor_info *x = *(const struct gguf_tensor_info *const *)a;
    const struct gguf_tensor_info *y = *(const struct gguf_tensor_info *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

/* ---- open / close ---- */

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str);
        free(f->kv[i].arr_strs);
    }
    free(f->kv);
    for (size_t i = 0; i < f->n_tensors; i++)
        free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    if (f->map)
        munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

struct gguf_file *gguf_open(const char *path, char *err, size_t errlen)
{
    error_set(err, errlen, "%s", "");
    if (!path) {
        error_set(err, errlen, "(null): no path given");
        return NULL;
    }
    struct gguf_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    if (fmt_map_file(path, 24, "GGUF", &f->map, &f->size, err, errlen))
        goto fail;

    struct cursor c = {.base = f->map, .size = f->size, .pos = 0, .path = path, .err = err, .errlen = errlen};
    if (memcmp(f->map, "GGUF", 4) != 0) {
        error_set(err, errlen, "%s: not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")", path, f->map[0],
                  f->map[1], f->map[2], f->map[3]);
        goto fail;
    }
    c.pos = 4;
    rd_u32(&c, &f->version, "the version");
    if (f->version != 2 && f->version != 3) {
        if (f->version == 1)
            error_set(err, errlen, "%s: GGUF version 1 is not supported (need 2 or 3)", path);
        else if ((f->version & 0xffff) == 0 && f->version != 0)
            error_set(err, errlen, "%s: big-endian GGUF files are not supported", path);
        else
            error_set(err, errlen, "%s: unsupported GGUF version %" PRIu32 " (need 2 or 3)", path, f->version);
        goto fail;
    }
    uint64_t n_tensors = 0, n_kv = 0; /* stay 0 when the header is cut short (rd_u64 records the error) */
    rd_u64(&c, &n_tensors, "the tensor count");
    rd_u64(&c, &n_kv, "the metadata count");
    /* each metadata entry takes at least 12 bytes, each tensor info at least 24 */
    if (n_kv > (f->size - c.pos) / 12) {
        error_set(err, errlen, "%s: metadata count %" PRIu64 " is impossible for a file of %zu bytes", path, n_kv,
                  f->size);
        goto fail;
    }
    if (n_tensors > (f->size - c.pos) / 24 || n_tensors > INT_MAX) {
        error_set(err, errlen, "%s: tensor count %" PRIu64 " is impossible for a file of %zu bytes", path, n_tensors,
                  f->size);
        goto fail;
    }

    f->kv = xcalloc(n_kv ? n_kv : 1, sizeof *f->kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = i + 1; /* so gguf_close frees a partly parsed entry */
        if (parse_kv(&c, &f->kv[i], i))
            goto fail;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(f->kv[j].key, f->kv[i].key) == 0) {
                error_set(err, errlen, "%s: duplicate metadata key '%s'", path, f->kv[i].key);
                goto fail;
            }
    }

    f->alignment = 32;
    const struct gguf_kv *al = find_kv(f, "general.alignment");
    if (al) {
        int64_t a;
        if (!is_int_type(al->type) || al->type == GV_BOOL || load_int(al->raw, al->type, &a) || a <= 0 ||
            (a & (a - 1)) != 0 || a > (1 << 30)) {
            error_set(err, errlen, "%s: general.alignment must be a power-of-two integer", path);
            goto fail;
        }
        f->alignment = (uint64_t)a;
    }

    f->tensors = xcalloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        f->n_tensors = i + 1;
        if (parse_tensor_info(&c, &f->tensors[i], i))
            goto fail;
    }
    f->data_start = ((uint64_t)c.pos + f->alignment - 1) / f->alignment * f->alignment;

    f->by_name = xmalloc(sizeof *f->by_name * (f->n_tensors ? f->n_tensors : 1));
    for (size_t i = 0; i < f->n_tensors; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->n_tensors, sizeof *f->by_name, cmp_by_name);
    for (size_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
            error_set(err, errlen, "%s: duplicate tensor name '%s'", path, f->by_name[i]->name);
            goto fail;
        }

    /* data ranges: aligned, inside the file, not overlapping */
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        if (t->offset % f->alignment != 0) {
            error_set(err, errlen,
                      "%s: tensor '%s' data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, path,
                      t->name, t->offset, f->alignment);
            goto fail;
        }
        uint64_t begin, end;
        if (__builtin_add_overflow(f->data_start, t->offset, &begin) ||
            __builtin_add_overflow(begin, t->n_bytes, &end) || end > f->size) {
            error_set(err, errlen,
                      "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") runs past the end of the file (%zu bytes)", path,
                      t->name, f->data_start + t->offset, f->data_start + t->offset + t->n_bytes, f->size);
            goto fail;
        }
    }
    if (f->n_tensors > 1) {
        struct gguf_tensor_info **by_off = xmalloc(sizeof *by_off * f->n_tensors);
        memcpy(by_off, f->by_name, sizeof *by_off * f->n_tensors);
        qsort(by_off, f->n_tensors, sizeof *by_off, cmp_by_offset);
        for (size_t i = 1; i < f->n_tensors; i++)
            if (by_off[i - 1]->offset + by_off[i - 1]->n_bytes > by_off[i]->offset) {
                error_set(err, errlen, "%s: data of tensors '%s' and '%s' overlap", path, by_off[i - 1]->name,
                          by_off[i]->name);
                free(by_off);
                goto fail;
            }
        free(by_off);
    }
    return f;
fail:
    gguf_close(f);
    return NULL;
}

const char *gguf_path(const struct gguf_file *f) { return f ? f->path : NULL; }

/* ---- metadata accessors ---- */

int gguf_has_key(const struct gguf_file *f, const char *key) { return find_kv(f, key) != NULL; }

const char *gguf_get_str(const struct gguf_file *f, const char *key)
{
    const struct gguf_kv *kv = find_kv(f, key);
    return kv && kv->type == GV_STRING ? kv->str : NULL;
}

int gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = find_kv(f, key);
    if (!kv || !is_int_type(kv->type))
        return -1;
    int64_t v;
    if (load_int(kv->raw, kv->type, &v))
        return -1;
    if (out)
        *out = v;
    return 0;
}

int gguf_get_float(const struct gguf_file *f, const char *key, double *out)
{
    const struct gguf_kv *kv = find_kv(f, key);
    if (!kv || kv->type == GV_STRING || kv->type == GV_ARRAY)
        return -1;
    double v;
    if (load_float(kv->raw, kv->type, &v))
        return -1;
    if (out)
        *out = v;
    return 0;
}

size_t gguf_get_arr_n(const struct gguf_file *f, const char *key)
{
    const struct gguf_kv *kv = find_kv(f, key);
    return kv && kv->type == GV_ARRAY ? (size_t)kv->arr_n : 0;
}

const char *gguf_get_arr_str(const struct gguf_file *f, const char *key, size_t i, size_t *len)
{
    const struct gguf_kv *kv = find_kv(f, key);
    if (!kv || kv->type != GV_ARRAY || kv->arr_type != GV_STRING || i >= kv->arr_n)
        return NULL;
    if (len)
        *len = (size_t)kv->arr_strs[i].len;
    return kv->arr_strs[i].p;
}

int gguf_get_arr_int(const struct gguf_file *f, const char *key, size_t i, int64_t *out)
{
    const struct gguf_kv *kv = find_kv(f, key);
    if (!kv || kv->type != GV_ARRAY || !is_int_type(kv->arr_type) || i >= kv->arr_n)
        return -1;
    int64_t v;
    if (load_int(kv->arr_data + i * value_size[kv->arr_type], kv->arr_type, &v))
        return -1;
    if (out)
        *out = v;
    return 0;
}

int gguf_get_arr_float(const struct gguf_file *f, const char *key, size_t i, double *out)
{
    const struct gguf_kv *kv = find_kv(f, key);
    if (!kv || kv->type != GV_ARRAY || kv->arr_type == GV_STRING || i >= kv->arr_n)
        return -1;
    double v;
    if (load_float(kv->arr_data + i * value_size[kv->arr_type], kv->arr_type, &v))
        return -1;
    if (out)
        *out = v;
    return 0;
}

/* ---- tensors ---- */

int gguf_num_tensors(const struct gguf_file *f) { return f ? (int)f->n_tensors : 0; }

const struct gguf_tensor_info *gguf_tensor(const struct gguf_file *f, int i)
{
    if (!f || i < 0 || (size_t)i >= f->n_tensors)
        return NULL;
    return &f->tensors[i];
}

const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    if (!f || !name || f->n_tensors == 0)
        return NULL;
    struct gguf_tensor_info key = {.name = name};
    const struct gguf_tensor_info *kp = &key;
    struct gguf_tensor_info **hit = bsearch(&kp, f->by_name, f->n_tensors, sizeof *f->by_name, cmp_by_name);
    return hit ? *hit : NULL;
}

/* ---- dequantisation (bit-exact with ggml's reference / gguf-py's numpy code) ---- */

static void deq_q4_0(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = fmt_f16_to_f32(fmt_ld_u16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = fmt_f16_to_f32(fmt_ld_u16(b));
        const float m = fmt_f16_to_f32(fmt_ld_u16(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            /* two roundings, as in ggml: product, then sum. Separate statements keep clang from fusing them
             * into an FMA; GCC does not contract at all in ISO C mode (-std=c17). */
            const float p0 = (float)(qs[j] & 0x0f) * d;
            const float p1 = (float)(qs[j] >> 4) * d;
            y[j] = p0 + m;
            y[j + 16] = p1 + m;
        }
    }
}

static void deq_q8_0(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = fmt_f16_to_f32(fmt_ld_u16(b));
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* Q6_K super-block of 256: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16] (one per 16 values), f16 d.
 * Within each half of 128 values (ql advancing 64 bytes, qh 32, scales 8), for l in 0..31:
 *   y[l]    = ql[l]    & 15 | (qh[l] >> 0 & 3) << 4
 *   y[l+32] = ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4
 *   y[l+64] = ql[l]    >> 4 | (qh[l] >> 4 & 3) << 4
 *   y[l+96] = ql[l+32] >> 4 | (qh[l] >> 6 & 3) << 4
 * each minus 32, times d * scales[(index within the block) / 16]. */
static void deq_q6_k(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 210, y += QK_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = fmt_f16_to_f32(fmt_ld_u16(b + 208));
        float ds[16];
        for (int s = 0; s < 16; s++)
            ds[s] = d * (float)sc[s];
        for (int h = 0; h < 2; h++) {
            float *yy = y + 128 * h;
            const uint8_t *l4 = ql + 64 * h, *h2 = qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = ((l4[l] & 0x0f) | ((h2[l] >> 0 & 3) << 4)) - 32;
                int q2 = ((l4[l + 32] & 0x0f) | ((h2[l] >> 2 & 3) << 4)) - 32;
                int q3 = ((l4[l] >> 4) | ((h2[l] >> 4 & 3) << 4)) - 32;
                int q4 = ((l4[l + 32] >> 4) | ((h2[l] >> 6 & 3) << 4)) - 32;
                yy[l] = ds[(128 * h + l) / 16] * (float)q1;
                yy[l + 32] = ds[(128 * h + l + 32) / 16] * (float)q2;
                yy[l + 64] = ds[(128 * h + l + 64) / 16] * (float)q3;
                yy[l + 96] = ds[(128 * h + l + 96) / 16] * (float)q4;
            }
        }
    }
}

int gguf_tensor_to_f32(const struct gguf_file *f, const struct gguf_tensor_info *t, float *out, char *err,
                       size_t errlen)
{
    if (!f || !t || !out) {
        error_set(err, errlen, "%s: gguf_tensor_to_f32 called with a NULL argument", f ? f->path : "(null)");
        return -1;
    }
    if (t < f->tensors || t >= f->tensors + f->n_tensors) {
        error_set(err, errlen, "%s: tensor '%s' does not belong to this file", f->path, t->name ? t->name : "?");
        return -1;
    }
    const uint8_t *src = f->map + f->data_start + t->offset;
    const uint64_t n = t->n_elements;
    switch (t->type) {
    case GGUF_TYPE_F32: memcpy(out, src, (size_t)n * 4); return 0;
    case GGUF_TYPE_F16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = fmt_f16_to_f32(fmt_ld_u16(src + 2 * i));
        return 0;
    case GGUF_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = fmt_bf16_to_f32(fmt_ld_u16(src + 2 * i));
        return 0;
    case GGUF_TYPE_Q4_0: deq_q4_0(src, out, n / 32); return 0;
    case GGUF_TYPE_Q4_1: deq_q4_1(src, out, n / 32); return 0;
    case GGUF_TYPE_Q8_0: deq_q8_0(src, out, n / 32); return 0;
    case GGUF_TYPE_Q6_K: deq_q6_k(src, out, n / QK_K); return 0;
    default:
        error_set(err, errlen, "%s: tensor '%s' has type %s (%" PRIu32 "), which cannot be dequantised to f32", f->path,
                  t->name, gguf_type_name(t->type), t->type);
        return -1;
    }
}
