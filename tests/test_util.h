#pragma once
// Helpers shared by the GoogleTest files.
#include <algorithm>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace st::test {

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

}  // namespace st::test
