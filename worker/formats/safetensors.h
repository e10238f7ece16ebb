/* Hugging Face safetensors checkpoints: reader (single file, or a directory
 * holding model.safetensors or a sharded model.safetensors.index.json) and an
 * atomic writer (single file or shards + index).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * then the data buffer; offsets are relative to the start of that buffer.
 * Shapes are row-major: shape[n_dims-1] varies fastest.
 *
 * Files are memory-mapped read-only and the header is validated strictly
 * (every dtype known, size == dtype size * product(shape), ranges inside the
 * file and not overlapping); failures return NULL/-1 with err naming the file
 * and, where there is one, the tensor or key. */
#ifndef GRPO_WORKER_SAFETENSORS_H
#define GRPO_WORKER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 8
/* Header JSON larger than this is rejected as corrupt. */
#define ST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

struct st_tensor_info {
    const char *name;
    enum st_dtype dtype;
    int n_dims;                 /* 0 for a scalar */
    int64_t shape[ST_MAX_DIMS]; /* row-major; entries past n_dims are 1 */
    uint64_t n_elements;
    uint64_t n_bytes;
    uint64_t data_begin, data_end; /* data_offsets: relative to the data buffer */
    const void *data;              /* into the read-only mapping (not necessarily aligned) */
};

/* "BF16" etc.; "unknown" for a bad value. */
const char *st_dtype_name(enum st_dtype dt);
/* Bytes per element, 0 for a bad value. */
size_t st_dtype_size(enum st_dtype dt);

/* ---- one file ---- */
struct st_file;

struct st_file *st_open(const char *path, char *err, size_t errlen);
void st_close(struct st_file *f);
const char *st_path(const struct st_file *f);
int st_num_tensors(const struct st_file *f);
/* Tensors in order of their data offsets. */
const struct st_tensor_info *st_tensor(const struct st_file *f, int i);
/* Tensor by name, or NULL. */
const struct st_tensor_info *st_find(const struct st_file *f, const char *name);
/* "__metadata__" entries. */
int st_num_metadata(const struct st_file *f);
/* Entry i (key in *key), or NULL when out of range. */
const char *st_metadata_at(const struct st_file *f, int i, const char **key);
/* Value of a metadata key, or NULL. */
const char *st_metadata(const struct st_file *f, const char *key);
/* Convert a F32, BF16 or F16 tensor of f to n_elements floats; 0, or -1 with err naming file and tensor. */
int st_tensor_to_f32(const struct st_file *f, const struct st_tensor_info *t, float *out, char *err, size_t errlen);

/* ---- a checkpoint: one file or shards ---- */
struct st_model;

/* path: a directory holding model.safetensors (preferred) or model.safetensors.index.json, or the path of a
 * .safetensors file, or of an index .json. Shards are opened once each; every tensor named in the index must
 * be in its shard and no tensor may appear in two files. */
struct st_model *st_model_open(const char *path, char *err, size_t errlen);
void st_model_close(struct st_model *m);
int st_model_num_files(const struct st_model *m);
const struct st_file *st_model_file(const struct st_model *m, int i);
/* All tensors of the checkpoint, sorted by name. file (optional) receives the file holding tensor i. */
int st_model_num_tensors(const struct st_model *m);
const struct st_tensor_info *st_model_tensor(const struct st_model *m, int i, const struct st_file **file);
/* Tensor by name (NULL if absent); file (optional) receives the file holding it. */
const struct st_tensor_info *st_model_find(const struct st_model *m, const char *name, const struct st_file **file);
/* Look up by name and convert to f32 (see st_tensor_to_f32); -1 with err naming the tensor if absent. */
int st_model_tensor_to_f32(const struct st_model *m, const char *name, float *out, char *err, size_t errlen);

/* ---- writing ---- */
struct st_write_tensor {
    const char *name;
    const int64_t *shape; /* row-major, n_dims entries */
    int n_dims;           /* 0..ST_MAX_DIMS */
    const float *data;    /* product(shape) floats */
    enum st_dtype dtype;  /* stored as ST_F32 or ST_BF16 (rounded to nearest even) */
};

struct st_kv {
    const char *key;
    const char *value;
};

/* Write one safetensors file atomically: PATH.tmp, fsync, rename to PATH, fsync the directory. Tensors are
 * stored F32 first, then BF16 (keeping data aligned to the element size), in the given order within a dtype.
 * metadata (n_meta entries, may be 0) becomes "__metadata__". 0, or -1 with err; on error PATH is untouched. */
int st_write(const char *path, const struct st_write_tensor *tensors, size_t n, const struct st_kv *metadata,
             size_t n_meta, char *err, size_t errlen);

/* Write a checkpoint into directory dir (which must exist), splitting the tensors (in the given order) into
 * shards of at most max_shard_bytes of tensor data each (a tensor larger than that gets a shard of its own).
 * One shard: dir/model.safetensors (and a stale dir/model.safetensors.index.json is removed). Several:
 * dir/model-00001-of-0000N.safetensors ... then dir/model.safetensors.index.json
 * ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}), written last, and a stale
 * dir/model.safetensors is removed. Every file is written atomically; metadata goes into every shard.
 * n_shards_out (optional) receives the number of shards. 0, or -1 with err. */
int st_write_sharded(const char *dir, const struct st_write_tensor *tensors, size_t n, const struct st_kv *metadata,
                     size_t n_meta, uint64_t max_shard_bytes, int *n_shards_out, char *err, size_t errlen);

#endif
