#pragma once
// Helpers shared by the GoogleTest files.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

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

}  // namespace st::test
