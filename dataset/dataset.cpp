#include "dataset/dataset.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/format.h"
#include "core/hash.h"
#include "core/text.h"
#include "dataset/mapped_file.h"
#include "models/toy.h"

// Everything random here is a counter-based hash of (seed, domain tag,
// counters), never a sequential generator: a sample or a position of the
// sample order is computed directly from its number, so any rank can start
// anywhere in the stream (resumption, any world size) without replaying it.

namespace st::dataset {

namespace {

namespace fs = std::filesystem;
using models::Toy;

// ---------------------------------------------------------------------------
// Hashing.

constexpr uint64_t hash_of(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ b); }
constexpr uint64_t hash_of(uint64_t a, uint64_t b, uint64_t c) { return hash_of(hash_of(a, b), c); }

// Domain tags keep the streams that share train.seed independent of each other.
enum class Stream : uint64_t {
  Order = 0x6f72646572,            // sample order (the Feistel round keys)
  ChainEdges = 0x6564676573,       // synthetic: each state's successors
  ChainTokens = 0x746f6b656e,      // synthetic: the token id shown for each state
  ChainWalk = 0x77616c6b,          // synthetic: the walk of one sample
  ToyInputs = 0x696e70757473,      // toy: one sample's features
  ToyTeacherW = 0x7465616368,      // toy: teacher weight
  ToyTeacherB = 0x74656163686221,  // toy: teacher bias
};

constexpr uint64_t stream_key(uint64_t seed, Stream stream) { return hash_of(seed, static_cast<uint64_t>(stream)); }

/// The top 24 bits as a float in [0, 1): every value is exactly representable.
constexpr float unit_float(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

// ---------------------------------------------------------------------------
// Sample order: a keyed bijection of [0, n) evaluated one position at a time.

// A balanced Feistel network permutes [0, 4^h) for any round function; cycle
// walking (re-encrypting until the value lands below n) restricts it to a
// permutation of [0, n). With 4^h < 4n a walk takes under 4 steps on average,
// so each position costs O(1) and no permutation is ever materialised.
class Permutation {
 public:
  Permutation(uint64_t key, int64_t n) : n_(static_cast<uint64_t>(n)) {
    while ((uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
    mask_ = (uint64_t{1} << half_bits_) - 1;
    for (int r = 0; r < kRounds; ++r) round_keys_[r] = hash_of(key, static_cast<uint64_t>(r));
  }

  int64_t operator()(int64_t position) const {
    uint64_t x = static_cast<uint64_t>(position);
    do {
      x = encrypt(x);
    } while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  static constexpr int kRounds = 6;  // 3 full swaps: enough mixing for a data order

  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask_;
    for (uint64_t key : round_keys_) {
      const uint64_t next = left ^ (hash_of(key, right) & mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  int half_bits_ = 1;  // at least one bit per half, so n = 1 and n = 2 work too
  uint64_t mask_ = 0;
  std::array<uint64_t, kRounds> round_keys_{};
};

// ---------------------------------------------------------------------------
// Rows.

void check_row(const Tensor& row, DType dtype, int64_t numel, std::string_view what, std::string_view dataset) {
  ST_CHECK(row.defined() && row.dtype() == dtype && row.numel() == numel,
           "{} dataset: {} row must be {} with {} elements, got {}", dataset, what, dtype, numel,
           row.defined() ? row.str() : std::string("an undefined tensor"));
}

uint32_t read_u32_le(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

uint32_t read_token(const unsigned char* p, int width) {
  return width == 2 ? static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 : read_u32_le(p);
}

/// Samples of seq_len + 1 tokens, tiled with stride seq_len, that fit in n tokens.
int64_t windows_in(int64_t n, int64_t seq_len) { return n > seq_len ? (n - 1) / seq_len : 0; }

// ---------------------------------------------------------------------------
// synthetic

// The chain runs over min(V, kSyntheticActiveTokens) states, each shown as a
// seeded token id spread over the whole vocabulary. Each state may be followed
// only by its kSyntheticSuccessors successors, which the seed picks; a sample
// is a walk from a random start that picks one of them per step. The small
// state set is what makes a large vocabulary learnable in a short run: the
// unigram loss drops to ln(1024) within steps, and a model that learns the
// edge table gets to about ln(4).
class SyntheticDataset final : public Dataset {
 public:
  // Sample i is walk first_walk + i: training uses walks [0, kSyntheticSamples),
  // validation the next kSyntheticSamples, which training never sees.
  SyntheticDataset(uint64_t seed, int64_t vocab_size, int64_t seq_len, int64_t first_walk)
      : seed_(seed),
        edges_key_(stream_key(seed, Stream::ChainEdges)),
        walk_key_(stream_key(seed, Stream::ChainWalk)),
        states_(static_cast<uint64_t>(std::min(vocab_size, kSyntheticActiveTokens))),
        token_of_(stream_key(seed, Stream::ChainTokens), vocab_size),
        vocab_(vocab_size),
        seq_len_(seq_len),
        first_walk_(first_walk) {}

  int64_t size() const override { return kSyntheticSamples; }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    check_row(input_row, DType::I32, seq_len_, "input", "synthetic");
    check_row(target_row, DType::I32, seq_len_, "target", "synthetic");
    std::span<int32_t> in = input_row.span<int32_t>();
    std::span<int32_t> tgt = target_row.span<int32_t>();
    const uint64_t walk = hash_of(walk_key_, static_cast<uint64_t>(first_walk_ + index));
    uint64_t state = hash_of(walk, 0) % states_;
    int32_t token = static_cast<int32_t>(token_of_(static_cast<int64_t>(state)));
    for (int64_t k = 0; k < seq_len_; ++k) {
      in[k] = token;
      const uint64_t choice = hash_of(walk, static_cast<uint64_t>(k) + 1) % kSyntheticSuccessors;
      state = hash_of(edges_key_, state * kSyntheticSuccessors + choice) % states_;
      token = static_cast<int32_t>(token_of_(static_cast<int64_t>(state)));
      tgt[k] = token;
    }
  }

  std::string describe() const override {
    return format(
        "synthetic: seeded Markov chain over {} of {} tokens ({} successors each), {} samples of {} tokens (seed {}){}",
        with_commas(static_cast<int64_t>(states_)), with_commas(vocab_), kSyntheticSuccessors, with_commas(size()),
        seq_len_, seed_,
        first_walk_ > 0 ? format(", walks {} on (held out: training never sees them)", with_commas(first_walk_))
                        : std::string());
  }

 private:
  uint64_t seed_;
  uint64_t edges_key_;
  uint64_t walk_key_;
  uint64_t states_;
  Permutation token_of_;  // state -> token id
  int64_t vocab_;
  int64_t seq_len_;
  int64_t first_walk_;
};

// ---------------------------------------------------------------------------
// text

// `key` is the config key that named the file (data.path, data.val_path), for errors.
MappedFile open_text_file(const std::string& path, std::string_view key) {
  ST_CHECK(fs::exists(path), "text file '{}' ({}) does not exist", path, key);
  ST_CHECK(!fs::is_directory(path), "text file '{}' ({}) is a directory; data.kind text reads one file", path, key);
  MappedFile file(path, format("{} text", key));
  ST_CHECK(file.size() > 0, "text file '{}' is empty", path);
  const std::string problem = text_sample_problem(file.text().substr(0, kTextSampleBytes));
  ST_CHECK(problem.empty(),
           "text file '{}' ({}) is not UTF-8 text: {} in its first {} KiB; data.kind text reads UTF-8 text (prepare "
           "refuses the same file; a file of token ids is data.kind tokens)",
           path, key, problem, kTextSampleBytes >> 10);
  return file;
}

class TextDataset final : public Dataset {
 public:
  // `key` is the config key that named the file (data.path, data.val_path), for errors.
  TextDataset(const std::string& path, std::string_view key, int64_t vocab_size, int64_t seq_len)
      : path_(path), file_(open_text(path, key, vocab_size, seq_len)), seq_len_(seq_len) {}

  int64_t size() const override { return windows_in(static_cast<int64_t>(file_.size()), seq_len_); }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    check_row(input_row, DType::I32, seq_len_, "input", "text");
    check_row(target_row, DType::I32, seq_len_, "target", "text");
    std::span<int32_t> in = input_row.span<int32_t>();
    std::span<int32_t> tgt = target_row.span<int32_t>();
    const unsigned char* window = file_.data() + index * seq_len_;
    for (int64_t k = 0; k < seq_len_; ++k) {
      in[k] = window[k];
      tgt[k] = window[k + 1];
    }
  }

  std::string describe() const override {
    return format("text {}: {}, {} samples of {} tokens (bytes, vocab 256)", path_,
                  human_bytes(static_cast<int64_t>(file_.size())), with_commas(size()), seq_len_);
  }

 private:
  static MappedFile open_text(const std::string& path, std::string_view key, int64_t vocab_size, int64_t seq_len) {
    ST_CHECK(vocab_size >= 256,
             "data.kind text uses byte-level tokens (256 values) but model.vocab_size is {}; set model.vocab_size "
             "to at least 256",
             vocab_size);
    MappedFile file = open_text_file(path, key);
    ST_CHECK(windows_in(static_cast<int64_t>(file.size()), seq_len) > 0,
             "text file '{}' has {} bytes, too short for one sample: train.seq_len {} needs at least {} bytes", path,
             file.size(), seq_len, seq_len + 1);
    return file;
  }

  std::string path_;
  MappedFile file_;
  int64_t seq_len_;
};

// data.kind text with data.tokenizer: the file encoded once (one document),
// its tokens tiled like the bytes above.
class EncodedTextDataset final : public Dataset {
 public:
  EncodedTextDataset(const std::string& path, std::string_view key, const Tokenizer& tokenizer, int64_t seq_len)
      : path_(path), tokenizer_path_(tokenizer.path()), vocab_(tokenizer.vocab_size()), seq_len_(seq_len) {
    const MappedFile file = open_text_file(path, key);
    bytes_ = file.size();
    tokens_ = encode_document(tokenizer, file.text(), kEncodeThreads);
    ST_CHECK(size() > 0,
             "text file '{}' encodes to {} tokens with data.tokenizer '{}', too short for one sample: train.seq_len "
             "{} needs at least {} tokens",
             path, tokens_.size(), tokenizer_path_, seq_len, seq_len + 1);
  }

  int64_t size() const override { return windows_in(static_cast<int64_t>(tokens_.size()), seq_len_); }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    check_row(input_row, DType::I32, seq_len_, "input", "text");
    check_row(target_row, DType::I32, seq_len_, "target", "text");
    std::span<int32_t> in = input_row.span<int32_t>();
    std::span<int32_t> tgt = target_row.span<int32_t>();
    const int32_t* window = tokens_.data() + index * seq_len_;
    std::copy(window, window + seq_len_, in.begin());
    std::copy(window + 1, window + seq_len_ + 1, tgt.begin());
  }

  std::string describe() const override {
    return format("text {}: {}, {} tokens of {} (vocab {}), {} samples of {} tokens", path_,
                  human_bytes(static_cast<int64_t>(bytes_)), with_commas(static_cast<int64_t>(tokens_.size())),
                  tokenizer_path_, with_commas(vocab_), with_commas(size()), seq_len_);
  }

 private:
  static constexpr int kEncodeThreads = 4;  // start-up only; the result does not depend on it

  std::string path_;
  std::string tokenizer_path_;
  int64_t vocab_;
  int64_t seq_len_;
  size_t bytes_ = 0;
  std::vector<int32_t> tokens_;
};

// ---------------------------------------------------------------------------
// tokens

constexpr uint32_t kMagicGpt2 = kLlmcMagicU16;
constexpr uint32_t kMagicLlama3 = kLlmcMagicU32;
constexpr size_t kHeaderBytes = kLlmcHeaderBytes;

struct TokenShard {
  std::string path;
  MappedFile file;
  size_t data_offset = 0;  // bytes before the first token (the llm.c header)
  int width = 2;           // bytes per token
  int64_t num_tokens = 0;
  std::string layout;  // "llm.c v1 uint16", "uint16", ...
};

// Index of the first token in [lo, hi) of little-endian T tokens at `p` that is
// >= limit, or -1. Blocks are reduced to their maximum first (a loop the
// compiler vectorises), so a clean corpus is scanned at memory speed.
template <class T>
int64_t first_at_or_above(const unsigned char* p, int64_t lo, int64_t hi, int64_t limit) {
  static_assert(std::endian::native == std::endian::little, "tokens are read in place as little-endian");
  constexpr int64_t kBlock = 4096;
  for (int64_t b = lo; b < hi; b += kBlock) {
    const int64_t n = std::min(kBlock, hi - b);
    T top = 0;
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + (b + i) * static_cast<int64_t>(sizeof(T)), sizeof(T));
      top = std::max(top, v);
    }
    if (static_cast<int64_t>(top) < limit) continue;
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + (b + i) * static_cast<int64_t>(sizeof(T)), sizeof(T));
      if (static_cast<int64_t>(v) >= limit) return b + i;
    }
  }
  return -1;
}

// llm.c's shard kinds: the magic names the token width, and each magic has one
// version (llm.c's dev/data/data_common.py).
struct LlmcKind {
  uint32_t magic;
  uint32_t version;
  int width;
};
constexpr LlmcKind kLlmcKinds[] = {{kMagicGpt2, 1, 2}, {kMagicLlama3, 7, 4}};

const LlmcKind* llmc_kind(uint32_t magic) {
  for (const LlmcKind& k : kLlmcKinds)
    if (k.magic == magic) return &k;
  return nullptr;
}

// data.token_format llmc: the header must be whole and valid (magic, version,
// count == the file's tokens); nothing is ever read as headerless tokens.
void open_llmc_shard(TokenShard& shard) {
  const std::string& name = shard.path;
  const size_t bytes = shard.file.size();
  const uint32_t magic = bytes >= 4 ? read_u32_le(shard.file.data()) : 0;
  const LlmcKind* kind = llmc_kind(magic);
  ST_CHECK(kind != nullptr,
           "tokens file '{}' is not an llm.c shard: {} instead of the magic {} (uint16 tokens) or {} (uint32 "
           "tokens); for raw tokens without a header set data.token_format: headerless (and data.token_dtype)",
           name, bytes >= 4 ? format("it starts with {}", magic) : format("it has only {} bytes", bytes), kMagicGpt2,
           kMagicLlama3);
  ST_CHECK(bytes >= kHeaderBytes,
           "tokens file '{}' has {} bytes but starts with the llm.c magic {}: it is shorter than the 1024-byte "
           "header, so it is truncated",
           name, bytes, magic);
  const unsigned char* h = shard.file.data();
  const uint32_t version = read_u32_le(h + 4);
  const int64_t count = static_cast<int32_t>(read_u32_le(h + 8));
  ST_CHECK(version == kind->version,
           "tokens file '{}': its llm.c header (magic {}) has version {}; llm.c's uint{} shards have version {}, so "
           "the header is damaged or of a format we do not read",
           name, magic, version, 8 * kind->width, kind->version);
  ST_CHECK(count >= 0, "tokens file '{}': its llm.c header (magic {}) gives a negative token count {}", name, magic,
           count);
  const uint64_t expected = kHeaderBytes + static_cast<uint64_t>(count) * static_cast<uint64_t>(kind->width);
  ST_CHECK(bytes == expected,
           "tokens file '{}' has {} bytes, but its llm.c header (magic {}, {} uint{} tokens) means {} bytes "
           "(1024 + {} x {}); the file is truncated or the header is wrong",
           name, bytes, magic, count, 8 * kind->width, expected, count, kind->width);
  shard.data_offset = kHeaderBytes;
  shard.width = kind->width;
  shard.num_tokens = count;
  shard.layout = format("llm.c v{} uint{}", version, 8 * kind->width);
}

// data.token_format headerless: every byte is a token, so a file that starts
// with an llm.c magic (an llm.c shard, whose header would become tokens) is refused.
void open_headerless(TokenShard& shard, TokenDType dtype) {
  const std::string& name = shard.path;
  const size_t bytes = shard.file.size();
  if (bytes >= 4) {
    const uint32_t magic = read_u32_le(shard.file.data());
    ST_CHECK(llmc_kind(magic) == nullptr,
             "tokens file '{}' starts with the llm.c magic {}: it is an llm.c shard, which data.token_format "
             "headerless would read header and all; set data.token_format: llmc",
             name, magic);
  }
  const int width = dtype == TokenDType::U16 ? 2 : 4;
  ST_CHECK(bytes % static_cast<size_t>(width) == 0,
           "tokens file '{}' has {} bytes, not a multiple of {} (data.token_dtype: {} tokens)", name, bytes, width,
           to_string(dtype));
  shard.width = width;
  shard.num_tokens = static_cast<int64_t>(bytes / static_cast<size_t>(width));
  shard.layout = std::string(to_string(dtype));
}

// `key` is the config key that named the file or its directory, for errors.
TokenShard open_shard(const fs::path& path, std::string_view key, TokenFormat token_format,
                      TokenDType headerless_dtype) {
  TokenShard shard{path.string(), MappedFile(path, format("{} tokens", key)), 0, 2, 0, ""};
  ST_CHECK(shard.file.size() > 0, "tokens file '{}' is empty", shard.path);
  if (token_format == TokenFormat::Llmc)
    open_llmc_shard(shard);
  else
    open_headerless(shard, headerless_dtype);
  return shard;
}

class TokensDataset final : public Dataset {
 public:
  // `key` is the config key that named the path (data.path, data.val_path), for errors.
  TokensDataset(const std::string& path, std::string_view key, TokenFormat token_format, TokenDType headerless_dtype,
                int64_t vocab_size, int64_t seq_len)
      : path_(path), vocab_(vocab_size), seq_len_(seq_len) {
    ST_CHECK(fs::exists(path), "tokens path '{}' ({}) does not exist", path, key);
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (const fs::directory_entry& entry : fs::directory_iterator(path))
        if (entry.is_regular_file() && entry.path().extension() == ".bin") files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      ST_CHECK(!files.empty(), "tokens directory '{}' ({}) has no *.bin files", path, key);
    } else {
      files.push_back(path);
    }

