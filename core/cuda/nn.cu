// CUDA kernels for the model ops of core/ops.h (attention is in
// core/cuda/attention.cu). The CPU reference for each is core/cpu/nn_cpu.cpp,
// and the rules are the same:
//  - BF16 elements are widened to F32, the arithmetic is F32, and each stored
//    element is rounded once (round to nearest even, as core/dtype.h); every
//    float operand may independently be F32 or BF16. rstd is F32.
//  - Parameter gradients accumulate (+=: this call's sum is formed in F32 and
//    added to the stored value once); input gradients are written (=).
//  - Every reduction has an order fixed by the shapes alone (no floating-point
//    atomics), so a call repeated on the same inputs gives the same bits.
//  - An output the dispatcher lets alias an input exactly is safe: each
//    element is read, by the thread that writes it, before it is written, and
//    row reductions finish (__syncthreads) before a row is written.
//  - Token and target ranges are checked on the device before anything is
//    written, and fail with the CPU backend's message.
// Products that the CPU rounds separately are written with __fmul_rn and
// friends where it matters, so nvcc does not fuse them into FMAs and GPU
// results stay within an ulp or two of the CPU's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/cuda_runtime.h"
#include "core/cuda/device_util.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/stream.h"

namespace st::cuda {

namespace {

using detail::block_reduce;
using detail::kFullMask;
using detail::Sum;

// ---------------------------------------------------------------- element access

// A float operand read as F32 whatever its storage. The dtype is a kernel
// argument rather than a template parameter: the branch is uniform across a
// launch, and every operand's dtype may differ without 2^k instantiations.
struct In {
  const void* ptr;
  DType dtype;
  __device__ __forceinline__ float operator[](int64_t i) const { return detail::load_float(ptr, dtype, i); }
};

// A float output: F32 values stored with one rounding for BF16.
struct Out {
  void* ptr;
  DType dtype;
  __device__ __forceinline__ float get(int64_t i) const { return detail::load_float(ptr, dtype, i); }
  __device__ __forceinline__ void set(int64_t i, float v) const { detail::store_float(ptr, dtype, i, v); }
};

In in(const Tensor& t) { return {t.raw_data(), t.dtype()}; }
Out out_of(const Tensor& t) { return {t.raw_data(), t.dtype()}; }

// ---------------------------------------------------------------- launch helpers

constexpr int kThreads = 256;          // elementwise kernels and row kernels
constexpr int kCeThreads = 512;        // cross-entropy rows are vocabulary-wide
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

int blocks_for(int64_t n) { return detail::grid_blocks(n, kThreads, kMaxBlocks); }

int row_blocks(int64_t rows) { return detail::grid_blocks(rows, 1, kMaxBlocks); }

// The GPU of an op's operands made current for the call, and its compute stream.
struct OnDevice {
  DeviceGuard guard;
  cudaStream_t stream;
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(compute_stream(t.device().index)) {}
};

// ---------------------------------------------------------------- block reductions

// Sum over the block; every thread gets the result (core/cuda/device_util.cuh).
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, Sum{}, 0.0f); }

// ---------------------------------------------------------------- id range checks

// No int32 id equals this, so it stands for "no ignore_index".
constexpr int64_t kNoIgnore = INT64_MIN;
constexpr unsigned long long kNoneBad = ULLONG_MAX;

