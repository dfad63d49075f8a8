// CPU backend of the model ops. Rules for every kernel in this file:
//  - BF16 elements are widened to F32, the arithmetic is F32, and each stored
//    element is rounded once; every float operand may independently be F32 or
//    BF16. Statistics (rstd, lse) are F32.
//  - Parameter gradients accumulate (+=: summed in F32 over the call, then
//    added to the stored value and rounded once); input gradients are written (=).
//  - Work is split by parallel_for into blocks of rows (or chunks) whose
//    bounds depend on the shapes only. Each output element is computed by one
//    thread, and sums across blocks (dweight of RMSNorm and embedding, loss
//    sums) add per-block partials in block order, so every result is the same
//    for any thread count, and a forward run again on the same inputs
//    (activation recomputation) is bit-identical.
//  - Inner loops are `omp simd` loops over the helpers of core/cpu/vec.h,
//    which round the same in vector and scalar code (see there).
//  - Parallel regions never throw: inputs whose contents can be wrong (token
//    and target ranges) are checked before the first region.
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

#include "core/cpu/attention_bf16.h"
#include "core/cpu/attention_tiles.h"
#include "core/cpu/parallel.h"
#include "core/cpu/scratch.h"
#include "core/cpu/vec.h"

namespace st::cpu {

namespace {

// ---------------------------------------------------------------- scratch

constexpr int kScratchSlots = 12;

// Which set of scratch buffers: `Block` for a parallel_for body's own work
// buffers, `Call` for buffers the calling thread fills and shares with the
// bodies (a loaded weight, per-block partial sums). The calling thread runs
// bodies too, so the two sets must not share slots.
enum class Pool : uint8_t { Block, Call };

// Grow-only F32 scratch owned by the calling thread, one slot per buffer a
// kernel needs at the same time. A training step repeats the same shapes, so
// after the first step these kernels allocate nothing. Kernels never call
// each other, so two kernels never hold the same slot at once.
//
// Every buffer starts on a 64-byte boundary: Eigen's vectorised loops peel
// elements up to an aligned address, so the rounding of a small product can
// depend on where its operands live. With one alignment for all buffers, the
// forward and the backward (or a recomputed forward) round identically.
float* scratch(Pool pool, int slot, int64_t n) {
  thread_local std::array<Scratch<float>, kScratchSlots> block_buffers;
  thread_local std::array<Scratch<float>, kScratchSlots> call_buffers;
  return (pool == Pool::Block ? block_buffers : call_buffers)[static_cast<size_t>(slot)].get(n);
}

float* block_scratch(int slot, int64_t n) { return scratch(Pool::Block, slot, n); }
float* call_scratch(int slot, int64_t n) { return scratch(Pool::Call, slot, n); }

// ---------------------------------------------------------------- block sizes

// Elements per block of the element-wise kernels, and roughly per block of
// the row kernels: enough work to pay for a block, few enough blocks' worth of
// buffers to stay in cache. Constants, so block bounds depend on shapes only.
constexpr int64_t kBlockElems = 8192;

// Rows of width d per block.
int64_t row_grain(int64_t d) { return std::max<int64_t>(1, kBlockElems / std::max<int64_t>(d, 1)); }

// ---------------------------------------------------------------- element access

void widen_into(const BFloat16* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = vec::widen(src[i].bits);
}

// n elements of t from flat element `offset` as F32: t's own memory when t is
// F32 (no copy), else `buf` holding the widened values.
const float* load(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::F32) return t.data<float>() + offset;
  widen_into(t.data<BFloat16>() + offset, buf, n);
  return buf;
}

// Copies n elements of t from `offset` into dst as F32.
void gather(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::F32) {
    std::memcpy(dst, t.data<float>() + offset, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  widen_into(t.data<BFloat16>() + offset, dst, n);
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
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i].bits = vec::narrow(v[i]);
}

// t[offset + i] += v[i] in F32, rounded once to t's dtype.
void accumulate(const float* v, const Tensor& t, int64_t offset, int64_t n) {
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>() + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) p[i] += v[i];
    return;
  }
  BFloat16* p = t.data<BFloat16>() + offset;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i].bits = vec::narrow(vec::widen(p[i].bits) + v[i]);
}

