// Configuration loading, overrides, validation and the key reference.
// Runs with the repository root as working directory (CTest sets it), so the
// shipped configs/*.yaml and the */config.h headers are read from there.
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "launch/config.h"
#include "launch/trainer.h"
#include "tests/harness/test_util.h"

namespace st {
namespace {

using st::test::error_of;

Config load(std::string_view yaml, std::vector<std::string> overrides = {}) {
  return load_config_from_string(yaml, "test.yaml", overrides);
}

std::string load_error(std::string_view yaml, std::string_view source = "test.yaml") {
  return error_of([&] { load_config_from_string(yaml, source); });
}

std::string set_error(std::string_view assignment) {
  return error_of([&] {
    Config c;
    apply_override(c, assignment);
  });
}

/// Defaults with one change, validated.
template <class F>
std::string validate_error(F&& change) {
  Config c;
  change(c);
  try {
    c.validate();
  } catch (const Error& e) {
    return e.message();
  }
  return "<no error>";
}

/// A directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("st_test_config_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A file whose line 7 holds a typo in an fsdp key.
constexpr std::string_view kTypoFile =
    "model:\n"                         // 1
    "  name: llama\n"                  // 2
    "train:\n"                         // 3
    "  steps: 10\n"                    // 4
    "fsdp:\n"                          // 5
    "  # sharding\n"                   // 6
    "  sharding_stratgy: NO_SHARD\n";  // 7

TEST(Config, EmptyYamlGivesDefaults) {
  EXPECT_EQ(load(""), Config{});
  EXPECT_EQ(load("# nothing but a comment\n"), Config{});
  EXPECT_EQ(load("optim:\nfsdp:\n  auto_wrap:\n"), Config{});  // null sections keep their defaults
  const Config c = load("");
  EXPECT_EQ(c.model.name, "llama");
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::FullShard);
  EXPECT_EQ(c.fsdp.mixed_precision.param_dtype, DType::BF16);
  EXPECT_EQ(c.fsdp.auto_wrap.module_types, std::vector<std::string>{"DecoderLayer"});
}

TEST(Config, FullFileParses) {
  const Config c = load(R"(
model:
  name: llama
  vocab_size: 256
  hidden_size: 64
  intermediate_size: 172
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 64
  rope_theta: 500000.0
  rms_norm_eps: 1e-6
  tie_word_embeddings: true
  init_std: 0.01
train:
  steps: 20
  global_batch_size: 12
  micro_batch_size: 3
  seq_len: 32
  seed: 18446744073709551615
  device: cpu
data:
  kind: text
  path: data/tiny.txt
  val_fraction: 0.05
eval:
  interval: 10
  batches: 2
optim:
  name: sgd
  lr: 0.01
  weight_decay: 0
  beta1: 0.8
  beta2: 0.99
  eps: 1.0e-6
  momentum: 0.5
  grad_clip: 0.0
  schedule:
    kind: linear
    warmup_steps: 5
    min_lr: 1e-3
fsdp:
  sharding_strategy: HYBRID_SHARD
  shard_group_size: 2
  auto_wrap:
    policy: size_based
    min_num_params: 0x100
    module_types: [DecoderLayer, Attention]
  mixed_precision:
    param_dtype: f32
    reduce_dtype: bf16
  activation_checkpointing:
    mode: every_n
    n: 3
  forward_prefetch: false
  limit_all_gathers: FALSE
checkpoint:
  dir: "ckpt/run 1"
  interval: 5
  format: sharded
  async: true
  keep_last: 3
  verify: false
  init_from: hf/llama
  unified_checkpoint_config:
    - master_weight_compatible
    - enable_all_options
logging:
  interval: 2
  metrics_file: metrics.jsonl
  level: debug
)");
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.intermediate_size, 172);
  EXPECT_EQ(c.model.num_hidden_layers, 2);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  EXPECT_EQ(c.model.num_key_value_heads, 2);
  EXPECT_EQ(c.model.max_position_embeddings, 64);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.train.global_batch_size, 12);
  EXPECT_EQ(c.train.micro_batch_size, 3);
  EXPECT_EQ(c.train.seq_len, 32);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_EQ(c.train.device, DeviceKind::Cpu);
  EXPECT_EQ(c.data.kind, DataKind::Text);
  EXPECT_EQ(c.data.path, "data/tiny.txt");
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.data.val_fraction, 0.05);
  EXPECT_EQ(c.eval.interval, 10);
  EXPECT_EQ(c.eval.batches, 2);
  EXPECT_EQ(c.optim.name, OptimizerKind::Sgd);
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.weight_decay, 0.0);
  EXPECT_EQ(c.optim.beta1, 0.8);
  EXPECT_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.optim.eps, 1e-6);
  EXPECT_EQ(c.optim.momentum, 0.5);
  EXPECT_EQ(c.optim.grad_clip, 0.0);
  EXPECT_EQ(c.optim.schedule.kind, ScheduleKind::Linear);
  EXPECT_EQ(c.optim.schedule.warmup_steps, 5);
  EXPECT_EQ(c.optim.schedule.min_lr, 1e-3);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::HybridShard);
  EXPECT_EQ(c.fsdp.shard_group_size, 2);
  EXPECT_EQ(c.fsdp.auto_wrap.policy, WrapPolicy::SizeBased);
  EXPECT_EQ(c.fsdp.auto_wrap.min_num_params, 256);
  EXPECT_EQ(c.fsdp.auto_wrap.module_types, (std::vector<std::string>{"DecoderLayer", "Attention"}));
  EXPECT_EQ(c.fsdp.mixed_precision.param_dtype, DType::F32);
  EXPECT_EQ(c.fsdp.mixed_precision.reduce_dtype, DType::BF16);
  EXPECT_EQ(c.fsdp.activation_checkpointing.mode, RecomputeMode::EveryN);
  EXPECT_EQ(c.fsdp.activation_checkpointing.n, 3);
  EXPECT_FALSE(c.fsdp.forward_prefetch);
  EXPECT_FALSE(c.fsdp.limit_all_gathers);
  EXPECT_EQ(c.checkpoint.dir, "ckpt/run 1");
  EXPECT_EQ(c.checkpoint.interval, 5);
  EXPECT_EQ(c.checkpoint.format, checkpoint::Layout::Sharded);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_FALSE(c.checkpoint.verify);
  EXPECT_EQ(c.checkpoint.init_from, "hf/llama");
  EXPECT_EQ(c.checkpoint.unified_checkpoint_config,
            (UnifiedOptions{.master_weight_compatible = true, .enable_all_options = true}));
  EXPECT_EQ(c.logging.interval, 2);
  EXPECT_EQ(c.logging.metrics_file, "metrics.jsonl");
  EXPECT_EQ(c.logging.level, "debug");
}

