// data.*: names, keys and validation.
#include "dataset/config.h"

#include "core/format.h"

namespace st {

namespace {
constexpr Named<DataKind> kDataNames[] = {
    {DataKind::Synthetic, "synthetic"}, {DataKind::Text, "text"}, {DataKind::Tokens, "tokens"}};
constexpr Named<TokenDType> kTokenDTypeNames[] = {{TokenDType::U16, "uint16"}, {TokenDType::U32, "uint32"}};
constexpr Named<TokenFormat> kTokenFormatNames[] = {{TokenFormat::Llmc, "llmc"},
                                                    {TokenFormat::Headerless, "headerless"}};
}  // namespace

std::span<const Named<DataKind>> names_of(DataKind) { return kDataNames; }
std::span<const Named<TokenDType>> names_of(TokenDType) { return kTokenDTypeNames; }
std::span<const Named<TokenFormat>> names_of(TokenFormat) { return kTokenFormatNames; }

void visit_keys(DataConfig& d, const KeyVisitor& v) {
  v({"kind",
     "synthetic (seeded learnable Markov-chain tokens) | text (UTF-8: bytes, or data.tokenizer's tokens) | tokens "
     "(uint16/uint32 .bin)"},
    d.kind);
  v({"path", "file or directory for text/tokens; unused for synthetic"}, d.path);
  v({"token_format",
     "tokens files: llmc (each an llm.c shard, header checked) | headerless (raw tokens of data.token_dtype)"},
    d.token_format);
  v({"token_dtype", "token width of headerless tokens files (llm.c shards give their own)"}, d.token_dtype);
  v({"tokenizer",
     "SentencePiece tokenizer.model (text/tokens): encodes data.kind text instead of bytes; its vocabulary must "
     "equal model.vocab_size; checkpoints hold a copy"},
    d.tokenizer);
  v({"val_path", "validation data for text/tokens, a file or directory of data.path's format; empty = none"},
    d.val_path);
  v({"val_fraction", "text/tokens without val_path: hold out this last fraction of data.path's samples for validation"},
    d.val_fraction);
}

void DataConfig::validate() const {
  require(kind == DataKind::Synthetic || !path.empty(), "data.path", path,
          format("a file or directory (required when data.kind is {})", to_string(kind)));
  require(tokenizer.empty() || kind != DataKind::Synthetic, "data.tokenizer", tokenizer,
          "empty with data.kind synthetic (a tokenizer is for data.kind text or tokens)");
  // Synthetic data has validation samples of its own (dataset/dataset.h), so neither key means anything there.
  require(kind != DataKind::Synthetic || val_path.empty(), "data.val_path", val_path,
          "\"\" for data.kind synthetic, which validates on generated samples that training never sees");
  require(kind != DataKind::Synthetic || val_fraction == 0, "data.val_fraction", val_fraction,
          "0 for data.kind synthetic, which validates on generated samples that training never sees");
  require(val_fraction >= 0 && val_fraction < 1, "data.val_fraction", val_fraction,
          "a fraction in [0, 1) (0: no held-out split)");
  require(val_path.empty() || val_fraction == 0, "data.val_fraction", val_fraction,
          format("0 when data.val_path is set ('{}'): validation data comes from one of the two", val_path));
}

}  // namespace st