    first_sample_.push_back(0);
    int64_t longest = 0;
    for (const fs::path& f : files) {
      shards_.push_back(open_shard(f, key, token_format, headerless_dtype));
      longest = std::max(longest, shards_.back().num_tokens);
      first_sample_.push_back(first_sample_.back() + windows_in(shards_.back().num_tokens, seq_len_));
    }
    if (files.size() == 1) {
      ST_CHECK(size() > 0,
               "tokens file '{}' has {} tokens, too short for one sample: train.seq_len {} needs at least {} tokens",
               path, longest, seq_len_, seq_len_ + 1);
    }
    ST_CHECK(size() > 0,
             "no file in tokens directory '{}' is long enough for one sample: the longest has {} tokens and "
             "train.seq_len {} needs at least {}",
             path, longest, seq_len_, seq_len_ + 1);
  }

  int64_t size() const override { return first_sample_.back(); }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    check_row(input_row, DType::I32, seq_len_, "input", "tokens");
    check_row(target_row, DType::I32, seq_len_, "target", "tokens");
    std::span<int32_t> in = input_row.span<int32_t>();
    std::span<int32_t> tgt = target_row.span<int32_t>();
    // Shards with no whole window repeat their start, so take the last match.
    const size_t s = static_cast<size_t>(std::upper_bound(first_sample_.begin(), first_sample_.end(), index) -
                                         first_sample_.begin() - 1);
    const TokenShard& shard = shards_[s];
    const size_t first_byte = shard.data_offset + static_cast<size_t>((index - first_sample_[s]) * seq_len_) *
                                                      static_cast<size_t>(shard.width);
    for (int64_t k = 0; k <= seq_len_; ++k) {
      const size_t offset = first_byte + static_cast<size_t>(k) * static_cast<size_t>(shard.width);
      const uint32_t token = read_token(shard.file.data() + offset, shard.width);
      // find_bad_token() checked every token at start-up; this guards direct use of the dataset.
      ST_CHECK(token < static_cast<uint64_t>(vocab_),
               "tokens file '{}': token {} at byte offset {} is >= model.vocab_size ({})", shard.path, token, offset,
               vocab_);
      if (k < seq_len_) in[k] = static_cast<int32_t>(token);
      if (k > 0) tgt[k - 1] = static_cast<int32_t>(token);
    }
  }

  std::string find_bad_token(int part, int parts) const override {
    int64_t total = 0;
    for (const TokenShard& s : shards_) total += s.num_tokens;
    // Part `part` covers tokens [begin, end) of the shards laid end to end.
    const int64_t begin = total / parts * part + std::min<int64_t>(part, total % parts);
    const int64_t end = begin + total / parts + (part < total % parts ? 1 : 0);
    int64_t first = 0;  // index of the shard's first token in that concatenation
    for (const TokenShard& s : shards_) {
      const int64_t lo = std::max(begin, first) - first;
      const int64_t hi = std::min(end, first + s.num_tokens) - first;
      first += s.num_tokens;
      if (lo >= hi) continue;
      const unsigned char* p = s.file.data() + s.data_offset;
      const int64_t at = s.width == 2 ? first_at_or_above<uint16_t>(p, lo, hi, vocab_)
                                      : first_at_or_above<uint32_t>(p, lo, hi, vocab_);
      if (at < 0) continue;
      const size_t offset = s.data_offset + static_cast<size_t>(at) * static_cast<size_t>(s.width);
      return format("tokens file '{}': token {} at byte offset {} (token {} of the file) is >= model.vocab_size ({})",
                    s.path, read_token(p + static_cast<size_t>(at) * static_cast<size_t>(s.width), s.width), offset, at,
                    vocab_);
    }
    return {};
  }

  std::string describe() const override {
    int64_t tokens = 0;
    uint64_t bytes = 0;
    std::vector<std::string> formats;
    for (const TokenShard& s : shards_) {
      tokens += s.num_tokens;
      bytes += s.file.size();
      if (std::find(formats.begin(), formats.end(), s.layout) == formats.end()) formats.push_back(s.layout);
    }
    std::string kinds;
    for (const std::string& f : formats) kinds += (kinds.empty() ? "" : ", ") + f;
    const std::string files = shards_.size() == 1 ? std::string() : format("{} files, ", shards_.size());
    return format("tokens {}: {}{}, {} {} tokens, {} samples of {} tokens", path_, files,
                  human_bytes(static_cast<int64_t>(bytes)), with_commas(tokens), kinds, with_commas(size()), seq_len_);
  }

 private:
  std::string path_;
  int64_t vocab_;
  int64_t seq_len_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_sample_;  // prefix sums of samples per shard; back() is size()
};