TEST(Config, ScalarForms) {
  EXPECT_EQ(load("train: {steps: +7}").train.steps, 7);
  EXPECT_EQ(load("train: {seed: 0o17}").train.seed, 15u);
  EXPECT_EQ(load("optim: {lr: 5}").optim.lr, 5.0);  // an integer is a valid float
  EXPECT_EQ(load("optim: {lr: .5}").optim.lr, 0.5);
  EXPECT_EQ(load("optim: {lr: 2E-3}").optim.lr, 2e-3);
  EXPECT_EQ(load("checkpoint: {dir: ''}").checkpoint.dir, "");
  EXPECT_EQ(load("checkpoint: {dir: 'null'}").checkpoint.dir, "null");
}

// A YAML null ("~", "null", nothing) is never a string: "dir: ~" meant the
// home directory and used to turn checkpointing off without a word.
TEST(Config, NullIsNotAString) {
  const std::string expected =
      "expected a string (YAML reads ~, null and an empty value as null, and ~ is not the home directory here: "
      "write the path out, or \"\" for none)";
  EXPECT_EQ(load_error("checkpoint: {dir: ~}"),
            "bad value for 'checkpoint.dir' at test.yaml:1: got an empty value, " + expected);
  EXPECT_EQ(load_error("data:\n  kind: text\n  path: null\n"),
            "bad value for 'data.path' at test.yaml:3: got an empty value, " + expected);
  EXPECT_EQ(load_error("logging:\n  metrics_file:\n"),
            "bad value for 'logging.metrics_file' at test.yaml:2: got an empty value, " + expected);
  for (const char* key : {"checkpoint.dir", "checkpoint.init_from", "data.path", "data.val_path", "data.tokenizer",
                          "logging.metrics_file"}) {
    EXPECT_EQ(set_error(std::string(key) + "=~"),
              "bad value for '" + std::string(key) + "' in --set: got an empty value, " + expected);
  }
  // Nothing after '=' is the shell's empty string, as is "".
  EXPECT_EQ(load("", {"checkpoint.dir=/tmp/x", "checkpoint.dir="}).checkpoint.dir, "");
  EXPECT_EQ(load("", {"checkpoint.dir=/tmp/x", "checkpoint.dir=\"\""}).checkpoint.dir, "");
  // Other kinds keep their messages for an empty value.
  EXPECT_EQ(set_error("train.steps="), "bad value for 'train.steps' in --set: got an empty value, expected an integer");
}

TEST(Config, UnknownKeyNamesFileLineAndSuggestion) {
  EXPECT_EQ(load_error(kTypoFile, "llama.yaml"),
            "unknown key 'fsdp.sharding_stratgy' at llama.yaml:7; did you mean 'sharding_strategy'?");
}

TEST(Config, LoadConfigNamesThePathAsGiven) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "llama.yaml";
  std::ofstream(file) << kTypoFile;
  const std::string path = file.string();
  EXPECT_EQ(error_of([&] { load_config(path); }),
            "unknown key 'fsdp.sharding_stratgy' at " + path + ":7; did you mean 'sharding_strategy'?");
  EXPECT_EQ(error_of([&] { load_config(path + ".missing"); }), "cannot open config file '" + path + ".missing'");
}

// A config file over kMaxConfigBytes is refused by its size, before it is read
// or parsed (a 100 MB YAML took 26 s and 2.9 GB to accept); one at the limit loads.
TEST(Config, ConfigFileOverTheSizeLimitIsRefused) {
  TempDir dir;
  const std::string big = (dir.path() / "big.yaml").string();
  {
    std::ofstream out(big);
    out << "train:\n  steps: 3\n";
    out << std::string(static_cast<size_t>(kMaxConfigBytes), '#');  // one comment line past the limit
  }
  const int64_t bytes = kMaxConfigBytes + 18;  // "train:\n  steps: 3\n" and the comment
  EXPECT_EQ(error_of([&] { load_config(big); }),
            "config file '" + big + "' is 1.0 MB (" + std::to_string(bytes) +
                " bytes), over the limit of 1048576 bytes (1 MiB) for a config file; is --config the right file?");
  std::filesystem::resize_file(big, static_cast<uintmax_t>(kMaxConfigBytes));
  EXPECT_EQ(load_config(big).train.steps, 3);
  EXPECT_EQ(load_error(std::string(static_cast<size_t>(kMaxConfigBytes) + 1, '#'), "x.yaml"),
            "config x.yaml is 1048577 bytes, over the limit of 1048576 bytes (1 MiB) for a config; is it a config "
            "file?");
}

