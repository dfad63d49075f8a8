#include "launch/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/cpu/parallel.h"
#include "core/cuda/cuda_runtime.h"
#include "core/file.h"
#include "core/format.h"
#include "core/ops.h"
#include "core/profile.h"
#include "core/watchdog.h"
#include "dataset/dataset.h"
#include "fsdp/fsdp.h"
#include "launch/eval.h"
#include "launch/memory_plan.h"
#include "launch/save_resume.h"
#include "metrics/flops.h"
#include "metrics/metrics.h"
#include "metrics/plot_svg.h"
#include "models/generate.h"
#include "models/model.h"
#include "optim/optimizer.h"

namespace st::launch {

namespace {

using Clock = std::chrono::steady_clock;

// The signals that ask a run to stop, save and exit 0: SIGTERM (schedulers,
// `kill`), SIGINT (Ctrl-C), SIGHUP (a closed terminal) and SIGUSR1 (what
// scripts/launch forwards through mpirun at once, and what Slurm's --signal
// is usually set to). A second SIGINT ends the process at once, as a user
// pressing Ctrl-C twice expects; the last committed checkpoint stays intact.
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};

// The signal number that asked to stop, 0 while none has. A signal handler
// can only reach a global.
std::atomic<int> g_stop_signal{0};
// Set when StopSignals' waiting thread is to end.
std::atomic<bool> g_stop_waiter_quit{false};
extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_stop_signal.load() == SIGINT) ::_exit(130);
  g_stop_signal.store(sig);
}

// scripts/launch turns the SIGTERM, SIGINT, SIGHUP or SIGUSR1 it gets into
// SIGUSR1, the one signal mpirun passes on at once, and first writes the
// name of the one it got ("SIGTERM") to $ST_LAUNCH_SIGNAL_FILE, which
// scripts/launch-rank sets on the launcher's host. A stop so relayed counts
// as kRelayed + the original's number: above any signal a rank got directly
// in the ranks' Max agreement, so one rank that can read the file names the
// signal for all of them.
constexpr int kRelayed = 64;

// The CPU's GEMM peak: the best of this many short runs; with --profile of
// 1024^3 products for 0.3 s, at start-up and again at the end of the run.
constexpr int kPeakSamples = 5;
constexpr int64_t kProfilePeakN = 1024;
constexpr double kProfilePeakSeconds = 0.3;

std::string_view signal_name(int sig) {
  if (sig > kRelayed) sig -= kRelayed;
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
  }
  return "a signal";
}

// The signal the launcher relayed as SIGUSR1, 0 when it named none.
int relayed_signal() {
  const char* path = std::getenv("ST_LAUNCH_SIGNAL_FILE");
  if (path == nullptr || *path == '\0') return 0;
  std::ifstream in(path);
  std::string name;
  in >> name;
  for (int sig : kStopSignals)
    if (name == signal_name(sig)) return sig;
  return 0;
}

// This rank's stop request for the ranks' agreement: the signal it got (a
// relayed one as above), 0 for none.
int stop_request() {
  const int sig = g_stop_signal.load();
  if (sig != SIGUSR1) return sig;
  const int original = relayed_signal();
  return original != 0 ? kRelayed + original : sig;
}

// The largest stop signal any rank got, 0 for none (collective: every rank
// calls it at the same boundary, so all stop together).
int stop_agreed(ProcessGroup& world) {
  Tensor flag = Tensor::from_vector(std::vector<int32_t>{stop_request()}, {1});
  world.all_reduce(flag, {.op = ReduceOp::Max}).wait();
  return flag.data<int32_t>()[0];
}
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Shape batch_shape(int64_t batch, const Shape& sample) {
  Shape s{batch};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

// Elements of the global batch that take part in the loss, so every rank
// scales its gradients by the same 1/count and the all_reduce SUM yields the
// global mean gradient whatever the world size.
int64_t global_loss_count(models::LossKind kind, const std::vector<Tensor>& targets, ProcessGroup& world) {
  int64_t local = 0;
  for (const Tensor& t : targets) {
    if (kind == models::LossKind::Mse) {
      local += t.numel();
    } else {
      for (int32_t v : t.span<int32_t>()) local += v != dataset::kIgnoreIndex;
    }
  }
  ST_CHECK(local < (int64_t{1} << 31), "a rank's batch has {} loss elements; at most 2^31 are supported", local);
  Tensor count = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(local)}, {1});
  world.all_reduce(count).wait();
  return count.data<int32_t>()[0];
}

void log_config(const Config& config, Logger& log) {
  if (log.rank() != 0 || log.level() > LogLevel::Debug) return;
  std::istringstream yaml(to_yaml(config));
  log.debug("resolved configuration (also: trainer --print-config):");
  for (std::string line; std::getline(yaml, line);) log.debug("  {}", line);
}

// The group the sharded model communicates over: NCCL between GPUs when
// this build has it, there is anyone to talk to and every rank of this host
// has a GPU of its own (NCCL refuses two ranks on one GPU); otherwise the
// world group itself (MPI stages device tensors through host memory, which
// lets tests run several ranks on one GPU; one process needs no communication).
std::unique_ptr<ProcessGroup> device_group(ProcessGroup& world, DeviceKind kind, Device device, int local_size) {
  // train.device is the same on every rank, so a CPU run decides without a collective.
  if (world.size() == 1 || !nccl_available() || kind == DeviceKind::Cpu) return nullptr;
  const bool own_gpu = device.is_cuda() && local_size <= cuda::device_count();
  // make_nccl_group is collective over the world, so every rank must take the
  // same branch; own_gpu is a per-host fact (device count, train.device:
  // auto on a host without GPUs), so the ranks agree on it first: NCCL only
  // when every rank can use it, else a rank that skipped it would leave the
  // others hanging in the group's creation.
  Tensor cannot = Tensor::from_vector(std::vector<int32_t>{own_gpu ? 0 : 1}, {1});
  world.all_reduce(cannot, {.op = ReduceOp::Max}).wait();
  if (cannot.data<int32_t>()[0] != 0) return nullptr;
  return make_nccl_group(world, device.index);
}

// --profile (logging.profile): a profiler on this thread (the one that runs
// the model), a line per logged step and the table at the end, against the
// CPU's GEMM peak the trainer measured (Trainer::measure_cpu_peak). When the job
// spans hosts and the model talks over the world's MPI groups, each step also
// reports the bytes this rank sent in collectives over groups that span hosts.
class RunProfile {
 public:
  RunProfile(const Config& config, ProcessGroup& world, const ProcessGroup& fsdp_group, double cpu_peak,
             std::string peak_note, double model_flops_per_step, Logger& log)
      : log_(log), world_(world) {
    if (!config.logging.profile) return;
    ctx_.rank = world.rank();
    ctx_.model_flops_step = model_flops_per_step;
    ctx_.across_hosts = world.spans_hosts() && &fsdp_group == &world;
    if (world.spans_hosts() && !ctx_.across_hosts)
      log.info0("profile: bytes across hosts not counted (the model's collectives run on {})",
                fsdp_group.backend_name());
    if (cpu_peak > 0) {
      ctx_.gemm_peak = cpu_peak;
      ctx_.start_peak = cpu_peak;
      ctx_.peak_note = std::move(peak_note);
      log.info0("profile: GEMM peak {:.1f} GFLOP/s per rank ({}, {}); model {:.4e} FLOP per step per rank",
                ctx_.gemm_peak / 1e9, ctx_.peak_note, cpu::gemm_backend(), model_flops_per_step);
    }
    profiler_ = std::make_unique<profile::Profiler>();
    scope_ = std::make_unique<profile::Profiler::Scope>(profiler_.get());
  }

