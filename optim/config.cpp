// optim.*: the keys, their spellings and their one check.
#include "optim/config.h"

#include <limits>

namespace st {

namespace {

constexpr Named<OptimizerKind> kOptimizerNames[] = {{OptimizerKind::AdamW, "adamw"}, {OptimizerKind::Sgd, "sgd"}};
constexpr Named<ScheduleKind> kScheduleNames[] = {
    {ScheduleKind::Constant, "constant"}, {ScheduleKind::Cosine, "cosine"}, {ScheduleKind::Linear, "linear"}};

}  // namespace

std::span<const Named<OptimizerKind>> names_of(OptimizerKind) { return kOptimizerNames; }
std::span<const Named<ScheduleKind>> names_of(ScheduleKind) { return kScheduleNames; }

void visit_keys(OptimConfig& o, const KeyVisitor& v) {
  v({"name", "adamw | sgd"}, o.name);
  v({"lr", "peak learning rate"}, o.lr);
  v({"weight_decay", "on parameters with >= 2 dims only (AdamW: decoupled; SGD: L2, as torch)"}, o.weight_decay);
  v({"beta1", "AdamW first-moment decay"}, o.beta1);
  v({"beta2", "AdamW second-moment decay"}, o.beta2);
  v({"eps", "AdamW denominator epsilon"}, o.eps);
  v({"momentum", "SGD momentum"}, o.momentum);
  v({"grad_clip", "max global gradient norm; 0 disables clipping"}, o.grad_clip);
  v({"schedule.kind", "constant | cosine | linear (decay after warmup)"}, o.schedule.kind);
  v({"schedule.warmup_steps", "linear warmup: step s < warmup uses lr*(s+1)/warmup"}, o.schedule.warmup_steps);
  v({"schedule.min_lr", "LR at the end of the decay"}, o.schedule.min_lr);
}

void OptimConfig::validate() const {
  // Above 10 every model diverges in its first steps; the bound catches a
  // mistyped exponent (3e4 for 3e-4) before it costs a run.
  require(lr > 0 && lr <= 10, "optim.lr", lr, "a number in (0, 10]");
  require(weight_decay >= 0 && weight_decay <= 10, "optim.weight_decay", weight_decay, "a number in [0, 10]");
  require(beta1 >= 0 && beta1 < 1, "optim.beta1", beta1, "a number in [0, 1)");
  require(beta2 >= 0 && beta2 < 1, "optim.beta2", beta2, "a number in [0, 1)");
  require(eps >= std::numeric_limits<float>::min() && eps < 1, "optim.eps", eps,
          "a number in [1.2e-38, 1) (smaller is 0 in F32)");
  require(momentum >= 0 && momentum < 1, "optim.momentum", momentum, "a number in [0, 1)");
  require(grad_clip >= 0 && fits_f32(grad_clip), "optim.grad_clip", grad_clip,
          "a non-negative number within F32 range (0 disables clipping)");
  // More warmup steps than train.steps is allowed here: `--steps 1` on a
  // shipped config must run; the trainer clamps the warmup and says so.
  require(schedule.warmup_steps >= 0, "optim.schedule.warmup_steps", schedule.warmup_steps, "a non-negative integer");
  require(schedule.min_lr >= 0 && schedule.min_lr <= lr, "optim.schedule.min_lr", schedule.min_lr,
          format("a number from 0 to optim.lr ({})", yaml_text(lr)));
}

}  // namespace st