TEST(Config, ConfigFileMustHoldSettings) {
  TempDir dir;
  const std::string d = dir.path().string();
  EXPECT_EQ(error_of([&] { load_config(d); }),
            "config file '" + d + "' is a directory; pass a YAML file, e.g. --config configs/llama-tiny.yaml");
  for (const char* text : {"", "\n\n", "# only a comment\n  # another\n", "---\n"}) {
    const std::string path = d + "/empty.yaml";
    std::ofstream(path) << text;
    EXPECT_EQ(error_of([&] { load_config(path); }),
              "config file '" + path + "' is empty (no settings, only blank lines or comments)")
        << text;
  }
  const std::string list = d + "/list.yaml";
  std::ofstream(list) << "- model\n- train\n";
  EXPECT_EQ(
      error_of([&] { load_config(list); }),
      "expected a map of sections (model, train, data, eval, optim, fsdp, checkpoint, comm, logging) at the top level "
      "of " +
          list + ", got a list");
  const std::string scalar = d + "/scalar.yaml";
  std::ofstream(scalar) << "llama\n";
  EXPECT_EQ(
      error_of([&] { load_config(scalar); }),
      "expected a map of sections (model, train, data, eval, optim, fsdp, checkpoint, comm, logging) at the top level "
      "of " +
          scalar + ", got 'llama'");
}

TEST(Config, UnknownSection) {
  EXPECT_EQ(load_error("train:\n  steps: 3\nmodle:\n  name: toy\n"),
            "unknown key 'modle' at test.yaml:3; did you mean 'model'?");
  EXPECT_EQ(load_error("wandb:\n  project: x\n"), "unknown key 'wandb' at test.yaml:1");
}

TEST(Config, UnknownNestedKey) {
  EXPECT_EQ(load_error("fsdp:\n  auto_wrap:\n    polcy: none\n"),
            "unknown key 'fsdp.auto_wrap.polcy' at test.yaml:3; did you mean 'policy'?");
  EXPECT_EQ(load_error("optim:\n  schedule:\n    warmup: 3\n"), "unknown key 'optim.schedule.warmup' at test.yaml:3");
  // A leaf key is not a section.
  EXPECT_EQ(load_error("train:\n  steps:\n    n: 3\n"),
            "bad value for 'train.steps' at test.yaml:2: got a map, expected an integer");
}

TEST(Config, WrongTypes) {
  EXPECT_EQ(load_error("train:\n  steps: ten\n"),
            "bad value for 'train.steps' at test.yaml:2: got 'ten', expected an integer");
  EXPECT_EQ(load_error("train:\n  steps: 1.5\n"),
            "bad value for 'train.steps' at test.yaml:2: got '1.5', expected an integer");
  EXPECT_EQ(load_error("train:\n  steps: \"10\"\n"),
            "bad value for 'train.steps' at test.yaml:2: got the quoted string \"10\", expected an integer");
  EXPECT_EQ(load_error("train:\n  steps:\n"),
            "bad value for 'train.steps' at test.yaml:2: got an empty value, expected an integer");
  EXPECT_EQ(load_error("train:\n  steps: 99999999999999999999\n"),
            "bad value for 'train.steps' at test.yaml:2: got '99999999999999999999', expected an integer");
  EXPECT_EQ(load_error("train:\n  seed: -1\n"),
            "bad value for 'train.seed' at test.yaml:2: got '-1', expected a non-negative integer");
  EXPECT_EQ(load_error("optim:\n  lr: fast\n"),
            "bad value for 'optim.lr' at test.yaml:2: got 'fast', expected a number");
  EXPECT_EQ(load_error("fsdp:\n  forward_prefetch: yes\n"),
            "bad value for 'fsdp.forward_prefetch' at test.yaml:2: got 'yes', expected true or false");
  EXPECT_EQ(load_error("fsdp:\n  forward_prefetch: maybe\n"),
            "bad value for 'fsdp.forward_prefetch' at test.yaml:2: got 'maybe', expected true or false");
  EXPECT_EQ(load_error("fsdp:\n  sharding_strategy: [FULL_SHARD]\n"),
            "bad value for 'fsdp.sharding_strategy' at test.yaml:2: got a list, expected one of "
            "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD");
  EXPECT_EQ(load_error("fsdp:\n  auto_wrap:\n    module_types: DecoderLayer\n"),
            "bad value for 'fsdp.auto_wrap.module_types' at test.yaml:3: got 'DecoderLayer', expected a list of "
            "strings, e.g. [a, b]");
  EXPECT_EQ(load_error("fsdp:\n  auto_wrap:\n    module_types: [[a]]\n"),
            "bad value for 'fsdp.auto_wrap.module_types' at test.yaml:3: got a list, expected a list of strings, "
            "e.g. [a, b]");
  EXPECT_EQ(load_error("data:\n  path: {a: 1}\n"),
            "bad value for 'data.path' at test.yaml:2: got a map, expected a string");
  EXPECT_EQ(load_error("fsdp: FULL_SHARD\n"),
            "bad value for 'fsdp' at test.yaml:1: got 'FULL_SHARD', expected a map of its keys (sharding_strategy, "
            "shard_group_size, auto_wrap, mixed_precision, activation_checkpointing, forward_prefetch, "
            "limit_all_gathers)");
  EXPECT_EQ(load_error("- model\n"),
            "expected a map of sections (model, train, data, eval, optim, fsdp, checkpoint, comm, logging) at the top "
            "level of "
            "test.yaml, got a list");
}

TEST(Config, EnumTypoSuggestsTheClosestValue) {
  EXPECT_EQ(load_error("fsdp:\n  sharding_strategy: FULL_SHRAD\n"),
            "bad value for 'fsdp.sharding_strategy' at test.yaml:2: got 'FULL_SHRAD', expected one of "
            "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD; did you mean 'FULL_SHARD'?");
  // Spellings are exact, but the suggestion ignores case.
  EXPECT_EQ(load_error("fsdp:\n  mixed_precision:\n    param_dtype: BF16\n"),
            "bad value for 'fsdp.mixed_precision.param_dtype' at test.yaml:3: got 'BF16', expected one of "
            "f32 | bf16; did you mean 'bf16'?");
  EXPECT_EQ(load_error("train:\n  device: gpu\n"),
            "bad value for 'train.device' at test.yaml:2: got 'gpu', expected one of cpu | cuda | auto; "
            "did you mean 'cpu'?");
  EXPECT_EQ(load_error("optim:\n  name: lamb\n"),
            "bad value for 'optim.name' at test.yaml:2: got 'lamb', expected one of adamw | sgd");
  EXPECT_EQ(load_error("model:\n  name: lama\n"),
            "bad value for 'model.name' at test.yaml:2: got 'lama', expected one of llama | toy; "
            "did you mean 'llama'?");
  EXPECT_EQ(load_error("checkpoint:\n  unified_checkpoint_config: [skip_save_model_weigth]\n"),
            "bad value for 'checkpoint.unified_checkpoint_config' at test.yaml:2: got 'skip_save_model_weigth', "
            "expected one of skip_save_model_weight | master_weight_compatible | enable_all_options; "
            "did you mean 'skip_save_model_weight'?");
}

