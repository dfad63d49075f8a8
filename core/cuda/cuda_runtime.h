#pragma once
// What the rest of core/ needs from CUDA. Implemented by core/cuda/runtime.cu
// when built with ST_WITH_CUDA, and by core/cuda/no_cuda.cpp otherwise, so a
// CPU-only build links and reports "built without CUDA" at run time. This
// header needs no CUDA headers; core/cuda/stream.h has the CUDA-typed parts.
#include <cstddef>
#include <string>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/device.h"

namespace st::cuda {

/// True when this build includes the CUDA backend.
bool compiled_with_cuda();
/// Number of visible GPUs (0 when none, or when built without CUDA).
int device_count();
/// The device's name as the driver reports it ("NVIDIA H100 80GB HBM3").
std::string device_name(int index);
/// Makes GPU `index` the calling thread's current device.
void set_device(int index);
/// The caching allocator of GPU `index`; throws when no such GPU exists.
Allocator& device_allocator(int index);
/// The cache's own counters for GPU `index` (reserved, cached, device allocations).
CacheStats cache_stats(int index);
/// Returns GPU `index`'s cached, unused blocks to the driver.
void empty_cache(int index);
/// Blocks until all work issued to GPU `index`'s compute stream is done.
void synchronize(int index);
/// Copy between any two of {CPU, CUDA} memory, ordered on the compute stream.
/// Copies that involve the host return when the bytes are in place; a copy
/// between two buffers of one GPU returns once issued (later ops on that GPU
/// run after it).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
/// Zeroes device memory, ordered on the compute stream.
void zero_bytes(void* dst, Device device, size_t nbytes);

}  // namespace st::cuda
