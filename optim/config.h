#pragma once
// optim.*: the optimizer, its hyper-parameters and the learning-rate schedule.
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <span>
#include <string_view>

#include "core/config.h"

namespace st {

enum class OptimizerKind : uint8_t { AdamW, Sgd };
enum class ScheduleKind : uint8_t { Constant, Cosine, Linear };

/// YAML spellings: "adamw" | "sgd"; "constant" | "cosine" | "linear".
std::span<const Named<OptimizerKind>> names_of(OptimizerKind);
std::span<const Named<ScheduleKind>> names_of(ScheduleKind);

// clang-format off
struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::Cosine;  // constant | cosine | linear (decay after warmup)
  int64_t warmup_steps = 0;                  // linear warmup: step s < warmup uses lr*(s+1)/warmup
  double min_lr = 0.0;                       // LR at the end of the decay

  bool operator==(const ScheduleConfig&) const = default;
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::AdamW;  // adamw | sgd
  double lr = 3e-4;                           // peak learning rate
  double weight_decay = 0.1;                  // on parameters with >= 2 dims only (AdamW: decoupled; SGD: L2, as torch)
  double beta1 = 0.9;                         // AdamW first-moment decay
  double beta2 = 0.95;                        // AdamW second-moment decay
  double eps = 1e-8;                          // AdamW denominator epsilon
  double momentum = 0.9;                      // SGD momentum
  double grad_clip = 1.0;                     // max global gradient norm; 0 disables clipping
  ScheduleConfig schedule;                    // learning-rate schedule

  /// Throws st::Error naming the key for a value out of range.
  void validate() const;
  bool operator==(const OptimConfig&) const = default;
};
// clang-format on

/// The optim.* keys (names relative to the section).
void visit_keys(OptimConfig& c, const KeyVisitor& v);

}  // namespace st
