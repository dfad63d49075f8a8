#pragma once
// CRC32C (Castagnoli) of checkpoint bytes. Checkpoints record one per tensor
// so `ckpt verify` and the loader can detect a torn or bit-rotted file without
// trusting the filesystem.
#include <cstddef>
#include <cstdint>
#include <span>

namespace st::checkpoint {

/// CRC32C of `data`, continuing from `crc` (the result of a previous call, or 0
/// to start): crc32c(b, crc32c(a)) == crc32c(a ++ b). Uses the SSE4.2 crc32
/// instruction when the CPU has it, otherwise crc32c_software.
uint32_t crc32c(std::span<const std::byte> data, uint32_t crc = 0);

/// Portable slicing-by-8 implementation; same results as crc32c.
uint32_t crc32c_software(std::span<const std::byte> data, uint32_t crc = 0);

/// True when this build and CPU can run crc32c_hardware.
bool crc32c_hardware_available();

/// SSE4.2 implementation; throws st::Error unless crc32c_hardware_available().
uint32_t crc32c_hardware(std::span<const std::byte> data, uint32_t crc = 0);

}  // namespace st::checkpoint
