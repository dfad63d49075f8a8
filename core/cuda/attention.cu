// Causal grouped-query attention on the GPU (core/ops.h), the CPU backend's
// algorithm (core/cpu/nn_cpu.cpp) with cuBLAS for the products:
//  - per query head h (K/V head g = h / (H / KV)), batched over b: scores
//    S = Q K^T into an F32 [B, Tq, Tk] scratch, a causal softmax kernel that
//    writes lse and turns S into P = exp(scale * S - lse) in place, then
//    O = P V. Scratch is one head's [B, Tq, Tk], so memory stays bounded.
//    Forward takes Tq <= Tk (a KV cache's new tokens): query t sits at
//    position Tk - Tq + t. Backward has Tq == Tk.
//  - backward recomputes P from q, k and lse exactly as the forward formed it,
//    then dV += P^T dO, dP = dO V^T, dS = scale * P o (dP - rowsum(dO o O)),
//    dQ = dS K, dK += dS^T Q. dK and dV sum over the query heads of a group in
//    ascending order in F32 and are rounded once.
//  - the products follow the CPU's contract (core/cpu/attention_bf16.h): with
//    BF16 q, k, v (and dout) every product takes BF16 operands with F32
//    accumulation (CUBLAS_COMPUTE_32F on the tensor cores), and P and dS
//    enter their products as BF16, rounded once from the F32 values the
//    softmax kernels form; lse, delta and the sums of dK, dV stay F32. Any
//    other mix of dtypes runs F32 x F32 (no TF32) on widened copies. BF16
//    outputs are rounded once from F32 results, as on the CPU.
// cuBLAS is column-major: a row-major [rows, cols] matrix with row stride ld
// is, to cuBLAS, its transpose ([cols, rows], leading dimension ld). A head's
// rows of q [B, T, H, hd] are such a matrix: T rows of hd, stride H*hd.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/cublas_check.h"
#include "core/cuda/cuda_runtime.h"
#include "core/cuda/device_util.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/stream.h"

namespace st::cuda {

namespace {

using detail::block_reduce;
using detail::Max;
using detail::Sum;
using detail::warp_reduce;

// ---------------------------------------------------------------- cuBLAS handle

// One cuBLAS handle per GPU, bound to that GPU's compute stream for good.
class CublasHandle {
 public:
  explicit CublasHandle(int device) {
    DeviceGuard guard(device);
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasCreate)(&handle_));
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasSetStream)(handle_, compute_stream(device)));
  }
  ~CublasHandle() {
    // Cannot throw here; a failure only means the context is already gone.
    if (handle_ != nullptr) (void)ST_CUDA_LIB_CALL(cublasDestroy)(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Created on first use, one per GPU for the process like the compute stream.
cublasHandle_t cublas_handle(int device) {
  struct Slot {
    std::once_flag once;
    std::unique_ptr<CublasHandle> handle;
  };
  static std::vector<Slot> slots(static_cast<size_t>(device_count()));
  ST_CHECK(device >= 0 && static_cast<size_t>(device) < slots.size(),
           "cuda:{} requested, but only {} CUDA GPU(s) are visible", device, slots.size());
  Slot& slot = slots[static_cast<size_t>(device)];
  std::call_once(slot.once, [&] { slot.handle = std::make_unique<CublasHandle>(device); });
  return slot.handle->get();
}

// One operand of a strided batched product: a matrix per batch entry, F32
// or BF16.
struct Mat {
  const void* ptr;
  cudaDataType type;
  int64_t ld;      // leading dimension as cuBLAS sees it (the row-major row stride)
  int64_t stride;  // elements between batch entries
};

// cublas_api.h overloads cublasGemmStridedBatchedEx in C++ (computeType as
// cudaDataType); the library exports the C function, which takes cublasComputeType_t.
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                const void*, const void*, cudaDataType, int, long long, const void*,
                                                cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                                long long, int, cublasComputeType_t, cublasGemmAlgo_t);

// C = alpha * op(A) op(B) + beta * C for each of `batch` entries, C F32,
// A and B both F32 or both BF16, F32 accumulation; m, n, k and the
// operations in cuBLAS's column-major terms.
void gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const Mat& a, const Mat& b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  const float alpha = 1.0f;
  CUBLAS_CHECK(ST_CUDA_LIB_CALL_AS(cublasGemmStridedBatchedEx, GemmStridedBatchedEx)(
      handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a.ptr, a.type,
      static_cast<int>(a.ld), a.stride, b.ptr, b.type, static_cast<int>(b.ld), b.stride, &beta, c, CUDA_R_32F,
      static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------- F32 copies of BF16 operands

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

// Every launch below has work (attention_forward/backward return early on empty q).
int blocks_for(int64_t n) { return detail::grid_blocks(n, kThreads, kMaxBlocks); }

__global__ void widen_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = detail::widen_bf16(src[i]);
}

__global__ void round_kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = detail::round_bf16_bits(src[i]);
}

// x as F32 values: x itself when it is F32, else a widened copy.
Tensor as_f32(const Tensor& x, cudaStream_t stream) {
  if (x.dtype() == DType::F32) return x;
  Tensor f = Tensor::empty(x.shape(), DType::F32, x.device());
  widen_kernel<<<blocks_for(x.numel()), kThreads, 0, stream>>>(static_cast<const uint16_t*>(x.raw_data()),
                                                               f.data<float>(), x.numel());
  CUDA_CHECK_LAUNCH();
  return f;
}

// Where an F32 result for `out` is formed: out itself when F32, else scratch
// that store_result() rounds into out.
Tensor f32_result(const Tensor& out) {
  return out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), DType::F32, out.device());
}

