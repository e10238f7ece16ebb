// The emulated NCCL (tests/cuemu/nccl.cc, NCCL.md) under mpirun, 3 ranks or more, each on its own emulated device
// (CUEMU_DEVICES at least the rank count): every collective against values worked on the host (reductions folded
// in rank order, bit for bit), grouped sends and receives, the asynchrony (a stream and an event stay NotReady
// while a peer has not joined the operation), a host buffer refused, set-up and an all-reduce that a peer never
// joins ended promptly by ncclCommAbort (the other ranks see ncclRemoteError), and no shared-memory object left.
#include <dirent.h>
#define OMPI_SKIP_MPICXX 1 // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "nccl.h"

namespace
{

int rank, size, failures;

void check(bool ok, const char *what)
{
    if (!ok) {
        printf("rank %d: %s  FAIL\n", rank, what);
        failures++;
    } else if (rank == 0) {
        printf("ok   %s\n", what);
    }
    fflush(stdout);
}

double now()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

ncclUniqueId shared_id()
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        abort();
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
}

// ncclCommGetAsyncError polled while it says ncclInProgress, up to `limit` s
ncclResult_t settle(ncclComm_t c, double limit)
{
    ncclResult_t a = ncclInProgress;
    for (double t0 = now(); now() - t0 < limit; usleep(1000))
        if (ncclCommGetAsyncError(c, &a) != ncclSuccess || a != ncclInProgress)
            break;
    return a;
}

template <class T> T *dev(const std::vector<T> &h)
{
    T *d = NULL;
    if (cudaMalloc((void **)&d, h.size() * sizeof(T) + 1) != cudaSuccess)
        abort();
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}

template <class T> std::vector<T> host(const T *d, size_t n)
{
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}

// rank r's i-th value of a test: not exactly representable, so that the order of a float sum shows
float fval(int r, size_t i) { return 0.1f * (float)(r + 1) + 1e-3f * (float)(i % 97) + 1e7f * (float)(r == 1); }