// ---------------------------------------------------------------------------
// toy

class ToyDataset final : public Dataset {
 public:
  // Sample i is draw first_sample + i: training uses draws [0, kToySamples),
  // validation the next kToySamples.
  ToyDataset(uint64_t seed, int64_t first_sample)
      : seed_(seed),
        inputs_key_(stream_key(seed, Stream::ToyInputs)),
        teacher_(toy_teacher(seed)),
        first_sample_(first_sample) {}

  int64_t size() const override { return kToySamples; }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    check_row(input_row, DType::F32, Toy::kIn, "input", "toy");
    check_row(target_row, DType::F32, Toy::kOut, "target", "toy");
    std::span<float> x = input_row.span<float>();
    std::span<float> y = target_row.span<float>();
    const uint64_t sample = hash_of(inputs_key_, static_cast<uint64_t>(first_sample_ + index));
    for (int64_t j = 0; j < Toy::kIn; ++j) x[j] = unit_float(hash_of(sample, static_cast<uint64_t>(j)));
    for (int64_t o = 0; o < Toy::kOut; ++o) {
      float acc = teacher_.bias[o];
      for (int64_t j = 0; j < Toy::kIn; ++j) acc += teacher_.weight[o * Toy::kIn + j] * x[j];
      y[o] = acc;
    }
  }

  std::string describe() const override {
    return format("toy: {} samples of {} uniform [0, 1) features -> {} targets of a fixed linear teacher (seed {}){}",
                  with_commas(size()), Toy::kIn, Toy::kOut, seed_,
                  first_sample_ > 0
                      ? format(", draws {} on (held out: training never sees them)", with_commas(first_sample_))
                      : std::string());
  }

 private:
  uint64_t seed_;
  uint64_t inputs_key_;
  ToyTeacher teacher_;
  int64_t first_sample_;
};

