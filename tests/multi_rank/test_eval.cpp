// launch::Evaluator at 1, 2 and 4 ranks on the tiny LLaMA (configs/llama-tiny.yaml).
//
// The reference is computed here without the trainer or FSDP: the weights
// the sharded run holds after two steps (gathered in F32), cast to
// param_dtype into a plain unsharded model, whose forward and cross-entropy
// run on each micro-batch of the first eval.batches validation batches in
// sample order; the validation loss is the sum of their loss sums over the
// sum of their token counts. The evaluator's forward is the same model code
// on the same weights (gathered as param_dtype casts of the same F32 values),
// and it adds the same micro-batch sums in the same order, so the two must
// agree bit for bit for every strategy, precision and recomputation setting,
// at every world size.
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/comm.h"
#include "core/ops.h"
#include "dataset/dataset.h"
#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "launch/eval.h"
#include "models/model.h"
#include "tests/harness/mpi_env.h"
#include "tests/harness/test_util.h"
#include "tests/harness/train_harness.h"

namespace st::launch {
namespace {

using test::Harness;

constexpr int kTrainSteps = 2;  // so that NO_SHARD's copies kept gathered after a step are stale

/// The tiny LLaMA, F32, no recomputation, validating on 2 global batches.
Config tiny_config() {
  Config c = load_config("configs/llama-tiny.yaml");
  c.train.steps = 10;
  c.fsdp.mixed_precision.param_dtype = DType::F32;
  c.fsdp.activation_checkpointing.mode = RecomputeMode::None;
  c.eval.interval = 5;
  c.eval.batches = 2;
  return c;
}

/// The validation loss of `params` (full F32 weights by FQN) computed as the
/// file comment says: a plain model in param_dtype, micro-batch by micro-batch.
double reference_loss(const Config& c, const std::vector<std::pair<std::string, std::vector<float>>>& params,
                      const dataset::Dataset& val) {
  std::unique_ptr<models::Model> model = models::build_model(c.model);
  models::allocate_parameters(*model, c.fsdp.mixed_precision.param_dtype);
  for (auto& [fqn, p] : model->named_parameters()) {
    auto it = std::find_if(params.begin(), params.end(), [&name = fqn](const auto& e) { return e.first == name; });
    EXPECT_NE(it, params.end()) << fqn;
    if (it != params.end()) ops::cast(Tensor::from_vector(it->second, p->shape), p->value);
  }
  const TrainConfig& tc = c.train;
  Tensor in = Tensor::empty({tc.micro_batch_size, tc.seq_len}, DType::I32);
  Tensor tgt = Tensor::empty({tc.micro_batch_size, tc.seq_len}, DType::I32);
  double sum = 0;
  int64_t count = 0;
  for (int64_t first = 0; first < c.eval.batches * tc.global_batch_size; first += tc.micro_batch_size) {
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < tc.micro_batch_size; ++i) indices.push_back(first + i);
    load_batch(val, indices, in, tgt);
    Tensor out = model->forward(in);
    Tensor logits = out.view({-1, out.size(-1)});
    const ops::LossSum loss = ops::cross_entropy(logits, tgt.view({-1}), dataset::kIgnoreIndex, 0.0f, logits);
    sum += loss.sum;
    count += loss.count;
  }
  EXPECT_EQ(count, c.eval.batches * tc.global_batch_size * tc.seq_len);  // no target is ignored
  return sum / static_cast<double>(count);
}

/// Whether every rank holds the same bits of `v`.
bool same_on_every_rank(double v, ProcessGroup& world) {
  const auto bits = std::bit_cast<std::array<int32_t, 2>>(v);
  Tensor all = Tensor::empty({2 * static_cast<int64_t>(world.size())}, DType::I32);
  world.all_gather(all, Tensor::from_vector(std::vector<int32_t>{bits[0], bits[1]}, {2})).wait();
  const int32_t* w = all.data<int32_t>();
  for (int r = 0; r < world.size(); ++r) {
    if (w[2 * r] != bits[0] || w[2 * r + 1] != bits[1]) return false;
  }
  return true;
}

std::string describe(const Config& c) {
  return format("{} (g {}), {}, recompute {}, micro-batch {} of {}", to_string(c.fsdp.sharding_strategy),
                c.fsdp.shard_group_size, precision_name(c.fsdp.mixed_precision.param_dtype),
                to_string(c.fsdp.activation_checkpointing.mode), c.train.micro_batch_size, c.train.global_batch_size);
}

std::vector<Config> variants(int world) {
  std::vector<Config> out;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                             ShardingStrategy::HybridShard}) {
    Config c = tiny_config();
    c.fsdp.sharding_strategy = s;
    if (s == ShardingStrategy::HybridShard) c.fsdp.shard_group_size = world == 4 ? 2 : 1;
    out.push_back(c);
  }
  Config c = tiny_config();  // the llama-tiny default: BF16 and recomputation
  c.fsdp.mixed_precision.param_dtype = DType::BF16;
  c.fsdp.activation_checkpointing.mode = RecomputeMode::Full;
  out.push_back(c);
  c.fsdp.sharding_strategy = ShardingStrategy::NoShard;
  out.push_back(c);
  c = tiny_config();  // micro-batches of 2: 4, 2, 1 per rank at 1, 2, 4 ranks
  c.train.global_batch_size = 8;
  c.train.micro_batch_size = 2;
  out.push_back(c);
  return out;
}

