// cuemu: NCCL is not emulated yet (tests/cuemu/README.md). Every call refuses with ncclInvalidUsage and says so;
// with one emulated device (CUEMU_DEVICES=1, the default) ranks share it, and the project sends their groups over
// MPI through host memory, as it does on one real GPU, so these are never reached.
#include <stdio.h>

#include "nccl.h"

namespace
{
ncclResult_t refuse(const char *call)
{
    fprintf(stderr, "cuemu: %s: NCCL is not emulated; run with CUEMU_DEVICES=1 so that ranks share one device\n",
            call);
    return ncclInvalidUsage;
}
} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return refuse("ncclGetUniqueId"); }
ncclResult_t ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *)
{
    return refuse("ncclCommInitRankConfig");
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *) { return refuse("ncclCommGetAsyncError"); }
ncclResult_t ncclCommFinalize(ncclComm_t) { return refuse("ncclCommFinalize"); }
ncclResult_t ncclCommDestroy(ncclComm_t) { return refuse("ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t) { return refuse("ncclCommAbort"); }
ncclResult_t ncclGroupStart(void) { return refuse("ncclGroupStart"); }
ncclResult_t ncclGroupEnd(void) { return refuse("ncclGroupEnd"); }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
{
    return refuse("ncclAllReduce");
}
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
{
    return refuse("ncclAllGather");
}
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
{
    return refuse("ncclReduceScatter");
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
{
    return refuse("ncclBroadcast");
}
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return refuse("ncclSend"); }
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return refuse("ncclRecv"); }

} // extern "C"