// dst[i] += src[i].
void add_into(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

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
  parallel_for(n, row_grain(d), [&](int64_t begin, int64_t end) {
    float* row = block_scratch(0, d);  // (D)
    for (int64_t r = begin; r < end; ++r) commit(load(weight, tok[r] * d, d, row), out, r * d, d);
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight) {
  check_tokens("embedding_backward", tokens, dweight);
  const int64_t n = tokens.numel();
  const int64_t d = dweight.size(1);
  const int32_t* tok = tokens.data<int32_t>();

  // Positions grouped by token, in position order within a token: every
  // touched row of dweight is summed in F32 in an order fixed by the tokens
  // alone and rounded once, however often its token repeats. Each group is
  // one row of dweight, so groups run in parallel without sharing a row.
  thread_local std::vector<int64_t> order;
  thread_local std::vector<int64_t> group_start;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(),
            [tok](int64_t a, int64_t b) { return tok[a] != tok[b] ? tok[a] < tok[b] : a < b; });
  group_start.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || tok[order[static_cast<size_t>(i)]] != tok[order[static_cast<size_t>(i - 1)]])
      group_start.push_back(i);
  }
  const auto groups = static_cast<int64_t>(group_start.size());
  group_start.push_back(n);
  const int64_t* pos = order.data();
  const int64_t* start = group_start.data();

  parallel_for(groups, row_grain(d), [&](int64_t begin, int64_t end) {
    float* sum = block_scratch(0, d);  // (D)
    float* row = block_scratch(1, d);  // (D)
    for (int64_t grp = begin; grp < end; ++grp) {
      std::fill_n(sum, d, 0.0f);
      for (int64_t i = start[grp]; i < start[grp + 1]; ++i) add_into(sum, load(dout, pos[i] * d, d, row), d);
      accumulate(sum, dweight, tok[pos[start[grp]]] * d, d);
    }
  });
}

// ---------------------------------------------------------------- RMSNorm

namespace {

// One row of RMSNorm: o = (x * rstd) * w in Hugging Face's order, returning
// rstd. o may be xr (element i is read before it is written). Shared by the
// plain and the fused forward so the two round identically.
float rmsnorm_row(const float* xr, const float* w, int64_t d, float eps, float* o) {
  const float inv_d = 1.0f / static_cast<float>(d);
  const float mean_sq = vec::lane_sum(d, [xr](int64_t i) { return xr[i] * xr[i]; }) * inv_d;
  const float r_std = 1.0f / std::sqrt(mean_sq + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * r_std * w[i];
  return r_std;
}

// Rounds v to what a store into `dtype` and a load back give: the value a
// following op would read from the stored tensor.
void round_through(DType dtype, float* v, int64_t n) {
  if (dtype == DType::F32) return;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) v[i] = vec::widen(vec::narrow(v[i]));
}

// RMSNorm of every row of width D into out and rstd; row(r) gives the input
// row r as F32 (in block scratch slots 0-2). The plain and the fused forward
// share this loop, so the two round identically.
template <class Row>
void rmsnorm_rows(int64_t rows, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd, Row row) {
  const int64_t d = weight.numel();
  const float* w = load(weight, 0, d, call_scratch(0, d));  // (D)
  float* rs = rstd.data<float>();                           // (N)
  parallel_for(rows, row_grain(d), [&](int64_t begin, int64_t end) {
    float* out_buf = block_scratch(3, d);  // (D)
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = row(r);
      float* o = output(out, r * d, out_buf);  // may be xr
      rs[r] = rmsnorm_row(xr, w, d, eps, o);
      commit(o, out, r * d, d);
    }
  });
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd) {
  const int64_t d = weight.numel();
  rmsnorm_rows(x.numel() / d, weight, eps, out, rstd,
               [&](int64_t r) { return load(x, r * d, d, block_scratch(0, d)); });
}