  void begin(int64_t step) {
    if (!profiler_) return;
    profiler_->step_begin(step);
    sent_before_ = world_.cross_host_bytes();
  }
  void end(bool print) {
    if (!profiler_) return;
    profiler_->add_cross_host_bytes(world_.cross_host_bytes() - sent_before_);
    const profile::StepProfile& s = profiler_->step_end();
    if (print) log_.info0("{}", profile::format_step(s, ctx_));
  }
  // The peak measured again at the end: the report compares against the higher.
  void set_end_peak(double peak) {
    if (!profiler_) return;
    ctx_.end_peak = peak;
    ctx_.gemm_peak = std::max(ctx_.start_peak, peak);
    log_.info0(
        "profile: GEMM peak re-measured at the end of the run: {:.1f} GFLOP/s per rank (start-up {:.1f}); the "
        "summary compares against the higher",
        peak / 1e9, ctx_.start_peak / 1e9);
  }
  void summary() const {
    if (!profiler_ || profiler_->steps().empty()) return;
    std::istringstream table(profile::format_summary(profiler_->steps(), ctx_));
    for (std::string line; std::getline(table, line);) log_.info0("{}", line);
  }

 private:
  Logger& log_;
  const ProcessGroup& world_;  // its counter includes every group split from it
  int64_t sent_before_ = 0;    // world_.cross_host_bytes() when the step began
  profile::ReportContext ctx_;
  std::unique_ptr<profile::Profiler> profiler_;
  std::unique_ptr<profile::Profiler::Scope> scope_;
};

// What one optimizer step measured; the same on every rank.
struct StepStats {
  double loss = 0;       // mean over the global batch
  double grad_norm = 0;  // global norm before clipping
  double lr = 0;         // learning rate the optimizer used
};

// This rank's time and allocator peak of one step, taken when its optimizer
// step is done: an evaluation after it is not part of either.
struct StepTime {
  double seconds = 0;
  int64_t peak_bytes = 0;
};

// One train() call: run() sets up, then per step runs step(), report() and
// save(). Every rank calls each member function at the same point of the
// run; most are collective. Members are declared in the order setup() fills
// them, so they are destroyed in reverse: the checkpointer, which may wait
// for a save in flight, before the model and optimizer it reads.
class Trainer {
 public:
  Trainer(const Config& config, ProcessGroup& world, Logger& log, int local_size, const TrainOptions& options)
      : config_(config), tc_(config.train), world_(world), log_(log), local_size_(local_size), options_(options) {}
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Sets up, then runs from the resumed step to --stop-after, train.steps or a stop signal.
  TrainResult run();

 private:
  // Devices, model, sharding, optimizer, data, metrics, checkpoints/resume, in this order.
  void setup();
  void setup_devices();
  void setup_model();
  void setup_data();
  void log_model();  // also computes the model FLOPs and the device peak
  // Collective on the CPU: device_peak_ and peak_note_ from a GEMM
  // measurement; returns the seconds it took.
  double measure_cpu_peak();
  // Collective on the CPU: the GEMM peak (FLOP/s), every rank at once.
  double cpu_gemm_peak(int64_t n, double seconds);
  void log_run() const;
  void setup_batches();
  void setup_memory();
  void phase(const char* name) { phase_ = name; }
  /// Runs `f` (in `name`'s phase unless null); an out-of-memory error from it
  /// comes back naming the step, the phase and what to lower.
  template <class F>
  auto guard_memory(int64_t done, const char* name, F&& f) -> decltype(f()) {
    if (name) phase_ = name;
    try {
      return f();
    } catch (const OutOfMemory& e) {
      throw out_of_memory(e.message(), done);
    } catch (const std::bad_alloc&) {
      // A library's own buffer (oneDNN's, a std::vector inside an op).
      throw out_of_memory("out of host memory allocating a buffer inside an op", done);
    }
  }
  Error out_of_memory(const std::string& what, int64_t done) const {
    std::string where = phase_;
    if (where == std::string_view("forward and backward")) where += format(" of micro-batch {}", micro_batch_);
    return Error(format("{} {}", what, out_of_memory_advice(config_, *memory_plan_, where, done + 1)), __FILE__,
                 __LINE__);
  }
  void setup_checkpoints();
  // Rank 0: the metrics file's start or resume line, and what the step lines mean.
  void mark_run_start();
  // Warns once that the metrics file stopped taking lines at `step`.
  void warn_metrics_failed(int64_t step);
  // Fills the rate fields of `m` (throughput, ms/step, MFU) for `seconds` per step.
  void set_rates(metrics::StepMetrics& m, double seconds) const;
  // `mfu` at most 1, with a warning the first time it was above.
  double capped_mfu(double mfu) const;

  // Optimizer step `done` + 1; nullopt when a stop request ended it between
  // micro-batches (then nothing changed: no update, no samples consumed).
  std::optional<StepStats> step(int64_t done);
  int64_t load_batches();
  // Forward and backward of step `done` + 1's micro-batches; nullopt when a
  // stop signal ended the step between two of them.
  std::optional<double> forward_backward(int64_t done, float grad_scale);
  StepStats sync_gradients(int64_t done, int64_t count, double local_loss_sum);

  // Not collective: the time and peak of the step begun at `step_start`.
  StepTime stop_clock(Clock::time_point step_start) const;
  // Collective, after step `step` when evaluation_due(): the validation loss
  // (launch/eval.h), logged with its time. The one place for what every
  // evaluation does; later per-evaluation actions (a generated sample, a
  // refreshed plot) belong here.
  ValidationLoss evaluate(int64_t step);
  // eval.sample_tokens: every rank runs the same forwards (the sharded
  // forward gathers as in training), rank 0 prints the text.
  void print_sample(int64_t step);
  // Not collective: appends step `done` + 1's metrics and prints the step
  // line, with the means since the line before, when it is logged (every
  // logging.interval steps, the last step, and a step that evaluated);
  // returns whether it was.
  bool report(int64_t done, const StepStats& stats, const StepTime& time, const std::optional<ValidationLoss>& val);
  // After the loop: waits for the last save, prints the profile table and the summary.
  TrainResult finish();
  // ", val_loss L (best B at step S)" for the summary; "" when nothing was evaluated.
  std::string eval_summary() const;
  // What the "stopped after step N" line adds: what was saved, when that is not the step itself.
  std::string stop_note() const;

  // After step `done` + 1: agrees on a stop, commits a finished background
  // save and saves when due.
  void save(int64_t done);
  // After a stop ended step `done` + 1 between micro-batches.
  void save_after_stop(int64_t done);
  void hold_stop_save_for_test(int64_t step) const;
  void hold_micro_batch_for_test(int64_t step) const;