// ---------------------------------------------------------------------------
// data.val_fraction: one part of a dataset's samples.

enum class Part : uint8_t { Train, Validation };

// The first samples of `whole` (Train) or the last ceil(fraction x size)
// (Validation). Both parts open the file; only the training part scans it for
// bad tokens, which covers the held-out samples too.
class HeldOutSplit final : public Dataset {
 public:
  HeldOutSplit(std::unique_ptr<Dataset> whole, double fraction, Part part)
      : whole_(std::move(whole)), fraction_(fraction), part_(part) {
    const int64_t n = whole_->size();
    held_ = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n)));
    ST_CHECK(held_ < n,
             "data.val_fraction {} holds out {} of the {} samples of {}, leaving none for training; lower "
             "data.val_fraction or give a separate data.val_path",
             fraction, held_, n, whole_->describe());
    first_ = part == Part::Train ? 0 : n - held_;
    size_ = part == Part::Train ? n - held_ : held_;
  }

  int64_t size() const override { return size_; }

  void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const override {
    ST_CHECK(index >= 0 && index < size_, "sample {} is outside this part [0, {}) of the data", index, size_);
    whole_->get(first_ + index, input_row, target_row);
  }

  std::string describe() const override {
    if (part_ == Part::Train) {
      return format("{}; training on samples [0, {}), the last {} held out (data.val_fraction {})", whole_->describe(),
                    size_, with_commas(held_), fraction_);
    }
    return format("{}; the last {} samples, [{}, {}), held out (data.val_fraction {})", whole_->describe(),
                  with_commas(held_), first_, first_ + size_, fraction_);
  }

  std::string find_bad_token(int part, int parts) const override {
    return part_ == Part::Train ? whole_->find_bad_token(part, parts) : std::string();
  }

 private:
  std::unique_ptr<Dataset> whole_;
  double fraction_;
  Part part_;
  int64_t held_ = 0;
  int64_t first_ = 0;
  int64_t size_ = 0;
};

}  // namespace

