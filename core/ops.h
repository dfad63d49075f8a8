#pragma once
// The op set. Every op dispatches on the device of its tensors (all operands
// on one device); the CPU backend lives in core/cpu/, the CUDA one in
// core/cuda/. BF16 operands are stored as BF16 and computed in F32, so CPU
// and GPU round the same way. Outputs are written through `const Tensor&`
// (a handle) and must already have the right shape and dtype.
#include "core/tensor.h"

namespace st::ops {

enum class Transpose : uint8_t { No, Yes };

/// c = alpha * op(a) @ op(b) + beta * c, with op(a): [M, K], op(b): [K, N],
/// c: [M, N]. a, b, c may each be F32 or BF16; accumulation is F32 and c is
/// rounded once. Leading dimensions of a and b are flattened (a [B, T, K]
/// is [B*T, K]). beta == 0 ignores c's old contents (even NaN).
void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

/// out = a + b (same numel; any mix of F32/BF16; out may alias a or b).
void add(const Tensor& a, const Tensor& b, const Tensor& out);
/// x *= s, in place.
void scale(const Tensor& x, float s);
/// y += alpha * x (F32/BF16; y may be BF16, rounded once per element).
void axpy(float alpha, const Tensor& x, const Tensor& y);
/// dst = src converted to dst's dtype (F32 <-> BF16, I32 -> F32/BF16); same numel.
void cast(const Tensor& src, const Tensor& dst);
/// A new tensor holding `src` converted to `dtype`.
Tensor cast(const Tensor& src, DType dtype);
/// Sum of x*x over all elements, accumulated in double.
double sum_of_squares(const Tensor& x);
/// Fills x with `value` rounded to its dtype.
void fill(const Tensor& x, double value);

}  // namespace st::ops
