/* Helper threads for the CPU kernels that split one product into parts (the BF16 GEMM, the few-row fp32 product):
 * part 0 runs on the calling thread, part i > 0 on helper i - 1, made on first use and kept. */
#ifndef GRPO_KERNELS_CPU_POOL_H
#define GRPO_KERNELS_CPU_POOL_H

enum { CPU_POOL_MAX_PARTS = 64 };

typedef void (*cpu_part_fn)(void *arg, int part, int parts);

/* Runs fn(arg, i, parts) for i in [0, parts) and returns when all are done. parts is capped at CPU_POOL_MAX_PARTS.
 * Should another thread be running parts at the time (or a helper fail to start), the parts run one after the
 * other on the calling thread: the results are the same, only slower. */
void cpu_run_parts(int parts, cpu_part_fn fn, void *arg);

/* How many parts a product should have: the process's thread setting (cpu_set_threads; before that OpenBLAS's own
 * thread count, from OPENBLAS_NUM_THREADS or the cores), at most CPU_POOL_MAX_PARTS. */
int cpu_pool_threads(void);

#endif
