#pragma once
// CPU backend of core/ops.h (Eigen for GEMM, plain loops elsewhere).
// Arguments are already checked by the dispatcher in core/ops.cpp.
#include "core/ops.h"

namespace st::cpu {

void gemm(const Tensor& a, ops::Transpose ta, const Tensor& b, ops::Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void cast(const Tensor& src, const Tensor& dst);
double sum_of_squares(const Tensor& x);
void fill(const Tensor& x, double value);

}  // namespace st::cpu