  // logging.plot's cadence after step `done` + 1: every checkpoint.interval
  // steps, or every 100 logged steps when that is 0 (finish() draws the last).
  bool plot_due(int64_t done) const;
  // Rank 0, with logging.plot: redraws logging.metrics_file + ".svg" from the
  // whole metrics file (earlier runs' lines too), replaced atomically; returns
  // whether it did. Not collective, so a plot that cannot be drawn is a
  // warning, never the end of the run.
  bool refresh_plot();

  const Config& config_;
  const TrainConfig& tc_;
  ProcessGroup& world_;
  Logger& log_;
  const int local_size_;
  const TrainOptions& options_;

  int64_t accum_ = 0;  // micro-batches per rank per step
  std::string resume_;
  checkpoint::RunRoot run_root_;  // checkpoint.dir's lock, held for the whole run, and whether ranks share it
  Device device_ = Device::cpu();
  int threads_ = 0;
  std::unique_ptr<ProcessGroup> gpu_group_;
  ProcessGroup* fsdp_group_ = nullptr;  // *gpu_group_ or world_
  Allocator* allocator_ = nullptr;

  std::unique_ptr<models::Model> model_;
  int64_t n_params_ = 0;
  int recomputed_ = 0;
  std::optional<fsdp::ShardedModel> sharded_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<dataset::Dataset> dataset_;
  std::unique_ptr<dataset::Dataset> val_dataset_;       // with eval.interval > 0
  std::optional<dataset::Tokenizer> sample_tokenizer_;  // data.tokenizer, loaded once when eval.sample_tokens is set
  std::optional<Evaluator> evaluator_;                  // with eval.interval > 0
  std::optional<metrics::MetricsFile> metrics_;
  models::ModelFlops flops_;
  DType compute_dtype_ = DType::F32;
  double device_peak_ = 0;               // FLOP/s of one device (a rank's threads on the CPU); 0 when unknown
  mutable bool mfu_cap_warned_ = false;  // capped_mfu() has said that MFU came out above 100%
  std::string peak_note_;                // how the CPU's peak was measured
  metrics::IntervalMeans interval_;      // the steps since the last step line
  bool metrics_warned_ = false;
  std::optional<RunProfile> run_profile_;
  std::optional<MemoryPlan> memory_plan_;
  const char* phase_ = "start-up";  // what the step is doing, for an out-of-memory error
  int64_t micro_batch_ = 0;         // during "forward and backward"

  models::LossKind loss_kind_ = models::LossKind::CrossEntropy;
  // The toy model has samples, not tokens: its throughput is reported in samples/s.
  bool has_tokens_ = true;
  double tokens_per_sample_ = 1.0;
  // Batch buffers are sized once; the step fills them in place.
  // On a GPU the host buffers are copied into device twins before each step.
  std::vector<Tensor> inputs_, targets_, device_inputs_, device_targets_;

  TrainResult result_;
  int64_t consumed_ = 0;  // samples consumed (the sampler's position)
  int64_t first_step_ = 0;
  int64_t resumed_from_ = 0;  // the checkpoint's step when this run resumed; 0 when it started
  std::optional<Checkpointer> checkpointer_;
  int64_t last_step_ = 0;
  bool terminated_ = false;            // a stop signal ended the run before last_step_ was reached
  bool stopped_in_start_up_ = false;   // ... before step first_step_ + 1 began
  bool stop_kept_async_save_ = false;  // the stop's checkpoint is the async save of step last_step_ - 1
  int stop_signal_ = 0;                // agreed over the ranks
  int64_t last_saved_ = 0;             // the step of the newest checkpoint this run wrote or resumed from
  Clock::time_point run_start_;
  double timed_seconds_ = 0;  // summed over the steps after this process's first (which includes warm-up)
};

TrainResult Trainer::run() {
  setup();
  // A stop that came during start-up (the handlers are in place before MPI
  // starts) ends the run here: no step has changed anything, nothing to save.
  if ((stop_signal_ = stop_agreed(world_)) != 0) {
    terminated_ = true;
    stopped_in_start_up_ = true;
    last_step_ = first_step_;
    return finish();
  }
  run_start_ = Clock::now();
  for (int64_t done = first_step_; done < last_step_; ++done) {
    const auto step_start = Clock::now();
    allocator_->reset_peak();
    run_profile_->begin(done + 1);
    const std::optional<StepStats> stats = guard_memory(done, nullptr, [&] { return step(done); });
    if (!stats) {
      save_after_stop(done);
      break;
    }
    const StepTime time = stop_clock(step_start);
    std::optional<ValidationLoss> val;
    if (evaluation_due(config_.eval, done + 1, tc_.steps))
      val = guard_memory(done, "evaluation", [&] { return evaluate(done + 1); });
    const bool logged = report(done, *stats, time, val);
    guard_memory(done, "checkpoint save", [&] { save(done); });
    run_profile_->end(logged);
    // The plot follows each evaluation (and, without evaluations, plot_due's cadence); finish() draws the last.
    if ((val || plot_due(done)) && done + 1 < last_step_) refresh_plot();
  }
  return finish();
}

void Trainer::setup() {
  setup_devices();
  // Before any of the model's state is allocated: a run that cannot fit is refused now (launch/memory_plan.h).
  check_startup_memory(config_, device_, world_, local_size_);
  setup_model();
  setup_data();
  log_model();
  log_run();
  run_profile_.emplace(config_, world_, *fsdp_group_, device_.is_cpu() ? device_peak_ : 0.0, peak_note_,
                       flops_.flops_per_token * static_cast<double>(tc_.seq_len) *
                           static_cast<double>(tc_.global_batch_size) / world_.size(),
                       log_);
  setup_batches();
  setup_memory();
  setup_checkpoints();
  mark_run_start();
}

// The start-up memory line, and the refusal of a micro-batch that cannot fit (before step 1).
void Trainer::setup_memory() {
  fsdp::MemoryReport report = sharded_->memory_report();
  memory_plan_ = plan_memory(config_, report, recomputed_);
  const int64_t available = available_bytes(local_size_);
  log_.info0("memory: {}", memory_line(config_, *memory_plan_, available));
  check_memory_fits(config_, *memory_plan_, world_, available);
}

// Checks the batch and checkpoint settings, takes checkpoint.dir, then picks
// this rank's device, its CPU threads and the group the model talks over.
void Trainer::setup_devices() {
  accum_ = accumulation_steps(tc_, world_.size());
  check_checkpoint_config(config_, options_.resume, options_.overwrite, log_);
  resume_ = effective_resume(config_, options_.resume, options_.overwrite);
  // Held for the whole run: a second job on the same checkpoint.dir fails here.
  run_root_ = prepare_checkpoint_dir(config_, world_, resume_, options_.overwrite, log_);
  // A missing GPU is usually missing on every rank: printed once when all agree.
  run_on_every_rank(world_, [&] { device_ = resolve_device(tc_.device, options_.local_rank); });
  if (device_.is_cuda()) cuda::set_device(device_.index);
  threads_ = tc_.threads > 0 ? static_cast<int>(tc_.threads) : cpu::auto_cpu_threads(local_size_);
  cpu::set_cpu_threads(threads_);
  gpu_group_ = device_group(world_, tc_.device, device_, local_size_);
  fsdp_group_ = gpu_group_ ? gpu_group_.get() : &world_;
  allocator_ = &allocator_for(device_);
}

