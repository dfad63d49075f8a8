#include "launch/train.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/cuda/cuda_runtime.h"
#include "core/ops.h"
#include "core/profile.h"
#include "core/watchdog.h"
#include "fsdp/fsdp.h"
#include "launch/checkpointing.h"
#include "launch/data.h"
#include "launch/flops.h"
#include "launch/metrics.h"
#include "models/model.h"
#include "optim/optimizer.h"

namespace st::launch {

namespace {

// PyTorch's default ignore_index; our datasets never produce it, but a
// tokens file may use it for padding.
constexpr int64_t kIgnoreIndex = -100;

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
extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_stop_signal.load() == SIGINT) ::_exit(130);
  g_stop_signal.store(sig);
}

std::string_view signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
  }
  return "a signal";
}

// Installs the stop handlers for the life of a train() call.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_[std::size(kStopSignals)]{};
};

// The largest stop signal any rank got, 0 for none (collective: every rank
// calls it at the same boundary, so all stop together).
int stop_agreed(ProcessGroup& world) {
  Tensor flag = Tensor::from_vector(std::vector<int32_t>{g_stop_signal.load()}, {1});
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
      for (int32_t v : t.span<int32_t>()) local += v != kIgnoreIndex;
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

// --profile (logging.profile): the GEMM peak measured once, a profiler on
// this thread (the one that runs the model), a line per logged step and the
// table at the end. Rank 0 prints; every rank measures, so the peak is taken
// with all ranks of the host busy, as they are in training.
class RunProfile {
 public:
  RunProfile(const Config& config, ProcessGroup& world, Device device, DType compute_dtype, double model_flops_per_step,
             Logger& log)
      : log_(log) {
    if (!config.logging.profile) return;
    ctx_.rank = world.rank();
    ctx_.model_flops_step = model_flops_per_step;
    if (device.is_cpu()) {
      world.barrier().wait();  // every rank measures at once, as they compute at once
      constexpr int64_t n = 1024;
      ctx_.gemm_peak = profile::measure_gemm_peak(compute_dtype, device, n);
      ctx_.peak_note = format("{}^3 {} through ops::gemm", n, dtype_name(compute_dtype));
      log.info0("profile: GEMM peak {:.1f} GFLOP/s per rank ({}, {}); model {:.4e} FLOP per step per rank",
                ctx_.gemm_peak / 1e9, ctx_.peak_note, cpu::gemm_backend(), model_flops_per_step);
    }
    profiler_ = std::make_unique<profile::Profiler>();
    scope_ = std::make_unique<profile::Profiler::Scope>(profiler_.get());
  }

  void begin(int64_t step) {
    if (profiler_) profiler_->step_begin(step);
  }
  void end(bool print) {
    if (!profiler_) return;
    const profile::StepProfile& s = profiler_->step_end();
    if (print) log_.info0("{}", profile::format_step(s, ctx_));
  }
  void summary() const {
    if (!profiler_ || profiler_->steps().empty()) return;
    std::istringstream table(profile::format_summary(profiler_->steps(), ctx_));
    for (std::string line; std::getline(table, line);) log_.info0("{}", line);
  }

 private:
  Logger& log_;
  profile::ReportContext ctx_;
  std::unique_ptr<profile::Profiler> profiler_;
  std::unique_ptr<profile::Profiler::Scope> scope_;
};

}  // namespace

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
  ST_CHECK(train.global_batch_size % per_step == 0,
           "train.global_batch_size ({}) must be divisible by world size ({}) x train.micro_batch_size ({}) = {}",
           train.global_batch_size, world_size, train.micro_batch_size, per_step);
  return train.global_batch_size / per_step;
}

