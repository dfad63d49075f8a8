#pragma once
// CRC32C (Castagnoli) of checkpoint bytes. Checkpoints record one per tensor
// so `ckpt verify` and the loader can detect a torn or bit-rotted file without
// trusting the filesystem.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"

namespace st::checkpoint {

/// CRC32C of `data`, continuing from `crc` (the result of a previous call, or 0
/// to start): crc32c(b, crc32c(a)) == crc32c(a ++ b). Uses the SSE4.2 crc32
/// instruction when the CPU has it, otherwise crc32c_software.
uint32_t crc32c(std::span<const std::byte> data, uint32_t crc = 0);

/// The CRC32C of a ++ b from crc_a = crc32c(a), crc_b = crc32c(b) and b's
/// length, in O(log len_b): pieces checksummed apart (by several threads or
/// ranks) give the checksum of the whole tensor they tile.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/// Portable slicing-by-8 implementation; same results as crc32c.
uint32_t crc32c_software(std::span<const std::byte> data, uint32_t crc = 0);

/// True when this build and CPU can run crc32c_hardware.
bool crc32c_hardware_available();

/// SSE4.2 implementation; throws st::Error unless crc32c_hardware_available().
uint32_t crc32c_hardware(std::span<const std::byte> data, uint32_t crc = 0);

/// A CRC32C as every message prints it: "0x" and 8 lowercase hex digits
/// (0x1a2b3c4d), the one spelling of the trainer, `ckpt` and `generate`.
std::string crc_text(uint32_t crc);

/// Non-finite elements of F32 or BF16 data (I32 has none).
struct NonFinite {
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t first = -1;  // element index of the first non-finite element; -1 when there is none
  bool any() const { return first >= 0; }
};

/// The CRC32C of a tensor's bytes and its non-finite elements.
struct TensorScan {
  uint32_t crc32c = 0;
  NonFinite nonfinite;
};

/// CRC32C of `data` (elements of `dtype`) and its non-finite elements, in one
/// pass: the data is walked in blocks that stay in cache, each checksummed and
/// then counted, so checking for NaN/Inf reads no byte from memory twice.
/// `data.size()` must be a multiple of the element size.
/// Element indices in `nonfinite` start at `first_index`.
TensorScan crc32c_and_scan(std::span<const std::byte> data, DType dtype, uint32_t crc = 0, int64_t first_index = 0);

/// Non-finite elements of `data` alone (no checksum); element indices start at `first_index`.
NonFinite count_nonfinite(std::span<const std::byte> data, DType dtype, int64_t first_index = 0);

}  // namespace st::checkpoint
