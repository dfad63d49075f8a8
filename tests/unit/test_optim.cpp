// st::optim against references written here in double precision from the
// torch.optim formulas (AdamW, SGD with momentum), the documented LR schedule
// and torch's clip_grad_norm_ coefficient. Padding between and after ranges
// holds a NaN sentinel that must come out bit-identical: the optimizer may
// neither read nor write it. (tests/reference/torch_ref_optim.py compares with torch
// itself, bit for bit.)
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu/parallel.h"
#include "core/tensor.h"
#include "launch/config.h"
#include "optim/optimizer.h"
#include "tests/harness/test_util.h"

namespace st::optim {
namespace {

using st::test::error_of;

// A quiet NaN with a payload no arithmetic produces: bit equality proves the
// element was never written.
constexpr uint32_t kSentinelBits = 0x7FC0DEADu;
const float kSentinel = std::bit_cast<float>(kSentinelBits);

// F32 results against double references: |ours - ref| <= kRelTol * mag, where
// mag is the same recurrence run on absolute values (|m| terms summed, not m).
// That is the relative error of each element scaled by the condition of its
// sums: a first moment that cancels to near zero is judged against the size
// of the terms that cancelled, which is all F32 arithmetic can promise.
constexpr double kRelTol = 1e-6;

// Segment layout used throughout: four parameters, gaps between some, a tail.
//   [0, 20) decay | 20..23 gap | [23, 30) no decay | 30..32 gap | [32, 50) no decay | [50, 60) decay | 60..64 tail
constexpr int64_t kN = 64;
std::vector<ParamRange> layout() {
  return {{"model.layers.0.mlp.up_proj.weight", 0, 20, true},
          {"model.layers.0.input_layernorm.weight", 23, 7, false},
          {"model.norm.weight", 32, 18, false},
          {"lm_head.weight", 50, 10, true}};
}

bool in_ranges(const std::vector<ParamRange>& ranges, int64_t i) {
  for (const ParamRange& r : ranges)
    if (i >= r.offset && i < r.offset + r.numel) return true;
  return false;
}

float initial_value(int64_t i) { return static_cast<float>(0.5 * std::cos(0.11 * static_cast<double>(i)) + 0.1); }
float grad_value(int64_t i, int64_t step) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(step)));
}

// Param and grad of `n` elements, sentinel outside the ranges.
Segment make_segment(const std::vector<ParamRange>& ranges, int64_t n = kN) {
  std::vector<float> p(n, kSentinel);
  for (int64_t i = 0; i < n; ++i)
    if (in_ranges(ranges, i)) p[i] = initial_value(i);
  return Segment{Tensor::from_vector(p, {n}), Tensor::from_vector(std::vector<float>(n, kSentinel), {n}), ranges};
}

void fill_grad(const Segment& s, int64_t step) {
  auto g = s.grad.span<float>();
  for (const ParamRange& r : s.ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) g[i] = grad_value(i, step);
}

void expect_padding_untouched(const Segment& s) {
  const auto p = s.param.span<float>();
  const auto g = s.grad.span<float>();
  for (int64_t i = 0; i < s.param.numel(); ++i) {
    if (in_ranges(s.ranges, i)) continue;
    EXPECT_EQ(std::bit_cast<uint32_t>(p[i]), kSentinelBits) << "param padding element " << i << " was written";
    EXPECT_EQ(std::bit_cast<uint32_t>(g[i]), kSentinelBits) << "grad padding element " << i << " was written";
  }
}

void expect_state_padding_zero(const Segment& s, const Tensor& state, const std::string& name) {
  const auto v = state.span<float>();
  for (int64_t i = 0; i < state.numel(); ++i)
    if (!in_ranges(s.ranges, i)) {
      EXPECT_EQ(std::bit_cast<uint32_t>(v[i]), 0u) << name << " padding element " << i;
    }
}

