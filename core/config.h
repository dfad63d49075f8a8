#pragma once
// Typed run configuration, loaded from YAML (see configs/*.yaml).
//
// Every field has a default and a one-line doc; the YAML keys are the field
// names, nested by section ("fsdp.mixed_precision.param_dtype"). Loading is
// strict: an unknown key, a wrong type or a value out of range is an
// st::Error naming the key, the file:line and what was expected (with the
// closest valid key for a typo). `--set key=value` overrides go through the
// same parser. config_keys() lists every key with its type, default and doc;
// the README's configuration reference is generated from it. The per-field
// comments below are repeated as doc strings in config.cpp's schema; a test
// keeps the two copies identical.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace st {

enum class DeviceKind : uint8_t { Cpu, Cuda, Auto };
enum class DataKind : uint8_t { Synthetic, Text, Tokens };
enum class TokenDType : uint8_t { U16, U32 };
enum class OptimizerKind : uint8_t { AdamW, Sgd };
enum class ScheduleKind : uint8_t { Constant, Cosine, Linear };
enum class ShardingStrategy : uint8_t { FullShard, ShardGradOp, NoShard, HybridShard };
enum class WrapPolicy : uint8_t { SizeBased, Transformer, None };
enum class PrecisionKind : uint8_t { F32, BF16 };
enum class RecomputeMode : uint8_t { None, Full, EveryN };
enum class CheckpointFormat : uint8_t { Unified, Sharded };

/// The spelling used in YAML, e.g. "FULL_SHARD", "bf16", "every_n".
std::string_view to_string(DeviceKind v);
std::string_view to_string(DataKind v);
std::string_view to_string(TokenDType v);
std::string_view to_string(OptimizerKind v);
std::string_view to_string(ScheduleKind v);
std::string_view to_string(ShardingStrategy v);
std::string_view to_string(WrapPolicy v);
std::string_view to_string(PrecisionKind v);
std::string_view to_string(RecomputeMode v);
std::string_view to_string(CheckpointFormat v);

// One field per line with its doc comment: tests/test_config.cpp checks each
// comment against the schema's doc string, so the layout is kept as written.
// clang-format off
struct ModelConfig {
  std::string name = "llama";          // "llama" or "toy" (the DCP tutorial's Linear(16,16)-ReLU-Linear(16,8))
  int64_t vocab_size = 32000;          // tokens in the vocabulary (256 for byte-level text)
  int64_t hidden_size = 256;           // model width
  int64_t intermediate_size = 688;     // SwiGLU hidden width
  int64_t num_hidden_layers = 4;       // decoder layers
  int64_t num_attention_heads = 8;     // query heads; divides hidden_size
  int64_t num_key_value_heads = 8;     // key/value heads (GQA); divides num_attention_heads
  int64_t max_position_embeddings = 2048;  // longest sequence the rotary tables cover
  double rope_theta = 10000.0;         // rotary base
  double rms_norm_eps = 1e-5;          // RMSNorm epsilon
  bool tie_word_embeddings = false;    // lm_head shares model.embed_tokens.weight
  double init_std = 0.02;              // std of the normal init of linears and embeddings

  bool operator==(const ModelConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 100;                 // optimizer steps in the run (the LR schedule follows it)
  int64_t global_batch_size = 8;       // sequences per optimizer step, over all ranks
  int64_t micro_batch_size = 1;        // sequences per forward/backward on one rank
  int64_t seq_len = 128;               // tokens per sequence
  uint64_t seed = 1234;                // seeds init, data order and synthetic data
  DeviceKind device = DeviceKind::Auto;  // cpu | cuda | auto (cuda when a GPU is visible)
  int64_t threads = 0;                 // CPU threads per rank; 0 = the cores this rank may use

  bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
  DataKind kind = DataKind::Synthetic;  // synthetic (seeded learnable Markov-chain tokens) | text (UTF-8 bytes) | tokens (uint16/uint32 .bin)
  std::string path;                     // file or directory for text/tokens; unused for synthetic
  TokenDType token_dtype = TokenDType::U16;  // token width of headerless tokens files (llm.c shards give their own)

  bool operator==(const DataConfig&) const = default;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::Cosine;  // constant | cosine | linear (decay after warmup)
  int64_t warmup_steps = 0;                  // linear warmup: step s < warmup uses lr*(s+1)/warmup
  double min_lr = 0.0;                       // LR at the end of the decay

  bool operator==(const ScheduleConfig&) const = default;
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::AdamW;  // adamw | sgd
  double lr = 3e-4;                           // peak learning rate
  double weight_decay = 0.1;                  // on parameters with >= 2 dims only (AdamW: decoupled; SGD: L2, as torch)
  double beta1 = 0.9;                         // AdamW first-moment decay
  double beta2 = 0.95;                        // AdamW second-moment decay
  double eps = 1e-8;                          // AdamW denominator epsilon
  double momentum = 0.9;                      // SGD momentum
  double grad_clip = 1.0;                     // max global gradient norm; 0 disables clipping
  ScheduleConfig schedule;                    // learning-rate schedule

  bool operator==(const OptimConfig&) const = default;
};

struct AutoWrapConfig {
  WrapPolicy policy = WrapPolicy::Transformer;            // size_based | transformer | none
  int64_t min_num_params = 100000000;                     // size_based: threshold for a subtree to become a unit
  std::vector<std::string> module_types = {"DecoderLayer"};  // transformer: module type names that become units