void store_result(const Tensor& result, const Tensor& out, cudaStream_t stream) {
  if (out.dtype() == DType::F32) return;  // result is out
  round_kernel<<<blocks_for(out.numel()), kThreads, 0, stream>>>(result.data<float>(),
                                                                 static_cast<uint16_t*>(out.raw_data()), out.numel());
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- softmax kernels

// exp(scale * s - lse), the one formula for P in forward and backward, with
// the product rounded on its own as the CPU does (no FMA), so both passes,
// and the CPU, form the same probabilities.
__device__ __forceinline__ float prob(float s, float scale, float lse) {
  return expf(__fsub_rn(__fmul_rn(s, scale), lse));
}

// Block (t, b): row t of batch b's scores [Tq, Tk] for head `head`; query t
// sits at position pos = Tk - Tq + t and sees keys j <= pos. Writes
// lse[b, head, t] and replaces the row with the causal probabilities (0 past
// pos), also rounded to BF16 into probs16 when it is given. Each thread reads
// only the elements it writes after the reductions, so the row is turned
// over in place.
__global__ void causal_softmax_kernel(float* scores, uint16_t* probs16, float* lse, int64_t seq, int64_t kv_seq,
                                      int64_t heads, int64_t head, float scale) {
  const int64_t t = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int64_t pos = kv_seq - seq + t;
  float* row = scores + (b * seq + t) * kv_seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= pos; j += blockDim.x) m = fmaxf(m, __fmul_rn(row[j], scale));
  m = block_reduce(m, Max{}, -INFINITY);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j <= pos; j += blockDim.x) sum += expf(__fsub_rn(__fmul_rn(row[j], scale), m));
  sum = block_reduce(sum, Sum{}, 0.0f);
  const float row_lse = m + logf(sum);
  if (threadIdx.x == 0) lse[(b * heads + head) * seq + t] = row_lse;
  uint16_t* row16 = probs16 != nullptr ? probs16 + (b * seq + t) * kv_seq : nullptr;
  for (int64_t j = threadIdx.x; j < kv_seq; j += blockDim.x) {
    const float p = j <= pos ? prob(row[j], scale, row_lse) : 0.0f;
    row[j] = p;
    if (row16 != nullptr) row16[j] = detail::round_bf16_bits(p);
  }
}

