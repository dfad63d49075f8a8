#pragma once
// Elementwise kernels of the NCCL backend (core/comm_nccl.cpp), which is a
// host-only C++ file. They give NCCL collectives the exactness contract of
// core/comm.h: BF16 sums travel in F32 and round once, Avg divides (x / n,
// as the MPI backend does), and Max runs on order-preserving integer keys so
// that NaN propagates. Each call launches on `stream` and returns once issued;
// n = 0 launches nothing. Pointers are device memory of the current GPU.
#include <cstdint>

#include <cuda_runtime_api.h>

namespace st::cuda {

/// dst[i] = src[i] (BF16 bits -> F32, exact).
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);
/// dst[i] = BF16(src[i] / divisor), rounded to nearest even once (NaN stays a
/// quiet NaN), bit for bit as f32_to_bf16_bits in core/dtype.h.
void f32_to_bf16_divided(const float* src, uint16_t* dst, int64_t n, float divisor, cudaStream_t stream);
/// x[i] = x[i] / divisor (IEEE division, not a multiply by 1/divisor).
void f32_divide(float* x, int64_t n, float divisor, cudaStream_t stream);

// Order-preserving keys for Max: an unsigned max over keys is the float max
// of the MPI backend. Every NaN maps to the largest key (so it wins) and
// comes back as the canonical quiet NaN; -0 maps just below +0 (so +0 wins).
/// keys[i] = key of src[i].
void f32_to_max_keys(const float* src, uint32_t* keys, int64_t n, cudaStream_t stream);
/// dst[i] = the F32 value of keys[i].
void max_keys_to_f32(const uint32_t* keys, float* dst, int64_t n, cudaStream_t stream);
/// keys[i] = key of the BF16 value src[i] (same key as its F32 value).
void bf16_to_max_keys(const uint16_t* src, uint32_t* keys, int64_t n, cudaStream_t stream);
/// dst[i] = the BF16 value of keys[i] (keys made by bf16_to_max_keys).
void max_keys_to_bf16(const uint32_t* keys, uint16_t* dst, int64_t n, cudaStream_t stream);

/// The host-side twins of the key maps, for tests and documentation.
constexpr uint32_t kMaxKeyNaN = 0xffffffffu;
constexpr uint32_t max_key_of_bits(uint32_t f32_bits) {
  if ((f32_bits & 0x7fffffffu) > 0x7f800000u) return kMaxKeyNaN;
  // Negative values: flipping every bit reverses their order and puts them
  // below all positives; positives: setting the sign bit lifts them above.
  return (f32_bits & 0x80000000u) != 0 ? ~f32_bits : f32_bits | 0x80000000u;
}
constexpr uint32_t bits_of_max_key(uint32_t key) {
  if (key == kMaxKeyNaN) return 0x7fc00000u;
  return (key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key;
}

}  // namespace st::cuda
