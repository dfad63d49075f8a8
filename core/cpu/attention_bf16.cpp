// BF16 attention on AVX512_BF16 (see attention_bf16.h). The algorithm is the
// F32 tile path's (nn_cpu.cpp): query and key tiles of kTile positions, an
// online softmax in the forward, P recomputed from lse in the backward, dK
// and dV of a K/V head summed over its query heads in ascending order. What
// differs is how the tile products run:
//
//  - One micro-kernel multiplies every product: c (m, n) += a (m, k) b (k, n)
//    with a as BF16 rows (k contiguous, padded to even k) and b in the
//    dot-product layout vdpbf16ps reads: element pairs along k interleaved
//    per column, b[p][j][0..1] = (b(2p, j), b(2p+1, j)), columns padded to a
//    multiple of 16. Each instruction adds a pair of products into 16 F32
//    lanes, so every element of c sums the same k terms in the same order
//    wherever it sits: results depend on the shapes only, and a recomputed
//    forward, or the backward's recomputed scores, match bit for bit.
//  - Operands are packed once per use: a head's keys and values for the
//    whole sequence (in both layouts each needs), a query tile's q and dO.
//  - The probabilities and score gradients enter products as BF16, rounded
//    once (round to nearest even); the row sums l, lse and the delta of the
//    backward use the F32 values.
#include "core/cpu/attention_bf16.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include <immintrin.h>

#include "core/cpu/attention_tiles.h"
#include "core/cpu/isa.h"
#include "core/cpu/parallel.h"
#include "core/cpu/scratch.h"
#include "core/cpu/vec.h"

#define ST_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace st::cpu {

bool has_bf16_dot() { return cpu_isa() >= CpuIsa::Avx512Bf16; }

bool bf16_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* dout) {
  const bool operands = q.dtype() == DType::BF16 && k.dtype() == DType::BF16 && v.dtype() == DType::BF16 &&
                        (dout == nullptr || dout->dtype() == DType::BF16);
  return operands && has_bf16_dot();
}

namespace {

using attention::kTile;
constexpr int kMaxRows = 8;  // rows of c per micro-tile: 8 x 3 or 6 x 4 accumulators
constexpr int kMaxVecs = 4;  // 16-float columns per micro-tile (32 vector registers in all)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------- scratch

// Grow-only buffers of the calling thread, 64-byte aligned, one per slot
// (the forward and the backward never run at once on a thread).
template <class T>
T* scratch(int slot, int64_t n) {
  thread_local std::array<Scratch<T>, 16> buffers;
  return buffers[static_cast<size_t>(slot)].get(n);
}

// ---------------------------------------------------------------- micro-kernel

// c[r][0, 16 NV) (+)= sum over pairs p of a[r][2p, 2p+1] . b[p][.][0, 1], r < MR.
// a: row stride lda (BF16 elements); b: pair-row stride ldb (BF16 elements);
// c: row stride ldc (floats). accumulate == false starts from zero.
template <int MR, int NV>
ST_BF16_TARGET void micro_tile(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t pairs, float* c,
                               int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + v * 32);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof(pair));
      const auto av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
}

using MicroTile = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t, bool);

template <int MR>
constexpr std::array<MicroTile, kMaxVecs> micro_row() {
  return {&micro_tile<MR, 1>, &micro_tile<MR, 2>, &micro_tile<MR, 3>, &micro_tile<MR, 4>};
}

constexpr std::array<std::array<MicroTile, kMaxVecs>, kMaxRows> kMicroTiles = {
    micro_row<1>(), micro_row<2>(), micro_row<3>(), micro_row<4>(),
    micro_row<5>(), micro_row<6>(), micro_row<7>(), micro_row<8>()};

// A BF16 matrix in the micro-kernel's layouts: rows of `a` (`ld` elements
// apart), or pairs of `b` (`ld` elements per pair of rows).
struct Bf16View {
  const uint16_t* data;
  int64_t ld;
};