TEST(Config, DuplicateKeysAndSyntaxErrors) {
  EXPECT_EQ(load_error("train:\n  steps: 3\n  steps: 4\n"),
            "duplicate key 'train.steps' at test.yaml:3 (first given on line 2)");
  EXPECT_EQ(load_error("train:\n  steps: 3\ntrain:\n  seed: 4\n"),
            "duplicate key 'train' at test.yaml:3 (first given on line 1)");
  EXPECT_EQ(load_error("fsdp: {auto_wrap: {}, auto_wrap: null}"),
            "duplicate key 'fsdp.auto_wrap' at test.yaml:1 (first given on line 1)");
  EXPECT_EQ(load_error("train:\n  steps: [3\n"), "YAML syntax error at test.yaml:3:1: end of sequence flow not found");
  EXPECT_EQ(load_error("train: {steps: 3}\n---\ntrain: {steps: 4}\n"),
            "test.yaml holds more than one YAML document (a second one starts at line 2); expected one");
  // yaml-cpp's LoadAll never returns on these (found by fuzz_config: it grew
  // memory without bound); the loader stops where the parser stands still.
  EXPECT_EQ(load_error(","), "YAML syntax error at test.yaml:1:1: unexpected ',' where a key or value should be");
  EXPECT_EQ(load_error("# a comment\n\n  ,\n"),
            "YAML syntax error at test.yaml:3:3: unexpected ',' where a key or value should be");
  EXPECT_EQ(load_error("train: {steps: 3}\n...\ntrain: {steps: 4}\n"),
            "test.yaml holds more than one YAML document (a second one starts at line 3); expected one");
}

TEST(Config, SetOverrides) {
  const Config c = load("train:\n  steps: 10\n",
                        {"train.steps=50", "fsdp.sharding_strategy=NO_SHARD", "fsdp.mixed_precision.param_dtype=f32",
                         "fsdp.auto_wrap.module_types=[DecoderLayer, Embedding]", "checkpoint.async=true",
                         " optim.lr = 1e-3", "checkpoint.dir=", "logging.metrics_file=out/m.jsonl", "train.steps=60"});
  EXPECT_EQ(c.train.steps, 60);  // later wins
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::NoShard);
  EXPECT_EQ(c.fsdp.mixed_precision.param_dtype, DType::F32);
  EXPECT_EQ(c.fsdp.auto_wrap.module_types, (std::vector<std::string>{"DecoderLayer", "Embedding"}));
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(c.logging.metrics_file, "out/m.jsonl");

  Config d;
  apply_override(d, "checkpoint.unified_checkpoint_config=[enable_all_options]");
  EXPECT_EQ(d.checkpoint.unified_checkpoint_config, UnifiedOptions{.enable_all_options = true});
  EXPECT_TRUE(d.checkpoint.unified_checkpoint_config.skip_model_weights());
  EXPECT_TRUE(d.checkpoint.unified_checkpoint_config.master_from_model_weights());
  apply_override(d, "checkpoint.unified_checkpoint_config=[skip_save_model_weight]");
  EXPECT_EQ(d.checkpoint.unified_checkpoint_config, UnifiedOptions{.skip_save_model_weight = true});
  EXPECT_FALSE(d.checkpoint.unified_checkpoint_config.master_from_model_weights());
  apply_override(d, "checkpoint.unified_checkpoint_config=[]");
  EXPECT_EQ(d.checkpoint.unified_checkpoint_config, UnifiedOptions{});
}

TEST(Config, SetErrors) {
  EXPECT_EQ(set_error("fsdp.sharding_stratgy=NO_SHARD"),
            "unknown key 'fsdp.sharding_stratgy' in --set; did you mean 'fsdp.sharding_strategy'?");
  EXPECT_EQ(set_error("fsdp.auto_wrp.policy=none"),
            "unknown key 'fsdp.auto_wrp.policy' in --set; did you mean 'fsdp.auto_wrap.policy'?");
  EXPECT_EQ(set_error("wandb.project=x"), "unknown key 'wandb.project' in --set");
  EXPECT_EQ(set_error("train.steps"), "--set 'train.steps' has no '='; expected key=value, e.g. --set train.steps=100");
  EXPECT_EQ(set_error("=5"), "--set '=5' has no key before '='; expected key=value, e.g. --set train.steps=100");
  EXPECT_EQ(set_error("train.steps=ten"), "bad value for 'train.steps' in --set: got 'ten', expected an integer");
  EXPECT_EQ(set_error("fsdp.sharding_strategy=FULL"),
            "bad value for 'fsdp.sharding_strategy' in --set: got 'FULL', expected one of "
            "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD");
  EXPECT_EQ(set_error("fsdp.limit_all_gathers=on"),
            "bad value for 'fsdp.limit_all_gathers' in --set: got 'on', expected true or false");
  EXPECT_EQ(set_error("train.steps=[1"),
            "bad value for 'train.steps' in --set: '[1' is not a YAML value (end of sequence flow not found)");
  EXPECT_EQ(set_error("fsdp.auto_wrap=none"),
            "'fsdp.auto_wrap' in --set is a section, not a key; set one of its keys (policy, min_num_params, "
            "module_types), e.g. --set fsdp.auto_wrap.policy=...");
  // Overrides given to the loader are checked too, and validated after.
  EXPECT_EQ(error_of([] { load("", {"train.micro_batch_size=3"}); }),
            "invalid value 3 for 'train.micro_batch_size': expected a divisor of train.global_batch_size (8)");
}

