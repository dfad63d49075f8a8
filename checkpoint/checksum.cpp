#include "checkpoint/checksum.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>

#include "core/error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace st::checkpoint {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reflected

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// tables[k][b] is the CRC of byte b followed by k zero bytes, which lets the
// software path fold eight input bytes per step with independent lookups.
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

uint64_t load_le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// ---- Combining checksums ---------------------------------------------------------
//
// CRC32C is linear over GF(2): crc(a ++ b) = crc(a) * x^(8 |b|) mod P xor
// crc(b), with polynomials in the reflected bit order of the CRC (the
// highest bit stands for x^0). The shift by x^(8 |b|) is one product with a
// power of x built from the squares x^(2^k) by the binary digits of |b|.

namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;
constexpr uint32_t kOne = 0x80000000u;  // the polynomial 1

// a * b mod P.
constexpr uint32_t multiply_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = kOne; bit != 0; bit >>= 1) {
    if ((a & bit) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ kPolyReflected : b >> 1;  // b *= x
  }
  return product;
}

struct PowerTable {
  std::array<uint32_t, 64> x_pow_2k{};  // x^(2^k) mod P
};

constexpr PowerTable make_powers() {
  PowerTable t;
  t.x_pow_2k[0] = kOne >> 1;  // x
  for (size_t k = 1; k < t.x_pow_2k.size(); ++k) t.x_pow_2k[k] = multiply_mod(t.x_pow_2k[k - 1], t.x_pow_2k[k - 1]);
  return t;
}

constexpr PowerTable kPowers = make_powers();

// x^(8 n) mod P: what the register is multiplied by when n zero bytes pass.
constexpr uint32_t shift_by_bytes(uint64_t n) {
  uint32_t shift = kOne;
  for (size_t k = 3; n != 0; n >>= 1, ++k)
    if ((n & 1u) != 0) shift = multiply_mod(kPowers.x_pow_2k[k], shift);
  return shift;
}

}  // namespace

#if defined(__x86_64__)
// Compiled for SSE4.2 regardless of the global -march so one binary runs on
// any x86-64 and picks this path only after the runtime check.
// The crc32 instruction takes 3 cycles but can start one every cycle, so a
// single chain of them runs at a third of the possible speed. Three lanes of
// kLane bytes are checksummed side by side from register 0 and joined:
// passing kLane bytes through the register multiplies what it held by
// x^(8 kLane) (shift_by_bytes), and the rest adds linearly.
constexpr size_t kLane = 8192;
constexpr uint32_t kLaneShift = shift_by_bytes(kLane);

__attribute__((target("sse4.2"))) uint64_t crc32c_lane(const std::byte* p, size_t n, uint64_t c) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const std::byte* p, size_t n, uint32_t crc) {
  uint64_t c = static_cast<uint32_t>(~crc);
  for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kLane + i, 8);
      std::memcpy(&v2, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    const uint32_t joined = multiply_mod(kLaneShift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = multiply_mod(kLaneShift, joined) ^ static_cast<uint32_t>(c2);
  }
  c = crc32c_lane(p, n & ~size_t{7}, c);
  p += n & ~size_t{7};
  n &= 7;
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*p));
  return ~c32;
}
#endif

}  // namespace

uint32_t crc32c_software(std::span<const std::byte> data, uint32_t crc) {
  const std::byte* p = data.data();
  size_t n = data.size();
  uint32_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v = load_le64(p) ^ c;
    c = kTables[7][v & 0xffu] ^ kTables[6][(v >> 8) & 0xffu] ^ kTables[5][(v >> 16) & 0xffu] ^
        kTables[4][(v >> 24) & 0xffu] ^ kTables[3][(v >> 32) & 0xffu] ^ kTables[2][(v >> 40) & 0xffu] ^
        kTables[1][(v >> 48) & 0xffu] ^ kTables[0][v >> 56];
  }
  for (; n > 0; ++p, --n) c = (c >> 8) ^ kTables[0][(c ^ static_cast<uint8_t>(*p)) & 0xffu];
  return ~c;
}

bool crc32c_hardware_available() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t crc32c_hardware(std::span<const std::byte> data, uint32_t crc) {
  ST_CHECK(crc32c_hardware_available(), "crc32c_hardware: this CPU or build has no SSE4.2 crc32 instruction");
#if defined(__x86_64__)
  return crc32c_sse42(data.data(), data.size(), crc);
#else
  return crc;  // unreachable: the check above throws
#endif
}

uint32_t crc32c(std::span<const std::byte> data, uint32_t crc) {
  // The CPU cannot change under a running process, so decide once.
  [[maybe_unused]] static const bool kHardware = crc32c_hardware_available();
#if defined(__x86_64__)
  if (kHardware) return crc32c_sse42(data.data(), data.size(), crc);
#endif
  return crc32c_software(data, crc);
}

namespace {

// Exponent all ones: Inf when the mantissa is zero, NaN otherwise.
template <class Bits, Bits kExponent, Bits kMantissa>
NonFinite count_bits(const std::byte* p, size_t n, int64_t first_index) {
  NonFinite out;
  // A branch-free count first (it vectorises), the detail only when something is there.
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    bad += (b & kExponent) == kExponent;
  }
  if (bad == 0) return out;
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    if ((b & kExponent) != kExponent) continue;
    if (out.first < 0) out.first = first_index + static_cast<int64_t>(i);
    ((b & kMantissa) != 0 ? out.nan : out.inf) += 1;
  }
  return out;
}

void merge(NonFinite& total, const NonFinite& part) {
  if (total.first < 0) total.first = part.first;
  total.nan += part.nan;
  total.inf += part.inf;
}

}  // namespace

NonFinite count_nonfinite(std::span<const std::byte> data, DType dtype, int64_t first_index) {
  ST_CHECK(data.size() % dtype_size(dtype) == 0, "count_nonfinite: {} bytes is not a whole number of {} elements",
           data.size(), dtype);
  const size_t n = data.size() / dtype_size(dtype);
  switch (dtype) {
    case DType::F32: return count_bits<uint32_t, 0x7f800000u, 0x007fffffu>(data.data(), n, first_index);
    case DType::BF16: return count_bits<uint16_t, uint16_t{0x7f80}, uint16_t{0x007f}>(data.data(), n, first_index);
    case DType::I32: return {};
  }
  return {};
}

namespace {

// 64 KiB: checksummed, then counted while it is still in L2.
constexpr size_t kScanBlock = size_t{64} << 10;
static_assert(kScanBlock % 4 == 0);

void scan_block(std::span<const std::byte> block, DType dtype, size_t at, TensorScan& out, int64_t first_index) {
  out.crc32c = crc32c(block, out.crc32c);
  merge(out.nonfinite, count_nonfinite(block, dtype, first_index + static_cast<int64_t>(at / dtype_size(dtype))));
}

}  // namespace

TensorScan crc32c_and_scan(std::span<const std::byte> data, DType dtype, uint32_t crc, int64_t first_index) {
  TensorScan out{crc, {}};
  for (size_t at = 0; at < data.size(); at += kScanBlock)
    scan_block(data.subspan(at, std::min(kScanBlock, data.size() - at)), dtype, at, out, first_index);
  return out;
}

std::string crc_text(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", crc);
  return buf;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // x^(8 len_b) = product of x^(2^(k+3)) over the set bits k of len_b.
  return multiply_mod(shift_by_bytes(len_b), crc_a) ^ crc_b;
}

}  // namespace st::checkpoint
