#pragma once
// fsdp.*: how the model is sharded, wrapped into units, cast and recomputed.
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"

namespace st {

enum class ShardingStrategy : uint8_t { FullShard, ShardGradOp, NoShard, HybridShard };
enum class WrapPolicy : uint8_t { SizeBased, Transformer, None };
enum class RecomputeMode : uint8_t { None, Full, EveryN };

/// YAML spellings: "FULL_SHARD" | ...; "size_based" | ...; "none" | "full" | "every_n".
std::span<const Named<ShardingStrategy>> names_of(ShardingStrategy);
std::span<const Named<WrapPolicy>> names_of(WrapPolicy);
std::span<const Named<RecomputeMode>> names_of(RecomputeMode);
/// The dtypes mixed precision offers, as spelled in YAML: F32 "f32", BF16 "bf16".
std::span<const Named<DType>> precision_names();
inline std::string_view precision_name(DType v) { return name_in(v, precision_names()); }

// clang-format off
struct AutoWrapConfig {
  WrapPolicy policy = WrapPolicy::Transformer;            // size_based | transformer | none
  int64_t min_num_params = 100000000;                     // size_based: threshold for a subtree to become a unit
  std::vector<std::string> module_types = {"DecoderLayer"};  // transformer: module type names that become units

  bool operator==(const AutoWrapConfig&) const = default;
};

struct MixedPrecisionConfig {
  DType param_dtype = DType::BF16;     // dtype of gathered weights and activations
  DType reduce_dtype = DType::F32;     // dtype gradients travel in

  bool operator==(const MixedPrecisionConfig&) const = default;
};

struct RecomputeConfig {
  RecomputeMode mode = RecomputeMode::None;  // none | full (every module of module_types) | every_n
  int64_t n = 2;                             // every_n: recompute every n-th module of module_types
  std::vector<std::string> module_types = {"DecoderLayer"};  // module type names that are recomputed, in model order

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

  /// Throws st::Error naming the key for a value out of range (checks that
  /// need the world size are the trainer's, at start-up).
  void validate() const;
  bool operator==(const FsdpConfig&) const = default;
};
// clang-format on

/// The fsdp.* keys (names relative to the section).
void visit_keys(FsdpConfig& c, const KeyVisitor& v);

}  // namespace st
