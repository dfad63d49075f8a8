#pragma once
// Fully sharded data parallel, in the manner of PyTorch FSDP (FULL_SHARD,
// SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD), mixed precision and auto-wrapping,
// built on Module hooks; activation recomputation is fsdp/recompute.h.
//
// One mechanism serves every strategy: ranks form shard groups of g ranks
// (g = world for FULL_SHARD/SHARD_GRAD_OP, 1 for NO_SHARD, shard_group_size for
// HYBRID_SHARD) and replica groups across them. A unit's flat parameter is
// padded to a multiple of g; each rank keeps one contiguous shard of F32
// master weights and F32 gradients. Gradients are reduce-scattered within the
// shard group, then all-reduced across the replica group.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/comm.h"
#include "core/log.h"
#include "core/state.h"
#include "fsdp/config.h"
#include "fsdp/recompute.h"
#include "models/module.h"
#include "optim/optimizer.h"  // optim::Segment: segments() hands the shards to the optimizer

namespace st::fsdp {

/// A shard unit chosen by the wrap policy: the module that roots it and the
/// parameters it owns (its subtree minus nested units), in registration order.
struct UnitPlan {
  std::string name;  // FQN of the root module ("" for the model root)
  models::Module* module = nullptr;
  std::vector<std::pair<std::string, models::Parameter*>> params;  // (FQN, parameter)
  int64_t numel = 0;                                               // elements of its parameters
};

/// The shard units for `config.policy`. Every parameter of named_parameters()
/// is in exactly one unit under its usual FQN (wrapping renames nothing).
/// Units come in the depth-first pre-order of their root modules (the root
/// unit, name "", first); each unit's params in named_parameters() order.
/// A unit without parameters is dropped, the root's included (e.g. when
/// nested units take every parameter).
/// none: one unit, the root. transformer: every non-root module whose
/// type_name() is in module_types roots a unit (nested ones too); a type that
/// no module has is an error listing the model's types. size_based: PyTorch's
/// size_based_auto_wrap_policy with recursion: post-order, a non-root module
/// whose subtree parameters not yet taken by a nested unit number at least
/// min_num_params becomes a unit and takes them (ModuleList included). The
/// root unit takes the rest. Shared parameters (tied embeddings): a module
/// whose subtree owns or uses a parameter used by more than one module never
/// roots a unit, so the parameter, its owner and all its users stay in the
/// root unit.
std::vector<UnitPlan> plan_units(models::Module& root, const AutoWrapConfig& config);

/// The modules of `root`'s subtree (root included) whose type_name() is in
/// `types`, as (FQN, module) in pre-order. A listed type that no module has
/// is an error naming `key` (the config key that listed it) and the model's
/// module types. Wrap policies and recomputation choose modules by it.
std::vector<std::pair<std::string, models::Module*>> modules_of_types(models::Module& root,
                                                                      const std::vector<std::string>& types,
                                                                      std::string_view key);

/// Per-rank memory of the sharded state, in bytes.
struct MemoryReport {
  int64_t master_bytes = 0;            // F32 master shards
  int64_t grad_bytes = 0;              // F32 gradient shards
  int64_t optimizer_bytes = 0;         // optimizer state (filled by the caller)
  int64_t largest_gathered_bytes = 0;  // the biggest unit, gathered in param_dtype
};

class ShardedModel {
 public:
  /// Plans units, creates the shard and replica groups (split of `world`),
  /// allocates and initialises this rank's master shards (seeded init of just
  /// its slices) and installs hooks. `local_size` = ranks per host, used when
  /// HYBRID_SHARD's shard_group_size is 0. Every buffer (master and gradient
  /// shards, gathered weights, gradients) lives on `device`, and `world`'s
  /// backend must take tensors there (NCCL, or MPI, which stages through host
  /// memory). The model's input goes on that device too.
  ShardedModel(models::Module& model, const FsdpConfig& config, ProcessGroup& world, int local_size, uint64_t seed,
               Logger& log, Device device = Device::cpu());
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  /// Forward/backward of the whole model through its hooks. The first
  /// forward and backward record the units' execution order; prefetching
  /// (forward_prefetch, backward prefetch) follows it from then on.
  /// Gradients are SUM-reduced: scale the loss gradient by 1/global count.
  Tensor forward(const Tensor& x);
  void backward(const Tensor& dy);
  /// Zeroes the F32 gradient shards and drops every gathered copy of the
  /// weights. Call it at the start of each step, after the optimizer step (or
  /// after master weights were changed in place, e.g. by a checkpoint load)
  /// and before the next forward: units kept gathered (NO_SHARD, the root
  /// unit after a forward without backward) would otherwise be stale.
  void zero_grad();
  /// Frees every gathered copy of the weights and drops what the model's
  /// forward saved for backward; gradient shards and reductions are untouched.
  /// For forwards that no backward follows (evaluation): call it before them
  /// (copies kept gathered since the last step, NO_SHARD's, predate its
  /// optimizer step) and after them, so that nothing stays gathered or saved.
  void release();
  /// Waits for every outstanding reduction; gradient shards are final after
  /// it. grad_norm_squared() calls it too.
  void finish_grad_sync();

  /// One optimizer segment per unit: this rank's master shard, gradient shard
  /// and the parameter ranges inside it (padding excluded).
  const std::vector<optim::Segment>& segments() const;
  /// Squared global gradient norm (each element counted once over all ranks).
  double grad_norm_squared();
  /// This rank's pieces of the master weights as state entries (kind "master").
  std::vector<StateEntry> master_entries() const;
  /// The same pieces over other shard-shaped F32 buffers, one per segment in
  /// segments() order (optimizer state: "exp_avg", "exp_avg_sq", ...).
  std::vector<StateEntry> shard_entries(const std::vector<Tensor>& per_segment, const std::string& kind) const;
  /// The full F32 value of every parameter (gathered; collective), by FQN.
  std::vector<std::pair<std::string, std::vector<float>>> full_parameters();

  /// Logs the unit table (name, parameters, padded size) and per-rank memory.
  void log_memory_table(int64_t optimizer_bytes) const;
  MemoryReport memory_report() const;
  const std::vector<UnitPlan>& units() const;
  int shard_group_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace st::fsdp
