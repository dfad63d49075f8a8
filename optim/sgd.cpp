// SGD with momentum as torch.optim.SGD in PyTorch 1.13 (single-tensor path,
// dampening 0, nesterov and maximize off), element by element over ranges:
//
//   d    = g + weight_decay * p            (decay ranges only; torch: g.add(p, alpha=wd))
//   buf  = d                               (first step: torch clones d)
//   buf  = momentum * buf + d              (later steps: buf.mul_(momentum).add_(d))
//   p   += -lr * buf                       (torch: p.add_(buf, alpha=-lr))
//
// See kernel.h for the F32 rounding.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/error.h"
#include "optim/kernel.h"

namespace st::optim::detail {
namespace {

enum class MomentumInit : uint8_t { Copy, Accumulate };

// Elements per parallel block.
constexpr int64_t kBlockElems = 32768;

ST_OPTIM_KERNEL void sgd_kernel(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                                float weight_decay, float momentum, float neg_lr, MomentumInit init) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // torch skips the add when weight_decay is 0 (adding 0 * p would turn an
    // infinite p into NaN and -0 into +0).
    const float d = weight_decay != 0.0f ? std::fma(p[i], weight_decay, g[i]) : g[i];
    float b = d;
    if (init == MomentumInit::Accumulate) {
      const float scaled = momentum * buf[i];
      b = scaled + d;
    }
    buf[i] = b;
    p[i] = std::fma(b, neg_lr, p[i]);
  }
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimConfig& config) : momentum_(config.momentum), weight_decay_(config.weight_decay) {
    ST_CHECK(momentum_ >= 0 && std::isfinite(momentum_), "optim.momentum must be a finite number >= 0, got {}",
             momentum_);
  }

  size_t add_segment(Segment segment) override {
    validate_segment(segment);
    ST_CHECK(segment.param.device().is_cpu(),
             "optim.name: sgd updates CPU tensors only, and {} is on {}; use adamw (which has a GPU kernel) or "
             "train.device: cpu",
             segment_name(segment), segment.param.device());
    Tensor buffer = Tensor::zeros({segment.param.numel()}, DType::F32);
    std::vector<RangeBlock> blocks = range_blocks(segment, kBlockElems);
    slots_.push_back({std::move(segment), std::move(buffer), std::move(blocks)});
    return slots_.size() - 1;
  }

  void step(double lr) override {
    validate_lr(lr);
    ++step_;
    // torch creates the buffer as a copy of d on the first step; with momentum
    // 0 it keeps no buffer and steps along d itself, which Copy reproduces.
    const MomentumInit init = (step_ == 1 || momentum_ == 0) ? MomentumInit::Copy : MomentumInit::Accumulate;
    const auto momentum = static_cast<float>(momentum_);
    const auto neg_lr = static_cast<float>(-lr);
    const auto decay = static_cast<float>(weight_decay_);
    for (Slot& slot : slots_) {
      float* p = slot.segment.param.data<float>();
      const float* g = slot.segment.grad.data<float>();
      float* buf = slot.momentum_buffer.data<float>();
      // Elements are independent: blocks may run on any thread.
      cpu::parallel_for(static_cast<int64_t>(slot.blocks.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const RangeBlock& blk = slot.blocks[static_cast<size_t>(b)];
          const int64_t o = blk.begin;
          const float wd = blk.weight_decay ? decay : 0.0f;
          sgd_kernel(p + o, g + o, buf + o, blk.end - blk.begin, wd, momentum, neg_lr, init);
        }
      });
    }
  }

  std::vector<std::pair<std::string, Tensor>> state(size_t i) const override {
    ST_CHECK(i < slots_.size(), "SGD state: segment {} does not exist ({} registered)", i, slots_.size());
    return {{"momentum_buffer", slots_[i].momentum_buffer}};
  }

  int64_t state_bytes() const override {
    int64_t bytes = 0;
    for (const Slot& slot : slots_) bytes += static_cast<int64_t>(slot.momentum_buffer.nbytes());
    return bytes;
  }

 private:
  struct Slot {
    Segment segment;
    Tensor momentum_buffer;          // F32 [n], zero outside ranges
    std::vector<RangeBlock> blocks;  // the ranges cut for the CPU loop, made once
  };

  double momentum_, weight_decay_;
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimConfig& config) { return std::make_unique<Sgd>(config); }

}  // namespace st::optim::detail