// Records in *first the smallest position whose id is outside [0, limit) and
// is not `ignore`.
__global__ void find_first_bad_id_kernel(const int32_t* ids, int64_t n, int64_t limit, int64_t ignore,
                                         unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = ids[i];
    if (v != ignore && (v < 0 || v >= limit)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

struct BadId {
  int64_t position = -1;  // -1: every id is fine
  int32_t value = 0;
};

// Finds the first bad id of `ids` on the device and waits for the answer, so
// the caller can throw before it writes anything.
BadId find_first_bad_id(const Tensor& ids, int64_t limit, int64_t ignore, cudaStream_t stream) {
  BadId bad;
  const int64_t n = ids.numel();
  if (n == 0) return bad;
  // 8 bytes for one unsigned long long (the allocator's blocks are aligned far beyond that).
  Tensor slot = Tensor::empty({2}, DType::I32, ids.device());
  auto* first = static_cast<unsigned long long*>(slot.raw_data());
  CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream));
  find_first_bad_id_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ids.data<int32_t>(), n, limit, ignore, first);
  CUDA_CHECK_LAUNCH();
  unsigned long long host_first = kNoneBad;
  CUDA_CHECK(cudaMemcpyAsync(&host_first, first, sizeof(host_first), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host_first == kNoneBad) return bad;
  bad.position = static_cast<int64_t>(host_first);
  CUDA_CHECK(
      cudaMemcpyAsync(&bad.value, ids.data<int32_t>() + bad.position, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return bad;
}

// Same text as the CPU backend's check_tokens (core/cpu/nn_cpu.cpp).
void check_tokens(const char* op, const Tensor& tokens, const Tensor& weight, cudaStream_t stream) {
  const int64_t vocab = weight.size(0);
  const BadId bad = find_first_bad_id(tokens, vocab, kNoIgnore, stream);
  ST_CHECK(bad.position < 0,
           "{}: token {} at position {} of tokens (shape {}) is outside the vocabulary [0, {}) of weight (shape {})",
           op, bad.value, bad.position, shape_str(tokens.shape()), vocab, shape_str(weight.shape()));
}

// ---------------------------------------------------------------- embedding

// One block per row of out (grid-stride over rows), threads across D.
__global__ void embedding_forward_kernel(const int32_t* tokens, In weight, Out out, int64_t rows, int64_t d) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = static_cast<int64_t>(tokens[r]) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out.set(r * d + j, weight[src + j]);
  }
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// tokens sorted (stably, so positions ascend within a token) with their
// positions. The block at the start of each run of one token sums that run's
// dout rows column by column, in position order, and adds the sum to dweight
// once: the CPU backend's order and rounding exactly, and no atomics.
__global__ void embedding_backward_kernel(const int32_t* sorted_tokens, const int32_t* positions, In dout, Out dweight,
                                          int64_t n, int64_t d) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t token = sorted_tokens[i];
    if (i > 0 && sorted_tokens[i - 1] == token) continue;  // not the start of a run
    const int64_t dst = static_cast<int64_t>(token) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float sum = 0.0f;
      for (int64_t k = i; k < n && sorted_tokens[k] == token; ++k)
        sum += dout[static_cast<int64_t>(positions[k]) * d + j];
      dweight.set(dst + j, dweight.get(dst + j) + sum);
    }
  }
}

// ---------------------------------------------------------------- RMSNorm

// One block per row (grid-stride over rows).
__global__ void rmsnorm_forward_kernel(In x, In weight, float eps, Out out, float* rstd, int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * d;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float v = x[base + i];
      acc += v * v;
    }
    // Rounded before eps is added, as on the CPU (nvcc would fuse the two into an FMA).
    const float mean_sq = __fmul_rn(block_sum(acc), inv_d);
    const float r_std = 1.0f / sqrtf(mean_sq + eps);
    if (threadIdx.x == 0) rstd[r] = r_std;
    // (x * rstd) * weight, in Hugging Face's order.
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out.set(base + i, __fmul_rn(x[base + i], r_std) * weight[i]);
  }
}

