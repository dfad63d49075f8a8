// Learning-rate schedule. Convention (also in optimizer.h):
//
//   warmup  (step < W):  lr * (step + 1) / W            -> lr / W at step 0, lr at step W - 1
//   decay   (step >= W): progress = min(1, (step - W) / max(1, total_steps - W - 1))
//     constant: lr
//     cosine:   w * lr + (1 - w) * min_lr, w = 0.5 * (1 + cos(pi * progress))
//     linear:   (1 - progress) * lr + progress * min_lr
//
// so the first step after warmup takes lr and the last step of the run
// (total_steps - 1) takes exactly min_lr; steps past the end stay at min_lr.
// The weighted forms give both ends exactly (lr + (min_lr - lr) * 1 can miss
// min_lr by an ulp).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "optim/optimizer.h"

namespace st::optim {

double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps) {
  const ScheduleConfig& s = config.schedule;
  ST_CHECK(total_steps >= 1, "learning_rate: the run must have at least one step (train.steps), got {}", total_steps);
  ST_CHECK(step >= 0, "learning_rate: step must be >= 0, got {}", step);
  ST_CHECK(s.warmup_steps >= 0, "optim.schedule.warmup_steps must be >= 0, got {}", s.warmup_steps);
  const double lr = config.lr;
  const double min_lr = s.min_lr;
  const int64_t warmup = s.warmup_steps;
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);

  const int64_t span = std::max<int64_t>(1, total_steps - warmup - 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  switch (s.kind) {
    case ScheduleKind::Constant: return lr;
    case ScheduleKind::Cosine: {
      const double w = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      return w * lr + (1.0 - w) * min_lr;
    }
    case ScheduleKind::Linear: return (1.0 - progress) * lr + progress * min_lr;
  }
  ST_FAIL("optim.schedule.kind: unknown schedule kind {}", static_cast<int>(s.kind));
}

}  // namespace st::optim
