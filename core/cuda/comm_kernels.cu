// Kernels of core/cuda/comm_kernels.h: the conversions around NCCL calls.
// All are memory-bound elementwise loops: a grid-stride loop with a capped
// grid keeps one launch shape for any n (up to the 2^31+ elements of a large
// BF16 gradient bucket), and the cap still fills an H100 many times over.
#include <algorithm>

#include "core/cuda/comm_kernels.h"
#include "core/cuda/stream.h"
#include "core/dtype.h"

namespace st::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ inline int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void bf16_to_f32_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

// Division by a runtime divisor compiles to IEEE division (nvcc's default
// -prec-div=true), so each element equals the host's s[i] / divisor.
__global__ void f32_to_bf16_divided_kernel(const float* src, uint16_t* dst, int64_t n, float divisor) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float v = src[i] / divisor;
    dst[i] = f32_to_bf16_bits(v);
  }
}

__global__ void f32_divide_kernel(float* x, int64_t n, float divisor) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = x[i] / divisor;
}

__global__ void f32_to_max_keys_kernel(const float* src, uint32_t* keys, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) keys[i] = max_key_of_bits(__float_as_uint(src[i]));
}

__global__ void max_keys_to_f32_kernel(const uint32_t* keys, float* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = __uint_as_float(bits_of_max_key(keys[i]));
}

__global__ void bf16_to_max_keys_kernel(const uint16_t* src, uint32_t* keys, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    keys[i] = max_key_of_bits(static_cast<uint32_t>(src[i]) << 16);
}

// A key made from a BF16 value decodes to F32 bits whose low half is zero
// (the canonical NaN 0x7fc00000 too), so the upper half is the BF16 value.
__global__ void max_keys_to_bf16_kernel(const uint32_t* keys, uint16_t* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = static_cast<uint16_t>(bits_of_max_key(keys[i]) >> 16);
}

}  // namespace

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
  CUDA_CHECK_LAUNCH();
}

void f32_to_bf16_divided(const float* src, uint16_t* dst, int64_t n, float divisor, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_divided_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n, divisor);
  CUDA_CHECK_LAUNCH();
}

void f32_divide(float* x, int64_t n, float divisor, cudaStream_t stream) {
  if (n <= 0) return;
  f32_divide_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, divisor);
  CUDA_CHECK_LAUNCH();
}

void f32_to_max_keys(const float* src, uint32_t* keys, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_max_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, keys, n);
  CUDA_CHECK_LAUNCH();
}

void max_keys_to_f32(const uint32_t* keys, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  max_keys_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(keys, dst, n);
  CUDA_CHECK_LAUNCH();
}

void bf16_to_max_keys(const uint16_t* src, uint32_t* keys, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_max_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, keys, n);
  CUDA_CHECK_LAUNCH();
}

void max_keys_to_bf16(const uint32_t* keys, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  max_keys_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(keys, dst, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace st::cuda
