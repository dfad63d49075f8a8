// The step profile's bookkeeping and its report (core/profile.h).
#include "core/profile.h"

#include <algorithm>
#include <cmath>

#include "core/format.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace st::profile {

namespace {

double seconds_between(TimeStack::Clock::time_point a, TimeStack::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

// Short labels for the one-line step report.
constexpr std::array<const char*, kPhases> kPhaseShort = {"other", "fwd",  "bwd",  "recomp", "sync",
                                                          "optim", "data", "ckpt", "eval"};
constexpr std::array<const char*, kActivities> kActivityShort = {"rest",    "gemm",       "ops",     "wait-ag",
                                                                 "wait-rs", "wait-other", "progress"};

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Other: return "other";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Recompute: return "recompute";
    case Phase::GradSync: return "grad sync";
    case Phase::Optimizer: return "optimizer";
    case Phase::Data: return "data";
    case Phase::Checkpoint: return "checkpoint";
    case Phase::Eval: return "eval";
    case Phase::Count: break;
  }
  return "?";
}

const char* activity_name(Activity a) {
  switch (a) {
    case Activity::Rest: return "rest";
    case Activity::Gemm: return "GEMM";
    case Activity::Ops: return "other ops";
    case Activity::WaitGather: return "wait all-gather";
    case Activity::WaitReduce: return "wait reduce";
    case Activity::WaitOther: return "wait other comm";
    case Activity::Progress: return "MPI progress";
    case Activity::Count: break;
  }
  return "?";
}

// --- TimeStack ------------------------------------------------------------------

void TimeStack::reset(Clock::time_point now, double* buckets) {
  buckets_ = buckets;
  since_ = now;
  // Scopes open across the step boundary (none in the trainer) keep running.
}

void TimeStack::flush(Clock::time_point now) {
  if (buckets_) buckets_[stack_[depth_ - 1]] += seconds_between(since_, now);
  since_ = now;
}

void TimeStack::enter(size_t bucket, Clock::time_point now) {
  flush(now);
  if (depth_ == kDepth) {
    ++overflow_;
    return;
  }
  stack_[depth_++] = static_cast<uint8_t>(bucket);
}

void TimeStack::leave(Clock::time_point now) {
  flush(now);
  if (overflow_ > 0) {
    --overflow_;
  } else if (depth_ > 1) {
    --depth_;
  }
}

// --- Profiler ---------------------------------------------------------------------

void Profiler::step_begin(int64_t step) {
  current_ = StepProfile{};
  current_.step = step;
  step_start_ = Clock::now();
  phases_.reset(step_start_, current_.phase.data());
  activities_.reset(step_start_, current_.activity.data());
}

const StepProfile& Profiler::step_end() {
  const Clock::time_point now = Clock::now();
  phases_.flush(now);
  activities_.flush(now);
  current_.seconds = seconds_between(step_start_, now);
  if (steps_.capacity() == steps_.size()) steps_.reserve(std::max<size_t>(64, 2 * steps_.size()));
  steps_.push_back(current_);
  return steps_.back();
}

void Profiler::move_phase_time(Phase from, Phase to, double seconds) {
  // Bring `from` up to date first: the time since the last change is still uncharged.
  phases_.flush(Clock::now());
  double& a = current_.phase[static_cast<size_t>(from)];
  const double moved = std::clamp(seconds, 0.0, a);
  a -= moved;
  current_.phase[static_cast<size_t>(to)] += moved;
}

Profiler::Scope::Scope(Profiler* profiler) : previous_(detail::t_hooks.profiler) {
  detail::t_hooks.profiler = profiler;
  detail::t_hooks.active = profiler != nullptr || detail::t_hooks.progress != nullptr;
}

Profiler::Scope::~Scope() {
  detail::t_hooks.profiler = previous_;
  detail::t_hooks.active = previous_ != nullptr || detail::t_hooks.progress != nullptr;
}

void set_progress_hook(ProgressFn fn) {
  detail::t_hooks.progress = fn;
  detail::t_hooks.active = fn != nullptr || detail::t_hooks.profiler != nullptr;
}

void detail::op_slow(Activity kind, double flops, void (*body)(void*), void* ctx) {
  Profiler* p = t_hooks.profiler;
  if (t_hooks.progress) {
    if (p) p->activity_enter(Activity::Progress);
    t_hooks.progress();
    if (p) p->activity_leave();
  }
  if (!p) {
    body(ctx);
    return;
  }
  p->activity_enter(kind);
  // The profile is diagnostics: an op that throws still closes its scope.
  struct Leave {
    Profiler* p;
    ~Leave() { p->activity_leave(); }
  } leave{p};
  p->count_op();
  if (kind == Activity::Gemm) p->add_gemm_flops(flops);
  body(ctx);
}

WaitScope::WaitScope(WaitKind kind) : profiler_(current()) {
  if (!profiler_) return;
  const Activity a = kind == WaitKind::Gather   ? Activity::WaitGather
                     : kind == WaitKind::Reduce ? Activity::WaitReduce
                                                : Activity::WaitOther;
  profiler_->activity_enter(a);
}

// --- peak and report ------------------------------------------------------------

