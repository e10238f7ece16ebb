/* NumPy .npy files (format version 1.0, little-endian float32, C order). */
#ifndef GRPO_COMMON_NPY_H
#define GRPO_COMMON_NPY_H

#include <stddef.h>
#include <stdint.h>

/* Write a float32 array of the given shape atomically (PATH.tmp then rename). 0, or -1 with err. */
int npy_write_f32(const char *path, const float *data, const int64_t *shape, int n_dims, char *err, size_t errlen);
/* Read a float32 (or float64, converted) array: *data malloc'd, shape up to 4 dims. 0, or -1 with err. */
int npy_read_f32(const char *path, float **data, int64_t *shape, int *n_dims, char *err, size_t errlen);

#endif
