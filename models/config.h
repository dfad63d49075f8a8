#pragma once
// model.*: which model to build and its sizes. The model table
// (models/model.h) decides which names exist and checks each model's own
// keys; validate() asks it.
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <string>

#include "core/config.h"

namespace st {

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

  /// Throws st::Error naming the key unless the model table knows `name` and
  /// that model accepts the sizes.
  void validate() const;
  bool operator==(const ModelConfig&) const = default;
};
// clang-format on

/// The model.* keys (names relative to the section: "name", "vocab_size", ...).
void visit_keys(ModelConfig& c, const KeyVisitor& v);

}  // namespace st
