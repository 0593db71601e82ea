// weave/weave.cuh: every weave device header. Kernels compiled through the kernels crate get
// this included first (kernels::source::program).
#ifndef WEAVE_WEAVE_CUH
#define WEAVE_WEAVE_CUH

#include "weave/types.cuh"
#include "weave/handles.cuh"
#include "weave/atomics.cuh"
#include "weave/status.cuh"
#include "weave/semaphore.cuh"
#include "weave/copy.cuh"
#include "weave/packet.cuh"
#include "weave/fifo.cuh"
#include "weave/memory_channel.cuh"
#include "weave/port_channel.cuh"
#include "weave/dtype.cuh"
#include "weave/fp8.cuh"
#include "weave/reduce.cuh"

#endif  // WEAVE_WEAVE_CUH
