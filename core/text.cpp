#include "core/text.h"

#include <cstddef>

namespace st {

namespace {

/// What a lead byte says: the sequence length and, for the bytes after it,
/// the range the second byte must fall in (that range is what excludes
/// overlongs, surrogates and code points past U+10FFFF). Length 0: no lead.
struct Lead {
  size_t length = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
};

Lead lead_of(unsigned char c) {
  if (c < 0x80) return {1};
  if (c >= 0xC2 && c <= 0xDF) return {2};
  if (c == 0xE0) return {3, 0xA0, 0xBF};  // below 0xA0: overlong
  if (c == 0xED) return {3, 0x80, 0x9F};  // above 0x9F: a surrogate
  if (c >= 0xE1 && c <= 0xEF) return {3};
  if (c == 0xF0) return {4, 0x90, 0xBF};  // below 0x90: overlong
  if (c >= 0xF1 && c <= 0xF3) return {4};
  if (c == 0xF4) return {4, 0x80, 0x8F};  // above 0x8F: past U+10FFFF
  return {0};                             // a continuation byte, 0xC0/0xC1 or 0xF5..0xFF
}

}  // namespace

int64_t find_invalid_utf8(std::string_view bytes, Utf8End end) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    const Lead lead = lead_of(b[i]);
    if (lead.length == 0) return static_cast<int64_t>(i);
    for (size_t k = 1; k < lead.length; ++k) {
      if (i + k == n) return end == Utf8End::MayBeCut ? -1 : static_cast<int64_t>(i);
      const unsigned char lo = k == 1 ? lead.second_min : 0x80;
      const unsigned char hi = k == 1 ? lead.second_max : 0xBF;
      if (b[i + k] < lo || b[i + k] > hi) return static_cast<int64_t>(i);
    }
    i += lead.length;
  }
  return -1;
}

}  // namespace st
