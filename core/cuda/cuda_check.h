#pragma once
// CUDA_CHECK wraps every CUDA runtime call in core/cuda/: a failing call
// throws st::Error naming the call and CUDA's own text for the code. Only for
// sources built with ST_WITH_CUDA (it needs the CUDA runtime headers).
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace st::cuda::detail {

/// Throws st::Error for a failed CUDA call. The runtime's last-error slot is
/// cleared first: a non-sticky error already reported here must not resurface
/// later through cudaGetLastError() as if a kernel launch had failed.
[[noreturn]] inline void throw_cuda_error(cudaError_t rc, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  ::st::detail::throw_error(
      file, line, ::st::format("CUDA call failed: {}: {} ({})", call, cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

}  // namespace st::cuda::detail

/// Wraps a CUDA runtime call; anything but cudaSuccess throws st::Error.
#define CUDA_CHECK(call)                                                            \
  do {                                                                              \
    cudaError_t st_cuda_rc_ = (call);                                               \
    if (st_cuda_rc_ != cudaSuccess) [[unlikely]]                                    \
      ::st::cuda::detail::throw_cuda_error(st_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (0)
