#include "launch/eval.h"

#include <array>
#include <bit>
#include <span>

#include "core/error.h"
#include "core/format.h"
#include "core/profile.h"
#include "core/watchdog.h"
#include "launch/trainer.h"

namespace st::launch {

namespace {

Shape with_batch(int64_t batch, const Shape& sample) {
  Shape s{batch};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

// A micro-batch's loss sum and count as four int32 words: their exact bits.
constexpr int64_t kWords = 4;

void append_words(const ops::LossSum& l, std::vector<int32_t>& words) {
  const auto sum = std::bit_cast<std::array<int32_t, 2>>(l.sum);
  const auto count = std::bit_cast<std::array<int32_t, 2>>(l.count);
  words.insert(words.end(), {sum[0], sum[1], count[0], count[1]});
}

ops::LossSum from_words(const int32_t* w) {
  return {std::bit_cast<double>(std::array<int32_t, 2>{w[0], w[1]}),
          std::bit_cast<int64_t>(std::array<int32_t, 2>{w[2], w[3]})};
}

}  // namespace

bool evaluation_due(const EvalConfig& eval, int64_t step, int64_t total_steps) {
  return eval.interval > 0 && (step % eval.interval == 0 || step == total_steps);
}

std::vector<int64_t> validation_batch_indices(int64_t batch, int64_t global_batch, int rank, int world) {
  ST_CHECK(world > 0 && rank >= 0 && rank < world, "validation_batch_indices: rank {} is not in a world of {}", rank,
           world);
  ST_CHECK(batch >= 0 && global_batch > 0 && global_batch % world == 0,
           "validation_batch_indices: batch {} of {} samples cannot be split over {} ranks", batch, global_batch,
           world);
  const int64_t per_rank = global_batch / world;
  std::vector<int64_t> out(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i) out[static_cast<size_t>(i)] = batch * global_batch + rank * per_rank + i;
  return out;
}

Evaluator::Evaluator(const Config& config, const dataset::Dataset& val, const models::Model& model,
                     fsdp::ShardedModel& sharded, ProcessGroup& world, Device device)
    : val_(val),
      sharded_(sharded),
      world_(world),
      device_(device),
      loss_kind_(model.loss_kind()),
      batches_(config.eval.batches),
      global_batch_(config.train.global_batch_size),
      micro_batch_(config.train.micro_batch_size),
      accum_(accumulation_steps(config.train, world.size())) {
  const int64_t needed = batches_ * global_batch_;
  const int64_t fit = val.size() / global_batch_;
  ST_CHECK(val.size() >= needed,
           "the validation data has {} samples, fewer than eval.batches {} x train.global_batch_size {} = {}; {} "
           "(validation data: {})",
           val.size(), batches_, global_batch_, needed,
           fit > 0 ? format("lower eval.batches to {} or give more validation data", fit)
                   : std::string("give more validation data"),
           val.describe());
  const int64_t seq_len = config.train.seq_len;
  const DType dtype = loss_kind_ == models::LossKind::CrossEntropy ? DType::I32 : DType::F32;
  input_ = Tensor::empty(with_batch(micro_batch_, model.sample_input_shape(seq_len)), dtype);
  target_ = Tensor::empty(with_batch(micro_batch_, model.sample_target_shape(seq_len)), dtype);
  device_input_ = device.is_cpu() ? input_ : Tensor::empty(input_.shape(), dtype, device);
  device_target_ = device.is_cpu() ? target_ : Tensor::empty(target_.shape(), dtype, device);
}

ValidationLoss Evaluator::run() {
  const profile::PhaseScope eval_phase(profile::Phase::Eval);
  // Copies kept gathered since the last step (NO_SHARD's) predate its optimizer step.
  sharded_.release();
  std::vector<ops::LossSum> mine;
  double forward_seconds = 0;
  for (int64_t b = 0; b < batches_; ++b) {
    const std::vector<int64_t> indices = validation_batch_indices(b, global_batch_, world_.rank(), world_.size());
    for (int64_t m = 0; m < accum_; ++m) {
      dataset::load_batch(
          val_, std::span(indices).subspan(static_cast<size_t>(m * micro_batch_), static_cast<size_t>(micro_batch_)),
          input_, target_);
      if (device_.is_cuda()) {
        device_input_.copy_from(input_);
        device_target_.copy_from(target_);
      }
      mine.push_back(forward_loss(forward_seconds));
      if (Watchdog* w = world_.watchdog()) w->progress();
    }
  }
  sharded_.release();
  // ShardedModel::forward charges its time to the forward phase; here it is the evaluation's.
  if (profile::Profiler* p = profile::current())
    p->move_phase_time(profile::Phase::Forward, profile::Phase::Eval, forward_seconds);
  return reduce(mine);
}

ops::LossSum Evaluator::forward_loss(double& forward_seconds) {
  const auto t0 = Clock::now();
  Tensor out = sharded_.forward(device_input_);
  forward_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  // The losses are fused with their gradients; grad_scale 0 writes zeros over
  // the output, which nothing reads again (there is no backward).
  if (loss_kind_ == models::LossKind::CrossEntropy) {
    Tensor logits = out.view({-1, out.size(-1)});
    return ops::cross_entropy(logits, device_target_.view({-1}), dataset::kIgnoreIndex, 0.0f, logits);
  }
  return ops::mse(out, device_target_, 0.0f, out);
}

ValidationLoss Evaluator::reduce(const std::vector<ops::LossSum>& mine) {
  const auto n = static_cast<int64_t>(mine.size());  // batches_ x accum_
  std::vector<int32_t> words;
  words.reserve(static_cast<size_t>(n * kWords));
  for (const ops::LossSum& l : mine) append_words(l, words);
  Tensor all = Tensor::empty({world_.size() * n * kWords}, DType::I32);
  world_.all_gather(all, Tensor::from_vector(words, {n * kWords})).wait();
  // Sample order: global batch b, then rank r's slice of it, then its micro-batches.
  const int32_t* w = all.data<int32_t>();
  double sum = 0;
  ValidationLoss v;
  for (int64_t b = 0; b < batches_; ++b) {
    for (int64_t r = 0; r < world_.size(); ++r) {
      for (int64_t m = 0; m < accum_; ++m) {
        const ops::LossSum l = from_words(w + (r * n + b * accum_ + m) * kWords);
        sum += l.sum;
        v.count += l.count;
      }
    }
  }
  ST_CHECK(v.count > 0, "the first {} validation batches have no target that counts (all are ignore_index {})",
           batches_, dataset::kIgnoreIndex);
  v.loss = sum / static_cast<double>(v.count);
  v.samples = batches_ * global_batch_;
  return v;
}

}  // namespace st::launch