double measure_gemm_peak(DType dtype, Device device, int64_t n, double seconds) {
  Tensor a = Tensor::full({n, n}, 0.5, dtype, device);
  Tensor b = Tensor::full({n, n}, 0.25, dtype, device);
  Tensor c = Tensor::empty({n, n}, dtype, device);
  ops::gemm(a, ops::Transpose::No, b, ops::Transpose::No, c);  // warm-up: primitive creation, page faults
  const auto t0 = TimeStack::Clock::now();
  int64_t reps = 0;
  double elapsed = 0;
  do {
    ops::gemm(a, ops::Transpose::No, b, ops::Transpose::No, c);
    ++reps;
    elapsed = seconds_between(t0, TimeStack::Clock::now());
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(reps) /
         elapsed;
}

StepProfile mean_profile(const std::vector<StepProfile>& steps) {
  StepProfile m;
  if (steps.empty()) return m;
  const size_t first = steps.size() > 1 ? 1 : 0;
  const auto count = static_cast<double>(steps.size() - first);
  auto mean = [&](auto field) {
    double sum = 0.0;
    for (size_t i = first; i < steps.size(); ++i) sum += field(steps[i]);
    return sum / count;
  };
  m.step = steps.back().step;
  m.seconds = mean([](const StepProfile& s) { return s.seconds; });
  for (size_t i = 0; i < kPhases; ++i) m.phase[i] = mean([i](const StepProfile& s) { return s.phase[i]; });
  for (size_t i = 0; i < kActivities; ++i) m.activity[i] = mean([i](const StepProfile& s) { return s.activity[i]; });
  m.gemm_flops = mean([](const StepProfile& s) { return s.gemm_flops; });
  m.ops = static_cast<int64_t>(std::llround(mean([](const StepProfile& s) { return static_cast<double>(s.ops); })));
  m.cross_host_bytes = mean([](const StepProfile& s) { return s.cross_host_bytes; });
  return m;
}

std::string format_step(const StepProfile& s, const ReportContext& ctx) {
  std::string line = format("profile step {}: {:.3f} s |", s.step, s.seconds);
  for (size_t i = 0; i < kPhases; ++i) {
    if (s.phase[i] > 0) line += format(" {} {:.1f}%", kPhaseShort[i], percent(s.phase[i], s.seconds));
  }
  line += " |";
  for (size_t i = 0; i < kActivities; ++i) {
    if (s.activity[i] > 0) line += format(" {} {:.1f}%", kActivityShort[i], percent(s.activity[i], s.seconds));
  }
  const double gemm_s = s.activity[static_cast<size_t>(Activity::Gemm)];
  const double gemm_rate = gemm_s > 0 ? s.gemm_flops / gemm_s : 0.0;
  line += format(" | GEMM {:.1f} GFLOP/s", gemm_rate / 1e9);
  if (ctx.gemm_peak > 0) line += format(" ({:.0f}% of peak)", percent(gemm_rate, ctx.gemm_peak));
  if (ctx.model_flops_step > 0 && s.seconds > 0)
    line += format(", model {:.1f} GFLOP/s", ctx.model_flops_step / s.seconds / 1e9);
  if (ctx.across_hosts) line += format(" | across hosts {} B", with_commas(std::llround(s.cross_host_bytes)));
  return line;
}

std::string format_summary(const std::vector<StepProfile>& steps, const ReportContext& ctx) {
  const StepProfile m = mean_profile(steps);
  const size_t used = steps.size() > 1 ? steps.size() - 1 : steps.size();
  const double ms = 1e3;
  std::string out = format("profile summary (rank {}; means over {} step(s){}; ms per step):\n", ctx.rank, used,
                           steps.size() > 1 ? ", the first left out" : "");
  out += format("  {:<12} {:>9} {:>7}    {:<17} {:>9} {:>7}\n", "phase", "ms", "%", "activity", "ms", "%");
  const size_t rows = std::max(kPhases, kActivities);
  for (size_t i = 0; i < rows; ++i) {
    std::string left = i < kPhases ? format("  {:<12} {:>9.1f} {:>6.1f}%", phase_name(static_cast<Phase>(i)),
                                            m.phase[i] * ms, percent(m.phase[i], m.seconds))
                                   : format("  {:<12} {:>9} {:>7}", "", "", "");
    std::string right = i < kActivities
                            ? format("    {:<17} {:>9.1f} {:>6.1f}%", activity_name(static_cast<Activity>(i)),
                                     m.activity[i] * ms, percent(m.activity[i], m.seconds))
                            : std::string();
    out += left + right + "\n";
  }
  out += format("  {:<12} {:>9.1f} {:>6.1f}%    {:<17} {:>9.1f} {:>6.1f}%\n", "step", m.seconds * ms, 100.0, "step",
                m.seconds * ms, 100.0);
  const double gemm_s = m.activity[static_cast<size_t>(Activity::Gemm)];
  const double gemm_rate = gemm_s > 0 ? m.gemm_flops / gemm_s : 0.0;
  out +=
      format("  GEMM: {:.4e} FLOP per step in {} ops (all ops), {:.1f} GFLOP/s", m.gemm_flops, m.ops, gemm_rate / 1e9);
  if (ctx.gemm_peak > 0)
    out += format(" = {:.1f}% of the measured peak {:.1f} GFLOP/s ({})", percent(gemm_rate, ctx.gemm_peak),
                  ctx.gemm_peak / 1e9, ctx.peak_note);
  if (ctx.model_flops_step > 0) {
    const double model_rate = m.seconds > 0 ? ctx.model_flops_step / m.seconds : 0.0;
    out +=
        format("\n  model: {:.4e} FLOP per step on this rank, {:.1f} GFLOP/s", ctx.model_flops_step, model_rate / 1e9);
    if (ctx.gemm_peak > 0) out += format(" = {:.1f}% of the GEMM peak", percent(model_rate, ctx.gemm_peak));
    out += format("; GEMM FLOPs / model FLOPs = {:.4f}", m.gemm_flops / ctx.model_flops_step);
  }
  if (ctx.across_hosts) {
    out += format(
        "\n  across hosts: {:.2f} MB per step per rank ({} bytes; collectives over groups that span hosts: payload)",
        m.cross_host_bytes / 1e6, with_commas(std::llround(m.cross_host_bytes)));
  }
  return out;
}

}  // namespace st::profile
