/* TensorBoard event files written by hand: TFRecord framing with masked
 * CRC-32C, and tensorflow.Event protobufs encoded field by field.
 *
 *   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                Summary summary = 5; SessionLog session_log = 7; }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; float simple_value = 2; }
 *   SessionLog { enum SessionStatus status = 1; }   START = 1
 *
 * Protobuf wire format: a key is (field << 3) | wire type, as a varint; wire
 * types used here are 0 (varint), 1 (64-bit), 2 (length-delimited), 5 (32-bit),
 * all little-endian. */
#include "worker/metrics/metrics.h"

#include "common/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "worker/metrics/metrics_internal.h"

#define SUBSYS "tensorboard"

/* -------------------------------------------------------- TFRecord framing */

uint32_t crc32c_masked(const void *data, size_t n)
{
    uint32_t crc = crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

size_t tfrecord_frame(uint8_t *out, const void *data, size_t n)
{
    put_le64(out, (uint64_t)n);
    put_le32(out + 8, crc32c_masked(out, 8));
    memcpy(out + 12, data, n);
    put_le32(out + 12 + n, crc32c_masked(data, n));
    return n + 16;
}

/* ------------------------------------------------------------------ protobuf */

struct pb {
    uint8_t *p;
    size_t n, cap;
    bool overflow;
};

static void pb_byte(struct pb *b, uint8_t v)
{
    if (b->n < b->cap)
        b->p[b->n] = v;
    else
        b->overflow = true;
    b->n++;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    while (v >= 0x80) {
        pb_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    pb_byte(b, (uint8_t)v);
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void pb_key(struct pb *b, unsigned field, unsigned wire) { pb_varint(b, ((uint64_t)field << 3) | wire); }

static void pb_bytes(struct pb *b, const void *data, size_t n)
{
    const uint8_t *d = data;
    for (size_t i = 0; i < n; i++)
        pb_byte(b, d[i]);
}

static void pb_double(struct pb *b, unsigned field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t le[8];
    put_le64(le, bits);
    pb_key(b, field, 1);
    pb_bytes(b, le, 8);
}

static void pb_float(struct pb *b, unsigned field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t le[4];
    put_le32(le, bits);
    pb_key(b, field, 5);
    pb_bytes(b, le, 4);
}

static void pb_string(struct pb *b, unsigned field, const char *s, size_t n)
{
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static size_t pb_done(struct pb *b) { return b->overflow ? 0 : b->n; }

size_t tb_encode_file_version(uint8_t *buf, size_t cap, double wall_time)
{
    static const char version[] = "brain.Event:2";
    struct pb b = {buf, 0, cap, false};
    pb_double(&b, 1, wall_time);
    pb_string(&b, 3, version, sizeof version - 1);
    return pb_done(&b);
}

size_t tb_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *tag, float value)
{
    size_t tag_len = strlen(tag);
    size_t value_len = 1 + varint_size(tag_len) + tag_len + 5; /* Value: tag, simple_value */
    size_t summary_len = 1 + varint_size(value_len) + value_len;
    struct pb b = {buf, 0, cap, false};
    pb_double(&b, 1, wall_time);
    pb_key(&b, 2, 0);
    pb_varint(&b, (uint64_t)step); /* int64: negative values take ten bytes, as protobuf does */
    pb_key(&b, 5, 2);              /* Event.summary */
    pb_varint(&b, summary_len);
    pb_key(&b, 1, 2); /* Summary.value */
    pb_varint(&b, value_len);
    pb_string(&b, 1, tag, tag_len); /* Value.tag */
    pb_float(&b, 2, value);         /* Value.simple_value (in a oneof: always written, 0 included) */
    return pb_done(&b);
}

size_t tb_encode_session_start(uint8_t *buf, size_t cap, double wall_time, int64_t step)
{
    struct pb b = {buf, 0, cap, false};
    pb_double(&b, 1, wall_time);
    pb_key(&b, 2, 0);
    pb_varint(&b, (uint64_t)step);
    pb_key(&b, 7, 2); /* Event.session_log (6 is the deprecated log_message) */
    pb_varint(&b, 2);
    pb_key(&b, 1, 0); /* SessionLog.status = START */
    pb_varint(&b, 1);
    return pb_done(&b);
}

/* -------------------------------------------------------------------- writer */

double metrics_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long micros = ts.tv_nsec / 1000; /* whole microseconds, as time.time() in the writers TensorBoard knows */
    return (double)ts.tv_sec + (double)micros * 1e-6;
}

static int write_record(struct metrics_tb *w, const uint8_t *data, size_t n)
{
    uint8_t head[12], tail[4];
    put_le64(head, (uint64_t)n);
    put_le32(head + 8, crc32c_masked(head, 8));
    put_le32(tail, crc32c_masked(data, n));
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head || fwrite(data, 1, n, w->f) != n ||
        fwrite(tail, 1, sizeof tail, w->f) != sizeof tail) {
        metrics_output_failed(SUBSYS, w->path, "writing %s: %s", w->path, check_errno_text());
        clearerr(w->f);
        return -1;
    }
    return 0;
}

/* The host name with '/' (impossible in a file name) replaced. */
static void host_name(char *out, size_t cap)
{
    if (gethostname(out, cap) != 0 || out[0] == '\0')
        snprintf(out, cap, "localhost");
    out[cap - 1] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '/')
            *p = '_';
}

