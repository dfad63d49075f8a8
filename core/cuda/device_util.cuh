#pragma once
// Device helpers that the kernel files of core/cuda/ and optim/cuda/ share:
// BF16 <-> F32 conversion with core/dtype.h's rounding, block reductions and
// the two-stage sum with a fixed order, grid sizing and the F32/BF16 dtype
// visitor. Only for .cu sources built with ST_WITH_CUDA. Everything here is
// inline or a template, so any number of translation units may include it.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_runtime.h"
#include "core/cuda/stream.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace st::cuda::detail {

// ---------------------------------------------------------------- BF16 <-> F32

/// The kernels' BF16 element type; the same bits as st::BFloat16.
using bf16 = __nv_bfloat16;
static_assert(sizeof(bf16) == sizeof(BFloat16));

/// BF16 bits -> F32 (exact), the device twin of st::bf16_bits_to_f32.
__device__ __forceinline__ float widen_bf16(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

/// F32 -> BF16 bits, operation for operation st::f32_to_bf16_bits (core/dtype.h):
/// round to nearest even, and a NaN keeps its sign and payload, quietened.
/// __float2bfloat16_rn rounds finite values the same way but turns every NaN
/// into the canonical 0x7fff; bit-identical results with the CPU need this rule.
__device__ __forceinline__ uint16_t round_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

/// round_bf16_bits as a bf16 value.
__device__ __forceinline__ bf16 round_bf16(float f) {
  __nv_bfloat16_raw raw;
  raw.x = round_bf16_bits(f);
  return bf16(raw);
}

/// An F32 or BF16 element widened to F32 (exact).
__device__ __forceinline__ float to_f32(float v) { return v; }
// By the bits, not __bfloat162float: on sm_90 that is the cvt.f32.bf16
// instruction, which promises a NaN for a NaN but not its payload, and the
// CPU keeps every bit.
__device__ __forceinline__ float to_f32(bf16 v) { return widen_bf16(__bfloat16_as_ushort(v)); }

/// An F32 value stored as T (float, or bf16 rounded once by round_bf16).
template <class T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_bf16(v);
  }
}

/// Element i of an F32 or BF16 buffer whose dtype is known only at run time, as F32.
__device__ __forceinline__ float load_float(const void* p, DType dtype, int64_t i) {
  return dtype == DType::BF16 ? widen_bf16(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

/// Stores v at element i of an F32 or BF16 buffer (BF16 rounded once by round_bf16_bits).
__device__ __forceinline__ void store_float(void* p, DType dtype, int64_t i, float v) {
  if (dtype == DType::BF16) {
    static_cast<uint16_t*>(p)[i] = round_bf16_bits(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// ---------------------------------------------------------------- reductions

/// Mask of all 32 lanes of a warp.
constexpr unsigned kFullMask = 0xffffffffu;

/// a + b, for the reductions below.
struct Sum {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

/// fmaxf(a, b), for the reductions below.
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Butterfly (xor) reduction over a warp; every lane gets the result.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

/// Reduction over the block (blockDim.x a multiple of 32, at most 1024); every
/// thread gets the result. The tree is fixed by blockDim alone, so results are
/// reproducible. Safe to call repeatedly: the leading barrier keeps a previous
/// call's readers off the shared slots.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>((blockDim.x + 31) / 32);
  return warp_reduce(lane < warps ? partial[lane] : identity, op);
}

/// Sum over a block of exactly kBlockThreads threads (a multiple of 32); the
/// result is valid in thread 0 only. Shuffle-down within each warp, then warp 0
/// adds the warp sums: a fixed order for a fixed launch shape, so the same
/// input always gives the same bits. Call it once per kernel (no barrier
/// guards the shared slots against a second call).
template <int kBlockThreads>
__device__ double block_sum_to_thread0(double v) {
  static_assert(kBlockThreads % 32 == 0 && kBlockThreads <= 1024);
  __shared__ double warp_sums[kBlockThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    if (lane < kBlockThreads / 32) v = warp_sums[lane];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  }
  return v;
}

/// The second stage of a two-stage sum: one block of kBlockThreads adds the
/// `count` per-block partials into *total with block_sum_to_thread0's order.
template <int kBlockThreads>
__global__ void __launch_bounds__(kBlockThreads) sum_partials_kernel(const double* partial, int count, double* total) {
  double acc = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kBlockThreads) acc += partial[i];
  acc = block_sum_to_thread0<kBlockThreads>(acc);
  if (threadIdx.x == 0) *total = acc;
}

/// A sum of doubles in two fixed-order stages on `device`'s compute stream
/// `stream`: launch_partials(partial) launches `blocks` blocks, each writing
/// its sum to partial[blockIdx.x]; one block of kBlockThreads then adds them
/// (sum_partials_kernel) and the total is returned to the host. The same input
/// and `blocks` always give the same bits.
template <int kBlockThreads, class LaunchPartials>
double two_stage_sum(Device device, int blocks, cudaStream_t stream, LaunchPartials&& launch_partials) {
  // Partials and total as doubles in an F32 tensor (there is no F64 dtype): a
  // fresh allocation starts at the allocator's block alignment, far beyond 8
  // bytes, so the doubles are aligned; after the first call the cache serves it.
  Tensor scratch = Tensor::empty({2 * (blocks + 1)}, DType::F32, device);
  auto* partial = static_cast<double*>(scratch.raw_data());
  double* total = partial + blocks;
  launch_partials(partial);
  sum_partials_kernel<kBlockThreads><<<1, kBlockThreads, 0, stream>>>(partial, blocks, total);
  CUDA_CHECK_LAUNCH();
  double result = 0.0;
  // Ordered on the compute stream and waits for it, so the value is final.
  copy_bytes(&result, Device::cpu(), total, device, sizeof(double));
  return result;
}

// ---------------------------------------------------------------- launch shapes

/// Blocks for `work` items at `per_block` items a block: at least 1, at most
/// `max_blocks` (grid-stride loops cover the rest).
inline int grid_blocks(int64_t work, int64_t per_block, int64_t max_blocks) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, max_blocks));
}

// ---------------------------------------------------------------- dtype dispatch

/// Calls fn(std::type_identity<T>{}) with T = float for F32 and bf16 for BF16.
/// Dispatchers reject other dtypes first; this is the backstop.
template <class Fn>
decltype(auto) visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(std::type_identity<float>{});
    case DType::BF16: return fn(std::type_identity<bf16>{});
    case DType::I32: break;
  }
  ST_FAIL("CUDA op expected an F32 or BF16 tensor, got {}", dtype);
}

/// The tensor's device pointer as the kernels' element type T (bf16 for BF16).
template <class T>
T* device_ptr(const Tensor& t) {
  if constexpr (std::is_same_v<T, bf16>) {
    return reinterpret_cast<bf16*>(t.data<BFloat16>());
  } else {
    return t.data<T>();
  }
}

}  // namespace st::cuda::detail
