// Datasets and the resumable sampler: the sampler's batches must not depend on
// the world size or on where a run resumed; every dataset's samples and errors
// are checked against files written here with known contents.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "dataset/dataset.h"
#include "launch/config.h"
#include "models/toy.h"
#include "tests/harness/dataset_from_config.h"

namespace st::dataset {
namespace {

namespace fs = std::filesystem;
using models::Toy;

// ---------------------------------------------------------------------------
// Helpers.

/// The message of the st::Error `fn` throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("st_test_data_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <class T>
void append_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out += static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
}

/// Tokens of `width` bytes, little-endian, no header.
std::string headerless(const std::vector<uint32_t>& tokens, int width) {
  std::string out;
  for (uint32_t t : tokens) width == 2 ? append_le(out, static_cast<uint16_t>(t)) : append_le(out, t);
  return out;
}

/// An llm.c shard: 256 int32 header (magic, version, count), then the tokens.
std::string llmc_shard(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens, int width) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string out;
  for (int32_t h : header) append_le(out, static_cast<uint32_t>(h));
  return out + headerless(tokens, width);
}

std::vector<uint32_t> ramp(uint32_t first, size_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

Config llama_config(DataKind kind, const std::string& path, int64_t seq_len, int64_t vocab_size) {
  Config c;
  c.data.kind = kind;
  c.data.path = path;
  c.train.seq_len = seq_len;
  c.model.vocab_size = vocab_size;
  c.train.global_batch_size = 1;  // the files here hold a few samples; TrainingData.GlobalBatch... checks the bound
  c.train.micro_batch_size = 1;
  return c;
}

/// llama_config for raw tokens without a header (data.token_format headerless).
Config headerless_config(const std::string& path, int64_t seq_len, int64_t vocab_size,
                         TokenDType dtype = TokenDType::U16) {
  Config c = llama_config(DataKind::Tokens, path, seq_len, vocab_size);
  c.data.token_format = TokenFormat::Headerless;
  c.data.token_dtype = dtype;
  return c;
}

struct Sample {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

Sample token_sample(const Dataset& d, int64_t index, int64_t seq_len) {
  Tensor in = Tensor::empty({1, seq_len}, DType::I32);
  Tensor tgt = Tensor::empty({1, seq_len}, DType::I32);
  const std::vector<int64_t> indices{index};
  load_batch(d, indices, in, tgt);
  auto a = in.span<int32_t>();
  auto b = tgt.span<int32_t>();
  return {{a.begin(), a.end()}, {b.begin(), b.end()}};
}

std::vector<int32_t> as_ints(const std::vector<uint32_t>& v, size_t first, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(first + n)};
}

// ---------------------------------------------------------------------------
// Sampler.

TEST(Sampler, IsAPureFunctionOfSeedAndPosition) {
  EXPECT_EQ(sample_indices(7, 1000, 123, 50), sample_indices(7, 1000, 123, 50));
  EXPECT_NE(sample_indices(7, 1000, 0, 50), sample_indices(8, 1000, 0, 50));
  // One call over several epochs equals one call per position.
  const std::vector<int64_t> all = sample_indices(7, 37, 5, 200);
  for (int64_t i = 0; i < 200; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], sample_indices(7, 37, 5 + i, 1)[0]) << i;
  EXPECT_TRUE(sample_indices(7, 37, 10, 0).empty());
}

TEST(Sampler, EachEpochIsAPermutation) {
  for (int64_t size : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{37}, int64_t{1000}, int64_t{4097}}) {
    std::vector<int64_t> expected(static_cast<size_t>(size));
    std::iota(expected.begin(), expected.end(), 0);
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      std::vector<int64_t> got = sample_indices(99, size, epoch * size, size);
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, expected) << "size " << size << " epoch " << epoch;
    }
  }
}

TEST(Sampler, ShufflesAndEpochsDiffer) {
  for (int64_t size : {int64_t{37}, int64_t{1000}}) {
    const std::vector<int64_t> e0 = sample_indices(5, size, 0, size);
    const std::vector<int64_t> e1 = sample_indices(5, size, size, size);
    const std::vector<int64_t> e2 = sample_indices(5, size, 2 * size, size);
    EXPECT_NE(e0, e1) << size;
    EXPECT_NE(e1, e2) << size;
    int64_t fixed_points = 0;
    for (int64_t i = 0; i < size; ++i) fixed_points += e0[static_cast<size_t>(i)] == i;
    // A uniform shuffle has one fixed point on average.
    EXPECT_LT(fixed_points, 8) << size;
  }
}

