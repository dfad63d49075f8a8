// The step profile's arithmetic (core/profile.h): the best-of peak with a
// scripted timer, the per-op table (names, calls, merging across steps) and
// the report's exact text, including a rate above the peak. Nothing here
// reads a clock for a value it asserts: times are scripted or hand-made.
// tests/e2e/check_profile.py checks the same report on real runs.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/profile.h"

namespace st::profile {
namespace {

// A timer that answers from a script: the i-th sample takes script[i]
// seconds per repetition. Records the repetitions asked for.
struct ScriptedTimer {
  std::vector<double> per_rep;
  std::vector<int64_t> asked;
  double operator()(int64_t reps) {
    const double t = per_rep.at(asked.size()) * static_cast<double>(reps);
    asked.push_back(reps);
    return t;
  }
};

TEST(ProfilePeak, BestOfSamplesIsTheFastest) {
  // 1e9 FLOPs per rep; the calibration sample (one rep) takes 0.01 s.
  ScriptedTimer timer{{0.01, 0.02, 0.004, 0.05, 0.01}, {}};
  const double rate = best_rate(1e9, 5, 0.1, [&](int64_t reps) { return timer(reps); });
  // Slice 0.1 / 5 = 0.02 s; 0.02 / 0.01 = 2 reps per sample after calibration.
  EXPECT_EQ(timer.asked, (std::vector<int64_t>{1, 2, 2, 2, 2}));
  EXPECT_DOUBLE_EQ(rate, 1e9 / 0.004);
}

TEST(ProfilePeak, ASlowMomentCannotRaiseThePeak) {
  // The same work, one sample slowed by a busy machine: the peak is the
  // quiet samples' rate, not a mean pulled down or an outlier pushed up.
  ScriptedTimer quiet{{0.01, 0.01, 0.01}, {}};
  ScriptedTimer busy{{0.01, 0.08, 0.01}, {}};
  const double a = best_rate(2e9, 3, 0.03, [&](int64_t reps) { return quiet(reps); });
  const double b = best_rate(2e9, 3, 0.03, [&](int64_t reps) { return busy(reps); });
  EXPECT_DOUBLE_EQ(a, 2e11);
  EXPECT_DOUBLE_EQ(b, 2e11);
}

TEST(ProfilePeak, SlowWorkStillTakesEverySampleOnce) {
  // One rep longer than the slice: every sample is one rep; a zero time
  // (a clock too coarse) is ignored rather than read as infinitely fast.
  ScriptedTimer timer{{0.5, 0.0, 0.25}, {}};
  const double rate = best_rate(1e9, 3, 0.03, [&](int64_t reps) { return timer(reps); });
  EXPECT_EQ(timer.asked, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_DOUBLE_EQ(rate, 4e9);
  ScriptedTimer zero{{0.0, 0.0}, {}};
  EXPECT_EQ(best_rate(1e9, 2, 0.03, [&](int64_t reps) { return zero(reps); }), 0.0);
}

// --- the per-op table -------------------------------------------------------------

TEST(ProfileOps, NamesAndCallsPerStep) {
  Profiler p;
  const Profiler::Scope scope(&p);
  p.step_begin(1);
  for (int i = 0; i < 3; ++i) op(Activity::Ops, "rmsnorm forward", 0, [] {});
  op(Activity::Gemm, "gemm", 8, [] { op(Activity::Ops, "cast", 0, [] {}); });
  { const WaitScope wait(WaitKind::Reduce); }
  const StepProfile& s = p.step_end();
  ASSERT_EQ(s.op_times.size(), 3u);
  EXPECT_STREQ(s.op_times[0].name, "rmsnorm forward");
  EXPECT_EQ(s.op_times[0].calls, 3);
  EXPECT_STREQ(s.op_times[1].name, "gemm");
  EXPECT_EQ(s.op_times[1].calls, 1);
  EXPECT_STREQ(s.op_times[2].name, "cast");
  EXPECT_EQ(s.ops, 5);
  EXPECT_EQ(s.gemm_flops, 8);
  // Exclusive times: the named ops never add up to more than the step.
  double sum = 0;
  for (const OpTime& o : s.op_times) sum += o.seconds;
  EXPECT_LE(sum, s.seconds);

  // The next step starts from zero and keeps the names it meets.
  p.step_begin(2);
  op(Activity::Ops, "cast", 0, [] {});
  const StepProfile& t = p.step_end();
  ASSERT_EQ(t.op_times.size(), 1u);
  EXPECT_STREQ(t.op_times[0].name, "cast");
  EXPECT_EQ(t.op_times[0].calls, 1);
}

StepProfile hand_made(int64_t step, double seconds, std::vector<OpTime> ops) {
  StepProfile s;
  s.step = step;
  s.seconds = seconds;
  s.phase[static_cast<size_t>(Phase::Forward)] = seconds;
  s.activity[static_cast<size_t>(Activity::Ops)] = seconds;
  s.op_times = std::move(ops);
  return s;
}

TEST(ProfileOps, MeansMergeByNameAndLeaveOutTheFirstStep) {
  const std::vector<StepProfile> steps = {
      hand_made(1, 9.0, {{"warm-up only", 9.0, 1}}),
      hand_made(2, 1.0, {{"attention forward", 0.25, 2}, {"cast", 0.125, 4}}),
      hand_made(3, 1.0, {{"cast", 0.375, 4}, {"loss", 0.5, 1}}),
  };
  const StepProfile m = mean_profile(steps);
  ASSERT_EQ(m.op_times.size(), 3u);
  EXPECT_STREQ(m.op_times[0].name, "attention forward");
  EXPECT_DOUBLE_EQ(m.op_times[0].seconds, 0.125);
  EXPECT_DOUBLE_EQ(m.op_times[0].calls, 1);
  EXPECT_STREQ(m.op_times[1].name, "cast");
  EXPECT_DOUBLE_EQ(m.op_times[1].seconds, 0.25);
  EXPECT_DOUBLE_EQ(m.op_times[1].calls, 4);
  EXPECT_STREQ(m.op_times[2].name, "loss");
  EXPECT_DOUBLE_EQ(m.op_times[2].seconds, 0.25);

  const std::vector<OpTime> top = top_ops(m.op_times, 2);
  ASSERT_EQ(top.size(), 2u);
  // Longest first; equal times in name order.
  EXPECT_STREQ(top[0].name, "cast");
  EXPECT_STREQ(top[1].name, "loss");
}

TEST(ProfileOps, SummaryListsTheTopOps) {
  std::vector<OpTime> ops;
  const char* names[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  for (int i = 0; i < 10; ++i) ops.push_back({names[i], 0.001 * (i + 1), 2.0});
  const std::string text = format_op_table(hand_made(2, 0.1, ops), 8);
  EXPECT_EQ(text,
            "  top ops (of 10)                   ms       %   calls\n"
            "    j                             10.0   10.0%       2\n"
            "    i                              9.0    9.0%       2\n"
            "    h                              8.0    8.0%       2\n"
            "    g                              7.0    7.0%       2\n"
            "    f                              6.0    6.0%       2\n"
            "    e                              5.0    5.0%       2\n"
            "    d                              4.0    4.0%       2\n"
            "    c                              3.0    3.0%       2\n"
            "    2 more ops                     3.0    3.0%       4\n"
            "    all named ops                 55.0   55.0%      20");
  EXPECT_EQ(format_op_table(hand_made(2, 0.1, {}), 8), "  top ops: none ran on this rank's CPU");
}

// --- the peak in the report ---------------------------------------------------------

StepProfile gemm_step(double gemm_flops, double gemm_seconds) {
  StepProfile s;
  s.step = 3;
  s.seconds = 2 * gemm_seconds;
  s.phase[static_cast<size_t>(Phase::Forward)] = s.seconds;
  s.activity[static_cast<size_t>(Activity::Gemm)] = gemm_seconds;
  s.activity[static_cast<size_t>(Activity::Rest)] = gemm_seconds;
  s.gemm_flops = gemm_flops;
  return s;
}

TEST(ProfilePeakReport, AStepAboveThePeakIsClampedAndSaysWhy) {
  ReportContext ctx;
  ctx.gemm_peak = 100e9;
  ctx.start_peak = 100e9;
  EXPECT_EQ(format_step(gemm_step(50e9, 1.0), ctx),
            "profile step 3: 2.000 s | fwd 100.0% | rest 50.0% gemm 50.0% | GEMM 50.0 GFLOP/s (50% of peak)");
  EXPECT_EQ(format_step(gemm_step(150e9, 1.0), ctx),
            "profile step 3: 2.000 s | fwd 100.0% | rest 50.0% gemm 50.0% | GEMM 150.0 GFLOP/s (100% of peak, "
            "clamped: above the start-up peak 100.0 GFLOP/s, which is re-measured at the end)");
}

TEST(ProfilePeakReport, SummaryNamesTheReMeasuredPeak) {
  ReportContext ctx;
  ctx.peak_note = "1024^3 F32 through ops::gemm";
  ctx.start_peak = 60e9;
  ctx.end_peak = 120e9;
  ctx.gemm_peak = 120e9;
  const std::vector<StepProfile> steps = {gemm_step(1, 1), gemm_step(100e9, 1.0)};
  const std::string text = format_summary(steps, ctx);
  EXPECT_NE(text.find("  GEMM: 1.0000e+11 FLOP per step in 0 ops (all ops), 100.0 GFLOP/s = 83.3% of the measured "
                      "peak 120.0 GFLOP/s (1024^3 F32 through ops::gemm; the higher of start-up 60.0 and end of run "
                      "120.0 GFLOP/s)"),
            std::string::npos)
      << text;
  ctx.end_peak = 80e9;
  ctx.gemm_peak = 80e9;
  ctx.model_flops_step = 250e9;  // over the mean step's 2 s: 125 GFLOP/s, above the peak too
  const std::string clamped = format_summary(steps, ctx);
  EXPECT_NE(clamped.find("100.0 GFLOP/s = 100.0% of the measured peak 80.0 GFLOP/s (1024^3 F32 through ops::gemm; "
                         "the higher of start-up 60.0 and end of run 80.0 GFLOP/s; clamped: the GEMMs ran above "
                         "both measurements)"),
            std::string::npos)
      << clamped;
  EXPECT_NE(clamped.find("  model: 2.5000e+11 FLOP per step on this rank, 125.0 GFLOP/s = 100.0% of the GEMM peak "
                         "(clamped: above the peak measured at start-up and at the end); GEMM FLOPs / model FLOPs = "
                         "0.4000"),
            std::string::npos)
      << clamped;
  // A step line printed after the end-of-run measurement (none is, today) says so too.
  EXPECT_EQ(format_step(gemm_step(100e9, 1.0), ctx),
            "profile step 3: 2.000 s | fwd 100.0% | rest 50.0% gemm 50.0% | GEMM 100.0 GFLOP/s (100% of peak, "
            "clamped: above the peak measured at start-up and at the end), model 125.0 GFLOP/s");
}

}  // namespace
}  // namespace st::profile