// Rows r = blockIdx.x, blockIdx.x + gridDim.x, ...: dx for each, and this
// block's share of dweight summed in F32 into its own row of `partial`
// [gridDim.x, D] (each thread owns its columns, so no atomics).
__global__ void rmsnorm_backward_kernel(In dout, In x, In weight, const float* rstd, Out dx, float* partial,
                                        int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  float* dw = partial + static_cast<int64_t>(blockIdx.x) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dw[i] = 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * d;
    const float r_std = rstd[r];
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) acc += __fmul_rn(dout[base + i], weight[i]) * x[base + i];
    // dx_i = r w_i dy_i - r^3 / D * x_i * sum_j(dy_j w_j x_j) (see the CPU backend).
    const float dot = block_sum(acc);
    const float c = r_std * r_std * r_std * dot * inv_d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      // Read both inputs before dx (which may be either of them) is written.
      const float dy = dout[base + i];
      const float xi = x[base + i];
      dw[i] += __fmul_rn(dy, __fmul_rn(xi, r_std));
      dx.set(base + i, __fsub_rn(__fmul_rn(__fmul_rn(dy, weight[i]), r_std), __fmul_rn(c, xi)));
    }
  }
}

// dweight[i] += sum over the partial rows in order: the second, deterministic stage.
__global__ void rmsnorm_dweight_kernel(const float* partial, int64_t parts, Out dweight, int64_t d) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < d;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t p = 0; p < parts; ++p) sum += partial[p * d + i];
    dweight.set(i, dweight.get(i) + sum);
  }
}

// Blocks of the first stage: a fixed number for a given row count (not the
// GPU's size), so the summation order, and so the bits, depend on shapes only.
constexpr int64_t kRmsnormPartials = 512;

// ---------------------------------------------------------------- RoPE

// One thread per (t, j < hd/2), the CPU backend's formulas: inv_freq and the
// angle in F32, cos and sin of the angle in double, rounded to F32.
__global__ void rope_tables_kernel(int64_t seq, int64_t head_dim, double theta, float* cos_t, float* sin_t) {
  const int64_t half = head_dim / 2;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < seq * half;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half;
    const int64_t j = idx % half;
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / static_cast<float>(pow(theta, static_cast<double>(exponent)));
    const double angle = static_cast<double>(__fmul_rn(static_cast<float>(t), inv_freq));
    const float c = static_cast<float>(cos(angle));
    const float s = static_cast<float>(sin(angle));
    cos_t[t * head_dim + j] = c;
    cos_t[t * head_dim + j + half] = c;
    sin_t[t * head_dim + j] = s;
    sin_t[t * head_dim + j + half] = s;
  }
}

enum class RopeDirection : uint8_t { Forward, Transpose };

// x [rows = B*T*heads, hd] in place, one thread per (row, i < hd/2): the pair
// (i, i + hd/2) is read by the thread that writes it. With h = hd/2, Forward:
//   y_i = c_i x_i - s_i x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} + s_{i+h} x_i
// Transpose:
//   y_i = c_i x_i + s_{i+h} x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} - s_i x_i
__global__ void rope_kernel(Out x, const float* cos_t, const float* sin_t, int64_t rows, int64_t seq, int64_t heads,
                            int64_t hd, RopeDirection direction) {
  const int64_t half = hd / 2;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * half;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / half;
    const int64_t i = idx % half;
    const int64_t t = (row / heads) % seq;
    const float* c = cos_t + t * hd;
    const float* s = sin_t + t * hd;
    const int64_t lo_at = row * hd + i;
    const float lo = x.get(lo_at);
    const float hi = x.get(lo_at + half);
    float y_lo = 0.0f;
    float y_hi = 0.0f;
    if (direction == RopeDirection::Forward) {
      y_lo = __fsub_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, s[i]));
      y_hi = __fadd_rn(__fmul_rn(hi, c[i + half]), __fmul_rn(lo, s[i + half]));
    } else {
      y_lo = __fadd_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, s[i + half]));
      y_hi = __fsub_rn(__fmul_rn(hi, c[i + half]), __fmul_rn(lo, s[i]));
    }
    x.set(lo_at, y_lo);
    x.set(lo_at + half, y_hi);
  }
}