// A reference value and the magnitude its error is measured against.
struct Ref {
  std::vector<double> value, mag;
  Ref() : value(kN, 0), mag(kN, 0) {}
};

// Max over the ranges of |ours - ref| / mag.
double max_rel_diff(const Tensor& ours, const Ref& ref, const std::vector<ParamRange>& ranges) {
  const auto o = ours.span<float>();
  double worst = 0;
  for (const ParamRange& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
      worst = std::max(worst, std::abs(o[i] - ref.value[i]) / std::max(ref.mag[i], 1e-30));
  return worst;
}

Tensor state_named(const Optimizer& opt, size_t segment, const std::string& name) {
  for (auto& [n, t] : opt.state(segment))
    if (n == name) return t;
  ADD_FAILURE() << "no state buffer named " << name;
  return {};
}

OptimConfig adamw_config() {
  OptimConfig c;
  c.name = OptimizerKind::AdamW;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  return c;
}

OptimConfig sgd_config() {
  OptimConfig c;
  c.name = OptimizerKind::Sgd;
  c.lr = 5e-2;
  c.weight_decay = 0.1;
  c.momentum = 0.9;
  return c;
}

// Per-step learning rates, varied so a wrong lr anywhere shows.
double lr_at(const OptimConfig& c, int64_t t) { return c.lr * (1.0 - 0.1 * static_cast<double>(t - 1)); }

// ---- AdamW ------------------------------------------------------------------

// torch.optim.AdamW, single-tensor path, in double.
struct AdamWReference {
  Ref p, m, v;
  explicit AdamWReference(const Segment& s) {
    for (const ParamRange& r : s.ranges)
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i) p.mag[i] = std::abs(p.value[i] = initial_value(i));
  }
  void step(const OptimConfig& c, const Segment& s, int64_t t, double lr) {
    const double bias_correction1 = 1 - std::pow(c.beta1, static_cast<double>(t));
    const double bias_correction2 = 1 - std::pow(c.beta2, static_cast<double>(t));
    for (const ParamRange& r : s.ranges) {
      const double wd = r.weight_decay ? c.weight_decay : 0.0;
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
        const double g = grad_value(i, t);
        p.value[i] *= 1 - lr * wd;
        m.value[i] = c.beta1 * m.value[i] + (1 - c.beta1) * g;
        v.value[i] = c.beta2 * v.value[i] + (1 - c.beta2) * g * g;
        const double denom = std::sqrt(v.value[i]) / std::sqrt(bias_correction2) + c.eps;
        p.value[i] -= lr / bias_correction1 * m.value[i] / denom;

        p.mag[i] *= 1 - lr * wd;
        m.mag[i] = c.beta1 * m.mag[i] + (1 - c.beta1) * std::abs(g);
        v.mag[i] = v.value[i];
        p.mag[i] += lr / bias_correction1 * m.mag[i] / denom;
      }
    }
  }
};

TEST(AdamW, MatchesDoubleReferenceOverSteps) {
  const OptimConfig c = adamw_config();
  Segment s = make_segment(layout());
  auto opt = make_optimizer(c);
  ASSERT_EQ(opt->add_segment(s), 0u);
  AdamWReference ref(s);
  for (int64_t t = 1; t <= 8; ++t) {
    fill_grad(s, t);
    opt->step(lr_at(c, t));
    ref.step(c, s, t, lr_at(c, t));
    EXPECT_EQ(opt->step_count(), t);
    EXPECT_LT(max_rel_diff(s.param, ref.p, s.ranges), kRelTol) << "param after step " << t;
    EXPECT_LT(max_rel_diff(state_named(*opt, 0, "exp_avg"), ref.m, s.ranges), kRelTol) << "exp_avg, step " << t;
    EXPECT_LT(max_rel_diff(state_named(*opt, 0, "exp_avg_sq"), ref.v, s.ranges), kRelTol) << "exp_avg_sq, step " << t;
  }
  expect_padding_untouched(s);
  for (auto& [name, t] : opt->state(0)) expect_state_padding_zero(s, t, name);
}

