#pragma once
// CPU backend of core/ops.h (oneDNN or Eigen for GEMM, OpenMP loops elsewhere).
// Arguments are already checked by the dispatcher in core/ops.cpp.
#include <string>

#include "core/ops.h"

namespace st::cpu {

/// The GEMM of ops::gemm: oneDNN when built with it (ST_WITH_DNNL), else Eigen.
void gemm(const Tensor& a, ops::Transpose ta, const Tensor& b, ops::Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta);
/// Bytes of the calling thread's scratch that gemm() takes for these shapes and
/// dtypes (F32 copies of BF16 operands where they are widened; 0 when oneDNN
/// multiplies them as stored). The scratch grows to the largest GEMM a thread
/// ran and is kept (for the memory plan).
int64_t gemm_scratch_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c);
/// The same contract through Eigen in F32 (BF16 operands widened first): the
/// portable path, and the reference the tests hold the fast path to.
void gemm_eigen(const Tensor& a, ops::Transpose ta, const Tensor& b, ops::Transpose tb, const Tensor& c, int64_t m,
                int64_t n, int64_t k, float alpha, float beta);

/// BF16 <-> F32 conversion of n elements (widening is exact; narrowing rounds
/// to nearest even, as f32_to_bf16_bits).
void widen_bf16(const BFloat16* src, float* dst, int64_t n);
void narrow_to_bf16(const float* src, BFloat16* dst, int64_t n);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void cast(const Tensor& src, const Tensor& dst);
double sum_of_squares(const Tensor& x);
void fill(const Tensor& x, double value);

}  // namespace st::cpu
