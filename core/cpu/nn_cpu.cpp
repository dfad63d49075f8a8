// CPU backend of the model ops. Rules for every kernel in this file:
//  - BF16 elements are widened to F32, the arithmetic is F32, and each stored
//    element is rounded once; every float operand may independently be F32 or
//    BF16. Statistics (rstd, lse) are F32.
//  - Parameter gradients accumulate (+=: summed in F32 over the call, then
//    added to the stored value and rounded once); input gradients are written (=).
//  - One thread and a fixed summation order, so running a forward again on the
//    same inputs (activation recomputation) gives bit-identical results.
//  - Outputs that the dispatcher allows to alias an input exactly are safe:
//    each element (or row) is read completely before it is written.
#include "core/cpu/nn_cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include <Eigen/Core>

namespace st::cpu {

namespace {

// ---------------------------------------------------------------- scratch

constexpr int kScratchSlots = 10;

// Grow-only F32 scratch owned by the calling thread, one slot per buffer a
// kernel needs at the same time. A training step repeats the same shapes, so
// after the first step these kernels allocate nothing. Kernels never call
// each other, so two kernels never hold the same slot at once.
//
// Every buffer starts on a 64-byte boundary: Eigen's vectorised loops peel
// elements up to an aligned address, so the rounding of a small product can
// depend on where its operands live. With one alignment for all buffers, the
// forward and the backward (or a recomputed forward) round identically.
float* scratch(int slot, int64_t n) {
  constexpr int64_t kAlignFloats = 16;  // 64 bytes
  struct Buffer {
    std::unique_ptr<float[]> data;
    float* aligned = nullptr;
    int64_t size = 0;
  };
  thread_local std::array<Buffer, kScratchSlots> buffers;
  Buffer& buffer = buffers[static_cast<size_t>(slot)];
  if (buffer.size < n) {
    buffer.data.reset();  // release the old block before taking the larger one
    buffer.data = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n + kAlignFloats));
    void* p = buffer.data.get();
    size_t space = static_cast<size_t>(n + kAlignFloats) * sizeof(float);
    buffer.aligned = static_cast<float*>(std::align(64, static_cast<size_t>(n) * sizeof(float), p, space));
    buffer.size = n;
  }
  return buffer.aligned;
}

// ---------------------------------------------------------------- element access

// n elements of t from flat element `offset` as F32: t's own memory when t is
// F32 (no copy), else `buf` holding the widened values.
const float* load(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::F32) return t.data<float>() + offset;
  const BFloat16* p = t.data<BFloat16>() + offset;
  for (int64_t i = 0; i < n; ++i) buf[i] = bf16_bits_to_f32(p[i].bits);
  return buf;
}

// Copies n elements of t from `offset` into dst as F32.
void gather(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::F32) {
    std::memcpy(dst, t.data<float>() + offset, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const BFloat16* p = t.data<BFloat16>() + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(p[i].bits);
}

// Where to compute output elements of t from `offset`: t's own memory when t
// is F32, else `buf`; commit() then stores them.
float* output(const Tensor& t, int64_t offset, float* buf) {
  return t.dtype() == DType::F32 ? t.data<float>() + offset : buf;
}

// Stores n F32 values into t from `offset`, rounding once for BF16.
void commit(const float* v, const Tensor& t, int64_t offset, int64_t n) {
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>() + offset;
    if (p != v) std::memcpy(p, v, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  BFloat16* p = t.data<BFloat16>() + offset;
  for (int64_t i = 0; i < n; ++i) p[i].bits = f32_to_bf16_bits(v[i]);
}

// t[offset + i] += v[i] in F32, rounded once to t's dtype.
void accumulate(const float* v, const Tensor& t, int64_t offset, int64_t n) {
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>() + offset;
    for (int64_t i = 0; i < n; ++i) p[i] += v[i];
    return;
  }
  BFloat16* p = t.data<BFloat16>() + offset;
  for (int64_t i = 0; i < n; ++i) p[i].bits = f32_to_bf16_bits(bf16_bits_to_f32(p[i].bits) + v[i]);
}

// ---------------------------------------------------------------- reductions

constexpr int kLanes = 8;

// Sum of term(i) for i < n in a fixed order: kLanes interleaved partial sums
// (independent adds vectorise; the compiler may not reassociate one running
// sum itself), then the tail, then the lanes left to right.
template <class Term>
float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  }
  float total = 0.0f;
  for (; i < n; ++i) total += term(i);
  for (float partial : acc) total += partial;
  return total;
}

