#pragma once
// Element helpers the CPU kernels share, written so that `#pragma omp simd`
// loops vectorise them (with -march=native: AVX-512/AVX2; portable builds get
// SSE2 or scalar code from the same source).
//
// Bit-exactness: a vectorised loop computes some elements in its vector body
// and some in a scalar remainder, and which ones depends on the operands'
// addresses. Every helper here therefore rounds identically in both: the
// conversions are integer arithmetic, and exp_f32 is a polynomial written
// with std::fma (one rounding per step, vector or scalar) instead of libm's
// expf, whose vector variant (libmvec) rounds differently from the scalar one.
// Sums that must not depend on addresses use LaneSum's explicit lanes, never an
// `omp simd reduction`, whose order follows the vector width and the peeling.
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace st::cpu::vec {

/// BF16 bits -> F32 (exact).
inline float widen(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
inline float widen(BFloat16 v) { return widen(v.bits); }

/// F32 -> BF16 bits, round to nearest even, NaN kept quiet: bit for bit
/// f32_to_bf16_bits, without the branch that keeps a loop from vectorising.
inline uint16_t narrow(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/// e^x in F32 to about 2 ulp. e^x = 2^n e^r with n = round(x / ln 2) and
/// |r| <= ln(2)/2 (reduced with a two-part ln 2), e^r by its Taylor series to
/// degree 7 (truncation below 1e-8 relative). Below -87 the result is 0 (no
/// denormals), above 88 it is +inf; NaN stays NaN.
inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float shifted = std::fma(xc, kLog2e, kRound);
  const float n = shifted - kRound;
  float r = std::fma(-n, kLn2Hi, xc);
  r = std::fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // n is in [-126, 127]: 2^n is a normal float built from its exponent bits.
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float result = p * std::bit_cast<float>(static_cast<uint32_t>(ni + 127) << 23);
  const float edge = x < -87.0f ? 0.0f : (x > 88.0f ? HUGE_VALF : result);
  return x != x ? x : edge;
}

/// Lanes of LaneSum: one AVX-512 register of floats.
constexpr int kLanes = 16;

/// Sum of term(i) for i < n in an order fixed by n alone: kLanes interleaved
/// partial sums (independent adds, which vectorise), then the remainder, then
/// the lanes in a fixed pairwise tree.
template <class Term>
float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += term(i);
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0] + tail;
}

}  // namespace st::cpu::vec