// Sizes no run can hold are config errors naming the key, found before anything is allocated.
TEST(Config, AbsurdSizesAreRefusedAtLoad) {
  const std::string real = " (larger is not a real run)";
  EXPECT_EQ(error_of([] { load("", {"train.global_batch_size=9223372036854775807"}); }),
            "invalid value 9223372036854775807 for 'train.global_batch_size': expected a positive integer <= "
            "1048576" +
                real);
  EXPECT_EQ(error_of([] { load("", {"model.num_hidden_layers=100000000"}); }),
            "invalid value 100000000 for 'model.num_hidden_layers': expected a positive integer <= 65536" + real);
  EXPECT_EQ(validate_error([](Config& c) { c.model.hidden_size = int64_t{1} << 21; }),
            "invalid value 2097152 for 'model.hidden_size': expected a positive integer <= 1048576" + real);
  EXPECT_EQ(validate_error([](Config& c) { c.model.intermediate_size = int64_t{1} << 23; }),
            "invalid value 8388608 for 'model.intermediate_size': expected a positive integer <= 4194304" + real);
  EXPECT_EQ(validate_error([](Config& c) { c.model.vocab_size = int64_t{1} << 31; }),
            "invalid value 2147483648 for 'model.vocab_size': expected a positive integer <= 2147483647" + real);
  EXPECT_EQ(validate_error([](Config& c) { c.model.max_position_embeddings = int64_t{1} << 25; }),
            "invalid value 33554432 for 'model.max_position_embeddings': expected a positive integer <= "
            "16777216" +
                real);
  // The bounds themselves load.
  EXPECT_EQ(load("", {"train.global_batch_size=1048576"}).train.global_batch_size, int64_t{1} << 20);
  EXPECT_EQ(load("", {"model.num_hidden_layers=65536"}).model.num_hidden_layers, 65536);
}

