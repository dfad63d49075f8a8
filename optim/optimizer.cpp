// What every optimizer shares: segment validation, the factory, and the
// global-norm clipping helpers (which touch gradients only inside ranges,
// through segment_ops.h on either device).
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "optim/kernel.h"
#include "optim/segment_ops.h"

namespace st::optim {
namespace detail {

std::string segment_name(const Segment& segment) {
  const auto& r = segment.ranges;
  if (r.empty()) return "segment with no parameter ranges";
  if (r.size() == 1) return format("segment holding '{}'", r.front().fqn);
  return format("segment holding '{}' .. '{}' ({} parameters)", r.front().fqn, r.back().fqn, r.size());
}

namespace {

void check_flat_f32(const Tensor& t, const char* what, const Segment& segment) {
  ST_CHECK(t.defined(), "optimizer {}: {} is undefined", segment_name(segment), what);
  ST_CHECK(t.dtype() == DType::F32, "optimizer {}: {} must be F32 (FP32 master weights and gradients), got {}",
           segment_name(segment), what, t.dtype());
  ST_CHECK(t.dim() == 1, "optimizer {}: {} must be 1-D (a flat buffer), got shape {}", segment_name(segment), what,
           shape_str(t.shape()));
}

}  // namespace

void validate_segment(const Segment& segment) {
  check_flat_f32(segment.param, "param", segment);
  check_flat_f32(segment.grad, "grad", segment);
  ST_CHECK(segment.grad.device() == segment.param.device(), "optimizer {}: param is on {} but grad is on {}",
           segment_name(segment), segment.param.device(), segment.grad.device());
  const int64_t n = segment.param.numel();
  ST_CHECK(segment.grad.numel() == n, "optimizer {}: grad has {} elements but param has {}", segment_name(segment),
           segment.grad.numel(), n);
  const ParamRange* prev = nullptr;
  for (const ParamRange& r : segment.ranges) {
    ST_CHECK(!r.fqn.empty(), "optimizer {}: a parameter range at offset {} has an empty name", segment_name(segment),
             r.offset);
    ST_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset <= n && r.numel <= n - r.offset,
             "optimizer: parameter '{}' range [{}, {}) lies outside its segment of {} elements", r.fqn, r.offset,
             r.offset + r.numel, n);
    if (prev != nullptr) {
      ST_CHECK(r.offset >= prev->offset + prev->numel,
               "optimizer: parameter '{}' range [{}, {}) overlaps or precedes '{}' [{}, {}); ranges must be sorted "
               "by offset and disjoint",
               r.fqn, r.offset, r.offset + r.numel, prev->fqn, prev->offset, prev->offset + prev->numel);
    }
    prev = &r;
  }
  if (segment.param.device().is_cuda()) {
    const Tensor& t = segment.device_ranges;
    ST_CHECK(t.defined() && t.device() == segment.param.device() && t.dim() == 2 &&
                 t.size(0) == static_cast<int64_t>(segment.ranges.size()),
             "optimizer {}: a segment on {} needs device_ranges = optim::range_table(segment) ({} rows), got {}",
             segment_name(segment), segment.param.device(), segment.ranges.size(), t.defined() ? t.str() : "none");
  }
}

std::vector<RangeBlock> range_blocks(const Segment& segment, int64_t block) {
  std::vector<RangeBlock> blocks;
  for (const ParamRange& r : segment.ranges) {
    for (int64_t b = r.offset; b < r.offset + r.numel; b += block)
      blocks.push_back({b, std::min(b + block, r.offset + r.numel), r.weight_decay});
  }
  return blocks;
}

void validate_lr(double lr) {
  ST_CHECK(std::isfinite(lr) && lr >= 0, "optimizer step: learning rate must be a finite number >= 0, got {}", lr);
}

}  // namespace detail

Tensor range_table(const Segment& segment) {
  std::vector<int32_t> rows;
  rows.reserve(segment.ranges.size() * 3);
  for (const ParamRange& r : segment.ranges) {
    // The GPU kernels index a segment with 32-bit offsets: one rank's shard of
    // one unit stays far below 2^31 elements (8 GiB of F32) in practice.
    ST_CHECK(r.offset + r.numel < (int64_t{1} << 31),
             "optimizer {}: parameter '{}' ends at element {}, beyond the 2^31 elements a GPU segment supports; wrap "
             "the model into smaller units (fsdp.auto_wrap)",
             detail::segment_name(segment), r.fqn, r.offset + r.numel);
    rows.push_back(static_cast<int32_t>(r.offset));
    rows.push_back(static_cast<int32_t>(r.numel));
    rows.push_back(r.weight_decay ? 1 : 0);
  }
  Tensor table = Tensor::from_vector(rows, {static_cast<int64_t>(segment.ranges.size()), 3});
  return segment.param.device().is_cpu() ? table : table.to(segment.param.device());
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config) {
  // Config::validate() checks these too; repeated here because an optimizer
  // can be built from a config that never went through load_config.
  ST_CHECK(config.weight_decay >= 0 && std::isfinite(config.weight_decay),
           "optim.weight_decay must be a finite number >= 0, got {}", config.weight_decay);
  switch (config.name) {
    case OptimizerKind::AdamW: return detail::make_adamw(config);
    case OptimizerKind::Sgd: return detail::make_sgd(config);
  }
  ST_FAIL("optim.name: unknown optimizer kind {}", static_cast<int>(config.name));
}

double grad_sum_of_squares(const Segment& segment) {
  detail::validate_segment(segment);
  return detail::masked_sum_of_squares(segment.grad, segment);
}

double clip_coefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0;
  const double coef = max_norm / (total_norm + 1e-6);
  // As torch.clamp(coef, max=1.0): a NaN norm gives a NaN coefficient (the
  // step then shows NaN instead of silently skipping the clip); an infinite
  // norm gives 0.
  return std::isnan(coef) ? coef : std::min(coef, 1.0);
}

void scale_grad(const Segment& segment, double coefficient) {
  detail::validate_segment(segment);
  // torch multiplies by the coefficient held as an F32 tensor.
  detail::masked_scale(segment.grad, segment, static_cast<float>(coefficient));
}

}  // namespace st::optim
