// AdamW as torch.optim.AdamW in PyTorch 1.13 (single-tensor path, amsgrad and
// maximize off), element by element over the ranges of each segment:
//
//   t      = step_count()                  (1 on the first step)
//   p     *= 1 - lr * weight_decay         (weight_decay 0 outside decay ranges)
//   m      = beta1 * m + (1 - beta1) * g   (torch: m.mul_(beta1).add_(g, alpha=1-beta1))
//   v      = beta2 * v + (1 - beta2) * g*g (torch: v.mul_(beta2).addcmul_(g, g, value=1-beta2))
//   denom  = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p     += (-lr / (1 - beta1^t)) * m / denom
//
// Scalars are computed in double and rounded to F32 where torch rounds them
// (a Python float meeting an F32 tensor); the element loop is
// segment_ops.h's adamw_step (CPU or GPU by the segment's device), and
// kernel.h states its F32 rounding.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/kernel.h"
#include "optim/segment_ops.h"

namespace st::optim::detail {
namespace {

// Elements per parallel block of the CPU loop.
constexpr int64_t kBlockElems = 32768;

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const OptimConfig& config)
      : beta1_(config.beta1), beta2_(config.beta2), eps_(config.eps), weight_decay_(config.weight_decay) {
    ST_CHECK(beta1_ >= 0 && beta1_ < 1, "optim.beta1 must be in [0, 1), got {}", beta1_);
    ST_CHECK(beta2_ >= 0 && beta2_ < 1, "optim.beta2 must be in [0, 1), got {}", beta2_);
    ST_CHECK(eps_ >= 0 && std::isfinite(eps_), "optim.eps must be a finite number >= 0, got {}", eps_);
  }

  size_t add_segment(Segment segment) override {
    validate_segment(segment);
    const int64_t n = segment.param.numel();
    const Device device = segment.param.device();
    Tensor exp_avg = Tensor::zeros({n}, DType::F32, device);
    Tensor exp_avg_sq = Tensor::zeros({n}, DType::F32, device);
    std::vector<RangeBlock> blocks = range_blocks(segment, kBlockElems);
    slots_.push_back({std::move(segment), std::move(exp_avg), std::move(exp_avg_sq), std::move(blocks)});
    return slots_.size() - 1;
  }

  void step(double lr) override {
    validate_lr(lr);
    ++step_;
    const auto t = static_cast<double>(step_);
    const double bias_correction1 = 1.0 - std::pow(beta1_, t);
    const double bias_correction2 = 1.0 - std::pow(beta2_, t);
    AdamWScalars s{};
    s.beta1 = static_cast<float>(beta1_);
    s.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    s.beta2 = static_cast<float>(beta2_);
    s.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    s.eps = static_cast<float>(eps_);
    s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
    s.decay = static_cast<float>(1.0 - lr * weight_decay_);
    for (const Slot& slot : slots_) adamw_step(slot.segment, slot.blocks, slot.exp_avg, slot.exp_avg_sq, s);
  }

  std::vector<std::pair<std::string, Tensor>> state(size_t i) const override {
    ST_CHECK(i < slots_.size(), "AdamW state: segment {} does not exist ({} registered)", i, slots_.size());
    return {{"exp_avg", slots_[i].exp_avg}, {"exp_avg_sq", slots_[i].exp_avg_sq}};
  }

  int64_t state_bytes() const override {
    int64_t bytes = 0;
    for (const Slot& slot : slots_) bytes += static_cast<int64_t>(slot.exp_avg.nbytes() + slot.exp_avg_sq.nbytes());
    return bytes;
  }

 private:
  struct Slot {
    Segment segment;
    Tensor exp_avg;                  // F32 [n], zero outside ranges
    Tensor exp_avg_sq;               // F32 [n], zero outside ranges
    std::vector<RangeBlock> blocks;  // the ranges cut for the CPU loop, made once (unused on a GPU)
  };

  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(const OptimConfig& config) { return std::make_unique<AdamW>(config); }

}  // namespace st::optim::detail
