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
void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, float alpha = 1.0f,
          float beta = 0.0f);

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

// --- model ops ------------------------------------------------------------------
// Forward/backward pairs. Rule for every backward: gradients of *parameters*
// accumulate (+=, so micro-batches add up); gradients of *inputs* are written
// (=). Activations may be F32 or BF16 (stored BF16, computed F32, rounded once
// per output element); saved statistics (rstd, lse) are always F32.
// Shapes: B batch, T time, D model width, H query heads, KV key/value heads,
// hd head dim, V vocabulary, F MLP width, N = B*T rows.

/// out[n, :] = weight[tokens[n], :]. tokens I32 [N] (any shape with N elements),
/// weight [V, D], out [N, D]. A token outside [0, V) is an error naming it.
void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out);
/// dweight[tokens[n], :] += dout[n, :].
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight);

/// out = x / sqrt(mean(x^2) + eps) * weight, over the last dim D. x, out [N, D];
/// weight [D]; rstd F32 [N] receives 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd);
/// dx = d/dx; dweight += d/dweight. rstd from the forward.
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight);

/// Residual add fused with the RMSNorm after it (one pass over the rows):
/// h = x + delta, rounded to h's dtype, then out = rmsnorm(h) exactly as
/// rmsnorm_forward(h, ...) computes it from the rounded h, so the result is
/// bit-identical to add(x, delta, h) followed by rmsnorm_forward. x, delta, h,
/// out [N, D] (any mix of F32/BF16); h may alias x or delta exactly.
void add_rmsnorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight, float eps, const Tensor& h,
                         const Tensor& out, const Tensor& rstd);
/// rmsnorm_backward with a residual gradient added in the same pass:
/// dx = round(round(d/dx) + residual), each rounding to dx's dtype, which is
/// bit-identical to rmsnorm_backward followed by add(residual, dx, dx).
/// residual [N, D] may alias dx exactly; dweight += d/dweight.
void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                          const Tensor& residual, const Tensor& dx, const Tensor& dweight);

/// Rotary tables in the Hugging Face LLaMA layout: cos, sin F32 [T, hd] with
/// inv_freq[j] = theta^(-2j/hd) and angle(t, j) = t * inv_freq[j mod hd/2]
/// (the half-dim frequencies repeated twice, as `torch.cat((freqs, freqs))`).
void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin);
/// In place on x [B, T, heads, hd]: x = x * cos + rotate_half(x) * sin, with
/// rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]) and position t = index in T.
void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin);
/// In place on dx [B, T, heads, hd]: the transpose of rope_forward (rotation by -angle).
void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin);

/// Causal scaled-dot-product attention with grouped-query heads:
/// out[b, t, h] = sum_{s<=p} softmax_s(q[b,t,h] . k[b,s,g] * scale) v[b,s,g],
/// g = h / (H / KV), p = Tk - Tq + t the position of query t. q, out
/// [B, Tq, H, hd]; k, v [B, Tk, KV, hd] with Tk >= Tq; KV divides H;
/// scale = 1/sqrt(hd). Training has Tq == Tk; Tq < Tk is a KV cache: the
/// queries are the last Tq positions of the keys (keys are visited in the same
/// tiles as in a full pass, so a query's result differs from its row of the
/// full pass only by the rounding of products over fewer query rows).
/// lse F32 [B, H, Tq] receives each row's log-sum-exp of the scaled scores,
/// so backward recomputes the probabilities exactly.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
/// dq, dk, dv written (=); same shapes as q, k, v; Tq == Tk only.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv);

/// out = silu(gate) * up, silu(x) = x * sigmoid(x). gate, up, out [N, F].
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
/// dgate, dup written (=).
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);

/// out = max(x, 0).
void relu_forward(const Tensor& x, const Tensor& out);
/// dx = dout where x > 0, else 0 (dx may alias dout).
void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx);

/// Result of a loss forward: `sum` of per-element losses and the `count` of
/// elements that took part, so the mean over any number of micro-batches and
/// ranks is (sum of sums) / (sum of counts).
struct LossSum {
  double sum = 0;
  int64_t count = 0;
};

/// Cross-entropy of logits [N, V] against targets I32 [N]; targets equal to
/// `ignore_index` take no part. Fused with its backward: dlogits [N, V] is
/// written with grad_scale * (softmax(logits) - onehot(target)) per counted row
/// and 0 for ignored rows. Pass grad_scale = 1 / (total count) for a mean.
/// dlogits may alias logits (the logits are consumed).
LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                      const Tensor& dlogits);

/// Squared error of pred against target (same shape): sum = sum((pred-target)^2),
/// count = numel. dpred = grad_scale * 2 * (pred - target).
LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred);

}  // namespace st::ops
