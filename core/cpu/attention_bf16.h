#pragma once
// Causal attention with BF16 tile products on the CPU: ops::attention_forward
// and attention_backward (core/ops.h) for BF16 q, k, v, with every tile
// product (Q K^T, P V, dO V^T, dS K, dS^T Q, P^T dO) run by AVX512_BF16's
// vdpbf16ps on BF16 operands with F32 accumulation, as flash attention runs
// them on GPU tensor cores. Softmax, its statistics and the accumulators stay
// F32; the probabilities P and the score gradients dS are rounded to BF16
// once, where they enter a product.
//
// The F32 tile path in nn_cpu.cpp runs everything else: F32 operands, and
// CPUs without AVX512_BF16 (there P and dS stay F32). The kernels are
// compiled for AVX512_BF16 whatever the build's -march, and chosen at run
// time, so a portable build uses them where the CPU has them.
#include "core/tensor.h"

namespace st::cpu {

/// Whether this CPU executes AVX512_BF16 (checked once, at first call).
bool has_bf16_dot();

/// Whether attention on these operands takes the BF16 path: q, k and v (and
/// dout, when given) BF16, on a CPU with AVX512_BF16.
bool bf16_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* dout = nullptr);

/// The BF16 path of attention_forward / attention_backward (same arguments,
/// already checked by the dispatcher; outputs may be F32 or BF16).
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace st::cpu
