// The step profile's bookkeeping and its report (core/profile.h).
#include "core/profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/format.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace st::profile {

namespace {

double seconds_between(TimeStack::Clock::time_point a, TimeStack::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

// Rows of the summary's top-ops table.
constexpr size_t kTopOps = 8;

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
  op_seconds_.fill(0.0);
  op_calls_.fill(0);
  op_stack_.reset(step_start_, op_seconds_.data());
}

void Profiler::op_enter(const char* name) {
  size_t slot = 0;
  if (name != nullptr) {
    slot = 1;
    // Pointers first: the same literal is usually one object.
    while (slot < op_slots_used_ && op_names_[slot] != name && std::strcmp(op_names_[slot], name) != 0) ++slot;
    if (slot == op_slots_used_) {
      if (op_slots_used_ < kOpSlots - 1) {
        op_names_[op_slots_used_++] = name;
      } else {
        slot = kOpSlots - 1;  // a table this long is a bug in the names, not in the profile
        op_names_[slot] = "ops past the 62nd name";
        op_slots_used_ = kOpSlots;
      }
    }
    ++op_calls_[slot];
  }
  op_stack_.enter(slot, Clock::now());
}

const StepProfile& Profiler::step_end() {
  const Clock::time_point now = Clock::now();
  phases_.flush(now);
  activities_.flush(now);
  op_stack_.flush(now);
  current_.seconds = seconds_between(step_start_, now);
  for (size_t i = 1; i < op_slots_used_; ++i) {
    if (op_calls_[i] > 0 || op_seconds_[i] > 0)
      current_.op_times.push_back({op_names_[i], op_seconds_[i], static_cast<double>(op_calls_[i])});
  }
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

void detail::op_slow(Activity kind, const char* name, double flops, void (*body)(void*), void* ctx) {
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
  p->op_enter(name);
  // The profile is diagnostics: an op that throws still closes its scopes.
  struct Leave {
    Profiler* p;
    ~Leave() {
      p->op_leave();
      p->activity_leave();
    }
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
  profiler_->op_enter(nullptr);  // a wait inside an op is not the op's time
}

// --- peak and report ------------------------------------------------------------

double best_rate(double work, int samples, double seconds, const std::function<double(int64_t reps)>& time_reps) {
  double best = 0;
  auto sample = [&](int64_t reps) {
    const double t = time_reps(reps);
    if (t > 0) best = std::max(best, work * static_cast<double>(reps) / t);
    return t;
  };
  const double first = sample(1);
  const double slice = seconds / std::max(samples, 1);
  const int64_t reps = first > 0 ? std::max<int64_t>(1, static_cast<int64_t>(slice / first)) : 1;
  for (int i = 1; i < samples; ++i) sample(reps);
  return best;
}

double measure_gemm_peak(DType dtype, Device device, int64_t n, double seconds, int samples) {
  const Profiler::Scope unprofiled(nullptr);
  Tensor a = Tensor::full({n, n}, 0.5, dtype, device);
  Tensor b = Tensor::full({n, n}, 0.25, dtype, device);
  Tensor c = Tensor::empty({n, n}, dtype, device);
  ops::gemm(a, ops::Transpose::No, b, ops::Transpose::No, c);  // warm-up: primitive creation, page faults
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return best_rate(flops, samples, seconds, [&](int64_t reps) {
    const auto t0 = TimeStack::Clock::now();
    for (int64_t i = 0; i < reps; ++i) ops::gemm(a, ops::Transpose::No, b, ops::Transpose::No, c);
    return seconds_between(t0, TimeStack::Clock::now());
  });
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
  for (size_t i = first; i < steps.size(); ++i) {
    for (const OpTime& o : steps[i].op_times) {
      auto same = [&](const OpTime& x) { return std::strcmp(x.name, o.name) == 0; };
      auto it = std::find_if(m.op_times.begin(), m.op_times.end(), same);
      if (it == m.op_times.end()) it = m.op_times.insert(it, OpTime{o.name, 0.0, 0.0});
      it->seconds += o.seconds;
      it->calls += o.calls;
    }
  }
  for (OpTime& o : m.op_times) {
    o.seconds /= count;
    o.calls /= count;
  }
  return m;
}

std::vector<OpTime> top_ops(std::vector<OpTime> ops, size_t n) {
  std::sort(ops.begin(), ops.end(), [](const OpTime& a, const OpTime& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : std::strcmp(a.name, b.name) < 0;
  });
  if (ops.size() > n) ops.resize(n);
  return ops;
}

namespace {

// Why a share of the peak was clamped to 100%.
std::string clamp_reason(const ReportContext& ctx) {
  if (ctx.end_peak > 0) return "above the peak measured at start-up and at the end";
  return format("above the start-up peak {:.1f} GFLOP/s, which is re-measured at the end", ctx.start_peak / 1e9);
}

// " (37% of peak)", or 100% with the reason when `rate` beats the peak.
std::string step_peak_share(double rate, const ReportContext& ctx) {
  if (rate <= ctx.gemm_peak) return format(" ({:.0f}% of peak)", percent(rate, ctx.gemm_peak));
  return format(" (100% of peak, clamped: {})", clamp_reason(ctx));
}

// " = 61.2% of the measured peak ... (how it was measured)" for the summary.
std::string summary_peak_share(double rate, const ReportContext& ctx) {
  std::string note = ctx.peak_note;
  if (ctx.end_peak > 0)
    note += format("; the higher of start-up {:.1f} and end of run {:.1f} GFLOP/s", ctx.start_peak / 1e9,
                   ctx.end_peak / 1e9);
  if (rate > ctx.gemm_peak)
    note += ctx.end_peak > 0 ? "; clamped: the GEMMs ran above both measurements"
                             : "; clamped: the GEMMs ran above the start-up measurement, and it was not re-measured";
  return format(" = {:.1f}% of the measured peak {:.1f} GFLOP/s ({})", std::min(percent(rate, ctx.gemm_peak), 100.0),
                ctx.gemm_peak / 1e9, note);
}

}  // namespace

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
  if (ctx.gemm_peak > 0) line += step_peak_share(gemm_rate, ctx);
  if (ctx.model_flops_step > 0 && s.seconds > 0)
    line += format(", model {:.1f} GFLOP/s", ctx.model_flops_step / s.seconds / 1e9);
  if (ctx.across_hosts) line += format(" | across hosts {} B", with_commas(std::llround(s.cross_host_bytes)));
  return line;
}

std::string format_op_table(const StepProfile& mean, size_t n) {
  if (mean.op_times.empty()) return "  top ops: none ran on this rank's CPU";
  const std::vector<OpTime> all = top_ops(mean.op_times, mean.op_times.size());
  const double ms = 1e3;
  auto row = [&](const std::string& name, double seconds, double calls) {
    return format("\n    {:<24} {:>9.1f} {:>6.1f}% {:>7}", name, seconds * ms, percent(seconds, mean.seconds),
                  std::llround(calls));
  };
  std::string out = format("  {:<26} {:>9} {:>7} {:>7}", format("top ops (of {})", all.size()), "ms", "%", "calls");
  OpTime rest{}, total{};
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < n) {
      out += row(all[i].name, all[i].seconds, all[i].calls);
    } else {
      rest.seconds += all[i].seconds;
      rest.calls += all[i].calls;
    }
    total.seconds += all[i].seconds;
    total.calls += all[i].calls;
  }
  if (all.size() > n) out += row(format("{} more ops", all.size() - n), rest.seconds, rest.calls);
  out += row("all named ops", total.seconds, total.calls);
  return out;
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
  out += format_op_table(m, kTopOps) + "\n";
  const double gemm_s = m.activity[static_cast<size_t>(Activity::Gemm)];
  const double gemm_rate = gemm_s > 0 ? m.gemm_flops / gemm_s : 0.0;
  out +=
      format("  GEMM: {:.4e} FLOP per step in {} ops (all ops), {:.1f} GFLOP/s", m.gemm_flops, m.ops, gemm_rate / 1e9);
  if (ctx.gemm_peak > 0) out += summary_peak_share(gemm_rate, ctx);
  if (ctx.model_flops_step > 0) {
    const double model_rate = m.seconds > 0 ? ctx.model_flops_step / m.seconds : 0.0;
    out +=
        format("\n  model: {:.4e} FLOP per step on this rank, {:.1f} GFLOP/s", ctx.model_flops_step, model_rate / 1e9);
    if (ctx.gemm_peak > 0) {
      out += model_rate <= ctx.gemm_peak ? format(" = {:.1f}% of the GEMM peak", percent(model_rate, ctx.gemm_peak))
                                         : format(" = 100.0% of the GEMM peak (clamped: {})", clamp_reason(ctx));
    }
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
