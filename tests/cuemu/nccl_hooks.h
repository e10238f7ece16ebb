// cuemu: what the emulated runtime (runtime.cc) and the emulated NCCL (nccl.cc) ask of each other. Internal to the
// emulator: not in include/, so the project never sees it.
//
// An NCCL call returns at once; its work is pending on its stream until every peer has published its part
// (nccl.cc). The runtime asks before anything that orders work behind a stream (a launch, a copy, a set, a
// synchronisation, a stream waiting on an event) that the pending work it orders behind has completed, and, for
// cudaStreamQuery and cudaEventQuery, whether it has.
#ifndef CUEMU_NCCL_HOOKS_H
#define CUEMU_NCCL_HOOKS_H

#include <stdint.h>

#include "cuda_runtime.h"

// every stream (cudaDeviceSynchronize, cudaFree)
#define CUEMU_ALL_STREAMS ((cudaStream_t)(intptr_t)-1)

extern "C" {

// nccl.cc. Makes what progress it can on every pending NCCL operation, then says whether none is left that `only`
// orders behind and that was issued before `mark` (cuemu_nccl_mark; UINT64_MAX: any): `only` a stream, its own
// operations, and those of the legacy default stream (NULL) when `only` was made without cudaStreamNonBlocking;
// NULL, those of NULL and of every stream made without cudaStreamNonBlocking; CUEMU_ALL_STREAMS, all. block:
// waits (short sleeps) until none is left; past 600 s (CUEMU_NCCL_HANG_S) the process stops, naming the rank
// waited for. Costs one atomic load when no NCCL operation is pending.
bool cuemu_nccl_progress(bool block, cudaStream_t only, uint64_t mark);
// the number of NCCL operations issued so far (what an event recorded now orders behind)
uint64_t cuemu_nccl_mark(void);

// runtime.cc: the flags a stream was made with (0 for NULL)
unsigned cuemu_stream_flags(cudaStream_t stream);
// runtime.cc: whether stream captures (NULL: whether a blocking stream of the current device does), so that NCCL
// work there is refused: the emulator does not record collectives into a graph
int cuemu_stream_captures(cudaStream_t stream);
}

#endif