// Block (t, b): the same probabilities from the saved lse, in place (and as
// BF16 into probs16 when given).
__global__ void probs_from_lse_kernel(float* scores, uint16_t* probs16, const float* lse, int64_t seq, int64_t heads,
                                      int64_t head, float scale) {
  const int64_t t = blockIdx.x;
  const int64_t b = blockIdx.y;
  float* row = scores + (b * seq + t) * seq;
  uint16_t* row16 = probs16 != nullptr ? probs16 + (b * seq + t) * seq : nullptr;
  const float row_lse = lse[(b * heads + head) * seq + t];
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    const float p = j <= t ? prob(row[j], scale, row_lse) : 0.0f;
    row[j] = p;
    if (row16 != nullptr) row16[j] = detail::round_bf16_bits(p);
  }
}

// One warp per row (b, t, h) of out/dout [B*T*H, hd]: delta = sum(dO o O),
// from the output as stored.
__global__ void delta_kernel(const void* dout, DType dout_dtype, const void* out, DType out_dtype, float* delta,
                             int64_t rows, int64_t hd) {
  const int64_t warps_per_block = blockDim.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t r = blockIdx.x * warps_per_block + threadIdx.x / 32; r < rows; r += gridDim.x * warps_per_block) {
    float acc = 0.0f;
    for (int64_t i = lane; i < hd; i += 32)
      acc += detail::load_float(dout, dout_dtype, r * hd + i) * detail::load_float(out, out_dtype, r * hd + i);
    acc = warp_reduce(acc, Sum{});
    if (lane == 0) delta[r] = acc;
  }
}

// Block (t, b): dS = scale * P o (dP - delta) on and below the diagonal, 0
// above, from dP in dscores: written over dP, or rounded to BF16 into ds16
// when it is given. delta is [B, T, H].
__global__ void dscores_kernel(const float* probs, float* dscores, uint16_t* ds16, const float* delta, int64_t seq,
                               int64_t heads, int64_t head, float scale) {
  const int64_t t = blockIdx.x;
  const int64_t b = blockIdx.y;
  const float* p = probs + (b * seq + t) * seq;
  float* ds = dscores + (b * seq + t) * seq;
  uint16_t* row16 = ds16 != nullptr ? ds16 + (b * seq + t) * seq : nullptr;
  const float d = delta[(b * seq + t) * heads + head];
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    const float value = j <= t ? __fmul_rn(scale, p[j]) * (ds[j] - d) : 0.0f;
    if (row16 != nullptr) {
      row16[j] = detail::round_bf16_bits(value);
    } else {
      ds[j] = value;
    }
  }
}

struct Dims {
  int64_t batch, seq, heads, kv_heads, hd, group;
  int64_t kv_seq;  // Tk (== seq in backward)
  float scale;
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  Dims d{};
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.hd = q.size(3);
  d.kv_heads = k.size(2);
  d.kv_seq = k.size(1);
  d.group = d.kv_heads > 0 ? d.heads / d.kv_heads : 1;
  d.scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const int64_t int_max = std::numeric_limits<int>::max();
  ST_CHECK(d.kv_seq <= int_max && d.heads * d.hd <= int_max && d.batch <= int_max && d.batch <= 65535,
           "attention: q has shape {}; the CUDA kernels take B <= 65535 and T, H * head_dim below 2^31",
           shape_str(q.shape()));
  return d;
}

// x from element `offset` as a cuBLAS operand of its own dtype.
Mat mat(const Tensor& x, int64_t offset, int64_t ld, int64_t stride) {
  return {static_cast<const char*>(x.raw_data()) + offset * static_cast<int64_t>(dtype_size(x.dtype())),
          x.dtype() == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F, ld, stride};
}

// The operands of head h (K/V head g) as cuBLAS matrices, batched over b.
struct HeadMats {
  const Dims& d;
  Mat q_head(const Tensor& q, int64_t h) const { return mat(q, h * d.hd, d.heads * d.hd, d.seq * d.heads * d.hd); }
  Mat kv_head(const Tensor& k, int64_t g) const {
    return mat(k, g * d.hd, d.kv_heads * d.hd, d.kv_seq * d.kv_heads * d.hd);
  }
  Mat square(const Tensor& s) const { return mat(s, 0, d.seq, d.seq * d.seq); }
};