TEST(Sampler, RankSlicesConcatenateToTheGlobalBatchAtAnyWorldSize) {
  constexpr int64_t kGlobal = 12;
  for (int64_t size : {int64_t{37}, int64_t{1000}}) {
    for (int64_t step = 0; step < 300; ++step) {
      const int64_t consumed = step * kGlobal;
      const std::vector<int64_t> global = rank_batch_indices(3, size, consumed, kGlobal, 0, 1);
      ASSERT_EQ(global, sample_indices(3, size, consumed, kGlobal));
      for (int world : {2, 3, 4}) {
        std::vector<int64_t> joined;
        for (int rank = 0; rank < world; ++rank) {
          const std::vector<int64_t> part = rank_batch_indices(3, size, consumed, kGlobal, rank, world);
          ASSERT_EQ(static_cast<int64_t>(part.size()), kGlobal / world);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        ASSERT_EQ(joined, global) << "size " << size << " step " << step << " world " << world;
      }
    }
  }
}

TEST(Sampler, ResumedRunSeesTheTailOfTheFullRun) {
  constexpr int64_t kGlobal = 12;
  constexpr int64_t kSteps = 100;
  constexpr int64_t kSize = 37;  // several epochs inside the run
  std::vector<std::vector<int64_t>> full;
  for (int64_t step = 0; step < kSteps; ++step)
    full.push_back(rank_batch_indices(11, kSize, step * kGlobal, kGlobal, 0, 1));
  for (int64_t resume_at : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{64}}) {
    for (int world : {1, 2, 3, 4}) {
      // A fresh "process" resumes from the consumed-sample count alone.
      for (int64_t step = resume_at; step < kSteps; ++step) {
        std::vector<int64_t> joined;
        for (int rank = 0; rank < world; ++rank) {
          const std::vector<int64_t> part = rank_batch_indices(11, kSize, step * kGlobal, kGlobal, rank, world);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        ASSERT_EQ(joined, full[static_cast<size_t>(step)]) << "resumed at " << resume_at << ", world " << world;
      }
    }
  }
}

TEST(Sampler, Errors) {
  EXPECT_EQ(error_of([] { rank_batch_indices(1, 100, 0, 10, 0, 4); }),
            "train.global_batch_size (10) must be a positive multiple of the world size (4) so every rank gets the "
            "same number of samples");
  EXPECT_EQ(error_of([] { rank_batch_indices(1, 100, 0, 12, 4, 4); }),
            "rank_batch_indices: rank 4 is not in a world of 4");
  EXPECT_EQ(error_of([] { sample_indices(1, 0, 0, 1); }), "sample_indices: the dataset is empty");
}

// ---------------------------------------------------------------------------
// text

TEST(TextDataset, WindowsTileTheFileAndTargetsAreShiftedByOne) {
  TempDir dir;
  const std::string path = dir.file("tiny.txt");
  write_bytes(path, "abcdefghijk");  // 11 bytes: (11 - 1) / 4 = 2 samples of 4
  const auto d = make_dataset(llama_config(DataKind::Text, path, 4, 256));
  ASSERT_EQ(d->size(), 2);
  auto ints = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };

  Tensor in = Tensor::empty({2, 4}, DType::I32);
  Tensor tgt = Tensor::empty({2, 4}, DType::I32);
  const std::vector<int64_t> indices{1, 0};
  load_batch(*d, indices, in, tgt);
  auto a = in.span<int32_t>();
  auto b = tgt.span<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 4), ints("efgh"));
  EXPECT_EQ(std::vector<int32_t>(b.begin(), b.begin() + 4), ints("fghi"));
  EXPECT_EQ(std::vector<int32_t>(a.begin() + 4, a.end()), ints("abcd"));
  EXPECT_EQ(std::vector<int32_t>(b.begin() + 4, b.end()), ints("bcde"));

  // Exactly seq_len + 1 bytes is one sample; bytes >= 128 (here U+1F600's four) stay non-negative.
  write_bytes(path, "\xf0\x9f\x98\x80z");
  const auto one = make_dataset(llama_config(DataKind::Text, path, 4, 256));
  ASSERT_EQ(one->size(), 1);
  const Sample s = token_sample(*one, 0, 4);
  EXPECT_EQ(s.inputs, (std::vector<int32_t>{240, 159, 152, 128}));
  EXPECT_EQ(s.targets, (std::vector<int32_t>{159, 152, 128, 'z'}));
  EXPECT_NE(one->describe().find(path), std::string::npos) << one->describe();
  EXPECT_NE(one->describe().find("1 samples of 4 tokens"), std::string::npos) << one->describe();
}

TEST(TextDataset, Errors) {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, missing, 4, 256)); }),
            "text file '" + missing + "' (data.path) does not exist");

  const std::string empty = dir.file("empty.txt");
  write_bytes(empty, "");
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, empty, 4, 256)); }),
            "text file '" + empty + "' is empty");

  const std::string short_file = dir.file("short.txt");
  write_bytes(short_file, "abcd");
  EXPECT_EQ(
      error_of([&] { make_dataset(llama_config(DataKind::Text, short_file, 4, 256)); }),
      "text file '" + short_file + "' has 4 bytes, too short for one sample: train.seq_len 4 needs at least 5 bytes");

  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, short_file, 2, 100)); }),
            "data.kind text uses byte-level tokens (256 values) but model.vocab_size is 100; set model.vocab_size to "
            "at least 256");

  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, dir.path().string(), 2, 256)); }),
            "text file '" + dir.path().string() + "' (data.path) is a directory; data.kind text reads one file");
}

