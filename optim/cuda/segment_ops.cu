// CUDA optimizer kernels of optim/cuda/segment_ops_cuda.h: fused AdamW, and
// the masked sum of squares / scale that gradient clipping runs over a
// segment's ranges.
//
// Each kernel is one launch over a whole flat segment. The segment [0, n) is
// cut into chunks of kChunk elements; a block takes chunks in a grid-stride
// loop, finds the first range that reaches into its chunk by binary search in
// the [R, 3] (offset, numel, decay) table, and walks the ranges that intersect
// the chunk. Elements in no range are never read or written.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_runtime.h"
#include "core/cuda/device_util.cuh"
#include "core/cuda/stream.h"
#include "optim/cuda/segment_ops_cuda.h"

namespace st::optim::cuda {

namespace {

// core/cuda/'s device helpers (st::optim::detail is the optimizer's own).
namespace core_cuda = ::st::cuda::detail;
using core_cuda::from_f32;
using core_cuda::to_f32;
using optim::detail::AdamWScalars;
using ::st::cuda::compute_stream;
using ::st::cuda::DeviceGuard;

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8 * kThreads;
// Enough blocks to fill any current GPU; more chunks go round the grid-stride loop.
constexpr int64_t kMaxBlocks = 1024;

int blocks_for_chunks(int64_t n) { return core_cuda::grid_blocks(n, kChunk, kMaxBlocks); }

struct Range {
  int64_t begin;
  int64_t end;
  bool decay;
};

__device__ __forceinline__ Range load_range(const int32_t* table, int r) {
  const int64_t offset = table[3 * r];
  return {offset, offset + table[3 * r + 1], table[3 * r + 2] != 0};
}

// Index of the first range ending after `pos` (num_ranges when none). Ranges
// are sorted and disjoint, so their ends ascend. Every thread of a block asks
// the same question, so the loads are broadcasts.
__device__ int first_range_ending_after(const int32_t* table, int num_ranges, int64_t pos) {
  int lo = 0;
  int hi = num_ranges;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(table[3 * mid]) + table[3 * mid + 1] > pos) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Calls body(i, decay) once for every element i < n that lies in a range.
template <class Body>
__device__ __forceinline__ void for_each_in_ranges(const int32_t* table, int num_ranges, int64_t n, Body& body) {
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  for (int64_t chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
    const int64_t lo = chunk * kChunk;
    const int64_t hi = lo + kChunk < n ? lo + kChunk : n;
    for (int r = first_range_ending_after(table, num_ranges, lo); r < num_ranges; ++r) {
      const Range range = load_range(table, r);
      if (range.begin >= hi) break;
      const int64_t begin = range.begin > lo ? range.begin : lo;
      const int64_t end = range.end < hi ? range.end : hi;
      for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) body(i, range.decay);
    }
  }
}

// optim/segment_ops.cpp's adamw_kernel, statement for statement. The explicit
// intrinsics pin every rounding: __fmaf_rn where the CPU calls std::fma, and
// separately rounded products, sums, quotients and square roots elsewhere,
// which nvcc may neither contract nor approximate.
struct AdamWBody {
  float* p;
  const float* g;
  float* m;
  float* v;
  AdamWScalars s;

