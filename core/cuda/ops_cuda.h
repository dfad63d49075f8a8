#pragma once
// CUDA backend of core/ops.h, the twin of core/cpu/ops_cpu.h and
// core/cpu/nn_cpu.h: same arguments, same meaning, already checked by the
// dispatchers (core/ops.cpp, core/ops_nn.cpp). Every kernel runs on the
// compute stream of its tensors' GPU (core/cuda/stream.h) and returns once
// issued, except the ops that return a host value (sum_of_squares, the
// losses), which wait for it, and embedding forward/backward, which wait for
// their token range check. Implemented in core/cuda/*.cu;
// core/cuda/no_cuda_ops.cpp stands in without CUDA. The optimizer's kernels
// are optim/'s own (optim/cuda/segment_ops_cuda.h).
// BF16 storage, F32 math, one rounding per output element, as on the CPU.
#include <cstdint>

#include "core/ops.h"

namespace st::cuda {

// --- core/ops.h basic ops (core/cuda/gemm.cu, core/cuda/elementwise.cu) --------
/// cuBLASLt, F32 accumulation (no TF32), row-major operands as in ops::gemm.
void gemm(const Tensor& a, ops::Transpose ta, const Tensor& b, ops::Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void cast(const Tensor& src, const Tensor& dst);
double sum_of_squares(const Tensor& x);
void fill(const Tensor& x, double value);

// --- model ops (core/cuda/nn.cu, core/cuda/attention.cu) ------------------------
void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd);
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight);
void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin);
void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin);
void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin);
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv);
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);
void relu_forward(const Tensor& x, const Tensor& out);
void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx);
ops::LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                           const Tensor& dlogits);
ops::LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred);

}  // namespace st::cuda
