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
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"

namespace st::launch {

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
};

/// Builds the dataset for `data.*` and the model: synthetic/text/tokens for
/// LLaMA (seq_len from train.seq_len), seeded random features for the toy
/// model. Bad files are errors naming the file and what is wrong.
std::unique_ptr<Dataset> make_dataset(const Config& config);

/// Sample indices (into the dataset) of the `count` samples at positions
/// [first, first + count) of the infinite stream: epoch e = position / size
/// uses a permutation of [0, size) seeded by (seed, e).
std::vector<int64_t> sample_indices(uint64_t seed, int64_t dataset_size, int64_t first, int64_t count);

/// This rank's part of the global batch that starts at `consumed` samples:
/// the dataset indices for rank `rank` of `world` (global_batch divisible by world).
std::vector<int64_t> rank_batch_indices(uint64_t seed, int64_t dataset_size, int64_t consumed,
                                        int64_t global_batch, int rank, int world);

/// Fills inputs [B, ...] and targets [B, ...] with the samples `indices` (B = indices.size()).
void load_batch(const Dataset& dataset, std::span<const int64_t> indices, const Tensor& inputs,
                const Tensor& targets);

}  // namespace st::launch