TEST(AdamW, WeightDecayOnlyOnDecayRanges) {
  // With a zero gradient the moments stay 0 and the Adam update is 0 / eps = 0,
  // so the step is pure decoupled decay: p * (1 - lr * wd) in F32, or nothing.
  const OptimConfig c = adamw_config();
  Segment s = make_segment(layout());
  for (const ParamRange& r : s.ranges) s.grad.flat_slice(r.offset, r.numel).zero_();
  auto opt = make_optimizer(c);
  opt->add_segment(s);
  opt->step(c.lr);
  const auto p = s.param.span<float>();
  const auto factor = static_cast<float>(1.0 - c.lr * c.weight_decay);
  for (const ParamRange& r : s.ranges) {
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      const float expected = r.weight_decay ? initial_value(i) * factor : initial_value(i);
      EXPECT_EQ(p[i], expected) << r.fqn << " element " << i;
    }
  }
  expect_padding_untouched(s);
}

TEST(AdamW, FirstStepMovesEachElementByLr) {
  // At t = 1 the bias-corrected update is lr * g / (|g| + eps): a step of lr
  // against the gradient's sign, whatever the gradient's size.
  OptimConfig c = adamw_config();
  c.weight_decay = 0;
  Segment s = make_segment(layout());
  fill_grad(s, 1);
  auto opt = make_optimizer(c);
  opt->add_segment(s);
  opt->step(c.lr);
  const auto p = s.param.span<float>();
  for (const ParamRange& r : s.ranges) {
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      const double g = grad_value(i, 1);
      if (std::abs(g) < 1e-3) continue;  // eps matters only for tiny gradients
      EXPECT_NEAR(p[i], initial_value(i) - c.lr * (g > 0 ? 1 : -1), 1e-6) << "element " << i;
    }
  }
}

TEST(AdamW, ResumeFromStateAndStepCountContinuesExactly) {
  // What a checkpoint restores: params, both moments and the step count. The
  // resumed optimizer must continue bit for bit (bias correction included).
  const OptimConfig c = adamw_config();
  Segment a = make_segment(layout());
  auto first = make_optimizer(c);
  first->add_segment(a);
  for (int64_t t = 1; t <= 3; ++t) {
    fill_grad(a, t);
    first->step(lr_at(c, t));
  }
  Segment b{a.param.clone(), a.grad.clone(), a.ranges};
  auto resumed = make_optimizer(c);
  resumed->add_segment(b);
  for (auto& [name, t] : first->state(0)) state_named(*resumed, 0, name).copy_from(t);
  resumed->set_step_count(first->step_count());
  fill_grad(a, 4);
  fill_grad(b, 4);
  first->step(lr_at(c, 4));
  resumed->step(lr_at(c, 4));
  EXPECT_EQ(resumed->step_count(), 4);
  const auto pa = a.param.span<float>();
  const auto pb = b.param.span<float>();
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(pa[i]), std::bit_cast<uint32_t>(pb[i])) << i;
}

TEST(AdamW, SeveralSegmentsEachWithOwnState) {
  const OptimConfig c = adamw_config();
  Segment s0 = make_segment(layout());
  Segment s1 = make_segment({{"model.embed_tokens.weight", 4, 30, true}}, 40);
  auto opt = make_optimizer(c);
  EXPECT_EQ(opt->add_segment(s0), 0u);
  EXPECT_EQ(opt->add_segment(s1), 1u);
  fill_grad(s0, 1);
  fill_grad(s1, 1);
  opt->step(c.lr);
  const Tensor m1 = state_named(*opt, 1, "exp_avg");
  EXPECT_EQ(m1.numel(), 40);
  EXPECT_FALSE(m1.shares_storage_with(state_named(*opt, 0, "exp_avg")));
  // Element 10 of segment 1 saw grad_value(10, 1); m = (1 - beta1) * g.
  EXPECT_NEAR(m1.span<float>()[10], 0.1 * grad_value(10, 1), 1e-8);
  EXPECT_NE(s1.param.span<float>()[10], initial_value(10));
  expect_padding_untouched(s0);
  expect_padding_untouched(s1);
}