ToyTeacher toy_teacher(uint64_t seed) {
  // Entries in [-0.5, 0.5): targets of inputs in [0, 1) stay of order 1, so
  // the tutorial's learning rates work unchanged.
  ToyTeacher t;
  const uint64_t w_key = stream_key(seed, Stream::ToyTeacherW);
  const uint64_t b_key = stream_key(seed, Stream::ToyTeacherB);
  for (int64_t i = 0; i < Toy::kOut * Toy::kIn; ++i)
    t.weight.push_back(unit_float(hash_of(w_key, static_cast<uint64_t>(i))) - 0.5f);
  for (int64_t o = 0; o < Toy::kOut; ++o) t.bias.push_back(unit_float(hash_of(b_key, static_cast<uint64_t>(o))) - 0.5f);
  return t;
}

namespace {

// The toy model's features and synthetic tokens: generated, so the
// validation part is simply the next samples of the same stream.
bool is_generated(const DatasetSpec& spec) {
  ST_CHECK(spec.model_name != "toy" || spec.data.kind == DataKind::Synthetic,
           "model.name toy trains on seeded random features, so data.kind must be synthetic (got {})",
           to_string(spec.data.kind));
  return spec.data.kind == DataKind::Synthetic;
}

void check_token_model(const DatasetSpec& spec) {
  const int64_t seq_len = spec.seq_len;
  const int64_t vocab = spec.vocab_size;
  ST_CHECK(seq_len > 0, "invalid value {} for 'train.seq_len': expected a positive integer", seq_len);
  // Tokens travel as I32.
  ST_CHECK(vocab > 0 && vocab <= std::numeric_limits<int32_t>::max(),
           "invalid value {} for 'model.vocab_size': expected 1 to {} (tokens are int32)", vocab,
           std::numeric_limits<int32_t>::max());
}

std::unique_ptr<Dataset> generated(const DatasetSpec& spec, Part part) {
  const uint64_t seed = spec.seed;
  const bool val = part == Part::Validation;
  if (spec.model_name == "toy") return std::make_unique<ToyDataset>(seed, val ? kToySamples : 0);
  check_token_model(spec);
  return std::make_unique<SyntheticDataset>(seed, spec.vocab_size, spec.seq_len, val ? kSyntheticSamples : 0);
}

// The text or tokens at `path`, which config key `key` names.
std::unique_ptr<Dataset> from_file(const DatasetSpec& spec, const std::string& path, std::string_view key) {
  check_token_model(spec);
  const int64_t seq_len = spec.seq_len;
  const int64_t vocab = spec.vocab_size;
  // Checked against model.vocab_size before any data is read.
  const std::optional<Tokenizer> tokenizer = load_data_tokenizer(spec);
  if (spec.data.kind == DataKind::Text) {
    if (tokenizer) return std::make_unique<EncodedTextDataset>(path, key, *tokenizer, seq_len);
    return std::make_unique<TextDataset>(path, key, vocab, seq_len);
  }
  ST_CHECK(spec.data.kind == DataKind::Tokens, "unknown data.kind {}", static_cast<int>(spec.data.kind));
  return std::make_unique<TokensDataset>(path, key, spec.data.token_format, spec.data.token_dtype, vocab, seq_len);
}

// The training set of `spec`, before the global-batch check.
std::unique_ptr<Dataset> training_set(const DatasetSpec& spec) {
  if (is_generated(spec)) return generated(spec, Part::Train);
  std::unique_ptr<Dataset> whole = from_file(spec, spec.data.path, "data.path");
  if (spec.data.val_fraction == 0) return whole;
  return std::make_unique<HeldOutSplit>(std::move(whole), spec.data.val_fraction, Part::Train);
}

}  // namespace