namespace {

// Stores h = x + delta for n elements from `offset`, rounded once to h's
// dtype, and returns those stored values as F32 (h's own memory when F32,
// else `hv`). Operands of one dtype take one loop; mixed ones go through
// the widened buffers xb and db.
const float* add_row(const Tensor& x, const Tensor& delta, const Tensor& h, int64_t offset, int64_t n, float* xb,
                     float* db, float* hv) {
  const DType t = h.dtype();
  if (x.dtype() == t && delta.dtype() == t && t == DType::F32) {
    const float* xp = x.data<float>() + offset;
    const float* dp = delta.data<float>() + offset;
    float* hp = h.data<float>() + offset;  // may be xp or dp: element i is read before it is written
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) hp[i] = xp[i] + dp[i];
    return hp;
  }
  if (x.dtype() == t && delta.dtype() == t) {
    const BFloat16* xp = x.data<BFloat16>() + offset;
    const BFloat16* dp = delta.data<BFloat16>() + offset;
    BFloat16* hp = h.data<BFloat16>() + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t bits = vec::narrow(vec::widen(xp[i].bits) + vec::widen(dp[i].bits));
      hp[i].bits = bits;
      hv[i] = vec::widen(bits);
    }
    return hv;
  }
  const float* xr = load(x, offset, n, xb);
  const float* dr = load(delta, offset, n, db);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) hv[i] = xr[i] + dr[i];
  round_through(t, hv, n);
  commit(hv, h, offset, n);
  return hv;
}

}  // namespace

void add_rmsnorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight, float eps, const Tensor& h,
                         const Tensor& out, const Tensor& rstd) {
  const int64_t d = weight.numel();
  // The norm reads h as stored, as rmsnorm_forward(h) would.
  rmsnorm_rows(x.numel() / d, weight, eps, out, rstd, [&](int64_t r) {
    return add_row(x, delta, h, r * d, d, block_scratch(0, d), block_scratch(1, d), block_scratch(2, d));
  });
}

namespace {

// The work of rmsnorm_backward over rows [begin, end), with dweight's partial
// sum added into dw. With a residual, dx = round(round(g) + residual): the
// rounding of the unfused rmsnorm_backward then add.
void rmsnorm_backward_rows(const Tensor& dout, const Tensor& x, const float* w, const float* rs, const Tensor* residual,
                           const Tensor& dx, float* dw, int64_t d, int64_t begin, int64_t end) {
  float* dy_buf = block_scratch(0, d);   // (D)
  float* x_buf = block_scratch(1, d);    // (D)
  float* dx_buf = block_scratch(2, d);   // (D)
  float* res_buf = block_scratch(3, d);  // (D)
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = begin; r < end; ++r) {
    const float* dy = load(dout, r * d, d, dy_buf);
    const float* xr = load(x, r * d, d, x_buf);
    const float r_std = rs[r];
    // y = x * r * w with r = (mean(x^2) + eps)^(-1/2), dr/dx_i = -r^3 x_i / D:
    // dx_i = r w_i dy_i - r^3 / D * x_i * sum_j(dy_j w_j x_j).
    const float dot = vec::lane_sum(d, [dy, w, xr](int64_t i) { return dy[i] * w[i] * xr[i]; });
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dw[i] += dy[i] * (xr[i] * r_std);
    const float c = r_std * r_std * r_std * dot * inv_d;
    float* g = output(dx, r * d, dx_buf);  // may be dy, xr or res: element i is read before it is written
    if (residual == nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) g[i] = dy[i] * w[i] * r_std - c * xr[i];
    } else if (dx.dtype() == DType::F32) {
      const float* res = load(*residual, r * d, d, res_buf);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) g[i] = (dy[i] * w[i] * r_std - c * xr[i]) + res[i];
    } else {
      // round(round(g) + residual): the rounding of rmsnorm_backward, then add.
      const float* res = load(*residual, r * d, d, res_buf);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) g[i] = vec::widen(vec::narrow(dy[i] * w[i] * r_std - c * xr[i])) + res[i];
    }
    commit(g, dx, r * d, d);
  }
}

void rmsnorm_backward_impl(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                           const Tensor* residual, const Tensor& dx, const Tensor& dweight) {
  const int64_t d = weight.numel();
  const int64_t rows = x.numel() / d;
  const int64_t grain = row_grain(d);
  const int64_t blocks = (rows + grain - 1) / grain;
  const float* w = load(weight, 0, d, call_scratch(0, d));             // (D)
  float* partial = call_scratch(1, std::max<int64_t>(blocks, 1) * d);  // (blocks, D) dweight of each block
  const float* rs = rstd.data<float>();                                // (N)
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    float* dw = partial + (begin / grain) * d;
    std::fill_n(dw, d, 0.0f);
    rmsnorm_backward_rows(dout, x, w, rs, residual, dx, dw, d, begin, end);
  });
  // The blocks' partial sums, in block order.
  for (int64_t blk = 1; blk < blocks; ++blk) add_into(partial, partial + blk * d, d);
  if (blocks > 0) accumulate(partial, dweight, 0, d);
}

}  // namespace

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight) {
  rmsnorm_backward_impl(dout, x, weight, rstd, nullptr, dx, dweight);
}