TEST(AdamW, StateBuffersAndBytes) {
  Segment s0 = make_segment(layout());
  Segment s1 = make_segment({{"model.norm.weight", 0, 8, false}}, 8);
  auto opt = make_optimizer(adamw_config());
  EXPECT_EQ(opt->state_bytes(), 0);
  opt->add_segment(s0);
  opt->add_segment(s1);
  const auto state = opt->state(0);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg");
  EXPECT_EQ(state[1].first, "exp_avg_sq");
  for (const auto& [name, t] : state) {
    EXPECT_EQ(t.dtype(), DType::F32) << name;
    EXPECT_EQ(t.shape(), Shape{kN}) << name;
    for (float x : t.span<float>()) EXPECT_EQ(x, 0.0f) << name << " starts at zero";
  }
  EXPECT_EQ(opt->state_bytes(), 2 * 4 * (kN + 8));
  EXPECT_EQ(opt->step_count(), 0);
  EXPECT_NE(error_of([&] { opt->state(2); }).find("segment 2 does not exist (2 registered)"), std::string::npos);
}

// ---- SGD ----------------------------------------------------------------------

// torch.optim.SGD (dampening 0, nesterov off), in double.
struct SgdReference {
  Ref p, buf;
  explicit SgdReference(const Segment& s) {
    for (const ParamRange& r : s.ranges)
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i) p.mag[i] = std::abs(p.value[i] = initial_value(i));
  }
  void step(const OptimConfig& c, const Segment& s, int64_t t, double lr) {
    for (const ParamRange& r : s.ranges) {
      const double wd = r.weight_decay ? c.weight_decay : 0.0;
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
        const double g = grad_value(i, t);
        const double d = g + wd * p.value[i];
        buf.value[i] = t == 1 ? d : c.momentum * buf.value[i] + d;
        p.value[i] -= lr * buf.value[i];

        const double d_mag = std::abs(g) + wd * p.mag[i];
        buf.mag[i] = t == 1 ? d_mag : c.momentum * buf.mag[i] + d_mag;
        p.mag[i] += lr * buf.mag[i];
      }
    }
  }
};

TEST(Sgd, MatchesDoubleReferenceOverSteps) {
  const OptimConfig c = sgd_config();
  Segment s = make_segment(layout());
  auto opt = make_optimizer(c);
  opt->add_segment(s);
  SgdReference ref(s);
  for (int64_t t = 1; t <= 8; ++t) {
    fill_grad(s, t);
    opt->step(lr_at(c, t));
    ref.step(c, s, t, lr_at(c, t));
    EXPECT_LT(max_rel_diff(s.param, ref.p, s.ranges), kRelTol) << "param after step " << t;
    EXPECT_LT(max_rel_diff(state_named(*opt, 0, "momentum_buffer"), ref.buf, s.ranges), kRelTol)
        << "momentum_buffer, step " << t;
  }
  expect_padding_untouched(s);
  expect_state_padding_zero(s, state_named(*opt, 0, "momentum_buffer"), "momentum_buffer");
}

TEST(Sgd, FirstStepBufferIsTheGradient) {
  OptimConfig c = sgd_config();
  c.weight_decay = 0;
  Segment s = make_segment(layout());
  fill_grad(s, 1);
  auto opt = make_optimizer(c);
  opt->add_segment(s);
  opt->step(c.lr);
  const auto buf = state_named(*opt, 0, "momentum_buffer").span<float>();
  const auto p = s.param.span<float>();
  for (const ParamRange& r : s.ranges) {
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      EXPECT_EQ(buf[i], grad_value(i, 1)) << "element " << i;
      EXPECT_NEAR(p[i], initial_value(i) - c.lr * grad_value(i, 1), 1e-7) << "element " << i;
    }
  }
}