std::string text_sample_problem(std::string_view sample) {
  if (const size_t nul = sample.find('\0'); nul != std::string_view::npos)
    return format("a NUL byte at offset {}", nul);
  if (const int64_t bad = find_invalid_utf8(sample, Utf8End::MayBeCut); bad >= 0)
    return format("an invalid UTF-8 byte at offset {}", bad);
  return {};
}

std::unique_ptr<Dataset> make_dataset(const DatasetSpec& spec) {
  std::unique_ptr<Dataset> data = training_set(spec);
  // A global batch larger than an epoch would draw the same samples twice in
  // one step; with a global batch beyond any real run it also meant start-up
  // buffers and a step that never ended.
  ST_CHECK(data->size() >= spec.global_batch,
           "train.global_batch_size {} is larger than the training data, {} samples ({}); lower "
           "train.global_batch_size to at most {} or give more data",
           spec.global_batch, data->size(), data->describe(), data->size());
  return data;
}

std::unique_ptr<Dataset> make_validation_dataset(const DatasetSpec& spec) {
  if (is_generated(spec)) return generated(spec, Part::Validation);
  const DataConfig& data = spec.data;
  if (!data.val_path.empty()) return from_file(spec, data.val_path, "data.val_path");
  if (data.val_fraction == 0) return nullptr;
  return std::make_unique<HeldOutSplit>(from_file(spec, data.path, "data.path"), data.val_fraction, Part::Validation);
}