void Trainer::setup_model() {
  model_ = models::build_model(config_.model);
  n_params_ = model_->num_parameters();
  // Recomputation first, then sharding: the order PyTorch applies them in.
  recomputed_ = fsdp::apply_activation_checkpointing(*model_, config_.fsdp.activation_checkpointing);
  sharded_.emplace(*model_, config_.fsdp, *fsdp_group_, local_size_, tc_.seed, log_, device_);

  optimizer_ = optim::make_optimizer(config_.optim);
  for (const optim::Segment& segment : sharded_->segments()) optimizer_->add_segment(segment);
}

void Trainer::setup_data() {
  // Every rank opens the data and checks its share of the tokens before step 1;
  // a bad file stops every rank with one message.
  double scan_seconds = 0;
  run_on_every_rank(world_, [&] {
    dataset_ = dataset::make_dataset(dataset_spec(config_));
    if (config_.eval.interval > 0) {
      val_dataset_ = dataset::make_validation_dataset(dataset_spec(config_));
      // Config::validate() refuses eval.interval without validation data.
      ST_CHECK(val_dataset_ != nullptr, "eval.interval is {} but there is no validation data", config_.eval.interval);
      evaluator_.emplace(config_, *val_dataset_, *model_, *sharded_, world_, device_);
      if (config_.eval.sample_tokens > 0) sample_tokenizer_ = dataset::load_data_tokenizer(dataset_spec(config_));
    }
    const auto t0 = Clock::now();
    std::string bad = dataset_->find_bad_token(world_.rank(), world_.size());
    if (bad.empty() && val_dataset_) bad = val_dataset_->find_bad_token(world_.rank(), world_.size());
    scan_seconds = seconds_since(t0);
    ST_CHECK(bad.empty(), "{}", bad);
  });
  log_.debug("data: this rank's share of the tokens checked against model.vocab_size in {:.3f} s", scan_seconds);
  metrics_.emplace(world_.rank() == 0 ? config_.logging.metrics_file : std::string());
  if (metrics_->cut_bytes() > 0) {
    log_.warn0(
        "logging.metrics_file '{}' ended in a half-written line (an earlier run stopped mid-write): cut the "
        "last {} byte(s), so that the lines this run appends stay readable",
        std::filesystem::absolute(config_.logging.metrics_file).string(), metrics_->cut_bytes());
  }
}

void Trainer::log_model() {
  const double n = static_cast<double>(n_params_);
  log_.info0("model {}: {} parameters{}", config_.model.name, n_params_,
             n >= 1e6 ? format(" ({:.2f} M)", n / 1e6) : (n >= 1e3 ? format(" ({:.1f} k)", n / 1e3) : std::string()));
  const bool counts_tokens = model_->loss_kind() == models::LossKind::CrossEntropy;
  flops_ = models::model_flops(config_.model, tc_.seq_len);
  compute_dtype_ = config_.fsdp.mixed_precision.param_dtype;
  std::string peak;
  if (device_.is_cuda()) {
    device_peak_ = metrics::peak_flops(cuda::device_name(device_.index), compute_dtype_);
    peak = device_peak_ > 0 ? format("{:.0f} TFLOP/s {}", device_peak_ / 1e12, dtype_name(compute_dtype_))
                            : std::string("unknown for this GPU, so MFU n/a");
  } else {
    const double seconds = measure_cpu_peak();
    peak = format("{:.1f} GFLOP/s per rank ({}, measured in {:.2f} s)", device_peak_ / 1e9, peak_note_, seconds);
  }
  log_.info0("model FLOPs: {:.4g} per {} for training{} ({} matmul parameters); device peak {}", flops_.flops_per_token,
             counts_tokens ? "token" : "sample", counts_tokens ? format(" at seq_len {}", tc_.seq_len) : std::string(),
             flops_.matmul_params, peak);
}

double Trainer::measure_cpu_peak() {
  // GEMMs of the size --profile uses (1024^3: 512^3 came out a third below
  // the rate a training step's GEMMs reach on AVX2, so MFU read high) for a
  // short time (about 0.15 s with the warm-up) keeps start-up quick;
  // --profile, whose table compares GEMM time against this peak, measures
  // longer (and again at the end).
  const bool thorough = config_.logging.profile;
  const int64_t n = kProfilePeakN;
  const auto t0 = Clock::now();
  device_peak_ = cpu_gemm_peak(n, thorough ? kProfilePeakSeconds : 0.1);
  // Test hook: tests/e2e/check_isa.py's mfu-cap check scales the peak down
  // to see a step line above 100%. Runs never set it.
  if (const char* scale = std::getenv("ST_TEST_CPU_PEAK_SCALE")) device_peak_ *= std::atof(scale);
  peak_note_ = format("{}^3 {} through ops::gemm, best of {}", n, dtype_name(compute_dtype_), kPeakSamples);
  return seconds_since(t0);
}

double Trainer::cpu_gemm_peak(int64_t n, double seconds) {
  // Every rank measures at once, as they compute at once, so the peak is
  // taken with all ranks of the host busy; the best of several short runs,
  // so that a moment of another process's work cannot lower it much.
  world_.barrier().wait();
  return profile::measure_gemm_peak(compute_dtype_, device_, n, seconds, kPeakSamples);
}

void Trainer::mark_run_start() {
  const bool resumed = resumed_from_ > 0;
  if (!metrics_->append_event(resumed ? metrics::RunEvent::Resume : metrics::RunEvent::Start, first_step_,
                              run_name(config_)))
    warn_metrics_failed(first_step_ + 1);
  log_.info0(
      "step lines: loss, throughput and ms/step are means over the steps since the line before (every {} "
      "step(s)); lr and grad_norm are the step's own{}",
      config_.logging.interval,
      config_.logging.metrics_file.empty() ? std::string()
                                           : format("; {} gets every step", config_.logging.metrics_file));
}

void Trainer::warn_metrics_failed(int64_t step) {
  if (metrics_warned_) return;
  metrics_warned_ = true;
  log_.warn0(
      "{}; training goes on without writing metrics (checkpoints are not affected); the file keeps its "
      "complete lines up to the step before {}",
      metrics_->error(), step);
}

