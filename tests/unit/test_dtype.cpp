// dtype names and F32 <-> BF16 conversion. Expected values come from the bit
// layout written out by hand or from a slow reference that rounds by
// comparing distances to the neighbouring BF16 values (long double), never
// from the conversion under test.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"

namespace {

using st::DType;

float f32_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

uint16_t to_bf16(uint32_t f32_bits) { return st::f32_to_bf16_bits(f32_from_bits(f32_bits)); }

// Magnitude of a 15-bit BF16 magnitude pattern, decoded from its fields. The
// pattern 0x7f80 (Inf) decodes to 2^128: the value the next exponent would
// have, which is what rounding past the largest finite BF16 compares against.
long double bf16_magnitude(uint32_t mag) {
  const int exponent = static_cast<int>(mag >> 7);
  const int mantissa = static_cast<int>(mag & 0x7f);
  if (exponent == 0) return std::ldexp(static_cast<long double>(mantissa), -126 - 7);
  return std::ldexp(static_cast<long double>(128 + mantissa), exponent - 127 - 7);
}

long double f32_magnitude(uint32_t mag) {
  const int exponent = static_cast<int>(mag >> 23);
  const uint32_t mantissa = mag & 0x7fffffu;
  if (exponent == 0) return std::ldexp(static_cast<long double>(mantissa), -126 - 23);
  return std::ldexp(static_cast<long double>((1u << 23) + mantissa), exponent - 127 - 23);
}

// Round to nearest, ties to even, for a finite or infinite (non-NaN) F32
// pattern: find the BF16 magnitudes on each side by binary search over the
// (monotonic) magnitude patterns, then compare distances exactly.
uint16_t reference_bf16(uint32_t f32_bits) {
  const uint32_t sign = f32_bits & 0x80000000u;
  const uint32_t mag = f32_bits & 0x7fffffffu;
  const uint16_t sign16 = sign ? 0x8000 : 0;
  if (mag == 0x7f800000u) return static_cast<uint16_t>(sign16 | 0x7f80);
  const long double x = f32_magnitude(mag);
  // Largest finite BF16 magnitude pattern lo with value(lo) <= x.
  uint32_t lo = 0;
  uint32_t hi_search = 0x7f7f;
  while (lo < hi_search) {
    uint32_t mid = (lo + hi_search + 1) / 2;
    if (bf16_magnitude(mid) <= x) {
      lo = mid;
    } else {
      hi_search = mid - 1;
    }
  }
  const uint32_t up = lo + 1;  // 0x7f80 (Inf) when lo is the largest finite value
  const long double below = x - bf16_magnitude(lo);
  const long double above = bf16_magnitude(up) - x;
  uint32_t chosen = lo;
  if (above < below || (above == below && (lo & 1u) != 0)) chosen = up;
  return static_cast<uint16_t>(sign16 | chosen);
}

bool is_bf16_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

TEST(DTypeNames, SafetensorsNames) {
  EXPECT_EQ(st::dtype_name(DType::F32), "F32");
  EXPECT_EQ(st::dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(st::dtype_name(DType::I32), "I32");
  std::ostringstream os;
  os << DType::BF16 << ',' << DType::I32;
  EXPECT_EQ(os.str(), "BF16,I32");
}

TEST(DTypeNames, FromNameRoundTrip) {
  for (DType t : {DType::F32, DType::BF16, DType::I32}) {
    auto parsed = st::dtype_from_name(st::dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << st::dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
}

TEST(DTypeNames, UnknownNamesAreRejected) {
  for (const char* name : {"", "f32", "bf16", "FP32", "F16", "F64", "I64", "BF16 ", " F32", "float"}) {
    EXPECT_FALSE(st::dtype_from_name(name).has_value()) << "'" << name << "'";
  }
}

TEST(DTypeNames, SizesAndTypeMapping) {
  EXPECT_EQ(st::dtype_size(DType::F32), 4u);
  EXPECT_EQ(st::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(st::dtype_size(DType::I32), 4u);
  static_assert(st::dtype_of_v<float> == DType::F32);
  static_assert(st::dtype_of_v<const st::BFloat16> == DType::BF16);
  static_assert(st::dtype_of_v<int32_t> == DType::I32);
}

TEST(BFloat16Rounding, ExactValuesKeepTheirBits) {
  EXPECT_EQ(to_bf16(0x3f800000u), 0x3f80);  // 1.0
  EXPECT_EQ(to_bf16(0xc0000000u), 0xc000);  // -2.0
  EXPECT_EQ(to_bf16(0x3e200000u), 0x3e20);  // 0.15625
  EXPECT_EQ(to_bf16(0x7f7f0000u), 0x7f7f);  // largest finite BF16
  EXPECT_EQ(to_bf16(0x00800000u), 0x0080);  // smallest normal F32 = smallest normal BF16
  EXPECT_EQ(st::BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(st::BFloat16::from_bits(0x4049)), 3.140625f);
  // The conversions are constexpr (usable for compile-time constants).
  static_assert(st::f32_to_bf16_bits(1.0f) == 0x3f80);
  static_assert(st::bf16_bits_to_f32(0xc000) == -2.0f);
  static_assert(st::BFloat16(0.5f).bits == 0x3f00);
}

TEST(BFloat16Rounding, TiesGoToEven) {
  // 1 + 2^-8 is halfway between 0x3f80 (even) and 0x3f81 (odd): down.
  EXPECT_EQ(to_bf16(0x3f808000u), 0x3f80);
  // Halfway between 0x3f81 (odd) and 0x3f82 (even): up.
  EXPECT_EQ(to_bf16(0x3f818000u), 0x3f82);
  // Same for negative values (the magnitude rounds, the sign stays).
  EXPECT_EQ(to_bf16(0xbf808000u), 0xbf80);
  EXPECT_EQ(to_bf16(0xbf818000u), 0xbf82);
  // One F32 ulp either side of a tie is no longer a tie.
  EXPECT_EQ(to_bf16(0x3f808001u), 0x3f81);
  EXPECT_EQ(to_bf16(0x3f807fffu), 0x3f80);
  EXPECT_EQ(to_bf16(0x3f818001u), 0x3f82);
  EXPECT_EQ(to_bf16(0x3f817fffu), 0x3f81);
  EXPECT_EQ(st::round_to_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(st::round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
}

TEST(BFloat16Rounding, CarryIntoExponent) {
  // 2 - 2^-23 rounds up to 2.0: the mantissa overflows into the exponent.
  EXPECT_EQ(to_bf16(0x3fffffffu), 0x4000);
  // Tie above 0x3fff (odd) also goes up to 2.0.
  EXPECT_EQ(to_bf16(0x3fff8000u), 0x4000);
  EXPECT_EQ(to_bf16(0xbfff8000u), 0xc000);
  // Below the tie it stays in the lower binade.
  EXPECT_EQ(to_bf16(0x3fff7fffu), 0x3fff);
}

TEST(BFloat16Rounding, OverflowToInfinity) {
  EXPECT_EQ(to_bf16(0x7f7fffffu), 0x7f80);  // FLT_MAX
  EXPECT_EQ(to_bf16(0xff7fffffu), 0xff80);  // -FLT_MAX
  EXPECT_EQ(to_bf16(0x7f7f8000u), 0x7f80);  // tie above the largest (odd) BF16
  EXPECT_EQ(to_bf16(0x7f7f7fffu), 0x7f7f);  // just below that tie
  EXPECT_EQ(to_bf16(0x7f7e8000u), 0x7f7e);  // tie above an even one stays
}

TEST(BFloat16Rounding, InfinitiesAndZeros) {
  EXPECT_EQ(to_bf16(0x7f800000u), 0x7f80);
  EXPECT_EQ(to_bf16(0xff800000u), 0xff80);
  EXPECT_EQ(to_bf16(0x00000000u), 0x0000);
  EXPECT_EQ(to_bf16(0x80000000u), 0x8000);
}

TEST(BFloat16Rounding, NaNStaysQuietNaNWithItsSign) {
  // Quiet NaN, signalling NaNs whose payload lives only in the dropped low
  // bits (truncation alone would turn them into Inf), and negative NaNs.
  for (uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    const uint16_t b = to_bf16(nan_bits);
    EXPECT_TRUE(is_bf16_nan(b)) << std::hex << nan_bits << " -> " << b;
    EXPECT_NE(b & 0x0040, 0) << "quiet bit, " << std::hex << nan_bits;
    EXPECT_EQ(b & 0x8000, (nan_bits >> 16) & 0x8000) << "sign, " << std::hex << nan_bits;
  }
  EXPECT_TRUE(std::isnan(st::round_to_bf16(std::nanf(""))));
}

TEST(BFloat16Rounding, DenormalInputs) {
  // F32 denormals that BF16 holds exactly (BF16 has the same exponent range).
  EXPECT_EQ(to_bf16(0x00010000u), 0x0001);  // smallest BF16 denormal, 2^-133
  EXPECT_EQ(to_bf16(0x00400000u), 0x0040);
  EXPECT_EQ(to_bf16(0x807f0000u), 0x807f);
  // Smallest F32 denormals round to (signed) zero.
  EXPECT_EQ(to_bf16(0x00000001u), 0x0000);
  EXPECT_EQ(to_bf16(0x80000001u), 0x8000);
  // Half the smallest BF16 denormal is a tie with zero (even): down.
  EXPECT_EQ(to_bf16(0x00008000u), 0x0000);
  EXPECT_EQ(to_bf16(0x00008001u), 0x0001);
  // Tie between 0x0001 (odd) and 0x0002: up.
  EXPECT_EQ(to_bf16(0x00018000u), 0x0002);
  // The largest F32 denormal rounds up to the smallest normal BF16.
  EXPECT_EQ(to_bf16(0x007fffffu), 0x0080);
  EXPECT_EQ(to_bf16(0x807fffffu), 0x8080);
}

TEST(BFloat16Rounding, ReferenceAgreesOnHandPickedCases) {
  // The slow reference must itself reproduce the hand-derived cases above,
  // or the sweeps below would prove nothing.
  EXPECT_EQ(reference_bf16(0x3f808000u), 0x3f80);
  EXPECT_EQ(reference_bf16(0x3f818000u), 0x3f82);
  EXPECT_EQ(reference_bf16(0x3fffffffu), 0x4000);
  EXPECT_EQ(reference_bf16(0x7f7f8000u), 0x7f80);
  EXPECT_EQ(reference_bf16(0x00008000u), 0x0000);
  EXPECT_EQ(reference_bf16(0x00018000u), 0x0002);
  EXPECT_EQ(reference_bf16(0x807fffffu), 0x8080);
}

TEST(BFloat16Rounding, MatchesReferenceAroundEveryTie) {
  // For every BF16 pattern, the F32 values at, just below and just above the
  // midpoint to the next pattern, plus the exact one and the last below it.
  int64_t wrong = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t bits = (hi << 16) | lo;
      if ((bits & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: tested separately
      if (to_bf16(bits) != reference_bf16(bits)) {
        if (++wrong <= 10)
          ADD_FAILURE() << "F32 bits 0x" << std::hex << bits << ": got 0x" << to_bf16(bits) << ", want 0x"
                        << reference_bf16(bits);
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(BFloat16Rounding, MatchesReferenceOnRandomPatterns) {
  std::mt19937 rng(20240611);
  int64_t wrong = 0;
  int64_t checked = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      EXPECT_TRUE(is_bf16_nan(to_bf16(bits))) << std::hex << bits;
      continue;
    }
    ++checked;
    if (to_bf16(bits) != reference_bf16(bits) && ++wrong <= 10) {
      ADD_FAILURE() << "F32 bits 0x" << std::hex << bits << ": got 0x" << to_bf16(bits) << ", want 0x"
                    << reference_bf16(bits);
    }
  }
  EXPECT_GT(checked, 1 << 19);
  EXPECT_EQ(wrong, 0);
}

TEST(BFloat16Rounding, EveryBf16PatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits16 = static_cast<uint16_t>(b);
    const float f = st::bf16_bits_to_f32(bits16);
    // Widening is exact: the pattern becomes the top half of the F32.
    ASSERT_EQ(bits_of(f), b << 16) << std::hex << b;
    const uint16_t back = st::f32_to_bf16_bits(f);
    if (is_bf16_nan(bits16)) {
      // NaNs come back quiet with sign and payload kept.
      EXPECT_EQ(back, bits16 | 0x0040) << std::hex << b;
    } else {
      EXPECT_EQ(back, bits16) << std::hex << b;
    }
  }
}

}  // namespace