  __device__ __forceinline__ void operator()(int64_t i, bool decay) const {
    const float gi = g[i];
    const float decayed = __fmul_rn(p[i], decay ? s.decay : 1.0f);
    const float m_scaled = __fmul_rn(s.beta1, m[i]);
    const float mi = __fmaf_rn(gi, s.one_minus_beta1, m_scaled);
    const float v_scaled = __fmul_rn(s.beta2, v[i]);
    const float g_scaled = __fmul_rn(s.one_minus_beta2, gi);
    const float vi = __fmaf_rn(g_scaled, gi, v_scaled);
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
    const float update = __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = __fadd_rn(decayed, update);
  }
};

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(AdamWBody body, const int32_t* table, int num_ranges, int64_t n) {
  for_each_in_ranges(table, num_ranges, n, body);
}

template <class T>
struct ScaleBody {
  T* x;
  float s;
  __device__ __forceinline__ void operator()(int64_t i, bool /*decay*/) const {
    x[i] = from_f32<T>(__fmul_rn(to_f32(x[i]), s));
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    masked_scale_kernel(ScaleBody<T> body, const int32_t* table, int num_ranges, int64_t n) {
  for_each_in_ranges(table, num_ranges, n, body);
}

template <class T>
struct SquareSumBody {
  const T* x;
  double acc = 0.0;
  __device__ __forceinline__ void operator()(int64_t i, bool /*decay*/) {
    // An F32 square is exact in double (48 significant bits).
    const double v = to_f32(x[i]);
    acc += v * v;
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    masked_sum_of_squares_kernel(const T* x, const int32_t* table, int num_ranges, int64_t n, double* partial) {
  SquareSumBody<T> body{x};
  for_each_in_ranges(table, num_ranges, n, body);
  const double total = core_cuda::block_sum_to_thread0<kThreads>(body.acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// --- host side ------------------------------------------------------------------------

// The dispatcher (optim/segment_ops.cpp) checks only what validate_segment
// does, and the tests call these directly, so the operand checks that cost
// no device round trip live here. The table's contents (sorted, disjoint, in
// bounds) are the caller's promise: reading them would synchronise every step.
void check_operand(const char* op, const char* name, const Tensor& t, const Tensor& like) {
  ST_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
  ST_CHECK(t.device().is_cuda(), "{}: {} must be on a GPU, got {}", op, name, t.str());
  ST_CHECK(t.device() == like.device(), "{}: {} ({}) is not on the device of {}", op, name, t.str(), like.str());
  ST_CHECK(t.numel() == like.numel(), "{}: {} ({}) has {} elements, {} has {}", op, name, t.str(), t.numel(),
           like.str(), like.numel());
}

int check_ranges(const char* op, const Tensor& ranges, const Tensor& x) {
  ST_CHECK(ranges.defined(), "{}: ranges is an undefined tensor", op);
  ST_CHECK(ranges.dtype() == DType::I32 && ranges.dim() == 2 && ranges.size(1) == 3,
           "{}: ranges must be an I32 [R, 3] table of (offset, numel, decay), got {}", op, ranges.str());
  ST_CHECK(ranges.device() == x.device(), "{}: ranges ({}) must be on the device of x ({})", op, ranges.str(), x.str());
  return static_cast<int>(ranges.size(0));
}

// Calls fn with x's device pointer as float* or bf16*; any other dtype throws.
template <class Fn>
void visit_float(const char* op, const Tensor& x, Fn&& fn) {
  ST_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "{}: x must be F32 or BF16, got {}", op, x.str());
  core_cuda::visit_float(x.dtype(), [&](auto type) { fn(core_cuda::device_ptr<typename decltype(type)::type>(x)); });
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const Tensor& ranges, const AdamWScalars& s) {
  check_operand("adamw_step", "param", param, param);
  check_operand("adamw_step", "grad", grad, param);
  check_operand("adamw_step", "exp_avg", exp_avg, param);
  check_operand("adamw_step", "exp_avg_sq", exp_avg_sq, param);
  const int num_ranges = check_ranges("adamw_step", ranges, param);
  const int64_t n = param.numel();
  if (n == 0 || num_ranges == 0) return;
  const int device = param.device().index;
  DeviceGuard guard(device);
  // data<float>() rejects a non-F32 operand with its dtype in the message.
  AdamWBody body{param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), s};
  adamw_kernel<<<blocks_for_chunks(n), kThreads, 0, compute_stream(device)>>>(body, ranges.data<int32_t>(), num_ranges,
                                                                              n);
  CUDA_CHECK_LAUNCH();
}

double masked_sum_of_squares(const Tensor& x, const Tensor& ranges) {
  check_operand("masked_sum_of_squares", "x", x, x);
  const int num_ranges = check_ranges("masked_sum_of_squares", ranges, x);
  const int64_t n = x.numel();
  if (n == 0 || num_ranges == 0) return 0.0;
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  const int blocks = blocks_for_chunks(n);
  return core_cuda::two_stage_sum<kThreads>(x.device(), blocks, stream, [&](double* partial) {
    visit_float("masked_sum_of_squares", x, [&](auto* px) {
      masked_sum_of_squares_kernel<<<blocks, kThreads, 0, stream>>>(px, ranges.data<int32_t>(), num_ranges, n, partial);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void masked_scale(const Tensor& x, const Tensor& ranges, float s) {
  check_operand("masked_scale", "x", x, x);
  const int num_ranges = check_ranges("masked_scale", ranges, x);
  const int64_t n = x.numel();
  if (n == 0 || num_ranges == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  visit_float("masked_scale", x, [&](auto* px) {
    using T = std::remove_pointer_t<decltype(px)>;
    masked_scale_kernel<<<blocks_for_chunks(n), kThreads, 0, stream>>>(ScaleBody<T>{px, s}, ranges.data<int32_t>(),
                                                                       num_ranges, n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace st::optim::cuda
