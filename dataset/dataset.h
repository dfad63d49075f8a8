#pragma once
// Datasets and the resumable distributed sampler.
//
// A dataset is an indexable list of samples. The sampler is a pure function
// of (seed, consumed samples): the global batch starting at sample c is
// positions [c, c + G) of the epoch-wise permutation, and rank r of p takes
// the contiguous slice [r*G/p, (r+1)*G/p) of it. A run resumed on any world
// size therefore sees the same global batches in the same order.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "dataset/config.h"
#include "dataset/tokenizer.h"

namespace st::dataset {

class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples in one epoch.
  virtual int64_t size() const = 0;
  /// Writes sample `index` (0 <= index < size()) into one row of inputs and targets.
  /// Token datasets: inputs/targets I32 [seq_len] (targets = inputs shifted by one).
  /// Toy: inputs F32 [16], targets F32 [8].
  virtual void get(int64_t index, const Tensor& input_row, const Tensor& target_row) const = 0;
  /// One line for the start-up log ("text data/x.txt: 1.2 MB, 37,000 samples of 32 tokens").
  virtual std::string describe() const = 0;
  /// Checks part `part` of `parts` of the stored data (contiguous, about
  /// equal slices) for tokens outside the model's vocabulary; returns the first
  /// problem, naming the file, the byte offset and the value, or "" (also for
  /// data that cannot hold a bad token). Ranks each take one part, so the whole
  /// corpus is checked once, in parallel, before training.
  virtual std::string find_bad_token(int part, int parts) const {
    (void)part;
    (void)parts;
    return {};
  }
};

/// llm.c token shards (what data.kind tokens reads and prepare writes): a
/// header of 256 little-endian int32 (magic, version, token count), then the
/// tokens, little-endian, of the width the magic names.
inline constexpr uint32_t kLlmcMagicU16 = 20240520;  // uint16 tokens (llm.c's GPT-2 shards, version 1)
inline constexpr uint32_t kLlmcMagicU32 = 20240801;  // uint32 tokens (llm.c's LLaMA 3 shards, version 7)
inline constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

/// Targets equal to this take no part in the loss (PyTorch's default
/// ignore_index); our datasets never produce it, but a tokens file may use it
/// for padding.
inline constexpr int64_t kIgnoreIndex = -100;

/// Samples per epoch of the generated datasets: synthetic token sequences
/// (large enough that a short run never repeats one) and toy features.
inline constexpr int64_t kSyntheticSamples = int64_t{1} << 20;
inline constexpr int64_t kToySamples = 4096;
/// The synthetic Markov chain: at most kSyntheticActiveTokens distinct tokens
/// (seeded ids anywhere in the vocabulary), each with kSyntheticSuccessors
/// possible successors, so the best possible loss is about ln(4) = 1.39 nats
/// per token instead of ln(vocab_size).
inline constexpr int64_t kSyntheticActiveTokens = 1024;
inline constexpr int kSyntheticSuccessors = 4;
/// The toy dataset's fixed teacher, drawn from `seed`: targets = weight x + bias
/// exactly (no noise), so the toy model's MSE can fall towards 0.
struct ToyTeacher {
  std::vector<float> weight;  // (models::Toy::kOut, models::Toy::kIn), row-major
  std::vector<float> bias;    // (models::Toy::kOut)
};
ToyTeacher toy_teacher(uint64_t seed);

/// The bytes of a file that decide whether it is text: its first 64 KiB (the
/// check `git` and `file` make, on a sample).
inline constexpr size_t kTextSampleBytes = size_t{64} << 10;
/// "" when `sample` (a file's first kTextSampleBytes, or all of a shorter
/// file) is text: UTF-8 (core/text.h's strict check; a sequence cut by the
/// sample's end is allowed) without a NUL byte; else what is wrong ("a NUL
/// byte at offset 7", "an invalid UTF-8 byte at offset 12"). The one rule of
/// data.kind text and of prepare's inputs.
std::string text_sample_problem(std::string_view sample);

/// Builds the dataset for `data.*` and the model: synthetic/text/tokens for
/// LLaMA (seq_len from train.seq_len), seeded random features for the toy
/// model. Bad files are errors naming the file and what is wrong.
///
/// synthetic: sample i of seed s is a walk of seq_len + 1 tokens through a
///   sparse Markov chain chosen by s (see kSyntheticActiveTokens), a function
///   of (s, i) alone.
/// text: a file that is not text (text_sample_problem) is an error; its
///   bytes are the tokens (vocab 256); sample i is bytes
///   [i*seq_len, i*seq_len + seq_len + 1), so samples tile the file and
///   (len - 1) / seq_len of them fit. With data.tokenizer the file is encoded
///   once at start-up as one document (encode_document: BOS, ids, EOS) and
///   its tokens are tiled the same way.
/// tokens: a file or a directory of *.bin files (sorted by name), all of
///   data.token_format. llmc (the default): each file is an llm.c shard, a
///   1024-byte header of int32 (magic 20240520 with version 1: uint16 tokens;
///   magic 20240801 with version 7: uint32 tokens; token count; zeros), then
///   exactly that many tokens; any other magic or version, or a count that
///   does not match the file's size, is an error naming the file. headerless:
///   raw tokens of width data.token_dtype; a file that starts with an llm.c
///   magic is an error (its header would be read as tokens). Samples are
///   tiled as for text within each file and never cross a file boundary; a
///   token >= model.vocab_size is found by find_bad_token() at start-up.
/// toy (model.name toy): inputs uniform in [0, 1), targets from toy_teacher(seed).
/// With data.val_fraction f > 0 the training set is the first samples of
/// data.path, all but the last ceil(f x samples), which make_validation_dataset() holds out.
/// A training set of fewer samples than spec.global_batch is an error naming both numbers.
std::unique_ptr<Dataset> make_dataset(const DatasetSpec& spec);

/// data.tokenizer loaded, or nullopt when it is empty. A vocabulary that
/// differs from model.vocab_size is an error naming the file and both sizes.
std::optional<Tokenizer> load_data_tokenizer(const DatasetSpec& spec);

/// The validation set, or nullptr when there is none:
/// data.val_path: that file or directory, read like data.path (same data.kind
///   and format rules; errors name data.val_path);
/// data.val_fraction: the last ceil(f x samples) of data.path, which training never sees;
/// synthetic: walks kSyntheticSamples .. 2 x kSyntheticSamples - 1 of the same
///   chain (training uses walks below kSyntheticSamples);
/// toy: draws kToySamples .. 2 x kToySamples - 1 of the same features and teacher.
std::unique_ptr<Dataset> make_validation_dataset(const DatasetSpec& spec);

/// Sample indices (into the dataset) of the `count` samples at positions
/// [first, first + count) of the infinite stream: epoch e = position / size
/// uses a permutation of [0, size) seeded by (seed, e).
std::vector<int64_t> sample_indices(uint64_t seed, int64_t dataset_size, int64_t first, int64_t count);

/// This rank's part of the global batch that starts at `consumed` samples:
/// the dataset indices for rank `rank` of `world` (global_batch divisible by world).
std::vector<int64_t> rank_batch_indices(uint64_t seed, int64_t dataset_size, int64_t consumed, int64_t global_batch,
                                        int rank, int world);

/// Fills inputs [B, ...] and targets [B, ...] with the samples `indices` (B = indices.size()).
void load_batch(const Dataset& dataset, std::span<const int64_t> indices, const Tensor& inputs, const Tensor& targets);

}  // namespace st::dataset