void Trainer::log_run() const {
  log_.info0("data: {}", dataset_->describe());
  if (evaluator_) {
    log_.info0("validation: {}; every {} steps and after step {}: the first {} global batch(es), {} samples",
               val_dataset_->describe(), config_.eval.interval, tc_.steps, config_.eval.batches,
               config_.eval.batches * tc_.global_batch_size);
  } else if (!config_.data.val_path.empty() || config_.data.val_fraction > 0) {
    log_.warn0("{} is set but eval.interval is 0, so nothing is evaluated on it",
               config_.data.val_path.empty() ? "data.val_fraction" : "data.val_path");
  }
  log_.info0("device: {}{}, collectives over {}", device_.str(),
             device_.is_cuda() ? " (" + cuda::device_name(device_.index) + ")" : std::string(),
             fsdp_group_->backend_name());
  log_.info0("CPU: {} thread(s) per rank ({}; {} of {} cores in this rank's affinity mask), GEMMs by {}", threads_,
             tc_.threads > 0 ? "train.threads" : "train.threads: 0, automatic", cpu::affinity_cores(),
             cpu::host_cores(), cpu::gemm_backend());
  log_.info0("{} rank(s), {} (shard groups of {}), param_dtype {}, reduce_dtype {}, recomputed layers {}",
             world_.size(), to_string(config_.fsdp.sharding_strategy), sharded_->shard_group_size(),
             precision_name(config_.fsdp.mixed_precision.param_dtype),
             precision_name(config_.fsdp.mixed_precision.reduce_dtype), recomputed_);
  log_.info0("global batch {} = {} rank(s) x {} micro-batch(es) x {} sample(s)", tc_.global_batch_size, world_.size(),
             accum_, tc_.micro_batch_size);
  log_config(config_, log_);
  sharded_->log_memory_table(optimizer_->state_bytes());
}

// Not collective: sizes the micro-batch buffers once.
void Trainer::setup_batches() {
  loss_kind_ = model_->loss_kind();
  const Shape in_shape = batch_shape(tc_.micro_batch_size, model_->sample_input_shape(tc_.seq_len));
  const Shape tgt_shape = batch_shape(tc_.micro_batch_size, model_->sample_target_shape(tc_.seq_len));
  const DType in_dtype = loss_kind_ == models::LossKind::CrossEntropy ? DType::I32 : DType::F32;
  has_tokens_ = loss_kind_ == models::LossKind::CrossEntropy;
  tokens_per_sample_ = has_tokens_ ? static_cast<double>(tc_.seq_len) : 1.0;
  for (int64_t m = 0; m < accum_; ++m) {
    inputs_.push_back(Tensor::empty(in_shape, in_dtype));
    targets_.push_back(Tensor::empty(tgt_shape, in_dtype));
    device_inputs_.push_back(device_.is_cpu() ? inputs_.back() : Tensor::empty(in_shape, in_dtype, device_));
    device_targets_.push_back(device_.is_cpu() ? targets_.back() : Tensor::empty(tgt_shape, in_dtype, device_));
  }
}

// Installs the stop handlers, resumes (or starts from init_from / step 0) and
// fixes the last step of this run.
void Trainer::setup_checkpoints() {
  result_.num_parameters = n_params_;
  checkpointer_.emplace(config_, *sharded_, *optimizer_, world_, log_, n_params_, run_root_.topology);
  if (std::optional<ResumePoint> point = checkpointer_->load(resume_)) {
    first_step_ = point->step;
    consumed_ = point->consumed;
    resumed_from_ = point->step;  // 0 for checkpoint.init_from, which starts a run
  }
  if (options_.stop_after > 0 && options_.stop_after <= first_step_) {
    throw AgreedError(
        format("--stop-after {} is not after step {}, where this run resumes", options_.stop_after, first_step_),
        __FILE__, __LINE__);
  }
  last_step_ = options_.stop_after > 0 ? std::min(options_.stop_after, tc_.steps) : tc_.steps;
  last_saved_ = first_step_;
}

std::optional<StepStats> Trainer::step(int64_t done) {
  phase("loading the batch");
  const int64_t count = load_batches();
  sharded_->zero_grad();
  const std::optional<double> local_loss_sum = forward_backward(done, 1.0f / static_cast<float>(count));
  if (!local_loss_sum) {
    // Every rank issued the same reduce-scatters before the boundary: drain
    // them. Nothing else changed (no optimizer step, no samples consumed), so
    // the state is exactly that after `done` steps and a resumed run redoes
    // this one in full.
    sharded_->finish_grad_sync();
    log_.info0("stopping in step {} at a micro-batch boundary; its partial work is dropped", done + 1);
    return std::nullopt;
  }
  phase("gradient reduction");
  StepStats stats = sync_gradients(done, count, *local_loss_sum);
  phase("optimizer step");
  const double clip = optim::clip_coefficient(stats.grad_norm, config_.optim.grad_clip);
  stats.lr = optim::learning_rate(config_.optim, done, tc_.steps);
  {
    const profile::PhaseScope optimizer_phase(profile::Phase::Optimizer);
    auto update = [&] {
      if (clip < 1.0) {
        for (const optim::Segment& segment : sharded_->segments()) optim::scale_grad(segment, clip);
      }
      optimizer_->step(stats.lr);
    };
    // On the CPU the update is one named op of the profile (its kernels are
    // not ops::); on a GPU it only queues kernels, so it is not timed.
    if (device_.is_cpu()) {
      profile::op(profile::Activity::Ops, "optimizer update", 0, update);
    } else {
      update();
    }
  }
  consumed_ += tc_.global_batch_size;
  return stats;
}

// Fills the micro-batch buffers with this rank's share of the next global
// batch; returns the global batch's loss element count.
int64_t Trainer::load_batches() {
  const profile::PhaseScope data_phase(profile::Phase::Data);
  std::vector<int64_t> mine = dataset::rank_batch_indices(tc_.seed, dataset_->size(), consumed_, tc_.global_batch_size,
                                                          world_.rank(), world_.size());
  for (int64_t m = 0; m < accum_; ++m) {
    const auto i = static_cast<size_t>(m);
    std::span<const int64_t> idx(mine.data() + m * tc_.micro_batch_size, static_cast<size_t>(tc_.micro_batch_size));
    dataset::load_batch(*dataset_, idx, inputs_[i], targets_[i]);
    if (device_.is_cuda()) {
      device_inputs_[i].copy_from(inputs_[i]);
      device_targets_[i].copy_from(targets_[i]);
    }
  }
  return global_loss_count(loss_kind_, targets_, world_);
}

// Forward and backward of each micro-batch, gradients scaled by
// `grad_scale`; returns the sum of this rank's losses, or nullopt when the
// ranks agreed to stop between micro-batches.
std::optional<double> Trainer::forward_backward(int64_t done, float grad_scale) {
  double local_loss_sum = 0;
  for (int64_t m = 0; m < accum_; ++m) {
    if (m == 1) hold_micro_batch_for_test(done + 1);
    // A stop request is honoured between micro-batches, not only at the
    // step's end, so a long step cannot outlast the launcher's grace period.
    if (m > 0 && (stop_signal_ = stop_agreed(world_)) != 0) return std::nullopt;
    phase("forward and backward");
    micro_batch_ = m + 1;
    const Tensor& x = device_inputs_[static_cast<size_t>(m)];
    const Tensor& y = device_targets_[static_cast<size_t>(m)];
    Tensor out = sharded_->forward(x);
    std::optional<profile::PhaseScope> loss_phase(std::in_place, profile::Phase::Forward);
    // Both losses write their gradient over the output, which backward no
    // longer needs (layers keep their inputs), so nothing is allocated here.
    const ops::LossSum loss = loss_kind_ == models::LossKind::CrossEntropy
                                  ? ops::cross_entropy(out.view({-1, out.size(-1)}), y.view({-1}),
                                                       dataset::kIgnoreIndex, grad_scale, out.view({-1, out.size(-1)}))
                                  : ops::mse(out, y, grad_scale, out);
    loss_phase.reset();
    sharded_->backward(out);
    local_loss_sum += loss.sum;
    if (Watchdog* w = world_.watchdog()) w->progress();
  }
  return local_loss_sum;
}