void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                          const Tensor& residual, const Tensor& dx, const Tensor& dweight) {
  rmsnorm_backward_impl(dout, x, weight, rstd, &residual, dx, dweight);
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

// One head's vector xr (hd) into y (hd), which may be xr: iteration i reads
// and writes elements i and i + h only. Forward, with h = hd/2 and i < h:
//   y_i = c_i x_i - s_i x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} + s_{i+h} x_i
// Transpose:
//   y_i = c_i x_i + s_{i+h} x_{i+h},  y_{i+h} = c_{i+h} x_{i+h} - s_i x_i
void rope_rotate(const float* xr, float* y, const float* c, const float* s, int64_t half, RopeDirection direction) {
  if (direction == RopeDirection::Forward) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float lo = xr[i];
      const float hi = xr[i + half];
      y[i] = lo * c[i] - hi * s[i];
      y[i + half] = hi * c[i + half] + lo * s[i + half];
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float lo = xr[i];
      const float hi = xr[i + half];
      y[i] = lo * c[i] + hi * s[i + half];
      y[i + half] = hi * c[i + half] - lo * s[i];
    }
  }
}

// x [B, T, heads, hd] in place, in parallel over the B*T positions.
void rope_apply(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeDirection direction) {
  const int64_t seq = x.size(1);
  const int64_t heads = x.size(2);
  const int64_t hd = x.size(3);
  const int64_t half = hd / 2;
  const float* pc = cos.data<float>();  // (T', hd), T' >= T
  const float* ps = sin.data<float>();  // (T', hd)
  parallel_for(x.size(0) * seq, row_grain(heads * hd), [&](int64_t begin, int64_t end) {
    float* in_buf = block_scratch(0, hd);   // (hd)
    float* out_buf = block_scratch(1, hd);  // (hd)
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % seq;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t offset = (row * heads + h) * hd;
        const float* xr = load(x, offset, hd, in_buf);
        float* y = output(x, offset, out_buf);
        rope_rotate(xr, y, pc + t * hd, ps + t * hd, half, direction);
        commit(y, x, offset, hd);
      }
    }
  });
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  rope_apply(x, cos, sin, RopeDirection::Forward);
}

void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin) {
  rope_apply(dx, cos, sin, RopeDirection::Transpose);
}

// ---------------------------------------------------------------- attention
//
// Tiled causal attention with an online softmax (FlashAttention's scheme):
// queries and keys in tiles of kTile positions, so nothing of size T x T
// exists; a tile pair's scores live in a kTile x kTile buffer. Tiles are
// multiplied with Eigen on F32 scratch, inside the parallel region (ops::gemm
// and its thread pool are never called from one). Forward also takes fewer
// queries than keys (a KV cache's new tokens): query i then sits at position
// offset + i, offset = Tk - Tq, and key tiles start at 0 as in a full pass.
//  - forward, in parallel over (batch, head, query tile): running row max m
//    and sum l, out = acc / l, lse = m + log(l);
//  - backward, in parallel over (batch, K/V head): P = exp(scale s - lse) tile
//    by tile from the forward's lse; dk, dv of a K/V head sum over its query
//    heads in ascending order, then query tiles in ascending order.