// data.kind text reads text: prepare's rule (text_sample_problem), one function for both.
TEST(TextDataset, BinaryFilesAreRefusedByPreparesRule) {
  EXPECT_EQ(text_sample_problem("plain ASCII\n"), "");
  EXPECT_EQ(text_sample_problem("caf\xc3\xa9 \xe2\x96"), "");  // a sequence cut by the sample's end
  EXPECT_EQ(text_sample_problem(std::string("ab\0c", 4)), "a NUL byte at offset 2");
  EXPECT_EQ(text_sample_problem("ok \xff\xfe"), "an invalid UTF-8 byte at offset 3");

  TempDir dir;
  const std::string binary = dir.file("binary.dat");
  std::string bytes = "text first, ";
  for (int i = 0; i < 4096; ++i) bytes += static_cast<char>(i % 256);
  write_bytes(binary, bytes);
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, binary, 4, 256)); }),
            "text file '" + binary +
                "' (data.path) is not UTF-8 text: a NUL byte at offset 12 in its first 64 KiB; "
                "data.kind text reads UTF-8 text (prepare refuses the same file; a file of token ids is data.kind "
                "tokens)");
  // The rule looks at the first 64 KiB only, as prepare does.
  const std::string late = dir.file("late.txt");
  write_bytes(late, std::string(kTextSampleBytes, 'a') + std::string("\0\0", 2));
  EXPECT_EQ(make_dataset(llama_config(DataKind::Text, late, 4, 256))->size(),
            static_cast<int64_t>((kTextSampleBytes + 2 - 1) / 4));
}

// A FIFO (or any file that is not a regular one) is refused without blocking in open().
TEST(DataFiles, FifosAreRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string not_regular = "'" + fifo + "' is not a regular file (a FIFO)";
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Text, fifo, 4, 256)); }),
            "data.path text file " + not_regular);
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, fifo, 4, 256)); }),
            "data.path tokens file " + not_regular);
  const std::string text = dir.file("a.txt");
  write_bytes(text, std::string(64, 'x'));
  Config val = llama_config(DataKind::Text, text, 4, 256);
  val.data.val_path = fifo;
  EXPECT_EQ(error_of([&] { make_validation_dataset(val); }), "data.val_path text file " + not_regular);
}