void collectives(ncclComm_t c, cudaStream_t s)
{
    const size_t n = 1000;
    // all-reduce, sum of float32 in rank order, in place
    std::vector<float> x(n), want(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = fval(rank, i);
        want[i] = fval(0, i);
        for (int r = 1; r < size; r++)
            want[i] = want[i] + fval(r, i);
    }
    float *d = dev(x);
    check(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, c, s) == ncclSuccess, "ncclAllReduce queued");
    check(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize after it");
    check(host(d, n) == want, "all-reduce (float32 sum, in place): the host's fold in rank order, bit for bit");
    // max of int32, sum of float64, int64 and (wrapping) uint8
    std::vector<int32_t> xi(n), wi(n);
    std::vector<double> xd(n), wd(n);
    std::vector<int64_t> xl(n), wl(n);
    std::vector<uint8_t> xb(n), wb(n);
    for (size_t i = 0; i < n; i++) {
        for (int r = 0; r < size; r++) {
            int32_t vi = (int32_t)((i * 7 + (size_t)r * 13) % 101) - 50;
            double vd = 1.0 / (double)(r + 3) + (double)i;
            int64_t vl = ((int64_t)1 << 40) * (r + 1) - (int64_t)i;
            uint8_t vb = (uint8_t)(200 + r * 30 + i);
            if (r == rank)
                xi[i] = vi, xd[i] = vd, xl[i] = vl, xb[i] = vb;
            wi[i] = r == 0 || vi > wi[i] ? vi : wi[i];
            wd[i] = r == 0 ? vd : wd[i] + vd;
            wl[i] = r == 0 ? vl : wl[i] + vl;
            wb[i] = r == 0 ? vb : (uint8_t)(wb[i] + vb);
        }
    }
    int32_t *di = dev(xi), *ri;
    double *dd = dev(xd);
    int64_t *dl = dev(xl);
    uint8_t *db = dev(xb);
    cudaMalloc((void **)&ri, n * sizeof *ri);
    ncclAllReduce(di, ri, n, ncclInt32, ncclMax, c, s);
    ncclAllReduce(dd, dd, n, ncclFloat64, ncclSum, c, s);
    ncclAllReduce(dl, dl, n, ncclInt64, ncclSum, c, s);
    ncclAllReduce(db, db, n, ncclUint8, ncclSum, c, s);
    cudaStreamSynchronize(s);
    check(host(ri, n) == wi && host(dd, n) == wd && host(dl, n) == wl && host(db, n) == wb,
          "all-reduce: int32 max, float64, int64 and uint8 (wrapping) sums");
    // all-gather, reduce-scatter, broadcast from rank 1 in place
    float *g;
    cudaMalloc((void **)&g, n * size * sizeof(float));
    ncclAllGather(dev(x), g, n, ncclFloat32, c, s);
    std::vector<float> wg;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            wg.push_back(fval(r, i));
    std::vector<float> xs(n * size), ws(n);
    for (size_t i = 0; i < n * size; i++)
        xs[i] = fval(rank, i) * (float)(i + 1);
    for (size_t i = 0; i < n; i++) {
        const size_t at = (size_t)rank * n + i;
        ws[i] = fval(0, at) * (float)(at + 1);
        for (int r = 1; r < size; r++)
            ws[i] = ws[i] + fval(r, at) * (float)(at + 1);
    }
    float *rs;
    cudaMalloc((void **)&rs, n * sizeof(float));
    ncclReduceScatter(dev(xs), rs, n, ncclFloat32, ncclSum, c, s);
    float *b = dev(x);
    ncclBroadcast(b, b, n, ncclFloat32, 1, c, s);
    cudaStreamSynchronize(s);
    std::vector<float> wbc(n);
    for (size_t i = 0; i < n; i++)
        wbc[i] = fval(1, i);
    check(host(g, n * size) == wg, "all-gather");
    check(host(rs, n) == ws, "reduce-scatter (sum in rank order)");
    check(host(b, n) == wbc, "broadcast from rank 1, in place");
    // grouped sends and receives: to the next rank 10 + rank values, from the previous 10 + prev; and to oneself
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<float> sv(10 + rank);
    for (size_t i = 0; i < sv.size(); i++)
        sv[i] = (float)(rank * 1000 + (int)i);
    float *ds = dev(sv), *dr, *dself;
    cudaMalloc((void **)&dr, (10 + prev) * sizeof(float));
    cudaMalloc((void **)&dself, 3 * sizeof(float));
    ncclGroupStart();
    ncclSend(ds, sv.size(), ncclFloat32, next, c, s);
    ncclRecv(dr, 10 + prev, ncclFloat32, prev, c, s);
    ncclSend(ds, 3, ncclFloat32, rank, c, s);
    ncclRecv(dself, 3, ncclFloat32, rank, c, s);
    ncclResult_t ge = ncclGroupEnd();
    check(ge == ncclSuccess || ge == ncclInProgress, "ncclGroupEnd of sends and receives");
    check(settle(c, 10) == ncclSuccess, "ncclCommGetAsyncError after the group: ncclSuccess");
    cudaStreamSynchronize(s);
    std::vector<float> wr(10 + prev);
    for (size_t i = 0; i < wr.size(); i++)
        wr[i] = (float)(prev * 1000 + (int)i);
    check(host(dr, wr.size()) == wr, "send and receive in a ring (counts differ per rank)");
    check(host(dself, 3) == std::vector<float>(sv.begin(), sv.begin() + 3), "a send to oneself");
    // a host buffer, and a pinned host buffer, are refused
    std::vector<float> hb(n);
    float *pinned;
    cudaMallocHost((void **)&pinned, n * sizeof(float));
    check(ncclAllReduce(hb.data(), hb.data(), n, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument &&
              ncclAllReduce(pinned, d, n, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument,
          "a host buffer is refused (ncclInvalidArgument)");
    cudaFreeHost(pinned);
    for (void *p : {(void *)d, (void *)di, (void *)ri, (void *)dd, (void *)dl, (void *)db, (void *)g, (void *)rs,
                    (void *)b, (void *)ds, (void *)dr, (void *)dself})
        cudaFree(p);
}

// Rank 0's all-reduce waits for the others (held back in a barrier): its stream and an event behind it say
// NotReady; then they join, and the event completes with no further call of rank 0's but the wait.
void asynchrony(ncclComm_t c, cudaStream_t s)
{
    std::vector<float> x(100, (float)(rank + 1));
    float *d = dev(x);
    cudaEvent_t ev;
    cudaEventCreate(&ev);
    if (rank == 0) {
        ncclAllReduce(d, d, 100, ncclFloat32, ncclSum, c, s);
        cudaEventRecord(ev, s);
        usleep(200000);
        check(cudaStreamQuery(s) == cudaErrorNotReady && cudaEventQuery(ev) == cudaErrorNotReady,
              "a pending all-reduce: cudaStreamQuery and cudaEventQuery say cudaErrorNotReady");
        check(cudaStreamQuery(NULL) == cudaSuccess, "the legacy stream does not wait for a non-blocking stream");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 0)
        ncclAllReduce(d, d, 100, ncclFloat32, ncclSum, c, s);
    MPI_Barrier(MPI_COMM_WORLD); // every rank has queued its part; rank 0's progress thread may finish it
    if (rank == 0) {
        double t0 = now();
        while (cudaEventQuery(ev) == cudaErrorNotReady && now() - t0 < 10)
            usleep(1000);
        check(cudaEventQuery(ev) == cudaSuccess, "the event completes once every rank has joined");
    }
    cudaStreamSynchronize(s);
    check(host(d, 100) == std::vector<float>(100, (float)(size * (size + 1) / 2)), "its result");
    cudaEventDestroy(ev);
    cudaFree(d);
}

// the names of this run's shared-memory objects left in /dev/shm
int leftovers(const ncclUniqueId &id)
{
    std::string key = std::string(id.internal).substr(strlen("cuemu-nccl:"));
    int n = 0;
    DIR *dir = opendir("/dev/shm");
    while (struct dirent *e = dir ? readdir(dir) : NULL)
        if (strstr(e->d_name, key.c_str())) {
            printf("rank %d: left in /dev/shm: %s\n", rank, e->d_name);
            n++;
        }
    if (dir)
        closedir(dir);
    return n;
}

} // namespace

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    if (size < 3 || ndev < size) {
        if (rank == 0)
            printf("needs 3 ranks or more and a device each (CUEMU_DEVICES): %d ranks, %d devices\n", size, ndev);
        MPI_Finalize();
        return 1;
    }
    cudaSetDevice(rank);
    ncclUniqueId a, b;
    if (rank == 0) {
        ncclGetUniqueId(&a), ncclGetUniqueId(&b);
        check(memcmp(&a, &b, sizeof a) != 0, "two unique ids differ");
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);

    // a non-blocking communicator: set-up in the background
    ncclUniqueId id = shared_id();
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&c, size, id, rank, &cfg);
    check(rc == ncclInProgress || rc == ncclSuccess, "ncclCommInitRankConfig (non-blocking)");
    check(settle(c, 30) == ncclSuccess, "its set-up completes (ncclCommGetAsyncError: ncclSuccess)");
    collectives(c, s);
    asynchrony(c, s);
    rc = ncclCommFinalize(c);
    check((rc == ncclSuccess || rc == ncclInProgress) && settle(c, 30) == ncclSuccess, "ncclCommFinalize");
    check(ncclCommDestroy(c) == ncclSuccess, "ncclCommDestroy");
    MPI_Barrier(MPI_COMM_WORLD);
    check(leftovers(id) == 0, "nothing of the communicator is left in /dev/shm");

    // a blocking one: set-up returns once every rank has joined
    ncclUniqueId id2 = shared_id();
    ncclComm_t cb = NULL;
    check(ncclCommInitRankConfig(&cb, size, id2, rank, NULL) == ncclSuccess, "ncclCommInitRankConfig (blocking)");
    std::vector<int64_t> one(5, rank == 2 ? 42 : -1);
    int64_t *d1 = dev(one);
    ncclBroadcast(d1, d1, 5, ncclInt64, 2, cb, s);
    check(cudaStreamSynchronize(s) == cudaSuccess && host(d1, 5) == std::vector<int64_t>(5, 42), "a broadcast on it");
    cudaFree(d1);
    check(ncclCommDestroy(cb) == ncclSuccess, "ncclCommDestroy (blocking communicator)");

    // an all-reduce that the last rank never joins: rank 0 gives up after 0.5 s (ncclCommAbort at once), the
    // others see ncclRemoteError, and the comm refuses later calls
    ncclUniqueId id3 = shared_id();
    ncclComm_t cx = NULL;
    ncclCommInitRankConfig(&cx, size, id3, rank, &cfg);
    check(settle(cx, 30) == ncclSuccess, "a third communicator set up");
    float *dx;
    cudaMalloc((void **)&dx, 64 * sizeof(float));
    const int last = size - 1;
    if (rank != last) {
        ncclAllReduce(dx, dx, 64, ncclFloat32, ncclSum, cx, s);
        if (rank == 0) {
            double t0 = now();
            while (now() - t0 < 0.5)
                if (cudaStreamQuery(s) != cudaErrorNotReady)
                    break;
            check(cudaStreamQuery(s) == cudaErrorNotReady, "an all-reduce a rank never joins stays NotReady");
            t0 = now();
            check(ncclCommAbort(cx) == ncclSuccess && now() - t0 < 0.5, "ncclCommAbort returns at once");
            check(cudaStreamQuery(s) == cudaSuccess, "the stream is free after the abort");
            ncclResult_t ae = ncclSuccess;
            ncclCommGetAsyncError(cx, &ae);
            check(ae != ncclSuccess && ncclAllReduce(dx, dx, 64, ncclFloat32, ncclSum, cx, s) != ncclSuccess,
                  "an aborted communicator reports an error and refuses calls");
        } else {
            ncclResult_t ae = ncclSuccess; // ncclSuccess (set up, the all-reduce pending) until rank 0 aborts
            for (double t0 = now(); now() - t0 < 10 && (ae == ncclSuccess || ae == ncclInProgress); usleep(1000))
                ncclCommGetAsyncError(cx, &ae);
            check(ae == ncclRemoteError, "a peer's abort: ncclCommGetAsyncError says ncclRemoteError");
            ncclCommAbort(cx);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == last)
        ncclCommAbort(cx);
    cudaFree(dx);

    // a set-up that the last rank never joins, aborted
    ncclUniqueId id4 = shared_id();
    if (rank != last) {
        ncclComm_t cy = NULL;
        ncclCommInitRankConfig(&cy, size, id4, rank, &cfg);
        usleep(300000);
        check(settle(cy, 0.2) == ncclInProgress, "a set-up a rank never joins stays ncclInProgress");
        double t0 = now();
        check(ncclCommAbort(cy) == ncclSuccess && now() - t0 < 0.5, "ncclCommAbort during set-up returns at once");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    check(leftovers(id3) + leftovers(id4) == 0, "nothing of the aborted communicators is left in /dev/shm");

    cudaStreamDestroy(s);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("emulated NCCL over %d ranks: %d failure(s)\n", size, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