// Finishes the gradient reductions and reduces the loss; the mean loss and
// the gradient norm, both finite (else every rank throws the same error).
StepStats Trainer::sync_gradients(int64_t done, int64_t count, double local_loss_sum) {
  // Each rank's gradient is already scaled by 1/count, so the SUM
  // reductions inside the sharded model give the global-batch mean.
  StepStats stats;
  {
    const profile::PhaseScope sync_phase(profile::Phase::GradSync);
    Tensor loss_sum = Tensor::full({1}, local_loss_sum, DType::F32);
    Work loss_work = world_.all_reduce(loss_sum);
    sharded_->finish_grad_sync();
    loss_work.wait();
    stats.loss = loss_sum.data<float>()[0] / static_cast<double>(count);
    stats.grad_norm = std::sqrt(sharded_->grad_norm_squared());
  }
  // Every rank sees the same loss and norm (both reduced over the world), so all stop together.
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
    throw AgreedError(
        format(
            "step {}: the loss is {} and the gradient norm {}; stopped before the optimizer step, so no "
            "non-finite state is saved{}; lower optim.lr or check the data",
            done + 1, stats.loss, stats.grad_norm,
            config_.checkpoint.dir.empty() ? std::string() : " (the last checkpoint in checkpoint.dir stays latest)"),
        __FILE__, __LINE__);
  }
  return stats;
}

StepTime Trainer::stop_clock(Clock::time_point step_start) const {
  // The step's GPU work (the optimizer's last kernels) is done before it is timed.
  if (device_.is_cuda()) cuda::synchronize(device_.index);
  return {seconds_since(step_start), allocator_->stats().peak_bytes};
}

ValidationLoss Trainer::evaluate(int64_t step) {
  const auto t0 = Clock::now();
  const ValidationLoss val = evaluator_->run();
  if (device_.is_cuda()) cuda::synchronize(device_.index);
  const double seconds = seconds_since(t0);
  result_.evals.push_back({step, val.loss});
  log_.info0("eval step {}: val_loss {:.4f}{} over {} in {:.3f} s", step, val.loss,
             has_tokens_ ? format(" (ppl {:.1f})", std::exp(val.loss)) : std::string(),
             has_tokens_ ? format("{} sequences ({} tokens)", with_commas(val.samples), with_commas(val.count))
                         : format("{} samples", with_commas(val.samples)),
             seconds);
  if (config_.eval.sample_tokens > 0 && has_tokens_) print_sample(step);
  return val;
}

void Trainer::print_sample(int64_t step) {
  const EvalConfig& e = config_.eval;
  const std::optional<dataset::Tokenizer>& data_tokenizer = sample_tokenizer_;
  const bool as_bytes = !data_tokenizer && config_.model.vocab_size == 256;
  const dataset::Tokenizer tokenizer = data_tokenizer ? *data_tokenizer : dataset::Tokenizer::bytes();
  std::vector<int32_t> prompt = tokenizer.encode(e.sample_prompt);
  models::SampleOptions options;
  options.max_new_tokens = e.sample_tokens;
  options.temperature = e.sample_temperature;
  options.seed = tc_.seed + static_cast<uint64_t>(step);
  // No stop token: every rank runs exactly the same number of forwards (each
  // gathers units collectively), even if a rank's sampled tokens differed.
  options.stop_token = -1;
  const auto t0 = Clock::now();
  const models::Generation g =
      models::generate(*model_, prompt, config_.model.max_position_embeddings, options, {}, device_);
  sharded_->release();  // nothing gathered or saved for a backward is left behind
  std::string text;
  if (data_tokenizer || as_bytes) {
    for (int32_t id : g.tokens) text += tokenizer.decode_piece(id);
  } else {
    for (int32_t id : g.tokens) text += format("{} ", id);  // no tokenizer for these ids: print them
  }
  std::string shown = e.sample_prompt + text;
  for (size_t at = shown.find('\n'); at != std::string::npos; at = shown.find('\n', at + 5))
    shown.replace(at, 1, "\n  | ");
  log_.info0("sample step {} ({} tokens, temperature {}, {:.2f} s):\n  | {}", step, g.tokens.size(),
             e.sample_temperature, seconds_since(t0), shown);
}

bool Trainer::report(int64_t done, const StepStats& stats, const StepTime& time,
                     const std::optional<ValidationLoss>& val) {
  const double step_seconds = time.seconds;
  const bool warm_up = done == first_step_;  // the first step of this process includes warm-up
  if (!warm_up) timed_seconds_ += step_seconds;
  interval_.add(stats.loss, step_seconds, warm_up);
  result_.losses.push_back(stats.loss);
  const double elapsed = seconds_since(run_start_);
  metrics::StepMetrics sm;
  sm.step = done + 1;
  sm.total_steps = tc_.steps;
  sm.loss = stats.loss;
  sm.lr = stats.lr;
  sm.grad_norm = stats.grad_norm;
  set_rates(sm, step_seconds);
  sm.elapsed_s = elapsed;
  sm.eta_s = elapsed / static_cast<double>(done + 1 - first_step_) * static_cast<double>(tc_.steps - done - 1);
  sm.peak_bytes = time.peak_bytes;
  if (val) {
    sm.val_loss = val->loss;
    if (has_tokens_) sm.val_ppl = std::exp(val->loss);
  }
  result_.peak_bytes = std::max(result_.peak_bytes, sm.peak_bytes);
  // Every step goes to the file, so plots are not sampled; the console gets the interval's means.
  if (!metrics_->append(sm)) warn_metrics_failed(sm.step);
  const bool log_step = (done + 1) % config_.logging.interval == 0 || done + 1 == last_step_ || val.has_value();
  if (log_step) {
    metrics::StepMetrics line = sm;
    line.loss = interval_.loss();
    set_rates(line, interval_.seconds_per_step());
    log_.info0("{}", metrics::format_step_line(line));
    interval_.reset();
  }
  return log_step;
}

void Trainer::set_rates(metrics::StepMetrics& m, double seconds) const {
  m.step_ms = 1e3 * seconds;
  m.samples_per_s = static_cast<double>(tc_.global_batch_size) / seconds;
  m.tokens_per_s = has_tokens_ ? static_cast<double>(tc_.seq_len) * m.samples_per_s : -1.0;
  // MFU per device: this rank's share of the work against one device's peak.
  if (device_peak_ > 0)
    m.mfu = capped_mfu(
        metrics::mfu(tokens_per_sample_ * m.samples_per_s / world_.size(), flops_.flops_per_token, device_peak_));
}

