// The trainer's command-line parser.
#include <gtest/gtest.h>

#include "core/cli.h"
#include "core/error.h"
#include "launch/cli.h"

namespace st::launch {
namespace {

std::string error_of(const std::vector<std::string>& argv) {
  try {
    parse_trainer_args(argv);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(TrainerArgs, ParsesConfigOverridesAndSteps) {
  TrainerArgs a = parse_trainer_args({"--config", "configs/toy.yaml", "--set", "fsdp.sharding_strategy=NO_SHARD",
                                      "--steps", "20", "--set=optim.lr=0.5"});
  EXPECT_EQ(a.config_path, "configs/toy.yaml");
  ASSERT_EQ(a.overrides.size(), 3u);
  EXPECT_EQ(a.overrides[0], "fsdp.sharding_strategy=NO_SHARD");
  // --steps is sugar for an override, so it goes through the same validation.
  EXPECT_EQ(a.overrides[1], "train.steps=20");
  EXPECT_EQ(a.overrides[2], "optim.lr=0.5");
  EXPECT_FALSE(a.print_config);
}

TEST(TrainerArgs, ProfileIsAnOverride) {
  TrainerArgs a = parse_trainer_args({"--config", "c.yaml", "--steps", "3", "--profile"});
  ASSERT_EQ(a.overrides.size(), 2u);
  EXPECT_EQ(a.overrides[1], "logging.profile=true");
  EXPECT_NE(trainer_usage().find("--profile"), std::string::npos);
  EXPECT_NE(trainer_usage().find("logging.profile"), std::string::npos);
}

TEST(TrainerArgs, InlineValues) {
  TrainerArgs a = parse_trainer_args({"--config=x.yaml", "--print-config", "--log-level=debug"});
  EXPECT_EQ(a.config_path, "x.yaml");
  EXPECT_TRUE(a.print_config);
  EXPECT_EQ(a.log_level, "debug");
}

TEST(TrainerArgs, Errors) {
  // No arguments at all: the usage on stderr, exit 2 (core/cli.h), like every program.
  EXPECT_EQ(error_of({}), "no arguments (see --help)");
  EXPECT_THROW(parse_trainer_args({}), cli::NoArguments);
  EXPECT_EQ(error_of({"--steps", "2"}), "missing --config FILE (for example --config configs/toy.yaml)");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--step", "10"}),
            "unknown argument '--step'; did you mean '--steps'? (see --help)");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--steps", "99999999999999999999"}),
            "--steps 99999999999999999999: too large (at most 9223372036854775807)");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--bogus"}), "unknown argument '--bogus' (see --help)");
  EXPECT_EQ(error_of({"--config"}), "--config needs a value (see --help)");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--overwrite", "--resume", "auto"}),
            "--overwrite starts the run over, so it cannot be combined with --resume auto");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--steps", "0"}), "--steps 0: expected a positive integer");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--steps", "ten"}), "--steps ten: expected a positive integer");
  EXPECT_EQ(error_of({"--config", "a.yaml", "--set", "train.steps"}),
            "--set train.steps: expected key=value, e.g. --set train.steps=20");
}

TEST(TrainerArgs, StopAfterAndResume) {
  TrainerArgs a = parse_trainer_args({"--config", "c.yaml", "--stop-after", "10", "--resume", "auto"});
  EXPECT_EQ(a.stop_after, 10);
  EXPECT_EQ(a.resume, "auto");
  // Empty: the trainer resumes automatically when checkpoint.dir is set.
  EXPECT_EQ(parse_trainer_args({"--config", "c.yaml"}).resume, "");
  EXPECT_FALSE(parse_trainer_args({"--config", "c.yaml"}).overwrite);
  EXPECT_TRUE(parse_trainer_args({"--config", "c.yaml", "--overwrite"}).overwrite);
  EXPECT_TRUE(parse_trainer_args({"--config", "c.yaml", "--overwrite", "--resume", "never"}).overwrite);
  EXPECT_EQ(error_of({"--config", "c.yaml", "--stop-after", "-1"}), "--stop-after -1: expected a positive integer");
}

TEST(TrainerArgs, HelpNeedsNoConfigAndListsKeys) {
  EXPECT_TRUE(parse_trainer_args({"--help"}).help);
  std::string usage = trainer_usage();
  EXPECT_NE(usage.find("fsdp.sharding_strategy"), std::string::npos);
  EXPECT_NE(usage.find("checkpoint.unified_checkpoint_config"), std::string::npos);
}

}  // namespace
}  // namespace st::launch