// A global batch larger than the training set is an error naming both numbers (the old trainer took every
// sample of it more than once per step, and with a synthetic data set of a million samples never ended a step).
TEST(TrainingData, GlobalBatchLargerThanTheDataIsAnError) {
  TempDir dir;
  const std::string text = dir.file("a.txt");
  write_bytes(text, std::string(41, 'x'));  // 10 samples of 4 tokens
  Config c = llama_config(DataKind::Text, text, 4, 256);
  c.train.global_batch_size = 10;
  EXPECT_EQ(make_dataset(c)->size(), 10);
  c.train.global_batch_size = 12;
  EXPECT_EQ(error_of([&] { make_dataset(c); }),
            "train.global_batch_size 12 is larger than the training data, 10 samples (text " + text +
                ": 41 B, 10 samples of 4 tokens (bytes, vocab 256)); lower train.global_batch_size to at most 10 or "
                "give more data");
  Config toy;
  toy.model.name = "toy";
  toy.train.global_batch_size = 2 * kToySamples;
  EXPECT_NE(error_of([&] { make_dataset(toy); })
                .find("train.global_batch_size 8192 is larger than the training "
                      "data, 4096 samples"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// tokens

TEST(TokensDataset, LlmcShardsUint16AndUint32) {
  TempDir dir;
  const std::vector<uint32_t> gpt2 = ramp(50000, 9);  // 9 tokens, seq_len 4: 2 samples
  const std::string p16 = dir.file("gpt2.bin");
  write_bytes(p16, llmc_shard(20240520, 1, 9, gpt2, 2));
  const auto d16 = make_dataset(llama_config(DataKind::Tokens, p16, 4, 50257));
  ASSERT_EQ(d16->size(), 2);
  for (int64_t i = 0; i < 2; ++i) {
    const Sample s = token_sample(*d16, i, 4);
    EXPECT_EQ(s.inputs, as_ints(gpt2, static_cast<size_t>(4 * i), 4)) << i;
    EXPECT_EQ(s.targets, as_ints(gpt2, static_cast<size_t>(4 * i + 1), 4)) << i;
  }
  EXPECT_NE(d16->describe().find("llm.c v1 uint16"), std::string::npos) << d16->describe();

  const std::vector<uint32_t> llama3 = ramp(128000, 13);  // beyond uint16: 3 samples of 4
  const std::string p32 = dir.file("llama3.bin");
  write_bytes(p32, llmc_shard(20240801, 7, 13, llama3, 4));
  const auto d32 = make_dataset(llama_config(DataKind::Tokens, p32, 4, 128256));
  ASSERT_EQ(d32->size(), 3);
  const Sample last = token_sample(*d32, 2, 4);
  EXPECT_EQ(last.inputs, as_ints(llama3, 8, 4));
  EXPECT_EQ(last.targets, as_ints(llama3, 9, 4));
}

TEST(TokensDataset, HeaderlessUint16AndUint32) {
  TempDir dir;
  const std::vector<uint32_t> tokens = ramp(30000, 10);  // 10 tokens, seq_len 3: 3 samples
  const std::string p16 = dir.file("t16.bin");
  write_bytes(p16, headerless(tokens, 2));
  const auto d16 = make_dataset(headerless_config(p16, 3, 32000));
  ASSERT_EQ(d16->size(), 3);
  EXPECT_EQ(token_sample(*d16, 2, 3).inputs, as_ints(tokens, 6, 3));
  EXPECT_EQ(token_sample(*d16, 2, 3).targets, as_ints(tokens, 7, 3));

  const std::vector<uint32_t> wide = ramp(70000, 10);
  const std::string p32 = dir.file("t32.bin");
  write_bytes(p32, headerless(wide, 4));
  const auto d32 = make_dataset(headerless_config(p32, 3, 128256, TokenDType::U32));
  ASSERT_EQ(d32->size(), 3);
  EXPECT_EQ(token_sample(*d32, 1, 3).inputs, as_ints(wide, 3, 3));
  EXPECT_EQ(token_sample(*d32, 1, 3).targets, as_ints(wide, 4, 3));
}

TEST(TokensDataset, DirectoryOfShardsInNameOrderWithoutCrossingFiles) {
  TempDir dir;
  const std::vector<uint32_t> a = ramp(100, 9);   // 2 samples of 4
  const std::vector<uint32_t> b = ramp(200, 13);  // 3 samples of 4
  write_bytes(dir.file("shard_b.bin"), llmc_shard(20240520, 1, 13, b, 2));
  write_bytes(dir.file("shard_a.bin"), llmc_shard(20240520, 1, 9, a, 2));
  write_bytes(dir.file("notes.txt"), "ignored");
  write_bytes(dir.file("tiny.bin"), llmc_shard(20240520, 1, 2, ramp(300, 2), 2));  // too short: no samples
  const auto d = make_dataset(llama_config(DataKind::Tokens, dir.path().string(), 4, 1000));
  ASSERT_EQ(d->size(), 5);
  EXPECT_EQ(token_sample(*d, 1, 4).targets, as_ints(a, 5, 4));
  EXPECT_EQ(token_sample(*d, 2, 4).inputs, as_ints(b, 0, 4));
  EXPECT_EQ(token_sample(*d, 4, 4).targets, as_ints(b, 9, 4));
  EXPECT_NE(d->describe().find("3 files"), std::string::npos) << d->describe();
  EXPECT_NE(d->describe().find("5 samples of 4 tokens"), std::string::npos) << d->describe();
}

TEST(TokensDataset, FileErrors) {
  TempDir dir;
  const std::string odd = dir.file("odd.bin");
  write_bytes(odd, std::string(1001, '\0'));
  EXPECT_EQ(error_of([&] { make_dataset(headerless_config(odd, 4, 1000)); }),
            "tokens file '" + odd + "' has 1001 bytes, not a multiple of 2 (data.token_dtype: uint16 tokens)");
  write_bytes(odd, std::string(1002, '\0'));
  EXPECT_EQ(error_of([&] { make_dataset(headerless_config(odd, 4, 1000, TokenDType::U32)); }),
            "tokens file '" + odd + "' has 1002 bytes, not a multiple of 4 (data.token_dtype: uint32 tokens)");

  const std::string truncated = dir.file("truncated.bin");
  write_bytes(truncated, llmc_shard(20240520, 1, 10, ramp(0, 9), 2));
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, truncated, 4, 1000)); }),
            "tokens file '" + truncated +
                "' has 1042 bytes, but its llm.c header (magic 20240520, 10 uint16 tokens) means 1044 bytes "
                "(1024 + 10 x 2); the file is truncated or the header is wrong");

  const std::string empty = dir.file("empty.bin");
  write_bytes(empty, "");
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, empty, 4, 1000)); }),
            "tokens file '" + empty + "' is empty");

  const std::string short_file = dir.file("short.bin");
  write_bytes(short_file, llmc_shard(20240520, 1, 4, ramp(0, 4), 2));
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, short_file, 4, 1000)); }),
            "tokens file '" + short_file +
                "' has 4 tokens, too short for one sample: train.seq_len 4 needs at least 5 tokens");

  const std::string missing = dir.file("missing.bin");
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, missing, 4, 1000)); }),
            "tokens path '" + missing + "' (data.path) does not exist");

  const std::string no_bins = dir.file("no_bins");
  fs::create_directories(no_bins);
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, no_bins, 4, 1000)); }),
            "tokens directory '" + no_bins + "' (data.path) has no *.bin files");
}

