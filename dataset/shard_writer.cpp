#include "dataset/shard_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fcntl.h>

#include "core/error.h"
#include "core/format.h"

namespace st::dataset {

namespace fs = std::filesystem;

std::array<int32_t, kLlmcHeaderBytes / 4> llmc_header(int width, int64_t count) {
  static_assert(std::endian::native == std::endian::little, "llm.c shards are little-endian");
  std::array<int32_t, kLlmcHeaderBytes / 4> h{};
  h[0] = static_cast<int32_t>(width == 2 ? kLlmcMagicU16 : kLlmcMagicU32);
  h[1] = width == 2 ? 1 : 7;  // llm.c's versions: 1 for GPT-2 (uint16) shards, 7 for LLaMA 3 (uint32)
  h[2] = static_cast<int32_t>(count);
  return h;
}

ShardWriter::ShardWriter(fs::path dir, std::string split, int64_t shard_tokens, int width)
    : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), width_(width) {}

ShardWriter::~ShardWriter() {
  if (out_.valid()) {  // an error before close(): drop the partial shard
    out_ = UniqueFd();
    std::error_code ec;
    fs::remove(tmp_path(), ec);
  }
}

void ShardWriter::write(std::span<const int32_t> tokens) {
  while (!tokens.empty()) {
    if (!out_.valid()) open_next();
    const size_t n = std::min(tokens.size(), static_cast<size_t>(shard_tokens_ - in_shard_));
    buffer_.resize(n * static_cast<size_t>(width_));
    for (size_t i = 0; i < n; ++i) {
      const auto v = static_cast<uint32_t>(tokens[i]);
      std::memcpy(buffer_.data() + i * static_cast<size_t>(width_), &v,
                  static_cast<size_t>(width_));  // little-endian
    }
    write_all(out_.get(), buffer_.data(), buffer_.size(), what());
    in_shard_ += static_cast<int64_t>(n);
    total_ += static_cast<int64_t>(n);
    tokens = tokens.subspan(n);
    if (in_shard_ == shard_tokens_) close();
  }
}

int64_t ShardWriter::close() {
  if (!out_.valid()) return shards_;
  const auto final_header = llmc_header(width_, in_shard_);
  pwrite_all(out_.get(), final_header.data(), sizeof(final_header), 0, what());
  out_.close_checked(tmp_path());
  rename_path(tmp_path(), path());
  ++shards_;
  in_shard_ = 0;
  return shards_;
}

fs::path ShardWriter::path() const {
  const std::string number = std::to_string(shards_);
  return dir_ / (split_ + "_" + std::string(6 - std::min<size_t>(6, number.size()), '0') + number + ".bin");
}

fs::path ShardWriter::tmp_path() const { return fs::path(path().string() + ".tmp"); }

std::string ShardWriter::what() const { return format("shard '{}'", tmp_path().string()); }

void ShardWriter::open_next() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  ST_CHECK(!ec, "cannot create '{}': {}", dir_.string(), ec.message());
  // open_output_file: a FIFO at that path is refused instead of blocking the open.
  out_ = open_output_file(tmp_path(), "shard", OutputMode::Truncate);
  const auto placeholder = llmc_header(width_, 0);  // the count is written at close()
  write_all(out_.get(), placeholder.data(), sizeof(placeholder), what());
}

}  // namespace st::dataset