double Trainer::capped_mfu(double mfu) const {
  // Above 100% the peak was measured low (a busy machine at start-up), not
  // the step fast: say so once and report the measured peak as reached.
  if (mfu > 1.0 && !mfu_cap_warned_) {
    mfu_cap_warned_ = true;
    log_.warn0(
        "MFU {:.1f}% is above 100%: the start-up GEMM peak ({:.1f} GFLOP/s per rank) was measured low, "
        "probably on a busy machine; MFU is reported as at most 100% (--profile measures the peak again)",
        100.0 * mfu, device_peak_ / 1e9);
  }
  return std::min(mfu, 1.0);
}

TrainResult Trainer::finish() {
  checkpointer_->wait();
  if (config_.logging.profile && device_.is_cpu()) {
    // Again at the end, so that a start-up measurement slowed by a busy
    // moment cannot leave the report above 100%. Every rank takes this
    // branch (it depends on the config only), and no step is running.
    const double end_peak = cpu_gemm_peak(kProfilePeakN, kProfilePeakSeconds);
    run_profile_->set_end_peak(end_peak);
    device_peak_ = std::max(device_peak_, end_peak);
  }
  run_profile_->summary();
  if (refresh_plot()) log_.info0("plot: {}.svg (build/plot draws several runs together)", config_.logging.metrics_file);
  if (last_step_ < tc_.steps) {
    const std::string stopped =
        format("stopped after step {} of {} ({}){}", last_step_, tc_.steps,
               terminated_ ? signal_name(stop_signal_) : std::string_view("--stop-after"), stop_note());
    log_.info0("{}", stopped);
    // scripts/launch repeats it when mpirun, signalled itself, holds the ranks' output back.
    if (terminated_ && world_.rank() == 0) tell_launcher(stopped);
  }
  // The first step of this process includes warm-up, so it is not timed.
  const int64_t timed_steps = last_step_ - first_step_ - 1;
  if (timed_steps > 0) {
    result_.tokens_per_s = tokens_per_sample_ * static_cast<double>(tc_.global_batch_size) *
                           static_cast<double>(timed_steps) / timed_seconds_;
    if (device_peak_ > 0)
      result_.mfu =
          capped_mfu(metrics::mfu(result_.tokens_per_s / world_.size(), flops_.flops_per_token, device_peak_));
  }
  // The first step is not timed, so a one-step run has no throughput to report.
  // The step lines' definition: the global batch over the mean time of the timed steps.
  std::string rate = "throughput n/a (one step, which includes warm-up)";
  if (timed_steps > 0) {
    rate = format("{} {}/s (all ranks, steps {}..{}{})", with_commas(std::llround(result_.tokens_per_s)),
                  has_tokens_ ? "tok" : "samples", first_step_ + 2, last_step_,
                  result_.mfu >= 0 ? format(", MFU {:.1f}%", 100.0 * result_.mfu) : std::string());
  }
  if (result_.losses.empty()) {
    // Stopped before this process completed a step: no loss, no rate.
    log_.summary0("done: no step completed (stopped by {} {}), on {}", signal_name(stop_signal_),
                  stopped_in_start_up_ ? std::string("during start-up") : format("in step {}", first_step_ + 1),
                  device_.str());
    return result_;
  }
  log_.summary0("done: steps {}..{}, final loss {:.4f}{}, {}, peak {} on {}", first_step_ + 1, last_step_,
                result_.losses.back(), eval_summary(), rate, human_bytes(result_.peak_bytes), device_.str());
  return result_;
}

std::string Trainer::stop_note() const {
  const std::string resumed =
      resumed_from_ > 0 ? format(" (step {}, where it resumed, stays the latest checkpoint)", resumed_from_) : "";
  if (stopped_in_start_up_) return "; the stop came during start-up, so no step ran and nothing was saved" + resumed;
  if (last_step_ == first_step_) return "; no step completed in this run, so nothing was saved" + resumed;
  if (config_.checkpoint.dir.empty()) return "; no checkpoint.dir, so nothing was saved";
  if (stop_kept_async_save_) {
    return format(
        "; the checkpoint of step {}, written in the background when the stop came, is the last: step {} was not "
        "saved (a resumed run redoes it)",
        last_step_ - 1, last_step_);
  }
  return {};
}

std::string Trainer::eval_summary() const {
  if (result_.evals.empty()) return {};
  const auto best = std::min_element(result_.evals.begin(), result_.evals.end(),
                                     [](const EvalPoint& a, const EvalPoint& b) { return a.loss < b.loss; });
  return format(", val_loss {:.4f} (best {:.4f} at step {})", result_.evals.back().loss, best->loss, best->step);
}

void Trainer::save(int64_t done) {
  hold_for_stop_for_test("step-end", done + 1);
  // Every rank agrees whether any was sent SIGTERM; a stop saves like the end of the run.
  if ((stop_signal_ = checkpointer_->end_of_step(stop_request())) != 0 && done + 1 < last_step_) {
    terminated_ = true;
    last_step_ = done + 1;
    // The async save of the step before was being written while this step
    // ran (or has just been): it is the stop's checkpoint, finished by
    // finish(), rather than a second save after it (the step is redone on resume).
    if (config_.checkpoint.async && last_saved_ == done && done > first_step_) {
      stop_kept_async_save_ = true;
      return;
    }
  }
  const int64_t interval = config_.checkpoint.interval;
  const bool save_now = (interval > 0 && (done + 1) % interval == 0) || done + 1 == last_step_;
  if (!config_.checkpoint.dir.empty() && save_now) {
    const profile::PhaseScope checkpoint_phase(profile::Phase::Checkpoint);
    if (stop_signal_ != 0) hold_stop_save_for_test(done + 1);
    if (stop_signal_ == 0) hold_for_stop_for_test("save", done + 1);
    checkpointer_->save(done + 1, consumed_);
    last_saved_ = done + 1;
    // A stop that came while this save was written makes it the stop's
    // checkpoint: the run ends here, not one step and a second save later.
    if (done + 1 < last_step_ && (stop_signal_ = stop_agreed(world_)) != 0) {
      terminated_ = true;
      last_step_ = done + 1;
    }
  }
}