// c (m, np) (+)= a (m, 2 pairs) b (2 pairs, np); np a multiple of 16, c's
// row stride ldc. Columns outer, so a b panel stays in cache across rows.
void dot(Bf16View a, int64_t m, Bf16View b, int64_t np, int64_t pairs, float* c, int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < np; n0 += 16 * kMaxVecs) {
    const auto vecs = static_cast<int>(std::min<int64_t>(kMaxVecs, (np - n0) / 16));
    const int64_t max_rows = vecs == kMaxVecs ? 6 : kMaxRows;
    for (int64_t r0 = 0; r0 < m; r0 += max_rows) {
      const auto rows = static_cast<int>(std::min<int64_t>(max_rows, m - r0));
      kMicroTiles[static_cast<size_t>(rows - 1)][static_cast<size_t>(vecs - 1)](
          a.data + r0 * a.ld, a.ld, b.data + 2 * n0, b.ld, pairs, c + r0 * ldc + n0, ldc, accumulate);
    }
  }
}

// ---------------------------------------------------------------- packing

// A call's dimensions, and the padded widths of the products over hd.
struct Dims : attention::Dims {
  int64_t hde;  // hd rounded up to even: the k of products over hd
  int64_t hdp;  // hd rounded up to 16: the n of products into hd columns
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  Dims d{attention::dims_of(q, k), 0, 0};
  d.hde = round_up(d.hd, 2);
  d.hdp = round_up(d.hd, 16);
  return d;
}

// Positions [t0, t0 + n) of head `head` of batch row b of x [B, T, heads, hd]
// as BF16 rows of d.hde elements into dst (rows, d.hde): rows past n and the
// odd column are zero. x is BF16 (its bits are copied) or F32 (rounded).
void pack_rows(const Tensor& x, int64_t b, int64_t head, int64_t t0, int64_t n, int64_t rows, const Dims& d,
               uint16_t* dst) {
  const int64_t stride = x.size(2) * d.hd;                                 // between positions
  const int64_t first = ((b * x.size(1) + t0) * x.size(2) + head) * d.hd;  // element of position t0
  std::fill_n(dst, rows * d.hde, uint16_t{0});
  if (x.dtype() == DType::BF16) {
    const BFloat16* xs = x.data<BFloat16>() + first;
    for (int64_t t = 0; t < n; ++t) {
      uint16_t* row = dst + t * d.hde;
      const BFloat16* xr = xs + t * stride;
#pragma omp simd
      for (int64_t i = 0; i < d.hd; ++i) row[i] = xr[i].bits;
    }
  } else {
    const float* xs = x.data<float>() + first;
    for (int64_t t = 0; t < n; ++t) {
      uint16_t* row = dst + t * d.hde;
      const float* xr = xs + t * stride;
#pragma omp simd
      for (int64_t i = 0; i < d.hd; ++i) row[i] = vec::narrow(xr[i]);
    }
  }
}

// Rows (rows, width even) as b of a product over the width: pair p of
// column j is elements (2p, 2p+1) of row j. dst (width/2, ld) pairs with
// ld >= 2 rows; columns past `rows` are zero.
void pairs_across(const uint16_t* src, int64_t rows, int64_t width, uint16_t* dst, int64_t ld) {
  for (int64_t p = 0; p < width / 2; ++p) {
    uint16_t* out = dst + p * ld;
    for (int64_t j = 0; j < rows; ++j) {
      out[2 * j] = src[j * width + 2 * p];
      out[2 * j + 1] = src[j * width + 2 * p + 1];
    }
    std::fill(out + 2 * rows, out + ld, uint16_t{0});
  }
}

// Rows (rows even, width) as b of a product over the rows: pair p of column
// i is rows (2p, 2p+1) at i. dst (rows/2, ld) with ld >= 2 width; columns
// past width are zero.
void pairs_down(const uint16_t* src, int64_t rows, int64_t width, uint16_t* dst, int64_t ld) {
  for (int64_t p = 0; p < rows / 2; ++p) {
    const uint16_t* r0 = src + 2 * p * width;
    const uint16_t* r1 = r0 + width;
    uint16_t* out = dst + p * ld;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) {
      out[2 * i] = r0[i];
      out[2 * i + 1] = r1[i];
    }
    std::fill(out + 2 * width, out + ld, uint16_t{0});
  }
}

