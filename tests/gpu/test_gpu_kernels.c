/* GPU kernels against their CPU references, and the NCCL back-end against the
 * MPI one (--nccl, under mpirun). Exit 77 (skipped) without a visible GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_cuda.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "kernels/kernels_cuda.h"
#include "worker/comm/comm.h"

static int have_gpu(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static float *to_dev(const float *h, size_t n)
{
    float *d;
    CHECK_CUDA(cudaMalloc((void **)&d, n * sizeof *d));
    CHECK_CUDA(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / (1e-3 + fabs((double)b[i])));
    return m;
}

static int test_rmsnorm(void)
{
    enum { N = 37, D = 576 };
    static float x[N * D], w[D], dy[N * D], y[N * D], r[N], dx[N * D], dw[D], gy[N * D], gdx[N * D], gdw[D];
    srand(3);
    for (int i = 0; i < N * D; i++) {
        x[i] = (float)rand() / RAND_MAX - 0.5f;
        dy[i] = (float)rand() / RAND_MAX - 0.5f;
    }
    for (int j = 0; j < D; j++)
        w[j] = 1.0f + (float)rand() / RAND_MAX;
    rmsnorm_forward(y, r, x, w, N, D, 1e-5f);
    rmsnorm_backward(dx, dw, dy, x, w, r, N, D);
    float *dX = to_dev(x, N * D), *dW = to_dev(w, D), *dDY = to_dev(dy, N * D);
    float *dY, *dR, *dDX, *dDW;
    CHECK_CUDA(cudaMalloc((void **)&dY, sizeof y));
    CHECK_CUDA(cudaMalloc((void **)&dR, sizeof r));
    CHECK_CUDA(cudaMalloc((void **)&dDX, sizeof dx));
    CHECK_CUDA(cudaMalloc((void **)&dDW, sizeof dw));
    CHECK_CUDA(cudaMemset(dDX, 0, sizeof dx));
    CHECK_CUDA(cudaMemset(dDW, 0, sizeof dw));
    CHECK_CUDA(rmsnorm_forward_cuda(dY, dR, dX, dW, N, D, 1e-5f, 0));
    CHECK_CUDA(rmsnorm_backward_cuda(dDX, dDW, dDY, dX, dW, dR, N, D, 0));
    CHECK_CUDA(cudaMemcpy(gy, dY, sizeof gy, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(gdx, dDX, sizeof gdx, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(gdw, dDW, sizeof gdw, cudaMemcpyDeviceToHost));
    double ey = max_rel(gy, y, N * D), edx = max_rel(gdx, dx, N * D), edw = max_rel(gdw, dw, D);
    printf("rmsnorm cuda vs cpu: y %.2e dx %.2e dw %.2e\n", ey, edx, edw);
    cudaFree(dX), cudaFree(dW), cudaFree(dDY), cudaFree(dY), cudaFree(dR), cudaFree(dDX), cudaFree(dDW);
    return ey < 1e-4 && edx < 1e-3 && edw < 1e-3 ? 0 : 1;
}

static int test_nccl(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    struct comm *nc = comm_nccl_from(world, comm_rank(world) % ndev);
    enum { N = 1 << 16 };
    static float h[N], want[N];
    int r = comm_rank(world), s = comm_size(world);
    for (int i = 0; i < N; i++) {
        h[i] = (float)(r + i % 13);
        want[i] = h[i];
    }
    comm_allreduce_sum(world, want, N, COMM_F32); /* the MPI back-end is the reference */
    float *d = to_dev(h, N);
    comm_allreduce_sum(nc, d, N, COMM_F32);
    CHECK_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int bad = memcmp(h, want, sizeof h) != 0;
    comm_allreduce_sum(world, &bad, 1, COMM_I32);
    if (r == 0)
        printf("nccl allreduce over %d ranks: %s\n", s, bad ? "MISMATCH" : "equal to MPI");
    cudaFree(d);
    comm_free(nc);
    comm_free(world);
    MPI_Finalize();
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (!have_gpu()) {
        printf("no CUDA device visible: skipped\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "--nccl") == 0)
        return test_nccl(argc, argv);
    return test_rmsnorm();
}
