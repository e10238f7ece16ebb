#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fs.h"

/* The bytes of one .npy file after its header is formatted (fs_write_fn's ctx). */
struct npy_body {
    const char *header;
    int header_len;
    const float *data;
    size_t count;
};

static int write_npy(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const struct npy_body *b = ctx;
    const int n = b->header_len;
    const unsigned char pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(b->header, 1, (size_t)n, f) == (size_t)n &&
             (b->count == 0 || fwrite(b->data, sizeof(float), b->count, f) == b->count);
    return ok ? 0 : -1;
}

int npy_write_f32(const char *path, const float *data, const int64_t *shape, int n_dims, char *err, size_t errlen)
{
    char header[256];
    int n = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < n_dims; i++) {
        n += snprintf(header + n, sizeof header - (size_t)n, "%lld,%s", (long long)shape[i], i + 1 < n_dims ? " " : "");
        count *= (size_t)shape[i];
    }
    n += snprintf(header + n, sizeof header - (size_t)n, "), }");
    /* pad with spaces so that magic (6) + version (2) + length (2) + header ends on a 64-byte boundary */
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    memset(header + n, ' ', (size_t)pad);
    n += pad;
    header[n++] = '\n';
    struct npy_body b = {header, n, data, count};
    return fs_write_atomic_with(path, 0644, write_npy, &b, err, errlen);
}

int npy_read_f32(const char *path, float **data, int64_t *shape, int *n_dims, char *err, size_t errlen)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, why);
        return -1;
    }
    unsigned char pre[10];
    char header[1024];
    int rc = -1;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
        snprintf(err, errlen, "%s: not a version-1 .npy file", path);
        goto out;
    }
    size_t hl = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (hl >= sizeof header || fread(header, 1, hl, f) != hl) {
        snprintf(err, errlen, "%s: truncated or oversized header", path);
        goto out;
    }
    header[hl] = 0;
    int f8 = strstr(header, "'<f8'") != NULL;
    if ((!f8 && !strstr(header, "'<f4'")) || strstr(header, "'fortran_order': True")) {
        snprintf(err, errlen, "%s: only little-endian float32/float64 in C order is supported", path);
        goto out;
    }
    const char *s = strstr(header, "'shape': (");
    if (!s) {
        snprintf(err, errlen, "%s: header has no shape", path);
        goto out;
    }
    s += 10;
    *n_dims = 0;
    size_t count = 1;
    while (*s && *s != ')' && *n_dims < 4) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s)
            break;
        shape[(*n_dims)++] = v;
        count *= (size_t)v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    *data = xmalloc((count ? count : 1) * sizeof(float));
    if (f8) {
        double *tmp = xmalloc((count ? count : 1) * sizeof(double));
        size_t got = fread(tmp, sizeof(double), count, f);
        for (size_t i = 0; i < got; i++)
            (*data)[i] = (float)tmp[i];
        free(tmp);
        rc = got == count ? 0 : -1;
    } else {
        rc = fread(*data, sizeof(float), count, f) == count ? 0 : -1;
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s: data truncated (%zu values expected)", path, count);
        free(*data);
        *data = NULL;
    }
out:
    fclose(f);
    return rc;
}
