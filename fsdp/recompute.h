#pragma once
// Activation recomputation (activation checkpointing), as PyTorch's
// checkpoint_wrapper: a wrapped module's forward keeps only its input and
// drops everything it saved for backward; its backward first re-runs the
// forward from that input, then runs the real backward. Same parameters, same
// input, same ops: the rebuilt state, and so every gradient, is bit-identical
// to a stored run.
//
// The wrapper sits inside the module's hooks, so when the module also roots a
// shard unit the unit's gather (pre_backward) comes before the re-run forward
// and the children's hooks fire again within it. Applied before sharding, as
// in PyTorch (launch/trainer.cpp: recomputation, then ShardedModel).
#include "fsdp/config.h"
#include "models/module.h"

namespace st::fsdp {

/// Wraps the modules of config.module_types (type_name() as in
/// fsdp.auto_wrap.module_types) found in `root`'s subtree, in pre-order:
/// full = all of them, every_n = the 0th, n-th, 2n-th, ... (n >= 1), none =
/// nothing (and nothing is checked). An empty list, a listed type the model
/// does not have (the error lists the model's types) or a module that already
/// has a wrapper is an error naming the key. Returns how many were wrapped.
int apply_activation_checkpointing(models::Module& root, const RecomputeConfig& config);

/// Wraps one module with recomputation (what apply_activation_checkpointing
/// does to each module it chooses). Error when it already has a wrapper.
void wrap_recompute(models::Module& module);

/// True when `module`'s forward is recomputed in its backward (it carries the
/// wrapper above).
bool is_recomputed(const models::Module& module);

}  // namespace st::fsdp