void rope_apply(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeDirection direction) {
  if (x.numel() == 0) return;
  const OnDevice dev(x);
  const int64_t seq = x.size(1);
  const int64_t heads = x.size(2);
  const int64_t hd = x.size(3);
  const int64_t rows = x.size(0) * seq * heads;
  rope_kernel<<<blocks_for(rows * (hd / 2)), kThreads, 0, dev.stream>>>(out_of(x), cos.data<float>(), sin.data<float>(),
                                                                        rows, seq, heads, hd, direction);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- SwiGLU, ReLU

#define ST_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void swiglu_forward_kernel(In gate, In up, Out out, int64_t n) {
  ST_GRID_STRIDE(i, n) {
    const float g = gate[i];
    const float u = up[i];
    out.set(i, g / (1.0f + expf(-g)) * u);  // silu as PyTorch writes it: x / (1 + e^-x)
  }
}

__global__ void swiglu_backward_kernel(In dout, In gate, In up, Out dgate, Out dup, int64_t n) {
  ST_GRID_STRIDE(i, n) {
    // All three inputs are read before either output is written (aliasing).
    const float dy = dout[i];
    const float g = gate[i];
    const float u = up[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    // silu'(x) = sig(x) (1 + x (1 - sig(x))).
    dgate.set(i, __fmul_rn(__fmul_rn(__fmul_rn(dy, u), sig), __fadd_rn(1.0f, __fmul_rn(g, 1.0f - sig))));
    dup.set(i, __fmul_rn(dy, __fmul_rn(g, sig)));
  }
}

__global__ void relu_forward_kernel(In x, Out out, int64_t n) {
  ST_GRID_STRIDE(i, n) {
    const float v = x[i];
    // NaN passes through, as in PyTorch, so a diverging run is not hidden.
    out.set(i, (v > 0.0f || isnan(v)) ? v : 0.0f);
  }
}

__global__ void relu_backward_kernel(In dout, In x, Out dx, int64_t n) {
  ST_GRID_STRIDE(i, n) {
    const float dy = dout[i];
    dx.set(i, x[i] > 0.0f ? dy : 0.0f);
  }
}

// ---------------------------------------------------------------- losses

// Running (max, sum of exp(x - max)) of a stream of logits. Two -inf values
// add nothing (masked logits), NaN propagates through the sum.
struct SoftmaxAcc {
  float m = -INFINITY;
  float s = 0.0f;
};

__device__ __forceinline__ void softmax_push(SoftmaxAcc& a, float v) {
  if (v > a.m) {
    a.s = a.s * expf(a.m - v) + 1.0f;
    a.m = v;
  } else if (!(v == -INFINITY && a.m == -INFINITY)) {
    a.s += expf(v - a.m);
  }
}

// Must be commutative bit for bit: in the xor butterfly below, lane i forms
// merge(x_i, x_j) while lane j forms merge(x_j, x_i), and every thread then
// uses its own (m, s) for its share of dlogits. Left to nvcc, `p * q + r * t`
// contracts to fma(p, q, r * t) in one lane and fma(r, t, p * q) in the other,
// so lanes could end up an ulp apart; the explicit roundings forbid that.
__device__ __forceinline__ SoftmaxAcc softmax_merge(SoftmaxAcc a, SoftmaxAcc b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};
  return {m, __fadd_rn(__fmul_rn(a.s, expf(a.m - m)), __fmul_rn(b.s, expf(b.m - m)))};
}