// The tensors the products take: q, k, v (and dout) themselves when all are
// BF16 (the BF16 contract), else F32 values (widened copies of BF16 ones).
struct Operands {
  bool bf16;
  Tensor q, k, v, dout;
};

Operands operands(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* dout, cudaStream_t stream) {
  const bool bf16 = q.dtype() == DType::BF16 && k.dtype() == DType::BF16 && v.dtype() == DType::BF16 &&
                    (dout == nullptr || dout->dtype() == DType::BF16);
  if (bf16) return {true, q, k, v, dout != nullptr ? *dout : Tensor()};
  return {false, as_f32(q, stream), as_f32(k, stream), as_f32(v, stream),
          dout != nullptr ? as_f32(*dout, stream) : Tensor()};
}

// P or dS as its product's operand: BF16 under the BF16 contract, else F32.
Tensor product_scratch(const Operands& ops, const Shape& shape, const Tensor& f32_values) {
  return ops.bf16 ? Tensor::empty(shape, DType::BF16, f32_values.device()) : f32_values;
}

uint16_t* bf16_or_null(const Operands& ops, const Tensor& t) {
  return ops.bf16 ? static_cast<uint16_t*>(t.raw_data()) : nullptr;
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  if (q.numel() == 0) return;  // lse is empty too
  const Dims d = dims_of(q, k);
  const int device = q.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  cublasHandle_t handle = cublas_handle(device);
  const HeadMats mats{d};

  const Operands ops = operands(q, k, v, nullptr, stream);
  const Tensor of = f32_result(out);             // (B, Tq, H, hd)
  const Shape square{d.batch, d.seq, d.kv_seq};  // (B, Tq, Tk) one head
  const Tensor scores = Tensor::empty(square, DType::F32, q.device());
  const Tensor probs = product_scratch(ops, square, scores);  // P as PV's operand
  const dim3 rows(static_cast<unsigned>(d.seq), static_cast<unsigned>(d.batch));
  const Mat probs_mat = mat(probs, 0, d.kv_seq, d.seq * d.kv_seq);

  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t g = h / d.group;
    // S^T = K Q^T in cuBLAS's terms is S = Q K^T row-major: raw scores q_t . k_s.
    gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, d.kv_seq, d.seq, d.hd, mats.kv_head(ops.k, g), mats.q_head(ops.q, h), 0.0f,
         scores.data<float>(), d.kv_seq, d.seq * d.kv_seq, d.batch);
    causal_softmax_kernel<<<rows, kThreads, 0, stream>>>(scores.data<float>(), bf16_or_null(ops, probs),
                                                         lse.data<float>(), d.seq, d.kv_seq, d.heads, h, d.scale);
    CUDA_CHECK_LAUNCH();
    // O^T = V^T P^T, i.e. O = P V row-major, into head h of the output.
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, d.hd, d.seq, d.kv_seq, mats.kv_head(ops.v, g), probs_mat, 0.0f,
         of.data<float>() + h * d.hd, d.heads * d.hd, d.seq * d.heads * d.hd, d.batch);
  }
  store_result(of, out, stream);
}

