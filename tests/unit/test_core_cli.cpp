// core/cli.h: the one command-line parser and run_main of every program.
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cli.h"

namespace st::cli {
namespace {

/// A program with one flag of every kind.
struct Args {
  std::string out;
  std::optional<std::string> prompt;
  int64_t steps = 0;
  int threads = 0;
  double fraction = 0;
  bool json = false;
  std::vector<std::string> sets;
  std::vector<std::string> inputs;
};

Parser parser_of(Args& a) {
  Parser p("prog", "prog INPUT... -o OUT [options]");
  p.text("Does a thing.\n")
      .option("-o, --out", "OUT", &a.out, "the file to write")
      .option("--prompt", "TEXT", &a.prompt, "the text")
      .option("--steps", "N", &a.steps, "steps to run", 1)
      .option("--threads", "N", &a.threads, "threads\n(default 0: all)", 0, 64)
      .option("--fraction", "F", &a.fraction, "a number")
      .flag("--json", &a.json, "JSON output")
      .repeated("--set", "key=value", &a.sets, "an override; repeatable")
      .positionals("INPUT", &a.inputs);
  return p;
}

Args parsed(const std::vector<std::string>& argv) {
  Args a;
  EXPECT_FALSE(parser_of(a).parse(argv));
  return a;
}

std::string usage_error_of(const std::vector<std::string>& argv) {
  Args a;
  try {
    parser_of(a).parse(argv);
  } catch (const UsageError& e) {
    return e.message();
  }
  return "";
}

TEST(CoreCli, BothFormsOfAValue) {
  const Args a = parsed({"in1", "--out", "x.svg", "--steps=20", "-o=y.svg", "--threads", "4", "in2", "--json"});
  EXPECT_EQ(a.out, "y.svg");  // the last one wins
  EXPECT_EQ(a.steps, 20);
  EXPECT_EQ(a.threads, 4);
  EXPECT_TRUE(a.json);
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"in1", "in2"}));
  // "--threads=4" and "--threads 4" are one and the same.
  EXPECT_EQ(parsed({"--threads=4"}).threads, parsed({"--threads", "4"}).threads);
}

TEST(CoreCli, ValuesThatLookLikeFlagsAndEmptyValues) {
  const Args a = parsed({"--prompt", "--json", "--set", "a=1", "--set=b=2", "-", "--fraction=-0.5"});
  EXPECT_EQ(a.prompt, std::optional<std::string>("--json"));
  EXPECT_FALSE(a.json);
  EXPECT_EQ(a.sets, (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"-"}));
  EXPECT_DOUBLE_EQ(a.fraction, -0.5);
  EXPECT_EQ(parsed({"--prompt="}).prompt, std::optional<std::string>(""));
  EXPECT_FALSE(parsed({}).prompt.has_value());
}

TEST(CoreCli, HelpIsReportedNotAnError) {
  Args a;
  EXPECT_TRUE(parser_of(a).parse({"--steps", "3", "-h"}));
  EXPECT_TRUE(parser_of(a).parse({"--help"}));
}

TEST(CoreCli, ErrorsNameTheArgument) {
  EXPECT_EQ(usage_error_of({"--bogus"}), "unknown argument '--bogus' (see --help)");
  EXPECT_EQ(usage_error_of({"--bogus=3"}), "unknown argument '--bogus=3' (see --help)");
  EXPECT_EQ(usage_error_of({"--out"}), "--out needs a value (see --help)");
  EXPECT_EQ(usage_error_of({"--steps", "0"}), "--steps 0: expected a positive integer");
  EXPECT_EQ(usage_error_of({"--steps", "ten"}), "--steps ten: expected a positive integer");
  EXPECT_EQ(usage_error_of({"--threads=-1"}), "--threads -1: expected an integer in [0, 64]");
  EXPECT_EQ(usage_error_of({"--threads", "4x"}), "--threads 4x: expected an integer in [0, 64]");
  EXPECT_EQ(usage_error_of({"--fraction", "half"}), "--fraction half: expected a number");
  EXPECT_EQ(usage_error_of({"--json=yes"}), "--json takes no value (see --help)");
  EXPECT_EQ(to_int("--n", "-3", -5, 5), -3);
  EXPECT_THROW(to_int("--n", "", 0), UsageError);
}