namespace {

using attention::kTile;
using attention::visible_keys;
using AttentionDims = attention::Dims;

AttentionDims attention_dims(const Tensor& q, const Tensor& k) { return attention::dims_of(q, k); }

// Positions [t0, t0 + n) of head `head` of batch row b of x [B, T, heads, hd]
// (T = x's own length: Tq for q, Tk for k and v) into dst (n, hd), as F32.
void gather_rows(const Tensor& x, int64_t b, int64_t head, int64_t heads, int64_t t0, int64_t n, const AttentionDims& d,
                 float* dst) {
  const int64_t seq = x.size(1);
  for (int64_t t = 0; t < n; ++t) gather(x, ((b * seq + t0 + t) * heads + head) * d.hd, d.hd, dst + t * d.hd);
}

// src (n, hd) into positions [t0, t0 + n) of head `head` of batch row b of x.
void scatter_rows(const float* src, const Tensor& x, int64_t b, int64_t head, int64_t heads, int64_t t0, int64_t n,
                  const AttentionDims& d) {
  const int64_t seq = x.size(1);
  for (int64_t t = 0; t < n; ++t) commit(src + t * d.hd, x, ((b * seq + t0 + t) * heads + head) * d.hd, d.hd);
}

// Row state of the online softmax for one query tile.
struct OnlineRows {
  float* m;    // (kTile) running max of the scaled scores
  float* l;    // (kTile) running sum of exp(scaled score - m)
  float* acc;  // (kTile, hd) running sum of exp(scaled score - m) * v
};

// Folds the scores s (qn, kn) of one key tile into the rows: s becomes the
// tile's unnormalised probabilities exp(scale s - m_new), 0 where masked.
// p0 is the position of the tile's first query.
void online_softmax_tile(float* s, int64_t p0, int64_t qn, int64_t k0, int64_t kn, const AttentionDims& d,
                         const OnlineRows& rows) {
  for (int64_t t = 0; t < qn; ++t) {
    float* row = s + t * kn;
    const int64_t visible = visible_keys(p0 + t, k0, kn);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      row[j] *= d.scale;
      tile_max = std::max(tile_max, row[j]);
    }
    const float m_new = std::max(rows.m[t], tile_max);
    const float alpha = vec::exp_f32(rows.m[t] - m_new);  // 0 on the first tile (m = -inf)
#pragma omp simd
    for (int64_t j = 0; j < kn; ++j) row[j] = j < visible ? vec::exp_f32(row[j] - m_new) : 0.0f;
    rows.l[t] = rows.l[t] * alpha + vec::lane_sum(kn, [row](int64_t j) { return row[j]; });
    rows.m[t] = m_new;
    float* acc = rows.acc + t * d.hd;
#pragma omp simd
    for (int64_t i = 0; i < d.hd; ++i) acc[i] *= alpha;
  }
}

// One query tile of one head: out rows and lse for queries [q0, q0 + qn)
// (positions offset + q0, ...).
void attention_forward_tile(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, float* lse_rows,
                            int64_t b, int64_t h, int64_t q0, const AttentionDims& d) {
  const int64_t qn = std::min(kTile, d.seq - q0);
  const int64_t g = h / d.group;
  float* qb = block_scratch(0, kTile * d.hd);   // (qn, hd)
  float* kb = block_scratch(1, kTile * d.hd);   // (kn, hd)
  float* vb = block_scratch(2, kTile * d.hd);   // (kn, hd)
  float* sb = block_scratch(3, kTile * kTile);  // (qn, kn) scores, then probabilities
  const OnlineRows rows{block_scratch(4, kTile), block_scratch(5, kTile), block_scratch(6, kTile * d.hd)};
  std::fill_n(rows.m, qn, -std::numeric_limits<float>::infinity());
  std::fill_n(rows.l, qn, 0.0f);
  std::fill_n(rows.acc, qn * d.hd, 0.0f);
  gather_rows(q, b, h, d.heads, q0, qn, d, qb);
  const MatrixMap qm(qb, qn, d.hd);
  MatrixMap accm(rows.acc, qn, d.hd);
  const int64_t p0 = d.offset + q0;  // position of the tile's first query
  for (int64_t k0 = 0; k0 < p0 + qn; k0 += kTile) {
    const int64_t kn = std::min(kTile, d.kv_seq - k0);
    gather_rows(k, b, g, d.kv_heads, k0, kn, d, kb);
    gather_rows(v, b, g, d.kv_heads, k0, kn, d, vb);
    const MatrixMap km(kb, kn, d.hd), vm(vb, kn, d.hd);
    MatrixMap sm(sb, qn, kn);
    sm.noalias() = qm * km.transpose();
    online_softmax_tile(sb, p0, qn, k0, kn, d, rows);
    accm.noalias() += sm * vm;
  }
  for (int64_t t = 0; t < qn; ++t) {
    const float inv_l = 1.0f / rows.l[t];
    float* acc = rows.acc + t * d.hd;
#pragma omp simd
    for (int64_t i = 0; i < d.hd; ++i) acc[i] *= inv_l;
    lse_rows[t] = rows.m[t] + std::log(rows.l[t]);
  }
  scatter_rows(rows.acc, out, b, h, d.heads, q0, qn, d);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  if (bf16_attention(q, k, v)) {
    attention_forward_bf16(q, k, v, out, lse);
    return;
  }
  const AttentionDims d = attention_dims(q, k);
  float* pl = lse.data<float>();  // (B, H, T)
  parallel_for(d.batch * d.heads * d.tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t bh = unit / d.tiles;  // b * H + h
      const int64_t q0 = (unit % d.tiles) * kTile;
      attention_forward_tile(q, k, v, out, pl + bh * d.seq + q0, bh / d.heads, bh % d.heads, q0, d);
    }
  });
}

