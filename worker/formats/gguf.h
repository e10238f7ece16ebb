/* GGUF v3 reader (llama.cpp's model file): metadata key/values, tensor
 * directory, and dequantisation of a tensor to fp32.
 *
 * The file is memory-mapped read-only. Every offset and size read from the
 * file is checked against the file's length, so a truncated or corrupt file
 * gives an error naming the file (and the key or tensor), never a crash. */
#ifndef GRPO_WORKER_GGUF_H
#define GRPO_WORKER_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor types we dequantise (numbers are ggml's) */
enum gguf_tensor_type {
    GGUF_TYPE_F32 = 0,
    GGUF_TYPE_F16 = 1,
    GGUF_TYPE_Q4_0 = 2,
    GGUF_TYPE_Q4_1 = 3,
    GGUF_TYPE_Q8_0 = 8,
    GGUF_TYPE_Q6_K = 14,
    GGUF_TYPE_BF16 = 30,
};

struct gguf_file;

struct gguf_tensor_info {
    const char *name;
    int n_dims;
    uint64_t dims[4]; /* ggml order: dims[0] is the fastest-varying (row length) */
    uint32_t type;    /* enum gguf_tensor_type */
    uint64_t offset;  /* from the start of the data section */
    uint64_t n_elements;
    uint64_t n_bytes;
};

/* Open and index a GGUF file; NULL with err filled ("FILE: what") on failure. */
struct gguf_file *gguf_open(const char *path, char *err, size_t errlen);
void gguf_close(struct gguf_file *f);
/* Path given to gguf_open. */
const char *gguf_path(const struct gguf_file *f);

/* ---- metadata ---- */
/* 1 if the key exists. */
int gguf_has_key(const struct gguf_file *f, const char *key);
/* String value, or NULL if absent or not a string. */
const char *gguf_get_str(const struct gguf_file *f, const char *key);
/* Any integer (or bool) value widened to int64; 0 on success, -1 if absent or not an integer. */
int gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out);
/* Any float (or integer) value as double; 0 on success, -1 if absent or not numeric. */
int gguf_get_float(const struct gguf_file *f, const char *key, double *out);
/* Number of elements of an array value, 0 if absent or not an array. */
size_t gguf_get_arr_n(const struct gguf_file *f, const char *key);
/* Element i of a string array (NOT NUL-terminated: length in *len), or NULL. */
const char *gguf_get_arr_str(const struct gguf_file *f, const char *key, size_t i, size_t *len);
/* Element i of an integer array widened to int64; 0 or -1. */
int gguf_get_arr_int(const struct gguf_file *f, const char *key, size_t i, int64_t *out);
/* Element i of a float array; 0 or -1. */
int gguf_get_arr_float(const struct gguf_file *f, const char *key, size_t i, double *out);

/* ---- tensors ---- */
int gguf_num_tensors(const struct gguf_file *f);
const struct gguf_tensor_info *gguf_tensor(const struct gguf_file *f, int i);
/* Tensor by name, or NULL. */
const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* Dequantise a whole tensor into out (n_elements floats); 0, or -1 with err naming file and tensor. */
int gguf_tensor_to_f32(const struct gguf_file *f, const struct gguf_tensor_info *t, float *out, char *err,
                       size_t errlen);
/* Name of a tensor type ("Q4_1"), or "unknown". */
const char *gguf_type_name(uint32_t type);

#endif
