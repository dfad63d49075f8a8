#pragma once
// Optimizers over flat F32 buffers. A segment is one flat parameter buffer
// (a whole model, or one rank's shard of an FSDP unit) with its gradient and
// the ranges that belong to real parameters; elements outside every range
// (padding) are never read or updated. Numerics follow torch.optim exactly
// (same formulas, same order of operations, F32 arithmetic).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/config.h"

namespace st::optim {

/// Elements [offset, offset + numel) of a segment belong to parameter `fqn`.
struct ParamRange {
  std::string fqn;
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = false;  // decay only parameters with two or more dimensions
};

struct Segment {
  Tensor param;                    // F32 [n], updated in place
  Tensor grad;                     // F32 [n], read only
  std::vector<ParamRange> ranges;  // sorted, non-overlapping, inside [0, n)
  Tensor device_ranges = {};       // GPU segments only: `ranges` as range_table() builds them, made once
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// Registers a segment; its state buffers start at zero. Returns its index.
  virtual size_t add_segment(Segment segment) = 0;
  /// One update of every segment with learning rate `lr` (the schedule's value).
  virtual void step(double lr) = 0;
  /// Completed steps (AdamW's bias correction uses step_count() after increment).
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  /// Named state buffers of segment `i`, same layout as its param:
  /// {"exp_avg", t}, {"exp_avg_sq", t} for AdamW; {"momentum_buffer", t} for SGD.
  virtual std::vector<std::pair<std::string, Tensor>> state(size_t i) const = 0;
  /// Bytes held by optimizer state (for the memory table).
  virtual int64_t state_bytes() const = 0;

 protected:
  int64_t step_ = 0;
};

/// AdamW or SGD from `optim.*` (lr comes per step from the schedule).
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config);

/// Learning rate at step `step` (0-based: the step about to be taken) of a run
/// of `total_steps`: linear warmup from lr/warmup to lr over warmup_steps, then
/// constant, cosine or linear decay to min_lr at the last step. Exactly, with
/// W = warmup_steps:
///   step < W:  lr * (step + 1) / W   (lr / W at step 0, lr at step W - 1)
///   step >= W: progress = min(1, (step - W) / max(1, total_steps - W - 1));
///              constant lr; cosine min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * progress));
///              linear lr + (min_lr - lr) * progress.
/// Step W takes lr and step total_steps - 1 takes min_lr (when the decay spans
/// two or more steps); later steps stay at min_lr. Throws for total_steps < 1 or step < 0.
double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps);

/// `segment.ranges` as the GPU kernels take them: an I32 [R, 3] table of
/// (offset, numel, decay flag) rows on the segment's device. A GPU segment
/// carries it in `device_ranges`, built once when the segment is made.
Tensor range_table(const Segment& segment);

/// Sum of squares of the gradient over the segment's ranges (padding excluded), in double.
double grad_sum_of_squares(const Segment& segment);
/// Clip coefficient for a global norm: min(1, max_norm / (norm + 1e-6)) as
/// torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0 (clipping off).
double clip_coefficient(double total_norm, double max_norm);
/// grad *= coefficient over the segment's ranges.
void scale_grad(const Segment& segment, double coefficient);

}  // namespace st::optim