namespace {

struct AttentionGrads {
  const Tensor &dout, &q, &k, &v, &out, &lse, &dq;
};

// One query tile of head h: writes its dq rows and adds its part of dk, dv
// (T, hd) of the head's K/V head.
void attention_backward_tile(const AttentionGrads& a, int64_t b, int64_t h, int64_t q0, const AttentionDims& d,
                             float* dkb, float* dvb) {
  const int64_t qn = std::min(kTile, d.seq - q0);
  const int64_t g = h / d.group;
  const int64_t th = kTile * d.hd;
  float* qb = block_scratch(0, th);              // (qn, hd)
  float* kb = block_scratch(1, th);              // (kn, hd)
  float* vb = block_scratch(2, th);              // (kn, hd)
  float* ob = block_scratch(3, th);              // (qn, hd) the forward's output, as stored
  float* dob = block_scratch(4, th);             // (qn, hd)
  float* dqb = block_scratch(5, th);             // (qn, hd)
  float* pb = block_scratch(6, kTile * kTile);   // (qn, kn) probabilities
  float* dsb = block_scratch(7, kTile * kTile);  // (qn, kn) dP, then scale * dS
  float* delta = block_scratch(8, kTile);        // (qn) rowsum(dO o O)
  const float* lse_rows = a.lse.data<float>() + (b * d.heads + h) * d.seq + q0;
  gather_rows(a.q, b, h, d.heads, q0, qn, d, qb);
  gather_rows(a.out, b, h, d.heads, q0, qn, d, ob);
  gather_rows(a.dout, b, h, d.heads, q0, qn, d, dob);
  for (int64_t t = 0; t < qn; ++t) {
    const float* o_row = ob + t * d.hd;
    const float* do_row = dob + t * d.hd;
    delta[t] = vec::lane_sum(d.hd, [o_row, do_row](int64_t i) { return do_row[i] * o_row[i]; });
  }
  const MatrixMap qm(qb, qn, d.hd), dom(dob, qn, d.hd);
  MatrixMap dqm(dqb, qn, d.hd);
  dqm.setZero();
  for (int64_t k0 = 0; k0 < q0 + qn; k0 += kTile) {
    const int64_t kn = std::min(kTile, d.seq - k0);
    gather_rows(a.k, b, g, d.kv_heads, k0, kn, d, kb);
    gather_rows(a.v, b, g, d.kv_heads, k0, kn, d, vb);
    const MatrixMap km(kb, kn, d.hd), vm(vb, kn, d.hd);
    MatrixMap pm(pb, qn, kn), dsm(dsb, qn, kn);
    pm.noalias() = qm * km.transpose();
    dsm.noalias() = dom * vm.transpose();  // dP
    for (int64_t t = 0; t < qn; ++t) {
      float* p_row = pb + t * kn;
      float* ds_row = dsb + t * kn;
      const int64_t visible = visible_keys(q0 + t, k0, kn);
      const float row_lse = lse_rows[t];
      const float row_delta = delta[t];
      // dS = P o (dP - rowsum(dO o O)); the softmax scale is folded in here
      // so that dq and dk need no separate pass.
#pragma omp simd
      for (int64_t j = 0; j < kn; ++j) {
        const float p = j < visible ? vec::exp_f32(p_row[j] * d.scale - row_lse) : 0.0f;
        p_row[j] = p;
        ds_row[j] = j < visible ? d.scale * p * (ds_row[j] - row_delta) : 0.0f;
      }
    }
    dqm.noalias() += dsm * km;
    MatrixMap dkm(dkb + k0 * d.hd, kn, d.hd), dvm(dvb + k0 * d.hd, kn, d.hd);
    dkm.noalias() += dsm.transpose() * qm;
    dvm.noalias() += pm.transpose() * dom;
  }
  scatter_rows(dqb, a.dq, b, h, d.heads, q0, qn, d);
}

}  // namespace

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (bf16_attention(q, k, v, &dout)) {
    attention_backward_bf16(dout, q, k, v, out, lse, dq, dk, dv);
    return;
  }
  const AttentionDims d = attention_dims(q, k);
  const AttentionGrads a{dout, q, k, v, out, lse, dq};
  parallel_for(d.batch * d.kv_heads, 1, [&](int64_t begin, int64_t end) {
    float* dkb = block_scratch(9, d.seq * d.hd);   // (T, hd) summed over the group's query heads
    float* dvb = block_scratch(10, d.seq * d.hd);  // (T, hd)
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / d.kv_heads;
      const int64_t g = unit % d.kv_heads;
      std::fill_n(dkb, d.seq * d.hd, 0.0f);
      std::fill_n(dvb, d.seq * d.hd, 0.0f);
      // Query heads, then query tiles, in ascending order: a fixed summation order for dk, dv.
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
        for (int64_t q0 = 0; q0 < d.seq; q0 += kTile) attention_backward_tile(a, b, h, q0, d, dkb, dvb);
      }
      scatter_rows(dkb, dk, b, g, d.kv_heads, 0, d.seq, d);
      scatter_rows(dvb, dv, b, g, d.kv_heads, 0, d.seq, d);
    }
  });
}

