#pragma once
// The training loop of launch/trainer.cpp, step by step, for multi-rank tests
// that look between its phases (gradients before the optimizer step, the
// weights an evaluation sees).
#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "core/comm.h"
#include "core/log.h"
#include "core/ops.h"
#include "dataset/dataset.h"
#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "launch/trainer.h"
#include "models/model.h"
#include "optim/optimizer.h"

namespace st::test {

/// The training loop of launch/trainer.cpp (token models), step by step.
class Harness {
 public:
  Harness(const Config& config, ProcessGroup& group)
      : config_(config),
        group_(group),
        log_(group.rank(), group.size(), LogLevel::Warn),
        model_(models::build_model(config.model)) {
    fsdp::apply_activation_checkpointing(*model_, config.fsdp.activation_checkpointing);
    sharded_ = std::make_unique<fsdp::ShardedModel>(*model_, config.fsdp, group, 1, config.train.seed, log_);
    optimizer_ = optim::make_optimizer(config.optim);
    for (const optim::Segment& s : sharded_->segments()) optimizer_->add_segment(s);
    dataset_ = dataset::make_dataset(dataset_spec(config));
    const TrainConfig& tc = config.train;
    accum_ = launch::accumulation_steps(tc, group.size());
    for (int64_t m = 0; m < accum_; ++m) {
      inputs_.push_back(Tensor::empty({tc.micro_batch_size, tc.seq_len}, DType::I32));
      targets_.push_back(Tensor::empty({tc.micro_batch_size, tc.seq_len}, DType::I32));
    }
  }

  /// zero_grad, forward/backward of this rank's micro-batches, gradient sync;
  /// returns the mean loss over the global batch.
  double forward_backward() {
    const TrainConfig& tc = config_.train;
    std::vector<int64_t> mine = dataset::rank_batch_indices(tc.seed, dataset_->size(), consumed_, tc.global_batch_size,
                                                            group_.rank(), group_.size());
    int64_t local_count = 0;
    for (int64_t m = 0; m < accum_; ++m) {
      std::span<const int64_t> idx(mine.data() + m * tc.micro_batch_size, static_cast<size_t>(tc.micro_batch_size));
      dataset::load_batch(*dataset_, idx, inputs_[static_cast<size_t>(m)], targets_[static_cast<size_t>(m)]);
      for (int32_t t : targets_[static_cast<size_t>(m)].span<int32_t>()) local_count += t != dataset::kIgnoreIndex;
    }
    Tensor count_t = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(local_count)}, {1});
    group_.all_reduce(count_t).wait();
    const int64_t count = count_t.data<int32_t>()[0];

    sharded_->zero_grad();
    double local_sum = 0;
    for (int64_t m = 0; m < accum_; ++m) {
      Tensor out = sharded_->forward(inputs_[static_cast<size_t>(m)]);
      Tensor logits = out.view({-1, out.size(-1)});  // the gradient overwrites the logits
      ops::LossSum loss = ops::cross_entropy(logits, targets_[static_cast<size_t>(m)].view({-1}), dataset::kIgnoreIndex,
                                             1.0f / static_cast<float>(count), logits);
      sharded_->backward(out);
      local_sum += loss.sum;
    }
    sharded_->finish_grad_sync();
    Tensor loss_sum = Tensor::full({1}, local_sum, DType::F32);
    group_.all_reduce(loss_sum).wait();
    consumed_ += tc.global_batch_size;
    return loss_sum.data<float>()[0] / static_cast<double>(count);
  }

  /// Clip and optimizer step after forward_backward().
  void update() {
    const double norm = std::sqrt(sharded_->grad_norm_squared());
    const double clip = optim::clip_coefficient(norm, config_.optim.grad_clip);
    if (clip < 1.0) {
      for (const optim::Segment& s : sharded_->segments()) optim::scale_grad(s, clip);
    }
    optimizer_->step(optim::learning_rate(config_.optim, step_, config_.train.steps));
    ++step_;
  }

  double step() {
    const double loss = forward_backward();
    update();
    return loss;
  }

  std::vector<double> train() {
    std::vector<double> losses;
    for (int64_t s = 0; s < config_.train.steps; ++s) losses.push_back(step());
    return losses;
  }

  fsdp::ShardedModel& sharded() { return *sharded_; }
  const models::Model& model() const { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  Config config_;
  ProcessGroup& group_;
  Logger log_;
  std::unique_ptr<models::Model> model_;  // outlives sharded_, which un-hooks it
  std::unique_ptr<fsdp::ShardedModel> sharded_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<dataset::Dataset> dataset_;
  int64_t accum_ = 0;
  std::vector<Tensor> inputs_, targets_;
  int64_t consumed_ = 0;
  int64_t step_ = 0;
};

}  // namespace st::test