TEST(TokensDataset, TokenOutsideTheVocabularyIsNamedWhenSampled) {
  TempDir dir;
  std::vector<uint32_t> tokens = ramp(0, 9);  // samples: tokens [0, 5) and [4, 9)
  tokens[6] = 60;
  const std::string path = dir.file("bad.bin");
  write_bytes(path, llmc_shard(20240520, 1, 9, tokens, 2));
  const auto d = make_dataset(llama_config(DataKind::Tokens, path, 4, 50));
  EXPECT_EQ(token_sample(*d, 0, 4).targets, as_ints(tokens, 1, 4));  // sample 0 never touches token 6
  EXPECT_EQ(error_of([&] { token_sample(*d, 1, 4); }),
            "tokens file '" + path + "': token 60 at byte offset 1036 is >= model.vocab_size (50)");
}

// The start-up scan: every token is checked once, split over the parts (ranks);
// the part that holds a bad token names its file, byte offset and value.
TEST(TokensDataset, FindBadTokenScansEachPartOfTheCorpusOnce) {
  TempDir dir;
  fs::create_directories(dir.file("corpus"));
  std::vector<uint32_t> a = ramp(0, 9000);  // uint16 llm.c shard, 9000 tokens
  for (uint32_t& t : a) t %= 50;
  std::vector<uint32_t> b = ramp(0, 5001);  // uint16 llm.c shard, 5001 tokens
  for (uint32_t& t : b) t %= 50;
  b.back() = 70000 % 65536;  // the very last token of the corpus is out of range (4464)
  write_bytes(dir.file("corpus/a.bin"), llmc_shard(20240520, 1, 9000, a, 2));
  write_bytes(dir.file("corpus/b.bin"), llmc_shard(20240520, 1, 5001, b, 2));
  const auto d = make_dataset(llama_config(DataKind::Tokens, dir.file("corpus"), 4, 50));
  const std::string expected = "tokens file '" + dir.file("corpus/b.bin") +
                               "': token 4464 at byte offset 11024 (token 5000 of the file) is >= "
                               "model.vocab_size (50)";
  for (int parts : {1, 2, 3, 4, 7}) {
    int found = 0;
    for (int part = 0; part < parts; ++part) {
      const std::string problem = d->find_bad_token(part, parts);
      if (problem.empty()) continue;
      ++found;
      EXPECT_EQ(problem, expected) << parts << " parts, part " << part;
      EXPECT_EQ(part, parts - 1);  // the last token lies in the last part
    }
    EXPECT_EQ(found, 1) << parts << " parts";
  }
  // A bad token at the very start of the first file, found by part 0 only; uint32 tokens too.
  a.front() = 50;
  write_bytes(dir.file("corpus/a.bin"), llmc_shard(20240520, 1, 9000, a, 2));
  const auto d2 = make_dataset(llama_config(DataKind::Tokens, dir.file("corpus"), 4, 50));
  EXPECT_EQ(d2->find_bad_token(0, 3), "tokens file '" + dir.file("corpus/a.bin") +
                                          "': token 50 at byte offset 1024 (token 0 of the file) is >= "
                                          "model.vocab_size (50)");
  EXPECT_EQ(d2->find_bad_token(1, 3), "");
  const std::string wide = dir.file("wide.bin");
  std::vector<uint32_t> w = ramp(0, 100);
  w[99] = 100000;
  write_bytes(wide, llmc_shard(20240801, 7, 100, w, 4));
  const auto d3 = make_dataset(llama_config(DataKind::Tokens, wide, 4, 100000));
  EXPECT_EQ(d3->find_bad_token(0, 1), "tokens file '" + wide +
                                          "': token 100000 at byte offset 1420 (token 99 of the file) is >= "
                                          "model.vocab_size (100000)");
  // Data without token files has nothing to check.
  const std::string text = dir.file("t.txt");
  write_bytes(text, "hello world, some bytes");
  EXPECT_EQ(make_dataset(llama_config(DataKind::Text, text, 4, 256))->find_bad_token(0, 1), "");
}