TEST(Sgd, WeightDecayIsCoupledAndOnlyOnDecayRanges) {
  // Zero gradient: the buffer holds wd * p on decay ranges and 0 elsewhere.
  const OptimConfig c = sgd_config();
  Segment s = make_segment(layout());
  for (const ParamRange& r : s.ranges) s.grad.flat_slice(r.offset, r.numel).zero_();
  auto opt = make_optimizer(c);
  opt->add_segment(s);
  opt->step(c.lr);
  const auto buf = state_named(*opt, 0, "momentum_buffer").span<float>();
  const auto p = s.param.span<float>();
  for (const ParamRange& r : s.ranges) {
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      if (r.weight_decay) {
        EXPECT_NEAR(buf[i], c.weight_decay * initial_value(i), 1e-8) << r.fqn;
        EXPECT_NEAR(p[i], initial_value(i) * (1 - c.lr * c.weight_decay), 1e-7) << r.fqn;
      } else {
        EXPECT_EQ(buf[i], 0.0f) << r.fqn;
        EXPECT_EQ(p[i], initial_value(i)) << r.fqn;
      }
    }
  }
  expect_padding_untouched(s);
}

TEST(Sgd, StateBuffersAndBytes) {
  Segment s = make_segment(layout());
  auto opt = make_optimizer(sgd_config());
  opt->add_segment(s);
  const auto state = opt->state(0);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "momentum_buffer");
  EXPECT_EQ(state[0].second.shape(), Shape{kN});
  EXPECT_EQ(opt->state_bytes(), 4 * kN);
  EXPECT_NE(error_of([&] { opt->state(1); }).find("segment 1 does not exist"), std::string::npos);
}

// ---- validation -------------------------------------------------------------------

std::string add_error(Segment s) {
  auto opt = make_optimizer(adamw_config());
  return error_of([&] { opt->add_segment(std::move(s)); });
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Validation, SegmentErrorsNameTheParameter) {
  const std::vector<ParamRange> one = {{"model.norm.weight", 0, 8, false}};
  const Tensor f8 = Tensor::zeros({8}, DType::F32);

  std::string e = add_error({Tensor::zeros({8}, DType::BF16), f8, one});
  EXPECT_TRUE(contains(e, "'model.norm.weight'") && contains(e, "param must be F32") && contains(e, "BF16")) << e;

  e = add_error({Tensor::zeros({2, 4}, DType::F32), f8, one});
  EXPECT_TRUE(contains(e, "'model.norm.weight'") && contains(e, "param must be 1-D") && contains(e, "[2, 4]")) << e;

  e = add_error({f8, Tensor::zeros({9}, DType::F32), one});
  EXPECT_TRUE(contains(e, "'model.norm.weight'") && contains(e, "grad has 9 elements but param has 8")) << e;

  e = add_error({f8, Tensor(), one});
  EXPECT_TRUE(contains(e, "grad is undefined")) << e;

  e = add_error({f8, f8, {{"lm_head.weight", 4, 5, true}}});
  EXPECT_TRUE(contains(e, "parameter 'lm_head.weight' range [4, 9) lies outside its segment of 8 elements")) << e;

  e = add_error({f8, f8, {{"lm_head.weight", -1, 2, true}}});
  EXPECT_TRUE(contains(e, "'lm_head.weight' range [-1, 1)")) << e;

  e = add_error({f8, f8, {{"a.weight", 0, 4, true}, {"b.weight", 3, 2, true}}});
  EXPECT_TRUE(contains(e, "'b.weight' range [3, 5) overlaps or precedes 'a.weight' [0, 4)")) << e;

  e = add_error({f8, f8, {{"a.weight", 4, 2, true}, {"b.weight", 0, 2, true}}});
  EXPECT_TRUE(contains(e, "'b.weight' range [0, 2) overlaps or precedes 'a.weight' [4, 6)")) << e;

  e = add_error({f8, f8, {{"", 0, 2, true}}});
  EXPECT_TRUE(contains(e, "empty name")) << e;

  // Adjacent ranges and an empty segment are fine.
  auto opt = make_optimizer(adamw_config());
  EXPECT_NO_THROW(opt->add_segment({f8, f8, {{"a.weight", 0, 4, true}, {"b.weight", 4, 4, false}}}));
  EXPECT_NO_THROW(opt->add_segment({f8, f8, {}}));
}