int metrics_tb_open(struct metrics_tb *w, const char *dir, long start_step)
{
    memset(w, 0, sizeof *w);
    if (fs_mkdir_p(dir) != 0) {
        log_error(SUBSYS, "cannot create %s: %s", dir, check_errno_text());
        return -1;
    }
    char host[HOST_NAME_MAX + 1];
    host_name(host, sizeof host);
    long t = (long)time(NULL);
    int fd = -1;
    char *path = NULL;
    for (int attempt = 0; attempt < 1000 && fd < 0; attempt++, t++) {
        size_t n = strlen(dir) + strlen(host) + 64;
        free(path);
        path = xmalloc(n);
        snprintf(path, n, "%s/events.out.tfevents.%ld.%s", dir, t, host);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        metrics_output_failed(SUBSYS, path, "cannot create %s: %s", path, check_errno_text());
        free(path);
        return -1;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        log_error(SUBSYS, "fdopen %s: %s", path, check_errno_text());
        close(fd);
        free(path);
        return -1;
    }
    w->path = path;
    uint8_t buf[64];
    double now = metrics_wall_time();
    size_t n = tb_encode_file_version(buf, sizeof buf, now);
    int rc = write_record(w, buf, n);
    if (rc == 0 && start_step >= 0) {
        n = tb_encode_session_start(buf, sizeof buf, now, start_step);
        rc = write_record(w, buf, n);
    }
    if (rc == 0 && fflush(w->f) != 0) {
        metrics_output_failed(SUBSYS, w->path, "writing %s: %s", w->path, check_errno_text());
        clearerr(w->f);
        rc = -1;
    }
    log_debug(SUBSYS, "writing %s", w->path);
    return rc;
}

int metrics_tb_write(struct metrics_tb *w, long step, const struct metrics *m, double wall_time)
{
    if (!w->f)
        return -1;
    uint8_t small[512];
    int rc = 0;
    for (size_t i = 0; i < m->n && rc == 0; i++) {
        size_t need = strlen(m->items[i].name) + 64;
        uint8_t *buf = need <= sizeof small ? small : xmalloc(need);
        size_t n = tb_encode_scalar(buf, need, wall_time, step, m->items[i].name, (float)m->items[i].value);
        rc = write_record(w, buf, n);
        if (buf != small)
            free(buf);
    }
    if (rc == 0 && fflush(w->f) != 0) {
        metrics_output_failed(SUBSYS, w->path, "writing %s: %s", w->path, check_errno_text());
        clearerr(w->f);
        rc = -1;
    }
    return rc;
}

int metrics_tb_sync(struct metrics_tb *w) { return metrics_stream_sync(w->f, w->path, SUBSYS); }

void metrics_tb_close(struct metrics_tb *w)
{
    metrics_stream_close(w->f, w->path, SUBSYS);
    free(w->path);
    memset(w, 0, sizeof *w);
}