std::optional<Tokenizer> load_data_tokenizer(const DatasetSpec& spec) {
  if (spec.data.tokenizer.empty()) return std::nullopt;
  Tokenizer tokenizer = Tokenizer::load(spec.data.tokenizer);
  ST_CHECK(tokenizer.vocab_size() == spec.vocab_size,
           "data.tokenizer '{}' has a vocabulary of {} tokens but model.vocab_size is {}; they must be equal (set "
           "model.vocab_size: {})",
           spec.data.tokenizer, tokenizer.vocab_size(), spec.vocab_size, tokenizer.vocab_size());
  return tokenizer;
}

// ---------------------------------------------------------------------------
// Sampler.

std::vector<int64_t> sample_indices(uint64_t seed, int64_t dataset_size, int64_t first, int64_t count) {
  ST_CHECK(dataset_size > 0, "sample_indices: the dataset is empty");
  ST_CHECK(first >= 0 && count >= 0, "sample_indices: positions [{}, {} + {}) must be non-negative", first, first,
           count);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  const uint64_t order_key = stream_key(seed, Stream::Order);
  int64_t epoch = first / dataset_size;
  int64_t offset = first % dataset_size;
  Permutation perm(hash_of(order_key, static_cast<uint64_t>(epoch)), dataset_size);
  for (int64_t i = 0; i < count; ++i) {
    if (offset == dataset_size) {
      offset = 0;
      ++epoch;
      perm = Permutation(hash_of(order_key, static_cast<uint64_t>(epoch)), dataset_size);
    }
    out.push_back(perm(offset++));
  }
  return out;
}

