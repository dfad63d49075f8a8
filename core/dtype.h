#pragma once
// Element types. Names are the safetensors dtype strings, so a checkpoint
// header can be written and parsed without a translation table elsewhere.
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ostream>
#include <string_view>

namespace st {

enum class DType : uint8_t { F32, BF16, I32 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : 4; }
/// safetensors name: "F32", "BF16", "I32".
std::string_view dtype_name(DType t);
/// Inverse of dtype_name; nullopt for any other string.
std::optional<DType> dtype_from_name(std::string_view name);
std::ostream& operator<<(std::ostream& os, DType t);

/// F32 -> BF16 bits, round to nearest even; NaN stays NaN (quiet), Inf stays Inf.
constexpr uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // Adding 0x7fff plus the lowest kept bit rounds ties to even; an overflow
  // of the mantissa carries into the exponent, which is the correct result
  // (up to Inf for values that round past the largest finite BF16).
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

/// BF16 bits -> F32 (exact).
constexpr float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

/// A BF16 value: storage is the upper 16 bits of an IEEE F32.
struct BFloat16 {
  uint16_t bits = 0;

  constexpr BFloat16() = default;
  constexpr explicit BFloat16(float f) : bits(f32_to_bf16_bits(f)) {}
  static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 v;
    v.bits = b;
    return v;
  }
  constexpr operator float() const { return bf16_bits_to_f32(bits); }
};
static_assert(sizeof(BFloat16) == 2);

/// Rounds an F32 value through BF16 and back.
constexpr float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

/// Maps a C++ element type to its DType (float, BFloat16, int32_t).
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

}  // namespace st