// Elementwise kernels work through their operands in chunks of this many
// elements, so BF16 operands are widened into small buffers that stay in cache.
constexpr int64_t kChunk = 2048;

using RowMajorF32 = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajorF32>;

// ---------------------------------------------------------------- embedding

void check_tokens(const char* op, const Tensor& tokens, const Tensor& weight) {
  const int32_t* tok = tokens.data<int32_t>();
  const int64_t vocab = weight.size(0);
  for (int64_t n = 0; n < tokens.numel(); ++n) {
    ST_CHECK(tok[n] >= 0 && tok[n] < vocab,
             "{}: token {} at position {} of tokens (shape {}) is outside the vocabulary [0, {}) of weight (shape {})",
             op, tok[n], n, shape_str(tokens.shape()), vocab, shape_str(weight.shape()));
  }
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out) {
  check_tokens("embedding_forward", tokens, weight);
  const int64_t n = tokens.numel();
  const int64_t d = weight.size(1);
  const int32_t* tok = tokens.data<int32_t>();
  float* row = scratch(0, d);  // (D)
  for (int64_t r = 0; r < n; ++r) commit(load(weight, tok[r] * d, d, row), out, r * d, d);
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight) {
  check_tokens("embedding_backward", tokens, dweight);
  const int64_t n = tokens.numel();
  const int64_t d = dweight.size(1);
  const int32_t* tok = tokens.data<int32_t>();

  // Positions grouped by token, in position order within a token: every
  // touched row of dweight is summed in F32 in an order fixed by the tokens
  // alone and rounded once, however often its token repeats.
  thread_local std::vector<int64_t> order;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(),
            [tok](int64_t a, int64_t b) { return tok[a] != tok[b] ? tok[a] < tok[b] : a < b; });

  float* sum = scratch(0, d);  // (D)
  float* row = scratch(1, d);  // (D)
  for (int64_t i = 0; i < n;) {
    const int32_t token = tok[order[static_cast<size_t>(i)]];
    std::fill_n(sum, d, 0.0f);
    for (; i < n && tok[order[static_cast<size_t>(i)]] == token; ++i) {
      const float* g = load(dout, order[static_cast<size_t>(i)] * d, d, row);
      for (int64_t j = 0; j < d; ++j) sum[j] += g[j];
    }
    accumulate(sum, dweight, token * d, d);
  }
}

// ---------------------------------------------------------------- RMSNorm

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd) {
  const int64_t d = weight.numel();
  const int64_t rows = x.numel() / d;
  const float* w = load(weight, 0, d, scratch(0, d));  // (D)
  float* x_buf = scratch(1, d);                        // (D)
  float* out_buf = scratch(2, d);                      // (D)
  float* rs = rstd.data<float>();                      // (N)
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = load(x, r * d, d, x_buf);
    const float mean_sq = lane_sum(d, [xr](int64_t i) { return xr[i] * xr[i]; }) * inv_d;
    const float r_std = 1.0f / std::sqrt(mean_sq + eps);
    rs[r] = r_std;
    float* o = output(out, r * d, out_buf);
    // (x * rstd) * weight, in Hugging Face's order.
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * r_std * w[i];
    commit(o, out, r * d, d);
  }
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight) {
  const int64_t d = weight.numel();
  const int64_t rows = x.numel() / d;
  const float* w = load(weight, 0, d, scratch(0, d));  // (D)
  float* dw = scratch(1, d);                           // (D) this call's dweight, summed over rows
  float* dy_buf = scratch(2, d);                       // (D)
  float* x_buf = scratch(3, d);                        // (D)
  float* dx_buf = scratch(4, d);                       // (D)
  const float* rs = rstd.data<float>();                // (N)
  const float inv_d = 1.0f / static_cast<float>(d);
  std::fill_n(dw, d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dy = load(dout, r * d, d, dy_buf);
    const float* xr = load(x, r * d, d, x_buf);
    const float r_std = rs[r];
    // y = x * r * w with r = (mean(x^2) + eps)^(-1/2), dr/dx_i = -r^3 x_i / D:
    // dx_i = r w_i dy_i - r^3 / D * x_i * sum_j(dy_j w_j x_j).
    const float dot = lane_sum(d, [dy, w, xr](int64_t i) { return dy[i] * w[i] * xr[i]; });
    for (int64_t i = 0; i < d; ++i) dw[i] += dy[i] * (xr[i] * r_std);
    const float c = r_std * r_std * r_std * dot * inv_d;
    float* g = output(dx, r * d, dx_buf);
    for (int64_t i = 0; i < d; ++i) g[i] = dy[i] * w[i] * r_std - c * xr[i];
    commit(g, dx, r * d, d);
  }
  accumulate(dw, dweight, 0, d);
}

