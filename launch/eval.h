#pragma once
// Validation: the loss of the current weights on data that training never
// sees, forward only.
//
// An evaluation reads the first eval.batches global batches of the validation
// set in order (global batch b is samples [b G, (b+1) G), never shuffled, so
// every evaluation sees the same ones), splits each over the ranks as training
// does (rank r of p takes the contiguous slice [r G/p, (r+1) G/p)) and into
// micro-batches of train.micro_batch_size, and runs only the sharded model's
// forward and the loss: units gather and free as in training, no gradient is
// reduced, and nothing stays gathered or saved afterwards
// (fsdp::ShardedModel::release).
//
// The loss is the mean over every counted target (tokens; the toy model's
// output elements) of those batches. Each micro-batch's loss sum and count
// reach every rank exactly (an all-gather of their bits, not a rounding
// all-reduce) and are added in sample order, so every rank gets the same
// value, and so does any world size for the same weights and micro-batch
// size: the micro-batch sums of one unsharded process added in the same order.
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/comm.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "dataset/dataset.h"
#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "models/model.h"

namespace st::launch {

/// Whether an evaluation follows step `step` (1-based): every eval.interval
/// steps and after the run's last step (`total_steps`, train.steps); never
/// when eval.interval is 0. A function of the step alone, so a resumed run
/// evaluates at the same steps as one that ran through.
bool evaluation_due(const EvalConfig& eval, int64_t step, int64_t total_steps);

/// Dataset indices of rank `rank`'s part of validation global batch `batch`
/// (0-based): samples [b G + r G/p, b G + (r+1) G/p) for G = `global_batch`,
/// a multiple of the world size p.
std::vector<int64_t> validation_batch_indices(int64_t batch, int64_t global_batch, int rank, int world);

/// One evaluation's result, the same on every rank.
struct ValidationLoss {
  double loss = 0;      // mean over every counted target of the evaluated batches
  int64_t count = 0;    // counted targets over all ranks (tokens; the toy model: output elements)
  int64_t samples = 0;  // samples (sequences) evaluated over all ranks
};

/// Evaluates one sharded model on one validation set. Collective: every rank
/// constructs it and calls run() at the same point.
class Evaluator {
 public:
  /// An error naming eval.batches and train.global_batch_size unless `val`
  /// holds eval.batches global batches. Sizes one micro-batch's buffers once
  /// (host, and `device` for a GPU model). `model` is the module `sharded` wraps.
  Evaluator(const Config& config, const dataset::Dataset& val, const models::Model& model, fsdp::ShardedModel& sharded,
            ProcessGroup& world, Device device = Device::cpu());

  /// The validation loss of the current weights. In a profiled step its time,
  /// its forwards included, is the eval phase's.
  ValidationLoss run();

 private:
  using Clock = std::chrono::steady_clock;

  // Forward and loss of the micro-batch in the buffers; adds the forward's
  // time to `forward_seconds`.
  ops::LossSum forward_loss(double& forward_seconds);
  // The mean over all ranks' micro-batches (batches_ x accum_ each, in order).
  ValidationLoss reduce(const std::vector<ops::LossSum>& mine);

  const dataset::Dataset& val_;
  fsdp::ShardedModel& sharded_;
  ProcessGroup& world_;
  Device device_;
  models::LossKind loss_kind_;
  int64_t batches_;                      // eval.batches
  int64_t global_batch_;                 // train.global_batch_size
  int64_t micro_batch_;                  // train.micro_batch_size
  int64_t accum_;                        // micro-batches per rank per global batch
  Tensor input_, target_;                // one micro-batch on the host
  Tensor device_input_, device_target_;  // the same on `device` (the host tensors on a CPU)
};

}  // namespace st::launch