namespace {

/// delta[b, t, h] = sum_i dO[b, t, h, i] * O[b, t, h, i], one warp per row: (B, T, H) F32.
Tensor row_deltas(const Tensor& dout, const Tensor& out, const Dims& d, cudaStream_t stream) {
  const Tensor delta = Tensor::empty({d.batch, d.seq, d.heads}, DType::F32, out.device());
  const int64_t delta_rows = d.batch * d.seq * d.heads;
  constexpr int64_t kWarpsPerBlock = kThreads / 32;
  delta_kernel<<<detail::grid_blocks(delta_rows, kWarpsPerBlock, kMaxBlocks), kThreads, 0, stream>>>(
      dout.raw_data(), dout.dtype(), out.raw_data(), out.dtype(), delta.data<float>(), delta_rows, d.hd);
  CUDA_CHECK_LAUNCH();
  return delta;
}

void zero_async(std::initializer_list<Tensor> tensors, cudaStream_t stream) {
  for (const Tensor& t : tensors) CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), stream));
}

}  // namespace

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int device = q.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  // No query contributes (H or B or T is 0): dk and dv are written as 0.
  if (q.numel() == 0) return zero_async({dk, dv}, stream);
  const Dims d = dims_of(q, k);
  cublasHandle_t handle = cublas_handle(device);
  const HeadMats mats{d};

  const Operands ops = operands(q, k, v, &dout, stream);
  const Tensor dqf = f32_result(dq);          // (B, T, H, hd)
  const Tensor dkf = f32_result(dk);          // (B, T, KV, hd) summed over each group's query heads
  const Tensor dvf = f32_result(dv);          // (B, T, KV, hd) summed over each group's query heads
  zero_async({dkf, dvf}, stream);             // accumulated over each group's query heads
  const Shape square{d.batch, d.seq, d.seq};  // (B, T, T) one head
  const Tensor probs = Tensor::empty(square, DType::F32, q.device());    // P
  const Tensor dscores = Tensor::empty(square, DType::F32, q.device());  // dP, then dS (F32 contract)
  const Tensor probs_op = product_scratch(ops, square, probs);           // P as dV's operand
  const Tensor ds_op = product_scratch(ops, square, dscores);            // dS as dQ's and dK's operand
  const Tensor delta = row_deltas(dout, out, d, stream);                 // (B, T, H)
  const dim3 rows(static_cast<unsigned>(d.seq), static_cast<unsigned>(d.batch));
  const int64_t q_ld = d.heads * d.hd;
  const int64_t q_stride = d.seq * d.heads * d.hd;
  const int64_t kv_ld = d.kv_heads * d.hd;
  const int64_t kv_stride = d.seq * d.kv_heads * d.hd;
  const int64_t tt = d.seq * d.seq;

  // Query heads in ascending order: a fixed summation order for dk, dv.
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t g = h / d.group;
    gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, d.seq, d.seq, d.hd, mats.kv_head(ops.k, g), mats.q_head(ops.q, h), 0.0f,
         probs.data<float>(), d.seq, tt, d.batch);
    probs_from_lse_kernel<<<rows, kThreads, 0, stream>>>(probs.data<float>(), bf16_or_null(ops, probs_op),
                                                         lse.data<float>(), d.seq, d.heads, h, d.scale);
    CUDA_CHECK_LAUNCH();
    // dV^T += dO^T P, i.e. dV += P^T dO.
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.hd, d.seq, d.seq, mats.q_head(ops.dout, h), mats.square(probs_op), 1.0f,
         dvf.data<float>() + g * d.hd, kv_ld, kv_stride, d.batch);
    // dP^T = V dO^T, i.e. dP = dO V^T.
    gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, d.seq, d.seq, d.hd, mats.kv_head(ops.v, g), mats.q_head(ops.dout, h), 0.0f,
         dscores.data<float>(), d.seq, tt, d.batch);
    dscores_kernel<<<rows, kThreads, 0, stream>>>(probs.data<float>(), dscores.data<float>(), bf16_or_null(ops, ds_op),
                                                  delta.data<float>(), d.seq, d.heads, h, d.scale);
    CUDA_CHECK_LAUNCH();
    // dQ^T = K^T dS^T, i.e. dQ = dS K (the scale is already in dS).
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, d.hd, d.seq, d.seq, mats.kv_head(ops.k, g), mats.square(ds_op), 0.0f,
         dqf.data<float>() + h * d.hd, q_ld, q_stride, d.batch);
    // dK^T += Q^T dS, i.e. dK += dS^T Q.
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.hd, d.seq, d.seq, mats.q_head(ops.q, h), mats.square(ds_op), 1.0f,
         dkf.data<float>() + g * d.hd, kv_ld, kv_stride, d.batch);
  }
  store_result(dqf, dq, stream);
  store_result(dkf, dk, stream);
  store_result(dvf, dv, stream);
}

}  // namespace st::cuda