// data.token_format llmc is strict: a damaged header is an error naming the
// file and the field, never a reason to read the file as raw tokens (a shard
// whose magic and count were both damaged used to be read header and all).
TEST(TokensDataset, LlmcHeaderIsCheckedStrictly) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  auto error = [&](const std::string& bytes, const Config& c) {
    write_bytes(path, bytes);
    return error_of([&] { make_dataset(c); });
  };
  const Config llmc = llama_config(DataKind::Tokens, path, 4, 1000);
  const std::string hint =
      " instead of the magic 20240520 (uint16 tokens) or 20240801 (uint32 tokens); for raw tokens without a header "
      "set data.token_format: headerless (and data.token_dtype)";
  EXPECT_EQ(error(llmc_shard(12345, 1, 9, ramp(0, 9), 2), llmc),
            "tokens file '" + path + "' is not an llm.c shard: it starts with 12345" + hint);
  EXPECT_EQ(error(llmc_shard(12345, 1, 777, ramp(0, 9), 2), llmc),  // magic and count both damaged
            "tokens file '" + path + "' is not an llm.c shard: it starts with 12345" + hint);
  EXPECT_EQ(error(headerless(ramp(0, 600), 2), llmc),
            "tokens file '" + path + "' is not an llm.c shard: it starts with 65536" + hint);
  EXPECT_EQ(error("ab", llmc), "tokens file '" + path + "' is not an llm.c shard: it has only 2 bytes" + hint);
  EXPECT_EQ(error(llmc_shard(20240520, 3, 9, ramp(0, 9), 2), llmc),
            "tokens file '" + path +
                "': its llm.c header (magic 20240520) has version 3; llm.c's uint16 shards have version 1, so the "
                "header is damaged or of a format we do not read");
  EXPECT_EQ(error(llmc_shard(20240801, 1, 9, ramp(0, 9), 4), llmc),
            "tokens file '" + path +
                "': its llm.c header (magic 20240801) has version 1; llm.c's uint32 shards have version 7, so the "
                "header is damaged or of a format we do not read");
  EXPECT_EQ(error(llmc_shard(20240520, 1, -3, ramp(0, 9), 2), llmc),
            "tokens file '" + path + "': its llm.c header (magic 20240520) gives a negative token count -3");
  EXPECT_EQ(error(llmc_shard(20240520, 1, 8, ramp(0, 9), 2), llmc),
            "tokens file '" + path +
                "' has 1042 bytes, but its llm.c header (magic 20240520, 8 uint16 tokens) means 1040 bytes "
                "(1024 + 8 x 2); the file is truncated or the header is wrong");
  // headerless reads raw tokens only, and refuses an llm.c shard rather than train on its header.
  EXPECT_EQ(error(llmc_shard(20240801, 7, 9, ramp(0, 9), 4), headerless_config(path, 4, 1000, TokenDType::U32)),
            "tokens file '" + path +
                "' starts with the llm.c magic 20240801: it is an llm.c shard, which data.token_format headerless "
                "would read header and all; set data.token_format: llmc");
  write_bytes(path, headerless(ramp(0, 600), 2));
  EXPECT_EQ(make_dataset(headerless_config(path, 4, 1000))->size(), 149);
}

TEST(TokensDataset, ShardShorterThanItsHeaderIsAnError) {
  TempDir dir;
  const std::string cut = dir.file("cut.bin");
  write_bytes(cut, llmc_shard(20240520, 1, 100, ramp(0, 100), 2).substr(0, 600));
  EXPECT_EQ(error_of([&] { make_dataset(llama_config(DataKind::Tokens, cut, 4, 1000)); }),
            "tokens file '" + cut +
                "' has 600 bytes but starts with the llm.c magic 20240520: it is shorter than the 1024-byte header, "
                "so it is truncated");
}

// ---------------------------------------------------------------------------
// synthetic

TEST(SyntheticDataset, DeterministicInRangeAndShifted) {
  Config c = llama_config(DataKind::Synthetic, "", 16, 500);
  const auto d = make_dataset(c);
  const auto again = make_dataset(c);
  c.train.seed += 1;
  const auto other = make_dataset(c);
  EXPECT_EQ(d->size(), kSyntheticSamples);
  for (int64_t index : {int64_t{0}, int64_t{1}, int64_t{777}, kSyntheticSamples - 1}) {
    const Sample s = token_sample(*d, index, 16);
    const Sample t = token_sample(*again, index, 16);
    EXPECT_EQ(s.inputs, t.inputs) << index;
    EXPECT_EQ(s.targets, t.targets) << index;
    EXPECT_NE(s.inputs, token_sample(*other, index, 16).inputs) << index;
    for (int64_t k = 0; k < 16; ++k) {
      EXPECT_GE(s.inputs[static_cast<size_t>(k)], 0);
      EXPECT_LT(s.inputs[static_cast<size_t>(k)], 500);
      EXPECT_GE(s.targets[static_cast<size_t>(k)], 0);
      EXPECT_LT(s.targets[static_cast<size_t>(k)], 500);
      if (k + 1 < 16) {
        EXPECT_EQ(s.targets[static_cast<size_t>(k)], s.inputs[static_cast<size_t>(k) + 1]);
      }
    }
  }
  EXPECT_NE(token_sample(*d, 0, 16).inputs, token_sample(*d, 1, 16).inputs);
}