std::vector<int64_t> rank_batch_indices(uint64_t seed, int64_t dataset_size, int64_t consumed, int64_t global_batch,
                                        int rank, int world) {
  ST_CHECK(world > 0 && rank >= 0 && rank < world, "rank_batch_indices: rank {} is not in a world of {}", rank, world);
  ST_CHECK(global_batch > 0 && global_batch % world == 0,
           "train.global_batch_size ({}) must be a positive multiple of the world size ({}) so every rank gets the "
           "same number of samples",
           global_batch, world);
  const int64_t per_rank = global_batch / world;
  return sample_indices(seed, dataset_size, consumed + rank * per_rank, per_rank);
}

void load_batch(const Dataset& dataset, std::span<const int64_t> indices, const Tensor& inputs, const Tensor& targets) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  ST_CHECK(inputs.defined() && inputs.dim() >= 1 && inputs.size(0) == rows,
           "load_batch: inputs {} must have {} rows, one per sample index", inputs.str(), rows);
  ST_CHECK(targets.defined() && targets.dim() >= 1 && targets.size(0) == rows,
           "load_batch: targets {} must have {} rows, one per sample index", targets.str(), rows);
  // Datasets write through CPU spans; a device batch is filled on the host and copied once.
  const Tensor in = inputs.device().is_cpu() ? inputs : Tensor::empty(inputs.shape(), inputs.dtype());
  const Tensor tgt = targets.device().is_cpu() ? targets : Tensor::empty(targets.shape(), targets.dtype());
  const Shape in_row(in.shape().begin() + 1, in.shape().end());
  const Shape tgt_row(tgt.shape().begin() + 1, tgt.shape().end());
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    ST_CHECK(index >= 0 && index < dataset.size(), "load_batch: sample index {} is outside the dataset [0, {})", index,
             dataset.size());
    dataset.get(index, in.narrow0(i, 1).view(in_row), tgt.narrow0(i, 1).view(tgt_row));
  }
  if (!in.shares_storage_with(inputs)) inputs.copy_from(in);
  if (!tgt.shares_storage_with(targets)) targets.copy_from(tgt);
}

}  // namespace st::dataset