TEST(Validation, ConfigAndLearningRate) {
  OptimConfig c = adamw_config();
  c.beta1 = 1.0;
  EXPECT_TRUE(contains(error_of([&] { make_optimizer(c); }), "optim.beta1 must be in [0, 1)"));
  c = adamw_config();
  c.beta2 = -0.5;
  EXPECT_TRUE(contains(error_of([&] { make_optimizer(c); }), "optim.beta2"));
  c = sgd_config();
  c.momentum = -1;
  EXPECT_TRUE(contains(error_of([&] { make_optimizer(c); }), "optim.momentum"));
  c = sgd_config();
  c.weight_decay = -0.1;
  EXPECT_TRUE(contains(error_of([&] { make_optimizer(c); }), "optim.weight_decay"));

  auto opt = make_optimizer(adamw_config());
  EXPECT_TRUE(contains(error_of([&] { opt->step(-1e-3); }), "learning rate must be a finite number >= 0, got -0.001"));
  EXPECT_TRUE(contains(error_of([&] { opt->step(std::numeric_limits<double>::quiet_NaN()); }), "learning rate"));
  EXPECT_EQ(opt->step_count(), 0) << "a rejected step does not count";
}

// ---- schedule -----------------------------------------------------------------------

OptimConfig schedule_config(ScheduleKind kind, int64_t warmup) {
  OptimConfig c;
  c.lr = 1e-3;
  c.schedule = {kind, warmup, 1e-4};
  return c;
}

// Warmup 10, run of 111 steps: the decay spans steps 10..110, so step 60 is
// its midpoint (progress 0.5) and step 110 its end.
constexpr int64_t kWarmup = 10;
constexpr int64_t kTotal = 111;

TEST(Schedule, WarmupIsLinearFromLrOverWarmupToLr) {
  for (ScheduleKind kind : {ScheduleKind::Constant, ScheduleKind::Cosine, ScheduleKind::Linear}) {
    const OptimConfig c = schedule_config(kind, kWarmup);
    EXPECT_DOUBLE_EQ(learning_rate(c, 0, kTotal), 1e-4) << to_string(kind);
    EXPECT_DOUBLE_EQ(learning_rate(c, 4, kTotal), 5e-4) << to_string(kind);
    EXPECT_DOUBLE_EQ(learning_rate(c, kWarmup - 1, kTotal), 1e-3) << to_string(kind);
    EXPECT_DOUBLE_EQ(learning_rate(c, kWarmup, kTotal), 1e-3) << to_string(kind) << ": first decay step takes lr";
  }
}

TEST(Schedule, Constant) {
  const OptimConfig c = schedule_config(ScheduleKind::Constant, kWarmup);
  for (int64_t step : {10, 60, 110, 500}) EXPECT_EQ(learning_rate(c, step, kTotal), 1e-3) << step;
}

TEST(Schedule, Cosine) {
  const OptimConfig c = schedule_config(ScheduleKind::Cosine, kWarmup);
  EXPECT_DOUBLE_EQ(learning_rate(c, 60, kTotal), 5.5e-4);
  // A quarter of the way: min + (lr - min) * 0.5 * (1 + cos(pi / 4)).
  EXPECT_DOUBLE_EQ(learning_rate(c, 35, kTotal), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi / 4)));
  EXPECT_EQ(learning_rate(c, kTotal - 1, kTotal), 1e-4) << "the last step takes exactly min_lr";
  EXPECT_EQ(learning_rate(c, kTotal + 50, kTotal), 1e-4) << "past the end stays at min_lr";
  for (int64_t step = kWarmup; step + 1 < kTotal; ++step)
    EXPECT_GT(learning_rate(c, step, kTotal), learning_rate(c, step + 1, kTotal)) << step;
}

