// A binary whose only test skips: the test main must report it as skipped
// (exit code 77), which the skip_mechanism CTest entry checks.
#include <gtest/gtest.h>

TEST(SkipMechanism, EveryTestSkips) { GTEST_SKIP() << "nothing to check here, on purpose"; }
