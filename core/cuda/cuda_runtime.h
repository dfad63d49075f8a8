#pragma once
// What the rest of core/ needs from CUDA. Implemented by core/cuda/runtime.cu
// when built with ST_WITH_CUDA, and by core/cuda/no_cuda.cpp otherwise, so a
// CPU-only build links and reports "built without CUDA" at run time.
#include <cstddef>

#include "core/allocator.h"
#include "core/device.h"

namespace st::cuda {

/// True when this build includes the CUDA backend.
bool compiled_with_cuda();
/// Number of visible GPUs (0 when none, or when built without CUDA).
int device_count();
/// The allocator for GPU `index`; throws when no such GPU exists.
Allocator& device_allocator(int index);
/// Synchronous copy between any two of {CPU, CUDA} memory.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
/// Synchronous memset to zero of device memory.
void zero_bytes(void* dst, Device device, size_t nbytes);

}  // namespace st::cuda