// src (n, lds) F32 into positions [t0, t0 + n) of head `head` of batch row b
// of x, rounded once when x is BF16.
void store_rows(const float* src, int64_t lds, const Tensor& x, int64_t b, int64_t head, int64_t t0, int64_t n,
                const Dims& d) {
  const int64_t stride = x.size(2) * d.hd;
  const int64_t first = ((b * x.size(1) + t0) * x.size(2) + head) * d.hd;
  if (x.dtype() == DType::F32) {
    float* xs = x.data<float>() + first;
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(xs + t * stride, src + t * lds, static_cast<size_t>(d.hd) * sizeof(float));
  } else {
    BFloat16* xs = x.data<BFloat16>() + first;
    for (int64_t t = 0; t < n; ++t) {
      BFloat16* out = xs + t * stride;
      const float* row = src + t * lds;
#pragma omp simd
      for (int64_t i = 0; i < d.hd; ++i) out[i].bits = vec::narrow(row[i]);
    }
  }
}

using attention::visible_keys;

// A head's keys or values for all Tk positions, packed for the products:
// `across` pairs along hd (b of Q K^T, dO V^T), `down` pairs along positions
// (b of P V, dS K). Positions past Tk are zero.
struct PackedHead {
  uint16_t* rows;    // (Tp, hde)
  uint16_t* across;  // (hde/2, 2 Tp)
  uint16_t* down;    // (Tp/2, 2 hdp)
  int64_t padded;    // Tp: Tk rounded up to a tile
};

PackedHead pack_head(const Tensor& x, int64_t b, int64_t head, const Dims& d, int slot, bool across, bool down) {
  PackedHead p{};
  p.padded = round_up(d.kv_seq, kTile);
  p.rows = scratch<uint16_t>(slot, p.padded * d.hde);
  pack_rows(x, b, head, 0, d.kv_seq, p.padded, d, p.rows);
  if (across) {
    p.across = scratch<uint16_t>(slot + 1, d.hde * p.padded);
    pairs_across(p.rows, p.padded, d.hde, p.across, 2 * p.padded);
  }
  if (down) {
    p.down = scratch<uint16_t>(slot + 2, p.padded * d.hdp);
    pairs_down(p.rows, p.padded, d.hde, p.down, 2 * d.hdp);
  }
  return p;
}

// The b views of key tile k0 in a packed head.
Bf16View across_at(const PackedHead& p, int64_t k0) { return {p.across + 2 * k0, 2 * p.padded}; }

}  // namespace