TEST(Config, ValidateNamesTheKey) {
  EXPECT_EQ(validate_error([](Config&) {}), "<no error>");
  EXPECT_EQ(validate_error([](Config& c) { c.train.steps = 0; }),
            "invalid value 0 for 'train.steps': expected a positive integer");
  EXPECT_EQ(validate_error([](Config& c) { c.train.global_batch_size = -4; }),
            "invalid value -4 for 'train.global_batch_size': expected a positive integer <= 1048576 (larger is "
            "not a real run)");
  EXPECT_EQ(validate_error([](Config& c) { c.train.seq_len = 0; }),
            "invalid value 0 for 'train.seq_len': expected a positive integer <= 16777216 (larger is not a real "
            "run)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.hidden_size = 100; }),
            "invalid value 100 for 'model.hidden_size': expected a multiple of model.num_attention_heads (8)");
  EXPECT_EQ(validate_error([](Config& c) {
              c.model.hidden_size = 24;
              c.model.num_attention_heads = 8;
            }),
            "invalid value 24 for 'model.hidden_size': expected an even head_dim = hidden_size / "
            "num_attention_heads for rotary embeddings (got 24 / 8 = 3)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.num_key_value_heads = 3; }),
            "invalid value 3 for 'model.num_key_value_heads': expected a divisor of model.num_attention_heads (8)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.num_hidden_layers = 0; }),
            "invalid value 0 for 'model.num_hidden_layers': expected a positive integer");
  EXPECT_EQ(validate_error([](Config& c) { c.train.seq_len = 4096; }),
            "invalid value 4096 for 'train.seq_len': expected at most model.max_position_embeddings (2048)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.name = "gpt2"; }),
            "invalid value gpt2 for 'model.name': expected one of llama | toy");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.lr = 0; }),
            "invalid value 0.0 for 'optim.lr': expected a number in (0, 10]");
  // Above the F32 range: the optimizer would compute with Inf.
  EXPECT_EQ(validate_error([](Config& c) { c.optim.lr = 1e39; }),
            "invalid value 1.0e+39 for 'optim.lr': expected a number in (0, 10]");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.lr = -3e-4; }),
            "invalid value -0.0003 for 'optim.lr': expected a number in (0, 10]");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.lr = std::numeric_limits<double>::quiet_NaN(); }),
            "invalid value .nan for 'optim.lr': expected a number in (0, 10]");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.eps = 1e-50; }),
            "invalid value 1.0e-50 for 'optim.eps': expected a number in [1.2e-38, 1) (smaller is 0 in F32)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.grad_clip = 1e300; }),
            "invalid value 1.0e+300 for 'optim.grad_clip': expected a non-negative number within F32 range (0 "
            "disables clipping)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.rope_theta = 1e39; }),
            "invalid value 1.0e+39 for 'model.rope_theta': expected a positive number within F32 range");
  EXPECT_EQ(validate_error([](Config& c) { c.comm.timeout_s = -1; }),
            "invalid value -1.0 for 'comm.timeout_s': expected a number of seconds in [0, 1e7] (0 disables the "
            "watchdog)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.beta2 = 1.0; }),
            "invalid value 1.0 for 'optim.beta2': expected a number in [0, 1)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.beta1 = -0.1; }),
            "invalid value -0.1 for 'optim.beta1': expected a number in [0, 1)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.eps = 0; }),
            "invalid value 0.0 for 'optim.eps': expected a number in [1.2e-38, 1) (smaller is 0 in F32)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.grad_clip = -1; }),
            "invalid value -1.0 for 'optim.grad_clip': expected a non-negative number within F32 range (0 "
            "disables clipping)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.schedule.warmup_steps = -1; }),
            "invalid value -1 for 'optim.schedule.warmup_steps': expected a non-negative integer");
  // Longer than the run is the trainer's to clamp (with a warning), not an error.
  EXPECT_EQ(validate_error([](Config& c) { c.optim.schedule.warmup_steps = 101; }), "<no error>");
  EXPECT_EQ(validate_error([](Config& c) {
              c.checkpoint.format = checkpoint::Layout::Sharded;
              c.checkpoint.unified_checkpoint_config.skip_save_model_weight = true;
            }),
            "invalid value skip_save_model_weight for 'checkpoint.unified_checkpoint_config': expected no "
            "skip_save_model_weight with checkpoint.format: sharded (that layout stores only master weights and "
            "optimizer state already)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.schedule.min_lr = 1e-3; }),
            "invalid value 0.001 for 'optim.schedule.min_lr': expected a number from 0 to optim.lr (0.0003)");
  EXPECT_EQ(validate_error([](Config& c) { c.data.kind = DataKind::Tokens; }),
            "invalid value \"\" for 'data.path': expected a file or directory (required when data.kind is tokens)");
  EXPECT_EQ(validate_error([](Config& c) { c.eval.interval = -1; }),
            "invalid value -1 for 'eval.interval': expected a number of steps >= 0 (0: never evaluate)");
  EXPECT_EQ(validate_error([](Config& c) { c.eval.batches = 0; }),
            "invalid value 0 for 'eval.batches': expected a positive integer");
  // Synthetic data validates on generated samples of its own, so the keys for files are refused there.
  EXPECT_EQ(validate_error([](Config& c) { c.eval.interval = 10; }), "<no error>");
  EXPECT_EQ(validate_error([](Config& c) { c.data.val_path = "val.bin"; }),
            "invalid value val.bin for 'data.val_path': expected \"\" for data.kind synthetic, which validates on "
            "generated samples that training never sees");
  EXPECT_EQ(validate_error([](Config& c) { c.data.val_fraction = 0.1; }),
            "invalid value 0.1 for 'data.val_fraction': expected 0 for data.kind synthetic, which validates on "
            "generated samples that training never sees");
  auto text = [](Config& c) {
    c.data.kind = DataKind::Text;
    c.data.path = "train.txt";
  };
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.data.val_fraction = 1;
            }),
            "invalid value 1.0 for 'data.val_fraction': expected a fraction in [0, 1) (0: no held-out split)");
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.data.val_fraction = -0.5;
            }),
            "invalid value -0.5 for 'data.val_fraction': expected a fraction in [0, 1) (0: no held-out split)");
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.data.val_path = "val.txt";
              c.data.val_fraction = 0.1;
            }),
            "invalid value 0.1 for 'data.val_fraction': expected 0 when data.val_path is set ('val.txt'): validation "
            "data comes from one of the two");
  // eval.interval > 0 needs validation data: an error naming the keys that give it.
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.eval.interval = 5;
            }),
            "eval.interval is 5 but there is no validation data: set data.val_path (a file or directory like "
            "data.path) or data.val_fraction (hold out the end of data.path), or eval.interval: 0");
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.eval.interval = 5;
              c.data.val_path = "val.txt";
            }),
            "<no error>");
  EXPECT_EQ(validate_error([&](Config& c) {
              text(c);
              c.eval.interval = 5;
              c.data.val_fraction = 0.1;
            }),
            "<no error>");
  EXPECT_EQ(validate_error([](Config& c) { c.fsdp.shard_group_size = -1; }),
            "invalid value -1 for 'fsdp.shard_group_size': expected a non-negative integer (0 = ranks per host)");
  EXPECT_EQ(validate_error([](Config& c) { c.fsdp.activation_checkpointing.n = 0; }),
            "invalid value 0 for 'fsdp.activation_checkpointing.n': expected a positive integer");
  EXPECT_EQ(validate_error([](Config& c) { c.fsdp.auto_wrap.module_types.clear(); }),
            "invalid value [] for 'fsdp.auto_wrap.module_types': expected at least one module type name when "
            "fsdp.auto_wrap.policy is transformer, e.g. [DecoderLayer]");
  EXPECT_EQ(validate_error([](Config& c) { c.checkpoint.interval = -1; }),
            "invalid value -1 for 'checkpoint.interval': expected a non-negative integer (0 = only at the end)");
  EXPECT_EQ(validate_error([](Config& c) { c.checkpoint.keep_last = -2; }),
            "invalid value -2 for 'checkpoint.keep_last': expected a non-negative integer (0 keeps all)");
  // enable_all_options holds skip_save_model_weight but names it only implicitly: accepted with sharded.
  EXPECT_EQ(validate_error([](Config& c) {
              c.checkpoint.format = checkpoint::Layout::Sharded;
              c.checkpoint.unified_checkpoint_config.enable_all_options = true;
            }),
            "<no error>");
  EXPECT_EQ(validate_error([](Config& c) { c.logging.interval = 0; }),
            "invalid value 0 for 'logging.interval': expected a positive integer");
  EXPECT_EQ(validate_error([](Config& c) { c.logging.level = "wran"; }),
            "invalid value wran for 'logging.level': expected one of debug | info | warn | error; "
            "did you mean 'warn'?");
  // The plot is drawn from the metrics file: logging.plot without it names both keys.
  EXPECT_EQ(validate_error([](Config& c) { c.logging.plot = true; }),
            "invalid value true for 'logging.plot': expected false while logging.metrics_file is empty: the plot is "
            "drawn from the metrics file, so set logging.metrics_file too");
  EXPECT_EQ(validate_error([](Config& c) {
              c.logging.plot = true;
              c.logging.metrics_file = "m.jsonl";
            }),
            "<no error>");
  // The toy model has fixed shapes, so llama dimensions are not checked for it.
  EXPECT_EQ(validate_error([](Config& c) {
              c.model.name = "toy";
              c.model.hidden_size = 100;
            }),
            "<no error>");
}