TEST(SyntheticDataset, EachTokenHasAtMostFourSuccessors) {
  // What makes the data learnable: the next token is one of a few, not one of V.
  const auto d = make_dataset(llama_config(DataKind::Synthetic, "", 32, 64));
  std::map<int32_t, std::set<int32_t>> successors;
  for (int64_t index = 0; index < 400; ++index) {
    const Sample s = token_sample(*d, index, 32);
    for (size_t k = 0; k < 32; ++k) successors[s.inputs[k]].insert(s.targets[k]);
  }
  EXPECT_EQ(successors.size(), 64u);  // a vocabulary below kSyntheticActiveTokens is used whole
  for (const auto& [token, next] : successors) {
    EXPECT_LE(next.size(), static_cast<size_t>(kSyntheticSuccessors)) << token;
  }
}

TEST(SyntheticDataset, LargeVocabularyUsesFewTokensSpreadOverIt) {
  const auto d = make_dataset(llama_config(DataKind::Synthetic, "", 64, 32000));
  std::set<int32_t> seen;
  for (int64_t index = 0; index < 2000; ++index) {
    const Sample s = token_sample(*d, index, 64);
    seen.insert(s.inputs.begin(), s.inputs.end());
    seen.insert(s.targets.begin(), s.targets.end());
  }
  EXPECT_LE(static_cast<int64_t>(seen.size()), kSyntheticActiveTokens);
  EXPECT_GT(static_cast<int64_t>(seen.size()), kSyntheticActiveTokens / 2);
  EXPECT_GE(*seen.begin(), 0);
  EXPECT_LT(*seen.rbegin(), 32000);
  EXPECT_GT(*seen.rbegin(), 16000);  // not just the low ids
}

// ---------------------------------------------------------------------------
// toy

TEST(ToyDataset, ShapesDeterminismAndTheTeacher) {
  Config c;
  c.model.name = "toy";
  c.train.seed = 42;
  const auto d = make_dataset(c);
  EXPECT_EQ(d->size(), kToySamples);
  const std::vector<int64_t> indices{0, 5, kToySamples - 1};
  auto batch = [&](const Dataset& ds) {
    Tensor x = Tensor::empty({3, Toy::kIn}, DType::F32);
    Tensor y = Tensor::empty({3, Toy::kOut}, DType::F32);
    load_batch(ds, indices, x, y);
    return std::pair{x.to_floats(), y.to_floats()};
  };
  const auto [x, y] = batch(*d);
  const auto [x2, y2] = batch(*make_dataset(c));
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  EXPECT_NE(std::vector<float>(x.begin(), x.begin() + Toy::kIn),
            std::vector<float>(x.begin() + Toy::kIn, x.begin() + 2 * Toy::kIn));

  const ToyTeacher teacher = toy_teacher(42);
  ASSERT_EQ(teacher.weight.size(), static_cast<size_t>(Toy::kOut * Toy::kIn));
  ASSERT_EQ(teacher.bias.size(), static_cast<size_t>(Toy::kOut));
  EXPECT_NE(toy_teacher(43).weight, teacher.weight);
  for (size_t row = 0; row < 3; ++row) {
    for (size_t j = 0; j < Toy::kIn; ++j) {
      EXPECT_GE(x[row * Toy::kIn + j], 0.0f);
      EXPECT_LT(x[row * Toy::kIn + j], 1.0f);
    }
    for (size_t o = 0; o < Toy::kOut; ++o) {
      double expected = teacher.bias[o];
      for (size_t j = 0; j < Toy::kIn; ++j)
        expected += double{teacher.weight[o * Toy::kIn + j]} * x[row * Toy::kIn + j];
      EXPECT_NEAR(y[row * Toy::kOut + o], expected, 1e-5) << "row " << row << " output " << o;
    }
  }

  c.data.kind = DataKind::Text;
  c.data.path = "x.txt";
  EXPECT_EQ(error_of([&] { make_dataset(c); }),
            "model.name toy trains on seeded random features, so data.kind must be synthetic (got text)");
}

// ---------------------------------------------------------------------------
// Validation data.

