#pragma once
// Hashing for counter-based randomness (parameter init, synthetic data,
// benchmark values): the same inputs give the same bits on every rank and
// every run, with no sequential state.
#include <cstdint>

namespace st {

/// splitmix64 (Steele, Lea and Flood): a bijection on 64-bit words with full
/// avalanche, whose outputs pass BigCrush even for consecutive inputs.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace st