TEST(Schedule, Linear) {
  const OptimConfig c = schedule_config(ScheduleKind::Linear, kWarmup);
  EXPECT_DOUBLE_EQ(learning_rate(c, 60, kTotal), 5.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 35, kTotal), 1e-3 - 9e-4 * 0.25);
  EXPECT_EQ(learning_rate(c, kTotal - 1, kTotal), 1e-4);
  EXPECT_EQ(learning_rate(c, kTotal + 50, kTotal), 1e-4);
}

TEST(Schedule, NoWarmupAndShortRuns) {
  const OptimConfig cosine = schedule_config(ScheduleKind::Cosine, 0);
  EXPECT_EQ(learning_rate(cosine, 0, 100), 1e-3) << "step 0 takes lr without warmup";
  EXPECT_EQ(learning_rate(cosine, 99, 100), 1e-4);
  EXPECT_EQ(learning_rate(cosine, 0, 2), 1e-3);
  EXPECT_EQ(learning_rate(cosine, 1, 2), 1e-4);
  // A one-step run, or a decay of one step, takes lr (nothing to decay over).
  EXPECT_EQ(learning_rate(cosine, 0, 1), 1e-3);
  const OptimConfig warm = schedule_config(ScheduleKind::Linear, 5);
  EXPECT_EQ(learning_rate(warm, 5, 6), 1e-3);
  // Warmup as long as the run: never decays.
  EXPECT_DOUBLE_EQ(learning_rate(warm, 4, 5), 1e-3);
}

TEST(Schedule, Errors) {
  const OptimConfig c = schedule_config(ScheduleKind::Cosine, kWarmup);
  EXPECT_TRUE(contains(error_of([&] { learning_rate(c, 0, 0); }), "at least one step (train.steps), got 0"));
  EXPECT_TRUE(contains(error_of([&] { learning_rate(c, -1, 10); }), "step must be >= 0, got -1"));
  OptimConfig bad = c;
  bad.schedule.warmup_steps = -2;
  EXPECT_TRUE(contains(error_of([&] { learning_rate(bad, 0, 10); }), "optim.schedule.warmup_steps"));
}

// ---- clipping -------------------------------------------------------------------