// ---------------------------------------------------------------- RoPE

void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin) {
  const int64_t half = head_dim / 2;
  float* pc = cos.data<float>();  // (T, hd)
  float* ps = sin.data<float>();  // (T, hd)
  for (int64_t j = 0; j < half; ++j) {
    // inv_freq and the angle are formed in F32 as Hugging Face does
    // (1 / theta^(2j/hd), then t * inv_freq rounded to F32), so long positions
    // round like the reference; cos and sin of that angle are correctly rounded.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
    for (int64_t t = 0; t < seq_len; ++t) {
      const double angle = static_cast<double>(static_cast<float>(t) * inv_freq);
      const float c = static_cast<float>(std::cos(angle));
      const float s = static_cast<float>(std::sin(angle));
      pc[t * head_dim + j] = c;
      pc[t * head_dim + j + half] = c;
      ps[t * head_dim + j] = s;
      ps[t * head_dim + j + half] = s;
    }
  }
}

namespace {

enum class RopeDirection : uint8_t { Forward, Transpose };

// x [B, T, heads, hd] in place. Forward, with h = hd/2 and i < h:
//   y_i = c_i x_i - s_i x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} + s_{i+h} x_i
// Transpose:
//   y_i = c_i x_i + s_{i+h} x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} - s_i x_i
void rope_apply(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeDirection direction) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t heads = x.size(2);
  const int64_t hd = x.size(3);
  const int64_t half = hd / 2;
  const float* pc = cos.data<float>();  // (T', hd), T' >= T
  const float* ps = sin.data<float>();  // (T', hd)
  float* in_buf = scratch(0, hd);       // (hd)
  float* out_buf = scratch(1, hd);      // (hd)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* c = pc + t * hd;
      const float* s = ps + t * hd;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t offset = ((b * seq + t) * heads + h) * hd;
        const float* xr = load(x, offset, hd, in_buf);
        float* y = output(x, offset, out_buf);  // may be xr: both halves are read first
        for (int64_t i = 0; i < half; ++i) {
          const float lo = xr[i];
          const float hi = xr[i + half];
          if (direction == RopeDirection::Forward) {
            y[i] = lo * c[i] - hi * s[i];
            y[i + half] = hi * c[i + half] + lo * s[i + half];
          } else {
            y[i] = lo * c[i] + hi * s[i + half];
            y[i + half] = hi * c[i + half] - lo * s[i];
          }
        }
        commit(y, x, offset, hd);
      }
    }
  }
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  rope_apply(x, cos, sin, RopeDirection::Forward);
}

void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin) {
  rope_apply(dx, cos, sin, RopeDirection::Transpose);
}

// ---------------------------------------------------------------- attention

namespace {

struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, hd, group;
  float scale;
};

AttentionDims attention_dims(const Tensor& q, const Tensor& k) {
  AttentionDims d{};
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.hd = q.size(3);
  d.kv_heads = k.size(2);
  d.group = d.heads / d.kv_heads;
  d.scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  return d;
}

