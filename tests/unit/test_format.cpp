// core/format.h: the numbers people read in log lines; core/error.h: what a
// program prints when it fails.
#include <stdexcept>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "core/cli.h"
#include "core/error.h"
#include "core/format.h"

namespace st {
namespace {

TEST(Format, WithCommasGroupsThousands) {
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(1234567), "1,234,567");
  EXPECT_EQ(with_commas(-999), "-999");
  EXPECT_EQ(with_commas(-12345), "-12,345");
  EXPECT_EQ(with_commas(-123456), "-123,456");
}

// A literal format with arguments from namespace std (which GCC 13's
// <format> made ambiguous with std::format) and a format held in a
// std::string give the same text.
TEST(Format, LiteralAndStringFormatsWithStdArguments) {
  const std::string name = "model.norm.weight";
  const std::string_view kind = "master";
  EXPECT_EQ(format("{} ({}) {:.2f}", name, kind, 1.5), "model.norm.weight (master) 1.50");
  const std::string fmt = "{} ({}) {:.2f}";
  EXPECT_EQ(format(fmt, name, kind, 1.5), "model.norm.weight (master) 1.50");
  EXPECT_EQ(format(std::string_view(fmt), name, kind, 1.5), "model.norm.weight (master) 1.50");
}

TEST(Format, HumanBytesUsesPowersOfAThousand) {
  EXPECT_EQ(human_bytes(812), "812 B");
  EXPECT_EQ(human_bytes(45300), "45.3 kB");
  EXPECT_EQ(human_bytes(12300000), "12.3 MB");
  EXPECT_EQ(human_bytes(1250000000), "1.25 GB");
  EXPECT_EQ(human_bytes(3100000000000), "3.10 TB");
}

TEST(RunMain, ReturnsTheBodysCodeAndTurnsExceptionsIntoOneLine) {
  EXPECT_EQ(run_main("prog", [] { return 7; }), 7);

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { ST_FAIL("bad value {} for '{}'", 3, "k"); }), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: bad value 3 for 'k'\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { throw std::runtime_error("boom"); }), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: internal error: boom\n");
}

}  // namespace
}  // namespace st
