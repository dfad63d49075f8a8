#pragma once
// CUBLAS_CHECK wraps every cuBLAS and cuBLASLt call in core/cuda/: a failing
// call throws st::Error naming the call and cuBLAS's own name and text for
// the status. Both libraries return cublasStatus_t, so one macro serves both.
// Only for sources built with ST_WITH_CUDA (it needs the cuBLAS headers).
// Calls go through ST_CUDA_LIB_CALL (core/cuda/dynload.h): cuBLAS is loaded
// on first use, not linked.
#include <cublas_v2.h>

#include "core/cuda/dynload.h"
#include "core/error.h"

namespace st::cuda::detail {

/// Throws st::Error for a failed cuBLAS or cuBLASLt call.
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  ::st::detail::throw_error(
      file, line,
      ::st::format("cuBLAS call failed: {}: {} ({})", ::st::cuda::call_text(call),
                   ST_CUDA_LIB_CALL(cublasGetStatusName)(status), ST_CUDA_LIB_CALL(cublasGetStatusString)(status)));
}

}  // namespace st::cuda::detail

/// Wraps a cuBLAS / cuBLASLt call; anything but CUBLAS_STATUS_SUCCESS throws st::Error.
#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_cublas_status_ = (call);                                              \
    if (st_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                            \
      ::st::cuda::detail::throw_cublas_error(st_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