// Head `head` of batch row b of x [B, T, heads, hd] into dst (T, hd), as F32.
void gather_head(const Tensor& x, int64_t b, int64_t head, const AttentionDims& d, int64_t heads, float* dst) {
  for (int64_t t = 0; t < d.seq; ++t) gather(x, ((b * d.seq + t) * heads + head) * d.hd, d.hd, dst + t * d.hd);
}

// src (T, hd) into head `head` of batch row b of x [B, T, heads, hd].
void scatter_head(const float* src, const Tensor& x, int64_t b, int64_t head, const AttentionDims& d, int64_t heads) {
  for (int64_t t = 0; t < d.seq; ++t) commit(src + t * d.hd, x, ((b * d.seq + t) * heads + head) * d.hd, d.hd);
}

// s (T, T) holds the raw scores q_t . k_s; replaces it with the causal
// probabilities exp(scale * s - lse_t) for s <= t and 0 above the diagonal.
// Forward and backward both form P this way from the same lse, so the
// backward's P is bit-identical to the forward's.
void probabilities_from_lse(float* s, const float* lse, const AttentionDims& d) {
  for (int64_t t = 0; t < d.seq; ++t) {
    float* row = s + t * d.seq;
    for (int64_t j = 0; j <= t; ++j) row[j] = std::exp(row[j] * d.scale - lse[t]);
    std::fill(row + t + 1, row + d.seq, 0.0f);
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const AttentionDims d = attention_dims(q, k);
  const int64_t th = d.seq * d.hd;
  float* qb = scratch(0, th);             // (T, hd)
  float* kb = scratch(1, th);             // (T, hd)
  float* vb = scratch(2, th);             // (T, hd)
  float* ob = scratch(3, th);             // (T, hd)
  float* sb = scratch(4, d.seq * d.seq);  // (T, T) scores, then probabilities
  float* pl = lse.data<float>();          // (B, H, T)
  MatrixMap qm(qb, d.seq, d.hd), km(kb, d.seq, d.hd), vm(vb, d.seq, d.hd), om(ob, d.seq, d.hd);
  MatrixMap sm(sb, d.seq, d.seq);

  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      // One K/V head serves `group` consecutive query heads.
      gather_head(k, b, g, d, d.kv_heads, kb);
      gather_head(v, b, g, d, d.kv_heads, vb);
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
        gather_head(q, b, h, d, d.heads, qb);
        // The full (T, T) product; the part above the diagonal is discarded.
        sm.noalias() = qm * km.transpose();
        float* row_lse = pl + (b * d.heads + h) * d.seq;  // (T)
        for (int64_t t = 0; t < d.seq; ++t) {
          float* row = sb + t * d.seq;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= t; ++j) m = std::max(m, row[j] * d.scale);
          float sum = 0.0f;
          for (int64_t j = 0; j <= t; ++j) sum += std::exp(row[j] * d.scale - m);
          row_lse[t] = m + std::log(sum);
        }
        probabilities_from_lse(sb, row_lse, d);
        om.noalias() = sm * vm;
        scatter_head(ob, out, b, h, d, d.heads);
      }
    }
  }
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const AttentionDims d = attention_dims(q, k);
  const int64_t th = d.seq * d.hd;
  const int64_t tt = d.seq * d.seq;
  float* qb = scratch(0, th);           // (T, hd)
  float* kb = scratch(1, th);           // (T, hd)
  float* vb = scratch(2, th);           // (T, hd)
  float* ob = scratch(3, th);           // (T, hd) the forward's output, as stored
  float* dob = scratch(4, th);          // (T, hd)
  float* dqb = scratch(5, th);          // (T, hd)
  float* dkb = scratch(6, th);          // (T, hd) summed over the group's query heads
  float* dvb = scratch(7, th);          // (T, hd) summed over the group's query heads
  float* pb = scratch(8, tt);           // (T, T) probabilities
  float* dsb = scratch(9, tt);          // (T, T) dP, then scale * dS
  const float* pl = lse.data<float>();  // (B, H, T)
  MatrixMap qm(qb, d.seq, d.hd), km(kb, d.seq, d.hd), vm(vb, d.seq, d.hd), dom(dob, d.seq, d.hd);
  MatrixMap dqm(dqb, d.seq, d.hd), dkm(dkb, d.seq, d.hd), dvm(dvb, d.seq, d.hd);
  MatrixMap pm(pb, d.seq, d.seq), dsm(dsb, d.seq, d.seq);

  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      gather_head(k, b, g, d, d.kv_heads, kb);
      gather_head(v, b, g, d, d.kv_heads, vb);
      dkm.setZero();
      dvm.setZero();
      // Query heads in ascending order: a fixed summation order for dk, dv.
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
        gather_head(q, b, h, d, d.heads, qb);
        gather_head(out, b, h, d, d.heads, ob);
        gather_head(dout, b, h, d, d.heads, dob);
        pm.noalias() = qm * km.transpose();
        probabilities_from_lse(pb, pl + (b * d.heads + h) * d.seq, d);
        dsm.noalias() = dom * vm.transpose();  // dP
        // dS = P o (dP - rowsum(dO o O)); the softmax scale is folded in here
        // so that dq and dk need no separate pass.
        for (int64_t t = 0; t < d.seq; ++t) {
          const float* o_row = ob + t * d.hd;
          const float* do_row = dob + t * d.hd;
          const float delta = lane_sum(d.hd, [o_row, do_row](int64_t i) { return do_row[i] * o_row[i]; });
          const float* p_row = pb + t * d.seq;
          float* ds_row = dsb + t * d.seq;
          for (int64_t j = 0; j <= t; ++j) ds_row[j] = d.scale * p_row[j] * (ds_row[j] - delta);
          std::fill(ds_row + t + 1, ds_row + d.seq, 0.0f);
        }
        dqm.noalias() = dsm * km;
        dkm.noalias() += dsm.transpose() * qm;
        dvm.noalias() += pm.transpose() * dom;
        scatter_head(dqb, dq, b, h, d, d.heads);
      }
      scatter_head(dkb, dk, b, g, d, d.kv_heads);
      scatter_head(dvb, dv, b, g, d, d.kv_heads);
    }
  }
}