namespace {

Bf16View down_at(const PackedHead& p, int64_t k0, const Dims& d) { return {p.down + k0 * d.hdp, 2 * d.hdp}; }

// max of x[0, n), n > 0, in lanes that vectorise (a max is exact in any order).
float lane_max(const float* x, int64_t n) {
  float lanes[vec::kLanes];
  std::fill_n(lanes, vec::kLanes, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + vec::kLanes <= n; j += vec::kLanes) {
#pragma omp simd
    for (int l = 0; l < vec::kLanes; ++l) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
  }
  float m = -std::numeric_limits<float>::infinity();
  for (; j < n; ++j) m = std::max(m, x[j]);
  for (const float lane : lanes) m = std::max(m, lane);
  return m;
}

// Online softmax of one query tile: running max m, sum l (F32) and the
// unnormalised output acc (qn, hdp).
struct OnlineRows {
  float* m;
  float* l;
  float* acc;
};

// Folds the scores s (qn, lds) of key tile k0 (kn keys) into the rows and
// writes the tile's probabilities exp(scale s - m_new) as BF16 rows of p
// (qn, kne), 0 where masked. p0 is the position of the tile's first query.
void online_softmax_tile(float* s, int64_t lds, int64_t p0, int64_t qn, int64_t k0, int64_t kn, const Dims& d,
                         const OnlineRows& rows, uint16_t* p, int64_t kne) {
  for (int64_t t = 0; t < qn; ++t) {
    float* row = s + t * lds;
    const int64_t visible = visible_keys(p0 + t, k0, kn);
    // scale > 0, so the max of the scaled scores is the scaled max (exactly:
    // rounding is monotonic).
    const float tile_max = visible > 0 ? lane_max(row, visible) * d.scale : -std::numeric_limits<float>::infinity();
    const float m_new = std::max(rows.m[t], tile_max);
    const float alpha = vec::exp_f32(rows.m[t] - m_new);  // 0 on the first tile (m = -inf)
    uint16_t* p_row = p + t * kne;
#pragma omp simd
    for (int64_t j = 0; j < kne; ++j) {
      const float e = j < visible ? vec::exp_f32(row[j] * d.scale - m_new) : 0.0f;
      row[j] = e;
      p_row[j] = vec::narrow(e);
    }
    rows.l[t] = rows.l[t] * alpha + vec::lane_sum(kn, [row](int64_t j) { return row[j]; });
    rows.m[t] = m_new;
    float* acc = rows.acc + t * d.hdp;
#pragma omp simd
    for (int64_t i = 0; i < d.hd; ++i) acc[i] *= alpha;
  }
}

// Query tile q0 of head h against the packed keys and values of its K/V head.
void forward_tile(const Tensor& q, const Tensor& out, float* lse_rows, int64_t b, int64_t h, int64_t q0,
                  const PackedHead& keys, const PackedHead& values, const Dims& d) {
  const int64_t qn = std::min(kTile, d.seq - q0);
  uint16_t* qa = scratch<uint16_t>(6, kTile * d.hde);  // (qn, hde)
  uint16_t* pa = scratch<uint16_t>(7, kTile * kTile);  // (qn, kne) probabilities
  float* sb = scratch<float>(8, kTile * kTile);        // (qn, knp) scores
  const OnlineRows rows{scratch<float>(9, kTile), scratch<float>(10, kTile), scratch<float>(11, kTile * d.hdp)};
  std::fill_n(rows.m, qn, -std::numeric_limits<float>::infinity());
  std::fill_n(rows.l, qn, 0.0f);
  std::fill_n(rows.acc, qn * d.hdp, 0.0f);
  pack_rows(q, b, h, q0, qn, qn, d, qa);
  const int64_t p0 = d.offset + q0;  // position of the tile's first query
  for (int64_t k0 = 0; k0 < p0 + qn; k0 += kTile) {
    const int64_t kn = std::min(kTile, d.kv_seq - k0);
    const int64_t knp = round_up(kn, 16);
    const int64_t kne = round_up(kn, 2);
    dot({qa, d.hde}, qn, across_at(keys, k0), knp, d.hde / 2, sb, knp, false);
    online_softmax_tile(sb, knp, p0, qn, k0, kn, d, rows, pa, kne);
    dot({pa, kne}, qn, down_at(values, k0, d), d.hdp, kne / 2, rows.acc, d.hdp, true);
  }
  for (int64_t t = 0; t < qn; ++t) {
    const float inv_l = 1.0f / rows.l[t];
    float* acc = rows.acc + t * d.hdp;
#pragma omp simd
    for (int64_t i = 0; i < d.hd; ++i) acc[i] *= inv_l;
    lse_rows[t] = rows.m[t] + std::log(rows.l[t]);
  }
  store_rows(rows.acc, d.hdp, out, b, h, q0, qn, d);
}

}  // namespace

void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const Dims d = dims_of(q, k);
  float* pl = lse.data<float>();  // (B, H, Tq)
  // One unit per (batch row, query head): its K/V head is packed once for
  // all its query tiles.
  parallel_for(d.batch * d.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / d.heads;
      const int64_t h = unit % d.heads;
      const PackedHead keys = pack_head(k, b, h / d.group, d, 0, true, false);
      const PackedHead values = pack_head(v, b, h / d.group, d, 3, false, true);
      for (int64_t q0 = 0; q0 < d.seq; q0 += kTile)
        forward_tile(q, out, pl + unit * d.seq + q0, b, h, q0, keys, values, d);
    }
  });
}