__device__ SoftmaxAcc block_softmax_reduce(SoftmaxAcc a) {
  __shared__ float part_m[32];
  __shared__ float part_s[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    a = softmax_merge(a, {__shfl_xor_sync(kFullMask, a.m, offset), __shfl_xor_sync(kFullMask, a.s, offset)});
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  __syncthreads();
  if (lane == 0) {
    part_m[warp] = a.m;
    part_s[warp] = a.s;
  }
  __syncthreads();
  const int warps = static_cast<int>((blockDim.x + 31) / 32);
  SoftmaxAcc b = lane < warps ? SoftmaxAcc{part_m[lane], part_s[lane]} : SoftmaxAcc{};
  for (int offset = 16; offset > 0; offset >>= 1) {
    b = softmax_merge(b, {__shfl_xor_sync(kFullMask, b.m, offset), __shfl_xor_sync(kFullMask, b.s, offset)});
  }
  return b;
}

// One block per row (grid-stride over rows). Online max/sum-exp in one pass,
// then dlogits in a second; row_loss[r] gets the row's loss in double (0 for
// an ignored row). dlogits may be the logits: the target logit is read before
// the row reduction, and every other element by the thread that writes it.
__global__ void cross_entropy_kernel(In logits, const int32_t* targets, int64_t ignore_index, float grad_scale,
                                     Out dlogits, double* row_loss, int64_t rows, int64_t vocab) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * vocab;
    const int64_t target = targets[r];
    if (target == ignore_index) {
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) dlogits.set(base + i, 0.0f);
      if (threadIdx.x == 0) row_loss[r] = 0.0;
      continue;
    }
    const float x_target = logits[base + target];
    SoftmaxAcc acc;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) softmax_push(acc, logits[base + i]);
    acc = block_softmax_reduce(acc);
    const float m = acc.m;
    const float log_sum = logf(acc.s);
    const float target_shifted = x_target - m;
    if (threadIdx.x == 0) row_loss[r] = static_cast<double>(log_sum) - static_cast<double>(target_shifted);
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float g = i == target ? grad_scale * (expf(target_shifted - log_sum) - 1.0f)
                                  : grad_scale * expf((logits[base + i] - m) - log_sum);
      dlogits.set(base + i, g);
    }
  }
}

// One block: the loss sum over rows in double and the count of counted rows,
// in a fixed order.
__global__ void __launch_bounds__(1024)
    cross_entropy_total_kernel(const double* row_loss, const int32_t* targets, int64_t ignore_index, int64_t rows,
                               double* sum, long long* count) {
  double s = 0.0;
  long long c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += row_loss[r];
    c += targets[r] != ignore_index ? 1 : 0;
  }
  s = block_reduce(s, Sum{}, 0.0);
  c = block_reduce(c, Sum{}, 0LL);
  if (threadIdx.x == 0) {
    *sum = s;
    *count = c;
  }
}

// dpred = g_scale * (pred - target); partial[blockIdx.x] = this block's sum of
// squared differences in double.
__global__ void mse_kernel(In pred, In target, float g_scale, Out dpred, int64_t n, double* partial) {
  double acc = 0.0;
  ST_GRID_STRIDE(i, n) {
    const float diff = pred[i] - target[i];
    acc += static_cast<double>(diff) * static_cast<double>(diff);
    dpred.set(i, g_scale * diff);
  }
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

#undef ST_GRID_STRIDE

__global__ void __launch_bounds__(1024) sum_partials_kernel(const double* partial, int64_t n, double* sum) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_reduce(s, Sum{}, 0.0);
  if (threadIdx.x == 0) *sum = s;
}

// Blocks of the MSE kernel: fixed for a given size, for reproducible sums.
constexpr int64_t kMsePartials = 1024;
constexpr int kTotalThreads = 1024;

// Device scratch of `bytes` from the caching allocator (freed, stream-ordered, with the tensor).
Tensor scratch_bytes(const Tensor& like, int64_t bytes) {
  return Tensor::empty({(bytes + 3) / 4}, DType::I32, like.device());
}

}  // namespace

// ---------------------------------------------------------------- embedding

