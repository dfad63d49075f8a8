// checkpoint.*: the keys and their one check.
#include "checkpoint/config.h"

namespace st {

void visit_keys(CheckpointConfig& k, const KeyVisitor& v) {
  v({"dir", "where checkpoints go; empty disables saving"}, k.dir);
  v({"shared", "auto (detect) | true (all hosts see one file system) | false (each host its own disk)"}, k.shared);
  v({"interval", "save every N steps; 0 = only at the end of the run"}, k.interval);
  v({"format", "unified (HF safetensors) | sharded (one file per rank)"}, k.format);
  v({"async", "write in a background thread while training goes on"}, k.async);
  v({"keep_last", "keep the newest N checkpoints; 0 keeps all"}, k.keep_last);
  v({"verify", "verify checksums on load"}, k.verify);
  v({"init_from", "start from these model weights (HF directory or checkpoint), fresh optimizer"}, k.init_from);
  UnifiedOptions& u = k.unified_checkpoint_config;
  v({"unified_checkpoint_config", "skip_save_model_weight | master_weight_compatible | enable_all_options"},
    Field::flags({{"skip_save_model_weight", &u.skip_save_model_weight},
                  {"master_weight_compatible", &u.master_weight_compatible},
                  {"enable_all_options", &u.enable_all_options}}));
  v({"strict",
     "refuse a checkpoint holding tensors the model lacks or whose config.json differs from model.*; false warns"},
    k.strict);
}

void CheckpointConfig::validate() const {
  require(interval >= 0, "checkpoint.interval", interval, "a non-negative integer (0 = only at the end)");
  require(keep_last >= 0, "checkpoint.keep_last", keep_last, "a non-negative integer (0 keeps all)");
  // The sharded layout writes no model weights at all, so skipping them means nothing there.
  require(!unified_checkpoint_config.skip_save_model_weight || format == checkpoint::Layout::Unified,
          "checkpoint.unified_checkpoint_config", std::string("skip_save_model_weight"),
          "no skip_save_model_weight with checkpoint.format: sharded (that layout stores only master weights "
          "and optimizer state already)");
}

}  // namespace st
