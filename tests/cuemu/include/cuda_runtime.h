/* cuemu: the CUDA runtime API that this project uses, emulated on the CPU (tests/cuemu/README.md).
 *
 * Device memory is host memory that the emulator allocates and tracks (so that it can say which pointers are
 * device pointers, refuse copies whose direction is wrong and fault on overruns); streams run their work at once,
 * in order, but for NCCL's operations, pending until every rank has joined (tests/cuemu/NCCL.md); kernels run block by
 * block, every thread a fiber, with __syncthreads and the warp operations as real barriers (tests/cuemu/runtime.cc).
 * Only what this project calls is here: a call this header lacks fails the emulated build, it does not silently do
 * nothing. */
#ifndef CUEMU_CUDA_RUNTIME_H
#define CUEMU_CUDA_RUNTIME_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define CUEMU 1
#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct cuemu_stream *cudaStream_t;
typedef struct cuemu_event *cudaEvent_t;
typedef struct cuemu_graph *cudaGraph_t;
typedef struct cuemu_graph_exec *cudaGraphExec_t;

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};

enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlockOptin;
};

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

/* Stream capture and graphs: a capturing stream records its work (kernels, copies, sets, cuBLAS calls) instead of
 * running it; cudaGraphLaunch runs the recorded work in order, counted as one launch (cuemu_work_count). Calls that
 * cannot be captured fail as CUDA's do and invalidate the capture: cudaMalloc, cudaFree, cudaMallocHost,
 * cudaFreeHost and cudaDeviceSynchronize in the capturing thread (any thread under cudaStreamCaptureModeGlobal),
 * cudaStreamSynchronize and cudaStreamQuery on the capturing stream (cudaErrorStreamCaptureUnsupported), and work
 * on the legacy default stream (a synchronous cudaMemcpy or cudaMemset) while a blocking stream captures
 * (cudaErrorStreamCaptureImplicit). Events and NCCL inside a capture are not emulated: refused the same way. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* emulator-only: print "cuemu: " and the message, a line on stderr (every finding of the emulator) */
void cuemu_vsay(const char *fmt, va_list ap);
void cuemu_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* emulator-only: device work submitted so far in this process (kernel launches, copies, memsets and cuBLAS calls,
 * each counted once, as a GPU's launches are; a graph's launch once, its recorded work not again, and work
 * recorded by a capture not at all), and the count's increment for the emulated libraries */
unsigned long long cuemu_work_count(void);
void cuemu_count_work(void);

/* emulator-only: is p inside memory from cudaMalloc (1), cudaMallocHost (2), or neither (0) */
int cuemu_pointer_kind(const void *p);
/* emulator-only: device memory is readable and writable only between these (nested; any thread): the emulated
 * device's own work (kernels, copies, cuBLAS, NCCL) brackets itself with them, so that host code reading or
 * writing device memory faults, as it does with a GPU */
void cuemu_device_enter(void);
void cuemu_device_leave(void);

#ifdef __cplusplus
}
#include "cuemu_device.h"
#endif

#endif
