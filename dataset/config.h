#pragma once
// data.*: where the training and validation samples come from and how they
// are stored. The dataset library (dataset/dataset.h) reads only this section
// plus a few model and train values (DatasetSpec).
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <span>
#include <string>

#include "core/config.h"

namespace st {

enum class DataKind : uint8_t { Synthetic, Text, Tokens };
enum class TokenDType : uint8_t { U16, U32 };
enum class TokenFormat : uint8_t { Llmc, Headerless };

/// YAML spellings: "synthetic" | "text" | "tokens"; "uint16" | "uint32"; "llmc" | "headerless".
std::span<const Named<DataKind>> names_of(DataKind);
std::span<const Named<TokenDType>> names_of(TokenDType);
std::span<const Named<TokenFormat>> names_of(TokenFormat);

// clang-format off
struct DataConfig {
  DataKind kind = DataKind::Synthetic;  // synthetic (seeded learnable Markov-chain tokens) | text (UTF-8: bytes, or data.tokenizer's tokens) | tokens (uint16/uint32 .bin)
  std::string path;                     // file or directory for text/tokens; unused for synthetic
  TokenFormat token_format = TokenFormat::Llmc;  // tokens files: llmc (each an llm.c shard, header checked) | headerless (raw tokens of data.token_dtype)
  TokenDType token_dtype = TokenDType::U16;  // token width of headerless tokens files (llm.c shards give their own)
  std::string tokenizer;                // SentencePiece tokenizer.model (text/tokens): encodes data.kind text instead of bytes; its vocabulary must equal model.vocab_size; checkpoints hold a copy
  std::string val_path;                 // validation data for text/tokens, a file or directory of data.path's format; empty = none
  double val_fraction = 0;              // text/tokens without val_path: hold out this last fraction of data.path's samples for validation

  /// Throws st::Error naming the key.
  void validate() const;
  bool operator==(const DataConfig&) const = default;
};
// clang-format on

/// What the dataset library reads of a run's configuration: data.* and the
/// few model and train values that shape a sample.
struct DatasetSpec {
  DataConfig data;
  std::string model_name;    // model.name: "toy" trains on generated features, every other model on tokens
  int64_t vocab_size = 0;    // model.vocab_size: tokens must be below it
  int64_t seq_len = 0;       // train.seq_len: tokens per sample (each sample holds seq_len + 1)
  uint64_t seed = 0;         // train.seed: synthetic data, the toy teacher and the sampling order
  int64_t global_batch = 0;  // train.global_batch_size: the training set must hold one (0: not checked)
};

/// data.* keys, relative to the section ("kind", "path", ...).
void visit_keys(DataConfig& c, const KeyVisitor& v);

}  // namespace st