void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out) {
  const OnDevice dev(weight);
  check_tokens("embedding_forward", tokens, weight, dev.stream);
  const int64_t n = tokens.numel();
  const int64_t d = weight.size(1);
  if (n == 0 || d == 0) return;
  embedding_forward_kernel<<<row_blocks(n), kThreads, 0, dev.stream>>>(tokens.data<int32_t>(), in(weight), out_of(out),
                                                                       n, d);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight) {
  const OnDevice dev(dweight);
  check_tokens("embedding_backward", tokens, dweight, dev.stream);
  const int64_t n = tokens.numel();
  const int64_t d = dweight.size(1);
  if (n == 0 || d == 0) return;
  ST_CHECK(n <= INT32_MAX, "embedding_backward: tokens has shape {} ({} tokens); the CUDA kernel takes at most {}",
           shape_str(tokens.shape()), n, INT32_MAX);
  const int num_items = static_cast<int>(n);
  // Sort only the bits a valid token can have (tokens are checked above).
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) < dweight.size(0)) ++end_bit;

  Tensor positions = Tensor::empty({n}, DType::I32, dweight.device());         // (N) 0, 1, ..., N-1
  Tensor sorted_tokens = Tensor::empty({n}, DType::I32, dweight.device());     // (N)
  Tensor sorted_positions = Tensor::empty({n}, DType::I32, dweight.device());  // (N)
  iota_kernel<<<blocks_for(n), kThreads, 0, dev.stream>>>(positions.data<int32_t>(), n);
  CUDA_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens.data<int32_t>(), sorted_tokens.data<int32_t>(),
                                             positions.data<int32_t>(), sorted_positions.data<int32_t>(), num_items, 0,
                                             end_bit, dev.stream));
  // At least one byte: a null d_temp_storage would make the second call a size
  // query again, and the sort would silently not run.
  temp_bytes = std::max<size_t>(temp_bytes, 1);
  Tensor temp = scratch_bytes(dweight, static_cast<int64_t>(temp_bytes));
  // Radix sort is stable: positions stay ascending within a token.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, tokens.data<int32_t>(),
                                             sorted_tokens.data<int32_t>(), positions.data<int32_t>(),
                                             sorted_positions.data<int32_t>(), num_items, 0, end_bit, dev.stream));
  embedding_backward_kernel<<<row_blocks(n), kThreads, 0, dev.stream>>>(
      sorted_tokens.data<int32_t>(), sorted_positions.data<int32_t>(), in(dout), out_of(dweight), n, d);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- RMSNorm

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t rows = x.numel() / d;
  if (rows == 0) return;
  const OnDevice dev(x);
  rmsnorm_forward_kernel<<<row_blocks(rows), kThreads, 0, dev.stream>>>(in(x), in(weight), eps, out_of(out),
                                                                        rstd.data<float>(), rows, d);
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight) {
  const int64_t d = weight.numel();
  const int64_t rows = x.numel() / d;
  if (rows == 0) return;  // dweight += 0
  const OnDevice dev(x);
  const int64_t parts = std::min(rows, kRmsnormPartials);
  Tensor partial = Tensor::empty({parts, d}, DType::F32, x.device());  // (parts, D) per-block dweight sums
  rmsnorm_backward_kernel<<<static_cast<int>(parts), kThreads, 0, dev.stream>>>(
      in(dout), in(x), in(weight), rstd.data<float>(), out_of(dx), partial.data<float>(), rows, d);
  CUDA_CHECK_LAUNCH();
  rmsnorm_dweight_kernel<<<blocks_for(d), kThreads, 0, dev.stream>>>(partial.data<float>(), parts, out_of(dweight), d);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- RoPE

void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin) {
  if (seq_len == 0) return;
  const OnDevice dev(cos);
  rope_tables_kernel<<<blocks_for(seq_len * (head_dim / 2)), kThreads, 0, dev.stream>>>(
      seq_len, head_dim, theta, cos.data<float>(), sin.data<float>());
  CUDA_CHECK_LAUNCH();
}

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  rope_apply(x, cos, sin, RopeDirection::Forward);
}

void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin) {
  rope_apply(dx, cos, sin, RopeDirection::Transpose);
}