// ---------------------------------------------------------------- SwiGLU, ReLU

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = out.numel();
  float* g_buf = scratch(0, kChunk);
  float* u_buf = scratch(1, kChunk);
  float* o_buf = scratch(2, kChunk);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    const float* g = load(gate, off, m, g_buf);
    const float* u = load(up, off, m, u_buf);
    float* o = output(out, off, o_buf);
    for (int64_t i = 0; i < m; ++i) {
      const float gi = g[i];
      const float ui = u[i];
      o[i] = gi / (1.0f + std::exp(-gi)) * ui;  // silu as PyTorch writes it: x / (1 + e^-x)
    }
    commit(o, out, off, m);
  }
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  const int64_t n = dout.numel();
  float* dy_buf = scratch(0, kChunk);
  float* g_buf = scratch(1, kChunk);
  float* u_buf = scratch(2, kChunk);
  float* dg_buf = scratch(3, kChunk);
  float* du_buf = scratch(4, kChunk);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    const float* dy = load(dout, off, m, dy_buf);
    const float* g = load(gate, off, m, g_buf);
    const float* u = load(up, off, m, u_buf);
    float* dg = output(dgate, off, dg_buf);
    float* du = output(dup, off, du_buf);
    for (int64_t i = 0; i < m; ++i) {
      // All three inputs are read before either output is written (aliasing).
      const float dyi = dy[i];
      const float gi = g[i];
      const float ui = u[i];
      const float sig = 1.0f / (1.0f + std::exp(-gi));
      // silu'(x) = sig(x) (1 + x (1 - sig(x))).
      dg[i] = dyi * ui * sig * (1.0f + gi * (1.0f - sig));
      du[i] = dyi * (gi * sig);
    }
    commit(dg, dgate, off, m);
    commit(du, dup, off, m);
  }
}

