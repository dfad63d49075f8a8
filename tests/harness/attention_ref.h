#pragma once
// Attention references shared by the CPU and CUDA op tests: naive causal
// attention in double, and the bound within which BF16 attention (BF16 tile
// products with F32 accumulation, core/cpu/attention_bf16.h and the CUDA
// kernels) may sit from the F32 op on the same inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace st::test {

using Vec = std::vector<double>;

// q [b, t, h, hd]; k, v [b, tk, kv, hd] with tk = t unless given (a KV
// cache: the queries are the last t of tk positions).
struct AttnShape {
  int64_t b, t, h, kv, hd;
  int64_t tk = 0;
  int64_t keys() const { return tk > 0 ? tk : t; }
};

inline void PrintTo(const AttnShape& d, std::ostream* os) {
  *os << "B=" << d.b << " T=" << d.t << " H=" << d.h << " KV=" << d.kv << " hd=" << d.hd;
}

struct AttnRef {
  Vec out, lse;
};

// Naive causal softmax attention: head h reads K/V head h / (H / KV), query t
// sits at position tk - t + t and sees the keys up to it.
inline AttnRef attention_ref(const Vec& q, const Vec& k, const Vec& v, const AttnShape& d) {
  AttnRef r{Vec(q.size()), Vec(static_cast<size_t>(d.b * d.h * d.t))};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  const int64_t group = d.h / d.kv;
  const int64_t tk = d.keys();
  Vec scores(static_cast<size_t>(tk));
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.h; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < d.t; ++t) {
        const double* qt = &q[((b * d.t + t) * d.h + h) * d.hd];
        const int64_t pos = tk - d.t + t;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= pos; ++s) {
          const double* ks = &k[((b * tk + s) * d.kv + g) * d.hd];
          double acc = 0.0;
          for (int64_t i = 0; i < d.hd; ++i) acc += qt[i] * ks[i];
          scores[s] = acc * scale;
          m = std::max(m, scores[s]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s <= pos; ++s) sum += std::exp(scores[s] - m);
        const double lse = m + std::log(sum);
        r.lse[(b * d.h + h) * d.t + t] = lse;
        double* ot = &r.out[((b * d.t + t) * d.h + h) * d.hd];
        for (int64_t s = 0; s <= pos; ++s) {
          const double p = std::exp(scores[s] - lse);
          const double* vs = &v[((b * tk + s) * d.kv + g) * d.hd];
          for (int64_t i = 0; i < d.hd; ++i) ot[i] += p * vs[i];
        }
      }
    }
  return r;
}

// Spacing of BF16 values at |x| (the ulp of the binade x lies in).
inline double bf16_spacing(double x) {
  if (x == 0.0) return std::ldexp(1.0, -133);
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, -126) - 7);
}

// How far BF16 attention may sit from the F32 op on the same BF16 inputs.
// Tile products take BF16 operands with F32 accumulation, so the only
// roundings beyond F32 are P and dS, each rounded once to BF16 (relative
// error <= 2^-9) where it enters a product. An output element that sums
// terms P_ts x_s (or dS_ts x) may therefore move by 2^-9 sum |P_ts x_s|;
// the bound below doubles that for the F32 rounding around it, and adds one
// ulp of the output's own rounding. Terms come from a double reference.
struct AttnBounds {
  Vec out, dq, dk, dv;  // 2^-8 sum |P x| (or |dS x|) per element; dq, dk, dv for tk == t
};

inline AttnBounds attention_bf16_bounds(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, const AttnShape& d) {
  const AttnRef ref = attention_ref(q, k, v, d);
  AttnBounds r{Vec(q.size()), Vec(q.size()), Vec(k.size()), Vec(k.size())};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  const double u = std::ldexp(1.0, -8);
  const int64_t group = d.h / d.kv;
  const int64_t tk = d.keys();
  auto row = [&d](int64_t b, int64_t t, int64_t len, int64_t heads, int64_t head) {
    return ((b * len + t) * heads + head) * d.hd;
  };
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.h; ++h)
      for (int64_t t = 0; t < d.t; ++t) {
        const int64_t qt = row(b, t, d.t, d.h, h);
        double delta = 0.0;
        for (int64_t i = 0; i < d.hd; ++i) delta += dout[qt + i] * ref.out[qt + i];
        for (int64_t s = 0; s <= tk - d.t + t; ++s) {
          const int64_t ks = row(b, s, tk, d.kv, h / group);
          double score = 0.0, dp = 0.0;
          for (int64_t i = 0; i < d.hd; ++i) {
            score += q[qt + i] * k[ks + i];
            dp += dout[qt + i] * v[ks + i];
          }
          const double p = std::exp(score * scale - ref.lse[(b * d.h + h) * d.t + t]);
          const double ds = std::fabs(scale * p * (dp - delta));
          for (int64_t i = 0; i < d.hd; ++i) {
            r.out[qt + i] += u * p * std::fabs(v[ks + i]);
            r.dv[ks + i] += u * p * std::fabs(dout[qt + i]);
            r.dq[qt + i] += u * ds * std::fabs(k[ks + i]);
            r.dk[ks + i] += u * ds * std::fabs(q[qt + i]);
          }
        }
      }
  return r;
}

// Each element of a BF16 result is within one BF16 ulp plus its bound of the
// F32 result (the first one outside is reported, with the count).
inline void expect_within_bound(const char* what, const Tensor& bf16, const Tensor& f32, const Vec& bound) {
  const std::vector<float> got = bf16.to_floats();
  const std::vector<float> want = f32.to_floats();
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.size(), bound.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = bf16_spacing(want[i]) + bound[i];
    if (std::fabs(got[i] - want[i]) > allowed) {
      if (bad == 0)
        ADD_FAILURE() << what << "[" << i << "]: BF16 " << got[i] << " vs F32 " << want[i] << ", allowed " << allowed;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements outside the BF16 bound";
}

}  // namespace st::test