namespace {

// What the backward's query tiles of one K/V head share: its packed keys
// and values, and its gradients transposed, dK^T and dV^T (hd, Tp), summed in
// F32 (transposed, the products that add to them need no transposed tiles).
struct HeadGrads {
  PackedHead keys, values;
  float* dk_t;
  float* dv_t;
};

// A query tile of x as the products need it: BF16 rows (qn, hde) for
// products over hd, and their transpose (hd, qne) for products over the
// tile's queries (column qn zero when qn is odd).
struct PackedTile {
  uint16_t* rows;
  uint16_t* cols;
};

PackedTile pack_tile(const Tensor& x, int64_t b, int64_t h, int64_t q0, int64_t qn, const Dims& d, int slot) {
  const int64_t qne = round_up(qn, 2);
  PackedTile p{scratch<uint16_t>(slot, kTile * d.hde), scratch<uint16_t>(slot + 1, d.hd * kTile)};
  pack_rows(x, b, h, q0, qn, qn, d, p.rows);
  for (int64_t i = 0; i < d.hd; ++i) {
    uint16_t* col = p.cols + i * qne;
    for (int64_t t = 0; t < qn; ++t) col[t] = p.rows[t * d.hde + i];
    if (qne > qn) col[qn] = 0;
  }
  return p;
}

// dK^T or dV^T (hd, ld) into positions [0, n) of head `head` of batch row b
// of x, rounded once when x is BF16.
void store_transposed(const float* src_t, int64_t ld, const Tensor& x, int64_t b, int64_t head, int64_t n,
                      const Dims& d) {
  constexpr int64_t kBlock = 16;  // positions per transposed block
  float* block = scratch<float>(8, kBlock * d.hdp);
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    const int64_t tn = std::min(kBlock, n - t0);
    for (int64_t i = 0; i < d.hd; ++i) {
      const float* col = src_t + i * ld + t0;
      for (int64_t t = 0; t < tn; ++t) block[t * d.hdp + i] = col[t];
    }
    store_rows(block, d.hdp, x, b, head, t0, tn, d);
  }
}

// rowsum(dO o O) of the tile's queries, in F32 from the stored values.
void tile_delta(const Tensor& dout, const Tensor& out, int64_t b, int64_t h, int64_t q0, int64_t qn, const Dims& d,
                float* delta) {
  float* o_row = scratch<float>(6, d.hd);
  float* do_row = scratch<float>(7, d.hd);
  const Tensor* sources[2] = {&out, &dout};
  float* rows[2] = {o_row, do_row};
  for (int64_t t = 0; t < qn; ++t) {
    const int64_t offset = ((b * d.seq + q0 + t) * d.heads + h) * d.hd;
    for (int i = 0; i < 2; ++i) {
      const Tensor& x = *sources[i];
      if (x.dtype() == DType::F32) {
        std::memcpy(rows[i], x.data<float>() + offset, static_cast<size_t>(d.hd) * sizeof(float));
      } else {
        const BFloat16* xs = x.data<BFloat16>() + offset;
#pragma omp simd
        for (int64_t e = 0; e < d.hd; ++e) rows[i][e] = vec::widen(xs[e].bits);
      }
    }
    delta[t] = vec::lane_sum(d.hd, [o_row, do_row](int64_t e) { return do_row[e] * o_row[e]; });
  }
}

// P = exp(scale s - lse) and dS = scale P o (dP - delta) of one tile pair,
// from the scores s and dP (qn, lds), as BF16: dS in rows (qn, kne) for dQ,
// and both in pairs down the queries (qne/2, 2 knp) for dK^T and dV^T.
// Masked entries and padding are 0.
struct TileTerms {
  uint16_t* ds;       // (qne, kne) rows
  uint16_t* p;        // (qne, kne) rows
  uint16_t* ds_down;  // (qne/2, 2 knp)
  uint16_t* p_down;   // (qne/2, 2 knp)
};

void tile_terms(const float* s, const float* dp, int64_t lds, const float* lse_rows, const float* delta, int64_t q0,
                int64_t qn, int64_t k0, int64_t kn, const Dims& d, const TileTerms& terms) {
  const int64_t qne = round_up(qn, 2);
  const int64_t kne = round_up(kn, 2);
  for (int64_t t = 0; t < qn; ++t) {
    const int64_t visible = visible_keys(q0 + t, k0, kn);
    const float row_lse = lse_rows[t];
    const float row_delta = delta[t];
    const float* s_row = s + t * lds;
    const float* dp_row = dp + t * lds;
    uint16_t* ds_row = terms.ds + t * kne;
    uint16_t* p_row = terms.p + t * kne;
#pragma omp simd
    for (int64_t j = 0; j < kne; ++j) {
      const float p = j < visible ? vec::exp_f32(s_row[j] * d.scale - row_lse) : 0.0f;
      ds_row[j] = vec::narrow(j < visible ? d.scale * p * (dp_row[j] - row_delta) : 0.0f);
      p_row[j] = vec::narrow(p);
    }
  }
  if (qne > qn) {
    std::fill_n(terms.ds + qn * kne, kne, uint16_t{0});
    std::fill_n(terms.p + qn * kne, kne, uint16_t{0});
  }
  const int64_t knp = round_up(kn, 16);
  pairs_down(terms.ds, qne, kne, terms.ds_down, 2 * knp);
  pairs_down(terms.p, qne, kne, terms.p_down, 2 * knp);
}

