#pragma once
// checkpoint.*: where and how a run saves, and how it starts from saved state.
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/index.h"
#include "checkpoint/topology.h"
#include "core/config.h"

namespace st {

/// checkpoint.unified_checkpoint_config, read from its list of names (PaddleNLP's
/// option names): one bool per name, so the list written is the list kept.
struct UnifiedOptions {
  bool skip_save_model_weight = false;    // unified saves write no model-* files (master weights stand in)
  bool master_weight_compatible = false;  // a load may start F32 master weights from model-* weights
  bool enable_all_options = false;        // both of the above

  bool skip_model_weights() const { return skip_save_model_weight || enable_all_options; }
  bool master_from_model_weights() const { return master_weight_compatible || enable_all_options; }
  bool operator==(const UnifiedOptions&) const = default;
};

// clang-format off
struct CheckpointConfig {
  std::string dir;                     // where checkpoints go; empty disables saving
  checkpoint::SharedStorage shared = checkpoint::SharedStorage::Auto;  // auto (detect) | true (all hosts see one file system) | false (each host its own disk)
  int64_t interval = 0;                // save every N steps; 0 = only at the end of the run
  checkpoint::Layout format = checkpoint::Layout::Unified;  // unified (HF safetensors) | sharded (one file per rank)
  bool async = false;                  // write in a background thread while training goes on
  int64_t keep_last = 0;               // keep the newest N checkpoints; 0 keeps all
  bool verify = true;                  // verify checksums on load
  std::string init_from;               // start from these model weights (HF directory or checkpoint), fresh optimizer
  UnifiedOptions unified_checkpoint_config;  // skip_save_model_weight | master_weight_compatible | enable_all_options
  bool strict = true;                  // refuse a checkpoint holding tensors the model lacks or whose config.json differs from model.*; false warns

  /// Throws st::Error naming the key for a value out of range or options that do not go together.
  void validate() const;
  bool operator==(const CheckpointConfig&) const = default;
};
// clang-format on

/// The checkpoint.* keys (names relative to the section).
void visit_keys(CheckpointConfig& c, const KeyVisitor& v);

}  // namespace st