// ---------------------------------------------------------------- SwiGLU, ReLU

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  parallel_for(out.numel(), kBlockElems, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    const float* g = load(gate, begin, m, block_scratch(0, m));
    const float* u = load(up, begin, m, block_scratch(1, m));
    float* o = output(out, begin, block_scratch(2, m));
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const float gi = g[i];
      const float ui = u[i];
      o[i] = gi / (1.0f + vec::exp_f32(-gi)) * ui;  // silu as PyTorch writes it: x / (1 + e^-x)
    }
    commit(o, out, begin, m);
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  parallel_for(dout.numel(), kBlockElems, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    const float* dy = load(dout, begin, m, block_scratch(0, m));
    const float* g = load(gate, begin, m, block_scratch(1, m));
    const float* u = load(up, begin, m, block_scratch(2, m));
    float* dg = output(dgate, begin, block_scratch(3, m));
    float* du = output(dup, begin, block_scratch(4, m));
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      // All three inputs are read before either output is written (aliasing).
      const float dyi = dy[i];
      const float gi = g[i];
      const float ui = u[i];
      const float sig = 1.0f / (1.0f + vec::exp_f32(-gi));
      // silu'(x) = sig(x) (1 + x (1 - sig(x))).
      dg[i] = dyi * ui * sig * (1.0f + gi * (1.0f - sig));
      du[i] = dyi * (gi * sig);
    }
    commit(dg, dgate, begin, m);
    commit(du, dup, begin, m);
  });
}

void relu_forward(const Tensor& x, const Tensor& out) {
  parallel_for(out.numel(), kBlockElems, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    const float* xr = load(x, begin, m, block_scratch(0, m));
    float* o = output(out, begin, block_scratch(1, m));
    // NaN passes through, as in PyTorch, so a diverging run is not hidden.
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) o[i] = (xr[i] > 0.0f || xr[i] != xr[i]) ? xr[i] : 0.0f;
    commit(o, out, begin, m);
  });
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  parallel_for(dx.numel(), kBlockElems, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    const float* dy = load(dout, begin, m, block_scratch(0, m));
    const float* xr = load(x, begin, m, block_scratch(1, m));
    float* g = output(dx, begin, block_scratch(2, m));
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) g[i] = xr[i] > 0.0f ? dy[i] : 0.0f;
    commit(g, dx, begin, m);
  });
}

