#pragma once
// Text checks shared by every reader of user text: one UTF-8 validator, strict
// (RFC 3629): overlong forms, surrogates (U+D800..U+DFFF) and code points past
// U+10FFFF are invalid, so one string has one spelling. checkpoint/ checks
// tensor names and safetensors headers with it; prepare decides which input
// files are text.
#include <cstdint>
#include <string_view>

namespace st {

/// Whether the end of the bytes may cut the last sequence short (a sample
/// taken from the start of a file) or must end on a whole character.
enum class Utf8End : uint8_t { Complete, MayBeCut };

/// Offset of the first byte that starts an invalid UTF-8 sequence, or -1 when
/// `bytes` is valid. With Utf8End::MayBeCut a valid prefix of a sequence at
/// the very end is accepted.
int64_t find_invalid_utf8(std::string_view bytes, Utf8End end = Utf8End::Complete);

}  // namespace st