TrainResult train(const Config& config, ProcessGroup& world, Logger& log, int local_size, const TrainOptions& options) {
  const TrainConfig& tc = config.train;
  const int64_t accum = accumulation_steps(tc, world.size());
  check_checkpoint_config(config, options.resume, options.overwrite, log);
  const std::string resume = effective_resume(config, options.resume, options.overwrite);
  // Held for the whole run: a second job on the same checkpoint.dir fails here.
  const std::optional<checkpoint::DirectoryLock> dir_lock =
      prepare_checkpoint_dir(config, world, resume, options.overwrite, log);
  const Device device = resolve_device(tc.device, options.local_rank);
  if (device.is_cuda()) cuda::set_device(device.index);
  const int threads = tc.threads > 0 ? static_cast<int>(tc.threads) : cpu::auto_cpu_threads(local_size);
  cpu::set_cpu_threads(threads);
  std::unique_ptr<ProcessGroup> gpu_group = device_group(world, tc.device, device, local_size);
  ProcessGroup& fsdp_group = gpu_group ? *gpu_group : world;
  Allocator& allocator = allocator_for(device);

  std::unique_ptr<models::Model> model = models::build_model(config.model);
  const int64_t n_params = model->num_parameters();
  // Recomputation first, then sharding: the order PyTorch applies them in.
  const int recomputed = fsdp::apply_activation_checkpointing(*model, config.fsdp.activation_checkpointing);
  fsdp::ShardedModel sharded(*model, config.fsdp, fsdp_group, local_size, tc.seed, log, device);

  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(config.optim);
  for (const optim::Segment& segment : sharded.segments()) optimizer->add_segment(segment);

  // Every rank opens the data and checks its share of the tokens before step 1;
  // a bad file stops every rank with one message.
  std::unique_ptr<Dataset> dataset;
  double scan_seconds = 0;
  run_on_every_rank(world, [&] {
    dataset = make_dataset(config);
    const auto t0 = Clock::now();
    const std::string bad = dataset->find_bad_token(world.rank(), world.size());
    scan_seconds = seconds_since(t0);
    ST_CHECK(bad.empty(), "{}", bad);
  });
  log.debug("data: this rank's share of the tokens checked against model.vocab_size in {:.3f} s", scan_seconds);
  MetricsFile metrics(world.rank() == 0 ? config.logging.metrics_file : std::string());

  const double n = static_cast<double>(n_params);
  log.info0("model {}: {} parameters{}", config.model.name, n_params,
            n >= 1e6 ? format(" ({:.2f} M)", n / 1e6) : (n >= 1e3 ? format(" ({:.1f} k)", n / 1e3) : std::string()));
  const bool counts_tokens = model->loss_kind() == models::LossKind::CrossEntropy;
  const models::ModelFlops flops = models::model_flops(config.model, tc.seq_len);
  const DType compute_dtype = config.fsdp.mixed_precision.param_dtype;
  const double device_peak = device.is_cuda() ? peak_flops(cuda::device_name(device.index), compute_dtype) : 0.0;
  log.info0("model FLOPs: {:.4g} per {} for training{} ({} matmul parameters); device peak {}", flops.flops_per_token,
            counts_tokens ? "token" : "sample", counts_tokens ? format(" at seq_len {}", tc.seq_len) : std::string(),
            flops.matmul_params,
            device_peak > 0 ? format("{:.0f} TFLOP/s {}", device_peak / 1e12, dtype_name(compute_dtype))
                            : std::string(device.is_cuda() ? "unknown for this GPU, so MFU n/a" : "n/a on the CPU"));
  log.info0("data: {}", dataset->describe());
  log.info0("device: {}{}, collectives over {}", device.str(),
            device.is_cuda() ? " (" + cuda::device_name(device.index) + ")" : std::string(), fsdp_group.backend_name());
  log.info0("CPU: {} thread(s) per rank ({}; {} of {} cores in this rank's affinity mask), GEMMs by {}", threads,
            tc.threads > 0 ? "train.threads" : "train.threads: 0, automatic", cpu::affinity_cores(), cpu::host_cores(),
            cpu::gemm_backend());
  log.info0("{} rank(s), {} (shard groups of {}), param_dtype {}, reduce_dtype {}, recomputed layers {}", world.size(),
            to_string(config.fsdp.sharding_strategy), sharded.shard_group_size(),
            precision_name(config.fsdp.mixed_precision.param_dtype),
            precision_name(config.fsdp.mixed_precision.reduce_dtype), recomputed);
  log.info0("global batch {} = {} rank(s) x {} micro-batch(es) x {} sample(s)", tc.global_batch_size, world.size(),
            accum, tc.micro_batch_size);
  log_config(config, log);
  sharded.log_memory_table(optimizer->state_bytes());
  RunProfile run_profile(config, world, device, compute_dtype,
                         flops.flops_per_token * static_cast<double>(tc.seq_len) *
                             static_cast<double>(tc.global_batch_size) / world.size(),
                         log);

  const models::LossKind loss_kind = model->loss_kind();
  const Shape in_shape = batch_shape(tc.micro_batch_size, model->sample_input_shape(tc.seq_len));
  const Shape tgt_shape = batch_shape(tc.micro_batch_size, model->sample_target_shape(tc.seq_len));
  const DType in_dtype = loss_kind == models::LossKind::CrossEntropy ? DType::I32 : DType::F32;
  // The toy model has samples, not tokens: its throughput is reported in samples/s.
  const bool has_tokens = loss_kind == models::LossKind::CrossEntropy;
  const double tokens_per_sample = has_tokens ? static_cast<double>(tc.seq_len) : 1.0;

  // Batch buffers are sized once; the step fills them in place.
  // On a GPU the host buffers are copied into device twins before each step.
  std::vector<Tensor> inputs, targets, device_inputs, device_targets;
  for (int64_t m = 0; m < accum; ++m) {
    inputs.push_back(Tensor::empty(in_shape, in_dtype));
    targets.push_back(Tensor::empty(tgt_shape, in_dtype));
    device_inputs.push_back(device.is_cpu() ? inputs.back() : Tensor::empty(in_shape, in_dtype, device));
    device_targets.push_back(device.is_cpu() ? targets.back() : Tensor::empty(tgt_shape, in_dtype, device));
  }

  TrainResult result;
  result.num_parameters = n_params;
  int64_t consumed = 0;
  int64_t first_step = 0;
  StopSignals stop_signals;
  Checkpointer checkpointer(config, sharded, *optimizer, world, log, n_params);
  if (std::optional<ResumePoint> point = checkpointer.load(resume)) {
    first_step = point->step;
    consumed = point->consumed;
  }
  if (options.stop_after > 0 && options.stop_after <= first_step) {
    throw AgreedError(
        format("--stop-after {} is not after step {}, where this run resumes", options.stop_after, first_step),
        __FILE__, __LINE__);
  }
  int64_t last_step = options.stop_after > 0 ? std::min(options.stop_after, tc.steps) : tc.steps;
  bool terminated = false;
  int stop_signal = 0;              // agreed over the ranks
  int64_t last_saved = first_step;  // the step of the newest checkpoint this run wrote or resumed from
  const auto run_start = Clock::now();
  double timed_seconds = 0;
  for (int64_t step = first_step; step < last_step; ++step) {
    const auto step_start = Clock::now();
    allocator.reset_peak();
    run_profile.begin(step + 1);

    std::optional<profile::PhaseScope> data_phase(std::in_place, profile::Phase::Data);
    std::vector<int64_t> mine =
        rank_batch_indices(tc.seed, dataset->size(), consumed, tc.global_batch_size, world.rank(), world.size());
    for (int64_t m = 0; m < accum; ++m) {
      std::span<const int64_t> idx(mine.data() + m * tc.micro_batch_size, static_cast<size_t>(tc.micro_batch_size));
      load_batch(*dataset, idx, inputs[static_cast<size_t>(m)], targets[static_cast<size_t>(m)]);
      if (device.is_cuda()) {
        device_inputs[static_cast<size_t>(m)].copy_from(inputs[static_cast<size_t>(m)]);
        device_targets[static_cast<size_t>(m)].copy_from(targets[static_cast<size_t>(m)]);
      }
    }
    const int64_t count = global_loss_count(loss_kind, targets, world);
    const float grad_scale = 1.0f / static_cast<float>(count);
    data_phase.reset();

    sharded.zero_grad();
    double local_loss_sum = 0;
    bool abandoned = false;
    for (int64_t m = 0; m < accum; ++m) {
      // A stop request is honoured between micro-batches, not only at the
      // step's end, so a long step cannot outlast the launcher's grace period.
      if (m > 0) {
        if ((stop_signal = stop_agreed(world)) != 0) {
          abandoned = true;
          break;
        }
      }
      const Tensor& x = device_inputs[static_cast<size_t>(m)];
      const Tensor& y = device_targets[static_cast<size_t>(m)];
      Tensor out = sharded.forward(x);
      std::optional<profile::PhaseScope> loss_phase(std::in_place, profile::Phase::Forward);
      // Both losses write their gradient over the output, which backward no
      // longer needs (layers keep their inputs), so nothing is allocated here.
      const ops::LossSum loss = loss_kind == models::LossKind::CrossEntropy
                                    ? ops::cross_entropy(out.view({-1, out.size(-1)}), y.view({-1}), kIgnoreIndex,
                                                         grad_scale, out.view({-1, out.size(-1)}))
                                    : ops::mse(out, y, grad_scale, out);
      loss_phase.reset();
      sharded.backward(out);
      local_loss_sum += loss.sum;
      if (Watchdog* w = world.watchdog()) w->progress();
    }
    if (abandoned) {
      // Every rank issued the same reduce-scatters before the boundary: drain
      // them. Nothing else changed (no optimizer step, no samples consumed), so
      // the state is exactly that after `step` steps and a resumed run redoes
      // this one in full.
      sharded.finish_grad_sync();
      log.info0("stopping in step {} at a micro-batch boundary; its partial work is dropped", step + 1);
      terminated = true;
      last_step = step;
      if (!config.checkpoint.dir.empty() && last_saved < step && step > first_step) checkpointer.save(step, consumed);
      break;
    }

    // Each rank's gradient is already scaled by 1/count, so the SUM
    // reductions inside the sharded model give the global-batch mean.
    std::optional<profile::PhaseScope> sync_phase(std::in_place, profile::Phase::GradSync);
    Tensor loss_sum = Tensor::full({1}, local_loss_sum, DType::F32);
    Work loss_work = world.all_reduce(loss_sum);
    sharded.finish_grad_sync();
    loss_work.wait();
    const double loss = loss_sum.data<float>()[0] / static_cast<double>(count);
    const double grad_norm = std::sqrt(sharded.grad_norm_squared());
    sync_phase.reset();
    // Every rank sees the same loss and norm (both reduced over the world), so all stop together.
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      throw AgreedError(
          format(
              "step {}: the loss is {} and the gradient norm {}; stopped before the optimizer step, so no "
              "non-finite state is saved{}; lower optim.lr or check the data",
              step + 1, loss, grad_norm,
              config.checkpoint.dir.empty() ? std::string() : " (the last checkpoint in checkpoint.dir stays latest)"),
          __FILE__, __LINE__);
    }
    const double clip = optim::clip_coefficient(grad_norm, config.optim.grad_clip);
    const double lr = optim::learning_rate(config.optim, step, tc.steps);
    {
      const profile::PhaseScope optimizer_phase(profile::Phase::Optimizer);
      if (clip < 1.0) {
        for (const optim::Segment& segment : sharded.segments()) optim::scale_grad(segment, clip);
      }
      optimizer->step(lr);
    }
    consumed += tc.global_batch_size;

    // The step's GPU work (the optimizer's last kernels) is done before it is timed.
    if (device.is_cuda()) cuda::synchronize(device.index);
    const double step_seconds = seconds_since(step_start);
    if (step > first_step) timed_seconds += step_seconds;  // the first step includes warm-up
    result.losses.push_back(loss);
    const double elapsed = seconds_since(run_start);
    StepMetrics sm;
    sm.step = step + 1;
    sm.total_steps = tc.steps;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = grad_norm;
    sm.samples_per_s = static_cast<double>(tc.global_batch_size) / step_seconds;
    sm.tokens_per_s = has_tokens ? static_cast<double>(tc.seq_len) * sm.samples_per_s : -1.0;
    sm.elapsed_s = elapsed;
    sm.eta_s = elapsed / static_cast<double>(step + 1 - first_step) * static_cast<double>(tc.steps - step - 1);
    sm.peak_bytes = allocator.stats().peak_bytes;
    // MFU per device: this rank's share of the tokens against one device's peak.
    if (device_peak > 0) sm.mfu = mfu(sm.tokens_per_s / world.size(), flops.flops_per_token, device_peak);
    result.peak_bytes = std::max(result.peak_bytes, sm.peak_bytes);
    const bool log_step = (step + 1) % config.logging.interval == 0 || step + 1 == last_step;
    if (log_step) {
      log.info0("{}", format_step_line(sm));
      metrics.append(sm);
    }
    // Every rank agrees whether any was sent SIGTERM; a stop saves like the end of the run.
    if ((stop_signal = checkpointer.end_of_step(g_stop_signal.load())) != 0 && step + 1 < last_step) {
      terminated = true;
      last_step = step + 1;
    }
    const int64_t interval = config.checkpoint.interval;
    const bool save_now = (interval > 0 && (step + 1) % interval == 0) || step + 1 == last_step;
    if (!config.checkpoint.dir.empty() && save_now) {
      const profile::PhaseScope checkpoint_phase(profile::Phase::Checkpoint);
      checkpointer.save(step + 1, consumed);
      last_saved = step + 1;
    }
    run_profile.end(log_step);
  }
  checkpointer.wait();
  run_profile.summary();
  if (last_step < tc.steps) {
    log.info0("stopped after step {} of {} ({}){}", last_step, tc.steps,
              terminated ? signal_name(stop_signal) : std::string_view("--stop-after"),
              config.checkpoint.dir.empty() ? "; no checkpoint.dir, so nothing was saved" : "");
  }
  // The first step of this process includes warm-up, so it is not timed.
  const int64_t timed_steps = last_step - first_step - 1;
  if (timed_steps > 0) {
    result.tokens_per_s = tokens_per_sample * static_cast<double>(tc.global_batch_size) *
                          static_cast<double>(timed_steps) / timed_seconds;
    if (device_peak > 0) result.mfu = mfu(result.tokens_per_s / world.size(), flops.flops_per_token, device_peak);
  }
  // The first step is not timed, so a one-step run has no throughput to report.
  const std::string rate = timed_steps <= 0 ? std::string("throughput n/a (one step, which includes warm-up)")
                           : has_tokens     ? format("{:.0f} tokens/s", result.tokens_per_s)
                                            : format("{:.0f} samples/s", result.tokens_per_s);
  log.summary0("done: steps {}..{}, final loss {:.4f}, {}{}, peak {} on {}", first_step + 1, last_step,
               result.losses.back(), rate,
               result.mfu >= 0 ? format(" (MFU {:.1f}%)", 100.0 * result.mfu) : std::string(),
               human_bytes(result.peak_bytes), device.str());
  return result;
}

}  // namespace st::launch