TEST(Clip, CoefficientAsTorch) {
  EXPECT_DOUBLE_EQ(clip_coefficient(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  // At the limit torch still scales by max_norm / (norm + 1e-6) < 1.
  EXPECT_DOUBLE_EQ(clip_coefficient(1.0, 1.0), 1.0 / (1.0 + 1e-6));
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(1e6, 0.0), 1.0) << "max_norm 0 disables clipping";
  EXPECT_EQ(clip_coefficient(1e6, -1.0), 1.0);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0);
  EXPECT_TRUE(std::isnan(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
}

TEST(Clip, SumOfSquaresAndScaleTouchRangesOnly) {
  Segment s = make_segment(layout());
  fill_grad(s, 3);
  double expected = 0;
  for (const ParamRange& r : s.ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      const double g = grad_value(i, 3);
      expected += g * g;
    }
  const double sum = grad_sum_of_squares(s);
  EXPECT_TRUE(std::isfinite(sum)) << "NaN padding was read";
  EXPECT_NEAR(sum, expected, 1e-12 * expected);

  const double coef = clip_coefficient(std::sqrt(sum), 1.0);
  ASSERT_LT(coef, 1.0);
  scale_grad(s, coef);
  EXPECT_NEAR(std::sqrt(grad_sum_of_squares(s)), 1.0, 1e-6);
  const auto g = s.grad.span<float>();
  for (const ParamRange& r : s.ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
      EXPECT_EQ(g[i], grad_value(i, 3) * static_cast<float>(coef)) << "element " << i;
  expect_padding_untouched(s);
}

TEST(Clip, ValidatesTheSegment) {
  Segment s{Tensor::zeros({8}, DType::F32), Tensor::zeros({4}, DType::F32), {{"model.norm.weight", 0, 4, false}}};
  EXPECT_TRUE(contains(error_of([&] { grad_sum_of_squares(s); }), "grad has 4 elements but param has 8"));
  EXPECT_TRUE(contains(error_of([&] { scale_grad(s, 0.5); }), "'model.norm.weight'"));
}

// The CPU kernels split each range into parallel blocks; the update of an
// element does not depend on the block or thread that computed it.
TEST(Optimizers, ResultsDoNotDependOnThreadCount) {
  const int64_t n = 100000;  // several blocks, a partial last one
  const std::vector<ParamRange> ranges = {{"model.embed_tokens.weight", 3, 70000, true},
                                          {"model.norm.weight", 70003, 29990, false}};
  const int saved = st::cpu::cpu_threads();
  for (const OptimConfig& c : {adamw_config(), sgd_config()}) {
    std::vector<std::vector<uint32_t>> results;
    for (int threads : {1, 2, 3}) {
      st::cpu::set_cpu_threads(threads);
      Segment s = make_segment(ranges, n);
      auto opt = make_optimizer(c);
      opt->add_segment(s);
      for (int64_t t = 1; t <= 3; ++t) {
        fill_grad(s, t);
        opt->step(lr_at(c, t));
      }
      std::vector<uint32_t> bits;
      for (float v : s.param.to_floats()) bits.push_back(std::bit_cast<uint32_t>(v));
      for (auto& [name, state] : opt->state(0))
        for (float v : state.to_floats()) bits.push_back(std::bit_cast<uint32_t>(v));
      expect_padding_untouched(s);
      results.push_back(std::move(bits));
    }
    EXPECT_TRUE(results[0] == results[1]) << (c.name == OptimizerKind::AdamW ? "adamw" : "sgd") << ": 1 vs 2 threads";
    EXPECT_TRUE(results[0] == results[2]) << (c.name == OptimizerKind::AdamW ? "adamw" : "sgd") << ": 1 vs 3 threads";
  }
  st::cpu::set_cpu_threads(saved);
}

// The norm's blocks are summed in parallel and added in block order: the same
// double for every thread count, and the clip scales every element alike.
TEST(Clip, NormAndScaleDoNotDependOnThreadCount) {
  const int64_t n = 100000;
  const std::vector<ParamRange> ranges = {{"model.embed_tokens.weight", 3, 70000, true},
                                          {"model.norm.weight", 70003, 29990, false}};
  const int saved = st::cpu::cpu_threads();
  std::vector<double> sums;
  std::vector<std::vector<uint32_t>> scaled;  // bits: the padding is a NaN sentinel
  double expected = 0;
  for (const ParamRange& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) expected += double{grad_value(i, 2)} * grad_value(i, 2);
  for (int threads : {1, 2, 3}) {
    st::cpu::set_cpu_threads(threads);
    Segment s = make_segment(ranges, n);
    fill_grad(s, 2);
    sums.push_back(grad_sum_of_squares(s));
    scale_grad(s, 0.25);
    std::vector<uint32_t> bits;
    for (float v : s.grad.to_floats()) bits.push_back(std::bit_cast<uint32_t>(v));
    scaled.push_back(std::move(bits));
    expect_padding_untouched(s);
  }
  st::cpu::set_cpu_threads(saved);
  EXPECT_NEAR(sums[0], expected, 1e-12 * expected);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], sums[2]);
  EXPECT_TRUE(scaled[0] == scaled[1]);
  EXPECT_TRUE(scaled[0] == scaled[2]);
}

}  // namespace
}  // namespace st::optim