// ---------------------------------------------------------------- losses

namespace {

// One counted row of cross_entropy: x (V) the logits as F32, g (V) where the
// gradient goes (may be x). Returns the row's loss log(sum exp) - x_target.
double cross_entropy_row(const float* x, float* g, int64_t vocab, int32_t target, float grad_scale) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < vocab; ++i) m = std::max(m, x[i]);
  // log_softmax_i = (x_i - m) - log(sum_j exp(x_j - m)). Differences from the
  // max are exact for nearby logits and log(sum) is at most log(V), so
  // nothing here loses precision when the logits themselves are large.
  const float target_shifted = x[target] - m;  // read before g (possibly x itself) is written
  // One pass leaves exp(x_i - m) in g and sums it; a second scales it.
  const float sum = vec::lane_sum(vocab, [x, g, m](int64_t i) {
    const float e = vec::exp_f32(x[i] - m);
    g[i] = e;
    return e;
  });
  const float inv_sum = 1.0f / sum;
  const float p_target = g[target] * inv_sum;
#pragma omp simd
  for (int64_t i = 0; i < vocab; ++i) g[i] = grad_scale * (g[i] * inv_sum);
  g[target] = grad_scale * (p_target - 1.0f);
  return static_cast<double>(std::log(sum)) - static_cast<double>(target_shifted);
}

}  // namespace

ops::LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                           const Tensor& dlogits) {
  const int64_t vocab = logits.size(-1);
  const int64_t rows = targets.numel();
  const int32_t* tgt = targets.data<int32_t>();
  // Every target is checked before anything is written: dlogits may be the
  // logits, and a half-consumed batch is no use to anyone.
  ops::LossSum result;
  for (int64_t r = 0; r < rows; ++r) {
    ST_CHECK(tgt[r] == ignore_index || (tgt[r] >= 0 && tgt[r] < vocab),
             "cross_entropy: target {} in row {} is outside [0, {}) (logits shape {}) and is not ignore_index {}",
             tgt[r], r, vocab, shape_str(logits.shape()), ignore_index);
    if (tgt[r] != ignore_index) ++result.count;
  }

  // Each row's loss, summed in row order afterwards: the same sum for any
  // thread count.
  thread_local std::vector<double> row_loss;
  row_loss.assign(static_cast<size_t>(rows), 0.0);
  double* losses = row_loss.data();
  parallel_for(rows, row_grain(vocab), [&](int64_t begin, int64_t end) {
    float* x_buf = block_scratch(0, vocab);  // (V)
    float* g_buf = block_scratch(1, vocab);  // (V)
    for (int64_t r = begin; r < end; ++r) {
      float* g = output(dlogits, r * vocab, g_buf);
      if (tgt[r] == ignore_index) {
        std::fill_n(g, vocab, 0.0f);
      } else {
        losses[r] = cross_entropy_row(load(logits, r * vocab, vocab, x_buf), g, vocab, tgt[r], grad_scale);
      }
      commit(g, dlogits, r * vocab, vocab);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (tgt[r] != ignore_index) result.sum += losses[r];
  }
  return result;
}

ops::LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred) {
  const int64_t n = pred.numel();
  const int64_t blocks = (n + kBlockElems - 1) / kBlockElems;
  thread_local std::vector<double> block_sums;
  block_sums.assign(static_cast<size_t>(blocks), 0.0);
  double* sums = block_sums.data();
  const float g_scale = 2.0f * grad_scale;
  parallel_for(n, kBlockElems, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    const float* p = load(pred, begin, m, block_scratch(0, m));
    const float* t = load(target, begin, m, block_scratch(1, m));
    float* g = output(dpred, begin, block_scratch(2, m));
    double sum = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      const float diff = p[i] - t[i];
      sum += static_cast<double>(diff) * static_cast<double>(diff);
      g[i] = g_scale * diff;  // after p[i], t[i] are read (g may alias either)
    }
    sums[begin / kBlockElems] = sum;
    commit(g, dpred, begin, m);
  });
  ops::LossSum result;
  result.count = n;
  for (int64_t blk = 0; blk < blocks; ++blk) result.sum += sums[blk];
  return result;
}

}  // namespace st::cpu
