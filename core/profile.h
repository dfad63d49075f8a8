#pragma once
// The step profile: where a training step's time goes, measured on the thread
// that runs the model (the thread that installed the Profiler).
//
// Two views of the same wall time, each exclusive, so each sums to the step:
//   phase:    forward, backward, recompute, grad sync, optimizer, data,
//             checkpoint, eval (validation after the step, its forwards
//             included), other (whatever the step does outside those)
//   activity: GEMM (inside ops::gemm), other ops (every other op's CPU
//             backend), waiting for all-gathers, for reduce-scatters and
//             all-reduces, for other collectives, MPI progress driven at op
//             boundaries, and the rest (framework code between ops)
//   op:       each named op (profile::op's name: "attention backward",
//             "cast", "gemm", ...), and the time outside every op
// Scopes nest: an op inside an op, or a recompute inside backward, takes its
// time out of the enclosing one.
//
// Op boundaries are also where a rank drives its outstanding MPI collectives
// (the "progress" hook, installed by core/comm_mpi.cpp): Open MPI moves a
// non-blocking collective only inside an MPI call, so without it prefetched
// all-gathers and reduce-scatters would idle until their wait().
//
// Cost when neither a profiler nor a progress hook is installed on the
// calling thread: one thread-local load and one branch per op.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace st::profile {

enum class Phase : uint8_t { Other, Forward, Backward, Recompute, GradSync, Optimizer, Data, Checkpoint, Eval, Count };
enum class Activity : uint8_t { Rest, Gemm, Ops, WaitGather, WaitReduce, WaitOther, Progress, Count };

/// The activity a collective's wait is charged to.
enum class WaitKind : uint8_t { Gather, Reduce, Other };

constexpr size_t kPhases = static_cast<size_t>(Phase::Count);
constexpr size_t kActivities = static_cast<size_t>(Activity::Count);

const char* phase_name(Phase p);
const char* activity_name(Activity a);

/// One named op's exclusive time in a step: its nested ops' and collective
/// waits' time is left out, so the named ops of a step never add up to more
/// than the step.
struct OpTime {
  const char* name = "";  // the name given to profile::op (a string literal)
  double seconds = 0;
  double calls = 0;  // a mean in mean_profile, so not an integer there
};

/// One step's figures: seconds per phase and per activity (each array sums to
/// `seconds`), GEMM FLOPs (2*m*n*k per ops::gemm), the op count, the payload
/// bytes this rank sent in collectives over groups that span hosts
/// (ProcessGroup::cross_host_bytes; the caller adds them) and the named ops
/// that ran, in the order the profiler first met them.
struct StepProfile {
  int64_t step = 0;  // 1-based
  double seconds = 0;
  std::array<double, kPhases> phase{};
  std::array<double, kActivities> activity{};
  double gemm_flops = 0;
  int64_t ops = 0;
  double cross_host_bytes = 0;
  std::vector<OpTime> op_times;
};

/// An exclusive-time stack: the innermost open scope is charged until it
/// closes. Fixed depth, no allocation.
class TimeStack {
 public:
  using Clock = std::chrono::steady_clock;
  void reset(Clock::time_point now, double* buckets);
  void enter(size_t bucket, Clock::time_point now);
  void leave(Clock::time_point now);
  /// Charges the time since the last change to the innermost scope.
  void flush(Clock::time_point now);

 private:
  static constexpr size_t kDepth = 32;
  double* buckets_ = nullptr;
  std::array<uint8_t, kDepth> stack_{};
  size_t depth_ = 1;     // stack_[0] is the bottom bucket (Other / Rest)
  size_t overflow_ = 0;  // scopes deeper than kDepth, charged to the innermost kept one
  Clock::time_point since_{};
};

/// Collects StepProfiles on the thread that created it. Install it with
/// Scope; only one profiler per thread.
class Profiler {
 public:
  using Clock = TimeStack::Clock;

  void step_begin(int64_t step);
  /// Closes the step and keeps its figures (also returned).
  const StepProfile& step_end();
  const std::vector<StepProfile>& steps() const { return steps_; }

  void phase_enter(Phase p) { phases_.enter(static_cast<size_t>(p), Clock::now()); }
  void phase_leave() { phases_.leave(Clock::now()); }
  void activity_enter(Activity a) { activities_.enter(static_cast<size_t>(a), Clock::now()); }
  void activity_leave() { activities_.leave(Clock::now()); }
  /// Opens and closes a named op (profile::op) or a collective wait, which
  /// belongs to no op (`name` nullptr). `name` must outlive the profiler.
  void op_enter(const char* name);
  void op_leave() { op_stack_.leave(Clock::now()); }
  /// Moves up to `seconds` of this step's time from phase `from` to `to`
  /// (a recomputation measured by its forward twin, core/profile.h's caller).
  void move_phase_time(Phase from, Phase to, double seconds);
  void add_gemm_flops(double flops) { current_.gemm_flops += flops; }
  void count_op() { ++current_.ops; }
  void add_cross_host_bytes(int64_t bytes) { current_.cross_host_bytes += static_cast<double>(bytes); }

  /// Makes this profiler the calling thread's (RAII; restores the previous).
  class Scope {
   public:
    explicit Scope(Profiler* profiler);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler* previous_;
  };

