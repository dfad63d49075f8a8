#pragma once
// Writing llm.c token shards (the format dataset/dataset.h reads: a header of
// 256 little-endian int32, then the tokens), one split at a time.
#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/file.h"
#include "dataset/dataset.h"

namespace st::dataset {

/// The llm.c header of a shard of `count` tokens of `width` bytes (2: magic
/// kLlmcMagicU16, version 1; 4: kLlmcMagicU32, version 7).
std::array<int32_t, kLlmcHeaderBytes / 4> llmc_header(int width, int64_t count);

/// Writes one split's shards, DIR/<split>/<split>_NNNNNN.bin, each of at most
/// `shard_tokens` tokens. A shard is written as <name>.tmp and renamed once
/// complete, so a *.bin file is always whole; an error (or destruction before
/// close()) removes the partial shard. Errors name the file and the system's reason.
class ShardWriter {
 public:
  ShardWriter(std::filesystem::path dir, std::string split, int64_t shard_tokens, int width);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends `tokens` (each < 2^(8 x width)), opening and closing shards as they fill.
  void write(std::span<const int32_t> tokens);
  /// Finishes the open shard; returns the number of shards written.
  int64_t close();

  int64_t tokens() const { return total_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path path() const;
  std::filesystem::path tmp_path() const;
  std::string what() const;
  void open_next();

  std::filesystem::path dir_;
  std::string split_;
  int64_t shard_tokens_;
  int width_;
  UniqueFd out_;
  std::vector<char> buffer_;
  int64_t in_shard_ = 0;
  int64_t shards_ = 0;
  int64_t total_ = 0;
};

}  // namespace st::dataset