TEST(Evaluator, LossIsTheMeanOfThePlainForwardLossesOnEveryRank) {
  ProcessGroup& world = test::world();
  for (const Config& c : variants(world.size())) {
    Harness h(c, world);
    for (int s = 0; s < kTrainSteps; ++s) h.step();
    const std::unique_ptr<dataset::Dataset> val = dataset::make_validation_dataset(dataset_spec(c));
    Evaluator evaluator(c, *val, h.model(), h.sharded(), world);
    const ValidationLoss got = evaluator.run();
    const double want = reference_loss(c, h.sharded().full_parameters(), *val);
    EXPECT_EQ(got.loss, want) << describe(c) << ": relative difference " << std::abs(got.loss - want) / want;
    EXPECT_EQ(got.count, c.eval.batches * c.train.global_batch_size * c.train.seq_len);
    EXPECT_EQ(got.samples, c.eval.batches * c.train.global_batch_size);
    EXPECT_TRUE(same_on_every_rank(got.loss, world)) << describe(c);
    // The same batches every time: a second evaluation of the same weights gives the same bits.
    EXPECT_EQ(evaluator.run().loss, got.loss) << describe(c);
    if (world.rank() == 0) {
      std::printf("world %d %-60s val_loss %.17g, reference %.17g\n", world.size(), describe(c).c_str(), got.loss,
                  want);
    }
  }
}

// Nothing stays gathered or saved for backward: after an evaluation the
// allocator holds exactly what it held with every unit freed before it.
TEST(Evaluator, LeavesNothingGatheredOrSaved) {
  ProcessGroup& world = test::world();
  for (const Config& c : variants(world.size())) {
    Harness h(c, world);
    h.step();
    const std::unique_ptr<dataset::Dataset> val = dataset::make_validation_dataset(dataset_spec(c));
    Evaluator evaluator(c, *val, h.model(), h.sharded(), world);
    h.sharded().release();
    const int64_t before = cpu_allocator().stats().current_bytes;
    evaluator.run();
    EXPECT_EQ(cpu_allocator().stats().current_bytes, before) << describe(c);
  }
}

// Evaluating between steps changes no training loss and no weight.
TEST(Evaluator, DoesNotChangeTraining) {
  ProcessGroup& world = test::world();
  for (const Config& c : variants(world.size())) {
    Harness plain(c, world), evaluated(c, world);
    const std::unique_ptr<dataset::Dataset> val = dataset::make_validation_dataset(dataset_spec(c));
    Evaluator evaluator(c, *val, evaluated.model(), evaluated.sharded(), world);
    for (int s = 0; s < 3; ++s) {
      const double a = plain.step();
      evaluator.run();
      const double b = evaluated.step();
      EXPECT_EQ(a, b) << describe(c) << ", step " << s + 1;
    }
    EXPECT_TRUE(plain.sharded().full_parameters() == evaluated.sharded().full_parameters()) << describe(c);
  }
}

TEST(Evaluator, TooFewValidationSamplesIsAnErrorNamingTheKeys) {
  ProcessGroup& world = test::world();
  Config c = tiny_config();
  c.data.kind = DataKind::Text;
  c.data.path = "/usr/share/common-licenses/GPL-3";  // about 1,100 samples of 32 bytes
  c.data.val_fraction = 0.05;
  c.eval.batches = 10;  // 120 samples; 55 are held out
  Harness h(c, world);
  const std::unique_ptr<dataset::Dataset> val = dataset::make_validation_dataset(dataset_spec(c));
  ASSERT_NE(val, nullptr);
  const std::string msg = test::error_of([&] { Evaluator e(c, *val, h.model(), h.sharded(), world); });
  EXPECT_NE(msg.find("the validation data has 55 samples, fewer than eval.batches 10 x train.global_batch_size 12 = "
                     "120; lower eval.batches to 4"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("data.val_fraction 0.05"), std::string::npos) << msg;
}

TEST(Evaluator, DueEveryIntervalAndAtTheEnd) {
  EvalConfig e;
  std::vector<int64_t> due;
  for (int64_t step = 1; step <= 20; ++step)
    if (evaluation_due(e, step, 20)) due.push_back(step);
  EXPECT_TRUE(due.empty());  // eval.interval 0: never
  e.interval = 7;
  for (int64_t step = 1; step <= 20; ++step)
    if (evaluation_due(e, step, 20)) due.push_back(step);
  EXPECT_EQ(due, (std::vector<int64_t>{7, 14, 20}));
}

TEST(Evaluator, BatchesAreTheFirstOnesInOrderSplitLikeTraining) {
  EXPECT_EQ(validation_batch_indices(0, 12, 0, 1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(validation_batch_indices(0, 12, 1, 4), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(validation_batch_indices(2, 12, 3, 4), (std::vector<int64_t>{33, 34, 35}));
  EXPECT_NE(test::error_of([] { validation_batch_indices(0, 12, 0, 5); }).find("cannot be split over 5 ranks"),
            std::string::npos);
}

}  // namespace
}  // namespace st::launch