void relu_forward(const Tensor& x, const Tensor& out) {
  const int64_t n = out.numel();
  float* x_buf = scratch(0, kChunk);
  float* o_buf = scratch(1, kChunk);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    const float* xr = load(x, off, m, x_buf);
    float* o = output(out, off, o_buf);
    // NaN passes through, as in PyTorch, so a diverging run is not hidden.
    for (int64_t i = 0; i < m; ++i) o[i] = (xr[i] > 0.0f || std::isnan(xr[i])) ? xr[i] : 0.0f;
    commit(o, out, off, m);
  }
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  const int64_t n = dx.numel();
  float* dy_buf = scratch(0, kChunk);
  float* x_buf = scratch(1, kChunk);
  float* dx_buf = scratch(2, kChunk);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    const float* dy = load(dout, off, m, dy_buf);
    const float* xr = load(x, off, m, x_buf);
    float* g = output(dx, off, dx_buf);
    for (int64_t i = 0; i < m; ++i) g[i] = xr[i] > 0.0f ? dy[i] : 0.0f;
    commit(g, dx, off, m);
  }
}

// ---------------------------------------------------------------- losses

ops::LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                           const Tensor& dlogits) {
  const int64_t vocab = logits.size(-1);
  const int64_t rows = targets.numel();
  const int32_t* tgt = targets.data<int32_t>();
  // Every target is checked before anything is written: dlogits may be the
  // logits, and a half-consumed batch is no use to anyone.
  for (int64_t r = 0; r < rows; ++r) {
    ST_CHECK(tgt[r] == ignore_index || (tgt[r] >= 0 && tgt[r] < vocab),
             "cross_entropy: target {} in row {} is outside [0, {}) (logits shape {}) and is not ignore_index {}",
             tgt[r], r, vocab, shape_str(logits.shape()), ignore_index);
  }

  float* x_buf = scratch(0, vocab);  // (V)
  float* g_buf = scratch(1, vocab);  // (V)
  ops::LossSum result;
  for (int64_t r = 0; r < rows; ++r) {
    float* g = output(dlogits, r * vocab, g_buf);
    if (tgt[r] == ignore_index) {
      std::fill_n(g, vocab, 0.0f);
      commit(g, dlogits, r * vocab, vocab);
      continue;
    }
    const float* x = load(logits, r * vocab, vocab, x_buf);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, x[i]);
    // log_softmax_i = (x_i - m) - log(sum_j exp(x_j - m)). Differences from the
    // max are exact for nearby logits and log(sum) is at most log(V), so
    // nothing here loses precision when the logits themselves are large.
    const float log_sum = std::log(lane_sum(vocab, [x, m](int64_t i) { return std::exp(x[i] - m); }));
    const float target_shifted = x[tgt[r]] - m;  // read before g (possibly x itself) is written
    result.sum += static_cast<double>(log_sum) - static_cast<double>(target_shifted);
    ++result.count;
    for (int64_t i = 0; i < vocab; ++i) g[i] = grad_scale * std::exp((x[i] - m) - log_sum);
    g[tgt[r]] = grad_scale * (std::exp(target_shifted - log_sum) - 1.0f);
    commit(g, dlogits, r * vocab, vocab);
  }
  return result;
}

ops::LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred) {
  const int64_t n = pred.numel();
  float* p_buf = scratch(0, kChunk);
  float* t_buf = scratch(1, kChunk);
  float* g_buf = scratch(2, kChunk);
  const float g_scale = 2.0f * grad_scale;
  ops::LossSum result;
  result.count = n;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    const float* p = load(pred, off, m, p_buf);
    const float* t = load(target, off, m, t_buf);
    float* g = output(dpred, off, g_buf);
    for (int64_t i = 0; i < m; ++i) {
      const float diff = p[i] - t[i];
      result.sum += static_cast<double>(diff) * static_cast<double>(diff);
      g[i] = g_scale * diff;
    }
    commit(g, dpred, off, m);
  }
  return result;
}

}  // namespace st::cpu
