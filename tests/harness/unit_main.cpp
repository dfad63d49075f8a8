// main() of the single-process test binaries: GoogleTest's, except that a
// binary in which every selected test was skipped (CUDA tests without a GPU)
// exits kSkippedExitCode, which CTest reports as "Skipped" (SKIP_RETURN_CODE)
// rather than "Passed": no CTest entry passes having asserted nothing.
#include <gtest/gtest.h>

#include "tests/harness/test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  return st::test::all_skipped(*::testing::UnitTest::GetInstance()) && rc == 0 ? st::test::kSkippedExitCode : rc;
}