// Query tile q0 of head h: writes its dq rows and adds its part of dK^T, dV^T.
void backward_tile(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& dq, const float* lse_rows,
                   int64_t b, int64_t h, int64_t q0, const HeadGrads& head, const Dims& d) {
  const int64_t qn = std::min(kTile, d.seq - q0);
  const int64_t qne = round_up(qn, 2);
  const int64_t tp = head.keys.padded;
  const PackedTile qt = pack_tile(q, b, h, q0, qn, d, 6);
  const PackedTile dot_tile = pack_tile(dout, b, h, q0, qn, d, 8);
  const TileTerms terms{scratch<uint16_t>(10, kTile * kTile), scratch<uint16_t>(11, kTile * kTile),
                        scratch<uint16_t>(12, kTile * kTile), scratch<uint16_t>(13, kTile * kTile)};
  float* s = scratch<float>(0, kTile * kTile);   // (qn, knp) scores
  float* dp = scratch<float>(1, kTile * kTile);  // (qn, knp) dO V^T
  float* delta = scratch<float>(2, kTile);
  float* dqb = scratch<float>(3, kTile * d.hdp);  // (qn, hdp)
  tile_delta(dout, out, b, h, q0, qn, d, delta);
  std::fill_n(dqb, qn * d.hdp, 0.0f);
  for (int64_t k0 = 0; k0 < q0 + qn; k0 += kTile) {
    const int64_t kn = std::min(kTile, d.seq - k0);
    const int64_t knp = round_up(kn, 16);
    const int64_t kne = round_up(kn, 2);
    dot({qt.rows, d.hde}, qn, across_at(head.keys, k0), knp, d.hde / 2, s, knp, false);
    dot({dot_tile.rows, d.hde}, qn, across_at(head.values, k0), knp, d.hde / 2, dp, knp, false);
    tile_terms(s, dp, knp, lse_rows, delta, q0, qn, k0, kn, d, terms);
    dot({terms.ds, kne}, qn, down_at(head.keys, k0, d), d.hdp, kne / 2, dqb, d.hdp, true);
    dot({qt.cols, qne}, d.hd, {terms.ds_down, 2 * knp}, knp, qne / 2, head.dk_t + k0, tp, true);
    dot({dot_tile.cols, qne}, d.hd, {terms.p_down, 2 * knp}, knp, qne / 2, head.dv_t + k0, tp, true);
  }
  store_rows(dqb, d.hdp, dq, b, h, q0, qn, d);
}

}  // namespace

void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const Dims d = dims_of(q, k);
  const float* pl = lse.data<float>();  // (B, H, T)
  parallel_for(d.batch * d.kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / d.kv_heads;
      const int64_t g = unit % d.kv_heads;
      HeadGrads head{pack_head(k, b, g, d, 0, true, true), pack_head(v, b, g, d, 3, true, false), nullptr, nullptr};
      const int64_t tp = head.keys.padded;
      head.dk_t = scratch<float>(4, d.hd * tp);
      head.dv_t = scratch<float>(5, d.hd * tp);
      std::fill_n(head.dk_t, d.hd * tp, 0.0f);
      std::fill_n(head.dv_t, d.hd * tp, 0.0f);
      // Query heads, then query tiles, in ascending order: a fixed summation order for dK, dV.
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
        for (int64_t q0 = 0; q0 < d.seq; q0 += kTile)
          backward_tile(dout, q, out, dq, pl + (b * d.heads + h) * d.seq + q0, b, h, q0, head, d);
      }
      store_transposed(head.dk_t, tp, dk, b, g, d.seq, d);
      store_transposed(head.dv_t, tp, dv, b, g, d.seq, d);
    }
  });
}

}  // namespace st::cpu