  bool operator==(const AutoWrapConfig&) const = default;
};

struct MixedPrecisionConfig {
  PrecisionKind param_dtype = PrecisionKind::BF16;   // dtype of gathered weights and activations
  PrecisionKind reduce_dtype = PrecisionKind::F32;   // dtype gradients travel in

  bool operator==(const MixedPrecisionConfig&) const = default;
};

struct RecomputeConfig {
  RecomputeMode mode = RecomputeMode::None;  // none | full (every decoder layer) | every_n
  int64_t n = 2;                             // every_n: recompute every n-th decoder layer
  // module type names that are recomputed (full: all of them; every_n: every n-th)
  std::vector<std::string> module_types = {"DecoderLayer"};

  bool operator==(const RecomputeConfig&) const = default;
};

struct FsdpConfig {
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;  // FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD
  int64_t shard_group_size = 0;        // HYBRID_SHARD: ranks per shard group (0 = ranks per host)
  AutoWrapConfig auto_wrap;            // how modules become shard units
  MixedPrecisionConfig mixed_precision;  // compute and communication dtypes
  RecomputeConfig activation_checkpointing;  // activation recomputation
  bool forward_prefetch = true;        // gather unit k+1 before unit k computes
  bool limit_all_gathers = true;       // at most two gathered units in flight

  bool operator==(const FsdpConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;                     // where checkpoints go; empty disables saving
  int64_t interval = 0;                // save every N steps; 0 = only at the end of the run
  CheckpointFormat format = CheckpointFormat::Unified;  // unified (HF safetensors) | sharded (one file per rank)
  bool async = false;                  // write in a background thread while training goes on
  int64_t keep_last = 0;               // keep the newest N checkpoints; 0 keeps all
  bool verify = true;                  // verify checksums on load
  std::string init_from;               // start from these model weights (HF directory or checkpoint), fresh optimizer
  std::vector<std::string> unified_checkpoint_config;  // skip_save_model_weight | master_weight_compatible | enable_all_options
  bool strict = true;                  // refuse a checkpoint holding tensors the model lacks or whose config.json differs from model.*; false warns

  bool operator==(const CheckpointConfig&) const = default;
};

struct CommConfig {
  double timeout_s = 600;              // abort the job when a collective makes no progress for this long; 0 disables the watchdog

  bool operator==(const CommConfig&) const = default;
};

struct LoggingConfig {
  int64_t interval = 1;                // print a step line every N steps
  std::string metrics_file;            // append one JSON object per logged step; empty disables
  std::string level = "info";          // debug | info | warn | error
  bool profile = false;                // print where each step's time went (phases, GEMM, ops, collective waits) and a summary table at the end; same as --profile

  bool operator==(const LoggingConfig&) const = default;
};

// clang-format on

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  OptimConfig optim;
  FsdpConfig fsdp;
  CheckpointConfig checkpoint;
  CommConfig comm;
  LoggingConfig logging;

  /// Checks values that each field's parser cannot (ranges, cross-field
  /// rules); throws st::Error naming the key and the expected form.
  void validate() const;

  /// Field-by-field equality (e.g. a resumed run against its checkpoint's config).
  bool operator==(const Config&) const = default;
};

/// One configuration key, for help text and the README reference.
struct ConfigKeyDoc {
  std::string key;            // "fsdp.mixed_precision.param_dtype"
  std::string type;           // "int", "float", "bool", "string", "list of strings", or "a | b | c"
  std::string default_value;  // as it would be written in YAML
  std::string doc;            // the field's one-line comment
};
std::vector<ConfigKeyDoc> config_keys();

/// Loads `path`, applies `overrides` ("key=value", later wins), validates.
/// Errors name the file as `path` was given ("llama.yaml:7", "configs/x.yaml:3").
Config load_config(const std::string& path, std::span<const std::string> overrides = {});
/// The same from YAML text; `source_name` stands in for the file name in errors.
Config load_config_from_string(std::string_view yaml, std::string_view source_name,
                               std::span<const std::string> overrides = {});
/// Applies one "key=value" override (value parsed as YAML) without validating.
void apply_override(Config& config, std::string_view assignment);
/// The resolved configuration as YAML (loadable again by load_config).
std::string to_yaml(const Config& config);

}  // namespace st
