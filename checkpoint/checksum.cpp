#include "checkpoint/checksum.h"

#include <array>
#include <bit>
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

#if defined(__x86_64__)
// Compiled for SSE4.2 regardless of the global -march so one binary runs on
// any x86-64 and picks this path only after the runtime check.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const std::byte* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
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
  [[maybe_unused]] static const bool hardware = crc32c_hardware_available();
#if defined(__x86_64__)
  if (hardware) return crc32c_sse42(data.data(), data.size(), crc);
#endif
  return crc32c_software(data, crc);
}

}  // namespace st::checkpoint