TEST(CoreCli, NumbersTooLargeSaySo) {
  // Past int64 (the old message said "expected a positive integer", as if the digits were wrong).
  EXPECT_EQ(usage_error_of({"--steps", "99999999999999999999"}),
            "--steps 99999999999999999999: too large (at most 9223372036854775807)");
  EXPECT_EQ(usage_error_of({"--threads=65"}), "--threads 65: too large (at most 64)");
  EXPECT_EQ(usage_error_of({"--threads=-99999999999999999999"}),
            "--threads -99999999999999999999: expected an integer in [0, 64]");
  EXPECT_EQ(to_int("--n", "9223372036854775807", 1), INT64_MAX);
}

TEST(CoreCli, UnknownFlagsSuggestTheClosest) {
  EXPECT_EQ(usage_error_of({"--step", "10"}), "unknown argument '--step'; did you mean '--steps'? (see --help)");
  EXPECT_EQ(usage_error_of({"--step=10"}), "unknown argument '--step=10'; did you mean '--steps'? (see --help)");
  EXPECT_EQ(usage_error_of({"--jsno"}), "unknown argument '--jsno'; did you mean '--json'? (see --help)");
  EXPECT_EQ(usage_error_of({"--hepl"}), "unknown argument '--hepl'; did you mean '--help'? (see --help)");
  EXPECT_EQ(usage_error_of({"--completely-else"}), "unknown argument '--completely-else' (see --help)");
}

TEST(CoreCli, NoArgumentsPrintTheUsageOnStderr) {
  Args a;
  Parser p = parser_of(a);
  EXPECT_FALSE(p.parse({}));  // a program that runs without arguments still may
  p.usage_without_arguments();
  EXPECT_THROW(p.parse({}), NoArguments);
  EXPECT_TRUE(p.parse({"--help"}));
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", [&] { return p.parse_or_help({}) ? 0 : 5; }), 2);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), p.help());
  testing::internal::CaptureStdout();
  EXPECT_EQ(run_main("prog", [&] { return p.parse_or_help({"--help"}) ? 0 : 5; }), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), p.help());
}

TEST(CoreCli, PositionalsOnlyWhereDeclared) {
  Parser p("prog", "prog [--json]");
  bool json = false;
  p.flag("--json", &json, "JSON output");
  try {
    p.parse({"file"});
    FAIL() << "a positional argument was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.message(), "unexpected argument 'file' (see --help)");
  }
}

TEST(CoreCli, GeneratedHelp) {
  // The docs start two spaces past the longest "--flag VALUE".
  Args a;
  EXPECT_EQ(parser_of(a).help(),
            "usage: prog INPUT... -o OUT [options]\n"
            "\n"
            "Does a thing.\n"
            "\n"
            "  -o, --out OUT    the file to write\n"
            "  --prompt TEXT    the text\n"
            "  --steps N        steps to run\n"
            "  --threads N      threads\n"
            "                   (default 0: all)\n"
            "  --fraction F     a number\n"
            "  --json           JSON output\n"
            "  --set key=value  an override; repeatable\n");
}

TEST(CoreCli, RunMainExitCodes) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { ST_USAGE_CHECK(false, "--out DIR is required"); }), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: --out DIR is required\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog",
                     [] {
                       Args a;
                       return parser_of(a).parse({"--steps"}) ? 0 : 5;
                     }),
            2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: --steps needs a value (see --help)\n");
}

TEST(CoreCli, RunMainOutOfMemoryIsTheUsersError) {
  // A failed allocation outside any tensor (a library's buffer, a container
  // in set-up) is an out-of-memory error with advice and exit 1, not an
  // internal error.
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { throw std::bad_alloc(); }), 1);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.rfind("prog: error: out of host memory (an allocation failed outside any tensor); ", 0), 0u) << err;
  EXPECT_NE(err.find("lower the sizes the run needs"), std::string::npos) << err;
}

TEST(CoreCli, RunMainAgreedErrors) {
  auto agreed_failure = []() -> int { throw AgreedError("bad config", __FILE__, __LINE__); };
  // Without the mode an agreed error is an error like any other.
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", agreed_failure), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: bad config\n");

  // The reporter prints and fails; the others stay silent, run quiet_exit and exit 0.
  int quiet_exits = 0;
  AgreedErrors reporter{[] { return true; }, [&] { ++quiet_exits; }};
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", agreed_failure, reporter), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: bad config\n");
  EXPECT_EQ(quiet_exits, 0);

  AgreedErrors other{[] { return false; }, [&] { ++quiet_exits; }};
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", agreed_failure, other), 0);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(quiet_exits, 1);

  // A plain st::Error is still every process's own error.
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main(
                "prog", []() -> int { ST_FAIL("own"); }, other),
            1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: own\n");
}

}  // namespace
}  // namespace st::cli