// Test hook: with ST_TEST_HOLD_STOP_SAVE=FILE in the environment, the save
// that follows a stop signal says so (rank 0: "test hook: holding the stop's
// save of step N until FILE exists") and waits, on every rank, until FILE
// exists. tests/e2e/check_launch.py signals the launcher again there, so that the
// second signal is known to land during the save, whatever the machine's load.
void Trainer::hold_stop_save_for_test(int64_t step) const {
  const char* file = std::getenv("ST_TEST_HOLD_STOP_SAVE");
  if (file == nullptr || *file == '\0') return;
  log_.info0("test hook: holding the stop's save of step {} until {} exists", step, file);
  while (!std::filesystem::exists(file)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Test hook: with ST_TEST_HOLD_MICRO_BATCH=S in the environment, step S
// stops after its first micro-batch (rank 0: "test hook: holding step S after
// micro-batch 1 until a stop signal arrives") and every rank waits there until
// it has received a stop signal. tests/e2e/check_preempt.py signals the launcher
// on that line, so that the stop is known to land inside a step, between its
// micro-batches, whatever the machine's load.
void Trainer::hold_micro_batch_for_test(int64_t step) const {
  const char* want = std::getenv("ST_TEST_HOLD_MICRO_BATCH");
  if (want == nullptr || std::to_string(step) != want) return;
  log_.info0("test hook: holding step {} after micro-batch 1 until a stop signal arrives", step);
  while (g_stop_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Saves the state after `done` steps unless it is already saved or is
// where this run began.
void Trainer::save_after_stop(int64_t done) {
  terminated_ = true;
  last_step_ = done;
  if (!config_.checkpoint.dir.empty() && last_saved_ < done && done > first_step_) {
    hold_stop_save_for_test(done);
    checkpointer_->save(done, consumed_);
  }
}

bool Trainer::plot_due(int64_t done) const {
  if (!config_.logging.plot) return false;
  const int64_t interval = config_.checkpoint.interval;
  return (done + 1) % (interval > 0 ? interval : 100 * config_.logging.interval) == 0;
}

bool Trainer::refresh_plot() {
  if (!config_.logging.plot || world_.rank() != 0) return false;
  const std::string& metrics = config_.logging.metrics_file;
  try {
    const metrics::PlotRun run{run_name(config_), metrics::read_metrics_file(metrics)};
    write_file_atomic(metrics + ".svg", metrics::render_svg(std::span(&run, 1)));
    return true;
  } catch (const Error& e) {
    // Only rank 0 draws: throwing would leave the other ranks waiting in a collective.
    log_.warn0("logging.plot: {}.svg not redrawn: {}", metrics, e.message());
    return false;
  }
}

// "1, 2 or 4" (empty for none).
std::string or_list(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::to_string(values[i]);
  }
  return out;
}

// The divisors of n, at most `most` of them: those nearest `near`, ascending.
std::vector<int64_t> divisors_near(int64_t n, int64_t near, size_t most) {
  std::vector<int64_t> all;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    all.push_back(d);
    if (d != n / d) all.push_back(n / d);
  }
  std::sort(all.begin(), all.end());
  std::stable_sort(all.begin(), all.end(),
                   [near](int64_t a, int64_t b) { return std::abs(a - near) < std::abs(b - near); });
  if (all.size() > most) all.resize(most);
  std::sort(all.begin(), all.end());
  return all;
}

// What would divide, for the error of accumulation_steps: the global batch
// sizes nearest the configured one at this world size, the micro-batch sizes
// that fit it, and the world sizes that fit the batch settings as they are.
std::string batch_fixes(const TrainConfig& train, int world_size) {
  constexpr size_t kMost = 6;  // enough choice without a wall of numbers
  const int64_t per_step = static_cast<int64_t>(world_size) * train.micro_batch_size;
  const int64_t global = train.global_batch_size;
  std::vector<int64_t> globals;
  if (global / per_step > 0) globals.push_back(global / per_step * per_step);
  globals.push_back((global / per_step + 1) * per_step);
  std::string fixes = format("; at {} rank(s) set train.global_batch_size to {}", world_size, or_list(globals));
  if (global % world_size == 0)
    fixes += format(", or train.micro_batch_size to {}",
                    or_list(divisors_near(global / world_size, train.micro_batch_size, kMost)));
  if (global % train.micro_batch_size == 0) {
    fixes += format("; or run {} rank(s) (-np) with these batch sizes",
                    or_list(divisors_near(global / train.micro_batch_size, world_size, kMost)));
  }
  return fixes;
}

}  // namespace

StopSignals::StopSignals() {
  static_assert(std::size(kStopSignals) == std::size(decltype(old_){}));
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  // Blocked here, so in every thread started from now on too (MPI's,
  // OpenMP's, oneDNN's); the handler serves a thread that unblocks them.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
  waiter_ = std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (g_stop_waiter_quit.load()) return;
      on_stop_signal(sig);
    }
  });
  // A stop scripts/launch relayed while SIGUSR1 was still ignored (the
  // moments before these handlers): its file is written before the signal
  // is sent, so it is here by now.
  if (g_stop_signal.load() == 0 && relayed_signal() != 0) g_stop_signal.store(SIGUSR1);
}

// SIGUSR1, left at its default or ignored on entry, is ignored from here on.
// A stop reaches the ranks more than once and not at the same moment (mpirun
// signals each rank's process group and scripts/launch-rank passes the signal
// on too; each rank's launch-rank sees its launcher die on its own 0.2 s
// poll), and the ranks stop as soon as one of them has it: a late copy must
// not kill a rank that has stopped, saved and is exiting 0.
StopSignals::~StopSignals() {
  g_stop_waiter_quit.store(true);
  pthread_kill(waiter_.native_handle(), SIGUSR1);
  waiter_.join();
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    if (kStopSignals[i] == SIGUSR1 && old_[i].sa_handler == SIG_DFL) old_[i].sa_handler = SIG_IGN;
    ::sigaction(kStopSignals[i], &old_[i], nullptr);
  }
}

void hold_for_stop_for_test(std::string_view point, int64_t step) {
  const char* raw = std::getenv("ST_TEST_HOLD_FOR_STOP");
  if (raw == nullptr) return;
  const std::string_view want(raw);
  const size_t at = want.find('@');
  if (want.substr(0, at) != point) return;
  if (at != std::string_view::npos && want.substr(at + 1) != std::to_string(step)) return;
  if (detect_world().rank == 0) {
    std::fprintf(stderr, "test hook: holding at %s until a stop signal arrives\n", raw);
    std::fflush(stderr);
  }
  while (g_stop_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

Device resolve_device(DeviceKind kind, int local_rank) {
  if (kind == DeviceKind::Cpu) return Device::cpu();
  const int gpus = cuda::device_count();
  if (kind == DeviceKind::Auto && gpus == 0) return Device::cpu();
  ST_CHECK(gpus > 0, "train.device: cuda, but {}; set train.device: cpu (or auto)",
           cuda::compiled_with_cuda() ? "no CUDA GPU is visible (no device or no driver)"
                                      : "shardtrain was built without CUDA");
  return Device::cuda(local_rank % gpus);
}

int64_t accumulation_steps(const TrainConfig& train, int world_size) {
  const int64_t per_step = static_cast<int64_t>(world_size) * train.micro_batch_size;
  // Every rank computes this from the same config and world: rank 0 alone reports it.
  if (train.global_batch_size % per_step != 0) {
    throw AgreedError(
        format("train.global_batch_size ({}) must be divisible by world size ({}) x "
               "train.micro_batch_size ({}) = {}{}",
               train.global_batch_size, world_size, train.micro_batch_size, per_step, batch_fixes(train, world_size)),
        __FILE__, __LINE__);
  }
  return train.global_batch_size / per_step;
}

TrainResult train(const Config& config, ProcessGroup& world, Logger& log, int local_size, const TrainOptions& options) {
  Trainer trainer(config, world, log, local_size, options);
  return trainer.run();
}

}  // namespace st::launch
