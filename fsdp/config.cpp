// fsdp.*: the keys, their spellings and their one check.
#include "fsdp/config.h"

namespace st {

namespace {

constexpr Named<ShardingStrategy> kShardingNames[] = {{ShardingStrategy::FullShard, "FULL_SHARD"},
                                                      {ShardingStrategy::ShardGradOp, "SHARD_GRAD_OP"},
                                                      {ShardingStrategy::NoShard, "NO_SHARD"},
                                                      {ShardingStrategy::HybridShard, "HYBRID_SHARD"}};
constexpr Named<WrapPolicy> kWrapNames[] = {
    {WrapPolicy::SizeBased, "size_based"}, {WrapPolicy::Transformer, "transformer"}, {WrapPolicy::None, "none"}};
constexpr Named<RecomputeMode> kRecomputeNames[] = {
    {RecomputeMode::None, "none"}, {RecomputeMode::Full, "full"}, {RecomputeMode::EveryN, "every_n"}};
constexpr Named<DType> kPrecisionNames[] = {{DType::F32, "f32"}, {DType::BF16, "bf16"}};

}  // namespace

std::span<const Named<ShardingStrategy>> names_of(ShardingStrategy) { return kShardingNames; }
std::span<const Named<WrapPolicy>> names_of(WrapPolicy) { return kWrapNames; }
std::span<const Named<RecomputeMode>> names_of(RecomputeMode) { return kRecomputeNames; }
std::span<const Named<DType>> precision_names() { return kPrecisionNames; }

void visit_keys(FsdpConfig& f, const KeyVisitor& v) {
  v({"sharding_strategy", "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD"}, f.sharding_strategy);
  v({"shard_group_size", "HYBRID_SHARD: ranks per shard group (0 = ranks per host)"}, f.shard_group_size);
  v({"auto_wrap.policy", "size_based | transformer | none"}, f.auto_wrap.policy);
  v({"auto_wrap.min_num_params", "size_based: threshold for a subtree to become a unit"}, f.auto_wrap.min_num_params);
  v({"auto_wrap.module_types", "transformer: module type names that become units"}, f.auto_wrap.module_types);
  v({"mixed_precision.param_dtype", "dtype of gathered weights and activations"},
    Field(f.mixed_precision.param_dtype, precision_names()));
  v({"mixed_precision.reduce_dtype", "dtype gradients travel in"},
    Field(f.mixed_precision.reduce_dtype, precision_names()));
  v({"activation_checkpointing.mode", "none | full (every module of module_types) | every_n"},
    f.activation_checkpointing.mode);
  v({"activation_checkpointing.n", "every_n: recompute every n-th module of module_types"},
    f.activation_checkpointing.n);
  v({"activation_checkpointing.module_types", "module type names that are recomputed, in model order"},
    f.activation_checkpointing.module_types);
  v({"forward_prefetch", "gather unit k+1 before unit k computes"}, f.forward_prefetch);
  v({"limit_all_gathers", "at most two gathered units in flight"}, f.limit_all_gathers);
}

void FsdpConfig::validate() const {
  require(shard_group_size >= 0, "fsdp.shard_group_size", shard_group_size,
          "a non-negative integer (0 = ranks per host)");
  require(auto_wrap.min_num_params >= 0, "fsdp.auto_wrap.min_num_params", auto_wrap.min_num_params,
          "a non-negative integer");
  require(auto_wrap.policy != WrapPolicy::Transformer || !auto_wrap.module_types.empty(), "fsdp.auto_wrap.module_types",
          auto_wrap.module_types,
          "at least one module type name when fsdp.auto_wrap.policy is transformer, e.g. [DecoderLayer]");
  const RecomputeConfig& r = activation_checkpointing;
  require(r.n >= 1, "fsdp.activation_checkpointing.n", r.n, "a positive integer");
  require(r.mode == RecomputeMode::None || !r.module_types.empty(), "fsdp.activation_checkpointing.module_types",
          r.module_types,
          "at least one module type name when fsdp.activation_checkpointing.mode is not none, e.g. [DecoderLayer]");
}

}  // namespace st