TEST(ValidationData, ValFractionHoldsOutTheLastSamples) {
  TempDir dir;
  const std::string path = dir.file("text.txt");
  write_bytes(path, "abcdefghijklmnopqrstu");  // 21 bytes: (21 - 1) / 4 = 5 samples of 4
  Config c = llama_config(DataKind::Text, path, 4, 256);
  c.data.val_fraction = 0.3;  // ceil(0.3 x 5) = 2 held out
  const auto train = make_dataset(c);
  const auto val = make_validation_dataset(c);
  ASSERT_EQ(train->size(), 3);
  ASSERT_NE(val, nullptr);
  ASSERT_EQ(val->size(), 2);
  auto ints = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };
  EXPECT_EQ(token_sample(*train, 2, 4).inputs, ints("ijkl"));
  EXPECT_EQ(token_sample(*val, 0, 4).inputs, ints("mnop"));  // whole sample 3
  EXPECT_EQ(token_sample(*val, 1, 4).targets, ints("rstu"));
  EXPECT_NE(train->describe().find("training on samples [0, 3), the last 2 held out (data.val_fraction 0.3)"),
            std::string::npos)
      << train->describe();
  EXPECT_NE(val->describe().find("the last 2 samples, [3, 5), held out"), std::string::npos) << val->describe();
  // Nothing left to train on is an error naming the key.
  write_bytes(path, "abcde");  // one sample
  c.data.val_fraction = 0.1;
  EXPECT_NE(error_of([&] { make_dataset(c); }).find("data.val_fraction 0.1 holds out 1 of the 1 samples"),
            std::string::npos);
}

TEST(ValidationData, ValPathIsReadLikeDataPathAndNamedInErrors) {
  TempDir dir;
  const std::string train_path = dir.file("train.bin");
  const std::string val_path = dir.file("val.bin");
  write_bytes(train_path, llmc_shard(20240520, 1, 41, ramp(0, 41), 2));
  write_bytes(val_path, llmc_shard(20240520, 1, 9, ramp(100, 9), 2));  // an llm.c "_val_" shard
  Config c = llama_config(DataKind::Tokens, train_path, 4, 1000);
  EXPECT_EQ(make_validation_dataset(c), nullptr);  // no val_path, no val_fraction
  c.data.val_path = val_path;
  const auto val = make_validation_dataset(c);
  ASSERT_EQ(val->size(), 2);
  EXPECT_EQ(token_sample(*val, 1, 4).inputs, as_ints(ramp(100, 9), 4, 4));
  EXPECT_EQ(make_dataset(c)->size(), 10);  // training keeps all of data.path
  c.data.val_path = dir.file("missing.bin");
  EXPECT_EQ(error_of([&] { make_validation_dataset(c); }),
            format("tokens path '{}' (data.val_path) does not exist", c.data.val_path));
  c.data.kind = DataKind::Text;
  EXPECT_EQ(error_of([&] { make_validation_dataset(c); }),
            format("text file '{}' (data.val_path) does not exist", c.data.val_path));
}

TEST(ValidationData, GeneratedDataHoldsOutSamplesTrainingNeverSees) {
  Config c = llama_config(DataKind::Synthetic, "", 16, 256);
  const auto train = make_dataset(c);
  const auto val = make_validation_dataset(c);
  ASSERT_EQ(val->size(), kSyntheticSamples);
  // Validation sample i is walk kSyntheticSamples + i of the same chain: not
  // one of the training walks, and the same every time.
  EXPECT_NE(token_sample(*val, 0, 16).inputs, token_sample(*train, 0, 16).inputs);
  EXPECT_EQ(token_sample(*val, 5, 16).inputs, token_sample(*make_validation_dataset(c), 5, 16).inputs);
  EXPECT_NE(val->describe().find("walks 1,048,576 on (held out"), std::string::npos) << val->describe();

  c.model.name = "toy";
  const auto toy_val = make_validation_dataset(c);
  ASSERT_EQ(toy_val->size(), kToySamples);
  EXPECT_NE(toy_val->describe().find("draws 4,096 on (held out"), std::string::npos) << toy_val->describe();
}

TEST(LoadBatch, Errors) {
  Config c;
  c.model.name = "toy";
  const auto d = make_dataset(c);
  const std::vector<int64_t> indices{0, 1};
  Tensor x = Tensor::empty({3, Toy::kIn}, DType::F32);
  Tensor y = Tensor::empty({2, Toy::kOut}, DType::F32);
  EXPECT_EQ(error_of([&] { load_batch(*d, indices, x, y); }),
            "load_batch: inputs Tensor([3, 16], F32, cpu) must have 2 rows, one per sample index");
  const std::vector<int64_t> bad{0, kToySamples};
  Tensor x2 = Tensor::empty({2, Toy::kIn}, DType::F32);
  EXPECT_EQ(error_of([&] { load_batch(*d, bad, x2, y); }),
            "load_batch: sample index 4096 is outside the dataset [0, 4096)");
  Tensor wrong = Tensor::empty({2, Toy::kIn}, DType::I32);
  EXPECT_EQ(error_of([&] { load_batch(*d, indices, wrong, y); }),
            "toy dataset: input row must be F32 with 16 elements, got Tensor([16], I32, cpu)");
}

}  // namespace
}  // namespace st::dataset