TEST(Config, ToYamlRoundTrips) {
  Config c;
  c.model.name = "toy";
  c.model.rope_theta = 500000;
  c.model.rms_norm_eps = 1e-6;
  c.model.init_std = 0.1 + 0.2;  // needs all 17 digits
  c.train.seed = 18446744073709551615ull;
  c.train.device = DeviceKind::Cuda;
  c.data.kind = DataKind::Text;
  c.data.path = "data/my file: \"quoted\" #1\n\ttabbed\\";
  c.optim.name = OptimizerKind::Sgd;
  c.optim.lr = 1e-20;
  c.optim.schedule.kind = ScheduleKind::Linear;
  c.fsdp.sharding_strategy = ShardingStrategy::ShardGradOp;
  c.fsdp.auto_wrap.module_types = {"DecoderLayer", "true", "123", "null", "", "- x", "a, b", "[c]"};
  c.fsdp.mixed_precision.reduce_dtype = DType::BF16;
  c.fsdp.activation_checkpointing.mode = RecomputeMode::Full;
  c.fsdp.forward_prefetch = false;
  c.checkpoint.dir = "1e5";
  c.checkpoint.init_from = "~";
  c.checkpoint.format = checkpoint::Layout::Sharded;
  c.checkpoint.unified_checkpoint_config.enable_all_options = true;
  c.logging.metrics_file = "ümlaut.jsonl";
  const std::string text = to_yaml(c);
  const Config back = load_config_from_string(text, "resolved.yaml");
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(to_yaml(back), text);
  EXPECT_EQ(load_config_from_string(to_yaml(Config{}), "defaults.yaml"), Config{});

  // The layout: sections nest, every key appears with its value.
  const std::string defaults = to_yaml(Config{});
  EXPECT_EQ(defaults.substr(0, 26), "model:\n  name: llama\n  voc");
  EXPECT_NE(defaults.find("fsdp:\n  sharding_strategy: FULL_SHARD\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n  mixed_precision:\n    param_dtype: bf16\n    reduce_dtype: f32\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n  forward_prefetch: true\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n  lr: 0.0003\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n  eps: 1.0e-08\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n  dir: \"\"\n"), std::string::npos);
  EXPECT_NE(defaults.find("\n    module_types: [DecoderLayer]\n"), std::string::npos);
}

// logging.run_name names the plot and the metrics file's event lines; its
// default comes from checkpoint.dir, else from the metrics file.
TEST(Config, RunNameDefaultsToTheCheckpointDirectory) {
  Config c;
  EXPECT_EQ(run_name(c), "");
  c.logging.metrics_file = "runs/fortunes/metrics.jsonl";
  EXPECT_EQ(run_name(c), "metrics");
  c.checkpoint.dir = "runs/fortunes/";
  EXPECT_EQ(run_name(c), "fortunes");
  c.checkpoint.dir = "ckpt/tiny";
  EXPECT_EQ(run_name(c), "tiny");
  c.logging.run_name = "tiny-bf16";
  EXPECT_EQ(run_name(c), "tiny-bf16");
  EXPECT_EQ(validate_error([](Config& bad) { bad.logging.run_name = "a\nb"; }),
            "invalid value \"a\\nb\" for 'logging.run_name': expected a name on one line");
}

TEST(Config, ConfigKeysCoverEveryKeyOnce) {
  const std::vector<ConfigKeyDoc> keys = config_keys();
  // 12 model + 7 train + 7 data + 5 eval + 11 optim + 12 fsdp + 10 checkpoint + 1 comm + 6 logging.
  EXPECT_EQ(keys.size(), 71u);
  std::set<std::string> names;
  for (const ConfigKeyDoc& k : keys) {
    EXPECT_TRUE(names.insert(k.key).second) << "duplicate " << k.key;
    EXPECT_FALSE(k.type.empty()) << k.key;
    EXPECT_FALSE(k.default_value.empty()) << k.key;
    EXPECT_FALSE(k.doc.empty()) << k.key;
    // Every listed key is settable, with its own default as the value.
    Config c;
    EXPECT_NO_THROW(apply_override(c, k.key + "=" + k.default_value)) << k.key;
    EXPECT_EQ(c, Config{}) << k.key;
  }
  auto find = [&](std::string_view name) {
    for (const ConfigKeyDoc& k : keys)
      if (k.key == name) return k;
    return ConfigKeyDoc{};
  };
  const ConfigKeyDoc p = find("fsdp.mixed_precision.param_dtype");
  EXPECT_EQ(p.type, "f32 | bf16");
  EXPECT_EQ(p.default_value, "bf16");
  EXPECT_EQ(p.doc, "dtype of gathered weights and activations");
  EXPECT_EQ(find("fsdp.sharding_strategy").type, "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD");
  EXPECT_EQ(find("train.steps").type, "int");
  EXPECT_EQ(find("train.steps").default_value, "100");
  EXPECT_EQ(find("optim.lr").type, "float");
  EXPECT_EQ(find("checkpoint.async").type, "bool");
  EXPECT_EQ(find("data.path").type, "string");
  EXPECT_EQ(find("data.path").default_value, "\"\"");
  EXPECT_EQ(find("data.token_format").type, "llmc | headerless");
  EXPECT_EQ(find("data.token_format").default_value, "llmc");
  EXPECT_EQ(find("data.token_dtype").type, "uint16 | uint32");
  EXPECT_EQ(find("data.token_dtype").default_value, "uint16");
  EXPECT_EQ(find("data.val_path").type, "string");
  EXPECT_EQ(find("data.val_fraction").type, "float");
  EXPECT_EQ(find("data.val_fraction").default_value, "0.0");
  EXPECT_EQ(find("eval.interval").default_value, "0");
  EXPECT_EQ(find("eval.batches").type, "int");
  EXPECT_EQ(find("fsdp.auto_wrap.module_types").type, "list of strings");
  EXPECT_EQ(find("fsdp.auto_wrap.module_types").default_value, "[DecoderLayer]");
  EXPECT_EQ(find("logging.level").type, "debug | info | warn | error");
  EXPECT_EQ(find("logging.profile").type, "bool");
  EXPECT_EQ(find("logging.profile").default_value, "false");
  EXPECT_EQ(find("model.name").type, "llama | toy");
}

