#pragma once
// Helpers shared by the GoogleTest files.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace st::test {

/// Exit code of a test binary in which every test that ran was skipped;
/// tests/CMakeLists.txt maps it to CTest's "Skipped" (SKIP_RETURN_CODE).
inline constexpr int kSkippedExitCode = 77;

/// True when tests ran and every one of them was skipped (asserted nothing).
inline bool all_skipped(const ::testing::UnitTest& unit) {
  return unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count();
}

/// The message of the st::Error that `fn` throws; records a test failure and
/// returns "" when it throws none.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected an st::Error";
  return {};
}

/// Elements of `got` whose bits differ from `want` (nccl-tests' "wrong"
/// count); a size or dtype mismatch counts every element as wrong.
inline int64_t count_wrong(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel() || got.dtype() != want.dtype()) return std::max(got.numel(), want.numel()) + 1;
  const size_t width = dtype_size(got.dtype());
  const auto* g = static_cast<const unsigned char*>(got.raw_data());
  const auto* w = static_cast<const unsigned char*>(want.raw_data());
  int64_t wrong = 0;
  for (int64_t i = 0; i < got.numel(); ++i) wrong += std::memcmp(g + i * width, w + i * width, width) != 0;
  return wrong;
}

/// The value that stands for `id` in `dtype` (collective tests on crafted
/// inputs): exact for ids below 2^24 in F32 and I32; BF16 takes the bit
/// pattern 0x3c00 + id % 0x3000, a normal number, distinct for ids below 12288.
inline Tensor ids(DType dtype, int64_t n, const std::function<int64_t(int64_t)>& id_of) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = id_of(i);
    switch (dtype) {
      case DType::F32: t.data<float>()[i] = static_cast<float>(id); break;
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(id); break;
      case DType::BF16: t.data<BFloat16>()[i] = BFloat16::from_bits(static_cast<uint16_t>(0x3c00 + id % 0x3000)); break;
    }
  }
  return t;
}

/// A 1-D CPU tensor of `dtype` holding `values` (rounded once for BF16).
inline Tensor floats(const std::vector<float>& values, DType dtype) {
  return Tensor::from_floats(values, {static_cast<int64_t>(values.size())}, dtype);
}

/// Normal values with a fixed seed, at least `min_abs` away from zero (never
/// zero, both signs): inputs for comparing an op against its reference.
inline std::vector<float> random_floats(int64_t n, uint32_t seed, float stddev = 1.0f, float min_abs = 1e-3f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = dist(rng);
    if (std::fabs(x) < min_abs) x = std::copysign(min_abs, x);
  }
  return v;
}

/// Rank r's contribution to element j (0..4) of the BF16 rounding tests of
/// the collectives. Every value and every F32 sum is exact; rounding each
/// partial sum to BF16 would lose the small terms (256 + 1 -> 256,
/// 1 + 2^-8 -> 1), and rounding the sum before dividing by 3 would move
/// element 4's average (1.359375 -> 1.3515625). At world size 1 the sum is
/// the input itself.
inline float rounding_input(int r, int64_t j) {
  switch (j) {
    case 0: return r == 0 ? 256.0f : 1.0f;
    case 1: return r == 0 ? 1.0f : 0.00390625f;  // 2^-8
    case 2: return 1.0078125f;                   // 1 + 2^-7
    case 3: return r == 0 ? -512.0f : 3.0f;
    default: return r == 0 ? 1.0f : 1.5390625f;
  }
}

}  // namespace st::test