 private:
  StepProfile current_;
  Clock::time_point step_start_{};
  TimeStack phases_;
  TimeStack activities_;
  std::vector<StepProfile> steps_;
  // The named ops: slot 0 is "in no op"; names beyond the last slot share it.
  static constexpr size_t kOpSlots = 64;
  TimeStack op_stack_;
  std::array<double, kOpSlots> op_seconds_{};
  std::array<int64_t, kOpSlots> op_calls_{};
  std::array<const char*, kOpSlots> op_names_{};
  size_t op_slots_used_ = 1;
};

/// A function that advances outstanding collectives without blocking.
using ProgressFn = void (*)();

namespace detail {
/// What the calling thread's op boundaries report to.
struct ThreadHooks {
  bool active = false;  // profiler || progress: the one branch an op pays
  Profiler* profiler = nullptr;
  ProgressFn progress = nullptr;
};
inline thread_local ThreadHooks t_hooks;
void op_slow(Activity kind, const char* name, double flops, void (*body)(void*), void* ctx);
}  // namespace detail

/// The calling thread's profiler, or nullptr.
inline Profiler* current() { return detail::t_hooks.profiler; }

/// Installs `fn` as the calling thread's progress hook (nullptr removes it).
void set_progress_hook(ProgressFn fn);

/// Runs one op's backend call: timed as `kind` (with `flops` for a GEMM) and
/// under `name` (a string literal: the summary's top-ops rows), and preceded
/// by the progress hook when either is installed on this thread.
template <class F>
inline void op(Activity kind, const char* name, double flops, F&& body) {
  if (detail::t_hooks.active) [[unlikely]] {
    detail::op_slow(
        kind, name, flops, [](void* f) { (*static_cast<std::remove_reference_t<F>*>(f))(); }, &body);
    return;
  }
  body();
}

/// Charges the enclosing block to a phase of the calling thread's profiler
/// (nothing without one).
class PhaseScope {
 public:
  explicit PhaseScope(Phase p) : profiler_(current()) {
    if (profiler_) profiler_->phase_enter(p);
  }
  ~PhaseScope() {
    if (profiler_) profiler_->phase_leave();
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Profiler* profiler_;
};

/// Charges a blocking collective wait to the calling thread's profiler.
class WaitScope {
 public:
  explicit WaitScope(WaitKind kind);
  ~WaitScope() {
    if (!profiler_) return;
    profiler_->op_leave();
    profiler_->activity_leave();
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  Profiler* profiler_;
};

/// The best of `samples` short measurements of a rate, in `work` units per
/// second: `time_reps(reps)` does `work` `reps` times and returns the seconds
/// that took. The first sample (one rep) sizes the others to about
/// `seconds / samples` each. A busy moment can only slow a sample, so the
/// fastest one is the least disturbed; a time <= 0 (a clock too coarse) is
/// skipped. 0 when no sample had a time.
double best_rate(double work, int samples, double seconds, const std::function<double(int64_t reps)>& time_reps);

/// Large-GEMM throughput of this thread pool in `dtype` on `device`, FLOP/s:
/// n x n x n products through ops::gemm after one warm-up, the best of
/// `samples` runs within about `seconds` (best_rate). Not profiled: the
/// calling thread's profiler is set aside while it runs.
double measure_gemm_peak(DType dtype, Device device, int64_t n = 1024, double seconds = 0.3, int samples = 5);

/// Per-step figures after the first (which includes warm-up): the mean of each
/// field over those steps; all steps when there is only one. Means, not
/// medians, so that the parts of the summary add up to its step exactly (the
/// medians of the parts of noisy steps need not add up to anything).
StepProfile mean_profile(const std::vector<StepProfile>& steps);

/// What a report needs besides the measurements.
struct ReportContext {
  double gemm_peak = 0;         // FLOP/s compared against: the higher of the two below; 0 when not measured
  double start_peak = 0;        // FLOP/s measured at start-up
  double end_peak = 0;          // FLOP/s re-measured at the end of the run; 0 until then
  std::string peak_note;        // "1024^3 F32 through ops::gemm"
  double model_flops_step = 0;  // model FLOPs of this rank's tokens in one step
  int rank = 0;
  bool across_hosts = false;  // the job spans hosts: report cross_host_bytes
};

/// The `n` longest ops, longest first (equal times in name order).
std::vector<OpTime> top_ops(std::vector<OpTime> ops, size_t n);

/// One line per logged step: "profile step 3: 1.234 s | phase ... | activity ... | GEMM ... GFLOP/s",
/// ending "| across hosts 97,328 B" when ctx.across_hosts. A share of the
/// peak is never above 100%: a rate above it prints 100%, marked as clamped
/// and why (the peak is re-measured at the end of the run).
std::string format_step(const StepProfile& s, const ReportContext& ctx);
/// The top-ops rows of the summary for a (mean) step: the `n` longest named
/// ops with ms per step, % of the step and calls, then the rest and the total.
std::string format_op_table(const StepProfile& mean, size_t n);
/// The end-of-run table (several lines, no trailing newline), with the top 8
/// ops; shares of the peak as in format_step.
std::string format_summary(const std::vector<StepProfile>& steps, const ReportContext& ctx);

}  // namespace st::profile