// ---------------------------------------------------------------- SwiGLU, ReLU

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const OnDevice dev(out);
  swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, dev.stream>>>(in(gate), in(up), out_of(out), n);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  const int64_t n = dout.numel();
  if (n == 0) return;
  const OnDevice dev(dout);
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, dev.stream>>>(in(dout), in(gate), in(up), out_of(dgate),
                                                                     out_of(dup), n);
  CUDA_CHECK_LAUNCH();
}

void relu_forward(const Tensor& x, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const OnDevice dev(out);
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, dev.stream>>>(in(x), out_of(out), n);
  CUDA_CHECK_LAUNCH();
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  const OnDevice dev(dx);
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, dev.stream>>>(in(dout), in(x), out_of(dx), n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- losses

ops::LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                           const Tensor& dlogits) {
  const int64_t vocab = logits.size(-1);
  const int64_t rows = targets.numel();
  const OnDevice dev(logits);
  // Every target is checked before anything is written: dlogits may be the
  // logits, and a half-consumed batch is no use to anyone.
  const BadId bad = find_first_bad_id(targets, vocab, ignore_index, dev.stream);
  ST_CHECK(bad.position < 0,
           "cross_entropy: target {} in row {} is outside [0, {}) (logits shape {}) and is not ignore_index {}",
           bad.value, bad.position, vocab, shape_str(logits.shape()), ignore_index);
  ops::LossSum result;
  if (rows == 0) return result;

  Tensor row_loss = scratch_bytes(logits, rows * static_cast<int64_t>(sizeof(double)));  // (N) per-row losses, double
  Tensor total = scratch_bytes(logits, 2 * 8);                                           // double sum, then int64 count
  auto* row_loss_p = static_cast<double*>(row_loss.raw_data());
  auto* sum_p = static_cast<double*>(total.raw_data());
  auto* count_p = reinterpret_cast<long long*>(sum_p + 1);
  cross_entropy_kernel<<<row_blocks(rows), kCeThreads, 0, dev.stream>>>(
      in(logits), targets.data<int32_t>(), ignore_index, grad_scale, out_of(dlogits), row_loss_p, rows, vocab);
  CUDA_CHECK_LAUNCH();
  cross_entropy_total_kernel<<<1, kTotalThreads, 0, dev.stream>>>(row_loss_p, targets.data<int32_t>(), ignore_index,
                                                                  rows, sum_p, count_p);
  CUDA_CHECK_LAUNCH();
  double host_sum = 0.0;
  long long host_count = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host_sum, sum_p, sizeof(double), cudaMemcpyDeviceToHost, dev.stream));
  CUDA_CHECK(cudaMemcpyAsync(&host_count, count_p, sizeof(long long), cudaMemcpyDeviceToHost, dev.stream));
  CUDA_CHECK(cudaStreamSynchronize(dev.stream));
  result.sum = host_sum;
  result.count = static_cast<int64_t>(host_count);
  return result;
}

ops::LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred) {
  const int64_t n = pred.numel();
  ops::LossSum result;
  result.count = n;
  if (n == 0) return result;
  const OnDevice dev(pred);
  const float g_scale = 2.0f * grad_scale;
  const int64_t parts = std::min<int64_t>(kMsePartials, (n + kThreads - 1) / kThreads);
  Tensor scratch = scratch_bytes(pred, (parts + 1) * static_cast<int64_t>(sizeof(double)));
  auto* partial = static_cast<double*>(scratch.raw_data());  // (parts), then the total
  mse_kernel<<<static_cast<int>(parts), kThreads, 0, dev.stream>>>(in(pred), in(target), g_scale, out_of(dpred), n,
                                                                   partial);
  CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kTotalThreads, 0, dev.stream>>>(partial, parts, partial + parts);
  CUDA_CHECK_LAUNCH();
  double host_sum = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&host_sum, partial + parts, sizeof(double), cudaMemcpyDeviceToHost, dev.stream));
  CUDA_CHECK(cudaStreamSynchronize(dev.stream));
  result.sum = host_sum;
  return result;
}

}  // namespace st::cuda