TEST(Config, DocsMatchTheHeaderComments) {
  // The schema's doc strings are written a second time as comments in the
  // headers that declare the fields; this keeps the two copies identical.
  std::stringstream header;
  for (const char* path : {"models/config.h", "optim/config.h", "fsdp/config.h", "checkpoint/config.h",
                           "dataset/config.h", "launch/config.h"}) {
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path << ": run from the repository root";
    header << in.rdbuf();
  }
  for (const ConfigKeyDoc& k : config_keys()) {
    const std::string comment = "// " + k.doc + "\n";
    EXPECT_NE(header.str().find(comment), std::string::npos)
        << k.key << ": no comment '" << k.doc << "' in the */config.h headers";
    const std::string field = k.key.substr(k.key.rfind('.') + 1);
    const bool declared = header.str().find(" " + field + " = ") != std::string::npos ||
                          header.str().find(" " + field + ";") != std::string::npos;
    EXPECT_TRUE(declared) << k.key << ": no field '" << field << "' in the */config.h headers";
  }
}

TEST(Config, ShippedConfigsLoadAndValidate) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator("configs"))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  ASSERT_GE(files.size(), 3u) << "run from the repository root";
  for (const auto& file : files) EXPECT_NO_THROW(load_config(file.string())) << file;

  const Config toy = load_config("configs/toy.yaml");
  EXPECT_EQ(toy.model.name, "toy");
  EXPECT_EQ(toy.train.device, DeviceKind::Cpu);
  EXPECT_EQ(toy.fsdp.auto_wrap.policy, WrapPolicy::None);
  EXPECT_EQ(toy.fsdp.mixed_precision.param_dtype, DType::F32);
  EXPECT_EQ(toy.logging.interval, 1);

  const Config tiny = load_config("configs/llama-tiny.yaml");
  EXPECT_EQ(tiny.model.vocab_size, 256);
  EXPECT_EQ(tiny.train.device, DeviceKind::Cpu);
  EXPECT_EQ(tiny.fsdp.sharding_strategy, ShardingStrategy::FullShard);
  EXPECT_EQ(tiny.fsdp.auto_wrap.policy, WrapPolicy::Transformer);
  // The issue-4 default: FULL_SHARD + BF16 + recomputation of every layer.
  EXPECT_EQ(tiny.fsdp.mixed_precision.param_dtype, DType::BF16);
  EXPECT_EQ(tiny.fsdp.activation_checkpointing.mode, RecomputeMode::Full);
  for (int64_t world : {1, 2, 3, 4}) {
    EXPECT_EQ(tiny.train.global_batch_size % (world * tiny.train.micro_batch_size), 0) << "world size " << world;
  }

  const Config llama = load_config("configs/llama.yaml", std::vector<std::string>{"train.steps=300"});
  EXPECT_EQ(llama.train.steps, 300);
  EXPECT_EQ(llama.train.device, DeviceKind::Cuda);
  EXPECT_EQ(llama.fsdp.mixed_precision.param_dtype, DType::BF16);
  EXPECT_EQ(llama.checkpoint.dir, "ckpt/llama");
  EXPECT_EQ(llama.checkpoint.interval, 200);
  // The parameter count stated in the file's header comment.
  const ModelConfig& m = llama.model;
  const int64_t kv_width = m.num_key_value_heads * (m.hidden_size / m.num_attention_heads);
  const int64_t per_layer = 2 * m.hidden_size * m.hidden_size + 2 * m.hidden_size * kv_width +
                            3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size;
  EXPECT_EQ(m.num_hidden_layers * per_layer + 2 * m.vocab_size * m.hidden_size + m.hidden_size, 1104218112);
}

// Every rank reaches this error alike (rank 0 alone prints it: an AgreedError),
// and it lists what would divide: global batch sizes at this world size,
// micro-batch sizes, and world sizes for the batch settings as they are.
TEST(Config, BatchSizesThatDoNotDivideSayWhatWould) {
  auto accum_error = [](int64_t global, int64_t micro, int world) {
    TrainConfig train;
    train.global_batch_size = global;
    train.micro_batch_size = micro;
    try {
      launch::accumulation_steps(train, world);
    } catch (const AgreedError& e) {
      return e.message();
    }
    ADD_FAILURE() << "expected an st::AgreedError";
    return std::string();
  };
  EXPECT_EQ(accum_error(16, 4, 3),
            "train.global_batch_size (16) must be divisible by world size (3) x train.micro_batch_size (4) = 12; "
            "at 3 rank(s) set train.global_batch_size to 12 or 24; or run 1, 2 or 4 rank(s) (-np) with these "
            "batch sizes");
  EXPECT_EQ(accum_error(12, 4, 2),
            "train.global_batch_size (12) must be divisible by world size (2) x train.micro_batch_size (4) = 8; "
            "at 2 rank(s) set train.global_batch_size to 8 or 16, or train.micro_batch_size to 1, 2, 3 or 6; "
            "or run 1 or 3 rank(s) (-np) with these batch sizes");
  // No global batch below one step's worth; 7 is prime, and micro 2 does not divide it.
  EXPECT_EQ(accum_error(7, 2, 4),
            "train.global_batch_size (7) must be divisible by world size (4) x train.micro_batch_size (2) = 8; "
            "at 4 rank(s) set train.global_batch_size to 8");
  // At most six world sizes, those nearest the one in use.
  EXPECT_EQ(accum_error(720, 1, 7),
            "train.global_batch_size (720) must be divisible by world size (7) x train.micro_batch_size (1) = 7; "
            "at 7 rank(s) set train.global_batch_size to 714 or 721; or run 4, 5, 6, 8, 9 or 10 rank(s) (-np) with "
            "these batch sizes");
  TrainConfig fits;
  fits.global_batch_size = 12;
  fits.micro_batch_size = 2;
  EXPECT_EQ(launch::accumulation_steps(fits, 3), 2);
}

}  // namespace
}  // namespace st
